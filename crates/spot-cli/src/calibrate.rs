//! `spot calibrate-spiffy`: the Spiffy baseline's static draft graph from trajectories;
//! `spot calibrate-tokens`: a drafter checkpoint's token calibration;
//! `spot calibrate-sets`: the SPOT-Sets drafter's join tables.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use spot_drafter::{
    CalibrationPaths, ModuleTokens, OrderModel, PriorWeight, RankTilt, SpiffyGraph,
    TokenCalibration,
};
use spot_train::{CalibrateSpiffy, FitCalibration, Trajectory, TrajectoryDir};

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

/// Arguments of `spot calibrate-tokens`.
#[derive(clap::Args)]
pub struct CalibrateTokensArgs {
    /// Trajectory directories written by `spot collect` (training prompts only; one table is
    /// fitted per decoding temperature found).
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// Drafter checkpoint whose token calibration is replaced (`.safetensors`, config next to
    /// it as `.json`).
    #[arg(long)]
    drafter: PathBuf,
    /// Where to write the recalibrated checkpoint (default: over `--drafter`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Deepest replay depth with a row of its own (deeper nodes use the last row).
    #[arg(long, default_value_t = 7)]
    max_depth: usize,
    /// Which replay examples the hit rates are over: `drafted` (paths whose earlier commits
    /// were each the stale choice or the hedge, the paths a tree drafts) or `all` (every
    /// replay path, as tables before this option were fitted).
    #[arg(long, value_enum, default_value_t = PathsArg::Drafted)]
    paths: PathsArg,
}

/// `--paths` of `spot calibrate-tokens`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum PathsArg {
    /// Paths a tree of stale choices and hedges drafts.
    Drafted,
    /// Every replay path.
    All,
}

impl PathsArg {
    fn paths(self) -> CalibrationPaths {
        match self {
            PathsArg::Drafted => CalibrationPaths::Drafted,
            PathsArg::All => CalibrationPaths::All,
        }
    }
}

/// Runs `spot calibrate-tokens`: refits a drafter checkpoint's per-temperature token
/// calibration ([`TokenCalibration::fit_per_temperature`]) without retraining its network.
pub fn run_tokens(a: &CalibrateTokensArgs) -> Result<()> {
    let (mut net, trajs) = load_with_trajectories(&a.drafter, &a.trajectories)?;
    let refs: Vec<&Trajectory> = trajs.iter().collect();
    let mut tables = Vec::new();
    for (t, count, [conf, margin]) in
        TokenCalibration::fit_per_temperature_scored(&refs, a.max_depth, a.paths.paths())
    {
        eprintln!(
            "T = {}: {count} trajectories, key {:?} (log-loss: confidence {conf:.4}, margin {margin:.4})",
            t.temperature.unwrap_or(f32::NAN),
            t.key,
        );
        tables.push(t);
    }
    net.set_token_calibration(None);
    net.set_token_calibrations(tables);
    save(&net, a.out.as_ref().unwrap_or(&a.drafter))
}

/// Arguments of `spot calibrate-order`.
#[derive(clap::Args)]
pub struct CalibrateOrderArgs {
    /// Drafter checkpoint whose rank tilts are replaced (`.safetensors`, config next to it as
    /// `.json`).
    #[arg(long)]
    drafter: PathBuf,
    /// A rank tilt as `TEMPERATURE:TILT` (repeat the flag or separate with commas), e.g.
    /// `--tilt 0:0,1:0.3,2:0.3`; decoding uses the one nearest its temperature. They replace
    /// the checkpoint's tilts; none given: its tilts are kept. `tools/tune_tilt.sh` picks them
    /// by NFE on the tuning prompts.
    #[arg(long, value_delimiter = ',', value_parser = parse_tilt)]
    tilt: Vec<RankTilt>,
    /// A rank-path prior weight as `TEMPERATURE:WEIGHT` with the weight in [0, 1] (repeat or
    /// separate with commas), e.g. `--prior 0:0,1:0.3,2:0.7`; decoding uses the one nearest
    /// its temperature. They replace the checkpoint's weights; none given: its weights are
    /// kept. Needs rank paths: `--rank-paths`, or those the checkpoint already carries.
    #[arg(long, value_delimiter = ',', value_parser = parse_prior)]
    prior: Vec<PriorWeight>,
    /// A Spiffy graph (`spot calibrate-spiffy`, training prompts only) whose rank paths the
    /// prior reads, stored in the checkpoint.
    #[arg(long)]
    rank_paths: Option<PathBuf>,
    /// Whether SPOT drafts the token module's tokens (the model folder's MRP module) as
    /// `TEMPERATURE:on` or `TEMPERATURE:off` (repeat or separate with commas), e.g.
    /// `--module-tokens 0:on,1:off,2:off`; decoding uses the one nearest its temperature.
    /// They replace the checkpoint's entries; none given: its entries are kept.
    #[arg(long, value_delimiter = ',', value_parser = parse_module_tokens)]
    module_tokens: Vec<ModuleTokens>,
    /// Where to write the checkpoint (default: over `--drafter`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `TEMPERATURE:VALUE` as the temperature and the value's text; `expected` names the value in
/// errors.
fn split_temperature<'a>(
    s: &'a str,
    expected: &str,
) -> std::result::Result<(f32, &'a str), String> {
    let (t, v) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected TEMPERATURE:{expected}"))?;
    let t = t
        .trim()
        .parse::<f32>()
        .map_err(|e| format!("{s:?}: temperature {t:?}: {e}"))?;
    Ok((t, v.trim()))
}

/// `TEMPERATURE:VALUE` as two numbers; `what` names the value in errors.
fn parse_pair(s: &str, what: &str) -> std::result::Result<(f32, f32), String> {
    let (t, v) = split_temperature(s, &what.to_uppercase())?;
    let v = v
        .parse::<f32>()
        .map_err(|e| format!("{s:?}: {what} {v:?}: {e}"))?;
    Ok((t, v))
}

fn parse_tilt(s: &str) -> std::result::Result<RankTilt, String> {
    let (temperature, tilt) = parse_pair(s, "tilt")?;
    let tilt = RankTilt { temperature, tilt };
    tilt.check().map_err(|e| format!("{s:?}: {e}"))?;
    Ok(tilt)
}

fn parse_prior(s: &str) -> std::result::Result<PriorWeight, String> {
    let (temperature, weight) = parse_pair(s, "weight")?;
    let w = PriorWeight {
        temperature,
        weight,
    };
    w.check().map_err(|e| format!("{s:?}: {e}"))?;
    Ok(w)
}

fn parse_module_tokens(s: &str) -> std::result::Result<ModuleTokens, String> {
    let (temperature, v) = split_temperature(s, "on or TEMPERATURE:off")?;
    let enabled = match v {
        "on" => true,
        "off" => false,
        other => return Err(format!("{s:?}: {other:?} is neither `on` nor `off`")),
    };
    let m = ModuleTokens {
        temperature,
        enabled,
    };
    m.check().map_err(|e| format!("{s:?}: {e}"))?;
    Ok(m)
}

/// Runs `spot calibrate-order`: sets a drafter checkpoint's per-temperature rank tilts
/// ([`spot_drafter::tilt`]), rank-path prior ([`spot_drafter::prior`]) and token source
/// ([`spot_drafter::module_tokens`]) without retraining its network.
pub fn run_order(a: &CalibrateOrderArgs) -> Result<()> {
    let device = crate::backend::device()?;
    let mut net = spot_drafter::checkpoint::load::<crate::Backend>(&a.drafter, &device)
        .with_context(|| format!("loading drafter {}", a.drafter.display()))?;
    let tilts = by_temperature(&a.tilt, |t| t.temperature, "--tilt")?;
    for t in &tilts {
        eprintln!("T = {}: tilt {}", t.temperature, t.tilt);
    }
    if !tilts.is_empty() {
        net.set_rank_tilts(tilts);
    }
    let mut priors = by_temperature(&a.prior, |w| w.temperature, "--prior")?;
    let paths = match &a.rank_paths {
        Some(p) => Some(
            SpiffyGraph::load(p).with_context(|| format!("loading rank paths {}", p.display()))?,
        ),
        None => None,
    };
    if let Some(g) = &paths
        && g.block_size != net.config().block_size
    {
        bail!(
            "--rank-paths: {} was calibrated for blocks of {}, the drafter for {}",
            a.rank_paths
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            g.block_size,
            net.config().block_size
        );
    }
    if !priors.is_empty() && paths.is_none() && net.config().rank_paths.is_none() {
        bail!("--prior needs rank paths: pass --rank-paths GRAPH (spot calibrate-spiffy)");
    }
    for w in &priors {
        eprintln!("T = {}: rank-path prior weight {}", w.temperature, w.weight);
    }
    if priors.is_empty() {
        priors = net.config().rank_prior_by_temperature.clone();
    }
    net.set_rank_prior(paths, priors);
    let module_tokens = by_temperature(&a.module_tokens, |m| m.temperature, "--module-tokens")?;
    for m in &module_tokens {
        let source = if m.enabled {
            "the token module's"
        } else {
            "stale"
        };
        eprintln!("T = {}: {source} tokens", m.temperature);
    }
    if !module_tokens.is_empty() {
        net.set_module_tokens(module_tokens);
    }
    save(&net, a.out.as_ref().unwrap_or(&a.drafter))
}

/// `items` sorted by temperature; an error naming `flag` when a temperature appears twice.
fn by_temperature<T: Clone>(
    items: &[T],
    temperature: impl Fn(&T) -> f32,
    flag: &str,
) -> Result<Vec<T>> {
    let mut v = items.to_vec();
    v.sort_by(|x, y| temperature(x).total_cmp(&temperature(y)));
    if v.windows(2)
        .any(|w| temperature(&w[0]) == temperature(&w[1]))
    {
        bail!("{flag} names a temperature twice");
    }
    Ok(v)
}

fn save(net: &OrderModel<crate::Backend>, out: &std::path::Path) -> Result<()> {
    spot_drafter::checkpoint::save(net, out)
        .with_context(|| format!("writing drafter {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// A drafter checkpoint and every trajectory of `dirs` (of its block size; at least one).
fn load_with_trajectories(
    drafter: &std::path::Path,
    dirs: &[PathBuf],
) -> Result<(OrderModel<crate::Backend>, Vec<Trajectory>)> {
    let device = crate::backend::device()?;
    let net = spot_drafter::checkpoint::load::<crate::Backend>(drafter, &device)
        .with_context(|| format!("loading drafter {}", drafter.display()))?;
    let block = net.config().block_size;
    let mut trajs = Vec::new();
    for d in dirs {
        let dir = TrajectoryDir::open(d)?;
        if dir.manifest().block_size != block {
            bail!(
                "{} has block size {}, the drafter {block}",
                d.display(),
                dir.manifest().block_size
            );
        }
        trajs.extend(dir.read_all()?.into_iter().map(|(_, t)| t));
    }
    if trajs.is_empty() {
        bail!("{dirs:?}: no trajectories (run spot collect first)");
    }
    Ok((net, trajs))
}

/// Arguments of `spot calibrate-sets`.
#[derive(clap::Args)]
pub struct CalibrateSetsArgs {
    /// Trajectory directories written by `spot collect --threshold TAU` (training prompts
    /// only); one table is fitted per directory, for its temperature and `τ`.
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// File to write (a model folder's default is its `spot-sets.json`).
    #[arg(long)]
    out: PathBuf,
    /// Threshold steps below the root with a row of their own (deeper ones read the last).
    #[arg(long, default_value_t = 8)]
    steps: usize,
}

/// Runs `spot calibrate-sets`.
pub fn run_sets(a: &CalibrateSetsArgs) -> Result<()> {
    if a.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let mut tables = Vec::new();
    for d in &a.trajectories {
        let dir = TrajectoryDir::open(d)?;
        let Some(tau) = dir.manifest().threshold else {
            bail!(
                "{}: decoded with one commit per forward; collect with --threshold TAU",
                d.display()
            );
        };
        let trajs: Vec<Trajectory> = dir.read_all()?.into_iter().map(|(_, t)| t).collect();
        if trajs.is_empty() {
            bail!("{}: no trajectories (run spot collect first)", d.display());
        }
        let t = spot_train::sets_fit::fit_join_table(&trajs, tau, a.steps);
        eprintln!(
            "{}: {} trajectories, T = {}, tau = {tau}: {} positions; P(leader clears tau) at step 0 by stale confidence: {}",
            d.display(),
            trajs.len(),
            dir.manifest().temperature,
            t.samples,
            t.edges
                .iter()
                .zip(&t.lead[0])
                .map(|(e, p)| format!("<={e}: {p:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        tables.push(t);
    }
    spot_dlm::sets::SetsDrafter { tables }.save(&a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
