//! Bring your own model: a block-diffusion model written against `spot_dlm` alone, its logits
//! reduced by the public reduction, decoded draft-free and with SPOT, and checked equal.
//!
//! ```text
//! cargo run --release --example custom_model
//! ```
//!
//! `MyModel` stands for your network: `my_logits` is where your forward would run (any engine,
//! any device). Everything else is what every model implements: static facts ([`ModelInfo`]),
//! a committed prefix per cache slot, and one batched forward over the block states of one or
//! more requests that returns one [`spot_dlm::BlockStats`] per state. [`reduce_block`] turns a state's logits into those statistics with
//! the coupled Gumbel noise, so a speculative decoder gets the draft-free tokens exactly.

use spot_dlm::{
    BlockDiffusionModel, CacheSlot, CacheUsage, DecodeConfig, DraftFreeDecoder, GroupScores,
    ModelInfo, Prefix, PrefixUpdate, ReduceScratch, Result, ScoreGroup, Slots, SpotDecoder,
    StaleConfidenceScorer, TokenId, reduce_block,
};

/// A 64-token model: a position's logits depend on the nearest committed token to its left.
struct MyModel {
    info: ModelInfo,
    prefixes: Slots<Vec<TokenId>>,
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
    fn open_slot(&mut self) -> Result<CacheSlot> {
        Ok(self.prefixes.open())
    }
    fn close_slot(&mut self, slot: CacheSlot) {
        self.prefixes.close(slot);
    }
    fn cache_usage(&self) -> CacheUsage {
        CacheUsage::default()
    }
    fn prefix_len(&self, slot: CacheSlot) -> usize {
        self.prefixes.get(slot).map_or(0, Vec::len)
    }
    fn reset_prefix(&mut self, slot: CacheSlot, prefix: Prefix<'_>) -> Result<PrefixUpdate> {
        *self.prefixes.get_mut(slot)? = prefix.tokens.to_vec();
        Ok(PrefixUpdate::forward(prefix.tokens.len()))
    }
    fn forward(&mut self, groups: &[ScoreGroup<'_>]) -> Result<Vec<GroupScores>> {
        let (info, mut out) = (&self.info, Vec::new());
        let (v, mask) = (info.vocab_size, info.mask_id);
        for g in groups {
            let prefix = self.prefixes.get_mut(g.slot)?;
            prefix.extend_from_slice(g.carry.append); // the finished block rides along
            let (start, mut stats, mut positions) = (prefix.len(), Vec::new(), 0);
            for state in g.states {
                let logits = my_logits(info, prefix, state.tokens());
                let s = reduce_block(&logits, v, start, g.query, mask, &mut self.scratch)?;
                stats.push(s);
                positions += state.len() as u64;
            }
            let append = PrefixUpdate::carried(g.carry.append.len());
            out.push(GroupScores::new(stats, positions).with_append(append));
        }
        Ok(out)
    }
}

fn main() -> Result<()> {
    let mut model = MyModel {
        info: ModelInfo::new(64, 63, 1024),
        prefixes: Slots::new(),
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
