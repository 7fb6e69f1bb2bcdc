//! Hooks: callbacks at the lifecycle events Claude Code users know — before a tool runs
//! (`PreToolUse`), after it ran (`PostToolUse`), a prompt submitted (`UserPromptSubmit`), an
//! agent stopping (`Stop`), a subagent starting and stopping (`SubagentStart`,
//! `SubagentStop`). A hook may let things go on, block them with a reason the model sees,
//! rewrite a tool's input, or add context.
//!
//! Two kinds: in-process [`Hook`]s a host writes, and [`CommandHook`]s — shell commands with
//! Claude Code's protocol (the event as JSON on standard input; exit 0 goes on and may print a
//! JSON decision; exit 2 blocks, standard error fed back to the model; any other exit is a
//! logged error that does not block), each with a timeout. A definition's `hooks` frontmatter
//! and a host's settings use the same format ([`Hooks::from_settings`]).
//!
//! [`Hooks`] composes them in order: the host's first, then the definition's; the first block
//! wins and ends the chain; a rewrite is what the hooks after it and the call see; context is
//! gathered in order. A hook that hangs, crashes or prints garbage is a warning the host sees
//! (an `EventKind::Warning`), never a hung agent.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::error::{Error, Result};

/// A lifecycle event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HookEvent {
    /// Before a tool call runs (after its input was validated): block it, or rewrite its input.
    PreToolUse,
    /// After a tool call ran: add to what the model sees of it.
    PostToolUse,
    /// A prompt is about to be sent to the model (`Agent::run`): block it, or add context.
    UserPromptSubmit,
    /// The main agent is about to end its run: block, and it goes on with the reason.
    Stop,
    /// A subagent begins its first run: add context to it.
    SubagentStart,
    /// A subagent is about to end its run: block, and it goes on with the reason.
    SubagentStop,
}

impl HookEvent {
    /// Every event, in the order above.
    pub const ALL: [HookEvent; 6] = [
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::UserPromptSubmit,
        HookEvent::Stop,
        HookEvent::SubagentStart,
        HookEvent::SubagentStop,
    ];

    /// Claude Code's name of the event (`PreToolUse`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::Stop => "Stop",
            HookEvent::SubagentStart => "SubagentStart",
            HookEvent::SubagentStop => "SubagentStop",
        }
    }

    /// The event named `name`, if it is one of these.
    pub fn from_name(name: &str) -> Option<HookEvent> {
        HookEvent::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

impl fmt::Display for HookEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a hook is told: Claude Code's hook input, as [`to_json`](Self::to_json) writes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HookInput {
    /// The event.
    pub event: HookEvent,
    /// The root agent's id (Claude Code's `session_id`).
    pub session_id: String,
    /// The agent the event is about.
    pub agent_id: String,
    /// Its agent type (`SubagentStart`/`SubagentStop` match on it).
    pub agent_type: Option<String>,
    /// Its transcript, if it keeps one.
    pub transcript_path: Option<PathBuf>,
    /// The tool (tool events; matched on).
    pub tool_name: Option<String>,
    /// The tool call's id.
    pub tool_use_id: Option<String>,
    /// The tool call's input (rewritten by the hooks before, if any did).
    pub tool_input: Option<Value>,
    /// What the tool answered (`PostToolUse`): `{"content": text, "is_error": bool}`.
    pub tool_response: Option<Value>,
    /// The prompt (`UserPromptSubmit`).
    pub prompt: Option<String>,
    /// Whether the agent goes on because a stop hook blocked it before (`Stop`,
    /// `SubagentStop`): a hook checks it not to block forever.
    pub stop_hook_active: bool,
    /// The agent's last answer (`Stop`, `SubagentStop`).
    pub last_assistant_message: Option<String>,
}

impl HookInput {
    /// An input for `event` about agent `agent_id` of the tree rooted at `session_id`.
    pub fn new(
        event: HookEvent,
        session_id: impl Into<String>,
        agent_id: impl Into<String>,
    ) -> Self {
        Self {
            event,
            session_id: session_id.into(),
            agent_id: agent_id.into(),
            agent_type: None,
            transcript_path: None,
            tool_name: None,
            tool_use_id: None,
            tool_input: None,
            tool_response: None,
            prompt: None,
            stop_hook_active: false,
            last_assistant_message: None,
        }
    }

    /// What a matcher is compared with: the tool's name for tool events, the agent type for
    /// subagent events, nothing for the others (every matcher matches).
    pub fn subject(&self) -> Option<&str> {
        match self.event {
            HookEvent::PreToolUse | HookEvent::PostToolUse => self.tool_name.as_deref(),
            HookEvent::SubagentStart | HookEvent::SubagentStop => self.agent_type.as_deref(),
            _ => None,
        }
    }

    /// The JSON a command hook reads on standard input (Claude Code's keys; absent fields
    /// left out).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "hook_event_name": self.event.as_str(),
            "session_id": self.session_id,
            "agent_id": self.agent_id,
        });
        let o = v.as_object_mut();
        let Some(o) = o else { return v };
        let mut put = |k: &str, val: Option<Value>| {
            if let Some(val) = val {
                o.insert(k.to_owned(), val);
            }
        };
        put("agent_type", self.agent_type.clone().map(Value::String));
        put(
            "transcript_path",
            self.transcript_path
                .as_ref()
                .map(|p| Value::String(p.display().to_string())),
        );
        put(
            "cwd",
            std::env::current_dir()
                .ok()
                .map(|p| Value::String(p.display().to_string())),
        );
        put("tool_name", self.tool_name.clone().map(Value::String));
        put("tool_use_id", self.tool_use_id.clone().map(Value::String));
        put("tool_input", self.tool_input.clone());
        put("tool_response", self.tool_response.clone());
        put("prompt", self.prompt.clone().map(Value::String));
        if matches!(self.event, HookEvent::Stop | HookEvent::SubagentStop) {
            put("stop_hook_active", Some(Value::Bool(self.stop_hook_active)));
            put(
                "last_assistant_message",
                self.last_assistant_message.clone().map(Value::String),
            );
        }
        v
    }
}

/// What one hook decided.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum HookOutcome {
    /// Go on.
    Continue,
    /// Go on, and give the model this text as well (`UserPromptSubmit`, `SubagentStart`,
    /// `PostToolUse`).
    Context(String),
    /// Do not: a tool call does not run (the model gets the reason as its result), a prompt
    /// is not sent (the run ends, `StopReason::Blocked`), a stopping agent goes on with the
    /// reason as its next message, a tool's result gets the reason added.
    Block {
        /// Why, for the model.
        reason: String,
    },
    /// `PreToolUse`: run the call with this input instead (checked against the tool's schema).
    Rewrite {
        /// The new input.
        input: Value,
    },
    /// Go on; something was wrong with the hook itself (it hung, crashed, printed garbage),
    /// which the host is told as a warning.
    Failed {
        /// What went wrong, naming the hook.
        warning: String,
    },
}

/// An in-process hook. Object-safe.
#[async_trait]
pub trait Hook: Send + Sync + fmt::Debug + 'static {
    /// Whether it runs for `event` on `subject` (a tool name, an agent type; `None` for
    /// events without one).
    fn matches(&self, event: HookEvent, subject: Option<&str>) -> bool;

    /// Runs it.
    async fn run(&self, input: &HookInput) -> HookOutcome;
}

/// What the hooks of one event decided together.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Decision {
    /// The first block's reason, if one blocked.
    pub blocked: Option<String>,
    /// The input as the hooks left it, if one rewrote it.
    pub input: Option<Value>,
    /// Context to add, in order.
    pub context: Vec<String>,
    /// Hooks that failed (hung, crashed, printed garbage), in order.
    pub warnings: Vec<String>,
}

/// Hooks in order. Cheap to clone; none costs no allocation (every agent has a set).
#[derive(Debug, Clone, Default)]
pub struct Hooks(Option<Arc<[Arc<dyn Hook>]>>);

impl Hooks {
    /// No hooks.
    pub fn new() -> Self {
        Self::default()
    }

    /// These hooks, in order.
    pub fn of(hooks: impl IntoIterator<Item = Arc<dyn Hook>>) -> Self {
        let hooks: Arc<[Arc<dyn Hook>]> = hooks.into_iter().collect();
        Self((!hooks.is_empty()).then_some(hooks))
    }

    fn list(&self) -> &[Arc<dyn Hook>] {
        self.0.as_deref().unwrap_or_default()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list().is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// These hooks, then `more`'s.
    pub fn then(&self, more: &Hooks) -> Hooks {
        if more.is_empty() {
            return self.clone();
        }
        if self.is_empty() {
            return more.clone();
        }
        Hooks::of(self.list().iter().chain(more.list()).cloned())
    }

    /// Whether any hook runs for `event` on `subject` (callers skip building an input when
    /// none does).
    pub fn wants(&self, event: HookEvent, subject: Option<&str>) -> bool {
        self.list().iter().any(|h| h.matches(event, subject))
    }

    /// Runs the hooks that match `input`, in order: the first block ends the chain; a rewrite
    /// is the input of the hooks after it.
    pub async fn run(&self, mut input: HookInput) -> Decision {
        let mut d = Decision::default();
        for hook in self.list() {
            if !hook.matches(input.event, input.subject()) {
                continue;
            }
            match hook.run(&input).await {
                HookOutcome::Continue => {}
                HookOutcome::Context(text) => match input.event {
                    HookEvent::UserPromptSubmit
                    | HookEvent::SubagentStart
                    | HookEvent::PostToolUse => d.context.push(text),
                    // Nothing reads it there: said, not dropped in silence.
                    event => {
                        let warning = format!(
                            "{hook:?} gave context (`additionalContext`) in a {event} hook, \
                             where nothing reads it (only UserPromptSubmit, SubagentStart and \
                             PostToolUse hooks add context); it was ignored"
                        );
                        tracing::warn!("{warning}");
                        d.warnings.push(warning);
                    }
                },
                HookOutcome::Block { reason } => {
                    d.blocked = Some(reason);
                    break;
                }
                HookOutcome::Rewrite { input: new } => {
                    if input.event == HookEvent::PreToolUse {
                        input.tool_input = Some(new.clone());
                        d.input = Some(new);
                    } else {
                        d.warnings.push(format!(
                            "{hook:?} rewrote a tool input in a {} hook; only PreToolUse \
                             hooks may",
                            input.event
                        ));
                    }
                }
                HookOutcome::Failed { warning } => {
                    tracing::warn!("{warning}");
                    d.warnings.push(warning);
                }
            }
        }
        d
    }

    /// The command hooks of a settings `hooks` object or a definition's `hooks` frontmatter, in
    /// Claude Code's format: `{"PreToolUse": [{"matcher": "Bash", "hooks": [{"type":
    /// "command", "command": "…", "timeout": 30}]}], …}`. What cannot be used — an unknown
    /// event, a hook type other than `command`, a matcher that is not a valid pattern — is
    /// left out and said in the warnings (`where` names the source); a value that is not
    /// that shape at all is an error.
    pub fn from_settings(value: &Value, source: &str) -> Result<(Hooks, Vec<String>)> {
        Self::read_settings(value, source, false)
    }

    /// [`from_settings`](Self::from_settings) for a subagent's definition: its `Stop` hooks
    /// run when it stops, as `SubagentStop` (as Claude Code converts them).
    pub fn from_subagent_definition(value: &Value, source: &str) -> Result<(Hooks, Vec<String>)> {
        Self::read_settings(value, source, true)
    }

    fn read_settings(value: &Value, source: &str, subagent: bool) -> Result<(Hooks, Vec<String>)> {
        let bad = |why: String| Error::Hook(format!("hooks of {source}: {why}"));
        let Some(mut events) = value.as_object() else {
            return Err(bad("expected an object of events".to_owned()));
        };
        // A whole settings file: its `hooks`.
        if let Some(inner) = events.get("hooks").and_then(Value::as_object)
            && !events.keys().any(|k| HookEvent::from_name(k).is_some())
        {
            events = inner;
        }
        let mut hooks: Vec<Arc<dyn Hook>> = Vec::new();
        let mut warnings = Vec::new();
        for (name, groups) in events {
            let event = match HookEvent::from_name(name) {
                Some(HookEvent::Stop) if subagent => Some(HookEvent::SubagentStop),
                e => e,
            };
            let Some(event) = event else {
                warnings.push(format!(
                    "hooks of {source}: `{name}` is not an event this host runs hooks for \
                     (it runs {}); left out",
                    HookEvent::ALL.map(HookEvent::as_str).join(", ")
                ));
                continue;
            };
            let Some(groups) = groups.as_array() else {
                return Err(bad(format!("`{name}` is not a list of matcher groups")));
            };
            for group in groups {
                let matcher = group.get("matcher").and_then(Value::as_str).unwrap_or("");
                let Some(list) = group.get("hooks").and_then(Value::as_array) else {
                    return Err(bad(format!("a `{name}` group has no `hooks` list")));
                };
                for h in list {
                    let kind = h.get("type").and_then(Value::as_str).unwrap_or("command");
                    if kind != "command" {
                        warnings.push(format!(
                            "hooks of {source}: a `{name}` hook of type `{kind}` is not \
                             supported here (only `command`); left out"
                        ));
                        continue;
                    }
                    let Some(command) = h.get("command").and_then(Value::as_str) else {
                        return Err(bad(format!("a `{name}` command hook has no `command`")));
                    };
                    let mut hook = match CommandHook::new(event, matcher, command) {
                        Ok(hook) => hook,
                        Err(e) => {
                            let why = match e {
                                Error::Hook(why) => why,
                                other => other.to_string(),
                            };
                            warnings.push(format!("hooks of {source}: {why}; left out"));
                            continue;
                        }
                    };
                    match h.get("timeout") {
                        None => {}
                        Some(t) => match t.as_f64() {
                            Some(secs) if secs > 0.0 && secs <= 86_400.0 => {
                                hook = hook.with_timeout(Duration::from_secs_f64(secs));
                            }
                            Some(secs) if secs > 86_400.0 => {
                                hook = hook.with_timeout(Duration::from_secs(86_400));
                                warnings.push(format!(
                                    "hooks of {source}: a `{name}` hook's `timeout` is {t} \
                                     seconds, more than a day; it is held to 86400s"
                                ));
                            }
                            // `"30"`, `0`, `-1`, `null`: the author meant some limit, and
                            // would otherwise get the default without a word.
                            _ => warnings.push(format!(
                                "hooks of {source}: a `{name}` hook's `timeout` is {t}, which \
                                 is not a number of seconds above 0; it gets the default {}s",
                                COMMAND_TIMEOUT.as_secs()
                            )),
                        },
                    }
                    hooks.push(Arc::new(hook));
                }
            }
        }
        Ok((Hooks::of(hooks), warnings))
    }
}

/// A matcher: every subject (empty or `*`), or a pattern the whole subject must match
/// (`Write`, `Edit|Write`, `mcp__.*`), as Claude Code reads them.
#[derive(Clone)]
struct Matcher {
    source: String,
    pattern: Option<regex::Regex>,
}

impl Matcher {
    fn new(source: &str) -> Result<Self> {
        let pattern = match source.trim() {
            "" | "*" => None,
            p => Some(regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                // The parser's last line says what is wrong (the lines before draw the spot).
                let text = e.to_string();
                let why = text.lines().last().unwrap_or_default();
                Error::Hook(format!(
                    "matcher `{source}` is not a valid pattern: {}",
                    why.trim_start_matches("error: ")
                ))
            })?),
        };
        Ok(Self {
            source: source.to_owned(),
            pattern,
        })
    }

    fn matches(&self, subject: Option<&str>) -> bool {
        match (&self.pattern, subject) {
            (None, _) => true,
            (Some(p), Some(s)) => p.is_match(s),
            // A pattern on an event without a subject: Claude Code ignores the matcher.
            (Some(_), None) => true,
        }
    }
}

/// How many times in a row `Stop` (or `SubagentStop`) hooks may send an agent on before its
/// run ends anyway, with a warning.
pub const MAX_STOP_BLOCKS: u32 = 8;

/// How long a command hook may run unless it says otherwise (Claude Code's default).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of a command hook's standard output or error that is read.
const OUTPUT_CAP: usize = 64 * 1024;

/// A shell command run at an event, with Claude Code's protocol:
///
/// - the event's [`HookInput::to_json`] on standard input;
/// - exit 0: go on; standard output that is a JSON object may decide — `"decision":
///   "block"` with `"reason"`, `"continue": false` with `"stopReason"`, or
///   `"hookSpecificOutput"` with `"permissionDecision": "deny"` and
///   `"permissionDecisionReason"`, `"updatedInput"` (a rewrite) or `"additionalContext"`;
///   plain text is context for `UserPromptSubmit` and `SubagentStart`, and ignored otherwise;
/// - exit 2: block, with standard error as the reason;
/// - any other exit, a signal, a timeout, output that starts like JSON but is not: a warning,
///   and the agent goes on.
///
/// Run with `sh -c` (`cmd /C` on Windows) in the process's working directory, killed when it
/// passes its timeout or the agent stops waiting for it.
#[derive(Clone)]
pub struct CommandHook {
    event: HookEvent,
    matcher: Matcher,
    command: String,
    timeout: Duration,
}

impl fmt::Debug for CommandHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} hook `{}` (matcher `{}`)",
            self.event, self.command, self.matcher.source
        )
    }
}

impl CommandHook {
    /// `command` at `event` for subjects `matcher` matches (empty or `*`: all). An invalid
    /// pattern is an error.
    pub fn new(event: HookEvent, matcher: &str, command: impl Into<String>) -> Result<Self> {
        Ok(Self {
            event,
            matcher: Matcher::new(matcher)?,
            command: command.into(),
            timeout: COMMAND_TIMEOUT,
        })
    }

    /// With a timeout other than [`COMMAND_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn shell(&self) -> tokio::process::Command {
        #[cfg(windows)]
        let mut c = {
            let mut c = tokio::process::Command::new("cmd");
            c.arg("/C").arg(&self.command);
            c
        };
        #[cfg(not(windows))]
        let mut c = {
            let mut c = tokio::process::Command::new("sh");
            c.arg("-c").arg(&self.command);
            // A group of its own: what the command starts is stopped with it.
            c.process_group(0);
            c
        };
        // Claude Code's hooks find the project through `$CLAUDE_PROJECT_DIR` (its hooks
        // reference): the host's own value when it set one, else the directory the agent
        // runs in (the `cwd` of the hook's input).
        if std::env::var_os("CLAUDE_PROJECT_DIR").is_none()
            && let Ok(dir) = std::env::current_dir()
        {
            c.env("CLAUDE_PROJECT_DIR", dir);
        }
        c
    }

    /// Reads a decision from what the command printed after exiting 0.
    fn decide(&self, event: HookEvent, stdout: &str) -> HookOutcome {
        let out = stdout.trim();
        if !out.starts_with('{') {
            return match event {
                HookEvent::UserPromptSubmit | HookEvent::SubagentStart if !out.is_empty() => {
                    HookOutcome::Context(out.to_owned())
                }
                _ => HookOutcome::Continue,
            };
        }
        let v: Value = match serde_json::from_str(out) {
            Ok(v) => v,
            Err(e) => {
                return HookOutcome::Failed {
                    warning: format!(
                        "{self:?} printed output that is not valid JSON ({e}); it was ignored"
                    ),
                };
            }
        };
        let text = |k: &str, o: &Value| o.get(k).and_then(Value::as_str).map(str::to_owned);
        if v.get("continue").and_then(Value::as_bool) == Some(false) {
            // For a stopping agent, "do not continue" is to let it stop.
            if matches!(event, HookEvent::Stop | HookEvent::SubagentStop) {
                return HookOutcome::Continue;
            }
            return HookOutcome::Block {
                reason: text("stopReason", &v).unwrap_or_else(|| format!("stopped by {self:?}")),
            };
        }
        let specific = v.get("hookSpecificOutput").cloned().unwrap_or(Value::Null);
        let decision = specific.get("permissionDecision");
        // `"DENY"`, `"Deny"`, `true`: a deny mistyped would let the call run with no word.
        // Claude Code reads only the three words; so does this, and says so — after what
        // else the output decides (a `"decision": "block"` beside it still blocks).
        let mistyped = match decision.and_then(Value::as_str) {
            Some("deny") => {
                return HookOutcome::Block {
                    reason: text("permissionDecisionReason", &specific)
                        .unwrap_or_else(|| format!("denied by {self:?}")),
                };
            }
            Some("allow" | "ask") | None if decision.is_none_or(Value::is_string) => None,
            _ => Some(format!(
                "{self:?} gave `permissionDecision` {}, which is not `deny`, `allow` or `ask` \
                 (the words are matched exactly); it was ignored",
                decision.map(Value::to_string).unwrap_or_default()
            )),
        };
        if text("decision", &v).as_deref() == Some("block") {
            return HookOutcome::Block {
                reason: text("reason", &v).unwrap_or_else(|| format!("blocked by {self:?}")),
            };
        }
        // A garbled decision makes the rest of the output suspect: nothing of it is applied
        // (no rewrite, no context), and the host is told.
        if let Some(warning) = mistyped {
            return HookOutcome::Failed {
                warning: format!("{warning}, with the rest of its output, and the call went on"),
            };
        }
        let context = text("additionalContext", &specific).filter(|c| !c.is_empty());
        match specific
            .get("updatedInput")
            .filter(|input| input.is_object())
        {
            Some(input) => {
                if context.is_some() {
                    // One outcome reaches the agent: the dropped context goes to the log.
                    tracing::warn!(
                        "{self:?}: `additionalContext` beside `updatedInput` was ignored (the \
                         input was rewritten; a PreToolUse hook adds no context)"
                    );
                }
                HookOutcome::Rewrite {
                    input: input.clone(),
                }
            }
            None => match context {
                Some(c) => HookOutcome::Context(c),
                None => HookOutcome::Continue,
            },
        }
    }
}

/// Kills a command's process group when dropped (the shell and whatever it started; the
/// group may be gone already).
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self
            .0
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Reads at most [`OUTPUT_CAP`] bytes of `r` (and drains the rest, so the child never blocks
/// on a full pipe).
async fn read_capped(r: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    use tokio::io::AsyncReadExt as _;
    let Some(mut r) = r else {
        return String::new();
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[async_trait]
impl Hook for CommandHook {
    fn matches(&self, event: HookEvent, subject: Option<&str>) -> bool {
        event == self.event && self.matcher.matches(subject)
    }

    async fn run(&self, input: &HookInput) -> HookOutcome {
        let mut cmd = self.shell();
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return HookOutcome::Failed {
                    warning: format!("{self:?} could not be started: {e}; the agent went on"),
                };
            }
        };
        // The one owner of the command's processes: however this call ends — an answer, a
        // timeout, the agent no longer waiting — the whole group is killed.
        let _group = Group(child.id());
        let stdin = child.stdin.take();
        let body = input.to_json().to_string();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let talk = async {
            // Written while the output is read: a command that prints much before it reads (or
            // never reads) cannot block on a full pipe while this call blocks on its input.
            let write = async {
                if let Some(mut stdin) = stdin {
                    // A command that does not read its input closes the pipe: not an error.
                    let _ = stdin.write_all(body.as_bytes()).await;
                    drop(stdin);
                }
            };
            let ((), out, err) = tokio::join!(write, read_capped(stdout), read_capped(stderr));
            let status = child.wait().await;
            (out, err, status)
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, talk).await {
            Ok(r) => r,
            Err(_) => {
                // Its process group is killed as `_group` drops.
                return HookOutcome::Failed {
                    warning: format!(
                        "{self:?} did not finish within {}; it was stopped and the agent went on",
                        crate::base::events::format_duration(self.timeout)
                    ),
                };
            }
        };
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                return HookOutcome::Failed {
                    warning: format!("{self:?} could not be waited for: {e}; the agent went on"),
                };
            }
        };
        match status.code() {
            Some(0) => self.decide(input.event, &out),
            Some(2) => HookOutcome::Block {
                reason: match err.trim() {
                    "" => format!("blocked by {self:?}"),
                    e => e.to_owned(),
                },
            },
            Some(code) => HookOutcome::Failed {
                warning: format!(
                    "{self:?} exited with {code} (only exit 2 blocks); the agent went on{}",
                    match err.trim() {
                        "" => String::new(),
                        e => format!(": {e}"),
                    }
                ),
            },
            None => HookOutcome::Failed {
                warning: format!("{self:?} was killed by a signal; the agent went on"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn hook(matcher: &str) -> Arc<dyn Hook> {
        Arc::new(CommandHook::new(HookEvent::PreToolUse, matcher, "true").unwrap())
    }

    /// No hooks, made any way, is empty and wants nothing; `then` keeps the order and either
    /// side may be empty.
    #[test]
    fn empty_and_chained_hooks() {
        for none in [Hooks::new(), Hooks::default(), Hooks::of([])] {
            assert!(none.is_empty());
            assert_eq!(none.len(), 0);
            assert!(!none.wants(HookEvent::PreToolUse, Some("Bash")));
            assert!(none.then(&Hooks::new()).is_empty());
        }
        let bash = Hooks::of([hook("Bash")]);
        let read = Hooks::of([hook("Read")]);
        for one in [Hooks::new().then(&bash), bash.then(&Hooks::new())] {
            assert_eq!(one.len(), 1);
            assert!(one.wants(HookEvent::PreToolUse, Some("Bash")));
            assert!(!one.wants(HookEvent::PreToolUse, Some("Read")));
        }
        let both = bash.then(&read);
        assert_eq!(both.len(), 2);
        assert!(both.wants(HookEvent::PreToolUse, Some("Read")));
        assert!(!both.wants(HookEvent::PostToolUse, Some("Read")));
    }
}
