//! Teams: a lead starts two teammates; they work, write to the lead, go idle with an
//! `idle_notification`, wake on a letter, and shut down when the lead asks — each answering
//! `shutdown_approved` and ending with one task notification. Letters to a teammate that has
//! shut down are an error, and the team is flat.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_core::notification::find_notifications;
use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::control::SendMessageTool;
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::mailbox::{Letter, MemoryMailbox};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::team::{MemberState, Team};
use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
use forkhive_transport::Request;
use support::*;

fn text_of(r: &Request) -> String {
    r.all_messages()
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A lead's tools: the `Agent` tool with teams on and a `worker` type, and `SendMessage`.
fn lead_tools() -> ToolPool {
    let mut w = AgentDefinition::new("worker", "a teammate", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_teams_enabled(true)
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
    ])
    .unwrap()
}

fn teammate(name: &str) -> String {
    format!(
        r#"{{"description":"{name}","prompt":"task for {name}","subagent_type":"worker","name":"{name}","team_name":"review"}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_and_two_teammates_work_idle_wake_and_shut_down() {
    let b = brain(|r| {
        let all = r.all_messages();
        let text = text_of(r);
        if !is_parent(r) {
            let first = all[0].text();
            let alice = first.contains("task for alice");
            if text.contains("one more thing") {
                return Plan::Reply(say("more done"));
            }
            return match (alice, all.len()) {
                (true, 1) => Plan::Reply(calls(&[(
                    "s1",
                    "SendMessage",
                    r#"{"to":"team-lead","message":"found the bug in auth.rs","summary":"bug found"}"#,
                )])),
                (true, _) => Plan::Reply(say("A done")),
                (false, _) => Plan::Reply(say("B done")),
            };
        }
        let idles = text.matches("idle_notification").count();
        let sent_more = text.contains("one more thing");
        let asked_stop = text.contains("shutdown_request");
        match all.len() {
            1 => Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ])),
            _ if idles >= 2 && !sent_more => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"one more thing"}"#,
            )])),
            _ if idles >= 3 && sent_more && !asked_stop => Plan::Reply(calls(&[
                (
                    "x1",
                    "SendMessage",
                    r#"{"to":"alice","message":{"type":"shutdown_request","reason":"done"}}"#,
                ),
                (
                    "x2",
                    "SendMessage",
                    r#"{"to":"bob","message":{"type":"shutdown_request"}}"#,
                ),
            ])),
            _ => Plan::Reply(say("waiting")),
        }
    });
    let tools = lead_tools();
    let dir = tempfile::tempdir().unwrap();
    let roster_file = dir.path().join("teams/review/config.json");
    let team = Arc::new(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_roster_file(&roster_file)
            .unwrap(),
    );
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .extension(Arc::clone(&service))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(30)))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the team finished");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(
        all.contains(r#"<teammate-message teammate_id=\"alice\" summary=\"bug found\">found the bug in auth.rs</teammate-message>"#),
        "{all}"
    );
    assert!(all.matches("idle_notification").count() >= 3, "{all}");
    // Both approved; an approval may still be on its way to the lead's conversation when the
    // teammates' notifications end the lead's run, so the inbox counts too.
    let lead_inbox = team.inbox("team-lead").unwrap();
    let mut approved: std::collections::HashSet<String> = team
        .mailbox()
        .receive(&lead_inbox)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.text.contains("shutdown_approved"))
        .map(|d| d.from)
        .collect();
    for who in ["alice", "bob"] {
        if all.contains(&format!(
            r#"teammate_id=\"{who}\" summary=\"shutdown_approved\""#
        )) {
            approved.insert(who.to_owned());
        }
    }
    assert_eq!(approved.len(), 2, "{approved:?} {all}");
    let ns: Vec<_> = lead
        .params()
        .messages()
        .iter()
        .flat_map(|m| find_notifications(m).unwrap())
        .collect();
    assert_eq!(ns.len(), 2, "one notification per teammate");
    let roster = team.roster();
    assert_eq!(roster.len(), 2);
    assert!(
        roster.iter().all(|m| m.state == MemberState::Stopped),
        "{roster:?}"
    );
    let alice = team.member("alice").unwrap();
    assert_eq!(alice.agent_type, "worker");
    // The roster was kept beside the mailboxes; a restarted lead gets its team back.
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&roster_file).unwrap()).unwrap();
    assert_eq!(saved["leadAgentId"], "team-lead@review");
    assert_eq!(saved["members"].as_array().unwrap().len(), 2);
    assert!(
        saved["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "stopped")
    );
    let again = Team::new("review", Arc::new(MemoryMailbox::new()))
        .unwrap()
        .with_roster_file(&roster_file)
        .unwrap();
    assert_eq!(again.roster(), team.roster());
    let summary = again.roster_summary();
    assert!(
        summary.starts_with("You lead team `review`. Its teammates: alice (worker, stopped, task "),
        "{summary}"
    );
    std::fs::write(dir.path().join("bad.json"), "[]").unwrap();
    assert_eq!(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_roster_file(dir.path().join("bad.json"))
            .unwrap_err()
            .to_string(),
        format!(
            "mailbox review/config.json: {} is not a team roster: no `members` array",
            dir.path().join("bad.json").display()
        )
    );
    // After its shutdown, a letter to it is an error, never a silent loss.
    assert_eq!(
        team.send("alice", Letter::new("team-lead", "still there?"))
            .await
            .unwrap_err()
            .to_string(),
        "teammate `alice` has shut down, so the message was not delivered"
    );
    assert_eq!(
        team.send("carol", Letter::new("team-lead", "hi"))
            .await
            .unwrap_err()
            .to_string(),
        "team `review` has no teammate `carol`"
    );
}

/// Every refusal on the way to a teammate, with its exact text.
#[tokio::test]
async fn teammate_refusals_say_what_was_wrong() {
    let b = brain(|r| {
        let all = r.all_messages();
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        match all.len() {
            1 => Plan::Reply(calls(&[
                (
                    "a1",
                    "Agent",
                    r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"x","team_name":"other"}"#,
                ),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"team-lead","team_name":"review"}"#,
                ),
                (
                    "m1",
                    "SendMessage",
                    r#"{"to":"nobody","message":{"type":"shutdown_request"}}"#,
                ),
            ])),
            _ => Plan::Reply(say("done")),
        }
    });
    let tools = lead_tools();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .build()
        .await
        .unwrap();
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = lead.params().messages().to_vec();
    let got: Vec<(String, bool)> = message_results(&msgs[2])
        .into_iter()
        .map(|(_, t, e)| (t, e))
        .collect();
    assert_eq!(
        got,
        [
            (
                "no team `other` here; this agent's team is `review`".to_owned(),
                true
            ),
            (
                "`team-lead` is the lead's name in a team; give the teammate another".to_owned(),
                true
            ),
            (
                "a structured message goes to a teammate; `nobody` is not one: send it text"
                    .to_owned(),
                true
            ),
        ]
    );
    assert!(team.roster().is_empty());
}

/// The last `requestId` of a plan request in the lead's conversation.
fn last_plan_request(text: &str) -> Option<String> {
    let at = text.rfind("plan_approval_request")?;
    let rest = &text[at..];
    let key = "requestId\\\":\\\"";
    let start = rest.find(key)? + key.len();
    let end = rest[start..].find('\\')?;
    Some(rest[start..start + end].to_owned())
}

/// Plan approval: the teammate asks, the lead rejects with feedback, the teammate revises and
/// asks again, the lead approves and the teammate goes on. (A forged answer is refused by
/// `PlanGate`: see its unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_rejected_then_approved_by_the_lead_only() {
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            let last = last_texts(r).join("\n");
            if last.contains("approved your plan") {
                return Plan::Reply(say("implemented the plan"));
            }
            if last.contains("rejected your plan: add tests") {
                return Plan::Reply(calls(&[(
                    "p2",
                    "SendMessage",
                    r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"1. fix 2. test"}}"#,
                )]));
            }
            if r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[(
                    "p1",
                    "SendMessage",
                    r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"1. fix"}}"#,
                )]));
            }
            return Plan::Reply(say("waiting for the lead"));
        }
        let requests = text.matches("summary=\\\"plan_approval_request").count();
        let responses = text.matches("plan_approval_response").count();
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if text.contains("implemented the plan") && !text.contains("shutdown_request") {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        if requests > responses
            && let Some(id) = last_plan_request(&text)
        {
            let approve = requests >= 2;
            return Plan::Reply(calls(&[(
                "r1",
                "SendMessage",
                &format!(
                    r#"{{"to":"alice","message":{{"type":"plan_approval_response","request_id":"{id}","approve":{approve},"feedback":"add tests"}}}}"#
                ),
            )]));
        }
        Plan::Reply(say("waiting"))
    });
    let tools = lead_tools();
    let mailbox = Arc::new(MemoryMailbox::new());
    let team = Arc::new(Team::new("review", mailbox.clone()).unwrap());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(30)))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the team finished");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(all.contains("implemented the plan"), "{all}");
    assert_eq!(
        all.matches("summary=\\\"plan_approval_request").count(),
        2,
        "{all}"
    );
    assert!(!team.awaiting_plan("alice"));
    assert!(all.contains("\"approved\":false") || all.contains("\"approve\":false"));
}
