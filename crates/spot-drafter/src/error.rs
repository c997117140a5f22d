//! The error of loading and saving the drafter's files (checkpoints; a Spiffy graph's
//! [`GraphError`](spot_tree::GraphError) converts into it).

use std::path::PathBuf;

/// Why a drafter checkpoint could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// A file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The JSON config is invalid or describes an unusable network.
    #[error("{path}: invalid drafter config: {reason}")]
    Config {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The weights file is not valid safetensors.
    #[error("{path}: not a valid safetensors file: {reason}")]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// Parser message.
        reason: String,
    },
    /// A tensor the config needs is absent.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// Tensor name.
        name: String,
    },
    /// A tensor has the wrong shape, dtype or values, or the network has no such tensor.
    #[error("{path}: tensor `{name}`: {reason}")]
    BadTensor {
        /// The weights file.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// What is wrong (expected vs found).
        reason: String,
    },
    /// The weights file declares a layout this build does not read.
    #[error(
        "{path}: drafter checkpoint layout version {found}; this build reads versions 1 to {supported}"
    )]
    Version {
        /// The weights file.
        path: PathBuf,
        /// The version the file declares.
        found: String,
        /// The newest layout version this build reads.
        supported: u32,
    },
}

impl From<spot_tree::GraphError> for DrafterError {
    fn from(e: spot_tree::GraphError) -> Self {
        match e {
            spot_tree::GraphError::Io { path, source } => DrafterError::Io { path, source },
            spot_tree::GraphError::Invalid { path, reason } => {
                DrafterError::Config { path, reason }
            }
        }
    }
}
