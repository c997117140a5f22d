//! The device suite, written once for a GPU backend `crate::B` and compiled into one test binary
//! per backend: `tests/cuda.rs` (`cuda` feature; run by `tools/gpu/run.sh` on a lent GPU) and
//! `tests/wgpu.rs` (`wgpu` feature; `.ci/run` runs it on lavapipe, Mesa's Vulkan device on the
//! CPU). Every block-diffusion fixture (SDAR in f32 and with bf16 weights, LLaDA, Dream,
//! LLaDA2.0-MoE), in f32 and, where the device has the type, bf16:
//!
//! - f32 logits against the transformers goldens, and draft-free tokens against the oracle's;
//! - batch invariance of the statistics: each state alone against batches of 2, 3, 8, 21 and 33
//!   states (at every row position), after prefixes of 0-8 blocks of 8 and 0-4 blocks of 32,
//!   both head placements, T 0 and 1;
//! - speculative == draft-free (tree decoder, budgets 8 and 20, T 0 and 1);
//! - several requests in one forward equal to each alone.
//!
//! Where the backend cannot start a device every test prints a `SKIPPED` line and returns,
//! unless `SPOT_REQUIRE_DEVICE=1` (as `.ci/run` sets it for wgpu), which makes that a failure.

use crate::B;
use crate::common::*;
use burn_tensor::backend::Backend;
use spot_dlm::{
    BlockDiffusionModel, DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer,
    StatsQuery,
};
use spot_models::{DiffusionModel, HeadPlacement, Precision};

/// `SPOT_DEVICE_SUITE=ci` (set by `.ci/run`, where the device is lavapipe, a Vulkan device on
/// two CPU cores): the batch-invariance matrix on 3 of its 9 prefixes and 21 states (windows of
/// 2, 3, 8 and 21), speculative decoding on one prompt per fixture, batched requests with the
/// output layer on the device only (the host placement's batches are in the batch-invariance
/// matrix) and without `dream-tiny` (a full-sequence family, as `llada-tiny`, which stays), the
/// reduction test at T 0 and 1 with two of its three rules and one mask setting per vocabulary,
/// and the three decoding tests without `sdar-tiny-bf16`, which in f32 (lavapipe has no bf16)
/// is `sdar-tiny` with rounded weights: the golden tests still load it. Otherwise (a GPU) all.
fn ci_size() -> bool {
    std::env::var("SPOT_DEVICE_SUITE").is_ok_and(|v| v == "ci")
}

/// Whether a test of the CI size that leaves `name` out (see [`ci_size`]) should skip it, with
/// `also` the fixtures that test leaves out besides `sdar-tiny-bf16`; says so on stderr.
fn left_out_at_ci_size(test: &str, name: &str, precision: Precision, also: &[&str]) -> bool {
    let out = ci_size()
        && precision == Precision::F32
        && (name == "sdar-tiny-bf16" || also.contains(&name));
    if out {
        eprintln!("CI size: {test} leaves out {name} in {precision} (see ci_size)");
    }
    out
}

/// Whether the backend's default device starts; `false` (with a skip line) when it does not and
/// `SPOT_REQUIRE_DEVICE` is unset.
fn device_starts(test: &str) -> bool {
    let device = Default::default();
    let probe =
        std::panic::catch_unwind(|| burn_tensor::Tensor::<B, 1>::zeros([1], &device).into_data());
    let Err(e) = probe else {
        return true;
    };
    let why = e
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| e.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    let required = std::env::var("SPOT_REQUIRE_DEVICE").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{test}: SPOT_REQUIRE_DEVICE=1 but no device: {why}"
    );
    eprintln!("SKIPPED {test}: no device ({why})");
    false
}

/// Fixture `name` on the default device in `precision`, or `None` (with a skip line) when the
/// device has no such type.
fn load(name: &str, test: &str, precision: Precision) -> Option<DiffusionModel<B>> {
    let device = Default::default();
    let dtype = match precision {
        Precision::Bf16 => Some(burn_tensor::DType::BF16),
        Precision::F16 => Some(burn_tensor::DType::F16),
        _ => None,
    };
    if let Some(dtype) = dtype.filter(|&d| !B::supports_dtype(&device, d)) {
        eprintln!("SKIPPED {test} {name} in {precision}: the device has no {dtype:?}");
        return None;
    }
    let m = DiffusionModel::load_as(&fixture(name), &device, precision).expect("fixture loads");
    assert_eq!(m.precision(), precision);
    Some(m)
}

/// Every fixture in every precision the suite covers (those the device lacks are skipped), or
/// the fixtures `SPOT_DEVICE_FIXTURES` names (comma-separated), for a quick look at one.
fn cases(precisions: &'static [Precision]) -> impl Iterator<Item = (&'static str, Precision)> {
    let only = std::env::var("SPOT_DEVICE_FIXTURES").ok();
    DIFFUSION_FIXTURES
        .into_iter()
        .filter(move |n| only.as_ref().is_none_or(|o| o.split(',').any(|x| x == *n)))
        .flat_map(move |n| precisions.iter().map(move |&p| (n, p)))
}

/// The precisions the exactness tests cover (the golden comparisons are f32 only).
const F32_AND_BF16: &[Precision] = &[Precision::F32, Precision::Bf16];

/// Runs `check` on the model of every case (fixture and one of `precisions`), after
/// `device_starts`; cases whose type the device lacks print skip lines.
fn each_model(
    test: &str,
    precisions: &'static [Precision],
    mut check: impl FnMut(&str, Precision, &mut DiffusionModel<B>),
) {
    if !device_starts(test) {
        return;
    }
    for (name, precision) in cases(precisions) {
        if let Some(mut m) = load(name, test, precision) {
            check(name, precision, &mut m);
        }
    }
}

/// f32 logits of every golden case within 1e-4 (max abs) of the transformers oracle.
#[test]
fn device_logits_match_transformers() {
    each_model(
        "device_logits_match_transformers",
        &[Precision::F32],
        |name, _, m| {
            assert_logits_match_golden(m, name);
        },
    );
}

/// Draft-free decoding at T = 0 in f32 returns the oracle's tokens, commits and forwards.
#[test]
fn device_draft_free_tokens_match_transformers() {
    let test = "device_draft_free_tokens_match_transformers";
    each_model(test, &[Precision::F32], |name, _, m| {
        assert_draft_free_matches_golden(m, name);
    });
}

/// A state's statistics are bit-identical alone and inside batches of 2, 3, 8, 21 and 33 states
/// (windows of 33 states scored alone, so every row position of a batch is covered), after
/// prefixes of 0 to 8 blocks of 8 and 0 to 4 blocks of 32, at T = 0 and 1, with the output
/// layer on the device and on the host (in CI, the smaller matrix of [`ci_size`]).
#[test]
fn device_statistics_are_batch_invariant() {
    let test = "device_statistics_are_batch_invariant";
    each_model(test, F32_AND_BF16, |name, precision, m| {
        if left_out_at_ci_size(test, name, precision, &[]) {
            return;
        }
        let mask = m.info().mask_id;
        for head in [HeadPlacement::Device, HeadPlacement::Host] {
            m.set_head_placement(head);
            let prefixes: &[(usize, usize)] = if ci_size() {
                &[(8, 0), (8, 8), (32, 4)]
            } else {
                &[
                    (8, 0),
                    (8, 1),
                    (8, 2),
                    (8, 4),
                    (8, 8),
                    (32, 0),
                    (32, 1),
                    (32, 2),
                    (32, 4),
                ]
            };
            let (states_n, sizes): (usize, &[usize]) = if ci_size() {
                (21, &[2, 3, 8, 21])
            } else {
                (33, &[2, 3, 8, 21, 33])
            };
            for &(bs, blocks) in prefixes {
                let prefix: Vec<u32> = (0..(blocks * bs) as u32).map(|i| (i * 7) % 300).collect();
                m.prefill(&prefix, bs, prefix.len() + bs).unwrap();
                for t in [0.0f32, 1.0] {
                    let q = StatsQuery::new(t, 11);
                    let states = varied_states(mask, states_n, bs, (blocks * 100 + bs) as u64);
                    let alone: Vec<_> = states
                        .iter()
                        .map(|s| m.score(std::slice::from_ref(s), &q).unwrap().remove(0))
                        .collect();
                    for &n in sizes {
                        // A window that ends the list for one size and starts it for the next.
                        let start = if n % 2 == 0 { 0 } else { states_n - n };
                        let together = m.score(&states[start..start + n], &q).unwrap();
                        for (i, got) in together.iter().enumerate() {
                            assert_eq!(
                                got,
                                &alone[start + i],
                                "{name} {precision} {head:?} block {bs} prefix {blocks} blocks \
                                 T {t} batch {n} row {i}"
                            );
                        }
                    }
                }
            }
        }
    });
}

/// Speculative decoding returns the draft-free tokens (the tree decoder, budgets 8 and 20,
/// T = 0 and 1).
#[test]
fn device_speculative_equals_draft_free() {
    let test = "device_speculative_equals_draft_free";
    each_model(test, F32_AND_BF16, |name, precision, m| {
        if left_out_at_ci_size(test, name, precision, &[]) {
            return;
        }
        for i in 0..if ci_size() { 1 } else { 2u64 } {
            let prompt: Vec<u32> = (0..5 + i as u32 * 7).map(|j| (j * 37 + 11) % 300).collect();
            for t in [0.0f32, 1.0] {
                let cfg = DecodeConfig {
                    block_size: 8,
                    max_new_tokens: 24,
                    temperature: t,
                    seed: i,
                    stop_ids: m.info().stop_ids.clone(),
                    ..DecodeConfig::for_model(m.info())
                };
                let reference = DraftFreeDecoder::new().decode(m, &prompt, &cfg).unwrap();
                for budget in [8usize, 20] {
                    let mut tree = SpotDecoder::builder()
                        .budget(budget)
                        .scorer(StaleConfidenceScorer)
                        .build()
                        .unwrap();
                    let out = tree.decode(m, &prompt, &cfg).unwrap();
                    assert_eq!(
                        out.tokens, reference.tokens,
                        "{name} {precision} prompt {i} T {t} D {budget}"
                    );
                }
            }
        }
    });
}

/// Several requests in one forward (ragged prefixes, mixed decoders, temperatures and
/// transitions) return what each returns alone, head on the device and on the host.
#[test]
fn device_batched_requests_equal_alone() {
    let test = "device_batched_requests_equal_alone";
    each_model(test, F32_AND_BF16, |name, precision, m| {
        if left_out_at_ci_size(test, name, precision, &["dream-tiny"]) {
            return;
        }
        let heads: &[HeadPlacement] = if ci_size() {
            &[HeadPlacement::Device]
        } else {
            &[HeadPlacement::Device, HeadPlacement::Host]
        };
        for &head in heads {
            m.set_head_placement(head);
            assert_batched_equals_alone(m, &format!("{name} {precision} {head:?}"));
        }
    });
}

/// The device reduction, fused kernel and burn's passes, against the host reference
/// (`spot_core::stats::reduce_logits`, in f64) on the same logits: rows of random logits over
/// vocabularies of 384 and 50,000 (every unit of a cube strides over many ids), with exact
/// ties planted at the top, a mask id or none, at T 0, 0.7 and 1, under the probability and
/// raw-probability rules, top-k 1, 5 and 32. Chosen tokens and top-k ids must be equal; the
/// chosen token's tempered and raw probabilities, the entropy and the top-k probabilities
/// within 2e-6 (absolute; measured below 1e-6 on lavapipe).
#[test]
fn device_reduction_matches_the_host_reference() {
    // Token prob, entropy, confidence, top probs (f32 values against the host's f64).
    const FUSED_BOUND: [f32; 4] = [2e-6, 1e-5, 2e-6, 2e-6];
    const PASSES_BOUND: [f32; 4] = [2e-6, 2e-4, 1e-5, 2e-6];
    use spot_dlm::core::ConfidenceRule;
    use spot_dlm::{BlockStats, ReduceScratch, reduce_logits};
    let test = "device_reduction_matches_the_host_reference";
    if !device_starts(test) {
        return;
    }
    let device = Default::default();
    let mut checked = 0usize;
    // Worst |diff| of token prob, entropy, confidence, top probs: fused, then burn's passes.
    let mut worst = [[0f32; 4]; 2];
    for (case, vocab) in [384usize, 50_000].into_iter().enumerate() {
        let started = std::time::Instant::now();
        let rows = if vocab > 1000 { 5 } else { 33 };
        let positions: Vec<usize> = (0..rows).map(|r| 3 + r * 5).collect();
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|i| {
                let h = spot_dlm::toy::mix64((case * 1_000_003 + i) as u64);
                ((h >> 11) as f64 / (1u64 << 53) as f64 * 12.0 - 6.0) as f32
            })
            .collect();
        for r in 0..rows {
            // Exact ties at the top (and, on some rows, at the mask id's neighbours).
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            let top = 7.5 + (r % 3) as f32;
            for j in [r % vocab, (r * 37 + 11) % vocab, (r * 101 + 5) % vocab] {
                row[j] = top;
            }
        }
        // At the CI size T 0.7 (T 1's kernels) and top-k 1 are left out, and each vocabulary
        // runs with one of the two mask settings (the small one with the mask id).
        let temperatures: &[f32] = if ci_size() {
            &[0.0, 1.0]
        } else {
            &[0.0, 0.7, 1.0]
        };
        let masks: &[Option<u32>] = match (ci_size(), case) {
            (false, _) => &[None, Some(5)],
            (true, 0) => &[Some(5)],
            (true, _) => &[None],
        };
        for &mask in masks {
            for &t in temperatures {
                let rules: &[(ConfidenceRule, usize)] = &[
                    (ConfidenceRule::Probability, 32),
                    (ConfidenceRule::RawProbability, 5),
                    (ConfidenceRule::Probability, 1),
                ];
                for &(rule, top_k) in &rules[..if ci_size() { 2 } else { 3 }] {
                    let mut q = StatsQuery::new(t, 17 + case as u64);
                    q.rule = rule;
                    q.top_k = top_k;
                    let mut scratch = ReduceScratch::default();
                    for fused in [true, false] {
                        let got = spot_models::testing::reduce_on_device::<B>(
                            &logits, vocab, &q, mask, &positions, fused, &device,
                        )
                        .unwrap();
                        for (r, g) in got.iter().enumerate() {
                            let mut want = BlockStats::new(top_k);
                            reduce_logits(
                                &logits[r * vocab..(r + 1) * vocab],
                                positions[r],
                                &q,
                                mask.unwrap_or(u32::MAX),
                                &mut scratch,
                                &mut want,
                            )
                            .unwrap();
                            let (ids, probs) = want.top(0);
                            let what = format!(
                                "vocab {vocab} mask {mask:?} T {t} {rule:?} top-k {top_k} \
                                 fused {fused} row {r}"
                            );
                            assert_eq!(g.token, want.token(0), "{what}");
                            assert_eq!(g.top_ids, ids, "{what}");
                            let d = [
                                (g.token_prob as f32 - want.token_prob(0)).abs(),
                                (g.entropy as f32 - want.entropy(0)).abs(),
                                (g.confidence(rule) as f32 - want.confidence(0)).abs(),
                                g.top_probs
                                    .iter()
                                    .zip(probs)
                                    .map(|(a, b)| (a - b).abs())
                                    .fold(0f32, f32::max),
                            ];
                            let w = &mut worst[usize::from(!fused)];
                            for (w, d) in w.iter_mut().zip(d) {
                                *w = w.max(d);
                            }
                            let bound = if fused { FUSED_BOUND } else { PASSES_BOUND };
                            assert!(
                                d.iter().zip(bound).all(|(d, b)| *d <= b),
                                "{what}: |diff| token prob, entropy, confidence, top probs \
                                 {d:?} above {bound:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        eprintln!("vocab {vocab}: {:.1} s", started.elapsed().as_secs_f64());
    }
    // A row with no finite logit outside the mask is the host reference's error, not a token.
    let inf = vec![f32::INFINITY; 384];
    let q = StatsQuery::new(0.0, 1);
    let e =
        spot_models::testing::reduce_on_device::<B>(&inf, 384, &q, Some(5), &[9], true, &device)
            .unwrap_err();
    assert!(
        e.to_string()
            .contains("no finite logit outside the mask token"),
        "{e}"
    );
    eprintln!(
        "{checked} reduced rows: tokens and top-k ids equal to the host reference; max |diff| \
         of token prob, entropy, confidence, top probs: fused {:?}, burn's passes {:?}",
        worst[0], worst[1]
    );
}
