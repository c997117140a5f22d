//! The error type of `spot-core`.

use crate::TokenId;

/// Everything that can go wrong while validating input or running a decoder.
///
/// Every variant names the field, position or value at fault so that a caller can report it
/// without guessing. Model implementations wrap their own failures with [`Error::model`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of its documented range.
    #[error("invalid `{field}`: {reason}")]
    InvalidConfig {
        /// The name of the configuration field.
        field: &'static str,
        /// Why the value was rejected, including the value itself.
        reason: String,
    },
    /// The prompt has no tokens; a block-diffusion decoder needs at least one.
    #[error("the prompt is empty; at least one token is required")]
    EmptyPrompt,
    /// A prompt token is outside the vocabulary or is the mask token.
    #[error("prompt token {token} at index {index} is invalid: {reason}")]
    InvalidPromptToken {
        /// Index in the prompt.
        index: usize,
        /// The offending token id.
        token: TokenId,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// Prompt plus requested generation does not fit in the model's context.
    #[error(
        "sequence too long: prompt of {prompt_len} tokens plus {max_new_tokens} new tokens needs \
         {needed} positions (whole blocks of {block_size}), the model allows {max_positions}"
    )]
    SequenceTooLong {
        /// Tokens in the prompt.
        prompt_len: usize,
        /// Tokens requested.
        max_new_tokens: usize,
        /// Positions needed after rounding up to whole blocks.
        needed: usize,
        /// Block size in use.
        block_size: usize,
        /// The model's limit.
        max_positions: usize,
    },
    /// A forward returned statistics containing NaN or infinity, or a value out of range.
    #[error("invalid statistics from the model: field `{field}` at position {position} is {value}")]
    InvalidStatistics {
        /// The statistics field (`confidence`, `token_prob`, ...).
        field: &'static str,
        /// Block position (0-based within the block).
        position: usize,
        /// The offending value, formatted.
        value: String,
    },
    /// A forward returned logits containing NaN, or no finite logit at all.
    #[error("non-finite logits at absolute position {position}: {reason}")]
    NonFiniteLogits {
        /// Absolute sequence position.
        position: usize,
        /// What was wrong.
        reason: &'static str,
    },
    /// A forward returned a result of the wrong shape.
    #[error("shape mismatch in {what}: expected {expected}, got {actual}")]
    ShapeMismatch {
        /// What was being checked.
        what: &'static str,
        /// Expected size.
        expected: usize,
        /// Actual size.
        actual: usize,
    },
    /// A commit targeted a position that is out of range or already committed, or tried to
    /// write the mask token.
    #[error("invalid commit of token {token} at block position {position}: {reason}")]
    InvalidCommit {
        /// Block position.
        position: usize,
        /// Token id.
        token: TokenId,
        /// Why the commit is invalid.
        reason: &'static str,
    },
    /// A [`crate::Request`] was answered out of order (e.g. statistics where it needed a
    /// prefill), or finished before it was done.
    #[error("request protocol: it needed {expected}, got {got}")]
    RequestState {
        /// What the request needed.
        expected: &'static str,
        /// What it was given.
        got: &'static str,
    },
    /// The model implementation failed.
    #[error("model error: {0}")]
    Model(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The drafter failed or was configured out of range: a `spot_tree::TreeError` (tree
    /// limits, an order scorer's output) or a drafter's own error, shown as it is. Reach the
    /// error itself with [`Error::drafter_error`].
    #[error(transparent)]
    Drafter(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps an error raised by a model implementation.
    pub fn model<E>(err: E) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        Error::Model(err.into())
    }

    /// Wraps an error raised by a drafter (see [`Error::Drafter`]).
    pub fn drafter<E>(err: E) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        Error::Drafter(err.into())
    }

    /// The drafter's error of type `E`, when this is an [`Error::Drafter`] holding one.
    ///
    /// ```
    /// use spot_core::Error;
    /// #[derive(Debug, thiserror::Error)]
    /// #[error("no scores")]
    /// struct NoScores;
    /// let e = Error::drafter(NoScores);
    /// assert!(e.drafter_error::<NoScores>().is_some());
    /// assert!(Error::EmptyPrompt.drafter_error::<NoScores>().is_none());
    /// ```
    pub fn drafter_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Drafter(e) => e.downcast_ref::<E>(),
            _ => None,
        }
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

/// Result alias used across `spot-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
