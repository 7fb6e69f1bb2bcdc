//! What a host reads of a run: each child's start as an event, a run's children with their
//! status and usage, a failed tool call's reason, a task record's agent type.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_core::TaskStatus;
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, EventKind, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::tool::{Tool, ToolOutput, ToolPool};
use forkhive_transport::{Request, Response};
use support::*;

#[tokio::test]
async fn a_run_reports_its_children_and_the_events_say_when_each_started() {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("part done"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(Response::tool_calls([
                (
                    "Agent",
                    serde_json::json!({"description": "part a", "prompt": "do a", "subagent_type": "worker"}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "part b", "prompt": "do b", "subagent_type": "worker"}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "the rest", "prompt": "do the rest"}),
                ),
                ("Broken", serde_json::json!({})),
            ])),
            _ if has_tool_result(r) && r.all_messages().len() == 3 => Plan::Reply(say("waiting")),
            _ => Plan::Reply(say("all done")),
        }
    });
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_fork_enabled(true);
    let broken = TestTool::new("Broken", OBJECT, true, |_, _| async {
        ToolOutput::error("the disk is full")
    });
    let events = Arc::new(Events::default());
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut p = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(
            ToolPool::new([
                Arc::new(AgentTool::new(config).unwrap()) as Arc<dyn Tool>,
                broken.arc(),
            ])
            .unwrap(),
        )
        .events(Arc::clone(&events) as _)
        .extension(Arc::clone(&service))
        .build()
        .await
        .unwrap();
    let run = p.run("split it").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);

    // The run's children, in start order, each ended with its usage.
    let children = run.children();
    let kinds: Vec<(&str, &str, bool)> = children
        .iter()
        .map(|c| (c.agent_type.as_str(), c.description.as_str(), c.background))
        .collect();
    assert_eq!(
        kinds,
        [
            ("worker", "part a", true),
            ("worker", "part b", true),
            ("fork", "the rest", true)
        ]
    );
    for c in children {
        assert_eq!(c.status, Some(TaskStatus::Completed), "{}", c.description);
        assert!(c.usage.output_tokens > 0, "{}", c.description);
        let record = service.registry().get(&c.id).await.unwrap();
        assert_eq!(record.agent_type, c.agent_type);
        assert_eq!(record.usage, c.usage);
    }

    let seen = events.take();
    // One ChildStarted per child, from the parent, before any event of that child.
    for c in children {
        let started = seen
            .iter()
            .position(|e| matches!(&e.kind, EventKind::ChildStarted { task, .. } if *task == c.id))
            .expect("a ChildStarted event");
        assert_eq!(seen[started].agent, *p.id());
        assert_eq!(seen[started].turn, 1);
        let first_own = seen.iter().position(|e| e.agent == c.id).unwrap();
        assert!(started < first_own);
    }
    // The failed call says why.
    let failed: Vec<(String, Option<String>)> = seen
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished {
                name,
                is_error: true,
                error,
                ..
            } => Some((name.to_string(), error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [("Broken".to_owned(), Some("the disk is full".to_owned()))]
    );
    // A second run reports only its own children.
    let again = p.run("anything else?").await;
    assert!(again.children().is_empty());
}

/// Per-spawn deadlines: a definition's own `deadline`, a host's override for a type over it,
/// the service's deadline for the rest — in the foreground as in the background.
#[tokio::test(start_paused = true)]
async fn each_type_runs_to_its_own_deadline() {
    use forkhive_transport::ScriptedBackend;
    use std::time::Duration;
    let started = tokio::time::Instant::now();
    let b = Arc::new(ScriptedBackend::from_async_fn(|r: Request| async move {
        if !is_parent(&r) {
            // Every child hangs: only its deadline ends it.
            std::future::pending::<()>().await;
        }
        Ok(match r.all_messages().len() {
            1 => Response::tool_calls([
                (
                    "Agent",
                    serde_json::json!({"description": "slow", "prompt": "p", "subagent_type": "slow", "run_in_background": true}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "capped", "prompt": "p", "subagent_type": "capped", "run_in_background": true}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "fg", "prompt": "p", "subagent_type": "slow"}),
                ),
            ]),
            _ => Response::say("done"),
        })
    }));
    let def = |name: &str, secs: u64| {
        let mut d = AgentDefinition::new(name, "hangs", DefinitionSource::Project);
        d.deadline = Some(Duration::from_secs(secs));
        d
    };
    let mut config = AgentToolConfig::default().with_registry(AgentRegistry::from_definitions([
        def("slow", 30),
        def("capped", 600),
    ]));
    config
        .deadlines
        .insert("capped".into(), Duration::from_secs(10));
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut p = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([AgentTool::new(config).unwrap().arc()]).unwrap())
        .extension(Arc::clone(&service))
        .build()
        .await
        .unwrap();
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ended: Vec<(&str, Option<TaskStatus>, bool)> = run
        .children()
        .iter()
        .map(|c| (c.description.as_str(), c.status, c.background))
        .collect();
    assert_eq!(
        ended,
        [
            ("slow", Some(TaskStatus::Killed), true),
            ("capped", Some(TaskStatus::Killed), true),
            ("fg", Some(TaskStatus::Killed), false),
        ]
    );
    // The foreground child held the round for its 30 s; the run ended with the last child.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(30) && took < Duration::from_secs(40),
        "{took:?}"
    );
    let capped = &run.children()[1];
    let record = service.registry().get(&capped.id).await.unwrap();
    assert_eq!(record.state, forkhive_spawn::task::TaskState::Killed);
}

/// A run that stops at a limit returns with its background children still running: it lists
/// them running, and the next run that returns after each has ended lists it again with its
/// status and usage — also when it ended between the two runs — so each child's end is in
/// exactly one run's `children()`, and a host summing them counts each child once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_still_running_when_its_run_stopped_is_reported_by_the_run_that_sees_it_end() {
    let a = Arc::new(tokio::sync::Semaphore::new(0));
    let b = Arc::new(tokio::sync::Semaphore::new(0));
    let (ga, gb) = (Arc::clone(&a), Arc::clone(&b));
    let gate = TestTool::new("Gate", OBJECT, true, move |input, _| {
        let gate = if input["which"] == "a" {
            Arc::clone(&ga)
        } else {
            Arc::clone(&gb)
        };
        async move {
            drop(gate.acquire().await.unwrap());
            ToolOutput::text("opened")
        }
    });
    let release_b = Arc::clone(&b);
    let brain = brain(move |r| {
        if !is_parent(r) {
            if has_tool_result(r) {
                return Plan::Reply(say("part done"));
            }
            let which = if r.all_messages()[0].text().contains("do a") {
                "a"
            } else {
                "b"
            };
            return Plan::Reply(Response::tool_calls([(
                "Gate",
                serde_json::json!({ "which": which }),
            )]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(Response::tool_calls([
                (
                    "Agent",
                    serde_json::json!({"description": "part a", "prompt": "do a", "subagent_type": "worker", "run_in_background": true}),
                ),
                (
                    "Agent",
                    serde_json::json!({"description": "part b", "prompt": "do b", "subagent_type": "worker", "run_in_background": true}),
                ),
            ]));
        }
        if r.all_messages().len() == 3 {
            // The first run's last turn: it stops at its limit after this call.
            return Plan::Reply(Response::tool_calls([("Noop", serde_json::json!({}))]));
        }
        // The second run: `b` may finish now, while this run waits for it.
        release_b.add_permits(1);
        Plan::Reply(say("waiting"))
    });
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_subagent_tools(Some(ToolPool::new([gate.arc()]).unwrap()));
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut p = Agent::builder(brain)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(
            ToolPool::new([
                Arc::new(AgentTool::new(config).unwrap()) as Arc<dyn Tool>,
                TestTool::new("Noop", OBJECT, true, |_, _| async {
                    ToolOutput::text("ok")
                })
                .arc(),
            ])
            .unwrap(),
        )
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(2)))
        .extension(Arc::clone(&service))
        .build()
        .await
        .unwrap();

    let first = p.run("split it").await;
    assert_eq!(
        first.stop,
        StopReason::MaxTurns { limit: 2 },
        "{:?}",
        first.error
    );
    let running: Vec<_> = first
        .children()
        .iter()
        .map(|c| (c.description.as_str(), c.status, c.usage.total_tokens()))
        .collect();
    assert_eq!(running, [("part a", None, 0), ("part b", None, 0)]);
    let (id_a, id_b) = (first.children()[0].id, first.children()[1].id);

    // `a` ends between the runs; `b` during the second.
    a.add_permits(1);
    let ended = async {
        while !service
            .registry()
            .get(&id_a)
            .await
            .unwrap()
            .state
            .is_terminal()
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), ended)
        .await
        .expect("a ended");
    let second = tokio::time::timeout(std::time::Duration::from_secs(10), p.run_pending())
        .await
        .expect("the second run returned");
    assert_eq!(second.stop, StopReason::Completed, "{:?}", second.error);
    let reported: Vec<_> = second.children().iter().map(|c| (c.id, c.status)).collect();
    assert_eq!(
        reported,
        [
            (id_a, Some(TaskStatus::Completed)),
            (id_b, Some(TaskStatus::Completed))
        ]
    );
    for c in second.children() {
        let record = service.registry().get(&c.id).await.unwrap();
        assert!(c.usage.output_tokens > 0, "{}", c.description);
        assert_eq!(record.usage, c.usage, "{}", c.description);
    }
    // Reported once: a later run lists neither.
    let third = p.run("anything else?").await;
    assert!(third.children().is_empty(), "{:?}", third.children());
}

/// A run dropped before it returned (a host's `timeout` around `run`) lists nothing; its
/// background child runs on, and the next run that returns lists it, ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_runs_child_is_reported_by_the_next_run_that_returns() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let wait = TestTool::new("Gate", OBJECT, true, move |_, _| {
        let g = Arc::clone(&g);
        async move {
            drop(g.acquire().await.unwrap());
            ToolOutput::text("opened")
        }
    });
    let brain = brain(|r| {
        if !is_parent(r) {
            if has_tool_result(r) {
                return Plan::Reply(say("part done"));
            }
            return Plan::Reply(Response::tool_calls([("Gate", serde_json::json!({}))]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(Response::tool_calls([(
                "Agent",
                serde_json::json!({"description": "part a", "prompt": "do a", "subagent_type": "worker", "run_in_background": true}),
            )]));
        }
        if text_of(r).contains("<task-notification>") {
            return Plan::Reply(say("got it"));
        }
        // The first run's next turn never ends: the host gives up on it.
        Plan::Hang
    });
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_subagent_tools(Some(ToolPool::new([wait.arc()]).unwrap()));
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut p = Agent::builder(brain)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(AgentTool::new(config).unwrap()) as Arc<dyn Tool>]).unwrap())
        .extension(Arc::clone(&service))
        .build()
        .await
        .unwrap();
    // The first run is dropped once its child is on record.
    let parent = *p.id();
    {
        let run = p.run("go");
        let mut run = std::pin::pin!(run);
        let started = async {
            while service.registry().children(&parent).await.is_empty() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            r = &mut run => panic!("the first run returned: {:?}", r.stop),
            () = started => {}
        }
    }
    let id = service.registry().children(&parent).await[0].id;
    gate.add_permits(1);
    let second = tokio::time::timeout(std::time::Duration::from_secs(10), p.run_pending())
        .await
        .expect("the second run returned");
    assert_eq!(second.stop, StopReason::Completed, "{:?}", second.error);
    let reported: Vec<_> = second.children().iter().map(|c| (c.id, c.status)).collect();
    assert_eq!(reported, [(id, Some(TaskStatus::Completed))]);
    assert!(second.children()[0].usage.output_tokens > 0);
    assert!(p.run("more?").await.children().is_empty());
}
