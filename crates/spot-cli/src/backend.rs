//! The burn backend the binary runs on, and its device.
//!
//! Several backend features may be compiled in at once (`--features cuda` keeps the default
//! `flex`): the precedence is cuda > wgpu > flex > ndarray, so a GPU feature, when compiled
//! in, is the backend used. Every command that runs a network calls [`device`], which names
//! the backend on stderr once (`spot: backend cuda (GPU)`) and turns a backend that cannot
//! start (burn panics, e.g. when `libcuda` cannot be loaded) into an error naming it.

use std::sync::{Mutex, OnceLock};

use anyhow::{Result, anyhow};
use burn_tensor::Tensor;

#[cfg(not(any(
    feature = "cuda",
    feature = "wgpu",
    feature = "flex",
    feature = "ndarray"
)))]
compile_error!("build spot-cli with one of the features cuda, wgpu, flex, ndarray");

/// The backend of this build: CUDA (`cuda` feature).
#[cfg(feature = "cuda")]
pub type Backend = spot_models::CudaBackend;
/// The backend of this build: wgpu (`wgpu` feature, no `cuda`).
#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
pub type Backend = spot_models::WgpuBackend;
/// The backend of this build: flex (`flex` feature, no GPU feature).
#[cfg(all(feature = "flex", not(any(feature = "cuda", feature = "wgpu"))))]
pub type Backend = spot_models::FlexBackend;
/// The backend of this build: ndarray (only the `ndarray` feature).
#[cfg(all(
    feature = "ndarray",
    not(any(feature = "cuda", feature = "wgpu", feature = "flex"))
))]
pub type Backend = spot_models::NdArrayBackend;

/// The backends the binary can be built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// burn-cuda (NVIDIA GPU).
    Cuda,
    /// burn-wgpu (GPU through Vulkan, Metal or DX12).
    Wgpu,
    /// burn-flex (CPU).
    Flex,
    /// burn-ndarray (CPU).
    Ndarray,
}

impl Kind {
    /// Every backend, in precedence order.
    pub const ALL: [Kind; 4] = [Kind::Cuda, Kind::Wgpu, Kind::Flex, Kind::Ndarray];

    /// The Cargo feature.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Cuda => "cuda",
            Kind::Wgpu => "wgpu",
            Kind::Flex => "flex",
            Kind::Ndarray => "ndarray",
        }
    }

    /// The feature and the kind of device, e.g. `cuda (GPU)`.
    pub const fn describe(self) -> &'static str {
        match self {
            Kind::Cuda => "cuda (GPU)",
            Kind::Wgpu => "wgpu (GPU)",
            Kind::Flex => "flex (CPU)",
            Kind::Ndarray => "ndarray (CPU)",
        }
    }
}

/// The backend used when the features of [`Kind::ALL`] marked `true` are compiled in: the
/// first in precedence order; `None` when there is none.
pub const fn select(compiled: [bool; 4]) -> Option<Kind> {
    let mut i = 0;
    while i < Kind::ALL.len() {
        if compiled[i] {
            return Some(Kind::ALL[i]);
        }
        i += 1;
    }
    None
}

/// Which of [`Kind::ALL`] this build has.
const COMPILED: [bool; 4] = [
    cfg!(feature = "cuda"),
    cfg!(feature = "wgpu"),
    cfg!(feature = "flex"),
    cfg!(feature = "ndarray"),
];

/// The backend of this build ([`Backend`]).
pub const ACTIVE: Kind = match select(COMPILED) {
    Some(k) => k,
    None => panic!("build spot-cli with one of the features cuda, wgpu, flex, ndarray"),
};

/// The backends compiled into this build, in precedence order.
pub fn compiled() -> Vec<Kind> {
    Kind::ALL
        .into_iter()
        .zip(COMPILED)
        .filter_map(|(k, on)| on.then_some(k))
        .collect()
}

/// What `spot --version` prints after the version: the backend used and those compiled in.
pub fn version() -> String {
    let names: Vec<&str> = compiled().into_iter().map(Kind::name).collect();
    format!(
        "{}\nbackend: {}; compiled in: {}",
        env!("CARGO_PKG_VERSION"),
        ACTIVE.describe(),
        names.join(", ")
    )
}

/// The default device of [`Backend`]. The first call prints `spot: backend NAME (KIND)` to
/// stderr and runs one small computation on the device; a panic there (burn panics when a GPU
/// runtime cannot start) becomes an error naming the backend and the cause.
pub fn device() -> Result<<Backend as burn_tensor::backend::BackendTypes>::Device> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        eprintln!("spot: backend {}", ACTIVE.describe());
        // Compiled kernels persist on disk (CubeCL's cache is off by default): once per
        // machine, not once per process. Must precede the first tensor on the device.
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        spot_models::enable_kernel_cache();
        probe()
    });
    match probe {
        Ok(()) => Ok(Default::default()),
        Err(cause) => Err(anyhow!(
            "backend {} could not start: {cause}\n(this binary was built with the features {}; \
             a build without the GPU features, e.g. `--no-default-features --features flex`, \
             runs on the CPU)",
            ACTIVE.describe(),
            compiled()
                .into_iter()
                .map(Kind::name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Creates a tensor on the default device and reads a reduction back; a panic becomes the
/// message of the first panic meanwhile, the cause (burn may panic in a runtime thread, the
/// calling thread then on a closed channel). The default panic hook is silenced meanwhile, so
/// no backtrace is printed.
fn probe() -> std::result::Result<(), String> {
    static MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = MESSAGES.lock() {
            m.push(panic_message(info.payload()));
        }
    }));
    let result = std::panic::catch_unwind(|| {
        let device = Default::default();
        Tensor::<Backend, 1>::from_floats([1.0, 2.0], &device)
            .sum()
            .into_scalar()
    });
    std::panic::set_hook(hook);
    match result {
        Ok(_) => Ok(()),
        Err(payload) => {
            let first = MESSAGES.lock().ok().and_then(|m| m.first().cloned());
            Err(first.unwrap_or_else(|| panic_message(payload.as_ref())))
        }
    }
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "the backend panicked".to_string())
}

#[cfg(test)]
mod tests {
    use super::{ACTIVE, Backend, Kind, compiled, device, select};

    #[test]
    fn a_gpu_feature_wins_over_the_cpu_backends() {
        let (c, w, f, n) = (Kind::Cuda, Kind::Wgpu, Kind::Flex, Kind::Ndarray);
        // --features cuda with the default flex: cuda.
        assert_eq!(select([true, false, true, false]), Some(c));
        assert_eq!(select([false, true, true, false]), Some(w));
        assert_eq!(select([true, true, true, true]), Some(c));
        assert_eq!(select([false, true, false, true]), Some(w));
        assert_eq!(select([false, false, true, true]), Some(f));
        assert_eq!(select([false, false, false, true]), Some(n));
        assert_eq!(select([false; 4]), None);
    }

    /// The type alias is the backend [`ACTIVE`] names, and this build's list starts with it.
    #[test]
    fn the_alias_is_the_selected_backend() {
        let ty = std::any::type_name::<Backend>().to_lowercase();
        assert!(ty.contains(ACTIVE.name()), "{ty} vs {ACTIVE:?}");
        assert_eq!(compiled().first(), Some(&ACTIVE));
        assert!(super::version().contains(ACTIVE.describe()));
    }

    /// On the CPU backends the device starts (the probe runs a reduction).
    #[test]
    fn the_cpu_device_starts() {
        if !matches!(ACTIVE, Kind::Flex | Kind::Ndarray) {
            return;
        }
        assert!(device().is_ok());
    }
}
