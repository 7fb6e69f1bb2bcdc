//! Reading agent files from disk: one file, a directory tree, or several sources at once.

use std::io;
use std::path::{Path, PathBuf};

use super::DefinitionSource;
use super::builtin::builtin_definitions;
use super::diagnostic::{Diagnostic, FileReport, FileStatus, LoadReport};
use super::parse::{ParsedDefinition, parse_agent_markdown};
use super::registry::AgentRegistry;
use crate::error::{Error, Result};

/// The largest agent or skill file read, in bytes: the longest of 354 files people wrote for
/// Claude Code is under 90 KB. A larger one is refused after this much is read, never read
/// whole (a `.md` that is not a regular file — a FIFO, a device — is not opened at all).
pub const MAX_DEFINITION_FILE: u64 = 1024 * 1024;

/// `path`'s bytes, at most [`MAX_DEFINITION_FILE`] of them: a longer file is an error.
pub(crate) fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_DEFINITION_FILE + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_DEFINITION_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "it is larger than {} KiB, the most a definition may be",
                MAX_DEFINITION_FILE / 1024
            ),
        ));
    }
    Ok(bytes)
}

/// Reads and parses one agent file.
///
/// # Errors
///
/// [`Error::Io`] when the file cannot be read or is larger than [`MAX_DEFINITION_FILE`];
/// [`Error::Definition`] when it is not UTF-8 or [`parse_agent_markdown`] rejects it.
pub fn load_file(path: &Path, source: DefinitionSource) -> Result<ParsedDefinition> {
    let bytes = read_capped(path).map_err(|e| Error::Io {
        action: "reading agent file",
        path: path.to_path_buf(),
        source: e,
    })?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
            let line_start = valid.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&valid[line_start..])
                .chars()
                .count()
                + 1;
            let byte = e.as_bytes().get(valid.len()).copied().unwrap_or(0);
            return Err(Diagnostic::new(
                path,
                line,
                column,
                format!("the file is not valid UTF-8 (byte 0x{byte:02X}); save it as UTF-8"),
            )
            .into());
        }
    };
    parse_agent_markdown(path, &text, source)
}

/// Loads every `*.md` file under `dir`, recursively, as definitions from `source`.
///
/// Files are read in sorted path order, so the report is the same on every run. Each file
/// appears once in [`LoadReport::files`]: loaded, recovered (with warnings) or rejected (with
/// one error). A subdirectory that cannot be read is an error in the report; a symbolic link
/// to a directory is not followed (a warning says so).
///
/// # Errors
///
/// [`Error::Io`] only when `dir` itself cannot be read (it does not exist, is not a
/// directory, or is not readable). A bad file never makes this fail.
pub fn load_dir(dir: &Path, source: DefinitionSource) -> Result<LoadReport> {
    let io_error = |e: io::Error| Error::Io {
        action: "reading agent directory",
        path: dir.to_path_buf(),
        source: e,
    };
    let meta = std::fs::metadata(dir).map_err(io_error)?;
    if !meta.is_dir() {
        return Err(io_error(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    let mut report = LoadReport::new();
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(io_error)?;
    walk(dir, entries, &mut files, &mut report);
    files.sort();
    for (path, regular) in files {
        if !regular {
            report.errors.push(not_regular(&path));
            report.files.push(FileReport {
                path,
                source,
                status: FileStatus::Rejected,
            });
            continue;
        }
        let status = match load_file(&path, source) {
            Ok(parsed) => {
                let status = if parsed.warnings.is_empty() {
                    FileStatus::Loaded
                } else {
                    FileStatus::Recovered
                };
                report.warnings.extend(parsed.warnings);
                report.definitions.push(parsed.definition);
                status
            }
            Err(e) => {
                let diagnostic = Diagnostic::from_error(&e)
                    .unwrap_or_else(|| Diagnostic::new(path.clone(), 1, 1, e.to_string()));
                report.errors.push(diagnostic);
                FileStatus::Rejected
            }
        };
        report.files.push(FileReport {
            path,
            source,
            status,
        });
    }
    Ok(report)
}

/// The refusal of a `.md` entry that is not a regular file (a FIFO, a device, a socket).
fn not_regular(path: &Path) -> Diagnostic {
    Diagnostic::new(
        path,
        1,
        1,
        "not a regular file (a FIFO, a device or a socket), so it was not read; an agent \
         definition is a Markdown file",
    )
}

/// Collects the `.md` files under `dir`, each with whether it is a regular file (one that is
/// not is rejected without being opened).
fn walk(
    dir: &Path,
    entries: std::fs::ReadDir,
    files: &mut Vec<(PathBuf, bool)>,
    report: &mut LoadReport,
) {
    let mut subdirs = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                report.errors.push(Diagnostic::new(
                    dir,
                    1,
                    1,
                    format!("reading directory failed: {e}"),
                ));
                continue;
            }
        };
        let path = entry.path();
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) => {
                report.errors.push(Diagnostic::new(
                    &path,
                    1,
                    1,
                    format!("reading its type failed: {e}"),
                ));
                continue;
            }
        };
        if file_type.is_dir() {
            subdirs.push(path);
        } else if file_type.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => report.warnings.push(Diagnostic::new(
                    &path,
                    1,
                    1,
                    "symbolic link to a directory: not followed; link the files, or pass the \
                     target directory itself",
                )),
                Ok(meta) if meta.is_file() && is_markdown(&path) => files.push((path, true)),
                // A `.md` link to a device or a FIFO is never opened (a read could block for
                // ever, or never end): rejected, saying so.
                Ok(_) if is_markdown(&path) => files.push((path, false)),
                // A dangling `.md` link is a definition file that cannot be read: it is listed
                // as rejected (reading it fails and says why), never passed over in silence.
                Err(_) if is_markdown(&path) => files.push((path, true)),
                _ => {}
            }
        } else if is_markdown(&path) {
            files.push((path, file_type.is_file()));
        }
    }
    subdirs.sort();
    for sub in subdirs {
        match std::fs::read_dir(&sub) {
            Ok(entries) => walk(&sub, entries, files, report),
            Err(e) => report.errors.push(Diagnostic::new(
                &sub,
                1,
                1,
                format!("reading directory failed: {e}"),
            )),
        }
    }
}

fn is_markdown(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == "md")
}

/// Loads agent directories from several sources and merges them with the built-ins.
///
/// ```no_run
/// use forkhive_spawn::definition::{AgentLoader, DefinitionSource};
///
/// let registry = AgentLoader::new()
///     .dir(DefinitionSource::User, "/home/me/.claude/agents")
///     .dir(DefinitionSource::Project, ".claude/agents")
///     .load()?;
/// for warning in registry.warnings() {
///     eprintln!("warning: {warning}");
/// }
/// # Ok::<(), forkhive_spawn::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AgentLoader {
    dirs: Vec<(DefinitionSource, PathBuf)>,
    builtins: bool,
}

impl Default for AgentLoader {
    fn default() -> Self {
        AgentLoader::new()
    }
}

impl AgentLoader {
    /// A loader with the built-in agents and no directories.
    pub fn new() -> Self {
        AgentLoader {
            dirs: Vec::new(),
            builtins: true,
        }
    }

    /// Adds a directory of agent files (scanned recursively) for `source`. The order
    /// directories are added in does not decide priority; see [`AgentRegistry`].
    #[must_use]
    pub fn dir(mut self, source: DefinitionSource, path: impl Into<PathBuf>) -> Self {
        self.dirs.push((source, path.into()));
        self
    }

    /// Leaves the built-in agents out of the registry.
    #[must_use]
    pub fn without_builtins(mut self) -> Self {
        self.builtins = false;
        self
    }

    /// Loads every directory, in the order they were added, into one report.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when a directory cannot be read at all (see [`load_dir`]).
    pub fn report(&self) -> Result<LoadReport> {
        let mut report = LoadReport::new();
        for (source, dir) in &self.dirs {
            report.extend(load_dir(dir, *source)?);
        }
        Ok(report)
    }

    /// Loads every directory and merges the definitions, with the built-ins unless
    /// [`without_builtins`](Self::without_builtins) was called, into a registry that also
    /// holds every warning and error.
    ///
    /// # Errors
    ///
    /// As [`report`](Self::report).
    pub fn load(&self) -> Result<AgentRegistry> {
        let report = self.report()?;
        let builtins = if self.builtins {
            builtin_definitions()
        } else {
            Vec::new()
        };
        Ok(AgentRegistry::from_parts(builtins, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &[u8]) {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, text).unwrap();
    }

    /// A `.md` FIFO, or a `.md` link to a device, is refused with a diagnostic, never opened
    /// (a read would block for ever, or never end) and never passed over in silence.
    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_link_to_a_device_is_refused_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "ok.md", b"---\nname: ok\ndescription: fine\n---\n");
        std::os::unix::fs::symlink("/dev/zero", d.join("zero.md")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("fifo.md"))
            .status()
            .is_ok_and(|s| s.success());
        let report = load_dir(d, DefinitionSource::Project).unwrap();
        let mut refused: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        refused.sort();
        let said = |name: &str| {
            format!(
                "{}:1:1: not a regular file (a FIFO, a device or a socket), so it was not read; \
                 an agent definition is a Markdown file",
                d.join(name).display()
            )
        };
        let mut want = vec![said("zero.md")];
        if made {
            want.insert(0, said("fifo.md"));
        }
        assert_eq!(refused, want);
        assert_eq!(report.definitions.len(), 1);
        // Each is a rejected file of the report, as any file that cannot load is.
        assert_eq!(report.count(FileStatus::Rejected), want.len());
        assert_eq!(report.files.len(), want.len() + 1);
    }

    #[test]
    fn walks_recursively_in_sorted_order_and_accounts_for_every_file() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "b.md", b"---\nname: b\ndescription: B\n---\n");
        write(d, "a/z.md", b"---\nname: z\ndescription: Z: z\n---\n");
        write(d, "a/notes.txt", b"not markdown");
        write(d, "c.md", b"# no frontmatter\n");
        write(d, "bad-utf8.md", b"---\nname: x\xff\n---\n");
        let report = load_dir(d, DefinitionSource::User).unwrap();
        let files: Vec<(String, FileStatus)> = report
            .files
            .iter()
            .map(|f| {
                (
                    f.path.strip_prefix(d).unwrap().display().to_string(),
                    f.status,
                )
            })
            .collect();
        assert_eq!(
            files,
            [
                ("a/z.md".to_owned(), FileStatus::Recovered),
                ("b.md".to_owned(), FileStatus::Loaded),
                ("bad-utf8.md".to_owned(), FileStatus::Rejected),
                ("c.md".to_owned(), FileStatus::Rejected),
            ]
        );
        assert_eq!(report.definitions.len(), 2);
        assert_eq!(report.warnings.len(), 1);
        assert_eq!(report.errors.len(), 2);
        assert_eq!(
            report.errors[0].to_string(),
            format!(
                "{}:2:8: the file is not valid UTF-8 (byte 0xFF); save it as UTF-8",
                d.join("bad-utf8.md").display()
            )
        );
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let err = load_dir(&missing, DefinitionSource::Project).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("reading agent directory {}", missing.display())
        );
        let file = tmp.path().join("f.md");
        std::fs::write(&file, "x").unwrap();
        assert!(load_dir(&file, DefinitionSource::Project).is_err());
    }

    #[test]
    fn loader_merges_with_builtins() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "x.md",
            b"---\nname: Explore\ndescription: mine\n---\n",
        );
        let registry = AgentLoader::new()
            .dir(DefinitionSource::User, tmp.path())
            .load()
            .unwrap();
        assert_eq!(registry.get("Explore").unwrap().description, "mine");
        assert_eq!(registry.shadowed().len(), 1);
        let bare = AgentLoader::new()
            .without_builtins()
            .dir(DefinitionSource::User, tmp.path())
            .load()
            .unwrap();
        assert_eq!(bare.len(), 1);
    }
}
