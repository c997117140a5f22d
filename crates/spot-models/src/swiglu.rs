//! SwiGLU's gate `silu(g) · u` on the host, for the CPU backends.
//!
//! The CPU backends evaluate `silu` element by element through the C library's scalar `expf`
//! and then multiply in two more passes; on the shipped target that was about a tenth of a
//! decode. Here it is one pass in the widest SIMD the CPU has, with the branch-free `exp` of the
//! host head (relative error about 2e-7). Element-wise, so a row's values do not depend on the
//! batch.

use spot_core::fastmath::fast_silu as silu;

/// `g[i] = silu(g[i]) · u[i]` (`silu(x) = x / (1 + e^-x)`), in place.
pub(crate) fn swiglu_in_place(g: &mut [f32], u: &[f32]) {
    pulp::Arch::new().dispatch(Gate { g, u });
}

struct Gate<'a> {
    g: &'a mut [f32],
    u: &'a [f32],
}

impl pulp::WithSimd for Gate<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _: V) {
        for (x, &u) in self.g.iter_mut().zip(self.u) {
            *x = silu(*x) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_matches_silu_in_f64() {
        let g: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.05).collect();
        let u: Vec<f32> = (0..4001).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut out = g.clone();
        swiglu_in_place(&mut out, &u);
        for ((&x, &u), &y) in g.iter().zip(&u).zip(&out) {
            let x64 = f64::from(x);
            let want = x64 / (1.0 + (-x64).exp()) * f64::from(u);
            // Relative 1e-6; below e^-87 the gate flushes to zero (values under 1e-30).
            let err = (f64::from(y) - want).abs();
            assert!(
                err <= 1e-6 * want.abs() + 1e-30,
                "silu({x}) * {u}: {y} vs {want}"
            );
        }
        // Extremes: no overflow, no NaN.
        let mut ext = [f32::MAX, -f32::MAX, 100.0, -100.0, 0.0, -0.0];
        swiglu_in_place(&mut ext, &[1.0; 6]);
        assert_eq!(ext[0], f32::MAX);
        assert_eq!(ext[1], 0.0);
        assert_eq!(ext[2], 100.0);
        assert!(ext[3].abs() < 1e-40 && ext[3] <= 0.0);
        assert_eq!(ext[4], 0.0);
    }
}
