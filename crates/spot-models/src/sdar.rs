//! SDAR: the Qwen3 architecture decoded as a block-diffusion model (JetLM/SDAR-*).
//!
//! Weights are looked up by their Hugging Face names, so this file doubles as the weight map:
//! `model.embed_tokens`, `model.layers.N.{input_layernorm, post_attention_layernorm}`,
//! `model.layers.N.self_attn.{q,k,v,o}_proj`, `model.layers.N.self_attn.{q,k}_norm`,
//! `model.layers.N.mlp.{gate,up,down}_proj`, `model.norm`, `lm_head` (absent when tied).
//!
//! Attention is block-causal: a block attends to every earlier block (read from the prefix
//! KV cache) and to itself bidirectionally. A forward over `n` block states runs the prefix
//! part of attention as one matrix product per KV head with the `n` states folded into the rows,
//! so the cached prefix is read once and never copied per state.

use std::path::{Path, PathBuf};

use burn_tensor::activation::{silu, softmax};
use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use serde::Deserialize;
use spot_core::{
    BlockDiffusionModel, BlockState, BlockStats, ModelInfo, PrefixUpdate, StatsQuery, TokenId,
};

use crate::error::{ModelError, Result};
use crate::hf::{Tokenizer, Weights, generation_stop_ids, read_json, token_ids};
use crate::reduce::{noise_rows, reduce};

fn default_theta() -> f64 {
    10_000.0
}

/// `config.json` of an SDAR (or plain Qwen3) checkpoint. Unknown fields are ignored; a missing
/// required field is an error naming it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct SdarConfig {
    /// `"sdar"` (or `"qwen3"`).
    pub model_type: String,
    /// Vocabulary size of the embedding and head.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head dimension; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Context limit.
    pub max_position_embeddings: usize,
    /// Whether the head reuses the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Must be false (Qwen3 has no q/k/v bias).
    #[serde(default)]
    pub attention_bias: bool,
    /// Must be `silu`.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Must be null (no RoPE scaling is implemented).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Block size the model was trained with (SDAR folders name it in the repo; optional).
    #[serde(default)]
    pub block_size: Option<usize>,
    /// The mask token id; when absent it is resolved from `<|MASK|>` in the tokenizer.
    #[serde(default)]
    pub mask_token_id: Option<u32>,
    /// EOS id(s), used when `generation_config.json` has none.
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

impl SdarConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let cfg: SdarConfig = read_json(&path)?;
        cfg.validate(&path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |field, reason: String| {
            Err(ModelError::InvalidConfig {
                path: path.to_path_buf(),
                field,
                reason,
            })
        };
        if self.model_type != "sdar" && self.model_type != "qwen3" {
            return bad(
                "model_type",
                format!("expected \"sdar\", found {:?}", self.model_type),
            );
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(field, "must be positive".to_string());
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return bad(
                "num_key_value_heads",
                format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    self.num_attention_heads,
                    self.kv_heads()
                ),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("RoPE needs an even head_dim, got {}", self.head_dim()),
            );
        }
        if self.attention_bias {
            return bad(
                "attention_bias",
                "q/k/v biases are not supported for SDAR".to_string(),
            );
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return bad(
                "hidden_act",
                format!("only \"silu\" is supported, found {act:?}"),
            );
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return bad("rope_scaling", "RoPE scaling is not supported".to_string());
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad(
                "rms_norm_eps",
                format!("must be positive, got {}", self.rms_norm_eps),
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(
                "rope_theta",
                format!("must be positive, got {}", self.rope_theta),
            );
        }
        Ok(())
    }

    /// Number of parameters the weights hold.
    pub fn parameter_count(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv, d) = (
            self.num_attention_heads * self.head_dim(),
            self.kv_heads() * self.head_dim(),
            self.head_dim(),
        );
        let layer = 2 * h + h * q + 2 * h * kv + q * h + 2 * d + 3 * h * i;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }
}

struct Layer<B: Backend> {
    input_norm: Tensor<B, 2>,
    q: Tensor<B, 2>,
    k: Tensor<B, 2>,
    v: Tensor<B, 2>,
    o: Tensor<B, 2>,
    q_norm: Tensor<B, 4>,
    k_norm: Tensor<B, 4>,
    post_norm: Tensor<B, 2>,
    gate: Tensor<B, 2>,
    up: Tensor<B, 2>,
    down: Tensor<B, 2>,
}

/// The cached keys and values of one layer: `[1, kv_heads, prefix_len, head_dim]`.
#[derive(Clone)]
struct Kv<B: Backend> {
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
}

/// An SDAR model on backend `B`, with its prefix KV cache.
///
/// ```no_run
/// use spot_models::{Sdar, CpuBackend};
/// let model = Sdar::<CpuBackend>::load("path/to/SDAR-1.7B-Chat".as_ref(), &Default::default())?;
/// println!("{} parameters", model.config().parameter_count());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub struct Sdar<B: Backend> {
    cfg: SdarConfig,
    info: ModelInfo,
    dir: PathBuf,
    device: B::Device,
    embed: Tensor<B, 2>,
    layers: Vec<Layer<B>>,
    norm: Tensor<B, 2>,
    lm_head: Tensor<B, 2>,
    mask_bias: Tensor<B, 2>,
    inv_freq: Vec<f64>,
    tokenizer: Option<Tokenizer>,
    cache: Vec<Kv<B>>,
    prefix: Vec<TokenId>,
    noise: Option<(u64, usize, usize, Tensor<B, 2>)>,
}

impl<B: Backend> std::fmt::Debug for Sdar<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sdar")
            .field("dir", &self.dir)
            .field("config", &self.cfg)
            .field("prefix_len", &self.prefix.len())
            .finish_non_exhaustive()
    }
}

/// `[rows, cols]` row-major -> `[cols, rows]` row-major.
fn transposed(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: &Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    let var = x.clone().square().mean_dim(D - 1);
    x * var.add_scalar(eps).sqrt().recip() * w.clone()
}

impl<B: Backend> Sdar<B> {
    /// Loads a model folder: `config.json`, `generation_config.json` (optional),
    /// `model.safetensors` or a sharded index, and `tokenizer.json` (optional; needed to
    /// resolve the mask token when the config does not name it, and for text).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        let cfg = SdarConfig::load(dir)?;
        let tokenizer = if dir.join("tokenizer.json").exists() {
            Some(Tokenizer::open(dir)?)
        } else {
            None
        };
        let mask_id = match (cfg.mask_token_id, &tokenizer) {
            (Some(id), _) => id,
            (None, Some(t)) => t
                .token_id("<|MASK|>")
                .ok_or_else(|| ModelError::InvalidConfig {
                    path: dir.join("config.json"),
                    field: "mask_token_id",
                    reason: "absent, and tokenizer.json has no <|MASK|> token".to_string(),
                })?,
            (None, None) => {
                return Err(ModelError::InvalidConfig {
                    path: dir.join("config.json"),
                    field: "mask_token_id",
                    reason: "absent, and there is no tokenizer.json to resolve <|MASK|>"
                        .to_string(),
                });
            }
        };
        if mask_id as usize >= cfg.vocab_size {
            return Err(ModelError::InvalidConfig {
                path: dir.join("config.json"),
                field: "mask_token_id",
                reason: format!("{mask_id} is outside the vocabulary of {}", cfg.vocab_size),
            });
        }
        let mut stop_ids = generation_stop_ids(dir)?;
        if stop_ids.is_empty() {
            stop_ids = token_ids(cfg.eos_token_id.as_ref());
        }
        let weights = Weights::open(dir)?;
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (nh, kvh, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        // A [out, in] HF linear weight, stored transposed as a contiguous [in, out] tensor so
        // that every forward multiplies by it without a layout copy.
        let linear = |name: String, out: usize, inp: usize| -> Result<Tensor<B, 2>> {
            let w = weights.load_f32(&name, &[out, inp])?;
            Ok(Tensor::<B, 2>::from_data(
                TensorData::new(transposed(&w, out, inp), [inp, out]),
                device,
            ))
        };
        let vector = |name: String, n: usize| -> Result<Tensor<B, 1>> {
            let w = weights.load_f32(&name, &[n])?;
            Ok(Tensor::<B, 1>::from_data(TensorData::new(w, [n]), device))
        };
        let embed_host = weights.load_f32("model.embed_tokens.weight", &[v, h])?;
        // A tied head multiplies by the transposed embedding: keep a contiguous copy.
        let tied_head =
            (cfg.tie_word_embeddings && !weights.contains("lm_head.weight")).then(|| {
                Tensor::<B, 2>::from_data(
                    TensorData::new(transposed(&embed_host, v, h), [h, v]),
                    device,
                )
            });
        let embed = Tensor::<B, 2>::from_data(TensorData::new(embed_host, [v, h]), device);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for n in 0..cfg.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{n}.{s}.weight");
            layers.push(Layer {
                input_norm: vector(p("input_layernorm"), h)?.reshape([1, h]),
                q: linear(p("self_attn.q_proj"), nh * d, h)?,
                k: linear(p("self_attn.k_proj"), kvh * d, h)?,
                v: linear(p("self_attn.v_proj"), kvh * d, h)?,
                o: linear(p("self_attn.o_proj"), h, nh * d)?,
                q_norm: vector(p("self_attn.q_norm"), d)?.reshape([1, 1, 1, d]),
                k_norm: vector(p("self_attn.k_norm"), d)?.reshape([1, 1, 1, d]),
                post_norm: vector(p("post_attention_layernorm"), h)?.reshape([1, h]),
                gate: linear(p("mlp.gate_proj"), i, h)?,
                up: linear(p("mlp.up_proj"), i, h)?,
                down: linear(p("mlp.down_proj"), h, i)?,
            });
        }
        let norm = vector("model.norm.weight".to_string(), h)?.reshape([1, h]);
        let lm_head = match tied_head {
            Some(t) => t,
            None => linear("lm_head.weight".to_string(), v, h)?,
        };
        let mut bias = vec![0.0f32; v];
        bias[mask_id as usize] = f32::NEG_INFINITY;
        let mask_bias = Tensor::from_data(TensorData::new(bias, [1, v]), device);
        let inv_freq = (0..d / 2)
            .map(|j| 1.0 / cfg.rope_theta.powf((2 * j) as f64 / d as f64))
            .collect();
        let info = ModelInfo {
            vocab_size: v,
            mask_id,
            max_positions: cfg.max_position_embeddings,
            stop_ids,
        };
        Ok(Self {
            cfg,
            info,
            dir: dir.to_path_buf(),
            device: device.clone(),
            embed,
            layers,
            norm,
            lm_head,
            mask_bias,
            inv_freq,
            tokenizer,
            cache: Vec::new(),
            prefix: Vec::new(),
            noise: None,
        })
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &SdarConfig {
        &self.cfg
    }

    /// The tokenizer, when the folder has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The folder the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `[1, 1, len, head_dim]` cos and sin tables for positions `start..start + len`
    /// (rotate-half layout: the frequencies repeat in the two halves).
    fn rope(&self, start: usize, len: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let d = self.cfg.head_dim();
        let mut cos = Vec::with_capacity(len * d);
        let mut sin = Vec::with_capacity(len * d);
        for p in start..start + len {
            // Both halves of the head use the same frequencies.
            for f in self.inv_freq.iter().chain(&self.inv_freq) {
                let a = (p as f32 * *f as f32) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let t = |v| Tensor::<B, 4>::from_data(TensorData::new(v, [1, 1, len, d]), &self.device);
        (t(cos), t(sin))
    }

    fn apply_rope(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
        let d = x.dims()[3];
        let x1 = x.clone().narrow(3, 0, d / 2);
        let x2 = x.clone().narrow(3, d / 2, d / 2);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * cos.clone() + rotated * sin.clone()
    }

    /// Runs `n` block states of `len` tokens after the cached prefix. Returns the final hidden
    /// states `[n * len, hidden]` and each layer's new keys and values `[n, kv, len, d]`.
    fn run(&self, ids: Vec<i64>, n: usize, len: usize) -> (Tensor<B, 2>, Vec<Kv<B>>) {
        let c = &self.cfg;
        let (nh, kvh, d) = (c.num_attention_heads, c.kv_heads(), c.head_dim());
        let g = nh / kvh;
        let rows = n * len;
        let start = self.prefix.len();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows]), &self.device);
        let mut x = self.embed.clone().select(0, ids);
        let (cos, sin) = self.rope(start, len);
        let scale = 1.0 / (d as f64).sqrt();
        let mut new_kv = Vec::with_capacity(self.layers.len());
        for (li, layer) in self.layers.iter().enumerate() {
            // 1. Pre-norm and projections.
            let hn = rms_norm(x.clone(), &layer.input_norm, c.rms_norm_eps);
            let q = hn.clone().matmul(layer.q.clone()).reshape([n, len, nh, d]);
            let k = hn.clone().matmul(layer.k.clone()).reshape([n, len, kvh, d]);
            let v = hn.matmul(layer.v.clone()).reshape([n, len, kvh, d]);
            // 2. QK-norm per head, then RoPE; heads first: [n, heads, len, d].
            let q = rms_norm(q, &layer.q_norm, c.rms_norm_eps).swap_dims(1, 2);
            let k = rms_norm(k, &layer.k_norm, c.rms_norm_eps).swap_dims(1, 2);
            let v = v.swap_dims(1, 2);
            let q = Self::apply_rope(q, &cos, &sin);
            let k = Self::apply_rope(k, &cos, &sin);
            // 3. Group the query heads of each KV head: [n, kv, g * len, d].
            let q = q.reshape([n, kvh, g * len, d]);
            let s_blk = q
                .clone()
                .matmul(k.clone().swap_dims(2, 3))
                .mul_scalar(scale);
            // 4. Attention over [prefix ; block], the prefix read once for all states.
            let out = match self.cache.get(li) {
                Some(kv) if start > 0 => {
                    let qf = q.swap_dims(0, 1).reshape([1, kvh, n * g * len, d]);
                    let s_pre = qf
                        .matmul(kv.k.clone().swap_dims(2, 3))
                        .mul_scalar(scale)
                        .reshape([kvh, n, g * len, start])
                        .swap_dims(0, 1);
                    let p = softmax(Tensor::cat(vec![s_pre, s_blk], 3), 3);
                    let p_pre = p.clone().narrow(3, 0, start).swap_dims(0, 1).reshape([
                        1,
                        kvh,
                        n * g * len,
                        start,
                    ]);
                    let o_pre = p_pre
                        .matmul(kv.v.clone())
                        .reshape([kvh, n, g * len, d])
                        .swap_dims(0, 1);
                    o_pre + p.narrow(3, start, len).matmul(v.clone())
                }
                _ => softmax(s_blk, 3).matmul(v.clone()),
            };
            // 5. Heads back to features, output projection, residual.
            let out = out
                .reshape([n, nh, len, d])
                .swap_dims(1, 2)
                .reshape([rows, nh * d]);
            x = x + out.matmul(layer.o.clone());
            // 6. SwiGLU MLP, residual.
            let hn = rms_norm(x.clone(), &layer.post_norm, c.rms_norm_eps);
            let mlp = silu(hn.clone().matmul(layer.gate.clone())) * hn.matmul(layer.up.clone());
            x = x + mlp.matmul(layer.down.clone());
            new_kv.push(Kv { k, v });
        }
        (rms_norm(x, &self.norm, c.rms_norm_eps), new_kv)
    }

    fn logits(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        hidden.matmul(self.lm_head.clone())
    }

    /// Logits `[n, len, vocab]` of `states` after the cached prefix, as host values (for
    /// tests and tools; decoding uses [`BlockDiffusionModel::forward`], which never copies
    /// logits to the host).
    pub fn forward_logits(&mut self, states: &[BlockState]) -> Result<Vec<f32>> {
        let (ids, n, len) = self.check_states(states)?;
        let (hidden, _) = self.run(ids, n, len);
        Ok(self.logits(hidden).into_data().iter::<f32>().collect())
    }

    fn check_states(&self, states: &[BlockState]) -> Result<(Vec<i64>, usize, usize)> {
        let len = states.first().map_or(0, BlockState::len);
        let end = self.prefix.len() + len;
        if end > self.info.max_positions {
            return Err(ModelError::Request(format!(
                "block ends at position {end}, past max_position_embeddings {}",
                self.info.max_positions
            )));
        }
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

    fn push_ids(&self, tokens: &[TokenId], out: &mut Vec<i64>) -> Result<()> {
        for &t in tokens {
            if t as usize >= self.cfg.vocab_size {
                return Err(ModelError::Request(format!(
                    "token id {t} is outside the vocabulary of {}",
                    self.cfg.vocab_size
                )));
            }
            out.push(i64::from(t));
        }
        Ok(())
    }

    /// Appends one block to the KV cache (one forward).
    fn append(&mut self, block: &[TokenId]) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let end = self.prefix.len() + block.len();
        if end > self.info.max_positions {
            return Err(ModelError::Request(format!(
                "prefix would end at position {end}, past max_position_embeddings {}",
                self.info.max_positions
            )));
        }
        let mut ids = Vec::with_capacity(block.len());
        self.push_ids(block, &mut ids)?;
        let (_, kv) = self.run(ids, 1, block.len());
        if self.cache.is_empty() {
            self.cache = kv;
        } else {
            for (c, new) in self.cache.iter_mut().zip(kv) {
                c.k = Tensor::cat(vec![c.k.clone(), new.k], 2);
                c.v = Tensor::cat(vec![c.v.clone(), new.v], 2);
            }
        }
        self.prefix.extend_from_slice(block);
        Ok(())
    }
}

impl<B: Backend> BlockDiffusionModel for Sdar<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn reset_prefix(
        &mut self,
        prefix: &[TokenId],
        block_size: usize,
    ) -> spot_core::Result<PrefixUpdate> {
        self.cache.clear();
        self.prefix.clear();
        self.noise = None;
        if block_size == 0 {
            return Err(spot_core::Error::config(
                "block_size",
                "must be at least 1, got 0",
            ));
        }
        for chunk in prefix.chunks(block_size) {
            self.append(chunk)?;
        }
        Ok(PrefixUpdate {
            ran_forward: !prefix.is_empty(),
            positions: prefix.len(),
        })
    }

    fn append_block(&mut self, block: &[TokenId]) -> spot_core::Result<PrefixUpdate> {
        self.append(block)?;
        Ok(PrefixUpdate {
            ran_forward: !block.is_empty(),
            positions: block.len(),
        })
    }

    fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    fn forward(
        &mut self,
        states: &[BlockState],
        query: &StatsQuery,
    ) -> spot_core::Result<Vec<BlockStats>> {
        query.validate()?;
        let (ids, n, len) = self.check_states(states)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let start = self.prefix.len();
        let noise = if query.temperature > 0.0 {
            let seed = query.noise.seed();
            let fresh = !matches!(&self.noise, Some((s, a, l, _)) if *s == seed && *a == start && *l == len);
            if fresh {
                let rows = noise_rows::<B>(query, start, len, self.cfg.vocab_size, &self.device);
                self.noise = Some((seed, start, len, rows));
            }
            self.noise.as_ref().map(|(_, _, _, t)| t.clone())
        } else {
            None
        };
        let (hidden, _) = self.run(ids, n, len);
        let logits = self.logits(hidden);
        Ok(reduce(
            logits,
            n,
            len,
            query,
            &self.mask_bias,
            noise.as_ref(),
        )?)
    }
}
