//! A model folder described from its small files and its safetensors headers, without loading
//! a weight (what `spot inspect` prints).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::DecoderConfig;
use crate::family::Family;
use crate::frame::{FolderFacts, FolderFiles};
use crate::{Llada2Config, LladaConfig};
use spot_hf::Result;
use spot_hf::hf::{Tokenizer, Weights};

/// What `config.json`, `generation_config.json`, `tokenizer.json` and the safetensors headers
/// (`model.safetensors`, or the shards of `model.safetensors.index.json`) say about a model
/// folder. The tensor data is never read: opening a folder of any size costs the parsing of
/// these files.
///
/// ```no_run
/// let s = spot_models::FolderSummary::read("SDAR-1.7B-Chat".as_ref())?;
/// println!("{} {} parameters", s.family.name(), s.parameters);
/// # Ok::<(), spot_models::ModelError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct FolderSummary {
    /// The folder.
    pub dir: PathBuf,
    /// The family `config.json`'s `model_type` names.
    pub family: Family,
    /// Rows of the embedding and head.
    pub vocab_size: usize,
    /// Context limit.
    pub max_positions: usize,
    /// The trained block size, when the config names it (SDAR, LLaDA2.0).
    pub block_size: Option<usize>,
    /// The mask id (block-diffusion families), resolved as the loaders resolve it.
    pub mask_id: Option<u32>,
    /// Stop ids (`generation_config.json`, else `config.json`'s `eos_token_id`).
    pub stop_ids: Vec<u32>,
    /// `tokenizer.json`, when present.
    pub tokenizer: Option<Tokenizer>,
    /// Parameters stored in the safetensors files (see [`Weights::parameter_count`]): what a
    /// loaded model's `parameter_count()` reports when the folder holds only tensors the
    /// architecture uses (a tied head that is not stored is not counted).
    pub parameters: usize,
    /// Parameters stored per dtype (`"F32"`, `"BF16"`, ...).
    pub parameters_by_dtype: BTreeMap<String, usize>,
    /// Number of tensors.
    pub tensors: usize,
    /// Number of safetensors files.
    pub files: usize,
}

impl FolderSummary {
    /// Reads the folder `dir`; a missing or malformed file is an error naming it (and the
    /// field, for configs).
    pub fn read(dir: &Path) -> Result<Self> {
        let family = Family::detect(dir)?;
        match family {
            Family::Llada => Self::with(dir, family, &LladaConfig::load(dir)?, None),
            Family::Llada2Moe => {
                let cfg = Llada2Config::load(dir)?;
                Self::with(dir, family, &cfg, cfg.base.block_size)
            }
            Family::Sdar => {
                let (cfg, _) = DecoderConfig::read(dir)?;
                Self::with(dir, family, &cfg, cfg.block_size)
            }
            Family::Dream | Family::Llama | Family::Qwen2 | Family::Qwen3 => {
                Self::with(dir, family, &DecoderConfig::read(dir)?.0, None)
            }
        }
    }

    fn with(
        dir: &Path,
        family: Family,
        cfg: &impl FolderFacts,
        block_size: Option<usize>,
    ) -> Result<Self> {
        let files = FolderFiles::read(dir, cfg, family.mask_tokens())?;
        let weights = Weights::open(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            family,
            vocab_size: cfg.vocab(),
            max_positions: cfg.max_positions(),
            block_size,
            mask_id: files.mask_id,
            stop_ids: files.stop_ids,
            tokenizer: files.tokenizer,
            parameters: weights.parameter_count(),
            parameters_by_dtype: weights.parameters_by_dtype(),
            tensors: weights.len(),
            files: weights.file_count(),
        })
    }
}

#[cfg(all(test, any(feature = "flex", feature = "ndarray")))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use spot_core::{AutoregressiveModel, BlockDiffusionModel};

    use super::FolderSummary;
    use crate::{CausalLm, CpuBackend, DiffusionModel, Family};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    /// The loaded model's parameter count, vocabulary, context, mask and stop ids.
    fn loaded(dir: &Path) -> (usize, usize, usize, Option<u32>, Vec<u32>, Option<usize>) {
        let device = Default::default();
        if Family::detect(dir).unwrap().is_diffusion() {
            let m = DiffusionModel::<CpuBackend>::load(dir, &device).unwrap();
            let i = m.info();
            let n = m.parameter_count();
            (
                n,
                i.vocab_size,
                i.max_positions,
                Some(i.mask_id),
                i.stop_ids.clone(),
                m.block_size(),
            )
        } else {
            let m = CausalLm::<CpuBackend>::load(dir, &device).unwrap();
            let i = m.ar_info();
            let n = m.parameter_count();
            (
                n,
                i.vocab_size,
                i.max_positions,
                None,
                i.stop_ids.clone(),
                None,
            )
        }
    }

    fn assert_matches_loaded(dir: &Path) {
        let s = FolderSummary::read(dir).unwrap();
        let (params, vocab, max_positions, mask_id, stop_ids, block_size) = loaded(dir);
        let name = dir.display();
        assert_eq!(s.parameters, params, "{name}: parameters");
        assert_eq!(
            s.parameters_by_dtype.values().sum::<usize>(),
            params,
            "{name}"
        );
        assert_eq!(s.vocab_size, vocab, "{name}: vocab");
        assert_eq!(s.max_positions, max_positions, "{name}: context");
        assert_eq!(s.mask_id, mask_id, "{name}: mask id");
        assert_eq!(s.stop_ids, stop_ids, "{name}: stop ids");
        assert_eq!(s.block_size, block_size, "{name}: block size");
    }

    /// The header-only summary equals what the loaded model reports, for every family's
    /// fixture and the shipped target.
    #[test]
    fn summary_equals_the_loaded_model() {
        for name in [
            "sdar-tiny",
            "sdar-tiny-bf16",
            "llada-tiny",
            "dream-tiny",
            "llada2-moe-tiny",
            "llama-tiny",
            "qwen2-tiny",
        ] {
            assert_matches_loaded(&fixture(name));
        }
        assert_matches_loaded(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/sdar-tiny-code"),
        );
        let bf16 = FolderSummary::read(&fixture("sdar-tiny-bf16")).unwrap();
        assert_eq!(
            bf16.parameters_by_dtype.keys().collect::<Vec<_>>(),
            ["BF16"]
        );
    }

    /// A folder split into two shards with `model.safetensors.index.json` counts every tensor
    /// once, as the loaded model does.
    #[test]
    fn sharded_folder_counts_every_shard() {
        let src = fixture("llada2-moe-tiny");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for f in ["config.json", "generation_config.json", "tokenizer.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        let mut weight_map = BTreeMap::new();
        let half = names.len() / 2;
        for (k, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
            let file = format!("model-0000{}-of-00002.safetensors", k + 1);
            let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = part
                .iter()
                .map(|n| (n.clone(), st.tensor(n).unwrap()))
                .collect();
            safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
            for n in part {
                weight_map.insert(n.clone(), file.clone());
            }
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let s = FolderSummary::read(dir).unwrap();
        assert_eq!(s.files, 2);
        assert_eq!(s.tensors, names.len());
        assert_matches_loaded(dir);
        assert_eq!(s.parameters, FolderSummary::read(&src).unwrap().parameters);
    }

    /// A missing weights file is an error naming it.
    #[test]
    fn missing_weights_are_named() {
        let src = fixture("sdar-tiny");
        let tmp = tempfile::tempdir().unwrap();
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
        }
        let e = FolderSummary::read(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }
}
