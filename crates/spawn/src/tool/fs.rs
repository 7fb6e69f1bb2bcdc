//! Two real, read-only tools over one directory: [`ReadFile`] (`Read`) and [`ListDir`] (`LS`).
//!
//! Both resolve the model's path inside their root and refuse anything that leaves it — a
//! `..` segment, an absolute path elsewhere, or a symlink whose target lies outside — because
//! a model's input is untrusted. The refusal is one sentence,
//! `` path `<p>` is outside the directory this tool may read `` (a path with a `..` segment
//! is refused for that, wherever it leads: `` path `<p>` has a `..` segment, which this tool
//! never follows ``), and the first two are
//! decided from the text of the path alone, before the filesystem is touched, so that a
//! refusal never tells whether something outside the root exists. An absolute path must be spelled under the root's
//! canonical form (symlinks in the root's own path resolved). The rest is followed a segment
//! at a time: a symlink that leads out is refused where it is met, and
//! nothing beyond it is asked about, so `link/x` gets the same answer whether `x` exists out
//! there or not.
//!
//! `Read` also narrows the race between resolving a path and opening it: once the file is
//! open, the path is resolved again and must name the same place, and (on unix) the opened
//! handle must be the same file (device and inode) as the one the path names now. A path that
//! changed in between is refused; this narrows the window but, without `openat2`-style
//! confinement, cannot close it against an adversary who keeps swapping links. `LS` only
//! checks the path before listing.

use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use forkhive_core::{Digest, ToolDefinition};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

use crate::base::state::FileStamp;
use crate::error::{Error, Result};
use crate::tool::{Tool, ToolContext, ToolOutput};

/// The most bytes [`ReadFile`] returns of one file (and the most it reads into memory, plus
/// one byte to tell that there is more).
pub const READ_LIMIT: usize = 256 * 1024;

fn outside(requested: &str) -> String {
    format!("path `{requested}` is outside the directory this tool may read")
}

fn changed(requested: &str) -> String {
    format!("`{requested}` changed while it was being opened; read it again")
}

/// Whether `path`, as written, stays under `root`: no `..`, and an absolute path must start
/// with `root`. Touches nothing on disk.
pub(crate) fn lexically_inside(root: &Path, path: &Path) -> bool {
    if path.is_absolute() {
        path.starts_with(root) && !path.components().any(|c| matches!(c, Component::ParentDir))
    } else {
        path.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    }
}

/// Resolves `requested` inside `root` (canonical), or says why it may not be used.
async fn resolve(root: &Path, requested: &str) -> std::result::Result<PathBuf, String> {
    let path = Path::new(requested);
    // The text first: a refusal must not depend on what exists outside the root.
    if !lexically_inside(root, path) {
        // `sub/../a.txt` stays inside and is refused all the same: said as what it is,
        // from the text alone (no oracle for what exists).
        if path.is_relative() && path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(format!(
                "path `{requested}` has a `..` segment, which this tool never follows (wherever \
                 it leads): name the file without it"
            ));
        }
        return Err(outside(requested));
    }
    // Then the real place, a segment at a time: a symlink inside may point outside.
    let relative = path.strip_prefix(root).unwrap_or(path).to_path_buf();
    match walk_under(root.to_path_buf(), relative).await {
        Ok(real) => Ok(real),
        Err(Walk::Outside) => Err(outside(requested)),
        Err(Walk::Io(e)) => Err(format!("cannot open `{requested}`: {e}")),
    }
}

/// Why [`walk_under`] stopped.
#[derive(Debug)]
pub(crate) enum Walk {
    /// A link led out of the root (or the path had a segment no directory has: a root, a
    /// prefix, `..`).
    Outside,
    /// A segment could not be resolved (it does not exist, a file in the middle, no
    /// permission).
    Io(std::io::Error),
}

/// The most links one walk follows (as Linux's `MAXSYMLINKS`): a loop, or `l/l/l/…` through a
/// link to `.`, ends there.
const MAX_LINKS: u32 = 40;

/// Follows `relative` from `root` (canonical) a segment at a time, in one trip to the blocking
/// pool, reading each link's target itself (`RESOLVE_BENEATH` by hand) rather than letting the
/// system resolve it. A link whose target leaves `root` — absolute elsewhere, or a `..` above
/// `root` — ends the walk where it is met, before the target is asked about: what the caller
/// is told never depends on what exists outside (resolved by the system, `link/x` would be
/// "outside" where `x` exists out there and "not found" where it does not, and a link to a
/// missing file outside would be "not found").
pub(crate) async fn walk_under(
    root: PathBuf,
    relative: PathBuf,
) -> std::result::Result<PathBuf, Walk> {
    let walk = move || {
        use std::ffi::OsString;
        // The segments still to follow, the next one last.
        let mut todo: Vec<OsString> = Vec::new();
        let push = |todo: &mut Vec<OsString>, path: &Path| -> std::result::Result<(), Walk> {
            for part in path.components().rev() {
                match part {
                    Component::Normal(name) => todo.push(name.to_owned()),
                    Component::ParentDir => todo.push(OsString::from("..")),
                    Component::CurDir => {}
                    // A root or a prefix in a path taken as relative: not below `root`.
                    _ => return Err(Walk::Outside),
                }
            }
            Ok(())
        };
        if relative
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(Walk::Outside);
        }
        push(&mut todo, &relative)?;
        let mut at = root.clone();
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == ".." {
                // Only a link's target has these; above `root` is outside.
                if at == root || !at.pop() {
                    return Err(Walk::Outside);
                }
                continue;
            }
            let next = at.join(&name);
            let meta = std::fs::symlink_metadata(&next).map_err(Walk::Io)?;
            if !meta.file_type().is_symlink() {
                at = next;
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Walk::Io(std::io::Error::other(format!(
                    "more than {MAX_LINKS} links on the way"
                ))));
            }
            let target = std::fs::read_link(&next).map_err(Walk::Io)?;
            if target.is_absolute() {
                // Spelled under `root` (canonical) or it leaves: an absolute target is never
                // resolved outside to see whether it comes back.
                let Ok(rest) = target.strip_prefix(&root) else {
                    return Err(Walk::Outside);
                };
                let rest = rest.to_path_buf();
                at = root.clone();
                push(&mut todo, &rest)?;
            } else {
                push(&mut todo, &target)?;
            }
        }
        Ok(at)
    };
    match tokio::task::spawn_blocking(walk).await {
        Ok(walked) => walked,
        Err(e) => Err(Walk::Io(std::io::Error::other(e))),
    }
}

/// Whether two metadata describe the same file (device and inode); `true` where that cannot
/// be told.
#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_a: &std::fs::Metadata, _b: &std::fs::Metadata) -> bool {
    true
}

/// Checks, after opening, that `real` (canonical, inside the root) still resolves to itself
/// and names the file whose handle has metadata `opened`.
async fn check_opened(
    real: &Path,
    opened: &std::fs::Metadata,
    requested: &str,
) -> std::result::Result<(), String> {
    let again = tokio::fs::canonicalize(real)
        .await
        .map_err(|_| changed(requested))?;
    if again != real {
        return Err(changed(requested));
    }
    let now = tokio::fs::metadata(real)
        .await
        .map_err(|_| changed(requested))?;
    if !same_file(opened, &now) {
        return Err(changed(requested));
    }
    Ok(())
}

/// Opens `real` (resolved from `requested`) and reads at most [`READ_LIMIT`]` + 1` bytes of
/// it: the bytes read and the file's length.
async fn read_capped(real: &Path, requested: &str) -> std::result::Result<(Vec<u8>, u64), String> {
    let cannot = |e: std::io::Error| format!("cannot read `{requested}`: {e}");
    let mut opts = tokio::fs::OpenOptions::new();
    opts.read(true);
    // A FIFO opened for reading blocks until a writer comes, and a device may never end: a
    // blocking-pool thread would be lost for good (a timeout cannot reclaim it). Open without
    // blocking, then refuse anything that is not a regular file.
    #[cfg(unix)]
    opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = opts.open(real).await.map_err(cannot)?;
    let meta = file.metadata().await.map_err(cannot)?;
    if !meta.is_file() {
        return Err(format!(
            "cannot read `{requested}`: it is not a regular file ({})",
            crate::base::files::file_kind(&meta)
        ));
    }
    check_opened(real, &meta, requested).await?;
    let wanted = usize::try_from(meta.len()).map_or(READ_LIMIT, |l| l.min(READ_LIMIT));
    let mut bytes = Vec::with_capacity(wanted + 1);
    file.take(READ_LIMIT as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(cannot)?;
    // The file may have grown since its metadata was taken.
    let len = meta.len().max(bytes.len() as u64);
    Ok((bytes, len))
}

pub(crate) fn definition(name: &str, description: &str, schema: &str) -> Result<ToolDefinition> {
    Ok(ToolDefinition::new(name, description, schema)?)
}

pub(crate) async fn canonical_root(root: impl Into<PathBuf>) -> Result<PathBuf> {
    let root = root.into();
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| Error::Io {
            action: "opening tool root directory",
            path,
            source,
        }
    };
    let canonical = tokio::fs::canonicalize(&root).await.map_err(io(&root))?;
    // A file is no root: every path under it would fail later, one call at a time.
    let meta = tokio::fs::metadata(&canonical).await.map_err(io(&root))?;
    if !meta.is_dir() {
        return Err(io(&root)(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    Ok(canonical)
}

/// Reads a UTF-8 text file under a root directory (`Read`).
///
/// Input: `{"path": "<relative path>"}`. At most [`READ_LIMIT`] bytes are read and shown
/// (fewer when the limit falls inside a character), followed by
/// `[truncated: showing N of M bytes]` when the file is longer. Records what it read in the
/// agent's file-read state as a [`FileStamp`] whose `len` is the file's true length and whose
/// `digest` covers the bytes shown — the whole file unless it was truncated.
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
    fn in_background(&self) -> super::InBackground {
        super::InBackground::ByFilter
    }
    async fn rooted(&self, root: &Path) -> Option<std::sync::Arc<dyn Tool>> {
        Some(std::sync::Arc::new(Self::new(root).await.ok()?))
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
        let (bytes, len) = match read_capped(&path, &requested).await {
            Ok(r) => r,
            Err(e) => return ToolOutput::error(e),
        };
        let truncated = bytes.len() > READ_LIMIT;
        let shown = &bytes[..bytes.len().min(READ_LIMIT)];
        let text = match std::str::from_utf8(shown) {
            Ok(t) => t,
            // A cut in the middle of a character is not an encoding error.
            Err(e) if truncated && e.error_len().is_none() => {
                std::str::from_utf8(&shown[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return ToolOutput::error(format!("`{requested}` is not UTF-8 text ({len} bytes)"));
            }
        };
        cx.state().record_read(
            path,
            FileStamp {
                len,
                digest: Digest::of(text.as_bytes()),
            },
        );
        if truncated {
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
    fn in_background(&self) -> super::InBackground {
        super::InBackground::ByFilter
    }
    async fn rooted(&self, root: &Path) -> Option<std::sync::Arc<dyn Tool>> {
        Some(std::sync::Arc::new(Self::new(root).await.ok()?))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::base::context::AgentContext;

    fn cx() -> ToolContext {
        ToolContext::detached(Arc::new(AgentContext::main()), "t")
    }

    /// A root that is missing or a file is refused at construction, with the OS's reason in
    /// the error's chain.
    #[tokio::test]
    async fn a_root_that_is_missing_or_a_file_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = ReadFile::new(&missing).await.unwrap_err();
        assert_eq!(
            forkhive_core::error::chain(&e),
            format!(
                "opening tool root directory {}: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let file = dir.path().join("f.txt");
        std::fs::write(&file, "x").unwrap();
        let e = ListDir::new(&file).await.unwrap_err();
        assert_eq!(
            forkhive_core::error::chain(&e),
            format!(
                "opening tool root directory {}: not a directory",
                file.display()
            )
        );
    }

    async fn read(tool: &ReadFile, cx: &ToolContext, path: &str) -> ToolOutput {
        tool.call(serde_json::json!({ "path": path }), cx).await
    }

    fn refused(path: &str) -> ToolOutput {
        ToolOutput::error(format!(
            "path `{path}` is outside the directory this tool may read"
        ))
    }

    #[tokio::test]
    async fn paths_outside_the_root_get_one_message_whether_or_not_they_exist() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("a.txt"), "inside").unwrap();
        std::fs::write(elsewhere.path().join("secret"), "outside").unwrap();
        let read_tool = ReadFile::new(root.path()).await.unwrap();
        let ls = ListDir::new(root.path()).await.unwrap();
        let cx = cx();
        let existing = elsewhere.path().join("secret").display().to_string();
        let missing = elsewhere.path().join("nope").display().to_string();
        let escaping = format!(
            "{}/../{}/secret",
            root.path().display(),
            elsewhere.path().display()
        );
        for p in [
            existing.as_str(),
            missing.as_str(),
            escaping.as_str(),
            "/etc/hostname",
            "/no/such/file",
            "../secret",
            "sub/../a.txt",
            "..",
        ] {
            // A `..` segment is refused for that, wherever it leads: decided from the text
            // alone too, so existence still shows nowhere.
            let want = if !p.starts_with('/') && p.split('/').any(|c| c == "..") {
                ToolOutput::error(format!(
                    "path `{p}` has a `..` segment, which this tool never follows (wherever it \
                     leads): name the file without it"
                ))
            } else {
                refused(p)
            };
            assert_eq!(read(&read_tool, &cx, p).await, want, "Read {p}");
            let listed = ls.call(serde_json::json!({ "path": p }), &cx).await;
            assert_eq!(listed, want, "LS {p}");
        }
        // Inside, by relative or canonical absolute path, is fine.
        let canonical = read_tool.root.join("a.txt").display().to_string();
        for p in ["a.txt", "./a.txt", canonical.as_str()] {
            assert_eq!(read(&read_tool, &cx, p).await, ToolOutput::text("inside"));
        }
        assert_eq!(
            read(&read_tool, &cx, "gone.txt").await.text_content(),
            "cannot open `gone.txt`: No such file or directory (os error 2)"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlink_pointing_outside_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("secret"), root.path().join("link"))
            .unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("dir")).unwrap();
        std::fs::write(root.path().join("a.txt"), "inside").unwrap();
        std::os::unix::fs::symlink("a.txt", root.path().join("ok")).unwrap();
        let tool = ReadFile::new(root.path()).await.unwrap();
        let ls = ListDir::new(root.path()).await.unwrap();
        let cx = cx();
        assert_eq!(read(&tool, &cx, "link").await, refused("link"));
        assert_eq!(read(&tool, &cx, "dir/secret").await, refused("dir/secret"));
        // Beyond a link that leads out nothing is asked about: a path there that does not
        // exist gets the same answer as one that does, so the tools tell nothing of what
        // exists outside.
        assert_eq!(read(&tool, &cx, "dir/nope").await, refused("dir/nope"));
        // A link's own target outside is not asked about either: one to a missing file gets
        // the same answer as one to a file that exists.
        std::os::unix::fs::symlink(elsewhere.path().join("missing"), root.path().join("gone"))
            .unwrap();
        assert_eq!(read(&tool, &cx, "gone").await, refused("gone"));
        // Nor is a path through the outside that comes back in.
        let back = format!(
            "{}/../{}/a.txt",
            elsewhere.path().display(),
            root.path().display()
        );
        std::os::unix::fs::symlink(&back, root.path().join("round")).unwrap();
        assert_eq!(read(&tool, &cx, "round").await, refused("round"));
        // Links inside are followed through `..` as the system would, and a loop ends.
        std::fs::create_dir(root.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("../a.txt", root.path().join("sub/up")).unwrap();
        assert_eq!(read(&tool, &cx, "sub/up").await, ToolOutput::text("inside"));
        std::os::unix::fs::symlink("loop", root.path().join("loop")).unwrap();
        assert_eq!(
            read(&tool, &cx, "loop").await,
            ToolOutput::error("cannot open `loop`: more than 40 links on the way")
        );
        assert_eq!(
            read(&tool, &cx, "dir/secret/x").await,
            refused("dir/secret/x")
        );
        let listed = ls.call(serde_json::json!({ "path": "dir" }), &cx).await;
        assert_eq!(listed, refused("dir"));
        let listed = ls
            .call(serde_json::json!({ "path": "dir/nope" }), &cx)
            .await;
        assert_eq!(listed, refused("dir/nope"));
        // A symlink that stays inside is followed.
        assert_eq!(read(&tool, &cx, "ok").await, ToolOutput::text("inside"));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_file_swapped_after_opening_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("a"), "a").unwrap();
        std::fs::write(root.path().join("b"), "b").unwrap();
        let a = tokio::fs::canonicalize(root.path().join("a"))
            .await
            .unwrap();
        let b = std::fs::metadata(root.path().join("b")).unwrap();
        let same = std::fs::metadata(&a).unwrap();
        assert_eq!(check_opened(&a, &same, "a").await, Ok(()));
        assert_eq!(
            check_opened(&a, &b, "a").await,
            Err("`a` changed while it was being opened; read it again".to_owned())
        );
        // A path that no longer resolves to itself (here: now a symlink) is refused too.
        std::os::unix::fs::symlink("a", root.path().join("l")).unwrap();
        let l = a.with_file_name("l");
        assert_eq!(
            check_opened(&l, &same, "l").await,
            Err("`l` changed while it was being opened; read it again".to_owned())
        );
    }

    /// A FIFO would block the open until a writer came, a device may never end: both are
    /// refused at once, with what they are, and no blocking-pool thread is lost.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_fifo_a_device_and_a_directory_are_refused_without_blocking() {
        use rustix::fs::{CWD, FileType, Mode, mknodat};
        let root = tempfile::tempdir().unwrap();
        mknodat(
            CWD,
            root.path().join("pipe"),
            FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        let tool = ReadFile::new(root.path()).await.unwrap();
        let cx = cx();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), read(&tool, &cx, "pipe"))
            .await
            .expect("reading a FIFO blocked");
        assert_eq!(
            got,
            ToolOutput::error("cannot read `pipe`: it is not a regular file (a FIFO)")
        );
        assert_eq!(
            read(&tool, &cx, "sub").await,
            ToolOutput::error("cannot read `sub`: it is not a regular file (a directory)")
        );
        // A character device, where a root holds one.
        if std::path::Path::new("/dev/null").exists() {
            let dev = ReadFile::new("/dev").await.unwrap();
            assert_eq!(
                read(&dev, &cx, "null").await,
                ToolOutput::error(
                    "cannot read `null`: it is not a regular file (a character device)"
                )
            );
        }
    }

    #[tokio::test]
    async fn a_large_file_is_read_up_to_the_limit_and_names_its_true_size() {
        let root = tempfile::tempdir().unwrap();
        let big = "a".repeat(READ_LIMIT + 10);
        std::fs::write(root.path().join("big"), &big).unwrap();
        // The limit falls inside a two-byte character: the cut moves back before it.
        let mut mid = "a".repeat(READ_LIMIT - 1);
        mid.push_str("éé");
        std::fs::write(root.path().join("mid"), &mid).unwrap();
        let tool = ReadFile::new(root.path()).await.unwrap();
        let cx = cx();

        let got = read(&tool, &cx, "big").await;
        let shown = &big[..READ_LIMIT];
        assert_eq!(
            got,
            ToolOutput::text(format!(
                "{shown}\n[truncated: showing {READ_LIMIT} of {} bytes]",
                READ_LIMIT + 10
            ))
        );
        let stamp = cx.state().last_read(&tool.root.join("big")).unwrap();
        assert_eq!(stamp.len, (READ_LIMIT + 10) as u64);
        assert_eq!(stamp.digest, Digest::of(shown.as_bytes()));

        let got = read(&tool, &cx, "mid").await;
        let shown = &mid[..READ_LIMIT - 1];
        assert_eq!(
            got,
            ToolOutput::text(format!(
                "{shown}\n[truncated: showing {} of {} bytes]",
                READ_LIMIT - 1,
                READ_LIMIT + 3
            ))
        );

        // A whole file is stamped with the digest of all of it.
        std::fs::write(root.path().join("small"), "hi").unwrap();
        assert_eq!(read(&tool, &cx, "small").await, ToolOutput::text("hi"));
        let stamp = cx.state().last_read(&tool.root.join("small")).unwrap();
        assert_eq!(stamp, FileStamp::of(b"hi"));
    }

    #[tokio::test]
    async fn a_file_that_is_not_utf8_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("bin"), [b'a', 0xff, b'b']).unwrap();
        let tool = ReadFile::new(root.path()).await.unwrap();
        assert_eq!(
            read(&tool, &cx(), "bin").await,
            ToolOutput::error("`bin` is not UTF-8 text (3 bytes)")
        );
    }
}
