//! The scripted fan-out that `fanout_bench` times and `benches/fanout.rs` measures: a parent
//! that starts N background subagents in one response, children that each make T−1 turns
//! calling a `read_file` returning 1 KiB and then answer with ~200 characters, and a model that
//! answers from the shape of each request (no model time at all).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use forkhive::core::error::chain;
use forkhive::core::notification::find_notifications;
use forkhive::core::{ContentBlock, Message, RawJson, Role, ToolDefinition, Usage};
use forkhive::spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive::spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive::spawn::runtime::{Agent, Limits};
use forkhive::spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive::spawn::tool::{Tool, ToolContext, ToolFilter, ToolOutput, ToolPool};
use forkhive::transport::request::events_for;
use forkhive::transport::{Backend, EventStream, ModelStop, Request, Response};

/// The parent's system prompt (how the model tells the parent from a child).
pub(crate) const PARENT: &str = "You are the parent. Split the work.";
/// The children's system prompt.
pub(crate) const WORKER: &str = "You summarise one part. Read it, then answer briefly.";
/// The parent's prompt.
pub(crate) const PROMPT: &str = "Summarise every part.";

/// The scripted model: answers from the shape of the request, records nothing.
#[derive(Debug)]
pub(crate) struct Model {
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
    /// A model for `n` children of `t` turns each.
    pub(crate) fn new(n: usize, t: usize, streamed: bool) -> Self {
        Self {
            n,
            t,
            streamed,
            calls: AtomicUsize::new(0),
            read_input: RawJson::parse(r#"{"path":"data.txt"}"#).expect("valid JSON"),
        }
    }

    /// How many requests it has answered.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// The answer to `r`.
    pub(crate) fn answer(&self, r: &Request) -> Response {
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
pub(crate) struct ReadFile1K(ToolDefinition, String);

impl ReadFile1K {
    /// The tool.
    pub(crate) fn new() -> Self {
        Self(
            ToolDefinition::new(
                "read_file",
                "Read a file",
                r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
            )
            .expect("a valid schema"),
            "x".repeat(1024),
        )
    }

    /// What every call answers.
    pub(crate) fn text(&self) -> &str {
        &self.1
    }
}

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

/// A parent ready to run the fan-out: its `Agent` tool starts `worker` subagents (each with
/// the `read_file` tool), and a task service bounded at `n` runs them in the background.
pub(crate) async fn parent(
    model: Arc<Model>,
    n: usize,
    transcripts: Option<&std::path::Path>,
) -> Result<Agent, String> {
    let mut worker =
        AgentDefinition::new("worker", "summarises one part", DefinitionSource::Project);
    worker.system_prompt = WORKER.into();
    let read: Arc<dyn Tool> = Arc::new(ReadFile1K::new());
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker]))
        .with_subagent_tools(Some(ToolPool::new([read]).map_err(|e| chain(&e))?))
        .with_filter(ToolFilter::none());
    let agent_tool: Arc<dyn Tool> = Arc::new(AgentTool::new(config).map_err(|e| chain(&e))?);
    let mut parent = Agent::builder(model);
    if let Some(dir) = transcripts {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        parent = parent.transcript_dir(dir);
    }
    let parent = parent
        .model("scripted")
        .system_prompt(PARENT)
        .tools(ToolPool::new([agent_tool]).map_err(|e| chain(&e))?)
        .limits(
            Limits::default()
                .with_max_concurrent_tools(n)
                .with_max_turns(None),
        )
        .build()
        .await
        .map_err(|e| chain(&e))?;
    let tasks = TaskConfig::default()
        .with_max_children_per_agent(n)
        .with_max_children_per_tree(n)
        .with_stall_after(None);
    parent
        .tree()
        .extensions()
        .insert(TaskService::new(Arc::new(MemoryTaskRegistry::new()), tasks));
    Ok(parent)
}

/// How many children's answers reached the parent, as `<task-notification>`s.
pub(crate) fn reached(parent: &Agent) -> Result<usize, String> {
    parent
        .params()
        .messages()
        .iter()
        .map(|m| find_notifications(m).map(|v| v.len()))
        .sum::<Result<usize, _>>()
        .map_err(|e| chain(&e))
}
