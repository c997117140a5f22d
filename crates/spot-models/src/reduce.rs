//! On-device reduction of logits to the per-position statistics decoders need.
//!
//! Only `O(k)` numbers per position cross to the host, never the `V` logits: the chosen token,
//! its tempered and raw probabilities, the top-k of the tempered distribution and its entropy.

use burn_tensor::activation::softmax;
use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use spot_core::stats::PositionStats;
use spot_core::{BlockStats, ConfidenceRule, StatsQuery, TokenId};

use crate::error::{ModelError, Result};

fn to_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().iter::<f32>().collect()
}

fn to_ids<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Vec<TokenId> {
    t.into_data().iter::<i64>().map(|x| x as TokenId).collect()
}

/// The Gumbel rows `G[start + s, v]` for a block, uploaded once per block.
pub(crate) fn noise_rows<B: Backend>(
    query: &StatsQuery,
    start: usize,
    len: usize,
    vocab: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let mut rows = vec![0.0f32; len * vocab];
    for (s, row) in rows.chunks_mut(vocab).enumerate() {
        query.noise.fill_row((start + s) as u64, row);
    }
    Tensor::from_data(TensorData::new(rows, [len, vocab]), device)
}

/// Reduces `logits` `[n_states * len, vocab]` to one [`BlockStats`] per state.
///
/// `mask_bias` is `[1, vocab]`: 0 everywhere and `-inf` at the mask id (none for
/// autoregressive models). `noise` is `[len, vocab]` (used when `T > 0`).
pub(crate) fn reduce<B: Backend>(
    logits: Tensor<B, 2>,
    n_states: usize,
    len: usize,
    query: &StatsQuery,
    mask_bias: Option<&Tensor<B, 2>>,
    noise: Option<&Tensor<B, 2>>,
) -> Result<Vec<BlockStats>> {
    let [rows, vocab] = logits.dims();
    let t = query.temperature;
    let logits = match mask_bias {
        Some(b) => logits + b.clone(),
        None => logits,
    };
    let tempered = if t > 0.0 {
        logits.clone().div_scalar(t)
    } else {
        logits.clone()
    };
    // 1. Chosen token: argmax of tempered logits (+ noise at T > 0).
    let scores = match (t > 0.0, noise) {
        (true, Some(g)) => {
            let g = g
                .clone()
                .unsqueeze_dim::<3>(0)
                .expand([n_states, len, vocab]);
            tempered.clone() + g.reshape([rows, vocab])
        }
        (true, None) => {
            return Err(ModelError::Request(
                "internal: noise rows missing at T > 0".to_string(),
            ));
        }
        _ => tempered.clone(),
    };
    let chosen = scores.argmax(1); // [rows, 1]
    // 2. Tempered distribution, its entropy and top-k.
    let probs = softmax(tempered, 1);
    let token_prob = probs.clone().gather(1, chosen.clone());
    let plogp = probs.clone() * probs.clone().clamp_min(1e-30).log();
    let entropy = plogp.sum_dim(1).neg();
    let k = query.effective_top_k(vocab);
    let (top_p, top_i) = probs.topk_with_indices(k, 1);
    let raw = if query.rule == ConfidenceRule::RawProbability && t > 0.0 {
        Some(to_f32(softmax(logits, 1).gather(1, chosen.clone())))
    } else {
        None
    };
    // 3. To the host: O(k) numbers per position.
    let chosen = to_ids(chosen);
    let token_prob = to_f32(token_prob);
    let entropy = to_f32(entropy);
    let top_p = to_f32(top_p);
    let top_i = to_ids(top_i);
    let mut out = Vec::with_capacity(n_states);
    for b in 0..n_states {
        let mut st = BlockStats::new(k);
        for s in 0..len {
            let r = b * len + s;
            let tp = &top_p[r * k..(r + 1) * k];
            let tail: f32 = 1.0 - tp.iter().sum::<f32>();
            let confidence = match query.rule {
                ConfidenceRule::RawProbability => raw.as_ref().map_or(token_prob[r], |v| v[r]),
                ConfidenceRule::Margin => tp[0] - tp.get(1).copied().unwrap_or(0.0),
                ConfidenceRule::NegativeEntropy => -entropy[r],
                _ => token_prob[r],
            };
            st.push(PositionStats {
                token: chosen[r],
                confidence,
                token_prob: token_prob[r],
                entropy: if entropy[r] < 0.0 { 0.0 } else { entropy[r] },
                tail_mass: tail.clamp(0.0, 1.0),
                top_ids: &top_i[r * k..(r + 1) * k],
                top_probs: tp,
            })?;
        }
        out.push(st);
    }
    Ok(out)
}
