//! `spot train-drafter`: Algorithm 1 on a trajectory directory, writing a checkpoint.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use spot_drafter::{OrderModelConfig, checkpoint};
use spot_train::{EpochReport, TrainConfig, TrainObserver, TrajectoryDir, train_from};

use crate::Backend;

/// Arguments of `spot train-drafter`.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Trajectory directories written by `spot collect` (e.g. one at T = 0 and one at T = 1);
    /// their samples are interleaved before the held-out split, so every directory is held
    /// out in proportion.
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// Checkpoint to write (`.safetensors`; the config goes next to it as `.json`).
    #[arg(long)]
    out: PathBuf,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Examples per Adam step.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Peak Adam learning rate (linear warm-up over 2% of the steps, then cosine decay to a
    /// tenth of it).
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// Deepest replay depth of Algorithm 1.
    #[arg(long, default_value_t = 7)]
    max_depth: usize,
    /// Share of prompts held out, with every trajectory decoded from them (spread evenly over
    /// the interleaved list).
    #[arg(long, default_value_t = 0.1)]
    holdout: f64,
    /// Training examples per epoch (a seeded sample; default: all).
    #[arg(long)]
    max_examples: Option<usize>,
    /// Held-out examples evaluated after each epoch (a fixed seeded sample; default: all).
    #[arg(long)]
    max_heldout: Option<usize>,
    /// Continue from this checkpoint's weights (same shape) instead of a fresh network.
    #[arg(long)]
    init: Option<PathBuf>,
    /// Seed of initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

struct Bars {
    bar: ProgressBar,
    epochs: usize,
}

impl TrainObserver for Bars {
    fn start(&mut self, train: usize, held: usize, steps: usize) {
        eprintln!(
            "{train} training examples per epoch, {held} held-out examples, {steps} steps per epoch"
        );
        self.bar.set_length((steps * self.epochs) as u64);
    }

    fn step(&mut self, epoch: usize, _step: usize, loss: f64) {
        self.bar.inc(1);
        self.bar
            .set_message(format!("epoch {epoch} loss {loss:.3}"));
    }

    fn epoch(&mut self, r: &EpochReport) {
        let h = &r.heldout;
        let by_depth: Vec<String> = (0..h.count.len())
            .map(|d| {
                format!(
                    "{:.2}/{:.2}",
                    h.drafter_hits[d] as f64 / h.count[d].max(1) as f64,
                    h.confidence_hits[d] as f64 / h.count[d].max(1) as f64
                )
            })
            .collect();
        self.bar.suspend(|| {
            eprintln!(
                "epoch {:>2}: train loss {:.4}, held-out loss {:.4}, next-commit accuracy {:.3} (stale confidence {:.3}); by depth drafter/confidence {} [{:.0} s]",
                r.epoch,
                r.train_loss,
                h.loss,
                h.drafter(),
                h.confidence(),
                by_depth.join(" "),
                r.seconds
            )
        });
    }
}

/// Runs `spot train-drafter`.
pub fn run(a: &TrainArgs) -> Result<()> {
    let mut dirs = Vec::new();
    for d in &a.trajectories {
        let dir = TrajectoryDir::open(d)?;
        let trajs: Vec<_> = dir.read_all()?.into_iter().map(|(_, t)| t).collect();
        dirs.push((dir.manifest().block_size, trajs));
    }
    let block_size = dirs.first().map_or(32, |d| d.0);
    if let Some((i, _)) = dirs.iter().enumerate().find(|(_, d)| d.0 != block_size) {
        bail!(
            "{} has block size {}, {} has {block_size}",
            a.trajectories[i].display(),
            dirs[i].0,
            a.trajectories[0].display()
        );
    }
    let trajs = interleave(dirs.into_iter().map(|d| d.1).collect());
    if trajs.is_empty() {
        bail!(
            "{:?}: no trajectories (run spot collect first)",
            a.trajectories
        );
    }
    let model_cfg = OrderModelConfig {
        block_size,
        ..OrderModelConfig::default()
    };
    let cfg = TrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        max_depth: a.max_depth,
        holdout: a.holdout,
        seed: a.seed,
        max_examples: a.max_examples,
        max_heldout: a.max_heldout,
    };
    eprintln!(
        "{} trajectories from {:?}; network {} parameters",
        trajs.len(),
        a.trajectories,
        model_cfg.parameter_count()
    );
    let device = crate::backend::device()?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut obs = Bars {
        bar,
        epochs: a.epochs,
    };
    let init = match &a.init {
        Some(p) => Some(
            checkpoint::load::<Backend>(p, &device)
                .with_context(|| format!("loading --init {}", p.display()))?,
        ),
        None => None,
    };
    let (model, reports) = train_from::<burn_autodiff::Autodiff<Backend>>(
        &trajs,
        init.as_ref(),
        model_cfg,
        &cfg,
        &device,
        &mut obs,
    )
    .context("training the drafter")?;
    obs.bar.finish_and_clear();
    if let Some(best) = reports
        .iter()
        .filter(|r| !r.heldout.loss.is_nan())
        .min_by(|x, y| x.heldout.loss.total_cmp(&y.heldout.loss))
    {
        eprintln!(
            "keeping epoch {} (lowest held-out loss {:.4})",
            best.epoch, best.heldout.loss
        );
    }
    checkpoint::save(&model, &a.out)?;
    eprintln!(
        "wrote {} and {}",
        a.out.display(),
        checkpoint::config_path(&a.out).display()
    );
    Ok(())
}

/// Round-robin over the directories: `a0 b0 a1 b1 …`, then what is left of the longer ones.
fn interleave<T>(lists: Vec<Vec<T>>) -> Vec<T> {
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for it in &mut iters {
            out.extend(it.next());
        }
        if out.len() == before {
            return out;
        }
    }
}
