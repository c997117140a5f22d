//! Broken LLaDA, Dream, LLaDA2.0-MoE and autoregressive folders give typed errors that name the
//! file, field or tensor: wrong `model_type`, mismatched head counts, a vocabulary smaller than
//! the mask id, missing expert tensors, unsupported options, NaN weights.

use std::path::Path;

use crate::B;
use crate::common::*;
use serde_json::{Value, json};
use spot_dlm::{BlockDiffusionModel, BlockState, StatsQuery};
use spot_models::{CausalLm, DiffusionModel, ModelError};

fn try_load(dir: &Path) -> Result<DiffusionModel<B>, ModelError> {
    DiffusionModel::<B>::load(dir, &Default::default())
}

/// Loads `name` with `config.json` edited by `edits` (a null value removes the field) and
/// expects an `InvalidConfig` naming `field`.
fn expect_field(name: &str, edits: &[(&str, Value)], field: &str) {
    let (_t, dir) = copy(name);
    edit_config(&dir, |c| {
        for (k, v) in edits {
            if v.is_null() {
                c.remove(*k);
            } else {
                c.insert((*k).to_string(), v.clone());
            }
        }
    });
    let r = if name.contains("llama") || name.contains("qwen2") {
        CausalLm::<B>::load(&dir, &Default::default()).map(|_| ())
    } else {
        try_load(&dir).map(|_| ())
    };
    match r {
        Err(ModelError::InvalidConfig { field: f, path, .. }) => {
            assert_eq!(f, field, "{name} {edits:?}");
            assert!(path.ends_with("config.json"), "{name}: {path:?}");
        }
        Err(other) => panic!("{name} {edits:?}: expected InvalidConfig({field}), got {other}"),
        Ok(()) => panic!("{name} {edits:?}: loaded"),
    }
}

#[test]
fn wrong_model_type() {
    for name in [
        "llada-tiny",
        "dream-tiny",
        "llada2-moe-tiny",
        "llama-tiny",
        "qwen2-tiny",
    ] {
        expect_field(name, &[("model_type", json!("gpt_neox"))], "model_type");
    }
    // A folder of one family loaded as another is refused by that family's loader.
    let e = spot_models::Llada::<B>::load(&fixture("dream-tiny"), &Default::default()).unwrap_err();
    assert!(e.to_string().contains("d_model"), "{e}");
    let e =
        spot_models::Sdar::<B>::load(&fixture("llada2-moe-tiny"), &Default::default()).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::InvalidConfig {
                field: "model_type",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn mismatched_head_counts() {
    expect_field("llada-tiny", &[("n_kv_heads", json!(3))], "n_kv_heads");
    expect_field("llada-tiny", &[("n_heads", json!(3))], "n_kv_heads");
    expect_field(
        "llada-tiny",
        &[("n_heads", json!(6)), ("n_kv_heads", json!(6))],
        "n_heads",
    );
    expect_field(
        "dream-tiny",
        &[("num_key_value_heads", json!(3))],
        "num_key_value_heads",
    );
    expect_field(
        "llada2-moe-tiny",
        &[("num_attention_heads", json!(3))],
        "num_key_value_heads",
    );
    expect_field(
        "qwen2-tiny",
        &[("num_key_value_heads", json!(0))],
        "num_key_value_heads",
    );
    // Heads that divide but disagree with the weights: the tensor is named with both shapes.
    let (_t, dir) = copy("dream-tiny");
    edit_config(&dir, |c| {
        c.insert("num_key_value_heads".into(), json!(4));
    });
    let e = try_load(&dir).unwrap_err();
    match &e {
        ModelError::TensorShape {
            name,
            expected,
            actual,
        } => {
            assert!(name.contains("k_proj"), "{e}");
            assert_ne!(expected, actual);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn vocabulary_smaller_than_the_mask_id() {
    expect_field(
        "llada-tiny",
        &[("mask_token_id", json!(384))],
        "mask_token_id",
    );
    expect_field(
        "dream-tiny",
        &[("mask_token_id", json!(9999))],
        "mask_token_id",
    );
    // LLaDA2 names no mask in config.json: the tokenizer's <|mask|> (372) is outside 300.
    expect_field(
        "llada2-moe-tiny",
        &[("vocab_size", json!(300))],
        "mask_token_id",
    );
    // No tokenizer and no mask_token_id: the error says where it looked.
    let (_t, dir) = copy("llada2-moe-tiny");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = try_load(&dir).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::InvalidConfig {
                field: "mask_token_id",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}

#[test]
fn unsupported_options() {
    expect_field(
        "llada-tiny",
        &[("include_bias", json!(true))],
        "include_bias",
    );
    expect_field(
        "llada-tiny",
        &[("block_type", json!("sequential"))],
        "block_type",
    );
    expect_field("llada-tiny", &[("alibi", json!(true))], "alibi");
    expect_field(
        "llada-tiny",
        &[("embedding_size", json!(100))],
        "embedding_size",
    );
    expect_field(
        "dream-tiny",
        &[("rope_scaling", json!({"type": "yarn"}))],
        "rope_scaling",
    );
    expect_field("llada2-moe-tiny", &[("n_group", json!(3))], "n_group");
    expect_field("llada2-moe-tiny", &[("topk_group", json!(5))], "topk_group");
    expect_field(
        "llada2-moe-tiny",
        &[("num_experts_per_tok", json!(9))],
        "num_experts_per_tok",
    );
    expect_field(
        "llada2-moe-tiny",
        &[("score_function", json!("softmax"))],
        "score_function",
    );
    expect_field(
        "llada2-moe-tiny",
        &[("use_qkv_bias", json!(true))],
        "use_qkv_bias",
    );
    expect_field(
        "llada2-moe-tiny",
        &[("first_k_dense_replace", json!(4))],
        "first_k_dense_replace",
    );
    expect_field(
        "llada2-moe-tiny",
        &[
            ("rotary_dim", Value::Null),
            ("partial_rotary_factor", json!(0.3)),
        ],
        "partial_rotary_factor",
    );
    expect_field("llama-tiny", &[("hidden_act", json!("gelu"))], "hidden_act");
    // A missing required field is a JSON error naming the file and the field.
    let (_t, dir) = copy("llada2-moe-tiny");
    edit_config(&dir, |c| {
        c.remove("num_experts");
    });
    let e = try_load(&dir).unwrap_err();
    assert!(
        matches!(e, ModelError::Json { .. }) && e.to_string().contains("num_experts"),
        "{e}"
    );
}

fn without_tensor(name: &str, tensor: &str) -> ModelError {
    let (_t, dir) = copy(name);
    let p = dir.join("model.safetensors");
    let mut t = tensors(&p);
    assert!(t.remove(tensor).is_some(), "{name} has no {tensor}");
    write(&p, &t);
    if name.contains("llama") || name.contains("qwen2") {
        CausalLm::<B>::load(&dir, &Default::default()).unwrap_err()
    } else {
        try_load(&dir).unwrap_err()
    }
}

#[test]
fn missing_tensors_are_named() {
    for (name, tensor) in [
        (
            "llada2-moe-tiny",
            "model.layers.1.mlp.experts.3.up_proj.weight",
        ),
        ("llada2-moe-tiny", "model.layers.2.mlp.gate.expert_bias"),
        (
            "llada2-moe-tiny",
            "model.layers.2.mlp.shared_experts.down_proj.weight",
        ),
        ("llada2-moe-tiny", "model.layers.0.mlp.gate_proj.weight"),
        (
            "llada2-moe-tiny",
            "model.layers.1.attention.query_key_value.weight",
        ),
        ("llada-tiny", "model.transformer.blocks.1.ff_out.weight"),
        ("llada-tiny", "model.transformer.ff_out.weight"),
        ("dream-tiny", "model.layers.0.self_attn.q_proj.bias"),
        ("qwen2-tiny", "model.layers.1.self_attn.v_proj.bias"),
        ("llama-tiny", "model.embed_tokens.weight"),
    ] {
        match without_tensor(name, tensor) {
            ModelError::MissingTensor { name: n, .. } => assert_eq!(n, tensor, "{name}"),
            other => panic!("{name} without {tensor}: {other}"),
        }
    }
}

#[test]
fn nan_weights_are_errors_not_panics() {
    // A NaN in an expert bias is refused at load, naming the tensor.
    let (_t, dir) = copy("llada2-moe-tiny");
    let p = dir.join("model.safetensors");
    let mut t = tensors(&p);
    let bias = t.get_mut("model.layers.1.mlp.gate.expert_bias").unwrap();
    bias.2[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    write(&p, &t);
    let e = try_load(&dir).unwrap_err();
    assert!(e.to_string().contains("expert_bias"), "{e}");
    // A NaN in a router weight surfaces as invalid statistics from the forward.
    for (name, tensor) in [
        ("llada2-moe-tiny", "model.layers.1.mlp.gate.weight"),
        ("llada-tiny", "model.transformer.blocks.0.q_proj.weight"),
        ("dream-tiny", "model.layers.0.self_attn.k_proj.bias"),
    ] {
        let (_t, dir) = copy(name);
        let p = dir.join("model.safetensors");
        let mut t = tensors(&p);
        let w = t.get_mut(tensor).unwrap();
        for b in w.2.chunks_exact_mut(4) {
            b.copy_from_slice(&f32::NAN.to_le_bytes());
        }
        write(&p, &t);
        let mut m = try_load(&dir).unwrap();
        let mask = m.info().mask_id;
        m.prefill(&[], 8, 16).unwrap();
        let mut meter = spot_dlm::MeteredModel::new(&mut m);
        let e = meter
            .forward(&[BlockState::masked(8, mask)], &StatsQuery::new(0.0, 0))
            .unwrap_err();
        assert!(
            e.to_string().contains("statistic")
                || e.to_string().contains("NaN")
                || e.to_string().contains("finite"),
            "{name}: {e}"
        );
    }
}

#[test]
fn requests_past_the_context_are_errors() {
    for name in ["llada-tiny", "dream-tiny"] {
        let mut m = try_load(&fixture(name)).unwrap();
        assert!(m.prefill(&[], 8, 100_000).is_err(), "{name}");
    }
    let mut m = CausalLm::<B>::load(&fixture("llama-tiny"), &Default::default()).unwrap();
    let e = m.extend_logits(&vec![5; 600]).unwrap_err();
    assert!(e.to_string().contains("max_position_embeddings"), "{e}");
    let e = m.extend_logits(&[9999]).unwrap_err();
    assert!(e.to_string().contains("9999"), "{e}");
}
