//! [`Agent`]: one agent's loop, and [`AgentBuilder`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use forkhive_core::{
    CacheBreak, CacheSafeParams, ContentBlock, Message, PrefixFingerprint, Role, TaskId, Usage,
};
use forkhive_transport::{
    Backend, Request, RequestSettings, Response, ResponseBuilder, StopReason as ModelStop,
    StreamEvent,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::base::context::{AgentContext, AgentKind, QuerySource};
use crate::base::events::{Emitter, EventKind, EventSink};
use crate::base::outcome::{AgentRun, Limits, StopReason, TurnRecord, model_stop_str};
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

/// The user message sent after the model stopped at `max_tokens` in the middle of text.
pub const CONTINUE_PROMPT: &str = "Your last answer was cut off by the output token limit. \
Continue exactly where it stopped: do not repeat anything or apologise.";

/// What a spawner hands a child: identity, state and links to the parent, derived in one place
/// so every strategy isolates children the same way.
///
/// "Coordinator Mode — createSubagentContext": the child's cancellation token is a child of
/// the parent's (cancelling the parent cancels it, not the other way round), its file-read
/// state is a copy, and the tree state is the root's.
#[derive(Debug)]
pub struct ChildSeed {
    /// The child's identity.
    pub context: AgentContext,
    /// A copy of the parent's state.
    pub state: AgentState,
    /// The root's shared state.
    pub tree: Arc<TreeState>,
    /// A child of the parent's token.
    pub cancel: CancellationToken,
    /// The parent's permission policy (for `permissionMode: bubble`).
    pub parent_policy: Arc<dyn PermissionPolicy>,
}

/// What [`Agent::resume`] found in the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeReport {
    /// The transcript.
    pub path: PathBuf,
    /// How many messages were restored.
    pub messages: usize,
    /// How many model turns the transcript recorded.
    pub turns: usize,
    /// A last line cut by a crash, left out (and cut from the file before appending).
    pub dropped: Option<transcript::DroppedTail>,
    /// Tool calls the transcript left without results (a crash mid-round); each was answered
    /// with an error result before the agent goes on.
    pub interrupted_calls: usize,
}

/// Builds an [`Agent`]; see [`Agent::builder`].
#[derive(Debug)]
pub struct AgentBuilder {
    backend: Arc<dyn Backend>,
    params: Option<CacheSafeParams>,
    model: Option<String>,
    system: Vec<String>,
    system_context: Vec<(String, String)>,
    user_context: Vec<(String, String)>,
    definition: Option<Arc<AgentDefinition>>,
    tools: ToolPool,
    filter: Option<Arc<ToolFilter>>,
    audience: Option<ToolAudience>,
    trust_modes: bool,
    policy: Arc<dyn PermissionPolicy>,
    parent_policy: Option<Arc<dyn PermissionPolicy>>,
    limits: Limits,
    settings: RequestSettings,
    context: Option<AgentContext>,
    state: AgentState,
    tree: Option<Arc<TreeState>>,
    cancel: Option<CancellationToken>,
    events: Option<Arc<dyn EventSink>>,
    transcript_dir: Option<PathBuf>,
    pending: PendingQueue,
    expected_prefix: Option<PrefixFingerprint>,
    unsent: Vec<Message>,
    detach: bool,
    keep_children: bool,
    inherit_transcript: Option<usize>,
}

impl AgentBuilder {
    fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            params: None,
            model: None,
            system: Vec::new(),
            system_context: Vec::new(),
            user_context: Vec::new(),
            definition: None,
            tools: ToolPool::empty(),
            filter: None,
            audience: None,
            trust_modes: false,
            policy: Arc::new(AllowAll),
            parent_policy: None,
            limits: Limits::default(),
            settings: RequestSettings::default(),
            context: None,
            state: AgentState::default(),
            tree: None,
            cancel: None,
            events: None,
            transcript_dir: None,
            pending: PendingQueue::new(),
            expected_prefix: None,
            unsent: Vec::new(),
            detach: false,
            keep_children: false,
            inherit_transcript: None,
        }
    }

    /// Starts from already rendered cache-safe parameters (system, contexts, tools, model and
    /// any messages). Their tool array is kept byte for byte; every tool in it must be in the
    /// pool. Overrides [`model`](Self::model), [`system_prompt`](Self::system_prompt) and the
    /// definition's rendering.
    pub fn params(mut self, params: CacheSafeParams) -> Self {
        self.params = Some(params);
        self
    }

    /// The model (required unless [`params`](Self::params) or a definition names one).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Appends a system prompt block (used when no [`params`](Self::params) are given).
    pub fn system_prompt(mut self, text: impl Into<String>) -> Self {
        self.system.push(text.into());
        self
    }

    /// Appends a system context entry (rendered after the system prompt; order is kept).
    pub fn system_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.system_context.push((key.into(), value.into()));
        self
    }

    /// Appends a user context entry (sent ahead of the conversation; order is kept).
    /// Definitions with `omitClaudeMd` drop entries keyed `claudeMd`.
    pub fn user_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.user_context.push((key.into(), value.into()));
        self
    }

    /// Renders the agent from a definition: its system prompt (unless system blocks were
    /// given), its model (`inherit` or none: the builder's), its tools through the three
    /// filtering layers, its `maxTurns` and its `permissionMode`. Takes an `AgentDefinition`
    /// or an `Arc` of one (shared by every child of a definition, not copied per child).
    pub fn definition(mut self, definition: impl Into<Arc<AgentDefinition>>) -> Self {
        self.definition = Some(definition.into());
        self
    }

    /// The tools available before filtering.
    pub fn tools(mut self, tools: ToolPool) -> Self {
        self.tools = tools;
        self
    }

    /// The lists of filtering layers 1 and 2 (default: Claude Code's). Takes a
    /// [`ToolFilter`] or an `Arc` of one, which children built from one config share.
    pub fn tool_filter(mut self, filter: impl Into<Arc<ToolFilter>>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// Who the tools are for. Default: from the agent's kind — [`ToolAudience::Main`] for a
    /// main agent, `Foreground` for a subagent or fork, `Teammate` for a teammate.
    pub fn audience(mut self, audience: ToolAudience) -> Self {
        self.audience = Some(audience);
        self
    }

    /// Whether a definition's loosening `permissionMode` (`acceptEdits`, `bypassPermissions`)
    /// is honoured (default: no — the host's policy decides; tightening modes always apply).
    pub fn trust_permission_modes(mut self, trust: bool) -> Self {
        self.trust_modes = trust;
        self
    }

    /// The permission policy (default: [`AllowAll`]).
    pub fn policy(mut self, policy: Arc<dyn PermissionPolicy>) -> Self {
        self.policy = policy;
        self
    }

    /// The limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Per-request settings (`max_tokens` is taken from the limits).
    pub fn settings(mut self, settings: RequestSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The agent's identity (default: a main agent with a fresh id).
    pub fn context(mut self, context: AgentContext) -> Self {
        self.context = Some(context);
        self
    }

    /// Builds a child from a parent's [`ChildSeed`]: identity, copied state, tree state,
    /// linked cancellation and the parent's policy (for `bubble`).
    pub fn child_of(mut self, seed: ChildSeed) -> Self {
        self.context = Some(seed.context);
        self.state = seed.state;
        self.tree = Some(seed.tree);
        self.cancel = Some(seed.cancel);
        self.parent_policy = Some(seed.parent_policy);
        self
    }

    /// Links the agent to `token` (default: a new root token): cancelling `token` stops the
    /// agent and everything it started. The agent runs on a child of `token`, so dropping the
    /// agent (which stops its children, see [`Agent`]) never cancels `token` itself: a host
    /// may share one token among many agents.
    pub fn cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token.child_token());
        self
    }

    /// Writes only the messages after the first `messages` to the transcript: those are the
    /// parent's, already in the parent's transcript beside this one (`<parent id>.jsonl` in the
    /// same directory), and [`transcript::read`] reads them from there. A fork child's
    /// transcript costs O(directive) this way instead of O(history). Ignored without a
    /// parent or when the parameters hold fewer messages.
    pub fn inherit_transcript(mut self, messages: usize) -> Self {
        self.inherit_transcript = Some(messages);
        self
    }

    /// Whether dropping the agent stops the children it started that are still running
    /// (default: yes). Turn it off only when something else owns them — for instance a host
    /// that keeps the tree's [`TaskService`](crate::task::TaskService) and cancels through it.
    pub fn cancel_children_on_drop(mut self, cancel: bool) -> Self {
        self.keep_children = !cancel;
        self
    }

    /// Where events go.
    pub fn events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.events = Some(sink);
        self
    }

    /// Writes the transcript to `<dir>/<agent id>.jsonl` (the directory must exist).
    pub fn transcript_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.transcript_dir = Some(dir.into());
        self
    }

    /// Uses `queue` as the agent's pending-message queue (to hand it out before building).
    pub fn pending(mut self, queue: PendingQueue) -> Self {
        self.pending = queue;
        self
    }

    /// The fingerprint the first request is expected to extend (a fork child's parent's last
    /// request): anything but an append is reported as a cache break before it is sent.
    pub fn expect_prefix(mut self, fingerprint: PrefixFingerprint) -> Self {
        self.expected_prefix = Some(fingerprint);
        self
    }

    /// Messages that end the conversation but go in the first request's *suffix*, so the
    /// codec can place a cache breakpoint inside them (a fork child's message: its boilerplate
    /// block is shared by every sibling). They are part of the conversation from the start;
    /// run the agent with [`Agent::run_pending`] or [`Agent::continue_run`].
    pub fn first_request_suffix(mut self, messages: Vec<Message>) -> Self {
        self.unsent = messages;
        self
    }

    /// When the model ends its turn while background children are still running, stop
    /// instead of waiting for their notifications (the host polls the queue itself).
    pub fn detach_background(mut self, detach: bool) -> Self {
        self.detach = detach;
        self
    }

    /// Renders the parameters and tools, opens the transcript, and returns the agent.
    pub async fn build(self) -> Result<Agent> {
        let def = self.definition.as_deref();
        let audience =
            self.audience
                .unwrap_or(match self.context.as_ref().map(AgentContext::kind) {
                    None | Some(AgentKind::Main) => ToolAudience::Main,
                    Some(AgentKind::Teammate) => ToolAudience::Teammate,
                    Some(_) => ToolAudience::Foreground,
                });
        let pool = match def {
            Some(d) if self.params.is_none() => {
                static DEFAULT_FILTER: std::sync::LazyLock<ToolFilter> =
                    std::sync::LazyLock::new(ToolFilter::default);
                let filter = self.filter.as_deref().unwrap_or(&DEFAULT_FILTER);
                let names: Vec<String> = filter
                    .apply(
                        &self.tools.names(),
                        audience,
                        d.tools.as_deref(),
                        d.disallowed_tools.as_deref(),
                    )
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                self.tools.retain(|n| names.iter().any(|k| k == n))
            }
            _ => self.tools.clone(),
        };
        let (params, pool) = match self.params {
            Some(p) => {
                for t in p.tools() {
                    if pool.get(&t.name).is_none() {
                        return Err(Error::Config(format!(
                            "the parameters name tool `{}`, which is not in the tool pool",
                            t.name
                        )));
                    }
                }
                // Only what the model was offered may run. A pool that already is exactly the
                // offered array (a cached head's) is kept as it is.
                let exact = pool.len() == p.tools().len()
                    && pool
                        .names()
                        .iter()
                        .zip(p.tools())
                        .all(|(n, t)| *n == t.name);
                let offered = if exact {
                    pool
                } else {
                    pool.retain(|n| p.tools().iter().any(|t| t.name == n))
                };
                (p, offered)
            }
            None => {
                let def_model = def
                    .and_then(|d| d.model.as_deref())
                    .filter(|m| *m != "inherit");
                let model = def_model.map(str::to_owned).or(self.model).ok_or_else(|| {
                    Error::Config(
                        "no model: set one on the builder, or give parameters or a \
                             definition that names one"
                            .to_owned(),
                    )
                })?;
                let mut b = CacheSafeParams::builder(model).tools(pool.definitions());
                let system = if self.system.is_empty() {
                    def.map(|d| vec![d.system_prompt.clone()])
                        .unwrap_or_default()
                } else {
                    self.system
                };
                for s in system.into_iter().filter(|s| !s.is_empty()) {
                    b = b.system_block(s);
                }
                for (k, v) in self.system_context {
                    b = b.system_context(k, v);
                }
                let omit_claude_md = def.is_some_and(|d| d.omit_claude_md);
                for (k, v) in self.user_context {
                    if !(omit_claude_md && k == "claudeMd") {
                        b = b.user_context(k, v);
                    }
                }
                (b.build(), pool)
            }
        };
        let mut limits = self.limits;
        if let Some(n) = def.and_then(|d| d.max_turns) {
            limits.max_turns = Some(n);
        }
        let policy = policy_for_mode(
            def.and_then(|d| d.permission_mode.as_ref()),
            self.policy,
            self.parent_policy,
            self.trust_modes,
        );
        let context = match self.context {
            Some(c) => c,
            None => {
                let source = def.map_or_else(QuerySource::main, |d| {
                    if d.source == crate::definition::DefinitionSource::BuiltIn {
                        QuerySource::builtin(&d.name)
                    } else {
                        QuerySource::custom(&d.name)
                    }
                });
                let kind = if def.is_some() {
                    AgentKind::Subagent
                } else {
                    AgentKind::Main
                };
                let cx = AgentContext::new(
                    TaskId::generate(forkhive_core::TaskKind::Agent),
                    kind,
                    source,
                );
                match def {
                    Some(d) => cx.with_agent_type(d.name.clone()),
                    None => cx,
                }
            }
        };
        let cx = Arc::new(context);
        let inherit = self
            .inherit_transcript
            .filter(|n| *n > 0 && *n <= params.messages().len() && cx.parent().is_some());
        let transcript = match &self.transcript_dir {
            Some(dir) => {
                let header = TranscriptHeader {
                    version: TRANSCRIPT_VERSION,
                    agent_id: cx.id().to_string(),
                    parent_id: cx.parent().map(ToString::to_string),
                    depth: cx.depth(),
                    kind: cx.kind(),
                    query_source: cx.query_source().to_string(),
                    definition: def
                        .map(|d| d.name.clone())
                        .or_else(|| cx.agent_type().map(str::to_owned)),
                    model: params.model().to_owned(),
                    prefix_fingerprint: params.fingerprint().total().to_string(),
                    prefix: PrefixRecord::of(&params),
                    permission_mode: def
                        .and_then(|d| d.permission_mode)
                        .map(|m| m.as_str().to_owned()),
                    max_turns: def.and_then(|d| d.max_turns),
                    inherited_messages: inherit,
                };
                let mut w = TranscriptWriter::create(dir, &header).await?;
                // Messages inherited from the parent's transcript are referenced, not copied.
                let skip = inherit.unwrap_or(0);
                for m in params.messages().iter().skip(skip).chain(&self.unsent) {
                    w.message(m).await?;
                }
                Some(w)
            }
            None => None,
        };
        let emit = Emitter::new(*cx.id(), self.events.clone());
        let mut settings = self.settings;
        settings.max_tokens = limits.max_output_tokens;
        Ok(Agent {
            shared: Arc::new(AgentShared {
                backend: self.backend,
                pool,
                policy,
                limits,
                settings,
                cx,
                state: self.state,
                tree: self.tree.unwrap_or_default(),
                cancel: self.cancel.unwrap_or_default(),
                pending: self.pending,
                events: self.events,
                transcript_dir: self.transcript_dir,
                wait_for_promises: !self.detach,
            }),
            params,
            emit,
            transcript,
            last_prefix: self
                .expected_prefix
                .map(|fp| LastPrefix::Expected(Box::new(fp))),
            turn: 0,
            unsent: self.unsent,
            keep_children: self.keep_children,
        })
    }
}

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
    transcript: Option<TranscriptWriter>,
    last_prefix: Option<LastPrefix>,
    turn: u32,
    /// Messages already in the conversation but sent as the next request's suffix (a fork
    /// child's first message, so that its boilerplate block gets a cache breakpoint).
    unsent: Vec<Message>,
    /// Leave running children alone when dropped.
    keep_children: bool,
}

/// Dropping an agent stops everything it started that still runs: a run that ended at a limit
/// (`MaxTurns`, a budget) or failed may leave background children behind, and once the agent is
/// gone nobody reads their notifications. Each stopped child still ends `killed`, recorded and
/// accounted by its owner ([`TaskService`](crate::task::TaskService)). The agent's token is its
/// own (a child of any token the host passed in), so no host token is cancelled. Opt out with
/// [`AgentBuilder::cancel_children_on_drop`].
impl Drop for Agent {
    fn drop(&mut self) {
        if !self.keep_children {
            self.shared.cancel.cancel();
        }
    }
}

/// The parts of an agent its tools may use — to spawn a child with the same backend, tools
/// and policy, deliver it messages, or reach the tree — shared behind one `Arc`.
#[derive(Debug)]
pub struct AgentShared {
    /// The model backend.
    pub backend: Arc<dyn Backend>,
    /// The agent's tools (after filtering).
    pub pool: ToolPool,
    /// The agent's permission policy.
    pub policy: Arc<dyn PermissionPolicy>,
    /// The agent's limits.
    pub limits: Limits,
    /// The agent's per-request settings.
    pub settings: RequestSettings,
    /// The agent's identity.
    pub cx: Arc<AgentContext>,
    /// The agent's own state.
    pub state: AgentState,
    /// The tree's shared state.
    pub tree: Arc<TreeState>,
    /// The agent's cancellation token.
    pub cancel: CancellationToken,
    /// The agent's pending-message queue.
    pub pending: PendingQueue,
    /// Where the agent's events go.
    pub events: Option<Arc<dyn EventSink>>,
    /// Where the agent writes its transcript (children write theirs beside it).
    pub transcript_dir: Option<PathBuf>,
    /// Whether a finished turn waits for promised messages (background children).
    pub wait_for_promises: bool,
}

impl crate::tool::Caller for AgentShared {
    fn context(&self) -> &Arc<AgentContext> {
        &self.cx
    }
    fn pending(&self) -> &PendingQueue {
        &self.pending
    }
    fn tree(&self) -> &Arc<TreeState> {
        &self.tree
    }
    fn events(&self) -> Option<&Arc<dyn EventSink>> {
        self.events.as_ref()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl AgentShared {
    /// The whole of the agent a tool call runs for, when that agent is this crate's loop (the
    /// crate's spawning tools build a child from it).
    pub(crate) fn of(cx: &ToolContext) -> Option<&AgentShared> {
        cx.caller()?.as_any().downcast_ref()
    }

    /// What a child of this agent starts from (see [`ChildSeed`]).
    pub fn child_seed(&self, id: TaskId, kind: AgentKind, source: QuerySource) -> ChildSeed {
        ChildSeed {
            context: self.cx.child(id, kind, source),
            state: self.state.fork_for_child(),
            tree: Arc::clone(&self.tree),
            cancel: self.cancel.child_token(),
            parent_policy: Arc::clone(&self.policy),
        }
    }
}

/// How one model turn ended, for the loop.
enum TurnEnd {
    /// Go on with another model turn.
    Continue,
    /// The model ended its turn (no tool calls).
    EndTurn,
    /// Stop now.
    Stop(StopReason),
}

/// Accumulates one run's results.
#[derive(Default)]
struct RunState {
    turns: Vec<TurnRecord>,
    usage: Usage,
    /// How many messages the conversation held when the run began: the run's own messages
    /// are the ones after them.
    start: usize,
    final_text: String,
    continuations: u32,
    pauses: u32,
    /// Text of assistant messages cut at `max_tokens` and continued, not yet complete.
    continued: String,
    error: Option<Arc<Error>>,
}

impl Agent {
    /// Starts a builder on `backend`.
    pub fn builder(backend: Arc<dyn Backend>) -> AgentBuilder {
        AgentBuilder::new(backend)
    }

    /// Rebuilds an agent from its transcript, byte for byte, and goes on appending to it.
    ///
    /// `builder` supplies the backend, tools, policy and limits; the identity, model, system
    /// prompt, contexts, tool array and conversation come from the transcript, so the resumed
    /// agent's next request extends the cache it left. A last line cut by a crash is left out
    /// (and cut from the file) and reported; any other damage is [`Error::Transcript`].
    pub async fn resume(builder: AgentBuilder, path: &Path) -> Result<(Agent, ResumeReport)> {
        let t = transcript::read(path).await?;
        let id: TaskId = t.header.agent_id.parse().map_err(|e| Error::Transcript {
            path: path.to_path_buf(),
            line: 1,
            message: format!("bad agent_id: {e}"),
        })?;
        let parent: Option<TaskId> = match &t.header.parent_id {
            Some(p) => Some(p.parse().map_err(|e| Error::Transcript {
                path: path.to_path_buf(),
                line: 1,
                message: format!("bad parent_id: {e}"),
            })?),
            None => None,
        };
        let source = QuerySource::from_label(t.header.query_source.clone());
        let mut cx =
            AgentContext::new(id, t.header.kind, source).with_lineage(parent, t.header.depth);
        if let Some(d) = &t.header.definition {
            cx = cx.with_agent_type(d.clone());
        }
        // The definition's restrictions survive a resume: its tools are the header's tool array
        // (the pool is narrowed to it), its permission mode and turn limit are re-applied.
        let definition = match (&t.header.permission_mode, t.header.max_turns) {
            (None, None) => None,
            (mode, max_turns) => {
                let name = t.header.definition.clone().unwrap_or_default();
                let mut d =
                    AgentDefinition::new(name, "", crate::definition::DefinitionSource::BuiltIn);
                d.max_turns = max_turns;
                d.permission_mode = match mode {
                    Some(m) => Some(m.parse().map_err(|e| Error::Transcript {
                        path: path.to_path_buf(),
                        line: 1,
                        message: format!("bad permission_mode: {e}"),
                    })?),
                    None => None,
                };
                Some(d)
            }
        };
        let mut params = t.params();
        let writer = TranscriptWriter::reopen(&t).await?;
        let mut agent = AgentBuilder {
            params: Some(params.clone()),
            context: Some(cx),
            transcript_dir: None,
            definition: definition.map(Arc::new),
            ..builder
        }
        .build()
        .await?;
        agent.transcript = Some(writer);
        // A crash in the middle of a tool round leaves calls without results, which no provider
        // accepts: answer each with an error and record it.
        let interrupted: Vec<ContentBlock> = match params.messages().last() {
            Some(m) if m.role == Role::Assistant => m
                .tool_uses()
                .map(|(id, name, _)| {
                    ToolOutput::error(format!(
                        "the call to `{name}` was interrupted: the agent stopped before it \
                         finished, and was resumed from its transcript; check its effects and \
                         call it again if needed"
                    ))
                    .into_result_block(id)
                })
                .collect(),
            _ => Vec::new(),
        };
        let interrupted_calls = interrupted.len();
        if interrupted_calls > 0 {
            let m = Message::user(interrupted);
            if let Some(w) = &mut agent.transcript {
                w.message(&m).await?;
            }
            params = params.append(vec![m]);
            agent.params = params;
        }
        agent.turn = t.turns.iter().map(|u| u.turn).max().unwrap_or(0);
        agent.last_prefix = Some(LastPrefix::Sent(agent.params.clone()));
        let report = ResumeReport {
            path: path.to_path_buf(),
            messages: t.messages.len(),
            turns: t.turns.len(),
            dropped: t.dropped.clone(),
            interrupted_calls,
        };
        Ok((agent, report))
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
        self.transcript.as_ref().map(TranscriptWriter::path)
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
    pub fn shared(&self) -> &Arc<AgentShared> {
        &self.shared
    }

    /// Adds `prompt` as a user message (with any pending messages after it) and runs the loop
    /// until the model stops, a limit is reached, or the agent is cancelled.
    pub async fn run(&mut self, prompt: impl Into<String>) -> AgentRun {
        let mut blocks = vec![ContentBlock::text(prompt)];
        blocks.extend(self.drain_pending());
        self.run_with(Some(blocks)).await
    }

    /// Runs the loop on the conversation as it stands — it must end with a user message (or
    /// [`AgentBuilder::first_request_suffix`] messages), as a fork child's or a resumed agent's
    /// does — adding only what is pending.
    pub async fn continue_run(&mut self) -> AgentRun {
        let pending = self.drain_pending();
        self.run_with((!pending.is_empty()).then_some(pending))
            .await
    }

    /// Runs the loop on whatever is pending (waiting for a promised message if none is
    /// queued yet). Returns at once, [`StopReason::Completed`], when nothing is pending or
    /// expected.
    pub async fn run_pending(&mut self) -> AgentRun {
        let wake = tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => None,
            w = self.shared.pending.wait() => Some(w),
        };
        match wake {
            None => {
                let run = self.run_state();
                self.finish(run, StopReason::Cancelled).await
            }
            Some(Wake::Idle) => {
                let run = self.run_state();
                self.finish(run, StopReason::Completed).await
            }
            Some(Wake::Messages(mut ms)) => {
                self.coalesce(&mut ms).await;
                self.emit
                    .emit(EventKind::MessagesInjected { count: ms.len() });
                let blocks = ms.into_iter().map(|m| ContentBlock::text(m.text)).collect();
                self.run_with(Some(blocks)).await
            }
        }
    }

    /// After waking on a message while more are promised, waits up to
    /// `Limits::notification_window` (or until nothing more is promised) and takes what else
    /// arrived, so children finishing together reach the model in one turn, not one each.
    async fn coalesce(&self, ms: &mut Vec<PendingMessage>) {
        let window = self.shared.limits.notification_window;
        if window.is_zero() || self.shared.pending.outstanding() == 0 {
            return;
        }
        tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => {}
            () = self.shared.pending.settled() => {}
            () = tokio::time::sleep(window) => {}
        }
        ms.extend(self.shared.pending.drain());
    }

    /// `<agent id>-<turn>`, in one allocation.
    fn request_label(&self) -> String {
        use std::fmt::Write as _;
        let mut label = String::with_capacity(24);
        let _ = write!(label, "{}-{}", self.shared.cx.id(), self.turn);
        label
    }

    /// The state of a run that begins now.
    fn run_state(&self) -> RunState {
        RunState {
            start: self.params.messages().len(),
            ..RunState::default()
        }
    }

    fn drain_pending(&self) -> Vec<ContentBlock> {
        let pending: Vec<PendingMessage> = self.shared.pending.drain();
        if !pending.is_empty() {
            self.emit.emit(EventKind::MessagesInjected {
                count: pending.len(),
            });
        }
        pending
            .into_iter()
            .map(|m| ContentBlock::text(m.text))
            .collect()
    }

    async fn run_with(&mut self, first: Option<Vec<ContentBlock>>) -> AgentRun {
        let span = tracing::info_span!(
            "agent",
            agent_id = %self.shared.cx.id(),
            parent = ?self.shared.cx.parent().map(ToString::to_string),
            kind = %self.shared.cx.kind(),
            model = %self.params.model(),
        );
        let cx = Arc::clone(&self.shared.cx);
        // Boxed: the loop's state is allocated when the run starts, so a task holding an
        // agent that has not started yet (a background child behind its gate, or one of
        // thousands just spawned) stays small.
        Box::pin(cx.scope(self.run_loop(first).instrument(span))).await
    }

    async fn run_loop(&mut self, first: Option<Vec<ContentBlock>>) -> AgentRun {
        let _live = self.shared.tree.enter();
        let mut run = self.run_state();
        if let Some(first) = first
            && let Err(e) = self.push(vec![Message::user(first)]).await
        {
            run.error = Some(Arc::new(e));
            return self.finish(run, StopReason::Failed).await;
        }
        loop {
            if self.shared.cancel.is_cancelled() {
                return self.finish(run, StopReason::Cancelled).await;
            }
            if let Some(limit) = self.shared.limits.max_turns
                && run.turns.len() >= limit as usize
            {
                return self.finish(run, StopReason::MaxTurns { limit }).await;
            }
            if let Some(limit) = self.shared.limits.token_budget {
                let used = run.usage.total_tokens();
                if used >= limit {
                    return self
                        .finish(run, StopReason::TokenBudget { limit, used })
                        .await;
                }
            }
            self.turn += 1;
            self.emit.set_turn(self.turn);
            let span = tracing::info_span!("turn", turn = self.turn);
            // Boxed: a turn's state (stream, tool round) lives only while the turn runs, so
            // an agent waiting between turns — or thousands of background children not yet
            // started — hold a small future.
            let end = Box::pin(self.turn_once(&mut run).instrument(span)).await;
            match end {
                TurnEnd::Continue => {}
                TurnEnd::Stop(reason) => return self.finish(run, reason).await,
                TurnEnd::EndTurn => {
                    let wake = if self.shared.wait_for_promises {
                        tokio::select! {
                            biased;
                            () = self.shared.cancel.cancelled() => None,
                            w = self.shared.pending.wait() => Some(w),
                        }
                    } else {
                        let ms = self.shared.pending.drain();
                        Some(if ms.is_empty() {
                            Wake::Idle
                        } else {
                            Wake::Messages(ms)
                        })
                    };
                    match wake {
                        None => return self.finish(run, StopReason::Cancelled).await,
                        Some(Wake::Idle) => return self.finish(run, StopReason::Completed).await,
                        Some(Wake::Messages(mut ms)) => {
                            self.coalesce(&mut ms).await;
                            self.emit
                                .emit(EventKind::MessagesInjected { count: ms.len() });
                            let blocks =
                                ms.into_iter().map(|m| ContentBlock::text(m.text)).collect();
                            if let Err(e) = self.push(vec![Message::user(blocks)]).await {
                                run.error = Some(Arc::new(e));
                                return self.finish(run, StopReason::Failed).await;
                            }
                        }
                    }
                }
            }
        }
    }

    /// One model turn and, if the model called tools, one tool round.
    async fn turn_once(&mut self, run: &mut RunState) -> TurnEnd {
        self.emit.emit(EventKind::TurnStarted);
        let suffix = std::mem::take(&mut self.unsent);
        let request = Request::new(self.params.clone(), suffix.clone())
            .with_settings(self.shared.settings.clone())
            .with_label(self.request_label());
        let prefix = self.params.clone();
        // The suffix is already part of the conversation (and the transcript).
        let suffix_len = suffix.len();
        if suffix_len > 0 {
            self.params = self.params.append(suffix);
        }
        let sent = self.params.clone();
        if let Some(at) = self
            .last_prefix
            .as_ref()
            .and_then(|last| last.break_before(&prefix))
        {
            tracing::warn!(agent = %self.shared.cx.id(), "prompt cache break: {at}");
            self.emit.emit(EventKind::CacheBreak { at });
        }
        self.emit.emit(EventKind::RequestSent {
            prefix: prefix.clone(),
            messages: self.params.messages().len(),
            invoking_request_id: self.shared.cx.take_invoking_request_id(),
        });
        self.last_prefix = Some(LastPrefix::Sent(prefix.clone()));

        let answer = tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => return TurnEnd::Stop(StopReason::Cancelled),
            a = self.stream(&request) => a,
        };
        let (response, cut_off) = match answer {
            Ok(r) => r,
            Err(source) => {
                tracing::error!(agent = %self.shared.cx.id(), "backend failed: {source}");
                run.error = Some(Arc::new(Error::Backend {
                    turn: self.turn,
                    source,
                }));
                return TurnEnd::Stop(StopReason::Failed);
            }
        };
        let Response {
            message,
            stop_reason,
            usage,
            ..
        } = response;
        self.emit.emit(EventKind::ResponseReceived {
            usage,
            stop_reason: stop_reason.clone(),
        });
        run.usage += usage;
        let calls = ToolCall::from_message(&message);
        let record = TurnRecord {
            turn: self.turn,
            prefix: prefix.clone(),
            usage,
            stop_reason: model_stop_str(stop_reason.as_ref()),
            tool_calls: calls.len(),
        };
        if let Some(w) = &mut self.transcript
            && let Err(e) = w.usage(&record).await
        {
            run.error = Some(Arc::new(e));
            run.turns.push(record);
            return TurnEnd::Stop(StopReason::Failed);
        }
        run.turns.push(record);

        let snapshot = (!calls.is_empty())
            .then(|| Arc::new(TurnSnapshot::new(sent, message.clone(), self.turn)));
        let has_content = !message.content.is_empty();
        // The limits on continuations and resends count in a row: any other answer resets them.
        let cut_in_text = stop_reason == Some(ModelStop::MaxTokens) && calls.is_empty();
        if !cut_in_text {
            run.continuations = 0;
        }
        if stop_reason != Some(ModelStop::PauseTurn) {
            run.pauses = 0;
        }
        if has_content {
            // An answer continued after `max_tokens` is the concatenation of its parts.
            let text = message.text();
            if cut_in_text || stop_reason == Some(ModelStop::PauseTurn) {
                run.continued.push_str(&text);
                run.final_text.clone_from(&run.continued);
            } else {
                run.final_text = std::mem::take(&mut run.continued) + &text;
            }
            if let Err(e) = self.push(vec![message]).await {
                run.error = Some(Arc::new(e));
                return TurnEnd::Stop(StopReason::Failed);
            }
        }

        if !calls.is_empty() {
            let results = self.tool_round(&calls, &cut_off, snapshot).await;
            let mut blocks = results;
            blocks.extend(self.drain_pending());
            if let Err(e) = self.push(vec![Message::user(blocks)]).await {
                run.error = Some(Arc::new(e));
                return TurnEnd::Stop(StopReason::Failed);
            }
            if self.shared.cancel.is_cancelled() {
                return TurnEnd::Stop(StopReason::Cancelled);
            }
            return TurnEnd::Continue;
        }

        match stop_reason {
            Some(ModelStop::MaxTokens) => {
                if run.continuations >= self.shared.limits.max_continuations {
                    return TurnEnd::Stop(StopReason::OutputLimit {
                        continuations: run.continuations,
                    });
                }
                run.continuations += 1;
                let mut blocks = vec![ContentBlock::text(CONTINUE_PROMPT)];
                blocks.extend(self.drain_pending());
                match self.push(vec![Message::user(blocks)]).await {
                    Ok(()) => TurnEnd::Continue,
                    Err(e) => {
                        run.error = Some(Arc::new(e));
                        TurnEnd::Stop(StopReason::Failed)
                    }
                }
            }
            Some(ModelStop::PauseTurn) if has_content => {
                if run.pauses >= self.shared.limits.max_pause_resends {
                    return TurnEnd::Stop(StopReason::PauseLimit {
                        resends: run.pauses,
                    });
                }
                run.pauses += 1;
                // Resend as is: the provider continues the paused assistant turn.
                TurnEnd::Continue
            }
            Some(ModelStop::Refusal) => TurnEnd::Stop(StopReason::Refusal),
            _ => TurnEnd::EndTurn,
        }
    }

    /// Streams one answer, surfacing text deltas as events.
    async fn stream(
        &self,
        request: &Request,
    ) -> std::result::Result<(Response, Vec<String>), forkhive_transport::Error> {
        let mut events = self.shared.backend.stream(request).await?;
        let mut builder = ResponseBuilder::new();
        while let Some(event) = events.next().await {
            let event = event?;
            if let StreamEvent::TextDelta { text, .. } = &event {
                self.emit.emit(EventKind::TextDelta { text: text.clone() });
            }
            builder.push(&event)?;
        }
        builder.finish_cut_off()
    }

    /// Runs the calls of one assistant message; calls cut off at `max_tokens` are answered
    /// with an error instead of running.
    async fn tool_round(
        &self,
        calls: &[ToolCall],
        cut_off: &[String],
        turn: Option<Arc<TurnSnapshot>>,
    ) -> Vec<ContentBlock> {
        let cx = ToolContext {
            agent: Arc::clone(&self.shared.cx),
            state: self.shared.state.clone(),
            cancel: self.shared.cancel.clone(),
            tool_use_id: Arc::from(""),
            caller: Some(Arc::clone(&self.shared) as Arc<dyn crate::tool::Caller>),
            turn,
        };
        let round = Round {
            pool: &self.shared.pool,
            policy: &self.shared.policy,
            cx: &cx,
            config: RoundConfig {
                max_concurrency: self.shared.limits.max_concurrent_tools,
                timeout: self.shared.limits.tool_timeout,
            },
            emit: &self.emit,
        };
        if cut_off.is_empty() {
            return round.run(calls).await;
        }
        let runnable: Vec<ToolCall> = calls
            .iter()
            .filter(|c| !cut_off.iter().any(|id| **id == *c.id))
            .cloned()
            .collect();
        let mut ran = round.run(&runnable).await.into_iter();
        calls
            .iter()
            .map(|c| {
                if cut_off.iter().any(|id| **id == *c.id) {
                    ToolOutput::error(format!(
                        "the call to `{}` was cut off by the output token limit before its \
                         input was complete, so it did not run; make the call again with a \
                         shorter input",
                        c.name
                    ))
                    .into_result_block(&*c.id)
                } else {
                    ran.next().unwrap_or_else(|| {
                        ToolOutput::error("internal: missing tool result").into_result_block(&*c.id)
                    })
                }
            })
            .collect()
    }

    /// Appends messages to the conversation (O(new)) and the transcript.
    async fn push(&mut self, messages: Vec<Message>) -> Result<()> {
        if let Some(w) = &mut self.transcript {
            // Boxed, like every file write here: the agent's future stays small.
            Box::pin(async {
                for m in &messages {
                    w.message(m).await?;
                }
                Ok::<_, Error>(())
            })
            .await?;
        }
        self.params = self.params.append(messages);
        Ok(())
    }

    async fn finish(&mut self, run: RunState, stop: StopReason) -> AgentRun {
        let mut run = run;
        if stop == StopReason::Cancelled {
            // Cancelling an agent cancels its children; give their notifications a moment to
            // arrive, so a cancelled run returns with its tree's results in its queue.
            let grace = self.shared.limits.cancel_grace;
            let _ = Box::pin(tokio::time::timeout(grace, self.shared.pending.settled())).await;
        }
        if let Some(w) = &mut self.transcript
            && let Err(e) = Box::pin(w.stop(&stop, run.usage)).await
        {
            tracing::warn!(agent = %self.shared.cx.id(), "could not record the stop: {e}");
            if run.error.is_none() {
                run.error = Some(Arc::new(e));
            }
        }
        self.emit.emit(EventKind::Stopped {
            reason: stop.clone(),
            usage: run.usage,
        });
        // The run's messages share the conversation's: nothing is copied.
        let new_messages = self.params.messages().tail_from(run.start);
        if run.final_text.is_empty()
            && let Some(last) = new_messages
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
        {
            run.final_text = last.text();
        }
        AgentRun {
            stop,
            final_text: run.final_text,
            turns: run.turns,
            usage: run.usage,
            error: run.error,
            new_messages,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use forkhive_core::ToolDefinition;

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
