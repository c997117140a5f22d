//! SpecDiff-2 for the SPOT workspace: a masked-diffusion drafter proposes `K` drafts of `γ`
//! tokens in one denoising step, an autoregressive target scores all of them in one forward,
//! and the round commits the accepted tokens of one branch plus the target's own next token.
//!
//! **Lossless in the strong sense.** Verification is coupled to the target's noise: a
//! drafted token is accepted iff it equals the target's choice
//! `argmax_v(logit_v / T + G[p, v])` at its absolute position `p`
//! ([`spot_core::GumbelNoise`]), so the output is token-identical to
//! [`spot_core::decode_autoregressive`] with the same seed at every temperature, whatever the
//! drafter proposes; only the number of target forwards changes.
//!
//! - [`drafter`]: the [`DiffusionDrafter`] trait, its per-position [`Marginals`] and the
//!   `K` drafts sampled from them at the drafter's temperature;
//! - [`select`]: accepted streaks and the branch a round commits ([`Selection`]:
//!   SpecDiff-2's self-selection by expected streak, or the longest accepted streak);
//! - [`SpecDiffRequest`]: one decode as a state machine (what it needs next: the drafter's
//!   marginals or one target forward), [`SpecDiffDecoder`], its one-request driver, and
//!   [`SpecDiffBatch`], which merges many requests' target work into one forward;
//! - [`lookup`]: a training-free drafter (prompt lookup) that needs no weights;
//! - [`store`]: retrieval for it: the target's own continuations of training-side prompts,
//!   indexed by n-gram, with acceptance rates measured on them (calibrated probabilities);
//! - [`toy`]: a toy target and drafter for tests and examples;
//! - `feature` (the `models` feature): `FeatureDrafter`, a one-layer block drafter that reads
//!   the target's own hidden states (tapped in the verification forward) and drafts `γ`
//!   tokens in one pass;
//! - `masked` (the `models` feature): `MaskedDrafter`, the masked-diffusion drafter on burn (a
//!   drafter folder next to an autoregressive target, over `spot_models::CausalLm`).
//!
//! ```
//! use spot_core::{decode_autoregressive, ArConfig};
//! use spot_specdiff::toy::{ToyCausalModel, ToyDrafter};
//! use spot_specdiff::{Selection, SpecDiffConfig, SpecDiffDecoder};
//!
//! let mut target = ToyCausalModel::new(64, 1);
//! let mut drafter = ToyDrafter::new(target.clone(), 0.1, 2);
//! let cfg = ArConfig { max_new_tokens: 64, ..ArConfig::default() };
//! let sd = SpecDiffConfig { k: 4, gamma: 8, selection: Selection::ExpectedStreak,
//!     ..SpecDiffConfig::default() };
//! let out = SpecDiffDecoder::new(sd)?.decode(&mut target, &mut drafter, &[5, 6], &cfg)?;
//! assert_eq!(out.tokens, decode_autoregressive(&mut target, &[5, 6], &cfg)?.tokens);
//! println!("{:.2} tokens per target forward", out.report.tokens_per_round());
//! # Ok::<(), spot_core::Error>(())
//! ```

pub mod batch;
pub mod config;
pub mod decoder;
pub mod drafter;
#[cfg(feature = "models")]
pub mod feature;
pub mod lookup;
#[cfg(feature = "models")]
pub mod masked;
pub mod select;
pub mod store;
pub mod toy;

pub use batch::{ArFinished, SpecDiffBatch};
pub use config::Pace;
pub use decoder::{
    Acceptance, ArNeed, SpecDiffConfig, SpecDiffDecoder, SpecDiffOutput, SpecDiffReport,
    SpecDiffRequest,
};
pub use drafter::{DiffusionDrafter, Marginals, draft_distribution, sample_drafts};
#[cfg(feature = "models")]
pub use feature::{
    DraftMode, FEATURE_DRAFTER_FILE, FEATURE_DRAFTER_FORMAT, FeatureDrafter, FeatureDrafterFile,
};
pub use lookup::LookupDrafter;
#[cfg(feature = "models")]
pub use masked::{DRAFTER_FILE, DRAFTER_FORMAT, DrafterFile, MaskedDrafter};
pub use select::{Scored, Selection};
pub use store::{Continuation, LookupStore, StoreError};
