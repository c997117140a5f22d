//! # spot-core
//!
//! The vocabulary of lossless speculative decoding for block-diffusion language models:
//!
//! - [`BlockState`] and [`Commit`]: the tokens of the block being decoded;
//! - [`BlockDiffusionModel`]: prefix caches in slots and one batched forward over the block
//!   states of one or several requests, returning compact per-position [`BlockStats`] instead
//!   of logits; [`MeteredModel`] is the one way decoders reach it (checked, counted);
//! - [`GumbelNoise`]: the coupled noise table `G[a, v]`, a pure function of
//!   `(seed, absolute position, token)`;
//! - [`Transition`]: the exact commit rule `Φ` and the threshold rule `Φ^τ`;
//! - [`DraftFreeDecoder`]: the ground truth;
//! - [`Request`]: one decode as a state machine (prefill, prompt tail in the first block,
//!   stop ids and stop checks, fixed length, counters, events, cancellation) that a
//!   [`StepStrategy`] completes block by block; [`run_decode`] drives one through a
//!   [`BlockDiffusionModel`], [`BatchDriver`] many through one model, merging their forwards;
//! - [`autoregressive`]: causal targets with a KV cache and their token-by-token decoder;
//! - [`toy`]: deterministic toy models for tests.
//!
//! This crate does not depend on any tensor library.
//!
//! ```
//! use spot_core::{DecodeConfig, DraftFreeDecoder, toy::{ToyConfig, ToyModel}};
//!
//! let mut model = ToyModel::new(ToyConfig::default());
//! let cfg = DecodeConfig {
//!     block_size: 8,
//!     max_new_tokens: 24,
//!     temperature: 1.0,
//!     seed: 7,
//!     ..DecodeConfig::default()
//! };
//! let out = DraftFreeDecoder::new().decode(&mut model, &[3, 1, 4, 1, 5], &cfg)?;
//! assert!(out.tokens.len() <= 24);
//! // Draft-free decoding commits exactly one position per block forward.
//! assert!(out.stats.commits_per_forward.iter().all(|&c| c == 1));
//! # Ok::<(), spot_core::Error>(())
//! ```

/// The examples of the crate's README (`README.md`), run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A token id. Vocabularies of the supported families fit in 32 bits.
pub type TokenId = u32;

pub mod autoregressive;
pub mod batch;
pub mod config;
pub mod decode;
pub mod error;
pub mod fastmath;
pub mod model;
pub mod noise;
pub mod request;
pub mod state;
pub mod stats;
pub mod toy;
pub mod transition;

pub use autoregressive::{
    ArConfig, ArGroup, ArInfo, ArOutput, ArScores, AutoregressiveModel, MeteredArModel,
    decode_autoregressive,
};
pub use batch::{BatchDriver, Finished, RequestId};
pub use config::{
    BlockPlan, BlockTrace, DecodeConfig, DecodeOutput, DecodeStats, DecodeTrace, plan_blocks,
};
pub use decode::{
    BlockObserver, BlockProgress, DraftFreeDecoder, first_stats, run_decode, run_request,
};
pub use error::{Error, Result};
pub use model::{
    BlockDiffusionModel, BlockLayout, CacheSlot, CacheUsage, Carry, GroupScores, Meter,
    MeteredModel, ModelInfo, Prefix, PrefixUpdate, ScoreGroup, Slots, check_distinct_slots,
};
pub use noise::GumbelNoise;
pub use request::{BlockEvent, BlockRun, CancelHandle, Need, Request, StepStrategy, StopCheck};
pub use state::{BlockState, Commit};
pub use stats::{
    BlockStats, ConfidenceRule, PositionStats, ReduceScratch, StatsQuery, reduce_block,
    reduce_logits,
};
pub use transition::{DREAM_EPS, Transition, exact_commit};
