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
