//! The set drafters' files: their error, format header check and JSON reading and writing.

use std::path::Path;

use spot_tree::TableError;

/// Errors reading or writing a set drafter file.
#[derive(Debug, thiserror::Error)]
pub enum SetsError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a valid set drafter.
    #[error("{path}: not a valid SPOT-Sets drafter: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        #[source]
        reason: TableError,
    },
}

/// Checks a file's `(format, version)` against the expected pair.
pub(crate) fn check_header(
    (format, version): (&str, u32),
    (want, want_version): (&'static str, u32),
) -> Result<(), TableError> {
    if format != want {
        return Err(TableError::Format {
            found: format.into(),
            expected: want,
        });
    }
    if version != want_version {
        return Err(TableError::Version {
            found: version,
            supported: want_version,
        });
    }
    Ok(())
}

/// Reads the JSON file `path` through `parse`; errors name the file.
pub(crate) fn load_json<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, TableError>,
) -> Result<T, SetsError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SetsError::Io {
        path: shown.clone(),
        source,
    })?;
    parse(&text).map_err(|reason| SetsError::Invalid {
        path: shown,
        reason,
    })
}

/// Writes `text` (or its serialisation error) to `path`; errors name the file.
pub(crate) fn save_json(path: &Path, text: Result<String, TableError>) -> Result<(), SetsError> {
    let shown = path.display().to_string();
    let text = text.map_err(|reason| SetsError::Invalid {
        path: shown.clone(),
        reason,
    })?;
    std::fs::write(path, text).map_err(|source| SetsError::Io {
        path: shown,
        source,
    })
}
