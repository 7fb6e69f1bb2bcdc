#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `Digest::of_message` streams a message's canonical JSON into the hash: it must equal the
//! digest of the bytes `Message::write_json` writes, whatever the sizes of the writes.

mod support;

use forkhive_core::{ContentBlock, Digest, Message};
use proptest::prelude::*;
use support::*;

/// Text of any length around the stream buffer's size, with quotes, backslashes and control
/// characters that JSON escapes.
fn long_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => Just('x'),
            1 => Just('"'),
            1 => Just('\\'),
            1 => Just('\n'),
            1 => any::<char>(),
        ],
        0..3000,
    )
    .prop_map(String::from_iter)
}

fn written(m: &Message) -> Digest {
    let mut buf = Vec::new();
    m.write_json(&mut buf);
    Digest::of(&buf)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn streamed_digest_equals_the_written_bytes_digest(m in arb_message()) {
        prop_assert_eq!(Digest::of_message(&m), written(&m));
    }

    #[test]
    fn long_texts_and_results_stream_to_the_same_digest(a in long_text(), b in long_text()) {
        let m = Message::user(vec![
            ContentBlock::text(a),
            ContentBlock::tool_result_text("toolu_1", b),
        ]);
        prop_assert_eq!(Digest::of_message(&m), written(&m));
    }
}
