//! `spot bench-forward`: time target forwards over a cached prefix.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use spot_dlm::{BlockDiffusionModel, BlockState, MeteredModel, StatsQuery};
use spot_models::HeadPlacement;

use crate::{Backend, load, model_dir};

/// Arguments of `spot bench-forward`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Hugging Face model folder (default: the shipped `models/sdar-tiny-code`).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dtype: crate::DtypeArg,
    /// Cached prefix length in tokens.
    #[arg(long, default_value_t = 256)]
    prefix: usize,
    /// Block size.
    #[arg(long, default_value_t = 32)]
    block_size: usize,
    /// Batch sizes (block states per forward).
    #[arg(long, value_delimiter = ',', default_value = "1,21")]
    batches: Vec<usize>,
    /// Timed repetitions per batch size (after one untimed first call, reported as
    /// `b{B}_first_ms`: on a GPU it includes compiling and autotuning kernels).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Where the output layer and the reduction run, one or several side by side in this run:
    /// `auto` (the host kernel on CPU backends, the device on GPUs), `host`, `device`. With
    /// several, every result key is prefixed with the placement (`host_b1_median_ms`).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    heads: Vec<HeadPlacement>,
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// Runs the benchmark and prints one JSON line.
pub fn run(a: &BenchArgs) -> Result<()> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    if !spot_models::Family::detect(&dir)?.is_diffusion() {
        return run_autoregressive(a, &dir);
    }
    let t = Instant::now();
    let mut model = load(&dir, a.dtype)?;
    let load_s = t.elapsed().as_secs_f64();
    let info = model.info().clone();
    if a.block_size == 0 || !a.prefix.is_multiple_of(a.block_size) {
        bail!("--prefix must be a multiple of --block-size (at least 1)");
    }
    let id =
        |i: usize| (spot_dlm::core::state::mix64(i as u64) % (info.vocab_size as u64 - 1)) as u32;
    let id = |i: usize| if id(i) == info.mask_id { 0 } else { id(i) };
    let prefix: Vec<u32> = (0..a.prefix).map(id).collect();
    let t = Instant::now();
    MeteredModel::new(&mut model).reset_prefix(&prefix, a.block_size, a.prefix + a.block_size)?;
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let q = StatsQuery::new(0.0, 0);
    let mut results = serde_json::Map::new();
    let states = |b: usize| -> Vec<BlockState> {
        (0..b)
            .map(|i| {
                let tokens = (0..a.block_size)
                    .map(|s| {
                        if (i + s) % 3 == 0 {
                            id(1000 + i * 97 + s)
                        } else {
                            info.mask_id
                        }
                    })
                    .collect();
                BlockState::from_tokens(tokens, info.mask_id)
            })
            .collect()
    };
    for &head in &a.heads {
        model.set_head_placement(head);
        let key = |k: String| {
            if a.heads.len() > 1 {
                format!("{}_{k}", head.name())
            } else {
                k
            }
        };
        for &b in &a.batches {
            let states = states(b);
            // The first call (kernel compilation and autotuning on a GPU), on its own line.
            let t = Instant::now();
            MeteredModel::new(&mut model).forward(&states, &q)?;
            let first = t.elapsed().as_secs_f64() * 1e3;
            results.insert(key(format!("b{b}_first_ms")), first.into());
            let mut times = Vec::with_capacity(a.reps);
            for _ in 0..a.reps {
                let t = Instant::now();
                MeteredModel::new(&mut model).forward(&states, &q)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let min = times.iter().copied().fold(f64::INFINITY, f64::min);
            results.insert(key(format!("b{b}_median_ms")), median(&mut times).into());
            results.insert(key(format!("b{b}_min_ms")), min.into());
            // The same forward returning raw logits to the host (what PyTorch's figure measures).
            let t = Instant::now();
            model.forward_logits(&states)?;
            let first = t.elapsed().as_secs_f64() * 1e3;
            results.insert(key(format!("b{b}_logits_first_ms")), first.into());
            let mut times = Vec::with_capacity(a.reps);
            for _ in 0..a.reps {
                let t = Instant::now();
                model.forward_logits(&states)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            results.insert(
                key(format!("b{b}_logits_median_ms")),
                median(&mut times).into(),
            );
        }
    }
    let mut j = serde_json::json!({
        "model": dir.display().to_string(),
        "parameters": model.parameter_count(),
        "backend": std::any::type_name::<Backend>(),
        "prefix": a.prefix,
        "block": a.block_size,
        "reps": a.reps,
        "load_s": load_s,
        "prefill_ms": prefill_ms,
        "peak_rss_mib": peak_rss_mib(),
        "heads": a.heads.iter().map(|h| h.name()).collect::<Vec<_>>(),
        "dtype": model.precision().name(),
        "includes": "forward + reduction of the masked positions to statistics (top-32, entropy, chosen token); logits: forward + every position's logits on the host",
    });
    if let Some(obj) = j.as_object_mut() {
        obj.extend(results);
    }
    println!("{j}");
    Ok(())
}

/// `spot bench-forward` on an autoregressive folder: after a `--prefix`-token prompt, times
/// one forward of `N` tokens for every `N` of `--batches` (a SpecDiff-2 round with `K = 1`:
/// one committed token appended and `N - 1` drafted tokens scored after it), each followed
/// by a truncation back to the prefix; keys `r{N}_median_ms`, `r{N}_min_ms`, `r{N}_first_ms` and the marginal cost per
/// token over the first size, `r{N}_extra_row_ms`.
fn run_autoregressive(a: &BenchArgs, dir: &std::path::Path) -> Result<()> {
    use spot_dlm::{AutoregressiveModel, MeteredArModel};
    let t = Instant::now();
    let mut model = spot_models::CausalLm::<Backend>::load_as(
        dir,
        &crate::backend::device()?,
        a.dtype.precision,
    )?;
    let load_s = t.elapsed().as_secs_f64();
    let vocab = model.ar_info().vocab_size as u64;
    let id = |i: usize| (spot_dlm::core::state::mix64(i as u64) % vocab) as u32;
    let prefix: Vec<u32> = (0..a.prefix.max(1)).map(id).collect();
    let q = StatsQuery::new(0.0, 0);
    let mut model = MeteredArModel::new(&mut model);
    let t = Instant::now();
    model.extend(&prefix, &q)?;
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut results = serde_json::Map::new();
    let mut base: Option<(usize, f64)> = None;
    for &n in &a.batches {
        if n == 0 {
            bail!("--batches must be positive");
        }
        // A round's forward: one committed token appended, `N - 1` drafted ones scored.
        let tokens: Vec<u32> = (0..n).map(|i| id(7919 + i)).collect();
        let branch = [tokens[1..].to_vec()];
        let branches = if n > 1 { &branch[..] } else { &[] };
        let mut timed = || -> Result<f64> {
            let t = Instant::now();
            model.extend_branches(&tokens[..1], branches, &q)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            model.truncate(prefix.len())?;
            Ok(ms)
        };
        results.insert(format!("r{n}_first_ms"), timed()?.into());
        let mut times = (0..a.reps).map(|_| timed()).collect::<Result<Vec<_>>>()?;
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(&mut times);
        results.insert(format!("r{n}_median_ms"), med.into());
        results.insert(format!("r{n}_min_ms"), min.into());
        match base {
            None => base = Some((n, med)),
            Some((b, bm)) if n > b => {
                results.insert(
                    format!("r{n}_extra_row_ms"),
                    ((med - bm) / (n - b) as f64).into(),
                );
            }
            Some(_) => {}
        }
    }
    let mut j = serde_json::json!({
        "model": dir.display().to_string(),
        "kind": "autoregressive",
        "backend": std::any::type_name::<Backend>(),
        "prefix": prefix.len(),
        "reps": a.reps,
        "load_s": load_s,
        "prefill_ms": prefill_ms,
        "peak_rss_mib": peak_rss_mib(),
        "includes": "one forward appending N tokens to the cached prefix + the reduction of every appended position to statistics (top-32, entropy, chosen token), then a truncation",
    });
    if let Some(obj) = j.as_object_mut() {
        obj.extend(results);
    }
    println!("{j}");
    Ok(())
}
