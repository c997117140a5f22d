//! Floating-point exactness of the SDAR implementation: batch invariance, cached vs recomputed
//! prefix, and speculative == draft-free on the fixture model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use spot::{
    BlockDiffusionModel, BlockState, DecodeConfig, DraftFreeDecoder, SpotDecoder,
    StaleConfidenceScorer, StatsQuery,
};

fn varied_states(mask: u32, n: usize, len: usize, seed: u64) -> Vec<BlockState> {
    (0..n)
        .map(|i| {
            let tokens = (0..len)
                .map(|s| {
                    let h = spot::toy::mix64(seed ^ (i * 131 + s) as u64);
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

/// A state's statistics are bit-identical alone and inside a batch of 21 states, at T = 0 and
/// T = 1, with and without a cached prefix (prefix 16 once broke this when the states were
/// folded into one matrix product over the prefix).
#[test]
fn statistics_are_batch_invariant() {
    for name in FIXTURES {
        let mut m = load(name);
        let mask = m.info().mask_id;
        for prefix_len in [0usize, 8, 16, 24] {
            let prefix: Vec<u32> = (0..prefix_len as u32).map(|i| (i * 7) % 300).collect();
            m.reset_prefix(&prefix, 8).unwrap();
            for t in [0.0f32, 1.0] {
                let q = StatsQuery::new(t, 11);
                let batch = varied_states(mask, 21, 8, prefix_len as u64);
                let together = m.forward(&batch, &q).unwrap();
                for (i, s) in batch.iter().enumerate() {
                    let alone = m.forward(std::slice::from_ref(s), &q).unwrap();
                    assert_eq!(
                        alone[0], together[i],
                        "{name} prefix {prefix_len} T {t} state {i}"
                    );
                }
            }
        }
    }
}

/// Statistics with the prefix built block by block (the decoder's cache appends) equal those
/// with the prefix recomputed in one reset.
#[test]
fn cached_prefix_equals_recomputed_prefix() {
    for name in FIXTURES {
        let mut m = load(name);
        let mask = m.info().mask_id;
        let prefix: Vec<u32> = (0..32u32).map(|i| (i * 13 + 5) % 300).collect();
        let states = varied_states(mask, 5, 8, 3);
        let q = StatsQuery::new(1.0, 5);
        m.reset_prefix(&prefix, 8).unwrap();
        let recomputed = m.forward(&states, &q).unwrap();
        m.reset_prefix(&prefix[..8], 8).unwrap();
        for block in prefix[8..].chunks(8) {
            m.append_block(block).unwrap();
        }
        let cached = m.forward(&states, &q).unwrap();
        assert_eq!(cached, recomputed, "{name}");
    }
}

/// Speculative decoding returns exactly the draft-free tokens on the fixture model, at T = 0
/// and T = 1, over many prompts, seeds and budgets.
#[test]
fn speculative_equals_draft_free_on_sdar() {
    let mut cases = 0;
    for name in FIXTURES {
        let mut m = load(name);
        let stop = m.info().stop_ids.clone();
        for i in 0..12u64 {
            let len = 1 + (i as usize * 5) % 19;
            let prompt: Vec<u32> = (0..len)
                .map(|j| (spot::toy::mix64(i * 97 + j as u64) % 360) as u32)
                .collect();
            for t in [0.0f32, 1.0] {
                let cfg = DecodeConfig {
                    block_size: 8,
                    max_new_tokens: 24,
                    temperature: t,
                    seed: i,
                    stop_ids: stop.clone(),
                    early_stop: i % 2 == 0,
                    ..DecodeConfig::default()
                };
                let reference = DraftFreeDecoder::new()
                    .decode(&mut m, &prompt, &cfg)
                    .unwrap();
                let budget = [1usize, 4, 8, 20][i as usize % 4];
                let tree = SpotDecoder::builder()
                    .budget(budget)
                    .scorer(StaleConfidenceScorer)
                    .build()
                    .unwrap();
                let chain = SpotDecoder::builder()
                    .budget(budget)
                    .chain()
                    .build()
                    .unwrap();
                for mut d in [tree, chain] {
                    let out = d.decode(&mut m, &prompt, &cfg).unwrap();
                    assert_eq!(out.tokens, reference.tokens, "{name} prompt {i} T {t}");
                    assert_eq!(
                        out.generated, reference.generated,
                        "{name} prompt {i} T {t}"
                    );
                    assert!(out.stats.nfe <= reference.stats.nfe);
                    cases += 1;
                }
            }
        }
    }
    eprintln!("{cases} speculative decodes equal to draft-free");
}

/// Batch invariance on a larger model (the ~30M-parameter benchmark folder made by
/// `tools/oracle/bench_torch.py make-bench-model`), where matrix kernels may pick other code
/// paths than on the tiny fixtures. Runs when `SPOT_BENCH_MODEL` names the folder.
#[test]
fn statistics_are_batch_invariant_on_a_larger_model() {
    let Some(dir) = std::env::var_os("SPOT_BENCH_MODEL") else {
        eprintln!("SPOT_BENCH_MODEL not set: skipped");
        return;
    };
    let mut m =
        spot_models::Sdar::<spot_models::CpuBackend>::load(dir.as_ref(), &Default::default())
            .unwrap();
    let mask = m.info().mask_id;
    let prefix: Vec<u32> = (0..256u32).map(|i| (i * 31 + 7) % 8000).collect();
    m.reset_prefix(&prefix, 32).unwrap();
    let q = StatsQuery::new(1.0, 3);
    let batch = varied_states(mask, 21, 32, 9);
    let together = m.forward(&batch, &q).unwrap();
    for i in [0usize, 7, 20] {
        let alone = m.forward(std::slice::from_ref(&batch[i]), &q).unwrap();
        assert_eq!(alone[0], together[i], "state {i}");
    }
}
