//! The device reduction of logits to the statistics decoders need.
//!
//! Only `O(k)` numbers per reduced row cross to the host, never the `V` logits: the chosen
//! token, its tempered (and, when the rule reads it, raw) probability, the top-k of the
//! tempered distribution and its entropy. The top-k is a selection (`argtopk`), not a sort.

use burn_tensor::activation::softmax;
use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use spot_core::{StatsQuery, TokenId};

use crate::values::host_values;
use spot_hf::{ModelError, Result};
use spot_reduce::RowStats;

/// The mask token as a reduction reads it: its id (the host kernel and the fused device kernel
/// skip it) and the `[1, vocab]` bias that is `-inf` there (burn's passes add it); `None` for
/// autoregressive models.
pub(crate) struct MaskTerms<'a, B: Backend> {
    pub id: Option<TokenId>,
    pub bias: Option<&'a Tensor<B, 2>>,
}

fn to_ids<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Vec<TokenId> {
    t.into_data().iter::<i64>().map(|x| x as TokenId).collect()
}

/// Reduces `logits` `[rows, vocab]` to one [`RowStats`] per row.
///
/// `mask_bias` is `[1, vocab]`: 0 everywhere and `-inf` at the mask id (none for
/// autoregressive models). `noise` is each row's Gumbel row `[rows, vocab]` (used when `T > 0`).
/// A NaN logit makes the row's probability NaN: [`spot_core::Error::NonFiniteLogits`] at
/// `positions[row]`.
///
/// On the CubeCL backends (wgpu, CUDA) the row reduction is one kernel
/// (`fused_reduce`) when `fused` is set and the query is one it covers; the burn passes
/// below are the rest.
pub(crate) fn reduce<B: Backend>(
    logits: Tensor<B, 2>,
    query: &StatsQuery,
    mask: MaskTerms<'_, B>,
    noise: Option<Tensor<B, 2>>,
    positions: &[usize],
    fused: bool,
) -> Result<Vec<RowStats>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let (logits, noise) = if fused {
        let q = crate::fused_reduce::FusedQuery {
            query,
            mask: mask.id,
            positions,
        };
        match crate::fused_reduce::try_reduce(logits, noise, &q) {
            Ok(stats) => return stats,
            Err(back) => back,
        }
    } else {
        (logits, noise)
    };
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    let _ = fused;
    let mask_bias = mask.bias;
    let [_, vocab] = logits.dims();
    let t = query.temperature;
    let logits = match mask_bias {
        Some(b) => logits + b.clone(),
        None => logits,
    };
    // Top-k truncation: logits below the k-th largest of their row become -inf (on the device
    // every id tied with the k-th stays; the host kernel keeps exactly k, ties to the lower id).
    let truncate = query.sample_top_k.filter(|&k| k < vocab);
    let logits = match truncate {
        Some(k) => {
            let rows = logits.dims()[0];
            let kth = top_k(logits.clone(), k).0.min_dim(1).expand([rows, vocab]);
            let below = logits.clone().lower(kth);
            logits.mask_fill(below, f32::NEG_INFINITY)
        }
        None => logits,
    };
    let tempered = if t > 0.0 {
        logits.clone().div_scalar(t)
    } else {
        logits.clone()
    };
    // 1. Chosen token: argmax of tempered logits (+ noise at T > 0).
    let scores = match (t > 0.0, noise) {
        (true, Some(g)) => tempered.clone() + g,
        (true, None) => {
            return Err(ModelError::Request(
                "internal: noise rows missing at T > 0".to_string(),
            ));
        }
        _ => tempered.clone(),
    };
    let chosen = scores.argmax(1); // [rows, 1]
    // 2. Tempered distribution, its entropy and top-k (a selection kernel, then a gather).
    let probs = softmax(tempered, 1);
    let token_prob = probs.clone().gather(1, chosen.clone());
    let plogp = probs.clone() * probs.clone().clamp_min(1e-30).log();
    let entropy = plogp.sum_dim(1).neg();
    let k = query.effective_top_k(vocab);
    let (top_p, top_i) = top_k(probs, k);
    let raw = query
        .rule
        .reads_raw_probability(t)
        .then(|| host_values(softmax(logits, 1).gather(1, chosen.clone())));
    // 3. To the host: O(k) numbers per row.
    let chosen = to_ids(chosen);
    let token_prob = host_values(token_prob);
    let entropy = host_values(entropy);
    let top_p = host_values(top_p);
    let top_i = to_ids(top_i);
    if let Some(r) = (0..chosen.len()).find(|&r| token_prob[r].is_nan() || entropy[r].is_nan()) {
        return Err(spot_core::Error::NonFiniteLogits {
            position: positions.get(r).copied().unwrap_or(r),
            reason: "NaN logit",
        }
        .into());
    }
    Ok((0..chosen.len())
        .map(|r| {
            // Most probable first, ties to the lower id, whatever order the kernel returned.
            let mut top: Vec<(f32, TokenId)> = top_p[r * k..(r + 1) * k]
                .iter()
                .copied()
                .zip(top_i[r * k..(r + 1) * k].iter().copied())
                .collect();
            top.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            // Under truncation, ids past the k kept ones carry no mass: the top-1 id, 0.
            if let Some(k) = truncate {
                let first = top[0].1;
                top.iter_mut().skip(k).for_each(|e| *e = (0.0, first));
            }
            RowStats {
                token: chosen[r],
                token_prob: f64::from(token_prob[r]),
                raw_prob: raw.as_ref().map(|v| f64::from(v[r])),
                entropy: f64::from(entropy[r].max(0.0)),
                top_ids: top.iter().map(|t| t.1).collect(),
                top_probs: top.iter().map(|t| t.0).collect(),
            }
        })
        .collect())
}

/// The `k` largest entries of each row and their ids: a selection kernel (`argtopk`), except on
/// the CPU backends, which have none (there burn's sort-based `topk_with_indices`).
fn top_k<B: Backend>(x: Tensor<B, 2>, k: usize) -> (Tensor<B, 2>, Tensor<B, 2, Int>) {
    if matches!(B::name(&x.device()).as_str(), "flex" | "ndarray") {
        return x.topk_with_indices(k, 1);
    }
    let ids = x.clone().argtopk(k, 1);
    (x.gather(1, ids.clone()), ids)
}

/// The device tensor of `values` `[rows, cols]`.
pub(crate) fn upload<B: Backend>(
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}
