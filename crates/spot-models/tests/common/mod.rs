//! Fixture access shared by the model tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_dlm::{BlockState, MeteredModel};
use spot_models::{DiffusionModel, Sdar};

pub const FIXTURES: [&str; 2] = ["sdar-tiny", "sdar-tiny-bf16"];

/// Fixture folder `name`: under `SPOT_FIXTURES` when set (a test binary run away from the
/// checkout it was built in, as `tools/gpu/run.sh` does), else under this crate's `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    match std::env::var_os("SPOT_FIXTURES") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    }
}

/// SDAR fixture `name` on backend `B` (its default device).
pub fn load<B: Backend>(name: &str) -> Sdar<B> {
    Sdar::<B>::load(&fixture(name), &Default::default()).expect("fixture loads")
}

/// Every block-diffusion fixture: SDAR (tools/oracle/sdar_oracle.py) and LLaDA, Dream,
/// LLaDA2.0-MoE (tools/oracle/families_oracle.py).
pub const DIFFUSION_FIXTURES: [&str; 5] = [
    "sdar-tiny",
    "sdar-tiny-bf16",
    "llada-tiny",
    "dream-tiny",
    "llada2-moe-tiny",
];

/// Block-diffusion fixture `name` (any family) on backend `B` (its default device).
pub fn load_any<B: Backend>(name: &str) -> DiffusionModel<B> {
    DiffusionModel::<B>::load(&fixture(name), &Default::default()).expect("fixture loads")
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
    golden_logits_in(name, "golden.safetensors", key)
}

/// The logits of case `key` in the fixture file `file` (`golden.safetensors`, or
/// `golden_bf16.safetensors`: transformers in bf16) as f32 values.
pub fn golden_logits_in(name: &str, file: &str, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture(name).join(file)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `m`'s logits for golden case `case` (its prefix, then its states in one forward).
pub fn case_logits<B: Backend>(
    m: &mut DiffusionModel<B>,
    g: &Golden,
    case: &LogitsCase,
) -> Vec<f32> {
    m.prefill(&case.prefix, g.block_size, case.end.unwrap_or(0))
        .unwrap();
    let states: Vec<BlockState> = case
        .states
        .iter()
        .map(|s| BlockState::from_tokens(s.clone(), g.mask_id))
        .collect();
    m.forward_logits(&states).unwrap().into_vec()
}

/// Draft-free decoding at T = 0 of every golden decode case of fixture `name` on `m` returns
/// the oracle's tokens, generated tokens, stop and forwards.
pub fn assert_draft_free_matches_golden<B: Backend>(m: &mut DiffusionModel<B>, name: &str) {
    let g = golden(name);
    for (i, case) in g.decode_cases.iter().enumerate() {
        let out = spot_dlm::DraftFreeDecoder::new()
            .decode(m, &case.prompt, &decode_config(&g, case))
            .unwrap();
        assert_eq!(out.tokens, case.tokens, "{name} case {i}");
        assert_eq!(out.generated, case.generated, "{name} case {i}");
        assert_eq!(out.stopped, case.stopped, "{name} case {i}");
        assert_eq!(
            out.stats.work.block_forwards, case.block_forwards,
            "{name} case {i}"
        );
    }
}

/// Every golden logits case of fixture `name` on `m`: the same shape, and values within 1e-4
/// (max abs) of the transformers oracle in f32 (each case's difference printed).
pub fn assert_logits_match_golden<B: Backend>(m: &mut DiffusionModel<B>, name: &str) {
    use spot_dlm::BlockDiffusionModel;
    let g = golden(name);
    assert_eq!(m.info().mask_id, g.mask_id, "{name}");
    assert_eq!(m.info().vocab_size, g.vocab_size, "{name}");
    for case in &g.logits_cases {
        let ours = case_logits(m, &g, case);
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

pub fn decode_config(g: &Golden, c: &DecodeCase) -> spot_dlm::DecodeConfig {
    spot_dlm::DecodeConfig {
        block_size: g.block_size,
        max_new_tokens: c.max_new_tokens,
        temperature: 0.0,
        seed: 0,
        stop_ids: c.stop_ids.clone(),
        early_stop: c.early_stop,
        ..spot_dlm::DecodeConfig::default()
    }
}

/// A scratch copy of a fixture folder.
pub fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    (tmp, dir)
}

pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Tensors of a safetensors file as (dtype, shape, bytes).
pub fn tensors(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

pub fn write(path: &Path, t: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = t
        .iter()
        .map(|(n, (d, s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// `n` block states of `len` tokens, about a third of them committed, varied by `seed`.
pub fn varied_states(mask: u32, n: usize, len: usize, seed: u64) -> Vec<BlockState> {
    (0..n)
        .map(|i| {
            let tokens = (0..len)
                .map(|s| {
                    let h = spot_dlm::toy::mix64(seed ^ (i * 131 + s) as u64);
                    if h.is_multiple_of(3) {
                        (h >> 8) as u32 % 300
                    } else {
                        mask
                    }
                })
                .collect();
            BlockState::from_tokens(tokens, mask)
        })
        .collect()
}

/// Each state's statistics alone equal its statistics inside `batch`.
pub fn assert_batch_invariant(
    m: &mut dyn spot_dlm::BlockDiffusionModel,
    batch: &[BlockState],
    q: &spot_dlm::StatsQuery,
    what: &str,
) {
    let together = m.score(batch, q).unwrap();
    for (i, s) in batch.iter().enumerate() {
        let alone = m.score(std::slice::from_ref(s), q).unwrap();
        assert_eq!(alone[0], together[i], "{what} state {i}");
    }
}

/// Five requests (prompts of 1 to 30 tokens; draft-free, tree and chain decoders; T 0, 0.7 and
/// 1; exact and threshold decoding; one with top-k truncation) through a `BatchDriver` of 4 in
/// flight on `m`: each output equals the request decoded alone, and the merged forwards are
/// fewer than the requests' forwards together. Returns the requests checked.
pub fn assert_batched_equals_alone(m: &mut dyn spot_dlm::BlockDiffusionModel, what: &str) -> usize {
    use spot_dlm::{
        BatchDriver, DecodeConfig, Request, SpotDecoder, StaleConfidenceScorer, Strategy,
        Transition,
    };
    let stop = m.info().stop_ids.clone();
    let jobs: Vec<(Vec<u32>, DecodeConfig, usize)> = (0..5usize)
        .map(|i| {
            let len = [1usize, 9, 17, 30, 4][i];
            let prompt = (0..len)
                .map(|j| (spot_dlm::toy::mix64((i * 31 + j) as u64) % 360) as u32)
                .collect();
            let cfg = DecodeConfig {
                block_size: 8,
                max_new_tokens: [16, 24, 9, 16, 20][i],
                temperature: [0.0, 1.0, 1.0, 0.0, 0.7][i],
                seed: i as u64,
                stop_ids: stop.clone(),
                early_stop: i % 2 == 0,
                transition: if i == 4 {
                    Transition::Threshold { tau: 0.3 }
                } else {
                    Transition::Exact
                },
                sample_top_k: (i == 1).then_some(4),
                ..DecodeConfig::default()
            };
            (prompt, cfg, i % 3)
        })
        .collect();
    let strategy = |kind: usize| -> Strategy {
        match kind {
            0 => Strategy::draft_free(),
            1 => SpotDecoder::builder()
                .budget(6)
                .scorer(StaleConfidenceScorer)
                .build()
                .unwrap()
                .into(),
            _ => SpotDecoder::builder()
                .budget(3)
                .chain()
                .build()
                .unwrap()
                .into(),
        }
    };
    let info = m.info().clone();
    let alone: Vec<_> = jobs
        .iter()
        .map(|(p, c, k)| {
            let r = Request::new(p, c, &info, strategy(*k)).unwrap();
            spot_dlm::run_request(m, r, &mut ()).unwrap()
        })
        .collect();
    let mut driver = BatchDriver::new(4).unwrap();
    for (p, c, k) in &jobs {
        driver.submit(Request::new(p, c, &info, strategy(*k)).unwrap());
    }
    let done = driver.run(m).unwrap();
    assert_eq!(done.len(), jobs.len(), "{what}");
    for f in done {
        let i = f.id as usize;
        assert_eq!(f.output.unwrap(), alone[i], "{what}: request {i}");
    }
    let total: u64 = alone.iter().map(|o| o.stats.work.block_forwards).sum();
    assert!(
        driver.forwards() < total,
        "{what}: {} vs {total}",
        driver.forwards()
    );
    jobs.len()
}

/// One request's calls on slot 0 of any model, through `MeteredModel` (checked), for tests that
/// interleave them with a family's own methods (`forward_logits`, `set_head_placement`).
pub trait Single: spot_dlm::BlockDiffusionModel {
    /// Makes `prefix` slot `slot`'s prefix, for a decode generating up to `end`.
    fn prefill_in(
        &mut self,
        slot: spot_dlm::CacheSlot,
        prefix: &[u32],
        block_size: usize,
        end: usize,
    ) -> spot_dlm::Result<spot_dlm::PrefixUpdate> {
        let prefix = spot_dlm::Prefix {
            tokens: prefix,
            block_size,
            generation_end: end,
        };
        let mut m = self;
        MeteredModel::new(&mut m).reset_prefix_in(slot, prefix)
    }

    /// [`Single::prefill_in`] for slot 0.
    fn prefill(
        &mut self,
        prefix: &[u32],
        block_size: usize,
        end: usize,
    ) -> spot_dlm::Result<spot_dlm::PrefixUpdate> {
        self.prefill_in(spot_dlm::CacheSlot(0), prefix, block_size, end)
    }

    /// Appends a finished block to slot 0's prefix.
    fn append(&mut self, block: &[u32]) -> spot_dlm::Result<spot_dlm::PrefixUpdate> {
        let mut m = self;
        MeteredModel::new(&mut m).append_block(block)
    }

    /// One forward over `states` after slot 0's prefix.
    fn score(
        &mut self,
        states: &[BlockState],
        q: &spot_dlm::StatsQuery,
    ) -> spot_dlm::Result<Vec<spot_dlm::BlockStats>> {
        let mut m = self;
        MeteredModel::new(&mut m).forward(states, q)
    }

    /// One forward over `states` carrying `carry`.
    fn score_carrying(
        &mut self,
        carry: spot_dlm::Carry<'_>,
        states: &[BlockState],
        q: &spot_dlm::StatsQuery,
    ) -> spot_dlm::Result<spot_dlm::GroupScores> {
        let mut m = self;
        MeteredModel::new(&mut m).forward_carrying(carry, states, q)
    }
}

impl<M: spot_dlm::BlockDiffusionModel + ?Sized> Single for M {}
