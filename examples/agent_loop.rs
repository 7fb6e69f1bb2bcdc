//! One agent with two real tools (`Read`, `LS`) over a directory, printing its turns and tool
//! calls as they happen.
//!
//! ```text
//! cargo run --example agent_loop -- [DIR] [--prompt TEXT] [--transcript-dir DIR]
//!     [--backend scripted|anthropic|openai --base-url URL --model M]
//! ```
//!
//! By default the model is scripted (it lists the directory, reads the first file it finds and
//! reports what it saw) and sits behind the prompt-cache simulator, so the run is offline and
//! shows what each turn read from the cache. With `--backend`, the same loop runs against a
//! real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use forkhive::core::{ContentBlock, Message, RawJson, Role, Usage};
use forkhive::spawn::runtime::{Agent, EventKind, FnSink, Limits};
use forkhive::spawn::tool::{ListDir, ReadFile, ToolPool};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::simulator::PromptCacheSimulator;
use forkhive::transport::{Backend, ModelStop, Request, Response, ScriptedBackend};

/// One agent with `Read` and `LS` over a directory, its turns and tool calls printed live.
///
/// With --backend anthropic or openai, the key comes from ANTHROPIC_API_KEY or OPENAI_API_KEY
/// (not needed for a local server).
#[derive(clap::Parser)]
#[command(name = "agent_loop")]
struct Args {
    /// The directory the tools may read.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// The user's prompt.
    #[arg(
        long,
        default_value = "Look at this directory, read one file in it and tell me what it is."
    )]
    prompt: String,
    /// The model: a scripted one behind the prompt-cache simulator, or a real server.
    #[arg(long, default_value = "scripted", value_parser = ["scripted", "anthropic", "openai"])]
    backend: String,
    /// The real server's base URL.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name for a real server.
    #[arg(long)]
    model: Option<String>,
    /// Keep the agent's transcript in this directory.
    #[arg(long)]
    transcript_dir: Option<PathBuf>,
}

/// The scripted model: list the directory, read the first file, then report.
fn scripted_model(request: &Request) -> forkhive::transport::Result<Response> {
    let messages = request.all_messages();
    let step = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    let last_result = messages
        .last()
        .and_then(|m| m.content.first())
        .and_then(|b| match b {
            ContentBlock::ToolResult { content, .. } => Some(content.text()),
            _ => None,
        })
        .unwrap_or_default();
    let call = |id: &str, name: &str, input: serde_json::Value| Response {
        message: Message::assistant(vec![
            ContentBlock::text(format!("Calling {name}.")),
            ContentBlock::tool_use(id, name, RawJson::from_value(&input)),
        ]),
        stop_reason: Some(ModelStop::ToolUse),
        usage: Usage {
            output_tokens: 20,
            ..Usage::default()
        },
        id: None,
        model: None,
    };
    let answer = |text: String| {
        Response::text(
            text,
            Usage {
                output_tokens: 40,
                ..Usage::default()
            },
        )
    };
    Ok(match step {
        0 => call("toolu_ls", "LS", serde_json::json!({"path": "."})),
        1 => match last_result.lines().find(|l| !l.ends_with('/')) {
            Some(file) => call("toolu_read", "Read", serde_json::json!({"path": file})),
            None => answer("The directory holds no files I can read.".into()),
        },
        _ => {
            let first = last_result.lines().next().unwrap_or("").trim();
            answer(format!(
                "I read one file; it has {} lines and begins with: {first:?}",
                last_result.lines().count()
            ))
        }
    })
}

/// The backend, the model name, and the simulator when the model is scripted.
type Chosen = (
    Arc<dyn Backend>,
    String,
    Option<Arc<PromptCacheSimulator<ScriptedBackend>>>,
);

fn backend(a: &Args) -> Result<Chosen, String> {
    match a.backend.as_str() {
        "scripted" => {
            let sim = Arc::new(PromptCacheSimulator::anthropic(ScriptedBackend::from_fn(
                scripted_model,
            )));
            Ok((
                sim.clone(),
                a.model
                    .clone()
                    .unwrap_or_else(|| "claude-sonnet-4-5".into()),
                Some(sim),
            ))
        }
        "anthropic" | "openai" => {
            let openai = a.backend == "openai";
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            let (url_var, key_var, url, model) = if openai {
                (
                    "OPENAI_BASE_URL",
                    "OPENAI_API_KEY",
                    "https://api.openai.com/v1",
                    "gpt-4o-mini",
                )
            } else {
                (
                    "ANTHROPIC_BASE_URL",
                    "ANTHROPIC_API_KEY",
                    "https://api.anthropic.com",
                    "claude-sonnet-4-5",
                )
            };
            let url = a
                .base_url
                .clone()
                .or_else(|| env(url_var))
                .unwrap_or_else(|| url.into());
            let mut config = HttpConfig::new(url);
            if let Some(k) = env(key_var) {
                config = config.with_api_key(k);
            }
            let b = if openai {
                HttpBackend::openai(config)
            } else {
                HttpBackend::anthropic(config)
            }
            .map_err(|e| forkhive::core::error::chain(&e))?;
            Ok((
                Arc::new(b),
                a.model.clone().unwrap_or_else(|| model.into()),
                None,
            ))
        }
        other => Err(format!(
            "--backend must be scripted, anthropic or openai, not {other:?}"
        )),
    }
}

/// The directory's files, one per line, sorted (at most `limit`): the context an agent is
/// usually given about where it works.
fn tree(root: &std::path::Path, limit: usize) -> String {
    fn walk(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>, limit: usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if out.len() >= limit {
                return;
            }
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if !name.ends_with("target") && !name.starts_with('.') {
                    out.push(format!("{name}/"));
                    walk(&e.path(), &format!("{name}/"), out, limit);
                }
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out, limit);
    out.join("\n")
}

fn print_event(kind: &EventKind, turn: u32) {
    match kind {
        EventKind::TurnStarted => println!("── turn {turn}"),
        EventKind::CacheBreak { at } => println!("   cache break: {at}"),
        EventKind::ToolCallStarted { name, id } => println!("   → {name} ({id})"),
        EventKind::ToolCallFinished {
            name,
            is_error,
            duration,
            ..
        } => println!(
            "   ← {name} {} in {duration:?}",
            if *is_error { "failed" } else { "ok" }
        ),
        EventKind::ResponseReceived { usage, stop_reason } => println!(
            "   model: {} (input {} uncached + {} written + {} read from cache, output {})",
            stop_reason.as_ref().map_or("?", |s| s.as_str()),
            usage.input_tokens,
            usage.cache_write_tokens,
            usage.cache_read_tokens,
            usage.output_tokens
        ),
        EventKind::Stopped { reason, .. } => println!("── stopped: {reason}"),
        _ => {}
    }
}

async fn run() -> Result<(), String> {
    let a = <Args as clap::Parser>::parse();
    let (backend, model, sim) = backend(&a)?;
    let tools = ToolPool::new([
        Arc::new(
            ReadFile::new(&a.dir)
                .await
                .map_err(|e| forkhive::core::error::chain(&e))?,
        ) as _,
        Arc::new(
            ListDir::new(&a.dir)
                .await
                .map_err(|e| forkhive::core::error::chain(&e))?,
        ) as _,
    ])
    .map_err(|e| forkhive::core::error::chain(&e))?;
    let mut builder = Agent::builder(backend)
        .model(model)
        .system_prompt(
            "You are a careful engineer exploring a directory with the LS and Read tools. \
             Use them, then answer in two sentences.",
        )
        .user_context("directoryStructure", tree(&a.dir, 400))
        .tools(tools)
        .limits(
            Limits::default()
                .with_max_turns(Some(8))
                .with_max_output_tokens(512),
        )
        .events(Arc::new(FnSink(
            |e: forkhive::spawn::runtime::AgentEvent| print_event(&e.kind, e.turn),
        )));
    if let Some(dir) = &a.transcript_dir {
        builder = builder.transcript_dir(dir);
    }
    let mut agent = builder
        .build()
        .await
        .map_err(|e| forkhive::core::error::chain(&e))?;
    println!("agent {} over {}", agent.id(), a.dir.display());
    let run = agent.run(a.prompt.clone()).await;
    if let Some(e) = &run.error {
        return Err(format!(
            "{e}: {}",
            std::error::Error::source(&**e)
                .map(ToString::to_string)
                .unwrap_or_default()
        ));
    }
    println!("\nanswer: {}", run.final_text);
    println!(
        "{} turns, {} tool calls, {} input tokens ({} read from cache, {:.1}% hit), {} output",
        run.turns.len(),
        run.tool_calls(),
        run.usage.total_input_tokens(),
        run.usage.cache_read_tokens,
        run.usage.cache_hit_ratio() * 100.0,
        run.usage.output_tokens
    );
    if sim.is_some() {
        println!("(scripted model behind the prompt-cache simulator; --backend for a real one)");
    }
    if run.usage.cache_read_tokens == 0 {
        // A provider caches nothing below a model's minimum prompt length, so a short
        // conversation reads 0 tokens from the cache: not a broken cache.
        let min =
            forkhive::transport::simulator::anthropic_min_cacheable_tokens(agent.params().model());
        println!(
            "(nothing was read from the cache: each request was under the model's minimum \
             cacheable prompt of {min} tokens, or the first of its prefix)"
        );
    }
    if let Some(p) = agent.transcript_path() {
        println!("transcript: {}", p.display());
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
