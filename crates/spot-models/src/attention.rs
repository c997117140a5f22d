//! Attention over `[cached prefix ; block]`: the layer's weights, the cache, and the two ways a
//! block attends to itself (bidirectionally for block diffusion, causally for autoregressive
//! models), both batch invariant.

use burn_tensor::activation::softmax;
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor};

/// How the positions of a block attend to each other (the prefix is always fully visible).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attend {
    /// Every position of the block sees the whole block (block diffusion).
    Bidirectional,
    /// Position `i` sees the block's positions `0..=i` (autoregressive; one sequence).
    Causal,
}

/// The cached keys and values of one layer: `[1, kv_heads, prefix_len, head_dim]`.
#[derive(Clone)]
pub(crate) struct Kv<B: Backend> {
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
}

impl<B: Backend> Kv<B> {
    /// Bytes of the keys and values of every layer of `cache`.
    pub fn bytes(cache: &[Self]) -> u64 {
        cache
            .iter()
            .map(|kv| tensor_bytes(&kv.k) + tensor_bytes(&kv.v))
            .sum()
    }
}

/// Bytes a tensor's elements take.
pub(crate) fn tensor_bytes<B: Backend, const D: usize>(t: &Tensor<B, D>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}

/// Attention weights of one layer (linear weights stored `[in, out]`).
pub(crate) struct Attention<B: Backend> {
    pub q: Tensor<B, 2>,
    pub k: Tensor<B, 2>,
    pub v: Tensor<B, 2>,
    pub o: Tensor<B, 2>,
    /// q, k, v biases `[1, out]`.
    pub bias: Option<[Tensor<B, 2>; 3]>,
    /// Per-head RMSNorm weights of q and k, `[1, 1, 1, head_dim]`.
    pub qk_norm: Option<[Tensor<B, 4>; 2]>,
}

/// Bidirectional attention of `n` block states (`q` `[n, kv, g * len, d]`, `k`/`v`
/// `[n, kv, len, d]`) over the cached prefix `cache` (`[1, kv, p, d]`, or none) and their own
/// block. The prefix is broadcast over the states (read in place, never copied), and each
/// state's products are their own matrix calls of fixed shape, so a state's numbers do not
/// depend on the batch.
pub(crate) fn bidirectional<B: Backend>(
    q: Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    cache: Option<&Kv<B>>,
    scale: f64,
) -> Tensor<B, 4> {
    let len = k.dims()[2];
    match cache {
        Some(kv) => {
            let s_blk = q
                .clone()
                .matmul(k.clone().swap_dims(2, 3))
                .mul_scalar(scale);
            let p = kv.k.dims()[2];
            let s_pre = q.matmul(kv.k.clone().swap_dims(2, 3)).mul_scalar(scale);
            let w = softmax_f32(Tensor::cat(vec![s_pre, s_blk], 3));
            let o_pre = w.clone().narrow(3, 0, p).matmul(kv.v.clone());
            o_pre + w.narrow(3, p, len).matmul(v.clone())
        }
        None => {
            let s_blk = q.matmul(k.clone().swap_dims(2, 3)).mul_scalar(scale);
            softmax_f32(s_blk).matmul(v.clone())
        }
    }
}

/// Causal attention of `n` sequences' `len` new positions after one `cache` (`q`
/// `[n, kv, g * len, d]`, `k`/`v` `[n, kv, len, d]`; each sequence on its own), one position
/// at a time: position `i`
/// attends to `[cache ; k[..i]]` and to itself with exactly the products a one-token
/// forward at that position runs, so appending a run of tokens in one forward gives the
/// numbers of appending them one by one, bit for bit.
pub(crate) fn causal<B: Backend>(
    q: Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    cache: Option<&Kv<B>>,
    scale: f64,
) -> Tensor<B, 4> {
    let [n, kvh, _, d] = k.dims();
    let len = k.dims()[2];
    let g = q.dims()[2] / len.max(1);
    let p = cache.map_or(0, |c| c.k.dims()[2]);
    let q = q.reshape([n, kvh, g, len, d]);
    // `[cache ; new]` once per sequence (the cache repeated for several sequences, the
    // branches of a verifier); position `i` reads the first `p + i` rows of it. Every product
    // below is batched over the sequences only, each sequence's slice the product a forward
    // of that sequence alone runs.
    let all = |own: &Tensor<B, 4>, cached: Option<&Tensor<B, 4>>| match cached {
        Some(c) if n > 1 => Tensor::cat(vec![c.clone().repeat_dim(0, n), own.clone()], 2),
        Some(c) => Tensor::cat(vec![c.clone(), own.clone()], 2),
        None => own.clone(),
    };
    let (all_k, all_v) = (all(k, cache.map(|c| &c.k)), all(v, cache.map(|c| &c.v)));
    let outs = (0..len)
        .map(|i| {
            let qi = q.clone().narrow(3, i, 1).reshape([n, kvh, g, d]);
            let (ki, vi) = (k.clone().narrow(2, i, 1), v.clone().narrow(2, i, 1));
            let s_self = qi.clone().matmul(ki.swap_dims(2, 3)).mul_scalar(scale);
            let o = if p + i == 0 {
                softmax_f32(s_self).matmul(vi)
            } else {
                let pre_k = all_k.clone().narrow(2, 0, p + i);
                let pre_v = all_v.clone().narrow(2, 0, p + i);
                let s_pre = qi.matmul(pre_k.swap_dims(2, 3)).mul_scalar(scale);
                let w = softmax_f32(Tensor::cat(vec![s_pre, s_self], 3));
                w.clone().narrow(3, 0, p + i).matmul(pre_v) + w.narrow(3, p + i, 1).matmul(vi)
            };
            o.reshape([n, kvh, g, 1, d])
        })
        .collect();
    Tensor::cat(outs, 3).reshape([n, kvh, g * len, d])
}

/// Softmax over the last dimension in f32, returned in the scores' type (a no-op cast in f32).
fn softmax_f32<B: Backend>(scores: Tensor<B, 4>) -> Tensor<B, 4> {
    let dtype = scores.dtype();
    softmax(scores.cast(DType::F32), 3).cast(dtype)
}
