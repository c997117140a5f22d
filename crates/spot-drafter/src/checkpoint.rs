//! Drafter checkpoints: `NAME.safetensors` (f32 weights by name) plus `NAME.json` (the
//! [`OrderModelConfig`], which records the features version and block size).
//!
//! Loading checks everything a mismatched or damaged checkpoint could get wrong — the JSON
//! fields, the features version, every tensor's presence, dtype and shape, non-finite values —
//! and reports it as a [`DrafterError`] naming the file and the field or tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn_tensor::backend::Backend;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::network::{OrderModel, OrderModelConfig};

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
    /// A tensor has the wrong shape, dtype or values.
    #[error("{path}: tensor `{name}`: {reason}")]
    BadTensor {
        /// The weights file.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// What is wrong (expected vs found).
        reason: String,
    },
}

/// The JSON file that accompanies `weights` (same stem, `.json`).
pub fn config_path(weights: &Path) -> PathBuf {
    weights.with_extension("json")
}

/// Writes `model` to `weights` and its config to [`config_path`]`(weights)`.
pub fn save<B: Backend>(model: &OrderModel<B>, weights: &Path) -> Result<(), DrafterError> {
    let host = model.to_host();
    let bytes: Vec<Vec<u8>> = host
        .iter()
        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(host.len());
    for ((name, shape), b) in model.names().iter().zip(model.shapes()).zip(&bytes) {
        let view =
            TensorView::new(Dtype::F32, shape.clone(), b).map_err(|e| DrafterError::Weights {
                path: weights.to_path_buf(),
                reason: e.to_string(),
            })?;
        views.push((name.clone(), view));
    }
    let meta = HashMap::from([("format".to_string(), "spot-drafter".to_string())]);
    let data = safetensors::serialize(views, Some(meta)).map_err(|e| DrafterError::Weights {
        path: weights.to_path_buf(),
        reason: e.to_string(),
    })?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DrafterError::Io { path, source }
    };
    std::fs::write(weights, data).map_err(io(weights))?;
    let cpath = config_path(weights);
    let json = serde_json::to_string_pretty(model.config()).map_err(|e| DrafterError::Config {
        path: cpath.clone(),
        reason: e.to_string(),
    })?;
    std::fs::write(&cpath, json + "\n").map_err(io(&cpath))
}

/// Reads and checks the JSON config of the checkpoint `weights` (`NAME.json` next to it)
/// without its weights, e.g. for its token calibrations.
pub fn load_config(weights: &Path) -> Result<OrderModelConfig, DrafterError> {
    let cpath = config_path(weights);
    let text = std::fs::read_to_string(&cpath).map_err(|source| DrafterError::Io {
        path: cpath.clone(),
        source,
    })?;
    let cfg: OrderModelConfig = serde_json::from_str(&text).map_err(|e| DrafterError::Config {
        path: cpath.clone(),
        reason: e.to_string(),
    })?;
    cfg.check().map_err(|reason| DrafterError::Config {
        path: cpath,
        reason,
    })?;
    Ok(cfg)
}

/// Reads a checkpoint written by [`save`].
pub fn load<B: Backend>(weights: &Path, device: &B::Device) -> Result<OrderModel<B>, DrafterError> {
    let cfg = load_config(weights)?;
    let bytes = std::fs::read(weights).map_err(|source| DrafterError::Io {
        path: weights.to_path_buf(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| DrafterError::Weights {
        path: weights.to_path_buf(),
        reason: e.to_string(),
    })?;
    let specs = cfg.params();
    let mut host = Vec::with_capacity(specs.len());
    for (name, shape, _) in &specs {
        let bad = |reason: String| DrafterError::BadTensor {
            path: weights.to_path_buf(),
            name: name.clone(),
            reason,
        };
        let t = st.tensor(name).map_err(|_| DrafterError::MissingTensor {
            path: weights.to_path_buf(),
            name: name.clone(),
        })?;
        if t.dtype() != Dtype::F32 {
            return Err(bad(format!("dtype {:?}, expected F32", t.dtype())));
        }
        if t.shape() != shape.as_slice() {
            return Err(bad(format!("shape {:?}, expected {:?}", t.shape(), shape)));
        }
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(bad(format!("non-finite value {} at index {i}", v[i])));
        }
        host.push(v);
    }
    Ok(OrderModel::from_host(cfg, host, device))
}
