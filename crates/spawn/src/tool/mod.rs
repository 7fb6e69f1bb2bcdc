//! Tools: the [`Tool`] trait, [`ToolPool`], orchestration of one assistant message's calls,
//! permissions and the three filtering layers.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`pool`] | [`ToolPool`]: tools in a fixed order (the order is part of the cache key), with compiled input validators |
//! | [`orchestrate`] | one tool round: consecutive concurrency-safe calls in parallel, the rest serially, results in call order |
//! | [`permission`] | [`PermissionPolicy`] (can-use-tool), the built-in policies and `permissionMode` mapping |
//! | [`filter`] | the three layers of tool filtering as one pure function |
//! | [`func`] | [`FnTool`]: a tool from a definition and an async function |
//! | [`fs`] | two real tools over a directory: [`ReadFile`] (`Read`) and [`ListDir`] (`LS`) |
//!
//! Nothing a tool or the model does crashes the loop: an unknown tool, an input that fails the
//! tool's schema, a denied call, a tool error, a panic or a timeout each becomes an `is_error`
//! tool result whose text says exactly what was wrong.

pub mod filter;
pub mod fs;
pub mod func;
pub mod memory;
pub mod orchestrate;
pub mod permission;
pub mod pool;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use forkhive_core::{ContentBlock, ToolDefinition, ToolResultContent};
use tokio_util::sync::CancellationToken;

use crate::base::context::AgentContext;
use crate::base::events::EventSink;
use crate::base::pending::PendingQueue;
use crate::base::state::{AgentState, TreeState, TurnSnapshot};

pub use filter::{ToolAudience, ToolFilter, Unavailable};
pub use fs::{ListDir, ReadFile};
pub use func::FnTool;
pub use permission::{
    AllowAll, Both, BubbleToParent, PermissionDecision, PermissionPolicy, PermissionRequest,
    ReadOnly,
};
pub use pool::ToolPool;

/// What a tool call returned: content blocks (usually one text block) and whether it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// What goes back to the model, in order.
    pub content: Vec<ContentBlock>,
    /// Whether the call failed (sent as `is_error: true`).
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful result holding one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            is_error: false,
        }
    }

    /// A failed result holding one text block that says what was wrong.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            is_error: true,
        }
    }

    /// A successful result made of blocks (text and images).
    pub fn blocks(content: Vec<ContentBlock>) -> Self {
        Self {
            content,
            is_error: false,
        }
    }

    /// All text blocks joined with newlines (for logs and tests).
    pub fn text_content(&self) -> String {
        self.content
            .iter()
            .filter_map(ContentBlock::as_text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The `tool_result` block answering the call `tool_use_id`.
    pub fn into_result_block(self, tool_use_id: impl Into<String>) -> ContentBlock {
        ContentBlock::ToolResult {
            tool_use_id: tool_use_id.into(),
            content: ToolResultContent::Blocks(self.content),
            is_error: self.is_error,
        }
    }
}

/// Whether a tool may run in a background agent or teammate (see [`Tool::in_background`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum InBackground {
    /// Background agents may use it (the default: a host's own tools, like MCP tools).
    #[default]
    Allowed,
    /// Only agents someone waits for may use it.
    Denied,
    /// [`ToolFilter::background_allow`] decides by name (the crate's built-in tools).
    ByFilter,
}

/// The agent a tool call runs for, as a tool may use it: who it is, its pending-message queue
/// (a message for it arrives at its next tool round), its tree (whose
/// [`extensions`](TreeState::extensions) hold the services children are started through,
/// such as the task service) and its event sink.
///
/// This is the whole of what `tool` knows of the agent loop: the loop implements it, so tools
/// never depend on the runtime.
pub trait Caller: Send + Sync + fmt::Debug + 'static {
    /// Who the agent is.
    fn context(&self) -> &Arc<AgentContext>;
    /// The agent's pending-message queue.
    fn pending(&self) -> &PendingQueue;
    /// The agent tree's shared state.
    fn tree(&self) -> &Arc<TreeState>;
    /// Where the agent's events go, if anywhere.
    fn events(&self) -> Option<&Arc<dyn EventSink>>;
    /// The implementation, for the crate's own spawning tools, which build a child from the
    /// whole of its caller.
    #[doc(hidden)]
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What a main agent was built with that a tool's [`Tool::warnings`] may depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BuildFacts {
    /// Whether the agent's children write transcripts: it has a transcript directory, or was
    /// resumed from a transcript named `<agent id>.jsonl` (beside which its children write
    /// theirs). Without them a finished child cannot be resumed.
    pub keeps_transcripts: bool,
    /// Whether the hooks of project, plugin and command-line definitions run
    /// ([`AgentBuilder::trust_definition_hooks`](crate::runtime::AgentBuilder::trust_definition_hooks)).
    pub trusts_definition_hooks: bool,
}

impl BuildFacts {
    /// Facts with `keeps_transcripts` set as given, and untrusted definition hooks (for a
    /// tool's own tests).
    pub fn new(keeps_transcripts: bool) -> Self {
        Self {
            keeps_transcripts,
            trusts_definition_hooks: false,
        }
    }

    /// The same, with `trusts_definition_hooks` set as given.
    pub fn with_trusted_definition_hooks(mut self, trust: bool) -> Self {
        self.trusts_definition_hooks = trust;
        self
    }
}

/// What a tool sees of the agent that calls it.
///
/// The same [`AgentContext`] is also reachable from any code below a tool through the
/// task-local [`AgentContext::current`].
#[derive(Clone)]
pub struct ToolContext {
    pub(crate) agent: Arc<AgentContext>,
    pub(crate) state: AgentState,
    pub(crate) cancel: CancellationToken,
    pub(crate) tool_use_id: Arc<str>,
    pub(crate) caller: Option<Arc<dyn Caller>>,
    pub(crate) turn: Option<Arc<TurnSnapshot>>,
}

impl ToolContext {
    /// A context for calling a tool outside an agent loop (tests, host code).
    pub fn detached(agent: Arc<AgentContext>, tool_use_id: impl Into<String>) -> Self {
        Self {
            agent,
            state: AgentState::default(),
            cancel: CancellationToken::new(),
            tool_use_id: Arc::from(tool_use_id.into()),
            caller: None,
            turn: None,
        }
    }

    /// The calling agent (`None` outside an agent loop).
    pub fn caller(&self) -> Option<&Arc<dyn Caller>> {
        self.caller.as_ref()
    }

    /// The model turn whose call this is: what its request sent and the assistant message
    /// (`None` outside an agent loop).
    pub fn turn(&self) -> Option<&Arc<TurnSnapshot>> {
        self.turn.as_ref()
    }

    /// The calling agent's identity.
    pub fn agent(&self) -> &Arc<AgentContext> {
        &self.agent
    }

    /// The calling agent's own state (its file-read cache, ...).
    pub fn state(&self) -> &AgentState {
        &self.state
    }

    /// Cancelled when the agent (or an ancestor) is cancelled; long-running tools should stop.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The id of the `tool_use` block being answered.
    pub fn tool_use_id(&self) -> &str {
        &self.tool_use_id
    }
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("agent", &self.agent.id())
            .field("tool_use_id", &self.tool_use_id)
            .finish_non_exhaustive()
    }
}

/// A tool the model can call. Object-safe: pools hold `Arc<dyn Tool>`.
///
/// Orchestration follows "Claude Code Multi-Agent Internals: How Subagents and Swarm Teammates
/// Actually Work — 3.2 Why the main agent can launch multiple subagents in parallel": calls a
/// tool declares concurrency-safe run in parallel with their consecutive safe neighbours.
///
/// ```
/// use async_trait::async_trait;
/// use forkhive_core::ToolDefinition;
/// use forkhive_spawn::tool::{Tool, ToolContext, ToolOutput};
///
/// #[derive(Debug)]
/// struct Echo(ToolDefinition);
///
/// #[async_trait]
/// impl Tool for Echo {
///     fn definition(&self) -> &ToolDefinition { &self.0 }
///     fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool { true }
///     fn is_read_only(&self) -> bool { true }
///     async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
///         ToolOutput::text(input["text"].as_str().unwrap_or_default())
///     }
/// }
/// let schema = r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#;
/// let echo = Echo(ToolDefinition::new("Echo", "Repeats its input", schema)?);
/// assert_eq!(echo.definition().name, "Echo");
/// # Ok::<(), forkhive_core::Error>(())
/// ```
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug + 'static {
    /// Name, description and input JSON Schema, exactly as sent to the provider.
    fn definition(&self) -> &ToolDefinition;

    /// Whether this call may run at the same time as its concurrency-safe neighbours.
    fn is_concurrency_safe(&self, input: &serde_json::Value) -> bool;

    /// Whether the tool never changes anything outside the agent.
    fn is_read_only(&self) -> bool;

    /// Other names a call may use for this tool (a legacy name, such as `Task` for `Agent`).
    fn aliases(&self) -> &[&str] {
        &[]
    }

    /// How long one call may take; `None` uses the agent's `Limits::tool_timeout`.
    fn timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether background agents and teammates, which run unattended, may use this tool.
    ///
    /// The default, [`InBackground::Allowed`], suits a host's own tools: like MCP tools they
    /// are the host's choice, so filtering layer 2 (an allow list of *built-in* names) does
    /// not drop them. A tool that needs someone watching returns [`InBackground::Denied`];
    /// the crate's built-in tools return [`InBackground::ByFilter`], which leaves the
    /// decision to [`ToolFilter::background_allow`]. Layers 1 and 3 apply either way.
    fn in_background(&self) -> InBackground {
        InBackground::Allowed
    }

    /// The same tool working in `root` instead (a worker's git worktree), or `None` when the
    /// tool has no directory of its own (the default). `ReadFile` and `ListDir` re-root.
    async fn rooted(&self, root: &std::path::Path) -> Option<Arc<dyn Tool>> {
        let _ = root;
        None
    }

    /// What the tool needs from the agent tree of the main agent it is built into, checked
    /// when that agent is built: `Err` says what is missing and how to give it, and the build
    /// fails with [`Error::Config`](crate::Error::Config) (a wiring mistake is caught when the
    /// host builds, not when the model first calls the tool). Default: nothing.
    fn check_tree(&self, tree: &TreeState) -> std::result::Result<(), String> {
        let _ = tree;
        Ok(())
    }

    /// What the host should know about how the tool was configured — a setting that does
    /// nothing in this combination, say. Read when a main agent is built with the tool, and
    /// emitted with the agent's other build warnings, each once, as an
    /// [`EventKind::Warning`](crate::runtime::EventKind::Warning) at the start of its first
    /// run's loop (a host without a `tracing` subscriber sees it too). `build` says what the
    /// agent was built with that a tool's warning may depend on, and `tree` holds the
    /// services given to it ([`check_tree`](Self::check_tree) has passed). Default: nothing.
    fn warnings(&self, build: &BuildFacts, tree: &TreeState) -> Vec<String> {
        let _ = (build, tree);
        Vec::new()
    }

    /// The tool as `Any`, for code that recognises its own tool types (the crate's MCP tools
    /// do, to own their connections; default: `None`).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Runs the call. `input` has already been validated against the tool's schema and
    /// approved by the permission policy. Failures are returned as [`ToolOutput::error`].
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput;
}

#[async_trait]
impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn definition(&self) -> &ToolDefinition {
        (**self).definition()
    }
    fn is_concurrency_safe(&self, input: &serde_json::Value) -> bool {
        (**self).is_concurrency_safe(input)
    }
    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }
    fn aliases(&self) -> &[&str] {
        (**self).aliases()
    }
    fn timeout(&self) -> Option<std::time::Duration> {
        (**self).timeout()
    }
    fn in_background(&self) -> InBackground {
        (**self).in_background()
    }
    // The async methods are forwarded without a box of their own: the inner tool's future
    // is the call's.
    fn rooted<'a, 'p, 'f>(
        &'a self,
        root: &'p std::path::Path,
    ) -> futures::future::BoxFuture<'f, Option<Arc<dyn Tool>>>
    where
        'a: 'f,
        'p: 'f,
        Self: 'f,
    {
        (**self).rooted(root)
    }
    fn check_tree(&self, tree: &TreeState) -> std::result::Result<(), String> {
        (**self).check_tree(tree)
    }
    fn warnings(&self, build: &BuildFacts, tree: &TreeState) -> Vec<String> {
        (**self).warnings(build, tree)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        (**self).as_any()
    }
    fn call<'a, 'c, 'f>(
        &'a self,
        input: serde_json::Value,
        cx: &'c ToolContext,
    ) -> futures::future::BoxFuture<'f, ToolOutput>
    where
        'a: 'f,
        'c: 'f,
        Self: 'f,
    {
        (**self).call(input, cx)
    }
}

/// Small tools for unit tests.
#[cfg(test)]
pub(crate) mod test_tools {
    use super::*;

    /// A tool that always answers the same text.
    #[derive(Debug)]
    pub(crate) struct Fixed {
        def: ToolDefinition,
        text: String,
    }

    impl Fixed {
        pub(crate) fn arc(name: &str, text: &str) -> Arc<dyn Tool> {
            Arc::new(Self {
                def: ToolDefinition::new(name, "fixed", r#"{"type":"object"}"#).unwrap(),
                text: text.to_owned(),
            })
        }

        pub(crate) fn with_schema(name: &str, schema: &str) -> Arc<dyn Tool> {
            Arc::new(Self {
                def: ToolDefinition::new(name, "fixed", schema).unwrap(),
                text: String::new(),
            })
        }
    }

    #[async_trait]
    impl Tool for Fixed {
        fn definition(&self) -> &ToolDefinition {
            &self.def
        }
        fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
            true
        }
        fn is_read_only(&self) -> bool {
            true
        }
        async fn call(&self, _input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
            ToolOutput::text(self.text.clone())
        }
    }
}
