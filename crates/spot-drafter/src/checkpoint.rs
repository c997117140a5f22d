//! Drafter checkpoints: `NAME.safetensors` (f32 weights named by the burn module tree, written
//! and read through burn-store's [`SafetensorsStore`]) plus `NAME.json` (the
//! [`OrderModelConfig`], which records the features version and block size).
//!
//! The weights file's only metadata entry names its layout: `spot_drafter_version` =
//! [`CHECKPOINT_VERSION`] (2: burn module names such as `encoder.layers.0.mha.query.weight`;
//! one entry, so that the same weights always give the same bytes). Version-1 files
//! (`format` = `spot-drafter` and no version entry; the flat names of the hand-written
//! network, `layers.0.q.weight`, `layers.0.ln1.weight`, ...) still load,
//! their names mapped onto the module; a later version is refused as
//! [`DrafterError::Version`].
//!
//! Loading checks everything a mismatched or damaged checkpoint could get wrong — the JSON
//! fields, the features version, the layout version, every tensor's presence, dtype and shape,
//! tensors the network does not have, non-finite values — and reports it as a
//! [`DrafterError`] naming the file and the field or tensor.

use std::path::{Path, PathBuf};

use burn_core::config::Config;
use burn_store::{ApplyError, ModuleSnapshot, SafetensorsStore};
use burn_tensor::backend::Backend;
use safetensors::{Dtype, SafeTensors};

use crate::error::DrafterError;
use crate::network::{OrderModel, OrderModelConfig};

/// The checkpoint layout this build writes (see the module documentation).
pub const CHECKPOINT_VERSION: u32 = 2;

/// Metadata key of the layout version.
const VERSION_KEY: &str = "spot_drafter_version";

/// Version-1 names (the flat parameter list of the hand-written network) to module paths,
/// as `(regex, replacement)`. In a pre-norm burn encoder layer `norm_2` precedes attention
/// and `norm_1` the feed-forward.
const VERSION_1_NAMES: [(&str, &str); 12] = [
    (
        r"^layers\.(\d+)\.ln1\.weight$",
        "encoder.layers.$1.norm_2.gamma",
    ),
    (
        r"^layers\.(\d+)\.ln1\.bias$",
        "encoder.layers.$1.norm_2.beta",
    ),
    (
        r"^layers\.(\d+)\.ln2\.weight$",
        "encoder.layers.$1.norm_1.gamma",
    ),
    (
        r"^layers\.(\d+)\.ln2\.bias$",
        "encoder.layers.$1.norm_1.beta",
    ),
    (r"^layers\.(\d+)\.q\.", "encoder.layers.$1.mha.query."),
    (r"^layers\.(\d+)\.k\.", "encoder.layers.$1.mha.key."),
    (r"^layers\.(\d+)\.v\.", "encoder.layers.$1.mha.value."),
    (r"^layers\.(\d+)\.o\.", "encoder.layers.$1.mha.output."),
    (
        r"^layers\.(\d+)\.ffn1\.",
        "encoder.layers.$1.pwff.linear_inner.",
    ),
    (
        r"^layers\.(\d+)\.ffn2\.",
        "encoder.layers.$1.pwff.linear_outer.",
    ),
    (r"^final_ln\.weight$", "final_ln.gamma"),
    (r"^final_ln\.bias$", "final_ln.beta"),
];

/// The JSON file that accompanies `weights` (same stem, `.json`).
pub fn config_path(weights: &Path) -> PathBuf {
    weights.with_extension("json")
}

/// Writes `model` to `weights` (layout [`CHECKPOINT_VERSION`]) and its config to
/// [`config_path`]`(weights)`, replacing both if they exist.
pub fn save<B: Backend>(model: &OrderModel<B>, weights: &Path) -> Result<(), DrafterError> {
    // One metadata entry: burn-store keeps metadata in a hash map, and a single entry makes the
    // file's bytes a function of the weights alone.
    let mut store = SafetensorsStore::from_file(weights)
        .clear_metadata()
        .metadata(VERSION_KEY, CHECKPOINT_VERSION.to_string())
        .overwrite(true);
    model
        .save_into(&mut store)
        .map_err(|e| DrafterError::Weights {
            path: weights.to_path_buf(),
            reason: e.to_string(),
        })?;
    let cpath = config_path(weights);
    model
        .config()
        .save(&cpath)
        .map_err(|source| DrafterError::Io {
            path: cpath,
            source,
        })
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
    cfg.check().map_err(|e| DrafterError::Config {
        path: cpath,
        reason: e.to_string(),
    })?;
    Ok(cfg)
}

/// Reads a checkpoint written by [`save`] (or a version-1 one).
pub fn load<B: Backend>(weights: &Path, device: &B::Device) -> Result<OrderModel<B>, DrafterError> {
    let cfg = load_config(weights)?;
    let bytes = std::fs::read(weights).map_err(|source| DrafterError::Io {
        path: weights.to_path_buf(),
        source,
    })?;
    let version = check_weights(weights, &bytes)?;
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .allow_partial(true)
        .validate(false);
    if version == 1 {
        for (from, to) in VERSION_1_NAMES {
            store = store.with_key_remapping(from, to);
        }
    }
    let mut model = OrderModel::<B>::init(cfg, 0, device);
    let result = model
        .load_from(&mut store)
        .map_err(|e| DrafterError::Weights {
            path: weights.to_path_buf(),
            reason: e.to_string(),
        })?;
    let bad = |name: &str, reason: String| DrafterError::BadTensor {
        path: weights.to_path_buf(),
        name: name.to_string(),
        reason,
    };
    if let Some(e) = result.errors.first() {
        return Err(match e {
            ApplyError::ShapeMismatch {
                path,
                expected,
                found,
            } => bad(
                path,
                format!(
                    "shape {:?}, expected {:?}",
                    found.as_slice(),
                    expected.as_slice()
                ),
            ),
            ApplyError::DTypeMismatch { path, .. }
            | ApplyError::AdapterError { path, .. }
            | ApplyError::LoadError { path, .. } => bad(path, e.to_string()),
        });
    }
    if let Some((name, _)) = result.missing.first() {
        return Err(DrafterError::MissingTensor {
            path: weights.to_path_buf(),
            name: name.clone(),
        });
    }
    if let Some(name) = result.unused.first() {
        return Err(bad(name, "not a parameter of this network".into()));
    }
    Ok(model)
}

/// Checks what burn-store does not: the file's layout version (returned), and that
/// every tensor is finite f32.
fn check_weights(weights: &Path, bytes: &[u8]) -> Result<u32, DrafterError> {
    let invalid = |reason: String| DrafterError::Weights {
        path: weights.to_path_buf(),
        reason,
    };
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| invalid(e.to_string()))?;
    let entries = meta.metadata().clone().unwrap_or_default();
    let version = match (entries.get(VERSION_KEY), entries.get("format")) {
        (Some(v), _) => match v.parse::<u32>() {
            Ok(n) if (1..=CHECKPOINT_VERSION).contains(&n) => n,
            _ => {
                return Err(DrafterError::Version {
                    path: weights.to_path_buf(),
                    found: v.clone(),
                    supported: CHECKPOINT_VERSION,
                });
            }
        },
        (None, Some(f)) if f == "spot-drafter" => 1,
        (None, format) => {
            return Err(invalid(format!(
                "no `{VERSION_KEY}` metadata entry (format {format:?}): not a drafter checkpoint"
            )));
        }
    };
    let st = SafeTensors::deserialize(bytes).map_err(|e| invalid(e.to_string()))?;
    for (name, t) in st.tensors() {
        let bad = |reason: String| DrafterError::BadTensor {
            path: weights.to_path_buf(),
            name: name.clone(),
            reason,
        };
        if t.dtype() != Dtype::F32 {
            return Err(bad(format!("dtype {:?}, expected F32", t.dtype())));
        }
        let non_finite = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .enumerate()
            .find(|(_, x)| !x.is_finite());
        if let Some((i, x)) = non_finite {
            return Err(bad(format!("non-finite value {x} at index {i}")));
        }
    }
    Ok(version)
}
