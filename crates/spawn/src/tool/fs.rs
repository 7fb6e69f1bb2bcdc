//! Two real, read-only tools over one directory: [`ReadFile`] (`Read`) and [`ListDir`] (`LS`).
//!
//! Both resolve the model's path inside their root and refuse anything that leaves it — a
//! `..` segment, an absolute path elsewhere, or a symlink whose target lies outside — because
//! a model's input is untrusted.

use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use forkhive_core::ToolDefinition;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::runtime::state::FileStamp;
use crate::tool::{Tool, ToolContext, ToolOutput};

/// The most bytes [`ReadFile`] returns of one file.
pub const READ_LIMIT: usize = 256 * 1024;

/// Resolves `requested` inside `root` (canonical), or says why it may not be used.
async fn resolve(root: &Path, requested: &str) -> std::result::Result<PathBuf, String> {
    let rel = Path::new(requested);
    let joined = if rel.is_absolute() {
        rel.to_path_buf()
    } else {
        if rel.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(format!(
                "path `{requested}` contains `..`; give a path inside the directory"
            ));
        }
        root.join(rel)
    };
    let real = tokio::fs::canonicalize(&joined)
        .await
        .map_err(|e| format!("cannot open `{requested}`: {e}"))?;
    if !real.starts_with(root) {
        return Err(format!(
            "path `{requested}` is outside the directory this tool may read"
        ));
    }
    Ok(real)
}

fn definition(name: &str, description: &str, schema: &str) -> Result<ToolDefinition> {
    Ok(ToolDefinition::new(name, description, schema)?)
}

async fn canonical_root(root: impl Into<PathBuf>) -> Result<PathBuf> {
    let root = root.into();
    tokio::fs::canonicalize(&root)
        .await
        .map_err(|source| Error::Io {
            action: "opening tool root directory",
            path: root,
            source,
        })
}

/// Reads a UTF-8 text file under a root directory (`Read`).
///
/// Input: `{"path": "<relative path>"}`. Records what it read in the agent's file-read state.
#[derive(Debug, Clone)]
pub struct ReadFile {
    root: PathBuf,
    definition: ToolDefinition,
}

#[derive(Deserialize)]
struct PathInput {
    path: Option<String>,
}

impl ReadFile {
    /// A `Read` tool confined to `root` (which must exist).
    pub async fn new(root: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self {
            root: canonical_root(root).await?,
            definition: definition(
                "Read",
                "Read a UTF-8 text file. `path` is relative to the working directory.",
                r#"{"type":"object","properties":{"path":{"type":"string","description":"The file to read"}},"required":["path"],"additionalProperties":false}"#,
            )?,
        })
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        let requested = match serde_json::from_value::<PathInput>(input) {
            Ok(PathInput { path: Some(p) }) => p,
            _ => return ToolOutput::error("`path` must be a string"),
        };
        let path = match resolve(&self.root, &requested).await {
            Ok(p) => p,
            Err(e) => return ToolOutput::error(e),
        };
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => return ToolOutput::error(format!("cannot read `{requested}`: {e}")),
        };
        let len = bytes.len();
        let shown = &bytes[..len.min(READ_LIMIT)];
        let text = match std::str::from_utf8(shown) {
            Ok(t) => t,
            // A cut in the middle of a character is not an encoding error.
            Err(e) if len > READ_LIMIT && e.error_len().is_none() => {
                std::str::from_utf8(&shown[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return ToolOutput::error(format!("`{requested}` is not UTF-8 text ({len} bytes)"));
            }
        };
        cx.state().record_read(path, FileStamp::of(&bytes));
        if len > READ_LIMIT {
            ToolOutput::text(format!(
                "{text}\n[truncated: showing {} of {len} bytes]",
                text.len()
            ))
        } else {
            ToolOutput::text(text)
        }
    }
}

/// Lists a directory under a root directory (`LS`).
///
/// Input: `{"path": "<relative path>"}` (default: the root). Entries are sorted; directories
/// end with `/`.
#[derive(Debug, Clone)]
pub struct ListDir {
    root: PathBuf,
    definition: ToolDefinition,
}

impl ListDir {
    /// An `LS` tool confined to `root` (which must exist).
    pub async fn new(root: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self {
            root: canonical_root(root).await?,
            definition: definition(
                "LS",
                "List a directory. `path` is relative to the working directory (default: it).",
                r#"{"type":"object","properties":{"path":{"type":"string","description":"The directory to list"}},"additionalProperties":false}"#,
            )?,
        })
    }
}

#[async_trait]
impl Tool for ListDir {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        let requested = match serde_json::from_value::<PathInput>(input) {
            Ok(PathInput { path }) => path.unwrap_or_else(|| ".".to_owned()),
            Err(_) => return ToolOutput::error("`path` must be a string"),
        };
        let dir = match resolve(&self.root, &requested).await {
            Ok(p) => p,
            Err(e) => return ToolOutput::error(e),
        };
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(e) => e,
            Err(e) => return ToolOutput::error(format!("cannot list `{requested}`: {e}")),
        };
        let mut names = Vec::new();
        loop {
            match entries.next_entry().await {
                Ok(Some(entry)) => {
                    let mut name = entry.file_name().to_string_lossy().into_owned();
                    if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                        name.push('/');
                    }
                    names.push(name);
                }
                Ok(None) => break,
                Err(e) => return ToolOutput::error(format!("cannot list `{requested}`: {e}")),
            }
        }
        names.sort();
        if names.is_empty() {
            ToolOutput::text(format!("`{requested}` is empty"))
        } else {
            ToolOutput::text(names.join("\n"))
        }
    }
}
