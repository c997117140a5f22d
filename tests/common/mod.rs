//! Generators shared by the workspace property tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use spot_dlm::toy::{ToyConfig, ToyModel};
use spot_dlm::{BlockLayout, ConfidenceRule, DecodeConfig, TokenId, Transition};

/// Property cases per test: 1,000 by default (what CI runs); `SPOT_PROPTEST_CASES` overrides.
pub fn cases() -> u32 {
    std::env::var("SPOT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

pub fn toy_config() -> impl Strategy<Value = ToyConfig> {
    (
        8usize..=64,
        any::<u64>(),
        prop_oneof![Just(0.5f32), Just(2.0), Just(4.0), Just(8.0)],
        prop_oneof![Just(0.0f32), Just(0.5), Just(0.8), Just(0.95), Just(1.0)],
        prop_oneof![Just(0.0f32), Just(0.1), Just(0.5), Just(1.0)],
        any::<bool>(),
    )
        .prop_map(
            |(vocab, seed, peak, stability, tie_rate, prefix_forwards)| ToyConfig {
                vocab_size: vocab,
                mask_id: (vocab - 1) as TokenId,
                max_positions: 512,
                stop_ids: vec![0, 1],
                seed,
                peak,
                stability,
                tie_rate,
                prefix_forwards,
            },
        )
}

pub fn prompt(vocab: usize) -> impl Strategy<Value = Vec<TokenId>> {
    prop::collection::vec(0..(vocab - 1) as TokenId, 1..40)
}

pub fn temperature() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(0.3), Just(1.0), Just(2.0)]
}

pub fn block_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(4usize), Just(8), Just(16), Just(32)]
}

pub fn rule() -> impl Strategy<Value = ConfidenceRule> {
    prop_oneof![
        4 => Just(ConfidenceRule::Probability),
        1 => Just(ConfidenceRule::RawProbability),
        1 => Just(ConfidenceRule::Margin),
        1 => Just(ConfidenceRule::NegativeEntropy),
    ]
}

pub fn transition() -> impl Strategy<Value = Transition> {
    prop_oneof![
        3 => Just(Transition::Exact),
        1 => prop_oneof![Just(0.5f32), Just(0.9)].prop_map(|tau| Transition::Threshold { tau }),
        1 => (1u32..=12, prop_oneof![Just(None), Just(Some(0.3f32)), Just(Some(0.9))])
            .prop_map(|(steps, tau)| Transition::Scheduled { steps, tau }),
        1 => (1u32..=40, prop_oneof![Just(1e-3f32), Just(0.3)])
            .prop_map(|(steps, eps)| Transition::Timesteps { steps, eps }),
    ]
}

/// A decode configuration with the given transition and rule.
pub fn decode_config(
    transition: impl Strategy<Value = Transition>,
    rule: impl Strategy<Value = ConfidenceRule>,
) -> impl Strategy<Value = DecodeConfig> {
    (
        block_size(),
        1usize..80,
        temperature(),
        any::<u64>(),
        transition,
        rule,
        any::<bool>(),
        prop_oneof![Just(1usize), Just(4), Just(32)],
        prop_oneof![3 => Just(None), 1 => prop_oneof![Just(1usize), Just(3), Just(10)].prop_map(Some)],
        prop_oneof![3 => Just(BlockLayout::Aligned), 1 => Just(BlockLayout::AfterPrompt)],
    )
        .prop_map(
            |(
                block_size,
                max_new_tokens,
                temperature,
                seed,
                transition,
                confidence,
                early_stop,
                top_k,
                sample_top_k,
                layout,
            )| {
                DecodeConfig {
                    block_size,
                    max_new_tokens,
                    temperature,
                    seed,
                    transition,
                    confidence,
                    stop_ids: vec![0],
                    early_stop,
                    top_k,
                    sample_top_k,
                    layout,
                }
            },
        )
}

/// A toy model, a prompt for it and a decode configuration.
pub fn case(
    transition: impl Strategy<Value = Transition>,
) -> impl Strategy<Value = (ToyConfig, Vec<TokenId>, DecodeConfig)> {
    (toy_config(), decode_config(transition, rule()))
        .prop_flat_map(|(t, c)| (Just(t.clone()), prompt(t.vocab_size), Just(c)))
}

pub fn model(cfg: &ToyConfig) -> ToyModel {
    ToyModel::new(cfg.clone())
}
