//! SPOT's learned commit-order drafter.
//!
//! The drafter predicts which masked position of a hypothesised block state the target commits
//! next, from nothing but the target's stale output statistics (SPOT.md section 2). This crate
//! holds the parts that need no tensor library:
//!
//! - [`features`]: the 74 features per block position the order model reads, computed the
//!   same way at training time (from stored trajectories) and at decode time (from the live
//!   stale [`BlockStats`](spot_core::BlockStats));
//! - [`trajectory`]: draft-free decoding trajectories (per step, the stale statistics and the
//!   commit that followed) in a versioned binary format, recorded by a draft-free decoder;
//! - [`collect`]: a resumable directory of trajectories with a manifest.

pub mod collect;
pub mod features;
pub mod trajectory;

pub use features::{FEATURES_VERSION, N_FEATURES, PositionStale, StaleSource, TOP_K, write_features};
pub use collect::{CollectError, Manifest, TrajectoryDir};
pub use trajectory::{Trajectory, TrajectoryError, examples, record};
