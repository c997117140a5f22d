//! Tree replay: SPOT's rounds re-enacted on a recorded draft-free trajectory, without the
//! target.
//!
//! Under exact (one-commit) decoding a speculative decode visits only states of the draft-free
//! decode, and the statistics a round drafts from are the draft-free forward's at the state
//! the previous round accepted last. A trajectory stores both for every step, so a drafter's
//! rounds can be re-enacted from it: a round rooted after `c` commits builds its tree from the
//! statistics of step `c - 1`, the walk accepts the `k` drafted commits that equal steps
//! `c, ..., c + k - 1`, and the forward commits step `c + k` itself. [`replay`] counts the
//! forwards that takes per block (the first forward of a block is a plain step), with the same
//! [`TreeBuilder`] and the same scorer a decoder would use, in milliseconds per trajectory.
//!
//! The count is that of a decoder with block-end look-ahead but no draft refresh
//! (`BlockEnds { fill, refresh: false }`): a block whose last round named its true end as the
//! look-ahead gets its first forward free. A live decode with refresh also drafts the first
//! forward of a block after a wrong look-ahead, which a trajectory cannot replay (those
//! statistics are of a state it never visited). It is meant for comparing tree shapes, order models and token rules on
//! many trajectories, not for quoting a method's NFE (that is `spot bench`'s job). Statistics
//! are rebuilt from the stored top-k (the decoder's confidence rule `probability`, so a
//! position's chosen-token probability is its confidence).

use spot_core::{BlockState, BlockStats, GumbelNoise, TokenId, stats::PositionStats};
use spot_tree::{DraftTree, NodeBatch, OrderScorer, ScoreContext, TreeBuilder, TreeError};

use crate::train::top_position;
use crate::trajectory::{StepRecord, Trajectory};

/// Why a trajectory cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A step made several commits (a threshold-decoding trajectory).
    #[error(
        "trajectory {id}: step {step} of block {block} made {commits} commits; replay needs one-commit (exact) trajectories"
    )]
    NotExact {
        /// The trajectory.
        id: String,
        /// The block.
        block: usize,
        /// The step.
        step: usize,
        /// Its commits.
        commits: usize,
    },
    /// The file stores no top-k token ids (format version 2).
    #[error("trajectory {id}: no top-k token ids stored (format version 2); collect it again")]
    NoTopIds {
        /// The trajectory.
        id: String,
    },
    /// The stored statistics do not form a valid block.
    #[error("trajectory {id}: {source}")]
    Stats {
        /// The trajectory.
        id: String,
        /// What the statistics refused.
        source: spot_core::Error,
    },
    /// The tree builder or the scorer refused a round.
    #[error("trajectory {id}: {source}")]
    Tree {
        /// The trajectory.
        id: String,
        /// The builder's error.
        source: TreeError,
    },
}

/// What [`replay`] counted over one or more trajectories (add counts with `+=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayCount {
    /// Trajectories replayed.
    pub trajectories: usize,
    /// Blocks replayed.
    pub blocks: usize,
    /// Commits (the draft-free decode's forwards).
    pub commits: usize,
    /// Forwards of the speculative decode (plain first steps of blocks included).
    pub forwards: usize,
    /// Drafted rounds.
    pub rounds: usize,
    /// Drafted nodes the walks accepted.
    pub accepted: usize,
    /// Draft nodes built.
    pub drafted: usize,
    /// First forwards of blocks a right look-ahead had scored (not in `forwards`).
    pub prefetched: usize,
}

impl std::ops::AddAssign for ReplayCount {
    fn add_assign(&mut self, o: Self) {
        self.trajectories += o.trajectories;
        self.blocks += o.blocks;
        self.commits += o.commits;
        self.forwards += o.forwards;
        self.rounds += o.rounds;
        self.accepted += o.accepted;
        self.drafted += o.drafted;
        self.prefetched += o.prefetched;
    }
}

impl ReplayCount {
    /// Forwards per trajectory.
    pub fn forwards_per_trajectory(&self) -> f64 {
        self.forwards as f64 / self.trajectories.max(1) as f64
    }

    /// Accepted drafted nodes per drafted round.
    pub fn accepted_per_round(&self) -> f64 {
        self.accepted as f64 / self.rounds.max(1) as f64
    }

    /// Commits per forward (draft-free decoding: 1).
    pub fn commits_per_forward(&self) -> f64 {
        self.commits as f64 / self.forwards.max(1) as f64
    }
}

/// The statistics of step `step` as a [`BlockStats`] over the whole block: stored positions
/// as recorded (chosen-token probability = confidence), the others committed (their token
/// in `state` at probability 1).
pub fn step_stats(
    traj: &Trajectory,
    step: &StepRecord,
    state: &[TokenId],
) -> Result<BlockStats, ReplayError> {
    let k = traj.top_k;
    let mut stats = BlockStats::new(k);
    let (mut ids, mut probs) = (vec![0; k], vec![0.0; k]);
    let stats_err = |source| ReplayError::Stats {
        id: traj.id.clone(),
        source,
    };
    for (s, &t) in state.iter().enumerate() {
        let p = match step.stored(s) {
            Some(p) => {
                if p.top_ids.len() != k {
                    return Err(ReplayError::NoTopIds {
                        id: traj.id.clone(),
                    });
                }
                PositionStats {
                    token: p.token,
                    confidence: p.confidence,
                    token_prob: p.confidence,
                    entropy: p.entropy,
                    tail_mass: p.tail_mass,
                    top_ids: &p.top_ids,
                    top_probs: &p.top_probs,
                }
            }
            None => {
                ids.fill(t);
                probs.fill(0.0);
                if let Some(first) = probs.first_mut() {
                    *first = 1.0;
                }
                PositionStats {
                    token: t,
                    confidence: 1.0,
                    token_prob: 1.0,
                    entropy: 0.0,
                    tail_mass: 0.0,
                    top_ids: &ids,
                    top_probs: &probs,
                }
            }
        };
        stats.push(p).map_err(stats_err)?;
    }
    Ok(stats)
}

/// Re-enacts a speculative decode of `traj` with `builder`'s trees and `scorer`'s order (see
/// the [module docs](self)), with the decoder's block-end look-ahead completing up to `fill`
/// positions ([`DraftTree::block_end`](spot_tree::DraftTree::block_end)); returns its counts.
///
/// ```
/// use spot_core::{DecodeConfig, toy::{ToyConfig, ToyModel}};
/// use spot_train::replay::replay;
/// use spot_train::record;
/// use spot_tree::{StaleConfidenceScorer, TreeBuilder, TreeConfig};
/// let mut model = ToyModel::new(ToyConfig { vocab_size: 64, mask_id: 63, ..ToyConfig::default() });
/// let cfg = DecodeConfig { max_new_tokens: 16, block_size: 8, ..DecodeConfig::default() };
/// let (_, traj) = record(&mut model, &[1, 2, 3], &cfg, "toy").unwrap();
/// let mut b = TreeBuilder::new(TreeConfig::default()).unwrap();
/// let n = replay(&traj, &mut b, &mut StaleConfidenceScorer, 8).unwrap();
/// // Whole blocks, after the prompt's tail: at least the 16 new tokens.
/// assert!(n.commits >= 16);
/// assert!(n.forwards < n.commits);
/// ```
pub fn replay(
    traj: &Trajectory,
    builder: &mut TreeBuilder,
    scorer: &mut dyn OrderScorer,
    fill: usize,
) -> Result<ReplayCount, ReplayError> {
    replay_with(traj, builder, Some(scorer), fill)
}

/// [`replay`] with the SSD-style chain ([`TreeBuilder::build_chain`]) instead of a scored
/// tree.
pub fn replay_chain(
    traj: &Trajectory,
    builder: &mut TreeBuilder,
    fill: usize,
) -> Result<ReplayCount, ReplayError> {
    replay_with(traj, builder, None, fill)
}

fn replay_with(
    traj: &Trajectory,
    builder: &mut TreeBuilder,
    mut scorer: Option<&mut dyn OrderScorer>,
    fill: usize,
) -> Result<ReplayCount, ReplayError> {
    let mut n = ReplayCount {
        trajectories: 1,
        ..ReplayCount::default()
    };
    let noise = (traj.temperature > 0.0).then(|| GumbelNoise::new(traj.seed));
    let tree_err = |source| ReplayError::Tree {
        id: traj.id.clone(),
        source,
    };
    let mut prefetched = false;
    for (bi, b) in traj.blocks.iter().enumerate() {
        let mut commits = Vec::with_capacity(b.steps.len());
        for (si, step) in b.steps.iter().enumerate() {
            match step.commits.as_slice() {
                [c] => commits.push(*c),
                [] => {}
                more => {
                    return Err(ReplayError::NotExact {
                        id: traj.id.clone(),
                        block: bi,
                        step: si,
                        commits: more.len(),
                    });
                }
            }
        }
        if b.steps.len() != commits.len() || commits.is_empty() {
            continue;
        }
        n.blocks += 1;
        n.commits += commits.len();
        let mut state = b.initial.clone();
        // The block's first forward has no stale statistics: a plain step, unless the
        // previous block's last forward scored it behind a right look-ahead.
        if std::mem::take(&mut prefetched) {
            n.prefetched += 1;
        } else {
            n.forwards += 1;
        }
        apply(&mut state, commits[0]);
        let mut c = 1;
        while c < commits.len() {
            let round = Round::new(traj, &b.steps[c - 1], &state)?;
            let (stale, ctx) = (&round.stale, round.ctx(traj, b.start, noise));
            let tree = match scorer.as_deref_mut() {
                Some(s) => builder.build(&ctx, s),
                None => builder.build_chain(&ctx),
            }
            .map_err(tree_err)?;
            let lookahead = tree.block_end(stale, fill);
            n.rounds += 1;
            n.drafted += tree.draft_count();
            let mut node = 0;
            let mut k = 0;
            while c + k < commits.len() {
                match tree.find_successor(node, &commits[c + k..c + k + 1]) {
                    Some(next) => {
                        node = next;
                        k += 1;
                    }
                    None => break,
                }
            }
            n.accepted += k;
            n.forwards += 1;
            // The accepted commits, then the one the forward makes itself.
            for &cm in &commits[c..(c + k + 1).min(commits.len())] {
                apply(&mut state, cm);
            }
            c += k + 1;
            if c >= commits.len() {
                prefetched = lookahead.is_some_and(|l| l.tokens() == state.as_slice());
            }
        }
    }
    Ok(n)
}

/// Depth-0 next-commit hits of an order scorer on `traj`, as a decoder would score: for every
/// step `c ≥ 1` of a block whose step makes one commit, the round rooted after steps `< c` is
/// scored with the statistics of step `c - 1` ([`step_stats`]) and its top position (the
/// highest score among the positions masked at the root, ties to the lower index) is compared
/// with step `c`'s commit. The examples are [`examples`](crate::trajectory::examples)' at
/// depth 0, so with [`StaleConfidenceScorer`](spot_tree::StaleConfidenceScorer) the hits are
/// the stale-confidence ones of [`evaluate_on`](crate::evaluate_on); with a
/// [`LearnedScorer`](spot_drafter::LearnedScorer) they are those of the order SPOT decodes with (the
/// network after the rank tilt and the rank-path prior of the trajectory's temperature).
/// Returns `(hits, examples)`.
///
/// ```
/// use spot_core::{DecodeConfig, toy::{ToyConfig, ToyModel}};
/// use spot_train::{examples, record};
/// use spot_train::replay::depth0_hits;
/// use spot_tree::StaleConfidenceScorer;
/// let mut m = ToyModel::new(ToyConfig::default());
/// let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16, early_stop: false, ..DecodeConfig::default() };
/// let (_, traj) = record(&mut m, &[1, 2, 3], &cfg, "p").unwrap();
/// let (hits, n) = depth0_hits(&traj, &mut StaleConfidenceScorer).unwrap();
/// // One per step after a block's first: the depth-0 examples of training.
/// assert_eq!(n, examples(&traj, 0, |_| ()));
/// assert!(n > 0 && hits <= n);
/// ```
pub fn depth0_hits(
    traj: &Trajectory,
    scorer: &mut dyn OrderScorer,
) -> Result<(usize, usize), ReplayError> {
    let noise = (traj.temperature > 0.0).then(|| GumbelNoise::new(traj.seed));
    let l = traj.block_size;
    let mut scores = vec![0.0f32; l];
    let (mut hits, mut n) = (0, 0);
    for b in &traj.blocks {
        let mut state = b.initial.clone();
        for (c, step) in b.steps.iter().enumerate() {
            if let (Some(prev), [target]) = (c.checked_sub(1), step.commits.as_slice()) {
                let round = Round::new(traj, &b.steps[prev], &state)?;
                let ctx = round.ctx(traj, b.start, noise);
                let tree = DraftTree::new(&round.root);
                scores.fill(0.0);
                scorer
                    .score(&ctx, &NodeBatch::new(&tree, &[0]), &mut scores)
                    .map_err(|source| ReplayError::Tree {
                        id: traj.id.clone(),
                        source,
                    })?;
                let pick = top_position(
                    &scores,
                    (0..l).filter(|&s| state.get(s) == Some(&traj.mask_id)),
                );
                hits += usize::from(pick == Some(target.position));
                n += 1;
            }
            for &cm in &step.commits {
                apply(&mut state, cm);
            }
        }
    }
    Ok((hits, n))
}

/// A replayed round's root and the stale statistics it drafts from.
struct Round {
    root: BlockState,
    stale: BlockStats,
}

impl Round {
    /// The round rooted at `state`, drafting from the statistics of `step`.
    fn new(traj: &Trajectory, step: &StepRecord, state: &[TokenId]) -> Result<Self, ReplayError> {
        Ok(Self {
            stale: step_stats(traj, step, state)?,
            root: BlockState::from_tokens(state.to_vec(), traj.mask_id),
        })
    }

    /// What a scorer reads for this round of `traj`'s block starting at `block_start`.
    fn ctx(
        &self,
        traj: &Trajectory,
        block_start: u64,
        noise: Option<GumbelNoise>,
    ) -> ScoreContext<'_> {
        ScoreContext {
            root: &self.root,
            stale: &self.stale,
            block_start: block_start as usize,
            noise,
            temperature: traj.temperature,
        }
    }
}

fn apply(state: &mut [TokenId], c: spot_core::Commit) {
    if let Some(slot) = state.get_mut(c.position) {
        *slot = c.token;
    }
}
