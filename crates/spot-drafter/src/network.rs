//! The order network `q_φ(s | y)`: a 3-layer transformer encoder over the block's positions.
//!
//! Input `[N, L, 78]` features ([`crate::features`]); a linear embedding to `d_model` plus a
//! learned position embedding; `layers` pre-norm encoder layers (multi-head self-attention over
//! all `L` positions, GELU feed-forward); a final LayerNorm and a linear head to one score per
//! position. Scores of positions committed in `y` are excluded by the caller (softmax over the
//! masked positions). Default shape (d_model 128, 8 heads, FFN 512, 3 layers, L = 32):
//! 609,410 parameters.
//!
//! **Residual on stale confidence (features version 3).** The score of position `s` is
//! `β · ln c_s + f(x)_s`, where `c_s` is the stale confidence (feature 74), `β` a learned scalar
//! (`base_scale`, initially 1) and the head of `f` starts at zero: an untrained network ranks
//! positions exactly by stale confidence (`q(s | y) ∝ c_s`), the training-free baseline it has
//! to beat, and training learns only the correction. Version-2 checkpoints (74 features, no
//! residual) still load and score as before.
//!
//! Parameters are kept as a flat list of named 1-D tensors, reshaped in the forward; that keeps
//! checkpoint I/O ([`crate::checkpoint`]) and the optimiser ([`crate::train`](mod@crate::train)) one loop each.

use burn_tensor::activation::{gelu, softmax};
use burn_tensor::backend::Backend;
use burn_tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::analysis::{TokenCalibration, nearest_calibration};
use crate::features::{FEATURES_VERSION, FEATURES_VERSION_2, N_FEATURES, N_FEATURES_V2};
use crate::rng::SplitMix;

/// Shape of the order network (stored next to every checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderModelConfig {
    /// Version of the feature definition the network reads.
    pub features_version: u32,
    /// Features per position.
    pub n_features: usize,
    /// Block size `L` the network was trained for.
    pub block_size: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Token hit rates measured on the training trajectories; when present the learned scorer
    /// weighs token hypotheses by them instead of by stale probabilities (see
    /// [`TokenCalibration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_calibration: Option<TokenCalibration>,
    /// Token calibrations fitted per decoding temperature (each with its `temperature`); the
    /// scorer uses the one nearest the target's temperature, and `token_calibration` only when
    /// this is empty ([`OrderModelConfig::calibration_for`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_calibration_by_temperature: Vec<TokenCalibration>,
}

impl Default for OrderModelConfig {
    fn default() -> Self {
        Self {
            features_version: FEATURES_VERSION,
            n_features: N_FEATURES,
            block_size: 32,
            d_model: 128,
            heads: 8,
            ffn: 512,
            layers: 3,
            token_calibration: None,
            token_calibration_by_temperature: Vec::new(),
        }
    }
}

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

impl OrderModelConfig {
    /// Names, shapes and initialisers of every parameter, in storage order.
    pub(crate) fn params(&self) -> Vec<(String, Vec<usize>, Init)> {
        let (d, f) = (self.d_model, self.ffn);
        let w = Init::Normal(0.02);
        let mut v = vec![
            ("embed.weight".into(), vec![self.n_features, d], w),
            ("embed.bias".into(), vec![d], Init::Zeros),
            ("position".into(), vec![self.block_size, d], w),
        ];
        for l in 0..self.layers {
            let p = |n: &str| format!("layers.{l}.{n}");
            v.push((p("ln1.weight"), vec![d], Init::Ones));
            v.push((p("ln1.bias"), vec![d], Init::Zeros));
            for m in ["q", "k", "v", "o"] {
                v.push((p(&format!("{m}.weight")), vec![d, d], w));
                v.push((p(&format!("{m}.bias")), vec![d], Init::Zeros));
            }
            v.push((p("ln2.weight"), vec![d], Init::Ones));
            v.push((p("ln2.bias"), vec![d], Init::Zeros));
            v.push((p("ffn1.weight"), vec![d, f], w));
            v.push((p("ffn1.bias"), vec![f], Init::Zeros));
            v.push((p("ffn2.weight"), vec![f, d], w));
            v.push((p("ffn2.bias"), vec![d], Init::Zeros));
        }
        v.push(("final_ln.weight".into(), vec![d], Init::Ones));
        v.push(("final_ln.bias".into(), vec![d], Init::Zeros));
        if self.residual() {
            // Zero head: an untrained network is the stale-confidence ranking.
            v.push(("head.weight".into(), vec![d, 1], Init::Zeros));
            v.push(("head.bias".into(), vec![1], Init::Zeros));
            v.push(("base_scale".into(), vec![1], Init::Ones));
        } else {
            v.push(("head.weight".into(), vec![d, 1], w));
            v.push(("head.bias".into(), vec![1], Init::Zeros));
        }
        v
    }

    /// Whether scores are residual on the log stale confidence (features version 3 and later).
    pub fn residual(&self) -> bool {
        self.features_version >= FEATURES_VERSION
    }

    /// The token calibration for decoding at `temperature`: the per-temperature table nearest
    /// to it, else the temperature-agnostic one.
    ///
    /// ```
    /// use spot_drafter::{OrderModelConfig, TokenCalibration};
    /// let table = |t: f32| TokenCalibration {
    ///     key: Default::default(),
    ///     edges: vec![1.0], top1: vec![vec![0.9]], runner_up: vec![vec![0.05]], temperature: Some(t),
    /// };
    /// let cfg = OrderModelConfig {
    ///     token_calibration_by_temperature: vec![table(0.0), table(1.0), table(2.0)],
    ///     ..OrderModelConfig::default()
    /// };
    /// assert_eq!(cfg.calibration_for(0.8).unwrap().temperature, Some(1.0));
    /// assert_eq!(cfg.calibration_for(0.2).unwrap().temperature, Some(0.0));
    /// assert!(OrderModelConfig::default().calibration_for(1.0).is_none());
    /// ```
    pub fn calibration_for(&self, temperature: f32) -> Option<&TokenCalibration> {
        nearest_calibration(&self.token_calibration_by_temperature, temperature)
            .or(self.token_calibration.as_ref())
    }

    /// Number of parameters.
    ///
    /// ```
    /// assert_eq!(spot_drafter::OrderModelConfig::default().parameter_count(), 609_410);
    /// ```
    pub fn parameter_count(&self) -> usize {
        self.params()
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>())
            .sum()
    }

    /// Whether the shape is usable (positive sizes, heads divide d_model, current features).
    pub fn check(&self) -> Result<(), String> {
        let known = [
            (FEATURES_VERSION, N_FEATURES),
            (FEATURES_VERSION_2, N_FEATURES_V2),
        ];
        if !known.contains(&(self.features_version, self.n_features)) {
            return Err(format!(
                "features version {} with {} features; this build reads version {FEATURES_VERSION} with {N_FEATURES} and version {FEATURES_VERSION_2} with {N_FEATURES_V2}",
                self.features_version, self.n_features
            ));
        }
        if [
            self.block_size,
            self.d_model,
            self.heads,
            self.ffn,
            self.layers,
        ]
        .contains(&0)
        {
            return Err("block_size, d_model, heads, ffn and layers must be positive".into());
        }
        // Sizes come from a file: bound them before anything is allocated from them.
        for (name, v, max) in [
            ("block_size", self.block_size, 4096),
            ("d_model", self.d_model, 8192),
            ("heads", self.heads, 256),
            ("ffn", self.ffn, 65_536),
            ("layers", self.layers, 64),
        ] {
            if v > max {
                return Err(format!("{name} {v} exceeds {max}"));
            }
        }
        let (d, f) = (self.d_model as u128, self.ffn as u128);
        let per_layer = 4 * d + 4 * (d * d + d) + 2 * d * f + f + d;
        let total = (self.n_features as u128 + 1 + self.block_size as u128) * d
            + self.layers as u128 * per_layer
            + 3 * d
            + 2;
        if total > MAX_PARAMETERS {
            return Err(format!(
                "{total} parameters exceed the limit of {MAX_PARAMETERS}"
            ));
        }
        for c in self
            .token_calibration
            .iter()
            .chain(&self.token_calibration_by_temperature)
        {
            c.check()?;
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(format!(
                "d_model {} is not a multiple of heads {}",
                self.d_model, self.heads
            ));
        }
        Ok(())
    }
}

/// The order network on backend `B`.
#[derive(Clone, Debug)]
pub struct OrderModel<B: Backend> {
    cfg: OrderModelConfig,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    params: Vec<Tensor<B, 1>>,
    device: B::Device,
}

impl<B: Backend> OrderModel<B> {
    /// A freshly initialised network (normal(0, 0.02) weights, zero biases, unit norms),
    /// deterministic in `seed`.
    pub fn init(cfg: OrderModelConfig, seed: u64, device: &B::Device) -> Self {
        let mut rng = SplitMix(seed);
        let specs = cfg.params();
        let mut host = Vec::with_capacity(specs.len());
        for (_, shape, init) in &specs {
            let n: usize = shape.iter().product();
            host.push(match init {
                Init::Zeros => vec![0.0; n],
                Init::Ones => vec![1.0; n],
                Init::Normal(std) => (0..n).map(|_| rng.normal() * std).collect(),
            });
        }
        Self::from_host(cfg, host, device)
    }

    /// A network from host values in storage order (see [`OrderModel::names`] and
    /// [`OrderModel::shapes`]; each vector holds its tensor row-major).
    pub fn from_host(cfg: OrderModelConfig, host: Vec<Vec<f32>>, device: &B::Device) -> Self {
        let params = host
            .into_iter()
            .map(|v| {
                let n = v.len();
                Tensor::<B, 1>::from_data(TensorData::new(v, [n]), device)
            })
            .collect();
        Self::from_params(cfg, params, device)
    }

    /// A network holding `params` (storage order, flat).
    pub(crate) fn from_params(
        cfg: OrderModelConfig,
        params: Vec<Tensor<B, 1>>,
        device: &B::Device,
    ) -> Self {
        let specs = cfg.params();
        Self {
            names: specs.iter().map(|(n, _, _)| n.clone()).collect(),
            shapes: specs.iter().map(|(_, s, _)| s.clone()).collect(),
            cfg,
            params,
            device: device.clone(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OrderModelConfig {
        &self.cfg
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Parameter names, in storage order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Parameter shapes, in storage order.
    pub fn shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }

    /// The flat parameter tensors, in storage order.
    pub fn params(&self) -> &[Tensor<B, 1>] {
        &self.params
    }

    /// Attaches (or removes) the token calibration stored with the checkpoint.
    pub fn set_token_calibration(&mut self, c: Option<TokenCalibration>) {
        self.cfg.token_calibration = c;
    }

    /// Attaches the per-temperature token calibrations stored with the checkpoint.
    pub fn set_token_calibrations(&mut self, c: Vec<TokenCalibration>) {
        self.cfg.token_calibration_by_temperature = c;
    }

    /// Replaces the parameters (same count and lengths, e.g. after an optimiser step).
    pub(crate) fn set_params(&mut self, params: Vec<Tensor<B, 1>>) {
        debug_assert_eq!(params.len(), self.params.len());
        self.params = params;
    }

    /// Every parameter copied to the host.
    pub fn to_host(&self) -> Vec<Vec<f32>> {
        self.params
            .iter()
            .map(|p| p.to_data().iter::<f32>().collect())
            .collect()
    }

    fn p1(&self, i: usize) -> Tensor<B, 1> {
        self.params[i].clone()
    }

    fn p2(&self, i: usize) -> Tensor<B, 2> {
        let s = &self.shapes[i];
        self.params[i].clone().reshape([s[0], s[1]])
    }

    /// Scores `[N, L]` of features `[N, L, n_features]` (unnormalised, every position).
    pub fn scores(&self, features: Tensor<B, 3>) -> Tensor<B, 2> {
        let [n, l, f] = features.dims();
        let c = &self.cfg;
        let (d, h) = (c.d_model, c.heads);
        let dh = d / h;
        let mut i = 0usize;
        let mut next = || {
            i += 1;
            i - 1
        };
        let (we, be, pos) = (next(), next(), next());
        let pos = self.p2(pos).narrow(0, 0, l).reshape([1, l, d]);
        let x =
            features.clone().reshape([n * l, f]).matmul(self.p2(we)) + self.p1(be).unsqueeze::<2>();
        let mut x = (x.reshape([n, l, d]) + pos).reshape([n * l, d]);
        let scale = 1.0 / (dh as f64).sqrt();
        for _ in 0..c.layers {
            let (g1, b1) = (next(), next());
            let (wq, bq, wk, bk, wv, bv, wo, bo) = (
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
            );
            let (g2, b2) = (next(), next());
            let (w1, c1, w2, c2) = (next(), next(), next(), next());
            let a = layer_norm(x.clone(), self.p1(g1), self.p1(b1));
            let proj = |w: usize, b: usize| {
                (a.clone().matmul(self.p2(w)) + self.p1(b).unsqueeze::<2>())
                    .reshape([n, l, h, dh])
                    .swap_dims(1, 2)
            };
            let (q, k, v) = (proj(wq, bq), proj(wk, bk), proj(wv, bv));
            let att = softmax(q.matmul(k.swap_dims(2, 3)).mul_scalar(scale), 3);
            let o = att.matmul(v).swap_dims(1, 2).reshape([n * l, d]);
            x = x + o.matmul(self.p2(wo)) + self.p1(bo).unsqueeze::<2>();
            let a = layer_norm(x.clone(), self.p1(g2), self.p1(b2));
            let hid = gelu(a.matmul(self.p2(w1)) + self.p1(c1).unsqueeze::<2>());
            x = x + hid.matmul(self.p2(w2)) + self.p1(c2).unsqueeze::<2>();
        }
        let (gf, bf, wh, bh) = (next(), next(), next(), next());
        let x = layer_norm(x, self.p1(gf), self.p1(bf));
        let out = (x.matmul(self.p2(wh)) + self.p1(bh).unsqueeze::<2>()).reshape([n, l]);
        if !c.residual() {
            return out;
        }
        let base = features.narrow(2, BASE_FEATURE, 1).reshape([n, l]);
        out + base * self.p1(next()).reshape([1, 1])
    }

    /// `q(s | y)` for a batch: softmax of the scores over the positions where `valid` is 1.0
    /// (the masked positions of each state), 0 elsewhere. `features` is `[n, L, F]` row-major,
    /// `valid` `[n, L]`; returns `n * L` probabilities.
    pub fn probabilities(&self, features: &[f32], valid: &[f32], n: usize) -> Vec<f32> {
        let l = self.cfg.block_size;
        let f = self.cfg.n_features;
        let x =
            Tensor::<B, 3>::from_data(TensorData::new(features.to_vec(), [n, l, f]), &self.device);
        let bias: Vec<f32> = valid
            .iter()
            .map(|&v| if v > 0.0 { 0.0 } else { -1e9 })
            .collect();
        let bias = Tensor::<B, 2>::from_data(TensorData::new(bias, [n, l]), &self.device);
        let p = softmax(self.scores(x) + bias, 1);
        p.to_data()
            .iter::<f32>()
            .zip(valid)
            .map(|(p, &v)| if v > 0.0 { p } else { 0.0 })
            .collect()
    }
}

/// The most parameters a checkpoint may declare (1 GiB of f32).
const MAX_PARAMETERS: u128 = 1 << 28;

/// The feature a residual network adds its output to: `ln` stale confidence.
const BASE_FEATURE: usize = 74;

fn layer_norm<B: Backend>(x: Tensor<B, 2>, g: Tensor<B, 1>, b: Tensor<B, 1>) -> Tensor<B, 2> {
    let mean = x.clone().mean_dim(1);
    let xc = x - mean;
    let var = xc.clone().powi_scalar(2).mean_dim(1);
    xc / var.add_scalar(1e-5).sqrt() * g.unsqueeze::<2>() + b.unsqueeze::<2>()
}
