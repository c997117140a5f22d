//! What a decode is asked to do and what it returns: [`DecodeConfig`], the block plan, and
//! [`DecodeOutput`] with its counters and trace.

use crate::error::{Error, Result};
use crate::model::{BlockLayout, Meter, ModelInfo};
use crate::state::{BlockState, Commit, TokenId};
use crate::stats::{ConfidenceRule, StatsQuery};
use crate::transition::Transition;

/// Everything that determines the decoded tokens, besides the model and the prompt.
///
/// Two decoders given the same model, prompt and `DecodeConfig` must return the same tokens;
/// that is the invariant the property tests check.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeConfig {
    /// Block size `L` (positions per block), at least 1.
    pub block_size: usize,
    /// Tokens to generate after the prompt, at least 1; decoding runs whole blocks, so up to
    /// `block_size - 1` more are decoded and then cut.
    pub max_new_tokens: usize,
    /// Temperature `T`, finite and `>= 0`.
    pub temperature: f32,
    /// Seed of the coupled noise table (ignored at `T = 0`).
    pub seed: u64,
    /// The commit rule: exact `Φ` or threshold `Φ^τ`.
    pub transition: Transition,
    /// The confidence rule positions are ranked by.
    pub confidence: ConfidenceRule,
    /// Stop ids; when `early_stop` is set, decoding ends after the first block that contains
    /// one in its generated part.
    pub stop_ids: Vec<TokenId>,
    /// Stop at the first block containing a stop id (`false` = fixed-length protocol).
    pub early_stop: bool,
    /// Top-k entries requested from every forward (32 = what the SPOT drafter reads).
    pub top_k: usize,
    /// Top-k truncation of the model's distribution before sampling (`None`: off); see
    /// [`StatsQuery::sample_top_k`]. Every forward of the decode applies it, so speculative
    /// decoding still returns exactly the draft-free tokens.
    pub sample_top_k: Option<usize>,
    /// Where the blocks sit relative to the prompt ([`BlockLayout`]).
    pub layout: BlockLayout,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self {
            block_size: 32,
            max_new_tokens: 256,
            temperature: 0.0,
            seed: 0,
            transition: Transition::Exact,
            confidence: ConfidenceRule::Probability,
            stop_ids: Vec::new(),
            early_stop: true,
            top_k: 32,
            sample_top_k: None,
            layout: BlockLayout::Aligned,
        }
    }
}

impl DecodeConfig {
    /// The defaults for a model: its declared block size (32 when it declares none), its stop
    /// ids and its family's block layout, everything else as [`DecodeConfig::default`].
    ///
    /// ```
    /// use spot_core::{BlockDiffusionModel, DecodeConfig, toy::{ToyConfig, ToyModel}};
    /// let model = ToyModel::new(ToyConfig { stop_ids: vec![0, 5], ..ToyConfig::default() });
    /// let cfg = DecodeConfig::for_model(model.info());
    /// assert_eq!(cfg.stop_ids, vec![0, 5]);
    /// assert_eq!(cfg.block_size, 32);
    /// ```
    pub fn for_model(info: &ModelInfo) -> Self {
        Self {
            block_size: info.block_size.unwrap_or(32),
            stop_ids: info.stop_ids.clone(),
            layout: info.layout,
            ..Self::default()
        }
    }

    /// Checks every field that has a range.
    pub fn validate(&self) -> Result<()> {
        if self.block_size == 0 {
            return Err(Error::config("block_size", "must be at least 1, got 0"));
        }
        if self.block_size > u16::MAX as usize {
            return Err(Error::config(
                "block_size",
                format!("must be at most {}, got {}", u16::MAX, self.block_size),
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::config("max_new_tokens", "must be at least 1, got 0"));
        }
        self.transition.validate()?;
        self.query().validate()
    }

    /// The statistics query every forward of this decode uses.
    pub fn query(&self) -> StatsQuery {
        StatsQuery {
            temperature: self.temperature,
            noise: crate::GumbelNoise::new(self.seed),
            rule: self.confidence,
            top_k: self.top_k,
            hidden_states: false,
            sample_top_k: self.sample_top_k,
        }
    }
}

/// Work and acceptance counters of one decode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeStats {
    /// Target work: forwards (the NFE), positions processed, block and prefix forwards,
    /// states scored; the decode's [`Meter`].
    pub work: Meter,
    /// Blocks decoded.
    pub blocks: u64,
    /// Positions committed by decoding (prompt tail excluded).
    pub committed: u64,
    /// Commits made by each block forward, in order.
    pub commits_per_forward: Vec<u32>,
    /// Draft nodes proposed (speculative decoders; 0 for draft-free).
    pub draft_nodes: u64,
    /// Draft nodes accepted by verification.
    pub accepted_nodes: u64,
    /// First forwards of a block that a look-ahead of the forward before had already scored
    /// (not forwards: neither in `work.nfe` nor in `work.block_forwards`; their commits are in
    /// `commits_per_forward`).
    pub prefetched_forwards: u64,
    /// Blocks whose first forward was proposed from a look-ahead's statistics that assumed
    /// another end of the block before (or whose served step would have ended the block):
    /// handed to the strategy by [`StepStrategy::refresh`](crate::StepStrategy::refresh),
    /// which may draft that forward from them instead of taking a plain step.
    pub refreshed_blocks: u64,
}

impl DecodeStats {
    /// Mean commits per block forward.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.work.block_forwards == 0 {
            0.0
        } else {
            self.committed as f64 / self.work.block_forwards as f64
        }
    }

    pub(crate) fn absorb(&mut self, m: &Meter) {
        self.work = m.clone();
    }
}

/// The commits of one block, grouped by transition step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTrace {
    /// Absolute position of the block's first slot.
    pub start: usize,
    /// The state the block started from (prompt tail + masks).
    pub initial: BlockState,
    /// The commits of each transition step (one entry per `Φ` application).
    pub steps: Vec<Vec<Commit>>,
}

/// The full commit history of a decode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodeTrace {
    /// One entry per decoded block.
    pub blocks: Vec<BlockTrace>,
}

/// The result of a decode.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeOutput {
    /// Generated ids: the first `max_new_tokens`, cut after the first stop id when
    /// `early_stop` is set.
    pub tokens: Vec<TokenId>,
    /// Every decoded id after the prompt (whole blocks, nothing cut).
    pub generated: Vec<TokenId>,
    /// Whether decoding ended early: at a stop id, or where a
    /// [`StopCheck`](crate::StopCheck) said so.
    pub stopped: bool,
    /// Whether the request was cancelled ([`CancelHandle`](crate::CancelHandle)); the output
    /// then holds the blocks finished before.
    pub cancelled: bool,
    /// Work counters.
    pub stats: DecodeStats,
    /// Commit history, when requested.
    pub trace: Option<DecodeTrace>,
}

/// The block plan for a prompt: where the first block starts and how many blocks to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    /// Absolute start of the first decoded block: `floor(P / L) * L` when aligned (the rest
    /// of the prompt rides in the first block), `P` after the prompt; the prompt before it is
    /// the prefilled prefix.
    pub first_start: usize,
    /// Number of blocks to decode: `ceil((P + max_new_tokens) / L) - floor(P / L)` when
    /// aligned, `ceil(max_new_tokens / L)` after the prompt.
    pub blocks: usize,
}

/// Validates the prompt and configuration against the model and plans the blocks.
pub fn plan_blocks(prompt: &[TokenId], cfg: &DecodeConfig, info: &ModelInfo) -> Result<BlockPlan> {
    cfg.validate()?;
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    for (index, &token) in prompt.iter().enumerate() {
        let reason = if token as usize >= info.vocab_size {
            "outside the vocabulary"
        } else if token == info.mask_id {
            "the mask token cannot appear in a prompt"
        } else {
            continue;
        };
        return Err(Error::InvalidPromptToken {
            index,
            token,
            reason,
        });
    }
    if info.mask_id as usize >= info.vocab_size {
        return Err(Error::config(
            "mask_id",
            format!(
                "the model's mask id {} is outside its vocabulary of {}",
                info.mask_id, info.vocab_size
            ),
        ));
    }
    let l = cfg.block_size;
    if l > info.max_positions {
        return Err(Error::config(
            "block_size",
            format!(
                "{l} is larger than the model's {} positions",
                info.max_positions
            ),
        ));
    }
    if cfg.layout != info.layout && !info.any_layout {
        return Err(Error::config(
            "layout",
            format!(
                "this model decodes {} blocks only, got {}",
                info.layout.name(),
                cfg.layout.name()
            ),
        ));
    }
    let p = prompt.len();
    let first_start = match cfg.layout {
        BlockLayout::Aligned => p / l * l,
        BlockLayout::AfterPrompt => p,
    };
    // The end of the last block, from the first block's start (saturating: an overflow is
    // too long for any model).
    let end = cfg
        .max_new_tokens
        .saturating_add(p - first_start)
        .div_ceil(l)
        .saturating_mul(l)
        .saturating_add(first_start);
    if end > info.max_positions {
        return Err(Error::SequenceTooLong {
            prompt_len: p,
            max_new_tokens: cfg.max_new_tokens,
            needed: end,
            block_size: l,
            max_positions: info.max_positions,
        });
    }
    Ok(BlockPlan {
        first_start,
        blocks: (end - first_start) / l,
    })
}
