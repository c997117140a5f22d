//! Autoregressive Llama, Qwen2 and Qwen3 models with a KV cache: the targets of SpecDiff-2.
//!
//! Weight map: the standard HF names (`model.embed_tokens`, `model.layers.N.self_attn.{q,k,v,
//! o}_proj`, q/k/v `.bias` for Qwen2 (and Llama with `attention_bias`), `self_attn.{q,k}_norm`
//! for Qwen3, `model.layers.N.mlp.{gate,up,down}_proj`, `input_layernorm`,
//! `post_attention_layernorm`, `model.norm`, `lm_head` (absent when tied)).
//!
//! Attention is causal. One cache per request slot; [`AutoregressiveModel::forward`] appends
//! each group's tokens (prefill, or a round's committed tokens) and scores its drafted
//! branches after them, all groups in one run, and [`AutoregressiveModel::truncate`] rolls
//! back.

use std::path::Path;

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use spot_core::{
    ArGroup, ArInfo, ArScores, AutoregressiveModel, BlockStats, CacheSlot, Slots, StatsQuery,
    TokenId,
};

use crate::attention::Attend;
use crate::config::DecoderConfig;
use crate::dense::{QWEN_NAMES, dense_net};
use crate::frame::{Frame, PrefixSlot, open};
use crate::precision::Precision;
use crate::transformer::{Net, Segment};
use spot_hf::{ModelError, Result};
use spot_reduce::{Logits, RowPlan};

/// A causal language model (`model_type` `"llama"`, `"qwen2"` or `"qwen3"`) on backend `B`.
///
/// ```no_run
/// use spot_core::{decode_autoregressive, ArConfig};
/// use spot_models::{CausalLm, CpuBackend};
/// let mut model = CausalLm::<CpuBackend>::load("SmolLM2-135M-Instruct".as_ref(), &Default::default())?;
/// let prompt = model.tokenizer().unwrap().encode("The capital of France is")?;
/// let out = decode_autoregressive(&mut model, &prompt, &ArConfig { max_new_tokens: 8, ..ArConfig::default() })?;
/// println!("{}", model.tokenizer().unwrap().decode(&out.tokens)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CausalLm<B: Backend> {
    cfg: DecoderConfig,
    pub(crate) net: Net<B>,
    pub(crate) frame: Frame<B>,
    info: ArInfo,
    pub(crate) slots: Slots<PrefixSlot<B>>,
    /// Where [`AutoregressiveModel::forward`] leaves the tapped layers' rows, when a
    /// [`CausalLm::tap_features`] asked for them.
    tap: Option<FeatureTap>,
}

/// One contiguous run of rows a forward processed for one request: `tokens` at positions
/// `start..start + tokens.len()` of `slot`'s sequence, and their features (the chosen layers'
/// outputs, concatenated per row: `[tokens.len(), width]` row-major). A run is either the
/// tokens the forward appended to the cache or one scored branch after them (whose features
/// hold only where the branch is the text that follows).
#[derive(Clone, Debug, PartialEq)]
pub struct TapRun {
    /// The request's cache slot.
    pub slot: CacheSlot,
    /// Absolute position of the run's first token.
    pub start: usize,
    /// The run's tokens.
    pub tokens: Vec<TokenId>,
    /// `[tokens.len(), width]` row-major: per row, the tapped layers' hidden states in the
    /// order the tap named them.
    pub features: Vec<f32>,
}

/// A shared handle on the runs a [`CausalLm`]'s last forward tapped (a drafter that reads the
/// target's hidden states holds one; the target fills it in the verification forward it runs
/// anyway, so reading features costs no extra pass). Each forward replaces the runs of the one
/// before, so a tap nobody reads holds one forward's rows, not a decode's. Cheap to clone; all
/// clones share the runs.
#[derive(Clone, Debug, Default)]
pub struct FeatureTap {
    layers: Vec<usize>,
    width: usize,
    runs: std::sync::Arc<std::sync::Mutex<Vec<TapRun>>>,
}

impl FeatureTap {
    /// The tapped layers (0-based; each row's features are their outputs in this order).
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Features per row (`layers().len() × hidden`).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The last forward's runs (unless taken since), leaving none.
    pub fn take(&self) -> Vec<TapRun> {
        let mut r = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *r)
    }

    fn replace(&self, runs: Vec<TapRun>) {
        *self.runs.lock().unwrap_or_else(|e| e.into_inner()) = runs;
    }
}

/// The slot of single-sequence use (tests, tools, the masked continuation).
pub(crate) const SLOT0: CacheSlot = CacheSlot(0);

impl<B: Backend> std::fmt::Debug for CausalLm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalLm")
            .field("dir", &self.frame.dir)
            .field("config", &self.cfg)
            .field("slots", &self.slots.open_count())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> CausalLm<B> {
    /// Loads a Llama, Qwen2 or Qwen3 folder: `config.json`, `generation_config.json`
    /// (optional), safetensors (single or sharded), `tokenizer.json` (optional).
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_as(dir, device, Precision::Auto)
    }

    /// [`Self::load`] with the weights and activations in `precision`.
    pub fn load_as(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let (cfg, path) = DecoderConfig::read(dir)?;
        cfg.check(&path, &["llama", "qwen2", "qwen3"])?;
        let bias = cfg.model_type == "qwen2" || cfg.attention_bias;
        let qk_norm = cfg.model_type == "qwen3";
        let (frame, weights) = open::<B>(dir, &cfg, None, device)?;
        let mut net = dense_net(
            &cfg.dense_spec(bias, qk_norm),
            &QWEN_NAMES,
            &weights,
            (device, precision),
        )?;
        // CPU backends: the host kernel for every projection (a verification forward of a few
        // tokens then costs about what one token does).
        net.pack_host_projections();
        let info = ArInfo {
            vocab_size: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            stop_ids: frame.stop_ids.clone(),
        };
        Ok(Self {
            cfg,
            net,
            frame,
            info,
            slots: Slots::new(),
            tap: None,
        })
    }

    /// From now on, every [`AutoregressiveModel::forward`] leaves in the returned handle, per
    /// request, the outputs of `layers` (0-based, each below the layer count; the residual
    /// stream after the layer) for the rows it appended and for every scored branch
    /// ([`TapRun`]), each forward replacing the last one's. A second call with the same
    /// layers shares the first's handle (drafters that take turns on one target each read the
    /// forwards they drive); with other layers it replaces it (the first handle then receives
    /// nothing more).
    pub fn tap_features(&mut self, layers: &[usize]) -> Result<FeatureTap> {
        let n = self.cfg.num_hidden_layers;
        if layers.is_empty() {
            return Err(ModelError::Request(
                "a feature tap needs at least one layer".into(),
            ));
        }
        if let Some(&l) = layers.iter().find(|&&l| l >= n) {
            return Err(ModelError::Request(format!(
                "feature tap: layer {l} is outside the model's {n} layers"
            )));
        }
        if let Some(tap) = self.tap.as_ref().filter(|t| t.layers == layers) {
            return Ok(tap.clone());
        }
        self.net.set_taps(layers);
        let tap = FeatureTap {
            layers: layers.to_vec(),
            width: layers.len() * self.cfg.hidden_size,
            runs: Default::default(),
        };
        self.tap = Some(tap.clone());
        Ok(tap)
    }

    crate::frame::folder_accessors!(DecoderConfig);

    /// Appends `tokens` to slot 0 and returns their logits `[len, vocab]` as host values (for
    /// tests and tools; decoding uses [`AutoregressiveModel::forward`]).
    pub fn extend_logits(&mut self, tokens: &[TokenId]) -> Result<Logits> {
        let hidden = self.append(SLOT0, tokens)?;
        self.net.head.logits_host(hidden)
    }

    /// The statistics of the `gamma` positions after `context` read as a masked-diffusion
    /// continuation in slot 0 (the layout of SpecDiff-2's masked drafter,
    /// `spot_specdiff::MaskedDrafter`): position `i` comes from the row at `context.len() + i
    /// - 1`, the last context token's for `i = 0` and for `i > 0` the `i`-th of `gamma - 1`
    /// `mask` tokens placed after the context, which attend to the whole context and to each
    /// other (the context never attends to them). One [`BlockStats`] of `gamma` positions
    /// under `query`.
    ///
    /// The slot keeps its cache for the longest common prefix of its text and `context`
    /// (at least one token short of it) and appends the rest, so a caller whose context
    /// grows by a few tokens per call pays for those alone; the masks are never cached.
    pub fn masked_continuation(
        &mut self,
        context: &[TokenId],
        mask: TokenId,
        gamma: usize,
        query: &StatsQuery,
    ) -> Result<BlockStats> {
        if context.is_empty() || gamma == 0 {
            return Err(ModelError::Request(format!(
                "a masked continuation needs a context and at least one position (got {} \
                 tokens, gamma {gamma})",
                context.len()
            )));
        }
        let keep = self.slots.get(SLOT0)?.prefix.iter();
        let keep = keep
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        self.truncate(SLOT0, keep)?;
        let new = &context[keep..];
        self.frame.check_end(context.len() + gamma, "sequence")?;
        let hidden = self.append(SLOT0, new)?;
        let last = hidden.narrow(0, new.len() - 1, 1);
        let slot = self.slots.get_mut(SLOT0)?;
        let rows = if gamma > 1 {
            let masks = vec![mask; gamma - 1];
            let mut ids = Vec::with_capacity(gamma - 1);
            self.frame.push_ids(&masks, &mut ids)?;
            let seg = Segment {
                n: 1,
                len: gamma - 1,
                start: slot.prefix.len(),
                cache: &slot.cache,
                after: None,
            };
            let (h, _) = self.net.run_segments(ids, &[seg], Attend::Bidirectional);
            Tensor::cat(vec![last, h], 0)
        } else {
            last
        };
        let mut stats = self.frame.stats(
            &self.net.head,
            rows,
            &RowPlan::all(gamma),
            (context.len(), &mut slot.noise),
            query,
        )?;
        stats.pop().ok_or_else(|| {
            ModelError::Request("the head returned no statistics for the continuation".into())
        })
    }

    /// Appends `tokens` to `slot`'s cache in one run; their final hidden states.
    pub(crate) fn append(&mut self, slot: CacheSlot, tokens: &[TokenId]) -> Result<Tensor<B, 2>> {
        if tokens.is_empty() {
            return Err(ModelError::Request("no tokens to append".to_string()));
        }
        let s = self.slots.get_mut(slot)?;
        let start = s.prefix.len();
        self.frame.check_end(start + tokens.len(), "sequence")?;
        let mut ids = Vec::with_capacity(tokens.len());
        self.frame.push_ids(tokens, &mut ids)?;
        let (hidden, kv) = self
            .net
            .run(ids, 1, tokens.len(), start, &s.cache, Attend::Causal);
        Net::extend_cache(&mut s.cache, kv);
        s.prefix.extend_from_slice(tokens);
        Ok(hidden)
    }
}

impl<B: Backend> CausalLm<B> {
    /// The [`TapRun`]s of one forward over `groups` laid out as `at` (`rows` per segment;
    /// `width` features per row).
    fn tap_runs(
        &self,
        groups: &[ArGroup<'_>],
        at: &[GroupRows],
        (rows, width): (&[usize], usize),
    ) -> Result<Vec<TapRun>> {
        let tapped = self.net.take_tapped();
        if tapped.is_empty() {
            return Ok(Vec::new());
        }
        let all = crate::values::host_values(Tensor::cat(tapped, 1));
        let total: usize = rows.iter().sum();
        if all.len() != total * width {
            return Err(ModelError::Request(format!(
                "feature tap: {} values for {total} rows of {width}",
                all.len()
            )));
        }
        let row0 = |si: usize| rows[..si].iter().sum::<usize>();
        let feats = |r: usize, n: usize| all[r * width..(r + n) * width].to_vec();
        let mut out = Vec::new();
        for (g, seg) in groups.iter().zip(at) {
            let start = self.slots.get(g.slot)?.prefix.len();
            out.push(TapRun {
                slot: g.slot,
                start,
                tokens: g.shared.to_vec(),
                features: feats(row0(seg.shared), g.shared.len()),
            });
            let after = start + g.shared.len();
            let nonempty = g.branches.iter().filter(|b| !b.is_empty());
            for (k, b) in nonempty.enumerate() {
                // Together: one segment, branch k at k·len; else one segment per branch.
                let r = if seg.together {
                    row0(seg.branches[0]) + k * b.len()
                } else {
                    row0(seg.branches[k])
                };
                out.push(TapRun {
                    slot: g.slot,
                    start: after,
                    tokens: b.clone(),
                    features: feats(r, b.len()),
                });
            }
        }
        Ok(out)
    }
}

/// Where a group's rows sit in a run: its shared segment, then its branch segments (one
/// for branches of equal length, else one per non-empty branch).
struct GroupRows {
    shared: usize,
    branches: Vec<usize>,
    /// The branches are one segment of equal-length sequences.
    together: bool,
}

impl<B: Backend> AutoregressiveModel for CausalLm<B> {
    fn ar_info(&self) -> &ArInfo {
        &self.info
    }

    fn open_slot(&mut self) -> spot_core::Result<CacheSlot> {
        Ok(self.slots.open())
    }

    fn close_slot(&mut self, slot: CacheSlot) {
        self.slots.close(slot);
    }

    crate::frame::cache_usage!();

    fn cached_len(&self, slot: CacheSlot) -> usize {
        self.slots.get(slot).map_or(0, |s| s.prefix.len())
    }

    fn truncate(&mut self, slot: CacheSlot, len: usize) -> spot_core::Result<()> {
        let s = self.slots.get_mut(slot)?;
        if len >= s.prefix.len() {
            return Ok(());
        }
        s.prefix.truncate(len);
        if len == 0 {
            s.cache.clear();
            s.noise.clear();
        } else {
            for c in &mut s.cache {
                c.k = c.k.clone().narrow(2, 0, len);
                c.v = c.v.clone().narrow(2, 0, len);
            }
        }
        Ok(())
    }

    /// One run over every group: each group's `shared` tokens are a segment over its slot's
    /// cache, and its branches segments that attend to that cache extended by the shared
    /// keys and values of the same layer (`Segment::after`), so each branch's statistics are
    /// bit-identical to appending it alone; then the shared keys and values join the cache.
    /// Only each shared run's last row is reduced (its [`ArScores::shared`] holds that one
    /// entry).
    fn forward(&mut self, groups: &[ArGroup<'_>]) -> spot_core::Result<Vec<ArScores>> {
        CacheSlot::check_distinct(groups.iter().map(|g| g.slot))?;
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = Vec::new();
        let mut segments: Vec<Segment<'_, B>> = Vec::new();
        let mut at = Vec::with_capacity(groups.len());
        for g in groups {
            g.query.validate()?;
            if g.shared.is_empty() {
                return Err(ModelError::Request("no tokens to append".to_string()).into());
            }
            let slot = self.slots.get(g.slot)?;
            let (cache, start) = (&slot.cache[..], slot.prefix.len());
            let longest = g.branches.iter().map(Vec::len).max().unwrap_or(0);
            self.frame
                .check_end(start + g.shared.len() + longest, "sequence")?;
            self.frame.push_ids(g.shared, &mut ids)?;
            for b in g.branches {
                self.frame.push_ids(b, &mut ids)?;
            }
            let mut push = |n: usize, len: usize, start: usize, after: Option<usize>| {
                segments.push(Segment {
                    n,
                    len,
                    start,
                    cache,
                    after,
                });
                segments.len() - 1
            };
            let shared = push(1, g.shared.len(), start, None);
            let after = start + g.shared.len();
            let len = g.branches.first().map_or(0, Vec::len);
            let together = len > 0 && g.branches.iter().all(|b| b.len() == len);
            let branches = if together {
                vec![push(g.branches.len(), len, after, Some(shared))]
            } else {
                g.branches
                    .iter()
                    .filter(|b| !b.is_empty())
                    .map(|b| push(1, b.len(), after, Some(shared)))
                    .collect()
            };
            at.push(GroupRows {
                shared,
                branches,
                together,
            });
        }
        let (hidden, mut kv) = self.net.run_segments(ids, &segments, Attend::Causal);
        let rows: Vec<usize> = segments.iter().map(|s| s.n * s.len).collect();
        drop(segments);
        let row0 = |si: usize| rows[..si].iter().sum::<usize>();
        if let Some(tap) = &self.tap {
            tap.replace(self.tap_runs(groups, &at, (&rows, tap.width))?);
        }
        let mut out = Vec::with_capacity(groups.len());
        for (g, seg) in groups.iter().zip(&at) {
            let slot = self.slots.get_mut(g.slot)?;
            Net::extend_cache(&mut slot.cache, std::mem::take(&mut kv[seg.shared]));
            slot.prefix.extend_from_slice(g.shared);
            let end = slot.prefix.len();
            // The shared run's last row predicts the branches' first position.
            let last = hidden
                .clone()
                .narrow(0, row0(seg.shared) + rows[seg.shared] - 1, 1);
            let shared = self.frame.stats(
                &self.net.head,
                last,
                &RowPlan::all(1),
                (end, &mut slot.noise),
                g.query,
            )?;
            let mut branches = Vec::with_capacity(g.branches.len());
            let mut segs = seg.branches.iter();
            if seg.together {
                // Equal lengths: one segment of `n` branches.
                let si = seg.branches[0];
                let len = g.branches[0].len();
                branches = self.frame.stats(
                    &self.net.head,
                    hidden.clone().narrow(0, row0(si), rows[si]),
                    &RowPlan::all_of(g.branches.len(), len),
                    (end + 1, &mut slot.noise),
                    g.query,
                )?;
            } else {
                for b in g.branches {
                    if b.is_empty() {
                        branches.push(BlockStats::new(g.query.top_k));
                        continue;
                    }
                    let Some(&si) = segs.next() else { break };
                    let mut stats = self.frame.stats(
                        &self.net.head,
                        hidden.clone().narrow(0, row0(si), rows[si]),
                        &RowPlan::all(b.len()),
                        (end + 1, &mut slot.noise),
                        g.query,
                    )?;
                    branches.push(stats.pop().unwrap_or_default());
                }
            }
            out.push(ArScores {
                shared: shared.into_iter().next().unwrap_or_default(),
                branches,
            });
        }
        Ok(out)
    }
}
