//! An agent started in a directory of its own (the `Agent` tool's `cwd`): it works there, is
//! told so, and a `cwd` that leaves the host's directory, names no directory, or comes with a
//! fork or a tool that cannot move is refused with a reason the model can act on (the peers'
//! missing per-agent working directory, cx#23095).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use forkhive_spawn::agent_tool::{AgentTool, AgentToolConfig};
use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
use forkhive_spawn::runtime::{Agent, AgentContext, StopReason};
use forkhive_spawn::tool::{ListDir, Tool, ToolPool};
use support::*;

/// The results of the parent's one round of `Agent` calls, each `(text, is_error)`, in order.
async fn round(config: AgentToolConfig, root: &Path, inputs: &[&str]) -> Vec<(String, bool)> {
    round_and_answers(config, root, inputs).await.0
}

/// [`round`], and what the children answered (in the order they answered): every child lists
/// its directory with `LS` and answers with the listing and its `cwd` entry.
async fn round_and_answers(
    config: AgentToolConfig,
    root: &Path,
    inputs: &[&str],
) -> (Vec<(String, bool)>, Vec<String>) {
    let inputs: Vec<String> = inputs.iter().map(|s| (*s).to_owned()).collect();
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let answers: Arc<Mutex<Vec<String>>> = Arc::default();
    let (out, said) = (Arc::clone(&seen), Arc::clone(&answers));
    let b = brain(move |r| {
        if AgentContext::current().is_some_and(|c| c.depth() > 0) {
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[("l1", "LS", "{}")]));
            }
            let (_, listing, is_error) = results(r).pop().unwrap();
            let cwd = r
                .prefix
                .user_context()
                .iter()
                .filter(|(k, _)| k == "cwd")
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
                .join("|");
            let answer = format!("ls {is_error}: {listing} / cwd: {cwd}");
            said.lock().unwrap().push(answer.clone());
            return Plan::Reply(say(&answer));
        }
        // Later turns (a background child's notification) have nothing more to start.
        if !out.lock().unwrap().is_empty() {
            return Plan::Reply(say("parent done"));
        }
        if has_tool_result(r) {
            out.lock()
                .unwrap()
                .extend(results(r).into_iter().map(|(_, t, e)| (t, e)));
            return Plan::Reply(say("parent done"));
        }
        let ids: Vec<String> = (0..inputs.len()).map(|i| format!("a{i}")).collect();
        let list: Vec<(&str, &str, &str)> = ids
            .iter()
            .zip(&inputs)
            .map(|(id, input)| (id.as_str(), "Agent", input.as_str()))
            .collect();
        Plan::Reply(calls(&list))
    });
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(ListDir::new(root).await.unwrap()) as Arc<dyn Tool>,
    ])
    .unwrap();
    let mut parent = Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .build()
        .await
        .unwrap();
    let run = parent.run("go").await;
    assert_eq!(run.stop, StopReason::Completed, "{:?}", run.error);
    let results = seen.lock().unwrap().clone();
    let answers = answers.lock().unwrap().clone();
    (results, answers)
}

/// The error text of the one `Agent` call `input`, which must be refused.
async fn refusal(config: AgentToolConfig, root: &Path, input: &str) -> String {
    let mut got = round(config, root, &[input]).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (text, is_error) = got.remove(0);
    assert!(is_error, "{text}");
    text
}

fn worker() -> AgentRegistry {
    let mut w = AgentDefinition::new("worker", "does one job", DefinitionSource::Project);
    w.system_prompt = "You are a worker.".into();
    AgentRegistry::from_definitions([w])
}

fn call(cwd: &str) -> String {
    format!(
        r#"{{"description":"look","prompt":"look around","subagent_type":"worker","cwd":{cwd:?}}}"#
    )
}

/// A child started with `cwd` lists its own directory, not the parent's, and its user context
/// says where it works (over the host's own `cwd` entry); relative and absolute forms name the
/// same directory.
#[tokio::test]
async fn an_agent_started_in_a_cwd_works_there_and_is_told_so() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("app")).unwrap();
    std::fs::write(root.path().join("app/app.txt"), "a").unwrap();
    std::fs::write(root.path().join("top.txt"), "t").unwrap();
    let real_app = std::fs::canonicalize(root.path().join("app")).unwrap();
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(root.path().to_path_buf()))
        .with_subagent_user_context(vec![
            ("claudeMd".to_owned(), "house rules".to_owned()),
            ("cwd".to_owned(), "/the/host/dir".to_owned()),
        ]);
    let absolute = root.path().join("app").display().to_string();
    let (got, answers) = round_and_answers(
        config,
        root.path(),
        &[
            &call("app"),
            &call(&absolute),
            &call("./app/"),
            r#"{"description":"bg","prompt":"look around","subagent_type":"worker","cwd":"app","run_in_background":true}"#,
        ],
    )
    .await;
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got.iter().all(|(_, is_error)| !is_error), "{got:?}");
    assert!(
        got[3].0.contains("started in the background"),
        "{:?}",
        got[3]
    );
    // Four children: three in the foreground, one in the background.
    assert_eq!(answers.len(), 4, "{answers:?}");
    for text in &answers {
        assert!(text.contains("ls false:"), "{text}");
        assert!(text.contains("app.txt"), "{text}");
        assert!(
            !text.contains("top.txt"),
            "the child listed its parent's: {text}"
        );
        assert!(
            text.contains(&format!("/ cwd: {}", real_app.display())),
            "one cwd entry, the child's: {text}"
        );
    }
    // Without `cwd`, a child works where its parent's tools do.
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(root.path().to_path_buf()));
    let plain = r#"{"description":"look","prompt":"look around","subagent_type":"worker"}"#;
    let got = round(config, root.path(), &[plain]).await;
    assert!(got[0].0.contains("top.txt"), "{:?}", got[0]);
}

/// A `cwd` outside the host's directory — on its face or through a link — missing, not a
/// directory, or empty is refused, and so is one with a fork, with a worktree, or on a host
/// that offers none: each an error result saying what to do, and no child starts.
#[tokio::test]
async fn a_cwd_that_is_not_a_directory_inside_the_root_is_refused_with_why() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("app")).unwrap();
    std::fs::write(root.path().join("file.txt"), "f").unwrap();
    std::fs::create_dir_all(root.path().join(".git/objects")).unwrap();
    std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
    let real = std::fs::canonicalize(root.path()).unwrap();
    let real = real.display();
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(root.path().to_path_buf()));
    let elsewhere = outside.path().display().to_string();
    let got = round(
        config,
        root.path(),
        &[
            &call("../x"),
            &call("app/../app"),
            &call(&elsewhere),
            &call("link"),
            &call("link/nope"),
            &call("link/secret.txt"),
            &call("missing"),
            &call("file.txt"),
            &call("file.txt/x"),
            &call(""),
            &call(".git/objects"),
        ],
    )
    .await;
    let dotdot = |asked: &str| {
        (
            format!(
                "`cwd` `{asked}` has a `..` segment, which is never followed (wherever it \
                 leads): name the directory without it"
            ),
            true,
        )
    };
    let outside = |asked: &str| {
        (
            format!("`cwd` `{asked}` is outside {real}, the directory agents may be started in"),
            true,
        )
    };
    let want = vec![
        dotdot("../x"),
        dotdot("app/../app"),
        outside(&elsewhere),
        outside("link"),
        // Beyond a link that leads out, nothing is asked about: the same answer whether the
        // path exists there or not.
        outside("link/nope"),
        outside("link/secret.txt"),
        (
            format!("`cwd` `missing`: no such directory in {real}"),
            true,
        ),
        ("`cwd` `file.txt` is not a directory".to_owned(), true),
        (
            "`cwd` `file.txt/x`: Not a directory (os error 20)".to_owned(),
            true,
        ),
        (format!("`cwd` is empty: name a directory in {real}"), true),
        (
            "`cwd` `.git/objects` is inside a git directory (`.git`), which is git's, not a \
             place to work"
                .to_owned(),
            true,
        ),
    ];
    assert_eq!(got, want);

    // A worktree is a directory of its own: asked for by the call or by the agent type, it
    // cannot come with `cwd` (refused before git is asked for one).
    std::fs::create_dir_all(root.path().join(".forkhive/worktrees/agent-a1")).unwrap();
    let mut registry = worker();
    let mut isolated = AgentDefinition::new("isolated", "writes", DefinitionSource::Project);
    isolated.isolation = Some("worktree".to_owned());
    registry.insert(isolated);
    let config = AgentToolConfig::default()
        .with_registry(registry)
        .with_isolation_enabled(true)
        .with_worktree_repo(Some(root.path().to_path_buf()))
        .with_cwd_root(Some(root.path().to_path_buf()));
    let got = round(
        config,
        root.path(),
        &[
            r#"{"description":"both","prompt":"p","subagent_type":"worker","cwd":"app","isolation":"worktree"}"#,
            r#"{"description":"typed","prompt":"p","subagent_type":"isolated","cwd":"app"}"#,
            r#"{"description":"in","prompt":"p","subagent_type":"worker","cwd":".forkhive/worktrees/agent-a1","isolation":"none"}"#,
        ],
    )
    .await;
    assert_eq!(
        got,
        vec![
            (
                "`cwd` and `isolation: \"worktree\"` cannot be combined: a worktree is a \
                 directory of its own; drop one of them"
                    .to_owned(),
                true
            ),
            (
                "agent type `isolated` works in a worktree of its own (`isolation: worktree`), \
                 which `cwd` cannot be combined with; pass `\"isolation\": \"none\"` to run \
                 it in `cwd` instead"
                    .to_owned(),
                true
            ),
            (
                "`cwd` `.forkhive/worktrees/agent-a1` is inside `.forkhive/worktrees`, where \
                 agents have their worktrees; name a directory of the main checkout"
                    .to_owned(),
                true
            ),
        ]
    );

    // A fork shares its parent's directory: refused. So is a host that offers no `cwd`.
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_fork_enabled(true)
        .with_cwd_root(Some(root.path().to_path_buf()));
    let fork = r#"{"description":"fork","prompt":"p","cwd":"app"}"#;
    assert_eq!(
        refusal(config, root.path(), fork).await,
        "a fork shares its parent's directory and tools (and prompt cache); name a \
         `subagent_type` to start an agent in `cwd`"
    );
    // A `cwd_root` that is gone: said, for the host to mend.
    let gone = root.path().join("gone");
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(gone.clone()));
    assert_eq!(
        refusal(config, root.path(), &call("app")).await,
        format!(
            "`cwd` is not available: the directory agents may be started in, {}, cannot be \
             read: No such file or directory (os error 2)",
            gone.display()
        )
    );
    let config = AgentToolConfig::default().with_registry(worker());
    assert_eq!(
        refusal(config, root.path(), &call("app")).await,
        "invalid input for tool `Agent`:\nat /: Additional properties are not allowed \
         ('cwd' was unexpected)"
    );
}

/// A tool that changes things but cannot work elsewhere would write in the parent's
/// directory while the child seemed to work in its own: the start is refused, naming it.
#[tokio::test]
async fn a_cwd_whose_writer_tool_cannot_move_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("app")).unwrap();
    let writer: Arc<dyn Tool> = Arc::new(TestTool::new("Write", OBJECT, false, |_, _| async {
        forkhive_spawn::tool::ToolOutput::text("written")
    }));
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(root.path().to_path_buf()))
        .with_subagent_tools(Some(ToolPool::new([writer]).unwrap()));
    let app = std::fs::canonicalize(root.path().join("app")).unwrap();
    assert_eq!(
        refusal(config, root.path(), &call("app")).await,
        format!(
            "cannot start the agent in `{}`: its tool \"Write\" changes things but cannot work \
             in another directory (it does not implement `Tool::rooted`)",
            app.display()
        )
    );
}

/// A host that itself works in a worktree (its `cwd_root` inside a `.forkhive/worktrees`)
/// may start children in its directories: only worktrees below the root are refused.
#[tokio::test]
async fn a_root_inside_a_worktree_still_offers_its_own_directories() {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join(".forkhive/worktrees/host");
    std::fs::create_dir_all(root.join("app")).unwrap();
    std::fs::write(root.join("app/app.txt"), "a").unwrap();
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_cwd_root(Some(root.clone()));
    let (got, answers) = round_and_answers(config, &root, &[&call("app")]).await;
    assert!(!got[0].1, "{got:?}");
    assert!(answers[0].contains("app.txt"), "{answers:?}");
}

/// A teammate started with `cwd` works there too: its `LS` lists the directory, its context
/// names it, and it keeps `SendMessage` to reach its lead; the lead then shuts it down.
#[tokio::test]
async fn a_teammate_started_in_a_cwd_works_there() {
    use forkhive_spawn::control::SendMessageTool;
    use forkhive_spawn::mailbox::MemoryMailbox;
    use forkhive_spawn::team::Team;

    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("app")).unwrap();
    std::fs::write(root.path().join("app/app.txt"), "a").unwrap();
    std::fs::write(root.path().join("top.txt"), "t").unwrap();
    let real_app = std::fs::canonicalize(root.path().join("app")).unwrap();
    let b = brain(|r| {
        let text = text_of(r);
        if !is_parent(r) {
            if !has_tool_result(r) {
                return Plan::Reply(calls(&[("l1", "LS", "{}")]));
            }
            if called(r, "SendMessage") == 0 {
                let (_, listing, _) = results(r).pop().unwrap();
                let cwd: Vec<&str> = r
                    .prefix
                    .user_context()
                    .iter()
                    .filter(|(k, _)| k == "cwd")
                    .map(|(_, v)| v.as_str())
                    .collect();
                let note = format!("listed {} in {}", listing.replace('\n', ","), cwd.join("|"));
                return Plan::Reply(calls(&[(
                    "s1",
                    "SendMessage",
                    &serde_json::json!({"to": "team-lead", "message": note}).to_string(),
                )]));
            }
            return Plan::Reply(say("done"));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[(
                "a1",
                "Agent",
                r#"{"description":"alice","prompt":"task for alice","subagent_type":"worker","name":"alice","team_name":"review","cwd":"app"}"#,
            )]));
        }
        if idle_notices(&text) > 0 && called(r, "shutdown_request") == 0 {
            return Plan::Reply(calls(&[(
                "x",
                "SendMessage",
                r#"{"to":"alice","message":{"type":"shutdown_request"}}"#,
            )]));
        }
        Plan::Reply(say("ok"))
    });
    let config = AgentToolConfig::default()
        .with_registry(worker())
        .with_teams_enabled(true)
        .with_warm_fanout(None)
        .with_cwd_root(Some(root.path().to_path_buf()));
    let tools = ToolPool::new([
        AgentTool::new(config).unwrap().arc(),
        Arc::new(SendMessageTool::new().unwrap()) as Arc<dyn Tool>,
        Arc::new(ListDir::new(root.path()).await.unwrap()) as Arc<dyn Tool>,
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
        all.contains(&format!("listed app.txt in {}", real_app.display())),
        "{all}"
    );
    assert!(
        !all.contains("top.txt"),
        "the teammate listed its lead's directory: {all}"
    );
}
