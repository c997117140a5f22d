//! SpecDiff-2 is token-identical to plain autoregressive decoding, whatever the drafts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use spot_core::{ArConfig, Error, Result, TokenId, decode_autoregressive};
use spot_specdiff::toy::{ToyCausalModel, ToyDrafter};
use spot_specdiff::{
    Continuation, DiffusionDrafter, LookupDrafter, LookupStore, Marginals, Pace, Selection,
    SpecDiffBatch, SpecDiffConfig, SpecDiffDecoder, SpecDiffOutput, SpecDiffRequest,
};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(96)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn specdiff_equals_autoregressive(
        vocab in 6usize..48, model_seed in any::<u64>(), error in 0.0f32..=1.0,
        k in 1usize..=8, gamma in 1usize..=24,
        drafter_t in prop_oneof![Just(0.0f32), Just(0.5), Just(1.5), Just(3.0)],
        greedy_first in any::<bool>(), expected in any::<bool>(),
        temperature in prop_oneof![Just(0.0f32), Just(0.7), Just(1.0), Just(2.0)],
        seed in any::<u64>(), draft_seed in any::<u64>(),
        prompt in prop::collection::vec(0u32..6, 1..10),
        max_new in 1usize..80, stop in prop::option::of(0u32..6), early_stop in any::<bool>(),
        min_draft_prob in prop_oneof![Just(0.0f32), 0.0f32..=1.0],
        pace in prop::option::of((0.0f32..0.5, 0.0f32..2.0, 0.05f32..=1.0, 1u32..6)),
    ) {
        let mut target = ToyCausalModel::new(vocab, model_seed)
            .with_stop_ids(stop.into_iter().collect());
        let mut drafter = ToyDrafter::new(target.clone(), error, model_seed ^ 1);
        let cfg = ArConfig { max_new_tokens: max_new, temperature, seed, early_stop, ..ArConfig::default() };
        let plain = decode_autoregressive(&mut target, &prompt, &cfg).unwrap();
        let sd = SpecDiffConfig {
            k, gamma, drafter_temperature: drafter_t, greedy_first, draft_seed,
            selection: if expected { Selection::ExpectedStreak } else { Selection::LongestAccepted },
            min_draft_prob,
            pace: pace.map(|(row_cost, draft_cost, weight, probe_every)| Pace { row_cost, draft_cost, weight, probe_every }),
            ..SpecDiffConfig::default()
        };
        let fast = SpecDiffDecoder::new(sd).unwrap().decode(&mut target, &mut drafter, &prompt, &cfg).unwrap();
        prop_assert_eq!(&fast.tokens, &plain.tokens);
        prop_assert_eq!(fast.stopped, plain.stopped);
        prop_assert!(fast.forwards <= plain.forwards);
        prop_assert_eq!(fast.forwards, fast.report.rounds);
        let committed: u64 = fast.report.accepted.iter().enumerate().map(|(n, &c)| (n as u64 + 1) * c).sum();
        // The last round may cut its tokens at a stop id or the length limit.
        prop_assert!(committed >= fast.tokens.len() as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Requests batched into shared target forwards (each in its own slot, joining and leaving
    /// between steps) decode the tokens and counters of each alone, in fewer forwards in all;
    /// draft-free requests ([`SpecDiffRequest::plain`]) among them decode
    /// `decode_autoregressive`'s tokens and forwards, and the streamed rounds add up to each
    /// output.
    #[test]
    fn batched_requests_equal_each_alone(
        vocab in 6usize..40, model_seed in any::<u64>(), error in 0.0f32..=1.0,
        k in 1usize..=4, gamma in 1usize..=12,
        temperature in prop_oneof![Just(0.0f32), Just(1.0)], seed in any::<u64>(),
        prompts in prop::collection::vec((prop::collection::vec(0u32..6, 1..6), any::<bool>()), 1..6),
        max_new in 1usize..40, in_flight in 1usize..4, stop in prop::option::of(0u32..6),
    ) {
        let mut target = ToyCausalModel::new(vocab, model_seed)
            .with_stop_ids(stop.into_iter().collect());
        let mut drafter = ToyDrafter::new(target.clone(), error, model_seed ^ 1);
        let cfg = ArConfig { max_new_tokens: max_new, temperature, seed, ..ArConfig::default() };
        let sd = SpecDiffConfig { k, gamma, ..SpecDiffConfig::default() };
        let info = spot_core::AutoregressiveModel::ar_info(&target).clone();
        let mut batch = SpecDiffBatch::new(in_flight).unwrap();
        for (p, plain) in &prompts {
            let r = match plain {
                true => SpecDiffRequest::plain(p, &cfg, &info).unwrap(),
                false => SpecDiffRequest::new(p, &cfg, sd, &info, vocab.max(4)).unwrap(),
            };
            batch.submit(r);
        }
        let mut done = Vec::new();
        let mut streamed = vec![Vec::new(); prompts.len()];
        while batch.pending() > 0 {
            done.extend(batch.step(&mut target, &mut drafter).unwrap());
            while let Some((id, tokens)) = batch.next_event() {
                streamed[id as usize].extend(tokens);
            }
        }
        done.sort_by_key(|f| f.id);
        prop_assert_eq!(done.len(), prompts.len());
        let mut alone_forwards = 0;
        for ((f, (p, plain)), streamed) in done.into_iter().zip(&prompts).zip(streamed) {
            let got = f.output.unwrap();
            let (tokens, forwards) = match plain {
                true => {
                    let o = decode_autoregressive(&mut target, p, &cfg).unwrap();
                    (o.tokens, o.forwards)
                }
                false => {
                    let o = SpecDiffDecoder::new(sd).unwrap().decode(&mut target, &mut drafter, p, &cfg).unwrap();
                    (o.tokens, o.forwards)
                }
            };
            prop_assert_eq!(&got.tokens, &tokens);
            prop_assert_eq!(got.forwards, forwards);
            prop_assert_eq!(&streamed, &tokens);
            prop_assert!(!got.cancelled);
            alone_forwards += forwards;
        }
        prop_assert!(batch.forwards() <= alone_forwards);
        prop_assert_eq!(spot_core::AutoregressiveModel::cache_usage(&target).slots, 1);
    }
}

/// A cancelled request leaves the batch at the next step with the tokens it had committed
/// (its slot closed, the others unaffected); a stop check ends a request with the tokens it
/// keeps.
#[test]
fn requests_are_cancelled_and_stopped_in_a_batch() {
    let mut target = ToyCausalModel::new(24, 5);
    let mut drafter = ToyDrafter::new(target.clone(), 0.3, 2);
    let cfg = ArConfig {
        max_new_tokens: 30,
        temperature: 1.0,
        seed: 4,
        early_stop: false,
        ..ArConfig::default()
    };
    let info = spot_core::AutoregressiveModel::ar_info(&target).clone();
    let sd = SpecDiffConfig {
        k: 2,
        gamma: 4,
        ..SpecDiffConfig::default()
    };
    let full = decode_autoregressive(&mut target, &[1, 2], &cfg)
        .unwrap()
        .tokens;
    let mut batch = SpecDiffBatch::new(4).unwrap();
    let cancelled = SpecDiffRequest::new(&[1, 2], &cfg, sd, &info, 24).unwrap();
    let handle = cancelled.cancel_handle();
    batch.submit(cancelled);
    // Stops once 5 tokens are out, keeping 3.
    let stopped = SpecDiffRequest::plain(&[1, 2], &cfg, &info)
        .unwrap()
        .with_stop_check(|out: &[TokenId]| (out.len() >= 5).then_some(3));
    batch.submit(stopped);
    batch.submit(SpecDiffRequest::plain(&[1, 2], &cfg, &info).unwrap());
    // The check sees the last round too: here 5 tokens is also the length limit.
    let short = ArConfig {
        max_new_tokens: 5,
        ..cfg.clone()
    };
    let last = SpecDiffRequest::plain(&[1, 2], &short, &info)
        .unwrap()
        .with_stop_check(|out: &[TokenId]| (out.len() >= 5).then_some(3));
    batch.submit(last);
    let mut done = batch.step(&mut target, &mut drafter).unwrap();
    assert!(done.is_empty());
    handle.cancel();
    while batch.pending() > 0 {
        done.extend(batch.step(&mut target, &mut drafter).unwrap());
    }
    done.sort_by_key(|f| f.id);
    let outs: Vec<_> = done.into_iter().map(|f| f.output.unwrap()).collect();
    assert!(outs[0].cancelled && !outs[0].stopped);
    assert!(!outs[0].tokens.is_empty() && outs[0].tokens.len() < full.len());
    assert_eq!(outs[0].tokens, full[..outs[0].tokens.len()]);
    assert!(outs[1].stopped && !outs[1].cancelled);
    assert_eq!(outs[1].tokens, full[..3]);
    assert_eq!(outs[1].forwards, 5);
    assert_eq!(
        (outs[2].tokens.as_slice(), outs[2].cancelled),
        (full.as_slice(), false)
    );
    assert!(outs[3].stopped);
    assert_eq!(outs[3].tokens, full[..3]);
    assert_eq!(
        spot_core::AutoregressiveModel::cache_usage(&target).slots,
        1
    );
}

/// A lookup store of the target's own greedy continuations of `prompts`.
fn own_store(target: &mut ToyCausalModel, prompts: &[Vec<TokenId>], n: usize) -> LookupStore {
    let cfg = ArConfig {
        max_new_tokens: n,
        early_stop: false,
        ..ArConfig::default()
    };
    let conts: Vec<Continuation> = prompts
        .iter()
        .map(|p| Continuation {
            prompt: p.clone(),
            tokens: decode_autoregressive(target, p, &cfg).unwrap().tokens,
        })
        .collect();
    LookupStore::new(&conts)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 4, ..ProptestConfig::default() })]

    /// Retrieval drafting (a store of the target's own continuations, calibrated) changes
    /// how many forwards a decode takes, never its tokens.
    #[test]
    fn store_drafting_equals_autoregressive(
        vocab in 6usize..40, model_seed in any::<u64>(),
        stored in prop::collection::vec(prop::collection::vec(0u32..6, 1..6), 1..6),
        k in 1usize..=4, gamma in 1usize..=16,
        temperature in prop_oneof![Just(0.0f32), Just(1.0), Just(2.0)],
        seed in any::<u64>(), prompt in prop::collection::vec(0u32..6, 1..8),
        max_new in 1usize..60, min_draft_prob in prop_oneof![Just(0.0f32), 0.0f32..=1.0],
    ) {
        let mut target = ToyCausalModel::new(vocab, model_seed);
        let store = own_store(&mut target, &stored, 40);
        let mut drafter = LookupDrafter::with_store(vocab, store, 3);
        let cfg = ArConfig { max_new_tokens: max_new, temperature, seed, ..ArConfig::default() };
        let plain = decode_autoregressive(&mut target, &prompt, &cfg).unwrap();
        let sd = SpecDiffConfig { k, gamma, min_draft_prob, ..SpecDiffConfig::default() };
        let fast = SpecDiffDecoder::new(sd).unwrap().decode(&mut target, &mut drafter, &prompt, &cfg).unwrap();
        prop_assert_eq!(&fast.tokens, &plain.tokens);
        prop_assert_eq!(fast.stopped, plain.stopped);
        prop_assert!(fast.forwards <= plain.forwards);
    }
}

/// Retrieval finds what the target wrote before: on a prompt whose continuation is in the
/// store, drafting from the store takes far fewer forwards than prompt lookup alone.
#[test]
fn the_store_drafts_what_the_target_wrote_before() {
    let mut target = ToyCausalModel::new(40, 11);
    let prompts: Vec<Vec<TokenId>> = (0..6).map(|i| vec![i, i + 1, 2 * i]).collect();
    let store = own_store(&mut target, &prompts, 48);
    assert_eq!((store.continuations(), store.tokens()), (6, 6 * 48));
    let cfg = ArConfig {
        max_new_tokens: 48,
        early_stop: false,
        ..ArConfig::default()
    };
    let sd = SpecDiffConfig {
        k: 1,
        gamma: 8,
        ..SpecDiffConfig::default()
    };
    let mut forwards = Vec::new();
    for mut drafter in [
        LookupDrafter::new(40, 3, 3),
        LookupDrafter::with_store(40, store, 3),
    ] {
        let out = SpecDiffDecoder::new(sd)
            .unwrap()
            .decode(&mut target, &mut drafter, &prompts[2], &cfg)
            .unwrap();
        assert_eq!(
            out.tokens,
            decode_autoregressive(&mut target, &prompts[2], &cfg)
                .unwrap()
                .tokens
        );
        forwards.push(out.forwards);
    }
    // 48 tokens in rounds of up to 9: at least 6 forwards.
    assert!(
        forwards[1] <= 10 && forwards[1] * 2 < forwards[0],
        "{forwards:?}"
    );
}

/// A good drafter cuts the forwards: with the target's own argmax (error 0) at T = 0 every
/// drafted token is accepted.
#[test]
fn an_exact_drafter_commits_gamma_plus_one_per_round() {
    let mut target = ToyCausalModel::new(32, 9);
    let mut drafter = ToyDrafter::new(target.clone(), 0.0, 1);
    let cfg = ArConfig {
        max_new_tokens: 64,
        ..ArConfig::default()
    };
    let sd = SpecDiffConfig {
        k: 1,
        gamma: 7,
        drafter_temperature: 0.0,
        ..SpecDiffConfig::default()
    };
    let out = SpecDiffDecoder::new(sd)
        .unwrap()
        .decode(&mut target, &mut drafter, &[1, 2], &cfg)
        .unwrap();
    assert_eq!(
        out.tokens,
        decode_autoregressive(&mut target, &[1, 2], &cfg)
            .unwrap()
            .tokens
    );
    assert_eq!(out.forwards, 8, "{:?}", out.report);
    assert_eq!(out.report.accepted[7], 8);
}

/// Adaptive draft length: a floor on the drafts' running probability drafts fewer rows for the
/// same tokens; a floor above every probability makes every round a plain forward.
#[test]
fn a_probability_floor_drafts_fewer_rows() {
    let mut target = ToyCausalModel::new(24, 6);
    let mut drafter = ToyDrafter::new(target.clone(), 0.3, 2);
    let cfg = ArConfig {
        max_new_tokens: 120,
        temperature: 1.0,
        seed: 8,
        ..ArConfig::default()
    };
    let plain = decode_autoregressive(&mut target, &[4, 5], &cfg).unwrap();
    let run = |floor: f32, target: &mut ToyCausalModel, drafter: &mut ToyDrafter| {
        let sd = SpecDiffConfig {
            k: 2,
            gamma: 8,
            min_draft_prob: floor,
            ..SpecDiffConfig::default()
        };
        SpecDiffDecoder::new(sd)
            .unwrap()
            .decode(target, drafter, &[4, 5], &cfg)
            .unwrap()
    };
    let full = run(0.0, &mut target, &mut drafter);
    let cut = run(0.4, &mut target, &mut drafter);
    let none = run(1.0, &mut target, &mut drafter);
    for o in [&full, &cut, &none] {
        assert_eq!(o.tokens, plain.tokens);
    }
    eprintln!(
        "positions: full {} cut {} none {}; forwards {} {} {}",
        full.report.positions,
        cut.report.positions,
        none.report.positions,
        full.forwards,
        cut.forwards,
        none.forwards
    );
    assert!(cut.report.positions < full.report.positions);
    assert!(cut.forwards < none.forwards);
    // The toy drafter is never certain: no token is drafted, one forward per token.
    assert_eq!(none.forwards, plain.forwards);
    assert_eq!(none.report.accepted, [plain.forwards]);
}

/// More drafts accept more at T = 1: K = 8 needs fewer rounds than K = 1 on the same inputs.
#[test]
fn more_branches_accept_more() {
    let mut target = ToyCausalModel::new(24, 4);
    let mut drafter = ToyDrafter::new(target.clone(), 0.3, 2);
    let cfg = ArConfig {
        max_new_tokens: 200,
        temperature: 1.0,
        seed: 5,
        ..ArConfig::default()
    };
    let mut rounds = Vec::new();
    for k in [1, 8] {
        let sd = SpecDiffConfig {
            k,
            gamma: 8,
            ..SpecDiffConfig::default()
        };
        rounds.push(
            SpecDiffDecoder::new(sd)
                .unwrap()
                .decode(&mut target, &mut drafter, &[3], &cfg)
                .unwrap()
                .forwards,
        );
    }
    assert!(rounds[1] < rounds[0], "{rounds:?}");
}

struct Broken(usize, usize);

impl DiffusionDrafter for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn vocab_size(&self) -> usize {
        self.0
    }
    fn propose(&mut self, _c: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        let _ = gamma;
        *out = Marginals::new(1);
        for _ in 0..self.1 {
            out.push(&[100], &[1.0])?;
        }
        Ok(())
    }
}

#[test]
fn bad_drafters_and_settings_are_typed_errors() {
    let mut target = ToyCausalModel::new(32, 1);
    let cfg = ArConfig {
        max_new_tokens: 16,
        ..ArConfig::default()
    };
    let mut d = SpecDiffDecoder::new(SpecDiffConfig::default()).unwrap();
    let e = d
        .decode(&mut target, &mut Broken(31, 99), &[1], &cfg)
        .unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { what, .. } if what.contains("vocabulary")),
        "{e}"
    );
    // More positions than γ (fewer are allowed: a shorter draft).
    let e = d
        .decode(&mut target, &mut Broken(32, 99), &[1], &cfg)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch { what, .. } if what.starts_with("drafted positions")
        ),
        "{e}"
    );
    let e = d
        .decode(&mut target, &mut Broken(32, 2), &[1], &cfg)
        .unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    let paced = |pace| SpecDiffConfig {
        pace: Some(pace),
        ..SpecDiffConfig::default()
    };
    for (bad, field) in [
        (
            SpecDiffConfig {
                k: 0,
                ..SpecDiffConfig::default()
            },
            "k",
        ),
        (
            SpecDiffConfig {
                gamma: 0,
                ..SpecDiffConfig::default()
            },
            "gamma",
        ),
        (
            SpecDiffConfig {
                drafter_temperature: f32::NAN,
                ..SpecDiffConfig::default()
            },
            "drafter_temperature",
        ),
        (
            SpecDiffConfig {
                target_top_k: 0,
                ..SpecDiffConfig::default()
            },
            "target_top_k",
        ),
        (
            SpecDiffConfig {
                min_draft_prob: 1.5,
                ..SpecDiffConfig::default()
            },
            "min_draft_prob",
        ),
        (
            paced(Pace {
                row_cost: -1.0,
                ..Pace::cpu()
            }),
            "pace.row_cost",
        ),
        (
            paced(Pace {
                draft_cost: f32::INFINITY,
                ..Pace::cpu()
            }),
            "pace.draft_cost",
        ),
        (
            paced(Pace {
                weight: 0.0,
                ..Pace::cpu()
            }),
            "pace.weight",
        ),
        (
            paced(Pace {
                probe_every: 0,
                ..Pace::cpu()
            }),
            "pace.probe_every",
        ),
    ] {
        let e = SpecDiffDecoder::new(bad).unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    let e = d
        .decode(&mut target, &mut Broken(32, 99), &[], &cfg)
        .unwrap_err();
    assert!(matches!(e, Error::EmptyPrompt), "{e}");
}

/// The step-wise form: two requests driven in turns (each with its own cache) give what each
/// gives alone, and an answer out of turn is a typed error.
#[test]
fn requests_interleave_and_refuse_answers_out_of_turn() {
    use spot_specdiff::{ArNeed, SpecDiffRequest};
    let base = ToyCausalModel::new(40, 3);
    let mut drafter = ToyDrafter::new(base.clone(), 0.2, 4);
    let cfg = ArConfig {
        max_new_tokens: 50,
        temperature: 1.0,
        seed: 2,
        ..ArConfig::default()
    };
    let sd = SpecDiffConfig {
        k: 3,
        gamma: 6,
        ..SpecDiffConfig::default()
    };
    let prompts = [vec![1u32, 2], vec![7u32, 8, 9]];
    let info = spot_core::AutoregressiveModel::ar_info(&base).clone();
    let mut reqs: Vec<_> = prompts
        .iter()
        .map(|p| SpecDiffRequest::new(p, &cfg, sd, &info, 40).unwrap())
        .collect();
    let mut targets = [base.clone(), base.clone()];
    let mut m = Marginals::default();
    let e = reqs[0].scored(Default::default(), Vec::new()).unwrap_err();
    assert!(matches!(e, Error::RequestState { .. }), "{e}");
    let mut live = true;
    while live {
        live = false;
        for (r, t) in reqs.iter_mut().zip(&mut targets) {
            match r.need() {
                ArNeed::Draft { context, gamma } => {
                    drafter.propose(context, gamma, &mut m).unwrap();
                    r.drafted(&m).unwrap();
                }
                ArNeed::Score {
                    shared,
                    branches,
                    query,
                } => {
                    let (f, b) = spot_core::MeteredArModel::new(t)
                        .extend_branches(shared, branches, query)
                        .unwrap();
                    r.scored(f, b).unwrap();
                }
                ArNeed::Done => continue,
            }
            live = true;
        }
    }
    for (r, p) in reqs.iter().zip(&prompts) {
        let mut alone = base.clone();
        let want = SpecDiffDecoder::new(sd)
            .unwrap()
            .decode(&mut alone, &mut drafter, p, &cfg)
            .unwrap();
        let got = r.output().unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.forwards, want.forwards);
    }
}

/// A target whose branch statistics are short (a broken batched implementation) is a typed
/// error, not a panic.
#[test]
fn short_branch_statistics_are_typed_errors() {
    use spot_core::{ArGroup, ArInfo, ArScores, AutoregressiveModel, CacheSlot, CacheUsage};
    struct Short(ToyCausalModel);
    impl AutoregressiveModel for Short {
        fn ar_info(&self) -> &ArInfo {
            self.0.ar_info()
        }
        fn open_slot(&mut self) -> Result<CacheSlot> {
            self.0.open_slot()
        }
        fn close_slot(&mut self, slot: CacheSlot) {
            self.0.close_slot(slot)
        }
        fn cache_usage(&self) -> CacheUsage {
            self.0.cache_usage()
        }
        fn cached_len(&self, slot: CacheSlot) -> usize {
            self.0.cached_len(slot)
        }
        fn truncate(&mut self, slot: CacheSlot, len: usize) -> Result<()> {
            self.0.truncate(slot, len)
        }
        fn forward(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>> {
            // Statistics of each branch's first token only.
            let mut out = self.0.forward(groups)?;
            for s in out.iter_mut().flat_map(|s| &mut s.branches) {
                let mut first = spot_core::BlockStats::new(s.top_k());
                if !s.is_empty() {
                    let (top_ids, top_probs) = s.top(0);
                    first.push(spot_core::PositionStats {
                        token: s.token(0),
                        confidence: s.confidence(0),
                        token_prob: s.token_prob(0),
                        entropy: s.entropy(0),
                        tail_mass: s.tail_mass(0),
                        top_ids,
                        top_probs,
                    })?;
                }
                *s = first;
            }
            Ok(out)
        }
    }
    let base = ToyCausalModel::new(32, 1);
    let mut drafter = ToyDrafter::new(base.clone(), 0.0, 1);
    let cfg = ArConfig {
        max_new_tokens: 16,
        ..ArConfig::default()
    };
    let sd = SpecDiffConfig {
        k: 2,
        gamma: 4,
        ..SpecDiffConfig::default()
    };
    let e = SpecDiffDecoder::new(sd)
        .unwrap()
        .decode(&mut Short(base), &mut drafter, &[1], &cfg)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                what: "statistics per appended token",
                ..
            }
        ),
        "{e}"
    );
}

/// A drafter that counts the rounds that asked it for positions (`.1`) and answers none to
/// the first `.2` of them (as the feature drafter does before the target has run), then
/// drafts as `.0`.
struct Counting<D>(D, usize, usize);

impl<D: DiffusionDrafter> DiffusionDrafter for Counting<D> {
    fn name(&self) -> &str {
        "counting"
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        self.1 += usize::from(gamma > 0);
        if gamma > 0 && self.1 <= self.2 {
            *out = Marginals::new(1);
            return Ok(());
        }
        self.0.propose(context, gamma, out)
    }
}

/// One 200-token decode of the toy target at T = 0 (where a perfect drafter's every token is
/// accepted) by one greedy draft of 8 a round from a toy drafter wrong at rate `error` and
/// silent for its first `silent` rounds, checked equal to plain decoding; with the rounds the
/// drafter was asked for a draft.
fn paced_decode(error: f32, silent: usize, pace: Option<Pace>) -> (SpecDiffOutput, usize) {
    let mut target = ToyCausalModel::new(32, 7);
    let cfg = ArConfig {
        max_new_tokens: 200,
        early_stop: false,
        ..ArConfig::default()
    };
    let plain = decode_autoregressive(&mut target, &[1, 2], &cfg).unwrap();
    let sd = SpecDiffConfig {
        k: 1,
        gamma: 8,
        drafter_temperature: 0.0,
        pace,
        ..SpecDiffConfig::default()
    };
    let mut drafter = Counting(ToyDrafter::new(target.clone(), error, 11), 0, silent);
    let out = SpecDiffDecoder::new(sd)
        .unwrap()
        .decode(&mut target, &mut drafter, &[1, 2], &cfg)
        .unwrap();
    assert_eq!(out.tokens, plain.tokens, "error {error}, pace {pace:?}");
    (out, drafter.1)
}

/// A pace that probes one round in four.
fn probing_pace() -> Option<Pace> {
    Some(Pace {
        probe_every: 4,
        ..Pace::cpu()
    })
}

/// The pace stops drafting where drafts do not pay (one probe in `probe_every` rounds) and
/// keeps drafting where they do; the tokens never change.
#[test]
fn the_pace_drafts_only_while_drafting_pays() {
    // Drafts that are always wrong: every round drafts without a pace; with it, after the
    // running gain turns negative (from 1, a few rounds), one round in four.
    let (free, asked_free) = paced_decode(1.0, 0, None);
    let (paced, asked_paced) = paced_decode(1.0, 0, probing_pace());
    // (Only a last round with no room for a draft asks for none.)
    assert!(asked_free as u64 + 1 >= free.report.rounds);
    let rounds = paced.report.rounds as usize;
    assert!(rounds >= free.report.rounds as usize);
    assert!(
        asked_paced <= 8 + rounds / 4,
        "{asked_paced} drafted rounds of {rounds}"
    );
    assert!(paced.report.positions < free.report.positions);
    // Drafts that are always right: the pace never stops drafting.
    let (good, asked_good) = paced_decode(0.0, 0, probing_pace());
    assert!(
        asked_good as u64 + 1 >= good.report.rounds,
        "{:?}",
        good.report
    );
    assert!(good.report.tokens_per_round() > 4.0, "{:?}", good.report);
}

/// Rounds where the drafter answers no position cost the pace nothing: a perfect drafter that
/// is silent for its first 30 calls is still asked every round afterwards (before the fix,
/// those rounds counted as losses of `draft_cost` and turned the pace off).
#[test]
fn rounds_the_drafter_cannot_draft_do_not_count_against_it() {
    let (out, asked) = paced_decode(0.0, 30, probing_pace());
    assert!(out.report.rounds > 40, "{:?}", out.report);
    assert!(
        asked as u64 + 1 >= out.report.rounds,
        "asked {asked} of {} rounds",
        out.report.rounds
    );
}
