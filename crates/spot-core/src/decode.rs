//! The block loop shared by every decoder, and the draft-free decoder (the ground truth).

use crate::error::{Error, Result};
use crate::model::{BlockDiffusionModel, Meter, MeteredModel};
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
        }
    }
}

impl DecodeConfig {
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
        }
    }
}

/// Work and acceptance counters of one decode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeStats {
    /// Target forwards, prefill and block appends included (the NFE).
    pub nfe: u64,
    /// Target positions processed (batch x block size, plus prefix positions).
    pub positions_processed: u64,
    /// Forwards over block states.
    pub block_forwards: u64,
    /// Forwards that only wrote the prefix cache.
    pub prefix_forwards: u64,
    /// Block states scored in total.
    pub states_scored: u64,
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
}

impl DecodeStats {
    /// Mean commits per block forward.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.block_forwards == 0 {
            0.0
        } else {
            self.committed as f64 / self.block_forwards as f64
        }
    }

    fn absorb(&mut self, m: &Meter) {
        self.nfe = m.nfe;
        self.positions_processed = m.positions_processed;
        self.block_forwards = m.block_forwards;
        self.prefix_forwards = m.prefix_forwards;
        self.states_scored = m.states_scored;
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
    /// Whether decoding ended at a stop id.
    pub stopped: bool,
    /// Work counters.
    pub stats: DecodeStats,
    /// Commit history, when requested.
    pub trace: Option<DecodeTrace>,
}

/// The block being decoded, as handed to a [`BlockDecoder`].
#[derive(Debug)]
pub struct BlockRun<'a> {
    state: BlockState,
    start: usize,
    index: usize,
    query: StatsQuery,
    transition: Transition,
    stats: &'a mut DecodeStats,
    trace: Option<&'a mut BlockTrace>,
    pending: u32,
}

impl BlockRun<'_> {
    /// The current state.
    pub fn state(&self) -> &BlockState {
        &self.state
    }

    /// Absolute position of the block's first slot.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Index of the block in this decode (0 = the block holding the prompt tail).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The query every forward of this decode uses.
    pub fn query(&self) -> &StatsQuery {
        &self.query
    }

    /// The commit rule.
    pub fn transition(&self) -> Transition {
        self.transition
    }

    /// Applies one transition step (the commits of one `Φ` application).
    pub fn apply_step(&mut self, commits: &[Commit]) -> Result<()> {
        for &c in commits {
            self.state.commit(c)?;
        }
        self.pending += commits.len() as u32;
        if let Some(t) = self.trace.as_deref_mut() {
            t.steps.push(commits.to_vec());
        }
        Ok(())
    }

    /// One draft-free step: a forward over the current state alone, the transition's commits
    /// applied, the forward closed. Returns the forward's statistics (a speculative decoder
    /// keeps them as the next stale distribution). `scratch` is a reusable buffer.
    pub fn plain_step(
        &mut self,
        model: &mut MeteredModel<'_>,
        scratch: &mut Vec<Commit>,
    ) -> Result<crate::BlockStats> {
        let stats = model
            .forward(std::slice::from_ref(&self.state), &self.query)?
            .swap_remove(0);
        scratch.clear();
        self.transition.commits(&self.state, &stats, scratch)?;
        self.apply_step(scratch)?;
        self.finish_forward(0, 0);
        Ok(stats)
    }

    /// Closes the current forward: everything applied since the last call was paid by one
    /// forward. Also records draft counts for speculative decoders.
    pub fn finish_forward(&mut self, draft_nodes: usize, accepted_nodes: usize) {
        self.stats.commits_per_forward.push(self.pending);
        self.stats.committed += u64::from(self.pending);
        self.stats.draft_nodes += draft_nodes as u64;
        self.stats.accepted_nodes += accepted_nodes as u64;
        self.pending = 0;
    }
}

/// A strategy that completes one block; the block loop ([`run_decode`]) does the rest.
pub trait BlockDecoder {
    /// The strategy's error type; core errors convert into it.
    type Error: From<Error>;

    /// Decodes `block` until its state is complete, calling [`BlockRun::apply_step`] for every
    /// transition step and [`BlockRun::finish_forward`] after every forward.
    fn decode_block(
        &mut self,
        model: &mut MeteredModel<'_>,
        block: &mut BlockRun<'_>,
    ) -> Result<(), Self::Error>;
}

/// The block plan for a prompt: where the first block starts and how many blocks to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    /// Absolute start of the first decoded block (`floor(P / L) * L`); the prompt before it is
    /// the prefilled prefix, the rest of the prompt rides in the first block.
    pub first_start: usize,
    /// Number of blocks to decode (`ceil((P + max_new_tokens) / L) - floor(P / L)`).
    pub blocks: usize,
}

/// Validates the prompt and configuration against the model and plans the blocks.
pub fn plan_blocks(
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    info: &crate::ModelInfo,
) -> Result<BlockPlan> {
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
    let p = prompt.len();
    let first_start = p / l * l;
    let end = p
        .checked_add(cfg.max_new_tokens)
        .map(|n| n.div_ceil(l) * l)
        .filter(|&e| e <= info.max_positions)
        .ok_or(Error::SequenceTooLong {
            prompt_len: p,
            max_new_tokens: cfg.max_new_tokens,
            needed: p
                .saturating_add(cfg.max_new_tokens)
                .div_ceil(l)
                .saturating_mul(l),
            block_size: l,
            max_positions: info.max_positions,
        })?;
    Ok(BlockPlan {
        first_start,
        blocks: (end - first_start) / l,
    })
}

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

/// Runs the block loop with `strategy` completing each block.
///
/// Prefill of the whole prompt blocks, the prompt tail inside the first block (as SDAR does),
/// stop ids, the fixed-length protocol and the cache append of every finished block (skipped
/// after the last block, which no later block reads) are handled here once, so every decoder
/// shares the same semantics and the same work accounting.
pub fn run_decode<S: BlockDecoder + ?Sized>(
    model: &mut dyn BlockDiffusionModel,
    prompt: &[TokenId],
    cfg: &DecodeConfig,
    strategy: &mut S,
    record_trace: bool,
    observer: &mut dyn BlockObserver,
) -> Result<DecodeOutput, S::Error> {
    let plan = plan_blocks(prompt, cfg, model.info())?;
    let mut model = MeteredModel::new(model);
    let info = model.info().clone();
    let l = cfg.block_size;
    model.set_generation_end(plan.first_start + plan.blocks * l)?;
    model.reset_prefix(&prompt[..plan.first_start], l)?;
    let mut stats = DecodeStats::default();
    let mut trace = record_trace.then(DecodeTrace::default);
    let mut generated = Vec::with_capacity(plan.blocks * l);
    let mut stopped = false;
    for index in 0..plan.blocks {
        let start = plan.first_start + index * l;
        if model.prefix_len() != start {
            return Err(Error::ShapeMismatch {
                what: "model prefix length",
                expected: start,
                actual: model.prefix_len(),
            }
            .into());
        }
        let tail = prompt.get(start..).unwrap_or(&[]);
        let mut tokens = vec![info.mask_id; l];
        tokens[..tail.len()].copy_from_slice(tail);
        let initial = BlockState::from_tokens(tokens, info.mask_id);
        if let Some(t) = trace.as_mut() {
            t.blocks.push(BlockTrace {
                start,
                initial: initial.clone(),
                steps: Vec::new(),
            });
        }
        let mut run = BlockRun {
            state: initial,
            start,
            index,
            query: cfg.query(),
            transition: cfg.transition,
            stats: &mut stats,
            trace: trace.as_mut().and_then(|t| t.blocks.last_mut()),
            pending: 0,
        };
        strategy.decode_block(&mut model, &mut run)?;
        if !run.state.is_complete() {
            return Err(
                Error::config("strategy", "a block decoder returned an incomplete block").into(),
            );
        }
        let block = run.state.into_tokens();
        stats.blocks += 1;
        let new = &block[tail.len()..];
        generated.extend_from_slice(new);
        observer.block_done(&BlockProgress {
            index,
            total: plan.blocks,
            tokens: new,
            block_forwards: model.meter().block_forwards,
        });
        if cfg.early_stop && new.iter().any(|t| cfg.stop_ids.contains(t)) {
            stopped = true;
            break;
        }
        if index + 1 < plan.blocks {
            model.append_block(&block)?;
        }
    }
    stats.absorb(model.meter());
    let mut tokens: Vec<TokenId> = generated.iter().copied().take(cfg.max_new_tokens).collect();
    if cfg.early_stop
        && let Some(i) = tokens.iter().position(|t| cfg.stop_ids.contains(t))
    {
        tokens.truncate(i + 1);
    }
    Ok(DecodeOutput {
        tokens,
        generated,
        stopped,
        stats,
        trace,
    })
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
/// assert_eq!(out.stats.block_forwards, 21);
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

impl BlockDecoder for DraftFreeDecoder {
    type Error = Error;

    fn decode_block(
        &mut self,
        model: &mut MeteredModel<'_>,
        block: &mut BlockRun<'_>,
    ) -> Result<()> {
        while !block.state().is_complete() {
            block.plain_step(model, &mut self.scratch)?;
        }
        Ok(())
    }
}
