//! The MRP baseline (multi-token residual prediction, Xu et al., arXiv 2605.18817): a small
//! module on top of an SDAR target that predicts how the target's logits move when more of a
//! block is committed, so that a chain of drafts needs no target forward between its steps.
//!
//! The module reads the target's final hidden states `h` of a block (after the final norm,
//! the stale statistics' [`spot_core::BlockStats::hidden`]) and the block's current tokens,
//! and returns a residual in hidden space:
//!
//! `h_C = norm(layers(W [enorm(embed(ids)); hnorm(h)]))`, logits `head(h + h_C)`
//!
//! with `layers` decoder layers of the target's own shape attending bidirectionally within the
//! block, and the target's embedding and head (frozen in training). Applied recursively along
//! a chain: the step at a node reads `h_A + Σ h_C` of its ancestors and the node's tokens.
//! [`MrpReducer`] applies the target's own rule to the corrected hidden states (its head and
//! reduction, under the coupled noise at `T > 0`); [`MrpScorer`](super::MrpScorer) drafts with
//! the module under the shared verifier: at every node the most confident masked position with
//! its choice, one child per node, so the tree is MRP's chain. The module's layers, the
//! target's embedding and head are a [`LayerStack`] of spot-models.
//!
//! Files: `mrp.safetensors` (the module's tensors: `mrp.enorm`, `mrp.hnorm`, `mrp.eh_proj`,
//! `mrp.layers.N.*` with the Qwen3 layer names, `mrp.norm`) and `mrp.json` ([`MrpFile`]) next
//! to it, written by `tools/mrp/train_mrp.py`.

use std::path::{Path, PathBuf};

use burn_tensor::Tensor;
use burn_tensor::backend::Backend;
use serde::Deserialize;
use spot_core::{StatsQuery, TokenId};
use spot_models::hf::{Weights, read_json};
use spot_models::stack::{LayerStack, StackNames};
use spot_models::{DecoderConfig, ModelError, Result};
use spot_reduce::{RowJob, noise_table};

use crate::host::{HostMrp, Precision, check_step};

/// File name of a model folder's default MRP module description (`mrp.safetensors` next to
/// it holds the weights).
pub const DEFAULT_MRP: &str = "mrp.json";

/// The format name in [`MrpFile`].
pub const MRP_FORMAT: &str = "spot-mrp";

/// The most decoder layers an MRP module may declare.
const MAX_LAYERS: usize = 64;

/// The tensor names of the module's layers (the embedding and head are the target's).
const MRP_NAMES: StackNames = StackNames {
    layers: "mrp.layers.{n}.",
    norm: "mrp.norm.weight",
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

/// The MRP module on backend `B`, with the target's embedding and head, and its step packed
/// for the host in both precisions ([`Mrp::host`]: what the scorers step with).
///
/// ```no_run
/// use spot_drafter::mrp::Mrp;
/// use spot_models::CpuBackend;
/// let dir = std::path::Path::new("models/sdar-tiny-code");
/// let mrp = Mrp::<CpuBackend>::load(dir, &dir.join("mrp.json"), &Default::default())?;
/// println!("{} layers", mrp.file().layers);
/// # Ok::<(), spot_models::ModelError>(())
/// ```
pub struct Mrp<B: Backend> {
    stack: LayerStack<B>,
    enorm: Tensor<B, 2>,
    hnorm: Tensor<B, 2>,
    eh_proj: Tensor<B, 2>,
    host: [HostMrp; 2],
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
        let stack = LayerStack::load(&cfg, meta.layers, MRP_NAMES, &weights, device)?;
        let h = cfg.hidden_size;
        let exact = HostMrp::load(&cfg, &weights, ("mrp.", meta.layers), Precision::F32)?;
        let int8 = match exact.repacked(Precision::Int8) {
            Some(m) => m,
            None => HostMrp::load(&cfg, &weights, ("mrp.", meta.layers), Precision::Int8)?,
        };
        Ok(Self {
            host: [exact, int8],
            enorm: stack.row(&weights, "mrp.enorm.weight", h)?,
            hnorm: stack.row(&weights, "mrp.hnorm.weight", h)?,
            eh_proj: stack.linear(&weights, "mrp.eh_proj.weight", (h, 2 * h))?,
            stack,
            file: meta,
            hidden: h,
            vocab: cfg.vocab_size,
        })
    }

    /// The description file.
    pub fn file(&self) -> &MrpFile {
        &self.file
    }

    /// The step packed for the host with products in `precision` (the same function as
    /// [`Mrp::step`], which runs burn's operations: the training definition's).
    pub fn host(&self, precision: Precision) -> &HostMrp {
        match precision {
            Precision::F32 => &self.host[0],
            Precision::Int8 => &self.host[1],
        }
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
        check_step((ids, hidden), (n, len), (self.hidden, self.vocab))?;
        let e = self.stack.embed(ids);
        let x = self.stack.rows(hidden.to_vec(), rows);
        let x = Tensor::cat(
            vec![
                self.stack.rms_norm(e, &self.enorm),
                self.stack.rms_norm(x, &self.hnorm),
            ],
            1,
        )
        .matmul(self.eh_proj.clone());
        Ok(self.stack.run_bidirectional(x, n, len))
    }

    /// The head's logits of `rows` hidden states (`rows * hidden_size` values), row-major.
    pub fn logits(&self, hidden: &[f32], rows: usize) -> Result<Vec<f32>> {
        let t = self.stack.rows(hidden.to_vec(), rows);
        Ok(self.stack.logits(t)?.into_vec())
    }
}

/// `mrp.safetensors` next to the description file `file`.
pub fn mrp_weights_path(file: &Path) -> PathBuf {
    file.with_file_name("mrp.safetensors")
}

/// The Gumbel rows of one block under one seed (host table, device copy when a device head
/// reads it).
struct BlockNoise<B: Backend> {
    key: (u64, usize, usize),
    host: Vec<f32>,
    device: Option<Tensor<B, 2>>,
}

/// The target's choice at one corrected hidden state (see [`MrpReducer::reduce`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MrpChoice {
    /// The chosen token: `argmax(l / T + G)` (never the mask).
    pub token: TokenId,
    /// Its probability under the tempered distribution.
    pub token_prob: f64,
    /// Its confidence under the query's rule.
    pub confidence: f64,
}

/// The target's own reduction of corrected hidden states (the fused host kernel on CPU
/// backends), with the block's Gumbel rows and the mask's bias kept between calls: what an MRP
/// drafter asks of the target's head.
pub struct MrpReducer<B: Backend> {
    mrp: std::sync::Arc<Mrp<B>>,
    noise: Option<BlockNoise<B>>,
    bias: Option<(TokenId, Tensor<B, 2>)>,
}

impl<B: Backend> std::fmt::Debug for MrpReducer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrpReducer")
            .field("mrp", &self.mrp)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> MrpReducer<B> {
    /// A reducer over `mrp`'s head (the target's).
    pub fn new(mrp: std::sync::Arc<Mrp<B>>) -> Self {
        Self {
            mrp,
            noise: None,
            bias: None,
        }
    }

    /// The module.
    pub fn mrp(&self) -> &std::sync::Arc<Mrp<B>> {
        &self.mrp
    }

    /// Reduces `rows` (one corrected hidden state of [`Mrp::hidden_size`] values per entry of
    /// `positions`, row-major) by the target's rule under `query`, mask id `mask`: row `i` sits
    /// at block position `positions[i]` of the block of `block.1` positions starting at
    /// absolute position `block.0`, and reads that position's Gumbel row of `noise` (`None` at
    /// `T = 0`). A row's result does not depend on the other rows of the call.
    pub fn reduce(
        &mut self,
        rows: Vec<f32>,
        positions: &[usize],
        block: (usize, usize),
        query: &StatsQuery,
        (mask, noise): (TokenId, Option<spot_core::GumbelNoise>),
    ) -> Result<Vec<MrpChoice>> {
        let (block_start, l) = block;
        if let Some(g) = noise {
            let key = (g.seed(), block_start, l);
            if self.noise.as_ref().is_none_or(|n| n.key != key) {
                self.noise = Some(BlockNoise {
                    key,
                    host: noise_table(query, block_start, l, self.mrp.vocab),
                    device: None,
                });
            }
        }
        let jobs: Vec<RowJob> = positions
            .iter()
            .enumerate()
            .map(|(i, &s)| RowJob {
                hidden: i,
                noise: s,
            })
            .collect();
        let absolute: Vec<usize> = positions.iter().map(|&s| block_start + s).collect();
        if self.bias.as_ref().is_none_or(|(m, _)| *m != mask) {
            self.bias = Some((mask, self.mrp.stack.mask_bias(mask)));
        }
        let Some((_, bias)) = self.bias.as_ref() else {
            return Err(ModelError::Request("the mask bias was not made".into()));
        };
        // The block's rows as last made (a decode at T = 0 reads none of them).
        let noise_rows = self.noise.as_mut().map(|n| (&n.host[..], &mut n.device));
        let reduced =
            self.mrp
                .stack
                .reduce_rows(&rows, &jobs, &absolute, query, (mask, bias), noise_rows)?;
        Ok(reduced
            .iter()
            .map(|r| MrpChoice {
                token: r.token,
                token_prob: r.token_prob,
                confidence: r.confidence(query.rule),
            })
            .collect())
    }
}
