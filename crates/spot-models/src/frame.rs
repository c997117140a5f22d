//! What every loaded model carries besides its network: the folder, tokenizer, mask and stop
//! ids, the mask's logit bias, the Gumbel rows of the current block, and request checks.

use std::path::{Path, PathBuf};

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use spot_core::{BlockState, BlockStats, StatsQuery, TokenId};

use crate::attention::Kv;
use crate::head::{Head, MaskTerms, NoiseRows, mask_bias};
use crate::values::host_values;
use spot_hf::hf::{Tokenizer, generation_stop_ids, token_ids};
use spot_hf::{ModelError, Result};
use spot_reduce::RowPlan;
use spot_reduce::noise_table;

/// Folder-level facts and per-request state shared by the model wrappers.
pub(crate) struct Frame<B: Backend> {
    pub dir: PathBuf,
    pub tokenizer: Option<Tokenizer>,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub mask_id: Option<TokenId>,
    pub stop_ids: Vec<TokenId>,
    /// The block size `config.json` declares, if any.
    pub block_size: Option<usize>,
    pub device: B::Device,
    /// `[1, vocab]`: 0, and `-inf` at the mask id (block-diffusion models never predict it).
    mask_bias: Option<Tensor<B, 2>>,
}

/// One request's Gumbel rows of its current block, and of the block before the last switch
/// (each request keeps its own, so merged forwards of several requests do not evict each
/// other's; two entries, so a forward that also scores the next block's look-ahead does not
/// evict the current block's rows).
pub(crate) struct NoiseCache<B: Backend>(Option<Noise<B>>, Option<Noise<B>>);

impl<B: Backend> Default for NoiseCache<B> {
    fn default() -> Self {
        Self(None, None)
    }
}

impl<B: Backend> NoiseCache<B> {
    /// Forgets the rows (a new request).
    pub fn clear(&mut self) {
        (self.0, self.1) = (None, None);
    }

    /// Bytes of the rows held (host and device copies).
    pub fn bytes(&self) -> u64 {
        [&self.0, &self.1]
            .into_iter()
            .flatten()
            .map(|n| {
                let device = n.device.as_ref().map_or(0, crate::attention::tensor_bytes);
                (n.host.len() * size_of::<f32>()) as u64 + device
            })
            .sum()
    }
}

/// One request's cache: its committed tokens, their keys and values, and the Gumbel rows of
/// its current block (the block-causal families' and the causal model's slot).
pub(crate) struct PrefixSlot<B: Backend> {
    pub cache: Vec<Kv<B>>,
    pub prefix: Vec<TokenId>,
    pub noise: NoiseCache<B>,
}

impl<B: Backend> Default for PrefixSlot<B> {
    fn default() -> Self {
        Self {
            cache: Vec::new(),
            prefix: Vec::new(),
            noise: NoiseCache::default(),
        }
    }
}

/// Bytes one request's cache holds: keys and values, Gumbel rows and prefix ids.
pub(crate) fn slot_bytes<B: Backend>(
    cache: &[crate::attention::Kv<B>],
    noise: &NoiseCache<B>,
    prefix: &[TokenId],
) -> u64 {
    crate::attention::Kv::bytes(cache) + noise.bytes() + size_of_val(prefix) as u64
}

/// `cache_usage` of a `BlockDiffusionModel` whose `slots` hold `cache`, `noise` and `prefix`
/// (the families' slot types).
macro_rules! cache_usage {
    () => {
        fn cache_usage(&self) -> spot_core::CacheUsage {
            spot_core::CacheUsage {
                slots: self.slots.open_count(),
                bytes: self
                    .slots
                    .iter()
                    .map(|s| $crate::frame::slot_bytes(&s.cache, &s.noise, &s.prefix))
                    .sum(),
            }
        }
    };
}
pub(crate) use cache_usage;

/// The Gumbel rows `[len, vocab]` of positions `first..first + len` under one seed, made once
/// per block and reused by every forward on it (uploaded when a device reduction reads them).
struct Noise<B: Backend> {
    seed: u64,
    first: usize,
    len: usize,
    host: Vec<f32>,
    device: Option<Tensor<B, 2>>,
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
    /// `block_size` as written in `config.json` (block-diffusion families that declare it).
    fn block_size(&self) -> Option<usize> {
        None
    }
}

/// Opens a folder's frame and weights. `mask_tokens`: the tokenizer strings of the mask token
/// for block-diffusion families (`None` for autoregressive ones).
pub(crate) fn open<B: Backend>(
    dir: &Path,
    cfg: &impl FolderFacts,
    mask_tokens: Option<&[&str]>,
    device: &B::Device,
) -> Result<(Frame<B>, spot_hf::hf::Weights)> {
    let files = FolderFiles::read(dir, cfg, mask_tokens)?;
    let mut frame = Frame::new(dir, cfg.vocab(), cfg.max_positions(), files, device);
    frame.block_size = cfg.block_size();
    Ok((frame, spot_hf::hf::Weights::open(dir)?))
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
        pub fn tokenizer(&self) -> Option<&spot_hf::hf::Tokenizer> {
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

        /// Moves the output layer and the reduction to `placement` (loading places them by
        /// [`crate::HeadPlacement::Auto`]). Statistics stay batch invariant; the two
        /// placements agree within float rounding, not bit for bit.
        pub fn set_head_placement(&mut self, placement: crate::HeadPlacement) {
            self.net.place_head(placement);
        }

        /// The precision the weights and activations are held in (never `Auto`).
        pub fn precision(&self) -> crate::Precision {
            crate::Precision::of_dtype(self.net.dtype)
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
        let mask_bias = mask_id.map(|m| mask_bias(m, vocab_size, device));
        Self {
            dir: dir.to_path_buf(),
            tokenizer,
            vocab_size,
            max_positions,
            mask_id,
            stop_ids,
            block_size: None,
            device: device.clone(),
            mask_bias,
        }
    }

    /// Checks the block size of a new request.
    pub fn begin(&self, block_size: usize) -> spot_core::Result<()> {
        if block_size == 0 {
            return Err(spot_core::Error::config(
                "block_size",
                "must be at least 1, got 0",
            ));
        }
        Ok(())
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

    /// The statistics of the rows `plan` names of final hidden states `[n * len, dim]` of `n`
    /// states whose first row predicts position `first`, through `head`; Gumbel rows for
    /// positions `first..first + len` at `T > 0`, kept in the request's `noise`.
    pub fn stats(
        &self,
        head: &Head<B>,
        hidden: Tensor<B, 2>,
        plan: &RowPlan,
        (first, noise): (usize, &mut NoiseCache<B>),
        query: &StatsQuery,
    ) -> Result<Vec<BlockStats>> {
        let k = query.effective_top_k(self.vocab_size);
        let len = plan.len.max(1);
        let noisy = query.temperature > 0.0;
        if noisy {
            let seed = query.noise.seed();
            let hit = |n: &Option<Noise<B>>| matches!(n, Some(n) if n.seed == seed && n.first == first && n.len == len);
            if !hit(&noise.0) {
                if hit(&noise.1) {
                    std::mem::swap(&mut noise.0, &mut noise.1);
                } else {
                    noise.1 = noise.0.take();
                    noise.0 = Some(Noise {
                        seed,
                        first,
                        len,
                        host: noise_table(query, first, len, self.vocab_size),
                        device: None,
                    });
                }
            }
        }
        let positions = plan.positions(first);
        // The final hidden states on the host: the host head reads them, and a query asking
        // for hidden states gets every row of every state.
        let host_hidden = (query.hidden_states
            || (matches!(head, Head::Host(_)) && !plan.rows.is_empty()))
        .then(|| host_values(hidden.clone()));
        let jobs = plan.jobs();
        let noise = noise.0.as_mut().filter(|_| noisy).map(|n| NoiseRows {
            host: &n.host,
            device: &mut n.device,
        });
        let mask = MaskTerms {
            id: self.mask_id,
            bias: self.mask_bias.as_ref(),
        };
        let rows = head.reduce_rows(
            || hidden,
            host_hidden.as_deref(),
            &jobs,
            &positions,
            query,
            mask,
            noise,
        )?;
        let mut stats = plan.assemble(k, query.rule, rows)?;
        if let Some(values) = host_hidden.filter(|_| query.hidden_states) {
            attach_hidden(&mut stats, &values, plan.len)?;
        }
        Ok(stats)
    }
}

/// Attaches to each state's statistics its rows of the final hidden states (`values`,
/// `[states * len, dim]` row-major), every position of the state.
fn attach_hidden(stats: &mut [BlockStats], values: &[f32], len: usize) -> Result<()> {
    let rows = stats.len() * len;
    if rows == 0 {
        return Ok(());
    }
    let dim = values.len() / rows;
    for (st, chunk) in stats.iter_mut().zip(values.chunks_exact(len * dim)) {
        st.set_hidden(dim, chunk.to_vec())?;
    }
    Ok(())
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
