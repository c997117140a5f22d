//! Order scorers: who ranks the masked positions of a hypothesised state.
//!
//! An [`OrderScorer`] returns `q(s | y)`, a distribution over the positions still masked in
//! each node `y` of a batch, from the round's stale statistics. The tree builder calls it with
//! batches of the nodes it expands ([`TreeConfig::expand`](crate::TreeConfig::expand)). The
//! learned SPOT drafter implements this trait; the baselines here need no training.

use std::collections::HashMap;

use spot_core::{BlockState, BlockStats, Commit, DecodeTrace, GumbelNoise, TokenId};

use crate::error::TreeError;
use crate::tree::DraftTree;

/// What every node of a round shares.
#[derive(Clone, Copy, Debug)]
pub struct ScoreContext<'a> {
    /// The verified state the tree grows from.
    pub root: &'a BlockState,
    /// The target's statistics at the root's parent (the stale distribution `p~`).
    pub stale: &'a BlockStats,
    /// Absolute position of the block's first slot.
    pub block_start: usize,
    /// The target's coupled noise when it decodes at `T > 0` (`None` at `T = 0`). The drafter
    /// knows `G` because the target's choice is `argmax(l / T + G)` with `G` a function of
    /// (seed, absolute position, token): the hedge is then the noised runner-up
    /// ([`ScoreContext::hedge_token`]).
    pub noise: Option<GumbelNoise>,
    /// The target's decoding temperature (0 for greedy decoding). Learned scorers read it as a
    /// feature; the stale statistics are already tempered by it.
    pub temperature: f32,
}

impl ScoreContext<'_> {
    /// The hedge's token at position `s` with its stale probability: the runner-up of the
    /// target's own choice rule among the stale top-k, other than the stale choice and the
    /// mask. At `T = 0` that is the most probable other token ([`stale_runner_up`]); at
    /// `T > 0` the one with the largest noised score `ln p~(v) + G[block_start + s, v]`
    /// (the tempered log-probability differs from `l / T` by a constant per position). `None`
    /// when no other token has positive probability.
    pub fn hedge_token(&self, s: usize, mask: TokenId) -> Option<(TokenId, f32)> {
        noised_runner_up(
            self.stale,
            s,
            (self.block_start + s) as u64,
            self.noise,
            mask,
        )
    }
}

/// The runner-up of the target's choice rule at position `s` of `stale` (absolute position
/// `position`), with its stale probability: the token of the stale top-k, other than the stale
/// choice and the mask, with the largest noised score `ln p~(v) + G[position, v]` under
/// `noise`, or the most probable one without noise ([`stale_runner_up`]). Ties go to the more
/// probable token, as the target breaks them. `None` when no other token has positive
/// probability. [`ScoreContext::hedge_token`] calls it; trajectory recorders store it.
///
/// ```
/// use spot_core::{BlockStats, GumbelNoise, stats::PositionStats};
/// let mut st = BlockStats::new(3);
/// st.push(PositionStats {
///     token: 5, confidence: 0.6, token_prob: 0.6, entropy: 1.0, tail_mass: 0.0,
///     top_ids: &[5, 6, 7], top_probs: &[0.6, 0.3, 0.1],
/// }).unwrap();
/// assert_eq!(spot_tree::noised_runner_up(&st, 0, 40, None, 99), Some((6, 0.3)));
/// let (id, _) = spot_tree::noised_runner_up(&st, 0, 40, Some(GumbelNoise::new(1)), 99).unwrap();
/// assert!(id == 6 || id == 7);
/// ```
pub fn noised_runner_up(
    stale: &BlockStats,
    s: usize,
    position: u64,
    noise: Option<GumbelNoise>,
    mask: TokenId,
) -> Option<(TokenId, f32)> {
    let Some(noise) = noise else {
        return stale_runner_up(stale, s, mask);
    };
    let tok = stale.token(s);
    let (ids, probs) = stale.top(s);
    ids.iter()
        .zip(probs)
        .filter(|(id, p)| **id != tok && **id != mask && **p > 0.0)
        .map(|(&id, &p)| (id, p, p.ln() + noise.value(position, id)))
        // The first of equal scores (the more probable one), as the target breaks ties.
        .fold(None, |best: Option<(TokenId, f32, f32)>, c| match best {
            Some(b) if b.2 >= c.2 => Some(b),
            _ => Some(c),
        })
        .map(|(id, p, _)| (id, p))
}

/// A batch of tree nodes to score, in the order scores must be written.
#[derive(Clone, Copy, Debug)]
pub struct NodeBatch<'a> {
    tree: &'a DraftTree,
    ids: &'a [u32],
}

impl<'a> NodeBatch<'a> {
    /// A batch of the nodes `ids` of `tree`.
    pub fn new(tree: &'a DraftTree, ids: &'a [u32]) -> Self {
        Self { tree, ids }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Tokens of the `i`-th node.
    pub fn tokens(&self, i: usize) -> &'a [TokenId] {
        self.tree.state(self.ids[i] as usize)
    }

    /// Depth of the `i`-th node below the root.
    pub fn depth(&self, i: usize) -> usize {
        self.tree.depth(self.ids[i] as usize)
    }

    /// The commits from the root down to the `i`-th node, in order.
    pub fn path(&self, i: usize, out: &mut Vec<Commit>) {
        self.tree.path(self.ids[i] as usize, out);
    }

    /// State hash of the `i`-th node.
    pub fn hash(&self, i: usize) -> u64 {
        self.tree.hash(self.ids[i] as usize)
    }

    /// The mask id.
    pub fn mask_id(&self) -> TokenId {
        self.tree.mask_id()
    }
}

/// Scores the masked positions of a batch of hypothesised states.
pub trait OrderScorer {
    /// A short name for errors and reports.
    fn name(&self) -> &str;

    /// Writes `q(s | y_i)` into `out[i * L + s]` for every node `i` of `nodes` and every
    /// position `s` masked in it. Values must be finite and non-negative; values at committed
    /// positions are ignored; they need not sum to one (the builder uses them as given, so a
    /// scorer that under-normalises only lowers masses).
    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError>;

    /// How many nodes one [`OrderScorer::score`] call scores in about the time of one (the
    /// states it spreads over threads): the best-first builder's batch when none is set
    /// ([`Expand::BestFirst`](crate::Expand::BestFirst)). 1 by default.
    fn parallel_nodes(&self) -> usize {
        1
    }

    /// Whether the scorer reads the target's hidden states
    /// ([`BlockStats::hidden`](spot_core::BlockStats::hidden)) in [`ScoreContext::stale`]: the
    /// decoder then asks every forward for them
    /// ([`StatsQuery::hidden_states`](spot_core::StatsQuery::hidden_states)). `false` by
    /// default.
    fn wants_hidden_states(&self) -> bool {
        false
    }

    /// Called once per scored batch, after [`OrderScorer::score`] and before any
    /// [`OrderScorer::token_hypotheses`] call for it, with every `(node, position)` pair whose
    /// hypotheses the builder will ask (node indices into `nodes`, in increasing order). A
    /// scorer whose hypotheses are costly computes them here in one go, for these pairs only.
    /// No-op by default.
    fn prepare_hypotheses(
        &mut self,
        _ctx: &ScoreContext<'_>,
        _nodes: &NodeBatch<'_>,
        _wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        Ok(())
    }

    /// Optionally replaces the token hypotheses `H(s)` for `position` of the `i`-th node.
    /// Return `true` after writing `(token, probability)` pairs into `out`; the default returns
    /// `false` and the builder uses the stale choice (and the hedge).
    fn token_hypotheses(
        &mut self,
        _ctx: &ScoreContext<'_>,
        _nodes: &NodeBatch<'_>,
        _i: usize,
        _position: usize,
        _out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        false
    }
}

/// The most probable token of the stale top-k at position `s` other than the stale choice and
/// the mask, with its stale probability (`None` when there is none with positive
/// probability): the hedge at `T = 0` (see [`ScoreContext::hedge_token`], which builders and
/// scorers call).
pub fn stale_runner_up(stale: &BlockStats, s: usize, mask: TokenId) -> Option<(TokenId, f32)> {
    let tok = stale.token(s);
    let (ids, probs) = stale.top(s);
    ids.iter()
        .zip(probs)
        .find(|(id, p)| **id != tok && **id != mask && **p > 0.0)
        .map(|(&id, &p)| (id, p))
}

/// `Err(TreeError::Scorer)` naming `scorer` when the block size differs from the one it was
/// built for.
pub fn check_block_size(scorer: &str, built_for: usize, block: usize) -> Result<(), TreeError> {
    if built_for == block {
        return Ok(());
    }
    Err(TreeError::Scorer {
        scorer: scorer.into(),
        reason: format!("built for block size {built_for}, block has {block}"),
    })
}

/// Writes, for every node of `nodes`, `weight(i, s)` at its masked positions normalised to sum
/// to one (uniform when every weight is zero) and zero at committed positions.
pub fn fill_normalised(
    nodes: &NodeBatch<'_>,
    block_len: usize,
    out: &mut [f32],
    weight: impl Fn(usize, usize) -> f32,
) {
    let mask = nodes.mask_id();
    for (i, row) in out.chunks_mut(block_len).enumerate().take(nodes.len()) {
        let tokens = nodes.tokens(i);
        let mut z = 0.0f32;
        for (s, o) in row.iter_mut().enumerate() {
            *o = if tokens[s] == mask {
                weight(i, s).max(0.0)
            } else {
                0.0
            };
            z += *o;
        }
        let n = tokens.iter().filter(|&&t| t == mask).count().max(1) as f32;
        for (s, o) in row.iter_mut().enumerate() {
            if z > 0.0 {
                *o /= z;
            } else if tokens[s] == mask {
                *o = 1.0 / n;
            }
        }
    }
}

/// BlockSpec-style scorer: `q(s | y)` is the stale confidence (probability of the stale
/// choice) normalised over the positions masked in `y`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StaleConfidenceScorer;

impl OrderScorer for StaleConfidenceScorer {
    fn name(&self) -> &str {
        "stale-confidence"
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        fill_normalised(nodes, ctx.root.len(), out, |_, s| ctx.stale.token_prob(s));
        Ok(())
    }
}

/// Scores positions with seeded pseudo-random weights (a control for tests and ablations).
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomScorer {
    /// Seed of the weights.
    pub seed: u64,
}

impl OrderScorer for RandomScorer {
    fn name(&self) -> &str {
        "random"
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        fill_normalised(nodes, ctx.root.len(), out, |i, s| {
            let h = spot_core::state::mix64(nodes.hash(i) ^ self.seed ^ s as u64);
            (h >> 40) as f32 / (1u64 << 24) as f32
        });
        Ok(())
    }
}

/// The upper bound: a scorer told the true future commits (from a draft-free trace).
///
/// On a state the draft-free decoder actually visits, it puts all mass on the position the
/// target commits next; elsewhere it scores nothing. With `with_tokens` it also proposes the
/// true token (probability 1); without, tokens come from the stale statistics as for any other
/// scorer (the paper's *position oracle*).
#[derive(Clone, Debug, Default)]
pub struct OracleScorer {
    next: HashMap<(usize, Vec<TokenId>), Commit>,
    with_tokens: bool,
}

impl OracleScorer {
    /// Builds the oracle from the trace of a draft-free decode with the same inputs.
    pub fn from_trace(trace: &DecodeTrace, with_tokens: bool) -> Result<Self, TreeError> {
        let mut next = HashMap::new();
        for block in &trace.blocks {
            let mut state = block.initial.clone();
            for step in &block.steps {
                if let Some(&c) = step.first() {
                    next.insert((block.start, state.tokens().to_vec()), c);
                }
                for &c in step {
                    state.commit(c)?;
                }
            }
        }
        Ok(Self { next, with_tokens })
    }

    fn lookup(&self, start: usize, tokens: &[TokenId]) -> Option<Commit> {
        self.next.get(&(start, tokens.to_vec())).copied()
    }
}

impl OrderScorer for OracleScorer {
    fn name(&self) -> &str {
        if self.with_tokens {
            "oracle"
        } else {
            "position-oracle"
        }
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        for (i, chunk) in out.chunks_mut(l).enumerate().take(nodes.len()) {
            chunk.fill(0.0);
            if let Some(c) = self.lookup(ctx.block_start, nodes.tokens(i)) {
                chunk[c.position] = 1.0;
            }
        }
        Ok(())
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        if !self.with_tokens {
            return false;
        }
        match self.lookup(ctx.block_start, nodes.tokens(i)) {
            Some(c) if c.position == position => {
                out.push((c.token, 1.0));
                true
            }
            _ => false,
        }
    }
}

/// The token oracle: positions ranked by stale confidence (as [`StaleConfidenceScorer`]), each
/// proposed with the token the draft-free decode finally commits there (from its trace) instead
/// of the stale choice. With [`OracleScorer`] (true positions, and with tokens both) it bounds
/// what a better token model alone, a better order model alone, and both, could save.
#[derive(Clone, Debug)]
pub struct TokenOracleScorer {
    truth: HashMap<usize, TokenId>,
}

impl TokenOracleScorer {
    /// Builds the oracle from the trace of a draft-free decode with the same inputs.
    ///
    /// ```
    /// use spot_core::{BlockState, BlockTrace, Commit, DecodeTrace};
    /// use spot_tree::TokenOracleScorer;
    /// let trace = DecodeTrace { blocks: vec![BlockTrace {
    ///     start: 8,
    ///     initial: BlockState::masked(2, 9),
    ///     steps: vec![vec![Commit { position: 1, token: 4 }], vec![Commit { position: 0, token: 5 }]],
    /// }] };
    /// let oracle = TokenOracleScorer::from_trace(&trace);
    /// assert_eq!((oracle.token_at(8), oracle.token_at(9), oracle.token_at(10)), (Some(5), Some(4), None));
    /// ```
    pub fn from_trace(trace: &DecodeTrace) -> Self {
        let mut truth = HashMap::new();
        for block in &trace.blocks {
            for c in block.steps.iter().flatten() {
                truth.insert(block.start + c.position, c.token);
            }
        }
        Self { truth }
    }

    /// The token the draft-free decode committed at absolute position `position`.
    pub fn token_at(&self, position: usize) -> Option<TokenId> {
        self.truth.get(&position).copied()
    }
}

impl OrderScorer for TokenOracleScorer {
    fn name(&self) -> &str {
        "token-oracle"
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        StaleConfidenceScorer.score(ctx, nodes, out)
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        _nodes: &NodeBatch<'_>,
        _i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        match self.token_at(ctx.block_start + position) {
            Some(t) => {
                out.push((t, 1.0));
                true
            }
            None => false,
        }
    }
}
