//! Teams whose teammates run on the pool's workers: the lead's [`Team`] in the coordinator's
//! process, each teammate's in the worker that runs it, joined by the pool's Redis.
//!
//! A teammate is a pool task ([`Job::teammate`](super::Job::teammate)). Its letters go
//! through the pool's mailbox (team inboxes under the pool's key prefix) and never into an
//! inbox its ended task has closed — the check and the store are one script, so a letter is
//! either refused or read: taken by the teammate, or named in its notification. The team's
//! names and tasks are on record in `team:<team>` (a hash in the pool's slot), where a
//! teammate on one worker finds a teammate on another.

use std::sync::Arc;
use std::time::Duration;

use forkhive_core::TaskId;

use super::Pool;
use crate::error::{Error, Result};
use crate::mailbox::{Inbox, Letter};
use crate::team::{Team, TeamLink};

/// KEYS: the team's record. ARGV: name, task, the pool's key base. Records `name` as `task`
/// unless another task of the name is on record and live (see [`LIVE`]): that task's id then.
const ENLIST: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local b = ARGV[3]
if cur and cur ~= ARGV[2] and redis.call('EXISTS', b .. 'closed:' .. cur) == 0
  and redis.call('EXISTS', b .. 'sub:' .. cur, b .. 'lease:' .. cur) > 0 then
  return cur
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return false
";

/// A teammate on record is live while its inbox is not closed (its task has not ended) and
/// its job is known: submitted within a day (`sub:`) or running under a lease (`lease:`). A
/// record whose job was never submitted (its lead died between the two) is not live.
const LIVE: &str = r"
local b, out = ARGV[1], {}
for i = 2, #ARGV do
  local t = ARGV[i]
  local live = redis.call('EXISTS', b .. 'closed:' .. t) == 0
    and redis.call('EXISTS', b .. 'sub:' .. t, b .. 'lease:' .. t) > 0
  out[#out + 1] = live and 1 or 0
end
return out
";

/// KEYS: the team's record. ARGV: name, task. Takes `name` off the record if it is `task`.
const DELIST: &str = r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
";

/// The pool as the link between a team's hosts.
pub(crate) struct Link {
    pool: Pool,
    base: String,
}

impl Link {
    pub(crate) fn new(pool: Pool) -> Self {
        let base = pool.base();
        Self { pool, base }
    }
}

#[async_trait::async_trait]
impl TeamLink for Link {
    fn pool(&self) -> &str {
        &self.base
    }

    async fn enlist(&self, team: &str, name: &str, task: &TaskId) -> Result<()> {
        let mut conn = self.pool.conn().await?;
        let other: Option<String> = redis::Script::new(ENLIST)
            .key(self.pool.key(&format!("team:{team}")))
            .arg(name)
            .arg(task.to_string())
            .arg(self.pool.base())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.pool.fail("enlisting a teammate", e))?;
        match other {
            None => Ok(()),
            Some(other) => Err(Error::Refused(format!(
                "team `{team}` already has a teammate `{name}` running on pool `{}` (task \
                 {other}): give this one another name",
                self.pool.name
            ))),
        }
    }

    async fn members(&self, team: &str) -> Result<Vec<(String, TaskId, bool)>> {
        let mut conn = self.pool.conn().await?;
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.pool.key(&format!("team:{team}")))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.pool.fail("HGETALL", e))?;
        // What is not a task id was not written here: skipped, never a key.
        let known: Vec<(String, TaskId)> = all
            .into_iter()
            .filter_map(|(name, task)| Some((name, task.parse().ok()?)))
            .collect();
        if known.is_empty() {
            return Ok(Vec::new());
        }
        let script = redis::Script::new(LIVE);
        let mut call = script.prepare_invoke();
        // Any key of the pool's slot, for a cluster's routing.
        call.key(self.pool.key("jobs")).arg(self.pool.base());
        for (_, task) in &known {
            call.arg(task.to_string());
        }
        let live: Vec<i64> = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.pool.fail("reading the team's record", e))?;
        Ok(known
            .into_iter()
            .zip(live)
            .map(|((name, task), live)| (name, task, live == 1))
            .collect())
    }

    async fn send(&self, inbox: &Inbox, task: &TaskId, letter: Letter) -> Result<Option<String>> {
        self.pool
            .mail
            .send_unless(inbox, letter, &self.pool.task_key("closed", task))
            .await
    }

    async fn cancel(&self, tasks: &[TaskId], grace: Duration) -> Result<()> {
        self.pool
            .cancel_as(tasks, &super::CancelReason::ShutdownGrace(grace))
            .await
            .map(|_| ())
    }
}

impl Pool {
    /// A team whose teammates run on this pool's workers, led from this process: give it to
    /// the lead (`AgentBuilder::extension`) with a [`PoolAgentTool`](super::PoolAgentTool)
    /// built [`with_teams`](super::PoolAgentTool::with_teams). Its mailbox is the pool's
    /// (team inboxes under the pool's key prefix); its name is checked as an inbox's and may
    /// not be the pool's own (the pool's tasks have inboxes under that name).
    pub fn team(&self, name: &str) -> Result<Team> {
        if name == self.name {
            return Err(Error::Config(format!(
                "team `{name}`: a team on pool `{name}` needs a name of its own"
            )));
        }
        Ok(
            Team::new(name, Arc::new(self.mail.clone()))?
                .lead_on(Arc::new(Link::new(self.clone()))),
        )
    }

    /// Takes teammate `name` (task `task`) of team `team` off the record once it has ended.
    pub(crate) async fn delist(&self, team: &str, name: &str, task: &TaskId) -> Result<()> {
        let mut conn = self.conn().await?;
        redis::Script::new(DELIST)
            .key(self.key(&format!("team:{team}")))
            .arg(name)
            .arg(task.to_string())
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fail("delisting a teammate", e))
    }

    /// The teammate's side of team `name`, in a worker.
    pub(crate) fn member_team(&self, name: &str) -> Result<Team> {
        Ok(Team::new(name, Arc::new(self.mail.clone()))?
            .member_on(Arc::new(Link::new(self.clone()))))
    }
}
