//! The output layer fused with the reduction, on the host.
//!
//! Decoding never needs a position's `V` logits, only a few numbers per position (the chosen
//! token, its probability, the entropy, the top-k). On a CPU backend [`HostHead`] computes the
//! logits of a vocabulary tile for a few rows at a time while they are in cache and folds them
//! straight into running per-row statistics (an online softmax), so the `[rows, V]` logits are
//! never written to memory, and only the rows whose statistics are read are computed.
//!
//! **Exactness.** A row's numbers never depend on the other rows of the call: each logit is one
//! fused multiply-add chain over the hidden dimension in index order (rows are computed in
//! groups of six (`MR`), each lane its own chain), the vocabulary is cut into tiles and segments
//! whose sizes depend only on the model's shape, and segments are merged in vocabulary order
//! whatever the number of threads. So a state's statistics are bit-identical alone and inside any
//! batch; they are not bit-identical to the device reduction or to the host reference
//! [`spot_core::stats::reduce_logits`] (same values within float rounding).

use rayon::prelude::*;
use spot_core::fastmath::fast_exp;
use spot_core::{ConfidenceRule, StatsQuery, TokenId};

use spot_core::{Error, Result};

use crate::logits::Logits;

/// Vocabulary columns per packed panel (one 16-lane or two 8-lane vectors).
const PANEL: usize = 16;
/// Rows per micro-kernel call, which takes two panels: 6 x 2 x 16 accumulators (12 AVX-512
/// registers; larger blocks, or the same block written generically over the panel count, stop
/// the compiler from keeping them in registers: ten times slower).
const MR: usize = 6;
/// Vocabulary ids per segment: the unit of parallel work and of the fixed merge order.
const SEGMENT: usize = 8192;
/// Vocabulary ids per segment when only logits are written (no merge: finer, for balance).
const LOGITS_SEGMENT: usize = 2048;
/// Output columns per parallel task when a packed matrix is a hidden layer's weight
/// ([`HostHead::product`]): a few panels, so that layers of a few hundred outputs split.
const PRODUCT_SEGMENT: usize = 256;
/// Bytes of packed weights a tile may take (kept in the L2 cache while every row group reads it).
const TILE_BYTES: usize = 128 * 1024;

/// The output layer's weights, packed for the host kernel: the fused product and reduction of
/// [the module documentation](self).
#[derive(Clone)]
pub struct HostHead {
    vocab: usize,
    dim: usize,
    /// Vocabulary ids per tile (a multiple of [`PANEL`] dividing [`SEGMENT`]).
    tile: usize,
    /// Panels of [`PANEL`] vocabulary columns: `packed[p * dim * PANEL + k * PANEL + j]` is the
    /// weight of hidden unit `k` for id `p * PANEL + j` (zero past the vocabulary).
    packed: Vec<f32>,
}

/// What one computed row needs besides its hidden state.
#[derive(Clone, Copy, Debug)]
pub struct RowJob {
    /// Row of the hidden states.
    pub hidden: usize,
    /// Row of the noise table (used at `T > 0`).
    pub noise: usize,
}

/// The reduced statistics of one computed row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowStats {
    /// The chosen token: `argmax(l / T + G)` at `T > 0`, `argmax(l)` at `T = 0` (never the
    /// mask).
    pub token: TokenId,
    /// Its probability under the tempered softmax.
    pub token_prob: f64,
    /// Probability of `token` under the un-tempered softmax, when the rule reads it.
    pub raw_prob: Option<f64>,
    /// Entropy of the tempered distribution (nats).
    pub entropy: f64,
    /// The top-k ids of the tempered distribution, most probable first (ties: lower id).
    pub top_ids: Vec<TokenId>,
    /// Their probabilities.
    pub top_probs: Vec<f32>,
}

impl RowStats {
    /// The confidence under `rule` (one definition: [`ConfidenceRule::confidence`]).
    pub fn confidence(&self, rule: ConfidenceRule) -> f64 {
        rule.confidence(
            self.token_prob,
            self.raw_prob,
            &self.top_probs,
            self.entropy,
        )
    }
}

/// How the reduction reads a row's logits.
struct Plan<'a> {
    temperature: f32,
    mask: Option<usize>,
    /// Top entries each row keeps while streaming: the requested top-k, or more for top-k
    /// truncation.
    k: usize,
    /// Top-k truncation ([`StatsQuery::sample_top_k`]), at most `k`.
    truncate: Option<usize>,
    raw: bool,
    /// `[rows, vocab]` Gumbel rows (at `T > 0`).
    noise: Option<&'a [f32]>,
}

/// The best (noised) score of a row so far.
#[derive(Clone, Copy, Debug)]
struct Best {
    score: f32,
    id: u32,
    /// Its un-tempered logit.
    logit: f32,
}

/// Running statistics of one row over a range of the vocabulary.
#[derive(Clone, Debug)]
struct Partial {
    /// Largest tempered logit so far (`-inf` before any).
    max: f32,
    /// `sum exp(y - max)` and `sum exp(y - max) * (y - max)` over the tempered logits `y`.
    sum: f64,
    moment: f64,
    /// The chosen token so far.
    best: Option<Best>,
    /// Top-k tempered logits and ids: value descending, then id ascending.
    top: Vec<(f32, u32)>,
    /// Un-tempered maximum and sum (for [`ConfidenceRule::RawProbability`] at `T > 0`).
    raw_max: f32,
    raw_sum: f64,
    nan: bool,
}

impl Partial {
    fn new(k: usize) -> Self {
        Self {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            moment: 0.0,
            best: None,
            top: Vec::with_capacity(k + 1),
            raw_max: f32::NEG_INFINITY,
            raw_sum: 0.0,
            nan: false,
        }
    }

    /// Moves the running sums to a new maximum `m >= self.max`.
    fn rescale(sum: f64, moment: f64, from: f32, to: f32) -> (f64, f64) {
        if from == f32::NEG_INFINITY {
            return (0.0, 0.0);
        }
        let d = f64::from(from) - f64::from(to);
        let c = d.exp();
        (sum * c, c * (moment + sum * d))
    }

    /// Folds the logits `l` of ids `first..first + l.len()` in (overwritten by the tempered
    /// logits).
    #[inline(always)]
    fn update(&mut self, l: &mut [f32], first: usize, plan: &Plan<'_>, noise: Option<&[f32]>) {
        let t = plan.temperature;
        // Non-finite logits never win and carry no mass (as in the host reference).
        let mut nan = false;
        for x in l.iter_mut() {
            nan |= x.is_nan();
            if !x.is_finite() {
                *x = f32::NEG_INFINITY;
            }
        }
        self.nan |= nan;
        if let Some(m) = plan.mask
            && (first..first + l.len()).contains(&m)
        {
            l[m - first] = f32::NEG_INFINITY;
        }
        if plan.raw {
            let m = max_of(l);
            if m > self.raw_max {
                (self.raw_sum, _) = Self::rescale(self.raw_sum, 0.0, self.raw_max, m);
                self.raw_max = m;
            }
            if self.raw_max > f32::NEG_INFINITY {
                self.raw_sum += exp_sums(l, self.raw_max).0;
            }
        }
        // The chosen token: the first maximum of `l / T + G` (of `l` at `T = 0`). The tile's
        // maximum first (vectorised); the scan for its first index only when it wins.
        let score = |j: usize, x: f32| match noise {
            Some(g) => x / t + g[j],
            None => x,
        };
        let top_score = match noise {
            Some(g) => l.iter().zip(g).fold(f32::NEG_INFINITY, |m, (&x, &g)| {
                let s = x / t + g;
                if s > m { s } else { m }
            }),
            None => max_of(l),
        };
        if top_score > f32::NEG_INFINITY && self.best.is_none_or(|b| top_score > b.score) {
            let hit = l
                .iter()
                .enumerate()
                .find(|&(j, &x)| x > f32::NEG_INFINITY && score(j, x) == top_score);
            if let Some((j, &x)) = hit {
                self.best = Some(Best {
                    score: top_score,
                    id: (first + j) as u32,
                    logit: x,
                });
            }
        }
        if t > 0.0 {
            l.iter_mut().for_each(|x| *x /= t);
        }
        // Online softmax sums.
        let m = max_of(l);
        if m > self.max {
            (self.sum, self.moment) = Self::rescale(self.sum, self.moment, self.max, m);
            self.max = m;
        }
        if self.max > f32::NEG_INFINITY {
            let (s, u) = exp_sums(l, self.max);
            self.sum += s;
            self.moment += u;
        }
        // Top-k: only values above the current k-th are inserted; chunks whose maximum is not
        // above it are skipped whole.
        let k = plan.k;
        let threshold = |top: &Vec<(f32, u32)>| {
            if top.len() == k {
                top[k - 1].0
            } else {
                f32::NEG_INFINITY
            }
        };
        if m <= threshold(&self.top) {
            return;
        }
        for (c, chunk) in l.chunks(PANEL).enumerate() {
            if max_of(chunk) <= threshold(&self.top) {
                continue;
            }
            for (j, &y) in chunk.iter().enumerate() {
                if y <= threshold(&self.top) {
                    continue;
                }
                let at = self.top.partition_point(|&(v, _)| v >= y);
                self.top.insert(at, (y, (first + c * PANEL + j) as u32));
                self.top.truncate(k);
            }
        }
    }

    /// Folds `other` (a later range of the vocabulary) in.
    fn merge(&mut self, other: Self, k: usize) {
        self.nan |= other.nan;
        let m = self.max.max(other.max);
        if m > f32::NEG_INFINITY {
            let (s1, u1) = Self::rescale(self.sum, self.moment, self.max, m);
            let (s2, u2) = Self::rescale(other.sum, other.moment, other.max, m);
            (self.sum, self.moment, self.max) = (s1 + s2, u1 + u2, m);
        }
        let rm = self.raw_max.max(other.raw_max);
        if rm > f32::NEG_INFINITY {
            let (s1, _) = Self::rescale(self.raw_sum, 0.0, self.raw_max, rm);
            let (s2, _) = Self::rescale(other.raw_sum, 0.0, other.raw_max, rm);
            (self.raw_sum, self.raw_max) = (s1 + s2, rm);
        }
        if let Some(b) = other.best
            && self.best.is_none_or(|a| b.score > a.score)
        {
            self.best = Some(b);
        }
        // Both lists are sorted; ids of `other` are larger, so equal values keep `self` first.
        let mut merged = Vec::with_capacity(k + 1);
        let (mut a, mut b) = (self.top.iter().peekable(), other.top.iter().peekable());
        while merged.len() < k {
            let take_a = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.0 >= y.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let next = if take_a { a.next() } else { b.next() };
            merged.extend(next.copied());
        }
        self.top = merged;
    }

    /// Why a row has no statistics (a NaN logit, or no finite one), if so; else its chosen
    /// token over the whole vocabulary.
    fn checked_best(&self, position: usize) -> Result<Best> {
        let nonfinite = |reason| Error::NonFiniteLogits { position, reason };
        if self.nan {
            return Err(nonfinite("NaN logit"));
        }
        self.best
            .ok_or_else(|| nonfinite("no finite logit outside the mask token"))
    }

    /// The statistics of the distribution truncated to its `ks` largest logits
    /// ([`StatsQuery::sample_top_k`]), from the kept top list (`ks <= plan.k` entries, value
    /// descending, ties to the lower id): `k` listed entries, the chosen token drawn among the
    /// kept ones with the row's `noise` (its Gumbel row, at `T > 0`).
    fn finish_truncated(
        self,
        (k, ks): (usize, usize),
        plan: &Plan<'_>,
        noise: Option<&[f32]>,
        position: usize,
    ) -> Result<RowStats> {
        self.checked_best(position)?;
        let kept = &self.top[..ks.min(self.top.len())];
        // A row with a finite logit has a non-empty top list.
        let Some(&(y_max, top1)) = kept.first() else {
            return Err(Error::NonFiniteLogits {
                position,
                reason: "no finite logit outside the mask token",
            });
        };
        let weights: Vec<f64> = kept
            .iter()
            .map(|&(y, _)| (f64::from(y) - f64::from(y_max)).exp())
            .collect();
        let z: f64 = weights.iter().sum();
        let entropy = weights
            .iter()
            .filter(|&&w| w > 0.0)
            .map(|&w| -(w / z) * (w / z).ln())
            .sum::<f64>()
            .max(0.0);
        // The chosen entry: the largest `y + G` (`y` at T = 0), ties to the lower id.
        let mut chosen = 0;
        if let Some(g) = noise {
            let score = |i: usize| kept[i].0 + g[kept[i].1 as usize];
            for i in 1..kept.len() {
                let (a, b) = (score(i), score(chosen));
                if a > b || (a == b && kept[i].1 < kept[chosen].1) {
                    chosen = i;
                }
            }
        }
        let t = f64::from(if plan.temperature > 0.0 {
            plan.temperature
        } else {
            1.0
        });
        let raw_prob = plan.raw.then(|| {
            let raw = |y: f32| ((f64::from(y) - f64::from(y_max)) * t).exp();
            raw(kept[chosen].0) / kept.iter().map(|&(y, _)| raw(y)).sum::<f64>()
        });
        let mut top_ids: Vec<TokenId> = kept.iter().take(k).map(|&(_, i)| i).collect();
        let mut top_probs: Vec<f32> = weights.iter().take(k).map(|&w| (w / z) as f32).collect();
        while top_ids.len() < k {
            top_ids.push(top1);
            top_probs.push(0.0);
        }
        Ok(RowStats {
            token: kept[chosen].1,
            token_prob: weights[chosen] / z,
            raw_prob,
            entropy,
            top_ids,
            top_probs,
        })
    }

    /// The statistics, or why there are none.
    fn finish(self, k: usize, temperature: f32, position: usize) -> Result<RowStats> {
        let best = self.checked_best(position)?;
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let prob = |y: f32| (f64::from(y) - f64::from(self.max)).exp() / self.sum;
        let entropy = (self.sum.ln() - self.moment / self.sum).max(0.0);
        let mut top_ids: Vec<TokenId> = self.top.iter().map(|&(_, i)| i).collect();
        let mut top_probs: Vec<f32> = self.top.iter().map(|&(v, _)| prob(v) as f32).collect();
        // Pad when fewer than k ids carry mass (tiny vocabularies).
        while top_ids.len() < k {
            top_ids.push(top_ids.first().copied().unwrap_or(best.id));
            top_probs.push(0.0);
        }
        let raw_prob = (self.raw_sum > 0.0)
            .then(|| (f64::from(best.logit) - f64::from(self.raw_max)).exp() / self.raw_sum);
        Ok(RowStats {
            token: best.id,
            token_prob: prob(best.logit / t),
            raw_prob,
            entropy,
            top_ids,
            top_probs,
        })
    }
}

/// The largest entry (`-inf` for none).
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let (chunks, rest) = x.as_chunks::<16>();
    for c in chunks {
        for (a, &b) in m.iter_mut().zip(c) {
            *a = if b > *a { b } else { *a };
        }
    }
    for &b in rest {
        m[0] = if b > m[0] { b } else { m[0] };
    }
    m.into_iter()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

/// `sum exp(x - m)` and `sum exp(x - m) * (x - m)` over `x` (entries `-inf` add nothing),
/// accumulated in 16 f32 lanes, then added in lane order.
#[inline(always)]
fn exp_sums(x: &[f32], m: f32) -> (f64, f64) {
    let mut s = [0.0f32; PANEL];
    let mut u = [0.0f32; PANEL];
    let mut chunks = x.chunks_exact(PANEL);
    for c in &mut chunks {
        for j in 0..PANEL {
            let d = c[j] - m;
            let e = fast_exp(d);
            s[j] += e;
            u[j] += if e > 0.0 { e * d } else { 0.0 };
        }
    }
    for (j, &v) in chunks.remainder().iter().enumerate() {
        let d = v - m;
        let e = fast_exp(d);
        s[j] += e;
        u[j] += if e > 0.0 { e * d } else { 0.0 };
    }
    let (mut ss, mut uu) = (0.0f64, 0.0f64);
    for j in 0..PANEL {
        ss += f64::from(s[j]);
        uu += f64::from(u[j]);
    }
    (ss, uu)
}

impl HostHead {
    /// Packs an HF `[vocab, dim]` output (or tied embedding) matrix, row-major; a slice of
    /// another length, or an empty shape, is an error naming the expected length.
    pub fn new(w: &[f32], vocab: usize, dim: usize) -> Result<Self> {
        if vocab == 0 || dim == 0 || w.len() != vocab * dim {
            return Err(Error::ShapeMismatch {
                what: "output layer weights (vocab x dim)",
                expected: vocab * dim,
                actual: w.len(),
            });
        }
        Ok(Self::pack(w, vocab, dim))
    }

    /// [`HostHead::new`] for a matrix whose length the caller checked.
    fn pack(w: &[f32], vocab: usize, dim: usize) -> Self {
        let panels = vocab.div_ceil(PANEL);
        let mut packed = vec![0.0f32; panels * dim * PANEL];
        for (v, row) in w.chunks_exact(dim).enumerate() {
            let (p, j) = (v / PANEL, v % PANEL);
            let base = p * dim * PANEL + j;
            for (k, &x) in row.iter().enumerate() {
                packed[base + k * PANEL] = x;
            }
        }
        let per_panel = dim * PANEL * 4;
        let mut tile = (TILE_BYTES / per_panel.max(1)).clamp(1, SEGMENT / PANEL) * PANEL;
        while !SEGMENT.is_multiple_of(tile) {
            tile -= PANEL;
        }
        Self {
            vocab,
            dim,
            tile,
            packed,
        }
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Hidden size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The HF `[vocab, dim]` matrix back.
    pub fn unpack(&self) -> Vec<f32> {
        let dim = self.dim;
        let mut w = vec![0.0f32; self.vocab * dim];
        for (v, row) in w.chunks_exact_mut(dim).enumerate() {
            let base = (v / PANEL) * dim * PANEL + v % PANEL;
            for (k, x) in row.iter_mut().enumerate() {
                *x = self.packed[base + k * PANEL];
            }
        }
        w
    }

    /// Logits of one group of `MR` rows (`h`: `dim` steps of `MR` values, zero-padded rows) for
    /// the panels `p0..p0 + n`, written to `out[r * stride + (p - p0) * PANEL + j]`: per logit
    /// one multiply-add chain over `k`, in order.
    #[inline(always)]
    /// `pairs`: two panels per step (only where vectors hold 16 lanes: 12 accumulators need
    /// 24 registers of 8 lanes, more than AVX2 has).
    fn panels(
        &self,
        h: &[[f32; MR]],
        (p0, n, pairs): (usize, usize, bool),
        out: &mut [f32],
        stride: usize,
    ) {
        let dim = self.dim;
        let mut p = p0;
        // Two panels at a time (12 accumulators: 8 loads per 12 multiply-adds), then one.
        while pairs && p + 2 <= p0 + n {
            let (w0, _) = self.packed[p * dim * PANEL..(p + 1) * dim * PANEL].as_chunks::<PANEL>();
            let (w1, _) =
                self.packed[(p + 1) * dim * PANEL..(p + 2) * dim * PANEL].as_chunks::<PANEL>();
            let mut acc0 = [[0.0f32; PANEL]; MR];
            let mut acc1 = [[0.0f32; PANEL]; MR];
            for ((hk, wk0), wk1) in h.iter().zip(w0).zip(w1) {
                for ((a0, a1), &b) in acc0.iter_mut().zip(acc1.iter_mut()).zip(hk) {
                    for (x, &y) in a0.iter_mut().zip(wk0) {
                        *x = b.mul_add(y, *x);
                    }
                    for (x, &y) in a1.iter_mut().zip(wk1) {
                        *x = b.mul_add(y, *x);
                    }
                }
            }
            for r in 0..MR {
                let at = r * stride + (p - p0) * PANEL;
                out[at..at + PANEL].copy_from_slice(&acc0[r]);
                out[at + PANEL..at + 2 * PANEL].copy_from_slice(&acc1[r]);
            }
            p += 2;
        }
        for p in p..p0 + n {
            let (w, _) = self.packed[p * dim * PANEL..(p + 1) * dim * PANEL].as_chunks::<PANEL>();
            let mut acc = [[0.0f32; PANEL]; MR];
            for (hk, wk) in h.iter().zip(w) {
                for (a, &b) in acc.iter_mut().zip(hk) {
                    for (x, &y) in a.iter_mut().zip(wk) {
                        *x = b.mul_add(y, *x);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let at = r * stride + (p - p0) * PANEL;
                out[at..at + PANEL].copy_from_slice(a);
            }
        }
    }

    /// The rows `rows` of `hidden`, in groups of `MR` (the last one zero-padded), each group
    /// interleaved: `dim` steps of `MR` values.
    fn gather(&self, hidden: &[f32], rows: &[usize]) -> Vec<[f32; MR]> {
        let dim = self.dim;
        let mut out = vec![[0.0f32; MR]; rows.len().div_ceil(MR) * dim];
        for (i, &r) in rows.iter().enumerate() {
            let (g, lane) = (i / MR, i % MR);
            for (k, &x) in hidden[r * dim..(r + 1) * dim].iter().enumerate() {
                out[g * dim + k][lane] = x;
            }
        }
        out
    }

    /// Runs `sinks[s]` over segment `s` of the vocabulary for the rows `rows` of `hidden`, the
    /// segments in parallel, in the widest SIMD the CPU has; returns the sinks in order.
    fn sweep<S: Sink + Send>(&self, hidden: &[f32], rows: &[usize], sinks: Vec<S>) -> Vec<S> {
        self.sweep_on(hidden, rows, sinks, &Dispatch)
    }

    /// [`HostHead::sweep`] with each segment run by `run` (tests pick the instruction set).
    fn sweep_on<S: Sink + Send>(
        &self,
        hidden: &[f32],
        rows: &[usize],
        sinks: Vec<S>,
        isa: &impl Isa,
    ) -> Vec<S> {
        let h = self.gather(hidden, rows);
        sinks
            .into_par_iter()
            .enumerate()
            .map(|(segment, sink)| {
                isa.run(Sweep {
                    head: self,
                    h: &h,
                    segment,
                    sink,
                })
            })
            .collect()
    }

    /// Logits `[rows, vocab]` of `hidden` `[rows, dim]` (the values the reduction reads).
    pub fn logits(&self, hidden: &[f32]) -> Logits {
        self.logits_on(hidden, &Dispatch)
    }

    /// [`HostHead::logits`] with each segment run by `run`.
    fn logits_on(&self, hidden: &[f32], isa: &impl Isa) -> Logits {
        let rows = hidden.len() / self.dim.max(1);
        let mut out = Logits::zeroed(rows, self.vocab);
        self.columns_into::<LOGITS_SEGMENT>(hidden, out.values_mut(), isa);
        out
    }

    /// `hidden` `[rows, dim]` times the packed matrix, `[rows, vocab]` row-major: the packed
    /// matrix used as a hidden layer's weight (`vocab` its outputs). Each value is the same
    /// multiply-add chain as in [`HostHead::logits`], so a row's values do not depend on the
    /// other rows of the call.
    pub fn product(&self, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / self.dim.max(1);
        let mut out = vec![0.0f32; rows * self.vocab];
        self.columns_into::<PRODUCT_SEGMENT>(hidden, &mut out, &Dispatch);
        out
    }

    /// Writes `hidden` times the packed matrix into `out` (`[rows, vocab]`), `SEG` columns
    /// per parallel task.
    fn columns_into<const SEG: usize>(&self, hidden: &[f32], out: &mut [f32], isa: &impl Isa) {
        let vocab = self.vocab;
        let rows = hidden.len() / self.dim.max(1);
        // Each segment fills its column range of every row.
        let mut sinks: Vec<ColumnsSink<'_, SEG>> = (0..vocab.div_ceil(SEG))
            .map(|_| ColumnsSink {
                parts: Vec::with_capacity(rows),
            })
            .collect();
        for row in out.chunks_mut(vocab) {
            for (s, part) in row.chunks_mut(SEG).enumerate() {
                sinks[s].parts.push(part);
            }
        }
        self.sweep_on(hidden, &(0..rows).collect::<Vec<_>>(), sinks, isa);
    }

    /// The statistics of the rows `jobs` of `hidden` `[rows, dim]` under `query`. `noise` is the
    /// `[n, vocab]` Gumbel table the jobs index (required at `T > 0`); `positions[i]` is job
    /// `i`'s sequence position, named in errors.
    pub fn reduce(
        &self,
        hidden: &[f32],
        jobs: &[RowJob],
        query: &StatsQuery,
        mask: Option<TokenId>,
        noise: Option<&[f32]>,
        positions: &[usize],
    ) -> Result<Vec<RowStats>> {
        let vocab = self.vocab;
        let t = query.temperature;
        if t > 0.0 && noise.is_none() {
            return Err(Error::config(
                "noise",
                "the Gumbel rows are required at T > 0",
            ));
        }
        let out_k = query.effective_top_k(vocab);
        let truncate = query
            .sample_top_k
            .map(|k| k.min(vocab.saturating_sub(1)).max(1));
        let plan = Plan {
            temperature: t,
            mask: mask.map(|m| m as usize),
            k: out_k.max(truncate.unwrap_or(0)),
            truncate,
            raw: query.rule.reads_raw_probability(t),
            noise: if t > 0.0 { noise } else { None },
        };
        let rows: Vec<usize> = jobs.iter().map(|j| j.hidden).collect();
        let sinks = (0..vocab.div_ceil(SEGMENT))
            .map(|_| ReduceSink {
                acc: jobs.iter().map(|_| Partial::new(plan.k)).collect(),
                plan: &plan,
                jobs,
                vocab,
            })
            .collect();
        let mut segments = self.sweep(hidden, &rows, sinks).into_iter().map(|s| s.acc);
        let mut merged = segments.next().unwrap_or_default();
        for seg in segments {
            for (m, p) in merged.iter_mut().zip(seg) {
                m.merge(p, plan.k);
            }
        }
        merged
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let position = positions.get(i).copied().unwrap_or(i);
                let noise = plan
                    .noise
                    .and_then(|n| n.get(jobs[i].noise * vocab..(jobs[i].noise + 1) * vocab));
                match plan.truncate {
                    Some(ks) => p.finish_truncated((out_k, ks), &plan, noise, position),
                    None => p.finish(out_k, t, position),
                }
            })
            .collect()
    }
}

/// What a sweep does with the logits of one row over one tile.
trait Sink {
    /// Vocabulary ids per segment.
    const SEGMENT: usize = SEGMENT;

    /// `logits` are those of row `row` for ids `first..first + logits.len()`; rows past the
    /// sink's last are padding.
    fn row(&mut self, row: usize, first: usize, logits: &mut [f32]);
}

/// Copies the products out, `SEG` columns per segment.
struct ColumnsSink<'a, const SEG: usize> {
    /// Per row, the segment's columns.
    parts: Vec<&'a mut [f32]>,
}

impl<const SEG: usize> Sink for ColumnsSink<'_, SEG> {
    const SEGMENT: usize = SEG;

    #[inline(always)]
    fn row(&mut self, row: usize, first: usize, logits: &mut [f32]) {
        if let Some(part) = self.parts.get_mut(row) {
            let at = first % SEG;
            part[at..at + logits.len()].copy_from_slice(logits);
        }
    }
}

/// Folds logits into each job's running statistics.
struct ReduceSink<'a> {
    acc: Vec<Partial>,
    plan: &'a Plan<'a>,
    jobs: &'a [RowJob],
    vocab: usize,
}

impl Sink for ReduceSink<'_> {
    #[inline(always)]
    fn row(&mut self, row: usize, first: usize, logits: &mut [f32]) {
        let Some(a) = self.acc.get_mut(row) else {
            return;
        };
        let noise = self
            .plan
            .noise
            .map(|n| &n[self.jobs[row].noise * self.vocab + first..][..logits.len()]);
        a.update(logits, first, self.plan, noise);
    }
}

/// One segment of a sweep: tiles of the vocabulary, each read by every group of `MR` rows
/// while it is in cache.
/// The instruction set a sweep runs in.
trait Isa: Sync {
    fn run<S: Sink>(&self, sweep: Sweep<'_, S>) -> S;
}

/// The widest the CPU has.
struct Dispatch;

impl Isa for Dispatch {
    fn run<S: Sink>(&self, sweep: Sweep<'_, S>) -> S {
        pulp::Arch::new().dispatch(sweep)
    }
}

struct Sweep<'a, S> {
    head: &'a HostHead,
    h: &'a [[f32; MR]],
    segment: usize,
    sink: S,
}

impl<S: Sink> pulp::WithSimd for Sweep<'_, S> {
    type Output = S;

    #[inline(always)]
    fn with_simd<V: pulp::Simd>(mut self, _: V) -> S {
        let head = self.head;
        let (dim, tile) = (head.dim, head.tile);
        let len = S::SEGMENT;
        let first = self.segment * len;
        let end = (first + len).min(head.vocab);
        let mut buf = vec![0.0f32; MR * tile];
        for t0 in (first..end).step_by(tile) {
            let width = (end - t0).min(tile);
            for (g, hg) in self.h.chunks_exact(dim).enumerate() {
                let panels = (t0 / PANEL, width.div_ceil(PANEL), V::F32_LANES >= 16);
                head.panels(hg, panels, &mut buf, tile);
                for r in 0..MR {
                    self.sink
                        .row(g * MR + r, t0, &mut buf[r * tile..r * tile + width]);
                }
            }
        }
        self.sink
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use spot_core::stats::{ReduceScratch, reduce_logits};
    use spot_core::{BlockStats, ConfidenceRule};

    /// Deterministic values in about [-scale, scale].
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let x = spot_core::state::mix64(seed * 1_000_003 + i);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    /// Three segments (the last one partial), tiles of several sizes, and a vocabulary that
    /// is not a multiple of the panel width.
    const VOCAB: usize = 2 * SEGMENT + 1234;

    fn head(dim: usize) -> HostHead {
        HostHead::pack(&values(VOCAB * dim, 1, 0.5), VOCAB, dim)
    }

    #[test]
    fn logits_are_the_matrix_product() {
        let dim = 24;
        let w = values(VOCAB * dim, 1, 0.5);
        let h = HostHead::pack(&w, VOCAB, dim);
        assert_eq!(h.unpack(), w);
        let hidden = values(7 * dim, 2, 1.0);
        let logits = h.logits(&hidden);
        for r in 0..7 {
            for v in (0..VOCAB).step_by(97).chain([VOCAB - 1]) {
                let want: f64 = (0..dim)
                    .map(|k| f64::from(hidden[r * dim + k]) * f64::from(w[v * dim + k]))
                    .sum();
                let got = logits[r * VOCAB + v];
                assert!(
                    (f64::from(got) - want).abs() < 1e-5,
                    "row {r} id {v}: {got} vs {want}"
                );
            }
        }
    }

    /// Every instruction set gives the same logits, bit for bit: the 16-lane kernel (two
    /// panels per step) and the 8-lane and scalar ones (one panel per step) run the same
    /// multiply-add chain per logit.
    #[test]
    fn instruction_sets_agree_bitwise() {
        let dim = 40;
        let h = head(dim);
        let hidden = values(13 * dim, 5, 1.0);
        struct On<V>(V);
        impl<V: pulp::Simd + Sync> Isa for On<V> {
            fn run<S: Sink>(&self, sweep: Sweep<'_, S>) -> S {
                self.0.vectorize(sweep)
            }
        }
        let scalar = h.logits_on(&hidden, &On(pulp::Scalar::new()));
        assert_eq!(h.logits(&hidden), scalar, "dispatched vs scalar");
        #[cfg(target_arch = "x86_64")]
        {
            let wide = pulp::x86::V4::try_new().is_some();
            match pulp::x86::V3::try_new() {
                Some(v3) => {
                    let avx2 = h.logits_on(&hidden, &On(v3));
                    assert_eq!(avx2, scalar, "AVX2 vs scalar");
                }
                None => eprintln!("SKIPPED the AVX2 half: this CPU has no AVX2"),
            }
            if !wide {
                eprintln!("SKIPPED the two-panel kernel: this CPU has no AVX-512");
            }
        }
    }

    /// The fused reduction gives the host reference's statistics (within float rounding)
    /// under every rule, at T = 0, 0.7 and 1, with a mask id, with and without top-k
    /// truncation (to fewer and to more ids than the top list holds).
    #[test]
    fn reduction_matches_the_host_reference() {
        let dim = 16;
        let h = head(dim);
        let rows = 9;
        let hidden = values(rows * dim, 3, 6.0);
        let logits = h.logits(&hidden);
        let mask = 4321;
        let cases = [0.0f32, 0.7, 1.0]
            .into_iter()
            .flat_map(|t| ConfidenceRule::ALL.map(|rule| (t, rule)))
            .flat_map(|(t, rule)| [None, Some(1), Some(5), Some(40)].map(|k| (t, rule, k)));
        for (t, rule, truncate) in cases {
            {
                let q = StatsQuery {
                    rule,
                    sample_top_k: truncate,
                    ..StatsQuery::new(t, 17)
                };
                let first = 40;
                let noise: Vec<f32> = (0..rows)
                    .flat_map(|s| {
                        let mut row = vec![0.0f32; VOCAB];
                        q.noise.fill_row((first + s) as u64, &mut row);
                        row
                    })
                    .collect();
                let jobs: Vec<RowJob> = (0..rows)
                    .map(|r| RowJob {
                        hidden: r,
                        noise: r,
                    })
                    .collect();
                let positions: Vec<usize> = (0..rows).map(|r| first + r).collect();
                let got = h
                    .reduce(&hidden, &jobs, &q, Some(mask), Some(&noise), &positions)
                    .unwrap();
                let mut want = BlockStats::new(q.top_k);
                let mut scratch = ReduceScratch::default();
                for r in 0..rows {
                    let l = &logits[r * VOCAB..(r + 1) * VOCAB];
                    reduce_logits(l, first + r, &q, mask, &mut scratch, &mut want).unwrap();
                }
                for (r, g) in got.iter().enumerate() {
                    let what = format!("T {t} {rule} top-k {truncate:?} row {r}");
                    assert_eq!(g.token, want.token(r), "{what}");
                    let close = |a: f64, b: f32, tol: f64| (a - f64::from(b)).abs() <= tol;
                    assert!(close(g.token_prob, want.token_prob(r), 1e-6), "{what}");
                    assert!(
                        close(g.entropy, want.entropy(r), 1e-5),
                        "{what}: {} vs {}",
                        g.entropy,
                        want.entropy(r)
                    );
                    assert!(
                        close(g.confidence(rule), want.confidence(r), 1e-5),
                        "{what}"
                    );
                    let (ids, probs) = want.top(r);
                    assert_eq!(g.top_ids, ids, "{what}");
                    for (a, b) in g.top_probs.iter().zip(probs) {
                        assert!((a - b).abs() <= 1e-6, "{what}: {a} vs {b}");
                    }
                    assert!(!g.top_ids.contains(&mask));
                }
            }
        }
    }

    /// As a hidden layer's weight: the product equals the matrix product, and each row's
    /// values are bit-identical whatever rows share the call (one row, or thirteen).
    #[test]
    fn products_are_row_independent_matrix_products() {
        let (out, dim) = (600, 37);
        let w = values(out * dim, 11, 1.0);
        let h = HostHead::pack(&w, out, dim);
        let x = values(13 * dim, 12, 2.0);
        let all = h.product(&x);
        for r in 0..13 {
            let one = h.product(&x[r * dim..(r + 1) * dim]);
            assert_eq!(one, all[r * out..(r + 1) * out], "row {r}");
            for o in 0..out {
                let want: f32 = (0..dim).map(|k| x[r * dim + k] * w[o * dim + k]).sum();
                assert!(
                    (one[o] - want).abs() <= 1e-4,
                    "{r}/{o}: {} vs {want}",
                    one[o]
                );
            }
        }
    }

    /// A row's statistics do not depend on which other rows are reduced with it.
    #[test]
    fn rows_are_independent_of_the_batch() {
        let dim = 40;
        let h = head(dim);
        let hidden = values(20 * dim, 5, 4.0);
        let q = StatsQuery::new(1.0, 3);
        let noise: Vec<f32> = (0..4)
            .flat_map(|s| {
                let mut row = vec![0.0f32; VOCAB];
                q.noise.fill_row(s, &mut row);
                row
            })
            .collect();
        let run = |rows: &[usize]| {
            let jobs: Vec<RowJob> = rows
                .iter()
                .map(|&r| RowJob {
                    hidden: r,
                    noise: r % 4,
                })
                .collect();
            h.reduce(&hidden, &jobs, &q, None, Some(&noise), rows)
                .unwrap()
        };
        let all: Vec<usize> = (0..20).collect();
        let together = run(&all);
        for r in [0usize, 5, 6, 13, 19] {
            assert_eq!(run(&[r])[0], together[r], "row {r} alone");
            assert_eq!(run(&[19, r])[1], together[r], "row {r} second of two");
        }
        let logits = h.logits(&hidden);
        let one = h.logits(&hidden[7 * dim..8 * dim]);
        assert_eq!(*one, logits[7 * VOCAB..8 * VOCAB]);
    }

    #[test]
    fn non_finite_logits_are_errors() {
        let dim = 8;
        let h = head(dim);
        let q = StatsQuery::new(0.0, 0);
        let job = [RowJob {
            hidden: 0,
            noise: 0,
        }];
        let mut hidden = vec![0.1f32; dim];
        hidden[3] = f32::NAN;
        let err = h.reduce(&hidden, &job, &q, None, None, &[12]).unwrap_err();
        assert!(err.to_string().contains("NaN"), "{err}");
        assert!(err.to_string().contains("12"), "{err}");
        // One id and it is the mask.
        let tiny = HostHead::pack(&[1.0; 8], 1, 8);
        let err = tiny
            .reduce(&[1.0; 8], &job, &q, Some(0), None, &[3])
            .unwrap_err();
        assert!(err.to_string().contains("no finite logit"), "{err}");
    }
}
