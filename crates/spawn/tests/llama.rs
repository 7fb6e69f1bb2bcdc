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
use forkhive_transport::http::{HttpBackend, HttpConfig};
use forkhive_transport::request::events_for;
use forkhive_transport::{Backend, EventStream, Request, Response, StopReason as ModelStop};

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
            .limits(Limits {
                max_turns: Some(3),
                max_output_tokens: 8,
                ..Limits::default()
            })
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
