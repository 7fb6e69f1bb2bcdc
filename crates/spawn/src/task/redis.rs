//! The task registry in Redis (feature `redis`), shared by the hosts of one deployment.
//!
//! Every key is under `{<prefix>}` — one hash tag, so a Redis Cluster keeps the registry in
//! one slot and each script's keys together:
//! - `{p}:task:<id>`: the record (a hash), with its ancestors (computed once, at creation) and
//!   how many tasks below it have not ended;
//! - `{p}:usage:<id>`, `{p}:tree:<id>`: its own usage and its tree's (hashes of counters);
//! - `{p}:below:<id>`: the usage of everything below a task, registered or not (a root);
//! - `{p}:children:<id>`: its children's ids in creation order (a list);
//! - `{p}:live:<id>`: how many tasks below an id (registered or not) have not ended.
//!
//! Every change is one Lua script, so it is atomic: of many hosts racing to end a task,
//! exactly one succeeds — what makes a notification exactly-once — and of many racing to
//! revive it, exactly one.
//!
//! Ended records — and an unregistered root's keys — are kept for
//! [`Retention::max_age`](super::Retention) (default one hour) once nothing below them runs,
//! then Redis expires them; a revived task is kept again. A change retried after its answer
//! was lost carries the same token and is made once.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, Usage};
use redis::aio::ConnectionManager;

use super::registry::{Retention, TaskRecord, TaskRegistry, TaskState};
use crate::error::{Error, Result};

/// The usage counters, in the order the scripts take them.
const FIELDS: [&str; 7] = [
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "cache_read_tokens",
    "tool_uses",
    "duration_ms",
];

fn usage_values(u: &Usage) -> [u64; 7] {
    [
        u.input_tokens,
        u.output_tokens,
        u.cache_write_tokens,
        u.cache_write_1h_tokens,
        u.cache_read_tokens,
        u.tool_uses,
        u.duration_ms,
    ]
}

/// Shared by the scripts: key helpers; a task's ancestors; expiring what belongs to an id once
/// it has ended (or was never registered, a root) and nothing below it runs; keeping it again.
/// A script answers `!message` for a refusal, else its result. A change carries a token: the
/// same change retried after its answer was lost answers as the first did, and is not made
/// twice.
const PRELUDE: &str = r"
local p = ARGV[1]
local function k(kind, id) return p .. ':' .. kind .. ':' .. id end
local kinds = { 'task', 'usage', 'tree', 'below', 'children', 'live' }
local function split(s)
  local out = {}
  for w in string.gmatch(s or '', '%S+') do out[#out + 1] = w end
  return out
end
local terminal = { completed = true, failed = true, killed = true }
local function settle(id, ttl)
  if ttl <= 0 then return end
  local state = redis.call('HGET', k('task', id), 'state')
  if state and not terminal[state] then return end
  if tonumber(redis.call('GET', k('live', id)) or '0') > 0 then return end
  for _, kind in ipairs(kinds) do redis.call('PEXPIRE', k(kind, id), ttl) end
end
local function keep(id)
  for _, kind in ipairs(kinds) do redis.call('PERSIST', k(kind, id)) end
end
local function repeated(t, token)
  if redis.call('HGET', t, 'last_token') == token then
    return redis.call('HGET', t, 'last_from') or 'ok'
  end
  return nil
end
";

/// ARGV: prefix, id, parent, state, description, agent_type, transcript, output, stalled,
/// ttl, then seven own-usage and seven tree-usage counters.
const CREATE: &str = r"
local id, parent, state, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[10])
local t = k('task', id)
if redis.call('EXISTS', t) == 1 then return '!a task with this id already exists' end
-- Its ancestors, nearest first: registered ones, then the first unregistered one (a root);
-- a cycle ends the walk at its first repeat.
local ancestors, seen, a = {}, { [id] = true }, parent
while not seen[a] do
  seen[a] = true
  ancestors[#ancestors + 1] = a
  local up = redis.call('HGET', k('task', a), 'parent')
  if not up then break end
  a = up
end
redis.call('HSET', t, 'parent', parent, 'state', state, 'description', ARGV[5],
  'agent_type', ARGV[6], 'transcript', ARGV[7], 'output', ARGV[8], 'stalled', ARGV[9],
  'ancestors', table.concat(ancestors, ' '))
local fields = { 'input_tokens', 'output_tokens', 'cache_write_tokens',
  'cache_write_1h_tokens', 'cache_read_tokens', 'tool_uses', 'duration_ms' }
for i, f in ipairs(fields) do
  if ARGV[10 + i] ~= '0' then redis.call('HSET', k('usage', id), f, ARGV[10 + i]) end
  if ARGV[17 + i] ~= '0' then redis.call('HSET', k('tree', id), f, ARGV[17 + i]) end
end
if not terminal[state] then
  for _, anc in ipairs(ancestors) do
    redis.call('INCR', k('live', anc))
    keep(anc)
  end
end
redis.call('RPUSH', k('children', parent), id)
settle(id, ttl)
settle(parent, ttl)
return 'ok'
";

/// ARGV: prefix, id, to, ttl (ms), token.
const TRANSITION: &str = r"
local id, to, ttl, token = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local t = k('task', id)
local from = redis.call('HGET', t, 'state')
if not from then return '!no such task' end
local again = repeated(t, token)
if again then return again end
local allowed = (from == 'created' and to == 'running') or
  ((from == 'created' or from == 'running') and terminal[to])
if not allowed then return '!cannot move from ' .. from .. ' to ' .. to end
redis.call('HSET', t, 'state', to, 'last_token', token, 'last_from', from)
if terminal[to] then
  for _, anc in ipairs(split(redis.call('HGET', t, 'ancestors'))) do
    if tonumber(redis.call('DECR', k('live', anc))) < 0 then
      redis.call('SET', k('live', anc), '0')
    end
    settle(anc, ttl)
  end
  settle(id, ttl)
end
return from
";

/// ARGV: prefix, id, token.
const REOPEN: &str = r"
local id, token = ARGV[2], ARGV[3]
local t = k('task', id)
local from = redis.call('HGET', t, 'state')
if not from then return '!no such task' end
local again = repeated(t, token)
if again then return again end
if not terminal[from] then
  return '!cannot reopen a task that is ' .. from .. ': only an ended task can'
end
redis.call('HSET', t, 'state', 'running', 'stalled', '0', 'last_token', token, 'last_from', from)
keep(id)
for _, anc in ipairs(split(redis.call('HGET', t, 'ancestors'))) do
  redis.call('INCR', k('live', anc))
  keep(anc)
end
return from
";

/// ARGV: prefix, id, ttl, token, then the seven counters (as decimal strings).
const ROLL_UP: &str = r"
local id, ttl, token = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local t = k('task', id)
if redis.call('EXISTS', t) == 0 then return '!no such task' end
if redis.call('HGET', t, 'last_roll') == token then return 'ok' end
redis.call('HSET', t, 'last_roll', token)
local fields = { 'input_tokens', 'output_tokens', 'cache_write_tokens',
  'cache_write_1h_tokens', 'cache_read_tokens', 'tool_uses', 'duration_ms' }
local function add(key)
  for i, f in ipairs(fields) do
    if ARGV[4 + i] ~= '0' then redis.call('HINCRBY', key, f, ARGV[4 + i]) end
  end
end
add(k('usage', id))
add(k('tree', id))
local ancestors = split(redis.call('HGET', t, 'ancestors'))
for _, anc in ipairs(ancestors) do
  add(k('below', anc))
  if redis.call('EXISTS', k('task', anc)) == 1 then add(k('tree', anc)) end
end
-- Keys made here expire with the rest of their id.
settle(id, ttl)
for _, anc in ipairs(ancestors) do settle(anc, ttl) end
return 'ok'
";

/// ARGV: prefix, id.
const MARK_STALLED: &str = r"
local t = k('task', ARGV[2])
if redis.call('EXISTS', t) == 0 then return '!no such task' end
redis.call('HSET', t, 'stalled', '1')
return 'ok'
";

/// A change's token: a retry of the same change carries the same one.
fn token() -> String {
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b[..12].copy_from_slice(&nanos.to_le_bytes()[..12]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether an error left the outcome unknown (the change may have been made): a retry with
/// the same token settles it.
fn transient(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The task registry in Redis. Clones share one connection (multiplexed, reconnecting).
#[derive(Clone)]
pub struct RedisTaskRegistry {
    h: crate::mailbox::RedisHandle,
    prefix: String,
    retention: Retention,
}

impl fmt::Debug for RedisTaskRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTaskRegistry")
            .field("url", &self.h.shown)
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .finish()
    }
}

impl RedisTaskRegistry {
    /// The registry at `url` under `prefix` (1 to 64 of `[A-Za-z0-9_-]`), keeping ended
    /// records for [`Retention::max_age`] (its count limit is not applied: Redis expires by
    /// age). Nothing connects until first use; the URL's password never shows.
    pub fn new(url: &str, prefix: &str) -> Result<Self> {
        crate::mailbox::check_name("key prefix", prefix).map_err(|_| {
            Error::Config(format!(
                "task registry prefix `{prefix}`: use 1-64 letters, digits, `_` and `-`"
            ))
        })?;
        let h = crate::mailbox::RedisHandle::open(url).map_err(|why| {
            Error::Config(format!(
                "task registry at {}: {why}",
                crate::mailbox::redact_url(url)
            ))
        })?;
        Ok(Self {
            h,
            prefix: format!("{{{prefix}}}"),
            retention: Retention::default(),
        })
    }

    /// The same, keeping ended records as `retention` says (by age).
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// A handle on the same store with a connection of its own (another host's).
    pub fn reopen_handle(&self) -> Self {
        Self {
            h: self.h.fresh(),
            ..self.clone()
        }
    }

    fn key(&self, kind: &str, id: &TaskId) -> String {
        format!("{}:{kind}:{id}", self.prefix)
    }

    fn fail(&self, id: &TaskId, what: &str, e: redis::RedisError) -> Error {
        Error::Task {
            id: *id,
            message: format!("task registry at {}: {what}: {e}", self.h.shown),
        }
    }

    async fn conn(&self, id: &TaskId) -> Result<ConnectionManager> {
        self.h
            .connect(|e| self.fail(id, "could not connect", e))
            .await
    }

    /// Runs one script; `!message` is a refusal ([`Error::Task`]). An error that leaves the
    /// outcome unknown (a lost answer, a dropped connection) is retried with the same
    /// arguments — their token makes the retry answer as the first attempt did.
    async fn script(&self, id: &TaskId, body: &str, args: &[String]) -> Result<String> {
        let script = redis::Script::new(&format!("{PRELUDE}\n{body}"));
        let mut attempt = 0u32;
        let out: String = loop {
            attempt += 1;
            let mut conn = self.conn(id).await?;
            let mut call = script.prepare_invoke();
            call.key(self.key("task", id)).arg(&self.prefix);
            for a in args {
                call.arg(a);
            }
            match call.invoke_async(&mut conn).await {
                Ok(out) => break out,
                Err(e) if transient(&e) && attempt < 4 => {
                    tracing::warn!(task = %id, "task registry at {}: {e}; retrying", self.h.shown);
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
                Err(e) => return Err(self.fail(id, "script", e)),
            }
        };
        match out.strip_prefix('!') {
            Some(refusal) => Err(Error::Task {
                id: *id,
                message: refusal.to_owned(),
            }),
            None => Ok(out),
        }
    }

    fn ttl_ms(&self) -> String {
        self.retention
            .max_age
            .map_or(0, |a| {
                u64::try_from(a.as_millis()).unwrap_or(u64::MAX).max(1)
            })
            .to_string()
    }

    /// One task, read in one atomic round trip (its record and both usages agree).
    async fn record(
        &self,
        conn: &mut ConnectionManager,
        id: &TaskId,
    ) -> redis::RedisResult<Option<TaskRecord>> {
        type Reply = (
            std::collections::HashMap<String, String>,
            Vec<Option<u64>>,
            Vec<Option<u64>>,
        );
        let (fields, own, tree): Reply = redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(self.key("task", id))
            .cmd("HMGET")
            .arg(self.key("usage", id))
            .arg(&FIELDS)
            .cmd("HMGET")
            .arg(self.key("tree", id))
            .arg(&FIELDS)
            .query_async(conn)
            .await?;
        let Some(state) = fields.get("state").and_then(|s| parse_state(s)) else {
            return Ok(None);
        };
        let Some(parent) = fields.get("parent").and_then(|p| p.parse::<TaskId>().ok()) else {
            return Ok(None);
        };
        let text = |k: &str| fields.get(k).cloned().unwrap_or_default();
        let path = |k: &str| fields.get(k).filter(|s| !s.is_empty()).map(PathBuf::from);
        Ok(Some(TaskRecord {
            id: *id,
            parent,
            description: text("description"),
            agent_type: text("agent_type"),
            state,
            usage: usage_of(&own),
            tree_usage: usage_of(&tree),
            transcript: path("transcript"),
            output: path("output"),
            stalled: fields.get("stalled").is_some_and(|s| s == "1"),
        }))
    }
}

fn usage_of(values: &[Option<u64>]) -> Usage {
    let v = |i: usize| values.get(i).copied().flatten().unwrap_or(0);
    Usage {
        input_tokens: v(0),
        output_tokens: v(1),
        cache_write_tokens: v(2),
        cache_write_1h_tokens: v(3),
        cache_read_tokens: v(4),
        tool_uses: v(5),
        duration_ms: v(6),
    }
}

fn parse_state(s: &str) -> Option<TaskState> {
    Some(match s {
        "created" => TaskState::Created,
        "running" => TaskState::Running,
        "completed" => TaskState::Completed,
        "failed" => TaskState::Failed,
        "killed" => TaskState::Killed,
        _ => return None,
    })
}

fn state_name(s: TaskState) -> String {
    s.to_string()
}

fn refused_state(id: &TaskId, from: &str) -> Error {
    Error::Task {
        id: *id,
        message: format!("the registry answered an unknown state `{from}`"),
    }
}

#[async_trait]
impl TaskRegistry for RedisTaskRegistry {
    async fn create(&self, record: TaskRecord) -> Result<()> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let mut args = vec![
            record.id.to_string(),
            record.parent.to_string(),
            state_name(record.state),
            record.description.clone(),
            record.agent_type.clone(),
            path(&record.transcript),
            path(&record.output),
            if record.stalled { "1" } else { "0" }.to_owned(),
            self.ttl_ms(),
        ];
        args.extend(usage_values(&record.usage).iter().map(u64::to_string));
        args.extend(usage_values(&record.tree_usage).iter().map(u64::to_string));
        match self.script(&record.id, CREATE, &args).await {
            Ok(_) => Ok(()),
            // A retry after a lost answer finds its own record: made once.
            Err(Error::Task { message, .. })
                if message == "a task with this id already exists"
                    && self.get(&record.id).await.as_ref() == Some(&record) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn transition(&self, id: &TaskId, to: TaskState) -> Result<TaskState> {
        let args = [id.to_string(), state_name(to), self.ttl_ms(), token()];
        let from = self.script(id, TRANSITION, &args).await?;
        parse_state(&from).ok_or_else(|| refused_state(id, &from))
    }

    async fn reopen(&self, id: &TaskId) -> Result<TaskState> {
        let from = self.script(id, REOPEN, &[id.to_string(), token()]).await?;
        parse_state(&from).ok_or_else(|| refused_state(id, &from))
    }

    async fn roll_up(&self, id: &TaskId, usage: Usage) -> Result<()> {
        let mut args = vec![id.to_string(), self.ttl_ms(), token()];
        args.extend(usage_values(&usage).iter().map(u64::to_string));
        self.script(id, ROLL_UP, &args).await.map(|_| ())
    }

    async fn mark_stalled(&self, id: &TaskId) -> Result<()> {
        self.script(id, MARK_STALLED, &[id.to_string()])
            .await
            .map(|_| ())
    }

    async fn get(&self, id: &TaskId) -> Option<TaskRecord> {
        let mut conn = match self.conn(id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(task = %id, "{e}");
                return None;
            }
        };
        match self.record(&mut conn, id).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(task = %id, "task registry at {}: {e}", self.h.shown);
                None
            }
        }
    }

    async fn children(&self, parent: &TaskId) -> Vec<TaskRecord> {
        let mut conn = match self.conn(parent).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(task = %parent, "{e}");
                return Vec::new();
            }
        };
        let ids: Vec<String> = match redis::cmd("LRANGE")
            .arg(self.key("children", parent))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
        {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(task = %parent, "task registry at {}: {e}", self.h.shown);
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(ids.len());
        // A task made again after its record expired (a resume) is listed again: once, at
        // its first place.
        let mut listed = std::collections::HashSet::with_capacity(ids.len());
        for id in ids
            .iter()
            .filter_map(|i| i.parse::<TaskId>().ok())
            .filter(|id| listed.insert(*id))
        {
            // A child whose record expired is gone (see the retention).
            match self.record(&mut conn, &id).await {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) => tracing::warn!(task = %id, "task registry at {}: {e}", self.h.shown),
            }
        }
        out
    }

    async fn descendants_usage(&self, id: &TaskId) -> Usage {
        let mut conn = match self.conn(id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(task = %id, "{e}");
                return Usage::default();
            }
        };
        let got: redis::RedisResult<Vec<Option<u64>>> = redis::cmd("HMGET")
            .arg(self.key("below", id))
            .arg(&FIELDS)
            .query_async(&mut conn)
            .await;
        match got {
            Ok(values) => usage_of(&values),
            Err(e) => {
                tracing::warn!(task = %id, "task registry at {}: {e}", self.h.shown);
                Usage::default()
            }
        }
    }
}

/// The Redis the crate's own unit tests use (`FORKHIVE_REDIS_URL`); `None`, said on stderr,
/// when there is none — which fails under `CI=true`, where `.ci/run` starts one.
#[cfg(test)]
pub(crate) fn test_redis_url() -> Option<String> {
    let Ok(url) = std::env::var("FORKHIVE_REDIS_URL") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but FORKHIVE_REDIS_URL is not set: scripts/redis-server.sh start"
        );
        eprintln!("skipped: no FORKHIVE_REDIS_URL (run scripts/redis-server.sh start)");
        return None;
    };
    Some(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkhive_core::TaskKind;

    /// A change retried with its token (its answer lost) answers as the first attempt did and
    /// is made once. Needs a Redis (`FORKHIVE_REDIS_URL`); says it was skipped without one.
    #[tokio::test]
    async fn a_retried_change_is_made_once() {
        let Some(url) = test_redis_url() else { return };
        let Ok(r) = RedisTaskRegistry::new(&url, &format!("retry{}", std::process::id())) else {
            panic!("registry")
        };
        let id = TaskId::from_entropy(TaskKind::Agent, u64::from(std::process::id()) << 20);
        let parent = TaskId::from_entropy(TaskKind::Agent, 7);
        assert!(r.create(TaskRecord::new(id, parent, "t")).await.is_ok());
        let end = [
            id.to_string(),
            "completed".to_owned(),
            r.ttl_ms(),
            "tok-1".to_owned(),
        ];
        let first = r
            .script(&id, TRANSITION, &end)
            .await
            .map_err(|e| e.to_string());
        let again = r
            .script(&id, TRANSITION, &end)
            .await
            .map_err(|e| e.to_string());
        assert_eq!(first.as_deref(), Ok("created"));
        assert_eq!(
            again.as_deref(),
            Ok("created"),
            "the retry answers as the first did"
        );
        let other = [
            id.to_string(),
            "killed".to_owned(),
            r.ttl_ms(),
            "tok-2".to_owned(),
        ];
        let late = r
            .script(&id, TRANSITION, &other)
            .await
            .map_err(|e| e.to_string());
        assert_eq!(
            late.err().as_deref(),
            Some(format!("task {id}: cannot move from completed to killed").as_str())
        );
        let mut roll = vec![id.to_string(), r.ttl_ms(), "roll-1".to_owned()];
        roll.extend(["0", "5", "0", "0", "0", "0", "0"].map(str::to_owned));
        for _ in 0..2 {
            assert!(r.script(&id, ROLL_UP, &roll).await.is_ok());
        }
        let usage = r.get(&id).await.map(|t| t.usage.output_tokens);
        assert_eq!(usage, Some(5), "a retried roll-up adds once");
    }
}
