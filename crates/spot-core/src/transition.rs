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
    /// Dream's linear timestep schedule, over each block: with `t = linspace(1, eps, steps +
    /// 1)` (float32, as torch computes it), step `i` commits `⌊m (1 - t[i+1] / t[i])⌋` of the
    /// `m` positions still masked (float32; the last step commits every one left), the most
    /// confident (ties to the lower index). `m` starts at the block size, so a block that
    /// starts partly committed (a prompt tail under [`BlockLayout::Aligned`]) follows the
    /// schedule of a whole one, at most the masked count per step. Steps that would commit
    /// nothing take no forward here (in Dream they leave the sequence unchanged), so a block
    /// takes [`Transition::timestep_counts`]`.len()` forwards. Dream itself has no blocks: its
    /// own sampler is this rule over a single block holding the whole generation
    /// ([`BlockLayout::AfterPrompt`], block size = `max_new_tokens`).
    ///
    /// [`BlockLayout::Aligned`]: crate::BlockLayout::Aligned
    /// [`BlockLayout::AfterPrompt`]: crate::BlockLayout::AfterPrompt
    Timesteps {
        /// Steps per block (`steps` of Dream's `diffusion_generate`), at least 1.
        steps: u32,
        /// The last timestep, in `(0, 1)` (Dream's `eps`, 1e-3 by default).
        eps: f32,
    },
}

impl std::fmt::Display for Transition {
    /// `exact`, `threshold(τ)`, `scheduled(steps=S)` / `scheduled(steps=S, tau=τ)`,
    /// `timesteps(steps=S, eps=E)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Transition::Exact => f.write_str("exact"),
            Transition::Threshold { tau } => write!(f, "threshold({tau})"),
            Transition::Scheduled { steps, tau: None } => write!(f, "scheduled(steps={steps})"),
            Transition::Scheduled {
                steps,
                tau: Some(tau),
            } => write!(f, "scheduled(steps={steps}, tau={tau})"),
            Transition::Timesteps { steps, eps } => {
                write!(f, "timesteps(steps={steps}, eps={eps})")
            }
        }
    }
}

/// Dream's default last timestep.
pub const DREAM_EPS: f32 = 1e-3;

impl Transition {
    /// Checks `tau` and `steps`.
    pub fn validate(&self) -> Result<()> {
        let tau = match *self {
            Transition::Exact => None,
            Transition::Threshold { tau } => Some(tau),
            Transition::Scheduled { steps: 0, .. } | Transition::Timesteps { steps: 0, .. } => {
                return Err(Error::config("steps", "must be at least 1, got 0"));
            }
            Transition::Scheduled { tau, .. } => tau,
            Transition::Timesteps { eps, .. } if !(eps > 0.0 && eps < 1.0) => {
                return Err(Error::config(
                    "eps",
                    format!("must be in (0, 1), got {eps}"),
                ));
            }
            Transition::Timesteps { .. } => None,
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
            Transition::Timesteps { .. } => {
                let counts = self.timestep_counts(len);
                counts.get(step).or(counts.last()).copied().unwrap_or(1)
            }
            _ => 1,
        }
    }

    /// The positions each forward of a block of `len` positions commits under
    /// [`Transition::Timesteps`], the steps that commit nothing left out (empty for the other
    /// transitions).
    ///
    /// ```
    /// use spot_core::Transition;
    /// let dream = Transition::Timesteps { steps: 4, eps: 1e-3 };
    /// // 8 masks over 4 steps (t = 1, 0.75025, …): ⌊8 (1 - 0.75025)⌋ = 1, then 2, 2, the 3 left.
    /// assert_eq!(dream.timestep_counts(8), [1, 2, 2, 3]);
    /// // As many steps as positions: the first step commits nothing, the last two.
    /// let one = Transition::Timesteps { steps: 8, eps: 1e-3 };
    /// assert_eq!(one.timestep_counts(8), [1, 1, 1, 1, 1, 1, 2]);
    /// ```
    pub fn timestep_counts(&self, len: usize) -> Vec<usize> {
        let Transition::Timesteps { steps, eps } = *self else {
            return Vec::new();
        };
        let steps = steps.max(1) as usize;
        let t = linspace_f32(1.0, eps, steps + 1);
        let mut left = len;
        let mut counts = Vec::new();
        for i in 0..steps {
            if left == 0 {
                break;
            }
            let n = if i + 1 < steps {
                // Dream: int(num_mask_token * (1 - s / t)), all float32; at most the masks
                // left (1 - s / t <= 1, but the float product is not checked by Dream).
                ((left as f32 * (1.0 - t[i + 1] / t[i])) as usize).min(left)
            } else {
                left
            };
            if n > 0 {
                counts.push(n);
                left -= n;
            }
        }
        counts
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
            Transition::Timesteps { .. } => (self.scheduled_count(step, tokens.len()), None),
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

/// `torch.linspace(start, end, n)` in float32 as torch's CPU kernel computes it: the first half
/// as `start + step * i`, the second as `end - step * (n - 1 - i)`, each with one rounding (a
/// fused multiply-add), `step = (end - start) / (n - 1)`.
fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    (0..n)
        .map(|i| {
            if i < n / 2 {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_schedules_name_their_field() {
        let field = |t: Transition| match t.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("{t:?}: {other:?}"),
        };
        assert_eq!(
            field(Transition::Scheduled {
                steps: 0,
                tau: None
            }),
            "steps"
        );
        assert_eq!(
            field(Transition::Timesteps {
                steps: 0,
                eps: 1e-3
            }),
            "steps"
        );
        for eps in [0.0, 1.0, -0.5, f32::NAN, f32::INFINITY] {
            assert_eq!(field(Transition::Timesteps { steps: 4, eps }), "eps");
        }
        assert!(
            Transition::Timesteps { steps: 4, eps: 0.5 }
                .validate()
                .is_ok()
        );
    }

    /// Every block completes: the counts are positive, sum to the block size, and number at
    /// most `steps`; with as many steps as positions most forwards commit one.
    #[test]
    fn timestep_counts_cover_the_block() {
        for len in [1usize, 2, 7, 32, 100, 513] {
            for steps in [1u32, 2, 5, 32, 64, 1000] {
                for eps in [1e-3f32, 0.2, 0.9] {
                    let c = Transition::Timesteps { steps, eps }.timestep_counts(len);
                    assert!(c.iter().all(|&n| n > 0), "{len} {steps} {eps}: {c:?}");
                    assert_eq!(c.iter().sum::<usize>(), len, "{len} {steps} {eps}");
                    assert!(c.len() <= steps as usize);
                }
            }
        }
        let one = Transition::Timesteps {
            steps: 128,
            eps: DREAM_EPS,
        }
        .timestep_counts(128);
        assert!(one.iter().filter(|&&n| n == 1).count() >= 120, "{one:?}");
        assert!(Transition::Exact.timestep_counts(8).is_empty());
    }
}
