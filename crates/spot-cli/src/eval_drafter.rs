//! `spot eval-drafter`: next-commit accuracy of a drafter on held-out trajectories, by depth,
//! next to stale-confidence ranking, and how often the stale token is the committed one; at
//! depth 0 also the accuracy of the order SPOT decodes with (tilt and prior applied).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use spot_drafter::{LearnedScorer, checkpoint};
use spot_train::token_hits;
use spot_train::{TrajectoryDir, evaluate_on, replay};

use crate::{Backend, methods, model_dir};

/// Arguments of `spot eval-drafter`.
#[derive(clap::Args)]
pub struct EvalArgs {
    /// Trajectory directories (held-out prompts) written by `spot collect`.
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// Drafter checkpoint (default: `spot-drafter.safetensors` in the model folder).
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Model folder holding the default drafter.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Deepest replay depth.
    #[arg(long, default_value_t = 7)]
    max_depth: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `spot eval-drafter`.
pub fn run(a: &EvalArgs) -> Result<()> {
    let path = match &a.drafter {
        Some(p) => p.clone(),
        None => model_dir::resolve(a.model.as_deref())?.join(methods::DEFAULT_DRAFTER),
    };
    let net = checkpoint::load::<Backend>(&path, &crate::backend::device()?)
        .with_context(|| format!("loading drafter {}", path.display()))?;
    let mut trajs = Vec::new();
    for d in &a.trajectories {
        trajs.extend(
            TrajectoryDir::open(d)?
                .read_all()?
                .into_iter()
                .map(|(_, t)| t),
        );
    }
    if trajs.is_empty() {
        bail!("no trajectories in {:?}", a.trajectories);
    }
    let acc = evaluate_on(&net, &trajs, a.max_depth);
    // The order SPOT decodes with: the network after the tilt and prior of each trajectory's
    // temperature (the columns above are the raw network's).
    let mut decoded = LearnedScorer::new(net.clone());
    let (mut hits0, mut n0) = (0, 0);
    for t in &trajs {
        let (h, n) = replay::depth0_hits(t, &mut decoded)?;
        hits0 += h;
        n0 += n;
    }
    let decoded0 = hits0 as f64 / n0.max(1) as f64;
    let hits = token_hits(&trajs, a.max_depth);
    let depths: Vec<serde_json::Value> = (0..acc.count.len())
        .map(|d| {
            let n = acc.count[d].max(1) as f64;
            serde_json::json!({
                "depth": d,
                "examples": acc.count[d],
                "drafter_accuracy": acc.drafter_hits[d] as f64 / n,
                "stale_confidence_accuracy": acc.confidence_hits[d] as f64 / n,
                "token_top1_hit": hits.top1_rate(d),
                "token_runner_up_hit": hits.runner_up_rate(d),
                "mean_stale_top1_prob": hits.mean_top1_prob(d),
            })
        })
        .collect();
    if a.json {
        let j = serde_json::json!({
            "drafter": path.display().to_string(),
            "trajectories": trajs.len(),
            "examples": acc.count.iter().sum::<usize>(),
            "loss": acc.loss,
            "drafter_accuracy": acc.drafter(),
            "stale_confidence_accuracy": acc.confidence(),
            "decoded_depth0_accuracy": decoded0,
            "by_depth": depths,
        });
        println!("{j}");
        return Ok(());
    }
    println!(
        "{} trajectories, {} examples; held-out loss {:.4}; next-commit accuracy: drafter {:.3}, stale confidence {:.3}",
        trajs.len(),
        acc.count.iter().sum::<usize>(),
        acc.loss,
        acc.drafter(),
        acc.confidence()
    );
    println!(
        "depth 0 as SPOT decodes (rank tilt and prior of each trajectory's temperature applied): {decoded0:.3} over {n0} examples"
    );
    println!(
        "| depth | examples | drafter | stale confidence | stale token = committed | runner-up = committed | mean stale top-1 prob |"
    );
    println!("|---|---|---|---|---|---|---|");
    for d in &depths {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            d["depth"],
            d["examples"],
            d["drafter_accuracy"].as_f64().unwrap_or(f64::NAN),
            d["stale_confidence_accuracy"].as_f64().unwrap_or(f64::NAN),
            d["token_top1_hit"].as_f64().unwrap_or(f64::NAN),
            d["token_runner_up_hit"].as_f64().unwrap_or(f64::NAN),
            d["mean_stale_top1_prob"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}
