//! Task ids: a one-letter kind prefix and eight base-36 characters.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — File-Based IPC" gives
//! the format (`a3kx9zq2…`: prefix letter, then 8 of `0-9a-z`, about 2.8 trillion values) and
//! the prefixes. Task ids become file names (`tasks/<id>.output`), so [`TaskId`]'s `FromStr` is
//! a security boundary: anything but the exact format — a path separator, `..`, a wrong length,
//! an upper-case letter — is rejected.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::Error;

const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
/// 64 bits from the standard library's randomly keyed hasher, a process-wide counter and the
/// clock (when the operating system's randomness cannot be had).
fn fallback_entropy() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}

/// How many 64-bit draws one read of the operating system's randomness buys.
const ENTROPY_BATCH: usize = 32;

/// This thread's unread draws from the operating system's randomness, read
/// [`ENTROPY_BATCH`] at a time: one `getrandom` call per 32 ids instead of one per id (a
/// wide fan-out names a thousand children in one response).
struct EntropyBuffer {
    draws: [u64; ENTROPY_BATCH],
    /// Draws still unread; they are taken from the end, each once.
    left: usize,
    /// The process the draws were read in: a process forked without `exec` starts with a
    /// copy of its parent's buffer, which it must not use (the two would name tasks alike,
    /// and each could predict the other's next ids).
    pid: u32,
}

impl EntropyBuffer {
    const EMPTY: Self = Self {
        draws: [0; ENTROPY_BATCH],
        left: 0,
        pid: 0,
    };

    /// The next unread draw, refilling from the operating system when none is left or the
    /// buffer was read in another process; `None` when the system's source fails (the buffer
    /// is left empty, so the next call asks again).
    fn next(&mut self, pid: u32) -> Option<u64> {
        if self.pid != pid {
            self.left = 0;
        }
        if self.left == 0 {
            let mut bytes = [0u8; 8 * ENTROPY_BATCH];
            getrandom::fill(&mut bytes).ok()?;
            for (draw, chunk) in self.draws.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                *draw = u64::from_le_bytes(word);
            }
            self.left = ENTROPY_BATCH;
            self.pid = pid;
        }
        self.left -= 1;
        Some(self.draws[self.left])
    }
}

thread_local! {
    static ENTROPY: std::cell::RefCell<EntropyBuffer> =
        const { std::cell::RefCell::new(EntropyBuffer::EMPTY) };
}

/// 64 bits of the operating system's randomness, from this thread's buffer.
fn os_entropy() -> Option<u64> {
    ENTROPY
        .try_with(|buffer| {
            let mut buffer = buffer.try_borrow_mut().ok()?;
            buffer.next(std::process::id())
        })
        .ok()
        .flatten()
}

/// 36^8: the number of distinct suffixes.
const SUFFIX_SPACE: u64 = 2_821_109_907_456;

/// What kind of task an id names; its letter prefixes the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TaskKind {
    /// A shell command (`b`).
    Bash,
    /// An agent: subagent, fork or coordinator worker (`a`).
    Agent,
    /// A remote agent session (`r`).
    Remote,
    /// A long-lived teammate (`t`).
    Teammate,
    /// A workflow (`w`).
    Workflow,
    /// A monitor (`m`).
    Monitor,
    /// A dream (background reflection) task (`d`).
    Dream,
}

impl TaskKind {
    /// Every kind, in prefix order of the seeds.
    pub const ALL: [TaskKind; 7] = [
        TaskKind::Bash,
        TaskKind::Agent,
        TaskKind::Remote,
        TaskKind::Teammate,
        TaskKind::Workflow,
        TaskKind::Monitor,
        TaskKind::Dream,
    ];

    /// The prefix letter.
    pub fn prefix(self) -> char {
        match self {
            TaskKind::Bash => 'b',
            TaskKind::Agent => 'a',
            TaskKind::Remote => 'r',
            TaskKind::Teammate => 't',
            TaskKind::Workflow => 'w',
            TaskKind::Monitor => 'm',
            TaskKind::Dream => 'd',
        }
    }

    /// The kind for a prefix letter.
    pub fn from_prefix(c: char) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.prefix() == c)
    }
}

/// A validated task id such as `a0k3x9zq2`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskId {
    kind: TaskKind,
    suffix: [u8; 8],
}

impl TaskId {
    /// The length of every id's text: its kind's letter and 8 characters.
    pub const LEN: usize = 9;

    /// A fresh random id of the given kind.
    ///
    /// What it is: 8 base-36 characters drawn from 64 bits of the operating system's
    /// randomness (`getrandom`, read 256 bytes at a time into a per-thread buffer whose draws
    /// are each used once, and which a process forked without `exec` does not inherit: the
    /// buffer is refilled when the process id changes), so ids are unpredictable (a worker
    /// cannot guess a sibling's output file name) and collisions unlikely: by the birthday
    /// bound over 36^8 ≈ 2.8 × 10^12 suffixes, the chance that any two of n ids share one is
    /// about n² ÷ 5.6 × 10^12 — 1 in 5.6 million for a thousand ids held at once, 1 in 56,000
    /// for ten thousand. A collision is never silent: a registry refuses a duplicate id and an
    /// output file is created `O_EXCL`, so the spawn fails with an error naming the id. Should
    /// the system's source fail, the id is drawn from the standard library's randomly keyed
    /// hasher over a process-wide counter and the clock instead: unique within the process,
    /// less unpredictable.
    pub fn generate(kind: TaskKind) -> Self {
        Self::from_entropy(kind, os_entropy().unwrap_or_else(fallback_entropy))
    }

    /// The id of the given kind derived from 64 bits of entropy (deterministic: for tests and
    /// replay). Values are reduced modulo 36^8.
    pub fn from_entropy(kind: TaskKind, entropy: u64) -> Self {
        let mut n = entropy % SUFFIX_SPACE;
        let mut suffix = [b'0'; 8];
        for slot in suffix.iter_mut().rev() {
            *slot = ALPHABET[(n % 36) as usize];
            n /= 36;
        }
        Self { kind, suffix }
    }

    /// The task's kind.
    pub fn kind(&self) -> TaskKind {
        self.kind
    }

    /// Appends the id's text (as [`Display`](fmt::Display) writes it) to `out`, without the
    /// formatting machinery: for labels built once per request.
    ///
    /// ```
    /// use forkhive_core::task_id::{TaskId, TaskKind};
    /// let id = TaskId::from_entropy(TaskKind::Agent, 42);
    /// let mut out = String::from("id ");
    /// id.push_to(&mut out);
    /// assert_eq!(out, format!("id {id}"));
    /// ```
    pub fn push_to(&self, out: &mut String) {
        if let Ok(text) = std::str::from_utf8(&self.bytes()) {
            out.push_str(text);
        }
    }

    /// The id's text as bytes: its kind's letter, then the suffix (ASCII only).
    fn bytes(&self) -> [u8; Self::LEN] {
        let mut buf = [0u8; Self::LEN];
        // The prefix is ASCII, so it fits in one byte.
        buf[0] = self.kind.prefix() as u8;
        buf[1..].copy_from_slice(&self.suffix);
        buf
    }
}

/// One word to the hasher instead of three (the kind's discriminant, the array's length, its
/// bytes): every registry, roster and live-child map is keyed by task ids. Equal ids write
/// equal words, so the hash agrees with `Eq`.
impl Hash for TaskId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(self.suffix) ^ ((self.kind as u64) << 56));
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only ASCII bytes are ever stored.
        f.write_str(std::str::from_utf8(&self.bytes()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

impl FromStr for TaskId {
    type Err = Error;

    /// Accepts exactly one known prefix letter followed by 8 characters of `0-9a-z`.
    ///
    /// ```
    /// use forkhive_core::task_id::{TaskId, TaskKind};
    /// let id: TaskId = "a3kx9zq2b".parse()?;
    /// assert_eq!(id.kind(), TaskKind::Agent);
    /// assert!("a3kx9/../".parse::<TaskId>().is_err());
    /// # Ok::<(), forkhive_core::Error>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, Error> {
        let fail = |reason: String| Error::InvalidTaskId {
            input: s.chars().take(64).collect(),
            reason,
        };
        let mut chars = s.chars();
        let Some(first) = chars.next() else {
            return Err(fail("it is empty".to_owned()));
        };
        let kind = TaskKind::from_prefix(first).ok_or_else(|| {
            fail(format!(
                "unknown kind prefix {first:?} (expected one of b, a, r, t, w, m, d)"
            ))
        })?;
        let count = s.chars().count();
        if count != 9 {
            return Err(fail(format!(
                "expected 9 characters (a prefix and 8 of 0-9a-z), found {count}"
            )));
        }
        let mut suffix = [0u8; 8];
        for (i, c) in chars.enumerate() {
            if !(c.is_ascii_digit() || c.is_ascii_lowercase()) {
                return Err(fail(format!(
                    "character {c:?} at position {} is not one of 0-9a-z",
                    i + 1
                )));
            }
            suffix[i] = c as u8;
        }
        Ok(Self { kind, suffix })
    }
}

impl Serialize for TaskId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reason(s: &str) -> String {
        match s.parse::<TaskId>() {
            Err(Error::InvalidTaskId { reason, .. }) => reason,
            other => panic!("{s:?} should be rejected, got {other:?}"),
        }
    }

    #[test]
    fn generated_ids_have_the_format_and_differ() {
        for kind in TaskKind::ALL {
            let id = TaskId::generate(kind);
            let s = id.to_string();
            assert_eq!(s.len(), 9);
            assert!(s.starts_with(kind.prefix()));
            assert_eq!(s.parse::<TaskId>().unwrap(), id);
        }
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| TaskId::generate(TaskKind::Agent).to_string())
            .collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn the_buffer_hands_out_each_draw_once_and_reads_the_system_once_per_batch() {
        let mut buffer = EntropyBuffer::EMPTY;
        let mut seen = std::collections::HashSet::new();
        for i in 0..ENTROPY_BATCH * 3 {
            let refill = i % ENTROPY_BATCH == 0;
            assert_eq!(buffer.left == 0, refill, "draw {i}");
            let batch = buffer.draws;
            let draw = buffer.next(7).unwrap();
            assert!(seen.insert(draw), "draw {i} repeated");
            assert_eq!(buffer.left, ENTROPY_BATCH - 1 - i % ENTROPY_BATCH);
            if refill {
                assert_ne!(
                    buffer.draws, batch,
                    "draw {i}: the batch was not read again"
                );
            } else {
                // Taken from the batch already read: no system call.
                assert_eq!(buffer.draws, batch);
                assert_eq!(draw, batch[buffer.left]);
            }
        }
    }

    #[test]
    fn a_forked_process_does_not_use_its_parents_draws() {
        let mut buffer = EntropyBuffer::EMPTY;
        let parent = buffer.next(100).unwrap();
        let batch = buffer.draws;
        // The same buffer, as a child forked without `exec` finds it: read again.
        let child = buffer.next(101).unwrap();
        assert_ne!(buffer.draws, batch);
        assert_eq!(buffer.left, ENTROPY_BATCH - 1);
        assert!(!batch.contains(&child));
        assert_ne!(parent, child);
    }

    #[test]
    fn a_buffer_in_use_falls_back_instead_of_panicking() {
        ENTROPY.with(|b| {
            let _held = b.borrow_mut();
            assert_eq!(os_entropy(), None);
            // The fallback still names a well-formed id.
            assert_eq!(TaskId::generate(TaskKind::Agent).to_string().len(), 9);
        });
    }

    #[test]
    fn draws_taken_on_many_threads_at_once_differ() {
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let start = std::sync::Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    (0..2_000)
                        .map(|_| os_entropy().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            for draw in t.join().unwrap() {
                // 64-bit draws: a repeat by chance is about 1 in 10^11 here.
                assert!(all.insert(draw), "{draw} drawn twice");
            }
        }
        assert_eq!(all.len(), 16_000);
    }

    #[test]
    fn entropy_is_encoded_deterministically() {
        assert_eq!(
            TaskId::from_entropy(TaskKind::Bash, 0).to_string(),
            "b00000000"
        );
        assert_eq!(
            TaskId::from_entropy(TaskKind::Dream, 35).to_string(),
            "d0000000z"
        );
        assert_eq!(
            TaskId::from_entropy(TaskKind::Agent, SUFFIX_SPACE - 1).to_string(),
            "azzzzzzzz"
        );
        assert_eq!(
            TaskId::from_entropy(TaskKind::Agent, SUFFIX_SPACE).to_string(),
            "a00000000"
        );
    }

    #[test]
    fn hostile_inputs_are_rejected_with_a_reason() {
        assert_eq!(reason(""), "it is empty");
        assert_eq!(
            reason("x12345678"),
            "unknown kind prefix 'x' (expected one of b, a, r, t, w, m, d)"
        );
        assert_eq!(
            reason("a1234567"),
            "expected 9 characters (a prefix and 8 of 0-9a-z), found 8"
        );
        assert_eq!(
            reason("a123456789"),
            "expected 9 characters (a prefix and 8 of 0-9a-z), found 10"
        );
        assert_eq!(
            reason("a12/45678"),
            "character '/' at position 3 is not one of 0-9a-z"
        );
        assert_eq!(
            reason("a..345678"),
            "character '.' at position 1 is not one of 0-9a-z"
        );
        assert_eq!(
            reason("a1234567\\"),
            "character '\\\\' at position 8 is not one of 0-9a-z"
        );
        assert_eq!(
            reason("aABCDEFGH"),
            "character 'A' at position 1 is not one of 0-9a-z"
        );
        assert_eq!(
            reason("a1234567\u{e9}"),
            "character 'é' at position 8 is not one of 0-9a-z"
        );
        assert_eq!(
            reason("../../etc"),
            "unknown kind prefix '.' (expected one of b, a, r, t, w, m, d)"
        );
        let err = "a12/45678".parse::<TaskId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid task id \"a12/45678\": character '/' at position 3 is not one of 0-9a-z"
        );
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(entropy in any::<u64>(), k in 0usize..7) {
            let id = TaskId::from_entropy(TaskKind::ALL[k], entropy);
            prop_assert_eq!(id.to_string().parse::<TaskId>().unwrap(), id);
        }

        #[test]
        fn anything_that_parses_is_a_safe_file_name(s in "\\PC{0,12}") {
            if let Ok(id) = s.parse::<TaskId>() {
                let shown = id.to_string();
                prop_assert_eq!(&shown, &s);
                prop_assert!(shown.bytes().all(|b| b.is_ascii_alphanumeric()));
            }
        }
    }
}
