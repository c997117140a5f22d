//! SDAR (a Qwen3 body with block-causal attention): one prompt decoded draft-free and with
//! SPOT, at T 0 and 1, checked equal.
//!
//! ```text
//! cargo run --release --example sdar                        # the committed tiny fixture
//! cargo run --release --example sdar -- path/to/SDAR-1.7B-Chat "Write a haiku" --chat
//! ```

mod common;

use spot_dlm::{BlockDiffusionModel, DecodeConfig};
use spot_models::{CpuBackend, Sdar};

fn main() -> std::process::ExitCode {
    common::main(|| {
        let a = common::Args::parse("sdar-tiny", "def f(x):")?;
        let mut model = Sdar::<CpuBackend>::load(&a.dir, &Default::default())?;
        let tok = model.tokenizer().cloned().ok_or("no tokenizer.json")?;
        let ids = a.prompt_ids(&tok)?;
        // SDAR decodes block after block behind the prompt, each block attending to itself
        // and the cached blocks before it; `for_model` takes its block size and stop ids.
        let cfg = DecodeConfig {
            max_new_tokens: a.max_new,
            ..DecodeConfig::for_model(model.info())
        };
        println!(
            "SDAR: {} parameters, block size {}",
            model.parameter_count(),
            cfg.block_size
        );
        common::draft_free_and_spot(&mut model, (&tok, &ids), &cfg, a.budget)
    })
}
