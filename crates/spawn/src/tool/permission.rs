//! Permissions: a [`PermissionPolicy`] is asked before every tool call.
//!
//! A policy allows a call, denies it with a reason (the reason goes back to the model as an
//! `is_error` tool result, so it can change course), or allows it with rewritten input (which
//! is validated against the tool's schema again). An agent definition's `permissionMode`
//! maps onto a policy with [`policy_for_mode`]; `bubble` hands a child's decisions to its
//! parent's policy, as Claude Code's fork agent does ("Fork Mechanism — FORK_AGENT").

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::definition::PermissionMode;
use crate::runtime::context::AgentContext;
use crate::tool::Tool;

/// The decision on one tool call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PermissionDecision {
    /// Run the call as the model wrote it.
    Allow,
    /// Do not run it; `reason` is sent to the model as the call's (error) result.
    Deny {
        /// Why, in words the model can act on.
        reason: String,
    },
    /// Run it with this input instead (validated against the tool's schema again).
    AllowWithInput(serde_json::Value),
}

impl PermissionDecision {
    /// A denial with `reason`.
    pub fn deny(reason: impl Into<String>) -> Self {
        PermissionDecision::Deny {
            reason: reason.into(),
        }
    }
}

/// One call awaiting a decision.
#[derive(Debug, Clone, Copy)]
pub struct PermissionRequest<'a> {
    /// The tool to be called.
    pub tool: &'a dyn Tool,
    /// The call's input, already valid against the tool's schema.
    pub input: &'a serde_json::Value,
    /// The agent that wants to make the call.
    pub agent: &'a AgentContext,
    /// The id of the `tool_use` block.
    pub tool_use_id: &'a str,
}

impl PermissionRequest<'_> {
    /// The tool's name.
    pub fn tool_name(&self) -> &str {
        &self.tool.definition().name
    }
}

/// Decides whether a tool call may run ("can use tool"). Object-safe.
#[async_trait]
pub trait PermissionPolicy: Send + Sync + fmt::Debug + 'static {
    /// The decision on `request`. May wait (for a human, a remote service, a parent agent).
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision;
}

#[async_trait]
impl<P: PermissionPolicy + ?Sized> PermissionPolicy for Arc<P> {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        (**self).check(request).await
    }
}

/// Allows every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

#[async_trait]
impl PermissionPolicy for AllowAll {
    async fn check(&self, _request: PermissionRequest<'_>) -> PermissionDecision {
        PermissionDecision::Allow
    }
}

/// Allows only tools that declare themselves read-only; denies the rest with `reason`.
#[derive(Debug, Clone)]
pub struct ReadOnly {
    reason: String,
}

impl ReadOnly {
    /// Denies non-read-only tools saying `reason` (after the tool's name).
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl Default for ReadOnly {
    fn default() -> Self {
        Self::new("only read-only tools may run here")
    }
}

#[async_trait]
impl PermissionPolicy for ReadOnly {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        if request.tool.is_read_only() {
            PermissionDecision::Allow
        } else {
            PermissionDecision::deny(format!(
                "permission denied for `{}`: {}",
                request.tool_name(),
                self.reason
            ))
        }
    }
}

/// Sends every decision to the parent agent's policy (`permissionMode: bubble`).
#[derive(Debug, Clone)]
pub struct BubbleToParent {
    parent: Arc<dyn PermissionPolicy>,
}

impl BubbleToParent {
    /// Bubbles to `parent`.
    pub fn new(parent: Arc<dyn PermissionPolicy>) -> Self {
        Self { parent }
    }
}

#[async_trait]
impl PermissionPolicy for BubbleToParent {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        self.parent.check(request).await
    }
}

/// Allows read-only tools and the file-editing tools (`Edit`, `Write`, `NotebookEdit`, and any
/// read-only tool); asks `rest` about everything else.
#[derive(Debug, Clone)]
pub struct AcceptEdits {
    rest: Arc<dyn PermissionPolicy>,
}

/// The tool names [`AcceptEdits`] allows without asking.
pub const EDIT_TOOLS: [&str; 4] = ["Edit", "Write", "NotebookEdit", "MultiEdit"];

#[async_trait]
impl PermissionPolicy for AcceptEdits {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        if request.tool.is_read_only() || EDIT_TOOLS.contains(&request.tool_name()) {
            PermissionDecision::Allow
        } else {
            self.rest.check(request).await
        }
    }
}

/// The policy for a definition's `permissionMode`.
///
/// | mode | policy |
/// | --- | --- |
/// | none, `default` | `host`: the host's own policy |
/// | `acceptEdits` | read-only and file-editing tools allowed, the rest asked of `host` |
/// | `bypassPermissions` | [`AllowAll`] |
/// | `plan` | [`ReadOnly`]: planning never changes anything |
/// | `dontAsk` | [`ReadOnly`]: what would need asking is denied instead |
/// | `bubble` | [`BubbleToParent`] with `parent` (the host's policy when there is no parent) |
pub fn policy_for_mode(
    mode: Option<&PermissionMode>,
    host: Arc<dyn PermissionPolicy>,
    parent: Option<Arc<dyn PermissionPolicy>>,
) -> Arc<dyn PermissionPolicy> {
    match mode {
        None | Some(PermissionMode::Default) => host,
        Some(PermissionMode::AcceptEdits) => Arc::new(AcceptEdits { rest: host }),
        Some(PermissionMode::BypassPermissions) => Arc::new(AllowAll),
        Some(PermissionMode::Plan) => Arc::new(ReadOnly::new(
            "plan mode: only read-only tools may run while planning",
        )),
        Some(PermissionMode::DontAsk) => Arc::new(ReadOnly::new(
            "this agent runs without asking, and the tool is not read-only",
        )),
        Some(PermissionMode::Bubble) => Arc::new(BubbleToParent::new(parent.unwrap_or(host))),
    }
}
