//! `config.json` of the Qwen/Llama-style families, and the checks every family config runs.

use std::path::Path;

use serde::Deserialize;

use crate::dense::DenseSpec;
use crate::frame::FolderFacts;
use crate::transformer::Geometry;
use spot_hf::hf::read_json;
use spot_hf::{ModelError, Result};

fn default_theta() -> f64 {
    10_000.0
}

/// The `config.json` fields of the HF decoder families this crate runs with standard names:
/// SDAR (Qwen3), Dream (Qwen2), autoregressive Qwen2 and Llama, and the attention part of
/// LLaDA2.0. Unknown fields are ignored; a missing required field is an error naming it. Each
/// family checks the values it supports when it loads.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct DecoderConfig {
    /// The family, e.g. `"sdar"`, `"Dream"`, `"qwen2"`, `"llama"`.
    pub model_type: String,
    /// Vocabulary size of the embedding and head.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width (of the dense layers).
    pub intermediate_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head dimension; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Context limit.
    pub max_position_embeddings: usize,
    /// Whether the head reuses the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// q/k/v (and o) biases (Llama's flag; Qwen2 always has q/k/v biases).
    #[serde(default)]
    pub attention_bias: bool,
    /// Must be `silu`.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Must be null (no RoPE scaling is implemented).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Block size the model was trained with (block-diffusion folders; optional).
    #[serde(default)]
    pub block_size: Option<usize>,
    /// The mask token id of block-diffusion families; when absent it is resolved from the
    /// tokenizer.
    #[serde(default)]
    pub mask_token_id: Option<u32>,
    /// EOS id(s), used when `generation_config.json` has none.
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

impl DecoderConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Reads `dir/config.json` (unchecked: see [`DecoderConfig::check`]), returning the
    /// file's path too.
    pub fn read(dir: &Path) -> Result<(Self, std::path::PathBuf)> {
        let path = dir.join("config.json");
        let cfg: Self = read_json(&path)?;
        Ok((cfg, path))
    }

    /// The checks shared by the families: `model_type` is one of `model_types`, and the
    /// shapes, head counts, activation, RoPE scaling, epsilon and theta are usable (errors
    /// name `path` and the field).
    pub fn check(&self, path: &Path, model_types: &[&str]) -> Result<()> {
        let c = Checker { path };
        c.model_type(&self.model_type, model_types)?;
        c.shape(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
            ("max_position_embeddings", self.max_position_embeddings),
        ])?;
        c.heads(
            "num_key_value_heads",
            self.num_attention_heads,
            self.kv_heads(),
        )?;
        c.even("head_dim", self.head_dim())?;
        c.silu("hidden_act", self.hidden_act.as_deref())?;
        c.no_scaling("rope_scaling", self.rope_scaling.as_ref())?;
        c.positive("rms_norm_eps", self.rms_norm_eps)?;
        c.positive("rope_theta", self.rope_theta)
    }

    /// The dense decoder these shapes describe.
    pub(crate) fn dense_spec(&self, qkv_bias: bool, qk_norm: bool) -> DenseSpec {
        DenseSpec {
            geo: self.geometry(),
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            vocab: self.vocab_size,
            layers: self.num_hidden_layers,
            tie: self.tie_word_embeddings,
            qkv_bias,
            qk_norm,
        }
    }

    /// The attention geometry, RoPE over the whole head.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            heads: self.num_attention_heads,
            kv_heads: self.kv_heads(),
            head_dim: self.head_dim(),
            rotary_dim: self.head_dim(),
            rope_theta: self.rope_theta,
            eps: self.rms_norm_eps,
        }
    }
}

impl FolderFacts for DecoderConfig {
    fn vocab(&self) -> usize {
        self.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }
    fn mask_token_id(&self) -> Option<u32> {
        self.mask_token_id
    }
    fn eos(&self) -> Option<&serde_json::Value> {
        self.eos_token_id.as_ref()
    }
    fn block_size(&self) -> Option<usize> {
        self.block_size
    }
}

/// The largest size a config field may give (2^24): above every released model's vocabulary,
/// widths, layer counts and context lengths, and small enough that nothing sized from it alone
/// can exhaust memory before the weights are checked against it.
pub(crate) const MAX_DIM: usize = 1 << 24;

/// Config checks that name the file and field at fault.
pub(crate) struct Checker<'p> {
    pub path: &'p Path,
}

impl Checker<'_> {
    /// An [`ModelError::InvalidConfig`] for `field`.
    pub fn fail(&self, field: &'static str, reason: String) -> ModelError {
        ModelError::InvalidConfig {
            path: self.path.to_path_buf(),
            field,
            reason,
        }
    }

    pub fn model_type(&self, found: &str, allowed: &[&str]) -> Result<()> {
        if allowed.contains(&found) {
            return Ok(());
        }
        Err(self.fail(
            "model_type",
            format!("expected one of {allowed:?}, found {found:?}"),
        ))
    }

    /// Every size positive and at most [`MAX_DIM`]: a damaged or hostile file is refused
    /// before anything is allocated from it.
    pub fn shape(&self, dims: &[(&'static str, usize)]) -> Result<()> {
        for &(field, v) in dims {
            if v == 0 {
                return Err(self.fail(field, "must be positive".to_string()));
            }
            if v > MAX_DIM {
                return Err(self.fail(
                    field,
                    format!("{v} is larger than any model this crate loads (at most {MAX_DIM})"),
                ));
            }
        }
        Ok(())
    }

    pub fn heads(&self, field: &'static str, heads: usize, kv: usize) -> Result<()> {
        if kv > 0 && heads.is_multiple_of(kv) {
            return Ok(());
        }
        Err(self.fail(
            field,
            format!("{heads} query heads are not a multiple of {kv} key/value heads"),
        ))
    }

    pub fn even(&self, field: &'static str, v: usize) -> Result<()> {
        if v.is_multiple_of(2) {
            return Ok(());
        }
        Err(self.fail(field, format!("RoPE needs an even size, got {v}")))
    }

    pub fn silu(&self, field: &'static str, act: Option<&str>) -> Result<()> {
        match act {
            Some(a) if a != "silu" => {
                Err(self.fail(field, format!("only \"silu\" is supported, found {a:?}")))
            }
            _ => Ok(()),
        }
    }

    pub fn no_scaling(&self, field: &'static str, v: Option<&serde_json::Value>) -> Result<()> {
        if v.is_some_and(|v| !v.is_null()) {
            return Err(self.fail(field, "RoPE scaling is not supported".to_string()));
        }
        Ok(())
    }

    pub fn positive(&self, field: &'static str, v: f64) -> Result<()> {
        if v.is_finite() && v > 0.0 {
            return Ok(());
        }
        Err(self.fail(field, format!("must be positive, got {v}")))
    }

    /// Fails with `reason` when `flag` is set.
    pub fn unsupported(&self, field: &'static str, flag: bool, reason: &str) -> Result<()> {
        if flag {
            return Err(self.fail(field, reason.to_string()));
        }
        Ok(())
    }
}
