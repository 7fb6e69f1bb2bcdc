//! HTTP backends for the Anthropic Messages and OpenAI-compatible Chat Completions APIs
//! (feature `http`), over reqwest with rustls.
//!
//! - The body is sent as its shared chunks with an explicit `content-length`: a fork child's
//!   request never copies its parent's encoded prefix.
//! - Retries follow a [`RetryPolicy`]: exponential backoff with jitter on 408, 409, 429, 5xx,
//!   529 and an `overloaded_error` (or any retryable error) that arrives before the first
//!   event of a stream; `retry-after` / `retry-after-ms` are honoured.
//! - Three timeouts: connecting, waiting for response headers, and waiting for the next chunk
//!   of a stream.
//! - The API key is sent only in its header; it is never logged, and never part of an error or
//!   of `Debug` output.

mod retry;

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

pub use retry::RetryPolicy;

use crate::backend::{Backend, EventStream};
use crate::codec::{AnthropicCodec, Codec, EncodedBody, OpenAiCodec, StreamDecoder, WireFormat};
use crate::error::{Error, Result};
use crate::request::{Request, Response, StreamEvent};
use crate::sse::{SseDecoder, SseEvent};

/// The HTTP client set-up every forkhive connection starts from: rustls on the `ring`
/// provider, trusting the Mozilla root store (`webpki-roots`), so no process-wide TLS
/// provider has to be installed and the same roots are used on every machine. The model
/// backends and the MCP client build on it; a host may add its own settings (proxies,
/// timeouts) before `build()`.
pub fn client_builder() -> reqwest::ClientBuilder {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    // rustls 0.23.48 deprecates the ring provider's constructor because ring has no
    // post-quantum key exchange; ring is kept (the other provider, aws-lc-rs, compiles a C
    // library on the host's machine), and the lint is answered here so that no host's build
    // warns about it.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // No redirect is followed: a request carries the API key and the host's headers, which a
    // redirect to another server would hand on, and a 301/302 turns the POST into a GET whose
    // answer would pass for the model's. A redirect is an error that names where it points.
    let builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    match rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(config) => builder
            .tls_backend_preconfigured(config.with_root_certificates(roots).with_no_client_auth()),
        // The ring provider supports the default protocol versions; were that ever not so,
        // reqwest reports the missing TLS set-up when the client is built.
        Err(_) => builder,
    }
}

/// A URL as an error or `Debug` shows it: `location` read against `base` (a redirect's may
/// be relative, or scheme-relative), without credentials, query or fragment, which may carry
/// tokens; with `?…` where a query was. Text that is no URL is not shown at all.
fn redacted_location(base: &str, location: &str) -> String {
    let parsed = reqwest::Url::parse(base)
        .and_then(|b| b.join(location))
        .or_else(|_| reqwest::Url::parse(location));
    match parsed {
        Ok(mut url) => {
            let had_query = url.query().is_some();
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            format!("{url}{}", if had_query { "?…" } else { "" })
        }
        Err(_) => "(an address that is not a URL)".to_owned(),
    }
}

/// An API key. Its `Debug` shows only that it is set.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Settings of an [`HttpBackend`]. Its `Debug` shows header names but never their values.
#[derive(Clone)]
pub struct HttpConfig {
    /// The provider's base URL. Anthropic: the root (`https://api.anthropic.com`); `/v1` is
    /// added unless the URL already ends with it. OpenAI-compatible: the root or `…/v1`.
    pub base_url: String,
    /// The API key; when `None`, no key header is sent (local servers).
    pub api_key: Option<ApiKey>,
    /// Extra headers sent with every request.
    pub extra_headers: Vec<(String, String)>,
    /// Limit on connecting.
    pub connect_timeout: Duration,
    /// Limit on waiting for the response headers.
    pub timeout: Duration,
    /// Limit on waiting for the next chunk of a stream (or the rest of a body).
    pub idle_timeout: Duration,
    /// When to retry.
    pub retry: RetryPolicy,
}

impl fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.extra_headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpConfig")
            .field("base_url", &shown_url(&self.base_url))
            .field("api_key", &self.api_key)
            .field("extra_headers", &headers)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("retry", &self.retry)
            .finish()
    }
}

impl HttpConfig {
    /// Defaults for `base_url`: no key, 10 s to connect, 10 min for headers, 5 min between
    /// stream chunks, the default retry policy.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            extra_headers: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
        }
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// Adds a header sent with every request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the response-header timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the between-chunks timeout.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }
}

/// A backend that talks to a provider over HTTP in one wire format.
///
/// ```
/// use forkhive_transport::http::{HttpBackend, HttpConfig};
/// // A local OpenAI-compatible server needs no key.
/// let backend = HttpBackend::openai(HttpConfig::new("http://127.0.0.1:8080/v1"))?;
/// assert!(format!("{backend:?}").contains("/v1/chat/completions"));
/// # Ok::<(), forkhive_transport::Error>(())
/// ```
pub struct HttpBackend {
    codec: Arc<dyn Codec>,
    client: reqwest::Client,
    url: String,
    endpoint: String,
    headers: HeaderMap,
    config: HttpConfig,
}

impl HttpBackend {
    /// Anthropic Messages at `{base}/v1/messages`, with `x-api-key` and `anthropic-version`.
    pub fn anthropic(config: HttpConfig) -> Result<Self> {
        Self::with_codec(config, Arc::new(AnthropicCodec::default()))
    }

    /// Anthropic Messages configured from `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`
    /// (default `https://api.anthropic.com`). A variable set to nothing (or only spaces) counts
    /// as unset: an empty key is [`Error::Config`], an empty base URL is the default.
    pub fn anthropic_from_env() -> Result<Self> {
        Self::anthropic(anthropic_config(env_var)?)
    }

    /// OpenAI-compatible Chat Completions at `{base}/v1/chat/completions`, with a bearer key.
    pub fn openai(config: HttpConfig) -> Result<Self> {
        Self::with_codec(config, Arc::new(OpenAiCodec::default()))
    }

    /// OpenAI-compatible Chat Completions configured from `OPENAI_API_KEY` (optional for
    /// local servers) and `OPENAI_BASE_URL` (default `https://api.openai.com/v1`). A variable
    /// set to nothing (or only spaces) counts as unset: no key is sent rather than an empty
    /// one, and an empty base URL is the default.
    pub fn openai_from_env() -> Result<Self> {
        Self::openai(openai_config(env_var))
    }

    /// A backend for `codec`'s wire format (its encoded prefixes are remembered per backend).
    pub fn with_codec(config: HttpConfig, codec: Arc<dyn Codec>) -> Result<Self> {
        let wire = codec.wire();
        let (url, endpoint) = endpoint(&config.base_url, wire)?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let key = config.api_key.as_ref().map(|k| k.0.as_str());
        match wire {
            WireFormat::Anthropic => {
                headers.insert(
                    HeaderName::from_static("anthropic-version"),
                    HeaderValue::from_static("2023-06-01"),
                );
                if let Some(key) = key {
                    headers.insert(HeaderName::from_static("x-api-key"), secret_header(key)?);
                }
            }
            WireFormat::OpenAi => {
                if let Some(key) = key {
                    headers.insert(
                        reqwest::header::AUTHORIZATION,
                        secret_header(&format!("Bearer {key}"))?,
                    );
                }
            }
        }
        for (name, value) in &config.extra_headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::Config(format!("invalid header name {name:?}")))?;
            let mut v = HeaderValue::from_str(value)
                .map_err(|_| Error::Config(format!("invalid value for header {name:?}")))?;
            // Extra headers often carry credentials (`api-key`, gateway tokens).
            v.set_sensitive(true);
            headers.insert(n, v);
        }
        let client = client_builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| Error::Config(format!("could not build the HTTP client: {e}")))?;
        Ok(Self {
            codec,
            client,
            url,
            endpoint,
            headers,
            config,
        })
    }

    /// The wire format.
    pub fn wire(&self) -> WireFormat {
        self.codec.wire()
    }

    /// The full request URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn attempt(&self, body: &EncodedBody) -> Result<reqwest::Response> {
        let chunks: Vec<Bytes> = body.chunks().to_vec();
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        let request = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .header(CONTENT_LENGTH, body.len())
            .body(reqwest::Body::wrap_stream(stream));
        let response = match tokio::time::timeout(self.config.timeout, request.send()).await {
            Err(_) => {
                return Err(Error::Timeout {
                    after: self.config.timeout,
                    waiting_for: "response headers",
                });
            }
            Ok(Err(e)) => {
                return Err(self.transport_error(e, "response headers", self.config.timeout));
            }
            Ok(Ok(r)) => r,
        };
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        if (300..400).contains(&status) {
            let to = header("location").map_or_else(
                || "nowhere it says".to_owned(),
                |l| format!("`{}`", redacted_location(&self.url, &l)),
            );
            return Err(Error::InvalidRequest {
                status,
                message: format!(
                    "{} answered with a redirect to {to}, which is not followed (the request \
                     carries the API key, which a redirect would hand on, and a POST would \
                     become a GET): point the base URL at that server",
                    self.endpoint
                ),
            });
        }
        let retry_after = retry::parse_retry_after(
            header("retry-after").as_deref(),
            header("retry-after-ms").as_deref(),
        );
        let body = self.read_body(response).await.unwrap_or_default();
        Err(self.status_error(status, &body, retry_after))
    }

    /// Removes the API key and extra header values from text bound for an error: a gateway
    /// may echo the request's headers in its error body.
    fn redact(&self, text: String) -> String {
        let secrets = self
            .config
            .api_key
            .iter()
            .map(|k| k.0.as_str())
            .chain(self.config.extra_headers.iter().map(|(_, v)| v.as_str()))
            .filter(|s| s.len() >= 4);
        secrets.fold(text, |t, s| t.replace(s, "<redacted>"))
    }

    fn status_error(&self, status: u16, body: &[u8], retry_after: Option<Duration>) -> Error {
        let error = self.classify(status, body, retry_after);
        match error {
            Error::Auth { status, message } => Error::Auth {
                status,
                message: self.redact(message),
            },
            Error::RateLimited {
                message,
                retry_after,
            } => Error::RateLimited {
                message: self.redact(message),
                retry_after,
            },
            Error::Overloaded {
                message,
                retry_after,
            } => Error::Overloaded {
                message: self.redact(message),
                retry_after,
            },
            Error::Unavailable {
                status,
                message,
                retry_after,
            } => Error::Unavailable {
                status,
                message: self.redact(message),
                retry_after,
            },
            Error::InvalidRequest { status, message } => Error::InvalidRequest {
                status,
                message: self.redact(message),
            },
            Error::Provider {
                error_type,
                message,
            } => Error::Provider {
                error_type,
                message: self.redact(message),
            },
            other => other,
        }
    }

    fn classify(&self, status: u16, body: &[u8], retry_after: Option<Duration>) -> Error {
        match self.codec.error_message(body) {
            Some((kind, message)) if kind == "overloaded_error" => Error::Overloaded {
                message,
                retry_after,
            },
            // A spent quota is not a transient limit: retrying cannot help.
            Some((kind, message)) if kind == "insufficient_quota" => Error::Provider {
                error_type: kind,
                message,
            },
            Some((_, message)) => Error::from_status(status, message, retry_after),
            None => {
                let text = String::from_utf8_lossy(body);
                let message = if text.trim().is_empty() {
                    format!("no error body from {}", self.endpoint)
                } else {
                    text.chars().take(500).collect()
                };
                Error::from_status(status, message, retry_after)
            }
        }
    }

    fn transport_error(
        &self,
        e: reqwest::Error,
        waiting_for: &'static str,
        after: Duration,
    ) -> Error {
        if e.is_timeout() && e.is_connect() {
            Error::Timeout {
                after: self.config.connect_timeout,
                waiting_for: "the connection",
            }
        } else if e.is_timeout() {
            Error::Timeout { after, waiting_for }
        } else {
            Error::Connect {
                endpoint: self.endpoint.clone(),
                source: Box::new(e.without_url()),
            }
        }
    }

    async fn read_body(&self, response: reqwest::Response) -> Result<Bytes> {
        match tokio::time::timeout(self.config.idle_timeout, response.bytes()).await {
            Err(_) => Err(Error::Timeout {
                after: self.config.idle_timeout,
                waiting_for: "the response body",
            }),
            Ok(Err(e)) => {
                Err(self.transport_error(e, "the response body", self.config.idle_timeout))
            }
            Ok(Ok(b)) => Ok(b),
        }
    }

    /// The first `limit` bytes of a body or more (to quote it in an error), read chunk by chunk
    /// under the idle timeout: a mislabelled endless stream is not held whole. Whatever
    /// arrived before a failure or a timeout.
    async fn read_head(&self, response: reqwest::Response, limit: usize) -> Vec<u8> {
        use futures::StreamExt;
        let mut chunks = Box::pin(response.bytes_stream());
        let mut head = Vec::new();
        while head.len() < limit {
            match tokio::time::timeout(self.config.idle_timeout, chunks.next()).await {
                Ok(Some(Ok(chunk))) => head.extend_from_slice(&chunk),
                _ => break,
            }
        }
        head
    }

    async fn wait(&self, retry: u32, error: &Error) -> bool {
        match self.config.retry.delay(retry, error) {
            Some(delay) => {
                tracing::debug!(
                    endpoint = %self.endpoint,
                    retry = retry + 1,
                    ?delay,
                    error = %error,
                    "retrying request"
                );
                tokio::time::sleep(delay).await;
                true
            }
            None => false,
        }
    }
}

fn secret_header(value: &str) -> Result<HeaderValue> {
    let mut v = HeaderValue::from_str(value).map_err(|_| {
        Error::Config("the API key contains characters not allowed in a header".to_owned())
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// The request URL and the `scheme://host:port` used in errors.
fn endpoint(base: &str, wire: WireFormat) -> Result<(String, String)> {
    // The URL itself is not echoed: it may carry credentials.
    let url = reqwest::Url::parse(base)
        .map_err(|e| Error::Config(format!("invalid base URL in HttpConfig::base_url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::Config(format!(
            "invalid base URL in HttpConfig::base_url: the scheme must be http or https, not {:?}",
            url.scheme()
        )));
    }
    // Credentials in the URL are not sent (reqwest does not turn them into a header): said,
    // rather than leave a request unauthenticated with no word.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::Config(
            "invalid base URL in HttpConfig::base_url: it holds credentials (`user:…@`), which \
             are not sent; give the key with `with_api_key` or a header with `with_header`"
                .to_owned(),
        ));
    }
    let host = url.host_str().unwrap_or_default();
    // Errors name the port connected to; the request URL keeps the base's own form (a
    // default port is not written out, as `url()` and `Debug` show it).
    let port = url.port_or_known_default().unwrap_or_default();
    let origin = format!("{}://{host}:{port}", url.scheme());
    let written = match url.port() {
        Some(p) => format!("{}://{host}:{p}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    };
    let path = url.path().trim_end_matches('/');
    let versioned = if path.ends_with("/v1") {
        path.to_owned()
    } else {
        format!("{path}/v1")
    };
    let tail = match wire {
        WireFormat::Anthropic => "/messages",
        WireFormat::OpenAi => "/chat/completions",
    };
    // A query a gateway needs (`?api-version=…`) goes with every request.
    let query = url.query().map(|q| format!("?{q}")).unwrap_or_default();
    Ok((format!("{written}{versioned}{tail}{query}"), origin))
}

/// A URL as `Debug` shows it (see [`redacted_location`]).
fn shown_url(url: &str) -> String {
    redacted_location(url, url)
}

impl fmt::Debug for HttpBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpBackend")
            .field("wire", &self.codec.wire())
            .field("url", &shown_url(&self.url))
            .field("api_key", &self.config.api_key)
            .field("retry", &self.config.retry)
            .finish()
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The decoding state of one streamed answer.
struct EventReader {
    bytes: ByteStream,
    sse: SseDecoder,
    decoder: Box<dyn StreamDecoder>,
    pending: VecDeque<StreamEvent>,
    scratch: Vec<SseEvent>,
    events: usize,
    failed: Option<Error>,
    done: bool,
    idle: Duration,
    /// Whether an event of the answer itself (past `message_start` and pings) was delivered.
    content: bool,
}

impl EventReader {
    async fn next(&mut self) -> Option<Result<StreamEvent>> {
        let item = self.read().await;
        if let Some(Ok(ev)) = &item
            && !matches!(ev, StreamEvent::MessageStart { .. } | StreamEvent::Ping)
        {
            self.content = true;
        }
        match item {
            // Past the first event, part of the answer has been handed on: a retryable error
            // (an error event, a stall) would not be retried here — sending again would give
            // the caller a second answer after the start of the first — so it is not called
            // retryable either, nor a status the server never sent (`HTTP 500` for an
            // `api_error` event).
            Some(Err(e)) if self.content && e.is_retryable() => {
                let detail = match &e {
                    Error::Timeout { after, .. } => format!("no event came within {after:?}"),
                    Error::Unavailable { message, .. }
                    | Error::Overloaded { message, .. }
                    | Error::RateLimited { message, .. } => {
                        format!("the provider sent an error event: {message}")
                    }
                    other => other.to_string(),
                };
                Some(Err(Error::TruncatedStream {
                    events: self.events,
                    detail: format!(
                        "{detail}; part of the answer had arrived, so it is not retried"
                    ),
                }))
            }
            other => other,
        }
    }

    async fn read(&mut self) -> Option<Result<StreamEvent>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                self.events += 1;
                return Some(Ok(e));
            }
            if let Some(e) = self.failed.take() {
                return Some(Err(e));
            }
            // Once the provider has said the answer is complete, what the connection does
            // next (stay open, reset) does not matter.
            if self.done || self.decoder.is_complete() {
                return None;
            }
            match tokio::time::timeout(self.idle, self.bytes.next()).await {
                Err(_) => {
                    self.done = true;
                    return Some(Err(Error::Timeout {
                        after: self.idle,
                        waiting_for: "the next stream event",
                    }));
                }
                Ok(Some(Ok(chunk))) => {
                    self.sse.feed(&chunk, &mut self.scratch);
                    let mut out = Vec::new();
                    for ev in self.scratch.drain(..) {
                        if let Err(e) = self.decoder.decode(&ev, &mut out) {
                            // Deliver what decoded before the error, then the error.
                            self.failed = Some(e);
                            self.done = true;
                            break;
                        }
                    }
                    self.pending.extend(out);
                }
                Ok(Some(Err(e))) => {
                    self.done = true;
                    return Some(Err(Error::TruncatedStream {
                        events: self.events,
                        detail: format!("the connection failed: {}", e.without_url()),
                    }));
                }
                Ok(None) => {
                    self.done = true;
                    if self.decoder.is_complete() {
                        return None;
                    }
                    let detail = if self.sse.has_partial_event() {
                        "the connection closed in the middle of an event"
                    } else {
                        "the connection closed before the end-of-stream event"
                    };
                    return Some(Err(Error::TruncatedStream {
                        events: self.events,
                        detail: detail.to_owned(),
                    }));
                }
            }
        }
    }
}

#[async_trait]
impl Backend for HttpBackend {
    async fn send(&self, request: &Request) -> Result<Response> {
        let body = self.codec.encode(request, false);
        let mut retry = 0;
        loop {
            let result = match self.attempt(&body).await {
                Ok(response) => match self.read_body(response).await {
                    Ok(bytes) => self.codec.decode_response(&bytes),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match result {
                Err(e) if self.wait(retry, &e).await => retry += 1,
                other => return other,
            }
        }
    }

    async fn stream(&self, request: &Request) -> Result<EventStream> {
        let body = self.codec.encode(request, true);
        let mut retry = 0;
        loop {
            let response = match self.attempt(&body).await {
                Ok(r) => r,
                Err(e) if self.wait(retry, &e).await => {
                    retry += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // A server that answers a streamed request whole (one that ignores `"stream":
            // true`, or a proxy's page) is named for what it is, not taken for a connection
            // cut before its first event and retried.
            if let Some(kind) = not_an_event_stream(response.headers()) {
                let status = response.status().as_u16();
                let body = self.read_head(response, 1024).await;
                // Redacted whole, then cut: a key that crosses the cut is still found.
                let text = self.redact(String::from_utf8_lossy(&body).into_owned());
                let head: String = text.chars().take(200).collect();
                return Err(Error::Decode {
                    what: "streamed response",
                    detail: format!(
                        "{} answered HTTP {status} with content-type `{kind}`, not an event \
                         stream (`text/event-stream`): does it stream? It began: {head:?}",
                        self.endpoint,
                    ),
                });
            }
            let mut reader = EventReader {
                bytes: Box::pin(response.bytes_stream()),
                sse: SseDecoder::new(),
                decoder: self.codec.stream_decoder(),
                pending: VecDeque::new(),
                scratch: Vec::new(),
                events: 0,
                failed: None,
                done: false,
                idle: self.config.idle_timeout,
                content: false,
            };
            // An error before the answer's first content (e.g. an `overloaded_error` right
            // after `message_start`, a common shape) is retried like a status error: nothing
            // of the answer has been delivered yet, so `message_start` and pings are held
            // back until it comes. A connection that breaks or ends before then is a
            // connection failure, not a truncated answer.
            let mut held = Vec::new();
            let first = loop {
                match reader.next().await {
                    Some(Ok(ev @ (StreamEvent::MessageStart { .. } | StreamEvent::Ping))) => {
                        held.push(Ok(ev));
                    }
                    other => break other,
                }
            };
            let first = match first {
                Some(Err(Error::TruncatedStream { detail, .. })) if !reader.content => {
                    Some(Err(Error::Connect {
                        endpoint: self.endpoint.clone(),
                        source: detail.into(),
                    }))
                }
                other => other,
            };
            match first {
                Some(Err(e)) if self.wait(retry, &e).await => {
                    retry += 1;
                    continue;
                }
                Some(Err(e)) => return Err(e),
                first => {
                    let head = futures::stream::iter(held.into_iter().chain(first));
                    let rest = futures::stream::unfold(reader, |mut r| async move {
                        r.next().await.map(|item| (item, r))
                    });
                    return Ok(Box::pin(head.chain(rest)));
                }
            }
        }
    }
}

/// The content type of a successful answer to a streamed request, when it says the body is a
/// whole document — JSON (`application/json`, `…+json`, `…-ndjson`) or a page (`text/html`) —
/// rather than a stream. Anything else (none said, `text/plain`, a gateway's
/// `application/octet-stream`) is read as an event stream, as before.
fn not_an_event_stream(headers: &HeaderMap) -> Option<String> {
    let kind = headers.get(CONTENT_TYPE)?.to_str().ok()?.trim();
    let media = kind
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    (media.ends_with("json") || media == "text/html").then(|| kind.to_owned())
}

/// An environment variable's value (`None` when it is unset or not Unicode).
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `name`'s value from `var` without the white space around it (a key read with
/// `$(cat key.txt)` or pasted with a line break ends in one, which a header cannot carry),
/// `None` when nothing is left (`export ANTHROPIC_BASE_URL=` unsets it, as far as this
/// library is concerned).
fn set_var(var: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    var(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// [`HttpBackend::anthropic_from_env`]'s configuration, from `var`.
fn anthropic_config(var: impl Fn(&str) -> Option<String>) -> Result<HttpConfig> {
    let base = set_var(&var, "ANTHROPIC_BASE_URL")
        .unwrap_or_else(|| "https://api.anthropic.com".to_owned());
    let key = set_var(&var, "ANTHROPIC_API_KEY")
        .ok_or_else(|| Error::Config("ANTHROPIC_API_KEY is not set, or empty".to_owned()))?;
    Ok(HttpConfig::new(base).with_api_key(key))
}

/// [`HttpBackend::openai_from_env`]'s configuration, from `var`.
fn openai_config(var: impl Fn(&str) -> Option<String>) -> HttpConfig {
    let base =
        set_var(&var, "OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
    let config = HttpConfig::new(base);
    match set_var(&var, "OPENAI_API_KEY") {
        Some(key) => config.with_api_key(key),
        None => config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup over `pairs`, standing in for the process's environment.
    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    /// An empty or blank variable counts as unset: an empty Anthropic key is refused, saying
    /// so; an empty base URL is the default; an empty OpenAI key sends none.
    #[test]
    fn blank_environment_variables_count_as_unset() {
        for key in [None, Some(""), Some("  ")] {
            let env: Vec<(&str, &str)> =
                key.map(|k| ("ANTHROPIC_API_KEY", k)).into_iter().collect();
            assert_eq!(
                anthropic_config(vars(&env))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err("backend configuration: ANTHROPIC_API_KEY is not set, or empty".to_owned()),
                "{key:?}"
            );
        }
        let c = anthropic_config(vars(&[
            ("ANTHROPIC_API_KEY", "k1"),
            ("ANTHROPIC_BASE_URL", ""),
        ]))
        .unwrap();
        assert_eq!(
            (
                c.base_url.as_str(),
                c.api_key.as_ref().map(|k| k.0.as_str())
            ),
            ("https://api.anthropic.com", Some("k1"))
        );
        let c = anthropic_config(vars(&[
            ("ANTHROPIC_API_KEY", "k1"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080"),
        ]))
        .unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:8080");
        let c = openai_config(vars(&[("OPENAI_API_KEY", ""), ("OPENAI_BASE_URL", " ")]));
        assert_eq!(
            (c.base_url.as_str(), c.api_key.is_none()),
            ("https://api.openai.com/v1", true)
        );
        let c = openai_config(vars(&[("OPENAI_API_KEY", "sk-1")]));
        assert_eq!(c.api_key.as_ref().map(|k| k.0.as_str()), Some("sk-1"));
    }

    /// White space around a key or a base URL (a key file's last line break) is not theirs:
    /// the key is sent without it, where it would have been refused as no header value.
    #[test]
    fn white_space_around_environment_values_is_dropped() {
        let c = anthropic_config(vars(&[
            ("ANTHROPIC_API_KEY", " sk-ant-1\n"),
            ("ANTHROPIC_BASE_URL", "\thttp://127.0.0.1:8080 \n"),
        ]))
        .unwrap();
        assert_eq!(
            (
                c.base_url.as_str(),
                c.api_key.as_ref().map(|k| k.0.as_str())
            ),
            ("http://127.0.0.1:8080", Some("sk-ant-1"))
        );
        let c = openai_config(vars(&[("OPENAI_API_KEY", "sk-2\r\n")]));
        assert_eq!(c.api_key.as_ref().map(|k| k.0.as_str()), Some("sk-2"));
        assert!(
            secret_header("sk-2\n").is_err(),
            "untrimmed, it was refused"
        );
    }

    #[test]
    fn an_answer_is_an_event_stream_unless_its_content_type_says_otherwise() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
            not_an_event_stream(&h)
        };
        assert_eq!(not_an_event_stream(&HeaderMap::new()), None);
        assert_eq!(with("text/event-stream"), None);
        assert_eq!(with("Text/Event-Stream; charset=utf-8"), None);
        assert_eq!(
            with("application/json; charset=utf-8").as_deref(),
            Some("application/json; charset=utf-8")
        );
        assert_eq!(with("text/html").as_deref(), Some("text/html"));
        assert_eq!(
            with("application/problem+json").as_deref(),
            Some("application/problem+json")
        );
        assert_eq!(with("text/plain"), None);
        assert_eq!(with("application/octet-stream"), None);
    }

    #[test]
    fn the_shared_client_builds_with_its_own_tls_set_up() {
        // No process-wide rustls provider is installed: the builder brings its own.
        assert!(client_builder().build().is_ok());
    }

    #[test]
    fn endpoints_add_v1_once() {
        let a = |b: &str| endpoint(b, WireFormat::Anthropic).unwrap().0;
        let o = |b: &str| endpoint(b, WireFormat::OpenAi).unwrap().0;
        assert_eq!(
            a("https://api.anthropic.com"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            a("http://127.0.0.1:8080/v1/"),
            "http://127.0.0.1:8080/v1/messages"
        );
        assert_eq!(
            o("https://api.openai.com/v1"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            o("http://localhost:9/proxy"),
            "http://localhost:9/proxy/v1/chat/completions"
        );
        // The request URL has no default port (written out or not); errors name the port.
        assert_eq!(
            endpoint("https://api.openai.com:443/v1", WireFormat::OpenAi).unwrap(),
            (
                "https://api.openai.com/v1/chat/completions".to_owned(),
                "https://api.openai.com:443".to_owned()
            )
        );
        assert_eq!(
            endpoint("http://localhost/v1", WireFormat::OpenAi)
                .unwrap()
                .1,
            "http://localhost:80"
        );
        assert!(matches!(
            endpoint("ftp://x", WireFormat::OpenAi),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            endpoint("not a url", WireFormat::OpenAi),
            Err(Error::Config(_))
        ));
        // A gateway's query goes with every request; credentials in the URL are refused
        // (they would not be sent).
        assert_eq!(
            o("https://gw.example/openai?api-version=2026-01-01"),
            "https://gw.example/openai/v1/chat/completions?api-version=2026-01-01"
        );
        assert_eq!(
            endpoint("http://user:pw@h:1", WireFormat::OpenAi)
                .err()
                .map(|e| e.to_string()),
            Some(
                "backend configuration: invalid base URL in HttpConfig::base_url: it holds \
                 credentials (`user:…@`), which are not sent; give the key with `with_api_key` \
                 or a header with `with_header`"
                    .to_owned()
            )
        );
    }

    /// `Debug` of a config or backend shows neither credentials nor the query's values of
    /// the URL, which may be tokens.
    #[test]
    fn debug_shows_no_secret_of_the_url() {
        let config = HttpConfig::new("http://u:pw-SECRET@127.0.0.1:1/ok?key=qs-SECRET");
        let shown = format!("{config:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(
            shown.contains(r#"base_url: "http://127.0.0.1:1/ok?…""#),
            "{shown}"
        );
        let b =
            HttpBackend::anthropic(HttpConfig::new("http://127.0.0.1:1/ok?key=qs-SECRET")).unwrap();
        let shown = format!("{b:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(
            shown.contains("http://127.0.0.1:1/ok/v1/messages?…"),
            "{shown}"
        );
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let b = HttpBackend::anthropic(
            HttpConfig::new("http://127.0.0.1:1").with_api_key("sk-secret-123"),
        )
        .unwrap();
        let shown = format!("{b:?}");
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        assert!(shown.contains("ApiKey(<redacted>)"));
        let err =
            HttpBackend::anthropic(HttpConfig::new("http://127.0.0.1:1").with_api_key("bad\nkey"))
                .unwrap_err();
        assert!(!err.to_string().contains("bad"), "{err}");
    }
}
