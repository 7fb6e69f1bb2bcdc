//! Mailboxes: the conformance suite for every backend, Claude Code's inbox files read and
//! written as they are, ten writer processes into one inbox, and every bad input's exact error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;

use forkhive_spawn::Error;
use forkhive_spawn::mailbox::{FileMailbox, Inbox, Letter, Mailbox, MemoryMailbox, conformance};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_memory_mailbox_conforms() {
    let store = MemoryMailbox::new();
    conformance::run(|| Arc::new(store.clone()) as Arc<dyn Mailbox>)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_file_mailbox_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    conformance::run(|| Arc::new(FileMailbox::new(&root)) as Arc<dyn Mailbox>)
        .await
        .unwrap();
}

/// An inbox as Claude Code writes it: entries with and without `msg_id`, one already read, and
/// a field this build does not know — which survives our writes.
const CLAUDE_INBOX: &str = r#"[
  {"from":"team-lead","text":"Start with the parser.","timestamp":"2026-11-24T10:00:00.000Z","read":false,"color":"blue","summary":"parser first"},
  {"from":"team-lead","text":"Old news.","timestamp":"2026-11-24T09:00:00.000Z","read":true},
  {"from":"researcher","text":"{\"type\":\"idle_notification\",\"from\":\"researcher\",\"idleReason\":\"available\"}","timestamp":"2026-11-24T10:00:01.000Z","read":false,"msg_id":"6f1c2d3e-0000-4000-8000-000000000001","type":"message","x-extra":7}
]"#;

#[tokio::test]
async fn a_claude_code_inbox_is_read_and_written_in_its_own_format() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("my-team", "worker-1").unwrap();
    let path = mail.path(&me);
    assert!(path.ends_with("teams/my-team/inboxes/worker-1.json"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, CLAUDE_INBOX).unwrap();
    let got = mail.receive(&me).await.unwrap();
    assert_eq!(got.len(), 2, "the entry marked read is not delivered");
    assert_eq!(got[0].from, "team-lead");
    assert_eq!(got[0].summary.as_deref(), Some("parser first"));
    assert_eq!(got[0].color.as_deref(), Some("blue"));
    assert!(got[0].id.starts_with("sha256:"), "{}", got[0].id);
    assert_eq!(got[1].id, "6f1c2d3e-0000-4000-8000-000000000001");
    // Our letter is appended in the same shape; the unknown field is kept.
    mail.send(&me, Letter::new("forkhive", "hello").with_summary("hi"))
        .await
        .unwrap();
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let entries = raw.as_array().unwrap();
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[2]["x-extra"], 7);
    let ours = &entries[3];
    for key in [
        "from",
        "text",
        "timestamp",
        "read",
        "msg_id",
        "type",
        "summary",
    ] {
        assert!(ours.get(key).is_some(), "{key} missing in {ours}");
    }
    assert_eq!(ours["read"], false);
    assert_eq!(ours["type"], "message");
    // Acknowledging removes those entries and the one already read.
    mail.ack(&me, &[got[0].id.clone()]).await.unwrap();
    let left: Vec<String> = mail
        .receive(&me)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.text)
        .collect();
    assert_eq!(left.len(), 2);
    assert_eq!(left[1], "hello");
    assert_eq!(mail.stored(&me).await.unwrap(), 2);
}

/// An inbox grown to 2 MB of letters marked read (Claude Code's writer marks, never prunes)
/// still delivers the one unread letter at its end, and acknowledging it prunes the file
/// (a peer's users report an unpruned 1.77 MB inbox that stopped delivering).
#[tokio::test]
async fn a_two_megabyte_inbox_of_read_letters_still_delivers_and_is_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("my-team", "worker-1").unwrap();
    let path = mail.path(&me);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let filler = "x".repeat(1000);
    let mut entries: Vec<serde_json::Value> = (0..2000)
        .map(|i| {
            serde_json::json!({
                "from": "team-lead",
                "text": format!("{i} {filler}"),
                "timestamp": "2026-01-01T00:00:00.000Z",
                "read": true,
            })
        })
        .collect();
    entries.push(serde_json::json!({
        "from": "team-lead",
        "text": "the one you have not read",
        "timestamp": "2026-01-01T00:00:01.000Z",
        "read": false,
    }));
    std::fs::write(&path, serde_json::to_vec(&entries).unwrap()).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > 2_000_000);
    let got = mail.receive(&me).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].text, "the one you have not read");
    mail.ack(&me, &[got[0].id.clone()]).await.unwrap();
    assert_eq!(mail.stored(&me).await.unwrap(), 0);
    assert!(mail.receive(&me).await.unwrap().is_empty());
    let left = std::fs::metadata(&path).unwrap().len();
    assert!(left < 100, "the inbox still holds {left} bytes");
}

/// A reader waiting on a file inbox is woken by the operating system when another program
/// (here: a plain write of Claude Code's format, as its own writer does) changes the file —
/// not by polling, so an idle reader costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_reader_is_woken_by_a_change_it_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let inbox = Inbox::new("crew", "alice").unwrap();
    assert!(!mail.is_watched(&inbox));
    let waiter = {
        let (mail, inbox) = (mail.clone(), inbox.clone());
        tokio::spawn(async move {
            mail.wait(&inbox, std::time::Duration::from_secs(3600))
                .await
        })
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !mail.is_watched(&inbox) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the wait watches the inbox directory");
    // Every handle on the root shares the watcher.
    assert!(FileMailbox::new(dir.path()).is_watched(&inbox));
    let file = mail.path(&inbox);
    let tmp = file.with_extension("json.tmp-other");
    std::fs::write(
        &tmp,
        r#"[{"from":"team-lead","text":"hi","timestamp":"2026-11-24T10:00:00.000Z","read":false}]"#,
    )
    .unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let woke = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .expect("woken long before the 30 s look")
        .unwrap()
        .unwrap();
    assert!(woke);
    assert_eq!(mail.receive(&inbox).await.unwrap()[0].text, "hi");
}

#[tokio::test]
async fn a_damaged_inbox_is_an_error_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("t", "a").unwrap();
    let path = mail.path(&me);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "[{\"from\":").unwrap();
    let e = mail.send(&me, Letter::new("x", "y")).await.unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "mailbox t/a: {} is not valid JSON (",
            path.display()
        )),
        "{e}"
    );
    assert!(e.to_string().ends_with("); it is left as it is"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "[{\"from\":");
    std::fs::write(&path, "{\"from\":\"x\"}").unwrap();
    assert_eq!(
        mail.receive(&me).await.unwrap_err().to_string(),
        format!(
            "mailbox t/a: {} is not a JSON array of entries",
            path.display()
        )
    );
    // Entries that are not letters are never delivered (a blank letter from nobody), nor
    // counted, nor removed — marked read or not, with an id or not — and a letter sent with
    // the id of one is stored all the same; the letters around them come and go as usual.
    let foreign = r#"[{"from":3,"text":"x"},{"text":"no sender"},42,"str",{"from":"","text":"y","read":true},{"kind":"other-program","read":true},{"msg_id":"m1","from":null,"text":"x"}]"#;
    std::fs::write(&path, foreign).unwrap();
    assert!(mail.receive(&me).await.unwrap().is_empty());
    assert_eq!(mail.stored(&me).await.unwrap(), 0);
    mail.send(&me, Letter::new("x", "hello")).await.unwrap();
    assert_eq!(
        mail.send(&me, Letter::new("x", "real").with_id("m1"))
            .await
            .unwrap(),
        "m1"
    );
    let got = mail.receive(&me).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|d| (d.from.as_str(), d.text.as_str()))
            .collect::<Vec<_>>(),
        [("x", "hello"), ("x", "real")]
    );
    assert_eq!(got[1].id, "m1");
    assert_eq!(mail.stored(&me).await.unwrap(), 2);
    mail.ack(&me, &[got[0].id.clone(), got[1].id.clone()])
        .await
        .unwrap();
    assert_eq!(mail.stored(&me).await.unwrap(), 0);
    let left: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        left,
        serde_json::from_str::<serde_json::Value>(foreign).unwrap(),
        "left as they were"
    );
}

/// A lock held by a live writer: the sender gets a typed error after its budget, never a
/// silent drop. A lock left by a writer that died long ago is broken.
#[tokio::test]
async fn a_held_lock_is_a_typed_error_and_a_stale_one_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("t", "a").unwrap();
    let path = mail.path(&me);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let lock = path.with_extension("json.lock");
    std::fs::write(&lock, "").unwrap();
    let e = mail.send(&me, Letter::new("x", "y")).await.unwrap_err();
    assert!(
        matches!(e, Error::MailboxBusy { attempts: 10, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "mailbox lock {} still held after 10 attempts: the message was not sent",
            lock.display()
        )
    );
    assert_eq!(mail.stored(&me).await.unwrap(), 0);
    // Aged past the stale limit: broken, and the send goes through.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    mail.send(&me, Letter::new("x", "y")).await.unwrap();
    assert_eq!(mail.stored(&me).await.unwrap(), 1);
    assert!(!lock.exists());
}

/// Makes `me`'s inbox directory, and in it a lock left by a writer that died a minute ago;
/// returns the inbox's path and the lock's.
fn stale_lock(mail: &FileMailbox, me: &Inbox) -> (std::path::PathBuf, std::path::PathBuf) {
    let path = mail.path(me);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let lock = path.with_extension("json.lock");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::create(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    (path, lock)
}

/// Senders that find one stale lock at once, and race to break it: every letter is stored
/// (two writers holding the inbox together would overwrite each other's), and nothing is left
/// beside the inbox — no lock, no breaker's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_racing_to_break_one_stale_lock_all_deliver() {
    const SENDERS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    for round in 0..20 {
        let me = Inbox::new("t", format!("a{round}")).unwrap();
        let (path, _) = stale_lock(&mail, &me);
        let sends: Vec<_> = (0..SENDERS)
            .map(|i| {
                let (mail, me) = (mail.clone(), me.clone());
                tokio::spawn(async move { mail.send(&me, Letter::new("x", format!("{i}"))).await })
            })
            .collect();
        for send in sends {
            send.await.unwrap().unwrap();
        }
        assert_eq!(mail.stored(&me).await.unwrap(), SENDERS, "round {round}");
        let stray: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("a{round}.")) && *n != format!("a{round}.json"))
            .collect();
        assert!(stray.is_empty(), "round {round}: {stray:?}");
    }
}

/// A writer that finds another writer breaking a stale lock waits for it as it would for a
/// held lock, rather than spending its tries at once: with the other breaker stuck, the send
/// is refused busy only after its whole backoff (at least 277 ms: half of each step).
#[tokio::test]
async fn a_writer_waits_for_another_breaker_as_for_a_held_lock() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("t", "a").unwrap();
    let (path, lock) = stale_lock(&mail, &me);
    std::fs::write(path.with_extension("json.lock.break"), "another").unwrap();
    let start = std::time::Instant::now();
    let e = mail.send(&me, Letter::new("x", "y")).await.unwrap_err();
    assert!(
        matches!(e, Error::MailboxBusy { attempts: 10, .. }),
        "{e:?}"
    );
    assert!(
        start.elapsed() >= std::time::Duration::from_millis(277),
        "refused after {:?}",
        start.elapsed()
    );
    assert!(lock.exists(), "the lock is the other breaker's to break");
}

/// Whether a temporary file of the inbox at `path` is there (a write in progress).
fn writing(path: &std::path::Path) -> bool {
    std::fs::read_dir(path.parent().unwrap()).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".tmp-"))
    })
}

/// A send or an acknowledgement whose future is dropped at any point (a teammate's relay is
/// aborted when it ends, a host's timeout) never costs another writer its letter, and leaves
/// no lock or temporary file behind: once the lock is taken, the update runs to its end and
/// the lock goes after the rename. Before, a drop while the lock file was being created left
/// it without a holder (the next send spent its budget and failed busy: every run of this
/// test), a drop mid-write left the temporary file (every run, with the lock fixed alone),
/// and the lock went with the dropped future while its rename was still queued, so that
/// rename could land over the next writer's letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_or_ack_loses_no_other_letter_and_leaves_no_lock() {
    const ROUNDS: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("t", "a").unwrap();
    let path = mail.path(&me);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut kept: Vec<(usize, String)> = Vec::new();
    // The rounds whose letter an ack (dropped or not) named: those may be gone.
    let mut targeted: Vec<usize> = Vec::new();
    for round in 0..ROUNDS {
        let polls = round % 12 + 1;
        // A send, or an acknowledgement of the first kept letter, dropped after `polls` polls.
        {
            let dropped: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
                if round % 2 == 0 || kept.is_empty() {
                    let m = mail.clone();
                    let to = me.clone();
                    Box::pin(async move {
                        // Long, so the drop often comes while its file is being written.
                        let text = format!("{round} {}", "x".repeat(64 << 10));
                        m.send(&to, Letter::new("dropped", text)).await.map(|_| ())
                    })
                } else {
                    let m = mail.clone();
                    let to = me.clone();
                    // The letter sent last: each ack rewrites the file.
                    let (round, id) = kept.last().cloned().unwrap_or_default();
                    targeted.push(round);
                    Box::pin(async move { m.ack(&to, &[id]).await })
                };
            let mut dropped = dropped;
            // Dropped after `polls` polls, or — every third round — as soon as its temporary
            // file is there (mid-write), wherever the blocking pool's pace puts that.
            let mid_write = round % 3 == 0;
            for _ in 0..if mid_write { 10_000 } else { polls } {
                if futures::poll!(dropped.as_mut()).is_ready() {
                    break;
                }
                if mid_write && writing(&path) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        // The next writer, at once: its letter must stay.
        let id = mail
            .send(&me, Letter::new("kept", format!("{round}")))
            .await
            .unwrap();
        kept.push((round, id));
    }
    // Whatever the dropped ones left running has landed.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let stored: Vec<String> = mail
        .receive(&me)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.from == "kept")
        .map(|d| d.text)
        .collect();
    // Every kept letter is there, but those an ack named.
    let missing: Vec<usize> = (0..ROUNDS)
        .filter(|r| !stored.contains(&r.to_string()))
        .collect();
    assert!(
        missing.iter().all(|r| targeted.contains(r)),
        "kept letters lost: rounds {missing:?}; only those acknowledged ({targeted:?}) may be gone"
    );
    assert!(!targeted.is_empty());
    let left: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".lock") || n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

const WRITERS: usize = 10;

/// Letters per writer: 1,000 under `CI=true` (about a minute: every writer backs off 5-100 ms
/// on a taken lock, as Claude Code's do), 100 elsewhere; `FORKHIVE_MAILBOX_EACH` overrides.
fn each() -> usize {
    std::env::var("FORKHIVE_MAILBOX_EACH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if std::env::var("CI").as_deref() == Ok("true") {
            1000
        } else {
            100
        })
}

/// Run as a child process by the test below: writes `EACH` letters from writer `N`.
#[tokio::test]
#[ignore = "a writer process for ten_writer_processes_lose_and_double_nothing"]
async fn mailbox_writer_process() {
    let (Ok(root), Ok(n)) = (
        std::env::var("FORKHIVE_MAILBOX_ROOT"),
        std::env::var("FORKHIVE_MAILBOX_WRITER"),
    ) else {
        return;
    };
    let mail = FileMailbox::new(root);
    let to = Inbox::new("load", "reader").unwrap();
    let mut busy = 0u64;
    for i in 0..each() {
        loop {
            match mail
                .send(&to, Letter::new(format!("w{n}"), format!("{i}")))
                .await
            {
                Ok(_) => break,
                Err(Error::MailboxBusy { .. }) => busy += 1,
                Err(e) => panic!("writer {n}: {e}"),
            }
        }
    }
    println!("busy={busy}");
}

/// Ten writer processes send 1,000 letters each (see [`each`]) into one inbox while this process reads and
/// acknowledges: every letter arrives once, each writer's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_writer_processes_lose_and_double_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let me = Inbox::new("load", "reader").unwrap();
    let exe = std::env::current_exe().unwrap();
    let started = std::time::Instant::now();
    let children: Vec<_> = (0..WRITERS)
        .map(|n| {
            tokio::process::Command::new(&exe)
                .args([
                    "--exact",
                    "mailbox_writer_process",
                    "--ignored",
                    "--nocapture",
                ])
                .env("FORKHIVE_MAILBOX_ROOT", dir.path())
                .env("FORKHIVE_MAILBOX_WRITER", n.to_string())
                .env("FORKHIVE_MAILBOX_EACH", each().to_string())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let waits = tokio::spawn(async move {
        let mut busy = 0u64;
        for c in children {
            let out = c.wait_with_output().await.unwrap();
            assert!(out.status.success(), "a writer failed");
            let text = String::from_utf8_lossy(&out.stdout);
            busy += text
                .lines()
                .find_map(|l| l.strip_prefix("busy="))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        busy
    });
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    let mut ids = std::collections::HashSet::new();
    let mut reader_busy = 0u64;
    let total = WRITERS * each();
    let mut got = 0;
    while got < total {
        let batch = mail.receive(&me).await.unwrap();
        let mut acked = Vec::new();
        for d in batch {
            // Received again before an acknowledgement went through: not new.
            if !ids.insert(d.id.clone()) {
                continue;
            }
            seen.entry(d.from.clone())
                .or_default()
                .push(d.text.parse().unwrap());
            acked.push(d.id);
            got += 1;
        }
        loop {
            match mail.ack(&me, &acked).await {
                Ok(()) => break,
                Err(Error::MailboxBusy { .. }) => reader_busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        if started.elapsed() > std::time::Duration::from_secs(300) {
            panic!("only {got} of {total} letters after 300 s");
        }
        // A reader that polls (as Claude Code's does, once a second) rather than spins.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let writer_busy = waits.await.unwrap();
    assert_eq!(seen.len(), WRITERS);
    for (from, seq) in &seen {
        assert_eq!(
            seq,
            &(0..each()).collect::<Vec<_>>(),
            "{from}: lost, doubled or out of order"
        );
    }
    // Nothing more arrives, and the inbox was pruned as it was read.
    assert!(mail.receive(&me).await.unwrap().is_empty());
    assert_eq!(mail.stored(&me).await.unwrap(), 0);
    eprintln!(
        "{total} letters from {WRITERS} processes in {:.2?}: 0 lost, 0 doubled; busy retries: \
         writers {writer_busy}, reader {reader_busy}",
        started.elapsed()
    );
}

/// An inbox file is never read through a symlink: a link planted at alice's inbox that points
/// at bob's would hand her his letters. She is refused, saying why, and his letters stay his.
#[cfg(unix)]
#[tokio::test]
async fn an_inbox_that_is_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mail = FileMailbox::new(dir.path());
    let (alice, bob) = (
        Inbox::new("crew", "alice").unwrap(),
        Inbox::new("crew", "bob").unwrap(),
    );
    mail.send(&bob, Letter::new("team-lead", "for bob only"))
        .await
        .unwrap();
    std::os::unix::fs::symlink(mail.path(&bob), mail.path(&alice)).unwrap();
    let err = mail.receive(&alice).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "mailbox crew/alice: {} is a symlink; an inbox is read only from a file of its own",
            mail.path(&alice).display()
        )
    );
    let his = mail.receive(&bob).await.unwrap();
    assert_eq!(his.len(), 1);
    assert_eq!(his[0].text, "for bob only");
}

/// A host's own mailbox, as a user would write one: letters per inbox behind an async lock
/// (with an await inside, as a network would have), built with `Delivered::new`. `swap`: it
/// hands the first two letters back swapped (a store that does not keep arrival order).
#[derive(Debug, Clone, Default)]
struct Own {
    store: Arc<tokio::sync::Mutex<HashMap<String, Vec<forkhive_spawn::mailbox::Delivered>>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
    swap: bool,
}

#[async_trait::async_trait]
impl Mailbox for Own {
    async fn send(&self, to: &Inbox, letter: Letter) -> forkhive_spawn::Result<String> {
        let mut store = self.store.lock().await;
        tokio::task::yield_now().await;
        let letters = store.entry(to.to_string()).or_default();
        let id = letter.id.clone().unwrap_or_else(|| {
            let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("own-{n}")
        });
        if !letters.iter().any(|d| d.id == id) {
            letters.push(forkhive_spawn::mailbox::Delivered::new(
                id.clone(),
                letter,
                forkhive_spawn::mailbox::timestamp_now(),
            ));
        }
        Ok(id)
    }
    async fn receive(
        &self,
        inbox: &Inbox,
    ) -> forkhive_spawn::Result<Vec<forkhive_spawn::mailbox::Delivered>> {
        let store = self.store.lock().await;
        let mut got = store.get(&inbox.to_string()).cloned().unwrap_or_default();
        if self.swap && got.len() > 1 {
            got.swap(0, 1);
        }
        Ok(got)
    }
    async fn ack(&self, inbox: &Inbox, ids: &[String]) -> forkhive_spawn::Result<()> {
        let mut store = self.store.lock().await;
        if let Some(letters) = store.get_mut(&inbox.to_string()) {
            letters.retain(|d| !ids.contains(&d.id));
        }
        Ok(())
    }
    async fn stored(&self, inbox: &Inbox) -> forkhive_spawn::Result<usize> {
        Ok(self
            .store
            .lock()
            .await
            .get(&inbox.to_string())
            .map_or(0, Vec::len))
    }
}

/// A host can write its own mailbox (`Delivered::new`); one that keeps no lead claims (the
/// trait's default) fails the suite, saying why and what to do, and passes the suite made for
/// a store one lead at most uses; one that loses the order letters were sent in across
/// senders fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_own_mailbox_is_held_to_the_suite() {
    let own = Own::default();
    let err = conformance::run(|| Arc::new(own.clone()) as Arc<dyn Mailbox>)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with(
            "claim_lead keeps no claim (the trait's default): two leads of one team could share \
             its inboxes and take each other's letters; implement claim_lead, or run \
             conformance::run_without_lead_claims for a store one lead at most ever uses"
        ),
        "{err}"
    );
    let own = Own::default();
    conformance::run_without_lead_claims(|| Arc::new(own.clone()) as Arc<dyn Mailbox>)
        .await
        .unwrap();
    let swapped = Own {
        swap: true,
        ..Own::default()
    };
    let err =
        conformance::run_without_lead_claims(|| Arc::new(swapped.clone()) as Arc<dyn Mailbox>)
            .await
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("letters sent one after another arrived as [\"b0\", \"a0\", \"a1\""),
        "{err}"
    );
}
