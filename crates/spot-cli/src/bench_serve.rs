//! `spot bench-serve`: the server against the batch driver it wraps, side by side in one run.
//!
//! First every prompt is decoded through one [`BatchDriver`] with `--batch` requests in
//! flight (what `spot generate --prompts FILE --batch N` does); then `spot serve` starts on
//! the same folder and options, and a load generator sends the same prompts at each
//! `--concurrency`. Every response must equal the driver's text; the report gives tokens per
//! second, the ratio to the driver, and latency percentiles. On an autoregressive folder the
//! driver is a [`SpecDiffBatch`] (`--method df` or `specdiff`), as `spot serve` runs it.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use spot_dlm::{AutoregressiveModel, BatchDriver};
use spot_models::Family;
use spot_serve::load::{LoadConfig, run_blocking};
use spot_specdiff::SpecDiffBatch;

use crate::decode_args::DecodeArgs;
use crate::generate::ar::{self, SpecDiffArgs};
use crate::methods::Method;
use crate::prompts::{self, ChatArgs, Prompt};
use crate::serve::{self, LogFormat, ServeArgs};
use crate::{DtypeArg, load, model_dir};

/// Arguments of `spot bench-serve`.
#[derive(clap::Args)]
pub struct BenchServeArgs {
    /// Model folder (default: `SPOT_MODEL`, else the shipped model).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    dtype: DtypeArg,
    /// JSONL prompt file.
    #[arg(long)]
    prompts: PathBuf,
    /// Field holding the prompt (default: the first of prompt, question, text, input,
    /// problem).
    #[arg(long)]
    field: Option<String>,
    /// Use the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    /// Requests in flight in the driver run and the server's batch limit.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch: u64,
    /// Client concurrencies to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
    concurrency: Vec<usize>,
    /// Streamed responses (server-sent events) instead of plain ones.
    #[arg(long)]
    stream: bool,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    chat: ChatArgs,
    #[command(flatten)]
    decode: DecodeArgs,
    /// SpecDiff-2's settings (autoregressive folders).
    #[command(flatten)]
    specdiff: SpecDiffArgs,
    /// The server's request logs on stderr, as `spot serve --log-format` writes them (off by
    /// default; on, to measure what logging costs).
    #[arg(long, value_enum, default_value_t = LogFormat::Off)]
    log_format: LogFormat,
}

/// The API key of the benchmarked server: its requests go through the key check, as a
/// shared server's do.
const BENCH_KEY: &str = "spot-bench-serve";

/// One measured configuration.
struct Row {
    what: String,
    wall: f64,
    tokens_per_s: f64,
    p50: f64,
    p95: f64,
}

/// Runs `spot bench-serve`.
pub fn run(a: &BenchServeArgs) -> Result<()> {
    if a.chat.system.is_some() {
        bail!("--system is not sent by the load generator; use --chat alone");
    }
    serve::init_logs(a.log_format)?;
    if a.concurrency.contains(&0) {
        bail!("--concurrency values must be at least 1");
    }
    let dir = model_dir::resolve(a.model.as_deref())?;
    let set = prompts::load_prompts(&a.prompts, a.field.as_deref(), a.limit)?;
    // The driver run (then the model is dropped: the server loads its own).
    let diffusion = Family::detect(&dir)?.is_diffusion();
    let (texts, tokens, driver_wall) = match diffusion {
        true => diffusion_driver(a, &dir, &set)?,
        false => autoregressive_driver(a, &dir, &set)?,
    };
    let driver = if diffusion {
        "BatchDriver"
    } else {
        "SpecDiffBatch"
    };
    let mut rows = vec![Row {
        what: format!("{driver}, batch {}", a.batch),
        wall: driver_wall,
        tokens_per_s: tokens as f64 / driver_wall,
        p50: f64::NAN,
        p95: f64::NAN,
    }];
    let server = serve::start(&ServeArgs {
        model: Some(dir.clone()),
        dtype: a.dtype,
        host: "127.0.0.1".into(),
        port: 0,
        served_model_name: Some("bench".into()),
        chat_template: None,
        max_batch: a.batch,
        max_pending: 1 << 20,
        api_keys: vec![BENCH_KEY.into()],
        allow_unauthenticated: false,
        max_body_bytes: 2 << 20,
        max_n: 1,
        max_budget: a.decode.budget.max(1) as u64,
        decode: a.decode.clone(),
        specdiff: a.specdiff.clone(),
        limits: serve::ServeLimits {
            log_format: a.log_format,
            ..serve::ServeLimits::quiet()
        },
    })?;
    for &c in &a.concurrency {
        let cfg = LoadConfig {
            prompts: set.iter().map(|p| p.text.clone()).collect(),
            concurrency: c,
            max_tokens: a.decode.max_new_tokens,
            temperature: a.decode.temperature,
            seed: a.decode.seed,
            stream: a.stream,
            chat: a.chat.chat,
            api_key: Some(BENCH_KEY.into()),
            ..LoadConfig::new(format!("http://{}", server.addr()), "bench")
        };
        let report = run_blocking(&cfg)?;
        for (r, want) in report.responses.iter().zip(&texts) {
            if &r.text != want {
                bail!(
                    "concurrency {c}: the response to prompt {} differs from the driver's \
                     decode:\n  server: {:?}\n  driver: {want:?}",
                    set[r.index].id,
                    r.text
                );
            }
        }
        let wall = report.wall.as_secs_f64();
        rows.push(Row {
            what: format!("server, concurrency {c}"),
            wall,
            tokens_per_s: tokens as f64 / wall,
            p50: report.latency_percentile(0.5),
            p95: report.latency_percentile(0.95),
        });
    }
    server.stop()?;
    report(a, set.len(), tokens, &rows)
}

/// Decoded texts, tokens in all, and wall seconds of the prompts through a block-diffusion
/// model's [`BatchDriver`].
fn diffusion_driver(
    a: &BenchServeArgs,
    dir: &std::path::Path,
    set: &[Prompt],
) -> Result<(Vec<String>, usize, f64)> {
    let mut model = load(dir, a.dtype)?;
    model.set_approximate_prefix_cache(a.decode.approx_prefix_cache)?;
    let drafters = crate::methods::load_drafters_at(
        &[a.decode.method],
        &a.decode.files.files(dir),
        &[a.decode.temperature],
    )?;
    let encoded = a.chat.encode_all(dir, model.tokenizer(), set)?;
    let cfg = a.decode.config(&model);
    let tokenizer = model
        .tokenizer()
        .cloned()
        .context("bench-serve needs tokenizer.json")?;
    let mut driver = BatchDriver::new(a.batch as usize)?;
    for (_, ids) in &encoded {
        driver.submit(a.decode.request(&drafters, &mut model, (ids, &cfg), None)?);
    }
    let t0 = Instant::now();
    let mut done = driver.run(&mut model)?;
    let wall = t0.elapsed().as_secs_f64();
    done.sort_by_key(|f| f.id);
    let mut texts = Vec::with_capacity(done.len());
    let mut tokens = 0usize;
    for f in done {
        let out = f.output?;
        tokens += out.tokens.len();
        texts.push(tokenizer.decode(&out.tokens)?);
    }
    Ok((texts, tokens, wall))
}

/// [`diffusion_driver`] for an autoregressive folder: one [`SpecDiffBatch`] with the server's
/// drafter, draft-free or SpecDiff-2 requests as `--method` says.
fn autoregressive_driver(
    a: &BenchServeArgs,
    dir: &std::path::Path,
    set: &[Prompt],
) -> Result<(Vec<String>, usize, f64)> {
    if !matches!(a.decode.method, Method::Df | Method::Specdiff) {
        bail!("an autoregressive folder is measured with --method df or --method specdiff");
    }
    let mut model = ar::load_target(dir, a.dtype)?;
    let tokenizer = model
        .tokenizer()
        .cloned()
        .context("bench-serve needs tokenizer.json")?;
    let info = model.ar_info().clone();
    let mut drafter = ar::drafter(a.decode.files.drafter.as_deref(), dir, &mut model)?;
    let encoded = a.chat.encode_all(dir, Some(&tokenizer), set)?;
    let cfg = ar::ar_config(&a.decode, &info);
    let sd = (
        a.specdiff.config(a.decode.seed, drafter.recommended()),
        drafter.vocab_size(),
    );
    let mut batch = SpecDiffBatch::new(a.batch as usize)?;
    for (_, ids) in &encoded {
        let r = ar::request(a.decode.method, ids, (&cfg, &info), sd)
            .context("an autoregressive folder is measured with --method df or specdiff")?;
        batch.submit(r?);
    }
    let t0 = Instant::now();
    let mut done = batch.run(&mut model, drafter.as_mut())?;
    let wall = t0.elapsed().as_secs_f64();
    done.sort_by_key(|f| f.id);
    let mut texts = Vec::with_capacity(done.len());
    let mut tokens = 0usize;
    for f in done {
        let out = f.output?;
        tokens += out.tokens.len();
        texts.push(tokenizer.decode(&out.tokens)?);
    }
    Ok((texts, tokens, wall))
}

fn report(a: &BenchServeArgs, prompts: usize, tokens: usize, rows: &[Row]) -> Result<()> {
    let base = rows[0].tokens_per_s;
    println!(
        "{prompts} prompts from {}, method {}, {} tokens in all, {} responses{}; every \
         response equal to the driver's decode\n",
        a.prompts.display(),
        a.decode.method.name(),
        tokens,
        if a.stream { "streamed" } else { "plain" },
        if a.chat.chat { ", chat" } else { "" },
    );
    println!("| run | wall s | tokens/s | x driver | p50 latency s | p95 latency s |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.2} | {:.1} | {:.3} | {:.3} | {:.3} |",
            r.what,
            r.wall,
            r.tokens_per_s,
            r.tokens_per_s / base,
            r.p50,
            r.p95
        );
    }
    if let Some(path) = &a.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"run": r.what, "wall_s": r.wall, "tokens_per_s": r.tokens_per_s,
                    "x_driver": r.tokens_per_s / base,
                    "p50_s": if r.p50.is_nan() { None } else { Some(r.p50) },
                    "p95_s": if r.p95.is_nan() { None } else { Some(r.p95) }})
            })
            .collect();
        let v = serde_json::json!({"prompts": prompts, "tokens": tokens,
            "method": a.decode.method.name(), "stream": a.stream, "rows": rows});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
