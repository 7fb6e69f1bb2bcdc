//! Cache economics of a fork fan-out, offline: a parent conversation of realistic size forks N
//! children through the prompt-cache simulator, and the cost is compared with spawning N fresh
//! subagents ("Chapter 9: Sub-Agents and the Fork Pattern — Cache Efficiency Analysis Example").
//!
//! ```text
//! cargo run --example cache_economics -- [--prefix-tokens N] [--children N]
//!     [--wire anthropic|openai] [--dump-requests DIR]
//!     [--backend anthropic|openai --base-url URL [--model NAME]]
//! ```
//!
//! With `--backend`, the same requests (parent, then the children one after another) also go
//! to a real server, and the usage it reports is printed beside the simulator's prediction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;

use forkhive::core::{
    CacheSafeParams, ContentBlock, ForkPrefix, Message, RawJson, ToolDefinition, Usage,
};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::recording::RecordingBackend;
use forkhive::transport::simulator::{PromptCacheSimulator, estimate_tokens};
use forkhive::transport::{
    AnthropicCodec, Backend, Codec, OpenAiCodec, Request, Response, ScriptedBackend,
};

/// Published price ratios relative to base input tokens.
const WRITE_5M: f64 = 1.25;
const WRITE_1H: f64 = 2.0;
const READ: f64 = 0.1;

/// A fork fan-out of a large parent through the prompt-cache simulator, request by request,
/// against fresh subagents that share no cache.
#[derive(clap::Parser)]
#[command(name = "cache_economics")]
struct Args {
    /// The parent's prefix, in tokens.
    #[arg(long, default_value_t = 62_000)]
    prefix_tokens: u64,
    /// How many fork children.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    children: usize,
    /// The wire format the simulator prices.
    #[arg(long, default_value = "anthropic", value_parser = ["anthropic", "openai"])]
    wire: String,
    /// Write every request body to this directory.
    #[arg(long = "dump-requests", value_name = "DIR")]
    dump: Option<String>,
    /// A real server instead of the simulator (sets the wire; needs --base-url).
    #[arg(long, value_parser = ["anthropic", "openai"], requires = "base_url")]
    backend: Option<String>,
    /// The real server's base URL.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name.
    #[arg(long, default_value = "claude-sonnet-4-5")]
    model: String,
}

fn parse_args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    if let Some(b) = &a.backend {
        a.wire = b.clone();
    }
    a
}

/// Text of about `tokens` tokens (4 bytes each), deterministic.
fn filler(label: &str, tokens: u64) -> String {
    let line = format!(
        "{label}: the module validates its input, handles each error and logs the outcome.\n"
    );
    let mut s = String::with_capacity(tokens as usize * 4);
    while (s.len() as u64) < tokens * 4 {
        s.push_str(&line);
    }
    s.truncate(tokens as usize * 4);
    s
}

/// Seed 004's shape, scaled to `total`: system + tools 10/62, history 50/62, the parent's
/// fan-out turn 2/62.
fn parent(model: &str, total: u64, children: usize) -> (CacheSafeParams, Message) {
    let system_tokens = total * 10 / 62;
    let history_tokens = total * 50 / 62;
    let turn_tokens = total * 2 / 62;
    let tool = ToolDefinition::new(
        "Agent",
        "Delegate a task to a worker.",
        r#"{"type":"object","properties":{"prompt":{"type":"string"}},"required":["prompt"]}"#,
    )
    .expect("valid schema");
    let mut history = Vec::new();
    let turns = (history_tokens / 2000).max(1);
    for i in 0..turns {
        history.push(Message::user_text(filler(&format!("question {i}"), 1000)));
        history.push(Message::assistant_text(filler(
            &format!("answer {i}"),
            history_tokens / turns - 1000,
        )));
    }
    let params = CacheSafeParams::builder(model)
        .system_block(filler("rule", system_tokens))
        .tool(tool)
        .messages(history)
        .build();
    let mut content = vec![ContentBlock::text(filler(
        "plan",
        turn_tokens.saturating_sub(40 * children as u64),
    ))];
    for i in 0..children {
        let input = RawJson::parse(&format!(
            r#"{{"prompt":"Audit part {i} of the repository."}}"#
        ))
        .expect("valid JSON");
        content.push(ContentBlock::tool_use(
            format!("toolu_{i:02}"),
            "Agent",
            input,
        ));
    }
    (params, Message::assistant(content))
}

fn cost(u: &Usage) -> f64 {
    let write_5m = u.cache_write_tokens - u.cache_write_1h_tokens;
    u.input_tokens as f64
        + write_5m as f64 * WRITE_5M
        + u.cache_write_1h_tokens as f64 * WRITE_1H
        + u.cache_read_tokens as f64 * READ
}

fn row(label: &str, u: &Usage, real: Option<&Usage>) {
    print!(
        "{label:<10} {:>9} {:>12} {:>11} {:>9.1}% {:>12.0}",
        u.input_tokens,
        u.cache_write_tokens,
        u.cache_read_tokens,
        100.0 * u.cache_hit_ratio(),
        cost(u)
    );
    if let Some(r) = real {
        print!(
            "   | {:>9} {:>12} {:>11} {:>9.1}%",
            r.input_tokens,
            r.cache_write_tokens,
            r.cache_read_tokens,
            100.0 * r.cache_hit_ratio()
        );
    }
    println!();
}

async fn run(args: Args) -> Result<(), String> {
    let (params, turn) = parent(&args.model, args.prefix_tokens, args.children);
    let prefix =
        ForkPrefix::new(params.clone(), turn).map_err(|e| forkhive::core::error::chain(&e))?;
    let mut requests = vec![
        Request::new(params, vec![])
            .with_max_tokens(64)
            .with_label("parent"),
    ];
    for i in 0..args.children {
        let directive = format!("Audit part {i} of the repository. {}", filler("scope", 190));
        requests.push(
            Request::fork(prefix.child(&directive))
                .with_max_tokens(64)
                .with_label(format!("child-{}", i + 1)),
        );
    }

    // The embedded default backend: scripted answers behind the cache simulator.
    let worker = ScriptedBackend::from_fn(|r| {
        let text = format!(
            "Scope: {}\nResult: done.",
            r.label.as_deref().unwrap_or("task")
        );
        Ok(Response::text(
            text.clone(),
            Usage {
                output_tokens: estimate_tokens(text.len()),
                ..Usage::default()
            },
        ))
    });
    let codec = || -> Box<dyn Codec> {
        if args.wire == "openai" {
            Box::new(OpenAiCodec::default())
        } else {
            Box::new(AnthropicCodec::default())
        }
    };
    let simulator: Arc<dyn Backend> = if args.wire == "openai" {
        Arc::new(PromptCacheSimulator::openai(worker))
    } else {
        Arc::new(PromptCacheSimulator::anthropic(worker))
    };
    let simulated: Arc<dyn Backend> = match &args.dump {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("--dump-requests {dir}: {e}"))?;
            Arc::new(
                RecordingBackend::new(simulator, dir, codec())
                    .map_err(|e| forkhive::core::error::chain(&e))?,
            )
        }
        None => simulator,
    };
    let real: Option<Arc<dyn Backend>> = match (&args.backend, &args.base_url) {
        (Some(b), Some(url)) => {
            let mut config = HttpConfig::new(url.clone());
            let key_var = if b == "openai" {
                "OPENAI_API_KEY"
            } else {
                "ANTHROPIC_API_KEY"
            };
            if let Ok(key) = std::env::var(key_var) {
                config = config.with_api_key(key);
            }
            let backend = if b == "openai" {
                HttpBackend::openai(config)
            } else {
                HttpBackend::anthropic(config)
            };
            Some(Arc::new(
                backend.map_err(|e| forkhive::core::error::chain(&e))?,
            ))
        }
        _ => None,
    };

    println!(
        "fork fan-out: {} children over a ~{} token prefix, {} wire, simulated {} caching{}",
        args.children,
        args.prefix_tokens,
        args.wire,
        args.wire,
        real.as_ref().map_or(String::new(), |_| format!(
            ", compared with {}",
            args.base_url.as_deref().unwrap_or_default()
        ))
    );
    print!(
        "\n{:<10} {:>9} {:>12} {:>11} {:>10} {:>12}",
        "request", "input", "cache_write", "cache_read", "hit", "cost"
    );
    if real.is_some() {
        print!(
            "   | {:>9} {:>12} {:>11} {:>10}",
            "input", "cache_write", "cache_read", "hit"
        );
    }
    println!();

    let mut simulated_usage = Vec::new();
    for r in &requests {
        let u = simulated
            .send(r)
            .await
            .map_err(|e| format!("{}: {e}", r.label.as_deref().unwrap_or("request")))?
            .usage;
        let reported = match &real {
            Some(b) => Some(
                b.send(r)
                    .await
                    .map_err(|e| {
                        format!(
                            "{} (real server): {e}",
                            r.label.as_deref().unwrap_or("request")
                        )
                    })?
                    .usage,
            ),
            None => None,
        };
        row(
            r.label.as_deref().unwrap_or("request"),
            &u,
            reported.as_ref(),
        );
        simulated_usage.push(u);
    }

    let children: Vec<&Usage> = simulated_usage.iter().skip(1).collect();
    let fork_cost: f64 = children.iter().map(|u| cost(u)).sum();
    let fresh_tokens: u64 = children.iter().map(|u| u.total_input_tokens()).sum();
    let fork_uncached: u64 = children
        .iter()
        .map(|u| u.input_tokens + u.cache_write_tokens)
        .sum();
    println!();
    println!(
        "{} fork children: {fork_cost:.0} input-price units ({fork_uncached} tokens not read from the cache)",
        args.children
    );
    println!(
        "{} fresh subagents: {fresh_tokens:.0} input-price units (every token at full price)",
        args.children
    );
    println!(
        "savings: {:.1}% of the input cost",
        100.0 * (1.0 - fork_cost / fresh_tokens as f64)
    );
    // "Chapter 9: Sub-Agents and the Fork Pattern" counts tokens instead of price: the parent's request plus every child's new
    // tokens, against N complete requests.
    let parent_tokens = simulated_usage[0].total_input_tokens();
    let fork_tokens = parent_tokens + fork_uncached;
    println!(
        "token count (savings in tokens rather than price): parent {parent_tokens} + new child tokens {fork_uncached} = {fork_tokens} vs {fresh_tokens} for fresh subagents: {:.1}% fewer",
        100.0 * (1.0 - fork_tokens as f64 / fresh_tokens as f64)
    );
    println!(
        "prices: cache write 5m {WRITE_5M}x, 1h {WRITE_1H}x, cache read {READ}x the input price"
    );
    if let Some(dir) = &args.dump {
        println!("request bodies written to {dir}");
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(parse_args()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cache_economics: {e}");
            ExitCode::FAILURE
        }
    }
}
