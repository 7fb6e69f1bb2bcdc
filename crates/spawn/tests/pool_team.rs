//! A team whose teammates run on a pool's workers, against a real Redis server
//! (`scripts/redis-server.sh start`): the lead in this process, each teammate on a worker of its
//! own. `SendMessage` reaches a teammate on another worker — from the lead and from a teammate
//! — idle notices and shutdowns cross hosts, the lead's run waits for its teammates' work as
//! for a team beside it, and each teammate's end is one task notification. Without
//! `FORKHIVE_REDIS_URL` the tests say they were skipped; under `CI=true` that is a failure.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use forkhive_spawn::control::SendMessageTool;
use forkhive_spawn::mailbox::Letter;
use forkhive_spawn::pool::{Job, Pool, PoolAgentTool, PoolConfig, Worker, WorkerReport};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::team::{MemberState, Team};
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_transport::{Backend, Request};
use support::*;
use tokio_util::sync::CancellationToken;

fn text_of(r: &Request) -> String {
    r.all_messages()
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many of the assistant's tool calls so far have `needle` in their input.
fn called(r: &Request, needle: &str) -> usize {
    r.all_messages()
        .iter()
        .flat_map(|m| {
            m.tool_uses()
                .map(|(_, _, input)| input.as_str().contains(needle))
        })
        .filter(|hit| *hit)
        .count()
}

fn teammate(name: &str) -> String {
    format!(
        r#"{{"description":"{name}","prompt":"task for {name}","subagent_type":"worker","name":"{name}","team_name":"review"}}"#
    )
}

/// A worker of one slot whose agents think with `backend` and have `SendMessage` (and
/// `extra`).
fn worker(
    pool: &Pool,
    name: &str,
    backend: Arc<dyn Backend>,
    extra: Vec<Arc<dyn Tool>>,
) -> (
    tokio::task::JoinHandle<forkhive_spawn::Result<WorkerReport>>,
    CancellationToken,
) {
    let w = Worker::new(pool.reopen(), name, move |_job: &Job| {
        let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(SendMessageTool::new()?)];
        tools.extend(extra.iter().cloned());
        Ok(Agent::builder(Arc::clone(&backend))
            .model("m")
            .tools(ToolPool::new(tools)?))
    })
    .unwrap();
    let stop = CancellationToken::new();
    (tokio::spawn(w.run(stop.clone())), stop)
}

/// One slot per worker, so two teammates run on two workers.
fn config() -> PoolConfig {
    PoolConfig::default()
        .with_capacity(1)
        .with_lease(Duration::from_secs(3))
        .with_drain(Duration::from_secs(2))
}

/// The lead with the pool's `Agent` tool (teams on) and `SendMessage`, in `team`.
async fn lead(pool: &Pool, team: &Arc<Team>, b: Arc<Brain>) -> Agent {
    let tools = ToolPool::new(vec![
        Arc::new(
            PoolAgentTool::new(pool.clone())
                .unwrap()
                .with_teams(true)
                .unwrap(),
        ) as Arc<dyn Tool>,
        Arc::new(SendMessageTool::new().unwrap()),
    ])
    .unwrap();
    Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(team))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(40)))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teammates_on_two_workers_talk_idle_wake_and_shut_down() {
    let Some(url) = redis_url() else { return };
    let pool = Pool::new(&url, &key_prefix("team"), "crew", config()).unwrap();
    let b = brain(|r| {
        let all = r.all_messages();
        let text = text_of(r);
        if !is_parent(r) {
            let first = all[0].text();
            if first.contains("task for alice") {
                if text.contains("one more thing") {
                    return Plan::Reply(say("more done"));
                }
                return match all.len() {
                    1 => Plan::Reply(calls(&[
                        (
                            "s1",
                            "SendMessage",
                            r#"{"to":"team-lead","message":"found the bug in auth.rs","summary":"bug found"}"#,
                        ),
                        (
                            "s2",
                            "SendMessage",
                            r#"{"to":"bob","message":"check auth.rs too"}"#,
                        ),
                    ])),
                    _ => Plan::Reply(say("A done")),
                };
            }
            if text.contains("check auth.rs too") {
                return Plan::Reply(say("B checked auth.rs"));
            }
            return Plan::Reply(say("B done"));
        }
        let sent_more = text.contains("one more thing");
        let asked_stop = called(r, "shutdown_request") > 0;
        match all.len() {
            1 => Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ])),
            _ if text.contains("A done") && text.contains("B checked") && !sent_more => {
                Plan::Reply(calls(&[(
                    "m1",
                    "SendMessage",
                    r#"{"to":"alice","message":"one more thing"}"#,
                )]))
            }
            _ if text.contains("more done") && !asked_stop => Plan::Reply(calls(&[
                (
                    "x1",
                    "SendMessage",
                    r#"{"to":"alice","message":{"type":"shutdown_request","reason":"done"}}"#,
                ),
                (
                    "x2",
                    "SendMessage",
                    r#"{"to":"bob","message":{"type":"shutdown_request"}}"#,
                ),
            ])),
            _ => Plan::Reply(say("waiting")),
        }
    });
    let (w1, stop1) = worker(&pool, "w1", b.clone(), Vec::new());
    let (w2, stop2) = worker(&pool, "w2", b.clone(), Vec::new());
    let team = Arc::new(pool.team("review").unwrap());
    let mut lead = lead(&pool, &team, b).await;
    let run = tokio::time::timeout(Duration::from_secs(60), lead.run("go"))
        .await
        .expect("the team finished");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    // From a teammate on a worker to the lead.
    assert!(
        all.contains(r#"<teammate-message teammate_id=\"alice\" summary=\"bug found\">found the bug in auth.rs</teammate-message>"#),
        "{all}"
    );
    // From alice's worker to bob's: bob's idle notice says what it did with it.
    assert!(all.contains("B checked auth.rs"), "{all}");
    // From the lead to alice, idle on her worker: she woke and worked on it.
    assert!(all.contains("more done"), "{all}");
    // Bookkeeping between hosts never shows.
    assert!(!all.contains("forkhive_team_bookkeeping"), "{all}");
    for who in ["alice", "bob"] {
        assert!(
            all.contains(&format!(
                r#"teammate_id=\"{who}\" summary=\"shutdown_approved\""#
            )),
            "{who}: {all}"
        );
    }
    // Each teammate's end: one notification, in the lead's conversation once.
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 2, "{ns:?}");
    // Each ended on its shutdown, which it had taken: no letter left unread.
    for n in &ns {
        assert_eq!(n.status, forkhive_core::TaskStatus::Completed, "{n:?}");
        assert_eq!(n.note, None, "{n:?}");
    }
    let roster = team.roster();
    assert_eq!(roster.len(), 2);
    assert!(
        roster.iter().all(|m| m.state == MemberState::Stopped),
        "{roster:?}"
    );
    assert_eq!(team.member("alice").unwrap().agent_type, "worker");
    // Each worker ran one of them.
    stop1.cancel();
    stop2.cancel();
    let (r1, r2) = (w1.await.unwrap().unwrap(), w2.await.unwrap().unwrap());
    assert_eq!((r1.ran, r2.ran), (1, 1), "{r1:?} {r2:?}");
    // After its shutdown, a letter to it is an error, never a silent loss.
    assert_eq!(
        team.send("alice", Letter::new("team-lead", "still there?"))
            .await
            .unwrap_err()
            .to_string(),
        "teammate `alice` has shut down, so the message was not delivered"
    );
    // The hosts' bookkeeping is not a letter anyone may send.
    assert_eq!(
        team.send(
            "team-lead",
            Letter::new(
                "alice",
                r#"{"type":"forkhive_team_bookkeeping","op":"taken","ids":["x"]}"#
            )
        )
        .await
        .unwrap_err()
        .to_string(),
        "that text is the team's own bookkeeping between hosts; a letter may not be it"
    );
}

/// The last `requestId` of a plan request in the lead's conversation.
fn last_plan_request(text: &str) -> Option<String> {
    let at = text.rfind("plan_approval_request")?;
    let rest = &text[at..];
    let key = "requestId\\\":\\\"";
    let start = rest.find(key)? + key.len();
    let end = rest[start..].find('\\')?;
    Some(rest[start..start + end].to_owned())
}

/// A teammate started in plan mode on a worker: its worker holds it to read-only tools until
/// the lead, in another process, approves its plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_holds_a_teammate_on_a_worker_until_the_lead_approves() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(url) = redis_url() else { return };
    let pool = Pool::new(&url, &key_prefix("plan"), "crew", config()).unwrap();
    let b = brain(|r| {
        let text = text_of(r);
        let last = last_texts(r).join("\n");
        if !is_parent(r) {
            if last.contains("approved your plan") {
                return Plan::Reply(calls(&[("w2", "Write", "{}")]));
            }
            if r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[("w0", "Write", "{}")]));
            }
            if text.contains("w0") && !text.contains("p1") {
                return Plan::Reply(calls(&[(
                    "p1",
                    "SendMessage",
                    r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"write it"}}"#,
                )]));
            }
            if text.contains("w2") {
                return Plan::Reply(say("written"));
            }
            return Plan::Reply(say("waiting"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"alice","prompt":"task for alice","name":"alice","team_name":"review","mode":"plan"}"#,
            )]));
        }
        if let Some(id) = last_plan_request(&text)
            && called(r, "plan_approval_response") == 0
        {
            return Plan::Reply(calls(&[(
                "r1",
                "SendMessage",
                &format!(
                    r#"{{"to":"alice","message":{{"type":"plan_approval_response","request_id":"{id}","approve":true}}}}"#
                ),
            )]));
        }
        if text.contains("written") && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let writes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&writes);
    let write = TestTool::new("Write", OBJECT, false, move |_, _| {
        let w = Arc::clone(&w);
        async move {
            w.fetch_add(1, Ordering::SeqCst);
            forkhive_spawn::tool::ToolOutput::text("wrote")
        }
    })
    .arc();
    let (w1, stop) = worker(&pool, "w1", b.clone(), vec![write]);
    let team = Arc::new(pool.team("review").unwrap());
    let mut lead = lead(&pool, &team, b).await;
    let run = tokio::time::timeout(Duration::from_secs(60), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        writes.load(Ordering::SeqCst),
        1,
        "only the write after approval ran"
    );
    let all = format!("{:?}", lead.params().messages());
    assert!(all.contains("written"), "{all}");
    assert_eq!(notifications(&lead).len(), 1);
    stop.cancel();
    w1.await.unwrap().unwrap();
}

/// A teammate whose worker died mid-task: the lead, waiting for it, hears `killed` once, and
/// the teammate is stopped on its roster — never silence, never a lead waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_teammate_whose_worker_died_is_reported_killed_and_stopped() {
    let Some(url) = redis_url() else { return };
    let prefix = key_prefix("tkill");
    let pool = Pool::new(
        &url,
        &prefix,
        "crew",
        config().with_lease(Duration::from_millis(600)),
    )
    .unwrap();
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("never asked: its worker is dead"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))])),
            _ => Plan::Reply(say("noted")),
        }
    });
    let team = Arc::new(pool.team("review").unwrap());
    let mut lead = lead(&pool, &team, b.clone()).await;
    let running = tokio::spawn(async move {
        let run = lead.run("go").await;
        (run, lead)
    });
    // The job is in the stream: a worker reads it, starts it, and dies.
    while pool.backlog().await.unwrap() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let jobs = format!("{prefix}:{{crew}}:jobs");
    let _: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&jobs)
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut c)
        .await;
    let read: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("ghost")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&jobs)
        .arg(">")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!matches!(read, redis::Value::Nil), "the ghost read the job");
    let task = team.member("alice").unwrap().task;
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}:{{crew}}:run:{task}"))
        .arg("worker")
        .arg("ghost:1")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        !running.is_finished(),
        "the lead waits for its working teammate"
    );
    let (w1, stop) = worker(&pool, "w1", b, Vec::new());
    let (run, lead) = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the lead's run returned")
        .unwrap();
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(
        (ns[0].task_id, ns[0].status),
        (task, forkhive_core::TaskStatus::Killed)
    );
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    assert_eq!(
        team.send("alice", Letter::new("team-lead", "there?"))
            .await
            .unwrap_err()
            .to_string(),
        "teammate `alice` has shut down, so the message was not delivered"
    );
    stop.cancel();
    let r = w1.await.unwrap().unwrap();
    assert_eq!((r.ran, r.reclaimed_killed), (0, 1), "{r:?}");
}

/// A worker whose factory gives a teammate no `SendMessage` fails it, saying so, rather than
/// run a teammate that could never answer its lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_without_send_message_fails_saying_why() {
    let Some(url) = redis_url() else { return };
    let pool = Pool::new(&url, &key_prefix("nosend"), "crew", config()).unwrap();
    let b = brain(|r| match r.all_messages().len() {
        1 if is_parent(r) => Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))])),
        _ => Plan::Reply(say("noted")),
    });
    let backend: Arc<dyn Backend> = b.clone();
    let w = Worker::new(pool.reopen(), "bare", move |_job: &Job| {
        Ok(Agent::builder(Arc::clone(&backend)).model("m"))
    })
    .unwrap();
    let stop = CancellationToken::new();
    let w1 = tokio::spawn(w.run(stop.clone()));
    let team = Arc::new(pool.team("review").unwrap());
    let mut lead = lead(&pool, &team, b).await;
    let run = tokio::time::timeout(Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(ns[0].status, forkhive_core::TaskStatus::Failed);
    assert_eq!(
        ns[0].summary,
        "Agent \"alice\" failed: the worker gave teammate `alice` no `SendMessage` tool, so it \
         could not answer its lead: a worker's factory adds \
         `forkhive_spawn::control::SendMessageTool` for a job with `teammate`"
    );
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    stop.cancel();
    w1.await.unwrap().unwrap();
}

/// Every refusal on the way to a teammate on a pool, with its exact text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teammate_refusals_on_a_pool_say_what_was_wrong() {
    let Some(url) = redis_url() else { return };
    let pool = Pool::new(&url, &key_prefix("refuse"), "crew", config()).unwrap();
    assert_eq!(
        pool.team("crew").unwrap_err().to_string(),
        "invalid agent configuration: team `crew`: a team on pool `crew` needs a name of its own"
    );
    let calls_of = |inputs: Vec<String>| {
        let inputs = inputs.clone();
        brain(move |r| {
            if r.all_messages().len() == 1 {
                let list: Vec<(String, String)> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, input)| (format!("c{i}"), input.clone()))
                    .collect();
                let refs: Vec<(&str, &str, &str)> = list
                    .iter()
                    .map(|(id, input)| (id.as_str(), "Agent", input.as_str()))
                    .collect();
                Plan::Reply(calls(&refs))
            } else {
                Plan::Reply(say("done"))
            }
        })
    };
    /// The tool results of a lead's first turn, in order.
    async fn results_of(mut lead: Agent) -> Vec<(String, bool)> {
        let run = lead.run("go").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        lead.params()
            .messages()
            .iter()
            .flat_map(message_results)
            .map(|(_, t, e)| (t, e))
            .collect()
    }
    let one = |s: &str| vec![s.to_owned()];
    // Teams not enabled on the tool: its schema has no teammate fields.
    let b = calls_of(one(&teammate("alice")));
    let plain = ToolPool::new(vec![
        Arc::new(PoolAgentTool::new(pool.clone()).unwrap()) as Arc<dyn Tool>
    ])
    .unwrap();
    let team = Arc::new(pool.team("review").unwrap());
    let lead_plain = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(plain)
        .extension(Arc::clone(&team))
        .build()
        .await
        .unwrap();
    assert_eq!(
        results_of(lead_plain).await,
        vec![(
            "invalid input for tool `Agent`:\nat /: Additional properties are not allowed \
             ('name', 'team_name' were unexpected)"
                .to_owned(),
            true
        )]
    );
    // A team beside its lead is not a team on the pool.
    let local = Arc::new(
        Team::new(
            "review",
            Arc::new(forkhive_spawn::mailbox::MemoryMailbox::new()),
        )
        .unwrap(),
    );
    let b = calls_of(one(&teammate("alice")));
    assert_eq!(
        results_of(lead(&pool, &local, b).await).await,
        vec![(
            "team `review` does not run its teammates on pool `crew`: make it with `Pool::team`"
                .to_owned(),
            true
        )]
    );
    // The rest, with the pool's team.
    let b = calls_of(vec![
        teammate("alice").replace("\"review\"", "\"other\""),
        teammate("alice").replace(r#","team_name":"review""#, ""),
        r#"{"description":"d","prompt":"p","mode":"plan"}"#.to_owned(),
        teammate("alice").replace(
            r#""team_name":"review""#,
            r#""team_name":"review","mode":"bypassPermissions""#,
        ),
        teammate("team-lead"),
    ]);
    assert_eq!(
        results_of(lead(&pool, &team, b).await).await,
        vec![
            (
                "no team `other` here; this agent's team is `review`".to_owned(),
                true
            ),
            (
                "a teammate needs both `name` and `team_name`".to_owned(),
                true
            ),
            (
                "`mode` is a teammate's permission mode: give `name` and `team_name` with it"
                    .to_owned(),
                true
            ),
            (
                "invalid input for tool `Agent`:\nat /mode: \"bypassPermissions\" is not one of \
                 \"default\" or \"plan\""
                    .to_owned(),
                true
            ),
            (
                "`team-lead` is the lead's name in a team; give the teammate another".to_owned(),
                true
            ),
        ]
    );
    assert!(team.roster().is_empty(), "{:?}", team.roster());
}

/// A lead whose process went away comes back (the same id, its roster file): attaching its
/// delivery puts its teammates still running on the pool back on its roster, idle, and it
/// leads them on — a letter wakes one, and its shutdown ends it with one notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_lead_gets_its_teammates_on_the_pool_back() {
    use forkhive_core::{TaskId, TaskKind};
    use forkhive_spawn::runtime::{AgentContext, AgentKind, QuerySource};
    let Some(url) = redis_url() else { return };
    let pool = Pool::new(&url, &key_prefix("again"), "crew", config()).unwrap();
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            if text.contains("are you there") {
                return Plan::Reply(say("still here"));
            }
            return Plan::Reply(say("A done"));
        }
        if r.all_messages().len() == 1 && text.contains("go") && !text.contains("back") {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if text.contains("back") && called(r, "are you there") == 0 {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"are you there"}"#,
            )]));
        }
        if text.contains("still here") && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let (w1, stop) = worker(&pool, "w1", b.clone(), Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let roster = dir.path().join("review.json");
    let id = TaskId::generate(TaskKind::Agent);
    let tools = || {
        ToolPool::new(vec![
            Arc::new(
                PoolAgentTool::new(pool.clone())
                    .unwrap()
                    .with_teams(true)
                    .unwrap(),
            ) as Arc<dyn Tool>,
            Arc::new(SendMessageTool::new().unwrap()),
        ])
        .unwrap()
    };
    let build = |team: &Arc<Team>| {
        Agent::builder(b.clone())
            .model("m")
            .system_prompt("You are the parent.")
            .tools(tools())
            .extension(Arc::clone(team))
            .context(AgentContext::new(id, AgentKind::Main, QuerySource::main()))
            // Its process "dies": nothing it started is cancelled.
            .cancel_children_on_drop(false)
            .build()
    };
    let first = Arc::new(
        pool.team("review")
            .unwrap()
            .with_roster_file(&roster)
            .unwrap(),
    );
    let mut lead = build(&first).await.unwrap();
    let run = tokio::time::timeout(Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the first lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(first.member("alice").unwrap().state, MemberState::Idle);
    let alice = first.member("alice").unwrap().task;
    drop(lead);
    drop(first);
    // The same lead, rebuilt: its roster file says alice stopped (its process is gone) until
    // the pool says she is still there.
    let again = Arc::new(
        pool.team("review")
            .unwrap()
            .with_roster_file(&roster)
            .unwrap(),
    );
    assert_eq!(again.member("alice").unwrap().state, MemberState::Stopped);
    let mut lead = build(&again).await.unwrap();
    forkhive_spawn::pool::Delivery::attach(&pool, &lead)
        .await
        .unwrap();
    // Back on the roster, held until she says what she is doing: idle.
    assert_eq!(again.member("alice").unwrap().task, alice);
    let asked = tokio::time::Instant::now();
    while again.member("alice").unwrap().state != MemberState::Idle {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "alice never answered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let run = tokio::time::timeout(Duration::from_secs(30), lead.run("back"))
        .await
        .expect("the restarted lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(all.contains("still here"), "{all}");
    assert!(
        all.contains(r#"teammate_id=\"alice\" summary=\"shutdown_approved\""#),
        "{all}"
    );
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(ns[0].task_id, alice);
    assert_eq!(again.member("alice").unwrap().state, MemberState::Stopped);
    stop.cancel();
    w1.await.unwrap().unwrap();
}
