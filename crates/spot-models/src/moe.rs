//! Mixture-of-experts MLPs (DeepSeek-V3 style routing, as LLaDA2.0 uses): sigmoid router in
//! f32, a selection bias, group-limited top-k, normalised and scaled weights, shared experts;
//! only the selected experts run, each on the rows routed to it.

use burn_tensor::backend::Backend;
use burn_tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::linear::{Dense, numel};

/// How a mixture of experts picks and weights experts (DeepSeek-V3 style, as LLaDA2.0 uses).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Routing {
    /// Experts per token.
    pub top_k: usize,
    /// Expert groups; a token picks experts only from its best `keep_groups` groups.
    pub groups: usize,
    pub keep_groups: usize,
    /// Multiplies the (normalised) weights.
    pub scale: f32,
    /// Divide the selected scores by their sum (+ 1e-20) before scaling.
    pub normalize: bool,
}

impl Routing {
    /// The experts one token uses and their weights, in expert order, from its router logits.
    /// `bias` shifts the scores for selection only (the weights use the unbiased scores).
    pub(crate) fn select(&self, logits: &[f32], bias: &[f32]) -> Vec<(usize, f32)> {
        let e = logits.len();
        let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        let choice: Vec<f32> = scores
            .iter()
            .zip(bias.iter().chain(std::iter::repeat(&0.0)))
            .map(|(s, b)| s + b)
            .collect();
        // 1. Score each group by the sum of its two best choice scores; keep the best groups.
        let size = e / self.groups.max(1);
        let mut group_scores: Vec<(usize, f32)> = (0..self.groups)
            .map(|g| {
                let mut v: Vec<f32> = choice[g * size..(g + 1) * size].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                (g, v.iter().take(2).sum())
            })
            .collect();
        group_scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let kept: Vec<usize> = group_scores
            .iter()
            .take(self.keep_groups)
            .map(|&(g, _)| g)
            .collect();
        // 2. The best `top_k` experts of the kept groups by choice score.
        let mut candidates: Vec<usize> = (0..e).filter(|i| kept.contains(&(i / size))).collect();
        candidates.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        candidates.truncate(self.top_k);
        candidates.sort_unstable();
        // 3. Weights from the unbiased scores.
        let sum: f32 = candidates.iter().map(|&i| scores[i]).sum();
        let norm = if self.normalize { sum + 1e-20 } else { 1.0 };
        candidates
            .into_iter()
            .map(|i| (i, scores[i] / norm * self.scale))
            .collect()
    }
}

/// A mixture-of-experts MLP.
pub(crate) struct Moe<B: Backend> {
    /// `[hidden, experts]`.
    router: Tensor<B, 2>,
    bias: Vec<f32>,
    experts: Vec<Dense<B>>,
    shared: Option<Dense<B>>,
    routing: Routing,
}

impl<B: Backend> Moe<B> {
    /// `host`: the backend is a CPU one ([`crate::values::runs_on_host`]).
    pub(crate) fn forward(&self, x: Tensor<B, 2>, host: bool) -> Tensor<B, 2> {
        let [rows, h] = x.dims();
        let e = self.experts.len();
        let device = x.device();
        // The sum is made before the router's logits are read back, not after: on the fused
        // backends (wgpu, CUDA), when it was the first operation queued after the read-back,
        // burn-fusion ran the operations that followed one kernel each, so the first expert's
        // SwiGLU was computed op by op while every other expert's ran as one fused kernel, and
        // the two differ in the last bits (measured on lavapipe: the same operations, compiled
        // as one chain or apart). Which expert came first depended on the other rows of the
        // batch, so a row's values did too (`tests/device/`, batch invariance; docs/models.md).
        let dtype = x.dtype();
        let mut out = Tensor::<B, 2>::zeros([rows, h], (&device, dtype));
        let logits: Vec<f32> = x
            .clone()
            .cast(DType::F32)
            .matmul(self.router.clone())
            .into_data()
            .iter::<f32>()
            .collect();
        // Rows and weights per expert, rows ascending.
        let mut routed: Vec<(Vec<i64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); e];
        for (r, row) in logits.chunks(e).enumerate() {
            for (i, w) in self.routing.select(row, &self.bias) {
                routed[i].0.push(r as i64);
                routed[i].1.push(w);
            }
        }
        // Each row sums its experts in expert order, starting from zero (`out`).
        for (expert, (idx, w)) in self.experts.iter().zip(routed) {
            if idx.is_empty() {
                continue;
            }
            let m = idx.len();
            // A lone row is duplicated: matrix kernels may take a matrix-vector path (another
            // summation order) for one row, which would make a row's result depend on how
            // many other rows of the batch chose the same expert.
            let gathered = if m == 1 { vec![idx[0]; 2] } else { idx.clone() };
            let rows_in = gathered.len();
            let gathered =
                Tensor::<B, 1, Int>::from_data(TensorData::new(gathered, [rows_in]), &device);
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [m]), &device);
            let w = Tensor::<B, 2>::from_data(TensorData::new(w, [m, 1]), (&device, dtype));
            let y = expert
                .forward(x.clone().select(0, gathered), host, None)
                .narrow(0, 0, m)
                * w;
            out = out.select_assign(0, idx, y, IndexingUpdateOp::Add);
        }
        match &self.shared {
            Some(s) => out + s.forward(x, host, None),
            None => out,
        }
    }
}

impl<B: Backend> Moe<B> {
    /// Assembles a mixture from its loaded parts.
    pub(crate) fn new(
        router: Tensor<B, 2>,
        bias: Vec<f32>,
        experts: Vec<Dense<B>>,
        shared: Option<Dense<B>>,
        routing: Routing,
    ) -> Self {
        Self {
            router,
            bias,
            experts,
            shared,
            routing,
        }
    }

    /// Number of parameters.
    pub(crate) fn parameters(&self) -> usize {
        numel(&self.router)
            + self.bias.len()
            + self.experts.iter().map(Dense::parameters).sum::<usize>()
            + self.shared.as_ref().map_or(0, Dense::parameters)
    }
}

/// The tensor names and shape of one mixture-of-experts layer.
pub(crate) struct MoeParts<'a> {
    pub router: String,
    pub bias: Option<String>,
    pub experts: usize,
    pub width: usize,
    pub expert: &'a dyn Fn(usize) -> [String; 3],
    pub shared: Option<([String; 3], usize)>,
    pub routing: Routing,
}

#[cfg(test)]
mod tests {
    use super::Routing;

    fn logit(p: f32) -> f32 {
        (p / (1.0 - p)).ln()
    }

    #[test]
    fn routing_keeps_the_best_groups_then_the_best_experts() {
        // 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
        let r = Routing {
            top_k: 2,
            groups: 4,
            keep_groups: 2,
            scale: 2.5,
            normalize: true,
        };
        // Expert 0 alone is the best, but group 0's pair sum (0.9 + 0.1) loses to groups 2
        // (0.6 + 0.6) and 3 (0.55 + 0.5): plain top-2 would pick {0, 4}.
        let p = [0.9, 0.1, 0.3, 0.3, 0.6, 0.6, 0.55, 0.5];
        let logits: Vec<f32> = p.iter().map(|&x| logit(x)).collect();
        let sel = r.select(&logits, &[0.0; 8]);
        let ids: Vec<usize> = sel.iter().map(|s| s.0).collect();
        assert_eq!(ids, vec![4, 5]);
        let w: f32 = sel.iter().map(|s| s.1).sum();
        assert!((w - 2.5).abs() < 1e-5, "weights sum to the scale: {w}");
        // A selection bias changes the choice but not the weights' source.
        let mut bias = [0.0f32; 8];
        bias[6] = 0.2;
        let sel = r.select(&logits, &bias);
        assert_eq!(sel.iter().map(|s| s.0).collect::<Vec<_>>(), vec![4, 6]);
        let expected = 0.6 / (0.6 + 0.55) * 2.5;
        assert!((sel[0].1 - expected).abs() < 1e-5, "{sel:?}");
    }
}
