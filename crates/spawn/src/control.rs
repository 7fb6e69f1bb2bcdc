//! Tools an agent uses on the children it started: [`TaskStopTool`] (`TaskStop`) stops one,
//! [`SendMessageTool`] (`SendMessage`) gives a running one — or, from a child, its parent
//! (`main`) — a message ("Coordinator Mode: A Working Multi-Agent System, From the Source —
//! SendMessage addressing"). Both answer every mistake with an `is_error` result that says
//! what the valid choices are: a message is never dropped in silence.
//!
//! A message to a task that has ended resumes it from its transcript ("… — SendMessage": a
//! finished worker is resumed and given the message). An agent started with a `name` is
//! addressed by it too. Not here: transports for `uds:` and `bridge:` addresses (refused as
//! "not supported by this host").

use std::sync::Arc;

use async_trait::async_trait;
use forkhive_core::{TaskId, ToolDefinition};
use serde::Deserialize;

use crate::base::pending::PendingMessage;
use crate::task::{Recipient, Sent, TaskService, TaskState};
use crate::tool::{InBackground, Tool, ToolContext, ToolOutput};

/// The `TaskStop` tool's name.
pub const TASK_STOP: &str = "TaskStop";
pub use crate::base::pending::SEND_MESSAGE;

fn service(cx: &ToolContext) -> Option<Arc<TaskService>> {
    cx.caller()?.tree().extensions().get::<TaskService>()
}

/// `id, id, …` of the caller's running children, sorted, or `none`.
fn listed(ids: &mut [TaskId]) -> String {
    ids.sort();
    if ids.is_empty() {
        return "none".to_owned();
    }
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The state its record gives a task that is not running, for a refusal's text.
async fn ended(service: &TaskService, id: &TaskId) -> Option<TaskState> {
    Some(service.registry().get(id).await?.state)
}

/// Stops a running child of the caller: it ends `killed`, and its one notification carries
/// the work it had done.
#[derive(Debug, Clone)]
pub struct TaskStopTool {
    definition: ToolDefinition,
}

impl TaskStopTool {
    /// The tool.
    pub fn new() -> crate::Result<Self> {
        Ok(Self {
            definition: ToolDefinition::new(
                TASK_STOP,
                "Stop a background task you started. Its notification will say it was killed \
                 and carry what it had done.",
                r#"{"type":"object","properties":{"task_id":{"type":"string","description":"The task to stop"}},"required":["task_id"],"additionalProperties":false}"#,
            )?,
        })
    }

    /// The tool behind an `Arc`, as a [`ToolPool`](crate::tool::ToolPool) takes it.
    pub fn arc(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

#[derive(Deserialize)]
struct StopInput {
    task_id: String,
}

#[async_trait]
impl Tool for TaskStopTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn in_background(&self) -> InBackground {
        InBackground::ByFilter
    }
    /// It works on tasks and mailboxes, not files: the same tool in any worktree.
    async fn rooted(&self, _root: &std::path::Path) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(self.clone()))
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        let input: StopInput = match serde_json::from_value(input) {
            Ok(i) => i,
            Err(e) => return ToolOutput::error(format!("invalid TaskStop input: {e}")),
        };
        let me = *cx.agent().id();
        let Some(service) = service(cx) else {
            return ToolOutput::error("there are no tasks to stop: none was started");
        };
        let mut mine = service.running_children(&me);
        let by_name = match service.named(&me, input.task_id.trim()) {
            Ok(Some(Recipient::Running(id))) => Some(id),
            _ => None,
        };
        let Some(id) = by_name.or_else(|| input.task_id.trim().parse::<TaskId>().ok()) else {
            return ToolOutput::error(format!(
                "`{}` is not a task id; your running tasks: {}",
                input.task_id,
                listed(&mut mine)
            ));
        };
        if service.parent_of(&id) == Some(me) {
            // A teammate idle between prompts does not hold its lead's run; stopped, its
            // `killed` notification is what the lead is promised: its run waits for it. Held
            // before the stop: stopped first, the teammate could end (on another thread)
            // before its promise was taken up, and the run return before its notification.
            let team = cx
                .caller()
                .and_then(|c| c.tree().extensions().get::<crate::team::Team>());
            if let Some(team) = &team {
                team.await_end_of(&id);
            }
            if service.cancel(&id) {
                return ToolOutput::text(format!(
                    "Stopping task {id}. Its notification will say it was killed, with what it \
                     had done."
                ));
            }
            if let Some(team) = &team {
                team.not_stopping(&id);
            }
        }
        match ended(&service, &id).await {
            Some(state) if service.parent_of(&id).is_none() => ToolOutput::error(format!(
                "task {id} is not running (it is {state}); your running tasks: {}",
                listed(&mut mine)
            )),
            _ => ToolOutput::error(format!(
                "task {id} is not one of your running tasks: {}",
                listed(&mut mine)
            )),
        }
    }
}

/// Gives a message to a running task (its id or name, resuming a finished background worker),
/// to the agent that started the caller (`main`), or — in a team — to a teammate by name, to
/// `team-lead` from a teammate, or to every teammate (`*`). The recipient reads it at its next
/// tool-round boundary, or when it next waits. In a team the message may be structured:
/// `shutdown_request` (lead), `shutdown_response` (teammate), `plan_approval_request`
/// (teammate), `plan_approval_response` (lead); see `docs/teams.md`.
#[derive(Debug, Clone)]
pub struct SendMessageTool {
    definition: ToolDefinition,
}

impl SendMessageTool {
    /// The tool.
    pub fn new() -> crate::Result<Self> {
        Ok(Self {
            definition: ToolDefinition::new(
                SEND_MESSAGE,
                "Send a message to a running task (its task id), or to the agent that started \
                 you (`main`). It reads it at its next tool round.",
                r#"{"type":"object","properties":{"to":{"type":"string","description":"A task id or name, a teammate's name, main (team-lead from a teammate), or * for every teammate"},"message":{"type":["string","object"],"description":"The text; or, in a team: {\"type\":\"shutdown_request\",\"reason\":…} (lead), {\"type\":\"shutdown_response\",\"request_id\":…,\"approve\":…,\"reason\":…} (teammate), {\"type\":\"plan_approval_request\",\"plan\":…} (teammate), {\"type\":\"plan_approval_response\",\"request_id\":…,\"approve\":…,\"feedback\":…} (lead)"},"summary":{"type":"string","description":"A short preview, for a teammate"}},"required":["to","message"],"additionalProperties":false}"#,
            )?,
        })
    }

    /// The tool behind an `Arc`, as a [`ToolPool`](crate::tool::ToolPool) takes it.
    pub fn arc(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

#[derive(Deserialize)]
struct SendInput {
    to: String,
    message: serde_json::Value,
    #[serde(default)]
    summary: Option<String>,
}

/// The most bytes one `SendMessage` carries, escaped as its recipient reads it (its text, or
/// its structured message as JSON, with its summary): what it sends stays in its recipient's
/// conversation, sent again with every later request, so a worker's flood of long messages
/// would fill its parent's context ("Coordinator Mode", gotchas: "cap the resources"). The same cap as a child's answer
/// ([`RESULT_CAP`](crate::task::RESULT_CAP)).
pub const MESSAGE_CAP: usize = crate::task::RESULT_CAP;

/// The refusal of a message longer than [`MESSAGE_CAP`], as its recipient gets it: escaped
/// (`&` is five bytes there, `<` and `>` four).
fn too_long(input: &SendInput) -> Option<ToolOutput> {
    let escaped = |s: &str| {
        s.len()
            + s.bytes()
                .map(|b| match b {
                    b'&' => 4,
                    b'<' | b'>' => 3,
                    _ => 0,
                })
                .sum::<usize>()
    };
    let body = match &input.message {
        serde_json::Value::String(text) => escaped(text),
        other => escaped(&other.to_string()),
    };
    let size = body + input.summary.as_deref().map_or(0, escaped);
    (size > MESSAGE_CAP).then(|| {
        ToolOutput::error(format!(
            "the message is {size} bytes; one carries at most {MESSAGE_CAP}: send the gist, \
             and write the rest to a file whose path you send"
        ))
    })
}

/// `<message from="…">text</message>` (see [`crate::base::pending::message_envelope`]).
fn envelope(from: &TaskId, text: &str) -> String {
    crate::base::pending::message_envelope(&from.to_string(), text)
}

#[async_trait]
impl Tool for SendMessageTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        true
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn in_background(&self) -> InBackground {
        InBackground::ByFilter
    }
    /// It works on tasks and mailboxes, not files: the same tool in any worktree.
    async fn rooted(&self, _root: &std::path::Path) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(self.clone()))
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        let input: SendInput = match serde_json::from_value(input) {
            Ok(i) => i,
            Err(e) => return ToolOutput::error(format!("invalid SendMessage input: {e}")),
        };
        if let Some(refused) = too_long(&input) {
            return refused;
        }
        let me = *cx.agent().id();
        let to = input.to.trim();
        if let Some((scheme, _)) = to.split_once(':')
            && matches!(scheme, "uds" | "bridge")
        {
            return ToolOutput::error(format!(
                "`{scheme}:` addresses are not supported by this host"
            ));
        }
        // A teammate (by name), or the lead from a teammate: through the team's mailbox.
        if let Some(team) = cx
            .caller()
            .and_then(|c| c.tree().extensions().get::<crate::team::Team>())
        {
            let mine = team.name_of(&me);
            // The team's lead (no teammate, and no one's child) is served from its first
            // letter on, as from its first teammate: a second lead on a team that outlived the
            // first takes the teammates over — their holds, notifications and answers.
            if mine.is_none()
                && cx.agent().depth() == 0
                && let Some(caller) = cx.caller()
            {
                // One lead per team on its mailbox: another would take this one's letters.
                if let Err(e) = team.claim_lead().await {
                    return ToolOutput::error(e.to_string());
                }
                team.serve_lead_unless_served(caller.pending().clone(), cx.cancellation().clone());
            }
            // Only the lead and its teammates write through the team: anyone else in the
            // tree (a subagent or fork of the lead, a teammate's own subagent) would be
            // taken for the lead — its shutdown requests and plan approvals included.
            let outsider = mine.is_none() && cx.agent().depth() > 0;
            if to == "*" {
                if outsider {
                    return ToolOutput::error(outsider_refusal(cx.agent().depth()));
                }
                return broadcast(&team, mine, &input).await;
            }
            let to_lead = mine.is_some() && (to == crate::team::LEAD || to == "main");
            if to_lead || team.has_teammate(to).await {
                if outsider {
                    return ToolOutput::error(outsider_refusal(cx.agent().depth()));
                }
                let to = if to_lead { crate::team::LEAD } else { to };
                return to_teammate(&team, mine, to, &input).await;
            }
        }
        if to == "*" {
            return ToolOutput::error(
                "`*` reaches every teammate of a team; this agent is in no team",
            );
        }
        let serde_json::Value::String(text) = &input.message else {
            return ToolOutput::error(format!(
                "a structured message goes to a teammate; `{to}` is not one: send it text"
            ));
        };
        // One of the caller's tasks on a worker pool, on another host.
        #[cfg(feature = "redis")]
        if let Some(out) = crate::pool::route_message(cx, to, text).await {
            return out;
        }
        let Some(service) = service(cx) else {
            // `main` is advice only for a child: the agent at the top has no one above it.
            let team = cx
                .caller()
                .and_then(|c| c.tree().extensions().get::<crate::team::Team>());
            let why = match (team, cx.agent().depth()) {
                (Some(team), 0) => format!(
                    "team `{}` has no teammate of that name, and no task is running",
                    team.name()
                ),
                (None, 0) => "no task is running".to_owned(),
                _ => "no task is running; `main` reaches the agent that started you".to_owned(),
            };
            return ToolOutput::error(format!("no recipient `{to}`: {why}"));
        };
        let message = PendingMessage::new(
            envelope(&me, text),
            crate::base::pending::SEND_MESSAGE_ORIGIN,
        );
        if to == "main" {
            return match service.send(&me, true, message) {
                Some(Sent::Parent(parent)) => ToolOutput::text(format!(
                    "Sent to main ({parent}); it reads it at its next tool round."
                )),
                _ => ToolOutput::error(
                    "you are the main agent: `main` names the agent that started you",
                ),
            };
        }
        let valid = recipients(&service, &me);
        let target = match service.named(&me, to) {
            Ok(Some(r)) => r,
            Err(ids) => {
                return ToolOutput::error(format!(
                    "`{to}` names more than one of your tasks ({}); send to a task id",
                    listed(&mut ids.clone())
                ));
            }
            Ok(None) => {
                // A task id, or the name of one of the caller's children that has ended.
                let (id, who) = match to.parse::<TaskId>() {
                    Ok(id) => (id, format!("task {id}")),
                    Err(_) => match service.ended_named(&me, to) {
                        Some(id) => (id, format!("`{to}` (task {id})")),
                        None => {
                            return ToolOutput::error(format!("no recipient `{to}`; {valid}"));
                        }
                    },
                };
                if id == me {
                    return ToolOutput::error("you cannot send a message to yourself");
                }
                // Only to the tasks the caller started (as `TaskStop`): workers answer `main`.
                if service.parent_of(&id) == Some(me) {
                    Recipient::Running(id)
                } else if service.resumable_parent(&id) == Some(me) {
                    Recipient::Resumable(id)
                } else {
                    let text = match ended(&service, &id).await {
                        Some(_)
                            if service.parent_of(&id).is_some()
                                || service.resumable_parent(&id).is_some() =>
                        {
                            format!("task {id} is not one of your tasks; {valid}")
                        }
                        // Its record says `running` until its owner has finished it.
                        Some(TaskState::Running) => format!(
                            "{who} has just stopped and cannot be resumed (it kept no \
                             transcript, or was forgotten), so the message was not delivered; \
                             {valid}"
                        ),
                        Some(state) => format!(
                            "{who} is not running (it is {state}) and cannot be resumed (it kept \
                             no transcript, or was forgotten), so the message was not delivered; \
                             {valid}"
                        ),
                        None => format!("no recipient `{to}`; {valid}"),
                    };
                    return ToolOutput::error(text);
                }
            }
        };
        let id = match target {
            Recipient::Running(id) => match service.send(&id, false, message.clone()) {
                Some(Sent::Child(id)) => {
                    return ToolOutput::text(format!(
                        "Sent to task {id}; it reads it at its next tool round."
                    ));
                }
                // It ended a moment ago: resumed below.
                _ => id,
            },
            Recipient::Resumable(id) => id,
        };
        let Some(caller) = crate::runtime::AgentShared::of(cx) else {
            return ToolOutput::error("SendMessage only works inside an agent loop");
        };
        let turn = cx.turn().map_or(0, |t| t.turn());
        // A record forgotten under the registry's retention has no state to tell; nor has one
        // whose owner is still finishing it (it says `running` until then).
        let state = ended(&service, &id)
            .await
            .filter(|s| s.is_terminal())
            .map_or_else(String::new, |s| format!(" ({s})"));
        match service.revive(caller, turn, id, message).await {
            Ok(id) => ToolOutput::text(format!(
                "Task {id} had ended{state}; it was resumed from its transcript with your \
                 message and runs in the background again. Its next <task-notification> \
                 reports this run."
            )),
            Err(e) => ToolOutput::error(format!(
                "task {id} had ended{state} and could not be resumed, so the message was \
                 not delivered: {}",
                crate::task::error_chain(&e)
            )),
        }
    }
}

/// Why an agent in the tree that is neither the lead nor a teammate may not write to the team.
fn outsider_refusal(depth: u32) -> String {
    format!(
        "only the team's lead and its teammates write to teammates; this agent is neither (a \
         subagent at depth {depth}): report what the team must know to the agent that started \
         you, in your answer"
    )
}

/// A letter to a teammate (or, from one, to the lead) through the team's mailbox: text, or a
/// structured control message (see [`SendMessageTool`]).
async fn to_teammate(
    team: &crate::team::Team,
    mine: Option<String>,
    to: &str,
    input: &SendInput,
) -> ToolOutput {
    // A teammate that writes to itself wakes itself, each wake a fresh run: a loop that
    // holds its lead's run and spends tokens until its deadline.
    if mine.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(to)) {
        return ToolOutput::error("you cannot send a message to yourself");
    }
    let from = mine.clone().unwrap_or_else(|| crate::team::LEAD.to_owned());
    let letter = match &input.message {
        serde_json::Value::String(text) => {
            if let Some(refused) = protocol_text(text) {
                return refused;
            }
            let mut l = crate::mailbox::Letter::new(from, text.clone());
            l.summary = input.summary.clone();
            l
        }
        serde_json::Value::Object(o) => match o.get("type").and_then(|t| t.as_str()) {
            Some("shutdown_request") if mine.is_none() => crate::team::shutdown_request(
                o.get("reason").and_then(|r| r.as_str()).map(str::to_owned),
            )
            .to_letter(from),
            Some("shutdown_request") => {
                return ToolOutput::error("only the lead asks a teammate to shut down");
            }
            Some("plan_approval_request") => {
                let (Some(me), true) = (&mine, to == crate::team::LEAD) else {
                    return ToolOutput::error("a teammate asks the lead to approve its plan");
                };
                let plan = o
                    .get("plan")
                    .and_then(|p| p.as_str())
                    .unwrap_or_default()
                    .to_owned();
                return match team.ask_plan(me, plan).await {
                    Ok(_) => ToolOutput::text(
                        "Plan sent to the lead. Wait for its answer before you act on it.",
                    ),
                    Err(e) => ToolOutput::error(crate::task::error_chain(&e)),
                };
            }
            Some("shutdown_response") => {
                let (Some(me), true) = (&mine, to == crate::team::LEAD) else {
                    return ToolOutput::error(
                        "a teammate answers the lead's shutdown_request: send it to `team-lead`",
                    );
                };
                let Some(request_id) = o
                    .get("request_id")
                    .or_else(|| o.get("requestId"))
                    .and_then(|r| r.as_str())
                else {
                    return ToolOutput::error("a shutdown_response needs its `request_id`");
                };
                let Some(approve) = approval(o) else {
                    return ToolOutput::error("a shutdown_response needs `approve`: true or false");
                };
                let reason = o.get("reason").and_then(|r| r.as_str()).map(str::to_owned);
                return match team.answer_shutdown(me, request_id, approve, reason).await {
                    Ok(()) if approve => {
                        ToolOutput::text("Shutdown approved: you end after this tool round.")
                    }
                    Ok(()) => ToolOutput::text(
                        "The lead has your reason for not shutting down; go on with your work.",
                    ),
                    Err(e) => ToolOutput::error(crate::task::error_chain(&e)),
                };
            }
            Some("plan_approval_response") if mine.is_none() => {
                let Some(request_id) = o
                    .get("request_id")
                    .or_else(|| o.get("requestId"))
                    .and_then(|r| r.as_str())
                else {
                    return ToolOutput::error("a plan_approval_response needs its `request_id`");
                };
                let Some(approved) = approval(o) else {
                    return ToolOutput::error(
                        "a plan_approval_response needs `approve`: true or false",
                    );
                };
                crate::mailbox::protocol::Protocol::PlanApprovalResponse {
                    request_id: request_id.to_owned(),
                    approved,
                    feedback: o
                        .get("feedback")
                        .and_then(|f| f.as_str())
                        .map(str::to_owned),
                    permission_mode: None,
                }
                .to_letter(from)
            }
            other => {
                return ToolOutput::error(format!(
                    "a structured message of type `{}` cannot be sent here; send text, or \
                     {{\"type\":\"shutdown_request\"}} from the lead",
                    other.unwrap_or("(none)")
                ));
            }
        },
        _ => return ToolOutput::error("`message` must be text or an object"),
    };
    match team.send(to, letter).await {
        Ok(_) if to == crate::team::LEAD => {
            ToolOutput::text("Sent to the lead; it reads it at its next tool round.")
        }
        Ok(_) => ToolOutput::text(format!(
            "Sent to teammate `{to}`; it reads it at its next tool round, or wakes on it if idle."
        )),
        Err(e) => ToolOutput::error(crate::task::error_chain(&e)),
    }
}

/// An answer's `approve`, or `approved` as Claude Code's letters spell it.
fn approval(o: &serde_json::Map<String, serde_json::Value>) -> Option<bool> {
    o.get("approve")
        .or_else(|| o.get("approved"))
        .and_then(serde_json::Value::as_bool)
}

/// The refusal of text that is a whole protocol message, complete or not: a teammate's relay
/// would act on a complete one, past the checks of the structured form (who may ask, with
/// which id) — a letter a hostile teammate asked the lead to pass on, say — and a model reads
/// either as one. It says how the message is sent, where `SendMessage` sends it at all.
fn protocol_text(text: &str) -> Option<ToolOutput> {
    let kind = crate::mailbox::protocol::Protocol::kind_in_text(text)?;
    let how = match kind {
        "shutdown_request" => {
            "the lead sends it as a `message` object: {\"type\":\"shutdown_request\",\"reason\":…}"
        }
        "shutdown_response" | "shutdown_approved" | "shutdown_rejected" => {
            "a teammate answers a shutdown request with a `message` object: \
             {\"type\":\"shutdown_response\",\"request_id\":…,\"approve\":…,\"reason\":…}"
        }
        "plan_approval_request" => {
            "a teammate sends it as a `message` object: {\"type\":\"plan_approval_request\",\"plan\":…}"
        }
        "plan_approval_response" => {
            "the lead answers a plan with a `message` object: \
             {\"type\":\"plan_approval_response\",\"request_id\":…,\"approve\":…,\"feedback\":…}"
        }
        "idle_notification" => "the team sends those itself",
        // permission_*, task_assignment, task_completed, teammate_terminated.
        _ => "only Claude Code's own team machinery sends those",
    };
    Some(ToolOutput::error(format!(
        "the message's text is a `{kind}` protocol message, which is not sent as text: {how}; \
         or say it in words"
    )))
}

/// Text to every teammate but the sender (and to the lead, from a teammate).
async fn broadcast(
    team: &crate::team::Team,
    mine: Option<String>,
    input: &SendInput,
) -> ToolOutput {
    let serde_json::Value::String(text) = &input.message else {
        return ToolOutput::error("a broadcast (`*`) carries text, not a structured message");
    };
    if let Some(refused) = protocol_text(text) {
        return refused;
    }
    let mut letter = crate::mailbox::Letter::new(
        mine.unwrap_or_else(|| crate::team::LEAD.to_owned()),
        text.clone(),
    );
    letter.summary = input.summary.clone();
    match team.broadcast(letter).await {
        Ok(to) => ToolOutput::text(format!(
            "Sent to {}; each reads it at its next tool round, or wakes on it if idle.",
            to.join(", ")
        )),
        Err(e) => ToolOutput::error(crate::task::error_chain(&e)),
    }
}

/// Whom the caller can send to, as a clause: `main` (from a child), its running tasks (with
/// their names) and its ended tasks that can be resumed.
fn recipients(service: &TaskService, me: &TaskId) -> String {
    // `main` only for a child: the agent at the top has no one above it.
    let all: Vec<String> = service
        .parent_of(me)
        .map(|_| "main".to_owned())
        .into_iter()
        .chain(service.addresses(me).iter().map(ToString::to_string))
        .collect();
    if all.is_empty() {
        "none of your tasks in this process is running or can be resumed".to_owned()
    } else {
        format!("send to one of: {}", all.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_says_approve_or_approved() {
        let map = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            approval(&map(serde_json::json!({"approve": true}))),
            Some(true)
        );
        assert_eq!(
            approval(&map(serde_json::json!({"approved": false}))),
            Some(false)
        );
        assert_eq!(approval(&map(serde_json::json!({"approve": "yes"}))), None);
        assert_eq!(approval(&map(serde_json::json!({}))), None);
    }
}
