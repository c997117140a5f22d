//! # spot-dlm
//!
//! Lossless speculative decoding for block-diffusion language models (SPOT: commit-order
//! speculation). Add this crate, implement (or pick) a [`BlockDiffusionModel`], and decode with
//! a [`SpotDecoder`]: the output is **identical, token for token**, to the draft-free decoder
//! ([`DraftFreeDecoder`]) at every temperature, with fewer target forwards.
//!
//! Each block starts with one plain forward. Then every round builds a draft tree of
//! hypothesised future block states from the stale statistics of the last verified state,
//! checks the root and the whole tree in **one** batched forward, and commits the accepted path
//! plus the target's own next choice.
//!
//! ```
//! use spot_dlm::{DecodeConfig, DraftFreeDecoder, SpotDecoder, StaleConfidenceScorer};
//! use spot_dlm::toy::{ToyConfig, ToyModel};
//!
//! let mut model = ToyModel::new(ToyConfig::default());
//! let cfg = DecodeConfig { block_size: 16, max_new_tokens: 64, temperature: 1.0, seed: 3,
//!     ..DecodeConfig::default() };
//! let prompt = [4, 8, 15, 16, 23, 42];
//!
//! let reference = DraftFreeDecoder::new().decode(&mut model, &prompt, &cfg)?;
//! let mut spot = SpotDecoder::builder()
//!     .budget(8)
//!     .scorer(StaleConfidenceScorer)
//!     .build()?;
//! let fast = spot.decode(&mut model, &prompt, &cfg)?;
//! assert_eq!(fast.tokens, reference.tokens);
//! assert!(fast.stats.work.nfe <= reference.stats.work.nfe);
//! # Ok::<(), spot_dlm::Error>(())
//! ```

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::time::Instant;

pub use spot_core::{
    self as core, ArConfig, ArGroup, ArInfo, ArOutput, ArScores, AutoregressiveModel, BatchDriver,
    BlockDiffusionModel, BlockEvent, BlockLayout, BlockObserver, BlockProgress, BlockRun,
    BlockState, BlockStats, CacheSlot, CacheUsage, CancelHandle, Carry, Commit, ConfidenceRule,
    DecodeConfig, DecodeOutput, DecodeStats, DecodeTrace, DraftFreeDecoder, Error, Finished,
    GroupScores, GumbelNoise, Meter, MeteredArModel, MeteredModel, ModelInfo, Need, PositionStats,
    Prefix, PrefixUpdate, ReduceScratch, Request, RequestId, Result, ScoreGroup, Slots, StatsQuery,
    StepStrategy, StopCheck, TokenId, Transition, decode_autoregressive, exact_commit,
    reduce_block, reduce_logits, run_decode, run_request, toy,
};
pub use spot_reduce::{self as reduce, HostHead};
pub use spot_sets::{self as sets, JoinModel, SetTreeBuilder, SetTreeConfig, StaleThresholdJoin};
pub use spot_tree::{
    self as tree, DraftTree, Expand, OracleScorer, OrderScorer, RandomScorer, ScoreContext,
    StaleConfidenceScorer, TokenOracleScorer, TreeBuilder, TreeConfig, TreeError,
};
pub use spot_verify::{self as verify, MatchRule, RoundEnd, Verifier};

pub mod floor;
mod report;
pub use report::SpotReport;

/// How a [`SpotDecoder`] drafts.
enum Drafter {
    /// Best-first tree ranked by an order scorer (SPOT, BlockSpec, oracle, ...).
    Tree(Box<dyn OrderScorer + Send>),
    /// SSD-style chain by stale confidence.
    Chain,
    /// Set-valued tree for threshold decoding (SPOT-Sets): one edge per threshold step.
    Sets(
        Box<dyn JoinModel + Send>,
        Box<dyn OrderScorer + Send>,
        SetTreeConfig,
    ),
}

/// Builder for [`SpotDecoder`]; see [`SpotDecoder::builder`].
pub struct SpotDecoderBuilder {
    tree: TreeConfig,
    drafter: Drafter,
    rule: MatchRule,
    record_trace: bool,
    adaptive_gamma: bool,
    block_ends: BlockEnds,
}

/// What a [`SpotDecoder`] does at the end of a block (SPOT-Sets' block-end designs; both on
/// by default, neither changes the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEnds {
    /// **Cross-block drafting.** A round whose tree holds complete states of the block names
    /// the likeliest one as a look-ahead ([`StepStrategy::lookahead`]); the forward also
    /// scores the next block's first state behind it. When no node is complete but one
    /// leaves at most this many positions masked, the least-masked node (the heaviest of
    /// them) completed with the stale choices is named instead. `0`: only complete nodes.
    pub fill: usize,
    /// **Draft refresh.** When the block ended otherwise than the look-ahead assumed, draft
    /// the next block's first forward from the look-ahead's statistics
    /// ([`StepStrategy::refresh`]) instead of taking a plain step there.
    pub refresh: bool,
}

impl Default for BlockEnds {
    fn default() -> Self {
        BlockEnds {
            fill: 8,
            refresh: true,
        }
    }
}

impl std::fmt::Debug for SpotDecoderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpotDecoderBuilder")
            .field("tree", &self.tree)
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

impl SpotDecoderBuilder {
    /// Budget `D`: draft nodes per round (the forward scores `1 + D` states at most).
    pub fn budget(mut self, d: usize) -> Self {
        self.tree.budget = d;
        self
    }

    /// Deepest draft node below the root.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.tree.max_depth = depth;
        self
    }

    /// Mass floor `γ` (SPOT-γ): drop draft candidates less likely than this.
    pub fn gamma(mut self, gamma: f32) -> Self {
        self.tree.gamma = gamma;
        self
    }

    /// Which nodes each scorer call takes (best-first, the scorer's batch, by default; [`Expand`]).
    pub fn expand(mut self, expand: Expand) -> Self {
        self.tree.expand = expand;
        self
    }

    /// Hedge threshold (`Some(0.6)` by default); `None` disables the runner-up token.
    pub fn hedge(mut self, hedge: Option<f32>) -> Self {
        self.tree.hedge = hedge;
        self
    }

    /// All tree limits at once.
    pub fn tree_config(mut self, cfg: TreeConfig) -> Self {
        self.tree = cfg;
        self
    }

    /// Draft a best-first tree ranked by `scorer` (the default is
    /// [`StaleConfidenceScorer`], the BlockSpec-style tree).
    pub fn scorer(mut self, scorer: impl OrderScorer + Send + 'static) -> Self {
        self.drafter = Drafter::Tree(Box::new(scorer));
        self
    }

    /// Draft an SSD-style chain instead of a tree.
    pub fn chain(mut self) -> Self {
        self.drafter = Drafter::Chain;
        self
    }

    /// Draft set-valued trees (SPOT-Sets): each edge is one whole step of the target's
    /// threshold rule, predicted by `model` ([`StaleThresholdJoin`] needs no training), with
    /// `order` ranking the single position the target commits when none clears the threshold;
    /// grown best-first under `cfg` (its budget replaces [`budget`](Self::budget)). Exact
    /// under any transition; it pays off when the decode's [`Transition`] is a threshold.
    ///
    /// ```
    /// use spot_dlm::{DecodeConfig, DraftFreeDecoder, SetTreeConfig, SpotDecoder,
    ///     StaleConfidenceScorer, StaleThresholdJoin, Transition};
    /// use spot_dlm::toy::{ToyConfig, ToyModel};
    /// let mut model = ToyModel::new(ToyConfig::default());
    /// let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16,
    ///     transition: Transition::Threshold { tau: 0.3 }, ..DecodeConfig::default() };
    /// let reference = DraftFreeDecoder::new().decode(&mut model, &[1, 2, 3], &cfg)?;
    /// let mut sets = SpotDecoder::builder()
    ///     .sets(StaleThresholdJoin, StaleConfidenceScorer,
    ///         SetTreeConfig { budget: 4, ..SetTreeConfig::default() })
    ///     .build()?;
    /// assert_eq!(sets.decode(&mut model, &[1, 2, 3], &cfg)?.tokens, reference.tokens);
    /// # Ok::<(), spot_dlm::Error>(())
    /// ```
    pub fn sets(
        mut self,
        model: impl JoinModel + Send + 'static,
        order: impl OrderScorer + Send + 'static,
        cfg: SetTreeConfig,
    ) -> Self {
        self.drafter = Drafter::Sets(Box::new(model), Box::new(order), cfg);
        self
    }

    /// The adaptive mass floor ([`floor::ForwardCost`]): each round raises the floor `γ` to
    /// `b / t(1 + D)`, where `t(n) = a + b·n` is the forward time over `n` states fitted on the
    /// rounds so far, so that a node is drafted only when its mass pays for the time it adds
    /// to the forward. The configured `γ` stays the lower bound. Exact either way (the floor
    /// only changes which states are scored).
    pub fn adaptive_gamma(mut self, on: bool) -> Self {
        self.adaptive_gamma = on;
        self
    }

    /// How nodes are matched ([`MatchRule::Coupled`], the exact rule, by default).
    pub fn match_rule(mut self, rule: MatchRule) -> Self {
        self.rule = rule;
        self
    }

    /// The block-end designs ([`BlockEnds::default`]: look-ahead completions of up to 8
    /// positions, draft refresh on).
    pub fn block_ends(mut self, ends: BlockEnds) -> Self {
        self.block_ends = ends;
        self
    }

    /// Also return the commit history in [`DecodeOutput::trace`].
    pub fn record_trace(mut self, record: bool) -> Self {
        self.record_trace = record;
        self
    }

    /// Validates the limits and builds the decoder.
    pub fn build(self) -> Result<SpotDecoder, Error> {
        let sets = match &self.drafter {
            Drafter::Sets(_, _, cfg) => Some(SetTreeBuilder::new(*cfg)?),
            _ => None,
        };
        let base_gamma = sets.as_ref().map_or(self.tree.gamma, |s| s.config().gamma);
        Ok(SpotDecoder {
            builder: TreeBuilder::new(self.tree)?,
            sets,
            drafter: self.drafter,
            verifier: Verifier::new(self.rule),
            record_trace: self.record_trace,
            scratch: Vec::new(),
            round: 0,
            lookahead: None,
            cost: self.adaptive_gamma.then(floor::ForwardCost::default),
            base_gamma,
            sent: None,
            report: SpotReport::default(),
            stale: None,
            refreshed: false,
            grafted: DraftTree::default(),
            grafted_round: false,
            block_ends: self.block_ends,
            drafted: None,
        })
    }
}

/// The speculative decoder: draft tree -> one-forward verification -> commit, block by block.
///
/// Same inputs, same stop and length semantics and same output as [`DraftFreeDecoder`]; see the
/// crate documentation for an example. As a [`StepStrategy`] it drives a [`Request`] (one
/// decoder per request; its [`SpotDecoder::report`] covers the requests it completed).
pub struct SpotDecoder {
    builder: TreeBuilder,
    sets: Option<SetTreeBuilder>,
    drafter: Drafter,
    verifier: Verifier,
    record_trace: bool,
    scratch: Vec<Commit>,
    round: u64,
    report: SpotReport,
    /// The statistics of the last verified state of the current block.
    stale: Option<BlockStats>,
    /// `stale` holds a refresh for the block's first state ([`StepStrategy::refresh`]).
    refreshed: bool,
    /// A set tree's refreshed round: its refreshed step, with the round's tree grafted below.
    grafted: DraftTree,
    /// The pending forward verifies `grafted`.
    grafted_round: bool,
    /// The block-end designs.
    block_ends: BlockEnds,
    /// How long drafting the pending forward's tree took (`None`: the pending forward is a
    /// plain step).
    drafted: Option<std::time::Duration>,
    /// When the pending forward's states were handed over.
    sent: Option<Instant>,
    /// The likeliest complete state of the pending tree: the look-ahead it asks for.
    lookahead: Option<BlockState>,
    /// The forward-time fit of the adaptive floor (`None`: the configured floor only).
    cost: Option<floor::ForwardCost>,
    /// The configured floor.
    base_gamma: f32,
}

impl std::fmt::Debug for SpotDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpotDecoder")
            .field("tree", self.builder.config())
            .field("rule", &self.verifier.rule())
            .finish_non_exhaustive()
    }
}

impl SpotDecoder {
    /// A builder with budget 8, depth limit 16, no mass floor, hedge 0.6, the stale-confidence
    /// scorer and coupled matching.
    pub fn builder() -> SpotDecoderBuilder {
        SpotDecoderBuilder {
            tree: TreeConfig::default(),
            drafter: Drafter::Tree(Box::new(StaleConfidenceScorer)),
            rule: MatchRule::Coupled,
            record_trace: false,
            adaptive_gamma: false,
            block_ends: BlockEnds::default(),
        }
    }

    /// Diagnostics of the last decode: rounds, drafting vs verification time, accepted-node
    /// histogram and why rounds ended.
    pub fn report(&self) -> &SpotReport {
        &self.report
    }

    /// Decodes `prompt` with `model`.
    pub fn decode(
        &mut self,
        model: &mut dyn BlockDiffusionModel,
        prompt: &[TokenId],
        cfg: &DecodeConfig,
    ) -> Result<DecodeOutput, Error> {
        self.decode_observed(model, prompt, cfg, &mut ())
    }

    /// Decodes `prompt`, reporting every finished block to `observer`.
    pub fn decode_observed(
        &mut self,
        model: &mut dyn BlockDiffusionModel,
        prompt: &[TokenId],
        cfg: &DecodeConfig,
        observer: &mut dyn BlockObserver,
    ) -> Result<DecodeOutput, Error> {
        self.reset();
        let record = self.record_trace;
        run_decode(model, prompt, cfg, self, record, observer)
    }

    /// A [`Request`] for `prompt` that this decoder completes (its report and round count
    /// start afresh); drive it with [`run_request`] or a [`BatchDriver`].
    pub fn request(
        &mut self,
        prompt: &[TokenId],
        cfg: &DecodeConfig,
        info: &ModelInfo,
    ) -> Result<Request<&mut Self>, Error> {
        self.reset();
        let record = self.record_trace;
        Ok(Request::new(prompt, cfg, info, self)?.with_trace(record))
    }

    /// The budget `D` of the tree in use.
    fn budget(&self) -> usize {
        match &self.sets {
            Some(sets) => sets.config().budget,
            None => self.builder.config().budget,
        }
    }

    fn reset(&mut self) {
        self.round = 0;
        self.report = SpotReport::default();
        self.stale = None;
        self.refreshed = false;
        self.drafted = None;
    }
}

impl StepStrategy for SpotDecoder {
    type Error = Error;

    fn propose(&mut self, block: &BlockRun, states: &mut Vec<BlockState>) -> Result<(), Error> {
        // The first forward of a block has no stale distribution (unless refreshed): a plain
        // step.
        self.lookahead = None;
        let refreshed = std::mem::take(&mut self.refreshed);
        let stale = match &self.stale {
            Some(s) if block.forwards() > 0 || refreshed => s,
            _ => {
                self.drafted = None;
                states.push(block.state().clone());
                self.sent = Some(Instant::now());
                return Ok(());
            }
        };
        let ctx = ScoreContext {
            root: block.state(),
            stale,
            block_start: block.start(),
            noise: (block.query().temperature > 0.0).then_some(block.query().noise),
            temperature: block.query().temperature,
        };
        if let Some(g) = self.cost.as_ref().and_then(|c| c.floor(self.budget() + 1)) {
            let g = g.max(self.base_gamma);
            match &mut self.sets {
                Some(sets) => sets.set_gamma(g)?,
                None => self.builder.set_gamma(g)?,
            }
        }
        let t0 = Instant::now();
        self.grafted_round = false;
        let tree = match (&mut self.drafter, &mut self.sets) {
            (Drafter::Sets(model, order, _), Some(sets)) => {
                let tau = match block.transition() {
                    Transition::Threshold { tau } => tau,
                    Transition::Scheduled { tau, .. } => tau.unwrap_or(f32::INFINITY),
                    Transition::Exact | Transition::Timesteps { .. } => f32::INFINITY,
                };
                // A refreshed round: the statistics are the root's own (nearly), so its step
                // is drafted as they decide, and the tree grows below it as in a round whose
                // stale statistics are its parent's.
                let step = match refreshed {
                    true => refreshed_step(block, stale, &mut self.scratch)?,
                    false => None,
                };
                let budget = sets.config().budget;
                match step {
                    Some(next) if budget > 1 => {
                        sets.set_budget(budget - 1)?;
                        let ctx = ScoreContext { root: &next, ..ctx };
                        let built = sets
                            .build(&ctx, tau, model.as_mut(), order.as_mut())
                            .map(|_| ());
                        sets.set_budget(budget)?;
                        built?;
                        self.grafted.reset(block.state());
                        let first = self.grafted.push_set(0, &self.scratch, 1.0)?;
                        self.grafted.graft(first, sets.tree())?;
                        self.grafted_round = true;
                        &self.grafted
                    }
                    _ => sets.build(&ctx, tau, model.as_mut(), order.as_mut())?,
                }
            }
            (Drafter::Tree(scorer), _) => {
                let before = self.builder.counts();
                self.builder.build(&ctx, scorer.as_mut())?;
                let added = self.builder.counts().since(&before);
                self.report.drafter.add(&added);
                self.builder.tree()
            }
            _ => self.builder.build_chain(&ctx)?,
        };
        self.verifier.batch(tree, states);
        self.lookahead = tree.block_end(stale, self.block_ends.fill);
        self.drafted = Some(t0.elapsed());
        self.sent = Some(Instant::now());
        Ok(())
    }

    fn lookahead(&self) -> Option<&BlockState> {
        self.lookahead.as_ref()
    }

    fn refresh(&mut self, stats: BlockStats) {
        if self.block_ends.refresh {
            self.stale = Some(stats);
            self.refreshed = true;
        }
    }

    fn round_query(&self, base: &StatsQuery) -> StatsQuery {
        let mut q = match self.drafted {
            Some(_) => self.verifier.round_query(base, self.round),
            None => *base,
        };
        // A drafter reading hidden states gets them from every forward: each forward's
        // statistics are a later round's stale ones.
        q.hidden_states |= match &self.drafter {
            Drafter::Sets(m, order, _) => m.wants_hidden_states() || order.wants_hidden_states(),
            Drafter::Tree(scorer) => scorer.wants_hidden_states(),
            Drafter::Chain => false,
        };
        q
    }

    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> Result<(), Error> {
        let sent = self.sent.take();
        // Every forward times the adaptive floor's fit, except a step a look-ahead served.
        if let (Some(cost), Some(at)) = (self.cost.as_mut(), sent)
            && !block.prefetched()
        {
            cost.record(stats.len(), at.elapsed().as_secs_f64());
        }
        let (Some(drafting), Some(sent)) = (self.drafted.take(), sent) else {
            self.stale =
                Some(block.plain_absorb(spot_core::first_stats(stats)?, &mut self.scratch)?);
            return Ok(());
        };
        let tree = match &self.sets {
            _ if self.grafted_round => &self.grafted,
            Some(sets) => sets.tree(),
            None => self.builder.tree(),
        };
        let outcome = self
            .verifier
            .walk_stats(tree, stats, block.transition(), block.steps())?;
        self.report.record(
            outcome.walk.accepted_nodes,
            RoundEnd::classify(tree, &outcome.walk),
            drafting,
            sent.elapsed(),
        );
        self.round += 1;
        for step in outcome.walk.steps() {
            block.apply_step(step)?;
        }
        block.finish_forward(tree.draft_count(), outcome.walk.accepted_nodes);
        self.stale = outcome.stale;
        Ok(())
    }
}

/// The state a refreshed round's root steps to under the block's own transition applied to
/// the refreshed statistics (its commits left in `commits`), when that step leaves positions
/// masked.
fn refreshed_step(
    block: &BlockRun,
    stats: &BlockStats,
    commits: &mut Vec<Commit>,
) -> Result<Option<BlockState>, Error> {
    commits.clear();
    block
        .transition()
        .commits(block.steps(), block.state(), stats, commits)?;
    if commits.is_empty() || commits.len() >= block.state().masked_count() {
        return Ok(None);
    }
    let mut next = block.state().clone();
    for &c in commits.iter() {
        next.commit(c)?;
    }
    Ok(Some(next))
}

/// Either decoder as one [`StepStrategy`] type, so that one [`BatchDriver`] can run
/// draft-free and speculative requests side by side.
///
/// ```
/// use spot_dlm::{BatchDriver, BlockDiffusionModel, DecodeConfig, Request, SpotDecoder, Strategy};
/// use spot_dlm::toy::{ToyConfig, ToyModel};
///
/// let mut model = ToyModel::new(ToyConfig::default());
/// let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16, ..DecodeConfig::default() };
/// let mut driver = BatchDriver::new(4)?;
/// let info = model.info().clone();
/// driver.submit(Request::new(&[1, 2], &cfg, &info, Strategy::draft_free())?);
/// let spot = SpotDecoder::builder().budget(4).build()?;
/// driver.submit(Request::new(&[1, 2], &cfg, &info, Strategy::from(spot))?);
/// let done = driver.run(&mut model)?;
/// let [a, b] = [&done[0], &done[1]].map(|f| f.output.as_ref().unwrap().tokens.clone());
/// assert_eq!(a, b); // the same tokens, fewer forwards for the speculative one
/// # Ok::<(), spot_dlm::Error>(())
/// ```
#[derive(Debug)]
pub enum Strategy {
    /// The draft-free decoder.
    DraftFree(DraftFreeDecoder),
    /// A speculative decoder.
    Spot(Box<SpotDecoder>),
}

impl Strategy {
    /// The draft-free decoder.
    pub fn draft_free() -> Self {
        Strategy::DraftFree(DraftFreeDecoder::new())
    }

    /// The speculative decoder's diagnostics (`None` for draft-free decoding).
    pub fn report(&self) -> Option<&SpotReport> {
        match self {
            Strategy::DraftFree(_) => None,
            Strategy::Spot(d) => Some(d.report()),
        }
    }
}

impl From<SpotDecoder> for Strategy {
    fn from(d: SpotDecoder) -> Self {
        Strategy::Spot(Box::new(d))
    }
}

impl From<DraftFreeDecoder> for Strategy {
    fn from(d: DraftFreeDecoder) -> Self {
        Strategy::DraftFree(d)
    }
}

impl StepStrategy for Strategy {
    type Error = Error;

    fn propose(&mut self, block: &BlockRun, states: &mut Vec<BlockState>) -> Result<(), Error> {
        match self {
            Strategy::DraftFree(d) => Ok(d.propose(block, states)?),
            Strategy::Spot(d) => d.propose(block, states),
        }
    }

    fn absorb(&mut self, block: &mut BlockRun, stats: Vec<BlockStats>) -> Result<(), Error> {
        match self {
            Strategy::DraftFree(d) => Ok(d.absorb(block, stats)?),
            Strategy::Spot(d) => d.absorb(block, stats),
        }
    }

    fn round_query(&self, base: &StatsQuery) -> StatsQuery {
        match self {
            Strategy::DraftFree(d) => d.round_query(base),
            Strategy::Spot(d) => d.round_query(base),
        }
    }

    fn lookahead(&self) -> Option<&BlockState> {
        match self {
            Strategy::DraftFree(d) => d.lookahead(),
            Strategy::Spot(d) => d.lookahead(),
        }
    }

    fn refresh(&mut self, stats: BlockStats) {
        match self {
            Strategy::DraftFree(d) => d.refresh(stats),
            Strategy::Spot(d) => d.refresh(stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn decoding_types_are_send() {
        assert_send::<SpotDecoder>();
        assert_send::<DraftFreeDecoder>();
        assert_send::<Request<SpotDecoder>>();
        assert_send::<Request<DraftFreeDecoder>>();
        assert_send::<BatchDriver<SpotDecoder>>();
        assert_send::<BatchDriver<Strategy>>();
        assert_send::<DecodeOutput>();
        assert_send::<CancelHandle>();
    }
}
