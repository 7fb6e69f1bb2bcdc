//! A small MCP server, on the official Rust SDK (`rmcp`), with a few tools over one directory
//! — the server forkhive's MCP tests start, and one to point any MCP client at.
//!
//! Run: `cargo run --example mcp_server -- --dir DIR` (stdio), or `--http 127.0.0.1:0`
//! (streamable HTTP; prints `listening on http://ADDR/mcp` once it accepts connections).
//!
//! Tools: `list_files`, `read_file {path}`, `write_file {path, content}` (confined to DIR:
//! no absolute paths, no `..`, no symlinks), and, to try a client's failure paths, `pid`,
//! `sleep {seconds}`, `fail` (answers with a JSON-RPC error) and `crash` (the process exits).
//! `--broken` serves one tool, `garbage`, whose answer is not a tool result.

use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock as Content};
use rmcp::{ErrorData, ServiceExt, schemars, tool, tool_router};
use serde::Deserialize;

/// An MCP server with tools over one directory.
#[derive(clap::Parser)]
#[command(name = "mcp_server")]
struct Args {
    /// The directory the file tools work in.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Serve streamable HTTP on this address instead of stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Speak just enough JSON-RPC over stdio to offer one tool whose answer is malformed.
    #[arg(long)]
    broken: bool,
}

/// The server: its tools work in `dir`.
#[derive(Clone)]
pub(crate) struct Files {
    dir: Arc<PathBuf>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct PathArg {
    /// A path relative to the served directory.
    path: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct WriteArg {
    /// A path relative to the served directory.
    path: String,
    /// The file's new content.
    content: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SleepArg {
    /// How long to sleep.
    seconds: f64,
}

fn refused(text: String) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::error(vec![Content::text(text)]))
}

impl Files {
    /// `path` under the directory, or why not: relative, no `..`, and no symlink on the way.
    fn inside(&self, path: &str) -> Result<PathBuf, String> {
        let p = Path::new(path);
        if p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "`{path}` is not a plain relative path inside the directory"
            ));
        }
        let mut at = self.dir.as_ref().clone();
        for c in p.components() {
            at.push(c);
            if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(format!("`{path}` goes through a symlink"));
            }
        }
        Ok(at)
    }
}

#[tool_router(server_handler)]
impl Files {
    #[tool(description = "List the files of the directory, one name per line, sorted.")]
    fn list_files(&self) -> Result<CallToolResult, ErrorData> {
        let mut names: Vec<String> = match std::fs::read_dir(self.dir.as_ref()) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) => return refused(format!("cannot list the directory: {e}")),
        };
        names.sort();
        Ok(CallToolResult::success(vec![Content::text(
            names.join("\n"),
        )]))
    }

    #[tool(description = "Read a text file of the directory.")]
    fn read_file(&self, Parameters(a): Parameters<PathArg>) -> Result<CallToolResult, ErrorData> {
        let path = match self.inside(&a.path) {
            Ok(p) => p,
            Err(why) => return refused(why),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(CallToolResult::success(vec![Content::text(text)])),
            Err(e) => refused(format!("cannot read `{}`: {e}", a.path)),
        }
    }

    #[tool(description = "Write a text file of the directory, replacing it.")]
    fn write_file(&self, Parameters(a): Parameters<WriteArg>) -> Result<CallToolResult, ErrorData> {
        let path = match self.inside(&a.path) {
            Ok(p) => p,
            Err(why) => return refused(why),
        };
        match std::fs::write(&path, &a.content) {
            Ok(()) => Ok(CallToolResult::success(vec![Content::text(format!(
                "wrote {} bytes to {}",
                a.content.len(),
                a.path
            ))])),
            Err(e) => refused(format!("cannot write `{}`: {e}", a.path)),
        }
    }

    #[tool(description = "This server's process id.")]
    fn pid(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![Content::text(
            std::process::id().to_string(),
        )]))
    }

    #[tool(description = "Sleep, then answer.")]
    async fn sleep(
        &self,
        Parameters(a): Parameters<SleepArg>,
    ) -> Result<CallToolResult, ErrorData> {
        tokio::time::sleep(std::time::Duration::from_secs_f64(
            a.seconds.clamp(0.0, 3600.0),
        ))
        .await;
        Ok(CallToolResult::success(vec![Content::text("slept")]))
    }

    #[tool(description = "Always answers with a JSON-RPC error.")]
    fn fail(&self) -> Result<CallToolResult, ErrorData> {
        Err(ErrorData::internal_error(
            "the fail tool always fails",
            None,
        ))
    }

    #[tool(description = "Exits the server process.")]
    fn crash(&self) -> Result<CallToolResult, ErrorData> {
        eprintln!("crashing on request");
        std::process::exit(3)
    }
}

/// A hand-written stdio loop whose `tools/call` answer is not a tool result.
fn broken() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut line = String::new();
    while {
        line.clear();
        stdin.read_line(&mut line)? > 0
    } {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(id) = msg.get("id").cloned() else {
            continue; // a notification
        };
        let method = msg
            .get("method")
            .and_then(|m| m.as_str())
            .unwrap_or_default();
        let answer = match method {
            "initialize" => serde_json::json!({"result": {
                "protocolVersion": msg.pointer("/params/protocolVersion").cloned().unwrap_or_default(),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "broken", "version": "0"},
            }}),
            "tools/list" => serde_json::json!({"result": {"tools": [
                {"name": "garbage", "description": "Answers with garbage.", "inputSchema": {"type": "object"}}
            ]}}),
            "tools/call" => {
                serde_json::json!({"result": {"content": "this is not a list of blocks", "isError": "maybe"}})
            }
            _ => serde_json::json!({"error": {"code": -32601, "message": "method not found"}}),
        };
        let mut answer = answer;
        answer["jsonrpc"] = "2.0".into();
        answer["id"] = id;
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

impl Files {
    /// A server over `dir` (which must exist).
    pub(crate) fn new(dir: &Path) -> std::io::Result<Self> {
        Ok(Self {
            dir: Arc::new(std::fs::canonicalize(dir)?),
        })
    }

    /// Serves MCP on standard input and output until the client goes away.
    pub(crate) async fn serve_stdio(self) -> std::io::Result<()> {
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(std::io::Error::other)?;
        running.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    }
}

/// Serves streamable HTTP on `listener` (at `/mcp`, or any path) until the process ends.
pub(crate) async fn serve_http_on(
    listener: tokio::net::TcpListener,
    files: Files,
) -> std::io::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let service = StreamableHttpService::new(
        move || Ok(files.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    loop {
        let (stream, _) = listener.accept().await?;
        let service = hyper_util::service::TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
            // A client that hangs up on its event stream is not an error worth printing.
            if let Err(e) = served
                && !e.is_incomplete_message()
            {
                eprintln!("connection: {e}");
            }
        });
    }
}

#[tokio::main]
#[allow(dead_code)] // also compiled into examples/mcp.rs, whose own `main` runs instead
async fn main() -> ExitCode {
    let args: Args = clap::Parser::parse();
    if args.broken {
        return match broken() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mcp_server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let files = match Files::new(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcp_server: --dir {}: {e}", args.dir.display());
            return ExitCode::from(2);
        }
    };
    let result = match &args.http {
        Some(addr) => {
            async {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                println!("listening on http://{}/mcp", listener.local_addr()?);
                std::io::stdout().flush()?;
                serve_http_on(listener, files).await
            }
            .await
        }
        None => files.serve_stdio().await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp_server: {e}");
            ExitCode::FAILURE
        }
    }
}
