//! [`Journal`]: where transcript records are written, off the async threads.
//!
//! A record used to be one trip to the blocking pool of its own: a pool thread woken for one
//! `write(2)`, then the writing task woken back. A wide fan-out writes thousands of records at
//! once and paid that trip for each. Records are queued instead, per transcript directory,
//! and one blocking-pool task at a time drains the queue: every record queued while it works
//! is written in the same trip.
//!
//! Each record queued is written once, in the order queued, unless writing it panics (then
//! its writer hears the write was lost, and the records after it are still written). A file
//! to make waits for the records queued before it, or for [`CREATE_EVERY`] of them at most.
//! A drainer on the blocking pool whose queue empties waits [`LINGER`] for more before it
//! ends. A drainer writes at most [`HANDOFF`] jobs and then hands the rest to a drainer on the
//! runtime of the newest job's writer, so a runtime being shut down waits for at most that
//! many of another runtime's records on its pool. A drainer the blocking pool drops unrun
//! (its runtime shutting down) drains the whole queue where it is dropped, and so does a
//! job queued outside any runtime when no drainer is running or waiting (one that is takes
//! it). A drainer running when its runtime shuts down holds the shutdown up by its jobs and
//! at most one wait. A record whose write fails is cut off its file before the next job
//! runs, so a file never holds part of a record followed by another. The
//! journal lets go of a record's file before its writer hears, so a writer dropped once it
//! has heard leaves the file (and its lock) to the next at once.
//!
//! One write at a time per directory: on a file system where each write waits for a server
//! (NFS mounted `sync`), a directory's records no longer overlap as they did on many pool
//! threads.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The outcome of one record's write, as its writer awaits it.
pub(super) type Written = oneshot::Receiver<Receipt>;

/// How a record's write went, with the record's buffer handed back: its writer reuses it for
/// its next record, and frees it, if it does, on its own thread. (Freed on the pool's thread,
/// every record's buffer went back to the allocator's arena of the thread that made it, and
/// the two threads contended for that arena's lock.)
#[derive(Debug)]
pub(super) struct Receipt {
    /// The write's outcome.
    pub(super) result: std::io::Result<()>,
    /// The record's bytes.
    pub(super) line: Vec<u8>,
}

/// The most jobs one drainer runs before it hands the queue to a new one.
const HANDOFF: usize = 256;

/// A transcript file open for appending, and its path (for what is logged of it).
#[derive(Debug)]
pub(super) struct Target {
    /// The file (its lock, if any, goes when the last handle to it does).
    pub(super) file: File,
    /// Where it is.
    pub(super) path: PathBuf,
}

/// The queue of one transcript directory (or of one file that is not a regular file).
/// Cloning is O(1): every clone writes through the same queue.
#[derive(Debug, Clone)]
pub(super) struct Journal(Arc<Shared>);

/// What the clones of a [`Journal`] share.
#[derive(Debug, Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Set by each job queued: a drainer waiting for more (see [`LINGER`]) looks here, not at
    /// the queue, so it takes the lock only when there is something to take.
    queued: std::sync::atomic::AtomicBool,
    /// Drainers started on a blocking pool, and waits for more (what the tests of
    /// [`LINGER`] count).
    #[cfg(test)]
    started: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    waited: std::sync::atomic::AtomicUsize,
    /// Records and files queued (what the writer's tests count: one per trip to the file a
    /// writer waits for, which may write more than one record).
    #[cfg(test)]
    jobs: std::sync::atomic::AtomicUsize,
}

/// The jobs waiting, and who drains them.
#[derive(Debug, Default)]
struct Queue {
    /// Records (and test jobs), in order.
    jobs: VecDeque<Job>,
    /// Files to make, in order: each after every record queued before the next is taken.
    /// Records go first, so the agents already writing finish (and let their memory go) while
    /// a burst of new ones waits to be made; a file's own records follow its making anyway.
    creates: VecDeque<Job>,
    /// Records written since a file was last made.
    records_in_a_row: usize,
    /// A drainer is running, or on its way: a new job waits for it rather than start another.
    draining: bool,
    /// The runtime of the newest job's writer: where the next drainer runs.
    runtime: Option<Handle>,
}

impl Queue {
    /// The job to run next: a record, unless none is waiting or [`CREATE_EVERY`] ran in a row
    /// while a file waits to be made.
    fn next_job(&mut self) -> Option<Job> {
        let create_first = self.records_in_a_row >= CREATE_EVERY && !self.creates.is_empty();
        let next = match create_first {
            true => self.creates.pop_front(),
            false => self.jobs.pop_front().or_else(|| self.creates.pop_front()),
        };
        self.records_in_a_row = match &next {
            Some(Job::Create { .. }) => 0,
            _ => self.records_in_a_row + 1,
        };
        next
    }
}

/// One step of a queue.
#[derive(Debug)]
enum Job {
    /// A record to append.
    Append {
        to: Arc<Target>,
        line: Vec<u8>,
        /// The file's length before the record: where a failed write is cut back to.
        cut_to: u64,
        done: oneshot::Sender<Receipt>,
    },
    /// A transcript file to make (it must not exist yet), and its first line.
    Create {
        path: PathBuf,
        options: std::fs::OpenOptions,
        first: Vec<u8>,
        done: oneshot::Sender<std::io::Result<Made>>,
    },
    /// A job that panics (what a drain does then is tested).
    #[cfg(test)]
    Panic,
}

impl Job {
    /// Runs the job and answers its writer, who may be gone.
    fn run(self) {
        match self {
            Job::Append {
                to,
                line,
                cut_to,
                done,
            } => {
                let written = (&to.file).write_all(&line);
                if written.is_err()
                    && let Err(e) = to.file.set_len(cut_to)
                {
                    tracing::warn!(
                        path = %to.path.display(),
                        "cutting a failed record off the transcript: {e}"
                    );
                }
                // The file's last handle here goes before the writer hears: a writer dropped
                // once it has heard lets its file (and lock) go at once.
                drop(to);
                // A writer that is gone has its record written all the same.
                let _ = done.send(Receipt {
                    result: written,
                    line,
                });
            }
            Job::Create {
                path,
                options,
                first,
                done,
            } => {
                if done.is_closed() {
                    // Its caller is gone (a start dropped, a runtime shutting down).
                    return;
                }
                let made = options
                    .open(&path)
                    .map(|file| Made::with_first(file, first));
                if let Err(Ok(unwanted)) = done.send(made) {
                    // Nobody is left to take it (the creating future was dropped): this job
                    // made it (it did not exist), so it goes again.
                    drop(unwanted);
                    let _ = std::fs::remove_file(&path);
                }
            }
            #[cfg(test)]
            Job::Panic => panic!("a job panicked"),
        }
    }
}

/// A file a [`Journal::create`] made, and how its first line went.
#[derive(Debug)]
pub(super) struct Made {
    /// The file.
    pub(super) file: File,
    /// `None` when the first line was not written: the file's lock was not free at once (the
    /// caller takes it, waiting, and writes the line itself). Otherwise the lock is held, where
    /// the platform and file system have such locks (for as long as the file is open), and
    /// this is how the write went; a failed write is cut off first. The line's bytes come back
    /// either way.
    pub(super) first: (Option<std::io::Result<()>>, Vec<u8>),
}

impl Made {
    /// `file`, just made, with `first` written to it under its lock when the lock can be
    /// taken without waiting: a new file and its header in one trip to the blocking pool,
    /// where they were two.
    pub(super) fn with_first(file: File, first: Vec<u8>) -> Self {
        if !matches!(crate::base::files::try_lock_once(&file), Ok(true)) {
            return Self {
                file,
                first: (None, first),
            };
        }
        let written = write_first(&file, &first);
        Self {
            file,
            first: (Some(written), first),
        }
    }
}

/// Writes `first` to the new `file`, cutting whatever of it was written off again when the
/// write fails.
fn write_first(file: &File, first: &[u8]) -> std::io::Result<()> {
    let mut to = file;
    let written = to.write_all(first);
    if written.is_err()
        && let Err(e) = file.set_len(0)
    {
        tracing::warn!("cutting a failed first line off a new transcript: {e}");
    }
    written
}

/// The answer of a file being made, while its caller waits: a caller dropped once the file
/// was made (the answer sent, not yet taken) removes it, as the job does for a caller gone
/// before it could answer. Either way a file nobody took is not left behind.
struct Making<'a> {
    answer: Option<oneshot::Receiver<std::io::Result<Made>>>,
    path: &'a Path,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            // Closed first: the job then either sends before this, and the file is taken
            // here, or fails to send, and removes it itself.
            answer.close();
            if let Ok(Ok(unwanted)) = answer.try_recv() {
                drop(unwanted);
                let _ = std::fs::remove_file(self.path);
            }
        }
    }
}

/// The journals in use, by directory: an entry lives as long as a writer holds its journal.
fn journals() -> &'static Mutex<HashMap<PathBuf, Weak<Shared>>> {
    static JOURNALS: std::sync::OnceLock<Mutex<HashMap<PathBuf, Weak<Shared>>>> =
        std::sync::OnceLock::new();
    JOURNALS.get_or_init(Mutex::default)
}

impl Journal {
    /// The journal of the transcripts in `dir`, shared with every writer there.
    pub(super) fn for_dir(dir: &Path) -> Self {
        let mut all = journals().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = all.get(dir).and_then(Weak::upgrade) {
            return Self(live);
        }
        // Forget the directories nobody writes to any more, at most as often as one is added.
        all.retain(|_, j| j.strong_count() > 0);
        let shared = Arc::new(Shared::default());
        all.insert(dir.to_path_buf(), Arc::downgrade(&shared));
        Self(shared)
    }

    /// How many records and files have been queued on this journal (its clones included).
    #[cfg(test)]
    pub(super) fn jobs(&self) -> usize {
        self.0.jobs.load(Ordering::Relaxed)
    }

    /// A journal of its own, for a file that is not a regular file (a device, a pipe): a
    /// write to it that blocks holds up no one else's records.
    pub(super) fn alone() -> Self {
        Self(Arc::default())
    }

    /// Queues `line` to be appended to `to`, whose length is `cut_to` before it; the receiver
    /// hears how the write went. From here the record is written whatever becomes of the
    /// caller.
    pub(super) fn append(&self, to: Arc<Target>, line: Vec<u8>, cut_to: u64) -> Written {
        let (done, written) = oneshot::channel();
        self.queue(Job::Append {
            to,
            line,
            cut_to,
            done,
        });
        written
    }

    /// Makes the file `path` with `options` (which must refuse one that exists, so that a
    /// file nobody takes, its caller gone, is removed again), in its turn with the
    /// directory's records, and writes `first` to it under its lock ([`Made`]).
    pub(super) async fn create(
        &self,
        path: &Path,
        options: std::fs::OpenOptions,
        first: Vec<u8>,
    ) -> std::io::Result<Made> {
        let (done, made) = oneshot::channel();
        self.queue(Job::Create {
            path: path.to_path_buf(),
            options,
            first,
            done,
        });
        let mut making = Making {
            answer: Some(made),
            path,
        };
        let answered = match making.answer.as_mut() {
            Some(answer) => answer.await,
            None => return Err(lost()),
        };
        // Taken: nothing for the guard to remove.
        making.answer = None;
        answered.unwrap_or_else(|_| Err(lost()))
    }

    /// Queues `job`, and starts a drainer if none is running.
    fn queue(&self, job: Job) {
        #[cfg(test)]
        self.0.jobs.fetch_add(1, Ordering::Relaxed);
        let runtime = Handle::try_current().ok();
        let start = {
            let mut q = self.0.queue.lock().unwrap_or_else(PoisonError::into_inner);
            match job {
                Job::Create { .. } => q.creates.push_back(job),
                _ => q.jobs.push_back(job),
            }
            q.runtime = runtime.clone();
            self.0.queued.store(true, Ordering::Release);
            !std::mem::replace(&mut q.draining, true)
        };
        if start {
            start_drainer(Arc::clone(&self.0), runtime);
        }
    }
}

/// The error of a job dropped unrun: writing it panicked.
pub(super) fn lost() -> std::io::Error {
    std::io::Error::other("the transcript write was lost: writing it panicked")
}

/// Starts a drainer of `shared` on `runtime`'s blocking pool, or drains the whole queue here
/// without one.
fn start_drainer(shared: Arc<Shared>, runtime: Option<Handle>) {
    match runtime {
        // Dropped unrun, it drains where it is dropped (see `Drainer`).
        Some(rt) => {
            #[cfg(test)]
            shared.started.fetch_add(1, Ordering::Relaxed);
            let drainer = Drainer(Some(shared));
            drop(rt.spawn_blocking(move || drainer.run()));
        }
        None => drain(shared, usize::MAX, false),
    }
}

/// Drains a queue on the blocking pool (up to [`HANDOFF`] jobs, then hands it on). Dropped
/// unrun (its runtime shutting down), it drains the whole queue where it is dropped: a loop,
/// not a chain of drainers handed on to a pool that drops each one.
struct Drainer(Option<Arc<Shared>>);

impl Drainer {
    /// Drains the queue, here and now.
    fn run(mut self) {
        if let Some(shared) = self.0.take() {
            drain(shared, HANDOFF, true);
        }
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            drain(shared, usize::MAX, false);
        }
    }
}

/// After this many records in a row, a file waiting to be made goes first: agents that keep
/// writing cannot hold a new one back for good.
const CREATE_EVERY: usize = 64;

/// How long a drainer on the blocking pool whose queue is empty waits for the next job before
/// it ends.
///
/// An agent writes its next record as soon as it hears of the last, so a fan-out's queue
/// empties and fills again many times a second, and a drainer that ended each time was
/// started again on the blocking pool each time (a pool thread woken through a futex).
/// Waiting this long, yielding its thread, it takes the next job where it is.
const LINGER: std::time::Duration = std::time::Duration::from_micros(200);

/// Waits up to [`LINGER`] for a job to be queued, yielding the thread meanwhile; `true` when
/// one was (it returns then, without waiting out the rest).
fn wait_for_more(shared: &Shared) -> bool {
    #[cfg(test)]
    shared.waited.fetch_add(1, Ordering::Relaxed);
    let since = std::time::Instant::now();
    while since.elapsed() < LINGER {
        std::thread::yield_now();
        if shared.queued.load(Ordering::Acquire) {
            return true;
        }
    }
    false
}

/// Runs `shared`'s jobs one by one, records before files to make (but a file after at most
/// [`CREATE_EVERY`] records), each kind in order: until the queue is empty (then the next job
/// starts a drainer), or `share` of them (then a new drainer takes the rest, on the runtime of
/// the newest job's writer). A job that panics is dropped (its writer hears its write was
/// lost) and the rest are handed on the same way.
fn drain(shared: Arc<Shared>, share: usize, linger: bool) {
    /// Hands the queue on if the drain ends before it is disarmed (a job panicked).
    struct HandOn(Option<Arc<Shared>>);
    impl Drop for HandOn {
        fn drop(&mut self) {
            if let Some(shared) = self.0.take() {
                hand_on(shared);
            }
        }
    }
    let mut hand_on_guard = HandOn(Some(Arc::clone(&shared)));
    for _ in 0..share {
        let job = {
            let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            shared.queued.store(false, Ordering::Relaxed);
            let mut next = q.next_job();
            if next.is_none() && linger {
                drop(q);
                // Whatever the wait saw, the queue decides, under its lock.
                wait_for_more(&shared);
                q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
                next = q.next_job();
            }
            match next {
                Some(job) => job,
                None => {
                    q.draining = false;
                    hand_on_guard.0 = None;
                    return;
                }
            }
        };
        job.run();
    }
    hand_on_guard.0 = None;
    hand_on(shared);
}

/// Ends a drain that may leave jobs behind: a new drainer takes them, or the queue is marked
/// drained by nobody when there are none.
fn hand_on(shared: Arc<Shared>) {
    let runtime = {
        let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.jobs.is_empty() && q.creates.is_empty() {
            q.draining = false;
            return;
        }
        q.runtime.clone()
    };
    start_drainer(shared, runtime);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_in(dir: &Path, name: &str) -> Arc<Target> {
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .unwrap();
        Arc::new(Target { file, path })
    }

    /// Waits (up to 5 s) for `journal`'s drainer to let the queue go, as it does just after it
    /// answers the last job.
    async fn drained(journal: &Journal) {
        for _ in 0..1000 {
            if !journal.0.queue.lock().unwrap().draining {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the queue is empty but still marked as being drained");
    }

    /// Puts a record of `line` at the end of `q` (as `Journal::append` does, without starting
    /// a drainer): how its write goes.
    fn push_record(q: &mut Queue, to: &Arc<Target>, line: &[u8], cut_to: u64) -> Written {
        let (done, written) = oneshot::channel();
        q.jobs.push_back(Job::Append {
            to: Arc::clone(to),
            line: line.to_vec(),
            cut_to,
            done,
        });
        written
    }

    /// `/dev/full` opened for appending (every write to it fails with `ENOSPC`), or `None`,
    /// said, where the system has none.
    fn full_device() -> Option<File> {
        if !Path::new("/dev/full").exists() {
            eprintln!("skipped: this system has no /dev/full");
            return None;
        }
        Some(
            std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/full")
                .unwrap(),
        )
    }

    fn read(dir: &Path, name: &str) -> String {
        std::fs::read_to_string(dir.join(name)).unwrap()
    }

    /// Many writers at once, each appending its records one after another as a transcript
    /// writer does: every record lands once, in each file's order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_from_many_writers_at_once_land_once_each_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let mut writers = Vec::new();
        for w in 0..64 {
            let journal = journal.clone();
            let to = target_in(dir.path(), &format!("{w}.jsonl"));
            writers.push(tokio::spawn(async move {
                let mut len = 0;
                for r in 0..50 {
                    let line = format!("{w} {r}\n").into_bytes();
                    let n = line.len() as u64;
                    journal
                        .append(Arc::clone(&to), line, len)
                        .await
                        .unwrap()
                        .result
                        .unwrap();
                    len += n;
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        for w in 0..64 {
            let want: String = (0..50).map(|r| format!("{w} {r}\n")).collect();
            assert_eq!(read(dir.path(), &format!("{w}.jsonl")), want);
        }
    }

    /// More jobs than one drainer runs before it hands on: all are written, in order.
    #[tokio::test]
    async fn a_queue_longer_than_a_drainers_share_is_handed_on_and_written() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        let receipts: Vec<_> = (0..HANDOFF * 3 + 7)
            .map(|i| journal.append(Arc::clone(&to), format!("{i}\n").into_bytes(), 0))
            .collect();
        for r in receipts {
            r.await.unwrap().result.unwrap();
        }
        let want: String = (0..HANDOFF * 3 + 7).map(|i| format!("{i}\n")).collect();
        assert_eq!(read(dir.path(), "a.jsonl"), want);
        drained(&journal).await;
    }

    /// Once a writer hears its record's outcome, the journal holds its file no more: a writer
    /// dropped then lets the file (and its lock) go at once. The record's bytes come back.
    #[tokio::test]
    async fn a_writer_that_heard_is_the_files_last_holder() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        for i in 0..200u64 {
            let receipt = journal
                .append(Arc::clone(&to), b"x\n".to_vec(), i * 2)
                .await
                .unwrap();
            receipt.result.unwrap();
            assert_eq!(Arc::strong_count(&to), 1, "after record {i}");
            // The record's buffer comes back with its outcome, for the writer to reuse.
            assert_eq!(receipt.line, b"x\n");
        }
    }

    /// A file to make waits behind at most `CREATE_EVERY` records, however many are queued;
    /// with none waiting, records go first.
    #[test]
    fn a_file_to_make_is_not_held_back_by_a_stream_of_records() {
        let dir = tempfile::tempdir().unwrap();
        let to = target_in(dir.path(), "a.jsonl");
        let mut q = Queue::default();
        for _ in 0..CREATE_EVERY * 3 {
            push_record(&mut q, &to, b"", 0);
        }
        for _ in 0..2 {
            let (done, _) = oneshot::channel();
            q.creates.push_back(Job::Create {
                path: dir.path().join("b.jsonl"),
                options: std::fs::OpenOptions::new(),
                first: Vec::new(),
                done,
            });
        }
        let order: String = std::iter::from_fn(|| q.next_job())
            .map(|j| match j {
                Job::Append { .. } => 'r',
                _ => 'c',
            })
            .collect();
        let r = "r".repeat(CREATE_EVERY);
        assert_eq!(order, format!("{r}c{r}c{r}"));
    }

    /// A record whose writer is gone before it is written is written all the same, before
    /// the next record of the queue.
    #[tokio::test]
    async fn a_record_whose_writer_is_gone_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let to = target_in(dir.path(), "a.jsonl");
        let journal = Journal::for_dir(dir.path());
        drop(journal.append(Arc::clone(&to), b"kept\n".to_vec(), 0));
        journal
            .append(to, b"next\n".to_vec(), 5)
            .await
            .unwrap()
            .result
            .unwrap();
        assert_eq!(read(dir.path(), "a.jsonl"), "kept\nnext\n");
    }

    /// A file to make for a caller that is gone by then is not made (or is removed again).
    #[tokio::test]
    async fn a_file_made_for_nobody_is_removed() {
        use futures::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let path = dir.path().join("a.jsonl");
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create_new(true);
        // One poll queues it; the future is dropped before the file is made.
        let made = journal.create(&path, options, b"header\n".to_vec());
        assert!(made.now_or_never().is_none());
        // The queue's next job runs after it.
        let to = target_in(dir.path(), "b.jsonl");
        journal
            .append(to, b"x\n".to_vec(), 0)
            .await
            .unwrap()
            .result
            .unwrap();
        assert!(!path.exists(), "the unwanted file is removed");
    }

    /// Outside any runtime a record is written on the spot.
    #[test]
    fn outside_a_runtime_a_record_is_written_on_the_spot() {
        let dir = tempfile::tempdir().unwrap();
        let to = target_in(dir.path(), "a.jsonl");
        let mut written = Journal::for_dir(dir.path()).append(to, b"line\n".to_vec(), 0);
        assert!(matches!(
            written.try_recv(),
            Ok(Receipt { result: Ok(()), .. })
        ));
        assert_eq!(read(dir.path(), "a.jsonl"), "line\n");
    }

    /// A drainer the pool drops unrun (its runtime shut down first) writes its records where
    /// it is dropped, and leaves the queue to the next job.
    #[test]
    fn a_drainer_dropped_unrun_writes_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        let mut written = {
            let mut q = journal.0.queue.lock().unwrap();
            q.draining = true;
            push_record(&mut q, &to, b"line\n", 0)
        };
        drop(Drainer(Some(Arc::clone(&journal.0))));
        assert!(matches!(
            written.try_recv(),
            Ok(Receipt { result: Ok(()), .. })
        ));
        assert!(!journal.0.queue.lock().unwrap().draining);
    }

    /// A queue first drained on a runtime that is gone by then is drained on the runtime of
    /// its newest writer.
    #[test]
    fn a_queue_outlives_the_runtime_that_first_drained_it() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let first = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let to = target_in(dir.path(), "a.jsonl");
        first.block_on(async {
            journal
                .append(Arc::clone(&to), b"a\n".to_vec(), 0)
                .await
                .unwrap()
                .result
                .unwrap();
        });
        drop(first);
        let second = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        second.block_on(async {
            journal
                .append(to, b"b\n".to_vec(), 2)
                .await
                .unwrap()
                .result
                .unwrap();
        });
        assert_eq!(read(dir.path(), "a.jsonl"), "a\nb\n");
    }

    /// A job that panics is dropped; the drain goes on with the jobs after it, on a drainer of
    /// its own.
    #[tokio::test]
    async fn after_a_job_that_panics_the_rest_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        let (first, after) = {
            // Queued together, so that one drain meets all three.
            let mut q = journal.0.queue.lock().unwrap();
            q.draining = true;
            let first = push_record(&mut q, &to, b"first\n", 0);
            q.jobs.push_back(Job::Panic);
            let after = push_record(&mut q, &to, b"after\n", 6);
            q.runtime = Some(Handle::current());
            (first, after)
        };
        start_drainer(Arc::clone(&journal.0), Some(Handle::current()));
        first.await.unwrap().result.unwrap();
        after.await.unwrap().result.unwrap();
        assert_eq!(read(dir.path(), "a.jsonl"), "first\nafter\n");
        drained(&journal).await;
    }

    /// A file made with its first line: the line written, under the file's lock, which goes
    /// when the file does.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_file_is_made_with_its_first_line_under_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create_new(true);
        let made = Journal::for_dir(dir.path())
            .create(&path, options, b"header\n".to_vec())
            .await
            .unwrap();
        assert!(matches!(made.first, (Some(Ok(())), ref line) if line == b"header\n"));
        assert_eq!(read(dir.path(), "a.jsonl"), "header\n");
        let other = File::open(&path).unwrap();
        assert!(
            !crate::base::files::try_lock_once(&other).unwrap(),
            "made's lock is held"
        );
        drop(made);
        assert!(crate::base::files::try_lock_once(&other).unwrap());
    }

    /// A file made while another handle holds its lock: its first line is not written (the
    /// caller waits for the lock and writes it), and its bytes come back.
    #[cfg(unix)]
    #[test]
    fn a_file_whose_lock_is_held_is_made_without_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let holder = File::open(&path).unwrap();
        assert!(crate::base::files::try_lock_once(&holder).unwrap());
        let made = Made::with_first(file, b"header\n".to_vec());
        assert!(matches!(made.first, (None, ref line) if line == b"header\n"));
        assert_eq!(read(dir.path(), "a.jsonl"), "");
    }

    /// A first line the device refuses: its error (what was written of it is cut off where
    /// the file can be cut).
    #[test]
    fn a_refused_first_line_reports_its_error() {
        let Some(full) = full_device() else { return };
        let err = write_first(&full, b"header\n").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
    }

    /// A file made for a caller dropped once the file was made, before it took it, is removed:
    /// nobody is left to write to it.
    #[tokio::test]
    async fn a_file_made_for_a_caller_dropped_before_it_took_it_is_removed() {
        use futures::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let path = dir.path().join("a.jsonl");
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create_new(true);
        let mut making = Box::pin(journal.create(&path, options, b"header\n".to_vec()));
        assert!(making.as_mut().now_or_never().is_none());
        // Made on the blocking pool, its line written and (at once after) its answer sent;
        // the caller has not looked.
        for _ in 0..5000 {
            if std::fs::read(&path).is_ok_and(|b| b == b"header\n") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(read(dir.path(), "a.jsonl"), "header\n");
        drop(making);
        drained(&journal).await;
        assert!(!path.exists(), "the file nobody took is removed");
    }

    /// A record the device refuses reports the error.
    #[tokio::test]
    async fn a_failed_write_reports_its_error() {
        let Some(file) = full_device() else { return };
        let to = Arc::new(Target {
            file,
            path: "/dev/full".into(),
        });
        let err = Journal::alone()
            .append(to, b"line\n".to_vec(), 0)
            .await
            .unwrap()
            .result
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28));
    }

    /// A drainer on the blocking pool waits for more ([`LINGER`]) before it ends, and still
    /// ends: its records written, the queue no longer marked as being drained.
    #[tokio::test]
    async fn a_pool_drainer_waits_for_more_before_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        for i in 0..20u64 {
            journal
                .append(Arc::clone(&to), b"x\n".to_vec(), i * 2)
                .await
                .unwrap()
                .result
                .unwrap();
        }
        drained(&journal).await;
        assert!(journal.0.waited.load(Ordering::Relaxed) >= 1);
        assert_eq!(read(dir.path(), "a.jsonl"), "x\n".repeat(20));
    }

    /// A job queued while a drainer waits for more is taken by that drainer (which then waits
    /// again), not left for another. (Tried until the job lands within one wait: a loaded
    /// machine may take longer than `LINGER` to queue it.)
    #[test]
    fn a_job_queued_while_a_drainer_waits_is_taken_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let to = target_in(dir.path(), "a.jsonl");
        for _ in 0..100 {
            let journal = Journal::alone();
            journal.0.queue.lock().unwrap().draining = true;
            let drainer = {
                let shared = Arc::clone(&journal.0);
                std::thread::spawn(move || drain(shared, HANDOFF, true))
            };
            while journal.0.waited.load(Ordering::Relaxed) == 0 {
                std::hint::spin_loop();
            }
            let written = journal.append(Arc::clone(&to), b"x\n".to_vec(), 0);
            drainer.join().unwrap();
            assert!(written.blocking_recv().unwrap().result.is_ok());
            assert!(!journal.0.queue.lock().unwrap().draining);
            if journal.0.waited.load(Ordering::Relaxed) == 2 {
                return;
            }
        }
        panic!("no job queued during a drainer's wait was taken by it in 100 tries");
    }

    /// A drainer that waits and hears of nothing returns after about [`LINGER`]; one that
    /// hears of a job queued meanwhile returns at once to take it.
    #[test]
    fn a_waiting_drainer_returns_when_a_job_is_queued_or_the_wait_is_over() {
        let shared = Shared::default();
        let start = std::time::Instant::now();
        assert!(!wait_for_more(&shared));
        assert!(start.elapsed() >= LINGER);
        shared.queued.store(true, Ordering::Release);
        assert!(wait_for_more(&shared));
        let shared = Arc::new(Shared::default());
        let setter = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || shared.queued.store(true, Ordering::Release))
        };
        setter.join().unwrap();
        assert!(wait_for_more(&shared));
    }

    /// Outside a runtime, with no drainer running, a record is written on the spot, and that
    /// drain never waits for more.
    #[test]
    fn a_drain_outside_a_runtime_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::for_dir(dir.path());
        let to = target_in(dir.path(), "a.jsonl");
        for i in 0..50u64 {
            drop(journal.append(Arc::clone(&to), b"x\n".to_vec(), i * 2));
        }
        assert_eq!(read(dir.path(), "a.jsonl"), "x\n".repeat(50));
        assert_eq!(journal.0.started.load(Ordering::Relaxed), 0);
        assert_eq!(
            journal.0.waited.load(Ordering::Relaxed),
            0,
            "a drain here never waits"
        );
        assert!(!journal.0.queue.lock().unwrap().draining);
    }

    /// A directory nobody writes to any more is forgotten once another is added.
    #[test]
    fn a_directory_nobody_writes_to_is_forgotten() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        drop(Journal::for_dir(a.path()));
        let _b = Journal::for_dir(b.path());
        assert!(!journals().lock().unwrap().contains_key(a.path()));
    }
}
