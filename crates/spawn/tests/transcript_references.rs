//! A fork child's transcript refers to its parent's (`inherited_messages`) instead of copying
//! it. A damaged, changed or hostile reference is an exact error — never a panic, a hang, a
//! read through a link out of the directory, or a different conversation — and the children
//! of a resumed agent write theirs beside its transcript as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use forkhive_core::{CacheSafeParams, Message, TaskId, TaskKind};
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::runtime::{Agent, AgentContext, AgentKind, QuerySource, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_spawn::transcript;
use support::*;

const HISTORY: &str = "an earlier turn whose text is long enough to notice if it were copied";

/// Forks when the last user text starts with "fork" (one Agent call per `forks`), at depth 0.
fn model(forks: usize) -> Arc<Brain> {
    brain(move |r| {
        let me = AgentContext::current().unwrap();
        if me.depth() > 0 {
            return Plan::Reply(say("fork report"));
        }
        let last = last_user_text(r);
        if !last.starts_with("fork") {
            return Plan::Reply(say("parent done"));
        }
        let tag = last.replace(' ', "_");
        let inputs: Vec<(String, String)> = (0..forks)
            .map(|i| {
                let input = serde_json::json!({"description": format!("audit {i}"), "prompt": format!("audit part {i}")});
                (format!("toolu_{tag}_{i}"), input.to_string())
            })
            .collect();
        let list: Vec<(&str, &str, &str)> = inputs
            .iter()
            .map(|(id, input)| (id.as_str(), "Agent", input.as_str()))
            .collect();
        Plan::Reply(calls(&list))
    })
}

fn tool() -> AgentTool {
    AgentTool::new(
        AgentToolConfig::default()
            .with_fork_enabled(true)
            .with_warm_fanout(None),
    )
    .unwrap()
}

fn pool() -> ToolPool {
    ToolPool::new([Arc::new(tool()) as Arc<dyn Tool>]).unwrap()
}

fn history(n: usize) -> Vec<Message> {
    (0..n)
        .flat_map(|i| {
            [
                Message::user_text(format!("question {i}: {HISTORY}")),
                Message::assistant_text(format!("answer {i}: {HISTORY}")),
            ]
        })
        .collect()
}

fn params(messages: Vec<Message>) -> CacheSafeParams {
    CacheSafeParams::builder("m")
        .system_block("You are the parent.")
        .tools(pool().definitions())
        .messages(messages)
        .build()
}

/// A parent with 40 messages of history forks `forks` children in one turn.
async fn forked(dir: &Path, forks: usize) -> (Agent, Arc<TaskService>) {
    let mut parent = Agent::builder(model(forks))
        .params(params(history(20)))
        .tools(pool())
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

async fn child_paths(parent: &TaskId, service: &TaskService) -> Vec<Option<PathBuf>> {
    service
        .registry()
        .children(parent)
        .await
        .into_iter()
        .map(|r| r.transcript)
        .collect()
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from} not in {}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// A parent forks one child and is dropped: the directory, the child's transcript and the
/// parent's.
async fn one_child() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path(), 1).await;
    let path = child_paths(parent.id(), &service).await[0].clone().unwrap();
    let parent_path = parent.transcript_path().unwrap().to_path_buf();
    drop(parent);
    (dir, path, parent_path)
}

/// [`transcript::read`], which must answer within 10 s (never wait on a FIFO, nor follow a
/// loop for ever).
async fn read_soon(path: &Path) -> forkhive_spawn::Result<transcript::Transcript> {
    tokio::time::timeout(Duration::from_secs(10), transcript::read(path))
        .await
        .expect("reading a transcript waited or looped")
}

/// The transcript asked for, and its parent's path, as an error names them.
fn both(child: &Path, parent: &Path) -> (String, String) {
    (child.display().to_string(), parent.display().to_string())
}

/// What a child's read says when its parent's transcript cannot be used.
fn unusable(child: &Path, parent: &Path, why: &str) -> String {
    let (c, p) = both(child, parent);
    format!(
        "transcript {c}:1: inherits 42 messages from its parent's transcript, which cannot be \
         used: reading transcript {p}: {why}"
    )
}

/// A count of inherited messages that overflows the next index is an error, not a panic (nor,
/// in a release build, an index that wraps to 0).
#[tokio::test]
async fn a_huge_inherited_count_is_an_error_not_an_overflow() {
    let (_dir, path, _) = one_child().await;
    let max = usize::MAX.to_string();
    edit(
        &path,
        "\"inherited_messages\":42",
        &format!("\"inherited_messages\":{max}"),
    );
    edit(&path, "\"index\":42,", &format!("\"index\":{max},"));
    let bytes = std::fs::read(&path).unwrap();
    let err = transcript::parse(&path, &bytes).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {}:1: the header's `inherited_messages` is out of range",
            path.display()
        )
    );
}

/// An agent that starts with more messages than it inherits (`inherit_transcript(4)` of 6)
/// reads back, its inherited four checked against a fingerprint of their own.
#[tokio::test]
async fn inheriting_fewer_messages_than_the_agent_starts_with_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(forkhive_transport::ScriptedBackend::from_replies([]));
    let parent = Agent::builder(backend.clone())
        .params(params(history(2)))
        .tools(pool())
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let cx = AgentContext::new(
        TaskId::generate(TaskKind::Agent),
        AgentKind::Subagent,
        QuerySource::main(),
    )
    .with_lineage(Some(*parent.id()), 1);
    let child = Agent::builder(backend)
        .params(params(history(3)))
        .tools(pool())
        .context(cx)
        .transcript_dir(dir.path())
        .inherit_transcript(4)
        .build()
        .await
        .unwrap();
    let path = child.transcript_path().unwrap().to_path_buf();
    let t = transcript::read(&path).await.unwrap();
    assert_eq!((t.inherited, t.messages.len()), (4, 6));
    assert_eq!(t.messages, history(3));
    // The parent's four changed: caught.
    let parent_path = parent.transcript_path().unwrap().to_path_buf();
    drop(parent);
    // (Messages the parent started with: its own header's fingerprint no longer matches.)
    edit(&parent_path, "question 1:", "question 9:");
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {}:1: inherits 4 messages from its parent's transcript, which cannot be \
             used: transcript {}:1: the header's model, system prompt, contexts or tools, or the \
             messages the agent started with, are not those its prefix_fingerprint was taken \
             of: the file was changed since it was written",
            path.display(),
            parent_path.display()
        )
    );
}

/// A FIFO at the parent's path is refused at once (opened without blocking), not waited on.
#[cfg(unix)]
#[tokio::test]
async fn a_fifo_in_place_of_the_parent_transcript_is_an_error_not_a_hang() {
    let (_dir, path, parent_path) = one_child().await;
    std::fs::remove_file(&parent_path).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&parent_path)
            .status()
            .unwrap()
            .success()
    );
    let err = read_soon(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        unusable(&path, &parent_path, "not a regular file (a FIFO)")
    );
    // The same for the file asked for, which a resume reads too.
    let err = read_soon(&parent_path).await.unwrap_err();
    assert_eq!(
        forkhive_core::error::chain(&err),
        format!(
            "reading transcript {}: not a regular file (a FIFO)",
            parent_path.display()
        )
    );
}

/// The writer never writes through a symlink, and the reader never reads a parent's
/// transcript through one: a link planted at the parent's path is refused. The file asked
/// for may be a link (the caller chose it).
#[cfg(unix)]
#[tokio::test]
async fn a_symlinked_parent_transcript_is_refused() {
    let (_dir, path, parent_path) = one_child().await;
    let elsewhere = tempfile::tempdir().unwrap();
    let asked = elsewhere.path().join("link.jsonl");
    std::os::unix::fs::symlink(&parent_path, &asked).unwrap();
    assert_eq!(
        transcript::read(&asked).await.unwrap().messages,
        transcript::read(&parent_path).await.unwrap().messages
    );
    let outside = elsewhere.path().join("planted.jsonl");
    std::fs::rename(&parent_path, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &parent_path).unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        unusable(
            &path,
            &parent_path,
            "a symlink: a parent's transcript is read only from a file of its own"
        )
    );
}

/// A missing parent, a directory in its place, or a loop of parents: each is said, through
/// the child that referred to it.
#[tokio::test]
async fn a_missing_parent_a_directory_and_a_loop_are_said_through_the_child() {
    let (_dir, path, parent_path) = one_child().await;
    let (c, p) = both(&path, &parent_path);
    let id = |p: &Path| p.file_stem().unwrap().to_str().unwrap().to_owned();
    let (child_id, parent_id) = (id(&path), id(&parent_path));
    // A loop: the parent made to inherit from the child.
    let kept = std::fs::read(&parent_path).unwrap();
    edit(
        &parent_path,
        "\"parent_id\":null",
        &format!("\"parent_id\":\"{child_id}\",\"inherited_messages\":0"),
    );
    let err = read_soon(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {c}:1: inherits 42 messages from its parent's transcript, which cannot \
             be used: transcript {p}:1: its parents loop: {child_id} → {parent_id} → {child_id}"
        )
    );
    std::fs::write(&parent_path, kept).unwrap();
    assert_eq!(transcript::read(&path).await.unwrap().inherited, 42);
    // Missing.
    std::fs::remove_file(&parent_path).unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        unusable(
            &path,
            &parent_path,
            "No such file or directory (os error 2)"
        )
    );
    // A directory.
    std::fs::create_dir(&parent_path).unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        unusable(&path, &parent_path, "not a regular file (a directory)")
    );
}

/// A parent that went on after the fork leaves the child's prefix as it was; one cut short is
/// an error that says how many it holds.
#[tokio::test]
async fn a_parent_extended_gives_the_same_prefix_and_one_cut_short_is_an_error() {
    let (_dir, path, parent_path) = one_child().await;
    let before = transcript::read(&path).await.unwrap();
    let b = Agent::builder(model(0)).tools(pool());
    let (mut p, _) = Agent::resume(b, &parent_path).await.unwrap();
    assert_eq!(p.run("more talk").await.stop, StopReason::Completed);
    drop(p);
    let after = transcript::read(&path).await.unwrap();
    assert_eq!(after.messages, before.messages);
    // Cut where its run began (its prompt, "fork once"): it keeps the 40 messages it started
    // with, which its own header's fingerprint covers, and no more.
    let text = std::fs::read_to_string(&parent_path).unwrap();
    let run_began = text.find("fork once").unwrap();
    let cut = text[..run_began].rfind('\n').unwrap() + 1;
    std::fs::write(&parent_path, &text[..cut]).unwrap();
    let holds = transcript::read(&parent_path).await.unwrap().messages.len();
    assert_eq!(holds, 40);
    // Cut further, into the messages it started with: its own read says so.
    std::fs::write(&parent_path, &text[..text.len() / 3]).unwrap();
    let err = transcript::read(&parent_path).await.unwrap_err();
    assert!(
        err.to_string().ends_with(
            "holds fewer messages than the agent started with: it was cut before they were all \
             written, or changed since"
        ),
        "{err}"
    );
    std::fs::write(&parent_path, &text[..cut]).unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    let (c, p) = both(&path, &parent_path);
    assert_eq!(
        err.to_string(),
        format!("transcript {c}:1: inherits 42 messages from {p}, which holds {holds}")
    );
}

/// The children of a resumed agent write their transcripts beside its own, as before the
/// resume: a fork child's refers to it, reads back and resumes. A resume's builder that asks
/// for another directory is refused, saying why.
#[tokio::test]
async fn the_children_of_a_resumed_agent_write_beside_its_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path(), 1).await;
    let parent_path = parent.transcript_path().unwrap().to_path_buf();
    let id = *parent.id();
    drop(parent);
    let other = tempfile::tempdir().unwrap();
    let b = Agent::builder(model(1))
        .tools(pool())
        .transcript_dir(other.path());
    let err = Agent::resume(b, &parent_path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid agent configuration: a resumed agent goes on in its transcript's directory \
             {}, and its children write theirs beside it; the builder's transcript_dir {} is \
             another (leave it unset)",
            dir.path().display(),
            other.path().display()
        )
    );
    let b = Agent::builder(model(1))
        .tools(pool())
        .transcript_dir(dir.path())
        .extension(Arc::clone(&service));
    let (mut p, r) = Agent::resume(b, &parent_path).await.unwrap();
    assert_eq!(p.run("fork again").await.stop, StopReason::Completed);
    service.wait_idle().await;
    let paths = child_paths(&id, &service).await;
    assert_eq!(paths.len(), 2, "{paths:?}");
    drop(p);
    let mut inherited = Vec::new();
    for path in &paths {
        let path = path
            .as_ref()
            .expect("every child of the tree has a transcript");
        assert_eq!(path.parent(), Some(dir.path()));
        let t = transcript::read(path).await.unwrap();
        inherited.push(t.inherited);
        assert_eq!(t.messages.last().unwrap().text(), "fork report");
        let (mut c, r) = Agent::resume(Agent::builder(model(0)).tools(pool()), path)
            .await
            .unwrap();
        assert_eq!(r.messages, t.messages.len());
        assert_eq!(c.run("go on").await.stop, StopReason::Completed);
    }
    // The first child forked from the parent's 42; the second from what the resumed parent
    // had when it forked again: its messages, the new prompt and its call.
    inherited.sort_unstable();
    assert_eq!(inherited, [42, r.messages + 2]);
}

/// A transcript copied away from `<agent id>.jsonl` resumes, but its children write no
/// transcripts: a fork child's reference would name the original, not the copy.
#[tokio::test]
async fn the_children_of_a_renamed_transcript_write_none() {
    let (dir, _, parent_path) = one_child().await;
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&parent_path, &copy).unwrap();
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let b = Agent::builder(model(1))
        .tools(pool())
        .extension(Arc::clone(&service));
    let (mut p, _) = Agent::resume(b, &copy).await.unwrap();
    assert_eq!(p.run("fork again").await.stop, StopReason::Completed);
    service.wait_idle().await;
    assert_eq!(child_paths(p.id(), &service).await, [None]);
}

/// Eight children of one turn, written at once: each reads back with the parent's 42 messages
/// and resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_siblings_read_back_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (parent, service) = forked(dir.path(), 8).await;
    let paths = child_paths(parent.id(), &service).await;
    assert_eq!(paths.len(), 8);
    let parent_path = parent.transcript_path().unwrap().to_path_buf();
    let pt = transcript::read(&parent_path).await.unwrap();
    for p in &paths {
        let t = transcript::read(p.as_ref().unwrap()).await.unwrap();
        assert_eq!(t.inherited, 42);
        assert_eq!(&t.messages[..42], &pt.messages[..42]);
    }
    drop(parent);
    for p in &paths {
        let b = Agent::builder(model(0)).tools(pool());
        let (mut c, r) = Agent::resume(b, p.as_ref().unwrap()).await.unwrap();
        assert_eq!(r.messages, 44);
        assert_eq!(c.run("go on").await.stop, StopReason::Completed);
    }
}
