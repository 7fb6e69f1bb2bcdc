//! Mailboxes in Redis (feature `redis`), for agents on several hosts: one stream per inbox.
//!
//! - An inbox is the stream `<prefix>:{<team>}:inbox:<agent>`; the hash
//!   `<prefix>:{<team>}:ids:<agent>` maps each unacknowledged letter's id to its stream entry.
//!   The team is the key's hash tag, so a Redis Cluster keeps a team's inboxes in one slot.
//! - `send` is one script: a letter whose id is still unacknowledged is not stored again;
//!   otherwise `XADD` and the id's entry in the hash, together.
//! - `receive` reads the whole stream (`XRANGE`): every letter not acknowledged, oldest first,
//!   again and again until acknowledged — a reader that crashed reads them again.
//! - `ack` is one script: `XDEL` and `HDEL` for each id (unknown ids are ignored). An
//!   acknowledged letter is gone, so an inbox holds only what is unread.
//! - An idle reader blocks in `XREAD BLOCK` after the last entry it has seen, on a connection
//!   of its own: a blocking read on the shared multiplexed connection would meet the client's
//!   response timeout and hold the shared socket (redis-rs#1236). It costs the server nothing
//!   while it waits, and wakes when a letter is added.
//!
//! The stream is read whole rather than through a consumer group: an inbox has one reader,
//! and the trait's promise — everything unacknowledged, every time — is exactly what the
//! stream holds once acknowledged entries are deleted. (Consumer groups serve the worker pool,
//! where many consumers share one stream.)

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use redis::AsyncCommands as _;
use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

use super::{Delivered, Inbox, LeadClaim, Letter, Mailbox, beyond, new_id, timestamp_now};
use crate::error::{Error, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "forkhive";

/// Stores the letter unless its id is still unacknowledged; returns its id. With a third key,
/// stores nothing while that key exists (an inbox closed by its reader) and returns nil.
/// KEYS: stream, ids[, closed]. ARGV: id, then field/value pairs.
const SEND: &str = r"
if #KEYS > 2 and redis.call('EXISTS', KEYS[3]) == 1 then return false end
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then return ARGV[1] end
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
local entry = redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('HSET', KEYS[2], ARGV[1], entry)
return ARGV[1]
";

/// Deletes each acknowledged letter's entry, and an emptied inbox. KEYS: stream, ids. ARGV:
/// ids.
const ACK: &str = r"
for i = 1, #ARGV do
  local entry = redis.call('HGET', KEYS[2], ARGV[i])
  if entry then
    redis.call('XDEL', KEYS[1], entry)
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return #ARGV
";

/// How long a lead's claim on a team ([`Mailbox::claim_lead`]) lasts in Redis unless renewed
/// (its holder renews it every third of this): a lead that died without giving it up holds its
/// team this long at most.
pub const LEAD_CLAIM_TTL: Duration = Duration::from_secs(15);

/// Renews the claim KEYS[1] while it is still ARGV[1]'s, for ARGV[2] ms: 1 renewed, 0 lost.
const RENEW_CLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
";

/// Gives up the claim KEYS[1] while it is still ARGV[1]'s.
const RELEASE_CLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// `SET key holder NX PX ttl`: the claim taken for `ttl` ms if nobody holds it (answers the
/// `OK` when taken, nil when held).
fn claim_if_free(key: &str, holder: &str, ttl: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(holder).arg("NX").arg("PX").arg(ttl);
    cmd
}

/// A team's lead claimed in Redis: renewed while it lives, given up when dropped.
struct RedisLead {
    renew: tokio::task::JoinHandle<()>,
    conn: ConnectionManager,
    key: String,
    holder: String,
    /// Answered once the claim is given up ([`LeadClaim::release`] waits for it).
    released: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for RedisLead {
    fn drop(&mut self) {
        self.renew.abort();
        give_up(
            &self.conn,
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.holder),
            self.released.take(),
        );
    }
}

/// A lead claim being taken. Dropped before it is kept — the caller gave up waiting (a
/// `Team` waits 30 s for the store), or the store failed in the middle — it gives the claim
/// up as a kept one is given up: a `SET` that lands late is deleted right after it, on the
/// same connection, instead of holding the team for its TTL.
struct Taking {
    conn: Option<ConnectionManager>,
    key: String,
    holder: String,
}

impl Taking {
    /// Taken (or definitely not): nothing to give up.
    fn settle(mut self) {
        self.conn = None;
    }
}

impl Drop for Taking {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            give_up(
                &conn,
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.holder),
                None,
            );
        }
    }
}

/// Deletes the claim at `key` if `holder` holds it, on a task of its own (at once where a
/// runtime can still run it; else the claim lapses within its TTL), then answers `done`.
fn give_up(
    conn: &ConnectionManager,
    key: String,
    holder: String,
    done: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut conn = conn.clone();
    drop(rt.spawn(async move {
        let released = redis::Script::new(RELEASE_CLAIM)
            .key(&key)
            .arg(&holder)
            .invoke_async::<i64>(&mut conn)
            .await;
        if let Err(e) = released {
            // Not "could not": a release that timed out in a partition is still queued behind
            // the claim on the connection and may run once the store is reached again.
            tracing::warn!(
                "no answer yet to giving up the team claim {key} ({e}): it is given up if the \
                 store gets the release later, else it lapses within {} s",
                LEAD_CLAIM_TTL.as_secs()
            );
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }));
}

/// The shared, reconnecting connection of a handle (mailboxes and the task registry): gives
/// up connecting after three tries of 5 s (the default retries for longer), and gives a slow
/// server 10 s per command (the default is 500 ms).
pub(crate) async fn manager(client: &redis::Client) -> redis::RedisResult<ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    ConnectionManager::new_with_config(client.clone(), config).await
}

/// Waits until `look` finds what it waits for (it returns the stream's last entry id and
/// whether it found it), or `timeout` passes. Between looks it blocks in `XREAD` after that
/// last id on a connection of its own, without a response timeout (a blocking read on the
/// shared multiplexed connection would meet its response timeout and hold the shared socket,
/// redis-rs#1236), in slices bounded on this side too, so a connection that died in silence
/// is replaced.
pub(crate) async fn wait_on_stream<L, Fut>(
    client: &redis::Client,
    stream: &str,
    timeout: Duration,
    mut look: L,
    fail: impl Fn(&str, redis::RedisError) -> Error,
) -> Result<bool>
where
    L: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(String, bool)>>,
{
    let now = tokio::time::Instant::now();
    // A timeout too far to represent is thirty years.
    let deadline = now
        .checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400));
    let mut blocking: Option<redis::aio::MultiplexedConnection> = None;
    loop {
        let (last, found) = look().await?;
        if found {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let conn = match &mut blocking {
            Some(c) => c,
            None => {
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                let c = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| fail("could not connect", e))?;
                blocking.insert(c)
            }
        };
        let slice = left.min(BLOCK_SLICE);
        let ms = usize::try_from(slice.as_millis())
            .unwrap_or(usize::MAX)
            .max(1);
        let options = redis::streams::StreamReadOptions::default()
            .block(ms)
            .count(1);
        let started = tokio::time::Instant::now();
        let read = tokio::time::timeout(
            slice + Duration::from_secs(2),
            conn.xread_options::<_, _, Option<redis::streams::StreamReadReply>>(
                &[stream],
                &[&last],
                &options,
            ),
        )
        .await;
        match read {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => {
                // An empty answer long before its time (an old server reading after a
                // deleted entry): do not spin.
                if started.elapsed() < slice / 2 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Ok(Err(e)) => return Err(fail("XREAD", e)),
            // The connection is presumed dead: a new one for the next slice.
            Err(_) => blocking = None,
        }
    }
}

/// What each of the crate's Redis backends holds: the client, one shared reconnecting
/// connection made on first use ([`manager`]), and the URL as it may be shown ([`redact`]).
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) client: redis::Client,
    conn: std::sync::Arc<OnceCell<ConnectionManager>>,
    /// The URL without its password, for messages.
    pub(crate) shown: String,
}

impl Handle {
    /// A handle on `url`; nothing connects until first use. Err: why the URL cannot be used
    /// (without the URL, which may hold a password).
    pub(crate) fn open(url: &str) -> std::result::Result<Self, String> {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        if scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys") {
            return Err(
                "TLS (`rediss://`) is not supported by this client: reach the server \
                        through a private network or a tunnel, with a `redis://` URL"
                    .to_owned(),
            );
        }
        let client =
            redis::Client::open(url).map_err(|e| format!("not a Redis URL ({:?})", e.kind()))?;
        Ok(Self {
            client,
            conn: Default::default(),
            shown: redact(url),
        })
    }

    /// The same server, with a connection of its own (another host's).
    pub(crate) fn fresh(&self) -> Self {
        Self {
            conn: Default::default(),
            ..self.clone()
        }
    }

    /// The shared connection, made now if it is not yet — and asked a `PING`, so a server
    /// that wants a password the URL does not give says so here (`NOAUTH`), not at the
    /// first command.
    pub(crate) async fn conn(&self) -> redis::RedisResult<ConnectionManager> {
        self.conn
            .get_or_try_init(|| async {
                let mut made = manager(&self.client).await?;
                redis::cmd("PING").query_async::<()>(&mut made).await?;
                Ok(made)
            })
            .await
            .cloned()
    }

    /// The shared connection, or the error to report: [`Error::Config`] when the server
    /// refused what the URL set — its user and password, or its database number — which no
    /// retry will change; otherwise what `outage` makes of it (worth retrying).
    pub(crate) async fn connect(
        &self,
        outage: impl FnOnce(redis::RedisError) -> Error,
    ) -> Result<ConnectionManager> {
        self.conn().await.map_err(|e| {
            if refused_settings(&e) {
                Error::Config(format!(
                    "Redis at {} refused the URL's settings (check its user, password and \
                     database number): {e}",
                    self.shown
                ))
            } else {
                outage(e)
            }
        })
    }
}

/// Whether the server refused the connection's own settings (its credentials, its database
/// number) rather than being out of reach or busy (a `SELECT` answered `BUSY` or `LOADING`
/// is an outage, though the client calls every refused `SELECT` the same).
fn refused_settings(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || (text.contains("refused to switch database")
            && (text.contains("DB index is out of range") || text.contains("NOPERM")))
}

/// The longest a blocking read waits before it is asked again: a connection that died in
/// silence (a failover, a NAT that dropped it) is noticed within this much.
const BLOCK_SLICE: Duration = Duration::from_secs(30);

/// Mailboxes in Redis streams. Clones share one connection (multiplexed, reconnecting);
/// [`reopen`](Self::reopen) makes a handle with a connection of its own, as a reader on
/// another host would have.
#[derive(Clone)]
pub struct RedisMailbox {
    h: Handle,
    prefix: String,
}

impl fmt::Debug for RedisMailbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisMailbox")
            .field("url", &self.h.shown)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A Redis URL with its password (in the authority or as a `pass` query parameter) replaced
/// by `***`; anything that does not parse as a URL is shown as `(invalid Redis URL)`, with
/// nothing of it.
pub(crate) fn redact(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "(invalid Redis URL)".to_owned();
    };
    // A TCP URL's path is a database number at most, and it has no fragment; an `@` after its
    // authority, a path that is more than a number or a fragment is most likely the rest of
    // a password whose `@`, `/`, `?` or `#` was not percent-encoded (`redis://:p@ss/word@h`
    // parses with host `ss`), so nothing of it is shown.
    if matches!(parsed.scheme(), "redis" | "rediss" | "valkey" | "valkeys") {
        let path = parsed.path().trim_matches('/');
        let after = url.split_once("://").map_or("", |(_, rest)| {
            rest.find(['/', '?', '#']).map_or("", |i| &rest[i..])
        });
        if !path.bytes().all(|b| b.is_ascii_digit())
            || parsed.fragment().is_some()
            || after.contains('@')
        {
            return "(invalid Redis URL)".to_owned();
        }
    }
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "pass" || k == "password" {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

impl RedisMailbox {
    /// Mailboxes at `url` (`redis://[user:password@]host:port[/db]`; TLS is not built in:
    /// reach a remote Redis through a tunnel or a private network), under the key prefix
    /// [`DEFAULT_PREFIX`].
    /// Nothing connects until first use. The URL's password never appears in `Debug`, logs or
    /// errors.
    pub fn new(url: &str) -> Result<Self> {
        Self::with_prefix(url, DEFAULT_PREFIX)
    }

    /// The same, under `prefix` (1 to 64 of `[A-Za-z0-9_-]`): hosts that share a Redis keep
    /// their teams apart by prefix.
    pub fn with_prefix(url: &str, prefix: &str) -> Result<Self> {
        super::check_name("key prefix", prefix)?;
        let h = Handle::open(url).map_err(|message| Error::Mailbox {
            inbox: redact(url),
            message,
        })?;
        Ok(Self {
            h,
            prefix: prefix.to_owned(),
        })
    }

    /// A handle on the same store with connections of its own.
    pub fn reopen(&self) -> Self {
        Self {
            h: self.h.fresh(),
            prefix: self.prefix.clone(),
        }
    }

    /// Sends `letter` unless the key `closed` exists (its reader closed the inbox): `None`
    /// then, and nothing stored — checked and stored in one script.
    pub(crate) async fn send_unless(
        &self,
        to: &Inbox,
        letter: Letter,
        closed: &str,
    ) -> Result<Option<String>> {
        self.send_inner(to, letter, Some(closed)).await
    }

    async fn send_inner(
        &self,
        to: &Inbox,
        letter: Letter,
        closed: Option<&str>,
    ) -> Result<Option<String>> {
        let (stream, ids) = self.keys(to);
        let id = letter.id.unwrap_or_else(new_id);
        let mut fields = vec![
            ("id", id.clone()),
            ("from", letter.from),
            ("text", letter.text),
            ("ts", timestamp_now()),
        ];
        fields.extend(letter.summary.map(|s| ("summary", s)));
        fields.extend(letter.color.map(|c| ("color", c)));
        let mut conn = self.conn(to).await?;
        let script = redis::Script::new(SEND);
        let mut call = script.key(&stream);
        call.key(&ids);
        if let Some(k) = closed {
            call.key(k);
        }
        call.arg(&id);
        for (k, v) in &fields {
            call.arg(*k).arg(v);
        }
        call.invoke_async::<Option<String>>(&mut conn)
            .await
            .map_err(|e| self.fail(to, "send", e))
    }

    fn keys(&self, inbox: &Inbox) -> (String, String) {
        let (p, t, a) = (&self.prefix, inbox.team(), inbox.agent());
        (
            format!("{p}:{{{t}}}:inbox:{a}"),
            format!("{p}:{{{t}}}:ids:{a}"),
        )
    }

    fn fail(&self, inbox: &Inbox, what: &str, e: redis::RedisError) -> Error {
        // A Redis error names the server's reply, never the URL it was given.
        Error::Mailbox {
            inbox: inbox.to_string(),
            message: format!("Redis at {}: {what}: {e}", self.h.shown),
        }
    }

    async fn conn(&self, inbox: &Inbox) -> Result<ConnectionManager> {
        self.h
            .connect(|e| self.fail(inbox, "could not connect", e))
            .await
    }

    /// The last entry id of `inbox`'s stream, and its unacknowledged letters.
    async fn read(&self, inbox: &Inbox) -> Result<(String, Vec<Delivered>)> {
        let (stream, _) = self.keys(inbox);
        let mut conn = self.conn(inbox).await?;
        let reply: redis::streams::StreamRangeReply = conn
            .xrange_all(&stream)
            .await
            .map_err(|e| self.fail(inbox, "XRANGE", e))?;
        let last = reply
            .ids
            .last()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        let letters = reply
            .ids
            .iter()
            .filter_map(|e| {
                let text = |k: &str| e.get::<String>(k);
                Some(Delivered {
                    id: text("id")?,
                    from: text("from").unwrap_or_default(),
                    text: text("text").unwrap_or_default(),
                    timestamp: text("ts").unwrap_or_default(),
                    summary: text("summary"),
                    color: text("color"),
                })
            })
            .collect();
        Ok((last, letters))
    }
}

#[async_trait]
impl Mailbox for RedisMailbox {
    async fn send(&self, to: &Inbox, letter: Letter) -> Result<String> {
        self.send_inner(to, letter, None)
            .await?
            .ok_or_else(|| Error::Mailbox {
                inbox: to.to_string(),
                message: "the letter was not stored".to_owned(),
            })
    }

    async fn receive(&self, inbox: &Inbox) -> Result<Vec<Delivered>> {
        Ok(self.read(inbox).await?.1)
    }

    async fn ack(&self, inbox: &Inbox, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let (stream, map) = self.keys(inbox);
        let mut conn = self.conn(inbox).await?;
        let script = redis::Script::new(ACK);
        let mut call = script.key(&stream);
        call.key(&map);
        for id in ids {
            call.arg(id);
        }
        call.invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(inbox, "ack", e))
    }

    async fn stored(&self, inbox: &Inbox) -> Result<usize> {
        let (stream, _) = self.keys(inbox);
        let mut conn = self.conn(inbox).await?;
        conn.xlen(&stream)
            .await
            .map_err(|e| self.fail(inbox, "XLEN", e))
    }

    /// A key `<prefix>:{<team>}:lead` set only if absent, with [`LEAD_CLAIM_TTL`], renewed by
    /// a task the claim owns and deleted when it is dropped (only while still its own).
    async fn claim_lead(&self, team: &str) -> Result<LeadClaim> {
        let lead = Inbox::new(team, "team-lead")?;
        let key = format!("{}:{{{team}}}:lead", self.prefix);
        let holder = format!("{} ({})", super::claim_holder(), new_id());
        let ttl = u64::try_from(LEAD_CLAIM_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.conn(&lead).await?;
        let taking = Taking {
            conn: Some(conn.clone()),
            key: key.clone(),
            holder: holder.clone(),
        };
        // A claim of this process given up a moment ago is deleted by a task of its own: it
        // is waited for, a little.
        let mut tries = 0;
        loop {
            let set: Option<String> = claim_if_free(&key, &holder, ttl)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail(&lead, "SET", e))?;
            if set.is_some() {
                taking.settle();
                break;
            }
            let held: Option<String> = conn
                .get(&key)
                .await
                .map_err(|e| self.fail(&lead, "GET", e))?;
            // Lapsed between the two: free again.
            let Some(held) = held else { continue };
            tries += 1;
            if held.starts_with(&super::claim_holder()) && tries < 20 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            // Held by another: none of this call's claims landed.
            taking.settle();
            return Err(Error::TeamTaken {
                team: team.to_owned(),
                holder: format!(
                    "{key} in Redis at {} is held by {}; a claim lapses {} s after its lead \
                     stops renewing it, so one of a lead that is gone frees itself",
                    self.h.shown,
                    super::claim_held_by(&held),
                    LEAD_CLAIM_TTL.as_secs()
                ),
            });
        }
        let renew = {
            let (mut conn, key, holder) = (conn.clone(), key.clone(), holder.clone());
            tokio::spawn(async move {
                let mut pause = LEAD_CLAIM_TTL / 3;
                loop {
                    tokio::time::sleep(pause).await;
                    pause = LEAD_CLAIM_TTL / 3;
                    let renewed = redis::Script::new(RENEW_CLAIM)
                        .key(&key)
                        .arg(&holder)
                        .arg(ttl)
                        .invoke_async::<i64>(&mut conn)
                        .await;
                    match renewed {
                        Ok(1) => {}
                        // Lapsed (Redis out of reach for longer than the TTL): taken again if
                        // nobody took it meanwhile.
                        Ok(_) => {
                            let again: redis::RedisResult<Option<String>> =
                                claim_if_free(&key, &holder, ttl)
                                    .query_async(&mut conn)
                                    .await;
                            if !matches!(again, Ok(Some(_))) {
                                tracing::error!(
                                    "the team claim {key} lapsed and another lead took the team"
                                );
                                return;
                            }
                        }
                        // Soon again: one slow answer must not let the TTL run out.
                        Err(e) => {
                            tracing::warn!("could not renew the team claim {key}: {e}");
                            pause = Duration::from_secs(1);
                        }
                    }
                }
            })
        };
        let (released, on_release) = tokio::sync::oneshot::channel();
        Ok(LeadClaim::kept_until_released(
            RedisLead {
                renew,
                conn,
                key,
                holder,
                released: Some(released),
            },
            on_release,
        ))
    }

    async fn wait_beyond(
        &self,
        inbox: &Inbox,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool> {
        let (stream, _) = self.keys(inbox);
        wait_on_stream(
            &self.h.client,
            &stream,
            timeout,
            || async {
                let (last, letters) = self.read(inbox).await?;
                Ok((last, beyond(&letters, known)))
            },
            |what, e| self.fail(inbox, what, e),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://:hunter2@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("redis://me:hunter2@h"), "redis://me:***@h");
        assert_eq!(redact("redis://me@h"), "redis://me@h");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=hunter2"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(redact("redis://:ab/cd@h:6379"), "(invalid Redis URL)");
        // A password with `@` and `/` not percent-encoded parses with its rest as the path.
        assert_eq!(
            redact("redis://:p@ss/word@127.0.0.1:16379"),
            "(invalid Redis URL)"
        );
        assert_eq!(redact("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact("redis://h:6379/0/"), "redis://h:6379/0/");
        for leaky in [
            "redis://:p@ss?word@127.0.0.1:16379",
            "redis://:p@ss#word@127.0.0.1:6379",
            "redis://:p@ss/0?x=word@h",
        ] {
            assert_eq!(redact(leaky), "(invalid Redis URL)", "{leaky}");
        }
        let tls = RedisMailbox::new("REDISS://h:6380")
            .err()
            .unwrap()
            .to_string();
        assert!(tls.contains("TLS (`rediss://`) is not supported"), "{tls}");
        let tls = RedisMailbox::new("rediss://:hunter2@h:6380").err().unwrap();
        assert_eq!(
            tls.to_string(),
            "mailbox rediss://:***@h:6380: TLS (`rediss://`) is not supported by this client: \
             reach the server through a private network or a tunnel, with a `redis://` URL"
        );
        let m = RedisMailbox::new("redis://me:hunter2@127.0.0.1:1/0");
        let shown = format!("{m:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("me:***@127.0.0.1:1/0"),
            "{shown}"
        );
        let e = RedisMailbox::new("http://:hunter2@x")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| !e.contains("hunter2")),
            "{e:?}"
        );
    }

    #[test]
    fn prefixes_and_keys() {
        let Ok(m) = RedisMailbox::with_prefix("redis://h", "hostA") else {
            panic!()
        };
        let Ok(inbox) = Inbox::new("review", "alice") else {
            panic!()
        };
        assert_eq!(
            m.keys(&inbox),
            (
                "hostA:{review}:inbox:alice".to_owned(),
                "hostA:{review}:ids:alice".to_owned()
            )
        );
        assert_eq!(
            RedisMailbox::with_prefix("redis://h", "a:b")
                .err()
                .map(|e| e.to_string()),
            Some(
                "mailbox a:b: `a:b` is not a valid key prefix: use 1-64 letters, digits, `_` and \
                 `-`"
                .to_owned()
            )
        );
    }
}
