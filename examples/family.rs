//! Decode one prompt with a model folder of any family, draft-free and speculatively.
//!
//! ```text
//! cargo run --release --example family -- [--family sdar|llada|dream|llada2-moe|llama|qwen2 | MODEL_DIR]
//!     ["prompt text"] [--budget 8] [--max-new-tokens 64] [--block-size L] [--chat]
//! cargo run --release --example family -- --family llada2-moe        # the committed fixture
//! cargo run --release --example family -- path/to/LLaDA-8B-Instruct "Write a haiku" --chat
//! cargo run --release --example family -- /tmp/smollm2-hf "What is the capital of France?" --chat
//! ```
//!
//! Block-diffusion folders (SDAR, LLaDA, Dream, LLaDA2.0-MoE): prints the draft-free and the
//! speculative (SPOT tree, stale-confidence scorer) texts, both NFE and the reduction, and fails
//! if the outputs differ. Autoregressive folders (Llama, Qwen2): decodes token by token with
//! the KV cache, prints the text and NFE, checks the cached decode against recomputing the whole
//! sequence per token, then decodes again with SpecDiff-2 (the training-free prompt-lookup
//! drafter) and fails if its tokens differ.

use std::process::ExitCode;
use std::time::Instant;

use spot_dlm::{
    ArConfig, AutoregressiveModel, BlockDiffusionModel, CacheSlot, DecodeConfig, DraftFreeDecoder,
    SpotDecoder, StaleConfidenceScorer, decode_autoregressive,
};
use spot_models::chat::ChatTemplate;
use spot_models::hf::Tokenizer;
use spot_models::{CausalLm, CpuBackend, DiffusionModel, Family};
use spot_specdiff::{LookupDrafter, SpecDiffConfig, SpecDiffDecoder};

type Error = Box<dyn std::error::Error>;

struct Args {
    dir: String,
    prompt: String,
    budget: usize,
    max_new: usize,
    block_size: Option<usize>,
    chat: bool,
}

fn fixture(family: &str) -> Result<String, Error> {
    let name = match family {
        "sdar" => "sdar-tiny",
        "llada" => "llada-tiny",
        "dream" => "dream-tiny",
        "llada2-moe" => "llada2-moe-tiny",
        "llama" => "llama-tiny",
        "qwen2" => "qwen2-tiny",
        other => return Err(format!("unknown family {other:?}").into()),
    };
    Ok(format!(
        "{}/crates/spot-models/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
}

fn args() -> Result<Args, Error> {
    let mut a = Args {
        dir: fixture("sdar")?,
        prompt: "def f(x):".to_string(),
        budget: 8,
        max_new: 64,
        block_size: None,
        chat: false,
    };
    let mut dir_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match x.as_str() {
            "--family" => a.dir = fixture(&value("--family")?)?,
            "--budget" => a.budget = value("--budget")?.parse()?,
            "--max-new-tokens" => a.max_new = value("--max-new-tokens")?.parse()?,
            "--block-size" => a.block_size = Some(value("--block-size")?.parse()?),
            "--chat" => a.chat = true,
            _ if !dir_given && std::path::Path::new(&x).is_dir() => {
                a.dir = x;
                dir_given = true;
            }
            _ => a.prompt = x,
        }
    }
    Ok(a)
}

/// The prompt's token ids, wrapped in the folder's chat template with `--chat`.
fn prompt_ids(a: &Args, tok: &Tokenizer) -> Result<Vec<u32>, Error> {
    let text = if a.chat {
        ChatTemplate::from_dir(a.dir.as_ref())?.prompt(None, &a.prompt)?
    } else {
        a.prompt.clone()
    };
    Ok(tok.encode(&text)?)
}

fn diffusion(a: &Args) -> Result<(), Error> {
    let mut model = DiffusionModel::<CpuBackend>::load(a.dir.as_ref(), &Default::default())?;
    let tok = model
        .tokenizer()
        .cloned()
        .ok_or("the folder has no tokenizer.json")?;
    let ids = prompt_ids(a, &tok)?;
    // The family's own defaults (block size, stop ids, block layout: LLaDA decodes after the
    // prompt), with this run's length and, when given, block size.
    let defaults = DecodeConfig::for_model(model.info());
    let cfg = DecodeConfig {
        block_size: a.block_size.unwrap_or(defaults.block_size),
        max_new_tokens: a.max_new,
        ..defaults
    };
    println!(
        "{}: {} parameters, block size {}",
        model.family().name(),
        model.parameter_count(),
        cfg.block_size
    );
    let t = Instant::now();
    let df = DraftFreeDecoder::new().decode(&mut model, &ids, &cfg)?;
    let df_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut spot = SpotDecoder::builder()
        .budget(a.budget)
        .scorer(StaleConfidenceScorer)
        .build()?;
    let sp = spot.decode(&mut model, &ids, &cfg)?;
    let sp_s = t.elapsed().as_secs_f64();
    println!("prompt: {:?}", a.prompt);
    println!("draft-free:  {:?}", tok.decode(&df.tokens)?);
    println!("speculative: {:?}", tok.decode(&sp.tokens)?);
    println!(
        "NFE {} -> {} ({:.2}x fewer), {:.2} commits per forward, wall {df_s:.3} s -> {sp_s:.3} s",
        df.stats.work.nfe,
        sp.stats.work.nfe,
        df.stats.work.nfe as f64 / sp.stats.work.nfe.max(1) as f64,
        sp.stats.tokens_per_forward(),
    );
    if sp.tokens != df.tokens {
        return Err("speculative output differs from draft-free output".into());
    }
    println!("outputs identical: yes");
    Ok(())
}

fn autoregressive(a: &Args) -> Result<(), Error> {
    let mut model = CausalLm::<CpuBackend>::load(a.dir.as_ref(), &Default::default())?;
    let tok = model
        .tokenizer()
        .cloned()
        .ok_or("the folder has no tokenizer.json")?;
    let ids = prompt_ids(a, &tok)?;
    let cfg = ArConfig {
        max_new_tokens: a.max_new,
        stop_ids: model.ar_info().stop_ids.clone(),
        ..ArConfig::default()
    };
    println!(
        "{}: {} parameters",
        model.config().model_type,
        model.parameter_count()
    );
    let t = Instant::now();
    let out = decode_autoregressive(&mut model, &ids, &cfg)?;
    let wall = t.elapsed().as_secs_f64();
    println!("prompt: {:?}", a.prompt);
    println!("greedy: {:?}", tok.decode(&out.tokens)?);
    println!(
        "NFE {} for {} tokens, wall {wall:.3} s",
        out.forwards,
        out.tokens.len()
    );
    // The same decode without the cache: the whole sequence per token.
    let v = model.ar_info().vocab_size;
    let mut seq = ids.clone();
    for _ in 0..out.tokens.len() {
        model.truncate(CacheSlot(0), 0)?;
        let logits = model.extend_logits(&seq)?;
        let last = &logits[logits.len() - v..];
        let next = (0..v).max_by(|&x, &y| last[x].total_cmp(&last[y]).then(y.cmp(&x)));
        seq.push(next.unwrap_or(0) as u32);
    }
    if seq[ids.len()..] != out.tokens[..] {
        return Err("cached and recomputed greedy decodes differ".into());
    }
    println!("cached == recomputed: yes");
    // SpecDiff-2 with the training-free prompt-lookup drafter: the greedy tokens, fewer forwards.
    let mut drafter = LookupDrafter::new(v, 3, 2);
    let t = Instant::now();
    let sd = SpecDiffDecoder::new(SpecDiffConfig::default())?.decode(
        &mut model,
        &mut drafter,
        &ids,
        &cfg,
    )?;
    println!(
        "SpecDiff-2 (prompt lookup): NFE {} -> {}, wall {:.3} s",
        out.forwards,
        sd.forwards,
        t.elapsed().as_secs_f64()
    );
    if sd.tokens != out.tokens {
        return Err("SpecDiff-2 output differs from the greedy decode".into());
    }
    println!("SpecDiff-2 == greedy: yes");
    Ok(())
}

fn main() -> ExitCode {
    let run = || -> Result<(), Error> {
        let a = args()?;
        if Family::detect(a.dir.as_ref())?.is_diffusion() {
            diffusion(&a)
        } else {
            autoregressive(&a)
        }
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
