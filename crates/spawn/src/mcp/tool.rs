//! A connection to one server, and its tools as [`Tool`]s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{ContentBlock, ImageSource, ToolDefinition};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock as McpBlock, ResourceContents,
};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceError, ServiceExt};
use tokio::io::AsyncBufReadExt;

use super::config::{McpServer, McpTransport};
use super::{MAX_OUTPUT_CHARS, MAX_TOOL_NAME, normalize};
use crate::tool::{InBackground, Tool, ToolContext, ToolOutput};

/// The most of a server's standard error kept to explain a failure.
const STDERR_TAIL: usize = 2048;

/// A connected server: its link and its tools (each holding the link).
pub(super) struct Connected {
    link: Arc<Link>,
    pub(super) tools: Arc<[Arc<dyn Tool>]>,
}

impl Connected {
    /// Closes the connection now (tools still held elsewhere then fail with a result naming
    /// the server).
    pub(super) async fn close(&self) {
        let service = self.link.service.lock().await.take();
        if let Some(mut service) = service {
            let _ = service.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
}

/// One live connection. Dropping it closes the connection (and kills a stdio server).
struct Link {
    server: String,
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ()>>>,
    stderr: Arc<Mutex<String>>,
}

impl Link {
    fn stderr_tail(&self) -> String {
        tail_of(&self.stderr)
    }
}

fn tail_of(stderr: &Mutex<String>) -> String {
    stderr
        .lock()
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Connects to a server and lists its tools; Err says why, for the host's status and the
/// agent's warnings.
pub(super) async fn connect(server: &McpServer) -> Result<Connected, String> {
    let stderr = Arc::new(Mutex::new(String::new()));
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
            // Its own process group, killed with the connection: a server started through
            // `npx` or a shell leaves no grandchild behind.
            #[cfg(unix)]
            wrap.wrap(process_wrap::tokio::ProcessGroup::leader());
            wrap.wrap(process_wrap::tokio::KillOnDrop);
            let (transport, err) = rmcp::transport::TokioChildProcess::builder(wrap)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not start `{command}`: {e}"))?;
            if let Some(err) = err {
                // Ends when the process closes its standard error (it exits or is killed).
                let (buf, name) = (Arc::clone(&stderr), server.name().to_owned());
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(err).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::debug!(server = %name, "MCP server stderr: {line}");
                        if let Ok(mut b) = buf.lock() {
                            b.push_str(&line);
                            b.push('\n');
                            if b.len() > STDERR_TAIL {
                                let cut = b.len() - STDERR_TAIL;
                                let cut =
                                    (cut..b.len()).find(|i| b.is_char_boundary(*i)).unwrap_or(0);
                                b.drain(..cut);
                            }
                        }
                    }
                });
            }
            ().serve(transport).await.map_err(|e| {
                with_stderr(format!("did not complete the MCP handshake: {e}"), &stderr)
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
                .build()
                .map_err(|e| format!("could not build the HTTP client: {e}"))?;
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            let transport =
                rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
            ().serve(transport)
                .await
                .map_err(|e| format!("did not complete the MCP handshake at {url}: {e}"))?
        }
    };
    let peer = service.peer().clone();
    let listed = peer
        .list_all_tools()
        .await
        .map_err(|e| with_stderr(format!("could not list its tools: {e}"), &stderr))?;
    let link = Arc::new(Link {
        server: server.name().to_owned(),
        peer,
        service: tokio::sync::Mutex::new(Some(service)),
        stderr,
    });
    let server_key = normalize(server.name());
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for t in listed {
        let name = format!("mcp__{server_key}__{}", normalize(&t.name));
        if name.len() > MAX_TOOL_NAME {
            tracing::warn!(server = %server.name(), tool = %t.name, "MCP tool left out: its name `{name}` is longer than {MAX_TOOL_NAME} characters");
            continue;
        }
        if !seen.insert(name.clone()) {
            tracing::warn!(server = %server.name(), tool = %t.name, "MCP tool left out: another of its tools is also named `{name}`");
            continue;
        }
        // The server's schema, serialized once: every agent offered this tool sends the same
        // bytes (the prompt-cache key).
        let schema = serde_json::to_string(&*t.input_schema)
            .map_err(|e| format!("tool `{}` has a schema that is not JSON: {e}", t.name))?;
        let description = t.description.as_deref().unwrap_or_default();
        let definition = ToolDefinition::new(name, cut(description, 2048), &schema)
            .map_err(|e| format!("tool `{}`: {e}", t.name))?;
        let concurrent = t
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        tools.push(Arc::new(McpTool {
            definition,
            remote: t.name.to_string(),
            link: Arc::clone(&link),
            concurrent,
            timeout: server.call_timeout_value(),
        }));
    }
    tools.sort_by(|a, b| a.definition().name.cmp(&b.definition().name));
    Ok(Connected {
        link,
        tools: tools.into(),
    })
}

fn with_stderr(message: String, stderr: &Mutex<String>) -> String {
    let tail = tail_of(stderr);
    if tail.is_empty() {
        message
    } else {
        format!("{message}; its standard error ends: {tail}")
    }
}

/// At most `max` characters of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => s[..at].to_owned(),
        None => s.to_owned(),
    }
}

/// One tool of a server.
pub(super) struct McpTool {
    definition: ToolDefinition,
    remote: String,
    link: Arc<Link>,
    concurrent: bool,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.definition.name)
            .field("server", &self.link.server)
            .finish()
    }
}

impl McpTool {
    /// The is_error result for a failed call: names the server and the tool.
    fn failure(&self, error: ServiceError) -> ToolOutput {
        let (server, tool) = (&self.link.server, &self.remote);
        let text = match error {
            ServiceError::McpError(e) => format!(
                "MCP server `{server}` answered `{tool}` with error {}: {}",
                e.code.0, e.message
            ),
            ServiceError::TransportClosed => {
                let tail = self.link.stderr_tail();
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
        let mut text = |s: String, blocks: &mut Vec<ContentBlock>| {
            if budget == 0 {
                return;
            }
            let n = s.chars().count();
            if n <= budget {
                budget -= n;
                blocks.push(ContentBlock::text(s));
            } else {
                let kept = cut(&s, budget);
                budget = 0;
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
                    ) =>
                {
                    blocks.push(ContentBlock::Image {
                        source: ImageSource::Base64 {
                            media_type: i.mime_type,
                            data: i.data,
                        },
                    })
                }
                McpBlock::Image(i) => text(
                    format!("[an image of type {} was left out]", i.mime_type),
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

    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        if self.link.peer.is_transport_closed() {
            return self.failure(ServiceError::TransportClosed);
        }
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
        match self.link.peer.call_tool(params).await {
            Ok(result) => self.output(result),
            Err(e) => self.failure(e),
        }
    }
}
