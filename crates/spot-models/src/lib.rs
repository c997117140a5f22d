//! # spot-models
//!
//! Block-diffusion language models in [burn](https://burn.dev), loaded from Hugging Face model
//! folders and usable by every decoder of the SPOT workspace through
//! [`spot_core::BlockDiffusionModel`].
//!
//! - [`Sdar`]: SDAR (Qwen3 with block-causal attention), prefix KV cache, batched verification
//!   forwards, logits reduced to statistics (a fused host kernel on CPU backends, the device on
//!   GPUs: [`HeadPlacement`]);
//! - [`Llada`] (LLaDA-8B) and [`Dream`] (Dream-7B): full bidirectional attention, the whole
//!   sequence recomputed per forward with the future blocks masked ([`FullSequence`]);
//! - [`Llada2Moe`] (LLaDA2.0-mini): mixture of experts, block-causal with a prefix KV cache
//!   like SDAR ([`BlockCausal`]);
//! - [`DiffusionModel`]: any of the above, chosen by `config.json`'s `model_type`;
//! - [`CausalLm`]: autoregressive Llama / Qwen2 / Qwen3 with a KV cache
//!   ([`spot_core::AutoregressiveModel`]);
//! - [`chat`]: the folder's Jinja chat template rendered as transformers renders it;
//! - [`hf`]: `config.json`, (sharded) safetensors with f32/bf16/f16 weights, `tokenizer.json`;
//! - [`FolderSummary`]: a folder's family, vocabulary, mask and stop ids and parameter count
//!   from its small files and safetensors headers, without loading a weight;
//! - [`stack`]: decoder layers of a target's shape over its embedding and head, the body of a
//!   network that reads the target's hidden states (the MRP baseline's module in
//!   `spot-drafter`).
//!
//! Backends are Cargo features of the same generic code: `flex` (default, CPU), `ndarray`
//! (CPU), `wgpu`, `cuda`. [`CpuBackend`] is flex when enabled, else ndarray. The items that a
//! feature adds are marked with it on docs.rs.
//!
//! ```no_run
//! use spot_core::{DecodeConfig, DraftFreeDecoder};
//! use spot_models::{CpuBackend, Sdar};
//!
//! let mut model = Sdar::<CpuBackend>::load("SDAR-1.7B-Chat".as_ref(), &Default::default())?;
//! let prompt = model.tokenizer().unwrap().encode("def fibonacci(n):")?;
//! let out = DraftFreeDecoder::new().decode(&mut model, &prompt, &DecodeConfig::default())?;
//! println!("{}", model.tokenizer().unwrap().decode(&out.tokens)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod any;
mod attention;
mod autoregressive;
mod block_causal;
mod config;
mod dense;
mod dream;
mod family;
mod frame;
mod full_sequence;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fused_reduce;
mod head;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernel_cache;
mod linear;
mod llada;
mod llada2;
mod loader;
mod moe;
mod precision;
mod reduce;
mod rope;
mod sdar;
pub mod stack;
mod summary;
mod swiglu;
mod transformer;
mod values;

pub use any::DiffusionModel;
pub use autoregressive::{CausalLm, FeatureTap, TapRun};
pub use block_causal::BlockCausal;
pub use config::DecoderConfig;
pub use dream::{Dream, DreamConfig};
pub use family::Family;
pub use full_sequence::FullSequence;
pub use head::HeadPlacement;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "cuda", feature = "wgpu"))))]
pub use kernel_cache::enable_kernel_cache;
pub use llada::{Llada, LladaConfig};
pub use llada2::{Llada2Config, Llada2Moe};
pub use precision::Precision;
pub use sdar::{Sdar, SdarConfig};
pub use spot_hf::StopStrings;
pub use spot_hf::{ModelError, Result, chat, hf};
pub use spot_reduce::Logits;
pub use summary::FolderSummary;

/// The CPU backend when only the `ndarray` feature is enabled.
#[cfg(all(feature = "ndarray", not(feature = "flex")))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "ndarray", not(feature = "flex")))))]
pub type CpuBackend = burn_ndarray::NdArray<f32>;

/// The default CPU backend: flex (`flex` feature, on by default; measured faster than ndarray
/// on the forward benchmark, and batch invariant).
#[cfg(feature = "flex")]
#[cfg_attr(docsrs, doc(cfg(feature = "flex")))]
pub type CpuBackend = burn_flex::Flex<f32>;

/// The flex CPU backend (`flex` feature).
#[cfg(feature = "flex")]
#[cfg_attr(docsrs, doc(cfg(feature = "flex")))]
pub type FlexBackend = burn_flex::Flex<f32>;

/// The ndarray CPU backend (`ndarray` feature).
#[cfg(feature = "ndarray")]
#[cfg_attr(docsrs, doc(cfg(feature = "ndarray")))]
pub type NdArrayBackend = burn_ndarray::NdArray<f32>;

/// The wgpu backend (`wgpu` feature).
#[cfg(feature = "wgpu")]
#[cfg_attr(docsrs, doc(cfg(feature = "wgpu")))]
pub type WgpuBackend = burn_wgpu::Wgpu;

/// The CUDA backend (`cuda` feature).
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub type CudaBackend = burn_cuda::Cuda;

/// Test support, not a stable API: the device reduction of the output layer on arbitrary
/// logits, for the device suite's comparison with the host reference.
#[doc(hidden)]
pub mod testing {
    use burn_tensor::Tensor;
    use burn_tensor::backend::Backend;
    use spot_core::{StatsQuery, TokenId};
    use spot_reduce::RowStats;

    /// The device reduction of `logits` (`[rows, vocab]` row-major) under `query` at
    /// `positions` (one per row; the Gumbel rows are those positions'), excluding `mask`:
    /// through the fused kernel where the backend and query allow it when `fused`, else
    /// through burn's passes.
    pub fn reduce_on_device<B: Backend>(
        logits: &[f32],
        vocab: usize,
        query: &StatsQuery,
        mask: Option<TokenId>,
        positions: &[usize],
        fused: bool,
        device: &B::Device,
    ) -> crate::Result<Vec<RowStats>> {
        let rows = positions.len();
        let t = crate::reduce::upload::<B>(logits.to_vec(), rows, vocab, device);
        let noise = noise_rows::<B>(query, positions, vocab, device);
        reduce_tensors(t, noise, query, mask, positions, fused)
    }

    /// The Gumbel rows of `positions` under `query` on `device` (`None` at `T = 0`).
    pub fn noise_rows<B: Backend>(
        query: &StatsQuery,
        positions: &[usize],
        vocab: usize,
        device: &B::Device,
    ) -> Option<Tensor<B, 2>> {
        (query.temperature > 0.0).then(|| {
            let mut table = Vec::with_capacity(positions.len() * vocab);
            for &p in positions {
                table.extend(spot_reduce::noise_table(query, p, 1, vocab));
            }
            crate::reduce::upload::<B>(table, positions.len(), vocab, device)
        })
    }

    /// [`reduce_on_device`] on logits and noise rows already on the device.
    pub fn reduce_tensors<B: Backend>(
        logits: Tensor<B, 2>,
        noise: Option<Tensor<B, 2>>,
        query: &StatsQuery,
        mask: Option<TokenId>,
        positions: &[usize],
        fused: bool,
    ) -> crate::Result<Vec<RowStats>> {
        let [_, vocab] = logits.dims();
        let device = logits.device();
        let bias = mask.map(|m| crate::head::mask_bias::<B>(m, vocab, &device));
        let terms = crate::head::MaskTerms {
            id: mask,
            bias: bias.as_ref(),
        };
        crate::reduce::reduce(logits, query, terms, noise, positions, fused)
    }
}
