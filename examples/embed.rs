//! A host program, quoted in `docs/embedding.md`: its own tool, agents in code and Markdown,
//! two background subagents and a fork on a scripted model behind the prompt-cache simulator,
//! live events, each child's cost, and a resume. Run: `cargo run --example embed`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use forkhive::prelude::*;
use forkhive::serde_json::json;

/// The scripted model answers by who asks: `AgentContext::current()` is the asking agent.
fn model(request: &Request) -> Response {
    let me = AgentContext::current().expect("asked from inside an agent");
    let n = request.all_messages().len();
    let first = n == 1;
    let task = |d: &str, t: &str| json!({"description": d, "prompt": d, "subagent_type": t});
    match me.agent_type() {
        Some("counter") if first => Response::tool_calls([("WordCount", json!({"text": "a b c"}))]),
        Some("counter") => Response::say("The brief has 3 words."),
        Some("critic") => Response::say("Two sentences could be shorter."),
        _ if me.query_source().is_fork() => Response::say("Forked: the plan holds."),
        _ if first => Response::tool_calls([
            ("Agent", task("count", "counter")),
            ("Agent", task("critique", "critic")),
            // No `subagent_type`: a fork, which shares this agent's prompt cache.
            (
                "Agent",
                json!({"description": "plan", "prompt": "Check the plan."}),
            ),
        ]),
        _ => Response::say(format!("Noted, at message {n}.")),
    }
}

/// The host program of docs/embedding.md (no options).
#[derive(clap::Parser)]
struct Args {}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    <Args as clap::Parser>::parse();
    let dir = tempfile::tempdir()?;
    // 1. A tool of the host's own (background subagents may use it).
    let schema = r#"{"type":"object","properties":{"text":{"type":"string"}}}"#;
    let word_count = FnTool::new(
        ToolDefinition::new("WordCount", "Counts the words of a text", schema)?,
        |input, _| async move {
            let text = input["text"].as_str().unwrap_or_default();
            ToolOutput::text(format!("{} words", text.split_whitespace().count()))
        },
    );
    // 2. Agents: one from a Markdown file, one in code, over the built-ins.
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents)?;
    let critic = "---\nname: critic\ndescription: Critiques a text\ntools: []\n---\nBe brief.\n";
    std::fs::write(agents.join("critic.md"), critic)?;
    let loader = AgentLoader::new().dir(DefinitionSource::Project, &agents);
    let mut registry = loader.load()?;
    let mut counter = AgentDefinition::new("counter", "Counts words", DefinitionSource::Host);
    counter.system_prompt = "You count words with WordCount.".into();
    counter.tools = Some(vec!["WordCount".into()]);
    registry.insert(counter);
    // 3. A scripted model behind the cache simulator, and the Agent tool (fork mode on).
    let scripted = ScriptedBackend::from_fn(|r| Ok(model(r)));
    let backend: Arc<dyn Backend> = Arc::new(PromptCacheSimulator::anthropic(scripted));
    let config = AgentToolConfig::default().with_registry(registry);
    let config = config.with_fork_enabled(true);
    let tools = ToolPool::new([AgentTool::new(config)?.arc(), word_count.arc()])?;
    // 4. Events, live: children started, notifications, failed calls, warnings, stops.
    let events = Arc::new(FnSink(|e: AgentEvent| {
        e.headline().into_iter().for_each(|line| println!("{line}"))
    }));
    let builder = || {
        Agent::builder(Arc::clone(&backend))
            .model("claude-sonnet-4-5")
            .tools(tools.clone())
            .events(events.clone())
            .transcript_dir(dir.path().join("transcripts"))
    };
    // Long enough to be cached: the model's minimum is 1,024 tokens.
    let guide = "Delegate; answer in plain words. ".repeat(160);
    let mut parent = builder().system_prompt(guide).build().await?;
    let run = parent.run("Review the brief.").await.into_result()?;
    println!("parent: {} ({})", run.final_text, run.stop);
    // 5. Each child: type, status, tokens, cache figures and cost at list prices.
    let prices = PriceTable::published();
    for c in run.children() {
        let cost = c
            .cost(&prices)
            .map_or("not priced".into(), |d| format!("${d:.5}"));
        println!("{c}, {cost}");
    }
    // 6. Resume the parent from its transcript: its next request reads the cache it wrote.
    let path = parent.transcript_path().expect("on").to_owned();
    drop(parent);
    let (mut resumed, _) = Agent::resume(builder(), &path).await?;
    let again = resumed.run("Anything else?").await.into_result()?;
    let cached = 100.0 * again.usage.cache_hit_ratio();
    println!("resumed: {} ({cached:.0}% cached)", again.final_text);
    Ok(())
}
