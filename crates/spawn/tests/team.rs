//! Teams: a lead starts two teammates; they work, write to the lead, go idle with an
//! `idle_notification`, wake on a letter, and shut down when the lead asks — each answering
//! `shutdown_approved` and ending with one task notification. Letters to a teammate that has
//! shut down are an error, and the team is flat.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::control::SendMessageTool;
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::mailbox::{Letter, MemoryMailbox};
use forkhive_spawn::runtime::{Agent, StopReason};
use forkhive_spawn::task::{MemoryTaskRegistry, TaskConfig, TaskService};
use forkhive_spawn::team::{MemberState, ShutdownPolicy, Team};
use forkhive_spawn::tool::{Tool, ToolFilter, ToolPool};
use forkhive_transport::Request;
use support::*;

/// A lead's tools: the `Agent` tool with teams on and a `worker` type, and `SendMessage`.
fn lead_tools() -> ToolPool {
    lead_tools_with(Vec::new())
}

/// [`lead_tools`] and `extra` (which teammates get too).
fn lead_tools_with(extra: Vec<Arc<dyn Tool>>) -> ToolPool {
    let mut w = AgentDefinition::new("worker", "a teammate", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_teams_enabled(true)
        .with_warm_fanout(None)
        .with_filter(ToolFilter::default());
    let mut tools = vec![
        AgentTool::new(config).unwrap().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
    ];
    tools.extend(extra);
    ToolPool::new(tools).unwrap()
}

/// The teammate's name a child request is for (its first message says `task for <name>`).
fn who(r: &Request) -> String {
    let first = r.all_messages()[0].text();
    first
        .split("task for ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_owned()
}

/// Tool results (text, is_error) of every message in `messages`, in order.
fn all_results(messages: &[forkhive_core::Message]) -> Vec<(String, bool)> {
    messages
        .iter()
        .flat_map(message_results)
        .map(|(_, t, e)| (t, e))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_and_two_teammates_work_idle_wake_and_shut_down() {
    lead_and_two_teammates(Arc::new(MemoryMailbox::new())).await;
}

/// A mailbox whose every call waits a moment first, as a store across a network would.
#[derive(Debug, Clone)]
struct Slow(MemoryMailbox);

#[async_trait::async_trait]
impl forkhive_spawn::mailbox::Mailbox for Slow {
    async fn send(
        &self,
        to: &forkhive_spawn::mailbox::Inbox,
        letter: Letter,
    ) -> forkhive_spawn::Result<String> {
        tokio::time::sleep(std::time::Duration::from_micros(300)).await;
        self.0.send(to, letter).await
    }
    async fn receive(
        &self,
        inbox: &forkhive_spawn::mailbox::Inbox,
    ) -> forkhive_spawn::Result<Vec<forkhive_spawn::mailbox::Delivered>> {
        tokio::time::sleep(std::time::Duration::from_micros(300)).await;
        self.0.receive(inbox).await
    }
    async fn ack(
        &self,
        inbox: &forkhive_spawn::mailbox::Inbox,
        ids: &[String],
    ) -> forkhive_spawn::Result<()> {
        tokio::time::sleep(std::time::Duration::from_micros(300)).await;
        self.0.ack(inbox, ids).await
    }
    async fn stored(
        &self,
        inbox: &forkhive_spawn::mailbox::Inbox,
    ) -> forkhive_spawn::Result<usize> {
        self.0.stored(inbox).await
    }
    async fn claim_lead(
        &self,
        team: &str,
    ) -> forkhive_spawn::Result<forkhive_spawn::mailbox::LeadClaim> {
        self.0.claim_lead(team).await
    }
    async fn wait_beyond(
        &self,
        inbox: &forkhive_spawn::mailbox::Inbox,
        known: &[String],
        timeout: std::time::Duration,
    ) -> forkhive_spawn::Result<bool> {
        self.0.wait_beyond(inbox, known, timeout).await
    }
}

/// On a mailbox slow to answer, the shutdown request a teammate acted on is acknowledged all
/// the same (its relay ends with it while the store is answering): nothing is left in its
/// inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_mailbox_keeps_no_handled_letter() {
    for _ in 0..5 {
        let mail = Slow(MemoryMailbox::new());
        lead_and_two_teammates(Arc::new(mail.clone())).await;
        let alice = forkhive_spawn::mailbox::Inbox::new("review", "alice").unwrap();
        assert_eq!(
            stored_once_drained(&mail, &alice).await,
            0,
            "a handled letter stayed in alice's inbox"
        );
    }
}

/// The same team, its letters through a real Redis (`scripts/redis-server.sh start`): the
/// lead, the relays and `SendMessage` work unchanged on another mailbox.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_team_works_over_redis() {
    let url = match std::env::var("FORKHIVE_REDIS_URL") {
        Ok(url) => url,
        Err(_) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but FORKHIVE_REDIS_URL is not set")
        }
        Err(_) => {
            eprintln!("skipped: no FORKHIVE_REDIS_URL (run scripts/redis-server.sh start)");
            return;
        }
    };
    let prefix = format!("team{}", std::process::id());
    let mail = forkhive_spawn::mailbox::RedisMailbox::with_prefix(&url, &prefix).unwrap();
    lead_and_two_teammates(Arc::new(mail)).await;
}

async fn lead_and_two_teammates(mailbox: Arc<dyn forkhive_spawn::mailbox::Mailbox>) {
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
        let idles = idle_notices(&text);
        let sent_more = text.contains("one more thing");
        let asked_stop = called(r, "shutdown_request") > 0;
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
        Team::new("review", mailbox)
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
    assert!(idle_notices(&all) >= 3, "{all}");
    // Both approved, and both approvals are in the lead's conversation: a letter holds the
    // lead's run until it is taken.
    let mut approved = std::collections::HashSet::new();
    for who in ["alice", "bob"] {
        if all.contains(&format!(
            r#"teammate_id=\"{who}\" summary=\"shutdown_approved\""#
        )) {
            approved.insert(who.to_owned());
        }
    }
    assert_eq!(approved.len(), 2, "{approved:?} {all}");
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 2, "one notification per teammate");
    // A teammate that approved its shutdown ends completed.
    for n in &ns {
        assert_eq!(n.status, forkhive_core::TaskStatus::Completed, "{n:?}");
    }
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
    // The rebuilt lead is briefed: the roster is its next run's first message.
    let b2 = brain(|r| {
        if last_texts(r)
            .join("\n")
            .contains("<team-roster>You lead team `review`")
        {
            Plan::Reply(say("I know my team"))
        } else {
            Plan::Reply(say("who?"))
        }
    });
    let again = Arc::new(again);
    let mut restarted = lead_in(&again, b2, lead_tools()).await;
    let text = again.brief(&restarted);
    assert!(
        text.starts_with("<team-roster>You lead team `review`."),
        "{text}"
    );
    assert_eq!(
        restarted.run("where were we?").await.final_text,
        "I know my team"
    );
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
        "teammate `alice` has stopped (it shut down, was stopped or failed), so the message was not delivered"
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
                "`team-lead` is the lead's name in a team (in any case); give the teammate another"
                    .to_owned(),
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

/// A teammate whose name a plain worker of the lead's holds is refused and leaves no
/// `stopped` member behind: the name still reaches the worker, not "teammate `w` has
/// stopped". (The name check refuses it before it joins the roster; a start refused after
/// it joined — two starts racing for the name — takes its join back: `Team::withdraw`,
/// tested beside it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_teammate_start_leaves_the_roster_as_it_was() {
    let b = brain(|r| {
        let all = r.all_messages();
        if !is_parent(r) {
            // The worker is busy while the teammate is refused and the letter sent.
            return match all.len() {
                1 => Plan::Reply(calls(&[("l1", "Look", "{}")])),
                _ => Plan::Reply(say("done")),
            };
        }
        match all.len() {
            1 => Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"w","run_in_background":true}"#,
            )])),
            3 => Plan::Reply(calls(&[(
                "a2",
                "Agent",
                r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"w","team_name":"review"}"#,
            )])),
            5 => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"w","message":"more"}"#,
            )])),
            _ => Plan::Reply(say("done")),
        }
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let look = TestTool::sleeper("Look", true, 400).arc() as Arc<dyn Tool>;
    let mut lead = lead_in(&team, b, lead_tools_with(vec![look])).await;
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = lead.params().messages().to_vec();
    let refused = message_results(&msgs[4]);
    assert!(
        refused[0]
            .1
            .starts_with("could not start the agent: the name `w` is taken by task "),
        "{refused:?}"
    );
    assert!(team.roster().is_empty(), "{:?}", team.roster());
    let sent = message_results(&msgs[6]);
    assert!(
        sent[0].1.starts_with("Sent to task "),
        "the name still reaches the worker: {sent:?}"
    );
}

/// `TaskStop` on an idle teammate: the lead's run that stopped it waits for its `killed`
/// notification (an idle teammate does not hold the run, so the run used to return first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_stops_an_idle_teammate_waits_for_its_notification() {
    for _ in 0..20 {
        let b = brain(|r| {
            let all = r.all_messages();
            if !is_parent(r) {
                return Plan::Reply(say("ready"));
            }
            let last = all.last().map(|m| m.text()).unwrap_or_default();
            if last == "start" {
                return Plan::Reply(calls(&[(
                    "a1",
                    "Agent",
                    r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"tm","team_name":"review"}"#,
                )]));
            }
            if last == "stop it" {
                return Plan::Reply(calls(&[("s1", "TaskStop", r#"{"task_id":"tm"}"#)]));
            }
            Plan::Reply(say("ok"))
        });
        let stop: Arc<dyn Tool> = Arc::new(forkhive_spawn::control::TaskStopTool::new().unwrap());
        let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
        let mut lead = lead_in(&team, b, lead_tools_with(vec![stop])).await;
        let run = lead.run("start").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        assert_eq!(team.roster()[0].state, MemberState::Idle);
        let run = lead.run("stop it").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        let killed: Vec<_> = notifications(&lead)
            .into_iter()
            .filter(|n| n.status == forkhive_core::TaskStatus::Killed)
            .collect();
        assert_eq!(
            killed.len(),
            1,
            "the run returned before the killed notification"
        );
        assert_eq!(team.roster()[0].state, MemberState::Stopped);
    }
}

/// The roster file deleted under a running team (its whole directory, as another session's
/// clean-up might) is written again at the next change, whole: the shutdown that follows is
/// recorded, and a lead built from the file gets its team back (a peer's users report their
/// team's config file vanishing mid-session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_file_deleted_mid_session_is_written_again_whole() {
    let dir = tempfile::tempdir().unwrap();
    let roster_file = dir.path().join("teams/review/config.json");
    let b = brain(move |r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        match last_user_text(r).as_str() {
            "go" => Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))])),
            "stop alice" => Plan::Reply(calls(&[(
                "s1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )])),
            _ => Plan::Reply(say("ok")),
        }
    });
    let team = Arc::new(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_roster_file(&roster_file)
            .unwrap(),
    );
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    assert!(
        roster_file.exists(),
        "the roster was written when alice joined"
    );
    std::fs::remove_dir_all(dir.path().join("teams")).unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("stop alice"))
        .await
        .expect("the lead's second run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&roster_file).unwrap()).unwrap();
    let members = saved["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{saved}");
    assert_eq!(members[0]["name"], "alice");
    assert_eq!(members[0]["state"], "stopped");
    let again = Team::new("review", Arc::new(MemoryMailbox::new()))
        .unwrap()
        .with_roster_file(&roster_file)
        .unwrap();
    assert_eq!(again.roster(), team.roster());
}

/// Two leads of one team on one mailbox would share its inboxes and take each other's letters
/// (a peer's users report one session's team wiping another's): the second is refused, in its
/// `Agent` call and its `SendMessage`, until the first team is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lead_of_the_same_team_on_one_mailbox_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        match last_user_text(r).as_str() {
            "go" => Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))])),
            "try" => Plan::Reply(calls(&[
                ("a2", "Agent", &teammate("bob")),
                ("m2", "SendMessage", r#"{"to":"alice","message":"hi"}"#),
            ])),
            "stop alice" => Plan::Reply(calls(&[(
                "s1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )])),
            _ => Plan::Reply(say("ok")),
        }
    });
    let mailbox = || Arc::new(forkhive_spawn::mailbox::FileMailbox::new(dir.path()));
    let first = Arc::new(Team::new("review", mailbox()).unwrap());
    let mut lead = lead_in(&first, Arc::clone(&b), lead_tools()).await;
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let second = Arc::new(Team::new("review", mailbox()).unwrap());
    let mut other = lead_in(&second, Arc::clone(&b), lead_tools()).await;
    let run = other.run("try").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let lock = dir.path().join("teams/review/lead.lock");
    let refusal = format!(
        "team `review` has another lead on this mailbox ({} is locked by another `Team` value \
         in this process); give this team another name, or stop that lead",
        lock.display(),
    );
    let got = all_results(&other.params().messages().to_vec());
    assert_eq!(
        got,
        [(refusal.clone(), true), (refusal, true)],
        "the second lead's calls"
    );
    assert!(second.roster().is_empty());
    // The host's own check, before any lead runs.
    let err = second.claim_lead().await.unwrap_err();
    assert!(
        matches!(&err, forkhive_spawn::Error::TeamTaken { team, .. } if team == "review"),
        "{err}"
    );
    // The first team ends: its teammate shut down, its lead and team dropped.
    let run = lead.run("stop alice").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    drop(lead);
    drop(first);
    // A teammate's task still ending holds the team (and its claim) a moment longer: the
    // claim goes once it has ended, with no call from the host.
    let start = std::time::Instant::now();
    loop {
        match second.claim_lead().await {
            Ok(()) => break,
            Err(e) if start.elapsed() < std::time::Duration::from_secs(5) => {
                assert!(matches!(e, forkhive_spawn::Error::TeamTaken { .. }), "{e}");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Err(e) => panic!("the first team's claim outlived it by 5 s: {e}"),
        }
    }
    let run = other.run("try").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(second.member("bob").unwrap().state, MemberState::Idle);
}

/// A letter to a name no teammate has is refused, with the names there are, and makes no
/// inbox (a peer reports it sent, into an inbox nobody reads).
#[tokio::test]
async fn a_letter_to_a_name_no_teammate_has_is_refused_and_makes_no_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"carol","message":"are you there?"}"#,
            )])),
            _ => Plan::Reply(say("done")),
        }
    });
    let mailbox = Arc::new(forkhive_spawn::mailbox::FileMailbox::new(dir.path()));
    let team = Arc::new(Team::new("review", mailbox).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let got = all_results(&lead.params().messages().to_vec());
    assert_eq!(got.len(), 1);
    assert!(got[0].1, "{got:?}");
    assert_eq!(
        got[0].0,
        "no recipient `carol`: team `review` has no teammate of that name, and no task is running"
    );
    let mut files = Vec::new();
    let mut dirs = vec![dir.path().to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    assert!(
        !files.iter().any(|f| f.to_string_lossy().contains("carol")),
        "{files:?}"
    );
}

/// A teammate's own `SendMessage` to a peer that has shut down comes back to it as an error
/// saying so — not reported sent into an inbox nobody will read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammates_letter_to_a_peer_that_shut_down_is_an_error_to_it() {
    let seen: Arc<std::sync::Mutex<Vec<(String, bool)>>> = Arc::default();
    let seen_by_alice = Arc::clone(&seen);
    let b = brain(move |r| {
        let text = text_of(r);
        if !is_parent(r) {
            if who(r) != "alice" {
                return Plan::Reply(say("B done"));
            }
            let answered = results(r);
            if let Some((_, t, e)) = answered.first() {
                seen_by_alice.lock().unwrap().push((t.clone(), *e));
                return Plan::Reply(say("told the lead"));
            }
            if last_texts(r).join("\n").contains("tell bob hello") {
                return Plan::Reply(calls(&[(
                    "s1",
                    "SendMessage",
                    r#"{"to":"bob","message":"hello"}"#,
                )]));
            }
            return Plan::Reply(say("A done"));
        }
        let bob_asked = called(r, r#"{"to":"bob","message":{"type":"shutdown_request"#) > 0;
        let bob_gone = text.contains(r#"teammate_id=\"bob\" summary=\"shutdown_approved\""#);
        let alice_told = called(r, "tell bob hello") > 0;
        let alice_asked = called(r, r#"{"to":"alice","message":{"type":"shutdown_request"#) > 0;
        let idles = idle_notices(&text);
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ])),
            _ if idles >= 2 && !bob_asked => Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"bob","message":{"type":"shutdown_request"}}"#,
            )])),
            _ if bob_gone && !alice_told => Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"tell bob hello"}"#,
            )])),
            _ if alice_told && idles >= 3 && !alice_asked => Plan::Reply(calls(&[(
                "x2",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )])),
            _ => Plan::Reply(say("waiting")),
        }
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(30), lead.run("go"))
        .await
        .expect("the team finished");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            "teammate `bob` has stopped (it shut down, was stopped or failed), so the message \
             was not delivered"
                .to_owned(),
            true
        )]
    );
    assert!(
        team.roster()
            .iter()
            .all(|m| m.state == MemberState::Stopped),
        "{:?}",
        team.roster()
    );
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
        if text.contains("implemented the plan") && called(r, "shutdown_request") == 0 {
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

/// The lead's run returns once every teammate is idle and their idle notices are in its
/// conversation; the host's next run wakes a teammate with a letter, and the lead waits for it
/// again until it is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leads_run_returns_when_its_teammates_are_idle() {
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            return Plan::Reply(say(if text.contains("second job") {
                "second done"
            } else {
                "first done"
            }));
        }
        let last = last_texts(r).join("\n");
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if last.contains("next, please") {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"second job"}"#,
            )]));
        }
        Plan::Reply(say("noted"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned while alice is idle");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(idle_notices(&all) >= 1, "{all}");
    assert!(all.contains("first done"), "{all}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    // The host's next run: the lead writes to alice and waits for her again.
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("next, please"))
        .await
        .expect("the second run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(
        all.contains("second done"),
        "the second idle notice is in: {all}"
    );
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    // The host ends the team: cancelling the lead stops its teammates.
    lead.cancellation().cancel();
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while team.member("alice").unwrap().state != MemberState::Stopped {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("alice stopped with her lead");
}

/// A teammate's task counts its whole life: every run (its first job, a letter's, its
/// shutdown) adds its tokens to its notification and its record, as its time and tool uses do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammates_usage_counts_every_run_of_its_life() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let asked = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&asked);
    let b = brain(move |r| {
        if !is_parent(r) {
            counted.fetch_add(1, Ordering::SeqCst);
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if last_texts(r).join("\n").contains("next, please") {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"second job"}"#,
            )]));
        }
        Plan::Reply(say("noted"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let secs = std::time::Duration::from_secs(20);
    let run = tokio::time::timeout(secs, lead.run("go")).await.unwrap();
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let run = tokio::time::timeout(secs, lead.run("next, please"))
        .await
        .unwrap();
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    tokio::time::timeout(secs, team.shut_down(None))
        .await
        .unwrap()
        .unwrap();
    let run = tokio::time::timeout(secs, lead.run_pending())
        .await
        .unwrap();
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1, "{ns:?}");
    // Each of her requests was answered with `say` (15 tokens), in at least two runs.
    let asked = asked.load(Ordering::SeqCst);
    assert!(asked >= 2, "{asked} requests");
    assert_eq!(ns[0].usage.total_tokens, 15 * asked, "{:?}", ns[0].usage);
    let service = lead.tree().extensions().get::<TaskService>().unwrap();
    let record = service.registry().get(&ns[0].task_id).await.unwrap();
    assert_eq!(record.usage.total_tokens(), 15 * asked);
    assert_eq!(record.usage.duration_ms, ns[0].usage.duration_ms);
}

/// A teammate told to stop inside a tool that does not return for a minute is cancelled once
/// the team's shutdown grace has passed: it confirms its shutdown, and its lead's run returns
/// (a peer's users report shutdowns that never complete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_cancels_a_teammate_stuck_in_a_tool_after_the_grace() {
    let b = brain(move |r| {
        if !is_parent(r) {
            return Plan::Reply(calls(&[("h", "Hang", "{}")]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                (
                    "x1",
                    "SendMessage",
                    r#"{"to":"alice","message":{"type":"shutdown_request","reason":"enough"}}"#,
                ),
            ]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_shutdown_grace(std::time::Duration::from_millis(300)),
    );
    assert_eq!(
        Team::new("t", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .shutdown_grace(),
        forkhive_spawn::team::SHUTDOWN_GRACE
    );
    let hang = TestTool::sleeper("Hang", true, 60_000).arc();
    let mut lead = lead_in(&team, b, lead_tools_with(vec![hang])).await;
    let started = std::time::Instant::now();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned after alice shut down");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let all = format!("{:?}", lead.params().messages());
    assert!(all.contains("shutdown_approved"), "{all}");
    assert_killed_after_the_grace(&lead);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// A letter to a teammate busy with a long task reaches it mid-task, in its next request after
/// the letter came, not when the task is done (a peer's users report teammates that ignore
/// their inbox until they finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_teammate_reads_a_letter_at_its_next_turn() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    // Alice's turns, and the turn at which the letter was in her request.
    let turns = Arc::new(AtomicUsize::new(0));
    let sent_at: Arc<Mutex<Option<usize>>> = Arc::default();
    let read_at: Arc<Mutex<Option<usize>>> = Arc::default();
    let (t, sent, read) = (
        Arc::clone(&turns),
        Arc::clone(&sent_at),
        Arc::clone(&read_at),
    );
    let b = brain(move |r| {
        if !is_parent(r) {
            let turn = t.fetch_add(1, Ordering::SeqCst) + 1;
            if last_texts(r).join("\n").contains("and report") {
                read.lock().unwrap().get_or_insert(turn);
                return Plan::Reply(say("reporting"));
            }
            // A long task: a slow tool call per turn, for up to forty turns.
            if turn < 40 {
                return Plan::Reply(calls(&[("s", "Slow", "{}")]));
            }
            return Plan::Reply(say("finished"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if called(r, "and report") == 0 {
            // Once she is well into her task (off the worker, whose queue may hold her).
            tokio::task::block_in_place(|| {
                while t.load(Ordering::SeqCst) < 3 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            });
            sent.lock().unwrap().get_or_insert(t.load(Ordering::SeqCst));
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"and report"}"#,
            )]));
        }
        if text_of(r).contains("reporting") && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let slow = TestTool::sleeper("Slow", true, 50).arc();
    let mut lead = lead_in(&team, b, lead_tools_with(vec![slow])).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let (sent, read) = (
        sent_at.lock().unwrap().unwrap(),
        read_at.lock().unwrap().unwrap(),
    );
    assert!(
        read <= sent + 2,
        "sent during her turn {sent}, read at her turn {read}"
    );
    assert!(read < 40, "read only when her task was done");
}

/// A busy teammate stops after its current tool round, not when its whole task is done: it
/// keeps calling a slow tool, and the lead's shutdown request ends it after one more round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_reaches_a_busy_teammate_at_its_next_tool_round() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let rounds = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&rounds);
    let b = brain(move |r| {
        let text = text_of(r);
        if !is_parent(r) {
            // Works forever, one slow call per turn.
            r2.fetch_add(1, Ordering::SeqCst);
            return Plan::Reply(calls(&[("s", "Slow", "{}")]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                (
                    "x1",
                    "SendMessage",
                    r#"{"to":"alice","message":{"type":"shutdown_request","reason":"enough"}}"#,
                ),
            ]));
        }
        let _ = text;
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let slow = TestTool::sleeper("Slow", true, 50).arc();
    let mut lead = lead_in(&team, b, lead_tools_with(vec![slow])).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned after alice shut down");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert!(
        rounds.load(Ordering::SeqCst) <= 3,
        "alice went on for {} turns after the request",
        rounds.load(Ordering::SeqCst)
    );
    let all = format!("{:?}", lead.params().messages());
    // Her approval and her notification are both in the lead's conversation.
    assert!(all.contains("shutdown_approved"), "{all}");
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1, "{all}");
    assert_eq!(ns[0].status, forkhive_core::TaskStatus::Completed);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// With `ShutdownPolicy::Ask` the teammate answers: it rejects with a reason (the lead gets
/// `shutdown_rejected`), then approves the lead's second request and ends. Wrong answers are
/// refused with their reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_may_reject_a_shutdown_with_a_reason() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let seen2 = Arc::clone(&seen);
    let b = brain(move |r| {
        let text = text_of(r);
        let last = last_texts(r).join("\n");
        if !is_parent(r) {
            seen2
                .lock()
                .unwrap()
                .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
            if let Some(at) = last.rfind("\"request_id\":\"") {
                let id: String = last[at + 14..].chars().take_while(|c| *c != '"').collect();
                let second = text.matches("The lead asks you to shut down").count() >= 2;
                if second {
                    return Plan::Reply(calls(&[(
                        "y",
                        "SendMessage",
                        &format!(
                            r#"{{"to":"team-lead","message":{{"type":"shutdown_response","request_id":"{id}","approve":true}}}}"#
                        ),
                    )]));
                }
                return Plan::Reply(calls(&[
                    (
                        "n0",
                        "SendMessage",
                        &format!(
                            r#"{{"to":"team-lead","message":{{"type":"shutdown_response","request_id":"{id}","approve":false}}}}"#
                        ),
                    ),
                    (
                        "n1",
                        "SendMessage",
                        r#"{"to":"team-lead","message":{"type":"shutdown_response","request_id":"forged","approve":true}}"#,
                    ),
                    (
                        "n2",
                        "SendMessage",
                        &format!(
                            r#"{{"to":"team-lead","message":{{"type":"shutdown_response","request_id":"{id}","approve":false,"reason":"tests still running"}}}}"#
                        ),
                    ),
                ]));
            }
            return Plan::Reply(say("working"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        let asked = called(r, "shutdown_request");
        if idle_notices(&text) > 0 && asked == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        if last.contains("shutdown_rejected") {
            return Plan::Reply(calls(&[(
                "x2",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request","reason":"now, please"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_shutdown_policy(ShutdownPolicy::Ask),
    );
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    assert!(all.contains("shutdown_rejected"), "{all}");
    assert!(all.contains("tests still running"), "{all}");
    assert!(all.contains("shutdown_approved"), "{all}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    let seen = seen.lock().unwrap().clone();
    for want in [
        (
            "team protocol: a shutdown_response that rejects the request needs a `reason`",
            true,
        ),
        (
            "team protocol: shutdown answer for `forged` rejected: the lead asked `alice` no such \
             request, or it was answered",
            true,
        ),
        (
            "The lead has your reason for not shutting down; go on with your work.",
            false,
        ),
    ] {
        assert!(
            seen.contains(&(want.0.to_owned(), want.1)),
            "{want:?} not in {seen:?}"
        );
    }
    // Her approval's round was her last: no request of hers carried its result.
    assert!(
        !seen.iter().any(|(t, _)| t.starts_with("Shutdown approved")),
        "{seen:?}"
    );
}

/// A teammate that writes to itself is refused: each letter would wake it for a
/// fresh run, a loop that holds its lead's run and spends tokens until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_cannot_write_to_itself() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let seen2 = Arc::clone(&seen);
    let b = brain(move |r| {
        if !is_parent(r) {
            let got = results(r);
            if got.is_empty() {
                return Plan::Reply(calls(&[
                    ("s1", "SendMessage", r#"{"to":"alice","message":"go on"}"#),
                    ("s2", "SendMessage", r#"{"to":"Alice","message":"go on"}"#),
                ]));
            }
            seen2
                .lock()
                .unwrap()
                .extend(got.into_iter().map(|(_, t, e)| (t, e)));
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            ("you cannot send a message to yourself".to_owned(), true),
            // Names are exact in `SendMessage`: no teammate is `Alice`.
            (
                "no recipient `Alice`; send to one of: main".to_owned(),
                true
            ),
        ]
    );
    team.shut_down(None).await.unwrap();
}

/// Two teams on one file mailbox: one team's teammate starting, stopping and its lead's
/// `shut_down` leave the other team's files alone — its roster and a letter waiting in its
/// inbox (one session's cleanup does not take another's team with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_teams_shutdown_leaves_another_teams_files_alone() {
    use forkhive_spawn::mailbox::{FileMailbox, Inbox, Mailbox};
    let dir = tempfile::tempdir().unwrap();
    let mailbox = Arc::new(FileMailbox::new(dir.path()));
    // The other team: a roster on disk and a letter for its teammate.
    let other_roster = dir.path().join("teams/ops/config.json");
    std::fs::create_dir_all(other_roster.parent().unwrap()).unwrap();
    let roster_bytes = r#"{"name":"ops","leadAgentId":"team-lead@ops","members":[]}"#;
    std::fs::write(&other_roster, roster_bytes).unwrap();
    let other = Team::new("ops", Arc::clone(&mailbox) as _)
        .unwrap()
        .with_roster_file(&other_roster)
        .unwrap();
    let waiting = Inbox::new("ops", "bob").unwrap();
    mailbox
        .send(
            &waiting,
            Letter::new("team-lead", "when you start: check the logs"),
        )
        .await
        .unwrap();
    let team = Arc::new(
        Team::new("review", Arc::clone(&mailbox) as _)
            .unwrap()
            .with_roster_file(dir.path().join("teams/review/config.json"))
            .unwrap(),
    );
    let mut lead = lead_in(&team, lead_of_alice("A done"), lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    team.shut_down(None).await.unwrap();
    drop(lead);
    drop(team);
    assert_eq!(
        std::fs::read_to_string(&other_roster).unwrap(),
        roster_bytes
    );
    let letters = mailbox.receive(&waiting).await.unwrap();
    assert_eq!(
        letters.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
        ["when you start: check the logs"]
    );
    drop(other);
}

/// Exact refusals of `shutdown_response`, straight on the team.
#[tokio::test]
async fn shutdown_answers_are_checked() {
    let team = Team::new("review", Arc::new(MemoryMailbox::new())).unwrap();
    assert_eq!(
        team.answer_shutdown("alice", "r1", true, None)
            .await
            .unwrap_err()
            .to_string(),
        "`alice` is not a running teammate of team `review`"
    );
}

/// A teammate started with `mode: "plan"` cannot run a tool that writes until the lead
/// approves its plan — the permission check holds it, whatever the model writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_mode_holds_a_teammate_until_the_lead_approves() {
    use std::sync::atomic::Ordering;
    let b = brain(|r| {
        let text = text_of(r);
        let last = last_texts(r).join("\n");
        if !is_parent(r) {
            if last.contains("approved your plan") {
                return Plan::Reply(calls(&[("w2", "Write", "{}")]));
            }
            if r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[("w0", "Write", "{}")]));
            }
            if text.contains("w0") && !text.contains("p1") {
                return Plan::Reply(calls(&[
                    (
                        "p1",
                        "SendMessage",
                        r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"write it"}}"#,
                    ),
                    ("w1", "Write", "{}"),
                ]));
            }
            if text.contains("w2") {
                return Plan::Reply(say("written"));
            }
            return Plan::Reply(say("waiting"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"alice","prompt":"task for alice","subagent_type":"worker","name":"alice","team_name":"review","mode":"plan"}"#,
            )]));
        }
        if let Some(id) = last_plan_request(&text)
            && called(r, "plan_approval_response") == 0
        {
            return Plan::Reply(calls(&[(
                "r1",
                "SendMessage",
                &format!(
                    r#"{{"to":"alice","message":{{"type":"plan_approval_response","request_id":"{id}","approve":true}}}}"#
                ),
            )]));
        }
        if text.contains("written") && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let PlanRun {
        team,
        events,
        writes,
        ..
    } = plan_run(b).await;
    assert_eq!(
        writes.load(Ordering::SeqCst),
        1,
        "only the write after approval ran"
    );
    assert!(!team.in_plan_mode("alice"));
    let all = format!("{:?}", events.take());
    assert!(
        all.contains(
            "plan mode: `Write` may run once the lead approves your plan; send it with \
             SendMessage to `team-lead`, message"
        ),
        "{all}"
    );
    assert!(
        all.contains("plan mode: `Write` waits until the lead approves your plan; it has your request and will answer"),
        "{all}"
    );
}

/// A lead in team `review` whose teammates have a `Write` tool that counts its runs, after its
/// run on "go" completed.
struct PlanRun {
    lead: Agent,
    team: Arc<Team>,
    events: Arc<Events>,
    writes: Arc<std::sync::atomic::AtomicUsize>,
}

async fn plan_run(b: Arc<Brain>) -> PlanRun {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let writes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&writes);
    let write = TestTool::new("Write", OBJECT, false, move |_, _| {
        let w = Arc::clone(&w);
        async move {
            w.fetch_add(1, Ordering::SeqCst);
            forkhive_spawn::tool::ToolOutput::text("wrote")
        }
    })
    .arc();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let events = Arc::new(Events::default());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(lead_tools_with(vec![write]))
        .extension(Arc::clone(&team))
        .events(events.clone())
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(40)))
        .build()
        .await
        .unwrap();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    PlanRun {
        lead,
        team,
        events,
        writes,
    }
}

/// A rejected plan leaves its teammate in plan mode: its write after the rejection is still
/// held, and only the write after a later approval runs (a peer's users report plan mode
/// letting work through before the lead's review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_plan_keeps_the_teammate_from_writing() {
    use std::sync::atomic::Ordering;
    let b = brain(|r| {
        let text = text_of(r);
        let last = last_texts(r).join("\n");
        if !is_parent(r) {
            if last.contains("approved your plan") {
                return Plan::Reply(calls(&[("w2", "Write", "{}")]));
            }
            if last.contains("rejected your plan") {
                return Plan::Reply(calls(&[("w1", "Write", "{}")]));
            }
            if text.contains("w1") && !text.contains("p2") {
                return Plan::Reply(calls(&[(
                    "p2",
                    "SendMessage",
                    r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"write it, with tests"}}"#,
                )]));
            }
            if r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[(
                    "p1",
                    "SendMessage",
                    r#"{"to":"team-lead","message":{"type":"plan_approval_request","plan":"write it"}}"#,
                )]));
            }
            if text.contains("w2") {
                return Plan::Reply(say("written"));
            }
            return Plan::Reply(say("waiting"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"alice","prompt":"task for alice","subagent_type":"worker","name":"alice","team_name":"review","mode":"plan"}"#,
            )]));
        }
        let answered = called(r, "plan_approval_response");
        let asked = text.matches("summary=\\\"plan_approval_request").count();
        if asked > answered
            && let Some(id) = last_plan_request(&text)
        {
            let approve = answered > 0;
            return Plan::Reply(calls(&[(
                "r1",
                "SendMessage",
                &format!(
                    r#"{{"to":"alice","message":{{"type":"plan_approval_response","request_id":"{id}","approve":{approve},"feedback":"add tests"}}}}"#
                ),
            )]));
        }
        if text.contains("written") && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x1",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let PlanRun {
        lead,
        team,
        events,
        writes,
    } = plan_run(b).await;
    let all = format!("{:?}", events.take());
    assert_eq!(
        writes.load(Ordering::SeqCst),
        1,
        "only the write after the approval ran: {all}"
    );
    assert!(!team.in_plan_mode("alice"));
    assert!(
        all.contains(
            "plan mode: `Write` may run once the lead approves your plan; send it with \
             SendMessage to `team-lead`, message"
        ),
        "the write after the rejection was held: {all}"
    );
    let said = format!("{:?}", lead.params().messages());
    assert!(said.contains(r#""approve":false"#), "{said}");
    assert!(said.contains(r#""approve":true"#), "{said}");
}

/// `to: "*"`: the lead's broadcast reaches every teammate; a teammate's reaches the others
/// and the lead. Structured broadcasts and broadcasts without a team are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_reaches_every_teammate() {
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            let me = who(r);
            if me == "bob" && r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[(
                    "b1",
                    "SendMessage",
                    r#"{"to":"*","message":"bob here"}"#,
                )]));
            }
            if text.contains("all hands") {
                return Plan::Reply(say(&format!("{me} heard all hands")));
            }
            return Plan::Reply(say(&format!("{me} ready")));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ]));
        }
        if idle_notices(&text) >= 2 && !text.contains("all hands") {
            return Plan::Reply(calls(&[
                ("c1", "SendMessage", r#"{"to":"*","message":"all hands"}"#),
                (
                    "c2",
                    "SendMessage",
                    r#"{"to":"*","message":{"type":"shutdown_request"}}"#,
                ),
            ]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = lead.params().messages().to_vec();
    let all = format!("{msgs:?}");
    assert!(all.contains("alice heard all hands"), "{all}");
    assert!(all.contains("bob heard all hands"), "{all}");
    // Bob's broadcast reached the lead (and alice).
    assert!(all.contains(r#"teammate_id=\"bob\""#), "{all}");
    let results = all_results(&msgs);
    assert!(
        results.contains(&(
            "Sent to alice, bob; each reads it at its next tool round, or wakes on it if idle."
                .to_owned(),
            false
        )),
        "{results:?}"
    );
    assert!(
        results.contains(&(
            "a broadcast (`*`) carries text, not a structured message".to_owned(),
            true
        )),
        "{results:?}"
    );
    // Without a team.
    let b = brain(|r| {
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "c1",
                "SendMessage",
                r#"{"to":"*","message":"anyone?"}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let mut solo = Agent::builder(b)
        .model("m")
        .tools(ToolPool::new([Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>]).unwrap())
        .build()
        .await
        .unwrap();
    assert_eq!(solo.run("go").await.stop, StopReason::Completed);
    assert_eq!(
        all_results(&solo.params().messages().to_vec()),
        [(
            "`*` reaches every teammate of a team; this agent is in no team".to_owned(),
            true
        )]
    );
}

/// A teammate whose run panics is stopped on the roster (never left looking idle), so the lead
/// may start another under its name; `mode` errors are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_that_panics_is_stopped_and_its_name_is_free() {
    expect_panics("alice broke");
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            if text.contains("second alice") {
                return Plan::Reply(say("second alice ready"));
            }
            return Plan::Panic("alice broke");
        }
        match r.all_messages().len() {
            1 => Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"d","prompt":"p","subagent_type":"worker","mode":"plan"}"#,
                ),
                (
                    "a3",
                    "Agent",
                    r#"{"description":"d","prompt":"p","subagent_type":"worker","name":"carol","team_name":"review","mode":"sloppy"}"#,
                ),
            ])),
            _ if text.contains("<task-notification>") && !text.contains("second alice") => {
                Plan::Reply(calls(&[(
                    "a4",
                    "Agent",
                    r#"{"description":"alice","prompt":"task for alice, second alice","subagent_type":"worker","name":"alice","team_name":"review"}"#,
                )]))
            }
            _ if text.contains("second alice ready") && called(r, "shutdown_request") == 0 => {
                Plan::Reply(calls(&[(
                    "x",
                    "SendMessage",
                    r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
                )]))
            }
            _ => Plan::Reply(say("ok")),
        }
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = lead.params().messages().to_vec();
    let results = all_results(&msgs);
    assert!(
        results.contains(&(
            "`mode` is a teammate's permission mode: give `name` and `team_name` with it"
                .to_owned(),
            true
        )),
        "{results:?}"
    );
    assert!(
        results.contains(&(
            "teammate `mode`: unknown permission mode \"sloppy\"; expected one of default, acceptEdits, bypassPermissions, plan, dontAsk, bubble".to_owned(),
            true
        )),
        "{results:?}"
    );
    let all = format!("{msgs:?}");
    assert!(all.contains("second alice ready"), "{all}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// A lead in team `review` with `tools`, whose children have a 400 ms deadline and a 100 ms
/// stall check, after its run on "go" completed.
async fn lead_on_a_deadline(
    b: Arc<Brain>,
    tools: ToolPool,
) -> (Arc<Team>, Arc<TaskService>, Agent) {
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let service = TaskService::new(
        Arc::new(MemoryTaskRegistry::new()),
        TaskConfig::default()
            .with_deadline(Some(std::time::Duration::from_millis(400)))
            .with_stall_after(Some(std::time::Duration::from_millis(100))),
    );
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(&team))
        .extension(Arc::clone(&service))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(40)))
        .build()
        .await
        .unwrap();
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    (team, service, lead)
}

/// A teammate's deadline and stall check count the time it works, not the time it waits for
/// work: idle past both it is neither stalled nor stopped; working past what is left of its
/// deadline it is stopped (`killed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_waiting_for_work_is_neither_stalled_nor_out_of_time() {
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            if text.contains("long job") {
                return Plan::Reply(calls(&[("s", "Slow", "{}")]));
            }
            return Plan::Reply(say("ready"));
        }
        let last = last_texts(r).join("\n");
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if last.contains("work now") {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"long job"}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let slow = TestTool::sleeper("Slow", true, 150).arc();
    let (team, service, mut lead) = lead_on_a_deadline(b, lead_tools_with(vec![slow])).await;
    let alice = team.member("alice").unwrap();
    assert_eq!(alice.state, MemberState::Idle);
    // Idle for longer than the deadline and the stall time together.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    let record = service.registry().get(&alice.task).await.unwrap();
    assert!(!record.stalled, "{record:?}");
    assert!(!record.state.is_terminal(), "{record:?}");
    // Working: a slow tool round after another, past what is left of 400 ms.
    let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run("work now"))
        .await
        .expect("the deadline stopped alice's work");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&lead);
    assert_eq!(ns.len(), 1);
    assert_eq!(
        ns[0].status,
        forkhive_core::TaskStatus::Killed,
        "{:?}",
        ns[0]
    );
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// A teammate cancelled while it waits for work ends as a cancelled agent does: its task
/// `killed`, its notification "was stopped", its transcript's stop record `cancelled` — not
/// `completed` as if it had been asked to shut down. What its last run answered stays its
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_teammate_that_is_cancelled_ends_killed_not_completed() {
    let b = lead_of_alice("ready");
    let dir = tempfile::tempdir().unwrap();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let service = TaskService::new(Arc::new(MemoryTaskRegistry::new()), TaskConfig::default());
    let mut lead = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(lead_tools())
        .extension(Arc::clone(&team))
        .extension(Arc::clone(&service))
        .transcript_dir(dir.path())
        .build()
        .await
        .unwrap();
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let alice = team.member("alice").unwrap();
    assert_eq!(alice.state, MemberState::Idle);
    assert!(service.cancel(&alice.task));
    let record = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let r = service.registry().get(&alice.task).await.unwrap();
            if r.state.is_terminal() {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("alice's task ended");
    assert_eq!(
        record.state,
        forkhive_spawn::task::TaskState::Killed,
        "{record:?}"
    );
    // Her record ends before her notification is delivered (an idle teammate holds no
    // promise of the lead's): until it is queued.
    let queue = lead.pending();
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while queue.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("alice's notification reached the lead's queue");
    let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run_pending())
        .await
        .expect("the lead took alice's notification");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let ns = notifications(&lead);
    let n = ns.last().unwrap();
    assert_eq!(n.status, forkhive_core::TaskStatus::Killed, "{n:?}");
    assert_eq!(n.summary, "Agent \"alice\" was stopped");
    assert_eq!(n.result.as_deref(), Some("ready"));
    // Her transcript ends with the stop record of a cancelled run.
    let path = record.transcript.expect("alice keeps a transcript");
    let text = std::fs::read_to_string(&path).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "stop", "{last}");
    assert_eq!(last["stop"]["reason"], "cancelled", "{last}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// A teammate idle past its deadline is woken by a peer's letter, not only its lead's: it
/// answers, goes idle again, and the lead's run waits for both idle notices (a peer's users
/// report idle notices that come late, or teammates that time out before a peer's message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_letter_wakes_a_teammate_idle_past_its_deadline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let got_pong = Arc::new(AtomicBool::new(false));
    let pong = Arc::clone(&got_pong);
    let b = brain(move |r| {
        let last = last_texts(r).join("\n");
        if !is_parent(r) {
            return match who(r).as_str() {
                "alice" if last.contains(">ping<") => Plan::Reply(calls(&[(
                    "p",
                    "SendMessage",
                    r#"{"to":"bob","message":"pong"}"#,
                )])),
                "alice" if has_tool_result(r) => Plan::Reply(say("answered")),
                "bob" if last.contains("ask alice") => Plan::Reply(calls(&[(
                    "q",
                    "SendMessage",
                    r#"{"to":"alice","message":"ping"}"#,
                )])),
                "bob" if last.contains(">pong<") => {
                    pong.store(true, Ordering::SeqCst);
                    Plan::Reply(say("alice answered"))
                }
                _ => Plan::Reply(say("ready")),
            };
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ]));
        }
        if last.contains("ask bob") {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"bob","message":"ask alice"}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let (team, _service, mut lead) = lead_on_a_deadline(b, lead_tools()).await;
    // Idle for longer than the deadline and the stall time together.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    let before = format!("{:?}", lead.params().messages())
        .matches(r#"teammate_id=\"alice\" summary=\"idle_notification\""#)
        .count();
    let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run("ask bob"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert!(
        got_pong.load(Ordering::SeqCst),
        "alice's answer reached bob"
    );
    for name in ["alice", "bob"] {
        assert_eq!(
            team.member(name).unwrap().state,
            MemberState::Idle,
            "{name}"
        );
    }
    let after = format!("{:?}", lead.params().messages())
        .matches(r#"teammate_id=\"alice\" summary=\"idle_notification\""#)
        .count();
    assert!(
        after > before,
        "alice's idle notice after her answer reached the lead"
    );
    assert!(notifications(&lead).is_empty(), "nobody was stopped");
}

/// A teammate whose definition allows only `Slow` still gets `SendMessage` (the team's tool),
/// and its first message says who it is in which team.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_keeps_send_message_whatever_its_allow_list() {
    // The lead's tools, or the host's own for subagents (without `SendMessage`).
    for own in [false, true] {
        let b = brain(|r| {
            let text = text_of(r);
            if !is_parent(r) {
                let tools: Vec<String> = r.prefix.tools().iter().map(|t| t.name.clone()).collect();
                if r.all_messages().len() == 1 {
                    assert!(
                    text.contains(
                        "You are `carol`, a teammate in team `review`. Your lead is `team-lead`."
                    ),
                    "{text}"
                );
                    return Plan::Reply(calls(&[(
                        "s1",
                        "SendMessage",
                        &format!(
                            r#"{{"to":"team-lead","message":"my tools: {}"}}"#,
                            tools.join(",")
                        ),
                    )]));
                }
                return Plan::Reply(say("sent"));
            }
            if r.all_messages().len() == 1 {
                return Plan::Reply(calls(&[(
                    "a1",
                    "Agent",
                    r#"{"description":"carol","prompt":"task for carol","subagent_type":"narrow","name":"carol","team_name":"review"}"#,
                )]));
            }
            if idle_notices(&text) > 0 && called(r, "shutdown_request") == 0 {
                return Plan::Reply(calls(&[(
                    "x",
                    "SendMessage",
                    r#"{"to":"carol","message":{"type":"shutdown_request"}}"#,
                )]));
            }
            Plan::Reply(say("ok"))
        });
        let mut narrow = AgentDefinition::new("narrow", "one tool", DefinitionSource::Project);
        narrow.system_prompt = "You are narrow.".into();
        narrow.tools = Some(vec!["Slow".into()]);
        let config = AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([narrow]))
            .with_teams_enabled(true)
            .with_warm_fanout(None)
            .with_filter(ToolFilter::default())
            .with_subagent_tools(
                own.then(|| ToolPool::new([TestTool::sleeper("Slow", true, 1).arc()]).unwrap()),
            );
        let tools = ToolPool::new([
            AgentTool::new(config).unwrap().arc(),
            Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
            TestTool::sleeper("Slow", true, 1).arc(),
            TestTool::sleeper("Other", true, 1).arc(),
        ])
        .unwrap();
        let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
        let mut lead = lead_in(&team, b, tools).await;
        let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
            .await
            .expect("the lead's run returned");
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        let all = format!("{:?}", lead.params().messages());
        assert!(
            all.contains("my tools: SendMessage,Slow")
                || all.contains("my tools: Slow,SendMessage"),
            "{all}"
        );
    }
}

/// A lead without `SendMessage` has none to give a teammate, which could then reach nobody:
/// the teammate is not started, and the call says why.
#[tokio::test]
async fn a_teammate_without_send_message_to_have_is_not_started() {
    let b = brain(|r| {
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        Plan::Reply(say("ok"))
    });
    let mut w = AgentDefinition::new("worker", "a teammate", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let config = AgentToolConfig::default()
        .with_registry(AgentRegistry::from_definitions([w]))
        .with_teams_enabled(true);
    let tools = ToolPool::new([AgentTool::new(config).unwrap().arc()]).unwrap();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, tools).await;
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        all_results(&lead.params().messages().to_vec()),
        [(
            "a teammate needs `SendMessage` to reach its lead, and this host gives none: put \
             `SendMessageTool` in the lead's tools"
                .to_owned(),
            true
        )]
    );
    assert!(team.roster().is_empty());
}

/// A shutdown that arrives behind another letter, while the teammate is busy with a long tool,
/// still ends it after that tool round — the relay reads new letters while an earlier one waits
/// in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_behind_a_queued_letter_still_stops_at_the_next_round() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let requests = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&requests);
    let b = brain(move |r| {
        if !is_parent(r) {
            r2.fetch_add(1, Ordering::SeqCst);
            return Plan::Reply(calls(&[("s", "Slow", "{}")]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("bob"))]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let slow = TestTool::sleeper("Slow", true, 400).arc();
    let mut lead = lead_in(&team, b, lead_tools_with(vec![slow])).await;
    let sender = {
        let (team, requests) = (Arc::clone(&team), Arc::clone(&requests));
        tokio::spawn(async move {
            while requests.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            // Bob is in his first slow tool round: a note, then the shutdown behind it.
            team.send("bob", Letter::new("team-lead", "a note"))
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let stop = forkhive_spawn::team::shutdown_request(None);
            team.send("bob", stop.to_letter("team-lead")).await.unwrap();
        })
    };
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    sender.await.unwrap();
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "bob stopped after the round he was in"
    );
    assert_eq!(team.member("bob").unwrap().state, MemberState::Stopped);
    assert!(format!("{:?}", lead.params().messages()).contains("shutdown_approved"));
}

/// A team whose first lead (built with `cancel_children_on_drop(false)`, with a `Slow` tool of
/// 50 ms) ran "go" for `cut_ms` — it started alice, busy then — and was dropped; and a second
/// lead built the same way on it, not run yet.
async fn a_team_that_outlived_its_lead(b: Arc<Brain>, cut_ms: u64) -> (Arc<Team>, Agent) {
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let slow = TestTool::sleeper("Slow", true, 50).arc();
    let build = || {
        Agent::builder(b.clone())
            .model("m")
            .system_prompt("You are the parent.")
            .tools(lead_tools_with(vec![Arc::clone(&slow)]))
            .extension(Arc::clone(&team))
            .cancel_children_on_drop(false)
            .build()
    };
    let mut first = build().await.unwrap();
    let cut = tokio::time::timeout(std::time::Duration::from_millis(cut_ms), first.run("go")).await;
    assert!(cut.is_err(), "the first lead waited for alice");
    drop(first);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Running);
    let second = build().await.unwrap();
    (team, second)
}

/// A team outlives its lead (built with `cancel_children_on_drop(false)` and dropped while
/// alice works), and the host builds a second lead on it. The second lead writes to alice and
/// then waits for her as the first would have: her hold moves onto its queue, and her report
/// and idle notice come to it. Before, both stayed on the first lead's queue, which nobody
/// reads: the second lead's run ended at once and her report was lost to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lead_takes_over_the_teammates_the_first_started() {
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            // Works one slow call at a time until the lead asks for her report, then makes one
            // more before she reports: the second lead's letter is taken by then, so only her
            // own hold keeps its run going.
            if last_user_text(r).contains("and report") {
                return Plan::Reply(calls(&[("s2", "Slow", "{}")]));
            }
            if text.contains("and report") {
                return Plan::Reply(say("alice report"));
            }
            return Plan::Reply(calls(&[("s", "Slow", "{}")]));
        }
        if r.all_messages().len() == 1 && text.contains("go") {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        if r.all_messages().len() == 1 && text.contains("back") {
            return Plan::Reply(calls(&[(
                "m1",
                "SendMessage",
                r#"{"to":"alice","message":"and report"}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let (team, mut second) = a_team_that_outlived_its_lead(b, 300).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), second.run("back"))
        .await
        .expect("the second lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", second.params().messages());
    assert!(all.contains("alice report"), "her report reached it: {all}");
    assert!(idle_notices(&all) >= 1, "{all}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    second.cancellation().cancel();
}

/// Teams on without a `Team` is a wiring mistake caught when the lead is built, with the fix —
/// not when the model first starts a teammate (whose refusal a run would report `Completed`).
#[tokio::test]
async fn teams_on_without_a_team_is_refused_when_the_lead_is_built() {
    let b = brain(|_| Plan::Reply(say("ok")));
    let err = Agent::builder(b.clone())
        .model("m")
        .tools(lead_tools())
        .build()
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid agent configuration: tool `Agent`: the `Agent` tool starts teammates (teams are \
         on), but the agent has no `Team`: give it one with \
         `.extension(Arc::new(Team::new(name, mailbox)?))`, or turn teams off"
    );
    // With its team it builds.
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let _lead = lead_in(&team, b, lead_tools()).await;
}

/// The same takeover for a second lead that only waits: the host serves it
/// (`Team::serve`), and its run waits for alice, busy since the first lead, and gets her report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lead_the_host_serves_waits_for_the_first_leads_teammates() {
    let b = brain(|r| {
        if !is_parent(r) {
            // Six slow rounds, then her report.
            if called(r, "{}") < 6 {
                return Plan::Reply(calls(&[("s", "Slow", "{}")]));
            }
            return Plan::Reply(say("alice report"));
        }
        if r.all_messages().len() == 1 && text_of(r).contains("go") {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        Plan::Reply(say("ok"))
    });
    let (team, mut second) = a_team_that_outlived_its_lead(b, 100).await;
    team.serve(&second);
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), second.run("back"))
        .await
        .expect("the second lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", second.params().messages());
    assert!(all.contains("alice report"), "her report reached it: {all}");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
    second.cancellation().cancel();
}

/// Names that differ only in case are one name in a team: on a case-insensitive disk they would
/// share an inbox file (and `Team-Lead` the lead's).
#[tokio::test]
async fn teammate_names_that_differ_only_in_case_are_refused() {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        let start = |l: &[(&str, &str)]| {
            let inputs: Vec<(&str, String)> =
                l.iter().map(|(id, name)| (*id, teammate(name))).collect();
            let refs: Vec<(&str, &str, &str)> = inputs
                .iter()
                .map(|(id, input)| (*id, "Agent", input.as_str()))
                .collect();
            Plan::Reply(calls(&refs))
        };
        match r.all_messages().len() {
            1 => start(&[("a1", "alice")]),
            3 => start(&[("a2", "ALICE"), ("a3", "Team-Lead")]),
            _ => Plan::Reply(say("done")),
        }
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let msgs = lead.params().messages().to_vec();
    let got: Vec<(String, bool)> = message_results(&msgs[4])
        .into_iter()
        .map(|(_, t, e)| (t, e))
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].1 && got[1].1, "{got:?}");
    assert!(
        got[0]
            .0
            .starts_with("team `review` already has a teammate `alice` (")
            && got[0].0.ends_with(
                "), from whose name `ALICE` differs only in case (on a case-insensitive disk the two \
                 would share an inbox); give this one another name"
            ),
        "{}",
        got[0].0
    );
    assert_eq!(
        got[1].0,
        "`Team-Lead` is the lead's name in a team (in any case); give the teammate another"
    );
    assert_eq!(team.roster().len(), 1);
}

/// Teammates started from a host's `subagent_tools` without `SendMessage` share one pool with
/// the lead's `SendMessage` added: their heads are rendered once and cached once, not once per
/// teammate (which would also push other heads out of the cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teammates_given_the_leads_send_message_share_one_cached_head() {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
                ("a3", "Agent", &teammate("carol")),
            ]));
        }
        Plan::Reply(say("ok"))
    });
    let mut w = AgentDefinition::new("worker", "a teammate", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    let agent_tool = AgentTool::new(
        AgentToolConfig::default()
            .with_registry(AgentRegistry::from_definitions([w]))
            .with_teams_enabled(true)
            .with_warm_fanout(None)
            .with_subagent_tools(Some(
                ToolPool::new([TestTool::sleeper("Slow", true, 1).arc()]).unwrap(),
            )),
    )
    .unwrap();
    let tools = ToolPool::new([
        agent_tool.clone().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
    ])
    .unwrap();
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, tools).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(team.roster().len(), 3);
    assert_eq!(agent_tool.cached_heads(), 1);
    lead.cancellation().cancel();
}

/// An idle teammate asked to shut down with a shutdown grace of zero ends `completed`: it ends
/// at once when asked, so the cancel armed with the request (the grace already passed) does not
/// turn its shutdown into a kill, whichever the teammate sees first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_teammate_asked_to_shut_down_with_no_grace_ends_completed() {
    for round in 0..8 {
        let b = lead_of_alice("ready");
        let team = Arc::new(
            Team::new("review", Arc::new(MemoryMailbox::new()))
                .unwrap()
                .with_shutdown_grace(std::time::Duration::ZERO),
        );
        let mut lead = lead_in(&team, b, lead_tools()).await;
        let run = lead.run("go").await;
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        assert_eq!(team.member("alice").unwrap().state, MemberState::Idle);
        let asked = tokio::time::timeout(std::time::Duration::from_secs(10), team.shut_down(None))
            .await
            .expect("the shutdown returned");
        assert_eq!(asked.unwrap(), ["alice"], "round {round}");
        let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run_pending())
            .await
            .expect("the lead took the notification");
        assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
        let ns = notifications(&lead);
        assert_eq!(ns.len(), 1, "round {round}: {ns:?}");
        assert_eq!(
            ns[0].status,
            forkhive_core::TaskStatus::Completed,
            "round {round}: {:?}",
            ns[0]
        );
        assert_eq!(ns[0].summary, "Agent \"alice\" finished");
    }
}

/// `Team::shut_down` — what a host does before it exits — ends every teammate, idle or busy,
/// and returns once their owners have finished them (both notifications are on the lead's
/// queue); then the team's claim is given up, and another lead may take it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shut_down_ends_every_teammate_and_gives_the_team_up() {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                ("a2", "Agent", &teammate("bob")),
            ]));
        }
        if last_user_text(r).contains("more work") {
            return Plan::Reply(calls(&[("a3", "Agent", &teammate("carol"))]));
        }
        Plan::Reply(say("ok"))
    });
    let mailbox: Arc<dyn forkhive_spawn::mailbox::Mailbox> = Arc::new(MemoryMailbox::new());
    let team = Arc::new(Team::new("review", Arc::clone(&mailbox)).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned while its teammates are idle");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    // Taken while the first lead holds it.
    let other = Team::new("review", Arc::clone(&mailbox)).unwrap();
    assert!(matches!(
        other.claim_lead().await,
        Err(forkhive_spawn::Error::TeamTaken { .. })
    ));
    let before = lead.pending().len();
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        team.shut_down(Some("the host exits".into())),
    )
    .await
    .expect("the shutdown returned")
    .unwrap();
    assert_eq!(asked, ["alice", "bob"]);
    for m in team.roster() {
        assert_eq!(m.state, MemberState::Stopped, "{}", m.name);
    }
    // Each owner delivered its teammate's notification before the shutdown returned, and the
    // relay put both answers in.
    assert_eq!(lead.pending().len(), before + 4);
    other.claim_lead().await.unwrap();
    drop(other);
    // Nothing left to shut down.
    assert!(team.shut_down(None).await.unwrap().is_empty());
    // The lead runs on: its run does not wait for letters nobody relays, and the teammates'
    // answers and notifications reach it once each.
    let run = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        lead.run("anything left?"),
    )
    .await
    .expect("the lead's next run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    for who in ["alice", "bob"] {
        let approved = format!(r#"teammate_id=\"{who}\" summary=\"shutdown_approved\""#);
        assert_eq!(all.matches(&approved).count(), 1, "{who}: {all}");
    }
    assert_eq!(notifications(&lead).len(), 2, "{all}");
    // Taken by the conversation, the answers are acknowledged: the lead's inbox is empty.
    let inbox = team.inbox("team-lead").unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !mailbox.receive(&inbox).await.unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the lead's letters were acknowledged once its conversation took them");
    // The team used again: a new relay of the lead's queue does not put those answers in a
    // second time, though the mailbox kept them until now.
    let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run("more work"))
        .await
        .expect("the third run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let all = format!("{:?}", lead.params().messages());
    for who in ["alice", "bob"] {
        let approved = format!(r#"teammate_id=\"{who}\" summary=\"shutdown_approved\""#);
        assert_eq!(all.matches(&approved).count(), 1, "{who}: {all}");
    }
    assert_eq!(team.shut_down(None).await.unwrap(), ["carol"]);
}

/// Unlike the lead's own request, the host's shutdown ends a teammate whatever the policy:
/// under `Ask`, one stuck in a tool that does not return for a minute is cancelled once the
/// team's grace has passed, and its notification says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shut_down_cancels_a_teammate_stuck_in_a_tool_whatever_the_policy() {
    let (team, mut lead) = alice_hanging_under_ask(
        Arc::new(MemoryMailbox::new()),
        std::time::Duration::from_millis(300),
    )
    .await;
    let host = {
        let team = Arc::clone(&team);
        tokio::spawn(async move {
            // As soon as she is on the roster: one whose run has not started yet is ended
            // after the grace all the same.
            while team.member("alice").is_none() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            team.shut_down(None).await
        })
    };
    let started = std::time::Instant::now();
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned once alice was cancelled");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_eq!(host.await.unwrap().unwrap(), ["alice"]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_killed_after_the_grace(&lead);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
}

/// A host's shutdown dropped before it returns (its own timeout) still ends the teammates it
/// asked — under `Ask` too, where only the shutdown's own timer ends one stuck in a tool; the
/// team's claim stays, since it was not given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_dropped_midway_still_ends_the_teammates_it_asked() {
    let mailbox: Arc<dyn forkhive_spawn::mailbox::Mailbox> = Arc::new(MemoryMailbox::new());
    let (team, mut lead) =
        alice_hanging_under_ask(Arc::clone(&mailbox), std::time::Duration::from_secs(1)).await;
    let host = {
        let team = Arc::clone(&team);
        tokio::spawn(async move {
            while team.member("alice").is_none() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            // Given up long before the grace ends, after it asked.
            tokio::time::timeout(std::time::Duration::from_millis(300), team.shut_down(None)).await
        })
    };
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned once alice was cancelled");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert!(host.await.unwrap().is_err(), "the shutdown was dropped");
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    assert_eq!(notifications(&lead).len(), 1);
    assert!(matches!(
        Team::new("review", mailbox).unwrap().claim_lead().await,
        Err(forkhive_spawn::Error::TeamTaken { .. })
    ));
}

/// A teammate's context says it is one (`AgentKind::Teammate`, as its transcript does): a
/// backend that plays every kind of child tells a teammate from a plain subagent by its kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teammate_is_of_the_teammate_kind_and_a_subagent_is_not() {
    use forkhive_spawn::runtime::{AgentContext, AgentKind};
    let kinds = Arc::new(std::sync::Mutex::new(Vec::<(String, AgentKind)>::new()));
    let seen = Arc::clone(&kinds);
    let b = brain(move |r| {
        if !is_parent(r) {
            let me = AgentContext::current().unwrap();
            let first = r.all_messages()[0].text();
            let who = if first.contains("task for alice") {
                "alice"
            } else {
                "plain"
            };
            seen.lock().unwrap().push((who.to_owned(), me.kind()));
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[
                ("a1", "Agent", &teammate("alice")),
                (
                    "a2",
                    "Agent",
                    r#"{"description":"plain","prompt":"task for plain","subagent_type":"worker"}"#,
                ),
            ]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(Team::new("review", Arc::new(MemoryMailbox::new())).unwrap());
    let mut lead = lead_in(&team, b, lead_tools()).await;
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), lead.run("go"))
        .await
        .expect("the lead's run returned");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let mut kinds = kinds.lock().unwrap().clone();
    kinds.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        kinds,
        [
            ("alice".to_owned(), AgentKind::Teammate),
            ("plain".to_owned(), AgentKind::Subagent)
        ]
    );
    team.shut_down(None).await.unwrap();
}

/// Under `Ask`, a teammate that answers the host's shutdown request without approving it and
/// sits idle is cancelled when the grace passes, and ends `killed` with the grace note: the
/// exception an idle teammate cancelled by a shutdown's deadline makes under `Approve` (it ends
/// as shut down) is not made for one that would not go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_teammate_that_would_not_go_under_ask_ends_killed_at_the_grace() {
    let team = Arc::new(
        Team::new("review", Arc::new(MemoryMailbox::new()))
            .unwrap()
            .with_shutdown_policy(ShutdownPolicy::Ask)
            .with_shutdown_grace(std::time::Duration::from_millis(300)),
    );
    let mut lead = lead_in(&team, lead_of_alice("not now"), lead_tools()).await;
    let run = lead.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let asked = tokio::time::timeout(std::time::Duration::from_secs(20), team.shut_down(None))
        .await
        .expect("the shutdown returned");
    assert_eq!(asked.unwrap(), ["alice"]);
    assert_eq!(team.member("alice").unwrap().state, MemberState::Stopped);
    let run = tokio::time::timeout(std::time::Duration::from_secs(10), lead.run_pending())
        .await
        .expect("the lead took the notification");
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    assert_killed_after_the_grace(&lead);
    assert_eq!(notifications(&lead)[0].result.as_deref(), Some("not now"));
}

/// A team under `ShutdownPolicy::Ask` with `grace`, on `mailbox`, and its lead, whose brain
/// starts `alice`; every turn of hers calls `Hang`, a tool that does not return for a minute.
async fn alice_hanging_under_ask(
    mailbox: Arc<dyn forkhive_spawn::mailbox::Mailbox>,
    grace: std::time::Duration,
) -> (Arc<Team>, Agent) {
    let b = brain(|r| {
        if !is_parent(r) {
            return Plan::Reply(calls(&[("h", "Hang", "{}")]));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        Plan::Reply(say("ok"))
    });
    let team = Arc::new(
        Team::new("review", mailbox)
            .unwrap()
            .with_shutdown_policy(ShutdownPolicy::Ask)
            .with_shutdown_grace(grace),
    );
    let hang = TestTool::sleeper("Hang", true, 60_000).arc();
    let lead = lead_in(&team, b, lead_tools_with(vec![hang])).await;
    (team, lead)
}

/// The lead's one notification: its teammate killed when a 300 ms shutdown grace ran out.
fn assert_killed_after_the_grace(lead: &Agent) {
    let ns = notifications(lead);
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(ns[0].status, forkhive_core::TaskStatus::Killed);
    assert_eq!(
        ns[0].note.as_deref(),
        Some(
            "its shutdown was not done within the team's shutdown grace of 300ms, so it was \
             cancelled"
        )
    );
}
