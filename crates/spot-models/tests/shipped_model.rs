//! The shipped benchmark target `models/sdar-tiny-code` against the transformers oracle.
//!
//! `tests/fixtures/sdar-tiny-code-oracle.json` holds draft-free T = 0 decodes of the first
//! HumanEval prompts made by `tools/oracle/sdar_oracle.py golden-decodes` (transformers
//! `Qwen3ForCausalLM`, f32, eager, no KV cache). If the shipped weights are re-exported the file
//! must be regenerated (see tools/oracle/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use spot_dlm::{DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer};
use spot_models::{CpuBackend, Sdar};

#[derive(Deserialize)]
struct Golden {
    block_size: usize,
    stop_ids: Vec<u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    id: String,
    prompt_text: String,
    prompt: Vec<u32>,
    max_new_tokens: usize,
    early_stop: bool,
    tokens: Vec<u32>,
    block_forwards: u64,
    stopped: bool,
}

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code")
}

fn golden() -> Golden {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdar-tiny-code-oracle.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn load() -> Sdar<CpuBackend> {
    Sdar::<CpuBackend>::load(&model_dir(), &Default::default()).expect("shipped model loads")
}

fn config(g: &Golden, c: &Case, temperature: f32) -> DecodeConfig {
    DecodeConfig {
        block_size: g.block_size,
        max_new_tokens: c.max_new_tokens,
        temperature,
        seed: 11,
        stop_ids: g.stop_ids.clone(),
        early_stop: c.early_stop,
        ..DecodeConfig::default()
    }
}

/// Our tokenizer and our draft-free decoder reproduce the oracle on every golden prompt
/// (at least 20): same prompt ids, same tokens, same stop, same number of block forwards.
#[test]
fn draft_free_decodes_match_transformers() {
    let g = golden();
    assert!(g.cases.len() >= 20, "only {} golden cases", g.cases.len());
    let mut m = load();
    assert_eq!(m.config().block_size, Some(g.block_size));
    let tok = m.tokenizer().unwrap().clone();
    for c in &g.cases {
        assert_eq!(tok.encode(&c.prompt_text).unwrap(), c.prompt, "{}", c.id);
        let out = DraftFreeDecoder::new()
            .decode(&mut m, &c.prompt, &config(&g, c, 0.0))
            .unwrap();
        assert_eq!(out.tokens, c.tokens, "{}", c.id);
        assert_eq!(out.stopped, c.stopped, "{}", c.id);
        assert_eq!(out.stats.work.block_forwards, c.block_forwards, "{}", c.id);
    }
}

/// Speculative decoding (stale-confidence tree at D = 8 and 20, SSD chain) returns the
/// draft-free output of the shipped model at T = 0 and T = 1 (4 prompts), with no more target
/// forwards.
#[test]
fn speculative_equals_draft_free_on_the_shipped_model() {
    let g = golden();
    let mut m = load();
    for (i, c) in g.cases.iter().take(4).enumerate() {
        let t = if i % 2 == 0 { 0.0 } else { 1.0 };
        let cfg = config(&g, c, t);
        let df = DraftFreeDecoder::new()
            .decode(&mut m, &c.prompt, &cfg)
            .unwrap();
        for (name, dec) in [
            (
                "tree D8",
                SpotDecoder::builder()
                    .budget(8)
                    .scorer(StaleConfidenceScorer),
            ),
            (
                "tree D20",
                SpotDecoder::builder()
                    .budget(20)
                    .scorer(StaleConfidenceScorer),
            ),
            ("chain D8", SpotDecoder::builder().budget(8).chain()),
        ] {
            let out = dec
                .build()
                .unwrap()
                .decode(&mut m, &c.prompt, &cfg)
                .unwrap();
            assert_eq!(out.tokens, df.tokens, "{} {name} T={t}", c.id);
            assert_eq!(out.stopped, df.stopped, "{} {name} T={t}", c.id);
            assert!(
                out.stats.work.nfe <= df.stats.work.nfe,
                "{} {name} T={t}",
                c.id
            );
        }
    }
}
