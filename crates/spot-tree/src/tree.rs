//! The draft tree: an arena of hypothesised block states with parent links.

pub use spot_core::state::{state_hash, zobrist};
use spot_core::{BlockState, BlockStats, Commit, TokenId};

const NO_PARENT: u32 = u32::MAX;

/// A tree of hypothesised block states rooted at the current (verified) state.
///
/// Blocks of up to 65,535 positions are supported (depths and mask counts are 16-bit).
///
/// Node 0 is the root. Every other node was made from its parent by one commit, or by a set of
/// commits (one step of threshold decoding, [`DraftTree::push_set`]): its *edge*. It carries a
/// *mass*: the drafter's probability of reaching it, e.g.
/// `m(child) = m(parent) · q(s | parent) · p~_s(v)`. A node's *depth* counts the positions
/// committed since the root, not the edges; parents are pushed before their children. States are unique: builders merge states reached by
/// different paths, and [`DraftTree::find_successor`] looks states up by value, so a state is
/// accepted whichever path reached it.
///
/// ```
/// use spot_core::{BlockState, Commit};
/// use spot_tree::DraftTree;
/// let root = BlockState::masked(4, 9);
/// let mut tree = DraftTree::new(&root);
/// let a = tree.push(0, Commit::new(1, 5), 0.5).unwrap();
/// let b = tree.push(a, Commit::new(0, 6), 0.25).unwrap();
/// assert_eq!(tree.state(b), &[6, 5, 9, 9]);
/// assert_eq!(tree.find_successor(0, &[Commit::new(1, 5)]), Some(a));
/// assert_eq!(tree.find_successor(0, &[Commit::new(2, 5)]), None);
/// // A set edge: one threshold step committing positions 2 and 3; its depth is 2.
/// let c = tree.push_set(0, &[Commit::new(2, 7), Commit::new(3, 8)], 0.4).unwrap();
/// assert_eq!((tree.depth(c), tree.edge(c).len()), (2, 2));
/// // The walk looks states up by value: the step {1, 0} from the root reaches `b`.
/// assert_eq!(tree.find_successor(0, &[Commit::new(0, 6), Commit::new(1, 5)]), Some(b));
/// ```
#[derive(Clone, Debug, Default)]
pub struct DraftTree {
    len: usize,
    mask_id: TokenId,
    tokens: Vec<TokenId>,
    parent: Vec<u32>,
    edges: Vec<Commit>,
    edge_end: Vec<u32>,
    mass: Vec<f32>,
    depth: Vec<u16>,
    hash: Vec<u64>,
    masked: Vec<u16>,
}

impl DraftTree {
    /// A tree holding only `root`.
    pub fn new(root: &BlockState) -> Self {
        let mut t = Self::default();
        t.reset(root);
        t
    }

    /// Clears the tree and makes `root` its only node (keeps the allocations).
    pub fn reset(&mut self, root: &BlockState) {
        self.len = root.len();
        self.mask_id = root.mask_id();
        self.tokens.clear();
        self.tokens.extend_from_slice(root.tokens());
        self.parent.clear();
        self.parent.push(NO_PARENT);
        self.edges.clear();
        self.edge_end.clear();
        self.edge_end.push(0);
        self.mass.clear();
        self.mass.push(1.0);
        self.depth.clear();
        self.depth.push(0);
        self.hash.clear();
        self.hash.push(state_hash(root.tokens()));
        self.masked.clear();
        self.masked.push(root.masked_count() as u16);
    }

    /// Adds a child of `parent` made by `commit`, with mass `mass`; returns its index.
    /// Fails when the commit is not valid on the parent's state.
    pub fn push(&mut self, parent: usize, commit: Commit, mass: f32) -> spot_core::Result<usize> {
        self.push_set(parent, &[commit], mass)
    }

    /// Adds a child of `parent` made by the commits `set` at once (one threshold step), with
    /// mass `mass`; returns its index. Fails when `set` is empty, commits a position twice, or
    /// a commit is not valid on the parent's state.
    pub fn push_set(
        &mut self,
        parent: usize,
        set: &[Commit],
        mass: f32,
    ) -> spot_core::Result<usize> {
        let invalid = |c: Commit, reason| spot_core::Error::InvalidCommit {
            position: c.position,
            token: c.token,
            reason,
        };
        let first = set.first().copied().unwrap_or(Commit::new(0, self.mask_id));
        if set.is_empty() {
            return Err(invalid(first, "an edge commits at least one position"));
        }
        if parent >= self.len() {
            return Err(invalid(first, "parent node does not exist"));
        }
        let base = parent * self.len;
        for (i, &c) in set.iter().enumerate() {
            spot_core::state::check_commit(&self.tokens[base..base + self.len], self.mask_id, c)?;
            if set[..i].iter().any(|d| d.position == c.position) {
                return Err(invalid(c, "an edge commits a position twice"));
            }
        }
        self.tokens.extend_from_within(base..base + self.len);
        let row = self.tokens.len() - self.len;
        let mut hash = self.hash[parent];
        for c in set {
            self.tokens[row + c.position] = c.token;
            hash ^= zobrist(c.position, self.mask_id) ^ zobrist(c.position, c.token);
        }
        self.parent.push(parent as u32);
        self.edges.extend_from_slice(set);
        self.edge_end.push(self.edges.len() as u32);
        self.mass.push(mass);
        self.depth.push(self.depth[parent] + set.len() as u16);
        self.hash.push(hash);
        self.masked.push(self.masked[parent] - set.len() as u16);
        Ok(self.parent.len() - 1)
    }

    /// Copies every node of `sub` below node `at`, whose state must equal `sub`'s root; each
    /// copy keeps its edge and its mass times `at`'s. Fails (and leaves the nodes added so far)
    /// when the roots differ.
    ///
    /// ```
    /// use spot_core::{BlockState, Commit};
    /// use spot_tree::DraftTree;
    /// let root = BlockState::from_tokens(vec![9, 9, 9], 9);
    /// let mut tree = DraftTree::new(&root);
    /// let a = tree.push(0, Commit::new(0, 1), 0.5)?;
    /// let mut sub = DraftTree::new(&tree.block_state(a));
    /// sub.push_set(0, &[Commit::new(1, 2), Commit::new(2, 3)], 0.8)?;
    /// tree.graft(a, &sub)?;
    /// assert_eq!(tree.state(2), &[1, 2, 3]);
    /// assert_eq!(tree.mass(2), 0.4);
    /// # Ok::<(), spot_core::Error>(())
    /// ```
    pub fn graft(&mut self, at: usize, sub: &DraftTree) -> spot_core::Result<()> {
        if at >= self.len() || sub.is_empty() || self.state(at) != sub.state(0) {
            return Err(spot_core::Error::ShapeMismatch {
                what: "grafted tree's root (it must equal the node it is grafted at)",
                expected: self.len,
                actual: sub.len,
            });
        }
        let mut map = vec![at];
        for i in 1..sub.len() {
            let parent = map[sub.parent[i] as usize];
            map.push(self.push_set(parent, sub.edge(i), self.mass[at] * sub.mass(i))?);
        }
        Ok(())
    }

    /// Block size.
    pub fn block_len(&self) -> usize {
        self.len
    }

    /// The mask id.
    pub fn mask_id(&self) -> TokenId {
        self.mask_id
    }

    /// Number of nodes, root included.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether the tree has no node (only before the first [`reset`](Self::reset)).
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// Number of draft nodes (root excluded).
    pub fn draft_count(&self) -> usize {
        self.len().saturating_sub(1)
    }

    /// The tokens of node `i`.
    pub fn state(&self, i: usize) -> &[TokenId] {
        &self.tokens[i * self.len..(i + 1) * self.len]
    }

    /// Node `i` as an owned [`BlockState`].
    pub fn block_state(&self, i: usize) -> BlockState {
        BlockState::from_tokens(self.state(i).to_vec(), self.mask_id)
    }

    /// Parent of node `i` (`None` for the root).
    pub fn parent(&self, i: usize) -> Option<usize> {
        let p = self.parent[i];
        (p != NO_PARENT).then_some(p as usize)
    }

    /// The commits that made node `i` from its parent: one for a single-commit edge, several
    /// for a set edge, none for the root.
    pub fn edge(&self, i: usize) -> &[Commit] {
        match i.checked_sub(1) {
            Some(p) => &self.edges[self.edge_end[p] as usize..self.edge_end[i] as usize],
            None => &[],
        }
    }

    /// The commits from the root down to node `i`, edge by edge in order (empty for the root).
    pub fn path(&self, i: usize, out: &mut Vec<Commit>) {
        out.clear();
        let mut n = i;
        while let Some(p) = self.parent(n) {
            out.extend(self.edge(n).iter().rev());
            n = p;
        }
        out.reverse();
    }

    /// Edges from the root down to node `i` (equal to [`depth`](Self::depth) in a tree of
    /// single-commit edges).
    pub fn hops(&self, i: usize) -> usize {
        let mut n = i;
        let mut hops = 0;
        while let Some(p) = self.parent(n) {
            hops += 1;
            n = p;
        }
        hops
    }

    /// Mass of node `i` (1 for the root).
    pub fn mass(&self, i: usize) -> f32 {
        self.mass[i]
    }

    /// Sets node `i`'s mass (the builder's merge of a state reached by another order).
    pub(crate) fn set_mass(&mut self, i: usize, mass: f32) {
        self.mass[i] = mass;
    }

    /// Depth of node `i`: positions committed since the root.
    pub fn depth(&self, i: usize) -> usize {
        usize::from(self.depth[i])
    }

    /// Zobrist hash of node `i`'s state.
    pub fn hash(&self, i: usize) -> u64 {
        self.hash[i]
    }

    /// Masked positions left in node `i`.
    pub fn masked_count(&self, i: usize) -> usize {
        usize::from(self.masked[i])
    }

    /// The block end a round names for its look-ahead: the likeliest complete node; else,
    /// when some node leaves at most `fill` positions masked, the least-masked one (the
    /// heaviest of them) with those positions holding `stale`'s choices. `None` when neither
    /// exists.
    pub fn block_end(&self, stale: &BlockStats, fill: usize) -> Option<BlockState> {
        let complete = (1..self.len())
            .filter(|&i| self.is_complete(i))
            .max_by(|&a, &b| self.mass(a).total_cmp(&self.mass(b)).then(b.cmp(&a)));
        if let Some(i) = complete {
            return Some(self.block_state(i));
        }
        let i = (0..self.len())
            .filter(|&i| self.masked_count(i) <= fill)
            .min_by(|&a, &b| {
                (self.masked_count(a).cmp(&self.masked_count(b)))
                    .then(self.mass(b).total_cmp(&self.mass(a)))
                    .then(a.cmp(&b))
            })?;
        let mask = self.mask_id;
        let tokens = self
            .state(i)
            .iter()
            .enumerate()
            .map(|(s, &t)| if t == mask { stale.token(s) } else { t })
            .collect();
        Some(BlockState::from_tokens(tokens, mask))
    }

    /// Whether node `i` has no masked position (it needs no forward).
    pub fn is_complete(&self, i: usize) -> bool {
        self.masked[i] == 0
    }

    /// The node whose state equals node `from`'s state with `commits` applied, if the tree has
    /// one. Lookup is by state, not by edge, so merged paths are found too.
    pub fn find_successor(&self, from: usize, commits: &[Commit]) -> Option<usize> {
        let h = self.successor_hash(from, commits);
        (0..self.len()).find(|&i| self.hash[i] == h && self.is_successor(i, from, commits))
    }

    /// The hash node `from`'s state would have with `commits` applied.
    pub fn successor_hash(&self, from: usize, commits: &[Commit]) -> u64 {
        commits.iter().fold(self.hash[from], |h, c| {
            h ^ zobrist(c.position, self.mask_id) ^ zobrist(c.position, c.token)
        })
    }

    /// Whether node `i`'s state is node `from`'s state with `commits` applied.
    pub fn is_successor(&self, i: usize, from: usize, commits: &[Commit]) -> bool {
        let base = self.state(from);
        usize::from(self.depth[i]) == usize::from(self.depth[from]) + commits.len()
            && self.state(i).iter().enumerate().all(|(s, &t)| {
                t == commits
                    .iter()
                    .find(|c| c.position == s)
                    .map_or(base[s], |c| c.token)
            })
    }
}
