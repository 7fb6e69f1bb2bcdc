//! The Anthropic Messages wire format.
//!
//! Request body, in this key order: `model`, `system` (the system prompt blocks, then the
//! rendered system context as one more block), `tools`, `messages` (the rendered user context
//! as a first user message, the prefix, the suffix), then the per-call `max_tokens`,
//! `thinking`, `temperature`, `stop_sequences`, `tool_choice` and `stream`.
//!
//! `cache_control` breakpoints are placed by a [`CachePolicy`]; render order for the cache is
//! tools, then system, then messages, so the markers follow that order.
//!
//! A body is a rope of shared chunks: the head (everything before the first prefix message,
//! memoised per head), the prefix messages (each encoded once, without a marker, and memoised
//! by its digest; see [`MemoConfig`]), and the request's own bytes. The
//! prefix's breakpoint goes on the last cacheable block of the prefix: that message's memoised
//! bytes are split around the block's closing `}` and the marker is a static chunk between the
//! two halves, so even the marked message is not encoded again.

use bytes::Bytes;
use forkhive_core::{CacheSafeParams, ContentBlock, ForkChild, Message, json};
use serde::Deserialize;

use super::memo::{Chunks, EncodedMessage, Memo, MemoConfig, MessageCache};
use super::{
    CachePolicy, CacheTtl, Codec, EncodedBody, StreamDecoder, WireFormat, cacheable,
    last_cacheable, parse_json, push_json, suffix_breakpoint,
};
use crate::error::{Error, Result};
use crate::request::{BlockStart, ModelStop, PartialUsage, Request, Response, StreamEvent};
use crate::sse::SseEvent;

/// Encodes and decodes Anthropic Messages requests, remembering encoded messages and prefixes
/// (bounded: see [`MemoConfig`]).
#[derive(Debug)]
pub struct AnthropicCodec {
    policy: CachePolicy,
    /// Everything before the first prefix message, keyed by the head digest and whether the
    /// user-context message carries the prefix's breakpoint.
    heads: Memo<(forkhive_core::Digest, bool), Bytes>,
    messages: MessageCache,
    forks: Memo<forkhive_core::Digest, Bytes>,
}

impl Default for AnthropicCodec {
    fn default() -> Self {
        Self::new(CachePolicy::default())
    }
}

impl AnthropicCodec {
    /// A codec placing breakpoints by `policy`, with the default memo bounds.
    pub fn new(policy: CachePolicy) -> Self {
        Self::with_memo(policy, MemoConfig::default())
    }

    /// A codec placing breakpoints by `policy`, remembering as much as `memo` allows.
    pub fn with_memo(policy: CachePolicy, memo: MemoConfig) -> Self {
        Self {
            policy,
            heads: Memo::new(32, usize::MAX),
            messages: MessageCache::new(encode_message, &memo),
            forks: Memo::new(64, usize::MAX),
        }
    }

    /// The breakpoint policy.
    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    fn marker(&self) -> &'static [u8] {
        &self.comma_marker()[1..]
    }

    /// `,` and the marker: the chunk spliced into a memoised message to mark one of its blocks.
    fn comma_marker(&self) -> &'static [u8] {
        match self.policy.ttl {
            CacheTtl::FiveMinutes => br#","cache_control":{"type":"ephemeral"}"#,
            CacheTtl::OneHour => br#","cache_control":{"type":"ephemeral","ttl":"1h"}"#,
        }
    }

    /// The encoded prefix: everything up to and including the prefix's last message, before
    /// the closing `]` of `messages`, as one contiguous copy. [`encode`](Codec::encode) shares
    /// the memoised chunks instead of copying them.
    pub fn encode_prefix(&self, prefix: &CacheSafeParams) -> Bytes {
        let mut chunks = Chunks::default();
        self.prefix_chunks(prefix, &mut chunks);
        EncodedBody::from_chunks(chunks.chunks).to_bytes()
    }

    /// Appends the prefix's chunks; leaves `chunks.bare` telling whether `messages` is still
    /// empty.
    fn prefix_chunks(&self, p: &CacheSafeParams, chunks: &mut Chunks) {
        let messages = p.messages();
        let has_user_context = !p.user_context().is_empty();
        // The breakpoint goes on the last cacheable block of the prefix messages, or on the
        // user-context message when no prefix message has a cacheable block.
        let mark = if self.policy.prefix_messages {
            messages
                .iter()
                .enumerate()
                .rev()
                .find(|(_, m)| m.content.iter().any(cacheable))
                .map(|(i, _)| i)
        } else {
            None
        };
        let mark_user_context = self.policy.prefix_messages && mark.is_none() && has_user_context;
        chunks.push(self.head(p, mark_user_context));
        chunks.bare = !has_user_context;

        let Some(mi) = mark else {
            for piece in self.messages.rope(p, messages.len()).pieces() {
                chunks.push_elements(piece.clone());
            }
            return;
        };
        for piece in self.messages.rope(p, mi).pieces() {
            chunks.push_elements(piece.clone());
        }
        let rest = messages
            .iter()
            .skip(mi)
            .zip(p.fingerprint().message_digests().skip(mi));
        for (i, (m, digest)) in rest.enumerate() {
            let e = self.messages.message(digest, m);
            match e.mark.filter(|_| i == 0) {
                Some(at) => {
                    chunks.push_elements(e.bytes.slice(..at));
                    chunks.push(Bytes::from_static(self.comma_marker()));
                    chunks.push(e.bytes.slice(at..));
                }
                None => chunks.push_elements(e.bytes),
            }
        }
    }

    /// Everything before the first prefix message: model, system, tools, `"messages":[` and the
    /// user-context message (marked when it carries the prefix's breakpoint).
    fn head(&self, p: &CacheSafeParams, mark_user_context: bool) -> Bytes {
        let key = (p.fingerprint().head_digest(), mark_user_context);
        self.heads.get_or_insert_with(key, || {
            let bytes = Bytes::from(self.head_bytes(p, mark_user_context));
            let weight = bytes.len();
            (bytes, weight)
        })
    }

    fn head_bytes(&self, p: &CacheSafeParams, mark_user_context: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(br#"{"model":"#);
        // A definition's alias (`haiku`) as the id the API takes.
        json::write_str(
            &mut out,
            forkhive_core::usage::anthropic_model_id(p.model()),
        );

        let system_context = p.rendered_system_context();
        // The provider rejects empty text blocks: an empty system block is left out.
        let mut system: Vec<&str> = p
            .system_prompt()
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
            .collect();
        if let Some(ctx) = &system_context {
            system.push(ctx);
        }
        if !system.is_empty() {
            out.extend_from_slice(br#","system":["#);
            for (i, text) in system.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(br#"{"type":"text","text":"#);
                json::write_str(&mut out, text);
                if self.policy.system && i + 1 == system.len() {
                    out.push(b',');
                    out.extend_from_slice(self.marker());
                }
                out.push(b'}');
            }
            out.push(b']');
        }

        if !p.tools().is_empty() {
            out.extend_from_slice(br#","tools":["#);
            let n = p.tools().len();
            for (i, tool) in p.tools().iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let mark = self.policy.tools && i + 1 == n;
                push_marked(&mut out, tool, mark.then(|| self.marker()));
            }
            out.push(b']');
        }

        out.extend_from_slice(br#","messages":["#);
        if let Some(ctx) = p.rendered_user_context() {
            let m = Message::user_text(ctx);
            // Its one block is cacheable: the rendered context is never empty.
            self.push_message(&mut out, &m, mark_user_context.then_some(0));
        }
        out
    }

    fn push_message(&self, out: &mut Vec<u8>, m: &Message, marked: Option<usize>) {
        out.extend_from_slice(br#"{"role":"#);
        json::write_str(out, m.role.as_str());
        out.extend_from_slice(br#","content":["#);
        for (bi, b) in m.content.iter().enumerate() {
            if bi > 0 {
                out.push(b',');
            }
            push_marked(out, b, (marked == Some(bi)).then(|| self.marker()));
        }
        out.extend_from_slice(b"]}");
    }

    /// The part a fork child shares with its siblings: the assistant turn, the placeholder
    /// results and the child message up to the directive.
    fn fork_shared(&self, child: &ForkChild, prefix_has_messages: bool) -> Bytes {
        self.forks
            .get_or_insert_with(child.shared_fingerprint().total(), || {
                let placeholders = child.placeholder_results();
                let mut out = Vec::with_capacity(1024 + 128 * placeholders.len());
                if prefix_has_messages {
                    out.push(b',');
                }
                // The breakpoint sits on the last cacheable block before the directive: the last
                // placeholder, or (without tool calls) the assistant turn's last cacheable block.
                let assistant_mark = if self.policy.suffix && placeholders.is_empty() {
                    last_cacheable(&[child.assistant()]).map(|(_, b)| b)
                } else {
                    None
                };
                self.push_message(&mut out, child.assistant(), assistant_mark);
                out.extend_from_slice(br#",{"role":"user","content":["#);
                for (i, p) in placeholders.iter().enumerate() {
                    let mark = self.policy.suffix && i + 1 == placeholders.len();
                    push_marked(&mut out, p, mark.then(|| self.marker()));
                    out.push(b',');
                }
                out.extend_from_slice(br#"{"type":"text","text":""#);
                json::escape_str_into(&mut out, child.child_message_head());
                let weight = out.len();
                (Bytes::from(out), weight)
            })
    }

    fn push_tail(&self, out: &mut Vec<u8>, request: &Request, stream: bool) {
        let s = &request.settings;
        // An effort without a thinking config becomes a thinking budget, on top of the
        // answer's own limit (the API wants `max_tokens` above the budget).
        let budget = request.effort_budget();
        let thinking = request.thinking_sent();
        let max_tokens = s.max_tokens.saturating_add(budget.unwrap_or(0));
        out.extend_from_slice(br#"],"max_tokens":"#);
        push_json(out, &max_tokens);
        if let Some(t) = thinking {
            out.extend_from_slice(br#","thinking":"#);
            push_json(out, &t);
        }
        if let Some(t) = s.temperature {
            out.extend_from_slice(br#","temperature":"#);
            push_json(out, &t);
        }
        if !s.stop_sequences.is_empty() {
            out.extend_from_slice(br#","stop_sequences":"#);
            push_json(out, &s.stop_sequences);
        }
        if let Some(tc) = &s.tool_choice {
            out.extend_from_slice(br#","tool_choice":"#);
            push_json(out, tc);
        }
        if stream {
            out.extend_from_slice(br#","stream":true"#);
        }
        out.push(b'}');
    }
}

/// A message as an element of `messages`, led by a comma and without any marker, with the
/// offset of the `}` closing its last cacheable block (where a marker would go).
fn encode_message(m: &Message) -> EncodedMessage {
    let mut out = Vec::with_capacity(64 + m.content.len() * 256);
    out.extend_from_slice(br#",{"role":"#);
    json::write_str(&mut out, m.role.as_str());
    out.extend_from_slice(br#","content":["#);
    let mut mark = None;
    for (bi, b) in m.content.iter().enumerate() {
        if bi > 0 {
            out.push(b',');
        }
        push_json(&mut out, b);
        if cacheable(b) && out.last() == Some(&b'}') {
            mark = Some(out.len() - 1);
        }
    }
    out.extend_from_slice(b"]}");
    EncodedMessage {
        bytes: Bytes::from(out),
        mark,
    }
}

fn push_marked<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T, marker: Option<&[u8]>) {
    push_json(out, value);
    if let Some(marker) = marker {
        // Every marked value is a JSON object: reopen it to add the marker as its last key.
        if out.last() == Some(&b'}') {
            out.pop();
            out.push(b',');
            out.extend_from_slice(marker);
            out.push(b'}');
        }
    }
}

impl Codec for AnthropicCodec {
    fn wire(&self) -> WireFormat {
        WireFormat::Anthropic
    }

    fn encode(&self, request: &Request, stream: bool) -> EncodedBody {
        let mut chunks = Chunks {
            chunks: Vec::with_capacity(64),
            bare: true,
        };
        self.prefix_chunks(&request.prefix, &mut chunks);
        let prefix_has_messages = !chunks.bare;
        match &request.suffix {
            // The fast path is only valid on the child's own prefix (the shared bytes are
            // keyed by, and were encoded for, that prefix).
            crate::request::Suffix::Fork(child) if super::is_own_prefix(request, child) => {
                chunks.push(self.fork_shared(child, prefix_has_messages));
                let mut own = Vec::with_capacity(64 + child.directive().len());
                json::escape_str_into(&mut own, child.directive());
                own.extend_from_slice(br#""}]}"#);
                self.push_tail(&mut own, request, stream);
                chunks.push(Bytes::from(own));
            }
            suffix => {
                let messages = suffix.messages();
                let messages = &*messages;
                let mut own = Vec::with_capacity(256 * (messages.len() + 1));
                let mark = if self.policy.suffix {
                    suffix_breakpoint(messages)
                } else {
                    None
                };
                for (mi, m) in messages.iter().enumerate() {
                    if mi > 0 || prefix_has_messages {
                        own.push(b',');
                    }
                    let block = mark.filter(|(i, _)| *i == mi).map(|(_, b)| b);
                    self.push_message(&mut own, m, block);
                }
                self.push_tail(&mut own, request, stream);
                chunks.push(Bytes::from(own));
            }
        }
        EncodedBody::from_chunks(chunks.chunks)
    }

    fn decode_response(&self, body: &[u8]) -> Result<Response> {
        let r: WireResponse = parse_json("Anthropic response", body)?;
        let mut content = Vec::with_capacity(r.content.len());
        for raw in &r.content {
            #[derive(Deserialize)]
            struct Kind<'a> {
                #[serde(rename = "type", borrow)]
                kind: std::borrow::Cow<'a, str>,
            }
            let kind: Kind<'_> = parse_json("Anthropic response block", raw.get().as_bytes())?;
            // Block types this crate does not model (server tool results, ...) are skipped,
            // as the stream decoder skips them.
            if matches!(
                kind.kind.as_ref(),
                "text" | "thinking" | "redacted_thinking" | "tool_use"
            ) {
                content.push(parse_json::<ContentBlock>(
                    "Anthropic response block",
                    raw.get().as_bytes(),
                )?);
            }
        }
        Ok(Response {
            message: Message::assistant(content),
            stop_reason: r.stop_reason.as_deref().map(ModelStop::from_anthropic),
            usage: {
                let mut u = forkhive_core::Usage::default();
                r.usage.partial().apply_to(&mut u);
                u
            },
            id: r.id,
            model: r.model,
        })
    }

    fn stream_decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(AnthropicStream::default())
    }

    fn error_message(&self, body: &[u8]) -> Option<(String, String)> {
        let e: WireErrorBody = serde_json::from_slice(body).ok()?;
        Some((e.error.kind, e.error.message))
    }
}

#[derive(Deserialize)]
struct WireResponse {
    id: Option<String>,
    model: Option<String>,
    content: Vec<Box<serde_json::value::RawValue>>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation: Option<WireCacheCreation>,
}

#[derive(Deserialize)]
struct WireCacheCreation {
    ephemeral_1h_input_tokens: Option<u64>,
}

impl WireUsage {
    fn partial(&self) -> PartialUsage {
        PartialUsage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_write_tokens: self.cache_creation_input_tokens,
            cache_write_1h_tokens: self
                .cache_creation
                .as_ref()
                .and_then(|c| c.ephemeral_1h_input_tokens),
            cache_read_tokens: self.cache_read_input_tokens,
        }
    }
}

#[derive(Deserialize)]
struct WireErrorBody {
    error: WireError,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireStartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: WireStartBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: WireMessageDelta,
        #[serde(default)]
        usage: WireUsage,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct WireStartMessage {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireStartBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {},
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct WireMessageDelta {
    stop_reason: Option<String>,
}

/// Decodes Anthropic's SSE events: message_start, content_block_start/delta/stop,
/// message_delta, message_stop, ping and error; unknown event types are ignored.
#[derive(Debug, Default)]
struct AnthropicStream {
    complete: bool,
    /// Blocks whose type this crate does not model (e.g. server tool results): their deltas
    /// are skipped.
    skipped: Vec<usize>,
}

impl StreamDecoder for AnthropicStream {
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<()> {
        if event.data.is_empty() {
            return Ok(());
        }
        let e: WireEvent = parse_json("Anthropic stream event", event.data.as_bytes())?;
        match e {
            WireEvent::MessageStart { message } => out.push(StreamEvent::MessageStart {
                id: message.id,
                model: message.model,
                usage: message.usage.partial(),
            }),
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let block = match content_block {
                    WireStartBlock::Text { text } => BlockStart::Text(text),
                    WireStartBlock::Thinking {} => BlockStart::Thinking,
                    WireStartBlock::RedactedThinking { data } => BlockStart::RedactedThinking(data),
                    WireStartBlock::ToolUse { id, name } => BlockStart::ToolUse { id, name },
                    WireStartBlock::Unknown => {
                        self.skipped.push(index);
                        return Ok(());
                    }
                };
                out.push(StreamEvent::BlockStart { index, block });
            }
            WireEvent::ContentBlockDelta { index, delta } => {
                if self.skipped.contains(&index) {
                    return Ok(());
                }
                out.push(match delta {
                    WireDelta::TextDelta { text } => StreamEvent::TextDelta { index, text },
                    WireDelta::InputJsonDelta { partial_json } => StreamEvent::InputJsonDelta {
                        index,
                        partial_json,
                    },
                    WireDelta::ThinkingDelta { thinking } => {
                        StreamEvent::ThinkingDelta { index, thinking }
                    }
                    WireDelta::SignatureDelta { signature } => {
                        StreamEvent::SignatureDelta { index, signature }
                    }
                    WireDelta::Unknown => return Ok(()),
                });
            }
            WireEvent::ContentBlockStop { index } => {
                if !self.skipped.contains(&index) {
                    out.push(StreamEvent::BlockStop { index });
                }
            }
            WireEvent::MessageDelta { delta, usage } => out.push(StreamEvent::MessageDelta {
                stop_reason: delta.stop_reason.as_deref().map(ModelStop::from_anthropic),
                usage: usage.partial(),
            }),
            WireEvent::MessageStop => {
                self.complete = true;
                out.push(StreamEvent::MessageStop);
            }
            WireEvent::Ping => out.push(StreamEvent::Ping),
            WireEvent::Error { error } => {
                return Err(Error::from_provider_type(&error.kind, error.message));
            }
            WireEvent::Unknown => {}
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
    use forkhive_core::{ForkPrefix, RawJson, ToolDefinition, Usage};

    fn params() -> CacheSafeParams {
        CacheSafeParams::builder("claude-x")
            .system_block("sys")
            .system_context("os", "linux")
            .user_context("cwd", "/r")
            .tool(ToolDefinition::new("Read", "read", r#"{"type":"object"}"#).unwrap())
            .messages(vec![
                Message::user_text("hi"),
                Message::assistant_text("yo"),
            ])
            .build()
    }

    fn body(codec: &AnthropicCodec, r: &Request, stream: bool) -> String {
        String::from_utf8(codec.encode(r, stream).to_bytes().to_vec()).unwrap()
    }

    /// An effort without a thinking config is a thinking budget, on top of `max_tokens`; a
    /// thinking config the caller set wins.
    #[test]
    fn effort_becomes_a_thinking_budget() {
        let codec = AnthropicCodec::default();
        let mut r = Request::new(params(), vec![Message::user_text("go")]).with_max_tokens(64);
        r.settings.effort = Some(crate::request::Effort::High);
        let b = body(&codec, &r, false);
        assert!(
            b.ends_with(
                r#""max_tokens":16448,"thinking":{"type":"enabled","budget_tokens":16384}}"#
            ),
            "{b}"
        );
        // `max` with the default 8,192 output tokens: cut to fit 32,000 in all.
        r.settings.effort = Some(crate::request::Effort::Max);
        r.settings.max_tokens = 8_192;
        let b = body(&codec, &r, false);
        assert!(
            b.ends_with(
                r#""max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":23808}}"#
            ),
            "{b}"
        );
        // A set temperature: no thinking (the API refuses the two together).
        r.settings.temperature = Some(0.5);
        let b = body(&codec, &r, false);
        assert!(
            b.ends_with(r#""max_tokens":8192,"temperature":0.5}"#),
            "{b}"
        );
        r.settings.temperature = None;
        r.settings.max_tokens = 64;
        r.settings.effort = Some(crate::request::Effort::High);
        r.settings.thinking = Some(forkhive_core::ThinkingConfig::Enabled {
            budget_tokens: 1024,
        });
        let b = body(&codec, &r, false);
        assert!(
            b.ends_with(r#""max_tokens":64,"thinking":{"type":"enabled","budget_tokens":1024}}"#),
            "{b}"
        );
    }

    #[test]
    fn encodes_the_documented_layout_byte_for_byte() {
        let codec = AnthropicCodec::default();
        let r = Request::new(params(), vec![Message::user_text("go")]).with_max_tokens(64);
        assert_eq!(
            body(&codec, &r, true),
            concat!(
                r##"{"model":"claude-x","system":[{"type":"text","text":"sys"},{"type":"text","text":"# os\nlinux","cache_control":{"type":"ephemeral"}}],"##,
                r#""tools":[{"name":"Read","description":"read","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],"#,
                r##""messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>\n# cwd\n/r\n</system-reminder>"}]},"##,
                r#"{"role":"user","content":[{"type":"text","text":"hi"}]},"#,
                r#"{"role":"assistant","content":[{"type":"text","text":"yo","cache_control":{"type":"ephemeral"}}]},"#,
                r#"{"role":"user","content":[{"type":"text","text":"go"}]}],"max_tokens":64,"stream":true}"#
            )
        );
        let v: serde_json::Value = serde_json::from_str(&body(&codec, &r, false)).unwrap();
        assert!(v.get("stream").is_none());
    }

    /// A model alias a definition names (`haiku`, as the built-in `Explore` does) goes to the
    /// API as the id it stands for, which the API takes; an id goes as written.
    #[test]
    fn a_model_alias_is_sent_as_its_id() {
        let codec = AnthropicCodec::default();
        for (model, sent) in [
            ("haiku", "claude-haiku-4-5"),
            ("Sonnet", "claude-sonnet-5"),
            ("claude-x", "claude-x"),
        ] {
            let p = CacheSafeParams::builder(model).build();
            let r = Request::new(p, vec![Message::user_text("go")]).with_max_tokens(8);
            let v: serde_json::Value = serde_json::from_str(&body(&codec, &r, false)).unwrap();
            assert_eq!(v["model"], sent, "{model}");
        }
    }

    #[test]
    fn fork_children_share_encoded_bytes_and_match_a_fresh_encoding() {
        let turn = Message::assistant(vec![
            ContentBlock::text("splitting"),
            ContentBlock::tool_use("t1", "Agent", RawJson::parse(r#"{ "a": 1 }"#).unwrap()),
            ContentBlock::tool_use("t2", "Agent", RawJson::parse(r#"{"b":2}"#).unwrap()),
        ]);
        let prefix = ForkPrefix::new(params(), turn).unwrap();
        let codec = AnthropicCodec::default();
        let bodies: Vec<EncodedBody> = ["one", "two \"quoted\"\n"]
            .iter()
            .map(|d| codec.encode(&Request::fork(prefix.child(d)), false))
            .collect();
        // The prefix chunks and the shared fork part are the same allocations; only the last
        // chunk (the directive and the settings) is the child's own.
        let (own0, shared0) = bodies[0].chunks().split_last().unwrap();
        let (own1, shared1) = bodies[1].chunks().split_last().unwrap();
        assert_eq!(shared0.len(), shared1.len());
        for (a, b) in shared0.iter().zip(shared1) {
            assert_eq!(a.as_ptr(), b.as_ptr());
        }
        assert_ne!(own0.as_ptr(), own1.as_ptr());
        for (b, d) in bodies.iter().zip(["one", "two \"quoted\"\n"]) {
            let child = prefix.child(d);
            // A fresh codec on the generic (materialised) path produces the same bytes.
            let fresh = AnthropicCodec::default()
                .encode(&Request::new(params(), child.suffix().to_vec()), false);
            assert_eq!(b.to_bytes(), fresh.to_bytes());
            let text = String::from_utf8(b.to_bytes().to_vec()).unwrap();
            assert_eq!(text.matches("cache_control").count(), 4);
            assert!(text.contains(r#""content":[{"type":"text","text":"Fork started — processing in background"}],"cache_control":{"type":"ephemeral"}},{"type":"text","text":"<fork-boilerplate>"#));
        }
    }

    #[test]
    fn a_growing_conversation_encodes_each_message_once() {
        let codec = AnthropicCodec::default();
        let mut p = params();
        let mut bodies = Vec::new();
        for turn in 0..300 {
            p = p.append(vec![
                Message::assistant(vec![
                    ContentBlock::text(format!("step {turn}")),
                    ContentBlock::tool_use(
                        format!("t{turn}"),
                        "Read",
                        RawJson::parse(r#"{"p":1}"#).unwrap(),
                    ),
                ]),
                Message::user(vec![ContentBlock::tool_result_text(
                    format!("t{turn}"),
                    "x".repeat(turn),
                )]),
            ]);
            let body = codec.encode(&Request::new(p.clone(), vec![]), false);
            // A few dozen chunks, not one per message.
            assert!(body.chunks().len() <= 50, "{} chunks", body.chunks().len());
            bodies.push(body);
        }
        // Every message was encoded once: one miss each, none evicted.
        let n = p.messages().len() as u64;
        let (entries, _, _, misses) = codec.messages.message_stats();
        assert_eq!((entries as u64, misses), (n, n));
        // And the bodies are what a fresh codec writes.
        let last = bodies.last().unwrap().to_bytes();
        let fresh = AnthropicCodec::default().encode(&Request::new(p.clone(), vec![]), false);
        assert!(last == fresh.to_bytes());
        let prefix = codec.encode_prefix(&p);
        assert!(last.starts_with(&prefix) && &last[prefix.len()..] == br#"],"max_tokens":1024}"#);
        // Consecutive turns share their chunks (the head and the merged history pieces).
        let (a, b) = (&bodies[bodies.len() - 2], &bodies[bodies.len() - 1]);
        let shared = a
            .chunks()
            .iter()
            .filter(|c| b.chunks().iter().any(|d| d.as_ptr() == c.as_ptr()))
            .count();
        assert!(
            shared + 6 >= a.chunks().len(),
            "{shared} of {}",
            a.chunks().len()
        );
    }

    #[test]
    fn empty_system_blocks_are_left_out() {
        let p = CacheSafeParams::builder("m").system_block("").build();
        let b = body(
            &AnthropicCodec::default(),
            &Request::new(p, vec![Message::user_text("x")]),
            false,
        );
        assert!(!b.contains(r#""system""#), "{b}");
        let p = CacheSafeParams::builder("m")
            .system_block("a")
            .system_block("")
            .build();
        let b = body(&AnthropicCodec::default(), &Request::new(p, vec![]), false);
        assert!(
            b.contains(
                r#""system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]"#
            ),
            "{b}"
        );
    }

    #[test]
    fn a_fork_suffix_on_a_foreign_prefix_takes_the_generic_path() {
        let prefix = ForkPrefix::new(params(), Message::assistant_text("split")).unwrap();
        let codec = AnthropicCodec::default();
        // Prime the fast path's memo with the child's own prefix.
        codec.encode(&Request::fork(prefix.child("a")), false);
        let empty = CacheSafeParams::builder("claude-x").build();
        let foreign = Request {
            prefix: empty.clone(),
            ..Request::fork(prefix.child("a"))
        };
        let bytes = codec.encode(&foreign, false).to_bytes();
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap();
        let generic = AnthropicCodec::default().encode(
            &Request::new(empty, prefix.child("a").suffix().to_vec()),
            false,
        );
        assert_eq!(bytes, generic.to_bytes());
    }

    #[test]
    fn unknown_response_blocks_are_skipped() {
        let json = br#"{"content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}},{"type":"web_search_tool_result","tool_use_id":"s","content":[]},{"type":"text","text":"found it"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":2}}"#;
        let r = AnthropicCodec::default().decode_response(json).unwrap();
        assert_eq!(r.message.content, vec![ContentBlock::text("found it")]);
    }

    #[test]
    fn one_hour_ttl_and_no_policy() {
        let r = Request::new(params(), vec![]);
        let one_hour = AnthropicCodec::new(CachePolicy {
            ttl: CacheTtl::OneHour,
            ..CachePolicy::default()
        });
        assert_eq!(
            body(&one_hour, &r, false).matches(r#""ttl":"1h""#).count(),
            3
        );
        assert!(
            !body(&AnthropicCodec::new(CachePolicy::none()), &r, false).contains("cache_control")
        );
    }

    #[test]
    fn decodes_a_response_with_exact_tool_input_and_usage() {
        let json = br#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t","name":"Read","input":{ "p" : 1.0 }}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":9,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40}}}"#;
        let r = AnthropicCodec::default().decode_response(json).unwrap();
        assert_eq!(r.stop_reason, Some(ModelStop::ToolUse));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 3,
                output_tokens: 9,
                cache_write_tokens: 100,
                cache_write_1h_tokens: 40,
                cache_read_tokens: 2000,
                ..Usage::default()
            }
        );
        assert_eq!(
            r.message.tool_uses().next().unwrap().2.as_str(),
            r#"{ "p" : 1.0 }"#
        );
    }

    #[test]
    fn decodes_every_stream_event_type() {
        let mut d = AnthropicCodec::default().stream_decoder();
        let mut out = Vec::new();
        let events = [
            r#"{"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":5,"cache_read_input_tokens":7,"output_tokens":1}}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{}}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"Read","input":{}}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"p\":"}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#,
            r#"{"type":"content_block_stop","index":2}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}"#,
            r#"{"type":"brand_new_event"}"#,
            r#"{"type":"message_stop"}"#,
        ];
        for data in events {
            d.decode(
                &SseEvent {
                    event: None,
                    data: data.into(),
                },
                &mut out,
            )
            .unwrap();
        }
        assert!(d.is_complete());
        let mut b = crate::request::ResponseBuilder::new();
        for e in &out {
            b.push(e).unwrap();
        }
        let r = b.finish().unwrap();
        assert_eq!(r.message.content.len(), 3);
        assert_eq!(r.message.text(), "Hi");
        assert_eq!(r.usage.output_tokens, 12);
        assert_eq!(r.usage.cache_read_tokens, 7);
        assert_eq!(r.stop_reason, Some(ModelStop::ToolUse));
    }

    #[test]
    fn error_events_are_typed() {
        let mut d = AnthropicCodec::default().stream_decoder();
        let err = d
            .decode(
                &SseEvent { event: Some("error".into()), data: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into() },
                &mut Vec::new(),
            )
            .unwrap_err();
        assert!(matches!(err, Error::Overloaded { .. }));
        assert!(err.is_retryable());
        let bad = d
            .decode(
                &SseEvent {
                    event: None,
                    data: "{not json".into(),
                },
                &mut Vec::new(),
            )
            .unwrap_err();
        assert!(matches!(
            bad,
            Error::Decode {
                what: "Anthropic stream event",
                ..
            }
        ));
    }
}
