//! The model suites (`tests/suites/`) on the ndarray backend (`ndarray` feature; the workspace's
//! test build enables it, so `cargo test --workspace` runs both CPU backends).
#![cfg(feature = "ndarray")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod suites;

/// The backend the suites run on.
type B = spot_models::NdArrayBackend;
