//! Dream (a Qwen2 body with full attention whose logits are shifted: position `i` is predicted
//! at row `i - 1`): one prompt decoded draft-free and with SPOT, at T 0 and 1, checked equal.
//!
//! ```text
//! cargo run --release --example dream                       # the committed tiny fixture
//! cargo run --release --example dream -- path/to/Dream-v0-Instruct-7B "Write a haiku" --chat
//! ```

mod common;

use spot_dlm::{BlockDiffusionModel, DecodeConfig};
use spot_models::{CpuBackend, Dream};

fn main() -> std::process::ExitCode {
    common::main(|| {
        let a = common::Args::parse("dream-tiny", "def f(x):")?;
        let mut model = Dream::<CpuBackend>::load(&a.dir, &Default::default())?;
        let tok = model.tokenizer().cloned().ok_or("no tokenizer.json")?;
        let ids = a.prompt_ids(&tok)?;
        // Dream sees the whole canvas (prompt, generated and masked positions up to the
        // generation end); the model shifts its logits itself, so a decoder sees one row per
        // position like any family.
        let cfg = DecodeConfig {
            max_new_tokens: a.max_new,
            ..DecodeConfig::for_model(model.info())
        };
        println!(
            "Dream: {} parameters, block size {}",
            model.parameter_count(),
            cfg.block_size
        );
        common::draft_free_and_spot(&mut model, (&tok, &ids), &cfg, a.budget)
    })
}
