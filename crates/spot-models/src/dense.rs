//! Loading a dense decoder (every layer attention + SwiGLU MLP) from a table of tensor names,
//! so that a family's weight map is data: the Qwen/Llama names ([`QWEN_NAMES`]: SDAR, Dream,
//! autoregressive Llama/Qwen2/Qwen3) and LLaDA's OLMo-style names.

use burn_tensor::backend::Backend;

use crate::attention::Attention;
use crate::loader::Loader;
use crate::precision::Precision;
use crate::transformer::{Geometry, Layer, Mlp, Net};
use spot_hf::Result;
use spot_hf::hf::Weights;

/// Tensor names of a dense decoder; layer names are `layer` with `{n}` replaced, then the part
/// name and `.weight` (biases: the projection name and `.bias`).
pub(crate) struct DenseNames {
    pub embed: &'static str,
    pub head: &'static str,
    pub norm: &'static str,
    pub layer: &'static str,
    pub input_norm: &'static str,
    /// q, k, v, o projections.
    pub attn: [&'static str; 4],
    /// Per-head q and k norms (families with QK-norm).
    pub qk_norm: [&'static str; 2],
    pub post_norm: &'static str,
    /// gate, up, down projections.
    pub mlp: [&'static str; 3],
}

/// The HF Qwen2/Qwen3/Llama names.
pub(crate) const QWEN_NAMES: DenseNames = DenseNames {
    embed: "model.embed_tokens.weight",
    head: "lm_head.weight",
    norm: "model.norm.weight",
    layer: "model.layers.{n}.",
    input_norm: "input_layernorm",
    attn: [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
    ],
    qk_norm: ["self_attn.q_norm", "self_attn.k_norm"],
    post_norm: "post_attention_layernorm",
    mlp: ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"],
};

/// Shapes and options of a dense decoder.
pub(crate) struct DenseSpec {
    pub geo: Geometry,
    pub hidden: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub layers: usize,
    /// The head may be the embedding (used when the head tensor is absent).
    pub tie: bool,
    /// q/k/v biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k.
    pub qk_norm: bool,
}

/// Loads the dense decoder `spec` named by `names`.
pub(crate) fn dense_net<B: Backend>(
    spec: &DenseSpec,
    names: &DenseNames,
    weights: &Weights,
    (device, precision): (&B::Device, Precision),
) -> Result<Net<B>> {
    let ld = Loader::<B> {
        weights,
        device: device.clone(),
        dtype: precision.resolve::<B>(weights, device)?,
    };
    let (h, i) = (spec.hidden, spec.intermediate);
    let g = &spec.geo;
    let (q_out, kv_out, d) = (g.heads * g.head_dim, g.kv_heads * g.head_dim, g.head_dim);
    let head = ld.embedding_and_head(names.embed, names.head, spec.tie, spec.vocab, h)?;
    // Never more layers than tensors: the count comes from config.json.
    let mut layers = Vec::with_capacity(spec.layers.min(weights.len()));
    for n in 0..spec.layers {
        let prefix = names.layer.replace("{n}", &n.to_string());
        let w = |part: &str| format!("{prefix}{part}.weight");
        let b = |part: &str| format!("{prefix}{part}.bias");
        let [q, k, v, o] = names.attn;
        let bias = if spec.qkv_bias {
            Some([
                ld.row(&b(q), q_out)?,
                ld.row(&b(k), kv_out)?,
                ld.row(&b(v), kv_out)?,
            ])
        } else {
            None
        };
        let qk_norm = if spec.qk_norm {
            Some([
                ld.head_norm(&w(names.qk_norm[0]), d)?,
                ld.head_norm(&w(names.qk_norm[1]), d)?,
            ])
        } else {
            None
        };
        let [gate, up, down] = names.mlp;
        layers.push(Layer {
            input_norm: ld.row(&w(names.input_norm), h)?,
            attn: Attention {
                q: ld.linear(&w(q), q_out, h)?,
                k: ld.linear(&w(k), kv_out, h)?,
                v: ld.linear(&w(v), kv_out, h)?,
                o: ld.linear(&w(o), h, q_out)?,
                bias,
                qk_norm,
            },
            post_norm: ld.row(&w(names.post_norm), h)?,
            mlp: Mlp::Dense(ld.dense([&w(gate), &w(up), &w(down)], i, h)?),
        });
    }
    let norm = ld.row(names.norm, h)?;
    Ok(Net::new(
        spec.geo.clone(),
        device.clone(),
        head,
        layers,
        norm,
    ))
}
