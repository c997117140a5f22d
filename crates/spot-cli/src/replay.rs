//! `spot replay`: the tree drafters' rounds re-enacted on recorded draft-free trajectories,
//! without the target ([`spot_train::replay`](mod@spot_train::replay)): forwards per trajectory for each method,
//! budget and rank tilt, in seconds instead of the minutes live decodes take.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use spot_dlm::{OrderScorer, StaleConfidenceScorer, TreeBuilder, TreeConfig};
use spot_drafter::{Calibrated, LearnedScorer, PriorWeight, RankTilt, SpiffyScorer};
use spot_train::Trajectory;
use spot_train::{ReplayCount, TrajectoryDir, replay};

use crate::methods::{BlockEndArgs, DrafterFileArgs, Drafters, Method};
use crate::model_dir;

/// Arguments of `spot replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trajectory directories written by `spot collect` (one-commit decoding; grouped by
    /// their decoding temperature).
    #[arg(long, required = true, num_args = 1..)]
    trajectories: Vec<PathBuf>,
    /// Model folder holding the default drafter files.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tree methods to replay: `spot`, `spot-unit`, `blockspec`, `spiffy`, `ssd`.
    #[arg(long, value_delimiter = ',', default_value = "spot,spiffy,blockspec")]
    methods: Vec<Method>,
    /// Budgets D.
    #[arg(long, value_delimiter = ',', default_values_t = [8])]
    budgets: Vec<usize>,
    /// Rank tilts for `spot`: the method is replayed once per value, the value replacing the
    /// checkpoint's tilt at every temperature. None: the checkpoint's own.
    #[arg(long, value_delimiter = ',')]
    tilts: Vec<f32>,
    /// Token weights for `spot`, one row each: `checkpoint` (its calibration tables), `stale`
    /// (the stale probability, hedge below 0.6: the builder's default) or `unit` (the stale
    /// choice at weight 1, no hedge: `spot-unit`).
    #[arg(long, value_delimiter = ',', default_value = "checkpoint")]
    spot_tokens: Vec<TokenWeights>,
    /// Rank-path prior weights `w` for `spot` (`spot_drafter::prior`), one row each, each
    /// replacing the checkpoint's weight at every temperature (rank paths: the checkpoint's,
    /// else the model folder's Spiffy graph). None: the checkpoint's own.
    #[arg(long, value_delimiter = ',')]
    prior_weights: Vec<f32>,
    #[command(flatten)]
    files: DrafterFileArgs,
    #[command(flatten)]
    block_ends: BlockEndArgs,
    /// Threads the trajectories are split over (default: the available cores).
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get()))]
    threads: usize,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

/// Token weights of `spot` in `spot replay --spot-tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TokenWeights {
    /// The checkpoint's calibration tables.
    Checkpoint,
    /// The stale probability of the choice (the tree builder's default).
    Stale,
    /// The stale choice at weight 1, no hedge.
    Unit,
}

/// Runs `spot replay`.
pub fn run(a: &ReplayArgs) -> Result<()> {
    for &m in &a.methods {
        if !matches!(
            m,
            Method::Spot
                | Method::SpotUnit
                | Method::SpotReuse
                | Method::Blockspec
                | Method::Spiffy
                | Method::Ssd
        ) {
            bail!(
                "--methods: {} is not a one-commit tree drafter that replay can re-enact (spot, spot-unit, spot-reuse, blockspec, spiffy, ssd)",
                m.name()
            );
        }
    }
    if a.budgets.contains(&0) {
        bail!("--budgets: a budget must be at least 1");
    }
    for &t in &a.tilts {
        RankTilt {
            temperature: 0.0,
            tilt: t,
        }
        .check()
        .with_context(|| format!("--tilts {t}"))?;
    }
    let dir = model_dir::resolve(a.model.as_deref())?;
    if let Some(x) = a.prior_weights.iter().find(|x| !(0.0..=1.0).contains(*x)) {
        bail!("--prior-weights: a weight must be in [0, 1], got {x}");
    }
    let files = a.files.files(&dir);
    // Replay cannot run the token module (it needs the target): never load it.
    let mut drafters = crate::methods::load_drafters_at(&a.methods, &files, &[])?;
    // A prior weight needs rank paths: the checkpoint's, else the folder's Spiffy graph.
    if !a.prior_weights.is_empty()
        && drafters.spiffy().is_none()
        && drafters
            .net()
            .is_some_and(|n| n.config().rank_paths.is_none())
    {
        let mut needed = a.methods.clone();
        needed.push(Method::Spiffy);
        drafters = crate::methods::load_drafters_at(&needed, &files, &[])?;
    }
    let mut by_t: BTreeMap<u32, Vec<Trajectory>> = BTreeMap::new();
    for d in &a.trajectories {
        for (_, t) in TrajectoryDir::open(d)?.read_all()? {
            by_t.entry(t.temperature.to_bits()).or_default().push(t);
        }
    }
    if by_t.is_empty() {
        bail!("no trajectories in {:?}", a.trajectories);
    }
    if let Some(n) = drafters.net().filter(|_| a.methods.contains(&Method::Spot)) {
        for &bits in by_t.keys() {
            let t = f32::from_bits(bits);
            if n.config().module_tokens_for(t) {
                eprintln!(
                    "spot replay: at T = {t} the checkpoint drafts the token module's tokens, \
                     which need the target; `spot` is replayed with stale tokens there"
                );
            }
        }
    }
    let fill = a.block_ends.lookahead_fill;
    if !a.json {
        println!(
            "| T | method | D | trajectories | commits | forwards / trajectory | commits / forward | accepted / round |"
        );
        println!("|---|---|---|---|---|---|---|---|");
    }
    for (bits, trajs) in &by_t {
        let t = f32::from_bits(*bits);
        for &m in &a.methods {
            let tilts: Vec<Option<f32>> = if m == Method::Spot && !a.tilts.is_empty() {
                a.tilts.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            let tokens = match m {
                Method::Spot => a.spot_tokens.clone(),
                _ => vec![TokenWeights::Checkpoint],
            };
            let priors: Vec<Option<f32>> = match m {
                Method::Spot if !a.prior_weights.is_empty() => {
                    a.prior_weights.iter().copied().map(Some).collect()
                }
                _ => vec![None],
            };
            for ((tilt, tw), prior) in tilts
                .iter()
                .flat_map(|&l| tokens.iter().map(move |&w| (l, w)))
                .flat_map(|x| priors.iter().map(move |&p| (x, p)))
            {
                for &budget in &a.budgets {
                    let row = Row {
                        method: m,
                        tilt,
                        tokens: tw,
                        prior,
                        budget,
                    };
                    let n = replay_parallel(&row, &drafters, trajs, fill, a.threads)?;
                    let mut name = m.name().to_string();
                    if let Some(l) = tilt {
                        name += &format!(" (tilt {l})");
                    }
                    if let Some(w) = prior {
                        name += &format!(" (prior {w})");
                    }
                    if tw != TokenWeights::Checkpoint {
                        name += &format!(" ({tw:?} tokens)").to_lowercase();
                    }
                    print_row(a.json, t, &name, budget, &n);
                }
            }
        }
    }
    Ok(())
}

/// One row of the table: what is replayed.
#[derive(Clone, Copy)]
struct Row {
    method: Method,
    tilt: Option<f32>,
    tokens: TokenWeights,
    prior: Option<f32>,
    budget: usize,
}

/// Replays `row` on `trajs`, split over `threads` threads (each with its own scorer and
/// builder; the counts are sums, so the split does not change them).
fn replay_parallel(
    row: &Row,
    d: &Drafters,
    trajs: &[Trajectory],
    fill: usize,
    threads: usize,
) -> Result<ReplayCount> {
    let chunk = trajs.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = trajs
            .chunks(chunk)
            .map(|part| s.spawn(move || replay_row(row, d, part, fill)))
            .collect();
        let mut n = ReplayCount::default();
        for h in handles {
            n += h
                .join()
                .map_err(|_| anyhow::anyhow!("a replay thread panicked"))??;
        }
        Ok(n)
    })
}

/// Replays `row` on `trajs` in this thread.
fn replay_row(row: &Row, d: &Drafters, trajs: &[Trajectory], fill: usize) -> Result<ReplayCount> {
    let (mut scorer, max_depth) = scorer(row, d)?;
    let mut cfg = TreeConfig {
        budget: row.budget,
        ..TreeConfig::default()
    };
    if let Some(depth) = max_depth {
        cfg.max_depth = depth;
    }
    let mut builder = TreeBuilder::new(cfg)?;
    let mut n = ReplayCount::default();
    for traj in trajs {
        n += match scorer.as_deref_mut() {
            Some(s) => replay(traj, &mut builder, s, fill)?,
            None => spot_train::replay::replay_chain(traj, &mut builder, fill)?,
        };
    }
    Ok(n)
}

type Scorer = Option<Box<dyn OrderScorer>>;

/// The scorer of `m` (`None`: the chain) and its depth limit.
fn scorer(row: &Row, d: &Drafters) -> Result<(Scorer, Option<usize>)> {
    let (m, tilt, tokens) = (row.method, row.tilt, row.tokens);
    let net = || -> Result<_> {
        let Some(mut n) = d.net().cloned() else {
            return Ok(None);
        };
        if let Some(w) = row.prior {
            let paths = match &n.config().rank_paths {
                Some(_) => None,
                None => Some(
                    d.spiffy()
                        .context("--prior-weights needs rank paths: a Spiffy graph")?
                        .clone(),
                ),
            };
            n.set_rank_prior(
                paths,
                vec![PriorWeight {
                    temperature: 0.0,
                    weight: w,
                }],
            );
        }
        if let Some(l) = tilt {
            n.set_rank_tilts(vec![RankTilt {
                temperature: 0.0,
                tilt: l,
            }]);
        }
        if tokens == TokenWeights::Stale {
            n.set_token_calibrations(Vec::new());
        }
        Ok(Some(n))
    };
    Ok(match m {
        Method::Spot if tokens == TokenWeights::Unit => (
            Some(Box::new(Calibrated::unit(LearnedScorer::new(
                net()?.context("no drafter checkpoint")?,
            )))),
            None,
        ),
        Method::Spot => (
            Some(Box::new(LearnedScorer::new(
                net()?.context("no drafter checkpoint")?,
            ))),
            None,
        ),
        Method::SpotReuse => (
            Some(Box::new(
                LearnedScorer::new(net()?.context("no drafter checkpoint")?)
                    .reuse_below(crate::methods::REUSE_BELOW),
            )),
            None,
        ),
        Method::SpotUnit => (
            Some(Box::new(Calibrated::unit(LearnedScorer::new(
                net()?.context("no drafter checkpoint")?,
            )))),
            None,
        ),
        Method::Blockspec => (
            Some(Box::new(Calibrated::new(
                StaleConfidenceScorer,
                d.calibration().to_vec(),
            ))),
            None,
        ),
        Method::Spiffy => {
            let g = d.spiffy().context("no Spiffy graph")?;
            (
                Some(Box::new(Calibrated::new(
                    SpiffyScorer::new(g),
                    d.calibration().to_vec(),
                ))),
                Some(g.max_depth),
            )
        }
        _ => (None, None),
    })
}

fn print_row(json: bool, t: f32, name: &str, budget: usize, n: &ReplayCount) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "temperature": t,
                "method": name,
                "budget": budget,
                "trajectories": n.trajectories,
                "commits": n.commits,
                "forwards": n.forwards,
                "forwards_per_trajectory": n.forwards_per_trajectory(),
                "commits_per_forward": n.commits_per_forward(),
                "accepted_per_round": n.accepted_per_round(),
                "prefetched": n.prefetched,
            })
        );
    } else {
        println!(
            "| {t} | {name} | {budget} | {} | {} | {:.2} | {:.3} | {:.3} |",
            n.trajectories,
            n.commits,
            n.forwards_per_trajectory(),
            n.commits_per_forward(),
            n.accepted_per_round()
        );
    }
}
