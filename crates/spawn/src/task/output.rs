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
    /// The file, once the writer's task was dropped while handles were left (the runtime
    /// shut down under a running child): appends then write it themselves, at once.
    tail: Arc<std::sync::Mutex<Option<Tail>>>,
    /// Whether the text appended so far ends a line (or there is none): where
    /// [`append_line`](Self::append_line) needs no line break first.
    at_line_start: AtomicBool,
}

/// What waits for the writer beyond its queue: text, in order, with a marker where text was
/// dropped because it would not fit.
#[derive(Default)]
struct Backlog {
    text: String,
    /// The writer's task is gone (see [`Tail`]): appends go to the tail, never to the queue.
    orphaned: bool,
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
        let tail = Arc::new(std::sync::Mutex::new(None));
        let writer = Writer {
            rx,
            backlog: Arc::clone(&backlog),
            tail: Arc::clone(&tail),
            file: Some(tokio::fs::File::from_std(file)),
            path: path.clone(),
            budget: Budget {
                cap: config.cap,
                written: 0,
            },
            truncated: Arc::clone(&truncated),
            failed: false,
            buf: Vec::new(),
            handed: 0,
            acks: Vec::new(),
            ended: false,
        };
        tokio::spawn(writer.run());
        Ok(Self {
            path,
            cap: config.cap,
            tx,
            backlog,
            truncated,
            tail,
            at_line_start: AtomicBool::new(true),
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
        self.at_line_start
            .store(text.ends_with('\n'), Ordering::Relaxed);
        // Under the backlog's lock, which the writer takes to empty it only with its queue
        // empty: text goes to the queue only while the backlog is empty, so everything queued
        // is older than everything in the backlog.
        let mut backlog = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        if !backlog.orphaned {
            if !backlog.is_empty() {
                backlog.push(text);
                return;
            }
            match self.tx.try_send(Op::Text(text.to_owned())) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    backlog.push(text);
                    return;
                }
                // Not while a handle is left, unless the writer's task is gone.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        drop(backlog);
        // The writer's task is gone: written here, after everything it left (which its drop
        // wrote holding this lock).
        if let Some(tail) = self.tail.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            tail.write(text, &self.truncated);
        }
    }

    /// Appends `line` as a line of its own: after a line break if the text so far does not
    /// end with one, and with one after it (the library's `[tool …]` and `[stopped: …]`
    /// lines: never an empty line before them).
    pub fn append_line(&self, line: &str) {
        let text = if self.at_line_start.load(Ordering::Relaxed) {
            format!("{line}\n")
        } else {
            format!("\n{line}\n")
        };
        self.append(&text);
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

/// The task that owns the file: the only code that writes it while it runs. Dropped before
/// the handles are (its runtime shut down under a running child), it writes what it was
/// given and had not written, and hands the file to the handles as their [`Tail`]: the
/// `[stopped: …]` line its child's owner appends then still reaches the file.
struct Writer {
    rx: mpsc::Receiver<Op>,
    backlog: Arc<std::sync::Mutex<Backlog>>,
    tail: Arc<std::sync::Mutex<Option<Tail>>>,
    /// Taken when it is handed on.
    file: Option<tokio::fs::File>,
    path: PathBuf,
    budget: Budget,
    truncated: Arc<AtomicBool>,
    failed: bool,
    /// The write under way, of which `handed` bytes are the file's already.
    buf: Vec<u8>,
    handed: usize,
    /// Flushes waiting for the write under way; a drop answers them once it has written.
    acks: Vec<oneshot::Sender<()>>,
    /// Every handle is gone and everything is written: nothing for its drop to do.
    ended: bool,
}

impl Writer {
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            // Gather what is already queued into one write.
            let mut next = Some(first);
            while let Some(op) = next.take() {
                match op {
                    Op::Text(t) => self.take(&t),
                    Op::Flush(ack) => self.acks.push(ack),
                }
                if self.buf.len() < BATCH {
                    next = self.rx.try_recv().ok();
                }
            }
            // The backlog, once the queue is empty (checked under its lock: nothing is queued
            // while it holds text). A flush is answered only when nothing older than it can be
            // left there: the backlog taken, or empty.
            let settled = {
                let mut backlog = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
                if self.rx.is_empty() {
                    let text = backlog.take();
                    drop(backlog);
                    self.take(&text);
                    true
                } else {
                    backlog.is_empty()
                }
            };
            self.write().await;
            if settled && !self.acks.is_empty() {
                if let Some(file) = self.file.as_mut()
                    && let Err(e) = file.flush().await
                {
                    self.fail(&e);
                }
                for ack in self.acks.drain(..) {
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
        self.take(&text);
        self.write().await;
        if let Some(file) = self.file.as_mut() {
            let _ = file.flush().await;
        }
        self.ended = true;
    }

    /// Writes `buf`, counting what the file has taken, so a drop midway writes only the rest.
    async fn write(&mut self) {
        while self.handed < self.buf.len() && !self.failed {
            let Some(file) = self.file.as_mut() else {
                break;
            };
            match file.write(&self.buf[self.handed..]).await {
                Ok(0) => {
                    self.fail(&std::io::Error::from(std::io::ErrorKind::WriteZero));
                }
                Ok(n) => self.handed += n,
                // tokio refuses file work once its runtime is shutting down ("background task
                // failed": these bytes were not taken), and this task is about to be dropped:
                // they are written here, blocking. Any other error — a disk that failed, this
                // write's or the one before it, whose bytes tokio had taken — ends the file.
                Err(e) => {
                    if shutting_down().await {
                        match write_blocking(file, &self.buf[self.handed..]) {
                            Ok(()) => self.handed = self.buf.len(),
                            Err(e) => self.fail(&e),
                        }
                    } else {
                        self.fail(&e);
                    }
                }
            }
        }
        self.buf.clear();
        self.handed = 0;
    }

    /// Adds `text` to the pending write, within the cap.
    fn take(&mut self, text: &str) {
        self.budget.take(&mut self.buf, text, &self.truncated);
    }

    fn fail(&mut self, e: &std::io::Error) {
        tracing::warn!(path = %self.path.display(), "task output write failed: {e}");
        self.failed = true;
        self.truncated.store(true, Ordering::Release);
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Its task was dropped with handles left: the runtime is shutting down (or has shut
        // down) under a running child. What it was given is written now, and the file is the
        // handles' from here, so the child's owner can still close it with its `[stopped: …]`
        // line. The tail's lock is held throughout: an append that finds the writer gone
        // waits for it, and its text comes after.
        let (tail, backlog) = (Arc::clone(&self.tail), Arc::clone(&self.backlog));
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut backlog = backlog.lock().unwrap_or_else(|e| e.into_inner());
            backlog.orphaned = true;
            self.rx.close();
            while let Ok(op) = self.rx.try_recv() {
                match op {
                    Op::Text(t) => self.take(&t),
                    Op::Flush(ack) => self.acks.push(ack),
                }
            }
            let text = backlog.take();
            drop(backlog);
            self.take(&text);
        }
        match self.file.take().and_then(|f| into_std(f, &self.path)) {
            Some(file) => {
                let mut handed_on = Tail {
                    file,
                    path: std::mem::take(&mut self.path),
                    budget: self.budget,
                    failed: self.failed,
                };
                handed_on.write_bytes(&self.buf[self.handed..], &self.truncated);
                *tail = Some(handed_on);
            }
            // Nothing more reaches the file, and it says so as a failed one does.
            None => self.truncated.store(true, Ordering::Release),
        }
        // Flushes are answered once what came before them is written (or lost, said above).
        for ack in self.acks.drain(..) {
            let _ = ack.send(());
        }
    }
}

/// Whether this runtime refuses blocking work: it is shutting down.
async fn shutting_down() -> bool {
    matches!(tokio::task::spawn_blocking(|| ()).await, Err(e) if e.is_cancelled())
}

/// Writes all of `bytes` to `file` on this thread, around tokio (see [`Writer::write`]).
fn write_blocking(file: &tokio::fs::File, bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let mut rest = bytes;
        while !rest.is_empty() {
            match rustix::io::write(file.as_fd(), rest) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = (file, bytes);
        Err(std::io::Error::other("no blocking write here"))
    }
}

/// The file as a blocking one, for a writer whose task is gone. A write the task handed to
/// tokio's blocking pool may still be under way or queued (tokio runs those even at
/// shutdown): it is waited for, up to [`HANDOVER_WAIT`], so what follows lands after it. Past
/// that (the pool's threads stuck elsewhere) the rest is not written: out of order, it would
/// put text after the `[stopped: …]` line.
fn into_std(file: tokio::fs::File, path: &Path) -> Option<std::fs::File> {
    let waited = std::time::Instant::now();
    let mut file = file;
    loop {
        match file.try_into_std() {
            Ok(std) => return Some(std),
            Err(busy) => file = busy,
        }
        if waited.elapsed() >= HANDOVER_WAIT {
            tracing::warn!(
                path = %path.display(),
                "task output: a write was still under way {} ms after the runtime shut down; \
                 the rest of the output was not written",
                HANDOVER_WAIT.as_millis()
            );
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// How long a writer dropped with its runtime waits for a write tokio still has under way.
const HANDOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// An output file whose writer's task is gone, written by the handles themselves, blocking
/// (at most a few lines: what a child's owner appends as it finishes it).
struct Tail {
    file: std::fs::File,
    path: PathBuf,
    budget: Budget,
    failed: bool,
}

impl Tail {
    fn write(&mut self, text: &str, truncated: &AtomicBool) {
        let mut buf = Vec::new();
        self.budget.take(&mut buf, text, truncated);
        self.write_bytes(&buf, truncated);
    }

    fn write_bytes(&mut self, bytes: &[u8], truncated: &AtomicBool) {
        use std::io::Write;
        if bytes.is_empty() || self.failed {
            return;
        }
        if let Err(e) = self.file.write_all(bytes) {
            tracing::warn!(path = %self.path.display(), "task output write failed: {e}");
            self.failed = true;
            truncated.store(true, Ordering::Release);
        }
    }
}

/// How much of its cap a file has used.
#[derive(Debug, Clone, Copy)]
struct Budget {
    cap: u64,
    written: u64,
}

impl Budget {
    /// Adds `text` to `buf`, within the cap (cut on a character boundary, then the marker
    /// line once, which sets `truncated`).
    fn take(&mut self, buf: &mut Vec<u8>, text: &str, truncated: &AtomicBool) {
        if truncated.load(Ordering::Acquire) {
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
        truncated.store(true, Ordering::Release);
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

    /// Asserts that `text` holds the lines `w:0` to `w:{per - 1}` of each of `writers`
    /// writers, each writer's in its order, none missing.
    fn each_in_order(text: &str, writers: usize, per: usize) {
        for w in 0..writers {
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{w}:")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..per).collect::<Vec<_>>(), "writer {w}");
        }
    }

    /// A fresh output file under `dir` (session `s`), for the task of `entropy`.
    async fn output_file(dir: &Path, entropy: u64) -> OutputFile {
        let id = TaskId::from_entropy(TaskKind::Agent, entropy);
        OutputFile::create(&OutputConfig::new(dir, "s").unwrap(), &id)
            .await
            .unwrap()
    }

    /// The library's lines stand on lines of their own, never after an empty one: at the start
    /// of the file, after text that ends a line, and after text that does not.
    #[tokio::test]
    async fn library_lines_are_lines_of_their_own_and_no_empty_line_comes_before() {
        let dir = tempfile::tempdir().unwrap();
        let out = output_file(dir.path(), 30).await;
        out.append_line("[tool Read t1]");
        out.append("Reading.\n");
        out.append_line("[tool Grep t2]");
        out.append("Found it");
        out.append_line("[stopped: completed]");
        out.flush().await;
        assert_eq!(
            std::fs::read_to_string(out.path()).unwrap(),
            "[tool Read t1]\nReading.\n[tool Grep t2]\nFound it\n[stopped: completed]\n"
        );
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

    /// A runtime shut down with the writer's task in it (never polled here) hands the file to
    /// the handles: what was queued and what waited in the backlog is written, in order, and
    /// what is appended after — a child's owner's `[stopped: …]` line — is written at once,
    /// within the cap.
    #[test]
    fn a_writer_dropped_with_its_runtime_hands_the_file_to_its_handles() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let out = output_file(dir.path(), 9).await;
            // The writer cannot run before the runtime goes: the queue fills, one more waits
            // in the backlog.
            for _ in 0..OUTPUT_QUEUE {
                out.append("q");
            }
            out.append("b");
            out
        });
        drop(rt);
        out.append("\n[stopped: cancelled]\n");
        futures::executor::block_on(out.flush());
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert_eq!(
            text,
            format!("{}b\n[stopped: cancelled]\n", "q".repeat(OUTPUT_QUEUE))
        );
        assert!(!out.is_truncated());

        // The cap still holds once the handles write.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let cfg = OutputConfig::new(dir.path(), "s").unwrap().with_cap(10);
            let out = OutputFile::create(&cfg, &TaskId::from_entropy(TaskKind::Agent, 10))
                .await
                .unwrap();
            out.append("hello");
            out
        });
        drop(rt);
        out.append("world and more");
        out.append("never written");
        assert!(out.is_truncated());
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert_eq!(
            text,
            "helloworld\n[output truncated: the 10-byte cap was reached]\n"
        );
    }

    /// Four threads append while the runtime running the writer shuts down: every thread's
    /// lines arrive whole and in its order, none lost, across the hand-over.
    #[test]
    fn appends_across_the_writers_runtime_shutting_down_keep_each_ones_order() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let out = Arc::new(rt.block_on(output_file(dir.path(), 11)));
        let per = OUTPUT_QUEUE;
        let go = Arc::new(std::sync::Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (out, go) = (Arc::clone(&out), Arc::clone(&go));
                std::thread::spawn(move || {
                    go.wait();
                    for i in 0..per {
                        out.append(&format!("{t}:{i}\n"));
                    }
                })
            })
            .collect();
        go.wait();
        drop(rt);
        for t in threads {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert!(!text.contains("dropped"));
        each_in_order(&text, 4, per);
    }

    /// A write tokio still has queued when the runtime shuts down (the blocking pool's one
    /// thread busy elsewhere) is waited for: what follows lands after it, in order.
    #[test]
    fn a_write_still_under_way_at_shutdown_lands_before_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(async {
            let out = output_file(dir.path(), 21).await;
            // The pool's one thread is busy (a slow disk, or other blocking work).
            drop(tokio::task::spawn_blocking(|| {
                std::thread::sleep(std::time::Duration::from_millis(400))
            }));
            out.append("first\n");
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            out.append("second\n");
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            out
        });
        drop(rt);
        out.append("[stopped: cancelled]\n");
        let text = std::fs::read_to_string(out.path()).unwrap();
        assert_eq!(text, "first\nsecond\n[stopped: cancelled]\n");
    }

    /// A write that fails in tokio's background is reported at the next write: the file is
    /// then failed and truncated (its bytes are lost), never quietly written around.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_failed_background_write_ends_the_file() {
        use std::io::Read;
        use std::os::fd::{AsFd, OwnedFd};
        let (mut r, w) = std::io::pipe().unwrap();
        let w: OwnedFd = w.into();
        let flags = rustix::fs::fcntl_getfl(w.as_fd()).unwrap();
        rustix::fs::fcntl_setfl(w.as_fd(), flags | rustix::fs::OFlags::NONBLOCK).unwrap();
        // A full pipe: the next write fails (EAGAIN), as a full disk or a flaky mount would.
        let mut filled = 0usize;
        while let Ok(n) = rustix::io::write(w.as_fd(), &[b'.'; 4096]) {
            filled += n;
        }
        let (_tx, rx) = mpsc::channel(1);
        let truncated = Arc::new(AtomicBool::new(false));
        let mut writer = Writer {
            rx,
            backlog: Arc::default(),
            tail: Arc::new(std::sync::Mutex::new(None)),
            file: Some(tokio::fs::File::from_std(std::fs::File::from(w))),
            path: PathBuf::from("pipe"),
            budget: Budget {
                cap: u64::MAX,
                written: 0,
            },
            truncated: Arc::clone(&truncated),
            failed: false,
            buf: b"lost\n".to_vec(),
            handed: 0,
            acks: Vec::new(),
            ended: true,
        };
        // tokio takes it; its write in the background fails.
        writer.write().await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // The condition clears before the next write.
        let mut drain = vec![0u8; filled];
        r.read_exact(&mut drain).unwrap();
        writer.buf = b"next\n".to_vec();
        writer.write().await;
        assert!(writer.failed && truncated.load(Ordering::Acquire));
    }

    /// A flush waiting in the queue when the runtime shuts down returns once the text
    /// appended before it is in the file.
    #[test]
    fn a_flush_waiting_at_shutdown_returns_once_its_text_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let big = "x".repeat(OUTPUT_BACKLOG);
        let out = Arc::new(rt.block_on(async {
            let out = output_file(dir.path(), 22).await;
            out.append(&big);
            out
        }));
        let flushing = Arc::clone(&out);
        let seen = std::thread::spawn(move || {
            futures::executor::block_on(flushing.flush());
            std::fs::metadata(flushing.path()).unwrap().len()
        });
        // Until the flush waits in the queue behind the text.
        while out.tx.capacity() > OUTPUT_QUEUE - 2 {
            std::thread::yield_now();
        }
        drop(rt);
        assert_eq!(seen.join().unwrap(), big.len() as u64);
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
        each_in_order(&text, 4, per);
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
        each_in_order(&text, 4, 500);
    }
}
