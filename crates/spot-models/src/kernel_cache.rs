//! CubeCL's on-disk cache of compiled kernels, for the GPU backends.

/// Turns on CubeCL's on-disk cache of compiled kernels (PTX on CUDA) for this process, so that
/// each kernel is compiled once per machine instead of once per process.
///
/// A `cubecl.toml`, `CubeCL.toml` or `burn.toml` found from the working directory upward (and
/// the `CUBECL_*` environment variables) is read as CubeCL reads it; only a missing
/// `[compilation] cache` is filled in, with `target` (the `target/` folder of the nearest Cargo
/// workspace, else the user's cache directory under `cubecl/`). Autotune results are cached on
/// disk by CubeCL in any case.
///
/// Call it before the first tensor is created on a GPU device: CubeCL fixes its configuration
/// on first use. Returns `false`, changing nothing, when the configuration was already fixed.
///
/// ```no_run
/// # #[cfg(feature = "cuda")] {
/// spot_models::enable_kernel_cache();
/// let device = Default::default();
/// let model = spot_models::DiffusionModel::<spot_models::CudaBackend>::load(
///     "SDAR-1.7B-Chat".as_ref(),
///     &device,
/// );
/// # }
/// ```
pub fn enable_kernel_cache() -> bool {
    use burn_cubecl::cubecl::config::cache::CacheConfig;
    use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    if CubeClRuntimeConfig::storage().lock().is_some() {
        return false;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if config.compilation.cache.is_none() {
        config.compilation.cache = Some(CacheConfig::Target);
    }
    CubeClRuntimeConfig::set(config);
    true
}
