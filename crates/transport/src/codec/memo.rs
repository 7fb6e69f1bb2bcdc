//! What a codec remembers between requests: a bounded memo, each message's encoded bytes, and
//! ropes of encoded conversation prefixes.
//!
//! An agent sends one request per turn, and each request repeats the whole conversation. So
//! that a turn costs O(what is new), a codec encodes each message once, keyed by the message's
//! SHA-256 digest (a key names exactly one message's bytes, so a memo can never hand out the
//! bytes of another message), and keeps the encoded first `j` messages of a conversation as a
//! [`Rope`] keyed by the digest of that message chain
//! ([`PrefixFingerprint::messages_digest_at`]). The next turn finds the rope of the previous
//! one a message or two back, extends it by the new messages, and the body is the head chunk,
//! the rope's pieces, and the request's own bytes.
//!
//! A rope keeps its pieces few by merging them in tiers: every 16 one-message pieces become one
//! piece, every 16 of those one more, and so on. A body therefore has O(15 · log₁₆ n) chunks
//! (≤ 45 for 4,096 messages), and each byte is copied at most log₁₆ n times over a
//! conversation's whole life (amortised O(1) copies per byte for any realistic length); the
//! messages themselves are never re-encoded while they stay in the memo.
//!
//! [`PrefixFingerprint::messages_digest_at`]: forkhive_core::PrefixFingerprint::messages_digest_at

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use forkhive_core::{CacheSafeParams, Digest, Message};

/// How much a codec remembers between requests.
///
/// Two memos are bounded, each by an entry count and a byte budget, whichever is reached
/// first; entries are evicted by CLOCK (second chance: an entry used since the hand last
/// passed it survives one more sweep).
///
/// - **messages**: each message's encoded bytes, keyed by the message's digest. Default:
///   4,096 entries or 64 MiB.
/// - **prefixes**: for recent conversation prefixes, the encoded messages as a few merged
///   chunks (a rope), keyed by the digest of the message chain. A rope's weight is the length
///   of everything it spans, although consecutive ropes of one conversation share most of
///   their bytes, so the budget overstates the memory held. Default: 256 entries or 256 MiB.
///
/// A request whose history fell out of both memos is encoded again, in O(history), and is
/// byte for byte the same.
///
/// ```
/// use forkhive_transport::codec::MemoConfig;
/// use forkhive_transport::{AnthropicCodec, CachePolicy};
/// let mut config = MemoConfig::default();
/// config.message_entries = 1_000;
/// let codec = AnthropicCodec::with_memo(CachePolicy::default(), config);
/// # drop(codec);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct MemoConfig {
    /// The most encoded messages kept.
    pub message_entries: usize,
    /// The most bytes of encoded messages kept.
    pub message_bytes: usize,
    /// The most encoded prefixes (ropes) kept.
    pub prefix_entries: usize,
    /// The most bytes the kept ropes may span (shared bytes counted once per rope).
    pub prefix_bytes: usize,
}

impl Default for MemoConfig {
    fn default() -> Self {
        Self {
            message_entries: 4096,
            message_bytes: 64 << 20,
            prefix_entries: 256,
            prefix_bytes: 256 << 20,
        }
    }
}

/// The bookkeeping an entry costs beyond its bytes, for the byte budgets.
const ENTRY_OVERHEAD: usize = 96;

/// How far back (in messages) a prefix looks for a rope to extend before it encodes from the
/// start. A turn adds two messages, and a fork child a few.
const LOOKBACK: usize = 16;

/// How many pieces of one tier a rope merges into one piece of the next.
const FANOUT: usize = 16;

/// A bounded, thread-safe memo with CLOCK eviction, bounded by entries and by weight.
pub(crate) struct Memo<K, V> {
    state: Mutex<Clock<K, V>>,
}

struct Clock<K, V> {
    index: HashMap<K, usize>,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<usize>,
    hand: usize,
    weight: usize,
    max_entries: usize,
    max_weight: usize,
    hits: u64,
    misses: u64,
}

struct Slot<K, V> {
    key: K,
    value: V,
    weight: usize,
    referenced: bool,
}

impl<K: Hash + Eq + Clone, V: Clone> Memo<K, V> {
    /// A memo holding at most `max_entries` entries weighing at most `max_weight` in total.
    pub(crate) fn new(max_entries: usize, max_weight: usize) -> Self {
        Self {
            state: Mutex::new(Clock {
                index: HashMap::new(),
                slots: Vec::new(),
                free: Vec::new(),
                hand: 0,
                weight: 0,
                max_entries,
                max_weight,
                hits: 0,
                misses: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock<K, V>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value for `key`, if present; marks it as used.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let mut c = self.lock();
        let found = c.index.get(key).copied();
        match found
            .and_then(|i| c.slots.get_mut(i))
            .and_then(Option::as_mut)
        {
            Some(slot) => {
                slot.referenced = true;
                let value = slot.value.clone();
                c.hits += 1;
                Some(value)
            }
            None => {
                c.misses += 1;
                None
            }
        }
    }

    /// Stores `value` under `key` unless the key is present, evicting as needed. A value
    /// heavier than the whole budget is not stored.
    pub(crate) fn insert(&self, key: K, value: V, weight: usize) {
        self.lock().insert(key, value, weight);
    }

    /// The value for `key`, made by `make` (which returns it with its weight) on a miss.
    /// `make` runs without the lock held.
    pub(crate) fn get_or_insert_with(&self, key: K, make: impl FnOnce() -> (V, usize)) -> V {
        if let Some(v) = self.get(&key) {
            return v;
        }
        let (value, weight) = make();
        self.insert(key, value.clone(), weight);
        value
    }

    /// `(entries, weight, hits, misses)`.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> (usize, usize, u64, u64) {
        let c = self.lock();
        (c.index.len(), c.weight, c.hits, c.misses)
    }
}

impl<K: Hash + Eq + Clone, V> Clock<K, V> {
    fn insert(&mut self, key: K, value: V, weight: usize) {
        if self.index.contains_key(&key) || self.max_entries == 0 || weight > self.max_weight {
            return;
        }
        while self.index.len() >= self.max_entries
            || self.weight.saturating_add(weight) > self.max_weight
        {
            if !self.evict_one() {
                break;
            }
        }
        let slot = Some(Slot {
            key: key.clone(),
            value,
            weight,
            referenced: false,
        });
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.index.insert(key, i);
        self.weight += weight;
    }

    /// Evicts the first entry under the hand not used since the hand last passed it. Ends
    /// within two sweeps, since the first clears every mark.
    fn evict_one(&mut self) -> bool {
        if self.index.is_empty() {
            return false;
        }
        loop {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let i = self.hand;
            self.hand += 1;
            match &mut self.slots[i] {
                Some(slot) if slot.referenced => slot.referenced = false,
                Some(_) => {
                    if let Some(slot) = self.slots[i].take() {
                        self.index.remove(&slot.key);
                        self.weight -= slot.weight;
                        self.free.push(i);
                    }
                    return true;
                }
                None => {}
            }
        }
    }
}

impl<K, V> fmt::Debug for Memo<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Memo")
            .field("entries", &c.index.len())
            .field("max_entries", &c.max_entries)
            .field("weight", &c.weight)
            .field("max_weight", &c.max_weight)
            .field("hits", &c.hits)
            .field("misses", &c.misses)
            .finish()
    }
}

/// One message's encoding as an element of the `messages` array, led by a comma.
#[derive(Debug, Clone)]
pub(crate) struct EncodedMessage {
    /// `,` then the encoded message (empty when the format writes nothing for it).
    pub(crate) bytes: Bytes,
    /// Where a `cache_control` marker goes if the message carries the prefix's breakpoint: the
    /// offset of the `}` closing its last cacheable block. `None` when it has none.
    pub(crate) mark: Option<usize>,
}

/// The first `messages` messages of a conversation, encoded, as a few shared pieces.
#[derive(Debug, Default)]
pub(crate) struct Rope {
    pieces: Vec<Piece>,
    messages: usize,
    bytes: usize,
}

#[derive(Debug, Clone)]
struct Piece {
    bytes: Bytes,
    /// How many messages the piece holds: a power of [`FANOUT`].
    messages: usize,
}

impl Rope {
    /// The pieces, in order; concatenated they are the encoded messages.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &Bytes> {
        self.pieces.iter().map(|p| &p.bytes)
    }

    /// This rope followed by `more` encoded messages; shares every piece it does not merge.
    fn extended(&self, more: impl IntoIterator<Item = Bytes>) -> Rope {
        let mut out = Rope {
            pieces: self.pieces.clone(),
            messages: self.messages,
            bytes: self.bytes,
        };
        for bytes in more {
            out.messages += 1;
            out.bytes += bytes.len();
            out.pieces.push(Piece { bytes, messages: 1 });
            merge_tiers(&mut out.pieces);
        }
        out
    }
}

/// Merges the last [`FANOUT`] pieces while they are all of one tier.
fn merge_tiers(pieces: &mut Vec<Piece>) {
    while let Some(start) = pieces.len().checked_sub(FANOUT) {
        let tier = pieces[pieces.len() - 1].messages;
        if pieces[start..].iter().any(|p| p.messages != tier) {
            return;
        }
        let len = pieces[start..].iter().map(|p| p.bytes.len()).sum();
        let mut merged = Vec::with_capacity(len);
        for p in pieces.drain(start..) {
            merged.extend_from_slice(&p.bytes);
        }
        pieces.push(Piece {
            bytes: Bytes::from(merged),
            messages: tier * FANOUT,
        });
    }
}

/// A codec's memory of encoded messages and prefixes.
pub(crate) struct MessageCache {
    encode: fn(&Message) -> EncodedMessage,
    messages: Memo<Digest, EncodedMessage>,
    ropes: Memo<Digest, Arc<Rope>>,
}

impl MessageCache {
    /// A cache encoding messages with `encode`, bounded by `config`.
    pub(crate) fn new(encode: fn(&Message) -> EncodedMessage, config: &MemoConfig) -> Self {
        Self {
            encode,
            messages: Memo::new(config.message_entries, config.message_bytes),
            ropes: Memo::new(config.prefix_entries, config.prefix_bytes),
        }
    }

    /// The encoding of `message`, whose digest is `digest`: encoded on the first request that
    /// holds it, then shared.
    pub(crate) fn message(&self, digest: Digest, message: &Message) -> EncodedMessage {
        self.messages.get_or_insert_with(digest, || {
            let e = (self.encode)(message);
            let weight = e.bytes.len() + ENTRY_OVERHEAD;
            (e, weight)
        })
    }

    /// The first `end` messages of `params`, encoded: from the memo, or by extending the
    /// rope of a slightly shorter prefix of the same conversation, or (for a history the codec
    /// has not seen recently) from the per-message memo and the encoder.
    pub(crate) fn rope(&self, params: &CacheSafeParams, end: usize) -> Arc<Rope> {
        if end == 0 {
            return Arc::default();
        }
        let fp = params.fingerprint();
        let key = fp.messages_digest_at(end);
        if let Some(k) = &key
            && let Some(rope) = self.ropes.get(k)
        {
            return rope;
        }
        let (start, base) = (end.saturating_sub(LOOKBACK)..end)
            .rev()
            .take_while(|&i| i > 0)
            .find_map(|i| {
                let k = fp.messages_digest_at(i)?;
                self.ropes.get(&k).map(|rope| (i, rope))
            })
            .unwrap_or_default();
        let new = params
            .messages()
            .iter()
            .skip(start)
            .take(end - start)
            .zip(fp.message_digests().skip(start))
            .map(|(m, d)| self.message(d, m).bytes);
        let rope = Arc::new(base.extended(new));
        if let Some(k) = key {
            self.ropes
                .insert(k, Arc::clone(&rope), rope.bytes + ENTRY_OVERHEAD);
        }
        rope
    }

    /// `(entries, weight, hits, misses)` of the message memo.
    #[cfg(test)]
    pub(crate) fn message_stats(&self) -> (usize, usize, u64, u64) {
        self.messages.stats()
    }
}

impl fmt::Debug for MessageCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageCache")
            .field("messages", &self.messages)
            .field("ropes", &self.ropes)
            .finish()
    }
}

/// A body's chunks under construction. Elements of the `messages` array arrive led by a
/// comma; the first element's comma is dropped when nothing precedes it in the array.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    pub(crate) chunks: Vec<Bytes>,
    /// No element of the `messages` array has been written yet.
    pub(crate) bare: bool,
}

impl Chunks {
    /// Appends bytes that are not the start of an element.
    pub(crate) fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.chunks.push(bytes);
        }
    }

    /// Appends comma-led elements of the `messages` array.
    pub(crate) fn push_elements(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        if self.bare {
            self.bare = false;
            self.push(bytes.slice(1..));
        } else {
            self.push(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_gives_a_used_entry_a_second_chance() {
        let m: Memo<u8, u8> = Memo::new(2, usize::MAX);
        let mut calls = 0;
        for i in [1u8, 2, 1, 3, 1, 2] {
            m.get_or_insert_with(i, || {
                calls += 1;
                (i, 1)
            });
        }
        // 1 and 2 encoded; 1 hit (marked); 3 evicts 2, not 1; 1 hits; 2 is encoded again.
        assert_eq!(calls, 4);
        assert_eq!(m.stats().0, 2);
    }

    #[test]
    fn weight_budget_evicts_and_oversized_values_are_not_kept() {
        let m: Memo<u8, u8> = Memo::new(100, 10);
        for i in 0..5 {
            m.insert(i, i, 4);
        }
        let (entries, weight, _, _) = m.stats();
        assert_eq!((entries, weight), (2, 8));
        m.insert(9, 9, 11);
        assert_eq!(m.get(&9), None);
        assert_eq!(m.get(&4), Some(4));
        let none: Memo<u8, u8> = Memo::new(0, 10);
        none.insert(1, 1, 1);
        assert_eq!(none.get(&1), None);
    }

    #[test]
    fn ropes_merge_in_tiers_and_keep_their_bytes() {
        let mut rope = Rope::default();
        let mut expected = Vec::new();
        for i in 0..(FANOUT * FANOUT + 3 * FANOUT + 5) {
            let piece = format!(",{i}");
            expected.extend_from_slice(piece.as_bytes());
            rope = rope.extended([Bytes::from(piece)]);
            let joined: Vec<u8> = rope.pieces().flat_map(|b| b.iter().copied()).collect();
            assert_eq!(joined, expected);
            assert!(
                rope.pieces.len() < 3 * FANOUT,
                "{} pieces",
                rope.pieces.len()
            );
        }
        // One piece of 256, three of 16, five of 1.
        let tiers: Vec<usize> = rope.pieces.iter().map(|p| p.messages).collect();
        assert_eq!(tiers, [vec![256], vec![16; 3], vec![1; 5]].concat());
    }

    #[test]
    fn the_first_element_loses_its_comma() {
        let mut c = Chunks {
            bare: true,
            ..Chunks::default()
        };
        c.push(Bytes::from_static(b"["));
        c.push_elements(Bytes::new());
        c.push_elements(Bytes::from_static(b",1,2"));
        c.push_elements(Bytes::from_static(b",3"));
        c.push(Bytes::from_static(b"]"));
        let joined: Vec<u8> = c.chunks.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(joined, b"[1,2,3]");
    }
}
