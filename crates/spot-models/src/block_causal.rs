//! Block-causal block diffusion with an exact prefix KV cache (SDAR, LLaDA2.0).
//!
//! A block attends to every earlier block (read from the cache) and to itself
//! bidirectionally. A forward over `n` block states broadcasts the cached prefix over the states
//! inside batched matrix products: the cache is read in place, never copied per state, and each
//! state's products have a fixed shape, so its statistics do not depend on the batch. Finished
//! blocks are appended to the cache with one forward each.

use burn_tensor::backend::Backend;
use spot_core::{
    BlockDiffusionModel, BlockLayout, BlockState, CacheSlot, Carry, GroupScores, ModelInfo, Prefix,
    PrefixUpdate, ScoreGroup, Slots, StatsQuery, check_distinct_slots,
};

use crate::attention::Attend;
use crate::frame::{Frame, PrefixSlot};
use crate::transformer::{Net, Segment};
use spot_hf::Result;
use spot_reduce::{Logits, RowPlan};

/// A block-causal model on backend `B` with family config `C`, and its prefix KV caches (one
/// per request slot; slot 0 serves the single-request [`BlockDiffusionModel`] methods).
/// The families name it: [`crate::Sdar`], [`crate::Llada2Moe`].
pub struct BlockCausal<B: Backend, C> {
    cfg: C,
    net: Net<B>,
    frame: Frame<B>,
    info: ModelInfo,
    slots: Slots<PrefixSlot<B>>,
}

impl<B: Backend, C: std::fmt::Debug> std::fmt::Debug for BlockCausal<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCausal")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("prefix_len", &self.prefix_len(SLOT0))
            .field("slots", &self.slots.open_count())
            .finish_non_exhaustive()
    }
}

/// The [`ModelInfo`] of a block-diffusion frame (the mask id was resolved when it opened).
/// Block-causal models decode aligned blocks only; full-sequence ones (`any_layout`) take
/// either layout, their family's own being `layout`.
pub(crate) fn diffusion_info<B: Backend>(
    frame: &Frame<B>,
    layout: BlockLayout,
    any_layout: bool,
) -> ModelInfo {
    let info = ModelInfo::new(
        frame.vocab_size,
        frame.mask_id.unwrap_or_default(),
        frame.max_positions,
    )
    .with_stop_ids(frame.stop_ids.clone())
    .with_layout(layout, any_layout);
    match frame.block_size {
        Some(l) => info.with_block_size(l),
        None => info,
    }
}

const SLOT0: CacheSlot = CacheSlot(0);

impl<B: Backend, C> BlockCausal<B, C> {
    pub(crate) fn assemble(cfg: C, net: Net<B>, frame: Frame<B>) -> Self {
        Self {
            info: diffusion_info(&frame, BlockLayout::Aligned, false),
            cfg,
            net,
            frame,
            slots: Slots::new(),
        }
    }

    crate::frame::folder_accessors!(C);

    /// Logits `[n, len, vocab]` of `states` after the cached prefix, as host values (for
    /// tests and tools; decoding uses [`BlockDiffusionModel::forward`], which never copies
    /// logits to the host).
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Logits> {
        let slot = self.slots.get(SLOT0)?;
        let (ids, n, len) = self.frame.check_states(states, slot.prefix.len())?;
        let (hidden, _) = self.net.run(
            ids,
            n,
            len,
            slot.prefix.len(),
            &slot.cache,
            Attend::Bidirectional,
        );
        self.net.head.logits_host(hidden)
    }
}

impl<B: Backend, C> BlockDiffusionModel for BlockCausal<B, C> {
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

    /// The prefix block by block, each block attending to the cache of the ones before
    /// (the generation end does not matter to a block-causal model).
    fn reset_prefix(
        &mut self,
        slot: CacheSlot,
        prefix: Prefix<'_>,
    ) -> spot_core::Result<PrefixUpdate> {
        *self.slots.get_mut(slot)? = PrefixSlot::default();
        self.frame.begin(prefix.block_size)?;
        let query = StatsQuery::new(0.0, 0);
        for append in prefix.tokens.chunks(prefix.block_size) {
            let carry = Carry {
                append,
                lookahead: None,
            };
            self.score_groups(&[ScoreGroup::new(slot, &[], &query).carrying(carry)])?;
        }
        Ok(PrefixUpdate {
            ran_forward: !prefix.tokens.is_empty(),
            positions: prefix.tokens.len(),
        })
    }

    /// One forward: each finished block a group carries runs as a segment of its own over its
    /// slot's cache, and its group's states attend to that cache extended by the block's keys
    /// and values of the same layer (`Segment::after`), exactly the cache an append alone
    /// leaves; the blocks then join their caches. A look-ahead `(block, next)` runs `block`
    /// as a further segment over that cache and `next` over the cache it extends, and neither
    /// is kept. An append rides in the forward of its group's states (no forward of its own).
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> spot_core::Result<Vec<GroupScores>> {
        self.score_groups(groups)
    }
}

/// Where a group's rows sit in a run: its append segment, its states segment, and its
/// look-ahead's block and next-state segments.
#[derive(Clone, Copy, Default)]
struct GroupSegments {
    append: Option<usize>,
    states: Option<usize>,
    lookahead: Option<(usize, usize)>,
}

impl<B: Backend, C> BlockCausal<B, C> {
    /// [`BlockDiffusionModel::forward`].
    fn score_groups(&mut self, groups: &[ScoreGroup<'_>]) -> spot_core::Result<Vec<GroupScores>> {
        check_distinct_slots(groups)?;
        let carries: Vec<Carry<'_>> = groups.iter().map(|g| g.carry).collect();
        let mut ids = Vec::new();
        // Per group: the prefix length before its append, and the states' shape.
        let mut shapes = Vec::with_capacity(groups.len());
        for (g, c) in groups.iter().zip(&carries) {
            g.query.validate()?;
            let before = self.slots.get(g.slot)?.prefix.len();
            let start = before + c.append.len();
            self.frame.check_end(start, "prefix")?;
            self.frame.push_ids(c.append, &mut ids)?;
            let (group_ids, n, len) = self.frame.check_states(g.states, start)?;
            ids.extend(group_ids);
            if let Some((block, next)) = c.lookahead {
                self.frame.push_ids(block, &mut ids)?;
                let (next_ids, _, _) = self
                    .frame
                    .check_states(std::slice::from_ref(next), start + block.len())?;
                ids.extend(next_ids);
            }
            shapes.push((n, len, before));
        }
        let mut segments: Vec<Segment<'_, B>> = Vec::new();
        let mut at = Vec::with_capacity(groups.len());
        for ((g, c), &(n, len, before)) in groups.iter().zip(&carries).zip(&shapes) {
            let cache = self.slots.get(g.slot).map_or(&[][..], |s| &s.cache[..]);
            let mut push = |n: usize, len: usize, start: usize, after: Option<usize>| {
                segments.push(Segment {
                    n,
                    len,
                    start,
                    cache,
                    after,
                });
                segments.len() - 1
            };
            let start = before + c.append.len();
            let append = (!c.append.is_empty()).then(|| push(1, c.append.len(), before, None));
            let states = (n > 0).then(|| push(n, len, start, append));
            let lookahead = c.lookahead.map(|(block, next)| {
                let b = push(1, block.len(), start, append);
                (b, push(1, next.len(), start + block.len(), Some(b)))
            });
            at.push(GroupSegments {
                append,
                states,
                lookahead,
            });
        }
        if segments.is_empty() {
            return Ok(vec![GroupScores::default(); groups.len()]);
        }
        let (hidden, mut kv) = self.net.run_segments(ids, &segments, Attend::Bidirectional);
        let rows: Vec<usize> = segments.iter().map(|s| s.n * s.len).collect();
        let single = segments.len() == 1;
        drop(segments);
        let part = |si: usize| {
            if single {
                hidden.clone()
            } else {
                let row0: usize = rows[..si].iter().sum();
                hidden.clone().narrow(0, row0, rows[si])
            }
        };
        let mut out = Vec::with_capacity(groups.len());
        for (((g, c), &(n, len, before)), seg) in groups.iter().zip(&carries).zip(&shapes).zip(&at)
        {
            let slot = self.slots.get_mut(g.slot)?;
            if let Some(b) = seg.append {
                Net::extend_cache(&mut slot.cache, std::mem::take(&mut kv[b]));
                slot.prefix.extend_from_slice(c.append);
            }
            // An append rides in its states' forward; alone, it is a forward of its own.
            let append = PrefixUpdate {
                ran_forward: n == 0 && !c.append.is_empty(),
                positions: c.append.len(),
            };
            let start = before + c.append.len();
            let mut stats = Vec::new();
            if let Some(si) = seg.states {
                let plan = RowPlan::masked(g.states, len);
                stats = self.frame.stats(
                    &self.net.head,
                    part(si),
                    &plan,
                    (start, &mut slot.noise),
                    g.query,
                )?;
            }
            let mut lookahead = None;
            if let (Some((_, ni)), Some((block, next))) = (seg.lookahead, c.lookahead) {
                let next = std::slice::from_ref(next);
                let plan = RowPlan::masked(next, next[0].len());
                lookahead = self
                    .frame
                    .stats(
                        &self.net.head,
                        part(ni),
                        &plan,
                        (start + block.len(), &mut slot.noise),
                        g.query,
                    )?
                    .pop();
            }
            out.push(GroupScores {
                append,
                stats,
                lookahead,
                positions: (n * len) as u64,
            });
        }
        Ok(out)
    }
}
