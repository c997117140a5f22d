//! Trajectory statistics that explain acceptance: how often the stale token is still the
//! token the target commits.

use crate::trajectory::{Trajectory, examples};

/// Token hit rates of the stale statistics, by replay depth (Algorithm 1's examples).
///
/// For an example at depth `d` (root `x_t` plus `d` true commits, stale statistics of step
/// `t - 1`), the target commits token `v*` at position `s*`. `top1[d]` counts examples where
/// the stale choice at `s*` was `v*` (the tree's first token hypothesis), `runner_up[d]` those
/// where the stale runner-up was (the hedge).
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
            let Ok(i) = ex
                .stale
                .positions
                .binary_search_by_key(&ex.target, |p| p.position as usize)
            else {
                return;
            };
            let p = &ex.stale.positions[i];
            h.top1[d] += usize::from(p.token == ex.token);
            h.runner_up[d] += usize::from(p.runner_up == ex.token && p.token != ex.token);
            h.top1_prob_sum[d] += f64::from(p.top_probs.first().copied().unwrap_or(0.0));
        });
    }
    h
}
