//! SpecDiff-2's drafter that reads the target (the `models` feature): a block drafter of a
//! few layers whose keys and values include the target's own hidden states, drafting `γ`
//! tokens in one pass (the layout of DFlash, arXiv 2602.06036; our code and training,
//! `tools/specdiff/train_feature_drafter.py`).
//!
//! **The model.** For every committed position `p` the target has run, the outputs of the
//! tapped target layers are concatenated and projected to the model width, `c_p =
//! RMSNorm(fc · h_p)` (made once per position and cached with its keys and values). A draft
//! block holds the committed tokens the target has not run yet (usually one: the token the
//! last round's verification chose), embedded with the target's input embedding, then `γ`
//! copies of a learned mask vector. Llama decoder layers run over the block: in each, the
//! queries are the block's rows; the keys and values are those of the context features (that
//! layer's own `k_proj` / `v_proj`, RoPE at their positions) followed by the block's;
//! attention is not causal (from the second layer on, a mask row reads the others' guesses).
//! A final RMS norm and the target's tied output head, restricted to a shortlist (the
//! drafter file's frequent tokens and the context's), give each mask row's distribution over
//! the token at its position.
//!
//! **Features cost no target pass.** [`FeatureDrafter::load`] asks the target for a
//! [`FeatureTap`]: every verification forward leaves the tapped rows of the tokens it appended
//! and of every branch it scored, and the drafter keeps those whose tokens are the committed
//! text (an accepted branch's rows are exactly the rows of its tokens). The drafter is exact
//! by construction like every SpecDiff-2 drafter: verification is coupled, so drafts change
//! forwards, never tokens.
//!
//! **At `T > 0`** ([`DiffusionDrafter::target_sampling`]) each position's first candidate is
//! `argmax_v(logit_v / T + G[p, v])` over its best-scored candidates, with the Gumbel noise
//! the target's own token at that position will be decided by: where the drafter's
//! distribution is close to the target's, the draft is the target's sample. The probabilities
//! it reports are then the softmax of those noised scores over the candidates: how far the
//! pick leads under the shared noise, which is what its acceptance depends on (at `T = 0`,
//! the softmax of the logits).
//!
//! **With a store** ([`FeatureDrafterFile::store`]) each round also asks the store's retrieval
//! drafter ([`LookupDrafter::with_store`]) and drafts whichever of the two drafts expects the
//! longer streak (`Σ_i Π_{j ≤ i} p_j`): text the target copies is the store's strength, text
//! it composes the network's.
//!
//! A drafter folder holds [`FEATURE_DRAFTER_FILE`] (`format` [`FEATURE_DRAFTER_FORMAT`]) and
//! `model.safetensors` (`fc.weight` `[d, taps · d]`, `fc_norm.weight`, `mask_embedding`,
//! `layers.N.*` with Llama's layer names, `norm.weight`; float32, float16 or bfloat16); the
//! embedding and head are the target's.

use std::path::Path;

use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_core::{GumbelNoise, TokenId};
use spot_models::{CausalLm, FeatureTap, ModelError, Result};
use spot_reduce::HostHead;
use spot_reduce::linalg::dot;

use crate::drafter::{DiffusionDrafter, Marginals};
use crate::{LookupDrafter, LookupStore};

/// The drafter's own file in its folder (the name SpecDiff-2's masked drafter uses too; the
/// `format` field tells them apart).
pub const FEATURE_DRAFTER_FILE: &str = "specdiff-drafter.json";

/// The format name in [`FEATURE_DRAFTER_FILE`].
pub const FEATURE_DRAFTER_FORMAT: &str = "spot-feature-drafter";

/// Autoregressive mode stops drafting once the running product of its drafted tokens'
/// probabilities is below this: the floor its recommended settings give the decoder
/// (`min_draft_prob`), which would cut the rest; each step costs a pass.
pub const AR_STOP: f32 = 0.2;

/// Candidates per position whose noised score a position's first candidate is chosen from at
/// `T > 0`.
const NOISED: usize = 64;
/// What [`FEATURE_DRAFTER_FILE`] holds.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FeatureDrafterFile {
    /// Always [`FEATURE_DRAFTER_FORMAT`].
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// The target layers read (0-based; their outputs are concatenated in this order).
    pub taps: Vec<usize>,
    /// Draft layers (1 to 8).
    pub layers: usize,
    /// Mask rows per block: the most positions one pass drafts (1 to 64).
    pub draft_positions: usize,
    /// Token ids the head scores besides the context's (frequent tokens of the training
    /// continuations).
    pub shortlist: Vec<TokenId>,
    /// A lookup store in the folder (the target's own continuations, JSON lines: see
    /// [`LookupStore`]): each round then drafts whichever of the network's draft and the
    /// store's calibrated retrieval draft expects the longer accepted streak.
    #[serde(default)]
    pub store: Option<String>,
    /// Free text: what it was trained on and how.
    #[serde(default)]
    pub description: String,
    /// How it drafts: `"block"` (the default) or `"autoregressive"`.
    #[serde(default)]
    pub mode: DraftMode,
}

/// How a [`FeatureDrafter`] drafts (the `mode` field of its file).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DraftMode {
    /// SpecDiff-2's drafter (DFlash's layout): one pass over the block's known tokens and `γ`
    /// mask rows drafts every position; attention within the block is not causal.
    #[default]
    Block,
    /// The EAGLE-style baseline: one causal step per drafted token. Row `i` reads `inp ·
    /// [g_i ; E(token_{i+1})]`, where `g_i` is position `i`'s projected feature while the
    /// target has run it and, past that, the drafter's own previous output state (RMS-normed
    /// by `fc_norm`); its output predicts the token at `i + 2`. The file then has
    /// `inp.weight` `[d, 2d]` and no `mask_embedding`.
    Autoregressive,
}

/// Shapes, from the target's `config.json`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    d: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
    vocab: usize,
    width: usize,
    eps: f32,
}

/// The drafter's own weights, each matrix `[in, out]` row-major (transposed from the file's
/// `[out, in]`) so that a row block times it is one product.
struct Weights {
    fc: HostHead,
    fc_norm: Vec<f32>,
    /// The mask rows' input (block mode).
    mask: Vec<f32>,
    /// `inp` `[2d, d]` (autoregressive mode).
    inp: Option<HostHead>,
    layers: Vec<LayerWeights>,
    norm: Vec<f32>,
}

/// One draft layer's weights (as [`Weights`]).
struct LayerWeights {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q: HostHead,
    k: HostHead,
    v: HostHead,
    o: HostHead,
    gate: HostHead,
    up: HostHead,
    down: HostHead,
}

/// The drafter that reads the target (see the module documentation).
///
/// ```no_run
/// use spot_core::{decode_autoregressive, ArConfig};
/// use spot_models::{CausalLm, CpuBackend};
/// use spot_specdiff::{DiffusionDrafter, FeatureDrafter, SpecDiffDecoder};
/// let mut target = CausalLm::<CpuBackend>::load("SmolLM2-135M-Instruct".as_ref(), &Default::default())?;
/// let mut drafter = FeatureDrafter::load("SmolLM2-135M-Instruct/specdiff-drafter".as_ref(), &mut target)?;
/// let sd = drafter.recommended();
/// let cfg = ArConfig { max_new_tokens: 64, ..ArConfig::default() };
/// let out = SpecDiffDecoder::new(sd)?.decode(&mut target, &mut drafter, &[1, 2, 3], &cfg)?;
/// assert_eq!(out.tokens, decode_autoregressive(&mut target, &[1, 2, 3], &cfg)?.tokens);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FeatureDrafter {
    file: FeatureDrafterFile,
    tap: FeatureTap,
    dims: Dims,
    w: Weights,
    /// The target's input embedding `[vocab, d]`.
    embed: Vec<f32>,
    /// The target's output head `[vocab, d]` when it is not tied to the embedding.
    head: Option<Vec<f32>>,
    /// The head's rows of the shortlist, `[d, shortlist]` (transposed).
    short_head: HostHead,
    in_shortlist: Vec<bool>,
    inv_freq: Vec<f64>,
    top_k: usize,
    noise: Option<(f32, GumbelNoise)>,
    /// Autoregressive mode: the running probability below which it stops drafting.
    stop_below: f32,
    /// Retrieval from the folder's store, when it has one.
    lookup: Option<LookupDrafter>,
    lookup_marginals: Marginals,
    /// The committed tokens whose features are cached (positions `0..tokens.len()`).
    tokens: Vec<TokenId>,
    /// The tapped features (`[n, width]`) of positions `raw_start..tokens.len()`. In block
    /// mode these are the ones not yet projected into keys and values: that work waits for
    /// the next draft (rounds the pace skips only keep up), and then runs over all of them at
    /// once. In autoregressive mode every position's stays (`raw_start` 0): a row is run
    /// again when the token after it changes.
    raw: Vec<f32>,
    raw_start: usize,
    /// Per draft layer, per cached row, that layer's keys and values (`[kv · hd]` each; keys
    /// after RoPE): in block mode of the position's projected feature, in autoregressive
    /// mode of the row's input to that layer.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Autoregressive mode: each cached row's output state (`[d]`, before the final norm)
    /// and the token after it that the row read.
    states: Vec<f32>,
    row_next: Vec<TokenId>,
}

impl std::fmt::Debug for FeatureDrafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureDrafter")
            .field("taps", &self.file.taps)
            .field("draft_positions", &self.file.draft_positions)
            .field("shortlist", &self.file.shortlist.len())
            .field("cached", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl FeatureDrafter {
    /// Loads the drafter folder `dir` for `target` (whose embedding it reads from the target's
    /// folder) and taps the target's layers it reads: from now on the target's forwards leave
    /// their features for this drafter. Every field and shape is checked; errors name the
    /// file and field.
    pub fn load<B: Backend>(dir: &Path, target: &mut CausalLm<B>) -> Result<Self> {
        let path = dir.join(FEATURE_DRAFTER_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let file: FeatureDrafterFile =
            serde_json::from_str(&text).map_err(|e| ModelError::Json {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let cfg = target.config().clone();
        let invalid = |field, reason: String| ModelError::InvalidConfig {
            path: path.clone(),
            field,
            reason,
        };
        if file.format != FEATURE_DRAFTER_FORMAT {
            return Err(invalid(
                "format",
                format!(
                    "expected \"{FEATURE_DRAFTER_FORMAT}\", got {:?}",
                    file.format
                ),
            ));
        }
        if file.version != 1 {
            return Err(invalid(
                "version",
                format!("this build reads version 1, got {}", file.version),
            ));
        }
        if file.taps.is_empty() || file.taps.iter().any(|&t| t >= cfg.num_hidden_layers) {
            return Err(invalid(
                "taps",
                format!(
                    "need 1 or more layers below the target's {}, got {:?}",
                    cfg.num_hidden_layers, file.taps
                ),
            ));
        }
        if !(1..=8).contains(&file.layers) {
            return Err(invalid(
                "layers",
                format!("must be in [1, 8], got {}", file.layers),
            ));
        }
        if !(1..=64).contains(&file.draft_positions) {
            return Err(invalid(
                "draft_positions",
                format!("must be in [1, 64], got {}", file.draft_positions),
            ));
        }
        if let Some(t) = file
            .shortlist
            .iter()
            .find(|&&t| t as usize >= cfg.vocab_size)
        {
            return Err(invalid(
                "shortlist",
                format!("token {t} is outside the vocabulary of {}", cfg.vocab_size),
            ));
        }
        let heads = cfg.num_attention_heads;
        let kv = cfg.num_key_value_heads.unwrap_or(heads);
        let hd = cfg.head_dim.unwrap_or(cfg.hidden_size / heads.max(1));
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
            return Err(invalid(
                "taps",
                format!("the target's heads ({heads}) and key-value heads ({kv}) do not group"),
            ));
        }
        let d = cfg.hidden_size;
        let dims = Dims {
            d,
            heads,
            kv,
            hd,
            inter: cfg.intermediate_size,
            vocab: cfg.vocab_size,
            width: file.taps.len() * d,
            eps: cfg.rms_norm_eps as f32,
        };
        let weights = spot_models::hf::Weights::open(dir)?;
        // Packed for the host kernel that multiplies the target's own projections: a few
        // rows cost what one does, on every core.
        let packed = |w: &[f32], out: usize, inp: usize| {
            HostHead::new(w, out, inp).map_err(|e| invalid("model.safetensors", e.to_string()))
        };
        let t = |name: &str, out: usize, inp: usize| -> Result<HostHead> {
            packed(&weights.load_f32(name, &[out, inp])?, out, inp)
        };
        let vec = |name: &str| weights.load_f32(name, &[d]);
        let (qd, kvd) = (heads * hd, kv * hd);
        let layer = |i: usize| -> Result<LayerWeights> {
            let p = |n: &str| format!("layers.{i}.{n}");
            Ok(LayerWeights {
                input_norm: vec(&p("input_layernorm.weight"))?,
                post_norm: vec(&p("post_attention_layernorm.weight"))?,
                q: t(&p("self_attn.q_proj.weight"), qd, d)?,
                k: t(&p("self_attn.k_proj.weight"), kvd, d)?,
                v: t(&p("self_attn.v_proj.weight"), kvd, d)?,
                o: t(&p("self_attn.o_proj.weight"), d, qd)?,
                gate: t(&p("mlp.gate_proj.weight"), dims.inter, d)?,
                up: t(&p("mlp.up_proj.weight"), dims.inter, d)?,
                down: t(&p("mlp.down_proj.weight"), d, dims.inter)?,
            })
        };
        let autoregressive = file.mode == DraftMode::Autoregressive;
        let w = Weights {
            fc: t("fc.weight", d, dims.width)?,
            fc_norm: vec("fc_norm.weight")?,
            mask: if autoregressive {
                Vec::new()
            } else {
                vec("mask_embedding")?
            },
            inp: if autoregressive {
                Some(t("inp.weight", d, 2 * d)?)
            } else {
                None
            },
            layers: (0..file.layers).map(layer).collect::<Result<_>>()?,
            norm: vec("norm.weight")?,
        };
        let n_layers = file.layers;
        let target_weights = spot_models::hf::Weights::open(target.dir())?;
        let embed = target_weights.load_f32("model.embed_tokens.weight", &[dims.vocab, d])?;
        let head = if cfg.tie_word_embeddings || !target_weights.contains("lm_head.weight") {
            None
        } else {
            Some(target_weights.load_f32("lm_head.weight", &[dims.vocab, d])?)
        };
        let head_rows = head.as_deref().unwrap_or(&embed);
        let mut in_shortlist = vec![false; dims.vocab];
        let mut short_rows = Vec::with_capacity(d * file.shortlist.len());
        for &id in &file.shortlist {
            in_shortlist[id as usize] = true;
            short_rows.extend_from_slice(&head_rows[id as usize * d..(id as usize + 1) * d]);
        }
        let short_head = packed(&short_rows, file.shortlist.len(), d)?;
        let inv_freq = (0..hd / 2)
            .map(|j| 1.0 / cfg.rope_theta.powf((2 * j) as f64 / hd as f64))
            .collect();
        let lookup = match &file.store {
            None => None,
            Some(name) => {
                let store = LookupStore::open(&dir.join(name), dims.vocab)
                    .map_err(|e| invalid("store", e.to_string()))?;
                Some(LookupDrafter::with_store(dims.vocab, store, 4))
            }
        };
        let tap = target.tap_features(&file.taps)?;
        Ok(Self {
            file,
            tap,
            dims,
            w,
            embed,
            head,
            short_head,
            in_shortlist,
            inv_freq,
            top_k: 4,
            noise: None,
            stop_below: AR_STOP,
            lookup,
            lookup_marginals: Marginals::default(),
            tokens: Vec::new(),
            raw: Vec::new(),
            raw_start: 0,
            keys: vec![Vec::new(); n_layers],
            values: vec![Vec::new(); n_layers],
            states: Vec::new(),
            row_next: Vec::new(),
        })
    }

    /// The drafter file.
    pub fn file(&self) -> &FeatureDrafterFile {
        &self.file
    }

    /// Autoregressive mode: stop drafting a round once the running product of the drafted
    /// tokens' probabilities is below `p` (default [`AR_STOP`], 0.2; 0 drafts every position
    /// asked for). Block mode drafts in one pass and ignores it.
    pub fn set_stop_below(&mut self, p: f32) {
        self.stop_below = p;
    }

    /// Committed positions whose features are cached.
    pub fn cached(&self) -> usize {
        self.tokens.len()
    }

    /// Brings the feature cache to `context`: drops what no longer matches it, then takes the
    /// tapped runs that extend it.
    fn sync(&mut self, context: &[TokenId]) {
        let keep = self
            .tokens
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        self.truncate(keep);
        for run in self.tap.take() {
            let m = self.tokens.len();
            let end = run.start + run.tokens.len();
            if run.start > m || end <= m {
                continue;
            }
            let off = m - run.start;
            if run.tokens[..off] != context[run.start..m] {
                continue;
            }
            let take = run.tokens[off..]
                .iter()
                .zip(&context[m..])
                .take_while(|(a, b)| a == b)
                .count();
            if take == 0 {
                continue;
            }
            let w = self.dims.width;
            self.append(
                &run.tokens[off..off + take],
                &run.features[off * w..(off + take) * w],
            );
        }
    }

    /// Rows whose keys and values are cached.
    fn projected(&self) -> usize {
        self.keys[0].len() / (self.dims.kv * self.dims.hd)
    }

    /// Keeps the first `rows` cached rows' keys and values (and states).
    fn keep_rows(&mut self, rows: usize) {
        let kvd = self.dims.kv * self.dims.hd;
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(rows * kvd);
            v.truncate(rows * kvd);
        }
        self.states.truncate(rows * self.dims.d);
        self.row_next.truncate(rows);
    }

    fn truncate(&mut self, len: usize) {
        let width = self.dims.width;
        if len < self.raw_start {
            self.raw.clear();
            self.raw_start = len;
        } else {
            self.raw.truncate((len - self.raw_start) * width);
        }
        if len < self.projected() {
            self.keep_rows(len);
        }
        self.tokens.truncate(len);
    }

    /// Appends committed `tokens` with their tapped `features` (`[n, width]`).
    fn append(&mut self, tokens: &[TokenId], features: &[f32]) {
        self.tokens.extend_from_slice(tokens);
        self.raw.extend_from_slice(features);
    }

    /// Projects the waiting features into every draft layer's keys and values.
    fn project(&mut self) {
        if self.raw.is_empty() {
            return;
        }
        let start = self.raw_start;
        let mut c = self.w.fc.product(&self.raw);
        rms_rows(&mut c, &self.w.fc_norm, self.dims.eps);
        for (l, w) in self.w.layers.iter().enumerate() {
            let mut k = w.k.product(&c);
            let v = w.v.product(&c);
            self.rope(&mut k, start, self.dims.kv);
            self.keys[l].extend_from_slice(&k);
            self.values[l].extend_from_slice(&v);
        }
        self.raw.clear();
        self.raw_start = self.tokens.len();
    }

    /// Autoregressive mode: brings the cached rows to `0..tokens.len()` for `context` (row
    /// `i` reads position `i`'s feature and the token `context[i + 1]`): drops rows whose
    /// next token changed, runs the missing ones causally in one pass.
    fn advance(&mut self, inp: &HostHead, context: &[TokenId]) {
        let m = self.tokens.len().min(context.len().saturating_sub(1));
        let valid = self
            .row_next
            .iter()
            .enumerate()
            .take_while(|&(i, &t)| i < m && context.get(i + 1) == Some(&t))
            .count();
        self.keep_rows(valid);
        if valid == m {
            return;
        }
        let Dims { width, eps, .. } = self.dims;
        let mut g = self.w.fc.product(&self.raw[valid * width..m * width]);
        rms_rows(&mut g, &self.w.fc_norm, eps);
        let next = &context[valid + 1..m + 1];
        let mut x = self.step_inputs(inp, &g, next);
        self.run_rows(&mut x, m - valid);
        self.states.extend_from_slice(&x);
        self.row_next.extend_from_slice(next);
    }

    /// `inp · [g ; E(token)]` for each row of `g` and its token.
    fn step_inputs(&self, inp: &HostHead, g: &[f32], tokens: &[TokenId]) -> Vec<f32> {
        let d = self.dims.d;
        let mut cat = Vec::with_capacity(tokens.len() * 2 * d);
        for (row, &t) in g.chunks(d).zip(tokens) {
            cat.extend_from_slice(row);
            cat.extend_from_slice(&self.embed[t as usize * d..(t as usize + 1) * d]);
        }
        inp.product(&cat)
    }

    /// Autoregressive mode: runs `rows` new rows `x` (in place, to their output states) through
    /// every layer, causally after the cached rows, and caches their keys and values.
    fn run_rows(&mut self, x: &mut [f32], rows: usize) {
        let start = self.projected();
        for l in 0..self.w.layers.len() {
            let (k, v) = self.layer(l, &self.w.layers[l], x, rows, start, true);
            self.keys[l].extend_from_slice(&k);
            self.values[l].extend_from_slice(&v);
        }
    }

    /// RoPE (Llama's halves) on `x` `[rows, heads · hd]` at positions `start..`.
    fn rope(&self, x: &mut [f32], start: usize, heads: usize) {
        let hd = self.dims.hd;
        let half = hd / 2;
        for (r, row) in x.chunks_mut(heads * hd).enumerate() {
            let pos = (start + r) as f64;
            for h in row.chunks_mut(hd) {
                for (j, &f) in self.inv_freq.iter().enumerate() {
                    let (sin, cos) = (pos * f).sin_cos();
                    let (a, b) = (h[j], h[j + half]);
                    h[j] = a * cos as f32 - b * sin as f32;
                    h[j + half] = b * cos as f32 + a * sin as f32;
                }
            }
        }
    }

    /// The final states `[gamma, d]` of the mask rows of a block whose known tokens are
    /// `known` (positions from the cache's end).
    fn block(&self, known: &[TokenId], gamma: usize) -> Vec<f32> {
        let Dims { d, eps, .. } = self.dims;
        let w = &self.w;
        let rows = known.len() + gamma;
        let mut x = Vec::with_capacity(rows * d);
        for &t in known {
            x.extend_from_slice(&self.embed[t as usize * d..(t as usize + 1) * d]);
        }
        for _ in 0..gamma {
            x.extend_from_slice(&w.mask);
        }
        let start = self.projected();
        for (l, lw) in w.layers.iter().enumerate() {
            self.layer(l, lw, &mut x, rows, start, false);
        }
        let mut out = x.split_off(known.len() * d);
        rms_rows(&mut out, &w.norm, eps);
        out
    }

    /// One draft layer over the rows `x` `[rows, d]` at positions `start..` (in place),
    /// attending to layer `l`'s `start` cached keys and values and to the rows (all of them,
    /// or with `causal` the ones up to their own). Returns the rows' keys and values.
    fn layer(
        &self,
        l: usize,
        w: &LayerWeights,
        x: &mut [f32],
        rows: usize,
        start: usize,
        causal: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let Dims {
            heads, kv, hd, eps, ..
        } = self.dims;
        let (keys, values) = (&self.keys[l], &self.values[l]);
        let mut h = x.to_vec();
        rms_rows(&mut h, &w.input_norm, eps);
        let (qd, kvd) = (heads * hd, kv * hd);
        let mut q = w.q.product(&h);
        let mut k = w.k.product(&h);
        let v = w.v.product(&h);
        self.rope(&mut q, start, heads);
        self.rope(&mut k, start, kv);
        // Attention over [cached features ; block], not causal.
        let n = start + rows;
        let key = |j: usize| -> &[f32] {
            if j < start {
                &keys[j * kvd..(j + 1) * kvd]
            } else {
                &k[(j - start) * kvd..(j - start + 1) * kvd]
            }
        };
        let value = |j: usize| -> &[f32] {
            if j < start {
                &values[j * kvd..(j + 1) * kvd]
            } else {
                &v[(j - start) * kvd..(j - start + 1) * kvd]
            }
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let group = heads / kv;
        let mut o = vec![0.0f32; rows * qd];
        let mut s_all = vec![0.0f32; n];
        for r in 0..rows {
            let s = &mut s_all[..if causal { start + r + 1 } else { n }];
            for hh in 0..heads {
                let g = hh / group;
                let qv = &q[r * qd + hh * hd..r * qd + (hh + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    let kj = &key(j)[g * hd..(g + 1) * hd];
                    *sj = dot(qv, kj) * scale;
                    max = max.max(*sj);
                }
                let mut total = 0.0;
                for sj in s.iter_mut() {
                    *sj = (*sj - max).exp();
                    total += *sj;
                }
                let out = &mut o[r * qd + hh * hd..r * qd + (hh + 1) * hd];
                for (j, &sj) in s.iter().enumerate() {
                    let p = sj / total;
                    for (a, &b) in out.iter_mut().zip(&value(j)[g * hd..(g + 1) * hd]) {
                        *a += p * b;
                    }
                }
            }
        }
        add(x, &w.o.product(&o));
        let mut h = x.to_vec();
        rms_rows(&mut h, &w.post_norm, eps);
        let mut gate = w.gate.product(&h);
        let up = w.up.product(&h);
        for (g, u) in gate.iter_mut().zip(&up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
        add(x, &w.down.product(&gate));
        (k, v)
    }
}

impl DiffusionDrafter for FeatureDrafter {
    fn name(&self) -> &str {
        match self.file.mode {
            DraftMode::Block => "feature-drafter",
            DraftMode::Autoregressive => "feature-drafter-ar",
        }
    }

    fn vocab_size(&self) -> usize {
        self.dims.vocab
    }

    fn target_sampling(&mut self, temperature: f32, noise: GumbelNoise) {
        self.noise = (temperature > 0.0).then_some((temperature, noise));
    }

    /// The settings this drafter is meant to run with: one draft (`k` 1) of
    /// [`FeatureDrafterFile::draft_positions`] tokens, cut where its running probability falls
    /// below 0.2 (a short draft costs little to verify, a long one does), drafted greedily.
    /// Measured on SmolLM2-135M-Instruct with the shipped drafter (`docs/specdiff.md`): on 12
    /// held-aside training-side prompts at T = 0, floors 0.2 and 0.4 gave 2.07x and 1.84x
    /// fewer forwards and 1.25x and 1.22x median wall speed-ups. Drafts only while drafting
    /// pays ([`Pace::cpu`](crate::Pace::cpu)).
    fn recommended(&self) -> crate::SpecDiffConfig {
        crate::SpecDiffConfig {
            k: 1,
            gamma: self.file.draft_positions,
            drafter_temperature: 0.0,
            min_draft_prob: AR_STOP,
            pace: Some(crate::Pace::cpu()),
            ..crate::SpecDiffConfig::default()
        }
    }

    /// Drafts `min(gamma, draft_positions)` positions, or none while the target has run
    /// none of the context (its first round) or more than 8 committed tokens lack features.
    /// With `gamma` 0 it only takes the target's features of the context (call it every
    /// round, as the request's [`ArNeed::Draft`](crate::ArNeed::Draft) asks, also when its
    /// pace skips a draft: the target keeps only its last forward's features).
    fn propose(
        &mut self,
        context: &[TokenId],
        gamma: usize,
        out: &mut Marginals,
    ) -> spot_core::Result<()> {
        *out = Marginals::new(self.top_k);
        self.sync(context);
        let m = self.tokens.len();
        let gamma = gamma.min(self.file.draft_positions);
        if m == 0 || context.len() - m > 8 || gamma == 0 {
            return Ok(());
        }
        let extra = self.extra_tokens(context);
        match self.file.mode {
            DraftMode::Block => {
                self.project();
                let d = self.dims.d;
                let h = self.block(&context[m..], gamma);
                let logits = self.short_head.product(&h);
                for (i, row) in h.chunks(d).enumerate() {
                    let s = self.file.shortlist.len();
                    let (top, probs) =
                        self.position(row, &logits[i * s..(i + 1) * s], &extra, context.len() + i);
                    out.push(&top, &probs)?;
                }
            }
            DraftMode::Autoregressive => self.draft_steps(context, gamma, &extra, out)?,
        }
        if let Some(lookup) = self.lookup.as_mut() {
            lookup.propose(context, gamma, &mut self.lookup_marginals)?;
            if expected_streak(&self.lookup_marginals) > expected_streak(out) {
                std::mem::swap(out, &mut self.lookup_marginals);
            }
        }
        Ok(())
    }
}

impl FeatureDrafter {
    /// The context's tokens outside the shortlist (the head scores them too), sorted.
    fn extra_tokens(&self, context: &[TokenId]) -> Vec<TokenId> {
        let mut extra: Vec<TokenId> = context
            .iter()
            .copied()
            .filter(|&t| !self.in_shortlist[t as usize])
            .collect();
        extra.sort_unstable();
        extra.dedup();
        extra
    }

    /// The candidates of the position `position` from its final state `row` (`[d]`, normed)
    /// and its shortlist logits: the head over the shortlist, then over the `extra` tokens.
    fn position(
        &self,
        row: &[f32],
        short_logits: &[f32],
        extra: &[TokenId],
        position: usize,
    ) -> (Vec<TokenId>, Vec<f32>) {
        let d = self.dims.d;
        let head = self.head.as_deref().unwrap_or(&self.embed);
        let mut ids = Vec::with_capacity(short_logits.len() + extra.len());
        let mut scored = Vec::with_capacity(short_logits.len() + extra.len());
        ids.extend_from_slice(&self.file.shortlist);
        scored.extend_from_slice(short_logits);
        for &t in extra {
            ids.push(t);
            scored.push(dot(row, &head[t as usize * d..(t as usize + 1) * d]));
        }
        self.candidates(&ids, &scored, position)
    }

    /// Autoregressive mode: runs the rows of the committed tokens past the cached features
    /// (their feature slot holds the previous row's own state), then drafts one token per
    /// step, each read by the next step, until `gamma` tokens or until the running product of
    /// the drafted tokens' probabilities falls below `stop_below`. The draft's rows leave the
    /// cache afterwards.
    fn draft_steps(
        &mut self,
        context: &[TokenId],
        gamma: usize,
        extra: &[TokenId],
        out: &mut Marginals,
    ) -> spot_core::Result<()> {
        let m = self.tokens.len();
        // `inp` leaves `self` while the rows run (`load` sets it in this mode).
        let Some(inp) = self.w.inp.take() else {
            return Ok(());
        };
        let done = if context.len() > m {
            self.steps(&inp, context, m, gamma, extra, out)
        } else {
            Ok(())
        };
        self.w.inp = Some(inp);
        done
    }

    /// [`Self::draft_steps`] with the `m` cached features' rows and `inp` at hand.
    fn steps(
        &mut self,
        inp: &HostHead,
        context: &[TokenId],
        m: usize,
        gamma: usize,
        extra: &[TokenId],
        out: &mut Marginals,
    ) -> spot_core::Result<()> {
        self.advance(inp, context);
        let Dims { d, eps, .. } = self.dims;
        let mut state = self.states[(m - 1) * d..m * d].to_vec();
        // Known tokens the target has not run, then the drafted ones.
        let mut feed: Vec<TokenId> = context[m + 1..].to_vec();
        let mut run = 1.0f32;
        let mut fed = 0;
        while out.len() < gamma {
            let Some(&token) = feed.get(fed) else {
                let mut h = state.clone();
                rms_rows(&mut h, &self.w.norm, eps);
                let logits = self.short_head.product(&h);
                let (top, probs) = self.position(&h, &logits, extra, context.len() + out.len());
                out.push(&top, &probs)?;
                run *= probs[0];
                if run < self.stop_below || out.len() == gamma {
                    break;
                }
                feed.push(top[0]);
                continue;
            };
            fed += 1;
            let mut g = state;
            rms_rows(&mut g, &self.w.fc_norm, eps);
            let mut x = self.step_inputs(inp, &g, &[token]);
            self.run_rows(&mut x, 1);
            state = x;
        }
        self.keep_rows(m);
        Ok(())
    }

    /// The `top_k` candidates of one position (most probable first, or at `T > 0` the noised
    /// choice first) and their probabilities: the softmax over every scored id, or at `T > 0`
    /// the softmax of the noised scores over the candidates.
    fn candidates(
        &self,
        ids: &[TokenId],
        logits: &[f32],
        position: usize,
    ) -> (Vec<TokenId>, Vec<f32>) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
        let many = if self.noise.is_some() {
            NOISED.max(self.top_k)
        } else {
            self.top_k
        };
        let mut order: Vec<usize> = (0..ids.len()).collect();
        let many = many.min(order.len());
        order.select_nth_unstable_by(many - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        order.truncate(many);
        order.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let mut probs: Vec<f32> = if let Some((t, noise)) = self.noise {
            let scores: Vec<f32> = order
                .iter()
                .map(|&j| logits[j] / t + noise.value(position as u64, ids[j]))
                .collect();
            let best = (0..order.len())
                .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
                .unwrap_or(0);
            order.swap(0, best);
            // The target decides with the same noise, so a pick is as safe as its noised
            // score's lead over the others': its probability is the softmax of the noised
            // scores (a drafter equal to the target is always right, however flat its
            // distribution), which the floor and the pace then read.
            let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = scores.iter().map(|&x| (x - top).exp()).sum();
            let mut p: Vec<f32> = scores.iter().map(|&x| (x - top).exp() / sum).collect();
            p.swap(0, best);
            p
        } else {
            order
                .iter()
                .map(|&j| (logits[j] - max).exp() / total)
                .collect()
        };
        let mut top: Vec<TokenId> = order.iter().map(|&j| ids[j]).collect();
        top.resize(self.top_k, top[0]);
        probs.resize(self.top_k, 0.0);
        (top, probs)
    }
}

/// The expected accepted length of the draft of first candidates, if each position's
/// probability were its acceptance rate: `Σ_i Π_{j ≤ i} p_j`.
fn expected_streak(m: &Marginals) -> f64 {
    let mut run = 1.0f64;
    (0..m.len())
        .map(|i| {
            run *= f64::from(m.at(i).1[0]);
            run
        })
        .sum()
}

/// RMS norm of each `w.len()`-wide row of `x`, in place.
fn rms_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_mut(w.len()) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `x += y`, elementwise.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
