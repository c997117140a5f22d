//! The learned drafter as an [`OrderScorer`]: every node of a tree depth in one network call.

use burn_tensor::backend::Backend;
use spot_core::TokenId;
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError, check_block_size};

use crate::features::{N_FEATURES, write_features};
use crate::network::OrderModel;

/// SPOT's order scorer: `q_φ(s | y)` from the round's stale statistics.
///
/// Token hypotheses are the stale choice (under `T > 0` the noised argmax of the same coupled
/// noise the target uses) and the most probable other token. Without a token calibration in
/// the checkpoint they are the builder's default (stale choice weighted by its stale
/// probability, the runner-up only below the hedge threshold); with one, both are weighted by
/// the calibrated chance that the target commits them (see
/// [`TokenCalibration`](crate::TokenCalibration)).
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
        self.features.resize(n * l * N_FEATURES, 0.0);
        self.valid.resize(n * l, 0.0);
        let mask = nodes.mask_id();
        for i in 0..n {
            let y = nodes.tokens(i);
            write_features(
                ctx.stale,
                y,
                mask,
                nodes.depth(i),
                &mut self.features[i * l * N_FEATURES..(i + 1) * l * N_FEATURES],
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
        let Some(cal) = &self.model.config().token_calibration else {
            return false;
        };
        let (depth, stale) = (nodes.depth(i), ctx.stale);
        let conf = stale.confidence(position);
        out.push((stale.token(position), cal.top1(depth, conf)));
        if let Some((id, _)) = ctx.hedge_token(position, nodes.mask_id()) {
            out.push((id, cal.runner_up(depth, conf)));
        }
        true
    }
}
