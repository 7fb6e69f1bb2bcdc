//! Orchestration cost of a wide fan-out, with a scripted model (no model time at all).
//!
//! ```text
//! cargo run --release --example fanout_bench -- --children N --turns T [--threads K] [--transcripts DIR] [--streamed]
//! ```
//!
//! A parent emits N `Agent` calls in one response (background subagents of one definition).
//! Each child makes T−1 turns that each call a `read_file` tool returning 1 KiB, then answers
//! with ~200 characters; every child's answer must reach the parent through its
//! `<task-notification>`, and then the parent answers. The model has each answer whole and
//! says so (`Backend::answers_whole`); `--streamed` makes it answer as stream events instead. Prints one JSON line:
//! `{"framework":"forkhive","n":..,"t":..,"wall_s":..,"per_child_us":..,"peak_rss_mb":..,"total_model_calls":..}`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use forkhive::core::notification::find_notifications;
use forkhive::core::{ContentBlock, Message, RawJson, Role, ToolDefinition, Usage};
use forkhive::spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive::spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive::spawn::runtime::{Agent, Limits, StopReason};
use forkhive::spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive::spawn::tool::{Tool, ToolContext, ToolFilter, ToolOutput, ToolPool};
use forkhive::transport::request::events_for;
use forkhive::transport::{Backend, EventStream, ModelStop, Request, Response};

const PARENT: &str = "You are the parent. Split the work.";

/// The scripted model: answers from the shape of the request, records nothing.
#[derive(Debug)]
struct Model {
    n: usize,
    t: usize,
    /// Answers as stream events (`--streamed`) instead of whole.
    streamed: bool,
    calls: AtomicUsize,
    /// The `read_file` input every child sends, parsed once.
    read_input: RawJson,
}

fn tool_call(id: String, name: &str, input: &str) -> ContentBlock {
    ContentBlock::tool_use(
        id,
        name,
        RawJson::parse(input).unwrap_or_else(|_| RawJson::empty_object()),
    )
}

fn reply(content: Vec<ContentBlock>, stop: ModelStop) -> Response {
    Response {
        message: Message::assistant(content),
        stop_reason: Some(stop),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 10,
            ..Usage::default()
        },
        id: None,
        model: None,
    }
}

impl Model {
    fn answer(&self, r: &Request) -> Response {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let parent = r
            .prefix
            .system_prompt()
            .first()
            .is_some_and(|s| s == PARENT);
        let msgs = r.prefix.messages();
        let assistant_turns = msgs.iter().filter(|m| m.role == Role::Assistant).count()
            + r.suffix
                .messages()
                .iter()
                .filter(|m| m.role == Role::Assistant)
                .count();
        if parent {
            if assistant_turns == 0 {
                let calls = (0..self.n)
                    .map(|i| {
                        tool_call(
                            format!("toolu_{i}"),
                            "Agent",
                            &format!(
                                r#"{{"description":"part {i}","prompt":"Summarise part {i}.","subagent_type":"worker","run_in_background":true}}"#
                            ),
                        )
                    })
                    .collect();
                return reply(calls, ModelStop::ToolUse);
            }
            return reply(
                vec![ContentBlock::text("All parts are summarised.")],
                ModelStop::EndTurn,
            );
        }
        if assistant_turns + 1 < self.t {
            return reply(
                vec![ContentBlock::tool_use(
                    format!("read_{assistant_turns}"),
                    "read_file",
                    self.read_input.clone(),
                )],
                ModelStop::ToolUse,
            );
        }
        let text = "Summary: the part was read and holds one kilobyte of plain text; nothing in it \
                    needs attention, no errors were found, and no further work is required here. Done.";
        reply(vec![ContentBlock::text(text)], ModelStop::EndTurn)
    }
}

#[async_trait]
impl Backend for Model {
    async fn send(&self, r: &Request) -> forkhive::transport::Result<Response> {
        Ok(self.answer(r))
    }
    async fn stream(&self, r: &Request) -> forkhive::transport::Result<EventStream> {
        let events = events_for(&self.answer(r), 4096);
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
    /// It has every answer whole, so the agents ask with `send` (unless `--streamed`).
    fn answers_whole(&self) -> bool {
        !self.streamed
    }
}

/// A `read_file` that returns 1 KiB from memory.
#[derive(Debug)]
struct ReadFile1K(ToolDefinition, String);

#[async_trait]
impl Tool for ReadFile1K {
    fn definition(&self) -> &ToolDefinition {
        &self.0
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    async fn call(&self, _input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        ToolOutput::text(self.1.clone())
    }
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Orchestration cost of a wide background fan-out on a scripted model, as one JSON line.
#[derive(clap::Parser)]
#[command(name = "fanout_bench")]
struct Args {
    /// Children (background subagents) the parent starts in one response.
    #[arg(long = "children", default_value_t = 100, value_parser = at_least_one())]
    n: usize,
    /// Turns each child makes (T−1 tool rounds, then its answer).
    #[arg(long = "turns", default_value_t = 3, value_parser = at_least_one())]
    t: usize,
    /// Worker threads: 1 is a current-thread runtime (one core, as the peers were measured).
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    threads: usize,
    /// The model answers as stream events, which the agents fold back, instead of whole.
    #[arg(long)]
    streamed: bool,
    /// Where every agent keeps its transcript (none by default).
    #[arg(long, value_name = "DIR")]
    transcripts: Option<std::path::PathBuf>,
}

fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

async fn run(args: &Args) -> Result<String, String> {
    let (n, t) = (args.n, args.t);
    let model = Arc::new(Model {
        n,
        t,
        streamed: args.streamed,
        calls: AtomicUsize::new(0),
        read_input: RawJson::parse(r#"{"path":"data.txt"}"#)
            .map_err(|e| forkhive::core::error::chain(&e))?,
    });
    let mut worker =
        AgentDefinition::new("worker", "summarises one part", DefinitionSource::Project);
    worker.system_prompt = "You summarise one part. Read it, then answer briefly.".into();
    let read: Arc<dyn Tool> = Arc::new(ReadFile1K(
        ToolDefinition::new(
            "read_file",
            "Read a file",
            r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        )
        .map_err(|e| forkhive::core::error::chain(&e))?,
        "x".repeat(1024),
    ));
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker]))
        .with_subagent_tools(Some(
            ToolPool::new([Arc::clone(&read)]).map_err(|e| forkhive::core::error::chain(&e))?,
        ))
        .with_filter(ToolFilter::none());
    let agent_tool: Arc<dyn Tool> =
        Arc::new(AgentTool::new(config).map_err(|e| forkhive::core::error::chain(&e))?);
    let mut parent = Agent::builder(model.clone());
    if let Some(dir) = &args.transcripts {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        parent = parent.transcript_dir(dir);
    }
    let mut parent = parent
        .model("scripted")
        .system_prompt(PARENT)
        .tools(ToolPool::new([agent_tool]).map_err(|e| forkhive::core::error::chain(&e))?)
        .limits(
            Limits::default()
                .with_max_concurrent_tools(n)
                .with_max_turns(None),
        )
        .build()
        .await
        .map_err(|e| forkhive::core::error::chain(&e))?;
    let tasks = TaskConfig::default()
        .with_max_children_per_agent(n)
        .with_max_children_per_tree(n)
        .with_stall_after(None);
    parent
        .tree()
        .extensions()
        .insert(TaskService::new(Arc::new(MemoryTaskRegistry::new()), tasks));

    let start = Instant::now();
    let run = parent.run("Summarise every part.").await;
    let wall = start.elapsed();
    if run.stop != StopReason::Completed {
        return Err(format!("the parent stopped: {} {:?}", run.stop, run.error));
    }
    let reached = parent
        .params()
        .messages()
        .iter()
        .map(|m| find_notifications(m).map(|v| v.len()))
        .sum::<Result<usize, _>>()
        .map_err(|e| forkhive::core::error::chain(&e))?;
    if reached != n {
        return Err(format!(
            "{reached} of {n} children's answers reached the parent"
        ));
    }
    let wall_s = wall.as_secs_f64();
    let transcript_bytes = match &args.transcripts {
        Some(dir) => std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum::<u64>(),
        None => 0,
    };
    Ok(serde_json::json!({
        "framework": "forkhive",
        "n": n,
        "t": t,
        "threads": args.threads,
        "transcripts": args.transcripts.is_some(),
        "streamed": args.streamed,
        "transcript_bytes_per_child": transcript_bytes / n as u64,
        "wall_s": (wall_s * 1e4).round() / 1e4,
        "per_child_us": (wall_s * 1e6 / n as f64 * 100.0).round() / 100.0,
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "total_model_calls": model.calls.load(Ordering::Relaxed),
    })
    .to_string())
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let rt = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
