//! Traps a host met when embedding the library, each pinned: its own tools in background
//! subagents, fork mode's forced background, and one task configuration per tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_core::{TaskId, TaskKind};
use forkhive_spawn::Error;
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, AgentKind, EventKind, QuerySource, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::tool::{InBackground, Tool, ToolPool};
use forkhive_transport::{Backend, Request};
use support::*;

fn tool_names(r: &Request) -> Vec<String> {
    r.prefix.tools().iter().map(|t| t.name.clone()).collect()
}

/// A `worker` whose definition names the host's `Lookup`, the built-in `Read`, a `Pager` the
/// host marks foreground-only, a `Missing` tool nobody provides and `lookup` in the wrong case.
fn registry() -> AgentRegistry {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    w.tools = Some(vec![
        "Lookup".into(),
        "Read".into(),
        "Pager".into(),
        "Missing".into(),
        "lookup".into(),
    ]);
    AgentRegistry::from_definitions([w])
}

async fn parent(backend: Arc<dyn Backend>, config: AgentToolConfig, events: Arc<Events>) -> Agent {
    let tools = ToolPool::new([
        Arc::new(AgentTool::new(config).unwrap()) as Arc<dyn Tool>,
        TestTool::sleeper("Lookup", true, 0).arc(),
        TestTool::sleeper("Pager", true, 0)
            .in_background(InBackground::Denied)
            .arc(),
        TestTool::sleeper("Read", true, 0)
            .in_background(InBackground::ByFilter)
            .arc(),
    ])
    .unwrap();
    Agent::builder(backend)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .events(events)
        .build()
        .await
        .unwrap()
}

/// The seeds' background allow list is about built-in tools: a host's own tool named in the
/// definition reaches a background subagent, and each named tool it will not get is a
/// warning that says why.
#[tokio::test]
async fn a_hosts_own_tool_reaches_a_background_subagent_and_missing_ones_are_reported() {
    let b = brain(|r| {
        if is_parent(r) {
            return match r.all_messages().len() {
                1 => Plan::Reply(calls(&[(
                    "a1",
                    "Agent",
                    r#"{"description":"look","prompt":"look it up","subagent_type":"worker","run_in_background":true}"#,
                )])),
                _ => Plan::Reply(say("done")),
            };
        }
        assert_eq!(
            tool_names(r),
            ["Lookup", "Read"],
            "the background worker's tools"
        );
        if has_tool_result(r) {
            let (_, text, is_error) = results(r).pop().unwrap();
            assert!(!is_error, "{text}");
            assert_eq!(text, "Lookup {\"q\":\"x\"}");
            Plan::Reply(say("found x"))
        } else {
            Plan::Reply(calls(&[("l1", "Lookup", r#"{"q":"x"}"#)]))
        }
    });
    let events = Arc::new(Events::default());
    let config = AgentToolConfig::default().with_registry(registry());
    let mut p = parent(b, config, Arc::clone(&events)).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let seen = events.take();
    // The parent says the child started before the child says anything, warnings included.
    let started = seen
        .iter()
        .position(|e| matches!(e.kind, EventKind::ChildStarted { .. }))
        .unwrap();
    let first_warning = seen
        .iter()
        .position(|e| matches!(e.kind, EventKind::Warning { .. }))
        .unwrap();
    assert!(started < first_warning);
    let warnings: Vec<String> = seen
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Warning { message } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(
        warnings,
        [
            "agent `worker` names tool `Pager` in `tools`, but this background agent will not \
             have it: agents running in the background may not use it (filtering layer 2)",
            "agent `worker` names tool `Missing` in `tools`, but this background agent will not \
             have it: the host provides no tool of that name",
            "agent `worker` names tool `lookup` in `tools`, but this background agent will not \
             have it: the host provides no tool of that name; did you mean `Lookup`? Tool names \
             are case-sensitive",
        ]
    );
}

/// With fork mode on, every spawn runs in the background — a typed subagent too, although
/// `run_in_background` is not even in the schema then.
#[tokio::test]
async fn fork_mode_sends_typed_subagents_to_the_background_too() {
    let b = brain(|r| {
        if is_parent(r) {
            return match r.all_messages().len() {
                1 => Plan::Reply(calls(&[(
                    "a1",
                    "Agent",
                    r#"{"description":"look","prompt":"look it up","subagent_type":"worker"}"#,
                )])),
                _ => Plan::Reply(say("done")),
            };
        }
        Plan::Reply(say("found"))
    });
    let config = AgentToolConfig::default()
        .with_registry(registry())
        .with_fork_enabled(true);
    let schema = config.input_schema();
    assert!(schema["properties"].get("run_in_background").is_none());
    let mut p = parent(b.clone(), config, Arc::new(Events::default())).await;
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    let first_result = support::message_results(&p.params().messages()[2]);
    assert_eq!(first_result.len(), 1);
    assert!(
        first_result[0]
            .1
            .contains("started in the background as task"),
        "{}",
        first_result[0].1
    );
}

/// A tree has one task service, so one `TaskConfig`: passing a second one to a builder whose
/// tree already holds one is an error naming the type, not a configuration silently unread.
#[tokio::test]
async fn a_second_task_service_for_one_tree_is_refused() {
    let b = brain(|_| Plan::Reply(say("hi")));
    let service = || TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let root = Agent::builder(b.clone())
        .model("m")
        .extension(service())
        .build()
        .await
        .unwrap();
    assert!(root.tree().extensions().get::<TaskService>().is_some());
    let err = Agent::builder(b)
        .model("m")
        .child_of(root.child_seed(
            TaskId::generate(TaskKind::Agent),
            AgentKind::Subagent,
            QuerySource::custom("worker"),
        ))
        .extension(service())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    // An Arc of an Arc would be stored where nothing looks: refused, naming the fix.
    let doubled = Agent::builder(brain(|_| Plan::Reply(say("hi"))))
        .model("m")
        .extension(Arc::new(service()))
        .build()
        .await
        .unwrap_err();
    assert_eq!(
        doubled.to_string(),
        "invalid agent configuration: `.extension` was given an \
         `Arc<Arc<forkhive_spawn::task::TaskService>>`, which nothing looks up: pass the \
         `Arc<forkhive_spawn::task::TaskService>` itself"
    );
    assert_eq!(
        err.to_string(),
        "invalid agent configuration: the agent tree already holds a \
         `forkhive_spawn::task::TaskService`; a tree has one of each service, so configure that \
         one instead of passing another to the builder"
    );
}
