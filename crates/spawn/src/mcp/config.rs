//! A server's configuration: built in code, or read from Claude Code's JSON (`.mcp.json`, a
//! definition's inline `mcpServers` entry).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

/// How this host reaches a server.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpTransport {
    /// A command this host starts, speaking JSON-RPC on its standard input and output.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the host's environment.
        env: BTreeMap<String, String>,
        /// Its working directory (default: the host's).
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// The endpoint's URL.
        url: String,
        /// Headers sent with every request (credentials, often).
        headers: BTreeMap<String, String>,
    },
}

impl fmt::Debug for McpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment and header values often carry credentials: only their names are shown.
        match self {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                // Arguments may carry tokens (`--token x`): only how many there are.
                .field("args", &args.len())
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            McpTransport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", &redacted_url(url))
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// One named MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    name: String,
    transport: McpTransport,
    connect_timeout: Duration,
    call_timeout: Option<Duration>,
}

impl McpServer {
    /// A server this host starts: `command`, speaking MCP over its standard input and output.
    pub fn stdio(name: impl Into<String>, command: impl Into<String>) -> Self {
        Self::new(
            name,
            McpTransport::Stdio {
                command: command.into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                cwd: None,
            },
        )
    }

    /// A server at a streamable-HTTP `url`.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(
            name,
            McpTransport::Http {
                url: url.into(),
                headers: BTreeMap::new(),
            },
        )
    }

    fn new(name: impl Into<String>, transport: McpTransport) -> Self {
        Self {
            name: name.into(),
            transport,
            connect_timeout: super::CONNECT_TIMEOUT,
            call_timeout: None,
        }
    }

    /// Adds an argument (stdio servers; ignored for HTTP).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        if let McpTransport::Stdio { args, .. } = &mut self.transport {
            args.push(arg.into());
        }
        self
    }

    /// Adds arguments (stdio servers; ignored for HTTP).
    pub fn args(self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        args.into_iter().fold(self, |s, a| s.arg(a))
    }

    /// Sets an environment variable of the server's process (stdio servers).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpTransport::Stdio { env, .. } = &mut self.transport {
            env.insert(key.into(), value.into());
        }
        self
    }

    /// The server process's working directory (stdio servers).
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        if let McpTransport::Stdio { cwd, .. } = &mut self.transport {
            *cwd = Some(dir.into());
        }
        self
    }

    /// Adds a header to every request (HTTP servers).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpTransport::Http { headers, .. } = &mut self.transport {
            headers.insert(name.into(), value.into());
        }
        self
    }

    /// How long starting (`initialize`, `tools/list`) may take (default
    /// [`CONNECT_TIMEOUT`](super::CONNECT_TIMEOUT)).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one tool call may take (default: the agent's `Limits::tool_timeout`).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// The server's name as configured.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it is reached.
    pub fn transport(&self) -> &McpTransport {
        &self.transport
    }

    pub(crate) fn connect_timeout_value(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn call_timeout_value(&self) -> Option<Duration> {
        self.call_timeout
    }

    /// A server from Claude Code's JSON for one entry of `mcpServers`: `{"command", "args",
    /// "env"}` (or `"type": "stdio"`), or `{"type": "http", "url", "headers"}`. `${VAR}` and
    /// `${VAR:-default}` are expanded from the environment in every string.
    pub fn from_json(name: &str, value: &Value) -> Result<Self> {
        let bad = |message: String| Error::Mcp {
            server: name.to_owned(),
            message,
        };
        let obj = value.as_object().ok_or_else(|| {
            bad(format!(
                "its configuration should be an object, not {value}"
            ))
        })?;
        let text = |key: &str| -> Result<Option<String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => expand(s)
                    .map(Some)
                    .map_err(|m| bad(format!("`{key}`: {m}"))),
                Some(other) => Err(bad(format!("`{key}` should be a string, not {other}"))),
            }
        };
        let map = |key: &str| -> Result<BTreeMap<String, String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => expand(s)
                            .map(|s| (k.clone(), s))
                            .map_err(|m| bad(format!("`{key}.{k}`: {m}"))),
                        other => Err(bad(format!("`{key}.{k}` should be a string, not {other}"))),
                    })
                    .collect(),
                Some(other) => Err(bad(format!("`{key}` should be an object, not {other}"))),
            }
        };
        let kind = text("type")?;
        let url = text("url")?;
        let command = text("command")?;
        let transport = match (kind.as_deref(), command, url) {
            (Some("stdio") | None, Some(command), _) => {
                let args = match obj.get("args") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(a)) => a
                        .iter()
                        .enumerate()
                        .map(|(i, v)| match v {
                            Value::String(s) => {
                                expand(s).map_err(|m| bad(format!("`args[{i}]`: {m}")))
                            }
                            other => {
                                Err(bad(format!("`args[{i}]` should be a string, not {other}")))
                            }
                        })
                        .collect::<Result<_>>()?,
                    Some(other) => Err(bad(format!("`args` should be a list, not {other}")))?,
                };
                McpTransport::Stdio {
                    command,
                    args,
                    env: map("env")?,
                    cwd: text("cwd")?.map(PathBuf::from),
                }
            }
            (Some("http" | "streamable-http") | None, None, Some(url)) => McpTransport::Http {
                url,
                headers: map("headers")?,
            },
            (Some(t @ ("sse" | "ws" | "sdk")), _, _) => {
                return Err(bad(format!(
                    "transport `{t}` is not supported; this host speaks stdio and streamable \
                     HTTP (`\"type\": \"http\"`)"
                )));
            }
            (Some("stdio") | None, None, None) => {
                return Err(bad(
                    "has neither `command` (stdio) nor `url` (http)".to_owned()
                ));
            }
            (Some("http" | "streamable-http"), Some(_), None) => {
                return Err(bad("is `type: http` but has no `url`".to_owned()));
            }
            (Some("stdio"), None, Some(_)) => {
                return Err(bad("is `type: stdio` but has no `command`".to_owned()));
            }
            (Some(other), _, _) => {
                return Err(bad(format!(
                    "unknown transport `{other}`; expected `stdio` or `http`"
                )));
            }
        };
        Ok(Self::new(name, transport))
    }
}

/// A URL without what may carry a secret: its user information and its query.
pub(crate) fn redacted_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, _)) => (b, "?…"),
        None => (url, ""),
    };
    match base.split_once("://") {
        Some((scheme, rest)) => {
            let host = match rest.split_once('/') {
                Some((authority, path)) => {
                    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                    format!("{authority}/{path}")
                }
                None => rest.rsplit_once('@').map_or(rest, |(_, h)| h).to_owned(),
            };
            format!("{scheme}://{host}{query}")
        }
        None => format!("{base}{query}"),
    }
}

/// Expands `${VAR}` and `${VAR:-default}` from the environment, as Claude Code does in
/// `.mcp.json`; a variable that is not set and has no default is an error.
fn expand(s: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("`${{` without a closing `}}` in {s:?}"));
        };
        let inner = &after[..end];
        let (var, default) = match inner.split_once(":-") {
            Some((v, d)) => (v, Some(d)),
            None => (inner, None),
        };
        match (std::env::var(var), default) {
            (Ok(v), _) => out.push_str(&v),
            (Err(_), Some(d)) => out.push_str(d),
            (Err(_), None) => {
                return Err(format!(
                    "environment variable `{var}` is not set and has no default"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every server of a `.mcp.json` text (`{"mcpServers": {...}}` or the bare map), in name
/// order: each one's configuration, or why it cannot be used (one bad entry does not take the
/// others down). Err only when the text is not such a file at all.
pub(super) fn parse_file(
    text: &str,
    origin: &str,
) -> Result<Vec<(String, std::result::Result<McpServer, String>)>> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::Config(format!("MCP configuration {origin}: not JSON: {e}")))?;
    let map = match value.get("mcpServers") {
        Some(m) => m,
        // VS Code's `.vscode/mcp.json` keeps its servers under `servers`: read as servers by
        // name, the file would be one server called `servers` that fails for want of a
        // command, and the mistake would be named nowhere.
        None if value.get("servers").is_some_and(Value::is_object) => {
            return Err(Error::Config(format!(
                "MCP configuration {origin}: its servers are under `servers`, as VS Code writes \
                 them; this reads Claude Code's `.mcp.json`, whose servers are under \
                 `mcpServers` (rename the key)"
            )));
        }
        None => &value,
    };
    let Some(map) = map.as_object() else {
        return Err(Error::Config(format!(
            "MCP configuration {origin}: `mcpServers` should be an object of servers by name"
        )));
    };
    Ok(map
        .iter()
        .map(|(n, v)| {
            // Said where it came from: a status read later names no file otherwise.
            let server = McpServer::from_json(n, v)
                .and_then(|s| match name_problem(n) {
                    Some(why) => Err(Error::Mcp {
                        server: n.clone(),
                        message: why.to_owned(),
                    }),
                    None => Ok(s),
                })
                .map_err(|e| {
                    let why = match e {
                        Error::Mcp { message, .. } => message,
                        other => other.to_string(),
                    };
                    format!("{origin}: {why}")
                });
            (n.clone(), server)
        })
        .collect())
}

/// Why `name` cannot name a server, if it cannot: its tools are `mcp__<server>__<tool>`.
pub(super) fn name_problem(name: &str) -> Option<&'static str> {
    (name.is_empty() || name.contains("__")).then_some(
        "a server's name must not be empty or hold `__` (its tools are named \
         `mcp__<server>__<tool>`)",
    )
}

/// The servers one entry of a definition's `mcpServers` (or `requiredMcpServers`) names: a
/// string names a configured server; an object defines servers inline (`{name: config}`);
/// a list holds either.
pub(super) fn entries(value: &Value) -> Vec<(String, Option<Value>)> {
    match value {
        Value::String(s) => vec![(s.clone(), None)],
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect(),
        Value::Array(a) => a.iter().flat_map(entries).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(name: &str, v: Value) -> String {
        match McpServer::from_json(name, &v) {
            Ok(s) => panic!("{s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn claude_code_entries_are_read() {
        let s = McpServer::from_json(
            "fs",
            &json!({"command": "npx", "args": ["-y", "srv"], "env": {"K": "v"}}),
        );
        assert_eq!(
            s.ok(),
            Some(
                McpServer::stdio("fs", "npx")
                    .args(["-y", "srv"])
                    .env("K", "v")
            )
        );
        let s = McpServer::from_json(
            "api",
            &json!({"type": "http", "url": "https://x/mcp", "headers": {"Authorization": "Bearer t"}}),
        );
        assert_eq!(
            s.ok(),
            Some(McpServer::http("api", "https://x/mcp").header("Authorization", "Bearer t"))
        );
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        assert_eq!(
            err("x", json!({"type": "sse", "url": "http://x"})),
            "MCP server `x`: transport `sse` is not supported; this host speaks stdio and \
             streamable HTTP (`\"type\": \"http\"`)"
        );
        assert_eq!(
            err("x", json!({})),
            "MCP server `x`: has neither `command` (stdio) nor `url` (http)"
        );
        assert_eq!(
            err("x", json!({"command": "a", "args": "b"})),
            "MCP server `x`: `args` should be a list, not \"b\""
        );
        assert_eq!(
            err("x", json!({"command": 3})),
            "MCP server `x`: `command` should be a string, not 3"
        );
        assert_eq!(
            err("x", json!("fs")),
            "MCP server `x`: its configuration should be an object, not \"fs\""
        );
        assert_eq!(
            err(
                "x",
                json!({"command": "a", "env": {"K": "${FORKHIVE_SURELY_UNSET_VAR}"}})
            ),
            "MCP server `x`: `env.K`: environment variable `FORKHIVE_SURELY_UNSET_VAR` is not \
             set and has no default"
        );
    }

    #[test]
    fn variables_expand_with_defaults() {
        assert_eq!(
            expand("a${FORKHIVE_SURELY_UNSET_VAR:-b}c").as_deref(),
            Ok("abc")
        );
        assert_eq!(
            expand("${FORKHIVE_SURELY_UNSET_VAR").err().as_deref(),
            Some("`${` without a closing `}` in \"${FORKHIVE_SURELY_UNSET_VAR\"")
        );
        assert_eq!(expand("no vars").as_deref(), Ok("no vars"));
    }

    #[test]
    fn debug_hides_secret_values() {
        let s = McpServer::http("api", "https://me:pw@x/mcp?key=k1")
            .header("Authorization", "Bearer secret");
        let shown = format!("{s:?}");
        assert!(
            shown.contains("Authorization") && shown.contains("https://x/mcp?…"),
            "{shown}"
        );
        for secret in ["secret", "pw", "k1"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let s = McpServer::stdio("fs", "x")
            .env("TOKEN", "hunter2")
            .args(["--token", "hunter3"]);
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter3"),
            "{shown}"
        );
    }

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(redacted_url("https://u:p@h:1/a?b=c"), "https://h:1/a?…");
        assert_eq!(redacted_url("http://h"), "http://h");
        assert_eq!(redacted_url("http://u@h"), "http://h");
    }

    #[test]
    fn one_bad_entry_of_a_file_leaves_the_others() {
        let text =
            r#"{"mcpServers": {"ok": {"command": "x"}, "bad": {"type": "sse", "url": "u"}}}"#;
        let parsed = parse_file(text, ".mcp.json").unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].0, "bad");
        assert!(
            parsed[0]
                .1
                .as_ref()
                .is_err_and(|e| e.starts_with(".mcp.json: transport `sse`")),
            "{:?}",
            parsed[0].1
        );
        assert!(parsed[1].1.is_ok());
        // A name no tool can be named under is that server's failure, not the file's.
        let text = r#"{"mcpServers": {"ok": {"command": "x"}, "bad name__x": {"command": "y"}}}"#;
        let parsed = parse_file(text, ".mcp.json").unwrap();
        assert_eq!(
            parsed[0].1.as_ref().err().map(String::as_str),
            Some(
                ".mcp.json: a server's name must not be empty or hold `__` (its tools are named \
                 `mcp__<server>__<tool>`)"
            )
        );
        assert!(parsed[1].1.is_ok());
        // VS Code's layout is named, not read as a server called `servers`.
        assert_eq!(
            parse_file(
                r#"{"servers": {"a": {"command": "x"}}}"#,
                ".vscode/mcp.json"
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
            "invalid agent configuration: MCP configuration .vscode/mcp.json: its servers are \
             under `servers`, as VS Code writes them; this reads Claude Code's `.mcp.json`, \
             whose servers are under `mcpServers` (rename the key)"
        );
        assert_eq!(
            parse_file("[", "f.json")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            "invalid agent configuration: MCP configuration f.json: not JSON: EOF while parsing \
             a list at line 1 column 1"
        );
    }

    #[test]
    fn definition_entries_name_servers() {
        let v = json!(["github", {"local": {"command": "x"}}]);
        let e = entries(&v);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0], ("github".to_owned(), None));
        assert_eq!(e[1].0, "local");
    }
}
