//! One agent turn on a growing conversation: forkhive's incremental path against a rebuild.
//!
//! The conversation is an agent at work: a prompt, then per turn an assistant message (a
//! sentence and one tool call with a realistic JSON input) and a user message with the tool's
//! ~2 KiB result (`support::agent_turn`); about 1 MiB of JSON after 500 turns.
//!
//! `agent_turns/forkhive/<n>`: turns 1..n-1 are built with `CacheSafeParams::append` and each
//! is encoded by one `AnthropicCodec`, whose memo is therefore warm, as in a running agent
//! (setup, not measured). Measured: turn n — append its two messages, fingerprint them (the
//! total digest, and a `diff` against the previous turn's fingerprint, which a runtime runs to
//! catch cache breaks), and encode the Anthropic request body with that codec. Every iteration
//! appends fresh messages (a new tool id), so they are hashed and encoded for real.
//!
//! `agent_turns/naive/500`: the same turn 500 from scratch: `builder().messages(all)` hashes
//! every message, and a fresh codec encodes every message.
//!
//! Goal: `forkhive/500` within 1.5x of `forkhive/10`, and `naive/500` at least 50x
//! `forkhive/500`. `python3 scripts/bench-report.py agent_turns` prints the medians and ratios.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use forkhive::core::{CacheSafeParams, Message};
use forkhive::transport::{AnthropicCodec, Codec, Request};

const TURNS: [usize; 3] = [10, 100, 500];

/// The conversation after turns 1..n-1, and the codec that sent each of them.
fn conversation(n: usize) -> (CacheSafeParams, AnthropicCodec) {
    let codec = AnthropicCodec::default();
    let mut p = support::agent_builder()
        .messages(vec![support::agent_prompt()])
        .build();
    codec.encode(&Request::new(p.clone(), vec![]), false);
    for t in 1..n {
        p = p.append(support::agent_turn(t, 0).to_vec());
        black_box(p.fingerprint().total());
        codec.encode(&Request::new(p.clone(), vec![]), false);
    }
    (p, codec)
}

fn json_len(messages: &[Message]) -> usize {
    messages.iter().map(|m| m.to_json().len() + 1).sum()
}

fn agent_turns(c: &mut Criterion) {
    let mut group = c.benchmark_group("agent_turns");
    for n in TURNS {
        let (base, codec) = conversation(n);
        let history = base.messages().to_vec();
        eprintln!(
            "turn {n}: {} messages, {} KiB of history before the turn",
            history.len(),
            json_len(&history) >> 10
        );
        let mut salt = 0u64;
        group.bench_with_input(BenchmarkId::new("forkhive", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    salt += 1;
                    support::agent_turn(n, salt).to_vec()
                },
                |turn| {
                    let next = base.append(turn);
                    black_box(next.fingerprint().total());
                    let brk = base.fingerprint().diff(next.fingerprint());
                    let body = codec.encode(&Request::new(next.clone(), vec![]), false);
                    (next, black_box(brk), black_box(body))
                },
                BatchSize::SmallInput,
            )
        });
    }

    let n = 500;
    let (base, _) = conversation(n);
    let mut all = base.messages().to_vec();
    all.extend(support::agent_turn(n, 1));
    eprintln!(
        "naive turn {n}: {} messages, {} KiB",
        all.len(),
        json_len(&all) >> 10
    );
    group.sample_size(30);
    group.bench_with_input(BenchmarkId::new("naive", n), &n, |b, _| {
        b.iter_batched(
            || all.clone(),
            |messages| {
                let p = support::agent_builder().messages(messages).build();
                black_box(p.fingerprint().total());
                let codec = AnthropicCodec::default();
                let body = codec.encode(&Request::new(p.clone(), vec![]), false);
                (p, codec, black_box(body))
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, agent_turns);
criterion_main!(benches);
