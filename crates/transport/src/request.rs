//! Requests, responses and stream events: the data a [`Backend`](crate::Backend) exchanges.

use std::fmt;

use forkhive_core::{
    CacheBreak, CacheSafeParams, ContentBlock, ForkChild, Message, PrefixFingerprint, RawJson,
    Role, ThinkingConfig, Usage,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What to do with tools on this call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Any,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool {
        /// The tool's name.
        name: String,
    },
}

/// Per-call settings: everything that is not part of the cache-safe prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSettings {
    /// The most output tokens to generate.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Strings that stop generation.
    pub stop_sequences: Vec<String>,
    /// Tool-use constraint (changing it invalidates a provider's message cache).
    pub tool_choice: Option<ToolChoice>,
    /// A thinking config for this call, overriding the prefix's (changing it invalidates a
    /// provider's message cache; it is encoded after the messages so the prefix bytes stay
    /// shared).
    pub thinking: Option<ThinkingConfig>,
    /// OpenAI's optional `prompt_cache_key` routing hint.
    pub prompt_cache_key: Option<String>,
    /// How hard the model should reason (an agent definition's `effort`), as each wire format
    /// can say it: Anthropic, a thinking budget ([`Effort::thinking_budget`]) when no
    /// thinking config is set; OpenAI-compatible, `reasoning_effort`.
    pub effort: Option<Effort>,
}

/// The most `max_tokens` an effort's thinking budget raises a request to (the output cap of
/// the smallest thinking model): the budget is cut to fit under it.
pub const EFFORT_MAX_TOKENS: u32 = 32_000;

/// Reasoning effort, as agent definitions write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Effort {
    /// `low`.
    Low,
    /// `medium`.
    Medium,
    /// `high`.
    High,
    /// `max`: more than `high` where the format can say so.
    Max,
}

impl Effort {
    /// Every effort, lowest first.
    pub const ALL: [Effort; 4] = [Effort::Low, Effort::Medium, Effort::High, Effort::Max];

    /// The effort named `name` (`low`, `medium`, `high`, `max`; any case).
    pub fn from_name(name: &str) -> Option<Effort> {
        let name = name.trim().to_ascii_lowercase();
        Effort::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }

    /// The Anthropic thinking budget it becomes: 2,048, 8,192, 16,384 or 32,768 tokens, cut so
    /// that `max_tokens` plus the budget stays within [`EFFORT_MAX_TOKENS`] (no thinking when
    /// less than 1,024 would be left, or when a temperature is set). The request's
    /// `max_tokens` grows by the budget (the API wants it above the budget), so the answer
    /// keeps its own limit.
    pub fn thinking_budget(self) -> u32 {
        match self {
            Effort::Low => 2_048,
            Effort::Medium => 8_192,
            Effort::High => 16_384,
            Effort::Max => 32_768,
        }
    }

    /// The OpenAI `reasoning_effort` it becomes, and whether that says it exactly (`max` is
    /// sent as `high`, the most the format has).
    pub fn reasoning_effort(self) -> (&'static str, bool) {
        match self {
            Effort::Low => ("low", true),
            Effort::Medium => ("medium", true),
            Effort::High => ("high", true),
            Effort::Max => ("high", false),
        }
    }
}

impl Default for RequestSettings {
    fn default() -> Self {
        Self {
            max_tokens: 1024,
            temperature: None,
            stop_sequences: Vec::new(),
            tool_choice: None,
            thinking: None,
            prompt_cache_key: None,
            effort: None,
        }
    }
}

/// The messages a request adds after its cache-safe prefix.
#[derive(Debug, Clone)]
pub enum Suffix {
    /// Ordinary messages.
    Messages(Vec<Message>),
    /// A fork child's two messages. Codecs encode the part shared with its siblings once.
    Fork(ForkChild),
}

impl Suffix {
    /// The suffix messages: borrowed, or materialised for a fork child.
    pub fn messages(&self) -> std::borrow::Cow<'_, [Message]> {
        match self {
            Suffix::Messages(m) => std::borrow::Cow::Borrowed(m),
            Suffix::Fork(c) => std::borrow::Cow::Owned(c.suffix().to_vec()),
        }
    }

    /// Whether there are no suffix messages.
    pub fn is_empty(&self) -> bool {
        match self {
            Suffix::Messages(m) => m.is_empty(),
            Suffix::Fork(_) => false,
        }
    }
}

/// One call to a model: a cache-safe prefix, the messages after it, and per-call settings.
#[derive(Debug, Clone)]
pub struct Request {
    /// System prompt, context, tools, model and the conversation prefix (shared, O(1) clone).
    pub prefix: CacheSafeParams,
    /// The messages after the prefix.
    pub suffix: Suffix,
    /// Per-call settings.
    pub settings: RequestSettings,
    /// A name for logs and recordings (`child-2`); never sent.
    pub label: Option<String>,
}

impl Request {
    /// A request continuing `prefix` with `suffix`.
    pub fn new(prefix: CacheSafeParams, suffix: Vec<Message>) -> Self {
        Self {
            prefix,
            suffix: Suffix::Messages(suffix),
            settings: RequestSettings::default(),
            label: None,
        }
    }

    /// The request of a fork child: the parent's prefix plus the child's two messages.
    pub fn fork(child: ForkChild) -> Self {
        Self {
            prefix: child.params().clone(),
            suffix: Suffix::Fork(child),
            settings: RequestSettings::default(),
            label: None,
        }
    }

    /// Sets the settings.
    pub fn with_settings(mut self, settings: RequestSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Sets `max_tokens`.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.settings.max_tokens = max_tokens;
        self
    }

    /// Sets the label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The thinking config in force: the settings' override, else the prefix's.
    pub fn thinking(&self) -> Option<ThinkingConfig> {
        self.settings.thinking.or(self.prefix.thinking())
    }

    /// The thinking budget an effort sets (Anthropic): with no thinking config in force and
    /// no temperature (the API refuses thinking with one), within [`EFFORT_MAX_TOKENS`] with
    /// `max_tokens`; a budget under the API's 1,024 is no thinking.
    pub(crate) fn effort_budget(&self) -> Option<u32> {
        let s = &self.settings;
        match (self.thinking(), s.effort, s.temperature) {
            (None, Some(e), None) => Some(
                e.thinking_budget()
                    .min(EFFORT_MAX_TOKENS.saturating_sub(s.max_tokens)),
            )
            .filter(|b| *b >= 1_024),
            _ => None,
        }
    }

    /// The thinking config Anthropic's wire format sends: [`thinking`](Self::thinking), else
    /// the budget the effort sets.
    pub fn thinking_sent(&self) -> Option<ThinkingConfig> {
        self.thinking().or(self
            .effort_budget()
            .map(|budget_tokens| ThinkingConfig::Enabled { budget_tokens }))
    }

    /// The first difference that stops `later` from reading what this request cached, sent
    /// in `wire`'s format, by that provider's rules ("Prompt caching" in `docs/references.md`),
    /// per-call settings included: the model, a tool, a system block or context entry
    /// ([`PrefixFingerprint::diff`]); then, for Anthropic, the thinking config sent
    /// ([`thinking_sent`](Self::thinking_sent): [`CacheBreak::Thinking`], or
    /// [`CacheBreak::Effort`] when only the budget an effort sets differs) and `tool_choice`
    /// ([`CacheBreak::ToolChoice`]), which invalidate the messages cache; then the messages.
    /// OpenAI's automatic cache matches the prompt's prefix alone, so there no setting breaks
    /// it. `None` when `later` sends the same prefix or extends it.
    ///
    /// [`PrefixFingerprint::diff`] compares prefixes alone: two requests that differ only in
    /// their settings have equal fingerprints.
    pub fn cache_break(&self, later: &Request, wire: crate::WireFormat) -> Option<CacheBreak> {
        // The thinking actually sent is compared below, not the prefixes' own (a per-call
        // override or an effort's budget may stand in for it).
        let prefix = self
            .fingerprint()
            .diff_ignoring_thinking(&later.fingerprint());
        if let Some(
            b @ (CacheBreak::Model
            | CacheBreak::Tool { .. }
            | CacheBreak::SystemPrompt { .. }
            | CacheBreak::SystemContext { .. }),
        ) = prefix
        {
            return Some(b);
        }
        if wire == crate::WireFormat::Anthropic {
            if self.thinking_sent() != later.thinking_sent() {
                return Some(if self.thinking() != later.thinking() {
                    CacheBreak::Thinking
                } else {
                    CacheBreak::Effort
                });
            }
            if self.settings.tool_choice != later.settings.tool_choice {
                return Some(CacheBreak::ToolChoice);
            }
        }
        prefix
    }

    /// The fingerprint of the whole request: the prefix followed by the suffix messages, as
    /// if they were one cache-safe prefix. O(suffix): a fork child's is O(directive).
    ///
    /// Two requests with equal [`total`](PrefixFingerprint::total) digests send the same
    /// system prompt, contexts, tools, model, thinking config and messages; the per-call
    /// [`settings`](Self::settings) are not part of it ([`cache_break`](Self::cache_break)
    /// compares them too).
    pub fn fingerprint(&self) -> PrefixFingerprint {
        match &self.suffix {
            Suffix::Fork(child) if crate::codec::is_own_prefix(self, child) => child.fingerprint(),
            suffix => self.prefix.fingerprint().extend(&suffix.messages()),
        }
    }

    /// Every message of the request, materialised (O(history): for inspection and tests).
    pub fn all_messages(&self) -> Vec<Message> {
        let mut out = self.prefix.messages().to_vec();
        out.extend_from_slice(&self.suffix.messages());
        out
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModelStop {
    /// It finished its turn.
    EndTurn,
    /// It hit `max_tokens`.
    MaxTokens,
    /// It produced a stop sequence.
    StopSequence,
    /// It wants tool results.
    ToolUse,
    /// A long turn was paused by the provider.
    PauseTurn,
    /// It refused.
    Refusal,
    /// Something this crate does not know.
    Other(String),
}

impl ModelStop {
    /// From Anthropic's spelling.
    pub fn from_anthropic(s: &str) -> Self {
        match s {
            "end_turn" => ModelStop::EndTurn,
            "max_tokens" => ModelStop::MaxTokens,
            "stop_sequence" => ModelStop::StopSequence,
            "tool_use" => ModelStop::ToolUse,
            "pause_turn" => ModelStop::PauseTurn,
            "refusal" => ModelStop::Refusal,
            other => ModelStop::Other(other.to_owned()),
        }
    }

    /// From OpenAI's `finish_reason`.
    pub fn from_openai(s: &str) -> Self {
        match s {
            "stop" => ModelStop::EndTurn,
            "length" => ModelStop::MaxTokens,
            "tool_calls" | "function_call" => ModelStop::ToolUse,
            "content_filter" => ModelStop::Refusal,
            other => ModelStop::Other(other.to_owned()),
        }
    }

    /// Anthropic's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            ModelStop::EndTurn => "end_turn",
            ModelStop::MaxTokens => "max_tokens",
            ModelStop::StopSequence => "stop_sequence",
            ModelStop::ToolUse => "tool_use",
            ModelStop::PauseTurn => "pause_turn",
            ModelStop::Refusal => "refusal",
            ModelStop::Other(s) => s,
        }
    }
}

impl fmt::Display for ModelStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A complete answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The assistant message.
    pub message: Message,
    /// Why the model stopped, if the provider said.
    pub stop_reason: Option<ModelStop>,
    /// Token counts exactly as the provider reported them.
    pub usage: Usage,
    /// The provider's id for the answer, if any.
    pub id: Option<String>,
    /// The model that answered, if the provider said.
    pub model: Option<String>,
}

impl Response {
    /// An end-of-turn text answer with the given usage.
    pub fn text(text: impl Into<String>, usage: Usage) -> Self {
        Self {
            message: Message::assistant_text(text),
            stop_reason: Some(ModelStop::EndTurn),
            usage,
            id: None,
            model: None,
        }
    }

    /// An end-of-turn text answer whose usage counts its output tokens (estimated from its
    /// length, as the cache simulator does): what a scripted model says.
    pub fn say(text: impl Into<String>) -> Self {
        let text = text.into();
        let usage = Usage {
            output_tokens: crate::simulator::estimate_tokens(text.len()),
            ..Usage::default()
        };
        Self::text(text, usage)
    }

    /// A `tool_use` answer calling each `(tool, input)` in order, for a scripted model.
    ///
    /// Each call's id is `toolu_` and 16 hex digits of a SHA-256 over the tool, its input and
    /// its position, so the same script gives the same bytes on every run. Output tokens are
    /// estimated from the inputs' length.
    ///
    /// ```
    /// use forkhive_transport::Response;
    /// let r = Response::tool_calls([("Agent", serde_json::json!({"prompt": "audit"}))]);
    /// let (id, name, input) = r.message.tool_uses().next().unwrap();
    /// assert!(id.starts_with("toolu_") && name == "Agent");
    /// assert_eq!(input.as_str(), r#"{"prompt":"audit"}"#);
    /// ```
    pub fn tool_calls<N: Into<String>>(
        calls: impl IntoIterator<Item = (N, serde_json::Value)>,
    ) -> Self {
        use sha2::{Digest, Sha256};
        let mut bytes = 0;
        let content: Vec<ContentBlock> = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, input))| {
                let name = name.into();
                let input = forkhive_core::RawJson::from_value(&input);
                let digest = Sha256::new()
                    .chain_update(name.as_bytes())
                    .chain_update([0])
                    .chain_update(input.as_str().as_bytes())
                    .chain_update(i.to_le_bytes())
                    .finalize();
                let mut id = String::with_capacity(22);
                id.push_str("toolu_");
                for b in &digest[..8] {
                    id.push_str(&format!("{b:02x}"));
                }
                bytes += name.len() + input.as_str().len();
                ContentBlock::tool_use(id, name, input)
            })
            .collect();
        Self {
            message: Message::assistant(content),
            stop_reason: Some(ModelStop::ToolUse),
            usage: Usage {
                output_tokens: crate::simulator::estimate_tokens(bytes),
                ..Usage::default()
            },
            id: None,
            model: None,
        }
    }

    /// The same answer with `usage` instead.
    #[must_use]
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
}

/// Usage fields as a stream event reports them: each may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartialUsage {
    /// Uncached input tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens so far (cumulative).
    pub output_tokens: Option<u64>,
    /// Tokens written to the cache.
    pub cache_write_tokens: Option<u64>,
    /// Of those, written with the 1-hour TTL.
    pub cache_write_1h_tokens: Option<u64>,
    /// Tokens read from the cache.
    pub cache_read_tokens: Option<u64>,
}

impl PartialUsage {
    /// Overwrites the fields of `usage` this report carries.
    pub fn apply_to(&self, usage: &mut Usage) {
        if let Some(v) = self.input_tokens {
            usage.input_tokens = v;
        }
        if let Some(v) = self.output_tokens {
            usage.output_tokens = v;
        }
        if let Some(v) = self.cache_write_tokens {
            usage.cache_write_tokens = v;
        }
        if let Some(v) = self.cache_write_1h_tokens {
            usage.cache_write_1h_tokens = v;
        }
        if let Some(v) = self.cache_read_tokens {
            usage.cache_read_tokens = v;
        }
    }

    /// Every field of `usage`, present.
    pub fn full(usage: &Usage) -> Self {
        Self {
            input_tokens: Some(usage.input_tokens),
            output_tokens: Some(usage.output_tokens),
            cache_write_tokens: Some(usage.cache_write_tokens),
            cache_write_1h_tokens: Some(usage.cache_write_1h_tokens),
            cache_read_tokens: Some(usage.cache_read_tokens),
        }
    }
}

/// How a content block begins in a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockStart {
    /// A text block (with any initial text).
    Text(String),
    /// A thinking block.
    Thinking,
    /// A redacted thinking block and its payload.
    RedactedThinking(String),
    /// A tool call.
    ToolUse {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
    },
}

/// One event of a streamed answer, provider-neutral.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StreamEvent {
    /// The answer began; usage known so far (input and cache counters).
    MessageStart {
        /// The provider's id for the answer.
        id: Option<String>,
        /// The answering model.
        model: Option<String>,
        /// Usage reported at the start.
        usage: PartialUsage,
    },
    /// A content block began at `index`.
    BlockStart {
        /// Block index.
        index: usize,
        /// Its kind.
        block: BlockStart,
    },
    /// Text for the block at `index`.
    TextDelta {
        /// Block index.
        index: usize,
        /// The text.
        text: String,
    },
    /// Thinking text for the block at `index`.
    ThinkingDelta {
        /// Block index.
        index: usize,
        /// The thinking text.
        thinking: String,
    },
    /// The thinking signature for the block at `index`.
    SignatureDelta {
        /// Block index.
        index: usize,
        /// The signature.
        signature: String,
    },
    /// A fragment of a tool call's JSON input.
    InputJsonDelta {
        /// Block index.
        index: usize,
        /// The fragment.
        partial_json: String,
    },
    /// The block at `index` is complete.
    BlockStop {
        /// Block index.
        index: usize,
    },
    /// The answer's end state and cumulative usage.
    MessageDelta {
        /// Why the model stopped.
        stop_reason: Option<ModelStop>,
        /// Usage fields reported here (cumulative).
        usage: PartialUsage,
    },
    /// The answer is complete.
    MessageStop,
    /// Keep-alive.
    Ping,
}

#[derive(Debug)]
enum Building {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
}

/// Folds stream events into a [`Response`].
#[derive(Debug, Default)]
pub struct ResponseBuilder {
    blocks: Vec<(usize, Building)>,
    /// The largest block index started so far.
    max_index: Option<usize>,
    /// Whether the last started block's index is the only block with that index, so the
    /// events that follow its start find it without a search (an answer of thousands of
    /// tool calls is then linear, not quadratic).
    last_is_unique: bool,
    /// Indexes of the blocks whose `BlockStop` arrived.
    closed: std::collections::BTreeSet<usize>,
    usage: Usage,
    stop_reason: Option<ModelStop>,
    id: Option<String>,
    model: Option<String>,
    started: bool,
    stopped: bool,
    events: usize,
    ignored: usize,
}

impl ResponseBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Events seen so far.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Whether `MessageStop` was seen.
    pub fn is_complete(&self) -> bool {
        self.stopped
    }

    /// The block being built at `index`, or `None` (with a warning) for a block that never
    /// started: the official SDKs skip such an event instead of failing the whole answer.
    fn block(&mut self, index: usize, event: &str) -> Option<&mut Building> {
        let last_matches =
            self.last_is_unique && self.blocks.last().is_some_and(|(i, _)| *i == index);
        let found = if last_matches {
            self.blocks.last_mut().map(|(_, b)| b)
        } else {
            // Out of order, or an index started twice (the first one gets the deltas).
            self.blocks
                .iter_mut()
                .find(|(i, _)| *i == index)
                .map(|(_, b)| b)
        };
        if found.is_none() {
            tracing::warn!(
                index,
                event,
                "ignoring a stream event for content block {index}, which never started"
            );
            self.ignored += 1;
        }
        found
    }

    /// How many events were ignored because their content block never started.
    pub fn ignored_events(&self) -> usize {
        self.ignored
    }

    /// Applies one event.
    pub fn push(&mut self, event: &StreamEvent) -> Result<()> {
        self.events += 1;
        match event {
            StreamEvent::MessageStart { id, model, usage } => {
                self.started = true;
                self.id.clone_from(id);
                self.model.clone_from(model);
                usage.apply_to(&mut self.usage);
            }
            StreamEvent::BlockStart { index, block } => {
                let b = match block {
                    BlockStart::Text(t) => Building::Text(t.clone()),
                    BlockStart::Thinking => Building::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    BlockStart::RedactedThinking(d) => Building::Redacted(d.clone()),
                    BlockStart::ToolUse { id, name } => Building::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                        json: String::new(),
                    },
                };
                self.last_is_unique = self.max_index.is_none_or(|m| *index > m)
                    || !self.blocks.iter().any(|(i, _)| i == index);
                self.max_index = Some(self.max_index.map_or(*index, |m| m.max(*index)));
                self.blocks.push((*index, b));
            }
            StreamEvent::TextDelta { index, text } => match self.block(*index, "text_delta") {
                Some(Building::Text(t)) => t.push_str(text),
                Some(_) => return Err(mismatch(*index, "text_delta")),
                None => {}
            },
            StreamEvent::ThinkingDelta { index, thinking } => {
                match self.block(*index, "thinking_delta") {
                    Some(Building::Thinking { thinking: t, .. }) => t.push_str(thinking),
                    Some(_) => return Err(mismatch(*index, "thinking_delta")),
                    None => {}
                }
            }
            StreamEvent::SignatureDelta { index, signature } => {
                match self.block(*index, "signature_delta") {
                    Some(Building::Thinking { signature: s, .. }) => s.push_str(signature),
                    Some(_) => return Err(mismatch(*index, "signature_delta")),
                    None => {}
                }
            }
            StreamEvent::InputJsonDelta {
                index,
                partial_json,
            } => match self.block(*index, "input_json_delta") {
                Some(Building::ToolUse { json, .. }) => json.push_str(partial_json),
                Some(_) => return Err(mismatch(*index, "input_json_delta")),
                None => {}
            },
            StreamEvent::BlockStop { index } => {
                if self.block(*index, "content_block_stop").is_some() {
                    self.closed.insert(*index);
                }
            }
            StreamEvent::MessageDelta { stop_reason, usage } => {
                if stop_reason.is_some() {
                    self.stop_reason.clone_from(stop_reason);
                }
                usage.apply_to(&mut self.usage);
            }
            StreamEvent::MessageStop => self.stopped = true,
            StreamEvent::Ping => {}
        }
        Ok(())
    }

    /// The response, once `MessageStop` was seen.
    pub fn finish(self) -> Result<Response> {
        if !self.stopped {
            return Err(Error::TruncatedStream {
                events: self.events,
                detail: "the stream ended without a message_stop event".to_owned(),
            });
        }
        self.into_response()
    }

    /// Like [`finish`](Self::finish), for an answer that may have been cut off at
    /// `max_tokens`: a tool call that was cut gets `{}` as its input instead of failing the
    /// answer, and its id is returned so the caller can answer it with an error.
    ///
    /// When the answer stopped at `max_tokens`, a tool call counts as cut if its block never
    /// received its `BlockStop` (whatever its input: empty, or a prefix that happens to parse)
    /// or if its input JSON does not parse. Otherwise nothing is cut.
    pub fn finish_cut_off(mut self) -> Result<(Response, Vec<String>)> {
        if !self.stopped {
            return Err(Error::TruncatedStream {
                events: self.events,
                detail: "the stream ended without a message_stop event".to_owned(),
            });
        }
        let mut cut = Vec::new();
        if self.stop_reason == Some(ModelStop::MaxTokens) {
            for (index, b) in &mut self.blocks {
                if let Building::ToolUse { id, json, .. } = b {
                    let unfinished = !self.closed.contains(index);
                    let broken = !json.trim().is_empty() && RawJson::parse(json).is_err();
                    if unfinished || broken {
                        cut.push(id.clone());
                        json.clear();
                    }
                }
            }
        }
        Ok((self.into_response()?, cut))
    }

    fn into_response(mut self) -> Result<Response> {
        self.blocks.sort_by_key(|(i, _)| *i);
        let mut content = Vec::with_capacity(self.blocks.len());
        for (_, b) in self.blocks {
            content.push(match b {
                Building::Text(text) => ContentBlock::Text { text },
                Building::Thinking {
                    thinking,
                    signature,
                } => ContentBlock::Thinking {
                    thinking,
                    signature,
                },
                Building::Redacted(data) => ContentBlock::RedactedThinking { data },
                Building::ToolUse { id, name, json } => {
                    let input = if json.trim().is_empty() {
                        RawJson::empty_object()
                    } else {
                        RawJson::parse(&json).map_err(|e| Error::Decode {
                            what: "tool_use input",
                            detail: format!("tool call {id}: {e}: {json:?}"),
                        })?
                    };
                    ContentBlock::ToolUse { id, name, input }
                }
            });
        }
        Ok(Response {
            message: Message {
                role: Role::Assistant,
                content,
            },
            stop_reason: self.stop_reason,
            usage: self.usage,
            id: self.id,
            model: self.model,
        })
    }
}

fn mismatch(index: usize, delta: &str) -> Error {
    Error::Decode {
        what: "stream",
        detail: format!("{delta} for content block {index}, which is of another type"),
    }
}

/// The events that stream `response`: text in chunks of `chunk` characters, tool input in
/// fragments, usage at the start and the end. Used by in-memory backends.
pub fn events_for(response: &Response, chunk: usize) -> Vec<StreamEvent> {
    let chunk = chunk.max(1);
    let u = &response.usage;
    let mut events = vec![StreamEvent::MessageStart {
        id: response.id.clone(),
        model: response.model.clone(),
        usage: PartialUsage {
            output_tokens: Some(0),
            ..PartialUsage::full(u)
        },
    }];
    // `chunk` characters a piece (the last may be shorter), cut at character boundaries.
    let pieces = |s: &str| -> Vec<String> {
        let mut out = Vec::with_capacity(s.len() / chunk + 1);
        let mut rest = s;
        while !rest.is_empty() {
            let cut = rest
                .char_indices()
                .nth(chunk)
                .map_or(rest.len(), |(i, _)| i);
            let (piece, tail) = rest.split_at(cut);
            out.push(piece.to_owned());
            rest = tail;
        }
        out
    };
    for (index, block) in response.message.content.iter().enumerate() {
        match block {
            ContentBlock::Text { text } => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::Text(String::new()),
                });
                for p in pieces(text) {
                    events.push(StreamEvent::TextDelta { index, text: p });
                }
            }
            ContentBlock::Thinking {
                thinking,
                signature,
            } => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::Thinking,
                });
                for p in pieces(thinking) {
                    events.push(StreamEvent::ThinkingDelta { index, thinking: p });
                }
                events.push(StreamEvent::SignatureDelta {
                    index,
                    signature: signature.clone(),
                });
            }
            ContentBlock::RedactedThinking { data } => events.push(StreamEvent::BlockStart {
                index,
                block: BlockStart::RedactedThinking(data.clone()),
            }),
            ContentBlock::ToolUse { id, name, input } => {
                events.push(StreamEvent::BlockStart {
                    index,
                    block: BlockStart::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                    },
                });
                for p in pieces(input.as_str()) {
                    events.push(StreamEvent::InputJsonDelta {
                        index,
                        partial_json: p,
                    });
                }
            }
            // Tool results and images never appear in an assistant answer; skip them.
            _ => continue,
        }
        events.push(StreamEvent::BlockStop { index });
    }
    events.push(StreamEvent::MessageDelta {
        stop_reason: response.stop_reason.clone(),
        usage: PartialUsage {
            output_tokens: Some(u.output_tokens),
            ..PartialUsage::default()
        },
    });
    events.push(StreamEvent::MessageStop);
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_fold_back_into_the_same_response() {
        let message = Message::assistant(vec![
            ContentBlock::Thinking {
                thinking: "think".into(),
                signature: "sig".into(),
            },
            ContentBlock::text("hello world, this is longer than a chunk"),
            ContentBlock::tool_use(
                "t1",
                "Read",
                RawJson::parse(r#"{ "path" : "a.rs" }"#).unwrap(),
            ),
        ]);
        let r = Response {
            message,
            stop_reason: Some(ModelStop::ToolUse),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 7,
                cache_read_tokens: 90,
                ..Usage::default()
            },
            id: Some("msg_1".into()),
            model: Some("m".into()),
        };
        let mut b = ResponseBuilder::new();
        for e in events_for(&r, 5) {
            b.push(&e).unwrap();
        }
        assert_eq!(b.finish().unwrap(), r);
    }

    #[test]
    fn deltas_find_their_block_out_of_order_and_when_an_index_starts_twice() {
        let start = |index: usize| StreamEvent::BlockStart {
            index,
            block: BlockStart::Text(String::new()),
        };
        let text = |index: usize, t: &str| StreamEvent::TextDelta {
            index,
            text: t.into(),
        };
        let mut b = ResponseBuilder::new();
        for e in [
            StreamEvent::MessageStart {
                id: None,
                model: None,
                usage: PartialUsage::default(),
            },
            start(1),
            start(0),
            text(1, "one"),
            text(0, "zero"),
            start(2),
            text(2, "two"),
            start(2), // started again: deltas still go to the first block 2
            text(2, "!"),
            StreamEvent::MessageStop,
        ] {
            b.push(&e).unwrap();
        }
        let texts: Vec<String> = b
            .finish()
            .unwrap()
            .message
            .content
            .iter()
            .map(|c| match c {
                ContentBlock::Text { text } => text.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, ["zero", "one", "two!", ""]);
    }

    #[test]
    fn text_is_streamed_in_pieces_of_whole_characters() {
        let r = Response {
            message: Message::assistant(vec![ContentBlock::text("héllo wörld, ☃☃")]),
            stop_reason: Some(ModelStop::EndTurn),
            usage: Usage::default(),
            id: None,
            model: None,
        };
        let pieces: Vec<String> = events_for(&r, 4)
            .into_iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta { text, .. } => Some(text),
                _ => None,
            })
            .collect();
        assert_eq!(pieces, ["héll", "o wö", "rld,", " ☃☃"]);
        let mut b = ResponseBuilder::new();
        for e in events_for(&r, 1) {
            b.push(&e).unwrap();
        }
        assert_eq!(b.finish().unwrap(), r);
    }

    #[test]
    fn incomplete_streams_and_bad_deltas_are_errors() {
        let mut b = ResponseBuilder::new();
        b.push(&StreamEvent::MessageStart {
            id: None,
            model: None,
            usage: PartialUsage::default(),
        })
        .unwrap();
        // A delta or stop for a block that never started is skipped, as the SDKs do.
        b.push(&StreamEvent::TextDelta {
            index: 3,
            text: "x".into(),
        })
        .unwrap();
        b.push(&StreamEvent::BlockStop { index: 3 }).unwrap();
        assert_eq!(b.ignored_events(), 2);
        b.push(&StreamEvent::BlockStart {
            index: 0,
            block: BlockStart::Text("a".into()),
        })
        .unwrap();
        let err = b
            .push(&StreamEvent::InputJsonDelta {
                index: 0,
                partial_json: "{".into(),
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "could not decode stream: input_json_delta for content block 0, which is of another type"
        );
        let err = ResponseBuilder::new().finish().unwrap_err();
        assert!(matches!(err, Error::TruncatedStream { events: 0, .. }));
        let mut b = ResponseBuilder::new();
        b.push(&StreamEvent::BlockStart {
            index: 0,
            block: BlockStart::ToolUse {
                id: "t".into(),
                name: "n".into(),
            },
        })
        .unwrap();
        b.push(&StreamEvent::InputJsonDelta {
            index: 0,
            partial_json: "{\"a\":".into(),
        })
        .unwrap();
        b.push(&StreamEvent::MessageStop).unwrap();
        assert!(matches!(
            b.finish(),
            Err(Error::Decode {
                what: "tool_use input",
                ..
            })
        ));
    }

    #[test]
    fn a_tool_call_cut_off_at_max_tokens_is_reported_not_fatal() {
        let mut b = ResponseBuilder::new();
        for e in [
            StreamEvent::BlockStart {
                index: 0,
                block: BlockStart::ToolUse {
                    id: "ok".into(),
                    name: "n".into(),
                },
            },
            StreamEvent::InputJsonDelta {
                index: 0,
                partial_json: "{\"a\":1}".into(),
            },
            StreamEvent::BlockStop { index: 0 },
            StreamEvent::BlockStart {
                index: 1,
                block: BlockStart::ToolUse {
                    id: "cut".into(),
                    name: "n".into(),
                },
            },
            StreamEvent::InputJsonDelta {
                index: 1,
                partial_json: "{\"path\":\"src/ma".into(),
            },
            StreamEvent::MessageDelta {
                stop_reason: Some(ModelStop::MaxTokens),
                usage: PartialUsage::default(),
            },
            StreamEvent::MessageStop,
        ] {
            b.push(&e).unwrap();
        }
        let (r, cut) = b.finish_cut_off().unwrap();
        assert_eq!(cut, ["cut"]);
        let inputs: Vec<&str> = r.message.tool_uses().map(|(_, _, i)| i.as_str()).collect();
        assert_eq!(inputs, ["{\"a\":1}", "{}"]);
    }

    #[test]
    fn a_tool_call_without_its_block_stop_at_max_tokens_is_cut() {
        let tool = |index: usize, id: &str| StreamEvent::BlockStart {
            index,
            block: BlockStart::ToolUse {
                id: id.into(),
                name: "n".into(),
            },
        };
        let json = |index: usize, j: &str| StreamEvent::InputJsonDelta {
            index,
            partial_json: j.into(),
        };
        let fold = |stop: ModelStop, events: Vec<StreamEvent>| {
            let mut b = ResponseBuilder::new();
            for e in events.iter().chain([
                &StreamEvent::MessageDelta {
                    stop_reason: Some(stop),
                    usage: PartialUsage::default(),
                },
                &StreamEvent::MessageStop,
            ]) {
                b.push(e).unwrap();
            }
            b.finish_cut_off().unwrap()
        };
        let events = vec![
            tool(0, "whole"),
            json(0, "{\"a\":1}"),
            StreamEvent::BlockStop { index: 0 },
            tool(1, "empty_whole"),
            StreamEvent::BlockStop { index: 1 },
            // Started, no input, no stop.
            tool(2, "no_input"),
            // Input that parses, but the stop never came.
            tool(3, "parses"),
            json(3, "{}"),
            // A stop for a block that never started does not close anything.
            StreamEvent::BlockStop { index: 9 },
        ];
        let (r, cut) = fold(ModelStop::MaxTokens, events.clone());
        assert_eq!(cut, ["no_input", "parses"]);
        let inputs: Vec<&str> = r.message.tool_uses().map(|(_, _, i)| i.as_str()).collect();
        assert_eq!(inputs, ["{\"a\":1}", "{}", "{}", "{}"]);
        // Without max_tokens, a missing stop is not a cut.
        let (_, cut) = fold(ModelStop::ToolUse, events);
        assert!(cut.is_empty());
    }

    #[test]
    fn stop_reasons_map_both_ways() {
        for s in [
            "end_turn",
            "max_tokens",
            "stop_sequence",
            "tool_use",
            "pause_turn",
            "refusal",
            "x",
        ] {
            assert_eq!(ModelStop::from_anthropic(s).as_str(), s);
        }
        assert_eq!(ModelStop::from_openai("length"), ModelStop::MaxTokens);
        assert_eq!(ModelStop::from_openai("tool_calls"), ModelStop::ToolUse);
    }
}
