//! [`CacheSafeParams`]: everything a prompt-cache key depends on, held once and shared.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — Fork Subagent: Why
//! Parallelism Is Almost Free" and "Chapter 9: Sub-Agents and the Fork Pattern —
//! CacheSafeParams: Five Dimensions" name the five dimensions: the rendered system prompt,
//! user context, system context, tool definitions with the model (and thinking config), and
//! the conversation prefix. A fork child must reuse the parent's *already rendered* values —
//! re-rendering risks a different byte and a cache miss — so the value is built once from
//! rendered parts, fingerprinted at most once, and cloned in O(1) after that.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::fingerprint::{Digest, HeadFingerprint, PrefixFingerprint};
use crate::list::MessageList;
use crate::message::{Message, RawJson};

/// One tool the model may call, as sent to the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The tool's name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// The JSON Schema of the tool's input, byte for byte.
    pub input_schema: RawJson,
}

impl ToolDefinition {
    /// A tool definition; `input_schema` must be valid JSON and is kept verbatim.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: &str,
    ) -> Result<Self> {
        Ok(Self {
            name: name.into(),
            description: description.into(),
            input_schema: RawJson::parse(input_schema)?,
        })
    }
}

/// Extended-thinking configuration (part of the cache key: changing it invalidates the
/// message cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ThinkingConfig {
    /// Thinking is off.
    Disabled,
    /// Thinking with a token budget.
    Enabled {
        /// Maximum thinking tokens.
        budget_tokens: u32,
    },
    /// The model decides how much to think.
    Adaptive,
}

/// The parts of a prefix that come before the messages; shared between prefixes that only
/// differ in their messages.
struct Head {
    model: String,
    thinking: Option<ThinkingConfig>,
    tools: Vec<ToolDefinition>,
    system_prompt: Vec<String>,
    system_context: Vec<(String, String)>,
    user_context: Vec<(String, String)>,
    fingerprint: Arc<HeadFingerprint>,
}

struct Inner {
    head: Arc<Head>,
    messages: MessageList,
    /// Computed on first use, from `base` when there is one.
    fingerprint: OnceLock<Arc<PrefixFingerprint>>,
    /// The fingerprint of a prefix of `messages` (that of the nearest value this one was
    /// appended to whose fingerprint had been computed): the lazy fingerprint only hashes
    /// the messages after it. Shared, so an append copies a pointer, not the hash state.
    base: Option<Arc<PrefixFingerprint>>,
}

impl Inner {
    fn new(head: Arc<Head>, messages: MessageList, base: Option<Arc<PrefixFingerprint>>) -> Self {
        Self {
            head,
            messages,
            fingerprint: OnceLock::new(),
            base,
        }
    }
}

/// The cache-safe prefix of a request: system prompt, user context, system context, tools
/// with model and thinking config, and the conversation prefix.
///
/// Built once (with [`CacheSafeParams::builder`]) from already rendered parts; cloning is O(1).
/// The head (everything before the messages) is fingerprinted when it is built; the messages
/// when [`fingerprint`](Self::fingerprint) is first asked for, once per value and shared by its
/// clones. Encoders must render it deterministically: same value, same bytes.
///
/// An agent's next turn is [`append`](Self::append): O(new messages), sharing the head and every
/// earlier message, with the same fingerprint as a from-scratch build of the same parts.
///
/// ```
/// use forkhive_core::{CacheSafeParams, Message};
/// let params = CacheSafeParams::builder("claude-sonnet-4-5")
///     .system_block("You are a careful engineer.")
///     .user_context("cwd", "/repo")
///     .messages(vec![Message::user_text("Fix the build.")])
///     .build();
/// let again = params.clone(); // O(1)
/// assert_eq!(params.fingerprint(), again.fingerprint());
/// ```
#[derive(Clone)]
pub struct CacheSafeParams {
    inner: Arc<Inner>,
}

impl CacheSafeParams {
    /// Starts a builder for the given model.
    pub fn builder(model: impl Into<String>) -> CacheSafeParamsBuilder {
        CacheSafeParamsBuilder {
            model: model.into(),
            thinking: None,
            tools: Vec::new(),
            system_prompt: Vec::new(),
            system_context: Vec::new(),
            user_context: Vec::new(),
            messages: Vec::new(),
        }
    }

    /// The model name.
    pub fn model(&self) -> &str {
        &self.inner.head.model
    }

    /// The thinking config, if any.
    pub fn thinking(&self) -> Option<ThinkingConfig> {
        self.inner.head.thinking
    }

    /// The tool definitions, in order.
    pub fn tools(&self) -> &[ToolDefinition] {
        &self.inner.head.tools
    }

    /// The rendered system prompt blocks, in order.
    pub fn system_prompt(&self) -> &[String] {
        &self.inner.head.system_prompt
    }

    /// The system context entries, in order.
    pub fn system_context(&self) -> &[(String, String)] {
        &self.inner.head.system_context
    }

    /// The user context entries, in order.
    pub fn user_context(&self) -> &[(String, String)] {
        &self.inner.head.user_context
    }

    /// The conversation prefix: a [`MessageList`], which reads like a slice (`len`, `get`,
    /// `last`, `iter`, indexing, `for m in params.messages()`).
    pub fn messages(&self) -> &MessageList {
        &self.inner.messages
    }

    /// The conversation prefix as a shared handle: cloning it is O(1) and copies no message.
    pub fn shared_messages(&self) -> &MessageList {
        &self.inner.messages
    }

    /// The fingerprint, computed on first use and kept: the first time it hashes the messages
    /// appended since the nearest ancestor whose fingerprint had been computed *when this
    /// value was appended from it* (an ancestor fingerprinted later does not help values
    /// already made from it), and it is O(1) after that, for this value and all its clones.
    /// An agent loop fingerprints each request before the next append, so each message is
    /// hashed once.
    pub fn fingerprint(&self) -> &PrefixFingerprint {
        let inner = &*self.inner;
        inner.fingerprint.get_or_init(|| {
            Arc::new(match &inner.base {
                Some(base) => base.extend_with(
                    inner
                        .messages
                        .iter()
                        .skip(base.message_count())
                        .map(Digest::of_message),
                ),
                None => {
                    PrefixFingerprint::new(Arc::clone(&inner.head.fingerprint), &inner.messages)
                }
            })
        })
    }

    /// Whether `self` was made from `earlier` by appending messages (or is a clone of it): it
    /// shares `earlier`'s head and every one of its messages. Then `earlier`'s cache is a
    /// prefix of `self`'s — `earlier.fingerprint().diff(self.fingerprint())` is `None` — which
    /// this tells in O(messages ÷ 32) pointer comparisons, hashing nothing. `false` does not
    /// mean the cache breaks, only that the fingerprints must be compared to know.
    ///
    /// ```
    /// use forkhive_core::{CacheSafeParams, Message};
    /// let turn1 = CacheSafeParams::builder("m").messages(vec![Message::user_text("hi")]).build();
    /// let turn2 = turn1.append(vec![Message::assistant_text("hello")]);
    /// assert!(turn2.extends(&turn1));
    /// assert!(!turn1.extends(&turn2));
    /// let rebuilt = turn1.with_messages(turn2.messages().to_vec()); // equal, but not shared
    /// assert!(!rebuilt.extends(&turn1));
    /// assert_eq!(turn1.fingerprint().diff(rebuilt.fingerprint()), None);
    /// ```
    pub fn extends(&self, earlier: &CacheSafeParams) -> bool {
        self.ptr_eq(earlier)
            || (Arc::ptr_eq(&self.inner.head, &earlier.inner.head)
                && self.inner.messages.shares_prefix(&earlier.inner.messages))
    }

    /// Whether `self` and `other` are the same allocation (a clone of one another).
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The same system, context and tools with a different message prefix.
    ///
    /// The parts before the messages are shared, not copied; the fingerprint hashes all of
    /// `messages` (O(history)) when it is first asked for. To add messages at the end,
    /// [`append`](Self::append) keeps the earlier messages' digests.
    pub fn with_messages(&self, messages: impl Into<MessageList>) -> Self {
        Self {
            inner: Arc::new(Inner::new(
                Arc::clone(&self.inner.head),
                messages.into(),
                None,
            )),
        }
    }

    /// This prefix followed by `more` messages: the next turn of a growing conversation.
    ///
    /// Costs O(`more`), not O(history), and not amortised, and hashes nothing: the result
    /// shares the head (system, context, tools) and every earlier message with `self` (see
    /// [`MessageList`] for the layout). Its fingerprint, when asked for, hashes only the
    /// messages appended since the nearest ancestor whose fingerprint had been computed by the
    /// time of the append (see [`fingerprint`](Self::fingerprint)), and equals that
    /// of a from-scratch build with the same parts and messages, so `diff` against either
    /// finds no break.
    ///
    /// ```
    /// use forkhive_core::{CacheSafeParams, Message};
    /// let turn1 = CacheSafeParams::builder("m")
    ///     .system_block("You are terse.")
    ///     .messages(vec![Message::user_text("hi")])
    ///     .build();
    /// let turn2 = turn1.append(vec![Message::assistant_text("hello"), Message::user_text("bye")]);
    /// assert_eq!(turn2.messages().len(), 3);
    /// assert_eq!(turn1.fingerprint().diff(turn2.fingerprint()), None); // growth is no break
    /// let scratch = turn1.with_messages(turn2.messages().to_vec());
    /// assert_eq!(turn2.fingerprint(), scratch.fingerprint());
    /// ```
    pub fn append(&self, more: Vec<Message>) -> CacheSafeParams {
        self.append_shared(more.into_iter().map(Arc::new))
    }

    /// [`append`](Self::append) for messages already shared: each `Arc` goes into the
    /// conversation as it is, so whoever else holds it (a snapshot of the turn, an event) shares
    /// the message instead of copying it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use forkhive_core::{CacheSafeParams, Message};
    /// let p = CacheSafeParams::builder("m").build();
    /// let answer = Arc::new(Message::assistant_text("hello"));
    /// let next = p.append_shared([Arc::clone(&answer)]);
    /// assert!(std::ptr::eq(&next.messages()[0], &*answer));
    /// ```
    pub fn append_shared<I>(&self, more: I) -> CacheSafeParams
    where
        I: IntoIterator<Item = Arc<Message>>,
        I::IntoIter: ExactSizeIterator,
    {
        let more = more.into_iter();
        if more.len() == 0 {
            return self.clone();
        }
        let base = self
            .inner
            .fingerprint
            .get()
            .or(self.inner.base.as_ref())
            .cloned();
        Self {
            inner: Arc::new(Inner::new(
                Arc::clone(&self.inner.head),
                self.inner.messages.extended_shared(more),
                base,
            )),
        }
    }

    /// The system context as one text block (`# key` heading, then the value, per entry), or
    /// `None` when there is none. Encoders append it after the system prompt blocks.
    pub fn rendered_system_context(&self) -> Option<String> {
        render_entries(&self.inner.head.system_context)
    }

    /// The user context as one text (`# key` heading, then the value, per entry), wrapped in
    /// `<system-reminder>` tags, or `None` when there is none. Encoders send it as a user
    /// message ahead of the conversation prefix.
    pub fn rendered_user_context(&self) -> Option<String> {
        render_entries(&self.inner.head.user_context)
            .map(|body| format!("<system-reminder>\n{body}\n</system-reminder>"))
    }
}

fn render_entries(entries: &[(String, String)]) -> Option<String> {
    if entries.is_empty() {
        return None;
    }
    let parts: Vec<String> = entries.iter().map(|(k, v)| format!("# {k}\n{v}")).collect();
    Some(parts.join("\n\n"))
}

/// Two prefixes are equal when they render to the same cache key: equal
/// [`fingerprint`](CacheSafeParams::fingerprint) totals (a clone is equal without hashing).
impl PartialEq for CacheSafeParams {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.fingerprint().total() == other.fingerprint().total()
    }
}

impl Eq for CacheSafeParams {}

impl fmt::Debug for CacheSafeParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheSafeParams")
            .field("model", &self.model())
            .field("tools", &self.tools().len())
            .field("system_blocks", &self.system_prompt().len())
            .field("messages", &self.messages().len())
            .field("fingerprint", &self.fingerprint().total())
            .finish()
    }
}

/// Builds a [`CacheSafeParams`]; see [`CacheSafeParams::builder`].
#[derive(Debug, Clone)]
pub struct CacheSafeParamsBuilder {
    model: String,
    thinking: Option<ThinkingConfig>,
    tools: Vec<ToolDefinition>,
    system_prompt: Vec<String>,
    system_context: Vec<(String, String)>,
    user_context: Vec<(String, String)>,
    messages: Vec<Message>,
}

impl CacheSafeParamsBuilder {
    /// Sets the thinking config.
    pub fn thinking(mut self, thinking: ThinkingConfig) -> Self {
        self.thinking = Some(thinking);
        self
    }

    /// Appends a tool definition.
    pub fn tool(mut self, tool: ToolDefinition) -> Self {
        self.tools.push(tool);
        self
    }

    /// Appends tool definitions.
    pub fn tools(mut self, tools: impl IntoIterator<Item = ToolDefinition>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Appends one rendered system prompt block.
    pub fn system_block(mut self, text: impl Into<String>) -> Self {
        self.system_prompt.push(text.into());
        self
    }

    /// Appends a system context entry (order is kept).
    pub fn system_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.system_context.push((key.into(), value.into()));
        self
    }

    /// Appends a user context entry (order is kept).
    pub fn user_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.user_context.push((key.into(), value.into()));
        self
    }

    /// Sets the conversation prefix.
    pub fn messages(mut self, messages: Vec<Message>) -> Self {
        self.messages = messages;
        self
    }

    /// Fingerprints the head and freezes the parts (the messages are fingerprinted on first
    /// use; see [`CacheSafeParams::fingerprint`]).
    pub fn build(self) -> CacheSafeParams {
        let head_fp = hash_head(&self);
        let head = Arc::new(Head {
            model: self.model,
            thinking: self.thinking,
            tools: self.tools,
            system_prompt: self.system_prompt,
            system_context: self.system_context,
            user_context: self.user_context,
            fingerprint: Arc::new(head_fp),
        });
        CacheSafeParams {
            inner: Arc::new(Inner::new(head, MessageList::from(self.messages), None)),
        }
    }
}

fn json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Only plain data with string keys is serialised here, which cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

fn hash_head(b: &CacheSafeParamsBuilder) -> HeadFingerprint {
    let tools: Vec<Vec<u8>> = b.tools.iter().map(json).collect();
    let system: Vec<Vec<u8>> = b.system_prompt.iter().map(json).collect();
    let sys_ctx: Vec<Vec<u8>> = b.system_context.iter().map(json).collect();
    let user_ctx: Vec<Vec<u8>> = b.user_context.iter().map(json).collect();
    let (tools, tool_items) =
        HeadFingerprint::list(b"forkhive/tools/v1\0", tools.iter().map(Vec::as_slice));
    let (system_prompt, system_items) =
        HeadFingerprint::list(b"forkhive/system/v1\0", system.iter().map(Vec::as_slice));
    let (system_context, system_context_items) = HeadFingerprint::list(
        b"forkhive/system-context/v1\0",
        sys_ctx.iter().map(Vec::as_slice),
    );
    let (user_context, user_context_items) = HeadFingerprint::list(
        b"forkhive/user-context/v1\0",
        user_ctx.iter().map(Vec::as_slice),
    );
    HeadFingerprint {
        model: Digest::of(&json(&b.model)),
        thinking: Digest::of(&json(&b.thinking)),
        tools,
        tool_items,
        system_prompt,
        system_items,
        system_context,
        system_context_items,
        user_context,
        user_context_items,
        digest: Digest::from([0; 32]),
    }
    .sealed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::{CacheBreak, Change, Dimension};

    fn tool(name: &str, desc: &str) -> ToolDefinition {
        ToolDefinition::new(name, desc, r#"{"type":"object","properties":{}}"#).unwrap()
    }

    fn base() -> CacheSafeParamsBuilder {
        CacheSafeParams::builder("model-a")
            .tool(tool("Read", "read"))
            .tool(tool("Grep", "grep"))
            .system_block("You are helpful.")
            .system_context("os", "linux")
            .user_context("cwd", "/repo")
            .messages(vec![
                Message::user_text("one"),
                Message::assistant_text("two"),
                Message::user_text("three"),
            ])
    }

    fn brk(a: CacheSafeParamsBuilder, b: CacheSafeParamsBuilder) -> Option<CacheBreak> {
        a.build().fingerprint().diff(b.build().fingerprint())
    }

    #[test]
    fn identical_parts_give_identical_fingerprints() {
        let (a, b) = (base().build(), base().build());
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().total(), b.fingerprint().total());
        assert_eq!(a.fingerprint().diff(b.fingerprint()), None);
    }

    #[test]
    fn model_change_is_named() {
        let b = base();
        let mut changed = b.clone();
        changed.model = "model-b".into();
        assert_eq!(brk(b, changed), Some(CacheBreak::Model));
    }

    #[test]
    fn tool_changes_are_named_with_index() {
        let changed = CacheSafeParams::builder("model-a")
            .tool(tool("Read", "read"))
            .tool(tool("Grep", "grep files"));
        let mut c = base();
        c.tools = changed.tools;
        let b = brk(base(), c).unwrap();
        assert_eq!(
            b,
            CacheBreak::Tool {
                index: 1,
                change: Change::Changed
            }
        );
        assert_eq!(b.to_string(), "tools[1] changed");
        assert_eq!(b.dimension(), Dimension::Tools);

        let added = brk(base(), base().tool(tool("Write", "write"))).unwrap();
        assert_eq!(added.to_string(), "tools[2] added");
        let removed = brk(base().tool(tool("Write", "write")), base()).unwrap();
        assert_eq!(removed.to_string(), "tools[2] removed");
    }

    /// The same tools in another order are a move, told apart from an edit; a reordering
    /// that also edits one is a change.
    #[test]
    fn a_tool_reordering_is_named_as_a_move() {
        let abc = |order: [(&str, &str); 3]| {
            let mut b = CacheSafeParams::builder("model-a");
            for (name, description) in order {
                b = b.tool(tool(name, description));
            }
            b
        };
        let first = abc([("A", "a"), ("B", "b"), ("C", "c")]);
        let moved = brk(first.clone(), abc([("A", "a"), ("C", "c"), ("B", "b")])).unwrap();
        assert_eq!(
            moved,
            CacheBreak::Tool {
                index: 1,
                change: Change::Moved
            }
        );
        assert_eq!(
            moved.to_string(),
            "tools[1] moved (the same items, in another order)"
        );
        let edited = brk(first, abc([("A", "a"), ("C", "c"), ("B", "b!")])).unwrap();
        assert_eq!(edited.to_string(), "tools[1] changed");
    }

    #[test]
    fn system_prompt_change_is_named() {
        let mut c = base();
        c.system_prompt = vec!["You are helpful!".into()];
        let b = brk(base(), c).unwrap();
        assert_eq!(b.to_string(), "system prompt block 0 changed");
        assert_eq!(b.dimension(), Dimension::SystemPrompt);
    }

    #[test]
    fn system_context_change_is_named() {
        let b = brk(base(), base().system_context("shell", "bash")).unwrap();
        assert_eq!(
            b,
            CacheBreak::SystemContext {
                entry: 1,
                change: Change::Added
            }
        );
        assert_eq!(b.dimension(), Dimension::SystemContext);
    }

    #[test]
    fn thinking_change_is_named() {
        let b = brk(
            base(),
            base().thinking(ThinkingConfig::Enabled {
                budget_tokens: 1024,
            }),
        )
        .unwrap();
        assert_eq!(b, CacheBreak::Thinking);
        assert_eq!(b.to_string(), "thinking config changed");
    }

    #[test]
    fn user_context_change_is_named() {
        let mut c = base();
        c.user_context = vec![("cwd".into(), "/other".into())];
        let b = brk(base(), c).unwrap();
        assert_eq!(b.to_string(), "user context entry 0 changed");
        assert_eq!(b.dimension(), Dimension::UserContext);
    }

    #[test]
    fn message_changes_are_named_and_growth_is_not_a_break() {
        let a = base().build();
        let mut msgs = a.messages().to_vec();
        msgs[1] = Message::assistant_text("TWO");
        let b = a.with_messages(msgs);
        let brk = a.fingerprint().diff(b.fingerprint()).unwrap();
        assert_eq!(brk.to_string(), "messages[1] changed");
        assert_eq!(brk.dimension(), Dimension::Messages);

        let mut longer = a.messages().to_vec();
        longer.push(Message::assistant_text("four"));
        let c = a.with_messages(longer);
        assert_eq!(a.fingerprint().diff(c.fingerprint()), None);
        assert_eq!(
            c.fingerprint().diff(a.fingerprint()),
            Some(CacheBreak::Message {
                index: 3,
                change: Change::Removed
            })
        );
    }

    #[test]
    fn model_is_checked_before_everything_else() {
        let mut c = base();
        c.model = "other".into();
        c.system_prompt = vec!["x".into()];
        assert_eq!(brk(base(), c), Some(CacheBreak::Model));
    }

    #[test]
    fn extend_equals_fingerprint_from_scratch() {
        let a = base().build();
        let extra = [Message::assistant_text("four"), Message::user_text("five")];
        let mut all = a.messages().to_vec();
        all.extend_from_slice(&extra);
        assert_eq!(
            a.fingerprint().extend(&extra),
            *a.with_messages(all).fingerprint()
        );
    }

    #[test]
    fn rendering_of_contexts_is_stable() {
        let p = base().user_context("branch", "main").build();
        assert_eq!(
            p.rendered_user_context().unwrap(),
            "<system-reminder>\n# cwd\n/repo\n\n# branch\nmain\n</system-reminder>"
        );
        assert_eq!(p.rendered_system_context().unwrap(), "# os\nlinux");
        assert_eq!(
            CacheSafeParams::builder("m")
                .build()
                .rendered_user_context(),
            None
        );
    }
}
