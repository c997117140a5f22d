//! `spot`: generate text with draft-free or speculative decoding, and inspect model folders.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use spot::{
    BlockDiffusionModel, BlockProgress, DecodeConfig, DecodeOutput, DraftFreeDecoder, SpotDecoder,
    StaleConfidenceScorer, Transition,
};
use spot_models::Sdar;

#[cfg(any(feature = "flex", feature = "ndarray"))]
type Backend = spot_models::CpuBackend;
#[cfg(all(not(feature = "flex"), not(feature = "ndarray"), feature = "cuda"))]
type Backend = spot_models::CudaBackend;
#[cfg(all(
    not(feature = "flex"),
    not(feature = "ndarray"),
    not(feature = "cuda"),
    feature = "wgpu"
))]
type Backend = spot_models::WgpuBackend;

#[derive(Parser)]
#[command(
    name = "spot",
    version,
    about = "Lossless speculative decoding for diffusion language models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode a prompt and print the continuation.
    Generate(GenerateArgs),
    /// Print a model folder's configuration summary and parameter count.
    Inspect {
        /// Hugging Face model folder.
        #[arg(long)]
        model: PathBuf,
    },
    /// Time target forwards (prefix in the KV cache, batches of block states) and report
    /// medians and peak memory as one JSON line.
    BenchForward(BenchArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// Cached prefix length in tokens.
    #[arg(long, default_value_t = 256)]
    prefix: usize,
    /// Block size.
    #[arg(long, default_value_t = 32)]
    block_size: usize,
    /// Batch sizes (block states per forward).
    #[arg(long, value_delimiter = ',', default_value = "1,21")]
    batches: Vec<usize>,
    /// Timed repetitions per batch size (after one warm-up).
    #[arg(long, default_value_t = 10)]
    reps: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Method {
    /// Draft-free exact decoding (one commit per forward): the ground truth.
    Df,
    /// Draft-free threshold decoding (Fast-dLLM); lossy w.r.t. `df`, a decoder of its own.
    Threshold,
    /// Speculative: BlockSpec-style best-first tree ranked by stale confidence.
    Blockspec,
    /// Speculative: SSD-style chain by stale confidence.
    Ssd,
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// Hugging Face model folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (tokenised with the folder's tokenizer.json).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Block size (default: the config's `block_size`, else 32).
    #[arg(long)]
    block_size: Option<usize>,
    /// Sampling temperature (0 = argmax).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Seed of the coupled noise table.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decoding method.
    #[arg(long, value_enum, default_value_t = Method::Blockspec)]
    method: Method,
    /// Threshold for `--method threshold`.
    #[arg(long, default_value_t = 0.9)]
    threshold: f32,
    /// Draft budget D (nodes per round) for speculative methods.
    #[arg(long, default_value_t = 8)]
    budget: usize,
    /// Mass floor γ for speculative methods.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    gamma: f32,
    /// Decode all blocks even after a stop id (fixed-length protocol).
    #[arg(long)]
    no_early_stop: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

fn load(dir: &std::path::Path) -> Result<Sdar<Backend>> {
    let device = Default::default();
    Sdar::<Backend>::load(dir, &device)
        .with_context(|| format!("loading model folder {}", dir.display()))
}

fn inspect(dir: &std::path::Path) -> Result<()> {
    let model = load(dir)?;
    let c = model.config();
    let info = model.info();
    println!("folder:            {}", dir.display());
    println!("model_type:        {}", c.model_type);
    println!("layers:            {}", c.num_hidden_layers);
    println!(
        "hidden / mlp:      {} / {}",
        c.hidden_size, c.intermediate_size
    );
    println!(
        "heads (q / kv):    {} / {} x {}",
        c.num_attention_heads,
        c.kv_heads(),
        c.head_dim()
    );
    println!("vocab:             {}", c.vocab_size);
    println!("rope_theta:        {}", c.rope_theta);
    println!("tied embeddings:   {}", c.tie_word_embeddings);
    println!(
        "block_size:        {}",
        c.block_size
            .map_or("(not set; 32)".to_string(), |b| b.to_string())
    );
    println!("max positions:     {}", info.max_positions);
    println!("mask id:           {}", info.mask_id);
    println!("stop ids:          {:?}", info.stop_ids);
    println!(
        "tokenizer:         {}",
        model.tokenizer().map_or("absent".to_string(), |t| format!(
            "{} tokens",
            t.vocab_size()
        ))
    );
    println!("parameters:        {}", c.parameter_count());
    Ok(())
}

fn generate(a: &GenerateArgs) -> Result<()> {
    let mut model = load(&a.model)?;
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => model
            .tokenizer()
            .context("--prompt needs tokenizer.json in the model folder; use --prompt-ids")?
            .encode(text)?,
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let cfg = DecodeConfig {
        block_size: a.block_size.or(model.config().block_size).unwrap_or(32),
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        seed: a.seed,
        transition: if a.method == Method::Threshold {
            Transition::Threshold { tau: a.threshold }
        } else {
            Transition::Exact
        },
        stop_ids: model.info().stop_ids.clone(),
        early_stop: !a.no_early_stop,
        ..DecodeConfig::default()
    };
    let blocks = prompt
        .len()
        .saturating_add(cfg.max_new_tokens)
        .div_ceil(cfg.block_size.max(1))
        - prompt.len() / cfg.block_size.max(1);
    let bar = if a.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(blocks as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} block {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tokenizer = model.tokenizer().map(|t| (*t).clone());
    let mut streamed = Vec::new();
    let mut printed = 0usize;
    let mut on_block = |p: &BlockProgress<'_>| {
        bar.set_position(p.index as u64 + 1);
        bar.set_message(format!("{} forwards", p.block_forwards));
        if a.json {
            return;
        }
        streamed.extend_from_slice(p.tokens);
        let text = match &tokenizer {
            Some(t) => t.decode(&streamed).unwrap_or_default(),
            None => format!("{:?} ", p.tokens),
        };
        if tokenizer.is_some() {
            if let Some(new) = text.get(printed..) {
                bar.suspend(|| {
                    print!("{new}");
                    let _ = std::io::stdout().flush();
                });
            }
            printed = text.len();
        } else {
            bar.suspend(|| print!("{text}"));
        }
    };
    let start = Instant::now();
    let out: DecodeOutput = match a.method {
        Method::Df | Method::Threshold => {
            DraftFreeDecoder::new().decode_observed(&mut model, &prompt, &cfg, &mut on_block)?
        }
        Method::Blockspec | Method::Ssd => {
            let b = SpotDecoder::builder().budget(a.budget).gamma(a.gamma);
            let b = if a.method == Method::Ssd {
                b.chain()
            } else {
                b.scorer(StaleConfidenceScorer)
            };
            b.build()?
                .decode_observed(&mut model, &prompt, &cfg, &mut on_block)?
        }
    };
    let wall = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let text = match model.tokenizer() {
        Some(t) => t.decode(&out.tokens)?,
        None => String::new(),
    };
    if a.json {
        let s = &out.stats;
        let j = serde_json::json!({
            "method": format!("{:?}", a.method).to_lowercase(),
            "prompt_tokens": prompt.len(),
            "tokens": out.tokens,
            "text": text,
            "stopped": out.stopped,
            "nfe": s.nfe,
            "positions_processed": s.positions_processed,
            "forwards": s.block_forwards,
            "prefix_forwards": s.prefix_forwards,
            "states_scored": s.states_scored,
            "tokens_per_forward": s.tokens_per_forward(),
            "draft_nodes": s.draft_nodes,
            "accepted_nodes": s.accepted_nodes,
            "wall_s": wall,
        });
        println!("{j}");
    } else {
        println!();
        eprintln!(
            "[{} tokens, {} NFE ({} block forwards, {:.2} commits/forward), {:.2} s]",
            out.tokens.len(),
            out.stats.nfe,
            out.stats.block_forwards,
            out.stats.tokens_per_forward(),
            wall
        );
    }
    Ok(())
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

fn bench_forward(a: &BenchArgs) -> Result<()> {
    use spot::{BlockState, StatsQuery};
    let mut model = load(&a.model)?;
    let info = model.info().clone();
    if a.block_size == 0 || !a.prefix.is_multiple_of(a.block_size) {
        bail!("--prefix must be a multiple of --block-size (at least 1)");
    }
    let id = |i: usize| (spot::toy::mix64(i as u64) % (info.vocab_size as u64 - 1)) as u32;
    let id = |i: usize| if id(i) == info.mask_id { 0 } else { id(i) };
    let prefix: Vec<u32> = (0..a.prefix).map(id).collect();
    let t = Instant::now();
    model.reset_prefix(&prefix, a.block_size)?;
    let prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let q = StatsQuery::new(0.0, 0);
    let mut results = serde_json::Map::new();
    for &b in &a.batches {
        let states: Vec<BlockState> = (0..b)
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
            .collect();
        model.forward(&states, &q)?;
        let mut times = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            let t = Instant::now();
            model.forward(&states, &q)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        results.insert(format!("b{b}_median_ms"), median(&mut times).into());
        results.insert(format!("b{b}_min_ms"), min.into());
        // The same forward returning raw logits to the host (what PyTorch's figure measures).
        let mut times = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            let t = Instant::now();
            model.forward_logits(&states)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        results.insert(format!("b{b}_logits_median_ms"), median(&mut times).into());
    }
    let mut j = serde_json::json!({
        "model": a.model.display().to_string(),
        "parameters": model.config().parameter_count(),
        "backend": std::any::type_name::<Backend>(),
        "prefix": a.prefix,
        "block": a.block_size,
        "reps": a.reps,
        "prefill_ms": prefill_ms,
        "peak_rss_mib": peak_rss_mib(),
        "includes": "forward + on-device reduction to statistics (top-32, entropy, chosen token)",
    });
    if let Some(obj) = j.as_object_mut() {
        obj.extend(results);
    }
    println!("{j}");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Generate(a) => generate(a),
        Command::Inspect { model } => inspect(model),
        Command::BenchForward(a) => bench_forward(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
