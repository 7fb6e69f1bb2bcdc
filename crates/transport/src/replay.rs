//! [`ReplayBackend`]: answers from a directory written by
//! [`RecordingBackend`](crate::recording::RecordingBackend), offline.
//!
//! Record a run against a real API once, commit the directory, and replay it in CI: every
//! request the code under test sends is matched to a recording by its
//! [fingerprint](crate::Request::fingerprint) — model, thinking, tools, system prompt, system
//! and user context, and all its messages — and answered with the recorded response or error.
//! The per-call settings (`max_tokens`, `temperature`, …) are recorded but not matched.
//!
//! - Requests may arrive in another order than they were recorded (parallel fork children):
//!   each is matched by fingerprint, not by position.
//! - Each recording answers once. A request recorded twice (a retry, the same question asked
//!   again) is answered by its recordings in sequence order.
//! - A request no unused recording matches is [`Error::NoRecording`], naming the closest
//!   recording — the one sharing the longest prefix with the request, by
//!   [`PrefixFingerprint::diff`] — and the first difference:
//!   `no recording matches request 3: closest is 0002-child-1.json, which differs at
//!   messages[4] changed`.
//! - Streaming replays the recorded answer as events ([`events_for`], text in 16-character
//!   chunks; a tool call cut off at `max_tokens` streams its recorded partial input).
//! - [`ReplayBackend::remaining`] lists the recordings not used yet, so a test can assert the
//!   run asked for everything that was recorded.
//!
//! ```
//! use forkhive_core::{CacheSafeParams, Message};
//! use forkhive_transport::recording::RecordingBackend;
//! use forkhive_transport::replay::ReplayBackend;
//! use forkhive_transport::{AnthropicCodec, Backend, Request, ScriptedBackend};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir()?;
//! let params = CacheSafeParams::builder("claude-sonnet-4-5").system_block("Be brief.").build();
//! let ask = |q: &str| Request::new(params.clone(), vec![Message::user_text(q)]);
//!
//! // Once, against the real API (here a scripted stand-in for `HttpBackend`):
//! let live = ScriptedBackend::from_texts(["4", "Paris"]);
//! let recorder = RecordingBackend::new(live, dir.path(), Box::new(AnthropicCodec::default()))?;
//! recorder.send(&ask("2 + 2?")).await?;
//! recorder.send(&ask("Capital of France?")).await?;
//!
//! // In CI, offline, in any order:
//! let replay = ReplayBackend::open(dir.path())?;
//! assert_eq!(replay.send(&ask("Capital of France?")).await?.message.text(), "Paris");
//! assert_eq!(replay.send(&ask("2 + 2?")).await?.message.text(), "4");
//! assert!(replay.remaining().is_empty());
//!
//! let err = replay.send(&ask("3 + 3?")).await.unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "no recording matches request 3: closest is 0001-request.json, which differs at messages[0] changed"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use forkhive_core::{CacheBreak, CacheSafeParams, Change, ContentBlock, Digest, PrefixFingerprint};
use serde::Deserialize;

use crate::backend::{Backend, EventStream};
use crate::error::{Error, Result};
use crate::recording::{ErrorRecord, FORMAT, Section};
use crate::request::{Request, Response, StreamEvent, events_for};

/// One loaded recording.
struct Recording {
    /// The file name (`0002-child-1.json`).
    name: String,
    /// The recorded request as one cache-safe prefix (for `diff`).
    params: CacheSafeParams,
    outcome: Outcome,
}

enum Outcome {
    Response {
        response: Response,
        cut_tool_inputs: BTreeMap<String, String>,
    },
    Error(ErrorRecord),
}

#[derive(Debug)]
struct State {
    used: Vec<bool>,
    requests: usize,
}

/// A backend that answers from the recordings in a directory; see the [module docs](self).
pub struct ReplayBackend {
    dir: PathBuf,
    recordings: Vec<Recording>,
    state: Mutex<State>,
}

impl ReplayBackend {
    /// Loads every recording in `dir` (files named `<seq>-<label>.json`; other files are
    /// ignored), in sequence order. Reads synchronously.
    ///
    /// A directory or file that cannot be read is [`Error::ReplayRead`]; a file that is not a
    /// complete recording of this format is [`Error::MalformedRecording`] naming it.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        let read_err = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::ReplayRead { path, source }
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read_err(&dir))? {
            let entry = entry.map_err(read_err(&dir))?;
            if let Some(name) = entry.file_name().to_str()
                && let Some(seq) = sequence_number(name)
            {
                names.push((seq, name.to_owned()));
            }
        }
        names.sort();
        let metas: std::collections::HashSet<&str> = names
            .iter()
            .filter_map(|(_, n)| n.strip_suffix(META))
            .collect();
        let mut recordings = Vec::with_capacity(names.len());
        for (_, name) in &names {
            // A recording is its metadata (format 2) with the body beside it, or one file
            // whose body carries a `forkhive` key (format 1).
            let (body_name, meta) = match name.strip_suffix(META) {
                Some(stem) => (format!("{stem}.json"), true),
                None if metas.contains(name.trim_end_matches(".json")) => continue,
                None => (name.clone(), false),
            };
            let path = dir.join(name);
            let bytes = std::fs::read(&path).map_err(read_err(&path))?;
            let loaded = if meta {
                load_meta(body_name, &bytes).and_then(|(recording, body_sha256)| {
                    check_body(&dir.join(&recording.name), body_sha256.as_deref())?;
                    Ok(recording)
                })
            } else {
                load(body_name, &bytes)
            };
            recordings.push(loaded.map_err(|detail| Error::MalformedRecording {
                path: path.clone(),
                detail,
            })?);
        }
        Ok(Self {
            dir,
            state: Mutex::new(State {
                used: vec![false; recordings.len()],
                requests: 0,
            }),
            recordings,
        })
    }

    /// The directory the recordings were loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many recordings were loaded.
    pub fn len(&self) -> usize {
        self.recordings.len()
    }

    /// Whether the directory held no recordings.
    pub fn is_empty(&self) -> bool {
        self.recordings.is_empty()
    }

    /// The file names of the recordings no request has used yet, in sequence order.
    pub fn remaining(&self) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.recordings
            .iter()
            .zip(&state.used)
            .filter(|(_, used)| !**used)
            .map(|(r, _)| r.name.clone())
            .collect()
    }

    /// The first unused recording matching `request`, now marked used.
    fn take(&self, request: &Request) -> Result<&Recording> {
        let fingerprint = request.fingerprint();
        let total = fingerprint.total();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.requests += 1;
        let found = self
            .recordings
            .iter()
            .zip(&state.used)
            .position(|(r, used)| !*used && total_of(r) == total);
        match found {
            Some(i) => {
                state.used[i] = true;
                Ok(&self.recordings[i])
            }
            None => Err(self.no_match(state.requests, &fingerprint, &state.used)),
        }
    }

    fn no_match(&self, request: usize, fp: &PrefixFingerprint, used: &[bool]) -> Error {
        let error = |closest: Option<&str>, detail: String| Error::NoRecording {
            request,
            closest: closest.map(str::to_owned),
            detail,
        };
        let same: Vec<&str> = self
            .recordings
            .iter()
            .filter(|r| total_of(r) == fp.total())
            .map(|r| r.name.as_str())
            .collect();
        if let [first, rest @ ..] = same.as_slice() {
            let detail = match rest.len() {
                0 => format!("{first} matches it but was already used"),
                n => format!("{first} (and {n} more) match it but were already used"),
            };
            return error(Some(first), detail);
        }
        let closest = self
            .recordings
            .iter()
            .zip(used)
            .enumerate()
            .map(|(i, (r, used))| {
                let theirs = r.params.fingerprint();
                // `None`: the request extends the recording, so it has a message more.
                let brk = theirs.diff(fp).unwrap_or(CacheBreak::Message {
                    index: theirs.message_count(),
                    change: Change::Added,
                });
                (rank(&brk), !*used, std::cmp::Reverse(i), r, brk)
            })
            .max_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        match closest {
            Some((.., r, brk)) => error(
                Some(&r.name),
                format!("closest is {}, which differs at {brk}", r.name),
            ),
            None => error(None, format!("{} holds no recordings", self.dir.display())),
        }
    }
}

fn total_of(r: &Recording) -> Digest {
    r.params.fingerprint().total()
}

/// How far into the request a break lies, in the provider's render order: a later break
/// means a longer shared prefix.
fn rank(brk: &CacheBreak) -> (u8, usize) {
    match *brk {
        CacheBreak::Model => (0, 0),
        CacheBreak::Tool { index, .. } => (1, index),
        CacheBreak::SystemPrompt { block, .. } => (2, block),
        CacheBreak::SystemContext { entry, .. } => (3, entry),
        CacheBreak::Thinking | CacheBreak::ToolChoice | CacheBreak::Effort => (4, 0),
        CacheBreak::UserContext { entry, .. } => (5, entry),
        CacheBreak::Message { index, .. } => (6, index),
        _ => (0, 0),
    }
}

/// The `seq` of a file named `<seq>-<label>.json`.
fn sequence_number(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".json")?;
    let (seq, _) = stem.split_once('-')?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// The suffix of a recording's metadata file (format 2).
const META: &str = ".meta.json";

/// Checks a format-2 recording's body file: there, and the bytes recorded when the metadata
/// says which (`body_sha256`). The body is what `curl` and `diff` are pointed at, so one that a
/// formatter, a merge or a cut changed must not pass a replay that never reads it.
fn check_body(path: &Path, body_sha256: Option<&str>) -> std::result::Result<(), String> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let body = std::fs::read(path).map_err(|e| format!("its body {name} cannot be read: {e}"))?;
    if let Some(want) = body_sha256 {
        let found = Digest::of(&body).to_string();
        if found != want {
            return Err(format!(
                "its body {name} is not the one recorded (SHA-256 {} where the recording says \
                 {}): it was edited or cut since; record again, or delete `body_sha256` to \
                 accept it",
                short(&found),
                short(want)
            ));
        }
    }
    Ok(())
}

/// Parses a format-2 metadata file, with the body digest it records; the error is the detail
/// of [`Error::MalformedRecording`].
fn load_meta(
    name: String,
    bytes: &[u8],
) -> std::result::Result<(Recording, Option<String>), String> {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<u32>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON object: {e}"))?;
    check_format(probe.format, FORMAT)?;
    let mut section: Section =
        serde_json::from_slice(bytes).map_err(|e| format!("bad recording metadata: {e}"))?;
    let body_sha256 = section.body_sha256.take();
    Ok((from_section(name, section)?, body_sha256))
}

/// Parses a format-1 recording (the body with a `forkhive` key); the error is the detail
/// of [`Error::MalformedRecording`].
fn load(name: String, bytes: &[u8]) -> std::result::Result<Recording, String> {
    #[derive(Deserialize)]
    struct Probe {
        forkhive: Option<ProbeSection>,
    }
    #[derive(Deserialize)]
    struct ProbeSection {
        format: Option<u32>,
    }
    #[derive(Deserialize)]
    struct File {
        forkhive: Section,
    }

    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON object: {e}"))?;
    let Some(section) = probe.forkhive else {
        return Err(format!(
            "no `forkhive` section and no `{}` beside it: the file holds only a request \
             body, so there is nothing to replay",
            name.trim_end_matches(".json").to_owned() + META
        ));
    };
    check_format(section.format, 1)?;
    let section = serde_json::from_slice::<File>(bytes)
        .map_err(|e| format!("bad `forkhive` section: {e}"))?
        .forkhive;
    from_section(name, section)
}

fn check_format(found: Option<u32>, want: u32) -> std::result::Result<(), String> {
    match found {
        Some(n) if n == want => Ok(()),
        Some(n) => Err(format!(
            "recording format {n} is not supported here (this build reads format {FORMAT} in \
             `<seq>-<label>.meta.json` files, and format 1 in the body's `forkhive` key)"
        )),
        None => Err("the recording metadata has no `format`".to_owned()),
    }
}

/// A recording from its metadata.
fn from_section(name: String, section: Section) -> std::result::Result<Recording, String> {
    let outcome = match (section.response, section.error) {
        (Some(r), None) => Outcome::Response {
            response: r.to_response(),
            cut_tool_inputs: r.cut_tool_inputs,
        },
        (None, Some(e)) => Outcome::Error(e),
        (Some(_), Some(_)) => return Err("it holds both a `response` and an `error`".to_owned()),
        (None, None) => {
            return Err(
                "it holds no `response` or `error`: the recorded run stopped \
                        before the answer was complete"
                    .to_owned(),
            );
        }
    };
    let params = section.request.params();
    if let Some(recorded) = &section.fingerprint {
        let rebuilt = params.fingerprint().total().to_string();
        if recorded.total != rebuilt {
            return Err(format!(
                "its request fingerprints as {} but the recording says {}: the request was \
                 edited (delete `fingerprint` to accept the edit), or recorded by a forkhive \
                 that fingerprints differently",
                short(&rebuilt),
                short(&recorded.total)
            ));
        }
    }
    Ok(Recording {
        name,
        params,
        outcome,
    })
}

fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// The events of `response`, with a cut-off tool call streaming its recorded partial input.
fn replay_events(response: &Response, cut: &BTreeMap<String, String>) -> Vec<StreamEvent> {
    let events = events_for(response, 16);
    if cut.is_empty() {
        return events;
    }
    // Block index -> the partial input of the cut-off tool call there.
    let partial: BTreeMap<usize, &String> = response
        .message
        .content
        .iter()
        .enumerate()
        .filter_map(|(i, block)| match block {
            ContentBlock::ToolUse { id, .. } => cut.get(id).map(|json| (i, json)),
            _ => None,
        })
        .collect();
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        match &event {
            StreamEvent::InputJsonDelta { index, .. } if partial.contains_key(index) => continue,
            StreamEvent::BlockStop { index } => {
                if let Some(json) = partial.get(index) {
                    out.push(StreamEvent::InputJsonDelta {
                        index: *index,
                        partial_json: (*json).clone(),
                    });
                    // A cut-off call never got its block stop: replay it so.
                    continue;
                }
            }
            _ => {}
        }
        out.push(event);
    }
    out
}

impl fmt::Debug for ReplayBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBackend")
            .field("dir", &self.dir)
            .field("recordings", &self.recordings.len())
            .field("remaining", &self.remaining().len())
            .finish()
    }
}

// `answers_whole` stays `false`: a recorded answer that cut a tool call off at `max_tokens`
// comes back whole from `send` with the call's input reset, and only `stream` replays the
// partial input the agent loop needs to see the cut.
#[async_trait]
impl Backend for ReplayBackend {
    async fn send(&self, request: &Request) -> Result<Response> {
        match &self.take(request)?.outcome {
            Outcome::Response { response, .. } => Ok(response.clone()),
            Outcome::Error(e) => Err(e.to_error()),
        }
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        match &self.take(request)?.outcome {
            Outcome::Response {
                response,
                cut_tool_inputs,
            } => {
                let events = replay_events(response, cut_tool_inputs);
                Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
            }
            Outcome::Error(e) => Err(e.to_error()),
        }
    }
}
