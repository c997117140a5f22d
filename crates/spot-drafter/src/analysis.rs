//! The calibration the learned scorer uses for its token factor ([`TokenCalibration`]): how
//! often a stale token is still the target's choice, by depth and stale confidence or noised
//! margin. Tables are fitted on trajectories by `spot_train::fit`.

use serde::{Deserialize, Serialize};

use crate::features::MARGIN_CAP;
use spot_tree::TableError;
pub use spot_tree::table::bin;

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
    /// position (`spot_train::trajectory::Example::drafted`).
    Drafted,
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
