//! # spot-tree
//!
//! Draft trees for SPOT: hypothesised future block states, grown from the round's verified
//! state with the target's stale statistics.
//!
//! - [`DraftTree`]: an arena of states with parent links, edges (position, token) and masses;
//! - [`TreeBuilder`]: the layer-batched best-first builder with budget `D`, depth limit, mass
//!   floor `γ` and the hedge, plus the SSD-style chain;
//! - the edges of set-valued trees ([`DraftTree::push_set`]); their builder for threshold
//!   decoding (SPOT-Sets) is the `spot-sets` crate's;
//! - [`OrderScorer`]: the interface the learned commit-order drafter implements, and the
//!   baselines [`StaleConfidenceScorer`] (BlockSpec), [`RandomScorer`], [`OracleScorer`] and
//!   [`SpiffyScorer`] (Spiffy's static graph of calibrated rank paths, [`spiffy`]);
//!
//! - [`stale`]: the stale statistics as every drafter reads them ([`StoredPosition`], the record
//!   trajectories store and live scorers compute); [`table`]: the error of the drafters' fitted
//!   tables and their bin lookup; [`rng`]: a seeded, platform-independent generator.
//!
//! No tensor library is involved: a round's tree costs microseconds.
//!
//! ```
//! use spot_core::{BlockState, MeteredModel, StatsQuery, toy::{ToyConfig, ToyModel}};
//! use spot_tree::{ScoreContext, StaleConfidenceScorer, TreeBuilder, TreeConfig};
//!
//! let mut toy = ToyModel::new(ToyConfig::default());
//! let mut model = MeteredModel::new(&mut toy);
//! model.reset_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], 8, 16).unwrap();
//! let root = BlockState::masked(8, model.info().mask_id);
//! let stale = model.forward(&[root.clone()], &StatsQuery::new(0.0, 0)).unwrap().remove(0);
//! let ctx = ScoreContext { root: &root, stale: &stale, block_start: 8, noise: None, temperature: 0.0 };
//! let mut builder = TreeBuilder::new(TreeConfig { budget: 12, ..TreeConfig::default() }).unwrap();
//! let tree = builder.build(&ctx, &mut StaleConfidenceScorer).unwrap();
//! assert_eq!(tree.draft_count(), 12);
//! for i in 1..tree.len() {
//!     let parent = tree.parent(i).unwrap();
//!     assert!(tree.mass(i) <= tree.mass(parent));
//! }
//! ```

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod builder;
mod error;
pub mod rng;
mod scorer;
pub mod spiffy;
pub mod stale;
pub mod table;
mod tree;

pub use builder::{BuildCounts, Expand, TreeBuilder, TreeConfig, check_round};
pub use error::TreeError;
pub use scorer::{
    NodeBatch, OracleScorer, OrderScorer, RandomScorer, ScoreContext, StaleConfidenceScorer,
    TokenOracleScorer, check_block_size, fill_normalised, noised_runner_up, stale_runner_up,
};
pub use spiffy::{GraphError, SpiffyGraph, SpiffyScorer, unit_stale_token};
pub use stale::{LiveStale, PositionStale, StaleSource, StoredPosition};
pub use table::TableError;
pub use tree::{DraftTree, state_hash, zobrist};
