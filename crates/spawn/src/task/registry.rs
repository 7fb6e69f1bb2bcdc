//! The task registry: every background agent's state, usage and files.
//!
//! "Chapter 9: Sub-Agents and the Fork Pattern — 9.6 Sub-Agent Lifecycle Management": a task
//! is created, runs, and ends completed, failed or killed. An end is final: the registry
//! refuses a second one, and that refusal is what makes a notification exactly-once — only
//! the caller whose transition to a terminal state succeeded may deliver it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;

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
    /// Where it is.
    pub state: TaskState,
    /// Its own usage (set when it ends).
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

#[derive(Debug, Default)]
struct Inner {
    tasks: HashMap<TaskId, TaskRecord>,
    order: HashMap<TaskId, Vec<TaskId>>,
    below: HashMap<TaskId, Usage>,
}

/// The in-memory [`TaskRegistry`]: one short lock per call, never held across an `.await`.
#[derive(Debug, Default)]
pub struct MemoryTaskRegistry {
    inner: Mutex<Inner>,
}

impl MemoryTaskRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn unknown(id: &TaskId) -> Error {
    Error::Task {
        id: id.to_string(),
        message: "no such task".to_owned(),
    }
}

#[async_trait]
impl TaskRegistry for MemoryTaskRegistry {
    async fn create(&self, record: TaskRecord) -> Result<()> {
        let mut inner = self.lock();
        if inner.tasks.contains_key(&record.id) {
            return Err(Error::Task {
                id: record.id.to_string(),
                message: "a task with this id already exists".to_owned(),
            });
        }
        inner
            .order
            .entry(record.parent)
            .or_default()
            .push(record.id);
        inner.tasks.insert(record.id, record);
        Ok(())
    }

    async fn transition(&self, id: &TaskId, to: TaskState) -> Result<TaskState> {
        let mut inner = self.lock();
        let task = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        let from = task.state;
        let allowed = match (from, to) {
            (TaskState::Created, TaskState::Running) => true,
            (TaskState::Created | TaskState::Running, t) => t.is_terminal(),
            _ => false,
        };
        if !allowed {
            return Err(Error::Task {
                id: id.to_string(),
                message: format!("cannot move from {from} to {to}"),
            });
        }
        task.state = to;
        Ok(from)
    }

    async fn roll_up(&self, id: &TaskId, usage: Usage) -> Result<()> {
        let mut inner = self.lock();
        let task = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        // Descendants that ended earlier were added when they ended: add only this task's own.
        task.usage = usage;
        task.tree_usage += usage;
        let mut parent = task.parent;
        // Walk up: every ancestor (registered or not) learns of it. A task is not below itself
        // (a root agent launched as a task is its own parent), and a malformed parent cycle
        // stops after one pass over the tasks instead of looping.
        let limit = inner.tasks.len();
        for _ in 0..=limit {
            if parent == *id {
                break;
            }
            *inner.below.entry(parent).or_default() += usage;
            match inner.tasks.get_mut(&parent) {
                Some(p) => {
                    p.tree_usage += usage;
                    parent = p.parent;
                }
                None => break,
            }
        }
        Ok(())
    }

    async fn mark_stalled(&self, id: &TaskId) -> Result<()> {
        let mut inner = self.lock();
        let task = inner.tasks.get_mut(id).ok_or_else(|| unknown(id))?;
        task.stalled = true;
        Ok(())
    }

    async fn get(&self, id: &TaskId) -> Option<TaskRecord> {
        self.lock().tasks.get(id).cloned()
    }

    async fn children(&self, parent: &TaskId) -> Vec<TaskRecord> {
        let inner = self.lock();
        inner
            .order
            .get(parent)
            .map(|ids| {
                ids.iter()
                    .filter_map(|i| inner.tasks.get(i).cloned())
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
}
