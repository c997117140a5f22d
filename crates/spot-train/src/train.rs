//! Algorithm 1: train the order network on draft-free trajectories.
//!
//! Every step `t ≥ 1` of every block and every depth `d ≤ max_depth` gives one example: the
//! root after `t` steps plus the next `d` true commits, the stale statistics of step `t - 1`,
//! and the position of step `t + d`'s commit as the target (cross-entropy over the positions
//! masked in the example's state). Adam with a warm-up and cosine learning-rate schedule, a
//! held-out split by prompt, and per-epoch next-commit accuracy by depth next to the
//! stale-confidence ranking baseline.

use burn_core::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::activation::log_softmax;
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{Tensor, TensorData};

use spot_drafter::analysis::{CalibrationPaths, TokenCalibration};
use spot_drafter::features::{StaleSource, write_features};
use spot_drafter::network::{ConfigError, OrderModel, OrderModelConfig};
use std::collections::HashMap;

use crate::fit::FitCalibration;
use crate::trajectory::{StepRecord, Trajectory};
use spot_tree::rng::SplitMix;

/// Training settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Passes over the training examples.
    pub epochs: usize,
    /// Examples per optimiser step.
    pub batch_size: usize,
    /// Peak Adam learning rate: reached after a linear warm-up over the first 2% of the steps
    /// (at most 500), then decayed along a cosine to a tenth of it at the last step.
    pub lr: f64,
    /// Deepest replay depth `d` (Algorithm 1 uses 0..=7).
    pub max_depth: usize,
    /// Share of prompts held out for evaluation, spread evenly over the list (so every
    /// collection directory and temperature is represented), each with every trajectory
    /// decoded from it (by [`Trajectory::id`]).
    pub holdout: f64,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Use at most this many training examples per epoch (a seeded sample; `None`: all).
    pub max_examples: Option<usize>,
    /// Evaluate each epoch on at most this many held-out examples (a fixed seeded sample;
    /// `None`: all).
    pub max_heldout: Option<usize>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 10,
            batch_size: 256,
            lr: 3e-4,
            max_depth: 7,
            holdout: 0.1,
            seed: 0,
            max_examples: None,
            max_heldout: None,
        }
    }
}

/// Accuracy of one evaluation, by depth.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accuracy {
    /// Per depth: examples.
    pub count: Vec<usize>,
    /// Per depth: examples where the network's top position is the true next commit.
    pub drafter_hits: Vec<usize>,
    /// Per depth: examples where the most stale-confident masked position is.
    pub confidence_hits: Vec<usize>,
    /// Mean cross-entropy (nats) of the network.
    pub loss: f64,
}

impl Accuracy {
    fn new(depths: usize) -> Self {
        Self {
            count: vec![0; depths],
            drafter_hits: vec![0; depths],
            confidence_hits: vec![0; depths],
            loss: 0.0,
        }
    }

    fn rate(hits: &[usize], count: &[usize]) -> f64 {
        let n: usize = count.iter().sum();
        hits.iter().sum::<usize>() as f64 / n.max(1) as f64
    }

    /// The network's accuracy over all depths.
    pub fn drafter(&self) -> f64 {
        Self::rate(&self.drafter_hits, &self.count)
    }

    /// The stale-confidence ranking's accuracy over all depths.
    pub fn confidence(&self) -> f64 {
        Self::rate(&self.confidence_hits, &self.count)
    }
}

/// What one epoch did.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    /// 1-based epoch.
    pub epoch: usize,
    /// Mean training cross-entropy over the epoch.
    pub train_loss: f64,
    /// Held-out evaluation.
    pub heldout: Accuracy,
    /// Seconds the epoch took (training and evaluation).
    pub seconds: f64,
}

/// Progress callbacks of [`train`].
pub trait TrainObserver {
    /// Before training: example counts.
    fn start(&mut self, _train_examples: usize, _heldout_examples: usize, _steps_per_epoch: usize) {
    }
    /// After each optimiser step: the batch loss.
    fn step(&mut self, _epoch: usize, _step: usize, _loss: f64) {}
    /// After each epoch.
    fn epoch(&mut self, _report: &EpochReport) {}
}

impl TrainObserver for () {}

/// One example: trajectory, block, step `t`, depth `d`, target position.
#[derive(Clone, Copy, Debug)]
struct ExampleRef {
    traj: u32,
    block: u32,
    t: u32,
    depth: u8,
    target: u8,
}

fn example_refs(trajs: &[Trajectory], ids: &[usize], max_depth: usize) -> Vec<ExampleRef> {
    let mut v = Vec::new();
    for &ti in ids {
        for (bi, b) in trajs[ti].blocks.iter().enumerate() {
            for t in 1..b.steps.len() {
                for d in 0..=max_depth {
                    let Some(step) = b.steps.get(t + d) else {
                        break;
                    };
                    if let [c] = step.commits.as_slice() {
                        v.push(ExampleRef {
                            traj: ti as u32,
                            block: bi as u32,
                            t: t as u32,
                            depth: d as u8,
                            target: c.position as u8,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Features, valid mask and targets of a batch, written into reusable buffers.
#[derive(Default)]
struct Batch {
    features: Vec<f32>,
    valid: Vec<f32>,
    target: Vec<usize>,
    depth: Vec<usize>,
    confidence_pick: Vec<usize>,
    state: Vec<u32>,
}

impl Batch {
    fn fill(&mut self, trajs: &[Trajectory], refs: &[ExampleRef], l: usize, nf: usize) {
        let n = refs.len();
        self.features.resize(n * l * nf, 0.0);
        self.valid.resize(n * l, 0.0);
        self.target.clear();
        self.depth.clear();
        self.confidence_pick.clear();
        for (i, r) in refs.iter().enumerate() {
            let tr = &trajs[r.traj as usize];
            let b = &tr.blocks[r.block as usize];
            let mask = tr.mask_id;
            self.state.clear();
            self.state.extend_from_slice(&b.initial);
            for step in &b.steps[..(r.t + u32::from(r.depth)) as usize] {
                for c in &step.commits {
                    self.state[c.position] = c.token;
                }
            }
            let stale: &StepRecord = &b.steps[r.t as usize - 1];
            write_features(
                stale,
                &self.state,
                mask,
                usize::from(r.depth),
                tr.temperature,
                &mut self.features[i * l * nf..(i + 1) * l * nf],
            );
            let mut best: Option<(usize, f32)> = None;
            for (s, &tok) in self.state.iter().enumerate() {
                let m = tok == mask;
                self.valid[i * l + s] = if m { 1.0 } else { 0.0 };
                if m {
                    let c = stale
                        .position(s)
                        .map_or(f32::NEG_INFINITY, |p| p.confidence);
                    if best.is_none_or(|(_, bc)| c > bc) {
                        best = Some((s, c));
                    }
                }
            }
            self.target.push(usize::from(r.target));
            self.depth.push(usize::from(r.depth));
            self.confidence_pick.push(best.map_or(0, |(s, _)| s));
        }
    }
}

/// Cross-entropy of `scores` `[n, L]` against `target`, over positions where `valid` is 1.
fn loss<B: Backend>(
    scores: Tensor<B, 2>,
    valid: &[f32],
    target: &[usize],
    l: usize,
    device: &B::Device,
) -> Tensor<B, 1> {
    let n = target.len();
    let bias: Vec<f32> = valid
        .iter()
        .map(|&v| if v > 0.0 { 0.0 } else { -1e9 })
        .collect();
    let mut onehot = vec![0.0f32; n * l];
    for (i, &t) in target.iter().enumerate() {
        onehot[i * l + t] = 1.0;
    }
    let bias = Tensor::<B, 2>::from_data(TensorData::new(bias, [n, l]), device);
    let onehot = Tensor::<B, 2>::from_data(TensorData::new(onehot, [n, l]), device);
    let lp = log_softmax(scores + bias, 1);
    (lp * onehot).sum().neg().div_scalar(n as f64)
}

/// Evaluates `model` on `refs`: loss and next-commit accuracy by depth.
fn evaluate<B: Backend>(
    model: &OrderModel<B>,
    trajs: &[Trajectory],
    refs: &[ExampleRef],
    depths: usize,
    batch_size: usize,
    batch: &mut Batch,
) -> Accuracy {
    let (l, nf) = (model.config().block_size, model.config().n_features);
    let mut acc = Accuracy::new(depths);
    let mut total = 0.0;
    let device = model.device();
    for chunk in refs.chunks(batch_size.max(1)) {
        batch.fill(trajs, chunk, l, nf);
        let n = chunk.len();
        let x = Tensor::<B, 3>::from_data(
            TensorData::new(batch.features[..n * l * nf].to_vec(), [n, l, nf]),
            &device,
        );
        let scores = model.scores(x);
        let host: Vec<f32> = scores.clone().to_data().iter::<f32>().collect();
        total += scalar(loss(
            scores,
            &batch.valid[..n * l],
            &batch.target,
            l,
            &device,
        )) * n as f64;
        for i in 0..n {
            let row = &host[i * l..(i + 1) * l];
            let pick = top_position(row, (0..l).filter(|&s| batch.valid[i * l + s] > 0.0));
            let d = batch.depth[i];
            acc.count[d] += 1;
            acc.drafter_hits[d] += usize::from(pick == Some(batch.target[i]));
            acc.confidence_hits[d] += usize::from(batch.confidence_pick[i] == batch.target[i]);
        }
    }
    acc.loss = total / refs.len().max(1) as f64;
    acc
}

/// The candidate with the highest score in `row`, ties to the first (the lower index): the
/// order's pick that next-commit accuracy counts. `None` without candidates.
pub(crate) fn top_position(row: &[f32], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    candidates.fold(None, |best, s| match best {
        Some(b) if row[b] >= row[s] => Some(b),
        _ => Some(s),
    })
}

/// Why [`train`] could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// The requested network shape is unusable.
    #[error("drafter shape: {0}")]
    Config(#[from] ConfigError),
    /// The initial checkpoint's shape differs from the requested one.
    #[error("the initial checkpoint's shape {init} differs from the requested {requested}")]
    InitShape {
        /// The checkpoint's `(block_size, d_model, heads, ffn, layers)`.
        init: String,
        /// The requested shape, the same way.
        requested: String,
    },
    /// No trajectories were given.
    #[error("no trajectories")]
    NoTrajectories,
    /// A trajectory's block size differs from the network's.
    #[error("trajectory `{id}` has block size {found}, the drafter {expected}")]
    BlockSize {
        /// The trajectory.
        id: String,
        /// Its block size.
        found: usize,
        /// The network's.
        expected: usize,
    },
    /// A training setting is out of range.
    #[error("`{field}` is {value}; it must be {expected}")]
    Setting {
        /// The [`TrainConfig`] field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The training split holds no example.
    #[error("the trajectories hold no training examples")]
    NoExamples,
    /// A set network or token head to train is malformed.
    #[error("set drafter: {0}")]
    Table(#[from] spot_tree::TableError),
    /// A trajectory's hidden states are not as wide as the set network reads.
    #[error(
        "trajectory `{id}` has hidden states of width {found} (the network reads {expected}); \
         collect with `spot collect --hidden-states`"
    )]
    HiddenWidth {
        /// The trajectory.
        id: String,
        /// Its hidden width.
        found: usize,
        /// The network's.
        expected: usize,
    },
    /// The loss stopped being finite.
    #[error("training loss became {value} at epoch {epoch}, step {step}")]
    NonFiniteLoss {
        /// The loss.
        value: f64,
        /// 1-based epoch.
        epoch: usize,
        /// 0-based step within it.
        step: usize,
    },
}

impl TrainConfig {
    /// Whether the settings are usable (positive epochs, batch size and finite learning
    /// rate; holdout in `[0, 1)`).
    pub fn check(&self) -> Result<(), TrainError> {
        check_settings(self.epochs, self.batch_size, self.lr, self.holdout)
    }
}

/// The settings every trainer shares ([`TrainConfig::check`], the set drafter's
/// `SetsTrainConfig::check`): positive epochs and batch size, a positive finite learning rate,
/// a holdout in `[0, 1)`.
pub(crate) fn check_settings(
    epochs: usize,
    batch_size: usize,
    lr: f64,
    holdout: f64,
) -> Result<(), TrainError> {
    if epochs == 0 {
        return Err(no_epochs());
    }
    let setting = |field, value: String, expected| {
        Err(TrainError::Setting {
            field,
            value,
            expected,
        })
    };
    if batch_size == 0 {
        return setting("batch_size", "0".into(), "positive");
    }
    if !(lr > 0.0 && lr.is_finite()) {
        return setting("lr", lr.to_string(), "positive and finite");
    }
    if !(0.0..1.0).contains(&holdout) {
        return setting("holdout", holdout.to_string(), "in [0, 1)");
    }
    Ok(())
}

/// The error of a training run without an epoch.
pub(crate) fn no_epochs() -> TrainError {
    TrainError::Setting {
        field: "epochs",
        value: "0".into(),
        expected: "positive",
    }
}

/// Trains an order network on `trajs` (Algorithm 1) and returns it with one report per epoch.
///
/// A `holdout` share of the trajectories, spread evenly over the list (at least one when there
/// are two or more), is never trained on; the returned network is the epoch with the lowest
/// held-out loss (the last epoch when nothing is held out), carrying one [`TokenCalibration`]
/// per decoding temperature fitted on the training trajectories. `trajs` must share one block
/// size and mask id. The optimiser is burn-optim's Adam (β 0.9 / 0.999, ε 1e-8) under the
/// warm-up and cosine schedule of [`TrainConfig::lr`].
pub fn train<B: AutodiffBackend>(
    trajs: &[Trajectory],
    model_cfg: OrderModelConfig,
    cfg: &TrainConfig,
    device: &B::Device,
    observer: &mut dyn TrainObserver,
) -> Result<(OrderModel<B::InnerBackend>, Vec<EpochReport>), TrainError> {
    train_from::<B>(trajs, None, model_cfg, cfg, device, observer)
}

/// [`train`], starting from the weights of `init` (a checkpoint of the same shape) instead of
/// a fresh initialisation; Adam's moments start at zero.
pub fn train_from<B: AutodiffBackend>(
    trajs: &[Trajectory],
    init: Option<&OrderModel<B::InnerBackend>>,
    model_cfg: OrderModelConfig,
    cfg: &TrainConfig,
    device: &B::Device,
    observer: &mut dyn TrainObserver,
) -> Result<(OrderModel<B::InnerBackend>, Vec<EpochReport>), TrainError> {
    model_cfg.check()?;
    cfg.check()?;
    let shape = |c: &OrderModelConfig| {
        format!(
            "{:?}",
            (
                c.block_size,
                c.d_model,
                c.heads,
                c.ffn,
                c.layers,
                c.n_features
            )
        )
    };
    if let Some(m) = init.filter(|m| shape(m.config()) != shape(&model_cfg)) {
        return Err(TrainError::InitShape {
            init: shape(m.config()),
            requested: shape(&model_cfg),
        });
    }
    if trajs.is_empty() {
        return Err(TrainError::NoTrajectories);
    }
    if let Some(t) = trajs.iter().find(|t| t.block_size != model_cfg.block_size) {
        return Err(TrainError::BlockSize {
            id: t.id.clone(),
            found: t.block_size,
            expected: model_cfg.block_size,
        });
    }
    let held = heldout_by_prompt(trajs.iter().map(|t| t.id.as_str()), cfg.holdout);
    let n_held = held.iter().filter(|&&h| h).count();
    let train_ids: Vec<usize> = (0..trajs.len()).filter(|&i| !held[i]).collect();
    let held_ids: Vec<usize> = (0..trajs.len()).filter(|&i| held[i]).collect();
    let mut train_refs = example_refs(trajs, &train_ids, cfg.max_depth);
    let mut held_refs = example_refs(trajs, &held_ids, cfg.max_depth);
    if train_refs.is_empty() {
        return Err(TrainError::NoExamples);
    }
    let (l, nf) = (model_cfg.block_size, model_cfg.n_features);
    let depths = cfg.max_depth + 1;
    let mut rng = SplitMix(cfg.seed ^ 0x5eed);
    if let Some(cap) = cfg.max_heldout.filter(|&c| c < held_refs.len()) {
        SplitMix(cfg.seed ^ 0x4e1d).shuffle(&mut held_refs);
        held_refs.truncate(cap);
    }
    let per_epoch = cfg.max_examples.unwrap_or(usize::MAX).min(train_refs.len());
    let steps_per_epoch = per_epoch.div_ceil(cfg.batch_size);
    let schedule = Schedule::new(cfg.lr, steps_per_epoch * cfg.epochs);
    observer.start(per_epoch, held_refs.len(), steps_per_epoch);

    let mut model = match init {
        Some(m) => OrderModel::<B>::from_inner(m.clone()).map(&mut Trainable),
        None => OrderModel::<B>::init(model_cfg, cfg.seed, device),
    };
    let mut optim = adam::<B, OrderModel<B>>();
    let mut batch = Batch::default();
    let mut reports = Vec::new();
    let mut best: Option<(f64, OrderModel<B::InnerBackend>)> = None;
    for epoch in 1..=cfg.epochs {
        let start = std::time::Instant::now();
        rng.shuffle(&mut train_refs);
        let mut sum = 0.0;
        for (step, chunk) in train_refs[..per_epoch].chunks(cfg.batch_size).enumerate() {
            batch.fill(trajs, chunk, l, nf);
            let n = chunk.len();
            let x = Tensor::<B, 3>::from_data(
                TensorData::new(batch.features[..n * l * nf].to_vec(), [n, l, nf]),
                device,
            );
            let loss = loss(
                model.scores(x),
                &batch.valid[..n * l],
                &batch.target,
                l,
                device,
            );
            let lr = schedule.at((epoch - 1) * steps_per_epoch + step);
            let value;
            (value, model) = descend(&mut optim, model, loss, lr, (epoch, step))?;
            sum += value * n as f64;
            observer.step(epoch, step, value);
        }
        let inner = model.valid();
        let heldout = evaluate(&inner, trajs, &held_refs, depths, 1024, &mut batch);
        let report = EpochReport {
            epoch,
            train_loss: sum / per_epoch as f64,
            heldout,
            seconds: start.elapsed().as_secs_f64(),
        };
        observer.epoch(&report);
        // Keep the epoch with the lowest held-out loss (the last one when nothing is held out).
        let improved = best.as_ref().is_none_or(|(loss, _)| {
            n_held == 0 || report.heldout.loss.is_nan() || report.heldout.loss < *loss
        });
        if improved {
            best = Some((report.heldout.loss, inner));
        }
        reports.push(report);
    }
    let mut out = match best {
        Some((_, m)) => m,
        None => model.valid(),
    };
    let train_part: Vec<&Trajectory> = train_ids.iter().map(|&i| &trajs[i]).collect();
    out.set_token_calibration(None);
    out.set_token_calibrations(TokenCalibration::fit_per_temperature(
        &train_part,
        cfg.max_depth,
        CalibrationPaths::Drafted,
    ));
    Ok((out, reports))
}

/// Marks every float parameter as requiring gradients. A network loaded from a checkpoint
/// lives on the inner backend, where parameters never require them, and
/// [`AutodiffModule::from_inner`] keeps that flag: without this the optimiser would see no
/// gradients and `--init` would train nothing.
struct Trainable;

impl<B: AutodiffBackend> ModuleMapper<B> for Trainable {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.require_grad(), mapper)
    }
}

/// Which trajectories are held out: a `holdout` share of the distinct prompt ids (in order of
/// first appearance, spread evenly, [`heldout_mask`]), every trajectory of a held-out prompt
/// with it. The same prompt decoded at several temperatures is then never on both sides of
/// the split: the continuation seen in training would otherwise be recognised in held-out.
pub(crate) fn heldout_by_prompt<'a>(
    prompt_ids: impl IntoIterator<Item = &'a str>,
    holdout: f64,
) -> Vec<bool> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let index: Vec<usize> = prompt_ids
        .into_iter()
        .map(|id| {
            let next = ids.len();
            *ids.entry(id).or_insert(next)
        })
        .collect();
    let held = heldout_mask(ids.len(), holdout);
    index.into_iter().map(|i| held[i]).collect()
}

/// Which of `n` items are held out: a `holdout` share spread evenly over the list (at least
/// one when there are two or more, never all).
fn heldout_mask(n: usize, holdout: f64) -> Vec<bool> {
    if n < 2 {
        return vec![false; n];
    }
    let want = ((n as f64 * holdout).ceil() as usize).clamp(1, n - 1);
    // Trajectory i is held out when the running count floor((i + 1) · want / n) steps up.
    (0..n).map(|i| (i + 1) * want / n > i * want / n).collect()
}

/// The learning rate by optimiser step: linear warm-up, then cosine decay to a tenth.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    peak: f64,
    warmup: usize,
    total: usize,
}

impl Schedule {
    pub(crate) fn new(peak: f64, total: usize) -> Self {
        Self {
            peak,
            warmup: (total / 50).clamp(1, 500),
            total: total.max(1),
        }
    }

    pub(crate) fn at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = (self.total - self.warmup).saturating_sub(1).max(1) as f64;
        let x = ((step - self.warmup) as f64 / span).min(1.0);
        let floor = self.peak / 10.0;
        floor + (self.peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())
    }
}

/// Evaluates a trained network on trajectories it was not trained on.
pub fn evaluate_on<B: Backend>(
    model: &OrderModel<B>,
    trajs: &[Trajectory],
    max_depth: usize,
) -> Accuracy {
    let ids: Vec<usize> = (0..trajs.len()).collect();
    let refs = example_refs(trajs, &ids, max_depth);
    let mut batch = Batch::default();
    evaluate(model, trajs, &refs, max_depth + 1, 1024, &mut batch)
}

/// burn-optim's Adam (β 0.9 / 0.999, ε 1e-8): the optimiser of every drafter network.
pub(crate) fn adam<B: AutodiffBackend, M: AutodiffModule<B>>() -> impl Optimizer<M, B> {
    AdamConfig::new().with_epsilon(1e-8).init::<B, M>()
}

/// One optimiser step on `loss` at learning rate `lr`; returns the loss and the updated
/// module. A non-finite loss is an error naming the epoch and batch `step`.
pub(crate) fn descend<B: AutodiffBackend, M: AutodiffModule<B>>(
    optim: &mut impl Optimizer<M, B>,
    module: M,
    loss: Tensor<B, 1>,
    lr: f64,
    (epoch, step): (usize, usize),
) -> Result<(f64, M), TrainError> {
    let value = scalar(loss.clone());
    if !value.is_finite() {
        return Err(TrainError::NonFiniteLoss { value, epoch, step });
    }
    let grads = GradientsParams::from_grads(loss.backward(), &module);
    Ok((value, optim.step(lr, module, grads)))
}

pub(crate) fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_data()
        .iter::<f32>()
        .next()
        .map_or(f64::NAN, f64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_held_out_at_every_temperature_or_none() {
        // Prompts p0..p9 decoded at T = 0 and T = 2, interleaved as `spot train-drafter` does.
        let traj = |id: usize, temperature: f32| Trajectory {
            id: format!("p{id}"),
            block_size: 4,
            top_k: 2,
            mask_id: 9,
            temperature,
            seed: 0,
            hidden_dim: 0,
            blocks: Vec::new(),
        };
        let trajs: Vec<Trajectory> = (0..10).flat_map(|i| [traj(i, 0.0), traj(i, 2.0)]).collect();
        let held = heldout_by_prompt(trajs.iter().map(|t| t.id.as_str()), 0.2);
        let held_ids: Vec<&str> = (0..20)
            .filter(|&i| held[i])
            .map(|i| trajs[i].id.as_str())
            .collect();
        // Two of ten prompts (p4, p9), each at both temperatures.
        assert_eq!(held_ids, ["p4", "p4", "p9", "p9"]);
    }

    #[test]
    fn the_holdout_is_spread_over_the_list() {
        let m = heldout_mask(30, 0.1);
        let held: Vec<usize> = (0..30).filter(|&i| m[i]).collect();
        assert_eq!(held, [9, 19, 29]);
        assert_eq!(heldout_mask(2, 0.01), [false, true]);
        assert_eq!(heldout_mask(1, 0.5), [false]);
        assert_eq!(heldout_mask(3, 0.99).iter().filter(|&&h| h).count(), 2);
    }

    #[test]
    fn the_learning_rate_warms_up_then_decays_to_a_tenth() {
        let s = Schedule::new(1e-3, 1000);
        assert_eq!(s.warmup, 20);
        assert!((s.at(0) - 5e-5).abs() < 1e-12);
        assert!((s.at(19) - 1e-3).abs() < 1e-12);
        assert!((s.at(20) - 1e-3).abs() < 1e-12);
        assert!((s.at(999) - 1e-4).abs() < 1e-9);
        let lrs: Vec<f64> = (20..1000).map(|i| s.at(i)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }
}
