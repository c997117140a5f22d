//! The rank-path prior: the learned order combined with the frequencies of stale-confidence
//! rank paths, by a weight chosen per decoding temperature.
//!
//! Under `T > 0` the commit order is decided mostly by the coupled noise, which the stale
//! statistics already encode, and the network's `q(s | y)` ranks no better than counting how
//! often the draft-free decoder followed each rank path (the Spiffy graph,
//! [`crate::spiffy`]). The prior mixes the two as a product of experts,
//!
//! `q'(s | y) ∝ q(s | y)^(1 − w) · (π(s | y) + ε)^w`,
//!
//! where `π(s | y)` is the graph's conditional frequency of extending `y`'s rank path by `s`'s
//! rank and `ε` = [`PRIOR_FLOOR`] keeps positions outside the graph's paths possible. `w = 0`
//! is the network alone. The graph travels inside the checkpoint
//! ([`OrderModelConfig::rank_paths`](crate::OrderModelConfig::rank_paths)) and `w` is stored
//! per temperature ([`OrderModelConfig::rank_prior_by_temperature`](crate::OrderModelConfig::rank_prior_by_temperature)),
//! chosen by the forwards SPOT needs on tuning prompts (`spot replay --prior-weights`,
//! `spot calibrate-order --prior T:w --rank-paths GRAPH`). Tree shape only: the output is the
//! draft-free output whatever the weights.

use serde::{Deserialize, Serialize};

use crate::analysis::nearest_temperature;
use crate::tilt::reweigh_row;
use spot_tree::TableError;

/// Added to the prior before mixing, so that a position no kept path reaches keeps a share.
pub const PRIOR_FLOOR: f32 = 0.01;

/// The rank-path prior's weight at one decoding temperature (see the
/// [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorWeight {
    /// The decoding temperature it is for (decoding uses the weight stored nearest its own).
    pub temperature: f32,
    /// `w` in `[0, 1]`: the prior's exponent (the network's is `1 − w`).
    pub weight: f32,
}

impl PriorWeight {
    /// Whether the values are usable (used when loading a checkpoint).
    pub fn check(&self) -> Result<(), TableError> {
        let temperature_ok = self.temperature.is_finite() && self.temperature >= 0.0;
        if !(temperature_ok && (0.0..=1.0).contains(&self.weight)) {
            return Err(TableError::field(
                "rank_prior_by_temperature",
                "temperature must be finite and non-negative, weight in [0, 1]",
            ));
        }
        Ok(())
    }
}

/// The prior weight for decoding at `temperature`: the one stored for the nearest temperature,
/// 0 (the network alone) when there is none.
pub fn nearest_weight(weights: &[PriorWeight], temperature: f32) -> f32 {
    nearest_temperature(weights, temperature, |w| Some(w.temperature)).map_or(0.0, |w| w.weight)
}

/// Mixes `prior` into `p` (`n` rows of `L` values; `valid` marks the masked positions) with
/// weight `w`, renormalising each row over its masked positions; positions not masked get 0.
pub(crate) fn mix_rows(p: &mut [f32], prior: &[f32], valid: &[f32], l: usize, w: f32) {
    if w == 0.0 || l == 0 {
        return;
    }
    for ((row, pr), v) in p.chunks_mut(l).zip(prior.chunks(l)).zip(valid.chunks(l)) {
        reweigh_row(row, |s, q| {
            Some(if v[s] > 0.0 {
                q.max(0.0).powf(1.0 - w) * (pr[s].max(0.0) + PRIOR_FLOOR).powf(w)
            } else {
                0.0
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixing_interpolates_between_the_network_and_the_prior() {
        let valid = [1.0, 0.0, 1.0];
        let net = [0.8, 0.0, 0.2];
        let prior = [0.1, 0.5, 0.9];
        let mut p = net;
        mix_rows(&mut p, &prior, &valid, 3, 0.0);
        assert_eq!(p, net);
        let mut p = net;
        mix_rows(&mut p, &prior, &valid, 3, 1.0);
        let (a, c) = (0.1 + PRIOR_FLOOR, 0.9 + PRIOR_FLOOR);
        assert!((p[0] - a / (a + c)).abs() < 1e-6, "{p:?}");
        assert!((p[2] - c / (a + c)).abs() < 1e-6, "{p:?}");
        assert_eq!(p[1], 0.0);
        let mut p = net;
        mix_rows(&mut p, &prior, &valid, 3, 0.5);
        let (a, c) = ((0.8f32 * a).sqrt(), (0.2f32 * c).sqrt());
        assert!((p[0] - a / (a + c)).abs() < 1e-6, "{p:?}");
        assert!((p[0] + p[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn the_nearest_temperature_picks_the_weight() {
        let w = |temperature, weight| PriorWeight {
            temperature,
            weight,
        };
        let ws = [w(0.0, 0.0), w(1.0, 0.3), w(2.0, 0.5)];
        assert_eq!(nearest_weight(&ws, 1.8), 0.5);
        assert_eq!(nearest_weight(&[], 1.0), 0.0);
        assert!(w(1.0, 1.5).check().is_err());
        assert!(w(1.0, f32::NAN).check().is_err());
        assert!(w(-1.0, 0.5).check().is_err());
        assert!(w(1.0, 1.0).check().is_ok());
    }
}
