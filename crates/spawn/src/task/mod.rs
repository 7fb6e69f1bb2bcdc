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
//!   ([`Expectation`](crate::runtime::Expectation)), so a parent that ends its turn waits for
//!   it, and it arrives after the next tool results or starts a new turn;
//! - the registry's terminal transition is the gate: only the supervisor whose transition
//!   succeeded delivers, so a task is notified exactly once;
//! - a deadline cancels the child and synthesizes `killed`; a panic yields `failed`; a
//!   cancelled parent cancels every descendant, and each still yields its notification —
//!   carrying the child's last assistant text and its transcript path, so nothing is lost;
//! - a child's capacity slot is freed the moment it ends; a child that shows no progress for
//!   a while is reported as stalled before its deadline.

pub mod output;
pub mod registry;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use forkhive_core::{TaskId, TaskNotification, Usage};
use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

use crate::error::Result;
use crate::runtime::events::{AgentEvent, EventKind, EventSink};
use crate::runtime::outcome::{AgentRun, StopReason};
use crate::runtime::pending::{PendingMessage, PendingQueue};
use crate::tool::orchestrate::panic_message;

pub use output::{OutputConfig, OutputFile};
pub use registry::{MemoryTaskRegistry, TaskRecord, TaskRegistry, TaskState};

/// How background children are supervised.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// How long a child may run before it is cancelled and reported `killed` (`None`: no
    /// deadline).
    pub deadline: Option<Duration>,
    /// How long without any event before a child is reported as stalled (`None`: never).
    pub stall_after: Option<Duration>,
    /// How long a cancelled child gets to stop before its task is aborted.
    pub kill_grace: Duration,
    /// Where output files go (`None`: none are written).
    pub output: Option<OutputConfig>,
    /// Most live children of one agent.
    pub max_children_per_agent: usize,
    /// Most live children in the whole tree.
    pub max_children_per_tree: usize,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            deadline: Some(Duration::from_secs(30 * 60)),
            stall_after: Some(Duration::from_secs(45)),
            kill_grace: Duration::from_secs(2),
            output: None,
            max_children_per_agent: 32,
            max_children_per_tree: 256,
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
            }
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
                EventKind::ToolCallStarted { name, id } => {
                    out.append(&format!("\n[tool {name} {id}]\n"))
                }
                EventKind::Stopped { reason, .. } => {
                    out.append(&format!("\n[stopped: {reason}]\n"))
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

/// The background-task service of one tree: the registry, the supervisors, the capacity
/// counters. Reach it through [`TreeState::extensions`](crate::runtime::TreeState::extensions).
pub struct TaskService {
    registry: Arc<dyn TaskRegistry>,
    tracker: TaskTracker,
    live: AtomicUsize,
    per_agent: Mutex<HashMap<TaskId, usize>>,
    tokens: Mutex<HashMap<TaskId, tokio_util::sync::CancellationToken>>,
    config: TaskConfig,
}

impl fmt::Debug for TaskService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskService")
            .field("live", &self.live.load(Ordering::Relaxed))
            .field("supervisors", &self.tracker.len())
            .finish_non_exhaustive()
    }
}

/// How a child's run is started.
#[derive(Debug)]
pub enum FirstInput {
    /// `Agent::run(prompt)`.
    Prompt(String),
    /// `Agent::continue_run()` (the conversation already ends with the child's message).
    Continue,
}

/// Everything the supervisor needs about one background child.
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
    /// The parent's queue, which receives the notification.
    pub parent_queue: PendingQueue,
    /// Its progress (fed by its [`ChildSink`]).
    pub progress: Arc<Progress>,
    /// Its output file.
    pub output: Option<Arc<OutputFile>>,
    /// Its capacity slot.
    pub slot: Slot,
    /// Work to await before the child starts (a cache-warm fan-out gate).
    pub gate: Option<Gate>,
    /// Where to report [`EventKind::Notified`] once the notification is queued (normally
    /// the parent's sink, so a host sees the whole tree).
    pub events: Option<Arc<dyn EventSink>>,
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

/// How a child ended, as the supervisor saw it.
enum Ended {
    Ran(AgentRun),
    Panicked(String),
    Deadline {
        run: Option<AgentRun>,
        after: Duration,
    },
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
            tracker: TaskTracker::new(),
            live: AtomicUsize::new(0),
            per_agent: Mutex::default(),
            tokens: Mutex::default(),
            config,
        }
    }

    /// Stops a running background task (its notification says `killed`). Returns whether the
    /// task was running.
    pub fn cancel(&self, id: &TaskId) -> bool {
        let token = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        token.map(|t| t.cancel()).is_some()
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<dyn TaskRegistry> {
        &self.registry
    }

    /// The configuration.
    pub fn config(&self) -> &TaskConfig {
        &self.config
    }

    /// Children alive in the tree now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Takes a capacity slot for a child of `parent`, or says which cap is full.
    pub fn acquire(self: &Arc<Self>, parent: TaskId) -> std::result::Result<Slot, String> {
        let mut per = self.per_agent.lock().unwrap_or_else(|e| e.into_inner());
        let mine = per.get(&parent).copied().unwrap_or(0);
        if mine >= self.config.max_children_per_agent {
            return Err(format!(
                "this agent already has {mine} live children, the most it may have; wait for \
                 one to finish, or do the work yourself"
            ));
        }
        let live = self.live.fetch_add(1, Ordering::AcqRel);
        if live >= self.config.max_children_per_tree {
            self.live.fetch_sub(1, Ordering::AcqRel);
            return Err(format!(
                "the agent tree already has {live} live agents, the most it may have; wait for \
                 one to finish, or do the work yourself"
            ));
        }
        *per.entry(parent).or_default() += 1;
        Ok(Slot {
            service: Arc::clone(self),
            parent,
        })
    }

    /// Waits until every supervisor has delivered (close the service to stop new ones).
    pub async fn wait_idle(&self) {
        self.tracker.close();
        self.tracker.wait().await;
        self.tracker.reopen();
    }

    /// Registers a child and starts it in the background; its notification will reach
    /// `launch.parent_queue` exactly once. Returns the child's task id.
    pub async fn launch(self: &Arc<Self>, launch: Launch) -> Result<TaskId> {
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
        } = launch;
        let id = *agent.id();
        let parent = agent.context().parent().copied().unwrap_or(id);
        let mut record = TaskRecord::new(id, parent, description.clone());
        record.transcript = agent.transcript_path().map(PathBuf::from);
        record.output = output.as_ref().map(|o| o.path().to_path_buf());
        self.registry.create(record.clone()).await?;
        self.registry.transition(&id, TaskState::Running).await?;
        let promise = parent_queue.expect();
        let cancel = agent.cancellation().clone();
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, cancel.clone());
        // The child runs inside its supervisor's task (one task per child, not two): the
        // supervisor polls it, catches its panic, and drops it if its deadline and grace pass.
        let child = async move {
            if let Some(gate) = gate {
                gate.0.await;
            }
            match first {
                FirstInput::Prompt(p) => agent.run(p).await,
                FirstInput::Continue => agent.continue_run().await,
            }
        };
        let service = Arc::clone(self);
        // Both halves are boxed so the task itself stays small: thousands of children that
        // have not started yet hold little more than their agents.
        self.tracker.spawn(async move {
            let ended = Box::pin(service.supervise(child, &cancel, &progress, &id)).await;
            drop(slot);
            Box::pin(service.report(
                record,
                ended,
                progress,
                tool_use_id,
                output,
                promise,
                events,
            ))
            .await;
        });
        Ok(id)
    }

    /// Frees the child's cancellation handle, rolls its usage up, moves it to its terminal
    /// state, and delivers its notification (once: a refused transition delivers nothing).
    #[allow(clippy::too_many_arguments)]
    async fn report(
        &self,
        record: TaskRecord,
        ended: Ended,
        progress: Arc<Progress>,
        tool_use_id: Option<String>,
        output: Option<Arc<OutputFile>>,
        promise: crate::runtime::pending::Expectation,
        events: Option<Arc<dyn EventSink>>,
    ) {
        let id = record.id;
        let service = self;
        {
            service
                .tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            let n = notification(&record, &ended, &progress, tool_use_id, output.as_deref());
            let usage = match &ended {
                Ended::Ran(run) | Ended::Deadline { run: Some(run), .. } => run.usage,
                _ => progress.usage(),
            };
            let _ = service.registry.roll_up(&id, usage).await;
            let state = match n.status {
                forkhive_core::TaskStatus::Completed => TaskState::Completed,
                forkhive_core::TaskStatus::Failed => TaskState::Failed,
                _ => TaskState::Killed,
            };
            match service.registry.transition(&id, state).await {
                Ok(_) => {
                    let (status, summary) = (n.status, n.summary.clone());
                    promise.deliver(PendingMessage::new(n.to_xml(), "task-notification"));
                    if let Some(sink) = events {
                        sink.emit(AgentEvent {
                            agent: id,
                            turn: progress.turns(),
                            kind: EventKind::Notified {
                                parent: record.parent,
                                status,
                                summary,
                            },
                        });
                    }
                }
                Err(e) => tracing::warn!(task = %id, "not notifying twice: {e}"),
            }
        }
    }

    async fn supervise(
        &self,
        child: impl Future<Output = AgentRun> + Send,
        cancel: &tokio_util::sync::CancellationToken,
        progress: &Progress,
        id: &TaskId,
    ) -> Ended {
        use futures::FutureExt;
        let deadline = self.config.deadline;
        let mut child = Box::pin(std::panic::AssertUnwindSafe(child).catch_unwind());
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
        let joined = loop {
            tokio::select! {
                biased;
                r = &mut child => break Some(r),
                () = until(sleep.as_mut()) => break None,
                () = tick(ticker.as_mut()), if !stalled => {
                    let now = Instant::now();
                    let events = progress.events();
                    if events != seen.0 {
                        seen = (events, now);
                    } else if let Some(after) = self.config.stall_after
                        && now.duration_since(seen.1) >= after
                    {
                        stalled = true;
                        tracing::warn!(
                            task = %id,
                            "no progress for {:?}: stalled",
                            now.duration_since(seen.1)
                        );
                        let _ = self.registry.mark_stalled(id).await;
                    }
                }
            }
        };
        let from_join = |r: std::thread::Result<AgentRun>| match r {
            Ok(run) => Ended::Ran(run),
            Err(panic) => Ended::Panicked(panic_message(panic.as_ref())),
        };
        let ended = match joined {
            Some(r) => from_join(r),
            None => {
                let after = deadline.unwrap_or_default();
                cancel.cancel();
                match tokio::time::timeout(self.config.kill_grace, &mut child).await {
                    Ok(Ok(run)) => Ended::Deadline {
                        run: Some(run),
                        after,
                    },
                    Ok(Err(panic)) => from_join(Err(panic)),
                    // The child is dropped below: nothing of it runs on.
                    Err(_) => Ended::Deadline { run: None, after },
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

/// Waits for `sleep`, or forever when there is none.
async fn until(sleep: Option<&mut std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match sleep {
        Some(s) => s.as_mut().await,
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
        Ended::Ran(run) => {
            let (status, summary) = match &run.stop {
                StopReason::Completed => (Completed, format!("Agent \"{d}\" finished")),
                StopReason::MaxTurns { limit } => (
                    Completed,
                    format!("Agent \"{d}\" stopped at its {limit}-turn limit"),
                ),
                StopReason::TokenBudget { .. }
                | StopReason::OutputLimit { .. }
                | StopReason::PauseLimit { .. } => {
                    (Completed, format!("Agent \"{d}\" {}", run.stop))
                }
                StopReason::Cancelled => (Killed, format!("Agent \"{d}\" was stopped")),
                StopReason::Refusal => (Failed, format!("Agent \"{d}\" failed: the model refused")),
                _ => {
                    let why = run
                        .error
                        .as_ref()
                        .map(|e| error_chain(e.as_ref()))
                        .unwrap_or_else(|| run.stop.to_string());
                    (Failed, format!("Agent \"{d}\" failed: {why}"))
                }
            };
            (status, summary, run.final_text.clone(), None)
        }
        Ended::Panicked(msg) => (
            Failed,
            format!("Agent \"{d}\" failed: it panicked: {msg}"),
            progress.last_text(),
            None,
        ),
        Ended::Deadline { run, after } => (
            Killed,
            format!("Agent \"{d}\" was stopped"),
            run.as_ref()
                .map(|r| r.final_text.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| progress.last_text()),
            Some(format!(
                "stopped by its {} deadline",
                crate::runtime::events::format_duration(*after)
            )),
        ),
    };
    let mut usage = match ended {
        Ended::Ran(run) | Ended::Deadline { run: Some(run), .. } => run.usage,
        _ => progress.usage(),
    };
    usage.tool_uses = progress.tool_uses();
    usage.duration_ms = u64::try_from(progress.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut n = TaskNotification::new(record.id, status, summary, usage.to_notification());
    if !result.is_empty() {
        n = n.with_result(result);
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
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

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
