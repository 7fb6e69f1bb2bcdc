//! A parent forks three children that share its prompt cache; each child audits one file of
//! a small project with real tools, in the background, and reports through a
//! `<task-notification>`.
//!
//! ```text
//! cargo run --example fork_fanout -- [--delay-ms N] [--guidelines N]
//!     [--transcript-dir DIR] [--dump-requests DIR]
//!     [--backend anthropic|openai --base-url URL --model M]
//! ```
//!
//! By default the model is scripted and sits behind the prompt-cache simulator, so the run is
//! offline and deterministic in what it sends. While it runs, a live agent tree shows each
//! agent's status, turns, tokens and cache hit rate; each notification is printed as it is
//! queued for the parent. At the end come a per-agent cache table and what the three children
//! cost against three agents that share no cache.
//!
//! With `--backend`, every request goes to a real server. A small local model will not make
//! the `Agent` calls a fan-out needs, so the parent's first answer is scripted (the three
//! calls) — the output says so — and everything after it is the real model's. The system
//! prompt holds `--guidelines` rounds of eight rules (default 20, ~2,500 tokens; 4 with a real
//! backend, so it fits a small local server's 4,096-token context) and answers are capped at
//! 512 tokens (160 with a real backend).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use forkhive::core::fork::{FORK_DIRECTIVE_PREFIX, is_in_fork_child};
use forkhive::core::notification::find_notifications;
use forkhive::core::{ContentBlock, Message, RawJson, Role, TaskId, Usage};
use forkhive::spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive::spawn::runtime::{Agent, AgentEvent, EventKind, FnSink, Limits, StopReason};
use forkhive::spawn::task::{
    MemoryTaskRegistry, OutputConfig, TaskConfig, TaskRegistry, TaskService,
};
use forkhive::spawn::tool::{ListDir, ReadFile, Tool, ToolPool};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::recording::RecordingBackend;
use forkhive::transport::request::events_for;
use forkhive::transport::simulator::{PromptCacheSimulator, estimate_tokens};
use forkhive::transport::{
    AnthropicCodec, Backend, Codec, EventStream, ModelStop, OpenAiCodec, Request, Response,
    ScriptedBackend,
};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The files the children audit, one each.
const FILES: [&str; 3] = ["net.rs", "db.rs", "ui.rs"];

/// Published price ratios relative to base input tokens.
const WRITE_5M: f64 = 1.25;
const WRITE_1H: f64 = 2.0;
const READ: f64 = 0.1;

/// A parent forks three children that each audit one file of a small project, in the
/// background, on a scripted model behind the prompt-cache simulator (or a real server).
///
/// With --backend, the key comes from ANTHROPIC_API_KEY or OPENAI_API_KEY (not needed for a
/// local server).
#[derive(clap::Parser)]
#[command(name = "fork_fanout")]
struct Args {
    /// A real server instead of the scripted model (needs --base-url).
    #[arg(long, value_parser = ["anthropic", "openai"], requires = "base_url")]
    backend: Option<String>,
    /// The real server's base URL.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name for a real server.
    #[arg(long)]
    model: Option<String>,
    /// How long the scripted model waits per request, in milliseconds (its "thinking").
    #[arg(long = "delay-ms", default_value = "250", value_parser = parse_ms)]
    delay: Duration,
    /// How many guideline paragraphs the parent's system prompt holds (default: enough for
    /// the model's minimum cacheable prompt).
    #[arg(long)]
    guidelines: Option<usize>,
    /// Keep every agent's transcript and each child's output file in this directory.
    #[arg(long)]
    transcript_dir: Option<PathBuf>,
    /// Write every request body to this directory.
    #[arg(long = "dump-requests", value_name = "DIR")]
    dump: Option<PathBuf>,
}

fn parse_ms(s: &str) -> Result<Duration, std::num::ParseIntError> {
    s.parse().map(Duration::from_millis)
}

// ---------------------------------------------------------------------------------------------
// The project the children audit.

/// A small Rust-looking file with a known number of TODO markers and `unwrap()` calls.
fn source_file(name: &str, todos: usize, unwraps: usize) -> String {
    let mut s = format!("//! {name}: part of the demo service.\n\n");
    for i in 0..12 {
        s.push_str(&format!(
            "pub fn step_{i}(input: &str) -> Result<usize, Error> {{\n"
        ));
        if i < todos {
            s.push_str("    // TODO: validate the input before parsing it\n");
        }
        if i < unwraps {
            s.push_str("    let n = input.parse::<usize>().unwrap();\n    Ok(n)\n}\n\n");
        } else {
            s.push_str("    let n = input.parse::<usize>()?;\n    Ok(n)\n}\n\n");
        }
    }
    s
}

fn write_project(dir: &Path) -> std::io::Result<()> {
    for (i, name) in FILES.iter().enumerate() {
        std::fs::write(dir.join(name), source_file(name, i + 1, 3 - i))?;
    }
    std::fs::write(
        dir.join("README.md"),
        "# demo service\n\nThree modules: net, db and ui.\n",
    )
}

// ---------------------------------------------------------------------------------------------
// The scripted model.

fn call(id: &str, name: &str, input: serde_json::Value) -> ContentBlock {
    ContentBlock::tool_use(id, name, RawJson::from_value(&input))
}

fn reply(content: Vec<ContentBlock>, stop: ModelStop) -> Response {
    let text: usize = content
        .iter()
        .map(|b| b.as_text().map_or(40, str::len))
        .sum();
    Response {
        message: Message::assistant(content),
        stop_reason: Some(stop),
        usage: Usage {
            output_tokens: estimate_tokens(text),
            ..Usage::default()
        },
        id: None,
        model: None,
    }
}

/// The three `Agent` calls of the parent's fan-out turn.
fn fan_out_calls() -> Vec<ContentBlock> {
    let mut content = vec![ContentBlock::text(
        "Three independent files: I will fork one worker per file.",
    )];
    for (i, file) in FILES.iter().enumerate() {
        content.push(call(
            &format!("toolu_fork_{i}"),
            "Agent",
            serde_json::json!({
                "description": format!("audit {file}"),
                "prompt": format!("Audit {file}: count its TODO markers and unwrap() calls."),
            }),
        ));
    }
    content
}

/// The directive of a fork child's conversation, if it is one.
fn directive(messages: &[Message]) -> Option<String> {
    if !is_in_fork_child(messages) {
        return None;
    }
    messages.iter().rev().find_map(|m| {
        m.content.iter().find_map(|b| {
            let t = b.as_text()?;
            let at = t.find(FORK_DIRECTIVE_PREFIX)?;
            Some(t[at + FORK_DIRECTIVE_PREFIX.len()..].to_owned())
        })
    })
}

fn last_tool_result(messages: &[Message]) -> String {
    messages
        .last()
        .into_iter()
        .flat_map(|m| &m.content)
        .find_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => Some(content.text()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Which file a directive names.
fn file_of(directive: &str) -> usize {
    FILES
        .iter()
        .position(|f| directive.contains(f))
        .unwrap_or(0)
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The scripted model's answer to one request.
fn scripted(request: &Request) -> Response {
    let messages = request.all_messages();
    if let Some(directive) = directive(&messages) {
        // A fork child: read the file, then report in the boilerplate's format.
        let file = FILES[file_of(&directive)];
        let fork_at = messages
            .iter()
            .rposition(|m| is_in_fork_child(std::slice::from_ref(m)))
            .unwrap_or(0);
        let own_turns = messages[fork_at..]
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        if own_turns == 0 {
            return reply(
                vec![call(
                    "toolu_read",
                    "Read",
                    serde_json::json!({ "path": file }),
                )],
                ModelStop::ToolUse,
            );
        }
        let text = last_tool_result(&messages);
        return reply(
            vec![ContentBlock::text(format!(
                "Scope: audit {file}\nResult: {} lines, {}, {}.\n\
                 Key files: {file}\nFiles changed: none\nIssues: none",
                text.lines().count(),
                count(text.matches("TODO").count(), "TODO marker"),
                count(text.matches("unwrap()").count(), "unwrap() call"),
            ))],
            ModelStop::EndTurn,
        );
    }
    let turns = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    match turns {
        0 => reply(
            vec![call("toolu_ls", "LS", serde_json::json!({ "path": "." }))],
            ModelStop::ToolUse,
        ),
        1 => reply(fan_out_calls(), ModelStop::ToolUse),
        _ => {
            // Each report as `<file>: <result>`, from its own Scope and Result lines (they
            // arrive in any order; a child that failed has no Result line).
            let notifications: Vec<_> = messages
                .iter()
                .flat_map(|m| find_notifications(m).unwrap_or_default())
                .collect();
            let reports: Vec<String> = notifications
                .iter()
                .map(|n| {
                    let text = n.result.as_deref().unwrap_or_default();
                    let line = |prefix: &str| {
                        text.lines()
                            .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
                    };
                    match (line("Scope: audit "), line("Result: ")) {
                        (Some(file), Some(result)) => format!("{file}: {result}"),
                        _ => format!("{}: {}", n.summary, n.status.as_str()),
                    }
                })
                .collect();
            if turns == 2 {
                reply(
                    vec![ContentBlock::text(
                        "The three workers are auditing; I will wait for their reports.",
                    )],
                    ModelStop::EndTurn,
                )
            } else if notifications.len() < FILES.len() {
                reply(
                    vec![ContentBlock::text(format!(
                        "{} of {} reports are in; waiting for the rest.",
                        reports.len(),
                        FILES.len()
                    ))],
                    ModelStop::EndTurn,
                )
            } else {
                let mut reports = reports;
                reports.sort();
                let summary = reports.join(" ");
                reply(
                    vec![ContentBlock::text(format!(
                        "All three audits are in. {summary}"
                    ))],
                    ModelStop::EndTurn,
                )
            }
        }
    }
}

/// The scripted model with a little latency, so the live tree has something to show; each
/// child takes a different time, so their notifications arrive one by one.
#[derive(Debug)]
struct Scripted {
    delay: Duration,
}

impl Scripted {
    async fn answer(&self, request: &Request) -> Response {
        let messages = request.all_messages();
        let factor = directive(&messages).map_or(1, |d| 2 + 2 * file_of(&d) as u32);
        tokio::time::sleep(self.delay * factor).await;
        scripted(request)
    }
}

#[async_trait]
impl Backend for Scripted {
    async fn send(&self, r: &Request) -> forkhive::transport::Result<Response> {
        Ok(self.answer(r).await)
    }
    async fn stream(&self, r: &Request) -> forkhive::transport::Result<EventStream> {
        let events = events_for(&self.answer(r).await, 16);
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

/// A real server, with the parent's first answer replaced by the three `Agent` calls.
#[derive(Debug)]
struct Real {
    http: HttpBackend,
}

#[async_trait]
impl Backend for Real {
    async fn send(&self, r: &Request) -> forkhive::transport::Result<Response> {
        let mut answer = self.http.send(r).await?;
        let messages = r.all_messages();
        let first_parent_turn =
            directive(&messages).is_none() && !messages.iter().any(|m| m.role == Role::Assistant);
        if first_parent_turn {
            answer.message = Message::assistant(fan_out_calls());
            answer.stop_reason = Some(ModelStop::ToolUse);
        }
        Ok(answer)
    }
    async fn stream(&self, r: &Request) -> forkhive::transport::Result<EventStream> {
        let answer = self.send(r).await?;
        Ok(Box::pin(futures::stream::iter(
            events_for(&answer, 16).into_iter().map(Ok),
        )))
    }
}

/// Keeps a copy of every request, by label, for the comparison at the end.
#[derive(Debug)]
struct Tap<B> {
    inner: B,
    seen: Mutex<Vec<Request>>,
}

impl<B> Tap<B> {
    fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait]
impl<B: Backend> Backend for Tap<B> {
    async fn send(&self, r: &Request) -> forkhive::transport::Result<Response> {
        self.seen.lock().unwrap().push(r.clone());
        self.inner.send(r).await
    }
    async fn stream(&self, r: &Request) -> forkhive::transport::Result<EventStream> {
        self.seen.lock().unwrap().push(r.clone());
        self.inner.stream(r).await
    }
    fn answers_whole(&self) -> bool {
        self.inner.answers_whole()
    }
}

// ---------------------------------------------------------------------------------------------
// The live tree.

#[derive(Debug)]
struct Row {
    name: String,
    parent: Option<TaskId>,
    status: String,
    turns: u32,
    usage: Usage,
    done: bool,
    bar: ProgressBar,
}

impl Row {
    fn line(&self) -> String {
        let indent = if self.parent.is_some() { "└─ " } else { "" };
        format!(
            "{:<20} {:<26} turns {:>2}  in {:>6}  out {:>4}  cache {:>5.1}%",
            format!("{indent}{}", self.name),
            self.status,
            self.turns,
            self.usage.total_input_tokens(),
            self.usage.output_tokens,
            100.0 * self.usage.cache_hit_ratio()
        )
    }
}

/// Every agent of the tree, in the order they appeared; fed by the event sink.
#[derive(Debug)]
struct Tree {
    multi: MultiProgress,
    rows: HashMap<TaskId, Row>,
    order: Vec<TaskId>,
    root: Option<TaskId>,
    notifications: Vec<String>,
}

impl Tree {
    fn new(multi: MultiProgress) -> Self {
        Self {
            multi,
            rows: HashMap::new(),
            order: Vec::new(),
            root: None,
            notifications: Vec::new(),
        }
    }

    /// Names a child after its task's description (from the registry).
    fn rename(&mut self, id: &TaskId, name: String) {
        if let Some(row) = self.rows.get_mut(id) {
            row.name = name;
            if !row.done {
                row.bar.set_message(row.line());
            }
        }
    }

    fn row(&mut self, id: TaskId) -> &mut Row {
        if !self.rows.contains_key(&id) {
            let bar = self.multi.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("{spinner:.cyan} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            let root = *self.root.get_or_insert(id);
            let n = self.order.len();
            self.rows.insert(
                id,
                Row {
                    name: if root == id {
                        "parent".into()
                    } else {
                        format!("child {n}")
                    },
                    parent: (root != id).then_some(root),
                    status: "starting".into(),
                    turns: 0,
                    usage: Usage::default(),
                    done: false,
                    bar,
                },
            );
            self.order.push(id);
        }
        self.rows.get_mut(&id).expect("inserted above")
    }

    /// Folds one event in; true when it came from a child not seen before.
    fn observe(&mut self, e: &AgentEvent) -> bool {
        if let EventKind::Notified {
            status, summary, ..
        } = &e.kind
        {
            let who = self
                .rows
                .get(&e.agent)
                .map_or("a child", |r| r.name.as_str());
            let line = format!(
                "notification ← {who} ({}) {}: {summary}",
                e.agent,
                status.as_str()
            );
            self.multi.suspend(|| println!("{line}"));
            self.notifications.push(line);
            return false;
        }
        let new = !self.rows.contains_key(&e.agent) && self.root.is_some();
        let row = self.row(e.agent);
        row.turns = row.turns.max(e.turn);
        match &e.kind {
            EventKind::RequestSent {
                invoking_request_id: Some(by),
                ..
            } => {
                // Requests are labelled `<agent id>-<turn>`: the label names the parent.
                if let Some(parent) = by.split('-').next().and_then(|p| p.parse().ok()) {
                    row.parent = Some(parent);
                }
                row.status = "waiting for the model".into();
            }
            EventKind::TurnStarted | EventKind::RequestSent { .. } => {
                row.status = "waiting for the model".into()
            }
            EventKind::TextDelta { .. } => row.status = "answering".into(),
            EventKind::ResponseReceived { usage, stop_reason } => {
                row.usage += *usage;
                // A root that ends its turn with children out waits for their notifications
                // (a child that ends its turn stops, and `Stopped` follows).
                row.status = match (stop_reason, row.parent) {
                    (Some(ModelStop::EndTurn), None) => "waiting for its children".into(),
                    _ => "answered".into(),
                };
            }
            EventKind::ToolCallStarted { name, .. } => row.status = format!("running {name}"),
            EventKind::ToolCallFinished { name, is_error, .. } => {
                row.status = format!("{name} {}", if *is_error { "failed" } else { "done" })
            }
            EventKind::MessagesInjected { count } => {
                row.status = format!("read {count} notification(s)")
            }
            EventKind::Stopped { reason, .. } => {
                row.status = reason.to_string();
                row.done = true;
            }
            _ => {}
        }
        let line = row.line();
        if row.done {
            row.bar.set_style(
                ProgressStyle::with_template("✓ {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            row.bar.finish_with_message(line);
        } else {
            row.bar.set_message(line);
        }
        new
    }
}

/// One row of the tree, copied out for the report.
#[derive(Debug)]
struct Snap {
    id: TaskId,
    name: String,
    turns: u32,
    usage: Usage,
    line: String,
}

/// The tree when the run is over: the root first.
#[derive(Debug)]
struct Snapshot {
    rows: Vec<Snap>,
    notifications: usize,
}

impl Tree {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            rows: self
                .order
                .iter()
                .map(|id| {
                    let r = &self.rows[id];
                    Snap {
                        id: *id,
                        name: r.name.clone(),
                        turns: r.turns,
                        usage: r.usage,
                        line: r.line(),
                    }
                })
                .collect(),
            notifications: self.notifications.len(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cost.

fn cost(u: &Usage) -> f64 {
    let write_5m = u.cache_write_tokens - u.cache_write_1h_tokens;
    u.input_tokens as f64
        + write_5m as f64 * WRITE_5M
        + u.cache_write_1h_tokens as f64 * WRITE_1H
        + u.cache_read_tokens as f64 * READ
}

/// What a child's requests cost when they share no cache with anyone: each child alone
/// behind a fresh simulator, so its first request writes its whole prefix.
async fn alone(requests: &[Request], openai: bool) -> Result<Usage, String> {
    let blank = || ScriptedBackend::from_fn(|_| Ok(Response::text("", Usage::default())));
    let sim: Box<dyn Backend> = if openai {
        Box::new(PromptCacheSimulator::openai(blank()))
    } else {
        Box::new(PromptCacheSimulator::anthropic(blank()))
    };
    let mut total = Usage::default();
    for r in requests {
        total += sim
            .send(r)
            .await
            .map_err(|e| forkhive::core::error::chain(&e))?
            .usage;
    }
    Ok(total)
}

// ---------------------------------------------------------------------------------------------

async fn run(a: Args) -> Result<(), String> {
    let project = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    write_project(project.path()).map_err(|e| format!("writing the project: {e}"))?;
    let openai = a.backend.as_deref() == Some("openai");

    let (base, model, real): (Arc<dyn Backend>, String, bool) = match &a.backend {
        None => (
            Arc::new(PromptCacheSimulator::anthropic(Scripted { delay: a.delay })),
            a.model
                .clone()
                .unwrap_or_else(|| "claude-sonnet-4-5".into()),
            false,
        ),
        Some(b) => {
            let url = a
                .base_url
                .clone()
                .ok_or_else(|| format!("--backend {b} needs --base-url"))?;
            let mut config = HttpConfig::new(url);
            let key = if openai {
                "OPENAI_API_KEY"
            } else {
                "ANTHROPIC_API_KEY"
            };
            if let Ok(k) = std::env::var(key)
                && !k.is_empty()
            {
                config = config.with_api_key(k);
            }
            let http = if openai {
                HttpBackend::openai(config)
            } else {
                HttpBackend::anthropic(config)
            }
            .map_err(|e| forkhive::core::error::chain(&e))?;
            let model = a
                .model
                .clone()
                .ok_or_else(|| format!("--backend {b} needs --model"))?;
            (Arc::new(Real { http }), model, true)
        }
    };
    let recorded: Arc<dyn Backend> = match &a.dump {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--dump-requests {}: {e}", dir.display()))?;
            let codec: Box<dyn Codec> = if openai {
                Box::new(OpenAiCodec::default())
            } else {
                Box::new(AnthropicCodec::default())
            };
            Arc::new(
                RecordingBackend::new(base, dir, codec)
                    .map_err(|e| forkhive::core::error::chain(&e))?,
            )
        }
        None => base,
    };
    let tap = Arc::new(Tap {
        inner: recorded,
        seen: Mutex::new(Vec::new()),
    });

    let output_cap = if real { 160 } else { 512 };
    let live = std::io::stdout().is_terminal();
    let multi = MultiProgress::with_draw_target(if live {
        ProgressDrawTarget::stdout()
    } else {
        ProgressDrawTarget::hidden()
    });
    let tree = Arc::new(Mutex::new(Tree::new(multi)));
    let registry = Arc::new(MemoryTaskRegistry::new());
    let sink = {
        let (tree, registry) = (Arc::clone(&tree), Arc::clone(&registry));
        move |e: AgentEvent| {
            let new = tree.lock().unwrap().observe(&e);
            if new {
                // A background child is registered before it runs: name its row after its
                // task, without holding the tree's lock across the lookup.
                let (tree, registry, id) = (Arc::clone(&tree), Arc::clone(&registry), e.agent);
                tokio::spawn(async move {
                    if let Some(record) = registry.get(&id).await {
                        tree.lock().unwrap().rename(&id, record.description);
                    }
                });
            }
        }
    };

    let agent_tool = AgentTool::new(
        AgentToolConfig::default()
            .with_fork_enabled(true)
            .with_child_limits(
                Limits::default()
                    .with_max_turns(Some(6))
                    .with_max_output_tokens(output_cap),
            ),
    )
    .map_err(|e| forkhive::core::error::chain(&e))?;
    let tools = ToolPool::new([
        Arc::new(agent_tool) as Arc<dyn Tool>,
        Arc::new(
            ReadFile::new(project.path())
                .await
                .map_err(|e| forkhive::core::error::chain(&e))?,
        ) as _,
        Arc::new(
            ListDir::new(project.path())
                .await
                .map_err(|e| forkhive::core::error::chain(&e))?,
        ) as _,
    ])
    .map_err(|e| forkhive::core::error::chain(&e))?;
    let mut builder = Agent::builder(tap.clone())
        .model(model.clone())
        .system_prompt(system_prompt(a.guidelines.unwrap_or(if real {
            4
        } else {
            20
        })))
        .user_context("directoryStructure", FILES.join("\n") + "\nREADME.md")
        .tools(tools)
        .limits(
            Limits::default()
                .with_max_turns(Some(10))
                .with_max_output_tokens(output_cap),
        )
        .events(Arc::new(FnSink(sink)));
    if let Some(dir) = &a.transcript_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("--transcript-dir {}: {e}", dir.display()))?;
        builder = builder.transcript_dir(dir);
    }
    let mut parent = builder
        .build()
        .await
        .map_err(|e| forkhive::core::error::chain(&e))?;
    let mut tasks = TaskConfig::default().with_deadline(Some(Duration::from_secs(600)));
    if let Some(dir) = &a.transcript_dir {
        tasks.output = Some(
            OutputConfig::new(dir, parent.id().to_string())
                .map_err(|e| forkhive::core::error::chain(&e))?,
        );
    }
    parent
        .tree()
        .extensions()
        .insert(TaskService::new(registry.clone(), tasks));

    println!(
        "fork fan-out over {} ({}; model {model})",
        project.path().display(),
        if real {
            format!(
                "real server at {}",
                a.base_url.as_deref().unwrap_or_default()
            )
        } else {
            "scripted model behind the prompt-cache simulator".to_owned()
        }
    );
    if real {
        println!(
            "note: the parent's first answer is scripted (the three Agent calls a small model \
             will not make); every other answer is the real model's"
        );
    }
    println!();
    let started = Instant::now();
    let run = parent
        .run("Audit each source file of this project for TODO markers and unwrap() calls.")
        .await;
    let wall = started.elapsed();
    if run.stop != StopReason::Completed {
        // A run stopped by a limit returns with its children's notifications still promised:
        // wait for them, so the report below covers every child.
        let _ = tokio::time::timeout(Duration::from_secs(600), parent.pending().settled()).await;
    }
    // Children have all stopped (`run` returns only then). Copy what the report needs, so no
    // lock is held across the `.await`s below.
    let tree = tree.lock().unwrap().snapshot();
    if let Some(e) = &run.error {
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&**e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        return Err(format!("the parent failed: {why}"));
    }
    // The scripted parent always completes; a real model may stop at a limit instead, which
    // is its answer to report, not a failure of the fan-out.
    if run.stop != StopReason::Completed && !real {
        return Err(format!("the parent stopped: {}", run.stop));
    }

    println!();
    if !live {
        println!("agent tree:");
        for row in &tree.rows {
            println!("  {}", row.line);
        }
        println!();
    }
    // A real small model can ramble: show the start of its answer.
    let answer: String = run.final_text.chars().take(600).collect();
    let more = if answer.len() < run.final_text.len() {
        " …"
    } else {
        ""
    };
    println!("parent: {answer}{more}");
    if real {
        println!("({} in {:.2}s)", run.stop, wall.as_secs_f64());
    } else {
        // The wall time is the scripted model's waiting, not the library's work.
        println!(
            "({} in {:.2}s, nearly all of it the scripted model's own {} ms wait per request, \
             set with --delay-ms; the orchestration cost is measured by fanout_bench)",
            run.stop,
            wall.as_secs_f64(),
            a.delay.as_millis()
        );
    }

    // Per-agent cache table.
    println!(
        "\n{:<14} {:<10} {:>5} {:>9} {:>12} {:>11} {:>7} {:>9}",
        "agent", "id", "turns", "uncached", "cache_write", "cache_read", "hit", "cost"
    );
    for r in &tree.rows {
        println!(
            "{:<14} {:<10} {:>5} {:>9} {:>12} {:>11} {:>6.1}% {:>9.0}",
            r.name,
            r.id.to_string(),
            r.turns,
            r.usage.input_tokens,
            r.usage.cache_write_tokens,
            r.usage.cache_read_tokens,
            100.0 * r.usage.cache_hit_ratio(),
            cost(&r.usage)
        );
    }

    // The children against agents that share no cache with anyone.
    let requests = tap.requests();
    let mut forked = 0.0;
    let mut apart = 0.0;
    let children: Vec<&Snap> = tree.rows.iter().skip(1).collect();
    for child in &children {
        let prefix = format!("{}-", child.id);
        let own: Vec<Request> = requests
            .iter()
            .filter(|r| r.label.as_deref().is_some_and(|l| l.starts_with(&prefix)))
            .cloned()
            .collect();
        forked += cost(&child.usage);
        apart += cost(&alone(&own, openai).await?);
    }
    println!(
        "\n{} fork children: {forked:.0} input-price units; the same requests sent by {} agents \
         that share no cache (fresh subagents given this context): {apart:.0}; the fork saves \
         {:.1}%",
        children.len(),
        children.len(),
        if apart > 0.0 {
            100.0 * (1.0 - forked / apart)
        } else {
            0.0
        }
    );
    println!(
        "prices: uncached 1x, cache write {WRITE_5M}x (1h: {WRITE_1H}x), cache read {READ}x{}",
        if real {
            "; fork costs from the server's usage, the no-sharing costs from the simulator"
        } else {
            ""
        }
    );
    if tree.notifications != children.len() {
        return Err(format!(
            "{} notifications for {} children",
            tree.notifications,
            children.len()
        ));
    }

    if let Some(dir) = &a.transcript_dir {
        println!("\ntranscripts and output files under {}:", dir.display());
        if let Some(p) = parent.transcript_path() {
            println!("  parent  {}", p.display());
        }
        for record in registry.children(parent.id()).await {
            for p in record.transcript.iter().chain(&record.output) {
                println!("  {}  {}", record.id, p.display());
            }
        }
    }
    if let Some(dir) = &a.dump {
        println!(
            "request bodies ({} requests) written to {}",
            requests.len(),
            dir.display()
        );
    }
    Ok(())
}

/// A system prompt of `rounds` rounds of eight guidelines (20 rounds: ~2,500 tokens, a
/// realistic size that makes the shared prefix worth caching).
fn system_prompt(rounds: usize) -> String {
    let rules = [
        "Read the code before you change it, and say which files you read.",
        "Prefer small, reviewable changes; one concern per change.",
        "When a task splits into independent parts, fork one worker per part.",
        "Report findings with file names and counts, not impressions.",
        "Never guess at an API: open its definition first.",
        "Keep error handling explicit; an unwrap() on input is a defect.",
        "A TODO marker is a promise: list each one you find.",
        "Answer in plain sentences; no headings for short answers.",
    ];
    let mut s = String::from(
        "You are the lead engineer of a small team. You audit code and delegate independent \
         parts of the work to forked workers, which inherit this conversation.\n\n",
    );
    for round in 0..rounds {
        for (i, r) in rules.iter().enumerate() {
            s.push_str(&format!("Guideline {}.{}: {r}\n", round + 1, i + 1));
        }
    }
    s
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let result = run(<Args as clap::Parser>::parse()).await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fork_fanout: {e}");
            ExitCode::FAILURE
        }
    }
}
