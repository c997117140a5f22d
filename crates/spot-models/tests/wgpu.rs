//! The device suite (`tests/device/`) on wgpu (`wgpu` feature). `.ci/run` runs it on lavapipe,
//! Mesa's Vulkan device on the CPU (`mesa-vulkan-drivers`), with `SPOT_REQUIRE_DEVICE=1`, so it
//! cannot skip there. lavapipe has no bf16: the bf16 cases print skip lines and the f32 kernels,
//! batch shapes and reduction are what it tests.
#![cfg(feature = "wgpu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod device;

/// The backend the suite runs on.
type B = spot_models::WgpuBackend;

/// Fixtures whose statistics are known to change with the batch on this backend, skipped by
/// the batch-invariance test with a line that says so: the MoE's expert products give a row
/// other values when eight states share the forward than when it runs alone (measured on
/// lavapipe, autotune off; padding each expert's rows to a multiple of 8, or the router's
/// product to 64 columns, did not help).
/// Speculative == draft-free and batched == alone still pass on it.
const NOT_BATCH_INVARIANT: &[&str] = &["llada2-moe-tiny"];
