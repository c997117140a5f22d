//! Training the learned set drafter ([`SetsNet`]) on threshold-decoding trajectories that
//! carry the target's hidden states (`spot collect --threshold TAU --hidden-states`).
//!
//! Every masked position of every node up to `steps` threshold steps below every root is one
//! example ([`join_examples`], the same walk the calibrated tables count), with up to four
//! binary labels: whether it cleared `τ` when it led the step, whether it joined a step
//! another position led, and, where the step committed it, whether the written token was the
//! stale choice or the hedge. The loss is the mean binary cross-entropy of each label over
//! the examples that have it, summed over the four. Adam with a warm-up and cosine schedule;
//! whole prompts are held out; each epoch reports the held-out loss of the network next to
//! the calibrated tables fitted on the same training trajectories, and the epoch with the
//! lowest held-out loss is kept.

use burn_tensor::activation::relu;
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{Tensor, TensorData};

use crate::analysis::bin;
use crate::rng::SplitMix;
use crate::sets::JoinTable;
use crate::sets_net::{
    JoinExample, N_OUT, N_SCALAR, NodeView, SetsNet, SetsNetConfig, join_examples, write_inputs,
    write_scalars,
};
use crate::train::{Adam, Schedule, heldout_by_prompt, scalar};
use crate::trajectory::Trajectory;

/// Trajectories decoded with one threshold.
#[derive(Clone, Debug)]
pub struct TauGroup {
    /// The threshold `τ` they were decoded with.
    pub tau: f32,
    /// The trajectories (with hidden states).
    pub trajs: Vec<Trajectory>,
}

/// Training settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SetsTrainConfig {
    /// Passes over the training examples.
    pub epochs: usize,
    /// Examples per optimiser step.
    pub batch_size: usize,
    /// Peak learning rate (warm-up, then cosine decay to a tenth).
    pub lr: f64,
    /// Threshold steps below the root that give examples.
    pub steps: usize,
    /// Share of prompts held out.
    pub holdout: f64,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Use at most this many training examples per epoch (a seeded sample; `None`: all).
    pub max_examples: Option<usize>,
}

impl Default for SetsTrainConfig {
    fn default() -> Self {
        Self {
            epochs: 10,
            batch_size: 512,
            lr: 2e-3,
            steps: 8,
            holdout: 0.1,
            seed: 0,
            max_examples: None,
        }
    }
}

/// Mean binary cross-entropy (nats) per label: lead, join, stale token, hedge.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LabelLoss {
    /// Per label.
    pub per_label: [f64; N_OUT],
    /// Examples per label.
    pub counts: [u64; N_OUT],
}

impl LabelLoss {
    /// The sum over the labels (the training objective).
    pub fn total(&self) -> f64 {
        self.per_label.iter().sum()
    }
}

/// One epoch's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct SetsEpoch {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// The network on the held-out prompts.
    pub heldout: LabelLoss,
    /// The calibrated tables (fitted on the training prompts) on the same examples.
    pub table: LabelLoss,
    /// Wall seconds.
    pub seconds: f64,
}

/// The examples, their inputs built per batch.
struct Rows<'a> {
    hidden: Vec<&'a [f32]>,
    scalars: Vec<[f32; N_SCALAR]>,
    labels: Vec<[f32; N_OUT]>,
    valid: Vec<[f32; N_OUT]>,
    /// The tables' probabilities (held-out rows only).
    table: Vec<[f32; N_OUT]>,
}

impl<'a> Rows<'a> {
    fn new() -> Self {
        Self {
            hidden: Vec::new(),
            scalars: Vec::new(),
            labels: Vec::new(),
            valid: Vec::new(),
            table: Vec::new(),
        }
    }

    fn push(&mut self, e: &JoinExample<'a, '_>, tau: f32, table: Option<&JoinTable>) {
        let view = NodeView {
            root: e.root,
            node: e.node,
            mask: e.traj.mask_id,
            steps: e.row,
            tau,
            temperature: e.traj.temperature,
        };
        let conf = |t: usize| e.stale.stored(t).map(|p| p.confidence);
        let mut x = [0.0f32; N_SCALAR];
        write_scalars(&view, e.s, e.p, &conf, &mut x);
        self.scalars.push(x);
        self.hidden.push(&e.p.hidden);
        let (label, valid) = labels(e);
        self.labels.push(label);
        self.valid.push(valid);
        if let Some(t) = table {
            let (r, k) = (e.row.min(t.join.len() - 1), bin(&t.edges, e.p.confidence));
            self.table
                .push([t.lead[r][k], t.join[r][k], t.token[r][k], t.hedge[r][k]]);
        }
    }

    fn len(&self) -> usize {
        self.scalars.len()
    }
}

/// The labels of an example and which of them it has.
fn labels(e: &JoinExample<'_, '_>) -> ([f32; N_OUT], [f32; N_OUT]) {
    let b = |x: bool| f32::from(u8::from(x));
    let written = e.commit.map(|c| c.token);
    (
        [
            b(e.clears),
            b(e.commit.is_some() && e.clears),
            b(written == Some(e.p.token)),
            b(written == Some(e.p.hedge) && written != Some(e.p.token)),
        ],
        [
            b(e.leads),
            b(!e.leads),
            b(written.is_some()),
            b(written.is_some()),
        ],
    )
}

/// Trains a [`SetsNet`] of shape `net_cfg` on `groups` and returns the best epoch's network
/// with one report per epoch (`observer` sees each as it ends).
pub fn train_sets<B: AutodiffBackend>(
    groups: &[TauGroup],
    net_cfg: SetsNetConfig,
    cfg: &SetsTrainConfig,
    device: &B::Device,
    observer: &mut dyn FnMut(&SetsEpoch),
) -> Result<(SetsNet, Vec<SetsEpoch>), String> {
    net_cfg.check()?;
    if cfg.batch_size == 0 || cfg.epochs == 0 || !(cfg.lr > 0.0 && cfg.lr.is_finite()) {
        return Err("epochs, batch size and lr must be positive".into());
    }
    if !(0.0..1.0).contains(&cfg.holdout) {
        return Err(format!("holdout {} is not in [0, 1)", cfg.holdout));
    }
    let all: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajs).collect();
    if all.is_empty() {
        return Err("no trajectories".into());
    }
    if let Some(t) = all.iter().find(|t| t.hidden_dim != net_cfg.hidden_dim) {
        return Err(format!(
            "trajectory `{}` has hidden states of width {} (the network reads {}); collect with \
             `spot collect --hidden-states`",
            t.id, t.hidden_dim, net_cfg.hidden_dim
        ));
    }
    // Whole prompts held out, over every group together.
    let held = heldout_by_prompt(all.iter().map(|t| t.id.as_str()), cfg.holdout);
    let mut train = Rows::new();
    let mut heldout = Rows::new();
    let mut at = 0usize;
    let mut pairs = Vec::new();
    for g in groups {
        let n = g.trajs.len();
        let is_held = &held[at..at + n];
        at += n;
        let fit: Vec<&Trajectory> = g
            .trajs
            .iter()
            .zip(is_held)
            .filter(|(_, h)| !**h)
            .map(|(t, _)| t)
            .collect();
        let table = JoinTable::fit(fit.iter().copied(), g.tau, cfg.steps);
        for (t, &h) in g.trajs.iter().zip(is_held) {
            join_examples([t], g.tau, cfg.steps, |e| {
                if h {
                    heldout.push(e, g.tau, Some(&table));
                } else {
                    train.push(e, g.tau, None);
                }
            });
            if !pairs.contains(&(g.tau, t.temperature)) {
                pairs.push((g.tau, t.temperature));
            }
        }
    }
    if train.len() == 0 {
        return Err("the trajectories hold no training examples".into());
    }
    let table_loss = host_loss(&heldout, |i| heldout.table[i]);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = SplitMix(cfg.seed ^ 0x5e75_7a1e);
    let per_epoch = cfg.max_examples.unwrap_or(usize::MAX).min(order.len());
    let steps_per_epoch = per_epoch.div_ceil(cfg.batch_size);
    let schedule = Schedule::new(cfg.lr, steps_per_epoch * cfg.epochs);
    let init = SetsNet::init(net_cfg.clone(), cfg.seed);
    let mut params: Vec<Tensor<B, 1>> = init
        .params()
        .iter()
        .map(|v| Tensor::<B, 1>::from_data(TensorData::new(v.clone(), [v.len()]), device))
        .map(Tensor::require_grad)
        .collect();
    let mut adam = Adam::<B>::new(&params, cfg.lr);
    let width = net_cfg.hidden_dim + N_SCALAR;
    let (mut x, mut y, mut m) = (Vec::new(), Vec::new(), Vec::new());
    let mut reports = Vec::new();
    let mut best: Option<(f64, SetsNet)> = None;
    for epoch in 1..=cfg.epochs {
        let start = std::time::Instant::now();
        rng.shuffle(&mut order);
        let mut sum = 0.0;
        for (step, chunk) in order[..per_epoch].chunks(cfg.batch_size).enumerate() {
            x.clear();
            y.clear();
            m.clear();
            for &i in chunk {
                write_inputs(&net_cfg, train.hidden[i], &train.scalars[i], &mut x);
                y.extend_from_slice(&train.labels[i]);
                m.extend_from_slice(&train.valid[i]);
            }
            let n = chunk.len();
            let t2 = |v: &Vec<f32>, w: usize| {
                Tensor::<B, 2>::from_data(TensorData::new(v.clone(), [n, w]), device)
            };
            let z = forward(&net_cfg, &params, t2(&x, width));
            let loss = bce(z, t2(&y, N_OUT), t2(&m, N_OUT));
            let value = scalar(loss.clone());
            if !value.is_finite() {
                return Err(format!(
                    "training loss became {value} at epoch {epoch}, step {step}"
                ));
            }
            let grads = loss.backward();
            adam.lr = schedule.at((epoch - 1) * steps_per_epoch + step);
            params = adam.step(params, &grads);
            sum += value * n as f64;
        }
        let host: Vec<Vec<f32>> = params
            .iter()
            .map(|p| p.clone().inner().into_data().iter::<f32>().collect())
            .collect();
        let mut net = SetsNet::from_params(net_cfg.clone(), host)?;
        net.set_trained_on(pairs.clone());
        let mut row = Vec::with_capacity(width);
        let heldout_loss = host_loss(&heldout, |i| {
            row.clear();
            write_inputs(&net_cfg, heldout.hidden[i], &heldout.scalars[i], &mut row);
            net.logits(&row).map(sigmoid)
        });
        let report = SetsEpoch {
            epoch,
            train_loss: sum / per_epoch as f64,
            heldout: heldout_loss,
            table: table_loss,
            seconds: start.elapsed().as_secs_f64(),
        };
        observer(&report);
        let score = report.heldout.total();
        if best
            .as_ref()
            .is_none_or(|(b, _)| heldout.len() == 0 || score.is_nan() || score < *b)
        {
            best = Some((score, net));
        }
        reports.push(report);
    }
    let net = best.map(|(_, n)| n).ok_or("no epoch ran")?;
    Ok((net, reports))
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Mean binary cross-entropy per label of the probabilities `prob(i)` on `rows`.
fn host_loss(rows: &Rows<'_>, mut prob: impl FnMut(usize) -> [f32; N_OUT]) -> LabelLoss {
    let mut out = LabelLoss::default();
    for i in 0..rows.len() {
        let p = prob(i);
        for (k, ((&p, &y), &v)) in p
            .iter()
            .zip(&rows.labels[i])
            .zip(&rows.valid[i])
            .enumerate()
        {
            if v > 0.0 {
                let q = f64::from(p).clamp(1e-7, 1.0 - 1e-7);
                let y = f64::from(y);
                out.per_label[k] -= y * q.ln() + (1.0 - y) * (1.0 - q).ln();
                out.counts[k] += 1;
            }
        }
    }
    for (l, &n) in out.per_label.iter_mut().zip(&out.counts) {
        *l /= n.max(1) as f64;
    }
    out
}

/// The network's logits `[n, 4]` for inputs `[n, hidden + scalars]` (the same computation
/// as [`SetsNet::logits`]).
fn forward<B: Backend>(
    cfg: &SetsNetConfig,
    params: &[Tensor<B, 1>],
    x: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let specs = cfg.params();
    let p2 = |i: usize| params[i].clone().reshape(specs[i].1);
    let h = cfg.hidden_dim;
    let hidden = x.clone().narrow(1, 0, h);
    let scalars = x.narrow(1, h, cfg.n_scalar);
    let z0 = hidden.matmul(p2(0)) + p2(1);
    let z0 = Tensor::cat(vec![z0, scalars], 1);
    let z1 = relu(z0.matmul(p2(2)) + p2(3));
    let z2 = relu(z1.matmul(p2(4)) + p2(5));
    z2.matmul(p2(6)) + p2(7)
}

/// The summed per-label mean binary cross-entropy of logits `z` against labels `y` where
/// `m` is 1.
fn bce<B: Backend>(z: Tensor<B, 2>, y: Tensor<B, 2>, m: Tensor<B, 2>) -> Tensor<B, 1> {
    let per = relu(z.clone()) - z.clone() * y + z.abs().neg().exp().log1p();
    let counts = m.clone().sum_dim(0).clamp_min(1.0);
    ((per * m).sum_dim(0) / counts).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Cpu = burn_flex::Flex;

    #[test]
    fn the_tensor_forward_is_the_host_forward() {
        let cfg = SetsNetConfig::new(6);
        let net = SetsNet::init(cfg.clone(), 7);
        let device = Default::default();
        let params: Vec<Tensor<Cpu, 1>> = net
            .params()
            .iter()
            .map(|v| Tensor::from_data(TensorData::new(v.clone(), [v.len()]), &device))
            .collect();
        let mut rng = SplitMix(3);
        let w = 6 + N_SCALAR;
        let x: Vec<f32> = (0..3 * w).map(|_| rng.normal()).collect();
        let z = forward(
            &cfg,
            &params,
            Tensor::from_data(TensorData::new(x.clone(), [3, w]), &device),
        );
        let z: Vec<f32> = z.into_data().iter::<f32>().collect();
        for r in 0..3 {
            let host = net.logits(&x[r * w..(r + 1) * w]);
            for k in 0..N_OUT {
                assert!((host[k] - z[r * N_OUT + k]).abs() < 1e-4, "{host:?} {z:?}");
            }
        }
    }
}
