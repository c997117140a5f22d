//! The learned drafter as an [`OrderScorer`]: every node of a tree depth in one network call.

use burn_tensor::backend::Backend;
use spot_core::TokenId;
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError, check_block_size};

use crate::analysis::{TokenCalibration, nearest_calibration};
use crate::features::{LiveStale, write_features};
use crate::network::OrderModel;

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
    features: Vec<f32>,
    valid: Vec<f32>,
}

impl<B: Backend> LearnedScorer<B> {
    /// Wraps a trained network.
    pub fn new(model: OrderModel<B>) -> Self {
        Self {
            model,
            features: Vec::new(),
            valid: Vec::new(),
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
        self.features.resize(n * l * nf, 0.0);
        self.valid.resize(n * l, 0.0);
        let mask = nodes.mask_id();
        let stale = LiveStale::new(ctx.stale, ctx.block_start, ctx.noise, mask);
        for i in 0..n {
            let y = nodes.tokens(i);
            write_features(
                &stale,
                y,
                mask,
                nodes.depth(i),
                ctx.temperature,
                &mut self.features[i * l * nf..(i + 1) * l * nf],
            );
            for (s, &t) in y.iter().enumerate() {
                self.valid[i * l + s] = if t == mask { 1.0 } else { 0.0 };
            }
        }
        let p = self.model.probabilities(&self.features, &self.valid, n);
        out[..n * l].copy_from_slice(&p);
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

/// The stale choice and the hedge at `position` of node `i`, weighted by `cal`'s hit rates.
fn calibrated_hypotheses(
    cal: &TokenCalibration,
    ctx: &ScoreContext<'_>,
    nodes: &NodeBatch<'_>,
    i: usize,
    position: usize,
    out: &mut Vec<(TokenId, f32)>,
) {
    let (depth, stale) = (nodes.depth(i), ctx.stale);
    let conf = stale.confidence(position);
    out.push((stale.token(position), cal.top1(depth, conf)));
    if let Some((id, _)) = ctx.hedge_token(position, nodes.mask_id()) {
        out.push((id, cal.runner_up(depth, conf)));
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
///     edges: vec![1.0], top1: vec![vec![0.8]], runner_up: vec![vec![0.1]], temperature: Some(0.0),
/// };
/// let s = Calibrated::new(StaleConfidenceScorer, vec![cal]);
/// assert_eq!(s.name(), StaleConfidenceScorer.name());
/// ```
#[derive(Debug)]
pub struct Calibrated<S> {
    inner: S,
    tables: Vec<TokenCalibration>,
}

impl<S: OrderScorer> Calibrated<S> {
    /// `inner`'s order with token weights from `tables` (one per temperature, or one for any).
    pub fn new(inner: S, tables: Vec<TokenCalibration>) -> Self {
        Self { inner, tables }
    }
}

impl<S: OrderScorer> OrderScorer for Calibrated<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        self.inner.score(ctx, nodes, out)
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        match nearest_calibration(&self.tables, ctx.temperature) {
            Some(cal) => {
                calibrated_hypotheses(cal, ctx, nodes, i, position, out);
                true
            }
            None => self.inner.token_hypotheses(ctx, nodes, i, position, out),
        }
    }
}
