//! One tool round: the calls of one assistant message, run and answered in one user message.
//!
//! "Claude Code Multi-Agent Internals — 3.2 Why the main agent can launch multiple subagents in
//! parallel": calls are partitioned into batches — a run of consecutive concurrency-safe calls
//! is one batch run concurrently (at most [`RoundConfig::max_concurrency`] at a time), every
//! other call is a batch of its own — and batches run in order. The results go back in call
//! order, in one user message, as the providers require. A round of many calls yields to the
//! runtime after every ten answers, so what its calls started (background children)
//! runs meanwhile.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use forkhive_core::{ContentBlock, RawJson};
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::base::events::{Emitter, EventKind};
use crate::tool::permission::{PermissionDecision, PermissionPolicy, PermissionRequest};
use crate::tool::{ToolContext, ToolOutput, ToolPool};

/// One `tool_use` block of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The block's id, echoed by its result (shared by the call's events and context).
    pub id: Arc<str>,
    /// The tool the model named.
    pub name: Arc<str>,
    /// The input, byte for byte as the model wrote it.
    pub input: RawJson,
}

impl ToolCall {
    /// The calls of `message`, in order.
    pub fn from_message(message: &forkhive_core::Message) -> Vec<ToolCall> {
        message
            .tool_uses()
            .map(|(id, name, input)| ToolCall {
                id: Arc::from(id),
                name: Arc::from(name),
                input: input.clone(),
            })
            .collect()
    }
}

/// Limits of one tool round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundConfig {
    /// How many concurrency-safe calls run at once (at least 1).
    pub max_concurrency: usize,
    /// How long one call may take before it is stopped and answered with an error.
    pub timeout: Duration,
}

impl Default for RoundConfig {
    fn default() -> Self {
        Self {
            max_concurrency: 10,
            timeout: Duration::from_secs(120),
        }
    }
}

/// Everything a round needs besides its calls.
pub(crate) struct Round<'a> {
    pub(crate) pool: &'a ToolPool,
    pub(crate) policy: &'a Arc<dyn PermissionPolicy>,
    pub(crate) cx: &'a ToolContext,
    pub(crate) config: RoundConfig,
    pub(crate) emit: &'a Emitter,
    /// The agent's hooks, and what their inputs start from (its identity).
    pub(crate) hooks: &'a crate::hook::Hooks,
    /// (`None` when there are no hooks: a round without hooks builds no input.)
    pub(crate) hook_base: Option<&'a crate::hook::HookInput>,
}

/// A call checked before it runs: either ready to run, or already answered.
enum Prepared {
    /// The input, and where the tool is in the pool (looked up once per call).
    Run(serde_json::Value, usize),
    Answered(ToolOutput),
}

/// One call's place in a round.
struct Slot {
    /// Whether it may run beside its neighbours.
    safe: bool,
    state: SlotState,
}

enum SlotState {
    /// Checked, not started.
    Ready(Prepared),
    /// Started (or the round was cancelled while it ran).
    Taken,
    /// Answered.
    Done(ToolOutput),
}

impl Slot {
    /// What the call waits with, once.
    fn take(&mut self) -> Option<Prepared> {
        match std::mem::replace(&mut self.state, SlotState::Taken) {
            SlotState::Ready(p) => Some(p),
            other => {
                self.state = other;
                None
            }
        }
    }
}

/// A round yields to the runtime after every this many answers while calls remain, and the
/// runtime runs what they started before the round goes on: a wide fan-out's background children
/// start (and, on a fast model, finish) while their parent is still launching, instead of all
/// waiting, built, for its last launch (at N = 10,000, most of the peak memory). It is the
/// default `max_concurrent_tools`, and small on purpose: tokio's current-thread scheduler polls
/// the future it blocks on again after at most `event_interval` (61 by default) other polls, so
/// a round there that launched more than that between yields would leave children unstarted,
/// and their number growing. (A round in a spawned task is queued behind what it started.)
const YIELD_EVERY: usize = 10;

/// Counts an answer of a round of `total` calls; after every [`YIELD_EVERY`], while calls
/// remain, yields to the runtime.
async fn pace(answered: &mut usize, total: usize) {
    *answered += 1;
    if (*answered).is_multiple_of(YIELD_EVERY) && *answered < total {
        tokio::task::yield_now().await;
    }
}

impl Round<'_> {
    /// Runs `calls` and returns one `tool_result` block per call, in call order.
    ///
    /// When the agent is cancelled mid-round, calls that had not finished are answered with an
    /// error saying so, so the conversation stays well-formed (and resumable).
    pub(crate) async fn run(&self, calls: &[ToolCall]) -> Vec<ContentBlock> {
        // One slot per call, in call order: what it is waiting with, then what it answered.
        let mut slots: Vec<Slot> = calls
            .iter()
            .map(|c| {
                let prepared = self.prepare(c);
                let safe = match &prepared {
                    Prepared::Answered(_) => true,
                    // A panicking classification counts as unsafe: run the call alone.
                    Prepared::Run(input, at) => {
                        let t = self.pool.tool_at(*at);
                        std::panic::catch_unwind(AssertUnwindSafe(|| t.is_concurrency_safe(input)))
                            .unwrap_or(false)
                    }
                };
                Slot {
                    safe,
                    state: SlotState::Ready(prepared),
                }
            })
            .collect();

        let (mut start, mut answered) = (0, 0);
        'batches: while start < calls.len() {
            let end = if slots[start].safe {
                start + slots[start..].iter().take_while(|s| s.safe).count()
            } else {
                start + 1
            };
            if end == start + 1 {
                // One call (an unsafe one, or a round of one): run it here, with no stream.
                if let Some(p) = slots[start].take() {
                    // The token checked, the call polled once, and only a call that has to
                    // wait races the token (polled first, as always): a call that is ready at
                    // once registers no waiter on the token.
                    if self.cx.cancel.is_cancelled() {
                        break 'batches;
                    }
                    let mut call = std::pin::pin!(self.finish(&calls[start], p));
                    let out = match futures::poll!(call.as_mut()) {
                        Poll::Ready(out) => out,
                        Poll::Pending => tokio::select! {
                            biased;
                            () = self.cx.cancel.cancelled() => break 'batches,
                            out = &mut call => out,
                        },
                    };
                    slots[start].state = SlotState::Done(out);
                    pace(&mut answered, calls.len()).await;
                }
                start = end;
                continue;
            }
            let batch: Vec<(usize, Prepared)> = (start..end)
                .filter_map(|i| slots[i].take().map(|p| (i, p)))
                .collect();
            let mut running = futures::stream::iter(batch.into_iter().map(|(i, p)| {
                let call = &calls[i];
                async move { (i, self.finish(call, p).await) }
            }))
            .buffer_unordered(self.config.max_concurrency.max(1));
            loop {
                // As above: checked, polled once, and raced against the token only when the
                // calls have to wait.
                if self.cx.cancel.is_cancelled() {
                    break 'batches;
                }
                let next = match futures::poll!(running.next()) {
                    Poll::Ready(next) => next,
                    Poll::Pending => tokio::select! {
                        biased;
                        () = self.cx.cancel.cancelled() => break 'batches,
                        next = running.next() => next,
                    },
                };
                match next {
                    Some((i, out)) => {
                        slots[i].state = SlotState::Done(out);
                        pace(&mut answered, calls.len()).await;
                    }
                    None => break,
                }
            }
            start = end;
        }

        calls
            .iter()
            .zip(slots)
            .map(|(call, slot)| {
                let out = match slot.state {
                    SlotState::Done(out) => out,
                    SlotState::Ready(_) | SlotState::Taken => ToolOutput::error(format!(
                        "tool `{}` was cancelled: the agent was stopped before the call finished",
                        call.name
                    )),
                };
                out.into_result_block(&*call.id)
            })
            .collect()
    }

    /// Looks the tool up, parses and validates the input.
    fn prepare(&self, call: &ToolCall) -> Prepared {
        let Some(at) = self.pool.position(&call.name) else {
            let names = self.pool.names();
            let known = if names.is_empty() {
                "this agent has no tools".to_owned()
            } else {
                format!("available tools: {}", names.join(", "))
            };
            return Prepared::Answered(ToolOutput::error(format!(
                "unknown tool `{}`; {known}",
                call.name
            )));
        };
        let input: serde_json::Value = match call.input.to_value() {
            Ok(v) => v,
            Err(e) => {
                return Prepared::Answered(ToolOutput::error(format!(
                    "invalid input for tool `{}`: {e}",
                    call.name
                )));
            }
        };
        match self.pool.validate_at(at, &call.name, &input) {
            Ok(()) => Prepared::Run(input, at),
            Err(e) => Prepared::Answered(ToolOutput::error(e.to_string())),
        }
    }

    /// Asks the policy, runs the tool (catching panics, enforcing the timeout) and reports.
    async fn finish(&self, call: &ToolCall, prepared: Prepared) -> ToolOutput {
        let started = Instant::now();
        self.emit.emit(EventKind::ToolCallStarted {
            id: call.id.clone(),
            name: call.name.clone(),
        });
        let out = match prepared {
            Prepared::Answered(out) => out,
            Prepared::Run(input, at) => match self.hook_base {
                None => self.permitted(call, input, at, started).await.0,
                // Boxed: only an agent with hooks waits on them, and a round without keeps
                // a small future.
                Some(base) => Box::pin(self.hooked(call, input, at, base, started)).await,
            },
        };
        self.emit.emit(EventKind::ToolCallFinished {
            id: call.id.clone(),
            name: call.name.clone(),
            is_error: out.is_error,
            error: out.is_error.then(|| error_preview(&out)),
            duration: started.elapsed(),
        });
        out
    }

    /// The call between its hooks: `PreToolUse` hooks may block it or rewrite its input
    /// before the policy sees it; `PostToolUse` hooks see what a call that ran answered, and
    /// may add to it.
    async fn hooked(
        &self,
        call: &ToolCall,
        mut input: serde_json::Value,
        at: usize,
        base: &crate::hook::HookInput,
        mut started: Instant,
    ) -> ToolOutput {
        use crate::hook::HookEvent;
        let hook_input = |event: HookEvent, input: &serde_json::Value| {
            let mut i = base.clone();
            i.event = event;
            i.tool_name = Some(call.name.to_string());
            i.tool_use_id = Some(call.id.to_string());
            i.tool_input = Some(input.clone());
            i
        };
        if self.hooks.wants(HookEvent::PreToolUse, Some(&call.name)) {
            let d = self
                .hooks
                .run(hook_input(HookEvent::PreToolUse, &input))
                .await;
            // The hooks may have waited: the tool's time starts after them.
            started = Instant::now();
            for message in d.warnings {
                self.emit.emit(EventKind::Warning { message });
            }
            if let Some(reason) = d.blocked {
                return ToolOutput::error(format!(
                    "a PreToolUse hook blocked `{}`: {reason}",
                    call.name
                ));
            }
            if let Some(rewritten) = d.input {
                if let Err(e) = self.pool.validate_at(at, &call.name, &rewritten) {
                    return ToolOutput::error(format!(
                        "a PreToolUse hook rewrote the input of `{}` into one that does not \
                         match its schema: {e}",
                        call.name
                    ));
                }
                input = rewritten;
            }
        }
        let post = self.hooks.wants(HookEvent::PostToolUse, Some(&call.name));
        let kept = post.then(|| input.clone());
        let (mut out, ran) = self.permitted(call, input, at, started).await;
        if let (true, Some(input)) = (ran, kept) {
            let mut i = hook_input(HookEvent::PostToolUse, &input);
            i.tool_response = Some(serde_json::json!({
                "content": out.text_content(),
                "is_error": out.is_error,
            }));
            let d = self.hooks.run(i).await;
            for message in d.warnings {
                self.emit.emit(EventKind::Warning { message });
            }
            // In the order the hooks ran: context first, the block (which ended the chain)
            // last.
            for text in d.context {
                out.content.push(ContentBlock::text(text));
            }
            if let Some(reason) = d.blocked {
                out.content.push(ContentBlock::text(format!(
                    "A PostToolUse hook says: {reason}"
                )));
            }
        }
        out
    }

    /// Asks the policy and runs the tool (at `at` in the pool); whether it ran. `started` is
    /// when the call began (`finish`), or when its `PreToolUse` hooks answered: the tool's
    /// time starts there when the policy decides without waiting.
    async fn permitted(
        &self,
        call: &ToolCall,
        input: serde_json::Value,
        at: usize,
        started: Instant,
    ) -> (ToolOutput, bool) {
        let tool = self.pool.tool_at(at);
        let request = PermissionRequest {
            tool: tool.as_ref(),
            input: &input,
            agent: &self.cx.agent,
            tool_use_id: &call.id,
        };
        // A decision that needs no waiting first; else the check's future, made inside the
        // guarded block: a hand-written policy that panics before it returns one is caught
        // like one that panics while it runs.
        // (A decision made at once keeps `started`: one clock read fewer per call.)
        let mut started = started;
        let decision =
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.policy.decide_now(&request))) {
                Ok(Some(d)) => Ok(d),
                Ok(None) => {
                    let d = AssertUnwindSafe(async { self.policy.check(request).await })
                        .catch_unwind()
                        .await;
                    started = Instant::now();
                    d
                }
                Err(panic) => Err(panic),
            };
        // What the policy did to the call, for the host to audit (a denial otherwise looks
        // like any failed call).
        let decided = |rewritten: bool, reason: &str| {
            self.emit.emit(EventKind::PermissionDecided {
                id: Arc::clone(&call.id),
                name: Arc::clone(&call.name),
                rewritten,
                reason: reason.to_owned(),
            });
        };
        let decision = match decision {
            Ok(d) => d,
            Err(panic) => {
                let reason = format!(
                    "the permission policy panicked while checking `{}`: {}; the call did not \
                     run",
                    call.name,
                    panic_message(panic.as_ref())
                );
                decided(false, &reason);
                return (ToolOutput::error(reason), false);
            }
        };
        let input = match decision {
            PermissionDecision::Allow => input,
            PermissionDecision::Deny { reason } => {
                decided(false, &reason);
                return (ToolOutput::error(reason), false);
            }
            PermissionDecision::AllowWithInput(rewritten) => {
                if let Err(e) = self.pool.validate_at(at, &call.name, &rewritten) {
                    let problems = match e {
                        crate::Error::InvalidInput { problems, .. } => problems.join("\n"),
                        other => other.to_string(),
                    };
                    let reason = format!(
                        "the permission policy rewrote the input of `{}` into one that does not \
                         match its schema:\n{problems}",
                        call.name
                    );
                    // Not run: as a denial.
                    decided(false, &reason);
                    return (ToolOutput::error(reason), false);
                }
                decided(true, "");
                rewritten
            }
        };
        let mut cx = self.cx.clone();
        cx.tool_use_id = Arc::clone(&call.id);
        // Made inside the guarded block, as the check's: a tool that panics before it returns
        // its future is caught too.
        let run = AssertUnwindSafe(async { tool.call(input, &cx).await }).catch_unwind();
        let limit = tool.timeout().unwrap_or(self.config.timeout);
        // Timed from `started`: the call's start, or when whatever waited before the tool (its
        // hooks, a policy asking a human) answered, so a wait never eats into the tool's limit;
        // between it and the tool only work that does not wait runs (the event, the policy's
        // immediate decision, a rewritten input's check). A limit too far to represent is
        // thirty years.
        let at = started
            .checked_add(limit)
            .unwrap_or_else(|| started + Duration::from_secs(30 * 365 * 86_400));
        let out = match tokio::time::timeout_at(at, run).await {
            Ok(Ok(out)) => out,
            Ok(Err(panic)) => ToolOutput::error(format!(
                "tool `{}` panicked: {}",
                call.name,
                panic_message(panic.as_ref())
            )),
            Err(_) => ToolOutput::error(format!(
                "tool `{}` did not finish within {}; it was stopped",
                call.name,
                crate::base::events::format_duration(limit)
            )),
        };
        (out, true)
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic payload".to_owned()
    }
}

/// The most characters of a failed call's text an event carries.
pub const ERROR_PREVIEW: usize = 500;

/// A failed call's text for its event: whole up to [`ERROR_PREVIEW`] characters, else cut
/// there with `…`.
fn error_preview(out: &ToolOutput) -> String {
    let text = out.text_content();
    match text.char_indices().nth(ERROR_PREVIEW) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
