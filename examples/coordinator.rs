//! A coordinator runs the four phases over a small git repository: three researchers read in
//! parallel, the coordinator writes the plan, two implementers edit and commit in worktrees of
//! their own, and a verifier checks their branches and ends with a `VERDICT`. Midway the
//! coordinator sends a follow-up to a running implementer (read at its next tool round) and a
//! question to a researcher that has finished (resumed from its transcript).
//!
//! ```text
//! cargo run --example coordinator -- [--delay-ms N] [--timeline run.html]
//!     [--transcript-dir DIR] [--backend anthropic|openai --base-url URL --model M]
//! ```
//!
//! By default every agent is scripted and sits behind the prompt-cache simulator: offline,
//! and the same requests every run. While it runs, a live agent tree shows each agent's
//! status, turns, tokens and cache hits; at the end come each agent's usage, cache share and
//! cost at published prices, and which worktrees were kept and why. `--timeline run.html`
//! writes a picture of the run, read from its transcripts.
//!
//! With `--backend`, the workers are the real model's; the coordinator's turns stay scripted
//! (a small local model will not run four phases of tool calls), and the output says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use forkhive::core::PriceTable;
use forkhive::core::notification::find_notifications;
use forkhive::core::{ContentBlock, Message, Role, TaskId, TaskNotification, Usage};
use forkhive::spawn::agent_tool::AgentToolConfig;
use forkhive::spawn::coordinator::{COORDINATOR_PROMPT, CoordinatorConfig, coordinator};
use forkhive::spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive::spawn::runtime::{Agent, AgentEvent, EventKind, FnSink, Limits};
use forkhive::spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive::spawn::timeline::Timeline;
use forkhive::spawn::tool::{ListDir, ReadFile, Tool, ToolPool};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::simulator::PromptCacheSimulator;
use forkhive::transport::{Backend, Request, Response, ScriptedBackend};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A coordinator with researchers, implementers in git worktrees and a verifier, over a
/// temporary repository; scripted on the prompt-cache simulator, or workers on a real server.
///
/// With --backend, the key comes from ANTHROPIC_API_KEY or OPENAI_API_KEY (not needed for a
/// local server).
#[derive(clap::Parser)]
#[command(name = "coordinator")]
struct Args {
    /// A real server for the workers (needs --base-url and --model).
    #[arg(long, value_parser = ["anthropic", "openai"], requires = "base_url")]
    backend: Option<String>,
    /// The real server's base URL.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name for a real server.
    #[arg(long)]
    model: Option<String>,
    /// How long the scripted model takes per request, in milliseconds.
    #[arg(long = "delay-ms", default_value = "120", value_parser = parse_ms)]
    delay: Duration,
    /// Write the run's timeline (one self-contained HTML file) here.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Keep the transcripts here (default: a temporary directory).
    #[arg(long)]
    transcript_dir: Option<PathBuf>,
}

fn parse_ms(s: &str) -> Result<Duration, std::num::ParseIntError> {
    s.parse().map(Duration::from_millis)
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    forkhive::core::error::chain(e)
}

// ---------------------------------------------------------------------------------------------
// The repository.

use common::{Commit, Edit, git};

const LEXER: &str = "/// Splits an expression into tokens.\npub fn tokens(input: &str) -> Vec<&str> {\n    input.split(' ').collect()\n}\n";
const EVAL: &str = "/// Divides `a` by `b`.\npub fn div(a: i64, b: i64) -> i64 {\n    a / b\n}\n";
const README: &str = "# calc\n\nEvaluates `a / b` expressions.\n\nKnown issues:\n- division by zero panics\n- a tab between tokens is not a separator\n";

fn make_repo(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir.join("src")).map_err(|e| e.to_string())?;
    for (path, text) in [
        ("src/lexer.rs", LEXER),
        ("src/eval.rs", EVAL),
        ("README.md", README),
    ] {
        std::fs::write(dir.join(path), text).map_err(|e| format!("{path}: {e}"))?;
    }
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["add", "."])?;
    git(dir, &["commit", "-q", "-m", "calc"])?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The agents.

const RESEARCHER: &str = "You are a researcher. Read what you are asked about and report facts \
with file names and line numbers. Change nothing.";
const IMPLEMENTER: &str = "You are an implementer. Make exactly the change you are given, in \
your worktree, and commit it. Report the commit.";
const VERIFIER: &str = "You are a verifier. Read the changed files and check each claim. End \
with `VERDICT: PASS` or `VERDICT: FAIL` and why.";

/// The project's conventions, which every worker's prompt ends with: long enough (~1,400
/// tokens) for the model's minimum cacheable prefix, so workers of one type share a cache.
fn conventions() -> String {
    let rules = [
        "Name the file and line of every fact you report.",
        "Change only the files your task names; one concern per commit.",
        "Never guess at an API: open its definition first.",
        "An unwrap() on input is a defect; return an error or an Option instead.",
        "Keep functions small; a function that needs a comment to be read is too long.",
        "Tests sit beside the behaviour they check and name it in their title.",
        "Commit messages: `<module>: <what changed>`, in the imperative.",
        "Say plainly what you did not do and why.",
    ];
    let mut s = String::from("\n\nProject conventions:\n");
    for round in 1..=18 {
        for (i, r) in rules.iter().enumerate() {
            s.push_str(&format!("{round}.{}: {r}\n", i + 1));
        }
    }
    s
}

fn registry() -> AgentRegistry {
    let def = |name: &str, what: &str, prompt: &str, tools: &[&str]| {
        let mut d = AgentDefinition::new(name, what, DefinitionSource::Host);
        d.system_prompt = format!("{prompt}{}", conventions());
        d.tools = Some(tools.iter().map(|t| (*t).to_owned()).collect());
        d
    };
    AgentRegistry::from_definitions([
        def(
            "researcher",
            "reads code and reports facts",
            RESEARCHER,
            &["Read", "LS"],
        ),
        def(
            "implementer",
            "makes one given change and commits it",
            IMPLEMENTER,
            &["Read", "LS", "Edit", "Commit"],
        ),
        def(
            "verifier",
            "checks changes and gives a verdict",
            VERIFIER,
            &["Read", "LS"],
        ),
    ])
}

// ---------------------------------------------------------------------------------------------
// The scripted model. Each agent is told apart by its system prompt; what it does next
// follows from the conversation so far.

fn system(r: &Request) -> &str {
    r.prefix.system_prompt().first().map_or("", String::as_str)
}

/// The calls an agent has made so far: (tool, input).
fn made(messages: &[Message]) -> Vec<(String, serde_json::Value)> {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| {
            m.tool_uses()
                .map(|(_, n, i)| {
                    (
                        n.to_owned(),
                        serde_json::from_str(&i.to_string()).unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn results(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => Some(content.text()),
            _ => None,
        })
        .collect()
}

fn said(messages: &[Message]) -> String {
    messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(Message::text)
        .collect::<Vec<_>>()
        .join("\n")
}

fn call(name: &str, input: serde_json::Value) -> (String, serde_json::Value) {
    (name.to_owned(), input)
}

/// `text`, then `calls`.
fn answer(text: &str, calls: Vec<(String, serde_json::Value)>) -> Response {
    let mut r = Response::tool_calls(calls);
    r.message.content.insert(0, ContentBlock::text(text));
    r
}

/// Text between the first pair of backticks after `after`.
fn quoted<'a>(text: &'a str, after: &str) -> Option<&'a str> {
    let rest = &text[text.find(after)? + after.len()..];
    let start = rest.find('`')? + 1;
    let len = rest[start..].find('`')?;
    Some(&rest[start..start + len])
}

fn researcher(messages: &[Message]) -> Response {
    let task = messages[0].text();
    let calls = made(messages);
    let heard = said(messages);
    // Resumed with a question: answer it from what it read.
    if heard.contains("<message from=") {
        let read = results(messages).join("\n");
        let open: Vec<&str> = read.lines().filter_map(|l| l.strip_prefix("- ")).collect();
        return Response::say(format!(
            "None. The README lists {} known issue(s) ({}), and the plan fixes both: `div` \
             returns None on zero, and tokens split on any whitespace. Empty the README's list \
             once both branches are merged.",
            open.len(),
            open.join("; ")
        ));
    }
    let file = ["src/lexer.rs", "src/eval.rs", "README.md"]
        .into_iter()
        .find(|f| task.contains(f))
        .unwrap_or("README.md");
    if calls.is_empty() {
        return Response::tool_calls([call("Read", serde_json::json!({ "path": file }))]);
    }
    let text = results(messages).join("\n");
    let finding = if text.contains("split(' ')") {
        "src/lexer.rs:3 `tokens` splits on a single space: a tab or two spaces between tokens \
         make wrong tokens. `split_whitespace()` fixes it."
            .to_owned()
    } else if text.contains("a / b") {
        "src/eval.rs:3 `div` computes `a / b` unchecked: it panics when `b` is 0. \
         `a.checked_div(b)` returning `Option<i64>` fixes it."
            .to_owned()
    } else {
        format!(
            "README.md lists the known issues: {}.",
            text.lines()
                .filter(|l| l.starts_with("- "))
                .map(|l| l.trim_start_matches("- "))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    Response::say(format!("Scope: {file}\nFinding: {finding}"))
}

fn implementer(messages: &[Message]) -> Response {
    let task = messages[0].text();
    let file = quoted(&task, "In ").unwrap_or("src/lib.rs").to_owned();
    let (old, new) = (
        quoted(&task, "replace").unwrap_or_default().to_owned(),
        quoted(&task, "with").unwrap_or_default().to_owned(),
    );
    let calls = made(messages);
    let did = |tool: &str, path: Option<&str>| {
        calls
            .iter()
            .any(|(n, i)| n == tool && path.is_none_or(|p| i["path"] == p))
    };
    let heard = said(messages);
    if !did("Read", Some(&file)) {
        return Response::tool_calls([call("Read", serde_json::json!({ "path": file }))]);
    }
    if !did("Edit", Some(&file)) {
        let current = results(messages).first().cloned().unwrap_or_default();
        let mut content = current.replace(&old, &new);
        if new.contains("checked_div") {
            content = content.replace("-> i64 {", "-> Option<i64> {");
        }
        return Response::tool_calls([call(
            "Edit",
            serde_json::json!({ "path": file, "content": content }),
        )]);
    }
    // The coordinator's follow-up, read at a tool round: add the test it asks for.
    if heard.contains("tests/div.rs") && !did("Edit", Some("tests/div.rs")) {
        return Response::tool_calls([call(
            "Edit",
            serde_json::json!({
                "path": "tests/div.rs",
                "content": "#[test]\nfn dividing_by_zero_is_none() {\n    assert_eq!(calc::div(1, 0), None);\n}\n",
            }),
        )]);
    }
    if !did("Commit", None) {
        let subject = quoted(&task, "message").unwrap_or("change");
        return Response::tool_calls([call("Commit", serde_json::json!({ "message": subject }))]);
    }
    let commit = results(messages).last().cloned().unwrap_or_default();
    Response::say(format!("Done: {file} changed as asked; {commit}."))
}

fn verifier(messages: &[Message]) -> Response {
    let task = messages[0].text();
    let paths: Vec<&str> = task
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.contains(".forkhive/"))
        .collect();
    if made(messages).is_empty() {
        return Response::tool_calls(
            paths
                .iter()
                .map(|p| call("Read", serde_json::json!({ "path": p }))),
        );
    }
    let read = results(messages).join("\n");
    let checks = [
        (
            "tokens split on any whitespace",
            read.contains("split_whitespace()"),
        ),
        ("div checks for zero", read.contains("checked_div")),
        (
            "a test covers division by zero",
            read.contains("div(1, 0), None"),
        ),
    ];
    let failed: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    let lines: Vec<String> = checks
        .iter()
        .map(|(what, ok)| format!("- {what}: {}", if *ok { "yes" } else { "NO" }))
        .collect();
    Response::say(format!(
        "{}\nVERDICT: {}",
        lines.join("\n"),
        if failed.is_empty() {
            "PASS".to_owned()
        } else {
            format!("FAIL ({})", failed.join(", "))
        }
    ))
}

/// The notifications a coordinator has read, by the description in their summary.
fn reports(messages: &[Message]) -> Vec<TaskNotification> {
    messages
        .iter()
        .flat_map(|m| find_notifications(m).unwrap_or_default())
        .collect()
}

fn of<'a>(ns: &'a [TaskNotification], description: &str) -> Vec<&'a TaskNotification> {
    ns.iter()
        .filter(|n| n.summary.contains(&format!("\"{description}\"")))
        .collect()
}

fn spawn(description: &str, name: &str, ty: &str, prompt: String) -> (String, serde_json::Value) {
    call(
        "Agent",
        serde_json::json!({
            "description": description, "name": name, "subagent_type": ty, "prompt": prompt,
        }),
    )
}

fn coordinator_turn(messages: &[Message], repo: &Path) -> Response {
    let calls = made(messages);
    let spawned = |d: &str| {
        calls
            .iter()
            .any(|(n, i)| n == "Agent" && i["description"] == d)
    };
    let ns = reports(messages);
    let research = ["research lexer", "research eval", "research docs"];
    if !spawned("research lexer") {
        return answer(
            "Phase 1, research: three read-only questions, in parallel.",
            vec![
                spawn("research lexer", "lexer", "researcher", "Read src/lexer.rs. How does `tokens` split its input, and what goes wrong with tabs?".into()),
                spawn("research eval", "eval", "researcher", "Read src/eval.rs. What does `div` do when `b` is 0?".into()),
                spawn("research docs", "docs", "researcher", "Read README.md. Which known issues does it list?".into()),
            ],
        );
    }
    let researched = research.iter().filter(|d| !of(&ns, d).is_empty()).count();
    if researched < research.len() {
        return Response::say(format!(
            "{researched} of 3 research reports are in; waiting."
        ));
    }
    if !spawned("fix lexer") {
        // Synthesis: the coordinator's own understanding, written into concrete prompts.
        return answer(
            "Phase 2, synthesis. The lexer splits on single spaces only (src/lexer.rs:3), and \
             div divides unchecked (src/eval.rs:3); the README lists both. Phase 3: two \
             implementers on disjoint files, each in its own worktree.",
            vec![
                spawn("fix lexer", "fix-lexer", "implementer", "In `src/lexer.rs`, replace `input.split(' ').collect()` with `input.split_whitespace().collect()`. Commit with message `lexer: split on any whitespace`.".into()),
                spawn("fix div", "fix-div", "implementer", "In `src/eval.rs`, replace `a / b` with `a.checked_div(b)` and make `div` return `Option<i64>`. Commit with message `eval: div returns None on zero`.".into()),
            ],
        );
    }
    if !calls.iter().any(|(n, _)| n == "SendMessage") {
        return answer(
            "A follow-up for fix-div while it works, and a question for the docs researcher, \
             which has finished.",
            vec![
                call(
                    "SendMessage",
                    serde_json::json!({ "to": "fix-div", "message": "Also add tests/div.rs with a test that div(1, 0) is None." }),
                ),
                call(
                    "SendMessage",
                    serde_json::json!({ "to": "docs", "message": "Which of the README's known issues does the plan leave open?" }),
                ),
            ],
        );
    }
    let implemented = of(&ns, "fix lexer").len() + of(&ns, "fix div").len();
    if implemented < 2 || of(&ns, "research docs").len() < 2 {
        return Response::say("Waiting for the implementers and the docs answer.");
    }
    if !spawned("verify") {
        let mut files = Vec::new();
        for (d, paths) in [
            ("fix lexer", &["src/lexer.rs"][..]),
            ("fix div", &["src/eval.rs", "tests/div.rs"][..]),
        ] {
            if let Some(wt) = of(&ns, d).first().and_then(|n| n.worktree.as_ref()) {
                let rel = Path::new(&wt.path)
                    .strip_prefix(repo)
                    .unwrap_or(Path::new(&wt.path))
                    .to_path_buf();
                for p in paths {
                    files.push(format!("`{}`", rel.join(p).display()));
                }
            }
        }
        return answer(
            "Phase 4, verification, on the implementers' branches.",
            vec![spawn(
                "verify",
                "verify",
                "verifier",
                format!(
                    "Read {}. Check: tokens split on any whitespace; div returns None when b \
                     is 0; a test covers division by zero.",
                    files.join(", ")
                ),
            )],
        );
    }
    let Some(verdict) = of(&ns, "verify").first().and_then(|n| n.result.clone()) else {
        return Response::say("Waiting for the verifier.");
    };
    let branches: Vec<String> = ns
        .iter()
        .filter_map(|n| n.worktree.as_ref().map(|w| w.branch.clone()))
        .collect();
    let verdict = verdict
        .lines()
        .find(|l| l.contains("VERDICT"))
        .unwrap_or("The verifier gave no VERDICT.");
    let branches = if branches.is_empty() {
        "none (no worktree was kept)".to_owned()
    } else {
        branches.join(", ")
    };
    Response::say(format!("Done. {verdict} Branches to merge: {branches}."))
}

fn scripted(r: &Request, repo: &Path) -> Response {
    let messages = r.all_messages();
    let s = system(r);
    if s == COORDINATOR_PROMPT {
        coordinator_turn(&messages, repo)
    } else if s.starts_with(RESEARCHER) {
        researcher(&messages)
    } else if s.starts_with(IMPLEMENTER) {
        implementer(&messages)
    } else if s.starts_with(VERIFIER) {
        verifier(&messages)
    } else {
        Response::say("I do not know this agent.")
    }
}

/// How long the scripted model "thinks": implementers take longest, so a follow-up reaches
/// one mid-task.
fn delay_of(r: &Request, base: Duration) -> Duration {
    let s = system(r);
    if s.starts_with(IMPLEMENTER) {
        base * 3
    } else if s.starts_with(RESEARCHER) {
        base * 2
    } else {
        base
    }
}

/// The workers on a real server; the coordinator's turns scripted.
#[derive(Debug)]
struct Real {
    http: HttpBackend,
    coordinator: ScriptedBackend,
}

#[async_trait]
impl Backend for Real {
    async fn send(&self, r: &Request) -> forkhive::transport::Result<Response> {
        if system(r) == COORDINATOR_PROMPT {
            self.coordinator.send(r).await
        } else {
            self.http.send(r).await
        }
    }
    async fn stream(
        &self,
        r: &Request,
    ) -> forkhive::transport::Result<forkhive::transport::EventStream> {
        if system(r) == COORDINATOR_PROMPT {
            self.coordinator.stream(r).await
        } else {
            self.http.stream(r).await
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The live tree.

#[derive(Debug, Default)]
struct Row {
    name: String,
    parent: Option<TaskId>,
    status: String,
    turns: u32,
    usage: Usage,
}

#[derive(Debug, Default)]
struct Tree {
    rows: HashMap<TaskId, Row>,
    order: Vec<TaskId>,
}

impl Tree {
    fn observe(&mut self, e: &AgentEvent) {
        if let EventKind::ChildStarted {
            task,
            agent_type,
            description,
            ..
        } = &e.kind
        {
            let row = self.rows.entry(*task).or_default();
            row.name = format!("{agent_type}: {description}");
            row.parent = Some(e.agent);
            row.status = "starting".into();
            if !self.order.contains(task) {
                self.order.push(*task);
            }
            return;
        }
        if !self.rows.contains_key(&e.agent) {
            self.order.insert(0, e.agent);
        }
        let row = self.rows.entry(e.agent).or_default();
        if row.name.is_empty() {
            row.name = "coordinator".into();
        }
        row.turns = row.turns.max(e.turn);
        match &e.kind {
            EventKind::RequestSent { .. } => row.status = "waiting for the model".into(),
            EventKind::ResponseReceived { usage, .. } => {
                row.usage += *usage;
                row.status = "answered".into();
            }
            EventKind::ToolCallStarted { name, .. } => row.status = format!("running {name}"),
            EventKind::MessagesInjected { count } => {
                row.status = format!("read {count} message(s)")
            }
            EventKind::Stopped { reason, .. } => row.status = format!("✓ {reason}"),
            _ => {}
        }
    }

    fn render(&self) -> String {
        let mut out = Vec::new();
        for id in &self.order {
            let r = &self.rows[id];
            let indent = if r.parent.is_some() { "  └─ " } else { "" };
            out.push(format!(
                "{:<38} {:<24} turns {:>2}  in {:>6}  out {:>4}  cache {:>3.0}%",
                format!("{indent}{}", r.name),
                r.status,
                r.turns,
                r.usage.total_input_tokens(),
                r.usage.output_tokens,
                100.0 * r.usage.cache_hit_ratio()
            ));
        }
        out.join("\n")
    }
}

// ---------------------------------------------------------------------------------------------

async fn run(a: Args) -> Result<(), String> {
    let work = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let repo = work.path().join("calc");
    make_repo(&repo)?;
    let repo = repo.canonicalize().map_err(|e| e.to_string())?;
    let transcripts = a
        .transcript_dir
        .clone()
        .unwrap_or_else(|| work.path().join("transcripts"));
    let model = a
        .model
        .clone()
        .unwrap_or_else(|| "claude-sonnet-4-5".into());
    let script = {
        let (repo, delay) = (repo.clone(), a.delay);
        move |r: Request| {
            let repo = repo.clone();
            async move {
                tokio::time::sleep(delay_of(&r, delay)).await;
                Ok(scripted(&r, &repo))
            }
        }
    };
    let backend: Arc<dyn Backend> = match &a.backend {
        None => Arc::new(PromptCacheSimulator::anthropic(
            ScriptedBackend::from_async_fn(script),
        )),
        Some(b) => {
            let url = a.base_url.clone().ok_or("--backend needs --base-url")?;
            if a.model.is_none() {
                return Err(format!("--backend {b} needs --model"));
            }
            let openai = b == "openai";
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
            .map_err(|e| chain(&e))?;
            Arc::new(Real {
                http,
                coordinator: ScriptedBackend::from_async_fn(script),
            })
        }
    };

    let live = std::io::stdout().is_terminal();
    let bar = ProgressBar::with_draw_target(
        None,
        if live {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(ProgressStyle::with_template("{msg}").map_err(|e| e.to_string())?);
    let tree = Arc::new(Mutex::new(Tree::default()));
    let sink = {
        let (tree, bar) = (Arc::clone(&tree), bar.clone());
        move |e: AgentEvent| {
            let mut t = tree.lock().unwrap();
            t.observe(&e);
            bar.set_message(t.render());
            drop(t);
            if let Some(line) = e.headline() {
                bar.suspend(|| println!("{line}"));
            }
        }
    };

    let worker_tools = ToolPool::new([
        Arc::new(ReadFile::new(&repo).await.map_err(|e| chain(&e))?) as Arc<dyn Tool>,
        Arc::new(ListDir::new(&repo).await.map_err(|e| chain(&e))?) as _,
        Arc::new(Edit::new(&repo)) as _,
        Arc::new(Commit::new(&repo)) as _,
    ])
    .map_err(|e| chain(&e))?;
    let config = CoordinatorConfig::new(worker_tools).with_agent_tool(
        AgentToolConfig::default()
            .with_registry(registry())
            .with_isolation_enabled(true)
            .with_worktree_repo(Some(repo.clone()))
            .with_child_limits(Limits::default().with_max_turns(Some(8))),
    );
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default().with_deadline(Some(Duration::from_secs(600))),
    );
    let builder = Agent::builder(backend)
        .model(model.clone())
        .limits(Limits::default().with_max_turns(Some(20)))
        .transcript_dir(&transcripts)
        .extension(Arc::clone(&service))
        .events(Arc::new(FnSink(sink)));
    let mut agent = coordinator(builder, config)
        .map_err(|e| chain(&e))?
        .build()
        .await
        .map_err(|e| chain(&e))?;

    println!(
        "coordinator over {} ({}; model {model})",
        repo.display(),
        match &a.backend {
            None => "every agent scripted, behind the prompt-cache simulator".to_owned(),
            Some(_) => format!(
                "workers on the real server at {}",
                a.base_url.as_deref().unwrap_or_default()
            ),
        }
    );
    if a.backend.is_some() {
        println!(
            "note: the coordinator's turns are scripted (a small local model will not run four \
             phases of tool calls); every worker's answer is the real model's"
        );
    }
    println!();
    let run = agent
        .run("Fix the two known issues in the README, and verify the fixes.")
        .await;
    bar.finish_and_clear();
    if let Some(e) = &run.error {
        return Err(format!("the coordinator failed: {}", chain(&**e)));
    }
    println!("\nagent tree:\n{}\n", tree.lock().unwrap().render());
    println!("coordinator: {}\n({})\n", run.final_text, run.stop);

    // Usage, cache and cost per agent (one row per run: a resumed worker has two).
    let prices = PriceTable::published();
    println!(
        "{:<12} {:<10} {:<12} {:>7} {:>7} {:>7}  {:>9}",
        "agent", "id", "type", "input", "output", "cache", "cost"
    );
    let coord_cost = prices.get(&model).map(|p| run.usage.cost(&p));
    let money = |c: Option<f64>| c.map_or("unpriced".to_owned(), |c| format!("${c:.5}"));
    println!(
        "{:<12} {:<10} {:<12} {:>7} {:>7} {:>6.0}%  {:>9}",
        "coordinator",
        agent.id().to_string(),
        "",
        run.usage.total_input_tokens(),
        run.usage.output_tokens,
        100.0 * run.usage.cache_hit_ratio(),
        money(coord_cost)
    );
    let mut total = coord_cost.unwrap_or_default();
    for c in run.children() {
        let cost = c.cost(&prices);
        total += cost.unwrap_or_default();
        println!(
            "{:<12} {:<10} {:<12} {:>7} {:>7} {:>6.0}%  {:>9}",
            c.description.chars().take(12).collect::<String>(),
            c.id.to_string(),
            c.agent_type,
            c.usage.total_input_tokens(),
            c.usage.output_tokens,
            100.0 * c.cache_hit_ratio(),
            money(cost)
        );
    }
    println!("total: ${total:.5} at published prices");

    // The follow-ups: what SendMessage answered.
    println!("\nfollow-ups:");
    for m in agent.params().messages().iter() {
        for b in &m.content {
            if let ContentBlock::ToolResult { content, .. } = b {
                let text = content.text();
                if text.starts_with("Sent to") || text.contains("resumed from its transcript") {
                    println!("  {text}");
                }
            }
        }
    }

    // Worktrees: kept (with why) or removed.
    println!("\nworktrees:");
    let ns = reports(&agent.params().messages().to_vec());
    for n in &ns {
        if let Some(wt) = &n.worktree {
            let why = n.note.as_deref().unwrap_or("kept");
            println!("  {} ({}): {why}", wt.branch, n.summary);
        }
    }
    let kept = ns.iter().filter(|n| n.worktree.is_some()).count();
    println!(
        "  {kept} kept; every other worker either had none (read-only) or left its tree clean, \
         and it was removed"
    );
    let branches = git(&repo, &["branch", "--list", "forkhive/*"])?;
    let branches: Vec<&str> = branches.split_whitespace().filter(|b| *b != "+").collect();
    println!(
        "  branches in the repository: {}",
        if branches.is_empty() {
            "none".to_owned()
        } else {
            branches.join(", ")
        }
    );

    if let Some(path) = &a.timeline {
        let t = Timeline::load(&transcripts).await.map_err(|e| chain(&e))?;
        std::fs::write(path, t.to_html("coordinator run"))
            .map_err(|e| format!("--timeline {}: {e}", path.display()))?;
        println!(
            "\ntimeline: {} ({} lanes) — open it in a browser",
            path.display(),
            t.lanes.len()
        );
    }
    if a.backend.is_none() && !run.final_text.contains("VERDICT: PASS") {
        return Err("the scripted run did not end with VERDICT: PASS".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(<Args as clap::Parser>::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordinator: {e}");
            ExitCode::FAILURE
        }
    }
}
