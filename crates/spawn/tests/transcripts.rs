//! Transcripts: written as the agent goes, read back byte for byte, resumed onto the cache the
//! agent left; a crash-cut last line is dropped and reported, other damage names its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use forkhive_core::Message;
use forkhive_spawn::Error;
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::tool::{Tool, ToolPool};
use forkhive_spawn::transcript::{self, DroppedTail};
use forkhive_transport::ScriptedBackend;
use forkhive_transport::simulator::PromptCacheSimulator;
use support::*;

fn look() -> Arc<dyn Tool> {
    TestTool::sleeper("Look", true, 1).arc()
}

async fn first_session(dir: &std::path::Path) -> (Agent, std::path::PathBuf) {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("t1", "Look", r#"{ "spaced" :  1.50 }"#)])),
        Ok(say("first answer")),
    ]));
    let mut agent = Agent::builder(backend)
        .model("claude-sonnet-4-5")
        .system_prompt("You keep notes.")
        .tools(ToolPool::new([look()]).unwrap())
        .transcript_dir(dir)
        .build()
        .await
        .unwrap();
    let run = agent.run("take a look").await;
    assert_eq!(run.stop, StopReason::Completed);
    let path = agent.transcript_path().unwrap().to_path_buf();
    (agent, path)
}

#[tokio::test]
async fn a_transcript_reads_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    assert_eq!(path, dir.path().join(format!("{}.jsonl", agent.id())));
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.header.agent_id, agent.id().to_string());
    assert_eq!(t.header.kind.as_str(), "main");
    assert_eq!(t.header.model, "claude-sonnet-4-5");
    assert_eq!(t.messages.len(), 4);
    assert_eq!(t.turns.len(), 2);
    assert_eq!(t.stops.len(), 1);
    assert!(t.dropped.is_none());
    // The tool input keeps its exact bytes, so the rebuilt prefix is the same prefix.
    let input = t.messages[1]
        .tool_uses()
        .next()
        .unwrap()
        .2
        .as_str()
        .to_owned();
    assert_eq!(input, r#"{ "spaced" :  1.50 }"#);
    assert_eq!(t.params().fingerprint(), agent.params().fingerprint());
    let text = std::fs::read_to_string(&path).unwrap();
    let kinds: Vec<&str> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            match v["type"].as_str().unwrap() {
                "header" => "header",
                "message" => "message",
                "usage" => "usage",
                "stop" => "stop",
                _ => "?",
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "header", "message", "usage", "message", "message", "usage", "message", "stop"
        ]
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}

#[tokio::test]
async fn a_resumed_agent_reads_the_cache_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(PromptCacheSimulator::anthropic(
        ScriptedBackend::from_replies([
            Ok(calls(&[("t1", "Look", "{}")])),
            Ok(say(&"a long first answer. ".repeat(300))),
            Ok(say("second answer")),
        ]),
    ));
    let system = "You keep careful notes. ".repeat(400);
    let mut agent = Agent::builder(backend.clone())
        .model("claude-sonnet-4-5")
        .system_prompt(system)
        .tools(ToolPool::new([look()]).unwrap())
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let _ = agent.run("take a look").await;
    let before = agent.params().fingerprint().clone();
    let path = agent.transcript_path().unwrap().to_path_buf();
    drop(agent);

    let builder = Agent::builder(backend.clone()).tools(ToolPool::new([look()]).unwrap());
    let (mut resumed, report) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(report.messages, 4);
    assert_eq!(report.turns, 2);
    assert_eq!(report.dropped, None);
    assert_eq!(resumed.params().fingerprint(), &before);
    assert_eq!(resumed.turns(), 2);
    let run = resumed.run("and now?").await;
    assert_eq!(run.stop, StopReason::Completed);
    let reports = backend.reports();
    let last = reports.last().unwrap();
    let previous_input = reports[reports.len() - 2].total_input_tokens;
    assert!(
        last.cache_read_tokens * 100 >= previous_input * 95,
        "resumed request read {} of the previous {} input tokens from the cache",
        last.cache_read_tokens,
        previous_input
    );
    // The file goes on: the resumed run's records follow the first session's.
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.messages.len(), 6);
    assert_eq!(t.stops.len(), 2);
}

#[tokio::test]
async fn a_crash_cut_last_line_is_dropped_reported_and_cut_before_appending() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = first_session(dir.path()).await;
    let full = std::fs::read(&path).unwrap();
    // Cut the file in the middle of its last record (the stop record).
    let last_start = full[..full.len() - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    let cut = last_start + 7;
    std::fs::write(&path, &full[..cut]).unwrap();

    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.dropped, Some(DroppedTail { line: 8, bytes: 7 }));
    assert_eq!(t.messages.len(), 4);

    let backend = Arc::new(ScriptedBackend::from_texts(["after the crash"]));
    let builder = Agent::builder(backend).tools(ToolPool::new([look()]).unwrap());
    let (mut agent, report) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(report.dropped, Some(DroppedTail { line: 8, bytes: 7 }));
    assert_eq!(agent.run("go on").await.final_text, "after the crash");
    let again = transcript::read(&path).await.unwrap();
    assert_eq!(
        again.dropped, None,
        "the cut tail was removed before appending"
    );
    assert_eq!(again.messages.len(), 6);
    assert_eq!(
        again.messages[5],
        Message::assistant_text("after the crash")
    );
}

/// The error reading a damaged copy of a first session's transcript, and the copy's path; the
/// directory is removed when the returned guard drops.
async fn damaged(
    edit: impl FnOnce(&mut Vec<String>),
) -> (String, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = first_session(dir.path()).await;
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    edit(&mut lines);
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, lines.join("\n") + "\n").unwrap();
    let err = transcript::read(&bad).await.unwrap_err();
    assert!(matches!(err, Error::Transcript { .. }));
    (err.to_string(), bad, dir)
}

#[tokio::test]
async fn other_damage_is_an_error_naming_the_line() {
    let (e, p, _dir) = damaged(|l| l[2] = "{not json".into()).await;
    assert_eq!(
        e,
        format!(
            "transcript {}:3: not a JSON record: key must be a string at line 1 column 2",
            p.display()
        )
    );
    let (e, p, _dir) = damaged(|l| {
        l.remove(3);
    })
    .await;
    assert_eq!(
        e,
        format!(
            "transcript {}:4: message index 2 where 1 was expected: records are missing or \
             repeated",
            p.display()
        )
    );
    let (e, p, _dir) = damaged(|l| {
        l.remove(0);
    })
    .await;
    assert_eq!(
        e,
        format!(
            "transcript {}:1: the first record must be the header, found `message`",
            p.display()
        )
    );
    let (e, p, _dir) = damaged(|l| l[0] = l[0].replace("\"version\":1", "\"version\":9")).await;
    assert_eq!(
        e,
        format!(
            "transcript {}:1: transcript version 9 is not supported (this build reads version 1)",
            p.display()
        )
    );
    let (e, p, _dir) = damaged(|l| l[2] = r#"{"type":"mystery"}"#.into()).await;
    assert_eq!(
        e,
        format!(
            "transcript {}:3: unknown record type `mystery`",
            p.display()
        )
    );
}

#[cfg(unix)]
#[tokio::test]
async fn a_planted_symlink_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("precious.txt");
    std::fs::write(&target, "keep me").unwrap();
    let id = forkhive_core::TaskId::generate(forkhive_core::TaskKind::Agent);
    let link = dir.path().join(format!("{id}.jsonl"));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Agent::builder(Arc::new(ScriptedBackend::from_texts(["x"])))
        .model("m")
        .context(forkhive_spawn::runtime::AgentContext::new(
            id,
            forkhive_spawn::runtime::AgentKind::Main,
            forkhive_spawn::runtime::QuerySource::main(),
        ))
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("creating transcript {}", link.display())
    );
    let Error::Io { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
}

#[tokio::test]
async fn a_crash_mid_tool_round_is_answered_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = first_session(dir.path()).await;
    // Keep the header, the user message, the usage record and the assistant's tool call.
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text.lines().take(4).collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();

    let backend = Arc::new(ScriptedBackend::from_texts(["recovered"]));
    let builder = Agent::builder(backend.clone()).tools(ToolPool::new([look()]).unwrap());
    let (mut agent, report) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(report.interrupted_calls, 1);
    assert_eq!(agent.run("go on").await.final_text, "recovered");
    let msgs = backend.requests()[0].all_messages();
    match &msgs[2].content[0] {
        forkhive_core::ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            assert_eq!(tool_use_id, "t1");
            assert!(is_error);
            assert_eq!(
                content.text(),
                "the call to `Look` was interrupted: the agent stopped before it finished, and was \
                 resumed from its transcript; check its effects and call it again if needed"
            );
        }
        other => panic!("{other:?}"),
    }
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(
        t.messages.len(),
        5,
        "the answered results are in the transcript"
    );
}

#[tokio::test]
async fn a_resumed_agent_keeps_its_definitions_restrictions() {
    use forkhive_spawn::definition::{AgentDefinition, DefinitionSource, PermissionMode};
    let dir = tempfile::tempdir().unwrap();
    let mut def = AgentDefinition::new("planner", "plans", DefinitionSource::Project);
    def.system_prompt = "You plan.".into();
    def.permission_mode = Some(PermissionMode::Plan);
    def.max_turns = Some(7);
    def.disallowed_tools = Some(vec!["Danger".into()]);
    let danger = || {
        TestTool::new("Danger", OBJECT, false, |_, _| async {
            forkhive_spawn::tool::ToolOutput::text("boom")
        })
        .read_only(false)
        .arc()
    };
    let mut agent = Agent::builder(Arc::new(ScriptedBackend::from_texts(["planned"])))
        .model("m")
        .definition(def)
        .tools(ToolPool::new([look(), danger()]).unwrap())
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let _ = agent.run("plan").await;
    let path = agent.transcript_path().unwrap().to_path_buf();
    drop(agent);
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.header.permission_mode.as_deref(), Some("plan"));
    assert_eq!(t.header.max_turns, Some(7));

    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("d", "Danger", "{}")])),
        Ok(say("ok")),
    ]));
    let builder = Agent::builder(backend.clone()).tools(ToolPool::new([look(), danger()]).unwrap());
    let (mut resumed, _) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(
        resumed.tools().names(),
        ["Look"],
        "the disallowed tool stays out"
    );
    let _ = resumed.run("now break something").await;
    assert_eq!(
        results(&backend.requests()[1])[0].1,
        "unknown tool `Danger`; available tools: Look"
    );
}

/// A message with a receipt is answered `true` only once the transcript holds it (what a
/// networked notification queue acknowledges on), and `false` when the agent drops it unread.
#[tokio::test]
async fn a_receipt_is_answered_after_the_transcript_holds_the_message() {
    use forkhive_spawn::runtime::PendingMessage;
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(say("first")),
        Ok(say("second")),
    ]));
    let mut agent = Agent::builder(backend)
        .model("m")
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let path = dir.path().join(format!("{}.jsonl", agent.id()));
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    agent.pending().push(
        PendingMessage::new("<note>a marker 7f3a</note>", "host").with_receipt(move |recorded| {
            let on_disk = std::fs::read_to_string(&p).unwrap_or_default();
            let _ = tx.send((recorded, on_disk.contains("a marker 7f3a")));
        }),
    );
    assert_eq!(agent.run("hello").await.stop, StopReason::Completed);
    assert_eq!(rx.try_recv().unwrap(), (true, true));
    // Dropped unread: answered false.
    let (tx, rx) = std::sync::mpsc::channel();
    agent.pending().push(
        PendingMessage::new("never read", "host").with_receipt(move |recorded| {
            let _ = tx.send(recorded);
        }),
    );
    drop(agent);
    assert!(!rx.try_recv().unwrap());
}

/// A resumed agent reads how its last answer ended: after a finished answer `continue_run`
/// sends nothing until a message comes (nothing queued or promised: it completes at once);
/// after an answer cut at `max_tokens` it sends the conversation again, to be continued.
#[tokio::test]
async fn a_resumed_agent_continues_after_its_last_answer_as_it_ended() {
    use forkhive_core::Usage;
    use forkhive_spawn::runtime::Limits;
    use forkhive_transport::{ModelStop, Response};
    for (stop, requests_after) in [(ModelStop::EndTurn, 1), (ModelStop::MaxTokens, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(Response {
                stop_reason: Some(stop.clone()),
                ..Response::text("the answer", Usage::default())
            }),
            Ok(Response::text("more", Usage::default())),
        ]));
        let mut agent = Agent::builder(backend.clone())
            .model("m")
            .limits(Limits::default().with_max_continuations(0))
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let _ = agent.run("go").await;
        let path = agent.transcript_path().unwrap().to_path_buf();
        drop(agent);
        let (mut resumed, _) = Agent::resume(Agent::builder(backend.clone()), &path)
            .await
            .unwrap();
        let run = resumed.continue_run().await;
        assert_eq!(run.stop, StopReason::Completed, "{stop:?}");
        assert_eq!(backend.requests().len(), requests_after, "{stop:?}");
    }
}

/// Writes `text` as a message whose future is dropped after one poll, then one more message,
/// and checks the transcript reads back both, in order, after what it held.
async fn drop_one_write_then_write_another(text: &str) {
    use futures::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    // Its writer holds the file for as long as it lives.
    drop(agent);
    let before = transcript::read(&path).await.unwrap();
    let mut w = transcript::TranscriptWriter::reopen(&before).await.unwrap();
    // One poll hands the record to the journal; its write may still be pending when it is
    // dropped (or the journal may have finished the write first: the same outcome).
    let _ = w.message(&Message::user_text(text)).now_or_never();
    w.message(&Message::user_text("written after"))
        .await
        .unwrap();
    drop(w);
    let after = transcript::read(&path).await.unwrap();
    let n = before.messages.len();
    assert_eq!(after.messages.len(), n + 2, "{:?}", after.dropped);
    assert_eq!(after.messages[n].text(), text);
    assert_eq!(after.messages[n + 1].text(), "written after");
}

/// A message write whose future is dropped once the record is handed to the file (as when
/// the agent's future is dropped mid-push) still writes it, and the next message gets the
/// next index: the transcript stays readable, both messages in order.
#[tokio::test]
async fn a_message_write_dropped_mid_flush_keeps_the_indexes_in_order() {
    drop_one_write_then_write_another("dropped mid-flush").await;
}

/// A long record (3 MiB) is handed over whole: dropped after one poll, it is still written in
/// one piece, and the next record starts a line of its own.
#[tokio::test]
async fn a_long_record_dropped_mid_write_is_written_whole() {
    drop_one_write_then_write_another(&"y".repeat(3 << 20)).await;
}

/// A writer encodes each record into the buffer its last record came back in: records that
/// shrink, grow past the largest buffer it keeps (16 KiB) and shrink again each read back as
/// written, with nothing of a longer record before them left in a shorter one.
#[tokio::test]
async fn records_of_any_size_in_turn_read_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    // Its writer holds the file's lock while it lives.
    drop(agent);
    let mut t = transcript::read(&path).await.unwrap();
    let before = t.messages.len();
    let mut w = transcript::TranscriptWriter::reopen(&t).await.unwrap();
    let texts = [
        "a".repeat(5_000),
        "b".to_owned(),
        "c".repeat(40_000),
        "d".repeat(3),
        "e".repeat(16_000),
        "f".to_owned(),
    ];
    for text in &texts {
        w.message(&Message::user_text(text.as_str())).await.unwrap();
        // What the writer keeps of a record is not in its `Debug`.
        let shown = format!("{w:?}");
        assert!(shown.len() < 1_000, "{shown}");
    }
    drop(w);
    t = transcript::read(&path).await.unwrap();
    assert!(t.dropped.is_none());
    let got: Vec<String> = t.messages[before..].iter().map(Message::text).collect();
    assert_eq!(got, texts);
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(file.ends_with("\n"), "every record ends its line");
    let tail: Vec<&str> = file.lines().rev().take(texts.len()).collect();
    for (line, text) in tail.iter().rev().zip(&texts) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["message"]["content"][0]["text"], text.as_str());
    }
}

/// A writer on a full device (`/dev/full`) holding a message whose write was handed over and
/// is still running, its future dropped; and the index that message took. `None` where the
/// system has no `/dev/full`.
async fn a_failing_write_handed_over() -> Option<(transcript::TranscriptWriter, usize)> {
    use futures::FutureExt;
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("skipped: this system has no /dev/full");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_agent, path) = first_session(dir.path()).await;
    let mut full = transcript::read(&path).await.unwrap();
    full.path = "/dev/full".into();
    let mut w = transcript::TranscriptWriter::reopen(&full).await.unwrap();
    let n = full.messages.len();
    assert_eq!(w.next_index(), n);
    // The journal may finish the write before the outcome is first polled: then the
    // write failed within the poll and gave its index back (the poll may end while the
    // failed record is being cut off). Tried again until one is still running after a poll.
    for _ in 0..1000 {
        let r = w
            .message(&Message::user_text("handed, then failed"))
            .now_or_never();
        if r.is_none() && w.next_index() == n + 1 {
            return Some((w, n));
        }
        assert!(r.is_none_or(|r| r.is_err()));
        assert_eq!(w.next_index(), n);
        // Let the journal finish cutting the failed try off (on the blocking pool) first.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("no write was still running after one poll in 1,000 tries");
}

fn is_enospc(err: &Error) -> bool {
    matches!(err, Error::Io { action: "appending to transcript", source, .. }
        if source.raw_os_error() == Some(28))
}

/// A message whose write was handed over, its future dropped, and which then failed (the
/// device is full) gives its index back: the next write reports the failure, and the one
/// after takes the same index, so no index is skipped.
#[tokio::test]
async fn a_dropped_write_that_fails_gives_its_index_back() {
    let Some((mut w, n)) = a_failing_write_handed_over().await else {
        return;
    };
    assert_eq!(w.next_index(), n + 1, "taken once handed over");
    let err = w
        .message(&Message::user_text("after it"))
        .await
        .unwrap_err();
    assert!(is_enospc(&err), "{err:?}");
    assert_eq!(w.next_index(), n, "both indexes given back");
    let err = w.message(&Message::user_text("again")).await.unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_eq!(w.next_index(), n);
}

/// `confirm` waits for a dropped write's outcome without writing anything: a failed one is
/// reported and gives its index back (what an agent checks before it takes a dropped run's
/// messages into its conversation); with nothing pending it answers `Ok`.
#[tokio::test]
async fn confirm_reports_a_dropped_write_that_failed() {
    let Some((mut w, n)) = a_failing_write_handed_over().await else {
        return;
    };
    let err = w.confirm().await.unwrap_err();
    assert!(is_enospc(&err), "{err:?}");
    assert_eq!(w.next_index(), n, "its index given back");
    w.confirm().await.unwrap();
    assert_eq!(w.next_index(), n);
}

/// Waits until no writer holds the transcript at `path` (takes its lock, then lets it go),
/// leaving the file as it is. Elsewhere than Unix no lock is taken: a pause instead.
async fn wait_for_the_writer(path: &std::path::Path) {
    #[cfg(unix)]
    {
        let file = std::fs::File::open(path).unwrap();
        for _ in 0..5000 {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return,
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Err(e) => panic!("locking {}: {e}", path.display()),
            }
        }
        panic!("the writer of {} never let it go", path.display());
    }
    #[cfg(not(unix))]
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// A run dropped at any point — a host's timeout, a `select!` — leaves the agent's
/// conversation holding what its transcript holds: a message whose write was handed to the
/// file before the drop is in both, its receipt answered `true`; one not handed is in
/// neither, its receipt answered `false` (or, not taken yet, still queued). Whatever comes
/// next — another run, `continue_run`, `settle`, or dropping the agent — starts from there: no message
/// recorded twice, every call answered once, no request that ends with the agent's own
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_at_any_point_leaves_the_conversation_as_its_transcript() {
    use forkhive_core::{ContentBlock, Role};
    use forkhive_spawn::runtime::PendingMessage;
    use std::collections::HashMap;
    use std::sync::Mutex;
    let letter = "a letter from the lead";
    // Drops that left a message in the file but not yet in the conversation: the state the
    // agent must settle.
    let mut in_flight_seen = 0;
    for polls in 1..=60 {
        for next in ["run", "continue_run", "settle", "drop"] {
            let dir = tempfile::tempdir().unwrap();
            let backend = Arc::new(ScriptedBackend::from_replies([
                Ok(calls(&[("t1", "Look", "{}")])),
                Ok(say("first answer")),
                Ok(say("second answer")),
                Ok(say("third answer")),
            ]));
            let mut agent = Agent::builder(backend.clone())
                .model("m")
                .tools(ToolPool::new([look()]).unwrap())
                .transcript_dir(dir.path())
                .build()
                .await
                .unwrap();
            let path = agent.transcript_path().unwrap().to_path_buf();
            // Queued before the run (taken with its prompt), or once it has started (taken
            // into the message after the tool round).
            let answered: Arc<Mutex<Vec<bool>>> = Arc::default();
            let a = Arc::clone(&answered);
            let queue = agent.pending();
            let mut to_send = Some(
                PendingMessage::new(letter, "lead")
                    .with_receipt(move |ok| a.lock().unwrap().push(ok)),
            );
            if polls % 2 == 0 {
                queue.push(to_send.take().unwrap());
            }
            let mut finished = false;
            {
                let mut run = std::pin::pin!(agent.run("take a look"));
                for _ in 0..polls {
                    let ready = futures::poll!(run.as_mut()).is_ready();
                    if let Some(l) = to_send.take() {
                        queue.push(l);
                    }
                    if ready {
                        finished = true;
                        break;
                    }
                    // Lets the journal move on, so drops land at different points.
                    tokio::task::yield_now().await;
                }
            }
            if !finished {
                // Give the journal time to finish what it was handed.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let file = transcript::read(&path).await.unwrap().messages.len();
                in_flight_seen += usize::from(file > agent.params().messages().len());
            }
            let live = match next {
                "run" => {
                    let run = agent.run("go on").await;
                    assert_eq!(run.stop, StopReason::Completed, "run after {polls} polls");
                    Some(agent.params().messages().to_vec())
                }
                "continue_run" => {
                    let run = agent.continue_run().await;
                    assert_eq!(
                        run.stop,
                        StopReason::Completed,
                        "continue_run after {polls} polls"
                    );
                    Some(agent.params().messages().to_vec())
                }
                "settle" => {
                    agent.settle().await;
                    Some(agent.params().messages().to_vec())
                }
                _ => {
                    drop(agent);
                    // A write still unconfirmed is finished by a task that took the writer
                    // over and answers the receipts: it lets the file's lock go after that.
                    wait_for_the_writer(&path).await;
                    None
                }
            };
            let at = format!("{next} after {polls} polls");
            let recorded = transcript::read(&path).await.unwrap();
            assert!(recorded.dropped.is_none(), "{at}");
            if let Some(live) = &live {
                assert_eq!(recorded.messages, *live, "{at}");
            }
            let letters = recorded
                .messages
                .iter()
                .filter(|m| m.text().contains(letter))
                .count();
            let answers = answered.lock().unwrap().clone();
            match (next, answers.as_slice()) {
                // Recorded exactly when its receipt says so.
                (_, [true]) => assert_eq!(letters, 1, "{at}"),
                (_, [false]) => assert_eq!(letters, 0, "{at}"),
                // Never taken: still queued when the agent was dropped (its receipt then
                // says `false` when the queue goes), or when it settled without running.
                ("drop" | "settle", []) => assert_eq!(letters, 0, "{at}"),
                (_, other) => panic!("{at}: receipt answered {other:?}, {letters} recorded"),
            }
            // Every call has exactly one result.
            let mut results: HashMap<String, usize> = HashMap::new();
            for m in &recorded.messages {
                for b in &m.content {
                    match b {
                        ContentBlock::ToolUse { id, .. } => {
                            results.entry(id.to_string()).or_default();
                        }
                        ContentBlock::ToolResult { tool_use_id, .. } => {
                            *results.entry(tool_use_id.to_string()).or_default() += 1;
                        }
                        _ => {}
                    }
                }
            }
            if next == "run" || next == "continue_run" {
                assert!(results.values().all(|n| *n == 1), "{at}: {results:?}");
            } else {
                assert!(results.values().all(|n| *n <= 1), "{at}: {results:?}");
            }
            // No request continued the agent's own finished answer (a prefill).
            for r in backend.requests() {
                let last = r.prefix.messages().last().map(|m| m.role);
                let last = r.suffix.messages().last().map(|m| m.role).or(last);
                assert_ne!(last, Some(Role::Assistant), "{at}");
            }
        }
    }
    assert!(
        in_flight_seen > 0,
        "no drop left a recorded message outside the conversation"
    );
}

/// Whether the file at `path` holds `text` within 20 ms (looked at every millisecond).
async fn file_shows(path: &std::path::Path, text: &str) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
    loop {
        if std::fs::read_to_string(path).is_ok_and(|f| f.contains(text)) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// A run dropped while its final answer was being recorded: `continue_run` finds the
/// conversation ending with that answer (as the transcript does) and waits, as a resumed agent
/// would, instead of sending the answer back to the model to continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_run_after_a_run_dropped_mid_answer_waits() {
    use forkhive_core::Role;
    let mut answer_in_flight = 0;
    // Forty drop points, then (odd ones only) more until one has left the answer in flight:
    // on an idle machine a write can land within the very poll that hands it over, so a
    // given try reaches that state only sometimes.
    let mut polls = 0;
    while polls < 40 || (answer_in_flight == 0 && polls < 1_000) {
        polls += if polls <= 40 { 1 } else { 2 };
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(say("first answer")),
            Ok(say("second answer")),
        ]));
        let mut agent = Agent::builder(backend.clone())
            .model("m")
            .transcript_dir(dir.path())
            .build()
            .await
            .unwrap();
        let path = agent.transcript_path().unwrap().to_path_buf();
        {
            let mut run = std::pin::pin!(agent.run("answer once"));
            // Even cases drop the run after `polls` polls. Odd ones, once the model has
            // answered, give the run's pending write a moment to land between polls without
            // polling it, and drop the run when the answer is in the file: the run, waiting on
            // that write, has not taken the answer into the conversation, and not polled it
            // cannot move past that state (a busy machine reaches it most often; on an idle
            // one the write may land within the poll that hands it over).
            let most = if polls % 2 == 1 { 400 } else { polls };
            for _ in 0..most {
                if futures::poll!(run.as_mut()).is_ready() {
                    break;
                }
                if polls % 2 == 1
                    && !backend.requests().is_empty()
                    && file_shows(&path, "first answer").await
                {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let file = transcript::read(&path).await.unwrap().messages;
        answer_in_flight += usize::from(
            file.len() > agent.params().messages().len()
                && file.last().is_some_and(|m| m.role == Role::Assistant),
        );
        let run = agent.continue_run().await;
        assert_eq!(run.stop, StopReason::Completed, "after {polls} polls");
        let recorded = transcript::read(&path).await.unwrap();
        assert_eq!(
            recorded.messages,
            agent.params().messages().to_vec(),
            "after {polls} polls"
        );
        for r in backend.requests() {
            let last = r.prefix.messages().last().map(|m| m.role);
            let last = r.suffix.messages().last().map(|m| m.role).or(last);
            assert_ne!(last, Some(Role::Assistant), "after {polls} polls");
        }
    }
    assert!(
        answer_in_flight > 0,
        "no drop left the answer in the file but not in the conversation"
    );
}

/// Resuming reads under the file's lock, which a transcript writer keeps until its last write
/// is finished: a dropped agent whose write is still running (stood in for here by a handle
/// holding the lock, which writes that record and lets go) is waited for, so the resumed agent
/// has the record and its next message takes the next index. Read before the write landed,
/// the record would be missing and the next message would repeat its index.
#[cfg(unix)]
#[tokio::test]
async fn resuming_waits_for_the_last_write_of_a_dropped_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    drop(agent);
    let n = transcript::read(&path).await.unwrap().messages.len();
    let held = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let resume = tokio::spawn({
        let path = path.clone();
        async move {
            let backend = Arc::new(ScriptedBackend::from_texts(["after the late one"]));
            let builder = Agent::builder(backend).tools(ToolPool::new([look()]).unwrap());
            Agent::resume(builder, &path).await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !resume.is_finished(),
        "resumed while a writer held the file"
    );
    // The dropped writer's record lands, then its handle goes.
    let late = Message::user_text("the late record");
    let line = serde_json::json!({"type": "message", "index": n, "message": late, "at": 0});
    let mut held = held;
    std::io::Write::write_all(&mut held, format!("{line}\n").as_bytes()).unwrap();
    drop(held);
    let (mut resumed, report) = resume.await.unwrap().unwrap();
    assert_eq!(report.messages, n + 1);
    assert_eq!(resumed.params().messages()[n].text(), "the late record");
    assert_eq!(resumed.run("go on").await.stop, StopReason::Completed);
    drop(resumed);
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(
        t.messages.len(),
        n + 3,
        "the late record, the prompt, the answer"
    );
    assert_eq!(t.messages[n + 1].text(), "go on");
}

/// The transcript of an agent that is still alive is refused after the wait, naming the file:
/// two writers would repeat each other's indexes. Once the agent is dropped it resumes.
#[cfg(unix)]
#[tokio::test(start_paused = true)]
async fn resuming_the_transcript_of_a_live_agent_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    let resume = || {
        let backend = Arc::new(ScriptedBackend::from_texts(["again"]));
        Agent::resume(
            Agent::builder(backend).tools(ToolPool::new([look()]).unwrap()),
            &path,
        )
    };
    let err = resume().await.unwrap_err();
    match &err {
        Error::TranscriptBusy { path: p, waited } => {
            assert_eq!(p, &path);
            assert!(*waited >= transcript::WRITER_WAIT, "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().starts_with(&format!(
            "transcript {} is held by another writer (still held after",
            path.display()
        )),
        "{err}"
    );
    // Nothing was written meanwhile, and the agent goes on as before.
    let before = transcript::read(&path).await.unwrap().messages.len();
    assert_eq!(agent.params().messages().len(), before);
    drop(agent);
    let (_resumed, report) = resume().await.unwrap();
    assert_eq!(report.messages, before);
}

/// `reopen` of a transcript that another writer appended to since it was read is refused: the
/// records this writer would add would repeat the indexes of those it did not read.
#[tokio::test]
async fn reopening_a_transcript_changed_since_it_was_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    drop(agent);
    let stale = transcript::read(&path).await.unwrap();
    let backend = Arc::new(ScriptedBackend::from_texts(["more"]));
    let builder = Agent::builder(backend).tools(ToolPool::new([look()]).unwrap());
    let (mut resumed, _) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(
        resumed.run("more, please").await.stop,
        StopReason::Completed
    );
    drop(resumed);
    let now = std::fs::metadata(&path).unwrap().len();
    let err = transcript::TranscriptWriter::reopen(&stale)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::TranscriptChanged { path: p, read, now: n }
            if *p == path && *read == stale.valid_len && *n == now),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "transcript {} changed since it was read ({} bytes then, {now} now): read it again \
             before appending",
            path.display(),
            stale.valid_len
        )
    );
    // Read again, it reopens.
    let fresh = transcript::read(&path).await.unwrap();
    let w = transcript::TranscriptWriter::reopen(&fresh).await.unwrap();
    assert_eq!(w.next_index(), stale.messages.len() + 2);
}

/// A supervisor's stop record for an agent that could not write its own waits for the agent's
/// writer to let the file go, so it lands after the last record that writer was handed (it
/// would otherwise cut a line still being written, which then lands after the stop).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisors_stop_record_waits_for_the_agents_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    let stop = tokio::spawn({
        let path = path.clone();
        async move { transcript::append_stop(&path, &StopReason::Cancelled, Default::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !stop.is_finished(),
        "appended while the agent's writer held the file"
    );
    drop(agent);
    stop.await.unwrap().unwrap();
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(t.dropped, None);
    assert_eq!(
        t.stops.iter().map(|s| s.stop.clone()).collect::<Vec<_>>(),
        [StopReason::Completed, StopReason::Cancelled]
    );
}

/// A resume that refuses the transcript's header leaves the file as it was, a last line cut by
/// a crash included: only a transcript that will be appended to is cut.
#[tokio::test]
async fn a_refused_resume_leaves_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    let id = agent.id().to_string();
    drop(agent);
    let text = std::fs::read_to_string(&path).unwrap();
    let damaged = text.replacen(
        &format!("\"agent_id\":\"{id}\""),
        "\"agent_id\":\"nobody\"",
        1,
    ) + "{\"type\":\"mess";
    assert_ne!(damaged.len(), text.len() + 15, "the header was changed");
    std::fs::write(&path, &damaged).unwrap();
    let backend = Arc::new(ScriptedBackend::from_texts(["never"]));
    let err = Agent::resume(Agent::builder(backend), &path)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Transcript { line: 1, message, .. } if message.starts_with("bad agent_id")),
        "{err:?}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), damaged);
}

/// On the thread of a current-thread runtime, the blocking stop record tries the lock once:
/// the writer holding it may be a task of that runtime, which cannot run while the thread
/// waits. A live agent's transcript is refused at once, and left as it was.
#[cfg(unix)]
#[tokio::test]
async fn a_blocking_stop_record_on_the_runtimes_only_thread_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    let before = std::fs::read(&path).unwrap();
    let err = transcript::append_stop_blocking(&path, &StopReason::Cancelled, Default::default())
        .unwrap_err();
    assert!(
        matches!(&err, Error::TranscriptBusy { path: p, waited } if *p == path && waited.is_zero()),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
    drop(agent);
    transcript::append_stop_blocking(&path, &StopReason::Cancelled, Default::default()).unwrap();
    let t = transcript::read(&path).await.unwrap();
    assert_eq!(
        t.stops.last().map(|s| s.stop.clone()),
        Some(StopReason::Cancelled)
    );
}

/// A resume builder's model, system prompt and tool definitions are not used — the
/// transcript's are, so the cache the agent left is read — and each one that differs is a
/// warning naming the transcript, not a silent override; the same settings are none. A tool the transcript offered that the builder lacks is an error saying so.
#[tokio::test]
async fn what_a_resume_builder_sets_that_the_transcript_overrides_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    let sent = agent.params().clone();
    drop(agent);
    let shown = path.display();

    let lacking = Agent::builder(Arc::new(ScriptedBackend::from_texts(["again"]))).model("m");
    let err = Agent::resume(lacking, &path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid agent configuration: resuming {shown}: its transcript offered the model \
             tool `Look`, which the builder's tools lack; give the builder the tools the agent \
             had (the model may call any of them)"
        )
    );

    let redescribed = TestTool::new(
        "Look",
        r#"{"type":"object","properties":{"x":{"type":"string"}}}"#,
        true,
        |_, _| async { forkhive_spawn::tool::ToolOutput::text("new code") },
    )
    .arc();
    let events = Arc::new(Events::default());
    let builder = Agent::builder(Arc::new(ScriptedBackend::from_texts(["again"])))
        .model("claude-opus-5")
        .system_prompt("New prompt.")
        .tools(ToolPool::new([redescribed]).unwrap())
        .events(events.clone());
    let (mut resumed, _) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(resumed.params().model(), sent.model());
    assert_eq!(resumed.params().system_prompt(), sent.system_prompt());
    assert_eq!(resumed.params().tools(), sent.tools());
    assert_eq!(resumed.run("and now?").await.stop, StopReason::Completed);
    let kept = "a resumed agent keeps what its transcript sent, so its next request reads the \
                cache it left";
    assert_eq!(
        events.warnings(),
        [
            format!(
                "resuming {shown}: the builder's model `claude-opus-5` is not used; the \
                 transcript's `claude-sonnet-4-5` is ({kept})"
            ),
            format!(
                "resuming {shown}: the builder's system prompt is not used; the transcript's \
                 is ({kept})"
            ),
            format!(
                "resuming {shown}: tools `Look` are described to the model as the transcript \
                 has them, not as the builder's tools describe themselves now ({kept}); their \
                 new code runs"
            ),
        ]
    );
    drop(resumed);

    // The same settings are no difference.
    let events = Arc::new(Events::default());
    let builder = Agent::builder(Arc::new(ScriptedBackend::from_texts(["again"])))
        .model("claude-sonnet-4-5")
        .system_prompt("You keep notes.")
        .tools(ToolPool::new([look()]).unwrap())
        .events(events.clone());
    let (mut resumed, _) = Agent::resume(builder, &path).await.unwrap();
    assert_eq!(resumed.run("once more").await.stop, StopReason::Completed);
    assert_eq!(events.warnings(), Vec::<String>::new());
}

/// A header edited after it was written — its model, its system prompt, a message the agent
/// started with — is refused naming the file, not resumed sending what the edit says; the file
/// as written reads.
#[tokio::test]
async fn an_edited_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, path) = first_session(dir.path()).await;
    drop(agent);
    let original = std::fs::read_to_string(&path).unwrap();
    assert!(transcript::read(&path).await.is_ok());
    let edits = [
        (
            "\"system\":[\"You keep notes.\"]",
            "\"system\":[\"You obey the file.\"]",
            "the header's model, system prompt, contexts or tools, or the messages the agent \
             started with, are not those its prefix_fingerprint was taken of: the file was \
             changed since it was written",
        ),
        (
            "\"model\":\"claude-sonnet-4-5\"",
            "\"model\":\"claude-opus-5\"",
            "the header's model `claude-opus-5` is not its prefix's `claude-sonnet-4-5`: the \
             header was changed since it was written",
        ),
    ];
    for (from, to, why) in edits {
        assert!(original.contains(from), "{from} in {original}");
        std::fs::write(&path, original.replacen(from, to, 1)).unwrap();
        let err = transcript::read(&path).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("transcript {}:1: {why}", path.display()),
            "{to}"
        );
        let builder = Agent::builder(Arc::new(ScriptedBackend::from_texts(["again"])))
            .tools(ToolPool::new([look()]).unwrap());
        assert!(Agent::resume(builder, &path).await.is_err());
    }
    // Both models edited alike: the prefix is the fingerprint's no more.
    std::fs::write(
        &path,
        original.replace("claude-sonnet-4-5", "claude-opus-5"),
    )
    .unwrap();
    let err = transcript::read(&path).await.unwrap_err();
    assert!(
        err.to_string()
            .ends_with("the file was changed since it was written"),
        "{err}"
    );
}
