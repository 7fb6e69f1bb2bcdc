//! Per-agent state (cloned for a child, never shared) and the tree's shared state.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — createSubagentContext":
//! a child's file-read state is a *clone* of its parent's, so the child can read without
//! changing what the parent believes it has read; the only state every agent reaches is the
//! root's task state, because the root must learn when any descendant ends.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use forkhive_core::Digest;

/// What an agent knew of a file when it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// The file's length in bytes.
    pub len: u64,
    /// SHA-256 of the bytes read.
    pub digest: Digest,
}

impl FileStamp {
    /// The stamp of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            len: bytes.len() as u64,
            digest: Digest::of(bytes),
        }
    }
}

/// One agent's own state. [`fork_for_child`](Self::fork_for_child) gives a child an
/// independent copy; `Clone` gives another handle to the *same* state (for the agent's own
/// tools).
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    file_reads: Arc<Mutex<HashMap<PathBuf, FileStamp>>>,
}

impl AgentState {
    /// Records that `path` was read with `stamp`.
    pub fn record_read(&self, path: PathBuf, stamp: FileStamp) {
        self.file_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path, stamp);
    }

    /// What this agent last read of `path`.
    pub fn last_read(&self, path: &std::path::Path) -> Option<FileStamp> {
        self.file_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .copied()
    }

    /// How many files this agent has read.
    pub fn files_read(&self) -> usize {
        self.file_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// An independent copy for a child agent: what the parent read so far, and nothing the
    /// child reads later flows back.
    pub fn fork_for_child(&self) -> Self {
        let copy = self
            .file_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Self {
            file_reads: Arc::new(Mutex::new(copy)),
        }
    }
}

/// A map from a type to one shared value of that type: where later layers (task registry,
/// notification queue, mailboxes, a turn's fork prefix) hang their state without the runtime
/// knowing them.
#[derive(Default)]
pub struct Extensions {
    map: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Extensions {
    /// Stores `value` as the `T`, returning the previous one.
    pub fn insert<T: Any + Send + Sync>(&self, value: Arc<T>) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(TypeId::of::<T>(), value)
            .and_then(|old| old.downcast::<T>().ok())
    }

    /// The `T`, if one was stored.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&TypeId::of::<T>())
            .cloned()
            .and_then(|v| v.downcast::<T>().ok())
    }

    /// The `T`, storing `make()` first if there is none (atomically: `make` runs at most once
    /// per map and type).
    pub fn get_or_insert_with<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Arc<T> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map
            .get(&TypeId::of::<T>())
            .and_then(|v| Arc::clone(v).downcast::<T>().ok())
        {
            return v;
        }
        let v = Arc::new(make());
        map.insert(
            TypeId::of::<T>(),
            Arc::clone(&v) as Arc<dyn Any + Send + Sync>,
        );
        v
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.map.lock().map(|m| m.len()).unwrap_or_default();
        f.debug_struct("Extensions").field("entries", &n).finish()
    }
}

/// One model turn that called tools, as its tools see it: exactly what the request sent, and
/// the assistant message that answered it. A fork child of this turn starts from these bytes.
#[derive(Debug)]
pub struct TurnSnapshot {
    sent: forkhive_core::CacheSafeParams,
    assistant: Arc<forkhive_core::Message>,
    turn: u32,
    scratch: Extensions,
}

impl TurnSnapshot {
    /// A snapshot of turn `turn`. The assistant message may be shared (`Arc<Message>`), as
    /// the loop shares it with the conversation.
    pub fn new(
        sent: forkhive_core::CacheSafeParams,
        assistant: impl Into<Arc<forkhive_core::Message>>,
        turn: u32,
    ) -> Self {
        Self {
            sent,
            assistant: assistant.into(),
            turn,
            scratch: Extensions::default(),
        }
    }

    /// Everything the turn's request sent (prefix and suffix), as cache-safe parameters.
    pub fn sent(&self) -> &forkhive_core::CacheSafeParams {
        &self.sent
    }

    /// The assistant message that answered.
    pub fn assistant(&self) -> &forkhive_core::Message {
        &self.assistant
    }

    /// The turn number.
    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// State the turn's tool calls share (one fork prefix for all the forks of a turn).
    pub fn scratch(&self) -> &Extensions {
        &self.scratch
    }
}

/// State shared by every agent of one tree: counters and typed extensions through which the
/// task registry, notification queue and mailboxes are reached.
#[derive(Default)]
pub struct TreeState {
    live_agents: AtomicUsize,
    extensions: Extensions,
    /// The tree's session id (its root agent's id): what hooks are told.
    session: std::sync::OnceLock<String>,
}

impl TreeState {
    /// The tree's session id: the id of the first agent that asked, which is its root (it runs
    /// before anything it starts).
    pub(crate) fn session(&self, asking: &forkhive_core::TaskId) -> &str {
        self.session.get_or_init(|| asking.to_string())
    }

    /// A new, empty tree state.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// How many agents of the tree are running a loop right now.
    pub fn live_agents(&self) -> usize {
        self.live_agents.load(Ordering::Acquire)
    }

    /// Counts an agent as live until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>) -> LiveGuard {
        self.live_agents.fetch_add(1, Ordering::AcqRel);
        LiveGuard(Arc::clone(self))
    }

    /// The tree's typed extensions (task registry, notification queues, mailboxes).
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }
}

impl fmt::Debug for TreeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TreeState")
            .field("live_agents", &self.live_agents())
            .finish_non_exhaustive()
    }
}

/// Decrements the live-agent count on drop.
#[derive(Debug)]
pub(crate) struct LiveGuard(Arc<TreeState>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live_agents.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_gets_a_copy_not_a_share() {
        let parent = AgentState::default();
        parent.record_read("/a".into(), FileStamp::of(b"a"));
        let child = parent.fork_for_child();
        child.record_read("/b".into(), FileStamp::of(b"b"));
        assert_eq!(parent.files_read(), 1);
        assert_eq!(child.files_read(), 2);
        assert_eq!(child.last_read("/a".as_ref()), Some(FileStamp::of(b"a")));
        // A clone is the same state (the agent's own tools).
        let same = parent.clone();
        same.record_read("/c".into(), FileStamp::of(b"c"));
        assert_eq!(parent.files_read(), 2);
    }

    #[test]
    fn extensions_are_typed_and_counters_balance_under_contention() {
        let tree = TreeState::new();
        let ext = tree.extensions();
        assert!(ext.get::<String>().is_none());
        ext.insert(Arc::new("x".to_owned()));
        assert_eq!(
            ext.get::<String>().as_deref().map(String::as_str),
            Some("x")
        );
        let n = ext.get_or_insert_with(|| 7u32);
        assert_eq!(*n, 7);
        assert_eq!(*ext.get_or_insert_with(|| 9u32), 7);

        let handles: Vec<_> = (0..8)
            .map(|_| {
                let t = Arc::clone(&tree);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let _g = t.enter();
                        let _ = t.extensions().get_or_insert_with(|| 1u64);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(tree.live_agents(), 0);
        assert_eq!(*tree.extensions().get::<u64>().unwrap(), 1);
    }
}
