//! The MRP baseline as an order scorer (multi-token residual prediction, arXiv 2605.18817):
//! the module ([`Mrp`], in [`module`]) corrects the stale hidden states along a chain of
//! hypothesised commits, and the target's own rule ([`MrpReducer`]) picks each
//! node's position and token from the corrected logits. [`MrpScorer`] is MRP's chain (or,
//! with [`MrpScorer::tree`], a tree over the corrected confidences); [`MrpTokens`] gives any
//! order scorer (SPOT's) the module's tokens.

use std::collections::HashMap;

use burn_tensor::backend::Backend;
use spot_core::{BlockStats, ConfidenceRule, StatsQuery, TokenId};
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError, fill_normalised};

use crate::host::{MrpBuffers, Precision};

pub mod module;

pub use module::{
    DEFAULT_MRP, MRP_FORMAT, Mrp, MrpChoice, MrpFile, MrpReducer, MrpReference, ReferencePosition,
    mrp_weights_path,
};

/// One scored node: the residual it accumulated and its choice per block position with its
/// probability (`None` where committed).
struct Scored {
    acc: Vec<f32>,
    choice: Vec<Option<(TokenId, f32)>>,
}

/// MRP's drafts as an [`OrderScorer`]: at every node, the position the target's rule picks
/// under the corrected logits (score 1, every other position 0) and its choice as the only
/// token hypothesis, so the best-first builder grows one chain of `D` nodes. The corrected
/// logits go through the target's own reduction (the fused host kernel on CPU backends): the
/// choice `argmax(l / T + G)` (never the mask), ranked by the decode's confidence rule
/// ([`MrpScorer::with_rule`]). Where the stale statistics carry no hidden states (a block's
/// first forward served by a look-ahead), the target's rule on the stale statistics.
pub struct MrpScorer<B: Backend> {
    reducer: MrpReducer<B>,
    memo: HashMap<Vec<TokenId>, Scored>,
    fallback: bool,
    rule: ConfidenceRule,
    sample_top_k: Option<usize>,
    tree: bool,
    /// Tokens only (for [`MrpTokens`], which starts each batch with [`MrpScorer::start`]
    /// instead of scoring it): the module runs for a node, and reduces at a position, only
    /// where the builder asks for tokens.
    lazy: bool,
    /// The step's path: the packed host step in this precision, or burn's (`None`).
    precision: Option<Precision>,
    /// Token choices (lazy mode, host step) among the stale top list of each position
    /// instead of the whole vocabulary ([`MrpTokens::with_head`] chooses).
    shortlist: bool,
    buffers: MrpBuffers,
    /// The last step's residuals.
    hc: Vec<f32>,
}

impl<B: Backend> std::fmt::Debug for MrpScorer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrpScorer")
            .field("mrp", self.reducer.mrp())
            .field("rule", &self.rule)
            .field("sample_top_k", &self.sample_top_k)
            .field("precision", &self.precision)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> MrpScorer<B> {
    /// A scorer drafting with `mrp` (shared: one module serves every decoder), for decodes
    /// with the default confidence rule and no top-k truncation, stepping on the host in
    /// `f32` ([`Mrp::host`]).
    pub fn new(mrp: std::sync::Arc<Mrp<B>>) -> Self {
        Self {
            reducer: MrpReducer::new(mrp),
            memo: HashMap::new(),
            fallback: false,
            rule: ConfidenceRule::Probability,
            sample_top_k: None,
            tree: false,
            lazy: false,
            precision: Some(Precision::F32),
            shortlist: false,
            buffers: MrpBuffers::default(),
            hc: Vec::new(),
        }
    }

    /// Steps on the host with products in `precision` ([`Mrp::host`]).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = Some(precision);
        self
    }

    /// Steps through burn's operations on the module's backend ([`Mrp::step`], the training
    /// definition): the reference the host step is checked against.
    pub fn burn(mut self) -> Self {
        self.precision = None;
        self
    }

    /// Scores every masked position by its corrected confidence (normalised over the node's
    /// masked positions, as BlockSpec scores the stale ones) instead of naming only the most
    /// confident: the best-first builder then grows a tree over the corrected statistics,
    /// each drafted position with the module's choice at its corrected probability.
    pub fn tree(mut self) -> Self {
        self.tree = true;
        self
    }

    /// Drafts under the decode's confidence rule and top-k truncation
    /// ([`spot_core::DecodeConfig::confidence`], [`spot_core::DecodeConfig::sample_top_k`]),
    /// so the chain follows the rule the target commits by.
    pub fn with_rule(mut self, rule: ConfidenceRule, sample_top_k: Option<usize>) -> Self {
        self.rule = rule;
        self.sample_top_k = sample_top_k;
        self
    }

    /// The query the target's reduction runs under in this round.
    fn query(&self, ctx: &ScoreContext<'_>) -> StatsQuery {
        let mut q = StatsQuery::new(ctx.temperature, ctx.noise.map_or(0, |g| g.seed()));
        q.rule = self.rule;
        q.sample_top_k = self.sample_top_k;
        q.top_k = 1;
        q
    }

    fn error(&self, reason: impl Into<String>) -> TreeError {
        TreeError::Scorer {
            scorer: "mrp".to_string(),
            reason: reason.into(),
        }
    }

    /// The stale hidden states, checked against the block.
    fn stale_hidden<'s>(&self, stale: &'s BlockStats, l: usize) -> Result<&'s [f32], TreeError> {
        let Some((dim, values)) = stale.hidden() else {
            return Ok(&[]);
        };
        if dim != self.reducer.mrp().hidden_size() || values.len() != l * dim {
            return Err(self.error(format!(
                "hidden states of width {dim} ({} values) for a block of {l}; the module reads \
                 width {}",
                values.len(),
                self.reducer.mrp().hidden_size()
            )));
        }
        Ok(values)
    }
    /// Starts a scored batch: a round's first batch clears the memo; returns the stale
    /// hidden states and sets `fallback` when the target returned none.
    fn start<'s>(
        &mut self,
        ctx: &ScoreContext<'s>,
        nodes: &NodeBatch<'_>,
    ) -> Result<&'s [f32], TreeError> {
        if nodes.depth(0) == 0 {
            self.memo.clear();
        }
        let base = self.stale_hidden(ctx.stale, ctx.root.len())?;
        self.fallback = base.is_empty();
        Ok(base)
    }

    /// Runs the module's step for nodes `which` of `nodes` in one call (each reads the stale
    /// hidden states plus its parent's residuals) and stores each node's residuals in the
    /// memo, its choices not yet reduced.
    fn step_nodes(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        which: &[usize],
        base: &[f32],
    ) -> Result<(), TreeError> {
        if which.is_empty() {
            return Ok(());
        }
        let (l, h, mask) = (
            ctx.root.len(),
            self.reducer.mrp().hidden_size(),
            nodes.mask_id(),
        );
        // 1. Each node's input: the stale hidden states plus its parent's residuals.
        let mut ids = Vec::with_capacity(which.len() * l);
        let mut input = Vec::with_capacity(which.len() * l * h);
        let mut parents = Vec::with_capacity(which.len());
        let mut path = Vec::new();
        for &i in which {
            let tokens = nodes.tokens(i);
            ids.extend_from_slice(tokens);
            nodes.path(i, &mut path);
            let parent = path.last().and_then(|c| {
                let mut p = tokens.to_vec();
                p[c.position] = mask;
                self.memo.get(&p).map(|s| s.acc.clone())
            });
            let acc = parent.unwrap_or_else(|| vec![0.0; l * h]);
            input.extend(base.iter().zip(&acc).map(|(a, b)| a + b));
            parents.push(acc);
        }
        let mrp = std::sync::Arc::clone(self.reducer.mrp());
        let stepped = match self.precision {
            Some(p) => mrp.host(p).step(
                &mut self.buffers,
                (&ids, &input),
                (which.len(), l),
                &mut self.hc,
            ),
            None => mrp.step(&ids, &input, which.len(), l).map(|v| self.hc = v),
        };
        stepped.map_err(|e| self.error(e.to_string()))?;
        let hc = std::mem::take(&mut self.hc);
        // 2. Each node's residuals: its parent's plus its own step's.
        for (k, (&i, mut acc)) in which.iter().zip(parents).enumerate() {
            acc.iter_mut()
                .zip(&hc[k * l * h..(k + 1) * l * h])
                .for_each(|(a, c)| *a += c);
            let choice = vec![None; l];
            self.memo
                .insert(nodes.tokens(i).to_vec(), Scored { acc, choice });
        }
        self.hc = hc;
        Ok(())
    }

    /// The module's choice at `position` of node `i`, once reduced.
    fn choice(&self, nodes: &NodeBatch<'_>, i: usize, position: usize) -> Option<(TokenId, f32)> {
        self.memo
            .get(nodes.tokens(i))
            .and_then(|s| s.choice.get(position).copied().flatten())
    }

    /// Reduces the corrected hidden state (stale plus the node's residuals) at each
    /// `(node, position)` of `wanted` by the target's rule, in one call, and stores each
    /// choice in the node's memo. A row's statistics do not depend on the other rows of the
    /// call, so reducing a few positions gives the values reducing all of them would.
    fn reduce_pairs(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<Vec<MrpChoice>, TreeError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        if self.lazy && self.shortlist && self.precision.is_some() {
            self.choose_in_shortlist(ctx, nodes, wanted)?;
            return Ok(Vec::new());
        }
        let (l, h, mask) = (
            ctx.root.len(),
            self.reducer.mrp().hidden_size(),
            nodes.mask_id(),
        );
        let base = self.stale_hidden(ctx.stale, l)?;
        let query = self.query(ctx);
        let mut rows = Vec::with_capacity(wanted.len() * h);
        let mut positions = Vec::with_capacity(wanted.len());
        for &(i, s) in wanted {
            let Some(memo) = self.memo.get(nodes.tokens(i)) else {
                return Err(self.error("token hypotheses asked of a node that was not scored"));
            };
            rows.extend(
                base[s * h..(s + 1) * h]
                    .iter()
                    .zip(&memo.acc[s * h..(s + 1) * h])
                    .map(|(a, b)| a + b),
            );
            positions.push(s);
        }
        let noise = ctx.noise.filter(|_| ctx.temperature > 0.0);
        let reduced = self
            .reducer
            .reduce(
                rows,
                &positions,
                (ctx.block_start, l),
                &query,
                (mask, noise),
            )
            .map_err(|e| self.error(e.to_string()))?;
        if reduced.len() != wanted.len() {
            return Err(self.error("the reduction returned too few rows"));
        }
        for (&(i, s), r) in wanted.iter().zip(&reduced) {
            if let Some(memo) = self.memo.get_mut(nodes.tokens(i)) {
                memo.choice[s] = Some((r.token, r.token_prob as f32));
            }
        }
        Ok(reduced)
    }
}

impl<B: Backend> MrpScorer<B> {
    /// The choice at each `(node, position)` of `wanted` among the tokens of the stale top
    /// list at that position (the mask and repeats aside), by the target's rule restricted to
    /// them: the largest `l / T + G` (`l` at `T = 0`; ties to the lower id), at its
    /// probability within the list. The head's rows of a few dozen tokens instead of the
    /// whole vocabulary; stored in each node's memo (none where the list is empty, so the
    /// order scorer's tokens stand).
    fn choose_in_shortlist(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        let (l, mask) = (ctx.root.len(), nodes.mask_id());
        let h = self.reducer.mrp().hidden_size();
        let base = self.stale_hidden(ctx.stale, l)?;
        let mrp = std::sync::Arc::clone(self.reducer.mrp());
        let host = mrp.host(Precision::F32);
        let temperature = ctx.temperature;
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let noise = ctx.noise.filter(|_| temperature > 0.0);
        let mut row = vec![0.0f32; h];
        let mut cands: Vec<(TokenId, f32)> = Vec::new();
        for &(i, s) in wanted {
            let Some(memo) = self.memo.get_mut(nodes.tokens(i)) else {
                return Err(self.error("token hypotheses asked of a node that was not scored"));
            };
            for ((r, a), b) in row
                .iter_mut()
                .zip(&base[s * h..(s + 1) * h])
                .zip(&memo.acc[s * h..(s + 1) * h])
            {
                *r = a + b;
            }
            cands.clear();
            for &v in ctx.stale.top(s).0 {
                if v == mask || cands.iter().any(|c| c.0 == v) {
                    continue;
                }
                if let Some(y) = host.logit(&row, v) {
                    cands.push((v, y / t));
                }
            }
            let key = |c: &(TokenId, f32)| match noise {
                Some(g) => c.1 + g.value((ctx.block_start + s) as u64, c.0),
                None => c.1,
            };
            let Some(&best) = cands.iter().reduce(|a, b| {
                let (ka, kb) = (key(a), key(b));
                if kb > ka || (kb == ka && b.0 < a.0) {
                    b
                } else {
                    a
                }
            }) else {
                continue;
            };
            let top = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = cands.iter().map(|c| f64::from(c.1 - top).exp()).sum();
            let prob = f64::from(best.1 - top).exp() / z;
            memo.choice[s] = Some((best.0, prob as f32));
        }
        Ok(())
    }
}

impl<B: Backend> OrderScorer for MrpScorer<B> {
    fn name(&self) -> &str {
        if self.tree { "mrp-tree" } else { "mrp" }
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    /// The host step gives each thread whole states; burn's runs a call as one.
    fn parallel_nodes(&self) -> usize {
        if self.precision.is_some() {
            rayon::current_num_threads()
        } else {
            1
        }
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        let mask = nodes.mask_id();
        if nodes.is_empty() {
            return Ok(());
        }
        let base = self.start(ctx, nodes)?;
        if self.fallback {
            // The target's rule on the stale statistics: its most confident masked position.
            for i in 0..nodes.len() {
                let best = best_position(nodes.tokens(i), mask, |s| ctx.stale.confidence(s));
                if let Some(s) = best {
                    out[i * l + s] = 1.0;
                }
            }
            return Ok(());
        }
        let all: Vec<usize> = (0..nodes.len()).collect();
        self.step_nodes(ctx, nodes, &all, base)?;
        // 3. Corrected hidden states at every masked position of every node, reduced in one
        // call by the target's rule.
        let wanted: Vec<(usize, usize)> = (0..nodes.len())
            .flat_map(|i| (0..l).map(move |s| (i, s)))
            .filter(|&(i, s)| nodes.tokens(i)[s] == mask)
            .collect();
        let reduced = self.reduce_pairs(ctx, nodes, &wanted)?;
        // The corrected probability of each node's choices (0 where committed).
        let mut probs = vec![0.0f32; nodes.len() * l];
        let mut conf = vec![f32::NEG_INFINITY; nodes.len() * l];
        for (&(i, s), r) in wanted.iter().zip(&reduced) {
            conf[i * l + s] = r.confidence as f32;
            probs[i * l + s] = r.token_prob as f32;
        }
        if self.tree {
            // The corrected probability of each choice, as BlockSpec weighs the stale ones.
            fill_normalised(nodes, l, out, |i, s| probs[i * l + s]);
        } else {
            for i in 0..nodes.len() {
                if let Some(s) = best_position(nodes.tokens(i), mask, |s| conf[i * l + s]) {
                    out[i * l + s] = 1.0;
                }
            }
        }
        Ok(())
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        if !self.lazy || self.fallback {
            return Ok(());
        }
        let mut unstepped: Vec<usize> = wanted
            .iter()
            .map(|&(i, _)| i)
            .filter(|&i| !self.memo.contains_key(nodes.tokens(i)))
            .collect();
        unstepped.dedup();
        let base = self.stale_hidden(ctx.stale, ctx.root.len())?;
        self.step_nodes(ctx, nodes, &unstepped, base)?;
        let missing: Vec<(usize, usize)> = wanted
            .iter()
            .copied()
            .filter(|&(i, s)| self.choice(nodes, i, s).is_none())
            .collect();
        self.reduce_pairs(ctx, nodes, &missing)?;
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
        if self.fallback {
            return false;
        }
        // Not prepared (a caller that does not announce its positions): this one alone.
        if self.lazy
            && self.choice(nodes, i, position).is_none()
            && self
                .prepare_hypotheses(ctx, nodes, &[(i, position)])
                .is_err()
        {
            return false;
        }
        match self.choice(nodes, i, position) {
            Some(c) => {
                out.push(c);
                true
            }
            None => false,
        }
    }
}

/// How [`MrpTokens`] chooses the token it writes at a position from the module's corrected
/// hidden state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ModuleHead {
    /// The target's rule among the tokens of the position's stale top list (the 32 the
    /// target's statistics carry): a few dozen rows of the head instead of the whole
    /// vocabulary. The same token as [`ModuleHead::Full`] wherever the module's choice is in
    /// that list (tested); on the benchmark prompts the same forwards to within 0.3%.
    #[default]
    Shortlist,
    /// The target's full reduction over the whole vocabulary: the module's own choice.
    Full,
}

impl ModuleHead {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            ModuleHead::Shortlist => "shortlist",
            ModuleHead::Full => "full",
        }
    }
}

impl std::fmt::Display for ModuleHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModuleHead {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shortlist" => Ok(ModuleHead::Shortlist),
            "full" => Ok(ModuleHead::Full),
            _ => Err(format!("unknown module head {s:?} (shortlist or full)")),
        }
    }
}

/// An order scorer with MRP's tokens: `order` ranks the positions (SPOT's learned order, say)
/// and the module's corrected logits write the token of every drafted position (its choice,
/// at its probability), in place of the stale choice.
pub struct MrpTokens<S, B: Backend> {
    order: S,
    mrp: MrpScorer<B>,
}

impl<S, B: Backend> MrpTokens<S, B> {
    /// `order`'s positions with `mrp`'s tokens.
    pub fn new(order: S, mrp: std::sync::Arc<Mrp<B>>) -> Self {
        let mut mrp = MrpScorer::new(mrp);
        mrp.lazy = true;
        mrp.shortlist = ModuleHead::default() == ModuleHead::Shortlist;
        Self { order, mrp }
    }

    /// How the module's tokens are chosen ([`ModuleHead`]; the shortlist by default).
    pub fn with_head(mut self, head: ModuleHead) -> Self {
        self.mrp.shortlist = head == ModuleHead::Shortlist;
        self
    }

    /// The module's tokens under the decode's confidence rule and top-k truncation
    /// ([`MrpScorer::with_rule`]).
    pub fn with_rule(mut self, rule: ConfidenceRule, sample_top_k: Option<usize>) -> Self {
        self.mrp = self.mrp.with_rule(rule, sample_top_k);
        self
    }

    /// The module steps on the host with products in `precision`
    /// ([`MrpScorer::with_precision`]).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.mrp = self.mrp.with_precision(precision);
        self
    }

    /// The module steps through burn ([`MrpScorer::burn`]).
    pub fn burn(mut self) -> Self {
        self.mrp = self.mrp.burn();
        self
    }
}

impl<S: OrderScorer + Send, B: Backend> OrderScorer for MrpTokens<S, B> {
    fn name(&self) -> &str {
        "spot-mrp"
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    /// The module's step runs beside the order scorer's call on the same nodes, so the two
    /// share the threads.
    fn parallel_nodes(&self) -> usize {
        (self.order.parallel_nodes() / 2).max(1)
    }

    /// The order scorer's call and the module's step for every node of the batch with a
    /// masked position, side by side (on two threads where the pool has them): the step
    /// reads only the nodes' tokens and the stale hidden states, not the order scores, so the
    /// tokens the builder then asks for are ready, and a call of one or two nodes, which
    /// keeps one core busy, overlaps with the other's. A node's residuals do not depend on
    /// the batch it is stepped in, so the tokens are those of stepping on demand.
    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        if nodes.is_empty() {
            return self.order.score(ctx, nodes, out);
        }
        let base = self.mrp.start(ctx, nodes)?;
        if self.mrp.fallback {
            return self.order.score(ctx, nodes, out);
        }
        let mask = nodes.mask_id();
        let open: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes.tokens(i).contains(&mask))
            .collect();
        let (order, mrp) = (&mut self.order, &mut self.mrp);
        // The step on the calling thread, which starts at once: it is the longer of the two
        // in a one-state call (0.22 against 0.21 ms here), and the other waits for a thread,
        // kept awake between the round's calls.
        crate::awake::keep_awake();
        let (stepped, scored) = rayon::join(
            || mrp.step_nodes(ctx, nodes, &open, base),
            || order.score(ctx, nodes, out),
        );
        scored.and(stepped)
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        self.mrp.prepare_hypotheses(ctx, nodes, wanted)?;
        self.order.prepare_hypotheses(ctx, nodes, wanted)
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        let start = out.len();
        if !self.mrp.token_hypotheses(ctx, nodes, i, position, out) {
            return self.order.token_hypotheses(ctx, nodes, i, position, out);
        }
        // The module's token at the order scorer's weight for its first hypothesis (a
        // calibrated hit rate for SPOT), when it has one.
        let mut own = Vec::new();
        if self
            .order
            .token_hypotheses(ctx, nodes, i, position, &mut own)
            && let Some(&(_, w)) = own.first()
        {
            out[start].1 = w;
        }
        true
    }
}

/// The masked position of `tokens` with the highest `conf` (ties to the lower index).
fn best_position(tokens: &[TokenId], mask: TokenId, conf: impl Fn(usize) -> f32) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (s, &t) in tokens.iter().enumerate() {
        if t != mask {
            continue;
        }
        let c = conf(s);
        if best.is_none_or(|b| c > b.1) {
            best = Some((s, c));
        }
    }
    best.map(|b| b.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_best_position_is_masked_and_ties_go_low() {
        let tokens = [9, 0, 0, 9, 0];
        let conf = [0.9, 0.5, 0.7, 0.9, 0.7];
        assert_eq!(best_position(&tokens, 0, |s| conf[s]), Some(2));
        assert_eq!(best_position(&[1, 2], 0, |_| 1.0), None);
    }
}
