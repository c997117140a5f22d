//! `spot calibrate-spiffy`: the Spiffy baseline's static draft graph from trajectories.

use std::path::PathBuf;

use anyhow::{Result, bail};
use spot_drafter::{SpiffyGraph, TrajectoryDir};

/// Arguments of `spot calibrate-spiffy`.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// Trajectory directory written by `spot collect` (training prompts only).
    #[arg(long)]
    trajectories: PathBuf,
    /// Graph file to write (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Longest rank path (Spiffy caps its graphs at depth 6).
    #[arg(long, default_value_t = 6)]
    max_depth: usize,
    /// Rank paths kept (the most frequent; at least the largest budget you will draft with).
    #[arg(long, default_value_t = 256)]
    max_paths: usize,
}

/// Runs `spot calibrate-spiffy`.
pub fn run(a: &CalibrateArgs) -> Result<()> {
    if a.max_depth == 0 || a.max_paths == 0 {
        bail!("--max-depth and --max-paths must be at least 1");
    }
    let dir = TrajectoryDir::open(&a.trajectories)?;
    let trajs: Vec<_> = dir.read_all()?.into_iter().map(|(_, t)| t).collect();
    let g = SpiffyGraph::calibrate(&trajs, a.max_depth, a.max_paths)?;
    g.save(&a.out)?;
    eprintln!(
        "{} trajectories, {} rank sequences; kept {} paths; wrote {}",
        trajs.len(),
        g.sequences,
        g.paths.len(),
        a.out.display()
    );
    for p in g.paths.iter().take(12) {
        eprintln!(
            "  {:?}: {:.3}",
            p.ranks,
            p.count as f64 / g.sequences as f64
        );
    }
    Ok(())
}
