//! Teams: a lead and long-lived teammates that talk through a [`Mailbox`] ("Claude Code
//! Multi-Agent Internals: How Subagents and Swarm Teammates Actually Work — 6.2 Swarm
//! teammates are long-lived workers", "7. How Spawned Agents Receive Messages While Working").
//!
//! A host makes a [`Team`] and gives it to the lead (`AgentBuilder::extension`), with
//! `AgentToolConfig::with_teams_enabled(true)`. The lead's `Agent` call with `name` and
//! `team_name` starts a teammate: a child under the task service, owned like any other, whose
//! run is a loop — run its prompt, go idle (an `idle_notification` to the lead), wait for a
//! letter, run again — until a shutdown request ([`ShutdownPolicy`]: it finishes its current
//! tool round, answers `shutdown_approved` and ends), its cancellation, or a run that does not
//! complete. Letters reach a busy teammate at its next tool-round boundary; an idle one wakes
//! on them. The lead's own letters reach it the same way, as `<teammate-message>`s.
//!
//! The lead's run returns once every teammate is idle or stopped and every letter sent
//! through the team has been taken by its recipient: a teammate sets its promise on the lead's
//! queue down while idle (and takes it up when a letter wakes it), and each letter holds one
//! until its recipient's relay acknowledges it. `SendMessage` addresses teammates by name,
//! `team-lead` from a teammate, and `*`; a teammate that has shut down is an error to the
//! sender, never a silent loss. The team is flat: teammates cannot start teammates. A teammate
//! started in plan mode is held to read-only tools by its permission check until the lead
//! approves its plan.
//!
//! Teammates may also run on a pool's workers, in other processes (`Pool::team`, feature
//! `redis`); all of the above holds across hosts (see `remote` for how the lead's run waits).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use forkhive_core::TaskId;
use tokio::sync::watch;

use crate::base::outcome::{AgentRun, StopReason};
use crate::base::pending::{
    Expectation, Halt, MAILBOX_CONTROL_ORIGIN, MAILBOX_ORIGIN, PendingMessage, PendingQueue,
    PromiseHandle,
};
use crate::error::{Error, Result};
use crate::mailbox::protocol::{IdleReason, PlanDecision, PlanGate, Protocol, Seen};
use crate::mailbox::{Inbox, Letter, Mailbox};
use crate::runtime::Agent;
use crate::task::CustomRun;

mod remote;

use remote::{BookOp, Bookkeeping};
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use remote::{TeamLink, ended_mark};

/// The lead's name in its team (Claude Code's `team-lead`).
pub const LEAD: &str = "team-lead";

/// A letter to teammate `to`, which has ended.
fn gone(to: &str) -> Error {
    Error::Refused(format!(
        "teammate `{to}` has stopped (it shut down, was stopped or failed), so the message was not \
         delivered"
    ))
}

/// Where a teammate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberState {
    /// Working on a prompt.
    Running,
    /// Done with its prompt, waiting for a letter.
    Idle,
    /// Ended: shut down, cancelled, or its run did not complete.
    Stopped,
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberState::Running => "running",
            MemberState::Idle => "idle",
            MemberState::Stopped => "stopped",
        })
    }
}

/// A teammate on the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// Its name in the team.
    pub name: String,
    /// Its task id.
    pub task: TaskId,
    /// Its agent type.
    pub agent_type: String,
    /// Where it is.
    pub state: MemberState,
}

/// What a teammate does with its lead's `shutdown_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ShutdownPolicy {
    /// It finishes its current tool round, answers `shutdown_approved` and ends (the default).
    #[default]
    Approve,
    /// The request goes into its conversation and the teammate answers it with `SendMessage`
    /// `{"type":"shutdown_response","request_id":…,"approve":…,"reason":…}`: approved, it ends
    /// after that tool round; rejected, the lead gets `shutdown_rejected` with the reason and
    /// the teammate works on.
    Ask,
}

/// What keeps the lead's run going while its team works ("The lead's run" in the module docs):
/// each busy teammate's promise, and every letter sent through the team until its recipient
/// has taken it into its conversation.
#[derive(Default)]
struct Holds {
    /// The lead's queue, once it serves the team.
    lead: Option<PendingQueue>,
    /// Each live teammate's promise on the lead's queue.
    running: HashMap<String, PromiseHandle>,
    /// Promises of teammates stopped on the roster whose end is still to be delivered (their
    /// owner finishes them after the roster hears): a new lead takes these over too. Pruned
    /// of delivered ones as teammates stop.
    finishing: Vec<PromiseHandle>,
    /// Letters not yet taken by their recipients, by (recipient, id): the lead's promise.
    letters: HashMap<(String, String), Expectation>,
    /// Teammates on workers whose notification came before their last letters were read: the
    /// lead waits for those letters (the `ended` mark after them), at most
    /// [`ENDING_WAIT`](remote::ENDING_WAIT), and gives the notification then.
    ending: HashMap<TaskId, remote::Ending>,
    /// Teammates on workers whose `ended` mark was read before their notification came.
    ended: HashSet<TaskId>,
    /// Letters a teammate on a worker took before the lead heard they were sent, by
    /// `recipient\0id`: no hold is made for them when it does.
    early: Recent,
    /// The last state each teammate on a worker reported (its sequence number).
    last_state: HashMap<String, u64>,
    /// Teammates being stopped (`TaskStop`): their promise stays held until they end, idle
    /// or not, so the lead's run waits for the `killed` notification it was told of.
    stopping: HashSet<String>,
}

impl Holds {
    /// Takes the holds of every letter to `recipient` not taken yet, for the caller to release
    /// outside the lock.
    fn letters_to(&mut self, recipient: &str) -> Vec<Expectation> {
        let keys: Vec<(String, String)> = self
            .letters
            .keys()
            .filter(|(to, _)| to == recipient)
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| self.letters.remove(&k))
            .collect()
    }

    /// Serves `lead`: every hold is moved onto its queue, so a new lead on a team that outlived
    /// the lead that started its teammates waits for them, and their notifications reach it
    /// instead of a queue nobody reads.
    fn take_over(&mut self, lead: &PendingQueue) {
        if self.lead.as_ref().is_some_and(|old| old.is(lead)) {
            return;
        }
        for promise in self.running.values() {
            promise.move_to(lead);
        }
        // (One closed but whose message is not on its queue yet is kept: a shutdown waits for
        // it.)
        self.finishing
            .retain(|promise| promise.move_to(lead) || !promise.is_finished());
        // Each new hold is made before the old one drops: the old queue is released, the new
        // one never looks settled in between.
        for hold in self.letters.values_mut() {
            *hold = lead.expect();
        }
        for ending in self.ending.values_mut() {
            ending.hold = lead.expect();
        }
        self.lead = Some(lead.clone());
    }

    /// Teammate `name` holds the lead's run through `promise` — on the queue of the lead
    /// served now, which may not be the one that started it.
    fn hold(&mut self, name: &str, promise: PromiseHandle) {
        if let Some(lead) = &self.lead {
            promise.move_to(lead);
        }
        self.last_state.remove(name);
        self.running.insert(name.to_owned(), promise);
    }
}

/// A live teammate's controls.
struct Control {
    /// Ends its run at its next tool-round boundary.
    halt: Halt,
    /// Set to the request's id when it is to shut down.
    stop: watch::Sender<Option<String>>,
    /// The shutdown request it was asked and has not answered ([`ShutdownPolicy::Ask`]).
    asked: Option<String>,
    /// Requests already taken, by `(type, requestId)`.
    seen: Seen,
    /// Its pending queue.
    queue: PendingQueue,
    /// Its run's token: cancelled when a shutdown it was given is not done within the team's
    /// [`shutdown_grace`](Team::with_shutdown_grace).
    cancel: tokio_util::sync::CancellationToken,
    /// The grace that ran out, once one has: its notification says why it was stopped.
    overdue: Arc<std::sync::OnceLock<Duration>>,
}

/// A team: its name, its mailbox and its roster. One per lead.
pub struct Team {
    name: String,
    mailbox: Arc<dyn Mailbox>,
    members: Mutex<BTreeMap<String, Member>>,
    /// Moves the lead's letters into its conversation; started with the first teammate and
    /// stopped with the team.
    lead_poller: Mutex<Option<LeadRelay>>,
    /// Each teammate's plan approvals.
    plans: Mutex<std::collections::HashMap<String, PlanGate>>,
    /// Where the roster is kept (`config.json`), if anywhere.
    roster_file: Option<std::path::PathBuf>,
    /// Held while the roster is written, so writes land in the order of the changes.
    saving: Mutex<()>,
    /// What keeps the lead's run going.
    holds: Mutex<Holds>,
    /// Each live teammate's controls.
    controls: Mutex<HashMap<String, Control>>,
    /// On a worker: the lead's grace for a teammate task whose shutdown cancel came before
    /// its run made its controls, taken when it makes them (see
    /// [`overdue_on_pool`](Self::overdue_on_pool)). Locked inside `controls`.
    early_overdue: Mutex<HashMap<TaskId, Duration>>,
    /// Teammates in plan mode whose plan the lead has not approved yet.
    planning: Mutex<HashSet<String>>,
    /// When each teammate joined (ISO 8601): a control letter older than its teammate was
    /// meant for an earlier teammate of the same name, and is not acted on.
    joined: Mutex<HashMap<String, String>>,
    /// What teammates do with a shutdown request.
    shutdown: ShutdownPolicy,
    /// How long a teammate told to stop may take to reach its next tool-round boundary before
    /// it is cancelled.
    shutdown_grace: Duration,
    /// Where its teammates run.
    side: Side,
    /// On a worker: the state its teammate last reported to its lead (busy) and its number.
    reported: Mutex<(bool, u64)>,
    /// Its lead's claim on the mailbox, once taken ([`claim_lead`](Team::claim_lead)).
    lead_claim: tokio::sync::Mutex<Option<crate::mailbox::LeadClaim>>,
    /// The shutdowns under way ([`shut_down`](Team::shut_down)): while there is one, no
    /// teammate joins, and one whose run starts meanwhile is cancelled at the same deadline as
    /// those asked. A leaf lock: nothing is locked while it is held.
    shutdowns: Mutex<Shutdowns>,
    /// What the lead's relays have taken from its inbox, for each queue they took it into
    /// that still lives: a relay that serves the same queue again — after another lead's, too
    /// — does not put a letter in twice. Held weakly: a lead's queue is not kept alive here.
    lead_seen: Mutex<Vec<(crate::base::pending::WeakQueue, Arc<Taken>)>>,
    /// Notified when a teammate's state on the roster changes.
    roster_changed: tokio::sync::Notify,
}

/// Where a team's teammates run, as seen from this [`Team`] value.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Clone)]
enum Side {
    /// In this process, each beside its lead (the default).
    Local,
    /// On a pool's workers; this is the lead's side. Teammates tell it of their letters through
    /// [`Bookkeeping`] letters, and their ends come with their task notifications.
    Lead(Arc<dyn TeamLink>),
    /// A teammate's side, in the worker process that runs it.
    Member(Arc<dyn TeamLink>),
}

impl fmt::Debug for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Team")
            .field("name", &self.name)
            .field("mailbox", &self.mailbox)
            .finish_non_exhaustive()
    }
}

/// The task moving the lead's letters into its queue, the queue, and the token of the lead it
/// serves (the latest lead to ask for that queue: it ends when that token is cancelled).
struct LeadRelay {
    task: tokio::task::JoinHandle<()>,
    queue: PendingQueue,
    until: tokio::sync::watch::Sender<tokio_util::sync::CancellationToken>,
    /// Ends the relay for good ([`Team::shut_down`]): it puts the letters in the inbox now in
    /// the lead's queue and returns.
    give_up: tokio_util::sync::CancellationToken,
}

/// Cancels `tasks`, teammates on a pool whose shutdown `grace` has passed, in one step,
/// saying why when it cannot.
async fn cancel_on_pool(
    link: &dyn remote::TeamLink,
    team: &str,
    tasks: &[TaskId],
    grace: Duration,
) {
    if !tasks.is_empty()
        && let Err(e) = link.cancel(tasks, grace).await
    {
        tracing::warn!(%team, "could not cancel teammates {tasks:?} at the end of the \
            shutdown's grace: {e}");
    }
}

/// The deadline of each shutdown under way.
#[derive(Default)]
struct Shutdowns(Vec<tokio::time::Instant>);

/// `grace` from now, or a time that never comes when that is past what the clock holds (a
/// grace of `Duration::MAX` cancels nothing).
fn deadline_after(grace: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(grace)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

impl Drop for Team {
    fn drop(&mut self) {
        if let Some(p) = self
            .lead_poller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            p.task.abort();
        }
    }
}

impl Team {
    /// Team `name` over `mailbox` (the name is checked as an inbox's).
    pub fn new(name: impl Into<String>, mailbox: Arc<dyn Mailbox>) -> Result<Self> {
        let name = name.into();
        Inbox::new(name.clone(), LEAD)?;
        Ok(Self {
            name,
            mailbox,
            members: Mutex::default(),
            lead_poller: Mutex::default(),
            plans: Mutex::default(),
            roster_file: None,
            saving: Mutex::default(),
            holds: Mutex::default(),
            controls: Mutex::default(),
            early_overdue: Mutex::default(),
            planning: Mutex::default(),
            joined: Mutex::default(),
            shutdown: ShutdownPolicy::default(),
            shutdown_grace: SHUTDOWN_GRACE,
            side: Side::Local,
            reported: Mutex::new((true, 0)),
            lead_claim: tokio::sync::Mutex::const_new(None),
            shutdowns: Mutex::default(),
            lead_seen: Mutex::default(),
            roster_changed: tokio::sync::Notify::new(),
        })
    }

    /// The lead's side of a team whose teammates run on a pool's workers (`Pool::team`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lead_on(mut self, link: Arc<dyn TeamLink>) -> Self {
        self.side = Side::Lead(link);
        self
    }

    /// A teammate's side of such a team, in the worker that runs it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn member_on(mut self, link: Arc<dyn TeamLink>) -> Self {
        self.side = Side::Member(link);
        self
    }

    /// What its teammates do with a shutdown request.
    pub fn shutdown_policy(&self) -> ShutdownPolicy {
        self.shutdown
    }

    /// The pool (its key base) this team's teammates run on, if they run on one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn pool(&self) -> Option<&str> {
        match &self.side {
            Side::Lead(l) | Side::Member(l) => Some(l.pool()),
            Side::Local => None,
        }
    }

    /// Its link to the other hosts, when this is the lead's side of a team on a pool.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lead_link(&self) -> Option<&Arc<dyn TeamLink>> {
        match &self.side {
            Side::Lead(l) => Some(l),
            _ => None,
        }
    }

    /// What its teammates do with the lead's shutdown requests (default
    /// [`ShutdownPolicy::Approve`]).
    pub fn with_shutdown_policy(mut self, policy: ShutdownPolicy) -> Self {
        self.shutdown = policy;
        self
    }

    /// How long a teammate told to stop may take before it is cancelled (default
    /// [`SHUTDOWN_GRACE`], three minutes). A teammate stops at its next tool-round boundary;
    /// one inside a tool without a timeout (or a model answer that does not end) would
    /// otherwise never stop. Cancelled, it still confirms its shutdown to the lead. The grace
    /// of the side that runs the teammate applies; on a pool, a teammate's job carries its
    /// lead's grace to the worker's `Team`. Under [`ShutdownPolicy::Ask`] it runs from the
    /// teammate's approval.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a teammate told to stop may take before it is cancelled.
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    /// Claims this team's lead on its mailbox ([`Mailbox::claim_lead`]) for as long as this
    /// value lives, if it has not yet: a second lead of the same team on the same store —
    /// another process, or another `Team` value — would share its inboxes and take its
    /// letters, so its claim is [`Error::TeamTaken`]. The lead claims it when it starts its
    /// first teammate or sends its first letter; a host may claim it at start-up to fail
    /// early. A teammate's side of a team on a pool claims nothing.
    pub async fn claim_lead(&self) -> Result<()> {
        if matches!(self.side, Side::Member(_)) {
            return Ok(());
        }
        // Held across the claim, so one claim is made; bounded, so a store that never answers
        // fails each caller in turn rather than hold every later one for good.
        let mut held = self.lead_claim.lock().await;
        if held.is_none() {
            let claim = tokio::time::timeout(CLAIM_LIMIT, self.mailbox.claim_lead(&self.name))
                .await
                .map_err(|_| Error::Mailbox {
                    inbox: format!("{}/{LEAD}", self.name),
                    message: format!(
                        "claiming the team's lead: the store did not answer within {}",
                        crate::base::events::format_duration(CLAIM_LIMIT)
                    ),
                })??;
            *held = Some(claim);
        }
        Ok(())
    }

    /// Keeps the roster in `file` (Claude Code's `<root>/teams/<team>/config.json`): written
    /// on every change (a temporary file renamed over it), and read back here — a restarted
    /// lead gets its team back. Teammates it lists were alive in a process that is gone, so
    /// they come back `stopped`. A file that is not a roster is an error, left as it is.
    pub fn with_roster_file(mut self, file: impl Into<std::path::PathBuf>) -> Result<Self> {
        let file = file.into();
        match std::fs::read(&file) {
            Ok(bytes) => {
                let bad = |why: String| Error::Mailbox {
                    inbox: format!("{}/config.json", self.name),
                    message: format!("{} is not a team roster: {why}", file.display()),
                };
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
                let members = v["members"]
                    .as_array()
                    .ok_or_else(|| bad("no `members` array".to_owned()))?;
                // Another team's file would be written over with this team's name and members.
                let lead = format!("{LEAD}@{}", self.name);
                match (v["name"].as_str(), v["leadAgentId"].as_str()) {
                    (Some(other), _) if other != self.name => {
                        return Err(bad(format!("it is team `{other}`'s")));
                    }
                    (_, Some(other)) if other != lead => {
                        return Err(bad(format!("its lead is `{other}`, not `{lead}`")));
                    }
                    _ => {}
                }
                let mut all = self.lock();
                for m in members {
                    let (Some(name), Some(task)) = (m["name"].as_str(), m["taskId"].as_str())
                    else {
                        continue;
                    };
                    let Ok(task) = task.parse::<TaskId>() else {
                        continue;
                    };
                    all.insert(
                        name.to_owned(),
                        Member {
                            name: name.to_owned(),
                            task,
                            agent_type: m["agentType"].as_str().unwrap_or_default().to_owned(),
                            state: MemberState::Stopped,
                        },
                    );
                }
                drop(all);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Mailbox {
                    inbox: format!("{}/config.json", self.name),
                    message: format!("reading {}: {e}", file.display()),
                });
            }
        }
        self.roster_file = Some(file);
        Ok(self)
    }

    /// The roster as a line for a lead's context (after a restart or a compaction).
    pub fn roster_summary(&self) -> String {
        let members: Vec<String> = self
            .roster()
            .iter()
            .map(|m| {
                format!(
                    "{} ({}, {}, task {})",
                    m.name, m.agent_type, m.state, m.task
                )
            })
            .collect();
        if members.is_empty() {
            format!("You lead team `{}`; it has no teammates yet.", self.name)
        } else {
            format!(
                "You lead team `{}`. Its teammates: {}.",
                self.name,
                members.join("; ")
            )
        }
    }

    /// Queues [`roster_summary`](Self::roster_summary) for `lead`'s next run, as a message
    /// of its own — what a host does after it rebuilt a lead (a restart, with
    /// [`with_roster_file`](Self::with_roster_file)) or compacted its conversation, so the
    /// lead knows its team without being told again. Returns the text queued.
    pub fn brief(&self, lead: &Agent) -> String {
        let text = format!(
            "<team-roster>{}</team-roster>",
            crate::mailbox::escape_text(&self.roster_summary())
        );
        lead.pending()
            .push(PendingMessage::new(text.clone(), "team-roster"));
        text
    }

    /// Writes the roster file, if there is one (small; on every change of the roster).
    ///
    /// The file is shared with Claude Code's own processes: what is there already is kept —
    /// members this team does not run (a Claude Code teammate), every field this library does
    /// not write (`description`, `createdAt`, a member's `model`, `color`, `cwd`…) — and only
    /// this team's members are written over.
    fn save(&self) {
        let Some(file) = &self.roster_file else {
            return;
        };
        // The snapshot and its write under one lock: a later change is never overwritten by an
        // earlier snapshot.
        let _saving = self.saving.lock().unwrap_or_else(|e| e.into_inner());
        let ours = self.roster();
        let mut doc = match std::fs::read(file)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        {
            Some(serde_json::Value::Object(doc)) => doc,
            _ => serde_json::Map::new(),
        };
        let mut theirs: Vec<serde_json::Value> = match doc.remove("members") {
            Some(serde_json::Value::Array(members)) => members,
            _ => Vec::new(),
        };
        let mut members: Vec<serde_json::Value> = Vec::with_capacity(ours.len() + theirs.len());
        for m in &ours {
            let at = theirs.iter().position(|t| t["name"] == m.name.as_str());
            let mut entry = match at.map(|i| theirs.remove(i)) {
                Some(serde_json::Value::Object(entry)) => entry,
                _ => serde_json::Map::new(),
            };
            for (key, value) in [
                (
                    "agentId",
                    serde_json::json!(format!("{}@{}", m.name, self.name)),
                ),
                ("name", serde_json::json!(m.name)),
                ("agentType", serde_json::json!(m.agent_type)),
                ("taskId", serde_json::json!(m.task.to_string())),
                ("state", serde_json::json!(m.state.to_string())),
            ] {
                entry.insert(key.to_owned(), value);
            }
            members.push(serde_json::Value::Object(entry));
        }
        members.extend(theirs);
        doc.insert("name".to_owned(), serde_json::json!(self.name));
        doc.entry("leadAgentId")
            .or_insert_with(|| serde_json::json!(format!("{LEAD}@{}", self.name)));
        doc.insert("members".to_owned(), serde_json::Value::Array(members));
        let doc = serde_json::Value::Object(doc);
        let write = || -> std::io::Result<()> {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = file.with_extension(format!("json.tmp-{}", crate::mailbox::new_id()));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&doc).unwrap_or_default())?;
            std::fs::rename(&tmp, file).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        };
        if let Err(e) = write() {
            tracing::warn!(file = %file.display(), "could not write the team roster: {e}");
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its mailbox.
    pub fn mailbox(&self) -> &Arc<dyn Mailbox> {
        &self.mailbox
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every teammate, by name.
    pub fn roster(&self) -> Vec<Member> {
        self.lock().values().cloned().collect()
    }

    /// One teammate.
    pub fn member(&self, name: &str) -> Option<Member> {
        self.lock().get(name).cloned()
    }

    /// Whether `name` is a teammate here — on a worker, anywhere in the team: where the team is
    /// on record says (and if it cannot be asked, the send that follows says why).
    pub(crate) async fn has_teammate(&self, name: &str) -> bool {
        if self.member(name).is_some() {
            return true;
        }
        match &self.side {
            Side::Member(link) => link
                .members(&self.name)
                .await
                .map_or(true, |all| all.iter().any(|(n, _, _)| n == name)),
            _ => false,
        }
    }

    /// The name of the teammate running as task `id`.
    pub fn name_of(&self, id: &TaskId) -> Option<String> {
        self.lock()
            .values()
            .find(|m| m.task == *id)
            .map(|m| m.name.clone())
    }

    /// The inbox of `agent` in this team.
    pub fn inbox(&self, agent: &str) -> Result<Inbox> {
        Inbox::new(self.name.clone(), agent)
    }

    /// Adds a teammate; a name a teammate that has not stopped holds is refused.
    ///
    /// Names that differ only in case are one name here: on a case-insensitive file system
    /// (macOS, Windows) `Alice` and `alice` would share an inbox file, and `Team-Lead` the lead's.
    pub(crate) fn join(&self, member: Member) -> Result<Joined> {
        if member.name.eq_ignore_ascii_case(LEAD) {
            return Err(Error::Refused(format!(
                "`{}` is the lead's name in a team (in any case); give the teammate another",
                member.name
            )));
        }
        if let Some(foreign) = self.foreign_member(&member.name) {
            return Err(Error::Refused(format!(
                "team `{}`'s roster file names a member `{foreign}` that this lead does not run \
                 (another session's teammate, whose inbox this one would share); give this one \
                 another name",
                self.name
            )));
        }
        let mut all = self.lock();
        // Under the roster's lock, which a shutdown takes to list whom it asks: a teammate is
        // refused, or listed.
        if self.shutdown_deadline().is_some() {
            return Err(Error::Refused(format!(
                "team `{}` is shutting down; start `{}` once its shutdown has returned",
                self.name, member.name
            )));
        }
        if let Some(m) = all
            .values()
            .find(|m| m.state != MemberState::Stopped && m.name.eq_ignore_ascii_case(&member.name))
        {
            let case = if m.name == member.name {
                String::new()
            } else {
                format!(
                    ", from whose name `{}` differs only in case (on a case-insensitive disk the two \
                     would share an inbox)",
                    member.name
                )
            };
            return Err(Error::Refused(format!(
                "team `{}` already has a teammate `{}` ({}, task {}){case}; give this one another \
                 name",
                self.name, m.name, m.state, m.task
            )));
        }
        let joined_before = self
            .joined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(member.name.clone(), crate::mailbox::timestamp_now());
        let joined = Joined {
            name: member.name.clone(),
            task: member.task,
            replaced: all.insert(member.name.clone(), member),
            joined_before,
        };
        drop(all);
        self.save();
        Ok(joined)
    }

    /// Takes back a [`join`](Self::join) whose teammate never started (its start was refused
    /// after it joined): the roster is as it was — the stopped teammate of that name it
    /// replaced back in its place, or no member of the name — so a start that failed leaves
    /// no `stopped` member behind that would answer for the name. Nothing happens when the
    /// name is no longer the withdrawn task's.
    pub(crate) fn withdraw(&self, joined: Joined) {
        let Joined {
            name,
            task,
            replaced,
            joined_before,
        } = joined;
        let ours = |all: &BTreeMap<String, Member>| all.get(&name).is_some_and(|m| m.task == task);
        if !ours(&self.lock()) {
            return;
        }
        drop(self.stop_holding(&name));
        {
            let mut all = self.lock();
            if !ours(&all) {
                return;
            }
            match replaced {
                Some(before) => all.insert(name.clone(), before),
                None => all.remove(&name),
            };
            let mut times = self.joined.lock().unwrap_or_else(|e| e.into_inner());
            match joined_before {
                Some(t) => times.insert(name, t),
                None => times.remove(&name),
            };
        }
        self.roster_changed.notify_waiters();
        self.save();
    }

    /// A member of the roster file named `name` (in any case) that is none of this team's: one
    /// without a task id (a Claude Code teammate), or with another task than ours of that name.
    fn foreign_member(&self, name: &str) -> Option<String> {
        let file = self.roster_file.as_ref()?;
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
        let ours = self.lock();
        doc["members"].as_array()?.iter().find_map(|m| {
            let theirs = m["name"].as_str()?;
            if !theirs.eq_ignore_ascii_case(name) {
                return None;
            }
            let task = m["taskId"].as_str().and_then(|t| t.parse::<TaskId>().ok());
            let known = task.is_some_and(|t| ours.values().any(|o| o.task == t));
            (!known).then(|| theirs.to_owned())
        })
    }

    fn set_state(&self, name: &str, state: MemberState) {
        if self.mark(name, state) {
            self.save();
        }
    }

    /// Sets `name`'s state on the roster; whether it changed (the caller saves).
    fn mark(&self, name: &str, state: MemberState) -> bool {
        match self.lock().get_mut(name) {
            // An ended teammate stays stopped (a late note of its own changes nothing); a new
            // one of its name joins afresh.
            Some(m) if m.state != state && m.state != MemberState::Stopped => {
                m.state = state;
                self.roster_changed.notify_waiters();
                true
            }
            _ => false,
        }
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn controls(&self) -> std::sync::MutexGuard<'_, HashMap<String, Control>> {
        self.controls.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn planning(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.planning.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `letter` to `to` (a teammate's name or [`LEAD`]) and returns the letter's id (a
    /// structured message's own id, such as a shutdown request's `requestId`, is inside its
    /// text: keep the [`Protocol`] to match the answer). A teammate that has stopped is
    /// an error: nobody would read it. Until its recipient has taken it into its conversation,
    /// the letter holds the lead's run. A letter whose whole text is the team's own
    /// bookkeeping (what teammates on other hosts tell their lead) is refused.
    pub async fn send(&self, to: &str, letter: Letter) -> Result<String> {
        if Bookkeeping::claimed(&letter.text) {
            return Err(Error::Refused(
                "that text is the team's own bookkeeping between hosts; a letter may not be it"
                    .to_owned(),
            ));
        }
        match &self.side {
            Side::Member(link) if to != LEAD => self.send_from_member(link, to, letter).await,
            _ => self.send_held(to, letter).await,
        }
    }

    /// A letter from the lead's process (or to the lead), held as [`send`](Self::send) says.
    async fn send_held(&self, to: &str, letter: Letter) -> Result<String> {
        let inbox = self.inbox(to)?;
        let id = letter.id.clone().unwrap_or_else(crate::mailbox::new_id);
        let letter = letter.with_id(id.clone());
        let key = (to.to_owned(), id);
        let (inserted, task) = {
            // Checked and held under one lock with a teammate's stop (`stopped`), so no hold
            // outlives the teammate that would release it.
            let mut holds = self.holds();
            let mut task = None;
            if to != LEAD {
                match self.member(to) {
                    None => {
                        return Err(Error::Refused(format!(
                            "team `{}` has no teammate `{to}`",
                            self.name
                        )));
                    }
                    Some(m) if m.state == MemberState::Stopped => return Err(gone(to)),
                    Some(m) => task = Some(m.task),
                }
            }
            let inserted = match holds.lead.clone() {
                // A repeated send of a letter already held keeps the one hold.
                Some(lead) if !holds.letters.contains_key(&key) => {
                    holds.letters.insert(key.clone(), lead.expect());
                    true
                }
                _ => false,
            };
            (inserted, task)
        };
        // Until the send has stored the letter, a hold this call made is this call's: if the
        // send fails or this future is dropped (a tool timeout), it is released.
        let mut unsent = Unsent {
            team: self,
            key: inserted.then_some(key),
        };
        let sent = match (&self.side, task) {
            // A teammate on a worker: not into an inbox its ended task has closed.
            (Side::Lead(link), Some(task)) => link
                .send(&inbox, &task, letter)
                .await
                .and_then(|stored| stored.ok_or_else(|| gone(to))),
            _ => self.mailbox.send(&inbox, letter).await,
        };
        if sent.is_ok() {
            // Stored: the hold is the recipient's to release now.
            unsent.key = None;
        }
        drop(unsent);
        sent
    }

    /// A letter from a teammate on a worker to another teammate: stored, then its lead told
    /// (`sent`), so it holds the lead's run until its recipient has taken it.
    async fn send_from_member(
        &self,
        link: &Arc<dyn TeamLink>,
        to: &str,
        letter: Letter,
    ) -> Result<String> {
        let inbox = self.inbox(to)?;
        let members = link.members(&self.name).await?;
        let Some((_, task, live)) = members.iter().find(|(name, _, _)| name == to) else {
            return Err(Error::Refused(format!(
                "team `{}` has no teammate `{to}`",
                self.name
            )));
        };
        if !live {
            return Err(gone(to));
        }
        let id = letter.id.clone().unwrap_or_else(crate::mailbox::new_id);
        let letter = letter.with_id(id.clone());
        let from = letter.from.clone();
        let sent = link
            .send(&inbox, task, letter)
            .await
            .and_then(|stored| stored.ok_or_else(|| gone(to)))?;
        // Stored, then told — again through Redis errors until told: a sender that dies in
        // between leaves no hold behind (its recipient, woken, holds the lead's run by its own
        // state).
        if let Some(me) = self.member(&from) {
            let mut note = Bookkeeping::new(BookOp::Sent, &me.task);
            note.to = to.to_owned();
            note.ids = vec![id];
            let never = tokio_util::sync::CancellationToken::new();
            self.to_lead_until_stored(note.letter(&from), &never).await;
        }
        Ok(sent)
    }

    /// A note from teammate `from` (on a worker) to its lead.
    async fn tell_lead(&self, from: &str, note: &Bookkeeping) -> Result<()> {
        self.mailbox
            .send(&self.inbox(LEAD)?, note.letter(from))
            .await
            .map(|_| ())
    }

    /// Sends `letter` to the lead from a teammate on a worker, again and again (up to 5 s
    /// apart) until it is stored or `stop` is cancelled: its state and idle notice must reach
    /// the lead, whose run waits on them.
    async fn to_lead_until_stored(
        &self,
        letter: Letter,
        stop: &tokio_util::sync::CancellationToken,
    ) {
        let Ok(lead) = self.inbox(LEAD) else { return };
        // One id for every try: a write that timed out but was stored is not stored twice.
        let letter = match letter.id {
            Some(_) => letter,
            None => letter.with_id(crate::mailbox::new_id()),
        };
        let mut wait = Duration::from_millis(100);
        loop {
            match self.mailbox.send(&lead, letter.clone()).await {
                Ok(_) => return,
                Err(e) => tracing::warn!(
                    "teammate `{}` could not write to its lead, again in {} ms: {e}",
                    letter.from,
                    wait.as_millis()
                ),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// Teammate `name` on a worker tells its lead it is busy or idle (a new number each time).
    async fn report_state(
        &self,
        name: &str,
        busy: bool,
        stop: &tokio_util::sync::CancellationToken,
    ) {
        if !matches!(self.side, Side::Member(_)) {
            return;
        }
        let seq = {
            let mut s = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            s.0 = busy;
            s.1 += 1;
            s.1
        };
        self.tell_state(name, busy, seq, stop).await;
    }

    /// Teammate `name` tells its lead the state it last reported, under the same number (the
    /// answer to a restarted lead's `ask`).
    async fn report_current_state(&self, name: &str, stop: &tokio_util::sync::CancellationToken) {
        let (busy, seq) = *self.reported.lock().unwrap_or_else(|e| e.into_inner());
        self.tell_state(name, busy, seq, stop).await;
    }

    async fn tell_state(
        &self,
        name: &str,
        busy: bool,
        seq: u64,
        stop: &tokio_util::sync::CancellationToken,
    ) {
        let Some(me) = self.member(name) else { return };
        let mut note = Bookkeeping::new(BookOp::State, &me.task);
        note.busy = busy;
        note.seq = seq;
        self.to_lead_until_stored(note.letter(name), stop).await;
    }

    /// Sends text `letter` to every teammate that has not stopped but its sender — and to the
    /// lead, when a teammate sends it. Returns who it reached, by name.
    pub async fn broadcast(&self, letter: Letter) -> Result<Vec<String>> {
        let mut to: Vec<String> = match &self.side {
            // On a worker, the team is on record where every host sees it.
            Side::Member(link) => link
                .members(&self.name)
                .await?
                .into_iter()
                .filter(|(name, _, live)| *live && *name != letter.from)
                .map(|(name, _, _)| name)
                .collect(),
            _ => self
                .roster()
                .into_iter()
                .filter(|m| m.state != MemberState::Stopped && m.name != letter.from)
                .map(|m| m.name)
                .collect(),
        };
        if letter.from != LEAD {
            to.push(LEAD.to_owned());
        }
        if to.is_empty() {
            return Err(Error::Refused(format!(
                "team `{}` has no teammate running to broadcast to",
                self.name
            )));
        }
        let mut reached = Vec::with_capacity(to.len());
        let mut failed = Vec::new();
        for name in to {
            // Each copy has an id of its own.
            let mut copy = letter.clone();
            copy.id = None;
            match self.send(&name, copy).await {
                Ok(_) => reached.push(name),
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        if failed.is_empty() {
            Ok(reached)
        } else {
            Err(Error::Refused(format!(
                "the broadcast reached {} but not {}",
                if reached.is_empty() {
                    "nobody".to_owned()
                } else {
                    reached.join(", ")
                },
                failed.join("; ")
            )))
        }
    }

    /// Letters `recipient` took: they no longer hold the lead's run.
    fn taken(&self, recipient: &str, ids: &[String]) {
        let released: Vec<_> = {
            let mut holds = self.holds();
            ids.iter()
                .filter_map(|id| holds.letters.remove(&(recipient.to_owned(), id.clone())))
                .collect()
        };
        drop(released);
    }

    /// Teammate `name`, started on a pool's worker, holds the lead's run through `promise`
    /// (its task's, kept by the lead's pool delivery) while it works.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn hold_remote(&self, name: &str, promise: PromiseHandle) {
        self.holds().hold(name, promise);
    }

    /// Teammate `name`, still running on a pool's worker as `task`, is back on the roster of a
    /// restarted lead, its run held through `promise` until the teammate answers what it is
    /// doing ([`ask_state`](Self::ask_state)).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn rejoin_remote(&self, name: &str, task: TaskId, promise: PromiseHandle) {
        {
            let mut all = self.lock();
            let agent_type = all
                .get(name)
                .filter(|m| m.task == task)
                .map(|m| m.agent_type.clone())
                .unwrap_or_default();
            all.insert(
                name.to_owned(),
                Member {
                    name: name.to_owned(),
                    task,
                    agent_type,
                    state: MemberState::Running,
                },
            );
        }
        self.hold_remote(name, promise);
        self.save();
    }

    /// Asks teammate `name` (task `task`, on a worker) for its state; its answer comes as its
    /// bookkeeping. A teammate that has ended is not asked: its notification comes instead.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) async fn ask_state(&self, name: &str, task: &TaskId) -> Result<()> {
        let Side::Lead(link) = &self.side else {
            return Ok(());
        };
        let ask = Bookkeeping::new(BookOp::Ask, task);
        link.send(&self.inbox(name)?, task, ask.letter(LEAD))
            .await
            .map(|_| ())
    }

    /// The teammate on a worker that ran as `task` has ended (its notification came):
    /// `deliver` gives the notification. Once the lead has read the letters the teammate sent
    /// before it ended — its worker marks the end in the lead's inbox after them, and from a
    /// worker that died the lead waits at most [`ENDING_WAIT`](remote::ENDING_WAIT) — the
    /// teammate is stopped on the roster, then the notification given, then what it held let
    /// go: the lead reads its last letters first, and its run never ends between the two.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn remote_ended(self: &Arc<Self>, task: &TaskId, deliver: Box<dyn FnOnce() + Send>) {
        let name = match (&self.side, self.name_of(task)) {
            (Side::Lead(_), Some(name)) => name,
            _ => {
                deliver();
                return;
            }
        };
        {
            let mut holds = self.holds();
            if !holds.ended.remove(task)
                && let Some(lead) = holds.lead.clone()
            {
                holds.ending.insert(
                    *task,
                    remote::Ending {
                        hold: lead.expect(),
                        deliver,
                    },
                );
                let (team, task) = (Arc::downgrade(self), *task);
                tokio::spawn(async move {
                    tokio::time::sleep(remote::ENDING_WAIT).await;
                    if let Some(team) = team.upgrade() {
                        team.ending_done(&task);
                    }
                });
                return;
            }
        }
        let released = self.stop_holding(&name);
        deliver();
        drop(released);
    }

    /// Teammate task `task`'s end was read (or waited for long enough): stopped, its
    /// notification given, its holds let go — in that order.
    fn ending_done(&self, task: &TaskId) {
        let Some(ending) = self.holds().ending.remove(task) else {
            return;
        };
        let released = self
            .name_of(task)
            .map(|name| self.stop_holding(&name))
            .unwrap_or_default();
        (ending.deliver)();
        drop(released);
        drop(ending.hold);
    }

    /// The lead's relay takes every bookkeeping note (true: never shown to the lead, whoever
    /// sent it) and applies those of its teammates on workers. Anything else is shown.
    fn take_bookkeeping(&self, d: &crate::mailbox::Delivered) -> bool {
        if !Bookkeeping::claimed(&d.text) {
            return false;
        }
        if let (Side::Lead(_), Some(note)) = (&self.side, Bookkeeping::parse(&d.text)) {
            self.book(&d.from, note);
        }
        true
    }

    /// Applies teammate `from`'s note (see [`remote`]): only one its current task wrote.
    fn book(&self, from: &str, note: Bookkeeping) {
        let Some(task) = note.task_id() else { return };
        let Some(me) = self.member(from).filter(|m| m.task == task) else {
            return;
        };
        let mut released = Vec::new();
        let mut state = None;
        {
            let mut holds = self.holds();
            match note.op {
                BookOp::Sent => {
                    let open = note.to != LEAD
                        && self
                            .member(&note.to)
                            .is_some_and(|m| m.state != MemberState::Stopped);
                    if let (Some(lead), true) = (holds.lead.clone(), open) {
                        for id in note.ids {
                            // Taken before the lead heard it was sent: nothing to hold.
                            if holds.early.contains(&format!("{}\0{id}", note.to)) {
                                continue;
                            }
                            holds
                                .letters
                                .entry((note.to.clone(), id))
                                .or_insert_with(|| lead.expect());
                        }
                    }
                }
                BookOp::Taken => {
                    for id in note.ids {
                        match holds.letters.remove(&(from.to_owned(), id.clone())) {
                            Some(hold) => released.push(hold),
                            None => holds.early.insert(format!("{from}\0{id}")),
                        }
                    }
                }
                BookOp::State => {
                    let newer = holds
                        .last_state
                        .get(from)
                        .is_none_or(|last| note.seq > *last);
                    if newer && me.state != MemberState::Stopped {
                        holds.last_state.insert(from.to_owned(), note.seq);
                        state = Some(note.busy);
                    }
                }
                BookOp::Ended => {
                    if holds.ending.contains_key(&task) {
                        drop(holds);
                        self.ending_done(&task);
                        return;
                    }
                    if me.state != MemberState::Stopped {
                        holds.ended.insert(task);
                    }
                }
                BookOp::Ask => {}
            }
        }
        drop(released);
        match state {
            // Working: the lead waits for it.
            Some(true) => {
                if let Some(p) = self.holds().running.get(from) {
                    p.take_up();
                }
                self.set_state(from, MemberState::Running);
            }
            // Idle on the roster before the lead's run may end on it.
            Some(false) => {
                self.set_state(from, MemberState::Idle);
                if let Some(p) = self.holds().running.get(from) {
                    p.set_down();
                }
            }
            None => {}
        }
    }

    /// Moves a letter into teammate `name`'s queue, taking its promise up first: the lead's
    /// run waits for the work the letter starts.
    fn deliver_to(&self, name: &str, queue: &PendingQueue, message: PendingMessage) {
        let holds = self.holds();
        if let Some(p) = holds.running.get(name) {
            p.take_up();
        }
        queue.push(message);
    }

    /// Teammate `name` goes idle if nothing waits in its queue: its promise is set down, so the
    /// lead's run no longer waits for it. False if something does.
    fn rest(&self, name: &str, queue: &PendingQueue) -> bool {
        let holds = self.holds();
        let stopping = self
            .controls()
            .get(name)
            .is_some_and(|c| c.stop.borrow().is_some());
        if !queue.is_empty() || stopping {
            return false;
        }
        // On a worker, its idle number is taken here, under the lock a shutdown's stop takes
        // too: a busy number the relay takes after a stop is always the higher.
        if matches!(self.side, Side::Member(_)) {
            let mut r = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            r.0 = false;
            r.1 += 1;
        }
        // Idle on the roster before the lead's run may end on it; the file is written after,
        // outside the lock.
        let changed = self.mark(name, MemberState::Idle);
        // One being stopped keeps its lead waiting for its end.
        if let Some(p) = holds.running.get(name)
            && !holds.stopping.contains(name)
        {
            p.set_down();
        }
        drop(holds);
        if changed {
            self.save();
        }
        true
    }

    /// Teammate `name` is working again: the lead's run waits for it.
    fn busy(&self, name: &str) {
        if let Some(p) = self.holds().running.get(name) {
            p.take_up();
        }
        self.set_state(name, MemberState::Running);
    }

    /// The teammate running as task `id` is being stopped: its lead's run waits for its end
    /// (a teammate idle between prompts has set its promise down, and would not be waited
    /// for, so the run could return before the `killed` notification it was told of).
    pub(crate) fn await_end_of(&self, id: &TaskId) {
        // Under the holds' lock, then the roster's (the order `rest` takes them): the name
        // is still this task's when its promise is taken up.
        let mut holds = self.holds();
        let Some(name) = self.name_of(id) else { return };
        if let Some(promise) = holds.running.get(&name) {
            promise.take_up();
            holds.stopping.insert(name);
        }
    }

    /// [`await_end_of`](Self::await_end_of) undone, for a stop that did not happen (the task
    /// was not running): a teammate resting between prompts sets its promise down again.
    pub(crate) fn not_stopping(&self, id: &TaskId) {
        let mut holds = self.holds();
        let Some(name) = self.name_of(id) else { return };
        if !holds.stopping.remove(&name) {
            return;
        }
        let idle = self
            .lock()
            .get(&name)
            .is_some_and(|m| m.state == MemberState::Idle);
        if idle && let Some(promise) = holds.running.get(&name) {
            promise.set_down();
        }
    }

    /// Teammate `name` has ended: stopped on the roster, and the letters it will never take
    /// no longer hold the lead's run.
    pub(crate) fn stopped(&self, name: &str) {
        drop(self.stop_holding(name));
    }

    /// [`stopped`](Self::stopped), its letters' holds handed back to be released by the caller
    /// (after it has queued what the lead must still read).
    fn stop_holding(&self, name: &str) -> Vec<Expectation> {
        let (released, changed) = {
            let mut holds = self.holds();
            // Its controls, plans and plan mode go before the name is free: a new teammate of
            // the same name never has them removed under it, nor inherits them.
            self.controls().remove(name);
            self.planning().remove(name);
            self.plans().remove(name);
            if let Some(promise) = holds.running.remove(name) {
                // Its end is delivered after this: a new lead before then must get it.
                holds.finishing.retain(|p| !p.is_finished());
                if !promise.is_finished() {
                    holds.finishing.push(promise);
                }
            }
            holds.last_state.remove(name);
            holds.stopping.remove(name);
            (
                holds.letters_to(name),
                self.mark(name, MemberState::Stopped),
            )
        };
        // The file is written outside the lock every relay and send takes.
        if changed {
            self.save();
        }
        released
    }

    /// Whether `letter` was sent before teammate `name` joined (to an earlier teammate of the
    /// name): a control letter like that is acknowledged and not acted on.
    fn stale(&self, name: &str, letter: &crate::mailbox::Delivered) -> bool {
        // On a worker the letter carries its sender's clock, another host's: not comparable.
        // Nor needed: the worker that reports a teammate's end takes its unread letters.
        if matches!(self.side, Side::Member(_)) {
            return false;
        }
        self.joined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .is_some_and(|joined| letter.timestamp.as_str() < joined.as_str())
    }

    /// Stops teammate `name` for request `request_id`: it ends its run at its next tool-round
    /// boundary (at once if idle) and answers `shutdown_approved`.
    fn stop_member(&self, name: &str, request_id: String) {
        let holds = self.holds();
        if let Some(p) = holds.running.get(name) {
            p.take_up();
        }
        if let Some(c) = self.controls().get(name) {
            // The stop first: a run the halt ends must find it set.
            c.stop.send_replace(Some(request_id));
            c.halt.request();
            self.cancel_at(c, deadline_after(self.shutdown_grace));
        }
    }

    /// Teammate `name` (task `task`), on this worker, is about to be cancelled because its
    /// lead's shutdown `grace` has passed (the pool's cancel said so): it ends as a teammate
    /// whose grace ran out here does — as shut down when idle under `Approve`, otherwise
    /// `killed` with the grace note naming the lead's grace. Call before cancelling its token.
    /// One whose run has not made its controls yet is told as it makes them.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn overdue_on_pool(&self, task: TaskId, name: &str, grace: Duration) {
        let controls = self.controls();
        match controls.get(name) {
            Some(c) => {
                c.overdue.get_or_init(|| grace);
            }
            None => {
                self.early_overdue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(task, grace);
            }
        }
    }

    /// Forgets what [`overdue_on_pool`](Self::overdue_on_pool) kept for `task` when its run
    /// never made its controls (its job ended first).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn forget_overdue(&self, task: &TaskId) {
        let _controls = self.controls();
        self.early_overdue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(task);
    }

    /// Makes `control` teammate `name`'s (task `task`), under the lock a shutdown takes to
    /// arm those it finds: one started while the host shuts the team down ends at that
    /// shutdown's deadline whatever it does with the request in its inbox (armed either way,
    /// at most twice, to the same effect), and one whose lead's grace a pool's cancel already
    /// reported is overdue from the start.
    fn arm(&self, name: &str, task: TaskId, control: Control) {
        let mut controls = self.controls();
        if let Some(deadline) = self.shutdown_deadline() {
            self.cancel_at(&control, deadline);
        }
        if let Some(grace) = self
            .early_overdue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&task)
        {
            control.overdue.get_or_init(|| grace);
        }
        controls.insert(name.to_owned(), control);
    }

    /// Cancels the teammate of `c` if it has not ended by `deadline`, the end of the team's
    /// shutdown grace: a run that does not reach its next tool round in time (a peer's users
    /// report shutdowns that never complete). Its owner cancels the token when it ends anyway,
    /// which ends this wait early.
    fn cancel_at(&self, c: &Control, deadline: tokio::time::Instant) {
        let grace = self.shutdown_grace;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let token = c.cancel.clone();
            let overdue = Arc::clone(&c.overdue);
            drop(rt.spawn(async move {
                tokio::select! {
                    () = token.cancelled() => {}
                    () = tokio::time::sleep_until(deadline) => {
                        overdue.get_or_init(|| grace);
                        token.cancel();
                    }
                }
            }));
        }
    }

    /// The deadline of the shutdowns under way, if any.
    fn shutdown_deadline(&self) -> Option<tokio::time::Instant> {
        self.shutdowns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .iter()
            .min()
            .copied()
    }

    /// Shuts every teammate down and returns once each has ended and its owner has finished
    /// it — its record, its worktree, its notification (on the lead's queue) — then gives the
    /// team up: what a host does before it exits, so that no worktree is left unasked about
    /// and another lead may take the team at once.
    ///
    /// Each running or idle teammate is sent a `shutdown_request` with `reason`, as the lead's
    /// `SendMessage` would send it. Unlike a request the lead sends, this one ends a teammate
    /// in this process whatever the team's [`ShutdownPolicy`]: one still running when the
    /// team's shutdown grace has passed since this call — stuck in a tool, or one that
    /// rejected the request under `Ask` — is cancelled. No teammate joins meanwhile (an
    /// `Agent` call starting one is refused, saying so). Returns the names it asked, in roster
    /// order.
    ///
    /// Giving the team up: the lead's letters stop being moved into its conversation — those
    /// already in its queue (the teammates' `shutdown_approved` answers among them) are
    /// acknowledged and reach it at its next run, later ones stay in the mailbox for the
    /// team's next lead — and the team's claim on its mailbox is given up, the store told
    /// before this returns. The team may be used again: its next teammate claims it again.
    ///
    /// On a pool, teammates end on their workers, under this team's policy and grace (each
    /// teammate's job carries them); one still running when this team's grace has passed (it
    /// rejected under `Ask`, or is stuck in a tool) is cancelled on the pool, the cancel saying
    /// that this team's grace passed: its worker stops it as a teammate whose grace ran out in one
    /// process is stopped (`killed` with the grace note naming this team's grace; under `Approve`,
    /// idle, `completed`), and its notification comes as any teammate's end does. A worker that
    /// cannot read why in a second takes it as a plain cancel (note `cancelled`).
    /// [`Error::TeamNotStopped`] names the teammates still running (or owners still finishing)
    /// [`SHUT_DOWN_MARGIN`] after this team's grace — a worker that cannot be reached, a store that
    /// fails — and the team is not given up then. A letter that could not be sent is the error
    /// returned once the others were asked and waited for. A teammate's side of a team on a pool
    /// cannot shut it down ([`Error::Refused`]). Dropped before it returns, the teammates whose
    /// runs had started when it asked them still end by its deadline (on a pool, are cancelled
    /// there at its deadline), and the team is not given up.
    pub async fn shut_down(&self, reason: Option<String>) -> Result<Vec<String>> {
        if matches!(self.side, Side::Member(_)) {
            return Err(Error::Refused(format!(
                "a teammate's side of team `{}` cannot shut the team down; its lead does",
                self.name
            )));
        }
        /// Ends this shutdown's part however it ends (returned, failed, dropped).
        struct Shutting<'a>(&'a Mutex<Shutdowns>, tokio::time::Instant);
        impl Drop for Shutting<'_> {
            fn drop(&mut self) {
                let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(at) = s.0.iter().position(|d| *d == self.1) {
                    s.0.swap_remove(at);
                }
            }
        }
        // Every teammate asked, and every one whose run starts meanwhile, is cancelled at the
        // earliest deadline of the shutdowns under way if it has not ended.
        let deadline = deadline_after(self.shutdown_grace);
        self.shutdowns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push(deadline);
        let shutting = Shutting(&self.shutdowns, deadline);
        let names: Vec<String> = self
            .lock()
            .values()
            .filter(|m| m.state != MemberState::Stopped)
            .map(|m| m.name.clone())
            .collect();
        // On a pool, a teammate ends on its worker under this team's policy and grace (its
        // job carries them): one that rejected the request under `Ask`, or is stuck in a tool, is still running when
        // this shutdown's grace has passed. The lead cancels it on the pool then (its worker
        // stops it and reports its end), so a host that shuts its team down before it exits
        // leaves nothing running on the workers either — from a task of its own, as the
        // timers beside the lead are, so a shutdown dropped midway still does it. (Cancelling a
        // task that has ended does nothing.)
        // The teammates asked so far (each once its request was sent, or could not be): only
        // those, as in this process, where each is armed as it is asked. Past the deadline
        // (`None`), one asked later is cancelled at once, by the loop below.
        let asked: Arc<Mutex<Option<Vec<TaskId>>>> = Arc::new(Mutex::new(Some(Vec::new())));
        let overdue = match &self.side {
            Side::Lead(link) => {
                let (link, team, asked) = (Arc::clone(link), self.name.clone(), Arc::clone(&asked));
                let at = self.shutdown_deadline().unwrap_or(deadline);
                let grace = self.shutdown_grace;
                tokio::runtime::Handle::try_current().ok().map(|rt| {
                    rt.spawn(async move {
                        tokio::time::sleep_until(at).await;
                        let tasks = asked
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .take()
                            .unwrap_or_default();
                        cancel_on_pool(&*link, &team, &tasks, grace).await;
                    })
                })
            }
            _ => None,
        };
        let mut failed = None;
        for name in &names {
            let request = shutdown_request(reason.clone()).to_letter(LEAD);
            match self.send(name, request).await {
                Ok(_) => {}
                // Stopped meanwhile: nothing to ask.
                Err(_)
                    if self
                        .member(name)
                        .is_none_or(|m| m.state == MemberState::Stopped) => {}
                Err(e) => {
                    tracing::warn!(team = %self.name, "could not ask `{name}` to shut down: {e}");
                    failed.get_or_insert(e);
                }
            }
            // Ended whatever the policy, and whether or not the letter went. (One whose run
            // has not started yet is armed as it starts.)
            if let Some(c) = self.controls().get(name) {
                self.cancel_at(c, self.shutdown_deadline().unwrap_or(deadline));
            }
            if let (Some(_), Side::Lead(link)) = (&overdue, &self.side)
                && let Some(m) = self
                    .member(name)
                    .filter(|m| m.state != MemberState::Stopped)
            {
                let late = match &mut *asked.lock().unwrap_or_else(|e| e.into_inner()) {
                    Some(waiting) => {
                        waiting.push(m.task);
                        false
                    }
                    None => true,
                };
                // From a task of its own, as at the deadline: a shutdown dropped meanwhile
                // still cancels the teammate it asked.
                if late {
                    let (link, team, task) = (Arc::clone(link), self.name.clone(), m.task);
                    let grace = self.shutdown_grace;
                    drop(tokio::spawn(async move {
                        cancel_on_pool(&*link, &team, &[task], grace).await;
                    }));
                }
            }
        }
        let waited = self.shutdown_grace.saturating_add(SHUT_DOWN_MARGIN);
        let ended = async {
            // Every teammate asked has ended on the roster…
            loop {
                let notified = self.roster_changed.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                if names.iter().all(|n| {
                    self.member(n)
                        .is_none_or(|m| m.state == MemberState::Stopped)
                }) {
                    break;
                }
                notified.await;
            }
            // …and its owner has finished it: a teammate's promise moves to `finishing` as it
            // stops on the roster, and closes once its notification is on the lead's queue.
            let finishing = self.holds().finishing.clone();
            futures::future::join_all(finishing.iter().map(PromiseHandle::closed)).await;
        };
        let ended = tokio::time::timeout(waited, ended).await;
        // Returned (not dropped): what is left to cancel has ended, or has been cancelled.
        if let Some(overdue) = overdue {
            overdue.abort();
        }
        if ended.is_err() {
            let mut running: Vec<String> = names
                .iter()
                .filter(|n| {
                    self.member(n)
                        .is_some_and(|m| m.state != MemberState::Stopped)
                })
                .map(|n| format!("`{n}`"))
                .collect();
            if running.is_empty() {
                running.push("the owner of a teammate that stopped".to_owned());
            }
            return Err(Error::TeamNotStopped {
                team: self.name.clone(),
                running: running.join(", "),
                waited,
            });
        }
        self.give_up().await;
        // Only now may teammates join: one that joined before the team was given up would run
        // without its claim.
        drop(shutting);
        match failed {
            Some(e) => Err(e),
            None => Ok(names),
        }
    }

    /// Gives the team up ([`shut_down`](Self::shut_down)): the lead's relay ends, the last
    /// letters put in the lead's queue; letters to the lead no longer hold its run; the claim
    /// is given up, the store told.
    async fn give_up(&self) {
        let relay = self
            .lead_poller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(LeadRelay {
            mut task, give_up, ..
        }) = relay
        {
            give_up.cancel();
            // An acknowledgement the store does not answer is not waited for long.
            if tokio::time::timeout(Duration::from_secs(10), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        let released = self.holds().letters_to(LEAD);
        // Released outside the lock: the queue wakes its readers.
        drop(released);
        let claim = self.lead_claim.lock().await.take();
        if let Some(claim) = claim {
            claim.release().await;
        }
    }

    /// Teammate `name`'s answer to the lead's shutdown request ([`ShutdownPolicy::Ask`]):
    /// approved, it ends after this tool round; rejected, the lead gets `shutdown_rejected`
    /// with `reason`.
    pub async fn answer_shutdown(
        &self,
        name: &str,
        request_id: &str,
        approve: bool,
        reason: Option<String>,
    ) -> Result<()> {
        {
            let mut controls = self.controls();
            let Some(c) = controls.get_mut(name) else {
                return Err(Error::Refused(format!(
                    "`{name}` is not a running teammate of team `{}`",
                    self.name
                )));
            };
            if c.asked.as_deref() != Some(request_id) {
                return Err(Error::Protocol(format!(
                    "shutdown answer for `{request_id}` rejected: the lead asked `{name}` no \
                     such request, or it was answered"
                )));
            }
            if !approve && reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
                return Err(Error::Protocol(
                    "a shutdown_response that rejects the request needs a `reason`".to_owned(),
                ));
            }
            c.asked = None;
        }
        if approve {
            self.stop_member(name, request_id.to_owned());
            return Ok(());
        }
        let no = Protocol::ShutdownRejected {
            request_id: request_id.to_owned(),
            from: name.to_owned(),
            timestamp: crate::mailbox::timestamp_now(),
            reason: reason.unwrap_or_default(),
        };
        self.send(LEAD, no.to_letter(name)).await.map(|_| ())
    }

    /// A shutdown request that reached teammate `name`: stops it, or puts the question into
    /// its conversation ([`ShutdownPolicy::Ask`]). A copy of a request already taken does
    /// nothing.
    fn shutdown_asked(&self, name: &str, request: &Protocol, letter: &crate::mailbox::Delivered) {
        let Protocol::ShutdownRequest { request_id, .. } = request else {
            return;
        };
        let ask = {
            let mut controls = self.controls();
            let Some(c) = controls.get_mut(name) else {
                return;
            };
            if !c.seen.first_time(request) {
                return;
            }
            if self.shutdown == ShutdownPolicy::Ask {
                c.asked = Some(request_id.clone());
            }
            c.queue_text(self.shutdown, request_id, letter)
        };
        match ask {
            Some((queue, text)) => {
                self.deliver_to(
                    name,
                    &queue,
                    PendingMessage::new(text, MAILBOX_CONTROL_ORIGIN),
                );
            }
            None => self.stop_member(name, request_id.clone()),
        }
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, PlanGate>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Teammate `name` asks the lead to approve `plan`: one request open at a time.
    pub async fn ask_plan(&self, name: &str, plan: String) -> Result<String> {
        let request = self
            .plans()
            .entry(name.to_owned())
            .or_insert_with(|| PlanGate::new(LEAD))
            .ask(name, plan)?;
        self.send(LEAD, request.to_letter(name)).await
    }

    /// Whether teammate `name` waits for the lead's answer to its plan.
    pub fn awaiting_plan(&self, name: &str) -> bool {
        self.plans().get(name).is_some_and(PlanGate::waiting)
    }

    /// Whether teammate `name` is in plan mode: started with `mode: "plan"` and its plan not
    /// approved yet, so only read-only tools (and `SendMessage`) run.
    pub fn in_plan_mode(&self, name: &str) -> bool {
        self.planning().contains(name)
    }

    /// Puts teammate `name` in plan mode.
    pub(crate) fn enter_plan_mode(&self, name: &str) {
        self.planning().insert(name.to_owned());
    }

    /// A plan answer that reached teammate `name`, as the text its conversation gets (`None`
    /// for a copy of an answer already taken).
    fn answer_plan(&self, name: &str, letter: &crate::mailbox::Delivered) -> Option<String> {
        let mut plans = self.plans();
        let gate = plans
            .entry(name.to_owned())
            .or_insert_with(|| PlanGate::new(LEAD));
        match gate.answer(letter) {
            Ok(PlanDecision::Proceed { .. }) => {
                drop(plans);
                // Out of plan mode: its tools run as the host's policy says.
                self.planning().remove(name);
                Some("The lead approved your plan: go on with it.".to_owned())
            }
            Ok(PlanDecision::Revise { feedback }) => Some(format!(
                "The lead rejected your plan{}. Revise it and ask for approval again before you \
                 act on it.",
                feedback.map(|f| format!(": {f}")).unwrap_or_default()
            )),
            Ok(_) => None,
            Err(e) => Some(format!(
                "A plan answer was refused ({e}); wait for the lead's own answer."
            )),
        }
    }

    /// Makes `lead` the team's lead: the letters to `team-lead` go to it, and it takes over
    /// the teammates an earlier lead started — its runs wait for the busy ones, and their
    /// answers and notifications come to it — until it is dropped or cancelled. A lead is
    /// served on its own when it starts a teammate or writes to one; a host calls this for a
    /// second lead built on a team that outlived the first (one built with
    /// `cancel_children_on_drop(false)`), before it runs. One lead at a time: serving another
    /// takes the team from this one.
    pub fn serve(self: &Arc<Self>, lead: &Agent) {
        self.serve_lead(lead.pending(), lead.cancellation().clone());
    }

    /// [`serve_lead`](Self::serve_lead) unless the relay already serves `lead`'s queue — then
    /// nothing changes, not even whose token ends it (a lead's `SendMessage`, which must not
    /// hand the relay of a queue two leads share to whichever wrote last).
    pub(crate) fn serve_lead_unless_served(
        self: &Arc<Self>,
        lead: PendingQueue,
        until: tokio_util::sync::CancellationToken,
    ) {
        {
            let p = self.lead_poller.lock().unwrap_or_else(|e| e.into_inner());
            if p.as_ref()
                .is_some_and(|r| !r.task.is_finished() && r.queue.is(&lead))
            {
                return;
            }
        }
        self.serve_lead(lead, until);
    }

    /// Starts moving the lead's letters into `lead` (its pending queue) until `until` (the
    /// lead's token) is cancelled — the lead was dropped or cancelled. Once per lead: a relay
    /// already serving this queue is left as it is; one serving another lead (a new lead on a
    /// team that outlived the first) is stopped, and this lead is served instead. Letters the
    /// stopped relay had put in the old queue but not acknowledged stay in the inbox, and come
    /// to the new lead.
    pub(crate) fn serve_lead(
        self: &Arc<Self>,
        lead: PendingQueue,
        until: tokio_util::sync::CancellationToken,
    ) {
        let mut p = self.lead_poller.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = p.as_ref() {
            if !r.task.is_finished() && r.queue.is(&lead) {
                // The same queue: the relay goes on, for the lead asking now (a lead built on
                // another's queue with `AgentBuilder::pending` is served until its own end).
                r.until.send_replace(until);
                return;
            }
            r.task.abort();
        }
        let Ok(inbox) = self.inbox(LEAD) else { return };
        self.holds().take_over(&lead);
        let mailbox = Arc::clone(&self.mailbox);
        let team = Arc::downgrade(self);
        let queue = lead.clone();
        // What earlier relays of this queue took; a new queue (another lead's) starts afresh,
        // and gets the letters the old one had not acknowledged.
        let seen = {
            let mut shared = self.lead_seen.lock().unwrap_or_else(|e| e.into_inner());
            shared.retain(|(q, _)| !q.is_gone());
            match shared.iter().find(|(q, _)| q.is(&lead)) {
                Some((_, seen)) => Arc::clone(seen),
                None => {
                    let seen = Arc::new(Taken::default());
                    shared.push((lead.downgrade(), Arc::clone(&seen)));
                    seen
                }
            }
        };
        let (watched, latest) = tokio::sync::watch::channel(until);
        let give_up = tokio_util::sync::CancellationToken::new();
        let given_up = give_up.clone();
        let relay = tokio::spawn(async move {
            let mut relay = Relay::new(mailbox, inbox, queue, team.clone(), None);
            relay.seen = seen;
            loop {
                let intercept = |d: &crate::mailbox::Delivered| {
                    if team.upgrade().is_some_and(|team| team.take_bookkeeping(d)) {
                        Intercept::Take
                    } else {
                        Intercept::Show
                    }
                };
                let until = latest.borrow().clone();
                let stepped = {
                    let step = relay.step(intercept);
                    tokio::select! {
                        biased;
                        () = given_up.cancelled() => None,
                        () = until.cancelled() => {
                            if latest.borrow().is_cancelled() {
                                return;
                            }
                            // A newer lead took this queue over: go on for it.
                            continue;
                        }
                        r = step => Some(r.is_err()),
                    }
                };
                // Given up ([`Team::shut_down`]): the last letters in, all acknowledged.
                let Some(failed) = stepped else {
                    relay.give_up(intercept, until).await;
                    return;
                };
                if failed {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        *p = Some(LeadRelay {
            task: relay,
            queue: lead,
            until: watched,
            give_up,
        });
    }
}

impl Control {
    /// For [`ShutdownPolicy::Ask`]: the teammate's queue and the question for its
    /// conversation; `None` when the request is simply approved.
    fn queue_text(
        &self,
        policy: ShutdownPolicy,
        request_id: &str,
        letter: &crate::mailbox::Delivered,
    ) -> Option<(PendingQueue, String)> {
        (policy == ShutdownPolicy::Ask).then(|| {
            (
                self.queue.clone(),
                format!(
                    "{}\nThe lead asks you to shut down. Answer with SendMessage to `{LEAD}`: \
                     {{\"type\":\"shutdown_response\",\"request_id\":{},\
                     \"approve\":true}} to end after this tool round, or \"approve\":false \
                     with a \"reason\" to keep working.",
                    letter.to_message(),
                    // As a JSON string: the id came in a letter, and may hold anything.
                    serde_json::Value::from(request_id)
                ),
            )
        })
    }
}

/// A hold [`Team::send`] made, released unless the send stored the letter (`key` taken).
struct Unsent<'a> {
    team: &'a Team,
    key: Option<(String, String)>,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let released = self.team.holds().letters.remove(&key);
            drop(released);
        }
    }
}

/// Moves one inbox's letters into an agent's pending queue, at least once on the wire and once
/// into the conversation: a letter is acknowledged only once the conversation has recorded it
/// (its message's [`Receipt`](crate::base::pending::Receipt) answered `true`: after the
/// transcript has it, when the agent keeps one), and an id is never put in twice. A letter
/// whose message is dropped unrecorded (a failed transcript write, an agent dropped with it
/// queued) is forgotten and put in again from the inbox. Letters acknowledged no longer hold
/// the lead's run.
struct Relay {
    mailbox: Arc<dyn Mailbox>,
    inbox: Inbox,
    queue: PendingQueue,
    team: Weak<Team>,
    /// The teammate it serves (`None`: the lead).
    teammate: Option<String>,
    /// Ids already taken — every one not yet acknowledged, and the most recent [`SEEN`] of
    /// those that are: a copy delivered again is not put in twice. Shared by the lead's relays
    /// of one queue ([`Team::lead_seen`]), with what their conversation has recorded.
    seen: Arc<Taken>,
    unacked: Vec<String>,
    /// On a worker: letters taken that its lead has not been told of yet (told again at each
    /// step until it is).
    untold: Vec<String>,
}

/// The letters relays of one queue have taken ([`Recent`]), and what became of each: the
/// receipt of a letter's message answers here, and wakes whoever waits to acknowledge it.
#[derive(Default)]
struct Taken {
    recent: Mutex<Recent>,
    /// Woken (all waiters) whenever a receipt answers.
    answered: tokio::sync::Notify,
}

/// What became of a letter taken into a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Its message waits in the queue, or is being recorded.
    Waiting,
    /// The conversation holds it (or it was acknowledged already): acknowledge it.
    Recorded,
    /// Its message was dropped unrecorded: forgotten, to be put in again from the inbox.
    Dropped,
}

impl Taken {
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `message`, with a receipt that answers for letter `id` here.
    fn tracked(self: &Arc<Self>, id: &str, mut message: PendingMessage) -> PendingMessage {
        let (taken, id) = (Arc::clone(self), id.to_owned());
        let earlier = message.receipt.take();
        message.with_receipt(move |recorded| {
            if let Some(r) = earlier {
                r.answer(recorded);
            }
            taken.recent().answered(id, recorded);
            taken.answered.notify_waiters();
        })
    }

    /// Letter `id` was taken without a message (acted on, or the team's bookkeeping): nothing
    /// is to wait for, it is acknowledged as it is.
    fn taken_as_is(&self, id: &str) {
        let mut recent = self.recent();
        if recent.live.contains(id) {
            recent.recorded.insert(id.to_owned());
        }
    }

    /// `ids` split by fate: those recorded, and whether any still waits. Dropped ones are in
    /// neither.
    fn sort(&self, ids: &[String]) -> (Vec<String>, bool) {
        let recent = self.recent();
        let mut recorded = Vec::new();
        let mut waiting = false;
        for id in ids {
            match recent.fate(id) {
                Fate::Recorded => recorded.push(id.clone()),
                Fate::Waiting => waiting = true,
                Fate::Dropped => {}
            }
        }
        (recorded, waiting)
    }

    /// Waits until none of `ids` waits any more; what was recorded of them.
    async fn settled(&self, ids: &[String]) -> Vec<String> {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let (recorded, waiting) = self.sort(ids);
            if !waiting {
                return recorded;
            }
            answered.await;
        }
    }
}

/// How many acknowledged letter ids a relay remembers (for a copy delivered again).
const SEEN: usize = 4096;

/// Ids taken: every one not yet acknowledged (`live`: still in the inbox, so never forgotten
/// — a forgotten one would be put in again at the next look, and then the next one forgotten,
/// a flood of copies once more than [`SEEN`] wait), and the most recent [`SEEN`] of the
/// acknowledged ones.
#[derive(Default)]
struct Recent {
    set: HashSet<String>,
    order: std::collections::VecDeque<String>,
    live: HashSet<String>,
    /// Live ones the conversation has recorded (their receipt answered `true`).
    recorded: HashSet<String>,
}

impl Recent {
    fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    /// Remembers `id` (among the most recent [`SEEN`]).
    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            self.trim();
        }
    }

    /// Takes `id`, unacknowledged: remembered until [`settled`](Self::settled), and then
    /// among the most recent [`SEEN`].
    fn take(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.live.insert(id.clone());
            self.order.push_back(id);
        }
    }

    /// The live letters the conversation has recorded: acknowledged next.
    fn recorded_live(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .recorded
            .iter()
            .filter(|id| self.live.contains(*id))
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// `ids` are acknowledged: gone from the inbox, forgotten once [`SEEN`] newer ones are.
    fn settled(&mut self, ids: &[String]) {
        for id in ids {
            self.live.remove(id);
            self.recorded.remove(id);
        }
        self.trim();
    }

    /// The receipt of live letter `id`'s message answered: recorded, or dropped (forgotten,
    /// so the next look at the inbox takes it again).
    fn answered(&mut self, id: String, recorded: bool) {
        if !self.live.contains(&id) {
            return;
        }
        if recorded {
            self.recorded.insert(id);
        } else {
            // Forgotten outright, its place in the order too: taken again, it is as new.
            self.live.remove(&id);
            self.set.remove(&id);
            self.order.retain(|o| *o != id);
        }
    }

    /// What became of letter `id`.
    fn fate(&self, id: &str) -> Fate {
        if !self.set.contains(id) {
            Fate::Dropped
        } else if !self.live.contains(id) || self.recorded.contains(id) {
            Fate::Recorded
        } else {
            Fate::Waiting
        }
    }

    fn trim(&mut self) {
        // Oldest first; one still unacknowledged goes to the back. There is an acknowledged
        // one to find whenever more than `SEEN` are.
        while self.set.len() - self.live.len() > SEEN {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if self.live.contains(&old) {
                self.order.push_back(old);
            } else {
                self.set.remove(&old);
            }
        }
    }
}

impl Relay {
    fn new(
        mailbox: Arc<dyn Mailbox>,
        inbox: Inbox,
        queue: PendingQueue,
        team: Weak<Team>,
        teammate: Option<String>,
    ) -> Self {
        Self {
            mailbox,
            inbox,
            queue,
            team,
            teammate,
            seen: Arc::default(),
            unacked: Vec::new(),
            untold: Vec::new(),
        }
    }

    /// Whether `id` is new to the relays sharing [`seen`](Self::seen), marking it seen: one
    /// step, so two relays of one queue never both take a letter.
    fn first_sight(&self, id: &str) -> bool {
        let mut seen = self.seen.recent();
        if seen.contains(id) {
            return false;
        }
        seen.take(id.to_owned());
        true
    }

    /// Ends the relay for good: the letters in the inbox now are put in the queue (through
    /// `intercept`, as [`step`](Self::step) puts them), so the conversation has them at its
    /// next run. They and those put in before are acknowledged once the conversation has
    /// recorded them — by a task that waits for their receipts, or for `until` (the lead's
    /// token): a lead that ends first, or is dropped with them queued, leaves them in the
    /// inbox, and a lead restarted from its transcript gets them again (letters to a
    /// restarted lead are at least once). The task holds no queue: once every receipt has
    /// answered (a dropped message answers `false`) or `until` fires, it ends, its
    /// acknowledgement bounded by [`CONFIRM_LIMIT`].
    async fn give_up(
        &mut self,
        mut intercept: impl FnMut(&crate::mailbox::Delivered) -> Intercept,
        until: tokio_util::sync::CancellationToken,
    ) {
        let mut rest = std::mem::take(&mut self.unacked);
        match self.mailbox.receive(&self.inbox).await {
            Ok(letters) => {
                for d in letters {
                    if !self.first_sight(&d.id) {
                        continue;
                    }
                    match intercept(&d) {
                        Intercept::Show => {
                            self.queue.push(self.seen.tracked(
                                &d.id,
                                PendingMessage::new(d.to_message(), MAILBOX_ORIGIN),
                            ))
                        }
                        Intercept::Instead(message) => {
                            self.queue.push(self.seen.tracked(&d.id, message));
                        }
                        // The team's own bookkeeping, taken as the relay takes it.
                        Intercept::Take | Intercept::TakeToWork => self.seen.taken_as_is(&d.id),
                    }
                    rest.push(d.id);
                }
            }
            Err(e) => tracing::warn!("could not read the lead's last letters: {e}"),
        }
        if rest.is_empty() {
            return;
        }
        let (mailbox, inbox, team, seen) = (
            Arc::clone(&self.mailbox),
            self.inbox.clone(),
            self.team.clone(),
            Arc::clone(&self.seen),
        );
        drop(tokio::spawn(async move {
            let recorded = tokio::select! {
                biased;
                () = until.cancelled() => return,
                recorded = seen.settled(&rest) => recorded,
            };
            if recorded.is_empty() {
                return;
            }
            ack_last(&*mailbox, &inbox, &seen, &team, LEAD, &recorded).await;
        }));
    }

    /// Acknowledges the letters waiting for it that the conversation has recorded, and lets
    /// go of those whose message was dropped unrecorded (the next look at the inbox takes them
    /// again); whether any was either. An error leaves the recorded ones to be tried again.
    async fn settle_answered(&mut self) -> Result<bool> {
        let (recorded, _) = self.seen.sort(&self.unacked);
        let before = self.unacked.len();
        {
            let recent = self.seen.recent();
            self.unacked.retain(|id| recent.fate(id) != Fate::Dropped);
        }
        let dropped = self.unacked.len() != before;
        if recorded.is_empty() {
            return Ok(dropped);
        }
        self.ack(&recorded).await?;
        self.unacked.retain(|id| !recorded.contains(id));
        Ok(true)
    }

    async fn ack(&mut self, ids: &[String]) -> Result<()> {
        // On a task of its own: a letter acted on at once (a shutdown request) may end this
        // relay with its teammate while the store is still answering, and its
        // acknowledgement must land all the same — or it stays in the inbox for good.
        // Bounded, so the task ends on its own against a store that never answers.
        let (mailbox, inbox, owned) = (Arc::clone(&self.mailbox), self.inbox.clone(), ids.to_vec());
        let ack =
            async move { tokio::time::timeout(CONFIRM_LIMIT, mailbox.ack(&inbox, &owned)).await };
        match tokio::spawn(ack).await {
            Ok(Ok(acked)) => acked?,
            Ok(Err(_)) => {
                return Err(Error::Mailbox {
                    inbox: self.inbox.to_string(),
                    message: format!(
                        "acknowledging letters: the store did not answer within {}",
                        crate::base::events::format_duration(CONFIRM_LIMIT)
                    ),
                });
            }
            Err(e) => {
                return Err(Error::Mailbox {
                    inbox: self.inbox.to_string(),
                    message: format!("acknowledging letters: the acknowledgement stopped: {e}"),
                });
            }
        }
        self.seen.recent().settled(ids);
        if let Some(team) = self.team.upgrade() {
            team.taken(self.teammate.as_deref().unwrap_or(LEAD), ids);
            // A teammate on a worker tells its lead (in another process) what it took: until
            // it has, at every step.
            if matches!(team.side, Side::Member(_)) {
                self.untold.extend_from_slice(ids);
            }
        }
        self.tell_taken().await
    }

    /// Tells the lead of the letters taken that it was not told of yet (a teammate on a
    /// worker); an error leaves them to be told at the next step.
    async fn tell_taken(&mut self) -> Result<()> {
        if self.untold.is_empty() {
            return Ok(());
        }
        let (Some(team), Some(me)) = (self.team.upgrade(), &self.teammate) else {
            return Ok(());
        };
        let Some(task) = team.member(me).map(|m| m.task) else {
            self.untold.clear();
            return Ok(());
        };
        let mut note = Bookkeeping::new(BookOp::Taken, &task);
        note.ids = self.untold.clone();
        team.tell_lead(me, &note).await?;
        self.untold.clear();
        Ok(())
    }

    /// Acknowledges what the conversation has taken, waits for letters and relays the new
    /// ones; `intercept` takes a letter instead (a shutdown request) unless it says
    /// [`Intercept::Show`]. An error leaves everything unacknowledged to be tried again.
    async fn step(
        &mut self,
        mut intercept: impl FnMut(&crate::mailbox::Delivered) -> Intercept,
    ) -> Result<()> {
        self.tell_taken().await?;
        let woke = if self.unacked.is_empty() {
            self.mailbox
                .wait(&self.inbox, Duration::from_secs(3600))
                .await?
        } else {
            // Until the conversation has recorded what was put in its queue (each message's
            // receipt says when: no polling) — or a new letter comes, which may be one to act
            // on now (a shutdown request for a teammate busy with a long tool).
            let seen = Arc::clone(&self.seen);
            let answered = seen.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.settle_answered().await? {
                return Ok(());
            }
            tokio::select! {
                () = answered => {
                    self.settle_answered().await?;
                    return Ok(());
                }
                new = self.mailbox.wait_beyond(
                    &self.inbox,
                    &self.unacked,
                    Duration::from_secs(3600),
                ) => new?,
            }
        };
        if !woke {
            return Ok(());
        }
        let mut taken = Vec::new();
        let mut new = 0;
        let mut working = false;
        for d in self.mailbox.receive(&self.inbox).await? {
            if !self.first_sight(&d.id) {
                // Taken before (a copy sent again after the first was acknowledged, an
                // acknowledgement that failed, or a letter an earlier relay of this queue put
                // in and left): acknowledged once the queue is drained, not put in again.
                if !self.unacked.contains(&d.id) {
                    self.unacked.push(d.id);
                }
                continue;
            }
            new += 1;
            match intercept(&d) {
                Intercept::Show => {}
                Intercept::Take => {
                    self.seen.taken_as_is(&d.id);
                    taken.push(d.id);
                    continue;
                }
                Intercept::TakeToWork => {
                    self.seen.taken_as_is(&d.id);
                    working = true;
                    taken.push(d.id);
                    continue;
                }
                Intercept::Instead(message) => {
                    // Acknowledged once the conversation has it, like a letter shown.
                    let message = self.seen.tracked(&d.id, message);
                    match (&self.teammate, self.team.upgrade()) {
                        (Some(name), Some(team)) => team.deliver_to(name, &self.queue, message),
                        _ => self.queue.push(message),
                    }
                    self.unacked.push(d.id);
                    continue;
                }
            }
            let message = self
                .seen
                .tracked(&d.id, PendingMessage::new(d.to_message(), MAILBOX_ORIGIN));
            match (&self.teammate, self.team.upgrade()) {
                (Some(name), Some(team)) => team.deliver_to(name, &self.queue, message),
                _ => self.queue.push(message),
            }
            self.unacked.push(d.id);
        }
        if working && let (Some(team), Some(me)) = (self.team.upgrade(), &self.teammate) {
            // Busy before the letter's hold goes: the lead's run never ends in between.
            team.report_state(me, true, &tokio_util::sync::CancellationToken::new())
                .await;
        }
        if !taken.is_empty() {
            self.ack(&taken).await?;
        } else if new == 0 {
            // Nothing new and nothing to acknowledge: another reader's view of the inbox.
            // Look again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// What a relay does with a letter.
#[derive(Debug)]
enum Intercept {
    /// Into the conversation.
    Show,
    /// Taken (acknowledged), not shown.
    Take,
    /// Taken, and the teammate works on it (a shutdown): on a worker, it tells its lead it is
    /// busy before the letter is acknowledged.
    TakeToWork,
    /// Shown as this message instead (a plan answer), acknowledged as a letter shown is.
    Instead(PendingMessage),
}

/// How long a teammate told to stop may take before it is cancelled, unless the team says
/// otherwise ([`Team::with_shutdown_grace`]): longer than a tool call's default timeout (two
/// minutes), so a teammate in an ordinary tool round always finishes it; the grace ends only
/// what would otherwise not end — a tool without a timeout, a model answer that does not.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3 * 60);

/// How long [`Team::shut_down`] waits past the team's shutdown grace for the teammates it
/// cancelled then to end, and for their owners to finish them (a worktree's owner asks git
/// about it).
pub const SHUT_DOWN_MARGIN: Duration = Duration::from_secs(10);

/// How long a teammate on a worker keeps trying to confirm its shutdown to its lead once its
/// run was cancelled.
const CONFIRM_LIMIT: Duration = Duration::from_secs(10);

/// How long a lead's claim on its mailbox may take ([`Team::claim_lead`]): longer than a
/// networked store's own retries of one command, so only a store that has stopped answering
/// fails it.
const CLAIM_LIMIT: Duration = Duration::from_secs(30);

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Marks a teammate stopped when its run ends, however it ends (returned, cancelled, panicked,
/// dropped by its owner).
struct StopOnDrop {
    team: Arc<Team>,
    name: String,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.team.stopped(&self.name);
    }
}

/// `next`, a teammate's latest run, with the usage of its runs before it (`before`, which
/// holds theirs) added: its task's notification, record and report count its whole life in
/// tokens, as they do in tool uses and time.
fn and_then(before: &AgentRun, mut next: AgentRun) -> AgentRun {
    next.usage += before.usage;
    next
}

/// The teammate loop for `name` in `team`, starting with `prompt` (see the module docs).
pub(crate) fn teammate_run(team: Arc<Team>, name: String, prompt: String) -> CustomRun {
    // Made before the run exists: a teammate whose run is dropped before it starts (its start
    // failed, or it was stopped behind a gate) is stopped on the roster all the same.
    let stop_on_drop = StopOnDrop {
        team: Arc::clone(&team),
        name: name.clone(),
    };
    Box::new(move |agent: &mut Agent, promise: PromiseHandle| {
        Box::pin(async move {
            let queue = agent.pending();
            let token = agent.cancellation().clone();
            let overdue: Arc<std::sync::OnceLock<Duration>> = Arc::default();
            let (stop_tx, mut stop_rx) = watch::channel::<Option<String>>(None);
            {
                team.holds().hold(&name, promise);
                let control = Control {
                    halt: agent.halt(),
                    stop: stop_tx,
                    asked: None,
                    seen: Seen::new(),
                    queue: queue.clone(),
                    cancel: token.clone(),
                    overdue: Arc::clone(&overdue),
                };
                team.arm(&name, *agent.id(), control);
            }
            let relay = match team.inbox(&name) {
                Ok(inbox) => {
                    let mut relay = Relay::new(
                        Arc::clone(team.mailbox()),
                        inbox.clone(),
                        queue.clone(),
                        Arc::downgrade(&team),
                        Some(name.clone()),
                    );
                    let mut end = RelayEnd {
                        relay: None,
                        seen: Arc::clone(&relay.seen),
                        mailbox: Arc::clone(team.mailbox()),
                        inbox,
                        team: Arc::downgrade(&team),
                        name: name.clone(),
                    };
                    let (team, name, token) = (Arc::clone(&team), name.clone(), token.clone());
                    let task = AbortOnDrop(tokio::spawn(async move {
                        loop {
                            let mut state_asked = false;
                            let r = relay
                                .step(|d| {
                                    // The team's own bookkeeping is taken, never shown; a
                                    // restarted lead's `ask` is answered with its state.
                                    if Bookkeeping::claimed(&d.text) {
                                        state_asked |= d.from == LEAD
                                            && Bookkeeping::parse(&d.text)
                                                .is_some_and(|n| n.op == BookOp::Ask);
                                        return Intercept::Take;
                                    }
                                    match Protocol::parse(&d.text) {
                                        // Control letters meant for an earlier teammate of this
                                        // name are taken and not acted on.
                                        Some(
                                            Protocol::ShutdownRequest { .. }
                                            | Protocol::PlanApprovalResponse { .. },
                                        ) if team.stale(&name, d) => Intercept::Take,
                                        // Only the lead may stop a teammate. Acted on before
                                        // its letter is acknowledged: beside its lead, its
                                        // promise is up before the letter's hold goes; on a
                                        // worker, it says it is busy first.
                                        Some(request @ Protocol::ShutdownRequest { .. })
                                            if d.from == LEAD =>
                                        {
                                            team.shutdown_asked(&name, &request, d);
                                            Intercept::TakeToWork
                                        }
                                        // Plan answers go through the teammate's gate: the
                                        // lead's only, once each.
                                        Some(Protocol::PlanApprovalResponse { .. }) => {
                                            match team.answer_plan(&name, d) {
                                                Some(text) => {
                                                    Intercept::Instead(PendingMessage::new(
                                                        text,
                                                        MAILBOX_CONTROL_ORIGIN,
                                                    ))
                                                }
                                                None => Intercept::Take,
                                            }
                                        }
                                        _ => Intercept::Show,
                                    }
                                })
                                .await;
                            if state_asked {
                                team.report_current_state(&name, &token).await;
                            }
                            if r.is_err() {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }));
                    end.relay = Some(task);
                    Some(end)
                }
                Err(e) => {
                    tracing::warn!("teammate `{name}` has no inbox: {e}");
                    None
                }
            };
            team.busy(&name);
            team.report_state(&name, true, &token).await;
            let mut run = agent.run(prompt).await;
            loop {
                if run.stop != StopReason::Completed || stop_rx.borrow().is_some() {
                    break;
                }
                // Letters that came as it finished: straight on with them.
                if !queue.is_empty() {
                    team.busy(&name);
                    team.report_state(&name, true, &token).await;
                    run = and_then(&run, agent.run_pending().await);
                    continue;
                }
                let idle = Protocol::IdleNotification {
                    from: name.clone(),
                    timestamp: crate::mailbox::timestamp_now(),
                    idle_reason: IdleReason::Available,
                    summary: Some(run.final_text.chars().take(200).collect()),
                    completed_task_id: None,
                };
                // Sent before the promise is set down: the lead's run waits until the notice
                // is in its conversation.
                if matches!(team.side, Side::Member(_)) {
                    team.to_lead_until_stored(idle.to_letter(name.clone()), &token)
                        .await;
                } else if let Err(e) = team.send(LEAD, idle.to_letter(name.clone())).await {
                    tracing::warn!("teammate `{name}` could not tell the lead it is idle: {e}");
                }
                if !team.rest(&name, &queue) {
                    team.busy(&name);
                    team.report_state(&name, true, &token).await;
                    run = and_then(&run, agent.run_pending().await);
                    continue;
                }
                // After its idle notice, in the same order: the lead sets its promise down
                // (the state `rest` numbered, or a newer one).
                team.report_current_state(&name, &token).await;
                // Idle: until a letter, the lead's shutdown request, or cancellation.
                let hold = queue.expect();
                // The letters stay queued until it has said it is busy: on a worker, its relay
                // tells the lead it took them only once they are drained, after that.
                // A shutdown asked for is looked at first: an idle teammate ends at once when
                // asked, so a cancel that comes with the request (a shutdown grace of zero)
                // does not turn its shutdown into a kill.
                let woke = tokio::select! {
                    biased;
                    _ = stop_rx.wait_for(Option::is_some) => Woke::Ends,
                    () = agent.cancellation().cancelled() => Woke::Cancelled,
                    arrived = queue.arrived() => if arrived { Woke::Work } else { Woke::Ends },
                };
                drop(hold);
                let woke = match woke {
                    // Its team gone (the request channel closed) is no request: a cancel
                    // counts.
                    Woke::Ends
                        if stop_rx.borrow().is_none() && agent.cancellation().is_cancelled() =>
                    {
                        Woke::Cancelled
                    }
                    // Cancelled by a shutdown's deadline under `Approve`: it was asked to shut
                    // down, and idle it ends at once when asked — the request may only not
                    // have reached it yet (a grace of zero). It ends as shut down.
                    Woke::Cancelled
                        if overdue.get().is_some()
                            && team.shutdown_policy() == ShutdownPolicy::Approve =>
                    {
                        Woke::Ends
                    }
                    w => w,
                };
                match woke {
                    // Cancelled, not asked to stop: it ends `cancelled` like any cancelled
                    // agent, through its own loop (its stop record and `Stopped` event), and
                    // its task ends `killed`. What its last run answered stays its result.
                    Woke::Cancelled => {
                        let ended = agent.run_pending().await;
                        run.stop = ended.stop;
                        run.usage += ended.usage;
                        // A stop record it could not write is said, as any run says it.
                        if ended.error.is_some() {
                            run.error = ended.error;
                        }
                        break;
                    }
                    // Asked to shut down, or nothing more will come: it finished.
                    Woke::Ends => break,
                    Woke::Work => {}
                }
                team.busy(&name);
                team.report_state(&name, true, &token).await;
                run = and_then(&run, agent.run_pending().await);
            }
            if let Some(grace) = overdue.get()
                && run.stop == StopReason::Cancelled
                && run.error.is_none()
            {
                run.error = Some(Arc::new(Error::Refused(format!(
                    "its shutdown was not done within the team's shutdown grace of {grace:?}, so \
                     it was cancelled"
                ))));
            }
            let asked = stop_rx.borrow().clone();
            if let Some(request_id) = asked {
                let ok = Protocol::ShutdownApproved {
                    request_id,
                    from: name.clone(),
                    timestamp: crate::mailbox::timestamp_now(),
                };
                if matches!(team.side, Side::Member(_)) {
                    // Tried for a while even when the run was cancelled (a shutdown past its
                    // grace), not given up at the first failure with the run's token.
                    let own = tokio_util::sync::CancellationToken::new();
                    let confirm = team.to_lead_until_stored(ok.to_letter(name.clone()), &own);
                    if tokio::time::timeout(CONFIRM_LIMIT, confirm).await.is_err() {
                        tracing::warn!("teammate `{name}` could not confirm its shutdown in time");
                    }
                } else if let Err(e) = team.send(LEAD, ok.to_letter(name.clone())).await {
                    tracing::warn!("teammate `{name}` could not confirm its shutdown: {e}");
                }
            }
            drop(relay);
            drop(stop_on_drop);
            run
        })
    })
}

/// A teammate's relay, ended when this is dropped — its run returned, or its future was
/// dropped: the relay stops, and the letters the conversation recorded that it had not
/// acknowledged yet (it acknowledges between steps, and the teammate may end first — asked to
/// shut down right after a letter) are acknowledged on a task of their own, bounded by
/// [`CONFIRM_LIMIT`]; the teammate's end does not wait for the store. Left unacknowledged,
/// they would stay in the inbox and reach the next teammate of the name as unread.
struct RelayEnd {
    relay: Option<AbortOnDrop>,
    seen: Arc<Taken>,
    mailbox: Arc<dyn Mailbox>,
    inbox: Inbox,
    team: Weak<Team>,
    name: String,
}

impl Drop for RelayEnd {
    fn drop(&mut self) {
        drop(self.relay.take());
        let recorded = self.seen.recent().recorded_live();
        if recorded.is_empty() {
            return;
        }
        // With no runtime left (it shut down), they stay in the inbox.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (seen, mailbox, inbox, team, name) = (
            Arc::clone(&self.seen),
            Arc::clone(&self.mailbox),
            self.inbox.clone(),
            self.team.clone(),
            std::mem::take(&mut self.name),
        );
        drop(rt.spawn(async move {
            ack_last(&*mailbox, &inbox, &seen, &team, &name, &recorded).await;
        }));
    }
}

/// Acknowledges `recorded`, the last letters a relay of `recipient`'s inbox leaves (it ended:
/// the lead gave its team up, or the teammate ended), bounded by [`CONFIRM_LIMIT`]; a store that
/// fails or does not answer leaves them in the inbox, said in the log.
async fn ack_last(
    mailbox: &dyn Mailbox,
    inbox: &Inbox,
    seen: &Taken,
    team: &Weak<Team>,
    recipient: &str,
    recorded: &[String],
) {
    match tokio::time::timeout(CONFIRM_LIMIT, mailbox.ack(inbox, recorded)).await {
        Ok(Ok(())) => {
            seen.recent().settled(recorded);
            if let Some(team) = team.upgrade() {
                team.taken(recipient, recorded);
            }
        }
        Ok(Err(e)) => tracing::warn!(
            "could not acknowledge the last letters of `{inbox}`: {e}; they stay in its inbox"
        ),
        Err(_) => tracing::warn!(
            "the store did not acknowledge the last letters of `{inbox}` within {}; they may \
             stay in its inbox",
            crate::base::events::format_duration(CONFIRM_LIMIT)
        ),
    }
}

/// What ended an idle teammate's wait for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// A letter: it works on it.
    Work,
    /// Asked to shut down, or nothing more will reach it: it has finished.
    Ends,
    /// Cancelled: it ends as a cancelled agent.
    Cancelled,
}

/// For a tool that starts teammates ([`Tool::check_tree`](crate::tool::Tool::check_tree)):
/// with `teams` on, the lead's tree must hold a [`Team`].
pub(crate) fn check_teams(
    teams: bool,
    tree: &crate::base::state::TreeState,
) -> std::result::Result<(), String> {
    if teams && tree.extensions().get::<Team>().is_none() {
        return Err(
            "the `Agent` tool starts teammates (teams are on), but the agent has no \
                    `Team`: give it one with `.extension(Arc::new(Team::new(name, mailbox)?))`, \
                    or turn teams off"
                .to_owned(),
        );
    }
    Ok(())
}

/// The team `team_name` that the agent `me` of `tree` leads and may start teammates in — or
/// why not, as its `Agent` call's error: no team, another team, or `me` not its lead (the
/// team is flat).
pub(crate) fn led_by(
    tree: &crate::base::state::TreeState,
    team_name: &str,
    me: &crate::runtime::AgentContext,
) -> std::result::Result<Arc<Team>, String> {
    let Some(team) = tree.extensions().get::<Team>() else {
        return Err(format!(
            "no team `{team_name}` here: the host has made no team"
        ));
    };
    if team.name() != team_name {
        return Err(format!(
            "no team `{team_name}` here; this agent's team is `{}`",
            team.name()
        ));
    }
    if team.name_of(me.id()).is_some() || me.depth() > 0 {
        return Err("only the team's lead starts teammates: the team is flat".to_owned());
    }
    Ok(team)
}

/// A teammate's first message: who it is in which team and how it talks to the team, then its
/// task ("Claude Code Multi-Agent Internals — 6.4 Teammates get team-aware prompts and tool
/// injection", "6.5 Teammate output is not automatically surfaced back to the leader"). In the
/// message, not the system prompt, so every teammate of a type shares one cached prefix.
pub(crate) fn teammate_prompt(team: &str, name: &str, plan_mode: bool, task: &str) -> String {
    let plan = if plan_mode {
        " You are in plan mode: only read-only tools run until the lead approves your plan. \
         Send it with SendMessage to `team-lead`, message {\"type\":\"plan_approval_request\",\
         \"plan\":\"…\"}, and wait for the answer."
    } else {
        ""
    };
    format!(
        "<teammate-context>You are `{name}`, a teammate in team `{team}`. Your lead is \
         `{LEAD}`. What you write is not shown to anyone: send what the lead or a teammate must \
         know with SendMessage (`to`: `{LEAD}`, a teammate's name, or `*` for everyone). \
         Letters reach you as <teammate-message> blocks. When you are done with a task, end \
         your turn: you wait, idle, for the next letter.{plan}</teammate-context>\n\n{task}"
    )
}

/// Whether a letter's text is a control letter a teammate's run takes, not a message for its
/// model: a shutdown request or the team's bookkeeping.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn is_control(text: &str) -> bool {
    Bookkeeping::claimed(text)
        || matches!(
            Protocol::parse(text),
            Some(Protocol::ShutdownRequest { .. })
        )
}

/// A lead's shutdown request for a teammate.
pub fn shutdown_request(reason: Option<String>) -> Protocol {
    Protocol::ShutdownRequest {
        request_id: crate::mailbox::new_id(),
        from: LEAD.to_owned(),
        reason,
        timestamp: crate::mailbox::timestamp_now(),
    }
}

/// A teammate's permissions in plan mode ([`Team::in_plan_mode`]), on top of the lead's
/// policy: until the lead approves its
/// plan, only read-only tools and `SendMessage` run — whatever the model writes, the permission
/// check holds it ("plan mode auto-approves before review" is a peer's reported bug).
#[derive(Debug)]
pub(crate) struct PlanMode {
    team: Weak<Team>,
    name: String,
}

impl PlanMode {
    pub(crate) fn new(team: &Arc<Team>, name: &str) -> Self {
        Self {
            team: Arc::downgrade(team),
            name: name.to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl crate::tool::PermissionPolicy for PlanMode {
    async fn check(
        &self,
        request: crate::tool::permission::PermissionRequest<'_>,
    ) -> crate::tool::permission::PermissionDecision {
        use crate::tool::permission::PermissionDecision;
        let Some(team) = self.team.upgrade() else {
            return PermissionDecision::Allow;
        };
        if !team.in_plan_mode(&self.name)
            || request.tool.is_read_only()
            || request.tool_name() == crate::base::pending::SEND_MESSAGE
        {
            return PermissionDecision::Allow;
        }
        let tool = request.tool_name();
        PermissionDecision::deny(if team.awaiting_plan(&self.name) {
            format!(
                "plan mode: `{tool}` waits until the lead approves your plan; it has your \
                 request and will answer"
            )
        } else {
            format!(
                "plan mode: `{tool}` may run once the lead approves your plan; send it with \
                 SendMessage to `{LEAD}`, message {{\"type\":\"plan_approval_request\",\
                 \"plan\":\"…\"}}"
            )
        })
    }
}

/// What a [`Team::join`] changed, for [`Team::withdraw`] to undo.
#[derive(Debug)]
pub(crate) struct Joined {
    name: String,
    task: TaskId,
    /// The stopped member of the name it replaced.
    replaced: Option<Member>,
    /// When that member had joined.
    joined_before: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::mailbox::{Delivered, MemoryMailbox};

    /// A memory mailbox that fails or hangs on request, and counts reads.
    #[derive(Debug, Default)]
    struct Flaky {
        inner: MemoryMailbox,
        fail_acks: AtomicUsize,
        fail_sends: AtomicBool,
        hang_sends: AtomicBool,
        hang_acks: AtomicBool,
        hang_claims: AtomicBool,
        receives: AtomicUsize,
    }

    #[async_trait]
    impl Mailbox for Flaky {
        async fn send(&self, to: &Inbox, letter: Letter) -> Result<String> {
            if self.hang_sends.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.fail_sends.load(Ordering::SeqCst) {
                return Err(Error::MailboxBusy {
                    path: "x".into(),
                    attempts: 10,
                });
            }
            self.inner.send(to, letter).await
        }
        async fn receive(&self, inbox: &Inbox) -> Result<Vec<Delivered>> {
            self.receives.fetch_add(1, Ordering::SeqCst);
            self.inner.receive(inbox).await
        }
        async fn claim_lead(&self, team: &str) -> Result<crate::mailbox::LeadClaim> {
            if self.hang_claims.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.inner.claim_lead(team).await
        }
        async fn ack(&self, inbox: &Inbox, ids: &[String]) -> Result<()> {
            if self.hang_acks.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self
                .fail_acks
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(Error::Mailbox {
                    inbox: inbox.to_string(),
                    message: "ack failed".into(),
                });
            }
            self.inner.ack(inbox, ids).await
        }
        async fn stored(&self, inbox: &Inbox) -> Result<usize> {
            self.inner.stored(inbox).await
        }
        async fn wait_beyond(
            &self,
            inbox: &Inbox,
            known: &[String],
            timeout: Duration,
        ) -> Result<bool> {
            self.inner.wait_beyond(inbox, known, timeout).await
        }
    }

    /// A team over `Flaky` whose lead's queue is `lead`, with a member `alice` (idle).
    fn team(mail: &Arc<Flaky>) -> (Arc<Team>, PendingQueue) {
        let team = Arc::new(Team::new("t", Arc::clone(mail) as Arc<dyn Mailbox>).unwrap());
        team.join(Member {
            name: "alice".into(),
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            agent_type: "worker".into(),
            state: MemberState::Idle,
        })
        .unwrap();
        let lead = PendingQueue::new();
        team.serve_lead(lead.clone(), tokio_util::sync::CancellationToken::new());
        (team, lead)
    }

    /// Whether the lead's relay has ended.
    fn relay_ended(team: &Team) -> bool {
        team.lead_poller
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|r| r.task.is_finished())
    }

    /// What a run takes from `queue` and records: drained, each receipt answered `true`.
    fn recorded(queue: &PendingQueue) -> Vec<PendingMessage> {
        let taken = queue.drain();
        for m in &taken {
            if let Some(r) = &m.receipt {
                r.answer(true);
            }
        }
        taken
    }

    async fn until(what: &str, mut ok: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !ok() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    /// A send that fails, or whose future is dropped before it stored the letter, does not
    /// leave a hold on the lead's run; a repeated send of one id holds once.
    #[tokio::test]
    async fn a_send_that_did_not_store_holds_nothing() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        mail.fail_sends.store(true, Ordering::SeqCst);
        assert!(team.send("alice", Letter::new(LEAD, "a")).await.is_err());
        assert_eq!(lead.outstanding(), 0);
        mail.fail_sends.store(false, Ordering::SeqCst);
        mail.hang_sends.store(true, Ordering::SeqCst);
        let dropped = tokio::time::timeout(
            Duration::from_millis(20),
            team.send("alice", Letter::new(LEAD, "b")),
        )
        .await;
        assert!(dropped.is_err(), "the send hung and was dropped");
        assert_eq!(lead.outstanding(), 0, "the dropped send released its hold");
        mail.hang_sends.store(false, Ordering::SeqCst);
        let letter = Letter::new(LEAD, "c").with_id("same");
        team.send("alice", letter.clone()).await.unwrap();
        team.send("alice", letter.clone()).await.unwrap();
        assert_eq!(lead.outstanding(), 1, "one id, one hold");
        // A failed repeat does not release the first copy's hold.
        mail.fail_sends.store(true, Ordering::SeqCst);
        assert!(team.send("alice", letter).await.is_err());
        assert_eq!(lead.outstanding(), 1);
        // Alice stops: what she will never take holds nothing.
        team.stopped("alice");
        assert_eq!(lead.outstanding(), 0);
    }

    /// The lead's relay ends with its lead: once the lead's token is cancelled (the lead was
    /// dropped or cancelled), a letter to the lead stays in the inbox instead of going into a
    /// queue nobody reads. A new lead on the same team is then served — also while the first
    /// lead's relay still runs (its lead kept on, `cancel_children_on_drop(false)`): before,
    /// the second lead was silently left without its teammates' letters.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_leads_relay_ends_with_its_lead_and_a_new_lead_is_served() {
        let mail = Arc::new(Flaky::default());
        let (team, _) = team(&mail);
        let first = PendingQueue::new();
        let first_token = tokio_util::sync::CancellationToken::new();
        team.serve_lead(first.clone(), first_token.clone());
        team.send(LEAD, Letter::new("alice", "to the first"))
            .await
            .unwrap();
        until("the letter reached the first lead", || first.len() == 1).await;
        // A second lead while the first's relay runs: it takes over.
        let second = PendingQueue::new();
        let second_token = tokio_util::sync::CancellationToken::new();
        team.serve_lead(second.clone(), second_token.clone());
        team.send(LEAD, Letter::new("alice", "to the second"))
            .await
            .unwrap();
        until("the letter reached the second lead", || {
            recorded(&second)
                .iter()
                .any(|m| m.text.contains("to the second"))
        })
        .await;
        assert_eq!(first.len(), 1, "nothing more went to the first lead");
        // The second lead goes: its relay ends, and letters wait in the inbox.
        second_token.cancel();
        until("the relay ended", || relay_ended(&team)).await;
        team.send(LEAD, Letter::new("alice", "to nobody"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(second.is_empty());
        let inbox = team.inbox(LEAD).unwrap();
        let waiting: Vec<String> = mail
            .receive(&inbox)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.text)
            .collect();
        assert!(waiting.iter().any(|t| t == "to nobody"), "{waiting:?}");
        // A third lead finds it there.
        let third = PendingQueue::new();
        team.serve_lead(third.clone(), tokio_util::sync::CancellationToken::new());
        until("the waiting letter reached the third lead", || {
            recorded(&third)
                .iter()
                .any(|m| m.text.contains("to nobody"))
        })
        .await;
    }

    /// A new lead takes every hold over: a busy teammate's promise, a letter not yet taken
    /// and a worker teammate's last letters are held on its queue and no longer on the first
    /// lead's, and the teammate's end is delivered to it.
    #[tokio::test]
    async fn a_new_lead_takes_every_hold_over() {
        let mail = Arc::new(Flaky::default());
        let (team, first) = team(&mail);
        let owner = crate::base::pending::OwnedPromise::new(&first);
        team.holds().hold("alice", owner.handle());
        team.send("alice", Letter::new(LEAD, "a")).await.unwrap();
        let worker = TaskId::generate(forkhive_core::TaskKind::Agent);
        team.holds().ending.insert(
            worker,
            remote::Ending {
                hold: first.expect(),
                deliver: Box::new(|| {}),
            },
        );
        assert_eq!(first.outstanding(), 3);
        let second = PendingQueue::new();
        team.serve_lead(second.clone(), tokio_util::sync::CancellationToken::new());
        assert_eq!((first.outstanding(), second.outstanding()), (0, 3));
        // Served again on the same queue: nothing moves twice.
        team.serve_lead(second.clone(), tokio_util::sync::CancellationToken::new());
        assert_eq!(second.outstanding(), 3);
        team.holds().ending.remove(&worker);
        team.stopped("alice");
        assert_eq!(second.outstanding(), 1, "her end is still to come");
        owner.deliver(PendingMessage::new("alice ended", "task-notification"));
        assert_eq!((first.len(), second.outstanding()), (0, 0));
        assert_eq!(second.drain()[0].text, "alice ended");
    }

    /// A teammate's promise outside the roster's running set at the moment of a takeover is
    /// taken over all the same: one made on the old lead's queue but held only after the new
    /// lead was served moves when it is held, and one whose teammate stopped on the roster
    /// but whose end is still to be delivered moves with the rest.
    #[tokio::test]
    async fn a_takeover_reaches_promises_held_late_and_ends_still_to_come() {
        let mail = Arc::new(Flaky::default());
        let (team, first) = team(&mail);
        // Stopped on the roster, its end not delivered yet.
        let ending = crate::base::pending::OwnedPromise::new(&first);
        team.holds().hold("alice", ending.handle());
        team.stopped("alice");
        assert_eq!(first.outstanding(), 1);
        // Made on the first lead's queue, held after the second lead is served.
        let late = crate::base::pending::OwnedPromise::new(&first);
        let second = PendingQueue::new();
        team.serve_lead(second.clone(), tokio_util::sync::CancellationToken::new());
        assert_eq!((first.outstanding(), second.outstanding()), (1, 1));
        team.holds().hold("bob", late.handle());
        assert_eq!((first.outstanding(), second.outstanding()), (0, 2));
        ending.deliver(PendingMessage::new("alice ended", "task-notification"));
        late.deliver(PendingMessage::new("bob ended", "task-notification"));
        assert_eq!((first.len(), second.len(), second.outstanding()), (0, 2, 0));
        // Delivered ends are pruned as teammates stop.
        team.stopped("bob");
        assert!(team.holds().finishing.is_empty());
    }

    /// Two leads on one queue (`AgentBuilder::pending`). Served again with `serve_lead`, the
    /// relay goes on until the second lead's end: the first's token cancelled (it was dropped)
    /// does not end it while the second still runs. Served again with
    /// `serve_lead_unless_served` (a lead's `SendMessage`), nothing changes: the first's token
    /// still ends it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn who_ends_the_relay_of_a_queue_two_leads_share() {
        for unless_served in [false, true] {
            let mail = Arc::new(Flaky::default());
            let (team, _) = team(&mail);
            let queue = PendingQueue::new();
            let first = tokio_util::sync::CancellationToken::new();
            let second = tokio_util::sync::CancellationToken::new();
            team.serve_lead(queue.clone(), first.clone());
            if unless_served {
                team.serve_lead_unless_served(queue.clone(), second.clone());
            } else {
                team.serve_lead(queue.clone(), second.clone());
            }
            let (gone, ends) = if unless_served {
                (&second, &first)
            } else {
                (&first, &second)
            };
            gone.cancel();
            team.send(LEAD, Letter::new("alice", "still served"))
                .await
                .unwrap();
            until("the letter reached the queue", || queue.len() == 1).await;
            ends.cancel();
            until("the relay ended", || relay_ended(&team)).await;
        }
    }

    /// The lead's relay acknowledges again after an acknowledgement failed, so the letter's
    /// hold is released; a copy sent again after the first was acknowledged is acknowledged and
    /// not put in twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_relay_recovers_from_a_failed_ack_and_a_resent_id() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        mail.fail_acks.store(1, Ordering::SeqCst);
        let letter = Letter::new("alice", "done").with_id("l1");
        team.send(LEAD, letter.clone()).await.unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        assert_eq!(recorded(&lead).len(), 1);
        until("the hold was released after the ack was retried", || {
            lead.outstanding() == 0
        })
        .await;
        // The same id again, after the first copy was acknowledged.
        team.send(LEAD, letter).await.unwrap();
        until("the copy was acknowledged", || lead.outstanding() == 0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(lead.is_empty(), "the copy was not put in twice");
        assert_eq!(mail.stored(&team.inbox(LEAD).unwrap()).await.unwrap(), 0);
    }

    /// More letters waiting unacknowledged than the relay remembers acknowledged ones: none is
    /// forgotten while it waits, so a new letter brings itself alone, not copies of the oldest
    /// (which were forgotten and put in again, a flood of copies at every later letter).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn more_unacknowledged_letters_than_remembered_are_put_in_once() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        let n = SEEN + 10;
        for i in 0..n {
            team.send(LEAD, Letter::new("alice", format!("letter {i}")))
                .await
                .unwrap();
        }
        until("every letter reached the lead's queue", || lead.len() >= n).await;
        team.send(LEAD, Letter::new("alice", "one more"))
            .await
            .unwrap();
        until("the new letter reached the queue", || lead.len() > n).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lead.len(), n + 1, "each letter put in once");
        recorded(&lead);
        until("acknowledged once recorded", || lead.outstanding() == 0).await;
        assert_eq!(mail.stored(&team.inbox(LEAD).unwrap()).await.unwrap(), 0);
    }

    /// Taken ids are remembered until acknowledged, whatever their number; acknowledged ones
    /// among the most recent [`SEEN`]; plain remembered ones (`insert`) likewise.
    #[test]
    fn taken_ids_are_forgotten_only_once_acknowledged() {
        let mut r = Recent::default();
        let ids: Vec<String> = (0..SEEN + 5).map(|i| format!("l{i}")).collect();
        for id in &ids {
            r.take(id.clone());
        }
        assert!(
            ids.iter().all(|id| r.contains(id)),
            "none forgotten while unacknowledged"
        );
        r.settled(&ids[..10]);
        assert!(
            ids.iter().all(|id| r.contains(id)),
            "{} acknowledged of {} remembered: none to forget yet",
            10,
            ids.len()
        );
        r.settled(&ids);
        assert_eq!(r.set.len(), SEEN);
        assert!(!r.contains("l0") && !r.contains("l4") && r.contains("l5"));
        assert!(r.contains(&format!("l{}", SEEN + 4)));
        let mut plain = Recent::default();
        for i in 0..SEEN + 1 {
            plain.insert(format!("e{i}"));
        }
        assert_eq!(plain.set.len(), SEEN);
        assert!(!plain.contains("e0") && plain.contains("e1"));
    }

    /// Letters waiting in a lead's queue that no run drains cost no reads: the relay waits for
    /// the queue, not the mailbox.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relay_whose_queue_is_not_drained_does_not_poll() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        team.send(LEAD, Letter::new("alice", "one")).await.unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        let before = mail.receives.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(mail.receives.load(Ordering::SeqCst), before);
        recorded(&lead);
        until("acknowledged once recorded", || lead.outstanding() == 0).await;
    }

    /// A lead claim the store never answers fails each caller within [`CLAIM_LIMIT`] of its
    /// turn (the claim is made under a lock, so one at a time), saying what was wrong; the
    /// next claim, once the store answers, succeeds.
    #[tokio::test(start_paused = true)]
    async fn a_lead_claim_the_store_never_answers_fails_in_bounded_time() {
        let mail = Arc::new(Flaky::default());
        let team = Arc::new(Team::new("t", Arc::clone(&mail) as Arc<dyn Mailbox>).unwrap());
        mail.hang_claims.store(true, Ordering::SeqCst);
        let begun = tokio::time::Instant::now();
        let (a, b) = tokio::join!(team.claim_lead(), team.claim_lead());
        for r in [a, b] {
            assert_eq!(
                r.unwrap_err().to_string(),
                "mailbox t/team-lead: claiming the team's lead: the store did not \
                 answer within 30s"
            );
        }
        assert_eq!(begun.elapsed(), CLAIM_LIMIT * 2, "one after the other");
        mail.hang_claims.store(false, Ordering::SeqCst);
        team.claim_lead().await.unwrap();
    }

    /// A team given up ([`Team::give_up`]) with a letter in its lead's queue; the lead built
    /// with `cancel_children_on_drop(false)`, so dropping it cancels nothing.
    async fn given_up_kept_lead() -> (Arc<Flaky>, Arc<Team>, Agent, PendingQueue) {
        let mail = Arc::new(Flaky::default());
        let team = Arc::new(Team::new("t", Arc::clone(&mail) as Arc<dyn Mailbox>).unwrap());
        let lead = Agent::builder(Arc::new(forkhive_transport::ScriptedBackend::from_replies(
            [],
        )))
        .model("m")
        .cancel_children_on_drop(false)
        .build()
        .await
        .unwrap();
        team.serve(&lead);
        let queue = lead.pending();
        team.send(LEAD, Letter::new("alice", "last words"))
            .await
            .unwrap();
        until("the letter reached the lead's queue", || queue.len() == 1).await;
        team.give_up().await;
        (mail, team, lead, queue)
    }

    /// `inbox`'s depth once it is `want`, or what it is after three seconds of looking.
    async fn stored_becomes(mail: &Flaky, inbox: &Inbox, want: usize) -> usize {
        let mut n = mail.stored(inbox).await.unwrap();
        for _ in 0..300 {
            if n == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            n = mail.stored(inbox).await.unwrap();
        }
        n
    }

    /// A letter the relay takes without showing it (a control letter acted on), whose
    /// acknowledgement failed once, is acknowledged at the next look: it has no message, so
    /// no receipt to wait for (it waited for good, its hold keeping the lead's run).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_letter_taken_as_is_whose_ack_failed_is_acknowledged_later() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        team.send("alice", Letter::new(LEAD, "a control letter"))
            .await
            .unwrap();
        assert_eq!(lead.outstanding(), 1, "held");
        mail.fail_acks.store(1, Ordering::SeqCst);
        let mut relay = Relay::new(
            Arc::clone(&mail) as Arc<dyn Mailbox>,
            team.inbox("alice").unwrap(),
            PendingQueue::new(),
            Arc::downgrade(&team),
            Some("alice".into()),
        );
        let relay = tokio::spawn(async move {
            loop {
                if relay.step(|_| Intercept::TakeToWork).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        let inbox = team.inbox("alice").unwrap();
        let left = stored_becomes(&mail, &inbox, 0).await;
        until("the hold was released", || lead.outstanding() == 0).await;
        relay.abort();
        assert_eq!(left, 0);
    }

    /// A given-up lead relay whose last letters include the team's own bookkeeping (taken, not
    /// shown) acknowledges them all once the conversation recorded the rest: it waited for a
    /// receipt the note never has.
    #[tokio::test]
    async fn a_given_up_relay_with_a_note_among_its_last_letters_acknowledges_them() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        team.send(LEAD, Letter::new("alice", "last words"))
            .await
            .unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        let inbox = team.inbox(LEAD).unwrap();
        mail.inner
            .send(
                &inbox,
                Letter::new(
                    "alice",
                    r#"{"type":"forkhive_team_bookkeeping","op":"state","task":"x"}"#,
                ),
            )
            .await
            .unwrap();
        team.give_up().await;
        assert_eq!(
            recorded(&lead).len(),
            1,
            "the lead's run recorded its letter"
        );
        assert_eq!(stored_becomes(&mail, &inbox, 0).await, 0);
    }

    /// An id dropped unrecorded, taken again and acknowledged counts among the most recent
    /// acknowledged ones: its first place in the order does not forget it early.
    #[test]
    fn a_dropped_then_retaken_id_is_remembered_as_recent() {
        let mut r = Recent::default();
        r.take("x".into());
        r.answered("x".into(), false);
        assert!(!r.contains("x"), "forgotten");
        for i in 0..SEEN - 1 {
            r.insert(format!("e{i}"));
        }
        r.take("x".into());
        r.settled(&["x".to_owned()]);
        r.insert("f".into());
        assert!(
            r.contains("x") && !r.contains("e0"),
            "the oldest goes first"
        );
        assert_eq!(r.order.len(), r.set.len(), "no stale places in the order");
    }

    /// A lead's queue served again after another lead's relay (A, then B, then A) does not
    /// get a letter it already holds a second time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lead_served_again_after_another_does_not_get_a_letter_twice() {
        let mail = Arc::new(Flaky::default());
        let (team, a) = team(&mail);
        team.send(LEAD, Letter::new("alice", "once")).await.unwrap();
        until("the letter reached lead a", || a.len() == 1).await;
        let b = PendingQueue::new();
        team.serve_lead(b.clone(), tokio_util::sync::CancellationToken::new());
        until("the unacknowledged letter reached lead b", || b.len() == 1).await;
        team.serve_lead_unless_served(a.clone(), tokio_util::sync::CancellationToken::new());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(recorded(&a).len(), 1, "once");
    }

    /// After a given-up lead is dropped with its letters queued, the team kept for a next
    /// lead, the acknowledgement task ends when that next lead is served (the old queue,
    /// which only the team still held, goes).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_given_up_relays_acknowledgement_ends_when_a_next_lead_is_served() {
        let (mail, team, lead, queue) = given_up_kept_lead().await;
        drop((queue, lead));
        let next = PendingQueue::new();
        team.serve_lead(next.clone(), tokio_util::sync::CancellationToken::new());
        until("the letter reached the next lead", || next.len() == 1).await;
        // The team's relay for the next lead holds the mailbox, and the team: two more.
        until("the old acknowledgement ended", || {
            Arc::strong_count(&mail) == 3
        })
        .await;
        assert_eq!(recorded(&next).len(), 1);
        let inbox = team.inbox(LEAD).unwrap();
        assert_eq!(stored_becomes(&mail, &inbox, 0).await, 0);
    }

    /// A letter whose message the conversation drops unrecorded (a failed transcript write,
    /// a run dropped with it queued) is not acknowledged: the relay puts it in again, and
    /// acknowledges it once a run has recorded it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_letter_dropped_unrecorded_is_put_in_again() {
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        team.send(LEAD, Letter::new("alice", "keep me"))
            .await
            .unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        // Taken, then dropped unrecorded: its receipt answers `false`.
        let dropped = lead.drain();
        assert_eq!(dropped.len(), 1);
        drop(dropped);
        until("the letter was put in again", || lead.len() == 1).await;
        let inbox = team.inbox(LEAD).unwrap();
        assert_eq!(mail.stored(&inbox).await.unwrap(), 1, "still in the inbox");
        let again = recorded(&lead);
        assert!(again[0].text.contains("keep me"), "{:?}", again[0].text);
        until("acknowledged once recorded", || lead.outstanding() == 0).await;
        assert_eq!(mail.stored(&inbox).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(lead.is_empty(), "recorded once, put in once more only");
    }

    /// The acknowledgement a given-up relay leaves on a task of its own ends on its own: at
    /// [`CONFIRM_LIMIT`] against a store that never answers (the letter stays in the inbox),
    /// and at once when its lead is dropped with the letters queued — a lead built with
    /// `cancel_children_on_drop(false)`, whose token nobody cancels.
    #[tokio::test(start_paused = true)]
    async fn a_given_up_relays_acknowledgement_ends_on_its_own() {
        // The store never answers the acknowledgement.
        let mail = Arc::new(Flaky::default());
        let (team, lead) = team(&mail);
        team.send(LEAD, Letter::new("alice", "last words"))
            .await
            .unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        mail.hang_acks.store(true, Ordering::SeqCst);
        team.give_up().await;
        assert_eq!(recorded(&lead).len(), 1);
        drop(team);
        tokio::time::sleep(CONFIRM_LIMIT + Duration::from_secs(1)).await;
        assert_eq!(Arc::strong_count(&mail), 1, "the acknowledgement ended");
        mail.hang_acks.store(false, Ordering::SeqCst);
        let inbox = Inbox::new("t", LEAD).unwrap();
        assert_eq!(mail.stored(&inbox).await.unwrap(), 1, "left in the inbox");

        // The lead is dropped, its letter queued and its token never cancelled.
        let (mail, team, lead, queue) = given_up_kept_lead().await;
        drop((queue, lead, team));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(Arc::strong_count(&mail), 1, "the acknowledgement ended");
        assert_eq!(mail.stored(&inbox).await.unwrap(), 1, "left in the inbox");

        // The lead's token is cancelled, its letter still queued: it ends too.
        let mail = Arc::new(Flaky::default());
        let team = Arc::new(Team::new("t", Arc::clone(&mail) as Arc<dyn Mailbox>).unwrap());
        let (lead, token) = (
            PendingQueue::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        team.serve_lead(lead.clone(), token.clone());
        team.send(LEAD, Letter::new("alice", "last words"))
            .await
            .unwrap();
        until("the letter reached the lead's queue", || lead.len() == 1).await;
        team.give_up().await;
        token.cancel();
        drop(team);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(Arc::strong_count(&mail), 1, "the acknowledgement ended");
        assert_eq!(lead.len(), 1, "the letter is still queued");
        assert_eq!(mail.stored(&inbox).await.unwrap(), 1, "left in the inbox");
    }

    /// A join taken back (its teammate's start was refused) leaves the roster as it was: the
    /// stopped teammate it replaced is back, with its join time; without one, no member of
    /// the name. A withdrawal of a task the name no longer holds changes nothing.
    #[tokio::test]
    async fn a_withdrawn_join_leaves_the_roster_as_it_was() {
        let mail = Arc::new(Flaky::default());
        let (team, _lead) = team(&mail);
        let member = |name: &str| Member {
            name: name.into(),
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            agent_type: "worker".into(),
            state: MemberState::Running,
        };
        let first = member("bob");
        let first_task = first.task;
        team.join(first).unwrap();
        team.stopped("bob");
        let joined_at = team.joined.lock().unwrap().get("bob").cloned();
        let again = team.join(member("bob")).unwrap();
        team.withdraw(again);
        let roster = team.roster();
        let bob = roster.iter().find(|m| m.name == "bob").unwrap();
        assert_eq!((bob.task, bob.state), (first_task, MemberState::Stopped));
        assert_eq!(team.joined.lock().unwrap().get("bob").cloned(), joined_at);

        let carol = team.join(member("carol")).unwrap();
        team.withdraw(carol);
        assert!(team.roster().iter().all(|m| m.name != "carol"));
        assert!(!team.joined.lock().unwrap().contains_key("carol"));

        // The name taken since by another task: that one stays.
        let dave = team.join(member("dave")).unwrap();
        team.stopped("dave");
        let dave2 = member("dave");
        let dave2_task = dave2.task;
        team.join(dave2).unwrap();
        team.withdraw(dave);
        let roster = team.roster();
        let now = roster.iter().find(|m| m.name == "dave").unwrap();
        assert_eq!((now.task, now.state), (dave2_task, MemberState::Running));
    }

    /// A shutdown waits for a teammate on the roster whose run has not started (no promise
    /// to wait on yet) until the roster says it stopped; no teammate joins meanwhile, and one
    /// may once the shutdown has returned.
    #[tokio::test]
    async fn a_shutdown_waits_on_the_roster_and_no_teammate_joins_meanwhile() {
        let mail = Arc::new(Flaky::default());
        let (team, _lead) = team(&mail);
        let shutting = tokio::spawn({
            let team = Arc::clone(&team);
            async move { team.shut_down(None).await }
        });
        until("the shutdown is under way", || {
            team.shutdown_deadline().is_some()
        })
        .await;
        let bob = || Member {
            name: "bob".into(),
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            agent_type: "worker".into(),
            state: MemberState::Running,
        };
        assert_eq!(
            team.join(bob()).unwrap_err().to_string(),
            "team `t` is shutting down; start `bob` once its shutdown has returned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!shutting.is_finished(), "alice has not stopped");
        team.stopped("alice");
        assert_eq!(shutting.await.unwrap().unwrap(), ["alice"]);
        assert!(
            team.lead_poller.lock().unwrap().is_none(),
            "the lead's relay was given up"
        );
        team.join(bob()).unwrap();
    }

    /// A pool whose sends take 50 ms, recording what it is told to cancel.
    #[derive(Debug, Default)]
    struct SlowLink {
        cancelled: Mutex<Vec<TaskId>>,
    }

    #[async_trait]
    impl TeamLink for SlowLink {
        fn pool(&self) -> &str {
            "slow"
        }
        async fn enlist(&self, _: &str, _: &str, _: &TaskId) -> Result<()> {
            Ok(())
        }
        async fn members(&self, _: &str) -> Result<Vec<(String, TaskId, bool)>> {
            Ok(Vec::new())
        }
        async fn send(&self, _: &Inbox, _: &TaskId, _: Letter) -> Result<Option<String>> {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(Some(crate::mailbox::new_id()))
        }
        async fn cancel(&self, tasks: &[TaskId], _: Duration) -> Result<()> {
            self.cancelled.lock().unwrap().extend_from_slice(tasks);
            Ok(())
        }
    }

    /// A pool teammate asked after the shutdown's deadline (here its grace is zero, and the
    /// request takes 50 ms to store) is cancelled as it is asked; a stopped one is not asked,
    /// nor cancelled.
    #[tokio::test(start_paused = true)]
    async fn a_pool_teammate_asked_after_the_deadline_is_cancelled_as_it_is_asked() {
        let link = Arc::new(SlowLink::default());
        let (team, alice) = slow_team_with_alice(&link, Duration::ZERO);
        team.join(Member {
            name: "bob".into(),
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            agent_type: "worker".into(),
            state: MemberState::Stopped,
        })
        .unwrap();
        // Nothing stops her here: the shutdown ends when its margin has passed.
        let out = team.shut_down(None).await;
        assert!(matches!(out, Err(Error::TeamNotStopped { .. })), "{out:?}");
        // The cancel's own task has run by now (the margin is ten seconds).
        assert_eq!(*link.cancelled.lock().unwrap(), [alice]);
    }

    /// A teammate on a worker woken, then told idle out of order (an idle note written before
    /// the wake arriving after it, as a store may deliver them) stays running on the roster:
    /// only a newer state counts, so the lead never takes a working teammate for an idle one
    /// (and starts another in its place).
    #[tokio::test]
    async fn a_stale_idle_note_after_a_wake_leaves_the_teammate_running() {
        let link = Arc::new(SlowLink::default());
        let (team, alice) = slow_team_with_alice(&link, Duration::ZERO);
        let state = |busy: bool, seq: u64| {
            let mut note = Bookkeeping::new(BookOp::State, &alice);
            note.busy = busy;
            note.seq = seq;
            note
        };
        let now = |team: &Team| team.member("alice").map(|m| m.state);
        team.book("alice", state(false, 1));
        assert_eq!(now(&team), Some(MemberState::Idle));
        team.book("alice", state(true, 3));
        assert_eq!(now(&team), Some(MemberState::Running));
        // The idle note written before the wake, late.
        team.book("alice", state(false, 2));
        assert_eq!(now(&team), Some(MemberState::Running));
        // A newer idle counts.
        team.book("alice", state(false, 4));
        assert_eq!(now(&team), Some(MemberState::Idle));
        // Another task's note under her name (an earlier alice's) changes nothing.
        let mut other = Bookkeeping::new(
            BookOp::State,
            &TaskId::generate(forkhive_core::TaskKind::Agent),
        );
        other.busy = true;
        other.seq = 9;
        team.book("alice", other);
        assert_eq!(now(&team), Some(MemberState::Idle));
    }

    /// A team on `link` with a shutdown grace of `grace` and `alice` idle on the pool.
    fn slow_team_with_alice(link: &Arc<SlowLink>, grace: Duration) -> (Team, TaskId) {
        let team = Team::new("t", Arc::new(MemoryMailbox::new()) as Arc<dyn Mailbox>)
            .unwrap()
            .lead_on(Arc::clone(link) as Arc<dyn TeamLink>)
            .with_shutdown_grace(grace);
        let alice = TaskId::generate(forkhive_core::TaskKind::Agent);
        team.join(Member {
            name: "alice".into(),
            task: alice,
            agent_type: "worker".into(),
            state: MemberState::Idle,
        })
        .unwrap();
        (team, alice)
    }

    /// A shutdown on a pool dropped while its first request is still being stored has asked
    /// nobody: at its deadline it cancels nobody. (The Redis test `pool_team` 6d drops one
    /// after one poll, on one thread so that the poll cannot finish the store; here the
    /// order is fixed without Redis.)
    #[tokio::test(start_paused = true)]
    async fn a_pool_shutdown_dropped_while_asking_cancels_nobody() {
        let link = Arc::new(SlowLink::default());
        let (team, _alice) = slow_team_with_alice(&link, Duration::from_secs(1));
        {
            let shutdown = team.shut_down(None);
            let mut shutdown = std::pin::pin!(shutdown);
            assert!(futures::poll!(shutdown.as_mut()).is_pending());
            // Still storing (50 ms).
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(link.cancelled.lock().unwrap().is_empty());
        assert!(
            team.shutdown_deadline().is_none(),
            "its deadline went with it"
        );
    }

    /// The same shutdown dropped once the request was stored has asked her: she is cancelled
    /// on the pool at its deadline, not before.
    #[tokio::test(start_paused = true)]
    async fn a_pool_shutdown_dropped_after_asking_cancels_at_its_deadline() {
        let link = Arc::new(SlowLink::default());
        let (team, alice) = slow_team_with_alice(&link, Duration::from_secs(1));
        {
            let shutdown = team.shut_down(None);
            let mut shutdown = std::pin::pin!(shutdown);
            let stored = tokio::time::sleep(Duration::from_millis(60));
            tokio::select! {
                r = &mut shutdown => panic!("returned before it was dropped: {r:?}"),
                () = stored => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(
            link.cancelled.lock().unwrap().is_empty(),
            "before the deadline"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(*link.cancelled.lock().unwrap(), [alice]);
    }

    /// A control as a teammate's run makes it, with its `overdue`.
    fn control(overdue: &Arc<std::sync::OnceLock<Duration>>) -> Control {
        Control {
            halt: crate::base::pending::Halt::new(),
            stop: watch::channel(None).0,
            asked: None,
            seen: Seen::new(),
            queue: PendingQueue::new(),
            cancel: tokio_util::sync::CancellationToken::new(),
            overdue: Arc::clone(overdue),
        }
    }

    /// On a worker, a lead's grace told for a teammate whose run has not made its controls
    /// yet is kept for its task and taken as the run makes them; told once they exist, it is
    /// set on them at once; what a task that never started left is forgotten. Another task of
    /// the same name is not marked by it.
    #[tokio::test]
    async fn a_lead_grace_told_before_the_controls_exist_is_taken_when_they_are_made() {
        let team = Team::new("t", Arc::new(MemoryMailbox::new()) as Arc<dyn Mailbox>).unwrap();
        let (early, late, never) = (
            TaskId::generate(forkhive_core::TaskKind::Agent),
            TaskId::generate(forkhive_core::TaskKind::Agent),
            TaskId::generate(forkhive_core::TaskKind::Agent),
        );
        team.overdue_on_pool(early, "alice", Duration::from_millis(1500));
        // Another alice's run (a later task) takes nothing of it.
        let other = Arc::default();
        team.arm("alice", late, control(&other));
        assert_eq!(other.get(), None);
        team.controls().remove("alice");
        let hers = Arc::default();
        team.arm("alice", early, control(&hers));
        assert_eq!(hers.get(), Some(&Duration::from_millis(1500)));
        assert!(team.early_overdue.lock().unwrap().is_empty());
        // Told once the controls exist: set on them, the first grace kept.
        team.overdue_on_pool(early, "alice", Duration::from_secs(9));
        assert_eq!(hers.get(), Some(&Duration::from_millis(1500)));
        let bobs = Arc::default();
        team.arm("bob", late, control(&bobs));
        team.overdue_on_pool(late, "bob", Duration::ZERO);
        assert_eq!(bobs.get(), Some(&Duration::ZERO));
        // A task that never made its controls: kept, then forgotten.
        team.overdue_on_pool(never, "carol", Duration::from_secs(1));
        assert_eq!(team.early_overdue.lock().unwrap().len(), 1);
        team.forget_overdue(&never);
        assert!(team.early_overdue.lock().unwrap().is_empty());
    }

    /// A grace the clock cannot add (`Duration::MAX`: never cancel) is a deadline that never
    /// comes, not a panic.
    #[tokio::test]
    async fn a_grace_past_the_clock_never_comes() {
        let now = tokio::time::Instant::now();
        assert!(deadline_after(Duration::MAX) > now + Duration::from_secs(365 * 24 * 3600));
        assert_eq!(
            deadline_after(Duration::from_secs(1))
                .duration_since(now)
                .as_secs(),
            1
        );
    }

    /// A teammate whose run is dropped before it starts is stopped on the roster.

    #[test]
    fn a_teammate_run_dropped_unrun_is_stopped() {
        let mail = Arc::new(Flaky::default());
        let team = Arc::new(Team::new("t", Arc::clone(&mail) as Arc<dyn Mailbox>).unwrap());
        team.join(Member {
            name: "bob".into(),
            task: TaskId::generate(forkhive_core::TaskKind::Agent),
            agent_type: "worker".into(),
            state: MemberState::Running,
        })
        .unwrap();
        team.enter_plan_mode("bob");
        drop(teammate_run(Arc::clone(&team), "bob".into(), "p".into()));
        assert_eq!(team.member("bob").unwrap().state, MemberState::Stopped);
        assert!(!team.in_plan_mode("bob"));
    }

    /// A control letter sent before a teammate joined was meant for an earlier teammate of its
    /// name: stale. One sent after is not.
    #[tokio::test]
    async fn control_letters_older_than_a_teammate_are_stale() {
        let mail = Arc::new(Flaky::default());
        let (team, _lead) = team(&mail);
        let old = Delivered {
            id: "1".into(),
            from: LEAD.into(),
            text: "{}".into(),
            timestamp: "2020-01-01T00:00:00.000Z".into(),
            summary: None,
            color: None,
        };
        assert!(team.stale("alice", &old));
        let fresh = Delivered {
            timestamp: crate::mailbox::timestamp_now(),
            ..old
        };
        assert!(!team.stale("alice", &fresh));
        assert!(!team.stale("nobody", &fresh));
    }
}
