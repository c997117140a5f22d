//! Decode one prompt with a Dream (Dream-org/Dream-v0-Instruct-7B) folder, draft-free and speculatively.
//!
//! ```text
//! cargo run --release --example dream -- [MODEL_DIR] ["prompt text"] [--budget 8] [--max-new-tokens 64] [--block-size L] [--chat]
//! cargo run --release --example dream            # the committed fixture dream-tiny
//! ```
//!
//! Prints both texts, their NFE and the reduction, and fails if the outputs differ.

#[path = "common/mod.rs"]
mod common;

fn main() -> std::process::ExitCode {
    common::exit(|| {
        let a = common::args(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/crates/spot-models/tests/fixtures/dream-tiny"
            ),
            "def f(x):",
        )?;
        common::diffusion(&a)
    })
}
