//! The drafter side: a masked-diffusion model's per-position marginals over the next `γ`
//! tokens, and the `K` drafts sampled from them.

use spot_core::state::mix64;
use spot_core::{Error, GumbelNoise, Result, TokenId};

use crate::config::SpecDiffConfig;

/// Per-position marginals of one denoising step: for each of the `γ` drafted positions, its
/// most probable tokens and their probabilities (most probable first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Marginals {
    top_k: usize,
    ids: Vec<TokenId>,
    probs: Vec<f32>,
}

impl Marginals {
    /// Empty marginals that will hold `top_k` candidates per position (at least 1).
    pub fn new(top_k: usize) -> Self {
        Self {
            top_k: top_k.max(1),
            ids: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Candidates per position.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Drafted positions held.
    pub fn len(&self) -> usize {
        self.ids.len() / self.top_k
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Drops every position.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.probs.clear();
    }

    /// Appends one position: exactly `top_k` ids with finite, non-negative probabilities
    /// (most probable first; they need not sum to 1).
    pub fn push(&mut self, ids: &[TokenId], probs: &[f32]) -> Result<()> {
        if ids.len() != self.top_k || probs.len() != self.top_k {
            return Err(Error::ShapeMismatch {
                what: "drafter candidates per position",
                expected: self.top_k,
                actual: ids.len().min(probs.len()),
            });
        }
        if let Some(p) = probs.iter().find(|p| !(p.is_finite() && **p >= 0.0)) {
            return Err(Error::config(
                "drafter marginals",
                format!("probabilities must be finite and non-negative, got {p}"),
            ));
        }
        self.ids.extend_from_slice(ids);
        self.probs.extend_from_slice(probs);
        Ok(())
    }

    /// Position `i`'s candidates and probabilities.
    pub fn at(&self, i: usize) -> (&[TokenId], &[f32]) {
        let r = i * self.top_k..(i + 1) * self.top_k;
        (&self.ids[r.clone()], &self.probs[r])
    }
}

/// A masked-diffusion drafter: sees the accepted text followed by `γ` masks and fills in one
/// denoising step a distribution for every masked position.
pub trait DiffusionDrafter {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Vocabulary size (it shares the target's tokenizer).
    fn vocab_size(&self) -> usize;

    /// The marginals of up to `gamma` positions after `context` (cleared first): the first
    /// `out.len()` of them; none makes the round a plain forward.
    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()>;

    /// The sampling of the request the next [`propose`](Self::propose) calls draft for: the
    /// target's temperature and the coupled noise its token at each absolute position is
    /// decided by (`argmax_v(logit_v / T + G[p, v])`). A drafter may put first the candidate
    /// that noise favours, so that its draft follows the target's sample; the default ignores
    /// it. Drafts never change the output (verification is coupled), only the forwards.
    fn target_sampling(&mut self, temperature: f32, noise: GumbelNoise) {
        let _ = (temperature, noise);
    }

    /// The settings this drafter runs with when the caller names none (`spot generate
    /// --method specdiff` without `--k`, `--draft-tokens`, ...): the ones measured to pay
    /// for it. The default is [`SpecDiffConfig::default`].
    fn recommended(&self) -> SpecDiffConfig {
        SpecDiffConfig::default()
    }
}

impl<D: DiffusionDrafter + ?Sized> DiffusionDrafter for &mut D {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn propose(&mut self, context: &[TokenId], gamma: usize, out: &mut Marginals) -> Result<()> {
        (**self).propose(context, gamma, out)
    }
    fn target_sampling(&mut self, temperature: f32, noise: GumbelNoise) {
        (**self).target_sampling(temperature, noise)
    }
    fn recommended(&self) -> SpecDiffConfig {
        (**self).recommended()
    }
}

/// Samples `k` drafts from `m`: draft `0` takes every position's most probable candidate
/// when `greedy_first` (or the temperature is 0); the others sample each position
/// independently from its candidates tempered by `temperature` (`p^(1/T)`, renormalised).
/// The draws depend only on (`seed`, `position` of the first drafted token, draft index,
/// position), never on the target's noise.
pub fn sample_drafts(
    m: &Marginals,
    k: usize,
    temperature: f32,
    greedy_first: bool,
    (seed, position): (u64, usize),
    out: &mut Vec<Vec<TokenId>>,
) {
    out.clear();
    for d in 0..k {
        let greedy = temperature <= 0.0 || (greedy_first && d == 0);
        let draft = (0..m.len())
            .map(|i| {
                let (ids, probs) = m.at(i);
                if greedy {
                    return ids[0];
                }
                let key = seed ^ mix64((position + i) as u64 ^ mix64(d as u64 + 1));
                let u = unit(mix64(key));
                pick(ids, probs, temperature, u)
            })
            .collect();
        out.push(draft);
    }
}

/// A uniform draw in `[0, 1)` from the 53 high bits of a hash.
pub(crate) fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The candidate at uniform draw `u` of `probs^(1/T)` (the first when all are 0).
fn pick(ids: &[TokenId], probs: &[f32], t: f32, u: f64) -> TokenId {
    let q = draft_distribution(ids, probs, t, false);
    let mut acc = 0.0;
    for &(id, p) in &q {
        acc += p;
        if u < acc {
            return id;
        }
    }
    q[q.len() - 1].0
}

/// The distribution a drafted token is drawn from at one position with candidates `ids` and
/// probabilities `probs`, as [`sample_drafts`] draws it: the first candidate with probability
/// 1 when `greedy` (or when every probability is 0), otherwise `probs^(1/T)` renormalised
/// (one entry per candidate, in order; a repeated id appears more than once).
pub fn draft_distribution(
    ids: &[TokenId],
    probs: &[f32],
    t: f32,
    greedy: bool,
) -> Vec<(TokenId, f64)> {
    let w = |p: f32| f64::from(p).powf(1.0 / f64::from(t));
    let total: f64 = if greedy || t <= 0.0 {
        0.0
    } else {
        probs.iter().map(|&p| w(p)).sum()
    };
    if !(total > 0.0 && total.is_finite()) {
        return vec![(ids[0], 1.0)];
    }
    ids.iter()
        .zip(probs)
        .map(|(&id, &p)| (id, w(p) / total))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marginals_reject_bad_shapes_and_values() {
        let mut m = Marginals::new(2);
        assert!(m.push(&[1], &[1.0]).is_err());
        assert!(m.push(&[1, 2], &[f32::NAN, 0.0]).is_err());
        assert!(m.push(&[1, 2], &[-0.1, 0.0]).is_err());
        m.push(&[1, 2], &[0.7, 0.3]).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m.at(0), (&[1, 2][..], &[0.7, 0.3][..]));
    }

    #[test]
    fn sampling_follows_the_tempered_marginals() {
        let mut m = Marginals::new(2);
        for _ in 0..2000 {
            m.push(&[5, 9], &[0.75, 0.25]).unwrap();
        }
        let mut drafts = Vec::new();
        sample_drafts(&m, 3, 1.0, true, (7, 100), &mut drafts);
        assert!(drafts[0].iter().all(|&t| t == 5), "draft 0 is greedy");
        let share = drafts[1].iter().filter(|&&t| t == 9).count() as f64 / 2000.0;
        assert!((share - 0.25).abs() < 0.04, "{share}");
        assert_ne!(drafts[1], drafts[2], "drafts are independent");
        // T = 2 flattens: 0.25^0.5 / (0.75^0.5 + 0.25^0.5) = 0.366.
        sample_drafts(&m, 2, 2.0, false, (7, 100), &mut drafts);
        let share = drafts[0].iter().filter(|&&t| t == 9).count() as f64 / 2000.0;
        assert!((share - 0.366).abs() < 0.04, "{share}");
        // The same inputs give the same drafts.
        let mut again = Vec::new();
        sample_drafts(&m, 2, 2.0, false, (7, 100), &mut again);
        assert_eq!(drafts, again);
    }
}
