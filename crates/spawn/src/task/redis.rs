//! The task registry in Redis (feature `redis`), shared by the hosts of one deployment.
//!
//! Every key is under `{<prefix>}` — one hash tag, so a Redis Cluster keeps the registry in
//! one slot and each script's keys together:
//! - `{p}:task:<id>`: the record (a hash), with its ancestors (computed once, at creation) and
//!   how many tasks below it have not ended;
//! - `{p}:usage:<id>`, `{p}:tree:<id>`: its own usage and its tree's (hashes of counters);
//! - `{p}:below:<id>`: the usage of everything below a task, registered or not (a root);
//! - `{p}:children:<id>`: its children's ids in creation order (a list).
//!
//! Every change is one Lua script, so it is atomic: of many hosts racing to end a task,
//! exactly one succeeds — what makes a notification exactly-once — and of many racing to
//! revive it, exactly one.
//!
//! Ended records are kept for [`Retention::max_age`](super::Retention) (default one hour)
//! once nothing below them runs, then Redis expires them; a revived task is kept again.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, Usage};
use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

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

/// Shared by the scripts: the key helpers, and expiring an ended record once nothing below it
/// runs. A script answers `!message` for a refusal, else its result.
const PRELUDE: &str = r"
local p = ARGV[1]
local function k(kind, id) return p .. ':' .. kind .. ':' .. id end
local function split(s)
  local out = {}
  for w in string.gmatch(s or '', '%S+') do out[#out + 1] = w end
  return out
end
local terminal = { completed = true, failed = true, killed = true }
local function settle(id, ttl)
  local t = k('task', id)
  if terminal[redis.call('HGET', t, 'state')] and tonumber(redis.call('HGET', t, 'live_below') or '0') <= 0 then
    if ttl > 0 then
      for _, kind in ipairs({ 'task', 'usage', 'tree', 'below', 'children' }) do
        redis.call('PEXPIRE', k(kind, id), ttl)
      end
    end
  end
end
local function keep(id)
  for _, kind in ipairs({ 'task', 'usage', 'tree', 'below', 'children' }) do
    redis.call('PERSIST', k(kind, id))
  end
end
";

/// ARGV: prefix, id, parent, state, description, agent_type, transcript, output.
const CREATE: &str = r"
local id, parent, state = ARGV[2], ARGV[3], ARGV[4]
local t = k('task', id)
if redis.call('EXISTS', t) == 1 then return '!a task with this id already exists' end
-- Its ancestors, nearest first: registered ones, then the first unregistered one (a root).
local ancestors, a = {}, parent
for _ = 0, 100000 do
  if a == id then break end
  ancestors[#ancestors + 1] = a
  local up = redis.call('HGET', k('task', a), 'parent')
  if not up then break end
  a = up
  if #ancestors > 1 and a == ancestors[1] then break end
end
redis.call('HSET', t, 'parent', parent, 'state', state, 'description', ARGV[5],
  'agent_type', ARGV[6], 'transcript', ARGV[7], 'output', ARGV[8], 'stalled', '0',
  'live_below', '0', 'ancestors', table.concat(ancestors, ' '))
if not terminal[state] then
  for _, anc in ipairs(ancestors) do
    if redis.call('EXISTS', k('task', anc)) == 1 then
      redis.call('HINCRBY', k('task', anc), 'live_below', 1)
      keep(anc)
    end
  end
end
redis.call('RPUSH', k('children', parent), id)
return 'ok'
";

/// ARGV: prefix, id, to, ttl (ms).
const TRANSITION: &str = r"
local id, to, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
local t = k('task', id)
local from = redis.call('HGET', t, 'state')
if not from then return '!no such task' end
local allowed = (from == 'created' and to == 'running') or
  ((from == 'created' or from == 'running') and terminal[to])
if not allowed then return '!cannot move from ' .. from .. ' to ' .. to end
redis.call('HSET', t, 'state', to)
if terminal[to] then
  for _, anc in ipairs(split(redis.call('HGET', t, 'ancestors'))) do
    local at = k('task', anc)
    if redis.call('EXISTS', at) == 1 then
      if tonumber(redis.call('HINCRBY', at, 'live_below', -1)) < 0 then
        redis.call('HSET', at, 'live_below', '0')
      end
      settle(anc, ttl)
    end
  end
  settle(id, ttl)
end
return from
";

/// ARGV: prefix, id.
const REOPEN: &str = r"
local id = ARGV[2]
local t = k('task', id)
local from = redis.call('HGET', t, 'state')
if not from then return '!no such task' end
if not terminal[from] then
  return '!cannot reopen a task that is ' .. from .. ': only an ended task can'
end
redis.call('HSET', t, 'state', 'running', 'stalled', '0')
keep(id)
for _, anc in ipairs(split(redis.call('HGET', t, 'ancestors'))) do
  if redis.call('EXISTS', k('task', anc)) == 1 then
    redis.call('HINCRBY', k('task', anc), 'live_below', 1)
    keep(anc)
  end
end
return from
";

/// ARGV: prefix, id, then the seven counters.
const ROLL_UP: &str = r"
local id = ARGV[2]
local t = k('task', id)
if redis.call('EXISTS', t) == 0 then return '!no such task' end
local fields = { 'input_tokens', 'output_tokens', 'cache_write_tokens',
  'cache_write_1h_tokens', 'cache_read_tokens', 'tool_uses', 'duration_ms' }
local function add(key)
  for i, f in ipairs(fields) do
    local n = tonumber(ARGV[2 + i])
    if n ~= 0 then redis.call('HINCRBY', key, f, n) end
  end
end
add(k('usage', id))
add(k('tree', id))
for _, anc in ipairs(split(redis.call('HGET', t, 'ancestors'))) do
  add(k('below', anc))
  if redis.call('EXISTS', k('task', anc)) == 1 then add(k('tree', anc)) end
end
return 'ok'
";

/// ARGV: prefix, id.
const MARK_STALLED: &str = r"
local t = k('task', ARGV[2])
if redis.call('EXISTS', t) == 0 then return '!no such task' end
redis.call('HSET', t, 'stalled', '1')
return 'ok'
";

/// The task registry in Redis. Clones share one connection (multiplexed, reconnecting).
#[derive(Clone)]
pub struct RedisTaskRegistry {
    client: redis::Client,
    prefix: String,
    retention: Retention,
    conn: std::sync::Arc<OnceCell<ConnectionManager>>,
    shown: String,
}

impl fmt::Debug for RedisTaskRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTaskRegistry")
            .field("url", &self.shown)
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
        let shown = crate::mailbox::redact_url(url);
        crate::mailbox::check_name("key prefix", prefix)?;
        let client = redis::Client::open(url).map_err(|e| {
            Error::Config(format!(
                "task registry at {shown}: not a Redis URL ({:?})",
                e.kind()
            ))
        })?;
        Ok(Self {
            client,
            prefix: format!("{{{prefix}}}"),
            retention: Retention::default(),
            conn: Default::default(),
            shown,
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
            conn: Default::default(),
            ..self.clone()
        }
    }

    fn key(&self, kind: &str, id: &TaskId) -> String {
        format!("{}:{kind}:{id}", self.prefix)
    }

    fn fail(&self, id: &TaskId, what: &str, e: redis::RedisError) -> Error {
        Error::Task {
            id: *id,
            message: format!("task registry at {}: {what}: {e}", self.shown),
        }
    }

    async fn conn(&self, id: &TaskId) -> Result<ConnectionManager> {
        self.conn
            .get_or_try_init(|| async {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500))
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    .set_response_timeout(Some(Duration::from_secs(10)));
                ConnectionManager::new_with_config(self.client.clone(), config)
                    .await
                    .map_err(|e| self.fail(id, "could not connect", e))
            })
            .await
            .cloned()
    }

    /// Runs one script; `!message` is a refusal ([`Error::Task`]).
    async fn script(&self, id: &TaskId, body: &str, args: &[String]) -> Result<String> {
        let mut conn = self.conn(id).await?;
        let script = redis::Script::new(&format!("{PRELUDE}\n{body}"));
        let mut call = script.prepare_invoke();
        call.key(self.key("task", id)).arg(&self.prefix);
        for a in args {
            call.arg(a);
        }
        let out: String = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.fail(id, "script", e))?;
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

    async fn usage(&self, conn: &mut ConnectionManager, key: &str) -> redis::RedisResult<Usage> {
        let values: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(key)
            .arg(&FIELDS)
            .query_async(conn)
            .await?;
        let v = |i: usize| values.get(i).copied().flatten().unwrap_or(0);
        Ok(Usage {
            input_tokens: v(0),
            output_tokens: v(1),
            cache_write_tokens: v(2),
            cache_write_1h_tokens: v(3),
            cache_read_tokens: v(4),
            tool_uses: v(5),
            duration_ms: v(6),
        })
    }

    async fn record(
        &self,
        conn: &mut ConnectionManager,
        id: &TaskId,
    ) -> redis::RedisResult<Option<TaskRecord>> {
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.key("task", id))
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
            usage: self.usage(conn, &self.key("usage", id)).await?,
            tree_usage: self.usage(conn, &self.key("tree", id)).await?,
            transcript: path("transcript"),
            output: path("output"),
            stalled: fields.get("stalled").is_some_and(|s| s == "1"),
        }))
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
        self.script(
            &record.id,
            CREATE,
            &[
                record.id.to_string(),
                record.parent.to_string(),
                state_name(record.state),
                record.description.clone(),
                record.agent_type.clone(),
                path(&record.transcript),
                path(&record.output),
            ],
        )
        .await?;
        // A record created with usage (a replay) keeps it.
        if record.usage != Usage::default() || record.tree_usage != Usage::default() {
            let mut conn = self.conn(&record.id).await?;
            for (key, u) in [("usage", record.usage), ("tree", record.tree_usage)] {
                let mut cmd = redis::cmd("HSET");
                cmd.arg(self.key(key, &record.id));
                for (f, v) in FIELDS.iter().zip(usage_values(&u)) {
                    cmd.arg(*f).arg(v);
                }
                let _: () = cmd
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.fail(&record.id, "HSET", e))?;
            }
        }
        if record.stalled {
            self.mark_stalled(&record.id).await?;
        }
        Ok(())
    }

    async fn transition(&self, id: &TaskId, to: TaskState) -> Result<TaskState> {
        let from = self
            .script(
                id,
                TRANSITION,
                &[id.to_string(), state_name(to), self.ttl_ms()],
            )
            .await?;
        parse_state(&from).ok_or_else(|| refused_state(id, &from))
    }

    async fn reopen(&self, id: &TaskId) -> Result<TaskState> {
        let from = self.script(id, REOPEN, &[id.to_string()]).await?;
        parse_state(&from).ok_or_else(|| refused_state(id, &from))
    }

    async fn roll_up(&self, id: &TaskId, usage: Usage) -> Result<()> {
        let mut args = vec![id.to_string()];
        args.extend(usage_values(&usage).iter().map(u64::to_string));
        self.script(id, ROLL_UP, &args).await.map(|_| ())
    }

    async fn mark_stalled(&self, id: &TaskId) -> Result<()> {
        self.script(id, MARK_STALLED, &[id.to_string()])
            .await
            .map(|_| ())
    }

    async fn get(&self, id: &TaskId) -> Option<TaskRecord> {
        let mut conn = self.conn(id).await.ok()?;
        match self.record(&mut conn, id).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(task = %id, "task registry at {}: {e}", self.shown);
                None
            }
        }
    }

    async fn children(&self, parent: &TaskId) -> Vec<TaskRecord> {
        let Ok(mut conn) = self.conn(parent).await else {
            return Vec::new();
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
                tracing::warn!(task = %parent, "task registry at {}: {e}", self.shown);
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(ids.len());
        for id in ids.iter().filter_map(|i| i.parse::<TaskId>().ok()) {
            // A child whose record expired is gone (see the retention).
            if let Ok(Some(r)) = self.record(&mut conn, &id).await {
                out.push(r);
            }
        }
        out
    }

    async fn descendants_usage(&self, id: &TaskId) -> Usage {
        let Ok(mut conn) = self.conn(id).await else {
            return Usage::default();
        };
        self.usage(&mut conn, &self.key("below", id))
            .await
            .unwrap_or_default()
    }
}
