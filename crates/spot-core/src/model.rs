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

    /// One forward over `states` that also carries `carry`: its `append` (a finished block)
    /// joins the committed prefix before the states are scored, and its `lookahead` is scored
    /// after the prefix extended by a hypothesised end of the current block, without keeping
    /// it. Returns what the append cost and the statistics: one per state, then, when the
    /// model served the look-ahead, one more for it. Everything must equal what
    /// [`append_block`](BlockDiffusionModel::append_block), then
    /// [`forward`](BlockDiffusionModel::forward) (and, for the look-ahead, appending the
    /// hypothesised block and scoring the next state) would give, bit for bit. The default
    /// does exactly that for the append (two forwards for a cached model) and ignores the
    /// look-ahead; the cached families (SDAR, LLaDA2.0) run both in the one forward (their
    /// positions ride along as segments whose keys and values extend the cache layer by
    /// layer) and report the append with `ran_forward: false`.
    fn forward_carrying(
        &mut self,
        carry: Carry<'_>,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<(PrefixUpdate, Vec<BlockStats>)> {
        let update = match carry.append.is_empty() {
            true => PrefixUpdate::default(),
            false => self.append_block(carry.append)?,
        };
        Ok((update, self.forward(states, query)?))
    }

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
    fn forward_carrying(
        &mut self,
        carry: Carry<'_>,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<(PrefixUpdate, Vec<BlockStats>)> {
        (**self).forward_carrying(carry, states, query)
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

/// A model wrapped with work counters and output validation.
///
/// The verifier (`spot_verify::Verifier`) talks to the model through this type, so its NFE
/// and positions are counted the same way as a [`crate::Request`]'s, and every forward's
/// statistics are checked (shape, finiteness, ranges) before it trusts them. The request
/// state machine ([`crate::run_request`], [`crate::BatchDriver`]) counts and checks its own
/// forwards with the same [`Meter`] and checks; routing those through this type too is open
/// work (issue 46).
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

    /// Announces the end of the generation region (not a forward).
    pub fn set_generation_end(&mut self, end: usize) -> Result<()> {
        self.model.set_generation_end(end)
    }

    /// Resets the prefix (counted).
    pub fn reset_prefix(&mut self, prefix: &[TokenId], block_size: usize) -> Result<()> {
        let u = self.model.reset_prefix(prefix, block_size)?;
        self.meter.count_prefix(u);
        Ok(())
    }

    /// Appends a finished block (counted).
    pub fn append_block(&mut self, block: &[TokenId]) -> Result<()> {
        let u = self.model.append_block(block)?;
        self.meter.count_prefix(u);
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
        check_state_lengths(states, len)?;
        let out = self.model.forward(states, query)?;
        let positions = states.len() * self.model.positions_per_state(len);
        self.meter
            .count_block_forward(states.len(), positions as u64);
        check_forward(&out, states.len(), len, &self.info)?;
        Ok(out)
    }
}

/// Handle of one request's prefix cache inside a [`MultiRequestModel`].
///
/// Slot 0 always exists: it is the cache the single-request [`BlockDiffusionModel`] methods
/// use. [`MultiRequestModel::open_slot`] hands out the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheSlot(pub usize);

/// One request's share of a merged forward: its block states, scored after its own cached
/// prefix with its own query.
#[derive(Clone, Copy, Debug)]
pub struct ScoreGroup<'a> {
    /// The request's cache.
    pub slot: CacheSlot,
    /// States of equal length, right after the slot's prefix.
    pub states: &'a [BlockState],
    /// The request's query (temperature, noise seed, confidence rule, top-k).
    pub query: &'a StatsQuery,
}

/// A model that holds the prefix caches of several requests and scores the block states of
/// all of them in one forward.
///
/// Every method is the [`BlockDiffusionModel`] method of the same name applied to one slot.
/// [`MultiRequestModel::forward_groups`] runs one forward over several groups; each group's
/// statistics must be **bit-identical** to a [`BlockDiffusionModel::forward`] over that group
/// alone, with only its own request's prefix in the cache. That is what lets a batch driver
/// ([`crate::BatchDriver`]) merge requests without changing any request's tokens.
pub trait MultiRequestModel: BlockDiffusionModel {
    /// Opens an empty cache slot.
    fn open_slot(&mut self) -> Result<CacheSlot>;

    /// Slots open now, slot 0 included: what a server watches to see that finished and
    /// cancelled requests give their caches back. The default (a model that does not count
    /// them) says 0.
    fn open_slots(&self) -> usize {
        0
    }

    /// Bytes the open slots' caches hold (keys, values, noise rows, prefix ids), for the same
    /// monitoring. The default (a model that does not count them) says 0.
    fn cache_bytes(&self) -> u64 {
        0
    }

    /// Frees a slot and its cache (slot 0 is only emptied). Unknown slots are ignored.
    fn close_slot(&mut self, slot: CacheSlot);

    /// [`BlockDiffusionModel::set_generation_end`] for `slot`.
    fn set_generation_end_in(&mut self, slot: CacheSlot, end: usize) -> Result<()>;

    /// [`BlockDiffusionModel::reset_prefix`] for `slot`.
    fn reset_prefix_in(
        &mut self,
        slot: CacheSlot,
        prefix: &[TokenId],
        block_size: usize,
    ) -> Result<PrefixUpdate>;

    /// [`BlockDiffusionModel::append_block`] for `slot`.
    fn append_block_in(&mut self, slot: CacheSlot, block: &[TokenId]) -> Result<PrefixUpdate>;

    /// Appends a finished block to each of several slots (one per slot): one forward for
    /// all of them where the model can (the families' exact caches), else one per block (the
    /// default). Each slot's cache must end exactly as after its own
    /// [`MultiRequestModel::append_block_in`].
    fn append_blocks(&mut self, blocks: &[(CacheSlot, &[TokenId])]) -> Result<Vec<PrefixUpdate>> {
        blocks
            .iter()
            .map(|&(slot, block)| self.append_block_in(slot, block))
            .collect()
    }

    /// [`BlockDiffusionModel::prefix_len`] for `slot` (0 for an unknown slot).
    fn prefix_len_in(&self, slot: CacheSlot) -> usize;

    /// [`BlockDiffusionModel::positions_per_state`] for `slot`.
    fn positions_per_state_in(&self, slot: CacheSlot, block_len: usize) -> usize {
        let _ = slot;
        block_len
    }

    /// One forward over the states of every group (each group after its own slot's prefix);
    /// one entry of statistics per group, in order. A slot may appear in one group only.
    fn forward_groups(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<Vec<BlockStats>>>;

    /// [`BlockDiffusionModel::forward_carrying`] for several requests: `carries[i]` goes
    /// with `groups[i]`. Each slot's cache and statistics must end exactly as after its own
    /// [`MultiRequestModel::append_block_in`] and a [`MultiRequestModel::forward_groups`] of
    /// its group alone. The default runs [`MultiRequestModel::append_blocks`] first and
    /// ignores look-aheads; cached families override it with one forward. Returns one update
    /// per group (the default one for an empty append) and the statistics per group (one
    /// more at the end of a group whose look-ahead was served).
    fn forward_groups_carrying(
        &mut self,
        carries: &[Carry<'_>],
        groups: &[ScoreGroup<'_>],
    ) -> Result<(Vec<PrefixUpdate>, Vec<Vec<BlockStats>>)> {
        default_forward_groups_carrying(self, carries, groups)
    }
}

/// The default [`MultiRequestModel::forward_groups_carrying`]: the appends through
/// [`MultiRequestModel::append_blocks`], then [`MultiRequestModel::forward_groups`]; look-aheads
/// are not served. For overrides that add to it.
pub fn default_forward_groups_carrying<M: MultiRequestModel + ?Sized>(
    model: &mut M,
    carries: &[Carry<'_>],
    groups: &[ScoreGroup<'_>],
) -> Result<(Vec<PrefixUpdate>, Vec<Vec<BlockStats>>)> {
    if carries.len() != groups.len() {
        return Err(Error::ShapeMismatch {
            what: "carries per score group",
            expected: groups.len(),
            actual: carries.len(),
        });
    }
    let blocks: Vec<(CacheSlot, &[TokenId])> = groups
        .iter()
        .zip(carries)
        .filter(|(_, c)| !c.append.is_empty())
        .map(|(g, c)| (g.slot, c.append))
        .collect();
    let done = model.append_blocks(&blocks)?;
    if done.len() != blocks.len() {
        return Err(Error::ShapeMismatch {
            what: "prefix updates per merged append",
            expected: blocks.len(),
            actual: done.len(),
        });
    }
    let mut done = done.into_iter();
    let updates = carries
        .iter()
        .map(|c| match c.append.is_empty() {
            true => PrefixUpdate::default(),
            false => done.next().unwrap_or_default(),
        })
        .collect();
    Ok((updates, model.forward_groups(groups)?))
}

/// What a request's forward carries besides its block states
/// ([`BlockDiffusionModel::forward_carrying`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Carry<'a> {
    /// A finished block to append to the prefix before the states (empty: none).
    pub append: &'a [TokenId],
    /// A look-ahead `(block, next)`: score the state `next` of the following block after the
    /// prefix (with `append`) extended by `block`, a hypothesised end of the current block,
    /// which is not kept. A decoder whose block ends as `block` then has the statistics of
    /// the next block's first forward without running it.
    pub lookahead: Option<(&'a [TokenId], &'a BlockState)>,
}

/// A table of per-request caches indexed by [`CacheSlot`], for [`MultiRequestModel`]
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
    for (i, g) in groups.iter().enumerate() {
        if groups[..i].iter().any(|h| h.slot == g.slot) {
            return Err(Error::config(
                "groups",
                format!(
                    "cache slot {} appears in two groups of one forward",
                    g.slot.0
                ),
            ));
        }
    }
    Ok(())
}

/// The single-request methods of [`BlockDiffusionModel`] for a [`MultiRequestModel`], each
/// applied to slot 0 (everything but `info`). Use it inside the `impl BlockDiffusionModel`
/// block of a model whose [`MultiRequestModel`] methods do the work:
///
/// ```
/// use spot_core::{BlockDiffusionModel, BlockStats, CacheSlot, ModelInfo, MultiRequestModel,
///     PrefixUpdate, Result, ScoreGroup, TokenId};
///
/// struct Echo(ModelInfo);
///
/// impl BlockDiffusionModel for Echo {
///     fn info(&self) -> &ModelInfo {
///         &self.0
///     }
///     spot_core::slot0_methods!();
/// }
///
/// impl MultiRequestModel for Echo {
///     fn open_slot(&mut self) -> Result<CacheSlot> { Ok(CacheSlot(1)) }
///     fn close_slot(&mut self, _: CacheSlot) {}
///     fn set_generation_end_in(&mut self, _: CacheSlot, _: usize) -> Result<()> { Ok(()) }
///     fn reset_prefix_in(&mut self, _: CacheSlot, p: &[TokenId], _: usize) -> Result<PrefixUpdate> {
///         Ok(PrefixUpdate { ran_forward: false, positions: p.len() })
///     }
///     fn append_block_in(&mut self, _: CacheSlot, b: &[TokenId]) -> Result<PrefixUpdate> {
///         Ok(PrefixUpdate { ran_forward: false, positions: b.len() })
///     }
///     fn prefix_len_in(&self, _: CacheSlot) -> usize { 0 }
///     fn forward_groups(&mut self, g: &[ScoreGroup<'_>]) -> Result<Vec<Vec<BlockStats>>> {
///         Ok(g.iter().map(|_| Vec::new()).collect())
///     }
/// }
/// ```
#[macro_export]
macro_rules! slot0_methods {
    () => {
        fn set_generation_end(&mut self, end: usize) -> $crate::Result<()> {
            $crate::MultiRequestModel::set_generation_end_in(self, $crate::CacheSlot(0), end)
        }

        fn reset_prefix(
            &mut self,
            prefix: &[$crate::TokenId],
            block_size: usize,
        ) -> $crate::Result<$crate::PrefixUpdate> {
            $crate::MultiRequestModel::reset_prefix_in(
                self,
                $crate::CacheSlot(0),
                prefix,
                block_size,
            )
        }

        fn append_block(
            &mut self,
            block: &[$crate::TokenId],
        ) -> $crate::Result<$crate::PrefixUpdate> {
            $crate::MultiRequestModel::append_block_in(self, $crate::CacheSlot(0), block)
        }

        fn prefix_len(&self) -> usize {
            $crate::MultiRequestModel::prefix_len_in(self, $crate::CacheSlot(0))
        }

        fn positions_per_state(&self, block_len: usize) -> usize {
            $crate::MultiRequestModel::positions_per_state_in(self, $crate::CacheSlot(0), block_len)
        }

        fn forward(
            &mut self,
            states: &[$crate::BlockState],
            query: &$crate::StatsQuery,
        ) -> $crate::Result<Vec<$crate::BlockStats>> {
            let group = $crate::ScoreGroup {
                slot: $crate::CacheSlot(0),
                states,
                query,
            };
            Ok($crate::MultiRequestModel::forward_groups(self, &[group])?
                .pop()
                .unwrap_or_default())
        }

        fn forward_carrying(
            &mut self,
            carry: $crate::Carry<'_>,
            states: &[$crate::BlockState],
            query: &$crate::StatsQuery,
        ) -> $crate::Result<($crate::PrefixUpdate, Vec<$crate::BlockStats>)> {
            let group = $crate::ScoreGroup {
                slot: $crate::CacheSlot(0),
                states,
                query,
            };
            let (mut updates, mut stats) =
                $crate::MultiRequestModel::forward_groups_carrying(self, &[carry], &[group])?;
            Ok((
                updates.pop().unwrap_or_default(),
                stats.pop().unwrap_or_default(),
            ))
        }
    };
}
