//! Block-causal block diffusion with an exact prefix KV cache (SDAR, LLaDA2.0).
//!
//! A block attends to every earlier block (read from the cache) and to itself
//! bidirectionally. A forward over `n` block states broadcasts the cached prefix over the states
//! inside batched matrix products: the cache is read in place, never copied per state, and each
//! state's products have a fixed shape, so its statistics do not depend on the batch. Finished
//! blocks are appended to the cache with one forward each.

use burn_tensor::backend::Backend;
use spot_core::{
    BlockDiffusionModel, BlockLayout, BlockState, BlockStats, CacheSlot, Carry, ModelInfo,
    MultiRequestModel, PrefixUpdate, ScoreGroup, Slots, TokenId, check_distinct_slots,
};

use crate::attention::{Attend, Kv};
use crate::frame::{Frame, NoiseCache};
use crate::head::RowPlan;
use crate::logits::Logits;
use crate::transformer::{Net, Segment};
use spot_hf::Result;

/// One request's committed prefix, its KV cache and the Gumbel rows of its current block.
pub(crate) struct PrefixSlot<B: Backend> {
    pub cache: Vec<Kv<B>>,
    pub prefix: Vec<TokenId>,
    pub noise: NoiseCache<B>,
}

impl<B: Backend> Default for PrefixSlot<B> {
    fn default() -> Self {
        Self {
            cache: Vec::new(),
            prefix: Vec::new(),
            noise: NoiseCache::default(),
        }
    }
}

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
            .field("prefix_len", &self.prefix_len())
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
        Ok(self.net.head.logits_host(hidden))
    }
}

impl<B: Backend, C> BlockDiffusionModel for BlockCausal<B, C> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    spot_core::slot0_methods!();
}

impl<B: Backend, C> MultiRequestModel for BlockCausal<B, C> {
    fn open_slot(&mut self) -> spot_core::Result<CacheSlot> {
        Ok(self.slots.open())
    }

    fn close_slot(&mut self, slot: CacheSlot) {
        self.slots.close(slot);
    }

    crate::frame::slot_accounting!();

    fn set_generation_end_in(&mut self, slot: CacheSlot, _end: usize) -> spot_core::Result<()> {
        self.slots.get(slot).map(|_| ())
    }

    fn reset_prefix_in(
        &mut self,
        slot: CacheSlot,
        prefix: &[TokenId],
        block_size: usize,
    ) -> spot_core::Result<PrefixUpdate> {
        *self.slots.get_mut(slot)? = PrefixSlot::default();
        self.frame.begin(block_size)?;
        for chunk in prefix.chunks(block_size) {
            self.append_blocks(&[(slot, chunk)])?;
        }
        Ok(PrefixUpdate {
            ran_forward: !prefix.is_empty(),
            positions: prefix.len(),
        })
    }

    fn append_block_in(
        &mut self,
        slot: CacheSlot,
        block: &[TokenId],
    ) -> spot_core::Result<PrefixUpdate> {
        Ok(self
            .append_blocks(&[(slot, block)])?
            .pop()
            .unwrap_or_default())
    }

    fn prefix_len_in(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, |s| s.prefix.len())
    }

    /// The blocks of several slots in one forward: each block attends to its own slot's
    /// cache with the products of appending it alone (`Net::run_segments`), so every
    /// cache ends as after its own append.
    fn append_blocks(
        &mut self,
        blocks: &[(CacheSlot, &[TokenId])],
    ) -> spot_core::Result<Vec<PrefixUpdate>> {
        let mut ids = Vec::new();
        let mut starts = Vec::with_capacity(blocks.len());
        for (i, &(slot, block)) in blocks.iter().enumerate() {
            if blocks[..i].iter().any(|&(s, _)| s == slot) {
                return Err(spot_core::Error::config(
                    "blocks",
                    format!("cache slot {} appears twice in one append", slot.0),
                ));
            }
            let start = self.slots.get(slot)?.prefix.len();
            self.frame.check_end(start + block.len(), "prefix")?;
            self.frame.push_ids(block, &mut ids)?;
            starts.push(start);
        }
        let segments: Vec<Segment<'_, B>> = blocks
            .iter()
            .zip(&starts)
            .filter(|((_, block), _)| !block.is_empty())
            .map(|(&(slot, block), &start)| Segment {
                n: 1,
                len: block.len(),
                start,
                cache: self.slots.get(slot).map_or(&[][..], |s| &s.cache[..]),
                after: None,
            })
            .collect();
        if !segments.is_empty() {
            let (_, kv) = self.net.run_segments(ids, &segments, Attend::Bidirectional);
            drop(segments);
            let appended = blocks.iter().filter(|(_, block)| !block.is_empty());
            for (&(slot, block), kv) in appended.zip(kv) {
                let s = self.slots.get_mut(slot)?;
                Net::extend_cache(&mut s.cache, kv);
                s.prefix.extend_from_slice(block);
            }
        }
        Ok(blocks
            .iter()
            .map(|(_, block)| PrefixUpdate {
                ran_forward: !block.is_empty(),
                positions: block.len(),
            })
            .collect())
    }

    fn forward_groups(
        &mut self,
        groups: &[ScoreGroup<'_>],
    ) -> spot_core::Result<Vec<Vec<BlockStats>>> {
        let none = vec![Carry::default(); groups.len()];
        Ok(self.score_groups(&none, groups)?.1)
    }

    /// One forward: each finished block of `carries` runs as a segment of its own over its
    /// slot's cache, and its group's states attend to that cache extended by the block's keys
    /// and values of the same layer (`Segment::after`), exactly the cache an append alone
    /// leaves; the blocks then join their caches. A look-ahead `(block, next)` runs `block`
    /// as a further segment over that cache and `next` over the cache it extends, and neither
    /// is kept. No forward of its own for any append.
    fn forward_groups_carrying(
        &mut self,
        carries: &[Carry<'_>],
        groups: &[ScoreGroup<'_>],
    ) -> spot_core::Result<(Vec<PrefixUpdate>, Vec<Vec<BlockStats>>)> {
        self.score_groups(carries, groups)
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
    /// [`MultiRequestModel::forward_groups_carrying`] (and, with nothing carried,
    /// [`MultiRequestModel::forward_groups`]).
    fn score_groups(
        &mut self,
        carries: &[Carry<'_>],
        groups: &[ScoreGroup<'_>],
    ) -> spot_core::Result<(Vec<PrefixUpdate>, Vec<Vec<BlockStats>>)> {
        check_distinct_slots(groups)?;
        if carries.len() != groups.len() {
            return Err(spot_core::Error::ShapeMismatch {
                what: "carries per score group",
                expected: groups.len(),
                actual: carries.len(),
            });
        }
        let mut ids = Vec::new();
        // Per group: the prefix length before its append, and the states' shape.
        let mut shapes = Vec::with_capacity(groups.len());
        for (g, c) in groups.iter().zip(carries) {
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
        for ((g, c), &(n, len, before)) in groups.iter().zip(carries).zip(&shapes) {
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
            let updates = groups.iter().map(|_| PrefixUpdate::default()).collect();
            return Ok((updates, groups.iter().map(|_| Vec::new()).collect()));
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
        let mut updates = Vec::with_capacity(groups.len());
        let mut out = Vec::with_capacity(groups.len());
        for (((g, c), &(_, len, before)), seg) in groups.iter().zip(carries).zip(&shapes).zip(&at) {
            let slot = self.slots.get_mut(g.slot)?;
            if let Some(b) = seg.append {
                Net::extend_cache(&mut slot.cache, std::mem::take(&mut kv[b]));
                slot.prefix.extend_from_slice(c.append);
            }
            updates.push(PrefixUpdate {
                ran_forward: false,
                positions: c.append.len(),
            });
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
            if let (Some((_, ni)), Some((block, next))) = (seg.lookahead, c.lookahead) {
                let next = std::slice::from_ref(next);
                let plan = RowPlan::masked(next, next[0].len());
                stats.extend(self.frame.stats(
                    &self.net.head,
                    part(ni),
                    &plan,
                    (start + block.len(), &mut slot.noise),
                    g.query,
                )?);
            }
            out.push(stats);
        }
        Ok((updates, out))
    }
}
