//! Fitting the order drafter's tables on draft-free trajectories: the token calibration
//! ([`FitCalibration`], which brings `TokenCalibration::fit` and its kin into scope), the
//! Spiffy graph ([`CalibrateSpiffy`]), the token hit rates that explain acceptance
//! ([`token_hits`]) and the monotone rates every fitted table uses ([`monotone_rates`]).

use std::collections::HashMap;

use spot_drafter::analysis::{CalibrationKey, CalibrationPaths, TokenCalibration};
use spot_drafter::spiffy::{RankPath, SpiffyGraph, ranks};
use spot_tree::TreeError;
use spot_tree::stale::StaleSource;
use spot_tree::table::bin;

use crate::trajectory::{Example, Trajectory, examples};

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

/// Whether a table of `paths` counts `ex`.
fn counts(paths: CalibrationPaths, ex: &Example<'_>) -> bool {
    match paths {
        CalibrationPaths::All => true,
        CalibrationPaths::Drafted => ex.drafted,
    }
}

/// Fitting a [`TokenCalibration`] on trajectories; `use spot_train::fit::FitCalibration`
/// makes these `TokenCalibration::fit`, `TokenCalibration::fit_best`, and so on.
pub trait FitCalibration: Sized {
    /// Measures the hit rates on the examples of `trajs` that `paths` counts, for depths
    /// `0..=max_depth`, binned by `key`.
    fn fit<'a>(
        trajs: impl IntoIterator<Item = &'a Trajectory>,
        max_depth: usize,
        key: CalibrationKey,
        paths: CalibrationPaths,
    ) -> Self;

    /// Fits a table per [`CalibrationKey`] on `trajs` and keeps the one that predicts them
    /// best ([`FitCalibration::log_loss`]; the confidence on a tie).
    fn fit_best(trajs: &[&Trajectory], max_depth: usize, paths: CalibrationPaths) -> Self;

    /// [`FitCalibration::fit_best`] with the log-loss on `trajs` of each key's table
    /// (confidence, margin).
    fn fit_scored(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> (Self, [f64; 2]);

    /// Mean log-loss (nats) of the table's two predictions on the examples of `trajs` up to
    /// `max_depth` that its [`CalibrationPaths`] counts: the binary cross-entropy of "the stale
    /// choice is committed" plus that of "the hedge is committed" (NaN without examples).
    fn log_loss(&self, trajs: &[&Trajectory], max_depth: usize) -> f64;

    /// One calibration per distinct decoding temperature of `trajs` (each fitted on the
    /// trajectories decoded at that temperature with the key that predicts them best,
    /// [`FitCalibration::fit_best`], and its `temperature` set), by ascending temperature.
    fn fit_per_temperature(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> Vec<Self>;

    /// [`FitCalibration::fit_per_temperature`] with each table's trajectory count and the
    /// log-loss of each key on its trajectories ([`FitCalibration::fit_scored`]).
    fn fit_per_temperature_scored(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> Vec<(Self, usize, [f64; 2])>;
}

impl FitCalibration for TokenCalibration {
    fn fit<'a>(
        trajs: impl IntoIterator<Item = &'a Trajectory>,
        max_depth: usize,
        key: CalibrationKey,
        paths: CalibrationPaths,
    ) -> Self {
        let edges = key.edges();
        let (nd, nb) = (max_depth + 1, edges.len());
        let mut n = vec![vec![0u64; nb]; nd];
        let mut h1 = vec![vec![0u64; nb]; nd];
        let mut h2 = vec![vec![0u64; nb]; nd];
        for t in trajs {
            examples(t, max_depth, |ex| {
                if !counts(paths, &ex) {
                    return;
                }
                let Some(p) = ex.stale.stored(ex.target) else {
                    return;
                };
                let b = bin(edges, key.value(p.confidence, p.margin));
                n[ex.depth][b] += 1;
                h1[ex.depth][b] += u64::from(p.token == ex.token);
                h2[ex.depth][b] += u64::from(p.hedge == ex.token && p.token != ex.token);
            });
        }
        // The stale choice survives more often the larger its key, and the runner-up less
        // often: sparse bins that break that order are pooled with their neighbours.
        let rate = |h: &Vec<Vec<u64>>, increasing: bool| -> Vec<Vec<f32>> {
            h.iter()
                .zip(&n)
                .map(|(hd, nd)| monotone_rates(hd, nd, increasing))
                .collect()
        };
        Self {
            key,
            edges: edges.to_vec(),
            top1: rate(&h1, true),
            runner_up: rate(&h2, false),
            paths,
            temperature: None,
        }
    }

    fn fit_best(trajs: &[&Trajectory], max_depth: usize, paths: CalibrationPaths) -> Self {
        Self::fit_scored(trajs, max_depth, paths).0
    }

    fn fit_scored(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> (Self, [f64; 2]) {
        let fit = |key| {
            let table = Self::fit(trajs.iter().copied(), max_depth, key, paths);
            let loss = table.log_loss(trajs, max_depth);
            (table, loss)
        };
        let (conf, lc) = fit(CalibrationKey::Confidence);
        let (margin, lm) = fit(CalibrationKey::Margin);
        (if lm < lc { margin } else { conf }, [lc, lm])
    }

    fn log_loss(&self, trajs: &[&Trajectory], max_depth: usize) -> f64 {
        let (mut sum, mut count) = (0.0f64, 0usize);
        let bce = |p: f32, hit: bool| {
            let p = f64::from(p).clamp(1e-6, 1.0 - 1e-6);
            -(if hit { p } else { 1.0 - p }).ln()
        };
        for t in trajs {
            examples(t, max_depth, |ex| {
                if !counts(self.paths, &ex) {
                    return;
                }
                let Some(p) = ex.stale.stored(ex.target) else {
                    return;
                };
                let x = self.key.value(p.confidence, p.margin);
                sum += bce(self.top1(ex.depth, x), p.token == ex.token);
                sum += bce(
                    self.runner_up(ex.depth, x),
                    p.hedge == ex.token && p.token != ex.token,
                );
                count += 1;
            });
        }
        sum / count as f64
    }

    fn fit_per_temperature(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> Vec<Self> {
        Self::fit_per_temperature_scored(trajs, max_depth, paths)
            .into_iter()
            .map(|(table, _, _)| table)
            .collect()
    }

    fn fit_per_temperature_scored(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> Vec<(Self, usize, [f64; 2])> {
        let mut temps: Vec<f32> = trajs.iter().map(|t| t.temperature).collect();
        temps.sort_by(f32::total_cmp);
        temps.dedup();
        temps
            .into_iter()
            .map(|temp| {
                let group: Vec<&Trajectory> = trajs
                    .iter()
                    .copied()
                    .filter(|t| t.temperature == temp)
                    .collect();
                let (best, losses) = Self::fit_scored(&group, max_depth, paths);
                let table = Self {
                    temperature: Some(temp),
                    ..best
                };
                (table, group.len(), losses)
            })
            .collect()
    }
}

/// Calibrating a [`SpiffyGraph`] on trajectories; `use spot_train::fit::CalibrateSpiffy`
/// makes it `SpiffyGraph::calibrate`.
pub trait CalibrateSpiffy: Sized {
    /// Calibrates a graph from trajectories: paths up to `max_depth` commits, the
    /// `max_paths` most frequent kept (ties: shorter, then lexicographically smaller first, so
    /// the kept set is closed under prefixes).
    fn calibrate(
        trajs: &[Trajectory],
        max_depth: usize,
        max_paths: usize,
    ) -> Result<Self, TreeError>;
}

impl CalibrateSpiffy for SpiffyGraph {
    fn calibrate(
        trajs: &[Trajectory],
        max_depth: usize,
        max_paths: usize,
    ) -> Result<Self, TreeError> {
        let Some(first) = trajs.first() else {
            return Err(TreeError::Scorer {
                scorer: "spiffy".into(),
                reason: "no trajectories to calibrate on".into(),
            });
        };
        let (block_size, mask) = (first.block_size, first.mask_id);
        let mut counts: HashMap<Vec<u16>, u64> = HashMap::new();
        let mut sequences = 0u64;
        let mut seq: Vec<u16> = Vec::new();
        let mut rank = Vec::new();
        for t in trajs {
            if t.block_size != block_size {
                return Err(TreeError::Scorer {
                    scorer: "spiffy".into(),
                    reason: format!(
                        "trajectory {} has block size {}, the first has {block_size}",
                        t.id, t.block_size
                    ),
                });
            }
            examples(t, max_depth.saturating_sub(1), |ex| {
                if ex.depth == 0 {
                    seq.clear();
                    sequences += 1;
                } else if ex.depth != seq.len() {
                    return;
                }
                let conf = |s: usize| ex.stale.position(s).map_or(0.0, |p| p.confidence);
                ranks(ex.state, mask, conf, &mut rank);
                seq.push(rank[ex.target]);
                *counts.entry(seq.clone()).or_default() += 1;
            });
        }
        let mut paths: Vec<RankPath> = counts
            .into_iter()
            .map(|(ranks, count)| RankPath { ranks, count })
            .collect();
        paths.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.ranks.len().cmp(&b.ranks.len()))
                .then(a.ranks.cmp(&b.ranks))
        });
        paths.truncate(max_paths);
        Ok(SpiffyGraph {
            format: spot_drafter::spiffy::SPIFFY_FORMAT.into(),
            version: spot_drafter::spiffy::SPIFFY_VERSION,
            block_size,
            max_depth,
            sequences,
            paths,
        })
    }
}

/// Laplace-smoothed hit rates `(hits + 1) / (count + 2)` per bin, with adjacent bins pooled
/// (their counts summed) until the rates are monotone in the bin order: non-decreasing when
/// `increasing`, else non-increasing (pool-adjacent-violators; an empty bin adds no counts to
/// the pool it joins).
pub fn monotone_rates(hits: &[u64], counts: &[u64], increasing: bool) -> Vec<f32> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
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
