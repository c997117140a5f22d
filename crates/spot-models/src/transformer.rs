//! The decoder-only transformer every family is built from.
//!
//! A family file (`sdar.rs`, `llada.rs`, `dream.rs`, `llada2.rs`, `autoregressive.rs`) maps its
//! `config.json` to a [`Geometry`] and its tensor names to a [`Net`] (dense decoders through the
//! name tables of `dense.rs`); this file holds the arithmetic they share:
//!
//! - pre-norm blocks with RMSNorm, GQA attention with optional q/k/v bias and optional per-head
//!   QK-norm (applied before RoPE);
//! - rotate-half RoPE over the first `rotary_dim` dimensions of each head (all of them for the
//!   Qwen and Llama families, half of them for LLaDA2.0), angles in f32 as HF computes them;
//! - a dense SwiGLU MLP or a mixture of experts (`moe.rs`): sigmoid router in f32, a selection
//!   bias, group-limited top-k, normalised and scaled weights, shared experts; only the selected
//!   experts run, each on the rows routed to it;
//! - attention over `[cached prefix ; block]` where the block attends to itself
//!   bidirectionally ([`Attend::Bidirectional`], block diffusion: the prefix broadcast over the
//!   states of a batch, each state its own fixed-shape products, so results do not depend on the
//!   batch) or causally ([`Attend::Causal`], autoregressive: position by position, so a run of
//!   tokens gives the numbers of one-token forwards bit for bit).

use burn_tensor::backend::Backend;
use burn_tensor::{DType, Int, Tensor, TensorData};

use crate::attention::{self, Attend, Attention, Kv};
use crate::head::{Head, HeadPlacement};
use crate::linear::{Dense, HostLayer, numel, pack_in_out, project};
use crate::moe::Moe;
use crate::rope::Rope;

/// Attention shape and numerics shared by every layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Geometry {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (the first ones); even, at most `head_dim`.
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub eps: f64,
}

/// `x` `[a, b, c, d]` with dimensions 1 and 2 swapped. On the CPU backends (`host`) the result
/// is built contiguous one index of dimension 2 at a time: each slice is a 2-D strided block that
/// the backend copies row by row, where copying the 4-D permuted view walks it element by element
/// (40% of a CPU forward at 21 states). Elsewhere a swapped view, copied by the backend's own
/// kernels when it is reshaped. The same values either way.
fn swap_heads<B: Backend>(x: Tensor<B, 4>, host: bool) -> Tensor<B, 4> {
    let [a, b, c, d] = x.dims();
    if !host || c == 1 {
        return x.swap_dims(1, 2);
    }
    let slices = (0..c)
        .map(|i| x.clone().narrow(2, i, 1).reshape([a, 1, b, d]))
        .collect();
    Tensor::cat(slices, 1)
}

/// The MLP of one layer.
pub(crate) enum Mlp<B: Backend> {
    Dense(Dense<B>),
    Moe(Moe<B>),
}

/// One pre-norm transformer layer.
pub(crate) struct Layer<B: Backend> {
    pub input_norm: Tensor<B, 2>,
    pub attn: Attention<B>,
    pub post_norm: Tensor<B, 2>,
    pub mlp: Mlp<B>,
}

pub(crate) fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: &Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let var = x.clone().square().mean_dim(D - 1);
    (x * var.add_scalar(eps).sqrt().recip()).cast(dtype) * w.clone()
}

/// `n` sequences of `len` tokens at positions `start..start + len` after the cached prefix
/// `cache` (one entry per layer, empty for none): one request's share of a
/// [`Net::run_segments`].
pub(crate) struct Segment<'c, B: Backend> {
    pub n: usize,
    pub len: usize,
    pub start: usize,
    pub cache: &'c [Kv<B>],
    /// An earlier segment of the same run (one sequence: a block being appended, or a
    /// hypothesised one) whose keys and values extend, layer by layer, the prefix *that*
    /// segment attended to (its `cache`, itself extended by its own `after`): the cache
    /// [`Net::extend_cache`] leaves after appending them one by one.
    pub after: Option<usize>,
}

/// Embedding, layers, final norm and head.
pub(crate) struct Net<B: Backend> {
    pub geo: Geometry,
    pub device: B::Device,
    pub embed: Tensor<B, 2>,
    pub layers: Vec<Layer<B>>,
    pub norm: Tensor<B, 2>,
    pub head: Head<B>,
    /// The float type of the weights and activations.
    pub dtype: DType,
    /// Per layer, its projections packed for the host kernel (empty: the backend's matmul).
    host_layers: Vec<HostLayer>,
    inv_freq: Vec<f64>,
    parameters: usize,
    /// Layers whose outputs a run keeps ([`Net::take_tapped`]; empty: none).
    taps: Vec<usize>,
    /// The last run's outputs of the `taps` layers, `[rows, hidden]` each, in `taps` order.
    tapped: std::sync::Mutex<Vec<Tensor<B, 2>>>,
}

impl<B: Backend> Layer<B> {
    fn parameters(&self) -> usize {
        let a = &self.attn;
        let attn = [&a.q, &a.k, &a.v, &a.o]
            .iter()
            .map(|t| numel(*t))
            .sum::<usize>()
            + a.bias.iter().flatten().map(numel).sum::<usize>()
            + a.qk_norm.iter().flatten().map(numel).sum::<usize>();
        let mlp = match &self.mlp {
            Mlp::Dense(d) => d.parameters(),
            Mlp::Moe(m) => m.parameters(),
        };
        numel(&self.input_norm) + numel(&self.post_norm) + attn + mlp
    }
}

impl<B: Backend> Net<B> {
    /// Assembles a network; the RoPE frequencies follow from `geo`. `tied`: the head is the
    /// embedding (not counted twice in [`Net::parameters`]).
    pub fn new(
        geo: Geometry,
        device: B::Device,
        (embed, head, tied): (Tensor<B, 2>, Head<B>, bool),
        layers: Vec<Layer<B>>,
        norm: Tensor<B, 2>,
    ) -> Self {
        let dtype = embed.dtype();
        let parameters = numel(&embed)
            + if tied {
                0
            } else {
                let (v, h) = head.shape();
                v * h
            }
            + numel(&norm)
            + layers.iter().map(Layer::parameters).sum::<usize>();
        let r = geo.rotary_dim;
        let inv_freq = (0..r / 2)
            .map(|j| 1.0 / geo.rope_theta.powf((2 * j) as f64 / r as f64))
            .collect();
        Self {
            geo,
            device,
            embed,
            layers,
            norm,
            head,
            dtype,
            host_layers: Vec::new(),
            inv_freq,
            parameters,
            taps: Vec::new(),
            tapped: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Keeps, from every later run, the outputs of `layers` (0-based: the residual stream after
    /// that layer, before the final norm), for [`Net::take_tapped`]. Empty: none.
    pub fn set_taps(&mut self, layers: &[usize]) {
        self.taps = layers.to_vec();
        self.take_tapped();
    }

    /// The last run's tapped layer outputs (`[rows, hidden]` each, in [`Net::taps`] order),
    /// leaving none.
    pub fn take_tapped(&self) -> Vec<Tensor<B, 2>> {
        let mut t = self.tapped.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *t)
    }

    /// On a CPU backend with f32 weights and dense layers, packs every layer's projections for
    /// the host kernel ([`spot_reduce::HostHead::product`]) and multiplies by them from
    /// then on: one row costs what the backend's matrix-vector product costs, a few rows hardly more (the
    /// backend's small matrix products run on one thread below a size threshold), and a row's
    /// values never depend on how many rows the forward holds. The packed copies take as much
    /// memory again as the projections.
    pub fn pack_host_projections(&mut self) {
        let host = crate::values::runs_on_host::<B>(&self.device);
        if !host || self.dtype != DType::F32 || !self.host_layers.is_empty() {
            return;
        }
        let mut packed = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let Mlp::Dense(m) = &layer.mlp else {
                return;
            };
            let a = &layer.attn;
            let (Some(q), Some(k), Some(v), Some(o)) = (
                pack_in_out(&a.q),
                pack_in_out(&a.k),
                pack_in_out(&a.v),
                pack_in_out(&a.o),
            ) else {
                return;
            };
            let (Some(gate), Some(up), Some(down)) = (
                pack_in_out(&m.gate),
                pack_in_out(&m.up),
                pack_in_out(&m.down),
            ) else {
                return;
            };
            packed.push(HostLayer {
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
            });
        }
        self.host_layers = packed;
    }

    /// Number of parameters the weights hold (a tied head counted once).
    pub fn parameters(&self) -> usize {
        self.parameters
    }

    /// Runs `n` sequences of `len` tokens at positions `start..start + len` after the cached
    /// prefix `cache` (one entry per layer, empty for none). Returns the final hidden states
    /// `[n * len, hidden]` and each layer's new keys and values `[n, kv, len, d]`.
    pub fn run(
        &self,
        ids: Vec<i64>,
        n: usize,
        len: usize,
        start: usize,
        cache: &[Kv<B>],
        attend: Attend,
    ) -> (Tensor<B, 2>, Vec<Kv<B>>) {
        let segment = Segment {
            n,
            len,
            start,
            cache,
            after: None,
        };
        let (hidden, mut kv) = self.run_segments(ids, &[segment], attend);
        (hidden, kv.pop().unwrap_or_default())
    }

    /// Runs several [`Segment`]s (the requests of a merged forward) at once: `ids` holds their
    /// tokens one after the other. Every row-wise step (norms, projections, MLP or experts)
    /// runs over all rows together; attention runs per segment over its own cache, with the
    /// products a [`Net::run`] of that segment alone runs, so each segment's rows come out
    /// bit-identical to running it alone. Returns the final hidden states of all rows, in
    /// order, and each segment's new keys and values per layer.
    pub fn run_segments(
        &self,
        ids: Vec<i64>,
        segments: &[Segment<'_, B>],
        attend: Attend,
    ) -> (Tensor<B, 2>, Vec<Vec<Kv<B>>>) {
        let rows: usize = segments.iter().map(|s| s.n * s.len).sum();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows]), &self.device);
        self.run_embedded(self.embed.clone().select(0, ids), segments, attend)
    }

    /// [`Net::run_segments`] from input rows `x` `[rows, hidden]` instead of token ids (a
    /// module that mixes the embedding with other inputs, as the MRP baseline does).
    pub fn run_embedded(
        &self,
        x: Tensor<B, 2>,
        segments: &[Segment<'_, B>],
        attend: Attend,
    ) -> (Tensor<B, 2>, Vec<Vec<Kv<B>>>) {
        let host = crate::values::runs_on_host::<B>(&self.device);
        if host {
            // On a worker of the CPU backends' thread pool: the many small parallel operations
            // of a forward then split work between the pool's threads without handing every
            // one over from (and back to) the calling thread.
            rayon::scope(|_| self.run_segments_on(x, segments, (attend, host)))
        } else {
            self.run_segments_on(x, segments, (attend, host))
        }
    }

    /// [`Net::run_embedded`]; `host`: the backend is a CPU one.
    fn run_segments_on(
        &self,
        mut x: Tensor<B, 2>,
        segments: &[Segment<'_, B>],
        (attend, host): (Attend, bool),
    ) -> (Tensor<B, 2>, Vec<Vec<Kv<B>>>) {
        let c = &self.geo;
        let (nh, kvh, d) = (c.heads, c.kv_heads, c.head_dim);
        let g = nh / kvh;
        let rope = |heads, seg: &Segment<'_, B>| {
            let shape = (heads, d, c.rotary_dim);
            Rope::<B>::new(
                &self.inv_freq,
                (seg.start, seg.len),
                shape,
                (&self.device, self.dtype),
            )
        };
        let ropes: Vec<_> = segments
            .iter()
            .map(|seg| (rope(nh, seg), rope(kvh, seg)))
            .collect();
        let scale = 1.0 / (d as f64).sqrt();
        let mut new_kv: Vec<Vec<Kv<B>>> = segments
            .iter()
            .map(|_| Vec::with_capacity(self.layers.len()))
            .collect();
        let single = segments.len() == 1;
        let mut tapped = vec![None; self.taps.len()];
        for (li, layer) in self.layers.iter().enumerate() {
            // Per segment that others extend: the prefix it attended to in this layer, extended
            // by its own keys and values (made once, however many segments read it).
            let mut extended: Vec<Option<Kv<B>>> = segments.iter().map(|_| None).collect();
            let a = &layer.attn;
            let packed = self.host_layers.get(li);
            // 1. Pre-norm and projections (+ bias), all rows at once.
            let hn = rms_norm(x.clone(), &layer.input_norm, c.eps);
            let (mut q, mut k, mut v) = (
                project(hn.clone(), &a.q, packed.map(|p| &p.q)),
                project(hn.clone(), &a.k, packed.map(|p| &p.k)),
                project(hn, &a.v, packed.map(|p| &p.v)),
            );
            if let Some([bq, bk, bv]) = &a.bias {
                q = q + bq.clone();
                k = k + bk.clone();
                v = v + bv.clone();
            }
            let mut outs = Vec::with_capacity(segments.len());
            let mut row0 = 0;
            for (si, seg) in segments.iter().enumerate() {
                let (n, len) = (seg.n, seg.len);
                let part = |t: &Tensor<B, 2>| {
                    if single {
                        t.clone()
                    } else {
                        t.clone().narrow(0, row0, n * len)
                    }
                };
                let q = part(&q).reshape([n, len, nh, d]);
                let k = part(&k).reshape([n, len, kvh, d]);
                let v = part(&v).reshape([n, len, kvh, d]);
                // 2. QK-norm per head, then RoPE; heads first: [n, heads, len, d].
                let (q, k) = match &a.qk_norm {
                    Some([qn, kn]) => (rms_norm(q, qn, c.eps), rms_norm(k, kn, c.eps)),
                    None => (q, k),
                };
                let (rope_q, rope_k) = &ropes[si];
                let q = swap_heads(rope_q.apply(q), host);
                let k = rope_k.apply(k).swap_dims(1, 2);
                let v = v.swap_dims(1, 2);
                // 3. Group the query heads of each KV head: [n, kv, g * len, d].
                let q = q.reshape([n, kvh, g * len, d]);
                // 4. Attention over [prefix ; block].
                let prefix = match seg.after {
                    Some(j) => extended[j].clone(),
                    None => seg.cache.get(li).filter(|_| seg.start > 0).cloned(),
                };
                let cached = prefix.as_ref();
                let out = match attend {
                    Attend::Causal => attention::causal(q, &k, &v, cached, scale),
                    Attend::Bidirectional => attention::bidirectional(q, &k, &v, cached, scale),
                };
                // 5. Heads back to features.
                outs.push(
                    swap_heads(out.reshape([n, nh, len, d]), host).reshape([n * len, nh * d]),
                );
                if segments[si + 1..].iter().any(|s| s.after == Some(si)) {
                    extended[si] = Some(match prefix {
                        Some(c) => Kv {
                            k: Tensor::cat(vec![c.k, k.clone()], 2),
                            v: Tensor::cat(vec![c.v, v.clone()], 2),
                        },
                        None => Kv {
                            k: k.clone(),
                            v: v.clone(),
                        },
                    });
                }
                new_kv[si].push(Kv { k, v });
                row0 += n * len;
            }
            let out = if single {
                outs.remove(0)
            } else {
                Tensor::cat(outs, 0)
            };
            // Output projection, residual.
            x = x + project(out, &a.o, packed.map(|p| &p.o));
            // 6. MLP, residual.
            let hn = rms_norm(x.clone(), &layer.post_norm, c.eps);
            x = x + match &layer.mlp {
                Mlp::Dense(m) => m.forward(hn, host, packed),
                Mlp::Moe(m) => m.forward(hn, host),
            };
            for (t, _) in self.taps.iter().enumerate().filter(|(_, l)| **l == li) {
                tapped[t] = Some(x.clone());
            }
        }
        if !self.taps.is_empty() {
            *self.tapped.lock().unwrap_or_else(|e| e.into_inner()) =
                tapped.into_iter().flatten().collect();
        }
        (rms_norm(x, &self.norm, c.eps), new_kv)
    }

    /// Moves the output layer to `placement`.
    pub fn place_head(&mut self, placement: HeadPlacement) {
        self.head.place(placement, (&self.device, self.dtype));
    }

    /// Appends `kv` (one sequence) to `cache`.
    pub fn extend_cache(cache: &mut Vec<Kv<B>>, kv: Vec<Kv<B>>) {
        if cache.is_empty() {
            *cache = kv;
        } else {
            for (c, new) in cache.iter_mut().zip(kv) {
                c.k = Tensor::cat(vec![c.k.clone(), new.k], 2);
                c.v = Tensor::cat(vec![c.v.clone(), new.v], 2);
            }
        }
    }
}
