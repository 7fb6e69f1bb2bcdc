//! The timeline of a run, read from its transcripts: lanes in tree order, a bar per request,
//! marks for spawns, tool calls, notifications, messages and stops; worker text escaped; the
//! same bytes for the same transcripts; and the page rendered by a real headless browser.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::timeline::{MarkKind, Timeline};
use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
use support::*;

/// A parent that starts two background workers (one calls a tool, one is described with
/// markup meant to break the page) and waits for both.
async fn run_tree(dir: &Path) {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        TestTool::sleeper("Look", true, 30).arc() as Arc<dyn Tool>,
    ])
    .unwrap();
    let b = brain(|r| {
        let all = r.all_messages();
        if !is_parent(r) {
            let hostile = all[0].text().contains("hostile");
            return match (hostile, all.len()) {
                (false, 1) => Plan::Reply(calls(&[("l1", "Look", "{}")])),
                (true, _) => Plan::Reply(say("done")),
                _ => Plan::Reply(say("looked")),
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"look","prompt":"look","subagent_type":"worker","run_in_background":true}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"</title></svg><script>alert(1)</script>","prompt":"hostile","subagent_type":"worker","run_in_background":true}"#,
                ),
            ])),
            _ => Plan::Reply(say("both done")),
        }
    });
    let mut p = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .transcript_dir(dir)
        .build()
        .await
        .unwrap();
    let run = p.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
}

#[tokio::test]
async fn a_run_becomes_lanes_in_tree_order_with_bars_and_marks() {
    let dir = tempfile::tempdir().unwrap();
    run_tree(dir.path()).await;
    let t = Timeline::load(dir.path()).await.unwrap();
    assert_eq!(t.lanes.len(), 3);
    assert!(t.skipped.is_empty(), "{:?}", t.skipped);
    let root = &t.lanes[0];
    assert_eq!((root.depth, root.parent.as_deref()), (0, None));
    assert!(
        t.lanes[1..]
            .iter()
            .all(|l| l.depth == 1 && l.parent.as_deref() == Some(root.id.as_str()))
    );
    assert!(
        t.lanes[1].start_ms <= t.lanes[2].start_ms,
        "siblings by start"
    );
    let count = |l: &forkhive_spawn::timeline::Lane, k: MarkKind| {
        l.marks.iter().filter(|m| m.kind == k).count()
    };
    assert_eq!(count(root, MarkKind::Spawn), 2);
    assert_eq!(count(root, MarkKind::Notification), 2);
    assert_eq!(count(root, MarkKind::Stop), 1);
    assert!(root.requests.len() >= 2);
    let looker = t
        .lanes
        .iter()
        .find(|l| l.marks.iter().any(|m| m.kind == MarkKind::ToolCall))
        .unwrap();
    assert!(looker.marks.iter().any(|m| m.detail.starts_with("Look ")));
    for l in &t.lanes {
        for b in &l.requests {
            assert!(t.start_ms <= b.start_ms && b.start_ms <= b.end_ms && b.end_ms <= t.end_ms);
        }
    }
    // Worker text cannot break out of the page.
    let html = t.to_html("a run");
    assert!(!html.contains("<script>alert(1)</script>"));
    assert!(html.contains("&lt;/title&gt;&lt;/svg&gt;&lt;script&gt;alert(1)"));
    assert_eq!(html.matches(r#"<g class="lane""#).count(), 3);
    // Determinism: the same transcripts, the same bytes.
    let again = Timeline::load(dir.path()).await.unwrap();
    assert_eq!(again, t);
    assert_eq!(again.to_html("a run"), html);
}

/// A team's run: lanes carry the names the lead gave (a teammate, a named worker), a team's
/// letters are message marks in the lane that reads them, and a failed run's stop says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn team_letters_names_and_failures_show() {
    use forkhive_spawn::control::SendMessageTool;
    use forkhive_spawn::mailbox::MemoryMailbox;
    use forkhive_spawn::team::Team;
    let dir = tempfile::tempdir().unwrap();
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_teams_enabled(true)
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
    ])
    .unwrap();
    let b = brain(|r| {
        let all = r.all_messages();
        if !is_parent(r) {
            if all[0].text().contains("break") {
                return Plan::Fail("the model is down");
            }
            return match all.len() {
                1 => Plan::Reply(calls(&[(
                    "s1",
                    "SendMessage",
                    r#"{"to":"team-lead","message":"PONG"}"#,
                )])),
                _ => Plan::Reply(say("sent")),
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"ping","prompt":"answer","subagent_type":"worker","name":"tm","team_name":"crew"}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"doomed as task a00000000 runner","prompt":"break","subagent_type":"worker","name":"bad","run_in_background":true}"#,
                ),
            ])),
            3 => Plan::Reply(calls(&[(
                "s2",
                "SendMessage",
                r#"{"to":"tm","message":"one more"}"#,
            )])),
            _ => Plan::Reply(say("noted")),
        }
    });
    let team = Arc::new(Team::new("crew", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    team.shut_down(None).await.unwrap();
    drop(lead);
    let t = Timeline::load(dir.path()).await.unwrap();
    let named = |n: &str| {
        t.lanes
            .iter()
            .find(|l| l.name.as_deref() == Some(n))
            .unwrap_or_else(|| panic!("no lane named {n}: {:?}", t.lanes))
    };
    let (tm, bad) = (named("tm"), named("bad"));
    assert_eq!(t.lanes[0].name, None);
    // The teammate's PONG, its idle notice and its shutdown answer reach the lead as letters.
    let letters = t.lanes[0]
        .marks
        .iter()
        .filter(|m| m.kind == MarkKind::Message)
        .count();
    assert!(letters >= 2, "{:?}", t.lanes[0].marks);
    // The lead's letter reaches the teammate as a letter too.
    assert!(
        tm.marks.iter().any(|m| m.kind == MarkKind::Message),
        "{:?}",
        tm.marks
    );
    let stop = bad.marks.iter().find(|m| m.kind == MarkKind::Stop).unwrap();
    assert!(
        stop.detail.starts_with("failed: ") && stop.detail.contains("the model is down"),
        "{}",
        stop.detail
    );
    let html = t.to_html("a team");
    assert!(
        html.contains(&format!("worker tm {}", tm.id)),
        "the label names it"
    );
}

#[tokio::test]
async fn an_unreadable_transcript_is_listed_not_fatal_and_a_missing_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    run_tree(dir.path()).await;
    std::fs::write(dir.path().join("broken.jsonl"), "{\"type\":\"message\"}\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a transcript").unwrap();
    // A link in the directory to a transcript elsewhere is not followed.
    #[cfg(unix)]
    let elsewhere = {
        let elsewhere = tempfile::tempdir().unwrap();
        let first = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .unwrap();
        let planted = elsewhere.path().join("planted.jsonl");
        std::fs::copy(first, &planted).unwrap();
        std::os::unix::fs::symlink(&planted, dir.path().join("z-link.jsonl")).unwrap();
        elsewhere
    };
    let t = Timeline::load(dir.path()).await.unwrap();
    assert_eq!(t.lanes.len(), 3);
    #[cfg(unix)]
    {
        assert_eq!(t.skipped.len(), 2);
        assert!(t.skipped[1].0.ends_with("z-link.jsonl"));
        assert_eq!(
            t.skipped[1].1,
            "a symlink: a timeline reads only the directory's own files"
        );
        drop(elsewhere);
    }
    #[cfg(not(unix))]
    assert_eq!(t.skipped.len(), 1);
    assert!(t.skipped[0].0.ends_with("broken.jsonl"));
    assert!(
        t.skipped[0]
            .1
            .contains("the first record must be the header, found `message`"),
        "{}",
        t.skipped[0].1
    );
    assert!(
        t.to_html("x")
            .contains("Transcripts that could not be read")
    );
    let missing = dir.path().join("nope");
    let e = Timeline::load(&missing).await.unwrap_err().to_string();
    assert!(e.contains("listing transcripts"), "{e}");
    assert!(e.contains("nope"), "{e}");
}

/// The browser this machine has for rendering checks: `FORKHIVE_CHROMIUM`, else Debian's.
fn chromium() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("FORKHIVE_CHROMIUM") {
        return Some(p.into());
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

/// The page as a real browser lays it out: every lane has a box on screen.
#[tokio::test]
async fn a_headless_browser_renders_every_lane() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but no chromium: .ci/run installs Debian's `chromium` package"
        );
        eprintln!(
            "skipped: no chromium here (install Debian's `chromium`, or set FORKHIVE_CHROMIUM)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    run_tree(dir.path()).await;
    let html = Timeline::load(dir.path())
        .await
        .unwrap()
        .to_html("browser check");
    let page = dir.path().join("run.html");
    std::fs::write(&page, html).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--dump-dom")
            .arg(format!("file://{}", page.display()))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium did not finish in 60 s")
    .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(r#"data-lanes-rendered="3""#),
        "chromium said: {}\n{dom}",
        String::from_utf8_lossy(&out.stderr)
    );
}
