//! Trajectory statistics that explain acceptance: how often the stale token is still the
//! token the target commits ([`token_hits`]), and the calibration the learned scorer uses for
//! its token factor ([`TokenCalibration`]).

use serde::{Deserialize, Serialize};

use crate::features::MARGIN_CAP;
use crate::trajectory::{Example, Trajectory, examples};
use spot_tree::TableError;
pub use spot_tree::table::bin;

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

/// Upper edges of the stale-confidence bins of a [`TokenCalibration`] keyed by
/// [`CalibrationKey::Confidence`].
pub const CALIBRATION_EDGES: [f32; 10] = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0];

/// Upper edges of the noised-margin bins of a [`TokenCalibration`] keyed by
/// [`CalibrationKey::Margin`] (nats; the last one is [`MARGIN_CAP`]).
pub const MARGIN_EDGES: [f32; 10] = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 10.0, MARGIN_CAP];

/// What a [`TokenCalibration`] bins its examples by.
///
/// Under `T > 0` the tempered confidence says little about whether the target's noised choice
/// survives (at `T = 2` nearly every position's confidence is below 0.05); the noised margin
/// ([`noised_margin`](crate::features::noised_margin): how far the logits must move before the choice flips) does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationKey {
    /// The stale confidence of the choice ([`CALIBRATION_EDGES`]); checkpoints written before
    /// keys existed use it.
    #[default]
    Confidence,
    /// The noised margin of the choice over the hedge ([`MARGIN_EDGES`]).
    Margin,
}

/// Which replay examples a [`TokenCalibration`] counts.
///
/// A tree node at depth `d` is reached only along a path of drafted tokens: each earlier commit
/// put the stale choice or the hedge of its position. Among such paths the stale choice keeps
/// winning far more often than over all replay paths (shipped target, 200 training
/// trajectories at `T = 1`, depth 7, margin 1.5-2 nats: 0.71 against 0.56), because a path whose
/// tokens the stale statistics named is one where the block's context moved little. Rates over
/// all paths fall with depth and understate deep nodes; rates over drafted paths are the
/// probabilities the tree's masses need.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationPaths {
    /// Every replay example (tables written before this choice existed).
    #[default]
    All,
    /// Only examples whose earlier commits were each the stale choice or the hedge of their
    /// position ([`Example::drafted`](crate::trajectory::Example::drafted)).
    Drafted,
}

impl CalibrationPaths {
    /// Whether the table counts `ex`.
    pub fn counts(self, ex: &Example<'_>) -> bool {
        match self {
            CalibrationPaths::All => true,
            CalibrationPaths::Drafted => ex.drafted,
        }
    }
}

impl CalibrationKey {
    /// The bins' upper edges.
    pub fn edges(self) -> &'static [f32] {
        match self {
            CalibrationKey::Confidence => &CALIBRATION_EDGES,
            CalibrationKey::Margin => &MARGIN_EDGES,
        }
    }

    /// The value binned for a position with stale `confidence` and noised `margin`.
    pub fn value(self, confidence: f32, margin: f32) -> f32 {
        match self {
            CalibrationKey::Confidence => confidence,
            CalibrationKey::Margin => margin,
        }
    }
}

/// How often a stale token is still the target's choice, by replay depth and by a key of the
/// stale statistics (the confidence or the noised margin, [`CalibrationKey`]), measured on
/// training trajectories.
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
    /// What the bins are of (absent in older checkpoints: the confidence).
    #[serde(default)]
    pub key: CalibrationKey,
    /// Upper edges of the key's bins, ascending (values above the last edge fall in the last
    /// bin); for the confidence the last one is 1.
    pub edges: Vec<f32>,
    /// `top1[d][b]`: share of examples at depth `d` (deeper ones use the last row) with the key
    /// in bin `b` whose committed token was the stale choice (Laplace-smoothed; fitted tables
    /// are non-decreasing in the key, adjacent bins pooled where needed).
    pub top1: Vec<Vec<f32>>,
    /// The same for the hedge (the runner-up of the decoder's choice rule; the noised
    /// runner-up under `T > 0`); fitted tables are non-increasing in the key.
    pub runner_up: Vec<Vec<f32>>,
    /// Which replay examples the rates are over (absent in older checkpoints: all).
    #[serde(default)]
    pub paths: CalibrationPaths,
    /// The decoding temperature of the trajectories it was fitted on (`None`: any, mixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

impl TokenCalibration {
    /// Measures the hit rates on the examples of `trajs` that `paths` counts, for depths
    /// `0..=max_depth`, binned by `key`.
    pub fn fit<'a>(
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
                if !paths.counts(&ex) {
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

    /// Fits a table per [`CalibrationKey`] on `trajs` and keeps the one that predicts them
    /// best ([`TokenCalibration::log_loss`]; the confidence on a tie).
    pub fn fit_best(trajs: &[&Trajectory], max_depth: usize, paths: CalibrationPaths) -> Self {
        Self::fit_scored(trajs, max_depth, paths).0
    }

    /// [`TokenCalibration::fit_best`] with the log-loss on `trajs` of each key's table
    /// (confidence, margin).
    pub fn fit_scored(
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

    /// Mean log-loss (nats) of the table's two predictions on the examples of `trajs` up to
    /// `max_depth` that its [`CalibrationPaths`] counts: the binary cross-entropy of "the stale
    /// choice is committed" plus that of "the hedge is committed" (NaN without examples).
    pub fn log_loss(&self, trajs: &[&Trajectory], max_depth: usize) -> f64 {
        let (mut sum, mut count) = (0.0f64, 0usize);
        let bce = |p: f32, hit: bool| {
            let p = f64::from(p).clamp(1e-6, 1.0 - 1e-6);
            -(if hit { p } else { 1.0 - p }).ln()
        };
        for t in trajs {
            examples(t, max_depth, |ex| {
                if !self.paths.counts(&ex) {
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

    /// One calibration per distinct decoding temperature of `trajs` (each fitted on the
    /// trajectories decoded at that temperature with the key that predicts them best,
    /// [`TokenCalibration::fit_best`], and its `temperature` set), by ascending temperature.
    pub fn fit_per_temperature(
        trajs: &[&Trajectory],
        max_depth: usize,
        paths: CalibrationPaths,
    ) -> Vec<Self> {
        Self::fit_per_temperature_scored(trajs, max_depth, paths)
            .into_iter()
            .map(|(table, _, _)| table)
            .collect()
    }

    /// [`TokenCalibration::fit_per_temperature`] with each table's trajectory count and the
    /// log-loss of each key on its trajectories ([`TokenCalibration::fit_scored`]).
    pub fn fit_per_temperature_scored(
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

    /// Whether the tables are well formed (used when loading a checkpoint).
    pub fn check(&self) -> Result<(), TableError> {
        let field = |name: &str, reason: &str| {
            TableError::field(format!("token_calibration.{name}"), reason)
        };
        let nb = self.edges.len();
        let ascending = self
            .edges
            .windows(2)
            .all(|w| w[0].partial_cmp(&w[1]) == Some(std::cmp::Ordering::Less));
        if nb == 0 || !ascending || self.edges.iter().any(|e| !e.is_finite()) {
            return Err(field("edges", "must be finite and ascend"));
        }
        if self.key == CalibrationKey::Confidence && self.edges[nb - 1] != 1.0 {
            return Err(field("edges", "of the confidence must end at 1"));
        }
        if self
            .temperature
            .is_some_and(|t| !(t.is_finite() && t >= 0.0))
        {
            return Err(field("temperature", "must be finite and non-negative"));
        }
        for (name, t) in [("top1", &self.top1), ("runner_up", &self.runner_up)] {
            if t.is_empty() || t.iter().any(|row| row.len() != nb) {
                return Err(field(name, &format!("must have rows of {nb} bins")));
            }
            if t.iter().flatten().any(|v| !(0.0..=1.0).contains(v)) {
                return Err(field(name, "holds values outside [0, 1]"));
            }
        }
        if self.top1.len() != self.runner_up.len() {
            return Err(field("runner_up", "differs from top1 in depth"));
        }
        Ok(())
    }

    fn lookup(&self, table: &[Vec<f32>], depth: usize, x: f32) -> f32 {
        let row = &table[depth.min(table.len() - 1)];
        row[bin(&self.edges, x).min(row.len() - 1)]
    }

    /// Chance that the stale choice is committed, at `depth` with the key's value `x` (the
    /// stale confidence or the noised margin, [`CalibrationKey::value`]).
    pub fn top1(&self, depth: usize, x: f32) -> f32 {
        self.lookup(&self.top1, depth, x)
    }

    /// Chance that the hedge (the choice rule's runner-up) is committed instead.
    pub fn runner_up(&self, depth: usize, x: f32) -> f32 {
        self.lookup(&self.runner_up, depth, x)
    }
}

/// The table of `tables` for decoding at `temperature`: the one fitted at the nearest
/// temperature, else (no table has one) the first.
pub fn nearest_calibration(
    tables: &[TokenCalibration],
    temperature: f32,
) -> Option<&TokenCalibration> {
    nearest_temperature(tables, temperature, |c| c.temperature)
}

/// The item of `items` whose temperature (`at`; `None`: any, ranked last) is nearest
/// `temperature`, the first on a tie; `None` when `items` is empty.
pub(crate) fn nearest_temperature<T>(
    items: &[T],
    temperature: f32,
    at: impl Fn(&T) -> Option<f32>,
) -> Option<&T> {
    let dist = |x: &T| at(x).map_or(f32::INFINITY, |t| (t - temperature).abs());
    items.iter().min_by(|a, b| dist(a).total_cmp(&dist(b)))
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
