//! Autoregressive targets (the SpecDiff-2 setting): a causal model with a KV cache that can
//! append several tokens in one forward and roll back, and the plain token-by-token decoder
//! that is its ground truth.
//!
//! Sampling uses the same coupled noise as block diffusion: the token at absolute position `p`
//! is `argmax_v(logits_v / T + G[p, v])` ([`crate::GumbelNoise`]), argmax at `T = 0`, so a
//! speculative decoder that verifies drafted tokens against these statistics reproduces the
//! plain decoder exactly.
//!
//! ```
//! use spot_core::autoregressive::{decode_autoregressive, ArConfig, CountingModel};
//!
//! // A toy causal model whose next token is (last + 1) mod 10.
//! let mut model = CountingModel::new(10);
//! let out = decode_autoregressive(&mut model, &[3], &ArConfig { max_new_tokens: 4, ..ArConfig::default() })?;
//! assert_eq!(out.tokens, vec![4, 5, 6, 7]);
//! assert_eq!(out.forwards, 4);
//! # Ok::<(), spot_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::state::TokenId;
use crate::stats::{BlockStats, PositionStats, StatsQuery};

/// Static facts of an autoregressive model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArInfo {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context limit (positions).
    pub max_positions: usize,
    /// Stop ids from the model folder.
    pub stop_ids: Vec<TokenId>,
}

/// A causal language model with a KV cache over the tokens it has seen.
pub trait AutoregressiveModel {
    /// Static facts.
    fn ar_info(&self) -> &ArInfo;

    /// Tokens in the cache (the absolute position the next appended token takes).
    fn cached_len(&self) -> usize;

    /// Drops cached tokens after the first `len` (rolls back rejected drafts); `0` clears.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Appends `tokens` in one forward and returns, for each of them, the statistics of the
    /// next-token distribution after it: entry `i` predicts absolute position
    /// `cached_len_before + i + 1`, its chosen token uses the noise of that position.
    fn extend(&mut self, tokens: &[TokenId], query: &StatsQuery) -> Result<BlockStats>;

    /// Appends `shared` (kept in the cache, as [`extend`](Self::extend)) and scores every
    /// branch after it without keeping it: returns the statistics of `shared` (at least the
    /// entry of its last token, which predicts the branches' first position; a model may
    /// return that entry alone) and, per branch, those of its tokens (entry `i` predicts the
    /// position after the branch's token `i`).
    /// Each branch's statistics must be bit-identical to appending it alone. The default runs
    /// one [`extend`](Self::extend) per branch and rolls each back; a batched model scores
    /// them all in one forward.
    fn extend_branches(
        &mut self,
        shared: &[TokenId],
        branches: &[Vec<TokenId>],
        query: &StatsQuery,
    ) -> Result<(BlockStats, Vec<BlockStats>)> {
        extend_each(self, shared, branches, query)
    }
}

/// [`AutoregressiveModel::extend_branches`] one branch at a time: `shared` appended, then
/// each branch appended and rolled back.
pub fn extend_each<M: AutoregressiveModel + ?Sized>(
    model: &mut M,
    shared: &[TokenId],
    branches: &[Vec<TokenId>],
    query: &StatsQuery,
) -> Result<(BlockStats, Vec<BlockStats>)> {
    let stats = model.extend(shared, query)?;
    let base = model.cached_len();
    let mut out = Vec::with_capacity(branches.len());
    for b in branches {
        if b.is_empty() {
            out.push(BlockStats::new(query.top_k));
            continue;
        }
        out.push(model.extend(b, query)?);
        model.truncate(base)?;
    }
    Ok((stats, out))
}

/// Settings of [`decode_autoregressive`].
#[derive(Clone, Debug, PartialEq)]
pub struct ArConfig {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Noise seed.
    pub seed: u64,
    /// Stop ids (the model's when empty).
    pub stop_ids: Vec<TokenId>,
    /// Stop after the first stop id.
    pub early_stop: bool,
}

impl Default for ArConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            temperature: 0.0,
            seed: 0,
            stop_ids: Vec::new(),
            early_stop: true,
        }
    }
}

/// What [`decode_autoregressive`] produced.
#[derive(Clone, Debug, PartialEq)]
pub struct ArOutput {
    /// Generated ids, including the stop id that ended them.
    pub tokens: Vec<TokenId>,
    /// Whether a stop id ended the decode.
    pub stopped: bool,
    /// Model forwards (the prompt's prefill counts as one).
    pub forwards: u64,
}

/// Decodes token by token: one forward for the prompt, then one per generated token.
pub fn decode_autoregressive(
    model: &mut dyn AutoregressiveModel,
    prompt: &[TokenId],
    cfg: &ArConfig,
) -> Result<ArOutput> {
    let info = model.ar_info().clone();
    check_inputs(&info, prompt, cfg)?;
    let query = StatsQuery {
        top_k: 1,
        ..StatsQuery::new(cfg.temperature, cfg.seed)
    };
    query.validate()?;
    let stops = if cfg.stop_ids.is_empty() {
        &info.stop_ids
    } else {
        &cfg.stop_ids
    };
    model.truncate(0)?;
    let mut stats = model.extend(prompt, &query)?;
    let mut forwards = 1;
    let mut tokens = Vec::with_capacity(cfg.max_new_tokens);
    loop {
        check_stats(&stats, stats.len().max(1), info.vocab_size)?;
        let next = stats.token(stats.len() - 1);
        tokens.push(next);
        let stopped = cfg.early_stop && stops.contains(&next);
        if stopped || tokens.len() == cfg.max_new_tokens {
            return Ok(ArOutput {
                tokens,
                stopped,
                forwards,
            });
        }
        stats = model.extend(&[next], &query)?;
        forwards += 1;
    }
}

/// Checks a decode's inputs against the model: a non-empty prompt inside the vocabulary,
/// `max_new_tokens` at least 1, and prompt plus generation within the context limit.
pub fn check_inputs(info: &ArInfo, prompt: &[TokenId], cfg: &ArConfig) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if cfg.max_new_tokens == 0 {
        return Err(Error::config("max_new_tokens", "must be at least 1, got 0"));
    }
    if let Some((index, &token)) = prompt
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= info.vocab_size)
    {
        return Err(Error::InvalidPromptToken {
            index,
            token,
            reason: "outside the vocabulary",
        });
    }
    let needed = prompt.len() + cfg.max_new_tokens;
    if needed > info.max_positions {
        return Err(Error::SequenceTooLong {
            prompt_len: prompt.len(),
            max_new_tokens: cfg.max_new_tokens,
            needed,
            block_size: 1,
            max_positions: info.max_positions,
        });
    }
    StatsQuery::new(cfg.temperature, cfg.seed).validate()
}

/// Checks statistics an autoregressive model returned: at least `expected` entries (at
/// least one), every id inside `vocab`, finite probabilities.
pub fn check_stats(stats: &BlockStats, expected: usize, vocab: usize) -> Result<()> {
    if stats.is_empty() || stats.len() < expected {
        return Err(Error::ShapeMismatch {
            what: "statistics per appended token",
            expected: expected.max(1),
            actual: stats.len(),
        });
    }
    // No mask token in an autoregressive vocabulary: `vocab` is out of range for every id.
    stats.validate(stats.len(), vocab, vocab as TokenId)
}

/// A toy causal model for tests and examples: the next token is `(last + 1) mod vocab`,
/// with probability 0.9.
#[derive(Clone, Debug)]
pub struct CountingModel {
    info: ArInfo,
    seen: Vec<TokenId>,
}

impl CountingModel {
    /// A counting model over `vocab` tokens (at least 2).
    pub fn new(vocab: usize) -> Self {
        Self {
            info: ArInfo {
                vocab_size: vocab.max(2),
                max_positions: 4096,
                stop_ids: Vec::new(),
            },
            seen: Vec::new(),
        }
    }
}

impl AutoregressiveModel for CountingModel {
    fn ar_info(&self) -> &ArInfo {
        &self.info
    }

    fn cached_len(&self) -> usize {
        self.seen.len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.seen.truncate(len);
        Ok(())
    }

    fn extend(&mut self, tokens: &[TokenId], _query: &StatsQuery) -> Result<BlockStats> {
        let v = self.info.vocab_size as TokenId;
        let mut out = BlockStats::new(1);
        for &t in tokens {
            self.seen.push(t);
            let next = (t + 1) % v;
            out.push(PositionStats {
                token: next,
                confidence: 0.9,
                token_prob: 0.9,
                entropy: 0.5,
                tail_mass: 0.1,
                top_ids: &[next],
                top_probs: &[0.9],
            })?;
        }
        Ok(out)
    }
}
