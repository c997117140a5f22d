//! The model suites (`tests/suites/`) on the default CPU backend: every family against the
//! transformers oracle, floating-point exactness, speculative == draft-free, bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod suites;

/// The backend the suites run on.
type B = spot_models::CpuBackend;
