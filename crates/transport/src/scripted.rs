//! [`ScriptedBackend`]: deterministic replies from a script, for tests and offline examples.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use forkhive_core::Usage;
use futures::future::BoxFuture;

use crate::backend::{Backend, EventStream};
use crate::error::{Error, Result};
use crate::request::{Request, Response, events_for};

type ReplyFn = dyn Fn(&Request) -> Result<Response> + Send + Sync;
type AsyncReplyFn = dyn Fn(Request) -> BoxFuture<'static, Result<Response>> + Send + Sync;

enum Script {
    Queue {
        replies: VecDeque<Result<Response>>,
        scripted: usize,
    },
    Fn(Box<ReplyFn>),
    Async(Arc<AsyncReplyFn>),
}

/// A backend that answers from a script — a queue of replies, or a function of the request —
/// and records every request it receives.
///
/// Streaming replays the scripted response as events (text in 16-character chunks), unless it
/// was built [`answering_whole`](Self::answering_whole).
///
/// ```
/// use forkhive_transport::{Backend, Request, Response, ScriptedBackend};
/// use forkhive_core::{CacheSafeParams, Message, Usage};
/// # tokio_test_block_on(async {
/// let backend = ScriptedBackend::from_replies([Ok(Response::text("hi", Usage::default()))]);
/// let request = Request::new(CacheSafeParams::builder("m").build(), vec![Message::user_text("yo")]);
/// assert_eq!(backend.send(&request).await?.message.text(), "hi");
/// assert!(backend.send(&request).await.is_err()); // the script is exhausted
/// assert_eq!(backend.requests().len(), 2);
/// # Ok::<(), forkhive_transport::Error>(()) });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f) }
/// ```
pub struct ScriptedBackend {
    script: Mutex<Script>,
    requests: Mutex<Vec<Request>>,
    whole: bool,
}

impl ScriptedBackend {
    /// Replies in order; a request after the last reply gets [`Error::ScriptExhausted`].
    pub fn from_replies(replies: impl IntoIterator<Item = Result<Response>>) -> Self {
        let replies: VecDeque<_> = replies.into_iter().collect();
        Self::with_script(Script::Queue {
            scripted: replies.len(),
            replies,
        })
    }

    /// Text replies in order, each with output tokens estimated from its length.
    pub fn from_texts<S: Into<String>>(texts: impl IntoIterator<Item = S>) -> Self {
        Self::from_replies(texts.into_iter().map(|t| {
            let t = t.into();
            let usage = Usage {
                output_tokens: crate::simulator::estimate_tokens(t.len()),
                ..Usage::default()
            };
            Ok(Response::text(t, usage))
        }))
    }

    /// Replies computed from each request.
    pub fn from_fn(f: impl Fn(&Request) -> Result<Response> + Send + Sync + 'static) -> Self {
        Self::with_script(Script::Fn(Box::new(f)))
    }

    /// Replies computed by a future per request: a model that takes its time
    /// (`tokio::time::sleep`), never answers (`std::future::pending`), or fails with any
    /// [`Error`] — a 429 is `Err(Error::RateLimited { .. })`.
    ///
    /// Requests made inside an agent run carry the asking agent: inside `f`,
    /// `forkhive_spawn::runtime::AgentContext::current()` says which agent (its id, kind,
    /// agent type), so one backend can answer a parent and each kind of child differently.
    /// Call it in `f` itself, before the returned future's first `.await`, or inside the
    /// future: both run while the agent's request is in flight.
    ///
    /// ```
    /// use std::time::Duration;
    /// use forkhive_transport::{Backend, Request, Response, ScriptedBackend};
    /// use forkhive_core::{CacheSafeParams, Message};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let backend = ScriptedBackend::from_async_fn(|request: Request| async move {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    ///     Ok(Response::say(format!("{} messages", request.all_messages().len())))
    /// });
    /// let request = Request::new(CacheSafeParams::builder("m").build(), vec![Message::user_text("yo")]);
    /// assert_eq!(backend.send(&request).await?.message.text(), "1 messages");
    /// # Ok::<(), forkhive_transport::Error>(()) }).unwrap();
    /// ```
    pub fn from_async_fn<F, Fut>(f: F) -> Self
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Response>> + Send + 'static,
    {
        Self::with_script(Script::Async(Arc::new(move |r| Box::pin(f(r)))))
    }

    fn with_script(script: Script) -> Self {
        Self {
            script: Mutex::new(script),
            requests: Mutex::new(Vec::new()),
            whole: false,
        }
    }

    /// Says it [answers whole](Backend::answers_whole): an agent loop asks it with `send`
    /// and gets each reply as it was scripted, with no streaming events in between (the
    /// cheapest model there is, for measuring the library's own cost).
    #[must_use]
    pub fn answering_whole(mut self) -> Self {
        self.whole = true;
        self
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn reply(&self, request: &Request) -> Result<Response> {
        let n = {
            let mut reqs = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            reqs.push(request.clone());
            reqs.len()
        };
        // The lock is released before any await: an async reply runs outside it.
        let pending = {
            let mut script = self.script.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *script {
                Script::Queue { replies, scripted } => {
                    return replies.pop_front().unwrap_or(Err(Error::ScriptExhausted {
                        request: n,
                        scripted: *scripted,
                    }));
                }
                Script::Fn(f) => return f(request),
                Script::Async(f) => f(request.clone()),
            }
        };
        pending.await
    }
}

impl fmt::Debug for ScriptedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedBackend")
            .field(
                "requests",
                &self.requests.lock().map(|r| r.len()).unwrap_or_default(),
            )
            .finish()
    }
}

#[async_trait]
impl Backend for ScriptedBackend {
    async fn send(&self, request: &Request) -> Result<Response> {
        self.reply(request).await
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        let response = self.reply(request).await?;
        let events = events_for(&response, 16);
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }

    fn answers_whole(&self) -> bool {
        self.whole
    }
}
