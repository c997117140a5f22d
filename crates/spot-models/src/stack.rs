//! [`LayerStack`]: decoder layers of a target's shape over the target's own embedding and head,
//! the body of a network that reads the target's hidden states and speaks through its head (the
//! MRP baseline's module, `spot_drafter::mrp::Mrp`). Its weights are f32.

use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use spot_core::{StatsQuery, TokenId};
use spot_hf::Result;
use spot_hf::hf::Weights;
use spot_reduce::{Logits, RowJob, RowStats};

use crate::attention::Attend;
use crate::config::DecoderConfig;
use crate::dense::{DenseNames, QWEN_NAMES, dense_net};
use crate::head::{MaskTerms, NoiseRows};
use crate::loader::Loader;
use crate::precision::Precision;
use crate::transformer::{Net, Segment, rms_norm};
use crate::values::host_values;

/// The names of a stack's own tensors in its weights file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackNames {
    /// Each layer's prefix, `{n}` standing for its index (e.g. `"mrp.layers.{n}."`); the layer's
    /// tensors follow it with the Qwen3 names (`input_layernorm`, `self_attn.q_proj`, ...,
    /// `mlp.down_proj`).
    pub layers: &'static str,
    /// The final norm's weight (e.g. `"mrp.norm.weight"`).
    pub norm: &'static str,
}

/// Decoder layers of the target's shape (Qwen3's: QK-norm, no biases) and a final norm, with
/// the target's embedding and head, on backend `B` in f32.
///
/// ```no_run
/// use spot_models::hf::Weights;
/// use spot_models::stack::{LayerStack, StackNames};
/// use spot_models::{CpuBackend, DecoderConfig};
/// let target = std::path::Path::new("models/sdar-tiny-code");
/// let (cfg, _) = DecoderConfig::read(target)?;
/// let weights = Weights::open(target)?.with_file(&target.join("mrp.safetensors"))?;
/// let names = StackNames { layers: "mrp.layers.{n}.", norm: "mrp.norm.weight" };
/// let stack = LayerStack::<CpuBackend>::load(&cfg, 1, names, &weights, &Default::default())?;
/// // Two sequences of four rows each, attending within their sequence.
/// let x = stack.rows(vec![0.0; 8 * stack.hidden_size()], 8);
/// let out = stack.run_bidirectional(x, 2, 4);
/// assert_eq!(out.len(), 8 * stack.hidden_size());
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub struct LayerStack<B: Backend> {
    net: Net<B>,
    hidden: usize,
    vocab: usize,
}

impl<B: Backend> std::fmt::Debug for LayerStack<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerStack")
            .field("layers", &self.net.layers.len())
            .field("hidden", &self.hidden)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> LayerStack<B> {
    /// Loads `layers` layers named by `names` and the target's embedding and head from
    /// `weights` (the target's files and the stack's own), in the shape `cfg` gives (the
    /// target's `config.json`, [`DecoderConfig::read`]).
    pub fn load(
        cfg: &DecoderConfig,
        layers: usize,
        names: StackNames,
        weights: &Weights,
        device: &B::Device,
    ) -> Result<Self> {
        let mut spec = cfg.dense_spec(false, true);
        spec.layers = layers;
        let dense = DenseNames {
            norm: names.norm,
            layer: names.layers,
            ..QWEN_NAMES
        };
        let net = dense_net(&spec, &dense, weights, (device, Precision::F32))?;
        Ok(Self {
            net,
            hidden: cfg.hidden_size,
            vocab: cfg.vocab_size,
        })
    }

    fn loader<'w>(&self, weights: &'w Weights) -> Loader<'w, B> {
        Loader {
            weights,
            device: self.net.device.clone(),
            dtype: self.net.dtype,
        }
    }

    /// The `[n]` weight `name` of `weights` as a `[1, n]` row (a norm's scale).
    pub fn row(&self, weights: &Weights, name: &str, n: usize) -> Result<Tensor<B, 2>> {
        self.loader(weights).row(name, n)
    }

    /// The `[out, inp]` weight `name` of `weights` (PyTorch's `Linear` layout), transposed to
    /// `[inp, out]` so that rows multiply it.
    pub fn linear(
        &self,
        weights: &Weights,
        name: &str,
        (out, inp): (usize, usize),
    ) -> Result<Tensor<B, 2>> {
        self.loader(weights).linear(name, out, inp)
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// Vocabulary size of the embedding and head.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The target's embedding rows of `ids` (each below [`LayerStack::vocab_size`]).
    pub fn embed(&self, ids: &[TokenId]) -> Tensor<B, 2> {
        let ids: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
        let n = ids.len();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &self.net.device);
        self.net.embed.clone().select(0, ids)
    }

    /// `rows` host rows (`rows * hidden_size` values, row-major) on the stack's device, in its
    /// float type.
    pub fn rows(&self, values: Vec<f32>, rows: usize) -> Tensor<B, 2> {
        Tensor::<B, 2>::from_data(
            TensorData::new(values, [rows, self.hidden]),
            &self.net.device,
        )
        .cast(self.net.dtype)
    }

    /// RMS norm of every row of `x` with scale `weight` (`[1, hidden]`) and the target's
    /// epsilon.
    pub fn rms_norm(&self, x: Tensor<B, 2>, weight: &Tensor<B, 2>) -> Tensor<B, 2> {
        rms_norm(x, weight, self.net.geo.eps)
    }

    /// The layers and final norm over `n` sequences of `len` input rows each (`x`: `[n * len,
    /// hidden]`, positions `0..len`), every row attending to its whole sequence; the output
    /// rows as host values.
    pub fn run_bidirectional(&self, x: Tensor<B, 2>, n: usize, len: usize) -> Vec<f32> {
        let segment = Segment {
            n,
            len,
            start: 0,
            cache: &[],
            after: None,
        };
        let (out, _) = self.net.run_embedded(x, &[segment], Attend::Bidirectional);
        host_values(out)
    }

    /// The head's logits of the rows of `hidden` `[rows, hidden]`.
    pub fn logits(&self, hidden: Tensor<B, 2>) -> Result<Logits> {
        self.net.head.logits_host(hidden)
    }

    /// The `[1, vocab]` bias that keeps `mask` from being chosen (0, and `-inf` at the mask),
    /// for [`LayerStack::reduce_rows`].
    pub fn mask_bias(&self, mask: TokenId) -> Tensor<B, 2> {
        crate::head::mask_bias(mask, self.vocab, &self.net.device)
    }

    /// The target's reduction (its choice rule under `query`, as its forwards apply it, the
    /// fused host kernel on CPU backends) of the host `rows` (`hidden_size` values each) that
    /// `jobs` name, at absolute `positions`: each job's choice (never `mask`; `bias` is
    /// [`LayerStack::mask_bias`] of it), confidence, probability and top list. `noise`: the
    /// block's Gumbel rows on the host (`spot_reduce::noise_table`) and a slot for their
    /// device copy, which the call fills when a device head reads them (`None` at `T = 0`).
    pub fn reduce_rows(
        &self,
        rows: &[f32],
        jobs: &[RowJob],
        positions: &[usize],
        query: &StatsQuery,
        (mask, bias): (TokenId, &Tensor<B, 2>),
        noise: Option<(&[f32], &mut Option<Tensor<B, 2>>)>,
    ) -> Result<Vec<RowStats>> {
        let tensor = || self.rows(rows.to_vec(), rows.len() / self.hidden.max(1));
        let terms = MaskTerms {
            id: Some(mask),
            bias: Some(bias),
        };
        let noise = noise.map(|(host, device)| NoiseRows { host, device });
        self.net
            .head
            .reduce_rows(tensor, Some(rows), jobs, positions, query, terms, noise)
    }
}
