//! `spot inspect`: a model folder's configuration summary, from `config.json`,
//! `tokenizer.json` and the safetensors headers (no weight is loaded).

use std::path::PathBuf;

use anyhow::{Context, Result};
use spot_models::FolderSummary;

use crate::model_dir;

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
    let s = FolderSummary::read(&dir)
        .with_context(|| format!("reading model folder {}", dir.display()))?;
    let diffusion = s.family.is_diffusion();
    println!("folder:            {}", dir.display());
    if diffusion {
        println!("family:            {}", s.family.name());
    } else {
        println!("family:            {} (autoregressive)", s.family.name());
    }
    println!("vocab:             {}", s.vocab_size);
    if diffusion {
        println!(
            "block_size:        {}",
            s.block_size
                .map_or("(not set; 32)".to_string(), |b| b.to_string())
        );
    }
    println!("max positions:     {}", s.max_positions);
    if let Some(mask) = s.mask_id {
        println!("mask id:           {mask}");
    }
    println!("stop ids:          {:?}", s.stop_ids);
    println!(
        "tokenizer:         {}",
        s.tokenizer
            .as_ref()
            .map_or("absent".to_string(), |t| format!(
                "{} tokens",
                t.vocab_size()
            ))
    );
    let dtypes: Vec<String> = if s.parameters_by_dtype.len() == 1 {
        s.parameters_by_dtype.keys().cloned().collect()
    } else {
        s.parameters_by_dtype
            .iter()
            .map(|(d, n)| format!("{d} {n}"))
            .collect()
    };
    println!(
        "weights:           {} tensors in {} file{}, {}",
        s.tensors,
        s.files,
        if s.files == 1 { "" } else { "s" },
        dtypes.join(", ")
    );
    println!("parameters:        {}", s.parameters);
    Ok(())
}
