//! Bidirectional attention within each block state, for the order network's encoder layers
//! and the token module's decoder layer.
//!
//! Three paths compute every value by the same operations in the same order, so they agree bit
//! for bit (tested): a general loop over buffers for any shape; the shipped shapes (32
//! positions; 16 values per head in the order network, 64 in the token module) with their
//! sizes known to the compiler; and, on CPUs with AVX-512, the shipped shapes with every query
//! of a head at once ([`avx512`]).

use spot_core::fastmath::fast_exp;

use super::{max, sum};

/// Bidirectional grouped-query attention within each state of `len` rows: `qkv`
/// `[rows, (heads + 2 kv) d]` (queries, keys, values, heads contiguous), `ctx`
/// `[rows, heads · d]`. Query head `i` reads KV head `i / (heads / kv)`; `kv == heads` is the
/// order network's multi-head attention.
#[inline(always)]
pub(super) fn grouped_attention(
    qkv: &[f32],
    ctx: &mut [f32],
    (len, heads, kv, d): (usize, usize, usize, usize),
    kt: &mut Vec<f32>,
    row: &mut Vec<f32>,
) {
    let w = (heads + 2 * kv) * d;
    let states = qkv.len() / (w * len);
    let shape = Shape {
        states,
        heads,
        kv,
        w,
    };
    if len == 32 {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() && matches!(d, 16 | 64) {
            // SAFETY: the CPU has AVX-512 F (checked); `qkv` holds `states` states of 32 rows
            // of `w` values and `ctx` their `heads · d`-wide outputs (checked inside).
            #[allow(unsafe_code)]
            unsafe {
                match d {
                    16 => avx512::heads::<16>(qkv, ctx, shape),
                    _ => avx512::heads::<64>(qkv, ctx, shape),
                }
            }
            return;
        }
        match d {
            16 => return tiles::<16>(qkv, ctx, shape),
            64 => return tiles::<64>(qkv, ctx, shape),
            _ => {}
        }
    }
    general(qkv, ctx, shape, (len, d), (kt, row));
}

/// Where a call's states sit in its buffers.
#[derive(Clone, Copy)]
struct Shape {
    states: usize,
    heads: usize,
    kv: usize,
    /// Row width of `qkv`.
    w: usize,
}

/// Where one head of one state sits in the buffers.
#[derive(Clone, Copy)]
struct Tile {
    /// The state's first row.
    base: usize,
    /// Row width of `qkv`.
    w: usize,
    /// Offsets in a `qkv` row of the head's query, key and value.
    q: usize,
    k: usize,
    v: usize,
    /// Row width of `ctx` (the head's output goes to offset `q` of its row).
    cw: usize,
}

impl Shape {
    /// The tiles of every state and head, state by state, `DK` values a head.
    fn tiles<const DK: usize>(self) -> impl Iterator<Item = Tile> {
        let Shape { heads, kv, w, .. } = self;
        (0..self.states * heads).map(move |i| {
            let (state, hd) = (i / heads, i % heads);
            let g = hd / (heads / kv);
            Tile {
                base: state * 32,
                w,
                q: hd * DK,
                k: (heads + g) * DK,
                v: (heads + kv + g) * DK,
                cw: heads * DK,
            }
        })
    }
}

/// Any shape: one query at a time over a transposed key buffer.
#[inline(always)]
fn general(
    qkv: &[f32],
    ctx: &mut [f32],
    Shape {
        states,
        heads,
        kv,
        w,
    }: Shape,
    (len, d): (usize, usize),
    (kt, row): (&mut Vec<f32>, &mut Vec<f32>),
) {
    let group = heads / kv;
    let scale = (d as f32).sqrt();
    kt.resize(d * len, 0.0);
    row.resize(len, 0.0);
    for state in 0..states {
        let base = state * len;
        for g in 0..kv {
            let (ko, vo) = ((heads + g) * d, (heads + kv + g) * d);
            for b in 0..len {
                for (j, &v) in qkv[(base + b) * w + ko..][..d].iter().enumerate() {
                    kt[j * len + b] = v;
                }
            }
            for hd in g * group..(g + 1) * group {
                for a in 0..len {
                    let q = &qkv[(base + a) * w + hd * d..][..d];
                    row.fill(0.0);
                    for (j, &qj) in q.iter().enumerate() {
                        let kj = &kt[j * len..(j + 1) * len];
                        row.iter_mut().zip(kj).for_each(|(r, k)| *r += qj * k);
                    }
                    softmax_row(row, scale);
                    let c = &mut ctx[(base + a) * heads * d + hd * d..][..d];
                    c.fill(0.0);
                    for (b, &p) in row.iter().enumerate() {
                        let v = &qkv[(base + b) * w + vo..][..d];
                        c.iter_mut().zip(v).for_each(|(c, v)| *c += p * v);
                    }
                }
            }
        }
    }
}

/// 32 positions, `DK` values a head, without intrinsics: one query at a time with its scores
/// and output in registers.
#[inline(always)]
fn tiles<const DK: usize>(qkv: &[f32], ctx: &mut [f32], shape: Shape) {
    const L: usize = 32;
    let scale = (DK as f32).sqrt();
    for t in shape.tiles::<DK>() {
        let mut kt = [[0.0f32; L]; DK];
        for b in 0..L {
            let k = &qkv[(t.base + b) * t.w + t.k..][..DK];
            for (j, &v) in k.iter().enumerate() {
                kt[j][b] = v;
            }
        }
        for a in 0..L {
            let q = &qkv[(t.base + a) * t.w + t.q..][..DK];
            let mut row = [0.0f32; L];
            for (&qj, kj) in q.iter().zip(&kt) {
                row.iter_mut().zip(kj).for_each(|(r, k)| *r += qj * k);
            }
            softmax_row(&mut row, scale);
            let mut c = [0.0f32; DK];
            for (b, &p) in row.iter().enumerate() {
                let v = &qkv[(t.base + b) * t.w + t.v..][..DK];
                c.iter_mut().zip(v).for_each(|(c, v)| *c += p * v);
            }
            ctx[(t.base + a) * t.cw + t.q..][..DK].copy_from_slice(&c);
        }
    }
}

/// A query's attention weights from its raw scores: each divided by `scale`, then the
/// softmax.
#[inline(always)]
fn softmax_row(row: &mut [f32], scale: f32) {
    row.iter_mut().for_each(|r| *r /= scale);
    let m = max(row);
    row.iter_mut().for_each(|r| *r = fast_exp(*r - m));
    let inv = 1.0 / sum(row);
    row.iter_mut().for_each(|r| *r *= inv);
}

/// The shipped shapes with AVX-512: every query of a head at once. The scores are kept
/// transposed (a key's two registers hold the 32 queries' scores), so the softmax's maxima
/// and sums run across queries in vector lanes instead of along one query's row, and the sums
/// of products are independent of their neighbours. Each value is still computed by
/// [`general`]'s operations in its order: a score sums `q_j · k_j` over `j` from 0; the
/// softmax divides by the scale, subtracts the largest score, exponentiates
/// ([`fast_exp`]'s steps, lane by lane) and sums in [`sum`]'s order (lane `i` of 16 partial
/// sums takes elements `i` and `i + 16`, then the lanes are added in order); an output sums
/// `p_b · v_b` over `b` from 0.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Shape, Tile};

    /// Whether this CPU runs this path.
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// Every head of every state.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn heads<const DK: usize>(qkv: &[f32], ctx: &mut [f32], shape: Shape) {
        assert!(
            qkv.len() >= shape.states * 32 * shape.w
                && ctx.len() >= shape.states * 32 * shape.heads * DK
        );
        for t in shape.tiles::<DK>() {
            // SAFETY: AVX-512 F (the caller's contract); the tile's rows lie in the buffers
            // (asserted above).
            unsafe { head::<DK>(qkv, ctx, t) };
        }
    }

    /// `exp` of 16 lanes, each as [`spot_core::fastmath::fast_exp`] computes it.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn exp(x: __m512) -> __m512 {
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
        let t = _mm512_add_ps(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            _mm512_set1_ps(0.5),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(t);
        let r = _mm512_sub_ps(
            _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693_359_4))),
            _mm512_mul_ps(n, _mm512_set1_ps(-2.121_944_4e-4)),
        );
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            5e-1,
        ] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
        }
        let e = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
            _mm512_set1_ps(1.0),
        );
        let bits = _mm512_castps_si512(_mm512_add_ps(n, _mm512_set1_ps(8_388_735.0)));
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_and_si512(
            bits,
            _mm512_set1_epi32(0xff),
        )));
        _mm512_maskz_mul_ps(!under, e, scale)
    }

    /// [`exp`] of 16 values (tests).
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `x` and `out` hold at least 16 values.
    #[cfg(test)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_16(x: &[f32], out: &mut [f32]) {
        assert!(x.len() >= 16 && out.len() >= 16);
        // SAFETY: 16 values each (asserted).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp(_mm512_loadu_ps(x.as_ptr()))) };
    }

    /// One head of one state.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; rows `t.base..t.base + 32` of `qkv` (width `t.w`) and of
    /// `ctx` (width `t.cw`) exist, and the head's offsets plus `DK` fit in them.
    #[target_feature(enable = "avx512f")]
    unsafe fn head<const DK: usize>(qkv: &[f32], ctx: &mut [f32], t: Tile) {
        const L: usize = 32;
        let row = |b: usize, o: usize| &qkv[(t.base + b) * t.w + o..][..DK];
        // `qt[j]`: the 32 queries' value `j`.
        let mut qt = [[0.0f32; L]; DK];
        #[allow(clippy::needless_range_loop)] // a transpose: `a` indexes rows and columns
        for a in 0..L {
            for (j, &v) in row(a, t.q).iter().enumerate() {
                qt[j][a] = v;
            }
        }
        let load = |v: &[f32; L]| {
            // SAFETY: 32 values, two unaligned loads of 16.
            unsafe {
                [
                    _mm512_loadu_ps(v.as_ptr()),
                    _mm512_loadu_ps(v.as_ptr().add(16)),
                ]
            }
        };
        // `st[b]`: the 32 queries' scores (then weights) for key `b`, four keys at a time.
        let mut st = [[_mm512_setzero_ps(); 2]; L];
        for b0 in (0..L).step_by(4) {
            let mut acc = [[_mm512_setzero_ps(); 2]; 4];
            let keys = [
                row(b0, t.k),
                row(b0 + 1, t.k),
                row(b0 + 2, t.k),
                row(b0 + 3, t.k),
            ];
            for (j, qj) in qt.iter().enumerate() {
                let q = load(qj);
                for (acc, k) in acc.iter_mut().zip(&keys) {
                    let kj = _mm512_set1_ps(k[j]);
                    acc[0] = _mm512_add_ps(acc[0], _mm512_mul_ps(q[0], kj));
                    acc[1] = _mm512_add_ps(acc[1], _mm512_mul_ps(q[1], kj));
                }
            }
            st[b0..b0 + 4].copy_from_slice(&acc);
        }
        let scale = _mm512_set1_ps((DK as f32).sqrt());
        let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); 2];
        for s in st.iter_mut() {
            for (s, m) in s.iter_mut().zip(max.iter_mut()) {
                *s = _mm512_div_ps(*s, scale);
                *m = _mm512_max_ps(*s, *m);
            }
        }
        for s in st.iter_mut() {
            for (s, m) in s.iter_mut().zip(&max) {
                *s = exp(_mm512_sub_ps(*s, *m));
            }
        }
        let mut total = [_mm512_setzero_ps(); 2];
        for i in 0..16 {
            for (h, total) in total.iter_mut().enumerate() {
                let lane =
                    _mm512_add_ps(_mm512_add_ps(_mm512_setzero_ps(), st[i][h]), st[i + 16][h]);
                *total = _mm512_add_ps(*total, lane);
            }
        }
        let inv = total.map(|t| _mm512_div_ps(_mm512_set1_ps(1.0), t));
        for s in st.iter_mut() {
            for (s, i) in s.iter_mut().zip(&inv) {
                *s = _mm512_mul_ps(*s, *i);
            }
        }
        // `ct[j]`: the 32 queries' output `j`.
        let mut ct = [[_mm512_setzero_ps(); 2]; DK];
        for (b, p) in st.iter().enumerate() {
            for (c, &v) in ct.iter_mut().zip(row(b, t.v)) {
                let v = _mm512_set1_ps(v);
                c[0] = _mm512_add_ps(c[0], _mm512_mul_ps(p[0], v));
                c[1] = _mm512_add_ps(c[1], _mm512_mul_ps(p[1], v));
            }
        }
        let mut out = [[0.0f32; L]; DK];
        for (o, c) in out.iter_mut().zip(&ct) {
            // SAFETY: 32 values, two unaligned stores of 16.
            unsafe {
                _mm512_storeu_ps(o.as_mut_ptr(), c[0]);
                _mm512_storeu_ps(o.as_mut_ptr().add(16), c[1]);
            }
        }
        for a in 0..L {
            for (j, c) in ctx[(t.base + a) * t.cw + t.q..][..DK]
                .iter_mut()
                .enumerate()
            {
                *c = out[j][a];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spot_tree::rng::SplitMix;

    /// The shipped shapes' paths (the order network's 8 heads of 16; the token module's 4
    /// query heads of 64 over 2 KV heads) are the general loop's, bit for bit: the portable
    /// one always, the AVX-512 one where the CPU has it.
    #[test]
    fn the_fixed_shape_paths_are_the_general_one_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if !avx512::available() {
            eprintln!("SKIP (AVX-512 part): this CPU has no AVX-512 F; the portable path only");
        }
        let mut rng = SplitMix(11);
        for (n, heads, kv, d) in [(3, 8, 8, 16), (2, 4, 2, 64), (1, 4, 4, 64)] {
            let (l, w) = (32, (heads + 2 * kv) * d);
            let qkv: Vec<f32> = (0..n * l * w).map(|_| rng.normal() * 2.0).collect();
            let size = n * l * heads * d;
            let (mut want, mut fixed, mut any) =
                (vec![0.0; size], vec![0.0; size], vec![0.0; size]);
            let (mut kt, mut row) = (Vec::new(), Vec::new());
            let tiled = Shape {
                states: n,
                heads,
                kv,
                w,
            };
            general(&qkv, &mut want, tiled, (l, d), (&mut kt, &mut row));
            grouped_attention(&qkv, &mut fixed, (l, heads, kv, d), &mut kt, &mut row);
            match d {
                16 => tiles::<16>(&qkv, &mut any, tiled),
                _ => tiles::<64>(&qkv, &mut any, tiled),
            }
            let same = |x: &[f32]| x.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same(&fixed),
                "dispatched path: {heads} heads of {d} over {kv}"
            );
            assert!(same(&any), "portable path: {heads} heads of {d} over {kv}");
            assert!(want.iter().all(|&v| v != 0.0));
        }
    }

    /// The AVX-512 `exp` is [`fast_exp`] lane by lane, underflow and the clamp included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(unsafe_code)]
    fn the_vector_exp_is_the_scalar_one() {
        if !avx512::available() {
            eprintln!("SKIP: this CPU has no AVX-512 F");
            return;
        }
        let mut xs: Vec<f32> = (-200_000..=20_000).map(|i| i as f32 * 5e-4).collect();
        xs.extend([
            -87.0, -87.000_01, -86.999_99, -1e30, 0.0, -0.0, 1e-30, -1e-30,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 0.0);
        for chunk in xs.chunks_exact(16) {
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512 F checked above; 16 values in and out.
            unsafe { avx512::exp_16(chunk, &mut got) };
            for (x, g) in chunk.iter().zip(&got) {
                assert_eq!(g.to_bits(), fast_exp(*x).to_bits(), "exp({x})");
            }
        }
    }
}
