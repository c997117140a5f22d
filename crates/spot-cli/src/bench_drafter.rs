//! `spot bench-drafter`: time one call of the order network and one step of the token module
//! (MRP) at several batch sizes, through the packed host paths (in `f32` and with int8
//! products) and through burn, side by side; and SPOT-Sets' set network on as many states.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_dlm::sets::{DEFAULT_SETS_NET, JoinPrediction, SetsNet};
use spot_dlm::{BlockState, BlockStats, JoinModel, PositionStats, ScoreContext, TokenId};
use spot_drafter::mrp::{DEFAULT_MRP, Mrp};
use spot_drafter::{HostOrderNet, MrpBuffers, OrderModel, Precision};

use crate::{Backend, methods::DEFAULT_DRAFTER, model_dir};

/// Arguments of `spot bench-drafter`.
#[derive(clap::Args)]
pub struct BenchDrafterArgs {
    /// Order-network checkpoint (default: `MODEL/spot-drafter.safetensors`).
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Model folder whose drafter is timed when `--drafter` is not given, whose token
    /// module (`mrp.json`) the `mrp-*` paths time and whose set network
    /// (`spot-sets-net.json`) the `sets-net` path times (default: the shipped
    /// `models/sdar-tiny-code`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Block states per call.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,20")]
    nodes: Vec<usize>,
    /// Timed calls per batch size and path (after two untimed ones).
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// The paths timed, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "host,int8,burn,mrp-host,mrp-int8,mrp-burn,sets-net"
    )]
    paths: Vec<Path>,
}

/// Runs the benchmark and prints one JSON line: per batch size and path the median and
/// p95 milliseconds per call, and the ratios burn / host and host / int8 where both ran.
pub fn run(a: &BenchDrafterArgs) -> Result<()> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    let path = match &a.drafter {
        Some(p) => p.clone(),
        None => dir.join(DEFAULT_DRAFTER),
    };
    if a.reps == 0 || a.nodes.contains(&0) {
        bail!("--reps and every --nodes value must be at least 1");
    }
    let net: OrderModel<Backend> = spot_drafter::checkpoint::load(&path, &Default::default())
        .with_context(|| format!("loading {}", path.display()))?;
    let cfg = net.config().clone();
    let (l, nf) = (cfg.block_size, cfg.n_features);
    let mut host = HostOrderNet::new(&net);
    let mut int8 = HostOrderNet::with_precision(&net, Precision::Int8);
    let module = if a.paths.iter().any(|p| p.module()) {
        let file = dir.join(DEFAULT_MRP);
        let m = Mrp::<Backend>::load(&dir, &file, &Default::default())
            .with_context(|| format!("loading {}", file.display()))?;
        Some(m)
    } else {
        None
    };
    let mut sets = if a.paths.contains(&Path::SetsNet) {
        let file = dir.join(DEFAULT_SETS_NET);
        let net = SetsNet::load(&file).with_context(|| format!("loading {}", file.display()))?;
        Some(net)
    } else {
        None
    };
    let mut buffers = MrpBuffers::default();
    let mut residuals = Vec::new();
    let mut results = serde_json::Map::new();
    results.insert("drafter".into(), path.display().to_string().into());
    results.insert("threads".into(), rayon_threads().into());
    for &n in &a.nodes {
        // Feature values do not change the cost; these are shaped like real ones.
        let features: Vec<f32> = (0..n * l * nf)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let valid: Vec<f32> = (0..n * l)
            .map(|i| if i % 3 == 0 { 0.0 } else { 1.0 })
            .collect();
        let mut out = vec![0.0; n * l];
        // The module's inputs: token ids spread over the vocabulary, unit-scale hidden rows.
        let (ids, hidden): (Vec<TokenId>, Vec<f32>) = match &module {
            Some(m) => (
                (0..n * l)
                    .map(|i| ((i * 7919) % m.vocab_size()) as TokenId)
                    .collect(),
                (0..n * l * m.hidden_size())
                    .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
                    .collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        // The set network's inputs: `n` states of a block whose every position has a stale
        // top list and a hidden state, a third of each state's positions committed.
        let (root, stale) = match &sets {
            Some(net) => sets_stale(l, net.config().hidden_dim)?,
            None => (BlockState::masked(l, 0), BlockStats::default()),
        };
        let states: Vec<Vec<TokenId>> = (0..n)
            .map(|j| {
                (0..l)
                    .map(|s| {
                        if (s + j) % 3 == 0 {
                            1 + s as TokenId
                        } else {
                            0
                        }
                    })
                    .collect()
            })
            .collect();
        let mut prediction = JoinPrediction::default();
        let mut medians = std::collections::HashMap::new();
        for p in &a.paths {
            let mut ms = match p {
                Path::Host => time(a.reps, || {
                    host.probabilities(&features, &valid, n, &mut out)
                }),
                Path::Int8 => time(a.reps, || {
                    int8.probabilities(&features, &valid, n, &mut out)
                }),
                Path::Burn => time(a.reps, || {
                    std::hint::black_box(net.probabilities(&features, &valid, n));
                }),
                Path::MrpHost | Path::MrpInt8 | Path::MrpBurn => {
                    let Some(m) = &module else {
                        bail!("internal: the token module was not loaded");
                    };
                    let precision = match p {
                        Path::MrpInt8 => Some(Precision::Int8),
                        Path::MrpHost => Some(Precision::F32),
                        _ => None,
                    };
                    let mut failed = None;
                    let ms = time(a.reps, || {
                        let stepped = match precision {
                            Some(pr) => m.host(pr).step(
                                &mut buffers,
                                (&ids, &hidden),
                                (n, l),
                                &mut residuals,
                            ),
                            None => m.step(&ids, &hidden, n, l).map(|_| ()),
                        };
                        if let Err(e) = stepped {
                            failed = Some(e);
                        }
                    });
                    if let Some(e) = failed {
                        return Err(e).context("stepping the token module");
                    }
                    ms
                }
                Path::SetsNet => {
                    let Some(net) = &mut sets else {
                        bail!("internal: the set network was not loaded");
                    };
                    let ctx = ScoreContext {
                        root: &root,
                        stale: &stale,
                        block_start: 64,
                        noise: None,
                        temperature: 0.0,
                    };
                    let mut failed = None;
                    let ms = time(a.reps, || {
                        for state in &states {
                            prediction.reset(l);
                            if let Err(e) = net.predict(&ctx, state, 1, 0.9, &mut prediction) {
                                failed = Some(e);
                            }
                        }
                    });
                    if let Some(e) = failed {
                        return Err(e).context("predicting with the set network");
                    }
                    ms
                }
            };
            let name = p.name();
            let median = quantile(&mut ms, 0.5);
            medians.insert(*p, median);
            results.insert(format!("n{n}_{name}_median_ms"), median.into());
            results.insert(
                format!("n{n}_{name}_p95_ms"),
                quantile(&mut ms, 0.95).into(),
            );
        }
        for (num, den) in [
            (Path::Burn, Path::Host),
            (Path::Host, Path::Int8),
            (Path::MrpBurn, Path::MrpHost),
            (Path::MrpHost, Path::MrpInt8),
        ] {
            if let (Some(x), Some(y)) = (medians.get(&num), medians.get(&den)) {
                let key = format!("n{n}_{}_over_{}", num.name(), den.name());
                results.insert(key, (x / y).into());
            }
        }
    }
    println!("{}", serde_json::Value::Object(results));
    Ok(())
}

/// An inference path of the order network or the token module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Path {
    /// The order network's packed host path in `f32` (`HostOrderNet`, `--drafter-precision
    /// f32`).
    Host,
    /// The order network's packed host path with int8 products (what `spot` drafts with by
    /// default).
    Int8,
    /// burn's `OrderModel` on the CPU backend (the training definition).
    Burn,
    /// The token module's packed host step in `f32` (`HostMrp`; the MRP baseline's).
    MrpHost,
    /// The token module's host step with int8 products (SPOT's module tokens by default).
    MrpInt8,
    /// The token module through burn (`Mrp::step`, the training definition).
    MrpBurn,
    /// SPOT-Sets' set network (`SetsNet`, its token head included): one prediction per
    /// state, as the set builder asks them (one a node), at `T = 0`.
    SetsNet,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Host => "host",
            Path::Int8 => "int8",
            Path::Burn => "burn",
            Path::MrpHost => "mrp-host",
            Path::MrpInt8 => "mrp-int8",
            Path::MrpBurn => "mrp-burn",
            Path::SetsNet => "sets-net",
        }
    }

    /// Whether the path times the token module.
    fn module(self) -> bool {
        matches!(self, Path::MrpHost | Path::MrpInt8 | Path::MrpBurn)
    }
}

/// A root of `l` masked positions (mask id 0) and stale statistics for it: top lists of 32
/// tokens with falling probabilities, hidden states of width `dim` at unit scale.
fn sets_stale(l: usize, dim: usize) -> Result<(BlockState, BlockStats)> {
    const TOP: usize = 32;
    let mut stats = BlockStats::new(TOP);
    let mut ids = [0 as TokenId; TOP];
    let mut probs = [0.0f32; TOP];
    for s in 0..l {
        for (k, (id, p)) in ids.iter_mut().zip(&mut probs).enumerate() {
            *id = (1 + (s * 131 + k * 17) % 4000) as TokenId;
            *p = 0.6 / (1 + k * (1 + s % 4)) as f32;
        }
        stats.push(PositionStats {
            token: ids[0],
            confidence: probs[0],
            token_prob: probs[0],
            entropy: 1.5,
            tail_mass: 0.05,
            top_ids: &ids,
            top_probs: &probs,
        })?;
    }
    let hidden = (0..l * dim)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    stats.set_hidden(dim, hidden)?;
    Ok((BlockState::masked(l, 0), stats))
}

/// Milliseconds of `reps` calls of `f`, after two untimed ones.
fn time(reps: usize, mut f: impl FnMut()) -> Vec<f64> {
    f();
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

/// The `q` quantile (nearest rank) of `v`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// Cores the machine offers: the default size of the thread pool that both paths split a
/// call over (`RAYON_NUM_THREADS` overrides it).
fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
