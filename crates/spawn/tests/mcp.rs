//! MCP servers against a real server process: `examples/mcp_server.rs` (the official SDK)
//! over stdio and over streamable HTTP on 127.0.0.1 — its tools in the pool with byte-stable
//! schemas; shared with children, background ones too, through the filtering layers; a
//! definition's own server connected for its agent and closed when it ends; required servers;
//! and every failure (a JSON-RPC error, a hang, a crash, a malformed answer) as an `is_error`
//! result naming the server and the tool, after which the agent goes on.
#![cfg(all(unix, feature = "mcp"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::mcp::{McpHub, McpServer, McpStatus};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::tool::ToolPool;
use support::*;

/// The example server's binary: built with the workspace's examples (`cargo test` builds
/// them); built here when a single test target is run on its own.
fn server_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().parent().unwrap();
        let bin = dir.join("examples").join("mcp_server");
        if !bin.exists() {
            let status = std::process::Command::new(env!("CARGO"))
                .args(["build", "--example", "mcp_server", "-p", "forkhive"])
                .status()
                .unwrap();
            assert!(status.success(), "could not build examples/mcp_server.rs");
        }
        bin
    })
    .clone()
}

fn files_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha").unwrap();
    std::fs::write(dir.path().join("b.txt"), "beta").unwrap();
    dir
}

fn files(name: &str, dir: &std::path::Path) -> McpServer {
    McpServer::stdio(name, server_bin().display().to_string())
        .args(["--dir".to_owned(), dir.display().to_string()])
}

fn hub(servers: Vec<McpServer>) -> McpHub {
    servers
        .into_iter()
        .fold(McpHub::builder(), |b, s| b.server(s))
        .build()
        .unwrap()
}

/// Records every tool result the model is shown, in order.
type Seen = Arc<Mutex<Vec<(String, bool)>>>;

fn recording(seen: &Seen, r: &forkhive_transport::Request) {
    seen.lock()
        .unwrap()
        .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn a_stdio_servers_tools_run_with_stable_schemas() {
    let dir = files_dir();
    let h = hub(vec![files("files", dir.path())]);
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let tools_seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let t2 = Arc::clone(&tools_seen);
    let b = brain(move |r| {
        recording(&s2, r);
        *t2.lock().unwrap() = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[
                ("1", "mcp__files__list_files", "{}"),
                ("2", "mcp__files__read_file", r#"{"path":"a.txt"}"#),
                ("3", "mcp__files__read_file", r#"{"path":"../etc/passwd"}"#),
            ]));
        }
        Plan::Reply(say("done"))
    });
    let mut a = Agent::builder(b)
        .model("m")
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("go").await.final_text, "done");
    assert_eq!(
        tools_seen.lock().unwrap().clone(),
        [
            "mcp__files__crash",
            "mcp__files__fail",
            "mcp__files__list_files",
            "mcp__files__pid",
            "mcp__files__read_file",
            "mcp__files__sleep",
            "mcp__files__write_file",
        ]
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            ("a.txt\nb.txt".to_owned(), false),
            ("alpha".to_owned(), false),
            (
                "`../etc/passwd` is not a plain relative path inside the directory".to_owned(),
                true
            ),
        ]
    );
    assert_eq!(h.status()["files"], McpStatus::Connected { tools: 7 });
    // Same server, same bytes: a second connection renders identical definitions.
    let again = hub(vec![files("files", dir.path())]);
    let render = |tools: Vec<Arc<dyn forkhive_spawn::tool::Tool>>| {
        tools
            .iter()
            .map(|t| {
                let d = t.definition();
                format!("{}|{}|{}", d.name, d.description, d.input_schema.as_str())
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(render(h.tools().await), render(again.tools().await));
    h.close().await;
    again.close().await;
}

#[tokio::test]
async fn failures_are_error_results_and_the_agent_goes_on() {
    let dir = files_dir();
    let h = hub(vec![
        files("files", dir.path()).call_timeout(Duration::from_millis(500)),
        McpServer::stdio("broken", server_bin().display().to_string()).arg("--broken"),
    ]);
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        recording(&s2, r);
        let round = r
            .all_messages()
            .iter()
            .filter(|m| m.role == forkhive_core::Role::Assistant)
            .count();
        Plan::Reply(match round {
            0 => calls(&[
                ("1", "mcp__files__fail", "{}"),
                ("2", "mcp__files__sleep", r#"{"seconds":30}"#),
                ("3", "mcp__broken__garbage", "{}"),
            ]),
            1 => calls(&[("4", "mcp__files__crash", "{}")]),
            2 => calls(&[("5", "mcp__files__list_files", "{}")]),
            _ => say("still here"),
        })
    });
    let mut a = Agent::builder(b)
        .model("m")
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(run.final_text, "still here");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[..3],
        [
            (
                "MCP server `files` answered `fail` with error -32603: the fail tool always fails"
                    .to_owned(),
                true
            ),
            (
                "tool `mcp__files__sleep` did not finish within 500ms; it was stopped".to_owned(),
                true
            ),
            (
                "MCP server `broken` answered `garbage` with something that is not a tool result"
                    .to_owned(),
                true
            ),
        ]
    );
    let closed = "MCP server `files` closed its connection before answering `crash` (did its \
                  process exit?); its standard error ends: crashing on request";
    assert_eq!(seen[3], (closed.to_owned(), true));
    assert_eq!(
        seen[4],
        (
            "MCP server `files` closed its connection before answering `list_files` (did its \
             process exit?); its standard error ends: crashing on request"
                .to_owned(),
            true
        )
    );
}

#[tokio::test]
async fn a_streamable_http_server_on_loopback() {
    let dir = files_dir();
    let mut server = tokio::process::Command::new(server_bin())
        .args([
            "--dir",
            &dir.path().display().to_string(),
            "--http",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(server.stdout.take().unwrap()));
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line.strip_prefix("listening on ").unwrap().to_owned();
    let h = hub(vec![McpServer::http("web", url).header("X-Test", "1")]);
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        recording(&s2, r);
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[
                ("1", "mcp__web__read_file", r#"{"path":"b.txt"}"#),
                (
                    "2",
                    "mcp__web__write_file",
                    r#"{"path":"c.txt","content":"gamma"}"#,
                ),
            ]));
        }
        Plan::Reply(say("done"))
    });
    let mut a = Agent::builder(b)
        .model("m")
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("go").await.final_text, "done");
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            ("beta".to_owned(), false),
            ("wrote 5 bytes to c.txt".to_owned(), false)
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c.txt")).unwrap(),
        "gamma"
    );
    h.close().await;
    server.kill().await.unwrap();
}

fn worker(source: DefinitionSource) -> AgentDefinition {
    let mut d = AgentDefinition::new("worker", "does work", source);
    d.model = Some("m".into());
    d.system_prompt = "You are a worker.".into();
    // Only `Read` among the built-ins: MCP tools pass anyway (layer 3).
    d.tools = Some(vec!["Read".into()]);
    d
}

fn lead(b: Arc<Brain>, defs: Vec<AgentDefinition>) -> forkhive_spawn::runtime::AgentBuilder {
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions(defs))
            .with_warm_fanout(None),
    )
    .unwrap();
    Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([tool.arc()]).unwrap())
}

#[tokio::test]
async fn children_foreground_and_background_share_the_parents_connection() {
    let dir = files_dir();
    let h = hub(vec![files("files", dir.path())]);
    let child_pids: Seen = Arc::default();
    let (c2, parent_seen): (Seen, Seen) = (Arc::clone(&child_pids), Arc::default());
    let p2 = Arc::clone(&parent_seen);
    let b = brain(move |r| {
        if is_parent(r) {
            recording(&p2, r);
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[
                    ("p", "mcp__files__pid", "{}"),
                    (
                        "f",
                        "Agent",
                        r#"{"description":"fg","prompt":"pid?","subagent_type":"worker"}"#,
                    ),
                    (
                        "g",
                        "Agent",
                        r#"{"description":"bg","prompt":"pid?","subagent_type":"worker","run_in_background":true}"#,
                    ),
                ]));
            }
            return Plan::Reply(say("parent done"));
        }
        let names: Vec<_> = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
        assert!(names.contains(&"mcp__files__pid".to_owned()), "{names:?}");
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("c", "mcp__files__pid", "{}")]));
        }
        recording(&c2, r);
        Plan::Reply(say("child done"))
    });
    let mut a = lead(b, vec![worker(DefinitionSource::Project)])
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let parent_pid = parent_seen.lock().unwrap()[0].0.clone();
    let pids = child_pids.lock().unwrap().clone();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for (pid, err) in pids {
        assert!(!err);
        assert_eq!(pid, parent_pid, "one server process for the whole tree");
    }
    h.close().await;
}

/// A worker definition (from the user: trusted) with a server of its own, whose write tool
/// its disallow list takes away.
fn with_own_server(dir: &std::path::Path) -> AgentDefinition {
    let mut own = worker(DefinitionSource::User);
    own.mcp_servers = vec![serde_json::json!({"own": {
        "command": server_bin().display().to_string(),
        "args": ["--dir", dir.display().to_string()],
    }})];
    own.disallowed_tools = Some(vec!["mcp__own__write_file".into()]);
    own
}

/// Waits up to 10 s for `pid` to be gone (the kill after a connection closes is asynchronous).
async fn gone(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !alive(pid)
}

#[tokio::test]
async fn a_definitions_own_server_lives_as_long_as_its_agent() {
    let dir = files_dir();
    let pids: Seen = Arc::default();
    let (p2, names): (Seen, Arc<Mutex<Vec<String>>>) = (Arc::clone(&pids), Arc::default());
    let n2 = Arc::clone(&names);
    let b = brain(move |r| {
        if is_parent(r) {
            if !has_tool_result(r) {
                // Two agents of the type: each connects its own server.
                return Plan::Reply(calls(&[
                    (
                        "f",
                        "Agent",
                        r#"{"description":"one","prompt":"pid?","subagent_type":"worker"}"#,
                    ),
                    (
                        "g",
                        "Agent",
                        r#"{"description":"two","prompt":"pid?","subagent_type":"worker"}"#,
                    ),
                ]));
            }
            return Plan::Reply(say("parent done"));
        }
        *n2.lock().unwrap() = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("c", "mcp__own__pid", "{}")]));
        }
        recording(&p2, r);
        Plan::Reply(say("child done"))
    });
    let mut a = lead(b, vec![with_own_server(dir.path())])
        .build()
        .await
        .unwrap();
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let names = names.lock().unwrap().clone();
    assert!(
        names.contains(&"mcp__own__read_file".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"mcp__own__write_file".to_owned()),
        "{names:?}"
    );
    let pids: Vec<u32> = pids
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _)| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    assert_ne!(pids[0], pids[1], "each agent has its own server");
    // Both children have ended (the parent is still alive): their servers are stopped.
    for pid in pids {
        assert!(
            gone(pid).await,
            "a child's own MCP server {pid} outlived it"
        );
    }
}

#[tokio::test]
async fn a_cancelled_background_childs_own_server_is_stopped() {
    let dir = files_dir();
    let pids: Seen = Arc::default();
    let p2 = Arc::clone(&pids);
    let b = brain(move |r| {
        if is_parent(r) {
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[(
                    "g",
                    "Agent",
                    r#"{"description":"bg","prompt":"pid?","subagent_type":"worker","run_in_background":true}"#,
                )]));
            }
            return Plan::Hang;
        }
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("c", "mcp__own__pid", "{}")]));
        }
        recording(&p2, r);
        // The child waits on its model until it is cancelled.
        Plan::Hang
    });
    let token = tokio_util::sync::CancellationToken::new();
    let mut a = lead(b, vec![with_own_server(dir.path())])
        .cancellation(token.clone())
        .build()
        .await
        .unwrap();
    let run = tokio::spawn(async move { a.run("go").await });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pids.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid: u32 = pids.lock().unwrap()[0].0.parse().unwrap();
    assert!(alive(pid));
    token.cancel();
    let run = run.await.unwrap();
    assert_eq!(run.stop, StopReason::Cancelled);
    assert!(
        gone(pid).await,
        "a cancelled child's own MCP server {pid} outlived it"
    );
}

#[tokio::test]
async fn a_project_definitions_own_server_needs_the_hosts_trust() {
    let mut d = AgentDefinition::new("worker", "does work", DefinitionSource::Project);
    d.model = Some("m".into());
    d.mcp_servers = vec![serde_json::json!({"own": {"command": "/bin/true"}})];
    let events = Arc::new(Events::default());
    let mut a = Agent::builder(brain(|_| Plan::Reply(say("ok"))))
        .definition(d)
        .events(events.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("go").await.final_text, "ok");
    assert_eq!(
        events.warnings(),
        [
            "agent `worker` defines its own MCP server `own`; this host does not start the \
             servers of project definitions (McpHubBuilder::trust_definition_servers), so it \
             runs without it"
        ]
    );
}

#[tokio::test]
async fn required_servers_refuse_the_spawn_with_an_error_result() {
    let dir = files_dir();
    let h = hub(vec![
        files("files", dir.path()),
        McpServer::stdio("dead", "/nonexistent/forkhive-server"),
    ]);
    let mut needs = worker(DefinitionSource::Project);
    needs.name = "needs".into();
    needs.extra.insert(
        "requiredMcpServers".into(),
        serde_json::json!(["files", "github", "dead"]),
    );
    let mut fine = worker(DefinitionSource::Project);
    fine.name = "fine".into();
    fine.extra
        .insert("requiredMcpServers".into(), serde_json::json!(["files"]));
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        if is_parent(r) {
            recording(&s2, r);
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[
                    (
                        "n",
                        "Agent",
                        r#"{"description":"n","prompt":"p","subagent_type":"needs"}"#,
                    ),
                    (
                        "f",
                        "Agent",
                        r#"{"description":"f","prompt":"p","subagent_type":"fine"}"#,
                    ),
                ]));
            }
            return Plan::Reply(say("parent done"));
        }
        Plan::Reply(say("fine ran"))
    });
    let mut a = lead(b, vec![needs, fine]).mcp(h).build().await.unwrap();
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0].1, "{seen:?}");
    assert_eq!(
        seen[0].0,
        "could not start the agent: invalid agent configuration: agent `needs` requires MCP servers that are not \
         available: `github` (not configured), `dead` (failed: could not start \
         `/nonexistent/forkhive-server`: No such file or directory (os error 2)); it was not \
         started"
    );
    assert!(!seen[1].1 && seen[1].0.contains("fine ran"), "{seen:?}");
}

/// The pid of `hub`'s server `name`, asked through an agent.
async fn server_pid(hub: &McpHub, tool: &'static str) -> u32 {
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        recording(&s2, r);
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("p", tool, "{}")]));
        }
        Plan::Reply(say("ok"))
    });
    let mut a = Agent::builder(b)
        .model("m")
        .mcp(hub.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("pid?").await.stop, StopReason::Completed);
    seen.lock().unwrap()[0].0.parse().unwrap()
}

#[tokio::test]
async fn closing_or_dropping_the_hub_stops_its_servers() {
    let dir = files_dir();
    let closed = hub(vec![files("files", dir.path())]);
    let pid = server_pid(&closed, "mcp__files__pid").await;
    assert!(alive(pid));
    closed.close().await;
    assert!(gone(pid).await, "server {pid} outlived McpHub::close");
    assert_eq!(closed.status()["files"], McpStatus::Closed);

    let dropped = hub(vec![files("files", dir.path())]);
    let pid = server_pid(&dropped, "mcp__files__pid").await;
    assert!(alive(pid));
    drop(dropped);
    assert!(gone(pid).await, "server {pid} outlived its hub");
}
