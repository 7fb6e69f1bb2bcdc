//! Workers in other processes (feature `redis`): a pool of worker processes, anywhere that
//! reaches one Redis, runs the agents a coordinator hands it, and every task's
//! `<task-notification>` reaches its parent's conversation exactly once — across a worker
//! killed mid-task and a coordinator killed and restarted.
//!
//! "Chapter 20: Agent Spawning and Orchestration — 20.9 Bridge": workers poll for work, sleep
//! when full and wake when a slot frees, hold each session to a timeout enforced by a
//! watchdog. "Coordinator Mode: A Working Multi-Agent System, From the Source — 6. gotchas":
//! a worker that never reports is the failure to design out; here a worker that dies is
//! noticed by its lease, and its parent hears `killed` with the work the worker had streamed.
//!
//! - [`Pool`] is the handle both sides hold: [`submit`](Pool::submit) a [`Job`],
//!   [`cancel`](Pool::cancel) a task and its remote descendants, read the
//!   [`dead_letters`](Pool::dead_letters).
//! - [`Worker`] runs in each worker process: it takes jobs through a Redis consumer group,
//!   builds each agent with the host's [`AgentFactory`] (any backend), and reports.
//! - [`Delivery`] runs beside the parent agent (the coordinator): it feeds the parent's
//!   notifications into its conversation and acknowledges each once the conversation — and its
//!   transcript — holds it. [`PoolAgentTool`] is the `Agent` tool whose children run on the
//!   pool.
//!
//! Delivery: at least once on the wire (a consumer group; a restarted worker drains its own
//! pending entries first; entries idle past the lease are reclaimed from dead workers with
//! `XAUTOCLAIM`; after [`PoolConfig::max_deliveries`] an entry is dead-lettered and its parent
//! told), exactly once into the conversation (one notification id per task, refused once
//! pending or delivered; the parent skips what its resumed conversation already holds).
//!
//! Layout, under `<prefix>:{<pool>}:` (one hash tag: the pool's keys share a cluster slot):
//! `jobs` (the stream; group `workers`), `dead` (dead letters), `lease:<task>` (the running
//! worker, expiring), `run:<task>` (that the task started, where), `out:<task>` (its latest
//! output, refreshed with each lease renewal), `cancel:<task>`, `asks:<parent>` and
//! `answer:<parent>:<entry>` (permission requests and their answers), `closed:<task>` (a
//! reported task takes no more messages), `inbox:<task>` and `ids:<task>` (its messages: a
//! Redis mailbox whose team is the pool), `kids:<parent>` (a parent's
//! tasks not yet delivered), `sub:<task>` (its entry, so a retried submit adds nothing),
//! `worker:<name>` (a live worker's claim on its name). Cancels are
//! published on `<prefix>:{<pool>}:cancels`. Notifications use the notification queue's keys
//! ([`RedisNotificationQueue`]) under the same prefix, hash-tagged by the parent: a report
//! touches both tags in one script, which is why the pool runs on one Redis node, not a
//! Cluster.

mod ask;
mod delivery;
mod hosted;
mod worker;

use std::fmt;
use std::time::Duration;

use forkhive_core::{TaskId, TaskNotification};
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::mailbox::{RedisHandle, check_name};
use crate::task::RedisNotificationQueue;

pub use self::ask::{ASK_TIMEOUT, RemoteAsk};
pub(crate) use self::delivery::route_message;
pub use self::delivery::{Delivery, PoolAgentTool};
pub use self::worker::{AgentFactory, Worker, WorkerReport};
/// The token [`Worker::run`] stops on (re-exported: a host needs no `tokio-util` of its own).
pub use tokio_util::sync::CancellationToken;

/// The consumer group every worker reads the job stream through.
pub const GROUP: &str = "workers";

/// The largest job a coordinator may submit (its JSON): a prompt is text, not a payload.
pub const MAX_JOB_BYTES: usize = 1024 * 1024;

/// How many times [`Pool::submit`] sends a submission whose answer does not come.
pub const SUBMIT_TRIES: u32 = 3;

/// How a submission went ([`Pool::submit_checked`]).
#[derive(Debug)]
pub(crate) enum Submitted {
    /// Added (or found added by an earlier try): the job stream's entry id.
    Added(String),
    /// A try went unanswered and no later one was: the task may or may not run. Why.
    Unknown(Error),
}

/// Whether `e` leaves unknown what the store did with a command: it may have been sent and
/// run, and only its answer lost.
fn unanswered(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_connection_dropped() || e.is_io_error()
}

/// How much of a task's latest output is kept for its parent should its worker die (the last
/// this many bytes, cut at a character boundary).
pub const PARTIAL_OUTPUT_BYTES: usize = 64 * 1024;

/// How a pool behaves. Build it from [`PoolConfig::default`] with the `with_*` setters; both
/// sides of a pool should use the same lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Agents a worker runs at once (default 32). A full worker reads no more jobs, and wakes
    /// when a slot frees or it is shut down.
    pub capacity: usize,
    /// How long a task's lease lasts without renewal (default 15 s; renewed every third of
    /// it). A worker that dies loses its leases within this; its tasks are then reclaimed.
    pub lease: Duration,
    /// Deliveries of one job before it is dead-lettered and its parent told (default 3).
    pub max_deliveries: u32,
    /// The longest one task may run; a watchdog stops it then and its parent hears `killed`
    /// (default 24 h).
    pub session_timeout: Duration,
    /// How long a parent waits for a task the store no longer holds — gone from its task list
    /// with no report, as when Redis restarts without persistence — before it reports the
    /// task `killed` itself, "lost" (default 60 s; checked every lease).
    pub lost_after: Duration,
    /// How long a worker shutting down lets its running tasks finish before it stops them
    /// (default 30 s).
    pub drain: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            capacity: 32,
            lease: Duration::from_secs(15),
            max_deliveries: 3,
            session_timeout: Duration::from_secs(24 * 60 * 60),
            lost_after: Duration::from_secs(60),
            drain: Duration::from_secs(30),
        }
    }
}

impl PoolConfig {
    /// Sets [`capacity`](Self::capacity) (at least 1).
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// Sets [`lease`](Self::lease) (at least 300 ms).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(300));
        self
    }

    /// Sets [`max_deliveries`](Self::max_deliveries) (at least 1).
    pub fn with_max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// Sets [`session_timeout`](Self::session_timeout).
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets [`lost_after`](Self::lost_after).
    pub fn with_lost_after(mut self, after: Duration) -> Self {
        self.lost_after = after;
        self
    }

    /// Sets [`drain`](Self::drain).
    pub fn with_drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }
}

/// One task handed to the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Job {
    /// The task's id: the agent's id on the worker, and its notification's.
    pub task: TaskId,
    /// Whose conversation its notification goes to.
    pub parent: TaskId,
    /// The `description` (3–5 words) its notification names it by.
    pub description: String,
    /// The prompt it runs.
    pub prompt: String,
    /// The agent type the worker builds (`None`: its default), as the worker's
    /// [`AgentFactory`] reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_type: Option<String>,
    /// Whether running it twice is harmless: a task whose worker died then runs again
    /// elsewhere instead of being reported `killed`.
    #[serde(default)]
    pub idempotent: bool,
    /// Whether the worker's agent asks the parent's process about each tool call
    /// (`permissionMode: bubble`): after the worker host's own policy (its factory's), whose
    /// denial stands, the parent agent's own policy decides, where the user is.
    #[serde(default)]
    pub bubble: bool,
    /// Set when the task is a team's teammate ([`Pool::team`]): the worker runs it as one —
    /// prompt, idle, letters, until its lead asks it to shut down — not as a one-shot agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teammate: Option<Teammate>,
}

/// Who a teammate job is in its team (see [`Job::teammate`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Teammate {
    /// Its team's name.
    pub team: String,
    /// Its name in the team.
    pub name: String,
    /// Started in plan mode: only read-only tools run until the lead approves its plan.
    #[serde(default)]
    pub plan_mode: bool,
    /// Whether it asks its model about a shutdown request
    /// ([`ShutdownPolicy::Ask`](crate::team::ShutdownPolicy::Ask)) instead of approving it.
    #[serde(default)]
    pub ask_before_shutdown: bool,
    /// Its lead's shutdown grace in nanoseconds
    /// ([`Team::with_shutdown_grace`](crate::team::Team::with_shutdown_grace)), which its
    /// worker's side of the team keeps too; absent (a lead of an earlier version), the
    /// default [`SHUTDOWN_GRACE`](crate::team::SHUTDOWN_GRACE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_ns: Option<u64>,
}

impl Job {
    /// A job for `parent` with a fresh task id.
    pub fn new(parent: TaskId, description: impl Into<String>, prompt: impl Into<String>) -> Self {
        Self {
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            parent,
            description: description.into(),
            prompt: prompt.into(),
            agent_type: None,
            idempotent: false,
            bubble: false,
            teammate: None,
        }
    }

    /// The same job, run by `agent_type`.
    pub fn with_agent_type(mut self, agent_type: impl Into<String>) -> Self {
        self.agent_type = Some(agent_type.into());
        self
    }

    /// The same job, marked idempotent (see [`Job::idempotent`]).
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// The same job, its permissions decided in the parent's process (see [`Job::bubble`]).
    pub fn bubble(mut self, bubble: bool) -> Self {
        self.bubble = bubble;
        self
    }
}

/// A teammate a team has on record on a pool ([`Pool::teammates`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolTeammate {
    /// Its name in the team.
    pub name: String,
    /// Its task.
    pub task: TaskId,
    /// Whether it still runs or waits to: its inbox open, its job queued or under a lease.
    pub live: bool,
}

/// A job the pool gave up on, as its dead-letter stream keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The job stream's entry id.
    pub entry: String,
    /// Why it was given up on.
    pub reason: String,
    /// The job's JSON as it was submitted (possibly not a job at all).
    pub job: String,
}

/// KEYS: jobs, kids, submitted. ARGV: task, job JSON, kept ms. The job, and its parent's
/// record of it — once per task: a submit retried after a lost answer returns the first entry.
const SUBMIT: &str = r"
local known = redis.call('GET', KEYS[3])
if known then return known end
local entry = redis.call('XADD', KEYS[1], '*', 'task', ARGV[1], 'job', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], entry, 'PX', ARGV[3])
return entry
";

/// KEYS: the pool's jobs stream (for the slot; the keys below are built from ARGV[1], which is
/// why the pool needs one Redis node, not a Cluster). ARGV: prefix of kids/cancel keys, ttl ms,
/// channel, the value stored for the named tasks (`1`, or a shutdown's `grace:<ns>`), tasks.
/// Marks the tasks and every descendant recorded in `kids:` sets cancelled, and publishes
/// each. A `1` never replaces a value stored already (a descendant's, or a named task's
/// shutdown grace, stays what its worker reads; its time to live starts again); a grace
/// replaces a `1`.
const CANCEL: &str = r"
local base, ttl, channel, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local todo, seen, n = {}, {}, 0
local function mark(id, v)
  if seen[id] then return end
  seen[id] = true
  n = n + 1
  local key = base .. 'cancel:' .. id
  if v ~= '1' then
    redis.call('SET', key, v, 'PX', ttl)
  elseif not redis.call('SET', key, v, 'PX', ttl, 'NX') then
    redis.call('PEXPIRE', key, ttl)
  end
  redis.call('PUBLISH', channel, id)
  for _, kid in ipairs(redis.call('SMEMBERS', base .. 'kids:' .. id)) do
    todo[#todo + 1] = kid
  end
end
for i = 5, #ARGV do mark(ARGV[i], value) end
while #todo > 0 and n < 100000 do mark(table.remove(todo), '1') end
return n
";

/// The handle both sides of a pool hold. Clones share one connection.
#[derive(Clone)]
pub struct Pool {
    h: RedisHandle,
    prefix: String,
    name: String,
    queue: RedisNotificationQueue,
    /// Messages to running tasks: one inbox per task, the pool as its team.
    mail: crate::mailbox::RedisMailbox,
    /// Where the pool's tasks are recorded, if anywhere.
    registry: Option<std::sync::Arc<dyn crate::task::TaskRegistry>>,
    config: PoolConfig,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("url", &self.h.shown)
            .field("prefix", &self.prefix)
            .field("name", &self.name)
            .field("config", &self.config)
            .finish()
    }
}

/// How long a cancel mark is kept.
const CANCEL_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Why a task was cancelled, as its cancel key stores it: `1` for a plain cancel (what every
/// version of the pool reads as "cancelled"), `grace:<ns>` for a teammate that a lead's
/// shutdown cancelled when its grace of `ns` nanoseconds passed. Its worker reads it back,
/// so the teammate ends as one whose grace ran out in-process does (docs/teams.md, "Shutting
/// a teammate down").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReason {
    /// Any cancel but a shutdown's.
    Plain,
    /// A lead's shutdown, when its grace passed.
    ShutdownGrace(Duration),
}

impl CancelReason {
    /// What the cancel key holds.
    fn stored(&self) -> String {
        match self {
            Self::Plain => "1".to_owned(),
            Self::ShutdownGrace(grace) => format!(
                "grace:{}",
                u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX)
            ),
        }
    }

    /// What a cancel key's value says; anything else stored there (an older pool's `1`, a
    /// value this version does not know) is a plain cancel.
    pub(crate) fn read(stored: &str) -> Self {
        stored
            .strip_prefix("grace:")
            .filter(|ns| !ns.is_empty() && ns.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|ns| ns.parse::<u64>().ok())
            .map_or(Self::Plain, |ns| {
                Self::ShutdownGrace(Duration::from_nanos(ns))
            })
    }
}

impl Pool {
    /// The pool `name` at `url`, keys under `prefix` (each 1 to 64 of `[A-Za-z0-9_-]`).
    /// Nothing connects until first use; the URL's password never shows.
    pub fn new(url: &str, prefix: &str, name: &str, config: PoolConfig) -> Result<Self> {
        // The fields are public: checked here as the setters clamp them.
        if config.capacity == 0
            || config.lease < Duration::from_millis(300)
            || config.max_deliveries == 0
        {
            return Err(Error::Config(format!(
                "pool `{name}`: capacity {}, lease {} ms, max deliveries {}: each must be at \
                 least 1, 300 ms and 1",
                config.capacity,
                config.lease.as_millis(),
                config.max_deliveries
            )));
        }
        for (what, v) in [("key prefix", prefix), ("pool name", name)] {
            check_name(what, v).map_err(|_| {
                Error::Config(format!(
                    "{what} `{v}`: use 1-64 letters, digits, `_` and `-`"
                ))
            })?;
        }
        let h = RedisHandle::open(url).map_err(|why| {
            Error::Config(format!(
                "pool `{name}` at {}: {why}",
                crate::mailbox::redact_url(url)
            ))
        })?;
        let queue = RedisNotificationQueue::new(url, prefix)?;
        let mail = crate::mailbox::RedisMailbox::with_prefix(url, prefix)?;
        Ok(Self {
            h,
            prefix: prefix.to_owned(),
            name: name.to_owned(),
            queue,
            mail,
            registry: None,
            config,
        })
    }

    /// A handle on the same pool with connections of its own, as another process would have.
    /// Not needed within a process: clones share one connection and work from any number of
    /// workers and coordinators.
    pub fn reopen(&self) -> Self {
        Self {
            h: self.h.fresh(),
            queue: self.queue.reopen(),
            mail: self.mail.reopen(),
            ..self.clone()
        }
    }

    /// Records the pool's tasks in `registry` (a `RedisTaskRegistry` every host shares, say):
    /// `submit` creates each under its parent, the worker that runs it moves it to `running`,
    /// and whoever reports it rolls its usage up and ends it — so `children`,
    /// `descendants_usage` and the task's state answer for pool tasks as for local ones.
    /// Give every handle of the pool the same registry. Its failures are logged, never a
    /// task's.
    pub fn with_registry(
        mut self,
        registry: std::sync::Arc<dyn crate::task::TaskRegistry>,
    ) -> Self {
        self.registry = Some(registry);
        self
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The notification queue parents read (the same store workers report into).
    pub fn queue(&self) -> &RedisNotificationQueue {
        &self.queue
    }

    /// `<prefix>:{<pool>}:`
    fn base(&self) -> String {
        format!("{}:{{{}}}:", self.prefix, self.name)
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.base())
    }

    fn task_key(&self, what: &str, task: &TaskId) -> String {
        format!("{}{what}:{task}", self.base())
    }

    fn fail(&self, what: &str, e: redis::RedisError) -> Error {
        Error::Pool {
            message: format!("`{}` at {}: {what}: {e}", self.name, self.h.shown),
        }
    }

    async fn conn(&self) -> Result<ConnectionManager> {
        self.h.connect(|e| self.fail("could not connect", e)).await
    }

    /// Hands `job` to the pool: some worker runs it, and its parent's queue receives its
    /// notification once. Returns the job stream's entry id. Submitting the same task again
    /// (a retry after an error whose outcome was unknown) within a day returns the first entry
    /// and adds nothing.
    ///
    /// It retries so itself: a submission whose answer did not come (a timeout, a dropped
    /// connection: a network partition, a store failing over) is sent again up to
    /// [`SUBMIT_TRIES`] times in all, half a second apart and then twice as long each time.
    /// Past the last — or when a later try is refused after an earlier one went unanswered —
    /// the error says that whether the pool got it is unknown.
    pub async fn submit(&self, job: &Job) -> Result<String> {
        match self.submit_checked(job).await? {
            Submitted::Added(entry) => Ok(entry),
            Submitted::Unknown(e) => Err(e),
        }
    }

    /// [`submit`](Self::submit), telling an unknown outcome from a failure: the `Agent` tool
    /// keeps waiting for a task that may run, and says so to the model.
    pub(crate) async fn submit_checked(&self, job: &Job) -> Result<Submitted> {
        let json = serde_json::to_string(job).map_err(|e| Error::Task {
            id: job.task,
            message: format!("the job cannot be written as JSON: {e}"),
        })?;
        if json.len() > MAX_JOB_BYTES {
            return Err(Error::Task {
                id: job.task,
                message: format!(
                    "the job is {} bytes of JSON, over the pool's limit of {MAX_JOB_BYTES}",
                    json.len()
                ),
            });
        }
        if let Some(r) = &self.registry
            && r.get(&job.task).await.is_none()
        {
            let mut record = crate::task::TaskRecord::new(job.task, job.parent, &job.description);
            record.agent_type = job.agent_type.clone().unwrap_or_default();
            if let Err(e) = r.create(record).await {
                tracing::warn!(task = %job.task, "recording the pool task: {e}");
            }
        }
        let mut wait = Duration::from_millis(500);
        let mut tries = 1;
        // A try that went unanswered may have landed; a refused connection sent nothing.
        let mut maybe_sent = false;
        loop {
            let mut conn = self.conn().await?;
            let sent = redis::Script::new(SUBMIT)
                .key(self.key("jobs"))
                .key(self.task_key("kids", &job.parent))
                .key(self.task_key("sub", &job.task))
                .arg(job.task.to_string())
                .arg(&json)
                .arg(CANCEL_TTL.as_millis().to_string())
                .invoke_async(&mut conn)
                .await;
            match sent {
                Ok(entry) => return Ok(Submitted::Added(entry)),
                // Sent, perhaps, with its answer lost: the model told "could not start" would
                // start it again while it ran. The script is idempotent by task id, so asking
                // again is safe, and the answer tells.
                Err(e) if unanswered(&e) && tries < SUBMIT_TRIES => {
                    maybe_sent |= !e.is_connection_refusal();
                    tracing::warn!(
                        task = %job.task,
                        "submitting to pool `{}`: {e}; sending it again (try {} of \
                         {SUBMIT_TRIES}; a task is added once, whatever the tries)",
                        self.name,
                        tries + 1
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    tries += 1;
                }
                Err(e) => {
                    maybe_sent |= unanswered(&e) && !e.is_connection_refusal();
                    return if maybe_sent {
                        Ok(Submitted::Unknown(
                            self.unknown_submission(job.task, tries, &e),
                        ))
                    } else {
                        Err(self.fail("submit", e))
                    };
                }
            }
        }
    }

    /// The error of a submission that may have landed: a try went unanswered, and none
    /// after it (`tries` in all, the last answered `e`) was.
    fn unknown_submission(&self, task: TaskId, tries: u32, e: &redis::RedisError) -> Error {
        Error::Pool {
            message: format!(
                "`{}` at {}: submit: {tries} tries, none answered with the task added (the \
                 last: {e}); whether the pool got task {task} is unknown: if it did, a worker \
                 runs it and its parent is notified of it once",
                self.name, self.h.shown
            ),
        }
    }

    /// Cancels `task` and every descendant the pool ran for it, wherever they run: each is
    /// marked cancelled (a worker checks before it starts one, and with every lease renewal)
    /// and announced on the pool's channel (a running one stops at its next turn boundary or
    /// tool round). Its parent hears `killed`. Returns how many tasks were marked.
    pub async fn cancel(&self, task: &TaskId) -> Result<u64> {
        self.cancel_all(std::slice::from_ref(task)).await
    }

    /// The teammates team `team` has on record on this pool, by name: each one's task, and
    /// whether it is live (its inbox open and its job queued or running). A teammate that
    /// ended on its worker is taken off the record (it may show `live: false` a moment
    /// first). For a host whose
    /// lead is gone with its id and transcript — a new lead of another id does not take over
    /// its teammates — to find them and stop the live ones with [`cancel`](Self::cancel).
    pub async fn teammates(&self, team: &str) -> Result<Vec<PoolTeammate>> {
        use crate::team::TeamLink;
        let mut found = hosted::Link::new(self.clone()).members(team).await?;
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found
            .into_iter()
            .map(|(name, task, live)| PoolTeammate { name, task, live })
            .collect())
    }

    /// Cancels every task `parent` has on the pool that it was not told of yet, in one step
    /// (see [`cancel`](Self::cancel)). Returns how many tasks were marked, descendants
    /// included.
    pub async fn cancel_children(&self, parent: &TaskId) -> Result<u64> {
        let kids = self.outstanding(parent).await?;
        if kids.is_empty() {
            return Ok(0);
        }
        self.cancel_all(&kids).await
    }

    /// Cancels `tasks` and their descendants in one step (see [`cancel`](Self::cancel)).
    pub(crate) async fn cancel_all(&self, tasks: &[TaskId]) -> Result<u64> {
        self.cancel_as(tasks, &CancelReason::Plain).await
    }

    /// What `task`'s cancel key holds, read within a second (`None`: no cancel stored, or the
    /// store did not answer in time, which a worker takes as a plain cancel).
    pub(crate) async fn stored_cancel(&self, task: &TaskId) -> Option<String> {
        let read = async {
            let mut conn = self.conn().await.ok()?;
            redis::cmd("GET")
                .arg(self.task_key("cancel", task))
                .query_async::<Option<String>>(&mut conn)
                .await
                .ok()
                .flatten()
        };
        tokio::time::timeout(Duration::from_secs(1), read)
            .await
            .ok()
            .flatten()
    }

    /// Cancels `tasks` and their descendants in one step, storing `why` for the named tasks
    /// (their workers read it back to say why they stopped them).
    pub(crate) async fn cancel_as(&self, tasks: &[TaskId], why: &CancelReason) -> Result<u64> {
        let mut conn = self.conn().await?;
        let script = redis::Script::new(CANCEL);
        let mut call = script.key(self.key("jobs"));
        call.arg(self.base())
            .arg(CANCEL_TTL.as_millis().to_string())
            .arg(self.key("cancels"))
            .arg(why.stored());
        for t in tasks {
            call.arg(t.to_string());
        }
        call.invoke_async(&mut conn)
            .await
            .map_err(|e| self.fail("cancel", e))
    }

    /// The tasks submitted for `parent` whose notification is not acknowledged yet: running,
    /// queued, or reported and not yet recorded in the parent's conversation. A delivery
    /// acknowledges a notification a moment after the conversation records it, so a host
    /// asking "is anything left?" right after a run calls [`Delivery::flush`] first.
    pub async fn outstanding(&self, parent: &TaskId) -> Result<Vec<TaskId>> {
        let mut conn = self.conn().await?;
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.task_key("kids", parent))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("SMEMBERS", e))?;
        let mut out: Vec<TaskId> = ids.iter().filter_map(|s| s.parse().ok()).collect();
        out.sort();
        Ok(out)
    }

    /// Deletes what the pool keeps for `parent`, a parent the host gives up on for good (it
    /// will not be resumed): its notifications not delivered, its list of tasks, and its
    /// permission requests. Without this they stay in Redis with no expiry, one set per parent.
    ///
    /// Only once every task it had has reported (or been delivered): a task still queued or
    /// running would report into the deleted keys, making them again. Errors:
    /// [`Error::Refused`] naming those tasks (cancel them with [`Pool::cancel_children`] or
    /// [`Delivery::cancel_tasks`] and wait for their `killed` reports —
    /// [`NotificationQueue::pending`] on [`Pool::queue`] lists them — first; a task queued with
    /// no worker alive to take it holds the parent until one does), or [`Error::Pool`].
    ///
    /// [`NotificationQueue::pending`]: crate::task::queue::NotificationQueue::pending
    pub async fn abandon(&self, parent: &TaskId) -> Result<()> {
        use crate::task::queue::NotificationQueue;
        let mut reported: std::collections::HashSet<TaskId> = self
            .queue
            .pending(parent)
            .await
            .map_err(|e| Error::Pool {
                message: format!("`{}`: reading {parent}'s notifications: {e}", self.name),
            })?
            .into_iter()
            .map(|q| q.notification.task_id)
            .collect();
        // Delivered, and left on the parent's task list by a process that stopped between the
        // two (the queue's record of delivered ids is by task id).
        let mut conn = self.conn().await?;
        let delivered: Vec<String> = redis::cmd("ZRANGE")
            .arg(&self.queue.keys(parent)[2])
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("ZRANGE", e))?;
        reported.extend(delivered.iter().filter_map(|t| t.parse::<TaskId>().ok()));
        let running: Vec<String> = self
            .outstanding(parent)
            .await?
            .into_iter()
            .filter(|t| !reported.contains(t))
            .map(|t| t.to_string())
            .collect();
        if !running.is_empty() {
            return Err(Error::Refused(format!(
                "parent {parent} still has tasks queued or running on pool `{}`: {}; cancel them \
                 and wait for their reports before abandoning it",
                self.name,
                running.join(", ")
            )));
        }
        // Two commands: the queue's keys and the pool's are in different hash slots.
        redis::cmd("DEL")
            .arg(&self.queue.keys(parent)[..])
            .query_async::<i64>(&mut conn)
            .await
            .map_err(|e| self.fail("DEL", e))?;
        redis::cmd("DEL")
            .arg(self.task_key("kids", parent))
            .arg(self.task_key("asks", parent))
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fail("DEL", e))
    }

    /// Forgets tasks whose notifications `parent`'s conversation holds.
    async fn forget(&self, parent: &TaskId, tasks: &[String]) -> Result<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        redis::cmd("SREM")
            .arg(self.task_key("kids", parent))
            .arg(tasks)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fail("SREM", e))
    }

    /// Gives `text` to the running task `task` from `from`: its agent reads it at its next
    /// tool-round boundary, wherever it runs, as `<message from="…">text</message>` (escaped:
    /// the text cannot forge an envelope) ("Coordinator Mode: A Working Multi-Agent System,
    /// From the Source — SendMessage"). A message that arrives after the agent stopped reading
    /// is returned in its notification's note; once that note is written the task takes no
    /// more, and this is an error. The `SendMessage` tool of an agent with pool tasks routes
    /// here for them. Returns the letter's id.
    pub async fn send_message(&self, task: &TaskId, from: &TaskId, text: &str) -> Result<String> {
        self.mail
            .send_unless(
                &self.inbox(task)?,
                crate::mailbox::Letter::new(from.to_string(), text),
                &self.task_key("closed", task),
            )
            .await?
            .ok_or_else(|| Error::Task {
                id: *task,
                message: "it has ended and takes no more messages".to_owned(),
            })
    }

    /// Whether `task` ended on the pool and was reported (its inbox is closed).
    pub(crate) async fn is_closed(&self, task: &TaskId) -> Result<bool> {
        let mut conn = self.conn().await?;
        redis::cmd("EXISTS")
            .arg(self.task_key("closed", task))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("EXISTS", e))
    }

    /// Whether `task` is one of `parent`'s tasks not yet delivered.
    pub(crate) async fn has_outstanding(&self, parent: &TaskId, task: &TaskId) -> Result<bool> {
        let mut conn = self.conn().await?;
        redis::cmd("SISMEMBER")
            .arg(self.task_key("kids", parent))
            .arg(task.to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("SISMEMBER", e))
    }

    /// A task's inbox: the pool is its team (its keys share the pool's hash tag).
    fn inbox(&self, task: &TaskId) -> Result<crate::mailbox::Inbox> {
        crate::mailbox::Inbox::new(&self.name, task.to_string())
    }

    /// The jobs the pool gave up on, oldest first (at most `count`).
    pub async fn dead_letters(&self, count: usize) -> Result<Vec<DeadLetter>> {
        let mut conn = self.conn().await?;
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.key("dead"))
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("XRANGE", e))?;
        Ok(reply
            .ids
            .iter()
            .map(|e| DeadLetter {
                entry: e.get("entry").unwrap_or_default(),
                reason: e.get("reason").unwrap_or_default(),
                job: e.get("job").unwrap_or_default(),
            })
            .collect())
    }

    /// Jobs waiting in the stream or running (entries not yet acknowledged included).
    pub async fn backlog(&self) -> Result<u64> {
        let mut conn = self.conn().await?;
        redis::cmd("XLEN")
            .arg(self.key("jobs"))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("XLEN", e))
    }

    /// The notification queue's keys for `parent` (stream, ids, done), for scripts that
    /// report and acknowledge in one step.
    fn notify_keys(&self, parent: &TaskId) -> [String; 3] {
        self.queue.keys(parent)
    }
}

/// Records a pool task's move in the pool's registry, if it has one (logged, never fatal).
async fn record(
    pool: &Pool,
    task: &TaskId,
    to: crate::task::TaskState,
    usage: Option<forkhive_core::Usage>,
) {
    let Some(r) = &pool.registry else {
        return;
    };
    if let Some(u) = usage
        && let Err(e) = r.roll_up(task, u).await
    {
        tracing::warn!(task = %task, "rolling the pool task's usage up: {e}");
    }
    if let Err(e) = r.transition(task, to).await {
        tracing::debug!(task = %task, "recording the pool task as {to:?}: {e}");
    }
}

/// A notification as JSON, for the scripts.
fn notification_json(n: &TaskNotification) -> Result<String> {
    serde_json::to_string(n).map_err(|e| Error::Task {
        id: n.task_id,
        message: format!("the notification cannot be written as JSON: {e}"),
    })
}

/// The last `max` bytes of `text`, cut at a character boundary.
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut from = text.len() - max;
    while !text.is_char_boundary(from) {
        from += 1;
    }
    &text[from..]
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A timeout or a dropped connection leaves a submission's fate unknown (sent again); an
    /// answer the store gave is not. The last try's error names the task and says so.
    #[test]
    fn an_unanswered_submission_is_sent_again_and_its_last_error_says_it_is_unknown() {
        use std::io::{Error as Io, ErrorKind as K};
        for kind in [
            K::TimedOut,
            K::ConnectionReset,
            K::BrokenPipe,
            K::UnexpectedEof,
        ] {
            let e = redis::RedisError::from(Io::new(kind, "lost"));
            assert!(unanswered(&e), "{kind:?}");
        }
        let answered = redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the script answered something else",
        ));
        assert!(!unanswered(&answered));
        let pool = Pool::new("redis://127.0.0.1:1/", "t", "p", PoolConfig::default()).unwrap();
        let task: TaskId = "a01234567".parse().unwrap();
        let e = redis::RedisError::from(Io::new(K::TimedOut, "timed out"));
        assert_eq!(
            pool.unknown_submission(task, 3, &e).to_string(),
            format!(
                "pool `p` at redis://127.0.0.1:1/: submit: 3 tries, none answered with the task \
                 added (the last: timed out); whether the pool got task {task} is unknown: if \
                 it did, a worker runs it and its parent is notified of it once"
            )
        );
    }

    /// A cancel's reason reads back as it was stored; what an older pool stores (`1`), or
    /// anything this version does not know, is a plain cancel.
    #[test]
    fn a_cancel_reason_reads_back_and_anything_else_is_plain() {
        for why in [
            CancelReason::Plain,
            CancelReason::ShutdownGrace(Duration::ZERO),
            CancelReason::ShutdownGrace(Duration::from_millis(2_500)),
            CancelReason::ShutdownGrace(Duration::from_micros(500)),
            CancelReason::ShutdownGrace(Duration::from_secs(180)),
        ] {
            assert_eq!(CancelReason::read(&why.stored()), why, "{}", why.stored());
        }
        assert_eq!(CancelReason::Plain.stored(), "1");
        for other in [
            "",
            "1",
            "grace:",
            "grace:-1",
            "grace:+5",
            "grace:1.5",
            "grace:99999999999999999999",
            "x:1",
        ] {
            assert_eq!(CancelReason::read(other), CancelReason::Plain, "{other:?}");
        }
    }

    /// The cancel script stores the reason for the tasks it names and `1` for their
    /// descendants, keeping a descendant's own reason; the worker reads each back. Needs a
    /// Redis (`FORKHIVE_REDIS_URL`); says it was skipped without one.
    #[tokio::test]
    async fn a_cancel_stores_its_reason_for_the_named_tasks_only() {
        let Some(url) = crate::task::redis::test_redis_url() else {
            return;
        };
        let prefix = format!("cr{}", std::process::id());
        let pool = Pool::new(&url, &prefix, "p", PoolConfig::default()).unwrap();
        let id = |n| TaskId::from_entropy(forkhive_core::TaskKind::Agent, n);
        let (lead_kid, teammate, its_kid, other_kid) = (id(1), id(2), id(3), id(4));
        let mut conn = pool.conn().await.unwrap();
        for (parent, kid) in [
            (teammate, its_kid),
            (teammate, other_kid),
            (lead_kid, teammate),
        ] {
            redis::cmd("SADD")
                .arg(pool.task_key("kids", &parent))
                .arg(kid.to_string())
                .query_async::<i64>(&mut conn)
                .await
                .unwrap();
        }
        // One descendant was cancelled on its own, for its own reason, before.
        let grace = CancelReason::ShutdownGrace(Duration::from_secs(3));
        assert_eq!(pool.cancel_as(&[other_kid], &grace).await.unwrap(), 1);
        let two = CancelReason::ShutdownGrace(Duration::from_millis(2_000));
        assert_eq!(pool.cancel_as(&[teammate], &two).await.unwrap(), 3);
        let read = |t| {
            let pool = pool.clone();
            async move { pool.stored_cancel(&t).await }
        };
        assert_eq!(read(teammate).await.as_deref(), Some("grace:2000000000"));
        assert_eq!(read(its_kid).await.as_deref(), Some("1"));
        assert_eq!(read(other_kid).await.as_deref(), Some("grace:3000000000"));
        assert_eq!(read(lead_kid).await, None, "its parent is not cancelled");
        // A plain cancel of the parent names it with `1` and leaves the others as they are,
        // the teammate's grace among them: it is what her worker reads, also when the plain
        // cancel (her lead's ending) comes before the worker has read it.
        assert_eq!(pool.cancel_all(&[lead_kid]).await.unwrap(), 4);
        assert_eq!(read(lead_kid).await.as_deref(), Some("1"));
        assert_eq!(read(teammate).await.as_deref(), Some("grace:2000000000"));
        // Cancelled again, a mark lives its whole time again, keeping its value.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(pool.task_key("cancel", &teammate))
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(pool.cancel_all(&[teammate]).await.unwrap(), 3);
        assert_eq!(read(teammate).await.as_deref(), Some("grace:2000000000"));
        let left: i64 = redis::cmd("PTTL")
            .arg(pool.task_key("cancel", &teammate))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left > 10_000, "{left} ms left");
        // A grace replaces a plain cancel.
        assert_eq!(pool.cancel_as(&[its_kid], &two).await.unwrap(), 1);
        assert_eq!(read(its_kid).await.as_deref(), Some("grace:2000000000"));
        let _: i64 = redis::cmd("DEL")
            .arg(
                [lead_kid, teammate, its_kid, other_kid]
                    .iter()
                    .flat_map(|t| [pool.task_key("cancel", t), pool.task_key("kids", t)])
                    .collect::<Vec<_>>(),
            )
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    #[test]
    fn names_are_checked_and_passwords_never_show() {
        let e = Pool::new(
            "redis://u:hunter2@127.0.0.1:1",
            "fh",
            "a:b",
            PoolConfig::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid agent configuration: pool name `a:b`: use 1-64 letters, digits, `_` and `-`"
        );
        let p = Pool::new(
            "redis://u:hunter2@127.0.0.1:1",
            "fh",
            "p1",
            PoolConfig::default(),
        )
        .unwrap();
        let shown = format!("{p:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(p.key("jobs"), "fh:{p1}:jobs");
    }

    #[test]
    fn tails_cut_at_characters() {
        assert_eq!(tail("abc", 5), "abc");
        assert_eq!(tail("aéé", 3), "é");
        assert_eq!(tail("abcdef", 2), "ef");
    }

    #[test]
    fn config_setters_clamp() {
        let c = PoolConfig::default()
            .with_capacity(0)
            .with_lease(Duration::ZERO)
            .with_max_deliveries(0);
        assert_eq!(
            (c.capacity, c.lease, c.max_deliveries),
            (1, Duration::from_millis(300), 1)
        );
    }
}
