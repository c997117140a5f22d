//! Property tests of the step-wise decoding API: requests decoded together through one
//! [`BatchDriver`] (merged forwards, continuous batching) return exactly what each returns
//! alone: tokens, counters and traces; cancellation and stop checks behave as documented.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cases, decode_config, model, prompt, rule, toy_config, transition};
use proptest::prelude::*;
use spot_dlm::toy::ToyModel;
use spot_dlm::{
    BatchDriver, BlockDiffusionModel, DecodeConfig, DecodeOutput, DraftFreeDecoder, MeteredModel,
    Need, RandomScorer, Request, SpotDecoder, StaleConfidenceScorer, Strategy as Decoder, TokenId,
};

/// How one request of a batch decodes.
#[derive(Clone, Debug)]
enum Method {
    DraftFree,
    Tree(usize),
    Chain(usize),
    Random(u64),
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::DraftFree),
        (1usize..=16).prop_map(Method::Tree),
        (1usize..=16).prop_map(Method::Chain),
        any::<u64>().prop_map(Method::Random),
    ]
}

fn strategy(m: &Method) -> Decoder {
    let b = SpotDecoder::builder().record_trace(true);
    match m {
        Method::DraftFree => Decoder::DraftFree(DraftFreeDecoder::new().with_trace(true)),
        Method::Tree(d) => b
            .budget(*d)
            .scorer(StaleConfidenceScorer)
            .build()
            .unwrap()
            .into(),
        Method::Chain(d) => b.budget(*d).chain().build().unwrap().into(),
        Method::Random(seed) => b
            .scorer(RandomScorer { seed: *seed })
            .build()
            .unwrap()
            .into(),
    }
}

/// Decodes one request alone through the single-request API.
fn alone(
    m: &mut ToyModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    method: &Method,
) -> DecodeOutput {
    let mut s = strategy(method);
    let r = Request::new(prompt, cfg, m.info(), &mut s)
        .unwrap()
        .with_trace(true);
    spot_dlm::run_request(m, r, &mut ()).unwrap()
}

type Job = (Vec<TokenId>, DecodeConfig, Method);

fn jobs(vocab: usize) -> impl Strategy<Value = Vec<Job>> {
    prop::collection::vec(
        (prompt(vocab), decode_config(transition(), rule()), method()),
        1..7,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 4, ..ProptestConfig::default() })]

    /// Mixed prompts, lengths, block sizes, temperatures, transitions and methods, at every
    /// in-flight limit: each request's output equals its output alone, bit for bit.
    #[test]
    fn batched_requests_equal_alone(
        (toy, jobs) in toy_config().prop_flat_map(|t| (Just(t.clone()), jobs(t.vocab_size))),
        in_flight in 1usize..=8,
    ) {
        let mut m = model(&toy);
        let expected: Vec<DecodeOutput> =
            jobs.iter().map(|(p, c, me)| alone(&mut m, p, c, me)).collect();
        let info = m.info().clone();
        let mut driver = BatchDriver::new(in_flight).unwrap();
        for (p, c, me) in &jobs {
            let r = Request::new(p, c, &info, strategy(me)).unwrap().with_trace(true);
            driver.submit(r);
        }
        let mut events = vec![Vec::new(); jobs.len()];
        let mut done = Vec::new();
        while !driver.is_idle() {
            prop_assert!(driver.live() <= in_flight);
            done.extend(driver.step(&mut m).unwrap());
            while let Some((id, e)) = driver.next_event() {
                events[id as usize].push(e);
            }
        }
        prop_assert_eq!(done.len(), jobs.len());
        for f in done {
            let out = f.output.unwrap();
            let want = &expected[f.id as usize];
            prop_assert_eq!(&out, want);
            // One event per finished block, the last one marked, their tokens the output's.
            let ev = &events[f.id as usize];
            prop_assert_eq!(ev.len() as u64, out.stats.blocks);
            prop_assert!(ev.last().unwrap().last);
            let streamed: Vec<TokenId> = ev.iter().flat_map(|e| e.tokens.clone()).collect();
            prop_assert_eq!(streamed, out.generated);
        }
    }
}

fn toy() -> ToyModel {
    ToyModel::new(spot_dlm::toy::ToyConfig::default())
}

fn long_cfg() -> DecodeConfig {
    DecodeConfig {
        block_size: 8,
        max_new_tokens: 64,
        early_stop: false,
        temperature: 1.0,
        seed: 9,
        ..DecodeConfig::default()
    }
}

/// The toy model, the long decode's config and info, and the draft-free decode of `[3, 4, 5]`.
fn long_case() -> (ToyModel, DecodeConfig, spot_dlm::ModelInfo, DecodeOutput) {
    let mut m = toy();
    let cfg = long_cfg();
    let info = m.info().clone();
    let reference = DraftFreeDecoder::new()
        .decode(&mut m, &[3, 4, 5], &cfg)
        .unwrap();
    (m, cfg, info, reference)
}

/// A request cancelled while its forward runs (from another thread: a server's client that
/// went away) drops that forward's answer and finishes as cancelled, not failed.
#[test]
fn cancellation_during_a_forward_is_not_a_failure() {
    let (mut m, cfg, info, reference) = long_case();
    let mut m = MeteredModel::new(&mut m);
    for cancel_at in [0usize, 1, 5] {
        let mut r = Request::new(&[3, 4, 5], &cfg, &info, DraftFreeDecoder::new()).unwrap();
        let handle = r.cancel_handle();
        let mut answers = 0;
        loop {
            let cancel_now = answers == cancel_at;
            match r.need() {
                Need::Prefill {
                    prefix,
                    block_size,
                    generation_end,
                } => {
                    let u = m.reset_prefix(prefix, block_size, generation_end).unwrap();
                    if cancel_now {
                        handle.cancel();
                    }
                    r.prefix_done(u).unwrap();
                }
                Need::Score {
                    states,
                    query,
                    carry,
                } => {
                    let scores = m.forward_carrying(carry, states, query).unwrap();
                    if cancel_now {
                        handle.cancel();
                    }
                    r.scored_group(scores).unwrap();
                }
                Need::Done => break,
            }
            answers += 1;
        }
        assert_eq!(
            answers,
            cancel_at + 1,
            "nothing is asked after the cancelled answer"
        );
        let out = r.finish().unwrap();
        assert!(out.cancelled);
        assert_eq!(
            out.generated[..],
            reference.generated[..out.generated.len()]
        );
    }
}

/// A request cancelled in the middle needs nothing more at once (no further forward), and
/// returns the blocks it finished; the other requests of the batch are unaffected.
#[test]
fn cancellation_stops_within_one_forward() {
    let (mut m, cfg, info, reference) = long_case();
    let mut driver = BatchDriver::new(2).unwrap();
    let a = driver.submit(Request::new(&[3, 4, 5], &cfg, &info, Decoder::draft_free()).unwrap());
    let b = driver.submit(Request::new(&[3, 4, 5], &cfg, &info, Decoder::draft_free()).unwrap());
    let cancel = driver.cancel_handle(a).unwrap();
    let mut finished = Vec::new();
    for _ in 0..12 {
        finished.extend(driver.step(&mut m).unwrap());
    }
    cancel.cancel();
    let forwards = driver.forwards();
    finished.extend(driver.step(&mut m).unwrap());
    // `a` left at this step, before any forward of its own.
    let fa = finished.iter().position(|f| f.id == a).unwrap();
    let out_a = finished.remove(fa).output.unwrap();
    assert!(out_a.cancelled);
    assert!(out_a.stats.blocks >= 1 && out_a.stats.blocks < 8);
    assert_eq!(
        out_a.generated[..],
        reference.generated[..out_a.generated.len()]
    );
    assert_eq!(driver.forwards(), forwards + 1); // `b`'s forward only
    finished.extend(driver.run(&mut m).unwrap());
    let out_b = finished
        .into_iter()
        .find(|f| f.id == b)
        .unwrap()
        .output
        .unwrap();
    assert!(!out_b.cancelled);
    assert_eq!(out_b, reference);

    // A single request: cancelled from its observer after the second block, it stops there.
    let r = Request::new(&[3, 4, 5], &cfg, &info, DraftFreeDecoder::new()).unwrap();
    let handle = r.cancel_handle();
    let mut seen = 0;
    let mut observer = |_: &spot_dlm::BlockProgress<'_>| {
        seen += 1;
        if seen == 2 {
            handle.cancel();
        }
    };
    let out = spot_dlm::run_request(&mut m, r, &mut observer).unwrap();
    assert!(out.cancelled);
    assert_eq!(out.stats.blocks, 2);
    assert_eq!(
        out.generated[..],
        reference.generated[..out.generated.len()]
    );
}

/// A stop check (as stop strings are checked on decoded text) ends decoding at the block
/// where it fires and cuts the output where it says, for every method alike.
#[test]
fn stop_checks_end_at_the_block_and_cut() {
    let mut m = toy();
    let cfg = long_cfg();
    let reference = DraftFreeDecoder::new()
        .decode(&mut m, &[7, 7], &cfg)
        .unwrap();
    // Stop once 20 tokens exist; keep 13.
    let check = |out: &[TokenId]| (out.len() >= 20).then_some(13);
    for method in [Method::DraftFree, Method::Tree(8), Method::Chain(4)] {
        let r = Request::new(&[7, 7], &cfg, m.info(), strategy(&method))
            .unwrap()
            .with_stop_check(check);
        let out = spot_dlm::run_request(&mut m, r, &mut ()).unwrap();
        assert!(out.stopped, "{method:?}");
        assert_eq!(out.tokens[..], reference.tokens[..13], "{method:?}");
        // Blocks of 8 after a 2-token prompt: 6 + 8 + 8 = 22 tokens when it fires.
        assert_eq!(out.stats.blocks, 3, "{method:?}");
    }
}

/// Answers out of order are typed errors, and `finish` before the end is refused.
#[test]
fn out_of_order_answers_are_errors() {
    let m = toy();
    let cfg = long_cfg();
    let mut r = Request::new(&[1], &cfg, m.info(), DraftFreeDecoder::new()).unwrap();
    assert!(matches!(r.need(), Need::Prefill { .. }));
    let err = r.scored(Vec::new(), 0).unwrap_err();
    assert!(err.to_string().contains("needed a prefill"), "{err}");
    let err = r.finish().unwrap_err();
    assert!(err.to_string().contains("request protocol"), "{err}");
    assert!(BatchDriver::<Decoder>::new(0).is_err());
}
