//! Properties of the wire codecs: deterministic bytes, fork children that share everything up
//! to their directive, the fork fast path equal to a from-scratch encoding, and conversations
//! grown by `append` and encoded turn by turn from the memo equal to from-scratch encodings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkhive_core::{
    CacheSafeParams, ContentBlock, ForkPrefix, Message, RawJson, ToolDefinition, json,
};
use forkhive_transport::codec::MemoConfig;
use forkhive_transport::{AnthropicCodec, CachePolicy, CacheTtl, Codec, OpenAiCodec, Request};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{1,30}",
        "\\PC{1,16}",
        Just("q\"uote\\ \n\t\u{1} é".to_owned())
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        text().prop_map(Message::user_text),
        text().prop_map(Message::assistant_text),
        (text(), "[a-z]{1,5}").prop_map(|(t, k)| Message::assistant(vec![
            ContentBlock::text(t),
            ContentBlock::tool_use(
                "toolu_h",
                "Read",
                RawJson::parse(&format!(r#"{{ "{k}" : 1.0 }}"#)).unwrap()
            ),
        ])),
        text().prop_map(|t| Message::user(vec![
            ContentBlock::tool_result_text("toolu_h", t),
            ContentBlock::text("next")
        ])),
        Just(Message::assistant(vec![ContentBlock::Thinking {
            thinking: "t".into(),
            signature: "s".into()
        }])),
    ]
}

fn params() -> impl Strategy<Value = CacheSafeParams> {
    (
        prop::collection::vec(message(), 0..8),
        prop::option::of(text()),
        prop::bool::ANY,
        prop::option::of(text()),
    )
        .prop_map(|(history, system, tool, user_ctx)| {
            let mut b = CacheSafeParams::builder("m").messages(history);
            if let Some(s) = system {
                b = b.system_block(s);
            }
            if tool {
                b = b.tool(ToolDefinition::new("Read", "read", r#"{"type":"object"}"#).unwrap());
            }
            if let Some(u) = user_ctx {
                b = b.user_context("cwd", u);
            }
            b.build()
        })
}

fn turn() -> impl Strategy<Value = Message> {
    (prop::option::of(text()), 0usize..5, prop::bool::ANY).prop_map(|(t, calls, thinking)| {
        let mut content = Vec::new();
        if thinking {
            content.push(ContentBlock::Thinking {
                thinking: "plan".into(),
                signature: "sig".into(),
            });
        }
        if let Some(t) = t {
            content.push(ContentBlock::text(t));
        }
        for i in 0..calls {
            content.push(ContentBlock::tool_use(
                format!("toolu_{i}"),
                "Agent",
                RawJson::parse(r#"{"prompt":"p"}"#).unwrap(),
            ));
        }
        Message::assistant(content)
    })
}

fn codecs() -> [Box<dyn Codec>; 2] {
    [
        Box::new(AnthropicCodec::default()),
        Box::new(OpenAiCodec::default()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fork_bodies_share_all_but_the_directive_and_match_fresh_encodings(
        p in params(),
        t in turn(),
        directives in prop::collection::btree_set(text(), 2..6),
        stream in prop::bool::ANY,
    ) {
        let prefix = ForkPrefix::new(p.clone(), t).unwrap();
        for (fast, fresh) in codecs().into_iter().zip(codecs()) {
            let mut heads = std::collections::BTreeSet::new();
            for d in &directives {
                let child = prefix.child(d);
                let body = fast.encode(&Request::fork(child.clone()), stream).to_bytes();
                // Valid JSON, and the same bytes as the generic path of a fresh codec.
                serde_json::from_slice::<serde_json::Value>(&body).unwrap();
                let generic = fresh.encode(&Request::new(p.clone(), child.suffix().to_vec()), stream).to_bytes();
                prop_assert_eq!(&body, &generic, "{} codec", fast.wire());
                // The child's own chunk starts with its escaped directive; everything before
                // it is shared by every sibling.
                let chunks = fast.encode(&Request::fork(child), stream);
                let (own, shared) = chunks.chunks().split_last().unwrap();
                let mut escaped = Vec::new();
                json::escape_str_into(&mut escaped, d);
                prop_assert!(own.starts_with(&escaped));
                heads.insert(shared.iter().flat_map(|c| c.iter().copied()).collect::<Vec<u8>>());
            }
            prop_assert_eq!(heads.len(), 1, "{} codec: siblings differ before their directive", fast.wire());
        }
    }

    #[test]
    fn encoding_is_deterministic(p in params(), suffix in prop::collection::vec(message(), 0..3)) {
        for (a, b) in codecs().into_iter().zip(codecs()) {
            let r = Request::new(p.clone(), suffix.clone());
            prop_assert_eq!(a.encode(&r, false).to_bytes(), b.encode(&r, false).to_bytes());
            // Encoding twice with one codec (the second from its memo) gives the same bytes.
            prop_assert_eq!(a.encode(&r, true).to_bytes(), a.encode(&r, true).to_bytes());
        }
    }

    #[test]
    fn anthropic_breakpoints_stay_within_the_limit_and_off_thinking(p in params(), t in turn(), d in text()) {
        let prefix = ForkPrefix::new(p, t).unwrap();
        let body = AnthropicCodec::default().encode(&Request::fork(prefix.child(&d)), false).to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let mut marks = 0;
        let mut check = |block: &serde_json::Value| {
            if block.get("cache_control").is_some() {
                marks += 1;
                assert_ne!(block["type"], "thinking");
                assert!(block.get("text").is_none_or(|t| t != ""));
            }
        };
        for key in ["tools", "system"] {
            for b in v[key].as_array().into_iter().flatten() {
                check(b);
            }
        }
        for m in v["messages"].as_array().unwrap() {
            for b in m["content"].as_array().unwrap() {
                check(b);
            }
        }
        prop_assert!(marks <= 4, "{marks} breakpoints");
    }
}

/// The head of a conversation: system block, tool, user and system context, each optional.
#[derive(Debug, Clone)]
struct Head {
    system: Option<String>,
    tool: bool,
    user_ctx: Option<String>,
    system_ctx: Option<String>,
}

fn head() -> impl Strategy<Value = Head> {
    (
        prop::option::of(text()),
        prop::bool::ANY,
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(|(system, tool, user_ctx, system_ctx)| Head {
            system,
            tool,
            user_ctx,
            system_ctx,
        })
}

/// A from-scratch build: `builder().messages(messages)` with the head's parts.
fn build(h: &Head, messages: Vec<Message>) -> CacheSafeParams {
    let mut b = CacheSafeParams::builder("m").messages(messages);
    if let Some(s) = &h.system {
        b = b.system_block(s);
    }
    if h.tool {
        b = b.tool(ToolDefinition::new("Read", "read", r#"{"type":"object"}"#).unwrap());
    }
    if let Some(u) = &h.user_ctx {
        b = b.user_context("cwd", u);
    }
    if let Some(c) = &h.system_ctx {
        b = b.system_context("os", c);
    }
    b.build()
}

/// Messages of every kind, including ones a format writes nothing for (OpenAI: a user message
/// without content) and ones without a cacheable block.
fn any_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        6 => message(),
        1 => Just(Message::user(vec![])),
        1 => Just(Message::user_text("")),
    ]
}

fn policy() -> impl Strategy<Value = CachePolicy> {
    (prop::bool::ANY, prop::bool::ANY, prop::bool::ANY).prop_map(
        |(prefix_messages, suffix, hour)| CachePolicy {
            prefix_messages,
            suffix,
            ttl: if hour {
                CacheTtl::OneHour
            } else {
                CacheTtl::FiveMinutes
            },
            ..CachePolicy::default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A conversation grown by repeated `append` and encoded every turn by one codec (whose
    /// memos are warm from the earlier turns, or too small to hold the conversation) gives the
    /// bytes of the same conversation built from scratch with `builder().messages(...)` and
    /// encoded by a fresh codec, for both codecs.
    #[test]
    fn appended_conversations_encode_like_scratch_builds(
        h in head(),
        history in prop::collection::vec(any_message(), 0..6),
        turns in prop::collection::vec(prop::collection::vec(any_message(), 0..4), 1..16),
        suffix in prop::collection::vec(any_message(), 0..2),
        policy in policy(),
        stream in prop::bool::ANY,
        tiny in prop::bool::ANY,
    ) {
        let mut memo = MemoConfig::default();
        if tiny {
            memo.message_entries = 3;
            memo.prefix_entries = 1;
        }
        let warm: [Box<dyn Codec>; 2] = [
            Box::new(AnthropicCodec::with_memo(policy, memo)),
            Box::new(OpenAiCodec::with_memo(memo)),
        ];
        let mut all = history.clone();
        let mut p = build(&h, history);
        for more in turns {
            p = p.append(more.clone());
            all.extend(more);
            let scratch = build(&h, all.clone());
            let fresh: [Box<dyn Codec>; 2] =
                [Box::new(AnthropicCodec::new(policy)), Box::new(OpenAiCodec::new())];
            for (codec, fresh) in warm.iter().zip(fresh) {
                let body = codec.encode(&Request::new(p.clone(), suffix.clone()), stream).to_bytes();
                let expected = fresh.encode(&Request::new(scratch.clone(), suffix.clone()), stream).to_bytes();
                prop_assert_eq!(&body, &expected, "{} codec", codec.wire());
                serde_json::from_slice::<serde_json::Value>(&body)
                    .unwrap_or_else(|e| panic!("{} codec: {e}: {}", codec.wire(), String::from_utf8_lossy(&body)));
            }
        }
    }
}
