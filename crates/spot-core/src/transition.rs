//! The target's transitions: exact `Φ` (one commit per forward) and threshold `Φ^τ`.

use crate::error::{Error, Result};
use crate::state::{BlockState, Commit};
use crate::stats::BlockStats;

/// Which commit rule the decoder applies to a forward's statistics.
///
/// Both are deterministic functions of the state once the noise table is fixed, which is what
/// makes state-equality verification exact.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Transition {
    /// `Φ`: commit the single masked position with the highest confidence (ties to the lowest
    /// index) with its chosen token.
    #[default]
    Exact,
    /// `Φ^τ` (Fast-dLLM dynamic threshold): commit every masked position whose confidence is
    /// strictly greater than `tau`; when none is, commit the one `Φ` would.
    Threshold {
        /// The threshold, in `[0, 1]` for probability rules.
        tau: f32,
    },
}

impl Transition {
    /// Checks `tau`.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Transition::Exact => Ok(()),
            Transition::Threshold { tau } if tau.is_finite() => Ok(()),
            Transition::Threshold { tau } => Err(Error::config(
                "threshold",
                format!("must be finite, got {tau}"),
            )),
        }
    }

    /// Appends to `out` the commits this transition makes from `state` given the statistics of
    /// a forward at `state`. Appends nothing when the state is complete.
    ///
    /// ```
    /// use spot_core::{BlockState, Transition};
    /// use spot_core::stats::{BlockStats, PositionStats};
    /// let mut stats = BlockStats::new(1);
    /// for (tok, c) in [(5, 0.2f32), (6, 0.95), (7, 0.97)] {
    ///     stats.push(PositionStats { token: tok, confidence: c, token_prob: c, entropy: 0.1,
    ///         tail_mass: 0.0, top_ids: &[tok], top_probs: &[c] }).unwrap();
    /// }
    /// let state = BlockState::masked(3, 0);
    /// let mut out = Vec::new();
    /// Transition::Exact.commits(&state, &stats, &mut out).unwrap();
    /// assert_eq!(out.len(), 1);
    /// assert_eq!((out[0].position, out[0].token), (2, 7));
    /// out.clear();
    /// Transition::Threshold { tau: 0.9 }.commits(&state, &stats, &mut out).unwrap();
    /// assert_eq!(out.len(), 2);
    /// ```
    pub fn commits(
        &self,
        state: &BlockState,
        stats: &BlockStats,
        out: &mut Vec<Commit>,
    ) -> Result<()> {
        if stats.len() != state.len() {
            return Err(Error::ShapeMismatch {
                what: "statistics positions per state",
                expected: state.len(),
                actual: stats.len(),
            });
        }
        let start = out.len();
        if let Transition::Threshold { tau } = *self {
            for s in state.masked_positions() {
                let c = finite_confidence(stats, s)?;
                if c > tau {
                    out.push(Commit::new(s, stats.token(s)));
                }
            }
        }
        if out.len() == start
            && let Some(c) = exact_commit(state, stats)?
        {
            out.push(c);
        }
        Ok(())
    }
}

fn finite_confidence(stats: &BlockStats, s: usize) -> Result<f32> {
    let c = stats.confidence(s);
    if c.is_finite() {
        Ok(c)
    } else {
        Err(Error::InvalidStatistics {
            field: "confidence",
            position: s,
            value: c.to_string(),
        })
    }
}

/// `Φ`: the masked position with the highest confidence (ties to the lowest index) and its
/// chosen token; `None` when the state is complete.
pub fn exact_commit(state: &BlockState, stats: &BlockStats) -> Result<Option<Commit>> {
    let mut best: Option<(usize, f32)> = None;
    for s in state.masked_positions() {
        let c = finite_confidence(stats, s)?;
        if best.is_none_or(|(_, b)| c > b) {
            best = Some((s, c));
        }
    }
    Ok(best.map(|(s, _)| Commit::new(s, stats.token(s))))
}
