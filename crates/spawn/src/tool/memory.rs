//! An agent's persistent memory ("Chapter 9: Sub-Agents and the Fork Pattern — 9.2": with
//! `memory` set "the system also automatically injects file read/write tools to support
//! persistent memory", and the memory is injected into the agent's context).
//!
//! A definition's `memory: user | project | local` names a directory per agent type, laid out
//! as Claude Code lays it out:
//!
//! | scope | directory |
//! | --- | --- |
//! | `user` | `<user dir>/agent-memory/<agent type>/` (`~/.claude`) |
//! | `project` | `<project>/.claude/agent-memory/<agent type>/` |
//! | `local` | `<project>/.claude/agent-memory-local/<agent type>/` |
//!
//! The host says where the user directory and the project are ([`MemoryRoots`], put in the
//! tree with `AgentBuilder::extension`). The agent gets [`MemoryRead`] and [`MemoryWrite`],
//! confined to its directory like `Read` (no `..`, no absolute path elsewhere, no symlink out),
//! and the first [`INDEX_LINES`] lines of its `MEMORY.md` in its first message. Two agents of
//! the same type and scope share the directory.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use forkhive_core::ToolDefinition;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::tool::fs::{Walk, canonical_root, definition, lexically_inside, walk_under};
use crate::tool::{Tool, ToolContext, ToolOutput};

/// The memory's index file.
pub const INDEX: &str = "MEMORY.md";

/// How many lines of the index go into the agent's first message.
pub const INDEX_LINES: usize = 200;

/// The most bytes one memory file may hold.
pub const FILE_LIMIT: usize = 256 * 1024;

/// Where the memory scopes live: the user's directory (Claude Code's `~/.claude`) and the
/// project's root. A scope whose root is not set cannot be used (the agent is built without
/// memory, with a warning).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryRoots {
    /// The user's directory (`~/.claude`), for `memory: user`.
    pub user: Option<PathBuf>,
    /// The project's root, for `memory: project` and `memory: local`.
    pub project: Option<PathBuf>,
}

impl MemoryRoots {
    /// Roots for `user` and `project`.
    pub fn new(user: Option<PathBuf>, project: Option<PathBuf>) -> Self {
        Self { user, project }
    }

    /// The directory of `agent_type`'s memory in `scope`, or why there is none.
    pub fn dir(&self, scope: &str, agent_type: &str) -> std::result::Result<PathBuf, String> {
        self.locate(scope, agent_type).map(|(_, dir)| dir)
    }

    /// The scope's root (the user directory or the project) and the memory directory under
    /// it.
    pub fn locate(
        &self,
        scope: &str,
        agent_type: &str,
    ) -> std::result::Result<(PathBuf, PathBuf), String> {
        let dir = self.dir_of(scope, agent_type)?;
        let base = match scope {
            "user" => self.user.clone(),
            _ => self.project.clone(),
        }
        .ok_or_else(|| format!("`memory: {scope}` has no root"))?;
        Ok((base, dir))
    }

    fn dir_of(&self, scope: &str, agent_type: &str) -> std::result::Result<PathBuf, String> {
        let safe = !agent_type.is_empty()
            && agent_type
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !agent_type.starts_with('.');
        if !safe {
            return Err(format!(
                "agent type `{agent_type}` cannot name a memory directory"
            ));
        }
        let missing = |what: &str| {
            format!("`memory: {scope}` needs the {what} (MemoryRoots), which this host did not set")
        };
        match scope {
            "user" => self
                .user
                .as_ref()
                .map(|u| u.join("agent-memory").join(agent_type))
                .ok_or_else(|| missing("user directory")),
            "project" => self
                .project
                .as_ref()
                .map(|p| p.join(".claude").join("agent-memory").join(agent_type))
                .ok_or_else(|| missing("project directory")),
            "local" => self
                .project
                .as_ref()
                .map(|p| {
                    p.join(".claude")
                        .join("agent-memory-local")
                        .join(agent_type)
                })
                .ok_or_else(|| missing("project directory")),
            other => Err(not_a_scope(other)),
        }
    }
}

/// Whether `scope` is a memory scope (`user`, `project`, `local`): `Err` says it is not.
pub(crate) fn check_scope(scope: &str) -> std::result::Result<(), String> {
    match scope {
        "user" | "project" | "local" => Ok(()),
        other => Err(not_a_scope(other)),
    }
}

fn not_a_scope(scope: &str) -> String {
    format!("`memory: {scope}` is not a scope; use user, project or local")
}

/// An agent's memory: its directory (made if missing) and its tools.
#[derive(Debug, Clone)]
pub struct Memory {
    dir: PathBuf,
}

impl Memory {
    /// The memory in `dir`, made if it does not exist, which must lie under `base` (the
    /// scope's root: the user directory or the project) with no symlink on the way — a
    /// repository that commits `.claude/agent-memory/x -> ~/.ssh` does not get a memory there.
    pub async fn open(base: &Path, dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        let refuse = |why: String| Error::Io {
            action: "opening the memory directory",
            path: dir.clone(),
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, why),
        };
        let below = dir
            .strip_prefix(base)
            .map_err(|_| refuse(format!("it is not under {}", base.display())))?;
        // No symlink between the base and the directory, before anything is made.
        let mut at = base.to_path_buf();
        for part in below.components() {
            at.push(part);
            match tokio::fs::symlink_metadata(&at).await {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refuse(format!(
                        "{} is a symlink; a memory directory is a real directory",
                        at.display()
                    )));
                }
                _ => {}
            }
        }
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| Error::Io {
                action: "making the memory directory",
                path: dir.clone(),
                source,
            })?;
        let real = canonical_root(&dir).await?;
        let real_base = canonical_root(base).await?;
        if !real.starts_with(&real_base) {
            return Err(refuse(format!("it resolves outside {}", base.display())));
        }
        Ok(Self { dir: real })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The first [`INDEX_LINES`] lines of its `MEMORY.md`, for the agent's first message
    /// (`None` when there is none yet, or when it is not a regular file it can read).
    pub async fn index(&self) -> Option<String> {
        match self.read_index().await {
            IndexFile::Text(text) => Some(text),
            IndexFile::Missing | IndexFile::Unread(_) => None,
        }
    }

    async fn read_index(&self) -> IndexFile {
        use tokio::io::AsyncReadExt as _;
        let path = self.dir.join(INDEX);
        // A regular file, not a link (to the process's environment, say), read up to the
        // limit of a memory file.
        let meta = match tokio::fs::symlink_metadata(&path).await {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return IndexFile::Missing,
            Err(e) => return IndexFile::Unread(format!("could not be read ({e})")),
        };
        if !meta.is_file() {
            let kind = if meta.file_type().is_symlink() {
                "a symlink"
            } else if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return IndexFile::Unread(format!("is {kind}"));
        }
        let mut bytes = Vec::new();
        let read = match tokio::fs::File::open(&path).await {
            Ok(file) => file.take(FILE_LIMIT as u64).read_to_end(&mut bytes).await,
            Err(e) => Err(e),
        };
        if let Err(e) = read {
            return IndexFile::Unread(format!("could not be read ({e})"));
        }
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().take(INDEX_LINES).collect();
        IndexFile::Text(lines.join("\n"))
    }

    /// What goes into the agent's first message: where its memory is and its index.
    pub async fn context(&self) -> String {
        let index = match self.read_index().await {
            IndexFile::Text(text) => text,
            IndexFile::Missing => {
                format!("(empty: no {INDEX} yet — write one to remember what matters)")
            }
            // Not "empty": an agent told so writes a new index, which MemoryWrite refuses
            // over a link or a directory, and it would not know why.
            IndexFile::Unread(why) => format!(
                "(not shown: {INDEX} {why}; only a regular file is shown here, and MemoryWrite \
                 replaces nothing else)"
            ),
        };
        format!(
            "<agent-memory dir=\"{}\">Your persistent memory, kept between runs and shared \
             with every agent of your type: read it with MemoryRead and keep it with \
             MemoryWrite (paths relative to it; {INDEX} is its index, of which this is the \
             start).\n{}</agent-memory>",
            self.dir.display(),
            escape_text(&index)
        )
    }

    /// Its two tools.
    pub fn tools(&self) -> Result<[std::sync::Arc<dyn Tool>; 2]> {
        Ok([
            std::sync::Arc::new(MemoryRead::new(self.dir.clone())?),
            std::sync::Arc::new(MemoryWrite::new(self.dir.clone())?),
        ])
    }
}

/// What reading `MEMORY.md` found.
enum IndexFile {
    Text(String),
    Missing,
    /// It is there but was not read: why, as "is a symlink" or "could not be read (…)".
    Unread(String),
}

/// Memory text as the next agent of the type reads it: the library's envelope tags defanged
/// (agents write their memory, perhaps from hostile text they read, and the index reaches
/// every later agent of the type as the text of its first user message — where an envelope
/// left in it (`<task-notification>`, `<message from=…>`) would be taken for one the library
/// delivered, by the model and by `find_notifications`: "Coordinator Mode", gotchas:
/// `<task-notification>` injection from worker stdout), and unable to close the element it is
/// put in. Nothing else changes: the code in it stays as written, and an agent that copies
/// its index back into `MEMORY.md` does not write entities that compound run after run.
fn escape_text(s: &str) -> String {
    forkhive_core::notification::defang(s).replace("</agent-memory", "&lt;/agent-memory")
}

/// A name no other temporary file of this process has.
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn outside(requested: &str) -> String {
    format!("path `{requested}` is outside your memory directory")
}

/// Why a path refused from its text alone is refused: a relative one with a `..` segment for
/// that (wherever it leads, as `Read` says it), any other as outside.
fn refused_as_written(requested: &str) -> String {
    let path = Path::new(requested);
    if path.is_relative()
        && path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return format!(
            "path `{requested}` has a `..` segment, which your memory tools never follow \
             (wherever it leads): name the file without it"
        );
    }
    outside(requested)
}

/// Resolves `requested` for writing: lexically inside, its parent (made if missing) really
/// inside, and not a symlink.
async fn writable(root: &Path, requested: &str) -> std::result::Result<PathBuf, String> {
    let path = Path::new(requested);
    if requested.is_empty() || !lexically_inside(root, path) {
        return Err(refused_as_written(requested));
    }
    let target = root.join(path);
    let parent = target.parent().ok_or_else(|| outside(requested))?;
    // No symlink on the way, before anything is made (a link inside could point out).
    let mut at = root.to_path_buf();
    if let Ok(below) = parent.strip_prefix(root) {
        for part in below.components() {
            at.push(part);
            match tokio::fs::symlink_metadata(&at).await {
                Ok(m) if m.file_type().is_symlink() => return Err(outside(requested)),
                Ok(m) if !m.is_dir() => {
                    return Err(format!(
                        "`{requested}`: {} is not a directory",
                        at.display()
                    ));
                }
                _ => {}
            }
        }
    }
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| format!("cannot make the directory of `{requested}`: {e}"))?;
    let real_parent = tokio::fs::canonicalize(parent)
        .await
        .map_err(|e| format!("cannot open the directory of `{requested}`: {e}"))?;
    if !real_parent.starts_with(root) {
        return Err(outside(requested));
    }
    let name = target.file_name().ok_or_else(|| outside(requested))?;
    let real = real_parent.join(name);
    if let Ok(meta) = tokio::fs::symlink_metadata(&real).await
        && !meta.is_file()
    {
        return Err(format!("`{requested}` is not a regular file"));
    }
    Ok(real)
}

/// Reads a file of the agent's memory (`MemoryRead`): `{"path": "MEMORY.md"}`; a directory
/// (`.`) is listed.
#[derive(Debug, Clone)]
pub struct MemoryRead {
    root: PathBuf,
    definition: ToolDefinition,
}

impl MemoryRead {
    fn new(root: PathBuf) -> Result<Self> {
        Ok(Self {
            root,
            definition: definition(
                "MemoryRead",
                "Read a file of your persistent memory, or list it with `.`; paths are relative to it.",
                r#"{"type":"object","properties":{"path":{"type":"string","description":"A file of your memory, or . to list it"}},"required":["path"],"additionalProperties":false}"#,
            )?,
        })
    }
}

#[derive(Deserialize)]
struct ReadInput {
    path: String,
}

#[async_trait]
impl Tool for MemoryRead {
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
        let Ok(ReadInput { path }) = serde_json::from_value(input) else {
            return ToolOutput::error("MemoryRead needs a `path`");
        };
        if !lexically_inside(&self.root, Path::new(&path)) {
            return ToolOutput::error(refused_as_written(&path));
        }
        // A segment at a time: a link that leads out is refused where it is met, so the
        // answer never tells whether something outside exists.
        let relative = Path::new(&path);
        let relative = relative.strip_prefix(&self.root).unwrap_or(relative);
        let real = match walk_under(self.root.clone(), relative.to_path_buf()).await {
            Ok(r) => r,
            Err(Walk::Outside) => return ToolOutput::error(outside(&path)),
            Err(Walk::Io(_)) => {
                return ToolOutput::error(format!("`{path}` is not in your memory"));
            }
        };
        match tokio::fs::metadata(&real).await {
            Ok(m) if m.is_dir() => {
                let mut names = Vec::new();
                if let Ok(mut dir) = tokio::fs::read_dir(&real).await {
                    while let Ok(Some(e)) = dir.next_entry().await {
                        names.push(e.file_name().to_string_lossy().into_owned());
                    }
                }
                names.sort();
                ToolOutput::text(if names.is_empty() {
                    "(your memory is empty)".to_owned()
                } else {
                    names.join("\n")
                })
            }
            Ok(m) if m.len() as usize > FILE_LIMIT => ToolOutput::error(format!(
                "`{path}` is {} bytes, over the {FILE_LIMIT}-byte limit of a memory file",
                m.len()
            )),
            Ok(_) => match tokio::fs::read_to_string(&real).await {
                Ok(text) => ToolOutput::text(text),
                Err(e) => ToolOutput::error(format!("cannot read `{path}`: {e}")),
            },
            Err(e) => ToolOutput::error(format!("cannot read `{path}`: {e}")),
        }
    }
}

/// Writes a file of the agent's memory whole (`MemoryWrite`): `{"path": "MEMORY.md",
/// "content": "…"}` — a temporary file renamed over it, so a reader never sees half.
#[derive(Debug, Clone)]
pub struct MemoryWrite {
    root: PathBuf,
    definition: ToolDefinition,
}

impl MemoryWrite {
    fn new(root: PathBuf) -> Result<Self> {
        Ok(Self {
            root,
            definition: definition(
                "MemoryWrite",
                "Write a file of your persistent memory, whole; paths are relative to it. Keep MEMORY.md as its index.",
                r#"{"type":"object","properties":{"path":{"type":"string","description":"A file of your memory"},"content":{"type":"string","description":"Its new content"}},"required":["path","content"],"additionalProperties":false}"#,
            )?,
        })
    }
}

#[derive(Deserialize)]
struct WriteInput {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for MemoryWrite {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        false
    }
    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        let Ok(WriteInput { path, content }) = serde_json::from_value(input) else {
            return ToolOutput::error("MemoryWrite needs a `path` and a `content`");
        };
        if content.len() > FILE_LIMIT {
            return ToolOutput::error(format!(
                "{} bytes is over the {FILE_LIMIT}-byte limit of a memory file",
                content.len()
            ));
        }
        let real = match writable(&self.root, &path).await {
            Ok(r) => r,
            Err(e) => return ToolOutput::error(e),
        };
        let tmp = real.with_extension(format!("tmp-{}", unique()));
        let written = async {
            use tokio::io::AsyncWriteExt as _;
            // A new file, never one already there (a link planted at the name).
            let mut f = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .await?;
            f.write_all(content.as_bytes()).await?;
            f.flush().await?;
            drop(f);
            tokio::fs::rename(&tmp, &real).await
        }
        .await;
        match written {
            Ok(()) => ToolOutput::text(format!("Kept `{path}` ({} bytes).", content.len())),
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                ToolOutput::error(format!("cannot write `{path}`: {e}"))
            }
        }
    }
}
