//! Workers in other processes, against a real Redis server (`scripts/redis-server.sh start`,
//! which `scripts/test.sh` runs): every task's notification reaches its parent's conversation
//! once; a dead worker's task is reported `killed` with its partial output, or run again when
//! idempotent; jobs that cannot run are dead-lettered and reported; cancels and the session
//! watchdog reach running tasks; a full worker takes no more. The multi-process kill tests are
//! in `pool_kill.rs`. Without `FORKHIVE_REDIS_URL` the tests say they were skipped; under
//! `CI=true` that is a failure.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{key_prefix as prefix, redis_url as url};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::notification::find_notifications;
use forkhive_core::{CacheSafeParams, Message, TaskId, TaskKind, TaskNotification, TaskStatus};
use forkhive_spawn::pool::{Delivery, Job, Pool, PoolAgentTool, PoolConfig, Worker, WorkerReport};
use forkhive_spawn::runtime::Agent;
use forkhive_spawn::task::queue::NotificationQueue;
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_transport::request::events_for;
use forkhive_transport::{Backend, EventStream, Request, Response, ScriptedBackend};
use tokio_util::sync::CancellationToken;

fn fast() -> PoolConfig {
    PoolConfig::default()
        .with_lease(Duration::from_millis(600))
        .with_drain(Duration::from_secs(2))
}

/// A model that answers `done: <prompt>` after `delay`.
fn answering(delay: Duration) -> Arc<dyn Backend> {
    support::answers_done(delay)
}

/// A model that streams `text` and then never finishes its answer.
#[derive(Debug)]
struct Hangs(String);

#[async_trait]
impl Backend for Hangs {
    async fn send(&self, _request: &Request) -> forkhive_transport::Result<Response> {
        futures::future::pending().await
    }
    async fn stream(&self, _request: &Request) -> forkhive_transport::Result<EventStream> {
        let mut events = events_for(&Response::say(self.0.clone()), 1_000_000);
        // Everything up to the text, then silence.
        events.truncate(3);
        let head = futures::stream::iter(events.into_iter().map(Ok));
        Ok(Box::pin(futures::StreamExt::chain(
            head,
            futures::stream::pending(),
        )))
    }
}

fn start_worker(
    pool: &Pool,
    name: &str,
    backend: Arc<dyn Backend>,
) -> (
    tokio::task::JoinHandle<forkhive_spawn::Result<WorkerReport>>,
    CancellationToken,
) {
    let w = Worker::new(pool.reopen(), name, move |_job: &Job| {
        Ok(Agent::builder(Arc::clone(&backend)).model("m"))
    })
    .unwrap();
    let stop = CancellationToken::new();
    (tokio::spawn(w.run(stop.clone())), stop)
}

/// Waits until `parent` has `n` pending notifications.
async fn pending_n(pool: &Pool, parent: &TaskId, n: usize) -> Vec<TaskNotification> {
    for _ in 0..200 {
        let got = pool.queue().pending(parent).await.unwrap();
        if got.len() >= n {
            return got.into_iter().map(|q| q.notification).collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{parent}: fewer than {n} notifications after 10 s");
}

/// A fresh prefix for `test`, pool `p` under it, a network to the same Redis that can be cut
/// (a partition proxy), and the pool on that side of it, with `far`'s settings.
async fn across_a_partition(
    url: &str,
    test: &str,
    far: PoolConfig,
) -> (String, Pool, support::Partition, Pool) {
    let p = prefix(test);
    let pool = Pool::new(url, &p, "p", fast()).unwrap();
    let net = support::Partition::to(url).await;
    let far = Pool::new(&net.url, &p, "p", far).unwrap();
    (p, pool, net, far)
}

/// `agent`'s run on a task of its own; the task hands the agent back with the run.
fn run_aside(
    mut agent: Agent,
) -> tokio::task::JoinHandle<(Agent, forkhive_spawn::runtime::AgentRun)> {
    tokio::spawn(async move {
        let run = agent.run("go").await;
        (agent, run)
    })
}

/// Whether a [`coordinator_of`]'s model is asked again (its tool round has its answers)
/// within `within`, looked at every `step`.
async fn asked_again(asked: &AtomicUsize, within: Duration, step: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    while asked.load(Ordering::SeqCst) < 2 {
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(step).await;
    }
    true
}

fn notifications(agent: &Agent) -> Vec<TaskNotification> {
    agent
        .params()
        .messages()
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect()
}

fn parent() -> TaskId {
    TaskId::generate(TaskKind::Agent)
}

/// A coordinator whose first answer starts `n` tasks on `pool` (`job i`: `task i`), and which
/// then says "noted"; and how many requests its model has had.
async fn coordinator_of(pool: &Pool, n: usize) -> (Agent, Arc<AtomicUsize>) {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            (
                "Agent",
                serde_json::json!({"description": format!("job {i}"), "prompt": format!("task {i}")}),
            )
        })
        .collect();
    let asked = Arc::new(AtomicUsize::new(0));
    let turn = Arc::clone(&asked);
    let coordinator = ScriptedBackend::from_fn(move |_r| {
        Ok(match turn.fetch_add(1, Ordering::SeqCst) {
            0 => Response::tool_calls(calls.clone()),
            _ => Response::say("noted"),
        })
    });
    let agent = Agent::builder(Arc::new(coordinator))
        .model("m")
        .tools(
            ToolPool::new([Arc::new(PoolAgentTool::new(pool.clone()).unwrap()) as Arc<dyn Tool>])
                .unwrap(),
        )
        .build()
        .await
        .unwrap();
    (agent, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_task_reports_once_into_the_coordinators_conversation() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("once"), "p", fast()).unwrap();
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::from_millis(20)));
    let (w2, s2) = start_worker(&pool, "w2", answering(Duration::from_millis(5)));
    let (mut agent, _) = coordinator_of(&pool, 20).await;
    let run = tokio::time::timeout(Duration::from_secs(60), agent.run("go"))
        .await
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let got = notifications(&agent);
    let mut by_task: HashMap<TaskId, usize> = HashMap::new();
    for n in &got {
        *by_task.entry(n.task_id).or_default() += 1;
        assert_eq!(n.status, TaskStatus::Completed, "{n:?}");
        assert!(
            n.result.as_deref().unwrap_or("").starts_with("done: task "),
            "{n:?}"
        );
    }
    assert_eq!(got.len(), 20, "{got:?}");
    assert!(by_task.values().all(|&c| c == 1), "{by_task:?}");
    // Acknowledged once recorded: nothing pending, nothing outstanding.
    let me = *agent.id();
    for _ in 0..100 {
        if pool.queue().pending(&me).await.unwrap().is_empty()
            && pool.outstanding(&me).await.unwrap().is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pool.queue().pending(&me).await.unwrap().is_empty());
    assert!(pool.outstanding(&me).await.unwrap().is_empty());
    s1.cancel();
    s2.cancel();
    let (r1, r2) = (w1.await.unwrap().unwrap(), w2.await.unwrap().unwrap());
    assert_eq!(r1.ran + r2.ran, 20, "{r1:?} {r2:?}");
    assert_eq!(r1.reported + r2.reported, 20);
    assert_eq!(pool.backlog().await.unwrap(), 0);
}

/// The network is cut from the coordinator (its connections open, in silence) while its tasks
/// run and report, for longer than a command may take (10 s): its delivery retries, the
/// reports wait in Redis, and once the network heals every one reaches its conversation
/// exactly once, and is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_cut_off_from_redis_gets_each_notification_once_when_it_heals() {
    let Some(url) = url() else { return };
    let (_, pool, net, far) = across_a_partition(&url, "cutcoord", fast()).await;
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::from_millis(300)));
    let (agent, asked) = coordinator_of(&far, 5).await;
    let me = *agent.id();
    let running = run_aside(agent);
    // Once its five tasks are submitted and their submissions answered (its model is asked
    // again), the coordinator is cut off. (Cut while an answer is on its way, a submission
    // would time out: an error result for that call, its task run all the same.)
    asked_again(&asked, Duration::from_secs(5), Duration::from_millis(10)).await;
    assert_eq!(pool.outstanding(&me).await.unwrap().len(), 5);
    net.cut(true);
    // The reports land in Redis meanwhile.
    pending_n(&pool, &me, 5).await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    net.cut(false);
    let (agent, run) = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the coordinator's run ended once the network healed")
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let got = notifications(&agent);
    let mut by_task: HashMap<TaskId, usize> = HashMap::new();
    for n in &got {
        *by_task.entry(n.task_id).or_default() += 1;
        assert_eq!(n.status, TaskStatus::Completed, "{n:?}");
    }
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(by_task.values().all(|&c| c == 1), "{by_task:?}");
    for _ in 0..100 {
        if pool.queue().pending(&me).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pool.queue().pending(&me).await.unwrap().is_empty());
    s1.cancel();
    w1.await.unwrap().unwrap();
}

/// A submission sent while its host is cut off from Redis gets no answer in time: the pool
/// sends it again, and once the network heals the task is added once — the tries held in
/// the network land too — and runs and is reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_submission_whose_answer_was_lost_is_sent_again_and_added_once() {
    let Some(url) = url() else { return };
    let (p, pool, net, far) = across_a_partition(&url, "lostsubmit", fast()).await;
    let me = parent();
    // Connected before the cut, as a running coordinator is.
    assert!(far.outstanding(&me).await.unwrap().is_empty());
    net.cut(true);
    let job = Job::new(me, "lost", "do it");
    let submitting = tokio::spawn({
        let (far, job) = (far.clone(), job.clone());
        async move { far.submit(&job).await }
    });
    // Past the 10 s a command may take: the first try has failed, the second is on its way.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!submitting.is_finished(), "the error was not the last word");
    net.cut(false);
    let entry = tokio::time::timeout(Duration::from_secs(30), submitting)
        .await
        .expect("submitted once the network healed")
        .unwrap()
        .unwrap();
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let jobs: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(format!("{p}:{{p}}:jobs"))
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    let ids: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        [entry.as_str()],
        "one entry for the task, whatever the tries"
    );
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::from_millis(10)));
    let got = pending_n(&pool, &me, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].task_id, job.task);
    assert_eq!(got[0].status, TaskStatus::Completed);
    s1.cancel();
    w1.await.unwrap().unwrap();
}

/// A coordinator cut off from Redis for longer than a submission's three tries: the `Agent`
/// call says the start was not confirmed and names the task (not "could not start", which
/// would have the model start it again), and the coordinator keeps waiting for it. Once the
/// network heals it hears of the task exactly once: its result had a try landed, or (as
/// here, the tries lost with their connections) `killed` once the store has not listed it
/// for `lost_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_the_pool_never_confirmed_is_waited_for_and_reported_once() {
    let Some(url) = url() else { return };
    let lost_soon = fast().with_lost_after(Duration::from_secs(3));
    let (_, pool, net, far) = across_a_partition(&url, "unconfirmed", lost_soon).await;
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::from_millis(20)));
    let (agent, asked) = coordinator_of(&far, 1).await;
    let me = *agent.id();
    // Connected before the cut, as a running coordinator is.
    assert!(far.outstanding(&me).await.unwrap().is_empty());
    net.cut(true);
    let running = run_aside(agent);
    // Three tries of 10 s each, 1.5 s apart; then the model is asked again.
    assert!(
        asked_again(&asked, Duration::from_secs(60), Duration::from_millis(100)).await,
        "the call answered"
    );
    net.cut(false);
    let (agent, run) = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the coordinator's run ended once the network healed")
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let got = notifications(&agent);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        matches!(got[0].status, TaskStatus::Completed | TaskStatus::Killed),
        "{:?}",
        got[0]
    );
    let said = support::result_texts(&agent.params().messages()[2]);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(!said[0].1, "not an error: the model is not to try again");
    let said = &said[0].0;
    assert!(
        said.starts_with("The pool did not confirm that this agent started")
            && said.contains(&format!("agentId: {}", got[0].task_id))
            && said.contains("whether the pool got task"),
        "{said:?}"
    );
    s1.cancel();
    w1.await.unwrap().unwrap();
}

/// A worker named `ghost` (that will never run again) reads up to `count` new jobs of pool
/// `p` under `prefix`: they stay pending under its name.
async fn ghost_reads(c: &mut redis::aio::MultiplexedConnection, prefix: &str, count: usize) {
    let jobs = format!("{prefix}:{{p}}:jobs");
    // The group may exist already.
    let _: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&jobs)
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(c)
        .await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("ghost")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(&jobs)
        .arg(">")
        .query_async(c)
        .await
        .unwrap();
}

/// What a worker that died mid-task leaves: its entry pending under its name, the run record,
/// its last output, and no lease.
async fn dead_worker_left(pool: &Pool, url: &str, prefix: &str, job: &Job) {
    pool.submit(job).await.unwrap();
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    ghost_reads(&mut c, prefix, 1).await;
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}:{{p}}:run:{}", job.task))
        .arg("worker")
        .arg("ghost:1")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}:{{p}}:out:{}", job.task))
        .arg("half of the work")
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_workers_task_is_reported_killed_with_its_partial_output() {
    let Some(url) = url() else { return };
    let p = prefix("killed");
    let pool = Pool::new(&url, &p, "p", fast()).unwrap();
    let dad = parent();
    let job = Job::new(dad, "audit", "audit it");
    dead_worker_left(&pool, &url, &p, &job).await;
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(got.len(), 1);
    let n = &got[0];
    assert_eq!((n.task_id, n.status), (job.task, TaskStatus::Killed));
    assert_eq!(n.summary, "Agent \"audit\" was stopped");
    assert_eq!(n.result.as_deref(), Some("half of the work"));
    assert_eq!(
        n.note.as_deref(),
        Some(
            "its worker (ghost) stopped answering (it died, or could not reach Redis): its \
             lease of 600 ms ran out mid-task; the result is the output it had streamed by its \
             last renewal"
        )
    );
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reclaimed_killed, r.reported), (0, 1, 1), "{r:?}");
    assert_eq!(pool.backlog().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_workers_idempotent_task_runs_again_elsewhere() {
    let Some(url) = url() else { return };
    let p = prefix("rerun");
    let pool = Pool::new(&url, &p, "p", fast()).unwrap();
    let dad = parent();
    let job = Job::new(dad, "count", "count the files").idempotent(true);
    dead_worker_left(&pool, &url, &p, &job).await;
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (job.task, TaskStatus::Completed)
    );
    assert_eq!(got[0].result.as_deref(), Some("done: count the files"));
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reclaimed_rerun, r.reported), (1, 1, 1), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_that_cannot_run_are_dead_lettered_and_reported() {
    let Some(url) = url() else { return };
    let p = prefix("dead");
    let pool = Pool::new(&url, &p, "p", fast().with_max_deliveries(1)).unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    // Not a job at all.
    let _: String = redis::cmd("XADD")
        .arg(format!("{p}:{{p}}:jobs"))
        .arg("*")
        .arg("task")
        .arg("a12345678")
        .arg("job")
        .arg("{not json")
        .query_async(&mut c)
        .await
        .unwrap();
    // A job delivered once to a worker that died before it started it (no run record), so
    // the second delivery is over the limit of one.
    let dad = parent();
    let job = Job::new(dad, "poison", "crash the worker");
    pool.submit(&job).await.unwrap();
    ghost_reads(&mut c, &p, 100).await;
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (job.task, TaskStatus::Failed)
    );
    assert_eq!(
        got[0].summary,
        "Agent \"poison\" failed: given up after 2 deliveries (dead-lettered)"
    );
    let mut dead = Vec::new();
    for _ in 0..100 {
        dead = pool.dead_letters(10).await.unwrap();
        if dead.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "given up after 2 deliveries",
            "its job is not a job: key must be a string at line 1 column 2"
        ],
        "{dead:?}"
    );
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!((r.ran, r.dead_lettered), (0, 2), "{r:?}");
    assert_eq!(pool.backlog().await.unwrap(), 0);
}

/// A task that runs five times its lease on a live worker keeps its lease: the worker renews
/// it, so the other worker never takes the task over, and it runs and reports once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_task_on_a_live_worker_keeps_its_lease() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("renew"), "p", fast()).unwrap();
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::from_secs(3)));
    let (w2, s2) = start_worker(&pool, "w2", answering(Duration::from_secs(3)));
    let dad = parent();
    let job = Job::new(dad, "long", "take your time");
    pool.submit(&job).await.unwrap();
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (job.task, TaskStatus::Completed)
    );
    // A while longer: a stolen task would report again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pool.queue().pending(&dad).await.unwrap().len(), 1);
    s1.cancel();
    s2.cancel();
    let (r1, r2) = (w1.await.unwrap().unwrap(), w2.await.unwrap().unwrap());
    assert_eq!(r1.ran + r2.ran, 1, "{r1:?} {r2:?}");
    assert_eq!(r1.reported + r2.reported, 1, "{r1:?} {r2:?}");
    for r in [&r1, &r2] {
        assert_eq!(
            (r.reclaimed_killed, r.reclaimed_rerun, r.lost_leases),
            (0, 0, 0),
            "{r:?}"
        );
    }
}

/// A worker cut off from Redis mid-task (its connections open, in silence) stops the run once
/// its lease may have lapsed, unreported (`lost_leases`); the worker that takes the entry over
/// reports it `killed`, with what it had used by its last renewal, once — and still once
/// after the partition heals and the first worker can reach Redis again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_cut_off_from_redis_stops_its_run_and_the_task_is_reported_once() {
    let Some(url) = url() else { return };
    let (p, pool, net, far) = across_a_partition(&url, "partition", fast()).await;
    // One turn that calls a tool (15 tokens), then a model that never answers.
    let model: Arc<dyn Backend> =
        Arc::new(ScriptedBackend::from_async_fn(|r: Request| async move {
            if r.all_messages().len() == 1 {
                return Ok(
                    Response::tool_calls([("Look", serde_json::json!({}))]).with_usage(
                        forkhive_core::Usage {
                            input_tokens: 10,
                            output_tokens: 5,
                            ..Default::default()
                        },
                    ),
                );
            }
            futures::future::pending().await
        }));
    let (w1, s1) = start_worker(&far, "w1", model);
    let dad = parent();
    let job = Job::new(dad, "long", "take your time");
    pool.submit(&job).await.unwrap();
    // Until it runs on w1 (its lease is set).
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let lease = format!("{p}:{{p}}:lease:{}", job.task);
    for _ in 0..200 {
        let held: i64 = redis::cmd("EXISTS")
            .arg(&lease)
            .query_async(&mut c)
            .await
            .unwrap();
        if held == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And until a renewal has carried its first turn's usage.
    let used = format!("{p}:{{p}}:used:{}", job.task);
    for _ in 0..200 {
        let u: Option<String> = redis::cmd("GET")
            .arg(&used)
            .query_async(&mut c)
            .await
            .unwrap();
        if u.is_some_and(|u| u.contains(r#""tool_uses":1"#)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    net.cut(true);
    let (w2, s2) = start_worker(&pool, "w2", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (job.task, TaskStatus::Killed)
    );
    assert!(
        got[0]
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("its worker (w1) stopped answering")),
        "{:?}",
        got[0].note
    );
    let u = &got[0].usage;
    assert_eq!((u.total_tokens, u.tool_uses), (15, 1), "{u:?}");
    assert!(u.duration_ms > 0, "{u:?}");
    // Reported: the renewal's usage is not kept.
    let left: i64 = redis::cmd("EXISTS")
        .arg(&used)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(left, 0);
    net.cut(false);
    // A while longer, the first worker back in touch: it does not report the run it stopped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pool.queue().pending(&dad).await.unwrap().len(), 1);
    s1.cancel();
    s2.cancel();
    let (r1, r2) = (w1.await.unwrap().unwrap(), w2.await.unwrap().unwrap());
    assert_eq!((r1.ran, r1.lost_leases, r1.reported), (1, 1, 0), "{r1:?}");
    assert_eq!((r2.reclaimed_killed, r2.reported), (1, 1), "{r2:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_reaches_a_running_task_on_another_worker() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("cancel"), "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("thinking hard".into())));
    let dad = parent();
    let job = Job::new(dad, "stuck", "never ends");
    pool.submit(&job).await.unwrap();
    // Let it start and renew once (its output is streamed by then).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(pool.cancel(&job.task).await.unwrap(), 1);
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (job.task, TaskStatus::Killed)
    );
    assert_eq!(got[0].note.as_deref(), Some("cancelled"));
    assert_eq!(got[0].result.as_deref(), Some("thinking hard"));
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reported), (1, 1), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_parent_cancels_its_tasks_before_they_start() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("cancel-tree"), "p", fast()).unwrap();
    let dad = parent();
    let jobs: Vec<Job> = (0..3)
        .map(|i| Job::new(dad, format!("j{i}"), "x"))
        .collect();
    for j in &jobs {
        pool.submit(j).await.unwrap();
    }
    assert_eq!(pool.cancel_children(&dad).await.unwrap(), 3);
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 3).await;
    assert!(
        got.iter().all(|n| n.status == TaskStatus::Killed
            && n.note.as_deref() == Some("cancelled before it started")),
        "{got:?}"
    );
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_session_watchdog_stops_a_task_that_runs_too_long() {
    let Some(url) = url() else { return };
    let config = fast().with_session_timeout(Duration::from_secs(1));
    let pool = Pool::new(&url, &prefix("watchdog"), "p", config).unwrap();
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("still going".into())));
    let dad = parent();
    let job = Job::new(dad, "endless", "never ends");
    pool.submit(&job).await.unwrap();
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(got[0].status, TaskStatus::Killed);
    assert_eq!(
        got[0].note.as_deref(),
        Some("the session watchdog stopped it after 1 s")
    );
    assert_eq!(got[0].result.as_deref(), Some("still going"));
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_worker_takes_no_more_until_a_slot_frees() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("capacity"), "p", fast().with_capacity(2)).unwrap();
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let backend: Arc<dyn Backend> = {
        let (now, most) = (Arc::clone(&now), Arc::clone(&most));
        Arc::new(ScriptedBackend::from_async_fn(move |_r| {
            let (now, most) = (Arc::clone(&now), Arc::clone(&most));
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(Response::say("ok"))
            }
        }))
    };
    let dad = parent();
    for i in 0..6 {
        pool.submit(&Job::new(dad, format!("j{i}"), "x"))
            .await
            .unwrap();
    }
    let (w, stop) = start_worker(&pool, "w1", backend);
    let got = pending_n(&pool, &dad, 6).await;
    assert_eq!(got.len(), 6);
    assert_eq!(most.load(Ordering::SeqCst), 2);
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_parent_skips_what_its_conversation_holds() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("restart"), "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let dad = parent();
    let (a, b) = (Job::new(dad, "a", "first"), Job::new(dad, "b", "second"));
    pool.submit(&a).await.unwrap();
    pool.submit(&b).await.unwrap();
    let got = pending_n(&pool, &dad, 2).await;
    // The parent recorded `a` and died before acknowledging it: its resumed conversation
    // holds `a`, and the queue still has both.
    let held = got.iter().find(|n| n.task_id == a.task).unwrap().to_xml();
    let params = CacheSafeParams::builder("m")
        .messages(vec![
            Message::user_text("go"),
            Message::assistant_text("waiting"),
            Message::user_text(held),
        ])
        .build();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let backend = {
        let seen = Arc::clone(&seen);
        ScriptedBackend::from_fn(move |r| {
            seen.lock()
                .unwrap()
                .push(r.all_messages().last().unwrap().clone());
            Ok(Response::say("noted"))
        })
    };
    let mut agent = Agent::builder(Arc::new(backend))
        .params(params)
        .context(forkhive_spawn::runtime::AgentContext::new(
            dad,
            forkhive_spawn::runtime::AgentKind::Main,
            forkhive_spawn::runtime::QuerySource::main(),
        ))
        .build()
        .await
        .unwrap();
    let _delivery = Delivery::attach(&pool, &agent).await.unwrap();
    let run = tokio::time::timeout(Duration::from_secs(20), agent.run_pending())
        .await
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let tasks: Vec<TaskId> = notifications(&agent).iter().map(|n| n.task_id).collect();
    assert_eq!(
        tasks,
        [a.task, b.task],
        "a once (held), b once (delivered now)"
    );
    for _ in 0..100 {
        if pool.queue().pending(&dad).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pool.queue().pending(&dad).await.unwrap().is_empty());
    assert!(pool.outstanding(&dad).await.unwrap().is_empty());
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_name_held_by_a_live_worker_is_refused() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("names"), "p", fast()).unwrap();
    let (w1, s1) = start_worker(&pool, "w1", answering(Duration::ZERO));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (w2, _s2) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let e = w2.await.unwrap().unwrap_err();
    assert_eq!(
        e.to_string(),
        "worker name `w1` is in use in pool `p`: another live worker holds it (a dead one's \
         claim expires within the lease, 600 ms)"
    );
    assert!(matches!(e, forkhive_spawn::Error::Refused(_)), "{e:?}");
    s1.cancel();
    w1.await.unwrap().unwrap();
}

/// A worker goes on taking jobs after what a Redis restart does to it: its blocking read's
/// connection closed (it reads on a new one, not the dead one for ever), and — without
/// persistence — its group gone (made again). Its reading connection names itself for
/// `CLIENT LIST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_reads_on_after_its_connection_closes_and_its_group_is_lost() {
    let Some(url) = url() else { return };
    let p = prefix("restart");
    let pool = Pool::new(&url, &p, "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let dad = parent();
    pool.submit(&Job::new(dad, "one", "first")).await.unwrap();
    pending_n(&pool, &dad, 1).await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let name = format!(" name={p}:{{p}}:worker:w1:reader ");
    let mut reader = None;
    for _ in 0..100 {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut c)
            .await
            .unwrap();
        reader = list
            .lines()
            .find(|l| l.contains(&name))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned);
        if reader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reader = reader.expect("the worker's reading connection is named");
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&reader)
        .query_async(&mut c)
        .await
        .unwrap();
    pool.submit(&Job::new(dad, "two", "second")).await.unwrap();
    pending_n(&pool, &dad, 2).await;
    let _: i64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(format!("{p}:{{p}}:jobs"))
        .arg("workers")
        .query_async(&mut c)
        .await
        .unwrap();
    pool.submit(&Job::new(dad, "three", "third")).await.unwrap();
    let got = pending_n(&pool, &dad, 3).await;
    let mut done: Vec<_> = got
        .iter()
        .map(|n| (n.status, n.result.clone().unwrap_or_default()))
        .collect();
    done.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        done,
        [
            (TaskStatus::Completed, "done: first".to_owned()),
            (TaskStatus::Completed, "done: second".to_owned()),
            (TaskStatus::Completed, "done: third".to_owned()),
        ]
    );
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 3);
}

/// A task the store lost — Redis restarted without persistence: its job, its place in its
/// parent's list and any report gone, so no worker will ever report it — is reported `killed`
/// ("lost") by its parent's delivery after `lost_after`, once, instead of the parent waiting
/// for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_the_store_lost_is_reported_killed_once() {
    let Some(url) = url() else { return };
    let p = prefix("lost");
    let config = fast().with_lost_after(Duration::from_secs(2));
    let pool = Pool::new(&url, &p, "p", config).unwrap();
    let turn = AtomicUsize::new(0);
    let coordinator = ScriptedBackend::from_fn(move |_r| {
        Ok(match turn.fetch_add(1, Ordering::SeqCst) {
            0 => Response::tool_calls(vec![(
                "Agent",
                serde_json::json!({"description": "look around", "prompt": "look"}),
            )]),
            _ => Response::say("noted"),
        })
    });
    let mut agent = Agent::builder(Arc::new(coordinator))
        .model("m")
        .tools(
            ToolPool::new([Arc::new(PoolAgentTool::new(pool.clone()).unwrap()) as Arc<dyn Tool>])
                .unwrap(),
        )
        .build()
        .await
        .unwrap();
    let me = *agent.id();
    // No worker takes it; once it is listed, the store loses everything of this prefix.
    let wipe = {
        let (pool, url, p) = (pool.clone(), url.clone(), p.clone());
        tokio::spawn(async move {
            while pool.outstanding(&me).await.unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{p}:*"))
                .query_async(&mut c)
                .await
                .unwrap();
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut c)
                .await
                .unwrap();
        })
    };
    let run = tokio::time::timeout(Duration::from_secs(30), agent.run("go"))
        .await
        .expect("the run ended: the lost task was reported");
    wipe.await.unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let got = notifications(&agent);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, TaskStatus::Killed);
    assert_eq!(got[0].summary, "Agent \"look around\" was lost");
    assert!(
        got[0].note.as_deref().unwrap_or_default().starts_with(
            "the pool's store no longer holds it (Redis restarted without persistence"
        ),
        "{:?}",
        got[0].note
    );
}

/// A parent the host gives up on leaves nothing in Redis once abandoned: refused while a task
/// of its still runs (it would report into the deleted keys, making them again), done once
/// every task has reported — its undelivered notifications, its task list and its permission
/// stream are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_parent_leaves_no_keys_behind() {
    let Some(url) = url() else { return };
    let prefix = prefix("abandon");
    let pool = Pool::new(&url, &prefix, "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("working".into())));
    let dad = parent();
    let jobs: Vec<Job> = (0..2)
        .map(|i| Job::new(dad, format!("j{i}"), "x"))
        .collect();
    for j in &jobs {
        pool.submit(j).await.unwrap();
    }
    let e = pool.abandon(&dad).await.unwrap_err();
    let mut ids: Vec<String> = jobs.iter().map(|j| j.task.to_string()).collect();
    ids.sort();
    assert_eq!(
        e.to_string(),
        format!(
            "parent {dad} still has tasks queued or running on pool `p`: {}; cancel them and \
             wait for their reports before abandoning it",
            ids.join(", ")
        )
    );
    assert!(matches!(e, forkhive_spawn::Error::Refused(_)), "{e:?}");
    pool.cancel_children(&dad).await.unwrap();
    let reported = pending_n(&pool, &dad, 2).await;
    // One delivered, and left on the task list (its process stopped before it took it off):
    // it holds nothing up.
    pool.queue()
        .delivered(&dad, &[reported[0].task_id.to_string()])
        .await
        .unwrap();
    assert_eq!(pool.outstanding(&dad).await.unwrap().len(), 2);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut keys = || -> Vec<String> {
        let mut k: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*{dad}*"))
            .query(&mut conn)
            .unwrap();
        k.sort();
        k
    };
    assert!(keys().len() >= 2, "{:?}", keys());
    pool.abandon(&dad).await.unwrap();
    assert_eq!(pool.outstanding(&dad).await.unwrap(), []);
    assert!(pool.queue().pending(&dad).await.unwrap().is_empty());
    // No key of the parent's is left.
    assert_eq!(keys(), Vec::<String>::new());
    stop.cancel();
    w.await.unwrap().unwrap();
}

/// A store that cannot be reached is an outage (`Error::Pool`, naming the pool, where and what
/// was being done), not the host's configuration (`Error::Config`, which a host need not
/// retry). Runs without a Redis: nothing answers on port 1.
#[tokio::test]
async fn an_unreachable_store_is_a_pool_error_not_a_configuration_error() {
    let pool = Pool::new("redis://127.0.0.1:1", "fh-down", "p", fast()).unwrap();
    let e = pool.outstanding(&parent()).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, forkhive_spawn::Error::Pool { .. }), "{e:?}");
    assert!(
        text.starts_with("pool `p` at redis://127.0.0.1:1")
            && text.contains(": could not connect: "),
        "{text}"
    );
}

/// A server that refuses what the URL sets — a database it does not have, a user and password
/// it does not know — is the host's configuration (`Error::Config`, which no retry mends), not
/// an outage; the pool, a worker, the notification queue and the registry all say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_refuses_the_urls_settings_is_a_configuration_error() {
    let Some(url) = url() else { return };
    let authority = url.trim_start_matches("redis://");
    for (bad, shown) in [
        (format!("{url}/99"), format!("{url}/99")),
        (
            format!("redis://nobody:hunter2@{authority}"),
            format!("redis://nobody:***@{authority}"),
        ),
    ] {
        let pool = Pool::new(&bad, &prefix("refused"), "p", fast()).unwrap();
        let e = pool.outstanding(&parent()).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, forkhive_spawn::Error::Config(_)), "{e:?}");
        assert!(
            text.starts_with(&format!(
                "invalid agent configuration: Redis at {shown} refused the URL's settings (check \
                 its user, password and database number): "
            )) && !text.contains("hunter2"),
            "{text}"
        );
        let w = Worker::new(pool.reopen(), "w1", |_job: &Job| {
            Ok(Agent::builder(answering(Duration::ZERO)).model("m"))
        })
        .unwrap();
        let e = w.run(CancellationToken::new()).await.unwrap_err();
        assert!(matches!(e, forkhive_spawn::Error::Config(_)), "{e:?}");
        let e = pool.queue().pending(&parent()).await.unwrap_err();
        assert!(matches!(e, forkhive_spawn::Error::Config(_)), "{e:?}");
    }
}

/// A Redis user that may not name connections (`CLIENT` denied, as a managed server's ACL may)
/// still runs a worker: naming its reading connection is a courtesy. A user that may not even
/// `PING` is told at connect time, as the host's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_runs_for_a_user_that_may_not_name_connections() {
    let Some(url) = url() else { return };
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let p = prefix("acl");
    let (user, mute) = (format!("{p}-noclient"), format!("{p}-noping"));
    for (name, deny) in [(&user, "-client"), (&mute, "-ping")] {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(name)
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg(deny)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let authority = url.trim_start_matches("redis://");
    let as_user = format!("redis://{user}:pw@{authority}");
    let pool = Pool::new(&as_user, &p, "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let dad = parent();
    pool.submit(&Job::new(dad, "one", "first")).await.unwrap();
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(got[0].status, TaskStatus::Completed, "{got:?}");
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 1);
    let muted = Pool::new(&format!("redis://{mute}:pw@{authority}"), &p, "p", fast()).unwrap();
    let e = muted.outstanding(&dad).await.unwrap_err();
    assert!(matches!(e, forkhive_spawn::Error::Config(_)), "{e:?}");
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .arg(&mute)
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_submit_runs_the_task_once() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("resubmit"), "p", fast()).unwrap();
    let dad = parent();
    let job = Job::new(dad, "once", "only once");
    let first = pool.submit(&job).await.unwrap();
    assert_eq!(pool.submit(&job).await.unwrap(), first);
    assert_eq!(pool.backlog().await.unwrap(), 1);
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(got.len(), 1);
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_it_cannot_read_is_reported_to_the_parent_it_names() {
    let Some(url) = url() else { return };
    let p = prefix("skew");
    let pool = Pool::new(&url, &p, "p", fast()).unwrap();
    let dad = parent();
    let task = TaskId::generate(TaskKind::Agent);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    // A job from a newer coordinator: a field this worker does not know the shape of.
    let json = format!(r#"{{"task":"{task}","parent":"{dad}","description":7,"prompt":"x"}}"#);
    let _: String = redis::cmd("XADD")
        .arg(format!("{p}:{{p}}:jobs"))
        .arg("*")
        .arg("task")
        .arg(task.to_string())
        .arg("job")
        .arg(&json)
        .query_async(&mut c)
        .await
        .unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!((got[0].task_id, got[0].status), (task, TaskStatus::Failed));
    assert_eq!(
        got[0].summary,
        "Agent failed: the pool could not read its job (its job is not a job: invalid type: \
         integer `7`, expected a string at line 1 column 56)"
    );
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().dead_lettered, 1);
}

#[test]
fn a_config_out_of_range_is_refused() {
    let mut c = PoolConfig::default();
    c.capacity = 0;
    assert_eq!(
        Pool::new("redis://127.0.0.1:1", "fh", "p", c)
            .unwrap_err()
            .to_string(),
        "invalid agent configuration: pool `p`: capacity 0, lease 15000 ms, max deliveries 3: \
         each must be at least 1, 300 ms and 1"
    );
}

/// A coordinator cancelled through its token while its tasks run on a worker (not dropped: the
/// host keeps it) hears each task end, `killed`, in its queue when its run returns — as a
/// local parent hears its children — and waits for nothing after: its run returns as soon as
/// they are in, not at the end of its `cancel_grace`, and its next run returns at once. (The
/// delivery stopped at the cancel, so the run waited its whole grace for notifications that
/// never came, and so did every later run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_coordinator_hears_its_pool_tasks_end_and_waits_no_longer() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("cancel-kept"), "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("working".into())));
    let turn = AtomicUsize::new(0);
    let coordinator = ScriptedBackend::from_fn(move |_r| {
        Ok(match turn.fetch_add(1, Ordering::SeqCst) {
            0 => Response::tool_calls((0..3).map(|i| {
                (
                    "Agent",
                    serde_json::json!({"description": format!("t{i}"), "prompt": "look"}),
                )
            })),
            _ => Response::say("noted"),
        })
    });
    let mut agent = Agent::builder(Arc::new(coordinator))
        .model("m")
        // Far longer than the test waits: a run that waits its grace fails the test.
        .limits(
            forkhive_spawn::runtime::Limits::default().with_cancel_grace(Duration::from_secs(120)),
        )
        .tools(
            ToolPool::new([Arc::new(PoolAgentTool::new(pool.clone()).unwrap()) as Arc<dyn Tool>])
                .unwrap(),
        )
        .build()
        .await
        .unwrap();
    let cancel = agent.cancellation().clone();
    let dad = *agent.id();
    // Cancelled once all three run on the worker.
    let (p2, d2) = (pool.clone(), dad);
    tokio::spawn(async move {
        for _ in 0..200 {
            if p2.outstanding(&d2).await.unwrap().len() == 3 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
    });
    let run = tokio::time::timeout(Duration::from_secs(20), agent.run("go"))
        .await
        .expect("the cancelled run waited for notifications that never came");
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Cancelled);
    let queued: Vec<TaskNotification> = agent
        .pending()
        .drain()
        .iter()
        .map(|m| TaskNotification::parse(&m.text).unwrap())
        .collect();
    assert_eq!(queued.len(), 3, "{queued:?}");
    assert!(
        queued
            .iter()
            .all(|n| n.status == TaskStatus::Killed && n.note.as_deref() == Some("cancelled")),
        "{queued:?}"
    );
    assert_eq!(agent.pending().outstanding(), 0);
    let again = tokio::time::timeout(Duration::from_secs(20), agent.run("and now?"))
        .await
        .expect("a cancelled agent's next run waited");
    assert_eq!(again.stop, forkhive_spawn::runtime::StopReason::Cancelled);
    // Having heard every task, its delivery stops (a child's, ended, keeps no loop and no
    // connection after it).
    let delivery = Delivery::attach(&pool, &agent).await.unwrap();
    for _ in 0..100 {
        if !delivery.is_delivering() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !delivery.is_delivering(),
        "the delivery went on after its parent heard all"
    );
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_parent_cancels_every_task_it_has_on_the_pool() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("drop"), "p", fast()).unwrap();
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("working".into())));
    let agent = Agent::builder(answering(Duration::ZERO))
        .model("m")
        .build()
        .await
        .unwrap();
    let dad = *agent.id();
    let delivery = Delivery::attach(&pool, &agent).await.unwrap();
    for i in 0..3 {
        pool.submit(&Job::new(dad, format!("j{i}"), "x"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(delivery);
    drop(agent);
    let got = pending_n(&pool, &dad, 3).await;
    assert!(
        got.iter().all(|n| n.status == TaskStatus::Killed),
        "{got:?}"
    );
    stop.cancel();
    w.await.unwrap().unwrap();
}

/// One permission request as the coordinator's policy saw it: the asking agent's id, kind
/// and type, the tool, its input and whether it is read-only.
type Asked = (
    TaskId,
    String,
    serde_json::Value,
    bool,
    &'static str,
    Option<String>,
);

/// The coordinator's own policy: `Write` to `secret.txt` is denied, any other allowed; every
/// request is recorded with the agent that asked.
#[derive(Debug, Default)]
struct Guard(std::sync::Mutex<Vec<Asked>>);

#[async_trait]
impl forkhive_spawn::tool::PermissionPolicy for Guard {
    async fn check(
        &self,
        r: forkhive_spawn::tool::PermissionRequest<'_>,
    ) -> forkhive_spawn::tool::PermissionDecision {
        self.0.lock().unwrap().push((
            *r.agent.id(),
            r.tool_name().to_owned(),
            r.input.clone(),
            r.tool.is_read_only(),
            r.agent.kind().as_str(),
            r.agent.agent_type().map(str::to_owned),
        ));
        let path = r.input["path"].as_str().unwrap_or("");
        #[allow(clippy::panic)]
        if path.contains("boom") {
            panic!("the guard tripped");
        }
        if path.contains("secret") {
            forkhive_spawn::tool::PermissionDecision::deny("not that file: ask the user")
        } else {
            forkhive_spawn::tool::PermissionDecision::Allow
        }
    }
}

/// A worker host's own policy: `Write` to a path containing its word is denied there.
#[derive(Debug)]
struct DenyPath(&'static str);

#[async_trait]
impl forkhive_spawn::tool::PermissionPolicy for DenyPath {
    async fn check(
        &self,
        r: forkhive_spawn::tool::PermissionRequest<'_>,
    ) -> forkhive_spawn::tool::PermissionDecision {
        if r.input["path"].as_str().unwrap_or("").contains(self.0) {
            forkhive_spawn::tool::PermissionDecision::deny("this worker never writes there")
        } else {
            forkhive_spawn::tool::PermissionDecision::Allow
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workers_permission_request_is_decided_in_the_coordinators_process() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("bubble"), "p", fast()).unwrap();
    // The worker's model writes the file its prompt names, then says what the tool answered.
    let model = Arc::new(ScriptedBackend::from_fn(|r: &Request| {
        let msgs = r.all_messages();
        let last = msgs.last().unwrap();
        let answered: Vec<String> = last
            .content
            .iter()
            .filter_map(|b| match b {
                forkhive_core::ContentBlock::ToolResult { content, .. } => {
                    Some(format!("{content:?}"))
                }
                _ => None,
            })
            .collect();
        if answered.is_empty() {
            let path = msgs[0].text();
            Ok(Response::tool_calls([(
                "Write",
                serde_json::json!({"path": path}),
            )]))
        } else {
            Ok(Response::say(format!(
                "the tool said: {}",
                answered.join(" ")
            )))
        }
    }));
    let w = Worker::new(pool.reopen(), "w1", move |_job: &Job| {
        // Not read-only: it needs permission.
        let write = support::TestTool::sleeper("Write", false, 0).arc();
        // The worker host's own policy comes first: its denial stands without asking.
        Ok(Agent::builder(model.clone())
            .model("m")
            .policy(Arc::new(DenyPath("local")))
            .tools(ToolPool::new([write]).unwrap()))
    })
    .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(w.run(stop.clone()));
    let turn = AtomicUsize::new(0);
    let coordinator = ScriptedBackend::from_fn(move |_r| {
        Ok(match turn.fetch_add(1, Ordering::SeqCst) {
            0 => Response::tool_calls([
                (
                    "Agent",
                    serde_json::json!({"description": "secret", "prompt": "secret.txt"}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "notes", "prompt": "notes.txt",
                                       "subagent_type": "scribe"}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "local", "prompt": "local.txt"}),
                ),
                // The coordinator's policy panics on this one: the call is denied, saying so.
                (
                    "Agent",
                    serde_json::json!({"description": "boom", "prompt": "boom.txt"}),
                ),
            ]),
            _ => Response::say("noted"),
        })
    });
    let guard = Arc::new(Guard::default());
    let mut agent = Agent::builder(Arc::new(coordinator))
        .model("m")
        .policy(guard.clone())
        .tools(
            ToolPool::new([
                Arc::new(PoolAgentTool::new(pool.clone()).unwrap().with_bubble(true))
                    as Arc<dyn Tool>,
            ])
            .unwrap(),
        )
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(Duration::from_secs(30), agent.run("go"))
        .await
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    let mut got: Vec<(String, String)> = notifications(&agent)
        .into_iter()
        .map(|n| (n.summary, n.result.unwrap_or_default()))
        .collect();
    got.sort();
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        got[0].1.contains(
            "the permission policy panicked while checking `Write`: the guard tripped; the \
             call did not run"
        ),
        "{got:?}"
    );
    assert!(
        got[1].1.contains("this worker never writes there"),
        "{got:?}"
    );
    assert!(
        got[2].1.contains("Write {") && got[2].1.contains("notes.txt"),
        "{got:?}"
    );
    assert!(got[3].1.contains("not that file: ask the user"), "{got:?}");
    // Asked here, once per call, about the worker's agents, with the call's own input.
    // (The coordinator's own `Agent` calls are its policy's too.)
    let mut asked: Vec<_> = guard
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.1 == "Write")
        .cloned()
        .collect();
    asked.sort_by_key(|a| a.2.to_string());
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert_eq!(
        asked
            .iter()
            .map(|a| (a.1.as_str(), a.2["path"].as_str().unwrap(), a.3))
            .collect::<Vec<_>>(),
        [
            ("Write", "boom.txt", false),
            ("Write", "notes.txt", false),
            ("Write", "secret.txt", false)
        ]
    );
    assert!(
        asked.iter().all(|a| a.0 != *agent.id()),
        "asked as the worker's agent"
    );
    // The policy sees the asker as the worker ran it: a subagent, of the type it was started
    // as (it saw every asker as an untyped subagent before).
    assert_eq!(
        asked
            .iter()
            .map(|a| (a.2["path"].as_str().unwrap(), a.4, a.5.as_deref()))
            .collect::<Vec<_>>(),
        [
            ("boom.txt", "subagent", None),
            ("notes.txt", "subagent", Some("scribe")),
            ("secret.txt", "subagent", None)
        ]
    );
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// A worker on `pool` whose agents look for a while (a read-only `Look` of 700 ms, so an agent
/// is mid-tool-round when a message arrives), then answer with `then`; and the
/// [`messaging_coordinator`]'s run against it, which must complete. Returns the coordinator,
/// the worker and its stop token.
async fn message_a_looking_task(
    pool: &Pool,
    then: impl Fn(&Request) -> forkhive_transport::Result<Response> + Send + Sync + 'static,
) -> (
    Agent,
    tokio::task::JoinHandle<forkhive_spawn::Result<WorkerReport>>,
    CancellationToken,
) {
    let model = Arc::new(ScriptedBackend::from_fn(move |r: &Request| {
        if r.all_messages().len() == 1 {
            return Ok(Response {
                usage: forkhive_core::Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Default::default()
                },
                ..Response::tool_calls([("Look", serde_json::json!({}))])
            });
        }
        then(r)
    }));
    let w = Worker::new(pool.reopen(), "w1", move |_job: &Job| {
        let look = support::TestTool::sleeper("Look", true, 700).arc();
        Ok(Agent::builder(model.clone())
            .model("m")
            .tools(ToolPool::new([look]).unwrap()))
    })
    .unwrap();
    let stop = CancellationToken::new();
    let worker = tokio::spawn(w.run(stop.clone()));
    let mut agent = messaging_coordinator(pool).await;
    let run = tokio::time::timeout(Duration::from_secs(30), agent.run("go"))
        .await
        .unwrap();
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    (agent, worker, stop)
}

/// A coordinator on `pool` that starts one task ("look around"), sends it "use the staging
/// database" by the id its tool result gave while it runs, and "and one more thing" once its
/// notification has arrived.
async fn messaging_coordinator(pool: &Pool) -> Agent {
    // The coordinator starts a task, then sends it a message by the id its tool result gave.
    let coordinator = ScriptedBackend::from_fn(|r: &Request| {
        let msgs = r.all_messages();
        Ok(match msgs.len() {
            1 => Response::tool_calls([(
                "Agent",
                serde_json::json!({"description": "look", "prompt": "look around"}),
            )]),
            // Once while it runs, and once after its notification arrived.
            3 | 7 => {
                let said = format!("{:?}", msgs[2].content);
                let at = said.find("agentId: ").unwrap() + "agentId: ".len();
                let id = &said[at..at + 9];
                let text = if msgs.len() == 3 {
                    "use the staging database"
                } else {
                    "and one more thing"
                };
                Response::tool_calls([(
                    "SendMessage",
                    serde_json::json!({"to": id, "message": text}),
                )])
            }
            _ => Response::say("noted"),
        })
    });
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(PoolAgentTool::new(pool.clone()).unwrap()),
        Arc::new(forkhive_spawn::control::SendMessageTool::new().unwrap()),
    ];
    Agent::builder(Arc::new(coordinator))
        .model("m")
        .tools(ToolPool::new(tools).unwrap())
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_message_reaches_a_task_running_on_a_worker() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("send"), "p", fast()).unwrap();
    // The worker's agent repeats what its last message held.
    let (agent, worker, stop) = message_a_looking_task(&pool, |r: &Request| {
        let texts: Vec<String> = r
            .all_messages()
            .last()
            .unwrap()
            .content
            .iter()
            .filter_map(|b| b.as_text().map(str::to_owned))
            .collect();
        Ok(Response::say(format!("heard: {}", texts.join(" "))))
    })
    .await;
    let sent = support_texts(&agent);
    assert!(
        sent.iter().any(|t| t.starts_with("Sent to pool task ")),
        "{sent:?}"
    );
    // After its report, the task takes no more, and says so (not "no recipient").
    assert!(
        sent.iter()
            .any(|t| t.contains("has ended") && t.contains("takes no more messages")),
        "{sent:?}"
    );
    let got = notifications(&agent);
    assert_eq!(got.len(), 1, "{got:?}");
    let result = got[0].result.clone().unwrap_or_default();
    assert!(
        result.contains(&format!(
            "<message from=\"{}\">use the staging database</message>",
            agent.id()
        )),
        "{result}"
    );
    stop.cancel();
    worker.await.unwrap().unwrap();
}

/// Every tool result's text in the agent's conversation.
fn support_texts(agent: &Agent) -> Vec<String> {
    agent
        .params()
        .messages()
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            forkhive_core::ContentBlock::ToolResult { content, .. } => Some(format!("{content:?}")),
            _ => None,
        })
        .map(|t| {
            t.trim_start_matches("Blocks([Text { text: \"")
                .trim_start_matches("Text(\"")
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_to_a_task_that_never_read_it_comes_back_and_an_ended_task_takes_none() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("unread"), "p", fast()).unwrap();
    let dad = parent();
    let job = Job::new(dad, "queued", "x");
    pool.submit(&job).await.unwrap();
    pool.send_message(&job.task, &dad, "use </message> the staging DB")
        .await
        .unwrap();
    // Cancelled before any worker started it: it never read the message.
    pool.cancel(&job.task).await.unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        got[0].note.as_deref(),
        Some(
            format!(
                "cancelled before it started; 1 message(s) arrived after it stopped reading: \
                 <message from=\"{dad}\">use &lt;/message&gt; the staging DB</message>"
            )
            .as_str()
        )
    );
    // Reported: its inbox is closed.
    let e = pool
        .send_message(&job.task, &dad, "too late")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("task {}: it has ended and takes no more messages", job.task)
    );
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attaching_again_while_a_notification_waits_does_not_leave_the_parent_waiting() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("reattach"), "p", fast()).unwrap();
    let mut agent = Agent::builder(answering(Duration::ZERO))
        .model("m")
        .build()
        .await
        .unwrap();
    let dad = *agent.id();
    let first = Delivery::attach(&pool, &agent).await.unwrap();
    let job = Job::new(dad, "one", "x");
    first.expect(job.task);
    pool.submit(&job).await.unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    // Its notification reaches the agent's queue (the promise kept), not yet the conversation.
    for _ in 0..200 {
        if !agent.pending().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(agent.pending().len(), 1);
    // The host attaches again: the task is still outstanding, but no new promise is made.
    let again = Delivery::attach(&pool, &agent).await.unwrap();
    assert_eq!(again.parent(), dad);
    let run = tokio::time::timeout(Duration::from_secs(10), agent.run_pending())
        .await
        .expect("the parent waited for a promise nobody keeps");
    assert_eq!(run.stop, forkhive_spawn::runtime::StopReason::Completed);
    assert_eq!(notifications(&agent).len(), 1);
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pool_tasks_are_recorded_in_a_shared_registry() {
    use forkhive_spawn::task::{RedisTaskRegistry, TaskRegistry, TaskState};
    let Some(url) = url() else { return };
    let p = prefix("registry");
    let registry: Arc<dyn TaskRegistry> = Arc::new(RedisTaskRegistry::new(&url, &p).unwrap());
    let pool = Pool::new(&url, &p, "p", fast())
        .unwrap()
        .with_registry(Arc::clone(&registry));
    let dad = parent();
    let (a, b) = (Job::new(dad, "a", "first"), Job::new(dad, "b", "second"));
    let dead = Job::new(dad, "c", "third");
    dead_worker_left(&pool, &url, &p, &dead).await;
    pool.submit(&a).await.unwrap();
    pool.submit(&b).await.unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::from_millis(60)));
    let got = pending_n(&pool, &dad, 3).await;
    // Recorded by the worker after it reported: give it a moment.
    let mut states = Vec::new();
    for _ in 0..100 {
        states = registry
            .children(&dad)
            .await
            .into_iter()
            .map(|r| (r.description, r.state))
            .collect();
        states.sort_by(|x, y| x.0.cmp(&y.0));
        if states.iter().all(|s| s.1.is_terminal()) && states.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        states,
        [
            ("a".to_owned(), TaskState::Completed),
            ("b".to_owned(), TaskState::Completed),
            ("c".to_owned(), TaskState::Killed),
        ]
    );
    assert!(registry.descendants_usage(&dad).await.output_tokens > 0);
    // Each run's record holds the tool uses and time its notification reports.
    for job in [&a, &b] {
        let n = got.iter().find(|n| n.task_id == job.task).unwrap();
        assert!(n.usage.duration_ms >= 60, "{:?}", n.usage);
        let record = registry.get(&job.task).await.unwrap();
        assert_eq!(
            (record.usage.tool_uses, record.usage.duration_ms),
            (n.usage.tool_uses, n.usage.duration_ms)
        );
    }
    stop.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_worker_still_reports_a_dead_workers_task() {
    let Some(url) = url() else { return };
    let p = prefix("full-reclaim");
    let pool = Pool::new(&url, &p, "p", fast().with_capacity(1)).unwrap();
    let dad = parent();
    let dead = Job::new(dad, "orphan", "x");
    dead_worker_left(&pool, &url, &p, &dead).await;
    // Its only slot is taken by a task that never ends.
    let (w, stop) = start_worker(&pool, "w1", Arc::new(Hangs("busy".into())));
    pool.submit(&Job::new(dad, "endless", "y")).await.unwrap();
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (dead.task, TaskStatus::Killed)
    );
    assert_eq!(got[0].result.as_deref(), Some("half of the work"));
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!(r.reclaimed_killed, 1, "{r:?}");
}

/// A run that panics — here the host's agent factory — is reported `failed` at once, with
/// the panic's message, and counted; the worker goes on and runs the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_panics_is_reported_failed_and_the_worker_goes_on() {
    let Some(url) = url() else { return };
    let p = prefix("panics");
    let pool = Pool::new(&url, &p, "p", fast()).unwrap();
    let backend = answering(Duration::ZERO);
    let w = Worker::new(pool.reopen(), "w1", move |job: &Job| {
        assert!(job.prompt != "boom", "the factory cannot build `boom`");
        Ok(Agent::builder(Arc::clone(&backend)).model("m"))
    })
    .unwrap();
    let stop = CancellationToken::new();
    let w = tokio::spawn(w.run(stop.clone()));
    let dad = parent();
    let bad = Job::new(dad, "bad", "boom");
    pool.submit(&bad).await.unwrap();
    let got = pending_n(&pool, &dad, 1).await;
    assert_eq!(
        (got[0].task_id, got[0].status),
        (bad.task, TaskStatus::Failed)
    );
    assert_eq!(
        got[0].summary,
        "Agent \"bad\" failed: it panicked: the factory cannot build `boom`"
    );
    let good = Job::new(dad, "good", "fine");
    pool.submit(&good).await.unwrap();
    let got = pending_n(&pool, &dad, 2).await;
    assert_eq!(
        (got[1].task_id, got[1].status),
        (good.task, TaskStatus::Completed)
    );
    stop.cancel();
    let r = w.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reported), (2, 2), "{r:?}");
    assert_eq!(
        pool.backlog().await.unwrap(),
        0,
        "both entries acknowledged"
    );
}

/// A run that panics after its conversation recorded a letter: the task is reported `failed`,
/// with the tokens, tool uses and time it had spent, and the letter counts as read (it is not listed as
/// one that arrived after the task stopped reading).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_panics_after_reading_a_letter_counts_it_read() {
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("panic-read"), "p", fast()).unwrap();
    // The request that carries the letter panics.
    let (agent, worker, stop) = message_a_looking_task(&pool, |_r: &Request| {
        panic!("the model cannot answer a letter")
    })
    .await;
    let got = notifications(&agent);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, TaskStatus::Failed);
    assert_eq!(
        got[0].summary,
        "Agent \"look\" failed: it panicked: the model cannot answer a letter"
    );
    let note = got[0].note.clone().unwrap_or_default();
    assert!(!note.contains("arrived after it stopped reading"), "{note}");
    // What it had done before it panicked: one answer of 15 tokens, one look of 700 ms.
    assert_eq!(got[0].usage.total_tokens, 15, "{:?}", got[0].usage);
    assert_eq!(got[0].usage.tool_uses, 1, "{:?}", got[0].usage);
    assert!(got[0].usage.duration_ms >= 700, "{:?}", got[0].usage);
    stop.cancel();
    let r = worker.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reported), (1, 1), "{r:?}");
}

/// A pool task's answer is capped at `RESULT_CAP` as an in-process child's is: it goes into
/// the coordinator's conversation, and would be sent again with every later request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_answer_is_capped_as_in_process() {
    use forkhive_spawn::task::RESULT_CAP;
    let Some(url) = url() else { return };
    let pool = Pool::new(&url, &prefix("cap"), "p", fast()).unwrap();
    let dad = parent();
    let prompt = "z".repeat(RESULT_CAP);
    pool.submit(&Job::new(dad, "long", prompt.clone()))
        .await
        .unwrap();
    let (w, stop) = start_worker(&pool, "w1", answering(Duration::ZERO));
    let got = pending_n(&pool, &dad, 1).await;
    let whole = format!("done: {prompt}");
    assert_eq!(
        got[0].result.as_deref(),
        Some(format!("{}\n[truncated]", &whole[..RESULT_CAP]).as_str())
    );
    stop.cancel();
    assert_eq!(w.await.unwrap().unwrap().ran, 1);
}
