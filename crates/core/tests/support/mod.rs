//! Shared proptest strategies for forkhive-core's integration tests.
#![allow(dead_code, unreachable_pub)]

use forkhive_core::{ContentBlock, ImageSource, Message, RawJson, Role, ToolResultContent};
use proptest::prelude::*;

/// Text that exercises JSON escaping: quotes, backslashes, control characters, non-ASCII.
pub fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        "\\PC{0,24}",
        Just("line1\nline2\t\"q\" \\ \u{1} \u{7f} é 😀 <tag> &amp;".to_owned()),
    ]
}

/// A compact or spaced JSON object, as a model might spell it.
pub fn arb_input() -> impl Strategy<Value = RawJson> {
    ("[a-z]{1,6}", arb_text(), any::<i32>(), prop::bool::ANY).prop_map(|(k, v, n, spaced)| {
        let v = serde_json::to_string(&v).unwrap_or_default();
        let text = if spaced {
            format!("{{ \"{k}\" : {v} ,\n \"n\": {n}.0 }}")
        } else {
            format!("{{\"{k}\":{v},\"n\":{n}}}")
        };
        RawJson::parse(&text).unwrap_or_else(|_| RawJson::empty_object())
    })
}

pub fn arb_block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        arb_text().prop_map(ContentBlock::text),
        (arb_text(), "[A-Za-z0-9+/]{0,12}").prop_map(|(thinking, signature)| {
            ContentBlock::Thinking {
                thinking,
                signature,
            }
        }),
        "[A-Za-z0-9]{1,12}".prop_map(|data| ContentBlock::RedactedThinking { data }),
        ("toolu_[a-z0-9]{4}", "[A-Z][a-z]{2,6}", arb_input())
            .prop_map(|(id, name, input)| ContentBlock::tool_use(id, name, input)),
        ("toolu_[a-z0-9]{4}", arb_text(), prop::bool::ANY).prop_map(|(id, t, e)| {
            ContentBlock::ToolResult {
                tool_use_id: id,
                content: ToolResultContent::Text(t),
                is_error: e,
            }
        }),
        "[A-Za-z0-9]{4,8}".prop_map(|data| ContentBlock::Image {
            source: ImageSource::Base64 {
                media_type: "image/png".into(),
                data
            }
        }),
    ]
}

pub fn arb_message() -> impl Strategy<Value = Message> {
    (prop::bool::ANY, prop::collection::vec(arb_block(), 1..4)).prop_map(|(user, content)| {
        Message {
            role: if user { Role::User } else { Role::Assistant },
            content,
        }
    })
}

pub fn arb_history() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(arb_message(), 0..12)
}

/// An assistant turn with `0..8` tool calls (unique ids) after some text.
pub fn arb_assistant() -> impl Strategy<Value = Message> {
    (
        arb_text(),
        prop::collection::vec(("[A-Z][a-z]{2,6}", arb_input()), 0..8),
    )
        .prop_map(|(text, calls)| {
            let mut content = vec![ContentBlock::text(text)];
            for (i, (name, input)) in calls.into_iter().enumerate() {
                content.push(ContentBlock::tool_use(format!("toolu_{i:02}"), name, input));
            }
            Message::assistant(content)
        })
}
