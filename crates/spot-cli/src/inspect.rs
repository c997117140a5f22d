//! `spot inspect`: a model folder's configuration summary.

use std::path::PathBuf;

use anyhow::Result;
use spot_dlm::{AutoregressiveModel, BlockDiffusionModel};
use spot_models::{CausalLm, Family};

use crate::{Backend, load, model_dir};

/// Arguments of `spot inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// Hugging Face model folder (default: the shipped `models/sdar-tiny-code`).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// Prints the summary.
pub fn run(a: &InspectArgs) -> Result<()> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    let dir = dir.as_path();
    if !Family::detect(dir)?.is_diffusion() {
        return autoregressive(dir);
    }
    let model = load(dir)?;
    let info = model.info();
    println!("folder:            {}", dir.display());
    println!("family:            {}", model.family().name());
    println!("vocab:             {}", info.vocab_size);
    println!(
        "block_size:        {}",
        model
            .block_size()
            .map_or("(not set; 32)".to_string(), |b| b.to_string())
    );
    println!("max positions:     {}", info.max_positions);
    println!("mask id:           {}", info.mask_id);
    println!("stop ids:          {:?}", info.stop_ids);
    print_tail(model.tokenizer(), model.parameter_count());
    Ok(())
}

/// The summary of an autoregressive (Llama, Qwen2) folder.
fn autoregressive(dir: &std::path::Path) -> Result<()> {
    let model = CausalLm::<Backend>::load(dir, &Default::default())?;
    let info = model.ar_info();
    println!("folder:            {}", dir.display());
    println!(
        "family:            {} (autoregressive)",
        model.config().model_type
    );
    println!("vocab:             {}", info.vocab_size);
    println!("max positions:     {}", info.max_positions);
    println!("stop ids:          {:?}", info.stop_ids);
    print_tail(model.tokenizer(), model.parameter_count());
    Ok(())
}

/// The lines every family prints last: tokenizer size and parameter count.
fn print_tail(tokenizer: Option<&spot_models::hf::Tokenizer>, parameters: usize) {
    println!(
        "tokenizer:         {}",
        tokenizer.map_or("absent".to_string(), |t| format!(
            "{} tokens",
            t.vocab_size()
        ))
    );
    println!("parameters:        {parameters}");
}
