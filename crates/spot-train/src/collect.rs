//! A directory of trajectories with a manifest, written resumably.
//!
//! Layout: `DIR/manifest.json` (what was decoded and how) and `DIR/samples/NNNNNN.trj`, one
//! [`Trajectory`] per prompt, named by the prompt's index in the prompt file. Reopening a
//! directory with a different manifest is refused ([`CollectError::ManifestMismatch`] names the
//! field), so a resumed collection never mixes settings; samples already on disk are skipped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spot_core::{DecodeConfig, TokenId, Transition};

use crate::trajectory::{FORMAT_VERSION, Trajectory, TrajectoryError};

/// What a trajectory directory holds: where it came from, and every [`DecodeConfig`] field
/// that determines the decoded tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `"spot-trajectories"`.
    pub format: String,
    /// The trajectory file format version.
    pub version: u32,
    /// The model folder decoded.
    pub model: String,
    /// The prompt file.
    pub prompts: String,
    /// The prompt field of its records.
    pub field: String,
    /// Block size.
    pub block_size: usize,
    /// Tokens generated per prompt.
    pub max_new_tokens: usize,
    /// Whether decoding stopped at a stop id.
    pub early_stop: bool,
    /// Temperature.
    pub temperature: f32,
    /// Noise seed.
    pub seed: u64,
    /// The threshold `τ` of threshold decoding (`None`: one commit per forward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f32>,
    /// The transition ([`Transition`]'s display form, e.g. `exact`, `threshold(0.9)`);
    /// `None` in manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<String>,
    /// The confidence rule ([`spot_core::ConfidenceRule::name`]); `None` in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<String>,
    /// The block layout ([`spot_core::BlockLayout::name`]); `None` in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Stop ids; `None` in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_ids: Option<Vec<TokenId>>,
    /// Top-k entries of the statistics ([`DecodeConfig::top_k`]: the width of the stale
    /// top-k that the stored tail mass and hedge come from); `None` in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// Top-k sampling truncation ([`DecodeConfig::sample_top_k`]); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_top_k: Option<usize>,
    /// Whether the trajectories carry the target's hidden states (`spot collect
    /// --hidden-states`); absent: no.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hidden_states: bool,
}

impl Manifest {
    /// The manifest of trajectories of the model folder `model` on the prompts of `prompts`
    /// (field `field`) decoded under `cfg`.
    ///
    /// ```
    /// use spot_core::{DecodeConfig, Transition};
    /// use spot_train::collect::Manifest;
    /// let cfg = DecodeConfig { transition: Transition::Threshold { tau: 0.9 }, ..DecodeConfig::default() };
    /// let m = Manifest::for_decode("m", "p.jsonl", "prompt", &cfg);
    /// assert_eq!(m.threshold, Some(0.9));
    /// assert_eq!(m.transition.as_deref(), Some("threshold(0.9)"));
    /// assert_eq!(m.layout.as_deref(), Some("aligned"));
    /// ```
    pub fn for_decode(model: &str, prompts: &str, field: &str, cfg: &DecodeConfig) -> Self {
        // Every field, by name: a field added to `DecodeConfig` does not compile here until
        // the manifest records it (or says why it need not).
        let DecodeConfig {
            block_size,
            max_new_tokens,
            temperature,
            seed,
            transition,
            confidence,
            stop_ids,
            early_stop,
            top_k,
            sample_top_k,
            layout,
        } = cfg;
        let threshold = match *transition {
            Transition::Threshold { tau } => Some(tau),
            Transition::Scheduled { tau, .. } => tau,
            _ => None,
        };
        Self {
            format: "spot-trajectories".into(),
            version: FORMAT_VERSION,
            model: model.into(),
            prompts: prompts.into(),
            field: field.into(),
            block_size: *block_size,
            max_new_tokens: *max_new_tokens,
            early_stop: *early_stop,
            temperature: *temperature,
            seed: *seed,
            threshold,
            transition: Some(transition.to_string()),
            confidence: Some(confidence.name().into()),
            layout: Some(layout.name().into()),
            stop_ids: Some(stop_ids.clone()),
            top_k: Some(*top_k),
            sample_top_k: *sample_top_k,
            hidden_states: false,
        }
    }

    /// The first field (in declaration order) whose value differs: its name, then this
    /// manifest's value and `other`'s, as JSON (`null`: not recorded).
    fn differences(&self, other: &Self) -> Option<(String, String, String)> {
        let (Ok(Value::Object(a)), Ok(Value::Object(b))) =
            (serde_json::to_value(self), serde_json::to_value(other))
        else {
            return Some(("manifest".into(), format!("{self:?}"), format!("{other:?}")));
        };
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        let order = |k: &String| FIELDS.iter().position(|f| f == k).unwrap_or(FIELDS.len());
        keys.sort_by_key(|k| (order(k), *k));
        keys.dedup();
        keys.into_iter().find_map(|k| {
            let (x, y) = (
                a.get(k).unwrap_or(&Value::Null),
                b.get(k).unwrap_or(&Value::Null),
            );
            (x != y).then(|| (k.clone(), x.to_string(), y.to_string()))
        })
    }
}

/// [`Manifest`]'s fields, in declaration order (for [`Manifest::differences`]).
const FIELDS: [&str; 18] = [
    "format",
    "version",
    "model",
    "prompts",
    "field",
    "block_size",
    "max_new_tokens",
    "early_stop",
    "temperature",
    "seed",
    "threshold",
    "transition",
    "confidence",
    "layout",
    "stop_ids",
    "top_k",
    "sample_top_k",
    "hidden_states",
];

/// Why a trajectory directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// A trajectory file problem.
    #[error(transparent)]
    Trajectory(#[from] TrajectoryError),
    /// The manifest could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("{path}: invalid manifest: {reason}")]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// Parser message.
        reason: String,
    },
    /// The directory was collected with other settings.
    #[error(
        "{path}: collected with {field} = {existing}, requested {requested}; use another --out or the same settings"
    )]
    ManifestMismatch {
        /// The manifest.
        path: PathBuf,
        /// The first differing field.
        field: String,
        /// Its value on disk.
        existing: String,
        /// The requested value.
        requested: String,
    },
}

/// An open trajectory directory.
#[derive(Debug)]
pub struct TrajectoryDir {
    root: PathBuf,
    manifest: Manifest,
}

impl TrajectoryDir {
    /// Creates `dir` (and its manifest) or reopens it, refusing a different manifest.
    pub fn create_or_resume(dir: &Path, manifest: Manifest) -> Result<Self, CollectError> {
        let samples = dir.join("samples");
        std::fs::create_dir_all(&samples).map_err(|source| CollectError::Io {
            path: samples.clone(),
            source,
        })?;
        let mpath = dir.join("manifest.json");
        if mpath.exists() {
            let existing = read_manifest(&mpath)?;
            if let Some((field, existing, requested)) = existing.differences(&manifest) {
                return Err(CollectError::ManifestMismatch {
                    path: mpath,
                    field,
                    existing,
                    requested,
                });
            }
        } else {
            let text =
                serde_json::to_string_pretty(&manifest).map_err(|e| CollectError::BadManifest {
                    path: mpath.clone(),
                    reason: e.to_string(),
                })?;
            std::fs::write(&mpath, text + "\n").map_err(|source| CollectError::Io {
                path: mpath.clone(),
                source,
            })?;
        }
        Ok(Self {
            root: dir.to_path_buf(),
            manifest,
        })
    }

    /// Opens an existing directory for reading.
    pub fn open(dir: &Path) -> Result<Self, CollectError> {
        let manifest = read_manifest(&dir.join("manifest.json"))?;
        if manifest.version != FORMAT_VERSION {
            return Err(CollectError::Trajectory(TrajectoryError::Version {
                path: dir.join("manifest.json"),
                found: manifest.version,
            }));
        }
        Ok(Self {
            root: dir.to_path_buf(),
            manifest,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The file of sample `index`.
    pub fn sample_path(&self, index: usize) -> PathBuf {
        self.root.join("samples").join(format!("{index:06}.trj"))
    }

    /// Whether sample `index` is already on disk (and reads back whole).
    pub fn has(&self, index: usize) -> Result<bool, CollectError> {
        let p = self.sample_path(index);
        if !p.exists() {
            return Ok(false);
        }
        Trajectory::read(&p)?;
        Ok(true)
    }

    /// Writes sample `index`.
    pub fn write(&self, index: usize, t: &Trajectory) -> Result<(), CollectError> {
        Ok(t.write(&self.sample_path(index))?)
    }

    /// Every sample on disk, by index.
    pub fn read_all(&self) -> Result<Vec<(usize, Trajectory)>, CollectError> {
        let dir = self.root.join("samples");
        let entries = std::fs::read_dir(&dir).map_err(|source| CollectError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|source| CollectError::Io {
                path: dir.clone(),
                source,
            })?;
            let p = e.path();
            let index = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".trj"))
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(index) = index {
                out.push((index, Trajectory::read(&p)?));
            }
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    }
}

fn read_manifest(path: &Path) -> Result<Manifest, CollectError> {
    let text = std::fs::read_to_string(path).map_err(|source| CollectError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| CollectError::BadManifest {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
