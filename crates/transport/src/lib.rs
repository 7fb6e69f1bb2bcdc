//! # forkhive-transport
//!
//! How a cache-safe prefix becomes bytes on the wire, and how those bytes reach a model.

#![forbid(unsafe_code)]

pub mod backend;
pub mod codec;
pub mod error;
pub mod request;
pub mod scripted;
pub mod simulator;
pub mod sse;

pub use backend::{Backend, BackendExt, EventStream};
pub use codec::{
    AnthropicCodec, CachePolicy, CacheTtl, Codec, EncodedBody, OpenAiCodec, WireFormat,
};
pub use error::{Error, Result};
pub use request::{
    BlockStart, PartialUsage, Request, RequestSettings, Response, ResponseBuilder, StopReason,
    StreamEvent, Suffix, ToolChoice,
};
pub use scripted::ScriptedBackend;
