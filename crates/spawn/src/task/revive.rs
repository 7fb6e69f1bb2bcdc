//! Giving an ended background child a message: it is resumed from its transcript, the message
//! after its last answer, and runs again under a new owner — its next request extends the
//! cache its last one left ("Coordinator Mode: A Working Multi-Agent System, From the Source —
//! SendMessage": a message to a worker that has finished resumes it). A message is never
//! dropped because its recipient is not running.
//!
//! When a background child that writes a transcript ends, its owner leaves a [`Dormant`] entry
//! in the same step that takes it off the live map, so a message sent at that moment finds the
//! child one way or the other. The entry holds what the child was built with ([`Recipe`]);
//! [`TaskService::revive`] waits until the previous owner is done (notified, worktree
//! settled), reopens the record, rebuilds the agent with [`Agent::resume`] and starts it again.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use forkhive_core::TaskId;
use forkhive_transport::{Backend, RequestSettings};
use tokio::sync::oneshot;

use super::{ChildSink, FirstInput, Launch, Mode, Progress, TaskService};
use crate::base::pending::{PendingMessage, PendingQueue};
use crate::error::{Error, Result};
use crate::runtime::{Agent, AgentKind, AgentShared, Limits, QuerySource};
use crate::tool::{PermissionPolicy, ToolPool};
use crate::worktree::{Unfinished, Worktree};

/// What a child was built with, to build it again from its transcript: the identity, model,
/// prompt, tools array and conversation come from the transcript; these supply the rest.
#[derive(Clone)]
pub(super) struct Recipe {
    backend: Arc<dyn Backend>,
    pool: ToolPool,
    policy: Arc<dyn PermissionPolicy>,
    limits: Limits,
    settings: RequestSettings,
    transcript: PathBuf,
    name: Option<String>,
    deadline: Option<Duration>,
    /// Its worktree (kept or removed when it ended): a resumed child works there again.
    worktree: Option<Worktree>,
    /// Its definition's hooks (a guard that blocks writes keeps blocking after a resume).
    own_hooks: crate::hook::Hooks,
    /// Its agent type (what `SubagentStop` hooks match).
    agent_type: Option<String>,
}

impl Recipe {
    /// The recipe of `agent`, which writes its transcript at `transcript`.
    pub(super) fn of(agent: &Agent, transcript: PathBuf) -> Self {
        let shared = agent.shared();
        Self {
            backend: Arc::clone(&shared.backend),
            pool: shared.pool.clone(),
            policy: Arc::clone(&shared.policy),
            limits: shared.limits.clone(),
            settings: shared.settings.clone(),
            transcript,
            name: None,
            deadline: None,
            worktree: None,
            own_hooks: shared.own_hooks.clone(),
            agent_type: shared.cx.agent_type().map(str::to_owned),
        }
    }

    /// Sets the run's name, deadline and worktree.
    pub(super) fn set(
        &mut self,
        name: Option<String>,
        deadline: Option<Duration>,
        worktree: Option<Worktree>,
    ) {
        self.name = name;
        self.deadline = deadline;
        self.worktree = worktree;
    }
}

/// An ended child that can be resumed.
pub(super) struct Dormant {
    parent: TaskId,
    description: String,
    /// Its record's type: a record forgotten meanwhile is made again with it.
    agent_type: String,
    recipe: Recipe,
    /// Resolves when the previous run's owner is done.
    settled: Option<oneshot::Receiver<()>>,
    /// Set while a resume is under way: the new run's queue, where messages sent meanwhile go.
    reviving: Option<PendingQueue>,
}

impl Dormant {
    pub(super) fn new(
        parent: TaskId,
        description: String,
        agent_type: String,
        recipe: Recipe,
        settled: oneshot::Receiver<()>,
    ) -> Self {
        Self {
            parent,
            description,
            agent_type,
            recipe,
            settled: Some(settled),
            reviving: None,
        }
    }
}

/// The resumable children, oldest first.
#[derive(Default)]
pub(super) struct Dormancy {
    map: super::IdMap<Dormant>,
    order: VecDeque<TaskId>,
}

impl Dormancy {
    /// Keeps `d` for `id`, forgetting the oldest past `max`.
    pub(super) fn put(&mut self, id: TaskId, d: Dormant, max: usize) {
        if self.map.insert(id, d).is_none() {
            self.order.push_back(id);
        }
        // The oldest first, but never one whose resume is under way (its claim holds it).
        while self.map.len() > max {
            let Some(at) = self
                .order
                .iter()
                .position(|o| self.map.get(o).is_none_or(|d| d.reviving.is_none()))
            else {
                break;
            };
            if let Some(old) = self.order.remove(at) {
                self.map.remove(&old);
            }
        }
    }

    /// The child of `parent` called `name`, if one is resumable.
    pub(super) fn named(&self, parent: &TaskId, name: &str) -> Option<TaskId> {
        self.map
            .iter()
            .find(|(_, d)| d.parent == *parent && d.recipe.name.as_deref() == Some(name))
            .map(|(id, _)| *id)
    }

    /// Removes `id` (its resumed run has started).
    pub(super) fn take(&mut self, id: &TaskId) -> Option<Dormant> {
        let d = self.map.remove(id)?;
        self.order.retain(|o| o != id);
        Some(d)
    }
}

/// Whom a name given to [`TaskService::named`] reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recipient {
    /// A running child of the caller.
    Running(TaskId),
    /// An ended child of the caller that can be resumed with the message.
    Resumable(TaskId),
}

/// A task its parent can send a message to (see [`TaskService::addresses`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Address {
    /// Its id.
    pub id: TaskId,
    /// The name it was started with.
    pub name: Option<String>,
    /// Running (`false`: ended, resumed by a message).
    pub running: bool,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ended = if self.running {
            ""
        } else {
            ", ended: a message resumes it"
        };
        match &self.name {
            Some(n) => write!(f, "{n} ({}{ended})", self.id),
            None if self.running => write!(f, "{}", self.id),
            None => write!(f, "{} ({})", self.id, &ended[2..]),
        }
    }
}

impl TaskService {
    /// The parent of an ended child that can be resumed (`None` for any other id).
    pub fn resumable_parent(&self, id: &TaskId) -> Option<TaskId> {
        self.lock_dormant().map.get(id).map(|d| d.parent)
    }

    /// The caller's children that can be resumed, in no particular order.
    pub fn resumable_children(&self, parent: &TaskId) -> Vec<TaskId> {
        self.lock_dormant()
            .map
            .iter()
            .filter(|(_, d)| d.parent == *parent)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Finds `parent`'s child called `name` (running first, then resumable). `Err` lists the
    /// ids when more than one has that name (possible only with a custom launcher: the Agent
    /// tool refuses a name already in use).
    pub fn named(
        &self,
        parent: &TaskId,
        name: &str,
    ) -> std::result::Result<Option<Recipient>, Vec<TaskId>> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let dormant = self.lock_dormant();
        let mut found: Vec<Recipient> = tokens
            .iter()
            .filter(|(_, c)| c.parent == *parent && c.name.as_deref() == Some(name))
            .map(|(id, _)| Recipient::Running(*id))
            .chain(
                dormant
                    .map
                    .iter()
                    .filter(|(_, d)| d.parent == *parent && d.recipe.name.as_deref() == Some(name))
                    .map(|(id, _)| Recipient::Resumable(*id)),
            )
            .collect();
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => {
                let mut ids: Vec<TaskId> = found
                    .into_iter()
                    .map(|r| match r {
                        Recipient::Running(id) | Recipient::Resumable(id) => id,
                    })
                    .collect();
                ids.sort();
                Err(ids)
            }
        }
    }

    /// The tasks `parent` can send a message to: its running children, then the ended ones
    /// that can be resumed, each sorted by id.
    pub fn addresses(&self, parent: &TaskId) -> Vec<Address> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let dormant = self.lock_dormant();
        let mut out: Vec<Address> = tokens
            .iter()
            .filter(|(_, c)| c.parent == *parent)
            .map(|(id, c)| Address {
                id: *id,
                name: c.name.clone(),
                running: true,
            })
            .chain(
                dormant
                    .map
                    .iter()
                    .filter(|(_, d)| d.parent == *parent)
                    .map(|(id, d)| Address {
                        id: *id,
                        name: d.recipe.name.clone(),
                        running: false,
                    }),
            )
            .collect();
        out.sort_by(|a, b| b.running.cmp(&a.running).then(a.id.cmp(&b.id)));
        out
    }

    fn lock_dormant(&self) -> std::sync::MutexGuard<'_, Dormancy> {
        self.dormant.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resumes `caller`'s ended background child `id` from its transcript with `message`
    /// after its last answer, and starts it again in the background: a new notification
    /// reports this run, exactly once. Waits first for the previous run's owner to finish (its
    /// notification delivered, its worktree settled); a worktree it had is reopened (kept) or
    /// made again at the same path. `turn` is the caller's turn, for the start event.
    ///
    /// Errors: `id` is not a resumable child of the caller ([`Error::Refused`], and nothing
    /// changes), or the transcript, the worktree or the registry fail — the child stays
    /// resumable unless its record was already reopened, in which case its new run ends
    /// `failed` and reports it.
    pub(crate) async fn revive(
        self: &Arc<Self>,
        caller: &AgentShared,
        turn: u32,
        id: TaskId,
        message: PendingMessage,
    ) -> Result<TaskId> {
        let me = *caller.cx.id();
        // Claim the resume (or join one under way), leaving the entry in place: a message
        // sent while it is under way goes to the new run's queue, never nowhere.
        let queue = PendingQueue::new();
        let claimed = {
            let mut all = self.lock_dormant();
            let Some(d) = all.map.get_mut(&id).filter(|d| d.parent == me) else {
                drop(all);
                // Another message's resume got there first: it runs again, so it reads this
                // one at its next tool round.
                if self.parent_of(&id) == Some(me)
                    && let Some(super::Sent::Child(id)) = self.send(&id, false, message)
                {
                    return Ok(id);
                }
                return Err(Error::Refused(format!(
                    "task {id} is not an ended task of yours"
                )));
            };
            if let Some(q) = &d.reviving {
                q.push(message);
                return Ok(id);
            }
            d.reviving = Some(queue.clone());
            // The message the resume is for goes first; any that join it follow. Should the
            // resume fail, the claim hands them all back to the caller.
            queue.push(message);
            Claimed {
                recipe: d.recipe.clone(),
                description: d.description.clone(),
                agent_type: d.agent_type.clone(),
                settled: d.settled.take(),
                queue,
                // The parent waits for the resumed run as for any child it started.
                promise: caller.pending.expect(),
                seed: caller.child_seed(id, AgentKind::Subagent, QuerySource::custom("")),
                pending: caller.pending.clone(),
                events: caller.events.clone(),
                ledger: caller.children.clone(),
                turn,
                me,
            }
        };
        // The resume runs in a task of its own, its one owner: a caller that stops waiting (its
        // tool call timed out, its agent was cancelled) cannot leave it half done — a record
        // reopened with nobody to end it, or a claim that swallows later messages.
        let service = Arc::clone(self);
        let guard = Unclaim {
            service: Arc::clone(self),
            id,
            armed: true,
            queue: claimed.queue.clone(),
            pending: claimed.pending.clone(),
        };
        match tokio::spawn(async move { service.resume_claimed(id, claimed, guard).await }).await {
            Ok(r) => r,
            Err(e) => Err(Error::Refused(format!(
                "resuming task {id} failed: {}",
                if e.is_panic() {
                    "it panicked"
                } else {
                    "it was cancelled"
                }
            ))),
        }
    }

    /// The rest of [`revive`](Self::revive), in its own task.
    async fn resume_claimed(
        self: Arc<Self>,
        id: TaskId,
        claimed: Claimed,
        mut guard: Unclaim,
    ) -> Result<TaskId> {
        let Claimed {
            recipe,
            description,
            agent_type,
            settled,
            queue,
            promise,
            seed,
            pending,
            events,
            ledger,
            turn,
            me,
        } = claimed;
        // Until the record is reopened, a failure leaves it resumable as it was; messages
        // others queued meanwhile go back to the caller, with the reason.
        let give_up = |guard: &mut Unclaim, e: Error| {
            guard.release(&super::error_chain(&e));
            e
        };
        if let Some(settled) = settled {
            // Ok or closed: either way its owner is done.
            let _ = settled.await;
        }
        if seed.cancel.is_cancelled() {
            return Err(give_up(
                &mut guard,
                Error::Refused(format!(
                    "task {id} was not resumed: the agent that sent the message was stopped"
                )),
            ));
        }
        let slot = match self.acquire(me) {
            Ok(s) => s,
            Err(e) => return Err(give_up(&mut guard, e)),
        };
        let worktree = match &recipe.worktree {
            Some(wt) => match wt.reopen().await {
                Ok(wt) => Some(Unfinished::new(wt)),
                Err(e) => return Err(give_up(&mut guard, e)),
            },
            None => None,
        };
        let progress = Arc::new(Progress::default());
        let builder = Agent::builder(Arc::clone(&recipe.backend))
            .tools(recipe.pool.clone())
            .policy(Arc::clone(&recipe.policy))
            .limits(recipe.limits.clone())
            .settings(recipe.settings.clone())
            .child_of(match &recipe.agent_type {
                Some(t) => crate::runtime::ChildSeed {
                    context: seed.context.with_agent_type(t.clone()),
                    ..seed
                },
                None => seed,
            })
            .resumed_hooks(recipe.own_hooks.clone())
            .pending(queue.clone())
            .events(Arc::new(ChildSink {
                child: id,
                progress: Arc::clone(&progress),
                output: None,
                forward: events.clone(),
            }));
        let agent = match Agent::resume(builder, &recipe.transcript).await {
            Ok((agent, _)) => agent,
            Err(e) => {
                if let Some(wt) = worktree {
                    let _ = Box::pin(wt.finish()).await;
                }
                return Err(give_up(
                    &mut guard,
                    Error::Start {
                        what: "resumed agent",
                        source: Box::new(e),
                    },
                ));
            }
        };
        let reopened = match self.registry.reopen(&id).await {
            Ok(_) => Ok(()),
            // Forgotten under the registry's retention while its transcript stayed: the same
            // task is recorded again for this run, as offered. The record starts anew (this
            // run's usage is its own); what earlier runs added to its ancestors' totals stays
            // while those are kept.
            Err(_) if self.registry.get(&id).await.is_none() => {
                let mut record = super::TaskRecord::new(id, me, description.clone());
                record.agent_type = agent_type;
                record.transcript = agent.transcript_path().map(PathBuf::from);
                let made = match self.registry.create(record).await {
                    Ok(()) => self
                        .registry
                        .transition(&id, super::TaskState::Running)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                };
                if let Err(e) = &made {
                    tracing::warn!(task = %id, "its forgotten record could not be made again: {e}");
                }
                made
            }
            Err(e) => Err(e),
        };
        if let Err(e) = reopened {
            if let Some(wt) = worktree {
                let _ = Box::pin(wt.finish()).await;
            }
            return Err(give_up(&mut guard, e));
        }
        let launch = Launch {
            agent,
            first: FirstInput::Continue,
            description,
            tool_use_id: None,
            parent_queue: pending,
            progress,
            output: None,
            slot,
            gate: None,
            events,
            ledger: Some(ledger),
            parent_turn: turn,
            worktree,
            deadline: recipe.deadline,
            name: recipe.name.clone(),
        };
        // Reopened: from here the new run's owner ends the record, whatever happens.
        guard.armed = false;
        let started = self
            .start_as(launch, Mode::Background, Some(Box::new(recipe)))
            .await?
            .id();
        // The new run's owner holds its own promise now.
        drop(promise);
        Ok(started)
    }
}

/// What a claimed resume carries into its own task.
struct Claimed {
    recipe: Recipe,
    description: String,
    agent_type: String,
    settled: Option<oneshot::Receiver<()>>,
    queue: PendingQueue,
    promise: crate::base::pending::Expectation,
    seed: crate::runtime::ChildSeed,
    pending: PendingQueue,
    events: Option<Arc<dyn crate::base::events::EventSink>>,
    ledger: crate::base::children::ChildLedger,
    turn: u32,
    me: TaskId,
}

/// Releases a resume's claim on its dormant entry unless the new run took over: on a failure,
/// and should the resume's task panic or be dropped.
/// Messages others queued for the resume meanwhile go back to the caller, with the reason.
struct Unclaim {
    service: Arc<TaskService>,
    id: TaskId,
    armed: bool,
    queue: PendingQueue,
    pending: PendingQueue,
}

impl Unclaim {
    fn release(&mut self, why: &str) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        if let Some(d) = self.service.lock_dormant().map.get_mut(&self.id) {
            d.reviving = None;
        }
        let queued: Vec<String> = self.queue.drain().into_iter().map(|m| m.text).collect();
        if !queued.is_empty() {
            self.pending.push(PendingMessage::new(
                format!(
                    "task {} could not be resumed ({why}), so these messages to it were not \
                     delivered: {}",
                    self.id,
                    queued.join(" ")
                ),
                crate::base::pending::SEND_MESSAGE_ORIGIN,
            ));
        }
    }
}

impl Drop for Unclaim {
    fn drop(&mut self) {
        self.release("it stopped before it could start");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::task::{MemoryTaskRegistry, TaskConfig, TaskState};
    use forkhive_transport::{Response, ScriptedBackend};

    /// A caller that stops waiting right after the claim (its tool call timed out) does not
    /// stop the resume: the worker runs again, its record ends, its notification arrives.
    #[tokio::test]
    async fn a_resume_whose_caller_stops_waiting_still_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(ScriptedBackend::from_fn(|r| {
            let resumed = r.all_messages().iter().any(|m| m.text().contains("again"));
            Ok(Response::say(if resumed { "second" } else { "first" }))
        }));
        let service = TaskService::new(
            Arc::new(MemoryTaskRegistry::new()),
            TaskConfig::default().with_stall_after(None),
        );
        let parent = Agent::builder(backend.clone())
            .model("m")
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let worker = Agent::builder(backend)
            .model("m")
            .child_of(parent.child_seed(
                TaskId::generate(forkhive_core::TaskKind::Agent),
                AgentKind::Subagent,
                QuerySource::custom("w"),
            ))
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let id = *worker.id();
        let queue = parent.pending();
        service
            .launch(Launch {
                agent: worker,
                first: FirstInput::Prompt("work".into()),
                description: "w".into(),
                tool_use_id: None,
                parent_queue: queue.clone(),
                progress: Arc::default(),
                output: None,
                slot: service.acquire(*parent.id()).unwrap(),
                gate: None,
                events: None,
                ledger: None,
                parent_turn: 0,
                worktree: None,
                deadline: None,
                name: None,
            })
            .await
            .unwrap();
        service.wait_idle().await;
        assert_eq!(queue.drain().len(), 1);
        assert_eq!(service.resumable_parent(&id), Some(*parent.id()));
        // Polled once (the claim and the spawn), then dropped.
        {
            let resume = service.revive(
                parent.shared(),
                0,
                id,
                PendingMessage::new("again", "send-message"),
            );
            let mut resume = std::pin::pin!(resume);
            assert!(
                futures::poll!(resume.as_mut()).is_pending(),
                "still resuming"
            );
        }
        tokio::time::timeout(Duration::from_secs(10), async {
            while queue.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the resumed run's notification");
        service.wait_idle().await;
        let n = queue.drain();
        assert_eq!(n.len(), 1);
        assert!(n[0].text.contains("second"), "{}", n[0].text);
        let record = service.registry().get(&id).await.unwrap();
        assert_eq!(record.state, TaskState::Completed);
        assert_eq!(service.live(), 0);
    }

    /// A resume that cannot start (the parent's capacity is full) hands the message back to
    /// the caller with the reason, and the child stays resumable.
    #[tokio::test]
    async fn a_resume_that_cannot_start_hands_its_message_back() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(ScriptedBackend::from_async_fn(|r| async move {
            if r.all_messages()[0].text() == "hold" {
                std::future::pending::<()>().await;
            }
            Ok(Response::say("first"))
        }));
        let service = TaskService::new(
            Arc::new(MemoryTaskRegistry::new()),
            TaskConfig::default()
                .with_stall_after(None)
                .with_max_children_per_agent(1),
        );
        let parent = Agent::builder(backend.clone())
            .model("m")
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let start = |prompt: &'static str| {
            let (service, backend, parent, dir) =
                (Arc::clone(&service), backend.clone(), &parent, dir.path());
            async move {
                let worker = Agent::builder(backend)
                    .model("m")
                    .child_of(parent.child_seed(
                        TaskId::generate(forkhive_core::TaskKind::Agent),
                        AgentKind::Subagent,
                        QuerySource::custom("w"),
                    ))
                    .transcript_dir(dir)
                    .build()
                    .await
                    .unwrap();
                service
                    .launch(Launch {
                        agent: worker,
                        first: FirstInput::Prompt(prompt.into()),
                        description: prompt.into(),
                        tool_use_id: None,
                        parent_queue: parent.pending(),
                        progress: Arc::default(),
                        output: None,
                        slot: service.acquire(*parent.id()).unwrap(),
                        gate: None,
                        events: None,
                        ledger: None,
                        parent_turn: 0,
                        worktree: None,
                        deadline: None,
                        name: None,
                    })
                    .await
                    .unwrap()
            }
        };
        let id = start("work").await;
        while service.resumable_parent(&id).is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let holder = start("hold").await;
        let queue = parent.pending();
        queue.drain();
        let e = service
            .revive(
                parent.shared(),
                0,
                id,
                PendingMessage::new("again", "send-message"),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("live children"), "{e}");
        let bounced = queue.drain();
        assert_eq!(bounced.len(), 1, "{bounced:?}");
        assert!(
            bounced[0]
                .text
                .starts_with(&format!("task {id} could not be resumed ("))
        );
        assert!(
            bounced[0]
                .text
                .ends_with("so these messages to it were not delivered: again")
        );
        assert_eq!(service.resumable_parent(&id), Some(*parent.id()));
        assert!(service.cancel(&holder));
        service.wait_idle().await;
    }

    /// Past the limit the oldest entry goes — but never one whose resume is under way.
    #[tokio::test]
    async fn eviction_skips_an_entry_being_resumed() {
        let agent = Agent::builder(Arc::new(ScriptedBackend::from_texts(["x"])))
            .model("m")
            .build()
            .await
            .unwrap();
        let entry = || {
            let (_tx, rx) = oneshot::channel();
            Dormant::new(
                *agent.id(),
                "d".into(),
                "worker".into(),
                Recipe::of(&agent, PathBuf::from("t.jsonl")),
                rx,
            )
        };
        let ids: Vec<TaskId> = (0..3)
            .map(|_| TaskId::generate(forkhive_core::TaskKind::Agent))
            .collect();
        let mut d = Dormancy::default();
        d.put(ids[0], entry(), 2);
        d.put(ids[1], entry(), 2);
        if let Some(e) = d.map.get_mut(&ids[0]) {
            e.reviving = Some(PendingQueue::new());
        }
        d.put(ids[2], entry(), 2);
        assert!(d.map.contains_key(&ids[0]), "being resumed: kept");
        assert!(!d.map.contains_key(&ids[1]), "the oldest other one went");
        assert!(d.map.contains_key(&ids[2]));
        assert_eq!(d.order.len(), 2);
    }
}
