//! The model's one error: a value of the wrong type or shape, at a path in the snapshot.

use std::fmt;

/// A value of the wrong type or shape at a path in the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// Where in the snapshot, e.g. `segments[3].blocks[0].size`.
    pub path: String,
    /// What the model needs there.
    pub expected: String,
    /// What the file has.
    pub found: String,
}

impl ModelError {
    /// An error at `path`.
    pub fn new(path: impl Into<String>, expected: impl Into<String>, found: impl Into<String>) -> Self {
        ModelError { path: path.into(), expected: expected.into(), found: found.into() }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: expected {}, found {}", self.path, self.expected, self.found)
    }
}

impl std::error::Error for ModelError {}
