//! The error type of `spot-tree`.

/// Errors raised while building a draft tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// A tree configuration value is out of range.
    #[error("invalid `{field}`: {reason}")]
    InvalidConfig {
        /// Field name.
        field: &'static str,
        /// Why, with the value.
        reason: String,
    },
    /// An order scorer returned a negative or non-finite score.
    #[error("order scorer `{scorer}` returned {value} for node {node}, position {position}")]
    InvalidScore {
        /// The scorer's name.
        scorer: String,
        /// Index of the node in the scored batch.
        node: usize,
        /// Block position.
        position: usize,
        /// The offending value.
        value: f32,
    },
    /// An order scorer wrote the wrong number of scores.
    #[error("order scorer `{scorer}` wrote {actual} scores, expected {expected}")]
    ScoreShape {
        /// The scorer's name.
        scorer: String,
        /// Expected length (nodes x block size).
        expected: usize,
        /// Actual length.
        actual: usize,
    },
    /// The stale statistics do not match the root state.
    #[error("stale statistics cover {actual} positions, the block has {expected}")]
    StaleShape {
        /// Block size.
        expected: usize,
        /// Positions in the statistics.
        actual: usize,
    },
    /// An order scorer could not score the batch (e.g. it was trained for another block size).
    #[error("order scorer `{scorer}`: {reason}")]
    Scorer {
        /// The scorer's name.
        scorer: String,
        /// What went wrong.
        reason: String,
    },
    /// A failure in the core crate (invalid commit, model error inside a scorer, ...).
    #[error(transparent)]
    Core(#[from] spot_core::Error),
}

impl TreeError {
    /// An [`TreeError::InvalidConfig`] naming `field`.
    pub fn config(field: &'static str, reason: impl Into<String>) -> Self {
        TreeError::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

impl From<TreeError> for spot_core::Error {
    /// A core error carried by the tree stays itself; every other tree error becomes
    /// [`spot_core::Error::Drafter`].
    fn from(e: TreeError) -> Self {
        match e {
            TreeError::Core(e) => e,
            other => spot_core::Error::drafter(other),
        }
    }
}
