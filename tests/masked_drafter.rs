//! SpecDiff-2's drafter on burn (`MaskedDrafter`), on a drafter folder made from the
//! `llama-tiny` fixture: its shifted layout, its cache across rounds, its file checks, and
//! SpecDiff-2 with it returning the target's own tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use spot_core::{ArConfig, MeteredArModel, StatsQuery, decode_autoregressive};
use spot_models::{CausalLm, CpuBackend, ModelError};
use spot_specdiff::{DRAFTER_FILE, MaskedDrafter};
use spot_specdiff::{DiffusionDrafter, Marginals, SpecDiffConfig, SpecDiffDecoder};

/// A committed fixture of spot-models.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/spot-models/tests/fixtures")
        .join(name)
}

/// A drafter folder: the fixture's files and `drafter_json`.
fn drafter_dir(drafter_json: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(fixture("llama-tiny").join(f), tmp.path().join(f)).unwrap();
    }
    std::fs::write(tmp.path().join(DRAFTER_FILE), drafter_json).unwrap();
    tmp
}

const GOOD: &str = r#"{"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": 3}"#;

fn load(dir: &Path) -> Result<MaskedDrafter<CpuBackend>, ModelError> {
    MaskedDrafter::<CpuBackend>::load(dir, &Default::default())
}

/// Drafted position 0 is the causal model's own next-token prediction (the shifted layout):
/// a drafter with the target's weights proposes the target's greedy token first, with the
/// target's probabilities; and marginals from a cache grown over rounds equal a fresh
/// drafter's.
#[test]
fn the_first_drafted_position_is_the_next_token_prediction() {
    let dir = drafter_dir(GOOD);
    let mut d = load(dir.path()).unwrap();
    let mut target =
        CausalLm::<CpuBackend>::load(&fixture("llama-tiny"), &Default::default()).unwrap();
    let context: Vec<u32> = vec![5, 17, 2, 40, 8, 9, 11];
    let q = StatsQuery {
        top_k: 4,
        ..StatsQuery::new(0.0, 0)
    };
    let mut m = Marginals::default();
    for cut in [3usize, 5, 7] {
        d.propose(&context[..cut], 6, &mut m).unwrap();
        assert_eq!(m.len(), 6);
        let mut t = MeteredArModel::new(&mut target);
        t.truncate(0).unwrap();
        let s = t.extend(&context[..cut], &q).unwrap();
        let last = s.len() - 1;
        let (ids, probs) = m.at(0);
        assert_eq!(ids, s.top(last).0, "cut {cut}");
        for (a, b) in probs.iter().zip(s.top(last).1) {
            assert!((a - b).abs() < 1e-6, "cut {cut}: {a} vs {b}");
        }
        // A fresh drafter (no cache) gives the same marginals, bit for bit.
        let mut fresh = load(dir.path()).unwrap();
        let mut again = Marginals::default();
        fresh.propose(&context[..cut], 6, &mut again).unwrap();
        assert_eq!(m, again, "cut {cut}");
    }
}

/// SpecDiff-2 with the drafter returns the target's tokens at T = 0 and 1.
#[test]
fn specdiff_with_the_masked_drafter_is_exact() {
    let dir = drafter_dir(GOOD);
    let mut d = load(dir.path()).unwrap();
    let mut target =
        CausalLm::<CpuBackend>::load(&fixture("llama-tiny"), &Default::default()).unwrap();
    for t in [0.0f32, 1.0] {
        let cfg = ArConfig {
            max_new_tokens: 24,
            temperature: t,
            seed: 4,
            ..ArConfig::default()
        };
        let want = decode_autoregressive(&mut target, &[5, 6, 7], &cfg).unwrap();
        let sd = SpecDiffConfig {
            k: 3,
            gamma: 5,
            ..SpecDiffConfig::default()
        };
        let got = SpecDiffDecoder::new(sd)
            .unwrap()
            .decode(&mut target, &mut d, &[5, 6, 7], &cfg)
            .unwrap();
        assert_eq!(got.tokens, want.tokens, "T = {t}");
        // The drafter has the target's weights: at T = 0 its first drafted token is always
        // the target's, so every round with drafts commits at least two tokens.
        if t == 0.0 {
            assert!(got.forwards < want.forwards, "{:?}", got.report);
        }
    }
}

#[test]
fn bad_drafter_files_are_typed_errors() {
    let missing = drafter_dir(GOOD);
    std::fs::remove_file(missing.path().join(DRAFTER_FILE)).unwrap();
    let e = load(missing.path()).unwrap_err();
    assert!(
        matches!(e, ModelError::Io { .. }) && e.to_string().contains(DRAFTER_FILE),
        "{e}"
    );
    for (json, field) in [
        (
            r#"{"format": "other", "version": 1, "mask_token_id": 3}"#,
            "format",
        ),
        (
            r#"{"format": "spot-specdiff-drafter", "version": 2, "mask_token_id": 3}"#,
            "version",
        ),
        (
            r#"{"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": 4000000000}"#,
            "mask_token_id",
        ),
        (
            r#"{"format": "spot-specdiff-drafter", "version": 1, "mask_token_id": 3, "extra": 1}"#,
            "extra",
        ),
        (
            r#"{"format": "spot-specdiff-drafter", "version": 1}"#,
            "mask_token_id",
        ),
        ("[1, 2", DRAFTER_FILE),
    ] {
        let e = load(drafter_dir(json).path()).unwrap_err();
        assert!(e.to_string().contains(field), "{json}: {e}");
    }
}
