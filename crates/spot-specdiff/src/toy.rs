//! Toy models for tests and examples: a causal target with peaked, context-dependent
//! distributions and the coupled noise, and a drafter that guesses it with a set error rate.

use spot_core::state::mix64;
use spot_core::stats::{ReduceScratch, reduce_logits};
use spot_core::{
    ArGroup, ArInfo, ArScores, AutoregressiveModel, BlockStats, CacheSlot, CacheUsage, Result,
    Slots, StatsQuery, TokenId,
};

use crate::drafter::{DiffusionDrafter, Marginals};

/// A causal toy target: the next token's logits depend on the last two tokens (hashed with
/// the model's seed): one favourite at +4, a runner-up at +2.5, the rest in `[0, 1)`. Its
/// cache per slot is the tokens seen; every entry of `shared` is returned.
#[derive(Clone, Debug)]
pub struct ToyCausalModel {
    info: ArInfo,
    seed: u64,
    slots: Slots<Vec<TokenId>>,
    scratch: ReduceScratch,
}

impl ToyCausalModel {
    /// A toy over `vocab` tokens (at least 4).
    pub fn new(vocab: usize, seed: u64) -> Self {
        Self {
            info: ArInfo {
                vocab_size: vocab.max(4),
                max_positions: 1 << 16,
                stop_ids: Vec::new(),
            },
            seed,
            slots: Slots::new(),
            scratch: ReduceScratch::default(),
        }
    }

    /// The same model with `stops` as its stop ids.
    pub fn with_stop_ids(mut self, stops: Vec<TokenId>) -> Self {
        self.info.stop_ids = stops;
        self
    }

    /// The logits of the token after `context` (its last two tokens matter).
    pub fn logits(&self, context: &[TokenId], out: &mut Vec<f32>) {
        let v = self.info.vocab_size;
        let a = context.last().copied().unwrap_or(0) as u64;
        let b = context.len().checked_sub(2).map_or(0, |i| context[i]) as u64;
        let h = mix64(self.seed ^ mix64(a ^ (b << 20)));
        out.clear();
        out.extend((0..v as u64).map(|t| (mix64(h ^ t) >> 40) as f32 / (1u64 << 24) as f32));
        out[(h % v as u64) as usize] = 4.0;
        let second = ((h >> 17) % v as u64) as usize;
        if out[second] < 4.0 {
            out[second] = 2.5;
        }
    }
}

impl ToyCausalModel {
    /// Appends `tokens` to `seen`, reducing the logits after each into `out`.
    fn run(
        &mut self,
        seen: &mut Vec<TokenId>,
        tokens: &[TokenId],
        query: &StatsQuery,
    ) -> Result<BlockStats> {
        let mut out = BlockStats::new(query.top_k);
        let mut logits = Vec::new();
        let no_mask = self.info.vocab_size as TokenId;
        for &t in tokens {
            seen.push(t);
            self.logits(seen, &mut logits);
            let position = seen.len();
            reduce_logits(
                &logits,
                position,
                query,
                no_mask,
                &mut self.scratch,
                &mut out,
            )?;
        }
        Ok(out)
    }
}

impl AutoregressiveModel for ToyCausalModel {
    fn ar_info(&self) -> &ArInfo {
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
            bytes: self.slots.iter().map(|s| 4 * s.len() as u64).sum(),
        }
    }

    fn cached_len(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, Vec::len)
    }

    fn truncate(&mut self, slot: CacheSlot, len: usize) -> Result<()> {
        self.slots.get_mut(slot)?.truncate(len);
        Ok(())
    }

    fn forward(&mut self, groups: &[ArGroup<'_>]) -> Result<Vec<ArScores>> {
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            g.query.validate()?;
            let mut seen = std::mem::take(self.slots.get_mut(g.slot)?);
            let shared = self.run(&mut seen, g.shared, g.query);
            let base = seen.len();
            let mut branches = Vec::with_capacity(g.branches.len());
            for b in g.branches {
                branches.push(self.run(&mut seen, b, g.query));
                seen.truncate(base);
            }
            *self.slots.get_mut(g.slot)? = seen;
            out.push(ArScores {
                shared: shared?,
                branches: branches.into_iter().collect::<Result<_>>()?,
            });
        }
        Ok(out)
    }
}

/// A toy drafter for [`ToyCausalModel`]: each position's marginal is the target's
/// distribution (at temperature 1) after the drafter's own argmax guesses, mixed with weight
/// `error` with a hashed distribution of its own; four candidates per position.
#[derive(Clone, Debug)]
pub struct ToyDrafter {
    target: ToyCausalModel,
    error: f32,
    seed: u64,
}

impl ToyDrafter {
    /// A drafter for `target` that is wrong with weight `error` (in `[0, 1]`).
    pub fn new(target: ToyCausalModel, error: f32, seed: u64) -> Self {
        Self {
            target,
            error: error.clamp(0.0, 1.0),
            seed,
        }
    }
}

impl DiffusionDrafter for ToyDrafter {
    fn name(&self) -> &str {
        "toy-drafter"
    }

    fn vocab_size(&self) -> usize {
        self.target.info.vocab_size
    }

    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        *out = Marginals::new(4);
        let mut ctx = context.to_vec();
        let mut logits = Vec::new();
        for i in 0..gamma {
            self.target.logits(&ctx, &mut logits);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
            let h = mix64(self.seed ^ mix64(ctx.len() as u64 ^ ((i as u64) << 32)));
            let mut p: Vec<(f32, TokenId)> = logits
                .iter()
                .enumerate()
                .map(|(t, l)| {
                    let own = (mix64(h ^ t as u64) >> 40) as f32 / (1u64 << 24) as f32;
                    let own = own.powi(8) * 4.0 / logits.len() as f32;
                    (
                        (1.0 - self.error) * (l - max).exp() / z + self.error * own,
                        t as TokenId,
                    )
                })
                .collect();
            p.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let ids: Vec<TokenId> = p[..4].iter().map(|x| x.1).collect();
            let probs: Vec<f32> = p[..4].iter().map(|x| x.0).collect();
            out.push(&ids, &probs)?;
            ctx.push(ids[0]);
        }
        Ok(())
    }
}
