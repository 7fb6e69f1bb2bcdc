#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties of `CacheSafeParams::append`: the same fingerprint as a from-scratch build, a
//! `diff` that agrees with one, and a result that shares what it extends.

mod support;

use forkhive_core::{CacheBreak, CacheSafeParams, Change, Message, ToolDefinition};
use proptest::prelude::*;
use support::*;

fn base(history: Vec<Message>) -> CacheSafeParams {
    CacheSafeParams::builder("model-x")
        .system_block("You are a careful engineer.")
        .system_context("os", "linux")
        .user_context("cwd", "/repo")
        .tool(ToolDefinition::new("Read", "Read a file", r#"{"type":"object"}"#).unwrap())
        .messages(history)
        .build()
}

/// A conversation as batches of appended messages (a batch may be empty).
fn batches() -> impl Strategy<Value = Vec<Vec<Message>>> {
    prop::collection::vec(prop::collection::vec(arb_message(), 0..5), 0..24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every value built by repeated `append` has the fingerprint of a from-scratch build with
    /// the same messages, down to each message digest, and `diff` finds no break in either
    /// direction between them or from any earlier turn.
    #[test]
    fn append_equals_a_from_scratch_build(history in arb_history(), turns in batches()) {
        let mut p = base(history.clone());
        let mut all = history;
        let mut earlier = vec![p.clone()];
        for more in turns {
            let next = p.append(more.clone());
            all.extend(more);
            let scratch = base(all.clone());
            prop_assert_eq!(next.fingerprint(), scratch.fingerprint());
            prop_assert_eq!(next.fingerprint().total(), scratch.fingerprint().total());
            prop_assert_eq!(next.messages(), &all);
            prop_assert_eq!(next.fingerprint().message_count(), all.len());
            for i in 0..=all.len() {
                prop_assert_eq!(next.fingerprint().message(i), scratch.fingerprint().message(i));
                prop_assert_eq!(
                    next.fingerprint().messages_digest_at(i),
                    scratch.fingerprint().messages_digest_at(i)
                );
            }
            prop_assert!(next.fingerprint().message_digests().eq(scratch.fingerprint().message_digests()));
            prop_assert_eq!(next.fingerprint().diff(scratch.fingerprint()), None);
            prop_assert_eq!(scratch.fingerprint().diff(next.fingerprint()), None);
            for e in &earlier {
                prop_assert_eq!(e.fingerprint().diff(next.fingerprint()), None);
            }
            earlier.push(next.clone());
            p = next;
        }
    }

    /// The fingerprint is computed lazily, from the nearest earlier value whose fingerprint was
    /// computed: whichever values are asked and in whatever order, each equals a from-scratch
    /// build, and every value `extends` each value it was appended to (and no sibling's growth).
    #[test]
    fn lazy_fingerprints_match_whenever_they_are_asked_for(
        history in arb_history(),
        turns in batches(),
        asked in prop::collection::vec(any::<bool>(), 24),
        order in any::<prop::sample::Index>(),
    ) {
        let mut p = base(history.clone());
        let mut all = history;
        let mut values = vec![(p.clone(), all.clone())];
        for (more, ask) in turns.into_iter().zip(asked) {
            let next = p.append(more.clone());
            all.extend(more);
            if ask {
                let scratch = base(all.clone());
                prop_assert_eq!(next.fingerprint(), scratch.fingerprint());
            }
            for (earlier, _) in &values {
                prop_assert!(next.extends(earlier));
            }
            values.push((next.clone(), all.clone()));
            p = next;
        }
        // A sibling grown from the middle shares the middle, not what came after it.
        let (mid, mid_msgs) = values[order.index(values.len())].clone();
        let sibling = mid.append(vec![Message::user_text("a sibling's turn")]);
        prop_assert!(sibling.extends(&mid));
        for (later, msgs) in &values {
            if msgs.len() > mid_msgs.len() {
                prop_assert!(!sibling.extends(later));
                prop_assert!(!later.extends(&sibling));
            }
        }
        // Ask the rest back to front: later values first, then the ones they were built from.
        for (v, msgs) in values.iter().rev() {
            let scratch = base(msgs.clone());
            prop_assert_eq!(v.fingerprint(), scratch.fingerprint());
        }
        prop_assert!(!base(all).extends(&p), "an equal value built anew shares nothing");
    }

    /// A changed or dropped message is named at the same index whether either side was built
    /// by `append` or from scratch.
    #[test]
    fn diff_names_the_same_break_for_appended_and_scratch_values(
        history in prop::collection::vec(arb_message(), 1..10),
        turns in batches(),
        pick in any::<prop::sample::Index>(),
        replacement in arb_message(),
        keep in any::<prop::sample::Index>(),
    ) {
        let mut appended = base(history.clone());
        let mut all = history;
        for more in turns {
            appended = appended.append(more.clone());
            all.extend(more);
        }
        let scratch = base(all.clone());

        let i = pick.index(all.len());
        let mut changed = all.clone();
        changed[i] = replacement.clone();
        let expected = (changed[i] != all[i]).then_some(CacheBreak::Message { index: i, change: Change::Changed });
        let changed_scratch = base(changed.clone());
        let changed_appended = base(changed[..i].to_vec()).append(changed[i..].to_vec());
        for from in [&appended, &scratch] {
            for to in [&changed_scratch, &changed_appended] {
                prop_assert_eq!(from.fingerprint().diff(to.fingerprint()), expected);
            }
        }

        let k = keep.index(all.len());
        let shorter = base(all[..k].to_vec());
        let removed = Some(CacheBreak::Message { index: k, change: Change::Removed });
        prop_assert_eq!(appended.fingerprint().diff(shorter.fingerprint()), removed);
        prop_assert_eq!(scratch.fingerprint().diff(shorter.fingerprint()), removed);
        prop_assert_eq!(shorter.fingerprint().diff(appended.fingerprint()), None);
    }
}

#[test]
fn append_shares_the_head_and_the_earlier_messages() {
    let history: Vec<Message> = (0..100)
        .map(|i| Message::user_text(format!("m{i}")))
        .collect();
    let a = base(history);
    let b = a.append(vec![Message::assistant_text("next")]);
    assert!(std::ptr::eq(a.tools().as_ptr(), b.tools().as_ptr()));
    assert!(std::ptr::eq(
        a.system_prompt().as_ptr(),
        b.system_prompt().as_ptr()
    ));
    for i in 0..a.messages().len() {
        assert!(
            std::ptr::eq(&a.messages()[i], &b.messages()[i]),
            "message {i} was copied"
        );
    }
    assert_eq!(a.messages().len(), 100);
    assert_eq!(b.messages().last(), Some(&Message::assistant_text("next")));
    // Appending nothing keeps everything.
    let c = b.append(Vec::new());
    assert!(c.messages().ptr_eq(b.messages()));
    assert_eq!(c.fingerprint(), b.fingerprint());
}
