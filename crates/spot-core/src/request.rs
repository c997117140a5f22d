//! One decode as a state machine: the request says what it needs from the model next, the
//! caller runs it (alone or merged with other requests' work) and feeds the result back.
//!
//! ```text
//!            new()                 prefix_done()                    scored()
//!   ┌──────────────┐  Prefill  ┌──────────────┐  Score{states}  ┌──────────────┐
//!   │   Request    │ ────────▶ │ block i open │ ──────────────▶ │   strategy   │
//!   └──────────────┘           └──────────────┘ ◀────────────── │   absorbs    │
//!                                  ▲        block not complete   └──────┬───────┘
//!                                  │                                    │ block complete:
//!                                  │ block i + 1 opens; its first       │ event, stop checks
//!                                  │ Score{append: block i} rides the   │
//!                                  │ append in the same forward         │
//!                                  └────────────────────────────────────┤
//!                                                                       ▼
//!                                         Done (last block, stop id, stop check, cancel)
//! ```
//!
//! The request holds no model and does no I/O, the way `quinn-proto` or `rustls` keep protocol
//! logic apart from sockets: [`run_decode`](crate::run_decode) drives one request through a
//! [`BlockDiffusionModel`](crate::BlockDiffusionModel), and
//! [`BatchDriver`](crate::BatchDriver) drives many through one, merging their scoring
//! forwards. A
//! [`StepStrategy`] decides which states to score and what to commit (the draft-free rule, or
//! a speculative tree and its verifier); everything else (prefill, the prompt tail, stop ids,
//! the fixed-length protocol, counters, events, cancellation) lives here once.
//!
//! ```
//! use spot_core::{DecodeConfig, DraftFreeDecoder, MeteredModel, Need, Request};
//! use spot_core::toy::{ToyConfig, ToyModel};
//!
//! let mut toy = ToyModel::new(ToyConfig::default());
//! let mut model = MeteredModel::new(&mut toy);
//! let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16, ..DecodeConfig::default() };
//! let mut req = Request::new(&[1, 2, 3], &cfg, model.info(), DraftFreeDecoder::new())?;
//! loop {
//!     match req.need() {
//!         Need::Prefill { prefix, block_size, generation_end } => {
//!             let u = model.reset_prefix(prefix, block_size, generation_end)?;
//!             req.prefix_done(u)?;
//!         }
//!         Need::Score { states, query, carry } => {
//!             // The finished block before, if any, rides along.
//!             let scores = model.forward_carrying(carry, states, query)?;
//!             req.scored_group(scores)?;
//!         }
//!         Need::Done => break,
//!     }
//! }
//! let out = req.finish()?;
//! let reference = DraftFreeDecoder::new().decode(&mut toy, &[1, 2, 3], &cfg)?;
//! assert_eq!(out.tokens, reference.tokens);
//! # Ok::<(), spot_core::Error>(())
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::{BlockPlan, BlockTrace, DecodeConfig, DecodeOutput, DecodeStats, DecodeTrace};
use crate::error::{Error, Result};
use crate::model::{
    Carry, GroupScores, Meter, ModelInfo, PrefixUpdate, check_forward, check_state_lengths,
};
use crate::state::{BlockState, Commit, TokenId};
use crate::stats::{BlockStats, StatsQuery};
use crate::transition::Transition;

/// The block being decoded, as a [`StepStrategy`] sees it.
#[derive(Clone, Debug)]
pub struct BlockRun {
    state: BlockState,
    start: usize,
    index: usize,
    query: StatsQuery,
    transition: Transition,
    forwards: usize,
    step_count: usize,
    pending: u32,
    closed: bool,
    prefetched: bool,
    tally: DecodeStats,
    steps: Option<Vec<Vec<Commit>>>,
}

impl BlockRun {
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

    /// Forwards this block has been scored by so far (0 before its first).
    pub fn forwards(&self) -> usize {
        self.forwards
    }

    /// Whether the statistics being absorbed were served by the previous forward's look-ahead
    /// (no forward ran for them: a strategy timing its forwards skips them).
    pub fn prefetched(&self) -> bool {
        self.prefetched
    }

    /// Transition steps applied to this block so far: the index of its next step (what a
    /// [`Transition::Scheduled`] rule reads).
    pub fn steps(&self) -> usize {
        self.step_count
    }

    /// Applies one transition step (the commits of one `Φ` application).
    pub fn apply_step(&mut self, commits: &[Commit]) -> Result<()> {
        for &c in commits {
            self.state.commit(c)?;
        }
        self.pending += commits.len() as u32;
        self.step_count += 1;
        if let Some(steps) = self.steps.as_mut() {
            steps.push(commits.to_vec());
        }
        Ok(())
    }

    /// The draft-free step for statistics of the current state: the transition's commits
    /// applied and the forward closed. Returns the statistics (a speculative strategy keeps
    /// them as the next stale distribution). `scratch` is a reusable buffer.
    pub fn plain_absorb(
        &mut self,
        stats: BlockStats,
        scratch: &mut Vec<Commit>,
    ) -> Result<BlockStats> {
        scratch.clear();
        self.transition
            .commits(self.step_count, &self.state, &stats, scratch)?;
        self.apply_step(scratch)?;
        self.finish_forward(0, 0);
        Ok(stats)
    }

    /// Closes the current forward: everything applied since the last call was paid by one
    /// forward. Also records draft counts for speculative strategies.
    pub fn finish_forward(&mut self, draft_nodes: usize, accepted_nodes: usize) {
        let t = &mut self.tally;
        t.commits_per_forward.push(self.pending);
        t.committed += u64::from(self.pending);
        t.draft_nodes += draft_nodes as u64;
        t.accepted_nodes += accepted_nodes as u64;
        self.pending = 0;
        self.closed = true;
    }
}

/// How a block is completed, one forward at a time: the strategy half of a [`Request`].
///
/// For every forward the request asks [`propose`](StepStrategy::propose) for the states to
/// score (the first is usually the current state), and hands their statistics, in the same
/// order, to [`absorb`](StepStrategy::absorb), which applies the commits they decide through
/// [`BlockRun::apply_step`] and closes the forward with [`BlockRun::finish_forward`]. A
/// strategy that stays exact must commit exactly what the target's own transition decides.
pub trait StepStrategy {
    /// The strategy's error type; core errors convert into it.
    type Error: From<Error>;

    /// The block states to score next (at least one; all of the block's length).
    fn propose(
        &mut self,
        block: &BlockRun,
        states: &mut Vec<BlockState>,
    ) -> Result<(), Self::Error>;

    /// The statistics of the proposed states, in order.
    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> Result<(), Self::Error>;

    /// The query of the forward just proposed; the decode's own (`base`) unless the strategy
    /// is an ablation that redraws the noise per round.
    fn round_query(&self, base: &StatsQuery) -> StatsQuery {
        *base
    }

    /// After [`StepStrategy::propose`]: a complete state of the block that the strategy
    /// expects the block to end as in this forward (e.g. the likeliest complete node of its
    /// draft tree), for a look-ahead ([`crate::Carry::lookahead`]): when the block does end
    /// so, the next block's first forward is already scored. `None` (the default): no
    /// look-ahead.
    fn lookahead(&self) -> Option<&BlockState> {
        None
    }

    /// Before the first [`StepStrategy::propose`] of a block: statistics of the block's first
    /// state that a look-ahead scored under another end of the block before (or that the
    /// request could not serve as the block's first forward). They are close to the true
    /// ones, so a speculative strategy may draft the block's first forward from them (the
    /// verifier still decides every commit). Ignored by default.
    fn refresh(&mut self, stats: BlockStats) {
        let _ = stats;
    }
}

impl<S: StepStrategy + ?Sized> StepStrategy for &mut S {
    type Error = S::Error;
    fn propose(
        &mut self,
        block: &BlockRun,
        states: &mut Vec<BlockState>,
    ) -> Result<(), Self::Error> {
        (**self).propose(block, states)
    }
    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> Result<(), Self::Error> {
        (**self).absorb(block, stats)
    }
    fn round_query(&self, base: &StatsQuery) -> StatsQuery {
        (**self).round_query(base)
    }
    fn lookahead(&self) -> Option<&BlockState> {
        (**self).lookahead()
    }
    fn refresh(&mut self, stats: BlockStats) {
        (**self).refresh(stats)
    }
}

/// What a [`Request`] needs from the model next.
#[derive(Debug)]
pub enum Need<'a> {
    /// Set the generation end, then make `prefix` the request's committed prefix (dropping
    /// its cache); answer with [`Request::prefix_done`].
    Prefill {
        /// The prompt's whole blocks (may be empty).
        prefix: &'a [TokenId],
        /// The block size of the decode.
        block_size: usize,
        /// The absolute end of the last block ([`crate::Prefix::generation_end`]).
        generation_end: usize,
    },
    /// Score `states` after the request's prefix with `query`, carrying `carry` (a
    /// [`crate::ScoreGroup`]): the block just finished, appended first (the first forward of
    /// the next block carries it), and a look-ahead the strategy asked for. Answer with
    /// [`Request::scored_group`], or [`Request::scored_after_append`] (or
    /// [`Request::scored`] when the model appended inside the forward at no forward of its
    /// own) with a served look-ahead's statistics last.
    Score {
        /// Block states of equal length (at least one).
        states: &'a [BlockState],
        /// The request's query.
        query: &'a StatsQuery,
        /// What the forward carries besides the states.
        carry: Carry<'a>,
    },
    /// Nothing more: call [`Request::finish`].
    Done,
}

/// A finished block, as streamed by [`Request::next_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockEvent {
    /// Index of the finished block.
    pub index: usize,
    /// Blocks planned (decoding may stop earlier).
    pub total: usize,
    /// The block's generated tokens (prompt tail excluded).
    pub tokens: Vec<TokenId>,
    /// Block forwards so far.
    pub block_forwards: u64,
    /// Whether this was the request's last block.
    pub last: bool,
}

/// A stop condition checked at every block end, e.g. stop strings on the decoded text.
pub trait StopCheck: Send {
    /// Given the output so far (the first `max_new_tokens` generated ids, cut after a stop id
    /// when `early_stop` is set), returns how many of them to keep when decoding should end
    /// here, `None` to go on.
    fn check(&mut self, output: &[TokenId]) -> Option<usize>;
}

impl<F: FnMut(&[TokenId]) -> Option<usize> + Send> StopCheck for F {
    fn check(&mut self, output: &[TokenId]) -> Option<usize> {
        self(output)
    }
}

/// Cancels a [`Request`] from anywhere (another thread, an observer, a server's disconnect
/// handler): the request stops before its next forward and [`Request::finish`] returns the
/// blocks finished so far with [`DecodeOutput::cancelled`] set.
#[derive(Clone, Debug, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Asks the request to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether cancellation was asked for.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Prefill,
    Score,
    Done,
    Failed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "a prefill",
            Phase::Score => "a forward",
            Phase::Done => "nothing (done)",
            Phase::Failed => "nothing (failed)",
        }
    }
}

/// One decode, step by step; see the [module documentation](self).
///
/// `Request<S>` is `Send` when the strategy is, so requests can move between threads and a
/// server can keep many in flight.
pub struct Request<S> {
    prompt: Vec<TokenId>,
    cfg: DecodeConfig,
    query: StatsQuery,
    round_query: StatsQuery,
    info: ModelInfo,
    plan: BlockPlan,
    strategy: S,
    phase: Phase,
    block: Option<BlockRun>,
    states: Vec<BlockState>,
    finished: Vec<TokenId>,
    /// The look-ahead of the forward in flight: the hypothesised end of the block, and the
    /// next block's first state.
    lookahead: Option<(BlockState, BlockState)>,
    /// A served look-ahead: the block end it assumed and the next block's first statistics.
    prefetched: Option<(BlockState, BlockStats)>,
    meter: Meter,
    stats: DecodeStats,
    trace: Option<DecodeTrace>,
    generated: Vec<TokenId>,
    stopped: bool,
    stop_cut: Option<usize>,
    cancel: CancelHandle,
    events: VecDeque<BlockEvent>,
    stop_check: Option<Box<dyn StopCheck>>,
}

impl<S> std::fmt::Debug for Request<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt_len", &self.prompt.len())
            .field("phase", &self.phase)
            .field("blocks_done", &self.stats.blocks)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

impl<S: StepStrategy> Request<S> {
    /// A request for `prompt` under `cfg` against a model described by `info`; the prompt
    /// and configuration are checked here.
    pub fn new(
        prompt: &[TokenId],
        cfg: &DecodeConfig,
        info: &ModelInfo,
        strategy: S,
    ) -> Result<Self, S::Error> {
        let plan = crate::config::plan_blocks(prompt, cfg, info)?;
        Ok(Self {
            prompt: prompt.to_vec(),
            cfg: cfg.clone(),
            query: cfg.query(),
            round_query: cfg.query(),
            info: info.clone(),
            plan,
            strategy,
            phase: Phase::Prefill,
            block: None,
            states: Vec::new(),
            finished: Vec::new(),
            lookahead: None,
            prefetched: None,
            meter: Meter::default(),
            stats: DecodeStats::default(),
            trace: None,
            generated: Vec::with_capacity(plan.blocks * cfg.block_size),
            stopped: false,
            stop_cut: None,
            cancel: CancelHandle::default(),
            events: VecDeque::new(),
            stop_check: None,
        })
    }

    /// Also return the commit history in [`DecodeOutput::trace`].
    pub fn with_trace(mut self, record: bool) -> Self {
        self.trace = record.then(DecodeTrace::default);
        self
    }

    /// Ends decoding at the first block end where `check` says so (e.g. stop strings).
    pub fn with_stop_check(mut self, check: impl StopCheck + 'static) -> Self {
        self.stop_check = Some(Box::new(check));
        self
    }

    /// A handle that cancels this request.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Cancels the request: it needs nothing more.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// The configuration.
    pub fn config(&self) -> &DecodeConfig {
        &self.cfg
    }

    /// The block plan.
    pub fn plan(&self) -> BlockPlan {
        self.plan
    }

    /// The strategy.
    pub fn strategy(&self) -> &S {
        &self.strategy
    }

    /// Work counters so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// What the request needs next.
    pub fn need(&self) -> Need<'_> {
        if self.cancel.is_cancelled() {
            return Need::Done;
        }
        match self.phase {
            Phase::Prefill => Need::Prefill {
                prefix: &self.prompt[..self.plan.first_start],
                block_size: self.cfg.block_size,
                generation_end: self.plan.first_start + self.plan.blocks * self.cfg.block_size,
            },
            Phase::Score => Need::Score {
                states: &self.states,
                query: &self.round_query,
                carry: Carry {
                    append: &self.finished,
                    lookahead: self
                        .lookahead
                        .as_ref()
                        .map(|(end, next)| (end.tokens(), next)),
                },
            },
            Phase::Done | Phase::Failed => Need::Done,
        }
    }

    /// The next finished-block event, if any.
    pub fn next_event(&mut self) -> Option<BlockEvent> {
        self.events.pop_front()
    }

    /// Whether an answer arriving now is dropped: the request was cancelled while its
    /// forward ran (e.g. from another thread: a server whose client went away). It is not an
    /// error; the request is done and [`Request::finish`] returns the blocks finished before.
    fn dropped(&self) -> bool {
        self.cancel.is_cancelled() && matches!(self.phase, Phase::Prefill | Phase::Score)
    }

    fn expect(&mut self, phases: &[Phase], got: &'static str) -> Result<()> {
        if phases.contains(&self.phase) && !self.cancel.is_cancelled() {
            return Ok(());
        }
        let expected = self.phase.name();
        Err(Error::RequestState { expected, got })
    }

    /// The answer to [`Need::Prefill`].
    pub fn prefix_done(&mut self, update: PrefixUpdate) -> Result<(), S::Error> {
        if self.dropped() {
            return Ok(());
        }
        self.expect(&[Phase::Prefill], "a prefix update")?;
        self.meter.count_prefix(update);
        self.guarded(|r| r.open_block(0))
    }

    /// The answer to [`Need::Score`]: one statistics entry per state, and the target
    /// positions the forward processed for them (for [`Meter::positions_processed`]). A
    /// pending append counts as carried by that forward (no forward of its own, its
    /// positions added).
    pub fn scored(&mut self, stats: Vec<BlockStats>, positions: u64) -> Result<(), S::Error> {
        let carried = PrefixUpdate {
            ran_forward: false,
            positions: self.finished.len(),
        };
        self.scored_after_append(carried, stats, positions)
    }

    /// [`Request::scored`] with what the pending append cost (as the model reported it:
    /// [`GroupScores::append`]; ignored when nothing was pending) and a served look-ahead's
    /// statistics after the states'.
    pub fn scored_after_append(
        &mut self,
        append: PrefixUpdate,
        mut stats: Vec<BlockStats>,
        positions: u64,
    ) -> Result<(), S::Error> {
        let served = self.lookahead.is_some() && stats.len() == self.states.len() + 1;
        let lookahead = if served { stats.pop() } else { None };
        self.scored_group(GroupScores {
            append,
            stats,
            lookahead,
            positions,
        })
    }

    /// The answer to [`Need::Score`] as a model's forward gave it for this request's group
    /// ([`crate::ScoreGroup`] with the need's carry): what the append cost, the statistics,
    /// the served look-ahead and the positions computed.
    pub fn scored_group(&mut self, scores: GroupScores) -> Result<(), S::Error> {
        if self.dropped() {
            return Ok(());
        }
        self.expect(&[Phase::Score], "statistics")?;
        let GroupScores {
            append,
            mut stats,
            lookahead,
            mut positions,
        } = scores;
        if !self.finished.is_empty() {
            self.meter.count_prefix(append);
            self.finished.clear();
        }
        match (self.lookahead.take(), lookahead) {
            (Some((end, next)), Some(served)) => {
                // The look-ahead's block and state rode in the forward.
                positions += (end.len() + next.len()) as u64;
                let one = std::slice::from_ref(&served);
                self.guarded(|r| check_forward(one, 1, next.len(), &r.info).map_err(Into::into))?;
                self.prefetched = Some((end, served));
            }
            // Statistics for a look-ahead that was not asked for: one entry too many, which
            // the check of the states' statistics refuses.
            (None, Some(extra)) => stats.push(extra),
            (_, None) => {}
        }
        self.guarded(|r| r.absorb(stats, positions, true))
    }

    /// Runs `f`; on an error the request is failed (it needs nothing more).
    fn guarded(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), S::Error>,
    ) -> Result<(), S::Error> {
        let out = f(self);
        if out.is_err() {
            self.phase = Phase::Failed;
        }
        out
    }

    /// The statistics of the proposed states; `counted`: they came from a forward of their own
    /// (not a served look-ahead).
    fn absorb(
        &mut self,
        stats: Vec<BlockStats>,
        positions: u64,
        counted: bool,
    ) -> Result<(), S::Error> {
        if counted {
            self.meter.count_block_forward(self.states.len(), positions);
        } else {
            self.stats.prefetched_forwards += 1;
        }
        check_forward(&stats, self.states.len(), self.cfg.block_size, &self.info)?;
        let Some(block) = self.block.as_mut() else {
            return Err(Error::RequestState {
                expected: "an open block",
                got: "statistics",
            }
            .into());
        };
        block.closed = false;
        block.prefetched = !counted;
        self.strategy.absorb(block, stats)?;
        if !block.closed {
            block.finish_forward(0, 0);
        }
        block.forwards += 1;
        if block.state.is_complete() {
            self.close_block()?;
        } else {
            self.propose()?;
        }
        Ok(())
    }

    fn propose(&mut self) -> Result<(), S::Error> {
        self.states.clear();
        let Some(block) = self.block.as_ref() else {
            return Ok(());
        };
        self.strategy.propose(block, &mut self.states)?;
        if self.states.is_empty() {
            return Err(Error::config("strategy", "proposed no state to score").into());
        }
        check_state_lengths(&self.states, block.state.len())?;
        // A look-ahead only where a next block follows, for a complete state of this one.
        let next_start = block.start + block.state.len();
        self.lookahead = self
            .strategy
            .lookahead()
            .filter(|end| end.len() == block.state.len() && end.is_complete())
            .filter(|_| block.index + 1 < self.plan.blocks)
            .map(|end| (end.clone(), self.first_state(next_start)));
        self.round_query = self.strategy.round_query(&self.query);
        self.phase = Phase::Score;
        Ok(())
    }

    /// The first state of the block starting at `start`: the prompt's tail, then masks.
    fn first_state(&self, start: usize) -> BlockState {
        let tail = self.prompt.get(start..).unwrap_or(&[]);
        let mut tokens = vec![self.info.mask_id; self.cfg.block_size];
        let n = tail.len().min(tokens.len());
        tokens[..n].copy_from_slice(&tail[..n]);
        BlockState::from_tokens(tokens, self.info.mask_id)
    }

    fn open_block(&mut self, index: usize) -> Result<(), S::Error> {
        let l = self.cfg.block_size;
        let start = self.plan.first_start + index * l;
        let state = self.first_state(start);
        self.block = Some(BlockRun {
            state,
            start,
            index,
            query: self.query,
            transition: self.cfg.transition,
            forwards: 0,
            step_count: 0,
            pending: 0,
            closed: false,
            prefetched: false,
            tally: DecodeStats::default(),
            steps: self.trace.is_some().then(Vec::new),
        });
        if self.block.as_ref().is_some_and(|b| b.state.is_complete()) {
            return self.close_block();
        }
        // The block's first forward was scored by the previous forward's look-ahead, when the
        // block before ended as it assumed and the strategy proposes that state alone. Not
        // when that step would end this block too: its append would then wait behind the
        // previous block's, and a forward carries one. Otherwise the look-ahead's statistics
        // go to the strategy as a refresh.
        let Some((end, stats)) = self.prefetched.take() else {
            return self.propose();
        };
        let serves = self.block.as_ref().is_some_and(|b| {
            let mut commits = Vec::new();
            let ends = b
                .transition
                .commits(b.steps(), &b.state, &stats, &mut commits);
            end.tokens() == self.finished.as_slice()
                && ends.is_ok_and(|()| commits.len() < b.state.masked_count())
        });
        if !serves {
            self.stats.refreshed_blocks += 1;
            self.strategy.refresh(stats);
            return self.propose();
        }
        self.propose()?;
        match self.block.as_ref() {
            Some(b) if self.states.len() == 1 && self.states[0] == b.state => {
                self.absorb(vec![stats], 0, false)
            }
            _ => Ok(()),
        }
    }

    fn close_block(&mut self) -> Result<(), S::Error> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let BlockRun {
            state,
            start,
            index,
            tally,
            steps,
            ..
        } = block;
        let s = &mut self.stats;
        s.blocks += 1;
        s.committed += tally.committed;
        s.commits_per_forward.extend(tally.commits_per_forward);
        s.draft_nodes += tally.draft_nodes;
        s.accepted_nodes += tally.accepted_nodes;
        let block = state.into_tokens();
        let tail = self.prompt.len().saturating_sub(start).min(block.len());
        if let Some(t) = self.trace.as_mut() {
            let mut initial = block.clone();
            initial[tail..].fill(self.info.mask_id);
            t.blocks.push(BlockTrace {
                start,
                initial: BlockState::from_tokens(initial, self.info.mask_id),
                steps: steps.unwrap_or_default(),
            });
        }
        let new = &block[tail..];
        self.generated.extend_from_slice(new);
        if self.cfg.early_stop && new.iter().any(|t| self.cfg.stop_ids.contains(t)) {
            self.stopped = true;
        }
        if !self.stopped
            && let Some(check) = self.stop_check.as_mut()
        {
            let output = output_tokens(&self.generated, &self.cfg);
            if let Some(keep) = check.check(&output) {
                self.stop_cut = Some(keep.min(output.len()));
                self.stopped = true;
            }
        }
        let last = self.stopped || index + 1 >= self.plan.blocks;
        self.events.push_back(BlockEvent {
            index,
            total: self.plan.blocks,
            tokens: new.to_vec(),
            block_forwards: self.meter.block_forwards,
            last,
        });
        if last {
            self.phase = Phase::Done;
            Ok(())
        } else {
            // The next block's first forward carries this one's append.
            self.finished = block;
            self.open_block(index + 1)
        }
    }

    /// Whether the request needs nothing more (done, failed or cancelled).
    pub fn is_done(&self) -> bool {
        matches!(self.need(), Need::Done)
    }

    /// The output: after [`Need::Done`], or the blocks finished so far after a cancellation.
    /// Fails when called earlier, or after the request failed.
    pub fn finish(self) -> Result<DecodeOutput, S::Error> {
        self.finish_parts().0
    }

    /// [`Request::finish`], also handing back the strategy (a speculative decoder's report).
    pub fn finish_parts(self) -> (Result<DecodeOutput, S::Error>, S) {
        let cancelled = self.cancel.is_cancelled() && self.phase != Phase::Done;
        if !cancelled && self.phase != Phase::Done {
            let err = Error::RequestState {
                expected: self.phase.name(),
                got: "finish",
            };
            return (Err(err.into()), self.strategy);
        }
        let mut stats = self.stats;
        stats.absorb(&self.meter);
        let mut tokens = output_tokens(&self.generated, &self.cfg);
        if let Some(cut) = self.stop_cut {
            tokens.truncate(cut);
        }
        let out = DecodeOutput {
            tokens,
            generated: self.generated,
            stopped: self.stopped,
            cancelled,
            stats,
            trace: self.trace,
        };
        (Ok(out), self.strategy)
    }
}

/// The first `max_new_tokens` generated ids, cut after the first stop id when `early_stop`.
fn output_tokens(generated: &[TokenId], cfg: &DecodeConfig) -> Vec<TokenId> {
    let mut tokens: Vec<TokenId> = generated.iter().copied().take(cfg.max_new_tokens).collect();
    if cfg.early_stop
        && let Some(i) = tokens.iter().position(|t| cfg.stop_ids.contains(t))
    {
        tokens.truncate(i + 1);
    }
    tokens
}
