//! A lead and two teammates over a small git repository: `bob` reviews and writes to `alice`;
//! `alice`, in plan mode, asks the lead to approve her plan (rejected with feedback, then
//! approved; her tools that write are held until then), works in her own worktree and commits;
//! both go idle, and the lead shuts them down. A live view shows who is running, idle or
//! stopped.
//!
//! ```text
//! cargo run --example team -- [--mailbox-dir DIR] [--delay-ms N]
//! ```
//!
//! Every agent is scripted, behind the prompt-cache simulator. The mailbox is in memory, or with
//! `--mailbox-dir` Claude Code's inbox files under `DIR/teams/demo/inboxes/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use common::{Commit, Edit, git};
use forkhive::spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive::spawn::control::SendMessageTool;
use forkhive::spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive::spawn::mailbox::{FileMailbox, Mailbox, MemoryMailbox};
use forkhive::spawn::runtime::{Agent, Limits};
use forkhive::spawn::team::{MemberState, Team};
use forkhive::spawn::tool::{ListDir, ReadFile, Tool, ToolPool};
use forkhive::transport::simulator::PromptCacheSimulator;
use forkhive::transport::{Request, Response, ScriptedBackend};

/// A lead and two teammates: messages, a plan approval, a worktree, a clean shutdown.
#[derive(clap::Parser)]
#[command(name = "team")]
struct Args {
    /// Keep the mailboxes as Claude Code's inbox files under this directory.
    #[arg(long)]
    mailbox_dir: Option<PathBuf>,
    /// How long the scripted model takes per request, in milliseconds.
    #[arg(long = "delay-ms", default_value = "60")]
    delay: u64,
}

const LEAD: &str = "You lead a small team. Start teammates, answer their plans, and shut them \
down when the work is done.";
const BUILDER: &str = "You are a builder. Get your plan approved by the lead before you change \
anything, then change and commit in your worktree.";
const REVIEWER: &str = "You are a reviewer. Read, and tell the builder what you find.";
const LIB: &str = "//! calc\n\npub fn add(a: i64, b: i64) -> i64 {\n    a + b\n}\n";

fn call(name: &str, input: serde_json::Value) -> (String, serde_json::Value) {
    (name.to_owned(), input)
}

/// Everything in the request, as one string to look for cues in.
fn all_text(r: &Request) -> String {
    format!("{:?}", r.all_messages())
}

/// The last user message's text (what just arrived).
fn last(r: &Request) -> String {
    let ms = r.all_messages();
    ms.last().map(|m| format!("{m:?}")).unwrap_or_default()
}

/// The `requestId` of the newest plan request in `text`.
fn newest_plan(text: &str) -> Option<String> {
    let rest = &text[text.rfind("plan_approval_request")?..];
    let key = "requestId\\\":\\\"";
    let start = rest.find(key)? + key.len();
    let end = rest[start..].find('\\')?;
    Some(rest[start..start + end].to_owned())
}

fn lead(r: &Request) -> Response {
    let text = all_text(r);
    if r.all_messages().len() == 1 {
        return Response::tool_calls([
            call(
                "Agent",
                serde_json::json!({"description": "build", "name": "alice", "team_name": "demo",
                    "subagent_type": "builder", "isolation": "worktree", "mode": "plan",
                    "prompt": "Add `pub fn version() -> &'static str` to src/lib.rs."}),
            ),
            call(
                "Agent",
                serde_json::json!({"description": "review", "name": "bob", "team_name": "demo",
                    "subagent_type": "reviewer", "prompt": "Review src/lib.rs and tell alice."}),
            ),
        ]);
    }
    let requests = text.matches("summary=\\\"plan_approval_request").count();
    let answered = text.matches("\"plan_approval_response\"").count();
    if requests > answered
        && let Some(id) = newest_plan(&text)
    {
        let approve = requests >= 2;
        return Response::tool_calls([call(
            "SendMessage",
            serde_json::json!({"to": "alice", "message": {"type": "plan_approval_response",
                "request_id": id, "approve": approve,
                "feedback": if approve { "" } else { "also document it" }}}),
        )]);
    }
    let alice_done = text.contains("committed");
    let bob_idle = text.contains("teammate_id=\\\"bob\\\" summary=\\\"idle_notification");
    // What the lead asked, in its own tool calls (its tool results mention shutdowns too).
    let asked_stop = r.all_messages().iter().any(|m| {
        m.tool_uses()
            .any(|(_, _, input)| input.as_str().contains("shutdown_request"))
    });
    if alice_done && bob_idle && !asked_stop {
        return Response::tool_calls([
            call(
                "SendMessage",
                serde_json::json!({"to": "alice", "message": {"type": "shutdown_request", "reason": "done"}}),
            ),
            call(
                "SendMessage",
                serde_json::json!({"to": "bob", "message": {"type": "shutdown_request", "reason": "done"}}),
            ),
        ]);
    }
    if asked_stop {
        return Response::say("Both teammates are shutting down; the work is on alice's branch.");
    }
    Response::say("Waiting for the team.")
}

fn builder(r: &Request) -> Response {
    let (text, now) = (all_text(r), last(r));
    let calls = text.matches("ToolUse").count();
    if now.contains("approved your plan") {
        let content = format!(
            "{LIB}\n/// The crate's version.\npub fn version() -> &'static str {{\n    \"0.1.0\"\n}}\n"
        );
        return Response::tool_calls([call(
            "Edit",
            serde_json::json!({"path": "src/lib.rs", "content": content}),
        )]);
    }
    if now.contains("wrote src/lib.rs") {
        return Response::tool_calls([call(
            "Commit",
            serde_json::json!({"message": "lib: add version()"}),
        )]);
    }
    if now.contains("committed ") {
        let line = now
            .split("committed ")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or_default()
            .to_owned();
        return Response::say(format!("Done: committed {line}."));
    }
    if now.contains("rejected your plan") {
        return Response::tool_calls([call(
            "SendMessage",
            serde_json::json!({"to": "team-lead", "message": {"type": "plan_approval_request",
                "plan": "1. add version() 2. document it"}}),
        )]);
    }
    if calls == 0 {
        return Response::tool_calls([call(
            "SendMessage",
            serde_json::json!({"to": "team-lead", "message": {"type": "plan_approval_request",
                "plan": "1. add version()"}}),
        )]);
    }
    Response::say("Waiting for the lead's answer to my plan.")
}

fn reviewer(r: &Request) -> Response {
    let text = all_text(r);
    if !text.contains("ToolUse") {
        return Response::tool_calls([call("Read", serde_json::json!({"path": "src/lib.rs"}))]);
    }
    if !text.contains("\"to\":\"alice\"") {
        return Response::tool_calls([call(
            "SendMessage",
            serde_json::json!({"to": "alice", "summary": "review",
                "message": "src/lib.rs has no version(); keep add() as it is."}),
        )]);
    }
    Response::say("Review sent to alice.")
}

fn scripted(r: &Request) -> Response {
    let system = r
        .prefix
        .system_prompt()
        .first()
        .cloned()
        .unwrap_or_default();
    if system.starts_with(LEAD) {
        lead(r)
    } else if system.starts_with(BUILDER) {
        builder(r)
    } else if system.starts_with(REVIEWER) {
        reviewer(r)
    } else {
        Response::say("I do not know this agent.")
    }
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    forkhive::core::error::chain(e)
}

async fn run(a: Args) -> Result<(), String> {
    let work = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let repo = work.path().join("calc");
    std::fs::create_dir_all(repo.join("src")).map_err(|e| e.to_string())?;
    std::fs::write(repo.join("src/lib.rs"), LIB).map_err(|e| e.to_string())?;
    git(&repo, &["init", "-q", "-b", "main"])?;
    git(&repo, &["add", "."])?;
    git(&repo, &["commit", "-q", "-m", "calc"])?;
    let repo = repo.canonicalize().map_err(|e| e.to_string())?;

    let mailbox: Arc<dyn Mailbox> = match &a.mailbox_dir {
        Some(dir) => Arc::new(FileMailbox::new(dir)),
        None => Arc::new(MemoryMailbox::new()),
    };
    let mut team = Team::new("demo", mailbox).map_err(|e| chain(&e))?;
    if let Some(dir) = &a.mailbox_dir {
        // The roster beside the inboxes, as Claude Code keeps it.
        team = team
            .with_roster_file(dir.join("teams/demo/config.json"))
            .map_err(|e| chain(&e))?;
    }
    let team = Arc::new(team);
    let def = |name: &str, prompt: &str, tools: &[&str]| {
        let mut d = AgentDefinition::new(name, name, DefinitionSource::Host);
        d.system_prompt = prompt.to_owned();
        // Each agent in its definition's colour in the live view.
        d.color = Some(if name == "builder" { "green" } else { "cyan" }.to_owned());
        d.tools = Some(tools.iter().map(|t| (*t).to_owned()).collect());
        d
    };
    let registry = AgentRegistry::from_definitions([
        def(
            "builder",
            BUILDER,
            &["Read", "LS", "Edit", "Commit", "SendMessage"],
        ),
        def("reviewer", REVIEWER, &["Read", "LS", "SendMessage"]),
    ]);
    let registry_colors: std::collections::HashMap<String, Option<String>> = registry
        .list()
        .into_iter()
        .map(|d| (d.name.clone(), d.color.clone()))
        .collect();
    let worker_tools = ToolPool::new([
        Arc::new(ReadFile::new(&repo).await.map_err(|e| chain(&e))?) as Arc<dyn Tool>,
        Arc::new(ListDir::new(&repo).await.map_err(|e| chain(&e))?) as _,
        Arc::new(Edit::new(&repo)) as _,
        Arc::new(Commit::new(&repo)) as _,
        Arc::new(SendMessageTool::new().map_err(|e| chain(&e))?) as _,
    ])
    .map_err(|e| chain(&e))?;
    let agent_tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(registry)
            .with_teams_enabled(true)
            .with_isolation_enabled(true)
            .with_worktree_repo(Some(repo.clone()))
            .with_subagent_tools(Some(worker_tools))
            .with_warm_fanout(None),
    )
    .map_err(|e| chain(&e))?;
    let tools = ToolPool::new([
        agent_tool.arc(),
        Arc::new(SendMessageTool::new().map_err(|e| chain(&e))?) as Arc<dyn Tool>,
    ])
    .map_err(|e| chain(&e))?;
    let delay = Duration::from_millis(a.delay);
    let backend = PromptCacheSimulator::anthropic(ScriptedBackend::from_async_fn(
        move |r: Request| async move {
            tokio::time::sleep(delay).await;
            Ok(scripted(&r))
        },
    ));
    let mut lead = Agent::builder(Arc::new(backend))
        .model("claude-sonnet-4-5")
        .system_prompt(LEAD)
        .tools(tools)
        .limits(Limits::default().with_max_turns(Some(30)))
        .extension(Arc::clone(&team))
        .build()
        .await
        .map_err(|e| chain(&e))?;

    println!(
        "team `demo` over {} ({} mailbox)\n",
        repo.display(),
        match &a.mailbox_dir {
            Some(d) => format!("file, under {}", d.display()),
            None => "in-memory".to_owned(),
        }
    );
    // The live view: each change of a teammate's state, as it happens.
    let colors = registry_colors;
    let watcher = {
        let team = Arc::clone(&team);
        tokio::spawn(async move {
            let mut seen: Vec<(String, MemberState)> = Vec::new();
            loop {
                for m in team.roster() {
                    let now = (m.name.clone(), m.state);
                    if !seen.contains(&now) {
                        let color = colors.get(&m.agent_type).cloned().flatten();
                        println!(
                            "  {} {}",
                            common::paint(&format!("{:<6}", m.name), color.as_deref()),
                            m.state
                        );
                        seen.retain(|(n, _)| *n != m.name);
                        seen.push(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let run = lead
        .run("Add a version() to the calc crate, reviewed and approved.")
        .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    watcher.abort();
    if let Some(e) = &run.error {
        return Err(format!("the lead failed: {}", chain(&**e)));
    }
    println!("\nlead: {} ({})", run.final_text, run.stop);

    println!("\nletters the lead read:");
    let text = format!("{:?}", lead.params().messages());
    for kind in [
        "plan_approval_request",
        "idle_notification",
        "shutdown_approved",
    ] {
        println!(
            "  {kind}: {}",
            text.matches(&format!("summary=\\\"{kind}")).count()
        );
    }
    println!("\nroster:");
    for m in team.roster() {
        println!(
            "  {:<6} {:<9} {} ({})",
            m.name, m.agent_type, m.state, m.task
        );
    }
    let branches = git(&repo, &["branch", "--list", "forkhive/*"])?;
    let log = match branches
        .split_whitespace()
        .find(|b| b.starts_with("forkhive/"))
    {
        Some(b) => git(&repo, &["log", "--oneline", "-1", b])?,
        None => "no branch kept".to_owned(),
    };
    println!(
        "\nalice's worktree branch: {}: {log}",
        branches.trim_start_matches(['+', ' '])
    );
    if let Some(dir) = &a.mailbox_dir {
        println!("inboxes: {}", dir.join("teams/demo/inboxes").display());
    }
    if team
        .roster()
        .iter()
        .any(|m| m.state != MemberState::Stopped)
    {
        return Err("a teammate did not stop".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(<Args as clap::Parser>::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("team: {e}");
            ExitCode::FAILURE
        }
    }
}
