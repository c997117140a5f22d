//! Loading any block-diffusion family by the `model_type` of its `config.json`.

use std::path::Path;

use burn_tensor::backend::Backend;
use spot_core::{
    BlockDiffusionModel, BlockState, CacheSlot, CacheUsage, GroupScores, ModelInfo, Prefix,
    PrefixUpdate, ScoreGroup,
};

use crate::family::Family;
use crate::precision::Precision;
use crate::{Dream, Llada, Llada2Moe, Sdar};
use spot_hf::hf::Tokenizer;
use spot_hf::{ModelError, Result};
use spot_reduce::Logits;

/// A block-diffusion model of any family, chosen by `config.json`.
///
/// ```no_run
/// use spot_core::{DecodeConfig, DraftFreeDecoder};
/// use spot_models::{CpuBackend, DiffusionModel};
///
/// let mut model = DiffusionModel::<CpuBackend>::load("LLaDA-8B-Instruct".as_ref(), &Default::default())?;
/// println!("{:?}, {} parameters", model.family(), model.parameter_count());
/// let prompt = model.tokenizer().unwrap().encode("Hello")?;
/// let out = DraftFreeDecoder::new().decode(&mut model, &prompt, &DecodeConfig::default())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum DiffusionModel<B: Backend> {
    /// SDAR.
    Sdar(Sdar<B>),
    /// LLaDA.
    Llada(Llada<B>),
    /// Dream.
    Dream(Dream<B>),
    /// LLaDA2.0 MoE.
    Llada2Moe(Llada2Moe<B>),
}

macro_rules! each {
    ($self:expr, $m:ident => $e:expr) => {
        match $self {
            DiffusionModel::Sdar($m) => $e,
            DiffusionModel::Llada($m) => $e,
            DiffusionModel::Dream($m) => $e,
            DiffusionModel::Llada2Moe($m) => $e,
        }
    };
}

impl<B: Backend> DiffusionModel<B> {
    /// Loads the folder with the loader of its family; an autoregressive or unknown
    /// `model_type` is an [`ModelError::InvalidConfig`] naming the field.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, p: Precision) -> Result<Self> {
        Ok(match Family::detect(dir)? {
            Family::Sdar => Self::Sdar(Sdar::load_as(dir, device, p)?),
            Family::Llada => Self::Llada(Llada::load_as(dir, device, p)?),
            Family::Dream => Self::Dream(Dream::load_as(dir, device, p)?),
            Family::Llada2Moe => Self::Llada2Moe(Llada2Moe::load_as(dir, device, p)?),
            f @ (Family::Llama | Family::Qwen2 | Family::Qwen3) => {
                return Err(ModelError::InvalidConfig {
                    path: dir.join("config.json"),
                    field: "model_type",
                    reason: format!(
                        "{} is an autoregressive family, not a block-diffusion model",
                        f.name()
                    ),
                });
            }
        })
    }

    /// The family.
    pub fn family(&self) -> Family {
        match self {
            Self::Sdar(_) => Family::Sdar,
            Self::Llada(_) => Family::Llada,
            Self::Dream(_) => Family::Dream,
            Self::Llada2Moe(_) => Family::Llada2Moe,
        }
    }

    /// The tokenizer, when the folder has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        each!(self, m => m.tokenizer())
    }

    /// The folder the model was loaded from.
    pub fn dir(&self) -> &Path {
        each!(self, m => m.dir())
    }

    /// Number of parameters the weights hold.
    pub fn parameter_count(&self) -> usize {
        each!(self, m => m.parameter_count())
    }

    /// Moves the output layer and the reduction to `placement` (see
    /// [`crate::HeadPlacement`]).
    pub fn set_head_placement(&mut self, placement: crate::HeadPlacement) {
        each!(self, m => m.set_head_placement(placement))
    }

    /// The precision the weights and activations are held in (never `Auto`).
    pub fn precision(&self) -> Precision {
        each!(self, m => m.precision())
    }

    /// The trained block size, when the config names it (SDAR folders).
    pub fn block_size(&self) -> Option<usize> {
        self.info().block_size
    }

    /// Turns the approximate (Fast-dLLM-style) prefix cache of LLaDA and Dream on or off (see
    /// [`crate::FullSequence::set_approximate_prefix_cache`]; it changes the model's numbers).
    /// SDAR and LLaDA2.0 have an exact prefix cache: asking for the approximate one is an
    /// error.
    pub fn set_approximate_prefix_cache(&mut self, on: bool) -> Result<()> {
        match self {
            Self::Llada(m) => m.set_approximate_prefix_cache(on),
            Self::Dream(m) => m.set_approximate_prefix_cache(on),
            other if on => {
                return Err(ModelError::Request(format!(
                    "{} has an exact prefix KV cache; the approximate one is for LLaDA and Dream",
                    other.family().name()
                )));
            }
            _ => {}
        }
        Ok(())
    }

    /// Block logits `[n, len, vocab]` of `states` as host values (tests and tools).
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Logits> {
        each!(self, m => m.forward_logits(states))
    }
}

impl<B: Backend> BlockDiffusionModel for DiffusionModel<B> {
    fn info(&self) -> &ModelInfo {
        each!(self, m => m.info())
    }

    fn open_slot(&mut self) -> spot_core::Result<CacheSlot> {
        each!(self, m => m.open_slot())
    }

    fn close_slot(&mut self, slot: CacheSlot) {
        each!(self, m => m.close_slot(slot))
    }

    fn cache_usage(&self) -> CacheUsage {
        each!(self, m => m.cache_usage())
    }

    fn prefix_len(&self, slot: CacheSlot) -> usize {
        each!(self, m => m.prefix_len(slot))
    }

    fn reset_prefix(
        &mut self,
        slot: CacheSlot,
        prefix: Prefix<'_>,
    ) -> spot_core::Result<PrefixUpdate> {
        each!(self, m => m.reset_prefix(slot, prefix))
    }

    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> spot_core::Result<Vec<GroupScores>> {
        each!(self, m => m.forward(groups))
    }
}
