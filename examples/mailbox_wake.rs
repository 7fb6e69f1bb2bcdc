//! Idle readers and how fast a letter wakes one: `--waiters` readers wait on their own
//! inboxes; the process's CPU time is measured over `--idle-secs` of nothing happening; then
//! `--rounds` letters are sent one at a time, each to one waiting reader, and the time from
//! `send` to that reader's `wait` returning is taken (p50, p99). For the in-memory mailbox and
//! the file mailbox (Claude Code's inbox files in a temporary directory), and, built with
//! `--features redis` and given `FORKHIVE_REDIS_URL`, the Redis mailbox. Then the same wake
//! latency for a parent's notification queue (a worker's report), in memory and on Redis.
//!
//! ```text
//! cargo run --release --example mailbox_wake -- [--waiters 100] [--idle-secs 10] [--rounds 200]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkhive::spawn::mailbox::{Inbox, Letter, Mailbox};
use tokio::sync::mpsc;

/// Idle readers' CPU time and their wake latency, for both mailboxes.
#[derive(clap::Parser)]
#[command(name = "mailbox_wake")]
struct Args {
    /// Readers waiting at once.
    #[arg(long, default_value = "100")]
    waiters: usize,
    /// Seconds of idleness measured.
    #[arg(long = "idle-secs", default_value = "10")]
    idle_secs: u64,
    /// Letters sent, one at a time, to measure wake latency.
    #[arg(long, default_value = "200")]
    rounds: usize,
}

async fn measure(name: &str, mail: Arc<dyn Mailbox>, a: &Args) -> Result<(), String> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let mut readers = Vec::new();
    for i in 0..a.waiters {
        let (mail, tx) = (Arc::clone(&mail), tx.clone());
        let inbox = Inbox::new("wake", format!("r{i}")).map_err(|e| e.to_string())?;
        readers.push(tokio::spawn(async move {
            loop {
                match mail.wait(&inbox, Duration::from_secs(3600)).await {
                    Ok(true) => {
                        let at = Instant::now();
                        let got = mail.receive(&inbox).await.unwrap_or_default();
                        let ids: Vec<String> = got.into_iter().map(|d| d.id).collect();
                        let _ = mail.ack(&inbox, &ids).await;
                        if tx.send((i, at)).is_err() {
                            return;
                        }
                    }
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        }));
    }
    // Let every reader settle into its wait, then measure nothing happening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = common::cpu_time();
    let wall = Instant::now();
    tokio::time::sleep(Duration::from_secs(a.idle_secs)).await;
    let idle_cpu = match (before, common::cpu_time()) {
        (Some(b), Some(e)) => format!("{:?}", e.saturating_sub(b)),
        _ => "unknown (no /proc/self/stat)".into(),
    };
    let idle_wall = wall.elapsed();
    let mut lat = Vec::with_capacity(a.rounds);
    for r in 0..a.rounds {
        let i = r % a.waiters;
        let to = Inbox::new("wake", format!("r{i}")).map_err(|e| e.to_string())?;
        let sent = Instant::now();
        mail.send(&to, Letter::new("lead", "wake"))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let (who, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .map_err(|_| format!("reader r{i} did not wake within 10 s"))?
                .ok_or("the readers stopped")?;
            if who == i {
                lat.push(at.saturating_duration_since(sent));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for r in readers {
        r.abort();
    }
    lat.sort();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
    println!(
        "{name:>6}: {} idle readers, CPU {idle_cpu} over {:.1?} idle; wake latency over {} \
         letters: p50 {:?}, p99 {:?}, max {:?}",
        a.waiters,
        idle_wall,
        lat.len(),
        pct(50),
        pct(99),
        lat[lat.len() - 1]
    );
    Ok(())
}

/// A parent waiting on its notification queue, and how fast a worker's report wakes it:
/// `--rounds` reports pushed one at a time, each timed from `push` to the parent's
/// `wait_beyond` returning and its `pending` read.
async fn measure_queue(
    name: &str,
    q: Arc<dyn forkhive::spawn::task::queue::NotificationQueue>,
    a: &Args,
) -> Result<(), String> {
    use forkhive::core::{NotificationUsage, TaskId, TaskKind, TaskNotification, TaskStatus};
    let parent = TaskId::generate(TaskKind::Agent);
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let waiter = {
        let q = Arc::clone(&q);
        tokio::spawn(async move {
            let mut known: Vec<String> = Vec::new();
            loop {
                match q
                    .wait_beyond(&parent, &known, Duration::from_secs(3600))
                    .await
                {
                    Ok(true) => {
                        let got = q.pending(&parent).await.unwrap_or_default();
                        let at = Instant::now();
                        let ids: Vec<String> = got.into_iter().map(|g| g.id).collect();
                        let _ = q.delivered(&parent, &ids).await;
                        known = ids;
                        if tx.send(at).is_err() {
                            return;
                        }
                    }
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut lat = Vec::with_capacity(a.rounds);
    for r in 0..a.rounds {
        let task = TaskId::from_entropy(TaskKind::Agent, r as u64);
        let n = TaskNotification::new(
            task,
            TaskStatus::Completed,
            "Agent \"wake\" finished",
            NotificationUsage::default(),
        );
        let sent = Instant::now();
        q.push(&parent, &task.to_string(), &n)
            .await
            .map_err(|e| e.to_string())?;
        let at = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| "the parent did not wake within 10 s".to_owned())?
            .ok_or("the parent stopped")?;
        lat.push(at.saturating_duration_since(sent));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiter.abort();
    lat.sort();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
    println!(
        "{name:>6}: a parent's notification queue; wake latency over {} reports: p50 {:?}, \
         p99 {:?}, max {:?}",
        lat.len(),
        pct(50),
        pct(99),
        lat[lat.len() - 1]
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let a = <Args as clap::Parser>::parse();
    if a.waiters == 0 || a.rounds == 0 {
        eprintln!("mailbox_wake: --waiters and --rounds must be at least 1");
        return ExitCode::FAILURE;
    }
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("mailbox_wake: a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, mail) in common::mailboxes(dir.path()) {
        if let Err(e) = measure(name, mail, &a).await {
            eprintln!("mailbox_wake: {name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    #[allow(unused_mut)]
    let mut queues: Vec<(
        &str,
        Arc<dyn forkhive::spawn::task::queue::NotificationQueue>,
    )> = vec![(
        "memory",
        Arc::new(forkhive::spawn::task::queue::MemoryNotificationQueue::new()),
    )];
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("FORKHIVE_REDIS_URL") {
        match forkhive::spawn::task::RedisNotificationQueue::new(
            &url,
            &format!("wake{}", std::process::id()),
        ) {
            Ok(q) => queues.push(("redis", Arc::new(q))),
            Err(e) => eprintln!("FORKHIVE_REDIS_URL: {e}"),
        }
    }
    for (name, q) in queues {
        if let Err(e) = measure_queue(name, q, &a).await {
            eprintln!("mailbox_wake: {name} notification queue: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
