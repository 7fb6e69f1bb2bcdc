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

use crate::list::{Iter, MessageList, PVec};
use crate::message::Message;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The SHA-256 of `message`'s canonical JSON ([`Message::write_json`]), streamed into
    /// the hash through a small stack buffer instead of being written out first.
    pub fn of_message(message: &Message) -> Self {
        let mut w = HashWriter {
            hasher: Sha256::new(),
            buf: [0; HASH_BUF],
            len: 0,
        };
        // Writing into the hash cannot fail: every map key is a string and RawJson is valid.
        if serde_json::to_writer(&mut w, message).is_err() {
            debug_assert!(false, "serialising a Message failed");
        }
        w.hasher.update(&w.buf[..w.len]);
        Self(w.hasher.finalize().into())
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
#[non_exhaustive]
pub enum Change {
    /// Both sides have the item and its bytes differ.
    Changed,
    /// Only the later side has the item.
    Added,
    /// Only the earlier side has the item.
    Removed,
    /// Both lists hold the same items, byte for byte, in another order from here on: a
    /// reordering, which breaks the cache as an edit does (the bytes at this position
    /// differ), though nothing was edited.
    Moved,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Changed => "changed",
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Moved => "moved (the same items, in another order)",
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
    /// The request's `tool_choice` differs: the messages cache is invalidated. A per-call
    /// setting, outside every [`PrefixFingerprint`]: only a comparison of two requests
    /// finds it (`Request::cache_break` in forkhive-transport).
    ToolChoice,
    /// The thinking budget a request's effort sets (Anthropic, for a request with no thinking
    /// config of its own) differs — the effort changed, or the `max_tokens` or temperature it
    /// is bounded by: the messages cache is invalidated. Per call, like
    /// [`ToolChoice`](Self::ToolChoice).
    Effort,
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
            CacheBreak::Model
            | CacheBreak::Tool { .. }
            | CacheBreak::Thinking
            | CacheBreak::ToolChoice
            | CacheBreak::Effort => Dimension::Tools,
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
            CacheBreak::ToolChoice => f.write_str("tool_choice changed"),
            CacheBreak::Effort => f.write_str("the thinking budget the effort sets changed"),
            CacheBreak::UserContext { entry, change } => {
                write!(f, "user context entry {entry} {change}")
            }
            CacheBreak::Message { index, change } => write!(f, "messages[{index}] {change}"),
        }
    }
}

const TOTAL_TAG: &[u8] = b"forkhive/prefix/v1\0";
const HEAD_TAG: &[u8] = b"forkhive/head/v1\0";
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
    /// The digest of everything above; set by [`sealed`](Self::sealed).
    pub(crate) digest: Digest,
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

    /// The same digests with [`digest`](Self::digest) computed from them.
    pub(crate) fn sealed(mut self) -> Self {
        let mut h = Sha256::new_with_prefix(HEAD_TAG);
        for d in self.parts() {
            h.update(d.0);
        }
        self.digest = Digest::finish(h);
        self
    }

    /// The dimension digests in the order the total hashes them.
    fn parts(&self) -> [Digest; 6] {
        [
            self.model,
            self.thinking,
            self.tools,
            self.system_prompt,
            self.system_context,
            self.user_context,
        ]
    }
}

/// A message's own digest and the digest of the message chain up to and including it (the
/// Messages dimension of the prefix that ends with this message).
#[derive(Debug, Clone, Copy)]
struct MessageDigest {
    item: Digest,
    chain: Digest,
}

/// The fingerprint of a cache-safe prefix: a digest per dimension, per item, and in total.
///
/// Two prefixes with equal [`total`](Self::total) digests render to the same cache key.
/// Cloning is O(1) and so is extending by `k` messages, up to the O(k) hashing: the per-message
/// digests live in a persistent vector that every extension shares. Equality compares the total
/// digest.
#[derive(Clone)]
pub struct PrefixFingerprint {
    head: Arc<HeadFingerprint>,
    messages: PVec<MessageDigest>,
    messages_state: Sha256,
    messages_digest: Digest,
    total: Digest,
}

const HASH_BUF: usize = 512;

/// Batches serde_json's many small writes into `HASH_BUF`-byte updates of the hash.
struct HashWriter {
    hasher: Sha256,
    buf: [u8; HASH_BUF],
    len: usize,
}

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.len + bytes.len() > HASH_BUF {
            self.hasher.update(&self.buf[..self.len]);
            self.len = 0;
        }
        if bytes.len() >= HASH_BUF {
            self.hasher.update(bytes);
        } else {
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl PrefixFingerprint {
    /// Fingerprints `messages` on top of an already hashed head.
    pub(crate) fn new(head: Arc<HeadFingerprint>, messages: &MessageList) -> Self {
        let mut state = Sha256::new_with_prefix(MESSAGES_TAG);
        let digests: PVec<MessageDigest> = messages
            .iter()
            .map(|m| chained(&mut state, Digest::of_message(m)))
            .collect();
        let messages_digest = match digests.last() {
            Some(d) => d.chain,
            None => Digest::finish(state.clone()),
        };
        Self::assemble(head, digests, state, messages_digest)
    }

    fn assemble(
        head: Arc<HeadFingerprint>,
        messages: PVec<MessageDigest>,
        state: Sha256,
        messages_digest: Digest,
    ) -> Self {
        let mut total = Sha256::new_with_prefix(TOTAL_TAG);
        for d in head.parts() {
            total.update(d.0);
        }
        total.update(messages_digest.0);
        Self {
            head,
            messages,
            messages_state: state,
            messages_digest,
            total: Digest::finish(total),
        }
    }

    /// The fingerprint of this prefix followed by `more` messages, in O(`more`): only the new
    /// messages are hashed, and the earlier digests are shared, not copied.
    pub fn extend(&self, more: &[Message]) -> Self {
        self.extend_with(more.iter().map(Digest::of_message))
    }

    /// The same as [`extend`](Self::extend) for messages whose digests are already known.
    pub(crate) fn extend_digests(&self, more: &[Digest]) -> Self {
        self.extend_with(more.iter().copied())
    }

    /// This prefix followed by messages with the given digests, hashed as they are yielded.
    pub(crate) fn extend_with(&self, more: impl ExactSizeIterator<Item = Digest>) -> Self {
        if more.len() == 0 {
            return self.clone();
        }
        let mut state = self.messages_state.clone();
        let messages = self.messages.extended(more.map(|d| chained(&mut state, d)));
        let messages_digest = match messages.last() {
            Some(d) => d.chain,
            None => self.messages_digest,
        };
        Self::assemble(Arc::clone(&self.head), messages, state, messages_digest)
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

    /// The digest of `messages[index]`. O(log₃₂ n).
    pub fn message(&self, index: usize) -> Option<Digest> {
        self.messages.get(index).map(|d| d.item)
    }

    /// The digest of each message, in order. `skip(n)` jumps in O(log₃₂ n).
    pub fn message_digests(&self) -> MessageDigests<'_> {
        MessageDigests {
            inner: self.messages.iter(),
        }
    }

    /// The Messages-dimension digest of the first `count` messages alone: equal to
    /// `dimension(Dimension::Messages)` of a prefix holding only those messages, so two
    /// prefixes agree on it exactly when their first `count` messages are the same.
    /// `None` when `count` exceeds the message count. O(log₃₂ n).
    pub fn messages_digest_at(&self, count: usize) -> Option<Digest> {
        match count.checked_sub(1) {
            None => Some(Digest::finish(Sha256::new_with_prefix(MESSAGES_TAG))),
            Some(last) => self.messages.get(last).map(|d| d.chain),
        }
    }

    /// The digest of everything before the messages (model, thinking, tools, system prompt,
    /// system context, user context): equal for two prefixes exactly when they differ at most
    /// in their messages.
    pub fn head_digest(&self) -> Digest {
        self.head.digest
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
        self.diff_with(later, true)
    }

    /// [`diff`](Self::diff) with the two prefixes' thinking configs left out: for requests
    /// whose thinking is not their prefixes' own — a per-call override, a budget an effort
    /// sets, a wire format that sends none — which the caller compares itself.
    pub fn diff_ignoring_thinking(&self, later: &PrefixFingerprint) -> Option<CacheBreak> {
        self.diff_with(later, false)
    }

    fn diff_with(&self, later: &PrefixFingerprint, thinking: bool) -> Option<CacheBreak> {
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
        if thinking && a.thinking != b.thinking {
            return Some(CacheBreak::Thinking);
        }
        if let Some((entry, change)) = list_diff(&a.user_context_items, &b.user_context_items) {
            return Some(CacheBreak::UserContext { entry, change });
        }
        // Chain digests agree up to the first differing message and disagree from there on, so
        // the first difference is found by binary search: O(log n), not O(n).
        let (n, m) = (self.messages.len(), later.messages.len());
        let common = n.min(m);
        let same = |i: usize| match (self.messages.get(i), later.messages.get(i)) {
            (Some(x), Some(y)) => x.chain == y.chain,
            _ => false,
        };
        let (mut lo, mut hi) = (0, common);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if same(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo < common {
            return Some(CacheBreak::Message {
                index: lo,
                change: Change::Changed,
            });
        }
        if n > m {
            return Some(CacheBreak::Message {
                index: m,
                change: Change::Removed,
            });
        }
        // `later` extends `self`: everything `self` cached is a prefix of `later`.
        None
    }
}

/// Feeds `item` into the message chain and returns it with the chain's digest so far.
fn chained(state: &mut Sha256, item: Digest) -> MessageDigest {
    state.update(item.0);
    MessageDigest {
        item,
        chain: Digest::finish(state.clone()),
    }
}

/// The digests of a prefix's messages, in order; see [`PrefixFingerprint::message_digests`].
#[derive(Clone)]
pub struct MessageDigests<'a> {
    inner: Iter<'a, MessageDigest>,
}

impl Iterator for MessageDigests<'_> {
    type Item = Digest;

    fn next(&mut self) -> Option<Digest> {
        self.inner.next().map(|d| d.item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }

    fn nth(&mut self, n: usize) -> Option<Digest> {
        self.inner.nth(n).map(|d| d.item)
    }
}

impl DoubleEndedIterator for MessageDigests<'_> {
    fn next_back(&mut self) -> Option<Digest> {
        self.inner.next_back().map(|d| d.item)
    }
}

impl ExactSizeIterator for MessageDigests<'_> {}

impl std::iter::FusedIterator for MessageDigests<'_> {}

impl fmt::Debug for MessageDigests<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageDigests")
            .field("remaining", &self.len())
            .finish()
    }
}

fn list_diff(a: &[Digest], b: &[Digest]) -> Option<(usize, Change)> {
    let common = a.len().min(b.len());
    if let Some(i) = (0..common).find(|&i| a[i] != b[i]) {
        // Only on a break, so sorting (O(n log n) over a few tools or blocks) costs nothing
        // on the way of a request that reads its cache.
        let (mut x, mut y) = (a[i..].to_vec(), b[i..].to_vec());
        x.sort_unstable();
        y.sort_unstable();
        let change = if x == y {
            Change::Moved
        } else {
            Change::Changed
        };
        return Some((i, change));
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
