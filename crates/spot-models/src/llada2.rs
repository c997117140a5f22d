//! LLaDA2.0-mini (inclusionAI): a mixture-of-experts block-diffusion model, block-causal with
//! an exact prefix KV cache like SDAR ([`BlockCausal`]).
//!
//! Weight map (HF names, `.weight` unless noted): `model.word_embeddings`,
//! `model.layers.N.{input_layernorm, post_attention_layernorm}`,
//! `model.layers.N.attention.query_key_value` (fused rows: q heads, k heads, v heads),
//! `attention.dense` (output), `attention.{query,key}_layernorm` (per-head QK-norm);
//! dense layers (`N < first_k_dense_replace`) `mlp.{gate,up,down}_proj`; MoE layers
//! `mlp.gate` (router), `mlp.gate.expert_bias` (tensor name as written), `mlp.experts.E.{gate,
//! up,down}_proj`, `mlp.shared_experts.{gate,up,down}_proj`; `model.norm`, `lm_head`.
//!
//! Partial RoPE on the first `head_dim * partial_rotary_factor` dimensions of each head. The
//! router runs in f32 with sigmoid scores; the expert bias shifts scores for selection only;
//! experts are chosen from the best `topk_group` of `n_group` groups (a group scores the sum
//! of its two best experts); weights are the selected unbiased scores normalised and scaled by
//! `routed_scaling_factor`. Only the selected experts run, each on the rows routed to it. At
//! temperature 0 decoding is argmax (the upstream sampler samples at T = 1 there; not copied).

use std::path::Path;

use burn_tensor::backend::Backend;
use serde::Deserialize;

use crate::attention::Attention;
use crate::block_causal::BlockCausal;
use crate::config::{Checker, DecoderConfig};
use crate::frame::{FolderFacts, open};
use crate::loader::Loader;
use crate::moe::{MoeParts, Routing};
use crate::precision::Precision;
use crate::transformer::{Layer, Mlp, Net};
use spot_hf::Result;

fn one() -> usize {
    1
}

fn one_f() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

/// `config.json` of a LLaDA2.0 MoE checkpoint: the decoder fields plus the MoE and attention
/// options below. Unknown fields are ignored.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Llada2Config {
    /// Shapes, norms, RoPE base, ids (`model_type` `"llada2_moe"`).
    #[serde(flatten)]
    pub base: DecoderConfig,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Shared experts (their widths add up to one SwiGLU).
    #[serde(default)]
    pub num_shared_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Expert groups.
    #[serde(default = "one")]
    pub n_group: usize,
    /// Groups a token may pick experts from.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Width of a routed expert.
    pub moe_intermediate_size: usize,
    /// Width of the shared expert; defaults to `moe_intermediate_size * num_shared_experts`.
    #[serde(default)]
    pub moe_shared_expert_intermediate_size: Option<usize>,
    /// Layers before this index are dense.
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// Multiplies the routing weights.
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// Must be `"sigmoid"`.
    #[serde(default)]
    pub score_function: Option<String>,
    /// Normalise the selected weights to sum to one before scaling.
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    /// Per-head RMSNorm on q and k.
    #[serde(default)]
    pub use_qk_norm: bool,
    /// Fraction of each head RoPE rotates.
    #[serde(default = "one_f")]
    pub partial_rotary_factor: f64,
    /// Dimensions RoPE rotates, when written (wins over `partial_rotary_factor`).
    #[serde(default)]
    pub rotary_dim: Option<usize>,
    /// Whether `mlp.gate.expert_bias` exists.
    #[serde(default = "yes")]
    pub moe_router_enable_expert_bias: bool,
    /// Must be false.
    #[serde(default)]
    pub use_qkv_bias: bool,
    /// Must be false.
    #[serde(default)]
    pub use_bias: bool,
}

impl Llada2Config {
    /// Dimensions of each head that RoPE rotates.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim.unwrap_or_else(|| {
            (self.base.head_dim() as f64 * self.partial_rotary_factor).round() as usize
        })
    }

    /// Width of the shared expert.
    pub fn shared_width(&self) -> usize {
        self.moe_shared_expert_intermediate_size.unwrap_or(
            self.moe_intermediate_size
                .saturating_mul(self.num_shared_experts),
        )
    }

    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let cfg: Self = spot_hf::hf::read_json(&path)?;
        cfg.check(&path)?;
        Ok(cfg)
    }

    fn check(&self, path: &Path) -> Result<()> {
        self.base.check(path, &["llada2_moe"])?;
        let c = Checker { path };
        c.shape(&[
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("n_group", self.n_group),
            ("topk_group", self.topk_group),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ])?;
        if self.num_shared_experts > 0 {
            c.shape(&[
                ("num_shared_experts", self.num_shared_experts),
                ("moe_shared_expert_intermediate_size", self.shared_width()),
            ])?;
        }
        if !self.num_experts.is_multiple_of(self.n_group) {
            return Err(c.fail(
                "n_group",
                format!(
                    "{} experts do not split into {} groups",
                    self.num_experts, self.n_group
                ),
            ));
        }
        if self.topk_group > self.n_group {
            return Err(c.fail(
                "topk_group",
                format!("keeps {} of only {} groups", self.topk_group, self.n_group),
            ));
        }
        let reachable = self.topk_group * self.num_experts / self.n_group;
        if self.num_experts_per_tok > reachable {
            return Err(c.fail(
                "num_experts_per_tok",
                format!(
                    "{} experts per token, but the kept groups hold {reachable}",
                    self.num_experts_per_tok
                ),
            ));
        }
        if self.first_k_dense_replace > self.base.num_hidden_layers {
            return Err(c.fail(
                "first_k_dense_replace",
                format!(
                    "{} dense layers of {}",
                    self.first_k_dense_replace, self.base.num_hidden_layers
                ),
            ));
        }
        if let Some(f) = &self.score_function
            && f != "sigmoid"
        {
            return Err(c.fail(
                "score_function",
                format!("only \"sigmoid\" is supported, found {f:?}"),
            ));
        }
        let r = self.rotary_dim();
        if !(self.partial_rotary_factor > 0.0 && r > 0 && r <= self.base.head_dim()) {
            return Err(c.fail(
                "partial_rotary_factor",
                format!(
                    "{} of head_dim {} rotates {r} dimensions",
                    self.partial_rotary_factor,
                    self.base.head_dim()
                ),
            ));
        }
        c.even("partial_rotary_factor", r)?;
        c.positive("routed_scaling_factor", self.routed_scaling_factor)?;
        c.unsupported(
            "use_qkv_bias",
            self.use_qkv_bias,
            "q/k/v biases are not supported",
        )?;
        c.unsupported("use_bias", self.use_bias, "biases are not supported")
    }
}

impl FolderFacts for Llada2Config {
    fn vocab(&self) -> usize {
        self.base.vocab()
    }
    fn max_positions(&self) -> usize {
        self.base.max_positions()
    }
    fn mask_token_id(&self) -> Option<u32> {
        self.base.mask_token_id()
    }
    fn eos(&self) -> Option<&serde_json::Value> {
        self.base.eos()
    }
    fn block_size(&self) -> Option<usize> {
        self.base.block_size()
    }
}

/// A LLaDA2.0 MoE model on backend `B`, with its prefix KV cache.
///
/// ```no_run
/// use spot_models::{CpuBackend, Llada2Moe};
/// let model = Llada2Moe::<CpuBackend>::load("LLaDA2.0-mini".as_ref(), &Default::default())?;
/// println!("{} parameters", model.parameter_count());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub type Llada2Moe<B> = BlockCausal<B, Llada2Config>;

impl<B: Backend> BlockCausal<B, Llada2Config> {
    /// Loads a LLaDA2.0 MoE folder: `config.json`, `generation_config.json` (optional),
    /// safetensors (single or sharded), `tokenizer.json` (optional).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let cfg = Llada2Config::load(dir)?;
        let b = &cfg.base;
        let (frame, weights) = open::<B>(
            dir,
            &cfg,
            crate::family::Family::Llada2Moe.mask_tokens(),
            device,
        )?;
        let ld = Loader::<B> {
            weights: &weights,
            device: device.clone(),
            dtype: precision.resolve::<B>(&weights, device)?,
        };
        let (h, v) = (b.hidden_size, b.vocab_size);
        let (nh, kvh, d) = (b.num_attention_heads, b.kv_heads(), b.head_dim());
        let head = ld.embedding_and_head(
            "model.word_embeddings.weight",
            "lm_head.weight",
            b.tie_word_embeddings,
            v,
            h,
        )?;
        let routing = Routing {
            top_k: cfg.num_experts_per_tok,
            groups: cfg.n_group,
            keep_groups: cfg.topk_group,
            scale: cfg.routed_scaling_factor as f32,
            normalize: cfg.norm_topk_prob,
        };
        // Never more layers than tensors: the count comes from config.json.
        let mut layers = Vec::with_capacity(b.num_hidden_layers.min(weights.len()));
        for n in 0..b.num_hidden_layers {
            let w = |s: &str| format!("model.layers.{n}.{s}.weight");
            let mlp = |s: &str| w(&format!("mlp.{s}"));
            let qkv = ld.fused(
                &w("attention.query_key_value"),
                &[nh * d, kvh * d, kvh * d],
                h,
            )?;
            let [q, k, v]: [_; 3] = qkv
                .try_into()
                .map_err(|_| crate::ModelError::Request("internal: fused QKV split".to_string()))?;
            let norms = if cfg.use_qk_norm {
                Some([
                    ld.head_norm(&w("attention.query_layernorm"), d)?,
                    ld.head_norm(&w("attention.key_layernorm"), d)?,
                ])
            } else {
                None
            };
            let block = if n < cfg.first_k_dense_replace {
                Mlp::Dense(ld.dense(
                    [&mlp("gate_proj"), &mlp("up_proj"), &mlp("down_proj")],
                    b.intermediate_size,
                    h,
                )?)
            } else {
                let expert = |e: usize| {
                    ["gate_proj", "up_proj", "down_proj"].map(|s| mlp(&format!("experts.{e}.{s}")))
                };
                let shared = (cfg.num_shared_experts > 0).then(|| {
                    (
                        ["gate_proj", "up_proj", "down_proj"]
                            .map(|s| mlp(&format!("shared_experts.{s}"))),
                        cfg.shared_width(),
                    )
                });
                Mlp::Moe(
                    ld.moe(
                        MoeParts {
                            router: mlp("gate"),
                            bias: cfg
                                .moe_router_enable_expert_bias
                                .then(|| format!("model.layers.{n}.mlp.gate.expert_bias")),
                            experts: cfg.num_experts,
                            width: cfg.moe_intermediate_size,
                            expert: &expert,
                            shared,
                            routing: routing.clone(),
                        },
                        h,
                    )?,
                )
            };
            layers.push(Layer {
                input_norm: ld.row(&w("input_layernorm"), h)?,
                attn: Attention {
                    q,
                    k,
                    v,
                    o: ld.linear(&w("attention.dense"), h, nh * d)?,
                    bias: None,
                    qk_norm: norms,
                },
                post_norm: ld.row(&w("post_attention_layernorm"), h)?,
                mlp: block,
            });
        }
        let norm = ld.row("model.norm.weight", h)?;
        let mut geo = b.geometry();
        geo.rotary_dim = cfg.rotary_dim();
        let net = Net::new(geo, device.clone(), head, layers, norm);
        Ok(Self::assemble(cfg, net, frame))
    }
}
