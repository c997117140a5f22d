//! Property tests: every speculative decoder returns exactly the draft-free tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{case, cases, model};
use proptest::prelude::*;
use spot_dlm::sets::JoinPrediction;
use spot_dlm::{
    BlockEnds, DecodeOutput, DraftFreeDecoder, Expand, JoinModel, MatchRule, OracleScorer,
    RandomScorer, ScoreContext, SetTreeConfig, SpotDecoder, StaleConfidenceScorer,
    StaleThresholdJoin, TokenId, TokenOracleScorer, Transition, TreeConfig, TreeError,
};

/// A set drafter with arbitrary (seeded) lead, join, token and hedge probabilities, certain
/// ones (0 and 1) included: it exercises every path of the set enumeration, and exactness may not depend on
/// it.
struct RandomJoin(u64);

impl JoinModel for RandomJoin {
    fn name(&self) -> &str {
        "random-join"
    }
    fn predict(
        &mut self,
        _ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        _tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError> {
        let h =
            spot_dlm::core::state::mix64(self.0 ^ spot_dlm::tree::state_hash(state) ^ steps as u64);
        for s in 0..state.len() {
            let r = spot_dlm::core::state::mix64(h ^ s as u64);
            out.join[s] = match r % 5 {
                0 => 0.0,
                1 => 1.0,
                _ => (r >> 40) as f32 / (1u64 << 24) as f32,
            };
            out.lead[s] = match (r >> 3) % 4 {
                0 => 0.0,
                1 => 1.0,
                _ => ((r >> 16) % 1000) as f32 / 999.0,
            };
            out.token[s] = ((r >> 8) % 1000) as f32 / 999.0;
            out.hedge[s] = ((r >> 28) % 1000) as f32 / 999.0 * (1.0 - out.token[s]);
        }
        Ok(())
    }
}

fn set_config() -> impl Strategy<Value = SetTreeConfig> {
    (
        1usize..=24,
        1usize..=8,
        prop_oneof![Just(0.0f32), Just(0.001), Just(0.05)],
        1usize..=8,
    )
        .prop_map(|(budget, max_steps, gamma, sets_per_node)| SetTreeConfig {
            budget,
            max_steps,
            gamma,
            sets_per_node,
        })
}

fn set_transition() -> impl Strategy<Value = Transition> {
    prop_oneof![
        1 => Just(Transition::Exact),
        3 => prop_oneof![Just(0.05f32), Just(0.2), Just(0.5), Just(0.9)]
            .prop_map(|tau| Transition::Threshold { tau }),
        1 => (1u32..=8, prop_oneof![Just(None), Just(Some(0.2f32))])
            .prop_map(|(steps, tau)| Transition::Scheduled { steps, tau }),
        1 => (1u32..=12).prop_map(|steps| Transition::Timesteps { steps, eps: 1e-3 }),
    ]
}

#[derive(Clone, Debug)]
enum Scorer {
    Stale,
    Chain,
    Random(u64),
    Oracle { with_tokens: bool },
    TokenOracle,
}

fn scorer() -> impl Strategy<Value = Scorer> {
    prop_oneof![
        Just(Scorer::Stale),
        Just(Scorer::Chain),
        any::<u64>().prop_map(Scorer::Random),
        any::<bool>().prop_map(|with_tokens| Scorer::Oracle { with_tokens }),
        Just(Scorer::TokenOracle),
    ]
}

fn tree_config() -> impl Strategy<Value = TreeConfig> {
    (
        1usize..=32,
        1usize..=16,
        prop_oneof![Just(0.0f32), Just(0.001), Just(0.02), Just(0.1)],
        prop_oneof![Just(None), Just(Some(0.6f32)), Just(Some(1.0f32))],
        any::<bool>(),
        prop_oneof![
            Just(Expand::Layers),
            Just(Expand::BestFirst { batch: None }),
            (1usize..=3).prop_map(|k| Expand::BestFirst { batch: Some(k) }),
        ],
    )
        .prop_map(
            |(budget, max_depth, gamma, hedge, sum_orders, expand)| TreeConfig {
                budget,
                max_depth,
                gamma,
                hedge,
                sum_orders,
                expand,
            },
        )
}

/// Look-ahead completions of 0 to 8 positions, draft refresh on or off.
fn block_ends() -> impl Strategy<Value = BlockEnds> {
    (0usize..=8, any::<bool>()).prop_map(|(fill, refresh)| BlockEnds { fill, refresh })
}

fn spot_decoder(scorer: &Scorer, tree: TreeConfig, reference: &DecodeOutput) -> SpotDecoder {
    spot_decoder_with(scorer, tree, reference, false, BlockEnds::default())
}

/// [`spot_decoder`], with the adaptive mass floor when `adaptive` (its floor follows measured
/// forward times, so the trees vary from run to run; the output may not) and the block-end
/// designs `ends`.
fn spot_decoder_with(
    scorer: &Scorer,
    tree: TreeConfig,
    reference: &DecodeOutput,
    adaptive: bool,
    ends: BlockEnds,
) -> SpotDecoder {
    let b = SpotDecoder::builder()
        .tree_config(tree)
        .record_trace(true)
        .adaptive_gamma(adaptive)
        .block_ends(ends);
    let b = match scorer {
        Scorer::Stale => b.scorer(StaleConfidenceScorer),
        Scorer::Chain => b.chain(),
        Scorer::Random(seed) => b.scorer(RandomScorer { seed: *seed }),
        Scorer::Oracle { with_tokens } => {
            let trace = reference.trace.as_ref().expect("reference trace recorded");
            b.scorer(OracleScorer::from_trace(trace, *with_tokens).expect("valid trace"))
        }
        Scorer::TokenOracle => {
            let trace = reference.trace.as_ref().expect("reference trace recorded");
            b.scorer(TokenOracleScorer::from_trace(trace))
        }
    };
    b.build().expect("valid tree config")
}

fn check_invariants(reference: &DecodeOutput, fast: &DecodeOutput) -> Result<(), TestCaseError> {
    prop_assert_eq!(&fast.tokens, &reference.tokens);
    prop_assert_eq!(&fast.generated, &reference.generated);
    prop_assert_eq!(fast.stopped, reference.stopped);
    // The same transition steps, in the same order.
    prop_assert_eq!(&fast.trace, &reference.trace);
    prop_assert!(fast.stats.work.nfe <= reference.stats.work.nfe);
    prop_assert_eq!(
        fast.stats.work.prefix_forwards,
        reference.stats.work.prefix_forwards
    );
    prop_assert_eq!(fast.stats.blocks, reference.stats.blocks);
    prop_assert_eq!(fast.stats.committed, reference.stats.committed);
    prop_assert!(fast.stats.commits_per_forward.iter().all(|&c| c >= 1));
    // Forwards a look-ahead served commit too, without being forwards.
    prop_assert_eq!(
        fast.stats.commits_per_forward.len() as u64,
        fast.stats.work.block_forwards + fast.stats.prefetched_forwards
    );
    prop_assert_eq!(
        fast.stats
            .commits_per_forward
            .iter()
            .map(|&c| u64::from(c))
            .sum::<u64>(),
        fast.stats.committed
    );
    prop_assert!(fast.stats.accepted_nodes <= fast.stats.draft_nodes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Exact decoding (Φ): speculative == draft-free for every scorer, budget, γ, hedge and T.
    #[test]
    fn speculative_equals_draft_free((toy, prompt, cfg) in case(Just(Transition::Exact)),
                                     scorer in scorer(), tree in tree_config()) {
        let mut m = model(&toy);
        let reference = DraftFreeDecoder::new().with_trace(true).decode(&mut m, &prompt, &cfg).unwrap();
        prop_assert!(reference.stats.commits_per_forward.iter().all(|&c| c == 1));
        let fast = spot_decoder(&scorer, tree, &reference).decode(&mut m, &prompt, &cfg).unwrap();
        check_invariants(&reference, &fast)?;
    }

    /// Threshold decoding (Φ^τ) and every confidence rule: the verifier is exact for any
    /// deterministic transition.
    #[test]
    fn speculative_equals_draft_free_any_transition((toy, prompt, cfg) in case(common::transition()),
                                                    scorer in scorer(), tree in tree_config(),
                                                    adaptive in any::<bool>(), ends in block_ends()) {
        let mut m = model(&toy);
        let reference = DraftFreeDecoder::new().with_trace(true).decode(&mut m, &prompt, &cfg).unwrap();
        let fast = spot_decoder_with(&scorer, tree, &reference, adaptive, ends)
            .decode(&mut m, &prompt, &cfg).unwrap();
        check_invariants(&reference, &fast)?;
    }

    /// Set-valued trees (SPOT-Sets) under threshold decoding, any τ, T, rule and seed, with the
    /// training-free stale-threshold drafter, arbitrary join probabilities, or the learned set
    /// network (random weights, reading the toy model's hidden states).
    #[test]
    fn set_trees_equal_draft_free_threshold((toy, prompt, cfg) in case(set_transition()),
                                            drafter in 0..3u8, seed in any::<u64>(),
                                            sets in set_config(), adaptive in any::<bool>(),
                                            ends in block_ends()) {
        use spot_dlm::sets::net::{SetsNet, SetsNetConfig};
        use spot_dlm::sets::tokens::{TokenHead, TokenHeadConfig};
        let mut m = model(&toy);
        let reference = DraftFreeDecoder::new().with_trace(true).decode(&mut m, &prompt, &cfg).unwrap();
        let b = SpotDecoder::builder().record_trace(true).adaptive_gamma(adaptive).block_ends(ends);
        let b = match drafter {
            0 => b.sets(StaleThresholdJoin, StaleConfidenceScorer, sets),
            1 => b.sets(RandomJoin(seed), RandomScorer { seed }, sets),
            _ => {
                // Random weights; half the time a token head that re-ranks the candidates
                // with random context weights, so its drafted tokens differ from the stale.
                let hidden = spot_dlm::toy::TOY_HIDDEN_DIM;
                let mut net = SetsNet::init(SetsNetConfig::new(hidden), seed);
                if seed % 2 == 0 {
                    let cfg = TokenHeadConfig { vocab: toy.vocab_size, dim: 4, candidates: 4, hidden_dim: hidden };
                    let mut head = TokenHead::init(cfg, None, seed);
                    for (i, v) in head.params[1..3].iter_mut().flatten().enumerate() {
                        *v = (spot_dlm::toy::mix64(seed ^ i as u64) % 2001) as f32 / 1000.0 - 1.0;
                    }
                    net.set_token_head(Some(head)).unwrap();
                }
                b.sets(net, StaleConfidenceScorer, sets)
            }
        };
        let fast = b.build().unwrap().decode(&mut m, &prompt, &cfg).unwrap();
        check_invariants(&reference, &fast)?;
    }

    /// With the full oracle (true positions and tokens) a block with `M` masked positions takes
    /// exactly `1 + ceil((M - 1) / (k + 1))` forwards, `k = min(D, max_depth)`: the first plain
    /// forward commits one position, every round accepts `k` true nodes and commits the
    /// target's next choice, and a round whose path reaches the complete state ends the block
    /// (counting the first forwards that a look-ahead served).
    #[test]
    fn oracle_meets_the_exact_bound((toy, prompt, cfg) in case(Just(Transition::Exact)),
                                   tree in tree_config()) {
        let mut m = model(&toy);
        let reference = DraftFreeDecoder::new().with_trace(true).decode(&mut m, &prompt, &cfg).unwrap();
        // Look-ahead from complete nodes only: the oracle's are the true block ends.
        let ends = BlockEnds { fill: 0, refresh: true };
        let fast = spot_decoder_with(&Scorer::Oracle { with_tokens: true }, tree, &reference, false, ends)
            .decode(&mut m, &prompt, &cfg).unwrap();
        check_invariants(&reference, &fast)?;
        let k = tree.budget.min(tree.max_depth);
        let expected: u64 = reference.trace.as_ref().unwrap().blocks.iter().map(|b| {
            let masked = b.initial.masked_count();
            if masked == 0 { 0 } else { 1 + (masked - 1).div_ceil(k + 1) as u64 }
        }).sum();
        // A block's first forward may have been served by the look-ahead of the one before.
        prop_assert_eq!(fast.stats.work.block_forwards + fast.stats.prefetched_forwards, expected);
    }

    /// Matching ablations are exact at T = 0 with the default rule, where they coincide with
    /// coupled matching.
    #[test]
    fn ablations_are_exact_at_zero_temperature((toy, prompt, mut cfg) in case(Just(Transition::Exact)),
                                              tree in tree_config(),
                                              greedy in any::<bool>()) {
        cfg.temperature = 0.0;
        cfg.confidence = spot_dlm::ConfidenceRule::Probability;
        let mut m = model(&toy);
        let reference = DraftFreeDecoder::new().with_trace(true).decode(&mut m, &prompt, &cfg).unwrap();
        let rule = if greedy { MatchRule::Greedy } else { MatchRule::IndependentSampling };
        let fast = SpotDecoder::builder().tree_config(tree).match_rule(rule).record_trace(true)
            .build().unwrap().decode(&mut m, &prompt, &cfg).unwrap();
        check_invariants(&reference, &fast)?;
    }
}

/// The matching ablations are *not* exact at `T > 0`: measured here so that the claim in their
/// documentation is checked, and so that this suite is known to detect a diverging decoder.
#[test]
fn ablations_diverge_at_positive_temperature() {
    use spot_dlm::toy::{ToyConfig, ToyModel};
    let mut diverged = [0u64; 2];
    let n = 60;
    for i in 0..n {
        let mut m = ToyModel::new(ToyConfig {
            seed: i,
            peak: 2.0,
            ..ToyConfig::default()
        });
        let cfg = spot_dlm::DecodeConfig {
            block_size: 16,
            max_new_tokens: 32,
            temperature: 1.0,
            seed: i * 7 + 1,
            early_stop: false,
            ..spot_dlm::DecodeConfig::default()
        };
        let prompt = [1 + (i % 40) as u32, 2, 3];
        let reference = DraftFreeDecoder::new()
            .decode(&mut m, &prompt, &cfg)
            .unwrap();
        for (k, rule) in [MatchRule::Greedy, MatchRule::IndependentSampling]
            .into_iter()
            .enumerate()
        {
            let out = SpotDecoder::builder()
                .budget(8)
                .match_rule(rule)
                .build()
                .unwrap()
                .decode(&mut m, &prompt, &cfg)
                .unwrap();
            diverged[k] += u64::from(out.tokens != reference.tokens);
        }
    }
    eprintln!(
        "diverged of {n}: greedy {}, independent {}",
        diverged[0], diverged[1]
    );
    assert!(diverged[0] > n / 2 && diverged[1] > n / 2, "{diverged:?}");
}

/// The cross-block look-ahead fires: with the full oracle on stable toy logits the tree
/// reaches every block's end, so each following block's first forward comes from the
/// look-ahead of the forward before; the decode is the draft-free one in fewer forwards.
/// A toy model and a fixed-length decode of 8 blocks of 8: the block-end tests' setting.
fn block_end_case(
    toy: spot_dlm::toy::ToyConfig,
) -> (spot_dlm::toy::ToyModel, spot_dlm::DecodeConfig) {
    use spot_dlm::BlockDiffusionModel;
    let m = spot_dlm::toy::ToyModel::new(toy);
    let cfg = spot_dlm::DecodeConfig {
        block_size: 8,
        max_new_tokens: 64,
        early_stop: false,
        stop_ids: m.info().stop_ids.clone(),
        ..spot_dlm::DecodeConfig::default()
    };
    (m, cfg)
}

#[test]
fn lookahead_serves_the_next_blocks_first_forward() {
    use spot_dlm::toy::ToyConfig;
    let (mut m, cfg) = block_end_case(ToyConfig {
        stability: 1.0,
        ..ToyConfig::default()
    });
    let prompt = [3, 1, 4, 1, 5];
    let reference = DraftFreeDecoder::new()
        .with_trace(true)
        .decode(&mut m, &prompt, &cfg)
        .unwrap();
    let trace = reference.trace.as_ref().unwrap();
    let fast = SpotDecoder::builder()
        .budget(16)
        .scorer(OracleScorer::from_trace(trace, true).unwrap())
        .build()
        .unwrap()
        .decode(&mut m, &prompt, &cfg)
        .unwrap();
    assert_eq!(fast.tokens, reference.tokens);
    // 9 blocks (the prompt's tail rides in the first): every one after the first is served.
    assert_eq!(fast.stats.blocks, 9);
    assert_eq!(fast.stats.prefetched_forwards, 8, "{:?}", fast.stats);
    assert_eq!(
        fast.stats.work.block_forwards + fast.stats.prefetched_forwards,
        2 * fast.stats.blocks
    );
}

/// Draft refresh: a block whose first forward the look-ahead did not serve drafts it from the
/// look-ahead's statistics (a round), where it would otherwise take a plain step; guessed
/// completions (`fill`) make such misses common. The output stays the draft-free one.
#[test]
fn refresh_drafts_a_blocks_first_forward() {
    use spot_dlm::toy::ToyConfig;
    let (mut m, cfg) = block_end_case(ToyConfig::default());
    let mut refreshed = [0u64; 2];
    for p in 0..6u32 {
        let prompt = [3, 1, 4 + p, 1, 5];
        let reference = DraftFreeDecoder::new()
            .decode(&mut m, &prompt, &cfg)
            .unwrap();
        for (i, refresh) in [false, true].into_iter().enumerate() {
            let mut d = SpotDecoder::builder()
                .budget(6)
                .block_ends(BlockEnds { fill: 8, refresh })
                .build()
                .unwrap();
            let out = d.decode(&mut m, &prompt, &cfg).unwrap();
            assert_eq!(out.tokens, reference.tokens);
            let s = &out.stats;
            // Plain forwards: the blocks' first forwards that were neither served nor (with
            // refresh) drafted from a refresh.
            let used = if refresh { s.refreshed_blocks } else { 0 };
            let plain = s.blocks - s.prefetched_forwards - used;
            assert_eq!(s.work.block_forwards, d.report().rounds + plain, "{s:?}");
            refreshed[i] += s.refreshed_blocks;
        }
    }
    assert!(
        refreshed.iter().all(|&r| r > 0),
        "no look-ahead missed: {refreshed:?}"
    );
}
