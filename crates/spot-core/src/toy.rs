//! Deterministic toy block-diffusion models: the whole decoding stack, testable in
//! milliseconds without a neural network.
//!
//! [`ToyModel`] computes each logit from a hash of the committed prefix, the visible block
//! state, the position and the token. Knobs control how peaked the distributions are, how much
//! they depend on the block state (so that stale statistics are informative but not exact),
//! and how often confidences tie, so that the tie-breaking rules are exercised.

use crate::error::{Error, Result};
use crate::model::{
    BlockDiffusionModel, CacheSlot, CacheUsage, GroupScores, ModelInfo, PrefixUpdate, ScoreGroup,
    Slots, check_distinct_slots,
};
use crate::state::{BlockState, TokenId};
use crate::stats::{BlockStats, ReduceScratch, StatsQuery, reduce_logits};

/// Width of the toy model's hidden states (attached when a query asks for them): evenly
/// spaced logits of each row, so they depend on the context as a real model's do.
pub const TOY_HIDDEN_DIM: usize = 8;

/// Parameters of a [`ToyModel`].
#[derive(Clone, Debug, PartialEq)]
pub struct ToyConfig {
    /// Vocabulary size (the mask id must be inside it).
    pub vocab_size: usize,
    /// The mask token id.
    pub mask_id: TokenId,
    /// Context limit in positions.
    pub max_positions: usize,
    /// Stop ids reported by [`ModelInfo`].
    pub stop_ids: Vec<TokenId>,
    /// Seed of the model's "weights".
    pub seed: u64,
    /// Logit scale: larger = more peaked distributions.
    pub peak: f32,
    /// In `[0, 1]`: the share of each logit that depends only on the prefix and the position
    /// (not on the block state). 1 = stale statistics are exact; 0 = every commit reshuffles.
    pub stability: f32,
    /// In `[0, 1]`: the share of positions whose logits are quantised and shared within the
    /// block, which produces exact ties in confidence across positions and between tokens.
    pub tie_rate: f32,
    /// Whether prefill and block appends run a forward (true for cached models like SDAR).
    pub prefix_forwards: bool,
}

impl Default for ToyConfig {
    fn default() -> Self {
        Self {
            vocab_size: 48,
            mask_id: 47,
            max_positions: 4096,
            stop_ids: vec![0],
            seed: 1,
            peak: 3.0,
            stability: 0.7,
            tie_rate: 0.1,
            prefix_forwards: true,
        }
    }
}

/// A deterministic, batch-invariant toy model implementing [`BlockDiffusionModel`].
///
/// ```
/// use spot_core::{BlockState, MeteredModel, StatsQuery};
/// use spot_core::toy::{ToyConfig, ToyModel};
/// let mut toy = ToyModel::new(ToyConfig::default());
/// let mut m = MeteredModel::new(&mut toy);
/// m.reset_prefix(&[1, 2, 3, 4], 4, 12).unwrap();
/// let s = BlockState::masked(8, m.info().mask_id);
/// let out = m.forward(&[s.clone(), s], &StatsQuery::new(0.0, 0)).unwrap();
/// assert_eq!(out[0], out[1]);
/// ```
#[derive(Clone, Debug)]
pub struct ToyModel {
    cfg: ToyConfig,
    info: ModelInfo,
    slots: Slots<Prefix>,
    forwards: u64,
    logits: Vec<f32>,
    scratch: ReduceScratch,
}

pub use crate::state::mix64;

/// One request's committed prefix: its length and running hash (all the logits read).
#[derive(Clone, Copy, Debug, Default)]
struct Prefix {
    len: usize,
    hash: u64,
}

impl Prefix {
    /// The prefix extended by `block`.
    fn extended(self, block: &[TokenId]) -> Self {
        Self {
            len: self.len + block.len(),
            hash: ToyModel::hash_tokens(self.hash, block),
        }
    }
}

fn unit(h: u64) -> f32 {
    // Uniform in (-1, 1).
    ((h >> 40) as f32 + 0.5) / (1u64 << 23) as f32 - 1.0
}

impl ToyModel {
    /// A toy model; panics never, but [`BlockDiffusionModel::forward`] reports an invalid
    /// configuration (mask outside the vocabulary) as an error.
    pub fn new(cfg: ToyConfig) -> Self {
        let info = ModelInfo::new(cfg.vocab_size, cfg.mask_id, cfg.max_positions)
            .with_stop_ids(cfg.stop_ids.clone())
            .with_layout(crate::BlockLayout::Aligned, true);
        Self {
            cfg,
            info,
            slots: Slots::new(),
            forwards: 0,
            logits: Vec::new(),
            scratch: ReduceScratch::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ToyConfig {
        &self.cfg
    }

    /// Forward calls made so far (block forwards only).
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    fn hash_tokens(seed: u64, tokens: &[TokenId]) -> u64 {
        tokens
            .iter()
            .fold(mix64(seed), |h, &t| mix64(h ^ u64::from(t)))
    }

    /// The logits of position `s` of `state` after the prefix of slot 0, written into `out`
    /// (one per vocabulary id).
    pub fn logits_into(&self, state: &BlockState, s: usize, out: &mut Vec<f32>) {
        if let Ok(p) = self.slots.get(CacheSlot(0)) {
            self.row_logits(p, self.state_hash(state), s, out);
        }
    }

    fn state_hash(&self, state: &BlockState) -> u64 {
        Self::hash_tokens(self.cfg.seed ^ 0x5eed, state.tokens())
    }

    /// [`logits_into`](Self::logits_into) with the state's hash computed once by the caller.
    fn row_logits(&self, prefix: &Prefix, state_hash: u64, s: usize, out: &mut Vec<f32>) {
        let c = &self.cfg;
        let abs = (prefix.len + s) as u64;
        let tie = unit(mix64(prefix.hash ^ mix64(abs ^ c.seed))) * 0.5 + 0.5 < c.tie_rate;
        // Tied positions share one row per block, keyed by the block start instead of `s`.
        let key = if tie {
            u64::MAX - prefix.len as u64
        } else {
            abs
        };
        let stable = mix64(prefix.hash ^ mix64(key));
        let moving = mix64(state_hash ^ mix64(key.wrapping_add(0xabc)));
        out.clear();
        out.extend((0..c.vocab_size as u64).map(|v| {
            let a = unit(mix64(stable ^ v)).powi(3);
            let b = unit(mix64(moving ^ v)).powi(3);
            let l = c.peak * 4.0 * (c.stability * a + (1.0 - c.stability) * b);
            if tie { (l * 2.0).round() / 2.0 } else { l }
        }));
    }
}

impl ToyModel {
    fn score(
        &mut self,
        slot: CacheSlot,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        let prefix = *self.slots.get(slot)?;
        self.score_after(prefix, states, query)
    }

    /// The statistics of `states` after `prefix`.
    fn score_after(
        &mut self,
        prefix: Prefix,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        if self.cfg.mask_id as usize >= self.cfg.vocab_size {
            return Err(Error::model(format!(
                "toy model: mask id {} outside vocabulary of {}",
                self.cfg.mask_id, self.cfg.vocab_size
            )));
        }
        query.validate()?;
        let k = query.effective_top_k(self.cfg.vocab_size);
        let mut out = Vec::with_capacity(states.len());
        let mut logits = std::mem::take(&mut self.logits);
        let mut scratch = std::mem::take(&mut self.scratch);
        for state in states {
            if prefix.len + state.len() > self.cfg.max_positions {
                return Err(Error::model("toy model: block extends past max_positions"));
            }
            let mut stats = BlockStats::new(k);
            let state_hash = self.state_hash(state);
            let mut hidden = Vec::new();
            for s in 0..state.len() {
                self.row_logits(&prefix, state_hash, s, &mut logits);
                if query.hidden_states {
                    // The toy's "hidden state": evenly spaced logits of the row (the mask's
                    // excluded logit read as -30, so every value is finite).
                    let vocab = logits.len();
                    hidden.extend((0..TOY_HIDDEN_DIM).map(|i| {
                        let v = logits[i * vocab / TOY_HIDDEN_DIM];
                        if v.is_finite() { v } else { -30.0 }
                    }));
                }
                reduce_logits(
                    &logits,
                    prefix.len + s,
                    query,
                    self.cfg.mask_id,
                    &mut scratch,
                    &mut stats,
                )?;
            }
            if query.hidden_states {
                stats.set_hidden(TOY_HIDDEN_DIM, hidden)?;
            }
            out.push(stats);
        }
        self.logits = logits;
        self.scratch = scratch;
        Ok(out)
    }
}

impl ToyModel {
    /// Appends `block` to a slot's prefix (a forward of its own when `prefix_forwards` is set).
    fn append(&mut self, slot: CacheSlot, block: &[TokenId]) -> Result<PrefixUpdate> {
        let p = self.slots.get_mut(slot)?;
        *p = p.extended(block);
        let forwards = self.cfg.prefix_forwards;
        Ok(PrefixUpdate {
            ran_forward: forwards && !block.is_empty(),
            positions: if forwards { block.len() } else { 0 },
        })
    }
}

impl BlockDiffusionModel for ToyModel {
    fn info(&self) -> &ModelInfo {
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
            bytes: 0,
        }
    }

    fn prefix_len(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, |p| p.len)
    }

    fn reset_prefix(&mut self, slot: CacheSlot, prefix: crate::Prefix<'_>) -> Result<PrefixUpdate> {
        let seed = self.cfg.seed;
        let p = self.slots.get_mut(slot)?;
        p.len = 0;
        p.hash = mix64(seed);
        self.append(slot, prefix.tokens)
    }

    /// Each group's append (a forward of its own when `prefix_forwards` is set), its states, and its look-ahead: the next state after the slot's prefix
    /// extended by the hypothesised block, which is not kept.
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<GroupScores>> {
        check_distinct_slots(groups)?;
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let append = match g.carry.append.is_empty() {
                true => PrefixUpdate::default(),
                false => self.append(g.slot, g.carry.append)?,
            };
            let stats = self.score(g.slot, g.states, g.query)?;
            let lookahead = match g.carry.lookahead {
                Some((block, next)) => {
                    let prefix = self.slots.get(g.slot)?.extended(block);
                    self.score_after(prefix, std::slice::from_ref(next), g.query)?
                        .pop()
                }
                None => None,
            };
            let len = g.states.first().map_or(0, BlockState::len);
            out.push(GroupScores {
                append,
                stats,
                lookahead,
                positions: (g.states.len() * len) as u64,
            });
        }
        if groups.iter().any(|g| !g.states.is_empty()) {
            self.forwards += 1;
        }
        Ok(out)
    }
}
