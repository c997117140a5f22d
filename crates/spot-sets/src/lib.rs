#![doc = include_str!("../README.md")]
//!
//! - [`builder`]: the join models' trait and the set-tree builder (with the training-free
//!   [`StaleThresholdJoin`]);
//! - [`tables`]: the calibrated set drafter ([`SetsDrafter`], one [`JoinTable`] per temperature
//!   and `τ`);
//! - [`net`]: the learned set drafter ([`SetsNet`]) and [`tokens`], its token head;
//! - [`file`](mod@file): the drafters' file errors ([`SetsError`]).
//!
//! Everything here is inference: the tables and the network are fitted and trained on
//! threshold-decoding trajectories by `spot-train` (`sets_fit`, `sets_train`). No tensor
//! library is involved.

mod beside;
pub mod builder;
pub mod file;
pub mod net;
pub mod tables;
pub mod tokens;

pub use builder::{JoinModel, JoinPrediction, SetTreeBuilder, SetTreeConfig, StaleThresholdJoin};
pub use file::SetsError;
pub use net::{DEFAULT_SETS_NET, LeaderMode, SetsNet, SetsNetConfig};
pub use tables::{DEFAULT_SETS, JoinTable, SetsDrafter};
pub use tokens::{TokenHead, TokenHeadConfig};
