//! The docs name what a user of the `forkhive` crate can write: `forkhive::spawn::…`, not the
//! workspace's inner crates (`forkhive_spawn::…`), which a user's project does not depend on.
//! The doctests cannot catch this: they are built inside the workspace, where the inner crates
//! resolve. And a snippet's `serde_json` and `async_trait` are `forkhive::serde_json` and
//! `forkhive::async_trait`, which a user has without adding a dependency.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

/// The inner crates' names as a path starts them.
const INNER: [&str; 3] = [
    "forkhive_core::",
    "forkhive_spawn::",
    "forkhive_transport::",
];

/// The pages a newcomer reads: README.md and docs/*.md, with their text.
fn pages() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![(
        "README.md".to_owned(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
            pages.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    pages.sort();
    pages
}

#[test]
fn the_docs_name_paths_a_user_of_the_facade_can_write() {
    let mut wrong = Vec::new();
    for (page, text) in pages() {
        for (n, line) in text.lines().enumerate() {
            // A profiler's symbol names the compiled crate: that is what the tool matches.
            if line.contains("--dump-before=") {
                continue;
            }
            if let Some(inner) = INNER.iter().find(|i| line.contains(*i)) {
                wrong.push(format!("{page}:{}: `{inner}` in: {line}", n + 1));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "write `forkhive::core::`, `forkhive::spawn::`, `forkhive::transport::`:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_docs_rust_snippets_take_serde_json_and_async_trait_from_the_facade() {
    let mut wrong = Vec::new();
    for (page, text) in pages() {
        let mut block: Option<Vec<(usize, &str)>> = None;
        for (n, line) in text.lines().enumerate() {
            match &mut block {
                None if line.starts_with("```rust") => block = Some(Vec::new()),
                None => {}
                Some(lines) if line.starts_with("```") => {
                    for krate in ["serde_json", "async_trait"] {
                        let imported = lines
                            .iter()
                            .any(|(_, l)| l.contains(&format!("use forkhive::{krate}")));
                        for (at, l) in lines.iter() {
                            let bare = l
                                .match_indices(&format!("{krate}::"))
                                .any(|(i, _)| !l[..i].ends_with("forkhive::"));
                            if bare && !imported {
                                wrong.push(format!("{page}:{at}: {l}"));
                            }
                        }
                    }
                    block = None;
                }
                Some(lines) => lines.push((n + 1, line)),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "write `forkhive::serde_json::`, `forkhive::async_trait` (or import them from \
         `forkhive`):\n{}",
        wrong.join("\n")
    );
}
