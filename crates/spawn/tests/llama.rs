//! The agent loop against a real llama.cpp server (SmolLM2-135M on CPU), started by
//! `scripts/llama-server.sh start`; runs when `FORKHIVE_LLAMA_URL` is set and says it was
//! skipped otherwise.
//!
//! Every model turn is a real request to the server. A 135M model will not reliably call
//! tools, so a router in front of it replaces the first two answers with scripted tool calls
//! (the requests — what the cache sees — are untouched). Assertions are on the server's usage
//! counters, never on generated text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use forkhive_core::{ContentBlock, Message, RawJson, Usage};
use forkhive_spawn::runtime::{Agent, Limits, StopReason};
use forkhive_spawn::tool::{ListDir, ReadFile, ToolPool};
#[allow(unused_imports)]
use forkhive_transport::ModelStop as _;
use forkhive_transport::http::{HttpBackend, HttpConfig};
use forkhive_transport::request::events_for;
use forkhive_transport::{Backend, EventStream, ModelStop, Request, Response};

fn server(test: &str) -> Option<String> {
    match std::env::var("FORKHIVE_LLAMA_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: FORKHIVE_LLAMA_URL is not set (scripts/llama-server.sh start prints it)"
            );
            None
        }
    }
}

/// Sends every request to the real server; replaces the first two answers with tool calls.
#[derive(Debug)]
struct Router {
    real: HttpBackend,
    turn: AtomicUsize,
    usage: Mutex<Vec<Usage>>,
}

#[async_trait]
impl Backend for Router {
    async fn send(&self, r: &Request) -> forkhive_transport::Result<Response> {
        let mut answer = self.real.send(r).await?;
        self.usage.lock().unwrap().push(answer.usage);
        let call = |id: &str, name: &str, input: &str| {
            Message::assistant(vec![ContentBlock::tool_use(
                id,
                name,
                RawJson::parse(input).unwrap(),
            )])
        };
        match self.turn.fetch_add(1, Ordering::SeqCst) {
            0 => answer.message = call("call_ls", "LS", r#"{"path":"."}"#),
            1 => answer.message = call("call_read", "Read", r#"{"path":"notes.txt"}"#),
            _ => return Ok(answer),
        }
        answer.stop_reason = Some(ModelStop::ToolUse);
        Ok(answer)
    }

    async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
        let answer = self.send(r).await?;
        Ok(Box::pin(futures::stream::iter(
            events_for(&answer, 16).into_iter().map(Ok),
        )))
    }
}

#[tokio::test]
async fn a_three_turn_loop_reads_each_previous_turn_from_the_servers_cache() {
    let Some(url) = server("a_three_turn_loop_reads_each_previous_turn_from_the_servers_cache")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "the build is green\n").unwrap();
    let nonce = format!(
        "{:x}-{}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
        std::process::id()
    );
    let words = [
        "the", "agent", "reads", "each", "file", "and", "notes", "what", "it", "found",
    ];
    let guide: Vec<&str> = (0..700).map(|i| words[(i * 7) % words.len()]).collect();
    for (wire, real) in [
        (
            "anthropic",
            HttpBackend::anthropic(HttpConfig::new(&url)).unwrap(),
        ),
        (
            "openai",
            HttpBackend::openai(HttpConfig::new(format!("{url}/v1"))).unwrap(),
        ),
    ] {
        let router = Arc::new(Router {
            real,
            turn: AtomicUsize::new(0),
            usage: Mutex::new(Vec::new()),
        });
        let tools = ToolPool::new([
            Arc::new(ReadFile::new(dir.path()).await.unwrap()) as _,
            Arc::new(ListDir::new(dir.path()).await.unwrap()) as _,
        ])
        .unwrap();
        let mut agent = Agent::builder(router.clone())
            .model("smollm2")
            .system_prompt(format!("Session {nonce} {wire}. {}.", guide.join(" ")))
            .tools(tools)
            .limits(
                Limits::default()
                    .with_max_turns(Some(3))
                    .with_max_output_tokens(8),
            )
            .build()
            .await
            .unwrap();
        let run = agent.run("Read the notes and say what they say.").await;
        assert!(
            matches!(
                run.stop,
                StopReason::Completed | StopReason::MaxTurns { .. }
            ),
            "{wire}: {:?} {:?}",
            run.stop,
            run.error
        );
        let usage = router.usage.lock().unwrap().clone();
        assert_eq!(usage.len(), 3, "{wire}: three real model turns");
        for t in 1..3 {
            let previous = usage[t - 1].total_input_tokens();
            let read = usage[t].cache_read_tokens;
            eprintln!(
                "{wire} turn {}: {read} of the previous turn's {previous} input tokens read from the cache (input now {})",
                t + 1,
                usage[t].total_input_tokens()
            );
            assert!(
                read * 100 >= previous * 95,
                "{wire} turn {}: read {read} of the previous turn's {previous} input tokens from the cache",
                t + 1
            );
        }
    }
}

/// A router for a fork fan-out: the parent's first answer becomes three fork calls; every
/// request (parent and children) really goes to the server.
///
/// The server has one slot, whose cache holds only the last prompt: a parent request landing
/// between two siblings would evict the siblings' shared prefix, which a provider's prefix
/// cache (Anthropic's, or a multi-slot server's) would keep. So the router holds the parent's
/// later requests until the children have sent theirs; the children themselves are ordered by
/// the runtime's cache-warm fan-out, not by the router.
#[derive(Debug)]
struct ForkRouter {
    real: HttpBackend,
    usage: Mutex<Vec<(String, Usage)>>,
    children_done: tokio::sync::Semaphore,
}

#[async_trait]
impl Backend for ForkRouter {
    async fn send(&self, r: &Request) -> forkhive_transport::Result<Response> {
        let msgs = r.all_messages();
        // A fork child's first request carries its message as the suffix; the parent's never do.
        let child = !r.suffix.is_empty();
        if !child && msgs.len() > 1 {
            let _ = self.children_done.acquire_many(3).await.map(|p| p.forget());
            self.children_done.add_permits(3);
        }
        let answer = self.real.send(r).await;
        if child {
            self.children_done.add_permits(1);
        }
        let mut answer = answer?;
        let label = r.label.clone().unwrap_or_default();
        self.usage.lock().unwrap().push((
            if child {
                format!("child {label}")
            } else {
                "parent".into()
            },
            answer.usage,
        ));
        if !child && msgs.len() == 1 {
            answer.message = Message::assistant(
                ["net", "db", "ui"]
                    .iter()
                    .enumerate()
                    .map(|(i, part)| {
                        ContentBlock::tool_use(
                            format!("call_{i}"),
                            "Agent",
                            RawJson::parse(&format!(r#"{{"description":"audit {part}","prompt":"Audit the {part} code."}}"#)).unwrap(),
                        )
                    })
                    .collect(),
            );
            answer.stop_reason = Some(ModelStop::ToolUse);
        }
        Ok(answer)
    }

    async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
        let answer = self.send(r).await?;
        Ok(Box::pin(futures::stream::iter(
            events_for(&answer, 16).into_iter().map(Ok),
        )))
    }
}

#[tokio::test]
async fn a_fork_fan_out_reads_the_shared_prefix_from_the_servers_cache() {
    use forkhive_core::notification::find_notifications;
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::tool::Tool;
    let Some(url) = server("a_fork_fan_out_reads_the_shared_prefix_from_the_servers_cache") else {
        return;
    };
    let nonce = format!(
        "{:x}-{}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
        std::process::id()
    );
    let words = [
        "the", "parent", "splits", "the", "audit", "into", "parts", "and", "forks", "workers",
    ];
    let guide: Vec<&str> = (0..1200).map(|i| words[(i * 3) % words.len()]).collect();
    let router = Arc::new(ForkRouter {
        real: HttpBackend::anthropic(HttpConfig::new(&url)).unwrap(),
        usage: Mutex::new(Vec::new()),
        children_done: tokio::sync::Semaphore::new(0),
    });
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_fork_enabled(true)
            .with_child_limits(
                Limits::default()
                    .with_max_turns(Some(1))
                    .with_max_output_tokens(8),
            ),
    )
    .unwrap();
    let mut parent = Agent::builder(router.clone())
        .model("smollm2")
        .system_prompt(format!("Session {nonce}. {}.", guide.join(" ")))
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .limits(
            Limits::default()
                .with_max_turns(Some(6))
                .with_max_output_tokens(8),
        )
        .build()
        .await
        .unwrap();
    let run = parent.run("Audit the code base.").await;
    assert!(run.error.is_none(), "{:?}", run.error);
    eprintln!("parent: {} after {} turns", run.stop, run.turns.len());
    // The parent may stop (at its turn limit) before every child reported: the rest are
    // promised on its queue.
    tokio::time::timeout(
        std::time::Duration::from_secs(300),
        parent.pending().settled(),
    )
    .await
    .unwrap();
    let mut found: Vec<_> = parent
        .params()
        .messages()
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    found.extend(
        parent
            .pending()
            .drain()
            .iter()
            .map(|m| forkhive_core::TaskNotification::parse(&m.text).unwrap()),
    );
    assert_eq!(
        found.len(),
        3,
        "each child's notification reaches the parent once"
    );
    let mut ids: Vec<_> = found
        .iter()
        .map(|n| n.tool_use_id.clone().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["call_0", "call_1", "call_2"]);
    let usage = router.usage.lock().unwrap().clone();
    let children: Vec<&(String, Usage)> = usage
        .iter()
        .filter(|(who, _)| who.starts_with("child"))
        .collect();
    assert_eq!(children.len(), 3);
    for (who, u) in &children[1..] {
        let total = u.total_input_tokens();
        eprintln!(
            "{who}: {} of {total} input tokens read from the cache",
            u.cache_read_tokens
        );
        assert!(u.cache_read_tokens * 100 >= total * 95, "{who}: {u:?}");
    }
}
