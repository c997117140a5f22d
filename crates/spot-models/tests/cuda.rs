//! The engine on a CUDA GPU (`--features cuda`), in f32 and bf16: batch invariance of the
//! statistics with the output layer on the device and on the host, speculative ==
//! draft-free, and several requests in one forward equal to each alone, on the SDAR and
//! LLaDA2.0-MoE fixtures. Where no CUDA driver can be loaded every test prints a skip line and
//! returns (CI compiles this file; `tools/gpu/run.sh` runs it on a GPU machine).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Single, assert_batch_invariant, assert_batched_equals_alone, fixture, varied_states};
use spot_dlm::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer,
    StatsQuery,
};
use spot_models::{CudaBackend, DiffusionModel, HeadPlacement, Precision};

/// The model on the default CUDA device in `precision`, or `None` (with a skip line) when
/// CUDA cannot start.
fn load(name: &str, test: &str, precision: Precision) -> Option<DiffusionModel<CudaBackend>> {
    let device = Default::default();
    let probe = std::panic::catch_unwind(|| {
        burn_tensor::Tensor::<CudaBackend, 1>::zeros([1], &device).into_data()
    });
    if let Err(e) = probe {
        let why = e
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| e.downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        eprintln!("SKIPPED {test}: no CUDA device ({why})");
        return None;
    }
    let m = DiffusionModel::load_as(&fixture(name), &device, precision).expect("fixture loads");
    assert_eq!(m.precision(), precision);
    Some(m)
}

const FIXTURES: [&str; 2] = ["sdar-tiny", "llada2-moe-tiny"];

/// Every fixture in every precision the tests cover.
fn cases() -> impl Iterator<Item = (&'static str, Precision)> {
    FIXTURES
        .into_iter()
        .flat_map(|n| [(n, Precision::F32), (n, Precision::Bf16)])
}

/// A state's statistics are bit-identical alone and inside batches of 2, 3, 8, 21 and 33 states
/// (at every row position of the batch), after prefixes of 0 to 8 blocks of 8 and 0 to 4 blocks
/// of 32, at T = 0 and 1, with the output layer on the device and on the host, in f32 and bf16.
#[test]
fn cuda_statistics_are_batch_invariant() {
    for (name, precision) in cases() {
        let Some(mut m) = load(name, "cuda_statistics_are_batch_invariant", precision) else {
            return;
        };
        let mask = m.info().mask_id;
        for head in [HeadPlacement::Device, HeadPlacement::Host] {
            m.set_head_placement(head);
            for (bs, blocks) in [(8usize, 0usize), (8, 1), (8, 2), (8, 4), (8, 8)]
                .into_iter()
                .chain([(32, 0), (32, 1), (32, 2), (32, 4)])
            {
                let prefix: Vec<u32> = (0..(blocks * bs) as u32).map(|i| (i * 7) % 300).collect();
                m.prefill(&prefix, bs, prefix.len() + bs).unwrap();
                for t in [0.0f32, 1.0] {
                    let q = StatsQuery::new(t, 11);
                    for n in [2usize, 3, 8, 21, 33] {
                        let batch = varied_states(mask, n, bs, (blocks * 100 + n) as u64);
                        let what = format!(
                            "{name} {precision} {head:?} block {bs} prefix {blocks} blocks T {t} \
                             batch {n}"
                        );
                        assert_batch_invariant(&mut m, &batch, &q, &what);
                    }
                }
            }
        }
    }
}

/// Speculative decoding returns the draft-free tokens on the GPU (the tree decoder, budgets 8
/// and 20, T = 0 and 1, f32 and bf16).
#[test]
fn cuda_speculative_equals_draft_free() {
    for (name, precision) in cases() {
        let Some(mut m) = load(name, "cuda_speculative_equals_draft_free", precision) else {
            return;
        };
        for i in 0..4u64 {
            let prompt: Vec<u32> = (0..5 + i as u32 * 3).map(|j| (j * 37 + 11) % 300).collect();
            for t in [0.0f32, 1.0] {
                let cfg = DecodeConfig {
                    block_size: 8,
                    max_new_tokens: 24,
                    temperature: t,
                    seed: i,
                    stop_ids: m.info().stop_ids.clone(),
                    ..DecodeConfig::default()
                };
                let reference = DraftFreeDecoder::new()
                    .decode(&mut m, &prompt, &cfg)
                    .unwrap();
                for budget in [8usize, 20] {
                    let mut tree = SpotDecoder::builder()
                        .budget(budget)
                        .scorer(StaleConfidenceScorer)
                        .build()
                        .unwrap();
                    let out = tree.decode(&mut m, &prompt, &cfg).unwrap();
                    assert_eq!(
                        out.tokens, reference.tokens,
                        "{name} {precision} prompt {i} T {t} D {budget}"
                    );
                }
            }
        }
    }
}

/// Several requests in one forward (ragged prefixes, mixed decoders, temperatures and
/// transitions) return what each returns alone, on the GPU, head on the device and on the
/// host, in f32 and bf16.
#[test]
fn cuda_batched_requests_equal_alone() {
    for (name, precision) in cases() {
        let Some(mut m) = load(name, "cuda_batched_requests_equal_alone", precision) else {
            return;
        };
        for head in [HeadPlacement::Device, HeadPlacement::Host] {
            m.set_head_placement(head);
            assert_batched_equals_alone(&mut m, &format!("{name} {precision} {head:?}"));
        }
    }
}
