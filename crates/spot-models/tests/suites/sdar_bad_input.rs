//! Broken model folders give typed errors that name the file, field or tensor.

use std::collections::BTreeMap;
use std::path::Path;

use crate::B;
use crate::common::*;
use safetensors::Dtype;
use spot_dlm::{BlockDiffusionModel, BlockState, DecodeConfig, DraftFreeDecoder};
use spot_models::{HeadPlacement, ModelError, Sdar};

fn try_load(dir: &Path) -> Result<Sdar<B>, ModelError> {
    Sdar::<B>::load(dir, &Default::default())
}

fn err_string(r: Result<Sdar<B>, ModelError>) -> (ModelError, String) {
    let e = r.expect_err("load must fail");
    let s = e.to_string();
    (e, s)
}

#[test]
fn missing_files() {
    let (_t, dir) = copy("sdar-tiny");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (e, s) = err_string(try_load(&dir));
    assert!(matches!(e, ModelError::Io { .. }), "{s}");
    assert!(s.contains("model.safetensors"), "{s}");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(e, ModelError::Io { .. }) && s.contains("config.json"),
        "{s}"
    );
}

#[test]
fn config_fields() {
    let (_t, dir) = copy("sdar-tiny");
    edit_config(&dir, |c| {
        c.insert("some_future_field".into(), serde_json::json!({"x": 1}));
    });
    try_load(&dir).expect("unknown fields are ignored");
    edit_config(&dir, |c| {
        c.remove("hidden_size");
    });
    let (e, s) = err_string(try_load(&dir));
    assert!(matches!(e, ModelError::Json { .. }), "{s}");
    assert!(
        s.contains("config.json") && s.contains("hidden_size"),
        "{s}"
    );

    let cases: [(&str, serde_json::Value, &str); 6] = [
        ("model_type", serde_json::json!("llama"), "model_type"),
        (
            "num_attention_heads",
            serde_json::json!(3),
            "num_key_value_heads",
        ),
        ("mask_token_id", serde_json::json!(384), "mask_token_id"),
        ("attention_bias", serde_json::json!(true), "attention_bias"),
        ("hidden_act", serde_json::json!("gelu"), "hidden_act"),
        (
            "rope_scaling",
            serde_json::json!({"type": "yarn"}),
            "rope_scaling",
        ),
    ];
    for (key, value, field) in cases {
        let (_t, dir) = copy("sdar-tiny");
        edit_config(&dir, |c| {
            c.insert(key.into(), value.clone());
        });
        match try_load(&dir) {
            Err(ModelError::InvalidConfig { field: f, .. }) => assert_eq!(f, field, "{key}"),
            Err(other) => panic!("{key}: expected InvalidConfig, got {other}"),
            Ok(_) => panic!("{key}: loaded"),
        }
    }
}

#[test]
fn mask_token_resolution() {
    // Without mask_token_id the tokenizer's <|MASK|> is used.
    let (_t, dir) = copy("sdar-tiny");
    edit_config(&dir, |c| {
        c.remove("mask_token_id");
    });
    assert_eq!(try_load(&dir).unwrap().info().mask_id, 372);
    // Without both: an error naming the field.
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(
            e,
            ModelError::InvalidConfig {
                field: "mask_token_id",
                ..
            }
        ),
        "{s}"
    );
    // A corrupt tokenizer is a tokenizer error naming the file.
    let (_t, dir) = copy("sdar-tiny");
    std::fs::write(dir.join("tokenizer.json"), "{ not json").unwrap();
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(e, ModelError::Tokenizer { .. }) && s.contains("tokenizer.json"),
        "{s}"
    );
}

#[test]
fn truncated_weights() {
    let (_t, dir) = copy("sdar-tiny");
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    for cut in [4usize, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let (e, s) = err_string(try_load(&dir));
        assert!(
            matches!(e, ModelError::Safetensors { .. }),
            "cut {cut}: {s}"
        );
        assert!(s.contains("model.safetensors"), "{s}");
    }
}

#[test]
fn missing_misshaped_and_mistyped_tensors() {
    let name = "model.layers.1.self_attn.k_norm.weight";
    let (_t, dir) = copy("sdar-tiny");
    let p = dir.join("model.safetensors");
    let orig = tensors(&p);

    let mut t = orig.clone();
    t.remove(name);
    write(&p, &t);
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(&e, ModelError::MissingTensor { name: n, .. } if n == name),
        "{s}"
    );

    let mut t = orig.clone();
    t.insert(name.into(), (Dtype::F32, vec![8], vec![0u8; 32]));
    write(&p, &t);
    match try_load(&dir) {
        Err(ModelError::TensorShape {
            name: n,
            expected,
            actual,
        }) => {
            assert_eq!(n, name);
            assert_eq!(expected, vec![16]);
            assert_eq!(actual, vec![8]);
        }
        other => panic!("expected TensorShape, got {:?}", other.err()),
    }

    let mut t = orig.clone();
    t.insert(name.into(), (Dtype::I64, vec![16], vec![0u8; 128]));
    write(&p, &t);
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(&e, ModelError::TensorDtype { name: n, .. } if n == name),
        "{s}"
    );

    // An untied model without lm_head.weight: the head is missing.
    let (_t2, dir) = copy("sdar-tiny-bf16");
    let p = dir.join("model.safetensors");
    let mut t = tensors(&p);
    t.remove("lm_head.weight");
    write(&p, &t);
    let (e, s) = err_string(try_load(&dir));
    assert!(
        matches!(&e, ModelError::MissingTensor { name: n, .. } if n == "lm_head.weight"),
        "{s}"
    );
}

#[test]
fn sharded_weights_load_identically() {
    let (_t, dir) = copy("sdar-tiny-bf16");
    let p = dir.join("model.safetensors");
    let all = tensors(&p);
    std::fs::remove_file(&p).unwrap();
    let (a, b): (BTreeMap<_, _>, BTreeMap<_, _>) =
        all.into_iter().partition(|(n, _)| n.contains("layers.0"));
    write(&dir.join("model-00001-of-00002.safetensors"), &a);
    write(&dir.join("model-00002-of-00002.safetensors"), &b);
    let mut map = serde_json::Map::new();
    for n in a.keys() {
        map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
    }
    for n in b.keys() {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let mut sharded = try_load(&dir).unwrap();
    let mut single = load::<B>("sdar-tiny-bf16");
    let s = BlockState::masked(8, 372);
    assert_eq!(
        sharded.forward_logits(std::slice::from_ref(&s)).unwrap(),
        single.forward_logits(std::slice::from_ref(&s)).unwrap()
    );
}

#[test]
fn nan_weights_and_long_prompts_are_errors_not_panics() {
    let (_t, dir) = copy("sdar-tiny");
    let p = dir.join("model.safetensors");
    let mut t = tensors(&p);
    let nan: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), 64)
        .flatten()
        .collect();
    t.insert("model.norm.weight".into(), (Dtype::F32, vec![64], nan));
    write(&p, &t);
    let mut m = try_load(&dir).unwrap();
    let cfg = DecodeConfig {
        block_size: 8,
        max_new_tokens: 8,
        ..DecodeConfig::default()
    };
    // Both placements of the output layer name the first NaN position.
    for placement in [HeadPlacement::Host, HeadPlacement::Device] {
        m.set_head_placement(placement);
        let e = DraftFreeDecoder::new()
            .decode(&mut m, &[1, 2, 3], &cfg)
            .unwrap_err();
        assert!(
            matches!(
                e,
                spot_dlm::core::Error::NonFiniteLogits {
                    position: 3,
                    reason: "NaN logit"
                }
            ),
            "{placement:?}: {e}"
        );
    }

    let mut m = load::<B>("sdar-tiny");
    let e = DraftFreeDecoder::new()
        .decode(
            &mut m,
            &vec![5; 500],
            &DecodeConfig {
                block_size: 8,
                max_new_tokens: 16,
                ..DecodeConfig::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            spot_dlm::core::Error::SequenceTooLong {
                max_positions: 512,
                ..
            }
        ),
        "{e}"
    );
    // Out-of-vocabulary ids in a state reach the model as a typed error.
    let e = m
        .score(
            &[BlockState::from_tokens(vec![9999; 8], 372)],
            &spot_dlm::StatsQuery::new(0.0, 0),
        )
        .unwrap_err();
    assert!(e.to_string().contains("9999"), "{e}");
}
