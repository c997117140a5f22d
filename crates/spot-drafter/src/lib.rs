//! SPOT's learned commit-order drafter.
//!
//! The drafter predicts which masked position of a hypothesised block state the target commits
//! next, from nothing but the target's stale output statistics (the method and its measured
//! figures: `docs/drafter.md` in the repository). This crate holds what decoding with a
//! shipped checkpoint needs (the network is a burn `Module`, so burn's tensor and module
//! crates come along, but not its optimiser or autodiff). Trajectories, their collection,
//! the tables fitted on them, the training loops and replay are in `spot-train`.
//!
//! - [`features`]: the 78 features per block position the order model reads, computed the
//!   same way at training time (from stored trajectories) and at decode time (from the live
//!   stale [`BlockStats`](spot_core::BlockStats));
//! - [`analysis`]: the token calibration the scorer's token factor reads ([`spiffy`], the
//!   Spiffy graph baseline, is `spot_tree::spiffy`, re-exported here); [`prior`], [`tilt`]:
//!   per-temperature adjustments of the order;
//! - [`network`]: the order network `q_φ(s | y)`, a burn `Module` (0.61M parameters by
//!   default);
//! - [`mrp`]: the MRP baseline: its module (`Mrp`, on the target's layers through
//!   `spot_models::stack`), as an order scorer (`MrpScorer`) and the module's tokens for any
//!   order (`MrpTokens`, SPOT's T = 0 default);
//! - [`module_tokens`]: per temperature, whether SPOT drafts the target's token module's
//!   tokens instead of the stale ones;
//! - [`scorer`]: the network as the tree builder's [`OrderScorer`](spot_tree::OrderScorer),
//!   one batched call per tree depth;
//! - [`checkpoint`]: safetensors weights (through burn-store) plus a JSON config, validated
//!   on load; older layouts load or are refused naming their version.

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod analysis;
mod awake;
pub mod checkpoint;
pub mod error;
pub mod features;
pub mod host;
pub mod module_tokens;
pub mod mrp;
pub mod network;
pub mod prior;
pub mod scorer;
pub mod tilt;

pub use analysis::{CalibrationKey, CalibrationPaths, TokenCalibration, nearest_calibration};
pub use error::DrafterError;
pub use features::{
    FEATURES_VERSION, LiveStale, N_FEATURES, PositionStale, StaleSource, TOP_K, noised_margin,
    write_features,
};
pub use host::{HostMrp, HostOrderNet, MrpBuffers, Precision};
pub use module_tokens::ModuleTokens;
pub use network::{ConfigError, OrderModel, OrderModelConfig};
pub use prior::PriorWeight;
pub use scorer::{Calibrated, LearnedScorer};
pub use spot_tree::TableError;
pub use spot_tree::spiffy::{self, GraphError, SpiffyGraph, SpiffyScorer, unit_stale_token};
pub use tilt::RankTilt;
