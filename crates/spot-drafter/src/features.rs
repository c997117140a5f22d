//! The order model's input: 78 features per block position (version 3).
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
//! | 74 | `ln` of the stale confidence (feature 65), floored at `ln 1e-10`: the score a version-3 network adds its output to, so an untrained one ranks like stale confidence |
//! | 75 | noised margin of `s` ([`noised_margin`]), capped at [`MARGIN_CAP`] |
//! | 76 | `ln` of the hedge's stale probability (the noised runner-up), floored |
//! | 77 | the decoding temperature, capped at 4 |
//!
//! Version-2 checkpoints read the first 74 ([`write_features`] writes as many as the network
//! reads). Features 0..68 and 74..77 are zero at positions committed in `y` and at positions without stale
//! statistics; only the position and path features describe them. Under `T > 0` the stale
//! statistics are the target's own tempered, noise-coupled ones (the confidence of the noised
//! choice), so the drafter sees exactly what the target's decoder would.

use spot_core::TokenId;

pub use spot_tree::stale::{
    LiveStale, MARGIN_CAP, PositionStale, StaleSource, StoredPosition, bf16_bits, bf16_round,
    noised_margin,
};

/// Version of the feature definition; checkpoints record it and refuse a mismatch.
///
/// Version 2 (this one) replaced version 1's feature 65, top-1 minus top-2 probability (already
/// readable from features 0 and 1), with the confidence of the stale choice, which differs from
/// the top-1 probability under `T > 0` and tells the network which position the target's
/// sampler favours.
///
/// Version 3 (this one) appended the log stale confidence, the noised margin, the hedge's log
/// probability and the temperature (features 74-77); version-2 checkpoints still load and read
/// the first 74.
pub const FEATURES_VERSION: u32 = 3;

/// The previous version, still read by [`write_features`] for older checkpoints.
pub const FEATURES_VERSION_2: u32 = 2;

/// Features a version-2 network reads.
pub const N_FEATURES_V2: usize = 2 * TOP_K + 10;

/// Number of stale probabilities read per position.
pub const TOP_K: usize = 32;

/// Features per position.
pub const N_FEATURES: usize = N_FEATURES_V2 + 4;

/// Index of feature 67: the position's stale-confidence rank among the masked positions, over
/// `masked − 1`.
pub const RANK_FEATURE: usize = 67;

/// Floor of the log-probability features.
const LOG_FLOOR: f32 = -23.025_85; // ln(1e-10)

/// Writes the features of every position of `y` into `out[s * F..]`, where `F` (the features
/// per position the network reads: [`N_FEATURES`], or [`N_FEATURES_V2`] for a version-2
/// checkpoint) is `out.len() / y.len()`; the first `F` features of the table above are written
/// and `out` is overwritten. `temperature` is the target's decoding temperature.
///
/// ```
/// use spot_drafter::{N_FEATURES, PositionStale, StaleSource, write_features};
///
/// struct Flat(Vec<f32>);
/// impl StaleSource for Flat {
///     fn position(&self, s: usize) -> Option<PositionStale<'_>> {
///         let p = self.0.get(s)?;
///         Some(PositionStale {
///             top_probs: std::slice::from_ref(p), entropy: 0.0, tail_mass: 1.0 - p,
///             confidence: *p, hedge_prob: 0.0, margin: 20.0,
///         })
///     }
/// }
/// const M: u32 = 9;
/// let y = [M, 4, M, M];
/// let mut out = vec![0.0; y.len() * N_FEATURES];
/// write_features(&Flat(vec![0.5, 0.9, 0.2, 0.7]), &y, M, 1, 1.0, &mut out);
/// assert_eq!(out[0], 0.5); // top-1 probability of position 0
/// assert_eq!(out[N_FEATURES + 72], 1.0); // position 1 is committed
/// assert_eq!(out[3 * N_FEATURES + 67], 0.0); // position 3: the most confident masked one
/// assert_eq!(out[67], 0.5); // position 0: the 2nd of 3
/// assert_eq!(out[74], 0.5f32.ln()); // the residual base: ln confidence
/// assert_eq!(out[77], 1.0); // temperature
/// ```
pub fn write_features(
    stale: &dyn StaleSource,
    y: &[TokenId],
    mask_id: TokenId,
    depth: usize,
    temperature: f32,
    out: &mut [f32],
) {
    let l = y.len();
    let width = out.len().checked_div(l).unwrap_or(0).min(N_FEATURES);
    debug_assert_eq!(out.len(), l * width);
    out.fill(0.0);
    let mut all = [0.0f32; N_FEATURES];
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
    let temperature = if temperature.is_finite() {
        temperature.clamp(0.0, 4.0)
    } else {
        0.0
    };
    for s in 0..l {
        all.fill(0.0);
        let f = &mut all;
        f[77] = temperature;
        f[68] = s as f32 / rel_den;
        f[69] = left[s].map_or(1.0, |j| (s - j) as f32 / lf);
        f[70] = right[s].map_or(1.0, |j| (j - s) as f32 / lf);
        f[71] = frac_masked;
        f[73] = depth as f32 / 8.0;
        let p = if y[s] == mask_id {
            stale.position(s)
        } else {
            f[72] = 1.0;
            None
        };
        match p {
            Some(p) => position_features(&p, &masked, &conf, s, rank_den, f),
            // Masked without statistics: the least confident.
            None if y[s] == mask_id => f[74] = LOG_FLOOR,
            None => {}
        }
        out[s * width..(s + 1) * width].copy_from_slice(&all[..width]);
    }
}

/// The stale-statistics features (0..68, 74..77) of masked position `s`.
fn position_features(
    p: &PositionStale<'_>,
    masked: &[usize],
    conf: &dyn Fn(usize) -> f32,
    s: usize,
    rank_den: f32,
    f: &mut [f32; N_FEATURES],
) {
    let k = p.top_probs.len().min(TOP_K);
    for (j, &q) in p.top_probs[..k].iter().enumerate() {
        f[j] = q;
        f[TOP_K + j] = log_floored(q);
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
    f[74] = log_floored(c);
    f[75] = if p.margin.is_nan() {
        MARGIN_CAP
    } else {
        p.margin.clamp(0.0, MARGIN_CAP)
    };
    f[76] = log_floored(p.hedge_prob);
}

fn log_floored(p: f32) -> f32 {
    if p.is_nan() {
        return LOG_FLOOR;
    }
    p.max(1e-10).ln().max(LOG_FLOOR)
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
                hedge_prob: p.get(1).copied().unwrap_or(0.0),
                margin: 0.5,
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
        write_features(&src, &y, M, 3, 7.0, &mut out);
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
        // version 3: ln confidence, margin, ln hedge probability, temperature (capped at 4)
        assert_eq!(
            (f(0, 74), f(0, 75), f(0, 76)),
            (0.6f32.ln(), 0.5, 0.3f32.ln())
        );
        assert_eq!((f(1, 74), f(1, 75), f(1, 76)), (0.0, 0.0, 0.0));
        assert_eq!((f(0, 77), f(1, 77)), (4.0, 4.0));
        // a version-2 network reads the first 74 of each position
        let mut v2 = vec![f32::NAN; 4 * N_FEATURES_V2];
        write_features(&src, &y, M, 3, 7.0, &mut v2);
        for s in 0..4 {
            assert_eq!(
                &v2[s * N_FEATURES_V2..(s + 1) * N_FEATURES_V2],
                &out[s * N_FEATURES..s * N_FEATURES + N_FEATURES_V2]
            );
        }
    }
}
