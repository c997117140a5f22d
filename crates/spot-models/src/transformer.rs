//! The decoder-only transformer every family is built from.
//!
//! A family file (`sdar.rs`, `llada.rs`, `dream.rs`, `llada2.rs`, `autoregressive.rs`) maps its
//! `config.json` to a [`Geometry`] and its tensor names to a [`Net`] (dense decoders through the
//! name tables of `dense.rs`); this file holds the arithmetic they share:
//!
//! - pre-norm blocks with RMSNorm, GQA attention with optional q/k/v bias and optional per-head
//!   QK-norm (applied before RoPE);
//! - rotate-half RoPE over the first `rotary_dim` dimensions of each head (all of them for the
//!   Qwen and Llama families, half of them for LLaDA2.0), angles in f32 as HF computes them;
//! - a dense SwiGLU MLP or a mixture of experts ([`Moe`]): sigmoid router in f32, a selection
//!   bias, group-limited top-k, normalised and scaled weights, shared experts; only the selected
//!   experts run, each on the rows routed to it;
//! - attention over `[cached prefix ; block]` where the block attends to itself
//!   bidirectionally ([`Attend::Bidirectional`], block diffusion: the prefix broadcast over the
//!   states of a batch, each state its own fixed-shape products, so results do not depend on the
//!   batch) or causally ([`Attend::Causal`], autoregressive: position by position, so a run of
//!   tokens gives the numbers of one-token forwards bit for bit).

use burn_tensor::activation::{silu, softmax};
use burn_tensor::backend::Backend;
use burn_tensor::{IndexingUpdateOp, Int, Tensor, TensorData};

use crate::error::{ModelError, Result};
use crate::head::{Head, HeadPlacement};
use crate::hf::Weights;

/// Attention shape and numerics shared by every layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Geometry {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (the first ones); even, at most `head_dim`.
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub eps: f64,
}

/// How the positions of a block attend to each other (the prefix is always fully visible).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attend {
    /// Every position of the block sees the whole block (block diffusion).
    Bidirectional,
    /// Position `i` sees the block's positions `0..=i` (autoregressive; one sequence).
    Causal,
}

/// The cached keys and values of one layer: `[1, kv_heads, prefix_len, head_dim]`.
#[derive(Clone)]
pub(crate) struct Kv<B: Backend> {
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
}

/// A SwiGLU MLP: `down(silu(gate(x)) * up(x))`, weights stored `[in, out]`.
pub(crate) struct Dense<B: Backend> {
    gate: Tensor<B, 2>,
    up: Tensor<B, 2>,
    down: Tensor<B, 2>,
}

impl<B: Backend> Dense<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = silu(x.clone().matmul(self.gate.clone())) * x.matmul(self.up.clone());
        h.matmul(self.down.clone())
    }
}

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
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [rows, h] = x.dims();
        let e = self.experts.len();
        let device = x.device();
        let logits: Vec<f32> = x
            .clone()
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
        // Each row sums its experts in expert order, starting from zero.
        let mut out = Tensor::<B, 2>::zeros([rows, h], &device);
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
            let w = Tensor::<B, 2>::from_data(TensorData::new(w, [m, 1]), &device);
            let y = expert
                .forward(x.clone().select(0, gathered))
                .narrow(0, 0, m)
                * w;
            out = out.select_assign(0, idx, y, IndexingUpdateOp::Add);
        }
        match &self.shared {
            Some(s) => out + s.forward(x),
            None => out,
        }
    }
}

/// The MLP of one layer.
pub(crate) enum Mlp<B: Backend> {
    Dense(Dense<B>),
    Moe(Moe<B>),
}

/// Attention weights of one layer (linear weights stored `[in, out]`).
pub(crate) struct Attention<B: Backend> {
    pub q: Tensor<B, 2>,
    pub k: Tensor<B, 2>,
    pub v: Tensor<B, 2>,
    pub o: Tensor<B, 2>,
    /// q, k, v biases `[1, out]`.
    pub bias: Option<[Tensor<B, 2>; 3]>,
    /// Per-head RMSNorm weights of q and k, `[1, 1, 1, head_dim]`.
    pub qk_norm: Option<[Tensor<B, 4>; 2]>,
}

/// One pre-norm transformer layer.
pub(crate) struct Layer<B: Backend> {
    pub input_norm: Tensor<B, 2>,
    pub attn: Attention<B>,
    pub post_norm: Tensor<B, 2>,
    pub mlp: Mlp<B>,
}

pub(crate) fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: &Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    let var = x.clone().square().mean_dim(D - 1);
    x * var.add_scalar(eps).sqrt().recip() * w.clone()
}

/// `[rows, cols]` row-major -> `[cols, rows]` row-major.
fn transposed(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// Loads tensors by their HF names onto a device, in the layouts [`Net`] uses.
pub(crate) struct Loader<'w, B: Backend> {
    pub weights: &'w Weights,
    pub device: B::Device,
}

impl<B: Backend> Loader<'_, B> {
    /// A `[out, in]` HF linear weight, stored transposed as a contiguous `[in, out]` tensor so
    /// that every forward multiplies by it without a layout copy.
    pub fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Tensor<B, 2>> {
        let w = self.weights.load_f32(name, &[out, inp])?;
        Ok(self.transposed(&w, out, inp))
    }

    fn transposed(&self, w: &[f32], out: usize, inp: usize) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(transposed(w, out, inp), [inp, out]),
            &self.device,
        )
    }

    /// A fused `[sum(parts), in]` linear weight split along its rows (e.g. fused QKV).
    pub fn fused(&self, name: &str, parts: &[usize], inp: usize) -> Result<Vec<Tensor<B, 2>>> {
        let total: usize = parts.iter().sum();
        let w = self.weights.load_f32(name, &[total, inp])?;
        let mut at = 0;
        Ok(parts
            .iter()
            .map(|&p| {
                let t = self.transposed(&w[at * inp..(at + p) * inp], p, inp);
                at += p;
                t
            })
            .collect())
    }

    /// A vector as a `[1, n]` row (norm weights, biases).
    pub fn row(&self, name: &str, n: usize) -> Result<Tensor<B, 2>> {
        let w = self.weights.load_f32(name, &[n])?;
        Ok(Tensor::from_data(TensorData::new(w, [1, n]), &self.device))
    }

    /// A per-head norm weight as `[1, 1, 1, d]`.
    pub fn head_norm(&self, name: &str, d: usize) -> Result<Tensor<B, 4>> {
        let w = self.weights.load_f32(name, &[d])?;
        Ok(Tensor::from_data(
            TensorData::new(w, [1, 1, 1, d]),
            &self.device,
        ))
    }

    /// A SwiGLU MLP `prefix.{gate,up,down}` with names `names` and width `i`.
    pub fn dense(&self, names: [&str; 3], i: usize, h: usize) -> Result<Dense<B>> {
        Ok(Dense {
            gate: self.linear(names[0], i, h)?,
            up: self.linear(names[1], i, h)?,
            down: self.linear(names[2], h, i)?,
        })
    }

    /// A mixture of experts: router `[experts, h]`, selection bias (optional), `experts`
    /// SwiGLU experts of width `i` named by `expert(e)`, optional shared expert.
    pub fn moe(&self, parts: MoeParts<'_>, h: usize) -> Result<Moe<B>> {
        let e = parts.experts;
        let router = self.linear(&parts.router, e, h)?;
        let bias = match &parts.bias {
            Some(name) => self.weights.load_f32(name, &[e])?,
            None => vec![0.0; e],
        };
        if let Some(bad) = bias.iter().find(|b| !b.is_finite()) {
            return Err(ModelError::Request(format!(
                "tensor `{}` holds a non-finite value {bad}",
                parts.bias.unwrap_or_default()
            )));
        }
        let experts = (0..e)
            .map(|x| {
                let [g, u, d] = (parts.expert)(x);
                self.dense([&g, &u, &d], parts.width, h)
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match parts.shared {
            Some(([g, u, d], w)) => Some(self.dense([&g, &u, &d], w, h)?),
            None => None,
        };
        Ok(Moe {
            router,
            bias,
            experts,
            shared,
            routing: parts.routing,
        })
    }

    /// The embedding `[v, h]`, the head (placed by [`HeadPlacement::Auto`]) and whether it is
    /// tied (no `head` tensor and `tie`: the head is the embedding matrix).
    pub fn embedding_and_head(
        &self,
        embed: &str,
        head: &str,
        tie: bool,
        v: usize,
        h: usize,
    ) -> Result<(Tensor<B, 2>, Head<B>, bool)> {
        let host = self.weights.load_f32(embed, &[v, h])?;
        let tied = tie && !self.weights.contains(head);
        let head = if tied {
            Head::new(&host, v, h, HeadPlacement::Auto, &self.device)
        } else {
            let w = self.weights.load_f32(head, &[v, h])?;
            Head::new(&w, v, h, HeadPlacement::Auto, &self.device)
        };
        let embed = Tensor::from_data(TensorData::new(host, [v, h]), &self.device);
        Ok((embed, head, tied))
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

/// Embedding, layers, final norm and head.
pub(crate) struct Net<B: Backend> {
    pub geo: Geometry,
    pub device: B::Device,
    pub embed: Tensor<B, 2>,
    pub layers: Vec<Layer<B>>,
    pub norm: Tensor<B, 2>,
    pub head: Head<B>,
    inv_freq: Vec<f64>,
    parameters: usize,
}

fn numel<B: Backend, const D: usize>(t: &Tensor<B, D>) -> usize {
    t.dims().iter().product()
}

impl<B: Backend> Dense<B> {
    fn parameters(&self) -> usize {
        numel(&self.gate) + numel(&self.up) + numel(&self.down)
    }
}

impl<B: Backend> Layer<B> {
    fn parameters(&self) -> usize {
        let a = &self.attn;
        let attn = [&a.q, &a.k, &a.v, &a.o]
            .iter()
            .map(|t| numel(*t))
            .sum::<usize>()
            + a.bias.iter().flatten().map(numel).sum::<usize>()
            + a.qk_norm.iter().flatten().map(numel).sum::<usize>();
        let mlp = match &self.mlp {
            Mlp::Dense(d) => d.parameters(),
            Mlp::Moe(m) => {
                numel(&m.router)
                    + m.bias.len()
                    + m.experts.iter().map(Dense::parameters).sum::<usize>()
                    + m.shared.as_ref().map_or(0, Dense::parameters)
            }
        };
        numel(&self.input_norm) + numel(&self.post_norm) + attn + mlp
    }
}

impl<B: Backend> Net<B> {
    /// Assembles a network; the RoPE frequencies follow from `geo`. `tied`: the head is the
    /// embedding (not counted twice in [`Net::parameters`]).
    pub fn new(
        geo: Geometry,
        device: B::Device,
        (embed, head, tied): (Tensor<B, 2>, Head<B>, bool),
        layers: Vec<Layer<B>>,
        norm: Tensor<B, 2>,
    ) -> Self {
        let parameters = numel(&embed)
            + if tied {
                0
            } else {
                let (v, h) = head.shape();
                v * h
            }
            + numel(&norm)
            + layers.iter().map(Layer::parameters).sum::<usize>();
        let r = geo.rotary_dim;
        let inv_freq = (0..r / 2)
            .map(|j| 1.0 / geo.rope_theta.powf((2 * j) as f64 / r as f64))
            .collect();
        Self {
            geo,
            device,
            embed,
            layers,
            norm,
            head,
            inv_freq,
            parameters,
        }
    }

    /// Number of parameters the weights hold (a tied head counted once).
    pub fn parameters(&self) -> usize {
        self.parameters
    }

    /// `[1, 1, len, rotary_dim]` cos and sin tables for positions `start..start + len`
    /// (rotate-half layout: the frequencies repeat in the two halves).
    fn rope(&self, start: usize, len: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let r = self.geo.rotary_dim;
        let mut cos = Vec::with_capacity(len * r);
        let mut sin = Vec::with_capacity(len * r);
        for p in start..start + len {
            for f in self.inv_freq.iter().chain(&self.inv_freq) {
                let a = (p as f32 * *f as f32) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let t = |v| Tensor::<B, 4>::from_data(TensorData::new(v, [1, 1, len, r]), &self.device);
        (t(cos), t(sin))
    }

    fn apply_rope(&self, x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
        let d = x.dims()[3];
        let r = self.geo.rotary_dim;
        let rot = |x: Tensor<B, 4>| {
            let x1 = x.clone().narrow(3, 0, r / 2);
            let x2 = x.clone().narrow(3, r / 2, r / 2);
            let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
            x * cos.clone() + rotated * sin.clone()
        };
        if r == d {
            rot(x)
        } else {
            let pass = x.clone().narrow(3, r, d - r);
            Tensor::cat(vec![rot(x.narrow(3, 0, r)), pass], 3)
        }
    }

    /// Causal attention of one sequence's `len` new positions after `cache` (`q`
    /// `[1, kv, g * len, d]`, `k`/`v` `[1, kv, len, d]`), one position at a time: position `i`
    /// attends to `[cache ; k[..i]]` and to itself with exactly the products a one-token
    /// forward at that position runs, so appending a run of tokens in one forward gives the
    /// numbers of appending them one by one, bit for bit.
    fn causal_attention(
        &self,
        q: Tensor<B, 4>,
        k: &Tensor<B, 4>,
        v: &Tensor<B, 4>,
        cache: Option<&Kv<B>>,
        scale: f64,
    ) -> Tensor<B, 4> {
        let [_, kvh, _, d] = k.dims();
        let len = k.dims()[2];
        let g = q.dims()[2] / len.max(1);
        let p = cache.map_or(0, |c| c.k.dims()[2]);
        let q = q.reshape([1, kvh, g, len, d]);
        // `[cache ; new]` once; position `i` reads the first `p + i` rows of it.
        let all = |own: &Tensor<B, 4>, cached: Option<&Tensor<B, 4>>| match cached {
            Some(c) => Tensor::cat(vec![c.clone(), own.clone()], 2),
            None => own.clone(),
        };
        let (all_k, all_v) = (all(k, cache.map(|c| &c.k)), all(v, cache.map(|c| &c.v)));
        let outs = (0..len)
            .map(|i| {
                let qi = q.clone().narrow(3, i, 1).reshape([1, kvh, g, d]);
                let (ki, vi) = (k.clone().narrow(2, i, 1), v.clone().narrow(2, i, 1));
                let s_self = qi.clone().matmul(ki.swap_dims(2, 3)).mul_scalar(scale);
                let o = if p + i == 0 {
                    softmax(s_self, 3).matmul(vi)
                } else {
                    let pre_k = all_k.clone().narrow(2, 0, p + i);
                    let pre_v = all_v.clone().narrow(2, 0, p + i);
                    let s_pre = qi.matmul(pre_k.swap_dims(2, 3)).mul_scalar(scale);
                    let w = softmax(Tensor::cat(vec![s_pre, s_self], 3), 3);
                    w.clone().narrow(3, 0, p + i).matmul(pre_v) + w.narrow(3, p + i, 1).matmul(vi)
                };
                o.reshape([1, kvh, g, 1, d])
            })
            .collect();
        Tensor::cat(outs, 3).reshape([1, kvh, g * len, d])
    }

    /// Runs `n` sequences of `len` tokens at positions `start..start + len` after the cached
    /// prefix `cache` (one entry per layer, empty for none). Returns the final hidden states
    /// `[n * len, hidden]` and each layer's new keys and values `[n, kv, len, d]`.
    pub fn run(
        &self,
        ids: Vec<i64>,
        n: usize,
        len: usize,
        start: usize,
        cache: &[Kv<B>],
        attend: Attend,
    ) -> (Tensor<B, 2>, Vec<Kv<B>>) {
        let c = &self.geo;
        let (nh, kvh, d) = (c.heads, c.kv_heads, c.head_dim);
        let g = nh / kvh;
        let rows = n * len;
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows]), &self.device);
        let mut x = self.embed.clone().select(0, ids);
        let (cos, sin) = self.rope(start, len);
        let scale = 1.0 / (d as f64).sqrt();
        let mut new_kv = Vec::with_capacity(self.layers.len());
        for (li, layer) in self.layers.iter().enumerate() {
            let a = &layer.attn;
            // 1. Pre-norm and projections (+ bias).
            let hn = rms_norm(x.clone(), &layer.input_norm, c.eps);
            let (mut q, mut k, mut v) = (
                hn.clone().matmul(a.q.clone()),
                hn.clone().matmul(a.k.clone()),
                hn.matmul(a.v.clone()),
            );
            if let Some([bq, bk, bv]) = &a.bias {
                q = q + bq.clone();
                k = k + bk.clone();
                v = v + bv.clone();
            }
            let q = q.reshape([n, len, nh, d]);
            let k = k.reshape([n, len, kvh, d]);
            let v = v.reshape([n, len, kvh, d]);
            // 2. QK-norm per head, then RoPE; heads first: [n, heads, len, d].
            let (q, k) = match &a.qk_norm {
                Some([qn, kn]) => (rms_norm(q, qn, c.eps), rms_norm(k, kn, c.eps)),
                None => (q, k),
            };
            let q = self.apply_rope(q.swap_dims(1, 2), &cos, &sin);
            let k = self.apply_rope(k.swap_dims(1, 2), &cos, &sin);
            let v = v.swap_dims(1, 2);
            // 3. Group the query heads of each KV head: [n, kv, g * len, d].
            let q = q.reshape([n, kvh, g * len, d]);
            // 4. Attention over [prefix ; block]. The prefix `[1, kv, p, d]` is broadcast over
            //    the states (read in place, never copied), and each state's products are their
            //    own matrix calls of fixed shape, so a state's numbers do not depend on the batch.
            let cached = cache.get(li).filter(|_| start > 0);
            let out = match cached {
                _ if attend == Attend::Causal => self.causal_attention(q, &k, &v, cached, scale),
                Some(kv) => {
                    let s_blk = q
                        .clone()
                        .matmul(k.clone().swap_dims(2, 3))
                        .mul_scalar(scale);
                    let p = kv.k.dims()[2];
                    let s_pre = q.matmul(kv.k.clone().swap_dims(2, 3)).mul_scalar(scale);
                    let w = softmax(Tensor::cat(vec![s_pre, s_blk], 3), 3);
                    let o_pre = w.clone().narrow(3, 0, p).matmul(kv.v.clone());
                    o_pre + w.narrow(3, p, len).matmul(v.clone())
                }
                None => {
                    let s_blk = q.matmul(k.clone().swap_dims(2, 3)).mul_scalar(scale);
                    softmax(s_blk, 3).matmul(v.clone())
                }
            };
            // 5. Heads back to features, output projection, residual.
            let out = out
                .reshape([n, nh, len, d])
                .swap_dims(1, 2)
                .reshape([rows, nh * d]);
            x = x + out.matmul(a.o.clone());
            // 6. MLP, residual.
            let hn = rms_norm(x.clone(), &layer.post_norm, c.eps);
            x = x + match &layer.mlp {
                Mlp::Dense(m) => m.forward(hn),
                Mlp::Moe(m) => m.forward(hn),
            };
            new_kv.push(Kv { k, v });
        }
        (rms_norm(x, &self.norm, c.eps), new_kv)
    }

    /// Moves the output layer to `placement`.
    pub fn place_head(&mut self, placement: HeadPlacement) {
        self.head.place(placement, &self.device);
    }

    /// Appends `kv` (one sequence) to `cache`.
    pub fn extend_cache(cache: &mut Vec<Kv<B>>, kv: Vec<Kv<B>>) {
        if cache.is_empty() {
            *cache = kv;
        } else {
            for (c, new) in cache.iter_mut().zip(kv) {
                c.k = Tensor::cat(vec![c.k.clone(), new.k], 2);
                c.v = Tensor::cat(vec![c.v.clone(), new.v], 2);
            }
        }
    }
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
