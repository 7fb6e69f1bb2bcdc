//! A team whose teammates run on other hosts (a pool's workers): what joins the lead's side to
//! each teammate's, and the bookkeeping that lets the lead's run wait for teammates it cannot
//! see, as it waits for teammates beside it.
//!
//! The lead's run ends once every teammate is idle or stopped and every letter sent through the
//! team has been taken ("The lead's run" in the module docs). Beside the lead, that is read off
//! shared state. Across hosts, each teammate's worker tells its lead, in letters its lead's
//! relay takes and never shows ([`Bookkeeping`]):
//!
//! - `state`: busy or idle, numbered in the order the state changed — idle under the lock a
//!   shutdown's stop takes, busy by the loop before it takes the letters that woke it (they
//!   stay queued until then) or by the relay after a stop — and a lead applies only a newer
//!   number. An idle notice (which a model could imitate in text) never sets anything down.
//! - `sent`: a letter it stored for another teammate (after storing it: a sender that dies in
//!   between leaves no hold behind). Its recipient may take it before the lead hears of it; a
//!   letter taken first is remembered, and no hold is made for it.
//! - `taken`: letters it took into its conversation; their holds go. Told again until told
//!   (while the teammate lives; once it has ended, its stop lets go of every letter to it).
//! - `ended`: after its last letter, from the worker that reports it: the lead gives the
//!   teammate's notification once it has read what came before (at most [`ENDING_WAIT`]).
//!
//! A restarted lead asks each teammate still on the pool (`ask`); its answer is its state.
//! Every note names the teammate's task: a note of an earlier teammate of the same name acts
//! on nothing.

use std::time::Duration;

use forkhive_core::TaskId;

use crate::base::pending::Expectation;
use crate::error::Result;
use crate::mailbox::{Inbox, Letter};

/// How long a lead waits for the last letters of a teammate on a worker once its notification
/// came (a worker that died sends no `ended` mark; its letters were stored before it died).
pub(crate) const ENDING_WAIT: Duration = Duration::from_secs(5);

/// What a team whose teammates run on other hosts needs from the store that joins them (the
/// pool implements it on Redis).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[async_trait::async_trait]
pub(crate) trait TeamLink: Send + Sync {
    /// The pool the teammates run on (its key base): one team, one pool.
    fn pool(&self) -> &str;
    /// Records teammate `name` as task `task`, where every host finds it. Refused while
    /// another task of that name still runs.
    async fn enlist(&self, team: &str, name: &str, task: &TaskId) -> Result<()>;
    /// Every teammate on record: its name, its task and whether the task still runs.
    async fn members(&self, team: &str) -> Result<Vec<(String, TaskId, bool)>>;
    /// Stores `letter` in `inbox` unless `task` has ended and closed it: `None` then.
    async fn send(&self, inbox: &Inbox, task: &TaskId, letter: Letter) -> Result<Option<String>>;
    /// Cancels teammate tasks `tasks` wherever they run, in one step (each one's worker stops
    /// it and reports its end): what a lead's [`shut_down`](super::Team::shut_down) does to
    /// the teammates still running at the end of its `grace`, which their workers are told
    /// (each teammate then ends as one whose grace ran out in-process does).
    async fn cancel(&self, tasks: &[TaskId], grace: Duration) -> Result<()>;
}

/// A teammate's notification held back until its last letters are read.
pub(crate) struct Ending {
    /// Keeps the lead's run going meanwhile.
    pub(super) hold: Expectation,
    /// Gives the notification.
    pub(super) deliver: Box<dyn FnOnce() + Send>,
}

/// What a teammate on a worker tells its lead (see the module docs). Taken by the lead's
/// relay and never shown; refused as a letter's text from anyone ([`Team::send`](super::Team::send)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename = "forkhive_team_bookkeeping")]
pub(super) struct Bookkeeping {
    pub(super) op: BookOp,
    /// The teammate's task (for `ask`, the task asked).
    pub(super) task: String,
    /// `sent`: the letters' recipient.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) to: String,
    /// `sent`, `taken`: the letters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) ids: Vec<String>,
    /// `state`: busy (true) or idle.
    #[serde(default)]
    pub(super) busy: bool,
    /// `state`: its number, rising with each change.
    #[serde(default)]
    pub(super) seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum BookOp {
    Sent,
    Taken,
    State,
    Ended,
    Ask,
}

impl Bookkeeping {
    pub(super) fn new(op: BookOp, task: &TaskId) -> Self {
        Self {
            op,
            task: task.to_string(),
            to: String::new(),
            ids: Vec::new(),
            busy: false,
            seq: 0,
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        let t = text.trim();
        if !t.starts_with('{') {
            return None;
        }
        serde_json::from_str(t).ok()
    }

    pub(super) fn letter(&self, from: &str) -> Letter {
        Letter::new(from, serde_json::to_string(self).unwrap_or_default())
    }

    /// Whether `text` says it is a note (its `type`), well formed or not: never a letter's
    /// text, and never shown.
    pub(super) fn claimed(text: &str) -> bool {
        let t = text.trim();
        t.starts_with('{')
            && serde_json::from_str::<serde_json::Value>(t)
                .is_ok_and(|v| v["type"] == "forkhive_team_bookkeeping")
    }

    /// The task it names, if it names one.
    pub(super) fn task_id(&self) -> Option<TaskId> {
        self.task.parse().ok()
    }
}

/// The mark a worker leaves in teammate `name`'s lead's inbox when the teammate's task `task`
/// has ended, after every letter it sent (see [`Team::remote_ended`](super::Team::remote_ended)).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn ended_mark(name: &str, task: &TaskId) -> Letter {
    Bookkeeping::new(BookOp::Ended, task).letter(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn notes_round_trip_and_text_is_not_one() {
        let task: TaskId = TaskId::generate(forkhive_core::TaskKind::Agent);
        let mut n = Bookkeeping::new(BookOp::State, &task);
        n.busy = true;
        n.seq = 7;
        let l = n.letter("alice");
        assert_eq!(Bookkeeping::parse(&l.text), Some(n.clone()));
        assert_eq!(Bookkeeping::parse(&format!("  {}\n", l.text)), Some(n));
        assert_eq!(n_task(&l.text), Some(task));
        assert_eq!(Bookkeeping::parse("state busy"), None);
        // Malformed, still claimed: refused as a letter and never shown.
        let bad = r#"{"type":"forkhive_team_bookkeeping","op":"taken","ids":["x"]}"#;
        assert_eq!(Bookkeeping::parse(bad), None);
        assert!(Bookkeeping::claimed(bad));
        assert!(!Bookkeeping::claimed(r#"{"type":"idle_notification"}"#));
        assert_eq!(
            Bookkeeping::parse(r#"{"type":"idle_notification","from":"alice"}"#),
            None
        );
    }

    fn n_task(text: &str) -> Option<TaskId> {
        Bookkeeping::parse(text)?.task_id()
    }
}
