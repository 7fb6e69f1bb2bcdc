//! Wire codecs: deterministic request encoding and response/stream decoding.
//!
//! An encoded body is a rope of [`Bytes`] chunks: the head of the cache-safe prefix (model,
//! system, tools; encoded once per distinct head), the prefix's messages (each encoded once,
//! memoised by its digest, and kept as a few merged pieces per recent prefix; see
//! [`MemoConfig`]), for a fork child the part it shares with its siblings (encoded once per
//! parent turn), and the request's own tail. Encoding N fork children therefore never
//! re-encodes the parent's history (each child costs O(directive + settings)), and an agent's
//! next turn costs O(new messages), not O(history).
//!
//! The prefix is laid out first in the body (`model`, `system`, `tools`, then `messages`) and
//! the per-call settings (`max_tokens`, `stream`, ...) come after the messages, so that every
//! request on one prefix starts with the same bytes.

pub mod anthropic;
mod memo;
pub mod openai;

use std::fmt;

use bytes::Bytes;
use forkhive_core::{ContentBlock, Message};

use crate::error::Result;
use crate::request::{Request, Response, StreamEvent};
use crate::sse::SseEvent;

pub use anthropic::AnthropicCodec;
pub use memo::MemoConfig;
pub use openai::OpenAiCodec;

/// Which wire format a codec speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireFormat {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI-compatible Chat Completions (`/v1/chat/completions`).
    OpenAi,
}

impl fmt::Display for WireFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireFormat::Anthropic => "anthropic",
            WireFormat::OpenAi => "openai",
        })
    }
}

/// A request body as shared chunks. Concatenated, the chunks are the body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EncodedBody {
    chunks: Vec<Bytes>,
}

impl EncodedBody {
    /// A body from chunks.
    pub fn from_chunks(chunks: Vec<Bytes>) -> Self {
        Self { chunks }
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The body as one contiguous buffer (copies unless there is a single chunk).
    pub fn to_bytes(&self) -> Bytes {
        match self.chunks.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut v = Vec::with_capacity(self.len());
                for c in many {
                    v.extend_from_slice(c);
                }
                Bytes::from(v)
            }
        }
    }
}

/// Encodes requests and decodes answers for one wire format.
pub trait Codec: Send + Sync + fmt::Debug + 'static {
    /// The wire format.
    fn wire(&self) -> WireFormat;

    /// The request body; `stream` selects a streamed answer.
    fn encode(&self, request: &Request, stream: bool) -> EncodedBody;

    /// Decodes a complete (non-streamed) answer.
    fn decode_response(&self, body: &[u8]) -> Result<Response>;

    /// A decoder for one streamed answer.
    fn stream_decoder(&self) -> Box<dyn StreamDecoder>;

    /// The provider's error message in an error body, if it has the provider's shape.
    fn error_message(&self, body: &[u8]) -> Option<(String, String)>;
}

/// Turns the server-sent events of one streamed answer into [`StreamEvent`]s.
pub trait StreamDecoder: Send + fmt::Debug {
    /// Decodes one event, appending what it means to `out`.
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<()>;

    /// Whether the provider has said the answer is complete.
    fn is_complete(&self) -> bool;
}

/// Where `cache_control` breakpoints go (Anthropic allows at most 4 per request).
///
/// The default marks the end of the tools, the end of the system prompt, the end of the
/// cache-safe message prefix, and — when the request has suffix messages — the last
/// cacheable block before the request's final block (for a fork child: the last placeholder
/// result, so that siblings read what the first child wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CachePolicy {
    /// Mark the last tool definition.
    pub tools: bool,
    /// Mark the last system block.
    pub system: bool,
    /// Mark the last cacheable block of the cache-safe message prefix.
    pub prefix_messages: bool,
    /// Mark the last cacheable suffix block before the request's final block.
    pub suffix: bool,
    /// The TTL every breakpoint asks for.
    pub ttl: CacheTtl,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            tools: true,
            system: true,
            prefix_messages: true,
            suffix: true,
            ttl: CacheTtl::FiveMinutes,
        }
    }
}

impl CachePolicy {
    /// No breakpoints at all.
    pub fn none() -> Self {
        Self {
            tools: false,
            system: false,
            prefix_messages: false,
            suffix: false,
            ttl: CacheTtl::FiveMinutes,
        }
    }
}

/// A cache entry's time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheTtl {
    /// Five minutes (the provider's default; written at 1.25x the input price).
    #[default]
    FiveMinutes,
    /// One hour (written at 2x the input price).
    OneHour,
}

impl CacheTtl {
    /// The duration.
    pub fn duration(self) -> std::time::Duration {
        match self {
            CacheTtl::FiveMinutes => std::time::Duration::from_secs(300),
            CacheTtl::OneHour => std::time::Duration::from_secs(3600),
        }
    }
}

/// Whether `request`'s prefix is the one `child` was forked from (same bytes), so that the
/// codecs' fork fast path applies.
pub(crate) fn is_own_prefix(request: &Request, child: &forkhive_core::ForkChild) -> bool {
    request.prefix.ptr_eq(child.params())
        || request.prefix.fingerprint().total() == child.params().fingerprint().total()
}

/// Whether a provider accepts a `cache_control` marker on this block.
pub(crate) fn cacheable(block: &ContentBlock) -> bool {
    match block {
        ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => false,
        ContentBlock::Text { text } => !text.is_empty(),
        _ => true,
    }
}

/// The (message, block) of the last cacheable block in `messages`.
pub(crate) fn last_cacheable(messages: &[&Message]) -> Option<(usize, usize)> {
    messages
        .iter()
        .enumerate()
        .rev()
        .find_map(|(mi, m)| m.content.iter().rposition(cacheable).map(|bi| (mi, bi)))
}

/// The (message, block) of the last cacheable block of `suffix` that is not its final block.
pub(crate) fn suffix_breakpoint(suffix: &[Message]) -> Option<(usize, usize)> {
    let mut seen_final = false;
    for (mi, m) in suffix.iter().enumerate().rev() {
        for (bi, b) in m.content.iter().enumerate().rev() {
            if !seen_final {
                seen_final = true;
                continue;
            }
            if cacheable(b) {
                return Some((mi, bi));
            }
        }
    }
    None
}

/// Appends `value` serialised compactly with `serde_json`.
pub(crate) fn push_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    if serde_json::to_writer(&mut *out, value).is_err() {
        debug_assert!(false, "serialising plain data failed");
    }
}

/// Parses `bytes` as JSON of type `T`, naming `what` in the error.
pub(crate) fn parse_json<'a, T: serde::Deserialize<'a>>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| crate::Error::Decode {
        what,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_breakpoint_skips_the_final_block_and_thinking() {
        let a = Message::assistant(vec![
            ContentBlock::text("x"),
            ContentBlock::Thinking {
                thinking: "t".into(),
                signature: "s".into(),
            },
        ]);
        let u = Message::user_text("final");
        assert_eq!(suffix_breakpoint(&[a.clone(), u.clone()]), Some((0, 0)));
        assert_eq!(suffix_breakpoint(std::slice::from_ref(&u)), None);
        assert_eq!(last_cacheable(&[&a]), Some((0, 0)));
        assert_eq!(last_cacheable(&[&Message::user_text("")]), None);
    }

    #[test]
    fn body_concatenates_its_chunks() {
        let b = EncodedBody::from_chunks(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")]);
        assert_eq!(b.len(), 3);
        assert_eq!(&b.to_bytes()[..], b"abc");
        assert!(EncodedBody::default().is_empty());
    }
}
