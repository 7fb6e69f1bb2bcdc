//! A worker process's side of a pool: take jobs, run agents, hold leases, report once.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkhive_core::{TaskId, TaskNotification, TaskStatus};
use futures::{FutureExt, StreamExt};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{GROUP, Job, PARTIAL_OUTPUT_BYTES, Pool, notification_json, now_ms, tail};
use crate::base::context::{AgentContext, AgentKind, QuerySource};
use crate::base::events::EventSink;
use crate::error::{Error, Result};
use crate::runtime::AgentBuilder;
use crate::task::{ChildSink, Progress};

/// Builds the agent for a job, on any backend: the worker then gives it the job's id, its
/// cancellation and its event sink, and runs the job's prompt. An `Err` is reported to the
/// job's parent as `failed`.
pub type AgentFactory = Arc<dyn Fn(&Job) -> Result<AgentBuilder> + Send + Sync>;

/// What a worker did, returned when it shuts down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Jobs it ran.
    pub ran: u64,
    /// Notifications it stored (each task's only one).
    pub reported: u64,
    /// Tasks of dead workers it reported `killed`.
    pub reclaimed_killed: u64,
    /// Idempotent tasks of dead workers it ran again.
    pub reclaimed_rerun: u64,
    /// Jobs it dead-lettered.
    pub dead_lettered: u64,
    /// Runs it stopped because another worker took their lease (not reported by it).
    pub lost_leases: u64,
}

/// One worker process's membership in a pool. [`run`](Self::run) until shut down.
pub struct Worker {
    pool: Pool,
    name: String,
    factory: AgentFactory,
    events: Option<Arc<dyn EventSink>>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("pool", &self.pool)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// KEYS: worker key. ARGV: me, lease ms. Claims the worker's name.
const CLAIM_NAME: &str = r"
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
";

/// KEYS: worker key. ARGV: me. Lets the name go, if still ours.
const RELEASE_NAME: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// KEYS: jobs, run, lease, cancel. ARGV: group, entry, consumer, me, lease ms, most
/// deliveries, now ms, idempotent, my name prefix, peek. Decides, atomically, what to do with
/// an entry this worker just read or claimed; with peek ('1': no slot to run it in), an entry
/// to run is left as it is ('later').
const START: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 or p[1][2] ~= ARGV[3] then return {'gone', 0, ''} end
local n = tonumber(p[1][4])
if redis.call('HGET', KEYS[2], 'finished') then
  -- A second entry for a task that ran (a submit retried after a lost answer).
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  redis.call('XDEL', KEYS[1], ARGV[2])
  return {'gone', n, ''}
end
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[4] and string.sub(holder, 1, #ARGV[9]) ~= ARGV[9] then
  return {'held', n, holder}
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'cancelled', n, ''} end
local started = redis.call('HGET', KEYS[2], 'worker')
if started and ARGV[8] ~= '1' then return {'killed', n, started} end
if n > tonumber(ARGV[6]) then return {'dead', n, started or ''} end
if ARGV[10] == '1' then return {'later', n, ''} end
redis.call('HSET', KEYS[2], 'worker', ARGV[4], 'started', ARGV[7], 'entry', ARGV[2])
redis.call('HINCRBY', KEYS[2], 'runs', 1)
redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
if started then return {'rerun', n, started} end
return {'run', n, ''}
";

/// KEYS: lease, jobs, out, cancel, used. ARGV: me, group, entry, lease ms, output, output ttl
/// ms, consumer, usage JSON. 0: the lease is lost; 1: renewed; 2: renewed, and the task is
/// cancelled. The output and the usage so far are what a reclaimer reports if this worker
/// stops answering.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[7], 0, ARGV[3], 'JUSTID')
if ARGV[5] ~= '' then redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6]) end
redis.call('SET', KEYS[5], ARGV[8], 'PX', ARGV[6])
if redis.call('EXISTS', KEYS[4]) == 1 then return 2 end
return 1
";

/// KEYS: lease, jobs, run, out, notify stream, notify ids, notify done, dead, used. ARGV: me
/// (or '' for a report that needs no lease), group, entry, notification id, notification
/// JSON, output ttl ms, dead-letter reason ('' for none), job JSON, consumer.
///
/// The report and the acknowledgement in one step: the parent's notification is stored
/// (unless that id is pending or delivered already), the entry acknowledged and deleted, the
/// lease dropped, the run record kept as finished (a duplicate entry of the task is then
/// dropped unrun). A worker reporting its own run must still hold the lease — or, if it lapsed
/// without anyone taking it, still have the entry. A report without a lease needs the entry
/// still pending to this consumer (a handler stalled past a reclaim reports nothing).
/// -1: not ours; 0: acknowledged, the notification was there already; 1: reported.
const FINISH: &str = r"
local p = redis.call('XPENDING', KEYS[2], ARGV[2], ARGV[3], ARGV[3], 1)
local mine = #p > 0 and p[1][2] == ARGV[9]
if ARGV[1] ~= '' then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] and (holder or not mine) then return -1 end
elseif not mine then
  return -1
end
local pushed = 0
if ARGV[4] ~= '' and redis.call('HEXISTS', KEYS[6], ARGV[4]) == 0
   and not redis.call('ZSCORE', KEYS[7], ARGV[4]) then
  local e = redis.call('XADD', KEYS[5], '*', 'id', ARGV[4], 'n', ARGV[5])
  redis.call('HSET', KEYS[6], ARGV[4], e)
  pushed = 1
end
if ARGV[7] ~= '' then
  redis.call('XADD', KEYS[8], '*', 'entry', ARGV[3], 'reason', ARGV[7], 'job', ARGV[8])
  redis.call('XTRIM', KEYS[8], 'MAXLEN', '~', 10000)
end
redis.call('XACK', KEYS[2], ARGV[2], ARGV[3])
redis.call('XDEL', KEYS[2], ARGV[3])
if ARGV[1] == '' or redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[3], 'finished', '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
redis.call('PEXPIRE', KEYS[4], ARGV[6])
redis.call('DEL', KEYS[9])
return pushed
";

/// How long a task's last output is kept after it ended.
const OUTPUT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The running tasks, by task: where a cancel from the pool's channel lands.
type Running = Arc<Mutex<HashMap<TaskId, Arc<RunningTask>>>>;

/// A task running on this worker.
struct RunningTask {
    id: TaskId,
    token: CancellationToken,
    /// Set when this worker's shutdown stopped it.
    shutdown: Arc<AtomicBool>,
    /// Whether its job is a teammate's: a cancel of it is read before it is applied, as its
    /// lead's shutdown may have made it.
    teammate_job: bool,
    /// Set by the first cancel from the pool that is read (one read per task).
    reading: AtomicBool,
    /// Its team and name once its side of the team is made, and its lead's grace once a
    /// shutdown's cancel said it: whichever comes second tells the team.
    grace: Mutex<(Option<TeamSide>, Option<Duration>)>,
}

/// A teammate's team on this worker, and its name there.
type TeamSide = (Arc<crate::team::Team>, String);

impl RunningTask {
    /// The pool cancelled it (its channel named it, or a renewal found its mark). A plain
    /// task's token is cancelled at once. A teammate's cancel is read first — on a task of
    /// its own, so that neither the channel's listener nor the lease's renewal waits on the
    /// read — and when it was its lead's shutdown, the team is told the lead's grace before
    /// the token is cancelled, so the teammate ends as one whose grace ran out in one process
    /// does (as shut down when idle under `Approve`, else `killed` with the grace note). A read
    /// that fails or takes over a second is a plain cancel.
    fn cancelled_on_pool(self: &Arc<Self>, pool: &super::Pool) {
        if self.token.is_cancelled() {
            return;
        }
        if !self.teammate_job {
            self.token.cancel();
            return;
        }
        if self.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let (me, pool) = (Arc::clone(self), pool.clone());
        drop(tokio::spawn(async move {
            if let Some(super::CancelReason::ShutdownGrace(grace)) = pool
                .stored_cancel(&me.id)
                .await
                .as_deref()
                .map(super::CancelReason::read)
            {
                me.told(None, Some(grace));
            }
            me.token.cancel();
        }));
    }

    /// Records its team or its lead's grace; with both known, tells the team (once: the
    /// second of the two calls does).
    fn told(&self, team: Option<TeamSide>, grace: Option<Duration>) {
        let mut known = self.grace.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = team {
            known.0.get_or_insert(t);
        }
        if let Some(g) = grace {
            known.1.get_or_insert(g);
        }
        if let (Some((team, name)), Some(grace)) = (&known.0, known.1) {
            team.overdue_on_pool(self.id, name, grace);
        }
    }
}

/// What one entry turned out to be.
struct Entry {
    id: String,
    task: Option<String>,
    job: Option<String>,
}

impl Entry {
    fn from_stream(e: &StreamId) -> Self {
        Self {
            id: e.id.clone(),
            task: e.get("task"),
            job: e.get("job"),
        }
    }
}

/// Why a run stopped early, as its notification's note says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    Watchdog,
    Shutdown,
    LostLease,
}

impl Worker {
    /// A worker named `name` (1 to 64 of `[A-Za-z0-9_-]`, unique among the pool's live
    /// workers; a restarted worker takes its name back and first drains the jobs it held)
    /// that builds its agents with `factory`.
    pub fn new(
        pool: Pool,
        name: &str,
        factory: impl Fn(&Job) -> Result<AgentBuilder> + Send + Sync + 'static,
    ) -> Result<Self> {
        crate::mailbox::check_name("worker name", name).map_err(|_| {
            Error::Config(format!(
                "worker name `{name}`: use 1-64 letters, digits, `_` and `-`"
            ))
        })?;
        Ok(Self {
            pool,
            name: name.to_owned(),
            factory: Arc::new(factory),
            events: None,
        })
    }

    /// Also sends every agent's events to `sink`.
    pub fn events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.events = Some(sink);
        self
    }

    fn fail(&self, what: &str, e: redis::RedisError) -> Error {
        Error::Pool {
            message: format!(
                "`{}` at {}, worker `{}`: {what}: {e}",
                self.pool.name, self.pool.h.shown, self.name
            ),
        }
    }

    /// Runs until `shutdown` is cancelled: takes jobs while it has a free slot (its own
    /// pending ones first, then those of dead workers, then new ones), runs each under a
    /// renewed lease and the session watchdog, and reports each once. On shutdown it takes no
    /// more jobs, lets running ones finish for [`PoolConfig::drain`](super::PoolConfig::drain),
    /// then stops the rest (their parents hear `killed`) and lets its name go.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport> {
        let me = format!("{}:{}", self.name, crate::mailbox::new_id());
        let config = self.pool.config.clone();
        let mut conn = self.pool.conn().await?;
        self.claim_name(&mut conn, &me, &shutdown).await?;
        create_group(&mut conn, &self.pool.key("jobs"))
            .await
            .map_err(|e| self.fail("XGROUP CREATE", e))?;
        let me: Arc<str> = Arc::from(me);
        let this = Arc::new(self);
        let running: Running = Arc::default();
        let _heartbeat = AbortOnDropHandle::new(tokio::spawn(Arc::clone(&this).heartbeat(
            conn.clone(),
            Arc::clone(&me),
            shutdown.clone(),
        )));
        let _listener =
            AbortOnDropHandle::new(tokio::spawn(Arc::clone(&this).listen(Arc::clone(&running))));
        let slots = Arc::new(Semaphore::new(config.capacity));
        // A full worker still reports dead workers' tasks (see `reclaim_when_full`), through
        // the drain too. Aborted only if this future is dropped; stopped after the drain, it
        // finishes the entry it is reporting.
        let reclaim_stop = CancellationToken::new();
        let mut reclaimer =
            AbortOnDropHandle::new(tokio::spawn(Arc::clone(&this).reclaim_when_full(
                conn.clone(),
                Arc::clone(&me),
                Arc::clone(&running),
                Arc::clone(&slots),
                reclaim_stop.clone(),
            )));
        let mut tasks: JoinSet<WorkerReport> = JoinSet::new();
        let mut report = WorkerReport::default();
        let mut reader = Reader::new(&this);
        loop {
            while let Some(done) = tasks.try_join_next() {
                add(&mut report, done);
            }
            // A free slot first: a full worker sleeps here, woken by a slot or by shutdown.
            let permit = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                p = Arc::clone(&slots).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let entry = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                e = reader.next(&mut conn) => e,
            };
            let entry = match entry {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(worker = %this.name, "reading the job stream: {e}; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    continue;
                }
            };
            let (this2, me2, running2, conn2) = (
                Arc::clone(&this),
                Arc::clone(&me),
                Arc::clone(&running),
                conn.clone(),
            );
            tasks.spawn(async move {
                let report = this2.handle(entry, conn2, &me2, &running2, false).await;
                drop(permit);
                report
            });
        }
        // Shutting down: no more jobs; running ones get `drain` to finish, then are stopped.
        let drained = tokio::time::timeout(config.drain, async {
            while let Some(done) = tasks.join_next().await {
                add(&mut report, done);
            }
        })
        .await;
        if drained.is_err() {
            for t in running.lock().unwrap_or_else(|e| e.into_inner()).values() {
                t.shutdown.store(true, Ordering::Release);
                t.token.cancel();
            }
            while let Some(done) = tasks.join_next().await {
                add(&mut report, done);
            }
        }
        // Its reports need no slot and no model: a few Redis round trips each.
        reclaim_stop.cancel();
        add(&mut report, (&mut reclaimer).await);
        let _ = redis::Script::new(RELEASE_NAME)
            .key(this.pool.key(&format!("worker:{}", this.name)))
            .arg(&*me)
            .invoke_async::<i64>(&mut conn)
            .await;
        Ok(report)
    }

    /// Takes the worker's name: waits (up to a lease and a second) for a dead incarnation's
    /// claim to expire; a live one keeps it.
    async fn claim_name(
        &self,
        conn: &mut ConnectionManager,
        me: &str,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let lease = self.pool.config.lease;
        let until = tokio::time::Instant::now() + lease + Duration::from_secs(1);
        loop {
            let got: i64 = redis::Script::new(CLAIM_NAME)
                .key(self.pool.key(&format!("worker:{}", self.name)))
                .arg(me)
                .arg(lease.as_millis().to_string())
                .invoke_async(conn)
                .await
                .map_err(|e| self.fail("claiming its name", e))?;
            if got == 1 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until || shutdown.is_cancelled() {
                return Err(Error::Refused(format!(
                    "worker name `{}` is in use in pool `{}`: another live worker holds it (a \
                     dead one's claim expires within the lease, {} ms)",
                    self.name,
                    self.pool.name,
                    lease.as_millis()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// While every slot is taken, every half lease: claims dead workers' entries without
    /// counting a delivery (`XAUTOCLAIM … JUSTID`) and reports those that need no slot —
    /// `killed`, cancelled, dead-lettered — so a pool whose live workers are all busy still
    /// tells parents within a lease or so. Entries to run stay claimed until a slot frees (the
    /// main loop claims them again then).
    ///
    /// Ends at `stop` (the worker cancels it after its drain), between entries: an entry it
    /// is reporting is reported and counted first (the parent may already hold its
    /// notification), and its counts are returned.
    async fn reclaim_when_full(
        self: Arc<Self>,
        mut conn: ConnectionManager,
        me: Arc<str>,
        running: Running,
        slots: Arc<Semaphore>,
        stop: CancellationToken,
    ) -> WorkerReport {
        let lease = self.pool.config.lease;
        let jobs = self.pool.key("jobs");
        let mut from = "0-0".to_owned();
        let mut report = WorkerReport::default();
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return report,
                () = tokio::time::sleep(lease / 2) => {}
            }
            if slots.available_permits() > 0 {
                continue;
            }
            let claimed: redis::RedisResult<redis::Value> = redis::cmd("XAUTOCLAIM")
                .arg(&jobs)
                .arg(GROUP)
                .arg(&self.name)
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
                .arg(&from)
                .arg("COUNT")
                .arg(16)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await;
            let (next, ids) = match claimed.as_ref().map(justid_reply) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(worker = %self.name, "reclaiming while full: {e}");
                    continue;
                }
            };
            from = next;
            for id in ids {
                if stop.is_cancelled() {
                    // Left claimed without a delivery counted: read again after the lease.
                    return report;
                }
                let fields: redis::RedisResult<redis::streams::StreamRangeReply> =
                    redis::cmd("XRANGE")
                        .arg(&jobs)
                        .arg(&id)
                        .arg(&id)
                        .query_async(&mut conn)
                        .await;
                let Some(e) = fields.ok().and_then(|r| r.ids.into_iter().next()) else {
                    continue;
                };
                // One entry's panic ends that entry's handling, not the reclaimer: its counts
                // so far are kept, and a full worker goes on reporting dead workers' tasks.
                let r = AssertUnwindSafe(Arc::clone(&self).handle(
                    Entry::from_stream(&e),
                    conn.clone(),
                    &me,
                    &running,
                    true,
                ))
                .catch_unwind()
                .await
                .map_err(|panic| crate::tool::orchestrate::panic_message(&*panic));
                match r {
                    Ok(r) => add(&mut report, Ok(r)),
                    Err(msg) => tracing::error!(
                        worker = %self.name,
                        entry = %id,
                        "reporting a dead worker's entry panicked: {msg}"
                    ),
                }
            }
        }
    }

    /// Keeps the worker's name while it lives.
    async fn heartbeat(
        self: Arc<Self>,
        mut conn: ConnectionManager,
        me: Arc<str>,
        shutdown: CancellationToken,
    ) {
        let _ = shutdown;
        let lease = self.pool.config.lease;
        loop {
            // Kept through shutdown too (its drain), until the worker lets the name go.
            tokio::time::sleep(lease / 3).await;
            let kept: redis::RedisResult<i64> = redis::Script::new(CLAIM_NAME)
                .key(self.pool.key(&format!("worker:{}", self.name)))
                .arg(&*me)
                .arg(lease.as_millis().to_string())
                .invoke_async(&mut conn)
                .await;
            match kept {
                Ok(1) => {}
                Ok(_) => {
                    tracing::error!(worker = %self.name, "another worker took this worker's name")
                }
                Err(e) => tracing::warn!(worker = %self.name, "renewing the worker's name: {e}"),
            }
        }
    }

    /// Cancels running tasks named on the pool's channel, resubscribing after a lost
    /// connection (the cancel keys, checked with every renewal, cover the gap).
    async fn listen(self: Arc<Self>, running: Running) {
        let channel = self.pool.key("cancels");
        loop {
            let sub = async {
                let mut ps = self.pool.h.client.get_async_pubsub().await?;
                ps.subscribe(&channel).await?;
                let mut msgs = ps.on_message();
                while let Some(m) = msgs.next().await {
                    let Ok(id) = m.get_payload::<String>() else {
                        continue;
                    };
                    let Ok(task) = id.parse::<TaskId>() else {
                        continue;
                    };
                    let found = running
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&task)
                        .cloned();
                    if let Some(t) = found {
                        t.cancelled_on_pool(&self.pool);
                    }
                }
                Ok::<(), redis::RedisError>(())
            };
            if let Err(e) = sub.await {
                tracing::warn!(worker = %self.name, "the cancel channel: {e}; resubscribing");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// One entry, from reading to its acknowledgement.
    async fn handle(
        self: Arc<Self>,
        entry: Entry,
        mut conn: ConnectionManager,
        me: &str,
        running: &Running,
        peek: bool,
    ) -> WorkerReport {
        let mut report = WorkerReport::default();
        let job: std::result::Result<Job, String> = match (&entry.task, &entry.job) {
            (Some(task), Some(json)) => match serde_json::from_str::<Job>(json) {
                Ok(job) if job.task.to_string() == *task => Ok(job),
                Ok(job) => Err(format!(
                    "its task field `{task}` is not its job's task `{}`",
                    job.task
                )),
                Err(e) => Err(format!("its job is not a job: {e}")),
            },
            _ => Err("it has no `task` and `job` fields".to_owned()),
        };
        let job = match job {
            Ok(job) => job,
            Err(why) => {
                // Its parent is told when the entry names one and a task (a job of another
                // version, say): it would wait for the task forever otherwise.
                let named = entry.job.as_deref().and_then(|json| {
                    let v: serde_json::Value = serde_json::from_str(json).ok()?;
                    let parent: TaskId = v.get("parent")?.as_str()?.parse().ok()?;
                    let task: TaskId = entry.task.as_deref()?.parse().ok()?;
                    Some((parent, task))
                });
                tracing::error!(worker = %self.name, entry = %entry.id, "dead-lettered: {why}");
                let raw = entry.job.clone().unwrap_or_default();
                let n = named.map(|(parent, task)| {
                    let n = TaskNotification::new(
                        task,
                        TaskStatus::Failed,
                        format!("Agent failed: the pool could not read its job ({why})"),
                        Default::default(),
                    );
                    (parent, n)
                });
                if let Ok(Some(pushed)) = self
                    .finish(
                        &mut conn,
                        "",
                        &entry.id,
                        n.as_ref().map(|(p, n)| (*p, n)),
                        &why,
                        &raw,
                    )
                    .await
                {
                    report.dead_lettered += 1;
                    report.reported += u64::from(pushed);
                }
                return report;
            }
        };
        let config = &self.pool.config;
        let name_prefix = format!("{}:", self.name);
        let decided: redis::RedisResult<(String, u64, String)> = redis::Script::new(START)
            .key(self.pool.key("jobs"))
            .key(self.pool.task_key("run", &job.task))
            .key(self.pool.task_key("lease", &job.task))
            .key(self.pool.task_key("cancel", &job.task))
            .arg(GROUP)
            .arg(&entry.id)
            .arg(&self.name)
            .arg(me)
            .arg(config.lease.as_millis().to_string())
            .arg(config.max_deliveries)
            .arg(now_ms())
            .arg(if job.idempotent { "1" } else { "0" })
            .arg(&name_prefix)
            .arg(if peek { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await;
        let (what, deliveries, other) = match decided {
            Ok(d) => d,
            Err(e) => {
                // Left pending: it is read again after the lease (by this worker or another).
                tracing::warn!(worker = %self.name, task = %job.task, "could not start: {e}");
                return report;
            }
        };
        let d = &job.description;
        // Letters its conversation recorded (none: it never ran here).
        let none: Mutex<HashSet<String>> = Mutex::default();
        match what.as_str() {
            "run" | "rerun" => {
                if what == "rerun" {
                    report.reclaimed_rerun += 1;
                }
                report.ran += 1;
                super::record(&self.pool, &job.task, crate::task::TaskState::Running, None).await;
                // Letters its conversation recorded, and its progress: kept here, so a run
                // that panics still tells their senders they were read, and its parent what
                // it had done.
                let recorded: Arc<Mutex<HashSet<String>>> = Arc::default();
                let progress = Arc::new(Progress::default());
                // A panic in the run (the host's factory, its model, a bug) ends it `failed`,
                // reported now: uncaught, it would end the job's task unreported, and the
                // entry would come back after the lease as `killed`, or run again and panic
                // again until dead-lettered.
                let executed = AssertUnwindSafe(self.execute(
                    &job,
                    &entry.id,
                    me,
                    running,
                    (Arc::clone(&recorded), Arc::clone(&progress)),
                ))
                .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| {
                        let msg = crate::tool::orchestrate::panic_message(&*panic);
                        tracing::error!(worker = %self.name, task = %job.task, "the run panicked: {msg}");
                        // As a run that failed reports: what its answers used (as their
                        // events counted it), its tool uses, its time, and the text it had
                        // streamed.
                        let mut usage = progress.usage();
                        usage.tool_uses = progress.tool_uses();
                        let mut n = TaskNotification::new(
                            job.task,
                            TaskStatus::Failed,
                            format!("Agent \"{d}\" failed: it panicked: {msg}"),
                            usage.to_notification(),
                        );
                        n.usage.duration_ms =
                            u64::try_from(progress.elapsed().as_millis()).unwrap_or(u64::MAX);
                        // The registry's roll-up reports what the notification does.
                        usage.duration_ms = n.usage.duration_ms;
                        let partial = progress.last_text();
                        if !partial.is_empty() {
                            n = n.with_result(crate::task::cap_answer(partial, None));
                        }
                        Some((n, recorded, usage))
                    });
                match executed {
                    Some((n, recorded, usage)) => {
                        let r = self
                            .report_task(
                                &mut conn,
                                me,
                                &entry.id,
                                &job,
                                (n, Some(usage)),
                                &recorded,
                                ("", ""),
                            )
                            .await;
                        report.reported += u64::from(r == Some(true));
                    }
                    None => report.lost_leases += 1,
                }
            }
            "cancelled" => {
                let n = noted(
                    TaskNotification::new(
                        job.task,
                        TaskStatus::Killed,
                        format!("Agent \"{d}\" was stopped"),
                        Default::default(),
                    ),
                    "cancelled before it started",
                );
                let r = self
                    .report_task(&mut conn, "", &entry.id, &job, (n, None), &none, ("", ""))
                    .await;
                report.reported += u64::from(r == Some(true));
            }
            "killed" => {
                // What it had streamed and used by its last renewal (one slot: both keys are
                // the task's).
                let (partial, used): (Option<String>, Option<String>) = redis::cmd("MGET")
                    .arg(self.pool.task_key("out", &job.task))
                    .arg(self.pool.task_key("used", &job.task))
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                let partial = partial.filter(|p| !p.is_empty());
                let used = used.and_then(|u| serde_json::from_str::<forkhive_core::Usage>(&u).ok());
                let what = if partial.is_some() {
                    "the result is the output it had streamed by its last renewal"
                } else {
                    "it had streamed no output by its last renewal"
                };
                let mut n = noted(
                    TaskNotification::new(
                        job.task,
                        TaskStatus::Killed,
                        format!("Agent \"{d}\" was stopped"),
                        used.map(|u| u.to_notification()).unwrap_or_default(),
                    ),
                    format!(
                        "its worker ({}) stopped answering (it died, or could not reach Redis): \
                         its lease of {} ms ran out mid-task; {what}",
                        other.split(':').next().unwrap_or_default(),
                        config.lease.as_millis()
                    ),
                );
                if let Some(p) = partial {
                    n = n.with_result(crate::task::cap_answer(p, None));
                }
                let r = self
                    .report_task(&mut conn, "", &entry.id, &job, (n, used), &none, ("", ""))
                    .await;
                if r == Some(true) {
                    report.reported += 1;
                    report.reclaimed_killed += 1;
                }
            }
            "dead" => {
                let why = format!("given up after {deliveries} deliveries");
                let n = TaskNotification::new(
                    job.task,
                    TaskStatus::Failed,
                    format!("Agent \"{d}\" failed: {why} (dead-lettered)"),
                    Default::default(),
                );
                let raw = entry.job.clone().unwrap_or_default();
                let r = self
                    .report_task(
                        &mut conn,
                        "",
                        &entry.id,
                        &job,
                        (n, None),
                        &none,
                        (&why, &raw),
                    )
                    .await;
                if let Some(pushed) = r {
                    report.dead_lettered += 1;
                    report.reported += u64::from(pushed);
                }
            }
            // "gone": someone else acknowledged it; "held": a live worker runs it; "later": to
            // run when a slot frees (it is claimed again then).
            _ => {}
        }
        report
    }

    /// Runs one job under its lease and the watchdog. `None`: the lease was lost (whoever
    /// took it reports).
    async fn execute(
        &self,
        job: &Job,
        entry: &str,
        me: &str,
        running: &Running,
        (recorded, progress): (Arc<Mutex<HashSet<String>>>, Arc<Progress>),
    ) -> Option<(
        TaskNotification,
        Arc<Mutex<HashSet<String>>>,
        forkhive_core::Usage,
    )> {
        let config = &self.pool.config;
        let d = &job.description;
        let token = CancellationToken::new();
        let stopped_by_shutdown = Arc::new(AtomicBool::new(false));
        let entry_here = RunningEntry::new(
            running,
            job.task,
            token.clone(),
            Arc::clone(&stopped_by_shutdown),
            job.teammate.is_some(),
        );
        let here = Arc::clone(&entry_here.task);
        let why: Arc<Mutex<Option<Stop>>> = Arc::default();
        // The lease: renewed every third of it, with the output so far; lost, the run stops.
        let renew = {
            let (pool, token, progress, why, here) = (
                self.pool.clone(),
                token.clone(),
                Arc::clone(&progress),
                Arc::clone(&why),
                Arc::clone(&here),
            );
            let (task, entry, me, consumer) =
                (job.task, entry.to_owned(), me.to_owned(), self.name.clone());
            AbortOnDropHandle::new(tokio::spawn(async move {
                let lease = pool.config.lease;
                let lost = || {
                    set_once(&why, Stop::LostLease);
                    token.cancel();
                };
                let Ok(mut conn) = pool.conn().await else {
                    lost();
                    return;
                };
                // The lease was set when the run started. Unrenewed for most of a lease, it
                // may have lapsed and been taken: the run stops here, unreported, before a
                // reclaimer reports it — never two runs of one task at once for long.
                // When the lease was last known to hold: the sending of the last renewal that
                // got through (the first lease was set just before this started).
                let mut valid = tokio::time::Instant::now();
                let bound = lease - lease / 4;
                loop {
                    let stop_at = valid + bound;
                    tokio::select! {
                        () = tokio::time::sleep(lease / 3) => {}
                        () = tokio::time::sleep_until(stop_at) => {
                            lost();
                            return;
                        }
                    }
                    let sent = tokio::time::Instant::now();
                    let left = stop_at.saturating_duration_since(sent);
                    if left.is_zero() {
                        lost();
                        return;
                    }
                    let text = progress.last_text();
                    // What it has used so far, as its report would count it.
                    let mut used = progress.usage();
                    used.tool_uses = progress.tool_uses();
                    used.duration_ms =
                        u64::try_from(progress.elapsed().as_millis()).unwrap_or(u64::MAX);
                    let used = serde_json::to_string(&used).unwrap_or_default();
                    let script = redis::Script::new(RENEW);
                    let mut invocation = script.key(pool.task_key("lease", &task));
                    let call = invocation
                        .key(pool.key("jobs"))
                        .key(pool.task_key("out", &task))
                        .key(pool.task_key("cancel", &task))
                        .key(pool.task_key("used", &task))
                        .arg(&me)
                        .arg(GROUP)
                        .arg(&entry)
                        .arg(lease.as_millis().to_string())
                        .arg(tail(&text, PARTIAL_OUTPUT_BYTES))
                        .arg(OUTPUT_TTL.as_millis().to_string())
                        .arg(&consumer)
                        .arg(&used)
                        .invoke_async::<i64>(&mut conn);
                    match tokio::time::timeout((lease / 3).min(left), call).await {
                        Ok(Ok(1)) => valid = sent,
                        Ok(Ok(2)) => {
                            valid = sent;
                            set_once(&why, Stop::Cancelled);
                            here.cancelled_on_pool(&pool);
                        }
                        Ok(Ok(_)) => {
                            lost();
                            return;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(task = %task, "renewing the lease: {e}");
                        }
                        Err(_) => tracing::warn!(task = %task, "renewing the lease timed out"),
                    }
                    if tokio::time::Instant::now() >= valid + bound {
                        lost();
                        return;
                    }
                }
            }))
        };
        // The session watchdog ("20.9 Bridge": sessions time out).
        let _watchdog = {
            let (token, why, limit) = (token.clone(), Arc::clone(&why), config.session_timeout);
            AbortOnDropHandle::new(tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                set_once(&why, Stop::Watchdog);
                token.cancel();
            }))
        };
        let failed = |message: String| {
            TaskNotification::new(
                job.task,
                TaskStatus::Failed,
                format!("Agent \"{d}\" failed: {message}"),
                Default::default(),
            )
        };
        let builder = match (self.factory)(job) {
            Ok(b) => b,
            Err(e) => {
                return Some((
                    failed(format!("the worker could not build it: {e}")),
                    Arc::default(),
                    forkhive_core::Usage::default(),
                ));
            }
        };
        let source = match &job.agent_type {
            Some(t) => QuerySource::custom(t),
            None => QuerySource::default_agent(),
        };
        let kind = if job.teammate.is_some() {
            AgentKind::Teammate
        } else {
            AgentKind::Subagent
        };
        let mut cx = AgentContext::new(job.task, kind, source).with_lineage(Some(job.parent), 1);
        if let Some(t) = &job.agent_type {
            cx = cx.with_agent_type(t.clone());
        }
        let sink = Arc::new(ChildSink {
            child: job.task,
            progress: Arc::clone(&progress),
            output: None,
            forward: self.events.clone(),
        });
        // A teammate: its side of the team, on its agent's tree; `SendMessage` kept; in plan
        // mode, held to read-only tools until its lead approves its plan.
        let (builder, team) = match &job.teammate {
            None => (builder, None),
            Some(t) => match self.teammate(job, t, builder) {
                Ok(ready) => {
                    if let (_, Some((team, name))) = &ready {
                        here.told(Some((Arc::clone(team), name.clone())), None);
                    }
                    ready
                }
                Err(why) => {
                    return Some((failed(why), Arc::default(), forkhive_core::Usage::default()));
                }
            },
        };
        // `bubble`: the parent's process decides every call — after the worker host's own
        // policy (the factory's), whose denial stands without asking anyone.
        let builder = if job.bubble {
            let local = builder.current_policy();
            let remote = Arc::new(super::RemoteAsk::new(
                self.pool.clone(),
                job.task,
                job.parent,
                token.clone(),
                super::ASK_TIMEOUT,
            ));
            builder.policy(Arc::new(crate::tool::Both::new(local, remote)))
        } else {
            builder
        };
        let built = builder
            .context(cx)
            .cancellation(token.clone())
            .events(sink)
            .build()
            .await;
        let mut agent = match built {
            Ok(a) => a,
            Err(e) => {
                return Some((
                    failed(format!("the worker could not build it: {e}")),
                    Arc::default(),
                    forkhive_core::Usage::default(),
                ));
            }
        };
        if token.is_cancelled() && why.lock().ok().and_then(|w| *w) == Some(Stop::LostLease) {
            return None;
        }
        // Messages to this task (`Pool::send_message`): into its queue, acknowledged once its
        // conversation records them (in `recorded`).
        let relay = AbortOnDropHandle::new(tokio::spawn(relay(
            self.pool.clone(),
            job.task,
            agent.pending(),
            Arc::clone(&recorded),
        )));
        let run = match team {
            Some((team, name)) => {
                // Its lead is in another process: nothing here waits on this promise.
                let promise = crate::base::pending::OwnedPromise::new(
                    &crate::base::pending::PendingQueue::new(),
                );
                crate::team::teammate_run(team, name, job.prompt.clone())(
                    &mut agent,
                    promise.handle(),
                )
                .await
            }
            None => agent.run(job.prompt.clone()).await,
        };
        drop(relay);
        drop(renew);
        if stopped_by_shutdown.load(Ordering::Acquire) {
            set_once(&why, Stop::Shutdown);
        }
        let stop = *why.lock().unwrap_or_else(|e| e.into_inner());
        if stop == Some(Stop::LostLease) {
            return None;
        }
        let status = run.stop.task_status();
        let summary = match (&run.stop, status) {
            (crate::runtime::StopReason::Completed, _) => format!("Agent \"{d}\" finished"),
            (_, TaskStatus::Completed) => format!("Agent \"{d}\" {}", run.stop),
            (_, TaskStatus::Killed) => format!("Agent \"{d}\" was stopped"),
            _ => {
                let why = run
                    .error
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| run.stop.to_string());
                format!("Agent \"{d}\" failed: {why}")
            }
        };
        let result = if run.final_text.is_empty() && status != TaskStatus::Completed {
            progress.last_text()
        } else {
            run.final_text.clone()
        };
        let mut usage = run.usage;
        usage.tool_uses = progress.tool_uses();
        usage.duration_ms = u64::try_from(progress.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut n = TaskNotification::new(job.task, status, summary, usage.to_notification());
        if !result.is_empty() {
            n = n.with_result(crate::task::cap_answer(result, None));
        }
        if status == TaskStatus::Killed {
            let note = match stop {
                Some(Stop::Watchdog) => format!(
                    "the session watchdog stopped it after {} s",
                    config.session_timeout.as_secs()
                ),
                Some(Stop::Shutdown) => "its worker shut down before it finished".to_owned(),
                // Its run may say why (a teammate whose shutdown outran its grace).
                _ => run.error.as_ref().map_or_else(
                    || "cancelled".to_owned(),
                    |e| crate::task::error_chain(e.as_ref()),
                ),
            };
            n = noted(n, note);
        }
        // The registry's roll-up reports what the notification does.
        Some((n, recorded, usage))
    }

    /// A teammate job's side of its team on this worker, under its lead's shutdown policy and
    /// grace.
    fn side_of(&self, t: &super::Teammate) -> std::result::Result<crate::team::Team, String> {
        let policy = if t.ask_before_shutdown {
            crate::team::ShutdownPolicy::Ask
        } else {
            crate::team::ShutdownPolicy::Approve
        };
        // The lead's grace, so that a teammate that approved a shutdown and is stuck in a
        // tool is cancelled when its lead said, not at a default of the worker's.
        let grace = t
            .shutdown_grace_ns
            .map_or(crate::team::SHUTDOWN_GRACE, Duration::from_nanos);
        Ok(self
            .pool
            .member_team(&t.team)
            .map_err(|e| format!("teammate `{}`: {e}", t.name))?
            .with_shutdown_policy(policy)
            .with_shutdown_grace(grace))
    }

    /// A teammate job's builder and its side of the team (see [`Job::teammate`]); why not,
    /// when it cannot run as one.
    #[allow(clippy::type_complexity)]
    fn teammate(
        &self,
        job: &Job,
        t: &super::Teammate,
        builder: AgentBuilder,
    ) -> std::result::Result<(AgentBuilder, Option<(Arc<crate::team::Team>, String)>), String> {
        let team = Arc::new(self.side_of(t)?);
        team.join(crate::team::Member {
            name: t.name.clone(),
            task: job.task,
            agent_type: job.agent_type.clone().unwrap_or_default(),
            state: crate::team::MemberState::Running,
        })
        .map_err(|e| format!("teammate `{}`: {e}", t.name))?;
        let builder = builder.keep_team_tool().ok_or_else(|| {
            format!(
                "the worker gave teammate `{}` no `SendMessage` tool, so it could not answer its \
                 lead: a worker's factory adds `forkhive::spawn::control::SendMessageTool` for a \
                 job with `teammate`",
                t.name
            )
        })?;
        let builder = if t.plan_mode {
            team.enter_plan_mode(&t.name);
            let host = builder.current_policy();
            builder.policy(Arc::new(crate::tool::Both::new(
                Arc::new(crate::team::PlanMode::new(&team, &t.name)),
                host,
            )))
        } else {
            builder
        };
        Ok((
            builder.extension(Arc::clone(&team)),
            Some((team, t.name.clone())),
        ))
    }

    /// Reports a task (its inbox closed first, its unread letters named in the note) and
    /// acknowledges its entry (see [`Self::finish`]); its letters are acknowledged once the
    /// report is stored. `dead`: a dead-letter reason and the raw job. `None`: not reported
    /// (not ours, or Redis failed); `Some(pushed)`.
    #[allow(clippy::too_many_arguments)]
    async fn report_task(
        &self,
        conn: &mut ConnectionManager,
        me: &str,
        entry: &str,
        job: &Job,
        (mut n, usage): (TaskNotification, Option<forkhive_core::Usage>),
        recorded: &Mutex<HashSet<String>>,
        dead: (&str, &str),
    ) -> Option<bool> {
        let (unread, letters) = self.close_inbox(job, recorded).await;
        if !unread.is_empty() {
            let line = format!(
                "{} message(s) arrived after it stopped reading: {}",
                unread.len(),
                unread.join(" ")
            );
            n.note = Some(crate::task::cap_note(match n.note.take() {
                Some(before) => format!("{before}; {line}"),
                None => line,
            }));
        }
        // A teammate's lead reads its last letters before it takes it for ended: the mark
        // follows them in its inbox.
        if let Some(t) = &job.teammate
            && let Ok(lead) = crate::mailbox::Inbox::new(t.team.clone(), crate::team::LEAD)
        {
            use crate::mailbox::Mailbox;
            let mark = crate::team::ended_mark(&t.name, &job.task);
            if let Err(e) = self.pool.mail.send(&lead, mark).await {
                tracing::warn!(task = %job.task, "marking the teammate's end for its lead: {e}");
            }
        }
        let ended = crate::task::TaskState::ended(n.status);
        match self
            .finish(conn, me, entry, Some((job.parent, &n)), dead.0, dead.1)
            .await
        {
            Ok(Some(pushed)) => {
                self.drop_letters(&job.task, &letters).await;
                // An ended teammate leaves its team's record (its closed inbox says it ended
                // meanwhile, and refuses letters; the key expires, the record must not stay).
                if let Some(t) = &job.teammate
                    && let Err(e) = self.pool.delist(&t.team, &t.name, &job.task).await
                {
                    tracing::warn!(task = %job.task, "taking the teammate off its team's record: {e}");
                }
                super::record(&self.pool, &job.task, ended, usage).await;
                Some(pushed)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(task = %job.task, "reporting: {e}");
                None
            }
        }
    }

    /// Closes `job`'s inbox (no letter is stored after this) and takes the letters its
    /// conversation never took in (it stopped first): their texts, for its notification, and
    /// every letter's id by inbox, acknowledged once the report is stored
    /// ([`Self::drop_letters`]). A teammate's team inbox is closed by the same key (every
    /// letter to it is sent unless that key is set) and read the same way.
    async fn close_inbox(
        &self,
        job: &Job,
        recorded: &Mutex<HashSet<String>>,
    ) -> (Vec<String>, Vec<(crate::mailbox::Inbox, Vec<String>)>) {
        use crate::mailbox::Mailbox;
        let task = &job.task;
        let closed: redis::RedisResult<()> = async {
            let mut conn = self.pool.h.conn().await?;
            redis::cmd("SET")
                .arg(self.pool.task_key("closed", task))
                .arg("1")
                .arg("PX")
                .arg(OUTPUT_TTL.as_millis().to_string())
                .query_async(&mut conn)
                .await
        }
        .await;
        if let Err(e) = closed {
            tracing::warn!(task = %task, "closing its inbox: {e}");
        }
        let mut inboxes: Vec<crate::mailbox::Inbox> = self.pool.inbox(task).into_iter().collect();
        if let Some(t) = &job.teammate {
            inboxes.extend(crate::mailbox::Inbox::new(t.team.clone(), t.name.clone()));
        }
        let rec = recorded.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (mut left, mut ids) = (Vec::new(), Vec::new());
        for inbox in inboxes {
            let letters = match self.pool.mail.receive(&inbox).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(task = %task, "reading its unread messages: {e}");
                    continue;
                }
            };
            ids.push((inbox, letters.iter().map(|d| d.id.clone()).collect()));
            left.extend(
                letters
                    .into_iter()
                    // Control letters (a lead's shutdown request, a team's bookkeeping) were
                    // for the run, not its reader: not named as unread.
                    .filter(|d| !rec.contains(&d.id) && !crate::team::is_control(&d.text))
                    .map(|d| crate::base::pending::message_envelope(&d.from, &d.text)),
            );
        }
        (left, ids)
    }

    /// Acknowledges (deletes) a reported task's letters.
    async fn drop_letters(&self, task: &TaskId, letters: &[(crate::mailbox::Inbox, Vec<String>)]) {
        use crate::mailbox::Mailbox;
        for (inbox, ids) in letters {
            if !ids.is_empty()
                && let Err(e) = self.pool.mail.ack(inbox, ids).await
            {
                tracing::warn!(task = %task, "acknowledging its messages: {e}");
            }
        }
    }

    /// Reports (when `n`) and acknowledges `entry` in one step; `me` non-empty: only while
    /// this worker holds the lease. `Ok(None)`: not ours; `Ok(Some(true))`: the notification
    /// was stored by this call.
    async fn finish(
        &self,
        conn: &mut ConnectionManager,
        me: &str,
        entry: &str,
        n: Option<(TaskId, &TaskNotification)>,
        dead: &str,
        raw: &str,
    ) -> Result<Option<bool>> {
        let spare = self.pool.key("unreported");
        // Without a notification (a dead letter that is not a job), the task's keys are a
        // spare key nothing reads: only the entry is acknowledged and dead-lettered.
        let (task, keys, id, json) = match n {
            Some((parent, n)) => (
                Some(n.task_id),
                self.pool.notify_keys(&parent),
                n.task_id.to_string(),
                notification_json(n)?,
            ),
            None => (
                None,
                [spare.clone(), spare.clone(), spare.clone()],
                String::new(),
                String::new(),
            ),
        };
        let [ns, ni, nd] = keys;
        let task_key = |what: &str| match &task {
            Some(t) => self.pool.task_key(what, t),
            None => spare.clone(),
        };
        let shown = task.map_or_else(|| entry.to_owned(), |t| t.to_string());
        let mut tries = 0u32;
        loop {
            let r: redis::RedisResult<i64> = redis::Script::new(FINISH)
                .key(task_key("lease"))
                .key(self.pool.key("jobs"))
                .key(task_key("run"))
                .key(task_key("out"))
                .key(&ns)
                .key(&ni)
                .key(&nd)
                .key(self.pool.key("dead"))
                .key(task_key("used"))
                .arg(me)
                .arg(GROUP)
                .arg(entry)
                .arg(&id)
                .arg(&json)
                .arg(OUTPUT_TTL.as_millis().to_string())
                .arg(dead)
                .arg(raw)
                .arg(&self.name)
                .invoke_async(conn)
                .await;
            match r {
                Ok(-1) => {
                    tracing::warn!(task = %shown, "its lease was taken before it reported; the taker reports");
                    return Ok(None);
                }
                Ok(pushed) => return Ok(Some(pushed == 1)),
                // Retried: the script is idempotent (the notification id dedupes).
                Err(e) if tries < 5 => {
                    tries += 1;
                    tracing::warn!(task = %shown, "reporting: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200 << tries)).await;
                }
                Err(e) => return Err(self.fail("reporting", e)),
            }
        }
    }
}

/// Feeds the letters sent to a running task into its queue; each is acknowledged once the
/// conversation records it (and `recorded` holds its id), given again if it was dropped.
async fn relay(
    pool: Pool,
    task: TaskId,
    queue: crate::base::pending::PendingQueue,
    recorded: Arc<Mutex<HashSet<String>>>,
) {
    use crate::base::pending::{PendingMessage, SEND_MESSAGE_ORIGIN, message_envelope};
    use crate::mailbox::Mailbox;
    let Ok(inbox) = pool.inbox(&task) else {
        return;
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, bool)>();
    let mut in_flight: HashSet<String> = HashSet::new();
    // Recorded, not yet acknowledged (an acknowledgement failed): retried, never given again.
    let mut held: Vec<String> = Vec::new();
    loop {
        if !held.is_empty() {
            match pool.mail.ack(&inbox, &held).await {
                Ok(()) => held.clear(),
                Err(e) => {
                    tracing::warn!(task = %task, "acknowledging its messages: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        match pool.mail.receive(&inbox).await {
            Ok(letters) => {
                for d in letters {
                    let seen = recorded
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&d.id);
                    if seen || !in_flight.insert(d.id.clone()) {
                        continue;
                    }
                    let (tx, id, rec) = (tx.clone(), d.id.clone(), Arc::clone(&recorded));
                    // The envelope is made here, from the sender's name: a letter's text cannot
                    // forge one.
                    let text = message_envelope(&d.from, &d.text);
                    queue.push(PendingMessage::new(text, SEND_MESSAGE_ORIGIN).with_receipt(
                        move |ok| {
                            if ok {
                                rec.lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .insert(id.clone());
                            }
                            let _ = tx.send((id, ok));
                        },
                    ));
                }
            }
            Err(e) => {
                tracing::warn!(task = %task, "reading its messages: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        let known: Vec<String> = in_flight.iter().chain(held.iter()).cloned().collect();
        tokio::select! {
            Some((id, recorded)) = rx.recv() => {
                in_flight.remove(&id);
                if recorded {
                    held.push(id);
                }
            }
            r = pool.mail.wait_beyond(&inbox, &known, Duration::from_secs(30)) => {
                if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// `XAUTOCLAIM … JUSTID`'s answer: the next cursor and the claimed ids.
fn justid_reply(v: &redis::Value) -> Option<(String, Vec<String>)> {
    let redis::Value::Array(parts) = v else {
        return None;
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let next = text(parts.first()?)?;
    let ids = match parts.get(1)? {
        redis::Value::Array(ids) => ids.iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    Some((next, ids))
}

/// `n` with `note` added.
fn noted(mut n: TaskNotification, note: impl Into<String>) -> TaskNotification {
    n.note = Some(note.into());
    n
}

fn set_once(why: &Mutex<Option<Stop>>, stop: Stop) {
    let mut w = why.lock().unwrap_or_else(|e| e.into_inner());
    if w.is_none() {
        *w = Some(stop);
    }
}

fn add(report: &mut WorkerReport, done: std::result::Result<WorkerReport, tokio::task::JoinError>) {
    match done {
        Ok(r) => {
            report.ran += r.ran;
            report.reported += r.reported;
            report.reclaimed_killed += r.reclaimed_killed;
            report.reclaimed_rerun += r.reclaimed_rerun;
            report.dead_lettered += r.dead_lettered;
            report.lost_leases += r.lost_leases;
        }
        Err(e) => tracing::error!("a job's task panicked: {e}"),
    }
}

/// A task's place on the running map, removed on every path.
struct RunningEntry<'a> {
    running: &'a Running,
    id: TaskId,
    task: Arc<RunningTask>,
}

impl<'a> RunningEntry<'a> {
    fn new(
        running: &'a Running,
        task: TaskId,
        token: CancellationToken,
        shutdown: Arc<AtomicBool>,
        teammate_job: bool,
    ) -> Self {
        let here = Arc::new(RunningTask {
            id: task,
            token,
            shutdown,
            teammate_job,
            reading: AtomicBool::new(false),
            grace: Mutex::default(),
        });
        running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(task, Arc::clone(&here));
        Self {
            running,
            id: task,
            task: here,
        }
    }
}

impl Drop for RunningEntry<'_> {
    fn drop(&mut self) {
        // What its team kept of a grace its run never took (it ended before it started); a
        // read still under way finds no team to tell.
        let team = self
            .task
            .grace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .take();
        if let Some((team, _)) = team {
            team.forget_overdue(&self.id);
        }
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Makes the workers' group on `jobs` (and the stream) if it is not there, reading from the
/// stream's start: jobs submitted before any worker existed are read too.
async fn create_group(conn: &mut ConnectionManager, jobs: &str) -> redis::RedisResult<()> {
    let made: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(jobs)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match made {
        Err(e) if e.code() != Some("BUSYGROUP") => Err(e),
        _ => Ok(()),
    }
}

/// Where the next entry comes from: the worker's own pending entries (once, at start), then
/// dead workers' (every half lease), then new ones (a blocking read on a connection of its
/// own, without the shared connection's response timeout: redis-rs#1236).
struct Reader {
    jobs: String,
    /// The name its blocking connection gives itself (`CLIENT SETNAME`), so an operator's
    /// `CLIENT LIST` shows which worker reads on it.
    client_name: String,
    /// Whether naming it was refused (said once).
    unnamed: bool,
    consumer: String,
    lease: Duration,
    own: Option<String>,
    claim_from: String,
    last_claim: Option<tokio::time::Instant>,
    client: redis::Client,
    blocking: Option<MultiplexedConnection>,
}

impl Reader {
    fn new(w: &Worker) -> Self {
        Self {
            jobs: w.pool.key("jobs"),
            client_name: w.pool.key(&format!("worker:{}:reader", w.name)),
            unnamed: false,
            consumer: w.name.clone(),
            lease: w.pool.config.lease,
            own: Some("0".to_owned()),
            claim_from: "0-0".to_owned(),
            last_claim: None,
            client: w.pool.h.client.clone(),
            blocking: None,
        }
    }

    /// The next entry to take: its own pending ones first, then a dead worker's, then a new
    /// one (a blocking read of at most half a lease). After an error the blocking connection
    /// is not used again — a server that restarted closed it, and a read on it would fail
    /// for ever — and a group that is gone (a server restarted without persistence) is made
    /// again.
    async fn next(&mut self, conn: &mut ConnectionManager) -> redis::RedisResult<Option<Entry>> {
        let read = self.read(conn).await;
        if let Err(e) = &read {
            self.blocking = None;
            if e.code() == Some("NOGROUP") {
                self.own = Some("0".to_owned());
                self.claim_from = "0-0".to_owned();
                self.last_claim = None;
                if let Err(e) = create_group(conn, &self.jobs).await {
                    tracing::warn!(jobs = %self.jobs, "making the workers' group again: {e}");
                }
            }
        }
        read
    }

    async fn read(&mut self, conn: &mut ConnectionManager) -> redis::RedisResult<Option<Entry>> {
        if let Some(after) = self.own.take() {
            let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg(&self.jobs)
                .arg(&after)
                .query_async(conn)
                .await?;
            if let Some(e) = reply
                .and_then(|r| r.keys.into_iter().next())
                .and_then(|k| k.ids.into_iter().next())
            {
                self.own = Some(e.id.clone());
                return Ok(Some(Entry::from_stream(&e)));
            }
        }
        let due = self
            .last_claim
            .is_none_or(|t| t.elapsed() >= self.lease / 2);
        if due {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&self.jobs)
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX))
                .arg(&self.claim_from)
                .arg("COUNT")
                .arg(1)
                .query_async(conn)
                .await?;
            self.claim_from = reply.next_stream_id;
            if self.claim_from == "0-0" {
                self.last_claim = Some(tokio::time::Instant::now());
            }
            if let Some(e) = reply.claimed.first() {
                return Ok(Some(Entry::from_stream(e)));
            }
        }
        let conn = match &mut self.blocking {
            Some(c) => c,
            None => {
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                let mut c = self
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                // A courtesy to operators: a server or ACL that refuses it costs nothing more.
                let named = redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(&self.client_name)
                    .query_async::<()>(&mut c)
                    .await;
                if let Err(e) = named
                    && !std::mem::replace(&mut self.unnamed, true)
                {
                    tracing::warn!(jobs = %self.jobs, "naming the reading connection: {e}");
                }
                self.blocking.insert(c)
            }
        };
        let block = (self.lease / 2).min(Duration::from_secs(5));
        let read = tokio::time::timeout(
            block + Duration::from_secs(2),
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(u64::try_from(block.as_millis()).unwrap_or(5000))
                .arg("STREAMS")
                .arg(&self.jobs)
                .arg(">")
                .query_async::<Option<StreamReadReply>>(conn),
        )
        .await;
        match read {
            Ok(r) => Ok(r?
                .and_then(|r| r.keys.into_iter().next())
                .and_then(|k| k.ids.into_iter().next())
                .map(|e| Entry::from_stream(&e))),
            Err(_) => {
                self.blocking = None;
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A pool on an address nothing answers.
    fn unreachable_pool() -> Pool {
        Pool::new(
            "redis://127.0.0.1:1",
            "fh",
            "p",
            super::super::PoolConfig::default(),
        )
        .unwrap()
    }

    fn running(teammate_job: bool) -> Arc<RunningTask> {
        Arc::new(RunningTask {
            id: TaskId::generate(forkhive_core::TaskKind::Agent),
            token: CancellationToken::new(),
            shutdown: Arc::default(),
            teammate_job,
            reading: AtomicBool::new(false),
            grace: Mutex::default(),
        })
    }

    /// A plain task's pool cancel lands at once; a teammate's, whose reason cannot be read
    /// (the store does not answer), is a plain cancel within the read's second, and a second
    /// cancel meanwhile does not read again.
    #[tokio::test]
    async fn a_pool_cancel_whose_reason_cannot_be_read_is_a_plain_cancel() {
        let pool = unreachable_pool();
        let plain = running(false);
        plain.cancelled_on_pool(&pool);
        assert!(plain.token.is_cancelled());
        let teammate = running(true);
        teammate.cancelled_on_pool(&pool);
        assert!(teammate.reading.load(Ordering::Acquire));
        teammate.cancelled_on_pool(&pool);
        tokio::time::timeout(Duration::from_secs(5), teammate.token.cancelled())
            .await
            .expect("cancelled after the failed read");
        assert_eq!(teammate.grace.lock().unwrap().1, None, "no grace was read");
    }

    /// A teammate job's side of the team keeps its lead's shutdown policy and grace (so a
    /// teammate that approved and is stuck in a tool is cancelled when its lead said); a job
    /// from a lead of an earlier version, without the grace, keeps the default.
    #[test]
    fn a_teammate_keeps_its_leads_shutdown_policy_and_grace() {
        let w = Worker::new(unreachable_pool(), "w", |_| {
            Err(Error::Config("unused".into()))
        })
        .unwrap();
        for (ask, sent, kept) in [
            (
                true,
                Some(Duration::from_secs(600)),
                Duration::from_secs(600),
            ),
            (
                false,
                Some(Duration::from_micros(1_500)),
                Duration::from_micros(1_500),
            ),
            (true, Some(Duration::ZERO), Duration::ZERO),
            // A lead's `Duration::MAX` (never cancel), saturated: about 584 years.
            (false, Some(Duration::MAX), Duration::from_nanos(u64::MAX)),
            (false, None, crate::team::SHUTDOWN_GRACE),
        ] {
            let mut json = serde_json::json!({"team": "review", "name": "alice"});
            if ask {
                json["ask_before_shutdown"] = serde_json::json!(true);
            }
            if let Some(g) = sent {
                json["shutdown_grace_ns"] =
                    serde_json::json!(u64::try_from(g.as_nanos()).unwrap_or(u64::MAX));
            }
            let t: super::super::Teammate = serde_json::from_value(json.clone()).unwrap();
            let team = w.side_of(&t).unwrap();
            assert_eq!(team.shutdown_grace(), kept, "{json}");
            let policy = if ask {
                crate::team::ShutdownPolicy::Ask
            } else {
                crate::team::ShutdownPolicy::Approve
            };
            assert_eq!(team.shutdown_policy(), policy, "{json}");
            // A `Teammate` writes back as it was read, an absent grace absent. (What the lead
            // writes is checked in `tests/pool_team.rs`, 6b.)
            // (The two flags are always written; the grace only when there is one.)
            let mut again = serde_json::to_value(&t).unwrap();
            let fields = again.as_object_mut().unwrap();
            assert_eq!(fields.remove("plan_mode"), Some(serde_json::json!(false)));
            if !ask {
                assert_eq!(
                    fields.remove("ask_before_shutdown"),
                    Some(serde_json::json!(false))
                );
            }
            assert_eq!(again, json);
        }
    }
}
