//! SpecDiff-2's drafter on burn: a small Llama-architecture model (sharing the target's
//! tokenizer) that reads the accepted text causally, with a KV cache, and fills `γ` positions
//! after it in one forward.
//!
//! Layout ("shifted", as Dream's): drafted position `i` (absolute `c + i` after a context of
//! `c` tokens) is predicted from the hidden state at `c + i - 1`: the last context token's
//! for `i = 0` (exactly as a causal LM predicts its next token), and for `i > 0` the `i`-th
//! of `γ - 1` mask tokens appended after the context. The masks attend to the whole context
//! and to each other; the context never attends to them, so its cache is kept between rounds
//! and only the newly accepted tokens are appended. A drafter so is a causal LM folder plus
//! `specdiff-drafter.json` naming its mask token.

use std::path::Path;

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_core::{AutoregressiveModel, StatsQuery, TokenId};

use crate::attention::Attend;
use crate::autoregressive::{CausalLm, SLOT0};
use crate::transformer::Segment;
use spot_hf::{ModelError, Result};
use spot_reduce::RowPlan;

/// The drafter's own file next to `config.json`.
pub const DRAFTER_FILE: &str = "specdiff-drafter.json";

/// The format name in [`DRAFTER_FILE`].
pub const DRAFTER_FORMAT: &str = "spot-specdiff-drafter";

/// What [`DRAFTER_FILE`] holds.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DrafterFile {
    /// Always [`DRAFTER_FORMAT`].
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// The id the drafter reads as a masked position (inside the vocabulary).
    pub mask_token_id: TokenId,
    /// Free text: what it was trained for and how.
    #[serde(default)]
    pub description: String,
}

/// A masked-diffusion drafter for an autoregressive target (see the module documentation).
/// SpecDiff-2 decodes with it through `spot_specdiff::SpecDiffDecoder` (spot-specdiff's
/// `models` feature implements its `DiffusionDrafter` for this type); on its own it gives the
/// drafted marginals:
///
/// ```no_run
/// use spot_models::{CpuBackend, MaskedDrafter};
/// let device = Default::default();
/// let mut drafter = MaskedDrafter::<CpuBackend>::load("smollm2-drafter".as_ref(), &device)?;
/// // The marginals of the 8 tokens after the context, `candidates()` ids each.
/// let stats = drafter.draft(&[1, 2, 3], 8)?;
/// assert_eq!(stats[0].len(), 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MaskedDrafter<B: Backend> {
    lm: CausalLm<B>,
    file: DrafterFile,
    top_k: usize,
}

impl<B: Backend> std::fmt::Debug for MaskedDrafter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaskedDrafter")
            .field("lm", &self.lm)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> MaskedDrafter<B> {
    /// Loads a drafter folder: a Llama / Qwen2 / Qwen3 folder ([`CausalLm::load`]) with
    /// [`DRAFTER_FILE`].
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        let path = dir.join(DRAFTER_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let file: DrafterFile = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::new(CausalLm::load(dir, device)?, file, &path)
    }

    /// A drafter from a loaded model and its drafter file (`path` names it in errors).
    pub fn new(lm: CausalLm<B>, file: DrafterFile, path: &Path) -> Result<Self> {
        let invalid = |field, reason: String| ModelError::InvalidConfig {
            path: path.to_path_buf(),
            field,
            reason,
        };
        if file.format != DRAFTER_FORMAT {
            return Err(invalid(
                "format",
                format!("expected \"{DRAFTER_FORMAT}\", got {:?}", file.format),
            ));
        }
        if file.version != 1 {
            return Err(invalid(
                "version",
                format!("this build reads version 1, got {}", file.version),
            ));
        }
        let vocab = lm.ar_info().vocab_size;
        if file.mask_token_id as usize >= vocab {
            return Err(invalid(
                "mask_token_id",
                format!(
                    "{} is outside the vocabulary of {vocab}",
                    file.mask_token_id
                ),
            ));
        }
        Ok(Self { lm, file, top_k: 4 })
    }

    /// Candidates per drafted position (default 4, at least 1).
    pub fn with_candidates(mut self, k: usize) -> Self {
        self.top_k = k.max(1);
        self
    }

    /// Candidates per drafted position.
    pub fn candidates(&self) -> usize {
        self.top_k
    }

    /// The drafter file.
    pub fn file(&self) -> &DrafterFile {
        &self.file
    }

    /// The underlying causal model (its tokenizer, parameter count, ...).
    pub fn model(&self) -> &CausalLm<B> {
        &self.lm
    }

    /// The drafter's statistics for the `gamma` positions after `context` (T = 0, the
    /// untempered distribution, [`MaskedDrafter::candidates`] entries per position): one
    /// [`spot_core::BlockStats`] whose position `i` is the marginal of token
    /// `context.len() + i`. SpecDiff-2 reads it through `spot_specdiff`'s `DiffusionDrafter`
    /// (its `models` feature).
    pub fn draft(
        &mut self,
        context: &[TokenId],
        gamma: usize,
    ) -> Result<Vec<spot_core::BlockStats>> {
        // The cache keeps the longest common prefix with the last context, at least one
        // token short of this one (the last token's hidden state is read every round).
        let keep = self.lm.slots.get(SLOT0)?.prefix.iter();
        let keep = keep
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        self.lm.truncate(SLOT0, keep)?;
        let new = &context[keep..];
        self.lm.frame.check_end(context.len() + gamma, "sequence")?;
        let hidden = self.lm.append(SLOT0, new)?;
        let last = hidden.narrow(0, new.len() - 1, 1);
        let slot = self.lm.slots.get_mut(SLOT0)?;
        let rows = if gamma > 1 {
            let masks = vec![self.file.mask_token_id; gamma - 1];
            let mut ids = Vec::with_capacity(gamma - 1);
            self.lm.frame.push_ids(&masks, &mut ids)?;
            let seg = Segment {
                n: 1,
                len: gamma - 1,
                start: slot.prefix.len(),
                cache: &slot.cache,
                after: None,
            };
            let (h, _) = self.lm.net.run_segments(ids, &[seg], Attend::Bidirectional);
            Tensor::cat(vec![last, h], 0)
        } else {
            last
        };
        // T = 0: the untempered distribution, no noise drawn.
        let query = StatsQuery {
            top_k: self.top_k,
            ..StatsQuery::new(0.0, 0)
        };
        let stats = self.lm.frame.stats(
            &self.lm.net.head,
            rows,
            &RowPlan::all(gamma),
            (context.len(), &mut slot.noise),
            &query,
        )?;
        Ok(stats)
    }
}
