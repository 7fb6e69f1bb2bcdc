//! The Redis mailbox against a real Redis server (`scripts/redis-server.sh start`, which
//! `scripts/test.sh` runs): the same conformance suite as the memory and file mailboxes,
//! unchanged, and what a reader sees when the server is not there. Without
//! `FORKHIVE_REDIS_URL` the tests say they were skipped; under `CI=true` that is a failure.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{key_prefix as prefix, redis_url as url};

use std::sync::Arc;
use std::time::Duration;

use forkhive_spawn::mailbox::{Inbox, Letter, Mailbox, RedisMailbox, conformance};

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

/// A reader blocked on one inbox does not hold the handle's shared connection: through the
/// same handle, letters to another inbox are sent, read and counted at once, and the wait
/// outlives the shared connection's 10 s response timeout without an error, then wakes when
/// its letter comes (a blocking read on a multiplexed connection times out on the client and
/// holds the socket: redis-rs's users report it).
#[tokio::test]
async fn a_blocked_wait_leaves_its_handle_free_and_outlives_the_response_timeout() {
    let Some(url) = url() else { return };
    let p = prefix("blocked");
    let mail = RedisMailbox::with_prefix(&url, &p).unwrap();
    let (waited, other) = (
        Inbox::new("team", "bob").unwrap(),
        Inbox::new("team", "carol").unwrap(),
    );
    let waiting = tokio::spawn({
        let (mail, inbox) = (mail.clone(), waited.clone());
        async move { mail.wait(&inbox, Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..3 {
        let at = std::time::Instant::now();
        mail.send(&other, Letter::new("alice", format!("{i}")))
            .await
            .unwrap();
        assert_eq!(mail.receive(&other).await.unwrap().len(), i + 1);
        assert_eq!(mail.stored(&other).await.unwrap(), i + 1);
        assert!(
            at.elapsed() < Duration::from_millis(500),
            "the handle waited behind the blocked read: {:?}",
            at.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!waiting.is_finished(), "the wait ended before its letter");
    let sent = std::time::Instant::now();
    mail.send(&waited, Letter::new("alice", "at last"))
        .await
        .unwrap();
    assert!(waiting.await.unwrap().unwrap());
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
}

/// Two hosts' leads of one team on one Redis: the second is refused while the first holds
/// the team (its claim renewed past its TTL), and leads once the first gives it up.
#[tokio::test]
async fn a_team_is_led_from_one_host_at_a_time() {
    use forkhive_spawn::mailbox::LEAD_CLAIM_TTL;
    let Some(url) = url() else { return };
    let p = prefix("lead");
    let here = RedisMailbox::with_prefix(&url, &p).unwrap();
    let there = here.reopen();
    let first = here.claim_lead("review").await.unwrap();
    assert!(first.is_kept());
    // Past its TTL: renewed, still held.
    tokio::time::sleep(LEAD_CLAIM_TTL + Duration::from_secs(1)).await;
    let err = there.claim_lead("review").await.unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "team `review` has another lead on this mailbox ({p}:{{review}}:lead in Redis at "
        )),
        "{err}"
    );
    // Both handles are this process's: said so, after a moment's wait for a release.
    assert!(
        err.ends_with(
            "is held by another `Team` value in this process; a claim lapses 15 s after its \
             lead stops renewing it, so one of a lead that is gone frees itself); give this \
             team another name, or stop that lead"
        ),
        "{err}"
    );
    // Another team is free.
    drop(there.claim_lead("other").await.unwrap());
    drop(first);
    let mut again = there.claim_lead("review").await;
    for _ in 0..40 {
        if again.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        again = there.claim_lead("review").await;
    }
    assert!(again.unwrap().is_kept());
}

/// A lead claim whose caller stopped waiting while the store was out of reach (a partition:
/// the claim's `SET` stuck on the way) is given up after it: once the partition heals and the
/// late `SET` lands, the team can be claimed again at once — not `TeamTaken` until the late
/// claim's TTL (15 s) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_given_up_while_the_store_was_out_of_reach_does_not_hold_the_team() {
    let Some(url) = url() else { return };
    let p = prefix("lateclaim");
    let net = support::Partition::to(&url).await;
    let far = RedisMailbox::with_prefix(&net.url, &p).unwrap();
    // Connected (and a claim taken and given up) before the partition.
    far.claim_lead("warm").await.unwrap().release().await;
    net.cut(true);
    let waited = tokio::time::timeout(Duration::from_millis(300), far.claim_lead("review")).await;
    assert!(waited.is_err(), "no answer through the partition");
    net.cut(false);
    // The late `SET`, and the give-up behind it on the same connection, land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let here = RedisMailbox::with_prefix(&url, &p).unwrap();
    let claim = here.claim_lead("review").await;
    assert!(
        claim.is_ok(),
        "{}",
        claim.err().map(|e| e.to_string()).unwrap_or_default()
    );
}

/// `LeadClaim::release` returns once Redis has dropped the claim: a host that awaits it before
/// it exits leaves no claim to lapse, and another host may lead the team at once.
#[tokio::test]
async fn a_released_claim_is_gone_from_redis_when_release_returns() {
    let Some(url) = url() else { return };
    let p = prefix("release");
    let here = RedisMailbox::with_prefix(&url, &p).unwrap();
    let key = format!("{p}:{{review}}:lead");
    // Asked without yielding to the runtime: a release still under way has not run.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let claim = here.claim_lead("review").await.unwrap();
    let held: Option<String> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert!(held.is_some(), "the claim is {key}");
    claim.release().await;
    let held: Option<String> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert_eq!(held, None);
}

#[tokio::test]
async fn no_server_is_an_error_that_hides_the_password() {
    // A port nothing listens on.
    let m = RedisMailbox::new("redis://:hunter2@127.0.0.1:9/0").unwrap();
    let inbox = Inbox::new("team", "bob").unwrap();
    let err = m.receive(&inbox).await.unwrap_err().to_string();
    assert!(
        err.starts_with(
            "mailbox team/bob: Redis at redis://:***@127.0.0.1:9/0: could not connect:"
        ),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_redis_task_registry_conforms() {
    use forkhive_spawn::task::{RedisTaskRegistry, TaskRegistry};
    let Some(url) = url() else { return };
    let store = RedisTaskRegistry::new(&url, &prefix("reg")).unwrap();
    forkhive_spawn::task::conformance::run(|| {
        Arc::new(store.reopen_handle()) as Arc<dyn TaskRegistry>
    })
    .await
    .unwrap();
}

/// A Redis task registry under a fresh `key` prefix whose ended records expire after 300 ms,
/// and task ids fresh to this run (`id(n)`); `None` without a server.
fn registry_kept_300ms(
    key: &str,
) -> Option<(
    forkhive_spawn::task::RedisTaskRegistry,
    impl Fn(u64) -> forkhive_core::TaskId,
)> {
    use forkhive_spawn::task::{RedisTaskRegistry, Retention};
    let url = url()?;
    let r = RedisTaskRegistry::new(&url, &prefix(key))
        .unwrap()
        .with_retention(Retention {
            max_ended: usize::MAX,
            max_age: Some(Duration::from_millis(300)),
        });
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    Some((r, move |n: u64| {
        forkhive_core::TaskId::from_entropy(forkhive_core::TaskKind::Agent, base + n)
    }))
}

/// An ended task is kept while a task below it runs, then expires after the retention age;
/// a revived one is kept again.
#[tokio::test]
async fn ended_records_expire_once_nothing_below_runs() {
    use forkhive_spawn::task::{TaskRecord, TaskRegistry, TaskState};
    let Some((r, id)) = registry_kept_300ms("ttl") else {
        return;
    };
    let (root, parent, child) = (id(1), id(2), id(3));
    r.create(TaskRecord::new(parent, root, "p")).await.unwrap();
    r.create(TaskRecord::new(child, parent, "c")).await.unwrap();
    r.transition(&parent, TaskState::Completed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(r.get(&parent).await.is_some(), "kept while its child runs");
    r.transition(&child, TaskState::Completed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(r.get(&child).await.is_none(), "the child expired");
    assert!(
        r.get(&parent).await.is_none(),
        "the parent expired once nothing below ran"
    );
    // The unregistered root's keys too: a long-running host's roots do not pile up.
    assert!(r.children(&root).await.is_empty());
    r.create(TaskRecord::new(id(4), root, "late"))
        .await
        .unwrap();
    let three = forkhive_core::Usage {
        output_tokens: 3,
        ..Default::default()
    };
    r.roll_up(&id(4), three).await.unwrap();
    r.transition(&id(4), TaskState::Failed).await.unwrap();
    assert_eq!(r.descendants_usage(&root).await.output_tokens, 3);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        r.descendants_usage(&root).await.output_tokens,
        0,
        "the root's usage expired"
    );
}

/// A task made again after its record expired (a message resumes an ended child) is listed
/// once among its parent's children.
#[tokio::test]
async fn a_task_made_again_after_it_expired_is_listed_once() {
    use forkhive_spawn::task::{TaskRecord, TaskRegistry, TaskState};
    let Some((r, id)) = registry_kept_300ms("again") else {
        return;
    };
    let (root, parent, child, sibling) = (id(1), id(2), id(3), id(4));
    r.create(TaskRecord::new(parent, root, "p")).await.unwrap();
    r.transition(&parent, TaskState::Running).await.unwrap();
    r.create(TaskRecord::new(child, parent, "c")).await.unwrap();
    r.create(TaskRecord::new(sibling, parent, "s"))
        .await
        .unwrap();
    r.transition(&child, TaskState::Completed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(r.get(&child).await.is_none(), "the child expired");
    r.create(TaskRecord::new(child, parent, "c")).await.unwrap();
    let listed: Vec<forkhive_core::TaskId> =
        r.children(&parent).await.iter().map(|t| t.id).collect();
    assert_eq!(listed, [child, sibling]);
}

/// A malformed cycle above a task ends the ancestor walk at its first repeat: usage reaches
/// each ancestor once.
#[tokio::test]
async fn a_cycle_of_parents_is_walked_once() {
    use forkhive_core::{TaskId, TaskKind, Usage};
    use forkhive_spawn::task::{RedisTaskRegistry, TaskRecord, TaskRegistry};
    let Some(url) = url() else { return };
    let r = RedisTaskRegistry::new(&url, &prefix("cycle")).unwrap();
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let id = |n: u64| TaskId::from_entropy(TaskKind::Agent, base + n);
    let (x, y, z, w) = (id(1), id(2), id(3), id(4));
    r.create(TaskRecord::new(x, y, "x")).await.unwrap();
    r.create(TaskRecord::new(y, x, "y")).await.unwrap();
    r.create(TaskRecord::new(z, x, "z")).await.unwrap();
    r.create(TaskRecord::new(w, z, "w")).await.unwrap();
    let started = std::time::Instant::now();
    let one = Usage {
        output_tokens: 1,
        ..Usage::default()
    };
    r.roll_up(&w, one).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.descendants_usage(&x).await.output_tokens, 1);
    assert_eq!(r.descendants_usage(&y).await.output_tokens, 1);
}

/// A lead's background children, their lives recorded in Redis: every child ends once, with
/// one notification, its record terminal and its usage rolled up to the lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_children_on_a_redis_registry_notify_once() {
    use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
    use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    use forkhive_spawn::runtime::{Agent, StopReason};
    use forkhive_spawn::task::{
        RedisTaskRegistry, TaskConfig, TaskRegistry, TaskService, TaskState,
    };
    use forkhive_spawn::tool::ToolPool;
    use support::*;
    let Some(url) = url() else { return };
    let registry = Arc::new(RedisTaskRegistry::new(&url, &prefix("bg")).unwrap());
    let service = TaskService::new(registry.clone(), TaskConfig::default());
    let mut w = AgentDefinition::new("worker", "works", DefinitionSource::Host);
    w.model = Some("m".into());
    let tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([w]))
            .with_warm_fanout(None),
    )
    .unwrap();
    let b = brain(|r| {
        if is_parent(r) {
            if r.all_messages().len() == 1 {
                let call = r#"{"description":"job","prompt":"p","subagent_type":"worker","run_in_background":true}"#;
                return Plan::Reply(calls(&[
                    ("a", "Agent", call),
                    ("b", "Agent", call),
                    ("c", "Agent", call),
                ]));
            }
            return Plan::Reply(say("waiting"));
        }
        Plan::Reply(say("done"))
    });
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(ToolPool::new([tool.arc()]).unwrap())
        .extension(Arc::clone(&service))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the run ended");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(notifications(&lead).len(), 3, "one notification per child");
    let me = *lead.context().id();
    let children = registry.children(&me).await;
    assert_eq!(children.len(), 3);
    assert!(
        children.iter().all(|c| c.state == TaskState::Completed),
        "{children:?}"
    );
    assert_eq!(registry.descendants_usage(&me).await.output_tokens, 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_redis_notification_queue_conforms() {
    use forkhive_spawn::task::{NotificationQueue, RedisNotificationQueue};
    let Some(url) = url() else { return };
    let store = RedisNotificationQueue::new(&url, &prefix("queue")).unwrap();
    forkhive_spawn::task::queue::conformance::run(|| {
        Arc::new(store.reopen()) as Arc<dyn NotificationQueue>
    })
    .await
    .unwrap();
}
