//! Transcripts: each agent appends its conversation to its own JSONL file as it happens, and
//! [`read`] rebuilds it byte for byte.
//!
//! "Claude Code Multi-Agent Internals — 3.3 A subagent is a real sidechain agent loop": a
//! sub-agent writes its metadata and then persists its transcript incrementally, so that an
//! agent can be resumed from disk. The schema is documented in `docs/transcripts.md`:
//!
//! ```text
//! {"type":"header","version":1,"agent_id":"a…","parent_id":null,"kind":"main",…,"prefix":{…}}
//! {"type":"message","index":0,"message":{"role":"user","content":[…]}}
//! {"type":"usage","turn":1,"fingerprint":"…","usage":{…},"stop_reason":"tool_use","tool_calls":2}
//! {"type":"stop","stop":{"reason":"completed"},"usage":{…}}
//! ```
//!
//! A record counts once its newline is written. A file whose last line was cut by a crash
//! reads up to the last complete record and reports what it dropped; any other damage is an
//! [`Error::Transcript`] naming the line.

mod journal;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use forkhive_core::{CacheSafeParams, Message, TaskId, ThinkingConfig, ToolDefinition, Usage};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::base::context::AgentKind;
use crate::base::outcome::{StopReason, TurnRecord};
use crate::error::{Error, Result};

use journal::{Journal, Made, Target, Written};

/// The transcript format this build writes and reads.
pub const TRANSCRIPT_VERSION: u32 = 1;

/// The cache-safe parts of an agent's first request, enough to rebuild it byte for byte.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixRecord {
    /// The model.
    pub model: String,
    /// The thinking config.
    pub thinking: Option<ThinkingConfig>,
    /// The rendered system prompt blocks.
    pub system: Vec<String>,
    /// System context entries, in order.
    pub system_context: Vec<(String, String)>,
    /// User context entries, in order.
    pub user_context: Vec<(String, String)>,
    /// The tool definitions, in order, schemas byte for byte.
    pub tools: Vec<ToolDefinition>,
}

impl PrefixRecord {
    /// The record of `params`' parts before the messages.
    pub fn of(params: &CacheSafeParams) -> Self {
        Self {
            model: params.model().to_owned(),
            thinking: params.thinking(),
            system: params.system_prompt().to_vec(),
            system_context: params.system_context().to_vec(),
            user_context: params.user_context().to_vec(),
            tools: params.tools().to_vec(),
        }
    }

    /// The parameters these parts and `messages` make.
    pub fn params(&self, messages: Vec<Message>) -> CacheSafeParams {
        let mut b = CacheSafeParams::builder(self.model.clone()).tools(self.tools.iter().cloned());
        if let Some(t) = self.thinking {
            b = b.thinking(t);
        }
        for s in &self.system {
            b = b.system_block(s.clone());
        }
        for (k, v) in &self.system_context {
            b = b.system_context(k.clone(), v.clone());
        }
        for (k, v) in &self.user_context {
            b = b.user_context(k.clone(), v.clone());
        }
        b.messages(messages).build()
    }
}

/// The first record of a transcript: who the agent is and what its prefix was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptHeader {
    /// The format version ([`TRANSCRIPT_VERSION`]).
    pub version: u32,
    /// The agent's task id.
    pub agent_id: String,
    /// The parent's task id.
    pub parent_id: Option<String>,
    /// How deep in its tree the agent is (the root is 0).
    #[serde(default)]
    pub depth: u32,
    /// The agent's kind.
    pub kind: AgentKind,
    /// The agent's query source (`agent:builtin:fork`, ...).
    pub query_source: String,
    /// The definition it was built from, if any.
    pub definition: Option<String>,
    /// The model.
    pub model: String,
    /// The hex fingerprint of the prefix when the transcript was created.
    pub prefix_fingerprint: String,
    /// The prefix's parts before the messages.
    pub prefix: PrefixRecord,
    /// The definition's `permissionMode`, re-applied on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
    /// The definition's `maxTurns`, re-applied on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// How many of the agent's first messages are its parent's, read from the parent's
    /// transcript (`<parent_id>.jsonl` beside this one) instead of copied: a fork child starts
    /// from its parent's whole history, and writing it again would make every fork O(history).
    /// This file's message records then start at that index. [`read`] resolves them and checks
    /// them against `prefix_fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_messages: Option<usize>,
    /// The hex fingerprint of the prefix with only the inherited messages, when the agent
    /// started with more messages than it inherits (then `prefix_fingerprint` covers them
    /// all); [`read`] checks the inherited messages against it, else against
    /// `prefix_fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_fingerprint: Option<String>,
    /// When the transcript was created, in milliseconds since the Unix epoch (absent in
    /// files written before times were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

/// Now, in milliseconds since the Unix epoch (0 for a clock set before it): the `at` of
/// transcript records.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Serialize)]
struct MessageLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    message: &'a Message,
    at: u64,
}

/// A usage record: one model turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLine {
    /// The turn number.
    pub turn: u32,
    /// The hex fingerprint of the request's prefix.
    pub fingerprint: String,
    /// The turn's tokens.
    pub usage: Usage,
    /// Why the model stopped.
    pub stop_reason: Option<String>,
    /// How many tools it called.
    pub tool_calls: usize,
    /// When the request was sent (ms since the Unix epoch; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<u64>,
    /// When its answer was complete (ms since the Unix epoch; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

/// A stop record: a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StopLine {
    /// Why.
    pub stop: StopReason,
    /// The run's usage.
    pub usage: Usage,
    /// When the run ended (ms since the Unix epoch; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// Why a run that failed failed: its error, with its causes (absent for other stops and
    /// in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize)]
struct Tagged<'a, T> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// Appends records to one agent's transcript.
///
/// Each record is written by the blocking pool, through the queue of its directory (records
/// from many agents at once are written in one trip there, see `journal`).
pub struct TranscriptWriter {
    /// The file and its path.
    to: Arc<Target>,
    journal: Journal,
    next_index: usize,
    /// The file's length up to the last record known written.
    len: u64,
    /// A record handed to the journal whose write is not known to have finished (its future
    /// was dropped before it heard): confirmed, or undone, before the next record.
    handed: Option<Handed>,
    /// The last record's buffer, back from the journal: the next record is encoded into it.
    spare: Vec<u8>,
}

/// The largest buffer a writer keeps for its next record; a larger one (a record of a very
/// long message) is freed once it is back.
const SPARE_CAP: usize = 16 * 1024;

impl std::fmt::Debug for TranscriptWriter {
    /// Without record bytes: neither the spare buffer's (the last record written, up to
    /// 16 KiB) nor those queued in its directory's journal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TranscriptWriter")
            .field("to", &self.to)
            .field("next_index", &self.next_index)
            .field("len", &self.len)
            .field("handed", &self.handed)
            .field("spare_capacity", &self.spare.capacity())
            .finish()
    }
}

/// A record handed to the journal, not yet known written.
#[derive(Debug)]
struct Handed {
    /// The file's length once it is written.
    end: u64,
    /// How many message indexes it took (0 for a usage or stop record alone).
    indexed: usize,
    /// How the write went.
    written: Written,
}

/// How a transcript is opened for appending: never through a symlink, and with `create`,
/// made (mode 0600) where nothing exists, and refused where anything does. Making a file
/// opens nothing that could block (a FIFO), so it is queued with the directory's records on
/// its journal ([`Journal::create`]).
fn no_follow(create: bool) -> std::fs::OpenOptions {
    let mut opts = std::fs::OpenOptions::new();
    opts.append(true);
    if create {
        opts.create_new(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    opts
}

/// Opens the existing `path` for appending ([`no_follow`]), on the blocking pool on its own:
/// it may be a FIFO, whose open blocks.
async fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || no_follow(false).open(path))
        .await
        .map_err(std::io::Error::other)?
}

/// How long a writer waits for a transcript whose lock another writer holds: long enough for
/// a dropped agent's last write to finish (the journal finishes a write it was handed, then
/// lets the file and its lock go); an agent that is still alive holds it for good, and the
/// wait ends in [`Error::TranscriptBusy`]. (On Unix; other platforms take no lock, and nothing
/// waits.)
pub const WRITER_WAIT: Duration = Duration::from_secs(5);

/// The longest pause between two tries of a held lock.
const LOCK_PAUSE_MAX: Duration = Duration::from_millis(50);

/// Takes `file`'s exclusive lock, waiting up to [`WRITER_WAIT`] while another writer holds it
/// (backing off from 1 ms to 50 ms). The lock goes with the last handle to the open file:
/// a writer's, or the one its unfinished write still holds.
async fn lock_for_writing(file: &std::fs::File, path: &Path) -> Result<()> {
    let start = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if lock_tried(file, path, start.elapsed())? {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LOCK_PAUSE_MAX);
    }
}

/// [`lock_for_writing`] on the calling thread (for the blocking pool, or no runtime at all).
///
/// On the thread of a current-thread runtime it tries once: the writer holding the lock may be
/// a task of that runtime (an agent's last write, handed over when it was dropped), which
/// cannot run while this thread waits.
fn lock_for_writing_blocking(file: &std::fs::File, path: &Path) -> Result<()> {
    let on_the_only_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
    if on_the_only_thread {
        return match lock_tried(file, path, Duration::ZERO)? {
            true => Ok(()),
            false => Err(Error::TranscriptBusy {
                path: path.to_path_buf(),
                waited: Duration::ZERO,
            }),
        };
    }
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if lock_tried(file, path, start.elapsed())? {
            return Ok(());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(LOCK_PAUSE_MAX);
    }
}

/// One try of the lock, `waited` into the wait: taken, or not yet, or an error (it failed, or
/// the wait is over).
fn lock_tried(file: &std::fs::File, path: &Path, waited: Duration) -> Result<bool> {
    match crate::base::files::try_lock_once(file) {
        Ok(true) => Ok(true),
        Ok(false) if waited >= WRITER_WAIT => Err(Error::TranscriptBusy {
            path: path.to_path_buf(),
            waited,
        }),
        Ok(false) => Ok(false),
        Err(source) => Err(Error::Io {
            action: "locking transcript",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The error of a failed step of reopening the transcript at `path`.
fn reopening(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        action: "reopening transcript",
        path: path.to_path_buf(),
        source,
    }
}

/// The existing transcript at `path`, opened for appending (never through a symlink) with its
/// lock taken ([`locked`]).
async fn open_locked(path: &Path) -> Result<(std::fs::File, Journal)> {
    let file = open_no_follow(path).await.map_err(reopening(path))?;
    let dir = path.parent().unwrap_or(path);
    locked(file, path, Journal::for_dir(dir)).await
}

/// `file` with its lock taken ([`lock_for_writing`]) when it is a regular file (a device has
/// no records of its own to keep in order, and may be shared by unrelated writers), and the
/// journal it is written through: its directory's `shared` one for a regular file; one of
/// its own for anything else, whose writes may block (a pipe, a terminal) and must hold up no
/// other transcript.
async fn locked(
    file: std::fs::File,
    path: &Path,
    shared: Journal,
) -> Result<(std::fs::File, Journal)> {
    if is_regular(&file, path)? {
        lock_for_writing(&file, path).await?;
        Ok((file, shared))
    } else {
        Ok((file, Journal::alone()))
    }
}

fn is_regular(file: &std::fs::File, path: &Path) -> Result<bool> {
    file.metadata()
        .map(|m| m.is_file())
        .map_err(|source| Error::Io {
            action: "locking transcript",
            path: path.to_path_buf(),
            source,
        })
}

impl TranscriptWriter {
    /// Creates `<dir>/<agent id>.jsonl` (never overwriting: an existing file or a planted
    /// symlink is an error) and writes the header. When the header inherits messages from the
    /// parent's transcript, the next message written gets the index after them.
    pub async fn create(dir: &Path, header: &TranscriptHeader) -> Result<Self> {
        let path = dir.join(format!("{}.jsonl", header.agent_id));
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io {
                action,
                path,
                source,
            }
        };
        let journal = Journal::for_dir(dir);
        let record = Tagged {
            kind: "header",
            body: header,
        };
        let first_line = || {
            let mut line = Vec::new();
            encode_line(&mut line, &record).map_err(|e| cannot_encode(&path, &e))?;
            Ok::<_, Error>(line)
        };
        // Made with its header in one trip (`Made`). The directory is made on first use (one
        // failed open, then never again).
        let made = match journal.create(&path, no_follow(true), first_line()?).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(io("creating the transcript directory", dir))?;
                journal.create(&path, no_follow(true), first_line()?).await
            }
            other => other,
        }
        .map_err(io("creating transcript", &path))?;
        Self::from_made(made, path, journal, header.inherited_messages.unwrap_or(0)).await
    }

    /// The writer of the transcript file `made` at `path`, whose next message takes
    /// `next_index`: its first line (the header) written already, or, where the file's lock
    /// was not free when it was made, written once the lock is taken.
    async fn from_made(
        made: Made,
        path: PathBuf,
        journal: Journal,
        next_index: usize,
    ) -> Result<Self> {
        let Made {
            file,
            first: (written, line),
        } = made;
        match written {
            // Made and locked (a new file is a regular one), the header written.
            Some(Ok(())) => Ok(Self {
                to: Arc::new(Target { file, path }),
                journal,
                next_index,
                len: line.len() as u64,
                handed: None,
                spare: if line.capacity() <= SPARE_CAP {
                    line
                } else {
                    Vec::new()
                },
            }),
            Some(Err(source)) => Err(Error::Io {
                action: "appending to transcript",
                path,
                source,
            }),
            // Its lock was held (by whoever opened it since): waited for, as a reopen does.
            None => {
                let (file, journal) = locked(file, &path, journal).await?;
                let mut w = Self {
                    to: Arc::new(Target { file, path }),
                    journal,
                    next_index,
                    len: 0,
                    handed: None,
                    spare: Vec::new(),
                };
                // The line already encoded, as it was to be written.
                w.write_lines(
                    |out| {
                        out.extend_from_slice(&line);
                        Ok(())
                    },
                    0,
                )
                .await?;
                Ok(w)
            }
        }
    }

    /// Reopens a transcript read by [`read`] for appending, cutting off a damaged tail first.
    ///
    /// The writer holds the file's lock for as long as it lives (see [`WRITER_WAIT`]). A file
    /// whose length changed since `transcript` was read is refused
    /// ([`Error::TranscriptChanged`]): another writer wrote to it, and the records this one
    /// would write could repeat its indexes. [`resume`](Self::resume) reads under the lock, so
    /// nothing can come between.
    pub async fn reopen(transcript: &Transcript) -> Result<Self> {
        let path = &transcript.path;
        let (file, journal) = open_locked(path).await?;
        let meta = file.metadata().map_err(reopening(path))?;
        let read = transcript.valid_len + transcript.dropped.as_ref().map_or(0, |d| d.bytes as u64);
        if meta.is_file() && meta.len() != read {
            return Err(Error::TranscriptChanged {
                path: path.clone(),
                read,
                now: meta.len(),
            });
        }
        Self::reopened(file, journal, transcript).await
    }

    /// Reads the transcript at `path` (as [`read`] does) and reopens it for appending, under
    /// the file's lock: a dropped agent's last write is waited for (up to [`WRITER_WAIT`])
    /// before anything is read, so the records read are every record written; an agent that
    /// is still alive keeps it, and this fails with [`Error::TranscriptBusy`]. A last line cut
    /// by a crash is cut from the file.
    pub async fn resume(path: &Path) -> Result<(Transcript, Self)> {
        let (t, w, ()) = Self::resume_checked(path, |_| Ok(())).await?;
        Ok((t, w))
    }

    /// [`resume`](Self::resume), with `check` run on what was read before anything in the file
    /// is changed: a transcript it refuses is left as it was.
    pub(crate) async fn resume_checked<T>(
        path: &Path,
        check: impl FnOnce(&Transcript) -> Result<T>,
    ) -> Result<(Transcript, Self, T)> {
        let (file, journal) = open_locked(path).await?;
        let t = read(path).await?;
        let checked = check(&t)?;
        let w = Self::reopened(file, journal, &t).await?;
        Ok((t, w, checked))
    }

    /// A writer appending to `file` (locked), which holds `transcript`: its damaged tail cut.
    async fn reopened(
        file: std::fs::File,
        journal: Journal,
        transcript: &Transcript,
    ) -> Result<Self> {
        let to = Arc::new(Target {
            file,
            path: transcript.path.clone(),
        });
        if transcript.dropped.is_some() {
            let (cut, len) = (Arc::clone(&to), transcript.valid_len);
            tokio::task::spawn_blocking(move || cut.file.set_len(len))
                .await
                .map_err(std::io::Error::other)
                .and_then(|cut| cut)
                .map_err(reopening(&transcript.path))?;
        }
        Ok(Self {
            journal,
            to,
            next_index: transcript.messages.len(),
            len: transcript.valid_len,
            handed: None,
            spare: Vec::new(),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.to.path
    }

    /// The index the next message record takes.
    pub fn next_index(&self) -> usize {
        self.next_index
    }

    /// Waits for the outcome of a record handed to the journal whose future was dropped
    /// before its write was known to have finished. A write that failed is cut off the file
    /// and gives its index back (so [`next_index`](Self::next_index) no longer counts it), and
    /// its error is returned. Nothing to do, and `Ok`, when no such write is pending; every
    /// record confirms the last one first.
    pub async fn confirm(&mut self) -> Result<()> {
        let Some(h) = self.handed.as_mut() else {
            return Ok(());
        };
        // Awaited in place: a confirm dropped here leaves the record for the next one.
        let done = match (&mut h.written).await {
            Ok(receipt) => {
                if receipt.line.capacity() <= SPARE_CAP {
                    self.spare = receipt.line;
                }
                receipt.result
            }
            Err(_) => Err(journal::lost()),
        };
        let Some(h) = self.handed.take() else {
            return Ok(());
        };
        match done {
            Ok(()) => {
                self.len = h.end;
                Ok(())
            }
            Err(e) => Err(self.undo(h.indexed, e)),
        }
    }

    /// Whether a record was handed to the journal and its outcome is not known yet (its future
    /// was dropped before it heard): [`confirm`](Self::confirm) waits for it.
    pub(crate) fn has_unconfirmed(&self) -> bool {
        self.handed.is_some()
    }

    /// Appends the next message (indexes count up from 0).
    ///
    /// The index is taken once the record is handed to the journal: a future dropped while
    /// the record is being written still writes it (the journal finishes every write it was
    /// given), so the next message gets the next index, and a record that could not be
    /// written gives its index back.
    pub async fn message(&mut self, message: &Message) -> Result<()> {
        let line = self.message_line(message);
        self.write_line(&line, 1).await
    }

    /// The record of `message`, which takes the next index.
    fn message_line<'a>(&self, message: &'a Message) -> MessageLine<'a> {
        MessageLine {
            kind: "message",
            index: self.next_index,
            message,
            at: now_ms(),
        }
    }

    /// Appends a usage record for one turn.
    pub async fn usage(&mut self, turn: &TurnRecord) -> Result<()> {
        let line = usage_line(turn);
        self.write_line(
            &Tagged {
                kind: "usage",
                body: &line,
            },
            0,
        )
        .await
    }

    /// [`usage`](Self::usage) for `turn`, then [`message`](Self::message) for its answer, in
    /// one write, which the agent waits for once, not twice. A failed write cuts both lines off
    /// and gives the message's index back; a crash mid-write may keep the usage line and cut
    /// the answer's (a torn last line, as between two writes).
    pub(crate) async fn usage_and_message(
        &mut self,
        turn: &TurnRecord,
        message: &Message,
    ) -> Result<()> {
        let usage = usage_line(turn);
        let usage = Tagged {
            kind: "usage",
            body: &usage,
        };
        let line = self.message_line(message);
        self.write_lines(
            |out| {
                encode_line(out, &usage)?;
                encode_line(out, &line)
            },
            1,
        )
        .await
    }

    /// Appends a stop record.
    pub async fn stop(&mut self, stop: &StopReason, usage: Usage) -> Result<()> {
        self.stop_with_error(stop, usage, None).await
    }

    /// Appends a stop record with the error the run failed with, if it did.
    pub async fn stop_with_error(
        &mut self,
        stop: &StopReason,
        usage: Usage,
        error: Option<String>,
    ) -> Result<()> {
        let line = StopLine {
            stop: stop.clone(),
            usage,
            at: Some(now_ms()),
            error,
        };
        self.write_line(
            &Tagged {
                kind: "stop",
                body: &line,
            },
            0,
        )
        .await
    }

    /// Writes one record, a line; `indexed`: how many message indexes it takes from
    /// `next_index` (1 for a message, 0 for anything else).
    async fn write_line<T: Serialize>(&mut self, record: &T, indexed: usize) -> Result<()> {
        self.write_lines(|out| encode_line(out, record), indexed)
            .await
    }

    /// Writes the lines `encode` makes as one record, which takes `indexed` message indexes.
    ///
    /// The record is handed to the journal whole, in one write, so a crash cuts at most its
    /// last line. Once handed, it is written even if this future is dropped before it hears:
    /// the indexes are taken then, and the next record first confirms it. A record whose write
    /// fails is cut off the file, every line of it, before anything else is written to it (a
    /// partial line would make every later record unreadable) and gives its indexes back.
    async fn write_lines(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
        indexed: usize,
    ) -> Result<()> {
        self.confirm().await?;
        // Into the last record's buffer, which the journal handed back.
        let mut line = std::mem::take(&mut self.spare);
        line.clear();
        encode(&mut line).map_err(|e| cannot_encode(&self.to.path, &e))?;
        let end = self.len + line.len() as u64;
        // Handed over whole: written in one piece even if this future is dropped.
        let written = self.journal.append(Arc::clone(&self.to), line, self.len);
        let h = Handed {
            end,
            indexed,
            written,
        };
        self.next_index += indexed;
        self.handed = Some(h);
        self.confirm().await
    }

    /// After a failed write (whatever it left of itself already cut off, see `journal`): the
    /// record's `indexed` message indexes given back. Returns the write's error.
    fn undo(&mut self, indexed: usize, source: std::io::Error) -> Error {
        self.next_index -= indexed;
        Error::Io {
            action: "appending to transcript",
            path: self.to.path.clone(),
            source,
        }
    }
}

/// The usage record of `turn`.
fn usage_line(turn: &TurnRecord) -> UsageLine {
    UsageLine {
        turn: turn.turn,
        fingerprint: turn.fingerprint().to_string(),
        usage: turn.usage,
        stop_reason: turn.stop_reason.as_ref().map(|s| s.as_str().to_owned()),
        tool_calls: turn.tool_calls,
        sent_at: Some(turn.sent_at_ms),
        at: Some(now_ms()),
    }
}

/// A record for the transcript at `path` that could not be encoded as JSON.
fn cannot_encode(path: &Path, e: &serde_json::Error) -> Error {
    Error::Transcript {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot encode a record: {e}"),
    }
}

/// `record` as one line of JSON, appended to `out`.
fn encode_line<T: Serialize>(out: &mut Vec<u8>, record: &T) -> serde_json::Result<()> {
    serde_json::to_writer(&mut *out, record)?;
    out.push(b'\n');
    Ok(())
}

/// Appends a stop record to the transcript at `path`, for an agent that could not write its
/// own: it panicked, or its owner dropped it past its grace. A last line cut mid-write is cut
/// off first (as [`TranscriptWriter::reopen`] does), so the file stays readable and its last
/// record says how the agent ended. The file is opened without following a symlink and never
/// created. The agent's own writer is waited for (its lock, up to [`WRITER_WAIT`]): a write it
/// was handed before it was dropped lands first, and the stop record after it.
pub async fn append_stop(path: &Path, stop: &StopReason, usage: Usage) -> Result<()> {
    append_stop_async(path, stop, usage, None, false).await
}

/// [`append_stop`], unless the transcript's last record is a stop record for the same reason
/// already: an owner's end is told once, also when an owner cut short by a shutdown writes it
/// again (on the spot) while its first write is still queued on the blocking pool. `error`:
/// why it failed (a panic's message), for the record's `error`.
pub(crate) async fn append_stop_once(
    path: &Path,
    stop: &StopReason,
    usage: Usage,
    error: Option<String>,
) -> Result<()> {
    append_stop_async(path, stop, usage, error, true).await
}

async fn append_stop_async(
    path: &Path,
    stop: &StopReason,
    usage: Usage,
    error: Option<String>,
    once: bool,
) -> Result<()> {
    let owned = path.to_path_buf();
    let stop = stop.clone();
    tokio::task::spawn_blocking(move || append_stop_on_thread(&owned, &stop, usage, error, once))
        .await
        .map_err(|e| Error::Io {
            action: "appending a stop record to transcript",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?
}

/// [`append_stop`] on the calling thread (for code that cannot wait on a runtime: a
/// supervisor dropped while the runtime shuts down).
pub fn append_stop_blocking(path: &Path, stop: &StopReason, usage: Usage) -> Result<()> {
    append_stop_on_thread(path, stop, usage, None, false)
}

/// [`append_stop_once`] on the calling thread.
pub(crate) fn append_stop_once_blocking(
    path: &Path,
    stop: &StopReason,
    usage: Usage,
    error: Option<String>,
) -> Result<()> {
    append_stop_on_thread(path, stop, usage, error, true)
}

fn append_stop_on_thread(
    path: &Path,
    stop: &StopReason,
    usage: Usage,
    error: Option<String>,
    once: bool,
) -> Result<()> {
    let record = Tagged {
        kind: "stop",
        body: &StopLine {
            stop: stop.clone(),
            usage,
            at: Some(now_ms()),
            error,
        },
    };
    let mut line = Vec::new();
    encode_line(&mut line, &record).map_err(|e| cannot_encode(path, &e))?;
    let io = |source| Error::Io {
        action: "appending a stop record to transcript",
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let mut f = opts.open(path).map_err(io)?;
    // The agent's own writer lets go once its last write is finished: only then is the file's
    // last line what it will stay.
    if is_regular(&f, path)? {
        lock_for_writing_blocking(&f, path)?;
    }
    /// What a stop record's line says, read back.
    #[derive(Deserialize)]
    struct Told {
        stop: StopReason,
    }
    let told = |last: &[u8]| {
        once && last.starts_with(STOP_PREFIX)
            && serde_json::from_slice::<Told>(last).is_ok_and(|t| t.stop == *stop)
    };
    append_after_last_line(&mut f, &line, told).map_err(io)
}

/// How every stop record's line begins.
const STOP_PREFIX: &[u8] = br#"{"type":"stop""#;

/// Cuts whatever follows the last newline of `f`, then appends `line` — unless `done` says the
/// last complete line (its first bytes, up to a few hundred) already says it.
fn append_after_last_line(
    f: &mut std::fs::File,
    line: &[u8],
    done: impl Fn(&[u8]) -> bool,
) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let len = f.metadata()?.len();
    let mut end = len;
    let mut buf = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start)
            .unwrap_or(buf.len())
            .min(buf.len());
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|b| *b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if end != len {
        f.set_len(end)?;
    }
    // The last complete line: its start within the 512 bytes before `end`, if it is that short
    // (a stop record is).
    let from = end.saturating_sub(512);
    let n = usize::try_from(end - from).unwrap_or(0).min(buf.len());
    if n > 1 {
        f.seek(SeekFrom::Start(from))?;
        f.read_exact(&mut buf[..n])?;
        let body = &buf[..n - 1];
        let last = match body.iter().rposition(|b| *b == b'\n') {
            Some(i) => Some(&body[i + 1..]),
            None if from == 0 => Some(body),
            None => None,
        };
        if last.is_some_and(&done) {
            return Ok(());
        }
    }
    f.seek(SeekFrom::Start(end))?;
    f.write_all(line)?;
    f.flush()
}

/// The last line of a transcript, cut by a crash and left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedTail {
    /// Its 1-based line number.
    pub line: usize,
    /// How many bytes it had.
    pub bytes: usize,
}

/// A transcript as read back.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The file.
    pub path: PathBuf,
    /// The header.
    pub header: TranscriptHeader,
    /// Every message, in order (after [`read`], the inherited ones first).
    pub messages: Vec<Message>,
    /// How many of `messages` were read from the parent's transcript (see
    /// [`TranscriptHeader::inherited_messages`]); zero until [`read`] resolves them.
    pub inherited: usize,
    /// When each of this file's own message records was written (ms since the Unix epoch;
    /// `None` in older files): one per message after the inherited ones.
    pub message_at: Vec<Option<u64>>,
    /// Every usage record, in order.
    pub turns: Vec<UsageLine>,
    /// Every stop record, in order.
    pub stops: Vec<StopLine>,
    /// A cut-off last line that was left out.
    pub dropped: Option<DroppedTail>,
    /// The length of the file up to the last complete record.
    pub valid_len: u64,
}

impl Transcript {
    /// The conversation as cache-safe parameters: byte for byte what the agent last sent.
    pub fn params(&self) -> CacheSafeParams {
        self.header.prefix.params(self.messages.clone())
    }

    /// The text of the last assistant message, if any.
    pub fn last_assistant_text(&self) -> Option<String> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == forkhive_core::Role::Assistant)
            .map(Message::text)
    }
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(rename = "type")]
    kind: String,
    index: Option<usize>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    at: Option<u64>,
}

/// How many transcripts deep an inheritance chain may go before it is called malformed.
const MAX_INHERITANCE: usize = 16;

/// Reads the transcript at `path`, with the messages it inherits from its parent's transcript
/// (a fork child's) read from there and checked against its fingerprint.
///
/// Only a regular file is read (a FIFO would hold a thread for good, a device may never end);
/// a parent's transcript, found through a child's `parent_id`, is never read through a
/// symlink, as the writer never writes through one.
pub async fn read(path: &Path) -> Result<Transcript> {
    read_chain(path, Vec::new(), None).await
}

/// [`read`], for the transcript `below` (the ids of the transcripts whose references led
/// here, the one asked for first) inherit from, reached as `parent` (its task id); empty and
/// `None` for the one asked for.
fn read_chain(
    path: &Path,
    below: Vec<String>,
    parent: Option<String>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Transcript>> + Send + '_>> {
    Box::pin(async move {
        let bytes = read_regular(path, parent.is_none()).await?;
        let mut t = parse(path, &bytes)?;
        let Some(n) = t.header.inherited_messages else {
            check_header(path, &t)?;
            return Ok(t);
        };
        let bad = |message: String| Error::Transcript {
            path: path.to_path_buf(),
            line: 1,
            message,
        };
        // Known by the id it was reached by (its file's name), else by its header's.
        let mut below = below;
        below.push(parent.unwrap_or_else(|| t.header.agent_id.clone()));
        if below.len() > MAX_INHERITANCE {
            return Err(bad(format!(
                "inherits through more than {MAX_INHERITANCE} transcripts"
            )));
        }
        // The parent's file is named by its task id, never by a path the file holds.
        let parent: TaskId = t
            .header
            .parent_id
            .as_deref()
            .ok_or_else(|| bad("inherits messages but names no parent".to_owned()))?
            .parse()
            .map_err(|e| bad(format!("bad parent_id: {e}")))?;
        let parent_id = parent.to_string();
        if let Some(first) = below.iter().position(|id| *id == parent_id) {
            return Err(bad(format!(
                "its parents loop: {} → {parent_id}",
                below[first..].join(" → ")
            )));
        }
        let parent_path = path
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(format!("{parent}.jsonl"));
        let from = read_chain(&parent_path, below, Some(parent_id))
            .await
            .map_err(|e| {
                bad(format!(
                    "inherits {n} messages from its parent's transcript, which cannot be used: {}",
                    forkhive_core::error::chain(&e)
                ))
            })?;
        if from.messages.len() < n {
            return Err(bad(format!(
                "inherits {n} messages from {}, which holds {}",
                parent_path.display(),
                from.messages.len()
            )));
        }
        let mut messages = from.messages;
        messages.truncate(n);
        let inherited = t.header.prefix.params(messages.clone());
        let expected = t
            .header
            .inherited_fingerprint
            .as_deref()
            .unwrap_or(&t.header.prefix_fingerprint);
        if inherited.fingerprint().total().to_string() != expected {
            return Err(bad(format!(
                "the {n} messages inherited from {} do not match this transcript's prefix \
                 fingerprint: the parent's transcript was changed",
                parent_path.display()
            )));
        }
        messages.append(&mut t.messages);
        t.messages = messages;
        t.inherited = n;
        Ok(t)
    })
}

/// Refuses a header whose parts before the messages are not those its `prefix_fingerprint`
/// was taken of (with the messages the agent started with, the first of its file's): the
/// header was edited, and a resumed agent would send what the edit says while the cache it
/// left holds what it sent (a fork child's header is checked with what it inherits instead).
/// One digest per message, each taken once: O(the file).
fn check_header(path: &Path, t: &Transcript) -> Result<()> {
    let bad = |message: String| Error::Transcript {
        path: path.to_path_buf(),
        line: 1,
        message,
    };
    let h = &t.header;
    if h.model != h.prefix.model {
        return Err(bad(format!(
            "the header's model `{}` is not its prefix's `{}`: the header was changed since it \
             was written",
            h.model, h.prefix.model
        )));
    }
    let mut fp = h.prefix.params(Vec::new()).fingerprint().clone();
    if fp.total().to_string() == h.prefix_fingerprint {
        return Ok(());
    }
    for m in &t.messages {
        fp = fp.extend(std::slice::from_ref(m));
        if fp.total().to_string() == h.prefix_fingerprint {
            return Ok(());
        }
    }
    if t.dropped.is_some() {
        // A crash while the agent's first messages were being written cut the file.
        return Err(bad(
            "the file holds fewer messages than the agent started with: it was cut before they \
             were all written, or changed since"
                .to_owned(),
        ));
    }
    Err(bad(
        "the header's model, system prompt, contexts or tools, or the messages the agent \
         started with, are not those its prefix_fingerprint was taken of: the file was changed \
         since it was written"
            .to_owned(),
    ))
}

/// The bytes of the transcript at `path`, a regular file; through a symlink only when
/// `follow` (the file a caller named, not one a reference led to). On Unix: elsewhere links
/// are followed and only the file's kind is checked.
async fn read_regular(path: &Path, follow: bool) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        action: "reading transcript",
        path: path.to_path_buf(),
        source,
    };
    let not = |what: String| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, what));
    let mut opts = tokio::fs::OpenOptions::new();
    opts.read(true);
    // Opened without blocking: a FIFO opened for reading would wait for a writer.
    #[cfg(unix)]
    opts.custom_flags(
        libc::O_NONBLOCK | libc::O_NOCTTY | if follow { 0 } else { libc::O_NOFOLLOW },
    );
    #[cfg(not(unix))]
    let _ = follow;
    let file = match opts.open(path).await {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if !follow && e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not(
                "a symlink: a parent's transcript is read only from a file of its own".to_owned(),
            ));
        }
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().await.map_err(io)?;
    if !meta.is_file() {
        return Err(not(format!(
            "not a regular file ({})",
            crate::base::files::file_kind(&meta)
        )));
    }
    // Read on the blocking pool with std's reader, whose allocations fail with an error (a
    // huge sparse file is `OutOfMemory`, not an abort).
    let mut file = file.into_std().await;
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map(|_| bytes)
    })
    .await
    .map_err(|e| io(std::io::Error::other(e)))?
    .map_err(io)
}

/// Parses transcript `bytes` (read from `path`, which errors name). A transcript that inherits
/// its first messages from its parent's holds only its own here; [`read`] resolves the rest.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Transcript> {
    let bad = |line: usize, message: String| Error::Transcript {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut header: Option<TranscriptHeader> = None;
    let mut messages = Vec::new();
    let mut message_at = Vec::new();
    let mut turns = Vec::new();
    let mut stops = Vec::new();
    let mut dropped = None;
    let mut offset = 0usize;
    let mut valid_len = 0usize;
    let mut line_no = 0usize;
    while offset < bytes.len() {
        line_no += 1;
        let rest = &bytes[offset..];
        let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
            // No newline: the write of this record never finished.
            dropped = Some(DroppedTail {
                line: line_no,
                bytes: rest.len(),
            });
            break;
        };
        let line = &rest[..nl];
        offset += nl + 1;
        let text = std::str::from_utf8(line)
            .map_err(|e| bad(line_no, format!("not UTF-8 at byte {}", e.valid_up_to())))?;
        let probe: Probe<'_> = serde_json::from_str(text)
            .map_err(|e| bad(line_no, format!("not a JSON record: {e}")))?;
        match (probe.kind.as_str(), header.is_some()) {
            ("header", false) => {
                let h: TranscriptHeader = serde_json::from_str(text)
                    .map_err(|e| bad(line_no, format!("bad header: {e}")))?;
                if h.version != TRANSCRIPT_VERSION {
                    return Err(bad(
                        line_no,
                        format!(
                            "transcript version {} is not supported (this build reads version \
                             {TRANSCRIPT_VERSION})",
                            h.version
                        ),
                    ));
                }
                header = Some(h);
            }
            ("header", true) => return Err(bad(line_no, "a second header record".to_owned())),
            (kind, false) => {
                return Err(bad(
                    line_no,
                    format!("the first record must be the header, found `{kind}`"),
                ));
            }
            ("message", true) => {
                let index = probe
                    .index
                    .ok_or_else(|| bad(line_no, "message record without `index`".to_owned()))?;
                let expected = header
                    .as_ref()
                    .and_then(|h| h.inherited_messages)
                    .unwrap_or(0)
                    .checked_add(messages.len())
                    .ok_or_else(|| {
                        bad(
                            1,
                            "the header's `inherited_messages` is out of range".to_owned(),
                        )
                    })?;
                if index != expected {
                    return Err(bad(
                        line_no,
                        format!(
                            "message index {index} where {expected} was expected: records are \
                             missing or repeated"
                        ),
                    ));
                }
                let raw = probe
                    .message
                    .ok_or_else(|| bad(line_no, "message record without `message`".to_owned()))?;
                let m = Message::from_json(raw.get())
                    .map_err(|e| bad(line_no, format!("bad message: {e}")))?;
                messages.push(m);
                message_at.push(probe.at);
            }
            ("usage", true) => turns.push(
                serde_json::from_str::<UsageLine>(text)
                    .map_err(|e| bad(line_no, format!("bad usage record: {e}")))?,
            ),
            ("stop", true) => stops.push(
                serde_json::from_str::<StopLine>(text)
                    .map_err(|e| bad(line_no, format!("bad stop record: {e}")))?,
            ),
            (other, true) => {
                return Err(bad(line_no, format!("unknown record type `{other}`")));
            }
        }
        valid_len = offset;
    }
    let header =
        header.ok_or_else(|| bad(1, "the transcript has no complete header record".to_owned()))?;
    Ok(Transcript {
        path: path.to_path_buf(),
        header,
        messages,
        inherited: 0,
        message_at,
        turns,
        stops,
        dropped,
        valid_len: valid_len as u64,
    })
}

/// How many trips to the files of `dir` its journal has been handed (a record, a turn's usage
/// record and answer together, a new file and its header), for the tests of how often an
/// agent waits on its file.
#[cfg(test)]
pub(crate) fn trips_in(dir: &Path) -> usize {
    Journal::for_dir(dir).jobs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::ContentBlock;
    use forkhive_transport::ModelStop;

    /// A writer of a new transcript in `dir`.
    async fn new_writer(dir: &Path) -> TranscriptWriter {
        TranscriptWriter::create(dir, &header()).await.unwrap()
    }

    /// The header of a new main agent's transcript.
    fn header() -> TranscriptHeader {
        let params = CacheSafeParams::builder("m")
            .system_block("You look.")
            .build();
        TranscriptHeader {
            version: TRANSCRIPT_VERSION,
            agent_id: TaskId::generate(forkhive_core::TaskKind::Agent).to_string(),
            parent_id: None,
            depth: 0,
            kind: AgentKind::Main,
            query_source: "sdk".to_owned(),
            definition: None,
            model: "m".to_owned(),
            prefix_fingerprint: params.fingerprint().total().to_string(),
            prefix: PrefixRecord::of(&params),
            permission_mode: None,
            max_turns: None,
            inherited_messages: None,
            inherited_fingerprint: None,
            at: Some(now_ms()),
        }
    }

    /// A turn answered with 5 output tokens.
    fn turn() -> TurnRecord {
        TurnRecord {
            turn: 1,
            prefix: CacheSafeParams::builder("m").build(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            stop_reason: Some(ModelStop::EndTurn),
            tool_calls: 0,
            sent_at_ms: now_ms(),
        }
    }

    /// The kind of each record in the file at `path`, in order.
    fn kinds(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["type"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    /// A new transcript and its header are one trip to the directory's journal (they were
    /// two: the file made, then the header written), and the writer holds the file's lock.
    #[tokio::test]
    async fn a_new_transcript_and_its_header_are_one_trip() {
        let dir = tempfile::tempdir().unwrap();
        // The journal's count starts with its first writer: taken before, it is kept alive.
        let journal = Journal::for_dir(dir.path());
        let w = new_writer(dir.path()).await;
        assert_eq!(journal.jobs(), 1);
        assert_eq!(kinds(w.path()), ["header"]);
        #[cfg(unix)]
        {
            let file = std::fs::File::open(w.path()).unwrap();
            let locked = crate::base::files::try_lock_once(&file).unwrap();
            assert!(!locked, "the writer holds the file's lock");
        }
        let path = w.path().to_path_buf();
        drop(w);
        let t = read(&path).await.unwrap();
        assert!(t.messages.is_empty() && t.turns.is_empty() && t.stops.is_empty());
        assert_eq!(t.valid_len, std::fs::metadata(&path).unwrap().len());
    }

    /// A new transcript whose lock another handle held when it was made: the writer waits for
    /// the lock, then writes the header, as a reopen waits.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_transcript_whose_lock_was_held_gets_its_header_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let file = no_follow(true).open(&path).unwrap();
        let holder = std::fs::File::open(&path).unwrap();
        assert!(crate::base::files::try_lock_once(&holder).unwrap());
        let header = header();
        let mut first = Vec::new();
        encode_line(
            &mut first,
            &Tagged {
                kind: "header",
                body: &header,
            },
        )
        .unwrap();
        let made = Made::with_first(file, first);
        assert!(made.first.0.is_none(), "not written while the lock is held");
        let let_go = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(holder);
        });
        let w = TranscriptWriter::from_made(made, path.clone(), Journal::for_dir(dir.path()), 0)
            .await
            .unwrap();
        let_go.await.unwrap();
        assert_eq!(kinds(&path), ["header"]);
        assert_eq!(w.next_index(), 0);
        drop(w);
        assert_eq!(read(&path).await.unwrap().header.agent_id, header.agent_id);
    }

    /// A usage record and an answer written together: one write of two lines, the usage
    /// record first; the answer takes the next index, and both read back.
    #[tokio::test]
    async fn a_usage_record_and_answer_are_one_write_of_two_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = new_writer(dir.path()).await;
        let before = trips_in(dir.path());
        let answer = Message::assistant(vec![ContentBlock::text("seen it")]);
        w.usage_and_message(&turn(), &answer).await.unwrap();
        assert_eq!(trips_in(dir.path()) - before, 1);
        assert_eq!(w.next_index(), 1);
        let path = w.path().to_path_buf();
        drop(w);
        assert_eq!(kinds(&path), ["header", "usage", "message"]);
        let t = read(&path).await.unwrap();
        assert_eq!(t.messages, [answer]);
        assert_eq!(t.turns.len(), 1);
        assert_eq!(t.turns[0].usage.output_tokens, 5);
    }

    /// A usage record and answer the device refuses: one error, and the index the answer
    /// took is given back (the next message takes it).
    #[tokio::test]
    async fn a_refused_usage_record_and_answer_give_the_answers_index_back() {
        if !Path::new("/dev/full").exists() {
            eprintln!("skipped: this system has no /dev/full");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut w = new_writer(dir.path()).await;
        w.message(&Message::user_text("look")).await.unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let mut full = read(&path).await.unwrap();
        full.path = "/dev/full".into();
        let mut w = TranscriptWriter::reopen(&full).await.unwrap();
        assert_eq!(w.next_index(), 1);
        let err = w
            .usage_and_message(
                &turn(),
                &Message::assistant(vec![ContentBlock::text("lost")]),
            )
            .await
            .unwrap_err();
        match &err {
            Error::Io { action, source, .. } => {
                assert_eq!(*action, "appending to transcript");
                assert_eq!(source.raw_os_error(), Some(28), "{err}");
            }
            other => panic!("not an I/O error: {other}"),
        }
        assert_eq!(w.next_index(), 1);
        assert!(!w.has_unconfirmed());
    }
}
