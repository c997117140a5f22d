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
use crate::dense::{QWEN_NAMES, dense_net};
use crate::frame::open;
use crate::precision::Precision;
use spot_hf::Result;

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

impl<B: Backend> BlockCausal<B, SdarConfig> {
    /// Loads an SDAR folder: `config.json`, `generation_config.json` (optional),
    /// `model.safetensors` or a sharded index, and `tokenizer.json` (optional; needed to
    /// resolve the mask token when the config does not name it, and for text).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let (cfg, path) = DecoderConfig::read(dir)?;
        cfg.check(&path, &["sdar", "qwen3"])?;
        Checker { path: &path }.unsupported(
            "attention_bias",
            cfg.attention_bias,
            "q/k/v biases are not supported for SDAR",
        )?;
        let (frame, weights) =
            open::<B>(dir, &cfg, crate::family::Family::Sdar.mask_tokens(), device)?;
        let net = dense_net(
            &cfg.dense_spec(false, true),
            &QWEN_NAMES,
            &weights,
            (device, precision),
        )?;
        Ok(Self::assemble(cfg, net, frame))
    }
}
