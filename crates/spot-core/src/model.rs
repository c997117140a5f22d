//! The contract between decoders and target models.

use crate::error::{Error, Result};
use crate::state::{BlockState, TokenId};
use crate::stats::{BlockStats, StatsQuery};

/// Static facts about a target model that decoders need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Number of token ids the model scores.
    pub vocab_size: usize,
    /// The mask token id.
    pub mask_id: TokenId,
    /// The longest sequence (prompt + generation, whole blocks) the model accepts.
    pub max_positions: usize,
    /// Stop ids the model's generation config declares (may be empty).
    pub stop_ids: Vec<TokenId>,
}

/// What a prefix update cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixUpdate {
    /// Whether the model ran a forward (it then counts as one NFE).
    pub ran_forward: bool,
    /// Target positions that forward processed.
    pub positions: usize,
}

/// A block-diffusion language model as decoders see it.
///
/// The model owns a cache of the committed prefix (prompt blocks and finished blocks). A
/// [`forward`](BlockDiffusionModel::forward) scores a batch of block states that all sit right
/// after that prefix, attending to it without copying it per state, and returns one
/// [`BlockStats`] per state. Implementations must be deterministic and **batch invariant**:
/// a state's statistics may not depend on the other states in the batch, nor on whether the
/// prefix came from the cache or was recomputed. That is what makes speculative decoding return
/// bit-identical tokens.
///
/// Implementations report their own failures through [`Error::model`].
pub trait BlockDiffusionModel {
    /// Static facts: vocabulary, mask id, context limit, stop ids.
    fn info(&self) -> &ModelInfo;

    /// Announces the absolute end of the region a decode will generate (the end of its last
    /// block), before [`BlockDiffusionModel::reset_prefix`]. Models that attend to future
    /// masked positions (LLaDA, Dream: the whole region is masks before it is decoded) need
    /// it; block-causal models ignore it (the default). Every decoder in the workspace calls
    /// it through [`crate::run_decode`], so draft-free and speculative decoding see the same
    /// sequences.
    fn set_generation_end(&mut self, end: usize) -> Result<()> {
        let _ = end;
        Ok(())
    }

    /// Drops the cache and makes `prefix` the committed prefix (it may be empty). The prefix is
    /// a whole number of blocks of `block_size` positions; block-causal models attend within
    /// each of those blocks bidirectionally and causally across them.
    fn reset_prefix(&mut self, prefix: &[TokenId], block_size: usize) -> Result<PrefixUpdate>;

    /// Appends a finished block to the committed prefix.
    fn append_block(&mut self, block: &[TokenId]) -> Result<PrefixUpdate>;

    /// Length of the committed prefix: the absolute position of the current block's first slot.
    fn prefix_len(&self) -> usize;

    /// One forward over `states` (all of the same length) after the committed prefix.
    fn forward(&mut self, states: &[BlockState], query: &StatsQuery) -> Result<Vec<BlockStats>>;

    /// Positions a forward computes per state whose block has `block_len` positions: the block
    /// itself for cached models (the default); models that recompute the prefix or attend to
    /// future masks (LLaDA, Dream) report the whole window they run. Used for work accounting
    /// ([`Meter::positions_processed`]) only.
    fn positions_per_state(&self, block_len: usize) -> usize {
        block_len
    }
}

impl<M: BlockDiffusionModel + ?Sized> BlockDiffusionModel for &mut M {
    fn info(&self) -> &ModelInfo {
        (**self).info()
    }
    fn set_generation_end(&mut self, end: usize) -> Result<()> {
        (**self).set_generation_end(end)
    }
    fn reset_prefix(&mut self, prefix: &[TokenId], block_size: usize) -> Result<PrefixUpdate> {
        (**self).reset_prefix(prefix, block_size)
    }
    fn append_block(&mut self, block: &[TokenId]) -> Result<PrefixUpdate> {
        (**self).append_block(block)
    }
    fn prefix_len(&self) -> usize {
        (**self).prefix_len()
    }
    fn forward(&mut self, states: &[BlockState], query: &StatsQuery) -> Result<Vec<BlockStats>> {
        (**self).forward(states, query)
    }
    fn positions_per_state(&self, block_len: usize) -> usize {
        (**self).positions_per_state(block_len)
    }
}

/// Work counters of one decode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meter {
    /// Target forward calls of any kind (the NFE).
    pub nfe: u64,
    /// Target positions processed: batch size x the positions each state runs
    /// ([`BlockDiffusionModel::positions_per_state`]: the block size for cached models, the
    /// whole window for LLaDA/Dream) for block forwards, plus prefix positions for prefill and
    /// block appends.
    pub positions_processed: u64,
    /// Forwards over block states (decoding forwards, excluding prefill and appends).
    pub block_forwards: u64,
    /// Forwards that only wrote the prefix cache (prefill and finished-block appends).
    pub prefix_forwards: u64,
    /// Block states scored in total (sum of batch sizes).
    pub states_scored: u64,
}

/// A model wrapped with work counters and output validation.
///
/// Every decoder in the workspace talks to the model only through this type, so NFE and
/// positions are counted the same way for draft-free and speculative decoding, and every
/// forward's statistics are checked (shape, finiteness, ranges) before a decoder trusts them.
pub struct MeteredModel<'m> {
    model: &'m mut dyn BlockDiffusionModel,
    info: ModelInfo,
    meter: Meter,
}

impl std::fmt::Debug for MeteredModel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredModel")
            .field("info", &self.info)
            .field("meter", &self.meter)
            .finish()
    }
}

impl<'m> MeteredModel<'m> {
    /// Wraps a model.
    pub fn new(model: &'m mut dyn BlockDiffusionModel) -> Self {
        let info = model.info().clone();
        Self {
            model,
            info,
            meter: Meter::default(),
        }
    }

    /// The model's static facts.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Counters so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Absolute position of the current block's first slot.
    pub fn prefix_len(&self) -> usize {
        self.model.prefix_len()
    }

    fn count_prefix(&mut self, u: PrefixUpdate) {
        if u.ran_forward {
            self.meter.nfe += 1;
            self.meter.prefix_forwards += 1;
        }
        self.meter.positions_processed += u.positions as u64;
    }

    /// Announces the end of the generation region (not a forward).
    pub fn set_generation_end(&mut self, end: usize) -> Result<()> {
        self.model.set_generation_end(end)
    }

    /// Resets the prefix (counted).
    pub fn reset_prefix(&mut self, prefix: &[TokenId], block_size: usize) -> Result<()> {
        let u = self.model.reset_prefix(prefix, block_size)?;
        self.count_prefix(u);
        Ok(())
    }

    /// Appends a finished block (counted).
    pub fn append_block(&mut self, block: &[TokenId]) -> Result<()> {
        let u = self.model.append_block(block)?;
        self.count_prefix(u);
        Ok(())
    }

    /// One counted, validated forward. An empty batch is not a forward and returns nothing.
    pub fn forward(
        &mut self,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        let Some(first) = states.first() else {
            return Ok(Vec::new());
        };
        let len = first.len();
        if let Some(bad) = states.iter().find(|s| s.len() != len) {
            return Err(Error::ShapeMismatch {
                what: "block states in one batch",
                expected: len,
                actual: bad.len(),
            });
        }
        let out = self.model.forward(states, query)?;
        self.meter.nfe += 1;
        self.meter.block_forwards += 1;
        self.meter.states_scored += states.len() as u64;
        self.meter.positions_processed +=
            (states.len() * self.model.positions_per_state(len)) as u64;
        if out.len() != states.len() {
            return Err(Error::ShapeMismatch {
                what: "statistics per batch",
                expected: states.len(),
                actual: out.len(),
            });
        }
        for stats in &out {
            stats.validate(len, self.info.vocab_size, self.info.mask_id)?;
        }
        Ok(out)
    }
}
