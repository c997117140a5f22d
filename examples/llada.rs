//! Decode one prompt with a LLaDA (GSAI-ML/LLaDA-8B-Base, -Instruct) folder, draft-free and speculatively.
//!
//! ```text
//! cargo run --release --example llada -- [MODEL_DIR] ["prompt text"] [--budget 8] [--max-new-tokens 64] [--block-size L] [--chat]
//! cargo run --release --example llada            # the committed fixture llada-tiny
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
                "/crates/spot-models/tests/fixtures/llada-tiny"
            ),
            "def f(x):",
        )?;
        common::diffusion(&a)
    })
}
