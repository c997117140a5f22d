//! Per-decode diagnostics of a [`crate::SpotDecoder`]: where the time goes and why rounds end.

use std::time::Duration;

use spot_verify::RoundEnd;

/// What a [`crate::SpotDecoder`] measured during its last decode (reset at the start of each).
///
/// NFE, positions processed and accepted nodes are in [`crate::DecodeStats`]; this adds what
/// only the speculative loop knows.
///
/// ```
/// use spot_dlm::{DecodeConfig, SpotDecoder};
/// use spot_dlm::toy::{ToyConfig, ToyModel};
///
/// let mut model = ToyModel::new(ToyConfig::default());
/// let cfg = DecodeConfig { block_size: 8, max_new_tokens: 16, ..DecodeConfig::default() };
/// let mut spot = SpotDecoder::builder().budget(4).build()?;
/// spot.decode(&mut model, &[1, 2, 3], &cfg)?;
/// let r = spot.report();
/// assert_eq!(r.accepted.iter().sum::<u64>(), r.rounds);
/// assert_eq!(r.complete + r.leaf + r.position_miss + r.token_miss, r.rounds);
/// # Ok::<(), spot_dlm::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpotReport {
    /// Verified rounds (tree + one forward each); the plain first step of a block is not one.
    pub rounds: u64,
    /// Time spent building trees, drafter calls included.
    pub draft_time: Duration,
    /// Time spent verifying: the batched target forward and the walk.
    pub verify_time: Duration,
    /// `accepted[k]`: rounds that accepted exactly `k` draft nodes.
    pub accepted: Vec<u64>,
    /// Rounds that finished their block.
    pub complete: u64,
    /// Rounds that ended at a node without children (budget or depth exhausted there).
    pub leaf: u64,
    /// Rounds whose target commit was at a position the tree did not propose there.
    pub position_miss: u64,
    /// Rounds whose target position was proposed, but with another token.
    pub token_miss: u64,
    /// Drafting time of each round, in order ([`SpotReport::draft_quantile`]).
    pub round_draft: Vec<Duration>,
    /// What the tree builder asked of the drafter over the decode (single-commit trees;
    /// zero for set-valued trees and chains).
    pub drafter: spot_tree::BuildCounts,
}

impl SpotReport {
    /// Records one round.
    pub(crate) fn record(
        &mut self,
        accepted: usize,
        end: RoundEnd,
        draft: Duration,
        verify: Duration,
    ) {
        self.rounds += 1;
        self.draft_time += draft;
        self.round_draft.push(draft);
        self.verify_time += verify;
        if self.accepted.len() <= accepted {
            self.accepted.resize(accepted + 1, 0);
        }
        self.accepted[accepted] += 1;
        match end {
            RoundEnd::Complete => self.complete += 1,
            RoundEnd::Leaf => self.leaf += 1,
            RoundEnd::PositionMiss => self.position_miss += 1,
            RoundEnd::TokenMiss => self.token_miss += 1,
        }
    }

    /// Adds another report (for totals over several decodes).
    pub fn merge(&mut self, other: &SpotReport) {
        self.rounds += other.rounds;
        self.draft_time += other.draft_time;
        self.verify_time += other.verify_time;
        if self.accepted.len() < other.accepted.len() {
            self.accepted.resize(other.accepted.len(), 0);
        }
        for (a, b) in self.accepted.iter_mut().zip(&other.accepted) {
            *a += b;
        }
        self.complete += other.complete;
        self.leaf += other.leaf;
        self.position_miss += other.position_miss;
        self.token_miss += other.token_miss;
        self.round_draft.extend_from_slice(&other.round_draft);
        self.drafter.add(&other.drafter);
    }

    /// Mean draft nodes accepted per round.
    pub fn mean_accepted(&self) -> f64 {
        let total: u64 = self
            .accepted
            .iter()
            .enumerate()
            .map(|(k, &n)| k as u64 * n)
            .sum();
        total as f64 / self.rounds.max(1) as f64
    }

    /// The `q` quantile (nearest rank, `q` in `[0, 1]`) of the rounds' drafting times; zero
    /// without rounds.
    ///
    /// ```
    /// use std::time::Duration;
    /// let r = spot_dlm::SpotReport {
    ///     round_draft: [3, 1, 2, 10].map(Duration::from_millis).to_vec(),
    ///     ..Default::default()
    /// };
    /// assert_eq!(r.draft_quantile(0.5), Duration::from_millis(2));
    /// assert_eq!(r.draft_quantile(0.95), Duration::from_millis(10));
    /// ```
    pub fn draft_quantile(&self, q: f64) -> Duration {
        let mut v = self.round_draft.clone();
        v.sort_unstable();
        let rank = (v.len() as f64 * q.clamp(0.0, 1.0)).ceil() as usize;
        v.get(rank.clamp(1, v.len().max(1)) - 1)
            .copied()
            .unwrap_or_default()
    }

    /// Share of round time spent drafting (tree building and drafter calls).
    pub fn draft_share(&self) -> f64 {
        let d = self.draft_time.as_secs_f64();
        let all = d + self.verify_time.as_secs_f64();
        if all > 0.0 { d / all } else { 0.0 }
    }
}
