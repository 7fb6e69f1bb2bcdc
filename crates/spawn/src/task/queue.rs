//! A parent's notification queue, as a store several hosts can share: where a worker's
//! `<task-notification>` waits until its parent has taken it into its conversation.
//!
//! The promise, for any backend: a notification pushed under an id reaches its parent's
//! conversation once. Pushed again under the same id — a worker that reports twice, a report
//! retried after its answer was lost — it is stored once, and refused once delivered (within
//! the queue's memory of delivered ids: [`DELIVERED_KEPT`], [`DELIVERED_TTL`]). Until the
//! parent marks it [`delivered`](NotificationQueue::delivered) — after it is in the
//! conversation — it is returned by [`pending`](NotificationQueue::pending) every time, so a
//! parent that restarted between reading and recording gets it again (at least once on the
//! wire), and skips what its conversation already holds (exactly once into it).
//!
//! Every backend passes [`conformance::run`]: [`MemoryNotificationQueue`] in-process, and
//! `RedisNotificationQueue` (feature `redis`) across hosts.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, TaskNotification};
use tokio::sync::Notify;

use crate::error::Result;

/// How many delivered ids a queue remembers per parent (to refuse a late duplicate).
pub const DELIVERED_KEPT: usize = 10_000;

/// How long a networked queue remembers a delivered id.
pub const DELIVERED_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A notification as the queue holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The id it was pushed under: mark it delivered with this.
    pub id: String,
    /// The notification.
    pub notification: TaskNotification,
}

/// Keeps each parent's notifications until the parent has taken them. Object-safe and async,
/// so a store shared by hosts plugs in; every implementation passes [`conformance::run`].
#[async_trait]
pub trait NotificationQueue: Send + Sync + fmt::Debug + 'static {
    /// Queues `notification` for `parent` under `id` (unique per report: the task's id and
    /// its run, say). Returns whether it was stored: `false` when `id` is already pending or
    /// was delivered.
    async fn push(
        &self,
        parent: &TaskId,
        id: &str,
        notification: &TaskNotification,
    ) -> Result<bool>;

    /// Every notification for `parent` not delivered yet, oldest first — again and again until
    /// marked delivered.
    async fn pending(&self, parent: &TaskId) -> Result<Vec<Queued>>;

    /// Marks ids delivered (they are in the parent's conversation): never returned again, and
    /// refused if pushed again. Unknown ids are ignored.
    async fn delivered(&self, parent: &TaskId, ids: &[String]) -> Result<()>;

    /// Waits until `parent` has a pending notification whose id is not in `known`, or
    /// `timeout` passes; returns whether it has.
    async fn wait_beyond(
        &self,
        parent: &TaskId,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool>;
}

#[derive(Debug, Default)]
struct Parent {
    pending: VecDeque<Queued>,
    /// Delivered ids, oldest first (at most [`DELIVERED_KEPT`]).
    done: VecDeque<String>,
}

/// The in-process queue. Clones share the same store. One short lock per call, never held
/// across an `.await`.
#[derive(Debug, Clone, Default)]
pub struct MemoryNotificationQueue {
    parents: Arc<Mutex<HashMap<TaskId, Parent>>>,
    arrivals: Arc<Mutex<HashMap<TaskId, Arc<Notify>>>>,
}

impl MemoryNotificationQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Parent>> {
        self.parents.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arrivals(&self, parent: &TaskId) -> Arc<Notify> {
        Arc::clone(
            self.arrivals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(*parent)
                .or_default(),
        )
    }
}

#[async_trait]
impl NotificationQueue for MemoryNotificationQueue {
    async fn push(
        &self,
        parent: &TaskId,
        id: &str,
        notification: &TaskNotification,
    ) -> Result<bool> {
        {
            let mut all = self.lock();
            let p = all.entry(*parent).or_default();
            if p.pending.iter().any(|q| q.id == id) || p.done.iter().any(|d| d == id) {
                return Ok(false);
            }
            p.pending.push_back(Queued {
                id: id.to_owned(),
                notification: notification.clone(),
            });
        }
        self.arrivals(parent).notify_waiters();
        Ok(true)
    }

    async fn pending(&self, parent: &TaskId) -> Result<Vec<Queued>> {
        Ok(self
            .lock()
            .get(parent)
            .map(|p| p.pending.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn delivered(&self, parent: &TaskId, ids: &[String]) -> Result<()> {
        let mut all = self.lock();
        let Some(p) = all.get_mut(parent) else {
            return Ok(());
        };
        for id in ids {
            if let Some(at) = p.pending.iter().position(|q| &q.id == id) {
                p.pending.remove(at);
                p.done.push_back(id.clone());
                if p.done.len() > DELIVERED_KEPT {
                    p.done.pop_front();
                }
            }
        }
        Ok(())
    }

    async fn wait_beyond(
        &self,
        parent: &TaskId,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool> {
        let arrivals = self.arrivals(parent);
        let deadline = tokio::time::Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| {
                tokio::time::Instant::now() + Duration::from_secs(30 * 365 * 86_400)
            });
        loop {
            // Registered before looking, so a push between the look and the wait wakes it.
            let woken = arrivals.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let beyond = self
                .pending(parent)
                .await?
                .iter()
                .any(|q| !known.contains(&q.id));
            if beyond {
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return Ok(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_memory_queue_conforms() {
        let store = MemoryNotificationQueue::new();
        if let Err(e) =
            conformance::run(|| Arc::new(store.clone()) as Arc<dyn NotificationQueue>).await
        {
            panic!("{e}");
        }
    }
}

pub mod conformance {
    //! The one suite every [`NotificationQueue`] passes, unchanged: order, a report stored
    //! once however often it is pushed, again and again until delivered, refused once
    //! delivered, parents apart, nothing lost under concurrent pushers, a waiting parent
    //! woken by a push from another handle.
    //!
    //! ```
    //! use std::sync::Arc;
    //! use forkhive_spawn::task::queue::{MemoryNotificationQueue, NotificationQueue, conformance};
    //! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
    //! let store = MemoryNotificationQueue::new();
    //! conformance::run(|| Arc::new(store.clone()) as Arc<dyn NotificationQueue>).await?;
    //! # Ok::<(), conformance::ConformanceError>(()) }).unwrap();
    //! ```

    use std::sync::Arc;
    use std::time::Duration;

    use forkhive_core::{NotificationUsage, TaskId, TaskKind, TaskNotification, TaskStatus};

    use super::NotificationQueue;

    pub use crate::base::conformance::ConformanceError;
    use crate::base::conformance::Suite;

    /// This suite, named in its errors.
    const S: Suite = Suite("notification queue");

    fn note(task: TaskId, summary: &str) -> TaskNotification {
        let n = TaskNotification::new(
            task,
            TaskStatus::Completed,
            summary,
            NotificationUsage::default(),
        );
        n.with_result(format!("the result of {summary}: <b>&amp;</b> ünïcode"))
    }

    /// Runs every check (each on parents of its own). `open` makes a new handle on the same
    /// store each time — another host's.
    pub async fn run<F>(open: F) -> Result<(), ConformanceError>
    where
        F: Fn() -> Arc<dyn NotificationQueue>,
    {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            seed = 7u64.to_le_bytes();
        }
        let mut n = u64::from_le_bytes(seed) & 0x00ff_ffff_ffff_0000;
        let mut id = || {
            n += 1;
            TaskId::from_entropy(TaskKind::Agent, n)
        };
        // Order, content, and redelivery until delivered.
        let (parent, a, b) = (id(), id(), id());
        let q = open();
        S.op(q.push(&parent, "a#1", &note(a, "first")).await, "push")?;
        S.op(q.push(&parent, "b#1", &note(b, "second")).await, "push")?;
        for _ in 0..2 {
            let got = S.op(open().pending(&parent).await, "pending")?;
            let ids: Vec<&str> = got.iter().map(|g| g.id.as_str()).collect();
            S.check(ids == ["a#1", "b#1"], || {
                format!("pending ids {ids:?}, want a#1, b#1")
            })?;
            S.check(got[0].notification == note(a, "first"), || {
                format!(
                    "stored {:?}, got back {:?}",
                    note(a, "first"),
                    got[0].notification
                )
            })?;
        }
        // Stored once however often pushed; refused once delivered.
        let again = S.op(open().push(&parent, "a#1", &note(a, "first")).await, "push")?;
        S.check(!again, || "a second push of a pending id was stored".into())?;
        S.op(
            q.delivered(&parent, &["a#1".to_owned(), "nope".to_owned()])
                .await,
            "delivered",
        )?;
        let ids: Vec<String> = S
            .op(q.pending(&parent).await, "pending")?
            .into_iter()
            .map(|g| g.id)
            .collect();
        S.check(ids == ["b#1"], || {
            format!("after delivering a#1, pending {ids:?}")
        })?;
        let late = S.op(open().push(&parent, "a#1", &note(a, "first")).await, "push")?;
        S.check(!late, || "a push of a delivered id was stored".into())?;
        // A task resumed for another run reports again, under another id.
        let next = S.op(open().push(&parent, "a#2", &note(a, "again")).await, "push")?;
        S.check(next, || "a new run's report was refused".into())?;
        S.op(
            q.delivered(&parent, &["a#1".to_owned()]).await,
            "delivered again",
        )?;
        // Parents apart.
        let other = id();
        let theirs = S.op(q.pending(&other).await, "pending")?;
        S.check(theirs.is_empty(), || {
            format!("another parent sees {theirs:?}")
        })?;
        // Nothing lost or doubled under concurrent pushers (each id pushed twice).
        let busy = id();
        let pushers: Vec<_> = (0..8)
            .map(|w| {
                let q = open();
                tokio::spawn(async move {
                    for i in 0..25 {
                        let key = format!("w{w}-{i}");
                        let task = TaskId::from_entropy(TaskKind::Agent, (w as u64) << 32 | i);
                        for _ in 0..2 {
                            if q.push(&busy, &key, &note(task, &key)).await.is_err() {
                                return false;
                            }
                        }
                    }
                    true
                })
            })
            .collect();
        for p in pushers {
            let ok = p
                .await
                .map_err(|e| S.fail(format!("a pusher panicked: {e}")))?;
            S.check(ok, || "a concurrent push failed".into())?;
        }
        let got = S.op(q.pending(&busy).await, "pending")?;
        let mut keys: Vec<String> = got.iter().map(|g| g.id.clone()).collect();
        keys.sort();
        keys.dedup();
        S.check(got.len() == 200 && keys.len() == 200, || {
            format!(
                "8 pushers × 25 reports, each pushed twice: {} stored, {} distinct",
                got.len(),
                keys.len()
            )
        })?;
        // A waiting parent is woken by a push from another handle; known ids do not wake it.
        let waiter = id();
        let reader = open();
        let waiting = tokio::spawn(async move {
            reader
                .wait_beyond(&waiter, &[], Duration::from_secs(20))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        S.op(open().push(&waiter, "w#1", &note(a, "wake")).await, "push")?;
        let woke = waiting
            .await
            .map_err(|e| S.fail(format!("the waiter panicked: {e}")))?;
        S.check(matches!(woke, Ok(true)), || {
            format!("the waiting parent got {woke:?}")
        })?;
        let quiet = S.op(
            open()
                .wait_beyond(&waiter, &["w#1".to_owned()], Duration::from_millis(150))
                .await,
            "wait_beyond",
        )?;
        S.check(!quiet, || {
            "a parent that knows every pending id was woken".into()
        })
    }
}
