//! What the per-family examples share: argument parsing, draft-free vs speculative decoding
//! of one prompt, and the report.
#![allow(dead_code)] // each example uses part of it

use std::process::ExitCode;
use std::time::Instant;

use spot::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer,
};
use spot_models::{CpuBackend, DiffusionModel};

/// Parsed `[MODEL_DIR] [PROMPT] [--budget D] [--max-new-tokens N] [--block-size L] [--chat]`.
pub struct Args {
    pub dir: String,
    pub prompt: String,
    pub budget: usize,
    pub max_new: usize,
    pub block_size: Option<usize>,
    pub chat: bool,
}

/// Reads the command line; `dir` and `prompt` default to the given fixture and text.
pub fn args(dir: &str, prompt: &str) -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        dir: dir.to_string(),
        prompt: prompt.to_string(),
        budget: 8,
        max_new: 64,
        block_size: None,
        chat: false,
    };
    let mut positional = 0;
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match x.as_str() {
            "--budget" => a.budget = value("--budget")?.parse()?,
            "--max-new-tokens" => a.max_new = value("--max-new-tokens")?.parse()?,
            "--block-size" => a.block_size = Some(value("--block-size")?.parse()?),
            "--chat" => a.chat = true,
            _ if positional == 0 => {
                a.dir = x;
                positional += 1;
            }
            _ => a.prompt = x,
        }
    }
    Ok(a)
}

/// The prompt's token ids, wrapped in the folder's chat template with `--chat`.
pub fn prompt_ids(
    a: &Args,
    tok: &spot_models::hf::Tokenizer,
) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = if a.chat {
        let t = spot_models::chat::ChatTemplate::from_dir(a.dir.as_ref())?;
        t.render(&[spot_models::chat::Message::user(a.prompt.clone())], true)?
    } else {
        a.prompt.clone()
    };
    Ok(tok.encode(&text)?)
}

/// Loads any block-diffusion folder, decodes the prompt draft-free and with a SPOT tree
/// (stale-confidence scorer), prints both texts and NFE, and fails if they differ.
pub fn diffusion(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut model = DiffusionModel::<CpuBackend>::load(a.dir.as_ref(), &Default::default())?;
    let tok = model
        .tokenizer()
        .cloned()
        .ok_or("the folder has no tokenizer.json")?;
    let ids = prompt_ids(a, &tok)?;
    let cfg = DecodeConfig {
        block_size: a.block_size.or(model.block_size()).unwrap_or(32),
        max_new_tokens: a.max_new,
        stop_ids: model.info().stop_ids.clone(),
        ..DecodeConfig::default()
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
        "NFE {} -> {} ({:.2}x fewer), {:.2} commits per forward, wall {:.3} s -> {:.3} s",
        df.stats.nfe,
        sp.stats.nfe,
        df.stats.nfe as f64 / sp.stats.nfe.max(1) as f64,
        sp.stats.tokens_per_forward(),
        df_s,
        sp_s
    );
    if sp.tokens != df.tokens {
        return Err("speculative output differs from draft-free output".into());
    }
    println!("outputs identical: yes");
    Ok(())
}

/// Runs `f`, printing an error and failing on `Err`.
pub fn exit(f: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match f() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
