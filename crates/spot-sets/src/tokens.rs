//! The token head of the learned set drafter: which token the target will write at a masked
//! position of a hypothesised state, among the stale top-`k` candidates.
//!
//! The stale choice is often not the token the target writes once other positions are
//! committed: on the shipped target at `τ = 0.1`, `T = 0`, 40% of the tokens committed by the
//! step after a round's root are neither the stale choice nor its runner-up, and 59% of those
//! steps hold at least one such token, so no tree built from the stale top two can reach
//! them. The head re-ranks the stale candidates with what the stale statistics did not see:
//!
//! `z(v) = a · ln p~(v) + g · G(v) + r[rank(v)] + e(v) · (W_h h + Σ_d W_d e(w_d))`
//!
//! where `p~` is the stale (tempered) probability, `G` the coupled noise at the position
//! (0 at `T = 0`), `e` a learned token embedding (initialised from a random projection of the
//! target's output embeddings), `h` the position's stale hidden state and `w_d` the tokens
//! committed at offsets `d ∈ {−2, −1, +1, +2}` that the stale statistics did not see. With
//! `a = g = 1` and everything else 0 (the initialisation) the head is the stale noised
//! ranking; the probability that the target writes `v` is the softmax of `z` over the
//! candidates.

use serde::{Deserialize, Serialize};
use spot_core::{GumbelNoise, TokenId};

use spot_tree::TableError;
use spot_tree::rng::SplitMix;
use spot_tree::stale::StoredPosition;

/// Neighbour offsets whose newly committed tokens the head reads.
pub const NEAR: [isize; 4] = [-2, -1, 1, 2];

/// Shape of a [`TokenHead`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenHeadConfig {
    /// Vocabulary size of the target.
    pub vocab: usize,
    /// Embedding width.
    pub dim: usize,
    /// Candidates per position (the stale top-`k`).
    pub candidates: usize,
    /// Width of the target's hidden states.
    pub hidden_dim: usize,
}

impl TokenHeadConfig {
    /// `(name, shape)` of every parameter, in storage order.
    pub fn params(&self) -> Vec<(&'static str, [usize; 2])> {
        let (v, e) = (self.vocab, self.dim);
        vec![
            ("tok.emb", [v, e]),
            ("tok.hidden", [self.hidden_dim, e]),
            ("tok.near", [NEAR.len() * e, e]),
            ("tok.scale", [1, 2]),
            ("tok.rank", [1, self.candidates]),
        ]
    }

    /// Checks the widths against `max`.
    pub fn check(&self, max: usize) -> Result<(), TableError> {
        for (name, v, hi) in [
            ("vocab", self.vocab, 1 << 22),
            ("dim", self.dim, max),
            ("candidates", self.candidates, 256),
            ("hidden_dim", self.hidden_dim, max),
        ] {
            if v == 0 || v > hi {
                return Err(TableError::field(
                    format!("token_head.config.{name}"),
                    format!("must be in [1, {hi}], got {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// The token head's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenHead {
    /// The shape.
    pub cfg: TokenHeadConfig,
    /// Parameters in [`TokenHeadConfig::params`] order, row-major.
    pub params: Vec<Vec<f32>>,
}

/// What the head reads at one masked position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenInput {
    /// Candidate ids (the stale top-`k` without the mask; padded with the mask id).
    pub ids: Vec<TokenId>,
    /// `ln p~` of each candidate (padding: a large negative number).
    pub lnp: Vec<f32>,
    /// The coupled noise of each candidate at the position (0 at `T = 0`).
    pub noise: Vec<f32>,
    /// Tokens newly committed at the [`NEAR`] offsets ([`NO_TOKEN`]: none).
    pub near: [TokenId; 4],
}

/// No token (a [`TokenInput::near`] slot with nothing newly committed).
pub const NO_TOKEN: TokenId = TokenId::MAX;

/// The `ln p~` of a padded candidate.
const PAD_LNP: f32 = -1e4;

impl TokenInput {
    /// The input at position `s` with stale statistics `p`, `k` candidates, under `noise`
    /// at absolute position `position`; `near(t)` is the token newly committed at block
    /// position `t` (unseen by the stale statistics), if any.
    ///
    /// The candidates are the stale top-k ids (and the stale choice itself, with its
    /// confidence as its probability when the list lacks it) ranked by the target's noised
    /// score `ln p~(v) + G(v)`: by probability at `T = 0`, and at `T > 0` so that the stale
    /// noised choice and its runner-up come first.
    pub fn new(
        p: &StoredPosition,
        k: usize,
        noise: (Option<GumbelNoise>, u64),
        mask: TokenId,
        s: usize,
        near: &dyn Fn(usize) -> Option<TokenId>,
    ) -> Self {
        let mut x = Self::candidates(p, k, noise, mask);
        x.set_near(s, near);
        x
    }

    /// The input's candidates as [`TokenInput::new`] ranks them, with no neighbour
    /// ([`NO_TOKEN`] in every [`TokenInput::near`] slot): what a position's input holds
    /// whatever the state, so a round computes it once per position.
    pub fn candidates(
        p: &StoredPosition,
        k: usize,
        (noise, position): (Option<GumbelNoise>, u64),
        mask: TokenId,
    ) -> Self {
        let lnp = |pr: f32| if pr > 0.0 { pr.ln().max(-30.0) } else { -30.0 };
        let g = |id: TokenId| noise.map_or(0.0, |g| g.value(position, id));
        let mut cands: Vec<(TokenId, f32, f32)> = Vec::with_capacity(p.top_ids.len() + 1);
        for (&id, &pr) in p.top_ids.iter().zip(&p.top_probs) {
            if id != mask && !cands.iter().any(|c| c.0 == id) {
                cands.push((id, lnp(pr), g(id)));
            }
        }
        if p.token != mask && !cands.iter().any(|c| c.0 == p.token) {
            cands.push((p.token, lnp(p.confidence), g(p.token)));
        }
        // Stable: ties keep the probability order.
        cands.sort_by(|a, b| (b.1 + b.2).total_cmp(&(a.1 + a.2)));
        cands.truncate(k);
        let mut x = TokenInput {
            near: [NO_TOKEN; 4],
            ..TokenInput::default()
        };
        for (id, l, n) in cands {
            x.ids.push(id);
            x.lnp.push(l);
            x.noise.push(n);
        }
        while x.ids.len() < k {
            x.ids.push(mask);
            x.lnp.push(PAD_LNP);
            x.noise.push(0.0);
        }
        x
    }

    /// Sets [`TokenInput::near`] for position `s`: the token newly committed at each
    /// [`NEAR`] offset, `near(t)` at block position `t` ([`NO_TOKEN`]: none).
    pub fn set_near(&mut self, s: usize, near: &dyn Fn(usize) -> Option<TokenId>) {
        for (slot, d) in self.near.iter_mut().zip(NEAR) {
            *slot = s.checked_add_signed(d).and_then(near).unwrap_or(NO_TOKEN);
        }
    }
}

impl TokenHead {
    /// A head at its initialisation: the stale noised ranking (`a = g = 1`, the rest 0),
    /// embeddings from a random projection of `out_emb` (`[vocab, hidden]`, the target's
    /// output embeddings; `None`: a random table).
    pub fn init(cfg: TokenHeadConfig, out_emb: Option<&[f32]>, seed: u64) -> Self {
        let mut rng = SplitMix(seed ^ 0x70ce);
        let (v, e, h) = (cfg.vocab, cfg.dim, cfg.hidden_dim);
        let emb = match out_emb.filter(|w| w.len() == v * h) {
            Some(w) => {
                let proj: Vec<f32> = (0..h * e)
                    .map(|_| rng.normal() / (h as f32).sqrt())
                    .collect();
                let mut t = vec![0.0f32; v * e];
                for (row, out) in w.chunks_exact(h).zip(t.chunks_exact_mut(e)) {
                    for (&x, prow) in row.iter().zip(proj.chunks_exact(e)) {
                        for (o, &p) in out.iter_mut().zip(prow) {
                            *o += x * p;
                        }
                    }
                }
                t
            }
            None => (0..v * e).map(|_| rng.normal() * 0.1).collect(),
        };
        let params = vec![
            emb,
            vec![0.0; h * e],
            vec![0.0; NEAR.len() * e * e],
            vec![1.0, 1.0],
            vec![0.0; cfg.candidates],
        ];
        Self { cfg, params }
    }

    /// Checks the parameter lengths and values.
    pub fn check(&self, max: usize) -> Result<(), TableError> {
        self.cfg.check(max)?;
        TableError::check_params(&self.cfg.params(), &self.params)
    }

    fn emb(&self, id: TokenId) -> Option<&[f32]> {
        let e = self.cfg.dim;
        let i = id as usize;
        self.params[0].get(i * e..(i + 1) * e)
    }

    /// The probability of each candidate of `x` given the stale hidden state `hidden`
    /// (padding gets 0).
    pub fn probabilities(&self, x: &TokenInput, hidden: &[f32]) -> Vec<f32> {
        let mut c = Vec::new();
        self.hidden_context(hidden, &mut c);
        let mut out = Vec::new();
        self.probabilities_from(&mut c, x, &mut out);
        out
    }

    /// The part of the head's context that the hidden state gives (`dim` values into `c`):
    /// the same at a position whatever the state, so a round computes it once per position.
    pub(crate) fn hidden_context(&self, hidden: &[f32], c: &mut Vec<f32>) {
        let e = self.cfg.dim;
        c.clear();
        c.resize(e, 0.0);
        if hidden.len() == self.cfg.hidden_dim {
            for (&hv, row) in hidden.iter().zip(self.params[1].chunks_exact(e)) {
                for (o, &w) in c.iter_mut().zip(row) {
                    *o += hv * w;
                }
            }
        }
    }

    /// [`TokenHead::probabilities`] from the hidden state's context `c`
    /// ([`TokenHead::hidden_context`], which the neighbours are added to here) into `out`.
    pub(crate) fn probabilities_from(&self, c: &mut [f32], x: &TokenInput, out: &mut Vec<f32>) {
        let e = self.cfg.dim;
        for (d, &w) in x.near.iter().enumerate() {
            let Some(ew) = self.emb(w) else { continue };
            let block = &self.params[2][d * e * e..(d + 1) * e * e];
            for (&ev, row) in ew.iter().zip(block.chunks_exact(e)) {
                for (o, &wv) in c.iter_mut().zip(row) {
                    *o += ev * wv;
                }
            }
        }
        let (a, g) = (self.params[3][0], self.params[3][1]);
        out.clear();
        out.extend((0..x.ids.len()).map(|k| {
            let dot = self
                .emb(x.ids[k])
                .map_or(0.0, |ev| ev.iter().zip(&*c).map(|(p, q)| p * q).sum());
            a * x.lnp[k] + g * x.noise[k] + self.params[4].get(k).copied().unwrap_or(0.0) + dot
        }));
        let m = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (v, &l) in out.iter_mut().zip(&x.lnp) {
            *v = if l <= PAD_LNP { 0.0 } else { (*v - m).exp() };
        }
        let sum: f32 = out.iter().sum();
        for v in out.iter_mut() {
            *v = if sum > 0.0 { *v / sum } else { 0.0 };
        }
    }
}
