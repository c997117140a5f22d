//! Branch-free `exp` and `erf` in `f32` for the host kernels (the target's output layer and
//! SwiGLU in `spot-models`, the drafter networks in `spot-drafter`).
//!
//! Written without branches or library calls so that a loop over them vectorises when it is
//! compiled for a wide SIMD target (inside a `pulp` dispatch, say); each is a pure function of
//! its argument, so a value never depends on the batch around it.

/// `exp(x)` for `x <= 0` in f32 (relative error about 2e-7; 0 below -87, and for `-inf`),
/// branch-free so that loops over it vectorise.
///
/// ```
/// use spot_core::fastmath::fast_exp;
/// assert!((fast_exp(-1.5) - (-1.5f32).exp()).abs() < 1e-7);
/// assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
/// ```
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let under = x < -87.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    // exp(r) on [-ln2/2, ln2/2]: Cephes' degree-5 polynomial.
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let e = p * r * r + r + 1.0;
    // 2^n from the exponent bits: n + 127 is an integer in [1, 255] here (n >= -126 above,
    // n <= 128 below the overflow), which adding 2^23 leaves in the low mantissa bits (what
    // `n as i32` computes, without the saturating conversion's checks, which kept the loops
    // around this function from vectorising).
    let scale = f32::from_bits(((n + 8_388_735.0).to_bits() & 0xff) << 23);
    if under { 0.0 } else { e * scale }
}

/// `erf(x)` in f32: a rational function of `x` clamped to `[-4, 4]` (odd numerator of degree
/// 13, even denominator of degree 8, the usual single-precision fit), within 4e-7 of libm's
/// `erff`; branch-free so that loops over it vectorise.
///
/// ```
/// use spot_core::fastmath::fast_erf;
/// assert!((fast_erf(0.5) - 0.520_499_9).abs() < 4e-7);
/// assert!((fast_erf(9.0) - 1.0).abs() < 4e-7);
/// ```
#[inline(always)]
pub fn fast_erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = -2.726_142_3e-10_f32;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 - 2.101_024e-6;
    let p = p * x2 - 5.692_506_4e-5;
    let p = p * x2 - 7.349_906_3e-4;
    let p = p * x2 - 2.954_6e-3;
    let p = p * x2 - 1.609_603_3e-2;
    let q = -1.456_607_2e-5_f32;
    let q = q * x2 - 2.133_740_6e-4;
    let q = q * x2 - 1.682_827e-3;
    let q = q * x2 - 7.373_329e-3;
    let q = q * x2 - 1.426_474e-2;
    (x * p / q).clamp(-1.0, 1.0)
}

/// `silu(x) = x / (1 + e^-x)` from `e = fast_exp(-|x|)`, which never overflows: `x / (1 + e)`
/// for `x >= 0`, `x · e / (1 + e)` below (relative error about 2e-7). SwiGLU's gate in the
/// host kernels.
///
/// ```
/// use spot_core::fastmath::fast_silu;
/// let x = 1.25f64;
/// assert!((f64::from(fast_silu(1.25)) - x / (1.0 + (-x).exp())).abs() < 1e-6);
/// assert_eq!(fast_silu(-f32::MAX), 0.0);
/// ```
#[inline(always)]
pub fn fast_silu(x: f32) -> f32 {
    let e = fast_exp(-x.abs());
    let num = if x >= 0.0 { x } else { x * e };
    num / (1.0 + e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_close() {
        for i in 0..=1740 {
            let x = -(i as f32) * 0.05;
            let (a, b) = (fast_exp(x), x.exp());
            assert!((a - b).abs() <= 3e-7 * b.max(1e-30), "{x}: {a} vs {b}");
        }
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
    }

    /// The exponent bits come out as the integer conversion made them, so every value is
    /// the one the kernels (the target's output layer among them) computed before.
    #[test]
    fn the_exponent_bits_are_the_integer_conversions() {
        for n in -126..=128 {
            let f = n as f32;
            assert_eq!((f + 8_388_735.0).to_bits() & 0xff, (n + 127) as u32, "{n}");
        }
        let mut x = 0.0f32;
        while x > -88.0 {
            let n = (x.max(-87.0) * std::f32::consts::LOG2_E + 0.5).floor();
            let before = f32::from_bits((((n as i32) + 127) as u32) << 23);
            assert_eq!(
                f32::from_bits(((n + 8_388_735.0).to_bits() & 0xff) << 23),
                before
            );
            x = f32::from_bits(x.to_bits() + 4099).min(x - 1e-3);
        }
    }

    #[test]
    fn fast_erf_is_odd_bounded_and_nearly_monotone() {
        let mut last = -1.0f32;
        for i in -40_000..=40_000 {
            let x = i as f32 * 2e-4;
            let y = fast_erf(x);
            assert_eq!(y, -fast_erf(-x));
            // Within the fit's error (4e-7) of monotone.
            assert!(y >= last - 4e-7 && y.abs() <= 1.0, "{x}: {y}");
            last = y;
        }
        // Reference values (erf to 9 digits).
        for (x, want) in [
            (0.1f32, 0.112_462_92f32),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
        ] {
            assert!((fast_erf(x) - want).abs() < 4e-7, "{x}");
        }
    }
}
