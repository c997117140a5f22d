//! The drafters' fitted tables and small networks, stored as JSON: [`TableError`], what is
//! wrong with one, and [`bin`], the confidence-bin lookup the tables share.

/// What is wrong with a drafter's tables or parameters (SPOT-Sets join tables and set network,
/// its token head, a token calibration, a prior or tilt table): which field and why. Errors
/// about a file add the file (`spot_sets::SetsError::Invalid`,
/// `spot_drafter::ConfigError::Calibration`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TableError {
    /// The JSON text could not be parsed or written.
    #[error("JSON: {0}")]
    Json(String),
    /// The file's format tag is another format's.
    #[error("format is {found:?}, expected {expected:?}")]
    Format {
        /// The tag found.
        found: String,
        /// The tag this reader reads.
        expected: &'static str,
    },
    /// The file's version is not one this build reads.
    #[error("version {found} is not supported (this build reads {supported})")]
    Version {
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// A field is out of range, or disagrees with another.
    #[error("`{field}`: {reason}")]
    Field {
        /// The field (a dotted path where nested).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A parameter holds the wrong number of values.
    #[error("`{name}` has {actual} values, expected {expected}")]
    Size {
        /// The parameter.
        name: String,
        /// Values its shape needs.
        expected: usize,
        /// Values it holds.
        actual: usize,
    },
    /// A parameter holds a NaN or an infinity.
    #[error("`{name}` holds a non-finite value")]
    NonFinite {
        /// The parameter.
        name: String,
    },
    /// An error in the `index`-th table of a file.
    #[error("table {index}: {source}")]
    Table {
        /// 0-based table index.
        index: usize,
        /// What is wrong with it.
        source: Box<TableError>,
    },
}

impl TableError {
    /// A [`TableError::Field`].
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Checks `params` against `(name, [rows, cols])` specs: lengths, then finiteness.
    pub fn check_params(
        specs: &[(&'static str, [usize; 2])],
        params: &[Vec<f32>],
    ) -> Result<(), Self> {
        if params.len() != specs.len() {
            return Err(Self::Size {
                name: "parameter tensors".into(),
                expected: specs.len(),
                actual: params.len(),
            });
        }
        for ((name, [a, b]), p) in specs.iter().zip(params) {
            if p.len() != a * b {
                return Err(Self::Size {
                    name: (*name).into(),
                    expected: a * b,
                    actual: p.len(),
                });
            }
            if p.iter().any(|v| !v.is_finite()) {
                return Err(Self::NonFinite {
                    name: (*name).into(),
                });
            }
        }
        Ok(())
    }
}

impl From<serde_json::Error> for TableError {
    fn from(e: serde_json::Error) -> Self {
        Self::Json(e.to_string())
    }
}

/// The first bin whose upper edge is at least `confidence` (the last bin above every edge).
pub fn bin(edges: &[f32], confidence: f32) -> usize {
    edges
        .iter()
        .position(|&e| confidence <= e)
        .unwrap_or(edges.len().saturating_sub(1))
}
