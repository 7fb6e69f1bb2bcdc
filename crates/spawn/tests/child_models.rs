//! The model a child runs on: the call's `model` is checked against what the host allows, and
//! a fork keeps its parent's (the prompt cache is keyed on it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
use forkhive_spawn::tool::{Tool, ToolPool};
use support::*;

/// The call's `model`: `inherit`, the caller's own and the definition's own are allowed; any
/// other only when the host lists it; a fork keeps its parent's. A refusal names what is
/// allowed; an allowed model is the one the child's requests carry.
#[tokio::test]
async fn a_child_model_must_be_allowed_by_the_host() {
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<(u32, String)>>> = Arc::default();
    let results: Arc<Mutex<Vec<(String, String, bool)>>> = Arc::default();
    let calls_json = [
        (
            "c1",
            serde_json::json!({"description": "a", "prompt": "p", "subagent_type": "worker", "model": "big"}),
        ),
        (
            "c2",
            serde_json::json!({"description": "b", "prompt": "p", "subagent_type": "reviewer"}),
        ),
        (
            "c3",
            serde_json::json!({"description": "c", "prompt": "p", "subagent_type": "worker", "model": "listed"}),
        ),
        (
            "c4",
            serde_json::json!({"description": "d", "prompt": "p", "subagent_type": "reviewer", "model": "inherit"}),
        ),
    ];
    let model = {
        let seen = Arc::clone(&seen);
        let results = Arc::clone(&results);
        brain(move |r| {
            let me = AgentContext::current().unwrap();
            seen.lock()
                .unwrap()
                .push((me.depth(), r.prefix.model().to_owned()));
            if me.depth() > 0 {
                return Plan::Reply(say("child done"));
            }
            if has_tool_result(r) {
                results.lock().unwrap().extend(support::results(r));
                return Plan::Reply(say("parent done"));
            }
            let list: Vec<(String, String)> = calls_json
                .iter()
                .map(|(id, input)| ((*id).to_owned(), input.to_string()))
                .collect();
            let refs: Vec<(&str, &str, &str)> = list
                .iter()
                .map(|(id, input)| (id.as_str(), "Agent", input.as_str()))
                .collect();
            Plan::Reply(calls(&refs))
        })
    };
    let mut worker = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    worker.system_prompt = "You are a worker.".into();
    let mut reviewer = AgentDefinition::new("reviewer", "reviews", DefinitionSource::Project);
    reviewer.system_prompt = "You review.".into();
    reviewer.model = Some("small".into());
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker, reviewer]))
        // The caller's own model listed again is named once in a refusal.
        .with_allowed_models(vec!["listed".into(), "m".into()]);
    let tool = AgentTool::new(config).unwrap();
    let mut parent = Agent::builder(model)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .build()
        .await
        .unwrap();
    assert_eq!(parent.run("go").await.stop, StopReason::Completed);
    let results = results.lock().unwrap().clone();
    let by_id = |id: &str| results.iter().find(|r| r.0 == id).unwrap().clone();
    let (_, text, is_error) = by_id("c1");
    assert!(is_error);
    assert_eq!(
        text,
        "model `big` is not allowed for agents on this host; use one of: `inherit`, `m`, `listed`"
    );
    assert!(
        !by_id("c2").2 && !by_id("c3").2 && !by_id("c4").2,
        "{results:?}"
    );
    let mut child_models: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(d, _)| *d == 1)
        .map(|(_, m)| m.clone())
        .collect();
    child_models.sort();
    // reviewer on its own model twice (no model, and `inherit` keeps the definition's), the
    // worker on the listed one.
    assert_eq!(child_models, vec!["listed", "small", "small"]);
}

/// A fork's request is its parent's bytes, model included: asking for another model is an
/// error, not a silent fork on the parent's. A fresh agent on that model is suggested only when
/// the host allows it.
#[tokio::test]
async fn a_fork_asking_for_another_model_is_refused() {
    use std::sync::Mutex;
    // (the host's allow list, whether an agent type runs on `other`, the refusal)
    for (allowed, typed, want) in [
        (
            vec![],
            false,
            "a fork keeps its parent's model `m` (the prompt cache is keyed on it): omit \
             `model`",
        ),
        (
            vec!["other".to_owned()],
            false,
            "a fork keeps its parent's model `m` (the prompt cache is keyed on it): omit \
             `model`, or name a `subagent_type` to start a fresh agent on `other`",
        ),
        // Not allowed by the host, but an agent type's own model.
        (
            vec![],
            true,
            "a fork keeps its parent's model `m` (the prompt cache is keyed on it): omit \
             `model`, or start a fresh agent of a type that runs on `other`: `reviewer`",
        ),
    ] {
        let results: Arc<Mutex<Vec<(String, String, bool)>>> = Arc::default();
        let model = {
            let results = Arc::clone(&results);
            brain(move |r| {
                if has_tool_result(r) {
                    results.lock().unwrap().extend(support::results(r));
                    return Plan::Reply(say("parent done"));
                }
                let input =
                    serde_json::json!({"description": "f", "prompt": "p", "model": "other"});
                Plan::Reply(calls(&[("f1", "Agent", &input.to_string())]))
            })
        };
        let registry = if typed {
            let mut d = AgentDefinition::new("reviewer", "reviews", DefinitionSource::Project);
            d.model = Some("other".into());
            AgentRegistry::from_definitions([d])
        } else {
            AgentRegistry::default()
        };
        let config = AgentToolConfig::default()
            .with_fork_enabled(true)
            .with_registry(registry)
            .with_allowed_models(allowed);
        let tool = AgentTool::new(config).unwrap();
        let mut parent = Agent::builder(model)
            .model("m")
            .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
            .build()
            .await
            .unwrap();
        let _ = parent.run("go").await;
        let results = results.lock().unwrap().clone();
        assert_eq!(results, vec![("f1".to_owned(), want.to_owned(), true)]);
    }
}

/// An alias and the id it stands for are one model to the host's checks: `haiku` asked under a
/// parent on `claude-haiku-4-5` is the parent's model, and `sonnet` is allowed where the host
/// lists `claude-sonnet-5`.
#[tokio::test]
async fn an_alias_and_its_id_are_one_model() {
    let (model, results) = parent_calling_agents(&[
        (
            "c1",
            r#"{"description":"a","prompt":"p","subagent_type":"worker","model":"haiku"}"#,
        ),
        (
            "c2",
            r#"{"description":"b","prompt":"p","subagent_type":"worker","model":"sonnet"}"#,
        ),
        (
            "c3",
            r#"{"description":"c","prompt":"p","subagent_type":"worker","model":"opus"}"#,
        ),
    ]);
    let mut worker = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    worker.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([worker]))
        .with_allowed_models(vec!["claude-sonnet-5".into()]);
    let mut parent = Agent::builder(model)
        .model("claude-haiku-4-5")
        .tools(ToolPool::new([Arc::new(AgentTool::new(config).unwrap()) as Arc<dyn Tool>]).unwrap())
        .build()
        .await
        .unwrap();
    assert_eq!(parent.run("go").await.stop, StopReason::Completed);
    let results = results.lock().unwrap().clone();
    let by_id = |id: &str| results.iter().find(|r| r.0 == id).unwrap().clone();
    assert!(!by_id("c1").2, "{:?}", by_id("c1"));
    assert!(!by_id("c2").2, "{:?}", by_id("c2"));
    let (_, text, is_error) = by_id("c3");
    assert!(is_error, "{text}");
    assert!(text.starts_with("model `opus` is not allowed"), "{text}");
}
