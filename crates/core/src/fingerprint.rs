//! SHA-256 fingerprints of a cache-safe prefix, and the diff that names a cache break.
//!
//! A prompt cache matches bytes, so a fingerprint hashes the canonical bytes of every part the
//! cache key depends on — the five dimensions of `CacheSafeParams` ("Chapter 9: Sub-Agents and
//! the Fork Pattern — CacheSafeParams: Five Dimensions"): system prompt, user context, system
//! context, tool definitions with the model (and thinking config), and the message prefix.
//!
//! Each dimension has its own digest, each tool, system block, context entry and message has
//! an item digest, and the whole prefix has one total digest. The message digests are chained
//! so that extending a prefix by `k` messages costs O(those k messages), never O(history):
//! a fork child's fingerprint is made from its parent's hashing state plus its own directive.
//!
//! [`PrefixFingerprint::diff`] compares two fingerprints in the provider's render order
//! (tools, then system, then messages) and names the first thing that breaks the cache.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::message::Message;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first 12 hex digits: enough to tell digests apart in a log line.
    pub fn short(&self) -> String {
        let mut s = self.to_string();
        s.truncate(12);
        s
    }

    pub(crate) fn finish(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }
}

impl From<[u8; 32]> for Digest {
    fn from(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

/// The five cache-key dimensions of seed 004's `CacheSafeParams`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dimension {
    /// The rendered system prompt blocks.
    SystemPrompt,
    /// User context (rendered ahead of the messages).
    UserContext,
    /// System context (rendered after the system prompt).
    SystemContext,
    /// Tool definitions, the model and the thinking config.
    Tools,
    /// The conversation prefix.
    Messages,
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dimension::SystemPrompt => "system prompt",
            Dimension::UserContext => "user context",
            Dimension::SystemContext => "system context",
            Dimension::Tools => "tools",
            Dimension::Messages => "messages",
        })
    }
}

/// How an item in a list differs between two fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Both sides have the item and its bytes differ.
    Changed,
    /// Only the later side has the item.
    Added,
    /// Only the earlier side has the item.
    Removed,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Changed => "changed",
            Change::Added => "added",
            Change::Removed => "removed",
        })
    }
}

/// The first difference that stops a later request from reading an earlier one's cache.
///
/// Variants are ordered as the provider renders a request: model and tools, system prompt,
/// system context, thinking (which invalidates the message cache only), user context, and
/// the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CacheBreak {
    /// The model differs: nothing is shared.
    Model,
    /// A tool definition differs (`tools[index]`).
    Tool {
        /// Index in the tool array.
        index: usize,
        /// What happened to it.
        change: Change,
    },
    /// A system prompt block differs.
    SystemPrompt {
        /// Index of the block.
        block: usize,
        /// What happened to it.
        change: Change,
    },
    /// A system context entry differs.
    SystemContext {
        /// Index of the entry.
        entry: usize,
        /// What happened to it.
        change: Change,
    },
    /// The thinking config differs: the messages cache is invalidated.
    Thinking,
    /// A user context entry differs.
    UserContext {
        /// Index of the entry.
        entry: usize,
        /// What happened to it.
        change: Change,
    },
    /// A message differs (`messages[index]`), or the later prefix is shorter.
    Message {
        /// Index in the message prefix.
        index: usize,
        /// What happened to it (`Added` never occurs: appending is how prefixes grow).
        change: Change,
    },
}

impl CacheBreak {
    /// The dimension this break belongs to.
    pub fn dimension(&self) -> Dimension {
        match self {
            CacheBreak::Model | CacheBreak::Tool { .. } | CacheBreak::Thinking => Dimension::Tools,
            CacheBreak::SystemPrompt { .. } => Dimension::SystemPrompt,
            CacheBreak::SystemContext { .. } => Dimension::SystemContext,
            CacheBreak::UserContext { .. } => Dimension::UserContext,
            CacheBreak::Message { .. } => Dimension::Messages,
        }
    }
}

impl fmt::Display for CacheBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheBreak::Model => f.write_str("model changed"),
            CacheBreak::Tool { index, change } => write!(f, "tools[{index}] {change}"),
            CacheBreak::SystemPrompt { block, change } => {
                write!(f, "system prompt block {block} {change}")
            }
            CacheBreak::SystemContext { entry, change } => {
                write!(f, "system context entry {entry} {change}")
            }
            CacheBreak::Thinking => f.write_str("thinking config changed"),
            CacheBreak::UserContext { entry, change } => {
                write!(f, "user context entry {entry} {change}")
            }
            CacheBreak::Message { index, change } => write!(f, "messages[{index}] {change}"),
        }
    }
}

const TOTAL_TAG: &[u8] = b"forkhive/prefix/v1\0";
const MESSAGES_TAG: &[u8] = b"forkhive/messages/v1\0";

/// Digests of the parts before the messages, shared by every prefix built on them.
#[derive(Debug)]
pub(crate) struct HeadFingerprint {
    pub(crate) model: Digest,
    pub(crate) thinking: Digest,
    pub(crate) tools: Digest,
    pub(crate) tool_items: Vec<Digest>,
    pub(crate) system_prompt: Digest,
    pub(crate) system_items: Vec<Digest>,
    pub(crate) system_context: Digest,
    pub(crate) system_context_items: Vec<Digest>,
    pub(crate) user_context: Digest,
    pub(crate) user_context_items: Vec<Digest>,
}

impl HeadFingerprint {
    /// Hashes `items` (each already encoded as canonical JSON) into item and dimension digests.
    pub(crate) fn list<'a>(
        tag: &[u8],
        items: impl Iterator<Item = &'a [u8]>,
    ) -> (Digest, Vec<Digest>) {
        let mut dim = Sha256::new_with_prefix(tag);
        let digests: Vec<Digest> = items
            .map(|bytes| {
                let d = Digest::of(bytes);
                dim.update(d.0);
                d
            })
            .collect();
        (Digest::finish(dim), digests)
    }
}

/// The message digests of a prefix: a shared base plus a few of its own.
#[derive(Clone)]
struct MessageDigests {
    base: Arc<[Digest]>,
    tail: Vec<Digest>,
}

impl MessageDigests {
    fn len(&self) -> usize {
        self.base.len() + self.tail.len()
    }

    fn get(&self, i: usize) -> Option<Digest> {
        match self.base.get(i) {
            Some(d) => Some(*d),
            None => self.tail.get(i - self.base.len()).copied(),
        }
    }
}

/// The fingerprint of a cache-safe prefix: a digest per dimension, per item, and in total.
///
/// Two prefixes with equal [`total`](Self::total) digests render to the same cache key.
/// Cloning is cheap (shared digests). Equality compares the total digest.
#[derive(Clone)]
pub struct PrefixFingerprint {
    head: Arc<HeadFingerprint>,
    messages: MessageDigests,
    messages_state: Sha256,
    messages_digest: Digest,
    total: Digest,
}

impl PrefixFingerprint {
    /// Fingerprints `messages` on top of an already hashed head.
    pub(crate) fn new(head: Arc<HeadFingerprint>, messages: &[Message]) -> Self {
        let mut state = Sha256::new_with_prefix(MESSAGES_TAG);
        let mut buf = Vec::new();
        let digests: Arc<[Digest]> = messages
            .iter()
            .map(|m| {
                buf.clear();
                m.write_json(&mut buf);
                let d = Digest::of(&buf);
                state.update(d.0);
                d
            })
            .collect();
        Self::assemble(
            head,
            MessageDigests {
                base: digests,
                tail: Vec::new(),
            },
            state,
        )
    }

    fn assemble(head: Arc<HeadFingerprint>, messages: MessageDigests, state: Sha256) -> Self {
        let messages_digest = Digest::finish(state.clone());
        let mut total = Sha256::new_with_prefix(TOTAL_TAG);
        for d in [
            head.model,
            head.thinking,
            head.tools,
            head.system_prompt,
            head.system_context,
            head.user_context,
            messages_digest,
        ] {
            total.update(d.0);
        }
        Self {
            head,
            messages,
            messages_state: state,
            messages_digest,
            total: Digest::finish(total),
        }
    }

    /// The fingerprint of this prefix followed by `more` messages, in O(`more`).
    pub fn extend(&self, more: &[Message]) -> Self {
        let mut buf = Vec::new();
        let digests: Vec<Digest> = more
            .iter()
            .map(|m| {
                buf.clear();
                m.write_json(&mut buf);
                Digest::of(&buf)
            })
            .collect();
        self.extend_digests(&digests)
    }

    /// The same as [`extend`](Self::extend) for messages whose digests are already known.
    pub(crate) fn extend_digests(&self, more: &[Digest]) -> Self {
        let mut state = self.messages_state.clone();
        for d in more {
            state.update(d.0);
        }
        let mut tail = Vec::with_capacity(self.messages.tail.len() + more.len());
        tail.extend_from_slice(&self.messages.tail);
        tail.extend_from_slice(more);
        Self::assemble(
            Arc::clone(&self.head),
            MessageDigests {
                base: Arc::clone(&self.messages.base),
                tail,
            },
            state,
        )
    }

    /// The digest of the whole prefix.
    pub fn total(&self) -> Digest {
        self.total
    }

    /// The digest of one dimension.
    pub fn dimension(&self, dimension: Dimension) -> Digest {
        match dimension {
            Dimension::SystemPrompt => self.head.system_prompt,
            Dimension::UserContext => self.head.user_context,
            Dimension::SystemContext => self.head.system_context,
            Dimension::Tools => {
                let mut h = Sha256::new_with_prefix(b"forkhive/tools-dimension/v1\0");
                h.update(self.head.model.0);
                h.update(self.head.thinking.0);
                h.update(self.head.tools.0);
                Digest::finish(h)
            }
            Dimension::Messages => self.messages_digest,
        }
    }

    /// The digest of the model name.
    pub fn model(&self) -> Digest {
        self.head.model
    }

    /// The digest of each tool definition, in order.
    pub fn tools(&self) -> &[Digest] {
        &self.head.tool_items
    }

    /// The number of messages in the prefix.
    pub fn message_count(&self) -> usize {
        self.messages.len()
    }

    /// The digest of `messages[index]`.
    pub fn message(&self, index: usize) -> Option<Digest> {
        self.messages.get(index)
    }

    /// Names the first difference that stops `later` from reading the cache `self` wrote, or
    /// `None` when `later`'s prefix starts with all of `self`'s.
    ///
    /// ```
    /// use forkhive_core::{CacheSafeParams, Message, ToolDefinition};
    /// let a = CacheSafeParams::builder("m")
    ///     .tool(ToolDefinition::new("Read", "Reads a file", r#"{"type":"object"}"#)?)
    ///     .messages(vec![Message::user_text("hi")])
    ///     .build();
    /// let b = CacheSafeParams::builder("m")
    ///     .tool(ToolDefinition::new("Read", "Reads files", r#"{"type":"object"}"#)?)
    ///     .messages(vec![Message::user_text("hi")])
    ///     .build();
    /// let brk = a.fingerprint().diff(b.fingerprint()).expect("the tool changed");
    /// assert_eq!(brk.to_string(), "tools[0] changed");
    /// # Ok::<(), forkhive_core::Error>(())
    /// ```
    pub fn diff(&self, later: &PrefixFingerprint) -> Option<CacheBreak> {
        if self.total == later.total {
            return None;
        }
        let (a, b) = (&*self.head, &*later.head);
        if a.model != b.model {
            return Some(CacheBreak::Model);
        }
        if let Some((index, change)) = list_diff(&a.tool_items, &b.tool_items) {
            return Some(CacheBreak::Tool { index, change });
        }
        if let Some((block, change)) = list_diff(&a.system_items, &b.system_items) {
            return Some(CacheBreak::SystemPrompt { block, change });
        }
        if let Some((entry, change)) = list_diff(&a.system_context_items, &b.system_context_items) {
            return Some(CacheBreak::SystemContext { entry, change });
        }
        if a.thinking != b.thinking {
            return Some(CacheBreak::Thinking);
        }
        if let Some((entry, change)) = list_diff(&a.user_context_items, &b.user_context_items) {
            return Some(CacheBreak::UserContext { entry, change });
        }
        let n = self.messages.len();
        for i in 0..n {
            match (self.messages.get(i), later.messages.get(i)) {
                (Some(x), Some(y)) if x == y => {}
                (Some(_), Some(_)) => {
                    return Some(CacheBreak::Message {
                        index: i,
                        change: Change::Changed,
                    });
                }
                _ => {
                    return Some(CacheBreak::Message {
                        index: i,
                        change: Change::Removed,
                    });
                }
            }
        }
        // `later` extends `self`: everything `self` cached is a prefix of `later`.
        None
    }
}

fn list_diff(a: &[Digest], b: &[Digest]) -> Option<(usize, Change)> {
    let common = a.len().min(b.len());
    if let Some(i) = (0..common).find(|&i| a[i] != b[i]) {
        return Some((i, Change::Changed));
    }
    match a.len().cmp(&b.len()) {
        std::cmp::Ordering::Less => Some((common, Change::Added)),
        std::cmp::Ordering::Greater => Some((common, Change::Removed)),
        std::cmp::Ordering::Equal => None,
    }
}

impl PartialEq for PrefixFingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total
    }
}

impl Eq for PrefixFingerprint {}

impl fmt::Debug for PrefixFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixFingerprint")
            .field("total", &self.total)
            .field("tools", &self.dimension(Dimension::Tools))
            .field("system_prompt", &self.head.system_prompt)
            .field("messages", &self.messages_digest)
            .field("message_count", &self.messages.len())
            .finish()
    }
}

impl fmt::Display for PrefixFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (tools {}, system {}, messages {} x{})",
            self.total.short(),
            self.dimension(Dimension::Tools).short(),
            self.head.system_prompt.short(),
            self.messages_digest.short(),
            self.messages.len()
        )
    }
}
