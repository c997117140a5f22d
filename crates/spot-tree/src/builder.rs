//! Tree builders: layer-batched best-first search (SPOT, BlockSpec) and the chain (SSD).

use std::cmp::Ordering;

use spot_core::{Commit, TokenId};

use crate::error::TreeError;
use crate::scorer::{NodeBatch, OrderScorer, ScoreContext};
use crate::tree::{DraftTree, zobrist};

/// Shape limits of a draft tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeConfig {
    /// Budget `D`: the most draft nodes (root excluded) a tree may hold; at least 1.
    pub budget: usize,
    /// The deepest a node may sit below the root; at least 1.
    pub max_depth: usize,
    /// Mass floor `γ` in `[0, 1)`: candidates with a smaller mass are dropped (SPOT-γ). 0 keeps
    /// every candidate the budget allows.
    pub gamma: f32,
    /// Hedge threshold: when the stale top-1 probability at a position is below it, the
    /// runner-up token is proposed as well. `None` proposes only the stale choice.
    pub hedge: Option<f32>,
    /// When one state is reached by several commit orders, its node carries the sum of their
    /// masses (the walk finds a state by value, from any parent), capped at the kept path's
    /// parent so that a child never outranks its parent. `false` keeps the heaviest path's mass
    /// alone; the tree is then exactly the `D` heaviest states under that rule.
    pub sum_orders: bool,
    /// Which nodes each scorer call takes ([`Expand`]).
    pub expand: Expand,
}

/// How the best-first builder batches its scorer calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expand {
    /// One call per depth with every node of that depth that could still have a child in the
    /// best `D` (few calls; some nodes are scored that a heavier sibling's children later push
    /// out of the tree).
    Layers,
    /// Each call takes the `batch` heaviest nodes not yet scored (across depths) that could
    /// still have a child in the best `D`; their children may push the lighter ones out before
    /// they are scored. More calls of fewer nodes; with `batch` 1 no node is scored whose
    /// children could not enter the tree at that point. With `batch` 1 and without summed
    /// orders the kept set is the same `D` heaviest states as layer by layer (tested); with
    /// summed orders, or more nodes a call, a state found again after its node was scored
    /// keeps its first mass, so the trees can differ slightly.
    BestFirst {
        /// Nodes per call, at least 1; `None`: as many as the scorer scores in about the time
        /// of one ([`OrderScorer::parallel_nodes`]).
        batch: Option<usize>,
    },
}

impl Default for Expand {
    /// Best-first, the scorer's batch: at D = 8 a tree scores 7-8 nodes instead of 12-14, for
    /// forwards within 0.1% on the benchmark prompts (`docs/drafter.md`).
    fn default() -> Self {
        Expand::BestFirst { batch: None }
    }
}

impl Expand {
    /// The command-line spelling: `layers`, `best-first` (the scorer's batch) or
    /// `best-first:K`.
    pub fn name(self) -> String {
        match self {
            Expand::Layers => "layers".into(),
            Expand::BestFirst { batch: None } => "best-first".into(),
            Expand::BestFirst { batch: Some(k) } => format!("best-first:{k}"),
        }
    }
}

impl std::fmt::Display for Expand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Expand {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let batch = match s.split_once(':') {
            None if s == "layers" => return Ok(Expand::Layers),
            None if s == "best-first" => None,
            Some(("best-first", k)) => Some(
                k.parse::<usize>()
                    .ok()
                    .filter(|&k| k >= 1)
                    .ok_or_else(|| format!("best-first:K needs a whole K >= 1, got {k:?}"))?,
            ),
            _ => {
                return Err(format!(
                    "unknown expansion {s:?} (layers, best-first or best-first:K)"
                ));
            }
        };
        Ok(Expand::BestFirst { batch })
    }
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            budget: 8,
            max_depth: 16,
            gamma: 0.0,
            hedge: Some(0.6),
            sum_orders: true,
            expand: Expand::default(),
        }
    }
}

impl TreeConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), TreeError> {
        if self.budget == 0 {
            return Err(TreeError::config("budget", "must be at least 1, got 0"));
        }
        if self.budget >= u32::MAX as usize / 2 {
            return Err(TreeError::config(
                "budget",
                format!("{} is too large", self.budget),
            ));
        }
        if self.max_depth == 0 {
            return Err(TreeError::config("max_depth", "must be at least 1, got 0"));
        }
        if !(self.gamma.is_finite() && (0.0..1.0).contains(&self.gamma)) {
            return Err(TreeError::config(
                "gamma",
                format!("must be in [0, 1), got {}", self.gamma),
            ));
        }
        if let Some(h) = self.hedge
            && !(h.is_finite() && (0.0..=1.0).contains(&h))
        {
            return Err(TreeError::config(
                "hedge",
                format!("must be in [0, 1], got {h}"),
            ));
        }
        if self.expand == (Expand::BestFirst { batch: Some(0) }) {
            return Err(TreeError::config(
                "expand",
                "best-first needs a batch of at least 1",
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    parent: u32,
    commit: Commit,
    mass: f32,
    hash: u64,
    alive: bool,
}

#[derive(Clone, Copy, Debug)]
enum Src {
    Node(u32),
    Cand(u32),
}

/// Selection key: higher mass first, then shallower, then earlier. A child always ranks
/// below its parent (mass never grows along a path, depth does), so any top-`D` set of keys is
/// closed under parents and forms a tree.
#[derive(Clone, Copy, Debug)]
struct Key {
    mass: f32,
    depth: u16,
    order: u32,
    src: Src,
}

fn better(a: &Key, b: &Key) -> Ordering {
    b.mass
        .total_cmp(&a.mass)
        .then(a.depth.cmp(&b.depth))
        .then(a.order.cmp(&b.order))
}

fn invalid_score(scorer: &dyn OrderScorer, node: usize, position: usize, value: f32) -> TreeError {
    TreeError::InvalidScore {
        scorer: scorer.name().to_string(),
        node,
        position,
        value,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Hyp {
    n: u8,
    items: [(TokenId, f32); 2],
}

/// Checks that a round's stale statistics cover its block and that the block fits a tree;
/// returns the block size. Every tree builder (this crate's and the set builder of
/// `spot-sets`) checks its round with it.
pub fn check_round(ctx: &ScoreContext<'_>) -> Result<usize, TreeError> {
    let l = ctx.root.len();
    if ctx.stale.len() != l {
        return Err(TreeError::StaleShape {
            expected: l,
            actual: ctx.stale.len(),
        });
    }
    if l > usize::from(u16::MAX) {
        return Err(TreeError::config(
            "block_size",
            format!("draft trees support blocks of up to 65535 positions, got {l}"),
        ));
    }
    Ok(l)
}

/// Builds draft trees; keeps its buffers between rounds so a round allocates nothing.
///
/// [`build`](Self::build) is the best-first search: children get mass
/// `m(parent) · q(s | parent) · p~_s(v)`, and the tree keeps the `D` nodes of highest mass
/// among everything generated (with `sum_orders` off, exactly the best `D` of the whole
/// candidate tree under the depth limit, because only nodes currently in the best `D` are
/// expanded and a child never outranks its parent). [`TreeConfig::expand`] sets which nodes
/// each scorer call takes: the heaviest not yet scored (the default) or every node of a
/// depth. Identical states reached by different commit orders are merged: the
/// heaviest path stays and, under [`TreeConfig::sum_orders`] (the default), carries the sum of
/// their masses (capped at its parent's), so a node's mass estimates the probability of its
/// state, not of one order. [`build_chain`](Self::build_chain) is the SSD-style single path.
///
/// ```
/// use spot_core::{BlockState, BlockStats, stats::PositionStats};
/// use spot_tree::{ScoreContext, StaleConfidenceScorer, TreeBuilder, TreeConfig};
/// let mut stale = BlockStats::new(2);
/// for (s, p) in [0.9f32, 0.5, 0.7, 0.2].into_iter().enumerate() {
///     let t = s as u32 + 1;
///     stale.push(PositionStats { token: t, confidence: p, token_prob: p, entropy: 1.0,
///         tail_mass: 0.0, top_ids: &[t, 10 + t], top_probs: &[p, 1.0 - p] }).unwrap();
/// }
/// let root = BlockState::masked(4, 0);
/// let ctx = ScoreContext { root: &root, stale: &stale, block_start: 0, noise: None, temperature: 0.0 };
/// let mut b = TreeBuilder::new(TreeConfig { budget: 5, ..TreeConfig::default() }).unwrap();
/// let tree = b.build(&ctx, &mut StaleConfidenceScorer).unwrap();
/// assert_eq!(tree.draft_count(), 5);
/// // The heaviest child commits the most confident position with its stale token.
/// assert_eq!(tree.edge(1), &[spot_core::Commit::new(0, 1)]);
/// ```
#[derive(Clone, Debug)]
pub struct TreeBuilder {
    cfg: TreeConfig,
    arena: DraftTree,
    out: DraftTree,
    /// The nodes of the current scorer call.
    frontier: Vec<u32>,
    /// Nodes kept so far and not yet scored.
    waiting: Vec<u32>,
    /// Per arena node: still among the best `D` (the root always).
    member: Vec<bool>,
    /// Per arena node: scored this round.
    scored: Vec<bool>,
    scores: Vec<f32>,
    cands: Vec<Cand>,
    order: Vec<u32>,
    pool: Vec<Key>,
    selected: Vec<Key>,
    hyps: Vec<Hyp>,
    hyp_buf: Vec<(TokenId, f32)>,
    remap: Vec<u32>,
    wanted: Vec<(usize, usize)>,
    counts: BuildCounts,
}

/// What a [`TreeBuilder`] asked of its scorer, summed over the trees it built since it was
/// made ([`TreeBuilder::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildCounts {
    /// Trees built.
    pub trees: u64,
    /// [`OrderScorer::score`] calls.
    pub scorer_calls: u64,
    /// Nodes scored.
    pub scored_nodes: u64,
    /// (node, position) pairs whose token hypotheses were asked
    /// ([`OrderScorer::prepare_hypotheses`]).
    pub hypothesis_positions: u64,
}

impl BuildCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &BuildCounts) {
        self.trees += other.trees;
        self.scorer_calls += other.scorer_calls;
        self.scored_nodes += other.scored_nodes;
        self.hypothesis_positions += other.hypothesis_positions;
    }

    /// The counts added since `earlier` (a snapshot of the same builder).
    pub fn since(&self, earlier: &BuildCounts) -> BuildCounts {
        BuildCounts {
            trees: self.trees - earlier.trees,
            scorer_calls: self.scorer_calls - earlier.scorer_calls,
            scored_nodes: self.scored_nodes - earlier.scored_nodes,
            hypothesis_positions: self.hypothesis_positions - earlier.hypothesis_positions,
        }
    }
}

impl TreeBuilder {
    /// A builder with limits `cfg`.
    pub fn new(cfg: TreeConfig) -> Result<Self, TreeError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            arena: DraftTree::default(),
            out: DraftTree::default(),
            frontier: Vec::new(),
            waiting: Vec::new(),
            member: Vec::new(),
            scored: Vec::new(),
            scores: Vec::new(),
            cands: Vec::new(),
            order: Vec::new(),
            pool: Vec::new(),
            selected: Vec::new(),
            hyps: Vec::new(),
            hyp_buf: Vec::new(),
            remap: Vec::new(),
            wanted: Vec::new(),
            counts: BuildCounts::default(),
        })
    }

    /// The limits.
    pub fn config(&self) -> &TreeConfig {
        &self.cfg
    }

    /// Sets the mass floor `γ` of the trees built from now on (an adaptive floor moves it
    /// between rounds); refused outside `[0, 1)` like [`TreeConfig::validate`].
    pub fn set_gamma(&mut self, gamma: f32) -> Result<(), TreeError> {
        TreeConfig { gamma, ..self.cfg }.validate()?;
        self.cfg.gamma = gamma;
        Ok(())
    }

    /// What the builder asked of its scorers so far.
    pub fn counts(&self) -> BuildCounts {
        self.counts
    }

    /// The most recently built tree.
    pub fn tree(&self) -> &DraftTree {
        &self.out
    }

    fn prepare(&mut self, ctx: &ScoreContext<'_>) -> Result<(), TreeError> {
        let l = check_round(ctx)?;
        let mask = ctx.root.mask_id();
        self.hyps.clear();
        self.hyps.resize(l, Hyp::default());
        for s in ctx.root.masked_positions() {
            let (tok, p) = (ctx.stale.token(s), ctx.stale.token_prob(s));
            let h = &mut self.hyps[s];
            h.items[0] = (tok, p);
            h.n = 1;
            if self.cfg.hedge.is_some_and(|th| p < th)
                && let Some(item) = ctx.hedge_token(s, mask)
            {
                h.items[1] = item;
                h.n = 2;
            }
        }
        Ok(())
    }

    /// Builds the best-first tree for one round.
    pub fn build(
        &mut self,
        ctx: &ScoreContext<'_>,
        scorer: &mut dyn OrderScorer,
    ) -> Result<&DraftTree, TreeError> {
        self.prepare(ctx)?;
        self.counts.trees += 1;
        self.arena.reset(ctx.root);
        self.selected.clear();
        self.waiting.clear();
        self.member.clear();
        self.member.push(true);
        self.scored.clear();
        self.scored.push(false);
        if !ctx.root.is_complete() {
            self.waiting.push(0);
        }
        let gamma = self.cfg.gamma;
        loop {
            // A candidate must beat the mass of the `D`-th best node so far (once there are
            // `D`) and the floor γ.
            let floor = if self.selected.len() >= self.cfg.budget {
                self.selected
                    .iter()
                    .map(|k| k.mass)
                    .fold(f32::INFINITY, f32::min)
            } else {
                f32::NEG_INFINITY
            };
            // Only nodes that can still have a child in the best `D` are scored: a child's mass
            // never exceeds its parent's, so a node at or below the floor would have every
            // child dropped, and scoring it changes nothing.
            let (arena, member) = (&self.arena, &self.member);
            self.waiting.retain(|&id| {
                let m = arena.mass(id as usize);
                member[id as usize] && m > 0.0 && m > floor && m >= gamma
            });
            if self.waiting.is_empty() {
                break;
            }
            self.frontier.clear();
            match self.cfg.expand {
                Expand::Layers => self.frontier.append(&mut self.waiting),
                Expand::BestFirst { batch } => {
                    let key = |&id: &u32| {
                        let id = id as usize;
                        (arena.mass(id), arena.depth(id), id)
                    };
                    self.waiting.sort_unstable_by(|a, b| {
                        let ((ma, da, ia), (mb, db, ib)) = (key(a), key(b));
                        mb.total_cmp(&ma).then(da.cmp(&db)).then(ia.cmp(&ib))
                    });
                    let batch = batch.unwrap_or_else(|| scorer.parallel_nodes()).max(1);
                    let k = batch.min(self.waiting.len());
                    self.frontier.extend(self.waiting.drain(..k));
                }
            }
            self.expand(ctx, scorer, floor)?;
            self.keep_best()?;
        }
        self.assemble(ctx)
    }

    /// Scores the frontier (one call) and makes the candidates: the children of every frontier
    /// node that could still enter the best `D` (first the positions whose mass clears the
    /// floors, whose token hypotheses the scorer prepares in one go, then their hypotheses),
    /// duplicate states merged.
    fn expand(
        &mut self,
        ctx: &ScoreContext<'_>,
        scorer: &mut dyn OrderScorer,
        floor: f32,
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        let (mask, gamma) = (ctx.root.mask_id(), self.cfg.gamma);
        self.counts.scored_nodes += self.frontier.len() as u64;
        self.counts.scorer_calls += 1;
        self.scores.clear();
        self.scores.resize(self.frontier.len() * l, 0.0);
        let batch = NodeBatch::new(&self.arena, &self.frontier);
        scorer.score(ctx, &batch, &mut self.scores)?;
        self.wanted.clear();
        for fi in 0..self.frontier.len() {
            let m = self.arena.mass(self.frontier[fi] as usize);
            for s in 0..l {
                if batch.tokens(fi)[s] != mask {
                    continue;
                }
                let q = self.scores[fi * l + s];
                if !(q.is_finite() && q >= 0.0) {
                    return Err(invalid_score(scorer, fi, s, q));
                }
                let mq = m * q;
                if mq <= 0.0 || mq <= floor || mq < gamma {
                    continue;
                }
                self.wanted.push((fi, s));
            }
        }
        self.counts.hypothesis_positions += self.wanted.len() as u64;
        scorer.prepare_hypotheses(ctx, &batch, &self.wanted)?;
        self.cands.clear();
        for &(fi, s) in &self.wanted {
            let node = self.frontier[fi] as usize;
            let m = self.arena.mass(node);
            let mq = m * self.scores[fi * l + s];
            self.hyp_buf.clear();
            if !scorer.token_hypotheses(ctx, &batch, fi, s, &mut self.hyp_buf) {
                let h = self.hyps[s];
                self.hyp_buf.extend_from_slice(&h.items[..usize::from(h.n)]);
            }
            for &(v, p) in &self.hyp_buf {
                if !(0.0..=1.0).contains(&p) {
                    return Err(invalid_score(scorer, fi, s, p));
                }
                let mass = mq * p;
                if v == mask || mass <= 0.0 || mass <= floor || mass < gamma {
                    continue;
                }
                self.cands.push(Cand {
                    parent: node as u32,
                    commit: Commit::new(s, v),
                    mass: mass.min(m),
                    hash: self.arena.hash(node) ^ zobrist(s, mask) ^ zobrist(s, v),
                    alive: true,
                });
            }
        }
        for &id in &self.frontier {
            self.scored[id as usize] = true;
        }
        self.dedupe(l);
        if self.cfg.expand != Expand::Layers {
            self.merge_into_members();
        }
        Ok(())
    }

    /// Best-first only (layer by layer, a node's children are all made in one call): a
    /// candidate whose state is already a kept node merges with it as [`Self::dedupe`] merges
    /// two candidates, while the node is not yet scored: the heavier path stays (the node
    /// leaves when the candidate's is heavier) and, under [`TreeConfig::sum_orders`], carries
    /// both masses capped at its parent's. Once the node is scored its children exist, so the
    /// candidate is dropped and the node keeps its mass (with one node per call a later path
    /// is never heavier: it comes through a node scored later, so no heavier).
    fn merge_into_members(&mut self) {
        let sum = self.cfg.sum_orders;
        for c in self.cands.iter_mut().filter(|c| c.alive) {
            let parent = c.parent as usize;
            let arena = &self.arena;
            let same =
                |id: usize| arena.hash(id) == c.hash && arena.is_successor(id, parent, &[c.commit]);
            let Some(k) = self.selected.iter().position(|k| match k.src {
                Src::Node(id) => same(id as usize),
                Src::Cand(_) => false,
            }) else {
                continue;
            };
            let Src::Node(id) = self.selected[k].src else {
                continue;
            };
            let id = id as usize;
            let kept = self.selected[k].mass;
            if self.scored[id] || c.mass <= kept {
                c.alive = false;
                if sum && !self.scored[id] {
                    let cap = self.arena.parent(id).map_or(1.0, |p| self.arena.mass(p));
                    let merged = (kept + c.mass).min(cap);
                    self.selected[k].mass = merged;
                    self.arena.set_mass(id, merged);
                }
            } else {
                // The candidate's path is the heavier: the node leaves, the candidate takes
                // its place in the selection below.
                if sum {
                    c.mass = (c.mass + kept).min(self.arena.mass(parent));
                }
                self.member[id] = false;
                self.selected.swap_remove(k);
            }
        }
    }

    /// Keeps the best `D` of the kept nodes and the candidates: the new members are
    /// materialised in creation order and wait to be scored; the nodes pushed out leave.
    fn keep_best(&mut self) -> Result<(), TreeError> {
        let budget = self.cfg.budget;
        let base = self.arena.len() as u32;
        self.pool.clear();
        self.pool.extend_from_slice(&self.selected);
        let arena = &self.arena;
        self.pool.extend(
            self.cands
                .iter()
                .enumerate()
                .filter(|(_, c)| c.alive)
                .map(|(i, c)| Key {
                    mass: c.mass,
                    depth: arena.depth(c.parent as usize) as u16 + 1,
                    order: base + i as u32,
                    src: Src::Cand(i as u32),
                }),
        );
        if self.pool.len() > budget {
            self.pool.select_nth_unstable_by(budget - 1, better);
            self.pool.truncate(budget);
        }
        for k in &self.selected {
            if let Src::Node(id) = k.src {
                self.member[id as usize] = false;
            }
        }
        self.selected.clear();
        self.order.clear();
        for k in &self.pool {
            match k.src {
                Src::Node(id) => {
                    self.member[id as usize] = true;
                    self.selected.push(*k);
                }
                Src::Cand(i) => self.order.push(i),
            }
        }
        self.order.sort_unstable();
        for &i in &self.order {
            let c = self.cands[i as usize];
            let id = self.arena.push(c.parent as usize, c.commit, c.mass)?;
            self.member.push(true);
            self.scored.push(false);
            let depth = self.arena.depth(id);
            self.selected.push(Key {
                mass: c.mass,
                depth: depth as u16,
                order: id as u32,
                src: Src::Node(id as u32),
            });
            if depth < self.cfg.max_depth && !self.arena.is_complete(id) {
                self.waiting.push(id as u32);
            }
        }
        Ok(())
    }

    /// Marks duplicate states among the candidates dead, keeping the heaviest path of each
    /// (with the sum of their masses under [`TreeConfig::sum_orders`]).
    fn dedupe(&mut self, l: usize) {
        if self.cands.len() < 2 {
            return;
        }
        let mut cands = std::mem::take(&mut self.cands);
        self.order.clear();
        self.order.extend(0..cands.len() as u32);
        self.order.sort_unstable_by(|&a, &b| {
            let (x, y) = (&cands[a as usize], &cands[b as usize]);
            x.hash
                .cmp(&y.hash)
                .then(y.mass.total_cmp(&x.mass))
                .then(a.cmp(&b))
        });
        let (arena, sum) = (&self.arena, self.cfg.sum_orders);
        let value = |c: &Cand, s: usize| {
            if s == c.commit.position {
                c.commit.token
            } else {
                arena.state(c.parent as usize)[s]
            }
        };
        let mut run_start = 0;
        for j in 1..=self.order.len() {
            let same = j < self.order.len()
                && cands[self.order[j] as usize].hash == cands[self.order[run_start] as usize].hash;
            if same {
                continue;
            }
            for a in run_start..j {
                for b in a + 1..j {
                    let (ia, ib) = (self.order[a] as usize, self.order[b] as usize);
                    let (ca, cb) = (&cands[ia], &cands[ib]);
                    if ca.alive && cb.alive && (0..l).all(|s| value(ca, s) == value(cb, s)) {
                        if sum {
                            // One state, two commit orders: its probability is their sum.
                            let merged = (ca.mass + cb.mass).min(arena.mass(ca.parent as usize));
                            cands[ia].mass = merged;
                        }
                        cands[ib].alive = false;
                    }
                }
            }
            run_start = j;
        }
        self.cands = cands;
    }

    fn assemble(&mut self, ctx: &ScoreContext<'_>) -> Result<&DraftTree, TreeError> {
        self.out.reset(ctx.root);
        self.remap.clear();
        self.remap.resize(self.arena.len(), u32::MAX);
        self.remap[0] = 0;
        self.order.clear();
        self.order
            .extend(self.selected.iter().filter_map(|k| match k.src {
                Src::Node(id) => Some(id),
                Src::Cand(_) => None,
            }));
        self.order.sort_unstable();
        for &id in &self.order {
            let id = id as usize;
            let Some(parent) = self.arena.parent(id) else {
                continue;
            };
            let p = self.remap[parent];
            if p == u32::MAX {
                return Err(TreeError::config(
                    "budget",
                    "internal: a selected node lost its parent (please report)",
                ));
            }
            self.remap[id] =
                self.out
                    .push_set(p as usize, self.arena.edge(id), self.arena.mass(id))?
                    as u32;
        }
        Ok(&self.out)
    }

    /// Builds the SSD-style chain: masked positions in order of stale confidence (ties to the
    /// lower index), stale tokens, one path of `min(D, max_depth)` nodes (shorter if the mass
    /// falls below `γ`). The mass of a node is the product of its path's stale probabilities.
    pub fn build_chain(&mut self, ctx: &ScoreContext<'_>) -> Result<&DraftTree, TreeError> {
        self.prepare(ctx)?;
        self.order.clear();
        self.order
            .extend(ctx.root.masked_positions().map(|s| s as u32));
        let stale = ctx.stale;
        self.order.sort_by(|&a, &b| {
            stale
                .token_prob(b as usize)
                .total_cmp(&stale.token_prob(a as usize))
                .then(a.cmp(&b))
        });
        self.out.reset(ctx.root);
        let mut node = 0;
        let mut mass = 1.0f32;
        let n = self.cfg.budget.min(self.cfg.max_depth);
        for &s in self.order.iter().take(n) {
            let s = s as usize;
            mass *= stale.token_prob(s);
            if mass < self.cfg.gamma || stale.token(s) == ctx.root.mask_id() {
                break;
            }
            node = self.out.push(node, Commit::new(s, stale.token(s)), mass)?;
        }
        Ok(&self.out)
    }
}
