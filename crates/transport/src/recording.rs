//! [`RecordingBackend`]: writes every request it forwards, and its answer, to a directory.
//!
//! For users chasing a cache break (`diff` two recordings and the first differing byte is the
//! culprit), for tests, and for [`ReplayBackend`](crate::replay::ReplayBackend), which answers
//! from such a directory offline. Files are named `<seq>-<label>.json`, with `seq` counting
//! from 1 (four digits) and `label` the request's label reduced to `[A-Za-z0-9_-]` (default
//! `request`). Each file is created exclusively: an existing file — or a symlink planted at
//! that path — is never followed or overwritten; the write fails instead.
//!
//! ## The files (format 2)
//!
//! Each request is two files:
//!
//! - `<seq>-<label>.json`: the request body exactly as `codec` encodes it — the bytes the
//!   provider receives, nothing added — so it can be sent again as it is (`curl --data @…`),
//!   and `diff`ing two recordings stops at the first byte the provider saw differently;
//! - `<seq>-<label>.meta.json`: one JSON object with everything else:
//!
//! ```text
//! {"format":2,"seq":2,"label":"child-1","wire":"anthropic","stream":false,"fingerprint":{…},"request":{…},"response":{…}}
//! ```
//!
//! | field | what it holds |
//! | --- | --- |
//! | `format` | `2` (format 1 put this object in the body, under a `forkhive` key; [`ReplayBackend`](crate::replay::ReplayBackend) still reads it) |
//! | `seq`, `label` | the sequence number, and the request's label as given (or `null`) |
//! | `wire`, `stream` | the codec's wire format (`anthropic`, `openai`) and whether the answer was streamed |
//! | `body_sha256` | hex SHA-256 of the body file: replay refuses a body that is not the one recorded |
//! | `fingerprint` | hex SHA-256 digests of the whole request — prefix and suffix messages as one prefix, see [`Request::fingerprint`] — in `total`, one per dimension in `tools` (with model and thinking), `system_prompt`, `system_context`, `user_context` and `messages`, with `message_count`; and `prefix_total`, the cache-safe prefix alone |
//! | `request` | `model`, `thinking`, `system` (rendered blocks), `system_context` and `user_context` (`[key, value]` pairs in order), `tools` (definitions, schemas byte for byte), `messages` (the prefix and the suffix as one list, `tool_use.input` byte for byte), `prefix_messages` (how many of them are the cache-safe prefix), `settings` (`max_tokens`, `temperature`, `stop_sequences`, `tool_choice`, `thinking`, `prompt_cache_key`) |
//! | `response` | the answer: `message`, `stop_reason` (Anthropic's spelling), `usage`, `id`, `model`, and `cut_tool_inputs` (tool call id → the partial input JSON of a call cut off at `max_tokens`, only when there is one) |
//! | `error` | instead of `response` when the call failed: `kind` (`rate_limited`, `overloaded`, `invalid_request`, `timeout`, …) and that error's fields (`status`, `message`, `retry_after_ms`, …) |
//!
//! The body and the metadata up to and including `request` are written and flushed before the
//! request is forwarded, so a run that hangs or dies still leaves them; the metadata is
//! rewritten with `response` or `error` when the answer is complete — for a stream, at its `message_stop`, its first error, or its early
//! end. A streamed answer is recorded as the [`Response`] its events fold into (with
//! [`ResponseBuilder::finish_cut_off`]).

use std::collections::BTreeMap;
use std::fmt;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{CacheSafeParams, Dimension, Message, ThinkingConfig, ToolDefinition, Usage};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::backend::{Backend, EventStream};
use crate::codec::{Codec, push_json};
use crate::error::{Error, Result};
use crate::request::{
    BlockStart, ModelStop, Request, RequestSettings, Response, ResponseBuilder, StreamEvent,
    ToolChoice,
};

/// The recording format this build writes and reads.
pub(crate) const FORMAT: u32 = 2;

/// Records each request body (as `codec` encodes it) before forwarding the request, and the
/// answer or error after; see the [module docs](self) for the file format.
pub struct RecordingBackend<B> {
    inner: B,
    dir: PathBuf,
    codec: Box<dyn Codec>,
    seq: AtomicU64,
}

impl<B: Backend> RecordingBackend<B> {
    /// Records into `dir`, which must exist, be a directory, and hold no recordings yet
    /// (numbering starts at 1: a second run into one directory would interleave two runs,
    /// which replay could not tell apart).
    pub fn new(inner: B, dir: impl Into<PathBuf>, codec: Box<dyn Codec>) -> Result<Self> {
        let dir = dir.into();
        let meta = std::fs::metadata(&dir).map_err(|source| Error::Record {
            path: dir.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(Error::Record {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let read = std::fs::read_dir(&dir).map_err(|source| Error::Record {
            path: dir.clone(),
            source,
        })?;
        let recorded = read.filter_map(|e| e.ok()).find(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.ends_with(".json")
                    && n.split_once('-').is_some_and(|(seq, _)| {
                        !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit())
                    })
            })
        });
        if let Some(entry) = recorded {
            return Err(Error::Record {
                path: entry.path(),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "the directory holds recordings already; record into an empty one",
                ),
            });
        }
        Ok(Self {
            inner,
            dir,
            codec,
            seq: AtomicU64::new(0),
        })
    }

    /// The directory recorded into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Creates the file and writes everything but the answer.
    async fn record(&self, request: &Request, stream: bool) -> Result<Pending> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let label: String = request
            .label
            .as_deref()
            .unwrap_or("request")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let body_path = self.dir.join(format!("{seq:04}-{label}.json"));
        let path = self.dir.join(format!("{seq:04}-{label}.meta.json"));
        let fail = |path: &PathBuf| {
            let path = path.clone();
            move |source| Error::Record { path, source }
        };
        let create = |path: PathBuf| async move {
            tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .await
                .map_err(fail(&path))
        };
        // The body file: exactly what the provider receives, nothing added.
        let body = self.codec.encode(request, stream).to_bytes();
        let mut body_file = create(body_path.clone()).await?;
        body_file.write_all(&body).await.map_err(fail(&body_path))?;
        body_file.flush().await.map_err(fail(&body_path))?;
        let section = Section {
            format: FORMAT,
            seq,
            label: request.label.clone(),
            wire: self.codec.wire().to_string(),
            stream,
            fingerprint: Some(FingerprintRecord::of(request)),
            body_sha256: Some(forkhive_core::Digest::of(&body).to_string()),
            request: RequestRecord::of(request),
            response: None,
            error: None,
        };
        let file = create(path.clone()).await?;
        let mut pending = Pending {
            file,
            path,
            section,
        };
        pending.write().await?;
        Ok(pending)
    }
}

/// A recording whose answer is still to come: its metadata file holds everything else.
struct Pending {
    file: tokio::fs::File,
    path: PathBuf,
    section: Section,
}

impl Pending {
    /// Writes the metadata as it stands, replacing what the file held.
    async fn write(&mut self) -> Result<()> {
        let mut bytes = Vec::new();
        push_json(&mut bytes, &self.section);
        bytes.push(b'\n');
        let path = &self.path;
        let fail = |source| Error::Record {
            path: path.clone(),
            source,
        };
        self.file.seek(SeekFrom::Start(0)).await.map_err(fail)?;
        self.file.set_len(0).await.map_err(fail)?;
        self.file.write_all(&bytes).await.map_err(fail)?;
        self.file.flush().await.map_err(fail)
    }

    async fn finish_response(
        mut self,
        response: &Response,
        cut: BTreeMap<String, String>,
    ) -> Result<()> {
        self.section.response = Some(ResponseRecord::of(response, cut));
        self.write().await
    }

    /// Records `error`; a failure to do so is only logged, so the caller sees `error` itself.
    async fn finish_error(mut self, error: &Error) {
        self.section.error = Some(ErrorRecord::of(error));
        if let Err(e) = self.write().await {
            let path = self.path.display();
            tracing::warn!(path = %path, error = %e, "could not record an error answer");
        }
    }
}

impl<B> fmt::Debug for RecordingBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingBackend")
            .field("dir", &self.dir)
            .field("wire", &self.codec.wire())
            .finish()
    }
}

#[async_trait]
impl<B: Backend> Backend for RecordingBackend<B> {
    async fn send(&self, request: &Request) -> Result<Response> {
        let pending = self.record(request, false).await?;
        match self.inner.send(request).await {
            Ok(response) => {
                pending.finish_response(&response, BTreeMap::new()).await?;
                Ok(response)
            }
            Err(e) => {
                pending.finish_error(&e).await;
                Err(e)
            }
        }
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        let pending = self.record(request, true).await?;
        match self.inner.stream(request).await {
            Ok(stream) => Ok(tee(stream, pending)),
            Err(e) => {
                pending.finish_error(&e).await;
                Err(e)
            }
        }
    }

    fn answers_whole(&self) -> bool {
        self.inner.answers_whole()
    }
}

/// A stream being passed through while its answer is folded for the recording.
struct Tee {
    inner: EventStream,
    pending: Option<Pending>,
    builder: ResponseBuilder,
    /// Tool calls by block index: id and input JSON so far.
    tool_inputs: Vec<(usize, String, String)>,
}

impl Tee {
    /// Folds `event`; at `message_stop`, records the answer.
    async fn observe(&mut self, event: &StreamEvent) -> Result<()> {
        if self.pending.is_none() {
            return Ok(());
        }
        match event {
            StreamEvent::BlockStart {
                index,
                block: BlockStart::ToolUse { id, .. },
            } => self.tool_inputs.push((*index, id.clone(), String::new())),
            StreamEvent::InputJsonDelta {
                index,
                partial_json,
            } => {
                if let Some((_, _, json)) = self.tool_inputs.iter_mut().find(|(i, ..)| i == index) {
                    json.push_str(partial_json);
                }
            }
            _ => {}
        }
        if let Err(e) = self.builder.push(event) {
            self.fail(&e).await;
            return Ok(());
        }
        if !matches!(event, StreamEvent::MessageStop) {
            return Ok(());
        }
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        match std::mem::take(&mut self.builder).finish_cut_off() {
            Ok((response, cut)) => {
                let cut = cut
                    .into_iter()
                    .filter_map(|id| {
                        let (_, _, json) = self.tool_inputs.iter().find(|(_, i, _)| *i == id)?;
                        Some((id, json.clone()))
                    })
                    .collect();
                pending.finish_response(&response, cut).await
            }
            Err(e) => {
                pending.finish_error(&e).await;
                Ok(())
            }
        }
    }

    async fn fail(&mut self, error: &Error) {
        if let Some(pending) = self.pending.take() {
            pending.finish_error(error).await;
        }
    }

    /// The stream ended: a stream without `message_stop` is recorded as the truncation error
    /// its consumer sees.
    async fn end(&mut self) {
        if self.pending.is_some()
            && let Err(e) = std::mem::take(&mut self.builder).finish()
        {
            self.fail(&e).await;
        }
    }
}

fn tee(inner: EventStream, pending: Pending) -> EventStream {
    let tee = Tee {
        inner,
        pending: Some(pending),
        builder: ResponseBuilder::new(),
        tool_inputs: Vec::new(),
    };
    Box::pin(futures::stream::unfold(Some(tee), |tee| async move {
        let mut tee = tee?;
        match tee.inner.next().await {
            Some(Ok(event)) => match tee.observe(&event).await {
                Ok(()) => Some((Ok(event), Some(tee))),
                Err(e) => Some((Err(e), None)),
            },
            Some(Err(e)) => {
                tee.fail(&e).await;
                Some((Err(e), Some(tee)))
            }
            None => {
                tee.end().await;
                None
            }
        }
    }))
}

/// A recording's metadata (the `.meta.json` file; in format 1, the body's `forkhive` key).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Section {
    pub(crate) format: u32,
    #[serde(default)]
    pub(crate) seq: u64,
    #[serde(default)]
    pub(crate) label: Option<String>,
    #[serde(default)]
    pub(crate) wire: String,
    #[serde(default)]
    pub(crate) stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fingerprint: Option<FingerprintRecord>,
    /// The hex SHA-256 of the body file (format 2; absent in files written before it was
    /// recorded, whose body is only checked to be there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body_sha256: Option<String>,
    pub(crate) request: RequestRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<ResponseRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ErrorRecord>,
}

/// Hex digests of a request's fingerprint.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FingerprintRecord {
    pub(crate) total: String,
    pub(crate) prefix_total: String,
    pub(crate) tools: String,
    pub(crate) system_prompt: String,
    pub(crate) system_context: String,
    pub(crate) user_context: String,
    pub(crate) messages: String,
    pub(crate) message_count: usize,
}

impl FingerprintRecord {
    fn of(request: &Request) -> Self {
        let fp = request.fingerprint();
        let dim = |d| fp.dimension(d).to_string();
        Self {
            total: fp.total().to_string(),
            prefix_total: request.prefix.fingerprint().total().to_string(),
            tools: dim(Dimension::Tools),
            system_prompt: dim(Dimension::SystemPrompt),
            system_context: dim(Dimension::SystemContext),
            user_context: dim(Dimension::UserContext),
            messages: dim(Dimension::Messages),
            message_count: fp.message_count(),
        }
    }
}

/// A request's cache-safe parts, its messages and its settings.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RequestRecord {
    pub(crate) model: String,
    #[serde(default)]
    pub(crate) thinking: Option<ThinkingConfig>,
    #[serde(default)]
    pub(crate) system: Vec<String>,
    #[serde(default)]
    pub(crate) system_context: Vec<(String, String)>,
    #[serde(default)]
    pub(crate) user_context: Vec<(String, String)>,
    #[serde(default)]
    pub(crate) tools: Vec<ToolDefinition>,
    #[serde(default)]
    pub(crate) prefix_messages: usize,
    pub(crate) messages: Vec<Message>,
    #[serde(default)]
    pub(crate) settings: SettingsRecord,
}

impl RequestRecord {
    fn of(request: &Request) -> Self {
        let p = &request.prefix;
        Self {
            model: p.model().to_owned(),
            thinking: p.thinking(),
            system: p.system_prompt().to_vec(),
            system_context: p.system_context().to_vec(),
            user_context: p.user_context().to_vec(),
            tools: p.tools().to_vec(),
            prefix_messages: p.messages().len(),
            messages: request.all_messages(),
            settings: SettingsRecord::from(&request.settings),
        }
    }

    /// The request's prefix and suffix as one cache-safe prefix: its fingerprint is the
    /// request's [`Request::fingerprint`].
    pub(crate) fn params(&self) -> CacheSafeParams {
        let mut b = CacheSafeParams::builder(self.model.clone())
            .tools(self.tools.iter().cloned())
            .messages(self.messages.clone());
        if let Some(thinking) = self.thinking {
            b = b.thinking(thinking);
        }
        for block in &self.system {
            b = b.system_block(block.clone());
        }
        for (k, v) in &self.system_context {
            b = b.system_context(k.clone(), v.clone());
        }
        for (k, v) in &self.user_context {
            b = b.user_context(k.clone(), v.clone());
        }
        b.build()
    }
}

/// [`RequestSettings`], serialisable.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SettingsRecord {
    max_tokens: u32,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    stop_sequences: Vec<String>,
    #[serde(default)]
    tool_choice: Option<ToolChoice>,
    #[serde(default)]
    thinking: Option<ThinkingConfig>,
    #[serde(default)]
    prompt_cache_key: Option<String>,
}

impl From<&RequestSettings> for SettingsRecord {
    fn from(s: &RequestSettings) -> Self {
        Self {
            max_tokens: s.max_tokens,
            temperature: s.temperature,
            stop_sequences: s.stop_sequences.clone(),
            tool_choice: s.tool_choice.clone(),
            thinking: s.thinking,
            prompt_cache_key: s.prompt_cache_key.clone(),
        }
    }
}

impl Default for SettingsRecord {
    fn default() -> Self {
        Self::from(&RequestSettings::default())
    }
}

/// A [`Response`], serialisable, with the partial inputs of tool calls cut off at
/// `max_tokens`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ResponseRecord {
    message: Message,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Usage,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) cut_tool_inputs: BTreeMap<String, String>,
}

impl ResponseRecord {
    fn of(r: &Response, cut_tool_inputs: BTreeMap<String, String>) -> Self {
        Self {
            message: r.message.clone(),
            stop_reason: r.stop_reason.as_ref().map(|s| s.as_str().to_owned()),
            usage: r.usage,
            id: r.id.clone(),
            model: r.model.clone(),
            cut_tool_inputs,
        }
    }

    pub(crate) fn to_response(&self) -> Response {
        Response {
            message: self.message.clone(),
            stop_reason: self.stop_reason.as_deref().map(ModelStop::from_anthropic),
            usage: self.usage,
            id: self.id.clone(),
            model: self.model.clone(),
        }
    }
}

/// An [`Error`], serialisable: the variant as `kind` and the fields that rebuild it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum ErrorRecord {
    Auth {
        status: u16,
        message: String,
    },
    RateLimited {
        message: String,
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    Overloaded {
        message: String,
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    Unavailable {
        status: u16,
        message: String,
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    InvalidRequest {
        status: u16,
        message: String,
    },
    Timeout {
        after_ms: u64,
        waiting_for: String,
    },
    Connect {
        endpoint: String,
        message: String,
    },
    TruncatedStream {
        events: usize,
        detail: String,
    },
    Decode {
        what: String,
        detail: String,
    },
    Provider {
        error_type: String,
        message: String,
    },
    Config {
        message: String,
    },
    ScriptExhausted {
        request: usize,
        scripted: usize,
    },
    /// Any other error (a local one, such as a failed recording): replayed as a provider
    /// error of type `recorded_error`.
    Other {
        message: String,
    },
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `&'static str` this crate uses that equals `s`, or `fallback`.
fn known(s: &str, list: &[&'static str], fallback: &'static str) -> &'static str {
    list.iter().find(|k| **k == s).copied().unwrap_or(fallback)
}

impl ErrorRecord {
    pub(crate) fn of(e: &Error) -> Self {
        match e {
            Error::Auth { status, message } => Self::Auth {
                status: *status,
                message: message.clone(),
            },
            Error::RateLimited {
                message,
                retry_after,
            } => Self::RateLimited {
                message: message.clone(),
                retry_after_ms: retry_after.map(millis),
            },
            Error::Overloaded {
                message,
                retry_after,
            } => Self::Overloaded {
                message: message.clone(),
                retry_after_ms: retry_after.map(millis),
            },
            Error::Unavailable {
                status,
                message,
                retry_after,
            } => Self::Unavailable {
                status: *status,
                message: message.clone(),
                retry_after_ms: retry_after.map(millis),
            },
            Error::InvalidRequest { status, message } => Self::InvalidRequest {
                status: *status,
                message: message.clone(),
            },
            Error::Timeout { after, waiting_for } => Self::Timeout {
                after_ms: millis(*after),
                waiting_for: (*waiting_for).to_owned(),
            },
            Error::Connect { endpoint, source } => Self::Connect {
                endpoint: endpoint.clone(),
                message: source.to_string(),
            },
            Error::TruncatedStream { events, detail } => Self::TruncatedStream {
                events: *events,
                detail: detail.clone(),
            },
            Error::Decode { what, detail } => Self::Decode {
                what: (*what).to_owned(),
                detail: detail.clone(),
            },
            Error::Provider {
                error_type,
                message,
            } => Self::Provider {
                error_type: error_type.clone(),
                message: message.clone(),
            },
            Error::Config(message) => Self::Config {
                message: message.clone(),
            },
            Error::ScriptExhausted { request, scripted } => Self::ScriptExhausted {
                request: *request,
                scripted: *scripted,
            },
            other => Self::Other {
                message: other.to_string(),
            },
        }
    }

    /// The error again (the same variant, `Display` and retryability).
    pub(crate) fn to_error(&self) -> Error {
        let after = |ms: &Option<u64>| ms.map(Duration::from_millis);
        match self {
            Self::Auth { status, message } => Error::Auth {
                status: *status,
                message: message.clone(),
            },
            Self::RateLimited {
                message,
                retry_after_ms,
            } => Error::RateLimited {
                message: message.clone(),
                retry_after: after(retry_after_ms),
            },
            Self::Overloaded {
                message,
                retry_after_ms,
            } => Error::Overloaded {
                message: message.clone(),
                retry_after: after(retry_after_ms),
            },
            Self::Unavailable {
                status,
                message,
                retry_after_ms,
            } => Error::Unavailable {
                status: *status,
                message: message.clone(),
                retry_after: after(retry_after_ms),
            },
            Self::InvalidRequest { status, message } => Error::InvalidRequest {
                status: *status,
                message: message.clone(),
            },
            Self::Timeout {
                after_ms,
                waiting_for,
            } => Error::Timeout {
                after: Duration::from_millis(*after_ms),
                waiting_for: known(
                    waiting_for,
                    &[
                        "response headers",
                        "the connection",
                        "the response body",
                        "the next stream event",
                    ],
                    "a recorded answer",
                ),
            },
            Self::Connect { endpoint, message } => Error::Connect {
                endpoint: endpoint.clone(),
                source: Box::new(std::io::Error::other(message.clone())),
            },
            Self::TruncatedStream { events, detail } => Error::TruncatedStream {
                events: *events,
                detail: detail.clone(),
            },
            Self::Decode { what, detail } => Error::Decode {
                what: known(
                    what,
                    &[
                        "Anthropic response",
                        "Anthropic response block",
                        "Anthropic stream event",
                        "OpenAI response",
                        "OpenAI stream chunk",
                        "tool call arguments",
                        "tool_use input",
                        "stream",
                    ],
                    "a recorded answer",
                ),
                detail: detail.clone(),
            },
            Self::Provider {
                error_type,
                message,
            } => Error::Provider {
                error_type: error_type.clone(),
                message: message.clone(),
            },
            Self::Config { message } => Error::Config(message.clone()),
            Self::ScriptExhausted { request, scripted } => Error::ScriptExhausted {
                request: *request,
                scripted: *scripted,
            },
            Self::Other { message } => Error::Provider {
                error_type: "recorded_error".to_owned(),
                message: message.clone(),
            },
        }
    }
}
