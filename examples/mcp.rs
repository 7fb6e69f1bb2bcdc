//! An agent with MCP servers, offline: one over stdio (this program, started again with
//! `--serve DIR`), one over streamable HTTP on 127.0.0.1 (served in this process), and one
//! that cannot start. A scripted model calls their tools — one call fails, as a result — and
//! spawns two subagents: one whose definition requires a server the host lacks (refused,
//! naming it), one that uses the parent's connection. `docs/mcp.md` quotes the output.
//!
//! Run: `cargo run --example mcp`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use forkhive::prelude::*;
use forkhive::serde_json::json;

#[allow(dead_code, unreachable_pub)]
#[path = "mcp_server.rs"]
mod server;

/// Runs an agent with MCP servers (or, with `--serve DIR`, is the stdio server itself).
#[derive(clap::Parser)]
struct Args {
    /// Serve MCP over stdio for DIR (how the agent starts its stdio server).
    #[arg(long, value_name = "DIR")]
    serve: Option<PathBuf>,
}

/// The text of each tool result in the request's last message.
fn results(request: &Request) -> Vec<(String, bool)> {
    let last = request.all_messages().last().cloned();
    last.into_iter()
        .flat_map(|m| m.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((content.text(), is_error)),
            _ => None,
        })
        .collect()
}

fn model(request: &Request) -> Response {
    let me = AgentContext::current().expect("asked from inside an agent");
    let first = request.all_messages().len() == 1;
    let show = |who: &str| {
        for (text, is_error) in results(request) {
            let mark = if is_error { "error" } else { "ok" };
            println!("  {who} <- [{mark}] {}", text.replace('\n', " | "));
        }
    };
    match me.agent_type() {
        Some("reader") if first => {
            Response::tool_calls([("mcp__files__read_file", json!({"path": "todo.md"}))])
        }
        Some(_) => {
            show("reader");
            Response::say("The todo list has one item.")
        }
        None if first => {
            let names: Vec<_> = request
                .prefix
                .tools()
                .iter()
                .map(|t| t.name.clone())
                .collect();
            println!("tools offered: {}", names.join(", "));
            Response::tool_calls([
                ("mcp__files__list_files", json!({})),
                ("mcp__web__read_file", json!({"path": "notes.md"})),
                ("mcp__files__fail", json!({})),
            ])
        }
        None if request.all_messages().len() == 3 => {
            show("lead");
            let task = |t: &str| json!({"description": t, "prompt": "Read the todo list.", "subagent_type": t});
            Response::tool_calls([("Agent", task("triage")), ("Agent", task("reader"))])
        }
        None => {
            show("lead");
            Response::say("Done.")
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = <Args as clap::Parser>::parse();
    if let Some(dir) = args.serve {
        return Ok(server::Files::new(&dir)?.serve_stdio().await?);
    }
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("notes.md"),
        "MCP tools are always available.",
    )?;
    std::fs::write(dir.path().join("todo.md"), "- ship it")?;
    // A streamable-HTTP server on loopback, in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(server::serve_http_on(
        listener,
        server::Files::new(dir.path())?,
    ));
    // The host's servers: by name, each connected once and shared by every agent of the tree.
    let me = std::env::current_exe()?.display().to_string();
    let hub = McpHub::builder()
        .server(
            McpServer::stdio("files", me)
                .args(["--serve".into(), dir.path().display().to_string()]),
        )
        .server(McpServer::http("web", url))
        .server(McpServer::stdio("missing", "/nonexistent/mcp-server"))
        .build()?;
    // Two definitions: one requires a server this host does not have.
    let mut triage = AgentDefinition::new("triage", "Triages issues", DefinitionSource::Host);
    triage
        .extra
        .insert("requiredMcpServers".into(), json!(["github"]));
    let mut reader = AgentDefinition::new("reader", "Reads files", DefinitionSource::Host);
    reader.tools = Some(vec![]); // no built-in tools: MCP tools pass anyway
    let registry = AgentRegistry::from_definitions([triage, reader]);
    let agent_tool = AgentTool::new(AgentToolConfig::default().with_registry(registry))?;
    let backend = Arc::new(ScriptedBackend::from_fn(|r| Ok(model(r))));
    let warnings = Arc::new(FnSink(|e: AgentEvent| {
        if let EventKind::Warning { message } = e.kind {
            println!("warning: {message}");
        }
    }));
    let mut lead = Agent::builder(backend)
        .model("claude-sonnet-4-5")
        .tools(ToolPool::new([agent_tool.arc()])?)
        .mcp(hub.clone())
        .events(warnings)
        .build()
        .await?;
    for (name, status) in hub.status() {
        println!("server {name}: {status}");
    }
    let run = lead.run("Look at the project's notes.").await;
    println!("lead: {} ({:?})", run.final_text, run.stop);
    hub.close().await;
    Ok(())
}
