//! Warnings and errors about definition files, and what loading a set of files produced.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use super::{AgentDefinition, DefinitionSource};
use crate::error::Error;

/// A warning or an error about one place in one definition file.
///
/// `Display` prints `path:line:column: message`, the form editors and terminals link to.
/// Serialises as `{"path", "line", "column", "message"}` (the path as a string, lossily if
/// it is not UTF-8).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Diagnostic {
    /// The file.
    #[serde(serialize_with = "path_lossy")]
    pub path: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at `line`:`column` of `path`.
    pub fn new(
        path: impl Into<PathBuf>,
        line: usize,
        column: usize,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            path: path.into(),
            line,
            column,
            message: message.into(),
        }
    }

    /// The diagnostic an error about a definition file stands for: [`Error::Definition`] as
    /// it is, [`Error::Io`] at line 1, column 1. `None` for any other error.
    pub fn from_error(error: &Error) -> Option<Diagnostic> {
        match error {
            Error::Definition {
                path,
                line,
                column,
                message,
            } => Some(Diagnostic::new(
                path.clone(),
                *line,
                *column,
                message.clone(),
            )),
            Error::Io {
                action,
                path,
                source,
            } => Some(Diagnostic::new(
                path.clone(),
                1,
                1,
                format!("{action} failed: {source}"),
            )),
            _ => None,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.path.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

impl From<Diagnostic> for Error {
    fn from(d: Diagnostic) -> Self {
        Error::Definition {
            path: d.path,
            line: d.line,
            column: d.column,
            message: d.message,
        }
    }
}

fn path_lossy<S: Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// What became of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileStatus {
    /// Read without a single warning.
    Loaded,
    /// Read, with at least one warning (a repaired YAML value, an unknown permission mode, ...).
    Recovered,
    /// Not used; exactly one error says why.
    Rejected,
}

/// One file the loader looked at and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// The file.
    #[serde(serialize_with = "path_lossy")]
    pub path: PathBuf,
    /// The source it was loaded as.
    pub source: DefinitionSource,
    /// Loaded, recovered or rejected.
    pub status: FileStatus,
}

/// Everything loading a set of files produced: the definitions that were read, and every
/// warning and error, in file order (files sorted by path, then by position in the file).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct LoadReport {
    /// The definitions read (loaded or recovered files), in file order; not yet merged.
    pub definitions: Vec<AgentDefinition>,
    /// Warnings: each names a place that was repaired or ignored, and how to fix it.
    pub warnings: Vec<Diagnostic>,
    /// Errors: one per rejected file (or unreadable directory).
    pub errors: Vec<Diagnostic>,
    /// Every file looked at, exactly once, in order.
    pub files: Vec<FileReport>,
}

impl LoadReport {
    /// An empty report.
    pub fn new() -> Self {
        LoadReport::default()
    }

    /// How many files ended with `status`.
    pub fn count(&self, status: FileStatus) -> usize {
        self.files.iter().filter(|f| f.status == status).count()
    }

    /// Appends another report's definitions, diagnostics and files to this one.
    pub fn extend(&mut self, other: LoadReport) {
        self.definitions.extend(other.definitions);
        self.warnings.extend(other.warnings);
        self.errors.extend(other.errors);
        self.files.extend(other.files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_json() {
        let d = Diagnostic::new("a/b.md", 3, 14, "bad");
        assert_eq!(d.to_string(), "a/b.md:3:14: bad");
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"path":"a/b.md","line":3,"column":14,"message":"bad"}"#
        );
    }

    #[test]
    fn round_trips_through_the_error_type() {
        let d = Diagnostic::new("x.md", 1, 1, "no frontmatter");
        let e = Error::from(d.clone());
        assert_eq!(e.to_string(), "x.md:1:1: no frontmatter");
        assert_eq!(Diagnostic::from_error(&e), Some(d));
        assert_eq!(Diagnostic::from_error(&Error::Config("x".into())), None);
    }
}
