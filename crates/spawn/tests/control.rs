//! `TaskStop` and `SendMessage`: stopping a running child (one `killed` notification), giving
//! a running child a message mid tool round, a child's message to `main`, and every mistake an
//! `is_error` result that lists the valid choices.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_core::TaskStatus;
use forkhive_core::notification::find_notifications;
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::control::{SendMessageTool, TaskStopTool};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskRegistry, TaskService};
use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
use forkhive_transport::{Backend, Request};
use support::*;

/// The task id in the `Agent` tool's "started in the background as task <id>" result.
fn started_id(r: &Request) -> String {
    r.all_messages()
        .iter()
        .flat_map(message_results)
        .collect::<Vec<_>>()
        .iter()
        .find_map(|(_, text, _)| {
            let rest = text.split("as task ").nth(1)?;
            Some(rest.split_whitespace().next()?.to_owned())
        })
        .unwrap()
}

fn registry() -> AgentRegistry {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    AgentRegistry::from_definitions([w])
}

async fn parent(backend: Arc<dyn Backend>) -> (Agent, Arc<TaskService>) {
    build_parent(backend, None, None, 1000).await
}

/// [`parent`] over the task registry `tasks`.
async fn parent_over(
    backend: Arc<dyn Backend>,
    tasks: Arc<dyn TaskRegistry>,
) -> (Agent, Arc<TaskService>) {
    build_parent_over(backend, None, None, 1000, tasks).await
}

/// The tests' parent: the `Agent` tool with a worker type, `TaskStop`, `SendMessage` and
/// sleeping tools (`Long` takes `long_ms`); transcripts in `dir` and events to `events` when
/// given.
async fn build_parent(
    backend: Arc<dyn Backend>,
    dir: Option<&std::path::Path>,
    events: Option<Arc<Events>>,
    long_ms: u64,
) -> (Agent, Arc<TaskService>) {
    let tasks = Arc::new(MemoryTaskRegistry::new());
    build_parent_over(backend, dir, events, long_ms, tasks).await
}

async fn build_parent_over(
    backend: Arc<dyn Backend>,
    dir: Option<&std::path::Path>,
    events: Option<Arc<Events>>,
    long_ms: u64,
    tasks: Arc<dyn TaskRegistry>,
) -> (Agent, Arc<TaskService>) {
    let service = TaskService::new(tasks, TaskConfig::default());
    // Workers keep SendMessage (layer 2 lists it); layer 1 keeps TaskStop from them.
    let config = AgentToolConfig::default()
        .with_registry(registry())
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(TaskStopTool::new().unwrap()) as Arc<dyn Tool>,
        Arc::new(SendMessageTool::new().unwrap()),
        TestTool::sleeper("Slow", true, 200).arc(),
        TestTool::sleeper("Wait", true, 50).arc(),
        TestTool::sleeper("Long", true, long_ms).arc(),
    ])
    .unwrap();
    let mut b = Agent::builder(backend)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&service));
    if let Some(dir) = dir {
        b = b.transcript_dir(dir);
    }
    if let Some(events) = events {
        b = b.events(events);
    }
    (b.build().await.unwrap(), service)
}

#[tokio::test]
async fn task_stop_kills_a_running_child_once_and_refuses_the_rest() {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Hang;
        }
        let n = r.all_messages().len();
        match n {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"forever","prompt":"p","subagent_type":"worker","run_in_background":true}"#,
            )])),
            3 => {
                let id = started_id(r);
                Plan::Reply(calls(&[
                    ("s1", "TaskStop", &format!(r#"{{"task_id":"{id}"}}"#)),
                    ("s2", "TaskStop", r#"{"task_id":"nonsense"}"#),
                ]))
            }
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent(b).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = p.params().messages().to_vec();
    let stop_results = message_results(&msgs[4]);
    assert!(!stop_results[0].2, "{}", stop_results[0].1);
    assert!(stop_results[0].1.starts_with("Stopping task "));
    // Run beside the stop, the worker may or may not be listed yet: the text up to the list.
    assert!(stop_results[1].2);
    assert!(
        stop_results[1]
            .1
            .starts_with("`nonsense` is not a task id; your running tasks: "),
        "{}",
        stop_results[1].1
    );
    let ns = notifications(&p);
    assert_eq!(ns.len(), 1, "exactly one notification");
    assert_eq!(ns[0].status, TaskStatus::Killed);
    assert_eq!(run.children()[0].status, Some(TaskStatus::Killed));
}

#[tokio::test]
async fn messages_reach_a_running_child_at_its_next_round_and_main_from_a_child() {
    let b = brain(|r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return match all.len() {
                // Mid tool round when the parent's message comes.
                1 => {
                    assert!(!last_texts(r).join("").contains("<message"));
                    Plan::Reply(calls(&[("w1", "Slow", "{}")]))
                }
                3 => {
                    let last = all.last().unwrap();
                    let texts = last_texts(r).join("\n");
                    assert!(has_tool_result(r));
                    assert!(
                        texts.contains("\">hello &lt;worker&gt;</message>"),
                        "the message arrives with the tool result: {texts:?} in {last:?}"
                    );
                    Plan::Reply(calls(&[(
                        "w2",
                        "SendMessage",
                        r#"{"to":"main","message":"got it"}"#,
                    )]))
                }
                _ => Plan::Reply(say("worker done")),
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"listen","prompt":"p","subagent_type":"worker","run_in_background":true}"#,
            )])),
            // Let the worker get into its 200 ms tool round first.
            3 => Plan::Reply(calls(&[("p1", "Wait", "{}")])),
            5 => {
                let id = started_id(r);
                Plan::Reply(calls(&[
                    (
                        "m1",
                        "SendMessage",
                        &format!(r#"{{"to":"{id}","message":"hello <worker>"}}"#),
                    ),
                    (
                        "m2",
                        "SendMessage",
                        r#"{"to":"uds:/tmp/sock","message":"x"}"#,
                    ),
                    ("m3", "SendMessage", r#"{"to":"ghost","message":"x"}"#),
                    ("m4", "SendMessage", r#"{"to":"main","message":"x"}"#),
                ]))
            }
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, service) = parent(b).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let worker = run.children()[0].id;
    let msgs = p.params().messages().to_vec();
    let sent = message_results(&msgs[6]);
    assert_eq!(
        sent.iter()
            .map(|(_, t, e)| (t.as_str(), *e))
            .collect::<Vec<_>>(),
        [
            (
                format!("Sent to task {worker}; it reads it at its next tool round.").as_str(),
                false
            ),
            ("`uds:` addresses are not supported by this host", true),
            (
                format!("no recipient `ghost`; send to one of: {worker}").as_str(),
                true
            ),
            (
                "you are the main agent: `main` names the agent that started you",
                true
            ),
        ]
    );
    // The worker's message reached its parent.
    let seen: String = msgs.iter().map(|m| m.text()).collect::<Vec<_>>().join("\n");
    let all_text = format!("{seen}\n{:?}", msgs);
    assert!(
        all_text.contains(&format!("<message from=\\\"{worker}\\\">got it</message>"))
            || all_text.contains(&format!("<message from=\"{worker}\">got it</message>")),
        "{all_text}"
    );
    // Once it ended, a message to it is refused, not dropped.
    assert_eq!(service.parent_of(&worker), None);
    assert_eq!(notifications(&p)[0].status, TaskStatus::Completed);
}

/// Messages sent from several threads while children start and end: each send lands in a
/// running child's queue or says the child is gone, nothing blocks, and once the service is
/// idle no child is reachable any more (its owner cleared it on the way out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_under_contention_land_or_say_the_child_is_gone() {
    use forkhive_spawn::runtime::{PendingMessage, PendingQueue};
    use std::time::Duration;
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(None),
    );
    let queue = PendingQueue::new();
    let mut ids = Vec::new();
    for i in 0..24u64 {
        let child = Agent::builder(brain(move |_| {
            std::thread::sleep(Duration::from_micros(100 * (i % 5)));
            Plan::Reply(say("done"))
        }))
        .model("m")
        .build()
        .await
        .unwrap();
        ids.push(start_child(&service, child, &queue, Start::bare()).await);
    }
    let ids = Arc::new(ids);
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (service, ids) = (Arc::clone(&service), Arc::clone(&ids));
            tokio::spawn(async move {
                let mut landed = 0;
                for _ in 0..50 {
                    for id in ids.iter() {
                        if service
                            .send(id, false, PendingMessage::new("ping", "send-message"))
                            .is_some()
                        {
                            landed += 1;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                landed
            })
        })
        .collect();
    for s in senders {
        tokio::time::timeout(Duration::from_secs(20), s)
            .await
            .expect("a sender blocked")
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(20), service.wait_idle())
        .await
        .expect("the children never ended");
    for id in ids.iter() {
        assert_eq!(service.parent_of(id), None);
        assert!(
            service
                .send(id, false, PendingMessage::new("late", "send-message"))
                .is_none()
        );
    }
    assert_eq!(queue.drain().len(), 24, "one notification per child");
}

/// A worker cannot message a task it did not start — a running sibling included: the refusal
/// says so and lists what it may reach.
#[tokio::test]
async fn a_message_to_a_task_the_caller_did_not_start_is_refused() {
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            let first = all[0].text();
            return match (first.contains("talker"), all.len()) {
                // The sibling stays busy for a second.
                (false, 1) => Plan::Reply(calls(&[("l1", "Long", "{}")])),
                (true, 1) => Plan::Reply(calls(&[("w1", "Slow", "{}")])),
                (true, 3) => {
                    let sibling = seen.lock().unwrap()[1].clone();
                    Plan::Reply(calls(&[(
                        "w2",
                        "SendMessage",
                        &format!(r#"{{"to":"{sibling}","message":"psst"}}"#),
                    )]))
                }
                (true, 5) => {
                    let (_, text, is_error) = results(r).pop().unwrap();
                    assert!(is_error);
                    let sibling = seen.lock().unwrap()[1].clone();
                    assert_eq!(
                        text,
                        format!("task {sibling} is not one of your tasks; send to one of: main")
                    );
                    Plan::Reply(say("refused as expected"))
                }
                _ => Plan::Reply(say("done")),
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"talker","prompt":"talker","subagent_type":"worker","run_in_background":true}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"busy","prompt":"busy","subagent_type":"worker","run_in_background":true}"#,
                ),
            ])),
            3 => {
                let mut got = Vec::new();
                for (_, text, _) in results(r) {
                    let rest = text.split("as task ").nth(1).unwrap();
                    got.push(rest.split_whitespace().next().unwrap().to_owned());
                }
                *seen.lock().unwrap() = got;
                Plan::Reply(say("waiting"))
            }
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent(b).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&p);
    let talker = ns.iter().find(|n| n.summary.contains("talker")).unwrap();
    assert_eq!(talker.status, TaskStatus::Completed, "{:?}", talker.summary);
    assert_eq!(talker.result.as_deref(), Some("refused as expected"));
}

/// A message longer than `MESSAGE_CAP` is refused before it goes anywhere, saying how long it
/// is: what a message carries stays in its recipient's conversation, so a flood of long ones
/// would fill it. One of exactly the cap goes.
#[tokio::test]
async fn a_message_longer_than_the_cap_is_refused_with_its_size() {
    use forkhive_spawn::control::MESSAGE_CAP;
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return match all.len() {
                1 => {
                    let long = "x".repeat(MESSAGE_CAP + 1);
                    let exact = "y".repeat(MESSAGE_CAP - 4);
                    // Counted as its recipient reads it: `&amp;` is five bytes.
                    let amps = "&".repeat(MESSAGE_CAP / 5 + 1);
                    Plan::Reply(calls(&[
                        (
                            "m1",
                            "SendMessage",
                            &format!(r#"{{"to":"main","message":"{long}"}}"#),
                        ),
                        (
                            "m2",
                            "SendMessage",
                            &format!(r#"{{"to":"main","message":"{exact}","summary":"gist"}}"#),
                        ),
                        (
                            "m3",
                            "SendMessage",
                            &format!(r#"{{"to":"main","message":"{amps}"}}"#),
                        ),
                    ]))
                }
                _ => {
                    s2.lock()
                        .unwrap()
                        .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
                    Plan::Reply(say("done"))
                }
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"talker","prompt":"talk","subagent_type":"worker"}"#,
            )])),
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent(b).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[2],
        (
            format!(
                "the message is {} bytes; one carries at most {MESSAGE_CAP}: send the gist, and \
                 write the rest to a file whose path you send",
                (MESSAGE_CAP / 5 + 1) * 5
            ),
            true
        )
    );
    assert_eq!(
        seen[0],
        (
            format!(
                "the message is {} bytes; one carries at most {MESSAGE_CAP}: send the gist, and \
                 write the rest to a file whose path you send",
                MESSAGE_CAP + 1
            ),
            true
        )
    );
    assert!(
        !seen[1].1,
        "{:?}",
        seen[1].0.chars().take(200).collect::<String>()
    );
}

async fn parent_with_transcripts(
    backend: Arc<dyn Backend>,
    dir: &std::path::Path,
) -> (Agent, Arc<TaskService>) {
    build_parent(backend, Some(dir), None, 5000).await
}

async fn parent_with_sink(
    backend: Arc<dyn Backend>,
    dir: &std::path::Path,
    events: Arc<Events>,
) -> (Agent, Arc<TaskService>) {
    build_parent(backend, Some(dir), Some(events), 5000).await
}

/// A message to a worker that has finished resumes it from its transcript: its next request
/// extends the conversation (and so the cache) it left, with the message after its answer, and
/// a second notification reports the new run. It is addressed by its name.
#[tokio::test]
async fn a_message_to_a_finished_worker_resumes_it_from_its_transcript() {
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let worker_requests: Arc<Mutex<Vec<Request>>> = Arc::default();
    let seen = Arc::clone(&worker_requests);
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            seen.lock().unwrap().push(r.clone());
            return match all.len() {
                1 => Plan::Reply(say("first answer")),
                _ => {
                    let text = last_texts(r).join("\n");
                    assert!(text.contains("\">and the tests?</message>"), "{text}");
                    Plan::Reply(say("second answer"))
                }
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"look","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"alpha"}"#,
            )])),
            3 => Plan::Reply(say("waiting")),
            // The first notification has arrived: ask the finished worker a follow-up.
            5 => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alpha","message":"and the tests?"}"#,
            )])),
            7 => Plan::Reply(say("waiting again")),
            _ => Plan::Reply(say("done")),
        }
    });
    let events = Arc::new(Events::default());
    let (mut p, service) = parent_with_sink(b, dir.path(), Arc::clone(&events)).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let worker = run.children()[0].id;
    // The host sees the second run start as a resume of the same task.
    let starts: Vec<String> = events
        .take()
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                forkhive_spawn::runtime::EventKind::ChildStarted { .. }
            )
        })
        .filter_map(|e| e.headline())
        .collect();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(starts[0].contains(&format!("started worker {worker} (background): look")));
    assert!(starts[1].contains(&format!("resumed worker {worker} (background): look")));
    let msgs = p.params().messages().to_vec();
    let sent = message_results(&msgs[6]);
    assert_eq!(
        sent[0],
        (
            "m1".to_owned(),
            format!(
                "Task {worker} had ended (completed); it was resumed from its transcript with \
                 your message and runs in the background again. Its next <task-notification> \
                 reports this run."
            ),
            false
        )
    );
    let ns = notifications(&p);
    assert_eq!(ns.len(), 2, "one notification per run");
    assert!(ns.iter().all(|n| n.task_id == worker));
    assert_eq!(ns[0].result.as_deref(), Some("first answer"));
    assert_eq!(ns[1].result.as_deref(), Some("second answer"));
    assert_eq!(ns[1].status, TaskStatus::Completed);
    // The resumed request extends the first one byte for byte: the cache it left is read.
    let reqs = worker_requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2);
    let (first, second) = (reqs[0].all_messages(), reqs[1].all_messages());
    assert_eq!(second[..first.len()], first[..]);
    assert_eq!(second[first.len()].text(), "first answer");
    // System, tools and contexts unchanged: only the conversation grew.
    if let Some(brk) = reqs[0].fingerprint().diff(&reqs[1].fingerprint()) {
        assert!(brk.to_string().starts_with("messages"), "{brk}");
    }
    // The ledger has a row per run; the record adds up both.
    let rows = run.children();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|c| c.id == worker));
    let record = service.registry().get(&worker).await.unwrap();
    assert_eq!(record.state.to_string(), "completed");
    assert_eq!(
        record.usage.output_tokens,
        rows.iter().map(|c| c.usage.output_tokens).sum::<u64>()
    );
}

/// A finished worker whose record the registry's retention has already forgotten is still
/// offered as resumable (its transcript is there): a message resumes it, recorded again as
/// the same task, and its new run is reported as any resumed run is.
#[tokio::test]
async fn a_message_resumes_a_worker_whose_record_was_forgotten() {
    use forkhive_spawn::task::Retention;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let sent = Arc::new(AtomicBool::new(false));
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return match all.len() {
                1 => Plan::Reply(say("first answer")),
                _ => Plan::Reply(say("second answer")),
            };
        }
        if all.len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"look","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"alpha"}"#,
            )]));
        }
        let notified = all.iter().any(|m| m.text().contains("<task-notification>"));
        if notified && !sent.swap(true, Ordering::SeqCst) {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alpha","message":"and the tests?"}"#,
            )]));
        }
        Plan::Reply(say("waiting"))
    });
    // Every ended record is forgotten at once.
    let tasks = Arc::new(MemoryTaskRegistry::with_retention(Retention {
        max_ended: 0,
        max_age: None,
    }));
    let (mut p, service) = build_parent_over(b, Some(dir.path()), None, 5000, tasks).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let worker = run.children()[0].id;
    let msgs = p.params().messages().to_vec();
    let sent = msgs
        .iter()
        .flat_map(message_results)
        .find(|(id, _, _)| id == "m1")
        .unwrap();
    assert_eq!(
        sent,
        (
            "m1".to_owned(),
            format!(
                "Task {worker} had ended; it was resumed from its transcript with your message \
                 and runs in the background again. Its next <task-notification> reports this \
                 run."
            ),
            false
        )
    );
    let ns = notifications(&p);
    assert_eq!(ns.len(), 2, "one notification per run");
    assert!(ns.iter().all(|n| n.task_id == worker));
    assert_eq!(ns[1].result.as_deref(), Some("second answer"));
    assert_eq!(ns[1].status, TaskStatus::Completed);
    // Ended again, and forgotten again.
    assert!(service.registry().get(&worker).await.is_none());
    assert_eq!(service.live(), 0);
}

/// A stopped worker gets a message too: it is resumed from its transcript — its cancelled
/// tool call answered with an error — and given it.
#[tokio::test]
async fn a_message_to_a_stopped_worker_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return match all.len() {
                1 => Plan::Reply(calls(&[("l1", "Long", "{}")])),
                _ => {
                    let text = format!("{:?}", all);
                    // Stopped mid-call (the call answered as cancelled), or before its first
                    // request if the stop came first.
                    assert!(
                        text.contains("was cancelled") || !text.contains("ToolUse"),
                        "{text}"
                    );
                    assert!(text.contains("wrap up"), "{text}");
                    Plan::Reply(say("wrapped up"))
                }
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"long","prompt":"p","subagent_type":"worker","run_in_background":true}"#,
            )])),
            3 => {
                let id = started_id(r);
                Plan::Reply(calls(&[(
                    "s1",
                    "TaskStop",
                    &format!(r#"{{"task_id":"{id}"}}"#),
                )]))
            }
            5 => Plan::Reply(say("stopping")),
            7 => {
                let id = all
                    .iter()
                    .flat_map(|m| find_notifications(m).unwrap())
                    .next()
                    .unwrap()
                    .task_id;
                Plan::Reply(calls(&[(
                    "m1",
                    "SendMessage",
                    &format!(r#"{{"to":"{id}","message":"wrap up"}}"#),
                )]))
            }
            9 => Plan::Reply(say("waiting")),
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent_with_transcripts(b, dir.path()).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&p);
    assert_eq!(
        ns.iter().map(|n| n.status).collect::<Vec<_>>(),
        [TaskStatus::Killed, TaskStatus::Completed]
    );
    assert_eq!(ns[1].result.as_deref(), Some("wrapped up"));
}

/// Without a transcript there is nothing to resume from: the refusal says so, by id and by
/// the name it was started with (not as a name that never was), and lists who can be reached
/// — not `main` to the agent at the top, which has no one above it.
#[tokio::test]
async fn a_finished_worker_without_a_transcript_cannot_be_resumed_and_says_so() {
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return Plan::Reply(say("answer"));
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"look","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"w2"}"#,
            )])),
            3 => Plan::Reply(say("waiting")),
            5 => {
                let id = started_id(r);
                Plan::Reply(calls(&[
                    (
                        "m1",
                        "SendMessage",
                        &format!(r#"{{"to":"{id}","message":"more"}}"#),
                    ),
                    ("m2", "SendMessage", r#"{"to":"w2","message":"more"}"#),
                ]))
            }
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent(b).await;
    let run = p.run("go").await;
    let worker = run.children()[0].id;
    let msgs = p.params().messages().to_vec();
    let refused = |who: String| {
        format!(
            "{who} is not running (it is completed) and cannot be resumed (it kept no \
             transcript, or was forgotten), so the message was not delivered; none of your \
             tasks in this process is running or can be resumed"
        )
    };
    let answers = message_results(&msgs[6]);
    assert_eq!(answers[0].1, refused(format!("task {worker}")));
    assert_eq!(answers[1].1, refused(format!("`w2` (task {worker})")));
    assert!(answers.iter().all(|(_, _, is_error)| *is_error));
}

/// Names: unique among the caller's agents (two started in one round cannot both take one),
/// and `main` or a task id is reserved.
#[tokio::test]
async fn agent_names_are_unique_checked_and_reserved() {
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return Plan::Reply(calls(&[("l1", "Long", "{}")]));
        }
        let agent = |id: &'static str, name: &str| {
            (
                id,
                "Agent",
                format!(
                    r#"{{"description":"d","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"{name}"}}"#
                ),
            )
        };
        match all.len() {
            1 => {
                let list = [
                    agent("a1", "twin"),
                    agent("a2", "twin"),
                    agent("a3", "main"),
                ];
                let refs: Vec<(&str, &str, &str)> =
                    list.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
                Plan::Reply(calls(&refs))
            }
            3 => Plan::Reply(calls(&[("s1", "TaskStop", r#"{"task_id":"twin"}"#)])),
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent(b).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = p.params().messages().to_vec();
    let res = message_results(&msgs[2]);
    let errors: Vec<&str> = res.iter().filter(|r| r.2).map(|r| r.1.as_str()).collect();
    assert_eq!(errors.len(), 2, "{res:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("could not start the agent: the name `twin` is taken by task ")),
        "{errors:?}"
    );
    assert!(
        errors
            .contains(&"agent name `main` is reserved: `main` and task ids already address agents")
    );
    // TaskStop takes the name too.
    let stop = message_results(&msgs[4]);
    assert!(stop[0].1.starts_with("Stopping task "), "{stop:?}");
    assert_eq!(notifications(&p)[0].status, TaskStatus::Killed);
}

/// Two messages to one finished worker in the same round: one resumes it, the other joins
/// that resume — both are in its first resumed request, and it runs once.
#[tokio::test]
async fn messages_racing_to_resume_one_worker_all_arrive_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return match all.len() {
                1 => Plan::Reply(say("first")),
                _ => {
                    let text = last_texts(r).join("\n");
                    let (one, two) = (text.find(">one</message>"), text.find(">two</message>"));
                    assert!(one.is_some() && two.is_some(), "{text}");
                    Plan::Reply(say("both read"))
                }
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"d","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"w"}"#,
            )])),
            3 => Plan::Reply(say("waiting")),
            5 => Plan::Reply(calls(&[
                ("m1", "SendMessage", r#"{"to":"w","message":"one"}"#),
                ("m2", "SendMessage", r#"{"to":"w","message":"two"}"#),
            ])),
            7 => Plan::Reply(say("waiting again")),
            _ => Plan::Reply(say("done")),
        }
    });
    let (mut p, _service) = parent_with_transcripts(b, dir.path()).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = p.params().messages().to_vec();
    let sent = message_results(&msgs[6]);
    assert!(sent.iter().all(|(_, _, e)| !e), "{sent:?}");
    let ns = notifications(&p);
    assert_eq!(ns.len(), 2, "{ns:?}");
    assert_eq!(ns[1].result.as_deref(), Some("both read"));
}

/// A message by name to a child that has stopped but whose record its owner has not moved on
/// yet (it still says `running`) is refused as "has just stopped", not as "not running (it is
/// running)".
#[tokio::test]
async fn a_message_to_a_child_that_has_just_stopped_says_so() {
    let b = brain(move |r| {
        if !is_parent(r) {
            return Plan::Reply(say("answer"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"look","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"w2"}"#,
            )])),
            // The worker answers at once; its owner is still recording its end.
            3 => Plan::Reply(calls(&[("p1", "Wait", "{}")])),
            5 => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"w2","message":"more"}"#,
            )])),
            _ => Plan::Reply(say("done")),
        }
    });
    // A registry whose moves to a terminal state take 400 ms: a child's record says
    // `running` for that long after it stopped.
    let registry = SlowRegistry {
        end: std::time::Duration::from_millis(400),
        ..SlowRegistry::default()
    };
    let (mut p, _service) = parent_over(b, Arc::new(registry)).await;
    let run = p.run("go").await;
    let worker = run.children()[0].id;
    let msgs = p.params().messages().to_vec();
    let (_, text, is_error) = message_results(&msgs[6]).remove(0);
    assert!(is_error);
    assert_eq!(
        text,
        format!(
            "`w2` (task {worker}) has just stopped and cannot be resumed (it kept no transcript, \
             or was forgotten), so the message was not delivered; none of your tasks in this \
             process is running or can be resumed"
        )
    );
}

/// A host's sink that, when a child emits `Stopped` (its run is over: it has read its queue
/// for the last time, and its owner has not finished it yet), sends it a message with
/// `TaskService::send`, and records whether the service took it.
struct LateSender {
    service: Arc<TaskService>,
    parent: std::sync::OnceLock<forkhive_core::TaskId>,
    sent: std::sync::Mutex<Vec<forkhive_core::TaskId>>,
}

impl std::fmt::Debug for LateSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateSender")
    }
}

impl forkhive_spawn::runtime::EventSink for LateSender {
    fn emit(&self, event: forkhive_spawn::runtime::AgentEvent) {
        if !matches!(
            event.kind,
            forkhive_spawn::runtime::EventKind::Stopped { .. }
        ) || Some(&event.agent) == self.parent.get()
        {
            return;
        }
        let message = forkhive_spawn::runtime::PendingMessage::new(
            "<message from=\"host\">late news</message>",
            forkhive_spawn::runtime::pending::SEND_MESSAGE_ORIGIN,
        );
        if self.service.send(&event.agent, false, message).is_some() {
            self.sent.lock().unwrap().push(event.agent);
        }
    }
}

/// A message the service took for a running child that reaches it after its last read comes
/// back to the parent, never dropped in silence: in a background child's notification, and in
/// a foreground child's tool result (which is where its end is told), also when it completed.
#[tokio::test(start_paused = true)]
async fn a_late_message_comes_back_from_a_foreground_and_a_background_child() {
    for background in [true, false] {
        let input = serde_json::json!({
            "description": "w", "prompt": "p", "subagent_type": "worker",
            "run_in_background": background,
        })
        .to_string();
        let model = brain(move |r| {
            if !is_parent(r) {
                return Plan::Reply(say("worker answer"));
            }
            if has_tool_result(r) {
                return Plan::Reply(say("parent done"));
            }
            Plan::Reply(calls(&[("toolu_w", "Agent", &input)]))
        });
        let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
        let sink = Arc::new(LateSender {
            service: Arc::clone(&service),
            parent: std::sync::OnceLock::new(),
            sent: std::sync::Mutex::default(),
        });
        let tool = AgentTool::new(AgentToolConfig::default().with_registry(registry())).unwrap();
        let mut parent = Agent::builder(model)
            .model("m")
            .system_prompt("You are the parent.")
            .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
            .extension(Arc::clone(&service))
            .events(Arc::clone(&sink) as _)
            .build()
            .await
            .unwrap();
        sink.parent.set(*parent.id()).unwrap();
        let run = parent.run("go").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        assert_eq!(sink.sent.lock().unwrap().len(), 1, "the service took it");
        let told = parent
            .params()
            .messages()
            .iter()
            .flat_map(message_results)
            .map(|(_, text, _)| text)
            .chain(notifications(&parent).into_iter().filter_map(|n| n.note))
            .collect::<Vec<_>>()
            .join("\n");
        // In a foreground child's tool result the message's envelope is defanged: it was
        // meant for the child, and must not read as one the parent was given.
        let late = if background {
            "<message from=\"host\">late news</message>"
        } else {
            "&lt;message from=\"host\">late news&lt;/message>"
        };
        assert!(
            told.contains(&format!(
                "1 message(s) arrived after it stopped reading: {late}"
            )),
            "background={background}: {told}"
        );
    }
}
