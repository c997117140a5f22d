//! Trajectory statistics that explain acceptance: how often the stale token is still the
//! token the target commits ([`token_hits`]), and the calibration the learned scorer uses for
//! its token factor ([`TokenCalibration`]).

use serde::{Deserialize, Serialize};

use crate::trajectory::{Trajectory, examples};

/// Token hit rates of the stale statistics, by replay depth (Algorithm 1's examples).
///
/// For an example at depth `d` (root `x_t` plus `d` true commits, stale statistics of step
/// `t - 1`), the target commits token `v*` at position `s*`. `top1[d]` counts examples where
/// the stale choice at `s*` was `v*` (the tree's first token hypothesis), `runner_up[d]` those
/// where the hedge was (the runner-up of the decoder's choice rule: the noised runner-up under
/// `T > 0`, the most probable other token at `T = 0`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenHits {
    /// Examples per depth.
    pub count: Vec<usize>,
    /// Stale top-1 token = committed token.
    pub top1: Vec<usize>,
    /// Stale runner-up = committed token.
    pub runner_up: Vec<usize>,
    /// Sum over examples of the stale probability of the stale token at `s*` (calibration).
    pub top1_prob_sum: Vec<f64>,
}

impl TokenHits {
    /// Share of examples at `depth` whose committed token was the stale choice.
    pub fn top1_rate(&self, depth: usize) -> f64 {
        self.top1[depth] as f64 / self.count[depth].max(1) as f64
    }

    /// Share of examples at `depth` whose committed token was the stale runner-up.
    pub fn runner_up_rate(&self, depth: usize) -> f64 {
        self.runner_up[depth] as f64 / self.count[depth].max(1) as f64
    }

    /// Mean stale probability of the stale choice at the committed position (what the tree's
    /// mass uses as the chance that the token is right).
    pub fn mean_top1_prob(&self, depth: usize) -> f64 {
        self.top1_prob_sum[depth] / self.count[depth].max(1) as f64
    }
}

/// Counts [`TokenHits`] over `trajs` for depths `0..=max_depth`.
pub fn token_hits(trajs: &[Trajectory], max_depth: usize) -> TokenHits {
    let n = max_depth + 1;
    let mut h = TokenHits {
        count: vec![0; n],
        top1: vec![0; n],
        runner_up: vec![0; n],
        top1_prob_sum: vec![0.0; n],
    };
    for t in trajs {
        examples(t, max_depth, |ex| {
            let d = ex.depth;
            h.count[d] += 1;
            let Some(p) = ex.stale.stored(ex.target) else {
                return;
            };
            h.top1[d] += usize::from(p.token == ex.token);
            h.runner_up[d] += usize::from(p.hedge == ex.token && p.token != ex.token);
            h.top1_prob_sum[d] += f64::from(p.top_probs.first().copied().unwrap_or(0.0));
        });
    }
    h
}

/// Upper edges of the stale-confidence bins of a [`TokenCalibration`].
pub const CALIBRATION_EDGES: [f32; 10] = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0];

/// How often a stale token is still the target's choice, by replay depth and stale confidence,
/// measured on training trajectories.
///
/// The tree's mass multiplies the order probability by a token factor. The paper uses the stale
/// probability `p~_s(v)`, which is not the chance that `v` survives: on the shipped target the
/// stale choice is the committed token 76% of the time at depth 0 while its mean stale
/// probability is 0.16. With a calibration the learned scorer uses the measured hit rates
/// instead, so masses are honest acceptance estimates and the tree goes as deep as they allow.
/// This changes only which nodes are drafted, never the output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCalibration {
    /// Upper edges of the confidence bins, ascending, the last one 1.
    pub edges: Vec<f32>,
    /// `top1[d][b]`: share of examples at depth `d` (deeper ones use the last row) with stale
    /// confidence in bin `b` whose committed token was the stale choice (Laplace-smoothed;
    /// fitted tables are non-decreasing in confidence, adjacent bins pooled where needed).
    pub top1: Vec<Vec<f32>>,
    /// The same for the hedge (the runner-up of the decoder's choice rule; the noised
    /// runner-up under `T > 0`); fitted tables are non-increasing in confidence.
    pub runner_up: Vec<Vec<f32>>,
    /// The decoding temperature of the trajectories it was fitted on (`None`: any, mixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

impl TokenCalibration {
    /// Measures the hit rates on `trajs` for depths `0..=max_depth`.
    pub fn fit<'a>(trajs: impl IntoIterator<Item = &'a Trajectory>, max_depth: usize) -> Self {
        let (nd, nb) = (max_depth + 1, CALIBRATION_EDGES.len());
        let mut n = vec![vec![0u64; nb]; nd];
        let mut h1 = vec![vec![0u64; nb]; nd];
        let mut h2 = vec![vec![0u64; nb]; nd];
        for t in trajs {
            examples(t, max_depth, |ex| {
                let Some(p) = ex.stale.stored(ex.target) else {
                    return;
                };
                let b = bin(&CALIBRATION_EDGES, p.confidence);
                n[ex.depth][b] += 1;
                h1[ex.depth][b] += u64::from(p.token == ex.token);
                h2[ex.depth][b] += u64::from(p.hedge == ex.token && p.token != ex.token);
            });
        }
        // The stale choice survives more often the more confident it was, and the runner-up
        // less often: sparse bins that break that order are pooled with their neighbours.
        let rate = |h: &Vec<Vec<u64>>, increasing: bool| -> Vec<Vec<f32>> {
            h.iter()
                .zip(&n)
                .map(|(hd, nd)| monotone_rates(hd, nd, increasing))
                .collect()
        };
        Self {
            edges: CALIBRATION_EDGES.to_vec(),
            top1: rate(&h1, true),
            runner_up: rate(&h2, false),
            temperature: None,
        }
    }

    /// One calibration per distinct decoding temperature of `trajs` (each fitted on the
    /// trajectories decoded at that temperature, with its `temperature` set), by ascending
    /// temperature.
    pub fn fit_per_temperature(trajs: &[&Trajectory], max_depth: usize) -> Vec<Self> {
        let mut temps: Vec<f32> = trajs.iter().map(|t| t.temperature).collect();
        temps.sort_by(f32::total_cmp);
        temps.dedup();
        temps
            .into_iter()
            .map(|temp| {
                let group = trajs.iter().copied().filter(|t| t.temperature == temp);
                Self {
                    temperature: Some(temp),
                    ..Self::fit(group, max_depth)
                }
            })
            .collect()
    }

    /// Whether the tables are well formed (used when loading a checkpoint).
    pub fn check(&self) -> Result<(), String> {
        let nb = self.edges.len();
        let ascending = self
            .edges
            .windows(2)
            .all(|w| w[0].partial_cmp(&w[1]) == Some(std::cmp::Ordering::Less));
        if nb == 0 || !ascending || self.edges[nb - 1] != 1.0 {
            return Err("token_calibration.edges must ascend and end at 1".into());
        }
        if self
            .temperature
            .is_some_and(|t| !(t.is_finite() && t >= 0.0))
        {
            return Err("token_calibration.temperature must be finite and non-negative".into());
        }
        for (name, t) in [("top1", &self.top1), ("runner_up", &self.runner_up)] {
            if t.is_empty() || t.iter().any(|row| row.len() != nb) {
                return Err(format!(
                    "token_calibration.{name} must have rows of {nb} bins"
                ));
            }
            if t.iter().flatten().any(|v| !(0.0..=1.0).contains(v)) {
                return Err(format!(
                    "token_calibration.{name} holds values outside [0, 1]"
                ));
            }
        }
        if self.top1.len() != self.runner_up.len() {
            return Err("token_calibration.top1 and runner_up differ in depth".into());
        }
        Ok(())
    }

    fn lookup(&self, table: &[Vec<f32>], depth: usize, confidence: f32) -> f32 {
        let row = &table[depth.min(table.len() - 1)];
        row[bin(&self.edges, confidence).min(row.len() - 1)]
    }

    /// Chance that the stale choice is committed, at `depth` with stale `confidence`.
    pub fn top1(&self, depth: usize, confidence: f32) -> f32 {
        self.lookup(&self.top1, depth, confidence)
    }

    /// Chance that the hedge (the choice rule's runner-up) is committed instead.
    pub fn runner_up(&self, depth: usize, confidence: f32) -> f32 {
        self.lookup(&self.runner_up, depth, confidence)
    }
}

/// Laplace-smoothed hit rates `(hits + 1) / (count + 2)` per bin, with adjacent bins pooled
/// (their counts summed) until the rates are monotone in the bin order: non-decreasing when
/// `increasing`, else non-increasing (pool-adjacent-violators; an empty bin adds no counts to
/// the pool it joins).
/// The table of `tables` for decoding at `temperature`: the one fitted at the nearest
/// temperature, else (no table has one) the first.
pub fn nearest_calibration(
    tables: &[TokenCalibration],
    temperature: f32,
) -> Option<&TokenCalibration> {
    let dist = |c: &TokenCalibration| {
        c.temperature
            .map_or(f32::INFINITY, |t| (t - temperature).abs())
    };
    tables.iter().min_by(|a, b| dist(a).total_cmp(&dist(b)))
}

fn monotone_rates(hits: &[u64], counts: &[u64], increasing: bool) -> Vec<f32> {
    let rate = |h: u64, n: u64| (h as f64 + 1.0) / (n as f64 + 2.0);
    // Pools as (hits, count, bins).
    let mut pools: Vec<(u64, u64, usize)> = Vec::with_capacity(hits.len());
    for (&h, &n) in hits.iter().zip(counts) {
        let mut cur = (h, n, 1);
        while let Some(&prev) = pools.last() {
            let (a, b) = (rate(prev.0, prev.1), rate(cur.0, cur.1));
            if (increasing && a <= b) || (!increasing && a >= b) {
                break;
            }
            pools.pop();
            cur = (prev.0 + cur.0, prev.1 + cur.1, prev.2 + cur.2);
        }
        pools.push(cur);
    }
    pools
        .iter()
        .flat_map(|&(h, n, k)| std::iter::repeat_n(rate(h, n) as f32, k))
        .collect()
}

/// The first bin whose upper edge is at least `confidence` (the last bin above every edge).
fn bin(edges: &[f32], confidence: f32) -> usize {
    edges
        .iter()
        .position(|&e| confidence <= e)
        .unwrap_or(edges.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_bins_are_pooled_until_monotone() {
        // Bin 1 (3 examples, 0 hits) breaks the rise; bin 3 is empty.
        let (hits, counts) = ([50, 0, 90, 0, 99], [100, 3, 100, 0, 100]);
        let up = monotone_rates(&hits, &counts, true);
        assert!(up.windows(2).all(|w| w[0] <= w[1]), "{up:?}");
        // Bins 0 and 1 pooled: (50 + 0 + 1) / (103 + 2).
        assert_eq!(up[0], up[1]);
        assert!((up[0] - 51.0 / 105.0).abs() < 1e-6, "{up:?}");
        assert!((up[2] - 91.0 / 102.0).abs() < 1e-6, "{up:?}");
        // The empty bin joins its left neighbour without moving it (0.5 < 91/102).
        assert_eq!(up[3], up[2]);
        assert!((up[4] - 100.0 / 102.0).abs() < 1e-6, "{up:?}");
        // Already monotone input is only smoothed.
        let mono = monotone_rates(&[1, 5, 9], &[10, 10, 10], true);
        for (got, want) in mono.iter().zip([2.0 / 12.0, 6.0 / 12.0, 10.0 / 12.0]) {
            assert!((got - want).abs() < 1e-6, "{mono:?}");
        }
        let down = monotone_rates(&[9, 1, 5], &[10, 10, 10], false);
        assert!(down.windows(2).all(|w| w[0] >= w[1]), "{down:?}");
        assert_eq!(down[1], down[2]);
    }
}
