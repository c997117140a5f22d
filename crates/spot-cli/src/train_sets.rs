//! `spot train-sets`: the learned set drafter of SPOT-Sets on threshold-decoding trajectories
//! that carry the target's hidden states.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use spot_dlm::sets::net::SetsNetConfig;
use spot_train::Trajectory;
use spot_train::TrajectoryDir;
use spot_train::sets_train::read_output_embeddings;
use spot_train::sets_train::{SetsTrainConfig, TauGroup, train_sets};

use crate::backend::Backend;

/// Arguments of `spot train-sets`.
#[derive(clap::Args)]
pub struct TrainSetsArgs {
    /// Trajectory directories written by `spot collect --threshold TAU --hidden-states`
    /// (training prompts only); each directory's `τ` comes from its manifest.
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// File to write (a model folder's default is its `spot-sets-net.json`).
    #[arg(long)]
    out: PathBuf,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Examples per optimiser step.
    #[arg(long, default_value_t = 512)]
    batch_size: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Threshold steps below the root that give examples.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Share of prompts held out.
    #[arg(long, default_value_t = 0.1)]
    holdout: f64,
    /// Use at most this many training examples per epoch (a seeded sample).
    #[arg(long)]
    max_examples: Option<usize>,
    /// Width the hidden states are projected to.
    #[arg(long, default_value_t = 32)]
    proj: usize,
    /// Width of the two hidden layers.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Seed of initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Candidates of the token head (the stale top-k it re-ranks; 0: no token head).
    #[arg(long, default_value_t = 8)]
    token_candidates: usize,
    /// Embedding width of the token head.
    #[arg(long, default_value_t = 16)]
    token_dim: usize,
    /// Model folder whose output embeddings initialise the token head's (default: the
    /// shipped `models/sdar-tiny-code`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Initialise the token head's embeddings at random instead of from the model.
    #[arg(long)]
    random_token_embeddings: bool,
}

/// Runs `spot train-sets`.
pub fn run(a: &TrainSetsArgs) -> Result<()> {
    let mut groups = Vec::new();
    for d in &a.trajectories {
        let dir = TrajectoryDir::open(d)?;
        let m = dir.manifest();
        let Some(tau) = m.threshold else {
            bail!(
                "{}: decoded with one commit per forward; collect with --threshold TAU --hidden-states",
                d.display()
            );
        };
        if !m.hidden_states {
            bail!(
                "{}: collected without hidden states; collect with --hidden-states",
                d.display()
            );
        }
        let trajs: Vec<Trajectory> = dir.read_all()?.into_iter().map(|(_, t)| t).collect();
        if trajs.is_empty() {
            bail!("{}: no trajectories (run spot collect first)", d.display());
        }
        eprintln!(
            "{}: {} trajectories, T = {}, tau = {tau}",
            d.display(),
            trajs.len(),
            m.temperature
        );
        groups.push(TauGroup { tau, trajs });
    }
    let hidden_dim = groups
        .iter()
        .flat_map(|g| &g.trajs)
        .map(|t| t.hidden_dim)
        .next()
        .unwrap_or(0);
    let net_cfg = SetsNetConfig {
        proj: a.proj,
        width: a.width,
        ..SetsNetConfig::new(hidden_dim)
    };
    eprintln!(
        "network: hidden {} -> {}, two layers of {}: {} parameters",
        net_cfg.hidden_dim,
        net_cfg.proj,
        net_cfg.width,
        net_cfg.parameter_count()
    );
    let cfg = SetsTrainConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        steps: a.steps,
        holdout: a.holdout,
        seed: a.seed,
        max_examples: a.max_examples,
        token_candidates: a.token_candidates,
        token_dim: a.token_dim,
    };
    let device = crate::backend::device()?;
    let out_emb = if a.token_candidates == 0 || a.random_token_embeddings {
        None
    } else {
        let dir = crate::model_dir::resolve(a.model.as_deref())?;
        let (w, cols) = read_output_embeddings(&dir)?;
        if cols != hidden_dim {
            bail!(
                "{}: output embeddings of width {cols}, the trajectories' hidden states {hidden_dim}",
                dir.display()
            );
        }
        Some(w)
    };
    let mut show = |line: &str| eprintln!("{line}");
    let (net, report) = train_sets::<burn_autodiff::Autodiff<Backend>>(
        &groups,
        net_cfg,
        &cfg,
        (&device, out_emb.as_deref()),
        &mut show,
    )
    .context("training the set drafter")?;
    if report.written > 0 {
        eprintln!(
            "written tokens outside the stale top-{}: {} of {} ({:.1}%)",
            a.token_candidates,
            report.outside_candidates,
            report.written,
            100.0 * report.outside_candidates as f64 / report.written as f64
        );
    }
    if let Some(best) = report
        .epochs
        .iter()
        .min_by(|x, y| x.heldout.total().total_cmp(&y.heldout.total()))
    {
        eprintln!(
            "kept epoch {}: held-out {:.4} vs tables {:.4} ({} / {} / {} / {} examples)",
            best.epoch,
            best.heldout.total(),
            best.table.total(),
            best.heldout.counts[0],
            best.heldout.counts[1],
            best.heldout.counts[2],
            best.heldout.counts[3]
        );
    }
    net.save(&a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
