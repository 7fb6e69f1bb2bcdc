//! [`AgentEvent`]s: what a host sees of a running agent, as it happens.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use forkhive_core::{CacheBreak, CacheSafeParams, TaskId, TaskStatus, Usage};
use forkhive_transport::ModelStop;

use crate::base::outcome::StopReason;

/// One thing that happened in one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEvent {
    /// The agent it happened in.
    pub agent: TaskId,
    /// The turn (1-based; 0 before the first turn).
    pub turn: u32,
    /// What happened.
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// A model turn begins.
    TurnStarted,
    /// A request went to the backend.
    RequestSent {
        /// Its cache-safe prefix (an O(1) clone). `prefix.fingerprint()` is computed on first
        /// use, so an agent whose events nobody fingerprints hashes nothing per turn.
        prefix: CacheSafeParams,
        /// How many messages the request holds: the prefix and, on a fork child's first
        /// request, its suffix.
        messages: usize,
        /// The id of the request that spawned this agent, on its first request only.
        invoking_request_id: Option<String>,
    },
    /// The new request's prefix is not an append of the previous one: the prompt cache
    /// breaks at the named place.
    CacheBreak {
        /// The first difference, in render order (`tools[3] changed`).
        at: CacheBreak,
    },
    /// Text the model is streaming.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// The model's answer is complete.
    ResponseReceived {
        /// This answer's tokens.
        usage: Usage,
        /// Why the model stopped, if the provider said.
        stop_reason: Option<ModelStop>,
    },
    /// A tool call starts — or is about to be answered without running (an unknown tool, an
    /// input that fails the schema), in which case its `ToolCallFinished` says `is_error`.
    ToolCallStarted {
        /// The `tool_use` id (shared with the call: cloning it copies a pointer).
        id: Arc<str>,
        /// The tool.
        name: Arc<str>,
    },
    /// The permission policy did not let a call run as the model wrote it: it denied it
    /// (`rewritten: false`, `reason` its reason — the policy's panic, or a rewrite that failed
    /// the tool's schema, included) or rewrote its input (`rewritten: true`, `reason` empty).
    /// A call the policy allows as written has no such event. (A denied call's
    /// `ToolCallFinished` says `is_error` with the same reason, and is its headline.)
    PermissionDecided {
        /// The `tool_use` id.
        id: Arc<str>,
        /// The tool.
        name: Arc<str>,
        /// Whether the call ran, with a rewritten input.
        rewritten: bool,
        /// Why it was denied (empty for a rewrite).
        reason: String,
    },
    /// A tool call finished.
    ToolCallFinished {
        /// The `tool_use` id.
        id: Arc<str>,
        /// The tool.
        name: Arc<str>,
        /// Whether its result is an error.
        is_error: bool,
        /// When it failed: what its result says (up to 500 characters, then `…`), so a host
        /// sees why without reading the conversation.
        error: Option<String>,
        /// How long it took.
        duration: Duration,
    },
    /// The agent started a child (emitted by the parent, before the child's first event).
    ChildStarted {
        /// The child's task id (its events carry it as `agent`).
        task: TaskId,
        /// Its agent type (`fork` for a fork).
        agent_type: String,
        /// The `description` it was started with.
        description: String,
        /// Whether it runs in the background (its answer comes as a notification).
        background: bool,
        /// Whether this is an ended child resumed for another run (by a message), not a new
        /// one: same task id, a new notification.
        resumed: bool,
    },
    /// Pending messages were added to the conversation.
    MessagesInjected {
        /// How many.
        count: usize,
    },
    /// This background child's `<task-notification>` is being queued for its parent, which
    /// will read it at the start of its next turn: emitted once per child, after `Stopped` and
    /// just before the parent can read it, so a host sees notifications as they arrive — always
    /// before the parent's run that reads one returns.
    Notified {
        /// The parent the notification went to.
        parent: TaskId,
        /// The status it carries.
        status: TaskStatus,
        /// Its one-line summary.
        summary: String,
    },
    /// This background or foreground child has had no event of its own for `quiet_for` (at
    /// least `TaskConfig::stall_after`): the task registry has been asked to mark it stalled
    /// (`TaskRecord::stalled`), and it runs on until its deadline (`TaskService::cancel`
    /// stops it sooner). Emitted at most once per run of the child (a child resumed by a
    /// message is watched afresh), to the sink that heard its `ChildStarted`, with the child
    /// as `agent`. A child waiting on its own children, or on a permission a person must
    /// give, makes no events either: read the tree before you stop it.
    Stalled {
        /// How long it has been quiet.
        quiet_for: Duration,
    },
    /// Something the host should know but that stops nothing (also logged with `tracing`):
    /// for example, a tool the agent's definition names that this agent will not have.
    Warning {
        /// What is wrong, and where.
        message: String,
    },
    /// The agent stopped.
    Stopped {
        /// Why.
        reason: StopReason,
        /// Its total usage.
        usage: Usage,
    },
}

impl AgentEvent {
    /// One line for the events a person watching a run wants to see — a child started, a
    /// notification arrived, a tool call failed, a warning, a cache break, the agent stopped —
    /// and `None` for the rest (deltas, requests, turns). Each line starts with the agent's id.
    ///
    /// It is one line whatever the model or a tool wrote into it (a tool's name, an error, a
    /// child's description): line breaks, other control characters and the bidirectional
    /// overrides that reorder a terminal's text are written escaped (`\n`, `\u{1b}`), so a
    /// worker cannot forge a line of the host's log or clear its terminal.
    ///
    /// ```
    /// use forkhive_spawn::runtime::{AgentEvent, EventKind};
    /// use forkhive_core::{TaskId, TaskKind};
    /// let agent = TaskId::generate(TaskKind::Agent);
    /// let warning = AgentEvent { agent, turn: 1, kind: EventKind::Warning { message: "hm".into() } };
    /// assert_eq!(warning.headline(), Some(format!("{agent}: warning: hm")));
    /// let turn = AgentEvent { agent, turn: 1, kind: EventKind::TurnStarted };
    /// assert_eq!(turn.headline(), None);
    /// ```
    pub fn headline(&self) -> Option<String> {
        let what = match &self.kind {
            EventKind::ChildStarted {
                task,
                agent_type,
                description,
                background,
                resumed,
            } => {
                let mode = if *background {
                    "background"
                } else {
                    "foreground"
                };
                let verb = if *resumed { "resumed" } else { "started" };
                format!("{verb} {agent_type} {task} ({mode}): {description}")
            }
            EventKind::Notified {
                status, summary, ..
            } => format!("notified, {status}: {summary}"),
            EventKind::ToolCallFinished {
                name,
                error: Some(error),
                ..
            } => format!("{name} failed: {error}"),
            EventKind::Warning { message } => format!("warning: {message}"),
            EventKind::Stalled { quiet_for } => {
                format!("stalled: no event for {}", format_duration(*quiet_for))
            }
            EventKind::CacheBreak { at } => format!("prompt cache break: {at}"),
            EventKind::Stopped { reason, usage } => {
                format!("stopped, {reason}, {} tokens", usage.total_tokens())
            }
            _ => return None,
        };
        Some(format!("{}: {}", self.agent, one_line(&what)))
    }
}

/// `text` with line breaks, other control characters and bidirectional formatting characters
/// escaped (`\n`, `\u{1b}`, `\u{202e}`): safe to print as one line of a log or a terminal.
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
            )
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Receives events. Implementations must not block: they are called from the agent's task.
pub trait EventSink: Send + Sync + fmt::Debug + 'static {
    /// Takes one event.
    fn emit(&self, event: AgentEvent);
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<AgentEvent> {
    fn emit(&self, event: AgentEvent) {
        // A host that dropped its receiver no longer wants events.
        let _ = self.send(event);
    }
}

impl EventSink for tokio::sync::broadcast::Sender<AgentEvent> {
    fn emit(&self, event: AgentEvent) {
        let _ = self.send(event);
    }
}

/// An [`EventSink`] calling a function, which takes each event by value:
/// `FnSink(|e: AgentEvent| println!("{:?}", e.kind))`.
pub struct FnSink<F>(pub F);

impl<F: Fn(AgentEvent) + Send + Sync + 'static> EventSink for FnSink<F> {
    fn emit(&self, event: AgentEvent) {
        (self.0)(event);
    }
}

impl<F> fmt::Debug for FnSink<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnSink")
    }
}

/// Stamps events with the agent id and current turn, and sends them to the sink (if any).
#[derive(Debug, Clone)]
pub(crate) struct Emitter {
    agent: TaskId,
    turn: Arc<AtomicU32>,
    sink: Option<Arc<dyn EventSink>>,
}

impl Emitter {
    pub(crate) fn new(agent: TaskId, sink: Option<Arc<dyn EventSink>>) -> Self {
        Self {
            agent,
            turn: Arc::new(AtomicU32::new(0)),
            sink,
        }
    }

    pub(crate) fn set_turn(&self, turn: u32) {
        self.turn.store(turn, Ordering::Release);
    }

    pub(crate) fn emit(&self, kind: EventKind) {
        if let Some(sink) = &self.sink {
            sink.emit(AgentEvent {
                agent: self.agent,
                turn: self.turn.load(Ordering::Acquire),
                kind,
            });
        }
    }
}

/// `1.5s`, `250ms`, `2m`: short and exact enough for messages.
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        format!("{}µs", d.as_micros())
    } else if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A headline is one line: what a worker wrote into it (a tool name with a line break and
    /// a terminal escape, a right-to-left override) is escaped, not printed.
    #[test]
    fn a_headline_is_one_line_whatever_the_model_wrote() {
        let agent = TaskId::generate(forkhive_core::TaskKind::Agent);
        let e = AgentEvent {
            agent,
            turn: 1,
            kind: EventKind::ToolCallFinished {
                id: Arc::from("t1"),
                name: Arc::from("no\nsuch: stopped, completed, 1 tokens\u{1b}[2J"),
                is_error: true,
                error: Some("bad\u{202e}txt.exe\r".to_owned()),
                duration: std::time::Duration::ZERO,
            },
        };
        assert_eq!(
            e.headline().unwrap(),
            format!(
                "{agent}: no\\nsuch: stopped, completed, 1 tokens\\u{{1b}}[2J failed: \
                 bad\\u{{202e}}txt.exe\\r"
            )
        );
        assert_eq!(one_line("plain — text"), "plain — text");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_micros(5)), "5µs");
    }
}
