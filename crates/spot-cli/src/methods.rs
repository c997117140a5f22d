//! The decoding methods on the command line: `--method` and the drafter-file options, over the
//! registry in `spot-methods` (which `spot serve` shares), on this build's backend.

use std::path::{Path, PathBuf};

use anyhow::Result;
use spot_dlm::BlockEnds;
pub use spot_methods::{
    DEFAULT_DRAFTER, DEFAULT_DRAFTER_PRECISION, DraftFiles, Expand, Method, ModuleHead, Precision,
    REUSE_BELOW, Settings, missing_hint, request, run,
};

use crate::Backend;

/// The drafters of this build's backend.
pub type Drafters = spot_methods::Drafters<Backend>;

/// [`spot_methods::Drafters::load`] on this build's device.
pub fn load_drafters(methods: &[Method], files: &DraftFiles<'_>) -> Result<Drafters> {
    Ok(Drafters::load(methods, files, &crate::backend::device()?)?)
}

/// [`spot_methods::Drafters::load_at`] on this build's device.
pub fn load_drafters_at(
    methods: &[Method],
    files: &DraftFiles<'_>,
    temperatures: &[f32],
) -> Result<Drafters> {
    Ok(Drafters::load_at(
        methods,
        files,
        temperatures,
        &crate::backend::device()?,
    )?)
}

/// The block-end options of `spot bench` and `spot generate`.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct BlockEndArgs {
    /// Cross-block drafting: when no tree node completes the block, name the least-masked
    /// node completed with the stale choices as the look-ahead if it leaves at most this many
    /// positions masked (0: look ahead only from complete nodes).
    #[arg(long, default_value_t = BlockEnds::default().fill)]
    pub lookahead_fill: usize,
    /// Draft refresh off: take a plain step at a block's first forward even when a
    /// look-ahead scored it under another end of the block before.
    #[arg(long)]
    pub no_refresh: bool,
}

impl From<BlockEndArgs> for BlockEnds {
    fn from(a: BlockEndArgs) -> Self {
        BlockEnds {
            fill: a.lookahead_fill,
            refresh: !a.no_refresh,
        }
    }
}

/// The drafter files of the speculative methods (`--drafter`, `--spiffy`, `--sets`,
/// `--sets-net`) and `--uncalibrated-baselines`, as `spot generate`, `spot serve` and `spot
/// bench` take them.
#[derive(clap::Args, Clone, Debug)]
pub struct DrafterFileArgs {
    /// Drafter checkpoint for `--method spot` (default: `spot-drafter.safetensors` in the
    /// model folder); for `--method specdiff`, a drafter folder (`specdiff-drafter.json`;
    /// default: `specdiff-drafter/` in the model folder, else `specdiff-lookup.jsonl` there,
    /// else `lookup`), a lookup store file (the target's own continuations, JSON lines with
    /// `prompt_ids` and `tokens`: prompt lookup plus retrieval, calibrated) or `lookup` (the
    /// training-free prompt-lookup drafter).
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// Spiffy graph for `--method spiffy` (default: `spiffy-graph.json` in the model folder).
    #[arg(long)]
    pub spiffy: Option<PathBuf>,
    /// SPOT-Sets tables for `--method sets` / `sets-gamma` (default: `spot-sets.json` in the
    /// model folder).
    #[arg(long)]
    pub sets: Option<PathBuf>,
    /// The learned set drafter for `--method sets-net` (default: the model folder's
    /// `spot-sets-net.json`).
    #[arg(long)]
    pub sets_net: Option<PathBuf>,
    /// The MRP baseline's module for `--method mrp` (default: the model folder's `mrp.json`,
    /// weights in `mrp.safetensors` next to it).
    #[arg(long)]
    pub mrp: Option<PathBuf>,
    /// Give `blockspec` and `spiffy` their papers' token weights (stale probabilities) instead
    /// of the drafter checkpoint's token calibration (the default when the checkpoint exists,
    /// so that they differ from `spot` only in the commit order).
    #[arg(long)]
    pub uncalibrated_baselines: bool,
}

impl DrafterFileArgs {
    /// The files named, found in the model folder `dir` by default.
    pub fn files<'a>(&'a self, dir: &'a Path) -> DraftFiles<'a> {
        DraftFiles {
            dir,
            drafter: self.drafter.as_deref(),
            spiffy: self.spiffy.as_deref(),
            sets: self.sets.as_deref(),
            sets_net: self.sets_net.as_deref(),
            mrp: self.mrp.as_deref(),
            calibrate_baselines: !self.uncalibrated_baselines,
        }
    }
}
