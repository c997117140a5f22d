//! What every loaded model carries besides its network: the folder, tokenizer, mask and stop
//! ids, the mask's logit bias, the Gumbel rows of the current block, and request checks.

use std::path::{Path, PathBuf};

use burn_tensor::backend::Backend;
use burn_tensor::{Tensor, TensorData};
use spot_core::{BlockState, BlockStats, StatsQuery, TokenId};

use crate::error::{ModelError, Result};
use crate::hf::{Tokenizer, generation_stop_ids, token_ids};
use crate::reduce::{noise_rows, reduce};

/// Folder-level facts and per-request state shared by the model wrappers.
pub(crate) struct Frame<B: Backend> {
    pub dir: PathBuf,
    pub tokenizer: Option<Tokenizer>,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub mask_id: Option<TokenId>,
    pub stop_ids: Vec<TokenId>,
    pub device: B::Device,
    /// `[1, vocab]`: 0, and `-inf` at the mask id (block-diffusion models never predict it).
    mask_bias: Option<Tensor<B, 2>>,
    /// (seed, first position, rows) and the Gumbel rows uploaded for them.
    noise: Option<(u64, usize, usize, Tensor<B, 2>)>,
}

/// How a family names its mask token.
pub(crate) struct MaskSpec<'a> {
    /// `mask_token_id` from `config.json`, if the family writes it there.
    pub configured: Option<u32>,
    /// Token strings to look up in `tokenizer.json` otherwise.
    pub tokens: &'a [&'a str],
}

/// What a family's config says about the folder-level facts.
pub(crate) trait FolderFacts {
    /// Rows of the embedding and head.
    fn vocab(&self) -> usize;
    /// Context limit.
    fn max_positions(&self) -> usize;
    /// `mask_token_id` as written in `config.json`.
    fn mask_token_id(&self) -> Option<u32>;
    /// `eos_token_id` as written in `config.json`.
    fn eos(&self) -> Option<&serde_json::Value>;
}

/// Opens a folder's frame and weights. `mask_tokens`: the tokenizer strings of the mask token
/// for block-diffusion families (`None` for autoregressive ones).
pub(crate) fn open<B: Backend>(
    dir: &Path,
    cfg: &impl FolderFacts,
    mask_tokens: Option<&[&str]>,
    device: &B::Device,
) -> Result<(Frame<B>, crate::hf::Weights)> {
    let files = FolderFiles::read(dir, cfg, mask_tokens)?;
    let frame = Frame::new(dir, cfg.vocab(), cfg.max_positions(), files, device);
    Ok((frame, crate::hf::Weights::open(dir)?))
}

/// What a folder's small files say besides `config.json`, read without a device.
pub(crate) struct FolderFiles {
    /// `tokenizer.json`, when present.
    pub tokenizer: Option<Tokenizer>,
    /// The mask id (block-diffusion families).
    pub mask_id: Option<TokenId>,
    /// Stop ids.
    pub stop_ids: Vec<TokenId>,
}

impl FolderFiles {
    /// Reads `tokenizer.json` (optional) and `generation_config.json` (optional; `eos` from
    /// `config.json` is the fallback), and resolves the mask id when `mask_tokens` is given
    /// (block-diffusion families).
    pub fn read(dir: &Path, cfg: &impl FolderFacts, mask_tokens: Option<&[&str]>) -> Result<Self> {
        let tokenizer = if dir.join("tokenizer.json").exists() {
            Some(Tokenizer::open(dir)?)
        } else {
            None
        };
        let config = dir.join("config.json");
        let mask_id = match mask_tokens {
            None => None,
            Some(tokens) => Some(resolve_mask(
                &config,
                &MaskSpec {
                    configured: cfg.mask_token_id(),
                    tokens,
                },
                tokenizer.as_ref(),
                cfg.vocab(),
            )?),
        };
        let mut stop_ids = generation_stop_ids(dir)?;
        if stop_ids.is_empty() {
            stop_ids = token_ids(cfg.eos());
        }
        Ok(Self {
            tokenizer,
            mask_id,
            stop_ids,
        })
    }
}

/// The accessors every model wrapper has: `config`, `tokenizer`, `dir`, `parameter_count`
/// (the wrapper holds `cfg`, `frame` and `net`).
macro_rules! folder_accessors {
    ($config:ty) => {
        /// The parsed `config.json`.
        pub fn config(&self) -> &$config {
            &self.cfg
        }

        /// The tokenizer, when the folder has one.
        pub fn tokenizer(&self) -> Option<&crate::hf::Tokenizer> {
            self.frame.tokenizer.as_ref()
        }

        /// The folder the model was loaded from.
        pub fn dir(&self) -> &std::path::Path {
            &self.frame.dir
        }

        /// Number of parameters the weights hold (a tied head counted once).
        pub fn parameter_count(&self) -> usize {
            self.net.parameters()
        }
    };
}
pub(crate) use folder_accessors;

impl<B: Backend> Frame<B> {
    /// The frame of a folder whose files were read: uploads the mask's logit bias.
    pub fn new(
        dir: &Path,
        vocab_size: usize,
        max_positions: usize,
        files: FolderFiles,
        device: &B::Device,
    ) -> Self {
        let FolderFiles {
            tokenizer,
            mask_id,
            stop_ids,
        } = files;
        let mask_bias = mask_id.map(|m| {
            let mut bias = vec![0.0f32; vocab_size];
            bias[m as usize] = f32::NEG_INFINITY;
            Tensor::from_data(TensorData::new(bias, [1, vocab_size]), device)
        });
        Self {
            dir: dir.to_path_buf(),
            tokenizer,
            vocab_size,
            max_positions,
            mask_id,
            stop_ids,
            device: device.clone(),
            mask_bias,
            noise: None,
        }
    }

    /// Starts a new request: forgets the Gumbel rows and checks the block size.
    pub fn begin(&mut self, block_size: usize) -> spot_core::Result<()> {
        self.noise = None;
        if block_size == 0 {
            return Err(spot_core::Error::config(
                "block_size",
                "must be at least 1, got 0",
            ));
        }
        Ok(())
    }

    /// Forgets the Gumbel rows (a new request).
    pub fn reset_noise(&mut self) {
        self.noise = None;
    }

    /// Checks token ids and appends them to `out`.
    pub fn push_ids(&self, tokens: &[TokenId], out: &mut Vec<i64>) -> Result<()> {
        for &t in tokens {
            if t as usize >= self.vocab_size {
                return Err(ModelError::Request(format!(
                    "token id {t} is outside the vocabulary of {}",
                    self.vocab_size
                )));
            }
            out.push(i64::from(t));
        }
        Ok(())
    }

    /// Fails when positions up to `end` do not fit the context.
    pub fn check_end(&self, end: usize, what: &str) -> Result<()> {
        if end > self.max_positions {
            return Err(ModelError::Request(format!(
                "{what} ends at position {end}, past max_position_embeddings {}",
                self.max_positions
            )));
        }
        Ok(())
    }

    /// Checks a batch of equally long states after a prefix of `prefix_len` positions and
    /// returns their ids, count and length.
    pub fn check_states(
        &self,
        states: &[BlockState],
        prefix_len: usize,
    ) -> Result<(Vec<i64>, usize, usize)> {
        let len = states.first().map_or(0, BlockState::len);
        self.check_end(prefix_len + len, "block")?;
        let mut ids = Vec::with_capacity(states.len() * len);
        for s in states {
            if s.len() != len {
                return Err(ModelError::Request(
                    "block states of different lengths".to_string(),
                ));
            }
            self.push_ids(s.tokens(), &mut ids)?;
        }
        Ok((ids, states.len(), len))
    }

    /// Reduces logits `[n * len, vocab]` of `n` states whose first position is `start` to
    /// their statistics, with the Gumbel rows of positions `start..start + len` at `T > 0`
    /// (uploaded once per block and reused by every forward on it).
    pub fn reduce(
        &mut self,
        logits: Tensor<B, 2>,
        n: usize,
        len: usize,
        start: usize,
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        let noise = if query.temperature > 0.0 {
            let seed = query.noise.seed();
            let fresh = !matches!(&self.noise, Some((s, a, l, _)) if *s == seed && *a == start && *l == len);
            if fresh {
                let rows = noise_rows::<B>(query, start, len, self.vocab_size, &self.device);
                self.noise = Some((seed, start, len, rows));
            }
            self.noise.as_ref().map(|(_, _, _, t)| t.clone())
        } else {
            None
        };
        reduce(
            logits,
            n,
            len,
            query,
            self.mask_bias.as_ref(),
            noise.as_ref(),
        )
    }
}

fn resolve_mask(
    config: &Path,
    spec: &MaskSpec<'_>,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<u32> {
    let bad = |reason: String| ModelError::InvalidConfig {
        path: config.to_path_buf(),
        field: "mask_token_id",
        reason,
    };
    let id = match (spec.configured, tokenizer) {
        (Some(id), _) => id,
        (None, Some(t)) => spec
            .tokens
            .iter()
            .find_map(|s| t.token_id(s))
            .ok_or_else(|| {
                bad(format!(
                    "absent, and tokenizer.json has none of the tokens {:?}",
                    spec.tokens
                ))
            })?,
        (None, None) => {
            return Err(bad(format!(
                "absent, and there is no tokenizer.json to resolve {:?}",
                spec.tokens
            )));
        }
    };
    if id as usize >= vocab_size {
        return Err(bad(format!(
            "{id} is outside the vocabulary of {vocab_size}"
        )));
    }
    Ok(id)
}
