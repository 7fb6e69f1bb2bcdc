//! How soon a running worker reads a `SendMessage`: from `TaskService::send` to the worker's
//! next model request carrying the message.
//!
//! `send_message/next_round`: the worker is in the middle of a tool round (its tool waits for a
//! signal); the message is sent, then the tool is let go. Measured: send → the backend sees
//! the worker's next request with the message in it — the library's own delivery cost, since
//! the tool finishes at once. forkhive delivers at the next tool-round boundary.
//!
//! `send_message/end_of_turn`: the baseline of a worker that reads messages only when its turn
//! ends (peers' users wait minutes for that): the same worker with three more tool rounds of
//! 2 ms each before its turn ends, the message read by the next turn. Measured the same way.
//!
//! `python3 scripts/bench-report.py send_message` prints the medians and their ratio.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use forkhive::core::{TaskId, TaskKind, ToolDefinition};
use forkhive::spawn::runtime::{Agent, PendingMessage, PendingQueue};
use forkhive::spawn::task::{FirstInput, Launch, MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive::spawn::tool::{Tool, ToolContext, ToolOutput, ToolPool};
use forkhive::transport::{Request, Response, ScriptedBackend};
use tokio::sync::{Notify, oneshot};

/// A tool that says it started, then waits to be let go (the first call) or sleeps 2 ms.
#[derive(Debug)]
struct Work {
    def: ToolDefinition,
    entered: Mutex<Option<oneshot::Sender<()>>>,
    release: Arc<Notify>,
}

#[async_trait]
impl Tool for Work {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    async fn call(&self, _: serde_json::Value, _: &ToolContext) -> ToolOutput {
        let first = self.entered.lock().unwrap().take();
        match first {
            Some(tx) => {
                let _ = tx.send(());
                self.release.notified().await;
            }
            None => tokio::time::sleep(Duration::from_millis(2)).await,
        }
        ToolOutput::text("ok")
    }
}

fn has_message(r: &Request) -> bool {
    r.all_messages()
        .last()
        .is_some_and(|m| m.text().contains("<message from=\"bench\">"))
}

/// A worker whose first tool call waits to be let go, and which works `rounds` more tool
/// rounds (2 ms each) before its turn ends; the instant its backend first sees the message.
async fn worker(
    rounds: usize,
) -> (
    Agent,
    oneshot::Receiver<()>,
    Arc<Notify>,
    oneshot::Receiver<Instant>,
) {
    let (entered_tx, entered_rx) = oneshot::channel();
    let (seen_tx, seen_rx) = oneshot::channel::<Instant>();
    let seen_tx = Mutex::new(Some(seen_tx));
    let release = Arc::new(Notify::new());
    let tool = Work {
        def: ToolDefinition::new("Work", "work", r#"{"type":"object"}"#).unwrap(),
        entered: Mutex::new(Some(entered_tx)),
        release: Arc::clone(&release),
    };
    let calls = Mutex::new(0usize);
    let backend = ScriptedBackend::from_fn(move |r| {
        if has_message(r) {
            if let Some(tx) = seen_tx.lock().unwrap().take() {
                let _ = tx.send(Instant::now());
            }
            return Ok(Response::say("read it"));
        }
        let mut n = calls.lock().unwrap();
        *n += 1;
        if *n <= 1 + rounds {
            Ok(Response::tool_calls([("Work", serde_json::json!({}))]))
        } else {
            Ok(Response::say("turn over"))
        }
    });
    let agent = Agent::builder(Arc::new(backend))
        .model("m")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .build()
        .await
        .unwrap();
    (agent, entered_rx, release, seen_rx)
}

fn message() -> PendingMessage {
    PendingMessage::new("<message from=\"bench\">more</message>", "send-message")
}

/// forkhive: a background worker under the task service, sent the message mid tool round.
async fn next_round(service: &Arc<TaskService>) -> Duration {
    let (agent, entered, release, seen) = worker(0).await;
    let id = *agent.id();
    service
        .launch(Launch {
            agent,
            first: FirstInput::Prompt("work".into()),
            description: "bench".into(),
            tool_use_id: None,
            parent_queue: PendingQueue::new(),
            progress: Arc::default(),
            output: None,
            slot: service.acquire(TaskId::generate(TaskKind::Agent)).unwrap(),
            gate: None,
            events: None,
            ledger: None,
            parent_turn: 0,
            worktree: None,
            deadline: None,
            name: None,
        })
        .await
        .unwrap();
    entered.await.unwrap();
    let start = Instant::now();
    service.send(&id, false, message()).unwrap();
    release.notify_one();
    let at = seen.await.unwrap();
    service.wait_idle().await;
    at.duration_since(start)
}

/// The baseline: the message waits for the worker's turn to end (three more rounds), and the
/// next turn starts with it.
async fn end_of_turn() -> Duration {
    let (mut agent, entered, release, seen) = worker(3).await;
    let worker = tokio::spawn(async move {
        let _ = agent.run("work").await;
        let _ = agent.run(message().text).await;
    });
    entered.await.unwrap();
    let start = Instant::now();
    release.notify_one();
    let at = seen.await.unwrap();
    worker.await.unwrap();
    at.duration_since(start)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(None),
    );
    let mut group = c.benchmark_group("send_message");
    group.sample_size(30);
    group.bench_function("next_round", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    total += next_round(&service).await;
                }
                total
            })
        })
    });
    group.bench_function("end_of_turn", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    total += end_of_turn().await;
                }
                total
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
