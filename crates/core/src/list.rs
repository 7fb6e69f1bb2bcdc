//! [`MessageList`]: a conversation prefix that grows by appending and shares its history.
//!
//! An agent's conversation grows every turn, and every turn's [`CacheSafeParams`] holds the
//! whole of it. Copying the history per turn would make a long agent O(n²), so the messages
//! live in a persistent vector: a 32-ary trie of shared leaves plus a tail of at most 32
//! elements (the layout of Clojure's `PersistentVector`). Appending `k` messages copies the
//! tail's ≤ 32 pointers, moves the `k` new messages in, and — once per 32 elements — copies
//! the ≤ log₃₂(n) branch nodes on the path to the new leaf: O(k) for any history length
//! that fits in memory (log₃₂ n ≤ 4 up to a million messages), and not amortised. Every
//! value made by appending shares all earlier leaves with the value it was made from.
//!
//! Indexing walks the trie (O(log₃₂ n)); iteration visits one leaf after the other.
//!
//! [`CacheSafeParams`]: crate::CacheSafeParams

use std::fmt;
use std::iter::FusedIterator;
use std::ops::Index;
use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::message::Message;

const BITS: u32 = 5;
const WIDTH: usize = 1 << BITS;
const MASK: usize = WIDTH - 1;

enum Node<T> {
    Branch(Vec<Arc<Node<T>>>),
    Leaf(Arc<[T]>),
}

/// A persistent vector: O(1) clone, O(k) append of k elements that shares every earlier
/// element with the original, O(log₃₂ n) indexing.
pub(crate) struct PVec<T> {
    len: usize,
    /// The root's children are selected by `(index >> shift) & MASK`; a branch with shift
    /// `BITS` has leaves as children.
    shift: u32,
    /// `None` while every element fits in the tail.
    root: Option<Arc<Node<T>>>,
    /// The last 1..=32 elements (none when the vector is empty). Always starts at a multiple
    /// of 32.
    tail: Arc<[T]>,
}

impl<T> Clone for PVec<T> {
    fn clone(&self) -> Self {
        Self {
            len: self.len,
            shift: self.shift,
            root: self.root.clone(),
            tail: Arc::clone(&self.tail),
        }
    }
}

impl<T> Default for PVec<T> {
    fn default() -> Self {
        Self {
            len: 0,
            shift: BITS,
            root: None,
            tail: Arc::from(Vec::new()),
        }
    }
}

impl<T> PVec<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn tail_offset(&self) -> usize {
        self.len - self.tail.len()
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        if index >= self.len {
            return None;
        }
        self.chunk(index)?.get(index & MASK)
    }

    pub(crate) fn last(&self) -> Option<&T> {
        self.tail.last()
    }

    /// The leaf (or the tail) holding `index`; it starts at `index & !MASK`.
    fn chunk(&self, index: usize) -> Option<&[T]> {
        if index >= self.tail_offset() {
            return Some(&self.tail);
        }
        let mut node = self.root.as_deref()?;
        let mut shift = self.shift;
        loop {
            match node {
                Node::Branch(children) => {
                    node = children.get((index >> shift) & MASK)?;
                    shift = shift.saturating_sub(BITS);
                }
                Node::Leaf(items) => return Some(items),
            }
        }
    }

    pub(crate) fn iter(&self) -> Iter<'_, T> {
        Iter {
            vec: self,
            front: 0,
            back: self.len,
            front_chunk: &[],
            back_chunk: &[],
        }
    }

    /// Adds a full leaf whose first element has index `start` to the trie.
    fn push_leaf(&mut self, start: usize, leaf: Arc<[T]>) {
        let leaf = Arc::new(Node::Leaf(leaf));
        self.root = Some(match self.root.take() {
            None => {
                self.shift = BITS;
                Arc::new(Node::Branch(vec![leaf]))
            }
            // The root is full: grow a level.
            Some(root) if start >= (WIDTH << self.shift) => {
                let path = new_path(self.shift, leaf);
                self.shift += BITS;
                Arc::new(Node::Branch(vec![root, path]))
            }
            Some(root) => push_into(&root, self.shift, start, leaf),
        });
    }
}

/// A chain of branches from `shift` down to `leaf`.
fn new_path<T>(shift: u32, leaf: Arc<Node<T>>) -> Arc<Node<T>> {
    let mut node = leaf;
    let mut s = BITS;
    loop {
        node = Arc::new(Node::Branch(vec![node]));
        if s >= shift {
            return node;
        }
        s += BITS;
    }
}

/// `node` (a branch at `shift`) with `leaf` added at element index `start`: copies the path.
fn push_into<T>(node: &Arc<Node<T>>, shift: u32, start: usize, leaf: Arc<Node<T>>) -> Arc<Node<T>> {
    let Node::Branch(children) = &**node else {
        debug_assert!(false, "a leaf where a branch was expected");
        return Arc::clone(node);
    };
    let index = (start >> shift) & MASK;
    let mut children = children.clone();
    let child = if shift == BITS {
        leaf
    } else {
        match children.get(index) {
            Some(existing) => push_into(existing, shift - BITS, start, leaf),
            None => new_path(shift - BITS, leaf),
        }
    };
    if index < children.len() {
        children[index] = child;
    } else {
        children.push(child);
    }
    Arc::new(Node::Branch(children))
}

impl<T: Clone> PVec<T> {
    /// This vector followed by `more`. Shares every leaf of `self`.
    pub(crate) fn extended(&self, more: impl IntoIterator<Item = T>) -> Self {
        let mut more = more.into_iter();
        let (low, high) = more.size_hint();
        // The common case — a few elements that fit in a tail that is not full — builds the
        // new tail in one exact allocation (the old tail's pointers, then the new elements).
        // The hint only picks the path: at most `room` elements are taken, and whatever an
        // iterator yields beyond its hint goes on through the general path.
        if low > 0 && high == Some(low) && self.tail.len() + low <= WIDTH {
            let room = WIDTH - self.tail.len();
            let mut out = self.clone();
            out.tail = self
                .tail
                .iter()
                .cloned()
                .chain(more.by_ref().take(room))
                .collect();
            out.len = self.tail_offset() + out.tail.len();
            return out.extended_slow(more);
        }
        self.extended_slow(more)
    }

    /// [`extended`](Self::extended) for any iterator: element by element into new tails.
    fn extended_slow(&self, more: impl Iterator<Item = T>) -> Self {
        let mut more = more.peekable();
        if more.peek().is_none() {
            return self.clone();
        }
        let mut out = self.clone();
        let mut tail_start = self.tail_offset();
        let mut tail: Vec<T> = Vec::with_capacity(WIDTH);
        if self.tail.len() == WIDTH {
            // A full tail becomes a leaf as it is: no copy.
            out.push_leaf(tail_start, Arc::clone(&self.tail));
            tail_start += WIDTH;
        } else {
            tail.extend(self.tail.iter().cloned());
        }
        for item in more {
            if tail.len() == WIDTH {
                let full = std::mem::replace(&mut tail, Vec::with_capacity(WIDTH));
                out.push_leaf(tail_start, Arc::from(full));
                tail_start += WIDTH;
            }
            tail.push(item);
        }
        out.len = tail_start + tail.len();
        out.tail = Arc::from(tail);
        out
    }
}

impl<T> PVec<Arc<T>> {
    /// Whether the first `prefix.len()` elements of `self` are `prefix`'s very allocations
    /// (one was made from the other by appending): one pointer comparison per shared leaf,
    /// one per element of a copied tail.
    pub(crate) fn shares_prefix(&self, prefix: &Self) -> bool {
        if prefix.len > self.len {
            return false;
        }
        let mut start = 0;
        while start < prefix.len {
            let (Some(ours), Some(theirs)) = (self.chunk(start), prefix.chunk(start)) else {
                return false;
            };
            let n = theirs.len().min(prefix.len - start);
            let Some(ours) = ours.get(..n) else {
                return false;
            };
            let theirs = &theirs[..n];
            if !std::ptr::eq(ours.as_ptr(), theirs.as_ptr())
                && !ours.iter().zip(theirs).all(|(a, b)| Arc::ptr_eq(a, b))
            {
                return false;
            }
            start += WIDTH;
        }
        true
    }
}

impl<T: Clone> FromIterator<T> for PVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self::default().extended(iter)
    }
}

/// An iterator over a [`PVec`], one leaf at a time.
pub(crate) struct Iter<'a, T> {
    vec: &'a PVec<T>,
    front: usize,
    back: usize,
    /// Elements from `front` on (if not empty).
    front_chunk: &'a [T],
    /// Elements up to `back` (if not empty).
    back_chunk: &'a [T],
}

impl<T> Clone for Iter<'_, T> {
    fn clone(&self) -> Self {
        Self { ..*self }
    }
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        if self.front >= self.back {
            return None;
        }
        if self.front_chunk.is_empty() {
            self.front_chunk = self.vec.chunk(self.front)?.get(self.front & MASK..)?;
        }
        let (first, rest) = self.front_chunk.split_first()?;
        self.front_chunk = rest;
        self.front += 1;
        Some(first)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back.saturating_sub(self.front);
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<&'a T> {
        // Jump: O(log₃₂ len), not O(n).
        let skip = n.min(self.back.saturating_sub(self.front));
        if skip > 0 {
            self.front += skip;
            self.front_chunk = &[];
        }
        self.next()
    }
}

impl<'a, T> DoubleEndedIterator for Iter<'a, T> {
    fn next_back(&mut self) -> Option<&'a T> {
        if self.front >= self.back {
            return None;
        }
        if self.back_chunk.is_empty() {
            let last = self.back - 1;
            self.back_chunk = self.vec.chunk(last)?.get(..=last & MASK)?;
        }
        let (last, rest) = self.back_chunk.split_last()?;
        self.back_chunk = rest;
        self.back -= 1;
        Some(last)
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

impl<T> FusedIterator for Iter<'_, T> {}

/// The conversation prefix of a [`CacheSafeParams`](crate::CacheSafeParams): an immutable list
/// of messages that is cloned in O(1) and appended to in O(appended messages), sharing every
/// earlier message with the list it was made from.
///
/// It reads like a slice: [`len`](Self::len), [`get`](Self::get), [`last`](Self::last),
/// [`iter`](Self::iter) (double-ended, exact-size), indexing and `for m in &list`. Indexing is
/// O(log₃₂ n) — a few pointer hops — and iteration walks one 32-message leaf after another.
///
/// ```
/// use forkhive_core::{Message, MessageList};
/// let a = MessageList::from(vec![Message::user_text("hi")]);
/// let b = a.extended([Message::assistant_text("hello")]); // O(1 message); `a` is unchanged
/// assert_eq!((a.len(), b.len()), (1, 2));
/// assert_eq!(b[1].text(), "hello");
/// for m in &b {
///     assert!(!m.text().is_empty());
/// }
/// assert_eq!(b.to_vec(), vec![Message::user_text("hi"), Message::assistant_text("hello")]);
/// ```
#[derive(Clone, Default)]
pub struct MessageList {
    items: PVec<Arc<Message>>,
}

impl MessageList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.items.len() == 0
    }

    /// The message at `index`, if any. O(log₃₂ n).
    pub fn get(&self, index: usize) -> Option<&Message> {
        self.items.get(index).map(|m| &**m)
    }

    /// The first message, if any.
    pub fn first(&self) -> Option<&Message> {
        self.get(0)
    }

    /// The last message, if any. O(1).
    pub fn last(&self) -> Option<&Message> {
        self.items.last().map(|m| &**m)
    }

    /// The messages in order. `iter().skip(n)` jumps in O(log₃₂ n).
    pub fn iter(&self) -> MessageIter<'_> {
        MessageIter {
            inner: self.items.iter(),
        }
    }

    /// The messages, copied into a `Vec` (O(history)).
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }

    /// This list followed by `more`, in O(`more`); `self` is unchanged and every earlier
    /// message is shared, not copied.
    pub fn extended(&self, more: impl IntoIterator<Item = Message>) -> Self {
        self.extended_shared(more.into_iter().map(Arc::new))
    }

    /// [`extended`](Self::extended) with messages already shared: each `Arc` is kept as it is.
    pub fn extended_shared(&self, more: impl IntoIterator<Item = Arc<Message>>) -> Self {
        Self {
            items: self.items.extended(more),
        }
    }

    /// The messages from `start` on, as a list of their own that shares each message with
    /// `self` (no message is copied): O(`len − start`) pointer copies. Empty when `start` is
    /// past the end.
    ///
    /// ```
    /// use forkhive_core::{Message, MessageList};
    /// let all = MessageList::from(vec![Message::user_text("a"), Message::assistant_text("b")]);
    /// assert_eq!(all.tail_from(1).to_vec(), vec![Message::assistant_text("b")]);
    /// assert!(all.tail_from(5).is_empty());
    /// ```
    pub fn tail_from(&self, start: usize) -> MessageList {
        Self {
            items: self.items.iter().skip(start).cloned().collect(),
        }
    }

    /// Whether `self` begins with `prefix`'s very messages (it was made from `prefix`, or from a
    /// list made from it, by appending). O(len ÷ 32) pointer comparisons.
    pub(crate) fn shares_prefix(&self, prefix: &Self) -> bool {
        self.items.shares_prefix(&prefix.items)
    }

    /// Whether `self` and `other` share their storage (one was cloned from the other, or both
    /// are empty), which implies they are equal.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        if self.is_empty() && other.is_empty() {
            return true;
        }
        self.len() == other.len()
            && Arc::ptr_eq(&self.items.tail, &other.items.tail)
            && match (&self.items.root, &other.items.root) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// An iterator over a [`MessageList`]; see [`MessageList::iter`].
#[derive(Clone)]
pub struct MessageIter<'a> {
    inner: Iter<'a, Arc<Message>>,
}

impl<'a> Iterator for MessageIter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        self.inner.next().map(|m| &**m)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }

    fn nth(&mut self, n: usize) -> Option<&'a Message> {
        self.inner.nth(n).map(|m| &**m)
    }
}

impl DoubleEndedIterator for MessageIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|m| &**m)
    }
}

impl ExactSizeIterator for MessageIter<'_> {}

impl FusedIterator for MessageIter<'_> {}

impl fmt::Debug for MessageIter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageIter")
            .field("remaining", &self.len())
            .finish()
    }
}

impl<'a> IntoIterator for &'a MessageList {
    type Item = &'a Message;
    type IntoIter = MessageIter<'a>;

    fn into_iter(self) -> MessageIter<'a> {
        self.iter()
    }
}

impl Index<usize> for MessageList {
    type Output = Message;

    fn index(&self, index: usize) -> &Message {
        match self.get(index) {
            Some(m) => m,
            None => panic!(
                "index out of bounds: the len is {} but the index is {index}",
                self.len()
            ),
        }
    }
}

impl FromIterator<Message> for MessageList {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self::new().extended(iter)
    }
}

impl From<Vec<Message>> for MessageList {
    fn from(messages: Vec<Message>) -> Self {
        messages.into_iter().collect()
    }
}

impl From<Box<[Message]>> for MessageList {
    fn from(messages: Box<[Message]>) -> Self {
        messages.into_vec().into()
    }
}

impl<const N: usize> From<[Message; N]> for MessageList {
    fn from(messages: [Message; N]) -> Self {
        messages.into_iter().collect()
    }
}

impl From<&[Message]> for MessageList {
    fn from(messages: &[Message]) -> Self {
        messages.iter().cloned().collect()
    }
}

impl From<Arc<[Message]>> for MessageList {
    fn from(messages: Arc<[Message]>) -> Self {
        messages.iter().cloned().collect()
    }
}

impl PartialEq for MessageList {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || (self.len() == other.len() && self.iter().eq(other.iter()))
    }
}

impl Eq for MessageList {}

impl PartialEq<[Message]> for MessageList {
    fn eq(&self, other: &[Message]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<Message>> for MessageList {
    fn eq(&self, other: &Vec<Message>) -> bool {
        *self == **other
    }
}

impl fmt::Debug for MessageList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for MessageList {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pvec(n: usize) -> PVec<usize> {
        (0..n).collect()
    }

    /// Yields `0..n` but claims exactly `hint` elements.
    struct Liar {
        next: usize,
        n: usize,
        hint: usize,
    }

    impl Iterator for Liar {
        type Item = usize;
        fn next(&mut self) -> Option<usize> {
            (self.next < self.n).then(|| {
                self.next += 1;
                self.next - 1
            })
        }
        fn size_hint(&self) -> (usize, Option<usize>) {
            (self.hint, Some(self.hint))
        }
    }

    fn arcs(n: usize) -> PVec<Arc<usize>> {
        (0..n).map(Arc::new).collect()
    }

    #[test]
    fn a_shared_prefix_is_told_from_an_equal_copy_across_leaves_and_tails() {
        for base_len in [0, 1, 31, 32, 33, 64, 100, 1100] {
            let base = arcs(base_len);
            for more in [0, 1, 5, 32, 70] {
                let grown = base.extended((0..more).map(Arc::new));
                assert!(grown.shares_prefix(&base), "base={base_len} more={more}");
                assert!(grown.shares_prefix(&grown));
                assert_eq!(
                    base.shares_prefix(&grown),
                    more == 0,
                    "shorter never starts with longer"
                );
                // A sibling grown from the same base shares the base, not the other's growth.
                let sibling = base.extended((0..more).map(Arc::new));
                assert!(sibling.shares_prefix(&base));
                assert_eq!(sibling.shares_prefix(&grown), more == 0);
            }
            // Equal values in other allocations are not shared.
            let copy = arcs(base_len);
            assert_eq!(copy.shares_prefix(&base), base_len == 0);
        }
        // Two steps of growth still share the first.
        let a = arcs(40);
        let b = a.extended((0..3).map(Arc::new));
        let c = b.extended((0..30).map(Arc::new));
        assert!(c.shares_prefix(&a) && c.shares_prefix(&b));
    }

    #[test]
    fn an_iterator_that_misstates_its_length_loses_nothing() {
        for start in [0, 5, 31, 32, 40] {
            for (n, hint) in [(40, 0), (50, 2), (1, 3), (0, 1), (3, 3)] {
                let base = pvec(start);
                let v = base.extended(Liar { next: 0, n, hint });
                let expected: Vec<usize> = (0..start).chain(0..n).collect();
                assert_eq!(v.len(), expected.len(), "start={start} n={n} hint={hint}");
                assert!(v.iter().copied().eq(expected.iter().copied()));
                for (i, e) in expected.iter().enumerate() {
                    assert_eq!(v.get(i), Some(e), "start={start} n={n} hint={hint} i={i}");
                }
            }
        }
    }

    #[test]
    fn indexing_and_iteration_across_levels() {
        for n in [
            0,
            1,
            31,
            32,
            33,
            64,
            65,
            1023,
            1024,
            1025,
            1056,
            33 * 32 * 32 + 7,
        ] {
            let v = pvec(n);
            assert_eq!(v.len(), n);
            for i in 0..n {
                assert_eq!(v.get(i), Some(&i), "n={n} i={i}");
            }
            assert_eq!(v.get(n), None);
            assert!(v.iter().copied().eq(0..n), "n={n}");
            assert!(v.iter().rev().copied().eq((0..n).rev()), "n={n}");
            assert_eq!(v.last().copied(), n.checked_sub(1));
            assert_eq!(v.iter().len(), n);
        }
    }

    #[test]
    fn nth_jumps_and_both_ends_meet() {
        let v = pvec(100);
        let mut it = v.iter();
        assert_eq!(it.nth(40), Some(&40));
        assert_eq!(it.next_back(), Some(&99));
        assert_eq!(it.nth(57), Some(&98));
        assert_eq!(it.next(), None);
        assert_eq!(it.next_back(), None);
        assert_eq!(
            v.iter().skip(70).copied().collect::<Vec<_>>(),
            (70..100).collect::<Vec<_>>()
        );
        assert_eq!(v.iter().nth(100), None);
    }

    #[test]
    fn extending_shares_and_leaves_the_original_alone() {
        let a = pvec(40);
        let b = a.extended(40..45);
        let c = a.extended([100, 101]);
        assert!(a.iter().copied().eq(0..40));
        assert!(b.iter().copied().eq(0..45));
        assert!(c.iter().copied().eq((0..40).chain([100, 101])));
        // The first leaf is one allocation for all three.
        let leaf = |v: &PVec<usize>| v.chunk(0).map(<[usize]>::as_ptr);
        assert_eq!(leaf(&a), leaf(&b));
        assert_eq!(leaf(&a), leaf(&c));
    }

    proptest! {
        #[test]
        fn appends_in_any_batches_equal_a_vec(batches in prop::collection::vec(0usize..70, 0..40)) {
            let mut v = PVec::default();
            let mut reference = Vec::new();
            let mut snapshots = Vec::new();
            for k in batches {
                let more: Vec<usize> = (reference.len()..reference.len() + k).collect();
                v = v.extended(more.iter().copied());
                reference.extend(more);
                snapshots.push((v.clone(), reference.len()));
            }
            prop_assert!(v.iter().eq(reference.iter()));
            for (i, x) in reference.iter().enumerate() {
                prop_assert_eq!(v.get(i), Some(x));
            }
            // Earlier values are untouched by later appends.
            for (s, n) in snapshots {
                prop_assert!(s.iter().copied().eq(0..n));
            }
        }
    }

    #[test]
    fn message_list_reads_like_a_slice() {
        let msgs: Vec<Message> = (0..40).map(|i| Message::user_text(i.to_string())).collect();
        let list = MessageList::from(msgs.clone());
        assert_eq!(list, msgs);
        assert_eq!(list.len(), 40);
        assert_eq!(list[39].text(), "39");
        assert_eq!(list.first().map(Message::text).as_deref(), Some("0"));
        assert_eq!(list.last().map(Message::text).as_deref(), Some("39"));
        assert_eq!(list.get(40), None);
        let mut n = 0;
        for m in &list {
            assert_eq!(*m, msgs[n]);
            n += 1;
        }
        assert_eq!(n, 40);
        assert_eq!(
            serde_json::to_vec(&list).unwrap_or_default(),
            serde_json::to_vec(&msgs).unwrap_or_default()
        );
        let longer = list.extended([Message::assistant_text("x")]);
        assert!(!longer.ptr_eq(&list));
        assert!(list.clone().ptr_eq(&list));
        assert_ne!(longer, list);
        assert!(MessageList::new().is_empty());
    }
}
