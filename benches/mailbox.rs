//! Mailbox throughput: letters per second into one inbox, from 1 and from 10 writers at once,
//! for the in-memory and the file mailbox (Claude Code's inbox files, lock file and all), and —
//! built with `--features redis` and given `FORKHIVE_REDIS_URL` — the Redis mailbox.
//!
//! Each iteration sends `LETTERS` letters in all (split among the writers) into a fresh inbox,
//! then the reader receives and acknowledges them. `python3 scripts/bench-report.py mailbox`
//! prints letters per second from the medians.
//!
//! The `notify` group does the same for a parent's notification queue (workers' reports):
//! `NOTES` notifications pushed from 1 and 10 workers, then read and marked delivered, in memory
//! and on Redis (`python3 scripts/bench-report.py notify`).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use forkhive::spawn::Error;
use forkhive::spawn::mailbox::{FileMailbox, Inbox, Letter, Mailbox, MemoryMailbox};

const LETTERS: usize = 200;

async fn round(mail: Arc<dyn Mailbox>, inbox: Inbox, writers: usize) {
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (mail, inbox) = (Arc::clone(&mail), inbox.clone());
            tokio::spawn(async move {
                for i in 0..LETTERS / writers {
                    loop {
                        match mail
                            .send(&inbox, Letter::new(format!("w{w}"), format!("{i}")))
                            .await
                        {
                            Ok(_) => break,
                            Err(Error::MailboxBusy { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let got = mail.receive(&inbox).await.unwrap();
    assert_eq!(got.len(), LETTERS);
    let ids: Vec<String> = got.into_iter().map(|d| d.id).collect();
    mail.ack(&inbox, &ids).await.unwrap();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("mailbox");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let mut n = 0u64;
    let redis_url = std::env::var("FORKHIVE_REDIS_URL")
        .ok()
        .filter(|_| cfg!(feature = "redis"));
    let backends: &[&str] = if redis_url.is_some() {
        &["memory", "file", "redis"]
    } else {
        &["memory", "file"]
    };
    for writers in [1usize, 10] {
        for &backend in backends {
            group.bench_with_input(BenchmarkId::new(backend, writers), &writers, |b, &w| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        n += 1;
                        let mail: Arc<dyn Mailbox> = match backend {
                            "memory" => Arc::new(MemoryMailbox::new()),
                            #[cfg(feature = "redis")]
                            "redis" => Arc::new(
                                forkhive::spawn::mailbox::RedisMailbox::with_prefix(
                                    redis_url.as_deref().unwrap_or_default(),
                                    &format!("bench{}", std::process::id()),
                                )
                                .unwrap(),
                            ),
                            _ => Arc::new(FileMailbox::new(dir.path())),
                        };
                        let inbox = Inbox::new("bench", format!("r{n}")).unwrap();
                        let start = Instant::now();
                        rt.block_on(round(mail, inbox, w));
                        total += start.elapsed();
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

const NOTES: usize = 200;

async fn notify_round(
    q: Arc<dyn forkhive::spawn::task::queue::NotificationQueue>,
    parent: forkhive::core::TaskId,
    writers: usize,
) {
    use forkhive::core::{NotificationUsage, TaskId, TaskKind, TaskNotification, TaskStatus};
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                for i in 0..NOTES / writers {
                    let task = TaskId::from_entropy(TaskKind::Agent, (w * NOTES + i) as u64);
                    let n = TaskNotification::new(
                        task,
                        TaskStatus::Completed,
                        "Agent \"bench\" finished",
                        NotificationUsage::default(),
                    )
                    .with_result("done");
                    assert!(q.push(&parent, &task.to_string(), &n).await.unwrap());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let got = q.pending(&parent).await.unwrap();
    assert_eq!(got.len(), NOTES);
    let ids: Vec<String> = got.into_iter().map(|g| g.id).collect();
    q.delivered(&parent, &ids).await.unwrap();
}

fn notify(c: &mut Criterion) {
    use forkhive::core::{TaskId, TaskKind};
    use forkhive::spawn::task::queue::{MemoryNotificationQueue, NotificationQueue};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("notify");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let redis_url = std::env::var("FORKHIVE_REDIS_URL")
        .ok()
        .filter(|_| cfg!(feature = "redis"));
    let backends: &[&str] = if redis_url.is_some() {
        &["memory", "redis"]
    } else {
        &["memory"]
    };
    for writers in [1usize, 10] {
        for &backend in backends {
            group.bench_with_input(BenchmarkId::new(backend, writers), &writers, |b, &w| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let q: Arc<dyn NotificationQueue> = match backend {
                            #[cfg(feature = "redis")]
                            "redis" => Arc::new(
                                forkhive::spawn::task::RedisNotificationQueue::new(
                                    redis_url.as_deref().unwrap_or_default(),
                                    &format!("bench{}", std::process::id()),
                                )
                                .unwrap(),
                            ),
                            _ => Arc::new(MemoryNotificationQueue::new()),
                        };
                        let parent = TaskId::generate(TaskKind::Agent);
                        let start = Instant::now();
                        rt.block_on(notify_round(q, parent, w));
                        total += start.elapsed();
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench, notify);
criterion_main!(benches);
