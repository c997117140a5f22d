//! The device reduction as one CubeCL kernel (wgpu and CUDA): each masked row of logits is
//! reduced to its statistics in one launch, one cube per row, instead of burn's passes over
//! `[rows, vocab]` (mask bias, division by `T`, noise, argmax, softmax, gather, `p ln p`, sum,
//! `argtopk`, gather) with their intermediate `[rows, vocab]` tensors.
//!
//! Per row, each unit of the cube strides over the vocabulary once, keeping the running
//! maximum of the tempered logits, the argmax of the noised ones (ties to the lower id), the
//! maximum of the raw logits when the confidence rule reads them, and its own top-k of the
//! tempered logits (kept sorted in registers, ties to the lower id). The cube then combines the
//! units' values through shared memory (a tree for the maxima and the argmax, a tree of
//! pairwise merges of the units' sorted lists for the top-k), a second pass over the row sums
//! `exp(t - max)` and `exp(t - max) (t - max)` for the normaliser and the entropy (and the raw
//! normaliser), and the first units write the row's `4 + 2k` numbers. The host reads only
//! those.
//!
//! Agreement with [`spot_core::stats::reduce_logits`] (f64 on the host): the chosen token and
//! the top-k ids are the same (both order by the f32 tempered logit, `l / T`, noised with the
//! same f32 addition for the choice); the probabilities and entropy are f32 values within
//! about 1e-6 relative (tests in `tests/device/`).

use std::any::{Any, TypeId};

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::Fusion;
use burn_tensor::backend::Backend;
use burn_tensor::{Shape, Tensor as BurnTensor, TensorPrimitive};
use spot_core::{StatsQuery, TokenId};
use spot_hf::Result;
use spot_reduce::RowStats;

/// Units per cube (one cube per row). 64, not more: the top-k merge keeps every unit's list in
/// shared memory (`UNITS * k` pairs: 16 KiB at `k` 32, the least any Vulkan device offers).
const UNITS: u32 = 64;
/// The largest top-k the kernel keeps; a query asking for more goes through the multi-pass
/// reduction. The decoders' default is 32.
pub(crate) const MAX_K: usize = 32;
// Unit `j < k` writes the row's `j`-th best.
const _: () = assert!(MAX_K <= UNITS as usize);
/// What the output holds before the kernel writes it.
const UNWRITTEN: f32 = -7.0;

/// One row per cube: see the module documentation. `out` is `[rows, 4 + 2k]`: the chosen id,
/// its tempered probability, its raw probability (0 unless `raw`), the entropy, the `k`
/// probabilities of the top-k and their `k` ids (ids as floats: exact below 2^24). `vocab`
/// doubles as the "no id" mark.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
fn row_stats_kernel(
    logits: &Tensor<f32>,
    noise: &Tensor<f32>,
    out: &mut Tensor<f32>,
    vocab: u32,
    mask: u32,
    temperature: f32,
    #[comptime] noised: bool,
    #[comptime] raw: bool,
    #[comptime] k: u32,
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let units = UNITS as usize;
    let kk = k as usize;
    let v = vocab as usize;
    let base = row * logits.stride(0);
    let noise_base = row * noise.stride(0);
    let lowest = f32::min_value();

    // Pass 1: maxima, the noised argmax and the unit's top-k. A NaN logit is counted (the host
    // reports it); infinite ones are skipped, as the host reference does.
    let mut nan = 0u32;
    let mut t_max = lowest;
    let mut raw_max = lowest;
    let mut pick = lowest;
    let mut pick_id = vocab;
    let mut top_v = Array::<f32>::new(kk);
    let mut top_i = Array::<u32>::new(kk);
    #[unroll]
    for j in 0..kk {
        top_v[j] = lowest;
        top_i[j] = vocab;
    }
    let mut i = unit;
    while i < v {
        let x = logits[base + i];
        if f32::is_nan(x) {
            nan += 1;
        }
        if usable(i, mask, x) {
            let t = temper(x, temperature, noised);
            t_max = f32::max(t_max, t);
            if raw {
                raw_max = f32::max(raw_max, x);
            }
            let mut score = t;
            if noised {
                score = t + noise[noise_base + i];
            }
            if score > pick {
                pick = score;
                pick_id = i as u32;
            }
            // Ids rise along the unit's stride, so an equal value never displaces a kept one.
            if t > top_v[kk - 1] {
                let mut val = t;
                let mut id = i as u32;
                #[unroll]
                for j in 0..kk {
                    let kept = top_v[j];
                    if val > kept {
                        let kept_id = top_i[j];
                        top_v[j] = val;
                        top_i[j] = id;
                        val = kept;
                        id = kept_id;
                    }
                }
            }
        }
        i += units;
    }

    let mut shared_v = SharedMemory::<f32>::new(UNITS as usize);
    let mut shared_w = SharedMemory::<f32>::new(UNITS as usize);
    let mut shared_i = SharedMemory::<u32>::new(UNITS as usize);

    // The row's maxima (tempered, raw) and NaN count.
    shared_v[unit] = t_max;
    shared_w[unit] = raw_max;
    shared_i[unit] = nan;
    sync_cube();
    let mut s = CUBE_DIM_X as usize / 2;
    while s > 0 {
        if unit < s {
            shared_v[unit] = f32::max(shared_v[unit], shared_v[unit + s]);
            shared_w[unit] = f32::max(shared_w[unit], shared_w[unit + s]);
            shared_i[unit] += shared_i[unit + s];
        }
        sync_cube();
        s /= 2;
    }
    let m = shared_v[0];
    let m_raw = shared_w[0];
    let nans = shared_i[0];
    sync_cube();
    // The noised argmax, ties to the lower id.
    shared_v[unit] = pick;
    shared_i[unit] = pick_id;
    sync_cube();
    best_to_front(&mut shared_v, &mut shared_i, unit);
    let chosen = shared_i[0];
    sync_cube();

    // Pass 2: the normaliser, the sum of e (t - m) for the entropy, and the raw normaliser.
    let mut z = 0.0f32;
    let mut zt = 0.0f32;
    let mut z_raw = 0.0f32;
    let mut i = unit;
    while i < v {
        let x = logits[base + i];
        if usable(i, mask, x) {
            let d = temper(x, temperature, noised) - m;
            let e = f32::exp(d);
            z += e;
            zt += e * d;
            if raw {
                z_raw += f32::exp(x - m_raw);
            }
        }
        i += units;
    }
    shared_v[unit] = z;
    shared_w[unit] = zt;
    sync_cube();
    let mut s = CUBE_DIM_X as usize / 2;
    while s > 0 {
        if unit < s {
            shared_v[unit] += shared_v[unit + s];
            shared_w[unit] += shared_w[unit + s];
        }
        sync_cube();
        s /= 2;
    }
    let z = shared_v[0];
    let zt = shared_w[0];
    sync_cube();
    let mut z_raw_all = 1.0f32;
    if raw {
        shared_v[unit] = z_raw;
        sync_cube();
        let mut s = CUBE_DIM_X as usize / 2;
        while s > 0 {
            if unit < s {
                shared_v[unit] += shared_v[unit + s];
            }
            sync_cube();
            s /= 2;
        }
        z_raw_all = shared_v[0];
        sync_cube();
    }

    let o = row * out.stride(0);
    if unit == 0 {
        // The row's slot 1 carries the NaN count as a negative number (a probability never
        // is), which the host turns into the error.
        let mut chosen_id = chosen;
        if chosen_id >= vocab {
            chosen_id = 0;
        }
        let xc = logits[base + chosen_id as usize];
        let tc = temper(xc, temperature, noised);
        out[o] = f32::cast_from(chosen);
        if nans > 0 {
            out[o + 1] = -f32::cast_from(nans);
        } else {
            out[o + 1] = f32::exp(tc - m) / z;
        }
        out[o + 2] = 0.0;
        if raw {
            out[o + 2] = f32::exp(xc - m_raw) / z_raw_all;
        }
        out[o + 3] = f32::ln(z) - zt / z;
    }

    // The top-k: the units' sorted lists merged pairwise in shared memory, a tree of
    // log2(units) levels (two barriers each), keeping the best k at every merge.
    let mut list_v = SharedMemory::<f32>::new(UNITS as usize * kk);
    let mut list_i = SharedMemory::<u32>::new(UNITS as usize * kk);
    let own = unit * kk;
    #[unroll]
    for j in 0..kk {
        list_v[own + j] = top_v[j];
        list_i[own + j] = top_i[j];
    }
    sync_cube();
    let mut s = CUBE_DIM_X as usize / 2;
    while s > 0 {
        if unit < s {
            let other = (unit + s) * kk;
            let mut a = 0usize;
            let mut b = 0usize;
            // a + b = j < k before each step, so neither index leaves its list.
            #[unroll]
            for j in 0..kk {
                let va = list_v[own + a];
                let vb = list_v[other + b];
                let ia = list_i[own + a];
                let ib = list_i[other + b];
                if va > vb || (va == vb && ia <= ib) {
                    top_v[j] = va;
                    top_i[j] = ia;
                    a += 1;
                } else {
                    top_v[j] = vb;
                    top_i[j] = ib;
                    b += 1;
                }
            }
        }
        sync_cube();
        if unit < s {
            #[unroll]
            for j in 0..kk {
                list_v[own + j] = top_v[j];
                list_i[own + j] = top_i[j];
            }
        }
        sync_cube();
        s /= 2;
    }
    if unit < kk {
        let best = list_v[unit];
        let best_id = list_i[unit];
        let mut p = 0.0f32;
        if best_id < vocab {
            p = f32::exp(best - m) / z;
        }
        out[o + 4 + unit] = p;
        out[o + 4 + kk + unit] = f32::cast_from(best_id);
    }
}

/// Whether logit `x` of id `i` takes part in the row's statistics: not the mask, and finite
/// (NaN and infinities are left out; the kernel counts NaNs apart).
#[cube]
fn usable(i: usize, mask: u32, x: f32) -> bool {
    (i as u32) != mask && f32::abs(x) <= f32::max_value()
}

/// The tempered logit `x / T` (`x` itself at `T = 0`, where nothing is noised).
#[cube]
fn temper(x: f32, temperature: f32, #[comptime] noised: bool) -> f32 {
    let mut t = x;
    if noised {
        t = x / temperature;
    }
    t
}

/// Moves the best of the cube's `(value, id)` pairs in shared memory to slot 0: the larger
/// value, ties to the lower id (a tree over the units, one barrier per level).
#[cube]
fn best_to_front(shared_v: &mut SharedMemory<f32>, shared_i: &mut SharedMemory<u32>, unit: usize) {
    let mut s = CUBE_DIM_X as usize / 2;
    while s > 0 {
        if unit < s {
            let a = shared_v[unit];
            let b = shared_v[unit + s];
            let b_id = shared_i[unit + s];
            if b > a || (b == a && b_id < shared_i[unit]) {
                shared_v[unit] = b;
                shared_i[unit] = b_id;
            }
        }
        sync_cube();
        s /= 2;
    }
}

/// What the fused reduction needs besides the logits.
pub(crate) struct FusedQuery<'a> {
    pub query: &'a StatsQuery,
    pub mask: Option<TokenId>,
    pub positions: &'a [usize],
}

/// Reduces `logits` `[rows, vocab]` (f32) with the fused kernel when `B` is one of the CubeCL
/// backends this build has (wgpu, CUDA) and the query is one the kernel covers (no top-k
/// truncation, top-k at most [`MAX_K`]); otherwise hands the tensors back for the multi-pass
/// reduction.
#[allow(clippy::type_complexity)]
pub(crate) fn try_reduce<B: Backend>(
    logits: BurnTensor<B, 2>,
    noise: Option<BurnTensor<B, 2>>,
    q: &FusedQuery<'_>,
) -> std::result::Result<Result<Vec<RowStats>>, (BurnTensor<B, 2>, Option<BurnTensor<B, 2>>)> {
    let vocab = logits.dims()[1];
    let k = q.query.effective_top_k(vocab);
    let covered = q.query.sample_top_k.is_none_or(|t| t >= vocab) && k <= MAX_K && vocab < 1 << 24;
    if !covered || (q.query.temperature > 0.0 && noise.is_none()) {
        return Err((logits, noise));
    }
    #[cfg(feature = "wgpu")]
    if TypeId::of::<B>() == TypeId::of::<crate::WgpuBackend>() {
        return Ok(fused::<_, _>(
            same::<B, crate::WgpuBackend>(logits),
            noise.map(same::<B, crate::WgpuBackend>),
            q,
            k,
        ));
    }
    #[cfg(feature = "cuda")]
    if TypeId::of::<B>() == TypeId::of::<crate::CudaBackend>() {
        return Ok(fused::<_, _>(
            same::<B, crate::CudaBackend>(logits),
            noise.map(same::<B, crate::CudaBackend>),
            q,
            k,
        ));
    }
    Err((logits, noise))
}

/// `t` as a tensor of `C`, which is `B` (checked by the caller through `TypeId`).
fn same<B: Backend, C: Backend>(t: BurnTensor<B, 2>) -> BurnTensor<C, 2> {
    let primitive: Box<dyn Any> = Box::new(t.into_primitive().tensor());
    let primitive = primitive
        .downcast::<C::FloatTensorPrimitive>()
        .unwrap_or_else(|_| unreachable!("the caller compared the backends' TypeIds"));
    BurnTensor::from_primitive(TensorPrimitive::Float(*primitive))
}

/// A matrix of the fused CubeCL backend over runtime `R`, as wgpu and CUDA build it.
type FusedMatrix<R, BT> = BurnTensor<Fusion<CubeBackend<R, f32, i32, BT>>, 2>;

/// The fused-backend tensor `t` as the CubeCL tensor under it.
fn cube<R: CubeRuntime, BT: BoolElement>(t: FusedMatrix<R, BT>) -> CubeTensor<R> {
    let t = t.into_primitive().tensor();
    let client = t.client.clone();
    let t = client.resolve_tensor_float::<CubeBackend<R, f32, i32, BT>>(t);
    burn_cubecl::kernel::into_contiguous(t)
}

fn fused<R: CubeRuntime, BT: BoolElement>(
    logits: FusedMatrix<R, BT>,
    noise: Option<FusedMatrix<R, BT>>,
    q: &FusedQuery<'_>,
    k: usize,
) -> Result<Vec<RowStats>> {
    let [rows, vocab] = logits.dims();
    let logits = cube(logits);
    let client = logits.client.clone();
    let device = logits.device.clone();
    let noise = match noise {
        Some(n) => cube(n),
        None => burn_cubecl::ops::numeric::empty_device::<R, f32>(
            client.clone(),
            device.clone(),
            Shape::new([1, 1]),
        ),
    };
    let width = 4 + 2 * k;
    // Filled with a mark no row can hold (a negative id), so a kernel that did not run (CubeCL
    // compiles kernels on its server thread, where a failure does not reach this call) is an
    // error rather than rows of whatever the buffer held.
    let out =
        burn_cubecl::ops::numeric::full::<R, f32>(Shape::new([rows, width]), &device, UNWRITTEN);
    let t = q.query.temperature;
    let noised = t > 0.0;
    let raw = q.query.rule.reads_raw_probability(t);
    row_stats_kernel::launch::<R>(
        &client,
        CubeCount::Static(rows as u32, 1, 1),
        CubeDim::new_1d(UNITS),
        logits.into_tensor_arg(),
        noise.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        vocab as u32,
        q.mask.unwrap_or(u32::MAX),
        if noised { t } else { 1.0 },
        noised,
        raw,
        k as u32,
    );
    let values = burn_cubecl::ops::into_data_sync(out)
        .to_vec::<f32>()
        .map_err(|e| {
            spot_hf::ModelError::Request(format!("internal: reading the fused reduction: {e:?}"))
        })?;
    let mut stats = Vec::with_capacity(rows);
    if values.len() != rows * width || values.chunks_exact(width).any(|v| v[0] == UNWRITTEN) {
        return Err(spot_hf::ModelError::Request(
            "internal: the fused device reduction did not run (see the log for CubeCL's error)"
                .to_string(),
        ));
    }
    for (r, v) in values.chunks_exact(width).enumerate() {
        // As the host reference: a NaN logit first (slot 1 holds minus their count), then a
        // row with no finite logit outside the mask (the chosen id is the kernel's "no id",
        // `vocab`).
        let reason = if v[1] < 0.0 {
            Some("NaN logit")
        } else if v[0] as usize >= vocab {
            Some("no finite logit outside the mask token")
        } else if v[1].is_nan() || v[3].is_nan() {
            Some("NaN logit")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(spot_core::Error::NonFiniteLogits {
                position: q.positions.get(r).copied().unwrap_or(r),
                reason,
            }
            .into());
        }
        let top = &v[4..];
        stats.push(RowStats {
            token: v[0] as TokenId,
            token_prob: f64::from(v[1]),
            raw_prob: raw.then(|| f64::from(v[2])),
            entropy: f64::from(v[3].max(0.0)),
            top_ids: top[k..2 * k].iter().map(|&id| id as TokenId).collect(),
            top_probs: top[..k].to_vec(),
        });
    }
    Ok(stats)
}
