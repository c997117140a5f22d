//! SDAR: the Qwen3 architecture decoded as a block-diffusion model (JetLM/SDAR-*).
//!
//! Weight map (HF names): `model.embed_tokens`, `model.layers.N.{input_layernorm,
//! post_attention_layernorm}`, `model.layers.N.self_attn.{q,k,v,o}_proj`,
//! `model.layers.N.self_attn.{q,k}_norm`, `model.layers.N.mlp.{gate,up,down}_proj`,
//! `model.norm`, `lm_head` (absent when tied); all `.weight`.
//!
//! Attention is block-causal with an exact prefix KV cache ([`BlockCausal`]); no logit shift;
//! the mask is `mask_token_id` or the tokenizer's `<|MASK|>`.

use std::path::Path;

use burn_tensor::backend::Backend;

use crate::block_causal::BlockCausal;
use crate::config::{Checker, DecoderConfig};
use crate::error::Result;
use crate::frame::{Frame, MaskSpec};
use crate::hf::Weights;
use crate::transformer::{Attention, Layer, Loader, Mlp, Net};

/// `config.json` of an SDAR (or plain Qwen3) checkpoint: `model_type` `"sdar"` or `"qwen3"`,
/// no attention bias.
pub type SdarConfig = DecoderConfig;

/// An SDAR model on backend `B`, with its prefix KV cache.
///
/// ```no_run
/// use spot_models::{Sdar, CpuBackend};
/// let model = Sdar::<CpuBackend>::load("path/to/SDAR-1.7B-Chat".as_ref(), &Default::default())?;
/// println!("{} parameters", model.parameter_count());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub type Sdar<B> = BlockCausal<B, SdarConfig>;

/// Loads the layers of a Qwen-style folder (`model.layers.N.self_attn.*`, `mlp.*`), with q/k/v
/// biases when `bias` and per-head QK-norm when `qk_norm`. Shared by SDAR, Dream, and the
/// autoregressive Qwen2/Llama models.
pub(crate) fn qwen_style_net<B: Backend>(
    cfg: &DecoderConfig,
    weights: &Weights,
    device: &B::Device,
    bias: bool,
    qk_norm: bool,
) -> Result<Net<B>> {
    let ld = Loader::<B> {
        weights,
        device: device.clone(),
    };
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (nh, kvh, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let head = ld.embedding_and_head(
        "model.embed_tokens.weight",
        "lm_head.weight",
        cfg.tie_word_embeddings,
        v,
        h,
    )?;
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for n in 0..cfg.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{n}.{s}");
        let w = |s: &str| p(&format!("{s}.weight"));
        let biases = if bias {
            Some([
                ld.row(&p("self_attn.q_proj.bias"), nh * d)?,
                ld.row(&p("self_attn.k_proj.bias"), kvh * d)?,
                ld.row(&p("self_attn.v_proj.bias"), kvh * d)?,
            ])
        } else {
            None
        };
        let norms = if qk_norm {
            Some([
                ld.head_norm(&w("self_attn.q_norm"), d)?,
                ld.head_norm(&w("self_attn.k_norm"), d)?,
            ])
        } else {
            None
        };
        layers.push(Layer {
            input_norm: ld.row(&w("input_layernorm"), h)?,
            attn: Attention {
                q: ld.linear(&w("self_attn.q_proj"), nh * d, h)?,
                k: ld.linear(&w("self_attn.k_proj"), kvh * d, h)?,
                v: ld.linear(&w("self_attn.v_proj"), kvh * d, h)?,
                o: ld.linear(&w("self_attn.o_proj"), h, nh * d)?,
                bias: biases,
                qk_norm: norms,
            },
            post_norm: ld.row(&w("post_attention_layernorm"), h)?,
            mlp: Mlp::Dense(ld.dense(
                [&w("mlp.gate_proj"), &w("mlp.up_proj"), &w("mlp.down_proj")],
                i,
                h,
            )?),
        });
    }
    let norm = ld.row("model.norm.weight", h)?;
    Ok(Net::new(cfg.geometry(), device.clone(), head, layers, norm))
}

impl<B: Backend> BlockCausal<B, SdarConfig> {
    /// Loads an SDAR folder: `config.json`, `generation_config.json` (optional),
    /// `model.safetensors` or a sharded index, and `tokenizer.json` (optional; needed to
    /// resolve the mask token when the config does not name it, and for text).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        let (cfg, path) = DecoderConfig::read(dir)?;
        cfg.check(&path, &["sdar", "qwen3"])?;
        Checker { path: &path }.unsupported(
            "attention_bias",
            cfg.attention_bias,
            "q/k/v biases are not supported for SDAR",
        )?;
        let frame = Frame::open(
            dir,
            cfg.vocab_size,
            cfg.max_position_embeddings,
            Some(MaskSpec {
                configured: cfg.mask_token_id,
                tokens: &["<|MASK|>"],
            }),
            cfg.eos_token_id.as_ref(),
            device,
        )?;
        let weights = Weights::open(dir)?;
        let net = qwen_style_net(&cfg, &weights, device, false, true)?;
        Ok(Self::assemble(cfg, net, frame))
    }
}
