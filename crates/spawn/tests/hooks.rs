//! Hooks with real shell scripts: a blocking one (exit 2), a rewriting one (JSON
//! `updatedInput`), a slow one (past its timeout), one that exits 1 (Claude Code does not block
//! on it), one that prints garbage, a JSON deny, `PostToolUse` context, `UserPromptSubmit`
//! blocking and context, a `Stop` hook that sends the agent on once, a definition's hooks that
//! apply to its agent only, the input a hook reads, the settings format's refusals, and a slow
//! in-process hook that does not eat into the tool's time limit.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use forkhive_spawn::hook::{
    CommandHook, Hook, HookEvent, HookInput, HookOutcome, Hooks, MAX_STOP_BLOCKS,
};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::tool::ToolPool;
use support::*;

/// Writes `body` as an executable script `name` in `dir`, returning its path as a command.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn hooks(list: Vec<Arc<dyn Hook>>) -> Hooks {
    Hooks::of(list)
}

fn pre(matcher: &str, command: &str) -> Arc<dyn Hook> {
    Arc::new(CommandHook::new(HookEvent::PreToolUse, matcher, command).unwrap())
}

/// An agent with a `Write` tool that records what it was called with, and `hooks`.
async fn agent_with(
    b: Arc<Brain>,
    hooks: Hooks,
) -> (
    Agent,
    Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    Arc<Events>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    let write = TestTool::new(
        "Write",
        r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        false,
        move |input, _| {
            let s2 = Arc::clone(&s2);
            async move {
                s2.lock().unwrap().push(input.clone());
                forkhive_spawn::tool::ToolOutput::text(format!("wrote {}", input["path"]))
            }
        },
    )
    .arc();
    let events = Arc::new(Events::default());
    let agent = Agent::builder(b)
        .model("m")
        .tools(ToolPool::new([write]).unwrap())
        .hooks(hooks)
        .events(events.clone())
        .build()
        .await
        .unwrap();
    (agent, seen, events)
}

/// The model writes `secret.txt` once, then answers with what it got back.
fn writer() -> Arc<Brain> {
    brain(|r| {
        if !has_tool_result(r) {
            return Plan::Reply(calls(&[("w1", "Write", r#"{"path":"secret.txt"}"#)]));
        }
        Plan::Reply(say(&results(r)
            .into_iter()
            .map(|(_, t, _)| t)
            .collect::<Vec<_>>()
            .join("|")))
    })
}

/// Hook scripts written for Claude Code find the project through `$CLAUDE_PROJECT_DIR`.
#[tokio::test]
async fn a_hook_command_gets_the_project_directory() {
    let block = "cat > /dev/null; echo \"project: $CLAUDE_PROJECT_DIR\" >&2; exit 2";
    let (mut a, _, _) = agent_with(writer(), hooks(vec![pre("Write", block)])).await;
    let run = a.run("go").await;
    let expected = std::env::var("CLAUDE_PROJECT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::current_dir().unwrap());
    assert_eq!(
        run.final_text,
        format!(
            "a PreToolUse hook blocked `Write`: project: {}",
            expected.display()
        )
    );
}

#[tokio::test]
async fn an_exit_2_hook_blocks_the_call_with_its_standard_error() {
    let dir = tempfile::tempdir().unwrap();
    let block = script(
        dir.path(),
        "block.sh",
        "cat > /dev/null; echo 'secret files are off limits' >&2; exit 2",
    );
    let (mut a, seen, _) = agent_with(writer(), hooks(vec![pre("Write|Edit", &block)])).await;
    let run = a.run("go").await;
    assert_eq!(
        run.final_text,
        "a PreToolUse hook blocked `Write`: secret files are off limits"
    );
    assert!(seen.lock().unwrap().is_empty(), "the tool did not run");
}

#[tokio::test]
async fn a_hook_rewrites_the_input_and_a_bad_rewrite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rewrite = script(
        dir.path(),
        "rewrite.sh",
        r#"cat > /dev/null; echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","updatedInput":{"path":"safe.txt"}}}'"#,
    );
    let (mut a, seen, _) = agent_with(writer(), hooks(vec![pre("Write", &rewrite)])).await;
    let run = a.run("go").await;
    assert_eq!(run.final_text, "wrote \"safe.txt\"");
    assert_eq!(seen.lock().unwrap()[0]["path"], "safe.txt");
    let bad = script(
        dir.path(),
        "bad.sh",
        r#"cat > /dev/null; echo '{"hookSpecificOutput":{"updatedInput":{"file":1}}}'"#,
    );
    let (mut a, seen, _) = agent_with(writer(), hooks(vec![pre("Write", &bad)])).await;
    let run = a.run("go").await;
    assert!(
        run.final_text.starts_with(
            "a PreToolUse hook rewrote the input of `Write` into one that does not match its schema"
        ),
        "{}",
        run.final_text
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_slow_hook_is_stopped_at_its_timeout_and_the_call_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("sleep.pid");
    let slow = script(
        dir.path(),
        "slow.sh",
        &format!("sleep 30 & echo $! > {}; wait", pidfile.display()),
    );
    let hook = CommandHook::new(HookEvent::PreToolUse, "*", &slow)
        .unwrap()
        .with_timeout(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let (mut a, seen, events) = agent_with(writer(), hooks(vec![Arc::new(hook)])).await;
    let run = a.run("go").await;
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(run.final_text, "wrote \"secret.txt\"");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(
        events.warnings(),
        [format!(
            "PreToolUse hook `{slow}` (matcher `*`) did not finish within 300ms; it was stopped and the agent went on"
        )]
    );
    // What the command started was stopped with it, not left to run on.
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
    };
    for _ in 0..100 {
        if gone() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(gone(), "the hook's `sleep` (pid {pid}) still runs");
}

/// A tool's time limit runs from when its `PreToolUse` hooks answered, not from the call's
/// start: a slow hook does not eat into the tool's limit (a 100 s hook, then a 30 s tool under
/// a 60 s limit: timed from the call's start, the tool would be stopped at 60 s).
#[tokio::test(start_paused = true)]
async fn a_tool_is_timed_from_when_its_pre_tool_use_hooks_answer() {
    #[derive(Debug)]
    struct Slow;
    #[async_trait]
    impl Hook for Slow {
        fn matches(&self, event: HookEvent, _: Option<&str>) -> bool {
            event == HookEvent::PreToolUse
        }
        async fn run(&self, _: &HookInput) -> HookOutcome {
            tokio::time::sleep(std::time::Duration::from_secs(100)).await;
            HookOutcome::Continue
        }
    }
    let backend = Arc::new(forkhive_transport::ScriptedBackend::from_replies([
        Ok(calls(&[("t1", "Quick", "{}")])),
        Ok(say("done")),
    ]));
    let mut agent = Agent::builder(backend.clone())
        .model("m")
        .tools(ToolPool::new([TestTool::sleeper("Quick", true, 30_000).arc()]).unwrap())
        .hooks(hooks(vec![Arc::new(Slow)]))
        .limits(
            forkhive_spawn::runtime::Limits::default()
                .with_tool_timeout(std::time::Duration::from_secs(60)),
        )
        .build()
        .await
        .unwrap();
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let got = results(&backend.requests()[1]);
    assert_eq!(
        (got[0].1.as_str(), got[0].2),
        ("Quick {}", false),
        "{got:?}"
    );
}

#[tokio::test]
async fn exit_1_does_not_block_and_garbage_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    // The shape of a corpus agent's hook: it means to block, but exit 1 does not.
    let one = "echo 'Blocked: read-only' && exit 1";
    let garbage = script(
        dir.path(),
        "garbage.sh",
        "cat > /dev/null; echo '{not json'",
    );
    let (mut a, seen, events) = agent_with(
        writer(),
        hooks(vec![pre("Write", one), pre("Write", &garbage)]),
    )
    .await;
    let run = a.run("go").await;
    assert_eq!(run.final_text, "wrote \"secret.txt\"");
    assert_eq!(seen.lock().unwrap().len(), 1);
    let w = events.warnings();
    assert_eq!(
        w[0],
        format!(
            "PreToolUse hook `{one}` (matcher `Write`) exited with 1 (only exit 2 blocks); the agent went on"
        )
    );
    assert!(
        w[1].starts_with(&format!(
            "PreToolUse hook `{garbage}` (matcher `Write`) printed output that is not valid JSON ("
        )),
        "{w:?}"
    );
}

#[tokio::test]
async fn a_json_deny_blocks_and_post_tool_use_adds_to_the_result() {
    let deny = r#"cat > /dev/null; echo '{"hookSpecificOutput":{"permissionDecision":"deny","permissionDecisionReason":"not today"}}'"#;
    let (mut a, _, _) = agent_with(writer(), hooks(vec![pre("Write", deny)])).await;
    assert_eq!(
        a.run("go").await.final_text,
        "a PreToolUse hook blocked `Write`: not today"
    );
    let post: Arc<dyn Hook> = Arc::new(
        CommandHook::new(
            HookEvent::PostToolUse,
            "Write",
            r#"cat > /dev/null; echo '{"decision":"block","reason":"run the formatter next"}'"#,
        )
        .unwrap(),
    );
    let (mut a, seen, _) = agent_with(writer(), hooks(vec![post])).await;
    assert_eq!(
        a.run("go").await.final_text,
        "wrote \"secret.txt\"A PostToolUse hook says: run the formatter next"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// A `permissionDecision` that is not exactly `deny`, `allow` or `ask` (`"DENY"`, `true`)
/// lets the call run — Claude Code reads only the three words — and is a warning naming the
/// hook and the value, not a deny that silently does nothing; context from a PreToolUse
/// hook, which nothing reads, is a warning too.
#[tokio::test]
async fn a_mistyped_decision_or_unread_context_is_a_warning() {
    let said = |json: &str| format!("cat > /dev/null; echo '{json}'");
    let cases = [
        (
            said(r#"{"hookSpecificOutput":{"permissionDecision":"DENY"}}"#),
            "gave `permissionDecision` \"DENY\", which is not `deny`, `allow` or `ask` (the \
             words are matched exactly); it was ignored, with the rest of its output, and the \
             call went on",
        ),
        (
            said(r#"{"hookSpecificOutput":{"permissionDecision":true}}"#),
            "gave `permissionDecision` true, which is not `deny`, `allow` or `ask` (the words \
             are matched exactly); it was ignored, with the rest of its output, and the call \
             went on",
        ),
        // Beside a rewrite: the rewrite is not applied either (the call runs as the model
        // asked), and the host is told.
        (
            said(
                r#"{"hookSpecificOutput":{"permissionDecision":"DENY","updatedInput":{"path":"other.txt"}}}"#,
            ),
            "gave `permissionDecision` \"DENY\", which is not `deny`, `allow` or `ask` (the \
             words are matched exactly); it was ignored, with the rest of its output, and the \
             call went on",
        ),
        (
            said(r#"{"hookSpecificOutput":{"additionalContext":"PRE-CONTEXT"}}"#),
            "gave context (`additionalContext`) in a PreToolUse hook, where nothing reads it \
             (only UserPromptSubmit, SubagentStart and PostToolUse hooks add context); it was \
             ignored",
        ),
    ];
    for (command, why) in cases {
        let (mut a, seen, events) = agent_with(writer(), hooks(vec![pre("Write", &command)])).await;
        assert_eq!(a.run("go").await.final_text, "wrote \"secret.txt\"");
        assert_eq!(seen.lock().unwrap().len(), 1, "{command}");
        assert_eq!(
            events.warnings(),
            [format!(
                "PreToolUse hook `{command}` (matcher `Write`) {why}"
            )]
        );
    }
    // A mistyped decision beside a `"decision": "block"` still blocks.
    for decision in [r#""DENY""#, "true", "null"] {
        let command = said(&format!(
            r#"{{"decision":"block","reason":"no","hookSpecificOutput":{{"permissionDecision":{decision}}}}}"#
        ));
        let (mut a, seen, _) = agent_with(writer(), hooks(vec![pre("Write", &command)])).await;
        assert_eq!(
            a.run("go").await.final_text,
            "a PreToolUse hook blocked `Write`: no",
            "{decision}"
        );
        assert!(seen.lock().unwrap().is_empty(), "{decision}");
    }
    // The three words are no warning.
    for word in ["allow", "ask"] {
        let command = said(&format!(
            r#"{{"hookSpecificOutput":{{"permissionDecision":"{word}"}}}}"#
        ));
        let (mut a, seen, events) = agent_with(writer(), hooks(vec![pre("Write", &command)])).await;
        assert_eq!(a.run("go").await.final_text, "wrote \"secret.txt\"");
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert_eq!(events.warnings(), Vec::<String>::new());
    }
}

#[tokio::test]
async fn a_prompt_hook_blocks_or_adds_context_and_reads_the_event_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("input.json");
    let record = format!(
        "cat > {}; case \"$(cat {})\" in *forbidden*) echo 'no forbidden prompts' >&2; exit 2;; esac; echo 'The repository is in Rust.'",
        log.display(),
        log.display()
    );
    let hook: Arc<dyn Hook> =
        Arc::new(CommandHook::new(HookEvent::UserPromptSubmit, "", &record).unwrap());
    let b = brain(|r| Plan::Reply(say(&last_texts(r).join("|"))));
    let (mut a, _, _) = agent_with(b, hooks(vec![hook])).await;
    let run = a.run("what language?").await;
    assert_eq!(run.final_text, "what language?|The repository is in Rust.");
    let input: serde_json::Value = serde_json::from_slice(&std::fs::read(&log).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "UserPromptSubmit");
    assert_eq!(input["prompt"], "what language?");
    assert_eq!(
        input["agent_id"], input["session_id"],
        "the root's own session"
    );
    assert!(input["cwd"].is_string());
    let run = a.run("something forbidden").await;
    assert_eq!(
        run.stop,
        StopReason::Blocked {
            message: "no forbidden prompts".into()
        }
    );
    assert!(run.turns.is_empty(), "nothing was sent");
}

/// A Stop hook that blocks while `stop_hook_active` is false sends the agent on once; one that
/// always blocks is cut off after `MAX_STOP_BLOCKS`.
#[tokio::test]
async fn a_stop_hook_sends_the_agent_on_and_is_bounded() {
    let once =
        r#"if grep -q '"stop_hook_active":false'; then echo 'run the tests first' >&2; exit 2; fi"#;
    let hook: Arc<dyn Hook> = Arc::new(CommandHook::new(HookEvent::Stop, "", once).unwrap());
    let b = brain(|r| {
        if last_texts(r).join("").contains("run the tests first") {
            Plan::Reply(say("tests pass"))
        } else {
            Plan::Reply(say("done"))
        }
    });
    let (mut a, _, _) = agent_with(b, hooks(vec![hook])).await;
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "tests pass");
    assert_eq!(run.turns.len(), 2);
    let always: Arc<dyn Hook> = Arc::new(
        CommandHook::new(
            HookEvent::Stop,
            "",
            "cat >/dev/null; echo again >&2; exit 2",
        )
        .unwrap(),
    );
    let (mut a, _, events) =
        agent_with(brain(|_| Plan::Reply(say("done"))), hooks(vec![always])).await;
    let run = a.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.turns.len() as u32, MAX_STOP_BLOCKS + 1);
    assert_eq!(
        events.warnings(),
        [format!(
            "Stop hooks sent the agent on {MAX_STOP_BLOCKS} times in a row; its run ends"
        )]
    );
}

/// In-process hooks compose in order: a rewrite is what the next hook sees, the first block
/// ends the chain.
#[tokio::test]
async fn in_process_hooks_compose_in_order() {
    #[derive(Debug)]
    struct Rewrite;
    #[async_trait]
    impl Hook for Rewrite {
        fn matches(&self, event: HookEvent, _: Option<&str>) -> bool {
            event == HookEvent::PreToolUse
        }
        async fn run(&self, _: &HookInput) -> HookOutcome {
            HookOutcome::Rewrite {
                input: serde_json::json!({"path": "first.txt"}),
            }
        }
    }
    #[derive(Debug)]
    struct Check(Arc<std::sync::atomic::AtomicUsize>);
    #[async_trait]
    impl Hook for Check {
        fn matches(&self, event: HookEvent, _: Option<&str>) -> bool {
            event == HookEvent::PreToolUse
        }
        async fn run(&self, input: &HookInput) -> HookOutcome {
            self.0.fetch_add(1, Ordering::SeqCst);
            if input.tool_input.as_ref().unwrap()["path"] == "first.txt" {
                HookOutcome::Block {
                    reason: "saw the rewrite".into(),
                }
            } else {
                HookOutcome::Continue
            }
        }
    }
    let after = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (mut a, seen, _) = agent_with(
        writer(),
        hooks(vec![
            Arc::new(Rewrite),
            Arc::new(Check(Arc::new(std::sync::atomic::AtomicUsize::new(0)))),
            Arc::new(Check(Arc::clone(&after))),
        ]),
    )
    .await;
    assert_eq!(
        a.run("go").await.final_text,
        "a PreToolUse hook blocked `Write`: saw the rewrite"
    );
    assert_eq!(
        after.load(Ordering::SeqCst),
        0,
        "the chain ended at the block"
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn the_settings_format_is_read_and_what_cannot_be_used_is_said() {
    let v = serde_json::json!({
        "PreToolUse": [{"matcher": "Write|Edit", "hooks": [
            {"type": "command", "command": "exit 0", "timeout": 5},
            {"type": "prompt", "prompt": "is this safe?"}
        ]}],
        "Notification": [{"hooks": [{"type": "command", "command": "true"}]}],
        "PostToolUse": [{"matcher": "(", "hooks": [{"type": "command", "command": "true"}]}]
    });
    let (h, warnings) = Hooks::from_settings(&v, "agent `auditor`").unwrap();
    assert_eq!(h.len(), 1);
    assert!(h.wants(HookEvent::PreToolUse, Some("Edit")));
    assert!(!h.wants(HookEvent::PreToolUse, Some("Read")));
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings.contains(
        &"hooks of agent `auditor`: `Notification` is not an event this host runs hooks for (it runs PreToolUse, PostToolUse, UserPromptSubmit, Stop, SubagentStart, SubagentStop); left out".to_owned()
    ));
    assert!(warnings.contains(
        &"hooks of agent `auditor`: a `PreToolUse` hook of type `prompt` is not supported here (only `command`); left out".to_owned()
    ));
    assert!(
        warnings.contains(
            &"hooks of agent `auditor`: matcher `(` is not a valid pattern: unclosed group; left out"
                .to_owned()
        ),
        "{warnings:?}"
    );
    // A `timeout` that is not a number of seconds above 0 is said, and the hook keeps the
    // default; one over a day is held to a day, and said; a good one is no warning.
    for (timeout, shown) in [
        (serde_json::json!("30"), "\"30\""),
        (serde_json::json!(0), "0"),
        (serde_json::json!(-1), "-1"),
        (serde_json::json!(null), "null"),
    ] {
        let v = serde_json::json!({"Stop": [{"hooks": [
            {"type": "command", "command": "true", "timeout": timeout}
        ]}]});
        let (h, warnings) = Hooks::from_settings(&v, "agent `auditor`").unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(
            warnings,
            [format!(
                "hooks of agent `auditor`: a `Stop` hook's `timeout` is {shown}, which is not a \
                 number of seconds above 0; it gets the default 60s"
            )]
        );
    }
    let v = serde_json::json!({"Stop": [{"hooks": [
        {"type": "command", "command": "true", "timeout": 1e300}
    ]}]});
    assert_eq!(
        Hooks::from_settings(&v, "agent `auditor`").unwrap().1,
        [
            "hooks of agent `auditor`: a `Stop` hook's `timeout` is 1e+300 seconds, more than a \
          day; it is held to 86400s"
        ]
    );
    let v = serde_json::json!({"Stop": [{"hooks": [
        {"type": "command", "command": "true", "timeout": 0.3}
    ]}]});
    assert_eq!(
        Hooks::from_settings(&v, "agent `auditor`").unwrap().1,
        Vec::<String>::new()
    );
    for (bad, why) in [
        (
            serde_json::json!([]),
            "hooks of agent `auditor`: expected an object of events",
        ),
        (
            serde_json::json!({"Stop": {}}),
            "hooks of agent `auditor`: `Stop` is not a list of matcher groups",
        ),
        (
            serde_json::json!({"Stop": [{"matcher": ""}]}),
            "hooks of agent `auditor`: a `Stop` group has no `hooks` list",
        ),
        (
            serde_json::json!({"Stop": [{"hooks": [{"type": "command"}]}]}),
            "hooks of agent `auditor`: a `Stop` command hook has no `command`",
        ),
    ] {
        assert_eq!(
            Hooks::from_settings(&bad, "agent `auditor`")
                .unwrap_err()
                .to_string(),
            format!("invalid hook: {why}")
        );
    }
}

/// A definition's hooks (its frontmatter, in the corpus's shape) run for its agent only; the
/// host's run for the whole tree, `SubagentStart` context reaches the subagent, and a
/// `SubagentStop` hook sends it on once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definitions_hooks_apply_to_its_agent_and_the_hosts_to_all() {
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::definition::{AgentRegistry, parse_agent_markdown};
    let md = "---\nname: auditor\ndescription: reads only\nhooks:\n  PreToolUse:\n    - matcher: \"Write|Edit\"\n      hooks:\n        - type: command\n          command: \"echo 'Blocked: read-only auditor' >&2; exit 2\"\n  Stop:\n    - hooks:\n        - type: command\n          command: \"grep -q '\\\"stop_hook_active\\\":false' && { echo 'list what you checked' >&2; exit 2; }; exit 0\"\n---\nYou audit.\n";
    let def = parse_agent_markdown(
        Path::new("auditor.md"),
        md,
        forkhive_spawn::definition::DefinitionSource::Project,
    )
    .unwrap()
    .definition;
    let blocked = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let b2 = Arc::clone(&blocked);
    let b = brain(move |r| {
        let text = format!("{:?}", r.all_messages());
        if !is_parent(r) {
            b2.lock()
                .unwrap()
                .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
            if text.contains("list what you checked") {
                return Plan::Reply(say("checked auth.rs"));
            }
            if !has_tool_result(r) {
                assert!(text.contains("audit context from the host"), "{text}");
                return Plan::Reply(calls(&[("w", "Write", r#"{"path":"x"}"#)]));
            }
            return Plan::Reply(say(&results(r)[0].1));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                (
                    "a",
                    "Agent",
                    r#"{"description":"audit","prompt":"audit","subagent_type":"auditor"}"#,
                ),
                ("w", "Write", r#"{"path":"mine"}"#),
            ]));
        }
        Plan::Reply(say(&results(r)
            .into_iter()
            .map(|(_, t, _)| t)
            .collect::<Vec<_>>()
            .join(" | ")))
    });
    let write = TestTool::new(
        "Write",
        r#"{"type":"object","properties":{"path":{"type":"string"}}}"#,
        false,
        |input, _| async move {
            forkhive_spawn::tool::ToolOutput::text(format!("wrote {}", input["path"]))
        },
    )
    .arc();
    let start: Arc<dyn Hook> = Arc::new(
        CommandHook::new(
            HookEvent::SubagentStart,
            "auditor",
            "cat >/dev/null; echo 'audit context from the host'",
        )
        .unwrap(),
    );
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([def]))
            .with_warm_fanout(None),
    )
    .unwrap();
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([tool.arc(), write]).unwrap())
        .hooks(hooks(vec![start]))
        .trust_definition_hooks(true)
        .build()
        .await
        .unwrap();
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    // The subagent's Write was blocked by its own hook, its stop hook sent it on once, and the
    // lead's Write ran.
    assert!(
        run.final_text.contains("checked auth.rs"),
        "{}",
        run.final_text
    );
    assert!(
        run.final_text.contains("wrote \"mine\""),
        "{}",
        run.final_text
    );
    assert_eq!(
        blocked.lock().unwrap().clone(),
        [(
            "a PreToolUse hook blocked `Write`: Blocked: read-only auditor".to_owned(),
            true
        )]
    );
}

/// A project definition's hooks run shell commands: without the host's say-so they are left
/// out, with a warning.
#[tokio::test]
async fn a_project_definitions_hooks_need_the_hosts_trust() {
    let mut d = forkhive_spawn::definition::AgentDefinition::new(
        "auditor",
        "reads only",
        forkhive_spawn::definition::DefinitionSource::Project,
    );
    d.model = Some("m".into());
    d.hooks = Some(
        serde_json::json!({"PreToolUse": [{"matcher": "Write", "hooks": [
        {"type": "command", "command": "echo no >&2; exit 2"}]}]}),
    );
    let events = Arc::new(Events::default());
    let write = TestTool::new("Write", r#"{"type":"object"}"#, false, |_, _| async {
        forkhive_spawn::tool::ToolOutput::text("wrote")
    })
    .arc();
    let mut a = Agent::builder(writer())
        .definition(d)
        .tools(ToolPool::new([write]).unwrap())
        .events(events.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(a.run("go").await.final_text, "wrote");
    assert_eq!(
        events.warnings(),
        [
            "agent `auditor` has hooks, which run shell commands; this host does not run the hooks of project definitions (AgentBuilder::trust_definition_hooks), so they were left out"
        ]
    );
}

/// A worker resumed by `SendMessage` keeps its definition's hooks: a guard that blocked a tool
/// before it ended still blocks it after.
#[tokio::test]
async fn a_resumed_worker_keeps_its_definitions_hooks() {
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::control::SendMessageTool;
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    let dir = tempfile::tempdir().unwrap();
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Host);
    w.system_prompt = "You are a worker.".into();
    w.hooks = Some(
        serde_json::json!({"PreToolUse": [{"matcher": "Write", "hooks": [
        {"type": "command", "command": "cat >/dev/null; echo 'no writes' >&2; exit 2"}]}]}),
    );
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let s2 = Arc::clone(&seen);
    let b = brain(move |r| {
        let all = r.all_messages();
        if !is_parent(r) {
            s2.lock()
                .unwrap()
                .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
            if has_tool_result(r) && !last_texts(r).join("").contains("again") {
                return Plan::Reply(say("answered"));
            }
            return Plan::Reply(calls(&[("w", "Write", r#"{"path":"x"}"#)]));
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"job","prompt":"p","subagent_type":"worker","run_in_background":true,"name":"alpha"}"#,
            )])),
            5 => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alpha","message":"again"}"#,
            )])),
            _ => Plan::Reply(say("waiting")),
        }
    });
    let write = TestTool::new("Write", r#"{"type":"object"}"#, false, |_, _| async {
        forkhive_spawn::tool::ToolOutput::text("wrote")
    })
    .arc();
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([w]))
            .with_warm_fanout(None),
    )
    .unwrap();
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(
            ToolPool::new([
                tool.arc(),
                Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn forkhive_spawn::tool::Tool>,
                write,
            ])
            .unwrap(),
        )
        .transcript_dir(dir.path())
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(20)))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the run ended");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let blocked = (
        "a PreToolUse hook blocked `Write`: no writes".to_owned(),
        true,
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().filter(|s| **s == blocked).count(),
        2,
        "blocked before and after the resume: {seen:?}"
    );
    assert!(!seen.iter().any(|(t, _)| t == "wrote"), "{seen:?}");
}

/// A hook that only lets things through, on the prompt events.
#[derive(Debug)]
struct PassPrompts;

#[async_trait]
impl Hook for PassPrompts {
    fn matches(&self, event: HookEvent, _: Option<&str>) -> bool {
        matches!(
            event,
            HookEvent::UserPromptSubmit | HookEvent::SubagentStart
        )
    }
    async fn run(&self, _: &HookInput) -> HookOutcome {
        HookOutcome::Continue
    }
}

/// A child cancelled before its first run keeps its prompt in its transcript even with a
/// `SubagentStart` hook (the hook's cancel branch ended the run before the prompt was
/// recorded); a main agent's prompt that its `UserPromptSubmit` hooks have not passed is not
/// recorded — they might have blocked it.
#[tokio::test]
async fn a_cancelled_childs_prompt_hook_does_not_cost_it_its_prompt() {
    use forkhive_core::{TaskId, TaskKind};
    use forkhive_spawn::runtime::{AgentKind, QuerySource};
    let mut recorded = Vec::new();
    for child in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let parent = Agent::builder(brain(|_| Plan::Reply(say("never asked"))))
            .model("m")
            .hooks(hooks(vec![Arc::new(PassPrompts)]))
            .build()
            .await
            .unwrap();
        let mut b = Agent::builder(brain(|_| Plan::Reply(say("never asked"))))
            .model("m")
            .transcript_dir(dir.path())
            .hooks(hooks(vec![Arc::new(PassPrompts)]));
        if child {
            // A child's token is its parent's child: stopped before its first run.
            parent.cancellation().cancel();
            b = b.child_of(parent.child_seed(
                TaskId::generate(TaskKind::Agent),
                AgentKind::Subagent,
                QuerySource::builtin("Explore"),
            ));
        } else {
            let token = tokio_util::sync::CancellationToken::new();
            token.cancel();
            b = b.cancellation(token);
        }
        let mut agent = b.build().await.unwrap();
        let run = agent.run("the task").await;
        assert_eq!(run.stop, StopReason::Cancelled, "child: {child}");
        let path = agent.transcript_path().unwrap().to_path_buf();
        let t = forkhive_spawn::transcript::read(&path).await.unwrap();
        recorded.push((
            child,
            t.messages.iter().map(|m| m.text()).collect::<Vec<_>>(),
        ));
    }
    assert_eq!(
        recorded,
        vec![(true, vec!["the task".to_owned()]), (false, vec![])],
        "a child keeps its prompt; a main agent's unpassed prompt is not kept"
    );
}

/// A `Stop` hook that would send the agent on, but takes an hour first.
#[derive(Debug)]
struct SlowStop(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Hook for SlowStop {
    fn matches(&self, event: HookEvent, _: Option<&str>) -> bool {
        event == HookEvent::Stop
    }
    async fn run(&self, _: &HookInput) -> HookOutcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        HookOutcome::Block {
            reason: "keep going".into(),
        }
    }
}

/// An agent cancelled while its `Stop` hooks run does not wait for them: the run ends
/// `Cancelled` at once, and the model is not asked again (their answer never comes).
#[tokio::test(start_paused = true)]
async fn a_cancelled_agent_does_not_wait_for_its_stop_hooks() {
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&asked);
    let model = brain(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Plan::Reply(say("done"))
    });
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut agent = Agent::builder(model)
        .model("m")
        .hooks(hooks(vec![Arc::new(SlowStop(Arc::clone(&started)))]))
        .build()
        .await
        .unwrap();
    let token = agent.cancellation().clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        token.cancel();
    });
    let begun = tokio::time::Instant::now();
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    assert_eq!(started.load(Ordering::SeqCst), 1, "the hook was running");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "not sent on");
    assert!(
        begun.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        begun.elapsed()
    );
}
