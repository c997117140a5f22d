//! The order network `q_φ(s | y)`: a 3-layer transformer encoder over the block's positions.
//!
//! Input `[N, L, 78]` features ([`crate::features`]); a linear embedding to `d_model` plus a
//! learned position embedding; burn's pre-norm [`TransformerEncoder`] (`layers` layers of
//! multi-head self-attention over all `L` positions and a GELU feed-forward, no dropout); a
//! final [`LayerNorm`] and a linear head to one score per position. Scores of positions
//! committed in `y` are excluded by the caller (softmax over the masked positions). Default
//! shape (d_model 128, 8 heads, FFN 512, 3 layers, L = 32): 609,410 parameters.
//!
//! **Residual on stale confidence (features version 3).** The score of position `s` is
//! `β · ln c_s + f(x)_s`, where `c_s` is the stale confidence (feature 74), `β` a learned scalar
//! (`base_scale`, initially 1) and the head of `f` starts at zero: an untrained network ranks
//! positions exactly by stale confidence (`q(s | y) ∝ c_s`), the training-free baseline it has
//! to beat, and training learns only the correction. Version-2 checkpoints (74 features, no
//! residual) still load and score as before.
//!
//! The network is a burn [`Module`] (`#[derive(Module)]`): its parameters are named by the
//! module tree (`embed.weight`, `encoder.layers.0.mha.query.weight`, ...), checkpoints go
//! through burn-store ([`crate::checkpoint`]) and training through burn-optim's Adam
//! (`spot_train::train`).

use burn_core as burn;

use burn::module::{Initializer, Module, ModuleMapper, Param};
use burn_nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn_nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn_tensor::activation::softmax;
use burn_tensor::backend::Backend;
use burn_tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::analysis::{TokenCalibration, nearest_calibration};
use crate::features::{FEATURES_VERSION, FEATURES_VERSION_2, N_FEATURES, N_FEATURES_V2};
use crate::module_tokens::{ModuleTokens, nearest_enabled};
use crate::prior::{PriorWeight, nearest_weight};
use crate::spiffy::SpiffyGraph;
use crate::tilt::{RankTilt, nearest_tilt};
use spot_tree::rng::SplitMix;

/// Shape of the order network, stored as the JSON file next to every checkpoint.
///
/// burn's [`Config`](burn_core::config::Config) is implemented (`save`, `load`), not derived:
/// the derive's deserialiser ignores unknown fields, and a checkpoint whose config holds a
/// field this build does not know must be refused, not half-read.
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
    /// Rank tilts stored per decoding temperature ([`crate::tilt`]); the scorer uses the one
    /// nearest the target's temperature, none when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_tilt_by_temperature: Vec<RankTilt>,
    /// Rank-path prior weights stored per decoding temperature ([`crate::prior`]); the scorer
    /// uses the one nearest the target's temperature, none when empty or without
    /// [`rank_paths`](Self::rank_paths).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_prior_by_temperature: Vec<PriorWeight>,
    /// The rank-path frequencies the prior reads (a calibrated Spiffy graph).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_paths: Option<SpiffyGraph>,
    /// Whether SPOT drafts the target's token module's tokens, stored per decoding
    /// temperature ([`crate::module_tokens`]); the decoder uses the entry nearest the target's
    /// temperature, stale tokens when empty or when the model folder has no module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub module_tokens_by_temperature: Vec<ModuleTokens>,
}

impl burn::config::Config for OrderModelConfig {}

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
            rank_tilt_by_temperature: Vec::new(),
            rank_prior_by_temperature: Vec::new(),
            rank_paths: None,
            module_tokens_by_temperature: Vec::new(),
        }
    }
}

/// Why an [`OrderModelConfig`] describes no usable network.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A feature definition this build does not compute.
    #[error(
        "features version {version} with {n_features} features; this build reads version {FEATURES_VERSION} with {N_FEATURES} and version {FEATURES_VERSION_2} with {N_FEATURES_V2}"
    )]
    FeaturesVersion {
        /// `features_version` in the config.
        version: u32,
        /// `n_features` in the config.
        n_features: usize,
    },
    /// A size is zero.
    #[error("`{field}` must be positive")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// A size exceeds what a checkpoint may declare (checked before anything is allocated).
    #[error("`{field}` {value} exceeds {max}")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The largest accepted.
        max: usize,
    },
    /// The network would have more parameters than a checkpoint may declare.
    #[error("{count} parameters exceed the limit of {max}")]
    TooManyParameters {
        /// Parameters the shape implies.
        count: u128,
        /// The limit.
        max: u128,
    },
    /// Attention heads do not divide the width.
    #[error("d_model {d_model} is not a multiple of heads {heads}")]
    Heads {
        /// Model width.
        d_model: usize,
        /// Heads.
        heads: usize,
    },
    /// A token calibration table is malformed.
    #[error("token calibration: {0}")]
    Calibration(crate::TableError),
    /// A rank tilt is malformed.
    #[error("rank tilt: {0}")]
    Tilt(crate::TableError),
    /// A rank-path prior weight or the rank paths are malformed.
    #[error("rank-path prior: {0}")]
    Prior(String),
    /// A module-tokens entry is malformed.
    #[error("module tokens: {0}")]
    ModuleTokens(crate::TableError),
}

impl OrderModelConfig {
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
    ///     key: Default::default(), paths: Default::default(),
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

    /// The rank tilt for decoding at `temperature` (the one stored nearest it; 0 without
    /// any), [`crate::tilt`].
    pub fn rank_tilt_for(&self, temperature: f32) -> f32 {
        nearest_tilt(&self.rank_tilt_by_temperature, temperature)
    }

    /// The rank-path prior weight for decoding at `temperature` (the one stored nearest it; 0
    /// without any or without [`rank_paths`](Self::rank_paths)), [`crate::prior`].
    pub fn rank_prior_for(&self, temperature: f32) -> f32 {
        match self.rank_paths {
            Some(_) => nearest_weight(&self.rank_prior_by_temperature, temperature),
            None => 0.0,
        }
    }

    /// Whether decoding at `temperature` drafts the token module's tokens (the entry stored
    /// nearest it; `false` without any), [`crate::module_tokens`].
    pub fn module_tokens_for(&self, temperature: f32) -> bool {
        nearest_enabled(&self.module_tokens_by_temperature, temperature)
    }

    /// Number of parameters of the network this shape builds (no allocation; the same count
    /// as burn's `Module::num_params` of [`OrderModelConfig::init`]'s network).
    ///
    /// ```
    /// assert_eq!(spot_drafter::OrderModelConfig::default().parameter_count(), 609_410);
    /// ```
    pub fn parameter_count(&self) -> usize {
        usize::try_from(self.parameters_u128()).unwrap_or(usize::MAX)
    }

    /// [`OrderModelConfig::parameter_count`] without overflow, for sizes read from a file.
    fn parameters_u128(&self) -> u128 {
        let (d, f) = (self.d_model as u128, self.ffn as u128);
        // Two norms, four attention projections, the two feed-forward layers.
        let per_layer = 4 * d + 4 * (d * d + d) + 2 * d * f + f + d;
        let embed = self.n_features as u128 * d + d + self.block_size as u128 * d;
        let head = 2 * d + d + 1 + u128::from(self.residual());
        embed + self.layers as u128 * per_layer + head
    }

    /// Whether the shape is usable (known features, positive and bounded sizes, heads divide
    /// `d_model`, well-formed calibrations).
    ///
    /// ```
    /// use spot_drafter::{network::ConfigError, OrderModelConfig};
    /// let cfg = OrderModelConfig { heads: 3, ..OrderModelConfig::default() };
    /// assert_eq!(cfg.check(), Err(ConfigError::Heads { d_model: 128, heads: 3 }));
    /// ```
    pub fn check(&self) -> Result<(), ConfigError> {
        let known = [
            (FEATURES_VERSION, N_FEATURES),
            (FEATURES_VERSION_2, N_FEATURES_V2),
        ];
        if !known.contains(&(self.features_version, self.n_features)) {
            return Err(ConfigError::FeaturesVersion {
                version: self.features_version,
                n_features: self.n_features,
            });
        }
        // Sizes come from a file: bound them before anything is allocated from them.
        for (field, value, max) in [
            ("block_size", self.block_size, 4096),
            ("d_model", self.d_model, 8192),
            ("heads", self.heads, 256),
            ("ffn", self.ffn, 65_536),
            ("layers", self.layers, 64),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
            if value > max {
                return Err(ConfigError::TooLarge { field, value, max });
            }
        }
        let count = self.parameters_u128();
        if count > MAX_PARAMETERS {
            return Err(ConfigError::TooManyParameters {
                count,
                max: MAX_PARAMETERS,
            });
        }
        for c in self
            .token_calibration
            .iter()
            .chain(&self.token_calibration_by_temperature)
        {
            c.check().map_err(ConfigError::Calibration)?;
        }
        for t in &self.rank_tilt_by_temperature {
            t.check().map_err(ConfigError::Tilt)?;
        }
        for w in &self.rank_prior_by_temperature {
            w.check().map_err(|e| ConfigError::Prior(e.to_string()))?;
        }
        for m in &self.module_tokens_by_temperature {
            m.check().map_err(ConfigError::ModuleTokens)?;
        }
        if let Some(g) = &self.rank_paths {
            g.check()
                .map_err(|e| ConfigError::Prior(format!("rank_paths: {e}")))?;
            if g.block_size != self.block_size {
                return Err(ConfigError::Prior(format!(
                    "rank_paths: calibrated for blocks of {}, the network for {}",
                    g.block_size, self.block_size
                )));
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(ConfigError::Heads {
                d_model: self.d_model,
                heads: self.heads,
            });
        }
        Ok(())
    }

    /// A freshly initialised network on `device` (burn's config-to-module idiom; the same as
    /// [`OrderModel::init`] with seed 0). The shape must pass [`OrderModelConfig::check`].
    pub fn init<B: Backend>(&self, device: &B::Device) -> OrderModel<B> {
        OrderModel::init(self.clone(), 0, device)
    }

    /// The network's modules with every parameter zero (norm scales one); [`OrderModel::init`]
    /// then draws the weights from its seed.
    fn modules<B: Backend>(&self, device: &B::Device) -> OrderModel<B> {
        let (d, l) = (self.d_model, self.block_size);
        let linear = |i: usize, o: usize| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::Zeros)
                .init(device)
        };
        let encoder = TransformerEncoderConfig::new(d, self.ffn, self.heads, self.layers)
            .with_dropout(0.0)
            .with_norm_first(true)
            .with_initializer(Initializer::Zeros)
            .init(device);
        OrderModel {
            embed: linear(self.n_features, d),
            position: Param::from_tensor(Tensor::zeros([l, d], device)),
            encoder,
            final_ln: LayerNormConfig::new(d).init(device),
            head: linear(d, 1),
            base_scale: self
                .residual()
                .then(|| Param::from_tensor(Tensor::ones([1], device))),
            cfg: self.clone(),
        }
    }
}

/// The order network on backend `B`.
#[derive(Module, Debug)]
pub struct OrderModel<B: Backend> {
    /// Features to `d_model`.
    pub(crate) embed: Linear<B>,
    /// Learned position embedding `[block_size, d_model]`.
    pub(crate) position: Param<Tensor<B, 2>>,
    /// Pre-norm transformer encoder.
    pub(crate) encoder: TransformerEncoder<B>,
    /// Final norm.
    pub(crate) final_ln: LayerNorm<B>,
    /// `d_model` to one score per position.
    pub(crate) head: Linear<B>,
    /// `β`, the weight of `ln` stale confidence (residual networks only).
    pub(crate) base_scale: Option<Param<Tensor<B, 1>>>,
    /// The shape and calibrations.
    #[module(skip)]
    cfg: OrderModelConfig,
}

impl<B: Backend> OrderModel<B> {
    /// A freshly initialised network, deterministic in `seed` on every backend and thread:
    /// weights normal(0, 0.02) from a seeded host generator, zero biases, unit norms; in a
    /// residual network the head starts at zero and `β` at one. The shape must pass
    /// [`OrderModelConfig::check`].
    pub fn init(cfg: OrderModelConfig, seed: u64, device: &B::Device) -> Self {
        let residual = cfg.residual();
        cfg.modules(device).map(&mut SeededInit {
            rng: SplitMix(seed),
            path: Vec::new(),
            residual,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OrderModelConfig {
        &self.cfg
    }

    /// The device.
    pub fn device(&self) -> B::Device {
        self.position.device()
    }

    /// Attaches (or removes) the token calibration stored with the checkpoint.
    pub fn set_token_calibration(&mut self, c: Option<TokenCalibration>) {
        self.cfg.token_calibration = c;
    }

    /// Attaches the per-temperature rank tilts stored with the checkpoint ([`crate::tilt`]).
    pub fn set_rank_tilts(&mut self, t: Vec<RankTilt>) {
        self.cfg.rank_tilt_by_temperature = t;
    }

    /// Replaces the rank-path prior: the graph (`None`: keep the stored one) and the weights
    /// per temperature ([`crate::prior`]).
    pub fn set_rank_prior(&mut self, paths: Option<SpiffyGraph>, weights: Vec<PriorWeight>) {
        if paths.is_some() {
            self.cfg.rank_paths = paths;
        }
        self.cfg.rank_prior_by_temperature = weights;
    }

    /// Replaces where SPOT's drafted tokens come from, per temperature
    /// ([`crate::module_tokens`]).
    pub fn set_module_tokens(&mut self, m: Vec<ModuleTokens>) {
        self.cfg.module_tokens_by_temperature = m;
    }

    /// Attaches the per-temperature token calibrations stored with the checkpoint.
    pub fn set_token_calibrations(&mut self, c: Vec<TokenCalibration>) {
        self.cfg.token_calibration_by_temperature = c;
    }

    /// Scores `[N, L]` of features `[N, L, n_features]` (unnormalised, every position).
    pub fn scores(&self, features: Tensor<B, 3>) -> Tensor<B, 2> {
        let [n, l, _] = features.dims();
        let position = self.position.val().narrow(0, 0, l).unsqueeze::<3>();
        let x = self.embed.forward(features.clone()) + position;
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        let out = self.head.forward(self.final_ln.forward(x)).reshape([n, l]);
        match &self.base_scale {
            None => out,
            Some(beta) => {
                let base = features.narrow(2, BASE_FEATURE, 1).reshape([n, l]);
                out + base * beta.val().reshape([1, 1])
            }
        }
    }

    /// `q(s | y)` for a batch: softmax of the scores over the positions where `valid` is 1.0
    /// (the masked positions of each state), 0 elsewhere. `features` is `[n, L, F]` row-major,
    /// `valid` `[n, L]`; returns `n * L` probabilities.
    pub fn probabilities(&self, features: &[f32], valid: &[f32], n: usize) -> Vec<f32> {
        let l = self.cfg.block_size;
        let f = self.cfg.n_features;
        let device = self.device();
        let x = Tensor::<B, 3>::from_data(TensorData::new(features.to_vec(), [n, l, f]), &device);
        let bias: Vec<f32> = valid
            .iter()
            .map(|&v| if v > 0.0 { 0.0 } else { -1e9 })
            .collect();
        let bias = Tensor::<B, 2>::from_data(TensorData::new(bias, [n, l]), &device);
        let p = softmax(self.scores(x) + bias, 1);
        p.to_data()
            .iter::<f32>()
            .zip(valid)
            .map(|(p, &v)| if v > 0.0 { p } else { 0.0 })
            .collect()
    }
}

/// Draws a network's initial weights from a seeded host generator, by parameter path: every
/// `weight` and the position embedding normal(0, 0.02), except a residual network's head
/// (kept at zero); biases, norm offsets, norm scales and `β` keep their constant start.
/// Host-side so that a seed gives the same network on every backend and under parallel tests
/// (burn's backend generators are process-global).
struct SeededInit {
    rng: SplitMix,
    path: Vec<String>,
    residual: bool,
}

impl<B: Backend> ModuleMapper<B> for SeededInit {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let last = self.path.last().map(String::as_str);
        let head = self.path.first().is_some_and(|p| p == "head");
        let drawn = matches!(last, Some("weight" | "position")) && !(head && self.residual);
        let (id, value, mapper) = param.consume();
        if !drawn {
            return Param::from_mapped_value(id, value, mapper);
        }
        let shape = value.shape();
        let values: Vec<f32> = (0..shape.num_elements())
            .map(|_| self.rng.normal() * 0.02)
            .collect();
        let mut fresh = Tensor::<B, D>::from_data(TensorData::new(values, shape), &value.device());
        if value.is_require_grad() {
            fresh = fresh.require_grad();
        }
        Param::from_mapped_value(id, fresh, mapper)
    }
}

/// The most parameters a checkpoint may declare (1 GiB of f32).
const MAX_PARAMETERS: u128 = 1 << 28;

/// The feature a residual network adds its output to: `ln` stale confidence.
pub(crate) const BASE_FEATURE: usize = 74;
