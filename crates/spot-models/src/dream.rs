//! Dream (Dream-org/Dream-v0-Base-7B, -Instruct-7B): Qwen2.5 weights with non-causal attention,
//! decoded block by block over the whole sequence ([`FullSequence`]).
//!
//! Weight map: the Qwen2 names (`model.embed_tokens`, `model.layers.N.self_attn.{q,k,v}_proj`
//! with `.weight` and `.bias`, `o_proj.weight`, `model.layers.N.mlp.{gate,up,down}_proj`,
//! `input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`).
//!
//! Logits are shifted right by one: token `i` is predicted from position `i - 1` (position 0
//! keeps its own row). Mask 151666 (`mask_token_id`, else the tokenizer's `<|mask|>`).
//! Dream's confidence rules (max probability, top-1 minus top-2 margin, negative entropy) are
//! [`spot_core::ConfidenceRule`]s of the decoders.

use std::path::Path;

use burn_tensor::backend::Backend;
use spot_core::BlockLayout;

use crate::config::DecoderConfig;
use crate::dense::{QWEN_NAMES, dense_net};
use crate::frame::open;
use crate::full_sequence::FullSequence;
use crate::precision::Precision;
use spot_hf::Result;

/// `config.json` of a Dream checkpoint: Qwen2 fields, `model_type` `"Dream"`.
pub type DreamConfig = DecoderConfig;

/// A Dream model on backend `B` (full-sequence block diffusion with shifted logits).
///
/// ```no_run
/// use spot_models::{CpuBackend, Dream};
/// let model = Dream::<CpuBackend>::load("Dream-v0-Instruct-7B".as_ref(), &Default::default())?;
/// println!("{} parameters", model.parameter_count());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub type Dream<B> = FullSequence<B, DreamConfig>;

impl<B: Backend> FullSequence<B, DreamConfig> {
    /// Loads a Dream folder: `config.json`, `generation_config.json` (optional), safetensors
    /// (single or sharded), `tokenizer.json` (optional).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let (cfg, path) = DecoderConfig::read(dir)?;
        cfg.check(&path, &["Dream", "dream"])?;
        let (frame, weights) = open::<B>(
            dir,
            &cfg,
            crate::family::Family::Dream.mask_tokens(),
            device,
        )?;
        let net = dense_net(
            &cfg.dense_spec(true, false),
            &QWEN_NAMES,
            &weights,
            (device, precision),
        )?;
        // Dream's own sampler puts the generation right after the prompt (and has no blocks:
        // `Transition::Timesteps` over a single block reproduces it; Fast-dLLM's blocks for
        // Dream also start after the prompt).
        Ok(Self::assemble(
            cfg,
            net,
            frame,
            true,
            BlockLayout::AfterPrompt,
        ))
    }
}
