//! Which rows a forward reduces, the Gumbel rows they read, and the statistics of whole states
//! assembled from the reduced rows.

use spot_core::{
    BlockState, BlockStats, ConfidenceRule, Error, PositionStats, Result, StatsQuery, TokenId,
};

use crate::host_head::{HostHead, RowJob, RowStats};

/// The Gumbel rows `G[first + s, v]` of `len` positions, `[len, vocab]` row-major: what a
/// reduction at `T > 0` adds to the tempered logits of those positions (a pure function of the
/// query's seed, the absolute position and the token).
pub fn noise_table(query: &StatsQuery, first: usize, len: usize, vocab: usize) -> Vec<f32> {
    let mut rows = vec![0.0f32; len * vocab];
    for (s, row) in rows.chunks_mut(vocab).enumerate() {
        query.noise.fill_row((first + s) as u64, row);
    }
    rows
}

/// Which rows of a forward over `n` states of `len` positions are reduced: the masked
/// positions of block states (decoders read no other), or every row.
pub struct RowPlan {
    /// States (or sequences).
    pub n: usize,
    /// Positions per state.
    pub len: usize,
    /// Reduced rows (`state * len + position`), ascending.
    pub rows: Vec<usize>,
    /// The token at every row (the statistics of a row that is not reduced name it).
    tokens: Vec<TokenId>,
}

impl RowPlan {
    /// The masked positions of `states` (all of length `len`).
    pub fn masked(states: &[BlockState], len: usize) -> Self {
        let tokens: Vec<TokenId> = states.iter().flat_map(|s| s.tokens()).copied().collect();
        let rows = states
            .iter()
            .enumerate()
            .flat_map(|(b, s)| s.masked_positions().map(move |p| b * len + p))
            .collect();
        Self {
            n: states.len(),
            len,
            rows,
            tokens,
        }
    }

    /// One job per reduced row: its row of the hidden states, and its position within its
    /// state as its row of the Gumbel table (the table holds one row per position of a state).
    pub fn jobs(&self) -> Vec<RowJob> {
        let len = self.len.max(1);
        self.rows
            .iter()
            .map(|&r| RowJob {
                hidden: r,
                noise: r % len,
            })
            .collect()
    }

    /// The absolute positions of the reduced rows when every state's first position is
    /// `first` (errors name them).
    pub fn positions(&self, first: usize) -> Vec<usize> {
        let len = self.len.max(1);
        self.rows.iter().map(|r| first + r % len).collect()
    }

    /// Every row of one sequence of `len` positions.
    pub fn all(len: usize) -> Self {
        Self::all_of(1, len)
    }

    /// Every row of `n` sequences of `len` positions each.
    pub fn all_of(n: usize, len: usize) -> Self {
        Self {
            n,
            len,
            rows: (0..n * len).collect(),
            tokens: vec![0; n * len],
        }
    }

    /// One [`BlockStats`] per state from the reduced rows' statistics (in `rows` order). A row
    /// that was not reduced holds its own token with probability 1 and entropy 0.
    pub fn assemble(
        &self,
        k: usize,
        rule: ConfidenceRule,
        reduced: Vec<RowStats>,
    ) -> Result<Vec<BlockStats>> {
        let mut reduced = reduced.into_iter();
        let mut next = self.rows.iter().peekable();
        let mut out = Vec::with_capacity(self.n);
        let mut one_ids = vec![0; k];
        let mut one_probs = vec![0.0f32; k];
        if let Some(p) = one_probs.first_mut() {
            *p = 1.0;
        }
        for b in 0..self.n {
            let mut st = BlockStats::new(k);
            for s in 0..self.len {
                let r = b * self.len + s;
                if next.next_if(|&&x| x == r).is_some()
                    && let Some(row) = reduced.next()
                {
                    let top_mass: f64 = row.top_probs.iter().map(|&p| f64::from(p)).sum();
                    st.push(PositionStats {
                        token: row.token,
                        confidence: row.confidence(rule) as f32,
                        token_prob: row.token_prob as f32,
                        entropy: row.entropy as f32,
                        tail_mass: (1.0 - top_mass).clamp(0.0, 1.0) as f32,
                        top_ids: &row.top_ids,
                        top_probs: &row.top_probs,
                    })?;
                } else {
                    let token = self.tokens[r];
                    one_ids.fill(token);
                    st.push(PositionStats {
                        token,
                        confidence: 1.0,
                        token_prob: 1.0,
                        entropy: 0.0,
                        tail_mass: 0.0,
                        top_ids: &one_ids,
                        top_probs: &one_probs,
                    })?;
                }
            }
            out.push(st);
        }
        Ok(out)
    }
}

impl HostHead {
    /// The statistics of `states` (all of one length `len`) from their final hidden states
    /// `hidden`, `[states * len, dim]` row-major (row `b * len + s` is position `s` of state
    /// `b`), the block's first position at absolute position `start`: what a model's forward
    /// returns for them, computed as the shipped families' host path computes it. The masked
    /// positions are reduced (each with its Gumbel row at `T > 0`, so a state's statistics do
    /// not depend on the batch); a committed position carries its own token with probability
    /// 1. `mask` never wins. Only the masked rows are computed.
    pub fn reduce_states(
        &self,
        hidden: &[f32],
        states: &[BlockState],
        start: usize,
        query: &StatsQuery,
        mask: TokenId,
    ) -> Result<Vec<BlockStats>> {
        query.validate()?;
        let len = states.first().map_or(0, BlockState::len);
        if let Some(bad) = states.iter().find(|s| s.len() != len) {
            return Err(Error::ShapeMismatch {
                what: "block states in one batch",
                expected: len,
                actual: bad.len(),
            });
        }
        if hidden.len() != states.len() * len * self.dim() {
            return Err(Error::ShapeMismatch {
                what: "hidden states (states x positions x dim)",
                expected: states.len() * len * self.dim(),
                actual: hidden.len(),
            });
        }
        let plan = RowPlan::masked(states, len);
        let jobs = plan.jobs();
        let rows = match jobs.is_empty() {
            true => Vec::new(),
            false => {
                let positions = plan.positions(start);
                let noise =
                    (query.temperature > 0.0).then(|| noise_table(query, start, len, self.vocab()));
                self.reduce(
                    hidden,
                    &jobs,
                    query,
                    Some(mask),
                    noise.as_deref(),
                    &positions,
                )?
            }
        };
        plan.assemble(query.effective_top_k(self.vocab()), query.rule, rows)
    }
}
