//! The Redis mailbox against a real Redis server (`scripts/redis-server.sh start`, which
//! `scripts/test.sh` runs): the same conformance suite as the memory and file mailboxes,
//! unchanged, and what a reader sees when the server is not there. Without
//! `FORKHIVE_REDIS_URL` the tests say they were skipped; under `CI=true` that is a failure.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use forkhive_spawn::mailbox::{Inbox, Letter, Mailbox, RedisMailbox, conformance};

fn url() -> Option<String> {
    match std::env::var("FORKHIVE_REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but FORKHIVE_REDIS_URL is not set: scripts/redis-server.sh start")
        }
        Err(_) => {
            eprintln!("skipped: no FORKHIVE_REDIS_URL (run scripts/redis-server.sh start)");
            None
        }
    }
}

/// A key prefix of this run's own, so runs and tests never share inboxes.
fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t{}-{test}", nanos % 1_000_000_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_redis_mailbox_conforms() {
    let Some(url) = url() else { return };
    let store = RedisMailbox::with_prefix(&url, &prefix("conf")).unwrap();
    conformance::run(|| Arc::new(store.reopen()) as Arc<dyn Mailbox>)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_waiting_reader_wakes_when_a_letter_arrives_from_another_host() {
    let Some(url) = url() else { return };
    let p = prefix("wake");
    let reader = RedisMailbox::with_prefix(&url, &p).unwrap();
    let writer = RedisMailbox::with_prefix(&url, &p).unwrap();
    let inbox = Inbox::new("team", "bob").unwrap();
    let waiting = tokio::spawn({
        let (reader, inbox) = (reader.clone(), inbox.clone());
        async move { reader.wait(&inbox, Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = std::time::Instant::now();
    writer
        .send(&inbox, Letter::new("alice", "hello"))
        .await
        .unwrap();
    assert!(waiting.await.unwrap().unwrap());
    // Woken by the letter, not by the 30 s timeout.
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    // Nothing new: the wait ends at its timeout, false.
    let letters = reader.receive(&inbox).await.unwrap();
    let known: Vec<String> = letters.iter().map(|d| d.id.clone()).collect();
    assert!(
        !reader
            .wait_beyond(&inbox, &known, Duration::from_millis(200))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn no_server_is_an_error_that_hides_the_password() {
    // A port nothing listens on.
    let m = RedisMailbox::new("redis://:hunter2@127.0.0.1:9/0").unwrap();
    let inbox = Inbox::new("team", "bob").unwrap();
    let err = m.receive(&inbox).await.unwrap_err().to_string();
    assert!(
        err.starts_with("mailbox team/bob: Redis at redis://***@127.0.0.1:9/0: could not connect:"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}
