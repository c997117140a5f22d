//! Autoregressive Llama and Qwen2 in burn against the transformers oracle (fixtures made by
//! tools/oracle/ar_oracle.py): logits, the KV cache, greedy tokens, and that appending several
//! tokens in one forward gives the statistics of appending them one by one.

use crate::B;
use crate::common::{fixture, golden_logits};
use serde::Deserialize;
use spot_core::{ArConfig, AutoregressiveModel, decode_autoregressive};
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
            m.truncate(0).unwrap();
            let whole = m.extend_logits(&case.ids).unwrap();
            let d = max_diff(&whole, &want);
            eprintln!("{name} {}: one forward max |diff| = {d:e}", case.key);
            assert!(d <= 1e-4, "{name} {}: {d}", case.key);
            let cut = case.ids.len() / 3;
            if cut > 0 {
                m.truncate(0).unwrap();
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

/// Appending a run of tokens in one forward (a verifier's batch) gives bit-identical
/// statistics to appending them one at a time, at T = 0 and T = 1; rolling back with
/// `truncate` and re-appending reproduces them too.
#[test]
fn one_forward_equals_token_by_token() {
    for name in AR_FIXTURES {
        let g = golden(name);
        let mut m = load(name);
        let ids = longest_ids(&g);
        for t in [0.0f32, 1.0] {
            let q = StatsQuery::new(t, 5);
            for (start, end) in [(0usize, 9usize), (4, 12), (11, 30)] {
                m.truncate(0).unwrap();
                if start > 0 {
                    m.extend(&ids[..start], &q).unwrap();
                }
                let together = m.extend(&ids[start..end], &q).unwrap();
                m.truncate(start).unwrap();
                assert_eq!(m.cached_len(), start);
                for (i, &tok) in ids[start..end].iter().enumerate() {
                    let one = m.extend(&[tok], &q).unwrap();
                    assert_eq!(one.token(0), together.token(i), "{name} T {t} {start}+{i}");
                    assert_eq!(one.top(0), together.top(i), "{name} T {t} {start}+{i}");
                    assert_eq!(
                        (one.confidence(0), one.entropy(0), one.tail_mass(0)),
                        (
                            together.confidence(i),
                            together.entropy(i),
                            together.tail_mass(i)
                        ),
                        "{name} T {t} {start}+{i}"
                    );
                }
                assert_eq!(m.cached_len(), end);
            }
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
            m.truncate(0).unwrap();
            m.extend(&ids[..5], &q).unwrap();
            let (shared, together) = m.extend_branches(&ids[5..9], &branches, &q).unwrap();
            assert_eq!(m.cached_len(), 9, "{name}: only the shared run is kept");
            m.truncate(5).unwrap();
            let (alone_shared, alone) =
                spot_core::autoregressive::extend_each(&mut m, &ids[5..9], &branches, &q).unwrap();
            // The last shared entry (the one a round reads) is the one returned.
            assert_eq!(shared.len(), 1);
            let last = alone_shared.len() - 1;
            assert_eq!(shared.token(0), alone_shared.token(last), "{name} T {t}");
            assert_eq!(shared.top(0), alone_shared.top(last), "{name} T {t}");
            assert_eq!(
                (shared.confidence(0), shared.entropy(0)),
                (alone_shared.confidence(last), alone_shared.entropy(last))
            );
            assert_eq!(together, alone, "{name} T {t}");
            assert_eq!(m.cached_len(), 9);
            // And the cache holds the shared run as if appended alone.
            let next = m.extend(&ids[9..11], &q).unwrap();
            m.truncate(0).unwrap();
            let plain = m.extend(&ids[..11], &q).unwrap();
            assert_eq!(next.token(1), plain.token(10), "{name} T {t}");
            assert_eq!(next.top(1), plain.top(10), "{name} T {t}");
        }
    }
}
