//! Provider-neutral conversation messages.
//!
//! [`Message`] (de)serialises in the Anthropic Messages API shape:
//! `{"role": "user", "content": [{"type": "text", "text": "..."}, ...]}`. A plain string
//! `content` is accepted on input and becomes one text block. Unknown keys on a block (such as
//! `cache_control` or `citations`) are ignored on input; unknown block types are an error.
//!
//! Serialisation is deterministic: fields are written in one fixed order and a
//! `tool_use.input` is written back with exactly the bytes it was parsed from ([`RawJson`]),
//! because a prompt cache matches bytes, not meaning ("Chapter 9: Sub-Agents and the Fork
//! Pattern — Why byte-level rather than semantic-level?").

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user side: prompts, tool results, notifications.
    User,
    /// The model side: text, thinking and tool calls.
    Assistant,
}

impl Role {
    /// The wire name, `"user"` or `"assistant"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A JSON value kept as the exact bytes it was parsed from.
///
/// Key order, spacing and number spelling survive a parse/serialise round trip, so a model's
/// `tool_use.input` is sent back byte for byte. Cloning is O(1): clones share the text (a
/// message, the calls made from it and the turn's snapshot hold one copy).
#[derive(Clone)]
pub struct RawJson(Arc<RawValue>);

impl RawJson {
    /// Validates `text` as one JSON value and keeps it verbatim.
    ///
    /// Leading and trailing whitespace around the value is not part of it and is dropped.
    pub fn parse(text: &str) -> Result<Self> {
        let raw: Box<RawValue> =
            serde_json::from_str(text).map_err(|source| Error::InvalidJson {
                what: "raw JSON value",
                source,
            })?;
        Ok(Self(Arc::from(raw)))
    }

    /// Encodes `value` compactly with `serde_json`.
    pub fn from_value(value: &serde_json::Value) -> Self {
        // A `Value` always serialises; `to_raw_value` only fails for non-string map keys.
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => Self(Arc::from(raw)),
            Err(_) => Self::empty_object(),
        }
    }

    /// The empty object `{}`.
    pub fn empty_object() -> Self {
        // One shared `{}`: an empty input costs no allocation.
        static EMPTY: std::sync::LazyLock<Arc<RawValue>> = std::sync::LazyLock::new(|| {
            match RawValue::from_string("{}".to_owned()) {
                Ok(raw) => Arc::from(raw),
                // "{}" is valid JSON; this arm only satisfies the type checker.
                Err(_) => Arc::from(Box::<RawValue>::default()),
            }
        });
        Self(Arc::clone(&EMPTY))
    }

    /// The exact JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Parses the JSON into a typed value.
    pub fn to_value<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(self.0.get()).map_err(|source| Error::InvalidJson {
            what: "raw JSON value",
            source,
        })
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RawJson {}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        (*self.0).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|raw| Self(Arc::from(raw)))
    }
}

/// Where an image's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    /// Inline base64 data.
    Base64 {
        /// MIME type, e.g. `image/png`.
        media_type: String,
        /// The base64-encoded bytes.
        data: String,
    },
    /// An image the provider fetches.
    Url {
        /// The image's address.
        url: String,
    },
}

/// The content of a `tool_result` block: a string or a list of blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolResultContent {
    /// Plain text, serialised as a JSON string.
    Text(String),
    /// Content blocks (text and images), serialised as a JSON array.
    Blocks(Vec<ContentBlock>),
}

impl ToolResultContent {
    /// All text in the content, blocks joined without a separator.
    pub fn text(&self) -> String {
        match self {
            ToolResultContent::Text(t) => t.clone(),
            ToolResultContent::Blocks(blocks) => concat_text(blocks),
        }
    }
}

/// The text blocks among `blocks`, joined without a separator: one allocation, sized first
/// (an answer's text is read once per turn).
fn concat_text(blocks: &[ContentBlock]) -> String {
    let texts = || blocks.iter().filter_map(ContentBlock::as_text);
    let mut out = String::with_capacity(texts().map(str::len).sum());
    texts().for_each(|t| out.push_str(t));
    out
}

impl Serialize for ToolResultContent {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            ToolResultContent::Text(t) => serializer.serialize_str(t),
            ToolResultContent::Blocks(b) => b.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ToolResultContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ToolResultContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(ToolResultContent::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Self::Value, E> {
                Ok(ToolResultContent::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                blocks_from_seq(seq).map(ToolResultContent::Blocks)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One block of a message's content.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Visible extended thinking, with the provider's signature.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// The provider's signature over the thinking.
        signature: String,
    },
    /// Thinking the provider returned encrypted.
    RedactedThinking {
        /// The opaque payload.
        data: String,
    },
    /// A tool call made by the model.
    ToolUse {
        /// The call's id, echoed by the matching `tool_result`.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments, byte for byte as the model produced them.
        input: RawJson,
    },
    /// The answer to a tool call.
    ToolResult {
        /// The id of the `tool_use` this answers.
        tool_use_id: String,
        /// What the tool returned.
        content: ToolResultContent,
        /// Whether the tool failed. Written to the wire only when `true`.
        is_error: bool,
    },
    /// An image.
    Image {
        /// Where the image comes from.
        source: ImageSource,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }

    /// A tool call block.
    pub fn tool_use(id: impl Into<String>, name: impl Into<String>, input: RawJson) -> Self {
        ContentBlock::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
        }
    }

    /// A successful tool result carrying `text` as a single text block.
    pub fn tool_result_text(tool_use_id: impl Into<String>, text: impl Into<String>) -> Self {
        ContentBlock::ToolResult {
            tool_use_id: tool_use_id.into(),
            content: ToolResultContent::Blocks(vec![ContentBlock::text(text)]),
            is_error: false,
        }
    }

    /// The wire name of the block type (`"text"`, `"tool_use"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            ContentBlock::Text { .. } => "text",
            ContentBlock::Thinking { .. } => "thinking",
            ContentBlock::RedactedThinking { .. } => "redacted_thinking",
            ContentBlock::ToolUse { .. } => "tool_use",
            ContentBlock::ToolResult { .. } => "tool_result",
            ContentBlock::Image { .. } => "image",
        }
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentBlock::Text { text } => Some(text),
            _ => None,
        }
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.type_name())?;
        match self {
            ContentBlock::Text { text } => map.serialize_entry("text", text)?,
            ContentBlock::Thinking {
                thinking,
                signature,
            } => {
                map.serialize_entry("thinking", thinking)?;
                map.serialize_entry("signature", signature)?;
            }
            ContentBlock::RedactedThinking { data } => map.serialize_entry("data", data)?,
            ContentBlock::ToolUse { id, name, input } => {
                map.serialize_entry("id", id)?;
                map.serialize_entry("name", name)?;
                map.serialize_entry("input", input)?;
            }
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                map.serialize_entry("tool_use_id", tool_use_id)?;
                map.serialize_entry("content", content)?;
                if *is_error {
                    map.serialize_entry("is_error", &true)?;
                }
            }
            ContentBlock::Image { source } => map.serialize_entry("source", source)?,
        }
        map.end()
    }
}

/// Every field any block type may carry; the `type` decides which are required.
#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    thinking: Option<String>,
    signature: Option<String>,
    data: Option<String>,
    id: Option<String>,
    name: Option<String>,
    #[serde(default, deserialize_with = "present_raw")]
    input: Option<RawJson>,
    tool_use_id: Option<String>,
    content: Option<ToolResultContent>,
    is_error: Option<bool>,
    source: Option<ImageSource>,
}

/// Keeps a present `input` (even `null`) as raw bytes; `Option`'s own impl would drop `null`.
fn present_raw<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<RawJson>, D::Error> {
    RawJson::deserialize(d).map(Some)
}

fn required<T, E: de::Error>(v: Option<T>, field: &'static str, kind: &str) -> Result<T, E> {
    v.ok_or_else(|| E::custom(format_args!("missing field `{field}` in a `{kind}` block")))
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let w = WireBlock::deserialize(deserializer)?;
        let k = w.kind.as_str();
        Ok(match k {
            "text" => ContentBlock::Text {
                text: required(w.text, "text", k)?,
            },
            "thinking" => ContentBlock::Thinking {
                thinking: required(w.thinking, "thinking", k)?,
                signature: w.signature.unwrap_or_default(),
            },
            "redacted_thinking" => ContentBlock::RedactedThinking {
                data: required(w.data, "data", k)?,
            },
            "tool_use" => ContentBlock::ToolUse {
                id: required(w.id, "id", k)?,
                name: required(w.name, "name", k)?,
                input: w.input.unwrap_or_else(RawJson::empty_object),
            },
            "tool_result" => ContentBlock::ToolResult {
                tool_use_id: required(w.tool_use_id, "tool_use_id", k)?,
                content: w
                    .content
                    .unwrap_or_else(|| ToolResultContent::Blocks(Vec::new())),
                is_error: w.is_error.unwrap_or(false),
            },
            "image" => ContentBlock::Image {
                source: required(w.source, "source", k)?,
            },
            other => {
                return Err(de::Error::custom(format_args!(
                    "unknown content block type `{other}`"
                )));
            }
        })
    }
}

fn blocks_from_seq<'de, A: SeqAccess<'de>>(
    mut seq: A,
) -> std::result::Result<Vec<ContentBlock>, A::Error> {
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(1));
    while let Some(b) = seq.next_element::<ContentBlock>()? {
        out.push(b);
    }
    Ok(out)
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says, in order.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A user message with the given blocks.
    pub fn user(content: Vec<ContentBlock>) -> Self {
        Self {
            role: Role::User,
            content,
        }
    }

    /// An assistant message with the given blocks.
    pub fn assistant(content: Vec<ContentBlock>) -> Self {
        Self {
            role: Role::Assistant,
            content,
        }
    }

    /// A user message holding one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self::user(vec![ContentBlock::text(text)])
    }

    /// An assistant message holding one text block.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Self::assistant(vec![ContentBlock::text(text)])
    }

    /// Parses one message from Anthropic-shaped JSON.
    ///
    /// ```
    /// use forkhive_core::message::{Message, Role};
    /// let m = Message::from_json(r#"{"role":"user","content":"hello"}"#)?;
    /// assert_eq!(m.role, Role::User);
    /// assert_eq!(m.text(), "hello");
    /// # Ok::<(), forkhive_core::Error>(())
    /// ```
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|source| Error::InvalidJson {
            what: "message",
            source,
        })
    }

    /// The message's canonical JSON bytes (the same bytes `serde_json` writes for it).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_json(&mut out);
        out
    }

    /// Appends the message's canonical JSON bytes to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // Serialising into a Vec cannot fail: every map key is a string and RawJson is valid.
        if serde_json::to_writer(&mut *out, self).is_err() {
            debug_assert!(false, "serialising a Message failed");
        }
    }

    /// All text blocks joined without a separator.
    pub fn text(&self) -> String {
        concat_text(&self.content)
    }

    /// The tool calls in this message, in order, as `(id, name, input)`.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &RawJson)> + '_ {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        map.end()
    }
}

/// `content` of a message: a string or an array of blocks.
struct MessageContent(Vec<ContentBlock>);

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(MessageContent(vec![ContentBlock::text(v)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                blocks_from_seq(seq).map(MessageContent)
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object with `role` and `content`")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut role = None;
                let mut content = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "role" => role = Some(map.next_value::<Role>()?),
                        "content" => content = Some(map.next_value::<MessageContent>()?),
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(Message {
                    role: role.ok_or_else(|| de::Error::missing_field("role"))?,
                    content: content
                        .ok_or_else(|| de::Error::missing_field("content"))?
                        .0,
                })
            }
        }
        deserializer.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_string_content_becomes_one_text_block() {
        let m = Message::from_json(r#"{"role":"assistant","content":"hi"}"#).unwrap();
        assert_eq!(m, Message::assistant_text("hi"));
        assert_eq!(
            m.to_json(),
            br#"{"role":"assistant","content":[{"type":"text","text":"hi"}]}"#
        );
    }

    #[test]
    fn every_block_type_round_trips_byte_for_byte() {
        let json = concat!(
            r#"{"role":"assistant","content":["#,
            r#"{"type":"thinking","thinking":"hmm","signature":"sig"},"#,
            r#"{"type":"redacted_thinking","data":"opaque"},"#,
            r#"{"type":"text","text":"ok"},"#,
            r#"{"type":"tool_use","id":"t1","name":"Read","input":{ "b" : 1.50, "a":[1e3, true] }},"#,
            r#"{"type":"tool_result","tool_use_id":"t1","content":"done","is_error":true},"#,
            r#"{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"x"}]},"#,
            r#"{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},"#,
            r#"{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}"#,
            r#"]}"#
        );
        let m = Message::from_json(json).unwrap();
        assert_eq!(String::from_utf8(m.to_json()).unwrap(), json);
    }

    #[test]
    fn unknown_keys_are_ignored_and_unknown_types_rejected() {
        let m = Message::from_json(
            r#"{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}],"id":"x"}"#,
        )
        .unwrap();
        assert_eq!(m, Message::user_text("a"));

        let err =
            Message::from_json(r#"{"role":"user","content":[{"type":"video"}]}"#).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidJson {
                what: "message",
                ..
            }
        ));
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            cause.contains("unknown content block type `video`"),
            "{cause}"
        );
    }

    #[test]
    fn missing_fields_are_named() {
        let err = Message::from_json(
            r#"{"role":"assistant","content":[{"type":"tool_use","name":"x"}]}"#,
        )
        .unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            cause.contains("missing field `id` in a `tool_use` block"),
            "{cause}"
        );
        let err = Message::from_json(r#"{"content":"x"}"#).unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("missing field `role`"), "{cause}");
        let err = Message::from_json(r#"{"role":"system","content":"x"}"#).unwrap_err();
        assert!(
            std::error::Error::source(&err)
                .unwrap()
                .to_string()
                .contains("unknown variant `system`")
        );
    }

    #[test]
    fn raw_json_rejects_invalid_input() {
        assert!(matches!(
            RawJson::parse("{\"a\":"),
            Err(Error::InvalidJson { .. })
        ));
        assert_eq!(RawJson::parse(" [1, 2] ").unwrap().as_str(), "[1, 2]");
    }

    /// JSON text with arbitrary spacing, key order and number spellings.
    fn arb_json_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n", "\t ", "  "]);
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("1.0".to_owned()),
            Just("-0".to_owned()),
            Just("1e3".to_owned()),
            Just("2E-7".to_owned()),
            Just("12345678901234567890".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            "[a-z\\\\\"é\u{1F600} ]{0,8}"
                .prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
            Just(r#""\u00e9\n""#.to_owned()),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            let ws = ws.clone();
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws.clone()), 0..4)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", body.join(","))
                }),
                (prop::collection::vec(("[a-z]{1,3}", inner, ws), 0..4)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn text_joins_only_the_text_blocks_in_order(
            parts in prop::collection::vec(prop::option::of("[a-zé ]{0,8}"), 0..6),
        ) {
            let blocks: Vec<ContentBlock> = parts
                .iter()
                .map(|p| match p {
                    Some(t) => ContentBlock::text(t.as_str()),
                    None => ContentBlock::tool_use("id", "T", RawJson::from_value(&serde_json::json!({}))),
                })
                .collect();
            let expected: String = parts.iter().flatten().map(String::as_str).collect();
            let text = Message { role: Role::Assistant, content: blocks.clone() }.text();
            prop_assert!(text.capacity() >= expected.len());
            prop_assert_eq!(&text, &expected);
            prop_assert_eq!(ToolResultContent::Blocks(blocks).text(), expected);
        }

        #[test]
        fn tool_use_input_keeps_its_exact_bytes(input in arb_json_text(), id in "[a-zA-Z0-9_]{1,12}") {
            let json = format!(
                r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"{id}","name":"T","input":{input}}}]}}"#
            );
            let m = Message::from_json(&json).unwrap();
            prop_assert_eq!(String::from_utf8(m.to_json()).unwrap(), json);
        }
    }
}
