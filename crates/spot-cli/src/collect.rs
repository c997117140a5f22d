//! `spot collect`: draft-free trajectories of a prompt set, for training the drafter.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use spot_dlm::{BlockDiffusionModel, DecodeConfig, Transition};
use spot_train::examples;
use spot_train::trajectory::{Recorder, record_with};
use spot_train::{Manifest, TrajectoryDir};

use crate::{load, model_dir, prompts};

/// Arguments of `spot collect`.
#[derive(clap::Args)]
pub struct CollectArgs {
    /// Hugging Face model folder (default: the shipped `models/sdar-tiny-code`).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dtype: crate::DtypeArg,
    /// JSONL file of prompts.
    #[arg(long)]
    prompts: PathBuf,
    /// Field of each record holding the prompt (default: the first of prompt, question, text,
    /// input, problem).
    #[arg(long)]
    field: Option<String>,
    /// Use only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    /// Output directory (created; an existing one with the same settings is resumed).
    #[arg(long)]
    out: PathBuf,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature (0 = argmax).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Seed of the coupled noise table.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decode all blocks even after a stop id.
    #[arg(long)]
    no_early_stop: bool,
    /// Decode with threshold decoding at this `τ` (the trajectories `spot calibrate-sets`
    /// fits the SPOT-Sets drafter on) instead of one commit per forward.
    #[arg(long)]
    threshold: Option<f32>,
    /// Also store the target's final hidden state at every masked position of every step
    /// (what `spot train-sets` trains the learned set drafter on; about 2 bytes per hidden
    /// value).
    #[arg(long)]
    hidden_states: bool,
}

/// Runs `spot collect`.
pub fn run(a: &CollectArgs) -> Result<()> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    let mut model = load(&dir, a.dtype)?;
    let set = prompts::load_prompts(&a.prompts, a.field.as_deref(), a.limit)?;
    let field = a.field.clone().unwrap_or_else(|| "(auto)".into());
    let cfg = DecodeConfig {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        seed: a.seed,
        early_stop: !a.no_early_stop,
        transition: a
            .threshold
            .map_or(Transition::Exact, |tau| Transition::Threshold { tau }),
        ..DecodeConfig::for_model(model.info())
    };
    cfg.validate()?;
    let canon = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    };
    let manifest = Manifest {
        hidden_states: a.hidden_states,
        ..Manifest::for_decode(&canon(&dir), &canon(&a.prompts), &field, &cfg)
    };
    let out = TrajectoryDir::create_or_resume(&a.out, manifest)?;
    let tokenizer = model
        .tokenizer()
        .context("collect needs tokenizer.json in the model folder")?
        .clone();
    let bar = ProgressBar::new(set.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} prompts {msg} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let (mut resumed, mut steps, mut n_examples) = (0usize, 0usize, 0usize);
    let start = Instant::now();
    for (i, p) in set.iter().enumerate() {
        if out.has(i)? {
            resumed += 1;
            bar.inc(1);
            continue;
        }
        let ids = tokenizer
            .encode(&p.text)
            .with_context(|| format!("prompt {}", p.id))?;
        let rec = if a.hidden_states {
            Recorder::with_hidden_states()
        } else {
            Recorder::default()
        };
        let (_, traj) = record_with(&mut model, &ids, &cfg, &p.id, rec)
            .with_context(|| format!("prompt {}", p.id))?;
        steps += traj.blocks.iter().map(|b| b.steps.len()).sum::<usize>();
        n_examples += examples(&traj, 7, |_| {});
        out.write(i, &traj)?;
        bar.inc(1);
        bar.set_message(format!("{steps} steps"));
    }
    bar.finish_and_clear();
    eprintln!(
        "[{} prompts -> {} ({} already there): {} new steps, {} new depth-0..7 examples, {:.1} s]",
        set.len(),
        a.out.display(),
        resumed,
        steps,
        n_examples,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
