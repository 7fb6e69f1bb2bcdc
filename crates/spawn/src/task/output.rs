//! Task output files: `<root>/<session>/tasks/<task-id>.output`.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — File-Based IPC": the file
//! is opened with `O_NOFOLLOW`, so a symlink planted at a predictable task path (pointing at
//! `~/.ssh/authorized_keys`, say) fails instead of being written through; and its size is
//! capped, because a runaway worker can fill a disk in minutes. We also create it with
//! `O_EXCL` and mode 0600, and refuse a `tasks` directory that is a symlink.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use forkhive_core::TaskId;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

/// The default cap: 5 GiB, as the shipped CLI uses.
pub const DEFAULT_OUTPUT_CAP: u64 = 5 * 1024 * 1024 * 1024;

/// How many appends may wait for the writer in its queue; past them, text waits in one
/// buffer of at most [`OUTPUT_BACKLOG`] bytes.
pub const OUTPUT_QUEUE: usize = 4096;

/// The most bytes that may wait for the writer beyond its queue (a fast model's many small
/// deltas fill the queue long before they are many bytes); past them text is dropped and
/// counted.
pub const OUTPUT_BACKLOG: usize = 8 * 1024 * 1024;

/// The most bytes the writer gathers into one write.
const BATCH: usize = 64 * 1024;

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
    ///
    /// A session name that is not `[A-Za-z0-9_-]` (1 to 128 characters), or a root that is
    /// not an existing directory, is [`Error::Config`] here, when the host sets the service
    /// up, not first when a child starts (where the model would be the one told, and every
    /// background spawn would fail). The root is not created; the directories below it are.
    /// (The check is one `stat` on the calling thread, at set-up.)
    pub fn new(root: impl Into<PathBuf>, session: impl Into<String>) -> Result<Self> {
        let session = session.into();
        check_session(&session)?;
        let root = root.into();
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Config(format!(
                    "task output root {}: not a directory",
                    root.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Config(format!(
                    "task output root {}: {e}; create it before setting up the task service \
                     (the directories below it are made as children start)",
                    root.display()
                )));
            }
            Err(e) => {
                return Err(Error::Config(format!(
                    "task output root {}: {e}",
                    root.display()
                )));
            }
        }
        Ok(Self {
            root,
            session,
            cap: DEFAULT_OUTPUT_CAP,
        })
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

/// What the writer task is asked to do.
enum Op {
    Text(String),
    Flush(oneshot::Sender<()>),
}

/// One task's output file: appends until the cap, then one marker line, then nothing.
///
/// [`append`](Self::append) never blocks and never touches the file: it hands the text to a
/// writer task through a bounded queue ([`OUTPUT_QUEUE`] appends), which gathers what is queued
/// into one write; when the queue is full, text waits in order in a backlog of up to
/// [`OUTPUT_BACKLOG`] bytes, which the writer takes once the queue is drained. If the writer
/// falls further behind, further text is dropped and counted, and the file says so (`[N bytes
/// of output dropped: the writer fell behind]`) — an agent's task is never blocked on a disk. [`flush`](Self::flush) waits until everything appended
/// before it is written; a child's owner flushes before it notifies, so the notification's
/// output file is complete. The writer ends when the last handle is dropped.
pub struct OutputFile {
    path: PathBuf,
    cap: u64,
    tx: mpsc::Sender<Op>,
    /// Text that found the queue full, in order: while it holds any, appends join it (so the
    /// file keeps their order), and the writer takes it whole once its queue is empty.
    backlog: Arc<std::sync::Mutex<Backlog>>,
    truncated: Arc<AtomicBool>,
}

/// What waits for the writer beyond its queue: text, in order, with a marker where text was
/// dropped because it would not fit.
#[derive(Default)]
struct Backlog {
    text: String,
    /// Bytes dropped since the last text that fit: their marker goes before the next text
    /// that fits (or at the end), where they were lost.
    dropped: u64,
}

impl Backlog {
    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.dropped == 0
    }

    /// Adds `text` if it fits within [`OUTPUT_BACKLOG`] (after the marker of what was dropped
    /// before it); counts it as dropped otherwise.
    fn push(&mut self, text: &str) {
        let marker = (self.dropped > 0).then(|| dropped_marker(self.dropped));
        let needed = text.len() + marker.as_ref().map_or(0, String::len);
        if self.text.len() + needed > OUTPUT_BACKLOG {
            self.dropped += text.len() as u64;
            return;
        }
        if let Some(marker) = marker {
            self.text.push_str(&marker);
            self.dropped = 0;
        }
        self.text.push_str(text);
    }

    /// All of it, the marker of what was dropped last included, leaving it empty.
    fn take(&mut self) -> String {
        let mut text = std::mem::take(&mut self.text);
        if self.dropped > 0 {
            text.push_str(&dropped_marker(std::mem::take(&mut self.dropped)));
        }
        text
    }
}

/// The line that says `n` bytes were dropped there.
fn dropped_marker(n: u64) -> String {
    format!("\n[{n} bytes of output dropped: the writer fell behind]\n")
}

impl OutputFile {
    /// Creates the output file of task `id` under `<root>/<session>/tasks/` and starts its
    /// writer.
    ///
    /// The directories below the root are created (mode 0700) and walked one by one without
    /// following a symbolic link (`openat` with `O_NOFOLLOW`): a session or `tasks` directory
    /// that is a symlink is refused, wherever it points. The file is created
    /// `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600: a file or a symlink already at the path is
    /// refused (`AlreadyExists`) and left untouched. The file system work runs off the async
    /// threads.
    pub async fn create(config: &OutputConfig, id: &TaskId) -> Result<Self> {
        check_session(&config.session)?;
        let config_owned = config.clone();
        let id = *id;
        // The file is made on the blocking pool, and held there by a guard until this future
        // takes it: a spawn dropped while the file is being made leaves no file behind.
        let (file, unclaimed) = tokio::task::spawn_blocking(move || {
            open_file(&config_owned, &id).map(|(file, path)| (file, Unclaimed::new(path)))
        })
        .await
        .map_err(|e| Error::Io {
            action: "creating task output file",
            path: config.root.clone(),
            source: std::io::Error::other(e),
        })??;
        let path = unclaimed.claim();
        let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
        let truncated = Arc::new(AtomicBool::new(false));
        let backlog = Arc::new(std::sync::Mutex::new(Backlog::default()));
        let writer = Writer {
            backlog: Arc::clone(&backlog),
            file: tokio::fs::File::from_std(file),
            path: path.clone(),
            cap: config.cap,
            written: 0,
            truncated: Arc::clone(&truncated),
            failed: false,
        };
        tokio::spawn(writer.run(rx));
        Ok(Self {
            path,
            cap: config.cap,
            tx,
            backlog,
            truncated,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cap.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Whether the cap was reached (or a write failed), as far as the writer has got.
    pub fn is_truncated(&self) -> bool {
        self.truncated.load(Ordering::Acquire)
    }

    /// Queues `text` for the file without blocking; past the cap the writer writes the
    /// marker line once and drops the rest. Write errors are reported once through `tracing`
    /// and end further writes.
    pub fn append(&self, text: &str) {
        if text.is_empty() || self.is_truncated() {
            return;
        }
        // Under the backlog's lock, which the writer takes to empty it only with its queue
        // empty: text goes to the queue only while the backlog is empty, so everything queued
        // is older than everything in the backlog.
        let mut backlog = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        if backlog.is_empty() {
            match self.tx.try_send(Op::Text(text.to_owned())) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {}
            }
        }
        backlog.push(text);
    }

    /// Waits until everything appended so far is written to the file.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Op::Flush(ack)).await.is_ok() {
            let _ = done.await;
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

/// The task that owns the file: the only code that writes it.
struct Writer {
    backlog: Arc<std::sync::Mutex<Backlog>>,
    file: tokio::fs::File,
    path: PathBuf,
    cap: u64,
    written: u64,
    truncated: Arc<AtomicBool>,
    failed: bool,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        let mut buf = Vec::new();
        let mut acks = Vec::new();
        while let Some(first) = rx.recv().await {
            // Gather what is already queued into one write.
            let mut next = Some(first);
            while let Some(op) = next.take() {
                match op {
                    Op::Text(t) => self.take(&mut buf, &t),
                    Op::Flush(ack) => acks.push(ack),
                }
                if buf.len() < BATCH {
                    next = rx.try_recv().ok();
                }
            }
            // The backlog, once the queue is empty (checked under its lock: nothing is queued
            // while it holds text). A flush is answered only when nothing older than it can be
            // left there: the backlog taken, or empty.
            let settled = {
                let mut backlog = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
                if rx.is_empty() {
                    let text = backlog.take();
                    drop(backlog);
                    self.take(&mut buf, &text);
                    true
                } else {
                    backlog.is_empty()
                }
            };
            if !buf.is_empty()
                && !self.failed
                && let Err(e) = self.file.write_all(&buf).await
            {
                self.fail(&e);
            }
            buf.clear();
            if settled && !acks.is_empty() {
                if let Err(e) = self.file.flush().await {
                    self.fail(&e);
                }
                for ack in acks.drain(..) {
                    let _ = ack.send(());
                }
            }
        }
        // Every handle is gone: what waits in the backlog is the last text.
        let text = self
            .backlog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.take(&mut buf, &text);
        if !buf.is_empty()
            && !self.failed
            && let Err(e) = self.file.write_all(&buf).await
        {
            self.fail(&e);
        }
        let _ = self.file.flush().await;
    }

    /// Adds `text` to the pending write, within the cap (cut on a character boundary, then
    /// the marker line once).
    fn take(&mut self, buf: &mut Vec<u8>, text: &str) {
        if self.truncated.load(Ordering::Acquire) {
            return;
        }
        let room = self.cap.saturating_sub(self.written);
        let bytes = text.as_bytes();
        if (bytes.len() as u64) <= room {
            buf.extend_from_slice(bytes);
            self.written += bytes.len() as u64;
            return;
        }
        let mut n = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
        while n > 0 && !text.is_char_boundary(n) {
            n -= 1;
        }
        buf.extend_from_slice(&bytes[..n]);
        self.written += n as u64;
        buf.extend_from_slice(
            format!(
                "\n[output truncated: the {}-byte cap was reached]\n",
                self.cap
            )
            .as_bytes(),
        );
        self.truncated.store(true, Ordering::Release);
    }

    fn fail(&mut self, e: &std::io::Error) {
        tracing::warn!(path = %self.path.display(), "task output write failed: {e}");
        self.failed = true;
        self.truncated.store(true, Ordering::Release);
    }
}

/// Opens `<root>/<session>/tasks/<id>.output` as [`OutputFile::create`] describes.
#[cfg(unix)]
/// Creates (or finds) the session's scratchpad, `<root>/<session>/scratchpad`, walking every
/// directory below the root without following a symbolic link, as output files are made:
/// a session or scratchpad directory that is a symlink is refused. Returns its path.
///
/// The scratchpad is a directory shared by a coordinator and its workers ("Coordinator Mode:
/// A Working Multi-Agent System, From the Source — the scratchpad"): no schema, no lock, the
/// last write of a file wins; by convention each worker writes under its own task id.
pub async fn scratchpad(config: &OutputConfig) -> Result<PathBuf> {
    check_session(&config.session)?;
    let config = config.clone();
    let root = config.root.clone();
    tokio::task::spawn_blocking(move || {
        use rustix::fs::{CWD, Mode, OFlags, openat};
        let opened = openat(
            CWD,
            &config.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::Io {
            action: "opening task output root",
            path: config.root.clone(),
            source: e.into(),
        })?;
        let session_path = config.root.join(&config.session);
        let session = open_dir_below(&opened, &config.session, &session_path)?;
        let path = session_path.join("scratchpad");
        open_dir_below(&session, "scratchpad", &path)?;
        Ok(path)
    })
    .await
    .map_err(|e| Error::Io {
        action: "creating the scratchpad",
        path: root,
        source: std::io::Error::other(e),
    })?
}

fn open_file(config: &OutputConfig, id: &TaskId) -> Result<(std::fs::File, PathBuf)> {
    use rustix::fs::{CWD, Mode, OFlags, openat};
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: rustix::io::Errno| Error::Io {
            action,
            path,
            source: e.into(),
        }
    };
    // The root is the host's choice and may be reached through links; below it, nothing is.
    let root = openat(
        CWD,
        &config.root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("opening task output root", &config.root))?;
    let session_path = config.root.join(&config.session);
    let session = open_dir_below(&root, &config.session, &session_path)?;
    let tasks_path = session_path.join("tasks");
    let tasks = open_dir_below(&session, "tasks", &tasks_path)?;
    let name = format!("{id}.output");
    let path = tasks_path.join(&name);
    let fd = openat(
        &tasks,
        name.as_str(),
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::APPEND
            | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(io("creating task output file", &path))?;
    Ok((std::fs::File::from(fd), path))
}

/// An output file nobody has claimed yet (its creation, or the child it was made for, may be
/// gone): removed when dropped unclaimed — off the async threads when a runtime is there.
pub(crate) struct Unclaimed(Option<PathBuf>);

impl Unclaimed {
    /// Guards the file at `path`.
    pub(crate) fn new(path: PathBuf) -> Self {
        Self(Some(path))
    }

    /// Its path; it is kept from now on.
    pub(crate) fn claim(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(path) = self.0.take() else { return };
        let remove = move || {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "removing an unused output file: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Creates (if missing) and opens the directory `name` inside `parent`, refusing a symlink.
#[cfg(unix)]
fn open_dir_below(
    parent: &rustix::fd::OwnedFd,
    name: &str,
    path: &Path,
) -> Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags, mkdirat, openat};
    use rustix::io::Errno;
    match mkdirat(parent, name, Mode::RWXU) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => {
            return Err(Error::Io {
                action: "creating task output directory",
                path: path.to_path_buf(),
                source: e.into(),
            });
        }
    }
    openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        action: "checking task output directory",
        path: path.to_path_buf(),
        source: if e == Errno::LOOP || e == Errno::NOTDIR {
            // Said as what it is: a link is refused (it could point anywhere), anything else
            // that is not a directory cannot hold the output.
            use rustix::fs::{AtFlags, FileType, statat};
            let kind = statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode));
            std::io::Error::other(match kind {
                Ok(FileType::Symlink) => "a symlink, not a real directory",
                Ok(FileType::RegularFile) => "a file, not a directory",
                _ => "not a directory",
            })
        } else {
            e.into()
        },
    })
}

/// Opens `<root>/<session>/tasks/<id>.output` (without the no-follow walk, which needs
/// `openat`).
#[cfg(not(unix))]
fn open_file(config: &OutputConfig, id: &TaskId) -> Result<(std::fs::File, PathBuf)> {
    let dir = config.root.join(&config.session).join("tasks");
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        action: "creating task output directory",
        path: dir.clone(),
        source,
    })?;
    let path = dir.join(format!("{id}.output"));
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(&path)
        .map_err(|source| Error::Io {
            action: "creating task output file",
            path: path.clone(),
            source,
        })?;
    Ok((file, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    #[tokio::test]
    async fn writes_until_the_cap_then_one_marker() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = OutputConfig::new(dir.path(), "s1").unwrap().with_cap(10);
        let id = TaskId::from_entropy(TaskKind::Agent, 7);
        let out = OutputFile::create(&cfg, &id).await.unwrap();
        assert_eq!(
            out.path(),
            dir.path().join("s1/tasks").join(format!("{id}.output"))
        );
        out.append("hello ");
        // 4 bytes of room: "wör" (ö is two bytes); the cut never splits a character.
        out.append("wörld and more");
        out.append("never written");
        out.flush().await;
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
    #[tokio::test]
    async fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let id = TaskId::from_entropy(TaskKind::Agent, 9);
        let tasks = dir.path().join("s/tasks");
        std::fs::create_dir_all(&tasks).unwrap();
        let target = dir.path().join("authorized_keys");
        std::fs::write(&target, "ssh-ed25519 KEEP").unwrap();
        let link = tasks.join(format!("{id}.output"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s").unwrap(), &id)
            .await
            .unwrap_err();
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
    #[tokio::test]
    async fn a_symlinked_tasks_directory_and_a_bad_session_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(dir.path().join("s")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("s/tasks")).unwrap();
        let id = TaskId::from_entropy(TaskKind::Agent, 1);
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s").unwrap(), &id)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "checking task output directory {}",
                dir.path().join("s/tasks").display()
            )
        );
        // Its cause says what the entry is: a link, or a file.
        assert_eq!(
            forkhive_core::error::chain(&err),
            format!(
                "checking task output directory {}: a symlink, not a real directory",
                dir.path().join("s/tasks").display()
            )
        );
        std::fs::remove_file(dir.path().join("s/tasks")).unwrap();
        std::fs::write(dir.path().join("s/tasks"), "a file").unwrap();
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s").unwrap(), &id)
            .await
            .unwrap_err();
        assert_eq!(
            forkhive_core::error::chain(&err),
            format!(
                "checking task output directory {}: a file, not a directory",
                dir.path().join("s/tasks").display()
            )
        );
        let refused = "invalid agent configuration: session name \"../up\" may only hold A-Z, a-z, 0-9, '-' and '_' (1 to 128 characters)";
        let err = OutputConfig::new(dir.path(), "../up").unwrap_err();
        assert_eq!(err.to_string(), refused);
        // A root that is missing, or a file, is the host's to hear of, at set-up.
        let missing = dir.path().join("out");
        assert_eq!(
            OutputConfig::new(&missing, "s").unwrap_err().to_string(),
            format!(
                "invalid agent configuration: task output root {}: No such file or directory \
                 (os error 2); create it before setting up the task service (the directories \
                 below it are made as children start)",
                missing.display()
            )
        );
        std::fs::write(&missing, "").unwrap();
        assert_eq!(
            OutputConfig::new(&missing, "s").unwrap_err().to_string(),
            format!(
                "invalid agent configuration: task output root {}: not a directory",
                missing.display()
            )
        );
        // Set by hand, past the constructor: refused when a child starts.
        let by_hand = OutputConfig {
            session: "../up".into(),
            ..OutputConfig::new(dir.path(), "s").unwrap()
        };
        let err = OutputFile::create(&by_hand, &id).await.unwrap_err();
        assert_eq!(err.to_string(), refused);
    }

    /// Not only the last component: a session directory that is a symlink is refused too,
    /// and nothing is created where it points.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlinked_session_directory_is_refused_and_nothing_is_created_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("s")).unwrap();
        let id = TaskId::from_entropy(TaskKind::Agent, 2);
        let err = OutputFile::create(&OutputConfig::new(dir.path(), "s").unwrap(), &id)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "checking task output directory {}",
                dir.path().join("s").display()
            )
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    /// A fresh output file under `dir` (session `s`), for the task of `entropy`.
    async fn output_file(dir: &Path, entropy: u64) -> OutputFile {
        let id = TaskId::from_entropy(TaskKind::Agent, entropy);
        OutputFile::create(&OutputConfig::new(dir, "s").unwrap(), &id)
            .await
            .unwrap()
    }

    /// A full queue never blocks `append`: the text waits in the backlog (see below for a
    /// flood past it).
    #[tokio::test]
    async fn a_full_queue_never_blocks_append() {
        let dir = tempfile::tempdir().unwrap();
        let out = output_file(dir.path(), 3).await;
        // The writer cannot run while this (current-thread) test does not yield.
        for _ in 0..OUTPUT_QUEUE + 10 {
            out.append("ab");
        }
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert_eq!(text, "ab".repeat(OUTPUT_QUEUE + 10));
    }

    /// A fast model's many small deltas fill the queue long before they are many bytes: they
    /// wait in the backlog, in order, and none is dropped; past the backlog's bytes, text is
    /// dropped and the file says how much.
    #[tokio::test(flavor = "current_thread")]
    async fn many_small_appends_wait_in_order_and_only_a_flood_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let out = output_file(dir.path(), 5).await;
        // No await between them: the writer cannot run meanwhile.
        let n = OUTPUT_QUEUE * 3;
        for i in 0..n {
            out.append(&format!("{i:08}\n"));
        }
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        let got: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());

        let out = output_file(dir.path(), 6).await;
        // The queue filled with one-byte appends, then the backlog with 64 KiB ones to one
        // chunk short of full; then an append one byte too long for what is left (dropped),
        // then a short one that fits: the marker stands where the text was lost, before it.
        for _ in 0..OUTPUT_QUEUE {
            out.append("y");
        }
        let chunk = "x".repeat(64 * 1024);
        let fitting = OUTPUT_BACKLOG / chunk.len() - 1;
        for _ in 0..fitting {
            out.append(&chunk);
        }
        let too_long = format!("z{chunk}");
        out.append(&too_long);
        out.append("tail\n");
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        let expected = format!(
            "{}{}{}tail\n",
            "y".repeat(OUTPUT_QUEUE),
            chunk.repeat(fitting),
            dropped_marker(too_long.len() as u64)
        );
        assert_eq!(text.len(), expected.len());
        assert!(text == expected, "{}", &text[text.len() - 120..]);
        // Dropped at the very end: the marker closes the file.
        let out = output_file(dir.path(), 8).await;
        for _ in 0..OUTPUT_QUEUE {
            out.append("y");
        }
        for _ in 0..OUTPUT_BACKLOG / chunk.len() + 2 {
            out.append(&chunk);
        }
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert!(
            text.ends_with(&dropped_marker(2 * chunk.len() as u64)),
            "{}",
            &text[text.len() - 120..]
        );
        drop(out);
    }

    /// Appending from four threads at once, far past the queue: each thread's lines arrive
    /// whole and in its order, none lost (the backlog under contention with the writer).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_from_many_threads_past_the_queue_keep_each_ones_order() {
        let dir = tempfile::tempdir().unwrap();
        let out = Arc::new(output_file(dir.path(), 7).await);
        let per = OUTPUT_QUEUE * 2;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let out = Arc::clone(&out);
                std::thread::spawn(move || {
                    for i in 0..per {
                        out.append(&format!("{t}:{i}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert!(!text.contains("dropped"));
        for t in 0..4 {
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{t}:")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..per).collect::<Vec<_>>(), "thread {t}");
        }
    }

    /// Everything appended before a flush is in the file after it, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_from_many_tasks_all_arrive_by_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let out = Arc::new(output_file(dir.path(), 4).await);
        let tasks: Vec<_> = (0..4)
            .map(|t| {
                let out = Arc::clone(&out);
                tokio::spawn(async move {
                    for i in 0..500 {
                        out.append(&format!("{t}:{i}\n"));
                        if i % 50 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        out.flush().await;
        let text = std::fs::read_to_string(out.path()).unwrap();
        for t in 0..4 {
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{t}:")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..500).collect::<Vec<_>>(), "writer {t}: order kept");
        }
    }
}
