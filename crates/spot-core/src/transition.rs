//! The target's transitions: exact `Φ` (one commit per forward) and threshold `Φ^τ`.

use crate::error::{Error, Result};
use crate::state::{BlockState, Commit, TokenId};
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
    /// A block in `steps` steps, as SDAR's and LLaDA's own samplers schedule it: step `i`
    /// (counted from the block's first forward) commits `n_i` positions, the block size `L`
    /// spread evenly over the steps (`L / steps`, the first `L mod steps` steps one more; at
    /// least 1, at most the masked count). Without `tau` the `n_i` most confident
    /// (SDAR's `low_confidence_static`, LLaDA's `low_confidence`); with `tau`, every position
    /// above it when at least `n_i` are, else the `n_i` most confident (SDAR's
    /// `low_confidence_dynamic`). Ties go to the lower index. `Threshold { tau }` is
    /// `Scheduled { steps: L, tau: Some(tau) }`.
    Scheduled {
        /// Steps per block, at least 1.
        steps: u32,
        /// The threshold of the dynamic rule (`None`: the static rule).
        tau: Option<f32>,
    },
}

impl Transition {
    /// Checks `tau` and `steps`.
    pub fn validate(&self) -> Result<()> {
        let tau = match *self {
            Transition::Exact => None,
            Transition::Threshold { tau } => Some(tau),
            Transition::Scheduled { steps: 0, .. } => {
                return Err(Error::config("steps", "must be at least 1, got 0"));
            }
            Transition::Scheduled { tau, .. } => tau,
        };
        match tau {
            Some(t) if !t.is_finite() => Err(Error::config(
                "threshold",
                format!("must be finite, got {t}"),
            )),
            _ => Ok(()),
        }
    }

    /// Positions step `step` of a block of `len` positions commits at least (1 for `Φ` and
    /// `Φ^τ`).
    pub fn scheduled_count(&self, step: usize, len: usize) -> usize {
        match *self {
            Transition::Scheduled { steps, .. } => {
                let steps = steps.max(1) as usize;
                let extra = usize::from(step < len % steps);
                (len / steps + extra).max(1)
            }
            _ => 1,
        }
    }

    /// Appends to `out` the commits this transition makes from `state` given the statistics of
    /// a forward at `state`, at step `step` of the block (the number of steps applied to it
    /// before; only [`Transition::Scheduled`] reads it). Appends nothing when the state is
    /// complete.
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
    /// Transition::Exact.commits(0, &state, &stats, &mut out).unwrap();
    /// assert_eq!(out.len(), 1);
    /// assert_eq!((out[0].position, out[0].token), (2, 7));
    /// out.clear();
    /// Transition::Threshold { tau: 0.9 }.commits(0, &state, &stats, &mut out).unwrap();
    /// assert_eq!(out.len(), 2);
    /// // Three positions in two steps: 2 then 1; the dynamic rule takes 2 above 0.96 anyway.
    /// out.clear();
    /// let sdar = Transition::Scheduled { steps: 2, tau: Some(0.96) };
    /// sdar.commits(0, &state, &stats, &mut out).unwrap();
    /// assert_eq!(out.iter().map(|c| c.position).collect::<Vec<_>>(), [2, 1]);
    /// ```
    pub fn commits(
        &self,
        step: usize,
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
        for s in state.masked_positions() {
            finite_confidence(stats, s)?;
        }
        self.select(
            step,
            state.tokens(),
            state.mask_id(),
            |s| (stats.token(s), stats.confidence(s)),
            out,
        );
        Ok(())
    }

    /// The commit rule over any per-position choice: `choice(s)` is the (token, confidence)
    /// of masked position `s` of `tokens`. [`Transition::commits`] reads it from the
    /// statistics; verification ablations from other views of them.
    pub fn select(
        &self,
        step: usize,
        tokens: &[TokenId],
        mask: TokenId,
        choice: impl Fn(usize) -> (TokenId, f32),
        out: &mut Vec<Commit>,
    ) {
        let masked = || (0..tokens.len()).filter(|&s| tokens[s] == mask);
        let start = out.len();
        let (count, tau) = match *self {
            Transition::Exact => (1, None),
            Transition::Threshold { tau } => (1, Some(tau)),
            Transition::Scheduled { tau, .. } => (self.scheduled_count(step, tokens.len()), tau),
        };
        if let Some(tau) = tau {
            out.extend(
                masked()
                    .filter(|&s| choice(s).1 > tau)
                    .map(|s| Commit::new(s, choice(s).0)),
            );
            if out.len() - start >= count.min(masked().count()) {
                return;
            }
            out.truncate(start);
        }
        // The `count` most confident, ties to the lower index, most confident first.
        let mut ranked: Vec<usize> = masked().collect();
        ranked.sort_by(|&a, &b| choice(b).1.total_cmp(&choice(a).1).then(a.cmp(&b)));
        out.extend(
            ranked
                .into_iter()
                .take(count)
                .map(|s| Commit::new(s, choice(s).0)),
        );
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
    let mut out = Vec::with_capacity(1);
    Transition::Exact.commits(0, state, stats, &mut out)?;
    Ok(out.pop())
}
