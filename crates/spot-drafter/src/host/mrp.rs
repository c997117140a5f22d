//! The MRP token module's step on the host ([`HostMrp`]): the function
//! [`Mrp::step`](crate::mrp::Mrp::step) computes through burn, with its weights packed once
//! at load and no tensor library in the loop.
//!
//! Run through burn at the module's shapes (a few 32-row block states per call, one decoder
//! layer of the target's width), a step is some thirty operations, each with its own
//! allocation and pass over memory, and the projections run as the backend's matrix calls.
//! Here a step is one pass per stage: both input norms into one `[rows, 2h]` buffer, the
//! projection onto the layer's width, the query, key and value projections as one product, the
//! QK-norm and rotary embedding fused into one pass over each head, attention per state and
//! head over a transposed key tile, the gate and up projections as one product with the SiLU
//! gate fused into the pass that reads them, and the final norm.
//!
//! **Agreement.** In `f32` the same function up to float rounding: residuals within 2e-6 (relative to the largest) of
//! burn's on the shipped module (tests), and the same draft tokens on the benchmark prompts
//! except where two candidates nearly tie (`docs/drafter.md`). With [`Precision::Int8`] the five
//! products run on 8-bit integers as the order network's do ([`super::int8`]). Either way a
//! state's residuals depend on that state alone, not on the batch it is stepped in (tested bit
//! for bit), because every row goes through the same operations whatever the call holds.

use std::sync::Arc;

use rayon::iter::{IntoParallelIterator, ParallelIterator};
use spot_core::TokenId;
use spot_core::fastmath::fast_silu as silu;
use spot_models::hf::Weights;
use spot_models::{DecoderConfig, ModelError};

use super::attention::grouped_attention;
use super::int8::QuantRows;
use super::{Dense, MIN_PART, Precision, dot};

/// The target's embedding (the module's input) and untied head.
const EMBED: &str = "model.embed_tokens.weight";
const HEAD: &str = "lm_head.weight";

/// One decoder layer of the module, packed.
#[derive(Clone, Debug)]
struct Layer {
    input_norm: Vec<f32>,
    /// `[h, (heads + 2 kv_heads) · d]`: queries, keys, values side by side.
    qkv: Dense,
    /// `[d]` each.
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// `[heads · d, h]`.
    o: Dense,
    post_norm: Vec<f32>,
    /// `[h, 2 ffn]`: gate and up side by side.
    gate_up: Dense,
    /// `[ffn, h]`.
    down: Dense,
}

/// The shapes a step runs at.
#[derive(Clone, Copy, Debug)]
struct Shape {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    eps: f32,
}

/// Buffers one part of a step reuses across calls (grown to the largest call seen).
#[derive(Clone, Debug, Default)]
struct Part {
    /// `[rows, 2h]`: the two normalised inputs side by side.
    cat: Vec<f32>,
    /// `[rows, h]`: the residual stream.
    x: Vec<f32>,
    /// `[rows, h]`: a normalised copy of `x`.
    hn: Vec<f32>,
    /// `[rows, (heads + 2 kv) d]`.
    qkv: Vec<f32>,
    /// `[rows, heads · d]`.
    ctx: Vec<f32>,
    /// `[rows, 2 ffn]`.
    ff: Vec<f32>,
    /// `[rows, ffn]`.
    act: Vec<f32>,
    /// `[d, L]`: one KV head's keys, transposed.
    kt: Vec<f32>,
    /// `[L]`.
    row: Vec<f32>,
    quant: QuantRows,
}

/// What a caller of [`HostMrp::step`] keeps between calls: the buffers of each parallel part
/// and the rotary tables of the last block length. One per scorer (the packed module itself
/// is shared).
#[derive(Clone, Debug, Default)]
pub struct MrpBuffers {
    parts: Vec<Part>,
    /// Block length the tables below are for (0: none yet).
    len: usize,
    /// `[len, d]` each: `cos`, and `sin` with the rotation's sign (`-sin` on the first half).
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The MRP module (one or more Qwen3-shaped layers over the target's embedding) packed for
/// the host in `f32` or int8 ([`Precision`]). Immutable once built, so one copy serves every
/// decoder; each caller keeps its own [`MrpBuffers`].
#[derive(Clone, Debug)]
pub struct HostMrp {
    shape: Shape,
    /// `[vocab, h]`: the target's embedding (shared by the module's packings).
    embed: Arc<[f32]>,
    /// `[vocab, h]`: the target's head where it is not the embedding.
    head: Option<Arc<[f32]>>,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    /// `[2h, h]`.
    eh_proj: Dense,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    inv_freq: Vec<f64>,
    precision: Precision,
}

/// A PyTorch `[out, inp]` weight as the row-major `[inp, out]` matrix rows multiply.
fn transposed(w: &[f32], out: usize, inp: usize) -> Vec<f32> {
    let mut t = vec![0.0; w.len()];
    for o in 0..out {
        for i in 0..inp {
            t[i * out + o] = w[o * inp + i];
        }
    }
    t
}

/// Several `[out_i, inp]` weights as one `[inp, Σ out_i]` matrix, side by side.
fn side_by_side(parts: &[(Vec<f32>, usize)], inp: usize) -> Vec<f32> {
    let width: usize = parts.iter().map(|p| p.1).sum();
    let mut w = vec![0.0; inp * width];
    let mut col = 0;
    for (p, out) in parts {
        let t = transposed(p, *out, inp);
        for i in 0..inp {
            w[i * width + col..i * width + col + out].copy_from_slice(&t[i * out..(i + 1) * out]);
        }
        col += out;
    }
    w
}

impl HostMrp {
    /// Packs the module of `layers` layers whose tensors `weights` holds under `prefix`
    /// (`"mrp."`: `mrp.enorm`, `mrp.layers.N.*`, ...), beside the target's embedding, in the
    /// shape of the target's `cfg`.
    ///
    /// # Errors
    /// A tensor missing or of the wrong shape, named.
    pub fn load(
        cfg: &DecoderConfig,
        weights: &Weights,
        (prefix, layers): (&str, usize),
        precision: Precision,
    ) -> Result<Self, ModelError> {
        let (h, heads, kv, d, f) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.kv_heads(),
            cfg.head_dim(),
            cfg.intermediate_size,
        );
        let load = |name: &str, shape: &[usize]| weights.load_f32(name, shape);
        let own = |name: &str, shape: &[usize]| load(&format!("{prefix}{name}"), shape);
        let mut packed = Vec::with_capacity(layers);
        for n in 0..layers {
            let part = |name: &str, shape: &[usize]| own(&format!("layers.{n}.{name}"), shape);
            let qkv = side_by_side(
                &[
                    (part("self_attn.q_proj.weight", &[heads * d, h])?, heads * d),
                    (part("self_attn.k_proj.weight", &[kv * d, h])?, kv * d),
                    (part("self_attn.v_proj.weight", &[kv * d, h])?, kv * d),
                ],
                h,
            );
            let gate_up = side_by_side(
                &[
                    (part("mlp.gate_proj.weight", &[f, h])?, f),
                    (part("mlp.up_proj.weight", &[f, h])?, f),
                ],
                h,
            );
            let o = part("self_attn.o_proj.weight", &[h, heads * d])?;
            let down = part("mlp.down_proj.weight", &[h, f])?;
            packed.push(Layer {
                input_norm: part("input_layernorm.weight", &[h])?,
                qkv: Dense::new(qkv, (h, (heads + 2 * kv) * d), precision),
                q_norm: part("self_attn.q_norm.weight", &[d])?,
                k_norm: part("self_attn.k_norm.weight", &[d])?,
                o: Dense::new(transposed(&o, h, heads * d), (heads * d, h), precision),
                post_norm: part("post_attention_layernorm.weight", &[h])?,
                gate_up: Dense::new(gate_up, (h, 2 * f), precision),
                down: Dense::new(transposed(&down, h, f), (f, h), precision),
            });
        }
        let eh = own("eh_proj.weight", &[h, 2 * h])?;
        let rotary = d;
        Ok(Self {
            shape: Shape {
                hidden: h,
                heads,
                kv_heads: kv,
                head_dim: d,
                ffn: f,
                vocab: cfg.vocab_size,
                eps: cfg.rms_norm_eps as f32,
            },
            embed: load(EMBED, &[cfg.vocab_size, h])?.into(),
            head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(load(HEAD, &[cfg.vocab_size, h])?.into())
            },
            enorm: own("enorm.weight", &[h])?,
            hnorm: own("hnorm.weight", &[h])?,
            eh_proj: Dense::new(transposed(&eh, h, 2 * h), (2 * h, h), precision),
            layers: packed,
            norm: own("norm.weight", &[h])?,
            inv_freq: (0..rotary / 2)
                .map(|j| 1.0 / cfg.rope_theta.powf((2 * j) as f64 / rotary as f64))
                .collect(),
            precision,
        })
    }

    /// The arithmetic of the products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The same module with its products in `precision`, packed from this one's `f32` values
    /// (the embedding and head shared, nothing read again): `None` when this one is packed in
    /// int8 (its `f32` values are gone).
    pub fn repacked(&self, precision: Precision) -> Option<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(Layer {
                input_norm: l.input_norm.clone(),
                qkv: l.qkv.repacked(precision)?,
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                o: l.o.repacked(precision)?,
                post_norm: l.post_norm.clone(),
                gate_up: l.gate_up.repacked(precision)?,
                down: l.down.repacked(precision)?,
            });
        }
        Some(Self {
            shape: self.shape,
            embed: Arc::clone(&self.embed),
            head: self.head.clone(),
            enorm: self.enorm.clone(),
            hnorm: self.hnorm.clone(),
            eh_proj: self.eh_proj.repacked(precision)?,
            layers,
            norm: self.norm.clone(),
            inv_freq: self.inv_freq.clone(),
            precision,
        })
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> usize {
        self.shape.hidden
    }

    /// The target head's logit of `token` at the hidden state `row` (`f32`, whatever the
    /// products' precision), or `None` for a token outside the vocabulary or a row of another
    /// width.
    pub fn logit(&self, row: &[f32], token: TokenId) -> Option<f32> {
        let h = self.shape.hidden;
        let t = token as usize;
        if row.len() != h || t >= self.shape.vocab {
            return None;
        }
        let w = self.head.as_deref().unwrap_or(&self.embed);
        Some(dot(row, &w[t * h..(t + 1) * h]))
    }

    /// One step over `n` states of a block of `len` positions, as
    /// [`Mrp::step`](crate::mrp::Mrp::step): `ids` their tokens (`n · len`), `hidden` the hidden
    /// states read (`n · len · h`); the residuals `h_C` go to `out` (resized to `n · len · h`).
    ///
    /// # Errors
    /// Inputs of the wrong length or a token outside the vocabulary.
    pub fn step(
        &self,
        buffers: &mut MrpBuffers,
        (ids, hidden): (&[TokenId], &[f32]),
        (n, len): (usize, usize),
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let (h, rows) = (self.shape.hidden, n * len);
        check_step((ids, hidden), (n, len), (h, self.shape.vocab))?;
        out.clear();
        out.resize(rows * h, 0.0);
        if rows == 0 {
            return Ok(());
        }
        self.rope_tables(buffers, len);
        // States are independent: one part per thread (a state's values do not depend on
        // the part it lands in).
        let parts = rayon::current_num_threads()
            .min(n.div_ceil(MIN_PART))
            .max(1);
        let per = n.div_ceil(parts);
        let MrpBuffers {
            parts: scratch,
            cos,
            sin,
            ..
        } = buffers;
        scratch.resize_with(parts, Part::default);
        let rope = (&cos[..], &sin[..]);
        let work = ids
            .chunks(per * len)
            .zip(hidden.chunks(per * len * h))
            .zip(out.chunks_mut(per * len * h))
            .zip(scratch.iter_mut())
            .map(|(((ids, hidden), out), part)| Step {
                net: self,
                part,
                ids,
                hidden,
                len,
                rope,
                out,
            });
        let run = |step: Step<'_>| pulp::Arch::new().dispatch(step);
        if parts == 1 {
            work.for_each(run);
        } else {
            // An indexed split (`join` underneath): the calling thread runs the first part at
            // once while another takes the rest (`par_bridge` handed every part through a
            // shared iterator).
            crate::awake::keep_awake();
            work.collect::<Vec<_>>().into_par_iter().for_each(run);
        }
        Ok(())
    }

    /// Makes `buffers`' rotary tables for positions `0..len` (rotate-half, the angle in `f32`
    /// as HF computes it).
    fn rope_tables(&self, buffers: &mut MrpBuffers, len: usize) {
        if buffers.len == len {
            return;
        }
        let d = self.shape.head_dim;
        let half = d / 2;
        buffers.cos.clear();
        buffers.sin.clear();
        buffers.cos.resize(len * d, 1.0);
        buffers.sin.resize(len * d, 0.0);
        for p in 0..len {
            for (j, f) in self.inv_freq.iter().enumerate() {
                let a = f64::from(p as f32 * *f as f32);
                let (c, s) = (a.cos() as f32, a.sin() as f32);
                (buffers.cos[p * d + j], buffers.cos[p * d + j + half]) = (c, c);
                (buffers.sin[p * d + j], buffers.sin[p * d + j + half]) = (-s, s);
            }
        }
        buffers.len = len;
    }

    /// One part of a step (whole states), inlined into the SIMD context [`Self::step`]
    /// dispatches to.
    #[inline(always)]
    fn forward(&self, p: &mut Part, (ids, hidden): (&[TokenId], &[f32]), c: Ctx<'_>) {
        let Shape {
            hidden: h,
            heads,
            kv_heads: kv,
            head_dim: d,
            ffn: f,
            eps,
            ..
        } = self.shape;
        let rows = ids.len();
        let w = (heads + 2 * kv) * d;
        p.cat.resize(rows * 2 * h, 0.0);
        p.x.resize(rows * h, 0.0);
        p.hn.resize(rows * h, 0.0);
        p.qkv.resize(rows * w, 0.0);
        p.ctx.resize(rows * heads * d, 0.0);
        p.ff.resize(rows * 2 * f, 0.0);
        p.act.resize(rows * f, 0.0);
        // Inputs: the normalised embedding and hidden state side by side, projected.
        for (r, (&t, cat)) in ids.iter().zip(p.cat.chunks_mut(2 * h)).enumerate() {
            let e = &self.embed[t as usize * h..][..h];
            let (ce, ch) = cat.split_at_mut(h);
            rms_norm_row(e, ce, &self.enorm, eps);
            rms_norm_row(&hidden[r * h..][..h], ch, &self.hnorm, eps);
        }
        let x = &mut p.x[..rows * h];
        x.fill(0.0);
        self.eh_proj
            .add_product(x, &p.cat[..rows * 2 * h], &mut p.quant, rows);
        for layer in &self.layers {
            rms_norm(
                &p.x[..rows * h],
                &mut p.hn[..rows * h],
                &layer.input_norm,
                eps,
            );
            let qkv = &mut p.qkv[..rows * w];
            qkv.fill(0.0);
            layer
                .qkv
                .add_product(qkv, &p.hn[..rows * h], &mut p.quant, rows);
            // QK-norm and rotary embedding, per row and head.
            for (r, row) in qkv.chunks_mut(w).enumerate() {
                let pos = r % c.len;
                let (cos, sin) = (&c.rope.0[pos * d..][..d], &c.rope.1[pos * d..][..d]);
                for (k, head) in row[..(heads + kv) * d].chunks_mut(d).enumerate() {
                    let weight = if k < heads {
                        &layer.q_norm
                    } else {
                        &layer.k_norm
                    };
                    norm_rope(head, weight, (cos, sin), eps);
                }
            }
            grouped_attention(
                &p.qkv[..rows * w],
                &mut p.ctx[..rows * heads * d],
                (c.len, heads, kv, d),
                &mut p.kt,
                &mut p.row,
            );
            layer.o.add_product(
                &mut p.x[..rows * h],
                &p.ctx[..rows * heads * d],
                &mut p.quant,
                rows,
            );
            rms_norm(
                &p.x[..rows * h],
                &mut p.hn[..rows * h],
                &layer.post_norm,
                eps,
            );
            let ff = &mut p.ff[..rows * 2 * f];
            ff.fill(0.0);
            layer
                .gate_up
                .add_product(ff, &p.hn[..rows * h], &mut p.quant, rows);
            for (gu, a) in ff.chunks(2 * f).zip(p.act.chunks_mut(f)) {
                let (g, u) = gu.split_at(f);
                for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                    *a = silu(g) * u;
                }
            }
            layer
                .down
                .add_product(&mut p.x[..rows * h], &p.act[..rows * f], &mut p.quant, rows);
        }
        rms_norm(&p.x[..rows * h], c.out, &self.norm, eps);
    }
}

/// Checks a step's inputs (both paths of the module's step): `ids` of `n · len` tokens below
/// `vocab`, `hidden` of `n · len · h` values.
pub(crate) fn check_step(
    (ids, hidden): (&[TokenId], &[f32]),
    (n, len): (usize, usize),
    (h, vocab): (usize, usize),
) -> Result<(), ModelError> {
    let rows = n * len;
    if ids.len() != rows || hidden.len() != rows * h {
        return Err(ModelError::Request(format!(
            "MRP step over {n} x {len} positions got {} ids and {} hidden values",
            ids.len(),
            hidden.len()
        )));
    }
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Request(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(())
}

/// What a part of a step reads besides its states.
struct Ctx<'a> {
    len: usize,
    rope: (&'a [f32], &'a [f32]),
    out: &'a mut [f32],
}

/// One part of [`HostMrp::step`], compiled for the widest SIMD the CPU has.
struct Step<'a> {
    net: &'a HostMrp,
    part: &'a mut Part,
    ids: &'a [TokenId],
    hidden: &'a [f32],
    len: usize,
    rope: (&'a [f32], &'a [f32]),
    out: &'a mut [f32],
}

impl pulp::WithSimd for Step<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<V: pulp::Simd>(self, _: V) {
        let ctx = Ctx {
            len: self.len,
            rope: self.rope,
            out: self.out,
        };
        self.net.forward(self.part, (self.ids, self.hidden), ctx);
    }
}

/// RMS norm of one row with scale `w` (as burn: `x · (mean(x²) + ε)^-½ · w`).
#[inline(always)]
fn rms_norm_row(x: &[f32], out: &mut [f32], w: &[f32], eps: f32) {
    let inv = 1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// [`rms_norm_row`] of every `w.len()`-wide row.
#[inline(always)]
fn rms_norm(x: &[f32], out: &mut [f32], w: &[f32], eps: f32) {
    for (row, o) in x.chunks(w.len()).zip(out.chunks_mut(w.len())) {
        rms_norm_row(row, o, w, eps);
    }
}

/// One head's QK-norm and rotate-half rotary embedding, in place: `x · cos + swap(x) · sin`
/// (the halves exchanged; `sin` carries the sign).
#[inline(always)]
fn norm_rope(x: &mut [f32], w: &[f32], (cos, sin): (&[f32], &[f32]), eps: f32) {
    let d = x.len();
    let half = d / 2;
    let inv = 1.0 / (dot(x, x) / d as f32 + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * inv * g;
    }
    let (a, b) = x.split_at_mut(half);
    for j in 0..half {
        let (x1, x2) = (a[j], b[j]);
        a[j] = x1 * cos[j] + x2 * sin[j];
        b[j] = x2 * cos[j + half] + x1 * sin[j + half];
    }
}
