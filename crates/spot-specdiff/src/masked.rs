//! SpecDiff-2's drafter on burn (the `models` feature): a small Llama-architecture model (sharing the target's
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

use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_core::{AutoregressiveModel, BlockStats, StatsQuery, TokenId};
use spot_models::{CausalLm, ModelError, Result};

use crate::drafter::{DiffusionDrafter, Marginals};

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
/// SpecDiff-2 decodes with it through [`SpecDiffDecoder`](crate::SpecDiffDecoder) (it is a
/// [`DiffusionDrafter`]); on its own it gives the drafted marginals:
///
/// ```no_run
/// use spot_models::CpuBackend;
/// use spot_specdiff::MaskedDrafter;
/// let device = Default::default();
/// let mut drafter = MaskedDrafter::<CpuBackend>::load("smollm2-drafter".as_ref(), &device)?;
/// // The marginals of the 8 tokens after the context, `candidates()` ids each.
/// let stats = drafter.draft(&[1, 2, 3], 8)?;
/// assert_eq!(stats.len(), 8);
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
    /// [`BlockStats`] whose position `i` is the marginal of token `context.len() + i`
    /// ([`CausalLm::masked_continuation`] with the drafter's mask token).
    pub fn draft(&mut self, context: &[TokenId], gamma: usize) -> Result<BlockStats> {
        // T = 0: the untempered distribution, no noise drawn.
        let query = StatsQuery {
            top_k: self.top_k,
            ..StatsQuery::new(0.0, 0)
        };
        self.lm
            .masked_continuation(context, self.file.mask_token_id, gamma, &query)
    }
}

impl<B: Backend> DiffusionDrafter for MaskedDrafter<B> {
    fn name(&self) -> &str {
        "masked-drafter"
    }

    fn vocab_size(&self) -> usize {
        self.lm.ar_info().vocab_size
    }

    fn propose(
        &mut self,
        context: &[TokenId],
        gamma: usize,
        out: &mut Marginals,
    ) -> spot_core::Result<()> {
        *out = Marginals::new(self.candidates());
        if context.is_empty() || gamma == 0 {
            return Ok(());
        }
        let s = self.draft(context, gamma)?;
        for i in 0..s.len() {
            let (ids, probs) = s.top(i);
            out.push(ids, probs)?;
        }
        Ok(())
    }
}
