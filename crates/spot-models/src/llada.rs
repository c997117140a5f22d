//! LLaDA (GSAI-ML/LLaDA-8B-Base, -Instruct): a Llama-style masked diffusion model with full
//! bidirectional attention, decoded block by block over the whole sequence ([`FullSequence`]).
//!
//! Weight map (HF names, all `.weight`): `model.transformer.wte` (embedding),
//! `model.transformer.blocks.N.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm,
//! ff_proj (gate, SiLU applied), up_proj (up), ff_out (down)}`, `model.transformer.ln_f`,
//! `model.transformer.ff_out` (head; the embedding when `weight_tying`).
//!
//! RoPE theta 500000 with angles in f32, RMSNorm, no bias, no logit shift, mask 126336
//! (`mask_token_id`, else the tokenizer's `<|mdm_mask|>`). There is no exact prefix cache:
//! every forward recomputes the prompt, the committed blocks, the block state and the masked
//! future blocks.

use std::path::Path;

use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_core::BlockLayout;

use crate::config::Checker;
use crate::dense::{DenseNames, DenseSpec, dense_net};
use crate::frame::{FolderFacts, open};
use crate::full_sequence::FullSequence;
use crate::precision::Precision;
use crate::transformer::Geometry;
use spot_hf::Result;
use spot_hf::hf::read_json;

/// LLaDA's tensor names (OLMo style).
const LLADA_NAMES: DenseNames = DenseNames {
    embed: "model.transformer.wte.weight",
    head: "model.transformer.ff_out.weight",
    norm: "model.transformer.ln_f.weight",
    layer: "model.transformer.blocks.{n}.",
    input_norm: "attn_norm",
    attn: ["q_proj", "k_proj", "v_proj", "attn_out"],
    qk_norm: ["", ""],
    post_norm: "ff_norm",
    mlp: ["ff_proj", "up_proj", "ff_out"],
};

fn default_theta() -> f64 {
    10_000.0
}

fn default_eps() -> f64 {
    1e-5
}

fn yes() -> bool {
    true
}

/// `config.json` of a LLaDA checkpoint (OLMo-style field names). Unknown fields are ignored;
/// fields that would change the arithmetic are checked.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct LladaConfig {
    /// `"llada"`.
    pub model_type: String,
    /// Model width.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; defaults to the query heads (LLaDA-8B has no GQA).
    #[serde(default)]
    pub n_kv_heads: Option<usize>,
    /// Transformer layers.
    pub n_layers: usize,
    /// MLP width.
    pub mlp_hidden_size: usize,
    /// Vocabulary size (tokenizer).
    pub vocab_size: usize,
    /// Rows of the embedding and head; defaults to `vocab_size`.
    #[serde(default)]
    pub embedding_size: Option<usize>,
    /// Context limit.
    pub max_sequence_length: usize,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// The mask token (126336 for LLaDA-8B).
    #[serde(default)]
    pub mask_token_id: Option<u32>,
    /// EOS id, used when `generation_config.json` has none.
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// Head = embedding.
    #[serde(default)]
    pub weight_tying: bool,
    /// Must be false: biases on every linear layer.
    #[serde(default)]
    pub include_bias: bool,
    /// Must be false: q/k/v biases.
    #[serde(default)]
    pub include_qkv_bias: bool,
    /// Must be `"llama"` (SwiGLU blocks with separate q/k/v).
    #[serde(default)]
    pub block_type: Option<String>,
    /// Must be `"silu"`.
    #[serde(default)]
    pub activation_type: Option<String>,
    /// Must be `"rms"`.
    #[serde(default)]
    pub layer_norm_type: Option<String>,
    /// Must be true (RoPE positions).
    #[serde(default = "yes")]
    pub rope: bool,
    /// Must be false.
    #[serde(default)]
    pub alibi: bool,
    /// Must be false (no per-head norms).
    #[serde(default)]
    pub attention_layer_norm: bool,
    /// Must be false.
    #[serde(default)]
    pub input_emb_norm: bool,
    /// Must be false or absent.
    #[serde(default)]
    pub scale_logits: bool,
}

impl LladaConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Rows of the embedding and head.
    pub fn embedding_rows(&self) -> usize {
        self.embedding_size.unwrap_or(self.vocab_size)
    }

    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let cfg: Self = read_json(&path)?;
        cfg.check(&path)?;
        Ok(cfg)
    }

    fn check(&self, path: &Path) -> Result<()> {
        let c = Checker { path };
        c.model_type(&self.model_type, &["llada"])?;
        c.shape(&[
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.kv_heads()),
            ("n_layers", self.n_layers),
            ("mlp_hidden_size", self.mlp_hidden_size),
            ("vocab_size", self.vocab_size),
            ("embedding_size", self.embedding_rows()),
            ("max_sequence_length", self.max_sequence_length),
        ])?;
        c.heads("n_kv_heads", self.n_heads, self.kv_heads())?;
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(c.fail(
                "n_heads",
                format!(
                    "d_model {} is not a multiple of {} heads",
                    self.d_model, self.n_heads
                ),
            ));
        }
        c.even("d_model", self.d_model / self.n_heads)?;
        if self.embedding_rows() < self.vocab_size {
            return Err(c.fail(
                "embedding_size",
                format!(
                    "{} rows cannot hold the vocabulary of {}",
                    self.embedding_rows(),
                    self.vocab_size
                ),
            ));
        }
        for (field, value, want) in [
            ("block_type", &self.block_type, "llama"),
            ("activation_type", &self.activation_type, "silu"),
            ("layer_norm_type", &self.layer_norm_type, "rms"),
        ] {
            if let Some(v) = value
                && v != want
            {
                return Err(c.fail(field, format!("only {want:?} is supported, found {v:?}")));
            }
        }
        c.unsupported(
            "include_bias",
            self.include_bias,
            "biases are not supported",
        )?;
        c.unsupported(
            "include_qkv_bias",
            self.include_qkv_bias,
            "q/k/v biases are not supported",
        )?;
        c.unsupported("rope", !self.rope, "only RoPE positions are supported")?;
        c.unsupported("alibi", self.alibi, "ALiBi is not supported")?;
        c.unsupported(
            "attention_layer_norm",
            self.attention_layer_norm,
            "q/k layer norms are not supported",
        )?;
        c.unsupported(
            "input_emb_norm",
            self.input_emb_norm,
            "an embedding norm is not supported",
        )?;
        c.unsupported(
            "scale_logits",
            self.scale_logits,
            "logit scaling is not supported",
        )?;
        c.positive("rms_norm_eps", self.rms_norm_eps)?;
        c.positive("rope_theta", self.rope_theta)
    }
}

impl FolderFacts for LladaConfig {
    fn vocab(&self) -> usize {
        self.embedding_rows()
    }
    fn max_positions(&self) -> usize {
        self.max_sequence_length
    }
    fn mask_token_id(&self) -> Option<u32> {
        self.mask_token_id
    }
    fn eos(&self) -> Option<&serde_json::Value> {
        self.eos_token_id.as_ref()
    }
}

/// A LLaDA model on backend `B` (full-sequence block diffusion, no cache).
///
/// ```no_run
/// use spot_models::{CpuBackend, Llada};
/// let model = Llada::<CpuBackend>::load("LLaDA-8B-Instruct".as_ref(), &Default::default())?;
/// println!("{} parameters", model.parameter_count());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub type Llada<B> = FullSequence<B, LladaConfig>;

impl<B: Backend> FullSequence<B, LladaConfig> {
    /// Loads a LLaDA folder: `config.json`, `generation_config.json` (optional), safetensors
    /// (single or sharded), `tokenizer.json` (optional).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let cfg = LladaConfig::load(dir)?;
        let (frame, weights) = open::<B>(
            dir,
            &cfg,
            crate::family::Family::Llada.mask_tokens(),
            device,
        )?;
        let d = cfg.d_model / cfg.n_heads;
        let spec = DenseSpec {
            geo: Geometry {
                heads: cfg.n_heads,
                kv_heads: cfg.kv_heads(),
                head_dim: d,
                rotary_dim: d,
                rope_theta: cfg.rope_theta,
                eps: cfg.rms_norm_eps,
            },
            hidden: cfg.d_model,
            intermediate: cfg.mlp_hidden_size,
            vocab: cfg.embedding_rows(),
            layers: cfg.n_layers,
            tie: cfg.weight_tying,
            qkv_bias: false,
            qk_norm: false,
        };
        let net = dense_net(&spec, &LLADA_NAMES, &weights, (device, precision))?;
        // LLaDA's own sampler starts the first block right after the prompt
        // (tests/suites/families.rs checks it against tools/oracle/llada_sampler.py).
        Ok(Self::assemble(
            cfg,
            net,
            frame,
            false,
            BlockLayout::AfterPrompt,
        ))
    }
}
