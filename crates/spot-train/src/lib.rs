//! Training for SPOT's drafters, apart from what decoding needs ([`spot_drafter`]).
//!
//! - [`collect`]: a resumable directory of draft-free trajectories with a manifest;
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
pub mod replay;
pub mod sets_fit;
pub mod sets_train;
pub mod train;

pub use collect::{CollectError, Manifest, TrajectoryDir};
pub use replay::{ReplayCount, ReplayError, replay};
pub use train::{
    Accuracy, EpochReport, TrainConfig, TrainError, TrainObserver, evaluate_on, train, train_from,
};
