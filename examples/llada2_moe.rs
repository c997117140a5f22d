//! LLaDA2.0 (a mixture-of-experts body with block-causal attention, as LLaDA2.0-mini): one
//! prompt decoded draft-free and with SPOT, at T 0 and 1, checked equal.
//!
//! ```text
//! cargo run --release --example llada2_moe                  # the committed tiny fixture
//! cargo run --release --example llada2_moe -- path/to/LLaDA2.0-mini "Write a haiku" --chat
//! ```

mod common;

use spot_dlm::{BlockDiffusionModel, DecodeConfig};
use spot_models::{CpuBackend, Llada2Moe};

fn main() -> std::process::ExitCode {
    common::main(|| {
        let a = common::Args::parse("llada2-moe-tiny", "def f(x):")?;
        let mut model = Llada2Moe::<CpuBackend>::load(&a.dir, &Default::default())?;
        let tok = model.tokenizer().cloned().ok_or("no tokenizer.json")?;
        let ids = a.prompt_ids(&tok)?;
        // Each token is routed to its top experts; the routing is per row, so a state's
        // statistics do not depend on the other states in a forward (the verifier's need).
        let cfg = DecodeConfig {
            max_new_tokens: a.max_new,
            ..DecodeConfig::for_model(model.info())
        };
        println!(
            "LLaDA2.0-MoE: {} parameters, block size {}",
            model.parameter_count(),
            cfg.block_size
        );
        common::draft_free_and_spot(&mut model, (&tok, &ids), &cfg, a.budget)
    })
}
