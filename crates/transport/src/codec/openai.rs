//! The OpenAI-compatible Chat Completions wire format.
//!
//! Request body, in this key order: `model`, `tools` (as functions), `messages` (the system
//! prompt blocks and system context joined into one `system` message, the user context as a
//! `user` message, the prefix, the suffix), then the per-call `max_tokens`, `temperature`,
//! `stop`, `tool_choice`, `prompt_cache_key`, `stream` and `stream_options`.
//!
//! Messages are translated: a `tool_use` becomes an entry of the assistant's `tool_calls`
//! (its input, byte for byte, becomes the `arguments` string), every `tool_result` becomes a
//! `tool` message, and thinking blocks are dropped (the format has no place for them). The
//! provider caches prefixes automatically, so there are no breakpoints to place; what matters
//! is that the prefix bytes stay identical, which the layout above guarantees.

use bytes::Bytes;
use forkhive_core::{
    CacheSafeParams, ContentBlock, ForkChild, ImageSource, Message, RawJson, Role, Usage, json,
};
use serde::Deserialize;

use super::memo::{Chunks, EncodedMessage, Memo, MemoConfig, MessageCache};
use super::{Codec, EncodedBody, StreamDecoder, WireFormat, parse_json, push_json};
use crate::error::{Error, Result};
use crate::request::{
    BlockStart, ModelStop, PartialUsage, Request, Response, StreamEvent, Suffix, ToolChoice,
};
use crate::sse::SseEvent;

/// Encodes and decodes Chat Completions requests, remembering encoded messages and prefixes
/// (bounded: see [`MemoConfig`]).
///
/// A body is a rope of shared chunks: the head (model, tools, the system and user-context
/// messages; memoised per head), the prefix messages (each translated once and memoised by its
/// digest), and the request's own bytes.
#[derive(Debug)]
pub struct OpenAiCodec {
    heads: Memo<forkhive_core::Digest, Bytes>,
    messages: MessageCache,
    forks: Memo<forkhive_core::Digest, Bytes>,
}

impl Default for OpenAiCodec {
    fn default() -> Self {
        Self::with_memo(MemoConfig::default())
    }
}

/// Writes translated messages, tracking whether a comma is due.
struct Writer<'a> {
    out: &'a mut Vec<u8>,
    count: usize,
}

impl Writer<'_> {
    fn open(&mut self) {
        if self.count > 0 {
            self.out.push(b',');
        }
        self.count += 1;
    }

    fn text_message(&mut self, role: &str, text: &str) {
        self.open();
        self.out.extend_from_slice(br#"{"role":"#);
        json::write_str(self.out, role);
        self.out.extend_from_slice(br#","content":"#);
        json::write_str(self.out, text);
        self.out.push(b'}');
    }

    fn tool_message(&mut self, id: &str, text: &str) {
        self.open();
        self.out
            .extend_from_slice(br#"{"role":"tool","tool_call_id":"#);
        json::write_str(self.out, id);
        self.out.extend_from_slice(br#","content":"#);
        json::write_str(self.out, text);
        self.out.push(b'}');
    }

    fn message(&mut self, m: &Message) {
        match m.role {
            Role::Assistant => self.assistant(m),
            Role::User => self.user(m),
        }
    }

    fn assistant(&mut self, m: &Message) {
        self.open();
        let text: String = m.content.iter().filter_map(ContentBlock::as_text).collect();
        self.out
            .extend_from_slice(br#"{"role":"assistant","content":"#);
        if text.is_empty() {
            self.out.extend_from_slice(b"null");
        } else {
            json::write_str(self.out, &text);
        }
        let calls: Vec<(&str, &str, &RawJson)> = m.tool_uses().collect();
        if !calls.is_empty() {
            self.out.extend_from_slice(br#","tool_calls":["#);
            for (i, (id, name, input)) in calls.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out.extend_from_slice(br#"{"id":"#);
                json::write_str(self.out, id);
                self.out
                    .extend_from_slice(br#","type":"function","function":{"name":"#);
                json::write_str(self.out, name);
                self.out.extend_from_slice(br#","arguments":"#);
                json::write_str(self.out, input.as_str());
                self.out.extend_from_slice(b"}}");
            }
            self.out.push(b']');
        }
        self.out.push(b'}');
    }

    fn user(&mut self, m: &Message) {
        for b in &m.content {
            if let ContentBlock::ToolResult {
                tool_use_id,
                content,
                ..
            } = b
            {
                self.tool_message(tool_use_id, &content.text());
            }
        }
        let rest: Vec<&ContentBlock> = m
            .content
            .iter()
            .filter(|b| matches!(b, ContentBlock::Text { .. } | ContentBlock::Image { .. }))
            .collect();
        match rest.as_slice() {
            [] => {}
            [ContentBlock::Text { text }] => self.text_message("user", text),
            parts => {
                self.open();
                self.out.extend_from_slice(br#"{"role":"user","content":["#);
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    match p {
                        ContentBlock::Text { text } => {
                            self.out.extend_from_slice(br#"{"type":"text","text":"#);
                            json::write_str(self.out, text);
                            self.out.push(b'}');
                        }
                        ContentBlock::Image { source } => {
                            let url = match source {
                                ImageSource::Base64 { media_type, data } => {
                                    format!("data:{media_type};base64,{data}")
                                }
                                ImageSource::Url { url } => url.clone(),
                            };
                            self.out
                                .extend_from_slice(br#"{"type":"image_url","image_url":{"url":"#);
                            json::write_str(self.out, &url);
                            self.out.extend_from_slice(b"}}");
                        }
                        _ => {}
                    }
                }
                self.out.extend_from_slice(b"]}");
            }
        }
    }
}

/// A message as comma-led elements of `messages` (none for a message the format has no place
/// for).
fn encode_message(m: &Message) -> EncodedMessage {
    let mut out = Vec::with_capacity(64 + m.content.len() * 256);
    let mut w = Writer {
        out: &mut out,
        count: 1,
    };
    w.message(m);
    EncodedMessage {
        bytes: Bytes::from(out),
        mark: None,
    }
}

impl OpenAiCodec {
    /// A codec with the default memo bounds.
    pub fn new() -> Self {
        Self::default()
    }

    /// A codec remembering as much as `memo` allows.
    pub fn with_memo(memo: MemoConfig) -> Self {
        Self {
            heads: Memo::new(32, usize::MAX),
            messages: MessageCache::new(encode_message, &memo),
            forks: Memo::new(64, usize::MAX),
        }
    }

    /// Appends the prefix's chunks; leaves `chunks.bare` telling whether `messages` is still
    /// empty.
    fn prefix_chunks(&self, p: &CacheSafeParams, chunks: &mut Chunks) {
        let head = self
            .heads
            .get_or_insert_with(p.fingerprint().head_digest(), || {
                let bytes = Bytes::from(Self::head_bytes(p));
                let weight = bytes.len();
                (bytes, weight)
            });
        chunks.push(head);
        chunks.bare = !(p.system_prompt().iter().any(|t| !t.is_empty())
            || !p.system_context().is_empty()
            || !p.user_context().is_empty());
        for piece in self.messages.rope(p, p.messages().len()).pieces() {
            chunks.push_elements(piece.clone());
        }
    }

    /// Everything before the first prefix message: model, tools, `"messages":[`, the system
    /// message and the user-context message.
    fn head_bytes(p: &CacheSafeParams) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(br#"{"model":"#);
        json::write_str(&mut out, p.model());
        if !p.tools().is_empty() {
            out.extend_from_slice(br#","tools":["#);
            for (i, t) in p.tools().iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(br#"{"type":"function","function":{"name":"#);
                json::write_str(&mut out, &t.name);
                out.extend_from_slice(br#","description":"#);
                json::write_str(&mut out, &t.description);
                out.extend_from_slice(br#","parameters":"#);
                out.extend_from_slice(t.input_schema.as_str().as_bytes());
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.extend_from_slice(br#","messages":["#);
        let mut w = Writer {
            out: &mut out,
            count: 0,
        };
        let mut system: Vec<&str> = p
            .system_prompt()
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
            .collect();
        let ctx = p.rendered_system_context();
        if let Some(c) = &ctx {
            system.push(c);
        }
        if !system.is_empty() {
            w.text_message("system", &system.join("\n\n"));
        }
        if let Some(u) = p.rendered_user_context() {
            w.text_message("user", &u);
        }
        out
    }

    fn fork_shared(&self, child: &ForkChild, prefix_nonempty: bool) -> Bytes {
        self.forks
            .get_or_insert_with(child.shared_fingerprint().total(), || {
                let mut out = Vec::with_capacity(1024);
                let mut w = Writer {
                    out: &mut out,
                    count: usize::from(prefix_nonempty),
                };
                w.assistant(child.assistant());
                for p in child.placeholder_results() {
                    if let ContentBlock::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = p
                    {
                        w.tool_message(tool_use_id, &content.text());
                    }
                }
                w.open();
                out.extend_from_slice(br#"{"role":"user","content":""#);
                json::escape_str_into(&mut out, child.child_message_head());
                let weight = out.len();
                (Bytes::from(out), weight)
            })
    }

    fn push_tail(out: &mut Vec<u8>, request: &Request, stream: bool) {
        let s = &request.settings;
        out.extend_from_slice(br#"],"max_tokens":"#);
        push_json(out, &s.max_tokens);
        if let Some(t) = s.temperature {
            out.extend_from_slice(br#","temperature":"#);
            push_json(out, &t);
        }
        if !s.stop_sequences.is_empty() {
            out.extend_from_slice(br#","stop":"#);
            push_json(out, &s.stop_sequences);
        }
        if let Some(tc) = &s.tool_choice {
            out.extend_from_slice(br#","tool_choice":"#);
            match tc {
                ToolChoice::Auto => out.extend_from_slice(br#""auto""#),
                ToolChoice::Any => out.extend_from_slice(br#""required""#),
                ToolChoice::None => out.extend_from_slice(br#""none""#),
                ToolChoice::Tool { name } => {
                    out.extend_from_slice(br#"{"type":"function","function":{"name":"#);
                    json::write_str(out, name);
                    out.extend_from_slice(b"}}");
                }
            }
        }
        if let Some(e) = s.effort {
            let (said, exact) = e.reasoning_effort();
            if !exact {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    tracing::warn!(
                        "effort `{}` cannot be said in the OpenAI format; sent as \
                         reasoning_effort `{said}`",
                        e.as_str()
                    );
                });
            }
            out.extend_from_slice(br#","reasoning_effort":"#);
            json::write_str(out, said);
        }
        if let Some(k) = &s.prompt_cache_key {
            out.extend_from_slice(br#","prompt_cache_key":"#);
            json::write_str(out, k);
        }
        if stream {
            out.extend_from_slice(br#","stream":true,"stream_options":{"include_usage":true}"#);
        }
        out.push(b'}');
    }
}

impl Codec for OpenAiCodec {
    fn wire(&self) -> WireFormat {
        WireFormat::OpenAi
    }

    fn encode(&self, request: &Request, stream: bool) -> EncodedBody {
        let mut chunks = Chunks {
            chunks: Vec::with_capacity(64),
            bare: true,
        };
        self.prefix_chunks(&request.prefix, &mut chunks);
        let nonempty = !chunks.bare;
        match &request.suffix {
            Suffix::Fork(child) if super::is_own_prefix(request, child) => {
                chunks.push(self.fork_shared(child, nonempty));
                let mut own = Vec::with_capacity(64 + child.directive().len());
                json::escape_str_into(&mut own, child.directive());
                own.extend_from_slice(br#""}"#);
                Self::push_tail(&mut own, request, stream);
                chunks.push(Bytes::from(own));
            }
            suffix => {
                let messages = suffix.messages();
                let messages = &*messages;
                let mut own = Vec::with_capacity(256 * (messages.len() + 1));
                let mut w = Writer {
                    out: &mut own,
                    count: usize::from(nonempty),
                };
                for m in messages {
                    w.message(m);
                }
                Self::push_tail(&mut own, request, stream);
                chunks.push(Bytes::from(own));
            }
        }
        EncodedBody::from_chunks(chunks.chunks)
    }

    fn decode_response(&self, body: &[u8]) -> Result<Response> {
        let r: WireResponse = parse_json("OpenAI response", body)?;
        let choice = r.choices.into_iter().next().ok_or_else(|| Error::Decode {
            what: "OpenAI response",
            detail: "`choices` is empty".to_owned(),
        })?;
        let mut content = Vec::new();
        if let Some(text) = choice.message.content.filter(|t| !t.is_empty()) {
            content.push(ContentBlock::text(text));
        }
        for call in choice.message.tool_calls.unwrap_or_default() {
            content.push(ContentBlock::ToolUse {
                input: parse_arguments(&call.id, &call.function.arguments)?,
                id: call.id,
                name: call.function.name,
            });
        }
        Ok(Response {
            message: Message::assistant(content),
            stop_reason: choice.finish_reason.as_deref().map(ModelStop::from_openai),
            usage: r.usage.map(|u| u.to_usage()).unwrap_or_default(),
            id: r.id,
            model: r.model,
        })
    }

    fn stream_decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(OpenAiStream::default())
    }

    fn error_message(&self, body: &[u8]) -> Option<(String, String)> {
        error_message(body)
    }
}

/// The `(type, message)` of an OpenAI-shaped error body.
fn error_message(body: &[u8]) -> Option<(String, String)> {
    #[derive(Deserialize)]
    struct Body {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        message: String,
        #[serde(rename = "type", default)]
        kind: Option<String>,
    }
    let b: Body = serde_json::from_slice(body).ok()?;
    Some((
        b.error.kind.unwrap_or_else(|| "error".to_owned()),
        b.error.message,
    ))
}

fn parse_arguments(id: &str, arguments: &str) -> Result<RawJson> {
    if arguments.trim().is_empty() {
        return Ok(RawJson::empty_object());
    }
    RawJson::parse(arguments).map_err(|e| Error::Decode {
        what: "tool call arguments",
        detail: format!("tool call {id}: {e}: {arguments:?}"),
    })
}

#[derive(Deserialize)]
struct WireResponse {
    id: Option<String>,
    model: Option<String>,
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    prompt_tokens_details: Option<WireDetails>,
}

#[derive(Deserialize, Clone, Copy)]
struct WireDetails {
    #[serde(default)]
    cached_tokens: u64,
}

impl WireUsage {
    /// `prompt_tokens` includes cached tokens; ours does not.
    fn to_usage(self) -> Usage {
        let cached = self.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
        Usage {
            input_tokens: self.prompt_tokens.saturating_sub(cached),
            output_tokens: self.completion_tokens,
            cache_read_tokens: cached,
            ..Usage::default()
        }
    }
}

#[derive(Deserialize)]
struct WireChunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    choices: Vec<WireChunkChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    delta: WireChunkDelta,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireChunkDelta {
    content: Option<String>,
    tool_calls: Option<Vec<WireChunkCall>>,
}

#[derive(Deserialize)]
struct WireChunkCall {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireChunkFunction>,
}

#[derive(Deserialize)]
struct WireChunkFunction {
    name: Option<String>,
    arguments: Option<String>,
}

/// One tool call being streamed.
#[derive(Debug, Default)]
struct Call {
    /// OpenAI's index of the call.
    key: usize,
    /// Our block index, once the block has started.
    block: Option<usize>,
    id: String,
    name: String,
    /// Argument fragments received before the block could start.
    buffered: String,
}

/// Turns Chat Completions chunks into block-structured events: text and each tool call
/// become content blocks, argument fragments become `InputJsonDelta`s, `[DONE]` ends it.
///
/// A tool call's block starts once both its id and name are known (some servers send them in
/// a later chunk than the first arguments); fragments that arrive earlier are buffered. Only
/// the first choice (`index` 0) is decoded.
#[derive(Debug, Default)]
struct OpenAiStream {
    started: bool,
    next_index: usize,
    text_block: Option<usize>,
    calls: Vec<Call>,
    open: Vec<usize>,
    complete: bool,
}

impl OpenAiStream {
    /// The call a fragment continues: by `index`; without one (some servers omit it), by id,
    /// and a fragment with neither continues the latest call.
    fn call_for(&self, call: &WireChunkCall) -> Option<usize> {
        match (call.index, call.id.as_deref().filter(|v| !v.is_empty())) {
            (Some(key), _) => self.calls.iter().position(|c| c.key == key),
            (None, Some(id)) => self.calls.iter().position(|c| c.id == id),
            (None, None) => self.calls.len().checked_sub(1),
        }
    }

    fn close_text(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some(t) = self.text_block.take() {
            self.open.retain(|&o| o != t);
            out.push(StreamEvent::BlockStop { index: t });
        }
    }

    /// Starts call `i`'s block if it may (or must, when `force`), flushing buffered arguments.
    fn start_call(&mut self, i: usize, force: bool, out: &mut Vec<StreamEvent>) {
        let ready = {
            let c = &self.calls[i];
            c.block.is_none() && (force || (!c.id.is_empty() && !c.name.is_empty()))
        };
        if !ready {
            return;
        }
        self.close_text(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open.push(index);
        let c = &mut self.calls[i];
        c.block = Some(index);
        out.push(StreamEvent::BlockStart {
            index,
            block: BlockStart::ToolUse {
                id: c.id.clone(),
                name: c.name.clone(),
            },
        });
        if !c.buffered.is_empty() {
            out.push(StreamEvent::InputJsonDelta {
                index,
                partial_json: std::mem::take(&mut c.buffered),
            });
        }
    }

    fn close_all(&mut self, out: &mut Vec<StreamEvent>) {
        for i in 0..self.calls.len() {
            self.start_call(i, true, out);
        }
        for index in self.open.drain(..) {
            out.push(StreamEvent::BlockStop { index });
        }
        self.text_block = None;
    }
}

impl StreamDecoder for OpenAiStream {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<()> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.close_all(out);
            self.complete = true;
            out.push(StreamEvent::MessageStop);
            return Ok(());
        }
        if let Some((kind, message)) = error_message(data.as_bytes()) {
            return Err(Error::from_provider_type(&kind, message));
        }
        let chunk: WireChunk = parse_json("OpenAI stream chunk", data.as_bytes())?;
        if !self.started {
            self.started = true;
            out.push(StreamEvent::MessageStart {
                id: chunk.id.clone(),
                model: chunk.model.clone(),
                usage: PartialUsage::default(),
            });
        }
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                let index = match self.text_block {
                    Some(i) => i,
                    None => {
                        let i = self.next_index;
                        self.next_index += 1;
                        self.text_block = Some(i);
                        self.open.push(i);
                        out.push(StreamEvent::BlockStart {
                            index: i,
                            block: BlockStart::Text(String::new()),
                        });
                        i
                    }
                };
                out.push(StreamEvent::TextDelta { index, text });
            }
            for call in choice.delta.tool_calls.unwrap_or_default() {
                let i = match self.call_for(&call) {
                    Some(i) => i,
                    None => {
                        let key = call.index.unwrap_or_else(|| {
                            self.calls.iter().map(|c| c.key + 1).max().unwrap_or(0)
                        });
                        self.calls.push(Call {
                            key,
                            ..Call::default()
                        });
                        self.calls.len() - 1
                    }
                };
                let (name, arguments) = match call.function {
                    Some(f) => (f.name, f.arguments),
                    None => (None, None),
                };
                let c = &mut self.calls[i];
                if let Some(id) = call.id.filter(|v| !v.is_empty()) {
                    c.id = id;
                }
                if let Some(name) = name.filter(|v| !v.is_empty()) {
                    c.name = name;
                }
                let arguments = arguments.filter(|a| !a.is_empty());
                match (c.block, arguments) {
                    (Some(index), Some(a)) => out.push(StreamEvent::InputJsonDelta {
                        index,
                        partial_json: a,
                    }),
                    (None, Some(a)) => c.buffered.push_str(&a),
                    (_, None) => {}
                }
                self.start_call(i, false, out);
            }
            if let Some(reason) = choice.finish_reason {
                self.close_all(out);
                out.push(StreamEvent::MessageDelta {
                    stop_reason: Some(ModelStop::from_openai(&reason)),
                    usage: PartialUsage::default(),
                });
            }
        }
        if let Some(u) = chunk.usage {
            out.push(StreamEvent::MessageDelta {
                stop_reason: None,
                usage: PartialUsage::full(&u.to_usage()),
            });
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ResponseBuilder;
    use forkhive_core::{ForkPrefix, ToolDefinition};

    fn params() -> CacheSafeParams {
        CacheSafeParams::builder("gpt-x")
            .system_block("sys")
            .user_context("cwd", "/r")
            .tool(ToolDefinition::new("Read", "read", r#"{"type":"object"}"#).unwrap())
            .messages(vec![
                Message::user_text("hi"),
                Message::assistant(vec![
                    ContentBlock::text("reading"),
                    ContentBlock::tool_use("c1", "Read", RawJson::parse(r#"{ "p": 1 }"#).unwrap()),
                ]),
                Message::user(vec![ContentBlock::tool_result_text("c1", "file")]),
            ])
            .build()
    }

    /// An effort is `reasoning_effort`; `max`, which the format cannot say, is `high`.
    #[test]
    fn effort_becomes_reasoning_effort() {
        for (e, said) in [
            (crate::request::Effort::Low, "low"),
            (crate::request::Effort::High, "high"),
            (crate::request::Effort::Max, "high"),
        ] {
            let mut r = Request::new(params(), vec![Message::user_text("go")]).with_max_tokens(8);
            r.settings.effort = Some(e);
            let body = String::from_utf8(OpenAiCodec::new().encode(&r, false).to_bytes().to_vec())
                .unwrap();
            assert!(
                body.ends_with(&format!(r#""max_tokens":8,"reasoning_effort":"{said}"}}"#)),
                "{body}"
            );
        }
        assert_eq!(
            crate::request::Effort::from_name(" High "),
            Some(crate::request::Effort::High)
        );
        assert_eq!(crate::request::Effort::from_name("turbo"), None);
    }

    #[test]
    fn encodes_the_documented_layout_byte_for_byte() {
        let mut r = Request::new(params(), vec![Message::user_text("go")]).with_max_tokens(8);
        r.settings.prompt_cache_key = Some("k".into());
        r.settings.tool_choice = Some(ToolChoice::Any);
        let body =
            String::from_utf8(OpenAiCodec::new().encode(&r, true).to_bytes().to_vec()).unwrap();
        assert_eq!(
            body,
            concat!(
                r#"{"model":"gpt-x","tools":[{"type":"function","function":{"name":"Read","description":"read","parameters":{"type":"object"}}}],"#,
                r##""messages":[{"role":"system","content":"sys"},{"role":"user","content":"<system-reminder>\n# cwd\n/r\n</system-reminder>"},"##,
                r#"{"role":"user","content":"hi"},"#,
                r#"{"role":"assistant","content":"reading","tool_calls":[{"id":"c1","type":"function","function":{"name":"Read","arguments":"{ \"p\": 1 }"}}]},"#,
                r#"{"role":"tool","tool_call_id":"c1","content":"file"},"#,
                r#"{"role":"user","content":"go"}],"max_tokens":8,"tool_choice":"required","prompt_cache_key":"k","stream":true,"stream_options":{"include_usage":true}}"#
            )
        );
    }

    #[test]
    fn fork_children_match_a_fresh_encoding() {
        let turn = Message::assistant(vec![ContentBlock::tool_use(
            "t1",
            "Agent",
            RawJson::parse(r#"{"a":1}"#).unwrap(),
        )]);
        let prefix = ForkPrefix::new(params(), turn).unwrap();
        let codec = OpenAiCodec::new();
        for d in ["x", "y\n\"z\""] {
            let child = prefix.child(d);
            let fast = codec.encode(&Request::fork(child.clone()), false);
            let fresh =
                OpenAiCodec::new().encode(&Request::new(params(), child.suffix().to_vec()), false);
            assert_eq!(fast.to_bytes(), fresh.to_bytes());
            let v: serde_json::Value = serde_json::from_slice(&fast.to_bytes()).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            assert_eq!(msgs[msgs.len() - 2]["role"], "tool");
            assert!(
                msgs[msgs.len() - 1]["content"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("fork-directive: {d}"))
            );
        }
    }

    #[test]
    fn decodes_response_usage_and_tool_calls() {
        let body = br#"{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok","tool_calls":[{"id":"t","type":"function","function":{"name":"Read","arguments":"{\"p\": 2}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1000,"completion_tokens":5,"total_tokens":1005,"prompt_tokens_details":{"cached_tokens":960}}}"#;
        let r = OpenAiCodec::new().decode_response(body).unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 40,
                output_tokens: 5,
                cache_read_tokens: 960,
                ..Usage::default()
            }
        );
        assert_eq!(r.stop_reason, Some(ModelStop::ToolUse));
        assert_eq!(
            r.message.tool_uses().next().unwrap().2.as_str(),
            r#"{"p": 2}"#
        );
        let bad = br#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"t","function":{"name":"R","arguments":"{oops"}}]},"finish_reason":"tool_calls"}]}"#;
        let err = OpenAiCodec::new().decode_response(bad).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("could not decode tool call arguments: tool call t:"),
            "{err}"
        );
        assert!(matches!(
            OpenAiCodec::new().decode_response(br#"{"choices":[]}"#),
            Err(Error::Decode { .. })
        ));
    }

    fn decode_all(chunks: &[&str]) -> crate::Result<Response> {
        let mut d = OpenAiCodec::new().stream_decoder();
        let mut out = Vec::new();
        for c in chunks {
            d.decode(
                &SseEvent {
                    event: None,
                    data: (*c).into(),
                },
                &mut out,
            )?;
        }
        let mut b = ResponseBuilder::new();
        for e in &out {
            b.push(e)?;
        }
        b.finish()
    }

    #[test]
    fn late_tool_call_ids_missing_indexes_and_other_choices() {
        let r = decode_all(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"p\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"Read","arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_2","function":{"name":"Grep","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        let calls: Vec<_> = r
            .message
            .tool_uses()
            .map(|(i, n, a)| (i.to_owned(), n.to_owned(), a.as_str().to_owned()))
            .collect();
        assert_eq!(
            calls,
            vec![
                ("call_1".into(), "Read".into(), r#"{"p":1}"#.into()),
                ("call_2".into(), "Grep".into(), "{}".into()),
            ],
            "the id and name arrived after the first fragment; the second call has no index"
        );
        assert_eq!(r.message.text(), "", "choice 1 is ignored");
    }

    #[test]
    fn a_call_that_never_names_itself_still_closes() {
        let r = decode_all(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":3,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ])
        .unwrap();
        assert_eq!(r.message.content.len(), 1);
        assert_eq!(r.message.tool_uses().next().unwrap().2.as_str(), "{}");
    }

    #[test]
    fn decodes_streamed_text_tool_call_fragments_and_usage() {
        let chunks = [
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"Read","arguments":""}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"p\""}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":40}}}"#,
            "[DONE]",
        ];
        let r = decode_all(&chunks).unwrap();
        assert_eq!(r.message.text(), "Hello");
        assert_eq!(
            r.message.tool_uses().next().unwrap().2.as_str(),
            r#"{"p":1}"#
        );
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 9,
                cache_read_tokens: 40,
                ..Usage::default()
            }
        );
        assert_eq!(r.stop_reason, Some(ModelStop::ToolUse));
    }
}
