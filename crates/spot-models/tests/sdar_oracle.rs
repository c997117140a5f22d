//! SDAR in burn against the transformers oracle (fixtures made by tools/oracle/sdar_oracle.py).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use spot::{BlockDiffusionModel, BlockState, DraftFreeDecoder};

/// Logits of every golden case within 1e-4 (max abs) of `Qwen3ForCausalLM` in f32, with the
/// prefix read from our KV cache.
#[test]
fn logits_match_transformers() {
    for name in FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        assert_eq!(m.info().mask_id, g.mask_id);
        assert_eq!(m.info().vocab_size, g.vocab_size);
        for case in &g.logits_cases {
            m.reset_prefix(&case.prefix, g.block_size).unwrap();
            let states: Vec<BlockState> = case
                .states
                .iter()
                .map(|s| BlockState::from_tokens(s.clone(), g.mask_id))
                .collect();
            let ours = m.forward_logits(&states).unwrap();
            let want = golden_logits(name, &case.key);
            assert_eq!(ours.len(), want.len(), "{name} {}", case.key);
            let diff = ours
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            eprintln!("{name} {}: max |diff| = {diff:e}", case.key);
            assert!(diff <= 1e-4, "{name} {}: max abs diff {diff}", case.key);
        }
    }
}

/// Draft-free decoding at T = 0 returns exactly the oracle's tokens.
#[test]
fn draft_free_tokens_match_transformers() {
    for name in FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        for (i, case) in g.decode_cases.iter().enumerate() {
            let cfg = decode_config(&g, case);
            let out = DraftFreeDecoder::new()
                .decode(&mut m, &case.prompt, &cfg)
                .unwrap();
            assert_eq!(out.tokens, case.tokens, "{name} case {i}");
            assert_eq!(out.generated, case.generated, "{name} case {i}");
            assert_eq!(out.stopped, case.stopped, "{name} case {i}");
            assert_eq!(
                out.stats.block_forwards, case.block_forwards,
                "{name} case {i}"
            );
        }
    }
}
