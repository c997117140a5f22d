//! The drafter that reads the target (`FeatureDrafter`, the `models` feature): its drafts
//! against the PyTorch definition it is trained in (`tools/specdiff/feature_oracle.py` wrote
//! the fixture), SpecDiff-2 with it token-identical to plain decoding at every temperature, and
//! typed errors for bad drafter folders.
#![cfg(feature = "models")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use spot_core::{ArConfig, AutoregressiveModel, MeteredArModel, StatsQuery, decode_autoregressive};
use spot_models::{CausalLm, CpuBackend, ModelError};
use spot_specdiff::{
    DiffusionDrafter, FeatureDrafter, Marginals, Selection, SpecDiffConfig, SpecDiffDecoder,
};

type B = CpuBackend;

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../spot-models/tests/fixtures/llama-tiny")
}

fn drafter_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/feature-drafter-tiny")
}

/// The same layout in autoregressive mode (the EAGLE-style baseline).
fn ar_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/feature-drafter-ar-tiny")
}

/// Loads a fixture drafter; the autoregressive one drafts every position asked for.
fn load(dir: &Path, t: &mut CausalLm<B>) -> FeatureDrafter {
    let mut d = FeatureDrafter::load(dir, t).unwrap();
    d.set_stop_below(0.0);
    d
}

fn target() -> CausalLm<B> {
    CausalLm::<B>::load(&target_dir(), &Default::default()).unwrap()
}

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    ids: Vec<u32>,
    gamma: usize,
    top_ids: Vec<Vec<u32>>,
    top_probs: Vec<Vec<f32>>,
}

#[test]
fn drafts_match_the_pytorch_definition() {
    for dir in [drafter_dir(), ar_dir()] {
        drafts_match(&dir);
    }
}

fn drafts_match(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("golden.json")).unwrap();
    let golden: Golden = serde_json::from_str(&text).unwrap();
    for case in &golden.cases {
        let mut t = target();
        let mut d = load(dir, &mut t);
        // The verification forward that runs the context but its last token.
        let n = case.ids.len();
        let query = StatsQuery::new(0.0, 0);
        MeteredArModel::new(&mut t)
            .extend_branches(&case.ids[..n - 1], &[], &query)
            .unwrap();
        let mut m = Marginals::new(4);
        d.propose(&case.ids, case.gamma, &mut m).unwrap();
        assert_eq!(d.cached(), n - 1, "every run token's features are cached");
        assert_eq!(m.len(), case.gamma);
        for i in 0..case.gamma {
            let (ids, probs) = m.at(i);
            let at = format!("{}: context of {n}, position {i}", dir.display());
            assert_eq!(ids, &case.top_ids[i][..], "{at}");
            for (p, q) in probs.iter().zip(&case.top_probs[i]) {
                assert!((p - q).abs() < 1e-4, "{at}: {p} vs {q}");
            }
        }
    }
}

#[test]
fn speculative_equals_plain_decoding_at_every_temperature() {
    for dir in [drafter_dir(), ar_dir()] {
        speculative_equals_plain(&dir);
    }
}

fn speculative_equals_plain(dir: &Path) {
    let mut t = target();
    let mut d = load(dir, &mut t);
    let mut drafted = 0;
    for (k, temperature) in [(1, 0.0), (1, 0.8), (2, 1.0), (1, 1.5)] {
        for (p, prompt) in [vec![5u32, 9, 17], vec![300, 2, 2, 41, 77, 9, 120, 8]]
            .iter()
            .enumerate()
        {
            let cfg = ArConfig {
                max_new_tokens: 40,
                temperature,
                seed: 11 + p as u64,
                early_stop: false,
                ..ArConfig::default()
            };
            let sd = SpecDiffConfig {
                k,
                gamma: 4,
                drafter_temperature: if k > 1 { 1.0 } else { 0.0 },
                selection: Selection::LongestAccepted,
                min_draft_prob: 0.0,
                ..SpecDiffConfig::default()
            };
            let out = SpecDiffDecoder::new(sd)
                .unwrap()
                .decode(&mut t, &mut d, prompt, &cfg)
                .unwrap();
            let plain = decode_autoregressive(&mut t, prompt, &cfg).unwrap();
            assert_eq!(
                out.tokens,
                plain.tokens,
                "{}: k {k}, T {temperature}, prompt {p}",
                dir.display()
            );
            drafted += out.report.positions as usize - prompt.len() - out.tokens.len();
        }
    }
    assert!(
        drafted > 100,
        "the drafter drafted ({drafted} drafted rows)"
    );
}

/// A copy of the drafter fixture with `edit` applied to its JSON file.
fn edited(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let out = dir.join("drafter");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(
        drafter_dir().join("model.safetensors"),
        out.join("model.safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(drafter_dir().join("specdiff-drafter.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    std::fs::write(out.join("specdiff-drafter.json"), v.to_string()).unwrap();
    out
}

#[test]
fn bad_drafter_folders_get_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let field = |edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = edited(tmp.path(), edit);
        match FeatureDrafter::load(&dir, &mut target()).unwrap_err() {
            ModelError::InvalidConfig { field, path, .. } => {
                assert!(path.ends_with("specdiff-drafter.json"));
                field
            }
            e => panic!("{e}"),
        }
    };
    assert_eq!(field(&|v| v["format"] = "other".into()), "format");
    assert_eq!(field(&|v| v["version"] = 2.into()), "version");
    assert_eq!(field(&|v| v["taps"] = serde_json::json!([2])), "taps");
    assert_eq!(field(&|v| v["taps"] = serde_json::json!([])), "taps");
    assert_eq!(
        field(&|v| v["draft_positions"] = 0.into()),
        "draft_positions"
    );
    assert_eq!(
        field(&|v| v["shortlist"] = serde_json::json!([384])),
        "shortlist"
    );
    // A third layer the weights lack: the tensor is named.
    let dir = edited(tmp.path(), |v| v["layers"] = 3.into());
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(e.to_string().contains("layers.2."), "{e}");
    // Three taps need a wider `fc`: the weights file is named.
    let dir = edited(tmp.path(), |v| v["taps"] = serde_json::json!([0, 1, 1]));
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(e.to_string().contains("fc.weight"), "{e}");
    // No weights file.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    // Not JSON.
    std::fs::write(dir.join("specdiff-drafter.json"), "{").unwrap();
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(matches!(e, ModelError::Json { .. }), "{e}");
    // A block drafter's weights called autoregressive: `inp.weight` is missing, and named.
    let dir = edited(tmp.path(), |v| v["mode"] = "autoregressive".into());
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(e.to_string().contains("inp.weight"), "{e}");
    // An unknown mode: the JSON error names the variants.
    let dir = edited(tmp.path(), |v| v["mode"] = "sideways".into());
    let e = FeatureDrafter::load(&dir, &mut target()).unwrap_err();
    assert!(
        matches!(&e, ModelError::Json { .. }) && e.to_string().contains("autoregressive"),
        "{e}"
    );
}

#[test]
fn the_recommended_settings_are_valid() {
    let mut t = target();
    let d = FeatureDrafter::load(&drafter_dir(), &mut t).unwrap();
    let r = d.recommended();
    r.validate().unwrap();
    assert_eq!((r.k, r.gamma), (1, 4));
    assert_eq!(t.ar_info().vocab_size, d.vocab_size());
}

/// A folder with a lookup store (`"store"`): decodes stay token-identical to plain decoding at
/// T = 0 and 1, and where the store holds the target's own continuations of the prompts (the
/// store drafts them with high calibrated probability) the rounds take the store's drafts:
/// fewer forwards than the network alone. A store the folder lacks is a typed error naming
/// the field.
#[test]
fn a_store_in_the_folder_drafts_what_the_target_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = target();
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|i| vec![5 + i, 9 + 3 * i, 17, 40 + i])
        .collect();
    let cfg = |temperature: f32| ArConfig {
        max_new_tokens: 32,
        temperature,
        seed: 3,
        early_stop: false,
        ..ArConfig::default()
    };
    // Each continuation twice, so that the store's calibration (each fold guessed from the
    // others) finds its guesses right.
    let mut lines = String::new();
    for p in &prompts {
        let out = decode_autoregressive(&mut t, p, &cfg(0.0)).unwrap();
        let line = serde_json::json!({"prompt_ids": p, "tokens": out.tokens}).to_string();
        lines += &format!("{line}\n{line}\n");
    }
    let dir = edited(tmp.path(), |v| v["store"] = "store.jsonl".into());
    std::fs::write(dir.join("store.jsonl"), lines).unwrap();
    // One drafter per target: a target feeds the features of its forwards to the last
    // drafter that tapped it.
    let mut t_store = target();
    let mut with_store = FeatureDrafter::load(&dir, &mut t_store).unwrap();
    let mut plain_net = FeatureDrafter::load(&drafter_dir(), &mut t).unwrap();
    let sd = plain_net.recommended();
    let mut forwards = [0u64; 2];
    for temperature in [0.0, 1.0] {
        for p in &prompts[..3] {
            let want = decode_autoregressive(&mut t, p, &cfg(temperature)).unwrap();
            for (i, (m, d)) in [(&mut t, &mut plain_net), (&mut t_store, &mut with_store)]
                .into_iter()
                .enumerate()
            {
                let got = SpecDiffDecoder::new(sd)
                    .unwrap()
                    .decode(m, d, p, &cfg(temperature))
                    .unwrap();
                assert_eq!(got.tokens, want.tokens, "T {temperature}, store {i}");
                if temperature == 0.0 {
                    forwards[i] += got.forwards;
                }
            }
        }
    }
    assert!(
        forwards[1] < forwards[0],
        "forwards at T = 0 without / with the store: {forwards:?}"
    );
    // The store file missing.
    std::fs::remove_file(dir.join("store.jsonl")).unwrap();
    match FeatureDrafter::load(&dir, &mut t).unwrap_err() {
        ModelError::InvalidConfig { field, .. } => assert_eq!(field, "store"),
        e => panic!("{e}"),
    }
}
