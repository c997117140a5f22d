//! The block loop shared by every decoder, and the draft-free decoder (the ground truth).

use crate::config::{DecodeConfig, DecodeOutput};
use crate::error::{Error, Result};
use crate::model::{BlockDiffusionModel, MeteredModel};
use crate::request::{BlockRun, Need, Request, StepStrategy};
use crate::state::{BlockState, Commit, TokenId};
use crate::stats::BlockStats;

/// What the block loop reports after every finished block (for streaming and progress bars).
#[derive(Debug)]
pub struct BlockProgress<'a> {
    /// Index of the finished block.
    pub index: usize,
    /// Blocks planned (decoding may stop earlier at a stop id).
    pub total: usize,
    /// The block's generated tokens (prompt tail excluded).
    pub tokens: &'a [TokenId],
    /// Block forwards so far.
    pub block_forwards: u64,
}

/// Receives [`BlockProgress`] events; `()` ignores them.
pub trait BlockObserver {
    /// Called after each finished block.
    fn block_done(&mut self, progress: &BlockProgress<'_>);
}

impl BlockObserver for () {
    fn block_done(&mut self, _: &BlockProgress<'_>) {}
}

impl<F: FnMut(&BlockProgress<'_>)> BlockObserver for F {
    fn block_done(&mut self, progress: &BlockProgress<'_>) {
        self(progress)
    }
}

/// Decodes `prompt` with `strategy` completing each block: builds a [`Request`] and drives
/// it through `model` ([`run_request`]).
///
/// Prefill of the whole prompt blocks, the prompt tail inside the first block (as SDAR does),
/// stop ids, the fixed-length protocol and the cache append of every finished block (skipped
/// after the last block, which no later block reads) are handled by the request once, so every
/// decoder shares the same semantics and the same work accounting.
pub fn run_decode<S: StepStrategy>(
    model: &mut dyn BlockDiffusionModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    strategy: S,
    record_trace: bool,
    observer: &mut dyn BlockObserver,
) -> Result<DecodeOutput, S::Error> {
    let request = Request::new(prompt, cfg, model.info(), strategy)?.with_trace(record_trace);
    run_request(model, request, observer)
}

/// Drives one [`Request`] to its end through `model` (slot 0, through [`MeteredModel`]),
/// reporting every finished block to `observer`. Every forward is checked (batch size,
/// statistics) by the metered model and the request.
pub fn run_request<S: StepStrategy>(
    model: &mut dyn BlockDiffusionModel,
    mut request: Request<S>,
    observer: &mut dyn BlockObserver,
) -> Result<DecodeOutput, S::Error> {
    let mut model = MeteredModel::new(model);
    loop {
        match request.need() {
            Need::Prefill {
                prefix,
                block_size,
                generation_end,
            } => {
                let update = model.reset_prefix(prefix, block_size, generation_end)?;
                request.prefix_done(update)?;
            }
            Need::Score {
                states,
                query,
                carry,
            } => {
                let scores = model.forward_carrying(carry, states, query)?;
                request.scored_group(scores)?;
            }
            Need::Done => break,
        }
        while let Some(e) = request.next_event() {
            observer.block_done(&BlockProgress {
                index: e.index,
                total: e.total,
                tokens: &e.tokens,
                block_forwards: e.block_forwards,
            });
        }
    }
    request.finish()
}

/// The draft-free decoder: one forward per transition step. This is the ground truth every
/// speculative decoder must reproduce token for token.
///
/// ```
/// use spot_core::{DecodeConfig, DraftFreeDecoder, toy::{ToyConfig, ToyModel}};
/// let mut model = ToyModel::new(ToyConfig::default());
/// let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16, ..DecodeConfig::default() };
/// let out = DraftFreeDecoder::new().decode(&mut model, &[1, 2, 3], &cfg).unwrap();
/// assert_eq!(out.tokens.len(), 16);
/// // 3 + 16 tokens round up to 3 blocks of 8; the prompt tail fills 3 slots of the first,
/// // leaving 5 + 8 + 8 masked positions: one forward each.
/// assert_eq!(out.stats.work.block_forwards, 21);
/// ```
#[derive(Clone, Debug, Default)]
pub struct DraftFreeDecoder {
    record_trace: bool,
    scratch: Vec<Commit>,
}

impl DraftFreeDecoder {
    /// A decoder that does not record a trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also return the commit history in [`DecodeOutput::trace`].
    pub fn with_trace(mut self, record: bool) -> Self {
        self.record_trace = record;
        self
    }

    /// Decodes `prompt` with `model`.
    pub fn decode(
        &mut self,
        model: &mut dyn BlockDiffusionModel,
        prompt: &[TokenId],
        cfg: &DecodeConfig,
    ) -> Result<DecodeOutput> {
        self.decode_observed(model, prompt, cfg, &mut ())
    }

    /// Decodes `prompt`, reporting every finished block to `observer`.
    pub fn decode_observed(
        &mut self,
        model: &mut dyn BlockDiffusionModel,
        prompt: &[TokenId],
        cfg: &DecodeConfig,
        observer: &mut dyn BlockObserver,
    ) -> Result<DecodeOutput> {
        let record = self.record_trace;
        run_decode(model, prompt, cfg, self, record, observer)
    }
}

impl StepStrategy for DraftFreeDecoder {
    type Error = Error;

    fn propose(&mut self, block: &BlockRun, states: &mut Vec<BlockState>) -> Result<()> {
        states.push(block.state().clone());
        Ok(())
    }

    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> Result<()> {
        let stats = first_stats(stats)?;
        block.plain_absorb(stats, &mut self.scratch)?;
        Ok(())
    }
}

/// The statistics of the first proposed state (the current one, for the draft-free step).
pub fn first_stats(stats: Vec<BlockStats>) -> Result<BlockStats> {
    stats.into_iter().next().ok_or(Error::ShapeMismatch {
        what: "statistics per batch",
        expected: 1,
        actual: 0,
    })
}
