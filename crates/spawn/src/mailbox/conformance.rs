//! The one suite every [`Mailbox`] passes, unchanged: the order letters were sent in (per
//! sender, and across senders for letters sent one after another), nothing lost under
//! concurrent senders, nothing delivered again once acknowledged, unacknowledged letters
//! delivered again to a reader that restarted, acknowledged letters pruned, acknowledgement
//! idempotent, inboxes apart, a waiting reader woken by a letter from another handle, a
//! sender's own id kept and a repeated send with it stored once, a reader that holds letters
//! woken only by a new one.
//!
//! `open` makes a new handle on the same store each time it is called — what a reader that
//! crashed and came back would open. Call [`run`] from a test with a fresh store:
//!
//! ```
//! use std::sync::Arc;
//! use forkhive_spawn::mailbox::{Mailbox, MemoryMailbox, conformance};
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryMailbox::new();
//! conformance::run(|| Arc::new(store.clone()) as Arc<dyn Mailbox>).await?;
//! # Ok::<(), conformance::ConformanceError>(()) }).unwrap();
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use super::{Inbox, Letter, Mailbox};

pub use crate::base::conformance::ConformanceError;
use crate::base::conformance::Suite;

/// This suite, named in its errors.
const S: Suite = Suite("mailbox");

fn inbox(agent: &str) -> Result<Inbox, ConformanceError> {
    S.op(Inbox::new("conformance", agent), "Inbox::new")
}

/// Runs every check (each on inboxes of its own). Needs a multi-threaded runtime for the
/// concurrent senders to run in parallel (it passes on one thread too).
pub async fn run<F>(open: F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn Mailbox>,
{
    run_without_lead_claims(&open).await?;
    a_lead_is_claimed_once(open(), true).await
}

/// [`run`] for a mailbox that keeps no lead claims ([`Mailbox::claim_lead`]'s default): every
/// check but that one, which then only checks that a claim does not fail. Only for a store
/// that one lead at most ever uses — on a shared one, two leads of a team would share its
/// inboxes and take each other's letters.
pub async fn run_without_lead_claims<F>(open: F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn Mailbox>,
{
    order_per_sender(open()).await?;
    redelivery_until_acknowledged(&open).await?;
    pruned_and_idempotent(open()).await?;
    concurrent_senders_lose_nothing(open()).await?;
    inboxes_are_apart(open()).await?;
    a_waiting_reader_wakes(&open).await?;
    senders_ids_are_kept(&open).await?;
    a_lead_is_claimed_once(open(), false).await
}

/// A team's lead claimed and kept ([`LeadClaim::is_kept`](super::LeadClaim::is_kept)) refuses a
/// second claim of that team, not of another, until it is given up. `kept`: the mailbox must
/// keep claims (without it, a claim only must not fail).
async fn a_lead_is_claimed_once(m: Arc<dyn Mailbox>, kept: bool) -> Result<(), ConformanceError> {
    let first = S.op(m.claim_lead("claimed").await, "claim_lead")?;
    if !first.is_kept() {
        return S.check(!kept, || {
            "claim_lead keeps no claim (the trait's default): two leads of one team could share \
             its inboxes and take each other's letters; implement claim_lead, or run \
             conformance::run_without_lead_claims for a store one lead at most ever uses"
                .into()
        });
    }
    let second = m.claim_lead("claimed").await;
    S.check(
        matches!(second, Err(crate::Error::TeamTaken { ref team, .. }) if team == "claimed"),
        || format!("a second claim of a claimed team gave {second:?}"),
    )?;
    let other = S.op(m.claim_lead("another").await, "claim_lead of another team")?;
    drop((first, other));
    // Given up when dropped; a networked store hears of it a moment later.
    let mut again = m.claim_lead("claimed").await;
    for _ in 0..40 {
        if again.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        again = m.claim_lead("claimed").await;
    }
    let again = S.op(again, "claim_lead after it was given up (within 2 s)")?;
    S.check(again.is_kept(), || {
        "a claim after the first was given up was not kept".into()
    })
}

async fn senders_ids_are_kept<F>(open: &F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn Mailbox>,
{
    let to = inbox("ids")?;
    let id = super::new_id();
    let letter = Letter::new("w", "once").with_id(id.clone());
    let first = S.op(open().send(&to, letter.clone()).await, "send")?;
    S.check(first == id, || {
        format!("a letter sent with id {id} was stored as {first}")
    })?;
    // The sender did not learn the outcome and sends again, through another handle.
    let again = S.op(open().send(&to, letter).await, "send again")?;
    S.check(again == id, || {
        format!("the repeated send returned {again}")
    })?;
    let got = S.op(open().receive(&to).await, "receive")?;
    S.check(got.len() == 1 && got[0].id == id, || {
        format!("a letter sent twice with one id was delivered as {got:?}")
    })
}

async fn a_waiting_reader_wakes<F>(open: &F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn Mailbox>,
{
    use std::time::Duration;
    let to = inbox("wait")?;
    let reader = open();
    let quiet = S.op(reader.wait(&to, Duration::from_millis(100)).await, "wait")?;
    S.check(!quiet, || {
        "wait on an empty inbox said a letter came".into()
    })?;
    let waiter = {
        let (reader, to) = (Arc::clone(&reader), to.clone());
        tokio::spawn(async move { reader.wait(&to, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    S.op(open().send(&to, Letter::new("w", "wake up")).await, "send")?;
    let woke = match tokio::time::timeout(Duration::from_secs(5), waiter).await {
        Ok(Ok(r)) => S.op(r, "wait")?,
        Ok(Err(e)) => return Err(S.fail(format!("a waiter panicked: {e}"))),
        Err(_) => return Err(S.fail("a waiter did not wake within 5 s".into())),
    };
    S.check(woke, || "wait returned without the letter".into())?;
    // A letter already there: at once.
    S.check(
        S.op(reader.wait(&to, Duration::ZERO).await, "wait")?,
        || "wait did not see a letter already in the inbox".into(),
    )?;
    // A reader holding that letter unacknowledged waits for the next one only.
    let held: Vec<String> = S
        .op(reader.receive(&to).await, "receive")?
        .into_iter()
        .map(|d| d.id)
        .collect();
    let quiet = S.op(
        reader
            .wait_beyond(&to, &held, Duration::from_millis(100))
            .await,
        "wait_beyond",
    )?;
    S.check(!quiet, || {
        "wait_beyond returned for a letter the reader already holds".into()
    })?;
    let waiter = {
        let (reader, to, held) = (Arc::clone(&reader), to.clone(), held.clone());
        tokio::spawn(async move {
            reader
                .wait_beyond(&to, &held, Duration::from_secs(10))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    S.op(
        open().send(&to, Letter::new("w", "and another")).await,
        "send",
    )?;
    let woke = match tokio::time::timeout(Duration::from_secs(5), waiter).await {
        Ok(Ok(r)) => S.op(r, "wait_beyond")?,
        Ok(Err(e)) => return Err(S.fail(format!("a waiter panicked: {e}"))),
        Err(_) => {
            return Err(S.fail("a wait_beyond did not wake within 5 s".into()));
        }
    };
    S.check(woke, || {
        "wait_beyond returned without the new letter".into()
    })
}

async fn order_per_sender(m: Arc<dyn Mailbox>) -> Result<(), ConformanceError> {
    let to = inbox("order")?;
    S.check(S.op(m.receive(&to).await, "receive")?.is_empty(), || {
        "an inbox nobody wrote to is not empty".into()
    })?;
    for i in 0..5 {
        for from in ["a", "b"] {
            S.op(
                m.send(
                    &to,
                    Letter::new(from, format!("{from}{i}")).with_summary("s"),
                )
                .await,
                "send",
            )?;
        }
    }
    let got = S.op(m.receive(&to).await, "receive")?;
    S.check(got.len() == 10, || {
        format!(
            "10 letters sent one after another to inbox {to}, {} received",
            got.len()
        )
    })?;
    // Letters from different senders, sent one after another, arrive in that order.
    let all: Vec<&str> = got.iter().map(|d| d.text.as_str()).collect();
    let sent: Vec<String> = (0..5)
        .flat_map(|i| [format!("a{i}"), format!("b{i}")])
        .collect();
    S.check(all == sent, || {
        format!("letters sent one after another arrived as {all:?}, not in the order sent")
    })?;
    for from in ["a", "b"] {
        let texts: Vec<&str> = got
            .iter()
            .filter(|d| d.from == from)
            .map(|d| d.text.as_str())
            .collect();
        let want: Vec<String> = (0..5).map(|i| format!("{from}{i}")).collect();
        S.check(texts == want, || {
            format!("{from}'s letters out of order: {texts:?}")
        })?;
    }
    S.check(
        got.iter()
            .all(|d| d.summary.as_deref() == Some("s") && d.timestamp.ends_with('Z')),
        || "a letter lost its summary or timestamp".into(),
    )?;
    let ids: std::collections::HashSet<&str> = got.iter().map(|d| d.id.as_str()).collect();
    S.check(ids.len() == 10, || "two letters share an id".into())
}

async fn redelivery_until_acknowledged<F>(open: &F) -> Result<(), ConformanceError>
where
    F: Fn() -> Arc<dyn Mailbox>,
{
    let to = inbox("redelivery")?;
    let writer = open();
    for i in 0..3 {
        S.op(
            writer.send(&to, Letter::new("w", format!("m{i}"))).await,
            "send",
        )?;
    }
    // A reader reads, then crashes before acknowledging: a new one gets the same letters.
    let first = S.op(open().receive(&to).await, "receive")?;
    let again = S.op(open().receive(&to).await, "receive")?;
    S.check(first == again, || {
        format!("unacknowledged letters changed between readers: {first:?} then {again:?}")
    })?;
    S.check(first.len() == 3, || {
        format!("3 sent, {} received", first.len())
    })?;
    // The new reader acknowledges the first two; only the third comes again.
    let reader = open();
    S.op(
        reader
            .ack(&to, &[first[0].id.clone(), first[1].id.clone()])
            .await,
        "ack",
    )?;
    let rest = S.op(open().receive(&to).await, "receive")?;
    S.check(rest.len() == 1 && rest[0].text == "m2", || {
        format!("after acknowledging 2 of 3, got {rest:?}")
    })
}

async fn pruned_and_idempotent(m: Arc<dyn Mailbox>) -> Result<(), ConformanceError> {
    let to = inbox("prune")?;
    for round in 0..20 {
        S.op(
            m.send(&to, Letter::new("w", format!("r{round}"))).await,
            "send",
        )?;
        let got = S.op(m.receive(&to).await, "receive")?;
        let ids: Vec<String> = got.iter().map(|d| d.id.clone()).collect();
        S.op(m.ack(&to, &ids).await, "ack")?;
        // Acknowledging again, or an id never issued, changes nothing.
        S.op(m.ack(&to, &ids).await, "ack again")?;
        S.op(m.ack(&to, &["no-such-id".to_owned()]).await, "ack unknown")?;
    }
    let stored = S.op(m.stored(&to).await, "stored")?;
    S.check(stored == 0, || {
        format!("{stored} acknowledged letters are still stored: an inbox must be pruned")
    })?;
    S.check(S.op(m.receive(&to).await, "receive")?.is_empty(), || {
        "an acknowledged letter came back".into()
    })
}

async fn concurrent_senders_lose_nothing(m: Arc<dyn Mailbox>) -> Result<(), ConformanceError> {
    const SENDERS: usize = 8;
    const EACH: usize = 50;
    let to = inbox("concurrent")?;
    let tasks: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (m, to) = (Arc::clone(&m), to.clone());
            tokio::spawn(async move {
                for i in 0..EACH {
                    // A writer that meets a busy lock tries again: never a silent drop.
                    loop {
                        match m
                            .send(&to, Letter::new(format!("s{s}"), format!("{i}")))
                            .await
                        {
                            Ok(_) => break,
                            Err(crate::Error::MailboxBusy { .. }) => tokio::task::yield_now().await,
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(S.fail(format!("a sender failed: {e}"))),
            Err(e) => return Err(S.fail(format!("a sender panicked: {e}"))),
        }
    }
    let got = S.op(m.receive(&to).await, "receive")?;
    let mut per: HashMap<&str, Vec<usize>> = HashMap::new();
    for d in &got {
        per.entry(d.from.as_str())
            .or_default()
            .push(d.text.parse().unwrap_or(usize::MAX));
    }
    S.check(got.len() == SENDERS * EACH, || {
        format!("{} sent at once, {} received", SENDERS * EACH, got.len())
    })?;
    for (from, seq) in per {
        S.check(seq == (0..EACH).collect::<Vec<_>>(), || {
            format!("{from}'s letters lost, doubled or reordered")
        })?;
    }
    Ok(())
}

async fn inboxes_are_apart(m: Arc<dyn Mailbox>) -> Result<(), ConformanceError> {
    let (a, b) = (inbox("apart-a")?, inbox("apart-b")?);
    let other_team = S.op(Inbox::new("conformance-2", "apart-a"), "Inbox::new")?;
    S.op(m.send(&a, Letter::new("w", "for a")).await, "send")?;
    let (in_b, in_other) = (
        S.op(m.receive(&b).await, "receive")?,
        S.op(m.receive(&other_team).await, "receive")?,
    );
    S.check(in_b.is_empty() && in_other.is_empty(), || {
        "a letter reached another inbox".into()
    })?;
    let got = S.op(m.receive(&a).await, "receive")?;
    S.op(m.ack(&b, &[got[0].id.clone()]).await, "ack")?;
    S.check(S.op(m.receive(&a).await, "receive")?.len() == 1, || {
        "acknowledging in one inbox removed a letter from another".into()
    })
}
