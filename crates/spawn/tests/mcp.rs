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
            "MCP server `files` is not connected any more (did its process exit?); \
             `list_files` did not run; its standard error ends: crashing on request"
                .to_owned(),
            true
        )
    );
}

/// The example server over streamable HTTP on 127.0.0.1: the process (killed when dropped)
/// and its URL.
async fn http_server(dir: &std::path::Path) -> (tokio::process::Child, String) {
    let mut server = tokio::process::Command::new(server_bin())
        .args(["--dir", &dir.display().to_string(), "--http", "127.0.0.1:0"])
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
    (server, url)
}

/// A loopback front for `upstream` (`host:port`): the first request of a connection for the
/// path `/mcp` is answered `307` to `location`; any other connection is piped to
/// `upstream` as it is. Returns its port and how many connections it piped.
async fn redirecting_front(
    upstream: String,
    location: impl Fn(u16) -> String + Send + Sync + 'static,
) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let piped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&piped);
    let location = Arc::new(location);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (upstream, counted, location) = (
                upstream.clone(),
                Arc::clone(&counted),
                Arc::clone(&location),
            );
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let first = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                if first.split(' ').nth(1) == Some("/mcp") {
                    let answer = format!(
                        "HTTP/1.1 307 Temporary Redirect\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        location(port)
                    );
                    let _ = client.write_all(answer.as_bytes()).await;
                    return;
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                if up.write_all(&head).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                }
            });
        }
    });
    (port, piped)
}

/// An HTTP server's `/mcp` → `/mcp/` redirect (a 307 on the same origin, common in front of
/// MCP servers) is followed; a redirect to another host (`localhost` for `127.0.0.1`) is not,
/// so the server's headers reach no other origin, and the server fails to connect.
#[tokio::test]
async fn an_http_server_redirect_is_followed_only_on_its_own_origin() {
    let dir = files_dir();
    let (_server, url) = http_server(dir.path()).await;
    let upstream = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let (port, piped) = redirecting_front(upstream.clone(), |_| "/mcp/".to_owned()).await;
    let h = hub(vec![McpServer::http(
        "web",
        format!("http://127.0.0.1:{port}/mcp"),
    )]);
    let names: Vec<String> = h
        .tools()
        .await
        .iter()
        .map(|t| t.definition().name.clone())
        .collect();
    assert!(
        names.contains(&"mcp__web__read_file".to_owned()),
        "{names:?} {:?}",
        h.status()
    );
    assert!(piped.load(std::sync::atomic::Ordering::SeqCst) > 0);

    let (port, piped) =
        redirecting_front(upstream, |port| format!("http://localhost:{port}/mcp/")).await;
    let h = hub(vec![
        McpServer::http("other", format!("http://127.0.0.1:{port}/mcp")).header("X-Token", "t"),
    ]);
    assert!(h.tools().await.is_empty());
    match &h.status()["other"] {
        McpStatus::Failed(why) => assert!(
            why.starts_with(&format!(
                "did not complete the MCP handshake at http://127.0.0.1:{port}/mcp: "
            )),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        piped.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the other origin"
    );
}

#[tokio::test]
async fn a_streamable_http_server_on_loopback() {
    let dir = files_dir();
    let (mut server, url) = http_server(dir.path()).await;
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

/// A coordinator's workers draw their tools from `worker_tools`, and get the hub's MCP tools
/// too (MCP tools are always available); the coordinator is told which servers they have.
#[tokio::test]
async fn a_coordinators_workers_get_the_hubs_tools() {
    use forkhive_spawn::coordinator::{COORDINATOR_PROMPT, CoordinatorConfig, coordinator};
    let dir = files_dir();
    let h = hub(vec![files("files", dir.path())]);
    let seen: Seen = Arc::default();
    let (s2, context) = (Arc::clone(&seen), Arc::new(Mutex::new(String::new())));
    let c2 = Arc::clone(&context);
    let b = brain(move |r| {
        let coordinating = r
            .prefix
            .system_prompt()
            .first()
            .is_some_and(|s| s == COORDINATOR_PROMPT);
        if coordinating {
            if r.all_messages().len() == 1 {
                *c2.lock().unwrap() = r.all_messages()[0].text();
                return Plan::Reply(calls(&[(
                    "w",
                    "Agent",
                    r#"{"description":"ls","prompt":"list the files","subagent_type":"worker"}"#,
                )]));
            }
            return Plan::Reply(say("coordinated"));
        }
        let names: Vec<_> = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
        assert!(names.contains(&"Lookup".to_owned()), "{names:?}");
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("l", "mcp__files__list_files", "{}")]));
        }
        recording(&s2, r);
        Plan::Reply(say("listed"))
    });
    let workers = ToolPool::new([TestTool::sleeper("Lookup", true, 0).arc()]).unwrap();
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Host);
    w.model = Some("m".into());
    let config = CoordinatorConfig::new(workers).with_agent_tool(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([w]))
            .with_warm_fanout(None),
    );
    let mut c = coordinator(Agent::builder(b).model("m").mcp(h.clone()), config)
        .unwrap()
        .build()
        .await
        .unwrap();
    let run = c.run("list them").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        seen.lock().unwrap().clone(),
        [("a.txt\nb.txt".to_owned(), false)]
    );
    let _ = context;
    let context = format!("{:?}", c.params().user_context());
    assert!(
        context.contains(
            "Workers you start can use these tools: Lookup. They can also use the tools of these \
             MCP servers (named mcp__<server>__<tool>): files."
        ),
        "{context}"
    );
    h.close().await;
}

/// A definition that names the host's server (the YAML of docs/mcp.md) uses the parent's
/// connection — the pool has its tools once — in a child and in a main agent alike.
#[tokio::test]
async fn a_definition_naming_the_hosts_server_shares_it() {
    let dir = files_dir();
    let h = hub(vec![files("files", dir.path())]);
    let mut named = worker(DefinitionSource::Project);
    named.mcp_servers = vec![serde_json::json!("files")];
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        if is_parent(r) {
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[(
                    "f",
                    "Agent",
                    r#"{"description":"ls","prompt":"ls","subagent_type":"worker"}"#,
                )]));
            }
            recording(&s2, r);
            return Plan::Reply(say("parent done"));
        }
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("l", "mcp__files__list_files", "{}")]));
        }
        Plan::Reply(say(&results(r)[0].1))
    });
    let mut a = lead(b, vec![named.clone()])
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen[0].1 && seen[0].0.starts_with("a.txt\nb.txt"),
        "{seen:?}"
    );
    // A main agent of that definition, given the hub: the same tools, once.
    named.tools = None;
    let main = Agent::builder(brain(|_| Plan::Reply(say("ok"))))
        .definition(named)
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    assert!(main.tools().get("mcp__files__read_file").is_some());
    h.close().await;
}

/// `disallowedTools: ["*"]` takes the built-ins away and spares MCP tools, the definition's
/// own servers' too.
#[tokio::test]
async fn disallowing_star_keeps_a_definitions_own_mcp_tools() {
    let dir = files_dir();
    let mut d = with_own_server(dir.path());
    d.tools = None;
    d.disallowed_tools = Some(vec!["*".into()]);
    let read = TestTool::sleeper("Read", true, 0).arc();
    let a = Agent::builder(brain(|_| Plan::Reply(say("ok"))))
        .definition(d)
        .tools(ToolPool::new([read]).unwrap())
        .build()
        .await
        .unwrap();
    let names = a.tools().names();
    assert!(!names.contains(&"Read"), "{names:?}");
    assert!(names.contains(&"mcp__own__list_files"), "{names:?}");
}

/// A server started through a shell leaves nothing behind: dropping the hub (no `close`)
/// kills its whole process group, the grandchild included.
#[tokio::test]
async fn dropping_the_hub_kills_a_servers_grandchildren() {
    let dir = files_dir();
    // `; true` keeps the shell as the parent: the server is its child, our grandchild.
    let line = format!(
        "{} --dir {}; true",
        server_bin().display(),
        dir.path().display()
    );
    let h = hub(vec![
        McpServer::stdio("sh", "sh").args(["-c".to_owned(), line]),
    ]);
    let pid = server_pid(&h, "mcp__sh__pid").await;
    assert!(alive(pid));
    drop(h);
    assert!(gone(pid).await, "the shell's child {pid} outlived the hub");
}

/// A server that exits is reported as failed, with its last words, not as connected.
#[tokio::test]
async fn a_crashed_server_is_no_longer_connected() {
    let dir = files_dir();
    let h = hub(vec![files("files", dir.path())]);
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        recording(&s2, r);
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("c", "mcp__files__crash", "{}")]));
        }
        Plan::Reply(say("ok"))
    });
    let mut a = Agent::builder(b)
        .model("m")
        .mcp(h.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("go").await.stop, StopReason::Completed);
    assert_eq!(
        h.status()["files"],
        McpStatus::Failed(
            "its connection closed (did its process exit?); its standard error ends: crashing \
             on request"
                .to_owned()
        )
    );
}

/// A resumed agent whose transcript names MCP tools of a server that is not connected now
/// keeps them in its request (same bytes) and gets an error result when it calls one.
#[tokio::test]
async fn an_mcp_tool_whose_server_is_gone_answers_with_an_error() {
    let def =
        forkhive_core::ToolDefinition::new("mcp__gone__lookup", "Looks up", r#"{"type":"object"}"#)
            .unwrap();
    let params = forkhive_core::CacheSafeParams::builder("m")
        .tool(def)
        .build();
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        recording(&s2, r);
        assert_eq!(r.prefix.tools()[0].name, "mcp__gone__lookup");
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("l", "mcp__gone__lookup", "{}")]));
        }
        Plan::Reply(say("ok"))
    });
    let mut a = Agent::builder(b).params(params).build().await.unwrap();
    assert_eq!(a.run("go").await.final_text, "ok");
    assert_eq!(
        seen.lock().unwrap().clone(),
        [(
            "`mcp__gone__lookup` belongs to an MCP server that is not connected now; it did not \
             run"
            .to_owned(),
            true
        )]
    );
}

/// A background child with a transcript stays resumable after it ends (its tools kept for a
/// `SendMessage`), but its own server is stopped when it ends — and started again when a
/// message resumes it.
#[tokio::test]
async fn a_resumable_childs_own_server_stops_with_it_and_restarts_with_it() {
    let dir = files_dir();
    let transcripts = tempfile::tempdir().unwrap();
    let pids: Seen = Arc::default();
    let p2 = Arc::clone(&pids);
    let b = brain(move |r| {
        if is_parent(r) {
            return Plan::Reply(match r.all_messages().len() {
                1 => calls(&[(
                    "g",
                    "Agent",
                    r#"{"description":"bg","prompt":"pid?","subagent_type":"worker","run_in_background":true,"name":"alpha"}"#,
                )]),
                5 => calls(&[(
                    "m",
                    "SendMessage",
                    r#"{"to":"alpha","message":"pid again?"}"#,
                )]),
                _ => say("waiting"),
            });
        }
        if results(r).is_empty() {
            return Plan::Reply(calls(&[("c", "mcp__own__pid", "{}")]));
        }
        recording(&p2, r);
        Plan::Reply(say("child done"))
    });
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([with_own_server(
                dir.path(),
            )]))
            .with_warm_fanout(None),
    )
    .unwrap();
    let send = Arc::new(forkhive_spawn::control::SendMessageTool::new().unwrap());
    let mut a = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([tool.arc(), send as Arc<dyn forkhive_spawn::tool::Tool>]).unwrap())
        .transcript_dir(transcripts.path())
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(Duration::from_secs(60), a.run("go"))
        .await
        .expect("the run ended");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let pids: Vec<(u32, bool)> = pids
        .lock()
        .unwrap()
        .iter()
        .map(|(p, e)| (p.parse().unwrap(), *e))
        .collect();
    assert_eq!(pids.len(), 2, "asked before and after the resume: {pids:?}");
    assert_ne!(
        pids[0].0, pids[1].0,
        "a new server process for the resumed child"
    );
    for (pid, err) in pids {
        assert!(!err);
        assert!(
            gone(pid).await,
            "a resumable child's own MCP server {pid} outlived it"
        );
    }
}
