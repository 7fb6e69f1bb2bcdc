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

use forkhive_core::TaskId;

use super::Pool;
use crate::error::{Error, Result};
use crate::mailbox::{Inbox, Letter};
use crate::team::{Team, TeamLink};

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
        redis::cmd("HSET")
            .arg(self.pool.key(&format!("team:{team}")))
            .arg(name)
            .arg(task.to_string())
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.pool.fail("HSET", e))
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
        let mut pipe = redis::pipe();
        for (_, task) in &known {
            pipe.cmd("EXISTS").arg(self.pool.task_key("closed", task));
        }
        let closed: Vec<bool> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.pool.fail("EXISTS", e))?;
        Ok(known
            .into_iter()
            .zip(closed)
            .map(|((name, task), closed)| (name, task, !closed))
            .collect())
    }

    async fn send(&self, inbox: &Inbox, task: &TaskId, letter: Letter) -> Result<Option<String>> {
        self.pool
            .mail
            .send_unless(inbox, letter, &self.pool.task_key("closed", task))
            .await
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

    /// The teammate's side of team `name`, in a worker.
    pub(crate) fn member_team(&self, name: &str) -> Result<Team> {
        Ok(Team::new(name, Arc::new(self.mail.clone()))?
            .member_on(Arc::new(Link::new(self.clone()))))
    }
}
