//! A server's endpoint (its configuration and, while connected, its live link) and its tools
//! as [`Tool`]s.
//!
//! Ownership: a hub server's endpoint is the hub's (closed by [`McpHub::close`] or when the
//! hub and every tool of it are gone). A definition's own server is held by the agents whose
//! pools hold its tools ([`Holder`], kept in the agent): when the last of them ends, the server
//! is stopped — even if its tools live on in a resumable child's recipe, where the next call
//! starts it again.
//!
//! [`McpHub::close`]: super::McpHub::close

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{ContentBlock, ImageSource, ToolDefinition};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock as McpBlock, PaginatedRequestParams,
    ResourceContents,
};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceError, ServiceExt};
use tokio::io::AsyncReadExt;

use super::config::{McpServer, McpTransport};
use super::{MAX_OUTPUT_CHARS, MAX_TOOL_NAME, normalize};
use crate::tool::{InBackground, Tool, ToolContext, ToolOutput};

/// The most of a server's standard error kept to explain a failure.
const STDERR_TAIL: usize = 2048;
/// The most tools one server may offer; the rest are left out.
pub(super) const MAX_TOOLS: usize = 1000;
/// The most pages of `tools/list` read.
const MAX_PAGES: usize = 100;
/// The longest input schema accepted, serialized; a tool with a longer one is left out (it
/// would be sent with every request).
pub(super) const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The largest image passed to the model (its base64 text), and the most image bytes in one
/// result.
const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;
/// How long a failed call waits for the server's last words on standard error.
const STDERR_GRACE: Duration = Duration::from_millis(200);

/// One live connection. Dropping it closes the connection and kills a stdio server's process
/// group at once (what it started goes with it).
pub(super) struct Link {
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ()>>>,
    stderr: Stderr,
    /// A stdio server's process group.
    group: Option<u32>,
    reader: Option<tokio::task::AbortHandle>,
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(reader) = &self.reader {
            reader.abort();
        }
        #[cfg(unix)]
        if let Some(pid) = self
            .group
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Link {
    async fn close(&self) {
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            let _ = service.close_with_timeout(Duration::from_secs(2)).await;
        }
    }
}

/// The end of a server's standard error, and whether it was read to its end.
#[derive(Clone, Default)]
struct Stderr {
    tail: Arc<Mutex<String>>,
    done: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Stderr {
    fn tail(&self) -> String {
        self.tail
            .lock()
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// The tail once the server's standard error has ended (or after a short grace).
    async fn final_tail(&self) -> String {
        if let Some(mut done) = self.done.clone() {
            let _ = tokio::time::timeout(STDERR_GRACE, done.wait_for(|d| *d)).await;
        }
        self.tail()
    }

    fn with(&self, message: String) -> String {
        let tail = self.tail();
        if tail.is_empty() {
            message
        } else {
            format!("{message}; its standard error ends: {tail}")
        }
    }
}

/// Keeps the last [`STDERR_TAIL`] bytes of `text` in `buf`, cut at a character boundary.
fn keep_tail(buf: &mut String, text: &str) {
    buf.push_str(text);
    if buf.len() > STDERR_TAIL {
        let from = buf.len() - STDERR_TAIL;
        let from = (from..buf.len())
            .find(|i| buf.is_char_boundary(*i))
            .unwrap_or(buf.len());
        buf.drain(..from);
    }
}

/// A server as its tools see it: its configuration and, while connected, its link.
pub(super) struct Endpoint {
    server: McpServer,
    /// A definition's own server (stopped when the last agent holding it ends).
    own: bool,
    live: Mutex<Option<Arc<Link>>>,
    /// Serializes (re)connecting; holds how many attempts have failed, and the last one's
    /// error.
    connecting: tokio::sync::Mutex<(u64, String)>,
    /// How many attempts have failed (read without the lock, before waiting for it).
    failures: AtomicU64,
    holders: AtomicUsize,
    /// Closed by the host: calls fail instead of reconnecting.
    closed: AtomicBool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("server", &self.server.name())
            .field("own", &self.own)
            .finish()
    }
}

impl Endpoint {
    fn link(&self) -> Option<Arc<Link>> {
        self.live.lock().ok().and_then(|l| l.clone())
    }

    fn set(&self, link: Option<Arc<Link>>) -> Option<Arc<Link>> {
        match self.live.lock() {
            Ok(mut l) => std::mem::replace(&mut *l, link),
            Err(_) => None,
        }
    }

    /// Whether it is connected and its connection still open.
    pub(super) fn is_open(&self) -> bool {
        self.link().is_some_and(|l| !l.peer.is_transport_closed())
    }

    /// The end of its standard error (for a status that says why it stopped).
    pub(super) fn stderr_tail(&self) -> String {
        self.link().map(|l| l.stderr.tail()).unwrap_or_default()
    }

    /// Closes it for good: calls fail, and nothing reconnects.
    pub(super) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(link) = self.set(None) {
            link.close().await;
        }
    }

    /// The live link, reconnecting a definition's own server that its last holder stopped.
    async fn ensure(&self) -> Result<Arc<Link>, String> {
        if let Some(link) = self.link() {
            return Ok(link);
        }
        if self.closed.load(Ordering::SeqCst) || !self.own {
            return Err(format!(
                "MCP server `{}` was closed by the host",
                self.server.name()
            ));
        }
        let before = self.failures.load(Ordering::SeqCst);
        let mut one = self.connecting.lock().await;
        if let Some(link) = self.link() {
            return Ok(link);
        }
        // An attempt failed while this call waited for its turn: its answer is this call's
        // too. Otherwise each call queued behind a dead server would wait out a connect
        // timeout of its own, one after another.
        if one.0 != before {
            return Err(one.1.clone());
        }
        let (link, _) = match open(&self.server).await {
            Ok(opened) => opened,
            Err(e) => {
                *one = (one.0 + 1, e.clone());
                self.failures.store(one.0, Ordering::SeqCst);
                return Err(e);
            }
        };
        let link = Arc::new(link);
        self.set(Some(Arc::clone(&link)));
        Ok(link)
    }
}

/// One agent's hold on a definition's own server: the last one dropped stops the server.
#[derive(Debug)]
pub(crate) struct Holder(Arc<Endpoint>);

impl Drop for Holder {
    fn drop(&mut self) {
        if self.0.holders.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Dropping the link kills a stdio server's process group at once.
            drop(self.0.set(None));
        }
    }
}

/// The holds an agent whose pool is `tools` takes on the own servers among them (one per
/// server).
pub(crate) fn holders<'a>(tools: impl IntoIterator<Item = &'a Arc<dyn Tool>>) -> Vec<Holder> {
    let mut held: Vec<Holder> = Vec::new();
    for t in tools {
        let Some(t) = t.as_any().and_then(|a| a.downcast_ref::<McpTool>()) else {
            continue;
        };
        if t.endpoint.own && !held.iter().any(|h| Arc::ptr_eq(&h.0, &t.endpoint)) {
            t.endpoint.holders.fetch_add(1, Ordering::SeqCst);
            held.push(Holder(Arc::clone(&t.endpoint)));
        }
    }
    held
}

/// A connected server: its endpoint and its tools (each holding the endpoint), and what was
/// left out of its tool list.
pub(super) struct Connected {
    pub(super) endpoint: Arc<Endpoint>,
    pub(super) tools: Arc<[Arc<dyn Tool>]>,
    pub(super) left_out: Vec<String>,
}

/// Starts a server and completes the handshake, within its connect timeout.
async fn open(server: &McpServer) -> Result<(Link, Vec<rmcp::model::Tool>), String> {
    let mut stderr = Stderr::default();
    let timeout = server.connect_timeout_value();
    let mut group = None;
    let mut reader = None;
    let started = tokio::time::timeout(timeout, async {
        let service = match server.transport() {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env);
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let mut wrap = process_wrap::tokio::CommandWrap::from(cmd);
                // Its own process group, killed with the link: a server started through
                // `npx` or a shell leaves no grandchild behind.
                #[cfg(unix)]
                wrap.wrap(process_wrap::tokio::ProcessGroup::leader());
                wrap.wrap(process_wrap::tokio::KillOnDrop);
                let (transport, err) = rmcp::transport::TokioChildProcess::builder(wrap)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| match cwd {
                        // The OS says "No such file or directory" for a missing working
                        // directory too, which reads as if the command were missing.
                        Some(dir) if !dir.is_dir() => format!(
                            "could not start `{command}`: its working directory {} is not a \
                             directory ({e})",
                            dir.display()
                        ),
                        _ => format!("could not start `{command}`: {e}"),
                    })?;
                group = transport.id();
                if let Some(mut err) = err {
                    let (tx, rx) = tokio::sync::watch::channel(false);
                    stderr.done = Some(rx);
                    let (tail, name) = (Arc::clone(&stderr.tail), server.name().to_owned());
                    // Drained to its end (a server blocked on a full pipe would hang), in
                    // bounded reads, whatever the bytes; owned by the link, which aborts it.
                    let task = tokio::spawn(async move {
                        let mut buf = vec![0u8; 4096];
                        while let Ok(n @ 1..) = err.read(&mut buf).await {
                            let text = String::from_utf8_lossy(&buf[..n]);
                            tracing::debug!(server = %name, "MCP server stderr: {}", text.trim_end());
                            if let Ok(mut t) = tail.lock() {
                                keep_tail(&mut t, &text);
                            }
                        }
                        let _ = tx.send(true);
                    });
                    reader = Some(task.abort_handle());
                }
                ().serve(transport).await.map_err(|e| {
                    format!("did not complete the MCP handshake: {}", handshake_error(e))
                })?
            }
            McpTransport::Http { url, headers } => {
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let mut custom = std::collections::HashMap::new();
                for (k, v) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("invalid header name {k:?}"))?;
                    let mut value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|_| format!("invalid value for header {k:?}"))?;
                    value.set_sensitive(true);
                    custom.insert(name, value);
                }
                let client = forkhive_transport::http::client_builder()
                    .connect_timeout(timeout)
                    .redirect(same_origin_redirects())
                    .build()
                    .map_err(|e| format!("could not build the HTTP client: {e}"))?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport =
                    rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
                ().serve(transport).await.map_err(|e| {
                    format!(
                        "did not complete the MCP handshake at {}: {}",
                        super::config::redacted_url(url),
                        handshake_error(e)
                    )
                })?
            }
        };
        let peer = service.peer().clone();
        let listed = list_tools(&peer).await?;
        Ok::<_, String>((service, listed))
    })
    .await;
    let link = |service: Option<RunningService<RoleClient, ()>>, peer, stderr: Stderr| Link {
        peer,
        service: tokio::sync::Mutex::new(service),
        stderr,
        group,
        reader: reader.clone(),
    };
    match started {
        Ok(Ok((service, listed))) => {
            let peer = service.peer().clone();
            Ok((link(Some(service), peer, stderr), listed))
        }
        Ok(Err(why)) => {
            // Its process group goes now, with what it started (dropping a half-made link).
            let why = stderr.with(why);
            kill_group(group, reader.as_ref());
            Err(why)
        }
        Err(_) => {
            let why = stderr.with(format!(
                "did not finish starting (initialize and tools/list) within {}",
                crate::base::events::format_duration(timeout)
            ));
            kill_group(group, reader.as_ref());
            Err(why)
        }
    }
}

/// Redirects an MCP client follows: a 307 or 308 (the method and body kept) to the same
/// scheme, host and port, at most 5 — the `/mcp` → `/mcp/` of common servers — as rmcp's own
/// client does. Anything else (another server, which the headers would reach; a 301/302,
/// which would drop the body) stops at the redirect, which the handshake then reports.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt.previous().first().is_some_and(|first| {
            let url = attempt.url();
            first.scheme() == url.scheme()
                && first.host_str() == url.host_str()
                && first.port_or_known_default() == url.port_or_known_default()
        });
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if same && keeps_body && attempt.previous().len() <= 5 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// A failed handshake as a host reads it: a closed connection says the process likely
/// exited; a transport's error is its own chain of causes (`Connection refused`), without the
/// transport's Rust type name that rmcp's message starts with.
fn handshake_error(e: rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    let closed = || {
        "its connection closed before it answered `initialize` (did its process exit?)".to_owned()
    };
    match e {
        E::ConnectionClosed(_) => closed(),
        // Written to after it exited (which of the two a dead process gives is a race).
        E::TransportError { error, .. }
            if error
                .error
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            closed()
        }
        E::TransportError { error, .. } => {
            use rmcp::transport::streamable_http_client::StreamableHttpError;
            // rmcp shows reqwest's error without its causes (`error sending request`), so
            // the one that says what happened (`Connection refused`) is read from it here.
            match error
                .error
                .downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(StreamableHttpError::Client(e)) => forkhive_core::error::chain(e),
                _ => forkhive_core::error::chain(&*error.error),
            }
        }
        other => other.to_string(),
    }
}

fn kill_group(group: Option<u32>, reader: Option<&tokio::task::AbortHandle>) {
    if let Some(r) = reader {
        r.abort();
    }
    #[cfg(unix)]
    if let Some(pid) = group
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// `tools/list`, page by page, bounded: at most [`MAX_PAGES`] pages and [`MAX_TOOLS`] tools.
async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|e| format!("could not list its tools: {e}"))?;
        tools.extend(page.tools);
        if tools.len() >= MAX_TOOLS {
            tools.truncate(MAX_TOOLS);
            break;
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(tools)
}

/// Connects to a server and makes its tools; Err says why, for the host's status and the
/// agent's warnings. `own`: a definition's own server (see [`Holder`]).
pub(super) async fn connect(server: &McpServer, own: bool) -> Result<Connected, String> {
    let (link, listed) = open(server).await?;
    let endpoint = Arc::new(Endpoint {
        server: server.clone(),
        own,
        live: Mutex::new(Some(Arc::new(link))),
        connecting: tokio::sync::Mutex::new((0, String::new())),
        failures: AtomicU64::new(0),
        holders: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
    });
    let server_key = normalize(server.name());
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut left_out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for t in listed {
        match make_tool(&endpoint, &server_key, t, &mut seen) {
            Ok(tool) => tools.push(tool),
            Err(why) => {
                tracing::warn!(server = %server.name(), "MCP tool left out: {why}");
                left_out.push(why);
            }
        }
    }
    tools.sort_by(|a, b| a.definition().name.cmp(&b.definition().name));
    Ok(Connected {
        endpoint,
        tools: tools.into(),
        left_out,
    })
}

/// One tool of a server, or why it is left out.
fn make_tool(
    endpoint: &Arc<Endpoint>,
    server_key: &str,
    t: rmcp::model::Tool,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<Arc<dyn Tool>, String> {
    let remote = t.name.to_string();
    if remote.is_empty() {
        return Err("a tool without a name".to_owned());
    }
    let name = format!("mcp__{server_key}__{}", normalize(&remote));
    if name.len() > MAX_TOOL_NAME {
        return Err(format!(
            "`{remote}`: its name `{name}` is longer than {MAX_TOOL_NAME} characters"
        ));
    }
    if !seen.insert(name.clone()) {
        return Err(format!(
            "`{remote}`: another of its tools is also named `{name}`"
        ));
    }
    // The server's schema, serialized once: every agent offered this tool sends the same
    // bytes (the prompt-cache key).
    let schema = serde_json::to_string(&*t.input_schema)
        .map_err(|e| format!("`{remote}`: its schema is not JSON: {e}"))?;
    if schema.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "`{remote}`: its schema is {} bytes, more than {MAX_SCHEMA_BYTES}",
            schema.len()
        ));
    }
    if let Err(e) = jsonschema::validator_for(&serde_json::Value::Object((*t.input_schema).clone()))
    {
        return Err(format!(
            "`{remote}`: its input schema is not a valid JSON Schema: {e}"
        ));
    }
    let description = t.description.as_deref().unwrap_or_default();
    let definition = ToolDefinition::new(name, cut(description, 2048), &schema)
        .map_err(|e| format!("`{remote}`: {e}"))?;
    let concurrent = t
        .annotations
        .as_ref()
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false);
    Ok(Arc::new(McpTool {
        definition,
        remote,
        endpoint: Arc::clone(endpoint),
        concurrent,
        timeout: endpoint.server.call_timeout_value(),
    }))
}

/// At most `max` characters of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => s[..at].to_owned(),
        None => s.to_owned(),
    }
}

/// Whether `data` looks like base64 (the alphabet, padding only at the end, whole quanta).
fn is_base64(data: &str) -> bool {
    let body = data.trim_end_matches('=');
    data.len().is_multiple_of(4)
        && data.len() - body.len() <= 2
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// One tool of a server.
pub(super) struct McpTool {
    definition: ToolDefinition,
    remote: String,
    endpoint: Arc<Endpoint>,
    concurrent: bool,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.definition.name)
            .field("server", &self.endpoint.server.name())
            .finish()
    }
}

impl McpTool {
    fn server(&self) -> &str {
        self.endpoint.server.name()
    }

    /// The is_error result for a failed call: names the server and the tool.
    async fn failure(&self, link: &Link, error: ServiceError) -> ToolOutput {
        let (server, tool) = (self.server(), &self.remote);
        let text = match error {
            ServiceError::McpError(e) => format!(
                "MCP server `{server}` answered `{tool}` with error {}: {}",
                e.code.0, e.message
            ),
            ServiceError::TransportClosed if self.endpoint.closed.load(Ordering::SeqCst) => {
                format!("MCP server `{server}` was closed by the host; `{tool}` did not run")
            }
            ServiceError::TransportClosed => {
                let tail = link.stderr.final_tail().await;
                let mut t = format!(
                    "MCP server `{server}` closed its connection before answering `{tool}` (did \
                     its process exit?)"
                );
                if !tail.is_empty() {
                    t.push_str(&format!("; its standard error ends: {tail}"));
                }
                t
            }
            ServiceError::UnexpectedResponse => format!(
                "MCP server `{server}` answered `{tool}` with something that is not a tool \
                 result"
            ),
            ServiceError::Timeout { timeout } => format!(
                "MCP server `{server}` did not answer `{tool}` within {}",
                crate::base::events::format_duration(timeout)
            ),
            other => format!("MCP server `{server}`: `{tool}` failed: {other}"),
        };
        ToolOutput::error(text)
    }

    fn output(&self, result: CallToolResult) -> ToolOutput {
        let mut blocks = Vec::new();
        let mut budget = MAX_OUTPUT_CHARS;
        let mut image_bytes = 0usize;
        let mut cut_note = false;
        let mut text = |s: String, blocks: &mut Vec<ContentBlock>| {
            if budget == 0 {
                if !cut_note && !s.is_empty() {
                    cut_note = true;
                    blocks.push(ContentBlock::text(format!(
                        "[output cut at {MAX_OUTPUT_CHARS} characters]"
                    )));
                }
                return;
            }
            let n = s.chars().count();
            if n <= budget {
                budget -= n;
                blocks.push(ContentBlock::text(s));
            } else {
                let kept = cut(&s, budget);
                budget = 0;
                cut_note = true;
                blocks.push(ContentBlock::text(format!(
                    "{kept}\n[output cut at {MAX_OUTPUT_CHARS} characters]"
                )));
            }
        };
        for block in result.content {
            match block {
                McpBlock::Text(t) => text(t.text, &mut blocks),
                McpBlock::Image(i)
                    if matches!(
                        i.mime_type.as_str(),
                        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
                    ) && is_base64(&i.data)
                        && image_bytes + i.data.len() <= MAX_IMAGE_BYTES =>
                {
                    image_bytes += i.data.len();
                    blocks.push(ContentBlock::Image {
                        source: ImageSource::Base64 {
                            media_type: i.mime_type,
                            data: i.data,
                        },
                    })
                }
                McpBlock::Image(i) => text(
                    format!(
                        "[an image ({}, {} bytes of base64) was left out: only valid png, jpeg, \
                         gif and webp images up to {MAX_IMAGE_BYTES} bytes in all pass]",
                        i.mime_type,
                        i.data.len()
                    ),
                    &mut blocks,
                ),
                McpBlock::Audio(a) => text(
                    format!("[audio of type {} was left out]", a.mime_type),
                    &mut blocks,
                ),
                McpBlock::Resource(r) => match r.resource {
                    ResourceContents::TextResourceContents { uri, text: t, .. } => {
                        text(format!("[resource {uri}]\n{t}"), &mut blocks)
                    }
                    ResourceContents::BlobResourceContents { uri, mime_type, .. } => text(
                        format!(
                            "[binary resource {uri} ({}) was left out]",
                            mime_type.as_deref().unwrap_or("unknown type")
                        ),
                        &mut blocks,
                    ),
                    _ => text(
                        "[a resource of an unknown kind was left out]".to_owned(),
                        &mut blocks,
                    ),
                },
                McpBlock::ResourceLink(l) => {
                    text(format!("[resource link {}]", l.uri), &mut blocks)
                }
                _ => text(
                    "[content of an unknown kind was left out]".to_owned(),
                    &mut blocks,
                ),
            }
        }
        if blocks.is_empty()
            && let Some(structured) = result.structured_content
        {
            text(structured.to_string(), &mut blocks);
        }
        if blocks.is_empty() {
            blocks.push(ContentBlock::text(String::new()));
        }
        ToolOutput {
            content: blocks,
            is_error: result.is_error == Some(true),
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }

    fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
        self.concurrent
    }

    /// Never: a server's own hints are not trusted for permission decisions.
    fn is_read_only(&self) -> bool {
        false
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// MCP tools are always available (Agent definitions, §9.5 layer 3).
    fn in_background(&self) -> InBackground {
        InBackground::Allowed
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = match input {
            serde_json::Value::Object(map) => Some(map),
            serde_json::Value::Null => None,
            other => {
                return ToolOutput::error(format!(
                    "`{}` takes an object of arguments, not {other}",
                    self.definition.name
                ));
            }
        };
        let link = match self.endpoint.ensure().await {
            Ok(link) => link,
            Err(why) => return ToolOutput::error(format!("{why}; `{}` did not run", self.remote)),
        };
        if link.peer.is_transport_closed() && !self.endpoint.closed.load(Ordering::SeqCst) {
            let mut text = format!(
                "MCP server `{}` is not connected any more (did its process exit?); `{}` did \
                 not run",
                self.server(),
                self.remote
            );
            let tail = link.stderr.final_tail().await;
            if !tail.is_empty() {
                text.push_str(&format!("; its standard error ends: {tail}"));
            }
            return ToolOutput::error(text);
        }
        match link.peer.call_tool(params).await {
            Ok(result) => self.output(result),
            Err(e) => self.failure(&link, e).await,
        }
    }
}

/// A tool a transcript names whose server is not connected now (a resumed agent's): its
/// definition, so the request's bytes stay the same, and an error result when called.
#[derive(Debug)]
pub(crate) struct Unavailable(pub(crate) ToolDefinition);

#[async_trait]
impl Tool for Unavailable {
    fn definition(&self) -> &ToolDefinition {
        &self.0
    }

    fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
        true
    }

    fn is_read_only(&self) -> bool {
        false
    }

    fn in_background(&self) -> InBackground {
        InBackground::Allowed
    }

    async fn call(&self, _: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        ToolOutput::error(format!(
            "`{}` belongs to an MCP server that is not connected now; it did not run",
            self.0.name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_the_end_at_a_character_boundary() {
        let mut buf = String::new();
        keep_tail(&mut buf, &"é".repeat(3000));
        assert!(buf.len() <= STDERR_TAIL && buf.len() >= STDERR_TAIL - 1);
        assert!(buf.chars().all(|c| c == 'é'));
        keep_tail(&mut buf, "end");
        assert!(buf.ends_with("end"));
    }

    #[test]
    fn base64_is_recognised() {
        assert!(is_base64("aGVsbG8="));
        assert!(is_base64(""));
        assert!(!is_base64("aGVsbG8"));
        assert!(!is_base64("not base64!"));
        assert!(!is_base64("a=bc"));
    }

    #[test]
    fn cut_counts_characters() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("hi", 5), "hi");
    }

    /// Calls queued behind an own server that cannot start wait out one connect timeout
    /// between them, not one each: the attempt that failed while they waited answers them.
    #[tokio::test(start_paused = true)]
    async fn calls_queued_behind_a_failing_connect_share_its_answer() {
        let timeout = Duration::from_secs(5);
        let endpoint = Arc::new(Endpoint {
            server: McpServer::stdio("slow", "sleep")
                .arg("600")
                .connect_timeout(timeout),
            own: true,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new((0, String::new())),
            failures: AtomicU64::new(0),
            holders: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
        });
        let begun = tokio::time::Instant::now();
        let all = futures::future::join_all((0..4).map(|_| endpoint.ensure())).await;
        assert_eq!(begun.elapsed(), timeout, "one attempt for all four");
        let errors: Vec<String> = all.into_iter().filter_map(Result::err).collect();
        assert_eq!(errors.len(), 4);
        assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
        // A later call tries again.
        let begun = tokio::time::Instant::now();
        assert!(endpoint.ensure().await.is_err());
        assert_eq!(begun.elapsed(), timeout);
        assert_eq!(endpoint.failures.load(Ordering::SeqCst), 2);
    }
}
