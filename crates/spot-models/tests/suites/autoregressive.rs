//! Autoregressive Llama and Qwen2 in burn against the transformers oracle (fixtures made by
//! tools/oracle/ar_oracle.py): logits, the KV cache, greedy tokens, and that appending several
//! tokens in one forward gives the statistics of appending them one by one.

use crate::B;
use crate::common::{fixture, golden_logits};
use serde::Deserialize;
use spot_core::{
    ArConfig, ArGroup, AutoregressiveModel, CacheSlot, MeteredArModel, decode_autoregressive,
};
use spot_dlm::StatsQuery;
use spot_models::{CausalLm, Family};

const AR_FIXTURES: [&str; 2] = ["llama-tiny", "qwen2-tiny"];

#[derive(Deserialize)]
struct ArGolden {
    vocab_size: usize,
    stop_ids: Vec<u32>,
    logits_cases: Vec<ArLogits>,
    decode_cases: Vec<ArDecode>,
}

#[derive(Deserialize)]
struct ArLogits {
    key: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ArDecode {
    prompt: Vec<u32>,
    max_new_tokens: usize,
    early_stop: bool,
    stop_ids: Vec<u32>,
    tokens: Vec<u32>,
    stopped: bool,
}

fn golden(name: &str) -> ArGolden {
    let text = std::fs::read_to_string(fixture(name).join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The token ids of the fixture's longest logits case.
fn longest_ids(g: &ArGolden) -> &[u32] {
    &g.logits_cases
        .iter()
        .max_by_key(|c| c.ids.len())
        .unwrap()
        .ids
}

fn load(name: &str) -> CausalLm<B> {
    CausalLm::<B>::load(&fixture(name), &Default::default()).expect("fixture loads")
}

/// The slot of single-request use.
const S0: CacheSlot = CacheSlot(0);

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn ar_families_are_detected() {
    assert_eq!(
        Family::detect(&fixture("llama-tiny")).unwrap(),
        Family::Llama
    );
    assert_eq!(
        Family::detect(&fixture("qwen2-tiny")).unwrap(),
        Family::Qwen2
    );
    assert!(!Family::Llama.is_diffusion());
    // `qwen3` is SDAR only when the folder names an SDAR class; a plain Qwen3 is autoregressive.
    let dir = tempfile::tempdir().unwrap();
    let detect = |config: &str| {
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        Family::detect(dir.path()).unwrap()
    };
    let plain = r#"{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}"#;
    assert_eq!(detect(plain), Family::Qwen3);
    assert!(!Family::Qwen3.is_diffusion());
    assert_eq!(detect(r#"{"model_type": "qwen3"}"#), Family::Qwen3);
    let sdar = r#"{"model_type": "qwen3", "architectures": ["SDARForCausalLM"]}"#;
    assert_eq!(detect(sdar), Family::Sdar);
    let e = spot_models::DiffusionModel::<B>::load(&fixture("llama-tiny"), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("autoregressive"), "{e}");
}

/// Logits within 1e-4 of the oracle at every position, in one forward and with the sequence
/// split over two forwards through the KV cache.
#[test]
fn logits_match_transformers() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        assert_eq!(m.ar_info().vocab_size, g.vocab_size);
        assert_eq!(m.ar_info().stop_ids, g.stop_ids);
        for case in &g.logits_cases {
            let want = golden_logits(name, &case.key);
            m.truncate(S0, 0).unwrap();
            let whole = m.extend_logits(&case.ids).unwrap();
            let d = max_diff(&whole, &want);
            eprintln!("{name} {}: one forward max |diff| = {d:e}", case.key);
            assert!(d <= 1e-4, "{name} {}: {d}", case.key);
            let cut = case.ids.len() / 3;
            if cut > 0 {
                m.truncate(S0, 0).unwrap();
                let mut split = m.extend_logits(&case.ids[..cut]).unwrap().into_vec();
                split.extend(m.extend_logits(&case.ids[cut..]).unwrap());
                let d = max_diff(&split, &want);
                assert!(d <= 1e-4, "{name} {} cached: {d}", case.key);
            }
        }
    }
}

/// Greedy decoding returns exactly `generate(do_sample=False)`'s tokens and stop.
#[test]
fn greedy_tokens_match_transformers() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        for (i, case) in g.decode_cases.iter().enumerate() {
            let cfg = ArConfig {
                max_new_tokens: case.max_new_tokens,
                stop_ids: case.stop_ids.clone(),
                early_stop: case.early_stop,
                ..ArConfig::default()
            };
            let out = decode_autoregressive(&mut m, &case.prompt, &cfg).unwrap();
            assert_eq!(out.tokens, case.tokens, "{name} case {i}");
            assert_eq!(out.stopped, case.stopped, "{name} case {i}");
            assert_eq!(out.forwards as usize, out.tokens.len(), "{name} case {i}");
        }
    }
}

/// Appending a run of tokens in one forward (a verifier's batch: its first token appended,
/// the rest scored as a branch after it) gives bit-identical statistics to appending them one
/// at a time, at T = 0 and T = 1; rolling back with `truncate` and re-appending reproduces
/// them too.
#[test]
fn one_forward_equals_token_by_token() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        let ids = longest_ids(&g);
        for t in [0.0f32, 1.0] {
            let q = StatsQuery::new(t, 5);
            for (start, end) in [(0usize, 9usize), (4, 12), (11, 30)] {
                m.truncate(S0, 0).unwrap();
                if start > 0 {
                    MeteredArModel::new(&mut m)
                        .extend(&ids[..start], &q)
                        .unwrap();
                }
                let rest = vec![ids[start + 1..end].to_vec()];
                let (first, rest) = MeteredArModel::new(&mut m)
                    .extend_branches(&ids[start..start + 1], &rest, &q)
                    .unwrap();
                let together = |i: usize| {
                    if i == 0 {
                        (&first, 0)
                    } else {
                        (&rest[0], i - 1)
                    }
                };
                m.truncate(S0, start).unwrap();
                assert_eq!(m.cached_len(S0), start);
                for (i, &tok) in ids[start..end].iter().enumerate() {
                    let one = MeteredArModel::new(&mut m).extend(&[tok], &q).unwrap();
                    let (all, j) = together(i);
                    assert_eq!(one.token(0), all.token(j), "{name} T {t} {start}+{i}");
                    assert_eq!(one.top(0), all.top(j), "{name} T {t} {start}+{i}");
                    assert_eq!(
                        (one.confidence(0), one.entropy(0), one.tail_mass(0)),
                        (all.confidence(j), all.entropy(j), all.tail_mass(j)),
                        "{name} T {t} {start}+{i}"
                    );
                }
                assert_eq!(m.cached_len(S0), end);
            }
        }
    }
}

/// Several requests in one forward (each in its own slot, after prefixes of different
/// lengths, with branches of equal and of unequal lengths) get bit-identical statistics and
/// caches to each request's forward alone, at T = 0 and T = 1.
#[test]
fn groups_in_one_forward_equal_each_alone() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        let ids = longest_ids(&g);
        let v = g.vocab_size as u32;
        let branch = |b: u32, len: u32| {
            (0..len)
                .map(|i| (ids[i as usize] + 5 * b + i) % v)
                .collect()
        };
        let even: Vec<Vec<u32>> = (0..3).map(|b| branch(b, 4)).collect();
        let uneven: Vec<Vec<u32>> = vec![branch(1, 3), branch(2, 5), Vec::new(), branch(3, 1)];
        for t in [0.0f32, 1.0] {
            let q = StatsQuery::new(t, 11);
            let b = m.open_slot().unwrap();
            let slots = [(S0, &ids[..5], &ids[5..7]), (b, &ids[2..10], &ids[10..11])];
            let prefill = |m: &mut spot_models::CausalLm<B>| {
                for &(slot, prefix, _) in &slots {
                    m.truncate(slot, 0).unwrap();
                    MeteredArModel::in_slot(m, slot).extend(prefix, &q).unwrap();
                }
            };
            prefill(&mut m);
            let groups = [
                ArGroup {
                    slot: S0,
                    shared: slots[0].2,
                    branches: &even,
                    query: &q,
                },
                ArGroup {
                    slot: b,
                    shared: slots[1].2,
                    branches: &uneven,
                    query: &q,
                },
            ];
            let together = MeteredArModel::new(&mut m).forward_groups(&groups).unwrap();
            let after: Vec<usize> = slots.iter().map(|s| m.cached_len(s.0)).collect();
            assert_eq!(after, vec![7, 9], "{name}: only the shared runs are kept");
            prefill(&mut m);
            for (i, group) in groups.iter().enumerate() {
                let alone = MeteredArModel::new(&mut m)
                    .forward_groups(std::slice::from_ref(group))
                    .unwrap();
                assert_eq!(together[i], alone[0], "{name} T {t} group {i}");
            }
            assert_eq!(together[1].branches[2].len(), 0, "{name}: an empty branch");
            // The caches continue as if each request ran alone.
            let next = MeteredArModel::in_slot(&mut m, b)
                .extend(&ids[11..13], &q)
                .unwrap();
            m.truncate(b, 0).unwrap();
            let plain = MeteredArModel::in_slot(&mut m, b)
                .extend(&ids[2..13], &q)
                .unwrap();
            assert_eq!(next, plain, "{name} T {t}");
            m.close_slot(b);
            assert_eq!(m.cache_usage().slots, 1);
        }
    }
}

/// Sampling at T = 1 is a pure function of (seed, position): the same seed gives the same
/// tokens, another seed other tokens, and every token is in the vocabulary.
#[test]
fn sampling_is_seeded_and_reproducible() {
    for name in AR_FIXTURES {
        let mut m = load(name);
        let cfg = |seed| ArConfig {
            max_new_tokens: 24,
            temperature: 1.0,
            seed,
            early_stop: false,
            ..ArConfig::default()
        };
        let a = decode_autoregressive(&mut m, &[5, 6, 7], &cfg(1)).unwrap();
        let b = decode_autoregressive(&mut m, &[5, 6, 7], &cfg(1)).unwrap();
        let c = decode_autoregressive(&mut m, &[5, 6, 7], &cfg(2)).unwrap();
        assert_eq!(a.tokens, b.tokens, "{name}");
        assert_ne!(a.tokens, c.tokens, "{name}");
        let greedy = decode_autoregressive(
            &mut m,
            &[5, 6, 7],
            &ArConfig {
                temperature: 0.0,
                ..cfg(1)
            },
        )
        .unwrap();
        assert_ne!(
            a.tokens, greedy.tokens,
            "{name}: T = 1 should not be greedy"
        );
    }
}

/// SpecDiff-2's verification forward: `K` branches after a shared run, in one forward, give
/// each branch bit-identical statistics to appending it alone, keep the shared run (and only
/// it) in the cache, at T = 0 and T = 1.
#[test]
fn branches_in_one_forward_equal_each_alone() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        let ids = longest_ids(&g);
        let v = g.vocab_size as u32;
        let branches: Vec<Vec<u32>> = (0..4u32)
            .map(|b| {
                (0..6u32)
                    .map(|i| (ids[i as usize] + 7 * b + i) % v)
                    .collect()
            })
            .collect();
        for t in [0.0f32, 1.0] {
            let q = StatsQuery::new(t, 3);
            m.truncate(S0, 0).unwrap();
            let mut ar = MeteredArModel::new(&mut m);
            ar.extend(&ids[..5], &q).unwrap();
            let (shared, together) = ar.extend_branches(&ids[5..9], &branches, &q).unwrap();
            assert_eq!(ar.cached_len(), 9, "{name}: only the shared run is kept");
            // Each branch alone, token by token, then rolled back.
            for (b, branch) in branches.iter().enumerate() {
                for (i, &tok) in branch.iter().enumerate() {
                    let one = ar.extend(&[tok], &q).unwrap();
                    let x = &together[b];
                    assert_eq!(one.token(0), x.token(i), "{name} T {t} branch {b}+{i}");
                    assert_eq!(one.top(0), x.top(i), "{name} T {t} branch {b}+{i}");
                    assert_eq!(one.entropy(0), x.entropy(i), "{name} T {t} branch {b}+{i}");
                }
                ar.truncate(9).unwrap();
            }
            ar.truncate(5).unwrap();
            let alone_shared = ar.extend(&ids[5..9], &q).unwrap();
            // The last shared entry (the one a round reads) is the one returned.
            assert_eq!(shared.len(), 1);
            assert_eq!(shared, alone_shared, "{name} T {t}");
            assert_eq!(ar.cached_len(), 9);
            // And the cache holds the shared run as if appended alone.
            let next = ar.extend(&ids[9..11], &q).unwrap();
            ar.truncate(0).unwrap();
            let plain = ar.extend(&ids[..11], &q).unwrap();
            assert_eq!(next, plain, "{name} T {t}");
        }
    }
}

/// The feature tap: a forward over two requests with equal-length and uneven branches leaves
/// one run per appended segment and per non-empty branch, at the right positions, whose rows
/// are bit-identical to appending those tokens alone (a branch's features are its tokens'
/// features when it is the text that follows); another tap replaces the first.
#[test]
fn the_feature_tap_holds_each_run_s_own_rows() {
    let name = "llama-tiny";
    let g = golden(name);
    let ids = longest_ids(&g);
    let v = g.vocab_size as u32;
    let branch = |b: u32, len: u32| -> Vec<u32> {
        (0..len)
            .map(|i| (ids[i as usize] + 5 * b + i) % v)
            .collect()
    };
    let q = StatsQuery::new(0.0, 3);
    let mut m = load(name);
    let tap = m.tap_features(&[1, 0]).unwrap();
    assert_eq!(tap.width(), 2 * 64);
    let b = m.open_slot().unwrap();
    let even: Vec<Vec<u32>> = (0..3).map(|k| branch(k, 4)).collect();
    let uneven = vec![branch(1, 3), Vec::new(), branch(3, 1)];
    MeteredArModel::in_slot(&mut m, S0)
        .extend(&ids[..5], &q)
        .unwrap();
    let groups = [
        ArGroup {
            slot: S0,
            shared: &ids[5..7],
            branches: &even,
            query: &q,
        },
        ArGroup {
            slot: b,
            shared: &ids[2..6],
            branches: &uneven,
            query: &q,
        },
    ];
    tap.take();
    MeteredArModel::new(&mut m).forward_groups(&groups).unwrap();
    let runs = tap.take();
    let layout: Vec<(CacheSlot, usize, Vec<u32>)> = runs
        .iter()
        .map(|r| (r.slot, r.start, r.tokens.clone()))
        .collect();
    let mut want = vec![(S0, 5, ids[5..7].to_vec())];
    want.extend(even.iter().map(|e| (S0, 7, e.clone())));
    want.push((b, 0, ids[2..6].to_vec()));
    want.extend([(b, 4, uneven[0].clone()), (b, 4, uneven[2].clone())]);
    assert_eq!(layout, want);
    assert!(tap.take().is_empty(), "taken");
    // Each run alone: the prefix appended, then the run's tokens appended in one forward.
    for r in &runs {
        let mut alone = load(name);
        let t = alone.tap_features(&[1, 0]).unwrap();
        let prefix = if r.slot == S0 {
            &ids[..r.start]
        } else {
            &ids[2..2 + r.start]
        };
        if !prefix.is_empty() {
            MeteredArModel::in_slot(&mut alone, S0)
                .extend(prefix, &q)
                .unwrap();
        }
        t.take();
        MeteredArModel::in_slot(&mut alone, S0)
            .extend(&r.tokens, &q)
            .unwrap();
        let own = t.take();
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].features.len(), r.tokens.len() * 128);
        assert!(
            own[0].features == r.features,
            "run at {} of {:?}: max diff {}",
            r.start,
            r.slot,
            max_diff(&own[0].features, &r.features)
        );
    }
    // A second tap of the same layers shares the first's runs.
    let same = m.tap_features(&[1, 0]).unwrap();
    MeteredArModel::in_slot(&mut m, S0)
        .extend(&ids[7..8], &q)
        .unwrap();
    assert_eq!(tap.take()[0].tokens, ids[7..8]);
    assert!(same.take().is_empty(), "taken through the first handle");
    // A tap of other layers replaces it: the first hears nothing more.
    let second = m.tap_features(&[0]).unwrap();
    MeteredArModel::in_slot(&mut m, S0)
        .extend(&ids[8..9], &q)
        .unwrap();
    assert!(tap.take().is_empty());
    assert_eq!(second.take()[0].features.len(), 64);
    assert!(m.tap_features(&[2]).is_err(), "layer 2 of 2");
    assert!(m.tap_features(&[]).is_err());
}
