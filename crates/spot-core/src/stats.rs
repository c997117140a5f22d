//! What a forward returns: compact per-position statistics, never whole logits.
//!
//! A model reduces its logits (on the device where they live) to a [`BlockStats`] per block
//! state: the chosen token and its confidence under the query's temperature and noise, the
//! top-k probabilities and ids, the entropy and the probability mass outside the top-k.
//! [`reduce_logits`] is the host reference of that reduction; models that compute logits on the
//! host (the toy models) call it directly, device implementations are tested against it.

use crate::error::{Error, Result};
use crate::noise::GumbelNoise;
use crate::state::TokenId;

/// How the confidence `c_s` of a position is computed from its distribution.
///
/// The chosen token is always `argmax_v(logit(v) / T + G[a, v])` (plain argmax at `T = 0`);
/// the rule only decides the number that positions are ranked by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfidenceRule {
    /// Probability of the chosen token under `softmax(logit / T)` (`softmax(logit)` at `T = 0`).
    /// The default, as in SDAR and SPOT.
    #[default]
    Probability,
    /// Probability of the chosen token under the un-tempered `softmax(logit)` (LLaDA's sampler).
    RawProbability,
    /// Top-1 minus top-2 probability of the tempered distribution (Dream's `margin`).
    Margin,
    /// Negative entropy of the tempered distribution in nats (Dream's `entropy`).
    NegativeEntropy,
}

impl ConfidenceRule {
    /// Every rule, in declaration order.
    pub const ALL: [ConfidenceRule; 4] = [
        ConfidenceRule::Probability,
        ConfidenceRule::RawProbability,
        ConfidenceRule::Margin,
        ConfidenceRule::NegativeEntropy,
    ];

    /// The rule's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ConfidenceRule::Probability => "probability",
            ConfidenceRule::RawProbability => "raw-probability",
            ConfidenceRule::Margin => "margin",
            ConfidenceRule::NegativeEntropy => "negative-entropy",
        }
    }

    /// Whether the rule reads the un-tempered probability of the chosen token, which a
    /// reduction must then compute besides the tempered distribution (only at `T > 0`: at
    /// `T = 0` it is the tempered one).
    pub fn reads_raw_probability(self, temperature: f32) -> bool {
        self == ConfidenceRule::RawProbability && temperature > 0.0
    }

    /// The confidence of a position: the one definition every reduction (host reference,
    /// device, host kernel) uses. `token_prob` is the chosen token's tempered probability,
    /// `raw_prob` its un-tempered one (read when [`ConfidenceRule::reads_raw_probability`]),
    /// `top_probs` the tempered top-k (descending), `entropy` the tempered entropy in nats.
    ///
    /// ```
    /// use spot_core::ConfidenceRule;
    /// let c = |r: ConfidenceRule| r.confidence(0.5, Some(0.7), &[0.5, 0.2], 1.25);
    /// assert_eq!(c(ConfidenceRule::Probability), 0.5);
    /// assert_eq!(c(ConfidenceRule::RawProbability), 0.7);
    /// assert!((c(ConfidenceRule::Margin) - 0.3).abs() < 1e-7);
    /// assert_eq!(c(ConfidenceRule::NegativeEntropy), -1.25);
    /// ```
    pub fn confidence(
        self,
        token_prob: f64,
        raw_prob: Option<f64>,
        top_probs: &[f32],
        entropy: f64,
    ) -> f64 {
        match self {
            ConfidenceRule::Probability => token_prob,
            ConfidenceRule::RawProbability => raw_prob.unwrap_or(token_prob),
            ConfidenceRule::Margin => {
                let p = |i: usize| f64::from(top_probs.get(i).copied().unwrap_or(0.0));
                p(0) - p(1)
            }
            ConfidenceRule::NegativeEntropy => -entropy,
        }
    }
}

impl std::fmt::Display for ConfidenceRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ConfidenceRule {
    type Err = Error;

    /// Parses a [`ConfidenceRule::name`].
    fn from_str(s: &str) -> Result<Self> {
        ConfidenceRule::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ConfidenceRule::ALL.iter().map(|r| r.name()).collect();
                Error::config(
                    "confidence",
                    format!("unknown rule {s:?}; one of {}", names.join(", ")),
                )
            })
    }
}

/// What a forward must compute, shared by every state of one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatsQuery {
    /// Sampling temperature, finite and `>= 0`; `0` is argmax.
    pub temperature: f32,
    /// The coupled noise table used when `temperature > 0`.
    pub noise: GumbelNoise,
    /// The confidence rule.
    pub rule: ConfidenceRule,
    /// How many top probabilities and ids to return per position (clamped to the vocabulary
    /// minus the mask token).
    pub top_k: usize,
    /// Ask the model to attach its last hidden states ([`BlockStats::hidden`]). Models that
    /// cannot ignore it; decoders never require it.
    pub hidden_states: bool,
    /// Top-k truncation (`None`: off): each position's distribution is cut to its `k` largest
    /// logits (the mask excluded; ties to the lower id) and renormalised before anything is
    /// computed: the chosen token is drawn among them, and its probability, the entropy, the
    /// confidence and the top list are those of the truncated distribution (ids outside carry
    /// no mass and are not listed; the list is padded with the top-1 id at probability 0).
    /// Part of the query, so draft-free and speculative decoding apply it identically.
    pub sample_top_k: Option<usize>,
}

impl StatsQuery {
    /// A query at temperature `temperature` with noise seed `seed`, the default rule and top-32.
    pub fn new(temperature: f32, seed: u64) -> Self {
        Self {
            temperature,
            noise: GumbelNoise::new(seed),
            rule: ConfidenceRule::Probability,
            top_k: 32,
            hidden_states: false,
            sample_top_k: None,
        }
    }

    /// Checks the temperature and `top_k`.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::config(
                "temperature",
                format!("must be finite and >= 0, got {}", self.temperature),
            ));
        }
        if self.top_k == 0 {
            return Err(Error::config("top_k", "must be at least 1"));
        }
        if self.sample_top_k == Some(0) {
            return Err(Error::config(
                "sample_top_k",
                "must be at least 1 (or off), got 0",
            ));
        }
        Ok(())
    }

    /// The number of top entries a model with `vocab_size` tokens returns.
    pub fn effective_top_k(&self, vocab_size: usize) -> usize {
        self.top_k.min(vocab_size.saturating_sub(1)).max(1)
    }
}

/// Per-position statistics of one block state, stored column-wise.
///
/// Position `s` has: `token(s)` (the chosen token), `confidence(s)` (under the query's rule),
/// `token_prob(s)` (probability of the chosen token under the tempered distribution),
/// `entropy(s)`, `tail_mass(s)` (probability outside the top-k) and `top(s)` (the top-k ids and
/// probabilities of the tempered distribution, descending, ties to the lower id).
/// Decoders read only the statistics of masked positions. Models may skip the others (the
/// `spot-models` models do): a committed position then holds its own token with probability 1,
/// entropy 0 and confidence 1; the host reference [`reduce_logits`] computes every position it
/// is given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStats {
    top_k: usize,
    token: Vec<TokenId>,
    confidence: Vec<f32>,
    token_prob: Vec<f32>,
    entropy: Vec<f32>,
    tail_mass: Vec<f32>,
    top_ids: Vec<TokenId>,
    top_probs: Vec<f32>,
    hidden: Option<(usize, Vec<f32>)>,
}

/// The statistics of one position, as pushed into a [`BlockStats`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PositionStats<'a> {
    /// Chosen token.
    pub token: TokenId,
    /// Confidence under the query's rule.
    pub confidence: f32,
    /// Probability of `token` under the tempered distribution.
    pub token_prob: f32,
    /// Entropy (nats) of the tempered distribution.
    pub entropy: f32,
    /// Probability mass outside the top-k.
    pub tail_mass: f32,
    /// Top-k token ids, most probable first.
    pub top_ids: &'a [TokenId],
    /// Their probabilities.
    pub top_probs: &'a [f32],
}

impl BlockStats {
    /// Empty statistics that will hold `top_k` entries per position.
    pub fn new(top_k: usize) -> Self {
        Self {
            top_k,
            ..Self::default()
        }
    }

    /// Appends the next position. `top_ids` and `top_probs` must have `top_k` entries.
    pub fn push(&mut self, p: PositionStats<'_>) -> Result<()> {
        for (what, n) in [
            ("top_ids", p.top_ids.len()),
            ("top_probs", p.top_probs.len()),
        ] {
            if n != self.top_k {
                return Err(Error::ShapeMismatch {
                    what,
                    expected: self.top_k,
                    actual: n,
                });
            }
        }
        self.token.push(p.token);
        self.confidence.push(p.confidence);
        self.token_prob.push(p.token_prob);
        self.entropy.push(p.entropy);
        self.tail_mass.push(p.tail_mass);
        self.top_ids.extend_from_slice(p.top_ids);
        self.top_probs.extend_from_slice(p.top_probs);
        Ok(())
    }

    /// Attaches hidden states (`len() * dim` values, position-major).
    pub fn set_hidden(&mut self, dim: usize, values: Vec<f32>) -> Result<()> {
        if values.len() != dim * self.len() {
            return Err(Error::ShapeMismatch {
                what: "hidden states",
                expected: dim * self.len(),
                actual: values.len(),
            });
        }
        self.hidden = Some((dim, values));
        Ok(())
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.token.len()
    }

    /// Whether no position has been pushed.
    pub fn is_empty(&self) -> bool {
        self.token.is_empty()
    }

    /// Entries per position in [`BlockStats::top`].
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Chosen token at `s`.
    pub fn token(&self, s: usize) -> TokenId {
        self.token[s]
    }

    /// Confidence at `s` under the query's rule.
    pub fn confidence(&self, s: usize) -> f32 {
        self.confidence[s]
    }

    /// Probability of the chosen token at `s` under the tempered distribution.
    pub fn token_prob(&self, s: usize) -> f32 {
        self.token_prob[s]
    }

    /// Entropy at `s` (nats).
    pub fn entropy(&self, s: usize) -> f32 {
        self.entropy[s]
    }

    /// Mass outside the top-k at `s`.
    pub fn tail_mass(&self, s: usize) -> f32 {
        self.tail_mass[s]
    }

    /// The top-k ids and probabilities at `s`, most probable first.
    pub fn top(&self, s: usize) -> (&[TokenId], &[f32]) {
        let r = s * self.top_k..(s + 1) * self.top_k;
        (&self.top_ids[r.clone()], &self.top_probs[r])
    }

    /// All chosen tokens.
    pub fn tokens(&self) -> &[TokenId] {
        &self.token
    }

    /// All confidences.
    pub fn confidences(&self) -> &[f32] {
        &self.confidence
    }

    /// Whether `other` holds the same statistics bit for bit (floats compared by their bits:
    /// `0.0` and `-0.0` differ, a NaN equals itself), hidden states included. What a cache of
    /// values computed from the statistics checks before reusing them.
    pub fn same_bits(&self, other: &BlockStats) -> bool {
        fn bits(a: &[f32], b: &[f32]) -> bool {
            // A branch-free fold (vectorises): every element is read.
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .fold(true, |eq, (x, y)| eq & (x.to_bits() == y.to_bits()))
        }
        let hidden = match (&self.hidden, &other.hidden) {
            (None, None) => true,
            (Some((d, a)), Some((e, b))) => d == e && bits(a, b),
            _ => false,
        };
        self.top_k == other.top_k
            && self.token == other.token
            && self.top_ids == other.top_ids
            && bits(&self.confidence, &other.confidence)
            && bits(&self.token_prob, &other.token_prob)
            && bits(&self.entropy, &other.entropy)
            && bits(&self.tail_mass, &other.tail_mass)
            && bits(&self.top_probs, &other.top_probs)
            && hidden
    }

    /// Hidden states, if the model attached them: `(dim, values)`.
    pub fn hidden(&self) -> Option<(usize, &[f32])> {
        self.hidden.as_ref().map(|(d, v)| (*d, v.as_slice()))
    }

    /// Position `s`'s hidden state, if the model attached them.
    pub fn hidden_at(&self, s: usize) -> Option<&[f32]> {
        self.hidden
            .as_ref()
            .and_then(|(d, v)| v.get(s * d..(s + 1) * d))
    }

    /// Removes and returns the hidden states.
    pub fn take_hidden(&mut self) -> Option<(usize, Vec<f32>)> {
        self.hidden.take()
    }

    /// Checks the shape against the block size and that every value is finite and in range.
    /// Decoders call this on every forward's output, so a model bug surfaces as
    /// [`Error::InvalidStatistics`] naming the field and position instead of a wrong decode.
    pub fn validate(&self, block_size: usize, vocab_size: usize, mask_id: TokenId) -> Result<()> {
        if self.len() != block_size {
            return Err(Error::ShapeMismatch {
                what: "statistics positions per state",
                expected: block_size,
                actual: self.len(),
            });
        }
        if self.top_k == 0 {
            return Err(Error::ShapeMismatch {
                what: "top-k entries per position (at least 1)",
                expected: 1,
                actual: 0,
            });
        }
        let bad = |field, position, value: String| {
            Err(Error::InvalidStatistics {
                field,
                position,
                value,
            })
        };
        for s in 0..self.len() {
            let t = self.token[s];
            if t as usize >= vocab_size || t == mask_id {
                return bad(
                    "token",
                    s,
                    format!("{t} (vocab {vocab_size}, mask {mask_id})"),
                );
            }
            if !self.confidence[s].is_finite() {
                return bad("confidence", s, self.confidence[s].to_string());
            }
            for (field, v) in [
                ("token_prob", self.token_prob[s]),
                ("tail_mass", self.tail_mass[s]),
            ] {
                if !(0.0..=1.0001).contains(&v) {
                    return bad(field, s, v.to_string());
                }
            }
            if !self.entropy[s].is_finite() || self.entropy[s] < -1e-4 {
                return bad("entropy", s, self.entropy[s].to_string());
            }
            let (ids, probs) = self.top(s);
            if let Some(p) = probs.iter().find(|p| !(0.0..=1.0001).contains(*p)) {
                return bad("top_probs", s, p.to_string());
            }
            if let Some(i) = ids.iter().find(|&&i| i as usize >= vocab_size) {
                return bad("top_ids", s, i.to_string());
            }
        }
        Ok(())
    }
}

/// The statistics of one block state from its logits, by [`reduce_logits`] row by row: what a
/// model that computes full logits returns from [`crate::BlockDiffusionModel::forward`] for
/// each state.
///
/// `logits` holds one row of `vocab` values per block position, row-major; the row of block
/// position `s` sits at absolute position `start + s` (the noise row it reads). The result has
/// [`StatsQuery::effective_top_k`] entries per position. A length that is not a whole number
/// of rows is an [`Error::ShapeMismatch`].
///
/// ```
/// use spot_core::{StatsQuery, stats::{ReduceScratch, reduce_block}};
/// // Two positions of a 4-token vocabulary (id 3 is the mask), at absolute positions 10, 11.
/// let logits = [0.0f32, 2.0, 1.0, 5.0, 3.0, 0.0, 1.0, 9.0];
/// let q = StatsQuery::new(0.0, 0);
/// let stats = reduce_block(&logits, 4, 10, &q, 3, &mut ReduceScratch::default())?;
/// assert_eq!((stats.len(), stats.token(0), stats.token(1)), (2, 1, 0));
/// # Ok::<(), spot_core::Error>(())
/// ```
pub fn reduce_block(
    logits: &[f32],
    vocab: usize,
    start: usize,
    query: &StatsQuery,
    mask_id: TokenId,
    scratch: &mut ReduceScratch,
) -> Result<BlockStats> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) {
        return Err(Error::ShapeMismatch {
            what: "block logits (positions x vocabulary)",
            expected: logits.len().div_ceil(vocab.max(1)) * vocab,
            actual: logits.len(),
        });
    }
    let mut out = BlockStats::new(query.effective_top_k(vocab));
    for (s, row) in logits.chunks_exact(vocab).enumerate() {
        reduce_logits(row, start + s, query, mask_id, scratch, &mut out)?;
    }
    Ok(out)
}

/// Scratch buffers for [`reduce_logits`], reusable across calls.
#[derive(Clone, Debug, Default)]
pub struct ReduceScratch {
    keep: Vec<bool>,
    probs: Vec<f64>,
    noise: Vec<f32>,
    order: Vec<u32>,
    top_ids: Vec<TokenId>,
    top_probs: Vec<f32>,
}

/// The host reference reduction of one position's logits to its statistics.
///
/// `logits` has one entry per vocabulary id; `position` is the absolute sequence position
/// (it selects the noise row `G[position, ·]`). The mask token never wins: its logit is
/// treated as `-inf`. Softmax and entropy accumulate in f64; the noised score
/// `logit / T + G` is formed in f32. Ties between tokens go to the lower id.
///
/// ```
/// use spot_core::stats::{reduce_logits, BlockStats, ReduceScratch, StatsQuery};
/// let logits = [0.0f32, 2.0, 1.0, 5.0]; // id 3 is the mask
/// let mut out = BlockStats::new(2);
/// let q = StatsQuery { top_k: 2, ..StatsQuery::new(0.0, 0) };
/// reduce_logits(&logits, 10, &q, 3, &mut ReduceScratch::default(), &mut out).unwrap();
/// assert_eq!(out.token(0), 1);
/// assert_eq!(out.top(0).0, &[1, 2]);
/// ```
pub fn reduce_logits(
    logits: &[f32],
    position: usize,
    query: &StatsQuery,
    mask_id: TokenId,
    scratch: &mut ReduceScratch,
    out: &mut BlockStats,
) -> Result<()> {
    let vocab = logits.len();
    let nonfinite = |reason| Error::NonFiniteLogits { position, reason };
    if logits.iter().any(|l| l.is_nan()) {
        return Err(nonfinite("NaN logit"));
    }
    // Top-k truncation: only the `k` largest finite logits (ties to the lower id) stay.
    scratch.keep.clear();
    if let Some(k) = query.sample_top_k {
        scratch.order.clear();
        scratch
            .order
            .extend((0..vocab as u32).filter(|&v| v != mask_id && logits[v as usize].is_finite()));
        if k < scratch.order.len() {
            let by_logit = |a: &u32, b: &u32| {
                logits[*b as usize]
                    .total_cmp(&logits[*a as usize])
                    .then(a.cmp(b))
            };
            scratch.order.select_nth_unstable_by(k - 1, by_logit);
            scratch.keep.resize(vocab, false);
            for &v in &scratch.order[..k] {
                scratch.keep[v as usize] = true;
            }
        }
    }
    let keep = &scratch.keep;
    let usable =
        |v: usize| v as TokenId != mask_id && logits[v].is_finite() && (keep.is_empty() || keep[v]);
    let t = query.temperature;
    let tempered = |v: usize| if t > 0.0 { logits[v] / t } else { logits[v] };

    // 1. The chosen token: argmax of the (noised) tempered logits.
    if t > 0.0 {
        scratch.noise.resize(vocab, 0.0);
        query.noise.fill_row(position as u64, &mut scratch.noise);
    }
    let mut chosen: Option<(usize, f32)> = None;
    for v in (0..vocab).filter(|&v| usable(v)) {
        let score = if t > 0.0 {
            logits[v] / t + scratch.noise[v]
        } else {
            logits[v]
        };
        if chosen.is_none_or(|(_, best)| score > best) {
            chosen = Some((v, score));
        }
    }
    let Some((chosen, _)) = chosen else {
        return Err(nonfinite("no finite logit outside the mask token"));
    };

    // 2. The tempered distribution (mask excluded) and its entropy.
    let softmax = |scale: &dyn Fn(usize) -> f32, probs: &mut Vec<f64>| {
        let max = (0..vocab)
            .filter(|&v| usable(v))
            .map(|v| f64::from(scale(v)))
            .fold(f64::NEG_INFINITY, f64::max);
        probs.clear();
        probs.extend((0..vocab).map(|v| {
            if usable(v) {
                (f64::from(scale(v)) - max).exp()
            } else {
                0.0
            }
        }));
        let z: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= z);
    };
    softmax(&tempered, &mut scratch.probs);
    let probs = &scratch.probs;
    let entropy: f64 = probs
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| -p * p.ln())
        .sum();
    let token_prob = probs[chosen];

    // 3. Top-k of the tempered distribution, descending, ties to the lower id.
    let k = query.effective_top_k(vocab);
    scratch.order.clear();
    scratch.order.extend(
        (0..vocab as u32).filter(|&v| v != mask_id && (keep.is_empty() || keep[v as usize])),
    );
    let cmp = |a: &u32, b: &u32| {
        probs[*b as usize]
            .total_cmp(&probs[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(scratch.order.len());
    if k < scratch.order.len() {
        scratch.order.select_nth_unstable_by(k - 1, cmp);
    }
    scratch.order[..k].sort_unstable_by(cmp);
    scratch.top_ids.clear();
    scratch.top_probs.clear();
    let mut top_mass = 0.0f64;
    for &v in &scratch.order[..k] {
        scratch.top_ids.push(v);
        scratch.top_probs.push(probs[v as usize] as f32);
        top_mass += probs[v as usize];
    }
    // Pad when the vocabulary is smaller than the requested k.
    while scratch.top_ids.len() < out.top_k() {
        scratch.top_ids.push(scratch.top_ids[0]);
        scratch.top_probs.push(0.0);
    }
    scratch.top_ids.truncate(out.top_k());
    scratch.top_probs.truncate(out.top_k());

    // 4. The confidence under the selected rule.
    let raw = if query.rule.reads_raw_probability(t) {
        let mut raw = std::mem::take(&mut scratch.probs);
        softmax(&|v| logits[v], &mut raw);
        let c = raw[chosen];
        scratch.probs = raw;
        Some(c)
    } else {
        None
    };
    let confidence = query
        .rule
        .confidence(token_prob, raw, &scratch.top_probs, entropy);
    out.push(PositionStats {
        token: chosen as TokenId,
        confidence: confidence as f32,
        token_prob: token_prob as f32,
        entropy: entropy as f32,
        tail_mass: (1.0 - top_mass).clamp(0.0, 1.0) as f32,
        top_ids: &scratch.top_ids,
        top_probs: &scratch.top_probs,
    })
}
