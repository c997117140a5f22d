//! The rank tilt: the learned order leaned towards the stale-confidence ranking, by a weight
//! chosen per decoding temperature.
//!
//! The network's scores are residual on `ln` stale confidence (features version 3), so it
//! starts from the stale confidences' *values*. Under `T > 0` those values are nearly flat (at
//! `T = 2` almost every position's confidence is below 0.05), while the *ranking* they induce
//! still names the next commit 60-70% of the time at depth 0; a network trained mostly on the
//! large `T = 0` gains then ranks slightly worse than that ranking there. The tilt multiplies
//! the network's `q(s | y)` by `exp(−λ · rank(s))` (rank 0 = the most stale-confident masked
//! position, feature 67) and renormalises; `λ = 0` is the network unchanged. `λ` is chosen per
//! temperature by the forwards SPOT needs on prompts the network never trained on
//! (`tools/tune_tilt.sh`, `spot calibrate-order --tilt T:λ`), not by the cross-entropy of the
//! next commit: on held-out trajectories that is lowest at `λ = 0` at every temperature,
//! while on the tree a tilt makes the chains along the ranking deeper. Tree shape only: the
//! output is the draft-free output whatever the weights.

use serde::{Deserialize, Serialize};

use crate::analysis::nearest_temperature;
use crate::features::RANK_FEATURE;
use spot_tree::TableError;

/// The rank tilt at one decoding temperature (see the [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankTilt {
    /// The decoding temperature it is for (decoding uses the tilt stored nearest its own).
    pub temperature: f32,
    /// `λ ≥ 0`: the score lost per rank below the most stale-confident position.
    pub tilt: f32,
}

impl RankTilt {
    /// Whether the values are usable (used when loading a checkpoint).
    pub fn check(&self) -> Result<(), TableError> {
        let ok = |v: f32| v.is_finite() && v >= 0.0;
        if !ok(self.temperature) || !ok(self.tilt) {
            return Err(TableError::field(
                "rank_tilt_by_temperature",
                "temperature and tilt must be finite and non-negative",
            ));
        }
        Ok(())
    }
}

/// The tilt for decoding at `temperature`: the one stored for the nearest temperature, 0 (no
/// tilt) when there is none.
pub fn nearest_tilt(tilts: &[RankTilt], temperature: f32) -> f32 {
    nearest_temperature(tilts, temperature, |t| Some(t.temperature)).map_or(0.0, |t| t.tilt)
}

/// Integer ranks of one row's masked positions, read back from feature 67 (rank over
/// `masked − 1`); `None` at positions that are not masked.
fn row_ranks<'a>(
    features: &'a [f32],
    valid: &'a [f32],
    nf: usize,
) -> impl Iterator<Item = Option<f32>> + 'a {
    let masked = valid.iter().filter(|&&v| v > 0.0).count();
    let den = masked.saturating_sub(1).max(1) as f32;
    valid
        .iter()
        .enumerate()
        .map(move |(s, &v)| (v > 0.0).then(|| (features[s * nf + RANK_FEATURE] * den).round()))
}

/// Applies tilt `lambda` to `p`, `n` rows of `L` probabilities (0 where not masked) with their
/// features `[n, L, nf]` and valid masks `[n, L]`: each masked `p_s` times `exp(−λ · rank_s)`,
/// renormalised over the row's masked positions.
pub(crate) fn tilt_rows(
    p: &mut [f32],
    features: &[f32],
    valid: &[f32],
    l: usize,
    nf: usize,
    lambda: f32,
) {
    if lambda == 0.0 || l == 0 {
        return;
    }
    for (i, row) in p.chunks_mut(l).enumerate() {
        let (f, v) = (
            &features[i * l * nf..(i + 1) * l * nf],
            &valid[i * l..(i + 1) * l],
        );
        let mut ranks = row_ranks(f, v, nf);
        reweigh_row(row, |_, p| {
            ranks.next().flatten().map(|r| p * (-lambda * r).exp())
        });
    }
}

/// Replaces each entry `s` of `row` for which `f(s, row[s])` is `Some` by that value (other
/// entries stay as they are; `f` is called once per entry, in order) and renormalises the row so the replaced entries sum to one
/// (nothing when they sum to 0). Shared by the tilt and the rank-path prior
/// ([`crate::prior`]).
pub(crate) fn reweigh_row(row: &mut [f32], mut f: impl FnMut(usize, f32) -> Option<f32>) {
    let mut z = 0.0;
    for (s, x) in row.iter_mut().enumerate() {
        if let Some(v) = f(s, *x) {
            *x = v;
            z += v;
        }
    }
    if z > 0.0 {
        row.iter_mut().for_each(|x| *x /= z);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilt_moves_mass_towards_low_ranks_and_keeps_rows_normalised() {
        // One row of 3 positions, position 1 committed; ranks (feature 67 over masked − 1 = 1):
        // position 0 rank 1, position 2 rank 0.
        let nf = RANK_FEATURE + 1;
        let mut f = vec![0.0; 3 * nf];
        f[RANK_FEATURE] = 1.0;
        f[2 * nf + RANK_FEATURE] = 0.0;
        let valid = [1.0, 0.0, 1.0];
        let mut p = vec![0.6, 0.0, 0.4];
        tilt_rows(&mut p, &f, &valid, 3, nf, 1.0);
        let (a, c) = (0.6 * (-1.0f32).exp(), 0.4);
        assert!((p[0] - a / (a + c)).abs() < 1e-6, "{p:?}");
        assert!((p[2] - c / (a + c)).abs() < 1e-6, "{p:?}");
        assert_eq!(p[1], 0.0);
        let mut q = vec![0.6, 0.0, 0.4];
        tilt_rows(&mut q, &f, &valid, 3, nf, 0.0);
        assert_eq!(q, [0.6, 0.0, 0.4]);
    }

    #[test]
    fn the_nearest_temperature_picks_the_tilt() {
        let t = |temperature, tilt| RankTilt { temperature, tilt };
        let tilts = [t(0.0, 0.0), t(1.0, 0.3), t(2.0, 0.5)];
        assert_eq!(nearest_tilt(&tilts, 0.9), 0.3);
        assert_eq!(nearest_tilt(&tilts, 1.8), 0.5);
        assert_eq!(nearest_tilt(&[], 1.0), 0.0);
        assert!(t(1.0, -0.1).check().is_err());
        assert!(t(f32::NAN, 0.1).check().is_err());
        assert!(t(1.0, 0.1).check().is_ok());
    }
}
