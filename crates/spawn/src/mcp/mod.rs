//! MCP servers as agents' tools (feature `mcp`, on by default), on `rmcp`, the Model Context
//! Protocol's official Rust SDK: stdio servers (a command this host starts) and streamable-HTTP
//! servers (a URL).
//!
//! - The host configures named servers in an [`McpHub`] and gives it to the main agent's
//!   builder ([`AgentBuilder::mcp`](crate::runtime::AgentBuilder::mcp)). The hub connects each
//!   server once; its tools join the main agent's pool and pass to every child — "MCP tools
//!   are always available" (Agent definitions, §9.5 layer 3), to background agents too — unless
//!   a disallow list names them.
//! - A server's tools are named `mcp__<server>__<tool>`; characters outside `A-Z a-z 0-9 _ -`
//!   become `_`, and a name longer than [`MAX_TOOL_NAME`] is left out. Their schemas are the
//!   server's, serialized once at connection (same server, same bytes: the prompt-cache key),
//!   and a pool lists them sorted by name.
//! - A definition's `mcpServers` names servers of the hub (the parent's connection, shared) or
//!   defines its own inline; an agent's own servers are connected when it is built and closed
//!   when the last agent using their tools ends, whatever ends it (Agent definitions, §9.6:
//!   "Closes agent-specific MCP server connections … non-specific connections are managed by
//!   the parent").
//! - `requiredMcpServers`: the spawn waits up to [`REQUIRED_WAIT`] for required servers still
//!   connecting, stops at once when one has failed, and refuses naming what is missing
//!   (Chapter 20, "MCP Server Waiting and Validation").
//! - Failures are results: a server that exits, hangs past the call's timeout, answers with a
//!   JSON-RPC error or with content that is not a tool result gives the model an `is_error`
//!   result naming the server and the tool; the agent goes on.

mod config;
mod tool;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use config::{McpServer, McpTransport};
pub(crate) use tool::{Holder, Unavailable, holders};

use crate::error::{Error, Result};
use crate::tool::Tool;

/// How long a spawn waits for an agent's `requiredMcpServers` still connecting (Chapter 20,
/// "MCP Server Waiting and Validation": 30 seconds).
pub const REQUIRED_WAIT: Duration = Duration::from_secs(30);

/// How long a server may take to start and answer `initialize` and `tools/list`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest tool name every backend accepts (Anthropic's and OpenAI's limit is 64); a
/// server's tool whose full name is longer is left out, with a warning in the log.
pub const MAX_TOOL_NAME: usize = 64;

/// The most text one MCP call gives the model (about Claude Code's 25,000-token default);
/// the rest is cut with a note.
pub const MAX_OUTPUT_CHARS: usize = 100_000;

/// Where a configured server stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpStatus {
    /// Not asked to connect yet.
    NotStarted,
    /// Starting, initializing or listing its tools.
    Connecting,
    /// Connected, with this many tools.
    Connected {
        /// How many tools it offers (after names that cannot be used are left out).
        tools: usize,
    },
    /// It could not be used; why.
    Failed(String),
    /// The hub was closed.
    Closed,
}

impl fmt::Display for McpStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McpStatus::NotStarted => f.write_str("not started"),
            McpStatus::Connecting => f.write_str("connecting"),
            McpStatus::Connected { tools: 1 } => f.write_str("connected, 1 tool"),
            McpStatus::Connected { tools } => write!(f, "connected, {tools} tools"),
            McpStatus::Failed(why) => write!(f, "failed: {why}"),
            McpStatus::Closed => f.write_str("closed"),
        }
    }
}

/// The state behind a status: a connection's tools when connected.
#[derive(Clone)]
enum State {
    NotStarted,
    Connecting,
    Connected(Arc<tool::Connected>),
    Failed(String),
    Closed,
}

impl State {
    fn status(&self) -> McpStatus {
        match self {
            State::NotStarted => McpStatus::NotStarted,
            State::Connecting => McpStatus::Connecting,
            State::Connected(c) if !c.endpoint.is_open() => McpStatus::Failed(gone(c)),
            State::Connected(c) => McpStatus::Connected {
                tools: c.tools.len(),
            },
            State::Failed(why) => McpStatus::Failed(why.clone()),
            State::Closed => McpStatus::Closed,
        }
    }
}

/// Why a server that was connected is not any more.
fn gone(c: &tool::Connected) -> String {
    let tail = c.endpoint.stderr_tail();
    let mut why = "its connection closed (did its process exit?)".to_owned();
    if !tail.is_empty() {
        why.push_str(&format!("; its standard error ends: {tail}"));
    }
    why
}

/// One configured server and where it stands.
struct Slot {
    server: McpServer,
    state: watch::Sender<State>,
}

/// The host's MCP servers: configured by name, each connected once, shared by every agent of
/// the tree (the builder puts the hub in the tree's extensions). Cheap to clone; the last
/// clone dropped stops connections still starting, and a connection closes when the hub and
/// every agent holding its tools are gone ([`close`](Self::close) closes them at once).
#[derive(Clone)]
pub struct McpHub {
    inner: Arc<Hub>,
}

struct Hub {
    slots: BTreeMap<String, Arc<Slot>>,
    required_wait: Duration,
    trust_definition_servers: bool,
    cancel: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl fmt::Debug for McpHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpHub")
            .field("servers", &self.status())
            .field("required_wait", &self.inner.required_wait)
            .finish()
    }
}

/// Builds an [`McpHub`].
#[derive(Debug, Default)]
pub struct McpHubBuilder {
    servers: Vec<McpServer>,
    /// Entries of a configuration file that cannot be used: name and why.
    invalid: Vec<(String, String)>,
    required_wait: Option<Duration>,
    trust_definition_servers: bool,
}

impl McpHubBuilder {
    /// Adds a server.
    pub fn server(mut self, server: McpServer) -> Self {
        self.servers.push(server);
        self
    }

    /// Adds every server of a Claude Code `.mcp.json` text (`{"mcpServers": {name: config}}`,
    /// or the bare `{name: config}` map); `${VAR}` and `${VAR:-default}` are expanded from the
    /// environment. An entry that cannot be used (an unknown transport, an unset variable) is
    /// that server's [`McpStatus::Failed`], and the others still connect; a text that is not
    /// such a file is an error. `origin` names the text in errors (a path, say).
    pub fn servers_json(mut self, text: &str, origin: &str) -> Result<Self> {
        for (name, server) in config::parse_file(text, origin)? {
            match server {
                Ok(server) => self.servers.push(server),
                Err(why) => self.invalid.push((name, why)),
            }
        }
        Ok(self)
    }

    /// How long a spawn waits for `requiredMcpServers` still connecting (default
    /// [`REQUIRED_WAIT`]).
    pub fn required_wait(mut self, wait: Duration) -> Self {
        self.required_wait = Some(wait);
        self
    }

    /// Whether definitions from the project, a plugin or the command line may start servers
    /// of their own (inline `mcpServers` entries run commands or reach URLs the repository
    /// chose; default: no — they are left out with a warning). Definitions of the built-ins,
    /// the host, the user and a policy always may.
    pub fn trust_definition_servers(mut self, trust: bool) -> Self {
        self.trust_definition_servers = trust;
        self
    }

    /// The hub. Fails when a name is empty or holds `__` (tool names are
    /// `mcp__<server>__<tool>`), or two servers share a name once normalized (`a.b` and `a_b`
    /// would share their tools' names).
    pub fn build(self) -> Result<McpHub> {
        let mut slots = BTreeMap::new();
        let invalid = self.invalid.into_iter().map(|(name, why)| {
            // A placeholder that never connects: its state is already `Failed`.
            (McpServer::stdio(name, String::new()), Some(why))
        });
        for (server, failed) in self.servers.into_iter().map(|s| (s, None)).chain(invalid) {
            // A file's server that no tool can be named under is already that server's
            // `Failed` (it never connects); one given in code is the host's mistake.
            if let Some(why) = config::name_problem(server.name())
                && failed.is_none()
            {
                return Err(Error::Mcp {
                    server: server.name().to_owned(),
                    message: why.to_owned(),
                });
            }
            let key = normalize(server.name());
            if let Some(other) = slots
                .get(&key)
                .map(|s: &Arc<Slot>| s.server.name().to_owned())
            {
                return Err(Error::Mcp {
                    server: server.name().to_owned(),
                    message: format!(
                        "configured twice (as `{other}` and `{}`); its tools would be named \
                         `mcp__{key}__…` either way",
                        server.name()
                    ),
                });
            }
            let (state, _) = watch::channel(match failed {
                Some(why) => State::Failed(why),
                None => State::NotStarted,
            });
            slots.insert(key, Arc::new(Slot { server, state }));
        }
        Ok(McpHub {
            inner: Arc::new(Hub {
                slots,
                required_wait: self.required_wait.unwrap_or(REQUIRED_WAIT),
                trust_definition_servers: self.trust_definition_servers,
                cancel: CancellationToken::new(),
            }),
        })
    }
}

impl McpHub {
    /// A builder.
    pub fn builder() -> McpHubBuilder {
        McpHubBuilder::default()
    }

    /// Starts connecting every server not started yet, in the background; returns at once.
    /// Outside a Tokio runtime nothing can run: each server not started yet is
    /// [`McpStatus::Failed`] saying so.
    pub fn connect(&self) {
        for slot in self.inner.slots.values() {
            self.start(slot);
        }
    }

    fn start(&self, slot: &Arc<Slot>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            slot.state.send_if_modified(|s| match s {
                State::NotStarted => {
                    *s = State::Failed("it was asked to connect outside a Tokio runtime".into());
                    true
                }
                _ => false,
            });
            return;
        };
        let started = slot.state.send_if_modified(|s| match s {
            State::NotStarted => {
                *s = State::Connecting;
                true
            }
            _ => false,
        });
        if !started {
            return;
        }
        let slot = Arc::clone(slot);
        let cancel = self.inner.cancel.clone();
        // Owned by the hub: its token ends it when the hub is closed or dropped; otherwise it
        // ends within the server's connect timeout.
        runtime.spawn(async move {
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                r = tool::connect(&slot.server, false) => Some(r),
            };
            let state = match outcome {
                Some(Ok(c)) => State::Connected(Arc::new(c)),
                Some(Err(why)) => {
                    tracing::warn!(server = %slot.server.name(), "MCP server failed: {why}");
                    State::Failed(why)
                }
                None => State::Closed,
            };
            slot.state.send_modify(|s| {
                if !matches!(s, State::Closed) {
                    *s = state;
                }
            });
        });
    }

    /// Every server's status, by configured name.
    pub fn status(&self) -> BTreeMap<String, McpStatus> {
        self.inner
            .slots
            .values()
            .map(|s| (s.server.name().to_owned(), s.state.borrow().status()))
            .collect()
    }

    /// The names of the configured servers.
    pub fn names(&self) -> Vec<String> {
        self.inner
            .slots
            .values()
            .map(|s| s.server.name().to_owned())
            .collect()
    }

    /// Connects every server (if not yet), waits until each is connected or has failed, and
    /// returns the connected servers' tools, sorted by name. A failed server is left out (see
    /// [`status`](Self::status)).
    pub async fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.connect();
        let mut tools = Vec::new();
        for slot in self.inner.slots.values() {
            if let State::Connected(c) = settled(slot).await {
                tools.extend(c.tools.iter().cloned());
            }
        }
        tools.sort_by(|a, b| a.definition().name.cmp(&b.definition().name));
        tools
    }

    /// The tools of one configured server (by name as configured or normalized), connecting it
    /// if need be: `Ok(None)` when the hub has no such server.
    pub(crate) async fn server_tools(
        &self,
        name: &str,
    ) -> Option<std::result::Result<Arc<[Arc<dyn Tool>]>, String>> {
        let slot = self.slot(name)?;
        self.start(slot);
        Some(match settled(slot).await {
            State::Connected(c) if !c.endpoint.is_open() => Err(gone(&c)),
            State::Connected(c) => Ok(Arc::clone(&c.tools)),
            State::Failed(why) => Err(why),
            _ => Err("the hub was closed".to_owned()),
        })
    }

    fn slot(&self, name: &str) -> Option<&Arc<Slot>> {
        self.inner.slots.get(&normalize(name))
    }

    /// Waits for the named servers: up to the hub's required wait for those still connecting,
    /// no longer once one has failed (or one is not configured at all: the spawn is refused
    /// anyway). Returns what is missing, in the order asked, each with why.
    pub(crate) async fn require(&self, names: &[String]) -> Vec<(String, String)> {
        let deadline = tokio::time::Instant::now() + self.inner.required_wait;
        let mut asked: Vec<(String, Option<watch::Receiver<State>>)> = Vec::new();
        for name in names {
            let rx = self.slot(name).map(|slot| {
                self.start(slot);
                slot.state.subscribe()
            });
            asked.push((name.clone(), rx));
        }
        let mut timed_out = false;
        if asked.iter().all(|(_, rx)| rx.is_some()) {
            loop {
                let states: Vec<State> = asked
                    .iter()
                    .filter_map(|(_, rx)| rx.as_ref().map(|rx| rx.borrow().clone()))
                    .collect();
                let failed = states.iter().any(|s| match s {
                    State::Failed(_) | State::Closed => true,
                    State::Connected(c) => !c.endpoint.is_open(),
                    _ => false,
                });
                let waiting = states
                    .iter()
                    .any(|s| matches!(s, State::NotStarted | State::Connecting));
                if failed || !waiting {
                    break;
                }
                let changed = futures::future::select_all(
                    asked
                        .iter_mut()
                        .filter_map(|(_, rx)| rx.as_mut())
                        .map(|rx| Box::pin(rx.changed())),
                );
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    timed_out = true;
                    break;
                }
            }
        }
        let wait = crate::base::events::format_duration(self.inner.required_wait);
        asked
            .into_iter()
            .filter_map(|(name, rx)| {
                let why = match rx.map(|rx| rx.borrow().clone()) {
                    None => "not configured".to_owned(),
                    Some(State::Connected(c)) if !c.endpoint.is_open() => {
                        format!("failed: {}", gone(&c))
                    }
                    Some(State::Connected(_)) => return None,
                    Some(State::Failed(why)) => format!("failed: {why}"),
                    Some(State::Closed) => "the hub was closed".to_owned(),
                    Some(State::NotStarted | State::Connecting) if timed_out => {
                        format!("still connecting after {wait}")
                    }
                    Some(State::NotStarted | State::Connecting) => "still connecting".to_owned(),
                };
                Some((name, why))
            })
            .collect()
    }

    /// Whether definitions from untrusted sources may start servers of their own.
    pub(crate) fn trusts_definition_servers(&self) -> bool {
        self.inner.trust_definition_servers
    }

    /// Closes every connection, all at once, and stops those still starting: a stdio
    /// server's process group is killed once its connection is closed (or after 2 s). Agents
    /// holding a closed server's tools get an error result naming it when they call one.
    /// Definitions' own servers are their agents', not the hub's: they are left alone.
    pub async fn close(&self) {
        self.inner.cancel.cancel();
        let closing = self.inner.slots.values().filter_map(|slot| {
            match slot.state.send_replace(State::Closed) {
                State::Connected(c) => Some(async move { c.endpoint.close().await }),
                _ => None,
            }
        });
        futures::future::join_all(closing).await;
    }

    /// The tools each connected server offered that were left out (a name too long or taken
    /// twice, a schema too large or not a JSON Schema), as `(server, why)`.
    pub fn left_out(&self) -> Vec<(String, String)> {
        self.inner
            .slots
            .values()
            .flat_map(|slot| match &*slot.state.borrow() {
                State::Connected(c) => c
                    .left_out
                    .iter()
                    .map(|why| (slot.server.name().to_owned(), why.clone()))
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// Whether two handles are the same hub.
    pub(crate) fn same(&self, other: &McpHub) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Waits until a slot is no longer connecting, and returns its state.
async fn settled(slot: &Slot) -> State {
    let mut rx = slot.state.subscribe();
    match rx
        .wait_for(|s| !matches!(s, State::Connecting | State::NotStarted))
        .await
    {
        Ok(s) => s.clone(),
        Err(_) => State::Closed,
    }
}

/// A name as it appears in a tool's name: characters outside `A-Z a-z 0-9 _ -` become `_`.
pub fn normalize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// What a definition's `mcpServers` and `requiredMcpServers` give an agent: the servers' tools
/// (its own servers' connections are owned by their tools), and a warning for each server it
/// names that it will not have. Err when a required server is missing: the agent must not
/// start.
pub(crate) async fn for_definition(
    d: &crate::definition::AgentDefinition,
    hub: Option<&McpHub>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Arc<dyn Tool>>> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut own_ok: Vec<String> = Vec::new();
    let trusted = hub.is_some_and(McpHub::trusts_definition_servers)
        || crate::definition::trusted_source(d.source);
    for entry in &d.mcp_servers {
        for (name, inline) in config::entries(entry) {
            match inline {
                None => match hub.map(|h| (h, h.slot(&name).is_some())) {
                    Some((h, true)) => match h.server_tools(&name).await {
                        Some(Ok(t)) => {
                            tools.extend(t.iter().cloned());
                            own_ok.push(name);
                        }
                        Some(Err(why)) => warnings.push(format!(
                            "agent `{}`: MCP server `{name}` cannot be used ({why}); it runs \
                             without its tools",
                            d.name
                        )),
                        None => {}
                    },
                    _ => warnings.push(format!(
                        "agent `{}` names MCP server `{name}`, which this host has not \
                         configured (McpHub); it runs without its tools",
                        d.name
                    )),
                },
                Some(cfg) if !trusted => {
                    let _ = cfg;
                    warnings.push(format!(
                        "agent `{}` defines its own MCP server `{name}`; this host does not start \
                         the servers of {} definitions (McpHubBuilder::trust_definition_servers), \
                         so it runs without it",
                        d.name, d.source
                    ));
                }
                Some(cfg) => {
                    let connected = match McpServer::from_json(&name, &cfg) {
                        Ok(server) => tool::connect(&server, true).await,
                        Err(Error::Mcp { message, .. }) => Err(message),
                        Err(e) => Err(e.to_string()),
                    };
                    match connected {
                        Ok(c) => {
                            for why in &c.left_out {
                                warnings.push(format!(
                                    "agent `{}`: MCP server `{name}` offers a tool that was left \
                                     out: {why}",
                                    d.name
                                ));
                            }
                            tools.extend(c.tools.iter().cloned());
                            own_ok.push(name);
                        }
                        Err(why) => warnings.push(format!(
                            "agent `{}`: its MCP server `{name}` cannot be used ({why}); it runs \
                             without its tools",
                            d.name
                        )),
                    }
                }
            }
        }
    }
    if let Some(required) = d.extra.get("requiredMcpServers") {
        let names: Vec<String> = config::entries(required)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let others: Vec<String> = names
            .iter()
            .filter(|n| !own_ok.iter().any(|o| normalize(o) == normalize(n)))
            .cloned()
            .collect();
        let missing = match hub {
            Some(h) if !others.is_empty() => h.require(&others).await,
            _ => others
                .into_iter()
                .map(|n| (n, "not configured".to_owned()))
                .collect(),
        };
        if !missing.is_empty() {
            return Err(Error::Config(format!(
                "agent `{}` requires MCP servers that are not available: {}; it was not started",
                d.name,
                missing
                    .iter()
                    .map(|(n, why)| format!("`{n}` ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    // The definition's disallow list applies to the servers it brings, as to the pool's.
    if let Some(denied) = &d.disallowed_tools {
        tools.retain(|t| !crate::tool::filter::denied(denied, &t.definition().name));
    }
    tools.sort_by(|a, b| a.definition().name.cmp(&b.definition().name));
    tools.dedup_by(|a, b| a.definition().name == b.definition().name);
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_as_claude_code_does() {
        assert_eq!(normalize("github"), "github");
        assert_eq!(normalize("my.server v2"), "my_server_v2");
        assert_eq!(normalize("plugin:x:y"), "plugin_x_y");
        assert_eq!(normalize("a-b_c9"), "a-b_c9");
    }

    #[test]
    fn two_servers_with_one_normalized_name_are_refused() {
        let e = McpHub::builder()
            .server(McpServer::stdio("a.b", "x"))
            .server(McpServer::stdio("a_b", "y"))
            .build()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "MCP server `a_b`: configured twice (as `a.b` and `a_b`); its tools would be \
                 named `mcp__a_b__…` either way"
            )
        );
    }

    /// A `.mcp.json` server whose name no tool can be named under fails alone: the hub is
    /// built, the file's other servers stay, and its status names the file.
    #[tokio::test]
    async fn a_file_server_with_an_unusable_name_fails_alone() {
        let text =
            r#"{"mcpServers": {"ok": {"command": "/nonexistent/ok"}, "bad__x": {"command": "y"}}}"#;
        let hub = McpHub::builder()
            .servers_json(text, "/p/.mcp.json")
            .and_then(McpHubBuilder::build)
            .map_err(|e| e.to_string());
        let Ok(hub) = hub else { panic!("{hub:?}") };
        let status = hub.status();
        assert_eq!(
            status.get("bad__x"),
            Some(&McpStatus::Failed(
                "/p/.mcp.json: a server's name must not be empty or hold `__` (its tools are \
                 named `mcp__<server>__<tool>`)"
                    .to_owned()
            ))
        );
        assert!(status.contains_key("ok"), "{status:?}");
        // Given in code, the same name is the host's mistake.
        let err = McpHub::builder()
            .server(McpServer::stdio("bad__x", "y"))
            .build()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "MCP server `bad__x`: a server's name must not be empty or hold `__` (its tools \
                 are named `mcp__<server>__<tool>`)"
            )
        );
    }

    /// Why a server did not start names what was wrong: a working directory that is not
    /// there (not the command, which the OS's "No such file" suggests), a process that closed
    /// its connection before the handshake, a refused HTTP connection (without rmcp's
    /// transport type names).
    #[tokio::test]
    async fn why_a_server_did_not_start_names_what_was_wrong() {
        let hub = McpHub::builder()
            .server(McpServer::stdio("badcwd", "sh").cwd("/nonexistent/forkhive-dir"))
            .server(McpServer::stdio("exits", "true"))
            .server(McpServer::http("refused", "http://127.0.0.1:9/mcp"))
            .build()
            .map_err(|e| e.to_string());
        let Ok(hub) = hub else { panic!("{hub:?}") };
        assert!(hub.tools().await.is_empty());
        let status = hub.status();
        let why = |name: &str| match status.get(name) {
            Some(McpStatus::Failed(why)) => why.clone(),
            other => panic!("{name}: {other:?}"),
        };
        assert!(
            why("badcwd").starts_with(
                "could not start `sh`: its working directory /nonexistent/forkhive-dir is not a \
                 directory ("
            ),
            "{}",
            why("badcwd")
        );
        assert_eq!(
            why("exits"),
            "did not complete the MCP handshake: its connection closed before it answered \
             `initialize` (did its process exit?)"
        );
        let refused = why("refused");
        assert!(
            refused.starts_with("did not complete the MCP handshake at http://127.0.0.1:9/mcp: ")
                && refused.contains("Connection refused")
                && !refused.contains("rmcp::"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_server_that_cannot_start_fails_and_is_left_out() {
        let hub = McpHub::builder()
            .server(McpServer::stdio("gone", "/nonexistent/forkhive-mcp-server"))
            .build()
            .map_err(|e| e.to_string());
        let Ok(hub) = hub else { panic!("{hub:?}") };
        assert!(hub.tools().await.is_empty());
        let status = hub.status();
        match status.get("gone") {
            Some(McpStatus::Failed(why)) => assert!(
                why.starts_with("could not start `/nonexistent/forkhive-mcp-server`"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn required_servers_stop_waiting_at_the_first_failure() {
        let hub = McpHub::builder()
            .server(McpServer::stdio("bad", "/nonexistent/forkhive-mcp-server"))
            // A server that never answers: only the failure of `bad` ends the wait.
            .server(McpServer::stdio("slow", "sleep").arg("600"))
            .required_wait(Duration::from_secs(600))
            .build();
        let Ok(hub) = hub else { panic!() };
        let started = std::time::Instant::now();
        let missing = hub.require(&["slow".into(), "bad".into()]).await;
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(missing.len(), 2);
        assert_eq!(
            missing[0],
            ("slow".to_owned(), "still connecting".to_owned())
        );
        assert_eq!(missing[1].0, "bad");
        assert!(
            missing[1].1.starts_with("failed: could not start"),
            "{:?}",
            missing
        );
        hub.close().await;
        assert_eq!(hub.status().get("slow"), Some(&McpStatus::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn required_servers_still_connecting_are_named_after_the_wait() {
        let hub = McpHub::builder()
            .server(McpServer::stdio("slow", "sleep").arg("600"))
            .required_wait(Duration::from_secs(2))
            .build();
        let Ok(hub) = hub else { panic!() };
        let missing = hub.require(&["slow".into(), "absent".into()]).await;
        assert_eq!(
            missing,
            vec![
                ("slow".to_owned(), "still connecting".to_owned()),
                ("absent".to_owned(), "not configured".to_owned())
            ]
        );
        let missing = hub.require(&["slow".into()]).await;
        assert_eq!(
            missing,
            vec![("slow".to_owned(), "still connecting after 2s".to_owned())]
        );
    }
}
