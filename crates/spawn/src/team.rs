//! Teams: a lead and long-lived teammates that talk through a [`Mailbox`] ("Claude Code
//! Multi-Agent Internals: How Subagents and Swarm Teammates Actually Work — 6.2 Swarm
//! teammates are long-lived workers", "7. How Spawned Agents Receive Messages While Working").
//!
//! A host makes a [`Team`] and gives it to the lead (`AgentBuilder::extension`), with
//! `AgentToolConfig::with_teams_enabled(true)`. The lead's `Agent` call with `name` and
//! `team_name` starts a teammate: a child under the task service, owned like any other, whose
//! run is a loop — run its prompt, go idle (an `idle_notification` to the lead), wait for a
//! letter, run again — until the lead's `shutdown_request` (it answers `shutdown_approved` and
//! ends), its cancellation, or a run that does not complete. Letters reach a busy teammate at
//! its next tool-round boundary; an idle one wakes on them. The lead's own letters reach it the
//! same way, as `<teammate-message>`s. `SendMessage` addresses teammates by name (and
//! `team-lead` from a teammate); a teammate that has shut down is an error to the sender,
//! never a silent loss. The team is flat: teammates cannot start teammates.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkhive_core::TaskId;
use tokio::sync::watch;

use crate::base::outcome::StopReason;
use crate::base::pending::{PendingMessage, PendingQueue, Wake};
use crate::error::{Error, Result};
use crate::mailbox::protocol::{IdleReason, PlanDecision, PlanGate, Protocol};
use crate::mailbox::{Inbox, Letter, Mailbox};
use crate::runtime::Agent;
use crate::task::CustomRun;

/// The lead's name in its team (Claude Code's `team-lead`).
pub const LEAD: &str = "team-lead";

/// The origin of letters put into a conversation.
const MAILBOX_ORIGIN: &str = "mailbox";

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

/// A team: its name, its mailbox and its roster. One per lead.
pub struct Team {
    name: String,
    mailbox: Arc<dyn Mailbox>,
    members: Mutex<BTreeMap<String, Member>>,
    /// Moves the lead's letters into its conversation; started with the first teammate and
    /// stopped with the team.
    lead_poller: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Each teammate's plan approvals.
    plans: Mutex<std::collections::HashMap<String, PlanGate>>,
    /// Where the roster is kept (`config.json`), if anywhere.
    roster_file: Option<std::path::PathBuf>,
}

impl fmt::Debug for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Team")
            .field("name", &self.name)
            .field("mailbox", &self.mailbox)
            .finish_non_exhaustive()
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        if let Some(p) = self
            .lead_poller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            p.abort();
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
        })
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

    /// Writes the roster file, if there is one (small; on every change of the roster).
    fn save(&self) {
        let Some(file) = &self.roster_file else {
            return;
        };
        let members: Vec<serde_json::Value> = self
            .roster()
            .iter()
            .map(|m| {
                serde_json::json!({
                    "agentId": format!("{}@{}", m.name, self.name),
                    "name": m.name,
                    "agentType": m.agent_type,
                    "taskId": m.task.to_string(),
                    "state": m.state.to_string(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "name": self.name,
            "leadAgentId": format!("{LEAD}@{}", self.name),
            "members": members,
        });
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
    pub(crate) fn join(&self, member: Member) -> Result<()> {
        if member.name == LEAD {
            return Err(Error::Refused(format!(
                "`{LEAD}` is the lead's name in a team; give the teammate another"
            )));
        }
        let mut all = self.lock();
        if let Some(m) = all.get(&member.name)
            && m.state != MemberState::Stopped
        {
            return Err(Error::Refused(format!(
                "team `{}` already has a teammate `{}` ({}, task {}); give this one another name",
                self.name, m.name, m.state, m.task
            )));
        }
        all.insert(member.name.clone(), member);
        drop(all);
        self.save();
        Ok(())
    }

    /// Marks a teammate stopped (it could not start).
    pub(crate) fn leave(&self, name: &str) {
        self.set_state(name, MemberState::Stopped);
    }

    fn set_state(&self, name: &str, state: MemberState) {
        let changed = match self.lock().get_mut(name) {
            Some(m) if m.state != state => {
                m.state = state;
                true
            }
            _ => false,
        };
        if changed {
            self.save();
        }
    }

    /// Sends `letter` to `to` (a teammate's name or [`LEAD`]). A teammate that has stopped is
    /// an error: nobody would read it.
    pub async fn send(&self, to: &str, letter: Letter) -> Result<String> {
        if to != LEAD {
            match self.member(to) {
                None => {
                    return Err(Error::Refused(format!(
                        "team `{}` has no teammate `{to}`",
                        self.name
                    )));
                }
                Some(m) if m.state == MemberState::Stopped => {
                    return Err(Error::Refused(format!(
                        "teammate `{to}` has shut down, so the message was not delivered"
                    )));
                }
                Some(_) => {}
            }
        }
        self.mailbox.send(&self.inbox(to)?, letter).await
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

    /// A plan answer that reached teammate `name`, as the text its conversation gets (`None`
    /// for a copy of an answer already taken).
    fn answer_plan(&self, name: &str, letter: &crate::mailbox::Delivered) -> Option<String> {
        let mut plans = self.plans();
        let gate = plans
            .entry(name.to_owned())
            .or_insert_with(|| PlanGate::new(LEAD));
        match gate.answer(letter) {
            Ok(PlanDecision::Proceed { .. }) => {
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

    /// Starts moving the lead's letters into `lead` (its pending queue), once.
    pub(crate) fn serve_lead(self: &Arc<Self>, lead: PendingQueue) {
        let mut p = self.lead_poller.lock().unwrap_or_else(|e| e.into_inner());
        if p.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let Ok(inbox) = self.inbox(LEAD) else { return };
        let mailbox = Arc::clone(&self.mailbox);
        *p = Some(tokio::spawn(async move {
            let mut relay = Relay::new(mailbox, inbox, lead);
            loop {
                if relay.step(|_| false).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
}

/// Moves one inbox's letters into an agent's pending queue, at least once on the wire and once
/// into the conversation: a letter is acknowledged only after the queue it was put in has been
/// drained into the conversation, and an id is never put in twice.
struct Relay {
    mailbox: Arc<dyn Mailbox>,
    inbox: Inbox,
    queue: PendingQueue,
    seen: HashSet<String>,
    unacked: Vec<String>,
}

impl Relay {
    fn new(mailbox: Arc<dyn Mailbox>, inbox: Inbox, queue: PendingQueue) -> Self {
        Self {
            mailbox,
            inbox,
            queue,
            seen: HashSet::new(),
            unacked: Vec::new(),
        }
    }

    /// Waits for letters and relays the new ones; `intercept` takes a letter instead (a
    /// shutdown request) when it returns true.
    async fn step(
        &mut self,
        mut intercept: impl FnMut(&crate::mailbox::Delivered) -> bool,
    ) -> Result<()> {
        if self.queue.is_empty() && !self.unacked.is_empty() {
            let done = std::mem::take(&mut self.unacked);
            self.mailbox.ack(&self.inbox, &done).await?;
        }
        if !self
            .mailbox
            .wait(&self.inbox, Duration::from_secs(3600))
            .await?
        {
            return Ok(());
        }
        let mut new = 0;
        for d in self.mailbox.receive(&self.inbox).await? {
            if !self.seen.insert(d.id.clone()) {
                continue;
            }
            new += 1;
            if intercept(&d) {
                self.mailbox.ack(&self.inbox, &[d.id]).await?;
                continue;
            }
            self.queue
                .push(PendingMessage::new(d.to_message(), MAILBOX_ORIGIN));
            self.unacked.push(d.id);
        }
        if new == 0 {
            // Letters read but not drained into the conversation yet: look again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The teammate loop for `name` in `team`, starting with `prompt` (see the module docs).
pub(crate) fn teammate_run(team: Arc<Team>, name: String, prompt: String) -> CustomRun {
    Box::new(move |agent: &mut Agent| {
        Box::pin(async move {
            let queue = agent.pending();
            let (stop_tx, mut stop_rx) = watch::channel::<Option<String>>(None);
            let relay = match team.inbox(&name) {
                Ok(inbox) => {
                    let mut relay = Relay::new(Arc::clone(team.mailbox()), inbox, queue.clone());
                    let (team, name, queue) = (Arc::clone(&team), name.clone(), queue.clone());
                    Some(AbortOnDrop(tokio::spawn(async move {
                        loop {
                            let r = relay
                                .step(|d| match Protocol::parse(&d.text) {
                                    // Only the lead may stop a teammate.
                                    Some(Protocol::ShutdownRequest { request_id, .. })
                                        if d.from == LEAD =>
                                    {
                                        let _ = stop_tx.send(Some(request_id));
                                        true
                                    }
                                    // Plan answers go through the teammate's gate: the lead's
                                    // only, once each.
                                    Some(Protocol::PlanApprovalResponse { .. }) => {
                                        if let Some(text) = team.answer_plan(&name, d) {
                                            queue.push(PendingMessage::new(text, MAILBOX_ORIGIN));
                                        }
                                        true
                                    }
                                    _ => false,
                                })
                                .await;
                            if r.is_err() {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    })))
                }
                Err(e) => {
                    tracing::warn!("teammate `{name}` has no inbox: {e}");
                    None
                }
            };
            team.set_state(&name, MemberState::Running);
            let mut run = agent.run(prompt).await;
            loop {
                if run.stop != StopReason::Completed || stop_rx.borrow().is_some() {
                    break;
                }
                team.set_state(&name, MemberState::Idle);
                let idle = Protocol::IdleNotification {
                    from: name.clone(),
                    timestamp: crate::mailbox::timestamp_now(),
                    idle_reason: IdleReason::Available,
                    summary: Some(run.final_text.chars().take(200).collect()),
                    completed_task_id: None,
                };
                if let Err(e) = team.send(LEAD, idle.to_letter(name.clone())).await {
                    tracing::warn!("teammate `{name}` could not tell the lead it is idle: {e}");
                }
                // Idle: until a letter, the lead's shutdown request, or cancellation.
                let hold = queue.expect();
                let woke = tokio::select! {
                    biased;
                    () = agent.cancellation().cancelled() => None,
                    _ = stop_rx.wait_for(Option::is_some) => None,
                    w = queue.wait() => Some(w),
                };
                drop(hold);
                let Some(Wake::Messages(ms)) = woke else {
                    break;
                };
                for m in ms {
                    queue.push(m);
                }
                team.set_state(&name, MemberState::Running);
                run = agent.run_pending().await;
            }
            let asked = stop_rx.borrow().clone();
            if let Some(request_id) = asked {
                let ok = Protocol::ShutdownApproved {
                    request_id,
                    from: name.clone(),
                    timestamp: crate::mailbox::timestamp_now(),
                };
                if let Err(e) = team.send(LEAD, ok.to_letter(name.clone())).await {
                    tracing::warn!("teammate `{name}` could not confirm its shutdown: {e}");
                }
            }
            drop(relay);
            team.set_state(&name, MemberState::Stopped);
            run
        })
    })
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
