//! # forkhive
//!
//! Embeddable multi-agent delegation for Rust: spawn fresh subagents, fork children that share
//! the parent's prompt cache byte for byte, run a coordinator with background workers, and keep
//! long-lived teammates — on any LLM backend.
//!
//! This facade re-exports the three crates:
//!
//! | crate | role |
//! | --- | --- |
//! | [`core`] (`forkhive-core`) | messages, cache-safe parameters, fingerprints, fork prefixes, task envelopes, task ids, usage — pure data, no runtime |
//! | [`transport`] (`forkhive-transport`) | the LLM backend contract, wire codecs and backends |
//! | [`spawn`] (`forkhive-spawn`) | the agent runtime and the spawn strategies |
//!
//! The dependency direction is `core` <- `transport` <- `spawn` <- `forkhive`.
//!
//! ## Features
//!
//! | feature | default | what it enables |
//! | --- | --- | --- |
//! | `http` | yes | the Anthropic and OpenAI-compatible HTTP backends (reqwest + rustls) |
//! | `mcp` | yes | MCP servers (stdio and streamable HTTP, on `rmcp`) as agents' tools: `spawn::mcp`, `AgentBuilder::mcp` (`docs/mcp.md`) |
//! | `redis` | no | worker processes on Redis (`spawn::pool`: `Pool`, `Worker`, `Delivery`, `PoolAgentTool`), and mailboxes, the task registry and notification queues on Redis (`RedisMailbox`, `RedisTaskRegistry`, `RedisNotificationQueue`; `docs/distributed.md`) |
//!
//! ## Example
//!
//! ```
//! use forkhive::prelude::*;
//!
//! let params = CacheSafeParams::builder("claude-sonnet-4-5")
//!     .system_block("You are a careful engineer.")
//!     .messages(vec![Message::user_text("Audit the repository.")])
//!     .build();
//! let turn = Message::assistant(vec![ContentBlock::text("Splitting the audit.")]);
//! let prefix = ForkPrefix::new(params, turn)?;
//! let (a, b) = (prefix.child("audit src/net"), prefix.child("audit src/db"));
//! assert_eq!(a.fingerprint().diff(&b.fingerprint()).map(|b| b.to_string()),
//!            Some("messages[2] changed".to_owned()));
//! # Ok::<(), forkhive::core::Error>(())
//! ```

#![forbid(unsafe_code)]

#[doc(inline)]
pub use forkhive_core as core;
#[doc(inline)]
pub use forkhive_spawn as spawn;
#[doc(inline)]
pub use forkhive_transport as transport;

/// The README's code, compiled and run as a doctest so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The code in `docs/fork.md`, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/fork.md")]
pub struct ForkDocDoctests;

/// The code in `docs/cache-economics.md`, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/cache-economics.md")]
pub struct CacheEconomicsDocDoctests;

/// The code in `docs/runtime.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/runtime.md")]
pub struct RuntimeDocDoctests;

/// The code in `docs/definitions.md`, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/definitions.md")]
pub struct DefinitionsDocDoctests;

/// The code in `docs/subagent.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/subagent.md")]
pub struct SubagentDocDoctests;

/// The code in `docs/verification.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/verification.md")]
pub struct VerificationDocDoctests;

/// The code in `docs/background.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/background.md")]
pub struct BackgroundDocDoctests;

/// The attribute for implementing [`Tool`](spawn::tool::Tool) and
/// [`Backend`](transport::Backend), whose methods are async: `#[forkhive::async_trait]`.
pub use async_trait::async_trait;
/// JSON values, as tools take them: `forkhive::serde_json::json!`, `serde_json::Value`.
pub use serde_json;

/// The code in `docs/embedding.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/embedding.md")]
pub struct EmbeddingDocDoctests;

/// The code in `docs/coordinator.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/coordinator.md")]
pub struct CoordinatorDocDoctests;

/// The code in `docs/timeline.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/timeline.md")]
pub struct TimelineDocDoctests;

/// The code in `docs/teams.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/teams.md")]
pub struct TeamsDocDoctests;

/// The code in `docs/tools.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/tools.md")]
pub struct ToolsDocDoctests;

/// The code in `docs/hooks.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/hooks.md")]
pub struct HooksDocDoctests;

/// The code in `docs/mcp.md`, compiled and run as a doctest.
#[cfg(all(doctest, feature = "mcp"))]
#[doc = include_str!("../docs/mcp.md")]
pub struct McpDocDoctests;

/// The code in `docs/http.md`, compiled and run as a doctest.
#[cfg(all(doctest, feature = "http"))]
#[doc = include_str!("../docs/http.md")]
pub struct HttpDocDoctests;

/// The code in `docs/distributed.md`, compiled as a doctest.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../docs/distributed.md")]
pub struct DistributedDocDoctests;

/// The names a host program needs, in one import: building agents and tools, the `Agent`
/// tool, the task service, teams and their mailboxes, coordinator mode, events, scripted and
/// simulated backends, usage and prices.
pub mod prelude {
    #[doc(inline)]
    pub use async_trait::async_trait;
    #[doc(inline)]
    pub use forkhive_core::{
        CacheBreak, CacheSafeParams, ContentBlock, ForkChild, ForkPrefix, Message,
        PrefixFingerprint, PriceTable, Prices, RawJson, Role, TaskId, TaskKind, TaskNotification,
        TaskStatus, ToolDefinition, Usage,
    };
    #[doc(inline)]
    pub use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    #[doc(inline)]
    pub use forkhive_spawn::control::{SendMessageTool, TaskStopTool};
    #[doc(inline)]
    pub use forkhive_spawn::coordinator::{CoordinatorConfig, coordinator};
    #[doc(inline)]
    pub use forkhive_spawn::definition::skills::Skills;
    #[doc(inline)]
    pub use forkhive_spawn::definition::{
        AgentDefinition, AgentLoader, AgentRegistry, DefinitionSource, PermissionMode,
    };
    #[doc(inline)]
    pub use forkhive_spawn::hook::{CommandHook, Hook, HookEvent, HookInput, HookOutcome, Hooks};
    #[doc(inline)]
    pub use forkhive_spawn::mailbox::{FileMailbox, Letter, Mailbox, MemoryMailbox};
    #[cfg(feature = "mcp")]
    #[doc(inline)]
    pub use forkhive_spawn::mcp::{McpHub, McpServer, McpStatus};
    #[doc(inline)]
    pub use forkhive_spawn::runtime::{
        Agent, AgentBuilder, AgentContext, AgentEvent, AgentKind, AgentRun, CancellationToken,
        ChildReport, EventKind, EventSink, FnSink, Limits, PendingMessage, StopReason,
    };
    #[doc(inline)]
    pub use forkhive_spawn::task::{MemoryTaskRegistry, Retention, TaskConfig, TaskService};
    #[doc(inline)]
    pub use forkhive_spawn::team::{Member, MemberState, ShutdownPolicy, Team};
    #[doc(inline)]
    pub use forkhive_spawn::tool::memory::MemoryRoots;
    #[doc(inline)]
    pub use forkhive_spawn::tool::{
        AllowAll, Both, BubbleToParent, FnTool, InBackground, ListDir, PermissionDecision,
        PermissionPolicy, PermissionRequest, ReadFile, ReadOnly, Tool, ToolAudience, ToolContext,
        ToolFilter, ToolOutput, ToolPool,
    };
    #[doc(inline)]
    pub use forkhive_transport::simulator::PromptCacheSimulator;
    #[doc(inline)]
    pub use forkhive_transport::{Backend, Request, Response, ScriptedBackend};
}
