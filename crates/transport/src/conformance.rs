//! The conformance suite every [`Backend`] runs (feature `test-util`).
//!
//! A backend under test is set up to answer a request successfully (twice: once sent, once
//! streamed) and, separately, to fail; the checks below then hold for every implementation:
//! a well-formed answer, usage present, streaming and non-streaming agreeing, and errors typed.

use std::fmt;

use forkhive_core::{CacheSafeParams, Message, Role, ToolDefinition};

use crate::backend::{Backend, BackendExt};
use crate::error::Error;
use crate::request::{Request, Response};

/// A conformance check that did not hold.
#[derive(Debug)]
pub struct ConformanceError(String);

impl fmt::Display for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend conformance: {}", self.0)
    }
}

impl std::error::Error for ConformanceError {}

fn fail<T>(what: impl Into<String>) -> Result<T, ConformanceError> {
    Err(ConformanceError(what.into()))
}

/// A small request with a system prompt, a tool and a user turn.
pub fn sample_request() -> Request {
    let tool = ToolDefinition::new(
        "Read",
        "Read a file",
        r#"{"type":"object","properties":{"path":{"type":"string"}}}"#,
    );
    let mut params = CacheSafeParams::builder("conformance-model").system_block("Answer briefly.");
    if let Ok(tool) = tool {
        params = params.tool(tool);
    }
    Request::new(params.build(), vec![Message::user_text("Say hello.")]).with_max_tokens(16)
}

/// Checks that `response` is a well-formed answer with usage.
pub fn check_well_formed(response: &Response) -> Result<(), ConformanceError> {
    if response.message.role != Role::Assistant {
        return fail(format!(
            "answer role is {}, not assistant",
            response.message.role
        ));
    }
    if response.message.content.is_empty() {
        return fail("answer has no content blocks");
    }
    if response.stop_reason.is_none() {
        return fail("answer has no stop reason");
    }
    if response.usage.total_tokens() == 0 {
        return fail(format!("answer reports no usage: {:?}", response.usage));
    }
    Ok(())
}

/// Sends `request`, then streams it, and checks both answers are well-formed and agree
/// (same message, stop reason and usage). The backend must answer both identically.
pub async fn check_round_trip(
    backend: &dyn Backend,
    request: &Request,
) -> Result<Response, ConformanceError> {
    let sent = match backend.send(request).await {
        Ok(r) => r,
        Err(e) => return fail(format!("send failed: {e}")),
    };
    check_well_formed(&sent)?;
    let streamed = match backend.stream_to_response(request).await {
        Ok(r) => r,
        Err(e) => return fail(format!("stream failed: {e}")),
    };
    check_well_formed(&streamed)?;
    if streamed.message != sent.message {
        return fail(format!(
            "streamed message {:?} differs from sent message {:?}",
            streamed.message, sent.message
        ));
    }
    if streamed.stop_reason != sent.stop_reason {
        return fail(format!(
            "streamed stop reason {:?} differs from {:?}",
            streamed.stop_reason, sent.stop_reason
        ));
    }
    if streamed.usage != sent.usage {
        return fail(format!(
            "streamed usage {:?} differs from sent usage {:?}",
            streamed.usage, sent.usage
        ));
    }
    Ok(sent)
}

/// Checks that both sending and streaming `request` fail with an error `expected` accepts
/// (the backend must fail both calls). Returns the error from `send`.
pub async fn check_error(
    backend: &dyn Backend,
    request: &Request,
    expected: impl Fn(&Error) -> bool,
) -> Result<Error, ConformanceError> {
    let sent = match backend.send(request).await {
        Ok(r) => {
            return fail(format!(
                "send succeeded ({:?}) where an error was expected",
                r.message
            ));
        }
        Err(e) => e,
    };
    if !expected(&sent) {
        return fail(format!("send failed with an unexpected error: {sent:?}"));
    }
    match backend.stream_to_response(request).await {
        Ok(_) => fail("stream succeeded where an error was expected"),
        Err(e) if expected(&e) => Ok(sent),
        Err(e) => fail(format!("stream failed with an unexpected error: {e:?}")),
    }
}
