//! Rotate-half RoPE laid out for the CPU backends' fast paths.
//!
//! The rotation is applied to the projections while they are still `[rows, heads * d]` rows
//! (before the heads are moved in front), as two products with whole-run tables and one sum:
//! `x * cos + swap(x) * sin`, where `swap` exchanges the two halves of each head's rotary
//! dimensions and `sin` carries the sign of the rotation. Every product is then a
//! same-shape or shared-row product (vectorised on flex) instead of a broadcast over a
//! permuted tensor, and the numbers are those of `x * cos + rotate_half(x) * sin`, bit for bit:
//! `x2 * (-s)` equals `(-x2) * s`, and the dimensions past `rotary_dim` are `x * 1 + x * 0`,
//! which is `x`.

use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor, TensorData};

/// The tables of one forward for one head count: `[1, len * heads * head_dim]` each, in the
/// model's float type (as Hugging Face casts them).
pub(crate) struct Rope<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    rotary: usize,
}

impl<B: Backend> Rope<B> {
    /// The tables for positions `start..start + len`, `heads` heads of `head_dim` dimensions of
    /// which the first `rotary` rotate with frequencies `inv_freq` (`rotary / 2` of them).
    pub fn new(
        inv_freq: &[f64],
        (start, len): (usize, usize),
        (heads, head_dim, rotary): (usize, usize, usize),
        (device, dtype): (&B::Device, DType),
    ) -> Self {
        let half = rotary / 2;
        let n = len * heads * head_dim;
        let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut row_cos = vec![1.0f32; head_dim];
        let mut row_sin = vec![0.0f32; head_dim];
        for p in start..start + len {
            for (j, f) in inv_freq.iter().take(half).enumerate() {
                // The angle in f32, as HF computes it.
                let a = (p as f32 * *f as f32) as f64;
                let (c, s) = (a.cos() as f32, a.sin() as f32);
                (row_cos[j], row_cos[j + half]) = (c, c);
                (row_sin[j], row_sin[j + half]) = (-s, s);
            }
            for _ in 0..heads {
                cos.extend_from_slice(&row_cos);
                sin.extend_from_slice(&row_sin);
            }
        }
        let t = |v| Tensor::<B, 2>::from_data(TensorData::new(v, [1, n]), (device, dtype));
        Self {
            cos: t(cos),
            sin: t(sin),
            rotary,
        }
    }

    /// `x` `[n, len, heads, head_dim]` rotated.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [n, len, heads, d] = x.dims();
        let (r, half) = (self.rotary, self.rotary / 2);
        let flat = x.reshape([n * len * heads, d]);
        let mut parts = vec![
            flat.clone().narrow(1, half, half),
            flat.clone().narrow(1, 0, half),
        ];
        if r < d {
            parts.push(flat.clone().narrow(1, r, d - r));
        }
        let swapped = Tensor::cat(parts, 1).reshape([n, len * heads * d]);
        let out =
            flat.reshape([n, len * heads * d]) * self.cos.clone() + swapped * self.sin.clone();
        out.reshape([n, len, heads, d])
    }
}
