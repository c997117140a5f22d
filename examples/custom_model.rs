//! Bring your own model: a block-diffusion model written against `spot_dlm` alone, its logits
//! reduced by the public reduction, decoded draft-free and with SPOT, and checked equal.
//!
//! ```text
//! cargo run --release --example custom_model
//! ```
//!
//! `MyModel` stands for your network: `my_logits` is where your forward would run (any engine,
//! any device). Everything else is what every model implements: static facts ([`ModelInfo`]),
//! a committed prefix, and one batched forward over block states that returns one
//! [`BlockStats`] per state. [`reduce_block`] turns a state's logits into those statistics with
//! the coupled Gumbel noise, so a speculative decoder gets the draft-free tokens exactly.

use spot_dlm::{
    BlockDiffusionModel, BlockState, BlockStats, DecodeConfig, DraftFreeDecoder, ModelInfo,
    PrefixUpdate, ReduceScratch, Result, SpotDecoder, StaleConfidenceScorer, StatsQuery, TokenId,
    reduce_block,
};

/// A 64-token model: a position's logits depend on the nearest committed token to its left.
struct MyModel {
    info: ModelInfo,
    prefix: Vec<TokenId>,
    scratch: ReduceScratch,
}

/// One row of `vocab` logits per position of `tokens` (your network's forward goes here).
fn my_logits(info: &ModelInfo, prefix: &[TokenId], tokens: &[TokenId]) -> Vec<f32> {
    let v = info.vocab_size;
    let mut out = vec![0.0; tokens.len() * v];
    for (s, row) in out.chunks_mut(v).enumerate() {
        let left = tokens[..s].iter().rev().find(|&&t| t != info.mask_id);
        let left = left.or(prefix.last()).map_or(1, |&t| u64::from(t));
        for (t, logit) in row.iter_mut().enumerate() {
            *logit = ((left * 31 + t as u64 * 17 + s as u64 * 7) % 97) as f32 / 9.0;
        }
    }
    out
}

impl BlockDiffusionModel for MyModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn reset_prefix(&mut self, prefix: &[TokenId], _block_size: usize) -> Result<PrefixUpdate> {
        self.prefix = prefix.to_vec();
        Ok(PrefixUpdate::forward(prefix.len()))
    }

    fn append_block(&mut self, block: &[TokenId]) -> Result<PrefixUpdate> {
        self.prefix.extend_from_slice(block);
        Ok(PrefixUpdate::forward(block.len()))
    }

    fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    fn forward(&mut self, states: &[BlockState], query: &StatsQuery) -> Result<Vec<BlockStats>> {
        let (info, start) = (&self.info, self.prefix.len());
        let (v, mask) = (info.vocab_size, info.mask_id);
        let reduce = |state: &BlockState| {
            let logits = my_logits(info, &self.prefix, state.tokens());
            reduce_block(&logits, v, start, query, mask, &mut self.scratch)
        };
        states.iter().map(reduce).collect()
    }
}

fn main() -> Result<()> {
    let mut model = MyModel {
        info: ModelInfo::new(64, 63, 1024),
        prefix: Vec::new(),
        scratch: ReduceScratch::default(),
    };
    let prompt = [5, 9, 12, 40];
    for temperature in [0.0, 1.0] {
        let cfg = DecodeConfig {
            block_size: 16,
            max_new_tokens: 64,
            temperature,
            seed: 7,
            ..DecodeConfig::default()
        };
        let reference = DraftFreeDecoder::new().decode(&mut model, &prompt, &cfg)?;
        let mut spot = SpotDecoder::builder()
            .budget(8)
            .scorer(StaleConfidenceScorer)
            .build()?;
        let fast = spot.decode(&mut model, &prompt, &cfg)?;
        assert_eq!(
            fast.tokens, reference.tokens,
            "SPOT must return the draft-free tokens"
        );
        println!(
            "T {temperature}: {} tokens, identical; forwards: draft-free {}, SPOT {}",
            fast.tokens.len(),
            reference.stats.work.nfe,
            fast.stats.work.nfe
        );
    }
    Ok(())
}
