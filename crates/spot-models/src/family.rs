//! The model families this crate runs, told apart by the `model_type` of `config.json`.

use std::path::Path;

use serde::Deserialize;

use spot_hf::hf::read_json;
use spot_hf::{ModelError, Result};

/// The model families this crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// SDAR (`"sdar"`, or `"qwen3"` whose `architectures` names an SDAR class).
    Sdar,
    /// LLaDA (`"llada"`).
    Llada,
    /// Dream (`"Dream"`).
    Dream,
    /// LLaDA2.0 MoE (`"llada2_moe"`).
    Llada2Moe,
    /// Autoregressive Llama (`"llama"`), see [`crate::CausalLm`].
    Llama,
    /// Autoregressive Qwen2 (`"qwen2"`), see [`crate::CausalLm`].
    Qwen2,
    /// Autoregressive Qwen3 (`"qwen3"` without an SDAR class in `architectures`), see
    /// [`crate::CausalLm`].
    Qwen3,
}

#[derive(Deserialize)]
struct ModelType {
    model_type: String,
    #[serde(default)]
    architectures: Vec<String>,
}

impl Family {
    /// The family named by `dir/config.json`'s `model_type`.
    pub fn detect(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let t: ModelType = read_json(&path)?;
        Ok(match t.model_type.as_str() {
            "sdar" => Family::Sdar,
            // SDAR checkpoints exported with the Qwen3 model type still name their class.
            "qwen3" if t.architectures.iter().any(|a| a.starts_with("SDAR")) => Family::Sdar,
            "qwen3" => Family::Qwen3,
            "llada" => Family::Llada,
            "Dream" | "dream" => Family::Dream,
            "llada2_moe" => Family::Llada2Moe,
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            other => {
                return Err(ModelError::InvalidConfig {
                    path,
                    field: "model_type",
                    reason: format!(
                        "unknown model type {other:?}; supported: sdar, llada, Dream, \
                         llada2_moe, llama, qwen2, qwen3"
                    ),
                });
            }
        })
    }

    /// Whether the family is decoded by block diffusion (else it is autoregressive).
    pub fn is_diffusion(self) -> bool {
        !matches!(self, Family::Llama | Family::Qwen2 | Family::Qwen3)
    }

    /// The tokenizer strings of the family's mask token, looked up when `config.json` has no
    /// `mask_token_id`; `None` for autoregressive families.
    pub(crate) fn mask_tokens(self) -> Option<&'static [&'static str]> {
        match self {
            Family::Sdar => Some(&["<|MASK|>"]),
            Family::Llada => Some(&["<|mdm_mask|>"]),
            Family::Dream | Family::Llada2Moe => Some(&["<|mask|>"]),
            Family::Llama | Family::Qwen2 | Family::Qwen3 => None,
        }
    }

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Sdar => "sdar",
            Family::Llada => "llada",
            Family::Dream => "dream",
            Family::Llada2Moe => "llada2-moe",
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }
}
