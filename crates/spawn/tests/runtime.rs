//! The agent loop: tool rounds, errors that never crash the loop, permissions, stop reasons,
//! pending messages, events, identity and cancellation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{
    CacheSafeParams, ContentBlock, Message, Role, TaskId, TaskKind, ToolDefinition,
};
use forkhive_spawn::runtime::agent::CONTINUE_PROMPT;
use forkhive_spawn::runtime::{
    Agent, AgentContext, AgentKind, EventKind, Limits, PendingMessage, QuerySource, StopReason,
};
use forkhive_spawn::tool::{
    PermissionDecision, PermissionPolicy, PermissionRequest, Tool, ToolOutput, ToolPool,
};
use forkhive_transport::{
    Backend, BlockStart, Error as TransportError, EventStream, ModelStop, PartialUsage, Request,
    Response, ScriptedBackend, StreamEvent,
};
use support::*;

async fn agent_with(backend: Arc<dyn Backend>, tools: Vec<Arc<dyn Tool>>, limits: Limits) -> Agent {
    Agent::builder(backend)
        .model("claude-sonnet-4-5")
        .system_prompt("You are a test agent.")
        .tools(ToolPool::new(tools).unwrap())
        .limits(limits)
        .build()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn safe_calls_run_together_unsafe_ones_alone_and_results_keep_call_order() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let safe = TestTool::sleeper("Look", true, 50).counting(&running, &peak);
    let unsafe_peak = Arc::new(AtomicUsize::new(0));
    let lone = {
        let running = Arc::clone(&running);
        let unsafe_peak = Arc::clone(&unsafe_peak);
        TestTool::new("Change", OBJECT, false, move |_, _| {
            // While this runs, nothing else may.
            unsafe_peak.fetch_max(running.load(Ordering::SeqCst), Ordering::SeqCst);
            async { ToolOutput::text("changed") }
        })
        .counting(
            &Arc::new(AtomicUsize::new(0)),
            &Arc::new(AtomicUsize::new(0)),
        )
    };
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[
            ("t1", "Look", r#"{"n":1}"#),
            ("t2", "Look", r#"{"n":2}"#),
            ("t3", "Look", r#"{"n":3}"#),
            ("t4", "Change", "{}"),
            ("t5", "Look", r#"{"n":5}"#),
            ("t6", "Look", r#"{"n":6}"#),
        ])),
        Ok(say("done")),
    ]));
    let mut agent = agent_with(
        backend.clone(),
        vec![safe.arc(), lone.arc()],
        Limits::default(),
    )
    .await;
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "done");
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "the first three ran together"
    );
    assert_eq!(
        unsafe_peak.load(Ordering::SeqCst),
        0,
        "the unsafe call ran alone"
    );
    let reqs = backend.requests();
    let got = results(&reqs[1]);
    let ids: Vec<&str> = got.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2", "t3", "t4", "t5", "t6"]);
    assert_eq!(got[0].1, r#"Look {"n":1}"#);
    assert_eq!(got[3].1, "changed");
    assert_eq!(run.tool_calls(), 6);
    assert_eq!(run.turns.len(), 2);
    assert_eq!(run.usage.output_tokens, 10);
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tool = TestTool::sleeper("Look", true, 10).counting(&running, &peak);
    let list: Vec<(String, &str, &str)> =
        (0..12).map(|i| (format!("t{i}"), "Look", "{}")).collect();
    let refs: Vec<(&str, &str, &str)> = list.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&refs)),
        Ok(say("ok")),
    ]));
    let limits = Limits::default().with_max_concurrent_tools(4);
    let mut agent = agent_with(backend, vec![tool.arc()], limits).await;
    assert_eq!(agent.run("go").await.stop, StopReason::Completed);
    assert_eq!(peak.load(Ordering::SeqCst), 4);
}

/// A tool that starts a task and answers at once, recording how many of the tasks started
/// before it had run when it was called.
fn launcher(
    started: &Arc<AtomicUsize>,
    seen: &Arc<std::sync::Mutex<Vec<usize>>>,
    safe: bool,
) -> TestTool {
    let (started, seen) = (Arc::clone(started), Arc::clone(seen));
    TestTool::new("Launch", OBJECT, safe, move |_, _| {
        let (started, seen) = (Arc::clone(&started), Arc::clone(&seen));
        async move {
            seen.lock().unwrap().push(started.load(Ordering::SeqCst));
            tokio::spawn(async move { started.fetch_add(1, Ordering::SeqCst) });
            ToolOutput::text("started")
        }
    })
}

fn launches(n: usize) -> Vec<(String, &'static str, &'static str)> {
    (0..n).map(|i| (format!("t{i}"), "Launch", "{}")).collect()
}

/// A round of many calls yields to the runtime after every ten answers, and the runtime runs
/// what those calls started before the round goes on: a wide fan-out's children start while
/// their parent is still launching, not after its last launch. Calls run together or one at a
/// time alike, and the answers keep their order.
#[tokio::test]
async fn a_wide_round_lets_what_its_calls_started_run_every_ten_answers() {
    for safe in [true, false] {
        let started = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let list = launches(25);
        let refs: Vec<(&str, &str, &str)> =
            list.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(calls(&refs)),
            Ok(say("ok")),
        ]));
        // More at once than the round has calls: the yields do not depend on the limit.
        let limits = Limits::default().with_max_concurrent_tools(100);
        let tool = launcher(&started, &seen, safe);
        let mut agent = agent_with(backend.clone(), vec![tool.arc()], limits).await;
        assert_eq!(agent.run("go").await.stop, StopReason::Completed);
        let want: Vec<usize> = (0..25).map(|i| i / 10 * 10).collect();
        assert_eq!(
            *seen.lock().unwrap(),
            want,
            "each call saw every task the calls ten and more before it started (safe: {safe})"
        );
        let got = results(&backend.requests()[1]);
        let ids: Vec<&str> = got.iter().map(|(id, _, _)| id.as_str()).collect();
        let want_ids: Vec<String> = (0..25).map(|i| format!("t{i}")).collect();
        assert_eq!(ids, want_ids);
    }
}

/// The agent cancelled while its round has yielded: the calls not yet started are answered as
/// cancelled, and the ones that ran keep their answers. Calls run together or one at a time
/// alike.
#[tokio::test]
async fn a_cancel_while_a_round_yields_stops_the_calls_not_yet_started() {
    for safe in [true, false] {
        cancel_at_the_first_yield(safe).await;
    }
}

async fn cancel_at_the_first_yield(safe: bool) {
    let started = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let list = launches(25);
    let refs: Vec<(&str, &str, &str)> = list.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
    let backend = Arc::new(ScriptedBackend::from_replies([Ok(calls(&refs))]));
    let limits = Limits::default().with_max_concurrent_tools(100);
    // The tenth task stops the agent: it runs when the round first yields.
    let token = Arc::new(std::sync::OnceLock::<tokio_util::sync::CancellationToken>::new());
    let tool = {
        let (started, seen, token) = (Arc::clone(&started), Arc::clone(&seen), Arc::clone(&token));
        TestTool::new("Launch", OBJECT, safe, move |_, _| {
            let (started, seen, token) =
                (Arc::clone(&started), Arc::clone(&seen), Arc::clone(&token));
            async move {
                seen.lock().unwrap().push(started.load(Ordering::SeqCst));
                tokio::spawn(async move {
                    if started.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                        token.get().unwrap().cancel();
                    }
                });
                ToolOutput::text("started")
            }
        })
    };
    let mut agent = agent_with(backend.clone(), vec![tool.arc()], limits).await;
    token.set(agent.cancellation().clone()).unwrap();
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    assert_eq!(
        seen.lock().unwrap().len(),
        10,
        "only the first ten ran (safe: {safe})"
    );
    let texts: Vec<String> = message_results(run.new_messages.last().unwrap())
        .into_iter()
        .map(|(_, text, _)| text)
        .collect();
    assert_eq!(texts.len(), 25, "one answer per call");
    assert!(texts[..10].iter().all(|t| t == "started"), "{texts:?}");
    assert!(
        texts[10..]
            .iter()
            .all(|t| t
                == "tool `Launch` was cancelled: the agent was stopped before the call finished"),
        "{texts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_a_tool_or_the_model_does_crashes_the_loop() {
    let strict = TestTool::new(
        "Strict",
        r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        true,
        |_, _| async { ToolOutput::text("ok") },
    );
    let fails = TestTool::new("Fails", OBJECT, true, |_, _| async {
        ToolOutput::error("disk on fire")
    });
    let boom = TestTool::new("Boom", OBJECT, true, |_, _| async {
        #[allow(clippy::panic)]
        if true {
            panic!("kaboom");
        }
        ToolOutput::text("unreachable")
    });
    let slow = TestTool::sleeper("Slow", true, 10_000);
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[
            ("t1", "Nope", "{}"),
            ("t2", "Strict", r#"{"path":7}"#),
            ("t3", "Strict", "{}"),
            ("t4", "Fails", "{}"),
            ("t5", "Boom", "{}"),
            ("t6", "Slow", "{}"),
            ("t7", "Strict", r#"{"path":"a"}"#),
        ])),
        Ok(say("recovered")),
    ]));
    let limits = Limits::default().with_tool_timeout(Duration::from_secs(1));
    let tools = vec![strict.arc(), fails.arc(), boom.arc(), slow.arc()];
    let mut agent = agent_with(backend.clone(), tools, limits).await;
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "recovered");
    let got = results(&backend.requests()[1]);
    let want = [
        (
            "t1",
            "unknown tool `Nope`; available tools: Strict, Fails, Boom, Slow",
            true,
        ),
        (
            "t2",
            "invalid input for tool `Strict`:\nat /path: 7 is not of type \"string\"",
            true,
        ),
        (
            "t3",
            "invalid input for tool `Strict`:\nat /: \"path\" is a required property",
            true,
        ),
        ("t4", "disk on fire", true),
        ("t5", "tool `Boom` panicked: kaboom", true),
        (
            "t6",
            "tool `Slow` did not finish within 1s; it was stopped",
            true,
        ),
        ("t7", "ok", false),
    ];
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1.as_str(), g.2), w);
    }
    assert_eq!(got.len(), 7);
}

#[tokio::test]
async fn a_tool_timeout_too_long_to_represent_is_no_panic() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("t1", "Quick", "{}")])),
        Ok(say("done")),
    ]));
    let limits = Limits::default().with_tool_timeout(Duration::MAX);
    let quick = TestTool::sleeper("Quick", true, 1);
    let mut agent = agent_with(backend.clone(), vec![quick.arc()], limits).await;
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert!(
        !results(&backend.requests()[1])[0].2,
        "the call ran and succeeded"
    );
}

/// Approves every call, after a human's long pause.
#[derive(Debug)]
struct SlowApprover;

#[async_trait]
impl PermissionPolicy for SlowApprover {
    async fn check(&self, _r: PermissionRequest<'_>) -> PermissionDecision {
        tokio::time::sleep(Duration::from_secs(125)).await;
        PermissionDecision::Allow
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_is_timed_from_when_it_runs_not_from_a_slow_permission_decision() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("t1", "Quick", "{}")])),
        Ok(say("done")),
    ]));
    let mut agent = Agent::builder(backend.clone())
        .model("claude-sonnet-4-5")
        .tools(ToolPool::new([TestTool::sleeper("Quick", true, 1_000).arc()]).unwrap())
        .policy(Arc::new(SlowApprover))
        .limits(Limits::default().with_tool_timeout(Duration::from_secs(120)))
        .build()
        .await
        .unwrap();
    let run = agent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed);
    let got = results(&backend.requests()[1]);
    assert_eq!(
        (got[0].1.as_str(), got[0].2),
        ("Quick {}", false),
        "{got:?}"
    );
}

#[derive(Debug)]
struct Gatekeeper;

#[async_trait]
impl PermissionPolicy for Gatekeeper {
    async fn check(&self, r: PermissionRequest<'_>) -> PermissionDecision {
        match (r.tool_name(), r.input.get("path").and_then(|p| p.as_str())) {
            ("Echo", Some("secret")) => PermissionDecision::deny("`secret` is off limits"),
            ("Echo", Some("redirect")) => {
                PermissionDecision::AllowWithInput(serde_json::json!({"path": "public"}))
            }
            ("Echo", Some("break")) => {
                PermissionDecision::AllowWithInput(serde_json::json!({"path": 1}))
            }
            _ => PermissionDecision::Allow,
        }
    }
}

#[tokio::test]
async fn the_policy_allows_denies_and_rewrites() {
    let echo = TestTool::new(
        "Echo",
        r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        true,
        |input, _| async move { ToolOutput::text(input["path"].as_str().unwrap_or("?").to_owned()) },
    );
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[
            ("a", "Echo", r#"{"path":"notes"}"#),
            ("b", "Echo", r#"{"path":"secret"}"#),
            ("c", "Echo", r#"{"path":"redirect"}"#),
            ("d", "Echo", r#"{"path":"break"}"#),
        ])),
        Ok(say("ok")),
    ]));
    let mut agent = Agent::builder(backend.clone())
        .model("m")
        .tools(ToolPool::new([echo.arc()]).unwrap())
        .policy(Arc::new(Gatekeeper))
        .build()
        .await
        .unwrap();
    let _ = agent.run("go").await;
    let got = results(&backend.requests()[1]);
    assert_eq!(got[0], ("a".into(), "notes".into(), false));
    assert_eq!(got[1], ("b".into(), "`secret` is off limits".into(), true));
    assert_eq!(got[2], ("c".into(), "public".into(), false));
    assert_eq!(
        got[3],
        (
            "d".into(),
            "the permission policy rewrote the input of `Echo` into one that does not match its \
             schema:\nat /path: 1 is not of type \"string\""
                .into(),
            true
        )
    );
}

fn looping_backend() -> Arc<ScriptedBackend> {
    let n = AtomicUsize::new(0);
    Arc::new(ScriptedBackend::from_fn(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        Ok(calls(&[(&format!("t{i}"), "Look", "{}")]))
    }))
}

#[tokio::test(start_paused = true)]
async fn max_turns_is_a_stop_reason_not_an_error() {
    let backend = looping_backend();
    let limits = Limits::default().with_max_turns(Some(3));
    let mut agent = agent_with(
        backend.clone(),
        vec![TestTool::sleeper("Look", true, 1).arc()],
        limits,
    )
    .await;
    let run = agent.run("loop").await;
    assert_eq!(run.stop, StopReason::MaxTurns { limit: 3 });
    assert_eq!(run.stop.to_string(), "stopped at its 3-turn limit");
    assert!(run.error.is_none());
    assert_eq!(run.turns.len(), 3);
    assert_eq!(backend.requests().len(), 3);
    // The conversation ends well-formed: the last tool call has its result.
    let last = agent.params().messages().last().unwrap().clone();
    assert!(matches!(last.content[0], ContentBlock::ToolResult { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_token_budget_stops_the_run() {
    let backend = looping_backend();
    let limits = Limits::default().with_token_budget(Some(40));
    let mut agent = agent_with(
        backend,
        vec![TestTool::sleeper("Look", true, 1).arc()],
        limits,
    )
    .await;
    let run = agent.run("loop").await;
    assert_eq!(
        run.stop,
        StopReason::TokenBudget {
            limit: 40,
            used: 45
        }
    );
    assert_eq!(run.turns.len(), 3);
}

#[tokio::test]
async fn a_non_retryable_backend_error_is_typed() {
    let backend = Arc::new(ScriptedBackend::from_replies([Err(TransportError::Auth {
        status: 401,
        message: "bad key".into(),
    })]));
    let mut agent = agent_with(backend, vec![], Limits::default()).await;
    let run = agent.run("hi").await;
    assert_eq!(run.stop, StopReason::Failed);
    let err = run.error.clone().unwrap();
    assert_eq!(err.to_string(), "the model backend failed on turn 1");
    assert_eq!(
        std::error::Error::source(&*err).unwrap().to_string(),
        "authentication failed (HTTP 401): bad key"
    );
    assert!(run.into_result().is_err());
}

fn answer(text: &str, stop: ModelStop) -> Response {
    Response {
        stop_reason: Some(stop),
        ..say(text)
    }
}

#[tokio::test]
async fn refusal_max_tokens_and_pause_turn() {
    let backend = Arc::new(ScriptedBackend::from_replies([Ok(answer(
        "no",
        ModelStop::Refusal,
    ))]));
    let mut agent = agent_with(backend, vec![], Limits::default()).await;
    assert_eq!(agent.run("x").await.stop, StopReason::Refusal);

    let backend = Arc::new(ScriptedBackend::from_replies(
        (0..4).map(|i| Ok(answer(&format!("part {i}"), ModelStop::MaxTokens))),
    ));
    let mut agent = agent_with(backend.clone(), vec![], Limits::default()).await;
    let run = agent.run("write a lot").await;
    assert_eq!(run.stop, StopReason::OutputLimit { continuations: 3 });
    let reqs = backend.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(last_texts(&reqs[3]), [CONTINUE_PROMPT]);
    // The answer is the concatenation of the continued parts.
    assert_eq!(run.final_text, "part 0part 1part 2part 3");

    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(answer("thinking about it", ModelStop::PauseTurn)),
        Ok(say("done")),
    ]));
    let mut agent = agent_with(backend.clone(), vec![], Limits::default()).await;
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::Completed);
    let second = backend.requests()[1].all_messages();
    assert_eq!(
        second.last().unwrap(),
        &Message::assistant_text("thinking about it")
    );
}

/// Streams fixed events.
#[derive(Debug)]
struct Events2(Vec<StreamEvent>, std::sync::Mutex<usize>);

#[async_trait]
impl Backend for Events2 {
    async fn send(&self, _r: &Request) -> forkhive_transport::Result<Response> {
        Err(TransportError::ScriptExhausted {
            request: 0,
            scripted: 0,
        })
    }
    async fn stream(&self, _r: &Request) -> forkhive_transport::Result<EventStream> {
        let mut n = self.1.lock().unwrap();
        *n += 1;
        let events = if *n == 1 {
            self.0.clone()
        } else {
            forkhive_transport::request::events_for(&say("fine"), 8)
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

#[tokio::test]
async fn a_tool_call_cut_off_at_max_tokens_gets_an_error_result() {
    let events = vec![
        StreamEvent::MessageStart {
            id: None,
            model: None,
            usage: PartialUsage::default(),
        },
        StreamEvent::BlockStart {
            index: 0,
            block: BlockStart::ToolUse {
                id: "whole".into(),
                name: "Look".into(),
            },
        },
        StreamEvent::InputJsonDelta {
            index: 0,
            partial_json: "{}".into(),
        },
        StreamEvent::BlockStop { index: 0 },
        StreamEvent::BlockStart {
            index: 1,
            block: BlockStart::ToolUse {
                id: "cut".into(),
                name: "Look".into(),
            },
        },
        StreamEvent::InputJsonDelta {
            index: 1,
            partial_json: "{\"path\":\"sr".into(),
        },
        StreamEvent::MessageDelta {
            stop_reason: Some(ModelStop::MaxTokens),
            usage: PartialUsage::default(),
        },
        StreamEvent::MessageStop,
    ];
    let look = TestTool::sleeper("Look", true, 1);
    let calls_made = Arc::clone(&look.calls);
    let backend = Arc::new(Events2(events, Default::default()));
    let mut agent = agent_with(backend, vec![look.arc()], Limits::default()).await;
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(
        calls_made.load(Ordering::SeqCst),
        1,
        "only the whole call ran"
    );
    let msgs = agent.params().messages();
    let user = &msgs[2];
    let texts = result_texts(user);
    assert_eq!(texts[0], ("Look {}".into(), false));
    assert_eq!(
        texts[1],
        (
            "the call to `Look` was cut off by the output token limit before its input was \
             complete, so it did not run; make the call again with a shorter input"
                .into(),
            true
        )
    );
}

/// A backend that never answers.
#[derive(Debug)]
struct Hang;

#[async_trait]
impl Backend for Hang {
    async fn send(&self, _r: &Request) -> forkhive_transport::Result<Response> {
        futures::future::pending().await
    }
    async fn stream(&self, _r: &Request) -> forkhive_transport::Result<EventStream> {
        futures::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn cancellation_stops_a_model_request_and_a_tool_round() {
    let mut agent = agent_with(Arc::new(Hang), vec![], Limits::default()).await;
    let token = agent.cancellation().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        token.cancel();
    });
    assert_eq!(agent.run("x").await.stop, StopReason::Cancelled);

    let backend = Arc::new(ScriptedBackend::from_replies([Ok(calls(&[
        ("fast", "Quick", "{}"),
        ("slow", "Wait", "{}"),
    ]))]));
    let quick = TestTool::sleeper("Quick", true, 1);
    let wait = TestTool::sleeper("Wait", true, 3_600_000);
    let mut agent = agent_with(
        backend,
        vec![quick.arc(), wait.arc()],
        Limits::default().with_tool_timeout(Duration::from_secs(7200)),
    )
    .await;
    let token = agent.cancellation().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        token.cancel();
    });
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    // The conversation stays well-formed: every call has a result.
    let last = run.new_messages.last().unwrap();
    let got = result_texts(last);
    assert_eq!(got[0], ("Quick {}".into(), false), "finished work is kept");
    assert_eq!(
        got[1],
        (
            "tool `Wait` was cancelled: the agent was stopped before the call finished".into(),
            true
        )
    );
}

/// A tool that stops on its token and answers with its own text loses the race to the agent's
/// cancellation: the token is polled before a call that had to wait, so the call is answered as
/// cancelled (one call alone, and two run together), and the run stops `Cancelled`.
#[tokio::test(start_paused = true)]
async fn a_call_that_stops_on_the_token_is_answered_as_cancelled() {
    for ids in [&["one"][..], &["one", "two"][..]] {
        let replies: Vec<(&str, &str, &str)> = ids.iter().map(|id| (*id, "Obey", "{}")).collect();
        let backend = Arc::new(ScriptedBackend::from_replies([Ok(calls(&replies))]));
        let obey = TestTool::new("Obey", OBJECT, true, |_, cx| async move {
            cx.cancellation().cancelled().await;
            ToolOutput::text("saw the token")
        });
        let mut agent = agent_with(backend, vec![obey.arc()], Limits::default()).await;
        let token = agent.cancellation().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            token.cancel();
        });
        let run = agent.run("x").await;
        assert_eq!(run.stop, StopReason::Cancelled, "{ids:?}");
        let got = result_texts(run.new_messages.last().unwrap());
        assert_eq!(got.len(), ids.len(), "{ids:?}");
        for g in got {
            assert_eq!(
                g,
                (
                    "tool `Obey` was cancelled: the agent was stopped before the call finished"
                        .to_owned(),
                    true
                ),
                "{ids:?}"
            );
        }
    }
}

/// A model whose answer arrives in the same wake-up as the agent's cancellation: the token is
/// polled first, so the answer is not taken into the conversation.
#[derive(Debug, Default)]
struct AnswersOnCancel(std::sync::Mutex<Option<tokio_util::sync::CancellationToken>>);

#[async_trait]
impl Backend for AnswersOnCancel {
    async fn send(&self, _r: &Request) -> forkhive_transport::Result<Response> {
        let token = self.0.lock().unwrap().clone().unwrap();
        token.cancelled().await;
        Ok(say("too late"))
    }
    async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
        let response = self.send(r).await?;
        let events = forkhive_transport::request::events_for(&response, 4096);
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_arriving_with_the_cancellation_is_not_taken() {
    let backend = Arc::new(AnswersOnCancel::default());
    let mut agent = agent_with(backend.clone(), vec![], Limits::default()).await;
    let token = agent.cancellation().clone();
    *backend.0.lock().unwrap() = Some(token.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        token.cancel();
    });
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::Cancelled);
    assert!(
        run.new_messages.iter().all(|m| m.role != Role::Assistant),
        "{:?}",
        run.new_messages
    );
}

/// A run whose future is dropped in the middle of a tool round leaves an answer whose calls
/// have no results, in the conversation and the transcript alike. The next run answers each
/// call with an error ahead of its prompt, so its request is one a provider accepts, and the
/// transcript still reads back as the conversation.
#[tokio::test]
async fn a_run_dropped_mid_round_is_answered_by_the_next() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("slow", "Wait", "{}")])),
        Ok(say("done")),
    ]));
    let wait = TestTool::sleeper("Wait", false, 3_600_000);
    let started = Arc::clone(&wait.running);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::builder(backend.clone())
        .model("claude-sonnet-4-5")
        .system_prompt("You are a test agent.")
        .tools(ToolPool::new(vec![wait.arc()]).unwrap())
        .limits(Limits::default().with_tool_timeout(Duration::from_secs(7200)))
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    // Dropped once the tool runs (however slow the machine).
    tokio::select! {
        _ = agent.run("first") => panic!("the run ended"),
        () = async {
            while started.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        } => {}
    }
    let held: Vec<Role> = agent.params().messages().iter().map(|m| m.role).collect();
    assert_eq!(held, [Role::User, Role::Assistant]);

    let run = agent.run("second").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "done");
    let sent = backend.requests()[1].all_messages();
    let roles: Vec<Role> = sent.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
    let last = sent.last().unwrap();
    let want = "the call to `Wait` was interrupted: the agent's previous run stopped before it \
                finished; check its effects and call it again if needed";
    assert_eq!(
        message_results(last),
        [("slow".to_owned(), want.to_owned(), true)]
    );
    assert_eq!(
        last.content.last().and_then(|b| b.as_text()),
        Some("second")
    );

    let path = agent.transcript_path().unwrap().to_path_buf();
    let read = forkhive_spawn::transcript::read(&path).await.unwrap();
    assert_eq!(read.messages, agent.params().messages().to_vec());
}

/// `continue_run` on a conversation that ends with the agent's own answer (a resumed agent
/// that was waiting at the end of its turn) sends nothing until a message comes: with nothing
/// pending or promised it completes at once, without a request; with a message queued, its
/// request ends with that message.
#[tokio::test]
async fn continue_run_after_an_answer_waits_for_a_message() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(say("first answer")),
        Ok(say("second answer")),
    ]));
    let mut agent = agent_with(backend.clone(), vec![], Limits::default()).await;
    assert_eq!(agent.run("hi").await.stop, StopReason::Completed);
    let run = agent.continue_run().await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(
        backend.requests().len(),
        1,
        "nothing to send, so nothing sent"
    );
    agent
        .pending()
        .push(PendingMessage::new("one more thing", "host"));
    let run = agent.continue_run().await;
    assert_eq!(run.final_text, "second answer");
    let sent = backend.requests()[1].all_messages();
    let last = sent.last().unwrap();
    assert_eq!(last.role, Role::User);
    assert_eq!(last.text(), "one more thing");
}

/// A message queued before the first turn of an agent built with messages to send first (a
/// fork child's placeholder results) never comes between the conversation's last assistant
/// message and them: the first request sends them alone (the prefix and breakpoint a fork's
/// siblings share), and the message is taken when that turn ends. A prompt given to `run`
/// follows them. The transcript keeps the conversation's order.
#[tokio::test]
async fn a_message_queued_before_the_first_turn_follows_the_first_request_suffix() {
    let history = CacheSafeParams::builder("m")
        .messages(vec![
            Message::user(vec![ContentBlock::text("split the work")]),
            Message::assistant(vec![ContentBlock::tool_use(
                "call_1",
                "Agent",
                forkhive_core::RawJson::empty_object(),
            )]),
        ])
        .build();
    let first = Message::user(vec![
        ContentBlock::tool_result_text("call_1", "Fork started"),
        ContentBlock::text("the shared boilerplate"),
        ContentBlock::text("your directive"),
    ]);
    for via_run in [false, true] {
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(say("done")),
            Ok(say("heard")),
        ]));
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::builder(backend.clone())
            .params(history.clone())
            .transcript_dir(dir.path())
            .first_request_suffix(vec![first.clone()])
            .build()
            .await
            .unwrap();
        agent
            .pending()
            .push(PendingMessage::new("a word from the lead", "send-message"));
        let run = if via_run {
            agent.run("and a prompt").await
        } else {
            agent.continue_run().await
        };
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        let sent = backend.requests();
        // The prefix ends with the call; the suffix answers it first.
        assert_eq!(
            sent[0].prefix.messages().last().map(|m| m.role),
            Some(Role::Assistant)
        );
        let suffix = sent[0].suffix.messages();
        assert_eq!(suffix[0], first);
        let msgs = agent.params().messages().to_vec();
        assert_eq!(msgs[2], first);
        if via_run {
            // The prompt and the queued message follow it, in the same request.
            assert_eq!(suffix.len(), 2, "{suffix:?}");
            assert_eq!(suffix[1].text(), "and a prompta word from the lead");
            assert_eq!(sent.len(), 1);
        } else {
            assert_eq!(suffix.len(), 1, "{suffix:?}");
            assert_eq!(
                sent.len(),
                2,
                "the message is taken when the first turn ends"
            );
            let last = sent[1].all_messages();
            assert_eq!(last.last().unwrap().text(), "a word from the lead");
            assert_eq!(run.final_text, "heard");
        }
        let read = forkhive_spawn::transcript::read(agent.transcript_path().unwrap())
            .await
            .unwrap();
        assert_eq!(read.messages, msgs);
    }
}

/// An answer cut at `max_tokens` (the run stopped at its continuation limit) is sent again by
/// `continue_run`, as a prefill the provider continues: only a finished answer waits.
#[tokio::test]
async fn continue_run_sends_a_cut_answer_again() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(answer("the first half", ModelStop::MaxTokens)),
        Ok(say("the rest")),
    ]));
    let limits = Limits::default().with_max_continuations(0);
    let mut agent = agent_with(backend.clone(), vec![], limits).await;
    let run = agent.run("write").await;
    assert!(
        matches!(run.stop, StopReason::OutputLimit { .. }),
        "{:?}",
        run.stop
    );
    let run = agent.continue_run().await;
    assert_eq!(run.final_text, "the rest");
    let sent = backend.requests()[1].all_messages();
    assert_eq!(sent.last().map(|m| m.role), Some(Role::Assistant));
}

/// A run dropped while it waits out the notification window after a message arrived loses
/// nothing: the message stays queued until the run takes it, and the next run gets it.
#[tokio::test(start_paused = true)]
async fn a_run_dropped_in_the_notification_window_loses_no_message() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(say("waiting for both")),
        Ok(say("got it")),
    ]));
    let limits = Limits::default().with_notification_window(Duration::from_secs(10));
    let mut agent = agent_with(backend.clone(), vec![], limits).await;
    let queue = agent.pending();
    let first = queue.expect();
    let second = queue.expect();
    tokio::select! {
        _ = agent.run("go") => panic!("the run ended while two messages were promised"),
        () = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            first.deliver(PendingMessage::new("the first result", "test"));
            // Dropped one second into the ten-second window.
            tokio::time::sleep(Duration::from_secs(1)).await;
        } => {}
    }
    assert_eq!(queue.len(), 1, "still queued");
    drop(second);
    let run = agent.run_pending().await;
    assert_eq!(run.final_text, "got it");
    let sent = backend.requests()[1].all_messages();
    assert_eq!(
        sent.last().map(Message::text).as_deref(),
        Some("the first result")
    );
}

/// The notification window ends each of its three ways: every promise settled (one request
/// carrying both messages, at once), the window passing (a request at its end with the one
/// that came), or the agent cancelled in it (the run ends `Cancelled` without asking the model
/// again, and what came is in its conversation).
#[tokio::test(start_paused = true)]
async fn the_notification_window_ends_each_of_its_three_ways() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Way {
        Settled,
        Passed,
        Cancelled,
    }
    for way in [Way::Settled, Way::Passed, Way::Cancelled] {
        let start = tokio::time::Instant::now();
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let backend = brain(move |r| {
            let mut asked = seen.lock().unwrap();
            asked.push((start.elapsed(), r.all_messages().last().map(Message::text)));
            Plan::Reply(say(if asked.len() == 1 {
                "waiting"
            } else {
                "got it"
            }))
        });
        let limits = Limits::default().with_notification_window(Duration::from_secs(10));
        let mut agent = agent_with(backend, vec![], limits).await;
        let (queue, token) = (agent.pending(), agent.cancellation().clone());
        let (first, second) = (queue.expect(), queue.expect());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            first.deliver(PendingMessage::new("the first result", "test"));
            tokio::time::sleep(Duration::from_secs(2)).await;
            match way {
                Way::Settled => second.deliver(PendingMessage::new("the second result", "test")),
                Way::Passed => {
                    tokio::time::sleep(Duration::from_secs(27)).await;
                    drop(second);
                }
                Way::Cancelled => {
                    token.cancel();
                    drop(second);
                }
            }
        });
        let run = agent.run("go").await;
        let asked = asked.lock().unwrap().clone();
        let second_at = asked.get(1).map(|(at, _)| at.as_secs());
        match way {
            Way::Settled => {
                assert_eq!(run.stop, StopReason::Completed);
                assert_eq!(second_at, Some(3), "asked as soon as both came");
                let text = asked[1].1.clone().unwrap_or_default();
                assert!(
                    text.contains("the first result") && text.contains("the second result"),
                    "{text}"
                );
            }
            Way::Passed => {
                assert_eq!(run.stop, StopReason::Completed);
                assert_eq!(second_at, Some(11), "asked when the window passed");
                assert_eq!(asked[1].1.as_deref(), Some("the first result"));
            }
            Way::Cancelled => {
                assert_eq!(run.stop, StopReason::Cancelled);
                assert_eq!(asked.len(), 1, "the model was not asked again: {asked:?}");
                assert!(
                    start.elapsed() < Duration::from_secs(4),
                    "{:?}",
                    start.elapsed()
                );
                let texts: Vec<String> = agent
                    .params()
                    .messages()
                    .iter()
                    .map(Message::text)
                    .collect();
                assert!(
                    texts.iter().any(|t| t.contains("the first result")),
                    "what came is in its conversation: {texts:?}"
                );
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn cancellation_answers_a_lone_call_that_had_not_finished() {
    // One call (run without a stream), and an unsafe one after a safe one (a batch of one).
    for script in [
        vec![("slow", "Wait", "{}")],
        vec![("fast", "Quick", "{}"), ("slow", "Wait", "{}")],
    ] {
        let backend = Arc::new(ScriptedBackend::from_replies([Ok(calls(&script))]));
        let quick = TestTool::sleeper("Quick", true, 1);
        let wait = TestTool::sleeper("Wait", false, 3_600_000);
        let limits = Limits::default().with_tool_timeout(Duration::from_secs(7200));
        let mut agent = agent_with(backend, vec![quick.arc(), wait.arc()], limits).await;
        let token = agent.cancellation().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            token.cancel();
        });
        let run = agent.run("x").await;
        assert_eq!(run.stop, StopReason::Cancelled);
        let last = run.new_messages.last().unwrap();
        let got = result_texts(last);
        let cancelled = (
            "tool `Wait` was cancelled: the agent was stopped before the call finished".to_owned(),
            true,
        );
        assert_eq!(got.last(), Some(&cancelled), "{script:?}");
        if script.len() == 2 {
            assert_eq!(got[0], ("Quick {}".into(), false), "finished work is kept");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_parent_cancels_its_child_but_not_the_reverse() {
    let parent = agent_with(Arc::new(Hang), vec![], Limits::default()).await;
    let seed = parent.child_seed(
        TaskId::generate(TaskKind::Agent),
        AgentKind::Subagent,
        QuerySource::builtin("Explore"),
    );
    let child = Agent::builder(Arc::new(Hang))
        .model("m")
        .child_of(seed)
        .build()
        .await
        .unwrap();
    assert_eq!(child.context().parent(), Some(parent.id()));
    assert_eq!(child.context().depth(), 1);
    assert!(Arc::ptr_eq(child.tree(), parent.tree()));
    let child_token = child.cancellation().clone();
    child_token.cancel();
    assert!(!parent.cancellation().is_cancelled());

    let seed = parent.child_seed(
        TaskId::generate(TaskKind::Agent),
        AgentKind::Subagent,
        QuerySource::builtin("Explore"),
    );
    let mut child = Agent::builder(Arc::new(Hang))
        .model("m")
        .child_of(seed)
        .build()
        .await
        .unwrap();
    let token = parent.cancellation().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        token.cancel();
    });
    assert_eq!(child.run("x").await.stop, StopReason::Cancelled);
}

#[tokio::test]
async fn pending_messages_arrive_after_the_next_tool_results() {
    let queue = forkhive_spawn::runtime::PendingQueue::new();
    let pusher = {
        let q = queue.clone();
        TestTool::new("Note", OBJECT, false, move |_, _| {
            q.push(PendingMessage::new("a note from the host", "host"));
            async { ToolOutput::text("noted") }
        })
    };
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("n", "Note", "{}")])),
        Ok(say("ok")),
    ]));
    let mut agent = Agent::builder(backend.clone())
        .model("m")
        .tools(ToolPool::new([pusher.arc()]).unwrap())
        .pending(queue)
        .build()
        .await
        .unwrap();
    let _ = agent.run("go").await;
    let msgs = backend.requests()[1].all_messages();
    let last = msgs.last().unwrap();
    assert!(
        matches!(&last.content[0], ContentBlock::ToolResult { tool_use_id, .. } if tool_use_id == "n")
    );
    assert_eq!(last.content[1], ContentBlock::text("a note from the host"));
    assert_eq!(last.content.len(), 2);
}

#[tokio::test]
async fn a_waiting_agent_starts_a_new_turn_when_a_promised_message_arrives() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(say("waiting for the worker")),
        Ok(say("the worker is done")),
    ]));
    let mut agent = agent_with(backend.clone(), vec![], Limits::default()).await;
    let promise = agent.pending().expect();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        promise.deliver(PendingMessage::new(
            "<task-notification>…</task-notification>",
            "task",
        ));
    });
    let run = agent.run("start the worker").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "the worker is done");
    let reqs = backend.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        last_texts(&reqs[1]),
        ["<task-notification>…</task-notification>"]
    );
}

#[tokio::test]
async fn events_tell_the_story_and_name_a_cache_break() {
    let events = Arc::new(Events::default());
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("l", "Look", "{}")])),
        Ok(say("a fairly long answer, streamed in chunks")),
    ]));
    let other = CacheSafeParams::builder("m")
        .tool(ToolDefinition::new("Other", "x", OBJECT).unwrap())
        .build();
    let mut agent = Agent::builder(backend)
        .model("m")
        .tools(ToolPool::new([TestTool::sleeper("Look", true, 1).arc()]).unwrap())
        .events(events.clone())
        .context(AgentContext::main().with_invoking_request_id("req_parent"))
        .expect_prefix(other.fingerprint().clone())
        .build()
        .await
        .unwrap();
    let _ = agent.run("go").await;
    let evs = events.take();
    assert!(evs.iter().all(|e| &e.agent == agent.id()));
    let kinds: Vec<String> = evs
        .iter()
        .map(|e| {
            let k = format!("{:?}", e.kind);
            k.split([' ', '{', '(']).next().unwrap().to_owned()
        })
        .filter(|k| k != "TextDelta")
        .collect();
    assert_eq!(
        kinds,
        [
            "TurnStarted",
            "CacheBreak",
            "RequestSent",
            "ResponseReceived",
            "ToolCallStarted",
            "ToolCallFinished",
            "TurnStarted",
            "RequestSent",
            "ResponseReceived",
            "Stopped",
        ]
    );
    let brk = evs.iter().find_map(|e| match &e.kind {
        EventKind::CacheBreak { at } => Some(at.to_string()),
        _ => None,
    });
    assert_eq!(brk.as_deref(), Some("tools[0] changed"));
    let ids: Vec<Option<String>> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RequestSent {
                invoking_request_id,
                ..
            } => Some(invoking_request_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        ids,
        [Some("req_parent".to_owned()), None],
        "handed out once"
    );
    let text: String = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "a fairly long answer, streamed in chunks");
    assert!(
        evs.iter()
            .filter(|e| matches!(e.kind, EventKind::TextDelta { .. }))
            .count()
            > 1
    );
    assert_eq!(evs.last().unwrap().turn, 2);
}

#[tokio::test]
async fn tools_and_code_below_them_see_their_own_agent() {
    let who = TestTool::new("WhoAmI", OBJECT, true, |_, cx| async move {
        let local = AgentContext::current()
            .map(|c| c.id().to_string())
            .unwrap_or_default();
        ToolOutput::text(format!("{} {}", cx.agent().id(), local))
    });
    let who = Arc::new(who) as Arc<dyn Tool>;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(calls(&[("w", "WhoAmI", "{}")])),
            Ok(say("ok")),
        ]));
        let agent = agent_with(backend.clone(), vec![Arc::clone(&who)], Limits::default()).await;
        runs.push((agent, backend));
    }
    let (mut a, ba) = runs.remove(0);
    let (mut b, bb) = runs.remove(0);
    let _ = tokio::join!(a.run("x"), b.run("y"));
    let ra = results(&ba.requests()[1])[0].1.clone();
    let rb = results(&bb.requests()[1])[0].1.clone();
    assert_eq!(ra, format!("{} {}", a.id(), a.id()));
    assert_eq!(rb, format!("{} {}", b.id(), b.id()));
}

#[test]
fn agents_and_their_runs_are_send() {
    fn is_send<T: Send>(_: &T) {}
    fn is_sync<T: Sync>() {}
    is_sync::<Agent>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut agent = rt.block_on(agent_with(Arc::new(Hang), vec![], Limits::default()));
    let fut = agent.run("x");
    is_send(&fut);
}

#[tokio::test]
async fn an_agent_is_rendered_from_its_definition() {
    use forkhive_spawn::definition::{AgentRegistry, EXPLORE_AGENT, PLAN_AGENT};
    use forkhive_spawn::tool::ToolAudience;
    let registry = AgentRegistry::builtin();
    let explore = registry.get(EXPLORE_AGENT).unwrap().clone();
    let tool = |n: &str| TestTool::sleeper(n, true, 1).arc();
    let pool = ToolPool::new([
        tool("Read"),
        tool("Edit"),
        tool("Agent"),
        tool("Grep"),
        tool("mcp__db__q"),
    ])
    .unwrap();
    let backend = Arc::new(ScriptedBackend::from_texts(["found it"]));
    let mut agent = Agent::builder(backend.clone())
        .model("claude-opus-4")
        .definition(explore.clone())
        .tools(pool.clone())
        .audience(ToolAudience::Foreground)
        .user_context("claudeMd", "house rules")
        .user_context("cwd", "/repo")
        .build()
        .await
        .unwrap();
    // Layer 1 drops Agent, the definition drops Edit; MCP passes.
    assert_eq!(agent.tools().names(), ["Read", "Grep", "mcp__db__q"]);
    let p = agent.params().clone();
    assert_eq!(
        p.tools()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["Read", "Grep", "mcp__db__q"]
    );
    assert_eq!(
        p.system_prompt(),
        std::slice::from_ref(&explore.system_prompt)
    );
    // omitClaudeMd drops the CLAUDE.md entry and keeps the rest.
    assert_eq!(p.user_context(), [("cwd".to_owned(), "/repo".to_owned())]);
    assert_eq!(
        p.model(),
        explore
            .model
            .clone()
            .filter(|m| m != "inherit")
            .unwrap_or("claude-opus-4".into())
    );
    assert_eq!(
        agent.context().query_source().as_str(),
        "agent:builtin:Explore"
    );
    assert_eq!(agent.context().kind(), AgentKind::Subagent);
    assert_eq!(agent.context().agent_type(), Some("Explore"));
    assert_eq!(agent.run("find the parser").await.final_text, "found it");

    // Plan inherits the builder's model and runs read-only tools only.
    let plan = registry.get(PLAN_AGENT).unwrap().clone();
    let agent = Agent::builder(backend)
        .model("claude-opus-4")
        .definition(plan)
        .tools(pool)
        .build()
        .await
        .unwrap();
    assert_eq!(agent.params().model(), "claude-opus-4");
    assert!(!agent.tools().names().contains(&"Edit"));
}

#[tokio::test]
async fn permission_modes_map_onto_policies() {
    use forkhive_spawn::definition::{AgentDefinition, DefinitionSource, PermissionMode};
    let script = || {
        Arc::new(ScriptedBackend::from_replies([
            Ok(calls(&[("w", "Write", "{}")])),
            Ok(say("ok")),
        ]))
    };
    let mut def = AgentDefinition::new("writer", "writes", DefinitionSource::Project);
    def.system_prompt = "You write.".into();
    for (mode, want) in [
        (
            PermissionMode::Plan,
            (
                true,
                "permission denied for `Write`: plan mode: only read-only tools may run while planning",
            ),
        ),
        (PermissionMode::BypassPermissions, (false, "written")),
        (PermissionMode::AcceptEdits, (false, "written")),
        (
            PermissionMode::Bubble,
            (true, "the parent says no to `Write`"),
        ),
    ] {
        def.permission_mode = Some(mode);
        let backend = script();
        let parent = agent_with(Arc::new(Hang), vec![], Limits::default()).await;
        let mut seed = parent.child_seed(
            TaskId::generate(TaskKind::Agent),
            AgentKind::Subagent,
            QuerySource::custom("writer"),
        );
        seed.parent_policy = Arc::new(ParentSaysNo);
        let mut agent = Agent::builder(backend.clone())
            .model("m")
            .definition(def.clone())
            .tools(
                ToolPool::new([TestTool::new("Write", OBJECT, false, |_, _| async {
                    ToolOutput::text("written")
                })
                .read_only(false)
                .arc()])
                .unwrap(),
            )
            .policy(Arc::new(SaysNo))
            .child_of(seed)
            // After `child_of`, which sets the parent's choice.
            .trust_permission_modes(true)
            .build()
            .await
            .unwrap();
        let _ = agent.run("write").await;
        let got = results(&backend.requests()[1]);
        assert_eq!((got[0].2, got[0].1.as_str()), want, "{mode:?}");
    }
}

#[derive(Debug)]
struct ParentSaysNo;

#[async_trait]
impl PermissionPolicy for ParentSaysNo {
    async fn check(&self, r: PermissionRequest<'_>) -> PermissionDecision {
        PermissionDecision::deny(format!("the parent says no to `{}`", r.tool_name()))
    }
}

#[derive(Debug)]
struct SaysNo;

#[async_trait]
impl PermissionPolicy for SaysNo {
    async fn check(&self, r: PermissionRequest<'_>) -> PermissionDecision {
        PermissionDecision::deny(format!(
            "`{}` is for the parent to decide: no",
            r.tool_name()
        ))
    }
}

#[tokio::test]
async fn limits_on_continuations_and_resends_count_in_a_row() {
    // max_tokens, max_tokens, tool call, max_tokens x3, then done: never 4 in a row.
    let mut replies = vec![
        Ok(answer("a", ModelStop::MaxTokens)),
        Ok(answer("b", ModelStop::MaxTokens)),
        Ok(calls(&[("l", "Look", "{}")])),
    ];
    replies.extend((0..3).map(|_| Ok(answer("c", ModelStop::MaxTokens))));
    replies.push(Ok(say("d")));
    let backend = Arc::new(ScriptedBackend::from_replies(replies));
    let mut agent = agent_with(
        backend,
        vec![TestTool::sleeper("Look", true, 1).arc()],
        Limits::default(),
    )
    .await;
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::Completed);
    assert_eq!(run.final_text, "cccd");

    let backend = Arc::new(ScriptedBackend::from_replies(
        (0..3).map(|_| Ok(answer("p", ModelStop::PauseTurn))),
    ));
    let limits = Limits::default().with_max_pause_resends(2);
    let mut agent = agent_with(backend, vec![], limits).await;
    let run = agent.run("x").await;
    assert_eq!(run.stop, StopReason::PauseLimit { resends: 2 });
    assert_eq!(
        run.stop.to_string(),
        "the provider paused the turn again after 2 resends"
    );
}

#[tokio::test]
async fn only_tools_the_model_was_offered_can_run() {
    let danger = TestTool::new("Danger", OBJECT, false, |_, _| async {
        ToolOutput::text("boom")
    });
    let ran = Arc::clone(&danger.calls);
    let offered = CacheSafeParams::builder("m")
        .tool(ToolDefinition::new("Look", "the Look tool", OBJECT).unwrap())
        .build();
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[("d", "Danger", "{}")])),
        Ok(say("ok")),
    ]));
    let mut agent = Agent::builder(backend.clone())
        .params(offered)
        .tools(ToolPool::new([TestTool::sleeper("Look", true, 1).arc(), danger.arc()]).unwrap())
        .build()
        .await
        .unwrap();
    assert_eq!(agent.tools().names(), ["Look"]);
    let _ = agent.run("x").await;
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(
        results(&backend.requests()[1])[0],
        (
            "d".into(),
            "unknown tool `Danger`; available tools: Look".into(),
            true
        )
    );
}

#[derive(Debug)]
struct DenyAll;

#[async_trait]
impl PermissionPolicy for DenyAll {
    async fn check(&self, r: PermissionRequest<'_>) -> PermissionDecision {
        PermissionDecision::deny(format!("the host denies `{}`", r.tool_name()))
    }
}

#[tokio::test]
async fn permission_modes_never_loosen_the_host_unless_trusted() {
    use forkhive_spawn::definition::{AgentDefinition, DefinitionSource, PermissionMode};
    let run_from = |source: DefinitionSource, mode: PermissionMode, trust: bool| async move {
        let mut def = AgentDefinition::new("d", "d", source);
        def.permission_mode = Some(mode);
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(calls(&[("l", "Look", "{}")])),
            Ok(say("ok")),
        ]));
        let events = Arc::new(Events::default());
        let mut agent = Agent::builder(backend.clone())
            .model("m")
            .definition(def)
            .tools(ToolPool::new([TestTool::sleeper("Look", true, 1).arc()]).unwrap())
            .policy(Arc::new(DenyAll))
            .trust_permission_modes(trust)
            .events(events.clone())
            .build()
            .await
            .unwrap();
        let _ = agent.run("x").await;
        (
            results(&backend.requests()[1])[0].1.clone(),
            events.warnings(),
        )
    };
    let run_with = |mode: PermissionMode, trust: bool| async move {
        run_from(DefinitionSource::Project, mode, trust).await.0
    };
    // A loosening mode dropped is said, naming the definition's source.
    assert_eq!(
        run_from(DefinitionSource::Flag, PermissionMode::AcceptEdits, false)
            .await
            .1,
        [
            "agent `d` asks for `permissionMode: acceptEdits`, which is not honoured: it is a flag \
          definition, and this host does not trust the permission modes of flag definitions \
          (`AgentBuilder::trust_permission_modes`); the host's policy decides"
        ]
    );
    // A trusted source's (the host's own, built in its code; the user's): honoured without
    // the switch, as its hooks would run, and nothing to warn of.
    for source in [DefinitionSource::Host, DefinitionSource::User] {
        assert_eq!(
            run_from(source, PermissionMode::BypassPermissions, false).await,
            ("Look {}".to_owned(), Vec::<String>::new()),
            "{source}"
        );
    }
    // Plan on top of a host that denies: still denied (read-only is necessary, not sufficient).
    assert_eq!(
        run_with(PermissionMode::Plan, false).await,
        "the host denies `Look`"
    );
    assert_eq!(
        run_with(PermissionMode::DontAsk, false).await,
        "the host denies `Look`"
    );
    // A project file cannot switch permissions off...
    assert_eq!(
        run_with(PermissionMode::BypassPermissions, false).await,
        "the host denies `Look`"
    );
    // ...unless the host trusts definitions' modes.
    assert_eq!(
        run_with(PermissionMode::BypassPermissions, true).await,
        "Look {}"
    );
}

/// Denies `Look`, rewrites `Echo`'s input, rewrites `Peek`'s into one its schema refuses.
#[derive(Debug)]
struct Auditable;

#[async_trait]
impl PermissionPolicy for Auditable {
    async fn check(&self, r: PermissionRequest<'_>) -> PermissionDecision {
        match r.tool_name() {
            "Look" => PermissionDecision::deny("not today"),
            "Echo" => PermissionDecision::AllowWithInput(serde_json::json!({"rewritten": true})),
            "Peek" => PermissionDecision::AllowWithInput(serde_json::json!(42)),
            _ => PermissionDecision::Allow,
        }
    }
}

/// A host sees what its policy did: a denial or a rewrite is a `PermissionDecided` event, an
/// allowed call none; a rewrite the schema refuses is a denial.
#[tokio::test]
async fn a_policys_denials_and_rewrites_are_events() {
    let backend = Arc::new(ScriptedBackend::from_replies([
        Ok(calls(&[
            ("l", "Look", "{}"),
            ("e", "Echo", "{}"),
            ("p", "Peek", "{}"),
        ])),
        Ok(say("ok")),
    ]));
    let events = Arc::new(Events::default());
    let mut agent = Agent::builder(backend)
        .model("m")
        .tools(
            ToolPool::new([
                TestTool::sleeper("Look", true, 0).arc(),
                TestTool::sleeper("Echo", true, 0).arc(),
                TestTool::sleeper("Peek", true, 0).arc(),
            ])
            .unwrap(),
        )
        .policy(Arc::new(Auditable))
        .events(events.clone())
        .build()
        .await
        .unwrap();
    let _ = agent.run("x").await;
    let decided: Vec<(String, bool, String)> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::PermissionDecided {
                name,
                rewritten,
                reason,
                ..
            } => Some((name.to_string(), *rewritten, reason.clone())),
            _ => None,
        })
        .collect();
    let mut decided = decided;
    decided.sort();
    assert_eq!(
        decided,
        [
            ("Echo".to_owned(), true, String::new()),
            ("Look".to_owned(), false, "not today".to_owned()),
            (
                "Peek".to_owned(),
                false,
                "the permission policy rewrote the input of `Peek` into one that does not match \
                 its schema:\nat /: 42 is not of type \"object\""
                    .to_owned()
            ),
        ]
    );
    let headlines: Vec<String> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| e.headline())
        .collect();
    // One headline for the denied call: its `ToolCallFinished`.
    assert_eq!(
        headlines
            .iter()
            .filter(|h| h.contains("not today"))
            .map(|h| h.split_once(": ").unwrap().1)
            .collect::<Vec<_>>(),
        ["Look failed: not today"]
    );
}

#[derive(Debug)]
struct Panicky;

#[async_trait]
impl PermissionPolicy for Panicky {
    async fn check(&self, _r: PermissionRequest<'_>) -> PermissionDecision {
        #[allow(clippy::panic)]
        if true {
            panic!("policy bug");
        }
        PermissionDecision::Allow
    }
}

/// A hand-written policy (no `async fn`) that panics before it returns its future.
#[derive(Debug)]
struct PanicsEagerly;

#[async_trait]
impl PermissionPolicy for PanicsEagerly {
    fn check<'a, 'r, 'f>(
        &'a self,
        _r: PermissionRequest<'r>,
    ) -> futures::future::BoxFuture<'f, PermissionDecision>
    where
        'a: 'f,
        'r: 'f,
        Self: 'f,
    {
        #[allow(clippy::panic)]
        {
            panic!("eager policy bug")
        }
    }
}

/// A hand-written tool whose `call` panics before it returns its future.
#[derive(Debug)]
struct CallPanicsEagerly(ToolDefinition);

#[async_trait]
impl Tool for CallPanicsEagerly {
    fn definition(&self) -> &ToolDefinition {
        &self.0
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    fn call<'a, 'c, 'f>(
        &'a self,
        _input: serde_json::Value,
        _cx: &'c forkhive_spawn::tool::ToolContext,
    ) -> futures::future::BoxFuture<'f, ToolOutput>
    where
        'a: 'f,
        'c: 'f,
        Self: 'f,
    {
        #[allow(clippy::panic)]
        {
            panic!("eager tool bug")
        }
    }
}

#[derive(Debug)]
struct BadClassifier(ToolDefinition);

#[async_trait]
impl Tool for BadClassifier {
    fn definition(&self) -> &ToolDefinition {
        &self.0
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        #[allow(clippy::panic)]
        if true {
            panic!("classifier bug");
        }
        true
    }
    fn is_read_only(&self) -> bool {
        true
    }
    async fn call(
        &self,
        _input: serde_json::Value,
        _cx: &forkhive_spawn::tool::ToolContext,
    ) -> ToolOutput {
        ToolOutput::text("ran alone")
    }
}

#[tokio::test]
async fn a_panicking_policy_or_classifier_does_not_kill_the_loop() {
    /// The result an agent with `tool` and `policy` got for one call to `tool`, after which
    /// its run completed.
    async fn one_call(tool: Arc<dyn Tool>, policy: Option<Arc<dyn PermissionPolicy>>) -> String {
        let name = tool.definition().name.clone();
        let backend = Arc::new(ScriptedBackend::from_replies([
            Ok(calls(&[("c", &name, "{}")])),
            Ok(say("ok")),
        ]));
        let mut b = Agent::builder(backend.clone())
            .model("m")
            .tools(ToolPool::new([tool]).unwrap());
        if let Some(p) = policy {
            b = b.policy(p);
        }
        let mut agent = b.build().await.unwrap();
        assert_eq!(agent.run("x").await.stop, StopReason::Completed);
        results(&backend.requests()[1])[0].1.clone()
    }
    let look = || TestTool::sleeper("Look", true, 1).arc();
    assert_eq!(
        one_call(look(), Some(Arc::new(Panicky))).await,
        "the permission policy panicked while checking `Look`: policy bug; the call did not run"
    );
    let bad = BadClassifier(ToolDefinition::new("Bad", "bad", OBJECT).unwrap());
    assert_eq!(one_call(Arc::new(bad), None).await, "ran alone");
    // A policy or a tool written by hand may panic before it returns its future: caught the
    // same way (the pool and the agent hold them behind `Arc`s that forward the call).
    assert_eq!(
        one_call(look(), Some(Arc::new(PanicsEagerly))).await,
        "the permission policy panicked while checking `Look`: eager policy bug; the call did \
         not run"
    );
    let eager = CallPanicsEagerly(ToolDefinition::new("Eager", "eager", OBJECT).unwrap());
    assert_eq!(
        one_call(Arc::new(eager), None).await,
        "tool `Eager` panicked: eager tool bug"
    );
}

#[tokio::test]
async fn a_child_gets_the_sub_agent_layers_by_default() {
    use forkhive_spawn::definition::AgentRegistry;
    let parent = agent_with(Arc::new(Hang), vec![], Limits::default()).await;
    let seed = parent.child_seed(
        TaskId::generate(TaskKind::Agent),
        AgentKind::Subagent,
        QuerySource::builtin("general-purpose"),
    );
    let gp = AgentRegistry::builtin()
        .get("general-purpose")
        .unwrap()
        .clone();
    let tool = |n: &str| TestTool::sleeper(n, true, 1).arc();
    let child = Agent::builder(Arc::new(Hang))
        .model("m")
        .definition(gp)
        .tools(ToolPool::new([tool("Read"), tool("Agent"), tool("AskUserQuestion")]).unwrap())
        .child_of(seed)
        .build()
        .await
        .unwrap();
    assert_eq!(child.tools().names(), ["Read"]);
}

/// A halt requested while a tool runs ends the run after that tool round, its results in the
/// conversation (`StopReason::Halted`, task status `completed`); one requested while the agent
/// waits for a promised message ends it at once; a halt is taken by one run only.
#[tokio::test]
async fn a_halt_ends_the_run_at_the_next_tool_round_boundary() {
    let b = brain(|_| Plan::Reply(calls(&[("s", "Slow", "{}")])));
    let slow = TestTool::sleeper("Slow", true, 100).arc();
    let mut agent = Agent::builder(b)
        .model("m")
        .tools(ToolPool::new([slow]).unwrap())
        .build()
        .await
        .unwrap();
    let halt = agent.halt();
    let asker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        halt.request();
    });
    let run = tokio::time::timeout(Duration::from_secs(5), agent.run("go"))
        .await
        .expect("the halt ended a run that would go on forever");
    asker.await.unwrap();
    assert_eq!(run.stop, StopReason::Halted);
    assert_eq!(run.stop.task_status(), forkhive_core::TaskStatus::Completed);
    assert_eq!(run.turns.len(), 1, "no turn after the halted round");
    let last = agent.params().messages().last().unwrap().clone();
    assert_eq!(message_results(&last).len(), 1, "the round's result is in");
    assert!(!agent.halt().is_requested(), "taken by the run");

    // Waiting between turns for a promised message: the halt ends the wait.
    let b = brain(|_| Plan::Reply(say("done")));
    let mut agent = Agent::builder(b).model("m").build().await.unwrap();
    let promise = agent.pending().expect();
    let halt = agent.halt();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        halt.request();
    });
    let run = tokio::time::timeout(Duration::from_secs(5), agent.run("go"))
        .await
        .expect("the halt ended the wait");
    assert_eq!(run.stop, StopReason::Halted);
    drop(promise);
    // The next run is not halted.
    let run = agent.run("again").await;
    assert_eq!(run.stop, StopReason::Completed);
}

/// A backend that answers whole is asked with `send`, never `stream`; each text block reaches
/// the events as one delta; and the conversation is byte for byte the one a streamed run makes.
#[tokio::test]
async fn a_backend_that_answers_whole_is_sent_not_streamed_and_ends_the_same() {
    #[derive(Debug)]
    struct Counting {
        inner: ScriptedBackend,
        sends: AtomicUsize,
        streams: AtomicUsize,
    }
    #[async_trait]
    impl Backend for Counting {
        async fn send(&self, r: &Request) -> forkhive_transport::Result<Response> {
            self.sends.fetch_add(1, Ordering::SeqCst);
            self.inner.send(r).await
        }
        async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
            self.streams.fetch_add(1, Ordering::SeqCst);
            self.inner.stream(r).await
        }
        fn answers_whole(&self) -> bool {
            self.inner.answers_whole()
        }
    }
    const ANSWER: &str = "a fairly long answer, in one piece";
    let mut conversations = Vec::new();
    for whole in [false, true] {
        let script =
            ScriptedBackend::from_replies([Ok(calls(&[("l", "Look", "{}")])), Ok(say(ANSWER))]);
        let backend = Arc::new(Counting {
            inner: if whole {
                script.answering_whole()
            } else {
                script
            },
            sends: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
        });
        // Wrappers say what the backend they wrap says.
        assert_eq!(Arc::clone(&backend).answers_whole(), whole);
        let events = Arc::new(Events::default());
        let mut agent = Agent::builder(backend.clone())
            .model("m")
            .tools(ToolPool::new([TestTool::sleeper("Look", true, 1).arc()]).unwrap())
            .events(events.clone())
            .build()
            .await
            .unwrap();
        let run = agent.run("go").await;
        assert_eq!(run.stop, StopReason::Completed);
        let deltas: Vec<String> = events
            .take()
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::TextDelta { text } => Some(text),
                _ => None,
            })
            .collect();
        let asked = (
            backend.sends.load(Ordering::SeqCst),
            backend.streams.load(Ordering::SeqCst),
        );
        if whole {
            assert_eq!(asked, (2, 0), "(sends, streams)");
            assert_eq!(deltas, [ANSWER]);
        } else {
            assert_eq!(asked, (0, 2), "(sends, streams)");
            assert!(deltas.len() > 1, "streamed in chunks: {deltas:?}");
            assert_eq!(deltas.concat(), ANSWER);
        }
        let messages: Vec<&Message> = agent.params().messages().iter().collect();
        conversations.push(serde_json::to_string(&messages).unwrap());
    }
    assert_eq!(conversations[0], conversations[1]);
}
