//! The in-process mailbox.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{Delivered, Inbox, Letter, Mailbox, new_id, timestamp_now};
use crate::error::Result;

/// Mailboxes in memory, for agents in one process. Clones share the same store (a clone is
/// what a reader that restarted within the process sees). One short lock per call, never held
/// across an `.await`.
#[derive(Debug, Clone, Default)]
pub struct MemoryMailbox {
    inboxes: Arc<Mutex<HashMap<Inbox, VecDeque<Delivered>>>>,
}

impl MemoryMailbox {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Inbox, VecDeque<Delivered>>> {
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Mailbox for MemoryMailbox {
    async fn send(&self, to: &Inbox, letter: Letter) -> Result<String> {
        let id = new_id();
        let entry = Delivered {
            id: id.clone(),
            from: letter.from,
            text: letter.text,
            timestamp: timestamp_now(),
            summary: letter.summary,
            color: letter.color,
        };
        self.lock().entry(to.clone()).or_default().push_back(entry);
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
}
