//! [`AgentContext`]: who an agent is, reachable from any code running on its behalf.
//!
//! "Chapter 20: Agent Spawning and Orchestration — 20.1 AgentTool: AsyncLocalStorage Context
//! Isolation": when several agents run in one process, a single shared "current agent" would
//! be overwritten by whichever ran last. Each agent therefore runs inside its own tokio
//! task-local scope, and [`AgentContext::current`] answers for the agent whose future is being
//! polled — from a tool, or from any code below a tool.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use forkhive_core::{TaskId, TaskKind};
use serde::{Deserialize, Serialize};

tokio::task_local! {
    static CURRENT: Arc<AgentContext>;
}

/// What kind of agent this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentKind {
    /// The host's own top-level agent.
    Main,
    /// A fresh sub-agent with its own context.
    Subagent,
    /// A fork child sharing its parent's prompt cache.
    Fork,
    /// A long-lived teammate: started by an `Agent` call with `name` and `team_name`, or run
    /// on a pool's worker as a team's teammate.
    Teammate,
}

impl AgentKind {
    /// The name used in transcripts and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Main => "main",
            AgentKind::Subagent => "subagent",
            AgentKind::Fork => "fork",
            AgentKind::Teammate => "teammate",
        }
    }
}

impl fmt::Display for AgentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an agent's requests come from, as Claude Code labels them: `agent:builtin:fork`,
/// `agent:builtin:<type>`, `agent:custom:<type>`, `agent:default`, or `main`.
///
/// The fork recursion guard reads it ("Fork Mechanism — isInForkChild").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QuerySource(String);

impl QuerySource {
    /// The main conversation.
    pub fn main() -> Self {
        Self("main".to_owned())
    }

    /// A fork child.
    pub fn fork() -> Self {
        Self::builtin("fork")
    }

    /// A built-in agent type.
    pub fn builtin(agent_type: &str) -> Self {
        // Concatenated, not formatted: every child's source is made once at its start.
        Self(["agent:builtin:", agent_type].concat())
    }

    /// A custom agent type.
    pub fn custom(agent_type: &str) -> Self {
        Self(["agent:custom:", agent_type].concat())
    }

    /// An agent without a definition.
    pub fn default_agent() -> Self {
        Self("agent:default".to_owned())
    }

    /// A source from its label, as written in a transcript.
    pub fn from_label(label: impl Into<String>) -> Self {
        Self(label.into())
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a fork child's source.
    pub fn is_fork(&self) -> bool {
        self.0 == "agent:builtin:fork"
    }
}

impl fmt::Display for QuerySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An agent's identity: id, parent, depth, kind, query source, agent type, and the request
/// that spawned it.
pub struct AgentContext {
    id: TaskId,
    parent: Option<TaskId>,
    depth: u32,
    kind: AgentKind,
    query_source: QuerySource,
    agent_type: Option<String>,
    invoking_request_id: Mutex<Option<String>>,
}

impl AgentContext {
    /// A main agent with a fresh id.
    pub fn main() -> Self {
        Self::new(
            TaskId::generate(TaskKind::Agent),
            AgentKind::Main,
            QuerySource::main(),
        )
    }

    /// An agent with the given id, kind and source, at depth 0 with no parent.
    pub fn new(id: TaskId, kind: AgentKind, query_source: QuerySource) -> Self {
        Self {
            id,
            parent: None,
            depth: 0,
            kind,
            query_source,
            agent_type: None,
            invoking_request_id: Mutex::new(None),
        }
    }

    /// A child of `self`: parent set, depth one more.
    pub fn child(&self, id: TaskId, kind: AgentKind, query_source: QuerySource) -> Self {
        Self {
            parent: Some(self.id),
            depth: self.depth.saturating_add(1),
            ..Self::new(id, kind, query_source)
        }
    }

    /// Sets the parent and depth (when restoring an agent from its transcript).
    pub fn with_lineage(mut self, parent: Option<TaskId>, depth: u32) -> Self {
        self.parent = parent;
        self.depth = depth;
        self
    }

    /// Sets the agent type (a definition's name).
    pub fn with_agent_type(mut self, agent_type: impl Into<String>) -> Self {
        self.agent_type = Some(agent_type.into());
        self
    }

    /// Sets the id of the request that spawned this agent.
    pub fn with_invoking_request_id(self, id: impl Into<String>) -> Self {
        *self
            .invoking_request_id
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(id.into());
        self
    }

    /// The agent's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// The parent's id (`None` for a root agent).
    pub fn parent(&self) -> Option<&TaskId> {
        self.parent.as_ref()
    }

    /// How deep in the tree (the root is 0).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The kind.
    pub fn kind(&self) -> AgentKind {
        self.kind
    }

    /// The query source.
    pub fn query_source(&self) -> &QuerySource {
        &self.query_source
    }

    /// The agent type (definition name), if any.
    pub fn agent_type(&self) -> Option<&str> {
        self.agent_type.as_deref()
    }

    /// The id of the request that spawned this agent — handed out once, then `None`.
    ///
    /// "Chapter 20 — 20.1": the spawning request is marked on the first API event only
    /// ("sparse edge" semantics), so consumers never mark it twice.
    pub fn take_invoking_request_id(&self) -> Option<String> {
        self.invoking_request_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The context of the agent whose future is running, if any.
    pub fn current() -> Option<Arc<AgentContext>> {
        CURRENT.try_with(Arc::clone).ok()
    }

    /// Runs `fut` with `self` as [`current`](Self::current). Use it for work a tool spawns
    /// onto another tokio task, which does not inherit the scope.
    // A plain `fn`: an `async fn` would hold `fut` twice, as its argument and inside the
    // scope's future (an agent's whole run loop, boxed once per run).
    pub fn scope<F: Future>(self: Arc<Self>, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, fut)
    }
}

impl fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentContext")
            .field("id", &self.id)
            .field("parent", &self.parent)
            .field("depth", &self.depth)
            .field("kind", &self.kind)
            .field("query_source", &self.query_source)
            .field("agent_type", &self.agent_type)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invoking_request_id_is_handed_out_once() {
        let cx = AgentContext::main().with_invoking_request_id("req_1");
        assert_eq!(cx.take_invoking_request_id().as_deref(), Some("req_1"));
        assert_eq!(cx.take_invoking_request_id(), None);
    }

    #[test]
    fn child_links_to_parent() {
        let root = AgentContext::main();
        let id = TaskId::generate(TaskKind::Agent);
        let c = root.child(id, AgentKind::Fork, QuerySource::fork());
        assert_eq!(c.parent(), Some(root.id()));
        assert_eq!(c.depth(), 1);
        assert!(c.query_source().is_fork());
        assert_eq!(
            QuerySource::custom("reviewer").as_str(),
            "agent:custom:reviewer"
        );
    }

    #[tokio::test]
    async fn current_is_per_task_scope() {
        assert!(AgentContext::current().is_none());
        let a = Arc::new(AgentContext::main());
        let b = Arc::new(AgentContext::main());
        let (ida, idb) = (*a.id(), *b.id());
        let fa = Arc::clone(&a).scope(async {
            tokio::task::yield_now().await;
            AgentContext::current().map(|c| *c.id())
        });
        let fb = Arc::clone(&b).scope(async {
            tokio::task::yield_now().await;
            AgentContext::current().map(|c| *c.id())
        });
        let (ra, rb) = tokio::join!(fa, fb);
        assert_eq!(ra, Some(ida));
        assert_eq!(rb, Some(idb));
    }
}
