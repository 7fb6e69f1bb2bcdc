//! A parent's notification queue in Redis (feature `redis`): one stream per parent.
//!
//! - `<prefix>:{<parent>}:notify`: the pending notifications (fields `id` and `n`, the
//!   notification as JSON); `<prefix>:{<parent>}:ids`: each pending id's stream entry;
//!   `<prefix>:{<parent>}:done`: delivered ids by when (a sorted set, trimmed to
//!   [`DELIVERED_KEPT`] and [`DELIVERED_TTL`]). The parent is the keys' hash tag.
//! - `push` is one Lua script: refused when the id is pending or delivered, else `XADD`.
//! - `delivered` is one Lua script: `XDEL`, and the id recorded as delivered, together — so a
//!   parent that restarts after recording finds it neither pending nor pushable again.
//! - A waiting parent blocks in `XREAD` on a connection of its own (see the Redis mailbox).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, TaskNotification};
use redis::aio::ConnectionManager;

use super::queue::{DELIVERED_KEPT, DELIVERED_TTL, NotificationQueue, Queued};
use crate::error::{Error, Result};

/// KEYS: stream, ids, done. ARGV: id, notification JSON.
const PUSH: &str = r"
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
local entry = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'n', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], entry)
return 1
";

/// KEYS: stream, ids, done. ARGV: now (ms), kept for (ms), most kept, then ids.
const DELIVERED: &str = r"
local now, ttl, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4, #ARGV do
  local entry = redis.call('HGET', KEYS[2], ARGV[i])
  if entry then
    redis.call('XDEL', KEYS[1], entry)
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('ZADD', KEYS[3], now, ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ttl)
local n = redis.call('ZCARD', KEYS[3])
if n > most then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, n - most - 1) end
if n > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return 1
";

/// Parents' notification queues in Redis streams. Clones share one connection.
#[derive(Clone)]
pub struct RedisNotificationQueue {
    h: crate::mailbox::RedisHandle,
    prefix: String,
}

impl fmt::Debug for RedisNotificationQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisNotificationQueue")
            .field("url", &self.h.shown)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisNotificationQueue {
    /// The queues at `url` under `prefix` (1 to 64 of `[A-Za-z0-9_-]`). Nothing connects
    /// until first use; the URL's password never shows.
    pub fn new(url: &str, prefix: &str) -> Result<Self> {
        crate::mailbox::check_name("key prefix", prefix).map_err(|_| {
            Error::Config(format!(
                "notification queue prefix `{prefix}`: use 1-64 letters, digits, `_` and `-`"
            ))
        })?;
        let h = crate::mailbox::RedisHandle::open(url).map_err(|why| {
            Error::Config(format!(
                "notification queue at {}: {why}",
                crate::mailbox::redact_url(url)
            ))
        })?;
        Ok(Self {
            h,
            prefix: prefix.to_owned(),
        })
    }

    /// A handle on the same store with connections of its own (another host's).
    pub fn reopen(&self) -> Self {
        Self {
            h: self.h.fresh(),
            ..self.clone()
        }
    }

    pub(crate) fn keys(&self, parent: &TaskId) -> [String; 3] {
        let p = &self.prefix;
        [
            format!("{p}:{{{parent}}}:notify"),
            format!("{p}:{{{parent}}}:ids"),
            format!("{p}:{{{parent}}}:done"),
        ]
    }

    fn fail(&self, parent: &TaskId, what: &str, e: redis::RedisError) -> Error {
        Error::Task {
            id: *parent,
            message: format!("notification queue at {}: {what}: {e}", self.h.shown),
        }
    }

    async fn conn(&self, parent: &TaskId) -> Result<ConnectionManager> {
        self.h
            .connect(|e| self.fail(parent, "could not connect", e))
            .await
    }

    /// The stream's last entry id and its pending notifications.
    async fn read(&self, parent: &TaskId) -> Result<(String, Vec<Queued>)> {
        let [stream, _, _] = self.keys(parent);
        let mut conn = self.conn(parent).await?;
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail(parent, "XRANGE", e))?;
        let last = reply
            .ids
            .last()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        let mut out = Vec::with_capacity(reply.ids.len());
        for e in &reply.ids {
            let (Some(id), Some(json)) = (e.get::<String>("id"), e.get::<String>("n")) else {
                continue;
            };
            match serde_json::from_str::<TaskNotification>(&json) {
                Ok(notification) => out.push(Queued { id, notification }),
                // Written by something else: reported, not delivered as garbage.
                Err(err) => tracing::warn!(
                    parent = %parent,
                    "notification queue: entry {} is not a notification ({err}); skipped",
                    e.id
                ),
            }
        }
        Ok((last, out))
    }
}

fn now_ms() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
        .to_string()
}

#[async_trait]
impl NotificationQueue for RedisNotificationQueue {
    async fn push(
        &self,
        parent: &TaskId,
        id: &str,
        notification: &TaskNotification,
    ) -> Result<bool> {
        let json = serde_json::to_string(notification).map_err(|e| Error::Task {
            id: notification.task_id,
            message: format!("the notification cannot be written as JSON: {e}"),
        })?;
        let [stream, ids, done] = self.keys(parent);
        let mut conn = self.conn(parent).await?;
        let stored: i64 = redis::Script::new(PUSH)
            .key(&stream)
            .key(&ids)
            .key(&done)
            .arg(id)
            .arg(&json)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.fail(parent, "push", e))?;
        Ok(stored == 1)
    }

    async fn pending(&self, parent: &TaskId) -> Result<Vec<Queued>> {
        Ok(self.read(parent).await?.1)
    }

    async fn delivered(&self, parent: &TaskId, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let [stream, map, done] = self.keys(parent);
        let mut conn = self.conn(parent).await?;
        let script = redis::Script::new(DELIVERED);
        let mut call = script.key(&stream);
        call.key(&map)
            .key(&done)
            .arg(now_ms())
            .arg(DELIVERED_TTL.as_millis().to_string())
            .arg(DELIVERED_KEPT);
        for id in ids {
            call.arg(id);
        }
        call.invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(parent, "delivered", e))
    }

    async fn wait_beyond(
        &self,
        parent: &TaskId,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool> {
        let [stream, _, _] = self.keys(parent);
        crate::mailbox::redis_wait_on_stream(
            &self.h.client,
            &stream,
            timeout,
            || async {
                let (last, pending) = self.read(parent).await?;
                Ok((last, pending.iter().any(|q| !known.contains(&q.id))))
            },
            |what, e| self.fail(parent, what, e),
        )
        .await
    }
}
