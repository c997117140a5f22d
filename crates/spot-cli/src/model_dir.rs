//! Which model folder a command uses when `--model` is not given.
//!
//! Order: the `SPOT_MODEL` environment variable, then the shipped benchmark target
//! `models/sdar-tiny-code` of the workspace this binary was built from, then
//! `models/sdar-tiny-code` under the current directory.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The shipped model's folder, relative to the workspace root.
pub const SHIPPED_MODEL: &str = "models/sdar-tiny-code";

/// `--model` if given, else the default folder (see the module docs); an error names every
/// place looked at when none exists.
pub fn resolve(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("SPOT_MODEL") {
        return Ok(PathBuf::from(p));
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(SHIPPED_MODEL);
    let local = PathBuf::from(SHIPPED_MODEL);
    for candidate in [&built, &local] {
        if candidate.join("config.json").is_file() {
            return Ok(candidate.clone());
        }
    }
    bail!(
        "no --model given and the shipped model folder was not found (looked in {} and {}); \
         pass --model DIR or set SPOT_MODEL",
        built.display(),
        local.display()
    )
}
