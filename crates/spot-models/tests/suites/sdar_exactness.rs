//! Floating-point exactness specific to SDAR: cached vs recomputed prefix, and batch invariance
//! on a larger model (batch invariance and speculative == draft-free on every family's fixture:
//! `families.rs`).

use crate::B;
use crate::common::*;
use spot_dlm::{BlockDiffusionModel, StatsQuery};

/// Statistics with the prefix built block by block (the decoder's cache appends) equal those
/// with the prefix recomputed in one reset.
#[test]
fn cached_prefix_equals_recomputed_prefix() {
    for name in FIXTURES {
        let mut m = load::<B>(name);
        let mask = m.info().mask_id;
        let prefix: Vec<u32> = (0..32u32).map(|i| (i * 13 + 5) % 300).collect();
        let states = varied_states(mask, 5, 8, 3);
        let q = StatsQuery::new(1.0, 5);
        m.prefill(&prefix, 8, prefix.len() + 8).unwrap();
        let recomputed = m.score(&states, &q).unwrap();
        m.prefill(&prefix[..8], 8, prefix.len() + 8).unwrap();
        for block in prefix[8..].chunks(8) {
            m.append(block).unwrap();
        }
        let cached = m.score(&states, &q).unwrap();
        assert_eq!(cached, recomputed, "{name}");
    }
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
    let mut m = spot_models::Sdar::<B>::load(dir.as_ref(), &Default::default()).unwrap();
    let mask = m.info().mask_id;
    let prefix: Vec<u32> = (0..256u32).map(|i| (i * 31 + 7) % 8000).collect();
    m.prefill(&prefix, 32, prefix.len() + 32).unwrap();
    let q = StatsQuery::new(1.0, 3);
    let batch = varied_states(mask, 21, 32, 9);
    let together = m.score(&batch, &q).unwrap();
    for i in [0usize, 7, 20] {
        let alone = m.score(std::slice::from_ref(&batch[i]), &q).unwrap();
        assert_eq!(alone[0], together[i], "state {i}");
    }
}
