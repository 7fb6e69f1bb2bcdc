//! The [`Backend`] contract: send a request, or stream it as events.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};

use crate::error::Result;
use crate::request::{Request, Response, ResponseBuilder, StreamEvent};

/// A stream of answer events; ends after [`StreamEvent::MessageStop`] or an error.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent>> + Send + 'static>>;

/// An LLM backend. Object-safe: `Arc<dyn Backend>` is the common currency.
///
/// Implementations must report usage exactly as the provider did, and must be deterministic
/// in what they send: the same [`Request`] always becomes the same bytes.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Sends `request` and returns the complete answer.
    async fn send(&self, request: &Request) -> Result<Response>;

    /// Sends `request` and returns the answer as a stream of events.
    async fn stream(&self, request: &Request) -> Result<EventStream>;

    /// Whether this backend holds each answer whole before it could stream it — a scripted
    /// model, anything that answers from memory. The agent loop then calls
    /// [`send`](Self::send) instead of [`stream`](Self::stream) and reports each text block as
    /// one text delta, rather than cutting the answer into events and folding them back.
    ///
    /// Say `true` only when `send` returns exactly what `stream`'s events fold into, and no
    /// answer ever cuts a tool call off: the loop finds calls cut off at `max_tokens` (which it
    /// answers with an error instead of running them) only in a stream. That is why
    /// [`ReplayBackend`](crate::replay::ReplayBackend), which replays a cut-off call's partial
    /// input only when streaming, keeps `false`.
    ///
    /// `false` (the default) for a backend that really streams; a wrapper answers what the
    /// backend it wraps answers.
    fn answers_whole(&self) -> bool {
        false
    }
}

/// `Backend` for a pointer to one: every method forwarded, the async ones without a box of
/// their own (the inner backend's future is the call's).
macro_rules! forward_backend {
    ($($pointer:ident),+) => {$(
        impl<B: Backend + ?Sized> Backend for $pointer<B> {
            fn send<'a, 'b, 'f>(&'a self, request: &'b Request) -> BoxFuture<'f, Result<Response>>
            where
                'a: 'f,
                'b: 'f,
                Self: 'f,
            {
                (**self).send(request)
            }

            fn stream<'a, 'b, 'f>(
                &'a self,
                request: &'b Request,
            ) -> BoxFuture<'f, Result<EventStream>>
            where
                'a: 'f,
                'b: 'f,
                Self: 'f,
            {
                (**self).stream(request)
            }

            fn answers_whole(&self) -> bool {
                (**self).answers_whole()
            }
        }
    )+};
}

forward_backend!(Arc, Box);

/// Conveniences for every [`Backend`].
#[async_trait]
pub trait BackendExt: Backend {
    /// Streams `request` and folds the events into a [`Response`]; a stream that ends before
    /// `MessageStop` is an [`Error::TruncatedStream`](crate::Error::TruncatedStream).
    async fn stream_to_response(&self, request: &Request) -> Result<Response> {
        let mut stream = self.stream(request).await?;
        let mut builder = ResponseBuilder::new();
        while let Some(event) = stream.next().await {
            builder.push(&event?)?;
        }
        builder.finish()
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}
