//! The device suite (`tests/device/`) on a CUDA GPU (`cuda` feature): f32 and bf16. Where no
//! CUDA driver can be loaded every test prints a skip line and returns (CI compiles this file;
//! `tools/gpu/run.sh` runs it on a GPU machine).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod device;

/// The backend the suite runs on.
type B = spot_models::CudaBackend;
