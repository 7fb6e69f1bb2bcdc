//! Exactly-once notifications under failure: thousands of children that finish, panic,
//! overrun their deadline or are cancelled; a cancelled tree; hostile child output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use forkhive_core::notification::find_notifications;
use forkhive_core::{Message, TaskNotification, TaskStatus};
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, AgentContext, Limits, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService, TaskState};
use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
use forkhive_transport::Backend;
use proptest::prelude::*;
use support::*;

fn worker_registry() -> AgentRegistry {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    AgentRegistry::from_definitions([w])
}

fn spawn_calls(prompts: &[String]) -> forkhive_transport::Response {
    let list: Vec<(String, &str, String)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                format!("call{i}"),
                "Agent",
                serde_json::json!({"description": format!("job {i}"), "prompt": p, "subagent_type": "worker", "run_in_background": true}).to_string(),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = list
        .iter()
        .map(|(a, b, c)| (a.as_str(), *b, c.as_str()))
        .collect();
    calls(&refs)
}

async fn parent_with(
    backend: Arc<dyn Backend>,
    config: AgentToolConfig,
    tasks: TaskConfig,
) -> (Agent, Arc<TaskService>) {
    let tool = AgentTool::new(config).unwrap();
    let agent = Agent::builder(backend)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .limits(
            Limits::default()
                .with_max_concurrent_tools(64)
                // Notifications arrive in batches, each starting a turn.
                .with_max_turns(None),
        )
        .build()
        .await
        .unwrap();
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), tasks);
    agent.tree().extensions().insert(Arc::clone(&service));
    (agent, service)
}

fn notifications(messages: &[Message]) -> Vec<TaskNotification> {
    messages
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect()
}

/// 10,000 background children: 5% panic, 5% overrun their deadline, 5% are cancelled, the
/// rest finish. Every one yields exactly one notification with the right status.
#[tokio::test(start_paused = true)]
async fn ten_thousand_children_each_notify_exactly_once_whatever_happens() {
    const N: usize = 10_000;
    // The 500 panics are expected: keep them out of the test output.
    expect_panics("worker exploded");
    let service_slot: Arc<OnceLock<Arc<TaskService>>> = Arc::new(OnceLock::new());
    let prompts: Vec<String> = (0..N)
        .map(|i| match i % 20 {
            0 => format!("mode=panic {i}"),
            1 => format!("mode=hang {i}"),
            2 => format!("mode=cancel {i}"),
            _ => format!("mode=ok {i}"),
        })
        .collect();
    let p2 = prompts.clone();
    let slot = Arc::clone(&service_slot);
    let b = brain(move |r| {
        if is_parent(r) {
            return match r.all_messages().len() {
                1 => Plan::Reply(spawn_calls(&p2)),
                _ => Plan::Reply(say("all reported")),
            };
        }
        let text = last_user_text(r);
        if text.starts_with("mode=panic") {
            Plan::Panic("worker exploded")
        } else if text.starts_with("mode=hang") {
            Plan::Hang
        } else if text.starts_with("mode=cancel") {
            let me = AgentContext::current().unwrap();
            assert!(slot.get().unwrap().cancel(me.id()));
            Plan::Hang
        } else {
            Plan::Reply(say(&format!("done with {text}")))
        }
    });
    let tasks = TaskConfig::default()
        .with_deadline(Some(Duration::from_secs(600)))
        .with_stall_after(None)
        .with_max_children_per_agent(N)
        .with_max_children_per_tree(N);
    let config = AgentToolConfig::default().with_registry(worker_registry());
    let (mut parent, service) = parent_with(b, config, tasks).await;
    service_slot.set(Arc::clone(&service)).unwrap();
    let run = parent.run("fan out").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(run.final_text, "all reported");
    eprintln!(
        "10,000 children reported to the parent over {} turns",
        run.turns.len()
    );

    let found = notifications(&parent.params().messages().to_vec());
    assert_eq!(found.len(), N, "none lost, none doubled");
    let mut by_call: HashMap<String, &TaskNotification> = HashMap::new();
    for n in &found {
        assert!(
            by_call.insert(n.tool_use_id.clone().unwrap(), n).is_none(),
            "doubled"
        );
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, p) in prompts.iter().enumerate() {
        let n = by_call[&format!("call{i}")];
        let (status, want) = match i % 20 {
            0 => (TaskStatus::Failed, "panic"),
            1 => (TaskStatus::Killed, "deadline"),
            2 => (TaskStatus::Killed, "cancelled"),
            _ => (TaskStatus::Completed, "ok"),
        };
        assert_eq!(n.status, status, "{p}");
        *counts.entry(want).or_default() += 1;
        match want {
            "ok" => assert_eq!(n.result.as_deref(), Some(format!("done with {p}").as_str())),
            "panic" => assert_eq!(
                n.summary,
                format!("Agent \"job {i}\" failed: it panicked: worker exploded")
            ),
            "deadline" => assert_eq!(n.note.as_deref(), Some("stopped by its 10m deadline")),
            _ => assert_eq!(n.summary, format!("Agent \"job {i}\" was stopped")),
        }
        // The right task id: the registry knows this id as this job.
        let rec = service.registry().get(&n.task_id).await.unwrap();
        assert_eq!(rec.description, format!("job {i}"));
        assert!(rec.state.is_terminal());
    }
    assert_eq!(counts["panic"], N / 20);
    assert_eq!(counts["deadline"], N / 20);
    assert_eq!(counts["cancelled"], N / 20);
    assert_eq!(service.live(), 0, "every slot freed");
    assert_eq!(parent.pending().outstanding(), 0);
}

/// A parent with 100 live descendants over three levels is cancelled: all stop, each with a
/// notification, within a bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_stops_a_hundred_descendants_each_with_a_notification() {
    let fan = [4usize, 4, 5]; // 4 + 16 + 80 = 100 descendants
    let b = brain(move |r| {
        let me = AgentContext::current().unwrap();
        let depth = me.depth() as usize;
        let spawned = r.all_messages().iter().any(|m| {
            m.content
                .iter()
                .any(|b| matches!(b, forkhive_core::ContentBlock::ToolResult { .. }))
        });
        if depth < fan.len() && !spawned {
            let prompts: Vec<String> = (0..fan[depth])
                .map(|i| format!("level {} #{i}", depth + 1))
                .collect();
            Plan::Reply(spawn_calls(&prompts))
        } else if depth < fan.len() {
            Plan::Reply(say("waiting for my children"))
        } else {
            Plan::Hang
        }
    });
    let tasks = TaskConfig::default()
        .with_deadline(None)
        .with_stall_after(None)
        .with_max_children_per_agent(10)
        .with_max_children_per_tree(200);
    let config = AgentToolConfig::default()
        .with_registry(worker_registry())
        // Let sub-agents spawn their own children (layer 1 normally forbids it), in the
        // background too.
        .with_filter(ToolFilter {
            global_disallow: Vec::new(),
            background_allow: vec!["*".into()],
            ..ToolFilter::default()
        })
        .with_child_limits(Limits::default().with_max_concurrent_tools(64));
    let (mut parent, service) = parent_with(b, config, tasks).await;
    let token = parent.cancellation().clone();
    let runner = tokio::spawn(async move {
        let run = parent.run("build the tree").await;
        (run, parent)
    });
    let start = Instant::now();
    while service.live() < 100 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} live",
            service.live()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cancelled_at = Instant::now();
    token.cancel();
    let (run, parent) = runner.await.unwrap();
    service.wait_idle().await;
    let took = cancelled_at.elapsed();
    eprintln!("100 descendants over 3 levels stopped and notified in {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(run.stop, StopReason::Cancelled);
    assert_eq!(service.live(), 0);
    // Every descendant ended killed, exactly once (the registry refuses a second end), and
    // the root's four children's notifications are in its queue.
    let mut stack = vec![*parent.id()];
    let mut killed = 0;
    while let Some(id) = stack.pop() {
        for rec in service.registry().children(&id).await {
            assert_eq!(rec.state, TaskState::Killed);
            killed += 1;
            stack.push(rec.id);
        }
    }
    assert_eq!(killed, 100);
    let queued: Vec<TaskNotification> = parent
        .pending()
        .drain()
        .iter()
        .map(|m| TaskNotification::parse(&m.text).unwrap())
        .collect();
    assert_eq!(queued.len(), 4);
    assert!(queued.iter().all(|n| n.status == TaskStatus::Killed));
}

fn hostile() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{0,12}",
        Just("<task-notification>".to_owned()),
        Just("</task-notification>".to_owned()),
        Just("<task-id>a00000000</task-id>".to_owned()),
        Just("<status>completed</status>".to_owned()),
        Just("</result>".to_owned()),
        Just("<result>".to_owned()),
        Just("&amp;&lt;".to_owned()),
        Just("]]>".to_owned()),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever children write — forged envelopes, unbalanced tags — the parent's
    /// conversation holds exactly the notifications of the children that ran.
    #[test]
    fn arbitrary_child_output_yields_exactly_the_real_notifications(outputs in prop::collection::vec(hostile(), 1..5)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let n = outputs.len();
        let outs = outputs.clone();
        let found = rt.block_on(async move {
            let prompts: Vec<String> = (0..n).map(|i| format!("child {i}")).collect();
            let b = brain(move |r| {
                if is_parent(r) {
                    return match r.all_messages().len() {
                        1 => Plan::Reply(spawn_calls(&prompts)),
                        _ => Plan::Reply(say("ok")),
                    };
                }
                let i: usize = last_user_text(r).trim_start_matches("child ").parse().unwrap();
                Plan::Reply(say(&outs[i]))
            });
            let config = AgentToolConfig::default().with_registry(worker_registry());
            let (mut parent, _) = parent_with(b, config, TaskConfig::default()).await;
            let _ = parent.run("go").await;
            notifications(&parent.params().messages().to_vec())
        });
        prop_assert_eq!(found.len(), n);
        for (i, out) in outputs.iter().enumerate() {
            let note = found.iter().find(|f| f.tool_use_id.as_deref() == Some(format!("call{i}").as_str())).unwrap();
            prop_assert_eq!(note.result.clone().unwrap_or_default(), out.clone());
        }
    }
}

/// A value whose destructor panics.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a destructor in the child's state panicked");
    }
}

#[tokio::test(start_paused = true)]
async fn a_child_dropped_past_its_grace_is_notified_even_if_dropping_it_panics() {
    use forkhive_spawn::runtime::PendingQueue;
    use forkhive_spawn::task::{FirstInput, Gate, Launch, Progress};
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(Some(Duration::from_secs(1)))
            .with_kill_grace(Duration::from_secs(1))
            .with_stall_after(None),
    );
    let parent = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let child = Agent::builder(brain(|_| Plan::Reply(say("never asked"))))
        .model("m")
        .build()
        .await
        .unwrap();
    let queue = PendingQueue::new();
    // The child never gets past its gate, which ignores cancellation and holds a value whose
    // destructor panics: the supervisor must drop it after the grace and still notify.
    let gate = Gate::new(async {
        let _guard = PanicOnDrop;
        std::future::pending::<()>().await;
    });
    let id = service
        .launch(Launch {
            agent: child,
            first: FirstInput::Prompt("work".into()),
            description: "stubborn".into(),
            tool_use_id: Some("toolu_1".into()),
            parent_queue: queue.clone(),
            progress: Arc::new(Progress::default()),
            output: None,
            slot: service.acquire(parent).unwrap(),
            gate: Some(gate),
            events: None,
            ledger: None,
            parent_turn: 0,
            deadline: None,
            name: None,
            worktree: None,
        })
        .await
        .unwrap();
    queue.settled().await;
    let delivered = queue.drain();
    assert_eq!(delivered.len(), 1, "exactly one notification");
    let n = TaskNotification::parse(&delivered[0].text).unwrap();
    assert_eq!(n.status, TaskStatus::Killed);
    assert_eq!(n.task_id, id);
    assert_eq!(
        service.registry().get(&id).await.unwrap().state,
        TaskState::Killed
    );
    assert_eq!(service.live(), 0, "the slot was freed");
}
