//! Reading Hugging Face model folders: JSON configs, (sharded) safetensors, tokenizers.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};
use serde::de::DeserializeOwned;

use crate::error::{ModelError, Result};

/// Reads and deserialises a JSON file; a missing required field is reported with the file name.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Stop ids from `generation_config.json` (`eos_token_id`, a number or a list); empty when the
/// file is absent.
pub fn generation_stop_ids(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let v: serde_json::Value = read_json(&path)?;
    Ok(token_ids(v.get("eos_token_id")))
}

/// A token id or a list of token ids, as HF configs write `eos_token_id`.
pub fn token_ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// Header length and the parsed (validated) header, read once when the shard is opened.
    header_len: usize,
    metadata: Metadata,
}

/// The safetensors weights of a model folder, memory-mapped: `model.safetensors`, or the shards
/// listed by `model.safetensors.index.json`.
pub struct Weights {
    shards: Vec<Shard>,
    /// Tensor name -> shard index.
    index: BTreeMap<String, usize>,
    dir: PathBuf,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("dir", &self.dir)
            .field("tensors", &self.index.len())
            .finish()
    }
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl Weights {
    /// Opens the weights of the folder `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index_path.exists() {
            let idx: ShardIndex = read_json(&index_path)?;
            let mut files: Vec<PathBuf> = idx.weight_map.values().map(|f| dir.join(f)).collect();
            files.sort();
            files.dedup();
            files
        } else {
            return Err(ModelError::io(
                single,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither model.safetensors nor model.safetensors.index.json exists",
                ),
            ));
        };
        let mut weights = Self {
            shards: Vec::new(),
            index: BTreeMap::new(),
            dir: dir.to_path_buf(),
        };
        for path in files {
            // A shard may hold more than the index maps to it: the later shard's copy wins.
            weights.add(path, false)?;
        }
        Ok(weights)
    }

    /// These weights and the tensors of the safetensors file `path` (a module trained on top
    /// of a model, such as the MRP baseline, which shares the model's embedding). A name both
    /// hold is an error naming `path`.
    pub fn with_file(mut self, path: &Path) -> Result<Self> {
        self.add(path.to_path_buf(), true)?;
        Ok(self)
    }

    /// Maps `path` and indexes its tensors; `distinct`: a name already indexed is an error.
    fn add(&mut self, path: PathBuf, distinct: bool) -> Result<()> {
        let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
        // SAFETY-free: memmap2's `map` is safe to call; the file must not be truncated while
        // mapped, which the loader documents.
        let mmap = map(&file).map_err(|e| ModelError::io(&path, e))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                message: e.to_string(),
            })?;
        for name in metadata.tensors().into_keys() {
            let shard = self.shards.len();
            if let Some(old) = self.index.insert(name.clone(), shard)
                && distinct
            {
                return Err(ModelError::Safetensors {
                    path,
                    message: format!(
                        "tensor {name} is also in {}",
                        self.shards[old].path.display()
                    ),
                });
            }
        }
        self.shards.push(Shard {
            path,
            mmap,
            header_len,
            metadata,
        });
        Ok(())
    }

    /// Whether the weights contain `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Number of safetensors files (1, or the shards of the index).
    pub fn file_count(&self) -> usize {
        self.shards.len()
    }

    /// Dtype and element count of every tensor (each name once, across shards), from the
    /// headers read at [`Weights::open`]: the tensor data is never read.
    fn tensor_sizes(&self) -> impl Iterator<Item = (Dtype, usize)> {
        self.index.iter().filter_map(|(name, &i)| {
            let info = self.shards.get(i)?.metadata.info(name)?;
            Some((info.dtype, info.shape.iter().product()))
        })
    }

    /// Number of parameters stored: the sum of the element counts of every tensor, from the
    /// headers only. A tied head that is not stored is not counted, so this equals the loaded
    /// model's `parameter_count()` when the folder stores only tensors the architecture uses.
    pub fn parameter_count(&self) -> usize {
        self.tensor_sizes().map(|(_, n)| n).sum()
    }

    /// Parameters stored per dtype (`"F32"`, `"BF16"`, ...), from the headers only.
    pub fn parameters_by_dtype(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (dtype, n) in self.tensor_sizes() {
            *out.entry(dtype.to_string()).or_insert(0) += n;
        }
        out
    }

    /// Tensor `name` as f32 values (converted from BF16/F16), checked against `shape`.
    pub fn load_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let shard = self
            .index
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                path: self.dir.clone(),
            })?;
        // The header was validated at open (offsets inside the file), so the slice exists.
        let info = shard
            .metadata
            .info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                path: shard.path.clone(),
            })?;
        if info.shape != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: info.shape.clone(),
            });
        }
        let (begin, end) = info.data_offsets;
        let base = 8 + shard.header_len;
        let bytes =
            shard
                .mmap
                .get(base + begin..base + end)
                .ok_or_else(|| ModelError::Safetensors {
                    path: shard.path.clone(),
                    message: format!("data of tensor `{name}` lies outside the file"),
                })?;
        let out: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::TensorDtype {
                    name: name.to_string(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(out)
    }
}

#[allow(unsafe_code)]
fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only; like every safetensors loader, we require that the file
    // is not modified while the model is loading (the data is copied out during loading).
    unsafe { Mmap::map(file) }
}

/// A `tokenizer.json` loaded with the `tokenizers` crate.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let inner = guarded(&path, || tokenizers::Tokenizer::from_file(&path))?;
        Ok(Self { inner, path })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = guarded(&self.path, || self.inner.encode(text, false))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        guarded(&self.path, || self.inner.decode(ids, true))
    }

    /// The id of a token string, e.g. `<|MASK|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Runs a call into the `tokenizers` crate and returns its error, or its panic, as a
/// [`ModelError::Tokenizer`] naming `path`. The crate panics on some damaged `tokenizer.json`
/// files instead of returning an error (tokenizers 0.23: an arithmetic overflow while building
/// a BPE model whose vocabulary and merges disagree), so every call goes through here.
fn guarded<T>(path: &Path, f: impl FnOnce() -> tokenizers::Result<T>) -> Result<T> {
    let fail = |message: String| ModelError::Tokenizer {
        path: path.to_path_buf(),
        message,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| fail(e.to_string())),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(fail(format!("the tokenizers crate panicked: {what}")))
        }
    }
}
