//! Coordinator mode: the coordinator's tools and prompt, its workers' tools (the background
//! set minus SendMessage, no Agent), every spawn in the background, and the same prefix bytes
//! on every build.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_spawn::agent_tool::AgentToolConfig;
use forkhive_spawn::coordinator::{COORDINATOR_PROMPT, CoordinatorConfig, coordinator};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::tool::{InBackground, ToolPool};
use forkhive_transport::{Backend, Request};
use support::*;

fn is_coordinator(r: &Request) -> bool {
    r.prefix
        .system_prompt()
        .first()
        .is_some_and(|s| s == COORDINATOR_PROMPT)
}

fn config() -> CoordinatorConfig {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Host);
    w.system_prompt = "You are a worker.".into();
    let workers = ToolPool::new([
        TestTool::sleeper("Lookup", true, 0).arc(),
        TestTool::sleeper("Read", true, 0)
            .in_background(InBackground::ByFilter)
            .arc(),
        TestTool::sleeper("SendMessage", true, 0)
            .in_background(InBackground::ByFilter)
            .arc(),
        TestTool::sleeper("Pager", true, 0)
            .in_background(InBackground::Denied)
            .arc(),
    ])
    .unwrap();
    let mut registry = AgentRegistry::builtin();
    let _ = registry.insert(w);
    CoordinatorConfig::new(workers).with_agent_tool(
        AgentToolConfig::default()
            .with_registry(registry)
            .with_fork_enabled(true)
            .with_warm_fanout(None),
    )
}

async fn build(backend: Arc<dyn Backend>) -> Agent {
    coordinator(Agent::builder(backend).model("m"), config())
        .unwrap()
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_coordinator_orchestrates_background_workers_that_cannot_spawn_or_message() {
    let b = brain(|r| {
        if !is_coordinator(r) {
            let tools: Vec<&str> = r.prefix.tools().iter().map(|t| t.name.as_str()).collect();
            assert_eq!(tools, ["Lookup", "Read"], "a worker's tools");
            return Plan::Reply(say("found it"));
        }
        match r.all_messages().len() {
            1 => {
                let tools: Vec<&str> = r.prefix.tools().iter().map(|t| t.name.as_str()).collect();
                assert_eq!(tools, ["Agent", "SendMessage", "TaskStop"]);
                let agent_schema = r.prefix.tools()[0].input_schema.as_str();
                assert!(
                    !agent_schema.contains("run_in_background"),
                    "{agent_schema}"
                );
                // No subagent_type and fork mode asked for: still a worker (forks are off).
                Plan::Reply(calls(&[
                    (
                        "a1",
                        "Agent",
                        r#"{"description":"look","prompt":"look","subagent_type":"worker"}"#,
                    ),
                    (
                        "a2",
                        "Agent",
                        r#"{"description":"look more","prompt":"look"}"#,
                    ),
                ]))
            }
            _ => Plan::Reply(say("all done")),
        }
    });
    let mut c = build(b.clone()).await;
    let run = c.run("investigate").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let kinds: Vec<(&str, bool)> = run
        .children()
        .iter()
        .map(|ch| (ch.agent_type.as_str(), ch.background))
        .collect();
    assert_eq!(kinds, [("worker", true), ("general-purpose", true)]);
    // The user context names what workers can use, in pool order.
    let context = format!("{:?}", c.params().user_context());
    assert!(
        context.contains("Workers you start can use these tools: Lookup, Read."),
        "{context}"
    );
}

/// The coordinator's prefix — prompt, tools, worker list — is the same bytes on every build:
/// it is the cache key of every turn.
#[tokio::test]
async fn the_coordinators_prefix_is_the_same_bytes_every_time() {
    let a = build(brain(|_| Plan::Reply(say("x")))).await;
    let b = build(brain(|_| Plan::Reply(say("x")))).await;
    assert_eq!(
        a.params().fingerprint().total(),
        b.params().fingerprint().total()
    );
}

/// The scratchpad is made below the output root without following links, and announced to
/// the coordinator and to every worker it starts.
#[tokio::test]
async fn the_scratchpad_is_made_safely_and_announced_to_all() {
    use forkhive_spawn::task::{OutputConfig, scratchpad};
    let root = tempfile::tempdir().unwrap();
    let config = OutputConfig::new(root.path(), "s1").unwrap();
    let dir = scratchpad(&config).await.unwrap();
    assert_eq!(dir, root.path().join("s1").join("scratchpad"));
    assert!(dir.is_dir());
    assert_eq!(scratchpad(&config).await.unwrap(), dir, "found again");

    // A planted symlink in place of the session directory is refused.
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), root.path().join("s2")).unwrap();
    let err = scratchpad(&OutputConfig::new(root.path(), "s2").unwrap())
        .await
        .unwrap_err();
    assert!(
        forkhive_core::error::chain(&err).starts_with(&format!(
            "checking task output directory {}",
            root.path().join("s2").display()
        )),
        "{err}"
    );
    assert!(!elsewhere.path().join("scratchpad").exists());

    let announced = dir.display().to_string();
    let b = brain(move |r| {
        let context = format!("{:?}", r.prefix.user_context());
        assert!(context.contains(&announced), "{context}");
        if is_coordinator(r) && r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"note","prompt":"note it","subagent_type":"worker"}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let mut c = coordinator(Agent::builder(b).model("m"), config_with_scratchpad(&dir))
        .unwrap()
        .build()
        .await
        .unwrap();
    let run = c.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(run.children().len(), 1);
}

fn config_with_scratchpad(dir: &std::path::Path) -> CoordinatorConfig {
    config().with_scratchpad(dir)
}

/// A teammate a coordinator starts (`name` and `team_name`) has `SendMessage` — the
/// coordinator's own, which it needs to reach its lead — while a plain worker beside it has
/// none; the host's `SendMessage` among the worker tools goes to neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinators_teammate_keeps_send_message_and_its_workers_do_not() {
    use forkhive_spawn::mailbox::MemoryMailbox;
    use forkhive_spawn::team::Team;
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, Vec<String>)>::new()));
    let record = Arc::clone(&seen);
    let b = brain(move |r| {
        let text = text_of(r);
        if !is_coordinator(r) {
            let who = if text.contains("task for carol") {
                "carol"
            } else {
                "plain"
            };
            let tools: Vec<String> = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
            if r.all_messages().len() == 1 {
                record.lock().unwrap().push((who.to_owned(), tools));
                if who == "carol" {
                    return Plan::Reply(calls(&[(
                        "s1",
                        "SendMessage",
                        r#"{"to":"team-lead","message":"carol is here"}"#,
                    )]));
                }
            }
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"carol","prompt":"task for carol","subagent_type":"worker","name":"carol","team_name":"review"}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"plain","prompt":"task for plain","subagent_type":"worker"}"#,
                ),
            ]));
        }
        if idle_notices(&text) > 0 && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x",
                "SendMessage",
                r#"{"to":"carol","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let mut config = config();
    config.agent_tool = config.agent_tool.with_teams_enabled(true);
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut c = coordinator(Agent::builder(b).model("m"), config)
        .unwrap()
        .extension(Arc::clone(&team))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), c.run("go"))
        .await
        .expect("the coordinator's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "carol".to_owned(),
                vec!["Lookup".into(), "Read".into(), "SendMessage".into()]
            ),
            ("plain".to_owned(), vec!["Lookup".into(), "Read".into()]),
        ]
    );
    let all = format!("{:?}", c.params().messages());
    assert!(all.contains("carol is here"), "{all}");
}

/// A coordinator built without transcripts is told, as a warning event at its first run, that
/// `SendMessage` cannot resume a finished worker; with a transcript directory it is not.
#[tokio::test]
async fn a_coordinator_without_transcripts_is_warned_that_finished_workers_stay_finished() {
    let warnings_of = |dir: Option<std::path::PathBuf>| async move {
        let events = Arc::new(Events::default());
        let mut builder = Agent::builder(brain(|_| Plan::Reply(say("planned"))))
            .model("m")
            .events(Arc::clone(&events) as _);
        if let Some(dir) = dir {
            builder = builder.transcript_dir(dir);
        }
        let mut agent = coordinator(builder, config())
            .unwrap()
            .build()
            .await
            .unwrap();
        drop(agent.run("hi").await);
        // (`config()` also sets fork mode, which coordinator mode turns off: a warning too.)
        let mut warnings = events.warnings();
        warnings.retain(|w| !w.contains("fork mode"));
        warnings
    };
    assert_eq!(
        warnings_of(None).await,
        [
            "tool `Agent`: coordinator mode without transcripts: `SendMessage` to a worker that \
             has finished cannot resume it (it keeps no transcript), so the message is refused; \
             give the coordinator's builder a `transcript_dir` (a coordinator resumed from a \
             file not named `<agent id>.jsonl` gives its workers none)"
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let kept = warnings_of(Some(dir.path().to_path_buf())).await;
    assert!(kept.is_empty(), "{kept:?}");
}

/// The two other settings that leave a coordinator's `SendMessage` short are warned of too: a
/// task service that keeps no finished worker resumable (`max_resumable` 0), and the
/// background veto, which keeps every worker in the foreground.
#[tokio::test]
async fn a_coordinator_whose_workers_cannot_be_messaged_is_warned() {
    use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
    let warnings_of = |config: CoordinatorConfig, max_resumable: usize| async move {
        let dir = tempfile::tempdir().unwrap();
        let events = Arc::new(Events::default());
        let builder = Agent::builder(brain(|_| Plan::Reply(say("planned"))))
            .model("m")
            .transcript_dir(dir.path())
            .extension(TaskService::new(
                Arc::new(MemoryTaskRegistry::new()),
                TaskConfig::default().with_max_resumable(max_resumable),
            ))
            .events(Arc::clone(&events) as _);
        let mut agent = coordinator(builder, config).unwrap().build().await.unwrap();
        drop(agent.run("hi").await);
        let mut warnings = events.warnings();
        warnings.retain(|w| !w.contains("fork mode"));
        warnings
    };
    assert_eq!(
        warnings_of(config(), 0).await,
        [
            "tool `Agent`: coordinator mode with `TaskConfig::max_resumable` 0: no finished \
             worker is kept resumable, so `SendMessage` to one is refused; keep some \
             (`with_max_resumable`, 64 by default)"
        ]
    );
    let mut vetoed = config();
    vetoed.agent_tool = vetoed.agent_tool.with_background_disabled(true);
    assert_eq!(
        warnings_of(vetoed, 64).await,
        [
            "tool `Agent`: coordinator mode with background tasks disabled: every worker runs \
             in the foreground, and the coordinator waits for each round of them to finish (no \
             notifications, nothing else done meanwhile), and `SendMessage` never reaches a \
             running one; turn the veto off (`with_background_disabled(false)`)"
        ]
    );
    let kept = warnings_of(config(), 1).await;
    assert!(kept.is_empty(), "{kept:?}");
}
