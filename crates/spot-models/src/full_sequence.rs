//! Block diffusion over the whole sequence, without a cache (LLaDA, Dream).
//!
//! These models were trained with full bidirectional attention, so a committed prefix's keys
//! and values change with every token after it: there is no exact prefix cache. Every forward
//! runs `prefix ; block state ; masks up to the end of the generation region` (future blocks
//! all masks, as the official semi-autoregressive samplers do) and keeps the block's rows. The
//! end of the region comes from [`spot_core::Prefix::generation_end`], which every decoder of
//! the workspace passes with the end of its last block.
//!
//! Dream predicts token `i` from position `i - 1` (logits shifted right by one, position 0
//! keeps its own row); LLaDA has no shift.
//!
//! **Approximate prefix cache (opt-in, changes the model's numbers).**
//! [`FullSequence::set_approximate_prefix_cache`] turns on a Fast-dLLM-style cache: when the
//! prefix changes (`reset_prefix`, a carried append), one full forward over
//! `prefix ; masks up to the end` stores the prefix's keys and values, and every block forward
//! then runs only `block state ; future masks` (plus the last prefix token for Dream's shift)
//! against that cache. The prefix's keys no longer see the tokens decoded after them, so the
//! logits differ from the exact model; draft-free and speculative decoding under the same
//! setting still agree token for token (both see the same cache).

use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use spot_core::{
    BlockDiffusionModel, BlockLayout, BlockState, BlockStats, CacheSlot, GroupScores, ModelInfo,
    Prefix, PrefixUpdate, ScoreGroup, Slots, TokenId, check_distinct_slots,
};

use crate::attention::{Attend, Kv};
use crate::block_causal::diffusion_info;
use crate::frame::{Frame, NoiseCache};
use crate::transformer::{Net, Segment};
use spot_hf::Result;
use spot_reduce::{Logits, RowPlan};

/// One request's prefix, generation end, approximate cache and Gumbel rows.
struct SequenceSlot<B: Backend> {
    prefix: Vec<TokenId>,
    /// End of the generation region (absolute position); 0 until a decoder sets it.
    end: usize,
    /// Keys/values of the approximate prefix cache (one entry per layer, empty when off or
    /// before the first prefix forward).
    cache: Vec<Kv<B>>,
    noise: NoiseCache<B>,
}

impl<B: Backend> Default for SequenceSlot<B> {
    fn default() -> Self {
        Self {
            prefix: Vec::new(),
            end: 0,
            cache: Vec::new(),
            noise: NoiseCache::default(),
        }
    }
}

/// A forward's input for one request: its tokens and where its block rows are.
struct GroupInput {
    ids: Vec<i64>,
    n: usize,
    len: usize,
    /// Positions each sequence runs (`from..total`).
    width: usize,
    /// First position run (0, or the end of the approximate cache).
    from: usize,
    /// The block's rows, relative to the group's first row.
    rows: Vec<i64>,
}

const SLOT0: CacheSlot = CacheSlot(0);

/// A full-sequence block-diffusion model on backend `B` with family config `C` (one prefix
/// per request slot; slot 0 serves the single-request [`BlockDiffusionModel`] methods).
/// The families name it: [`crate::Llada`], [`crate::Dream`].
pub struct FullSequence<B: Backend, C> {
    cfg: C,
    net: Net<B>,
    frame: Frame<B>,
    info: ModelInfo,
    slots: Slots<SequenceSlot<B>>,
    /// Logits of position `i` come from row `i - 1` (Dream).
    shift: bool,
    /// Approximate prefix cache on.
    approximate: bool,
}

impl<B: Backend, C: std::fmt::Debug> std::fmt::Debug for FullSequence<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = self.slots.get(SLOT0).ok();
        f.debug_struct("FullSequence")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("prefix_len", &slot.map_or(0, |s| s.prefix.len()))
            .field("end", &slot.map_or(0, |s| s.end))
            .field("slots", &self.slots.open_count())
            .finish_non_exhaustive()
    }
}

impl<B: Backend, C> FullSequence<B, C> {
    /// A full-sequence model; `shift` for Dream's shifted logits, `layout` the block layout of
    /// the family's own sampler (both layouts are accepted).
    pub(crate) fn assemble(
        cfg: C,
        net: Net<B>,
        frame: Frame<B>,
        shift: bool,
        layout: BlockLayout,
    ) -> Self {
        Self {
            info: diffusion_info(&frame, layout, true),
            cfg,
            net,
            frame,
            slots: Slots::new(),
            shift,
            approximate: false,
        }
    }

    /// Turns the approximate (Fast-dLLM-style) prefix cache on or off; see the module docs.
    /// Off (exact) by default. It takes effect at the next `reset_prefix`.
    pub fn set_approximate_prefix_cache(&mut self, on: bool) {
        self.approximate = on;
        for slot in self.slots.iter_mut() {
            slot.cache.clear();
        }
    }

    /// Whether the approximate prefix cache is on.
    pub fn approximate_prefix_cache(&self) -> bool {
        self.approximate
    }

    /// Positions whose keys/values come from the cache: the prefix, less its last token for
    /// a shifted model (whose output row the block's first position reads).
    fn cached_len(&self, slot: &SequenceSlot<B>) -> usize {
        if slot.cache.is_empty() {
            0
        } else {
            slot.prefix.len() - usize::from(self.shift)
        }
    }

    /// Refreshes a slot's approximate cache: one forward over `prefix ; masks up to the end`.
    fn refresh(&mut self, slot: CacheSlot) -> Result<PrefixUpdate> {
        let s = self.slots.get_mut(slot)?;
        s.cache.clear();
        let keep = s.prefix.len().saturating_sub(usize::from(self.shift));
        if !self.approximate || keep == 0 {
            return Ok(PrefixUpdate {
                ran_forward: false,
                positions: 0,
            });
        }
        let total = s.end.max(s.prefix.len());
        self.frame.check_end(total, "generation region")?;
        let mut ids: Vec<i64> = s.prefix.iter().map(|&t| i64::from(t)).collect();
        ids.resize(total, i64::from(self.info.mask_id));
        let (_, kv) = self.net.run(ids, 1, total, 0, &[], Attend::Bidirectional);
        s.cache = kv
            .into_iter()
            .map(|c| Kv {
                k: c.k.narrow(2, 0, keep),
                v: c.v.narrow(2, 0, keep),
            })
            .collect();
        Ok(PrefixUpdate {
            ran_forward: true,
            positions: total,
        })
    }

    crate::frame::folder_accessors!(C);

    /// Logits `[n, len, vocab]` of `states` after the prefix, with masks up to the generation
    /// end, as host values (for tests and tools).
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Logits> {
        let slot = self.slots.get(SLOT0)?;
        let input = self.group_input(slot, states)?;
        let segment = Segment {
            n: input.n,
            len: input.width,
            start: input.from,
            cache: &slot.cache,
            after: None,
        };
        let (hidden, _) = self
            .net
            .run_segments(input.ids, &[segment], Attend::Bidirectional);
        let rows = self.index(input.rows);
        self.net.head.logits_host(hidden.select(0, rows))
    }

    fn index(&self, rows: Vec<i64>) -> Tensor<B, 1, Int> {
        let n = rows.len();
        Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &self.frame.device)
    }

    /// The tokens a forward over `states` runs for `slot` (`prefix ; state ; masks up to the
    /// end` per state, from the end of the approximate cache) and where the block rows are.
    fn group_input(&self, slot: &SequenceSlot<B>, states: &[BlockState]) -> Result<GroupInput> {
        let start = slot.prefix.len();
        let (block, n, len) = self.frame.check_states(states, start)?;
        let total = slot.end.max(start + len);
        self.frame.check_end(total, "generation region")?;
        let from = self.cached_len(slot);
        let width = total - from;
        let mask = i64::from(self.info.mask_id);
        let mut ids = Vec::with_capacity(n * width);
        for state in block.chunks(len.max(1)).take(n) {
            ids.extend(slot.prefix[from..].iter().map(|&t| i64::from(t)));
            ids.extend_from_slice(state);
            ids.resize(ids.len() + total - start - len, mask);
        }
        let shift = self.shift;
        let rows = (0..n)
            .flat_map(|b| {
                (start..start + len).map(move |p| {
                    let src = if shift { p.saturating_sub(1) } else { p };
                    (b * width + src - from) as i64
                })
            })
            .collect();
        Ok(GroupInput {
            ids,
            n,
            len,
            width,
            from,
            rows,
        })
    }

    /// Appends tokens to a slot's prefix (no forward: exact mode recomputes the prefix with
    /// every block forward).
    fn store(&mut self, slot: CacheSlot, tokens: &[TokenId]) -> Result<()> {
        let s = self.slots.get_mut(slot)?;
        self.frame
            .check_end(s.prefix.len() + tokens.len(), "prefix")?;
        self.frame.push_ids(tokens, &mut Vec::new())?;
        s.prefix.extend_from_slice(tokens);
        Ok(())
    }
}

impl<B: Backend, C> BlockDiffusionModel for FullSequence<B, C> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn open_slot(&mut self) -> spot_core::Result<CacheSlot> {
        Ok(self.slots.open())
    }

    fn close_slot(&mut self, slot: CacheSlot) {
        self.slots.close(slot);
    }

    crate::frame::cache_usage!();

    fn prefix_len(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, |s| s.prefix.len())
    }

    fn reset_prefix(
        &mut self,
        slot: CacheSlot,
        prefix: Prefix<'_>,
    ) -> spot_core::Result<PrefixUpdate> {
        self.frame
            .check_end(prefix.generation_end, "generation region")?;
        let s = self.slots.get_mut(slot)?;
        *s = SequenceSlot::default();
        s.end = prefix.generation_end;
        self.frame.begin(prefix.block_size)?;
        self.store(slot, prefix.tokens)?;
        Ok(self.refresh(slot)?)
    }

    /// Each group's carried block joins its prefix first (with the approximate cache on, a
    /// forward of its own that refreshes the cache), then one forward over every group's
    /// windows. Look-aheads are not served: the window of a state already holds the whole
    /// generation region.
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> spot_core::Result<Vec<GroupScores>> {
        check_distinct_slots(groups)?;
        let mut appends = Vec::with_capacity(groups.len());
        for g in groups {
            appends.push(match g.carry.append.is_empty() {
                true => PrefixUpdate::default(),
                false => {
                    self.store(g.slot, g.carry.append)?;
                    self.refresh(g.slot)?
                }
            });
        }
        let scored = self.score_groups(groups)?;
        Ok(appends
            .into_iter()
            .zip(scored)
            .map(|(append, (stats, positions))| GroupScores {
                append,
                stats,
                lookahead: None,
                positions,
            })
            .collect())
    }
}

impl<B: Backend, C> FullSequence<B, C> {
    /// One forward over the groups' states (after their prefixes): each group's statistics and
    /// the positions its windows computed.
    fn score_groups(
        &mut self,
        groups: &[ScoreGroup<'_>],
    ) -> spot_core::Result<Vec<(Vec<BlockStats>, u64)>> {
        check_distinct_slots(groups)?;
        let mut inputs = Vec::with_capacity(groups.len());
        for g in groups {
            g.query.validate()?;
            inputs.push(self.group_input(self.slots.get(g.slot)?, g.states)?);
        }
        let mut ids = Vec::new();
        let mut segments = Vec::with_capacity(groups.len());
        for (g, input) in groups.iter().zip(&mut inputs) {
            if input.n == 0 {
                continue;
            }
            ids.append(&mut input.ids);
            let cache = self.slots.get(g.slot).map_or(&[][..], |s| &s.cache[..]);
            segments.push(Segment {
                n: input.n,
                len: input.width,
                start: input.from,
                cache,
                after: None,
            });
        }
        if segments.is_empty() {
            return Ok(vec![(Vec::new(), 0); groups.len()]);
        }
        let (hidden, _) = self.net.run_segments(ids, &segments, Attend::Bidirectional);
        drop(segments);
        let mut out = Vec::with_capacity(groups.len());
        let mut row0 = 0;
        for (g, input) in groups.iter().zip(inputs) {
            if input.n == 0 {
                out.push((Vec::new(), 0));
                continue;
            }
            let positions = (input.n * input.width) as u64;
            let rows = input.rows.iter().map(|&r| r + row0 as i64).collect();
            row0 += input.n * input.width;
            let picked = hidden.clone().select(0, self.index(rows));
            let plan = RowPlan::masked(g.states, input.len);
            let slot = self.slots.get_mut(g.slot)?;
            let start = slot.prefix.len();
            let stats = self.frame.stats(
                &self.net.head,
                picked,
                &plan,
                (start, &mut slot.noise),
                g.query,
            )?;
            out.push((stats, positions));
        }
        Ok(out)
    }
}
