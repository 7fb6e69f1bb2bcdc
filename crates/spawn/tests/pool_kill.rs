//! Processes that die: 3 worker processes run 1,000 tasks for one coordinator process, and
//! every task's notification reaches the coordinator's conversation (its transcript) exactly
//! once — as they run; with a worker killed with SIGKILL mid-run (its tasks are reported
//! `killed` with their partial output, or run again when idempotent); and with the coordinator
//! killed with SIGKILL and restarted from its transcript mid-run.
//!
//! The processes are this test binary run again with `FORKHIVE_POOL_ROLE` set (the `role`
//! test below is a no-op otherwise). Needs a Redis server (`scripts/redis-server.sh start`);
//! without `FORKHIVE_REDIS_URL` the tests say they were skipped; under `CI=true` that is a
//! failure.
#![cfg(all(feature = "redis", unix))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::redis_url as url;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkhive_core::notification::find_notifications;
use forkhive_core::{TaskId, TaskStatus};
use forkhive_spawn::pool::{Delivery, Job, Pool, PoolAgentTool, PoolConfig, Worker};
use forkhive_spawn::runtime::{Agent, AgentContext, AgentKind, QuerySource};
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_transport::{Response, ScriptedBackend};
use tokio_util::sync::CancellationToken;

const TASKS: usize = 1000;
const WORKERS: usize = 3;

fn config() -> PoolConfig {
    PoolConfig::default()
        .with_lease(Duration::from_secs(1))
        .with_drain(Duration::from_secs(5))
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// The processes' entry point: a worker or the coordinator, by `FORKHIVE_POOL_ROLE`.
#[test]
fn role() {
    let Ok(role) = std::env::var("FORKHIVE_POOL_ROLE") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pool = Pool::new(
        &env("FORKHIVE_REDIS_URL"),
        &env("FORKHIVE_POOL_PREFIX"),
        "p",
        config(),
    )
    .unwrap();
    match role.as_str() {
        "worker" => rt.block_on(worker(pool)),
        "coordinator" => rt.block_on(coordinator(pool)),
        other => panic!("unknown role {other}"),
    }
}

/// A worker: each task's model waits `FORKHIVE_POOL_DELAY_MS`, then answers.
async fn worker(pool: Pool) {
    let delay = Duration::from_millis(env("FORKHIVE_POOL_DELAY_MS").parse().unwrap());
    let backend = support::answers_done(delay);
    let w = Worker::new(pool, &env("FORKHIVE_POOL_WORKER"), move |_j: &Job| {
        Ok(Agent::builder(backend.clone()).model("m"))
    })
    .unwrap();
    let stop = CancellationToken::new();
    // Stops when its parent test closes its standard input.
    let s = stop.clone();
    tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
        s.cancel();
    });
    let report = w.run(stop).await.unwrap();
    println!("REPORT {report:?}");
}

/// The coordinator: one turn submits every task through the pool's `Agent` tool; each later
/// turn acknowledges what arrived. Restarted, it resumes from its transcript.
async fn coordinator(pool: Pool) {
    let dir = PathBuf::from(env("FORKHIVE_POOL_TRANSCRIPTS"));
    let parent: TaskId = env("FORKHIVE_POOL_PARENT").parse().unwrap();
    let tasks: usize = env("FORKHIVE_POOL_TASKS").parse().unwrap();
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
    let tools =
        ToolPool::new([Arc::new(PoolAgentTool::new(pool.clone()).unwrap()) as Arc<dyn Tool>])
            .unwrap();
    let builder = Agent::builder(backend)
        .model("m")
        .tools(tools)
        .transcript_dir(&dir)
        .limits(
            forkhive_spawn::runtime::Limits::default()
                .with_notification_window(Duration::from_millis(20)),
        );
    let path = dir.join(format!("{parent}.jsonl"));
    let run = if path.exists() {
        let (mut agent, _) = Agent::resume(builder, &path).await.unwrap();
        let delivery = Delivery::attach(&pool, &agent).await.unwrap();
        println!("RESUMED");
        let run = agent.continue_run().await;
        assert!(delivery.flush().await.unwrap());
        run
    } else {
        let mut agent = builder
            .context(AgentContext::new(
                parent,
                AgentKind::Main,
                QuerySource::main(),
            ))
            .build()
            .await
            .unwrap();
        let delivery = Delivery::attach(&pool, &agent).await.unwrap();
        let run = agent.run("run every job").await;
        assert!(delivery.flush().await.unwrap());
        run
    };
    println!("STOP {:?}", run.stop);
}

fn spawn_role(role: &str, vars: &[(&str, String)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "role", "--nocapture", "--test-threads=1"])
        .env("FORKHIVE_POOL_ROLE", role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in vars {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// A notification as the transcript holds it: status, result, summary, note.
type Seen = (TaskStatus, Option<String>, String, Option<String>);

/// Every notification in the transcript, by task: how often, and the statuses.
fn recorded(path: &Path) -> HashMap<TaskId, Vec<Seen>> {
    let mut out: HashMap<TaskId, Vec<Seen>> = HashMap::new();
    let Ok(bytes) = std::fs::read(path) else {
        return out;
    };
    // A line cut by a kill is left out.
    let Ok(t) = forkhive_spawn::transcript::parse(path, &bytes) else {
        let cut = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(&bytes[..0], |i| &bytes[..=i]);
        return match forkhive_spawn::transcript::parse(path, cut) {
            Ok(t) => tally(&t.messages),
            Err(_) => out,
        };
    };
    for (k, v) in tally(&t.messages) {
        out.insert(k, v);
    }
    out
}

fn tally(messages: &[forkhive_core::Message]) -> HashMap<TaskId, Vec<Seen>> {
    let mut out: HashMap<TaskId, Vec<Seen>> = HashMap::new();
    for m in messages {
        for n in find_notifications(m).unwrap() {
            out.entry(n.task_id).or_default().push((
                n.status,
                n.result.clone(),
                n.summary.clone(),
                n.note.clone(),
            ));
        }
    }
    out
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How a run is disturbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    Nothing,
    AWorker,
    TheCoordinator,
}

/// One scenario at a time: each runs four processes on this machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scenario(kill: Kill) {
    let Some(url) = url() else { return };
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let prefix = format!("k{}", nanos % 1_000_000_000_000);
    let dir = tempfile::tempdir().unwrap();
    let parent = TaskId::generate(forkhive_core::TaskKind::Agent);
    let path = dir.path().join(format!("{parent}.jsonl"));
    let vars = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("FORKHIVE_REDIS_URL", url.clone()),
            ("FORKHIVE_POOL_PREFIX", prefix.clone()),
            ("FORKHIVE_POOL_DELAY_MS", "150".to_owned()),
            (
                "FORKHIVE_POOL_TRANSCRIPTS",
                dir.path().display().to_string(),
            ),
            ("FORKHIVE_POOL_PARENT", parent.to_string()),
            ("FORKHIVE_POOL_TASKS", TASKS.to_string()),
        ];
        v.extend(extra.iter().cloned());
        v
    };
    let started = Instant::now();
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|i| {
            spawn_role(
                "worker",
                &vars(&[("FORKHIVE_POOL_WORKER", format!("w{i}"))]),
            )
        })
        .collect();
    let mut coordinator = spawn_role("coordinator", &vars(&[]));
    let count = |p: &Path| recorded(p).values().map(Vec::len).sum::<usize>();
    match kill {
        Kill::Nothing => {}
        Kill::AWorker => {
            wait_for("300 notifications", Duration::from_secs(120), || {
                count(&path) >= 300
            });
            workers[0].kill().unwrap();
            workers[0].wait().unwrap();
            eprintln!("killed worker w0 at {} notifications", count(&path));
        }
        Kill::TheCoordinator => {
            wait_for("300 notifications", Duration::from_secs(120), || {
                count(&path) >= 300
            });
            coordinator.kill().unwrap();
            coordinator.wait().unwrap();
            eprintln!("killed the coordinator at {} notifications", count(&path));
            coordinator = spawn_role("coordinator", &vars(&[]));
        }
    }
    let out = coordinator.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "the coordinator failed: {said}");
    assert!(said.contains("STOP Completed"), "{said}");
    if kill == Kill::TheCoordinator {
        assert!(said.contains("RESUMED"), "{said}");
    }
    let elapsed = started.elapsed();
    let got = recorded(&path);
    let twice: Vec<_> = got.iter().filter(|(_, v)| v.len() != 1).collect();
    assert!(twice.is_empty(), "notified more than once: {twice:?}");
    assert_eq!(got.len(), TASKS, "tasks notified: {} of {TASKS}", got.len());
    let mut by_status: HashMap<TaskStatus, usize> = HashMap::new();
    for v in got.values() {
        *by_status.entry(v[0].0).or_default() += 1;
    }
    // Killed ones carry what they had streamed, if anything, and say why.
    let killed = by_status.get(&TaskStatus::Killed).copied().unwrap_or(0);
    match kill {
        // The killed worker had tasks in flight: the idempotent ones (even-numbered) ran again,
        // the others were reported killed, naming the dead worker.
        Kill::AWorker => {
            assert!(killed >= 1, "{by_status:?}");
            for v in got.values().filter(|v| v[0].0 == TaskStatus::Killed) {
                let (_, _, summary, note) = &v[0];
                let i: usize = summary
                    .trim_start_matches("Agent \"task ")
                    .trim_end_matches("\" was stopped")
                    .parse()
                    .unwrap();
                assert_eq!(
                    i % 2,
                    1,
                    "an idempotent task was reported killed: {summary}"
                );
                assert!(
                    note.as_deref()
                        .unwrap_or("")
                        .starts_with("its worker (w0) stopped answering"),
                    "{note:?}"
                );
            }
        }
        _ => assert_eq!(killed, 0, "{by_status:?}"),
    }
    // Stop the workers: closing their standard input.
    let mut reports = Vec::new();
    for (i, mut w) in workers.into_iter().enumerate() {
        if kill == Kill::AWorker && i == 0 {
            continue;
        }
        drop(w.stdin.take());
        let out = w.wait_with_output().unwrap();
        reports.push(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.find("REPORT").map(|at| l[at..].to_owned()))
                .collect::<String>(),
        );
    }
    eprintln!(
        "{kill:?}: {TASKS} tasks over {WORKERS} workers in {:.1} s; statuses {by_status:?}; {reports:?}",
        elapsed.as_secs_f64()
    );
    // Nothing left behind for the parent.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = Pool::new(&url, &prefix, "p", config()).unwrap();
        use forkhive_spawn::task::queue::NotificationQueue;
        for _ in 0..100 {
            if pool.queue().pending(&parent).await.unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(pool.queue().pending(&parent).await.unwrap().is_empty());
        assert!(pool.outstanding(&parent).await.unwrap().is_empty());
        assert_eq!(pool.backlog().await.unwrap(), 0);
    });
}

#[test]
fn three_workers_one_thousand_tasks_each_notified_once() {
    scenario(Kill::Nothing);
}

#[test]
fn a_worker_killed_mid_run_loses_no_notification() {
    scenario(Kill::AWorker);
}

#[test]
fn a_coordinator_killed_and_restarted_mid_run_gets_each_notification_once() {
    scenario(Kill::TheCoordinator);
}
