//! The output layer: on the device (a matrix product, then the device reduction) or on the host
//! (the fused kernel of [`spot_reduce::HostHead`], the default on CPU backends).

use burn_tensor::backend::Backend;
use burn_tensor::{DType, Int, Tensor, TensorData};
use spot_core::{StatsQuery, TokenId};

pub(crate) use crate::reduce::MaskTerms;
use crate::reduce::{reduce, upload};
use crate::values::{host_values, runs_on_host, transposed};
use spot_hf::Result;
use spot_reduce::{HostHead, Logits, RowJob, RowStats};

/// Where a model computes its output layer and the reduction to statistics.
///
/// `Auto` (the default when loading) is the host on the CPU backends (flex, ndarray), where the
/// fused host kernel never writes the `[rows, vocab]` logits, and the device otherwise. Both
/// give batch-invariant statistics; they differ from each other within float rounding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadPlacement {
    /// The host on CPU backends, the device on GPU backends.
    #[default]
    Auto,
    /// A matrix product and a reduction in the backend's tensor operations.
    Device,
    /// The fused host kernel (any backend: the final hidden states are read back, `O(dim)`
    /// numbers per position).
    Host,
}

impl HeadPlacement {
    /// Whether `Auto` means the host on backend `B` (the CPU backends).
    fn host_on<B: Backend>(self, device: &B::Device) -> bool {
        match self {
            HeadPlacement::Host => true,
            HeadPlacement::Device => false,
            HeadPlacement::Auto => runs_on_host::<B>(device),
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            HeadPlacement::Auto => "auto",
            HeadPlacement::Device => "device",
            HeadPlacement::Host => "host",
        }
    }
}

impl std::str::FromStr for HeadPlacement {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [
            HeadPlacement::Auto,
            HeadPlacement::Device,
            HeadPlacement::Host,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("unknown head placement {s:?}; one of auto, device, host"))
    }
}

/// The output layer's weights where they are used.
pub(crate) enum Head<B: Backend> {
    /// `[hidden, vocab]` on the device.
    Device(Tensor<B, 2>),
    /// Packed on the host.
    Host(HostHead),
}

impl<B: Backend> Head<B> {
    /// The head of the HF `[vocab, dim]` matrix `w`, placed by `placement`.
    pub fn new(
        w: &[f32],
        vocab: usize,
        dim: usize,
        placement: HeadPlacement,
        (device, dtype): (&B::Device, DType),
    ) -> Result<Self> {
        Ok(if placement.host_on::<B>(device) {
            Head::Host(HostHead::new(w, vocab, dim)?)
        } else {
            let t = transposed(w, vocab, dim);
            Head::Device(Tensor::from_data(
                TensorData::new(t, [dim, vocab]),
                (device, dtype),
            ))
        })
    }

    /// Moves the head to `placement` (a copy through the host).
    pub fn place(&mut self, placement: HeadPlacement, (device, dtype): (&B::Device, DType)) {
        let host = placement.host_on::<B>(device);
        let w = match self {
            Head::Host(_) if host => return,
            Head::Device(_) if !host => return,
            Head::Host(h) => h.unpack(),
            Head::Device(t) => {
                let [dim, vocab] = t.dims();
                let data: Vec<f32> = t.to_data().iter::<f32>().collect();
                transposed(&data, dim, vocab)
            }
        };
        let (vocab, dim) = self.shape();
        // The matrix is the head's own: its shape cannot be refused.
        if let Ok(head) = Self::new(&w, vocab, dim, placement, (device, dtype)) {
            *self = head;
        }
    }

    /// `(vocab, dim)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Head::Host(h) => (h.vocab(), h.dim()),
            Head::Device(t) => {
                let [dim, vocab] = t.dims();
                (vocab, dim)
            }
        }
    }

    /// Logits `[rows, vocab]` of `hidden` `[rows, dim]`, on the host.
    pub fn logits_host(&self, hidden: Tensor<B, 2>) -> Result<Logits> {
        Ok(match self {
            Head::Host(h) => h.logits(&host_values(hidden)),
            Head::Device(w) => {
                let vocab = w.dims()[1];
                Logits::from_vec(host_values(hidden.matmul(w.clone())), vocab)?
            }
        })
    }
}

/// The `[1, vocab]` bias of mask id `mask`: 0, and `-inf` at the mask.
pub(crate) fn mask_bias<B: Backend>(
    mask: TokenId,
    vocab: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let mut bias = vec![0.0f32; vocab];
    if let Some(b) = bias.get_mut(mask as usize) {
        *b = f32::NEG_INFINITY;
    }
    Tensor::from_data(TensorData::new(bias, [1, vocab]), device)
}

/// Gumbel rows a reduction reads at `T > 0`: the host table `[rows, vocab]` that the jobs'
/// `noise` index, and a slot for its device copy (uploaded once, when a device reduction
/// first reads it, and kept by the caller).
pub(crate) struct NoiseRows<'a, B: Backend> {
    pub host: &'a [f32],
    pub device: &'a mut Option<Tensor<B, 2>>,
}

impl<B: Backend> Head<B> {
    /// The target's reduction of the rows `jobs` name of `hidden` `[rows, dim]`: each row's
    /// choice under `query` (`argmax(l / T + G)` with its Gumbel row at `T > 0`, never the
    /// mask), its confidence, probability and top list. `hidden` makes the rows as a tensor
    /// (called only when the reduction needs one: always on the device path, on the host path
    /// only without `host_hidden`, the same rows already on the host when the caller has them);
    /// `positions` are the rows' absolute positions (errors name them). The one reduction of the output layer: the models' forwards and the MRP
    /// module's corrected logits both go through it.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_rows(
        &self,
        hidden: impl FnOnce() -> Tensor<B, 2>,
        host_hidden: Option<&[f32]>,
        jobs: &[RowJob],
        positions: &[usize],
        query: &StatsQuery,
        mask: MaskTerms<'_, B>,
        noise: Option<NoiseRows<'_, B>>,
    ) -> Result<Vec<RowStats>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let noise = noise.filter(|_| query.temperature > 0.0);
        match self {
            Head::Host(h) => {
                let owned;
                let values = match host_hidden {
                    Some(v) => v,
                    None => {
                        owned = host_values(hidden());
                        &owned
                    }
                };
                let table = noise.as_ref().map(|n| n.host);
                Ok(h.reduce(values, jobs, query, mask.id, table, positions)?)
            }
            Head::Device(w) => {
                let hidden = hidden();
                let device = hidden.device();
                let index = |rows: Vec<i64>| {
                    let n = rows.len();
                    Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &device)
                };
                let picked = index(jobs.iter().map(|j| j.hidden as i64).collect());
                // Logits in the model's type, reduced in f32.
                let logits = hidden.select(0, picked).matmul(w.clone()).cast(DType::F32);
                let noise = noise.map(|n| {
                    let vocab = w.dims()[1];
                    let rows = n.host.len() / vocab.max(1);
                    let table = n
                        .device
                        .get_or_insert_with(|| upload(n.host.to_vec(), rows, vocab, &device))
                        .clone();
                    table.select(0, index(jobs.iter().map(|j| j.noise as i64).collect()))
                });
                reduce(logits, query, mask, noise, positions, true)
            }
        }
    }
}
