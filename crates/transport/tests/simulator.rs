//! The prompt-cache simulator against each rule it claims to apply.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{
    CacheSafeParams, ContentBlock, ForkPrefix, Message, RawJson, ThinkingConfig, ToolDefinition,
    Usage,
};
use forkhive_transport::codec::StreamDecoder;
use forkhive_transport::simulator::{
    ManualClock, PromptCacheSimulator, SimulatedProvider, SimulatorConfig,
};
use forkhive_transport::{
    AnthropicCodec, Backend, BackendExt, CachePolicy, CacheTtl, Codec, EncodedBody, Error,
    EventStream, Request, Response, ScriptedBackend, WireFormat,
};

fn echo() -> ScriptedBackend {
    ScriptedBackend::from_fn(|_| {
        Ok(Response::text(
            "ok",
            Usage {
                output_tokens: 1,
                ..Usage::default()
            },
        ))
    })
}

/// ~`tokens` tokens of history in `turns` exchanges.
fn params_with(system: &str, turns: usize, tokens_per_turn: usize) -> CacheSafeParams {
    let mut history = Vec::new();
    for i in 0..turns {
        history.push(Message::user_text(format!(
            "{i}:{}",
            "u".repeat(tokens_per_turn * 2)
        )));
        history.push(Message::assistant_text(format!(
            "{i}:{}",
            "a".repeat(tokens_per_turn * 2)
        )));
    }
    CacheSafeParams::builder("claude-sonnet-4-5")
        .tool(ToolDefinition::new("Read", "Read a file", r#"{"type":"object"}"#).unwrap())
        .system_block(system)
        .messages(history)
        .build()
}

fn sim(clock: &ManualClock) -> PromptCacheSimulator<ScriptedBackend> {
    PromptCacheSimulator::anthropic(echo()).with_clock(Arc::new(clock.clone()))
}

fn turn(n: usize) -> Message {
    let mut content = vec![ContentBlock::text("Splitting the work.")];
    for i in 0..n {
        content.push(ContentBlock::tool_use(
            format!("toolu_{i}"),
            "Agent",
            RawJson::parse(r#"{"prompt":"x"}"#).unwrap(),
        ));
    }
    Message::assistant(content)
}

#[tokio::test]
async fn fork_children_after_the_first_read_the_shared_prefix() {
    let clock = ManualClock::new();
    let s = sim(&clock);
    let params = params_with("You are careful.", 20, 100);
    // The parent's own request writes the prefix.
    let parent = s.send(&Request::new(params.clone(), vec![])).await.unwrap();
    assert!(parent.usage.cache_write_tokens > 2000, "{:?}", parent.usage);
    let prefix = ForkPrefix::new(params, turn(3)).unwrap();
    let mut usages = Vec::new();
    for d in ["net", "db", "cli"] {
        usages.push(s.send(&Request::fork(prefix.child(d))).await.unwrap().usage);
    }
    // Child 1 reads the parent's prefix and writes the shared fork part.
    assert_eq!(usages[0].cache_read_tokens, parent.usage.cache_write_tokens);
    assert!(usages[0].cache_write_tokens > 0);
    // Children 2 and 3 read everything up to their directive.
    for u in &usages[1..] {
        assert_eq!(
            u.cache_read_tokens,
            usages[0].cache_read_tokens + usages[0].cache_write_tokens
        );
        assert_eq!(u.cache_write_tokens, 0);
        // Caching ends at a block boundary: only the final block (boilerplate + directive)
        // is uncached.
        let last_block = forkhive_transport::simulator::estimate_tokens(
            serde_json::to_string(&ContentBlock::text(prefix.child("net").child_message()))
                .unwrap()
                .len(),
        );
        assert!(
            u.input_tokens.abs_diff(last_block) <= 2,
            "{u:?} vs {last_block}"
        );
    }
    let reports = s.reports();
    assert_eq!(reports.len(), 4);
    assert_eq!(reports[2].breakpoints.len(), 4);
}

#[tokio::test]
async fn any_changed_byte_before_a_breakpoint_is_a_miss() {
    let clock = ManualClock::new();
    let s = sim(&clock);
    let system = format!("You are careful.{}", "x".repeat(6000)); // ~1,500 tokens: cacheable alone
    let a = params_with(&system, 10, 100);
    let first = s
        .send(&Request::new(a.clone(), vec![]))
        .await
        .unwrap()
        .usage;
    let system_end = s.reports()[0].breakpoints[1];
    // One byte of the system prompt: nothing before the messages is reusable.
    let b = params_with(&system.replacen("careful.", "careful!", 1), 10, 100);
    let u = s.send(&Request::new(b, vec![])).await.unwrap().usage;
    assert_eq!(
        (u.cache_read_tokens, u.cache_write_tokens),
        (0, first.cache_write_tokens),
        "{u:?}"
    );
    // One byte of the last message: the read stops at the system prompt's breakpoint.
    let mut msgs = a.messages().to_vec();
    let last = msgs.len() - 1;
    msgs[last] = Message::assistant_text("changed");
    let u = s
        .send(&Request::new(a.with_messages(msgs), vec![]))
        .await
        .unwrap()
        .usage;
    assert_eq!(s.reports()[2].hit_at, Some(system_end));
    assert!(
        u.cache_read_tokens >= 1500 && u.cache_read_tokens < first.cache_write_tokens,
        "{u:?}"
    );
}

#[tokio::test]
async fn short_prompts_are_never_cached() {
    let clock = ManualClock::new();
    let s = sim(&clock);
    let p = params_with("tiny", 1, 10);
    for _ in 0..2 {
        let u = s
            .send(&Request::new(p.clone(), vec![]))
            .await
            .unwrap()
            .usage;
        assert_eq!((u.cache_read_tokens, u.cache_write_tokens), (0, 0));
        assert!(u.input_tokens > 0);
    }
}

#[tokio::test]
async fn the_lookback_spans_twenty_block_positions() {
    let clock = ManualClock::new();
    let policy = CachePolicy {
        suffix: false,
        ..CachePolicy::default()
    };
    let s = PromptCacheSimulator::new(
        echo(),
        SimulatorConfig::new(SimulatedProvider::Anthropic),
        Box::new(AnthropicCodec::new(policy)),
        Arc::new(clock.clone()),
    );
    let base = params_with("system prompt", 10, 100);
    s.send(&Request::new(base.clone(), vec![])).await.unwrap();
    let written = s.reports()[0].cache_write_tokens;
    // Grow the prefix by `k` one-block messages; the new breakpoint is `k` positions later.
    let grown = |k: usize| {
        let mut m = base.messages().to_vec();
        for i in 0..k {
            m.push(if i % 2 == 0 {
                Message::user_text(format!("q{i}"))
            } else {
                Message::assistant_text(format!("a{i}"))
            });
        }
        base.with_messages(m)
    };
    let u = s
        .send(&Request::new(grown(19), vec![]))
        .await
        .unwrap()
        .usage;
    assert_eq!(
        u.cache_read_tokens, written,
        "19 positions back is within the window of 20"
    );
    s.clear();
    s.send(&Request::new(base.clone(), vec![])).await.unwrap();
    let u = s
        .send(&Request::new(grown(20), vec![]))
        .await
        .unwrap()
        .usage;
    assert!(
        u.cache_read_tokens < written,
        "20 positions back is outside: {u:?}"
    );
}

#[tokio::test]
async fn ttls_expire_and_hits_refresh_them() {
    let clock = ManualClock::new();
    let s = sim(&clock);
    let p = params_with("sys", 10, 100);
    let r = || Request::new(p.clone(), vec![]);
    s.send(&r()).await.unwrap();
    clock.advance(Duration::from_secs(240));
    assert!(s.send(&r()).await.unwrap().usage.cache_read_tokens > 0);
    clock.advance(Duration::from_secs(240)); // 8 minutes after the write, 4 after the hit
    assert!(
        s.send(&r()).await.unwrap().usage.cache_read_tokens > 0,
        "the hit refreshed the TTL"
    );
    clock.advance(Duration::from_secs(301));
    assert_eq!(
        s.send(&r()).await.unwrap().usage.cache_read_tokens,
        0,
        "expired"
    );

    let clock = ManualClock::new();
    let s = PromptCacheSimulator::new(
        echo(),
        SimulatorConfig::new(SimulatedProvider::Anthropic),
        Box::new(AnthropicCodec::new(CachePolicy {
            ttl: CacheTtl::OneHour,
            ..CachePolicy::default()
        })),
        Arc::new(clock.clone()),
    );
    let u = s.send(&r()).await.unwrap().usage;
    assert_eq!(u.cache_write_1h_tokens, u.cache_write_tokens);
    clock.advance(Duration::from_secs(1800));
    assert!(s.send(&r()).await.unwrap().usage.cache_read_tokens > 0);
}

/// Answers only once `n` requests are waiting: they are all in flight at once.
#[derive(Debug)]
struct Gate(tokio::sync::Barrier, ScriptedBackend);

#[async_trait]
impl Backend for Gate {
    async fn send(&self, request: &Request) -> forkhive_transport::Result<Response> {
        self.0.wait().await;
        self.1.send(request).await
    }
    async fn stream(&self, request: &Request) -> forkhive_transport::Result<EventStream> {
        self.0.wait().await;
        self.1.stream(request).await
    }
}

#[tokio::test]
async fn requests_in_parallel_with_the_writer_miss() {
    let s = PromptCacheSimulator::anthropic(Gate(tokio::sync::Barrier::new(2), echo()));
    let p = params_with("sys", 10, 100);
    let (r1, r2) = (
        Request::new(p.clone(), vec![]),
        Request::new(p.clone(), vec![]),
    );
    let (a, b) = tokio::join!(s.send(&r1), s.send(&r2));
    let (a, b) = (a.unwrap().usage, b.unwrap().usage);
    assert_eq!((a.cache_read_tokens, b.cache_read_tokens), (0, 0));
    assert!(a.cache_write_tokens > 0 && b.cache_write_tokens > 0);
}

#[tokio::test]
async fn thinking_changes_keep_tool_and_system_entries() {
    let s = PromptCacheSimulator::anthropic(echo());
    let p = params_with(&"s".repeat(6000), 10, 100);
    let first = s
        .send(&Request::new(p.clone(), vec![]))
        .await
        .unwrap()
        .usage;
    let mut r = Request::new(p, vec![]);
    r.settings.thinking = Some(ThinkingConfig::Enabled {
        budget_tokens: 2048,
    });
    let u = s.send(&r).await.unwrap().usage;
    assert!(
        u.cache_read_tokens >= 1500,
        "tools and system still hit: {u:?}"
    );
    assert!(
        u.cache_read_tokens < first.cache_write_tokens,
        "messages miss: {u:?}"
    );
}

/// Every per-call setting that the simulator (by the provider's rules) lets break the messages
/// cache is named by `Request::cache_break`, which `PrefixFingerprint::diff` cannot see; what
/// breaks nothing on the wire (`max_tokens` without an effort, an effort's budget equal to an
/// explicit thinking config, prefixes whose thinking a per-call override replaces, any setting
/// under OpenAI's prefix-only cache) is no break; and `cache_break` says `None` exactly when
/// the simulator reads everything the first request wrote.
#[tokio::test]
async fn each_per_call_setting_that_breaks_the_cache_is_named() {
    use forkhive_core::{CacheBreak, Change};
    use forkhive_transport::{Effort, ToolChoice};
    let p = params_with(&"s".repeat(6000), 10, 100);
    let base = || Request::new(p.clone(), vec![]);
    let thinking = |budget_tokens: u32| {
        move |mut r: Request| {
            r.settings.thinking = Some(ThinkingConfig::Enabled { budget_tokens });
            r
        }
    };
    let tool_choice = |choice: ToolChoice| {
        move |mut r: Request| {
            r.settings.tool_choice = Some(choice.clone());
            r
        }
    };
    let effort = |e: Effort| {
        move |mut r: Request| {
            r.settings.effort = Some(e);
            r
        }
    };
    let max_tokens = |n: u32| move |r: Request| r.with_max_tokens(n);
    let with_messages = |r: Request| {
        Request::new(p.clone(), vec![Message::user_text("one more")]).with_settings(r.settings)
    };
    // The prefix's own thinking, which a per-call override replaces on the wire.
    let prefix_thinking = |budget_tokens: u32| {
        let mut b =
            CacheSafeParams::builder(p.model()).thinking(ThinkingConfig::Enabled { budget_tokens });
        for s in p.system_prompt() {
            b = b.system_block(s.clone());
        }
        for t in p.tools() {
            b = b.tool(t.clone());
        }
        Request::new(b.messages(p.messages().to_vec()).build(), vec![])
    };
    let budget = Effort::High.thinking_budget();
    type Case = (&'static str, Request, Request, Option<CacheBreak>);
    let cases: Vec<Case> = vec![
        (
            "thinking",
            base(),
            thinking(2048)(base()),
            Some(CacheBreak::Thinking),
        ),
        (
            "tool_choice",
            base(),
            tool_choice(ToolChoice::None)(base()),
            Some(CacheBreak::ToolChoice),
        ),
        (
            "tool_choice auto",
            base(),
            tool_choice(ToolChoice::Auto)(base()),
            Some(CacheBreak::ToolChoice),
        ),
        (
            "effort",
            base(),
            effort(Effort::High)(base()),
            Some(CacheBreak::Effort),
        ),
        (
            "max_tokens under an effort",
            effort(Effort::Max)(base()),
            max_tokens(8_000)(effort(Effort::Max)(base())),
            Some(CacheBreak::Effort),
        ),
        (
            "an effort under a thinking config",
            thinking(2048)(base()),
            effort(Effort::High)(thinking(2048)(base())),
            None,
        ),
        (
            "an effort's budget sent as a thinking config",
            effort(Effort::High)(base()),
            thinking(budget)(base()),
            None,
        ),
        (
            "prefix thinking a per-call override replaces",
            thinking(2048)(prefix_thinking(1024)),
            thinking(2048)(prefix_thinking(4096)),
            None,
        ),
        ("max_tokens", base(), max_tokens(999)(base()), None),
        ("a message more", base(), with_messages(base()), None),
    ];
    for (what, earlier, later, named) in cases {
        assert_eq!(
            earlier.cache_break(&later, WireFormat::Anthropic),
            named,
            "{what}"
        );
        let s = PromptCacheSimulator::anthropic(echo());
        let first = s.send(&earlier).await.unwrap().usage;
        let u = s.send(&later).await.unwrap().usage;
        let read_all = u.cache_read_tokens == first.cache_write_tokens;
        assert_eq!(read_all, named.is_none(), "{what}: {first:?} then {u:?}");
        // OpenAI's cache matches the prompt's prefix alone: no setting breaks it.
        assert_eq!(
            earlier.cache_break(&later, WireFormat::OpenAi),
            None,
            "{what}"
        );
        let read_after = |second: Request| {
            let earlier = earlier.clone();
            async move {
                let s = PromptCacheSimulator::openai(echo());
                s.send(&earlier).await.unwrap();
                s.send(&second).await.unwrap().usage.cache_read_tokens
            }
        };
        assert_eq!(
            read_after(later).await,
            read_after(earlier.clone()).await,
            "{what} (OpenAI): reads as much as the same request again"
        );
    }
    assert_eq!(
        CacheBreak::Effort.to_string(),
        "the thinking budget the effort sets changed"
    );
    // A setting never hides an earlier break: the system block is named, not the setting.
    let other = Request::new(params_with(&"t".repeat(6000), 10, 100), vec![])
        .with_settings(tool_choice(ToolChoice::None)(base()).settings);
    assert_eq!(
        base().cache_break(&other, WireFormat::Anthropic),
        Some(CacheBreak::SystemPrompt {
            block: 0,
            change: Change::Changed
        })
    );
    // And a message edited under equal settings is the message.
    let edited = Request::new(
        p.with_messages({
            let mut m = p.messages().to_vec();
            m[3] = Message::user_text("edited");
            m
        }),
        vec![],
    );
    assert_eq!(
        base().cache_break(&edited, WireFormat::Anthropic),
        Some(CacheBreak::Message {
            index: 3,
            change: Change::Changed
        })
    );
}

#[tokio::test]
async fn streaming_reports_the_same_usage() {
    let s = PromptCacheSimulator::anthropic(echo());
    let p = params_with("sys", 10, 100);
    let sent = s
        .send(&Request::new(p.clone(), vec![]))
        .await
        .unwrap()
        .usage;
    let streamed = s
        .stream_to_response(&Request::new(p, vec![]))
        .await
        .unwrap()
        .usage;
    assert_eq!(streamed.cache_read_tokens, sent.cache_write_tokens);
    assert_eq!(streamed.output_tokens, 1);
}

/// A codec that sends a fixed body, to feed the simulator hostile input.
#[derive(Debug)]
struct Fixed(&'static str);

impl Codec for Fixed {
    fn wire(&self) -> WireFormat {
        WireFormat::Anthropic
    }
    fn encode(&self, _: &Request, _: bool) -> EncodedBody {
        EncodedBody::from_chunks(vec![self.0.as_bytes().to_vec().into()])
    }
    fn decode_response(&self, b: &[u8]) -> forkhive_transport::Result<Response> {
        AnthropicCodec::default().decode_response(b)
    }
    fn stream_decoder(&self) -> Box<dyn StreamDecoder> {
        AnthropicCodec::default().stream_decoder()
    }
    fn error_message(&self, _: &[u8]) -> Option<(String, String)> {
        None
    }
}

async fn fixed_error(body: &'static str) -> Error {
    let s = PromptCacheSimulator::new(
        echo(),
        SimulatorConfig::new(SimulatedProvider::Anthropic),
        Box::new(Fixed(body)),
        Arc::new(ManualClock::new()),
    );
    s.send(&Request::new(CacheSafeParams::builder("m").build(), vec![]))
        .await
        .unwrap_err()
}

#[tokio::test]
async fn invalid_breakpoints_are_rejected_like_the_provider_does() {
    const CC: &str = r#""cache_control":{"type":"ephemeral"}"#;
    let five = Box::leak(
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{}]}}]}}"#,
            (0..5)
                .map(|i| format!(r#"{{"type":"text","text":"{i}",{CC}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        )
        .into_boxed_str(),
    );
    let err = fixed_error(five).await;
    assert_eq!(
        err.to_string(),
        "invalid request (HTTP 400): A maximum of 4 blocks with cache_control may be provided. Found 5."
    );

    let order = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}"#;
    let err = fixed_error(order).await;
    assert!(
        err.to_string()
            .contains("ttl 1h (block 1) comes after one with ttl 5m"),
        "{err}"
    );

    let bad_ttl = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"2h"}}]}]}"#;
    assert!(
        fixed_error(bad_ttl)
            .await
            .to_string()
            .contains(r#"cache_control.ttl must be "5m" or "1h", found "2h""#)
    );

    let err = fixed_error(r#"{"model":"m"}"#).await;
    assert!(err.to_string().starts_with("invalid request (HTTP 400): the request body is not a valid request: missing field `messages`"), "{err}");
}

#[tokio::test]
async fn openai_rules_cache_automatically_in_128_token_steps() {
    let s = PromptCacheSimulator::openai(echo());
    let p = params_with("sys", 20, 100);
    let first = s
        .send(&Request::new(p.clone(), vec![Message::user_text("one")]))
        .await
        .unwrap()
        .usage;
    assert_eq!((first.cache_read_tokens, first.cache_write_tokens), (0, 0));
    let second = s
        .send(&Request::new(p, vec![Message::user_text("two")]))
        .await
        .unwrap()
        .usage;
    assert!(
        second.cache_read_tokens >= 1024 && second.cache_read_tokens % 128 == 0,
        "{second:?}"
    );
    assert!(second.input_tokens < 140, "{second:?}");
}

/// Fails the `n`-th request (1-based) after all `gate` requests are in flight.
#[derive(Debug)]
struct GateFailing(tokio::sync::Barrier, std::sync::atomic::AtomicUsize, usize);

#[async_trait]
impl Backend for GateFailing {
    async fn send(&self, _: &Request) -> forkhive_transport::Result<Response> {
        let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.0.wait().await;
        if n == self.2 {
            // Let the other writer's answer begin first.
            tokio::task::yield_now().await;
            Err(Error::from_status(500, "boom".into(), None))
        } else {
            Ok(Response::text(
                "ok",
                Usage {
                    output_tokens: 1,
                    ..Usage::default()
                },
            ))
        }
    }
    async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
        echo().stream(r).await
    }
}

#[tokio::test]
async fn a_failing_parallel_writer_does_not_erase_a_successful_write() {
    let s = PromptCacheSimulator::anthropic(GateFailing(tokio::sync::Barrier::new(2), 0.into(), 2));
    let p = params_with("sys", 10, 100);
    let (r1, r2) = (
        Request::new(p.clone(), vec![]),
        Request::new(p.clone(), vec![]),
    );
    let (a, b) = tokio::join!(s.send(&r1), s.send(&r2));
    let written = a.unwrap().usage.cache_write_tokens;
    assert!(written > 0);
    assert!(b.is_err());
    // Request 3 succeeds (the backend fails only request 2) and reads request 1's write.
    let (r3, r4) = (Request::new(p.clone(), vec![]), Request::new(p, vec![]));
    let (c, d) = tokio::join!(s.send(&r3), s.send(&r4));
    assert_eq!(c.unwrap().usage.cache_read_tokens, written);
    assert_eq!(d.unwrap().usage.cache_read_tokens, written);
}

#[tokio::test]
async fn a_cancelled_request_leaves_nothing_pending() {
    /// Never answers.
    #[derive(Debug)]
    struct Never;
    #[async_trait]
    impl Backend for Never {
        async fn send(&self, _: &Request) -> forkhive_transport::Result<Response> {
            std::future::pending().await
        }
        async fn stream(&self, _: &Request) -> forkhive_transport::Result<EventStream> {
            std::future::pending().await
        }
    }
    let never = PromptCacheSimulator::anthropic(Never);
    let r = Request::new(params_with("sys", 10, 100), vec![]);
    let send = never.send(&r);
    let timed_out = tokio::time::timeout(Duration::from_millis(20), send).await;
    assert!(timed_out.is_err());
    assert_eq!(
        never.stats().pending,
        0,
        "the dropped request's writes were withdrawn"
    );
    let stream = tokio::time::timeout(Duration::from_millis(20), never.stream(&r)).await;
    assert!(stream.is_err());
    assert_eq!(
        never.stats(),
        forkhive_transport::simulator::CacheStats {
            live: 0,
            pending: 0
        }
    );

    // A stream dropped before its first event withdraws its writes too.
    let s = PromptCacheSimulator::anthropic(echo());
    let unread = s.stream(&r).await.unwrap();
    assert!(s.stats().pending > 0);
    drop(unread);
    assert_eq!(s.stats().pending, 0);
    s.send(&r).await.unwrap();
    assert!(s.stats().live > 0 && s.stats().pending == 0);
}

#[tokio::test]
async fn openai_rewrites_an_expired_prefix() {
    let clock = ManualClock::new();
    let s = PromptCacheSimulator::openai(echo()).with_clock(Arc::new(clock.clone()));
    let r = Request::new(params_with("sys", 20, 100), vec![]);
    s.send(&r).await.unwrap();
    clock.advance(Duration::from_secs(301));
    assert_eq!(
        s.send(&r).await.unwrap().usage.cache_read_tokens,
        0,
        "expired"
    );
    assert!(
        s.send(&r).await.unwrap().usage.cache_read_tokens > 0,
        "written again after expiry"
    );
}
