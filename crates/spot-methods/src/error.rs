//! What can go wrong choosing, loading or building a method.

use std::path::PathBuf;

/// Why a method could not be named, loaded or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MethodError {
    /// No method has this name.
    #[error("unknown method `{name}` (one of {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// Every method's name, comma-separated.
        known: String,
    },
    /// A file the method reads is not there.
    #[error("--method {method}: {why} ({hint})")]
    Missing {
        /// The method's name.
        method: &'static str,
        /// Which files are missing, and where.
        why: String,
        /// How to make them.
        hint: &'static str,
    },
    /// A drafter file exists but could not be loaded.
    #[error("loading {what} {path}: {source}")]
    Load {
        /// What the file holds (`drafter`, `Spiffy graph`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The loader's error, naming the field or tensor at fault.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The method needs a drafter that was not loaded (see [`crate::Drafters::load`]).
    #[error("--method {method} needs {what}")]
    NotLoaded {
        /// The method's name.
        method: &'static str,
        /// What it needs.
        what: &'static str,
    },
    /// The method decodes another kind of model (SpecDiff-2: autoregressive targets only).
    #[error("--method {method} decodes {kind} models only")]
    WrongKind {
        /// The method's name.
        method: &'static str,
        /// The kind of model it decodes.
        kind: &'static str,
    },
    /// Building or running the decoder failed.
    #[error(transparent)]
    Decode(#[from] spot_dlm::Error),
}

impl MethodError {
    /// A [`MethodError::Load`] of `what` at `path`.
    pub(crate) fn load(
        what: &'static str,
        path: &std::path::Path,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        MethodError::Load {
            what,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}
