//! The learned drafter as an [`OrderScorer`]: every node of a tree depth in one network call.

use burn_tensor::backend::Backend;
use std::collections::HashMap;

use spot_core::TokenId;
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError, check_block_size};

use crate::analysis::{CalibrationKey, TokenCalibration, nearest_calibration};
use crate::features::{LiveStale, noised_margin, write_features};
use crate::host::{HostOrderNet, Precision};
use crate::network::OrderModel;
use crate::prior::mix_rows;
use crate::spiffy::{SpiffyScorer, unit_stale_token};
use crate::tilt::tilt_rows;

/// SPOT's order scorer: `q_φ(s | y)` from the round's stale statistics.
///
/// Token hypotheses are the stale choice (under `T > 0` the noised argmax of the same coupled
/// noise the target uses) and the hedge (the runner-up of the same rule,
/// [`ScoreContext::hedge_token`]). Without a token calibration in the checkpoint they are the
/// builder's default (stale choice weighted by its stale probability, the hedge only below the
/// hedge threshold); with one, both are weighted by the calibrated chance that the target
/// commits them, from the table fitted nearest the target's temperature (see
/// [`TokenCalibration`] and
/// [`OrderModelConfig::calibration_for`](crate::OrderModelConfig::calibration_for)).
#[derive(Debug)]
pub struct LearnedScorer<B: Backend> {
    model: OrderModel<B>,
    /// The packed inference path; `None`: the network runs through burn ([`Self::burn`]).
    host: Option<HostOrderNet>,
    probs: Vec<f32>,
    features: Vec<f32>,
    valid: Vec<f32>,
    /// The rank-path prior's scorer, when the checkpoint carries rank paths.
    prior: Option<SpiffyScorer>,
    prior_rows: Vec<f32>,
    /// Nodes deeper than this take their parent's order instead of a network call
    /// ([`LearnedScorer::reuse_below`]); `None`: every node is scored.
    reuse_below: Option<usize>,
    /// This round's order of every node scored so far, by state.
    reused: HashMap<Vec<TokenId>, Vec<f32>>,
    /// The nodes of the current batch the network scores.
    fresh: Vec<usize>,
    /// A parent's order ([`LearnedScorer::parent_row`]).
    parent: Vec<f32>,
    path: Vec<spot_core::Commit>,
    /// The round's stale statistics as the features read them, kept across its calls.
    stale: LiveStale,
}

impl<B: Backend> LearnedScorer<B> {
    /// Wraps a trained network, scoring through its packed host path ([`HostOrderNet`]) in
    /// `f32`.
    pub fn new(model: OrderModel<B>) -> Self {
        Self::with_precision(model, Precision::F32)
    }

    /// Wraps a trained network, scoring through its packed host path with products in
    /// `precision` ([`Precision::Int8`]: faster, and a different tree only where positions
    /// nearly tie).
    pub fn with_precision(model: OrderModel<B>, precision: Precision) -> Self {
        let host = HostOrderNet::with_precision(&model, precision);
        Self {
            host: Some(host),
            ..Self::burn(model)
        }
    }

    /// Wraps a trained network, scoring through burn ([`OrderModel::probabilities`]) on its
    /// own backend: the reference the host path is checked against, and the path for a
    /// network on a device.
    pub fn burn(model: OrderModel<B>) -> Self {
        let prior = model.config().rank_paths.as_ref().map(SpiffyScorer::new);
        Self {
            model,
            host: None,
            probs: Vec::new(),
            features: Vec::new(),
            valid: Vec::new(),
            prior,
            prior_rows: Vec::new(),
            reuse_below: None,
            reused: HashMap::new(),
            fresh: Vec::new(),
            parent: Vec::new(),
            path: Vec::new(),
            stale: LiveStale::default(),
        }
    }

    /// **Approximate drafting, exact output.** Nodes deeper than `depth` below the round's
    /// root are not scored by the network: each takes its parent's order over the positions
    /// still masked, renormalised. Fewer network calls per round; the tree, and so the
    /// forwards, may differ from scoring every node; the decoded tokens do not (the verifier
    /// accepts only the target's own commits).
    pub fn reuse_below(mut self, depth: usize) -> Self {
        self.reuse_below = Some(depth);
        self
    }

    /// Loads into `self.parent` the order of node `i`'s parent (its state with the last
    /// commit masked again), if that parent was scored this round.
    fn parent_row(&mut self, nodes: &NodeBatch<'_>, i: usize, l: usize) -> bool {
        nodes.path(i, &mut self.path);
        let Some(last) = self.path.last() else {
            return false;
        };
        let mut key = nodes.tokens(i).to_vec();
        key[last.position] = nodes.mask_id();
        match self.reused.get(&key) {
            Some(row) if row.len() == l => {
                self.parent.clear();
                self.parent.extend_from_slice(row);
                true
            }
            _ => false,
        }
    }

    /// The network.
    pub fn model(&self) -> &OrderModel<B> {
        &self.model
    }
}

impl<B: Backend> OrderScorer for LearnedScorer<B> {
    fn name(&self) -> &str {
        "spot"
    }

    /// The host path gives each thread whole states; burn's runs a call as one.
    fn parallel_nodes(&self) -> usize {
        if self.host.is_some() {
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
        check_block_size("spot", self.model.config().block_size, l)?;
        let n = nodes.len();
        if n == 0 {
            return Ok(());
        }
        let nf = self.model.config().n_features;
        let mask = nodes.mask_id();
        if nodes.depth(0) == 0 {
            self.reused.clear();
        }
        // The nodes the network scores: all of them, or with a reuse depth those at or above
        // it (and any whose parent was not scored); the others take their parent's order
        // without the position just committed, renormalised, written here.
        self.fresh.clear();
        for i in 0..n {
            let deep = self.reuse_below.is_some_and(|k| nodes.depth(i) > k);
            if !(deep && self.parent_row(nodes, i, l)) {
                self.fresh.push(i);
                continue;
            }
            let (y, parent) = (nodes.tokens(i), &self.parent);
            let total: f32 = (0..l).filter(|&s| y[s] == mask).map(|s| parent[s]).sum();
            for (s, o) in out[i * l..(i + 1) * l].iter_mut().enumerate() {
                *o = if y[s] == mask && total > 0.0 {
                    parent[s] / total
                } else {
                    0.0
                };
            }
        }
        let m = self.fresh.len();
        self.features.resize(m * l * nf, 0.0);
        self.valid.resize(m * l, 0.0);
        self.stale
            .update(ctx.stale, ctx.block_start, ctx.noise, mask);
        let stale = &self.stale;
        for (j, &i) in self.fresh.iter().enumerate() {
            let y = nodes.tokens(i);
            write_features(
                stale,
                y,
                mask,
                nodes.depth(i),
                ctx.temperature,
                &mut self.features[j * l * nf..(j + 1) * l * nf],
            );
            for (s, &t) in y.iter().enumerate() {
                self.valid[j * l + s] = if t == mask { 1.0 } else { 0.0 };
            }
        }
        // (A buffer of its own while `self` is borrowed below; put back at the end.)
        let mut p = std::mem::take(&mut self.probs);
        match &mut self.host {
            Some(host) => {
                p.resize(m * l, 0.0);
                host.probabilities(&self.features, &self.valid, m, &mut p);
            }
            None => p = self.model.probabilities(&self.features, &self.valid, m),
        }
        let tilt = self.model.config().rank_tilt_for(ctx.temperature);
        tilt_rows(&mut p, &self.features, &self.valid, l, nf, tilt);
        let w = self.model.config().rank_prior_for(ctx.temperature);
        if let Some(prior) = self.prior.as_mut().filter(|_| w > 0.0) {
            self.prior_rows.resize(n * l, 0.0);
            prior.score(ctx, nodes, &mut self.prior_rows)?;
            if m < n {
                for (j, &i) in self.fresh.iter().enumerate() {
                    self.prior_rows.copy_within(i * l..(i + 1) * l, j * l);
                }
            }
            mix_rows(&mut p, &self.prior_rows[..m * l], &self.valid, l, w);
        }
        for (j, &i) in self.fresh.iter().enumerate() {
            out[i * l..(i + 1) * l].copy_from_slice(&p[j * l..(j + 1) * l]);
        }
        if self.reuse_below.is_some() {
            for i in 0..n {
                let row = out[i * l..(i + 1) * l].to_vec();
                self.reused.insert(nodes.tokens(i).to_vec(), row);
            }
        }
        self.probs = p;
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
        let Some(cal) = self.model.config().calibration_for(ctx.temperature) else {
            return false;
        };
        calibrated_hypotheses(cal, ctx, nodes, i, position, out);
        true
    }
}

/// The stale choice and the hedge at `position` of node `i`, weighted by `cal`'s hit rates at
/// the position's key (its stale confidence or noised margin, as the recorder stores them).
fn calibrated_hypotheses(
    cal: &TokenCalibration,
    ctx: &ScoreContext<'_>,
    nodes: &NodeBatch<'_>,
    i: usize,
    position: usize,
    out: &mut Vec<(TokenId, f32)>,
) {
    let (depth, stale) = (nodes.depth(i), ctx.stale);
    let (token, conf) = (stale.token(position), stale.confidence(position));
    let hedge = ctx.hedge_token(position, nodes.mask_id());
    let x = match cal.key {
        CalibrationKey::Confidence => conf,
        CalibrationKey::Margin => {
            let at = (ctx.block_start + position) as u64;
            noised_margin((token, conf), hedge, at, ctx.noise)
        }
    };
    out.push((token, cal.top1(depth, x)));
    if let Some((id, _)) = hedge {
        out.push((id, cal.runner_up(depth, x)));
    }
}

/// Any order scorer with SPOT's calibrated token weights: the positions are `S`'s, the token
/// hypotheses (stale choice and hedge) are weighted by the [`TokenCalibration`] fitted nearest
/// the target's temperature, as [`LearnedScorer`] weighs its own. This gives the baselines
/// (BlockSpec's stale-confidence order, Spiffy's graph) everything SPOT has except the learned
/// order, so a comparison measures the order alone. Tree shape only; the output is the
/// draft-free output whatever the weights.
///
/// ```
/// use spot_drafter::{Calibrated, TokenCalibration};
/// use spot_tree::{OrderScorer, StaleConfidenceScorer};
/// let cal = TokenCalibration {
///     key: Default::default(), paths: Default::default(),
///     edges: vec![1.0], top1: vec![vec![0.8]], runner_up: vec![vec![0.1]], temperature: Some(0.0),
/// };
/// let s = Calibrated::new(StaleConfidenceScorer, vec![cal]);
/// assert_eq!(s.name(), StaleConfidenceScorer.name());
/// ```
#[derive(Debug)]
pub struct Calibrated<S> {
    inner: S,
    tokens: TokenRule,
}

/// How [`Calibrated`] weighs the token hypotheses.
#[derive(Debug)]
enum TokenRule {
    /// By the table nearest the temperature (none: `inner`'s own hypotheses).
    Tables(Vec<TokenCalibration>),
    /// The stale choice at weight 1 ([`unit_stale_token`]).
    Unit,
}

impl<S: OrderScorer> Calibrated<S> {
    /// `inner`'s order with token weights from `tables` (one per temperature, or one for any).
    pub fn new(inner: S, tables: Vec<TokenCalibration>) -> Self {
        Self {
            inner,
            tokens: TokenRule::Tables(tables),
        }
    }

    /// `inner`'s order with Spiffy's token rule ([`unit_stale_token`]): every drafted
    /// position takes its stale choice at weight 1, whatever `inner` would weigh it. Separates
    /// what an order model gains from what its token weights gain (`spot bench --methods
    /// spot,spot-unit`).
    pub fn unit(inner: S) -> Self {
        Self {
            inner,
            tokens: TokenRule::Unit,
        }
    }
}

impl<S: OrderScorer> OrderScorer for Calibrated<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn wants_hidden_states(&self) -> bool {
        self.inner.wants_hidden_states()
    }

    fn parallel_nodes(&self) -> usize {
        self.inner.parallel_nodes()
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        self.inner.score(ctx, nodes, out)
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        // The inner scorer's hypotheses are asked only where no table replaces them.
        match &self.tokens {
            TokenRule::Tables(t) if nearest_calibration(t, ctx.temperature).is_none() => {
                self.inner.prepare_hypotheses(ctx, nodes, wanted)
            }
            _ => Ok(()),
        }
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        let tables = match &self.tokens {
            TokenRule::Unit => {
                unit_stale_token(ctx, position, out);
                return true;
            }
            TokenRule::Tables(tables) => tables,
        };
        match nearest_calibration(tables, ctx.temperature) {
            Some(cal) => {
                calibrated_hypotheses(cal, ctx, nodes, i, position, out);
                true
            }
            None => self.inner.token_hypotheses(ctx, nodes, i, position, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use spot_core::{BlockState, BlockStats, stats::PositionStats};
    use spot_tree::{DraftTree, StaleConfidenceScorer};

    use super::*;

    /// A margin-keyed table weighs each position by its noised margin, not its confidence:
    /// two positions of equal confidence get the rates of their own margin bins.
    #[test]
    fn margin_tables_weigh_by_the_margin() {
        const MASK: TokenId = 99;
        let mut stale = BlockStats::new(2);
        // Same confidence; position 0 is decisive over its runner-up, position 1 is not.
        for probs in [[0.5f32, 0.01], [0.5, 0.45]] {
            stale
                .push(PositionStats {
                    token: 5,
                    confidence: 0.5,
                    token_prob: 0.5,
                    entropy: 1.0,
                    tail_mass: 1.0 - probs[0] - probs[1],
                    top_ids: &[5, 6],
                    top_probs: &probs,
                })
                .unwrap();
        }
        let root = BlockState::masked(2, MASK);
        let ctx = ScoreContext {
            root: &root,
            stale: &stale,
            block_start: 0,
            noise: None,
            temperature: 0.0,
        };
        let tree = DraftTree::new(&root);
        let batch = NodeBatch::new(&tree, &[0]);
        let edges = crate::analysis::MARGIN_EDGES.to_vec();
        let ramp: Vec<f32> = (0..edges.len()).map(|b| 0.5 + 0.05 * b as f32).collect();
        let cal = TokenCalibration {
            key: CalibrationKey::Margin,
            top1: vec![ramp.clone()],
            runner_up: vec![ramp.iter().map(|r| 1.0 - r).collect()],
            edges,
            paths: Default::default(),
            temperature: Some(0.0),
        };
        cal.check().unwrap();
        let mut s = Calibrated::new(StaleConfidenceScorer, vec![cal.clone()]);
        let mut hyp = |position| {
            let mut out = Vec::new();
            assert!(s.token_hypotheses(&ctx, &batch, 0, position, &mut out));
            out
        };
        // ln(0.5 / 0.01) = 3.9 nats: bin 6 (<= 4); ln(0.5 / 0.45) = 0.105: bin 0.
        assert_eq!(hyp(0), vec![(5, cal.top1[0][6]), (6, cal.runner_up[0][6])]);
        assert_eq!(hyp(1), vec![(5, cal.top1[0][0]), (6, cal.runner_up[0][0])]);
        // Spiffy's rule over the same order: the stale choice alone, at weight 1; the order
        // is the inner scorer's.
        let mut unit = Calibrated::unit(StaleConfidenceScorer);
        let mut out = Vec::new();
        assert!(unit.token_hypotheses(&ctx, &batch, 0, 1, &mut out));
        assert_eq!(out, vec![(5, 1.0)]);
        let (mut a, mut b) = (vec![0.0; 2], vec![0.0; 2]);
        unit.score(&ctx, &batch, &mut a).unwrap();
        StaleConfidenceScorer.score(&ctx, &batch, &mut b).unwrap();
        assert_eq!(a, b);
    }

    /// An untrained residual network's order is the stale confidences normalised; the rank
    /// tilt of the target's temperature multiplies each by `exp(−λ · rank)`.
    #[test]
    fn the_rank_tilt_leans_the_order_towards_the_ranking() {
        const MASK: TokenId = 99;
        let conf = [0.2f32, 0.5, 0.3];
        let mut stale = BlockStats::new(1);
        for &c in &conf {
            stale
                .push(PositionStats {
                    token: 5,
                    confidence: c,
                    token_prob: c,
                    entropy: 1.0,
                    tail_mass: 1.0 - c,
                    top_ids: &[5],
                    top_probs: &[c],
                })
                .unwrap();
        }
        let root = BlockState::masked(3, MASK);
        let tree = DraftTree::new(&root);
        let batch = NodeBatch::new(&tree, &[0]);
        let order = |tilts: Vec<crate::RankTilt>, temperature: f32| {
            let cfg = crate::OrderModelConfig {
                block_size: 3,
                d_model: 8,
                heads: 2,
                ffn: 8,
                layers: 1,
                ..Default::default()
            };
            let mut net = OrderModel::<burn_flex::Flex<f32>>::init(cfg, 0, &Default::default());
            net.set_rank_tilts(tilts);
            let ctx = ScoreContext {
                root: &root,
                stale: &stale,
                block_start: 0,
                noise: None,
                temperature,
            };
            let mut out = vec![0.0; 3];
            LearnedScorer::new(net)
                .score(&ctx, &batch, &mut out)
                .unwrap();
            out
        };
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
        assert!(
            close(&order(Vec::new(), 0.0), &conf),
            "{:?}",
            order(Vec::new(), 0.0)
        );
        let tilts = vec![
            crate::RankTilt {
                temperature: 0.0,
                tilt: 0.0,
            },
            crate::RankTilt {
                temperature: 1.0,
                tilt: 0.7,
            },
        ];
        // Ranks: position 1 first, 2 second, 0 third.
        let w = [0.2 * (-1.4f32).exp(), 0.5, 0.3 * (-0.7f32).exp()];
        let z: f32 = w.iter().sum();
        let want: Vec<f32> = w.iter().map(|x| x / z).collect();
        assert!(
            close(&order(tilts.clone(), 1.2), &want),
            "{:?}",
            order(tilts.clone(), 1.2)
        );
        assert!(close(&order(tilts, 0.2), &conf));
    }
}
