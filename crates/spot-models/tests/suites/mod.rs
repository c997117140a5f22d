//! The model suites, written once for a CPU backend `crate::B` and compiled into one test binary
//! per backend: `tests/models.rs` (the default backend, flex) and `tests/models_ndarray.rs`
//! (ndarray, when the `ndarray` feature is on, as it is in `cargo test --workspace`).

mod autoregressive;
mod families;
mod families_bad_input;
mod sdar_bad_input;
mod sdar_exactness;
