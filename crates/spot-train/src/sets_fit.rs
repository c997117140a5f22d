//! Fitting SPOT-Sets' calibrated drafter on threshold-decoding trajectories: the walk over
//! every masked position of every node below every root ([`join_examples`], which the learned
//! set drafter's training reads too) and the tables it counts ([`fit_join_table`]).

use crate::fit::monotone_rates;
use crate::trajectory::{StepRecord, Trajectory};
use spot_core::{Commit, TokenId};
use spot_sets::JoinTable;
use spot_tree::stale::StoredPosition;
use spot_tree::table::bin;

/// Fits a [`JoinTable`]: measures the rates on threshold-decoding trajectories decoded with `tau`, for `steps`
/// rows (`j = 0 .. steps - 1`; the drafter reads the last row for deeper steps).
///
/// Step `t`'s statistics are the stale distribution of the root `x[t+1]`; the position
/// `s` masked at `x[t+1+j]` joined when step `t+1+j` committed it above `τ` (a fallback
/// step, whose single commit is not above `τ`, has no joiner).
pub fn fit_join_table<'a>(
    trajs: impl IntoIterator<Item = &'a Trajectory>,
    tau: f32,
    steps: usize,
) -> JoinTable {
    let steps = steps.max(1);
    let edges = JoinTable::edges_for(tau);
    let nb = edges.len();
    let mut n = vec![vec![0u64; nb]; steps];
    let mut joined = vec![vec![0u64; nb]; steps];
    let mut same = vec![vec![0u64; nb]; steps];
    let mut hedged = vec![vec![0u64; nb]; steps];
    let mut written = vec![vec![0u64; nb]; steps];
    let mut led = vec![vec![0u64; nb]; steps];
    let mut cleared = vec![vec![0u64; nb]; steps];
    let trajs: Vec<&Trajectory> = trajs.into_iter().collect();
    let temps: Vec<f32> = trajs.iter().map(|t| t.temperature).collect();
    let samples = join_examples(trajs, tau, steps, |e| {
        let (row, p) = (e.row, e.p);
        let k = bin(&edges, p.confidence);
        if e.leads {
            led[row][k] += 1;
            cleared[row][k] += u64::from(e.clears);
        } else {
            n[row][k] += 1;
            joined[row][k] += u64::from(e.commit.is_some() && e.clears);
        }
        if let Some(c) = e.commit {
            written[row][k] += 1;
            same[row][k] += u64::from(c.token == p.token);
            hedged[row][k] += u64::from(c.token == p.hedge && c.token != p.token);
        }
    });
    let rates = |hits: &[Vec<u64>], counts: &[Vec<u64>], increasing: bool| {
        hits.iter()
            .zip(counts)
            .map(|(h, c)| monotone_rates(h, c, increasing))
            .collect()
    };
    let (join, lead) = (rates(&joined, &n, true), rates(&cleared, &led, true));
    let (token, hedge) = (
        rates(&same, &written, true),
        rates(&hedged, &written, false),
    );
    let temperature = temps
        .first()
        .copied()
        .filter(|&t0| temps.iter().all(|&t| t == t0));
    JoinTable {
        tau,
        temperature,
        edges,
        lead,
        join,
        token,
        hedge,
        samples,
    }
}

/// One supervised position of a threshold-decoding trajectory, as both the calibrated tables
/// ([`fit_join_table`]) and the learned drafter count it.
#[derive(Clone, Copy, Debug)]
pub struct JoinExample<'t, 'n> {
    /// The trajectory.
    pub traj: &'t Trajectory,
    /// Absolute position of the block's first slot.
    pub block_start: u64,
    /// The stale step (its statistics are the round's stale distribution).
    pub stale: &'t StepRecord,
    /// The root: the state after the stale step.
    pub root: &'n [TokenId],
    /// The hypothesised state `row` threshold steps below the root.
    pub node: &'n [TokenId],
    /// Threshold steps between the root and the node.
    pub row: usize,
    /// The masked position of the node.
    pub s: usize,
    /// Its stale statistics.
    pub p: &'t StoredPosition,
    /// Whether it leads the node's true step (the position the target is most confident
    /// about there, ties to the lowest index).
    pub leads: bool,
    /// Whether the true step's leader cleared `τ` (else the step is the leader alone).
    pub clears: bool,
    /// The true step's commit at `s`, if any.
    pub commit: Option<Commit>,
}

/// Calls `f` for every masked position with stale statistics of every node up to `steps`
/// threshold steps below every root of `trajs` (threshold-decoding trajectories at `tau`):
/// the examples the set drafters are fitted on. Returns how many.
pub fn join_examples<'a>(
    trajs: impl IntoIterator<Item = &'a Trajectory>,
    tau: f32,
    steps: usize,
    mut f: impl FnMut(&JoinExample<'a, '_>),
) -> u64 {
    let mut n = 0u64;
    let mut root: Vec<TokenId> = Vec::new();
    let mut node: Vec<TokenId> = Vec::new();
    for traj in trajs {
        for b in &traj.blocks {
            root.clear();
            root.extend_from_slice(&b.initial);
            for (i, stale) in b.steps.iter().enumerate() {
                for c in &stale.commits {
                    if let Some(x) = root.get_mut(c.position) {
                        *x = c.token;
                    }
                }
                node.clear();
                node.extend_from_slice(&root);
                for (j, step) in b.steps.iter().enumerate().skip(i + 1).take(steps.max(1)) {
                    let row = j - i - 1;
                    let leader =
                        step.positions
                            .iter()
                            .fold(None, |b: Option<&StoredPosition>, p| match b {
                                Some(b) if b.confidence >= p.confidence => Some(b),
                                _ => Some(p),
                            });
                    let clears = leader.is_some_and(|p| p.confidence > tau);
                    let leader = leader.map(|p| p.position as usize);
                    for s in (0..node.len()).filter(|&s| node[s] == traj.mask_id) {
                        let Some(p) = stale.stored(s) else { continue };
                        n += 1;
                        f(&JoinExample {
                            traj,
                            block_start: b.start,
                            stale,
                            root: &root,
                            node: &node,
                            row,
                            s,
                            p,
                            leads: Some(s) == leader,
                            clears,
                            commit: step.commits.iter().find(|c| c.position == s).copied(),
                        });
                    }
                    for c in &step.commits {
                        if let Some(x) = node.get_mut(c.position) {
                            *x = c.token;
                        }
                    }
                }
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::trajectory::BlockRecord;

    fn pos(position: u32, token: TokenId, confidence: f32) -> StoredPosition {
        StoredPosition {
            position,
            token,
            runner_up: token,
            confidence,
            entropy: 1.0,
            tail_mass: 0.0,
            hedge: token,
            hedge_prob: 0.0,
            margin: 1.0,
            top_probs: vec![confidence],
            top_ids: vec![token],
            hidden: Vec::new(),
        }
    }

    /// Three positions: step 0 commits position 0 above τ; step 1 commits `second`.
    fn traj(second: Vec<Commit>, second_conf: f32) -> Trajectory {
        let mask = 9;
        Trajectory {
            id: "t".into(),
            block_size: 3,
            top_k: 1,
            mask_id: mask,
            temperature: 0.0,
            seed: 0,
            hidden_dim: 0,
            blocks: vec![BlockRecord {
                start: 0,
                initial: vec![mask; 3],
                steps: vec![
                    StepRecord {
                        commits: vec![Commit::new(0, 1)],
                        positions: vec![pos(0, 1, 0.95), pos(1, 2, 0.5), pos(2, 3, 0.3)],
                    },
                    StepRecord {
                        commits: second,
                        positions: vec![pos(1, 2, second_conf), pos(2, 3, second_conf)],
                    },
                ],
            }],
        }
    }

    #[test]
    fn joins_and_tokens_are_counted_from_the_stale_step() {
        let t = traj(vec![Commit::new(1, 2), Commit::new(2, 4)], 0.95);
        let table = fit_join_table([&t], 0.9, 2);
        assert_eq!(table.samples, 2);
        table.check().unwrap();
        let (lo, hi) = (bin(&table.edges, 0.3), bin(&table.edges, 0.5));
        // Position 1 led (the first of equal confidences) and cleared τ; position 2 joined.
        assert!(table.lead[0][hi] > 0.5 && table.join[0][lo] > 0.5);
        // Position 2's token changed, position 1's did not.
        assert!(table.token[0][lo] < table.token[0][hi]);
        // No row-1 data: the prior.
        assert_eq!(table.join[1][lo], 0.5);
    }

    #[test]
    fn a_fallback_step_has_no_joiner() {
        let t = traj(vec![Commit::new(1, 2)], 0.5);
        let table = fit_join_table([&t], 0.9, 2);
        let (lo, hi) = (bin(&table.edges, 0.3), bin(&table.edges, 0.5));
        assert!(table.join[0][lo] < 0.5 && table.lead[0][hi] < 0.5);
        // τ and its neighbours are bin edges.
        assert!(table.edges.iter().any(|&e| (e - 0.9).abs() < 1e-6));
        assert!(table.edges.iter().any(|&e| (e - 0.88).abs() < 1e-6));
    }
}
