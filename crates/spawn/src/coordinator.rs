//! Coordinator mode: an agent that only orchestrates background workers. A configuration of
//! the pieces that exist, not a new runtime ("Coordinator Mode: A Working Multi-Agent System,
//! From the Source — one feature flag"): a system prompt of its own, three tools (`Agent`,
//! `SendMessage`, `TaskStop`), every spawn in the background, forks off, and workers with the
//! background tool set minus `SendMessage` that cannot spawn.
//!
//! [`coordinator`] turns an [`AgentBuilder`] into a coordinator's in one call:
//!
//! ```
//! use std::sync::Arc;
//! use forkhive_spawn::coordinator::{CoordinatorConfig, coordinator};
//! use forkhive_spawn::runtime::Agent;
//! use forkhive_spawn::tool::{ListDir, ToolPool};
//! use forkhive_transport::ScriptedBackend;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let workers = ToolPool::new([Arc::new(ListDir::new(".").await?) as _])?;
//! let builder = Agent::builder(Arc::new(ScriptedBackend::from_texts(["On it."]))).model("m");
//! let agent = coordinator(builder, CoordinatorConfig::new(workers))?.build().await?;
//! assert_eq!(agent.tools().names(), ["Agent", "SendMessage", "TaskStop"]);
//! # Ok::<(), forkhive_spawn::Error>(()) }).unwrap();
//! ```
//!
//! With isolation enabled and a repository set on the `Agent` tool's configuration, workers
//! that can write get a git worktree each unless a call says `isolation: "none"` (see
//! [`worktree`](crate::worktree)). A message to a worker that has finished resumes it from its
//! transcript (see [`control`](crate::control)); `examples/coordinator.rs` runs all four phases.

use std::sync::Arc;

use crate::agent_tool::{AgentTool, AgentToolConfig};
use crate::control::{SendMessageTool, TaskStopTool};
use crate::error::Result;
use crate::runtime::AgentBuilder;
use crate::tool::{Tool, ToolAudience, ToolPool};

/// The coordinator's system prompt, in our own words after the four phases, the "never
/// delegate understanding" rule and the prompt-level concurrency rules of "Chapter 20: Agent
/// Spawning and Orchestration — Coordinator Mode" and "Coordinator Mode: A Working Multi-Agent
/// System, From the Source — Prompt-Level Concurrency Rules".
pub const COORDINATOR_PROMPT: &str = "\
You are a coordinator. You do not do the work yourself: you plan it, hand it to workers, and \
put their results together. Workers start with nothing but the prompt you give them, run in \
the background, and report through a <task-notification> when they finish; do not wait or \
poll for them.

Work in four phases:
1. Research: send workers to find out what is there. Read-only work runs in parallel freely.
2. Synthesis: read their reports yourself, understand the problem, and write the \
implementation plan as concrete instructions: files, functions, what to change and why.
3. Implementation: hand each part of the plan to a worker. Write-heavy work runs one worker \
at a time per set of files, or in separate worktrees.
4. Verification: have a worker check the changes — tests, builds, the behaviour asked for — \
beside any implementation still running on other files.

Never delegate understanding. A worker's prompt must say what to do, not ask it to work out \
what you meant: never write \"based on your findings\" or \"based on the research\"; put the \
findings in the prompt.

Give each worker a short `name`. Use SendMessage to give a worker more instructions (by its \
name or task id): a running worker reads it at its next tool round, and one that has finished \
is resumed with it, its context intact — prefer that to starting a new worker on the same \
files. Use TaskStop to stop one that is no longer needed. When the work is done and verified, \
answer the user.";

/// What a coordinator is made of.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The `Agent` tool's configuration (its registry, limits, deadlines); coordinator mode is
    /// set on it, which forces every spawn into the background and turns forks off.
    pub agent_tool: AgentToolConfig,
    /// The tools workers may have. They get the background set of these (filtering layers 1
    /// and 2) minus `SendMessage`, and never `Agent`; a teammate the coordinator starts gets
    /// the coordinator's own `SendMessage`.
    pub worker_tools: ToolPool,
    /// A scratchpad directory announced to the coordinator and its workers (see
    /// [`task::scratchpad`](crate::task::scratchpad), which makes one safely).
    pub scratchpad: Option<std::path::PathBuf>,
}

impl CoordinatorConfig {
    /// Workers with `worker_tools` and the built-in agent types.
    pub fn new(worker_tools: ToolPool) -> Self {
        Self {
            agent_tool: AgentToolConfig::default(),
            worker_tools,
            scratchpad: None,
        }
    }

    /// The same, announcing `dir` as the scratchpad.
    #[must_use]
    pub fn with_scratchpad(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.scratchpad = Some(dir.into());
        self
    }

    /// The same, with this `Agent` tool configuration.
    #[must_use]
    pub fn with_agent_tool(mut self, agent_tool: AgentToolConfig) -> Self {
        self.agent_tool = agent_tool;
        self
    }
}

/// The worker tools' names a coordinator is told about: those a background worker keeps, in
/// pool order (the same bytes every turn: the list is part of the prompt's cache key).
pub fn worker_tool_names(config: &CoordinatorConfig) -> Vec<String> {
    config
        .agent_tool
        .filter
        .pool(
            &worker_pool(&config.worker_tools),
            ToolAudience::Background,
            None,
            None,
        )
        .names()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The tools workers are drawn from: the host's, without `SendMessage`. Taken from the pool,
/// not through the filter's layer 1: a teammate the coordinator starts (`name` and
/// `team_name`) gets the coordinator's own `SendMessage`, which it needs to reach its lead
/// and to answer a shutdown ("Claude Code Multi-Agent Internals — 6.4 Teammates get
/// team-aware prompts and tool injection"), and a filter that named it would take it away
/// again.
fn worker_pool(tools: &ToolPool) -> ToolPool {
    tools.filtered(|t| t.definition().name != crate::control::SEND_MESSAGE)
}

/// Makes `builder` a coordinator's: its system prompt, its three tools, and a user-context
/// entry `workerTools` listing what its workers can use.
pub fn coordinator(builder: AgentBuilder, config: CoordinatorConfig) -> Result<AgentBuilder> {
    let names = worker_tool_names(&config);
    let CoordinatorConfig {
        agent_tool,
        worker_tools,
        scratchpad,
    } = config;
    let mut worker_context = agent_tool.subagent_user_context.clone();
    let note = scratchpad.as_ref().map(|dir| {
        format!(
            "A scratchpad directory shared with the other workers and the coordinator: {}. \
             Write what others should know there as files under a directory named after your \
             task id; read theirs. There is no lock: the last write of a file wins.",
            dir.display()
        )
    });
    if let Some(note) = &note {
        worker_context.push(("scratchpad".to_owned(), note.clone()));
    }
    let agent_tool = agent_tool
        .with_coordinator_mode(true)
        .with_subagent_tools(Some(worker_pool(&worker_tools)))
        .with_subagent_user_context(worker_context);
    let tools = ToolPool::new([
        AgentTool::new(agent_tool)?.arc(),
        Arc::new(SendMessageTool::new()?) as Arc<dyn Tool>,
        Arc::new(TaskStopTool::new()?),
    ])?;
    let listed = if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    };
    // The MCP servers workers reach too (Chapter 20: the coordinator's user context lists
    // the tools and MCP servers available to workers), when the hub was given first.
    #[cfg(feature = "mcp")]
    let servers = builder
        .mcp_hub()
        .map(|hub| hub.names())
        .filter(|n| !n.is_empty())
        .map(|names| {
            format!(
                " They can also use the tools of these MCP servers (named \
                 mcp__<server>__<tool>): {}.",
                names.join(", ")
            )
        })
        .unwrap_or_default();
    #[cfg(not(feature = "mcp"))]
    let servers = String::new();
    let mut builder = builder
        .system_prompt(COORDINATOR_PROMPT)
        .tools(tools)
        .user_context(
            "workerTools",
            format!("Workers you start can use these tools: {listed}.{servers}"),
        );
    if let Some(dir) = &scratchpad {
        builder = builder.user_context(
            "scratchpad",
            format!(
                "A scratchpad directory you and your workers share: {}. Tell workers what to \
                 read or write there; each writes under its own task id, and the last write of \
                 a file wins.",
                dir.display()
            ),
        );
    }
    Ok(builder)
}
