//! Which drafted tokens the target accepts, and which of the `K` branches a round commits.

use spot_core::{BlockStats, TokenId};

/// How a round picks the branch it commits. Under the coupled rule every branch's accepted
/// streak is known exactly after the one forward, and whichever branch is picked, the tokens
/// committed are the target's own choices: the rule changes how many tokens a round commits,
/// never which.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// SpecDiff-2's self-selection: the branch with the highest expected accepted streak under
    /// the target, `Σ_j Π_{i≤j} p(x_i | prefix, x_{<i})`.
    ExpectedStreak,
    /// The branch whose accepted streak is longest (exact here, see above).
    #[default]
    LongestAccepted,
}

impl Selection {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Selection::ExpectedStreak => "expected-streak",
            Selection::LongestAccepted => "longest",
        }
    }
}

/// The target's view of one scored branch: the statistics that predict its drafted positions
/// (`first`: the entry after the shared tokens, then the branch's own entries).
#[derive(Clone, Copy, Debug)]
pub struct Scored<'a> {
    /// Statistics of the shared tokens; their last entry predicts the first drafted position.
    pub first: (&'a BlockStats, usize),
    /// The branch's statistics (entry `i` predicts drafted position `i + 1`).
    pub branch: &'a BlockStats,
}

impl Scored<'_> {
    /// The statistics entry predicting drafted position `i`.
    pub(crate) fn at(&self, i: usize) -> (&BlockStats, usize) {
        if i == 0 {
            self.first
        } else {
            (self.branch, i - 1)
        }
    }

    /// The target's own choice at drafted position `i` (`i` up to the draft's length: the
    /// last is the bonus token after a fully accepted draft).
    pub fn choice(&self, i: usize) -> TokenId {
        let (s, j) = self.at(i);
        s.token(j)
    }

    /// Accepted streak of `draft` under the coupled rule: how many leading tokens equal the
    /// target's own choices.
    pub fn accepted(&self, draft: &[TokenId]) -> usize {
        draft
            .iter()
            .enumerate()
            .take_while(|&(i, &t)| self.choice(i) == t)
            .count()
    }

    /// Expected accepted streak of `draft` under the target's tempered distribution,
    /// `Σ_j Π_{i≤j} p(x_i)` (a token outside the statistics' top list has probability 0).
    pub fn expected_streak(&self, draft: &[TokenId]) -> f64 {
        let mut run = 1.0;
        let mut sum = 0.0;
        for (i, &t) in draft.iter().enumerate() {
            let (s, j) = self.at(i);
            let (ids, probs) = s.top(j);
            run *= ids
                .iter()
                .position(|&v| v == t)
                .map_or(0.0, |k| f64::from(probs[k]));
            if run == 0.0 {
                break;
            }
            sum += run;
        }
        sum
    }
}

/// The branch `selection` commits (ties to the lower index), with every branch's accepted
/// streak.
pub fn select(
    selection: Selection,
    drafts: &[Vec<TokenId>],
    scored: &[Scored<'_>],
) -> (usize, Vec<usize>) {
    let accepted: Vec<usize> = drafts
        .iter()
        .zip(scored)
        .map(|(d, s)| s.accepted(d))
        .collect();
    let best = match selection {
        Selection::LongestAccepted => {
            (0..drafts.len()).max_by(|&a, &b| accepted[a].cmp(&accepted[b]).then(b.cmp(&a)))
        }
        Selection::ExpectedStreak => (0..drafts.len()).max_by(|&a, &b| {
            let e = |k: usize| scored[k].expected_streak(&drafts[k]);
            e(a).total_cmp(&e(b)).then(b.cmp(&a))
        }),
    };
    (best.unwrap_or(0), accepted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_core::stats::PositionStats;

    fn stats(rows: &[(TokenId, [TokenId; 2], [f32; 2])]) -> BlockStats {
        let mut s = BlockStats::new(2);
        for (t, ids, probs) in rows {
            s.push(PositionStats {
                token: *t,
                confidence: probs[0],
                token_prob: probs[0],
                entropy: 0.5,
                tail_mass: 1.0 - probs[0] - probs[1],
                top_ids: ids,
                top_probs: probs,
            })
            .unwrap();
        }
        s
    }

    #[test]
    fn streaks_and_selection() {
        let shared = stats(&[(4, [4, 5], [0.6, 0.3])]);
        // Branch a drafts [4, 7, 1]: the target chooses 4, then 7, then 2: streak 2.
        let a = stats(&[
            (7, [7, 8], [0.5, 0.4]),
            (2, [2, 1], [0.5, 0.4]),
            (0, [0, 1], [0.9, 0.1]),
        ]);
        // Branch b drafts [5, ...]: rejected at once, but likelier under p past its first token.
        let b = stats(&[
            (9, [9, 3], [0.9, 0.1]),
            (9, [9, 3], [0.9, 0.1]),
            (0, [0, 1], [0.9, 0.1]),
        ]);
        let drafts = vec![vec![4, 7, 1], vec![5, 9, 9]];
        let scored = [
            Scored {
                first: (&shared, 0),
                branch: &a,
            },
            Scored {
                first: (&shared, 0),
                branch: &b,
            },
        ];
        assert_eq!(scored[0].accepted(&drafts[0]), 2);
        assert_eq!(scored[0].choice(2), 2);
        assert_eq!(scored[1].accepted(&drafts[1]), 0);
        // 0.6 + 0.6*0.5 + 0.6*0.5*0.4 = 1.02; 0.3 + 0.27 + 0.243 = 0.813.
        assert!((scored[0].expected_streak(&drafts[0]) - 1.02).abs() < 1e-6);
        assert!((scored[1].expected_streak(&drafts[1]) - 0.813).abs() < 1e-6);
        assert_eq!(
            select(Selection::LongestAccepted, &drafts, &scored),
            (0, vec![2, 0])
        );
        assert_eq!(select(Selection::ExpectedStreak, &drafts, &scored).0, 0);
        // A token outside the top list ends the expected streak.
        assert_eq!(scored[0].expected_streak(&[6, 7]), 0.0);
    }
}
