//! Small dense kernels for host inference of the workspace's drafters (the order network in
//! `spot-drafter`, the feature drafter in `spot-specdiff`): a matrix product accumulated in
//! place, and sums, dot products and maxima that vectorise.
//!
//! Sums run as [`LANES`] interleaved partial sums added in a fixed order: the plain fold is a
//! serial chain of scalar additions the compiler may not reorder, while this split of a row is
//! fixed, so a row's value depends on the row alone (never on what else is computed).

/// Lanes of the partial sums and maxima: a fixed split of a row, wide enough for the compiler
/// to keep them in one register.
pub const LANES: usize = 16;

/// `Σ x` as [`LANES`] interleaved partial sums added in a fixed order.
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// `Σ x·y` over two equally long slices, as [`sum`].
#[inline(always)]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (xc, yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (c, d) in xc.zip(yc) {
        for ((a, v), w) in acc.iter_mut().zip(c).zip(d) {
            *a += v * w;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The largest value of `x` (`-inf` when empty; NaN-free input).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// `out[m, n] += a[m, k] · b[k, n]`, all row-major, on the calling thread (the `gemm` crate,
/// which burn's CPU backend multiplies with too).
///
/// # Panics
///
/// If a slice's length is not its matrix's size (a caller's bug, never an input's).
#[allow(unsafe_code)]
pub fn matmul_add(out: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    assert!(out.len() == m * n && a.len() == m * k && b.len() == k * n);
    let (k_i, n_i) = (k as isize, n as isize);
    // SAFETY: the three slices hold exactly the row-major m x k, k x n and m x n matrices
    // (asserted above) that the strides describe; `out` is a unique borrow, so it aliases
    // neither input; `gemm` reads and writes nothing outside them.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n_i,
            true,
            a.as_ptr(),
            1,
            k_i,
            b.as_ptr(),
            1,
            n_i,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_agree_with_plain_loops() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        assert!((dot(&x, &y) - plain).abs() < 1e-5);
        assert!((sum(&x) - x.iter().sum::<f32>()).abs() < 1e-5);
        assert_eq!(max(&x), x.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        // [2, 3] · [3, 2] added onto ones.
        let (a, b) = (
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
        );
        let mut out = [1.0f32; 4];
        matmul_add(&mut out, &a, &b, 2, 3, 2);
        assert_eq!(out, [5.0, 6.0, 11.0, 12.0]);
    }
}
