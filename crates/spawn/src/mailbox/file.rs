//! Mailboxes in Claude Code's own inbox files, so a forkhive teammate and a Claude Code team
//! can share a directory.
//!
//! `<root>/teams/<team>/inboxes/<agent>.json` is a JSON array of entries `{"from", "text",
//! "timestamp", "read", "msg_id", "type": "message", "summary"?, "color"?}`. A writer takes
//! the lock file `<agent>.json.lock` (created exclusively; 10 attempts, backing off 5 to
//! 100 ms; a lock left by a writer that died is broken after 10 s, by one writer at a time),
//! reads the array, appends, writes a temporary file and renames it over the inbox — a reader
//! never sees half a file and no writer loses another's entry. Entries this build did not
//! write keep every field they have. Acknowledged letters (and letters another reader marked
//! `read`) are removed. An entry that is not a letter (no non-empty string `from`, or no
//! string `text`) is neither delivered nor counted nor removed, whatever its `read` or
//! `msg_id`, and a letter sent with its id is stored all the same: it stays as it is, with a
//! `tracing` warning when a read finds a number of them it has not warned of.
//!
//! A waiting reader sleeps until the operating system reports a change in its team's inbox
//! directory (`notify`: inotify, kqueue, FSEvents or ReadDirectoryChangesW), so an idle reader
//! costs nothing; it looks at its file's size and time every 30 s as well, in case
//! an event was lost, and every 50 ms where the directory cannot be watched.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::{Delivered, Inbox, LeadClaim, Letter, Mailbox, new_id, timestamp_now};
use crate::error::{Error, Result};

/// How many times a writer tries an inbox's lock before [`Error::MailboxBusy`].
pub const LOCK_ATTEMPTS: u32 = 10;

/// A lock older than this was left by a writer that died: it is broken.
const STALE_LOCK: Duration = Duration::from_secs(10);

/// How often a reader whose directory is watched looks at its file anyway (a lost event, a
/// directory removed and made again). Shorter in the unit tests, which test that look.
#[cfg(not(test))]
const WATCHED_LOOK: Duration = Duration::from_secs(30);
#[cfg(test)]
const WATCHED_LOOK: Duration = Duration::from_millis(300);

/// How often a reader whose directory cannot be watched looks at its file.
const POLL: Duration = Duration::from_millis(50);

/// Mailboxes as files under a root directory (Claude Code's `~/.claude`, or any other).
#[derive(Debug, Clone)]
pub struct FileMailbox {
    root: PathBuf,
    watch: Arc<Watch>,
}

/// Wakes the readers of inbox files when their directory changes. Shared by a mailbox's
/// clones; the watcher is made on the first wait and lives as long as they do.
#[derive(Default)]
struct Watch {
    /// The watcher and the directories it watches, by the path readers use (`None`: not made
    /// yet, or it failed).
    watcher: Mutex<Option<(notify::RecommendedWatcher, HashMap<PathBuf, Watched>)>>,
    /// One wake-up per inbox file (by its canonical path, as events name it), woken by any
    /// event on that file or its lock or temporary files (shared with the watcher's callback).
    wakers: Arc<Mutex<HashMap<PathBuf, Arc<Notify>>>>,
    /// How many entries that are not letters each inbox held when a reader last warned of
    /// them: the warning is repeated only when that number changes, not on every read.
    told: Mutex<HashMap<PathBuf, usize>>,
}

/// A watched directory.
struct Watched {
    /// Its canonical path: what the watch was given and what events name (macOS reports
    /// `/private/tmp/…` for `/tmp/…`).
    canonical: PathBuf,
    /// Which directory it is (device and inode where there are such): one removed and made
    /// again is watched again.
    identity: Option<(u64, u64)>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// The inbox file an event's path is about: `alice.json` for `alice.json`,
/// `alice.json.lock` and `alice.json.tmp-…`.
fn inbox_of(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let end = name.find(".json")? + ".json".len();
    Some(path.with_file_name(&name[..end]))
}

/// Which directory `dir` is now (device and inode on Unix; elsewhere only that it exists).
fn identity(dir: &Path) -> Option<Option<(u64, u64)>> {
    let meta = std::fs::metadata(dir).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        Some(Some((meta.dev(), meta.ino())))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Some(None)
    }
}

impl Watch {
    /// The wake-up for `file`, its directory watched — `None` if it cannot be (the reader
    /// polls then).
    fn waker(&self, file: &Path) -> Option<Arc<Notify>> {
        let dir = file.parent()?;
        let mut guard = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let wakers = Arc::clone(&self.wakers);
            let made = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let all = wakers.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    // Opening, reading and closing a file change nothing (and readers do it
                    // themselves: waking on it would loop).
                    Ok(e) if matches!(e.kind, notify::EventKind::Access(_)) => {}
                    Ok(e) if !e.need_rescan() => {
                        for p in &e.paths {
                            if let Some(n) = inbox_of(p).and_then(|f| all.get(&f)) {
                                n.notify_waiters();
                            }
                        }
                    }
                    // Events were lost, or the watch failed: everyone looks.
                    _ => all.values().for_each(|n| n.notify_waiters()),
                }
            });
            match made {
                Ok(w) => *guard = Some((w, HashMap::new())),
                Err(e) => {
                    tracing::warn!("file mailbox: cannot watch inboxes, polling instead: {e}");
                    return None;
                }
            }
        }
        let (watcher, dirs) = guard.as_mut()?;
        let canonical = match dirs.get(dir) {
            Some(w) => w.canonical.clone(),
            None => {
                use notify::Watcher as _;
                std::fs::create_dir_all(dir).ok()?;
                let canonical = std::fs::canonicalize(dir).ok()?;
                let identity = identity(&canonical)?;
                if let Err(e) = watcher.watch(&canonical, notify::RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), "file mailbox: cannot watch, polling: {e}");
                    return None;
                }
                dirs.insert(
                    dir.to_owned(),
                    Watched {
                        canonical: canonical.clone(),
                        identity,
                    },
                );
                canonical
            }
        };
        drop(guard);
        let key = canonical.join(file.file_name()?);
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        Some(Arc::clone(wakers.entry(key).or_default()))
    }

    /// After a quiet look: if `file`'s directory is gone or is another directory now (removed
    /// and made again), its watch has lapsed — drop it, and the next wait watches again. A
    /// directory that is still the one watched is left alone (watching it again would drop
    /// events on some platforms).
    fn check(&self, file: &Path) {
        let Some(dir) = file.parent() else { return };
        let mut guard = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        let Some((watcher, dirs)) = guard.as_mut() else {
            return;
        };
        let lapsed = dirs
            .get(dir)
            .is_some_and(|w| identity(&w.canonical) != Some(w.identity));
        if lapsed && let Some(w) = dirs.remove(dir) {
            use notify::Watcher as _;
            let _ = watcher.unwatch(&w.canonical);
        }
    }
}

impl FileMailbox {
    /// Inboxes under `<root>/teams/`. Every handle on the same root in this process shares
    /// one watcher (one inotify instance, of the 128 a Linux user has by default).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        static WATCHES: std::sync::LazyLock<Mutex<HashMap<PathBuf, std::sync::Weak<Watch>>>> =
            std::sync::LazyLock::new(Mutex::default);
        let root = root.into();
        let mut all = WATCHES.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, w| w.strong_count() > 0);
        let watch = match all.get(&root).and_then(std::sync::Weak::upgrade) {
            Some(w) => w,
            None => {
                let w = Arc::new(Watch::default());
                all.insert(root.clone(), Arc::downgrade(&w));
                w
            }
        };
        Self { root, watch }
    }

    /// Whether a reader of `inbox` is woken by the operating system (its directory is
    /// watched) rather than looking every 50 ms — true once a wait on any handle on this root
    /// in this process has watched it, on every platform `notify` supports.
    pub fn is_watched(&self, inbox: &Inbox) -> bool {
        let path = self.path(inbox);
        self.watch
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|(_, dirs)| path.parent().is_some_and(|d| dirs.contains_key(d)))
    }

    /// The file whose lock claims team `team`'s lead ([`Mailbox::claim_lead`]).
    pub fn lead_lock_path(&self, team: &str) -> PathBuf {
        self.root.join("teams").join(team).join("lead.lock")
    }

    /// The file of `inbox`.
    pub fn path(&self, inbox: &Inbox) -> PathBuf {
        self.root
            .join("teams")
            .join(inbox.team())
            .join("inboxes")
            .join(format!("{}.json", inbox.agent()))
    }
}

fn fail(inbox: &Inbox, message: String) -> Error {
    Error::Mailbox {
        inbox: inbox.to_string(),
        message,
    }
}

/// The inbox's entries; a missing file is an empty inbox.
async fn read(inbox: &Inbox, path: &Path) -> Result<Vec<Value>> {
    let owned = path.to_path_buf();
    let bytes = tokio::task::spawn_blocking(move || read_file(&owned))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    entries(inbox, path, bytes)
}

/// [`read`] on the calling thread (for an update on the blocking pool).
fn read_now(inbox: &Inbox, path: &Path) -> Result<Vec<Value>> {
    entries(inbox, path, read_file(path))
}

/// An inbox file's bytes, never read through a symlink: a link planted at an inbox's path
/// would have its owner read another inbox's letters, or any file. (Writes replace the file by
/// a rename, which never follows one.)
fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let mut file = opts.open(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The entries of an inbox file read as `read`.
fn entries(inbox: &Inbox, path: &Path, read: std::io::Result<Vec<u8>>) -> Result<Vec<Value>> {
    let bytes = match read {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(fail(
                inbox,
                format!(
                    "{} is a symlink; an inbox is read only from a file of its own",
                    path.display()
                ),
            ));
        }
        Err(e) => return Err(fail(inbox, format!("reading {}: {e}", path.display()))),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Array(entries)) => Ok(entries),
        Ok(_) => Err(fail(
            inbox,
            format!("{} is not a JSON array of entries", path.display()),
        )),
        Err(e) => Err(fail(
            inbox,
            format!(
                "{} is not valid JSON ({e}); it is left as it is",
                path.display()
            ),
        )),
    }
}

/// An entry's id: its `msg_id`, or — for an entry written without one — a digest of who sent
/// what when, numbered among identical entries.
fn ids(entries: &[Value]) -> Vec<String> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    entries
        .iter()
        .map(|e| {
            if let Some(id) = e.get("msg_id").and_then(Value::as_str) {
                return id.to_owned();
            }
            let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
            let digest = forkhive_core::Digest::of(
                format!(
                    "{}\0{}\0{}",
                    field("from"),
                    field("timestamp"),
                    field("text")
                )
                .as_bytes(),
            )
            .to_string();
            let n = seen.entry(digest.clone()).or_insert(0);
            *n += 1;
            format!("sha256:{}#{n}", &digest[..16])
        })
        .collect()
}

/// Whether `e` is a letter: an object with a non-empty string `from` and a string `text`.
/// Anything else in an inbox (another program's entry, a damaged one) is never delivered — it
/// would reach an agent as a blank letter from nobody — nor counted, nor removed: it stays in
/// the file as it is, and the letters around it come and go as usual.
fn is_letter(e: &Value) -> bool {
    e.get("from")
        .and_then(Value::as_str)
        .is_some_and(|f| !f.is_empty())
        && e.get("text").is_some_and(Value::is_string)
}

fn is_read(e: &Value) -> bool {
    e.get("read").and_then(Value::as_bool).unwrap_or(false)
}

/// Holds an inbox's lock file, which holds this holder's token; removes it when dropped — if
/// it is still this holder's. (A holder slower than [`STALE_LOCK`] has had its lock broken, and
/// the file there now is another writer's.)
struct Lock {
    path: PathBuf,
    token: String,
}

impl Drop for Lock {
    fn drop(&mut self) {
        if std::fs::read(&self.path).is_ok_and(|held| held == self.token.as_bytes()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// One try of the lock file: created (and held), or the open's error.
///
/// On the blocking pool, with the guard made there: a caller whose future is dropped while the
/// file is being created never leaves a lock without a holder (the guard is dropped with the
/// task's unread output, and removes it). Before, such a lock stood until it was stale (10 s),
/// and every writer to the inbox spent its budget on it meanwhile.
async fn try_lock(lock: &Path) -> std::io::Result<Lock> {
    let lock = lock.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)?;
        let token = new_id();
        if let Err(e) = file.write_all(token.as_bytes()) {
            // Not ours by its content yet: removed here, or it would stand until stale.
            let _ = std::fs::remove_file(&lock);
            return Err(e);
        }
        Ok(Lock { path: lock, token })
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Whether a lock file with this metadata is older than [`STALE_LOCK`].
fn is_stale(meta: std::io::Result<std::fs::Metadata>) -> bool {
    meta.and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= STALE_LOCK)
}

/// Breaks the lock file at `lock`, which its caller found stale, and says whether it did. Two
/// writers that both found one lock stale could otherwise both end up holding the inbox: the
/// first removes the lock and takes the path, the second removes the first's new lock and takes
/// it too, and one overwrites the other's letter. So breaking is itself exclusive: a breaker
/// first creates `<agent>.json.lock.break` (holding its token, as a lock does), looks again, and
/// removes the lock only if it is still stale (a lock taken since is fresh). A breaker that
/// died holding that file (it holds it for microseconds) is broken after the same 10 s. On the
/// blocking pool, whole: a caller dropped midway leaves no breaker's file behind.
async fn break_stale(lock: &Path) -> std::io::Result<bool> {
    let lock = lock.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut breaker = lock.clone().into_os_string();
        breaker.push(".break");
        let breaker = PathBuf::from(breaker);
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&breaker)
        {
            Ok(file) => file,
            // Another writer is breaking it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if is_stale(std::fs::metadata(&breaker)) {
                    let _ = std::fs::remove_file(&breaker);
                }
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let token = new_id();
        if let Err(e) = file.write_all(token.as_bytes()) {
            let _ = std::fs::remove_file(&breaker);
            return Err(e);
        }
        let meta = std::fs::symlink_metadata(&lock);
        let dir = meta.as_ref().is_ok_and(std::fs::Metadata::is_dir);
        let broke = if is_stale(meta) {
            // Claude Code's writers lock with a directory (`proper-lockfile`'s `mkdir`), and
            // remove it with `rmdir`; this crate's with a file.
            let removed = if dir {
                std::fs::remove_dir(&lock)
            } else {
                std::fs::remove_file(&lock)
            };
            match removed {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            }
        } else {
            Ok(false)
        };
        // Removed only while it is this breaker's: one stalled past 10 s has had it broken.
        if std::fs::read(&breaker).is_ok_and(|held| held == token.as_bytes()) {
            let _ = std::fs::remove_file(&breaker);
        }
        broke
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Takes the inbox's lock file, trying [`LOCK_ATTEMPTS`] times with backoff. Breaking a stale
/// lock does not count as a try (the path is free after it), but at most as many breaks are
/// made; a writer that finds another breaking it waits as it would for a held lock.
async fn lock(inbox: &Inbox, path: &Path) -> Result<Lock> {
    let lock = path.with_extension("json.lock");
    let mut delay = Duration::from_millis(5);
    let (mut attempt, mut breaks) = (1, 0);
    loop {
        match try_lock(&lock).await {
            Ok(held) => return Ok(held),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if breaks < LOCK_ATTEMPTS && is_stale(tokio::fs::metadata(&lock).await) {
                    breaks += 1;
                    tracing::warn!(lock = %lock.display(), "breaking a stale inbox lock");
                    match break_stale(&lock).await {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(lock = %lock.display(), "breaking the lock failed: {e}");
                        }
                    }
                }
                if attempt == LOCK_ATTEMPTS {
                    break;
                }
                attempt += 1;
                // Between half the step and the step, at random: writers that collided do not
                // come back in step.
                let mut b = [0u8; 1];
                let _ = getrandom::fill(&mut b);
                let wait = delay / 2 + delay.mul_f64(f64::from(b[0]) / 510.0);
                tokio::time::sleep(wait).await;
                delay = (delay * 2).min(Duration::from_millis(100));
            }
            Err(e) => {
                return Err(fail(inbox, format!("creating {}: {e}", lock.display())));
            }
        }
    }
    Err(Error::MailboxBusy {
        path: lock,
        attempts: LOCK_ATTEMPTS,
    })
}

/// Takes the inbox's lock, then reads its entries, gives them to `change`, and writes back
/// what it returns (`None`: nothing to write) — all of it after the lock on the blocking pool,
/// holding the lock until the rename is done. A caller whose future is dropped meanwhile does
/// not stop it: the update runs to its end and only then lets the lock go. Before, the lock
/// went with the dropped future while its rename was still queued, and a writer that took the
/// lock then had its letter overwritten by that rename.
async fn update(
    inbox: &Inbox,
    path: &Path,
    change: impl FnOnce(Vec<Value>) -> Option<Vec<Value>> + Send + 'static,
) -> Result<()> {
    let held = lock(inbox, path).await?;
    let (to, file) = (inbox.clone(), path.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let _held = held;
        // Read under the lock: every entry written before it is kept.
        match change(read_now(&to, &file)?) {
            Some(entries) => write_now(&to, &file, &entries),
            None => Ok(()),
        }
    })
    .await
    .map_err(|e| fail(inbox, format!("updating {}: {e}", path.display())))?
}

/// Writes `entries` to a temporary file beside `path` and renames it over `path`; a temporary
/// file that could not be written or renamed is removed.
fn write_now(inbox: &Inbox, path: &Path, entries: &[Value]) -> Result<()> {
    let bytes =
        serde_json::to_vec(entries).map_err(|e| fail(inbox, format!("encoding the inbox: {e}")))?;
    let tmp = path.with_extension(format!("json.tmp-{}", new_id()));
    let io = |what: &str, e: std::io::Error| fail(inbox, format!("{what} {}: {e}", tmp.display()));
    let done = std::fs::write(&tmp, &bytes)
        .map_err(|e| io("writing", e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| io("renaming", e)));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// The lead locks this process holds, by path: a second claim here is refused before the
/// file system is asked (on a network mount, Linux makes `flock` a process-wide lock, which
/// another `Team` value of this process would get, and give up for both).
static CLAIMED: std::sync::LazyLock<Mutex<HashSet<PathBuf>>> =
    std::sync::LazyLock::new(Mutex::default);

/// A lead claimed in a [`FileMailbox`]: its lock file (the lock goes with it) and its place
/// among this process's claims.
struct FileLead {
    _file: Option<std::fs::File>,
    path: PathBuf,
}

impl Drop for FileLead {
    fn drop(&mut self) {
        CLAIMED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.path);
    }
}

/// Claims `team`'s lead by the exclusive lock of `path`, writing this process's id into it for
/// whoever finds it held. The lock goes with the returned claim: when it is dropped, or when
/// this process dies (nothing stale to break).
fn claim_lead_now(team: &str, path: &Path) -> Result<LeadClaim> {
    if !CLAIMED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf())
    {
        return Err(Error::TeamTaken {
            team: team.to_owned(),
            holder: format!(
                "{} is locked by another `Team` value in this process",
                path.display()
            ),
        });
    }
    // Given up again on every way out but a kept claim.
    let mut lead = FileLead {
        _file: None,
        path: path.to_path_buf(),
    };
    lead._file = Some(lock_lead_file(team, path)?);
    Ok(LeadClaim::kept(lead))
}

/// Takes the lock of `path`; a file system without locks gives the claim this process keeps
/// alone, with a warning.
fn lock_lead_file(team: &str, path: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let io = |what: &str, e: std::io::Error| Error::Mailbox {
        inbox: format!("{team}/team-lead"),
        message: format!("{what} the team's lead lock {}: {e}", path.display()),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let mut file = opts.open(path).map_err(|e| io("opening", e))?;
    let locked = crate::base::files::try_lock(&file).map_err(|e| io("locking", e))?;
    if locked.is_none() {
        tracing::warn!(
            "{} cannot be locked on this file system: team `{team}`'s lead is claimed only \
             within this process",
            path.display()
        );
    }
    if locked == Some(false) {
        let mut said = String::new();
        let _ = file.read_to_string(&mut said);
        let said = said.trim();
        return Err(Error::TeamTaken {
            team: team.to_owned(),
            holder: if said.is_empty() {
                format!("{} is locked", path.display())
            } else {
                format!(
                    "{} is locked by {}",
                    path.display(),
                    super::claim_held_by(said)
                )
            },
        });
    }
    let stamp = format!("{}\n", super::claim_holder());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(stamp.as_bytes()))
        .map_err(|e| io("writing", e))?;
    Ok(file)
}

/// Whether `foreign` entries that are not letters in the inbox at `path` are news to the
/// readers of this mailbox: a number other than the one last told of (none is, and forgets
/// it). Every read looks, so a warning on every read would drown the log.
fn first_told(told: &Mutex<HashMap<PathBuf, usize>>, path: &Path, foreign: usize) -> bool {
    let mut told = told.lock().unwrap_or_else(|e| e.into_inner());
    if foreign == 0 {
        told.remove(path);
        return false;
    }
    told.insert(path.to_path_buf(), foreign) != Some(foreign)
}
#[async_trait]
impl Mailbox for FileMailbox {
    async fn claim_lead(&self, team: &str) -> Result<LeadClaim> {
        let (team, path) = (team.to_owned(), self.lead_lock_path(team));
        tokio::task::spawn_blocking(move || claim_lead_now(&team, &path))
            .await
            .map_err(|e| Error::Refused(format!("claiming a team's lead failed: {e}")))?
    }

    async fn send(&self, to: &Inbox, letter: Letter) -> Result<String> {
        let path = self.path(to);
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| fail(to, format!("creating {}: {e}", dir.display())))?;
        }
        // Only a sender's own id can repeat; a fresh one is unique.
        let chosen = letter.id.is_some();
        let id = letter.id.unwrap_or_else(new_id);
        let mut entry = Map::new();
        entry.insert("from".into(), Value::String(letter.from));
        entry.insert("text".into(), Value::String(letter.text));
        entry.insert("timestamp".into(), Value::String(timestamp_now()));
        entry.insert("read".into(), Value::Bool(false));
        entry.insert("msg_id".into(), Value::String(id.clone()));
        entry.insert("type".into(), Value::String("message".into()));
        if let Some(s) = letter.summary {
            entry.insert("summary".into(), Value::String(s));
        }
        if let Some(c) = letter.color {
            entry.insert("color".into(), Value::String(c));
        }
        let stored = id.clone();
        update(to, &path, move |mut entries| {
            // A repeated send of a letter still unacknowledged stores it once.
            // Among letters only: an entry that is not one is never delivered, so a letter
            // sharing its id would never be either.
            if chosen
                && ids(&entries)
                    .iter()
                    .zip(&entries)
                    .any(|(id, e)| *id == stored && is_letter(e))
            {
                return None;
            }
            entries.push(Value::Object(entry));
            Some(entries)
        })
        .await?;
        Ok(id)
    }

    async fn receive(&self, inbox: &Inbox) -> Result<Vec<Delivered>> {
        // No lock: the file is only ever replaced whole.
        let path = self.path(inbox);
        let entries = read(inbox, &path).await?;
        let ids = ids(&entries);
        let foreign = entries.iter().filter(|e| !is_letter(e)).count();
        if first_told(&self.watch.told, &path, foreign) {
            tracing::warn!(
                "{}: {foreign} entr{} that {} not a letter (an object with a non-empty string \
                 `from` and a string `text`) left undelivered in the file",
                path.display(),
                if foreign == 1 { "y" } else { "ies" },
                if foreign == 1 { "is" } else { "are" },
            );
        }
        Ok(entries
            .iter()
            .zip(ids)
            .filter(|(e, _)| is_letter(e) && !is_read(e))
            .map(|(e, id)| {
                let field = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
                Delivered {
                    id,
                    from: field("from").unwrap_or_default(),
                    text: field("text").unwrap_or_default(),
                    timestamp: field("timestamp").unwrap_or_default(),
                    summary: field("summary"),
                    color: field("color"),
                }
            })
            .collect())
    }

    async fn ack(&self, inbox: &Inbox, acked: &[String]) -> Result<()> {
        let path = self.path(inbox);
        if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(());
        }
        let acked: HashSet<String> = acked.iter().cloned().collect();
        update(inbox, &path, move |entries| {
            let ids = ids(&entries);
            let before = entries.len();
            let kept: Vec<Value> = entries
                .into_iter()
                .zip(ids)
                // An entry that is not a letter stays whatever its `read` or id.
                .filter(|(e, id)| !is_letter(e) || (!is_read(e) && !acked.contains(id.as_str())))
                .map(|(e, _)| e)
                .collect();
            (kept.len() != before).then_some(kept)
        })
        .await
    }

    async fn stored(&self, inbox: &Inbox) -> Result<usize> {
        Ok(read(inbox, &self.path(inbox))
            .await?
            .iter()
            .filter(|e| is_letter(e))
            .count())
    }

    /// Looks at the inbox file's size and modification time every 50 ms (Claude Code polls
    /// every second) and reads it only when they change.
    async fn wait_beyond(
        &self,
        inbox: &Inbox,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool> {
        let path = self.path(inbox);
        let until = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            let waker = self.watch.waker(&path);
            let changed = waker.as_ref().map(|n| n.notified());
            let mut changed = changed.map(Box::pin);
            if let Some(c) = changed.as_mut() {
                // Registered before looking: a change after the look wakes this wait.
                c.as_mut().enable();
            }
            // Size, time and (on Unix) inode: a rename over the inbox is a new inode even when
            // the size and a coarse time are the same.
            let now_seen = tokio::fs::metadata(&path).await.ok().map(|m| {
                #[cfg(unix)]
                let ino = {
                    use std::os::unix::fs::MetadataExt as _;
                    m.ino()
                };
                #[cfg(not(unix))]
                let ino = 0u64;
                (m.len(), m.modified().ok(), ino)
            });
            if now_seen != last {
                last = now_seen;
                if super::beyond(&self.receive(inbox).await?, known) {
                    return Ok(true);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= until {
                return Ok(false);
            }
            match changed {
                Some(c) => {
                    tokio::select! {
                        () = c => {}
                        () = tokio::time::sleep((until - now).min(WATCHED_LOOK)) => {
                            self.watch.check(&path);
                        }
                    }
                }
                None => tokio::time::sleep((until - now).min(POLL)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A reader waiting on a watched inbox whose directory is removed and made again (a
    /// cleanup, a restore: the watch on it is gone) still finds the next letter, at its next
    /// look at the file ([`WATCHED_LOOK`]).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_finds_a_letter_after_its_directory_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let mail = FileMailbox::new(dir.path());
        let inbox = Inbox::new("t", "alice").unwrap();
        let first = mail
            .send(&inbox, Letter::new("lead", "first"))
            .await
            .unwrap();
        mail.ack(&inbox, &[first]).await.unwrap();
        let wait = |mail: FileMailbox, inbox: Inbox| {
            tokio::spawn(async move {
                mail.wait_beyond(&inbox, &[], Duration::from_secs(30))
                    .await
                    .unwrap()
            })
        };
        let waiting = wait(mail.clone(), inbox.clone());
        // Until the reader watches the directory.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let inboxes = mail.path(&inbox).parent().unwrap().to_path_buf();
        std::fs::remove_dir_all(&inboxes).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        mail.send(&inbox, Letter::new("lead", "second"))
            .await
            .unwrap();
        let woke = tokio::time::timeout(WATCHED_LOOK * 10, waiting)
            .await
            .expect("the reader found the letter at its next look")
            .unwrap();
        assert!(woke);
        let got = mail.receive(&inbox).await.unwrap();
        assert_eq!(
            got.iter().map(|d| d.text.as_str()).collect::<Vec<_>>(),
            ["second"]
        );
    }

    /// Entries that are not letters are told of once per number of them: every read finds
    /// them, and only a new number (more, fewer, again after none) is news; two inboxes are
    /// told of apart; and readers on many threads at once tell of one number once.
    #[test]
    fn entries_that_are_not_letters_are_told_of_once_per_number() {
        let told = Mutex::new(HashMap::new());
        let (a, b) = (Path::new("/inboxes/a.json"), Path::new("/inboxes/b.json"));
        let seen: Vec<bool> = [
            (a, 2),
            (a, 2),
            (b, 2),
            (a, 3),
            (a, 3),
            (a, 0),
            (a, 0),
            (a, 3),
        ]
        .into_iter()
        .map(|(path, n)| first_told(&told, path, n))
        .collect();
        assert_eq!(seen, [true, false, true, true, false, false, false, true]);
        let told = Arc::new(Mutex::new(HashMap::new()));
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let told = Arc::clone(&told);
                std::thread::spawn(move || {
                    (0..1_000)
                        .filter(|_| first_told(&told, Path::new("/inboxes/c.json"), 5))
                        .count()
                })
            })
            .collect();
        let total: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert_eq!(total, 1);
    }

    /// A holder whose lock was broken as stale, and taken by another writer, leaves the other
    /// writer's lock in place when it lets go; its own is removed.
    #[tokio::test]
    async fn a_holder_removes_only_its_own_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("a.json.lock");
        let held = try_lock(&lock).await.unwrap();
        assert!(try_lock(&lock).await.is_err(), "held");
        // Broken as stale, and taken by another writer.
        std::fs::remove_file(&lock).unwrap();
        let other = try_lock(&lock).await.unwrap();
        drop(held);
        assert!(lock.exists(), "the other writer's lock was removed");
        drop(other);
        assert!(!lock.exists());
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A stale lock is broken: gone, with nothing left beside it.
    #[tokio::test]
    async fn breaking_a_stale_lock_removes_it_and_leaves_nothing_aside() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("a.json.lock");
        let file = std::fs::File::create(&lock).unwrap();
        let old = std::time::SystemTime::now() - STALE_LOCK - Duration::from_secs(1);
        file.set_modified(old).unwrap();
        drop(file);
        assert!(is_stale(std::fs::metadata(&lock)));
        assert!(break_stale(&lock).await.unwrap(), "broken");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
        // Already broken by another writer: nothing to do, and nothing made.
        assert!(!break_stale(&lock).await.unwrap());
        assert!(names(dir.path()).is_empty());
    }

    /// A writer that found a lock stale, when another writer has broken it and taken the path
    /// since, leaves the other's lock where it is: the other still holds it, and removes it
    /// when it lets go. (Removing it, as breaking once did, let both hold the inbox.)
    #[tokio::test]
    async fn a_lock_taken_since_it_was_found_stale_is_left_to_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("a.json.lock");
        let held = try_lock(&lock).await.unwrap();
        let token = std::fs::read(&lock).unwrap();
        assert!(!break_stale(&lock).await.unwrap(), "not broken");
        assert_eq!(
            std::fs::read(&lock).unwrap(),
            token,
            "the holder's lock is in place"
        );
        assert_eq!(names(dir.path()), ["a.json.lock"]);
        assert!(try_lock(&lock).await.is_err(), "still held");
        drop(held);
        assert!(names(dir.path()).is_empty(), "its holder removed it");
    }

    /// Sets `path`'s modification time past the stale limit.
    fn age(path: &Path) {
        let old = std::time::SystemTime::now() - STALE_LOCK - Duration::from_secs(1);
        // A directory cannot be opened for writing; on Unix its owner may set it read-only.
        let file = if path.is_dir() {
            std::fs::File::open(path)
        } else {
            std::fs::File::options().write(true).open(path)
        };
        file.unwrap().set_modified(old).unwrap();
    }

    /// A lock left by a Claude Code writer that died — a directory, as `proper-lockfile` makes
    /// it — is broken too: before, removing it as a file failed, and every writer to the inbox
    /// was refused busy for as long as no Claude Code writer came to break it.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_dead_claude_code_writers_lock_directory_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("a.json.lock");
        std::fs::create_dir(&lock).unwrap();
        assert!(
            !break_stale(&lock).await.unwrap(),
            "a live one is left alone"
        );
        assert!(lock.is_dir());
        age(&lock);
        assert!(break_stale(&lock).await.unwrap(), "broken");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    /// While another writer breaks the lock, this one leaves it alone; a breaker that died
    /// long ago is broken itself, and the lock with the next try.
    #[tokio::test]
    async fn a_breaker_gives_way_to_another_and_a_dead_one_is_broken() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("a.json.lock");
        let breaker = dir.path().join("a.json.lock.break");
        std::fs::write(&lock, "").unwrap();
        age(&lock);
        std::fs::write(&breaker, "").unwrap();
        assert!(!break_stale(&lock).await.unwrap(), "gave way");
        assert_eq!(names(dir.path()), ["a.json.lock", "a.json.lock.break"]);
        age(&breaker);
        assert!(!break_stale(&lock).await.unwrap(), "broke the breaker only");
        assert_eq!(
            names(dir.path()),
            ["a.json.lock"],
            "the dead breaker is gone"
        );
        assert!(break_stale(&lock).await.unwrap(), "broken");
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }
}
