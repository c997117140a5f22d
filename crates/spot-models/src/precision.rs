//! The float type a model holds its weights and activations in on the device.

use burn_tensor::DType;
use burn_tensor::backend::Backend;

use spot_hf::hf::Weights;
use spot_hf::{ModelError, Result};

/// The float type of a model's weights and activations on the device.
///
/// In `Bf16` and `F16` the weights stay on the device in that type (2 bytes per parameter) and
/// matrix products take it (on CUDA: tensor cores with f32 accumulation), while RMSNorm, the
/// attention softmax, the MoE router and the output reduction run in f32, as Hugging Face
/// computes them. `F32` is the reference path. `Auto` (what
/// [`DiffusionModel::load`](crate::DiffusionModel::load) uses) is f32 on the CPU backends and
/// the checkpoint's own type (the type most of its parameters are stored in) on a GPU.
///
/// ```
/// use spot_models::Precision;
/// let p: Precision = "bf16".parse().unwrap();
/// assert_eq!(p, Precision::Bf16);
/// assert_eq!(p.to_string(), "bf16");
/// assert!("f64".parse::<Precision>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Precision {
    /// f32 on CPU backends, the checkpoint's type on GPU backends.
    #[default]
    Auto,
    /// 32-bit floats: the reference.
    F32,
    /// bfloat16 weights and activations.
    Bf16,
    /// IEEE half-precision weights and activations.
    F16,
}

impl Precision {
    /// Every precision, in the order of the command line's help.
    pub const ALL: [Precision; 4] = [
        Precision::Auto,
        Precision::F32,
        Precision::Bf16,
        Precision::F16,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The precision of a checkpoint: the type most of its parameters are stored in (f32
    /// for any type other than BF16 and F16).
    pub fn of_checkpoint(weights: &Weights) -> Precision {
        let by_type = weights.parameters_by_dtype();
        match by_type
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(t, _)| t.as_str())
        {
            Some("BF16") => Precision::Bf16,
            Some("F16") => Precision::F16,
            _ => Precision::F32,
        }
    }

    /// The precision of burn float type `dtype` (f32 for any other than BF16 and F16).
    pub(crate) fn of_dtype(dtype: DType) -> Precision {
        match dtype {
            DType::BF16 => Precision::Bf16,
            DType::F16 => Precision::F16,
            _ => Precision::F32,
        }
    }

    /// The burn type this precision means for `weights` on `device`; a type the backend
    /// cannot hold is an error naming both.
    pub(crate) fn resolve<B: Backend>(
        self,
        weights: &Weights,
        device: &B::Device,
    ) -> Result<DType> {
        let p = match self {
            Precision::Auto if crate::values::runs_on_host::<B>(device) => Precision::F32,
            Precision::Auto => Precision::of_checkpoint(weights),
            p => p,
        };
        let dtype = match p {
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
            _ => DType::F32,
        };
        if B::supports_dtype(device, dtype) {
            Ok(dtype)
        } else {
            Err(ModelError::Request(format!(
                "precision {}: the {} backend has no {dtype:?} tensors",
                p.name(),
                B::name(device)
            )))
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown precision {s:?}; one of auto, f32, bf16, f16"))
    }
}
