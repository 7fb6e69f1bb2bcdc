//! One owner for every child's life: every way a child can end, in the foreground and the
//! background, as a subagent and as a fork. Each cell checks the five things the owner
//! finishes — the registry's terminal state, the transcript's stop record, the capacity slot,
//! the usage roll-up, the descendants — and, in the background, exactly one notification.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::notification::find_notifications;
use forkhive_core::{TaskNotification, TaskStatus, ToolDefinition};
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, AgentContext, Limits, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskRegistry, TaskService, TaskState};
use forkhive_spawn::tool::{Tool, ToolContext, ToolFilter, ToolOutput, ToolPool};
use support::*;

/// Every way a child can end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its model answers.
    Completes,
    /// Its backend fails.
    Fails,
    /// It reaches its turn limit.
    Limit,
    /// Its backend panics.
    Panics,
    /// It hangs past its deadline (background only).
    Deadline,
    /// It hangs past its tool call's timeout (foreground only).
    ToolTimeout,
    /// Its parent is cancelled.
    ParentCancelled,
    /// Its parent's run future and then the parent agent are dropped.
    ParentDropped,
}

impl End {
    const ALL: [End; 8] = [
        End::Completes,
        End::Fails,
        End::Limit,
        End::Panics,
        End::Deadline,
        End::ToolTimeout,
        End::ParentCancelled,
        End::ParentDropped,
    ];

    fn applies(self, background: bool) -> bool {
        match self {
            End::Deadline => background,
            End::ToolTimeout => !background,
            _ => true,
        }
    }

    fn state(self) -> TaskState {
        match self {
            End::Completes | End::Limit => TaskState::Completed,
            End::Fails | End::Panics => TaskState::Failed,
            _ => TaskState::Killed,
        }
    }

    /// Whether `stop` is the stop record this end leaves.
    fn stop_record(self, stop: &StopReason, fork: bool) -> bool {
        match (self, stop) {
            // A fork's turn limit is fixed (the seeds' 200): its cells use a token budget.
            (End::Limit, StopReason::TokenBudget { limit: 1, .. }) => fork,
            (End::Limit, StopReason::MaxTurns { limit: 1 }) => !fork,
            (End::Limit, _) => false,
            (end, stop) => end.other_stop_record() == *stop,
        }
    }

    fn other_stop_record(self) -> StopReason {
        match self {
            End::Completes | End::Limit => StopReason::Completed,
            End::Fails | End::Panics => StopReason::Failed,
            _ => StopReason::Cancelled,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Cell {
    end: End,
    background: bool,
    fork: bool,
}

/// A tool that answers at once.
#[derive(Debug)]
struct Echo(ToolDefinition);

#[async_trait]
impl Tool for Echo {
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
        ToolOutput::text("echo")
    }
}

/// The model of the whole tree: the parent spawns one child; the child does one successful
/// turn (a subagent starts a background grandchild, a fork calls `Echo`), then ends as its
/// cell says; a grandchild hangs (it answers only when its parent completes normally, which
/// waits for it).
fn model(cell: Cell) -> Arc<Brain> {
    brain(move |r| {
        let me = AgentContext::current().unwrap();
        match me.depth() {
            0 if !has_tool_result(r) => {
                let mut input = serde_json::json!({
                    "description": "child",
                    "prompt": format!("row={:?}", cell.end),
                });
                if !cell.fork {
                    input["subagent_type"] = "worker".into();
                    input["run_in_background"] = cell.background.into();
                }
                Plan::Reply(calls(&[("toolu_child", "Agent", &input.to_string())]))
            }
            0 => Plan::Reply(say("parent done")),
            1 if last_user_text(r).contains("row=") => {
                if cell.fork {
                    Plan::Reply(calls(&[("toolu_echo", "Echo", "{}")]))
                } else {
                    let input = serde_json::json!({
                        "description": "grandchild",
                        "prompt": "work below",
                        "subagent_type": "worker",
                        "run_in_background": true,
                    });
                    Plan::Reply(calls(&[("toolu_gc", "Agent", &input.to_string())]))
                }
            }
            1 => match cell.end {
                End::Completes | End::Limit => Plan::Reply(say("child done")),
                End::Fails => Plan::Fail("the provider is down"),
                End::Panics => Plan::Panic("child exploded"),
                _ => Plan::Hang,
            },
            _ if cell.end == End::Completes => Plan::Reply(say("grandchild done")),
            _ => Plan::Hang,
        }
    })
}

fn config(cell: Cell) -> AgentToolConfig {
    let mut worker = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    worker.system_prompt = "You are a worker.".into();
    AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker]))
        .with_fork_enabled(cell.fork)
        // A fork in the foreground needs the veto: fork mode forces every spawn async.
        .with_background_disabled(cell.fork && !cell.background)
        // Children may spawn their own (layer 1 normally forbids it), in the background too.
        .with_filter(ToolFilter {
            global_disallow: Vec::new(),
            background_allow: vec!["*".into()],
            ..ToolFilter::default()
        })
        .with_child_limits(
            Limits::default()
                .with_max_turns((cell.end == End::Limit && !cell.fork).then_some(1))
                .with_token_budget((cell.end == End::Limit && cell.fork).then_some(1)),
        )
        .with_warm_fanout(None)
        .with_foreground_timeout(Duration::from_secs(10))
}

/// The notifications in the parent's conversation and its queue.
fn delivered(
    parent_messages: &[forkhive_core::Message],
    queued: &[String],
) -> Vec<TaskNotification> {
    let mut out: Vec<TaskNotification> = parent_messages
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    for text in queued {
        out.push(TaskNotification::parse(text).unwrap());
    }
    out
}

async fn run_cell(cell: Cell) {
    let dir = tempfile::tempdir().unwrap();
    let tool = AgentTool::new(config(cell)).unwrap();
    let echo = Echo(ToolDefinition::new("Echo", "echo", OBJECT).unwrap());
    let mut parent = Agent::builder(model(cell))
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>, Arc::new(echo)]).unwrap())
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(Some(Duration::from_secs(60)))
            .with_stall_after(None),
    );
    parent.tree().extensions().insert(Arc::clone(&service));
    let parent_id = *parent.id();
    let queue = parent.pending();
    let registry = Arc::clone(service.registry());

    let mut parent_messages = Vec::new();
    match cell.end {
        End::ParentCancelled => {
            let token = parent.cancellation().clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                token.cancel();
            });
            let run = parent.run("go").await;
            assert_eq!(
                run.stop,
                StopReason::Cancelled,
                "{cell:?}: the root reports its cancel"
            );
            parent_messages = parent.params().messages().to_vec();
        }
        End::ParentDropped => {
            tokio::select! {
                run = parent.run("go") => panic!("{cell:?}: the parent finished: {:?}", run.stop),
                () = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
            // The run future is gone; now the agent.
            drop(parent);
        }
        _ => {
            let run = parent.run("go").await;
            assert_eq!(run.stop, StopReason::Completed, "{cell:?}");
            parent_messages = parent.params().messages().to_vec();
        }
    }
    service.wait_idle().await;

    // 1. The registry's terminal state.
    let children = registry.children(&parent_id).await;
    assert_eq!(children.len(), 1, "{cell:?}");
    let child = &children[0];
    assert_eq!(child.state, cell.end.state(), "{cell:?}");
    // 2. The transcript's stop record.
    let path = child
        .transcript
        .as_ref()
        .expect("the child keeps a transcript");
    let t = forkhive_spawn::transcript::read(path).await.unwrap();
    let last = t.stops.last().map(|s| s.stop.clone());
    assert!(
        last.as_ref()
            .is_some_and(|s| cell.end.stop_record(s, cell.fork)),
        "{cell:?}: {} ends with {last:?}",
        path.display()
    );
    // 3. The slot.
    assert_eq!(service.live(), 0, "{cell:?}: every slot freed");
    // 4. The usage: the child's first turn counted, and rolled up to the root.
    assert!(
        child.usage.output_tokens >= 5,
        "{cell:?}: {:?}",
        child.usage
    );
    // Its first turn called one tool, and the registry says so however it ended.
    assert_eq!(child.usage.tool_uses, 1, "{cell:?}: {:?}", child.usage);
    let below = registry.descendants_usage(&parent_id).await;
    assert!(
        below.output_tokens >= child.tree_usage.output_tokens,
        "{cell:?}"
    );
    assert!(
        child.tree_usage.output_tokens >= child.usage.output_tokens,
        "{cell:?}"
    );
    // 5. The descendants: every one has ended (a grandchild that hung was stopped).
    for gc in registry.children(&child.id).await {
        let want = if cell.end == End::Completes {
            TaskState::Completed
        } else {
            TaskState::Killed
        };
        assert_eq!(gc.state, want, "{cell:?}: the grandchild");
    }
    if !cell.fork {
        assert_eq!(registry.children(&child.id).await.len(), 1, "{cell:?}");
    }
    // Background: exactly one notification, with the child's id and status. Foreground: none.
    let queued: Vec<String> = queue.drain().into_iter().map(|m| m.text).collect();
    let notes: Vec<_> = delivered(&parent_messages, &queued)
        .into_iter()
        .filter(|n| n.task_id == child.id)
        .collect();
    // A foreground child's answer comes with a trailer in plain words (its one turn that
    // called one tool, then the answer: two turns).
    if !cell.background && cell.end == End::Completes {
        let text = parent_messages
            .iter()
            .flat_map(message_results)
            .find(|(id, _, _)| id == "toolu_child")
            .map(|(_, text, _)| text)
            .unwrap_or_default();
        assert!(
            text.contains("1 tool use, ") && text.ends_with(" turns]"),
            "{cell:?}: {text}"
        );
    }
    // A foreground child's failure reaches the model with its reason, transcripts or not.
    if !cell.background && matches!(cell.end, End::Fails | End::Panics) {
        let texts: Vec<String> = parent_messages
            .iter()
            .flat_map(message_results)
            .filter(|(id, _, is_error)| id == "toolu_child" && *is_error)
            .map(|(_, text, _)| text)
            .collect();
        let want = if cell.end == End::Fails {
            "the provider is down"
        } else {
            "child exploded"
        };
        assert!(
            texts.len() == 1 && texts[0].contains(want),
            "{cell:?}: {texts:?}"
        );
    }
    if cell.background {
        assert_eq!(notes.len(), 1, "{cell:?}: exactly one notification");
        assert_eq!(Some(notes[0].status), cell.end.state().status(), "{cell:?}");
    } else {
        assert!(
            notes.is_empty(),
            "{cell:?}: a foreground child is not notified"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn every_end_of_every_child_is_finished_once_by_its_owner() {
    // The panicking rows are expected: keep them out of the output.
    expect_panics("child exploded");
    let mut cells = 0;
    for end in End::ALL {
        for background in [false, true] {
            for fork in [false, true] {
                if end.applies(background) {
                    run_cell(Cell {
                        end,
                        background,
                        fork,
                    })
                    .await;
                    cells += 1;
                }
            }
        }
    }
    assert_eq!(cells, 28);
}

/// A background worker definition and a parent that may spawn it.
async fn parent_of_workers(
    model: Arc<dyn forkhive_transport::Backend>,
    limits: Limits,
    tasks: TaskConfig,
    configure: impl FnOnce(
        forkhive_spawn::runtime::AgentBuilder,
    ) -> forkhive_spawn::runtime::AgentBuilder,
) -> (Agent, Arc<TaskService>) {
    let cell = Cell {
        end: End::Completes,
        background: true,
        fork: false,
    };
    let tool = AgentTool::new(config(cell)).unwrap();
    let b = Agent::builder(model)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .limits(limits);
    let parent = configure(b).build().await.unwrap();
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), tasks);
    parent.tree().extensions().insert(Arc::clone(&service));
    (parent, service)
}

/// The parent spawns one background worker and then keeps calling tools; workers hang.
fn spawner() -> Arc<Brain> {
    brain(|r| {
        let me = AgentContext::current().unwrap();
        if me.depth() > 0 {
            return Plan::Hang;
        }
        if has_tool_result(r) {
            return Plan::Reply(say("waiting"));
        }
        let input = serde_json::json!({
            "description": "worker", "prompt": "work", "subagent_type": "worker",
            "run_in_background": true,
        });
        Plan::Reply(calls(&[("toolu_w", "Agent", &input.to_string())]))
    })
}

/// A run that stops at its turn limit returns with its background child still running; dropping
/// the agent then stops the child, which ends `killed` and still notifies the queue.
#[tokio::test(start_paused = true)]
async fn dropping_an_agent_after_a_limit_stops_its_background_children() {
    let host = tokio_util::sync::CancellationToken::new();
    let (mut parent, service) = parent_of_workers(
        spawner(),
        Limits::default().with_max_turns(Some(1)),
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(None),
        |b| b.cancellation(host.clone()),
    )
    .await;
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::MaxTurns { limit: 1 });
    let children = service.registry().children(parent.id()).await;
    assert_eq!(children.len(), 1);
    assert_eq!(
        children[0].state,
        TaskState::Running,
        "the limit left it running"
    );
    let queue = parent.pending();
    drop(parent);
    service.wait_idle().await;
    let child = service.registry().get(&children[0].id).await.unwrap();
    assert_eq!(child.state, TaskState::Killed);
    assert_eq!(service.live(), 0);
    let notes = queue.drain();
    assert_eq!(notes.len(), 1);
    assert_eq!(
        TaskNotification::parse(&notes[0].text).unwrap().status,
        TaskStatus::Killed
    );
    assert!(
        !host.is_cancelled(),
        "the host's own token is never cancelled by a drop"
    );
}

/// Opting out: a host that owns the children through the service keeps them on drop.
#[tokio::test(start_paused = true)]
async fn an_agent_built_to_keep_its_children_leaves_them_running() {
    let (mut parent, service) = parent_of_workers(
        spawner(),
        Limits::default().with_max_turns(Some(1)),
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(None),
        |b| b.cancel_children_on_drop(false),
    )
    .await;
    let _ = parent.run("go").await;
    let id = service.registry().children(parent.id()).await[0].id;
    drop(parent);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        service.registry().get(&id).await.unwrap().state,
        TaskState::Running
    );
    assert!(service.cancel(&id));
    service.wait_idle().await;
    assert_eq!(
        service.registry().get(&id).await.unwrap().state,
        TaskState::Killed
    );
}

/// A child stopped at its deadline first waits its own `cancel_grace` for what it promised
/// (its children's notifications); its supervisor must not drop it before that wait is over,
/// or the stop record would be lost. (`kill_grace` used to be shorter than `cancel_grace`.)
#[tokio::test(start_paused = true)]
async fn a_child_waiting_for_its_children_at_its_deadline_keeps_its_stop_record() {
    use forkhive_spawn::runtime::PendingQueue;
    let dir = tempfile::tempdir().unwrap();
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(Some(Duration::from_secs(1)))
            .with_stall_after(None)
            .with_kill_grace(Duration::from_secs(2)),
    );
    let own_queue = PendingQueue::new();
    let child = Agent::builder(brain(|_| Plan::Hang))
        .model("m")
        .transcript_dir(dir.path())
        .pending(own_queue.clone())
        .limits(Limits::default().with_cancel_grace(Duration::from_secs(5)))
        .build()
        .await
        .unwrap();
    // One of its own children that will never report.
    let _silent = own_queue.expect();
    let parent_queue = PendingQueue::new();
    let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let started = tokio::time::Instant::now();
    let id = start_child(
        &service,
        child,
        &parent_queue,
        Start {
            description: "patient".into(),
            ..Start::under(parent)
        },
    )
    .await;
    service.wait_idle().await;
    // Deadline (1 s) + its whole cancel_grace (5 s): it returned on its own, not dropped at 3 s.
    assert_eq!(started.elapsed(), Duration::from_secs(6));
    let record = service.registry().get(&id).await.unwrap();
    assert_eq!(record.state, TaskState::Killed);
    let t = forkhive_spawn::transcript::read(record.transcript.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(t.stops.len(), 1);
    assert_eq!(t.stops[0].stop, StopReason::Cancelled);
    let n = TaskNotification::parse(&parent_queue.drain()[0].text).unwrap();
    assert_eq!(
        n.note
            .as_deref()
            .map(|s| s.starts_with("stopped by its 1s deadline")),
        Some(true)
    );
}

/// A child waiting at the end of its turn for its own children is quiet but not stuck: the
/// stall check leaves it alone however long they take, and flags them instead. A child waiting
/// for a promise nothing here keeps is flagged, and so is one hanging in its model call even
/// when it shares its queue with a waiting child.
#[tokio::test(start_paused = true)]
async fn a_child_waiting_for_its_children_is_not_stalled() {
    use forkhive_spawn::runtime::{EventKind, PendingQueue};
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(Some(Duration::from_secs(10))),
    );
    let events = Arc::new(Events::default());
    let root = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let root_queue = PendingQueue::new();
    let start = |parent, description: &str| Start {
        description: description.into(),
        events: Some(Arc::clone(&events) as _),
        ..Start::under(parent)
    };
    let answers = || {
        brain(|r| {
            Plan::Reply(say(if last_user_text(r).contains("<task-notification>") {
                "done"
            } else {
                "waiting"
            }))
        })
    };
    // `patient` answers, then waits for its worker, which hangs in its model call.
    let patient_queue = PendingQueue::new();
    let until_started = patient_queue.expect();
    let patient = Agent::builder(answers())
        .model("m")
        .pending(patient_queue.clone())
        .build()
        .await
        .unwrap();
    let patient = start_child(&service, patient, &root_queue, start(root, "patient")).await;
    let worker = Agent::builder(brain(|_| Plan::Hang))
        .model("m")
        .build()
        .await
        .unwrap();
    let worker = start_child(&service, worker, &patient_queue, start(patient, "worker")).await;
    drop(until_started);
    // `lonely` waits for a promise nobody here keeps.
    let lonely_queue = PendingQueue::new();
    let _never = lonely_queue.expect();
    let lonely = Agent::builder(answers())
        .model("m")
        .pending(lonely_queue)
        .build()
        .await
        .unwrap();
    let lonely = start_child(&service, lonely, &root_queue, start(root, "lonely")).await;
    // `hung` shares the patient's queue and hangs in its model call.
    let hung = Agent::builder(brain(|_| Plan::Hang))
        .model("m")
        .pending(patient_queue.clone())
        .build()
        .await
        .unwrap();
    let hung = start_child(&service, hung, &root_queue, start(root, "hung")).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let stalled = |id| {
        let service = Arc::clone(&service);
        async move { service.registry().get(&id).await.unwrap().stalled }
    };
    assert!(!stalled(patient).await, "waits for its worker");
    assert!(stalled(worker).await);
    assert!(stalled(lonely).await);
    assert!(stalled(hung).await);
    // Its worker stopped, it takes the notification up, answers and finishes, never flagged.
    assert!(service.cancel(&worker));
    assert!(service.cancel(&lonely));
    assert!(service.cancel(&hung));
    service.wait_idle().await;
    let record = service.registry().get(&patient).await.unwrap();
    assert_eq!(record.state, TaskState::Completed);
    assert!(!record.stalled, "{record:?}");
    let mut flagged: Vec<_> = events
        .take()
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::Stalled { .. }))
        .map(|e| e.agent)
        .collect();
    flagged.sort();
    let mut want = vec![worker, lonely, hung];
    want.sort();
    assert_eq!(flagged, want);
}

/// A child that ignores its cancellation is dropped after its grace; its owner writes the stop
/// record it could not write itself, after cutting a half-written last line.
#[tokio::test(start_paused = true)]
async fn a_child_dropped_past_its_grace_gets_its_stop_record_from_its_owner() {
    use forkhive_spawn::runtime::PendingQueue;
    use forkhive_spawn::task::Gate;
    let dir = tempfile::tempdir().unwrap();
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(Some(Duration::from_secs(1)))
            .with_stall_after(None)
            .with_kill_grace(Duration::from_secs(1)),
    );
    let child = Agent::builder(brain(|_| Plan::Hang))
        .model("m")
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let path = child.transcript_path().unwrap().to_path_buf();
    // A crash-cut last line the owner must cut before appending.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(br#"{"type":"message","ind"#).unwrap();
    }
    let queue = PendingQueue::new();
    let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let id = start_child(
        &service,
        child,
        &queue,
        Start {
            description: "stubborn".into(),
            gate: Some(Gate::new(std::future::pending())),
            ..Start::under(parent)
        },
    )
    .await;
    service.wait_idle().await;
    assert_eq!(
        service.registry().get(&id).await.unwrap().state,
        TaskState::Killed
    );
    let t = forkhive_spawn::transcript::read(&path).await.unwrap();
    assert!(t.dropped.is_none(), "the cut line was removed");
    assert_eq!(t.stops.len(), 1);
    assert_eq!(t.stops[0].stop, StopReason::Cancelled);
    assert_eq!(queue.drain().len(), 1);
}

/// Several hosts wait for the service to be idle at once while children still run: all of
/// them return, each once nothing is active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_wait_idle_callers_all_return() {
    use forkhive_spawn::runtime::PendingQueue;
    for round in 0..20 {
        let service = TaskService::new(
            Arc::new(MemoryTaskRegistry::new()),
            TaskConfig::default()
                .with_deadline(None)
                .with_stall_after(None),
        );
        let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
        let queue = PendingQueue::new();
        for i in 0..16u64 {
            let child = Agent::builder(brain(move |_| {
                std::thread::sleep(Duration::from_micros(50 * (i % 4)));
                Plan::Reply(say("done"))
            }))
            .model("m")
            .build()
            .await
            .unwrap();
            start_child(
                &service,
                child,
                &queue,
                Start {
                    description: format!("c{i}"),
                    ..Start::under(parent)
                },
            )
            .await;
        }
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&service);
                tokio::spawn(async move {
                    s.wait_idle().await;
                    s.active()
                })
            })
            .collect();
        for w in waiters {
            let active = tokio::time::timeout(Duration::from_secs(20), w)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a wait_idle caller never returned"))
                .unwrap();
            assert_eq!(active, 0);
        }
        assert_eq!(queue.drain().len(), 16);
    }
}

/// A long-running host: children one after another through the service; the registry's
/// tables stay at the retention bound instead of growing with every child.
#[tokio::test]
async fn sequential_children_through_the_service_keep_the_registry_flat() {
    use forkhive_spawn::runtime::PendingQueue;
    use forkhive_spawn::task::Retention;
    let registry = Arc::new(MemoryTaskRegistry::with_retention(Retention {
        max_ended: 100,
        max_age: None,
    }));
    let service = TaskService::new(
        Arc::clone(&registry) as _,
        TaskConfig::default()
            .with_deadline(None)
            .with_stall_after(None),
    );
    let root = AgentContext::main();
    let parent = *root.id();
    let queue = PendingQueue::new();
    let model = brain(|_| Plan::Reply(say("done")));
    let mut peak = 0;
    for i in 0..5_000 {
        let child = Agent::builder(Arc::clone(&model) as _)
            .model("m")
            .context(root.child(
                forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent),
                forkhive_spawn::runtime::AgentKind::Subagent,
                forkhive_spawn::runtime::QuerySource::default_agent(),
            ))
            .build()
            .await
            .unwrap();
        start_child(
            &service,
            child,
            &queue,
            Start {
                description: "c".into(),
                ..Start::under(parent)
            },
        )
        .await;
        service.wait_idle().await;
        assert_eq!(queue.drain().len(), 1);
        if i % 500 == 0 {
            peak = peak.max(registry.footprint());
        }
    }
    assert_eq!(registry.len(), 100);
    assert!(peak <= 100 * 3 + 2, "footprint {peak}");
    assert_eq!(
        registry.descendants_usage(&parent).await.output_tokens,
        5 * 5_000
    );
}

fn no_deadline() -> TaskConfig {
    TaskConfig::default()
        .with_deadline(None)
        .with_stall_after(None)
        .with_kill_grace(Duration::from_secs(1))
}

/// `TaskService::cancel` on a child that ignores its token (no deadline to save it): the owner
/// still drops it after its grace and reports it.
#[tokio::test(start_paused = true)]
async fn a_child_cancelled_from_outside_that_ignores_it_is_dropped_after_its_grace() {
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), no_deadline());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let child = Agent::builder(brain(|_| Plan::Hang))
        .model("m")
        .build()
        .await
        .unwrap();
    let gate = forkhive_spawn::task::Gate::new(std::future::pending());
    let id = start_child(
        &service,
        child,
        &queue,
        Start {
            gate: Some(gate),
            ..Start::bare()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(service.cancel(&id));
    let started = tokio::time::Instant::now();
    service.wait_idle().await;
    // Its cancel_grace (5 s) and the kill grace (1 s).
    assert_eq!(started.elapsed(), Duration::from_secs(6));
    assert_eq!(
        service.registry().get(&id).await.unwrap().state,
        TaskState::Killed
    );
    let n = TaskNotification::parse(&queue.drain()[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Killed);
}

/// The runtime shuts down under a running child: its owner still ends its record, writes its
/// stop record and notifies, without a runtime to wait on; and its output file, whose writer
/// task went with the runtime, still gets its `[stopped: …]` line.
#[test]
fn a_child_whose_runtime_shuts_down_is_still_finished() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(MemoryTaskRegistry::new());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (id, path, output) = rt.block_on(async {
        let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
        let child = Agent::builder(brain(|_| Plan::Hang))
            .model("m")
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let path = child.transcript_path().unwrap().to_path_buf();
        let output = Arc::new(
            forkhive_spawn::task::OutputFile::create(
                &forkhive_spawn::task::OutputConfig::new(dir.path(), "s").unwrap(),
                child.id(),
            )
            .await
            .unwrap(),
        );
        let id = start_child(
            &service,
            child,
            &queue,
            Start {
                output: Some(Arc::clone(&output)),
                ..Start::bare()
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        (id, path, output)
    });
    drop(rt);
    let record = futures::executor::block_on(registry.get(&id)).unwrap();
    assert_eq!(record.state, TaskState::Killed);
    let t = std::fs::read_to_string(&path).unwrap();
    assert!(
        t.lines().last().unwrap().contains(r#""type":"stop""#),
        "{t}"
    );
    let n = TaskNotification::parse(&queue.drain()[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Killed);
    assert_eq!(
        n.note
            .as_deref()
            .map(|s| s.starts_with("stopped: its supervisor was dropped")),
        Some(true)
    );
    assert_eq!(
        std::fs::read_to_string(output.path()).unwrap(),
        "[stopped: cancelled]\n"
    );
}

/// A registry that fails the first move to a terminal state (a networked store's transient
/// error) without recording it.
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryTaskRegistry,
    failed: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl TaskRegistry for Flaky {
    async fn create(&self, r: forkhive_spawn::task::TaskRecord) -> forkhive_spawn::Result<()> {
        self.inner.create(r).await
    }
    async fn transition(
        &self,
        id: &forkhive_core::TaskId,
        to: TaskState,
    ) -> forkhive_spawn::Result<TaskState> {
        if to.is_terminal() && !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(forkhive_spawn::Error::Task {
                id: *id,
                message: "connection reset".into(),
            });
        }
        self.inner.transition(id, to).await
    }
    async fn reopen(&self, id: &forkhive_core::TaskId) -> forkhive_spawn::Result<TaskState> {
        self.inner.reopen(id).await
    }
    async fn roll_up(
        &self,
        id: &forkhive_core::TaskId,
        u: forkhive_core::Usage,
    ) -> forkhive_spawn::Result<()> {
        self.inner.roll_up(id, u).await
    }
    async fn mark_stalled(&self, id: &forkhive_core::TaskId) -> forkhive_spawn::Result<()> {
        self.inner.mark_stalled(id).await
    }
    async fn get(&self, id: &forkhive_core::TaskId) -> Option<forkhive_spawn::task::TaskRecord> {
        self.inner.get(id).await
    }
    async fn children(&self, p: &forkhive_core::TaskId) -> Vec<forkhive_spawn::task::TaskRecord> {
        self.inner.children(p).await
    }
    async fn descendants_usage(&self, id: &forkhive_core::TaskId) -> forkhive_core::Usage {
        self.inner.descendants_usage(id).await
    }
}

/// A registry error is not a refusal: the notification is delivered anyway, once.
#[tokio::test]
async fn a_registry_error_does_not_lose_the_notification() {
    let service = TaskService::new(Arc::new(Flaky::default()), no_deadline());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let child = Agent::builder(brain(|_| Plan::Reply(say("done"))))
        .model("m")
        .build()
        .await
        .unwrap();
    start_child(&service, child, &queue, Start::bare()).await;
    service.wait_idle().await;
    let notes = queue.drain();
    assert_eq!(notes.len(), 1);
    assert_eq!(
        TaskNotification::parse(&notes[0].text).unwrap().status,
        TaskStatus::Completed
    );
}

/// An event sink whose destructor panics: dropped with the agent after its run.
#[derive(Debug)]
struct PanicOnDropSink;

impl forkhive_spawn::runtime::EventSink for PanicOnDropSink {
    fn emit(&self, _event: forkhive_spawn::runtime::AgentEvent) {}
}

impl Drop for PanicOnDropSink {
    fn drop(&mut self) {
        panic!("a sink's destructor panicked");
    }
}

/// A destructor that panics when a finished child is dropped does not turn its good run
/// into a failure.
#[tokio::test]
async fn a_destructor_panicking_after_a_good_run_keeps_it_completed() {
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), no_deadline());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let child = Agent::builder(brain(|_| Plan::Reply(say("all done"))))
        .model("m")
        .events(Arc::new(PanicOnDropSink))
        .build()
        .await
        .unwrap();
    start_child(&service, child, &queue, Start::bare()).await;
    service.wait_idle().await;
    let n = TaskNotification::parse(&queue.drain()[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Completed);
    assert_eq!(n.result.as_deref(), Some("all done"));
}

/// Streams part of an answer, then fails.
#[derive(Debug)]
struct CutOff;

#[async_trait]
impl forkhive_transport::Backend for CutOff {
    async fn send(
        &self,
        _r: &forkhive_transport::Request,
    ) -> forkhive_transport::Result<forkhive_transport::Response> {
        unreachable!("the loop streams")
    }
    async fn stream(
        &self,
        _r: &forkhive_transport::Request,
    ) -> forkhive_transport::Result<forkhive_transport::EventStream> {
        let mut events: Vec<forkhive_transport::Result<forkhive_transport::StreamEvent>> =
            forkhive_transport::request::events_for(&say("half of the findings"), 64)
                .into_iter()
                .take(3)
                .map(Ok)
                .collect();
        events.push(Err(forkhive_transport::Error::Unavailable {
            status: 503,
            message: "gone".into(),
            retry_after: None,
        }));
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

/// Nothing is lost: a child whose backend fails mid-answer reports what it had streamed.
#[tokio::test]
async fn a_child_that_fails_mid_answer_reports_its_partial_text() {
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), no_deadline());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let progress = Arc::new(forkhive_spawn::task::Progress::default());
    let id = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let root = AgentContext::main();
    let child = Agent::builder(Arc::new(CutOff))
        .model("m")
        .context(root.child(
            id,
            forkhive_spawn::runtime::AgentKind::Subagent,
            forkhive_spawn::runtime::QuerySource::default_agent(),
        ))
        .events(Arc::new(forkhive_spawn::task::ChildSink {
            child: id,
            progress: Arc::clone(&progress),
            output: None,
            forward: None,
        }))
        .build()
        .await
        .unwrap();
    start_child(
        &service,
        child,
        &queue,
        Start {
            description: "cut".into(),
            progress,
            ..Start::under(*root.id())
        },
    )
    .await;
    service.wait_idle().await;
    let n = TaskNotification::parse(&queue.drain()[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Failed);
    assert!(
        n.result.as_deref().is_some_and(|r| r.starts_with("half")),
        "{n:?}"
    );
}

/// A parent with the `Agent` tool (background `worker`s) over `service`.
async fn parent_over_service(model: Arc<Brain>, service: &Arc<TaskService>) -> Agent {
    let cell = Cell {
        end: End::Completes,
        background: true,
        fork: false,
    };
    let tool = AgentTool::new(config(cell)).unwrap();
    let parent = Agent::builder(model)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .build()
        .await
        .unwrap();
    parent.tree().extensions().insert(Arc::clone(service));
    parent
}

/// A parent that starts one background worker, then ends.
fn starts_one_worker() -> Arc<Brain> {
    brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("child done"));
        }
        if has_tool_result(r) {
            return Plan::Reply(say("parent done"));
        }
        Plan::Reply(calls(&[(
            "toolu_1",
            "Agent",
            r#"{"description":"w","prompt":"p","subagent_type":"worker","run_in_background":true}"#,
        )]))
    })
}

/// The records below `parent` that have not ended.
async fn unended(registry: &dyn TaskRegistry, parent: &forkhive_core::TaskId) -> Vec<TaskState> {
    registry
        .children(parent)
        .await
        .into_iter()
        .map(|r| r.state)
        .filter(|s| !s.is_terminal())
        .collect()
}

/// The parent is cancelled while its background child's start waits for the registry (the
/// record is written, an answer 10 s away): the start is dropped before the child has an
/// owner, and its record is ended `killed`, not left `created` or `running` with nobody to end
/// it (it would count as live below its ancestors for ever).
#[tokio::test(start_paused = true)]
async fn a_start_dropped_while_the_registry_answers_ends_the_record() {
    let rows = [
        (
            "the answer to create",
            SlowRegistry {
                create: Duration::from_secs(10),
                ..SlowRegistry::default()
            },
        ),
        (
            "the answer to the move to running",
            SlowRegistry {
                running: Duration::from_secs(10),
                ..SlowRegistry::default()
            },
        ),
        // The move to running refused, the start ends the record it made (`Claim::abandon`)
        // and is dropped while that move (10 s) is under way.
        (
            "the end of a refused start",
            SlowRegistry {
                refuse_running: true,
                end: Duration::from_secs(10),
                ..SlowRegistry::default()
            },
        ),
    ];
    for (waiting_for, registry) in rows {
        let registry = Arc::new(registry);
        let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
        let mut parent = parent_over_service(starts_one_worker(), &service).await;
        let token = parent.cancellation().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            token.cancel();
        });
        let run = parent.run("go").await;
        assert_eq!(run.stop, StopReason::Cancelled, "{waiting_for}");
        service.wait_idle().await;
        // Time for an end handed to a task of its own to land.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let records = registry.children(parent.id()).await;
        assert_eq!(records.len(), 1, "{waiting_for}");
        assert_eq!(records[0].state, TaskState::Killed, "{waiting_for}");
        assert_eq!(service.live(), 0, "{waiting_for}: the slot is freed");
    }
}

/// The registry writes a child's record but refuses its move to `running`: the start fails,
/// the parent's tool call says why, and the record it made is ended.
#[tokio::test]
async fn a_start_the_registry_refuses_half_way_ends_the_record() {
    let registry = Arc::new(SlowRegistry {
        refuse_running: true,
        ..SlowRegistry::default()
    });
    let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
    let mut parent = parent_over_service(starts_one_worker(), &service).await;
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let said = parent.params().messages()[2].clone();
    let (_, text, is_error) = message_results(&said).remove(0);
    assert!(is_error, "{text}");
    assert!(text.contains("the store is read-only"), "{text}");
    assert!(unended(registry.as_ref(), parent.id()).await.is_empty());
    assert_eq!(
        registry.children(parent.id()).await[0].state,
        TaskState::Killed
    );
    assert_eq!(service.live(), 0);
}

/// A registry that does not answer a child's start (a store in trouble, here 10 min away)
/// holds the parent's `Agent` call only for `TaskConfig::registry_timeout`: the call says
/// why, the slot is freed, and the record is ended once the registry answers (cx#25426:
/// spawns hung for hours).
#[tokio::test(start_paused = true)]
async fn a_start_the_registry_does_not_answer_fails_after_the_registry_timeout() {
    let rows = [
        (
            "making its record",
            SlowRegistry {
                create: Duration::from_secs(600),
                ..SlowRegistry::default()
            },
        ),
        (
            "moving its record to running",
            SlowRegistry {
                running: Duration::from_secs(600),
                ..SlowRegistry::default()
            },
        ),
    ];
    for (what, registry) in rows {
        let registry = Arc::new(registry);
        let service = TaskService::new(
            Arc::clone(&registry) as _,
            no_deadline().with_registry_timeout(Duration::from_secs(5)),
        );
        let mut parent = parent_over_service(starts_one_worker(), &service).await;
        let started = tokio::time::Instant::now();
        let run = parent.run("go").await;
        assert_eq!(run.stop, StopReason::Completed, "{what}: {:?}", run.error);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: the call waited {:?}",
            started.elapsed()
        );
        let said = parent.params().messages()[2].clone();
        let (_, text, is_error) = message_results(&said).remove(0);
        assert!(is_error, "{text}");
        // `could not start the agent: task <id>: …`, as docs/background.md shows it.
        assert!(
            text.starts_with("could not start the agent: task ")
                && text.ends_with(&format!(
                    ": the task registry did not answer within 5s ({what}), so the child was \
                     not started; its record is ended once the registry answers"
                )),
            "{what}: {text}"
        );
        assert_eq!(service.live(), 0, "{what}: the slot is freed");
        // Once the registry answers, the record is ended.
        tokio::time::sleep(Duration::from_secs(700)).await;
        let records = registry.children(parent.id()).await;
        assert_eq!(records.len(), 1, "{what}");
        assert_eq!(records[0].state, TaskState::Killed, "{what}");
    }
}

/// The runtime shuts down while a child's owner is finishing it (its run has returned; the
/// owner waits 5 s on the registry's roll-up): the owner's guard does the rest on the spot —
/// the record ends, and the one notification reaches the parent's queue.
#[test]
fn a_runtime_shutting_down_while_an_owner_finishes_still_delivers_the_notification() {
    let registry = Arc::new(SlowRegistry {
        roll_up: Duration::from_secs(5),
        ..SlowRegistry::default()
    });
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = rt.block_on(async {
        let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
        let child = Agent::builder(brain(|_| Plan::Reply(say("all done"))))
            .model("m")
            .build()
            .await
            .unwrap();
        let id = start_child(&service, child, &queue, Start::bare()).await;
        // The child answers at once; its owner is now waiting on the registry.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(service.live(), 0, "the child has ended (its slot is free)");
        id
    });
    drop(rt);
    let record = futures::executor::block_on(registry.get(&id)).unwrap();
    assert_eq!(record.state, TaskState::Completed);
    // The roll-up was asked for and had not landed: it is not asked again (it might have
    // landed, and a second would count twice), so this child's usage is missing.
    assert_eq!(record.usage, forkhive_core::Usage::default());
    let notes = queue.drain();
    assert_eq!(notes.len(), 1, "the child's one notification");
    let n = TaskNotification::parse(&notes[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Completed);
    assert_eq!(n.result.as_deref(), Some("all done"));
    assert_eq!(queue.outstanding(), 0);
}

/// The same, with the owner writing a panicked child's stop record (on tokio's blocking pool,
/// which another job keeps busy) when the runtime shuts down: the record ends `failed`, the
/// transcript gets exactly one stop record, and the notification is delivered once.
#[test]
fn a_runtime_shutting_down_while_an_owner_writes_a_stop_record_still_delivers() {
    expect_panics("boom");
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(MemoryTaskRegistry::new());
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    // One blocking thread, which the child's model keeps busy for 300 ms just before it
    // panics: the owner's stop-record write waits behind it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    let (id, path) = rt.block_on(async {
        let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
        let child = Agent::builder(brain(|_| {
            drop(tokio::task::spawn_blocking(|| {
                std::thread::sleep(Duration::from_millis(300))
            }));
            Plan::Panic("boom")
        }))
        .model("m")
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
        let path = child.transcript_path().unwrap().to_path_buf();
        let id = start_child(&service, child, &queue, Start::bare()).await;
        // Until its owner has begun finishing it (the slot is freed before the stop record).
        while service.live() > 0 {
            tokio::task::yield_now().await;
        }
        (id, path)
    });
    drop(rt);
    let record = futures::executor::block_on(registry.get(&id)).unwrap();
    assert_eq!(record.state, TaskState::Failed);
    let notes = queue.drain();
    assert_eq!(notes.len(), 1, "the child's one notification");
    let n = TaskNotification::parse(&notes[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Failed);
    let t = std::fs::read_to_string(&path).unwrap();
    assert_eq!(t.matches(r#""type":"stop""#).count(), 1, "{t}");
}

/// Records, when a child's `Notified` event comes, what its parent's queue holds: the
/// messages queued and the promises still outstanding.
#[derive(Debug)]
struct QueueAtNotified {
    queue: forkhive_spawn::runtime::PendingQueue,
    seen: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl forkhive_spawn::runtime::EventSink for QueueAtNotified {
    fn emit(&self, event: forkhive_spawn::runtime::AgentEvent) {
        if matches!(
            event.kind,
            forkhive_spawn::runtime::EventKind::Notified { .. }
        ) {
            self.seen
                .lock()
                .unwrap()
                .push((self.queue.len(), self.queue.outstanding()));
        }
    }
}

/// A host hears `Notified` before the notification reaches the parent's queue: a parent that
/// reads it at once and returns from its run cannot do so before the host has heard.
#[tokio::test]
async fn the_host_hears_notified_before_the_parent_can_read_it() {
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let sink = Arc::new(QueueAtNotified {
        queue: queue.clone(),
        seen: std::sync::Mutex::default(),
    });
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), no_deadline());
    let child = Agent::builder(brain(|_| Plan::Reply(say("done"))))
        .model("m")
        .build()
        .await
        .unwrap();
    let start = Start {
        events: Some(Arc::clone(&sink) as _),
        ..Start::bare()
    };
    start_child(&service, child, &queue, start).await;
    service.wait_idle().await;
    assert_eq!(*sink.seen.lock().unwrap(), [(0, 1)]);
    assert_eq!(queue.drain().len(), 1);
}

/// The runtime shuts down while an owner waits for the answer to its roll-up (the roll-up
/// itself has landed): the guard finishes the rest, but must not roll the usage up again —
/// the child's usage counts once, in its record and below its parent.
#[test]
fn an_owner_dropped_while_its_roll_up_is_answered_rolls_up_once() {
    let registry = Arc::new(SlowRegistry {
        roll_up_answer: Duration::from_secs(5),
        ..SlowRegistry::default()
    });
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = rt.block_on(async {
        let service = TaskService::new(Arc::clone(&registry) as _, no_deadline());
        let child = Agent::builder(brain(|_| Plan::Reply(say("all done"))))
            .model("m")
            .build()
            .await
            .unwrap();
        let id = start_child(&service, child, &queue, Start::under(parent)).await;
        // The child answers at once; its owner's roll-up has landed, its answer 5 s away.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(service.live(), 0, "the child has ended (its slot is free)");
        id
    });
    drop(rt);
    let record = futures::executor::block_on(registry.get(&id)).unwrap();
    assert_eq!(record.state, TaskState::Completed);
    assert_eq!(queue.drain().len(), 1, "the child's one notification");
    // `say` costs 10 input and 5 output tokens: one turn.
    assert_eq!(
        record.usage.output_tokens, 5,
        "the child's own usage: {:?}",
        record.usage
    );
}

/// A model whose children take `child_ms` to answer (the parent answers at once).
#[derive(Debug)]
struct SlowChildren {
    inner: Arc<Brain>,
    child_ms: u64,
}

#[async_trait]
impl forkhive_transport::Backend for SlowChildren {
    async fn send(
        &self,
        r: &forkhive_transport::Request,
    ) -> forkhive_transport::Result<forkhive_transport::Response> {
        if !is_parent(r) {
            tokio::time::sleep(Duration::from_millis(self.child_ms)).await;
        }
        self.inner.send(r).await
    }
    async fn stream(
        &self,
        r: &forkhive_transport::Request,
    ) -> forkhive_transport::Result<forkhive_transport::EventStream> {
        if !is_parent(r) {
            tokio::time::sleep(Duration::from_millis(self.child_ms)).await;
        }
        self.inner.stream(r).await
    }
}

/// A host that watches the parent's queue while the parent waits for its child — with
/// `arrived` and `settled`, as `docs/background.md` says a host does — leaves the
/// notification for the parent: its model reads it exactly once.
#[tokio::test(start_paused = true)]
async fn a_host_watching_the_queue_leaves_the_notification_for_the_agent() {
    let model = Arc::new(SlowChildren {
        inner: starts_one_worker(),
        child_ms: 250,
    });
    let (mut parent, _service) =
        parent_of_workers(model, Limits::default(), no_deadline(), |b| b).await;
    let queue = parent.pending();
    let watcher = tokio::spawn(async move {
        // Once the child's notification is promised (before, nothing is, and `arrived`
        // answers `false` at once).
        while queue.outstanding() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let arrived = queue.arrived().await;
        queue.settled().await;
        arrived
    });
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert!(
        watcher.await.unwrap(),
        "the watcher saw the notification arrive"
    );
    let seen: usize = parent
        .params()
        .messages()
        .iter()
        .map(|m| find_notifications(m).unwrap().len())
        .sum();
    assert_eq!(seen, 1, "the parent's model read the notification once");
    assert!(parent.pending().is_empty());
}

/// A cancelled agent's next run returns `Cancelled` at once and takes nothing: the `killed`
/// notifications stay in its queue for the host to hand on, and neither its conversation nor
/// its transcript gains the prompt or the notifications.
#[tokio::test(start_paused = true)]
async fn a_cancelled_agents_next_run_leaves_its_queue_and_conversation_alone() {
    let dir = tempfile::tempdir().unwrap();
    let host = tokio_util::sync::CancellationToken::new();
    let (mut parent, service) =
        parent_of_workers(spawner(), Limits::default(), no_deadline(), |b| {
            b.cancellation(host.clone()).transcript_dir(dir.path())
        })
        .await;
    let cancel = host.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    service.wait_idle().await;
    assert_eq!(
        parent.pending().len(),
        1,
        "the child's `killed` notification"
    );
    let messages = parent.params().messages().len();
    let path = parent.transcript_path().unwrap().to_path_buf();
    let recorded = forkhive_spawn::transcript::read(&path).await.unwrap();

    let again = parent.run("again?").await;
    assert_eq!(again.stop, StopReason::Cancelled);
    assert!(again.new_messages.is_empty());
    assert_eq!(again.final_text, "");
    let again = parent.continue_run().await;
    assert_eq!(again.stop, StopReason::Cancelled);
    assert_eq!(parent.pending().len(), 1, "still queued, for the host");
    assert_eq!(parent.params().messages().len(), messages);
    let after = forkhive_spawn::transcript::read(&path).await.unwrap();
    assert_eq!(after.messages, recorded.messages);
    let n = TaskNotification::parse(&parent.pending().drain()[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Killed);
}

/// A child's tool uses and duration are the same in its notification, its registry record
/// and its parent's report of it.
#[tokio::test(start_paused = true)]
async fn a_childs_duration_is_the_same_in_its_notification_record_and_report() {
    // The worker makes one tool call (to a tool it does not have: answered with an error,
    // counted all the same) before it answers.
    let worker_then = brain(|r| {
        if !is_parent(r) {
            if has_tool_result(r) {
                return Plan::Reply(say("child done"));
            }
            return Plan::Reply(calls(&[("toolu_look", "Look", "{}")]));
        }
        if has_tool_result(r) {
            return Plan::Reply(say("parent done"));
        }
        Plan::Reply(calls(&[(
            "toolu_1",
            "Agent",
            r#"{"description":"w","prompt":"p","subagent_type":"worker","run_in_background":true}"#,
        )]))
    });
    let model = Arc::new(SlowChildren {
        inner: worker_then,
        child_ms: 250,
    });
    let (mut parent, service) =
        parent_of_workers(model, Limits::default(), no_deadline(), |b| b).await;
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    let n: Vec<TaskNotification> = parent
        .params()
        .messages()
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    assert_eq!(n.len(), 1);
    let n = &n[0];
    assert!(
        n.usage.duration_ms >= 500,
        "two answers of 250 ms: {:?}",
        n.usage
    );
    assert_eq!(n.usage.tool_uses, 1, "{:?}", n.usage);
    let record = service.registry().get(&n.task_id).await.unwrap();
    assert_eq!(record.usage.duration_ms, n.usage.duration_ms);
    assert_eq!(record.usage.tool_uses, n.usage.tool_uses);
    let report = run.children().iter().find(|c| c.id == n.task_id).unwrap();
    assert_eq!(report.usage.duration_ms, n.usage.duration_ms);
    assert_eq!(report.usage.tool_uses, n.usage.tool_uses);
    assert_eq!(report.usage.total_tokens(), n.usage.total_tokens);
}

/// An agent cancelled before its first run still records that run's prompt (a child stopped
/// before its first turn keeps its task, for a message that revives it); only a run after a
/// run that returned `Cancelled` takes nothing.
#[tokio::test]
async fn an_agent_cancelled_before_its_first_run_records_its_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    token.cancel();
    let mut agent = Agent::builder(brain(|_| Plan::Reply(say("never asked"))))
        .model("m")
        .transcript_dir(dir.path())
        .cancellation(token)
        .build()
        .await
        .unwrap();
    let run = agent.run("the task").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    let path = agent.transcript_path().unwrap().to_path_buf();
    let recorded = forkhive_spawn::transcript::read(&path).await.unwrap();
    assert_eq!(recorded.messages.len(), 1);
    assert_eq!(recorded.messages[0].text(), "the task");
    let again = agent.run("again?").await;
    assert_eq!(again.stop, StopReason::Cancelled);
    let after = forkhive_spawn::transcript::read(&path).await.unwrap();
    assert_eq!(after.messages, recorded.messages);
}
