//! Loading tensors by their HF names onto a device, in the layouts the network uses.

use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor, TensorData};

use crate::head::{Head, HeadPlacement};
use crate::linear::Dense;
use crate::moe::{Moe, MoeParts};
use crate::values::transposed;
use spot_hf::hf::Weights;
use spot_hf::{ModelError, Result};

/// Loads tensors by their HF names onto a device, in the layouts [`Net`] uses.
pub(crate) struct Loader<'w, B: Backend> {
    pub weights: &'w Weights,
    pub device: B::Device,
    /// The float type of the weights on the device.
    pub dtype: DType,
}

impl<B: Backend> Loader<'_, B> {
    /// A `[out, in]` HF linear weight, stored transposed as a contiguous `[in, out]` tensor so
    /// that every forward multiplies by it without a layout copy.
    pub fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Tensor<B, 2>> {
        let w = self.weights.load_f32(name, &[out, inp])?;
        Ok(self.transposed(&w, out, inp))
    }

    fn transposed(&self, w: &[f32], out: usize, inp: usize) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(transposed(w, out, inp), [inp, out]),
            (&self.device, self.dtype),
        )
    }

    /// A fused `[sum(parts), in]` linear weight split along its rows (e.g. fused QKV).
    pub fn fused(&self, name: &str, parts: &[usize], inp: usize) -> Result<Vec<Tensor<B, 2>>> {
        let total: usize = parts.iter().sum();
        let w = self.weights.load_f32(name, &[total, inp])?;
        let mut at = 0;
        Ok(parts
            .iter()
            .map(|&p| {
                let t = self.transposed(&w[at * inp..(at + p) * inp], p, inp);
                at += p;
                t
            })
            .collect())
    }

    /// A vector as a `[1, n]` row (norm weights, biases).
    pub fn row(&self, name: &str, n: usize) -> Result<Tensor<B, 2>> {
        let w = self.weights.load_f32(name, &[n])?;
        Ok(Tensor::from_data(
            TensorData::new(w, [1, n]),
            (&self.device, self.dtype),
        ))
    }

    /// A per-head norm weight as `[1, 1, 1, d]`.
    pub fn head_norm(&self, name: &str, d: usize) -> Result<Tensor<B, 4>> {
        let w = self.weights.load_f32(name, &[d])?;
        Ok(Tensor::from_data(
            TensorData::new(w, [1, 1, 1, d]),
            (&self.device, self.dtype),
        ))
    }

    /// A SwiGLU MLP `prefix.{gate,up,down}` with names `names` and width `i`.
    pub fn dense(&self, names: [&str; 3], i: usize, h: usize) -> Result<Dense<B>> {
        Ok(Dense::new(
            self.linear(names[0], i, h)?,
            self.linear(names[1], i, h)?,
            self.linear(names[2], h, i)?,
        ))
    }

    /// A mixture of experts: router `[experts, h]`, selection bias (optional), `experts`
    /// SwiGLU experts of width `i` named by `expert(e)`, optional shared expert.
    pub fn moe(&self, parts: MoeParts<'_>, h: usize) -> Result<Moe<B>> {
        let e = parts.experts;
        // The router runs in f32 (as in Hugging Face) whatever the model's type.
        let w = self.weights.load_f32(&parts.router, &[e, h])?;
        let router = Tensor::from_data(
            TensorData::new(transposed(&w, e, h), [h, e]),
            (&self.device, DType::F32),
        );
        let bias = match &parts.bias {
            Some(name) => self.weights.load_f32(name, &[e])?,
            None => vec![0.0; e],
        };
        if let Some(bad) = bias.iter().find(|b| !b.is_finite()) {
            return Err(ModelError::Request(format!(
                "tensor `{}` holds a non-finite value {bad}",
                parts.bias.unwrap_or_default()
            )));
        }
        let experts = (0..e)
            .map(|x| {
                let [g, u, d] = (parts.expert)(x);
                self.dense([&g, &u, &d], parts.width, h)
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match parts.shared {
            Some(([g, u, d], w)) => Some(self.dense([&g, &u, &d], w, h)?),
            None => None,
        };
        Ok(Moe::new(router, bias, experts, shared, parts.routing))
    }

    /// The embedding `[v, h]`, the head (placed by [`HeadPlacement::Auto`]) and whether it is
    /// tied (no `head` tensor and `tie`: the head is the embedding matrix).
    pub fn embedding_and_head(
        &self,
        embed: &str,
        head: &str,
        tie: bool,
        v: usize,
        h: usize,
    ) -> Result<(Tensor<B, 2>, Head<B>, bool)> {
        let host = self.weights.load_f32(embed, &[v, h])?;
        let tied = tie && !self.weights.contains(head);
        let head = if tied {
            Head::new(&host, v, h, HeadPlacement::Auto, (&self.device, self.dtype))?
        } else {
            let w = self.weights.load_f32(head, &[v, h])?;
            Head::new(&w, v, h, HeadPlacement::Auto, (&self.device, self.dtype))?
        };
        let embed = Tensor::from_data(TensorData::new(host, [v, h]), (&self.device, self.dtype));
        Ok((embed, head, tied))
    }
}
