//! Training for SPOT's drafters, apart from what decoding needs ([`spot_drafter`]).
//!
//! - [`trajectory`]: draft-free decoding trajectories (per step, the stale statistics and the
//!   commit that followed) in a versioned binary format, and their recorder;
//! - [`collect`]: a resumable directory of draft-free trajectories with a manifest;
//! - [`fit`]: the order drafter's tables fitted on trajectories (token calibration, Spiffy
//!   graph, token hit rates);
//! - [`train`](mod@train): Algorithm 1 (burn autodiff, burn-optim's Adam, held-out accuracy
//!   by depth);
//! - [`sets_fit`]: SPOT-Sets' calibrated tables fitted on threshold-decoding trajectories;
//! - [`sets_train`]: the learned set drafter's training loop;
//! - [`replay`](mod@replay): a speculative decode's rounds re-enacted on a trajectory, without
//!   the target, to compare tree shapes and drafters quickly.
//!
//! A program that only decodes with a shipped checkpoint depends on `spot-drafter` alone and
//! does not compile burn's optimiser or autodiff.

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod collect;
pub mod fit;
pub mod replay;
pub mod sets_fit;
pub mod sets_train;
pub mod train;
pub mod trajectory;

pub use collect::{CollectError, Manifest, TrajectoryDir};
pub use fit::{CalibrateSpiffy, FitCalibration, TokenHits, token_hits};
pub use replay::{ReplayCount, ReplayError, replay};
pub use train::{
    Accuracy, EpochReport, TrainConfig, TrainError, TrainObserver, evaluate_on, train, train_from,
};
pub use trajectory::{Trajectory, TrajectoryError, examples, record};
