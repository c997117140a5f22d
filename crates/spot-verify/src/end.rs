//! Why a round stopped where it did: the diagnostics behind "tokens per forward".

use spot_core::Commit;
use spot_tree::DraftTree;

use crate::Walk;

/// How a verified round ended, seen from its last accepted node.
///
/// Only the rounds that end below the block's end tell the drafter anything: a round ends either
/// because the tree had no child at all there ([`RoundEnd::Leaf`]: budget or depth ran out on
/// that path), or because the target committed a position the tree did not propose there
/// ([`RoundEnd::PositionMiss`]), or it committed a proposed position with another token
/// ([`RoundEnd::TokenMiss`]: the order was right, the stale token was stale).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoundEnd {
    /// The block was finished in this round.
    Complete,
    /// The last accepted node has no child in the tree.
    Leaf,
    /// No child of the last accepted node commits the position the target chose.
    PositionMiss,
    /// A child commits the target's position, but with another token.
    TokenMiss,
}

impl RoundEnd {
    /// Classifies a round from its tree and walk (model-free).
    ///
    /// The nodes that extend the last accepted node's state (commits at positions it has
    /// masked, by one edge or several, whatever their recorded parents) are looked up by state,
    /// as the walk does. The round is a token miss when one of them commits exactly the
    /// positions of the target's last step (one position under `Φ`, a set under threshold
    /// decoding) with other tokens, a position miss when none does, a leaf when there are none.
    ///
    /// ```
    /// use spot_core::{BlockState, Commit};
    /// use spot_tree::DraftTree;
    /// use spot_verify::{RoundEnd, Walk};
    ///
    /// let mut tree = DraftTree::new(&BlockState::masked(4, 9));
    /// tree.push(0, Commit::new(1, 5), 0.5).unwrap();
    /// let mut walk = Walk::default();
    /// walk.path.push(0);
    /// walk.commits.push(Commit::new(1, 6)); // the target chose position 1, token 6
    /// walk.step_ends.push(1);
    /// assert_eq!(RoundEnd::classify(&tree, &walk), RoundEnd::TokenMiss);
    /// ```
    pub fn classify(tree: &DraftTree, walk: &Walk) -> RoundEnd {
        if walk.complete {
            return RoundEnd::Complete;
        }
        let cur = walk.last();
        let start = walk
            .step_ends
            .len()
            .checked_sub(2)
            .map_or(0, |i| walk.step_ends[i]);
        let last: &[Commit] = walk.commits.get(start..).unwrap_or(&[]);
        let base = tree.state(cur);
        let mask = tree.mask_id();
        let mut any_child = false;
        let mut same_positions = false;
        for i in 1..tree.len() {
            if tree.depth(i) <= tree.depth(cur) {
                continue;
            }
            let state = tree.state(i);
            let extends = (0..base.len()).all(|s| base[s] == mask || state[s] == base[s]);
            if !extends {
                continue;
            }
            any_child = true;
            let new = (0..base.len()).filter(|&s| state[s] != base[s]);
            same_positions |= tree.depth(i) - tree.depth(cur) == last.len()
                && new
                    .into_iter()
                    .all(|s| last.iter().any(|c| c.position == s));
        }
        match (any_child, same_positions) {
            (false, _) => RoundEnd::Leaf,
            (true, true) => RoundEnd::TokenMiss,
            (true, false) => RoundEnd::PositionMiss,
        }
    }
}
