//! The one error type of `forkhive-transport`.

use std::time::Duration;

/// Everything that can go wrong talking to a model.
///
/// Each variant documents whether the HTTP backends retry it; [`Error::is_retryable`] is what
/// the retry policy reads. `Display` prints only this level; causes are in `source()`. No
/// variant ever carries an API key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The provider rejected the credentials (HTTP 401 or 403). **Not retried.**
    #[error("authentication failed (HTTP {status}): {message}")]
    Auth {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },

    /// Too many requests (HTTP 429). **Retried**, after `retry_after` when the provider said.
    #[error("rate limited (HTTP 429): {message}")]
    RateLimited {
        /// The provider's message.
        message: String,
        /// How long the provider asked us to wait.
        retry_after: Option<Duration>,
    },

    /// The provider is overloaded (HTTP 529, or an `overloaded_error` event). **Retried**
    /// when it arrives before any part of the answer.
    #[error("provider overloaded: {message}")]
    Overloaded {
        /// The provider's message.
        message: String,
        /// How long the provider asked us to wait.
        retry_after: Option<Duration>,
    },

    /// A transient server-side failure (HTTP 408, 409 or 5xx). **Retried.**
    #[error("provider unavailable (HTTP {status}): {message}")]
    Unavailable {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
        /// How long the provider asked us to wait.
        retry_after: Option<Duration>,
    },

    /// The provider refused the request as invalid (other 4xx), or a local check found it
    /// invalid before sending. **Not retried.**
    #[error("invalid request (HTTP {status}): {message}")]
    InvalidRequest {
        /// The HTTP status (400 for local checks).
        status: u16,
        /// The provider's message, verbatim.
        message: String,
    },

    /// No answer in time. **Retried** when no part of the answer had arrived.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// The limit that ran out.
        after: Duration,
        /// What we were waiting for (`"response headers"`, `"the next stream event"`).
        waiting_for: &'static str,
    },

    /// The connection failed or broke. **Retried** when no part of the answer had arrived.
    #[error("connection to {endpoint} failed")]
    Connect {
        /// Scheme, host and port (never a query string or a key).
        endpoint: String,
        /// The transport's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The stream ended before the provider said it was complete. **Not retried** (part of
    /// the answer was already delivered).
    #[error("stream truncated after {events} events: {detail}")]
    TruncatedStream {
        /// Events decoded before the end.
        events: usize,
        /// What was missing.
        detail: String,
    },

    /// The provider's answer could not be decoded. **Not retried.**
    #[error("could not decode {what}: {detail}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// What was wrong, with position when known.
        detail: String,
    },

    /// The provider reported an error this crate has no better variant for. **Not retried.**
    #[error("provider error `{error_type}`: {message}")]
    Provider {
        /// The provider's error type.
        error_type: String,
        /// The provider's message.
        message: String,
    },

    /// The backend is misconfigured (missing API key, bad base URL). **Not retried.**
    #[error("backend configuration: {0}")]
    Config(String),

    /// A scripted backend has no reply left for a request. **Not retried.**
    #[error("scripted backend has no reply for request #{request} (script held {scripted})")]
    ScriptExhausted {
        /// 1-based number of the request that found the script empty.
        request: usize,
        /// How many replies the script held in total.
        scripted: usize,
    },

    /// Writing a recorded request failed. **Not retried.**
    #[error("could not record to {path}")]
    Record {
        /// The file that could not be written.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A replay directory, or a recording in it, could not be read. **Not retried.**
    #[error("could not read {path} for replay")]
    ReplayRead {
        /// The directory or file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A file in a replay directory is not a recording this build can replay: not JSON, no
    /// `forkhive` section, another format version, no answer, or a request that does not
    /// match its recorded fingerprint. **Not retried.**
    #[error("malformed recording {path}: {detail}")]
    MalformedRecording {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it (with line and column when the JSON is at fault).
        detail: String,
    },

    /// No unused recording of a [`ReplayBackend`](crate::replay::ReplayBackend) matches a
    /// request. **Not retried.**
    #[error("no recording matches request {request}: {detail}")]
    NoRecording {
        /// 1-based number of the request among those the replay received.
        request: usize,
        /// The file name of the closest recording: the one sharing the longest prefix with
        /// the request, or one it matches but that was already used.
        closest: Option<String>,
        /// Which recording is closest and the first dimension that differs
        /// (`closest is 0002-child-1.json, which differs at messages[4] changed`).
        detail: String,
    },
}

impl Error {
    /// Whether a retry policy may send the same request again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::RateLimited { .. }
                | Error::Overloaded { .. }
                | Error::Unavailable { .. }
                | Error::Timeout { .. }
                | Error::Connect { .. }
        )
    }

    /// The delay the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited { retry_after, .. }
            | Error::Overloaded { retry_after, .. }
            | Error::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Maps an HTTP error status and the provider's message to the matching variant.
    pub fn from_status(status: u16, message: String, retry_after: Option<Duration>) -> Self {
        match status {
            401 | 403 => Error::Auth { status, message },
            429 => Error::RateLimited {
                message,
                retry_after,
            },
            529 => Error::Overloaded {
                message,
                retry_after,
            },
            408 | 409 | 500..=599 => Error::Unavailable {
                status,
                message,
                retry_after,
            },
            _ => Error::InvalidRequest { status, message },
        }
    }

    /// Maps a provider error type (as in an Anthropic `error` event) to the matching variant.
    pub fn from_provider_type(error_type: &str, message: String) -> Self {
        match error_type {
            "overloaded_error" => Error::Overloaded {
                message,
                retry_after: None,
            },
            "rate_limit_error" => Error::RateLimited {
                message,
                retry_after: None,
            },
            "api_error" | "server_error" => Error::Unavailable {
                status: 500,
                message,
                retry_after: None,
            },
            "authentication_error" => Error::Auth {
                status: 401,
                message,
            },
            "permission_error" => Error::Auth {
                status: 403,
                message,
            },
            "invalid_request_error" => Error::InvalidRequest {
                status: 400,
                message,
            },
            other => Error::Provider {
                error_type: other.to_owned(),
                message,
            },
        }
    }
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds_and_retryability() {
        let cases = [
            (400, false, "invalid request (HTTP 400): m"),
            (401, false, "authentication failed (HTTP 401): m"),
            (403, false, "authentication failed (HTTP 403): m"),
            (404, false, "invalid request (HTTP 404): m"),
            (408, true, "provider unavailable (HTTP 408): m"),
            (409, true, "provider unavailable (HTTP 409): m"),
            (429, true, "rate limited (HTTP 429): m"),
            (500, true, "provider unavailable (HTTP 500): m"),
            (503, true, "provider unavailable (HTTP 503): m"),
            (529, true, "provider overloaded: m"),
        ];
        for (status, retry, text) in cases {
            let e = Error::from_status(status, "m".into(), None);
            assert_eq!(e.is_retryable(), retry, "{status}");
            assert_eq!(e.to_string(), text);
        }
        let e = Error::from_status(429, "slow".into(), Some(Duration::from_secs(2)));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn provider_types_map_to_kinds() {
        assert!(matches!(
            Error::from_provider_type("overloaded_error", "x".into()),
            Error::Overloaded { .. }
        ));
        assert!(Error::from_provider_type("overloaded_error", "x".into()).is_retryable());
        assert!(!Error::from_provider_type("invalid_request_error", "x".into()).is_retryable());
        assert_eq!(
            Error::from_provider_type("weird_error", "x".into()).to_string(),
            "provider error `weird_error`: x"
        );
    }
}
