//! The one error type of `forkhive-spawn`.

use std::path::PathBuf;

/// Everything that can stop the runtime, a transcript, or the definition loader.
///
/// What a *tool* or the *model* does wrong never becomes an `Error`: it becomes an `is_error`
/// tool result the model can act on, and the loop goes on. `Display` prints only this level;
/// causes are in `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend failed with an error it does not retry (or retries ran out).
    #[error("the model backend failed on turn {turn}")]
    Backend {
        /// The turn (1-based) whose request failed.
        turn: u32,
        /// The transport's error.
        #[source]
        source: forkhive_transport::Error,
    },

    /// A value from `forkhive-core` was invalid (a message, a schema, a task id).
    #[error(transparent)]
    Core(#[from] forkhive_core::Error),

    /// Reading or writing a file failed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done (`"creating transcript"`, `"reading agent file"`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A transcript is damaged somewhere other than a cut-off last line.
    #[error("transcript {}:{line}: {message}", path.display())]
    Transcript {
        /// The transcript file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What was wrong.
        message: String,
    },

    /// An agent definition file could not be used.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Definition {
        /// The definition file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// The 1-based column.
        column: usize,
        /// What was wrong and how to fix it.
        message: String,
    },

    /// A tool definition was rejected when a pool was built (a duplicate name, a schema that
    /// is not a valid JSON Schema).
    #[error("tool {name:?}: {message}")]
    Tool {
        /// The tool's name.
        name: String,
        /// What was wrong.
        message: String,
    },

    /// A task registry refused an operation (an unknown task, a transition out of a
    /// terminal state).
    #[error("task {id}: {message}")]
    Task {
        /// The task's id.
        id: forkhive_core::TaskId,
        /// What was wrong.
        message: String,
    },

    /// A child was not started: a cap on live children is full. The message says which and
    /// what to do, for the model as much as for the host.
    #[error("{message}")]
    Capacity {
        /// The agent that asked.
        parent: forkhive_core::TaskId,
        /// Which cap, and what to do.
        message: String,
    },

    /// A spawn named an agent type the registry does not hold.
    #[error("unknown agent type `{name}`; available: {}", available.join(", "))]
    UnknownAgent {
        /// The type asked for.
        name: String,
        /// The types there are, sorted.
        available: Vec<String>,
    },

    /// A spawn was refused for a reason the model can act on (a fork inside a fork, a
    /// forking turn that is not an assistant message), or a side question was answered with
    /// tool calls only.
    #[error("{0}")]
    Refused(String),

    /// Building a child failed; `source` says why.
    #[error("could not start the {what}")]
    Start {
        /// `agent` or `fork`.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<Error>,
    },

    /// A git worktree could not be made (a bad slug, not a git repository, git refused).
    #[error("worktree in {}: {message}", path.display())]
    Worktree {
        /// The repository directory it was asked of.
        path: PathBuf,
        /// What was wrong, with git's own words where git refused.
        message: String,
    },

    /// A mailbox could not do what was asked: a name that cannot be an inbox, an inbox file
    /// that is not what it should be, an I/O failure.
    #[error("mailbox {inbox}: {message}")]
    Mailbox {
        /// The inbox (`<team>/<agent>`), or the name that could not be one.
        inbox: String,
        /// What was wrong.
        message: String,
    },

    /// A writer could not take an inbox's lock within its budget: the message was not sent
    /// (never dropped in silence), and may be sent again.
    #[error("mailbox lock {} still held after {attempts} attempts: the message was not sent", path.display())]
    MailboxBusy {
        /// The lock file.
        path: PathBuf,
        /// How many times it was tried.
        attempts: u32,
    },

    /// Another writer holds a transcript's lock: an agent that is still alive appends to it, or
    /// one that was dropped is still finishing its last write. Nothing was read or written;
    /// drop that agent (or let its write finish) and try again. (Unix only: other platforms
    /// take no lock.)
    #[error("transcript {} is held by another writer (still held after {waited:?}): an agent that is still alive appends to it (drop it before resuming or reopening its transcript), or a dropped one is finishing its last write", path.display())]
    TranscriptBusy {
        /// The transcript file.
        path: PathBuf,
        /// How long it was waited for.
        waited: std::time::Duration,
    },

    /// A transcript's length changed between reading it and reopening it for appending:
    /// another writer wrote to it, so records appended from what was read could repeat its
    /// indexes. Nothing was written; read it again.
    #[error("transcript {} changed since it was read ({read} bytes then, {now} now): read it again before appending", path.display())]
    TranscriptChanged {
        /// The transcript file.
        path: PathBuf,
        /// Its length when it was read.
        read: u64,
        /// Its length now.
        now: u64,
    },

    /// Another lead holds the team on this mailbox ([`Mailbox::claim_lead`]): two leads of one
    /// team would share its inboxes and take each other's letters.
    ///
    /// [`Mailbox::claim_lead`]: crate::mailbox::Mailbox::claim_lead
    #[error(
        "team `{team}` has another lead on this mailbox ({holder}); give this team another name, or stop that lead"
    )]
    TeamTaken {
        /// The team.
        team: String,
        /// Who holds it, as far as the mailbox knows.
        holder: String,
    },

    /// [`Team::shut_down`] waited its time and these teammates were still running (or their
    /// owners still finishing them).
    ///
    /// [`Team::shut_down`]: crate::team::Team::shut_down
    #[error(
        "team `{team}`: {running} still running {waited:?} after the shutdown was asked (the team's shutdown grace and `SHUT_DOWN_MARGIN`)"
    )]
    TeamNotStopped {
        /// The team.
        team: String,
        /// Who was still running, by name.
        running: String,
        /// How long the shutdown waited.
        waited: std::time::Duration,
    },

    /// A structured team message was refused: from the wrong sender, for no open request, or
    /// not the kind expected.
    #[error("team protocol: {0}")]
    Protocol(String),

    /// A tool call's input does not match the tool's JSON Schema.
    #[error("invalid input for tool `{tool}`:\n{}", problems.join("\n"))]
    InvalidInput {
        /// The tool.
        tool: String,
        /// Every violation, as `at <JSON pointer>: <what is wrong>` (the root is `at /`).
        problems: Vec<String>,
    },

    /// A verification run gave no usable verdict.
    #[error("verification failed: {0}")]
    Verification(String),

    /// A verification run ended without a verdict: it failed, was cancelled, stopped at a
    /// limit, or its report's last line is not a verdict. `report` is what the agent had
    /// written, for the host to show.
    #[error("verification gave no verdict: {reason}")]
    NoVerdict {
        /// Why there is no verdict.
        reason: String,
        /// The agent's final text (its report so far).
        report: String,
    },

    /// An agent was configured inconsistently (a missing backend, a zero limit).
    #[error("invalid agent configuration: {0}")]
    Config(String),

    /// A worker pool's store could not be reached or answered with an error (a Redis that is
    /// down or refuses a command): an outage, not the host's configuration, and worth
    /// retrying. `message` says which pool, where, and what was being done.
    #[error("pool {message}")]
    Pool {
        /// The pool, where its store is, what was being done and what went wrong.
        message: String,
    },

    /// A hook's configuration cannot be used (settings or frontmatter that are not in the
    /// hooks format, a matcher that is not a pattern).
    #[error("invalid hook: {0}")]
    Hook(String),

    /// An MCP server's configuration cannot be used.
    #[error("MCP server `{server}`: {message}")]
    Mcp {
        /// The server's name (or, for a configuration file, where it came from).
        server: String,
        /// What is wrong.
        message: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
