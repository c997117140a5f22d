//! Block-causal block diffusion with an exact prefix KV cache (SDAR, LLaDA2.0).
//!
//! A block attends to every earlier block (read from the cache) and to itself
//! bidirectionally. A forward over `n` block states broadcasts the cached prefix over the states
//! inside batched matrix products: the cache is read in place, never copied per state, and each
//! state's products have a fixed shape, so its statistics do not depend on the batch. Finished
//! blocks are appended to the cache with one forward each.

use burn_tensor::backend::Backend;
use spot_core::{
    BlockDiffusionModel, BlockState, BlockStats, ModelInfo, PrefixUpdate, StatsQuery, TokenId,
};

use crate::attention::{Attend, Kv};
use crate::error::Result;
use crate::frame::Frame;
use crate::head::RowPlan;
use crate::transformer::Net;

/// A block-causal model on backend `B` with family config `C`, and its prefix KV cache.
/// The families name it: [`crate::Sdar`], [`crate::Llada2Moe`].
pub struct BlockCausal<B: Backend, C> {
    cfg: C,
    net: Net<B>,
    frame: Frame<B>,
    info: ModelInfo,
    cache: Vec<Kv<B>>,
    prefix: Vec<TokenId>,
}

impl<B: Backend, C: std::fmt::Debug> std::fmt::Debug for BlockCausal<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCausal")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("prefix_len", &self.prefix.len())
            .finish_non_exhaustive()
    }
}

/// The [`ModelInfo`] of a block-diffusion frame (the mask id was resolved when it opened).
pub(crate) fn diffusion_info<B: Backend>(frame: &Frame<B>) -> ModelInfo {
    ModelInfo {
        vocab_size: frame.vocab_size,
        mask_id: frame.mask_id.unwrap_or_default(),
        max_positions: frame.max_positions,
        stop_ids: frame.stop_ids.clone(),
    }
}

impl<B: Backend, C> BlockCausal<B, C> {
    pub(crate) fn assemble(cfg: C, net: Net<B>, frame: Frame<B>) -> Self {
        Self {
            info: diffusion_info(&frame),
            cfg,
            net,
            frame,
            cache: Vec::new(),
            prefix: Vec::new(),
        }
    }

    crate::frame::folder_accessors!(C);

    /// Logits `[n, len, vocab]` of `states` after the cached prefix, as host values (for
    /// tests and tools; decoding uses [`BlockDiffusionModel::forward`], which never copies
    /// logits to the host).
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Vec<f32>> {
        let (ids, n, len) = self.frame.check_states(states, self.prefix.len())?;
        let (hidden, _) = self.run(ids, n, len);
        Ok(self.net.head.logits_host(hidden))
    }

    fn run(&self, ids: Vec<i64>, n: usize, len: usize) -> (burn_tensor::Tensor<B, 2>, Vec<Kv<B>>) {
        self.net.run(
            ids,
            n,
            len,
            self.prefix.len(),
            &self.cache,
            Attend::Bidirectional,
        )
    }

    /// Appends one block to the KV cache (one forward).
    fn append(&mut self, block: &[TokenId]) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        self.frame
            .check_end(self.prefix.len() + block.len(), "prefix")?;
        let mut ids = Vec::with_capacity(block.len());
        self.frame.push_ids(block, &mut ids)?;
        let (_, kv) = self.run(ids, 1, block.len());
        Net::extend_cache(&mut self.cache, kv);
        self.prefix.extend_from_slice(block);
        Ok(())
    }
}

impl<B: Backend, C> BlockDiffusionModel for BlockCausal<B, C> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn reset_prefix(
        &mut self,
        prefix: &[TokenId],
        block_size: usize,
    ) -> spot_core::Result<PrefixUpdate> {
        self.cache.clear();
        self.prefix.clear();
        self.frame.begin(block_size)?;
        for chunk in prefix.chunks(block_size) {
            self.append(chunk)?;
        }
        Ok(PrefixUpdate {
            ran_forward: !prefix.is_empty(),
            positions: prefix.len(),
        })
    }

    fn append_block(&mut self, block: &[TokenId]) -> spot_core::Result<PrefixUpdate> {
        self.append(block)?;
        Ok(PrefixUpdate {
            ran_forward: !block.is_empty(),
            positions: block.len(),
        })
    }

    fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    fn forward(
        &mut self,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> spot_core::Result<Vec<BlockStats>> {
        query.validate()?;
        let (ids, n, len) = self.frame.check_states(states, self.prefix.len())?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let (hidden, _) = self.run(ids, n, len);
        let plan = RowPlan::masked(states, len);
        let start = self.prefix.len();
        Ok(self
            .frame
            .stats(&self.net.head, hidden, &plan, start, query)?)
    }
}
