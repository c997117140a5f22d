//! Int8 matrix products for the order network's quantised host path
//! ([`Precision::Int8`](super::Precision)).
//!
//! A weight matrix is quantised once, per output column; the activations per row at every
//! call; both symmetric to `[-127, 127]`. The activations are stored offset by 128 as `u8`
//! (what the VNNI instruction multiplies with signed weights), and the offset's share
//! (`128 · Σ_k w[k, j]`) is subtracted once per output. The products accumulate exactly in
//! `i32`, and the one scaling step per output is the same fused multiply-add everywhere, so a
//! row's result depends on nothing but the row: not the batch, not the kernel (AVX-512 VNNI or
//! the portable loop), not the CPU.

/// Columns per packed block (one 512-bit register of `i32` sums).
const BLOCK: usize = 16;
/// Rows per register tile of the VNNI kernel.
#[cfg(target_arch = "x86_64")]
const TILE_ROWS: usize = 6;
/// Column blocks per register tile of the VNNI kernel (6 x 4 sums, 4 weight registers and
/// one broadcast: 29 of the 32 registers).
#[cfg(target_arch = "x86_64")]
const TILE_BLOCKS: usize = 4;

/// The largest quantised magnitude.
const QMAX: f32 = 127.0;

/// A `[k, n]` weight matrix quantised per column and packed for the kernel.
#[derive(Clone, Debug)]
pub(crate) struct PackedI8 {
    /// Rows of the matrix (the products' inner dimension).
    k: usize,
    /// `k` rounded up to a multiple of 4 (the instruction's group of four products).
    k4: usize,
    /// Columns.
    n: usize,
    /// `[blocks][k4 / 4][BLOCK][4]`: a block's four consecutive rows of sixteen columns are
    /// one 64-byte load.
    data: Vec<i8>,
    /// Per column (padded to whole blocks with zeros): the value of one quantum.
    scale: Vec<f32>,
    /// Per column (padded likewise): `128 · Σ_k q[k, j]`.
    offset: Vec<i32>,
}

impl PackedI8 {
    /// Quantises and packs the row-major `[k, n]` matrix `w`.
    ///
    /// # Panics
    /// When `w` does not hold `k · n` values (a caller's bug).
    pub(crate) fn new(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n);
        let k4 = k.div_ceil(4) * 4;
        let blocks = n.div_ceil(BLOCK);
        let mut data = vec![0i8; blocks * k4 * BLOCK];
        let mut scale = vec![0.0f32; blocks * BLOCK];
        let mut offset = vec![0i32; blocks * BLOCK];
        for j in 0..n {
            let max = (0..k).map(|r| w[r * n + j].abs()).fold(0.0f32, f32::max);
            if max == 0.0 {
                continue;
            }
            let inv = QMAX / max;
            scale[j] = max / QMAX;
            let (b, c) = (j / BLOCK, j % BLOCK);
            let mut sum = 0i32;
            for r in 0..k {
                let q = (w[r * n + j] * inv).round_ties_even().clamp(-QMAX, QMAX) as i8;
                sum += i32::from(q);
                data[(b * k4 + (r / 4) * 4) * BLOCK + c * 4 + r % 4] = q;
            }
            offset[j] = 128 * sum;
        }
        Self {
            k,
            k4,
            n,
            data,
            scale,
            offset,
        }
    }
}

/// Activation rows quantised for [`matmul_add`] (buffers reused across calls).
#[derive(Clone, Debug, Default)]
pub(crate) struct QuantRows {
    /// `[m, k4]`: `q + 128`, the padding columns 128 (a zero).
    data: Vec<u8>,
    /// `[m]`: the value of one quantum per row.
    scale: Vec<f32>,
    k4: usize,
}

/// Quantises the `m` rows of the row-major `[m, k]` matrix `a` for products with `w`
/// (inlined into the caller's SIMD context, where the rounding is one instruction).
#[inline(always)]
pub(crate) fn quantize_rows(a: &[f32], m: usize, w: &PackedI8, q: &mut QuantRows) {
    let (k, k4) = (w.k, w.k4);
    debug_assert!(a.len() >= m * k);
    q.k4 = k4;
    q.data.clear();
    q.data.resize(m * k4, 128);
    q.scale.clear();
    q.scale.resize(m, 0.0);
    for ((row, out), scale) in a[..m * k]
        .chunks(k)
        .zip(q.data.chunks_mut(k4))
        .zip(q.scale.iter_mut())
    {
        let max = max_abs(row);
        if max == 0.0 {
            continue;
        }
        let inv = QMAX / max;
        *scale = max / QMAX;
        for (o, v) in out.iter_mut().zip(row) {
            // round_ties_even(x) + 128 in [1, 255]: adding 2^23 + 128 rounds the sum to an
            // integer (ties to even) in the low mantissa bits, one add instead of a rounding
            // and a saturating conversion.
            *o = ((v * inv).clamp(-QMAX, QMAX) + 8_388_736.0).to_bits() as u8;
        }
    }
}

/// The largest `|v|` of `row` (0 when empty), in 16 lanes so that it vectorises (the largest
/// value is exact whatever the order it is found in).
#[inline(always)]
fn max_abs(row: &[f32]) -> f32 {
    let mut acc = [0.0f32; BLOCK];
    let chunks = row.chunks_exact(BLOCK);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            let v = v.abs();
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter()
        .chain(tail)
        .fold(0.0, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// `out[r, j] += Σ_k a[r, k] · w[k, j]` over the quantised values (`out` row-major
/// `[m, w.cols()]`, `a` quantised for `w` by [`quantize_rows`]).
///
/// # Panics
/// When the buffers do not match `m` and `w` (a caller's bug).
pub(crate) fn matmul_add(out: &mut [f32], a: &QuantRows, w: &PackedI8, m: usize) {
    assert!(out.len() >= m * w.n && a.scale.len() >= m && a.k4 == w.k4);
    #[cfg(target_arch = "x86_64")]
    if vnni() {
        // SAFETY: the CPU has the instructions (checked above), and the buffers hold the
        // rows and columns `vnni::product` reads and writes (asserted above).
        #[allow(unsafe_code)]
        unsafe {
            vnni::product(out, a, w, m);
        }
        return;
    }
    portable(out, a, w, m);
}

/// Whether this CPU runs the VNNI kernel.
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// [`matmul_add`] without SIMD intrinsics: the same integer sums, the same scaling step.
pub(crate) fn portable(out: &mut [f32], a: &QuantRows, w: &PackedI8, m: usize) {
    let (n, k4) = (w.n, w.k4);
    let mut acc = [0i32; BLOCK];
    for r in 0..m {
        let row = &a.data[r * k4..(r + 1) * k4];
        for b in 0..n.div_ceil(BLOCK) {
            acc.fill(0);
            let packed = &w.data[b * k4 * BLOCK..(b + 1) * k4 * BLOCK];
            for (group, wq) in row.chunks_exact(4).zip(packed.chunks_exact(4 * BLOCK)) {
                for (s, wc) in acc.iter_mut().zip(wq.chunks_exact(4)) {
                    *s += group
                        .iter()
                        .zip(wc)
                        .map(|(&x, &y)| i32::from(x) * i32::from(y))
                        .sum::<i32>();
                }
            }
            for (c, &s) in acc.iter().enumerate() {
                let j = b * BLOCK + c;
                if j >= n {
                    break;
                }
                let o = &mut out[r * n + j];
                *o = ((s - w.offset[j]) as f32).mul_add(a.scale[r] * w.scale[j], *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni {
    use std::arch::x86_64::*;

    use super::{BLOCK, PackedI8, QuantRows, TILE_BLOCKS, TILE_ROWS};

    /// The whole product, tile by tile.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `out` holds `m` rows of `w.n` columns, `a` `m`
    /// rows of `w.k4` quantised values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn product(out: &mut [f32], a: &QuantRows, w: &PackedI8, m: usize) {
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(TILE_ROWS);
            // SAFETY: rows r..r + rows exist in `out` and `a` (the caller's contract).
            unsafe {
                match rows {
                    6 => row_tile::<6>(out, a, w, r),
                    5 => row_tile::<5>(out, a, w, r),
                    4 => row_tile::<4>(out, a, w, r),
                    3 => row_tile::<3>(out, a, w, r),
                    2 => row_tile::<2>(out, a, w, r),
                    _ => row_tile::<1>(out, a, w, r),
                }
            }
            r += rows;
        }
    }

    /// Rows `r..r + R` across every column.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn row_tile<const R: usize>(out: &mut [f32], a: &QuantRows, w: &PackedI8, r: usize) {
        let blocks = w.n.div_ceil(BLOCK);
        let mut b = 0;
        while b < blocks {
            let c = (blocks - b).min(TILE_BLOCKS);
            // SAFETY: blocks b..b + c exist in `w`; rows as the caller's.
            unsafe {
                match c {
                    4 => tile::<R, 4>(out, a, w, r, b),
                    3 => tile::<R, 3>(out, a, w, r, b),
                    2 => tile::<R, 2>(out, a, w, r, b),
                    _ => tile::<R, 1>(out, a, w, r, b),
                }
            }
            b += c;
        }
    }

    /// Rows `r..r + R` by column blocks `b..b + C`: `R · C` sums in registers over the whole
    /// inner dimension, then scaled onto `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile<const R: usize, const C: usize>(
        out: &mut [f32],
        a: &QuantRows,
        w: &PackedI8,
        r: usize,
        b: usize,
    ) {
        let (k4, n) = (w.k4, w.n);
        let mut acc = [[_mm512_setzero_si512(); C]; R];
        let wp = w.data.as_ptr();
        let ap = a.data.as_ptr();
        // SAFETY (every pointer below): rows r..r + R of `a` hold k4 bytes each; blocks
        // b..b + C of `w` hold k4 * BLOCK bytes each; the loads stay inside them.
        for g in 0..k4 / 4 {
            let mut wv = [_mm512_setzero_si512(); C];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = unsafe { _mm512_loadu_si512(wp.add(((b + c) * k4 + g * 4) * BLOCK).cast()) };
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let x =
                    unsafe { std::ptr::read_unaligned(ap.add((r + i) * k4 + g * 4).cast::<i32>()) };
                let x = _mm512_set1_epi32(x);
                for (s, v) in row.iter_mut().zip(&wv) {
                    *s = _mm512_dpbusd_epi32(*s, x, *v);
                }
            }
        }
        let op = out.as_mut_ptr();
        for c in 0..C {
            let j = (b + c) * BLOCK;
            let valid = (n - j).min(BLOCK);
            let mask: __mmask16 = if valid == BLOCK {
                0xffff
            } else {
                (1u16 << valid) - 1
            };
            // SAFETY: scale and offset are padded to whole blocks.
            let (sw, off) = unsafe {
                (
                    _mm512_loadu_ps(w.scale.as_ptr().add(j)),
                    _mm512_loadu_si512(w.offset.as_ptr().add(j).cast()),
                )
            };
            for (i, row) in acc.iter().enumerate() {
                let s = _mm512_mul_ps(_mm512_set1_ps(a.scale[r + i]), sw);
                let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(row[c], off));
                // SAFETY: the mask keeps the access inside row r + i's n columns.
                unsafe {
                    let p = op.add((r + i) * n + j);
                    let o = _mm512_maskz_loadu_ps(mask, p);
                    _mm512_mask_storeu_ps(p, mask, _mm512_fmadd_ps(v, s, o));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_tree::rng::SplitMix;

    fn random(len: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = SplitMix(seed);
        (0..len).map(|_| rng.normal() * scale).collect()
    }

    /// The kernel and the portable loop give the same bits on every tile shape (rows 1-13,
    /// columns that end mid-block, an inner dimension that is not a multiple of four), and
    /// both are close to the f32 product.
    #[test]
    fn the_kernel_matches_the_portable_loop_bit_for_bit() {
        for (m, k, n) in [
            (1, 4, 16),
            (7, 130, 40),
            (13, 128, 384),
            (32, 512, 128),
            (6, 3, 5),
        ] {
            let w = random(k * n, 1 + m as u64, 0.1);
            let a = random(m * k, 2 + n as u64, 1.0);
            let packed = PackedI8::new(&w, k, n);
            let mut q = QuantRows::default();
            quantize_rows(&a, m, &packed, &mut q);
            let base = random(m * n, 3, 1.0);
            let mut fast = base.clone();
            matmul_add(&mut fast, &q, &packed, m);
            let mut slow = base.clone();
            portable(&mut slow, &q, &packed, m);
            assert!(
                fast.iter()
                    .zip(&slow)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{k}x{n}"
            );
            for r in 0..m {
                for j in 0..n {
                    let exact: f32 = (0..k).map(|t| a[r * k + t] * w[t * n + j]).sum();
                    let err = (fast[r * n + j] - base[r * n + j] - exact).abs();
                    // Each side rounds to 1/254 of its largest magnitude.
                    let bound = 0.02 * (k as f32).sqrt() * 0.1 * 3.0;
                    assert!(err < bound, "{m}x{k}x{n} [{r}, {j}]: {err} > {bound}");
                }
            }
        }
    }

    #[test]
    fn the_quantised_values_are_the_rounded_scaled_ones() {
        let k = 37;
        let a: Vec<f32> = (0..k).map(|i| (i as f32 - 18.0) * 0.25 + 0.125).collect();
        let w = PackedI8::new(&vec![1.0; k], k, 1);
        let mut q = QuantRows::default();
        quantize_rows(&a, 1, &w, &mut q);
        let max = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(q.scale[0], max / QMAX);
        for (got, v) in q.data.iter().zip(&a) {
            let want = (v * (QMAX / max)).round_ties_even() as i32 + 128;
            assert_eq!(i32::from(*got), want, "{v}");
        }
        assert!(q.data[k..].iter().all(|&v| v == 128), "padding is zero");
    }

    #[test]
    fn zero_rows_and_columns_add_nothing() {
        let (m, k, n) = (3, 8, 20);
        let mut w = random(k * n, 5, 1.0);
        for r in 0..k {
            w[r * n + 7] = 0.0;
        }
        let mut a = random(m * k, 6, 1.0);
        a[k..2 * k].fill(0.0);
        let packed = PackedI8::new(&w, k, n);
        let mut q = QuantRows::default();
        quantize_rows(&a, m, &packed, &mut q);
        let mut out = vec![1.5f32; m * n];
        matmul_add(&mut out, &q, &packed, m);
        assert!(out[n..2 * n].iter().all(|&v| v == 1.5), "the zero row");
        assert!((0..m).all(|r| out[r * n + 7] == 1.5), "the zero column");
    }
}
