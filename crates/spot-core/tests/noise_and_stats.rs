//! Properties of the coupled noise table and of the reference logit reduction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use spot_core::stats::{ReduceScratch, reduce_logits};
use spot_core::toy::{ToyConfig, ToyModel};
use spot_core::{BlockState, BlockStats, ConfidenceRule, GumbelNoise, MeteredModel, StatsQuery};

fn cases() -> u32 {
    std::env::var("SPOT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn reduce(logits: &[f32], pos: usize, q: &StatsQuery, mask: u32) -> BlockStats {
    let mut out = BlockStats::new(q.effective_top_k(logits.len()));
    reduce_logits(
        logits,
        pos,
        q,
        mask,
        &mut ReduceScratch::default(),
        &mut out,
    )
    .unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// `G[a, v]` depends only on (seed, a, v): evaluating entries one by one in a shuffled
    /// order, or a row at a time, gives the same bits.
    #[test]
    fn noise_is_independent_of_evaluation_order(seed in any::<u64>(),
                                                 cells in prop::collection::vec((any::<u64>(), 0u32..200_000), 1..40),
                                                 shuffle in any::<u64>()) {
        let g = GumbelNoise::new(seed);
        let forward: Vec<u32> = cells.iter().map(|&(a, v)| g.value(a, v).to_bits()).collect();
        let mut order: Vec<usize> = (0..cells.len()).collect();
        order.sort_by_key(|&i| spot_core::toy::mix64(shuffle ^ i as u64));
        for &i in &order {
            let (a, v) = cells[i];
            prop_assert_eq!(GumbelNoise::new(seed).value(a, v).to_bits(), forward[i]);
        }
        let (a, v) = cells[0];
        let mut row = vec![0.0f32; v as usize + 3];
        g.fill_row(a, &mut row);
        prop_assert_eq!(row[v as usize].to_bits(), forward[0]);
    }

    /// The reduction: the chosen token is the (noised) argmax, never the mask, ties go to the
    /// lower id, top-k is sorted and sums with the tail to one.
    #[test]
    fn reduction_is_consistent(logits in prop::collection::vec(prop_oneof![-8.0f32..8.0, Just(1.0f32)], 2..60),
                               t in prop_oneof![Just(0.0f32), Just(0.5), Just(1.0), Just(2.0)],
                               seed in any::<u64>(), pos in 0usize..10_000, k in 1usize..40) {
        let mask = (logits.len() - 1) as u32;
        let q = StatsQuery { top_k: k, ..StatsQuery::new(t, seed) };
        let st = reduce(&logits, pos, &q, mask);
        let chosen = st.token(0);
        prop_assert!(chosen != mask);
        let score = |v: usize| if t > 0.0 { logits[v] / t + q.noise.value(pos as u64, v as u32) } else { logits[v] };
        for v in 0..logits.len() - 1 {
            let (sv, sc) = (score(v), score(chosen as usize));
            prop_assert!(sv < sc || (sv == sc && v >= chosen as usize), "v {} beats chosen {}", v, chosen);
        }
        let (ids, probs) = st.top(0);
        prop_assert!(!ids.contains(&mask));
        prop_assert!(probs.windows(2).all(|w| w[0] >= w[1]));
        let total: f32 = probs.iter().sum::<f32>() + st.tail_mass(0);
        prop_assert!((total - 1.0).abs() < 1e-4, "total {}", total);
        prop_assert!(st.confidence(0) == st.token_prob(0));
        if t == 0.0 {
            prop_assert_eq!(ids[0], chosen);
        }
    }

    /// A toy state's statistics are bit-identical alone and inside a batch of 21 states.
    #[test]
    fn toy_forward_is_batch_invariant(seed in any::<u64>(), others in prop::collection::vec(prop::collection::vec(0u32..48, 8), 20),
                                      t in prop_oneof![Just(0.0f32), Just(1.0)]) {
        let mut toy = ToyModel::new(ToyConfig { seed, ..ToyConfig::default() });
        let mut m = MeteredModel::new(&mut toy);
        m.reset_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], 8, 16).unwrap();
        let q = StatsQuery::new(t, seed);
        let me = BlockState::masked(8, 47);
        let alone = m.forward(std::slice::from_ref(&me), &q).unwrap();
        let mut batch: Vec<BlockState> = others.into_iter().map(|t| BlockState::from_tokens(t, 47)).collect();
        batch.insert(7, me);
        let together = m.forward(&batch, &q).unwrap();
        prop_assert_eq!(&alone[0], &together[7]);
    }
}

#[test]
fn confidence_rules() {
    // ids: 0..4, mask = 4 (huge logit, must be ignored).
    let logits = [2.0f32, 1.0, 1.0, 0.0, 50.0];
    let p: Vec<f64> = {
        let z: f64 = logits[..4].iter().map(|&l| f64::from(l).exp()).sum();
        logits[..4]
            .iter()
            .map(|&l| f64::from(l).exp() / z)
            .collect()
    };
    let entropy: f64 = p.iter().map(|&x| -x * x.ln()).sum();
    let q = |rule| StatsQuery {
        rule,
        top_k: 3,
        ..StatsQuery::new(0.0, 0)
    };
    let st = reduce(&logits, 0, &q(ConfidenceRule::Probability), 4);
    assert_eq!(st.token(0), 0);
    assert!((f64::from(st.confidence(0)) - p[0]).abs() < 1e-6);
    // Ties between tokens 1 and 2 go to the lower id in the top-k.
    assert_eq!(st.top(0).0, &[0, 1, 2]);
    let st = reduce(&logits, 0, &q(ConfidenceRule::Margin), 4);
    assert!((f64::from(st.confidence(0)) - (p[0] - p[1])).abs() < 1e-6);
    let st = reduce(&logits, 0, &q(ConfidenceRule::NegativeEntropy), 4);
    assert!((f64::from(st.confidence(0)) + entropy).abs() < 1e-5);
    assert!((f64::from(st.entropy(0)) - entropy).abs() < 1e-5);
    // Raw probability at T = 2 is the un-tempered probability of the chosen token.
    let hot = StatsQuery {
        rule: ConfidenceRule::RawProbability,
        top_k: 3,
        ..StatsQuery::new(2.0, 9)
    };
    let st = reduce(&logits, 5, &hot, 4);
    assert!((f64::from(st.confidence(0)) - p[st.token(0) as usize]).abs() < 1e-6);
    assert!(st.token_prob(0) != st.confidence(0) || st.token(0) == 3);
}

#[test]
fn sampling_follows_the_tempered_distribution() {
    // Gumbel-max over many positions reproduces softmax(logit / T).
    let logits = [1.0f32, 0.0, -1.0, 0.5, 9.0];
    let t = 1.5f32;
    let q = StatsQuery {
        top_k: 1,
        ..StatsQuery::new(t, 123)
    };
    let mut counts = [0u32; 4];
    let n = 40_000;
    for pos in 0..n {
        counts[reduce(&logits, pos, &q, 4).token(0) as usize] += 1;
    }
    let z: f64 = logits[..4]
        .iter()
        .map(|&l| (f64::from(l) / f64::from(t)).exp())
        .sum();
    for v in 0..4 {
        let want = (f64::from(logits[v]) / f64::from(t)).exp() / z;
        let got = f64::from(counts[v]) / n as f64;
        assert!((got - want).abs() < 0.01, "token {v}: {got} vs {want}");
    }
}

/// Top-k truncation: the chosen token is always one of the `k` largest logits, and it is drawn
/// from their renormalised tempered softmax; probability, entropy and the top list are those of
/// the truncated distribution, padded with the top-1 id at probability 0.
#[test]
fn top_k_truncation_samples_the_renormalised_top_k() {
    // Id 5 is the mask (never chosen); the two largest others are 1 (2.0) and 3 (1.5).
    let logits = [1.0f32, 2.0, -1.0, 1.5, 0.0, 9.0];
    let t = 1.5f32;
    let q = StatsQuery {
        top_k: 4,
        sample_top_k: Some(2),
        ..StatsQuery::new(t, 77)
    };
    let mut counts = [0u32; 5];
    let n = 40_000;
    for pos in 0..n {
        let s = reduce(&logits, pos, &q, 5);
        counts[s.token(0) as usize] += 1;
        let (ids, probs) = s.top(0);
        assert_eq!(ids, &[1, 3, 1, 1]);
        assert_eq!(probs[2..], [0.0, 0.0]);
        assert!((probs[0] + probs[1] - 1.0).abs() < 1e-6);
        assert!(f64::from(s.entropy(0)) <= 2f64.ln() + 1e-6);
        assert_eq!(s.tail_mass(0), 0.0);
    }
    assert_eq!(counts[0] + counts[2] + counts[4], 0, "{counts:?}");
    let z = (2.0f64 / 1.5).exp() + 1.0f64.exp();
    let want = (2.0f64 / 1.5).exp() / z;
    let got = f64::from(counts[1]) / n as f64;
    assert!((got - want).abs() < 0.01, "token 1: {got} vs {want}");
    // k = 1 is argmax with probability 1, whatever the noise; k past the vocabulary is off.
    let one = StatsQuery {
        sample_top_k: Some(1),
        ..q
    };
    for pos in 0..200 {
        let s = reduce(&logits, pos, &one, 5);
        assert_eq!((s.token(0), s.token_prob(0)), (1, 1.0));
    }
    let wide = StatsQuery {
        sample_top_k: Some(50),
        ..q
    };
    let off = StatsQuery {
        sample_top_k: None,
        ..q
    };
    assert_eq!(reduce(&logits, 3, &wide, 5), reduce(&logits, 3, &off, 5));
    let zero = StatsQuery {
        sample_top_k: Some(0),
        ..q
    };
    assert!(zero.validate().is_err());
}
