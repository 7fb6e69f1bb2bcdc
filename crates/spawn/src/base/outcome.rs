//! What a run ends with: [`StopReason`], per-turn records and the [`AgentRun`] summary; and
//! the [`Limits`] that end it early.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use forkhive_core::{CacheSafeParams, Digest, MessageList, TaskStatus, Usage};
use forkhive_transport::ModelStop;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Why an agent's run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model ended its turn without tool calls and nothing else was pending or promised.
    /// An agent built with `AgentBuilder::detach_background(true)` completes at the end of
    /// the model's turn even while background children it started still run (their
    /// notifications arrive in its queue later; `Agent::run_pending` collects them).
    Completed,
    /// The turn limit was reached (a limit, not an error).
    MaxTurns {
        /// The limit.
        limit: u32,
    },
    /// The token budget was used up.
    TokenBudget {
        /// The budget.
        limit: u64,
        /// Tokens used when the run stopped.
        used: u64,
    },
    /// The model hit `max_tokens` in text more often than the continuation limit allows.
    OutputLimit {
        /// How many continuations were sent.
        continuations: u32,
    },
    /// The provider paused the turn (`pause_turn`) again after `max_pause_resends` resends
    /// in a row.
    PauseLimit {
        /// How many resends were made.
        resends: u32,
    },
    /// The model refused.
    Refusal,
    /// The agent (or an ancestor) was cancelled.
    Cancelled,
    /// Its [`Halt`](crate::runtime::Halt) was requested: the run ended at a tool-round
    /// boundary, its tool results in the conversation (a teammate asked to shut down).
    Halted,
    /// A `UserPromptSubmit` hook blocked the prompt: nothing was sent.
    Blocked {
        /// The hook's reason.
        message: String,
    },
    /// The backend failed; the error is in [`AgentRun::error`].
    Failed,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Completed => f.write_str("completed"),
            StopReason::MaxTurns { limit } => write!(f, "stopped at its {limit}-turn limit"),
            StopReason::TokenBudget { limit, used } => {
                write!(f, "used {used} tokens of a {limit}-token budget")
            }
            StopReason::OutputLimit { continuations } => write!(
                f,
                "hit the output limit again after {continuations} continuations"
            ),
            StopReason::PauseLimit { resends } => {
                write!(
                    f,
                    "the provider paused the turn again after {resends} resends"
                )
            }
            StopReason::Refusal => f.write_str("the model refused"),
            StopReason::Cancelled => f.write_str("cancelled"),
            StopReason::Halted => f.write_str("stopped when asked to, at a tool-round boundary"),
            StopReason::Blocked { message } => {
                write!(f, "a UserPromptSubmit hook blocked the prompt: {message}")
            }
            StopReason::Failed => f.write_str("failed"),
        }
    }
}

impl StopReason {
    /// How a child that stopped for this reason ends, in the foreground and the background
    /// alike: one mapping, so the same stop never ends in two states. (A verification run is
    /// stricter: only [`StopReason::Completed`] concludes one.)
    ///
    /// A limit — turns, token budget, output continuations, pause resends — ends the work
    /// early but is not an error ("Chapter 9: Sub-Agents and the Fork Pattern — 9.6 Sub-Agent
    /// Lifecycle Management": `maxTurns` is a budget, and what was done is the result):
    /// `completed`, with the reason in the summary. A refusal or a backend failure is
    /// `failed`; a cancellation is `killed`.
    pub fn task_status(&self) -> TaskStatus {
        match self {
            StopReason::Completed
            | StopReason::MaxTurns { .. }
            | StopReason::TokenBudget { .. }
            | StopReason::OutputLimit { .. }
            | StopReason::PauseLimit { .. }
            | StopReason::Halted => TaskStatus::Completed,
            StopReason::Refusal | StopReason::Failed | StopReason::Blocked { .. } => {
                TaskStatus::Failed
            }
            StopReason::Cancelled => TaskStatus::Killed,
        }
    }
}

/// When a run must stop, and how its tool rounds behave. Build it from
/// [`Limits::default`] with the `with_*` setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Most model turns per [`run`](crate::runtime::Agent::run) (`None`: no limit).
    pub max_turns: Option<u32>,
    /// Most total tokens (input, cache and output) per run (`None`: no limit).
    pub token_budget: Option<u64>,
    /// `max_tokens` of every request.
    pub max_output_tokens: u32,
    /// How often in a row a `max_tokens` stop in text is answered with "continue".
    pub max_continuations: u32,
    /// How often in a row a `pause_turn` is resent.
    pub max_pause_resends: u32,
    /// Concurrency-safe calls running at once in one tool round.
    pub max_concurrent_tools: usize,
    /// How long one tool call may take.
    pub tool_timeout: Duration,
    /// How long a cancelled run waits for its children to end (their notifications, and the
    /// foreground children it was awaiting). A supervisor gives a cancelled child at least
    /// this plus [`TaskConfig::kill_grace`](crate::task::TaskConfig::kill_grace) before it
    /// drops it, so the child's own wait is never cut short.
    pub cancel_grace: Duration,
    /// When a waiting agent wakes on a message while more are promised, how long it waits for
    /// others before starting the turn (zero: start at once).
    pub notification_window: Duration,
}

setters!(Limits {
    with_max_turns => max_turns: Option<u32>,
    with_token_budget => token_budget: Option<u64>,
    with_max_output_tokens => max_output_tokens: u32,
    with_max_continuations => max_continuations: u32,
    with_max_pause_resends => max_pause_resends: u32,
    with_max_concurrent_tools => max_concurrent_tools: usize,
    with_tool_timeout => tool_timeout: Duration,
    with_cancel_grace => cancel_grace: Duration,
    with_notification_window => notification_window: Duration,
});

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_turns: Some(100),
            token_budget: None,
            max_output_tokens: 8192,
            max_continuations: 3,
            max_pause_resends: 5,
            max_concurrent_tools: 10,
            tool_timeout: Duration::from_secs(120),
            cancel_grace: Duration::from_secs(5),
            notification_window: Duration::from_millis(100),
        }
    }
}

/// One model turn of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRecord {
    /// The turn number (1-based, counted over the agent's life).
    pub turn: u32,
    /// The request's cache-safe prefix (an O(1) clone); see [`fingerprint`](Self::fingerprint).
    pub prefix: CacheSafeParams,
    /// This turn's tokens.
    pub usage: Usage,
    /// Why the model stopped (`ModelStop::EndTurn`, `ModelStop::ToolUse`, ...); the
    /// transcript writes its name (`end_turn`, `tool_use`).
    pub stop_reason: Option<ModelStop>,
    /// How many tools it called.
    pub tool_calls: usize,
    /// When its request was sent, in milliseconds since the Unix epoch.
    pub sent_at_ms: u64,
}

impl TurnRecord {
    /// The digest of the request's cache-safe prefix, computed on first use (and kept by the
    /// prefix, so asking again is O(1)).
    pub fn fingerprint(&self) -> Digest {
        self.prefix.fingerprint().total()
    }
}

/// The result of [`Agent::run`](crate::runtime::Agent::run).
#[derive(Debug, Clone)]
#[must_use = "an AgentRun says why the agent stopped; check `stop` or call `into_result`"]
pub struct AgentRun {
    /// Why it stopped.
    pub stop: StopReason,
    /// The text of the last assistant message (the agent's answer; partial when it stopped
    /// early).
    pub final_text: String,
    /// Every model turn of this run, in order.
    pub turns: Vec<TurnRecord>,
    /// The total usage of this run's own requests. Its children's is not in it: each child's
    /// is in [`children`](Self::children), and the whole tree's in the task registry
    /// (`TaskRegistry::descendants_usage`).
    pub usage: Usage,
    /// The backend error, when `stop` is [`StopReason::Failed`].
    pub error: Option<Arc<Error>>,
    /// The messages this run added to the conversation, shared with it (not copies).
    pub new_messages: MessageList,
    /// The children this run started, in start order (see [`AgentRun::children`]).
    pub children: Vec<crate::base::children::ChildReport>,
}

impl AgentRun {
    /// `Ok(self)`, or the error when the run failed.
    pub fn into_result(self) -> Result<Self, Arc<Error>> {
        match self.error.clone() {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }

    /// The children this run reports, in start order: id, agent type, status, usage and
    /// cache figures. Those are the children started since the last run that returned — by
    /// this run, or by one that was dropped before it returned — after those that earlier runs
    /// reported still running and that have ended since.
    ///
    /// A run that completes waits for its background children (a teammate waiting for work
    /// excepted: it runs on, idle), so each it started has ended by then. A run that stops
    /// early — at a limit (`MaxTurns`, `TokenBudget`…), failed, cancelled — or whose agent
    /// was built with `detach_background(true)` may return with children still running:
    /// they are reported with `status: None` and a usage of zero, and the next run of the
    /// agent that returns after each has ended (`run_pending`, for one) reports it again
    /// with its end. Each child's status and usage are in exactly one report, so summing
    /// `usage` over every run's children counts each child once. A child resumed by
    /// `SendMessage` is reported once per run of its own, each with that run's usage. (A
    /// child whose agent never returns from a run again is in the task registry.)
    pub fn children(&self) -> &[crate::base::children::ChildReport] {
        &self.children
    }

    /// How many tool calls the run made.
    pub fn tool_calls(&self) -> usize {
        self.turns.iter().map(|t| t.tool_calls).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One mapping for every path: a limit completes, a refusal or failure fails, a cancel
    /// kills — whichever way the child ran.
    #[test]
    fn every_stop_reason_ends_in_one_status() {
        use forkhive_core::TaskStatus::{Completed, Failed, Killed};
        let rows = [
            (StopReason::Completed, Completed),
            (StopReason::MaxTurns { limit: 3 }, Completed),
            (
                StopReason::TokenBudget {
                    limit: 10,
                    used: 12,
                },
                Completed,
            ),
            (StopReason::OutputLimit { continuations: 3 }, Completed),
            (StopReason::PauseLimit { resends: 5 }, Completed),
            (StopReason::Refusal, Failed),
            (StopReason::Failed, Failed),
            (StopReason::Cancelled, Killed),
            (StopReason::Halted, Completed),
            (
                StopReason::Blocked {
                    message: "no".into(),
                },
                Failed,
            ),
        ];
        for (stop, want) in rows {
            assert_eq!(stop.task_status(), want, "{stop}");
        }
    }

    /// A halt is something the agent was asked for (a teammate's approved shutdown, the
    /// host's `halt`): its summary says so, not how the loop implements it.
    #[test]
    fn a_halt_reads_as_a_stop_that_was_asked_for() {
        assert_eq!(
            StopReason::Halted.to_string(),
            "stopped when asked to, at a tool-round boundary"
        );
    }
}
