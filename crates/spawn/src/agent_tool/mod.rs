//! The `Agent` tool (alias `Task`): the one entry point through which a model spawns
//! children ("Chapter 20: Agent Spawning and Orchestration — 20.1 AgentTool: The Unified Agent
//! Spawning Entry Point").
//!
//! It routes a call to a strategy — a teammate when `name` and `team_name` are given (see
//! [`team`](crate::team)), a [`Fork`] when fork mode is on and `subagent_type` is omitted, otherwise a
//! [`Subagent`] of that type (default `general-purpose`) — enforces the depth and fan-out
//! limits, decides foreground or background with [`should_run_async`], and reports: a
//! foreground child's answer as the tool result, a background child's through exactly one
//! `<task-notification>`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::fork::is_in_fork_child;
use forkhive_core::{TaskId, TaskKind, TaskStatus, ToolDefinition};

use crate::base::pending::SEND_MESSAGE;
use crate::definition::{AgentRegistry, MODEL_INHERIT};
use crate::runtime::Limits;
use crate::strategy::{
    AgentInput, Fork, ForkLayout, HeadCache, SpawnContext, SpawnStrategy, Subagent,
};
use crate::task::{
    ChildEnd, FirstInput, Launch, MemoryTaskRegistry, Mode, OutputFile, Progress, TaskConfig,
    TaskService,
};
use crate::tool::{Tool, ToolContext, ToolFilter, ToolOutput, ToolPool};

/// The tool's name.
pub const AGENT_TOOL: &str = "Agent";
/// Its legacy alias.
pub const TASK_ALIAS: &str = "Task";
/// The most bytes of a child's answer returned to its parent, foreground or background (see
/// [`task::RESULT_CAP`](crate::task::RESULT_CAP)).
pub use crate::task::RESULT_CAP;

/// The inputs of the sync-or-async decision ("Coordinator Mode: A Working Multi-Agent System,
/// From the Source — The Sync-vs-Async Decision"): six reasons to run in the background, and
/// one veto.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AsyncInputs {
    /// The call's `run_in_background: true`.
    pub run_in_background: bool,
    /// The agent definition's `background: true`.
    pub definition_background: bool,
    /// Coordinator mode: every worker runs in the background.
    pub coordinator: bool,
    /// Fork mode is on ([`AgentToolConfig::forks`]): it forces every spawn into the
    /// background, forks and typed subagents alike.
    pub fork_force_async: bool,
    /// An assistant (long-running, KAIROS-like) mode that forces the background.
    pub assistant_force_async: bool,
    /// Proactive work, which must not block the user's turn.
    pub proactive_active: bool,
    /// The veto: background tasks are disabled, so everything runs in the foreground.
    pub background_disabled: bool,
}

/// Whether a spawn runs in the background: any of the six reasons, unless vetoed.
pub fn should_run_async(i: AsyncInputs) -> bool {
    (i.run_in_background
        || i.definition_background
        || i.coordinator
        || i.fork_force_async
        || i.assistant_force_async
        || i.proactive_active)
        && !i.background_disabled
}

/// How the Agent tool behaves. Hosts set what their product enables, from
/// [`AgentToolConfig::default`] with the `with_*` setters:
/// `AgentToolConfig::default().with_registry(registry).with_fork_enabled(true)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentToolConfig {
    /// The agent definitions subagents come from.
    pub registry: AgentRegistry,
    /// Fork mode: an omitted `subagent_type` forks.
    pub fork_enabled: bool,
    /// Coordinator mode (disables forks, forces the background).
    pub coordinator_mode: bool,
    /// A non-interactive session (disables forks).
    pub non_interactive: bool,
    /// Background tasks disabled (the veto; hides `run_in_background`).
    pub background_disabled: bool,
    /// Teams: shows `name`, `team_name` and `mode`.
    pub teams_enabled: bool,
    /// Worktree isolation: shows `isolation`.
    pub isolation_enabled: bool,
    /// An assistant mode that forces the background.
    pub assistant_force_async: bool,
    /// Proactive work in progress (forces the background).
    pub proactive_active: bool,
    /// Put the list of agent types in a message (see [`AgentTool::agent_list_message`])
    /// instead of the tool description, so the description — part of the cache key — does
    /// not change when agents are added ("Claude Code Multi-Agent Internals — 5.2").
    pub agent_list_in_messages: bool,
    /// How deep agents may nest (the root is depth 0).
    pub max_depth: u32,
    /// How a fork child's message is laid out.
    pub fork_layout: ForkLayout,
    /// Cache-warm fan-out: siblings forked in one turn wait up to this long for the first
    /// sibling's answer to start, so they read the prefix it wrote (`None`: off).
    pub warm_fanout: Option<Duration>,
    /// Filtering layers 1 and 2 for subagents.
    pub filter: ToolFilter,
    /// Tools for fresh subagents (`None`: the caller's pool).
    pub subagent_tools: Option<ToolPool>,
    /// User context entries a fresh subagent gets.
    pub subagent_user_context: Vec<(String, String)>,
    /// Limits of children.
    pub child_limits: Limits,
    /// How long a foreground child may run: its deadline (or its type's, if shorter). Past
    /// it the child is stopped as at a deadline, and the call's result carries its partial
    /// work and transcript path.
    pub foreground_timeout: Duration,
    /// Models the model may name for a child in the call's `model`, besides the ones always
    /// allowed: `inherit`, the caller's own model, and the definition's own model. Empty (the
    /// default): no others. A model outside the list is an `is_error` result naming the
    /// allowed ones, so a prompt cannot move children onto a model the host did not choose.
    pub allowed_models: Vec<String>,
    /// Deadlines by agent type (`fork` for forks), over a definition's own `deadline` and
    /// the task service's [`TaskConfig::deadline`]. A child past its deadline is stopped and
    /// reported `killed`, foreground or background.
    pub deadlines: std::collections::BTreeMap<String, Duration>,
    /// The git repository workers started with `isolation: "worktree"` get their worktrees
    /// in (needs [`isolation_enabled`](Self::isolation_enabled)).
    pub worktree_repo: Option<std::path::PathBuf>,
    /// The directory a call's `cwd` may name a directory in (`None`, the default: the model
    /// sees no `cwd`). A child started with `cwd` works there: its tools are moved to it as to
    /// a worktree ([`Tool::rooted`]), and it is told its working directory. The directory
    /// must exist, be one, and lie in this one once links are resolved; a fork, or a worker
    /// that gets a worktree, cannot have one.
    pub cwd_root: Option<std::path::PathBuf>,
}

setters!(AgentToolConfig {
    with_registry => registry: AgentRegistry,
    with_fork_enabled => fork_enabled: bool,
    with_coordinator_mode => coordinator_mode: bool,
    with_non_interactive => non_interactive: bool,
    with_background_disabled => background_disabled: bool,
    with_teams_enabled => teams_enabled: bool,
    with_isolation_enabled => isolation_enabled: bool,
    with_assistant_force_async => assistant_force_async: bool,
    with_proactive_active => proactive_active: bool,
    with_agent_list_in_messages => agent_list_in_messages: bool,
    with_max_depth => max_depth: u32,
    with_fork_layout => fork_layout: ForkLayout,
    with_warm_fanout => warm_fanout: Option<Duration>,
    with_filter => filter: ToolFilter,
    with_subagent_tools => subagent_tools: Option<ToolPool>,
    with_subagent_user_context => subagent_user_context: Vec<(String, String)>,
    with_child_limits => child_limits: Limits,
    with_foreground_timeout => foreground_timeout: Duration,
    with_allowed_models => allowed_models: Vec<String>,
    with_deadlines => deadlines: std::collections::BTreeMap<String, Duration>,
    with_worktree_repo => worktree_repo: Option<std::path::PathBuf>,
    with_cwd_root => cwd_root: Option<std::path::PathBuf>,
});

impl Default for AgentToolConfig {
    fn default() -> Self {
        Self {
            registry: AgentRegistry::builtin(),
            fork_enabled: false,
            coordinator_mode: false,
            non_interactive: false,
            background_disabled: false,
            teams_enabled: false,
            isolation_enabled: false,
            assistant_force_async: false,
            proactive_active: false,
            agent_list_in_messages: false,
            max_depth: 3,
            fork_layout: ForkLayout::default(),
            warm_fanout: Some(Duration::from_secs(2)),
            filter: ToolFilter::default(),
            subagent_tools: None,
            subagent_user_context: Vec::new(),
            child_limits: Limits::default(),
            foreground_timeout: Duration::from_secs(60 * 60),
            allowed_models: Vec::new(),
            deadlines: std::collections::BTreeMap::new(),
            worktree_repo: None,
            cwd_root: None,
        }
    }
}

impl AgentToolConfig {
    /// Sets the deadline of children of `agent_type` (`fork` for forks), over the
    /// definition's own (see [`deadlines`](Self::deadlines)).
    #[must_use]
    pub fn with_deadline(mut self, agent_type: impl Into<String>, deadline: Duration) -> Self {
        self.deadlines.insert(agent_type.into(), deadline);
        self
    }

    /// Whether an omitted `subagent_type` forks: fork mode on, not coordinator mode, not a
    /// non-interactive session ("Fork Mechanism — Feature Gate"). The last two conditions —
    /// no `subagent_type`, not already in a fork — are the call's.
    pub fn forks(&self) -> bool {
        self.fork_enabled && !self.coordinator_mode && !self.non_interactive
    }

    /// The input JSON Schema the model sees: only the fields it can use.
    pub fn input_schema(&self) -> serde_json::Value {
        let mut props = serde_json::Map::new();
        props.insert(
            "description".into(),
            serde_json::json!({"type": "string", "description": "A short (3-5 word) description of the task"}),
        );
        props.insert(
            "prompt".into(),
            serde_json::json!({"type": "string", "description": "The task for the agent to perform"}),
        );
        let type_help = if self.forks() {
            "The agent type to use; omit it to fork yourself (the fork inherits this conversation)"
        } else {
            "The agent type to use (default: general-purpose)"
        };
        props.insert(
            "subagent_type".into(),
            serde_json::json!({"type": "string", "description": type_help}),
        );
        props.insert(
            "model".into(),
            serde_json::json!({"type": "string", "description": "A model for the agent (default: the agent type's, or yours)"}),
        );
        // Fork mode and coordinator mode force every spawn into the background: no choice to
        // offer then.
        if !self.background_disabled && !self.forks() && !self.coordinator_mode {
            props.insert(
                "run_in_background".into(),
                serde_json::json!({"type": "boolean", "description": "Run in the background; you will be notified when it finishes"}),
            );
        }
        if self.teams_enabled || !self.background_disabled {
            props.insert(
                "name".into(),
                serde_json::json!({"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$", "description": "A name to address the agent by with SendMessage (unique among your agents)"}),
            );
        }
        if self.teams_enabled {
            props.insert(
                "team_name".into(),
                serde_json::json!({"type": "string", "description": "The team to join"}),
            );
            props.insert(
                "mode".into(),
                serde_json::json!({"type": "string", "description": "The teammate's permission mode"}),
            );
        }
        if self.isolation_enabled {
            props.insert(
                "isolation".into(),
                serde_json::json!({"type": "string", "enum": ["worktree", "none"], "description": "worktree: run in an isolated git worktree; none: in the shared directory (the default for agents that only read)"}),
            );
        }
        if let Some(root) = &self.cwd_root {
            props.insert(
                "cwd".into(),
                serde_json::json!({"type": "string", "description": format!("A directory to run the agent in: relative to {}, or absolute inside it. Its tools that work in a directory work there", root.display())}),
            );
        }
        serde_json::json!({
            "type": "object",
            "properties": props,
            "required": ["description", "prompt"],
            "additionalProperties": false
        })
    }

    /// The agent types, one per line (`- name: description`).
    pub fn agent_list(&self) -> String {
        self.registry
            .list()
            .iter()
            .map(|d| {
                format!(
                    "- {}: {}",
                    d.name,
                    d.description.lines().next().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The `Agent` tool.
#[derive(Debug, Clone)]
pub struct AgentTool {
    config: Arc<AgentToolConfig>,
    definition: ToolDefinition,
    filter: Arc<ToolFilter>,
    heads: Arc<HeadCache>,
    /// `subagent_tools` with the caller's MCP tools, for the last caller pool seen (one pool
    /// object per caller pool, so the head cache, keyed by pool, keeps hitting).
    with_mcp: Arc<std::sync::Mutex<Option<WithMcp>>>,
    /// The subagent tools with the lead's `SendMessage`, for the last pair seen: teammates of
    /// one lead share one pool, so the head cache, keyed by pool, keeps hitting.
    with_team: Arc<std::sync::Mutex<Option<WithTeam>>>,
    /// What in its configuration does not do what it looks like it does
    /// ([`config_warnings`], emitted through [`Tool::warnings`]).
    warnings: Vec<String>,
}

/// A teammate's tools: a base pool (whose identity the guard reserves) joined by one lead's
/// `SendMessage`.
#[derive(Debug)]
struct WithTeam {
    base: usize,
    _guard: crate::tool::pool::PoolIdentity,
    tool: Arc<dyn Tool>,
    pool: ToolPool,
}

/// `subagent_tools` joined by the MCP tools of one caller pool (whose identity the guard
/// reserves, so it cannot be reused by another pool while this entry exists).
#[derive(Debug)]
struct WithMcp {
    caller: usize,
    _guard: crate::tool::pool::PoolIdentity,
    pool: ToolPool,
}

impl AgentTool {
    /// The tool for `config`.
    pub fn new(config: AgentToolConfig) -> crate::Result<Self> {
        let mut description = String::from(
            "Launch an agent to handle a task on its own. It works with its own tools and \
             reports back when done.",
        );
        if !config.agent_list_in_messages {
            description.push_str("\n\nAvailable agent types:\n");
            description.push_str(&config.agent_list());
        }
        // A deadline for a type nobody can start, or a zero one, is a mistake: say so now, not
        // after a child ran to the wrong deadline.
        for (agent_type, deadline) in &config.deadlines {
            if agent_type != "fork" && config.registry.get(agent_type).is_none() {
                return Err(crate::Error::Config(format!(
                    "`deadlines` names agent type `{agent_type}`, which the registry does not \
                     hold; types: fork, {}",
                    config.registry.names().collect::<Vec<_>>().join(", ")
                )));
            }
            if deadline.is_zero() {
                return Err(crate::Error::Config(format!(
                    "`deadlines` gives agent type `{agent_type}` a zero deadline, which would \
                     stop every child of it at once"
                )));
            }
        }
        // Also emitted as events when the main agent it is built into first runs.
        let warnings = config_warnings(&config);
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        let schema = config.input_schema().to_string();
        let definition = ToolDefinition::new(AGENT_TOOL, description, &schema)?;
        Ok(Self {
            warnings,
            filter: Arc::new(config.filter.clone()),
            heads: Arc::new(HeadCache::new()),
            with_mcp: Arc::default(),
            with_team: Arc::default(),
            config: Arc::new(config),
            definition,
        })
    }

    /// The tool behind an `Arc`, as a [`ToolPool`] takes it.
    pub fn arc(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }

    /// How many rendered subagent heads this tool holds (one per definition, model,
    /// foreground/background and tool pool it has spawned from).
    pub fn cached_heads(&self) -> usize {
        self.heads.len()
    }

    /// The configuration.
    pub fn config(&self) -> &AgentToolConfig {
        &self.config
    }

    /// [`with_team_tool`], the same pool for the same base and lead tool: one built per
    /// teammate would compile nothing new, but each would miss the head cache and push
    /// another teammate's head out of it.
    fn team_base(&self, base: ToolPool, lead: &ToolPool) -> std::result::Result<ToolPool, String> {
        let Some(tool) = lead
            .get(SEND_MESSAGE)
            .filter(|_| base.get(SEND_MESSAGE).is_none())
        else {
            return with_team_tool(base, lead);
        };
        let mut memo = self.with_team.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = memo
            .as_ref()
            .filter(|m| m.base == base.identity() && Arc::ptr_eq(&m.tool, tool))
        {
            return Ok(m.pool.clone());
        }
        let pool = with_team_tool(base.clone(), lead)?;
        *memo = Some(WithTeam {
            base: base.identity(),
            _guard: base.identity_guard(),
            tool: Arc::clone(tool),
            pool: pool.clone(),
        });
        Ok(pool)
    }

    /// The tools a fresh child of `definition` gets before they move to its own directory:
    /// its definition's, through the filter's layers for its audience, and a teammate's with
    /// `SendMessage` whatever its definition lists.
    fn child_tools(
        &self,
        caller: &ToolPool,
        teammate: bool,
        background: bool,
        definition: Option<&crate::definition::AgentDefinition>,
    ) -> std::result::Result<ToolPool, String> {
        let audience = if teammate {
            crate::tool::ToolAudience::Teammate
        } else if background {
            crate::tool::ToolAudience::Background
        } else {
            crate::tool::ToolAudience::Foreground
        };
        let base = self.filter.pool(
            &self.subagent_base(caller),
            audience,
            definition.and_then(|d| d.tools.as_deref()),
            definition.and_then(|d| d.disallowed_tools.as_deref()),
        );
        if teammate {
            with_team_tool(base, caller)
        } else {
            Ok(base)
        }
    }

    /// The tools of a child started in `dir` (a resolved `cwd`), moved there, or why it cannot
    /// start: a tool that changes things and cannot move would work elsewhere while the child
    /// was told it works in `dir`.
    async fn tools_in_cwd(
        &self,
        dir: &std::path::Path,
        caller: &ToolPool,
        teammate: bool,
        background: bool,
        definition: Option<&crate::definition::AgentDefinition>,
    ) -> std::result::Result<ToolPool, String> {
        let base = self.child_tools(caller, teammate, background, definition)?;
        let tools = match base.rooted(dir).await {
            Ok(tools) => tools,
            Err(crate::Error::Tool { name, .. }) => {
                return Err(format!(
                    "cannot start the agent in `{}`: its tool {name:?} changes things but cannot \
                     work in another directory (it does not implement `Tool::rooted`)",
                    dir.display()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "cannot start the agent in `{}`: {}",
                    dir.display(),
                    chain(&e)
                ));
            }
        };
        // Each tool resolved `dir` again as it moved: swapped for a link meanwhile (or
        // removed), it is not where the tools now work.
        match tokio::fs::canonicalize(dir).await {
            Ok(again) if again == dir => Ok(tools),
            _ => Err(format!(
                "cannot start the agent in `{}`: the directory changed while the agent's tools \
                 moved there; try again",
                dir.display()
            )),
        }
    }

    /// The pool a child's tools are drawn from: the caller's, or `subagent_tools` (a
    /// coordinator's workers) joined by the caller's MCP tools — MCP tools are always
    /// available (Agent definitions, §9.5 layer 3; Chapter 20: workers get
    /// `assembleToolPool(…, appState.mcp.tools)`).
    fn subagent_base(&self, caller: &ToolPool) -> ToolPool {
        let Some(tools) = &self.config.subagent_tools else {
            return caller.clone();
        };
        let missing: Vec<Arc<dyn Tool>> = caller
            .iter()
            .filter(|tool| {
                let name = &tool.definition().name;
                crate::tool::filter::is_mcp_tool(name) && tools.get(name).is_none()
            })
            .cloned()
            .collect();
        if missing.is_empty() {
            return tools.clone();
        }
        let mut memo = self.with_mcp.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = memo.as_ref().filter(|m| m.caller == caller.identity()) {
            return m.pool.clone();
        }
        match tools.with(missing) {
            Ok(pool) => {
                *memo = Some(WithMcp {
                    caller: caller.identity(),
                    _guard: caller.identity_guard(),
                    pool: pool.clone(),
                });
                pool
            }
            // Names are unique by construction (only names `tools` lacks are added).
            Err(_) => tools.clone(),
        }
    }

    /// When the agent list is not in the description: the text to put in the conversation
    /// (a user context entry or the first message).
    pub fn agent_list_message(&self) -> String {
        format!(
            "<system-reminder>\nAgent types available to the {AGENT_TOOL} tool:\n{}\n</system-reminder>",
            self.config.agent_list()
        )
    }

    /// Refuses a `model` the host did not allow (see [`AgentToolConfig::allowed_models`]); a
    /// fork keeps its parent's model, since the prompt cache is keyed on it.
    fn check_model(
        &self,
        input: &AgentInput,
        parent_model: &str,
        definition: Option<&crate::definition::AgentDefinition>,
    ) -> Result<(), String> {
        let Some(asked) = input.model.as_deref().filter(|m| *m != MODEL_INHERIT) else {
            return Ok(());
        };
        // An alias and the id it stands for are one model (`haiku`, `claude-haiku-4-5`).
        let same = |a: &str, b: &str| {
            forkhive_core::usage::anthropic_model_id(a)
                == forkhive_core::usage::anthropic_model_id(b)
        };
        if same(asked, parent_model) {
            return Ok(());
        }
        let Some(def) = definition else {
            // A fresh agent on `asked` is advice only where it would be allowed: the host
            // allows that model, or an agent type runs on it as its own.
            let own: Vec<&str> = self
                .config
                .registry
                .list()
                .into_iter()
                .filter(|d| d.model.as_deref() == Some(asked))
                .map(|d| d.name.as_str())
                .collect();
            let or = if self.config.allowed_models.iter().any(|m| same(m, asked)) {
                format!(", or name a `subagent_type` to start a fresh agent on `{asked}`")
            } else if !own.is_empty() {
                format!(
                    ", or start a fresh agent of a type that runs on `{asked}`: `{}`",
                    own.join("`, `")
                )
            } else {
                String::new()
            };
            return Err(format!(
                "a fork keeps its parent's model `{parent_model}` (the prompt cache is keyed on \
                 it): omit `model`{or}"
            ));
        };
        let own = def.model.as_deref().filter(|m| *m != MODEL_INHERIT);
        if own.is_some_and(|own| same(own, asked))
            || self.config.allowed_models.iter().any(|m| same(m, asked))
        {
            return Ok(());
        }
        let mut allowed: Vec<&str> = Vec::new();
        let candidates = [MODEL_INHERIT, parent_model]
            .into_iter()
            .chain(own)
            .chain(self.config.allowed_models.iter().map(String::as_str));
        for m in candidates {
            if !allowed.contains(&m) {
                allowed.push(m);
            }
        }
        Err(format!(
            "model `{asked}` is not allowed for agents on this host; use one of: {}",
            allowed
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    // A plain `fn` returning an `async move` block: the input is held once (an `async fn`
    // holds it as given and as bound), and every `Agent` call's boxed future holds this one.
    #[allow(clippy::manual_async_fn)]
    fn spawn<'a>(
        &'a self,
        input: AgentInput,
        cx: &'a ToolContext,
    ) -> impl Future<Output = Result<String, String>> + Send + 'a {
        async move {
            let caller = crate::runtime::AgentShared::of(cx)
                .ok_or("the Agent tool only works inside an agent loop")?;
            let turn = cx
                .turn()
                .ok_or("the Agent tool only works inside an agent loop")?;
            let me = caller.cx.as_ref();
            // Recursive fork protection: the query source survives compaction; the boilerplate
            // scan catches a fork whose identity was lost.
            if me.query_source().is_fork() || is_in_fork_child(turn.sent().messages().iter()) {
                return Err(FORK_REFUSAL_TEXT.to_owned());
            }
            // A teammate: `name` and `team_name`, in the host's team, started by its lead only.
            let team = match (&input.name, &input.team_name) {
                (Some(name), Some(team_name)) => {
                    if !self.config.teams_enabled {
                        return Err(
                            "teammates are not available: this host has not enabled teams"
                                .to_owned(),
                        );
                    }
                    let team = crate::team::led_by(&caller.tree, team_name, me)?;
                    // One lead per team on its mailbox: another would take this one's letters.
                    team.claim_lead().await.map_err(|e| e.to_string())?;
                    Some((team, name.clone()))
                }
                _ => None,
            };
            // A teammate's permission mode: `plan` holds it to read-only tools until the lead
            // approves its plan; a mode that tightens applies on top of the caller's policy; one
            // that loosens is not the model's to give, so the caller's policy decides.
            let plan_mode = match (&input.mode, &team) {
                (None, _) => false,
                (Some(_), None) => {
                    return Err(
                    "`mode` is a teammate's permission mode: give `name` and `team_name` with it"
                        .to_owned(),
                );
                }
                (Some(m), Some(_)) => {
                    let mode: crate::definition::PermissionMode =
                        m.parse().map_err(|e| format!("teammate `mode`: {e}"))?;
                    mode == crate::definition::PermissionMode::Plan
                }
            };
            // The teammate's `mode` is a restriction of its own, asked before the caller's
            // policy (and whatever its definition's `permissionMode` makes of it): the modes
            // that tighten; the rest leave the caller's policy to decide.
            let policy: Option<Arc<dyn crate::tool::PermissionPolicy>> = match (&input.mode, &team)
            {
                (Some(_), Some((team, name))) if plan_mode => {
                    Some(Arc::new(crate::team::PlanMode::new(team, name)))
                }
                (Some(m), Some(_))
                    if m.parse::<crate::definition::PermissionMode>().ok()
                        == Some(crate::definition::PermissionMode::DontAsk) =>
                {
                    Some(Arc::new(crate::tool::permission::ReadOnly::new(
                        "this agent runs without asking, and the tool is not read-only",
                    )))
                }
                _ => None,
            };
            if let Some(name) = &input.name {
                check_name(name)?;
            }
            // `None` here: the call did not say, and the agent type decides below.
            let asked = match input.isolation.as_deref() {
                None => None,
                Some("none") if self.config.isolation_enabled => Some(false),
                Some("worktree") if self.config.isolation_enabled => {
                    match &self.config.worktree_repo {
                        Some(_) => Some(true),
                        None => {
                            return Err(
                                "worktree isolation is on but this host named no repository \
                                (`AgentToolConfig::worktree_repo`)"
                                    .to_owned(),
                            );
                        }
                    }
                }
                Some(other) if self.config.isolation_enabled => {
                    return Err(format!(
                        "isolation `{other}` is not available on this host; use `worktree` or `none`"
                    ));
                }
                Some(_) => {
                    return Err("worktree isolation is not available on this host".to_owned());
                }
            };
            if me.depth() + 1 > self.config.max_depth {
                return Err(format!(
                    "cannot start an agent: this agent is at depth {}, and agents may nest at most \
                 {} levels; do the work directly",
                    me.depth(),
                    self.config.max_depth
                ));
            }
            let fork = self.config.forks() && input.subagent_type.is_none();
            if fork && asked == Some(true) {
                return Err(
                    "a fork shares its parent's tools and directory (and prompt cache); name \
                        a `subagent_type` to start a worker in its own worktree"
                        .to_owned(),
                );
            }
            let strategy: &dyn SpawnStrategy = if fork { &Fork } else { &Subagent };
            let definition = if fork {
                None
            } else {
                Some(Subagent::definition(&self.config.registry, &input).map_err(|e| chain(&e))?)
            };
            self.check_model(&input, turn.sent().model(), definition.map(|d| &**d))?;
            // A definition that asks for a worktree, where isolation is on but no repository is
            // named, is refused as the same call asking for one would be: run in place, a
            // writer the host meant to isolate would edit the shared checkout.
            if asked.is_none()
                && self.config.isolation_enabled
                && self.config.worktree_repo.is_none()
                && let Some(def) = definition
                && def.isolation.as_deref() == Some("worktree")
            {
                return Err(format!(
                    "agent type `{}` asks for a worktree (`isolation: worktree`), but worktree \
                     isolation is on and this host named no repository \
                     (`AgentToolConfig::worktree_repo`); pass `\"isolation\": \"none\"` to run \
                     it in place",
                    def.name
                ));
            }
            // Unless the call said: a definition's own `isolation: worktree`, and in coordinator
            // mode any worker that can write, gets a worktree — two writers in one directory lose
            // edits silently ("Coordinator Mode: A Working Multi-Agent System, From the Source —
            // gotchas").
            let isolate = asked.unwrap_or_else(|| {
                let Some(def) = definition else { return false };
                if !self.config.isolation_enabled || self.config.worktree_repo.is_none() {
                    return false;
                }
                if def.isolation.as_deref() == Some("worktree") {
                    return true;
                }
                let base = &self.subagent_base(&caller.pool);
                self.config.coordinator_mode
                    && self
                        .filter
                        .pool(
                            base,
                            if team.is_some() {
                                crate::tool::ToolAudience::Teammate
                            } else {
                                crate::tool::ToolAudience::Background
                            },
                            def.tools.as_deref(),
                            def.disallowed_tools.as_deref(),
                        )
                        .names()
                        .iter()
                        .any(|n| base.get(n).is_some_and(|t| !t.is_read_only()))
            });
            // A directory of its own, asked for by the call (Claude Code's `cwd`): checked before
            // anything is made for the child.
            let cwd = match &input.cwd {
                None => None,
                Some(asked_dir) => {
                    let Some(root) = &self.config.cwd_root else {
                        return Err("`cwd` is not available on this host".to_owned());
                    };
                    if fork {
                        return Err(
                            "a fork shares its parent's directory and tools (and prompt cache); \
                             name a `subagent_type` to start an agent in `cwd`"
                                .to_owned(),
                        );
                    }
                    if isolate {
                        return Err(cwd_with_worktree(asked, definition.map(|d| &**d)));
                    }
                    Some(Box::pin(resolve_cwd(root, asked_dir)).await?)
                }
            };
            let definition_background = definition.is_none_or(|d| d.background);
            let background = team.is_some()
                || should_run_async(AsyncInputs {
                    run_in_background: input.run_in_background.unwrap_or(false),
                    definition_background,
                    coordinator: self.config.coordinator_mode,
                    // Fork mode forces every spawn into the background, typed subagents too: the
                    // fork experiment's `forceAsync` is a mode, not a property of one fork ("Coordinator
                    // Mode: A Working Multi-Agent System, From the Source — The Sync-vs-Async
                    // Decision").
                    fork_force_async: self.config.forks(),
                    assistant_force_async: self.config.assistant_force_async,
                    proactive_active: self.config.proactive_active,
                    background_disabled: self.config.background_disabled,
                });
            // A child in a `cwd` gets its tools there before anything is made for it (a slot, an
            // output file): one that changes things and cannot move refuses the start, as for
            // a worktree asked for, since the call asked for the directory.
            let cwd_tools = match &cwd {
                Some(dir) => Some(
                    Box::pin(self.tools_in_cwd(
                        dir,
                        &caller.pool,
                        team.is_some(),
                        background,
                        definition.map(|d| &**d),
                    ))
                    .await?,
                ),
                None => None,
            };
            // The tree's one service: the host's (`AgentBuilder::tasks` or inserted), else one
            // with the defaults. Its `TaskConfig` is the only one there is.
            let service = caller.tree.extensions().get_or_insert_with(|| {
                TaskService::unshared(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default())
            });
            // A name already taken is refused before anything is made for the child (its
            // transcript, output file, worktree, place on a team's roster); the start checks
            // again as it claims the name.
            if let Some(n) = &input.name
                && let Some(other) = service.name_holder(me.id(), n)
            {
                return Err(format!(
                    "could not start the agent: the name `{n}` is taken by task {other}; give \
                     this agent another name"
                ));
            }
            let slot = service.acquire(*me.id()).map_err(|e| chain(&e))?;
            let progress = Arc::new(Progress::default());
            let child_id = TaskId::generate(TaskKind::Agent);
            let output = match &service.config().output {
                Some(cfg) if background => {
                    Some(Arc::new(OutputFile::create(cfg, &child_id).await.map_err(
                        |e| format!("could not start the agent: {}", chain(&e)),
                    )?))
                }
                _ => None,
            };
            // A spawn that fails before the child starts leaves no output file named after a
            // task that never existed.
            let unstarted = output
                .as_ref()
                .map(|o| crate::task::output::Unclaimed::new(o.path().to_path_buf()));
            // Its own checkout on its own branch: its tools work there, and its owner removes it
            // at the end only if nothing changed.
            let (worktree, rooted) = match (isolate, &self.config.worktree_repo) {
                (true, Some(repo)) => {
                    let slug = format!("agent-{child_id}");
                    // The worktree's futures are boxed (here and where it is finished): a call that
                    // starts no worktree keeps a small future.
                    let wt = crate::worktree::Unfinished::new(
                        Box::pin(crate::worktree::Worktree::create(repo, &slug, None))
                            .await
                            .map_err(|e| chain(&e))?,
                    );
                    // The tools it will have (its definition's, through the layers), moved there.
                    let base = self.child_tools(
                        &caller.pool,
                        team.is_some(),
                        background,
                        definition.map(|d| &**d),
                    )?;
                    let path = wt.get().map(|w| w.path().to_path_buf()).unwrap_or_default();
                    match base.rooted(&path).await {
                        Ok(pool) => (Some(wt), Some(pool)),
                        Err(e) => {
                            // Nobody owns the tree yet: this call finishes it (untouched: removed).
                            let _ = Box::pin(wt.finish()).await;
                            if asked == Some(true) {
                                return Err(chain(&e));
                            }
                            // Asked for by its definition: as explicit as the call's own ask, and
                            // running in the shared checkout would look isolated while it is not.
                            if let Some(d) = definition
                                && asked.is_none()
                                && d.isolation.as_deref() == Some("worktree")
                            {
                                return Err(format!(
                                    "agent type `{}` asks for a worktree (`isolation: worktree`), \
                                     but {}",
                                    d.name,
                                    chain(&e)
                                ));
                            }
                            // Chosen by default, not asked for: the worker works as it would have,
                            // and the host hears why it shares the checkout (not only `tracing`).
                            let message = format!(
                                "no worktree for worker {child_id} (\"{}\"), which works in the \
                                 shared checkout: {}",
                                input.description,
                                chain(&e)
                            );
                            tracing::warn!("{message}");
                            if let Some(sink) = &caller.events {
                                sink.emit(crate::base::events::AgentEvent {
                                    agent: *me.id(),
                                    turn: turn.turn(),
                                    kind: crate::base::events::EventKind::Warning { message },
                                });
                            }
                            (None, None)
                        }
                    }
                }
                // `cwd` excludes a worktree (checked above).
                _ => (None, cwd_tools),
            };
            // A worker in a worktree is told where it works, and where to commit; one started in
            // a `cwd`, its directory (over any `cwd` entry of the host's, which is not its).
            let with_tree;
            let user_context = match (worktree.as_ref().and_then(|w| w.get()), &cwd) {
                (None, Some(dir)) => {
                    let mut uc = without_cwd(&self.config.subagent_user_context);
                    uc.push(("cwd".to_owned(), dir.display().to_string()));
                    with_tree = uc;
                    &with_tree
                }
                (Some(wt), _) => {
                    let mut uc = without_cwd(&self.config.subagent_user_context);
                    uc.push((
                    "worktree".to_owned(),
                    format!(
                        "You work in your own git worktree at {} on branch {}. Commit your work \
                         there; other workers do not see it until it is merged.",
                        wt.path().display(),
                        wt.branch()
                    ),
                ));
                    with_tree = uc;
                    &with_tree
                }
                (None, None) => &self.config.subagent_user_context,
            };
            let subagent_base = self
                .config
                .subagent_tools
                .as_ref()
                .map(|_| self.subagent_base(&caller.pool));
            // A teammate always has `SendMessage`: without it, it could not reach its lead or
            // answer a shutdown ("Claude Code Multi-Agent Internals — 6.4 Teammates get
            // team-aware prompts and tool injection"). A host's `subagent_tools` without it
            // get the lead's; a lead without one has none to give.
            let subagent_base = match (&team, subagent_base) {
                (Some(_), Some(base)) => Some(self.team_base(base, &caller.pool)?),
                (Some(_), None) if caller.pool.get(SEND_MESSAGE).is_none() => {
                    return Err(no_team_tool());
                }
                (_, base) => base,
            };
            // One binding: a second (`let prepared = …; let mut prepared = match prepared`) would
            // keep both in the call's future across the start below.
            let mut prepared = match strategy
                .prepare(
                    &input,
                    SpawnContext {
                        caller,
                        turn,
                        policy,
                        registry: &self.config.registry,
                        subagent_tools: rooted.as_ref().or(subagent_base.as_ref()),
                        filter: &self.filter,
                        heads: &self.heads,
                        child_limits: &self.config.child_limits,
                        user_context,
                        fork_layout: self.config.fork_layout,
                        warm_fanout: self.config.warm_fanout,
                        progress: Arc::clone(&progress),
                        output: output.clone(),
                        child_id,
                        teammate: team.is_some(),
                    },
                    background,
                )
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    // Not started: the tree has no owner yet, so this call finishes it.
                    if let Some(wt) = worktree {
                        let _ = Box::pin(wt.finish()).await;
                    }
                    return Err(chain(&e));
                }
            };
            let mut joined = None;
            if let Some((team, name)) = &team {
                match team.join(crate::team::Member {
                    name: name.clone(),
                    task: child_id,
                    agent_type: definition.map(|d| d.name.clone()).unwrap_or_default(),
                    state: crate::team::MemberState::Running,
                }) {
                    Ok(j) => joined = Some(j),
                    Err(e) => {
                        if let Some(wt) = worktree {
                            let _ = Box::pin(wt.finish()).await;
                        }
                        return Err(chain(&e));
                    }
                }
                if plan_mode {
                    team.enter_plan_mode(name);
                }
                team.serve_lead(caller.pending.clone(), caller.cancel.clone());
                prepared.first = FirstInput::Custom(crate::team::teammate_run(
                    Arc::clone(team),
                    name.clone(),
                    crate::team::teammate_prompt(team.name(), name, plan_mode, &input.prompt),
                ));
            }
            let mode = if background {
                Mode::Background
            } else {
                Mode::Foreground
            };
            // Foreground or background, the child is started through the one service that owns
            // its life: a foreground call only awaits its handle, so a call that times out or is
            // dropped with its parent stops the child, which still ends recorded and accounted.
            let handle = service
                .start(
                    Launch {
                        agent: prepared.agent,
                        first: prepared.first,
                        description: input.description.clone(),
                        tool_use_id: Some(cx.tool_use_id().to_owned()),
                        parent_queue: caller.pending.clone(),
                        progress,
                        output: output.clone(),
                        slot,
                        gate: prepared.gate,
                        events: caller.events.clone(),
                        ledger: Some(caller.children.clone()),
                        parent_turn: turn.turn(),
                        worktree,
                        // The host's deadline for the type, else the definition's own; a
                        // foreground child's is at most its call's `foreground_timeout`, so
                        // its owner stops it — its partial work and transcript path in the
                        // result — before the tool round's timeout would drop the call.
                        deadline: {
                            let own = self
                                .config
                                .deadlines
                                .get(definition.map_or("fork", |d| d.name.as_str()))
                                .copied()
                                .or(definition.and_then(|d| d.deadline));
                            match mode {
                                Mode::Background => own,
                                Mode::Foreground => {
                                    Some(own.map_or(self.config.foreground_timeout, |d| {
                                        d.min(self.config.foreground_timeout)
                                    }))
                                }
                            }
                        },
                        name: input.name.clone(),
                    },
                    mode,
                )
                .await;
            let handle = match handle {
                Ok(handle) => handle,
                Err(e) => {
                    // A teammate that never started leaves the roster as it found it: no
                    // `stopped` member of its name (one that would answer for the name).
                    if let (Some((team, _)), Some(joined)) = (&team, joined) {
                        team.withdraw(joined);
                    }
                    return Err(format!("could not start the agent: {}", chain(&e)));
                }
            };
            let _ = unstarted.map(crate::task::output::Unclaimed::claim);
            if let Some((team, name)) = &team {
                let id = handle.id();
                return Ok(format!(
                    "Teammate `{name}` started in team `{}` as task {id}. It works on its prompt, \
                 then goes idle and you get an idle_notification; it stays until you send it a \
                 shutdown_request. Write to it with SendMessage (`to`: `{name}`); its letters \
                 reach you as <teammate-message> blocks.{}",
                    team.name(),
                    if plan_mode {
                        " It is in plan mode: it sends you its plan, and changes nothing before you \
                     answer with a plan_approval_response."
                    } else {
                        ""
                    }
                ));
            }
            if background {
                // The words the resume reads the task id back from (`base::launched`).
                const STARTED: &str = crate::base::launched::STARTED_IN_BACKGROUND;
                const NOTIFIED: &str = "). You will be notified with its result when it finishes; \
                                    do not wait or poll for it.";
                const OUTPUT: [&str; 2] = [" Its output is written to ", "."];
                let path = output.as_ref().map(|o| o.path().to_string_lossy());
                let kind = strategy.name();
                // It stays in the parent's conversation as long as the parent lives: one exact
                // allocation, written without the formatting machinery (a wide fan-out keeps
                // thousands, and writes one per child).
                let mut text = String::with_capacity(
                    "Agent \"".len()
                        + input.description.len()
                        + STARTED.len()
                        + forkhive_core::task_id::TaskId::LEN
                        + " (".len()
                        + kind.len()
                        + NOTIFIED.len()
                        + path
                            .as_ref()
                            .map_or(0, |p| OUTPUT[0].len() + p.len() + OUTPUT[1].len()),
                );
                text.push_str("Agent \"");
                text.push_str(&input.description);
                text.push_str(STARTED);
                handle.id().push_to(&mut text);
                text.push_str(" (");
                text.push_str(kind);
                text.push_str(NOTIFIED);
                if let Some(path) = &path {
                    text.push_str(OUTPUT[0]);
                    text.push_str(path);
                    text.push_str(OUTPUT[1]);
                }
                return Ok(text);
            }
            let end = handle.end().await.map_err(|e| e.to_string())?;
            foreground_result(&end)
        }
    }
}

/// How long past a foreground child's `foreground_timeout` and cancel grace its call's own
/// timeout waits before it drops the call: room for the owner's kill grace
/// (`TaskConfig::kill_grace`, 2 s by default) and its finishing steps (the worktree, the stop
/// record, the output file: each bounded at seconds), and then some.
const FOREGROUND_BACKSTOP: Duration = Duration::from_secs(5 * 60);

/// Checks an agent's `name`: 1–64 of `[A-Za-z0-9_-]`, starting with a letter or digit, and
/// neither `main` nor shaped like a task id (both mean something else to `SendMessage`).
fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(format!(
            "agent name `{name}` is not valid: use 1-64 letters, digits, `_` and `-`, starting \
             with a letter or digit"
        ));
    }
    if name == "main" || name.parse::<TaskId>().is_ok() {
        return Err(format!(
            "agent name `{name}` is reserved: `main` and task ids already address agents"
        ));
    }
    Ok(())
}

/// The tool result of a foreground child: its answer, a trailer and what its owner noted when
/// it completed (a limit counts, as in the background); otherwise an error saying why, with
/// its partial answer.
fn foreground_result(end: &ChildEnd) -> Result<String, String> {
    let n = &end.notification;
    // Cut to RESULT_CAP already, by the owner that made the notification. Read outside any
    // envelope, so an envelope written in it must not pass for the library's.
    let answer =
        forkhive_core::notification::defang(n.result.as_deref().unwrap_or_default()).into_owned();
    let trailer = match &end.run {
        Some(run) => {
            let plural = |n: usize, one: &str, many: &str| {
                format!("{n} {}", if n == 1 { one } else { many })
            };
            format!(
                "[agent {} {}: {} tokens, {}, {}]",
                end.id,
                run.stop,
                run.usage.total_tokens(),
                plural(run.tool_calls(), "tool use", "tool uses"),
                plural(run.turns.len(), "turn", "turns")
            )
        }
        None => format!("[agent {} {}]", end.id, end.status),
    };
    // A worktree kept because it holds the worker's changes: where they are, as a background
    // child's notification says it, for the parent to look at or merge.
    let kept = n.worktree.as_ref().map_or(String::new(), |w| {
        format!(
            "\n[its worktree was kept, with its changes: {} on branch {}]",
            w.path, w.branch
        )
    });
    if end.status == TaskStatus::Completed {
        // What its owner noted (messages that reached it after its last read): never dropped
        // in silence, as a background child's notification says it. Its last part, why a
        // worktree was kept, is the `kept` line's to tell.
        let note = n
            .note
            .as_deref()
            .map(|note| match (&n.worktree, note.rfind("worktree kept: ")) {
                (Some(_), Some(0)) => "",
                (Some(_), Some(at)) => note[..at].strip_suffix("; ").unwrap_or(note),
                _ => note,
            })
            .filter(|note| !note.is_empty())
            // It lists messages that came too late, each a whole `<message from=…>` envelope
            // meant for the child: in the parent's tool result they must not read as its own.
            .map_or(String::new(), |note| {
                format!("\n[{}]", forkhive_core::notification::defang(note))
            });
        return Ok(format!("{answer}\n\n{trailer}{note}{kept}"));
    }
    // Why it did not finish, then what the owner noted (why it was stopped, its transcript).
    let mut why = match &end.run {
        Some(run) => run
            .error
            .as_ref()
            .map(|e| crate::task::error_chain(e.as_ref()))
            .unwrap_or_else(|| run.stop.to_string()),
        None => n.summary.clone(),
    };
    if let Some(note) = &n.note {
        why.push_str(" (");
        why.push_str(&forkhive_core::notification::defang(note));
        why.push(')');
    }
    // What it answered before it stopped, if anything, on lines of its own.
    let answer = if answer.is_empty() {
        answer
    } else {
        format!("\n{answer}")
    };
    Err(format!(
        "the agent did not finish: {why}{answer}\n\n{trailer}{kept}"
    ))
}

/// An error as the model reads it: its message and every cause.
fn chain(e: &crate::Error) -> String {
    crate::task::error_chain(e)
}

/// The refusal text (see [`crate::strategy::FORK_REFUSAL`]).
const FORK_REFUSAL_TEXT: &str = crate::strategy::FORK_REFUSAL;

#[async_trait]
impl Tool for AgentTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }

    /// With teams on, the lead's tree must hold its [`Team`](crate::team::Team): without one
    /// every teammate the model starts would be refused.
    fn check_tree(&self, tree: &crate::base::state::TreeState) -> std::result::Result<(), String> {
        crate::team::check_teams(self.config.teams_enabled, tree)
    }

    /// Settings that do not do what they look like they do: fork mode that is off, worktree
    /// settings that isolate nobody, a coordinator whose finished workers cannot be resumed.
    fn warnings(
        &self,
        build: &crate::tool::BuildFacts,
        tree: &crate::base::state::TreeState,
    ) -> Vec<String> {
        let mut warnings = self.warnings.clone();
        if self.config.coordinator_mode && !build.keeps_transcripts {
            // A message to a finished worker resumes it from its transcript ("Coordinator
            // Mode: A Working Multi-Agent System, From the Source — SendMessage"); without one
            // the coordinator's follow-up is refused at run time, so the host hears it when
            // it builds.
            let text = "coordinator mode without transcripts: `SendMessage` to a worker that \
                        has finished cannot resume it (it keeps no transcript), so the message \
                        is refused; give the coordinator's builder a `transcript_dir` (a \
                        coordinator resumed from a file not named `<agent id>.jsonl` gives its \
                        workers none)";
            tracing::warn!(tool = AGENT_TOOL, "{text}");
            warnings.push(text.to_owned());
        } else if self.config.coordinator_mode
            && tree
                .extensions()
                .get::<crate::task::TaskService>()
                .is_some_and(|tasks| tasks.config().max_resumable == 0)
        {
            let text = "coordinator mode with `TaskConfig::max_resumable` 0: no finished \
                        worker is kept resumable, so `SendMessage` to one is refused; keep some \
                        (`with_max_resumable`, 64 by default)";
            tracing::warn!(tool = AGENT_TOOL, "{text}");
            warnings.push(text.to_owned());
        }
        if !build.trusts_definition_hooks {
            // Said when the host builds, not first when such an agent is spawned: the hooks
            // may be what restricts it (a hook that blocks `Bash`).
            let untrusted: Vec<String> = self
                .config
                .registry
                .list()
                .into_iter()
                .filter(|d| d.hooks.is_some() && !crate::definition::trusted_source(d.source))
                .map(|d| format!("`{}` ({})", d.name, d.source))
                .collect();
            if !untrusted.is_empty() {
                let text = format!(
                    "agent types {} have hooks, which this host does not run (they run shell \
                     commands, and these definitions are not the host's): they run without \
                     them; trust them with `AgentBuilder::trust_definition_hooks(true)`",
                    untrusted.join(", ")
                );
                tracing::warn!(tool = AGENT_TOOL, "{text}");
                warnings.push(text);
            }
        }
        warnings
    }

    fn aliases(&self) -> &[&str] {
        &[TASK_ALIAS]
    }

    /// Spawning is concurrency-safe: several `Agent` calls in one message start together
    /// ("Claude Code Multi-Agent Internals — 3.2").
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }

    fn is_read_only(&self) -> bool {
        false
    }

    fn in_background(&self) -> crate::tool::InBackground {
        crate::tool::InBackground::ByFilter
    }

    /// A backstop: a foreground child is stopped at `foreground_timeout` by its owner (its
    /// deadline), which then waits for it to finish its record; the round's timeout for the
    /// call comes only after that wait's grace, and a little more.
    fn timeout(&self) -> Option<Duration> {
        Some(
            self.config
                .foreground_timeout
                .saturating_add(self.config.child_limits.cancel_grace)
                .saturating_add(FOREGROUND_BACKSTOP),
        )
    }

    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        let input: AgentInput = match serde_json::from_value(input) {
            Ok(i) => i,
            Err(e) => return ToolOutput::error(format!("invalid Agent input: {e}")),
        };
        match self.spawn(input, cx).await {
            Ok(text) => ToolOutput::text(text),
            Err(text) => ToolOutput::error(text),
        }
    }
}

/// What in `config` does not do what it looks like it does: a coordinator whose workers the
/// background veto keeps in the foreground; fork mode turned off by coordinator mode or a
/// non-interactive session; a worktree repository with isolation off,
/// or isolation on without one (workers that look isolated would share the host's checkout,
/// and lose each other's edits).
fn config_warnings(config: &AgentToolConfig) -> Vec<String> {
    let mut warnings = Vec::new();
    if config.coordinator_mode && config.background_disabled {
        // The veto wins over every reason for the background (`should_run_async`), the
        // coordinator's too.
        warnings.push(
            "coordinator mode with background tasks disabled: every worker runs in the \
             foreground, and the coordinator waits for each round of them to finish (no \
             notifications, nothing else done meanwhile), and `SendMessage` never reaches a \
             running one; turn the veto off (`with_background_disabled(false)`)"
                .to_owned(),
        );
    }
    if config.fork_enabled && !config.forks() {
        let why = if config.coordinator_mode {
            "coordinator mode"
        } else {
            "a non-interactive session"
        };
        warnings.push(format!(
            "fork mode is set but off: {why} disables forks, so an omitted `subagent_type` \
             starts a general-purpose subagent"
        ));
    }
    match (config.isolation_enabled, &config.worktree_repo) {
        (false, Some(repo)) => warnings.push(format!(
            "`worktree_repo` is {} but isolation is off, so no worker gets a worktree: turn it \
             on with `with_isolation_enabled(true)`",
            repo.display()
        )),
        (true, None) => warnings.push(
            "isolation is on but no `worktree_repo` is set, so no worker gets a worktree (and \
             a call or an agent type asking for one is refused): name the repository with \
             `with_worktree_repo(Some(path))`"
                .to_owned(),
        ),
        _ => {}
    }
    warnings
}

/// Why `cwd` cannot be had with the worktree this child gets: the call asked for both (`asked`
/// is `Some(true)`), its type asks for one, or coordinator mode gives it one.
fn cwd_with_worktree(
    asked: Option<bool>,
    definition: Option<&crate::definition::AgentDefinition>,
) -> String {
    if asked == Some(true) {
        return "`cwd` and `isolation: \"worktree\"` cannot be combined: a worktree is a \
                directory of its own; drop one of them"
            .to_owned();
    }
    let why = match definition {
        Some(d) if d.isolation.as_deref() == Some("worktree") => format!(
            "agent type `{}` works in a worktree of its own (`isolation: worktree`)",
            d.name
        ),
        _ => "in coordinator mode a worker that can write gets a worktree of its own".to_owned(),
    };
    format!(
        "{why}, which `cwd` cannot be combined with; pass `\"isolation\": \"none\"` to run it \
         in `cwd` instead"
    )
}

/// The host's user context without its `cwd` entry, for a child that works elsewhere.
fn without_cwd(entries: &[(String, String)]) -> Vec<(String, String)> {
    entries
        .iter()
        .filter(|(k, _)| k != "cwd")
        .cloned()
        .collect()
}

/// The directory `asked` (a call's `cwd`) names: relative to `root` or absolute, with every
/// link resolved, and inside `root` — or why not, in words the model can act on.
///
/// A path that leaves `root` on its face (another absolute path) or has a `..` segment is
/// refused before the file system is asked. The rest is resolved a segment at a time, and a
/// link that leads out of `root` is refused where it is met, before anything beyond it is
/// asked about: the answer never tells whether a path outside exists. A git directory and
/// the worktrees of agents (any `.forkhive/worktrees`) are no place to work either.
async fn resolve_cwd(
    root: &std::path::Path,
    asked: &str,
) -> std::result::Result<std::path::PathBuf, String> {
    use std::path::{Component, Path};
    let real_root = tokio::fs::canonicalize(root).await.map_err(|e| {
        format!(
            "`cwd` is not available: the directory agents may be started in, {}, cannot be \
             read: {e}",
            root.display()
        )
    })?;
    let outside = || {
        format!(
            "`cwd` `{asked}` is outside {}, the directory agents may be started in",
            real_root.display()
        )
    };
    if asked.trim().is_empty() {
        return Err(format!(
            "`cwd` is empty: name a directory in {}",
            real_root.display()
        ));
    }
    let path = Path::new(asked);
    let relative = if path.is_absolute() {
        let configured = std::path::absolute(root).unwrap_or_else(|_| real_root.clone());
        match path
            .strip_prefix(&real_root)
            .or_else(|_| path.strip_prefix(&configured))
        {
            Ok(rest) => rest,
            Err(_) => return Err(outside()),
        }
    } else {
        path
    };
    if relative
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!(
            "`cwd` `{asked}` has a `..` segment, which is never followed (wherever it leads): \
             name the directory without it"
        ));
    }
    let at = match crate::tool::fs::walk_under(real_root.clone(), relative.to_path_buf()).await {
        Ok(at) => at,
        Err(crate::tool::fs::Walk::Outside) => return Err(outside()),
        Err(crate::tool::fs::Walk::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "`cwd` `{asked}`: no such directory in {}",
                real_root.display()
            ));
        }
        Err(crate::tool::fs::Walk::Io(e)) => return Err(format!("`cwd` `{asked}`: {e}")),
    };
    match tokio::fs::metadata(&at).await {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("`cwd` `{asked}` is not a directory")),
        Err(e) => return Err(format!("`cwd` `{asked}`: {e}")),
    }
    let inside = at.strip_prefix(&real_root).unwrap_or(&at);
    if inside.components().any(|c| c.as_os_str() == ".git") {
        return Err(format!(
            "`cwd` `{asked}` is inside a git directory (`.git`), which is git's, not a place to \
             work"
        ));
    }
    // Worktrees are made under the repository's top level, which `root` may be above: any
    // `.forkhive/worktrees` below `root` is theirs (a `root` that is itself inside one, a
    // host working in a worktree, is the host's choice).
    let trees: Vec<std::path::Component<'_>> = Path::new(crate::worktree::DEFAULT_ROOT)
        .components()
        .collect();
    let parts: Vec<std::path::Component<'_>> = inside.components().collect();
    if parts.windows(trees.len()).any(|w| w == trees.as_slice()) {
        return Err(format!(
            "`cwd` `{asked}` is inside `{}`, where agents have their worktrees; name a \
             directory of the main checkout",
            crate::worktree::DEFAULT_ROOT
        ));
    }
    Ok(at)
}

/// `base` with `SendMessage`, the lead's own, when it lacks one: a teammate's tools.
fn with_team_tool(base: ToolPool, lead: &ToolPool) -> std::result::Result<ToolPool, String> {
    if base.get(SEND_MESSAGE).is_some() {
        return Ok(base);
    }
    let Some(tool) = lead.get(SEND_MESSAGE) else {
        return Err(no_team_tool());
    };
    base.with([Arc::clone(tool)]).map_err(|e| e.to_string())
}

/// Why a teammate cannot start when no `SendMessage` is there to give it.
fn no_team_tool() -> String {
    "a teammate needs `SendMessage` to reach its lead, and this host gives none: put \
     `SendMessageTool` in the lead's tools"
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why `cwd` cannot come with the worktree a child gets: the call asked for both, its
    /// type asks for one, or coordinator mode gives its writers one.
    #[test]
    fn cwd_with_a_worktree_is_refused_saying_where_the_worktree_came_from() {
        use crate::definition::{AgentDefinition, DefinitionSource};
        let mut typed = AgentDefinition::new("isolated", "writes", DefinitionSource::Project);
        typed.isolation = Some("worktree".to_owned());
        let plain = AgentDefinition::new("worker", "writes", DefinitionSource::Project);
        assert_eq!(
            cwd_with_worktree(Some(true), Some(&plain)),
            "`cwd` and `isolation: \"worktree\"` cannot be combined: a worktree is a directory \
             of its own; drop one of them"
        );
        assert_eq!(
            cwd_with_worktree(None, Some(&typed)),
            "agent type `isolated` works in a worktree of its own (`isolation: worktree`), which \
             `cwd` cannot be combined with; pass `\"isolation\": \"none\"` to run it in `cwd` \
             instead"
        );
        assert_eq!(
            cwd_with_worktree(None, Some(&plain)),
            "in coordinator mode a worker that can write gets a worktree of its own, which `cwd` \
             cannot be combined with; pass `\"isolation\": \"none\"` to run it in `cwd` instead"
        );
    }

    /// Every reason alone sends a spawn to the background; the veto overrides each of them;
    /// nothing set means the foreground.
    #[test]
    fn should_run_async_table() {
        let none = AsyncInputs::default();
        #[rustfmt::skip]
        let rows: [(&str, AsyncInputs, bool); 14] = [
            ("nothing",                 none, false),
            ("run_in_background",       AsyncInputs { run_in_background: true, ..none }, true),
            ("definition background",   AsyncInputs { definition_background: true, ..none }, true),
            ("coordinator mode",        AsyncInputs { coordinator: true, ..none }, true),
            ("fork forces async",       AsyncInputs { fork_force_async: true, ..none }, true),
            ("assistant mode",          AsyncInputs { assistant_force_async: true, ..none }, true),
            ("proactive",               AsyncInputs { proactive_active: true, ..none }, true),
            ("veto alone",              AsyncInputs { background_disabled: true, ..none }, false),
            ("veto run_in_background",  AsyncInputs { run_in_background: true, background_disabled: true, ..none }, false),
            ("veto definition",         AsyncInputs { definition_background: true, background_disabled: true, ..none }, false),
            ("veto coordinator",        AsyncInputs { coordinator: true, background_disabled: true, ..none }, false),
            ("veto fork",               AsyncInputs { fork_force_async: true, background_disabled: true, ..none }, false),
            ("veto assistant",          AsyncInputs { assistant_force_async: true, background_disabled: true, ..none }, false),
            ("veto proactive",          AsyncInputs { proactive_active: true, background_disabled: true, ..none }, false),
        ];
        for (name, inputs, want) in rows {
            assert_eq!(should_run_async(inputs), want, "{name}");
        }
    }

    #[test]
    fn forks_need_fork_mode_and_neither_coordinator_nor_non_interactive() {
        let on = AgentToolConfig {
            fork_enabled: true,
            ..AgentToolConfig::default()
        };
        assert!(on.forks());
        assert!(!AgentToolConfig::default().forks());
        assert!(
            !AgentToolConfig {
                coordinator_mode: true,
                ..on.clone()
            }
            .forks()
        );
        assert!(
            !AgentToolConfig {
                non_interactive: true,
                ..on
            }
            .forks()
        );
    }

    /// A deadline for a type the registry does not hold (a typo), or a zero one, is refused
    /// when the tool is built.
    #[test]
    fn agent_names_are_checked() {
        assert_eq!(check_name("researcher-1"), Ok(()));
        let invalid = |n: &str| {
            format!(
                "agent name `{n}` is not valid: use 1-64 letters, digits, `_` and `-`, starting \
                 with a letter or digit"
            )
        };
        for bad in ["", "no spaces", "-lead", "../x", &"a".repeat(65)] {
            assert_eq!(check_name(bad), Err(invalid(bad)), "{bad:?}");
        }
        let id = TaskId::generate(TaskKind::Agent).to_string();
        for reserved in ["main", id.as_str()] {
            assert_eq!(
                check_name(reserved),
                Err(format!(
                    "agent name `{reserved}` is reserved: `main` and task ids already address \
                     agents"
                ))
            );
        }
    }

    #[test]
    fn deadlines_name_real_types_and_are_not_zero() {
        let typo = AgentToolConfig::default().with_deadline("Explroe", Duration::from_secs(5));
        let err = AgentTool::new(typo).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "invalid agent configuration: `deadlines` names agent type `Explroe`, which the \
                 registry does not hold; types: fork, Explore, "
            ),
            "{err}"
        );
        let zero = AgentToolConfig::default().with_deadline("fork", Duration::ZERO);
        assert_eq!(
            AgentTool::new(zero).unwrap_err().to_string(),
            "invalid agent configuration: `deadlines` gives agent type `fork` a zero deadline, \
             which would stop every child of it at once"
        );
        let fine = AgentToolConfig::default()
            .with_deadline("fork", Duration::from_millis(300))
            .with_deadline("Explore", Duration::from_secs(60));
        assert!(AgentTool::new(fine).is_ok());
    }
}
