//! Background tasks: registry, output files, progress, and the supervisor that turns every
//! child's end — however it ends — into exactly one `<task-notification>`.
//!
//! "Coordinator Mode: A Working Multi-Agent System, From the Source — The Task-Notification
//! Protocol": a worker's result reaches its parent as a message, one envelope with a
//! status of `completed`, `failed` or `killed`, its summary, result and usage. Here:
//!
//! - the envelope is built by [`TaskNotification::to_xml`] only (worker text is escaped, so
//!   a worker cannot forge or close one);
//! - it is delivered through the parent's [`PendingQueue`] promise
//!   ([`Expectation`](crate::base::pending::Expectation)), so a parent that ends its turn waits for
//!   it, and it arrives after the next tool results or starts a new turn;
//! - the registry's terminal transition is the gate: only the supervisor whose transition
//!   succeeded delivers, so a task is notified exactly once;
//! - a deadline cancels the child and synthesizes `killed`; a panic yields `failed`; a
//!   cancelled parent cancels every descendant, and each still yields its notification —
//!   carrying the child's last assistant text and its transcript path, so nothing is lost;
//! - a child's capacity slot is freed the moment it ends; a child that shows no progress for
//!   a while is reported as stalled before its deadline.

pub mod conformance;
pub mod output;
pub mod queue;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
mod redis_queue;
pub mod registry;
mod revive;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use forkhive_core::{TaskId, TaskNotification, TaskStatus, Usage};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::base::children::ChildLedger;
use crate::base::events::{AgentEvent, EventKind, EventSink};
use crate::base::outcome::{AgentRun, StopReason};
use crate::base::pending::{PendingMessage, PendingQueue};
use crate::error::{Error, Result};
use crate::tool::orchestrate::panic_message;
use crate::transcript;

#[cfg(feature = "redis")]
pub use self::redis::RedisTaskRegistry;
#[cfg(feature = "redis")]
pub use self::redis_queue::RedisNotificationQueue;
pub use output::{OutputConfig, OutputFile, scratchpad};
pub use queue::{MemoryNotificationQueue, NotificationQueue, Queued};
use registry::IdMap;
pub use registry::{MemoryTaskRegistry, Retention, TaskRecord, TaskRegistry, TaskState};
pub use revive::{Address, Recipient};

/// How background children are supervised. Build it from [`TaskConfig::default`] with the
/// `with_*` setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskConfig {
    /// How long a background child may run before it is cancelled and reported `killed`
    /// (`None`: no deadline). A foreground child is bounded by its tool call's timeout
    /// (`AgentToolConfig::foreground_timeout`) instead.
    pub deadline: Option<Duration>,
    /// How long without any event before a child is reported as stalled (`None`: never).
    pub stall_after: Option<Duration>,
    /// How long a stopped child gets, beyond its own
    /// [`Limits::cancel_grace`](crate::runtime::Limits::cancel_grace) (its wait for its own
    /// children), to return before it is dropped; its owner then writes its stop record.
    pub kill_grace: Duration,
    /// Where output files go (`None`: none are written).
    pub output: Option<OutputConfig>,
    /// Most live children of one agent.
    pub max_children_per_agent: usize,
    /// Most live children in the whole tree.
    pub max_children_per_tree: usize,
    /// Most ended background children kept ready to be resumed with a message (see
    /// `SendMessage`); past that the oldest is forgotten (0: none is).
    pub max_resumable: usize,
    /// How long a child's start waits for the task registry to record it (its record made,
    /// then moved to `running`). Past it the start fails, saying so, and the record is ended
    /// when the registry answers: a registry that hangs (a networked store in trouble)
    /// cannot hold the parent's `Agent` call for the tool call's whole timeout. A registry
    /// that answers at once (in memory) pays for no timer.
    pub registry_timeout: Duration,
}

setters!(TaskConfig {
    with_deadline => deadline: Option<Duration>,
    with_stall_after => stall_after: Option<Duration>,
    with_kill_grace => kill_grace: Duration,
    with_output => output: Option<OutputConfig>,
    with_max_children_per_agent => max_children_per_agent: usize,
    with_max_children_per_tree => max_children_per_tree: usize,
    with_max_resumable => max_resumable: usize,
    with_registry_timeout => registry_timeout: Duration,
});

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            deadline: Some(Duration::from_secs(30 * 60)),
            stall_after: Some(Duration::from_secs(45)),
            kill_grace: Duration::from_secs(2),
            output: None,
            max_children_per_agent: 32,
            max_children_per_tree: 256,
            max_resumable: 64,
            registry_timeout: Duration::from_secs(30),
        }
    }
}

/// What a running child has done so far, updated from its events.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    /// How many of the child's own events arrived (the stall check compares counts, so no
    /// event pays for a clock read).
    events: AtomicU64,
    state: Mutex<ProgressState>,
    responding: AtomicBool,
    responded: Notify,
    turns: AtomicU32,
    /// Its last run emitted its `Stopped` (set by that event, cleared by the next run's
    /// first turn): a teammate dropped between runs, or after its run's end while it still
    /// tells its lead, needs no `Stopped` from its owner.
    stopped: AtomicBool,
}

#[derive(Debug, Default)]
struct ProgressState {
    current_text: String,
    last_text: String,
    usage: Usage,
    tool_uses: u64,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            events: AtomicU64::new(0),
            state: Mutex::default(),
            responding: AtomicBool::new(false),
            responded: Notify::new(),
            turns: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
        }
    }
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds one of the child's events in.
    pub fn observe(&self, event: &AgentEvent) {
        self.events.fetch_add(1, Ordering::Release);
        match &event.kind {
            EventKind::TextDelta { text } => {
                self.lock().current_text.push_str(text);
                self.mark_responding();
            }
            EventKind::ResponseReceived { usage, .. } => {
                let mut st = self.lock();
                st.usage += *usage;
                if !st.current_text.is_empty() {
                    st.last_text = std::mem::take(&mut st.current_text);
                }
                drop(st);
                self.mark_responding();
            }
            EventKind::ToolCallStarted { .. } => self.lock().tool_uses += 1,
            EventKind::TurnStarted => {
                self.turns.fetch_add(1, Ordering::AcqRel);
                self.stopped.store(false, Ordering::Release);
            }
            EventKind::Stopped { .. } => self.stopped.store(true, Ordering::Release),
            _ => {}
        }
    }

    fn mark_responding(&self) {
        if !self.responding.swap(true, Ordering::AcqRel) {
            self.responded.notify_waiters();
        }
    }

    /// Waits until the child's first answer has started streaming.
    pub async fn responding(&self) {
        loop {
            let notified = self.responded.notified();
            if self.responding.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// The last complete assistant text (or the one being streamed, if none is complete).
    pub fn last_text(&self) -> String {
        let st = self.lock();
        if st.last_text.is_empty() {
            st.current_text.clone()
        } else {
            st.last_text.clone()
        }
    }

    /// Usage so far.
    pub fn usage(&self) -> Usage {
        self.lock().usage
    }

    /// Model turns started so far.
    pub fn turns(&self) -> u32 {
        self.turns.load(Ordering::Acquire)
    }

    /// Tool calls so far.
    pub fn tool_uses(&self) -> u64 {
        self.lock().tool_uses
    }

    /// How many of the child's own events have arrived: a count that does not move means no
    /// progress.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Acquire)
    }

    /// Time since the child started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// A child's event sink: updates its [`Progress`], appends to its output file, and forwards to
/// the parent's sink so hosts see the whole tree. Only the child's own events count toward its
/// progress and output file; its descendants' events (forwarded through it) pass on untouched.
#[derive(Debug)]
pub struct ChildSink {
    /// The child whose events these are.
    pub child: TaskId,
    /// The child's progress.
    pub progress: Arc<Progress>,
    /// The child's output file.
    pub output: Option<Arc<OutputFile>>,
    /// The parent's sink.
    pub forward: Option<Arc<dyn EventSink>>,
}

impl EventSink for ChildSink {
    fn emit(&self, event: AgentEvent) {
        if event.agent != self.child {
            if let Some(f) = &self.forward {
                f.emit(event);
            }
            return;
        }
        self.progress.observe(&event);
        if let Some(out) = &self.output {
            match &event.kind {
                EventKind::TextDelta { text } => out.append(text),
                // The model chose the name and the id: one line each, so neither breaks the
                // marker's line. (The model's text is written as it is, and may hold lines
                // shaped like markers: the file is its output, not a log to trust.)
                EventKind::ToolCallStarted { name, id } => out.append_line(&format!(
                    "[tool {} {}]",
                    crate::base::events::one_line(name),
                    crate::base::events::one_line(id)
                )),
                EventKind::Stopped { reason, .. } => {
                    out.append_line(&format!("[stopped: {reason}]"))
                }
                _ => {}
            }
        }
        if let Some(f) = &self.forward {
            f.emit(event);
        }
    }
}

/// A capacity slot: held while a child lives, freed on drop.
#[derive(Debug)]
pub struct Slot {
    service: Arc<TaskService>,
    parent: TaskId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.service.live.fetch_sub(1, Ordering::AcqRel);
        let mut per = self
            .service
            .per_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per.get_mut(&self.parent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&self.parent);
            }
        }
    }
}

/// The service every child of one tree is started through: the registry, the supervisors, the
/// capacity counters. Reach it through
/// [`TreeState::extensions`](crate::runtime::TreeState::extensions).
///
/// One owner per life ("Chapter 9: Sub-Agents and the Fork Pattern — 9.6 Sub-Agent Lifecycle
/// Management"; "Coordinator Mode — gotchas": a worker that never reports): every child,
/// foreground or background, runs inside a supervisor task that [`start`](Self::start) spawns,
/// and that task holds the child's guard — its cancellation token, registry record, capacity
/// slot, transcript stop record, usage roll-up and the parent's promise. However the child
/// ends — it finishes, errors, panics, passes its deadline, the caller awaiting a foreground
/// child stops waiting (its tool call timed out, its parent was cancelled or dropped), or the
/// supervisor itself is dropped — the guard finishes all of them exactly once and cancels the
/// child's descendants.
pub struct TaskService {
    registry: Arc<dyn TaskRegistry>,
    live: AtomicUsize,
    per_agent: Mutex<IdMap<usize>>,
    /// The children still running: how to stop each and reach it.
    tokens: Mutex<IdMap<LiveChild>>,
    /// Ended background children that can be resumed with a message. Locked only after
    /// `tokens` when both are held.
    dormant: Mutex<revive::Dormancy>,
    /// The last [`ENDED_NAMES`] named children that ended: (parent, name, id), oldest first.
    /// A message to one by name is then refused for what it is (it ended and cannot be
    /// resumed), not as a name that never was.
    ended_names: Mutex<std::collections::VecDeque<(TaskId, String, TaskId)>>,
    /// Children whose guard has not finished yet.
    active: AtomicUsize,
    /// Woken (all waiters) when `active` reaches zero.
    idle: Notify,
    config: TaskConfig,
}

/// A running child as its service reaches it: to stop it, or to give it or its parent a
/// message.
#[derive(Debug, Clone)]
struct LiveChild {
    cancel: CancellationToken,
    parent: TaskId,
    name: Option<String>,
    inbox: PendingQueue,
    parent_inbox: PendingQueue,
    /// Held while it runs by a child that may work in a worktree: the owner's of that tree
    /// (when the child has one), given on to every child started below it. The tree's owner
    /// removes or keeps it only once every holder has stopped (see [`TreeUsers`]).
    tree_hold: Option<mpsc::Sender<()>>,
}

/// What a worktree's owner waits on before it asks git whether the tree changed: the end of
/// every child started below it, since they work in its tree through its rooted tools. Its
/// descendants are cancelled when it ends; each stops within its grace. Waiting closes the gap
/// in which a tree was removed, or reported unchanged, while a child below was still writing
/// in it (a peer reports trees removed under a nested child; "Coordinator Mode — gotchas").
struct TreeUsers {
    /// Closed when the last holder's entry is gone.
    held: mpsc::Receiver<()>,
    /// How long the owner waits before it keeps the tree as possibly still in use.
    limit: Duration,
}

/// Where a message for a running child went (see [`TaskService::send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sent {
    /// Into a running child's queue: it reads it at its next tool-round boundary.
    Child(TaskId),
    /// Into the queue of a running child's parent.
    Parent(TaskId),
}

impl fmt::Debug for TaskService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskService")
            .field("live", &self.live.load(Ordering::Relaxed))
            .field("active", &self.active.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// How a child's run is started.
pub enum FirstInput {
    /// `Agent::run(prompt)`.
    Prompt(String),
    /// `Agent::continue_run()` (the conversation already ends with the child's message).
    Continue,
    /// A run of the caller's making (a teammate's long-lived loop): it gets the agent and
    /// returns the run its owner reports.
    Custom(CustomRun),
}

/// What [`FirstInput::Custom`] runs: it gets the agent and the child's side of its promise on
/// the parent's queue, which it may set down while it waits for work (the parent does not wait
/// for it then) and take up again.
pub type CustomRun = Box<
    dyn for<'a> FnOnce(
            &'a mut crate::runtime::Agent,
            crate::base::pending::PromiseHandle,
        ) -> std::pin::Pin<Box<dyn Future<Output = AgentRun> + Send + 'a>>
        + Send,
>;

impl fmt::Debug for FirstInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FirstInput::Prompt(p) => f.debug_tuple("Prompt").field(p).finish(),
            FirstInput::Continue => f.write_str("Continue"),
            FirstInput::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// Whether the caller waits for a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The caller awaits the child's end through its [`ChildHandle`]; dropping the handle
    /// first stops the child (`killed`). No notification.
    Foreground,
    /// The child reports through exactly one `<task-notification>` on the parent's queue, and
    /// is stopped by the service's deadline.
    Background,
}

/// Everything the supervisor needs about one child.
#[derive(Debug)]
pub struct Launch {
    /// The child, built.
    pub agent: crate::runtime::Agent,
    /// How to start it.
    pub first: FirstInput,
    /// The `description` it was started with.
    pub description: String,
    /// The parent's `tool_use` id that started it.
    pub tool_use_id: Option<String>,
    /// The parent's queue: it holds a promise while the child lives (so a parent that ends its
    /// turn waits for it), and receives a background child's notification.
    pub parent_queue: PendingQueue,
    /// Its progress (fed by its [`ChildSink`]).
    pub progress: Arc<Progress>,
    /// Its output file.
    pub output: Option<Arc<OutputFile>>,
    /// Its capacity slot.
    pub slot: Slot,
    /// Work to await before the child starts (a cache-warm fan-out gate).
    pub gate: Option<Gate>,
    /// Where to report [`EventKind::ChildStarted`] and [`EventKind::Notified`] (normally
    /// the parent's sink, so a host sees the whole tree).
    pub events: Option<Arc<dyn EventSink>>,
    /// The parent's ledger of children (see `AgentRun::children`), where the child's start
    /// and end are recorded — the end before the parent hears of it.
    pub ledger: Option<ChildLedger>,
    /// The parent's turn, which its [`EventKind::ChildStarted`] carries.
    pub parent_turn: u32,
    /// The child's git worktree, which its owner finishes when the child ends: removed when
    /// nothing changed, otherwise kept and named in the notification's `worktree` tag. Guarded
    /// until then, so a start that fails or is dropped still finishes it.
    pub worktree: Option<crate::worktree::Unfinished>,
    /// How long this child may run, in either mode (`None`: [`TaskConfig::deadline`] for a
    /// background child; a foreground one is bounded by its tool call's timeout).
    pub deadline: Option<Duration>,
    /// A name its parent can address it by (`SendMessage`'s `to`), unique among the parent's
    /// children that are running or resumable.
    pub name: Option<String>,
}

/// A child's entry on the live map, and its registry record, between its start and its owner:
/// if the start fails or its future is dropped (its parent was cancelled, or the tool call
/// awaiting it timed out, while the registry answered), the entry is removed and a record that
/// may have been written is ended `killed` — nothing is left running with nobody to end it.
struct Claim<'a> {
    service: &'a TaskService,
    id: Option<TaskId>,
    /// Whether its record may exist (its creation was asked for).
    recorded: bool,
}

impl Claim<'_> {
    /// The owner takes the entry and the record over (its `begin` removes the entry).
    fn disarm(mut self) {
        self.id = None;
    }

    /// The start failed after its record was made: ends the record here, waiting for the
    /// registry's answer.
    async fn abandon(mut self) {
        if let Some(id) = self.id
            && self.recorded
        {
            let r = self
                .service
                .registry
                .transition(&id, TaskState::Killed)
                .await;
            self.recorded = false;
            if let Err(e) = r {
                tracing::warn!(task = %id, "could not end the record of a child that did not start: {e}");
            }
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        self.service
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if self.recorded {
            end_unstarted(&self.service.registry, id);
        }
    }
}

/// `op`, a registry call on a child's start, bounded by `limit` ([`TaskConfig::registry_timeout`]):
/// its answer, or (the outer `Err`) the error saying it did not come. Polled once first: a
/// registry that answers at once (in memory) pays for no timer.
async fn bounded<T>(
    limit: Duration,
    id: &TaskId,
    what: &str,
    op: impl Future<Output = Result<T>>,
) -> std::result::Result<Result<T>, Error> {
    use futures::FutureExt;
    let mut op = std::pin::pin!(op);
    if let Some(out) = op.as_mut().now_or_never() {
        return Ok(out);
    }
    match tokio::time::timeout(limit, op).await {
        Ok(out) => Ok(out),
        Err(_) => Err(Error::Task {
            id: *id,
            message: format!(
                "the task registry did not answer within {} ({what}), so the child was not \
                 started; its record is ended once the registry answers",
                crate::base::events::format_duration(limit)
            ),
        }),
    }
}

/// Ends the record of a child whose start was dropped: at once if the registry answers at once
/// (in memory), else in a task of its own. A runtime that is shutting down may never run that
/// task (a networked registry's record then stays as it was), and with no runtime at all the
/// record is left with a warning.
fn end_unstarted(registry: &Arc<dyn TaskRegistry>, id: TaskId) {
    use futures::FutureExt;
    let registry = Arc::clone(registry);
    let mut end = Box::pin(async move {
        if let Err(e) = registry.transition(&id, TaskState::Killed).await {
            tracing::debug!(task = %id, "the record of a child that did not start: {e}");
        }
    });
    if (&mut end).now_or_never().is_some() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn(end)),
        Err(_) => tracing::warn!(
            task = %id,
            "the record of a child that did not start could not be ended: no runtime is left"
        ),
    }
}

/// Work a child awaits before its first request (the cache-warm fan-out wait).
pub struct Gate(pub std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);

impl Gate {
    /// A gate that opens when `fut` completes.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Box::pin(fut))
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Gate")
    }
}

/// How a child ended, as its owner saw it.
enum Ended {
    /// Its run returned (and wrote its own stop record).
    Ran(AgentRun),
    /// It panicked.
    Panicked(String),
    /// Its owner stopped it; `run` is what it returned within its grace, if it did.
    Stopped { run: Option<AgentRun>, why: Why },
}

/// Why an owner stopped a child.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// Its token was cancelled (its parent was, or `TaskService::cancel`).
    Cancelled,
    /// Its deadline passed.
    Deadline(Duration),
    /// The caller awaiting it (a foreground tool call) stopped waiting.
    Abandoned,
    /// Its supervisor was dropped (the runtime shut down).
    Dropped,
}

impl Why {
    /// What the notification notes about it (a plain cancel needs no note).
    fn note(self) -> Option<String> {
        match self {
            Why::Cancelled => None,
            Why::Deadline(after) => Some(format!(
                "stopped by its {} deadline",
                crate::runtime::events::format_duration(after)
            )),
            Why::Abandoned => Some(
                "stopped: the call awaiting it ended first (its tool call timed out, or its \
                 parent stopped)"
                    .to_owned(),
            ),
            Why::Dropped => Some("stopped: its supervisor was dropped".to_owned()),
        }
    }
}

impl Ended {
    fn run(&self) -> Option<&AgentRun> {
        match self {
            Ended::Ran(run) | Ended::Stopped { run: Some(run), .. } => Some(run),
            _ => None,
        }
    }

    /// The stop the child could not record itself (it wrote one whenever its run returned,
    /// and said so with its `Stopped` event), with why it failed: a panic's message.
    fn unrecorded_stop(&self) -> Option<(StopReason, Option<String>)> {
        match self {
            Ended::Ran(_) | Ended::Stopped { run: Some(_), .. } => None,
            Ended::Panicked(message) => {
                Some((StopReason::Failed, Some(format!("it panicked: {message}"))))
            }
            Ended::Stopped { run: None, .. } => Some((StopReason::Cancelled, None)),
        }
    }
}

/// How a foreground child ended, for the caller that awaited it.
#[derive(Debug)]
#[non_exhaustive]
pub struct ChildEnd {
    /// The child.
    pub id: TaskId,
    /// How it ended (the state its record was moved to).
    pub status: TaskStatus,
    /// What a background child would have been notified with: summary, partial result,
    /// usage, transcript path (built by trusted code).
    pub notification: TaskNotification,
    /// Its run, when it returned one (not after a panic, nor when it was dropped past its
    /// grace).
    pub run: Option<AgentRun>,
}

/// A started child.
///
/// For a [`Mode::Foreground`] child, [`end`](Self::end) awaits how it ended; dropping the
/// handle (or the future awaiting it) before that stops the child, which then ends `killed`.
/// A background child's handle only names it: dropping it changes nothing.
#[derive(Debug)]
pub struct ChildHandle {
    id: TaskId,
    end: Option<oneshot::Receiver<ChildEnd>>,
}

impl ChildHandle {
    /// The child's task id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Waits until a foreground child has ended and its owner has finished with it (record,
    /// slot, stop record, usage). For a background child: an error, since it reports
    /// through its notification.
    pub async fn end(self) -> Result<ChildEnd> {
        let id = self.id;
        let Some(rx) = self.end else {
            return Err(Error::Task {
                id,
                message: "a background child reports through its notification, not its handle"
                    .to_owned(),
            });
        };
        rx.await.map_err(|_| Error::Task {
            id,
            message: "its supervisor stopped before it could report (the runtime is shutting \
                      down)"
                .to_owned(),
        })
    }
}

/// Counts a child as active from its start until its guard has finished (see
/// [`TaskService::wait_idle`]).
struct Active(Arc<TaskService>);

impl Active {
    fn new(service: &Arc<TaskService>) -> Self {
        service.active.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(service))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// What a child's guard owns until it finishes.
struct Owned {
    service: Arc<TaskService>,
    record: TaskRecord,
    mode: Mode,
    cancel: CancellationToken,
    slot: Option<Slot>,
    promise: crate::base::pending::OwnedPromise,
    progress: Arc<Progress>,
    output: Option<Arc<OutputFile>>,
    tool_use_id: Option<String>,
    events: Option<Arc<dyn EventSink>>,
    ledger: Option<ChildLedger>,
    worktree: Option<Box<crate::worktree::Worktree>>,
    /// With a worktree: the children below that may still be working in it.
    tree_users: Option<Box<TreeUsers>>,
    report: Option<oneshot::Sender<ChildEnd>>,
    /// How to resume it for a message after it ends (a background child with a transcript);
    /// boxed, since most children have none and every owner is allocated whole.
    revive: Option<Box<revive::Recipe>>,
    /// Dropped when this owner is done: a resume waits for it, so the runs of one task never
    /// overlap and its notifications arrive in order.
    _settled: Option<oneshot::Sender<()>>,
    _active: Active,
}

/// The one owner of a child's life: finishes its token, record, slot, stop record, usage and
/// promise exactly once — through [`finish`](Self::finish), or, if it is dropped unfinished
/// (before finishing or part-way through it), on the spot in its `Drop`.
///
/// The owner is boxed, so the supervisor's task holds a pointer to it and stays small; this
/// moves the owner's bytes out of the task rather than saving them.
struct ChildGuard {
    owned: Option<Box<Owned>>,
    /// Set when finishing has begun: how far it got.
    finishing: Option<Finishing>,
}

/// An owner part-way through finishing: the end, the notification built for it, and the last
/// step done. If the owner's future is dropped here (the runtime shuts down while it waits on
/// the disk or the registry), its guard's `Drop` does the steps left, each once.
struct Finishing {
    ended: Ended,
    n: TaskNotification,
    done: Step,
    /// Whether to deliver the end (the registry's gate said so).
    report: bool,
}

/// The steps of finishing after [`Owned::begin`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// The token, the live entry, the slot: done by `begin`.
    Begun,
    /// The worktree removed or kept.
    Worktree,
    /// The stop record written (when the child could not write its own).
    StopRecord,
    /// The output file flushed.
    Flushed,
    /// The roll-up asked for, its answer not yet back (it may have landed: not asked again).
    RollingUp,
    /// The usage rolled up.
    RolledUp,
    /// The move to the terminal state asked for, its answer not yet back.
    Moving,
    /// The registry answered: `report` says whether to deliver.
    Moved,
}

impl ChildGuard {
    fn new(owned: Box<Owned>) -> Self {
        Self {
            owned: Some(owned),
            finishing: None,
        }
    }

    /// The owner's future (a plain `fn`: an `async fn` would hold its arguments twice, and
    /// every child's task allocates this). Finishing begins only when it is first polled: a
    /// future dropped unpolled drops the guard, which finishes the child; one dropped
    /// part-way leaves the guard to finish the rest.
    #[allow(clippy::manual_async_fn)]
    fn finish(mut self, ended: Ended) -> impl Future<Output = ()> + Send {
        async move {
            let Self { owned, finishing } = &mut self;
            let Some(owner) = owned.as_mut() else { return };
            let n = owner.begin(&ended);
            let state = finishing.insert(Finishing {
                ended,
                n,
                done: Step::Begun,
                report: false,
            });
            owner.finish(state).await;
            if let (Some(owner), Some(state)) = (self.owned.take(), self.finishing.take()) {
                (*owner).report(state.ended, state.n, state.report);
            }
        }
    }

    fn report_mut(&mut self) -> Option<&mut oneshot::Sender<ChildEnd>> {
        self.owned.as_mut().and_then(|o| o.report.as_mut())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let Some(owned) = self.owned.take() else {
            return;
        };
        // The supervisor is gone: the runtime is shutting down, or it panicked. A task spawned
        // now might never run, so finish here.
        tracing::warn!(task = %owned.record.id, "a child's owner was dropped before it finished");
        match self.finishing.take() {
            Some(state) => owned.finish_now(state),
            None => {
                let ended = Ended::Stopped {
                    run: None,
                    why: Why::Dropped,
                };
                let mut owned = owned;
                let n = owned.begin(&ended);
                owned.finish_now(Finishing {
                    ended,
                    n,
                    done: Step::Begun,
                    report: false,
                });
            }
        }
    }
}

/// How long an owner waits for the disk (the stop record, the output file's flush) before it
/// reports the child anyway: a hung volume must not keep a parent from its notification.
const DISK_LIMIT: Duration = Duration::from_secs(10);

/// The type a child's record gives it: its definition's name, `fork`, or none.
fn agent_type_of(agent: &crate::runtime::Agent) -> String {
    match agent.context().agent_type() {
        Some(t) => t.to_owned(),
        None if agent.context().query_source().is_fork() => "fork".to_owned(),
        None => String::new(),
    }
}

/// How long past its own grace a worktree's owner waits for the children below it to stop
/// (theirs may differ from its own), before it keeps the tree rather than remove it under one.
const TREE_SETTLE: Duration = Duration::from_secs(2);

/// How many ended children's names a service remembers (see [`TaskService::ended_named`]).
pub const ENDED_NAMES: usize = 256;

impl Owned {
    /// The part of finishing that needs no waiting: the child's tree stops, its slot is freed,
    /// its notification is built.
    fn begin(&mut self, ended: &Ended) -> TaskNotification {
        let id = self.record.id;
        // 1. The token: the child and everything below it stop. A child whose run returned at
        //    a limit may have left background children of its own; nobody reads their queue.
        self.cancel.cancel();
        let live = {
            let mut tokens = self
                .service
                .tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let live = tokens.remove(&id);
            // Resumable from now on, in the same step it stops being live: a message sent in
            // between finds it one way or the other.
            if let Some(recipe) = self.revive.take() {
                let (tx, rx) = oneshot::channel();
                self._settled = Some(tx);
                self.service
                    .dormant
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .put(
                        id,
                        revive::Dormant::new(
                            self.record.parent,
                            self.record.description.clone(),
                            self.record.agent_type.clone(),
                            *recipe,
                            rx,
                        ),
                        self.service.config.max_resumable,
                    );
            }
            // Its name, in the same step too: a message by name finds it ended, never
            // nowhere.
            if let Some(name) = live.as_ref().and_then(|l| l.name.clone()) {
                let mut ended = self
                    .service
                    .ended_names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if ended.len() == ENDED_NAMES {
                    ended.pop_front();
                }
                ended.push_back((self.record.parent, name, id));
            }
            drop(tokens);
            live
        };
        // 2. The slot.
        drop(self.slot.take());
        let mut n = notification(
            &self.record,
            ended,
            &self.progress,
            self.tool_use_id.take(),
            self.output.as_deref(),
        );
        // Messages sent to it after its last read (`SendMessage` reported them sent): not lost
        // in silence, but returned to its parent in its notification.
        if let Some(live) = live {
            let (unread, letters) = unread_messages(&live.inbox);
            if !unread.is_empty() || !letters.is_empty() {
                note_undelivered(&mut n, &unread, &letters);
            }
            n.note = n.note.take().map(cap_note);
        }
        n
    }

    /// The child's usage with the tool uses and duration its notification `n` reports: the
    /// notification, the registry's roll-up and the parent's ledger give the same figures.
    fn usage(&self, ended: &Ended, n: &TaskNotification) -> Usage {
        let mut usage = ended
            .run()
            .map_or_else(|| self.progress.usage(), |r| r.usage);
        usage.tool_uses = n.usage.tool_uses;
        usage.duration_ms = n.usage.duration_ms;
        usage
    }

    /// The child's `Stopped` event, for a child that could not emit its own (it panicked, or
    /// was dropped past its grace): a host that follows children from `ChildStarted` to
    /// `Stopped` sees every one end, and `Notified` comes after it, as for any other.
    fn stopped_event(&self, reason: StopReason) {
        // A run that ended before it was dropped (a teammate telling its lead) said so.
        if self.progress.stopped.load(Ordering::Acquire) {
            return;
        }
        if let Some(out) = &self.output {
            out.append_line(&format!("[stopped: {reason}]"));
        }
        if let Some(sink) = &self.events {
            sink.emit(AgentEvent {
                agent: self.record.id,
                turn: self.progress.turns(),
                kind: EventKind::Stopped {
                    reason,
                    usage: self.progress.usage(),
                },
            });
        }
    }

    /// The steps after [`begin`](Self::begin) that wait (on git, the disk, the registry),
    /// each marked done in `state` as it ends; the caller delivers the end. A worktree's
    /// future (large, and rare) is boxed apart.
    async fn finish(&mut self, state: &mut Finishing) {
        let id = self.record.id;
        // The worktree: gone when nothing changed; otherwise kept, and the parent told where.
        // Not before the children below, cancelled in `begin`, have stopped working in it.
        let settled = match self.tree_users.take() {
            Some(mut users) => tokio::time::timeout(users.limit, users.held.recv())
                .await
                .is_ok(),
            None => true,
        };
        if let Some(wt) = self.worktree.as_deref() {
            if !settled {
                keep(
                    &mut state.n,
                    wt,
                    "a child started below it had not stopped working in it",
                );
            } else {
                match Box::pin(tokio::time::timeout(DISK_LIMIT, wt.finish())).await {
                    Ok(crate::worktree::Finished::Removed) => {}
                    Ok(crate::worktree::Finished::Kept(why)) => {
                        keep(&mut state.n, wt, &why.to_string())
                    }
                    Err(_) => keep(&mut state.n, wt, "git did not answer in time"),
                }
            }
        }
        self.worktree = None;
        state.done = Step::Worktree;
        // 3. The stop record, when the child could not write its own; and its `Stopped`
        // event, which it could not emit either.
        let unrecorded = state.ended.unrecorded_stop();
        if let Some((stop, _)) = &unrecorded {
            self.stopped_event(stop.clone());
        }
        if let (Some(path), Some((stop, error))) = (&self.record.transcript, unrecorded) {
            let usage = self.progress.usage();
            match tokio::time::timeout(
                DISK_LIMIT,
                transcript::append_stop_once(path, &stop, usage, error),
            )
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(task = %id, "could not record the child's stop: {e}"),
                Err(_) => tracing::warn!(task = %id, "recording the child's stop timed out"),
            }
        }
        state.done = Step::StopRecord;
        // The output file is complete before anyone is told where it is.
        if let Some(out) = &self.output
            && tokio::time::timeout(DISK_LIMIT, out.flush()).await.is_err()
        {
            tracing::warn!(task = %id, "flushing the child's output file timed out");
        }
        state.done = Step::Flushed;
        // 4. The usage roll-up.
        state.done = Step::RollingUp;
        if let Err(e) = self
            .service
            .registry
            .roll_up(&id, self.usage(&state.ended, &state.n))
            .await
        {
            tracing::warn!(task = %id, "could not roll the child's usage up: {e}");
        }
        state.done = Step::RolledUp;
        // 5. The record's end: the gate of exactly-once delivery.
        let registry = Arc::clone(&self.service.registry);
        let to = TaskState::ended(state.n.status);
        state.done = Step::Moving;
        state.report = match registry.transition(&id, to).await {
            Ok(_) => true,
            Err(e) => {
                let now = registry.get(&id).await.map(|r| r.state);
                refused_or_failed(&id, &e, now)
            }
        };
        state.done = Step::Moved;
    }

    /// Finishing without a runtime to wait on (the owner was dropped while the runtime shuts
    /// down, before finishing or part-way through it): the steps `state` has not done, the
    /// stop record written inline and the registry asked once — an in-memory registry answers
    /// at once; one that cannot is logged — then the end delivered.
    fn finish_now(mut self: Box<Self>, mut state: Finishing) {
        use futures::FutureExt;
        let id = self.record.id;
        // No runtime to ask git with: the worktree is kept, never removed on a guess.
        if let Some(wt) = self.worktree.take() {
            keep(
                &mut state.n,
                &wt,
                "the runtime shut down before its status could be read",
            );
        }
        if state.done < Step::StopRecord
            && let Some((stop, error)) = state.ended.unrecorded_stop()
        {
            self.stopped_event(stop.clone());
            if let Some(path) = &self.record.transcript
                && let Err(e) =
                    transcript::append_stop_once_blocking(path, &stop, self.progress.usage(), error)
            {
                tracing::warn!(task = %id, "could not record the child's stop: {e}");
            }
        }
        let registry = Arc::clone(&self.service.registry);
        // A roll-up asked for and dropped unanswered may have landed: a second would count the
        // usage twice, so it is not asked again (at most once, never twice).
        if state.done == Step::RollingUp {
            tracing::warn!(task = %id, "the child's roll-up was unanswered when the runtime shut down; not asked again");
        }
        if state.done < Step::RollingUp
            && registry
                .roll_up(&id, self.usage(&state.ended, &state.n))
                .now_or_never()
                .is_none_or(|r| r.is_err())
        {
            tracing::warn!(task = %id, "could not roll the child's usage up while shutting down");
        }
        let to = TaskState::ended(state.n.status);
        if state.done < Step::Moved {
            state.report = match registry.transition(&id, to).now_or_never() {
                Some(Ok(_)) => true,
                Some(Err(e)) => {
                    let now = registry.get(&id).now_or_never().flatten().map(|r| r.state);
                    // Its own move, asked for before the drop, may have landed unanswered: a
                    // record in the very state it asked for is taken for its own doing, and
                    // reported. (Another owner that ended it the same way in that window —
                    // only possible across hosts — would report it too.)
                    if state.done == Step::Moving && now == Some(to) {
                        true
                    } else {
                        refused_or_failed(&id, &e, now)
                    }
                }
                None => {
                    tracing::warn!(task = %id, "the registry could not record the child's end while shutting down");
                    true
                }
            };
        }
        (*self).report(state.ended, state.n, state.report);
    }

    /// Delivers the end: a background child's notification (when `report`), or a foreground
    /// child's [`ChildEnd`].
    fn report(mut self, ended: Ended, n: TaskNotification, report: bool) {
        let id = self.record.id;
        let status = n.status;
        if let Some(ledger) = &self.ledger {
            ledger.ended(&id, status, self.usage(&ended, &n));
        }
        match self.mode {
            Mode::Background => {
                if report {
                    // The host hears first: once delivered, the parent may read the
                    // notification, finish its run and return before this thread goes on.
                    if let Some(sink) = &self.events {
                        sink.emit(AgentEvent {
                            agent: id,
                            turn: self.progress.turns(),
                            kind: EventKind::Notified {
                                parent: self.record.parent,
                                status,
                                summary: n.summary.clone(),
                            },
                        });
                    }
                    self.promise
                        .deliver(PendingMessage::new(n.to_xml(), "task-notification"));
                }
            }
            Mode::Foreground => {
                // Withdraw the promise first: the caller goes on once it has the end.
                drop(self.promise);
                if let Some(tx) = self.report.take() {
                    let run = match ended {
                        Ended::Ran(run) | Ended::Stopped { run: Some(run), .. } => Some(run),
                        _ => None,
                    };
                    let _ = tx.send(ChildEnd {
                        id,
                        status,
                        notification: n,
                        run,
                    });
                }
            }
        }
    }
}

/// What was left unread in a child's queue, drained: its `SendMessage` messages, and the
/// letters a teammate's mailbox relay had queued (one sent just before a shutdown request that
/// ended it at once). What the team answered to control letters is left out.
fn unread_messages(inbox: &PendingQueue) -> (Vec<String>, Vec<String>) {
    let (mut messages, mut letters) = (Vec::new(), Vec::new());
    for m in inbox.drain() {
        if m.origin == crate::base::pending::SEND_MESSAGE_ORIGIN {
            messages.push(m.text);
        } else if m.origin == crate::base::pending::MAILBOX_ORIGIN {
            letters.push(m.text);
        }
    }
    (messages, letters)
}

/// Adds to `n`'s note the messages (`unread`) and letters a child ended without reading.
// Out of line and cold: most children end with none, and their finish stays compact.
#[cold]
#[inline(never)]
fn note_undelivered(n: &mut TaskNotification, unread: &[String], letters: &[String]) {
    let lines = [
        (!unread.is_empty()).then(|| {
            format!(
                "{} message(s) arrived after it stopped reading: {}",
                unread.len(),
                unread.join(" ")
            )
        }),
        // Still in its inbox (the mailbox keeps a letter until it is read): the next
        // teammate of its name reads them.
        (!letters.is_empty()).then(|| {
            format!(
                "{} letter(s) it had not read stay in its inbox, for the next teammate of \
                 its name: {}",
                letters.len(),
                letters.join(" ")
            )
        }),
    ];
    for line in lines.into_iter().flatten() {
        n.note = Some(match n.note.take() {
            Some(note) => format!("{note}; {line}"),
            None => line,
        });
    }
}

/// Names a kept worktree in the notification, and why it was kept.
fn keep(n: &mut TaskNotification, wt: &crate::worktree::Worktree, why: &str) {
    n.worktree = Some(forkhive_core::notification::WorktreeReport {
        path: wt.path().display().to_string(),
        branch: wt.branch().to_owned(),
    });
    let line = format!("worktree kept: {why}");
    n.note = Some(match n.note.take() {
        Some(note) => format!("{note}; {line}"),
        None => line,
    });
}

/// After a refused or failed move to the terminal state: whether to report. A record already
/// ended was ended by someone else (the exactly-once gate: do not report twice); any other
/// failure (a networked registry's error) must not lose the notification, so it is reported.
fn refused_or_failed(id: &TaskId, e: &Error, now: Option<TaskState>) -> bool {
    if now.is_some_and(TaskState::is_terminal) {
        tracing::warn!(task = %id, "already ended, not reporting twice: {e}");
        false
    } else {
        tracing::warn!(task = %id, "could not record the child's end ({e}); reporting it anyway");
        true
    }
}

impl TaskService {
    /// A service over `registry`, shared.
    pub fn new(registry: Arc<dyn TaskRegistry>, config: TaskConfig) -> Arc<Self> {
        Arc::new(Self::unshared(registry, config))
    }

    /// A service over `registry`, to be put behind an `Arc` by the caller (for
    /// [`Extensions::get_or_insert_with`](crate::runtime::Extensions::get_or_insert_with)).
    pub fn unshared(registry: Arc<dyn TaskRegistry>, config: TaskConfig) -> Self {
        Self {
            registry,
            live: AtomicUsize::new(0),
            per_agent: Mutex::default(),
            tokens: Mutex::default(),
            dormant: Mutex::default(),
            ended_names: Mutex::default(),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            config,
        }
    }

    /// The latest of `parent`'s children called `name` that has ended (among the last
    /// [`ENDED_NAMES`] named children to end), whether or not it can be resumed.
    pub fn ended_named(&self, parent: &TaskId, name: &str) -> Option<TaskId> {
        self.ended_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(p, n, _)| p == parent && n == name)
            .map(|(_, _, id)| *id)
    }

    /// Stops a running child, foreground or background (it ends `killed`). Returns whether
    /// the child was running.
    pub fn cancel(&self, id: &TaskId) -> bool {
        let token = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .map(|c| c.cancel.clone());
        token.map(|t| t.cancel()).is_some()
    }

    /// The parent of a running child (`None` once it has ended, or for an unknown id).
    pub fn parent_of(&self, id: &TaskId) -> Option<TaskId> {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .map(|c| c.parent)
    }

    /// The running children of `parent`, in no particular order.
    pub fn running_children(&self, parent: &TaskId) -> Vec<TaskId> {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, c)| c.parent == *parent)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Gives `message` to running child `to` — or, with `to_parent`, to its parent — through
    /// its pending queue: an agent reads it at its next tool-round boundary, or when it next
    /// waits. `None` when `to` is not running (it ended, or never was).
    pub fn send(&self, to: &TaskId, to_parent: bool, message: PendingMessage) -> Option<Sent> {
        // Pushed while the entry is held: a child's owner takes the entry away before it reads
        // what was left in the inbox, so a message is either read by it or refused here.
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let live = tokens.get(to)?;
        if to_parent {
            live.parent_inbox.push(message);
            Some(Sent::Parent(live.parent))
        } else {
            live.inbox.push(message);
            Some(Sent::Child(*to))
        }
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<dyn TaskRegistry> {
        &self.registry
    }

    /// The configuration.
    pub fn config(&self) -> &TaskConfig {
        &self.config
    }

    /// Children alive in the tree now (holding a capacity slot).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Children whose owner has not finished with them yet (see [`wait_idle`](Self::wait_idle)).
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// How many children of `parent` this service runs now (each holds a slot).
    fn live_children(&self, parent: &TaskId) -> usize {
        self.per_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(parent)
            .copied()
            .unwrap_or(0)
    }

    /// Takes a capacity slot for a child of `parent`, or says which cap is full
    /// ([`Error::Capacity`]).
    pub fn acquire(self: &Arc<Self>, parent: TaskId) -> Result<Slot> {
        let mut per = self.per_agent.lock().unwrap_or_else(|e| e.into_inner());
        let mine = per.get(&parent).copied().unwrap_or(0);
        if mine >= self.config.max_children_per_agent {
            return Err(Error::Capacity {
                parent,
                message: format!(
                    "this agent already has {mine} live children, the most it may have; wait \
                     for one to finish, or do the work yourself"
                ),
            });
        }
        let live = self.live.fetch_add(1, Ordering::AcqRel);
        if live >= self.config.max_children_per_tree {
            self.live.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Capacity {
                parent,
                message: format!(
                    "the agent tree already has {live} live agents, the most it may have; wait \
                     for one to finish, or do the work yourself"
                ),
            });
        }
        *per.entry(parent).or_default() += 1;
        Ok(Slot {
            service: Arc::clone(self),
            parent,
        })
    }

    /// Waits for the first moment no child is active: every child started has ended and its
    /// owner has finished with it (notified, recorded). Children started while it waits are
    /// waited for too. Any number of callers may wait at once.
    pub async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.active.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Starts a background child; its notification will reach `launch.parent_queue` exactly
    /// once. Returns the child's task id. (The same as [`start`](Self::start) with
    /// [`Mode::Background`].)
    pub async fn launch(self: &Arc<Self>, launch: Launch) -> Result<TaskId> {
        Ok(self.start(launch, Mode::Background).await?.id())
    }

    /// Registers a child and starts it under its owner (see [`TaskService`]): in the
    /// background, reporting through one notification, or in the foreground, reporting through
    /// the returned handle.
    // A plain `fn`: an `async fn` here would hold the launch again beside `start_as`'s future,
    // and every `Agent` call's future holds this one.
    pub fn start(
        self: &Arc<Self>,
        launch: Launch,
        mode: Mode,
    ) -> impl Future<Output = Result<ChildHandle>> + Send + '_ {
        self.start_as(launch, mode, None)
    }

    /// [`start`](Self::start), or — with `resumed`, the recipe it was revived from — the next
    /// run of an ended task whose record [`revive`](Self::revive) has already reopened.
    // A plain `fn` taking the launch apart before its `async move` block: each part is held
    // once. (An `async fn` holds its arguments twice — as given and as bound — and its
    // future is part of every `Agent` call's.)
    fn start_as(
        self: &Arc<Self>,
        launch: Launch,
        mode: Mode,
        // Boxed: a fresh start has none.
        resumed: Option<Box<revive::Recipe>>,
    ) -> impl Future<Output = Result<ChildHandle>> + Send + '_ {
        let Launch {
            mut agent,
            first,
            description,
            tool_use_id,
            parent_queue,
            progress,
            output,
            slot,
            gate,
            events,
            ledger,
            parent_turn,
            deadline,
            worktree,
            name,
        } = launch;
        async move {
            let reopened = resumed.is_some();
            let id = *agent.id();
            let parent = agent.context().parent().copied().unwrap_or(id);
            let agent_type = agent_type_of(&agent);
            // Reachable (to stop, to message) from here on; a name is claimed in the same step it
            // is checked, so two children started together cannot both take it.
            let cancel = agent.cancellation().clone();
            let mut tree_users = None;
            let taken = {
                let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
                let taken = match &name {
                    Some(n) if !reopened => self.holder_in(&tokens, &parent, n),
                    _ => None,
                };
                if reopened {
                    // Live again: no longer resumable, in the same step.
                    self.dormant
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take(&id);
                }
                if taken.is_none() {
                    // A child with a worktree of its own holds it for its descendants; any other
                    // holds its parent's tree, if its parent works in one.
                    let tree_hold = match &worktree {
                        Some(_) => {
                            let (hold, held) = mpsc::channel(1);
                            tree_users = Some(held);
                            Some(hold)
                        }
                        None => tokens.get(&parent).and_then(|p| p.tree_hold.clone()),
                    };
                    tokens.insert(
                        id,
                        LiveChild {
                            cancel: cancel.clone(),
                            parent,
                            name: name.clone(),
                            inbox: agent.shared().pending.clone(),
                            parent_inbox: parent_queue.clone(),
                            tree_hold,
                        },
                    );
                }
                taken
            };
            if let (Some(other), Some(n)) = (taken, &name) {
                if let Some(wt) = worktree {
                    // Boxed, like every worktree future here: a start without one stays small.
                    let _ = Box::pin(wt.finish()).await;
                }
                return Err(Error::Refused(format!(
                    "the name `{n}` is taken by task {other}; give this agent another name"
                )));
            }
            // Until its owner exists, a start that fails or is dropped takes the entry away again.
            let mut claim = Claim {
                service: self,
                id: Some(id),
                recorded: false,
            };
            let mut record = TaskRecord::new(id, parent, description);
            record.agent_type = agent_type;
            record.transcript = agent.transcript_path().map(PathBuf::from);
            record.output = output.as_ref().map(|o| o.path().to_path_buf());
            // Not started if the registry refuses it: a worktree made for it is finished here, the
            // one owner it has until then.
            let registered = match reopened {
                true => Ok(()),
                false => {
                    // From here a dropped start ends the record (its write may land unanswered).
                    claim.recorded = true;
                    let limit = self.config.registry_timeout;
                    let create = self.registry.create(record.clone());
                    match bounded(limit, &id, "making its record", create).await {
                        Ok(Ok(())) => {
                            let running = self.registry.transition(&id, TaskState::Running);
                            bounded(limit, &id, "moving its record to running", running)
                                .await
                                .and_then(|moved| moved.map(|_| ()))
                        }
                        Ok(Err(e)) => {
                            // Not made: nothing to end.
                            claim.recorded = false;
                            Err(e)
                        }
                        // Unanswered: it may have been made, and is ended as a dropped start's.
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(e) = registered {
                claim.abandon().await;
                // Messages sent to it by name in the meantime go back to its parent, with why.
                let (unread, _) = unread_messages(&agent.pending());
                if !unread.is_empty() {
                    parent_queue.push(PendingMessage::new(
                        format!(
                            "task {id} could not start ({}), so these messages to it were not \
                         delivered: {}",
                            error_chain(&e),
                            unread.join(" ")
                        ),
                        crate::base::pending::SEND_MESSAGE_ORIGIN,
                    ));
                }
                if let Some(wt) = worktree {
                    let _ = Box::pin(wt.finish()).await;
                }
                return Err(e);
            }
            // Started: the parent's ledger and sink hear of it before the child's first event.
            let background = mode == Mode::Background;
            if let Some(ledger) = &ledger {
                ledger.started(
                    id,
                    record.agent_type.clone(),
                    agent.params().model().to_owned(),
                    record.description.clone(),
                    background,
                );
            }
            if let Some(sink) = &events {
                sink.emit(AgentEvent {
                    agent: parent,
                    turn: parent_turn,
                    kind: EventKind::ChildStarted {
                        task: id,
                        agent_type: record.agent_type.clone(),
                        description: record.description.clone(),
                        background,
                        resumed: reopened,
                    },
                });
            }
            // A cancelled child first waits up to its own `cancel_grace` for its children; it is
            // dropped only `kill_grace` after that, so its stop record is never cut off.
            let grace = agent.shared().limits.cancel_grace + self.config.kill_grace;
            let deadline = deadline.or(match mode {
                Mode::Background => self.config.deadline,
                Mode::Foreground => None,
            });
            let (report, end) = match mode {
                Mode::Foreground => {
                    let (tx, rx) = oneshot::channel();
                    (Some(tx), Some(rx))
                }
                Mode::Background => (None, None),
            };
            // What resuming it for a message needs: a background child that keeps a transcript.
            let revive = match (mode, &record.transcript) {
                (Mode::Background, Some(path)) if self.config.max_resumable > 0 => {
                    let mut recipe = resumed
                        .unwrap_or_else(|| Box::new(revive::Recipe::of(&agent, path.clone())));
                    recipe.set(
                        name,
                        deadline,
                        worktree.as_ref().and_then(|w| w.get().cloned()),
                    );
                    Some(recipe)
                }
                _ => None,
            };
            claim.disarm();
            let promise = crate::base::pending::OwnedPromise::new(&parent_queue);
            let handle = promise.handle();
            let held = promise.held();
            // Who hears of a stall, when there is a stall check (none is kept without one).
            let stall_sink = self.config.stall_after.and(events.clone());
            let waiting = agent.shared().halt.clone();
            let mut guard = ChildGuard::new(Box::new(Owned {
                service: Arc::clone(self),
                record,
                mode,
                cancel: cancel.clone(),
                slot: Some(slot),
                promise,
                progress: Arc::clone(&progress),
                output,
                tool_use_id,
                events,
                ledger,
                worktree: worktree
                    .and_then(crate::worktree::Unfinished::take)
                    .map(Box::new),
                tree_users: tree_users.map(|held| {
                    Box::new(TreeUsers {
                        held,
                        limit: grace + TREE_SETTLE,
                    })
                }),
                report,
                revive,
                _settled: None,
                _active: Active::new(self),
            }));
            // The child runs inside its supervisor's task (one task per child, not two): the
            // supervisor polls it, catches its panic, and drops it if it must be stopped and its
            // grace passes. It is boxed here, once: the task holds a pointer to it, not a copy of
            // its bytes that the supervisor would move into a box of its own.
            let child = Box::pin(async move {
                if let Some(gate) = gate {
                    gate.0.await;
                }
                let run = match first {
                    FirstInput::Prompt(p) => agent.run(p).await,
                    FirstInput::Continue => agent.continue_run().await,
                    FirstInput::Custom(run) => run(&mut agent, handle).await,
                };
                (run, agent)
            });
            let service = Arc::clone(self);
            // Both halves are boxed so the task itself stays small: thousands of children that
            // have not started yet hold little more than their agents.
            tokio::spawn(async move {
                let watch = Watch {
                    cancel: &cancel,
                    progress: &progress,
                    id: &id,
                    deadline,
                    grace,
                    held,
                    waiting,
                    stall_sink: stall_sink.as_ref(),
                };
                let ended = Box::pin(service.supervise(child, watch, guard.report_mut())).await;
                Box::pin(guard.finish(ended)).await;
            });
            Ok(ChildHandle { id, end })
        }
    }

    /// The task that holds `name` among `parent`'s running and resumable children, if one
    /// does. A start checks again when it claims the name (two starts may race to it); this
    /// lets a caller refuse before it makes anything for the child (its transcript, its
    /// output file, its worktree).
    pub(crate) fn name_holder(&self, parent: &TaskId, name: &str) -> Option<TaskId> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        self.holder_in(&tokens, parent, name)
    }

    /// [`name_holder`](Self::name_holder), with the live children's map already locked.
    fn holder_in(&self, tokens: &IdMap<LiveChild>, parent: &TaskId, name: &str) -> Option<TaskId> {
        tokens
            .iter()
            .find(|(_, c)| c.parent == *parent && c.name.as_deref() == Some(name))
            .map(|(id, _)| *id)
            .or_else(|| {
                self.dormant
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .named(parent, name)
            })
    }

    async fn supervise(
        &self,
        child: impl Future<Output = (AgentRun, crate::runtime::Agent)> + Send + Unpin,
        watch: Watch<'_>,
        mut report: Option<&mut oneshot::Sender<ChildEnd>>,
    ) -> Ended {
        use futures::FutureExt;
        let Watch {
            cancel,
            progress,
            id,
            deadline,
            grace,
            mut held,
            waiting,
            stall_sink,
        } = watch;
        // Already boxed by the caller: catching its panic needs no second box.
        let mut child = std::panic::AssertUnwindSafe(child).catch_unwind();
        // Timers only for what is configured: a child without a deadline or stall check
        // registers none.
        let mut sleep = deadline.map(|d| Box::pin(tokio::time::sleep(d)));
        let check = self
            .config
            .stall_after
            .map(|s| (s / 4).clamp(Duration::from_millis(10), Duration::from_secs(5)));
        let mut ticker = check.map(|c| {
            let mut t = tokio::time::interval(c);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut stalled = false;
        // The event count at the last check that saw it move, and when that was.
        let mut seen = (progress.events(), Instant::now());
        // What is left of the deadline while the child waits for work (its promise set down).
        let mut paused: Option<Duration> = None;
        let joined = loop {
            let working = paused.is_none();
            tokio::select! {
                biased;
                r = &mut child => break Ok(r),
                () = until(sleep.as_mut()), if working => {
                    break Err(Why::Deadline(deadline.unwrap_or_default()))
                }
                now_held = held.changed() => {
                    let now = tokio::time::Instant::now();
                    match (now_held, paused) {
                        // Set down: stop the clocks.
                        (false, None) => {
                            let left = |s: &std::pin::Pin<Box<tokio::time::Sleep>>| {
                                s.deadline().saturating_duration_since(now)
                            };
                            paused = Some(sleep.as_ref().map_or(Duration::ZERO, left));
                        }
                        // Taken up: the deadline goes on with what was left, the stall check
                        // from now.
                        (true, Some(left)) => {
                            paused = None;
                            if let Some(s) = sleep.as_mut() {
                                s.as_mut().reset(now + left);
                            }
                            seen = (progress.events(), Instant::now());
                        }
                        _ => {}
                    }
                }
                () = closed(report.as_deref_mut()) => break Err(Why::Abandoned),
                // Cancelled from outside (its parent, `TaskService::cancel`): the same grace,
                // so a child that ignores its token is still dropped and reported.
                () = cancel.cancelled() => break Err(Why::Cancelled),
                () = tick(ticker.as_mut()), if !stalled && working => {
                    let now = Instant::now();
                    let events = progress.events();
                    if events != seen.0 || (waiting.is_waiting() && self.live_children(id) > 0) {
                        // Moved on, or waits at the end of its turn for children this service
                        // runs: quiet, not stuck. They are checked on their own; its clock
                        // starts again from here. (Waiting for anything else — a pool's task,
                        // a promise nobody keeps — it is flagged like any quiet child.)
                        seen = (events, now);
                    } else if let Some(after) = self.config.stall_after
                        && now.duration_since(seen.1) >= after
                    {
                        stalled = true;
                        let quiet_for = now.duration_since(seen.1);
                        tracing::warn!(task = %id, "no progress for {quiet_for:?}: stalled");
                        // Marked first: a host that reads the record on the event sees it.
                        let _ = self.registry.mark_stalled(id).await;
                        if let Some(sink) = stall_sink {
                            sink.emit(AgentEvent {
                                agent: *id,
                                turn: progress.turns(),
                                kind: EventKind::Stalled { quiet_for },
                            });
                        }
                    }
                }
            }
        };
        // The agent is dropped apart from its run: a destructor that panics after a good run
        // must not turn it into a failure.
        let from_join = |r: std::thread::Result<(AgentRun, crate::runtime::Agent)>| match r {
            Ok((run, agent)) => {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(agent)))
                    .is_err()
                {
                    tracing::warn!(task = %id, "dropping the finished child panicked");
                }
                Ok(run)
            }
            Err(panic) => Err(panic_message(panic.as_ref())),
        };
        let ended = match joined {
            Ok(r) => match from_join(r) {
                Ok(run) => Ended::Ran(run),
                Err(msg) => Ended::Panicked(msg),
            },
            Err(why) => {
                cancel.cancel();
                match tokio::time::timeout(grace, &mut child).await {
                    Ok(r) => match from_join(r) {
                        Ok(run) => Ended::Stopped {
                            run: Some(run),
                            why,
                        },
                        Err(msg) => Ended::Panicked(msg),
                    },
                    // The child is dropped below: nothing of it runs on.
                    Err(_) => Ended::Stopped { run: None, why },
                }
            }
        };
        // A child past its grace is dropped mid-run; a destructor of its state that panics
        // must not take the notification with it.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(child))).is_err() {
            tracing::warn!(task = %id, "dropping the stopped child panicked");
        }
        ended
    }
}

/// What a supervisor watches a child with.
struct Watch<'a> {
    cancel: &'a CancellationToken,
    progress: &'a Progress,
    id: &'a TaskId,
    deadline: Option<Duration>,
    grace: Duration,
    /// Whether the child holds its promise: while it has set it down (a teammate waiting for
    /// work) its deadline and stall check stand still.
    held: crate::base::pending::HeldWatch,
    /// The child's halt, which says whether it waits at the end of its turn for what it was
    /// promised: while it waits for children of this service, it is not stalled.
    waiting: crate::base::pending::Halt,
    /// The parent's sink, told of a stall.
    stall_sink: Option<&'a Arc<dyn EventSink>>,
}

/// Waits for `sleep`, or forever when there is none.
async fn until(sleep: Option<&mut std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match sleep {
        Some(s) => s.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Waits until the receiver of a foreground child's end is gone, or forever for a background
/// child.
async fn closed<T>(report: Option<&mut oneshot::Sender<T>>) {
    match report {
        Some(tx) => tx.closed().await,
        None => std::future::pending().await,
    }
}

/// The next tick of `ticker`, or never when there is none.
async fn tick(ticker: Option<&mut tokio::time::Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The most bytes of a child's answer its notification (and so, in the foreground, its tool
/// result) carries: the rest would be sent again with every later request of its parent. A
/// longer answer is cut at a character boundary and says so, and names the child's output file
/// (which has more of it, up to the file's own cap) when it has one.
pub const RESULT_CAP: usize = 100_000;

/// `answer`, cut to [`RESULT_CAP`] bytes if longer, with a line saying so (and naming the
/// output file at `output`, which has more).
pub(crate) fn cap_answer(mut answer: String, output: Option<&std::path::Path>) -> String {
    if answer.len() <= RESULT_CAP {
        return answer;
    }
    answer.truncate(boundary_at_most(&answer, RESULT_CAP));
    match output {
        Some(path) => answer.push_str(&format!(
            "\n[truncated; its output file {} has more]",
            path.display()
        )),
        None => answer.push_str("\n[truncated]"),
    }
    answer
}

/// The last character boundary of `s` at or before byte `at`.
fn boundary_at_most(s: &str, at: usize) -> usize {
    let mut cut = at.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// A notification's note, cut to [`RESULT_CAP`] bytes if longer (the messages and letters it
/// lists are each capped, their number is not), saying so.
pub(crate) fn cap_note(mut note: String) -> String {
    if note.len() <= RESULT_CAP {
        return note;
    }
    let cut = boundary_at_most(&note, RESULT_CAP);
    let dropped = note.len() - cut;
    note.truncate(cut);
    note.push_str(&format!(" [truncated: {dropped} bytes more]"));
    note
}

/// The notification for a child that ended as `ended` (built by trusted code only).
fn notification(
    record: &TaskRecord,
    ended: &Ended,
    progress: &Progress,
    tool_use_id: Option<String>,
    output: Option<&OutputFile>,
) -> TaskNotification {
    use forkhive_core::TaskStatus::{Completed, Failed, Killed};
    let d = &record.description;
    let (status, summary, result, note) = match ended {
        Ended::Ran(run) | Ended::Stopped { run: Some(run), .. } => {
            // One mapping of stop reasons to ends, shared with the foreground and `verify`.
            let status = run.stop.task_status();
            let summary = match (&run.stop, status) {
                // Every finished child's: concatenated, not formatted.
                (StopReason::Completed, _) => ["Agent \"", d, "\" finished"].concat(),
                (_, Completed) => format!("Agent \"{d}\" {}", run.stop),
                (_, Killed) => format!("Agent \"{d}\" was stopped"),
                (StopReason::Refusal, _) => format!("Agent \"{d}\" failed: the model refused"),
                _ => {
                    let why = run
                        .error
                        .as_ref()
                        .map(|e| error_chain(e.as_ref()))
                        .unwrap_or_else(|| run.stop.to_string());
                    format!("Agent \"{d}\" failed: {why}")
                }
            };
            // Nothing is lost: a run that ended early without a complete answer reports the
            // text it had streamed.
            let result = if run.final_text.is_empty() && status != Completed {
                progress.last_text()
            } else {
                run.final_text.clone()
            };
            // A cancelled or killed run that says why it was stopped (a teammate whose
            // shutdown outran its grace) gives that; a deadline, a drop or an abandoned call
            // says its own.
            let said = || run.error.as_ref().map(|e| error_chain(e.as_ref()));
            let note = match ended {
                Ended::Stopped {
                    why: Why::Cancelled,
                    ..
                } if status == Killed => said(),
                Ended::Stopped { why, .. } if status == Killed => why.note(),
                Ended::Ran(_) if status == Killed => said(),
                _ => None,
            };
            (status, summary, result, note)
        }
        Ended::Panicked(msg) => (
            Failed,
            format!("Agent \"{d}\" failed: it panicked: {msg}"),
            progress.last_text(),
            None,
        ),
        Ended::Stopped { run: None, why } => (
            Killed,
            format!("Agent \"{d}\" was stopped"),
            progress.last_text(),
            why.note(),
        ),
    };
    let mut usage = ended
        .run()
        .map(|r| r.usage)
        .unwrap_or_else(|| progress.usage());
    usage.tool_uses = progress.tool_uses();
    usage.duration_ms = u64::try_from(progress.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut n = TaskNotification::new(record.id, status, summary, usage.to_notification());
    if !result.is_empty() {
        n = n.with_result(cap_answer(result, output.map(OutputFile::path)));
    }
    n.tool_use_id = tool_use_id;
    n.output_file = output.map(|o| o.path().display().to_string());
    let transcript = (status != Completed)
        .then(|| {
            record
                .transcript
                .as_ref()
                .map(|p| format!("transcript: {}", p.display()))
        })
        .flatten();
    n.note = match (note, transcript) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    n
}

/// An error and its causes, joined with `: `.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    forkhive_core::error::chain(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    /// A note longer than the cap is cut at a character boundary and says how much was cut;
    /// a shorter one is kept whole.
    #[test]
    fn a_long_note_is_cut_and_says_so() {
        assert_eq!(cap_note("short".into()), "short");
        let note = format!("{}é{}", "a".repeat(RESULT_CAP - 1), "b".repeat(10));
        let cut = cap_note(note.clone());
        assert_eq!(
            cut,
            format!(
                "{} [truncated: {} bytes more]",
                "a".repeat(RESULT_CAP - 1),
                12
            )
        );
    }

    /// Every child of a wide fan-out that has not run yet holds its owner (and its agent, in
    /// the future the task polls): 10,000 of them at once is the fan-out the docs measure. A
    /// field that grows these is a decision to take knowingly (box what is rare).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn what_an_unstarted_child_holds_stays_small() {
        let owned = std::mem::size_of::<Owned>();
        assert!(owned <= 416, "task::Owned grew to {owned} bytes (was 416)");
        let agent = std::mem::size_of::<crate::runtime::Agent>();
        assert!(
            agent <= 208,
            "runtime::Agent grew to {agent} bytes (was 208)"
        );
    }

    /// Whether a child's last run said it stopped: set by its `Stopped`, cleared by the next
    /// run's first turn (its owner then says it for a run dropped mid-way, and only then).
    #[test]
    fn progress_knows_whether_the_last_run_said_it_stopped() {
        let p = Progress::default();
        let agent = TaskId::generate(TaskKind::Agent);
        let event = |kind| AgentEvent {
            agent,
            turn: 1,
            kind,
        };
        assert!(!p.stopped.load(Ordering::Acquire));
        p.observe(&event(EventKind::TurnStarted));
        p.observe(&event(EventKind::Stopped {
            reason: StopReason::Completed,
            usage: Usage::default(),
        }));
        assert!(p.stopped.load(Ordering::Acquire));
        p.observe(&event(EventKind::Warning {
            message: "idle".into(),
        }));
        assert!(p.stopped.load(Ordering::Acquire));
        p.observe(&event(EventKind::TurnStarted));
        assert!(!p.stopped.load(Ordering::Acquire));
    }

    #[test]
    fn a_child_sink_counts_only_its_own_events_and_forwards_all() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let child = TaskId::generate(TaskKind::Agent);
        let grandchild = TaskId::generate(TaskKind::Agent);
        let sink = ChildSink {
            child,
            progress: Arc::new(Progress::default()),
            output: None,
            forward: Some(Arc::new(tx)),
        };
        let event = |agent, kind| AgentEvent {
            agent,
            turn: 1,
            kind,
        };
        sink.emit(event(child, EventKind::TurnStarted));
        sink.emit(event(grandchild, EventKind::TurnStarted));
        sink.emit(event(
            grandchild,
            EventKind::TextDelta {
                text: "not mine".into(),
            },
        ));
        sink.emit(event(
            grandchild,
            EventKind::ResponseReceived {
                usage: Usage {
                    output_tokens: 7,
                    ..Usage::default()
                },
                stop_reason: None,
            },
        ));
        assert_eq!(sink.progress.turns(), 1);
        assert_eq!(sink.progress.last_text(), "");
        assert_eq!(sink.progress.usage().output_tokens, 0);
        let mut forwarded = 0;
        while rx.try_recv().is_ok() {
            forwarded += 1;
        }
        assert_eq!(forwarded, 4);
    }
}
