//! The learned set drafter of SPOT-Sets: a small network over the target's final hidden
//! states and the stale statistics, trained on the target's own threshold-decoding
//! trajectories (`spot_train::sets_train`).
//!
//! At a hypothesised state `j` threshold steps below the round's root, it predicts for every
//! masked position the same four probabilities as the calibrated tables
//! ([`JoinTable`](crate::JoinTable)): that the position clears `τ` when it leads the
//! step, that it joins a step another position leads, and that the written token is the stale
//! choice or the hedge. Where the tables see only the stale confidence's bin and `j`, the
//! network reads the position's hidden state (projected to [`SetsNetConfig::proj`] values)
//! and [`N_SCALAR`] features of the stale statistics and of the path from the root: where the
//! commits since the stale forward landed relative to the position, how it ranks among the
//! masked positions, `τ` and the temperature. So a position whose neighbour was just
//! committed can be predicted to rise above `τ`, which the stale statistics cannot show.
//!
//! The decoder asks every forward for the hidden states when this drafter drafts
//! ([`JoinModel::wants_hidden_states`]); the network runs on the host (a few thousand
//! multiply-adds per position).
//!
//! ```
//! use spot_sets::net::{SetsNet, SetsNetConfig};
//! let net = SetsNet::init(SetsNetConfig::new(8), 3);
//! let json = net.to_json().unwrap();
//! assert_eq!(SetsNet::from_json(&json).unwrap(), net);
//! assert!(net.config().parameter_count() < 10_000);
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use spot_core::TokenId;
use spot_tree::{ScoreContext, TreeError};

use spot_tree::TableError;
use spot_tree::rng::SplitMix;
use spot_tree::stale::{LiveStale, MARGIN_CAP, StoredPosition};

use crate::builder::{JoinModel, JoinPrediction};
use crate::file::{SetsError, check_header, load_json, save_json};
use crate::tokens::{TokenHead, TokenHeadConfig, TokenInput};

/// File name of a model folder's default learned set drafter (`spot train-sets`).
pub const DEFAULT_SETS_NET: &str = "spot-sets-net.json";

/// Scalar features per position (after the projected hidden state); see [`write_scalars`].
pub const N_SCALAR: usize = 27;

/// The network's outputs per position, as logits: lead, join, stale token, hedge, and
/// whether the position leads the step (the target is most confident about it).
pub const N_OUT: usize = 5;

/// How the network's leader output combines with the order scorer's leader distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaderMode {
    /// The order scorer's weight times the network's odds that the position leads.
    #[default]
    Product,
    /// The order scorer alone.
    Off,
}

/// The widest hidden state or layer a file may declare.
const MAX_WIDTH: usize = 1 << 14;

/// Shape of a [`SetsNet`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetsNetConfig {
    /// Width of the target's hidden states.
    pub hidden_dim: usize,
    /// Width they are projected to.
    pub proj: usize,
    /// Width of the two hidden layers.
    pub width: usize,
    /// Scalar features per position ([`N_SCALAR`]).
    pub n_scalar: usize,
}

impl SetsNetConfig {
    /// The default shape for a target with hidden states of width `hidden_dim`.
    pub fn new(hidden_dim: usize) -> Self {
        Self {
            hidden_dim,
            proj: 32,
            width: 64,
            n_scalar: N_SCALAR,
        }
    }

    /// `(name, shape)` of every parameter, in storage order.
    pub fn params(&self) -> Vec<(&'static str, [usize; 2])> {
        let (h, p, w, s) = (self.hidden_dim, self.proj, self.width, self.n_scalar);
        vec![
            ("proj.weight", [h, p]),
            ("proj.bias", [1, p]),
            ("fc1.weight", [p + s, w]),
            ("fc1.bias", [1, w]),
            ("fc2.weight", [w, w]),
            ("fc2.bias", [1, w]),
            ("out.weight", [w, N_OUT]),
            ("out.bias", [1, N_OUT]),
        ]
    }

    /// The number of parameters.
    pub fn parameter_count(&self) -> usize {
        self.params().iter().map(|(_, [a, b])| a * b).sum()
    }

    /// Checks the widths.
    pub fn check(&self) -> Result<(), TableError> {
        if self.n_scalar != N_SCALAR {
            return Err(TableError::field(
                "config.n_scalar",
                format!(
                    "is {}, this build computes {N_SCALAR} features",
                    self.n_scalar
                ),
            ));
        }
        for (name, v) in [
            ("hidden_dim", self.hidden_dim),
            ("proj", self.proj),
            ("width", self.width),
        ] {
            if v == 0 || v > MAX_WIDTH {
                return Err(TableError::field(
                    format!("config.{name}"),
                    format!("must be in [1, {MAX_WIDTH}], got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// A hypothesised state the drafter predicts the next threshold step of, with what the
/// features read besides the stale statistics.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    /// The round's root (the verified state).
    pub root: &'a [TokenId],
    /// The hypothesised state.
    pub node: &'a [TokenId],
    /// The mask id.
    pub mask: TokenId,
    /// Threshold steps between the root and the node.
    pub steps: usize,
    /// The threshold `τ`.
    pub tau: f32,
    /// The decoding temperature.
    pub temperature: f32,
}

/// Writes the [`N_SCALAR`] scalar features of masked position `s` of `view.node`, whose
/// stale statistics are `p`, into `out`; `conf(t)` is the stale statistics of position `t`
/// as (confidence, entropy) (`None` where there are none). A position the stale statistics
/// saw masked is one with statistics other than a committed position's (confidence 1,
/// entropy 0): the commits they did not see are those of the round's last step and of the
/// path below the root.
///
/// | index | feature |
/// |---|---|
/// | 0-3 | stale confidence `c`, `ln c / 10`, `c − τ`, `c > τ` |
/// | 4-9 | entropy / 5, tail mass, top-1 and top-2 probability, hedge probability, noised margin / cap |
/// | 10 | threshold steps below the root / 8 |
/// | 11 | positions committed between the root and the node / block |
/// | 12-14 | of those, how many lie at distance 1, 2-3 and 4-7 from `s` (/ 2, 4, 8) |
/// | 15 | committed neighbours of `s` at the root (/ 2) |
/// | 16 | `s` / block |
/// | 17 | masked share of the node |
/// | 18 | rank of `c` among the node's masked positions / their count (0: the most confident) |
/// | 19 | other masked positions with stale confidence above `τ` / block |
/// | 20 | the largest other stale confidence among them |
/// | 21 | `τ` |
/// | 22 | the temperature (capped at 2) / 2 |
/// | 23-26 | commits the stale statistics did not see: in the node / block, and at distance 1, 2-3 and 4-7 from `s` (/ 2, 4, 8) |
pub fn write_scalars(
    view: &NodeView<'_>,
    s: usize,
    p: &StoredPosition,
    conf: &dyn Fn(usize) -> Option<(f32, f32)>,
    out: &mut [f32; N_SCALAR],
) {
    let l = view.node.len().max(1);
    let lf = l as f32;
    let c = p.confidence;
    // Exact decoding passes τ = ∞: nothing clears it, as nothing clears 1.
    let tau = if view.tau.is_finite() {
        view.tau.clamp(0.0, 1.0)
    } else {
        1.0
    };
    let top = |k: usize| p.top_probs.get(k).copied().unwrap_or(0.0);
    let mut new = [0usize; 4];
    let mut unseen = [0usize; 4];
    let count = |c: &mut [usize; 4], d: usize| {
        c[0] += 1;
        match d {
            1 => c[1] += 1,
            2..=3 => c[2] += 1,
            4..=7 => c[3] += 1,
            _ => {}
        }
    };
    let mut around = 0usize;
    for (t, (&r, &n)) in view.root.iter().zip(view.node).enumerate() {
        let d = t.abs_diff(s);
        if r == view.mask && n != view.mask {
            count(&mut new, d);
        }
        let seen_masked = conf(t).is_some_and(|(c, e)| c < 1.0 || e > 0.0);
        if n != view.mask && seen_masked {
            count(&mut unseen, d);
        }
        if d == 1 && r != view.mask {
            around += 1;
        }
    }
    let (mut masked, mut rank, mut above, mut best) = (0usize, 0usize, 0usize, 0.0f32);
    for (t, &n) in view.node.iter().enumerate() {
        if n != view.mask || t == s {
            continue;
        }
        masked += 1;
        let Some((o, _)) = conf(t) else { continue };
        if o > c || (o == c && t < s) {
            rank += 1;
        }
        if o > tau {
            above += 1;
        }
        best = best.max(o);
    }
    *out = [
        c,
        c.max(1e-6).ln() / 10.0,
        c - tau,
        f32::from(u8::from(c > tau)),
        p.entropy / 5.0,
        p.tail_mass,
        top(0),
        top(1),
        p.hedge_prob,
        p.margin / MARGIN_CAP,
        view.steps as f32 / 8.0,
        new[0] as f32 / lf,
        new[1] as f32 / 2.0,
        new[2] as f32 / 4.0,
        new[3] as f32 / 8.0,
        around as f32 / 2.0,
        s as f32 / lf,
        (masked + 1) as f32 / lf,
        rank as f32 / (masked + 1) as f32,
        above as f32 / lf,
        best,
        tau,
        view.temperature.clamp(0.0, 2.0) / 2.0,
        unseen[0] as f32 / lf,
        unseen[1] as f32 / 2.0,
        unseen[2] as f32 / 4.0,
        unseen[3] as f32 / 8.0,
    ];
}

/// The learned set drafter: weights and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct SetsNet {
    cfg: SetsNetConfig,
    /// Parameters in [`SetsNetConfig::params`] order, row-major.
    params: Vec<Vec<f32>>,
    /// The token head (`None`: the stale choice and the hedge, weighted by the network's
    /// token and hedge outputs).
    tokens: Option<TokenHead>,
    /// How its leader output is used.
    leader: LeaderMode,
    /// The thresholds and temperatures of the trajectories it was trained on.
    trained_on: Vec<(f32, f32)>,
    /// What the round's predictions share, and their buffers.
    round: RoundCache,
}

/// What every prediction of a round computes alike, per position of the block, kept until
/// the stale statistics change (a round's nodes share them), and the buffers a prediction
/// reuses. Not part of the network's value: any two caches compare equal.
#[derive(Clone, Debug, Default)]
struct RoundCache {
    /// The positions' stale statistics as the features read them.
    stale: LiveStale,
    /// The projected hidden state with its bias, `proj` values a position.
    proj: Vec<f32>,
    /// The token head's candidates at each position (neighbours set per prediction).
    inputs: Vec<TokenInput>,
    /// The token head's context from the hidden state, `dim` values a position.
    context: Vec<f32>,
    /// One prediction's buffers: the network's layers, the head's context and its
    /// probabilities.
    layers: Layers,
    c: Vec<f32>,
    probs: Vec<f32>,
}

impl PartialEq for RoundCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The network's activations after the projection.
#[derive(Clone, Debug, Default)]
struct Layers {
    z0: Vec<f32>,
    z1: Vec<f32>,
    z2: Vec<f32>,
}

/// Inputs per position: the hidden state, then the scalars.
fn input_width(cfg: &SetsNetConfig) -> usize {
    cfg.hidden_dim + cfg.n_scalar
}

impl SetsNet {
    /// A freshly initialised network (normal weights scaled by `1 / sqrt(fan-in)`, zero
    /// biases), deterministic in `seed`.
    pub fn init(cfg: SetsNetConfig, seed: u64) -> Self {
        let mut rng = SplitMix(seed ^ 0x5e75);
        let params = cfg
            .params()
            .iter()
            .map(|(name, [a, b])| {
                if name.ends_with("bias") {
                    vec![0.0; a * b]
                } else {
                    let std = (2.0 / *a as f32).sqrt();
                    (0..a * b).map(|_| rng.normal() * std).collect()
                }
            })
            .collect();
        Self {
            cfg,
            params,
            tokens: None,
            leader: LeaderMode::default(),
            trained_on: Vec::new(),
            round: RoundCache::default(),
        }
    }

    /// A network from parameters in [`SetsNetConfig::params`] order; lengths are checked.
    pub fn from_params(cfg: SetsNetConfig, params: Vec<Vec<f32>>) -> Result<Self, TableError> {
        cfg.check()?;
        TableError::check_params(&cfg.params(), &params)?;
        Ok(Self {
            cfg,
            params,
            tokens: None,
            leader: LeaderMode::default(),
            trained_on: Vec::new(),
            round: RoundCache::default(),
        })
    }

    /// How the leader output is used.
    pub fn leader_mode(&self) -> LeaderMode {
        self.leader
    }

    /// Sets how the leader output is used.
    pub fn set_leader_mode(&mut self, mode: LeaderMode) {
        self.leader = mode;
    }

    /// The token head, if any.
    pub fn token_head(&self) -> Option<&TokenHead> {
        self.tokens.as_ref()
    }

    /// Attaches (or removes) a token head; its hidden width must be the network's.
    pub fn set_token_head(&mut self, head: Option<TokenHead>) -> Result<(), TableError> {
        if let Some(h) = &head {
            h.check(MAX_WIDTH)?;
            if h.cfg.hidden_dim != self.cfg.hidden_dim {
                return Err(TableError::field(
                    "token_head.config.hidden_dim",
                    format!(
                        "reads hidden states of width {}, the network {}",
                        h.cfg.hidden_dim, self.cfg.hidden_dim
                    ),
                ));
            }
        }
        self.tokens = head;
        // The round's candidates and contexts were the previous head's.
        self.round = RoundCache::default();
        Ok(())
    }

    /// The shape.
    pub fn config(&self) -> &SetsNetConfig {
        &self.cfg
    }

    /// The parameters, in [`SetsNetConfig::params`] order.
    pub fn params(&self) -> &[Vec<f32>] {
        &self.params
    }

    /// The `(τ, temperature)` pairs of the trajectories it was trained on.
    pub fn trained_on(&self) -> &[(f32, f32)] {
        &self.trained_on
    }

    /// Records the `(τ, temperature)` pairs it was trained on.
    pub fn set_trained_on(&mut self, pairs: Vec<(f32, f32)>) {
        self.trained_on = pairs;
    }

    /// Appends the network's input row for one position to `out`: the hidden state (zeros
    /// when it has another width, e.g. none), then the scalars.
    pub fn inputs(&self, hidden: &[f32], scalars: &[f32; N_SCALAR], out: &mut Vec<f32>) {
        write_inputs(&self.cfg, hidden, scalars, out);
    }

    /// The four logits (lead, join, stale token, hedge) of one input row.
    pub fn logits(&self, x: &[f32]) -> [f32; N_OUT] {
        let c = &self.cfg;
        let mut proj = Vec::new();
        project(c, &self.params, &x[..c.hidden_dim], &mut proj);
        let scalars = &x[c.hidden_dim..c.hidden_dim + c.n_scalar];
        layers(c, &self.params, &proj, scalars, &mut Layers::default())
    }

    /// The file's JSON text.
    pub fn to_json(&self) -> Result<String, TableError> {
        let file = SetsNetFile {
            format: FORMAT.into(),
            version: SETS_NET_VERSION,
            config: self.cfg.clone(),
            trained_on: self.trained_on.clone(),
            leader: self.leader,
            token_head: self.tokens.as_ref().map(|h| TokenHeadFile {
                config: h.cfg.clone(),
                params: h
                    .cfg
                    .params()
                    .iter()
                    .zip(&h.params)
                    .map(|((name, _), v)| ((*name).to_string(), v.clone()))
                    .collect(),
            }),
            params: self
                .cfg
                .params()
                .iter()
                .zip(&self.params)
                .map(|((name, _), v)| ((*name).to_string(), v.clone()))
                .collect(),
        };
        Ok(serde_json::to_string(&file)?)
    }

    /// Parses and checks a file's JSON text.
    pub fn from_json(text: &str) -> Result<Self, TableError> {
        let file: SetsNetFile = serde_json::from_str(text)?;
        check_header((&file.format, file.version), (FORMAT, SETS_NET_VERSION))?;
        file.config.check()?;
        let params = by_name(file.params, &file.config.params())?;
        let mut net = Self::from_params(file.config, params)?;
        net.trained_on = file.trained_on;
        net.leader = file.leader;
        if let Some(t) = file.token_head {
            t.config.check(MAX_WIDTH)?;
            let params = by_name(t.params, &t.config.params())?;
            net.set_token_head(Some(TokenHead {
                cfg: t.config,
                params,
            }))?;
        }
        Ok(net)
    }

    /// Reads `path`; errors name the file.
    pub fn load(path: &Path) -> Result<Self, SetsError> {
        load_json(path, Self::from_json)
    }

    /// Writes `path`.
    pub fn save(&self, path: &Path) -> Result<(), SetsError> {
        save_json(path, self.to_json())
    }
}

/// The named tensors of a file in `specs` order; a missing or unknown name is an error.
fn by_name(
    mut named: Vec<(String, Vec<f32>)>,
    specs: &[(&'static str, [usize; 2])],
) -> Result<Vec<Vec<f32>>, TableError> {
    let mut params = Vec::new();
    for (name, _) in specs {
        let i = named
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| TableError::field(*name, "is missing"))?;
        params.push(named.swap_remove(i).1);
    }
    if let Some((n, _)) = named.first() {
        return Err(TableError::field(
            n.clone(),
            "is not a parameter of this network",
        ));
    }
    Ok(params)
}

/// See [`SetsNet::inputs`].
pub fn write_inputs(
    cfg: &SetsNetConfig,
    hidden: &[f32],
    scalars: &[f32; N_SCALAR],
    out: &mut Vec<f32>,
) {
    let start = out.len();
    if hidden.len() == cfg.hidden_dim {
        out.extend_from_slice(hidden);
    } else {
        out.resize(start + cfg.hidden_dim, 0.0);
    }
    out.extend_from_slice(scalars);
    debug_assert_eq!(out.len() - start, input_width(cfg));
}

/// `out[j] += Σ_i x[i] · w[i * cols + j]`.
#[inline(always)]
fn affine_into(x: &[f32], w: &[f32], cols: usize, out: &mut [f32]) {
    for (&xi, row) in x.iter().zip(w.chunks_exact(cols)) {
        if xi != 0.0 {
            for (o, &wij) in out.iter_mut().zip(row) {
                *o += xi * wij;
            }
        }
    }
}

/// The projection of a hidden state with its bias (`proj` values into `out`); a hidden state
/// of another width counts as zeros.
fn project(cfg: &SetsNetConfig, ps: &[Vec<f32>], hidden: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(&ps[1]);
    if hidden.len() == cfg.hidden_dim {
        affine_into(hidden, &ps[0], cfg.proj, out);
    }
}

/// The logits from a position's projection and scalars, through the two hidden layers,
/// compiled for the widest SIMD the CPU has. Each output sums its inputs in the same order
/// whatever the vector width (and Rust fuses no multiply-add), so every width gives the same
/// bits (tested against [`LayersCall::run`] called directly).
fn layers(
    cfg: &SetsNetConfig,
    ps: &[Vec<f32>],
    proj: &[f32],
    scalars: &[f32],
    z: &mut Layers,
) -> [f32; N_OUT] {
    pulp::Arch::new().dispatch(LayersCall {
        cfg,
        ps,
        proj,
        scalars,
        z,
    })
}

/// One call of [`layers`]: [`LayersCall::run`] compiled for the widest SIMD the CPU has
/// through [`pulp`]'s dispatch, or for the crate's own target when called directly.
struct LayersCall<'a> {
    cfg: &'a SetsNetConfig,
    ps: &'a [Vec<f32>],
    proj: &'a [f32],
    scalars: &'a [f32],
    z: &'a mut Layers,
}

impl pulp::WithSimd for LayersCall<'_> {
    type Output = [f32; N_OUT];

    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _: V) -> [f32; N_OUT] {
        self.run()
    }
}

impl LayersCall<'_> {
    #[inline(always)]
    fn run(self) -> [f32; N_OUT] {
        let Self {
            cfg,
            ps,
            proj,
            scalars,
            z,
        } = self;
        z.z0.clear();
        z.z0.extend_from_slice(proj);
        z.z0.extend_from_slice(scalars);
        z.z1.clone_from(&ps[3]);
        affine_into(&z.z0, &ps[2], cfg.width, &mut z.z1);
        z.z1.iter_mut().for_each(|v| *v = v.max(0.0));
        z.z2.clone_from(&ps[5]);
        affine_into(&z.z1, &ps[4], cfg.width, &mut z.z2);
        z.z2.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut out = [0.0f32; N_OUT];
        out.copy_from_slice(&ps[7]);
        affine_into(&z.z2, &ps[6], N_OUT, &mut out);
        out
    }
}

/// The logistic function.
pub fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// The file format tag.
const FORMAT: &str = "spot-sets-net";
/// The file format version.
pub const SETS_NET_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetsNetFile {
    format: String,
    version: u32,
    config: SetsNetConfig,
    #[serde(default)]
    trained_on: Vec<(f32, f32)>,
    #[serde(default)]
    leader: LeaderMode,
    params: Vec<(String, Vec<f32>)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token_head: Option<TokenHeadFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenHeadFile {
    config: TokenHeadConfig,
    params: Vec<(String, Vec<f32>)>,
}

impl JoinModel for SetsNet {
    fn name(&self) -> &str {
        "spot-sets-net"
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    fn owns_token_weights(&self) -> bool {
        true
    }

    fn predict(
        &mut self,
        ctx: &ScoreContext<'_>,
        state: &[TokenId],
        steps: usize,
        tau: f32,
        out: &mut JoinPrediction,
    ) -> Result<(), TreeError> {
        let dim = ctx.stale.hidden().map(|h| h.0);
        if dim != Some(self.cfg.hidden_dim) {
            return Err(TreeError::Scorer {
                scorer: self.name().into(),
                reason: format!(
                    "needs the target's hidden states of width {}; the model gave {}",
                    self.cfg.hidden_dim,
                    dim.map_or("none".to_string(), |d| format!("width {d}"))
                ),
            });
        }
        let mask = ctx.root.mask_id();
        let (c, ps, head) = (&self.cfg, &self.params, self.tokens.as_ref());
        let round = &mut self.round;
        let fresh = round
            .stale
            .update(ctx.stale, ctx.block_start, ctx.noise, mask);
        let (pw, e) = (c.proj, head.map_or(0, |h| h.cfg.dim));
        let l = ctx.stale.len();
        // `fresh` also on the first call and after `set_token_head` (a new cache).
        if fresh {
            // What every node of the round reads alike: the projections, and the token
            // head's candidates and hidden-state context.
            round.proj.clear();
            round.context.clear();
            round.inputs.clear();
            for s in 0..l {
                let Some(p) = round.stale.stored(s) else {
                    break;
                };
                project(c, ps, &p.hidden, &mut round.c);
                round.proj.extend_from_slice(&round.c);
                if let Some(head) = head {
                    let at = (ctx.block_start + s) as u64;
                    let input =
                        TokenInput::candidates(p, head.cfg.candidates, (ctx.noise, at), mask);
                    round.inputs.push(input);
                    head.hidden_context(&p.hidden, &mut round.c);
                    round.context.extend_from_slice(&round.c);
                }
            }
        }
        let view = NodeView {
            root: ctx.root.tokens(),
            node: state,
            mask,
            steps,
            tau,
            temperature: ctx.temperature,
        };
        let conf = |t: usize| {
            (t < ctx.stale.len()).then(|| (ctx.stale.confidence(t), ctx.stale.entropy(t)))
        };
        let mut scalars = [0.0f32; N_SCALAR];
        let unseen = |t: usize| {
            let n = *state.get(t)?;
            let (c, e) = conf(t)?;
            (n != mask && (c < 1.0 || e > 0.0)).then_some(n)
        };
        if head.is_some() {
            out.choices.clear();
            out.choices.resize(state.len(), [mask; 2]);
        }
        out.leader.clear();
        if self.leader != LeaderMode::Off {
            out.leader.resize(state.len(), 0.0);
        }
        for s in (0..state.len()).filter(|&s| state[s] == mask && s < l) {
            let Some(p) = round.stale.stored(s) else {
                continue;
            };
            write_scalars(&view, s, p, &conf, &mut scalars);
            let proj = &round.proj[s * pw..(s + 1) * pw];
            let z = layers(c, ps, proj, &scalars, &mut round.layers);
            out.lead[s] = sigmoid(z[0]);
            out.join[s] = sigmoid(z[1]);
            out.token[s] = sigmoid(z[2]);
            out.hedge[s] = sigmoid(z[3]).min(1.0 - out.token[s]).max(0.0);
            if let Some(w) = out.leader.get_mut(s) {
                // The odds that it leads, capped so that one position cannot take all mass.
                *w = z[4].clamp(-30.0, 30.0).exp();
            }
            if let (Some(head), Some(input)) = (head, round.inputs.get_mut(s)) {
                input.set_near(s, &unseen);
                round.c.clear();
                round
                    .c
                    .extend_from_slice(&round.context[s * e..(s + 1) * e]);
                head.probabilities_from(&mut round.c, input, &mut round.probs);
                let mut best = [(0.0f32, mask); 2];
                for (&pr, &id) in round.probs.iter().zip(&input.ids) {
                    if pr > best[0].0 {
                        best = [(pr, id), best[0]];
                    } else if pr > best[1].0 {
                        best[1] = (pr, id);
                    }
                }
                out.choices[s] = [best[0].1, best[1].1];
                out.token[s] = best[0].0.clamp(0.0, 1.0);
                out.hedge[s] = best[1].0.clamp(0.0, 1.0 - out.token[s]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_refused_naming_the_problem() {
        let net = SetsNet::init(SetsNetConfig::new(4), 1);
        let json = net.to_json().unwrap();
        let e = SetsNet::from_json(&json.replace("\"version\":1", "\"version\":9")).unwrap_err();
        assert!(matches!(e, TableError::Version { found: 9, .. }), "{e}");
        let e = SetsNet::from_json(&json.replace("fc2.bias", "fc9.bias")).unwrap_err();
        assert!(
            matches!(&e, TableError::Field { field, .. } if field == "fc2.bias"),
            "{e}"
        );
        let e = SetsNet::from_json(&json.replace("\"width\":64", "\"width\":100000000000"))
            .unwrap_err();
        assert!(
            matches!(&e, TableError::Field { field, .. } if field == "config.width"),
            "{e}"
        );
        let e = SetsNet::from_json(&json.replace("\"width\":64", "\"width\":65")).unwrap_err();
        assert!(matches!(e, TableError::Size { .. }), "{e}");
        let e = SetsNet::load(Path::new("/nonexistent/spot-sets-net.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/spot-sets-net.json"));
    }

    /// The uncached path: every position's statistics, input row and token input built
    /// from scratch, as predictions were computed before the round cache.
    fn uncached(net: &SetsNet, ctx: &ScoreContext<'_>, state: &[TokenId]) -> JoinPrediction {
        let (mask, l, tau) = (ctx.root.mask_id(), state.len(), 0.7);
        let mut out = JoinPrediction {
            lead: vec![0.0; l],
            join: vec![0.0; l],
            token: vec![0.0; l],
            hedge: vec![0.0; l],
            choices: vec![[mask; 2]; l],
            leader: vec![0.0; l],
        };
        let view = NodeView {
            root: ctx.root.tokens(),
            node: state,
            mask,
            steps: 1,
            tau,
            temperature: ctx.temperature,
        };
        let conf = |t: usize| {
            (t < ctx.stale.len()).then(|| (ctx.stale.confidence(t), ctx.stale.entropy(t)))
        };
        let unseen = |t: usize| {
            let (n, (c, e)) = (*state.get(t)?, conf(t)?);
            (n != mask && (c < 1.0 || e > 0.0)).then_some(n)
        };
        let head = net.token_head().unwrap();
        for s in (0..l).filter(|&s| state[s] == mask) {
            let p = StoredPosition::from_stats(ctx.stale, s, ctx.block_start, ctx.noise, mask);
            let mut scalars = [0.0; N_SCALAR];
            write_scalars(&view, s, &p, &conf, &mut scalars);
            let mut x = Vec::new();
            net.inputs(&p.hidden, &scalars, &mut x);
            let z = net.logits(&x);
            (out.lead[s], out.join[s]) = (sigmoid(z[0]), sigmoid(z[1]));
            out.leader[s] = z[4].clamp(-30.0, 30.0).exp();
            let at = (ctx.block_start + s) as u64;
            let k = head.cfg.candidates;
            let input = TokenInput::new(&p, k, (ctx.noise, at), mask, s, &unseen);
            let probs = head.probabilities(&input, &p.hidden);
            let mut order: Vec<usize> = (0..probs.len()).collect();
            // The first of equal probabilities wins, as in the builder's pick.
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let (a, b) = (order[0], order[1]);
            out.choices[s] = [input.ids[a], input.ids[b]];
            out.token[s] = probs[a].clamp(0.0, 1.0);
            out.hedge[s] = probs[b].clamp(0.0, 1.0 - out.token[s]);
        }
        out
    }

    /// Predictions through the round cache (projections, candidates and contexts computed
    /// once per position while the statistics stay the same) equal the uncached path bit
    /// for bit, node after node of a round and after the statistics, the noise or the
    /// block change.
    #[test]
    fn a_round_s_predictions_are_the_uncached_ones_bit_for_bit() {
        use spot_core::{BlockState, BlockStats, GumbelNoise, PositionStats};
        use spot_tree::rng::SplitMix;
        const MASK: TokenId = 49;
        let (l, dim, top) = (12, 16, 8);
        let mut rng = SplitMix(11);
        let below = |rng: &mut SplitMix, n: usize| (rng.uniform() * n as f64) as usize % n;
        let mut net = SetsNet::init(SetsNetConfig::new(dim), 5);
        for b in [1, 3, 5, 7] {
            net.params[b]
                .iter_mut()
                .for_each(|v| *v = rng.normal() * 0.3);
        }
        let hc = TokenHeadConfig {
            vocab: 50,
            dim: 8,
            candidates: 6,
            hidden_dim: dim,
        };
        let mut head = TokenHead::init(hc, None, 2);
        for p in head.params.iter_mut().skip(1) {
            p.iter_mut().for_each(|v| *v = rng.normal() * 0.5);
        }
        net.set_token_head(Some(head)).unwrap();
        let stats = |rng: &mut SplitMix| {
            let mut st = BlockStats::new(top);
            for s in 0..l {
                let ids: Vec<TokenId> = (0..top)
                    .map(|k| ((s * 7 + k * 5 + below(rng, 3)) % 49) as TokenId)
                    .collect();
                let mut probs: Vec<f32> = (0..top).map(|_| rng.uniform() as f32).collect();
                probs.sort_by(|a, b| b.total_cmp(a));
                let committed = s % 5 == 1;
                let c = if committed { 1.0 } else { probs[0] };
                st.push(PositionStats {
                    token: ids[0],
                    confidence: c,
                    token_prob: c,
                    entropy: if committed { 0.0 } else { 1.2 },
                    tail_mass: 0.1,
                    top_ids: &ids,
                    top_probs: &probs,
                })
                .unwrap();
            }
            let hidden = (0..l * dim).map(|_| rng.normal()).collect();
            st.set_hidden(dim, hidden).unwrap();
            st
        };
        let root_tokens: Vec<TokenId> = (0..l).map(|s| if s % 5 == 1 { 3 } else { MASK }).collect();
        let root = BlockState::from_tokens(root_tokens.clone(), MASK);
        for (round, (noise, temperature, start)) in [
            (None, 0.0, 32),
            (None, 0.0, 32),
            (Some(GumbelNoise::new(3)), 1.0, 32),
            (Some(GumbelNoise::new(3)), 1.0, 64),
        ]
        .into_iter()
        .enumerate()
        {
            // Rounds 0 and 1 share their statistics (the cache carries over); the others
            // draw new ones.
            let st = if round == 1 {
                let mut r = SplitMix(100);
                stats(&mut r)
            } else {
                let mut r = SplitMix(100 + round as u64);
                stats(&mut r)
            };
            let ctx = ScoreContext {
                root: &root,
                stale: &st,
                block_start: start,
                noise,
                temperature,
            };
            for node in 0..6 {
                let mut state = root_tokens.clone();
                for _ in 0..node {
                    let s = below(&mut rng, l);
                    if state[s] == MASK {
                        state[s] = below(&mut rng, 49) as TokenId;
                    }
                }
                let want = uncached(&net, &ctx, &state);
                let mut got = JoinPrediction::default();
                got.reset(l);
                net.predict(&ctx, &state, 1, 0.7, &mut got).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for (name, a, b) in [
                    ("lead", &got.lead, &want.lead),
                    ("join", &got.join, &want.join),
                    ("token", &got.token, &want.token),
                    ("hedge", &got.hedge, &want.hedge),
                    ("leader", &got.leader, &want.leader),
                ] {
                    assert_eq!(bits(a), bits(b), "{name}, round {round}, node {node}");
                }
                assert_eq!(got.choices, want.choices, "round {round}, node {node}");
            }
        }
    }

    /// The dispatched layers give the portable build's bits.
    #[test]
    fn the_layers_give_the_same_bits_at_every_simd_width() {
        use spot_tree::rng::SplitMix;
        let mut rng = SplitMix(7);
        let net = SetsNet::init(SetsNetConfig::new(24), 9);
        let c = net.config().clone();
        for _ in 0..200 {
            let proj: Vec<f32> = (0..c.proj).map(|_| rng.normal()).collect();
            let scalars: Vec<f32> = (0..c.n_scalar).map(|_| rng.normal()).collect();
            let a = layers(&c, net.params(), &proj, &scalars, &mut Layers::default());
            let b = LayersCall {
                cfg: &c,
                ps: net.params(),
                proj: &proj,
                scalars: &scalars,
                z: &mut Layers::default(),
            }
            .run();
            assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits));
        }
    }

    #[test]
    fn scalars_see_where_the_path_committed() {
        const M: TokenId = 99;
        let root = [M, 5, M, M, M, M];
        let node = [M, 5, 7, M, M, 8];
        let view = NodeView {
            root: &root,
            node: &node,
            mask: M,
            steps: 1,
            tau: 0.5,
            temperature: 1.0,
        };
        let p = StoredPosition {
            position: 3,
            token: 1,
            runner_up: 2,
            confidence: 0.4,
            entropy: 1.0,
            tail_mass: 0.0,
            hedge: 2,
            hedge_prob: 0.3,
            margin: 1.0,
            top_probs: vec![0.4, 0.3],
            top_ids: vec![1, 2],
            hidden: Vec::new(),
        };
        // Position 1 was committed when the stale statistics were computed; 2 and 5 were not.
        let confs = [0.9f32, 1.0, 0.2, 0.4, 0.6, 0.1];
        let conf = |t: usize| confs.get(t).map(|&c| (c, if c < 1.0 { 1.0 } else { 0.0 }));
        let mut out = [0.0; N_SCALAR];
        write_scalars(&view, 3, &p, &conf, &mut out);
        // Two commits since the root, at distances 1 and 2; one committed neighbour at the
        // root (none: position 1 is at distance 2).
        assert_eq!(out[11], 2.0 / 6.0);
        assert_eq!((out[12], out[13], out[14]), (0.5, 0.25, 0.0));
        assert_eq!(out[15], 0.0);
        // Masked at the node: 0, 3, 4; position 3 ranks after 0 (0.9) and 4 (0.6).
        assert_eq!(out[18], 2.0 / 3.0);
        assert_eq!((out[19], out[20]), (2.0 / 6.0, 0.9));
        assert_eq!((out[21], out[22]), (0.5, 0.5));
        // Unseen by the stale statistics: positions 2 (distance 1) and 5 (distance 2).
        assert_eq!(&out[23..], &[2.0 / 6.0, 0.5, 0.25, 0.0]);
    }
}
