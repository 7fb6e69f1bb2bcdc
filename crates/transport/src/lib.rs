//! # forkhive-transport
//!
//! How a cache-safe prefix becomes bytes on the wire, and how those bytes reach a model.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`backend`] | the object-safe [`Backend`] trait (`Arc<dyn Backend>` is the common currency), forwarding impls, [`BackendExt`] |
//! | [`request`] | [`Request`] = a `CacheSafeParams` prefix + [`Suffix`] + [`RequestSettings`]; [`Response`], [`StreamEvent`], [`ResponseBuilder`] |
//! | [`codec`] | deterministic wire codecs: [`AnthropicCodec`] (with `cache_control` placed by a [`CachePolicy`]) and [`OpenAiCodec`]; an encoded body is shared [`bytes::Bytes`] chunks |
//! | [`http`] | [`http::HttpBackend`] for both APIs: streaming, retries with backoff and `retry-after`, timeouts (feature `http`) |
//! | [`scripted`] | [`ScriptedBackend`]: replies from a script, records requests |
//! | [`simulator`] | [`simulator::PromptCacheSimulator`]: applies a provider's caching rules to the exact request bytes and reports cache tokens |
//! | [`recording`] | [`recording::RecordingBackend`]: writes each request body, with the request and its answer, to a directory |
//! | [`replay`] | [`replay::ReplayBackend`]: answers from such a directory offline, matching requests by fingerprint |
//! | [`sse`] | the server-sent-events decoder |
//! | `conformance` | the suite every backend passes (feature `test-util`) |
//!
//! ## Features
//!
//! | feature | default | what it enables |
//! | --- | --- | --- |
//! | `http` | yes | the HTTP backends (reqwest + rustls); without it the crate has no network code |
//! | `test-util` | no | the public `conformance` module for implementors of [`Backend`] |
//!
//! ## Example: fork children through the cache simulator
//!
//! ```
//! use forkhive_core::{CacheSafeParams, ForkPrefix, Message};
//! use forkhive_transport::simulator::PromptCacheSimulator;
//! use forkhive_transport::{Backend, Request, ScriptedBackend};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let params = CacheSafeParams::builder("claude-sonnet-4-5")
//!     .system_block("You are a careful engineer. ".repeat(400)) // ~2,700 tokens
//!     .messages(vec![Message::user_text("Audit the repository.")])
//!     .build();
//! let prefix = ForkPrefix::new(params, Message::assistant_text("Splitting the audit."))?;
//! let backend = PromptCacheSimulator::anthropic(ScriptedBackend::from_texts(["Scope: a", "Scope: b"]));
//!
//! let first = backend.send(&Request::fork(prefix.child("audit src/a"))).await?;
//! let second = backend.send(&Request::fork(prefix.child("audit src/b"))).await?;
//! assert_eq!(first.usage.cache_read_tokens, 0);            // the first child writes...
//! assert!(second.usage.cache_read_tokens > 2_000);         // ...its sibling reads
//! assert_eq!(second.usage.cache_write_tokens, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

#![forbid(unsafe_code)]

pub mod backend;
pub mod codec;
#[cfg(feature = "test-util")]
pub mod conformance;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod recording;
pub mod replay;
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
    BlockStart, Effort, ModelStop, PartialUsage, Request, RequestSettings, Response,
    ResponseBuilder, StreamEvent, Suffix, ToolChoice,
};
pub use scripted::ScriptedBackend;
