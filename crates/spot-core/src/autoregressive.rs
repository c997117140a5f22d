//! Autoregressive targets (the SpecDiff-2 setting): a causal model with a KV cache that can
//! append several tokens in one forward and roll back, and the plain token-by-token decoder
//! that is its ground truth.
//!
//! Sampling uses the same coupled noise as block diffusion: the token at absolute position `p`
//! is `argmax_v(logits_v / T + G[p, v])` ([`crate::GumbelNoise`]), argmax at `T = 0`, so a
//! speculative decoder that verifies drafted tokens against these statistics reproduces the
//! plain decoder exactly.
//!
//! ```
//! use spot_core::autoregressive::{decode_autoregressive, ArConfig, CountingModel};
//!
//! // A toy causal model whose next token is (last + 1) mod 10.
//! let mut model = CountingModel::new(10);
//! let out = decode_autoregressive(&mut model, &[3], &ArConfig { max_new_tokens: 4, ..ArConfig::default() })?;
//! assert_eq!(out.tokens, vec![4, 5, 6, 7]);
//! assert_eq!(out.forwards, 4);
//! # Ok::<(), spot_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::model::{CacheSlot, CacheUsage, Slots};
use crate::state::TokenId;
use crate::stats::{BlockStats, PositionStats, StatsQuery};

/// Static facts of an autoregressive model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArInfo {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context limit (positions).
    pub max_positions: usize,
    /// Stop ids from the model folder.
    pub stop_ids: Vec<TokenId>,
}

/// One request's share of an autoregressive forward: append `shared` to the slot's cache
/// (kept) and score every branch after it (not kept).
#[derive(Clone, Copy, Debug)]
pub struct ArGroup<'a> {
    /// The request's cache.
    pub slot: CacheSlot,
    /// Tokens to append and keep (at least one).
    pub shared: &'a [TokenId],
    /// Continuations to score after `shared` without keeping them (may be none).
    pub branches: &'a [Vec<TokenId>],
    /// The statistics wanted (temperature, noise seed, top-k).
    pub query: &'a StatsQuery,
}

/// A model's answer for one [`ArGroup`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArScores {
    /// The statistics of `shared`: entry `i` predicts the position after its token `i`. At
    /// least the last token's entry (which predicts the branches' first position); a model
    /// may return that entry alone.
    pub shared: BlockStats,
    /// Per branch, one entry per token: entry `i` predicts the position after the branch's
    /// token `i`.
    pub branches: Vec<BlockStats>,
}

/// A causal language model with a KV cache per request: the target of SpecDiff-2.
///
/// Slots first, like [`crate::BlockDiffusionModel`]: the model owns one cache per
/// [`CacheSlot`] (slot 0 always exists) and one [`forward`](Self::forward) serves several
/// requests' groups. Implementations must be deterministic and **batch invariant**: a group's
/// statistics and cache may not depend on the other groups or branches in the forward, so
/// that a speculative decode reproduces [`decode_autoregressive`] exactly and a driver can
/// merge requests. Sampling uses the coupled noise of the absolute position each entry
/// predicts ([`crate::GumbelNoise`]).
///
/// Decoders never call it directly: every forward goes through [`MeteredArModel`], which
/// checks the groups and the answers and counts the forwards.
pub trait AutoregressiveModel {
    /// Static facts.
    fn ar_info(&self) -> &ArInfo;

    /// Opens an empty cache slot.
    fn open_slot(&mut self) -> Result<CacheSlot>;

    /// Frees a slot and its cache (slot 0 is only emptied). Unknown slots are ignored.
    fn close_slot(&mut self, slot: CacheSlot);

    /// What the open slots hold (a model that does not count them says
    /// `CacheUsage::default()`).
    fn cache_usage(&self) -> CacheUsage;

    /// Tokens in `slot`'s cache: the absolute position the next appended token takes (0 for
    /// an unknown slot).
    fn cached_len(&self, slot: CacheSlot) -> usize;

    /// Drops `slot`'s cached tokens after the first `len` (rolls back); `0` clears it.
    fn truncate(&mut self, slot: CacheSlot, len: usize) -> Result<()>;

    /// One forward over every group: each group's `shared` joins its slot's cache and its
    /// branches are scored after it. One [`ArScores`] per group, in order; a slot may appear
    /// in one group only. Every group's cache and statistics must equal, bit for bit, what
    /// appending `shared` alone and then each branch alone (rolled back) would give.
    fn forward(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>>;
}

impl<M: AutoregressiveModel + ?Sized> AutoregressiveModel for &mut M {
    fn ar_info(&self) -> &ArInfo {
        (**self).ar_info()
    }
    fn open_slot(&mut self) -> Result<CacheSlot> {
        (**self).open_slot()
    }
    fn close_slot(&mut self, slot: CacheSlot) {
        (**self).close_slot(slot)
    }
    fn cache_usage(&self) -> CacheUsage {
        (**self).cache_usage()
    }
    fn cached_len(&self, slot: CacheSlot) -> usize {
        (**self).cached_len(slot)
    }
    fn truncate(&mut self, slot: CacheSlot, len: usize) -> Result<()> {
        (**self).truncate(slot, len)
    }
    fn forward(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>> {
        (**self).forward(groups)
    }
}

/// The one way decoders reach an [`AutoregressiveModel`]: it checks every forward's groups
/// (distinct slots, something to append) and every answer (one [`ArScores`] per group, valid
/// statistics: at least one entry for `shared`, one per token for each branch, ids inside the
/// vocabulary) and counts the forwards. [`decode_autoregressive`], SpecDiff-2's decoder and
/// its batch driver go through it.
///
/// It is also the single-request adapter: [`MeteredArModel::new`] works in slot 0 and its
/// [`extend`](Self::extend), [`extend_branches`](Self::extend_branches) and
/// [`truncate`](Self::truncate) are the calls of one request.
///
/// ```
/// use spot_core::autoregressive::{CountingModel, MeteredArModel};
/// use spot_core::StatsQuery;
/// let mut counting = CountingModel::new(10);
/// let mut model = MeteredArModel::new(&mut counting);
/// let q = StatsQuery::new(0.0, 0);
/// let (first, branches) = model.extend_branches(&[1, 2], &[vec![3, 4], vec![3, 9]], &q)?;
/// assert_eq!(first.token(first.len() - 1), 3); // after 2 comes 3
/// assert_eq!((branches[0].token(1), branches[1].token(1)), (5, 0));
/// assert_eq!((model.cached_len(), model.forwards()), (2, 1)); // branches are not kept
/// # Ok::<(), spot_core::Error>(())
/// ```
pub struct MeteredArModel<'m> {
    model: &'m mut dyn AutoregressiveModel,
    slot: CacheSlot,
    forwards: u64,
    positions: u64,
}

impl std::fmt::Debug for MeteredArModel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredArModel")
            .field("slot", &self.slot)
            .field("info", self.model.ar_info())
            .field("forwards", &self.forwards)
            .field("positions", &self.positions)
            .finish()
    }
}

impl<'m> MeteredArModel<'m> {
    /// Wraps a model; the single-request calls use slot 0.
    pub fn new(model: &'m mut dyn AutoregressiveModel) -> Self {
        Self::in_slot(model, CacheSlot(0))
    }

    /// Wraps a model; the single-request calls use `slot`.
    pub fn in_slot(model: &'m mut dyn AutoregressiveModel, slot: CacheSlot) -> Self {
        Self {
            model,
            slot,
            forwards: 0,
            positions: 0,
        }
    }

    /// The model's static facts.
    pub fn info(&self) -> &ArInfo {
        self.model.ar_info()
    }

    /// The wrapped model (slots, monitoring; its forwards are not counted here).
    pub fn model(&mut self) -> &mut dyn AutoregressiveModel {
        self.model
    }

    /// Forwards so far (one per call that ran groups, whatever their number).
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// Token positions run so far (appended and branch tokens).
    pub fn positions(&self) -> u64 {
        self.positions
    }

    /// Tokens in the single-request slot's cache.
    pub fn cached_len(&self) -> usize {
        self.model.cached_len(self.slot)
    }

    /// Rolls the single-request slot back to its first `len` tokens; `0` clears it.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        self.model.truncate(self.slot, len)
    }

    /// Appends `tokens` (at least one) in one counted, checked forward and returns their
    /// statistics (at least the last token's entry).
    pub fn extend(&mut self, tokens: &[TokenId], query: &StatsQuery) -> Result<BlockStats> {
        Ok(self.extend_branches(tokens, &[], query)?.0)
    }

    /// Appends `shared` (kept) and scores every branch after it (not kept) in one counted,
    /// checked forward: the statistics of `shared` and, per branch, those of its tokens.
    pub fn extend_branches(
        &mut self,
        shared: &[TokenId],
        branches: &[Vec<TokenId>],
        query: &StatsQuery,
    ) -> Result<(BlockStats, Vec<BlockStats>)> {
        let group = ArGroup {
            slot: self.slot,
            shared,
            branches,
            query,
        };
        let scores = self.forward_groups(&[group])?.pop().unwrap_or_default();
        Ok((scores.shared, scores.branches))
    }

    /// One forward over several requests' groups, checked and counted. Any group's failed
    /// check fails the call.
    pub fn forward_groups(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>> {
        self.forward_each(groups)?.into_iter().collect()
    }

    /// [`MeteredArModel::forward_groups`] with each group's check apart: the outer error is
    /// the forward's (the groups, the model, the number of answers), an inner one a group's
    /// answer that failed its check, so that a driver fails only that group's request.
    pub fn forward_each(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<Result<ArScores>>> {
        CacheSlot::check_distinct(groups.iter().map(|g| g.slot))?;
        if groups.iter().any(|g| g.shared.is_empty()) {
            return Err(Error::config(
                "shared",
                "an autoregressive forward appends at least one token per group",
            ));
        }
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.model.forward(groups)?;
        if out.len() != groups.len() {
            return Err(Error::ShapeMismatch {
                what: "score groups per forward",
                expected: groups.len(),
                actual: out.len(),
            });
        }
        self.forwards += 1;
        let vocab = self.info().vocab_size;
        Ok(groups
            .iter()
            .zip(out)
            .map(|(g, scores)| {
                self.positions +=
                    (g.shared.len() + g.branches.iter().map(Vec::len).sum::<usize>()) as u64;
                check_scores(g, &scores, vocab).map(|()| scores)
            })
            .collect())
    }
}

/// One group's answer: valid statistics for `shared` (at least one entry) and one entry per
/// token of every branch.
fn check_scores(g: &ArGroup<'_>, scores: &ArScores, vocab: usize) -> Result<()> {
    check_stats(&scores.shared, 1, vocab)?;
    if scores.branches.len() != g.branches.len() {
        return Err(Error::ShapeMismatch {
            what: "scored branches per group",
            expected: g.branches.len(),
            actual: scores.branches.len(),
        });
    }
    for (b, stats) in g.branches.iter().zip(&scores.branches) {
        if !b.is_empty() {
            check_stats(stats, b.len(), vocab)?;
        }
    }
    Ok(())
}

/// Settings of [`decode_autoregressive`].
#[derive(Clone, Debug, PartialEq)]
pub struct ArConfig {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Noise seed.
    pub seed: u64,
    /// Stop ids (the model's when empty).
    pub stop_ids: Vec<TokenId>,
    /// Stop after the first stop id.
    pub early_stop: bool,
}

impl Default for ArConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            temperature: 0.0,
            seed: 0,
            stop_ids: Vec::new(),
            early_stop: true,
        }
    }
}

/// What [`decode_autoregressive`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct ArOutput {
    /// Generated ids, including the stop id that ended them.
    pub tokens: Vec<TokenId>,
    /// Whether a stop id ended the decode.
    pub stopped: bool,
    /// Model forwards (the prompt's prefill counts as one).
    pub forwards: u64,
}

/// Decodes token by token: one forward for the prompt, then one per generated token.
pub fn decode_autoregressive(
    model: &mut dyn AutoregressiveModel,
    prompt: &[TokenId],
    cfg: &ArConfig,
) -> Result<ArOutput> {
    let info = model.ar_info().clone();
    check_inputs(&info, prompt, cfg)?;
    let mut model = MeteredArModel::new(model);
    let query = StatsQuery {
        top_k: 1,
        ..StatsQuery::new(cfg.temperature, cfg.seed)
    };
    query.validate()?;
    let stops = if cfg.stop_ids.is_empty() {
        &info.stop_ids
    } else {
        &cfg.stop_ids
    };
    model.truncate(0)?;
    let mut stats = model.extend(prompt, &query)?;
    let mut tokens = Vec::with_capacity(cfg.max_new_tokens);
    loop {
        let next = stats.token(stats.len() - 1);
        tokens.push(next);
        let stopped = cfg.early_stop && stops.contains(&next);
        if stopped || tokens.len() == cfg.max_new_tokens {
            return Ok(ArOutput {
                tokens,
                stopped,
                forwards: model.forwards(),
            });
        }
        stats = model.extend(&[next], &query)?;
    }
}

/// Checks a decode's inputs against the model: a non-empty prompt inside the vocabulary,
/// `max_new_tokens` at least 1, and prompt plus generation within the context limit.
pub fn check_inputs(info: &ArInfo, prompt: &[TokenId], cfg: &ArConfig) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if cfg.max_new_tokens == 0 {
        return Err(Error::config("max_new_tokens", "must be at least 1, got 0"));
    }
    if let Some((index, &token)) = prompt
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= info.vocab_size)
    {
        return Err(Error::InvalidPromptToken {
            index,
            token,
            reason: "outside the vocabulary",
        });
    }
    let needed = prompt.len() + cfg.max_new_tokens;
    if needed > info.max_positions {
        return Err(Error::SequenceTooLong {
            prompt_len: prompt.len(),
            max_new_tokens: cfg.max_new_tokens,
            needed,
            block_size: 1,
            max_positions: info.max_positions,
        });
    }
    StatsQuery::new(cfg.temperature, cfg.seed).validate()
}

/// Checks statistics an autoregressive model returned: at least `expected` entries (at
/// least one), every id inside `vocab`, finite probabilities.
pub fn check_stats(stats: &BlockStats, expected: usize, vocab: usize) -> Result<()> {
    if stats.is_empty() || stats.len() < expected {
        return Err(Error::ShapeMismatch {
            what: "statistics per appended token",
            expected: expected.max(1),
            actual: stats.len(),
        });
    }
    // No mask token in an autoregressive vocabulary: `vocab` is out of range for every id.
    stats.validate(stats.len(), vocab, vocab as TokenId)
}

/// A toy causal model for tests and examples: the next token is `(last + 1) mod vocab`,
/// with probability 0.9. Every entry of `shared` is returned.
#[derive(Clone, Debug)]
pub struct CountingModel {
    info: ArInfo,
    slots: Slots<Vec<TokenId>>,
}

impl CountingModel {
    /// A counting model over `vocab` tokens (at least 2).
    pub fn new(vocab: usize) -> Self {
        Self {
            info: ArInfo {
                vocab_size: vocab.max(2),
                max_positions: 4096,
                stop_ids: Vec::new(),
            },
            slots: Slots::new(),
        }
    }

    fn next(&self, tokens: &[TokenId]) -> Result<BlockStats> {
        let v = self.info.vocab_size as TokenId;
        let mut out = BlockStats::new(1);
        for &t in tokens {
            let next = (t + 1) % v;
            out.push(PositionStats {
                token: next,
                confidence: 0.9,
                token_prob: 0.9,
                entropy: 0.5,
                tail_mass: 0.1,
                top_ids: &[next],
                top_probs: &[0.9],
            })?;
        }
        Ok(out)
    }
}

impl AutoregressiveModel for CountingModel {
    fn ar_info(&self) -> &ArInfo {
        &self.info
    }

    fn open_slot(&mut self) -> Result<CacheSlot> {
        Ok(self.slots.open())
    }

    fn close_slot(&mut self, slot: CacheSlot) {
        self.slots.close(slot);
    }

    fn cache_usage(&self) -> CacheUsage {
        CacheUsage {
            slots: self.slots.open_count(),
            bytes: self.slots.iter().map(|s| 4 * s.len() as u64).sum(),
        }
    }

    fn cached_len(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, Vec::len)
    }

    fn truncate(&mut self, slot: CacheSlot, len: usize) -> Result<()> {
        self.slots.get_mut(slot)?.truncate(len);
        Ok(())
    }

    fn forward(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            self.slots.get_mut(g.slot)?.extend_from_slice(g.shared);
            out.push(ArScores {
                shared: self.next(g.shared)?,
                branches: g
                    .branches
                    .iter()
                    .map(|b| self.next(b))
                    .collect::<Result<_>>()?,
            });
        }
        Ok(out)
    }
}
