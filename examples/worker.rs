//! Workers in other processes: a pool on Redis that runs the agents a coordinator hands it.
//!
//! ```text
//! scripts/redis-server.sh start            # prints FORKHIVE_REDIS_URL=...
//! export FORKHIVE_REDIS_URL=redis://127.0.0.1:16379
//!
//! # all in one: 3 worker processes (this program, re-run) and a coordinator here
//! cargo run --features redis --example worker -- demo [--workers 3] [--tasks 30] [--kill-one]
//!
//! # a team: a lead here, its two teammates on two worker processes, writing to each other
//! cargo run --features redis --example worker -- team
//!
//! # or each part in its own terminal, on any host that reaches the Redis server
//! cargo run --features redis --example worker -- worker --name w1 [--capacity 32]
//!     [--base-url URL --model M]   # an OpenAI-compatible server (llama.cpp) instead
//! cargo run --features redis --example worker -- coordinator --tasks 30
//! ```
//!
//! Without `--base-url` a worker's agents answer from a scripted model (`done: <prompt>`,
//! after `--delay-ms`). The coordinator's model is scripted: one turn starts every task through
//! the pool's `Agent` tool, each later turn takes in the notifications that arrived. It prints
//! each task's notification as its conversation records it, once.
//!
//! `team`: the lead starts teammates `alice` and `bob` (`Pool::team`, the pool's `Agent` tool
//! `with_teams`); one-slot workers put them in two processes. Alice writes to Bob, Bob tells
//! the lead, both go idle; the lead asks both to shut down. It prints the letters the lead got
//! and its roster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use forkhive::core::notification::find_notifications;
use forkhive::core::{TaskId, TaskKind};
use forkhive::spawn::control::SendMessageTool;
use forkhive::spawn::pool::{Delivery, Job, Pool, PoolAgentTool, PoolConfig, Worker};
use forkhive::spawn::runtime::{Agent, AgentContext, AgentKind, QuerySource};
use forkhive::spawn::tool::{Tool, ToolPool};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::{Backend, Request, Response, ScriptedBackend};
use tokio_util::sync::CancellationToken;

/// A pool of worker processes on Redis, and a coordinator that hands it work.
#[derive(Parser)]
#[command(name = "worker")]
struct Args {
    /// The Redis server (default: $FORKHIVE_REDIS_URL).
    #[arg(long, global = true)]
    redis: Option<String>,
    /// The key prefix.
    #[arg(long, global = true, default_value = "forkhive")]
    prefix: String,
    /// The pool's name.
    #[arg(long, global = true, default_value = "example")]
    pool: String,
    /// A task's lease, in milliseconds (a dead worker's tasks are reclaimed within it).
    #[arg(long = "lease-ms", global = true, default_value = "3000")]
    lease_ms: u64,
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(Subcommand)]
enum Role {
    /// Join the pool and run the agents it hands out, until standard input closes.
    Worker {
        /// The worker's name, unique among the pool's live workers.
        #[arg(long)]
        name: String,
        /// Agents run at once.
        #[arg(long, default_value = "32")]
        capacity: usize,
        /// The scripted model's delay per answer, in milliseconds.
        #[arg(long = "delay-ms", default_value = "200")]
        delay_ms: u64,
        /// An OpenAI-compatible server for the agents (llama.cpp's `llama-server`).
        #[arg(long = "base-url")]
        base_url: Option<String>,
        /// The model to ask for, with `--base-url`.
        #[arg(long)]
        model: Option<String>,
    },
    /// Hand the pool `--tasks` tasks and print each notification as it is recorded.
    Coordinator {
        /// Tasks to start.
        #[arg(long, default_value = "30")]
        tasks: usize,
    },
    /// A lead here whose teammates `alice` and `bob` run on two worker processes.
    Team,
    /// Both: `--workers` worker processes and a coordinator (the default).
    Demo {
        /// Worker processes.
        #[arg(long, default_value = "3")]
        workers: usize,
        /// Tasks to start.
        #[arg(long, default_value = "30")]
        tasks: usize,
        /// Kill one worker (SIGKILL) once a third of the tasks have reported.
        #[arg(long = "kill-one")]
        kill_one: bool,
    },
}

fn url(a: &Args) -> Result<String, String> {
    a.redis
        .clone()
        .or_else(|| std::env::var("FORKHIVE_REDIS_URL").ok())
        .ok_or_else(|| {
            "no Redis server: pass --redis URL or set FORKHIVE_REDIS_URL \
             (scripts/redis-server.sh start prints one)"
                .to_owned()
        })
}

/// The pool `name` (default: `--pool`) with `--lease-ms` and `capacity` per worker.
fn pool(a: &Args, name: Option<&str>, capacity: usize) -> Result<Pool, String> {
    let config = PoolConfig::default()
        .with_lease(Duration::from_millis(a.lease_ms))
        .with_capacity(capacity);
    Pool::new(&url(a)?, &a.prefix, name.unwrap_or(&a.pool), config).map_err(|e| e.to_string())
}

async fn worker(
    pool: Pool,
    name: &str,
    delay: Duration,
    http: Option<(String, String)>,
) -> Result<(), String> {
    let (backend, model): (Arc<dyn Backend>, String) = match http {
        Some((url, model)) => (
            Arc::new(HttpBackend::openai(HttpConfig::new(url)).map_err(|e| e.to_string())?),
            model,
        ),
        None => {
            let me = name.to_owned();
            (
                Arc::new(ScriptedBackend::from_async_fn(move |r: Request| {
                    let me = me.clone();
                    async move {
                        tokio::time::sleep(delay).await;
                        let prompt = r
                            .all_messages()
                            .first()
                            .map(|m| m.text())
                            .unwrap_or_default();
                        if prompt.contains("<teammate-context>") {
                            return Ok(teammate_turn(&r, &prompt, &me));
                        }
                        Ok(Response::say(format!("done: {prompt}")))
                    }
                })),
                "scripted".to_owned(),
            )
        }
    };
    let w = Worker::new(pool, name, move |job: &Job| {
        // A teammate needs `SendMessage` to reach its lead and its team.
        let tools = ToolPool::new([Arc::new(SendMessageTool::new()?) as Arc<dyn Tool>])?;
        Ok(Agent::builder(Arc::clone(&backend))
            .model(model.clone())
            .tools(tools)
            .system_prompt(format!(
                "You are a worker. Do the task \"{}\" and answer in one line.",
                job.description
            )))
    })
    .map_err(|e| e.to_string())?;
    let stop = CancellationToken::new();
    let s = stop.clone();
    // Stops (draining its running agents) when standard input closes.
    tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
        s.cancel();
    });
    eprintln!("worker {name}: joined the pool");
    let report = w.run(stop).await.map_err(|e| e.to_string())?;
    eprintln!("worker {name}: {report:?}");
    Ok(())
}

/// The scripted model of a teammate on worker `worker`: Alice writes to Bob; Bob, given her
/// letter, tells the lead; after a tool round, or with nothing to do, a line.
fn teammate_turn(r: &Request, prompt: &str, worker: &str) -> Response {
    let all = r.all_messages();
    let last = all.last().map(|m| m.text()).unwrap_or_default();
    let replied = all.iter().any(|m| m.tool_uses().next().is_some());
    if prompt.contains("You are `alice`") && !replied {
        return Response::tool_calls([(
            "SendMessage",
            serde_json::json!({"to": "bob", "message": format!("hello Bob, from Alice on {worker}")}),
        )]);
    }
    if last.contains("from Alice on") {
        return Response::tool_calls([(
            "SendMessage",
            serde_json::json!({
                "to": "team-lead",
                "message": format!("Bob on {worker} got Alice's letter"),
            }),
        )]);
    }
    Response::say(format!("ready on {worker}"))
}

/// A lead whose teammates run on `pool`'s workers (see the module docs).
async fn lead(pool: Pool) -> Result<(), String> {
    let backend = Arc::new(ScriptedBackend::from_fn(move |r| {
        let text = format!("{:?}", r.all_messages());
        let asked = r
            .all_messages()
            .iter()
            .any(|m| m.tool_uses().any(|(_, name, _)| name == "SendMessage"));
        Ok(if r.all_messages().len() == 1 {
            Response::tool_calls(["alice", "bob"].map(|name| {
                (
                    "Agent",
                    serde_json::json!({
                        "description": name,
                        "prompt": "Work with your team.",
                        "name": name,
                        "team_name": "pair",
                    }),
                )
            }))
        } else if text.contains("got Alice's letter") && !asked {
            Response::tool_calls(["alice", "bob"].map(|name| {
                (
                    "SendMessage",
                    serde_json::json!({"to": name, "message": {"type": "shutdown_request"}}),
                )
            }))
        } else {
            Response::say("waiting")
        })
    }));
    let team = Arc::new(pool.team("pair").map_err(|e| e.to_string())?);
    let tool = PoolAgentTool::new(pool.clone())
        .and_then(|t| t.with_teams(true))
        .map_err(|e| e.to_string())?;
    let tools = ToolPool::new([
        Arc::new(tool) as Arc<dyn Tool>,
        Arc::new(SendMessageTool::new().map_err(|e| e.to_string())?),
    ])
    .map_err(|e| e.to_string())?;
    let mut agent = Agent::builder(backend)
        .model("scripted")
        .system_prompt("You lead team `pair`.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let delivery = Delivery::attach(&pool, &agent)
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let run = tokio::time::timeout(Duration::from_secs(120), agent.run("Lead your team."))
        .await
        .map_err(|_| "the team did not finish within 120 s".to_owned())?;
    delivery.flush().await.map_err(|e| e.to_string())?;
    let mut letters = 0;
    let mut ended = 0;
    for m in run.new_messages.iter() {
        let text = m.text();
        for letter in text.split_inclusive("</teammate-message>") {
            if let Some(at) = letter.find("<teammate-message") {
                letters += 1;
                println!("{}", &letter[at..]);
            }
        }
        ended += find_notifications(m).map_err(|e| e.to_string())?.len();
    }
    for m in team.roster() {
        println!("{} ({}, task {})", m.name, m.state, m.task);
    }
    let all = format!("{:?}", run.new_messages);
    println!(
        "{letters} letters and {ended} notifications in {:.1} s; the run {}",
        started.elapsed().as_secs_f64(),
        run.stop
    );
    if !all.contains("got Alice's letter") || ended != 2 {
        return Err("the team did not finish its exchange".to_owned());
    }
    Ok(())
}

fn team_demo(a: &Args) -> Result<(), String> {
    let url = url(a)?;
    let name = format!("team{}", std::process::id());
    // One slot each: the two teammates run in two processes.
    let children = spawn_workers(a, &url, &name, 2, 1, 20)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let result = rt.block_on(async { lead(pool(a, Some(&name), 1)?).await });
    for mut c in children {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    result
}

async fn coordinator(
    pool: Pool,
    tasks: usize,
    on_third: impl FnOnce() + Send + 'static,
) -> Result<(), String> {
    let backend = Arc::new(ScriptedBackend::from_fn(move |r| {
        let submitted = r
            .all_messages()
            .iter()
            .any(|m| m.tool_uses().next().is_some());
        Ok(if submitted {
            Response::say("noted")
        } else {
            Response::tool_calls((0..tasks).map(|i| {
                (
                    "Agent",
                    serde_json::json!({
                        "description": format!("task {i}"),
                        "prompt": format!("job {i}"),
                        "idempotent": i % 2 == 0,
                    }),
                )
            }))
        })
    }));
    let tool = PoolAgentTool::new(pool.clone()).map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut agent = Agent::builder(backend)
        .model("scripted")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).map_err(|e| e.to_string())?)
        .context(AgentContext::new(
            TaskId::generate(TaskKind::Agent),
            AgentKind::Main,
            QuerySource::main(),
        ))
        .events(Arc::new(tx))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let delivery = Delivery::attach(&pool, &agent)
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    // Counts notifications as the conversation takes them in.
    let counting = tokio::spawn(async move {
        let mut n = 0usize;
        let mut on_third = Some(on_third);
        while let Some(e) = rx.recv().await {
            if let forkhive::spawn::runtime::EventKind::MessagesInjected { count } = e.kind {
                n += count;
                if n * 3 >= tasks
                    && let Some(f) = on_third.take()
                {
                    f();
                }
            }
        }
    });
    let run = agent.run("run every job").await;
    delivery.flush().await.map_err(|e| e.to_string())?;
    drop(agent);
    let _ = counting.await;
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen = 0;
    for m in run.new_messages.iter() {
        for n in find_notifications(m).map_err(|e| e.to_string())? {
            seen += 1;
            *by_status.entry(n.status.to_string()).or_default() += 1;
            let note = n.note.map(|t| format!(" ({t})")).unwrap_or_default();
            println!("{} {:<9} {}{note}", n.task_id, n.status, n.summary);
        }
    }
    println!(
        "{seen} notifications for {tasks} tasks in {:.1} s: {by_status:?}; the run {}",
        started.elapsed().as_secs_f64(),
        run.stop
    );
    if seen != tasks {
        return Err(format!("{seen} notifications for {tasks} tasks"));
    }
    Ok(())
}

/// `n` worker processes (this program, re-run) on pool `pool`, each with `capacity` slots and
/// a scripted model answering after `delay_ms`; each stops when its standard input closes.
fn spawn_workers(
    a: &Args,
    url: &str,
    pool: &str,
    n: usize,
    capacity: usize,
    delay_ms: u64,
) -> Result<Vec<std::process::Child>, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    (0..n)
        .map(|i| {
            Command::new(&me)
                .args(["--redis", url, "--prefix", &a.prefix, "--pool", pool])
                .args(["--lease-ms", &a.lease_ms.to_string()])
                .args(["worker", "--name", &format!("w{i}")])
                .args(["--delay-ms", &delay_ms.to_string()])
                .args(["--capacity", &capacity.to_string()])
                .stdin(Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not start a worker: {e}"))
        })
        .collect()
}

fn demo(a: &Args, workers: usize, tasks: usize, kill_one: bool) -> Result<(), String> {
    let url = url(a)?;
    // A pool of this run's own, so a second demo never meets the first one's workers.
    let name = format!("demo{}", std::process::id());
    let children = spawn_workers(a, &url, &name, workers, 4, 300)?;
    let victim = children
        .first()
        .map(std::process::Child::id)
        .filter(|_| kill_one);
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let result = rt.block_on(async {
        coordinator(pool(a, Some(&name), 32)?, tasks, move || {
            if let Some(pid) = victim {
                eprintln!("killing worker w0 (pid {pid}) with SIGKILL");
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        })
        .await
    });
    for mut c in children {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    result
}

fn main() -> ExitCode {
    let a = Args::parse();
    let result = match &a.role {
        Some(Role::Worker {
            name,
            capacity,
            delay_ms,
            base_url,
            model,
        }) => pool(&a, None, *capacity).and_then(|p| {
            let http = match (base_url, model) {
                (Some(u), Some(m)) => Some((u.clone(), m.clone())),
                (None, _) => None,
                (Some(_), None) => return Err("--base-url needs --model".to_owned()),
            };
            tokio::runtime::Runtime::new()
                .map_err(|e| e.to_string())?
                .block_on(worker(p, name, Duration::from_millis(*delay_ms), http))
        }),
        Some(Role::Coordinator { tasks }) => pool(&a, None, 32).and_then(|p| {
            tokio::runtime::Runtime::new()
                .map_err(|e| e.to_string())?
                .block_on(coordinator(p, *tasks, || {}))
        }),
        Some(Role::Demo {
            workers,
            tasks,
            kill_one,
        }) => demo(&a, *workers, *tasks, *kill_one),
        Some(Role::Team) => team_demo(&a),
        None => demo(&a, 3, 30, false),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker: {e}");
            ExitCode::FAILURE
        }
    }
}
