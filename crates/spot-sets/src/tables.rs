//! The calibrated set drafter of SPOT-Sets: join and token tables fitted on the target's own
//! threshold-decoding trajectories.
//!
//! For a hypothesised state `j` threshold steps below the round's root, the target's next step
//! is led by the position it is most confident about: alone when that confidence is not above
//! `τ`, else with every other position above `τ`. The drafter only knows the stale statistics
//! (those of the root's parent), so it predicts, by stale confidence bin and `j`, the
//! probability that a leader clears `τ`, that another position joins, and that the written
//! token is the stale choice or the hedge, all measured on trajectories decoded with the same
//! `τ` (`spot_train::sets_fit::fit_join_table`); the tables are monotone in the confidence (sparse bins pooled).
//! Which position leads is the order drafter's job. A file holds one table per
//! (temperature, `τ`) and the drafter reads the nearest ([`SetsDrafter`]).
//!
//! ```
//! use spot_sets::{JoinTable, SetsDrafter};
//! let table = JoinTable::prior(0.9, 4);
//! assert_eq!(table.join.len(), 4);
//! // With no data every rate is the Laplace prior 1/2.
//! assert_eq!(table.join[0][0], 0.5);
//! let drafter = SetsDrafter { tables: vec![table] };
//! let json = drafter.to_json().unwrap();
//! assert_eq!(SetsDrafter::from_json(&json).unwrap(), drafter);
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use spot_core::TokenId;
use spot_tree::{ScoreContext, TreeError};

use spot_tree::TableError;
use spot_tree::table::bin;

use crate::builder::{JoinModel, JoinPrediction};
use crate::file::{SetsError, check_header, load_json, save_json};

/// File name of a model folder's default set drafter (`spot calibrate-sets`).
pub const DEFAULT_SETS: &str = "spot-sets.json";

/// Confidence bin edges before `τ` and its neighbours are added.
const BASE_EDGES: [f32; 16] = [
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0,
];

/// Join and token rates of one (temperature, `τ`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinTable {
    /// The threshold of the trajectories.
    pub tau: f32,
    /// Their temperature (`None`: mixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Upper edges of the stale-confidence bins, ascending, the last one 1.
    pub edges: Vec<f32>,
    /// `lead[j][b]`: at states `j` steps below the root (deeper ones use the last row), the
    /// share of step leaders (the position the target is most confident about) with stale
    /// confidence in bin `b` that cleared `τ`.
    pub lead: Vec<Vec<f32>>,
    /// `join[j][b]`: the share of the other masked positions, by bin, that joined the step.
    pub join: Vec<Vec<f32>>,
    /// `token[j][b]`: share of committed positions (leaders and followers) whose written
    /// token was the stale choice.
    pub token: Vec<Vec<f32>>,
    /// `hedge[j][b]`: share of committed positions whose written token was the hedge (the
    /// runner-up of the target's choice rule) instead (fitted tables are non-increasing in the
    /// confidence).
    pub hedge: Vec<Vec<f32>>,
    /// Positions counted.
    pub samples: u64,
}

impl JoinTable {
    /// The table a fit on no data gives: the bins for `tau` ([`JoinTable::edges_for`]) and
    /// every rate the Laplace prior 1/2, `steps` rows (at least 1).
    pub fn prior(tau: f32, steps: usize) -> Self {
        let edges = Self::edges_for(tau);
        let rows = vec![vec![0.5; edges.len()]; steps.max(1)];
        Self {
            tau,
            temperature: None,
            edges,
            lead: rows.clone(),
            join: rows.clone(),
            token: rows.clone(),
            hedge: rows,
            samples: 0,
        }
    }

    /// The bin edges for threshold `tau`: the base edges (0.01 to 1) plus `tau` and
    /// `tau ± 0.02`.
    pub fn edges_for(tau: f32) -> Vec<f32> {
        let mut e: Vec<f32> = BASE_EDGES.to_vec();
        for x in [tau - 0.02, tau, tau + 0.02] {
            if x > 0.0 && x < 1.0 {
                e.push(x);
            }
        }
        e.sort_by(f32::total_cmp);
        e.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
        e
    }

    /// Checks shapes and ranges.
    pub fn check(&self) -> Result<(), TableError> {
        if !(self.tau.is_finite()) {
            return Err(TableError::field(
                "tau",
                format!("must be finite, got {}", self.tau),
            ));
        }
        let nb = self.edges.len();
        if nb == 0 || !self.edges.windows(2).all(|w| w[0] < w[1]) {
            return Err(TableError::field(
                "edges",
                "must be non-empty and strictly ascending",
            ));
        }
        let rows = self.join.len();
        if rows == 0
            || self.token.len() != rows
            || self.hedge.len() != rows
            || self.lead.len() != rows
        {
            return Err(TableError::field(
                "join",
                format!(
                    "lead, join, token and hedge have {}, {rows}, {} and {} rows; they need the \
                     same number, at least 1",
                    self.lead.len(),
                    self.token.len(),
                    self.hedge.len()
                ),
            ));
        }
        for (name, rows) in [
            ("lead", &self.lead),
            ("join", &self.join),
            ("token", &self.token),
            ("hedge", &self.hedge),
        ] {
            for row in rows.iter() {
                if row.len() != nb {
                    return Err(TableError::field(
                        name,
                        format!("a row has {} bins, edges {nb}", row.len()),
                    ));
                }
                if let Some(v) = row.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                    return Err(TableError::field(
                        name,
                        format!("holds {v}, outside [0, 1]"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The file format tag.
const FORMAT: &str = "spot-sets";
/// The file format version.
pub const SETS_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetsFile {
    format: String,
    version: u32,
    tables: Vec<JoinTable>,
}

/// The calibrated set drafter: a [`JoinModel`] reading the [`JoinTable`] nearest to the
/// decode's `τ` (then temperature).
#[derive(Clone, Debug, PartialEq)]
pub struct SetsDrafter {
    /// One table per (temperature, `τ`) fitted.
    pub tables: Vec<JoinTable>,
}

impl SetsDrafter {
    /// The JSON text of the file.
    pub fn to_json(&self) -> Result<String, TableError> {
        let file = SetsFile {
            format: FORMAT.into(),
            version: SETS_VERSION,
            tables: self.tables.clone(),
        };
        Ok(serde_json::to_string_pretty(&file)?)
    }

    /// Parses and checks a file's JSON text.
    pub fn from_json(text: &str) -> Result<Self, TableError> {
        let file: SetsFile = serde_json::from_str(text)?;
        check_header((&file.format, file.version), (FORMAT, SETS_VERSION))?;
        if file.tables.is_empty() {
            return Err(TableError::field("tables", "holds no table"));
        }
        for (index, t) in file.tables.iter().enumerate() {
            t.check().map_err(|e| TableError::Table {
                index,
                source: Box::new(e),
            })?;
        }
        Ok(Self {
            tables: file.tables,
        })
    }

    /// Reads `path`; errors name the file.
    pub fn load(path: &Path) -> Result<Self, SetsError> {
        load_json(path, Self::from_json)
    }

    /// Writes `path`.
    pub fn save(&self, path: &Path) -> Result<(), SetsError> {
        save_json(path, self.to_json())
    }

    /// The table for a decode at `temperature` with threshold `tau`: the nearest `τ`, then
    /// the nearest temperature (a mixed table counts as far).
    pub fn table(&self, temperature: f32, tau: f32) -> Option<&JoinTable> {
        let key = |t: &JoinTable| {
            let dt = t
                .temperature
                .map_or(f32::INFINITY, |x| (x - temperature).abs());
            ((t.tau - tau).abs(), dt)
        };
        self.tables.iter().min_by(|a, b| {
            let (x, y) = (key(a), key(b));
            x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1))
        })
    }
}

impl JoinModel for SetsDrafter {
    fn name(&self) -> &str {
        "spot-sets"
    }

    fn predict(
        &mut self,
        ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError> {
        let bad = |reason: String| TreeError::Scorer {
            scorer: "spot-sets".into(),
            reason,
        };
        let t = self
            .table(ctx.temperature, tau)
            .ok_or_else(|| bad("holds no table".into()))?;
        // Tables read from a file were checked; one built in code may not have been.
        t.check().map_err(|e| bad(e.to_string()))?;
        let row = steps.min(t.join.len() - 1);
        let mask = ctx.root.mask_id();
        for (s, &tok) in state.iter().enumerate() {
            if tok != mask {
                continue;
            }
            let k = bin(&t.edges, ctx.stale.confidence(s));
            out.lead[s] = t.lead[row][k];
            out.join[s] = t.join[row][k];
            out.token[s] = t.token[row][k];
            out.hedge[s] = t.hedge[row][k];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bad_files_are_refused_naming_the_problem() {
        let good = SetsDrafter {
            tables: vec![JoinTable::prior(0.9, 2)],
        };
        let json = good.to_json().unwrap();
        let e = SetsDrafter::from_json(&json.replace("\"version\": 1", "\"version\": 7"));
        assert_eq!(
            e.unwrap_err(),
            TableError::Version {
                found: 7,
                supported: SETS_VERSION
            }
        );
        let e = SetsDrafter::from_json(&json.replace("\"tau\"", "\"tua\""));
        assert!(e.is_err());
        let mut bad = good.clone();
        bad.tables[0].join[0][0] = 1.5;
        let e = SetsDrafter::from_json(&bad.to_json().unwrap()).unwrap_err();
        assert!(
            matches!(&e, TableError::Table { index: 0, source }
                if matches!(&**source, TableError::Field { field, .. } if field == "join")),
            "{e}"
        );
        assert!(e.to_string().contains("outside [0, 1]"), "{e}");
        let e = SetsDrafter::load(Path::new("/nonexistent/spot-sets.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/spot-sets.json"));
        // The nearest τ wins, then the nearest temperature.
        let mut t1 = JoinTable::prior(0.1, 1);
        t1.temperature = Some(1.0);
        let two = SetsDrafter {
            tables: vec![good.tables[0].clone(), t1],
        };
        assert_eq!(two.table(0.0, 0.2).map(|t| t.tau), Some(0.1));
        assert_eq!(two.table(1.0, 0.8).map(|t| t.tau), Some(0.9));
    }
}
