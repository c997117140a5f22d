//! The target's stale statistics as the drafters read them: one position's record
//! ([`StoredPosition`], what trajectories store and the live scorers compute, so training and
//! decoding see the same inputs), the view the features read ([`PositionStale`], through a
//! [`StaleSource`]), and the noised margin of the choice over its hedge.

use spot_core::{BlockStats, GumbelNoise, TokenId};

use crate::scorer::noised_runner_up;

/// Cap of the noised-margin feature (also its value when the choice has no runner-up).
pub const MARGIN_CAP: f32 = 20.0;

/// The noised margin of the decoder's choice at a position: by how much the choice's noised
/// score `ln p~(v) + G[position, v]` exceeds the hedge's (the runner-up of the same rule,
/// [`noised_runner_up`]); without noise (`T = 0`) `ln p~(top-1) − ln p~(top-2)`.
/// It is how far the tempered log-probabilities must move before the target's choice flips.
/// `choice` and `hedge` are (token, stale probability); [`MARGIN_CAP`] when there is no hedge,
/// clamped to `[0, MARGIN_CAP]`.
///
/// ```
/// use spot_tree::stale::noised_margin;
/// let m = noised_margin((4, 0.5), Some((7, 0.25)), 0, None);
/// assert!((m - 2f32.ln()).abs() < 1e-6);
/// assert_eq!(noised_margin((4, 0.9), None, 0, None), spot_tree::stale::MARGIN_CAP);
/// ```
pub fn noised_margin(
    choice: (TokenId, f32),
    hedge: Option<(TokenId, f32)>,
    position: u64,
    noise: Option<GumbelNoise>,
) -> f32 {
    let Some(hedge) = hedge else {
        return MARGIN_CAP;
    };
    let score =
        |(id, p): (TokenId, f32)| p.max(1e-30).ln() + noise.map_or(0.0, |g| g.value(position, id));
    let m = score(choice) - score(hedge);
    if m.is_nan() {
        return MARGIN_CAP;
    }
    m.clamp(0.0, MARGIN_CAP)
}

/// Stale statistics of one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PositionStale<'a> {
    /// Top probabilities, most probable first (the order drafter reads at most 32).
    pub top_probs: &'a [f32],
    /// Entropy (nats).
    pub entropy: f32,
    /// Mass outside the top-k.
    pub tail_mass: f32,
    /// The decoder's confidence at this position.
    pub confidence: f32,
    /// Stale probability of the hedge (the choice rule's runner-up; 0 when none).
    pub hedge_prob: f32,
    /// [`noised_margin`] of the choice over the hedge.
    pub margin: f32,
}

/// Where stale statistics come from: the live [`BlockStats`] of a round
/// (through [`LiveStale`]), or a stored step.
pub trait StaleSource {
    /// Statistics of position `s`, or `None` when the source holds none for it.
    fn position(&self, s: usize) -> Option<PositionStale<'_>>;
}

/// The live stale statistics of a round as a [`StaleSource`]: the [`BlockStats`] of every
/// position read the way the trajectory recorder stores them
/// ([`StoredPosition::from_stats`]), so decoding
/// and training compute the same features, hedge and noised margin included.
///
/// [`BlockStats`]: spot_core::BlockStats
///
/// A scorer called several times a round keeps one and [updates](LiveStale::update) it: the
/// positions are recomputed only when the statistics change.
#[derive(Clone, Debug, Default)]
pub struct LiveStale {
    positions: Vec<StoredPosition>,
    /// What `positions` were computed from (`None`: nothing yet).
    key: Option<LiveKey>,
}

/// The inputs of a [`LiveStale`].
#[derive(Clone, Debug)]
struct LiveKey {
    stats: spot_core::BlockStats,
    block_start: usize,
    noise: Option<GumbelNoise>,
    mask: TokenId,
}

impl LiveStale {
    /// The round's stale statistics `stats` of the block starting at absolute position
    /// `block_start`, under `noise` (`None` at `T = 0`).
    pub fn new(
        stats: &spot_core::BlockStats,
        block_start: usize,
        noise: Option<GumbelNoise>,
        mask: TokenId,
    ) -> Self {
        let mut live = Self::default();
        live.update(stats, block_start, noise, mask);
        live
    }

    /// Makes `self` what [`LiveStale::new`] with these arguments gives, recomputing the
    /// positions only when an argument differs from the previous call's (the statistics
    /// compared bit for bit, [`BlockStats::same_bits`](spot_core::BlockStats::same_bits)):
    /// a round's calls after its first reuse them. Returns whether they were recomputed.
    pub fn update(
        &mut self,
        stats: &spot_core::BlockStats,
        block_start: usize,
        noise: Option<GumbelNoise>,
        mask: TokenId,
    ) -> bool {
        if let Some(k) = &self.key
            && k.block_start == block_start
            && k.noise == noise
            && k.mask == mask
            && k.stats.same_bits(stats)
        {
            return false;
        }
        self.positions.clear();
        self.positions.extend(
            (0..stats.len())
                .map(|s| StoredPosition::from_stats(stats, s, block_start, noise, mask)),
        );
        match &mut self.key {
            Some(k) => {
                k.stats.clone_from(stats);
                (k.block_start, k.noise, k.mask) = (block_start, noise, mask);
            }
            None => {
                self.key = Some(LiveKey {
                    stats: stats.clone(),
                    block_start,
                    noise,
                    mask,
                })
            }
        }
        true
    }

    /// Position `s` as [`StoredPosition::from_stats`] gives it.
    pub fn stored(&self, s: usize) -> Option<&StoredPosition> {
        self.positions.get(s)
    }
}

impl StaleSource for LiveStale {
    fn position(&self, s: usize) -> Option<PositionStale<'_>> {
        self.positions.get(s).map(StoredPosition::stale)
    }
}

/// The target's statistics at one masked position before a step.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredPosition {
    /// Position in the block.
    pub position: u32,
    /// The decoder's choice there.
    pub token: TokenId,
    /// Second most probable token.
    pub runner_up: TokenId,
    /// Confidence of the choice.
    pub confidence: f32,
    /// Entropy (nats).
    pub entropy: f32,
    /// Mass outside the top-k.
    pub tail_mass: f32,
    /// The runner-up of the decoder's own choice rule (the noised runner-up under `T > 0`, see
    /// [`noised_runner_up`]; `token` when there is none): the tree's hedge.
    pub hedge: TokenId,
    /// The hedge's stale probability (0 when there is none).
    pub hedge_prob: f32,
    /// The noised margin of the choice over the hedge ([`noised_margin`]).
    pub margin: f32,
    /// Top-k probabilities, most probable first.
    pub top_probs: Vec<f32>,
    /// Their token ids (empty in version-2 files).
    pub top_ids: Vec<TokenId>,
    /// The target's final hidden state there (the trajectory's hidden width, bf16
    /// precision; empty when the trajectory has none).
    pub hidden: Vec<f32>,
}

impl StoredPosition {
    /// What the drafter reads of position `s` of the live statistics `stats` of the block
    /// starting at absolute position `block_start`, under the decoder's noise (`None` at
    /// `T = 0`): the one definition shared by the trajectory recorder and the live scorer
    /// ([`LiveStale`]), so training and decoding see the same
    /// features.
    pub fn from_stats(
        stats: &BlockStats,
        s: usize,
        block_start: usize,
        noise: Option<GumbelNoise>,
        mask: TokenId,
    ) -> Self {
        let (ids, probs) = stats.top(s);
        let position = (block_start + s) as u64;
        let token = stats.token(s);
        let hedge = noised_runner_up(stats, s, position, noise, mask);
        Self {
            position: s as u32,
            token,
            runner_up: ids.get(1).copied().unwrap_or(token),
            confidence: stats.confidence(s),
            entropy: stats.entropy(s),
            tail_mass: stats.tail_mass(s),
            hedge: hedge.map_or(token, |h| h.0),
            hedge_prob: hedge.map_or(0.0, |h| h.1),
            margin: noised_margin((token, stats.confidence(s)), hedge, position, noise),
            top_probs: probs.to_vec(),
            top_ids: ids.to_vec(),
            hidden: stats
                .hidden_at(s)
                .map(|h| h.iter().map(|&v| bf16_round(v)).collect())
                .unwrap_or_default(),
        }
    }

    /// The stored statistics as the drafter's features read them.
    pub fn stale(&self) -> PositionStale<'_> {
        PositionStale {
            top_probs: &self.top_probs,
            entropy: self.entropy,
            tail_mass: self.tail_mass,
            confidence: self.confidence,
            hedge_prob: self.hedge_prob,
            margin: self.margin,
        }
    }
}

/// The bf16 bits of `v`, rounded to nearest, ties to even (NaN stays NaN).
pub fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// `v` rounded to bf16 precision (what a stored hidden state reads back as).
pub fn bf16_round(v: f32) -> f32 {
    f32::from_bits(u32::from(bf16_bits(v)) << 16)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn live_block_stats_are_a_source() {
        let mut st = spot_core::BlockStats::new(2);
        st.push(spot_core::stats::PositionStats {
            token: 3,
            confidence: 0.7,
            token_prob: 0.7,
            entropy: 0.9,
            tail_mass: 0.1,
            top_ids: &[3, 4],
            top_probs: &[0.7, 0.2],
        })
        .unwrap();
        let live = LiveStale::new(&st, 64, None, 99);
        let p = live.position(0).unwrap();
        assert_eq!(
            (p.top_probs, p.confidence, p.entropy, p.hedge_prob),
            (&[0.7, 0.2][..], 0.7, 0.9, 0.2)
        );
        assert!((p.margin - (0.7f32 / 0.2).ln()).abs() < 1e-6);
        assert!(live.position(1).is_none());
        // Under noise the margin is the noised scores' difference, never negative.
        let g = GumbelNoise::new(5);
        let live = LiveStale::new(&st, 64, Some(g), 99);
        let want = 0.7f32.ln() + g.value(64, 3) - 0.2f32.ln() - g.value(64, 4);
        assert!((live.position(0).unwrap().margin - want.clamp(0.0, MARGIN_CAP)).abs() < 1e-5);
    }

    /// Statistics of `n` positions, `v` mixed into every value, with hidden states of width 2.
    fn stats(n: usize, v: f32) -> spot_core::BlockStats {
        let mut st = spot_core::BlockStats::new(2);
        for s in 0..n {
            let c = 0.5 + v + s as f32 * 0.01;
            st.push(spot_core::stats::PositionStats {
                token: 3 + s as u32,
                confidence: c,
                token_prob: c,
                entropy: 0.9,
                tail_mass: 0.1 - v,
                top_ids: &[3 + s as u32, 40],
                top_probs: &[c, 0.2],
            })
            .unwrap();
        }
        st.set_hidden(2, (0..2 * n).map(|i| i as f32 + v).collect())
            .unwrap();
        st
    }

    /// Every position of `live` as stored, to compare two sources exactly.
    fn positions(live: &LiveStale) -> Vec<StoredPosition> {
        live.positions.clone()
    }

    #[test]
    fn an_updated_source_is_the_new_one_whatever_changed() {
        let (a, b) = (stats(4, 0.0), stats(4, 0.125));
        let g = Some(GumbelNoise::new(5));
        let mut live = LiveStale::default();
        // Each change of an argument recomputes; repeating one keeps the same values.
        let calls: [(&spot_core::BlockStats, usize, Option<GumbelNoise>, TokenId); 7] = [
            (&a, 64, None, 99),
            (&a, 64, None, 99),
            (&b, 64, None, 99),
            (&b, 96, None, 99),
            (&b, 96, g, 99),
            (&b, 96, g, 40),
            (&stats(3, 0.125), 96, g, 40),
        ];
        for (st, start, noise, mask) in calls {
            live.update(st, start, noise, mask);
            assert_eq!(
                positions(&live),
                positions(&LiveStale::new(st, start, noise, mask))
            );
        }
        // A change in the hidden states alone, or in a zero's sign, is a change.
        let mut c = stats(3, 0.125);
        c.set_hidden(2, vec![9.0; 6]).unwrap();
        live.update(&c, 96, g, 40);
        assert_eq!(live.positions[0].hidden, vec![9.0, 9.0]);
        let (x, y) = (stats(2, 0.1), stats(2, 0.1));
        assert!(x.same_bits(&y));
        let mut neg_zero = spot_core::BlockStats::new(2);
        let mut pos_zero = spot_core::BlockStats::new(2);
        for (st, e) in [(&mut neg_zero, -0.0f32), (&mut pos_zero, 0.0)] {
            st.push(spot_core::stats::PositionStats {
                token: 1,
                confidence: 1.0,
                token_prob: 1.0,
                entropy: e,
                tail_mass: 0.0,
                top_ids: &[1, 2],
                top_probs: &[1.0, 0.0],
            })
            .unwrap();
        }
        assert!(!neg_zero.same_bits(&pos_zero) && pos_zero.same_bits(&pos_zero.clone()));
    }
}
