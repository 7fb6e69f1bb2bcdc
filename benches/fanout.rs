//! A wide background fan-out on a scripted model: forkhive against the least any orchestrator
//! does for the same work, measured in one run.
//!
//! The work (`examples/fanout`, shared with `fanout_bench`): a parent's one response starts N
//! background children; each makes two turns that call a `read_file` returning 1 KiB, then
//! answers with ~200 characters; the parent gets every answer and answers itself. The model
//! answers from the shape of each request, at once.
//!
//! `fanout/forkhive/<n>`: `Agent::run` on a parent whose `Agent` tool starts the children
//! (built beforehand, not measured): each child is registered, supervised, reported through one
//! `<task-notification>`, and rolled up.
//!
//! `fanout/naive/<n>`: the floor, with none of that: the parent asks the model, parses each
//! call's input, and spawns a bare tokio task per child that asks the same model with its
//! growing conversation, answers its tool calls, and sends its final text over a channel;
//! the parent collects the N texts and asks the model once more.
//!
//! Both on a current-thread runtime (one core). `python3 scripts/bench-report.py fanout`
//! prints the medians per child and the ratio.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../examples/fanout/mod.rs"]
mod fanout;

use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use forkhive::core::{CacheSafeParams, ContentBlock, Message};
use forkhive::spawn::runtime::StopReason;
use forkhive::transport::{Backend, Request};

const TURNS: usize = 3;

/// The floor: bare tasks, the same model and tool answers, a channel. Returns the answers.
async fn naive(model: Arc<fanout::Model>, n: usize) -> Vec<String> {
    let parent = CacheSafeParams::builder("scripted")
        .system_block(fanout::PARENT)
        .build();
    let worker = CacheSafeParams::builder("scripted")
        .system_block(fanout::WORKER)
        .build();
    let tool = Arc::new(fanout::ReadFile1K::new());
    let mut conversation = vec![Message::user(vec![ContentBlock::text(fanout::PROMPT)])];
    let first = model
        .send(&Request::new(parent.clone(), conversation.clone()))
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (_, _, input) in first.message.tool_uses() {
        let input: serde_json::Value = input.to_value().unwrap();
        let prompt = input["prompt"].as_str().unwrap().to_owned();
        let (model, tool, worker, tx) = (
            Arc::clone(&model),
            Arc::clone(&tool),
            worker.clone(),
            tx.clone(),
        );
        tokio::spawn(async move {
            let mut turns = vec![Message::user(vec![ContentBlock::text(prompt)])];
            loop {
                let answer = model
                    .send(&Request::new(worker.clone(), turns.clone()))
                    .await
                    .unwrap();
                let results: Vec<ContentBlock> = answer
                    .message
                    .tool_uses()
                    .map(|(id, _, _)| ContentBlock::tool_result_text(id, tool.text()))
                    .collect();
                let text = answer.message.text();
                turns.push(answer.message);
                if results.is_empty() {
                    let _ = tx.send(text);
                    break;
                }
                turns.push(Message::user(results));
            }
        });
    }
    drop(tx);
    let mut answers = Vec::with_capacity(n);
    while let Some(text) = rx.recv().await {
        answers.push(text);
    }
    conversation.push(first.message);
    conversation.push(Message::user(
        answers
            .iter()
            .map(|a| ContentBlock::text(a.clone()))
            .collect(),
    ));
    model
        .send(&Request::new(parent, conversation))
        .await
        .unwrap();
    answers
}

fn fanout(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fanout");
    group.sample_size(20);
    for n in [100, 1_000] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("forkhive", n), &n, |b, &n| {
            b.iter_batched(
                || {
                    let model = Arc::new(fanout::Model::new(n, TURNS, false));
                    rt.block_on(fanout::parent(model, n, None)).unwrap()
                },
                |mut parent| {
                    let run = rt.block_on(parent.run(fanout::PROMPT));
                    assert_eq!(run.stop, StopReason::Completed);
                    // Dropped after the clock stops.
                    (parent, run)
                },
                BatchSize::PerIteration,
            );
        });
        group.bench_with_input(BenchmarkId::new("naive", n), &n, |b, &n| {
            b.iter_batched(
                || Arc::new(fanout::Model::new(n, TURNS, false)),
                |model| {
                    let answers = rt.block_on(naive(model, n));
                    assert_eq!(answers.len(), n);
                    answers
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
