//! [`Agent`]: one agent's loop, and [`AgentBuilder`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use forkhive_core::{
    CacheBreak, CacheSafeParams, ContentBlock, Message, PrefixFingerprint, Role, TaskId, Usage,
};
use forkhive_transport::{
    Backend, ModelStop, Request, RequestSettings, Response, ResponseBuilder, StreamEvent,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::base::children::ChildLedger;
use crate::base::context::{AgentContext, AgentKind, QuerySource};
use crate::base::events::{Emitter, EventKind, EventSink};
use crate::base::outcome::{AgentRun, Limits, StopReason, TurnRecord};
use crate::base::pending::{PendingMessage, PendingQueue, Wake};
use crate::base::state::{AgentState, TreeState, TurnSnapshot};
use crate::definition::AgentDefinition;
use crate::error::{Error, Result};
use crate::tool::orchestrate::{Round, RoundConfig, ToolCall};
use crate::tool::permission::{AllowAll, PermissionPolicy, policy_for_mode};
use crate::tool::{ToolAudience, ToolContext, ToolFilter, ToolOutput, ToolPool};
use crate::transcript::{
    self, PrefixRecord, TRANSCRIPT_VERSION, TranscriptHeader, TranscriptWriter,
};

mod builder;
mod resume;
mod shared;
mod turn;

pub use builder::AgentBuilder;
pub use resume::ResumeReport;
pub(crate) use shared::AgentShared;
pub use shared::ChildSeed;

/// The user message sent after the model stopped at `max_tokens` in the middle of text.
pub const CONTINUE_PROMPT: &str = "Your last answer was cut off by the output token limit. \
Continue exactly where it stopped: do not repeat anything or apologise.";

/// What the next request's prefix is checked against for a prompt-cache break.
#[derive(Debug)]
enum LastPrefix {
    /// A fingerprint the host expects the first request to extend (a fork child's parent's).
    Expected(Box<PrefixFingerprint>),
    /// The prefix of the last request sent.
    Sent(CacheSafeParams),
}

impl LastPrefix {
    /// The first difference that stops `next` from reading this prefix's cache. A prefix made
    /// from the last one by appending — every turn of a plain conversation — is told apart
    /// by pointers, without hashing anything.
    fn break_before(&self, next: &CacheSafeParams) -> Option<CacheBreak> {
        match self {
            Self::Sent(last) if next.extends(last) => None,
            Self::Sent(last) => last.fingerprint().diff(next.fingerprint()),
            Self::Expected(fp) => fp.diff(next.fingerprint()),
        }
    }
}

/// One agent: its conversation, tools, policy and limits, driven by [`run`](Self::run).
///
/// The agent owns its conversation; nothing else holds a lock on it. Others reach it through
/// its [`PendingQueue`] (messages) and its [`CancellationToken`].
///
/// ```
/// use std::sync::Arc;
/// use forkhive_spawn::runtime::{Agent, StopReason};
/// use forkhive_transport::ScriptedBackend;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let backend = Arc::new(ScriptedBackend::from_texts(["Hello!"]));
/// let mut agent = Agent::builder(backend).model("claude-sonnet-4-5").build().await?;
/// let run = agent.run("Say hello.").await;
/// assert_eq!(run.stop, StopReason::Completed);
/// assert_eq!(run.final_text, "Hello!");
/// # Ok::<(), forkhive_spawn::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct Agent {
    shared: Arc<AgentShared>,
    params: CacheSafeParams,
    emit: Emitter,
    /// Boxed: most agents write none, and one that has not started yet (a background child
    /// of a wide fan-out) should hold a pointer, not the writer's state.
    transcript: Option<Box<Recorder>>,
    last_prefix: Option<LastPrefix>,
    turn: u32,
    /// Why the model stopped its last answer (`None` before the first): whether a
    /// conversation that ends with that answer is finished (the agent waits for a message)
    /// or is to be sent again (cut at `max_tokens`, paused).
    last_stop: Option<ModelStop>,
    /// Messages already in the conversation but sent as the next request's suffix (a fork
    /// child's first message, so that its boilerplate block gets a cache breakpoint).
    unsent: Vec<Message>,
    /// Receipts of injected messages not recorded yet: answered by the next `push`, or
    /// (dropped) answered `false`.
    receipts: Vec<crate::base::pending::Receipt>,
    /// Leave running children alone when dropped.
    keep_children: bool,
    /// A run of it has returned [`StopReason::Cancelled`]: the next takes nothing
    /// ([`Agent::cancelled_at_once`]).
    stopped_cancelled: bool,
    /// Warnings from building it, emitted when it first runs (after its parent's
    /// `ChildStarted`).
    warnings: Vec<String>,
    /// What the first run's message starts with (a definition's memory, skills and initial
    /// prompt), taken by that run.
    first_context: Vec<String>,
}

/// An agent's transcript writer, with the messages a `push` was recording when its future
/// was dropped (the agent's run dropped mid-write): the writer knows how many it took, and
/// the agent takes the same ones into its conversation before it next records or runs
/// (`Agent::settle_dropped_push`), so the two never disagree.
#[derive(Debug)]
pub(super) struct Recorder {
    pub(super) writer: TranscriptWriter,
    pub(super) in_flight: Option<InFlight>,
    /// A resumed agent's background children that its transcript says it started and that
    /// have not reported: if nothing here waits for them at its first run, a warning says so.
    /// (Here, not in the agent: only a resumed agent, which always has a transcript, has any.)
    pub(super) unreported: Vec<forkhive_core::TaskId>,
}

impl Recorder {
    pub(super) fn new(writer: TranscriptWriter) -> Box<Self> {
        Box::new(Self {
            writer,
            in_flight: None,
            unreported: Vec::new(),
        })
    }
}

/// The messages of a `push` being recorded: the index the first takes, and where they go once
/// recorded (the conversation, or the messages still to send first).
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) first: usize,
    pub(super) messages: Vec<Arc<Message>>,
    pub(super) unsent: bool,
}

/// Dropping an agent stops everything it started that still runs: a run that ended at a limit
/// (`MaxTurns`, a budget) or failed may leave background children behind, and once the agent is
/// gone nobody reads their notifications. Each stopped child still ends `killed`, recorded and
/// accounted by its owner ([`TaskService`](crate::task::TaskService)). The agent's token is its
/// own (a child of any token the host passed in), so no host token is cancelled. Opt out with
/// [`AgentBuilder::cancel_children_on_drop`].
impl Drop for Agent {
    fn drop(&mut self) {
        // A run dropped mid-record, then the agent: the receipts of what that record carried
        // are answered by what reached the file. A write still running is waited for by a
        // task that takes the writer over; without a runtime to run it on, it is counted as
        // written (the file finishes a write it was handed).
        if !self.hand_over_dropped_push() {
            self.settle_dropped_push();
        }
        if !self.keep_children {
            self.shared.cancel.cancel();
        }
    }
}

impl Agent {
    /// Starts a builder on `backend`.
    pub fn builder(backend: Arc<dyn Backend>) -> AgentBuilder {
        AgentBuilder::new(backend)
    }

    /// The agent's identity.
    pub fn context(&self) -> &Arc<AgentContext> {
        &self.shared.cx
    }

    /// The agent's id.
    pub fn id(&self) -> &TaskId {
        self.shared.cx.id()
    }

    /// The conversation so far, as the cache-safe parameters of the next request.
    pub fn params(&self) -> &CacheSafeParams {
        &self.params
    }

    /// The fingerprint of the last request sent.
    pub fn last_request_fingerprint(&self) -> Option<&PrefixFingerprint> {
        match self.last_prefix.as_ref()? {
            LastPrefix::Expected(fp) => Some(fp),
            LastPrefix::Sent(params) => Some(params.fingerprint()),
        }
    }

    /// The tools this agent may call (after filtering).
    pub fn tools(&self) -> &ToolPool {
        &self.shared.pool
    }

    /// The permission policy in force.
    pub fn policy(&self) -> &Arc<dyn PermissionPolicy> {
        &self.shared.policy
    }

    /// A handle to the pending-message queue.
    pub fn pending(&self) -> PendingQueue {
        self.shared.pending.clone()
    }

    /// The agent's [`Halt`](crate::runtime::Halt): requesting it ends the agent's run at its
    /// next tool-round boundary ([`StopReason::Halted`]), unlike cancellation, which stops it
    /// at once.
    pub fn halt(&self) -> crate::base::pending::Halt {
        self.shared.halt.clone()
    }

    /// The agent's cancellation token (cancelling it stops the agent and its descendants).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.shared.cancel
    }

    /// The agent's own state.
    pub fn state(&self) -> &AgentState {
        &self.shared.state
    }

    /// The tree's shared state.
    pub fn tree(&self) -> &Arc<TreeState> {
        &self.shared.tree
    }

    /// The transcript file, if one is written.
    pub fn transcript_path(&self) -> Option<&Path> {
        self.transcript.as_deref().map(|r| r.writer.path())
    }

    /// Model turns over the agent's life.
    pub fn turns(&self) -> u32 {
        self.turn
    }

    /// What a child of this agent starts from (see [`ChildSeed`]).
    pub fn child_seed(&self, id: TaskId, kind: AgentKind, source: QuerySource) -> ChildSeed {
        self.shared.child_seed(id, kind, source)
    }

    /// The parts of this agent its tools can use.
    pub(crate) fn shared(&self) -> &Arc<AgentShared> {
        &self.shared
    }

    /// Adds `prompt` as a user message (with any pending messages after it) and runs the loop
    /// until the model stops, a limit is reached, or the agent is cancelled.
    ///
    /// `UserPromptSubmit` hooks see the prompt first: one that blocks ends the run at once
    /// ([`StopReason::Blocked`]), context they give follows the prompt. A subagent's first run
    /// also runs `SubagentStart` hooks, whose context follows too.
    ///
    /// A cancelled agent stays cancelled: once a run has returned [`StopReason::Cancelled`],
    /// the next returns it again without adding the prompt or taking anything from the queue.
    pub async fn run(&mut self, prompt: impl Into<String>) -> AgentRun {
        let prompt: String = prompt.into();
        // Every entry point first settles a record a dropped run left in flight: what the
        // conversation ends with decides what the run does.
        if self.left_a_record() {
            Box::pin(self.settle_recorded()).await;
        }
        self.warn_of_unreported();
        if let Some(run) = self.cancelled_at_once().await {
            return run;
        }
        // The hooks' part is its own future, boxed, and only for an agent with hooks: a child's
        // future is allocated whole when it is spawned, so what it would hold inline every
        // child would pay for, hooks or not.
        let extra = if self.shared.hooks.is_empty() {
            Vec::new()
        } else {
            match Box::pin(self.prompt_hooks(&prompt)).await {
                Ok(extra) => extra,
                Err(run) => return *run,
            }
        };
        let mut blocks: Vec<ContentBlock> = std::mem::take(&mut self.first_context)
            .into_iter()
            .map(ContentBlock::text)
            .collect();
        blocks.push(ContentBlock::text(prompt));
        blocks.extend(extra.into_iter().map(ContentBlock::text));
        blocks.extend(self.drain_pending());
        self.run_with(Some(blocks), false).await
    }

    /// `UserPromptSubmit` (the main agent's prompts) and, on a subagent's first run,
    /// `SubagentStart` hooks: the context they add, or the run they ended.
    async fn prompt_hooks(
        &mut self,
        prompt: &str,
    ) -> std::result::Result<Vec<String>, Box<AgentRun>> {
        use crate::hook::HookEvent;
        let mut extra = Vec::new();
        // A user's prompt: the main agent's (a subagent's prompt is its parent's words).
        if self.shared.cx.depth() == 0 && self.shared.hooks.wants(HookEvent::UserPromptSubmit, None)
        {
            let mut input = self.hook_input(HookEvent::UserPromptSubmit);
            input.prompt = Some(prompt.to_owned());
            let d = tokio::select! {
                biased;
                // Not recorded: a prompt these hooks have not passed may be one they would
                // block (a secret pasted by mistake), and a transcript keeps what it is given.
                () = self.shared.cancel.cancelled() => {
                    let run = self.run_state();
                    return Err(Box::new(self.finish(run, StopReason::Cancelled).await));
                }
                d = self.shared.hooks.run(input) => d,
            };
            for message in d.warnings {
                self.emit.emit(EventKind::Warning { message });
            }
            if let Some(reason) = d.blocked {
                let run = self.run_state();
                return Err(Box::new(
                    self.finish(run, StopReason::Blocked { message: reason })
                        .await,
                ));
            }
            extra.extend(d.context);
        }
        let first_of_child = self.shared.cx.depth() > 0 && self.turn == 0;
        if first_of_child
            && self
                .shared
                .hooks
                .wants(HookEvent::SubagentStart, self.shared.cx.agent_type())
        {
            let d = tokio::select! {
                biased;
                // A child cancelled before its hooks have run: its prompt is recorded all the
                // same (the run sees the cancel after recording it), as a child without hooks
                // keeps its task for a message that revives it. The hooks' context is not
                // added: they never answered.
                () = self.shared.cancel.cancelled() => return Ok(extra),
                d = self.shared.hooks.run(self.hook_input(HookEvent::SubagentStart)) => d,
            };
            for message in d.warnings {
                self.emit.emit(EventKind::Warning { message });
            }
            extra.extend(d.context);
        }
        Ok(extra)
    }

    /// A hook input for `event` about this agent.
    pub(crate) fn hook_input(&self, event: crate::hook::HookEvent) -> crate::hook::HookInput {
        let id = self.shared.cx.id();
        let mut input = crate::hook::HookInput::new(
            event,
            self.shared.tree.session(id).to_owned(),
            id.to_string(),
        );
        input.agent_type = self.shared.cx.agent_type().map(str::to_owned);
        input.transcript_path = self.transcript_path().map(Path::to_path_buf);
        input
    }

    /// Runs the loop on the conversation as it stands, adding only what is pending: the next
    /// request continues the conversation where it ends — a user message (or
    /// [`AgentBuilder::first_request_suffix`] messages), as a fork child's or a resumed
    /// agent's does.
    ///
    /// Where it ends with the agent's own finished answer (a resumed agent that was waiting at
    /// the end of its turn when its process stopped), there is nothing to send until a message
    /// comes: the run goes on from that wait, as the loop would have — it waits for what is
    /// pending or promised (unless the agent was built to
    /// [`detach_background`](AgentBuilder::detach_background)), then runs on it, or ends as
    /// any turn ends (stop hooks included). An answer cut at `max_tokens` or paused by the
    /// provider is sent again, as before, and so is a conversation a host ended with an
    /// assistant message of its own (a prefill).
    ///
    /// Where the answer called tools that have no results (its run stopped mid-round), each
    /// call is answered with an error saying it was interrupted, and the run goes on.
    ///
    /// Once a run of a cancelled agent has returned [`StopReason::Cancelled`], this returns it
    /// again, taking nothing from the queue (as [`run`](Self::run) does).
    pub async fn continue_run(&mut self) -> AgentRun {
        if self.left_a_record() {
            Box::pin(self.settle_recorded()).await;
        }
        self.warn_of_unreported();
        if let Some(run) = self.cancelled_at_once().await {
            return run;
        }
        if self.waiting_after_answer() {
            // As the loop does after that answer: wait, then run on what came (or end, with
            // the stop hooks and checks of any end of turn).
            return self.run_with(None, true).await;
        }
        // Messages to send first (a fork child's first message) go alone: its first request
        // is the one its siblings share a prefix and a cache breakpoint with. What is queued
        // meanwhile is taken at the first turn's end, as a running agent takes it.
        let pending = if self.unsent.is_empty() {
            self.drain_pending()
        } else {
            Vec::new()
        };
        self.run_with((!pending.is_empty()).then_some(pending), false)
            .await
    }

    /// The run of an agent whose last run returned [`StopReason::Cancelled`] (and which is
    /// still cancelled, as a cancelled agent stays): `Cancelled` again, before the run takes
    /// anything — the prompt is not added, the queue is not drained (its children's `killed`
    /// notifications stay there, for a host to hand on), the conversation gains nothing and
    /// the transcript only another stop record. `None` for any other agent.
    ///
    /// An agent cancelled before its first run still records that run's prompt: a child
    /// stopped before its first turn keeps its task in its transcript, for a message that
    /// revives it (its `SubagentStart` hooks too, if any, do not stand in the way). A main
    /// agent's prompt is recorded only once its `UserPromptSubmit` hooks have passed it: one
    /// cancelled before they answered is not recorded.
    async fn cancelled_at_once(&mut self) -> Option<AgentRun> {
        if !(self.stopped_cancelled && self.shared.cancel.is_cancelled()) {
            return None;
        }
        let run = self.run_state();
        Some(self.finish(run, StopReason::Cancelled).await)
    }

    /// Whether the conversation ends with a finished answer of the agent's own (no tool
    /// calls, not cut at `max_tokens`, not paused), with nothing to send after it: the agent
    /// was waiting at the end of its turn.
    fn waiting_after_answer(&self) -> bool {
        let finished = matches!(
            &self.last_stop,
            Some(s) if !matches!(s, ModelStop::MaxTokens | ModelStop::PauseTurn | ModelStop::ToolUse)
        );
        finished
            && self.unsent.is_empty()
            && self
                .params
                .messages()
                .last()
                .is_some_and(|m| m.role == Role::Assistant && m.tool_uses().next().is_none())
    }

    /// Brings the conversation up to date after a run's future was dropped while it recorded a
    /// message (a timeout around [`run`](Self::run), a `select!` that took another branch): waits
    /// for the outcome of the write the dropped run left, takes what reached the transcript
    /// into the conversation, and answers the receipts of queued messages by it
    /// (`docs/transcripts.md`). Every run does this first; call it to read
    /// [`params`](Self::params) after a dropped run without starting another. Nothing to do,
    /// at once, when no run was dropped mid-record or the agent keeps no transcript.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use forkhive_spawn::runtime::Agent;
    /// use forkhive_transport::{Response, ScriptedBackend};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let dir = tempfile::tempdir().unwrap();
    /// // A model that takes a minute to answer.
    /// let model = ScriptedBackend::from_async_fn(|_r: forkhive_transport::Request| async {
    ///     tokio::time::sleep(Duration::from_secs(60)).await;
    ///     Ok(Response::say("late"))
    /// });
    /// let mut agent = Agent::builder(Arc::new(model))
    ///     .model("m")
    ///     .transcript_dir(dir.path())
    ///     .build()
    ///     .await?;
    /// let timed_out = tokio::time::timeout(Duration::from_millis(200), agent.run("hello")).await;
    /// assert!(timed_out.is_err());
    /// agent.settle().await;
    /// // The prompt was recorded before the model was asked: the conversation and the
    /// // transcript both hold it.
    /// let recorded = forkhive_spawn::transcript::read(agent.transcript_path().unwrap()).await?;
    /// assert_eq!(recorded.messages, agent.params().messages().to_vec());
    /// assert_eq!(recorded.messages.len(), 1);
    /// # Ok::<(), forkhive_spawn::Error>(()) }).unwrap();
    /// ```
    pub async fn settle(&mut self) {
        if self.left_a_record() {
            Box::pin(self.settle_recorded()).await;
        }
    }

    /// Runs the loop on whatever is pending (waiting for a promised message if none is
    /// queued yet). Returns at once, [`StopReason::Completed`], when nothing is pending or
    /// expected — without asking the model, so the calls a dropped run left without results
    /// stay so until the next run that asks it (which answers them first).
    pub async fn run_pending(&mut self) -> AgentRun {
        if self.left_a_record() {
            Box::pin(self.settle_recorded()).await;
        }
        self.warn_of_unreported();
        match self.next_wake(true).await {
            None => {
                let run = self.run_state();
                self.finish(run, StopReason::Cancelled).await
            }
            Some(Wake::Idle) => {
                let run = self.run_state();
                let stop = if self.shared.halt.take() {
                    StopReason::Halted
                } else {
                    StopReason::Completed
                };
                self.finish(run, stop).await
            }
            Some(Wake::Messages(ms)) => {
                let blocks = self.inject(ms);
                self.run_with(Some(blocks), false).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use forkhive_core::ToolDefinition;

    /// An agent with a transcript in `dir`, after one run.
    async fn agent_with_a_transcript(dir: &Path) -> Agent {
        let backend = Arc::new(forkhive_transport::ScriptedBackend::from_texts(["hello"]));
        let mut agent = Agent::builder(backend)
            .model("m")
            .transcript_dir(dir)
            .build()
            .await
            .unwrap();
        let _ = agent.run("hi").await;
        agent
    }

    /// A turn's usage record goes to the file in its answer's write: a run waits for the file
    /// once per message and once for its stop, not once more per turn.
    #[tokio::test]
    async fn a_turns_usage_record_shares_its_answers_write() {
        use forkhive_core::{ContentBlock, RawJson, Usage};
        use forkhive_transport::{ModelStop, Response, ScriptedBackend};
        let reply = |content, stop| {
            Ok(Response {
                message: Message::assistant(content),
                stop_reason: Some(stop),
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                id: None,
                model: None,
            })
        };
        let backend = Arc::new(ScriptedBackend::from_replies([
            reply(
                vec![ContentBlock::tool_use(
                    "t1",
                    "look",
                    RawJson::parse("{}").unwrap(),
                )],
                ModelStop::ToolUse,
            ),
            reply(vec![ContentBlock::text("seen it")], ModelStop::EndTurn),
        ]));
        let look = crate::tool::FnTool::new(
            ToolDefinition::new("look", "Looks", r#"{"type":"object"}"#).unwrap(),
            |_, _| async { crate::tool::ToolOutput::text("a tree") },
        )
        .arc();
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::builder(backend)
            .model("m")
            .tools(crate::tool::ToolPool::new([look]).unwrap())
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let before = crate::transcript::trips_in(dir.path());
        let run = agent.run("look once").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        let written = crate::transcript::trips_in(dir.path()) - before;
        let t = crate::transcript::read(agent.transcript_path().unwrap())
            .await
            .unwrap();
        // The prompt, the call, its result and the answer; a usage record per turn; a stop.
        assert_eq!((t.messages.len(), t.turns.len(), t.stops.len()), (4, 2, 1));
        assert_eq!(written, 5, "one write per message and one for the stop");
    }

    /// Writes `letter` through `writer` until a write is still running after one poll (handed
    /// to the file, its outcome not known), as a run dropped mid-record leaves it; then gives
    /// `agent` that writer, that record in flight, and a receipt that reports to `answered`.
    async fn leave_a_write_running(
        agent: &mut Agent,
        mut writer: TranscriptWriter,
        answered: impl FnOnce(bool) + Send + 'static,
    ) {
        use futures::FutureExt;
        let letter = Arc::new(Message::user_text("a letter"));
        for _ in 0..1000 {
            let first = writer.next_index();
            if writer.message(&letter).now_or_never().is_none() && writer.has_unconfirmed() {
                let mut rec = Recorder::new(writer);
                rec.in_flight = Some(InFlight {
                    first,
                    messages: vec![letter],
                    unsent: false,
                });
                agent.transcript = Some(rec);
                agent
                    .receipts
                    .push(crate::base::pending::Receipt::new(answered));
                return;
            }
            // A try that ended within its poll may have left the file busy (cutting a failed
            // write off): let that finish on the blocking pool before the next.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("no write was still running after one poll in 1,000 tries");
    }

    /// An agent dropped while a write its dropped run handed to the file is still running
    /// answers that message's receipt by the write's outcome: here the device is full, so
    /// `false` (the sender may send it again). Counting it written, as a drop without a
    /// runtime must, would have said `true` for a message the transcript does not hold.
    #[tokio::test]
    async fn dropping_the_agent_answers_a_receipt_by_its_writes_outcome() {
        if !Path::new("/dev/full").exists() {
            eprintln!("skipped: this system has no /dev/full");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut agent = agent_with_a_transcript(dir.path()).await;
        let path = agent.transcript_path().unwrap().to_path_buf();
        let mut full = crate::transcript::read(&path).await.unwrap();
        full.path = "/dev/full".into();
        let writer = TranscriptWriter::reopen(&full).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        leave_a_write_running(&mut agent, writer, move |ok| {
            let _ = tx.send(ok);
        })
        .await;
        drop(agent);
        assert!(!rx.await.unwrap(), "answered as recorded");
    }

    /// An agent dropped while its runtime shuts down (the task owning it dropped unrun), with a
    /// dropped run's write handed to the file: the task it hands the writer to is dropped
    /// unrun too, and the receipt is answered as a drop without a runtime answers it — by
    /// what the writer took (here everything: `true`), not `false` for a message the file
    /// holds.
    #[test]
    fn an_agent_dropped_as_its_runtime_shuts_down_answers_by_what_the_writer_took() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut agent = agent_with_a_transcript(dir.path()).await;
            // Its own writer, a message handed to the file and not yet confirmed.
            let writer = agent.transcript.take().unwrap().writer;
            leave_a_write_running(&mut agent, writer, move |ok| {
                let _ = tx.send(ok);
            })
            .await;
            // Owned by a task that never finishes: dropped when the runtime shuts down.
            tokio::spawn(async move {
                let _agent = agent;
                std::future::pending::<()>().await;
            });
            tokio::task::yield_now().await;
        });
        drop(runtime);
        assert!(rx.recv().unwrap(), "answered as not recorded");
    }

    fn params(tool: &str) -> CacheSafeParams {
        CacheSafeParams::builder("m")
            .tool(ToolDefinition::new(tool, "a tool", r#"{"type":"object"}"#).unwrap())
            .messages(vec![Message::user_text("hi")])
            .build()
    }

    #[test]
    fn a_break_is_named_whether_or_not_the_prefix_was_appended_to() {
        let sent = params("Read");
        let last = LastPrefix::Sent(sent.clone());
        // Appended to: no break, and nothing is hashed to know it.
        let next = sent.append(vec![Message::assistant_text("hello")]);
        assert_eq!(last.break_before(&next), None);
        // Equal but rebuilt: the fingerprints agree.
        assert_eq!(last.break_before(&params("Read")), None);
        // A changed tool or a rewritten history is a break, named.
        let other = params("Write").append(vec![Message::assistant_text("hello")]);
        assert_eq!(
            last.break_before(&other).map(|b| b.to_string()).as_deref(),
            Some("tools[0] changed")
        );
        let rewritten = sent.with_messages(vec![Message::user_text("bye")]);
        assert!(last.break_before(&rewritten).is_some());
        // Against an expected fingerprint (a fork child's parent's), the same answers.
        let expected = LastPrefix::Expected(Box::new(sent.fingerprint().clone()));
        assert_eq!(expected.break_before(&next), None);
        assert!(expected.break_before(&other).is_some());
    }
}
