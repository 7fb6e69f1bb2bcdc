//! The task registry: every background agent's state, usage and files.
//!
//! "Chapter 9: Sub-Agents and the Fork Pattern — 9.6 Sub-Agent Lifecycle Management": a task
//! is created, runs, and ends completed, failed or killed. An end is final: the registry
//! refuses a second one, and that refusal is what makes a notification exactly-once — only
//! the caller whose transition to a terminal state succeeded may deliver it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use forkhive_core::{TaskId, TaskStatus, Usage};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskState {
    /// Registered, not started.
    Created,
    /// Running.
    Running,
    /// Finished on its own.
    Completed,
    /// Ended by an error or a panic.
    Failed,
    /// Stopped from outside: cancelled, or past its deadline.
    Killed,
}

impl TaskState {
    /// Whether the task has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Killed
        )
    }

    /// The terminal state of a notification status.
    pub fn ended(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Completed => TaskState::Completed,
            TaskStatus::Failed => TaskState::Failed,
            TaskStatus::Killed => TaskState::Killed,
        }
    }

    /// The notification status of a terminal state.
    pub fn status(self) -> Option<TaskStatus> {
        match self {
            TaskState::Completed => Some(TaskStatus::Completed),
            TaskState::Failed => Some(TaskStatus::Failed),
            TaskState::Killed => Some(TaskStatus::Killed),
            TaskState::Created | TaskState::Running => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TaskState::Created => "created",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Killed => "killed",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One task as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// The task's id.
    pub id: TaskId,
    /// The agent that started it.
    pub parent: TaskId,
    /// The `description` it was started with.
    pub description: String,
    /// Its agent type (`fork` for a fork; empty when it was started without one).
    pub agent_type: String,
    /// Where it is.
    pub state: TaskState,
    /// Its own usage (added when each of its runs ends).
    pub usage: Usage,
    /// Its usage plus every descendant's that has ended.
    pub tree_usage: Usage,
    /// Its transcript, if one is written.
    pub transcript: Option<PathBuf>,
    /// Its output file, if one is written.
    pub output: Option<PathBuf>,
    /// Whether it was reported as stalled (no progress for a while).
    pub stalled: bool,
}

impl TaskRecord {
    /// A record in state `Created`.
    pub fn new(id: TaskId, parent: TaskId, description: impl Into<String>) -> Self {
        Self {
            id,
            parent,
            description: description.into(),
            agent_type: String::new(),
            state: TaskState::Created,
            usage: Usage::default(),
            tree_usage: Usage::default(),
            transcript: None,
            output: None,
            stalled: false,
        }
    }
}

/// Stores tasks. Object-safe and async, so a registry shared by several hosts (Redis, a
/// database) plugs in where the in-memory one is used today; every implementation must
/// refuse a transition out of a terminal state.
#[async_trait]
pub trait TaskRegistry: Send + Sync + fmt::Debug + 'static {
    /// Adds a task (state `Created`). Fails if the id is taken.
    async fn create(&self, record: TaskRecord) -> Result<()>;

    /// Moves a task to `to`, returning the state it left. Allowed: created → running,
    /// created or running → any terminal state. Everything else is [`Error::Task`].
    async fn transition(&self, id: &TaskId, to: TaskState) -> Result<TaskState>;

    /// Starts an ended task's next run (it was resumed, say to be given a message): terminal →
    /// running, counted again as live below its ancestors, returning the state it left. Any
    /// other state is [`Error::Task`]; so is a second reopen racing the first (only one
    /// caller may revive a task). Its next move to a terminal state reports once more.
    async fn reopen(&self, id: &TaskId) -> Result<TaskState>;

    /// Records a task's own usage when it ends and adds its tree usage to every ancestor's.
    async fn roll_up(&self, id: &TaskId, usage: Usage) -> Result<()>;

    /// Marks a task as stalled.
    async fn mark_stalled(&self, id: &TaskId) -> Result<()>;

    /// One task.
    async fn get(&self, id: &TaskId) -> Option<TaskRecord>;

    /// The tasks a parent started, in creation order.
    async fn children(&self, parent: &TaskId) -> Vec<TaskRecord>;

    /// The usage of everything below `id` that has ended, whether or not `id` itself is a
    /// registered task (the root agent is not).
    async fn descendants_usage(&self, id: &TaskId) -> Usage;
}

pub(crate) use crate::base::ids::IdMap;

/// How long a [`MemoryTaskRegistry`] keeps records of tasks that have ended.
///
/// A long-running host starts children without end; their records must not pile up. An ended
/// record is forgotten once more than `max_ended` ended records are held (oldest first) or it
/// ended more than `max_age` ago — checked whenever a task ends — but never while a task below
/// it is still running (its usage must still roll up through it). A forgotten task is gone from
/// [`get`](TaskRegistry::get) and [`children`](TaskRegistry::children); once every child of an
/// unregistered root is forgotten, so is the root's
/// [`descendants_usage`](TaskRegistry::descendants_usage).
///
/// The default keeps 10,000 ended records for at most an hour. Set it with
/// [`MemoryTaskRegistry::with_retention`]. A forgotten background child can still be resumed
/// with a message while its service keeps it resumable ([`TaskConfig::max_resumable`]): its
/// record is then made again.
///
/// [`TaskConfig::max_resumable`]: super::TaskConfig::max_resumable
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Most ended records kept.
    pub max_ended: usize,
    /// Longest an ended record is kept (`None`: no age limit).
    pub max_age: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_ended: 10_000,
            max_age: Some(Duration::from_secs(60 * 60)),
        }
    }
}

impl Retention {
    /// Keep every record (the registry grows with every task: for tests and short runs).
    pub fn forever() -> Self {
        Self {
            max_ended: usize::MAX,
            max_age: None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    record: TaskRecord,
    /// Creation order among its parent's children.
    seq: u64,
    /// Tasks below this one (at any depth) that have not ended.
    live_below: usize,
    /// Its ancestors when it was registered, nearest first (see [`Inner::ancestors`]):
    /// computed once, walked again when it ends and when its usage rolls up.
    ancestors: Box<[TaskId]>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Boxed: the table holds a pointer per slot, so its spare capacity (up to half of it
    /// after a resize) and a resize's copy cost pointers, not whole records.
    tasks: IdMap<Box<Entry>>,
    /// Each parent's children, in creation order.
    order: IdMap<BTreeMap<u64, TaskId>>,
    /// Usage of everything below a task (registered or not) that has ended.
    below: IdMap<Usage>,
    /// Ended tasks, oldest end first, with when they ended.
    ended: VecDeque<(TaskId, Instant)>,
    next_seq: u64,
}

impl Inner {
    /// The ancestors of a task whose parent is `parent`, nearest first: registered ones, then
    /// the first unregistered one (a root agent). Stops at `id` itself (a root launched as its
    /// own parent) and after one pass over the tasks (a malformed cycle).
    fn ancestors(&self, id: &TaskId, mut parent: TaskId) -> Box<[TaskId]> {
        let mut out = Vec::new();
        for _ in 0..=self.tasks.len() {
            if parent == *id {
                break;
            }
            out.push(parent);
            match self.tasks.get(&parent) {
                Some(p) => parent = p.record.parent,
                None => break,
            }
        }
        out.into_boxed_slice()
    }

    /// Forgets ended records past the retention policy (see [`Retention`]).
    fn evict(&mut self, retention: Retention, now: Instant) {
        let mut kept = Vec::new();
        while let Some(&(id, at)) = self.ended.front() {
            let over_count = self.ended.len() + kept.len() > retention.max_ended;
            let too_old = retention
                .max_age
                .is_some_and(|age| now.saturating_duration_since(at) >= age);
            if !over_count && !too_old {
                break;
            }
            self.ended.pop_front();
            match self.tasks.get(&id) {
                None => {}
                Some(e) if e.live_below > 0 => kept.push((id, at)),
                Some(_) => self.forget(&id),
            }
        }
        for k in kept.into_iter().rev() {
            self.ended.push_front(k);
        }
    }

    fn forget(&mut self, id: &TaskId) {
        let Some(entry) = self.tasks.remove(id) else {
            return;
        };
        self.below.remove(id);
        let parent = entry.record.parent;
        if let Some(siblings) = self.order.get_mut(&parent) {
            siblings.remove(&entry.seq);
            if siblings.is_empty() {
                self.order.remove(&parent);
                // An unregistered root is remembered only through its children.
                if !self.tasks.contains_key(&parent) {
                    self.below.remove(&parent);
                }
            }
        }
    }
}

/// The in-memory [`TaskRegistry`]: one short lock per call, never held across an `.await`;
/// ended records are forgotten by a [`Retention`] policy, so its size stays flat however many
/// tasks a long-running host starts.
///
/// A task's ancestors are looked up once, when it is created: register a task before the
/// tasks below it (as the task service does), or usage that rolls up from them stops at it.
#[derive(Debug, Default)]
pub struct MemoryTaskRegistry {
    inner: Mutex<Inner>,
    retention: Retention,
}

impl MemoryTaskRegistry {
    /// An empty registry with the default [`Retention`] (10,000 ended records, one hour).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry that keeps ended records as `retention` says.
    pub fn with_retention(retention: Retention) -> Self {
        Self {
            inner: Mutex::default(),
            retention,
        }
    }

    /// How many records it holds now (running and ended).
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry of every internal table: what its memory grows with (for tests of the
    /// retention policy).
    pub fn footprint(&self) -> usize {
        let inner = self.lock();
        inner.tasks.len()
            + inner.order.values().map(BTreeMap::len).sum::<usize>()
            + inner.order.len()
            + inner.below.len()
            + inner.ended.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn unknown(id: &TaskId) -> Error {
    Error::Task {
        id: *id,
        message: "no such task".to_owned(),
    }
}

#[async_trait]
impl TaskRegistry for MemoryTaskRegistry {
    async fn create(&self, record: TaskRecord) -> Result<()> {
        let mut inner = self.lock();
        if inner.tasks.contains_key(&record.id) {
            return Err(Error::Task {
                id: record.id,
                message: "a task with this id already exists".to_owned(),
            });
        }
        let (id, parent, live) = (record.id, record.parent, !record.state.is_terminal());
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.order.entry(parent).or_default().insert(seq, id);
        let ancestors = inner.ancestors(&id, parent);
        if live {
            for a in &ancestors {
                if let Some(e) = inner.tasks.get_mut(a) {
                    e.live_below += 1;
                }
            }
        }
        inner.tasks.insert(
            id,
            Box::new(Entry {
                record,
                seq,
                live_below: 0,
                ancestors,
            }),
        );
        Ok(())
    }

    async fn transition(&self, id: &TaskId, to: TaskState) -> Result<TaskState> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let entry = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        let task = &mut entry.record;
        let from = task.state;
        let allowed = match (from, to) {
            (TaskState::Created, TaskState::Running) => true,
            (TaskState::Created | TaskState::Running, t) => t.is_terminal(),
            _ => false,
        };
        if !allowed {
            return Err(Error::Task {
                id: *id,
                message: format!("cannot move from {from} to {to}"),
            });
        }
        task.state = to;
        if to.is_terminal() {
            let ancestors = std::mem::take(&mut entry.ancestors);
            for a in &ancestors {
                if let Some(e) = inner.tasks.get_mut(a) {
                    e.live_below = e.live_below.saturating_sub(1);
                }
            }
            if let Some(e) = inner.tasks.get_mut(id) {
                e.ancestors = ancestors;
            }
            let now = Instant::now();
            inner.ended.push_back((*id, now));
            inner.evict(self.retention, now);
        }
        Ok(from)
    }

    async fn reopen(&self, id: &TaskId) -> Result<TaskState> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let entry = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        let from = entry.record.state;
        if !from.is_terminal() {
            return Err(Error::Task {
                id: *id,
                message: format!("cannot reopen a task that is {from}: only an ended task can"),
            });
        }
        entry.record.state = TaskState::Running;
        entry.record.stalled = false;
        let ancestors = std::mem::take(&mut entry.ancestors);
        for a in &ancestors {
            if let Some(e) = inner.tasks.get_mut(a) {
                e.live_below += 1;
            }
        }
        if let Some(e) = inner.tasks.get_mut(id) {
            e.ancestors = ancestors;
        }
        // No longer ended: retention must not forget it while it runs.
        inner.ended.retain(|(e, _)| e != id);
        Ok(from)
    }

    async fn roll_up(&self, id: &TaskId, usage: Usage) -> Result<()> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let entry = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        // Descendants that ended earlier were added when they ended: add only this task's own.
        // A task resumed for another run adds each run's usage.
        entry.record.usage += usage;
        entry.record.tree_usage += usage;
        // Every ancestor (registered or not) learns of it.
        let ancestors = std::mem::take(&mut entry.ancestors);
        for a in &ancestors {
            *inner.below.entry(*a).or_default() += usage;
            if let Some(e) = inner.tasks.get_mut(a) {
                e.record.tree_usage += usage;
            }
        }
        if let Some(e) = inner.tasks.get_mut(id) {
            e.ancestors = ancestors;
        }
        Ok(())
    }

    async fn mark_stalled(&self, id: &TaskId) -> Result<()> {
        let mut inner = self.lock();
        let task = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        task.record.stalled = true;
        Ok(())
    }

    async fn get(&self, id: &TaskId) -> Option<TaskRecord> {
        self.lock().tasks.get(id).map(|e| e.record.clone())
    }

    async fn children(&self, parent: &TaskId) -> Vec<TaskRecord> {
        let inner = self.lock();
        inner
            .order
            .get(parent)
            .map(|ids| {
                ids.values()
                    .filter_map(|i| inner.tasks.get(i).map(|e| e.record.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn descendants_usage(&self, id: &TaskId) -> Usage {
        self.lock().below.get(id).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;
    use std::sync::Arc;

    fn id(n: u64) -> TaskId {
        TaskId::from_entropy(TaskKind::Agent, n)
    }

    fn tokens(n: u64) -> Usage {
        Usage {
            output_tokens: n,
            ..Usage::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_memory_registry_conforms() {
        let store = Arc::new(MemoryTaskRegistry::new());
        crate::task::conformance::run(|| Arc::clone(&store) as Arc<dyn TaskRegistry>)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_task_that_is_its_own_parent_or_in_a_cycle_rolls_up_once() {
        let r = MemoryTaskRegistry::new();
        // A root agent launched as a task: its own parent.
        r.create(TaskRecord::new(id(1), id(1), "root"))
            .await
            .unwrap();
        r.roll_up(&id(1), tokens(5)).await.unwrap();
        assert_eq!(r.get(&id(1)).await.unwrap().tree_usage.output_tokens, 5);
        assert_eq!(r.descendants_usage(&id(1)).await.output_tokens, 0);
        // A malformed cycle 2 -> 3 -> 2 below a task 4 -> 2: the walk ends.
        r.create(TaskRecord::new(id(2), id(3), "a")).await.unwrap();
        r.create(TaskRecord::new(id(3), id(2), "b")).await.unwrap();
        r.create(TaskRecord::new(id(4), id(2), "c")).await.unwrap();
        r.roll_up(&id(4), tokens(1)).await.unwrap();
        assert!(r.descendants_usage(&id(2)).await.output_tokens >= 1);
    }

    #[tokio::test]
    async fn an_end_is_final() {
        let r = MemoryTaskRegistry::new();
        r.create(TaskRecord::new(id(1), id(0), "x")).await.unwrap();
        assert_eq!(
            r.transition(&id(1), TaskState::Running).await.unwrap(),
            TaskState::Created
        );
        r.transition(&id(1), TaskState::Completed).await.unwrap();
        let e = r.transition(&id(1), TaskState::Killed).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("task {}: cannot move from completed to killed", id(1))
        );
        let e = r.transition(&id(9), TaskState::Running).await.unwrap_err();
        assert_eq!(e.to_string(), format!("task {}: no such task", id(9)));
        let e = r
            .create(TaskRecord::new(id(1), id(0), "y"))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("task {}: a task with this id already exists", id(1))
        );
    }

    #[tokio::test]
    async fn usage_rolls_up_the_whole_tree() {
        let r = MemoryTaskRegistry::new();
        // root(0, unregistered) -> 1 -> 2 -> 3
        r.create(TaskRecord::new(id(1), id(0), "a")).await.unwrap();
        r.create(TaskRecord::new(id(2), id(1), "b")).await.unwrap();
        r.create(TaskRecord::new(id(3), id(2), "c")).await.unwrap();
        r.roll_up(&id(3), tokens(1)).await.unwrap();
        r.roll_up(&id(2), tokens(10)).await.unwrap();
        r.roll_up(&id(1), tokens(100)).await.unwrap();
        assert_eq!(r.get(&id(2)).await.unwrap().tree_usage, tokens(11));
        assert_eq!(r.get(&id(1)).await.unwrap().tree_usage, tokens(111));
        assert_eq!(r.descendants_usage(&id(0)).await, tokens(111));
        assert_eq!(r.children(&id(1)).await.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_contention_exactly_one_end_wins() {
        let r = Arc::new(MemoryTaskRegistry::new());
        for n in 0..200 {
            r.create(TaskRecord::new(id(n + 1), id(0), "t"))
                .await
                .unwrap();
        }
        let mut tasks = Vec::new();
        for racer in 0..4 {
            let r = Arc::clone(&r);
            tasks.push(tokio::spawn(async move {
                let to = [TaskState::Completed, TaskState::Failed, TaskState::Killed][racer % 3];
                let mut won = 0;
                for n in 0..200 {
                    if r.transition(&id(n + 1), to).await.is_ok() {
                        won += 1;
                    }
                }
                won
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, 200, "every task ended exactly once");
    }

    async fn ended(r: &MemoryTaskRegistry, n: u64, parent: u64) {
        r.create(TaskRecord::new(id(n), id(parent), "t"))
            .await
            .unwrap();
        r.transition(&id(n), TaskState::Running).await.unwrap();
        r.roll_up(&id(n), tokens(1)).await.unwrap();
        r.transition(&id(n), TaskState::Completed).await.unwrap();
    }

    #[tokio::test]
    async fn ended_records_are_forgotten_oldest_first_past_the_count() {
        let r = MemoryTaskRegistry::with_retention(Retention {
            max_ended: 3,
            max_age: None,
        });
        for n in 1..=5 {
            ended(&r, n, 0).await;
        }
        assert_eq!(r.len(), 3);
        assert!(r.get(&id(1)).await.is_none());
        assert!(r.get(&id(2)).await.is_none());
        let kept: Vec<_> = r.children(&id(0)).await.iter().map(|t| t.id).collect();
        assert_eq!(kept, vec![id(3), id(4), id(5)], "creation order kept");
        // The root's total still counts every child, forgotten or not.
        assert_eq!(r.descendants_usage(&id(0)).await, tokens(5));
    }

    #[tokio::test(start_paused = true)]
    async fn ended_records_are_forgotten_past_their_age() {
        let r = MemoryTaskRegistry::with_retention(Retention {
            max_ended: 100,
            max_age: Some(Duration::from_secs(10)),
        });
        ended(&r, 1, 0).await;
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(r.len(), 1, "forgotten lazily, when a task ends");
        ended(&r, 2, 0).await;
        assert!(r.get(&id(1)).await.is_none());
        assert!(r.get(&id(2)).await.is_some());
    }

    #[tokio::test]
    async fn a_record_with_a_running_task_below_it_is_kept_until_that_ends() {
        let r = MemoryTaskRegistry::with_retention(Retention {
            max_ended: 0,
            max_age: None,
        });
        // 0 (root) -> 1 -> 2 -> 3; 1 ends first, while 3 still runs.
        r.create(TaskRecord::new(id(1), id(0), "a")).await.unwrap();
        r.create(TaskRecord::new(id(2), id(1), "b")).await.unwrap();
        r.create(TaskRecord::new(id(3), id(2), "c")).await.unwrap();
        r.roll_up(&id(1), tokens(100)).await.unwrap();
        r.transition(&id(1), TaskState::Completed).await.unwrap();
        r.roll_up(&id(2), tokens(10)).await.unwrap();
        r.transition(&id(2), TaskState::Killed).await.unwrap();
        assert!(r.get(&id(1)).await.is_some(), "3 still runs below it");
        assert!(r.get(&id(2)).await.is_some());
        r.roll_up(&id(3), tokens(1)).await.unwrap();
        assert_eq!(r.get(&id(1)).await.unwrap().tree_usage, tokens(111));
        r.transition(&id(3), TaskState::Completed).await.unwrap();
        assert_eq!(r.len(), 0);
        // Everything below the root is forgotten, so is the root's total.
        assert_eq!(r.footprint(), 0);
    }

    /// A long-running host: a million children, one after another, under one root. The
    /// registry's tables stay at the retention bound.
    #[tokio::test]
    async fn a_million_sequential_children_keep_the_registry_flat() {
        let r = MemoryTaskRegistry::with_retention(Retention {
            max_ended: 1_000,
            max_age: None,
        });
        let mut peak = 0;
        for n in 1..=1_000_000 {
            ended(&r, n, 0).await;
            if n % 10_000 == 0 {
                peak = peak.max(r.footprint());
            }
        }
        assert_eq!(r.len(), 1_000);
        // tasks + order entries + one parent + the root's total + the ended queue.
        assert!(peak <= 1_000 * 3 + 2, "footprint {peak}");
        assert_eq!(r.descendants_usage(&id(0)).await, tokens(1_000_000));
    }

    /// Ids made from sequential entropy spread over the table's buckets (the low bits), so a
    /// registry of replayed or test ids does not degrade into long probe chains.
    #[test]
    fn sequential_ids_spread_over_the_low_bits() {
        use std::hash::BuildHasher;
        let build = std::hash::BuildHasherDefault::<crate::base::ids::IdHasher>::default();
        let buckets: std::collections::HashSet<u64> =
            (0..10_000).map(|n| build.hash_one(id(n)) & 0xfff).collect();
        // 10,000 keys into 4,096 buckets: a uniform hash fills 4096 × (1 − e^(−10000/4096))
        // ≈ 3,740 of them (without the finaliser these ids filled a handful).
        assert!(
            buckets.len() > 3_600,
            "{} of 4096 buckets used",
            buckets.len()
        );
    }

    #[tokio::test]
    async fn reopen_starts_an_ended_task_again_once_and_counts_it_live() {
        let r = MemoryTaskRegistry::new();
        r.create(TaskRecord::new(id(1), id(0), "parent"))
            .await
            .unwrap();
        r.create(TaskRecord::new(id(2), id(1), "worker"))
            .await
            .unwrap();
        r.transition(&id(2), TaskState::Running).await.unwrap();
        let not_ended = r.reopen(&id(2)).await.unwrap_err().to_string();
        assert!(
            not_ended.contains("cannot reopen a task that is running: only an ended task can"),
            "{not_ended}"
        );
        r.roll_up(&id(2), tokens(3)).await.unwrap();
        r.transition(&id(2), TaskState::Killed).await.unwrap();
        assert_eq!(r.reopen(&id(2)).await.unwrap(), TaskState::Killed);
        // Running again: it reports once more, and its runs' usage adds up.
        r.roll_up(&id(2), tokens(4)).await.unwrap();
        assert_eq!(
            r.transition(&id(2), TaskState::Completed).await.unwrap(),
            TaskState::Running
        );
        let rec = r.get(&id(2)).await.unwrap();
        assert_eq!(rec.usage.output_tokens, 7);
        assert_eq!(r.get(&id(1)).await.unwrap().tree_usage.output_tokens, 7);
        let unknown = r.reopen(&id(9)).await.unwrap_err().to_string();
        assert!(unknown.contains("no such task"), "{unknown}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn of_many_reopens_at_once_exactly_one_wins() {
        let r = Arc::new(MemoryTaskRegistry::new());
        r.create(TaskRecord::new(id(2), id(1), "worker"))
            .await
            .unwrap();
        r.transition(&id(2), TaskState::Completed).await.unwrap();
        let tries: Vec<_> = (0..16)
            .map(|_| {
                let r = Arc::clone(&r);
                tokio::spawn(async move { r.reopen(&id(2)).await.is_ok() })
            })
            .collect();
        let mut won = 0;
        for t in tries {
            won += usize::from(t.await.unwrap());
        }
        assert_eq!(won, 1);
        assert_eq!(r.get(&id(2)).await.unwrap().state, TaskState::Running);
    }

    #[tokio::test]
    async fn a_reopened_task_is_not_forgotten_by_retention_while_it_runs() {
        let r = MemoryTaskRegistry::with_retention(Retention {
            max_ended: 1,
            max_age: None,
        });
        r.create(TaskRecord::new(id(2), id(1), "a")).await.unwrap();
        r.transition(&id(2), TaskState::Completed).await.unwrap();
        r.reopen(&id(2)).await.unwrap();
        for n in 3..6 {
            r.create(TaskRecord::new(id(n), id(1), "b")).await.unwrap();
            r.transition(&id(n), TaskState::Completed).await.unwrap();
        }
        assert_eq!(r.get(&id(2)).await.unwrap().state, TaskState::Running);
    }
}
