//! Block diffusion over the whole sequence, without a cache (LLaDA, Dream).
//!
//! These models were trained with full bidirectional attention, so a committed prefix's keys
//! and values change with every token after it: there is no exact prefix cache. Every forward
//! runs `prefix ; block state ; masks up to the end of the generation region` (future blocks
//! all masks, as the official semi-autoregressive samplers do) and keeps the block's rows. The
//! end of the region comes from [`BlockDiffusionModel::set_generation_end`], which every
//! decoder of the workspace calls with the end of its last block.
//!
//! Dream predicts token `i` from position `i - 1` (logits shifted right by one, position 0
//! keeps its own row); LLaDA has no shift.
//!
//! **Approximate prefix cache (opt-in, changes the model's numbers).**
//! [`FullSequence::set_approximate_prefix_cache`] turns on a Fast-dLLM-style cache: when the
//! prefix changes (`reset_prefix`, `append_block`), one full forward over
//! `prefix ; masks up to the end` stores the prefix's keys and values, and every block forward
//! then runs only `block state ; future masks` (plus the last prefix token for Dream's shift)
//! against that cache. The prefix's keys no longer see the tokens decoded after them, so the
//! logits differ from the exact model; draft-free and speculative decoding under the same
//! setting still agree token for token (both see the same cache).

use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use spot_core::{
    BlockDiffusionModel, BlockState, BlockStats, ModelInfo, PrefixUpdate, StatsQuery, TokenId,
};

use crate::attention::{Attend, Kv};
use crate::block_causal::diffusion_info;
use crate::error::Result;
use crate::frame::Frame;
use crate::head::RowPlan;
use crate::transformer::Net;

/// A full-sequence block-diffusion model on backend `B` with family config `C`.
/// The families name it: [`crate::Llada`], [`crate::Dream`].
pub struct FullSequence<B: Backend, C> {
    cfg: C,
    net: Net<B>,
    frame: Frame<B>,
    info: ModelInfo,
    prefix: Vec<TokenId>,
    /// End of the generation region (absolute position); 0 until a decoder sets it.
    end: usize,
    /// Logits of position `i` come from row `i - 1` (Dream).
    shift: bool,
    /// Approximate prefix cache on, and its keys/values (one entry per layer, empty until the
    /// first prefix forward).
    approximate: bool,
    cache: Vec<Kv<B>>,
}

impl<B: Backend, C: std::fmt::Debug> std::fmt::Debug for FullSequence<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullSequence")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("prefix_len", &self.prefix.len())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<B: Backend, C> FullSequence<B, C> {
    pub(crate) fn assemble(cfg: C, net: Net<B>, frame: Frame<B>, shift: bool) -> Self {
        Self {
            info: diffusion_info(&frame),
            cfg,
            net,
            frame,
            prefix: Vec::new(),
            end: 0,
            shift,
            approximate: false,
            cache: Vec::new(),
        }
    }

    /// Turns the approximate (Fast-dLLM-style) prefix cache on or off; see the module docs.
    /// Off (exact) by default. It takes effect at the next `reset_prefix`.
    pub fn set_approximate_prefix_cache(&mut self, on: bool) {
        self.approximate = on;
        self.cache.clear();
    }

    /// Whether the approximate prefix cache is on.
    pub fn approximate_prefix_cache(&self) -> bool {
        self.approximate
    }

    /// Positions whose keys/values come from the cache: the prefix, less its last token for
    /// a shifted model (whose output row the block's first position reads).
    fn cached_len(&self) -> usize {
        if self.cache.is_empty() {
            0
        } else {
            self.prefix.len() - usize::from(self.shift)
        }
    }

    /// Refreshes the approximate cache: one forward over `prefix ; masks up to the end`.
    fn refresh(&mut self) -> Result<PrefixUpdate> {
        self.cache.clear();
        let keep = self.prefix.len().saturating_sub(usize::from(self.shift));
        if !self.approximate || keep == 0 {
            return Ok(PrefixUpdate {
                ran_forward: false,
                positions: 0,
            });
        }
        let total = self.end.max(self.prefix.len());
        self.frame.check_end(total, "generation region")?;
        let mut ids: Vec<i64> = self.prefix.iter().map(|&t| i64::from(t)).collect();
        ids.resize(total, i64::from(self.info.mask_id));
        let (_, kv) = self.net.run(ids, 1, total, 0, &[], Attend::Bidirectional);
        self.cache = kv
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
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Vec<f32>> {
        let (hidden, _, _) = self.block_hidden(states)?;
        Ok(self.net.head.logits_host(hidden))
    }

    /// The block rows' final hidden states `[n * len, dim]`, `n` and `len`.
    fn block_hidden(&self, states: &[BlockState]) -> Result<(Tensor<B, 2>, usize, usize)> {
        let start = self.prefix.len();
        let (block, n, len) = self.frame.check_states(states, start)?;
        let total = self.end.max(start + len);
        self.frame.check_end(total, "generation region")?;
        // Each sequence runs from `from` (0, or the end of the approximate cache) to `total`.
        let from = self.cached_len();
        let width = total - from;
        let mask = i64::from(self.info.mask_id);
        let mut ids = Vec::with_capacity(n * width);
        for state in block.chunks(len.max(1)).take(n) {
            ids.extend(self.prefix[from..].iter().map(|&t| i64::from(t)));
            ids.extend_from_slice(state);
            ids.resize(ids.len() + total - start - len, mask);
        }
        let (hidden, _) = self
            .net
            .run(ids, n, width, from, &self.cache, Attend::Bidirectional);
        let rows: Vec<i64> = (0..n)
            .flat_map(|b| {
                (start..start + len).map(move |p| {
                    let src = if self.shift { p.saturating_sub(1) } else { p };
                    (b * width + src - from) as i64
                })
            })
            .collect();
        let rows =
            Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n * len]), &self.frame.device);
        Ok((hidden.select(0, rows), n, len))
    }

    /// Appends tokens to the prefix (no forward: exact mode recomputes the prefix with every
    /// block forward).
    fn store(&mut self, tokens: &[TokenId]) -> Result<()> {
        self.frame
            .check_end(self.prefix.len() + tokens.len(), "prefix")?;
        self.frame.push_ids(tokens, &mut Vec::new())?;
        self.prefix.extend_from_slice(tokens);
        Ok(())
    }
}

impl<B: Backend, C> BlockDiffusionModel for FullSequence<B, C> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn set_generation_end(&mut self, end: usize) -> spot_core::Result<()> {
        self.frame.check_end(end, "generation region")?;
        self.end = end;
        Ok(())
    }

    fn reset_prefix(
        &mut self,
        prefix: &[TokenId],
        block_size: usize,
    ) -> spot_core::Result<PrefixUpdate> {
        self.prefix.clear();
        self.cache.clear();
        self.frame.begin(block_size)?;
        self.store(prefix)?;
        Ok(self.refresh()?)
    }

    fn append_block(&mut self, block: &[TokenId]) -> spot_core::Result<PrefixUpdate> {
        self.store(block)?;
        Ok(self.refresh()?)
    }

    fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    fn positions_per_state(&self, block_len: usize) -> usize {
        self.end.max(self.prefix.len() + block_len) - self.cached_len()
    }

    fn forward(
        &mut self,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> spot_core::Result<Vec<BlockStats>> {
        query.validate()?;
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, _, len) = self.block_hidden(states)?;
        let plan = RowPlan::masked(states, len);
        let start = self.prefix.len();
        Ok(self
            .frame
            .stats(&self.net.head, hidden, &plan, start, query)?)
    }
}
