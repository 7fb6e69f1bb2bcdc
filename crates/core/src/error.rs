//! The one error type of `forkhive-core`.

use crate::message::Role;

/// Everything that can go wrong in `forkhive-core`.
///
/// Each variant names what was wrong and where; `Display` prints only this level and the
/// underlying cause (if any) is available through [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A fork was asked to start from a message that is not the parent's assistant turn.
    #[error("cannot fork from a {role} message: a fork starts from the parent's assistant message")]
    NotAnAssistantMessage {
        /// The role of the message that was passed in.
        role: Role,
    },

    /// A string that should have been a task id is not one.
    #[error("invalid task id {input:?}: {reason}")]
    InvalidTaskId {
        /// The rejected input (truncated to 64 characters).
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A `<task-notification>` envelope could not be parsed.
    #[error("malformed task notification at line {line}, column {column}: {reason}")]
    MalformedNotification {
        /// 1-based line of the offending position in the parsed text.
        line: usize,
        /// 1-based column (in characters) of the offending position.
        column: usize,
        /// What the parser expected and what it found.
        reason: String,
    },

    /// JSON that should describe a forkhive value does not.
    #[error("invalid JSON for {what}")]
    InvalidJson {
        /// What was being parsed (for example `"message"` or `"tool_use input"`).
        what: &'static str,
        /// The parser's own error, with line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and every cause below it, joined with `": "` — what a program prints when it
/// reports an error (`Display` alone leaves the causes out: "opening tool root directory
/// /nonexistent" without "No such file or directory").
///
/// ```
/// let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
/// #[derive(Debug)]
/// struct Opening(std::io::Error);
/// impl std::fmt::Display for Opening {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("opening /x") }
/// }
/// impl std::error::Error for Opening {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
/// }
/// assert_eq!(forkhive_core::error::chain(&Opening(io)), "opening /x: No such file or directory");
/// ```
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut s = error.to_string();
    let mut cur = error.source();
    while let Some(cause) = cur {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        cur = cause.source();
    }
    s
}
