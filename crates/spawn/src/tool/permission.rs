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

use crate::base::context::AgentContext;
use crate::definition::PermissionMode;
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

    /// The decision on `request` when it needs no waiting, or `None` to be asked through
    /// [`check`](Self::check). Asked first, before every call: a policy that decides from the
    /// request alone answers here and spares the call a boxed future. The default asks
    /// `check`. When it answers, it must answer as `check` would. It may be asked more than
    /// once about one call (a [`Both`] asks its first half's fast path again in its `check`), so it
    /// must have no side effects: a policy that records or asks anything does so in `check`.
    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        let _ = request;
        None
    }
}

#[async_trait]
impl<P: PermissionPolicy + ?Sized> PermissionPolicy for Arc<P> {
    // Forwarded without a box of its own: the inner policy's future is the call's.
    fn check<'a, 'r, 'f>(
        &'a self,
        request: PermissionRequest<'r>,
    ) -> futures::future::BoxFuture<'f, PermissionDecision>
    where
        'a: 'f,
        'r: 'f,
        Self: 'f,
    {
        (**self).check(request)
    }

    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        (**self).decide_now(request)
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

    fn decide_now(&self, _request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        Some(PermissionDecision::Allow)
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
        self.decide(&request)
    }

    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        Some(self.decide(request))
    }
}

impl ReadOnly {
    fn decide(&self, request: &PermissionRequest<'_>) -> PermissionDecision {
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

    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        self.parent.decide_now(request)
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
        if Self::allows(&request) {
            PermissionDecision::Allow
        } else {
            self.rest.check(request).await
        }
    }

    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        if Self::allows(request) {
            Some(PermissionDecision::Allow)
        } else {
            self.rest.decide_now(request)
        }
    }
}

impl AcceptEdits {
    fn allows(request: &PermissionRequest<'_>) -> bool {
        request.tool.is_read_only() || EDIT_TOOLS.contains(&request.tool_name())
    }
}

/// Asks `first`, then — if it allowed — `then` (with the input `first` may have rewritten).
/// A tightening mode layered on the host's policy: both must allow.
#[derive(Debug, Clone)]
pub struct Both {
    first: Arc<dyn PermissionPolicy>,
    then: Arc<dyn PermissionPolicy>,
}

impl Both {
    /// `first`, then `then`.
    pub fn new(first: Arc<dyn PermissionPolicy>, then: Arc<dyn PermissionPolicy>) -> Self {
        Self { first, then }
    }
}

#[async_trait]
impl PermissionPolicy for Both {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        // `first` answers through its fast path when it has one: a call that reached `check`
        // because `then` could not answer at once has already had `first`'s fast answer, and
        // asking `first.check` as well would ask a policy with side effects in `check` (an
        // audit log, a counter) about one call twice.
        let first = match self.first.decide_now(&request) {
            Some(decision) => decision,
            None => self.first.check(request).await,
        };
        match first {
            PermissionDecision::Allow => self.then.check(request).await,
            PermissionDecision::AllowWithInput(input) => {
                let rewritten = PermissionRequest {
                    input: &input,
                    ..request
                };
                match self.then.check(rewritten).await {
                    PermissionDecision::Allow => PermissionDecision::AllowWithInput(input),
                    other => other,
                }
            }
            deny => deny,
        }
    }

    /// Both decide now, or `check` asks both (a rewritten input goes through `check` too).
    fn decide_now(&self, request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
        match self.first.decide_now(request)? {
            PermissionDecision::Allow => self.then.decide_now(request),
            PermissionDecision::AllowWithInput(_) => None,
            deny => Some(deny),
        }
    }
}

/// The policy for a definition's `permissionMode`, layered on the host's policy.
///
/// Modes that *tighten* always apply, on top of the host's policy: a definition can never make
/// an agent less strict than the host. Modes that *loosen* (`acceptEdits`,
/// `bypassPermissions`) come from files an untrusted repository may carry, so they apply only
/// when `trust_loosening` (the agent builder passes: the host trusts definitions' modes, or the
/// definition is the host's own); otherwise the host's policy decides alone.
///
/// | mode | policy |
/// | --- | --- |
/// | none, `default` | `host` |
/// | `plan` | [`ReadOnly`] ("plan mode: only read-only tools may run while planning"), then `host` |
/// | `dontAsk` | [`ReadOnly`] (what would need asking is denied instead), then `host` |
/// | `bubble` | [`BubbleToParent`]: the parent's policy (`host` when there is no parent) |
/// | `acceptEdits` | trusted: read-only and file-editing tools allowed, the rest asked of `host`; else `host` |
/// | `bypassPermissions` | trusted: [`AllowAll`]; else `host` |
pub fn policy_for_mode(
    mode: Option<&PermissionMode>,
    host: Arc<dyn PermissionPolicy>,
    parent: Option<Arc<dyn PermissionPolicy>>,
    trust_loosening: bool,
) -> Arc<dyn PermissionPolicy> {
    let read_only = |reason: &str| -> Arc<dyn PermissionPolicy> { Arc::new(ReadOnly::new(reason)) };
    match mode {
        None | Some(PermissionMode::Default) => host,
        Some(PermissionMode::Plan) => Arc::new(Both::new(
            read_only("plan mode: only read-only tools may run while planning"),
            host,
        )),
        Some(PermissionMode::DontAsk) => Arc::new(Both::new(
            read_only("this agent runs without asking, and the tool is not read-only"),
            host,
        )),
        // A restriction the agent was given (a teammate's plan mode) is layered on by its
        // builder, above this: `bubble` cannot drop it, and the parent is asked once.
        Some(PermissionMode::Bubble) => Arc::new(BubbleToParent::new(parent.unwrap_or(host))),
        Some(PermissionMode::AcceptEdits) if trust_loosening => {
            Arc::new(AcceptEdits { rest: host })
        }
        Some(PermissionMode::BypassPermissions) if trust_loosening => Arc::new(AllowAll),
        Some(PermissionMode::AcceptEdits | PermissionMode::BypassPermissions) => {
            tracing::warn!(
                "ignoring a definition's loosening permissionMode: the host does not trust \
                 definitions' modes"
            );
            host
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::tool::{FnTool, ToolOutput};
    use forkhive_core::ToolDefinition;

    fn tool(name: &str, read_only: bool) -> FnTool {
        let t = FnTool::new(
            ToolDefinition::new(name, "a tool", r#"{"type":"object"}"#).unwrap(),
            |_, _| async { ToolOutput::text("ran") },
        );
        if read_only { t.read_only() } else { t }
    }

    /// Asks `first` and rewrites the input: its answer can only come from `check`.
    #[derive(Debug)]
    struct Rewrites;

    #[async_trait]
    impl PermissionPolicy for Rewrites {
        async fn check(&self, _request: PermissionRequest<'_>) -> PermissionDecision {
            PermissionDecision::AllowWithInput(serde_json::json!({"safe": true}))
        }
    }

    /// Every built-in that answers through `decide_now` answers as its `check` does, for a
    /// read-only tool, an editing tool and a shell; `Both` leaves a rewritten input to `check`.
    #[tokio::test]
    async fn decide_now_answers_as_check_does() {
        let deny: Arc<dyn PermissionPolicy> = Arc::new(ReadOnly::new("no"));
        let allow: Arc<dyn PermissionPolicy> = Arc::new(AllowAll);
        let policies: Vec<(&str, Arc<dyn PermissionPolicy>)> = vec![
            ("AllowAll", Arc::clone(&allow)),
            ("ReadOnly", Arc::clone(&deny)),
            (
                "AcceptEdits",
                Arc::new(AcceptEdits {
                    rest: Arc::clone(&deny),
                }),
            ),
            (
                "BubbleToParent",
                Arc::new(BubbleToParent::new(Arc::clone(&deny))),
            ),
            (
                "Both",
                Arc::new(Both::new(Arc::clone(&allow), Arc::clone(&deny))),
            ),
            ("Arc", Arc::new(Arc::clone(&deny))),
        ];
        let agent = AgentContext::main();
        let input = serde_json::json!({});
        for t in [tool("Read", true), tool("Edit", false), tool("Bash", false)] {
            let request = PermissionRequest {
                tool: &t,
                input: &input,
                agent: &agent,
                tool_use_id: "toolu_1",
            };
            for (name, p) in &policies {
                let now = p.decide_now(&request);
                assert!(
                    now.is_some(),
                    "{name} answers {} at once",
                    request.tool_name()
                );
                assert_eq!(
                    now,
                    Some(p.check(request).await),
                    "{name} on {}",
                    request.tool_name()
                );
            }
        }
        let rewriting = Both::new(Arc::new(Rewrites), allow);
        let t = tool("Bash", false);
        let request = PermissionRequest {
            tool: &t,
            input: &input,
            agent: &agent,
            tool_use_id: "toolu_2",
        };
        assert_eq!(rewriting.decide_now(&request), None);
        assert_eq!(
            rewriting.check(request).await,
            PermissionDecision::AllowWithInput(serde_json::json!({"safe": true}))
        );
    }

    /// A policy whose `check` counts its calls, with or without a fast path that allows.
    #[derive(Debug, Default)]
    struct Counted {
        fast: bool,
        checks: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl PermissionPolicy for Counted {
        async fn check(&self, _request: PermissionRequest<'_>) -> PermissionDecision {
            self.checks
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            PermissionDecision::Allow
        }
        fn decide_now(&self, _request: &PermissionRequest<'_>) -> Option<PermissionDecision> {
            self.fast.then_some(PermissionDecision::Allow)
        }
    }

    /// As a round asks a policy (its fast path, then `check` when that has no answer), `Both`
    /// asks each half's `check` at most once per call: a first half that answered at once is
    /// not asked again through `check` because the second half had to be.
    #[tokio::test]
    async fn both_asks_each_half_once_per_call() {
        use std::sync::atomic::Ordering::SeqCst;
        let agent = AgentContext::main();
        let input = serde_json::json!({});
        let t = tool("Bash", false);
        let request = PermissionRequest {
            tool: &t,
            input: &input,
            agent: &agent,
            tool_use_id: "toolu_3",
        };
        for first_fast in [true, false] {
            let first = Arc::new(Counted {
                fast: first_fast,
                ..Counted::default()
            });
            let then = Arc::new(Counted::default());
            let both = Both::new(
                Arc::clone(&first) as Arc<dyn PermissionPolicy>,
                Arc::clone(&then) as Arc<dyn PermissionPolicy>,
            );
            // What a round does.
            let decision = match both.decide_now(&request) {
                Some(d) => d,
                None => both.check(request).await,
            };
            assert_eq!(decision, PermissionDecision::Allow);
            let expected_first = usize::from(!first_fast);
            assert_eq!(
                first.checks.load(SeqCst),
                expected_first,
                "first half's check (fast path: {first_fast})"
            );
            assert_eq!(then.checks.load(SeqCst), 1, "second half's check");
        }
    }
}
