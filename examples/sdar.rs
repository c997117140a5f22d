//! Decode one prompt with an SDAR model folder, draft-free and speculatively.
//!
//! ```text
//! cargo run --release --example sdar -- MODEL_DIR ["prompt text"] [--budget 8] [--max-new-tokens 64]
//! cargo run --release --example sdar -- crates/spot-models/tests/fixtures/sdar-tiny "def f(x):"
//! ```
//!
//! Prints both texts, their NFE and the reduction, and checks the two outputs are identical.

use std::process::ExitCode;
use std::time::Instant;

use spot::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer,
};
use spot_models::{CpuBackend, Sdar};

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: sdar MODEL_DIR [PROMPT] [--budget D] [--max-new-tokens N]")?;
    let mut prompt = "def fibonacci(n):".to_string();
    let (mut budget, mut max_new) = (8usize, 64usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--budget" => budget = args.next().ok_or("--budget needs a value")?.parse()?,
            "--max-new-tokens" => {
                max_new = args
                    .next()
                    .ok_or("--max-new-tokens needs a value")?
                    .parse()?
            }
            _ => prompt = a,
        }
    }
    let mut model = Sdar::<CpuBackend>::load(dir.as_ref(), &Default::default())?;
    let tok = model
        .tokenizer()
        .cloned()
        .ok_or("the folder has no tokenizer.json")?;
    let ids = tok.encode(&prompt)?;
    let cfg = DecodeConfig {
        block_size: model.config().block_size.unwrap_or(32),
        max_new_tokens: max_new,
        stop_ids: model.info().stop_ids.clone(),
        ..DecodeConfig::default()
    };
    let t = Instant::now();
    let df = DraftFreeDecoder::new().decode(&mut model, &ids, &cfg)?;
    let df_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut spot = SpotDecoder::builder()
        .budget(budget)
        .scorer(StaleConfidenceScorer)
        .build()?;
    let sp = spot.decode(&mut model, &ids, &cfg)?;
    let sp_s = t.elapsed().as_secs_f64();
    println!("prompt: {prompt:?}");
    println!("draft-free:  {:?}", tok.decode(&df.tokens)?);
    println!("speculative: {:?}", tok.decode(&sp.tokens)?);
    println!(
        "NFE {} -> {} ({:.2}x fewer), {:.2} commits per forward, wall {:.3} s -> {:.3} s",
        df.stats.nfe,
        sp.stats.nfe,
        df.stats.nfe as f64 / sp.stats.nfe as f64,
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

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
