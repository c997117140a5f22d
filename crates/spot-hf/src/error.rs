//! The error type of `spot-models`.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model. Each variant names the file,
/// field or tensor at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A JSON file is malformed or lacks a required field.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde's message, which names the field and line.
        message: String,
    },
    /// A config value is present but unsupported or out of range.
    #[error("{path}: field `{field}`: {reason}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A safetensors file is truncated or malformed.
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("tensor `{name}` is missing from {path}")]
    MissingTensor {
        /// HF tensor name.
        name: String,
        /// The file or folder searched.
        path: PathBuf,
    },
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?} (from config.json)")]
    TensorShape {
        /// HF tensor name.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor has a dtype that cannot be loaded.
    #[error("tensor `{name}` has dtype {dtype}; supported: F32, BF16, F16")]
    TensorDtype {
        /// HF tensor name.
        name: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// The tokenizer could not be loaded or used.
    #[error("tokenizer {path}: {message}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A chat template could not be parsed or rendered.
    #[error("chat template {path}: {message}")]
    ChatTemplate {
        /// The file the template came from.
        path: PathBuf,
        /// minijinja's message (with the line).
        message: String,
    },
    /// A request the model cannot serve (block past the context, bad token id, ...).
    #[error("{0}")]
    Request(String),
    /// A decoding error detected by the model, e.g.
    /// [`spot_core::Error::NonFiniteLogits`] (NaN logits name their position).
    #[error("{0}")]
    Core(spot_core::Error),
}

impl ModelError {
    /// A [`ModelError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<ModelError> for spot_core::Error {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Core(e) => e,
            e => spot_core::Error::model(e),
        }
    }
}

impl From<spot_core::Error> for ModelError {
    fn from(e: spot_core::Error) -> Self {
        ModelError::Core(e)
    }
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
