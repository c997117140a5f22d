//! Set-valued draft trees for threshold decoding (SPOT-Sets).
//!
//! Under threshold decoding `Φ^τ` one forward commits a *set* of positions: every masked
//! position whose confidence exceeds `τ`, or the single most confident one when none does. A
//! tree of single commits must then hold every intermediate state of a step to reach its end,
//! and the walk skips them; a set tree puts the whole step on one edge.
//!
//! A step is modelled as a *leader*, the position the target is most confident about, ranked
//! by an [`OrderScorer`], plus *followers*. A [`JoinModel`] predicts, per masked position of a
//! hypothesised state, the probability that it clears `τ` when it leads (otherwise the step is
//! the leader alone), that it joins as a follower, and that the written token is the stale
//! choice or the hedge. Followers are independent, so each leader's most probable follower
//! sets are found exactly by switching the cheapest decisions first. The [`SetTreeBuilder`]
//! grows the `D` heaviest states best-first, a node's mass being its parent's times the
//! probability of its step.
//!
//! An example is on the [crate page](crate).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use spot_core::{Commit, TokenId};

use spot_tree::{DraftTree, NodeBatch, OrderScorer, ScoreContext, TreeError};

use crate::beside::{Helper, with_helper};

/// Shape limits of a set-valued draft tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SetTreeConfig {
    /// Budget `D`: the most draft nodes (root excluded); at least 1.
    pub budget: usize,
    /// The most edges (threshold steps) between the root and a node; at least 1.
    pub max_steps: usize,
    /// Mass floor `γ` in `[0, 1)`: nodes less probable than it are not drafted.
    pub gamma: f32,
    /// Children considered per node: its `k` most probable sets; at least 1.
    pub sets_per_node: usize,
}

impl Default for SetTreeConfig {
    fn default() -> Self {
        Self {
            budget: 8,
            max_steps: 16,
            gamma: 0.0,
            sets_per_node: 8,
        }
    }
}

impl SetTreeConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), TreeError> {
        if self.budget == 0 || self.budget >= u32::MAX as usize / 2 {
            return Err(TreeError::config(
                "budget",
                format!("must be in [1, 2^31), got {}", self.budget),
            ));
        }
        if self.max_steps == 0 {
            return Err(TreeError::config("max_steps", "must be at least 1, got 0"));
        }
        if self.sets_per_node == 0 {
            return Err(TreeError::config(
                "sets_per_node",
                "must be at least 1, got 0",
            ));
        }
        if !(self.gamma.is_finite() && (0.0..1.0).contains(&self.gamma)) {
            return Err(TreeError::config(
                "gamma",
                format!("must be in [0, 1), got {}", self.gamma),
            ));
        }
        Ok(())
    }
}

/// What a set drafter predicts at one hypothesised state.
#[derive(Clone, Debug, Default)]
pub struct JoinPrediction {
    /// Per block position: the probability that it clears the threshold when it is the
    /// position the target is most confident about (the step's leader, ranked by the order
    /// scorer); otherwise the step is that position alone.
    pub lead: Vec<f32>,
    /// Per block position: the probability that it joins the target's next threshold step
    /// as a follower (another position leads and clears the threshold).
    pub join: Vec<f32>,
    /// Per block position: the probability that the target writes the stale token there when
    /// it commits it.
    pub token: Vec<f32>,
    /// Per block position: the probability that it writes the hedge instead (the runner-up of
    /// the target's choice rule, [`ScoreContext::hedge_token`]); 0 proposes no hedge.
    pub hedge: Vec<f32>,
    /// Per block position, optional: the two tokens the drafter expects the target to write
    /// there, most likely first, replacing the stale choice and the hedge (`token` and
    /// `hedge` are then their probabilities). Empty, or the mask id in the first slot: the
    /// stale choice and the hedge. Read only when the model
    /// [owns its token weights](JoinModel::owns_token_weights).
    pub choices: Vec<[TokenId; 2]>,
    /// Per block position, optional: a non-negative weight the order scorer's leader
    /// distribution is multiplied by (empty: the order scorer alone), e.g. the odds that the
    /// position leads; renormalised over the candidates with the rest.
    pub leader: Vec<f32>,
}

impl JoinPrediction {
    /// Makes it what [`JoinModel::predict`] expects: `lead`, `join`, `token` and `hedge` sized
    /// to a block of `len` positions and zeroed, no `choices` and no `leader` weights.
    pub fn reset(&mut self, len: usize) {
        for v in [
            &mut self.lead,
            &mut self.join,
            &mut self.token,
            &mut self.hedge,
        ] {
            v.clear();
            v.resize(len, 0.0);
        }
        self.choices.clear();
        self.leader.clear();
    }
}

/// Predicts the target's next threshold step at a hypothesised state: the interface a set
/// drafter implements.
pub trait JoinModel {
    /// A short name for error messages.
    fn name(&self) -> &str;

    /// Whether the drafter reads the target's hidden states
    /// ([`BlockStats::hidden`](spot_core::BlockStats::hidden)): the decoder then asks every
    /// forward for them ([`StatsQuery::hidden_states`](spot_core::StatsQuery::hidden_states)).
    /// `false` by default.
    fn wants_hidden_states(&self) -> bool {
        false
    }

    /// Whether the drafter's own `token` and `hedge` probabilities weigh the written tokens
    /// even when the order scorer has token hypotheses of its own (by default the order
    /// scorer's calibrated hypotheses win).
    fn owns_token_weights(&self) -> bool {
        false
    }

    /// Fills `out.lead`, `out.join`, `out.token` and `out.hedge` (already sized to the block,
    /// zeroed) for the node `state`,
    /// `steps` edges below the root, under threshold `tau`. Values must lie in `[0, 1]`.
    fn predict(
        &mut self,
        ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError>;
}

impl<M: JoinModel + ?Sized> JoinModel for Box<M> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn wants_hidden_states(&self) -> bool {
        (**self).wants_hidden_states()
    }
    fn owns_token_weights(&self) -> bool {
        (**self).owns_token_weights()
    }
    fn predict(
        &mut self,
        ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError> {
        (**self).predict(ctx, state, steps, tau, out)
    }
}

/// The training-free set drafter: the target's threshold rule applied to the stale
/// statistics. A position joins (probability 1) when its stale confidence exceeds `τ` at the
/// root's step, never afterwards (the stale statistics do not change): the tree is the stale
/// threshold step, then single commits ranked by the order scorer, each token weighted by its
/// stale probability, with the hedge token where the stale choice is below 0.6 (BlockSpec's
/// rule).
#[derive(Clone, Copy, Debug, Default)]
pub struct StaleThresholdJoin;

impl JoinModel for StaleThresholdJoin {
    fn name(&self) -> &str {
        "stale-threshold"
    }

    fn predict(
        &mut self,
        ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError> {
        let mask = ctx.root.mask_id();
        for (s, &t) in state.iter().enumerate() {
            let joins = t == mask && steps == 0 && ctx.stale.confidence(s) > tau;
            out.lead[s] = if joins { 1.0 } else { 0.0 };
            out.join[s] = out.lead[s];
            let p = ctx.stale.token_prob(s).clamp(0.0, 1.0);
            out.token[s] = p;
            // BlockSpec's hedge: the runner-up when the stale choice is below 0.6.
            if p < 0.6 && t == mask {
                out.hedge[s] = ctx
                    .hedge_token(s, mask)
                    .map_or(0.0, |h| h.1.clamp(0.0, 1.0));
            }
        }
        Ok(())
    }
}

/// One candidate child: the `rank`-th most probable set of node `node`.
#[derive(Clone, Copy, Debug)]
struct Cand {
    mass: f32,
    node: u32,
    rank: u32,
}

impl PartialEq for Cand {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Cand {
    /// Heavier first, then older nodes, then better-ranked sets (a max-heap pops the greatest).
    fn cmp(&self, other: &Self) -> Ordering {
        self.mass
            .total_cmp(&other.mass)
            .then(other.node.cmp(&self.node))
            .then(other.rank.cmp(&self.rank))
    }
}

/// The most probable sets of one node, best first, as (mass factor, commits).
#[derive(Clone, Debug, Default)]
struct NodeSets {
    factors: Vec<f32>,
    ends: Vec<u32>,
    commits: Vec<Commit>,
    /// Per set, [`set_key`] of its commits (kept by [`add_set`] only: the scratch sets of an
    /// expansion, where each new set is looked up among the earlier ones).
    keys: Vec<u64>,
}

impl NodeSets {
    fn clear(&mut self) {
        self.factors.clear();
        self.ends.clear();
        self.commits.clear();
        self.keys.clear();
    }

    fn set(&self, r: usize) -> &[Commit] {
        let start = if r == 0 { 0 } else { self.ends[r - 1] as usize };
        &self.commits[start..self.ends[r] as usize]
    }
}

/// A candidate leader of a node's next step.
#[derive(Clone, Copy, Debug)]
struct Leader {
    /// The order scorer's probability that it is the leader (normalised).
    q: f32,
    /// Its row in the option table.
    row: usize,
    position: usize,
    /// Probability that it clears `τ` when it leads.
    lead: f32,
    /// (stale token, probability), (hedge or mask, probability).
    tokens: [(TokenId, f32); 2],
}

/// A list from `spare` (or a new one) holding a copy of `from`.
fn reuse(spare: &mut Vec<Vec<u16>>, from: &[u16]) -> Vec<u16> {
    let mut v = spare.pop().unwrap_or_default();
    v.clear();
    v.extend_from_slice(from);
    v
}

/// Adds `set` with `factor` to `sets`, summing the factors when it is already there (the
/// fallback of an empty step and the same position joining alone).
fn add_set(sets: &mut NodeSets, set: &[Commit], factor: f32) {
    if factor <= 0.0 || !factor.is_finite() {
        return;
    }
    let key = set_key(set);
    match (0..sets.factors.len()).find(|&r| sets.keys[r] == key && sets.set(r) == set) {
        Some(r) => sets.factors[r] = (sets.factors[r] + factor).min(1.0),
        None => {
            sets.commits.extend_from_slice(set);
            sets.ends.push(sets.commits.len() as u32);
            sets.factors.push(factor.min(1.0));
            sets.keys.push(key);
        }
    }
}

/// A hash of a set's commits in order (FNV-1a over positions and tokens): equal sets have
/// equal keys, so [`add_set`] compares commits only where the keys agree.
fn set_key(set: &[Commit]) -> u64 {
    set.iter().fold(0xcbf2_9ce4_8422_2325, |h, c| {
        let v = ((c.position as u64) << 32) | u64::from(c.token);
        (h ^ v).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The join model's prediction at one node: what the builder's helper runs.
struct Predict<'a, 'c> {
    model: &'a mut (dyn JoinModel + Send),
    ctx: &'a ScoreContext<'c>,
    /// The node's state.
    state: Vec<TokenId>,
    /// Its edges below the root.
    steps: usize,
    tau: f32,
    pred: JoinPrediction,
    result: Result<(), TreeError>,
}

impl Predict<'_, '_> {
    fn run(&mut self) {
        self.result =
            self.model
                .predict(self.ctx, &self.state, self.steps, self.tau, &mut self.pred);
    }
}

/// Builds set-valued draft trees; keeps its buffers between rounds.
#[derive(Clone, Debug)]
pub struct SetTreeBuilder {
    cfg: SetTreeConfig,
    out: DraftTree,
    sets: Vec<NodeSets>,
    pred: JoinPrediction,
    heap: BinaryHeap<Cand>,
    seen: HashMap<u64, Vec<u32>>,
    /// Option switches: (cost, option row).
    flips: Vec<(f32, usize)>,
    subsets: BinaryHeap<Subset>,
    /// Member lists of finished subsets, kept for the next ones (no allocation per subset).
    spare: Vec<Vec<u16>>,
    set_buf: Vec<Commit>,
    /// The candidate sets of the node being expanded (kept for the next expansion's).
    scratch: NodeSets,
    order_scores: Vec<f32>,
    /// The `(node, position)` pairs whose token hypotheses are asked of the order scorer.
    wanted: Vec<(usize, usize)>,
    /// Per masked position: (position, its options best first as (weight, token or mask)).
    options: Vec<(usize, [(f64, TokenId); 3])>,
    hyps: Vec<(TokenId, f32)>,
    choice: Vec<u8>,
    leaders: Vec<Leader>,
}

/// A subset of the flip list in the k-best enumeration: total cost and its members' indices
/// (sorted, the last one the largest).
#[derive(Clone, Debug, PartialEq)]
struct Subset {
    cost: f32,
    members: Vec<u16>,
}
impl Eq for Subset {}
impl PartialOrd for Subset {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Subset {
    /// Cheaper first (a max-heap pops the greatest), then lexicographically smaller.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .cost
            .total_cmp(&self.cost)
            .then_with(|| other.members.cmp(&self.members))
    }
}

impl SetTreeBuilder {
    /// A builder with limits `cfg`.
    pub fn new(cfg: SetTreeConfig) -> Result<Self, TreeError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            out: DraftTree::default(),
            sets: Vec::new(),
            pred: JoinPrediction::default(),
            heap: BinaryHeap::new(),
            seen: HashMap::new(),
            flips: Vec::new(),
            subsets: BinaryHeap::new(),
            spare: Vec::new(),
            set_buf: Vec::new(),
            scratch: NodeSets::default(),
            order_scores: Vec::new(),
            wanted: Vec::new(),
            options: Vec::new(),
            hyps: Vec::new(),
            choice: Vec::new(),
            leaders: Vec::new(),
        })
    }

    /// The limits.
    pub fn config(&self) -> &SetTreeConfig {
        &self.cfg
    }

    /// Sets the mass floor `γ` of the trees built from now on (an adaptive floor moves it
    /// between rounds); refused outside `[0, 1)` like [`SetTreeConfig::validate`].
    pub fn set_gamma(&mut self, gamma: f32) -> Result<(), TreeError> {
        SetTreeConfig { gamma, ..self.cfg }.validate()?;
        self.cfg.gamma = gamma;
        Ok(())
    }

    /// Sets the budget `D` of the trees built from now on; refused like
    /// [`SetTreeConfig::validate`].
    pub fn set_budget(&mut self, budget: usize) -> Result<(), TreeError> {
        SetTreeConfig { budget, ..self.cfg }.validate()?;
        self.cfg.budget = budget;
        Ok(())
    }

    /// The most recently built tree.
    pub fn tree(&self) -> &DraftTree {
        &self.out
    }

    /// Builds the tree of one round for a target that decodes with threshold `tau` (pass
    /// `f32::INFINITY` for one-commit decoding `Φ`: every step is then the fallback).
    ///
    /// Best-first over the whole tree: the heaviest candidate child is drafted next, so the
    /// tree holds exactly the `D` heaviest states of the candidate tree (each node offering
    /// its `sets_per_node` most probable sets, under the step limit and the mass floor); a
    /// state reached a second time, by other sets, is drafted once.
    pub fn build(
        &mut self,
        ctx: &ScoreContext<'_>,
        tau: f32,
        model: &mut (dyn JoinModel + Send),
        order: &mut (dyn OrderScorer + Send),
    ) -> Result<&DraftTree, TreeError> {
        spot_tree::check_round(ctx)?;
        if tau.is_nan() {
            return Err(TreeError::config("tau", "must not be NaN"));
        }
        self.out.reset(ctx.root);
        self.sets.clear();
        self.heap.clear();
        self.seen.clear();
        self.seen.entry(self.out.hash(0)).or_default().push(0);
        self.sets.push(NodeSets::default());
        let job = Predict {
            model,
            ctx,
            state: Vec::new(),
            steps: 0,
            tau,
            pred: JoinPrediction::default(),
            result: Ok(()),
        };
        // The join model predicts on the pool's other thread while this one runs the order
        // scorer (a one-state call keeps one thread busy), through a helper kept for the
        // whole tree ([`with_helper`]).
        let (grown, _) = with_helper(job, &Predict::run, |helper| self.grow(ctx, helper, order));
        grown?;
        Ok(&self.out)
    }

    /// Drafts the tree's nodes best-first, from the root, until the budget is spent or no
    /// candidate is left.
    fn grow(
        &mut self,
        ctx: &ScoreContext<'_>,
        helper: &Helper<'_, Predict<'_, '_>>,
        order: &mut (dyn OrderScorer + Send),
    ) -> Result<(), TreeError> {
        if !ctx.root.is_complete() {
            self.expand(ctx, (helper, &mut *order), 0, 0)?;
        }
        while self.out.draft_count() < self.cfg.budget {
            let Some(c) = self.heap.pop() else {
                break;
            };
            let (node, rank) = (c.node as usize, c.rank as usize);
            if rank + 1 < self.sets[node].factors.len() {
                let mass = self.out.mass(node) * self.sets[node].factors[rank + 1];
                self.offer(node, rank + 1, mass);
            }
            self.set_buf.clear();
            self.set_buf.extend_from_slice(self.sets[node].set(rank));
            if self.lookup(node).is_some() {
                continue;
            }
            let id = self.out.push_set(node, &self.set_buf, c.mass)?;
            self.seen
                .entry(self.out.hash(id))
                .or_default()
                .push(id as u32);
            self.sets.push(NodeSets::default());
            // The node that fills the budget is not expanded: none of its children could
            // be drafted (the tree is the same, one drafter call fewer).
            let hops = self.out.hops(id);
            let room = self.out.draft_count() < self.cfg.budget;
            if room && hops < self.cfg.max_steps && !self.out.is_complete(id) {
                self.expand(ctx, (helper, &mut *order), id, hops)?;
            }
        }
        Ok(())
    }

    /// The node already holding `node`'s state plus `set_buf`, if any.
    fn lookup(&self, node: usize) -> Option<usize> {
        let h = self.out.successor_hash(node, &self.set_buf);
        self.seen
            .get(&h)?
            .iter()
            .map(|&i| i as usize)
            .find(|&i| self.out.is_successor(i, node, &self.set_buf))
    }

    fn offer(&mut self, node: usize, rank: usize, mass: f32) {
        if mass > 0.0 && mass >= self.cfg.gamma && mass.is_finite() {
            self.heap.push(Cand {
                mass,
                node: node as u32,
                rank: rank as u32,
            });
        }
    }

    /// Adds the `k` most probable follower subsets of a leader (option row `leader`, commit
    /// `lead_in`) to `sets`, each with `base` times its weight relative to the best subset.
    fn followers(
        &mut self,
        sets: &mut NodeSets,
        leader: usize,
        lead_in: Commit,
        base: f64,
        mask: TokenId,
    ) {
        let k = self.cfg.sets_per_node;
        // k-best subsets of flips by total cost: the empty subset, then successors of each
        // popped subset (extend by the next flip; replace its last flip by the next one). A
        // subset switching one row twice, or the leader's row, is no follower set, but its
        // successors are generated.
        self.spare.extend(self.subsets.drain().map(|s| s.members));
        let members = reuse(&mut self.spare, &[]);
        self.subsets.push(Subset { cost: 0.0, members });
        let mut produced = 0usize;
        let mut added = 0usize;
        while produced < 4 * k + 4 && added < k {
            let Some(sub) = self.subsets.pop() else {
                break;
            };
            produced += 1;
            let next = sub.members.last().map_or(0, |&m| usize::from(m) + 1);
            if next < self.flips.len() {
                let mut ext = reuse(&mut self.spare, &sub.members);
                ext.push(next as u16);
                self.subsets.push(Subset {
                    cost: sub.cost + self.flips[next].0,
                    members: ext,
                });
                if let Some(&last) = sub.members.last() {
                    let mut rep = reuse(&mut self.spare, &sub.members);
                    if let Some(end) = rep.last_mut() {
                        *end = next as u16;
                    }
                    self.subsets.push(Subset {
                        cost: sub.cost - self.flips[usize::from(last)].0 + self.flips[next].0,
                        members: rep,
                    });
                }
            }
            self.choice.clear();
            self.choice.resize(self.options.len(), 0);
            let mut valid = true;
            for &m in &sub.members {
                let row = self.flips[usize::from(m)].1;
                if row == leader || self.choice[row] != 0 {
                    valid = false;
                    break;
                }
                let earlier = self.flips[..usize::from(m)]
                    .iter()
                    .filter(|f| f.1 == row)
                    .count();
                self.choice[row] = 1 + earlier as u8;
            }
            // The member list has been read: it goes back for the next subsets.
            self.spare.push(sub.members);
            if !valid {
                continue;
            }
            self.set_buf.clear();
            for (row, &(s, opts)) in self.options.iter().enumerate() {
                let v = if row == leader {
                    lead_in.token
                } else {
                    opts[usize::from(self.choice[row])].1
                };
                if v != mask {
                    self.set_buf.push(Commit::new(s, v));
                }
            }
            let factor = (base * (-f64::from(sub.cost)).exp()) as f32;
            add_set(sets, &self.set_buf, factor);
            added += 1;
        }
    }

    /// Predicts node `id`'s next step and records its most probable sets.
    ///
    /// The step is modelled as a *leader*, the position the target is most confident about
    /// (distributed as the order scorer's `q`), and *followers*. With probability `lead` the
    /// leader clears `τ`, and every other position joins independently with probability
    /// `join`; otherwise the step is the leader alone (the fallback). A committed position
    /// carries the stale token or the hedge, weighted by the order scorer's token hypotheses
    /// when it gives them (SPOT's calibration), else by the join model's `token` and `hedge`.
    fn expand(
        &mut self,
        ctx: &ScoreContext<'_>,
        (helper, order): (&Helper<'_, Predict<'_, '_>>, &mut (dyn OrderScorer + Send)),
        id: usize,
        steps: usize,
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        let mask = ctx.root.mask_id();
        let state = self.out.state(id);
        helper.post(|job| {
            job.state.clear();
            job.state.extend_from_slice(state);
            job.steps = steps;
            job.pred.reset(l);
        });
        self.order_scores.clear();
        self.order_scores.resize(l, 0.0);
        let one = [id as u32];
        let batch = NodeBatch::new(&self.out, &one);
        let scored = order.score(ctx, &batch, &mut self.order_scores);
        let mut job = helper.wait();
        std::mem::swap(&mut self.pred, &mut job.pred);
        std::mem::replace(&mut job.result, Ok(()))?;
        scored?;
        let model = &*job.model;
        // Each masked position has up to three follower options: out (`1 - join`), in with
        // the stale token (`join · token`), in with the hedge (`join · hedge`). Followers are
        // independent: the best subset takes every row's best option, the others switch the
        // cheapest options first.
        let mut log_base = 0.0f64;
        self.options.clear();
        self.flips.clear();
        self.leaders.clear();
        let owns = model.owns_token_weights();
        if !owns {
            self.wanted.clear();
            self.wanted
                .extend((0..l).filter(|&s| state[s] == mask).map(|s| (0, s)));
            order.prepare_hypotheses(ctx, &batch, &self.wanted)?;
        }
        for s in (0..l).filter(|&s| state[s] == mask) {
            let p = &self.pred;
            let (lead, join, t, h) = (p.lead[s], p.join[s], p.token[s], p.hedge[s]);
            for v in [lead, join, t, h] {
                if !(0.0..=1.0).contains(&v) {
                    return Err(TreeError::InvalidScore {
                        scorer: model.name().to_string(),
                        node: id,
                        position: s,
                        value: v,
                    });
                }
            }
            let q = self.order_scores[s] * self.pred.leader.get(s).copied().unwrap_or(1.0);
            if !(q.is_finite() && q >= 0.0) {
                return Err(TreeError::InvalidScore {
                    scorer: order.name().to_string(),
                    node: id,
                    position: s,
                    value: q,
                });
            }
            // The drafter's own two tokens when it names them, else the stale choice and the
            // hedge.
            let (stale, runner_up) = match self.pred.choices.get(s).filter(|_| owns) {
                Some(&[first, second]) if first != mask => {
                    (first, Some(second).filter(|&v| v != mask && v != first))
                }
                _ => (ctx.stale.token(s), ctx.hedge_token(s, mask).map(|(v, _)| v)),
            };
            if stale == mask {
                continue;
            }
            // The order scorer's token weights when it has them (SPOT's calibration, keyed
            // by the noised margin) and the join model does not claim them, else the join
            // model's.
            let (mut t, mut h) = (t, h);
            self.hyps.clear();
            if !owns && order.token_hypotheses(ctx, &batch, 0, s, &mut self.hyps) {
                let weight = |v: Option<TokenId>| {
                    self.hyps
                        .iter()
                        .find(|x| Some(x.0) == v)
                        .map_or(0.0, |x| x.1.clamp(0.0, 1.0))
                };
                (t, h) = (weight(Some(stale)), weight(runner_up));
            }
            let hedge = runner_up.filter(|_| h > 0.0);
            let j = f64::from(join);
            let mut opts = [
                (1.0 - j, mask),
                (j * f64::from(t), stale),
                (
                    hedge.map_or(0.0, |_| j * f64::from(h)),
                    hedge.unwrap_or(mask),
                ),
            ];
            opts.sort_by(|a, b| b.0.total_cmp(&a.0));
            let row = self.options.len();
            if opts[0].0 > 0.0 {
                log_base += opts[0].0.ln();
                for &(w, _) in &opts[1..] {
                    if w > 0.0 {
                        self.flips.push(((opts[0].0 / w).ln() as f32, row));
                    }
                }
            } else {
                log_base = f64::NEG_INFINITY;
            }
            self.options.push((s, opts));
            self.leaders.push(Leader {
                q,
                row,
                position: s,
                lead,
                tokens: [
                    (stale, t),
                    (hedge.unwrap_or(mask), hedge.map_or(0.0, |_| h)),
                ],
            });
        }
        // The order scorer's distribution over the candidates, most likely leaders first.
        let total: f32 = self.leaders.iter().map(|c| c.q).sum();
        let n = self.leaders.len().max(1) as f32;
        for c in &mut self.leaders {
            c.q = if total > 0.0 { c.q / total } else { 1.0 / n };
        }
        self.leaders
            .sort_by(|a, b| b.q.total_cmp(&a.q).then(a.position.cmp(&b.position)));
        // A flip names an option row; the first flip of a row (in cost order) switches it to
        // its second-best option, the second to its third.
        self.flips
            .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.flips.truncate(usize::from(u16::MAX));
        let k = self.cfg.sets_per_node;
        let mut sets = std::mem::take(&mut self.scratch);
        sets.clear();
        for li in 0..self.leaders.len().min(k) {
            let c = self.leaders[li];
            for &(v, t) in c.tokens.iter().filter(|(v, t)| *v != mask && *t > 0.0) {
                let lead_in = Commit::new(c.position, v);
                let w = f64::from(c.q) * f64::from(t);
                // The fallback: the leader alone, below τ.
                add_set(&mut sets, &[lead_in], (w * f64::from(1.0 - c.lead)) as f32);
                // The leader clears τ; its followers join.
                let (o, _) = self.options[c.row].1[0];
                if c.lead > 0.0 && o > 0.0 && log_base > f64::NEG_INFINITY {
                    let base = w * f64::from(c.lead) * (log_base - o.ln()).exp();
                    self.followers(&mut sets, c.row, lead_in, base, mask);
                }
            }
        }
        // Best first after the merges.
        let mut order: Vec<usize> = (0..sets.factors.len()).collect();
        order.sort_by(|&a, &b| sets.factors[b].total_cmp(&sets.factors[a]).then(a.cmp(&b)));
        order.truncate(k);
        let mut sorted = NodeSets::default();
        for r in order {
            sorted.commits.extend_from_slice(sets.set(r));
            sorted.ends.push(sorted.commits.len() as u32);
            sorted.factors.push(sets.factors[r]);
        }
        self.scratch = sets;
        let mass = sorted.factors.first().map(|f| self.out.mass(id) * f);
        self.sets[id] = sorted;
        if let Some(mass) = mass {
            self.offer(id, 0, mass);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_core::stats::PositionStats;
    use spot_core::{BlockState, BlockStats};
    use spot_tree::StaleConfidenceScorer;

    /// Fixed lead, join, token and hedge probabilities, whatever the state.
    #[derive(Clone)]
    struct Fixed {
        lead: Vec<f32>,
        join: Vec<f32>,
        token: Vec<f32>,
        hedge: Vec<f32>,
    }

    impl JoinModel for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn predict(
            &mut self,
            _ctx: &ScoreContext<'_>,
            _state: &[TokenId],
            _steps: usize,
            _tau: f32,
            out: &mut JoinPrediction,
        ) -> Result<(), TreeError> {
            out.lead.copy_from_slice(&self.lead);
            out.join.copy_from_slice(&self.join);
            out.token.copy_from_slice(&self.token);
            out.hedge.copy_from_slice(&self.hedge);
            Ok(())
        }
    }

    /// Stale statistics: position `s` has choice `s + 1` with probability `conf[s]` and
    /// runner-up `s + 11` with the rest.
    fn stale(conf: &[f32]) -> BlockStats {
        let mut st = BlockStats::new(2);
        for (s, &c) in conf.iter().enumerate() {
            let t = s as u32 + 1;
            st.push(PositionStats {
                token: t,
                confidence: c,
                token_prob: c,
                entropy: 1.0,
                tail_mass: 0.0,
                top_ids: &[t, 10 + t],
                top_probs: &[c, 1.0 - c],
            })
            .unwrap();
        }
        st
    }

    /// Every step from the root with its probability under the leader model: leader `a`
    /// with probability `q[a]` (stale confidence normalised), its token (stale or hedge);
    /// alone with probability `1 - lead[a]`, else with every assignment of the followers.
    fn brute_force(m: &Fixed, conf: &[f32]) -> Vec<(Vec<(usize, u32)>, f64)> {
        let l = conf.len();
        let total: f32 = conf.iter().sum();
        let mut out: Vec<(Vec<(usize, u32)>, f64)> = Vec::new();
        let mut add = |mut set: Vec<(usize, u32)>, w: f64| {
            if w <= 0.0 {
                return;
            }
            set.sort_unstable();
            match out.iter_mut().find(|(x, _)| *x == set) {
                Some(e) => e.1 += w,
                None => out.push((set, w)),
            }
        };
        let f = |x: f32| f64::from(x);
        for (a, &c) in conf.iter().enumerate() {
            let q = f(c / total);
            for (v, t) in [(a as u32 + 1, m.token[a]), (a as u32 + 11, m.hedge[a])] {
                let w = q * f(t);
                add(vec![(a, v)], w * (1.0 - f(m.lead[a])));
                for code in 0..3usize.pow(l as u32) {
                    let mut set = vec![(a, v)];
                    let mut wf = w * f(m.lead[a]);
                    for s in (0..l).filter(|&s| s != a) {
                        let o = (code / 3usize.pow(s as u32)) % 3;
                        let j = f(m.join[s]);
                        wf *= [1.0 - j, j * f(m.token[s]), j * f(m.hedge[s])][o];
                        if o > 0 {
                            set.push((s, s as u32 + 1 + if o == 2 { 10 } else { 0 }));
                        }
                    }
                    // Each follower assignment once: the leader's own digit is 0.
                    if (code / 3usize.pow(a as u32)).is_multiple_of(3) {
                        add(set, wf);
                    }
                }
            }
        }
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }

    fn root_ctx<'a>(root: &'a BlockState, st: &'a BlockStats) -> ScoreContext<'a> {
        ScoreContext {
            root,
            stale: st,
            block_start: 0,
            noise: None,
            temperature: 0.0,
        }
    }

    #[test]
    fn root_children_are_the_most_probable_steps() {
        let conf = [0.5f32, 0.4, 0.8, 0.3];
        let st = stale(&conf);
        let root = BlockState::masked(4, 0);
        for hedge in [[0.0f32; 4], [0.3, 0.0, 0.45, 0.2]] {
            let m = Fixed {
                lead: vec![0.9, 0.3, 0.6, 0.5],
                join: vec![0.7, 0.4, 0.55, 0.2],
                token: vec![0.6, 0.9, 0.5, 0.7],
                hedge: hedge.to_vec(),
            };
            let expect = brute_force(&m, &conf);
            let k = 8;
            let cfg = SetTreeConfig {
                budget: k,
                max_steps: 1,
                gamma: 0.0,
                sets_per_node: k,
            };
            let mut b = SetTreeBuilder::new(cfg).unwrap();
            let tree = b
                .build(
                    &root_ctx(&root, &st),
                    0.9,
                    &mut m.clone(),
                    &mut StaleConfidenceScorer,
                )
                .unwrap();
            assert_eq!(tree.draft_count(), k);
            for i in 1..=k {
                let mut got: Vec<(usize, u32)> =
                    tree.edge(i).iter().map(|c| (c.position, c.token)).collect();
                got.sort_unstable();
                assert_eq!(got, expect[i - 1].0, "rank {i}, hedge {hedge:?}");
                let (mass, want) = (f64::from(tree.mass(i)), expect[i - 1].1);
                assert!((mass - want).abs() < 1e-5, "rank {i}: {mass} vs {want}");
            }
        }
    }

    #[test]
    fn masses_fall_along_the_build_and_limits_hold() {
        let conf = [0.5, 0.4, 0.95, 0.2, 0.3, 0.7, 0.1, 0.9];
        let st = stale(&conf);
        let root = BlockState::masked(8, 0);
        let m = Fixed {
            lead: vec![0.8; 8],
            join: vec![0.7, 0.2, 0.9, 0.1, 0.4, 0.6, 0.5, 0.8],
            token: vec![0.9; 8],
            hedge: vec![0.05; 8],
        };
        for (budget, max_steps, gamma) in [(20, 3, 0.0), (40, 8, 0.01), (5, 1, 0.0)] {
            let cfg = SetTreeConfig {
                budget,
                max_steps,
                gamma,
                sets_per_node: 4,
            };
            let mut b = SetTreeBuilder::new(cfg).unwrap();
            let tree = b
                .build(
                    &root_ctx(&root, &st),
                    0.5,
                    &mut m.clone(),
                    &mut StaleConfidenceScorer,
                )
                .unwrap();
            assert!(tree.draft_count() <= budget);
            let mut seen = std::collections::HashSet::new();
            for i in 1..tree.len() {
                assert!(tree.mass(i) <= tree.mass(i - 1) + 1e-7, "best-first order");
                assert!(tree.mass(i) >= gamma);
                assert!(tree.hops(i) <= max_steps);
                assert!(seen.insert(tree.state(i).to_vec()), "states are unique");
            }
        }
    }

    #[test]
    fn out_of_range_predictions_and_limits_are_errors() {
        let st = stale(&[0.5, 0.6]);
        let root = BlockState::masked(2, 0);
        let ctx = root_ctx(&root, &st);
        let mut b = SetTreeBuilder::new(SetTreeConfig::default()).unwrap();
        let mut bad = Fixed {
            lead: vec![0.5; 2],
            join: vec![1.5, 0.2],
            token: vec![1.0; 2],
            hedge: vec![0.0; 2],
        };
        let e = b
            .build(&ctx, 0.9, &mut bad, &mut StaleConfidenceScorer)
            .unwrap_err();
        assert!(e.to_string().contains("fixed"), "{e}");
        assert!(
            b.build(
                &ctx,
                f32::NAN,
                &mut StaleThresholdJoin,
                &mut StaleConfidenceScorer
            )
            .is_err()
        );
        for bad in [
            SetTreeConfig {
                budget: 0,
                ..SetTreeConfig::default()
            },
            SetTreeConfig {
                max_steps: 0,
                ..SetTreeConfig::default()
            },
            SetTreeConfig {
                sets_per_node: 0,
                ..SetTreeConfig::default()
            },
            SetTreeConfig {
                gamma: 1.0,
                ..SetTreeConfig::default()
            },
        ] {
            assert!(SetTreeBuilder::new(bad).is_err());
        }
    }
}
