//! Fork-prefix construction: forkhive's shared-prefix children against a naive baseline.
//!
//! `fork_children/forkhive/<history>/<children>`: make a `ForkPrefix` from the parent's turn and
//! build every child with its fingerprint. `fork_children/naive/<history>/<children>`: per
//! child, clone the history, append the fork messages, serialise the whole request with
//! serde_json and SHA-256 it. Divide a median by the child count for the per-child cost.
//!
//! `fork_encode/forkhive/<history>/<children>`: make a `ForkPrefix` and encode every child's
//! Anthropic request body with a codec that already holds the parent's encoded prefix (the
//! parent sent that request itself; priming is outside the measurement).
//! `fork_encode/naive/...`: per child, clone the history, append the fork messages and
//! serialise the whole request body with serde_json.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use forkhive::core::fork::build_forked_messages;
use forkhive::core::{CacheSafeParams, ForkPrefix, Message, ToolDefinition};
use forkhive::transport::{AnthropicCodec, Codec, Request};
use serde::Serialize;
use sha2::{Digest, Sha256};

const SIZES: [(&str, usize); 3] = [
    ("10KiB", 10 << 10),
    ("100KiB", 100 << 10),
    ("1MiB", 1 << 20),
];
const CHILDREN: [usize; 3] = [1, 8, 64];

#[derive(Serialize)]
struct NaiveRequest<'a> {
    model: &'a str,
    system: &'a [String],
    tools: &'a [ToolDefinition],
    messages: Vec<Message>,
}

fn naive_child(params: &CacheSafeParams, assistant: &Message, directive: &str) -> [u8; 32] {
    let mut messages = params.messages().to_vec();
    messages.extend(build_forked_messages(directive, assistant).unwrap());
    let body = serde_json::to_vec(&NaiveRequest {
        model: params.model(),
        system: params.system_prompt(),
        tools: params.tools(),
        messages,
    })
    .unwrap();
    Sha256::digest(&body).into()
}

fn fork_children(c: &mut Criterion) {
    let mut group = c.benchmark_group("fork_children");
    group.sample_size(20);
    for (label, bytes) in SIZES {
        let params = support::params(bytes);
        for n in CHILDREN {
            let turn = support::fan_out_turn(n);
            let directives: Vec<String> = (0..n).map(support::directive).collect();
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("forkhive/{label}"), n),
                &n,
                |b, _| {
                    b.iter(|| {
                        let prefix = ForkPrefix::new(params.clone(), turn.clone()).unwrap();
                        for d in &directives {
                            let child = prefix.child(d);
                            black_box(child.fingerprint().total());
                            black_box(&child);
                        }
                    })
                },
            );
            if bytes >= (1 << 20) && n > 8 {
                group.sample_size(10);
            }
            group.bench_with_input(BenchmarkId::new(format!("naive/{label}"), n), &n, |b, _| {
                b.iter(|| {
                    for d in &directives {
                        black_box(naive_child(&params, &turn, d));
                    }
                })
            });
            group.sample_size(20);
        }
    }
    group.finish();
}

#[derive(Serialize)]
struct NaiveBody<'a> {
    model: &'a str,
    system: &'a [String],
    tools: &'a [ToolDefinition],
    messages: Vec<Message>,
    max_tokens: u32,
}

fn naive_encode(params: &CacheSafeParams, assistant: &Message, directive: &str) -> Vec<u8> {
    let mut messages = params.messages().to_vec();
    messages.extend(build_forked_messages(directive, assistant).unwrap());
    serde_json::to_vec(&NaiveBody {
        model: params.model(),
        system: params.system_prompt(),
        tools: params.tools(),
        messages,
        max_tokens: 1024,
    })
    .unwrap()
}

fn fork_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("fork_encode");
    group.sample_size(20);
    for (label, bytes) in SIZES {
        let params = support::params(bytes);
        for n in [1, 64] {
            let turn = support::fan_out_turn(n);
            let directives: Vec<String> = (0..n).map(support::directive).collect();
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("forkhive/{label}"), n),
                &n,
                |b, _| {
                    b.iter_batched(
                        || {
                            let codec = AnthropicCodec::default();
                            black_box(codec.encode(&Request::new(params.clone(), vec![]), false));
                            codec
                        },
                        |codec| {
                            let prefix = ForkPrefix::new(params.clone(), turn.clone()).unwrap();
                            for d in &directives {
                                black_box(codec.encode(&Request::fork(prefix.child(d)), false));
                            }
                            codec
                        },
                        BatchSize::LargeInput,
                    )
                },
            );
            if bytes >= (1 << 20) && n > 8 {
                group.sample_size(10);
            }
            group.bench_with_input(BenchmarkId::new(format!("naive/{label}"), n), &n, |b, _| {
                b.iter(|| {
                    for d in &directives {
                        black_box(naive_encode(&params, &turn, d));
                    }
                })
            });
            group.sample_size(20);
        }
    }
    group.finish();
}

criterion_group!(benches, fork_children, fork_encode);
criterion_main!(benches);
