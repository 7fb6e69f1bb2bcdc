//! The in-process mailbox.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use async_trait::async_trait;

use super::{Delivered, Inbox, LeadClaim, Letter, Mailbox, new_id, timestamp_now};
use crate::error::{Error, Result};

/// Mailboxes in memory, for agents in one process. Clones share the same store (a clone is
/// what a reader that restarted within the process sees). One short lock per call, never held
/// across an `.await`.
#[derive(Debug, Clone, Default)]
pub struct MemoryMailbox {
    inboxes: Arc<Mutex<HashMap<Inbox, VecDeque<Delivered>>>>,
    /// Woken (all waiters) when a letter reaches the inbox.
    arrivals: Arc<Mutex<HashMap<Inbox, Arc<Notify>>>>,
    /// The teams whose lead is claimed ([`Mailbox::claim_lead`]).
    leads: Arc<Mutex<std::collections::HashSet<String>>>,
}

/// A team's lead claimed in a [`MemoryMailbox`]: given up when dropped.
struct MemoryLead {
    leads: Arc<Mutex<std::collections::HashSet<String>>>,
    team: String,
}

impl Drop for MemoryLead {
    fn drop(&mut self) {
        self.leads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.team);
    }
}

impl MemoryMailbox {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Inbox, VecDeque<Delivered>>> {
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arrivals(&self, inbox: &Inbox) -> Arc<Notify> {
        Arc::clone(
            self.arrivals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(inbox.clone())
                .or_default(),
        )
    }
}

#[async_trait]
impl Mailbox for MemoryMailbox {
    async fn claim_lead(&self, team: &str) -> Result<LeadClaim> {
        if !self
            .leads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(team.to_owned())
        {
            return Err(Error::TeamTaken {
                team: team.to_owned(),
                holder: "another `Team` value in this process holds it".to_owned(),
            });
        }
        Ok(LeadClaim::kept(MemoryLead {
            leads: Arc::clone(&self.leads),
            team: team.to_owned(),
        }))
    }

    async fn send(&self, to: &Inbox, letter: Letter) -> Result<String> {
        // Only a sender's own id can repeat; a fresh one is unique.
        let (id, chosen) = match letter.id {
            Some(id) => (id, true),
            None => (new_id(), false),
        };
        let mut all = self.lock();
        let queue = all.entry(to.clone()).or_default();
        // A repeated send of a letter still unacknowledged stores it once.
        if chosen && queue.iter().any(|d| d.id == id) {
            return Ok(id);
        }
        let entry = Delivered {
            id: id.clone(),
            from: letter.from,
            text: letter.text,
            timestamp: timestamp_now(),
            summary: letter.summary,
            color: letter.color,
        };
        queue.push_back(entry);
        drop(all);
        self.arrivals(to).notify_waiters();
        Ok(id)
    }

    async fn receive(&self, inbox: &Inbox) -> Result<Vec<Delivered>> {
        Ok(self
            .lock()
            .get(inbox)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn ack(&self, inbox: &Inbox, ids: &[String]) -> Result<()> {
        let mut all = self.lock();
        if let Some(q) = all.get_mut(inbox) {
            let ids: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
            q.retain(|d| !ids.contains(d.id.as_str()));
            if q.is_empty() {
                all.remove(inbox);
            }
        }
        Ok(())
    }

    async fn stored(&self, inbox: &Inbox) -> Result<usize> {
        Ok(self.lock().get(inbox).map_or(0, VecDeque::len))
    }

    async fn wait_beyond(
        &self,
        inbox: &Inbox,
        known: &[String],
        timeout: Duration,
    ) -> Result<bool> {
        let arrivals = self.arrivals(inbox);
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = arrivals.notified();
            tokio::pin!(arrived);
            // Registered before looking: a letter sent between the look and the wait wakes it.
            arrived.as_mut().enable();
            let new = self
                .lock()
                .get(inbox)
                .is_some_and(|q| q.iter().any(|d| !known.contains(&d.id)));
            if new {
                return Ok(true);
            }
            if tokio::time::timeout_at(until, arrived).await.is_err() {
                return Ok(false);
            }
        }
    }
}
