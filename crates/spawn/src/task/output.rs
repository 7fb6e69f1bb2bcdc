//! Task output files: `<root>/<session>/tasks/<task-id>.output`.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — File-Based IPC": the file
//! is opened with `O_NOFOLLOW`, so a symlink planted at a predictable task path (pointing at
//! `~/.ssh/authorized_keys`, say) fails instead of being written through; and its size is
//! capped, because a runaway worker can fill a disk in minutes. We also create it with
//! `O_EXCL` and mode 0600, and refuse a `tasks` directory that is a symlink.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use forkhive_core::TaskId;

use crate::error::{Error, Result};

/// The default cap: 5 GiB, as the shipped CLI uses.
pub const DEFAULT_OUTPUT_CAP: u64 = 5 * 1024 * 1024 * 1024;

/// Where output files go and how large they may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputConfig {
    /// The root directory (it must exist).
    pub root: PathBuf,
    /// The session's directory name under the root: `[A-Za-z0-9_-]`, 1 to 128 characters.
    pub session: String,
    /// The most bytes one file may hold before the truncation marker.
    pub cap: u64,
}

impl OutputConfig {
    /// Files under `<root>/<session>/tasks/`, capped at [`DEFAULT_OUTPUT_CAP`].
    pub fn new(root: impl Into<PathBuf>, session: impl Into<String>) -> Self {
        Self {
            root: root.into(),
            session: session.into(),
            cap: DEFAULT_OUTPUT_CAP,
        }
    }

    /// Sets the cap.
    pub fn with_cap(mut self, cap: u64) -> Self {
        self.cap = cap;
        self
    }
}

fn check_session(session: &str) -> Result<()> {
    let ok = !session.is_empty()
        && session.len() <= 128
        && session
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "session name {session:?} may only hold A-Z, a-z, 0-9, '-' and '_' (1 to 128 characters)"
        )))
    }
}

struct State {
    file: File,
    written: u64,
    truncated: bool,
}

/// One task's output file: appends until the cap, then one marker line, then nothing.
pub struct OutputFile {
    path: PathBuf,
    cap: u64,
    state: Mutex<State>,
}

impl OutputFile {
    /// Creates the output file of task `id` (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600).
    ///
    /// A file or a symlink already at the path is refused (`AlreadyExists`) and left
    /// untouched.
    pub fn create(config: &OutputConfig, id: &TaskId) -> Result<Self> {
        check_session(&config.session)?;
        let dir = config.root.join(&config.session).join("tasks");
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io {
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(&dir).map_err(io("creating task output directory", &dir))?;
        let meta =
            std::fs::symlink_metadata(&dir).map_err(io("checking task output directory", &dir))?;
        if meta.file_type().is_symlink() || !meta.is_dir() {
            return Err(Error::Io {
                action: "checking task output directory",
                path: dir,
                source: std::io::Error::other("not a real directory (a symlink?)"),
            });
        }
        let path = dir.join(format!("{id}.output"));
        let mut opts = std::fs::OpenOptions::new();
        opts.append(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600).custom_flags(libc::O_NOFOLLOW);
        }
        let file = opts
            .open(&path)
            .map_err(io("creating task output file", &path))?;
        Ok(Self {
            path,
            cap: config.cap,
            state: Mutex::new(State {
                file,
                written: 0,
                truncated: false,
            }),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the cap was reached.
    pub fn is_truncated(&self) -> bool {
        self.state.lock().map(|s| s.truncated).unwrap_or(true)
    }

    /// Appends `text`; past the cap writes the marker line once and drops the rest. Write
    /// errors are reported once through `tracing` and end further writes.
    pub fn append(&self, text: &str) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.truncated {
            return;
        }
        let room = self.cap.saturating_sub(st.written);
        let bytes = text.as_bytes();
        let (keep, cut) = if (bytes.len() as u64) <= room {
            (bytes, false)
        } else {
            // Cut on a character boundary.
            let mut n = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
            while n > 0 && !text.is_char_boundary(n) {
                n -= 1;
            }
            (&bytes[..n], true)
        };
        let mut result = st.file.write_all(keep);
        st.written += keep.len() as u64;
        if cut && result.is_ok() {
            let marker = format!(
                "\n[output truncated: the {}-byte cap was reached]\n",
                self.cap
            );
            result = st.file.write_all(marker.as_bytes());
            st.truncated = true;
        }
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), "task output write failed: {e}");
            st.truncated = true;
        }
    }
}

impl std::fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFile")
            .field("path", &self.path)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    #[test]
    fn writes_until_the_cap_then_one_marker() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = OutputConfig::new(dir.path(), "s1").with_cap(10);
        let id = TaskId::from_entropy(TaskKind::Agent, 7);
        let out = OutputFile::create(&cfg, &id).unwrap();
        assert_eq!(
            out.path(),
            dir.path().join("s1/tasks").join(format!("{id}.output"))
        );
        out.append("hello ");
        // 4 bytes of room: "wör" (ö is two bytes); the cut never splits a character.
        out.append("wörld and more");
        out.append("never written");
        assert!(out.is_truncated());
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert_eq!(
            text,
            "hello wör\n[output truncated: the 10-byte cap was reached]\n"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(out.path()).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let id = TaskId::from_entropy(TaskKind::Agent, 9);
        let tasks = dir.path().join("s/tasks");
        std::fs::create_dir_all(&tasks).unwrap();
        let target = dir.path().join("authorized_keys");
        std::fs::write(&target, "ssh-ed25519 KEEP").unwrap();
        let link = tasks.join(format!("{id}.output"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s"), &id).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("creating task output file {}", link.display())
        );
        let Error::Io { source, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "ssh-ed25519 KEEP"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_tasks_directory_and_a_bad_session_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(dir.path().join("s")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("s/tasks")).unwrap();
        let id = TaskId::from_entropy(TaskKind::Agent, 1);
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s"), &id).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "checking task output directory {}",
                dir.path().join("s/tasks").display()
            )
        );
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "../up"), &id).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid agent configuration: session name \"../up\" may only hold A-Z, a-z, 0-9, '-' and '_' (1 to 128 characters)"
        );
    }
}
