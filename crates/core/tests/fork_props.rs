#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties of fork children: byte-identical prefixes, and fingerprints that match a
//! from-scratch computation.

mod support;

use std::collections::BTreeSet;

use forkhive_core::fork::build_forked_messages;
use forkhive_core::json;
use forkhive_core::{CacheSafeParams, ForkPrefix, Message, ToolDefinition};
use proptest::prelude::*;
use support::*;

fn params(history: Vec<Message>) -> CacheSafeParams {
    CacheSafeParams::builder("model-x")
        .system_block("You are a careful engineer.")
        .system_context("os", "linux")
        .user_context("cwd", "/repo")
        .tool(ToolDefinition::new("Read", "Read a file", r#"{"type":"object"}"#).unwrap())
        .messages(history)
        .build()
}

fn directives() -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set(arb_text(), 2..16)
        .prop_map(|s: BTreeSet<String>| s.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// All children's encodings are identical once their directive is replaced by one marker,
    /// and the part they share is everything before the directive.
    #[test]
    fn children_differ_only_in_their_directive(
        history in arb_history(),
        assistant in arb_assistant(),
        directives in directives(),
    ) {
        let prefix = ForkPrefix::new(params(history), assistant).unwrap();
        let mut masked = BTreeSet::new();
        let mut heads = BTreeSet::new();
        for d in &directives {
            let encoded = serde_json::to_string(&prefix.child(d).to_messages()).unwrap();
            let mut escaped = Vec::new();
            json::escape_str_into(&mut escaped, d);
            let tail = format!("{}\"}}]}}]", String::from_utf8(escaped).unwrap());
            prop_assert!(encoded.ends_with(&tail), "the directive must be the last thing encoded");
            let head = &encoded[..encoded.len() - tail.len()];
            prop_assert!(head.ends_with("fork-directive: "));
            heads.insert(head.to_owned());
            masked.insert(format!("{head}<<DIRECTIVE>>\"}}]}}]"));
        }
        prop_assert_eq!(heads.len(), 1, "every child shares everything before its directive");
        prop_assert_eq!(masked.len(), 1);
    }

    /// The materialised child equals history + build_forked_messages, and its incremental
    /// fingerprint equals one computed from scratch.
    #[test]
    fn child_matches_reference_construction(
        history in arb_history(),
        assistant in arb_assistant(),
        directive in arb_text(),
    ) {
        let p = params(history.clone());
        let prefix = ForkPrefix::new(p.clone(), assistant.clone()).unwrap();
        let child = prefix.child(&directive);
        let mut expected = history;
        expected.extend(build_forked_messages(&directive, &assistant).unwrap());
        prop_assert_eq!(&child.to_messages(), &expected);
        let scratch = p.with_messages(expected);
        prop_assert_eq!(child.fingerprint().total(), scratch.fingerprint().total());
        prop_assert_eq!(child.fingerprint().diff(scratch.fingerprint()), None);
    }

    /// Same inputs, same bytes and same digests, whatever order things are built in.
    #[test]
    fn fingerprints_are_deterministic(history in arb_history(), assistant in arb_assistant()) {
        let a = ForkPrefix::new(params(history.clone()), assistant.clone()).unwrap();
        let b = ForkPrefix::new(params(history), assistant).unwrap();
        let (x, y) = (a.child("same"), b.child("same"));
        prop_assert_eq!(x.fingerprint().total(), y.fingerprint().total());
        prop_assert_eq!(
            serde_json::to_vec(&x.to_messages()).unwrap(),
            serde_json::to_vec(&y.to_messages()).unwrap()
        );
    }

    /// Messages survive a JSON round trip byte for byte.
    #[test]
    fn messages_round_trip_byte_for_byte(history in arb_history()) {
        let bytes = serde_json::to_vec(&history).unwrap();
        let back: Vec<Message> = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(&back, &history);
        prop_assert_eq!(serde_json::to_vec(&back).unwrap(), bytes);
    }
}

#[test]
fn siblings_diverge_exactly_at_the_directive() {
    let prefix = ForkPrefix::new(
        params(vec![Message::user_text("go")]),
        Message::assistant(vec![forkhive_core::ContentBlock::text("splitting")]),
    )
    .unwrap();
    let a = serde_json::to_string(&prefix.child("alpha").to_messages()).unwrap();
    let b = serde_json::to_string(&prefix.child("beta").to_messages()).unwrap();
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    assert!(
        a[..common].ends_with("fork-directive: "),
        "{}",
        &a[..common]
    );
}

/// A fork child made from a parent turn that made no tool calls (the transport crate's own
/// example forks from `Message::assistant_text("Splitting the audit.")`, and
/// `build_forked_messages` documents that case) is still a fork child: the message-scanning
/// half of the recursive-fork guard must recognise the conversations this crate builds.
#[test]
fn a_fork_child_of_a_turn_without_tool_calls_is_a_fork_child() {
    use forkhive_core::fork::is_in_fork_child;
    let history = vec![Message::user_text("Audit the repository.")];
    let turn = Message::assistant_text("Splitting the audit.");
    let prefix = ForkPrefix::new(params(history.clone()), turn.clone()).unwrap();
    let child = prefix.child("audit src/a").to_messages();
    assert!(is_in_fork_child(&child), "ForkPrefix child: {child:?}");
    let mut built = history;
    built.extend(build_forked_messages("audit src/a", &turn).unwrap());
    assert!(is_in_fork_child(&built), "build_forked_messages: {built:?}");
}
