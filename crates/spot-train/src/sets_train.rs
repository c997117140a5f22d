//! Training the learned set drafter ([`SetsNet`]) on threshold-decoding trajectories that
//! carry the target's hidden states (`spot collect --threshold TAU --hidden-states`).
//!
//! Every masked position of every node up to `steps` threshold steps below every root is one
//! example ([`join_examples`], the same walk the calibrated tables count), with up to four
//! binary labels: whether it cleared `τ` when it led the step, whether it joined a step
//! another position led, and, where the step committed it, whether the written token was the
//! stale choice or the hedge. The loss is the mean binary cross-entropy of each label over
//! the examples that have it, summed over the four. burn-optim's Adam with a warm-up and cosine schedule;
//! whole prompts are held out; each epoch reports the held-out loss of the network next to
//! the calibrated tables fitted on the same training trajectories, and the epoch with the
//! lowest held-out loss is kept.

use burn_core as burn;

use burn::module::{Module, Param};
use burn_tensor::activation::{log_softmax, relu};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{Int, Tensor, TensorData};

use crate::train::{
    Schedule, TrainError, adam, check_settings, descend, heldout_by_prompt, no_epochs,
};
use crate::trajectory::Trajectory;
use spot_core::GumbelNoise;
use spot_sets::JoinTable;
use spot_sets::SetsError;
use spot_sets::net::{
    N_OUT, N_SCALAR, NodeView, SetsNet, SetsNetConfig, sigmoid, write_inputs, write_scalars,
};
use spot_sets::tokens::{NEAR, TokenHead, TokenHeadConfig, TokenInput};
use spot_tree::TableError;
use spot_tree::rng::SplitMix;
use spot_tree::table::bin;

use crate::sets_fit::{JoinExample, fit_join_table, join_examples};

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
    /// Candidates of the token head (the stale top-`k`; 0: no token head).
    pub token_candidates: usize,
    /// Embedding width of the token head.
    pub token_dim: usize,
}

impl SetsTrainConfig {
    /// Whether the settings are usable (positive epochs, batch size and finite learning
    /// rate; holdout in `[0, 1)`), as [`TrainConfig::check`](crate::TrainConfig::check).
    pub fn check(&self) -> Result<(), TrainError> {
        check_settings(self.epochs, self.batch_size, self.lr, self.holdout)
    }
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
            token_candidates: 8,
            token_dim: 16,
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
    /// The sum over the four set labels (lead, join, stale token, hedge), what the tables
    /// predict too; the leader label is [`LabelLoss::leader`].
    pub fn total(&self) -> f64 {
        self.per_label[..4].iter().sum()
    }

    /// The loss of the leader label (whether the position leads the step).
    pub fn leader(&self) -> f64 {
        self.per_label[4]
    }
}

/// Everything a training run reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetsReport {
    /// The join network, per epoch.
    pub epochs: Vec<SetsEpoch>,
    /// The token head on the held-out prompts, per epoch (the first entry: at its
    /// initialisation, the stale noised ranking).
    pub tokens: Vec<TokenMetrics>,
    /// Written tokens outside the stale top-`k` (training and held-out; no candidate to
    /// learn).
    pub outside_candidates: u64,
    /// Written tokens counted.
    pub written: u64,
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
        let conf = |t: usize| e.stale.stored(t).map(|p| (p.confidence, p.entropy));
        let mut x = [0.0f32; N_SCALAR];
        write_scalars(&view, e.s, e.p, &conf, &mut x);
        self.scalars.push(x);
        self.hidden.push(&e.p.hidden);
        let (label, valid) = labels(e);
        self.labels.push(label);
        self.valid.push(valid);
        if let Some(t) = table {
            let (r, k) = (e.row.min(t.join.len() - 1), bin(&t.edges, e.p.confidence));
            // The tables do not predict the leader: the uninformative 1/2.
            self.table.push([
                t.lead[r][k],
                t.join[r][k],
                t.token[r][k],
                t.hedge[r][k],
                0.5,
            ]);
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
            b(e.leads),
        ],
        [
            b(e.leads),
            b(!e.leads),
            b(written.is_some()),
            b(written.is_some()),
            1.0,
        ],
    )
}

/// Trains a [`SetsNet`] of shape `net_cfg` on `groups`, then its token head (when
/// `cfg.token_candidates > 0`, embeddings initialised from a projection of `out_emb`, the
/// target's `[vocab, hidden]` output embeddings, when given), and returns the best epochs
/// with the figures (`observer` sees each epoch's line as it ends).
pub fn train_sets<B: AutodiffBackend>(
    groups: &[TauGroup],
    net_cfg: SetsNetConfig,
    cfg: &SetsTrainConfig,
    (device, out_emb): (&B::Device, Option<&[f32]>),
    observer: &mut dyn FnMut(&str),
) -> Result<(SetsNet, SetsReport), TrainError> {
    net_cfg.check()?;
    cfg.check()?;
    let all: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajs).collect();
    if all.is_empty() {
        return Err(TrainError::NoTrajectories);
    }
    if let Some(t) = all.iter().find(|t| t.hidden_dim != net_cfg.hidden_dim) {
        return Err(TrainError::HiddenWidth {
            id: t.id.clone(),
            found: t.hidden_dim,
            expected: net_cfg.hidden_dim,
        });
    }
    // Whole prompts held out, over every group together.
    let held = heldout_by_prompt(all.iter().map(|t| t.id.as_str()), cfg.holdout);
    let mut train = Rows::new();
    let mut heldout = Rows::new();
    let (mut tok_train, mut tok_held) = (Vec::new(), Vec::new());
    let mut report = SetsReport::default();
    let k = cfg.token_candidates;
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
        let table = fit_join_table(fit.iter().copied(), g.tau, cfg.steps);
        for (t, &h) in g.trajs.iter().zip(is_held) {
            join_examples([t], g.tau, cfg.steps, |e| {
                if h {
                    heldout.push(e, g.tau, Some(&table));
                } else {
                    train.push(e, g.tau, None);
                }
                if k > 0 && e.commit.is_some() {
                    report.written += 1;
                    match token_row(e, k) {
                        Some(r) if h => tok_held.push(r),
                        Some(r) => tok_train.push(r),
                        None => report.outside_candidates += 1,
                    }
                }
            });
            if !pairs.contains(&(g.tau, t.temperature)) {
                pairs.push((g.tau, t.temperature));
            }
        }
    }
    if train.len() == 0 {
        return Err(TrainError::NoExamples);
    }
    let table_loss = host_loss(&heldout, |i| heldout.table[i]);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = SplitMix(cfg.seed ^ 0x5e75_7a1e);
    let per_epoch = cfg.max_examples.unwrap_or(usize::MAX).min(order.len());
    let steps_per_epoch = per_epoch.div_ceil(cfg.batch_size);
    let schedule = Schedule::new(cfg.lr, steps_per_epoch * cfg.epochs);
    let init = SetsNet::init(net_cfg.clone(), cfg.seed);
    let mut params = Tensors::<B>::new(init.params(), device);
    let mut optim = adam::<B, Tensors<B>>();
    let width = net_cfg.hidden_dim + N_SCALAR;
    let (mut x, mut y, mut m) = (Vec::new(), Vec::new(), Vec::new());
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
            let z = forward(&net_cfg, &params.values(), t2(&x, width));
            let loss = bce(z, t2(&y, N_OUT), t2(&m, N_OUT));
            let lr = schedule.at((epoch - 1) * steps_per_epoch + step);
            let value;
            (value, params) = descend(&mut optim, params, loss, lr, (epoch, step))?;
            sum += value * n as f64;
        }
        let mut net = SetsNet::from_params(net_cfg.clone(), params.host())?;
        net.set_trained_on(pairs.clone());
        let mut row = Vec::with_capacity(width);
        let heldout_loss = host_loss(&heldout, |i| {
            row.clear();
            write_inputs(&net_cfg, heldout.hidden[i], &heldout.scalars[i], &mut row);
            net.logits(&row).map(sigmoid)
        });
        let epoch_report = SetsEpoch {
            epoch,
            train_loss: sum / per_epoch as f64,
            heldout: heldout_loss,
            table: table_loss,
            seconds: start.elapsed().as_secs_f64(),
        };
        observer(&epoch_line(&epoch_report));
        let score = epoch_report.heldout.total();
        if best
            .as_ref()
            .is_none_or(|(b, _)| heldout.len() == 0 || score.is_nan() || score < *b)
        {
            best = Some((score, net));
        }
        report.epochs.push(epoch_report);
    }
    let mut net = best.map(|(_, n)| n).ok_or_else(no_epochs)?;
    if k > 0 {
        let head = TokenHead::init(
            TokenHeadConfig {
                vocab: all
                    .iter()
                    .map(|t| t.mask_id as usize + 1)
                    .max()
                    .unwrap_or(1)
                    .max(out_emb.map_or(0, |w| w.len() / net_cfg.hidden_dim.max(1))),
                dim: cfg.token_dim,
                candidates: k,
                hidden_dim: net_cfg.hidden_dim,
            },
            out_emb,
            cfg.seed,
        );
        let mut show = |epoch: usize, m: &TokenMetrics| observer(&token_line(epoch, m));
        let (head, tokens) =
            train_token_head::<B>(head, &tok_train, &tok_held, cfg, device, &mut show)?;
        report.tokens = tokens;
        net.set_token_head(Some(head))?;
    }
    Ok((net, report))
}

/// The token row of an example whose position the step committed (`None` when the written
/// token is not among the `k` stale candidates).
fn token_row<'a>(e: &JoinExample<'a, '_>, k: usize) -> Option<TokenRow<'a>> {
    let c = e.commit?;
    let mask = e.traj.mask_id;
    let noise = (e.traj.temperature > 0.0).then(|| GumbelNoise::new(e.traj.seed));
    let unseen = |t: usize| {
        let n = *e.node.get(t)?;
        (n != mask && e.stale.stored(t).is_some()).then_some(n)
    };
    let input = TokenInput::new(
        e.p,
        k,
        (noise, e.block_start + e.s as u64),
        mask,
        e.s,
        &unseen,
    );
    let label = input.ids.iter().position(|&v| v == c.token)?;
    Some(TokenRow {
        hidden: &e.p.hidden,
        input,
        label,
    })
}

/// One line of the join network's epoch report.
pub fn epoch_line(r: &SetsEpoch) -> String {
    let f = |l: &[f64; N_OUT]| {
        l[..4]
            .iter()
            .map(|v| format!("{v:.4}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    format!(
        "epoch {}: train {:.4}; held-out lead/join/token/hedge {} (sum {:.4}), leader {:.4}; tables {} (sum {:.4}); {:.1} s",
        r.epoch,
        r.train_loss,
        f(&r.heldout.per_label),
        r.heldout.total(),
        r.heldout.leader(),
        f(&r.table.per_label),
        r.table.total(),
        r.seconds
    )
}

/// One line of the token head's report (epoch 0: its initialisation).
pub fn token_line(epoch: usize, m: &TokenMetrics) -> String {
    format!(
        "token head epoch {epoch}: held-out cross-entropy {:.4}; written token is its first choice {:.3}, among its first two {:.3} (stale choice {:.3}, stale choice or runner-up {:.3}; {} examples)",
        m.loss, m.top1, m.top2, m.stale_top1, m.stale_top2, m.count
    )
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

/// The named tensors of a host-stored network ([`SetsNet`], [`TokenHead`]) as a burn module,
/// so that burn-optim's Adam trains them; inference keeps the host layout (plain loops, one
/// position at a time, no tensor round trip per round).
#[derive(Module, Debug)]
struct Tensors<B: Backend> {
    list: Vec<Param<Tensor<B, 1>>>,
}

impl<B: AutodiffBackend> Tensors<B> {
    /// Trainable copies of `host` on `device`.
    fn new(host: &[Vec<f32>], device: &B::Device) -> Self {
        let list = host
            .iter()
            .map(|v| Param::from_data(TensorData::new(v.clone(), [v.len()]), device))
            .collect();
        Self { list }
    }

    /// The current values, in order.
    fn values(&self) -> Vec<Tensor<B, 1>> {
        self.list.iter().map(Param::val).collect()
    }

    /// The current values on the host, in order.
    fn host(&self) -> Vec<Vec<f32>> {
        self.list
            .iter()
            .map(|p| p.val().inner().into_data().iter::<f32>().collect())
            .collect()
    }
}

/// One training example of the head: the input, the stale hidden state and the index of the
/// token the target wrote among the candidates.
#[derive(Clone, Debug)]
pub struct TokenRow<'a> {
    /// The stale hidden state.
    pub hidden: &'a [f32],
    /// The candidates and neighbours.
    pub input: TokenInput,
    /// Index of the written token in `input.ids`.
    pub label: usize,
}

/// Held-out figures of the head: cross-entropy and how often the written token is among the
/// two tokens a tree would draft, next to the stale choice and its runner-up (noised).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenMetrics {
    /// Mean cross-entropy (nats) over the candidates.
    pub loss: f64,
    /// The written token is the head's first choice.
    pub top1: f64,
    /// It is among the head's first two.
    pub top2: f64,
    /// It is the stale noised choice.
    pub stale_top1: f64,
    /// It is the stale noised choice or its runner-up.
    pub stale_top2: f64,
    /// Examples.
    pub count: u64,
}

/// The head's figures on `rows`.
pub fn token_metrics(head: &TokenHead, rows: &[TokenRow<'_>]) -> TokenMetrics {
    let mut m = TokenMetrics::default();
    for r in rows {
        let p = head.probabilities(&r.input, r.hidden);
        let rank = |score: &dyn Fn(usize) -> f32| {
            let target = score(r.label);
            (0..p.len())
                .filter(|&k| {
                    let s = score(k);
                    k != r.label && (s > target || (s == target && k < r.label))
                })
                .count()
        };
        let head_rank = rank(&|k| p[k]);
        let stale_rank = rank(&|k| r.input.lnp[k] + r.input.noise[k]);
        m.loss -= f64::from(p[r.label].max(1e-9)).ln();
        m.top1 += f64::from(u8::from(head_rank == 0));
        m.top2 += f64::from(u8::from(head_rank < 2));
        m.stale_top1 += f64::from(u8::from(stale_rank == 0));
        m.stale_top2 += f64::from(u8::from(stale_rank < 2));
        m.count += 1;
    }
    let n = m.count.max(1) as f64;
    for v in [
        &mut m.loss,
        &mut m.top1,
        &mut m.top2,
        &mut m.stale_top1,
        &mut m.stale_top2,
    ] {
        *v /= n;
    }
    m
}

/// The target's output embeddings `[vocab, hidden]` from `dir/model.safetensors`
/// (`lm_head.weight`, else the tied `model.embed_tokens.weight`; f32 or bf16), with
/// the hidden width: what [`TokenHead::init`] projects. Errors name the file.
pub fn read_output_embeddings(dir: &std::path::Path) -> Result<(Vec<f32>, usize), SetsError> {
    use safetensors::{Dtype, SafeTensors};
    let path = dir.join("model.safetensors");
    let shown = path.display().to_string();
    let invalid = |field: &str, reason: String| SetsError::Invalid {
        path: shown.clone(),
        reason: TableError::field(field, reason),
    };
    let bytes = std::fs::read(&path).map_err(|source| SetsError::Io {
        path: shown.clone(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| invalid("header", e.to_string()))?;
    let t = ["lm_head.weight", "model.embed_tokens.weight"]
        .iter()
        .find_map(|n| st.tensor(n).ok())
        .ok_or_else(|| {
            invalid(
                "lm_head.weight",
                "neither it nor model.embed_tokens.weight is stored".into(),
            )
        })?;
    let [_, cols] = t.shape() else {
        return Err(invalid(
            "lm_head.weight",
            "the output embeddings are not a matrix".into(),
        ));
    };
    let data = t.data();
    let values: Vec<f32> = match t.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        other => {
            return Err(invalid(
                "lm_head.weight",
                format!("output embeddings of type {other:?}"),
            ));
        }
    };
    Ok((values, *cols))
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

/// The token head's logits `[n, k]` for a batch (the same computation as
/// [`TokenHead::probabilities`] before the softmax, padding not masked).
fn token_logits<B: Backend>(
    cfg: &TokenHeadConfig,
    params: &[Tensor<B, 1>],
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 2> {
    let (n, k, e, h) = (batch.n, cfg.candidates, cfg.dim, cfg.hidden_dim);
    let specs = cfg.params();
    let p2 = |i: usize| params[i].clone().reshape(specs[i].1);
    let f2 = |v: &[f32], w: usize| {
        Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), [n, w]), device)
    };
    let ids =
        |v: &[i64]| Tensor::<B, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), device);
    let emb = p2(0);
    let mut c = f2(&batch.hidden, h).matmul(p2(1));
    let near = emb
        .clone()
        .select(0, ids(&batch.near))
        .reshape([n, NEAR.len() * e])
        * f2(&batch.near_on, NEAR.len() * e);
    c = c + near.matmul(p2(2));
    let cand = emb.select(0, ids(&batch.ids)).reshape([n, k, e]);
    let dot = cand.matmul(c.reshape([n, e, 1])).reshape([n, k]);
    let scale = p2(3);
    let a = scale.clone().narrow(1, 0, 1);
    let g = scale.narrow(1, 1, 1);
    f2(&batch.lnp, k) * a + f2(&batch.noise, k) * g + p2(4) + dot
}

/// A batch of token rows, flattened.
#[derive(Default)]
struct TokenBatch {
    n: usize,
    hidden: Vec<f32>,
    ids: Vec<i64>,
    lnp: Vec<f32>,
    noise: Vec<f32>,
    near: Vec<i64>,
    near_on: Vec<f32>,
    pad: Vec<f32>,
    onehot: Vec<f32>,
}

impl TokenBatch {
    fn fill(&mut self, cfg: &TokenHeadConfig, rows: &[&TokenRow<'_>]) {
        // Cleared, not replaced: every batch reuses the buffers.
        self.n = rows.len();
        for v in [
            &mut self.hidden,
            &mut self.lnp,
            &mut self.noise,
            &mut self.near_on,
            &mut self.pad,
            &mut self.onehot,
        ] {
            v.clear();
        }
        self.ids.clear();
        self.near.clear();
        let e = cfg.dim;
        for r in rows {
            if r.hidden.len() == cfg.hidden_dim {
                self.hidden.extend_from_slice(r.hidden);
            } else {
                self.hidden.resize(self.hidden.len() + cfg.hidden_dim, 0.0);
            }
            let x = &r.input;
            for (i, &id) in x.ids.iter().enumerate() {
                let valid = (id as usize) < cfg.vocab && x.lnp[i] > -1e3;
                self.ids.push(if valid { i64::from(id) } else { 0 });
                self.pad.push(if valid { 0.0 } else { -1e9 });
                self.onehot.push(f32::from(u8::from(i == r.label)));
            }
            self.lnp.extend_from_slice(&x.lnp);
            self.noise.extend_from_slice(&x.noise);
            for &w in &x.near {
                let on = (w as usize) < cfg.vocab;
                self.near.push(if on { i64::from(w) } else { 0 });
                self.near_on
                    .extend(std::iter::repeat_n(f32::from(u8::from(on)), e));
            }
        }
    }
}

/// Trains the token head `head` on `train` (Adam, the same schedule as the rest), keeping the
/// epoch with the lowest held-out cross-entropy; returns it with each epoch's held-out
/// figures.
pub fn train_token_head<B: AutodiffBackend>(
    head: TokenHead,
    train: &[TokenRow<'_>],
    heldout: &[TokenRow<'_>],
    cfg: &SetsTrainConfig,
    device: &B::Device,
    observer: &mut dyn FnMut(usize, &TokenMetrics),
) -> Result<(TokenHead, Vec<TokenMetrics>), TrainError> {
    if train.is_empty() {
        return Err(TrainError::NoExamples);
    }
    let tcfg = head.cfg.clone();
    let mut params = Tensors::<B>::new(&head.params, device);
    let mut optim = adam::<B, Tensors<B>>();
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = SplitMix(cfg.seed ^ 0x70ce_7a1e);
    let steps_per_epoch = train.len().div_ceil(cfg.batch_size);
    let schedule = Schedule::new(cfg.lr, steps_per_epoch * cfg.epochs);
    let mut batch = TokenBatch::default();
    let mut best: Option<(f64, TokenHead)> = None;
    let mut reports = Vec::new();
    let init = token_metrics(&head, heldout);
    observer(0, &init);
    for epoch in 1..=cfg.epochs {
        rng.shuffle(&mut order);
        for (step, chunk) in order.chunks(cfg.batch_size).enumerate() {
            let rows: Vec<&TokenRow<'_>> = chunk.iter().map(|&i| &train[i]).collect();
            batch.fill(&tcfg, &rows);
            let n = batch.n;
            let k = tcfg.candidates;
            let f2 =
                |v: &[f32]| Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), [n, k]), device);
            let z = token_logits(&tcfg, &params.values(), &batch, device) + f2(&batch.pad);
            let logp = log_softmax(z, 1);
            let loss = (logp * f2(&batch.onehot)).sum().neg().div_scalar(n as f64);
            let lr = schedule.at((epoch - 1) * steps_per_epoch + step);
            (_, params) = descend(&mut optim, params, loss, lr, (epoch, step))?;
        }
        let trained = TokenHead {
            cfg: tcfg.clone(),
            params: params.host(),
        };
        let m = token_metrics(&trained, heldout);
        observer(epoch, &m);
        if best
            .as_ref()
            .is_none_or(|(b, _)| heldout.is_empty() || m.loss < *b)
        {
            best = Some((m.loss, trained));
        }
        reports.push(m);
    }
    let (_, head) = best.ok_or_else(no_epochs)?;
    Ok((head, reports))
}

#[cfg(test)]
mod token_tests {
    use super::*;
    use spot_sets::tokens::TokenInput;

    type Cpu = burn_flex::Flex;

    #[test]
    fn the_token_head_tensor_forward_is_the_host_forward() {
        let cfg = TokenHeadConfig {
            vocab: 20,
            dim: 4,
            candidates: 5,
            hidden_dim: 6,
        };
        let mut head = TokenHead::init(cfg.clone(), None, 3);
        let mut rng = SplitMix(9);
        // Non-zero context weights, so every term counts.
        for p in &mut head.params[1..] {
            p.iter_mut().for_each(|v| *v = rng.normal());
        }
        let hidden: Vec<f32> = (0..6).map(|_| rng.normal()).collect();
        let input = TokenInput {
            ids: vec![3, 7, 11, 2, 19],
            lnp: vec![-0.5, -1.0, -2.0, -1e4, -3.0],
            noise: vec![0.1, -0.3, 0.2, 0.0, 1.0],
            near: [5, spot_sets::tokens::NO_TOKEN, 9, 0],
        };
        let row = TokenRow {
            hidden: &hidden,
            input: input.clone(),
            label: 1,
        };
        let mut batch = TokenBatch::default();
        batch.fill(&cfg, &[&row]);
        let device = Default::default();
        let params: Vec<Tensor<Cpu, 1>> = head
            .params
            .iter()
            .map(|v| Tensor::from_data(TensorData::new(v.clone(), [v.len()]), &device))
            .collect();
        let z = token_logits(&cfg, &params, &batch, &device);
        let pad = Tensor::<Cpu, 2>::from_data(TensorData::new(batch.pad.clone(), [1, 5]), &device);
        let p: Vec<f32> = burn_tensor::activation::softmax(z + pad, 1)
            .into_data()
            .iter::<f32>()
            .collect();
        let host = head.probabilities(&input, &hidden);
        for (a, b) in p.iter().zip(&host) {
            assert!((a - b).abs() < 1e-5, "{p:?} {host:?}");
        }
        assert_eq!(host[3], 0.0, "padding has no mass");
    }
}
