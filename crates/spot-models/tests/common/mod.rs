//! Fixture access shared by the model tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use spot_models::{CpuBackend, DiffusionModel, Sdar};

pub const FIXTURES: [&str; 2] = ["sdar-tiny", "sdar-tiny-bf16"];

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn load(name: &str) -> Sdar<CpuBackend> {
    Sdar::<CpuBackend>::load(&fixture(name), &Default::default()).expect("fixture loads")
}

/// The fixtures of the other block-diffusion families (tools/oracle/families_oracle.py).
pub const FAMILY_FIXTURES: [&str; 3] = ["llada-tiny", "dream-tiny", "llada2-moe-tiny"];

pub fn load_any(name: &str) -> DiffusionModel<CpuBackend> {
    DiffusionModel::<CpuBackend>::load(&fixture(name), &Default::default()).expect("fixture loads")
}

#[derive(Deserialize)]
pub struct Golden {
    pub block_size: usize,
    pub mask_id: u32,
    pub vocab_size: usize,
    pub logits_cases: Vec<LogitsCase>,
    pub decode_cases: Vec<DecodeCase>,
}

#[derive(Deserialize)]
pub struct LogitsCase {
    pub key: String,
    pub prefix: Vec<u32>,
    pub states: Vec<Vec<u32>>,
    /// End of the generation region (full-sequence families), else none.
    #[serde(default)]
    pub end: Option<usize>,
}

#[derive(Deserialize)]
pub struct DecodeCase {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub early_stop: bool,
    pub stop_ids: Vec<u32>,
    pub tokens: Vec<u32>,
    pub generated: Vec<u32>,
    pub block_forwards: u64,
    pub stopped: bool,
}

pub fn golden(name: &str) -> Golden {
    let text = std::fs::read_to_string(fixture(name).join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The golden logits of case `key` as f32 values.
pub fn golden_logits(name: &str, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture(name).join("golden.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

pub fn decode_config(g: &Golden, c: &DecodeCase) -> spot::DecodeConfig {
    spot::DecodeConfig {
        block_size: g.block_size,
        max_new_tokens: c.max_new_tokens,
        temperature: 0.0,
        seed: 0,
        stop_ids: c.stop_ids.clone(),
        early_stop: c.early_stop,
        ..spot::DecodeConfig::default()
    }
}
