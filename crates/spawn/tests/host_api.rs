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

fn is_parent(r: &Request) -> bool {
    r.prefix
        .system_prompt()
        .first()
        .is_some_and(|s| s == "You are the parent.")
}

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
    let config = AgentToolConfig {
        registry: AgentRegistry::from_definitions([w]),
        fork_enabled: true,
        ..AgentToolConfig::default()
    };
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
