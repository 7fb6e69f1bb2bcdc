//! Fork three children from a realistic parent turn, show that they share every byte up to
//! their directives, and diagnose a cache break when the tool list changes.
//!
//! Run: `cargo run --example fork_prefix`

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/support/mod.rs"]
mod support;

use forkhive::core::{CacheSafeParams, ForkPrefix, ToolDefinition};

/// Forks three children from a realistic parent turn and diagnoses a cache break.
#[derive(clap::Parser)]
#[command(name = "fork_prefix")]
struct Args {}

fn main() -> Result<(), forkhive::core::Error> {
    <Args as clap::Parser>::parse();
    // The parent: a system prompt, six tools and ~200 KiB of conversation.
    let params = support::params(200 << 10);
    let bytes: usize = params.messages().iter().map(|m| m.to_json().len()).sum();
    println!(
        "parent: {} messages ({} KiB of history), {} tools, fingerprint {}",
        params.messages().len(),
        bytes >> 10,
        params.tools().len(),
        params.fingerprint().total().short()
    );

    // The parent's turn fans out into three forks.
    let prefix = ForkPrefix::new(params.clone(), support::fan_out_turn(3))?;
    let directives = [
        "Audit src/net for swallowed errors.",
        "Audit src/db for swallowed errors.",
        "Audit src/cli for swallowed errors.",
    ];
    let children: Vec<_> = directives.iter().map(|d| prefix.child(d)).collect();
    let encoded: Vec<String> = children
        .iter()
        .map(|c| serde_json::to_string(&c.to_messages()).expect("messages serialise"))
        .collect();

    println!("\nchildren:");
    for (i, child) in children.iter().enumerate() {
        let fp = child.fingerprint();
        println!(
            "  child {i}: fingerprint {}  messages {}  directive {:?}",
            fp.total().short(),
            fp.message_count(),
            child.directive()
        );
        for (j, other) in encoded.iter().enumerate() {
            if i == j {
                continue;
            }
            let common = encoded[i]
                .bytes()
                .zip(other.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            let context: String = encoded[i][..common]
                .chars()
                .rev()
                .take(24)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            println!(
                "    vs child {j}: identical for {common} of {} bytes ({:.3}%), diverging right after …{context:?}",
                encoded[i].len(),
                100.0 * common as f64 / encoded[i].len() as f64
            );
        }
        let brk = fp.diff(&children[(i + 1) % children.len()].fingerprint());
        println!(
            "    cache diff vs next sibling: {}",
            brk.map_or("none".to_owned(), |b| b.to_string())
        );
    }

    // A host that adds a tool between the parent's request and the fork breaks the cache:
    // the fingerprint diff names where.
    let mut tools = support::tools();
    tools.insert(
        2,
        ToolDefinition::new("WebFetch", "Fetch a URL.", r#"{"type":"object"}"#)?,
    );
    let changed = CacheSafeParams::builder(params.model())
        .system_block(support::system_prompt())
        .system_context("gitStatus", "branch: main\nclean")
        .user_context("cwd", "/home/dev/project")
        .tools(tools)
        .messages(params.messages().to_vec())
        .build();
    let rebuilt = ForkPrefix::new(changed, support::fan_out_turn(3))?.child(directives[0]);
    let brk = children[0].fingerprint().diff(&rebuilt.fingerprint());
    println!("\nafter inserting a tool at index 2:");
    match brk {
        Some(b) => println!("  cache break in the {} dimension: {b}", b.dimension()),
        None => println!("  no cache break"),
    }
    Ok(())
}
