//! The coupled Gumbel noise table `G[a, v]`.
//!
//! Sampling at temperature `T > 0` uses the Gumbel-max trick: the token at absolute position
//! `a` is `argmax_v(logit_a(v) / T + G[a, v])`. SPOT's verifier needs the draft-free decoder
//! and every tree node to see the *same* `G`, whatever order positions are decoded in and
//! whichever batch a state is verified in. So `G[a, v]` is a pure function of
//! `(seed, a, v)`: a counter-based generator, never a sequential stream.
//!
//! # The exact function
//!
//! Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND and JAX) with key
//! `[seed as u32, (seed >> 32) as u32]` and counter `[v / 4, a as u32, (a >> 32) as u32, 0]`
//! yields four 32-bit words; word `v % 4` is `x`. Then `u = (x + 0.5) / 2^32` (in f64, so
//! `0 < u < 1`) and `G = -ln(-ln(u))`, rounded to f32. Any implementation (CPU or GPU) that
//! follows these steps reproduces the table; GPU code may differ from this reference in the
//! last bit of the logarithm, which is harmless as long as draft-free and speculative
//! decoding run on the same device.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds: maps a 128-bit counter and 64-bit key to 128 random bits.
///
/// ```
/// // Known-answer vector from the Random123 distribution.
/// assert_eq!(
///     spot_core::noise::philox4x32_10([0; 4], [0; 2]),
///     [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
/// );
/// ```
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The noise table `G[a, v]` for one seed. Cheap to copy; holds no state.
///
/// ```
/// use spot_core::GumbelNoise;
/// let g = GumbelNoise::new(42);
/// // A pure function of (seed, position, token): order of evaluation does not matter.
/// let x = g.value(1000, 17);
/// let mut row = vec![0.0f32; 32];
/// g.fill_row(1000, &mut row);
/// assert_eq!(row[17], x);
/// assert_ne!(GumbelNoise::new(43).value(1000, 17), x);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GumbelNoise {
    seed: u64,
}

impl GumbelNoise {
    /// The table for `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The seed.
    pub const fn seed(&self) -> u64 {
        self.seed
    }

    fn key(&self) -> [u32; 2] {
        [self.seed as u32, (self.seed >> 32) as u32]
    }

    fn words(&self, position: u64, quad: u32) -> [u32; 4] {
        philox4x32_10(
            [quad, position as u32, (position >> 32) as u32, 0],
            self.key(),
        )
    }

    /// `G[position, token]`: a standard Gumbel value.
    pub fn value(&self, position: u64, token: u32) -> f32 {
        let w = self.words(position, token / 4);
        gumbel_from_bits(w[(token % 4) as usize])
    }

    /// Fills `out[v] = G[position, v]` for `v in 0..out.len()`, four tokens per Philox call.
    pub fn fill_row(&self, position: u64, out: &mut [f32]) {
        for (quad, chunk) in out.chunks_mut(4).enumerate() {
            let w = self.words(position, quad as u32);
            for (o, &x) in chunk.iter_mut().zip(w.iter()) {
                *o = gumbel_from_bits(x);
            }
        }
    }
}

/// Maps 32 uniform bits to a standard Gumbel value, as documented in the module.
pub fn gumbel_from_bits(x: u32) -> f32 {
    let u = (f64::from(x) + 0.5) / 4_294_967_296.0;
    (-(-u.ln()).ln()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answers() {
        // Random123 kat_vectors for philox4x32_10.
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn gumbel_moments() {
        // Mean of a standard Gumbel is the Euler-Mascheroni constant, variance pi^2/6.
        let g = GumbelNoise::new(7);
        let n = 200_000u32;
        let (mut s, mut s2) = (0f64, 0f64);
        for i in 0..n {
            let x = f64::from(g.value(u64::from(i / 64), i % 64));
            s += x;
            s2 += x * x;
        }
        let mean = s / f64::from(n);
        let var = s2 / f64::from(n) - mean * mean;
        assert!((mean - 0.577_215_66).abs() < 0.01, "mean {mean}");
        assert!((var - 1.644_934).abs() < 0.03, "var {var}");
    }

    #[test]
    fn gumbel_is_finite_at_extremes() {
        assert!(gumbel_from_bits(0).is_finite());
        assert!(gumbel_from_bits(u32::MAX).is_finite());
        assert!(gumbel_from_bits(0) < gumbel_from_bits(u32::MAX));
    }
}
