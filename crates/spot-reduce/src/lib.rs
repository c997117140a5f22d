#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`host_head`]: the fused host kernel ([`HostHead`]) and its row-level interface
//!   ([`RowJob`], [`RowStats`]).
//! - [`rows`]: which rows a forward reduces ([`RowPlan`]), their Gumbel rows
//!   ([`noise_table`]) and the assembly of whole states' [`BlockStats`](spot_core::BlockStats).
//! - [`logits`]: host logits in a buffer that suits their size ([`Logits`]).
//! - [`linalg`]: the small dense kernels the drafters' host inference shares (a matrix
//!   product, vectorising sums, dot products and maxima).

pub mod host_head;
pub mod linalg;
pub mod logits;
pub mod rows;

pub use host_head::{HostHead, RowJob, RowStats};
pub use logits::Logits;
pub use rows::{RowPlan, noise_table};
pub use spot_core::{PositionStats, ReduceScratch, reduce_block, reduce_logits};
