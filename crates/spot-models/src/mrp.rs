//! The MRP baseline (multi-token residual prediction, Xu et al., arXiv 2605.18817): a small
//! module on top of an SDAR target that predicts how the target's logits move when more of a
//! block is committed, so that a chain of drafts needs no target forward between its steps.
//!
//! The module reads the target's final hidden states `h` of a block (after the final norm, the
//! stale statistics' [`BlockStats::hidden`]) and the block's current tokens, and returns a
//! residual in hidden space:
//!
//! `h_C = norm(layers(W [enorm(embed(ids)); hnorm(h)]))`, logits `head(h + h_C)`
//!
//! with `layers` decoder layers of the target's own shape attending bidirectionally within the
//! block, and the target's embedding and head (frozen in training). Applied recursively along
//! a chain: the step at a node reads `h_A + Σ h_C` of its ancestors and the node's tokens.
//! [`MrpScorer`] drafts with it under the shared verifier: at every node the target's own rule
//! (the most confident masked position with its choice, under the coupled noise at `T > 0`)
//! applied to the corrected logits, one child per node, so the tree is MRP's chain.
//!
//! Files: `mrp.safetensors` (the module's tensors: `mrp.enorm`, `mrp.hnorm`, `mrp.eh_proj`,
//! `mrp.layers.N.*` with the Qwen3 layer names, `mrp.norm`) and `mrp.json` ([`MrpFile`]) next
//! to it, written by `tools/mrp/train_mrp.py`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use serde::Deserialize;
use spot_core::{BlockStats, ConfidenceRule, StatsQuery, TokenId};
use spot_tree::{NodeBatch, OrderScorer, ScoreContext, TreeError, fill_normalised};

use crate::attention::Attend;
use crate::config::DecoderConfig;
use crate::dense::{DenseNames, QWEN_NAMES, dense_net};
use crate::head::{MaskTerms, NoiseRows, mask_bias};
use crate::host_head::{RowJob, RowStats};
use crate::loader::Loader;
use crate::precision::Precision;
use crate::reduce::noise_table;
use crate::transformer::{Net, Segment, rms_norm};
use crate::values::host_values;
use spot_hf::hf::{Weights, read_json};
use spot_hf::{ModelError, Result};

/// File name of a model folder's default MRP module description (`mrp.safetensors` next to
/// it holds the weights).
pub const DEFAULT_MRP: &str = "mrp.json";

/// The format name in [`MrpFile`].
pub const MRP_FORMAT: &str = "spot-mrp";

/// The most decoder layers an MRP module may declare.
const MAX_LAYERS: usize = 64;

/// The tensor names of the module's layers (the embedding and head are the target's).
const MRP_NAMES: DenseNames = DenseNames {
    norm: "mrp.norm.weight",
    layer: "mrp.layers.{n}.",
    ..QWEN_NAMES
};

/// What `mrp.json` holds.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MrpFile {
    /// Always [`MRP_FORMAT`].
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// Decoder layers of the module.
    pub layers: usize,
    /// Parameters of the module (its own tensors).
    pub parameters: usize,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// The training record (kept as written; not read).
    #[serde(default)]
    pub training: serde_json::Value,
    /// A reference output of the module on one held-out state (the tests recompute it).
    #[serde(default)]
    pub reference: Option<MrpReference>,
}

/// One state and the trainer's corrected logits for it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MrpReference {
    /// Prefix and block tokens of the stale state (the block is the last `block_size`).
    pub ids: Vec<TokenId>,
    /// The block one commit later: the tokens the module step reads.
    pub next: Vec<TokenId>,
    /// Corrected logits at some masked positions of `next`.
    pub positions: Vec<ReferencePosition>,
}

/// The top corrected logits at one block position.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReferencePosition {
    /// Position in the block.
    pub position: usize,
    /// Token ids, largest logit first.
    pub ids: Vec<TokenId>,
    /// Their logits.
    pub logits: Vec<f32>,
}

/// The MRP module on backend `B`, with the target's embedding and head.
///
/// ```no_run
/// use spot_models::{CpuBackend, Mrp};
/// let dir = std::path::Path::new("models/sdar-tiny-code");
/// let mrp = Mrp::<CpuBackend>::load(dir, &dir.join("mrp.json"), &Default::default())?;
/// println!("{} layers", mrp.file().layers);
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub struct Mrp<B: Backend> {
    net: Net<B>,
    enorm: Tensor<B, 2>,
    hnorm: Tensor<B, 2>,
    eh_proj: Tensor<B, 2>,
    file: MrpFile,
    hidden: usize,
    vocab: usize,
}

impl<B: Backend> std::fmt::Debug for Mrp<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mrp")
            .field("layers", &self.file.layers)
            .field("hidden", &self.hidden)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Mrp<B> {
    /// Loads the module described by `file` (`mrp.json`; weights in `mrp.safetensors` next to
    /// it) for the SDAR target folder `target` (its `config.json` gives the layers' shape, its
    /// weights the embedding and head). f32 weights.
    pub fn load(target: &Path, file: &Path, device: &B::Device) -> Result<Self> {
        let meta: MrpFile = read_json(file)?;
        let bad = |field: &'static str, reason: String| ModelError::InvalidConfig {
            path: file.to_path_buf(),
            field,
            reason,
        };
        if meta.format != MRP_FORMAT {
            return Err(bad(
                "format",
                format!("expected {MRP_FORMAT:?}, got {:?}", meta.format),
            ));
        }
        if meta.version != 1 {
            return Err(bad(
                "version",
                format!("this build reads version 1, got {}", meta.version),
            ));
        }
        if meta.layers == 0 || meta.layers > MAX_LAYERS {
            return Err(bad(
                "layers",
                format!("must be in [1, {MAX_LAYERS}], got {}", meta.layers),
            ));
        }
        let (cfg, path) = DecoderConfig::read(target)?;
        cfg.check(&path, &["sdar", "qwen3"])?;
        let weights = Weights::open(target)?.with_file(&mrp_weights_path(file))?;
        let mut spec = cfg.dense_spec(false, true);
        spec.layers = meta.layers;
        let net = dense_net(&spec, &MRP_NAMES, &weights, (device, Precision::F32))?;
        let ld = Loader::<B> {
            weights: &weights,
            device: device.clone(),
            dtype: Precision::F32.resolve::<B>(&weights, device)?,
        };
        let h = cfg.hidden_size;
        Ok(Self {
            enorm: ld.row("mrp.enorm.weight", h)?,
            hnorm: ld.row("mrp.hnorm.weight", h)?,
            eh_proj: ld.linear("mrp.eh_proj.weight", h, 2 * h)?,
            net,
            file: meta,
            hidden: h,
            vocab: cfg.vocab_size,
        })
    }

    /// The description file.
    pub fn file(&self) -> &MrpFile {
        &self.file
    }

    /// Width of the hidden states it reads.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// Vocabulary size of the head.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// One step over `n` states of a block of `len` positions: `ids` their tokens (`n * len`),
    /// `hidden` the hidden states it reads (`n * len * hidden_size`: the target's, plus the
    /// residuals of the earlier steps of a chain). Returns the residuals `h_C`, same layout.
    pub fn step(&self, ids: &[TokenId], hidden: &[f32], n: usize, len: usize) -> Result<Vec<f32>> {
        let rows = n * len;
        let h = self.hidden;
        if ids.len() != rows || hidden.len() != rows * h {
            return Err(ModelError::Request(format!(
                "MRP step over {n} x {len} positions got {} ids and {} hidden values",
                ids.len(),
                hidden.len()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(ModelError::Request(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab
            )));
        }
        let device = &self.net.device;
        let dtype = self.net.dtype;
        let ids: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [rows]), device);
        let e = self.net.embed.clone().select(0, ids);
        let x = Tensor::<B, 2>::from_data(TensorData::new(hidden.to_vec(), [rows, h]), device)
            .cast(dtype);
        let eps = self.net.geo.eps;
        let x = Tensor::cat(
            vec![rms_norm(e, &self.enorm, eps), rms_norm(x, &self.hnorm, eps)],
            1,
        )
        .matmul(self.eh_proj.clone());
        let segment = Segment {
            n,
            len,
            start: 0,
            cache: &[],
            after: None,
        };
        let (out, _) = self.net.run_embedded(x, &[segment], Attend::Bidirectional);
        Ok(host_values(out))
    }

    /// The head's logits of `rows` hidden states (`rows * hidden_size` values), row-major.
    pub fn logits(&self, hidden: &[f32], rows: usize) -> Vec<f32> {
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(hidden.to_vec(), [rows, self.hidden]),
            &self.net.device,
        )
        .cast(self.net.dtype);
        self.net.head.logits_host(t).into_vec()
    }

    /// The target's reduction (its choice rule under `query`, as a forward applies it) of
    /// corrected hidden `rows` (`jobs.len() * hidden_size` values, one row per job).
    fn reduce(
        &self,
        rows: Vec<f32>,
        jobs: &[RowJob],
        positions: &[usize],
        query: &StatsQuery,
        (mask, noise): (MaskTerms<'_, B>, Option<NoiseRows<'_, B>>),
    ) -> Result<Vec<RowStats>> {
        let tensor = || {
            let data = TensorData::new(rows.clone(), [jobs.len(), self.hidden]);
            Tensor::<B, 2>::from_data(data, &self.net.device).cast(self.net.dtype)
        };
        self.net
            .head
            .reduce_rows(tensor, Some(&rows), jobs, positions, query, mask, noise)
    }
}

/// `mrp.safetensors` next to the description file `file`.
pub fn mrp_weights_path(file: &Path) -> PathBuf {
    file.with_file_name("mrp.safetensors")
}

/// One scored node: the residual it accumulated and its choice per block position with its
/// probability (`None` where committed).
struct Scored {
    acc: Vec<f32>,
    choice: Vec<Option<(TokenId, f32)>>,
}

/// The Gumbel rows of one block under one seed (host table, device copy when a device head
/// reads it).
struct BlockNoise<B: Backend> {
    key: (u64, usize, usize),
    host: Vec<f32>,
    device: Option<Tensor<B, 2>>,
}

/// MRP's drafts as an [`OrderScorer`]: at every node, the position the target's rule picks
/// under the corrected logits (score 1, every other position 0) and its choice as the only
/// token hypothesis, so the best-first builder grows one chain of `D` nodes. The corrected
/// logits go through the target's own reduction (the fused host kernel on CPU backends): the
/// choice `argmax(l / T + G)` (never the mask), ranked by the decode's confidence rule
/// ([`MrpScorer::with_rule`]). Where the stale statistics carry no hidden states (a block's
/// first forward served by a look-ahead), the target's rule on the stale statistics.
pub struct MrpScorer<B: Backend> {
    mrp: std::sync::Arc<Mrp<B>>,
    memo: HashMap<Vec<TokenId>, Scored>,
    fallback: bool,
    rule: ConfidenceRule,
    sample_top_k: Option<usize>,
    tree: bool,
    noise: Option<BlockNoise<B>>,
    bias: Option<(TokenId, Tensor<B, 2>)>,
    /// Tokens only (for [`MrpTokens`], which starts each batch with [`MrpScorer::start`]
    /// instead of scoring it): the module runs for a node, and reduces at a position, only
    /// where the builder asks for tokens.
    lazy: bool,
}

impl<B: Backend> std::fmt::Debug for MrpScorer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrpScorer")
            .field("mrp", &self.mrp)
            .field("rule", &self.rule)
            .field("sample_top_k", &self.sample_top_k)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> MrpScorer<B> {
    /// A scorer drafting with `mrp` (shared: one module serves every decoder), for decodes
    /// with the default confidence rule and no top-k truncation.
    pub fn new(mrp: std::sync::Arc<Mrp<B>>) -> Self {
        Self {
            mrp,
            memo: HashMap::new(),
            fallback: false,
            rule: ConfidenceRule::Probability,
            sample_top_k: None,
            tree: false,
            noise: None,
            bias: None,
            lazy: false,
        }
    }

    /// Scores every masked position by its corrected confidence (normalised over the node's
    /// masked positions, as BlockSpec scores the stale ones) instead of naming only the most
    /// confident: the best-first builder then grows a tree over the corrected statistics,
    /// each drafted position with the module's choice at its corrected probability.
    pub fn tree(mut self) -> Self {
        self.tree = true;
        self
    }

    /// Drafts under the decode's confidence rule and top-k truncation
    /// ([`spot_core::DecodeConfig::confidence`], [`spot_core::DecodeConfig::sample_top_k`]),
    /// so the chain follows the rule the target commits by.
    pub fn with_rule(mut self, rule: ConfidenceRule, sample_top_k: Option<usize>) -> Self {
        self.rule = rule;
        self.sample_top_k = sample_top_k;
        self
    }

    /// The query the target's reduction runs under in this round.
    fn query(&self, ctx: &ScoreContext<'_>) -> StatsQuery {
        let mut q = StatsQuery::new(ctx.temperature, ctx.noise.map_or(0, |g| g.seed()));
        q.rule = self.rule;
        q.sample_top_k = self.sample_top_k;
        q.top_k = 1;
        q
    }

    /// The Gumbel rows of the block `ctx` decodes under `query` (made once per block and
    /// seed).
    fn block_noise(&mut self, ctx: &ScoreContext<'_>, query: &StatsQuery, l: usize) {
        let Some(g) = ctx.noise.filter(|_| ctx.temperature > 0.0) else {
            return;
        };
        let key = (g.seed(), ctx.block_start, l);
        if self.noise.as_ref().is_some_and(|n| n.key == key) {
            return;
        }
        self.noise = Some(BlockNoise {
            key,
            host: noise_table(query, ctx.block_start, l, self.mrp.vocab),
            device: None,
        });
    }

    fn error(&self, reason: impl Into<String>) -> TreeError {
        TreeError::Scorer {
            scorer: "mrp".to_string(),
            reason: reason.into(),
        }
    }

    /// The stale hidden states, checked against the block.
    fn stale_hidden<'s>(&self, stale: &'s BlockStats, l: usize) -> Result<&'s [f32], TreeError> {
        let Some((dim, values)) = stale.hidden() else {
            return Ok(&[]);
        };
        if dim != self.mrp.hidden || values.len() != l * dim {
            return Err(self.error(format!(
                "hidden states of width {dim} ({} values) for a block of {l}; the module reads \
                 width {}",
                values.len(),
                self.mrp.hidden
            )));
        }
        Ok(values)
    }
    /// Starts a scored batch: a round's first batch clears the memo; returns the stale
    /// hidden states and sets `fallback` when the target returned none.
    fn start<'s>(
        &mut self,
        ctx: &ScoreContext<'s>,
        nodes: &NodeBatch<'_>,
    ) -> Result<&'s [f32], TreeError> {
        if nodes.depth(0) == 0 {
            self.memo.clear();
        }
        let base = self.stale_hidden(ctx.stale, ctx.root.len())?;
        self.fallback = base.is_empty();
        Ok(base)
    }

    /// Runs the module's step for nodes `which` of `nodes` in one call (each reads the stale
    /// hidden states plus its parent's residuals) and stores each node's residuals in the
    /// memo, its choices not yet reduced.
    fn step_nodes(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        which: &[usize],
        base: &[f32],
    ) -> Result<(), TreeError> {
        if which.is_empty() {
            return Ok(());
        }
        let (l, h, mask) = (ctx.root.len(), self.mrp.hidden, nodes.mask_id());
        // 1. Each node's input: the stale hidden states plus its parent's residuals.
        let mut ids = Vec::with_capacity(which.len() * l);
        let mut input = Vec::with_capacity(which.len() * l * h);
        let mut parents = Vec::with_capacity(which.len());
        let mut path = Vec::new();
        for &i in which {
            let tokens = nodes.tokens(i);
            ids.extend_from_slice(tokens);
            nodes.path(i, &mut path);
            let parent = path.last().and_then(|c| {
                let mut p = tokens.to_vec();
                p[c.position] = mask;
                self.memo.get(&p).map(|s| s.acc.clone())
            });
            let acc = parent.unwrap_or_else(|| vec![0.0; l * h]);
            input.extend(base.iter().zip(&acc).map(|(a, b)| a + b));
            parents.push(acc);
        }
        let hc = self
            .mrp
            .step(&ids, &input, which.len(), l)
            .map_err(|e| self.error(e.to_string()))?;
        // 2. Each node's residuals: its parent's plus its own step's.
        for (k, (&i, mut acc)) in which.iter().zip(parents).enumerate() {
            acc.iter_mut()
                .zip(&hc[k * l * h..(k + 1) * l * h])
                .for_each(|(a, c)| *a += c);
            let choice = vec![None; l];
            self.memo
                .insert(nodes.tokens(i).to_vec(), Scored { acc, choice });
        }
        Ok(())
    }

    /// The module's choice at `position` of node `i`, once reduced.
    fn choice(&self, nodes: &NodeBatch<'_>, i: usize, position: usize) -> Option<(TokenId, f32)> {
        self.memo
            .get(nodes.tokens(i))
            .and_then(|s| s.choice.get(position).copied().flatten())
    }

    /// Reduces the corrected hidden state (stale plus the node's residuals) at each
    /// `(node, position)` of `wanted` by the target's rule, in one call, and stores each
    /// choice in the node's memo. A row's statistics do not depend on the other rows of the
    /// call, so reducing a few positions gives the values reducing all of them would.
    fn reduce_pairs(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<Vec<RowStats>, TreeError> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let (l, h, mask) = (ctx.root.len(), self.mrp.hidden, nodes.mask_id());
        let base = self.stale_hidden(ctx.stale, l)?;
        let query = self.query(ctx);
        self.block_noise(ctx, &query, l);
        let mut rows = Vec::with_capacity(wanted.len() * h);
        let (mut jobs, mut positions) = (Vec::new(), Vec::new());
        for &(i, s) in wanted {
            let Some(memo) = self.memo.get(nodes.tokens(i)) else {
                return Err(self.error("token hypotheses asked of a node that was not scored"));
            };
            rows.extend(
                base[s * h..(s + 1) * h]
                    .iter()
                    .zip(&memo.acc[s * h..(s + 1) * h])
                    .map(|(a, b)| a + b),
            );
            jobs.push(RowJob {
                hidden: jobs.len(),
                noise: s,
            });
            positions.push(ctx.block_start + s);
        }
        if self.bias.as_ref().is_none_or(|(m, _)| *m != mask) {
            let bias = mask_bias(mask, self.mrp.vocab, &self.mrp.net.device);
            self.bias = Some((mask, bias));
        }
        let terms = MaskTerms {
            id: Some(mask),
            bias: self.bias.as_ref().map(|(_, b)| b),
        };
        let noise = self.noise.as_mut().map(|n| NoiseRows {
            host: &n.host,
            device: &mut n.device,
        });
        let reduced = self
            .mrp
            .reduce(rows, &jobs, &positions, &query, (terms, noise))
            .map_err(|e| self.error(e.to_string()))?;
        if reduced.len() != wanted.len() {
            return Err(self.error("the reduction returned too few rows"));
        }
        for (&(i, s), r) in wanted.iter().zip(&reduced) {
            if let Some(memo) = self.memo.get_mut(nodes.tokens(i)) {
                memo.choice[s] = Some((r.token, r.token_prob as f32));
            }
        }
        Ok(reduced)
    }
}

impl<B: Backend> OrderScorer for MrpScorer<B> {
    fn name(&self) -> &str {
        if self.tree { "mrp-tree" } else { "mrp" }
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        let l = ctx.root.len();
        let mask = nodes.mask_id();
        if nodes.is_empty() {
            return Ok(());
        }
        let base = self.start(ctx, nodes)?;
        if self.fallback {
            // The target's rule on the stale statistics: its most confident masked position.
            for i in 0..nodes.len() {
                let best = best_position(nodes.tokens(i), mask, |s| ctx.stale.confidence(s));
                if let Some(s) = best {
                    out[i * l + s] = 1.0;
                }
            }
            return Ok(());
        }
        let all: Vec<usize> = (0..nodes.len()).collect();
        self.step_nodes(ctx, nodes, &all, base)?;
        // 3. Corrected hidden states at every masked position of every node, reduced in one
        // call by the target's rule.
        let wanted: Vec<(usize, usize)> = (0..nodes.len())
            .flat_map(|i| (0..l).map(move |s| (i, s)))
            .filter(|&(i, s)| nodes.tokens(i)[s] == mask)
            .collect();
        let reduced = self.reduce_pairs(ctx, nodes, &wanted)?;
        // The corrected probability of each node's choices (0 where committed).
        let mut probs = vec![0.0f32; nodes.len() * l];
        let mut conf = vec![f32::NEG_INFINITY; nodes.len() * l];
        for (&(i, s), r) in wanted.iter().zip(&reduced) {
            conf[i * l + s] = r.confidence(self.rule) as f32;
            probs[i * l + s] = r.token_prob as f32;
        }
        if self.tree {
            // The corrected probability of each choice, as BlockSpec weighs the stale ones.
            fill_normalised(nodes, l, out, |i, s| probs[i * l + s]);
        } else {
            for i in 0..nodes.len() {
                if let Some(s) = best_position(nodes.tokens(i), mask, |s| conf[i * l + s]) {
                    out[i * l + s] = 1.0;
                }
            }
        }
        Ok(())
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        if !self.lazy || self.fallback {
            return Ok(());
        }
        let mut unstepped: Vec<usize> = wanted
            .iter()
            .map(|&(i, _)| i)
            .filter(|&i| !self.memo.contains_key(nodes.tokens(i)))
            .collect();
        unstepped.dedup();
        let base = self.stale_hidden(ctx.stale, ctx.root.len())?;
        self.step_nodes(ctx, nodes, &unstepped, base)?;
        let missing: Vec<(usize, usize)> = wanted
            .iter()
            .copied()
            .filter(|&(i, s)| self.choice(nodes, i, s).is_none())
            .collect();
        self.reduce_pairs(ctx, nodes, &missing)?;
        Ok(())
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        if self.fallback {
            return false;
        }
        // Not prepared (a caller that does not announce its positions): this one alone.
        if self.lazy
            && self.choice(nodes, i, position).is_none()
            && self
                .prepare_hypotheses(ctx, nodes, &[(i, position)])
                .is_err()
        {
            return false;
        }
        match self.choice(nodes, i, position) {
            Some(c) => {
                out.push(c);
                true
            }
            None => false,
        }
    }
}

/// An order scorer with MRP's tokens: `order` ranks the positions (SPOT's learned order, say)
/// and the module's corrected logits write the token of every drafted position (its choice,
/// at its probability), in place of the stale choice.
pub struct MrpTokens<S, B: Backend> {
    order: S,
    mrp: MrpScorer<B>,
}

impl<S, B: Backend> MrpTokens<S, B> {
    /// `order`'s positions with `mrp`'s tokens.
    pub fn new(order: S, mrp: std::sync::Arc<Mrp<B>>) -> Self {
        let mut mrp = MrpScorer::new(mrp);
        mrp.lazy = true;
        Self { order, mrp }
    }

    /// The module's tokens under the decode's confidence rule and top-k truncation
    /// ([`MrpScorer::with_rule`]).
    pub fn with_rule(mut self, rule: ConfidenceRule, sample_top_k: Option<usize>) -> Self {
        self.mrp = self.mrp.with_rule(rule, sample_top_k);
        self
    }
}

impl<S: OrderScorer, B: Backend> OrderScorer for MrpTokens<S, B> {
    fn name(&self) -> &str {
        "spot-mrp"
    }

    fn wants_hidden_states(&self) -> bool {
        true
    }

    fn score(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        out: &mut [f32],
    ) -> Result<(), TreeError> {
        if !nodes.is_empty() {
            self.mrp.start(ctx, nodes)?;
        }
        self.order.score(ctx, nodes, out)
    }

    fn prepare_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        wanted: &[(usize, usize)],
    ) -> Result<(), TreeError> {
        self.mrp.prepare_hypotheses(ctx, nodes, wanted)?;
        self.order.prepare_hypotheses(ctx, nodes, wanted)
    }

    fn token_hypotheses(
        &mut self,
        ctx: &ScoreContext<'_>,
        nodes: &NodeBatch<'_>,
        i: usize,
        position: usize,
        out: &mut Vec<(TokenId, f32)>,
    ) -> bool {
        let start = out.len();
        if !self.mrp.token_hypotheses(ctx, nodes, i, position, out) {
            return self.order.token_hypotheses(ctx, nodes, i, position, out);
        }
        // The module's token at the order scorer's weight for its first hypothesis (a
        // calibrated hit rate for SPOT), when it has one.
        let mut own = Vec::new();
        if self
            .order
            .token_hypotheses(ctx, nodes, i, position, &mut own)
            && let Some(&(_, w)) = own.first()
        {
            out[start].1 = w;
        }
        true
    }
}

/// The masked position of `tokens` with the highest `conf` (ties to the lower index).
fn best_position(tokens: &[TokenId], mask: TokenId, conf: impl Fn(usize) -> f32) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (s, &t) in tokens.iter().enumerate() {
        if t != mask {
            continue;
        }
        let c = conf(s);
        if best.is_none_or(|b| c > b.1) {
            best = Some((s, c));
        }
    }
    best.map(|b| b.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_best_position_is_masked_and_ties_go_low() {
        let tokens = [9, 0, 0, 9, 0];
        let conf = [0.9, 0.5, 0.7, 0.9, 0.7];
        assert_eq!(best_position(&tokens, 0, |s| conf[s]), Some(2));
        assert_eq!(best_position(&[1, 2], 0, |_| 1.0), None);
    }
}
