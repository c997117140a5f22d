//! The contract between decoders and target models.

use crate::error::{Error, Result};
use crate::state::{BlockState, TokenId};
use crate::stats::{BlockStats, StatsQuery};

/// Static facts about a target model that decoders need.
///
/// Built with [`ModelInfo::new`] and the `with_` methods, so that a field added later does not
/// break a model written today:
///
/// ```
/// use spot_core::{BlockLayout, ModelInfo};
/// let info = ModelInfo::new(32_000, 31_999, 4096).with_stop_ids(vec![2]).with_block_size(32);
/// assert_eq!((info.layout, info.any_layout), (BlockLayout::Aligned, false));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelInfo {
    /// Number of token ids the model scores.
    pub vocab_size: usize,
    /// The mask token id.
    pub mask_id: TokenId,
    /// The longest sequence (prompt + generation, whole blocks) the model accepts.
    pub max_positions: usize,
    /// Stop ids the model's generation config declares (may be empty).
    pub stop_ids: Vec<TokenId>,
    /// The block size the checkpoint declares (`block_size` in SDAR's and LLaDA2.0's
    /// `config.json`), when it declares one; [`crate::DecodeConfig::for_model`] uses it.
    pub block_size: Option<usize>,
    /// The block layout of the family's own sampler; [`crate::DecodeConfig::for_model`] uses
    /// it.
    pub layout: BlockLayout,
    /// Whether the model decodes correctly under every [`BlockLayout`] (full attention
    /// over the sequence); otherwise a decode with another layout than `layout` is refused.
    pub any_layout: bool,
}

impl ModelInfo {
    /// A model scoring `vocab_size` ids with mask id `mask_id`, accepting sequences of up to
    /// `max_positions` tokens: no stop ids, no declared block size, aligned blocks only.
    pub fn new(vocab_size: usize, mask_id: TokenId, max_positions: usize) -> Self {
        Self {
            vocab_size,
            mask_id,
            max_positions,
            stop_ids: Vec::new(),
            block_size: None,
            layout: BlockLayout::Aligned,
            any_layout: false,
        }
    }

    /// The stop ids the model's generation config declares.
    pub fn with_stop_ids(mut self, stop_ids: Vec<TokenId>) -> Self {
        self.stop_ids = stop_ids;
        self
    }

    /// The block size the checkpoint declares.
    pub fn with_block_size(mut self, block_size: usize) -> Self {
        self.block_size = Some(block_size);
        self
    }

    /// The family's own block layout, and whether the model also decodes every other layout
    /// (full attention over the sequence).
    pub fn with_layout(mut self, layout: BlockLayout, any_layout: bool) -> Self {
        self.layout = layout;
        self.any_layout = any_layout;
        self
    }
}

/// Where a decode's blocks sit.
///
/// ```
/// use spot_core::{BlockLayout, DecodeConfig, config::plan_blocks, toy::{ToyConfig, ToyModel}};
/// use spot_core::BlockDiffusionModel;
/// let model = ToyModel::new(ToyConfig::default());
/// let prompt = [1, 2, 3, 4, 5];
/// let cfg = DecodeConfig { block_size: 4, max_new_tokens: 8, ..DecodeConfig::default() };
/// // Aligned: blocks [4, 8) (the prompt's last token rides in it) to [12, 16).
/// let aligned = plan_blocks(&prompt, &cfg, model.info()).unwrap();
/// assert_eq!((aligned.first_start, aligned.blocks), (4, 3));
/// // After the prompt: blocks [5, 9) and [9, 13).
/// let cfg = DecodeConfig { layout: BlockLayout::AfterPrompt, ..cfg };
/// let after = plan_blocks(&prompt, &cfg, model.info()).unwrap();
/// assert_eq!((after.first_start, after.blocks), (5, 2));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BlockLayout {
    /// Blocks start at absolute multiples of the block size; the prompt's last partial block
    /// rides in the first decoded block. SDAR's and LLaDA2.0's samplers decode this way, and
    /// block-causal models (trained on aligned blocks) accept nothing else.
    #[default]
    Aligned,
    /// The first block starts right after the prompt, and the generation region is
    /// `ceil(max_new_tokens / L)` whole blocks: LLaDA's own semi-autoregressive sampler. Only
    /// models with full attention over the sequence accept it
    /// ([`ModelInfo::any_layout`](crate::ModelInfo::any_layout)).
    AfterPrompt,
}

impl BlockLayout {
    /// The command-line spelling: `aligned` or `after-prompt`.
    pub fn name(self) -> &'static str {
        match self {
            BlockLayout::Aligned => "aligned",
            BlockLayout::AfterPrompt => "after-prompt",
        }
    }
}

/// What a prefix update cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixUpdate {
    /// Whether the model ran a forward (it then counts as one NFE).
    pub ran_forward: bool,
    /// Target positions that forward processed.
    pub positions: usize,
}

impl PrefixUpdate {
    /// The update of a model that ran one forward over `positions` new prefix positions (no
    /// forward when there are none).
    pub fn forward(positions: usize) -> Self {
        Self {
            ran_forward: positions > 0,
            positions,
        }
    }

    /// The update of an append of `positions` that rode in the forward of its group's states
    /// (no forward of its own).
    pub fn carried(positions: usize) -> Self {
        Self {
            ran_forward: false,
            positions,
        }
    }
}

/// Handle of one request's prefix cache inside a [`BlockDiffusionModel`].
///
/// Slot 0 always exists: single-request callers ([`MeteredModel::new`], [`crate::run_decode`])
/// use it. [`BlockDiffusionModel::open_slot`] hands out the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheSlot(pub usize);

/// A request's committed prefix, as [`BlockDiffusionModel::reset_prefix`] receives it.
#[derive(Clone, Copy, Debug)]
pub struct Prefix<'a> {
    /// The prefix tokens (may be empty): a whole number of blocks of `block_size` positions.
    /// Block-causal models attend within each of those blocks bidirectionally and causally
    /// across them.
    pub tokens: &'a [TokenId],
    /// The block size of the decode.
    pub block_size: usize,
    /// The absolute end of the region the decode will generate (the end of its last block).
    /// Models that attend to future masked positions (LLaDA, Dream: the whole region is masks
    /// before it is decoded) need it; block-causal models may ignore it. It is part of the
    /// prefix call so that no decoder can forget it.
    pub generation_end: usize,
}

/// What a request's forward carries besides its block states.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carry<'a> {
    /// A finished block to append to the prefix before the states (empty: none).
    pub append: &'a [TokenId],
    /// A look-ahead `(block, next)`: score the state `next` of the following block after the
    /// prefix (with `append`) extended by `block`, a hypothesised end of the current block,
    /// which is not kept. A decoder whose block ends as `block` then has the statistics of
    /// the next block's first forward without running it. A model may decline (answer
    /// `None` in [`GroupScores::lookahead`]).
    pub lookahead: Option<(&'a [TokenId], &'a BlockState)>,
}

/// One request's share of a forward: its block states, scored after its own cached prefix
/// (extended first by the carried block) with its own query.
#[derive(Clone, Copy, Debug)]
pub struct ScoreGroup<'a> {
    /// The request's cache.
    pub slot: CacheSlot,
    /// States of equal length, right after the slot's prefix and the carried append (may be
    /// empty: a group that only appends).
    pub states: &'a [BlockState],
    /// The request's query (temperature, noise seed, confidence rule, top-k).
    pub query: &'a StatsQuery,
    /// The finished block appended first, and a look-ahead.
    pub carry: Carry<'a>,
}

impl<'a> ScoreGroup<'a> {
    /// Scores `states` after `slot`'s prefix, carrying nothing.
    pub fn new(slot: CacheSlot, states: &'a [BlockState], query: &'a StatsQuery) -> Self {
        Self {
            slot,
            states,
            query,
            carry: Carry::default(),
        }
    }

    /// The same group carrying `carry`.
    pub fn carrying(mut self, carry: Carry<'a>) -> Self {
        self.carry = carry;
        self
    }
}

/// What a forward gives one [`ScoreGroup`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupScores {
    /// What the carried append cost: `ran_forward: true` when it needed a forward of its own
    /// (a group that only appends, or a model that cannot extend its cache inside the states'
    /// forward), `false` when it rode in the states' forward or nothing was appended.
    pub append: PrefixUpdate,
    /// One entry per state, in order.
    pub stats: Vec<BlockStats>,
    /// The look-ahead's statistics, when the group asked for one and the model served it.
    pub lookahead: Option<BlockStats>,
    /// Target positions the forward computed for the states: the block itself per state for
    /// cached models, the whole window per state for models that recompute the prefix or
    /// attend to future masks (LLaDA, Dream). Work accounting
    /// ([`Meter::positions_processed`]) only.
    pub positions: u64,
}

impl GroupScores {
    /// A group's statistics and the positions computed for them: nothing appended, no
    /// look-ahead.
    pub fn new(stats: Vec<BlockStats>, positions: u64) -> Self {
        Self {
            stats,
            positions,
            ..Self::default()
        }
    }

    /// The same scores with what the carried append cost.
    pub fn with_append(mut self, append: PrefixUpdate) -> Self {
        self.append = append;
        self
    }
}

/// What the open slots hold, for monitoring (a server watches it to see that finished and
/// cancelled requests give their caches back).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Slots open now, slot 0 included.
    pub slots: usize,
    /// Bytes their caches hold (keys, values, noise rows, prefix ids).
    pub bytes: u64,
}

/// A block-diffusion language model as decoders see it: prefix caches in slots, and one
/// forward that scores the block states of any number of requests.
///
/// The model owns one cache of the committed prefix (prompt blocks and finished blocks) per
/// [`CacheSlot`]. A [`forward`](BlockDiffusionModel::forward) scores, for each group, a batch
/// of block states that all sit right after that group's prefix, attending to it without
/// copying it per state, and returns one [`BlockStats`] per state. Implementations must be
/// deterministic and **batch invariant**: a state's statistics may not depend on the other
/// states or groups in the forward, nor on whether the prefix came from the cache or was
/// recomputed. That is what makes speculative decoding return bit-identical tokens and lets
/// a [`crate::BatchDriver`] merge requests.
///
/// Everything a family must say is one of these seven methods or data in [`ModelInfo`]: the
/// trait has no provided method a model could override to change results or counters.
/// Decoders never call it directly: every forward of every decoder and driver goes through
/// [`MeteredModel`], which checks shapes and statistics and counts the work. Single-request
/// use (slot 0) is [`MeteredModel::new`]. Implementations report their own failures
/// through [`Error::model`]; turn logits into statistics with [`crate::reduce_logits`].
pub trait BlockDiffusionModel {
    /// Static facts: vocabulary, mask id, context limit, stop ids, layout.
    fn info(&self) -> &ModelInfo;

    /// Opens an empty cache slot.
    fn open_slot(&mut self) -> Result<CacheSlot>;

    /// Frees a slot and its cache (slot 0 is only emptied). Unknown slots are ignored.
    fn close_slot(&mut self, slot: CacheSlot);

    /// What the open slots hold (a model that does not count them says
    /// `CacheUsage::default()`).
    fn cache_usage(&self) -> CacheUsage;

    /// Length of `slot`'s committed prefix: the absolute position of its current block's first
    /// slot (0 for an unknown slot).
    fn prefix_len(&self, slot: CacheSlot) -> usize;

    /// Drops `slot`'s cache and makes `prefix` its committed prefix, for a decode that will
    /// generate up to `prefix.generation_end`.
    fn reset_prefix(&mut self, slot: CacheSlot, prefix: Prefix<'_>) -> Result<PrefixUpdate>;

    /// One forward over every group: each group's carried block joins its slot's prefix, its
    /// states are scored after that prefix, and its look-ahead (when served) after the prefix
    /// extended by the hypothesised block end, which is not kept. One [`GroupScores`] per
    /// group, in order; a slot may appear in one group only. Every group's caches and
    /// statistics must equal, bit for bit, what the group alone would give (and the append
    /// alone, then the states alone).
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<GroupScores>>;
}

impl<M: BlockDiffusionModel + ?Sized> BlockDiffusionModel for &mut M {
    fn info(&self) -> &ModelInfo {
        (**self).info()
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
    fn prefix_len(&self, slot: CacheSlot) -> usize {
        (**self).prefix_len(slot)
    }
    fn reset_prefix(&mut self, slot: CacheSlot, prefix: Prefix<'_>) -> Result<PrefixUpdate> {
        (**self).reset_prefix(slot, prefix)
    }
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<GroupScores>> {
        (**self).forward(groups)
    }
}

/// Work counters of one decode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meter {
    /// Target forward calls of any kind (the NFE).
    pub nfe: u64,
    /// Target positions processed: the positions the model reports per block forward
    /// ([`GroupScores::positions`]: the block size per state for cached models, the whole
    /// window for LLaDA/Dream), plus prefix positions for prefill and block appends, plus a
    /// served look-ahead's block and state.
    pub positions_processed: u64,
    /// Forwards over block states (decoding forwards, excluding prefill and appends).
    pub block_forwards: u64,
    /// Forwards that only wrote the prefix cache (prefill and finished-block appends).
    pub prefix_forwards: u64,
    /// Block states scored in total (sum of batch sizes).
    pub states_scored: u64,
}

impl Meter {
    /// Counts a prefix update (prefill or block append): one NFE when it ran a forward.
    pub fn count_prefix(&mut self, update: PrefixUpdate) {
        if update.ran_forward {
            self.nfe += 1;
            self.prefix_forwards += 1;
        }
        self.positions_processed += update.positions as u64;
    }

    /// Counts one block forward over `states` states that processed `positions` target
    /// positions.
    pub fn count_block_forward(&mut self, states: usize, positions: u64) {
        self.nfe += 1;
        self.block_forwards += 1;
        self.states_scored += states as u64;
        self.positions_processed += positions;
    }
}

/// Fails unless every state of a batch has `len` positions.
pub(crate) fn check_state_lengths(states: &[BlockState], len: usize) -> Result<()> {
    match states.iter().find(|s| s.len() != len) {
        Some(bad) => Err(Error::ShapeMismatch {
            what: "block states in one batch",
            expected: len,
            actual: bad.len(),
        }),
        None => Ok(()),
    }
}

/// Fails unless a forward over `states` states of `len` positions returned one valid
/// statistics entry per state.
pub(crate) fn check_forward(
    stats: &[BlockStats],
    states: usize,
    len: usize,
    info: &ModelInfo,
) -> Result<()> {
    if stats.len() != states {
        return Err(Error::ShapeMismatch {
            what: "statistics per batch",
            expected: states,
            actual: stats.len(),
        });
    }
    for s in stats {
        s.validate(len, info.vocab_size, info.mask_id)?;
    }
    Ok(())
}

/// The one way decoders and drivers reach a model: every prefill and forward, checked and
/// counted.
///
/// Before a forward it checks the groups (distinct slots, states of equal length); after it,
/// the model's answer (one [`GroupScores`] per group, one valid statistics entry per state,
/// a look-ahead only where one was asked for). [`crate::run_decode`],
/// [`crate::BatchDriver`] and the verifier (`spot_verify::Verifier`) all go through it, so
/// no decode trusts statistics that were not checked. Its [`Meter`] counts the model's work:
/// one NFE per forward that scored states, whatever the number of groups.
///
/// It is also the single-request adapter: [`MeteredModel::new`] works in slot 0 and its
/// `reset_prefix`, `append_block`, `forward` and `forward_carrying` are the calls of one
/// request.
///
/// ```
/// use spot_core::{BlockState, MeteredModel, StatsQuery};
/// use spot_core::toy::{ToyConfig, ToyModel};
/// let mut toy = ToyModel::new(ToyConfig::default());
/// let mut model = MeteredModel::new(&mut toy);
/// model.reset_prefix(&[1, 2, 3, 4], 4, 12)?;
/// let state = BlockState::masked(4, model.info().mask_id);
/// let stats = model.forward(&[state.clone(), state], &StatsQuery::new(0.0, 0))?;
/// assert_eq!((stats.len(), model.meter().block_forwards), (2, 1));
/// # Ok::<(), spot_core::Error>(())
/// ```
pub struct MeteredModel<'m> {
    model: &'m mut dyn BlockDiffusionModel,
    slot: CacheSlot,
    meter: Meter,
}

impl std::fmt::Debug for MeteredModel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredModel")
            .field("slot", &self.slot)
            .field("info", self.model.info())
            .field("meter", &self.meter)
            .finish()
    }
}

impl<'m> MeteredModel<'m> {
    /// Wraps a model; the single-request calls use slot 0.
    pub fn new(model: &'m mut dyn BlockDiffusionModel) -> Self {
        Self::in_slot(model, CacheSlot(0))
    }

    /// Wraps a model; the single-request calls use `slot`.
    pub fn in_slot(model: &'m mut dyn BlockDiffusionModel, slot: CacheSlot) -> Self {
        Self {
            model,
            slot,
            meter: Meter::default(),
        }
    }

    /// The model's static facts.
    pub fn info(&self) -> &ModelInfo {
        self.model.info()
    }

    /// Counters so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The slot the single-request calls use.
    pub fn slot(&self) -> CacheSlot {
        self.slot
    }

    /// The wrapped model (slots, monitoring; its forwards are not counted here).
    pub fn model(&mut self) -> &mut dyn BlockDiffusionModel {
        self.model
    }

    /// Absolute position of the current block's first slot.
    pub fn prefix_len(&self) -> usize {
        self.model.prefix_len(self.slot)
    }

    /// Makes `prefix` the committed prefix of a decode generating up to `generation_end`
    /// (counted).
    pub fn reset_prefix(
        &mut self,
        prefix: &[TokenId],
        block_size: usize,
        generation_end: usize,
    ) -> Result<PrefixUpdate> {
        let prefix = Prefix {
            tokens: prefix,
            block_size,
            generation_end,
        };
        self.reset_prefix_in(self.slot, prefix)
    }

    /// [`MeteredModel::reset_prefix`] for any slot.
    pub fn reset_prefix_in(&mut self, slot: CacheSlot, prefix: Prefix<'_>) -> Result<PrefixUpdate> {
        let update = self.model.reset_prefix(slot, prefix)?;
        self.meter.count_prefix(update);
        Ok(update)
    }

    /// Appends a finished block to the committed prefix (a forward of its own where the model
    /// needs one; counted).
    pub fn append_block(&mut self, block: &[TokenId]) -> Result<PrefixUpdate> {
        let carry = Carry {
            append: block,
            lookahead: None,
        };
        let query = StatsQuery::new(0.0, 0);
        let group = ScoreGroup::new(self.slot, &[], &query).carrying(carry);
        Ok(self
            .forward_groups(&[group])?
            .pop()
            .unwrap_or_default()
            .append)
    }

    /// One counted, checked forward over `states`. An empty batch is not a forward and
    /// returns nothing.
    pub fn forward(
        &mut self,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let group = ScoreGroup::new(self.slot, states, query);
        Ok(self
            .forward_groups(&[group])?
            .pop()
            .unwrap_or_default()
            .stats)
    }

    /// One counted, checked forward over `states` carrying `carry`.
    pub fn forward_carrying(
        &mut self,
        carry: Carry<'_>,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<GroupScores> {
        let group = ScoreGroup::new(self.slot, states, query).carrying(carry);
        Ok(self.forward_groups(&[group])?.pop().unwrap_or_default())
    }

    /// One forward over several requests' groups, checked and counted (each group's append
    /// as a prefix update, one block forward for all the states). Any group's failed check
    /// fails the call.
    pub fn forward_groups(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<GroupScores>> {
        self.forward_each(groups)?.into_iter().collect()
    }

    /// [`MeteredModel::forward_groups`] with each group's check apart: the outer error is the
    /// forward's (the groups, the model, the number of answers), an inner one a group's
    /// answer that failed its check, so that a driver fails only that group's request.
    pub fn forward_each(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<Result<GroupScores>>> {
        check_distinct_slots(groups)?;
        for g in groups {
            if let Some(first) = g.states.first() {
                check_state_lengths(g.states, first.len())?;
            }
        }
        let out = self.model.forward(groups)?;
        if out.len() != groups.len() {
            return Err(Error::ShapeMismatch {
                what: "score groups per forward",
                expected: groups.len(),
                actual: out.len(),
            });
        }
        let (mut states, mut positions) = (0, 0);
        let mut checked = Vec::with_capacity(out.len());
        for (g, scores) in groups.iter().zip(out) {
            self.meter.count_prefix(scores.append);
            states += g.states.len();
            positions += scores.positions;
            if let (Some((block, next)), Some(_)) = (g.carry.lookahead, &scores.lookahead) {
                positions += (block.len() + next.len()) as u64;
            }
            checked.push(self.check_group(g, scores));
        }
        if states > 0 {
            self.meter.count_block_forward(states, positions);
        }
        Ok(checked)
    }

    /// A group's answer: one valid entry per state, a valid look-ahead only where one was
    /// asked for.
    fn check_group(&self, g: &ScoreGroup<'_>, scores: GroupScores) -> Result<GroupScores> {
        let len = g.states.first().map_or(0, BlockState::len);
        check_forward(&scores.stats, g.states.len(), len, self.info())?;
        match (g.carry.lookahead, &scores.lookahead) {
            (_, None) => {}
            (Some((_, next)), Some(served)) => {
                check_forward(std::slice::from_ref(served), 1, next.len(), self.info())?;
            }
            (None, Some(_)) => {
                return Err(Error::model(
                    "a look-ahead was served that no group asked for",
                ));
            }
        }
        Ok(scores)
    }
}

/// A table of per-request caches indexed by [`CacheSlot`], for [`BlockDiffusionModel`]
/// implementations: slot 0 always exists, closed slots are reused, and a slot that is not
/// open is a typed error.
///
/// ```
/// use spot_core::{CacheSlot, Slots};
/// let mut slots: Slots<Vec<u32>> = Slots::new();
/// let a = slots.open();
/// slots.get_mut(a).unwrap().push(7);
/// slots.close(a);
/// assert!(slots.get(a).is_err());
/// assert_eq!(slots.open(), a); // reused
/// assert!(slots.get(CacheSlot(0)).is_ok());
/// ```
#[derive(Clone, Debug)]
pub struct Slots<T> {
    slots: Vec<Option<T>>,
}

impl<T: Default> Default for Slots<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Default> Slots<T> {
    /// A table with slot 0 open.
    pub fn new() -> Self {
        Self {
            slots: vec![Some(T::default())],
        }
    }

    /// Opens an empty slot (the lowest closed index, or a new one).
    pub fn open(&mut self) -> CacheSlot {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(T::default());
                CacheSlot(i)
            }
            None => {
                self.slots.push(Some(T::default()));
                CacheSlot(self.slots.len() - 1)
            }
        }
    }

    /// Closes `slot` (slot 0 is emptied instead); unknown slots are ignored.
    pub fn close(&mut self, slot: CacheSlot) {
        if slot.0 == 0 {
            self.slots[0] = Some(T::default());
        } else if let Some(s) = self.slots.get_mut(slot.0) {
            *s = None;
        }
    }

    /// The cache of an open slot.
    pub fn get(&self, slot: CacheSlot) -> Result<&T> {
        self.slots
            .get(slot.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| not_open(slot))
    }

    /// The cache of an open slot, mutably.
    pub fn get_mut(&mut self, slot: CacheSlot) -> Result<&mut T> {
        self.slots
            .get_mut(slot.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| not_open(slot))
    }

    /// Every open slot's cache.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// Every open slot's cache, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().flatten()
    }

    /// Open slots, slot 0 included.
    pub fn open_count(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

fn not_open(slot: CacheSlot) -> Error {
    Error::config("slot", format!("cache slot {} is not open", slot.0))
}

/// Fails when a slot appears in two groups of one forward.
pub fn check_distinct_slots(groups: &[ScoreGroup<'_>]) -> Result<()> {
    CacheSlot::check_distinct(groups.iter().map(|g| g.slot))
}

impl CacheSlot {
    /// Fails when a slot appears twice among the groups of one forward (`slots` in group
    /// order), for any model trait's groups.
    pub fn check_distinct(slots: impl IntoIterator<Item = CacheSlot>) -> Result<()> {
        let mut seen: Vec<CacheSlot> = Vec::new();
        for slot in slots {
            if seen.contains(&slot) {
                return Err(Error::config(
                    "groups",
                    format!("cache slot {} appears in two groups of one forward", slot.0),
                ));
            }
            seen.push(slot);
        }
        Ok(())
    }
}
