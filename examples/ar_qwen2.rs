//! Decode one prompt with an autoregressive Qwen2 or Llama folder (e.g. SmolLM2-135M-Instruct
//! converted by `tools/setup_smollm2.sh`), token by token with the KV cache.
//!
//! ```text
//! cargo run --release --example ar_qwen2 -- [MODEL_DIR] ["prompt text"] [--max-new-tokens 64] [--chat]
//! cargo run --release --example ar_qwen2             # the committed fixture qwen2-tiny
//! cargo run --release --example ar_qwen2 -- /tmp/smollm2-hf "What is the capital of France?" --chat
//! ```
//!
//! Prints the text, the NFE (one forward per token; speculative decoding of autoregressive
//! targets is SpecDiff-2, not implemented yet) and checks that greedy decoding through the
//! cache equals greedy decoding with the whole sequence recomputed per token.

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use spot::{ArConfig, AutoregressiveModel, decode_autoregressive};
use spot_models::{CausalLm, CpuBackend};

fn main() -> std::process::ExitCode {
    common::exit(|| {
        let a = common::args(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/crates/spot-models/tests/fixtures/qwen2-tiny"
            ),
            "def f(x):",
        )?;
        let mut model = CausalLm::<CpuBackend>::load(a.dir.as_ref(), &Default::default())?;
        let tok = model
            .tokenizer()
            .cloned()
            .ok_or("the folder has no tokenizer.json")?;
        let ids = common::prompt_ids(&a, &tok)?;
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
        let mut seq = ids.clone();
        for _ in 0..out.tokens.len() {
            model.truncate(0)?;
            let logits = model.extend_logits(&seq)?;
            let v = model.ar_info().vocab_size;
            let last = &logits[logits.len() - v..];
            let next = (0..v)
                .max_by(|&x, &y| last[x].total_cmp(&last[y]).then(y.cmp(&x)))
                .unwrap_or(0);
            seq.push(next as u32);
        }
        if seq[ids.len()..] != out.tokens[..] {
            return Err("cached and recomputed greedy decodes differ".into());
        }
        println!("cached == recomputed: yes");
        Ok(())
    })
}
