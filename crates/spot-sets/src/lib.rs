#![doc = include_str!("../README.md")]
//!
//! The builder and the join models are in [`builder`]; everything is re-exported here.

pub mod builder;

pub use builder::{JoinModel, JoinPrediction, SetTreeBuilder, SetTreeConfig, StaleThresholdJoin};
