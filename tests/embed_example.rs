//! `examples/embed.rs` is the host program `docs/embedding.md` quotes: it stays within 100
//! non-blank lines, and the page quotes it whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn the_embedding_example_stays_short_and_the_docs_quote_it_whole() {
    let root = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{root}/examples/embed.rs")).unwrap();
    let lines = example.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(
        lines <= 100,
        "examples/embed.rs has {lines} non-blank lines"
    );
    let page = std::fs::read_to_string(format!("{root}/docs/embedding.md")).unwrap();
    assert!(
        page.contains(example.trim_end()),
        "docs/embedding.md does not quote examples/embed.rs as it is"
    );
}
