//! `spot bench-drafter`: time one call of the order network at several batch sizes, through
//! the packed host path (in `f32` and with int8 products) and through burn, side by side.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_drafter::{HostOrderNet, OrderModel, Precision};

use crate::{Backend, methods::DEFAULT_DRAFTER, model_dir};

/// Arguments of `spot bench-drafter`.
#[derive(clap::Args)]
pub struct BenchDrafterArgs {
    /// Order-network checkpoint (default: `MODEL/spot-drafter.safetensors`).
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// Model folder whose drafter is timed when `--drafter` is not given (default: the
    /// shipped `models/sdar-tiny-code`).
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
        default_value = "host,int8,burn"
    )]
    paths: Vec<Path>,
}

/// Runs the benchmark and prints one JSON line: per batch size and path the median and
/// p95 milliseconds per call, and the ratios burn / host and host / int8 where both ran.
pub fn run(a: &BenchDrafterArgs) -> Result<()> {
    let path = match &a.drafter {
        Some(p) => p.clone(),
        None => model_dir::resolve(a.model.as_deref())?.join(DEFAULT_DRAFTER),
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
        for (num, den) in [(Path::Burn, Path::Host), (Path::Host, Path::Int8)] {
            if let (Some(x), Some(y)) = (medians.get(&num), medians.get(&den)) {
                let key = format!("n{n}_{}_over_{}", num.name(), den.name());
                results.insert(key, (x / y).into());
            }
        }
    }
    println!("{}", serde_json::Value::Object(results));
    Ok(())
}

/// An inference path of the order network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Path {
    /// The packed host path in `f32` (`HostOrderNet`, what `spot` drafts with by default).
    Host,
    /// The packed host path with int8 products (`--drafter-precision int8`).
    Int8,
    /// burn's `OrderModel` on the CPU backend (the training definition).
    Burn,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Host => "host",
            Path::Int8 => "int8",
            Path::Burn => "burn",
        }
    }
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
