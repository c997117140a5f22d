//! The order model's input: 74 features per block position.
//!
//! For a hypothesised state `y` at depth `d` below the round's root, with the round's stale
//! statistics `p~` (the target's output at the root's parent), position `s` of the block gets:
//!
//! | index | feature |
//! |---|---|
//! | 0..32 | the top-32 stale probabilities of `s`, sorted, most probable first (zero-padded) |
//! | 32..64 | their natural logs, floored at `ln 1e-10` |
//! | 64 | stale entropy of `s` (nats) |
//! | 65 | stale confidence of `s`: the probability of the decoder's (noised, under `T > 0`) stale choice — the top-1 probability at `T = 0` |
//! | 66 | stale probability mass outside the top 32 |
//! | 67 | rank of `s`'s stale confidence among the positions masked in `y`, over (masked − 1); 0 = most confident, ties to the lower index |
//! | 68 | relative position `s / (L − 1)` |
//! | 69 | distance to the nearest committed position of `y` on the left, over `L` (1 when none) |
//! | 70 | the same on the right |
//! | 71 | fraction of the block still masked in `y` |
//! | 72 | 1 when `s` is committed in `y` (in the root or along the path), else 0 |
//! | 73 | path depth `d / 8` |
//!
//! Features 0..68 are zero at positions committed in `y` and at positions without stale
//! statistics; only the position and path features describe them. Under `T > 0` the stale
//! statistics are the target's own tempered, noise-coupled ones (the confidence of the noised
//! choice), so the drafter sees exactly what the target's decoder would.

use spot_core::{BlockStats, TokenId};

/// Version of the feature definition; checkpoints record it and refuse a mismatch.
///
/// Version 2 (this one) replaced version 1's feature 65, top-1 minus top-2 probability (already
/// readable from features 0 and 1), with the confidence of the stale choice, which differs from
/// the top-1 probability under `T > 0` and tells the network which position the target's
/// sampler favours.
pub const FEATURES_VERSION: u32 = 2;

/// Number of stale probabilities read per position.
pub const TOP_K: usize = 32;

/// Features per position.
pub const N_FEATURES: usize = 2 * TOP_K + 10;

/// Floor of the log-probability features.
const LOG_FLOOR: f32 = -23.025_85; // ln(1e-10)

/// Stale statistics of one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PositionStale<'a> {
    /// Top probabilities, most probable first (at most [`TOP_K`] are read).
    pub top_probs: &'a [f32],
    /// Entropy (nats).
    pub entropy: f32,
    /// Mass outside the top-k.
    pub tail_mass: f32,
    /// The decoder's confidence at this position.
    pub confidence: f32,
}

/// Where stale statistics come from: the live [`BlockStats`] of a round, or a stored step.
pub trait StaleSource {
    /// Statistics of position `s`, or `None` when the source holds none for it.
    fn position(&self, s: usize) -> Option<PositionStale<'_>>;
}

impl StaleSource for BlockStats {
    fn position(&self, s: usize) -> Option<PositionStale<'_>> {
        if s >= self.len() {
            return None;
        }
        Some(PositionStale {
            top_probs: self.top(s).1,
            entropy: self.entropy(s),
            tail_mass: self.tail_mass(s),
            confidence: self.confidence(s),
        })
    }
}

/// Writes the features of every position of `y` into `out[s * N_FEATURES..]`.
///
/// `out` must hold `y.len() * N_FEATURES` values; it is overwritten.
///
/// ```
/// use spot_drafter::{N_FEATURES, PositionStale, StaleSource, write_features};
///
/// struct Flat(Vec<f32>);
/// impl StaleSource for Flat {
///     fn position(&self, s: usize) -> Option<PositionStale<'_>> {
///         let p = self.0.get(s)?;
///         Some(PositionStale { top_probs: std::slice::from_ref(p), entropy: 0.0, tail_mass: 1.0 - p, confidence: *p })
///     }
/// }
/// const M: u32 = 9;
/// let y = [M, 4, M, M];
/// let mut out = vec![0.0; y.len() * N_FEATURES];
/// write_features(&Flat(vec![0.5, 0.9, 0.2, 0.7]), &y, M, 1, &mut out);
/// assert_eq!(out[0], 0.5); // top-1 probability of position 0
/// assert_eq!(out[N_FEATURES + 72], 1.0); // position 1 is committed
/// assert_eq!(out[3 * N_FEATURES + 67], 0.0); // position 3: the most confident masked one
/// assert_eq!(out[67], 0.5); // position 0: the 2nd of 3
/// ```
pub fn write_features(
    stale: &dyn StaleSource,
    y: &[TokenId],
    mask_id: TokenId,
    depth: usize,
    out: &mut [f32],
) {
    let l = y.len();
    debug_assert_eq!(out.len(), l * N_FEATURES);
    out.fill(0.0);
    let masked: Vec<usize> = (0..l).filter(|&s| y[s] == mask_id).collect();
    let n_masked = masked.len();
    let frac_masked = if l == 0 {
        0.0
    } else {
        n_masked as f32 / l as f32
    };
    let conf = |s: usize| {
        stale
            .position(s)
            .map_or(f32::NEG_INFINITY, |p| p.confidence)
    };
    // Nearest committed position on each side.
    let mut left = vec![None; l];
    let mut last = None;
    for s in 0..l {
        left[s] = last;
        if y[s] != mask_id {
            last = Some(s);
        }
    }
    let mut right = vec![None; l];
    last = None;
    for s in (0..l).rev() {
        right[s] = last;
        if y[s] != mask_id {
            last = Some(s);
        }
    }
    let lf = l as f32;
    let rel_den = (l.saturating_sub(1)).max(1) as f32;
    let rank_den = (n_masked.saturating_sub(1)).max(1) as f32;
    for s in 0..l {
        let f = &mut out[s * N_FEATURES..(s + 1) * N_FEATURES];
        f[68] = s as f32 / rel_den;
        f[69] = left[s].map_or(1.0, |j| (s - j) as f32 / lf);
        f[70] = right[s].map_or(1.0, |j| (j - s) as f32 / lf);
        f[71] = frac_masked;
        f[73] = depth as f32 / 8.0;
        if y[s] != mask_id {
            f[72] = 1.0;
            continue;
        }
        let Some(p) = stale.position(s) else {
            continue;
        };
        let k = p.top_probs.len().min(TOP_K);
        for (j, &q) in p.top_probs[..k].iter().enumerate() {
            f[j] = q;
            f[TOP_K + j] = q.max(1e-10).ln().max(LOG_FLOOR);
        }
        for j in k..TOP_K {
            f[TOP_K + j] = LOG_FLOOR;
        }
        f[64] = p.entropy;
        f[65] = p.confidence;
        f[66] = p.tail_mass;
        let c = p.confidence;
        let rank = masked
            .iter()
            .filter(|&&j| {
                let cj = conf(j);
                cj > c || (cj == c && j < s)
            })
            .count();
        f[67] = rank as f32 / rank_den;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<(Vec<f32>, f32)>);
    impl StaleSource for Fixed {
        fn position(&self, s: usize) -> Option<PositionStale<'_>> {
            self.0.get(s).map(|(p, c)| PositionStale {
                top_probs: p,
                entropy: 1.5,
                tail_mass: 0.01,
                confidence: *c,
            })
        }
    }

    #[test]
    fn every_feature_of_a_small_block() {
        const M: TokenId = 99;
        let src = Fixed(vec![
            (vec![0.6, 0.3], 0.6),
            (vec![0.9, 0.05], 0.9),
            (vec![0.6, 0.1], 0.6),
            (vec![0.2; 40], 0.2),
        ]);
        let y = [M, 7, M, M];
        let mut out = vec![f32::NAN; 4 * N_FEATURES];
        write_features(&src, &y, M, 3, &mut out);
        assert!(out.iter().all(|v| v.is_finite()));
        let f = |s: usize, j: usize| out[s * N_FEATURES + j];
        assert_eq!((f(0, 0), f(0, 1), f(0, 2)), (0.6, 0.3, 0.0));
        assert_eq!(f(0, TOP_K), 0.6f32.ln());
        assert_eq!(f(0, TOP_K + 2), LOG_FLOOR);
        assert_eq!((f(0, 65), f(1, 65), f(2, 65)), (0.6, 0.0, 0.6));
        assert_eq!((f(0, 64), f(0, 66)), (1.5, 0.01));
        // ranks among masked {0, 2, 3}: 0 (tie with 2, lower index first), 2, 3
        assert_eq!((f(0, 67), f(2, 67), f(3, 67)), (0.0, 0.5, 1.0));
        // only 32 of 40 probabilities read
        assert_eq!(f(3, TOP_K - 1), 0.2);
        assert_eq!(f(3, TOP_K), 0.2f32.ln());
        // committed position: only position / path features
        assert_eq!(f(1, 72), 1.0);
        assert!((0..68).all(|j| f(1, j) == 0.0));
        assert_eq!(f(1, 68), 1.0 / 3.0);
        // neighbours of position 0: none on the left, position 1 at distance 1 on the right
        assert_eq!((f(0, 69), f(0, 70)), (1.0, 0.25));
        assert_eq!((f(2, 69), f(2, 70)), (0.25, 1.0));
        assert_eq!(f(3, 71), 0.75);
        assert_eq!(f(3, 73), 3.0 / 8.0);
    }

    #[test]
    fn live_block_stats_are_a_source() {
        let mut st = BlockStats::new(2);
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
        let p = st.position(0).unwrap();
        assert_eq!(
            (p.top_probs, p.confidence, p.entropy),
            (&[0.7, 0.2][..], 0.7, 0.9)
        );
        assert!(st.position(1).is_none());
    }
}
