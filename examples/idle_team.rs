//! Idle teammates and how fast a letter wakes one: a lead starts `--teammates` teammates, each
//! answers its prompt and goes idle, and the lead's run returns. The process's CPU time is
//! measured over `--idle-secs` of the whole team idle; then `--rounds` letters are sent one at
//! a time, each to one idle teammate, and the time from `Team::send` to that teammate's next
//! model request is taken (p50, p99): the relay, its queue, its wake and its run, not just the
//! mailbox. For the in-memory mailbox and the file mailbox (Claude Code's inbox files in a
//! temporary directory). Every agent is scripted.
//!
//! ```text
//! cargo run --release --example idle_team -- [--teammates 100] [--idle-secs 10] [--rounds 200]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkhive::spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive::spawn::control::SendMessageTool;
use forkhive::spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive::spawn::mailbox::{Letter, Mailbox};
use forkhive::spawn::runtime::Agent;
use forkhive::spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive::spawn::team::{LEAD, MemberState, Team};
use forkhive::spawn::tool::{Tool, ToolPool};
use forkhive::transport::{Request, Response, ScriptedBackend};
use tokio::sync::mpsc;

/// Idle teammates' CPU time and their wake latency, for both mailboxes.
#[derive(clap::Parser)]
#[command(name = "idle_team")]
struct Args {
    /// Teammates started by the lead.
    #[arg(long, default_value = "100")]
    teammates: usize,
    /// Seconds of the team idle, measured.
    #[arg(long = "idle-secs", default_value = "10")]
    idle_secs: u64,
    /// Letters sent, one at a time, to measure wake latency.
    #[arg(long, default_value = "200")]
    rounds: usize,
}

const LEAD_PROMPT: &str = "You lead a team of idle workers.";

/// The number after `ping ` in the request's last message, if any.
fn ping_of(r: &Request) -> Option<usize> {
    let last = r.all_messages().last()?.text();
    let at = last.rfind("ping ")? + "ping ".len();
    last[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

async fn measure(name: &str, mailbox: Arc<dyn Mailbox>, a: &Args) -> Result<(), String> {
    let n = a.teammates;
    let team = Arc::new(Team::new("idle", mailbox).map_err(|e| e.to_string())?);
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let backend = ScriptedBackend::from_async_fn(move |r: Request| {
        let tx = tx.clone();
        async move {
            let lead = r.prefix.system_prompt().first().map(String::as_str) == Some(LEAD_PROMPT);
            if lead {
                if r.all_messages().len() == 1 {
                    return Ok(Response::tool_calls((0..n).map(|i| {
                        (
                            "Agent",
                            serde_json::json!({"description": format!("worker {i}"),
                                "prompt": "Wait for work.", "subagent_type": "worker",
                                "name": format!("t{i}"), "team_name": "idle"}),
                        )
                    })));
                }
                return Ok(Response::say("All idle."));
            }
            if let Some(k) = ping_of(&r) {
                let _ = tx.send((k, Instant::now()));
                return Ok(Response::say(format!("pong {k}")));
            }
            Ok(Response::say("ready"))
        }
    });
    let mut worker = AgentDefinition::new("worker", "an idle worker", DefinitionSource::Project);
    worker.system_prompt = "You are a worker.".into();
    let tools = ToolPool::new([
        AgentTool::new(
            AgentToolConfig::default()
                .with_registry(AgentRegistry::from_definitions([worker]))
                .with_teams_enabled(true)
                .with_warm_fanout(None),
        )
        .map_err(|e| e.to_string())?
        .arc(),
        Arc::new(SendMessageTool::new().map_err(|e| e.to_string())?) as Arc<dyn Tool>,
    ])
    .map_err(|e| e.to_string())?;
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_max_children_per_agent(n + 8)
            .with_max_children_per_tree(n + 64),
    );
    let mut lead = Agent::builder(Arc::new(backend))
        .model("m")
        .system_prompt(LEAD_PROMPT)
        .tools(tools)
        .extension(Arc::clone(&team))
        .extension(service)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let run = lead.run("Start the workers.").await;
    if let Some(e) = &run.error {
        return Err(format!("the lead failed: {e}"));
    }
    let roster = team.roster();
    let idle = roster
        .iter()
        .filter(|m| m.state == MemberState::Idle)
        .count();
    if idle != n {
        return Err(format!("{idle} of {n} teammates idle after the lead's run"));
    }
    let up = started.elapsed();
    // Let the relays settle into their waits, then measure nothing happening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = common::cpu_time();
    let wall = Instant::now();
    tokio::time::sleep(Duration::from_secs(a.idle_secs)).await;
    let idle_wall = wall.elapsed();
    let idle_cpu = match (before, common::cpu_time()) {
        (Some(b), Some(e)) => {
            let used = e.saturating_sub(b);
            // Not a performance claim: a gross failure (something polling in a loop) that CI
            // must not pass.
            if used > idle_wall / 2 {
                return Err(format!(
                    "idle teammates used {used:?} of CPU over {idle_wall:.1?}: something is \
                     busy-looping"
                ));
            }
            format!("{used:?}")
        }
        _ => "unknown (no /proc/self/stat)".into(),
    };
    let mut lat = Vec::with_capacity(a.rounds);
    for r in 0..a.rounds {
        let to = format!("t{}", r % n);
        let sent = Instant::now();
        team.send(&to, Letter::new(LEAD, format!("ping {r}")))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let (k, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .map_err(|_| format!("{to} did not wake within 10 s"))?
                .ok_or("the backend stopped")?;
            if k == r {
                lat.push(at.saturating_duration_since(sent));
                break;
            }
        }
        // Back to idle before the next letter.
        while team.member(&to).map(|m| m.state) != Some(MemberState::Idle) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // The host ends the team: every teammate is asked to stop, and the call returns once
    // their owners have finished them and the team's claim is given up.
    let stopping = Instant::now();
    let stopped = tokio::time::timeout(
        Duration::from_secs(10),
        team.shut_down(Some("the host exits".into())),
    )
    .await
    .map_err(|_| "teammates still running 10 s after the host shut the team down".to_owned())?
    .map_err(|e| e.to_string())?;
    if stopped.len() != n {
        return Err(format!(
            "{} of {n} teammates were asked to stop",
            stopped.len()
        ));
    }
    if let Some(m) = team
        .roster()
        .into_iter()
        .find(|m| m.state != MemberState::Stopped)
    {
        return Err(format!("`{}` is {} after the shutdown", m.name, m.state));
    }
    lat.sort();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
    println!(
        "{name:>6}: {n} teammates idle after {up:.1?}; CPU {idle_cpu} over {idle_wall:.1?} idle; \
         wake latency (letter sent to the teammate's next request) over {} letters: p50 {:?}, \
         p99 {:?}, max {:?}; all stopped in {:.1?}",
        lat.len(),
        pct(50),
        pct(99),
        lat[lat.len() - 1],
        stopping.elapsed()
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let a = <Args as clap::Parser>::parse();
    if a.teammates == 0 || a.rounds == 0 {
        eprintln!("idle_team: --teammates and --rounds must be at least 1");
        return ExitCode::FAILURE;
    }
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("idle_team: a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, mail) in common::mailboxes(dir.path()) {
        if let Err(e) = measure(name, mail, &a).await {
            eprintln!("idle_team: {name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
