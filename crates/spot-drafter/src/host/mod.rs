//! The order network's inference path on the host: weights packed once, no tensor library,
//! no allocation per call once its buffers have grown.
//!
//! [`OrderModel`] is a burn [`Module`](burn_core::module::Module): the training definition
//! and the checkpoint format. Run through burn at the drafter's shapes (a few 32 x 128 states a
//! call), most of a call is spent outside arithmetic: one allocation and one pass over memory
//! per operation, each head's 32 x 16 attention product as a matrix call of its own, and the
//! GELU's `erf` one scalar library call per element. [`HostOrderNet`] computes the same
//! function in a few passes:
//!
//! - the query, key and value projections as one `[d, 3d]` product, each bias written into the
//!   output before the product accumulates onto it (the `gemm` crate, which is also what burn's
//!   CPU backend multiplies with);
//! - attention per state and head, every query of a head at once on CPUs with AVX-512 (scores
//!   transposed into vector lanes), with a branch-free `exp` ([`spot_core::fastmath`]);
//! - the GELU with a branch-free rational `erf` (within 4e-7 of libm's);
//! - everything else (layer norms, residuals, the head) fused into the passes that produce
//!   their inputs, compiled for the widest SIMD the CPU has ([`pulp::Arch`]).
//!
//! **Agreement.** The same function up to float rounding: probabilities within 1e-6 of
//! [`OrderModel::probabilities`] on random networks and states (tests), and the same trees on
//! the benchmark prompts (`docs/drafter.md`). A state's scores do not depend on the other
//! states of the call: every row is computed by the same sequence of operations whatever the
//! batch (tested bit for bit).

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use spot_core::fastmath::fast_erf;
use spot_reduce::linalg::{dot, matmul_add as matmul, max, sum};

use crate::network::{BASE_FEATURE, OrderModel, OrderModelConfig};

mod attention;
mod int8;
mod mrp;

pub(crate) use mrp::check_step;
pub use mrp::{HostMrp, MrpBuffers};

use attention::grouped_attention;
use int8::{PackedI8, QuantRows, matmul_add, quantize_rows};

/// The arithmetic of [`HostOrderNet`]'s matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// `f32` throughout: the network as trained, within 1e-6 of burn's probabilities.
    #[default]
    F32,
    /// The encoder layers' four matrix products in int8 (weights per output column,
    /// activations per row, exact `i32` sums; the embedding, attention, norms and head stay
    /// `f32`): about a quarter of the multiply-add time on CPUs with AVX-512 VNNI, and scores
    /// that differ from the network's by the rounding of 8-bit values. A state's scores
    /// still depend on the state alone (not the batch, the CPU or the kernel). Changes which
    /// tree is drafted where two positions nearly tie, never the decoded tokens.
    Int8,
}

impl Precision {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "int8" => Ok(Precision::Int8),
            _ => Err(format!("unknown drafter precision {s:?} (f32 or int8)")),
        }
    }
}

/// burn's layer-norm epsilon for the encoder's norms and the final norm (the
/// `TransformerEncoderConfig` and `LayerNormConfig` default the network is built with).
const LN_EPS: f32 = 1e-5;

/// The fewest states a thread takes: below this a call runs on the calling thread (the
/// hand-off costs more than it saves).
const MIN_PART: usize = 1;

/// One encoder layer, packed.
#[derive(Clone, Debug)]
struct Layer {
    /// The norm before attention (burn's pre-norm encoder applies its `norm_2` there).
    attn_norm: Norm,
    /// `[d, 3d]`: the query, key and value weights side by side.
    qkv: Dense,
    /// `[3d]`.
    qkv_bias: Vec<f32>,
    /// `[d, d]`.
    out: Dense,
    /// `[d]`.
    out_bias: Vec<f32>,
    /// The norm before the feed-forward (burn's `norm_1`).
    ffn_norm: Norm,
    /// `[d, ffn]`.
    inner: Dense,
    /// `[ffn]`.
    inner_bias: Vec<f32>,
    /// `[ffn, d]`.
    outer: Dense,
    /// `[d]`.
    outer_bias: Vec<f32>,
}

/// A `[k, n]` weight matrix: row-major `f32`, or packed in int8 ([`Precision::Int8`]).
#[derive(Clone, Debug)]
struct Dense {
    w: DenseWeights,
    k: usize,
    n: usize,
}

/// The values of a [`Dense`] in the arithmetic its products run in.
#[derive(Clone, Debug)]
enum DenseWeights {
    F32(Vec<f32>),
    Int8(PackedI8),
}

impl Dense {
    fn new(w: Vec<f32>, (k, n): (usize, usize), precision: Precision) -> Self {
        let w = match precision {
            Precision::F32 => DenseWeights::F32(w),
            Precision::Int8 => DenseWeights::Int8(PackedI8::new(&w, k, n)),
        };
        Self { w, k, n }
    }

    /// The same matrix packed for `precision` from its `f32` values (`None` once packed in
    /// int8).
    fn repacked(&self, precision: Precision) -> Option<Self> {
        match &self.w {
            DenseWeights::F32(w) => Some(Self::new(w.clone(), (self.k, self.n), precision)),
            DenseWeights::Int8(_) => None,
        }
    }

    /// `out[rows, n] += a[rows, k] · w`: in `f32`, or quantised when packed in int8.
    #[inline(always)]
    fn add_product(&self, out: &mut [f32], a: &[f32], quant: &mut QuantRows, rows: usize) {
        match &self.w {
            DenseWeights::Int8(w8) => {
                quantize_rows(a, rows, w8, quant);
                matmul_add(out, quant, w8, rows);
            }
            DenseWeights::F32(w) => matmul(out, a, w, rows, self.k, self.n),
        }
    }
}

/// A layer norm's scale and offset.
#[derive(Clone, Debug)]
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// Buffers reused across calls (grown to the largest batch seen).
#[derive(Clone, Debug, Default)]
struct Scratch {
    /// `[rows, d]`: the residual stream.
    x: Vec<f32>,
    /// `[rows, d]`: a layer-normalised copy of `x`.
    h: Vec<f32>,
    /// `[rows, d]`: the attention context.
    ctx: Vec<f32>,
    /// `[rows, 3d]`.
    qkv: Vec<f32>,
    /// `[rows, ffn]`.
    ff: Vec<f32>,
    /// `[dk, L]`: one head's keys, transposed.
    kt: Vec<f32>,
    /// `[L]`: one query's attention row.
    row: Vec<f32>,
    /// A product's input rows quantised ([`Precision::Int8`]).
    quant: QuantRows,
}

/// The order network packed for the host: the scorer's inference path (see the module docs).
///
/// ```
/// use spot_drafter::{OrderModel, OrderModelConfig, host::HostOrderNet};
/// type B = burn_flex::Flex<f32>;
/// let cfg = OrderModelConfig { block_size: 4, d_model: 8, heads: 2, ffn: 16, layers: 1,
///     ..OrderModelConfig::default() };
/// let net = OrderModel::<B>::init(cfg.clone(), 3, &Default::default());
/// let mut host = HostOrderNet::new(&net);
/// let features = vec![0.1f32; 4 * cfg.n_features];
/// let valid = [1.0, 0.0, 1.0, 1.0];
/// let mut p = vec![0.0; 4];
/// host.probabilities(&features, &valid, 1, &mut p);
/// let reference = net.probabilities(&features, &valid, 1);
/// assert!(p.iter().zip(&reference).all(|(a, b)| (a - b).abs() < 1e-6));
/// assert_eq!(p[1], 0.0);
/// ```
#[derive(Clone, Debug)]
pub struct HostOrderNet {
    cfg: OrderModelConfig,
    /// `[n_features, d]`.
    embed: Vec<f32>,
    /// `[L, d]`: the embedding's bias plus the position embedding, per position.
    embed_bias: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Norm,
    /// `[d]`.
    head: Vec<f32>,
    head_bias: f32,
    /// `β` of a residual network.
    base_scale: Option<f32>,
    /// One set of buffers per parallel part of a call.
    scratch: Vec<Scratch>,
}

/// A tensor's values on the host, row-major.
fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().iter::<f32>().collect()
}

/// A linear layer's `[in, out]` weight and its bias (zeros when it has none).
fn linear<B: Backend>(l: &burn_nn::Linear<B>) -> (Vec<f32>, Vec<f32>) {
    let w = host(l.weight.val());
    let out = l.weight.val().dims()[1];
    let b = l
        .bias
        .as_ref()
        .map_or_else(|| vec![0.0; out], |b| host(b.val()));
    (w, b)
}

fn norm<B: Backend>(n: &burn_nn::LayerNorm<B>) -> Norm {
    let gamma = host(n.gamma.val());
    let beta = n
        .beta
        .as_ref()
        .map_or_else(|| vec![0.0; gamma.len()], |b| host(b.val()));
    Norm { gamma, beta }
}

impl HostOrderNet {
    /// Packs `model`'s parameters (read once from its device), in `f32`.
    pub fn new<B: Backend>(model: &OrderModel<B>) -> Self {
        Self::with_precision(model, Precision::F32)
    }

    /// Packs `model`'s parameters for products in `precision`.
    pub fn with_precision<B: Backend>(model: &OrderModel<B>, precision: Precision) -> Self {
        let cfg = model.config().clone();
        let (d, l) = (cfg.d_model, cfg.block_size);
        let (embed, bias) = linear(&model.embed);
        let position = host(model.position.val());
        let embed_bias = (0..l * d).map(|i| bias[i % d] + position[i]).collect();
        let layers = model
            .encoder
            .layers
            .iter()
            .map(|layer| {
                let mha = &layer.mha;
                let (q, qb) = linear(&mha.query);
                let (k, kb) = linear(&mha.key);
                let (v, vb) = linear(&mha.value);
                let mut qkv = Vec::with_capacity(3 * d * d);
                for r in 0..d {
                    for w in [&q, &k, &v] {
                        qkv.extend_from_slice(&w[r * d..(r + 1) * d]);
                    }
                }
                let (out, out_bias) = linear(&mha.output);
                let (inner, inner_bias) = linear(&layer.pwff.linear_inner);
                let (outer, outer_bias) = linear(&layer.pwff.linear_outer);
                let f = inner_bias.len();
                Layer {
                    attn_norm: norm(&layer.norm_2),
                    qkv: Dense::new(qkv, (d, 3 * d), precision),
                    qkv_bias: [qb, kb, vb].concat(),
                    out: Dense::new(out, (d, d), precision),
                    out_bias,
                    ffn_norm: norm(&layer.norm_1),
                    inner: Dense::new(inner, (d, f), precision),
                    inner_bias,
                    outer: Dense::new(outer, (f, d), precision),
                    outer_bias,
                }
            })
            .collect();
        let (head, head_bias) = linear(&model.head);
        Self {
            embed,
            embed_bias,
            layers,
            final_norm: norm(&model.final_ln),
            head,
            head_bias: head_bias.first().copied().unwrap_or(0.0),
            base_scale: model
                .base_scale
                .as_ref()
                .map(|b| host(b.val()).first().copied().unwrap_or(1.0)),
            scratch: Vec::new(),
            cfg,
        }
    }

    /// The configuration of the packed network.
    pub fn config(&self) -> &OrderModelConfig {
        &self.cfg
    }

    /// The arithmetic of the matrix products.
    pub fn precision(&self) -> Precision {
        if self
            .layers
            .iter()
            .any(|l| matches!(l.qkv.w, DenseWeights::Int8(_)))
        {
            Precision::Int8
        } else {
            Precision::F32
        }
    }

    /// Unnormalised scores `[n, L]` of features `[n, L, n_features]` (row-major), as
    /// [`OrderModel::scores`] computes them.
    ///
    /// # Panics
    /// When `features` or `out` is shorter than `n` states need (a caller's bug, not input).
    pub fn scores(&mut self, features: &[f32], n: usize, out: &mut [f32]) {
        let (l, nf) = (self.cfg.block_size, self.cfg.n_features);
        let rows = n * l;
        assert!(features.len() >= rows * nf && out.len() >= rows);
        if rows == 0 {
            return;
        }
        // States are independent: split them into one part per thread (a state's scores do
        // not depend on the part it lands in).
        let parts = rayon::current_num_threads()
            .min(n.div_ceil(MIN_PART))
            .max(1);
        let per = n.div_ceil(parts);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize_with(parts, Scratch::default);
        let net = &*self;
        let work = features[..rows * nf]
            .chunks(per * l * nf)
            .zip(out[..rows].chunks_mut(per * l))
            .zip(scratch.iter_mut());
        let run = |((features, out), scratch): ((&[f32], &mut [f32]), &mut Scratch)| {
            let n = out.len() / l;
            pulp::Arch::new().dispatch(Forward {
                net,
                scratch,
                features,
                n,
                out,
            });
        };
        if parts == 1 {
            work.for_each(run);
        } else {
            // An indexed split (`join` underneath): the calling thread runs the first part at
            // once while another takes the rest (`par_bridge` handed every part through a
            // shared iterator), with the other worker kept awake between the round's calls.
            crate::awake::keep_awake();
            work.collect::<Vec<_>>().into_par_iter().for_each(run);
        }
        self.scratch = scratch;
    }

    /// `q(s | y)` for `n` states: the softmax of the scores over the positions where `valid`
    /// is positive, 0 elsewhere, as [`OrderModel::probabilities`] (`features` `[n, L, F]`,
    /// `valid` and `out` `[n, L]`).
    ///
    /// # Panics
    /// When a slice is shorter than `n` states need.
    pub fn probabilities(&mut self, features: &[f32], valid: &[f32], n: usize, out: &mut [f32]) {
        let l = self.cfg.block_size;
        assert!(valid.len() >= n * l);
        self.scores(features, n, out);
        for (row, valid) in out[..n * l].chunks_mut(l).zip(valid.chunks(l)) {
            let max = row
                .iter()
                .zip(valid)
                .filter(|(_, v)| **v > 0.0)
                .map(|(s, _)| *s)
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for (s, v) in row.iter_mut().zip(valid) {
                *s = if *v > 0.0 { (*s - max).exp() } else { 0.0 };
                sum += *s;
            }
            if sum > 0.0 {
                row.iter_mut().for_each(|s| *s /= sum);
            }
        }
    }

    /// The encoder, inlined into the SIMD context [`Self::scores`] dispatches to.
    #[inline(always)]
    fn forward(&self, s: &mut Scratch, features: &[f32], n: usize, out: &mut [f32]) {
        let cfg = &self.cfg;
        let (l, nf, d, f) = (cfg.block_size, cfg.n_features, cfg.d_model, cfg.ffn);
        let (heads, rows) = (cfg.heads, n * l);
        s.x.resize(rows * d, 0.0);
        s.h.resize(rows * d, 0.0);
        s.ctx.resize(rows * d, 0.0);
        s.qkv.resize(rows * 3 * d, 0.0);
        s.ff.resize(rows * f, 0.0);
        let x = &mut s.x[..rows * d];
        // Embedding: bias and position, then the features' product onto them.
        for chunk in x.chunks_mut(l * d) {
            chunk.copy_from_slice(&self.embed_bias);
        }
        matmul(x, &features[..rows * nf], &self.embed, rows, nf, d);
        for layer in &self.layers {
            let (x, h, ctx) = (
                &mut s.x[..rows * d],
                &mut s.h[..rows * d],
                &mut s.ctx[..rows * d],
            );
            layer_norm(x, h, d, &layer.attn_norm);
            let qkv = &mut s.qkv[..rows * 3 * d];
            fill_rows(qkv, &layer.qkv_bias);
            layer.qkv.add_product(qkv, h, &mut s.quant, rows);
            let shape = (l, heads, heads, d / heads);
            grouped_attention(qkv, ctx, shape, &mut s.kt, &mut s.row);
            add_rows(x, &layer.out_bias);
            layer.out.add_product(x, ctx, &mut s.quant, rows);
            layer_norm(x, h, d, &layer.ffn_norm);
            let ff = &mut s.ff[..rows * f];
            fill_rows(ff, &layer.inner_bias);
            layer.inner.add_product(ff, h, &mut s.quant, rows);
            ff.iter_mut().for_each(|v| *v = gelu(*v));
            add_rows(x, &layer.outer_bias);
            layer.outer.add_product(x, ff, &mut s.quant, rows);
        }
        layer_norm(&s.x[..rows * d], &mut s.h[..rows * d], d, &self.final_norm);
        for (r, o) in out.iter_mut().enumerate() {
            let mut v = dot(&s.h[r * d..(r + 1) * d], &self.head) + self.head_bias;
            if let Some(beta) = self.base_scale {
                v += features[r * nf + BASE_FEATURE] * beta;
            }
            *o = v;
        }
    }
}

/// One call of [`HostOrderNet::forward`], compiled for the widest SIMD the CPU has.
struct Forward<'a> {
    net: &'a HostOrderNet,
    scratch: &'a mut Scratch,
    features: &'a [f32],
    n: usize,
    out: &'a mut [f32],
}

impl pulp::WithSimd for Forward<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _: V) {
        self.net
            .forward(self.scratch, self.features, self.n, self.out);
    }
}

/// Every `bias.len()`-wide row of `out` set to `bias`.
#[inline(always)]
fn fill_rows(out: &mut [f32], bias: &[f32]) {
    for row in out.chunks_mut(bias.len()) {
        row.copy_from_slice(bias);
    }
}

/// `bias` added to every row of `out`.
#[inline(always)]
fn add_rows(out: &mut [f32], bias: &[f32]) {
    for row in out.chunks_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
    }
}

/// `out` = layer norm of each `d`-wide row of `x` (population variance, as burn).
#[inline(always)]
fn layer_norm(x: &[f32], out: &mut [f32], d: usize, n: &Norm) {
    let inv_d = 1.0 / d as f32;
    for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
        let mean = sum(row) * inv_d;
        for (o, v) in o.iter_mut().zip(row) {
            *o = v - mean;
        }
        let var = dot(o, o) * inv_d;
        let inv = 1.0 / (var + LN_EPS).sqrt();
        for (o, (g, b)) in o.iter_mut().zip(n.gamma.iter().zip(&n.beta)) {
            *o = *o * inv * g + b;
        }
    }
}

/// `GELU(x) = x/2 · (1 + erf(x / √2))`, burn's exact (non-tanh) form.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + fast_erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_tensor::TensorData;
    use spot_tree::rng::SplitMix;

    type B = burn_flex::Flex<f32>;

    #[test]
    fn the_gelu_is_close_to_burns() {
        let mut worst = 0.0f32;
        for i in -80_000..=80_000 {
            let x = i as f32 * 1e-4;
            let want = 0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2));
            worst = worst.max((gelu(x) - want).abs());
        }
        assert!(worst < 2e-6, "gelu: {worst}");
    }

    /// Random features shaped like the real ones (probabilities, logs, flags) for `n` states.
    fn states(cfg: &OrderModelConfig, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = SplitMix(seed);
        let (l, nf) = (cfg.block_size, cfg.n_features);
        let mut features = vec![0.0; n * l * nf];
        let mut valid = vec![0.0; n * l];
        for r in 0..n * l {
            let masked = rng.uniform() < 0.7;
            valid[r] = if masked { 1.0 } else { 0.0 };
            for j in 0..nf {
                features[r * nf + j] = match j {
                    BASE_FEATURE => rng.uniform().max(1e-6).ln() as f32,
                    _ if masked => rng.normal(),
                    _ => 0.0,
                };
            }
        }
        (features, valid)
    }

    /// A trained-looking network: every parameter drawn (the head too), norms perturbed.
    fn network(cfg: &OrderModelConfig, seed: u64) -> OrderModel<B> {
        let net = OrderModel::<B>::init(cfg.clone(), seed, &Default::default());
        let mut rng = SplitMix(seed ^ 0x5eed);
        let mut net = net;
        let d = cfg.d_model;
        let draw = |rng: &mut SplitMix, len: usize, scale: f32, offset: f32| {
            let v: Vec<f32> = (0..len).map(|_| offset + scale * rng.normal()).collect();
            Tensor::<B, 1>::from_data(TensorData::new(v, [len]), &Default::default())
        };
        net.head.weight =
            burn_core::module::Param::from_tensor(draw(&mut rng, d, 0.3, 0.0).reshape([d, 1]));
        net.final_ln.gamma = burn_core::module::Param::from_tensor(draw(&mut rng, d, 0.1, 1.0));
        for layer in &mut net.encoder.layers {
            layer.norm_2.gamma = burn_core::module::Param::from_tensor(draw(&mut rng, d, 0.1, 1.0));
            layer.norm_1.beta = Some(burn_core::module::Param::from_tensor(draw(
                &mut rng, d, 0.1, 0.0,
            )));
        }
        net
    }

    #[test]
    fn the_host_path_agrees_with_burn_on_random_networks() {
        let shapes = [
            OrderModelConfig::default(),
            OrderModelConfig {
                block_size: 8,
                d_model: 24,
                heads: 3,
                ffn: 40,
                layers: 2,
                ..OrderModelConfig::default()
            },
            OrderModelConfig {
                features_version: crate::features::FEATURES_VERSION_2,
                n_features: crate::features::N_FEATURES_V2,
                block_size: 16,
                d_model: 32,
                heads: 4,
                ffn: 64,
                layers: 1,
                ..OrderModelConfig::default()
            },
        ];
        let mut worst = 0.0f32;
        for (k, cfg) in shapes.iter().enumerate() {
            for seed in 0..3u64 {
                let net = network(cfg, seed + 10 * k as u64);
                let mut host = HostOrderNet::new(&net);
                for n in [1usize, 4, 9] {
                    let (features, valid) = states(cfg, n, seed * 31 + n as u64);
                    let want = net.probabilities(&features, &valid, n);
                    let mut got = vec![0.0; n * cfg.block_size];
                    host.probabilities(&features, &valid, n, &mut got);
                    for (a, b) in got.iter().zip(&want) {
                        worst = worst.max((a - b).abs());
                    }
                    // Scores too, not only their softmax.
                    let x = Tensor::<B, 3>::from_data(
                        TensorData::new(features.clone(), [n, cfg.block_size, cfg.n_features]),
                        &Default::default(),
                    );
                    let want = host_scores(net.scores(x));
                    let mut got = vec![0.0; n * cfg.block_size];
                    host.scores(&features, n, &mut got);
                    for (a, b) in got.iter().zip(&want) {
                        assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{a} vs {b}");
                    }
                }
            }
        }
        assert!(worst < 1e-6, "largest probability difference {worst}");
    }

    fn host_scores(t: Tensor<B, 2>) -> Vec<f32> {
        host(t)
    }

    #[test]
    fn a_state_scores_the_same_alone_and_in_any_batch() {
        let cfg = OrderModelConfig::default();
        let net = network(&cfg, 7);
        for precision in [Precision::F32, Precision::Int8] {
            let mut host = HostOrderNet::with_precision(&net, precision);
            assert_eq!(host.precision(), precision);
            let (features, _) = states(&cfg, 21, 5);
            let per = cfg.block_size * cfg.n_features;
            let mut all = vec![0.0; 21 * cfg.block_size];
            host.scores(&features, 21, &mut all);
            for (i, n) in [(0usize, 1usize), (3, 2), (5, 8), (13, 8)] {
                let mut part = vec![0.0; n * cfg.block_size];
                host.scores(&features[i * per..(i + n) * per], n, &mut part);
                let want = &all[i * cfg.block_size..(i + n) * cfg.block_size];
                assert!(
                    part.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{precision}: states {i}..{} differ inside the batch of 21",
                    i + n
                );
            }
        }
    }

    /// The int8 path is the same network up to 8-bit rounding: on trained-looking random
    /// networks its probabilities stay close to the f32 path's and it mostly names the same
    /// most likely position (a different one only where two nearly tie).
    #[test]
    fn the_int8_path_is_close_to_the_f32_one() {
        let cfg = OrderModelConfig::default();
        let (mut worst, mut same_top, mut states_seen) = (0.0f32, 0, 0);
        for seed in 0..3u64 {
            let net = network(&cfg, 40 + seed);
            let mut exact = HostOrderNet::new(&net);
            let mut int8 = HostOrderNet::with_precision(&net, Precision::Int8);
            let n = 16;
            let (features, valid) = states(&cfg, n, 100 + seed);
            let l = cfg.block_size;
            let (mut p, mut q) = (vec![0.0; n * l], vec![0.0; n * l]);
            exact.probabilities(&features, &valid, n, &mut p);
            int8.probabilities(&features, &valid, n, &mut q);
            for (a, b) in p.chunks(l).zip(q.chunks(l)) {
                let top = |r: &[f32]| {
                    (0..l)
                        .max_by(|&i, &j| r[i].total_cmp(&r[j]))
                        .unwrap_or_default()
                };
                same_top += usize::from(top(a) == top(b));
                states_seen += 1;
                for (x, y) in a.iter().zip(b) {
                    worst = worst.max((x - y).abs());
                }
            }
        }
        eprintln!(
            "int8 against f32: largest difference {worst}, same top {same_top} / {states_seen}"
        );
        assert!(worst < 0.05, "largest probability difference {worst}");
        assert!(
            same_top * 10 >= states_seen * 9,
            "the same most likely position in {same_top} of {states_seen} states"
        );
        assert!(worst > 0.0, "the int8 path computed the f32 numbers");
    }
}
