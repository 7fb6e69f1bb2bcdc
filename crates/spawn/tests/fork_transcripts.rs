//! A fork child's transcript refers to its parent's for the history they share: it holds only
//! the child's own records (O(directive)), reads back whole, resumes, and a changed or missing
//! parent transcript is an error naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_spawn::transcript;
use support::*;

const HISTORY: &str = "an earlier turn whose text is long enough to notice if it were copied";

/// A parent with some history forks once; the fork answers.
async fn forked(dir: &std::path::Path) -> (Agent, Arc<TaskService>) {
    let model = brain(|r| {
        let me = AgentContext::current().unwrap();
        if me.depth() > 0 {
            return Plan::Reply(say("fork report"));
        }
        if has_tool_result(r) {
            return Plan::Reply(say("parent done"));
        }
        let input = serde_json::json!({"description": "audit", "prompt": "audit the parser"});
        Plan::Reply(calls(&[("toolu_f", "Agent", &input.to_string())]))
    });
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_fork_enabled(true)
            .with_warm_fanout(None),
    )
    .unwrap();
    let history: Vec<forkhive_core::Message> = (0..20)
        .flat_map(|i| {
            [
                forkhive_core::Message::user_text(format!("question {i}: {HISTORY}")),
                forkhive_core::Message::assistant_text(format!("answer {i}: {HISTORY}")),
            ]
        })
        .collect();
    let params = forkhive_core::CacheSafeParams::builder("m")
        .system_block("You are the parent.")
        .tools(
            ToolPool::new([Arc::new(tool.clone()) as Arc<dyn Tool>])
                .unwrap()
                .definitions(),
        )
        .messages(history)
        .build();
    let mut parent = Agent::builder(model)
        .params(params)
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap())
        .transcript_dir(dir)
        .build()
        .await
        .unwrap();
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    parent.tree().extensions().insert(Arc::clone(&service));
    assert_eq!(parent.run("fork once").await.stop, StopReason::Completed);
    service.wait_idle().await;
    (parent, service)
}

async fn child_path(parent: &Agent, service: &TaskService) -> std::path::PathBuf {
    let children = service.registry().children(parent.id()).await;
    assert_eq!(children.len(), 1);
    children[0].transcript.clone().unwrap()
}

#[tokio::test]
async fn a_fork_transcript_holds_only_its_own_records_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path()).await;
    let path = child_path(&parent, &service).await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(HISTORY), "the parent's history was copied");
    let parent_len = std::fs::metadata(parent.transcript_path().unwrap())
        .unwrap()
        .len();
    assert!(
        (text.len() as u64) < parent_len / 2,
        "child {} bytes, parent {parent_len}",
        text.len()
    );
    let t = transcript::read(&path).await.unwrap();
    // 40 history + the parent's prompt + its Agent call, then the fork's own message and answer.
    assert_eq!(t.inherited, 42);
    assert_eq!(t.header.inherited_messages, Some(42));
    assert_eq!(t.messages.len(), 44);
    let parent_t = transcript::read(parent.transcript_path().unwrap())
        .await
        .unwrap();
    assert_eq!(&t.messages[..42], &parent_t.messages[..42]);
    assert_eq!(t.messages[43].text(), "fork report");
    assert_eq!(t.stops.last().unwrap().stop, StopReason::Completed);
}

#[tokio::test]
async fn a_fork_resumes_from_its_transcript_with_its_whole_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path()).await;
    let path = child_path(&parent, &service).await;
    let again = Arc::new(forkhive_transport::ScriptedBackend::from_replies([Ok(
        say("resumed"),
    )]));
    let tool = AgentTool::new(AgentToolConfig::default().with_fork_enabled(true)).unwrap();
    let builder = Agent::builder(again.clone())
        .tools(ToolPool::new([Arc::new(tool) as Arc<dyn Tool>]).unwrap());
    let (mut child, report) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(report.messages, 44);
    let run = child.run("go on").await;
    assert_eq!(run.final_text, "resumed");
    // The resumed request carries the inherited history, byte for byte.
    let sent = again.requests().last().unwrap().all_messages();
    assert!(sent[0].text().contains(HISTORY));
    // And the file goes on with the next indexes.
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.messages.len(), 46);
}

#[tokio::test]
async fn a_changed_or_missing_parent_transcript_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path()).await;
    let path = child_path(&parent, &service).await;
    let parent_path = parent.transcript_path().unwrap().to_path_buf();
    let original = std::fs::read_to_string(&parent_path).unwrap();
    std::fs::write(
        &parent_path,
        original.replacen("question 3", "question 9", 1),
    )
    .unwrap();
    // The parent's own file no longer matches its header's fingerprint (the message was
    // one it started with): refused when the parent's file is read.
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {}:1: inherits 42 messages from its parent's transcript, which cannot \
             be used: transcript {}:1: the header's model, system prompt, contexts or tools, or \
             the messages the agent started with, are not those its prefix_fingerprint was \
             taken of: the file was changed since it was written",
            path.display(),
            parent_path.display()
        )
    );
    // A message the parent wrote as it ran (its prompt), after those it started with: its own
    // file still reads, and the child's inherited messages no longer match.
    std::fs::write(
        &parent_path,
        original.replacen("fork once", "fork twice", 1),
    )
    .unwrap();
    assert!(transcript::read(&parent_path).await.is_ok());
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {}:1: the 42 messages inherited from {} do not match this \
             transcript's prefix fingerprint: the parent's transcript was changed",
            path.display(),
            parent_path.display()
        )
    );
    std::fs::remove_file(&parent_path).unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {}:1: inherits 42 messages from its parent's transcript, which cannot \
             be used: reading transcript {}: No such file or directory (os error 2)",
            path.display(),
            parent_path.display()
        )
    );
}
