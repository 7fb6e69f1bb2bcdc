//! What the conformance suites of the crate's store traits (mailboxes, task registries,
//! notification queues) share: their error, and the two ways a check fails.

use std::fmt;

/// A conformance check that did not hold: which suite, and what was wrong.
#[derive(Debug)]
pub struct ConformanceError {
    suite: &'static str,
    message: String,
}

impl fmt::Display for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} conformance: {}", self.suite, self.message)
    }
}

impl std::error::Error for ConformanceError {}

/// One suite's checks, named in their errors (`mailbox`, `task registry`, …).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Suite(pub(crate) &'static str);

impl Suite {
    /// An error of this suite.
    pub(crate) fn fail(self, message: String) -> ConformanceError {
        ConformanceError {
            suite: self.0,
            message,
        }
    }

    /// Fails with `what` unless `ok`.
    pub(crate) fn check(
        self,
        ok: bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), ConformanceError> {
        if ok { Ok(()) } else { Err(self.fail(what())) }
    }

    /// The value, or an error saying which operation failed and why.
    pub(crate) fn op<T>(self, r: crate::Result<T>, what: &str) -> Result<T, ConformanceError> {
        r.map_err(|e| self.fail(format!("{what} failed: {e}")))
    }
}
