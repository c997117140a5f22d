//! Autoregressive Llama, Qwen2 and Qwen3 models with a KV cache: the targets of SpecDiff-2.
//!
//! Weight map: the standard HF names (`model.embed_tokens`, `model.layers.N.self_attn.{q,k,v,
//! o}_proj`, q/k/v `.bias` for Qwen2 (and Llama with `attention_bias`), `self_attn.{q,k}_norm`
//! for Qwen3, `model.layers.N.mlp.{gate,up,down}_proj`, `input_layernorm`,
//! `post_attention_layernorm`, `model.norm`, `lm_head` (absent when tied)).
//!
//! Attention is causal; [`AutoregressiveModel::extend`] appends several tokens in one forward
//! (prefill, or a drafted run to verify) and [`AutoregressiveModel::truncate`] rolls back.

use std::path::Path;

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use spot_core::{ArInfo, AutoregressiveModel, BlockStats, StatsQuery, TokenId};

use crate::attention::{Attend, Kv};
use crate::config::DecoderConfig;
use crate::dense::{QWEN_NAMES, dense_net};
use crate::frame::{Frame, open};
use crate::precision::Precision;
use crate::transformer::{Net, Segment};
use spot_hf::{ModelError, Result};
use spot_reduce::{Logits, RowPlan};

/// A causal language model (`model_type` `"llama"`, `"qwen2"` or `"qwen3"`) on backend `B`.
///
/// ```no_run
/// use spot_core::{decode_autoregressive, ArConfig};
/// use spot_models::{CausalLm, CpuBackend};
/// let mut model = CausalLm::<CpuBackend>::load("SmolLM2-135M-Instruct".as_ref(), &Default::default())?;
/// let prompt = model.tokenizer().unwrap().encode("The capital of France is")?;
/// let out = decode_autoregressive(&mut model, &prompt, &ArConfig { max_new_tokens: 8, ..ArConfig::default() })?;
/// println!("{}", model.tokenizer().unwrap().decode(&out.tokens)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CausalLm<B: Backend> {
    cfg: DecoderConfig,
    pub(crate) net: Net<B>,
    pub(crate) frame: Frame<B>,
    info: ArInfo,
    pub(crate) cache: Vec<Kv<B>>,
    pub(crate) len: usize,
    pub(crate) noise: crate::frame::NoiseCache<B>,
}

impl<B: Backend> std::fmt::Debug for CausalLm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalLm")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("cached_len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> CausalLm<B> {
    /// Loads a Llama, Qwen2 or Qwen3 folder: `config.json`, `generation_config.json`
    /// (optional), safetensors (single or sharded), `tokenizer.json` (optional).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let (cfg, path) = DecoderConfig::read(dir)?;
        cfg.check(&path, &["llama", "qwen2", "qwen3"])?;
        let bias = cfg.model_type == "qwen2" || cfg.attention_bias;
        let qk_norm = cfg.model_type == "qwen3";
        let (frame, weights) = open::<B>(dir, &cfg, None, device)?;
        let mut net = dense_net(
            &cfg.dense_spec(bias, qk_norm),
            &QWEN_NAMES,
            &weights,
            (device, precision),
        )?;
        // CPU backends: the host kernel for every projection (a verification forward of a few
        // tokens then costs about what one token does).
        net.pack_host_projections();
        let info = ArInfo {
            vocab_size: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            stop_ids: frame.stop_ids.clone(),
        };
        Ok(Self {
            cfg,
            net,
            frame,
            info,
            cache: Vec::new(),
            len: 0,
            noise: Default::default(),
        })
    }

    crate::frame::folder_accessors!(DecoderConfig);

    /// Appends `tokens` and returns their logits `[len, vocab]` as host values (for tests and
    /// tools; decoding uses [`AutoregressiveModel::extend`]).
    pub fn extend_logits(&mut self, tokens: &[TokenId]) -> Result<Logits> {
        let hidden = self.append(tokens)?;
        self.net.head.logits_host(hidden)
    }

    pub(crate) fn append(&mut self, tokens: &[TokenId]) -> Result<Tensor<B, 2>> {
        if tokens.is_empty() {
            return Err(ModelError::Request("no tokens to append".to_string()));
        }
        self.frame.check_end(self.len + tokens.len(), "sequence")?;
        let mut ids = Vec::with_capacity(tokens.len());
        self.frame.push_ids(tokens, &mut ids)?;
        let (hidden, kv) =
            self.net
                .run(ids, 1, tokens.len(), self.len, &self.cache, Attend::Causal);
        Net::extend_cache(&mut self.cache, kv);
        self.len += tokens.len();
        Ok(hidden)
    }
}

impl<B: Backend> AutoregressiveModel for CausalLm<B> {
    fn ar_info(&self) -> &ArInfo {
        &self.info
    }

    fn cached_len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) -> spot_core::Result<()> {
        if len >= self.len {
            return Ok(());
        }
        self.len = len;
        if len == 0 {
            self.cache.clear();
            self.noise.clear();
        } else {
            for c in &mut self.cache {
                c.k = c.k.clone().narrow(2, 0, len);
                c.v = c.v.clone().narrow(2, 0, len);
            }
        }
        Ok(())
    }

    fn extend(&mut self, tokens: &[TokenId], query: &StatsQuery) -> spot_core::Result<BlockStats> {
        query.validate()?;
        let start = self.len;
        let hidden = self.append(tokens)?;
        let plan = RowPlan::all(tokens.len());
        let mut stats = self.frame.stats(
            &self.net.head,
            hidden,
            &plan,
            (start + 1, &mut self.noise),
            query,
        )?;
        Ok(stats.pop().unwrap_or_default())
    }

    /// One forward: `shared` (kept in the cache) and the branches after it, each branch's
    /// attention on its own over `[cache ; shared]`, so its statistics are bit-identical to
    /// appending it alone. Only the shared run's last row is reduced (one entry). Branches
    /// of unequal lengths are scored one by one.
    fn extend_branches(
        &mut self,
        shared: &[TokenId],
        branches: &[Vec<TokenId>],
        query: &StatsQuery,
    ) -> spot_core::Result<(BlockStats, Vec<BlockStats>)> {
        let len = branches.first().map_or(0, Vec::len);
        if shared.is_empty() || len == 0 || branches.iter().any(|b| b.len() != len) {
            return spot_core::autoregressive::extend_each(self, shared, branches, query);
        }
        query.validate()?;
        let (start, n) = (self.len, branches.len());
        self.frame
            .check_end(start + shared.len() + len, "sequence")?;
        let mut ids = Vec::with_capacity(shared.len() + n * len);
        self.frame.push_ids(shared, &mut ids)?;
        for b in branches {
            self.frame.push_ids(b, &mut ids)?;
        }
        let segments = [
            Segment {
                n: 1,
                len: shared.len(),
                start,
                cache: &self.cache,
                after: None,
            },
            Segment {
                n,
                len,
                start: start + shared.len(),
                cache: &self.cache,
                after: Some(0),
            },
        ];
        let (hidden, mut kv) = self.net.run_segments(ids, &segments, Attend::Causal);
        let kept = std::mem::take(&mut kv[0]);
        Net::extend_cache(&mut self.cache, kept);
        self.len += shared.len();
        // Only the shared run's last row is read (it predicts the first drafted position).
        let rows = shared.len();
        let own = hidden.clone().narrow(0, rows - 1, 1);
        let after = hidden.narrow(0, rows, n * len);
        let noise = &mut self.noise;
        let mut first = self.frame.stats(
            &self.net.head,
            own,
            &RowPlan::all(1),
            (start + rows, &mut *noise),
            query,
        )?;
        let stats = self.frame.stats(
            &self.net.head,
            after,
            &RowPlan::all_of(n, len),
            (self.len + 1, noise),
            query,
        )?;
        Ok((first.pop().unwrap_or_default(), stats))
    }
}
