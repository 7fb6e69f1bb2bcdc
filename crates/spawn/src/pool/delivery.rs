//! The parent's side of a pool: its notifications into its conversation, exactly once.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, TaskNotification, ToolDefinition};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{Job, Pool};
use crate::base::pending::{
    Expectation, OwnedPromise, PendingMessage, PendingQueue, PromiseHandle,
};
use crate::error::Result;
use crate::task::queue::NotificationQueue;
use crate::team::Team;
use crate::tool::{InBackground, Tool, ToolContext, ToolOutput};

/// The parent's promises for its pool tasks, and the tasks whose notification it was given (or
/// its conversation held): a task is promised at most until then, never again.
#[derive(Default)]
struct Promises {
    waiting: HashMap<TaskId, Promise>,
    given: HashSet<TaskId>,
    /// Tasks waited for whose submission succeeded, with their descriptions: a task the
    /// store no longer holds after that was lost (see `report_lost`).
    submitted: HashMap<TaskId, String>,
}

/// The parent's promise for one pool task.
enum Promise {
    /// Held until its notification comes.
    Held(Expectation),
    /// A teammate's: set down while it is idle, taken up while it works (through its lead's
    /// [`Team`]).
    Teammate(OwnedPromise),
}

impl Promise {
    fn deliver(self, message: PendingMessage) {
        match self {
            Promise::Held(e) => e.deliver(message),
            Promise::Teammate(p) => p.deliver(message),
        }
    }
}

type Expected = Arc<Mutex<Promises>>;

/// Feeds one parent agent's notifications from the pool into its conversation, and
/// acknowledges each — marks it delivered, in the same store the workers report into — only
/// once the agent has recorded the message that carries it (its transcript written, when it
/// keeps one; see [`PendingMessage::with_receipt`]). A parent whose process dies between the
/// two gets the notification again when it comes back, and [`attach`](Self::attach) skips it
/// there because the resumed conversation already holds it: exactly once into the
/// conversation.
///
/// While the parent has tasks on the pool it has not heard from, it waits for them at the end
/// of its turn, as for local background children — with no worker running, as long as it
/// takes. Cancelling the parent, or dropping it (which cancels it), cancels all of them,
/// wherever they run ([`Pool::cancel`]); a cancelled parent that is kept hears each of them end
/// (`killed`) in its queue, as it would a local child. A process that dies without dropping it
/// (a crash) leaves them running, for its restart to collect.
///
/// A resumed agent must be attached before it runs: nothing else tells it of its tasks on the
/// pool, and without a delivery it neither waits for them nor hears of them (their
/// notifications wait in the pool until it is attached). Pool tasks send no `ChildStarted`
/// or `Notified` events and are not in `AgentRun::children`: their notifications in the
/// conversation are the record (read them with
/// `forkhive_core::notification::find_notifications`).
///
/// Clones share one delivery; the last one dropped stops it (the agent's tree holds one for
/// as long as the agent lives).
#[derive(Clone)]
pub struct Delivery {
    inner: Arc<Inner>,
}

struct Inner {
    parent: TaskId,
    pool: Pool,
    queue: PendingQueue,
    expected: Expected,
    flushes: mpsc::UnboundedSender<oneshot::Sender<bool>>,
    _loop: AbortOnDropHandle<()>,
    /// Answers its pool tasks' permission requests with the parent's policy.
    _asks: AbortOnDropHandle<()>,
    /// The parent's cancellation.
    cancel: CancellationToken,
    /// Wakes the loop when a task is submitted, so it looks for lost tasks while any waits.
    wake: Arc<tokio::sync::Notify>,
}

impl Drop for Inner {
    /// The parent's tree is going. If the parent was cancelled — dropping an agent cancels
    /// it — its tasks on the pool are cancelled too, on a task of their own (one script),
    /// whether or not the loop saw the cancellation before it was stopped.
    fn drop(&mut self) {
        if !self.cancel.is_cancelled() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (pool, parent) = (self.pool.clone(), self.parent);
            rt.spawn(async move {
                if let Err(e) = pool.cancel_children(&parent).await {
                    tracing::warn!(parent = %parent, "cancelling its tasks on the pool: {e}");
                }
            });
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("parent", &self.inner.parent)
            .field("pool", &self.inner.pool.name)
            .finish_non_exhaustive()
    }
}

/// Each parent's delivery, in its agent tree's extensions (where [`PoolAgentTool`] finds it).
#[derive(Default)]
struct Deliveries(Mutex<HashMap<TaskId, Delivery>>);

impl Delivery {
    /// Starts delivering `pool`'s notifications to `agent`, which may be a resumed one: the
    /// notifications its conversation already holds are acknowledged and not given again, and
    /// every task the pool still has for it is waited for. Attaching again returns the same
    /// delivery. [`PoolAgentTool`] starts one lazily for an agent that was not attached, which
    /// suits a fresh agent; a resumed agent must be attached before its first run, or it does
    /// not wait for the tasks it started before (see [`Delivery`]).
    pub async fn attach(pool: &Pool, agent: &crate::runtime::Agent) -> Result<Delivery> {
        let parent = *agent.id();
        let mut held = HashSet::new();
        for m in agent.params().messages().iter() {
            // A malformed envelope in its own conversation is not a pool notification.
            if let Ok(found) = forkhive_core::notification::find_notifications(m) {
                held.extend(found.into_iter().map(|n| n.task_id.to_string()));
            }
        }
        let mut waiting: Vec<TaskId> = pool
            .outstanding(&parent)
            .await?
            .into_iter()
            .filter(|t| !held.contains(&t.to_string()))
            .collect();
        // A lead's teammates still on the pool come back to its roster, idle: it waits for
        // them while they work, not until they end.
        let team = lead_team(agent.tree(), pool);
        let mut teammates = Vec::new();
        if let Some(team) = &team
            && let Some(link) = team.lead_link()
        {
            for (name, task, live) in link.members(team.name()).await? {
                if live && let Some(i) = waiting.iter().position(|t| *t == task) {
                    waiting.swap_remove(i);
                    teammates.push((name, task));
                }
            }
        }
        let all = agent
            .tree()
            .extensions()
            .get_or_insert_with(Deliveries::default);
        // One delivery per parent: a second would give every notification again.
        let d = {
            let mut map = all.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(d) = map.get(&parent) {
                for t in waiting {
                    d.expect(t);
                    d.submitted(t, "");
                }
                d.clone()
            } else {
                let d = Self::start(
                    pool.clone(),
                    parent,
                    agent.pending(),
                    agent.cancellation().clone(),
                    held,
                    &waiting,
                    Arc::clone(agent.policy()),
                    team.clone(),
                );
                map.insert(parent, d.clone());
                d
            }
        };
        if let Some(team) = &team {
            // Its relay first: the teammates' answers, and the last letters of those that
            // ended while it was away, are read and never shown raw.
            team.serve_lead(agent.pending(), agent.cancellation().clone());
            for (name, task) in teammates {
                // Held until it says what it is doing.
                if let Some(handle) = d.expect_teammate(task, true) {
                    team.rejoin_remote(&name, task, handle.clone());
                    if let Err(e) = team.ask_state(&name, &task).await {
                        // Not asked, it would never answer: not waited for (attach again to
                        // ask again).
                        handle.set_down();
                        return Err(e);
                    }
                }
            }
        }
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        pool: Pool,
        parent: TaskId,
        queue: PendingQueue,
        cancel: CancellationToken,
        held: HashSet<String>,
        waiting: &[TaskId],
        policy: Arc<dyn crate::tool::PermissionPolicy>,
        team: Option<Arc<Team>>,
    ) -> Delivery {
        let asks = tokio::spawn(super::ask::serve(pool.clone(), parent, policy));
        // Promised before the loop's first look, so no notification is pushed unpromised
        // while its promise is still to come.
        let expected: Expected = Arc::new(Mutex::new(Promises {
            waiting: waiting
                .iter()
                .map(|t| (*t, Promise::Held(queue.expect())))
                .collect(),
            given: HashSet::new(),
            // Listed by the store (a resumed parent's): held there until delivered.
            submitted: waiting.iter().map(|t| (*t, String::new())).collect(),
        }));
        let (flushes, flush_rx) = mpsc::unbounded_channel();
        let wake = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(deliver(
            Loop {
                pool: pool.clone(),
                parent,
                queue: queue.clone(),
                expected: Arc::clone(&expected),
                cancel: cancel.clone(),
                team,
                wake: Arc::clone(&wake),
            },
            held,
            flush_rx,
        ));
        Delivery {
            inner: Arc::new(Inner {
                parent,
                pool,
                queue,
                expected,
                flushes,
                _loop: AbortOnDropHandle::new(task),
                _asks: AbortOnDropHandle::new(asks),
                cancel,
                wake,
            }),
        }
    }

    /// The parent it delivers to.
    pub fn parent(&self) -> TaskId {
        self.inner.parent
    }

    /// Acknowledges every notification the conversation has recorded so far, now: what a
    /// host calls before its process exits after the parent's run, so the store is left with
    /// nothing the conversation holds. (Without it, nothing is lost or doubled either: a
    /// restarted parent skips them, as its transcript holds them.) `Ok(false)`: some could
    /// not be acknowledged (the error is logged); they are tried again later.
    pub async fn flush(&self) -> Result<bool> {
        let (tx, rx) = oneshot::channel();
        if self.inner.flushes.send(tx).is_err() {
            return Ok(false);
        }
        Ok(rx.await.unwrap_or(false))
    }

    /// Cancels every task the parent has on the pool and was not told of yet, and waits for
    /// that to be recorded (see [`Pool::cancel_children`]): what a host ending its process on
    /// purpose calls, since a cancel made while the runtime shuts down may not run.
    pub async fn cancel_tasks(&self) -> Result<u64> {
        self.inner.pool.cancel_children(&self.inner.parent).await
    }

    /// Whether it still delivers. It stops once its parent has been cancelled (an agent is
    /// cancelled when it ends or is dropped) and has heard every pool task it waited for —
    /// their `killed` notifications are in its queue — or twice the pool's lease (at least
    /// 10 s) after the cancel, whichever comes first.
    pub fn is_delivering(&self) -> bool {
        !self.inner._loop.is_finished()
    }

    /// Makes the parent wait for `task`'s notification (as [`PoolAgentTool`] does for each
    /// task it submits).
    pub fn expect(&self, task: TaskId) {
        let mut p = self.promises();
        // Given already (a second attach while its notification waits in the queue): a new
        // promise would never be kept.
        if !p.given.contains(&task) {
            let queue = &self.inner.queue;
            p.waiting
                .entry(task)
                .or_insert_with(|| Promise::Held(queue.expect()));
        }
    }

    /// Makes the parent wait for teammate `task` while it works: the handle sets the promise
    /// down while it is idle and takes it up when it has work; its notification, when it
    /// ends, comes through it all the same. `None` if its notification was given already.
    pub(crate) fn expect_teammate(&self, task: TaskId, held: bool) -> Option<PromiseHandle> {
        let mut p = self.promises();
        if p.given.contains(&task) {
            return None;
        }
        let owned = OwnedPromise::new(&self.inner.queue);
        let handle = owned.handle();
        if !held {
            handle.set_down();
        }
        p.waiting.insert(task, Promise::Teammate(owned));
        Some(handle)
    }

    /// `task` was submitted (or the store lists it): from now on the store holds it until its
    /// report is delivered. `description`: what its notification names it by (empty: not
    /// known here).
    fn submitted(&self, task: TaskId, description: &str) {
        {
            let mut p = self.promises();
            if p.waiting.contains_key(&task) {
                p.submitted.insert(task, description.to_owned());
            }
        }
        self.inner.wake.notify_one();
    }

    fn withdraw(&self, task: &TaskId) {
        self.promises().waiting.remove(task);
    }

    /// The parent's promises, locked (never across an `.await`).
    fn promises(&self) -> std::sync::MutexGuard<'_, Promises> {
        self.inner
            .expected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// The least time a cancelled parent's delivery goes on delivering its tasks' `killed`
/// notifications (twice the pool's lease when that is longer: a worker hears of the cancel
/// at its next lease renewal).
const CANCEL_DRAIN: Duration = Duration::from_secs(10);

/// What the delivery loop works with.
struct Loop {
    pool: Pool,
    parent: TaskId,
    queue: PendingQueue,
    expected: Expected,
    cancel: CancellationToken,
    /// The parent's team on this pool, if it leads one: a teammate's notification is its end.
    team: Option<Arc<Team>>,
    wake: Arc<tokio::sync::Notify>,
}

/// The loop: pending notifications into the parent's queue; receipts into acknowledgements.
///
/// `held`: ids the conversation holds that are not acknowledged yet (from a resumed
/// conversation, or recorded since): never given again, acknowledged until that succeeds.
async fn deliver(
    l: Loop,
    mut held: HashSet<String>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<bool>>,
) {
    let Loop {
        pool,
        parent,
        queue,
        expected,
        cancel,
        team,
        wake,
    } = l;
    let q = pool.queue().clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, bool)>();
    let mut in_flight: HashSet<String> = HashSet::new();
    // When the parent's cancellation was passed on to its tasks (once). The loop then goes on
    // delivering until the parent has heard every task it waits for — their `killed`
    // notifications are what the cancelled parent waits for (its `cancel_grace`) and owes its
    // conversation — or until `drain_for` has passed, and ends: a child that ended (its token
    // is cancelled when it does) keeps no loop and no connection after it.
    let mut cancel_passed: Option<tokio::time::Instant> = None;
    let drain_for = pool.config.lease.saturating_mul(2).max(CANCEL_DRAIN);
    // Tasks the store might have lost, looked for every lease while the parent waits.
    let mut lost = Lost::default();
    let mut next_check = tokio::time::Instant::now() + pool.config.lease;
    // Receipts in, acknowledgements out: the ids recorded since the last look.
    let settle = |in_flight: &mut HashSet<String>,
                  held: &mut HashSet<String>,
                  rx: &mut mpsc::UnboundedReceiver<(String, bool)>,
                  first: Option<(String, bool)>| {
        let mut done = Vec::new();
        let mut one = |(id, recorded): (String, bool)| {
            in_flight.remove(&id);
            // Not recorded (the agent stopped first): given again on the next look.
            if recorded {
                held.insert(id.clone());
                done.push(id);
            }
        };
        if let Some(f) = first {
            one(f);
        }
        while let Ok(r) = rx.try_recv() {
            one(r);
        }
        done
    };
    loop {
        if let Some(at) = cancel_passed {
            let heard = expected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting
                .is_empty();
            if heard || at.elapsed() >= drain_for {
                return;
            }
        }
        if tokio::time::Instant::now() >= next_check {
            next_check = tokio::time::Instant::now() + pool.config.lease;
            lost.report(&pool, &parent, &expected).await;
        }
        // Looked at every lease while a task waits; otherwise the loop sleeps in its wait (a
        // timer would cut it short, and its blocking connection with it) until a submission
        // wakes it.
        let waits = cancel_passed.is_none()
            && !expected
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .submitted
                .is_empty();
        match q.pending(&parent).await {
            Ok(items) => {
                let mut done = Vec::new();
                for item in items {
                    if in_flight.contains(&item.id) {
                        continue;
                    }
                    if held.contains(&item.id) {
                        let mut p = expected.lock().unwrap_or_else(|e| e.into_inner());
                        p.waiting.remove(&item.notification.task_id);
                        p.given.insert(item.notification.task_id);
                        drop(p);
                        if let Some(team) = &team {
                            team.remote_ended(&item.notification.task_id, Box::new(|| {}));
                        }
                        done.push(item.id);
                        continue;
                    }
                    let (tx, id) = (tx.clone(), item.id.clone());
                    let msg = PendingMessage::new(item.notification.to_xml(), "task-notification")
                        .with_receipt(move |recorded| {
                            let _ = tx.send((id, recorded));
                        });
                    let promised = {
                        let mut p = expected.lock().unwrap_or_else(|e| e.into_inner());
                        p.given.insert(item.notification.task_id);
                        p.waiting.remove(&item.notification.task_id)
                    };
                    let to = queue.clone();
                    let deliver = move || match promised {
                        Some(p) => p.deliver(msg),
                        None => to.push(msg),
                    };
                    // A teammate's: given once its last letters are read and it is stopped on
                    // its lead's roster (see `Team::remote_ended`).
                    match &team {
                        Some(team) => {
                            team.remote_ended(&item.notification.task_id, Box::new(deliver));
                        }
                        None => deliver(),
                    }
                    in_flight.insert(item.id);
                }
                acknowledge(&pool, &parent, done, &mut held).await;
            }
            Err(e) => {
                tracing::warn!(parent = %parent, "reading the pool's notifications: {e}");
                tokio::select! {
                    () = cancel.cancelled(), if cancel_passed.is_none() => {}
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
        // Held ids are still pending until their acknowledgement lands: not news.
        let known: Vec<String> = in_flight.iter().chain(held.iter()).cloned().collect();
        tokio::select! {
            biased;
            () = cancel.cancelled(), if cancel_passed.is_none() => {
                // The parent is cancelled (or dropped): so are all its tasks, wherever they run
                // — in one script, on a task of its own that outlives this loop, so a drop
                // that ends the loop does not cut it short. It ends with that one call. The
                // loop goes on: a cancelled parent that is kept hears its tasks end (`killed`)
                // as a local parent hears its children, and waits for nothing more after.
                cancel_passed = Some(tokio::time::Instant::now());
                let (pool, parent) = (pool.clone(), parent);
                tokio::spawn(async move {
                    if let Err(e) = pool.cancel_children(&parent).await {
                        tracing::warn!(parent = %parent, "cancelling its tasks on the pool: {e}");
                    }
                });
            }
            Some(reply) = flushes.recv() => {
                let done = settle(&mut in_flight, &mut held, &mut rx, None);
                let mut all: Vec<String> = held.iter().cloned().collect();
                all.extend(done);
                all.sort();
                all.dedup();
                acknowledge(&pool, &parent, all, &mut held).await;
                let _ = reply.send(held.is_empty());
            }
            Some(first) = rx.recv() => {
                let done = settle(&mut in_flight, &mut held, &mut rx, Some(first));
                acknowledge(&pool, &parent, done, &mut held).await;
            }
            () = tokio::time::sleep(drain_for), if cancel_passed.is_some() => {}
            () = tokio::time::sleep_until(next_check), if waits => {}
            () = wake.notified(), if !waits && cancel_passed.is_none() => {
                next_check = tokio::time::Instant::now() + pool.config.lease;
            }
            r = q.wait_beyond(&parent, &known, Duration::from_secs(30)) => {
                if let Err(e) = r {
                    tracing::warn!(parent = %parent, "waiting for the pool's notifications: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// The tasks a parent waits for that its pool's store may have lost: each one the store's list
/// of the parent's tasks held once (or whose submission succeeded) and no longer holds, with
/// no report for it. Redis restarted without persistence (or its keys were deleted) loses
/// the job, the lease and the report alike, and the parent would wait for ever.
#[derive(Default)]
struct Lost {
    /// Tasks seen in the store's list.
    seen: HashSet<TaskId>,
    /// Tasks missing from it, since when.
    missing: HashMap<TaskId, tokio::time::Instant>,
}

impl Lost {
    /// Reports `killed` each task missing for [`PoolConfig::lost_after`](super::PoolConfig)
    /// — pushed into the parent's queue under the task's id, as its worker would report it,
    /// so it is delivered once, and a report that comes after all is refused as a second one.
    /// A store that cannot be read judges nothing.
    async fn report(&mut self, pool: &Pool, parent: &TaskId, expected: &Expected) {
        let (waiting, described) = {
            let mut p = expected.lock().unwrap_or_else(|e| e.into_inner());
            let Promises {
                waiting, submitted, ..
            } = &mut *p;
            submitted.retain(|t, _| waiting.contains_key(t));
            (
                waiting.keys().copied().collect::<HashSet<TaskId>>(),
                submitted.clone(),
            )
        };
        self.seen.retain(|t| waiting.contains(t));
        self.missing.retain(|t, _| waiting.contains(t));
        if waiting.is_empty() {
            return;
        }
        let Ok(listed) = pool.outstanding(parent).await else {
            return;
        };
        let now = tokio::time::Instant::now();
        for task in waiting {
            if listed.contains(&task) {
                self.seen.insert(task);
                self.missing.remove(&task);
                continue;
            }
            if !self.seen.contains(&task) && !described.contains_key(&task) {
                continue; // not submitted yet
            }
            let since = *self.missing.entry(task).or_insert(now);
            if now.duration_since(since) < pool.config.lost_after {
                continue;
            }
            self.missing.remove(&task);
            let who = match described.get(&task) {
                Some(d) if !d.is_empty() => format!("\"{d}\""),
                _ => format!("task {task}"),
            };
            let mut n = TaskNotification::new(
                task,
                forkhive_core::TaskStatus::Killed,
                format!("Agent {who} was lost"),
                Default::default(),
            );
            n.note = Some(format!(
                "the pool's store no longer holds it (Redis restarted without persistence, or \
                 its keys were deleted) and no report came for {} ms: it may not have run, or \
                 its report was lost with the rest",
                pool.config.lost_after.as_millis()
            ));
            match pool.queue().push(parent, &task.to_string(), &n).await {
                Ok(true) => {
                    tracing::warn!(parent = %parent, task = %task, "a task the pool's store lost is reported killed");
                    super::record(pool, &task, crate::task::TaskState::Killed, None).await;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(parent = %parent, task = %task, "reporting a lost task: {e}");
                }
            }
        }
    }
}

/// Marks notifications delivered and forgets their tasks; acknowledged ids leave `held`. A
/// failure is logged and the ids stay held: acknowledged on a later look, never given twice.
async fn acknowledge(pool: &Pool, parent: &TaskId, ids: Vec<String>, held: &mut HashSet<String>) {
    if ids.is_empty() {
        return;
    }
    let r = async {
        pool.queue().delivered(parent, &ids).await?;
        pool.forget(parent, &ids).await
    }
    .await;
    match r {
        Ok(()) => {
            for id in &ids {
                held.remove(id);
            }
        }
        Err(e) => {
            tracing::warn!(parent = %parent, "acknowledging {} notification(s): {e}; again later", ids.len());
            // A store that reads but cannot write (out of memory) must not make this spin.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The team `tree`'s host made, if its teammates run on `pool`.
fn lead_team(tree: &crate::runtime::TreeState, pool: &Pool) -> Option<Arc<Team>> {
    tree.extensions()
        .get::<Team>()
        .filter(|t| t.lead_link().is_some() && t.pool() == Some(pool.base().as_str()))
}

/// Withdraws a promise made for a job that was not submitted.
struct Withdraw(Option<(Delivery, TaskId)>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some((d, task)) = self.0.take() {
            d.withdraw(&task);
        }
    }
}

/// The `Agent` tool of a coordinator whose workers run on a [`Pool`]: every child it starts is
/// a background task some worker process runs, reporting through one `<task-notification>`.
/// Its input is the local `Agent` tool's (`description`, `prompt`, `subagent_type`) plus
/// `idempotent`.
#[derive(Debug, Clone)]
pub struct PoolAgentTool {
    definition: ToolDefinition,
    pool: Pool,
    bubble: bool,
    teams: bool,
}

#[derive(Deserialize)]
struct Input {
    description: String,
    prompt: String,
    #[serde(default)]
    subagent_type: Option<String>,
    #[serde(default)]
    idempotent: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    team_name: Option<String>,
    #[serde(default)]
    mode: Option<String>,
}

/// The tool's input schema; with teams, `name`, `team_name` and `mode` too.
fn schema(teams: bool) -> String {
    let team = if teams {
        r#","name":{"type":"string","pattern":"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$","description":"The teammate's name in its team"},"team_name":{"type":"string","description":"The team to join"},"mode":{"type":"string","enum":["default","plan"],"description":"The teammate's permission mode"}"#
    } else {
        ""
    };
    format!(
        r#"{{"type":"object","properties":{{"description":{{"type":"string","description":"A short (3-5 word) description of the task"}},"prompt":{{"type":"string","description":"The task for the agent to perform"}},"subagent_type":{{"type":"string","description":"The type of agent to use"}},"idempotent":{{"type":"boolean","description":"Whether running the task twice is harmless (then it runs again if its worker dies)"}}{team}}},"required":["description","prompt"],"additionalProperties":false}}"#
    )
}

/// Descriptions of the tool.
const DESCRIBED: &str = "Launch an agent on a worker to handle a task in the background. You \
                         will be notified with its result when it completes; do not wait or poll.";

impl PoolAgentTool {
    /// The tool, named `Agent`, starting children on `pool`.
    pub fn new(pool: Pool) -> Result<Self> {
        Ok(Self {
            definition: ToolDefinition::new("Agent", DESCRIBED, &schema(false))?,
            pool,
            bubble: false,
            teams: false,
        })
    }

    /// It also starts teammates of the lead's team ([`Pool::team`], in the lead's
    /// extensions): a call with `name` and `team_name` (and `mode: "plan"` for plan mode)
    /// submits a teammate, which a worker runs as one — prompt, idle, letters, until the lead
    /// asks it to shut down; `SendMessage` reaches it by name (see `docs/distributed.md`).
    pub fn with_teams(mut self, teams: bool) -> Result<Self> {
        self.definition = ToolDefinition::new("Agent", DESCRIBED, &schema(teams))?;
        self.teams = teams;
        Ok(self)
    }

    /// Its tasks ask this process about every tool call (`permissionMode: bubble`): after the
    /// worker host's own policy (whose denial stands), the calling agent's own policy decides,
    /// where the user is — the policy that also decides the agent's own calls; a worker's
    /// request names the pool task as its agent. A worker that gets no answer within
    /// [`ASK_TIMEOUT`](super::ASK_TIMEOUT) denies the call.
    pub fn with_bubble(mut self, bubble: bool) -> Self {
        self.bubble = bubble;
        self
    }
}

#[async_trait]
impl Tool for PoolAgentTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn check_tree(&self, tree: &crate::base::state::TreeState) -> std::result::Result<(), String> {
        crate::team::check_teams(self.teams, tree)
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn in_background(&self) -> InBackground {
        InBackground::ByFilter
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        let input: Input = match serde_json::from_value(input) {
            Ok(i) => i,
            Err(e) => return ToolOutput::error(format!("invalid Agent input: {e}")),
        };
        let Some(caller) = cx.caller() else {
            return ToolOutput::error("the pool's Agent tool runs only inside an agent loop");
        };
        let parent = *cx.agent().id();
        // Its tasks' permission requests are decided by this agent's own policy.
        let Some(policy) = crate::runtime::AgentShared::of(cx).map(|s| Arc::clone(&s.policy))
        else {
            return ToolOutput::error("the pool's Agent tool runs only inside an agent loop");
        };
        let delivery = {
            let all = caller
                .tree()
                .extensions()
                .get_or_insert_with(Deliveries::default);
            let mut map = all.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(d) = map.get(&parent)
                && d.inner.pool.base() != self.pool.base()
            {
                return ToolOutput::error(format!(
                    "this agent's tasks run on pool `{}`; it cannot start tasks on `{}` too",
                    d.inner.pool.name, self.pool.name
                ));
            }
            map.entry(parent)
                .or_insert_with(|| {
                    Delivery::start(
                        self.pool.clone(),
                        parent,
                        caller.pending().clone(),
                        cx.cancellation().clone(),
                        HashSet::new(),
                        &[],
                        policy,
                        lead_team(caller.tree(), &self.pool),
                    )
                })
                .clone()
        };
        if input.name.is_some() || input.team_name.is_some() || input.mode.is_some() {
            return match self.teammate(input, cx, &delivery).await {
                Ok(text) => ToolOutput::text(text),
                Err(e) => ToolOutput::error(e),
            };
        }
        let mut job = Job::new(parent, input.description, input.prompt)
            .idempotent(input.idempotent)
            .bubble(self.bubble);
        job.agent_type = input.subagent_type;
        // Expected before it is submitted: a fast worker's report finds the promise. Withdrawn
        // unless the job was submitted — a call dropped mid-way (its timeout) leaves no promise.
        delivery.expect(job.task);
        let mut unsent = Withdraw(Some((delivery.clone(), job.task)));
        match self.pool.submit_checked(&job).await {
            Ok(super::Submitted::Added(_)) => {}
            // It may run: waited for as a submitted task, so its notification comes either
            // way — its own, or `killed` once the store has not listed it for `lost_after`.
            Ok(super::Submitted::Unknown(e)) => {
                unsent.0 = None;
                delivery.submitted(job.task, &job.description);
                return ToolOutput::text(format!(
                    "The pool did not confirm that this agent started ({}): it may be running \
                     on pool `{}`.{}{} (its notification carries this id)\nEither way a \
                     notification for it will come: its result if it runs, `killed` if the \
                     pool never got it. Do not start it again before that.",
                    crate::task::error_chain(&e),
                    self.pool.name,
                    crate::base::launched::POOL_AGENT_ID,
                    job.task
                ));
            }
            Err(e) => {
                return ToolOutput::error(format!(
                    "could not start the agent: {}",
                    crate::task::error_chain(&e)
                ));
            }
        }
        unsent.0 = None;
        delivery.submitted(job.task, &job.description);
        // `agentId:` on a line of its own: the resume reads the task id back from it
        // (`base::launched`).
        ToolOutput::text(format!(
            "Async agent launched successfully on pool `{}`.{}{} (its notification carries \
             this id)\nThe agent is working in the background. You will be notified \
             automatically when it completes.",
            self.pool.name,
            crate::base::launched::POOL_AGENT_ID,
            job.task
        ))
    }
}

impl PoolAgentTool {
    /// Starts a teammate on the pool for the lead calling (see [`with_teams`](Self::with_teams)):
    /// on the lead's roster and on record for the other hosts before it is submitted; its
    /// promise, set down while it is idle, in the lead's delivery.
    async fn teammate(
        &self,
        input: Input,
        cx: &ToolContext,
        delivery: &Delivery,
    ) -> std::result::Result<String, String> {
        let (Some(name), Some(team_name)) = (&input.name, &input.team_name) else {
            return Err(if input.mode.is_some() {
                "`mode` is a teammate's permission mode: give `name` and `team_name` with it"
            } else {
                "a teammate needs both `name` and `team_name`"
            }
            .to_owned());
        };
        if !self.teams {
            return Err("teammates are not available: this host has not enabled teams".to_owned());
        }
        let caller = cx
            .caller()
            .ok_or("the pool's Agent tool runs only inside an agent loop")?;
        let me = cx.agent();
        let team = crate::team::led_by(caller.tree(), team_name, me)?;
        // One lead per team on its mailbox: another would take this one's letters.
        team.claim_lead().await.map_err(|e| e.to_string())?;
        let Some(link) = team
            .lead_link()
            .filter(|_| team.pool() == Some(self.pool.base().as_str()))
            .cloned()
        else {
            return Err(format!(
                "team `{team_name}` does not run its teammates on pool `{}`: make it with \
                 `Pool::team`",
                self.pool.name
            ));
        };
        let plan_mode = match input.mode.as_deref() {
            None | Some("default") => false,
            Some("plan") => true,
            Some(other) => {
                return Err(format!(
                    "teammate `mode` `{other}`: a teammate on a pool runs in `default` or \
                     `plan` mode (its worker's own policy decides the rest)"
                ));
            }
        };
        team.inbox(name)
            .map_err(|e| format!("teammate `name`: {e}"))?;
        let mut job = Job::new(
            *me.id(),
            input.description,
            crate::team::teammate_prompt(team.name(), name, plan_mode, &input.prompt),
        )
        .bubble(self.bubble);
        job.agent_type = input.subagent_type;
        job.teammate = Some(super::Teammate {
            team: team.name().to_owned(),
            name: name.clone(),
            plan_mode,
            ask_before_shutdown: team.shutdown_policy() == crate::team::ShutdownPolicy::Ask,
            shutdown_grace_ns: Some(
                u64::try_from(team.shutdown_grace().as_nanos()).unwrap_or(u64::MAX),
            ),
        });
        let joined = team
            .join(crate::team::Member {
                name: name.clone(),
                task: job.task,
                // The worker's default type when the call names none.
                agent_type: job
                    .agent_type
                    .clone()
                    .unwrap_or_else(|| "default".to_owned()),
                state: crate::team::MemberState::Running,
            })
            .map_err(|e| e.to_string())?;
        // From here until it is submitted, a failure — or this call dropped — takes it off the
        // roster again (leaving no `stopped` member of its name) and withdraws its promise.
        let mut unsent = Withdraw(Some((delivery.clone(), job.task)));
        let mut off_roster = Leave(Some((Arc::clone(&team), joined)));
        team.serve_lead(caller.pending().clone(), cx.cancellation().clone());
        // On record for the other hosts before it runs, so a teammate started with it finds
        // it; refused while another of the name runs on the pool. A record whose job is never
        // submitted is not live (see `Pool::team`).
        link.enlist(team.name(), name, &job.task)
            .await
            .map_err(|e| format!("could not start the teammate: {e}"))?;
        if let Some(promise) = delivery.expect_teammate(job.task, true) {
            team.hold_remote(name, promise);
        }
        let unsure = match self
            .pool
            .submit_checked(&job)
            .await
            .map_err(|e| format!("could not start the teammate: {e}"))?
        {
            super::Submitted::Added(_) => None,
            // It may run: kept on the roster and waited for, as one that started.
            super::Submitted::Unknown(e) => Some(e),
        };
        unsent.0 = None;
        off_roster.0 = None;
        delivery.submitted(job.task, &job.description);
        if let Some(e) = unsure {
            return Ok(format!(
                "The pool did not confirm that teammate `{name}` started ({e}): it may be \
                 running in team `{}` on pool `{}` as task {}. Either way you will hear of it: \
                 an idle_notification if it runs, a `killed` notification if the pool never \
                 got it. Do not start it again before that.",
                team.name(),
                self.pool.name,
                job.task
            ));
        }
        Ok(format!(
            "Teammate `{name}` started in team `{}` on pool `{}` as task {}. It works on its \
             prompt, then goes idle and you get an idle_notification; it stays until you send \
             it a shutdown_request. Write to it with SendMessage (`to`: `{name}`); its letters \
             reach you as <teammate-message> blocks.{}",
            team.name(),
            self.pool.name,
            job.task,
            if plan_mode {
                " It is in plan mode: it sends you its plan, and changes nothing before you \
                 answer with a plan_approval_response."
            } else {
                ""
            }
        ))
    }
}

/// Takes a teammate that was not submitted off its lead's roster, as if it had never joined.
struct Leave(Option<(Arc<Team>, crate::team::Joined)>);

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some((team, joined)) = self.0.take() {
            team.withdraw(joined);
        }
    }
}

/// `SendMessage` to one of the caller's tasks on a pool: `Some` when `to` is a task id the
/// caller has outstanding on the pool it delivers from (sent, or why not), `None` otherwise
/// (the local routes apply). `text` is the message as it enters the recipient's conversation.
pub(crate) async fn route_message(cx: &ToolContext, to: &str, text: &str) -> Option<ToolOutput> {
    let me = *cx.agent().id();
    let task: TaskId = to.parse().ok()?;
    let delivery = cx
        .caller()?
        .tree()
        .extensions()
        .get::<Deliveries>()?
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&me)
        .cloned()?;
    let pool = &delivery.inner.pool;
    // A teammate is written to by name: its letters go through its team, which holds the
    // lead's run while it works on them.
    if let Some(name) = cx
        .caller()
        .and_then(|c| lead_team(c.tree(), pool))
        .and_then(|team| team.name_of(&task))
    {
        return Some(ToolOutput::error(format!(
            "pool task {task} is teammate `{name}`: write to it by name (`to`: `{name}`)"
        )));
    }
    match pool.has_outstanding(&me, &task).await {
        Ok(true) => {}
        // One of the pool's tasks that ended (and was reported): say so, not "no recipient".
        Ok(false) => {
            return match pool.is_closed(&task).await {
                Ok(true) => Some(ToolOutput::error(format!(
                    "pool task {task} has ended (its notification is in your conversation) and \
                     takes no more messages; start a new task for more work"
                ))),
                _ => None,
            };
        }
        // The local routes still work without Redis.
        Err(e) => {
            tracing::warn!(parent = %me, "SendMessage could not ask the pool about {task}: {e}");
            return None;
        }
    }
    Some(match pool.send_message(&task, &me, text).await {
        Ok(_) => ToolOutput::text(format!(
            "Sent to pool task {task}; it reads it at its next tool round (if it stops first, \
             its notification returns the message)."
        )),
        Err(e) => ToolOutput::error(format!("could not send to pool task {task}: {e}")),
    })
}
