//! What an agent's tools and children get of it: the shared handle behind the `Caller`
//! interface, and the seed a child starts from.

use super::*;

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
    /// The host's hooks, which run for every agent of the tree.
    pub hooks: crate::hook::Hooks,
    /// Whether the hooks of project, plugin and flag definitions run.
    pub trust_hooks: bool,
    /// Whether a definition's loosening `permissionMode` applies
    /// ([`AgentBuilder::trust_permission_modes`](crate::runtime::AgentBuilder::trust_permission_modes)).
    pub trust_modes: bool,
}

/// The parts of an agent its tools may use — to spawn a child with the same backend, tools
/// and policy, deliver it messages, or reach the tree — shared behind one `Arc`.
#[derive(Debug)]
pub(crate) struct AgentShared {
    /// The model backend.
    pub(crate) backend: Arc<dyn Backend>,
    /// The agent's tools (after filtering).
    pub(crate) pool: ToolPool,
    /// The agent's permission policy.
    pub(crate) policy: Arc<dyn PermissionPolicy>,
    /// The agent's limits.
    pub(crate) limits: Limits,
    /// The agent's per-request settings.
    pub(crate) settings: RequestSettings,
    /// The agent's identity.
    pub(crate) cx: Arc<AgentContext>,
    /// The agent's own state.
    pub(crate) state: AgentState,
    /// The tree's shared state.
    pub(crate) tree: Arc<TreeState>,
    /// The agent's cancellation token.
    pub(crate) cancel: CancellationToken,
    /// The agent's pending-message queue.
    pub(crate) pending: PendingQueue,
    /// A request to end the run at the next tool-round boundary.
    pub(crate) halt: crate::base::pending::Halt,
    /// The host's hooks (passed on to children).
    pub(crate) host_hooks: crate::hook::Hooks,
    /// Whether definitions' hooks from untrusted sources run (passed on to children).
    pub(crate) trust_hooks: bool,
    /// Whether definitions' loosening permission modes apply (passed on to children).
    pub(crate) trust_modes: bool,
    /// The hooks that run for this agent: the host's, then its definition's.
    pub(crate) hooks: crate::hook::Hooks,
    /// Its definition's own hooks (kept to build it again when it is resumed).
    pub(crate) own_hooks: crate::hook::Hooks,
    /// Where the agent's events go.
    pub(crate) events: Option<Arc<dyn EventSink>>,
    /// Where the agent writes its transcript (children write theirs beside it).
    pub(crate) transcript_dir: Option<PathBuf>,
    /// Whether a finished turn waits for promised messages (background children).
    pub(crate) wait_for_promises: bool,
    /// The children it started.
    pub(crate) children: ChildLedger,
    /// Its holds on its definition's own MCP servers (released when it ends).
    #[cfg(feature = "mcp")]
    pub(crate) _mcp_holds: Vec<crate::mcp::Holder>,
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
    pub(crate) fn child_seed(&self, id: TaskId, kind: AgentKind, source: QuerySource) -> ChildSeed {
        ChildSeed {
            context: self.cx.child(id, kind, source),
            state: self.state.fork_for_child(),
            tree: Arc::clone(&self.tree),
            cancel: self.cancel.child_token(),
            parent_policy: Arc::clone(&self.policy),
            hooks: self.host_hooks.clone(),
            trust_hooks: self.trust_hooks,
            trust_modes: self.trust_modes,
        }
    }
}
