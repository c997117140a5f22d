//! A directory of trajectories with a manifest, written resumably.
//!
//! Layout: `DIR/manifest.json` (what was decoded and how) and `DIR/samples/NNNNNN.trj`, one
//! [`Trajectory`] per prompt, named by the prompt's index in the prompt file. Reopening a
//! directory with a different manifest is refused ([`CollectError::ManifestMismatch`] names the
//! field), so a resumed collection never mixes settings; samples already on disk are skipped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::trajectory::{FORMAT_VERSION, Trajectory, TrajectoryError};

/// What a trajectory directory holds.
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
}

impl Manifest {
    /// A manifest of the current format.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &str,
        prompts: &str,
        field: &str,
        block_size: usize,
        max_new_tokens: usize,
        early_stop: bool,
        temperature: f32,
        seed: u64,
    ) -> Self {
        Self {
            format: "spot-trajectories".into(),
            version: FORMAT_VERSION,
            model: model.into(),
            prompts: prompts.into(),
            field: field.into(),
            block_size,
            max_new_tokens,
            early_stop,
            temperature,
            seed,
            threshold: None,
        }
    }

    /// The same manifest for trajectories decoded with threshold `tau` (`None`: one commit
    /// per forward).
    pub fn with_threshold(mut self, tau: Option<f32>) -> Self {
        self.threshold = tau;
        self
    }

    fn differences(&self, other: &Self) -> Option<(&'static str, String, String)> {
        let f = |name, a: String, b: String| (a != b).then_some((name, a, b));
        f("format", self.format.clone(), other.format.clone())
            .or_else(|| {
                f(
                    "version",
                    self.version.to_string(),
                    other.version.to_string(),
                )
            })
            .or_else(|| f("model", self.model.clone(), other.model.clone()))
            .or_else(|| f("prompts", self.prompts.clone(), other.prompts.clone()))
            .or_else(|| f("field", self.field.clone(), other.field.clone()))
            .or_else(|| {
                f(
                    "block_size",
                    self.block_size.to_string(),
                    other.block_size.to_string(),
                )
            })
            .or_else(|| {
                f(
                    "max_new_tokens",
                    self.max_new_tokens.to_string(),
                    other.max_new_tokens.to_string(),
                )
            })
            .or_else(|| {
                f(
                    "early_stop",
                    self.early_stop.to_string(),
                    other.early_stop.to_string(),
                )
            })
            .or_else(|| {
                f(
                    "temperature",
                    self.temperature.to_string(),
                    other.temperature.to_string(),
                )
            })
            .or_else(|| f("seed", self.seed.to_string(), other.seed.to_string()))
            .or_else(|| {
                let t = |m: &Self| m.threshold.map_or("none".into(), |x| x.to_string());
                f("threshold", t(self), t(other))
            })
    }
}

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
        field: &'static str,
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
