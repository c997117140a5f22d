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
//! assert!(fast.stats.nfe <= reference.stats.nfe);
//! # Ok::<(), spot_dlm::Error>(())
//! ```

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::time::Instant;

pub use spot_core::{
    self as core, ArConfig, ArInfo, ArOutput, AutoregressiveModel, BlockDecoder,
    BlockDiffusionModel, BlockObserver, BlockProgress, BlockRun, BlockState, BlockStats, Commit,
    ConfidenceRule, DecodeConfig, DecodeOutput, DecodeStats, DecodeTrace, DraftFreeDecoder,
    GumbelNoise, MeteredModel, ModelInfo, StatsQuery, TokenId, Transition, decode_autoregressive,
    exact_commit, run_decode, toy,
};
pub use spot_tree::{
    self as tree, DraftTree, OracleScorer, OrderScorer, RandomScorer, ScoreContext,
    StaleConfidenceScorer, TreeBuilder, TreeConfig, TreeError,
};
pub use spot_verify::{self as verify, MatchRule, RoundEnd, Verifier};

mod report;
pub use report::SpotReport;

/// Errors of the facade: core errors (input, model) and tree errors (drafter, limits).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Invalid input, a model failure or invalid model output.
    #[error(transparent)]
    Core(#[from] spot_core::Error),
    /// Invalid tree limits or drafter output.
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// How a [`SpotDecoder`] drafts.
enum Drafter {
    /// Best-first tree ranked by an order scorer (SPOT, BlockSpec, oracle, ...).
    Tree(Box<dyn OrderScorer>),
    /// SSD-style chain by stale confidence.
    Chain,
}

/// Builder for [`SpotDecoder`]; see [`SpotDecoder::builder`].
pub struct SpotDecoderBuilder {
    tree: TreeConfig,
    drafter: Drafter,
    rule: MatchRule,
    record_trace: bool,
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
    pub fn scorer(mut self, scorer: impl OrderScorer + 'static) -> Self {
        self.drafter = Drafter::Tree(Box::new(scorer));
        self
    }

    /// Draft an SSD-style chain instead of a tree.
    pub fn chain(mut self) -> Self {
        self.drafter = Drafter::Chain;
        self
    }

    /// How nodes are matched ([`MatchRule::Coupled`], the exact rule, by default).
    pub fn match_rule(mut self, rule: MatchRule) -> Self {
        self.rule = rule;
        self
    }

    /// Also return the commit history in [`DecodeOutput::trace`].
    pub fn record_trace(mut self, record: bool) -> Self {
        self.record_trace = record;
        self
    }

    /// Validates the limits and builds the decoder.
    pub fn build(self) -> Result<SpotDecoder, Error> {
        Ok(SpotDecoder {
            builder: TreeBuilder::new(self.tree)?,
            drafter: self.drafter,
            verifier: Verifier::new(self.rule),
            record_trace: self.record_trace,
            scratch: Vec::new(),
            round: 0,
            report: SpotReport::default(),
        })
    }
}

/// The speculative decoder: draft tree -> one-forward verification -> commit, block by block.
///
/// Same inputs, same stop and length semantics and same output as [`DraftFreeDecoder`]; see the
/// crate documentation for an example.
pub struct SpotDecoder {
    builder: TreeBuilder,
    drafter: Drafter,
    verifier: Verifier,
    record_trace: bool,
    scratch: Vec<Commit>,
    round: u64,
    report: SpotReport,
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
        self.round = 0;
        self.report = SpotReport::default();
        let record = self.record_trace;
        run_decode(model, prompt, cfg, self, record, observer)
    }
}

impl BlockDecoder for SpotDecoder {
    type Error = Error;

    fn decode_block(
        &mut self,
        model: &mut MeteredModel<'_>,
        block: &mut BlockRun<'_>,
    ) -> Result<(), Error> {
        if block.state().is_complete() {
            return Ok(());
        }
        // The first forward of a block has no stale distribution: a plain step.
        let mut stale = block.plain_step(model, &mut self.scratch)?;
        while !block.state().is_complete() {
            let root = block.state().clone();
            let ctx = ScoreContext {
                root: &root,
                stale: &stale,
                block_start: block.start(),
            };
            let t0 = Instant::now();
            let tree = match &mut self.drafter {
                Drafter::Tree(scorer) => self.builder.build(&ctx, scorer.as_mut())?,
                Drafter::Chain => self.builder.build_chain(&ctx)?,
            };
            let t1 = Instant::now();
            let outcome =
                self.verifier
                    .verify(model, tree, block.query(), block.transition(), self.round)?;
            let t2 = Instant::now();
            self.report.record(
                outcome.walk.accepted_nodes,
                RoundEnd::classify(tree, &outcome.walk),
                t1 - t0,
                t2 - t1,
            );
            self.round += 1;
            for step in outcome.walk.steps() {
                block.apply_step(step)?;
            }
            block.finish_forward(tree.draft_count(), outcome.walk.accepted_nodes);
            match outcome.stale {
                Some(s) => stale = s,
                None => break,
            }
        }
        Ok(())
    }
}
