//! # spot-verify
//!
//! The one-forward verifier of SPOT. A round's root state and every node of its draft tree go
//! to the target as **one** batched forward; the target's own transition (`Φ`, or `Φ^τ`) is
//! computed at every node; the walk starts at the root and moves to the node equal to
//! `current + Φ(current)` for as long as the tree has it; then it commits `Φ(current)`, the
//! target's own choice. The output therefore never depends on the tree, only the number of
//! forwards does, and every forward commits at least one position.
//!
//! The statistics of the last accepted node become the next round's stale distribution.
//!
//! ```
//! use spot_core::{BlockState, MeteredModel, StatsQuery, Transition};
//! use spot_core::toy::{ToyConfig, ToyModel};
//! use spot_tree::{ScoreContext, TreeBuilder, TreeConfig};
//! use spot_verify::{MatchRule, Verifier};
//!
//! let mut toy = ToyModel::new(ToyConfig { stability: 1.0, ..ToyConfig::default() });
//! let mut model = MeteredModel::new(&mut toy);
//! model.reset_prefix(&[5; 8], 8, 16).unwrap();
//! let q = StatsQuery::new(0.0, 0);
//! let x0 = BlockState::masked(8, model.info().mask_id);
//! let stale = model.forward(&[x0.clone()], &q).unwrap().remove(0);
//! let c = spot_core::exact_commit(&x0, &stale).unwrap().unwrap();
//! let root = x0.with_commit(c).unwrap();
//! let ctx = ScoreContext { root: &root, stale: &stale, block_start: 8, noise: None, temperature: 0.0 };
//! let mut builder = TreeBuilder::new(TreeConfig { budget: 6, ..TreeConfig::default() }).unwrap();
//! // The SSD-style chain: positions in order of stale confidence.
//! let tree = builder.build_chain(&ctx).unwrap();
//! let mut verifier = Verifier::new(MatchRule::Coupled);
//! let round = verifier.verify(&mut model, tree, &q, Transition::Exact, (1, 0)).unwrap();
//! // Stable toy logits: stale statistics are exact, so the whole chain of 6 is accepted
//! // and the target's own commit at its end makes 7 commits for one forward.
//! assert_eq!(round.walk.accepted_nodes, 6);
//! assert_eq!(round.walk.commit_count(), 7);
//! // The prefill, the stale forward and the verification forward.
//! assert_eq!(model.meter().nfe, 3);
//! ```

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use spot_core::{
    BlockState, BlockStats, Commit, Error, MeteredModel, Result, StatsQuery, Transition,
};
use spot_tree::DraftTree;

mod end;
pub use end::RoundEnd;

/// How a node's target decision is compared with the tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatchRule {
    /// Coupled noise (the default and the only exact rule at `T > 0`): every node's decision is
    /// `Φ_G`, computed with the same noise table as the draft-free decoder, so a node is
    /// accepted exactly when the draft-free decoder would visit it.
    #[default]
    Coupled,
    /// Ablation. The walk compares the tree with the target's *greedy* decision (most confident
    /// top-1 token, no noise); the final commit is still the coupled `Φ_G`. Identical to
    /// `Coupled` at `T = 0` with the default confidence rule; at `T > 0` the output **differs**
    /// from draft-free decoding and is not a sample of the target's sampler.
    Greedy,
    /// Ablation. Each round draws fresh noise (seeded by the round number) instead of the
    /// coupled table. Every step is still a sample of the target's transition, but the output
    /// **differs** from the draft-free decoder with the same seed at `T > 0`, and acceptance
    /// falls because the tree's stale choices were drawn with other noise.
    IndependentSampling,
    /// **Lossy**, threshold decoding only (under any other transition it is `Coupled`): the
    /// product max-commit rule of SPOT-Sets. At each accepted node the walk may move to any
    /// tree node that adds a set `S` of masked positions each holding the target's own
    /// choice there, when `∏_{s∈S} c(s) > τ` (the product of the target's confidences at the
    /// node) or `S` is the target's threshold step itself; among those it takes the one that
    /// commits the most positions. Every factor is at most 1, so such an `S` lies inside the
    /// threshold step: the walk accepts drafted *subsets* of it and goes on from there, which
    /// the exact rule rejects. The output then **differs** from threshold decoding (other
    /// commit orders); measure its agreement before using it.
    ProductMaxCommit,
}

/// The accepted path of one round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Tree nodes visited, starting with the root (0).
    pub path: Vec<usize>,
    /// Commits of every step, flattened; `step_ends[i]` is the end of step `i`.
    pub commits: Vec<Commit>,
    /// End offsets of the steps in `commits`.
    pub step_ends: Vec<usize>,
    /// Draft nodes accepted: the path's length without the root (the depth of the last
    /// accepted node when every edge commits one position).
    pub accepted_nodes: usize,
    /// Whether the round ended with the block complete.
    pub complete: bool,
}

impl Walk {
    /// Clears for reuse.
    pub fn clear(&mut self) {
        self.path.clear();
        self.commits.clear();
        self.step_ends.clear();
        self.accepted_nodes = 0;
        self.complete = false;
    }

    /// The steps, each a slice of commits.
    pub fn steps(&self) -> impl Iterator<Item = &[Commit]> + '_ {
        let mut start = 0;
        self.step_ends.iter().map(move |&end| {
            let s = &self.commits[start..end];
            start = end;
            s
        })
    }

    /// Positions committed this round.
    pub fn commit_count(&self) -> usize {
        self.commits.len()
    }

    /// The last accepted node.
    pub fn last(&self) -> usize {
        self.path.last().copied().unwrap_or(0)
    }

    fn push_step(&mut self, step: &[Commit]) {
        self.commits.extend_from_slice(step);
        self.step_ends.push(self.commits.len());
    }
}

/// Marker in a batch index for nodes that were not forwarded (complete states).
pub const NOT_IN_BATCH: u32 = u32::MAX;

fn greedy_commits(
    transition: Transition,
    step: usize,
    state: &[spot_core::TokenId],
    mask: spot_core::TokenId,
    stats: &BlockStats,
    out: &mut Vec<Commit>,
) {
    transition.select(
        step,
        state,
        mask,
        |s| {
            let (ids, probs) = stats.top(s);
            (ids[0], probs[0])
        },
        out,
    );
}

/// Walks the accepted path of `tree`, given the statistics of every forwarded node:
/// `stats[batch_index[node]]` (or [`NOT_IN_BATCH`] for complete nodes, which need none). The
/// root is at step `first_step` of its block (the steps applied before; a
/// [`Transition::Scheduled`] rule reads it), every accepted node one step further.
///
/// This is the model-free half of verification; [`Verifier::verify`] runs the forward and
/// then calls it.
pub fn walk(
    tree: &DraftTree,
    batch_index: &[u32],
    stats: &[BlockStats],
    (transition, first_step): (Transition, usize),
    rule: MatchRule,
    out: &mut Walk,
    scratch: &mut Vec<Commit>,
) -> Result<()> {
    out.clear();
    let mut cur = 0usize;
    out.path.push(0);
    loop {
        if tree.is_complete(cur) {
            out.complete = true;
            break;
        }
        let st = batch_index
            .get(cur)
            .and_then(|&b| stats.get(b as usize))
            .ok_or(Error::ShapeMismatch {
                what: "statistics for a tree node in the verification batch",
                expected: cur + 1,
                actual: stats.len(),
            })?;
        let state = BlockState::from_tokens(tree.state(cur).to_vec(), tree.mask_id());
        let step = first_step + out.step_ends.len();
        scratch.clear();
        match rule {
            MatchRule::Greedy => greedy_commits(
                transition,
                step,
                tree.state(cur),
                tree.mask_id(),
                st,
                scratch,
            ),
            _ => transition.commits(step, &state, st, scratch)?,
        }
        let next = match (rule, transition) {
            (MatchRule::ProductMaxCommit, Transition::Threshold { tau }) => {
                max_commit(tree, cur, st, tau, scratch)
            }
            _ => tree.find_successor(cur, scratch),
        };
        if let Some(next) = next {
            out.push_step(scratch);
            out.path.push(next);
            cur = next;
            continue;
        }
        if rule == MatchRule::Greedy {
            scratch.clear();
            transition.commits(step, &state, st, scratch)?;
        }
        out.push_step(scratch);
        out.complete = scratch.len() == state.masked_count();
        break;
    }
    out.accepted_nodes = out.path.len() - 1;
    Ok(())
}

/// [`MatchRule::ProductMaxCommit`]: the node of `tree` that adds the most positions to node
/// `cur` among those adding a set with the target's choices whose confidences multiply to
/// more than `tau`, or the threshold step `step` itself; `step` is replaced by the chosen
/// node's commits.
fn max_commit(
    tree: &DraftTree,
    cur: usize,
    st: &BlockStats,
    tau: f32,
    step: &mut Vec<Commit>,
) -> Option<usize> {
    let mask = tree.mask_id();
    let from = tree.state(cur);
    let exact = tree.find_successor(cur, step);
    let mut best = exact.map(|n| (step.len(), n));
    for n in 0..tree.len() {
        let added = tree.depth(n).saturating_sub(tree.depth(cur));
        if n == cur || added == 0 || best.is_some_and(|(k, _)| added <= k) {
            continue;
        }
        let state = tree.state(n);
        let mut product = 1.0f64;
        let fits = from.iter().zip(state).enumerate().all(|(s, (&a, &b))| {
            if a != mask {
                return a == b;
            }
            if b == mask {
                return true;
            }
            product *= f64::from(st.confidence(s));
            b == st.token(s)
        });
        if fits && product > f64::from(tau) {
            best = Some((added, n));
        }
    }
    let (_, n) = best?;
    if Some(n) != exact {
        step.clear();
        let state = tree.state(n);
        step.extend(
            from.iter()
                .zip(state)
                .enumerate()
                .filter(|(_, (a, b))| **a == mask && **b != mask)
                .map(|(s, (_, &b))| Commit::new(s, b)),
        );
    }
    Some(n)
}

/// The result of one verified round.
#[derive(Clone, Debug, Default)]
pub struct RoundOutcome {
    /// The accepted path and the commits it makes.
    pub walk: Walk,
    /// The last accepted node's statistics: the next round's stale distribution (`None` when
    /// the block is complete).
    pub stale: Option<BlockStats>,
    /// Block states in the forward (root + incomplete draft nodes).
    pub batch_size: usize,
}

/// Runs verification rounds; keeps buffers between rounds.
#[derive(Clone, Debug, Default)]
pub struct Verifier {
    rule: MatchRule,
    batch_index: Vec<u32>,
    scratch: Vec<Commit>,
}

impl Verifier {
    /// A verifier with the given match rule.
    pub fn new(rule: MatchRule) -> Self {
        Self {
            rule,
            ..Self::default()
        }
    }

    /// The match rule.
    pub fn rule(&self) -> MatchRule {
        self.rule
    }

    /// One round: a single batched forward over the root and every incomplete node of `tree`,
    /// then the walk from a root at step `first_step` of its block. `round` numbers the rounds
    /// of a decode (it seeds the [`MatchRule::IndependentSampling`] ablation and is otherwise
    /// unused).
    ///
    /// The same as [`Verifier::batch`], a forward with [`Verifier::round_query`], and
    /// [`Verifier::walk_stats`]: the halves a step-wise decoder calls around a forward it
    /// does not run itself.
    pub fn verify(
        &mut self,
        model: &mut MeteredModel<'_>,
        tree: &DraftTree,
        query: &StatsQuery,
        transition: Transition,
        (first_step, round): (usize, u64),
    ) -> Result<RoundOutcome> {
        let mut states = Vec::with_capacity(tree.len());
        self.batch(tree, &mut states);
        let stats = model.forward(&states, &self.round_query(query, round))?;
        self.walk_stats(tree, stats, transition, first_step)
    }

    /// The verification batch of `tree`: the root and every incomplete node, appended to
    /// `states` (remembered for [`Verifier::walk_stats`]).
    pub fn batch(&mut self, tree: &DraftTree, states: &mut Vec<BlockState>) {
        self.batch_index.clear();
        let first = states.len();
        for i in 0..tree.len() {
            if tree.is_complete(i) {
                self.batch_index.push(NOT_IN_BATCH);
            } else {
                self.batch_index.push((states.len() - first) as u32);
                states.push(tree.block_state(i));
            }
        }
    }

    /// The query of round `round`: `query` itself, or fresh noise for the
    /// [`MatchRule::IndependentSampling`] ablation.
    pub fn round_query(&self, query: &StatsQuery, round: u64) -> StatsQuery {
        let mut q = *query;
        if self.rule == MatchRule::IndependentSampling {
            let seed = spot_core::state::mix64(query.noise.seed() ^ spot_core::state::mix64(round));
            q.noise = spot_core::GumbelNoise::new(seed);
        }
        q
    }

    /// The walk over `tree`, whose root is at step `first_step` of its block, given the
    /// statistics of the batch [`Verifier::batch`] made.
    pub fn walk_stats(
        &mut self,
        tree: &DraftTree,
        mut stats: Vec<BlockStats>,
        transition: Transition,
        first_step: usize,
    ) -> Result<RoundOutcome> {
        let batch_size = self
            .batch_index
            .iter()
            .filter(|&&b| b != NOT_IN_BATCH)
            .count();
        let mut out = RoundOutcome {
            batch_size,
            ..RoundOutcome::default()
        };
        walk(
            tree,
            &self.batch_index,
            &stats,
            (transition, first_step),
            self.rule,
            &mut out.walk,
            &mut self.scratch,
        )?;
        if !out.walk.complete {
            let b = self.batch_index[out.walk.last()] as usize;
            if b >= stats.len() {
                return Err(Error::ShapeMismatch {
                    what: "statistics for the last accepted node",
                    expected: b + 1,
                    actual: stats.len(),
                });
            }
            out.stale = Some(stats.swap_remove(b));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use spot_core::stats::PositionStats;

    const M: u32 = 99;

    /// Statistics choosing token `s + 1` at position `s` with confidence `conf[s]`.
    fn stats(conf: [f32; 4]) -> BlockStats {
        let mut st = BlockStats::new(1);
        for (s, c) in conf.into_iter().enumerate() {
            let t = s as u32 + 1;
            st.push(PositionStats {
                token: t,
                confidence: c,
                token_prob: c,
                entropy: 1.0,
                tail_mass: 0.0,
                top_ids: &[t],
                top_probs: &[c],
            })
            .unwrap();
        }
        st
    }

    /// The threshold step at the root is {0, 1}; the tree drafts the subset {0} and then
    /// {1, 2}. The exact rule accepts nothing; max-commit accepts the subset (0.9 > τ), then
    /// the exact step {1, 2}, then commits the fallback {3}.
    #[test]
    fn max_commit_accepts_drafted_subsets_of_the_threshold_step() {
        let root = BlockState::masked(4, M);
        let mut tree = DraftTree::new(&root);
        let a = tree.push_set(0, &[Commit::new(0, 1)], 0.5).unwrap();
        let b = tree
            .push_set(a, &[Commit::new(1, 2), Commit::new(2, 3)], 0.4)
            .unwrap();
        // A superset of the root's step whose product is below τ is never taken.
        tree.push_set(
            0,
            &[Commit::new(0, 1), Commit::new(1, 2), Commit::new(2, 3)],
            0.1,
        )
        .unwrap();
        let all = vec![
            stats([0.9, 0.8, 0.05, 0.05]),
            stats([1.0, 0.7, 0.6, 0.1]),
            stats([1.0, 1.0, 1.0, 0.1]),
            stats([1.0, 1.0, 1.0, 0.1]),
        ];
        let index: Vec<u32> = (0..4).collect();
        let tau = Transition::Threshold { tau: 0.5 };
        let (mut w, mut scratch) = (Walk::default(), Vec::new());
        walk(
            &tree,
            &index,
            &all,
            (tau, 0),
            MatchRule::Coupled,
            &mut w,
            &mut scratch,
        )
        .unwrap();
        assert_eq!(w.path, [0]);
        assert_eq!(w.commits, [Commit::new(0, 1), Commit::new(1, 2)]);
        let rule = MatchRule::ProductMaxCommit;
        walk(&tree, &index, &all, (tau, 0), rule, &mut w, &mut scratch).unwrap();
        assert_eq!(w.path, [0, a, b]);
        assert_eq!(w.step_ends, [1, 3, 4]);
        assert!(w.complete);
        // Under the exact transition the rule is the coupled one.
        walk(
            &tree,
            &index,
            &all,
            (Transition::Exact, 0),
            rule,
            &mut w,
            &mut scratch,
        )
        .unwrap();
        assert_eq!(w.path, [0, a]);
    }
}
