//! One request through a chosen backend, printed as one JSON object: the quickest way to check
//! an endpoint and a key.
//!
//! ```text
//! cargo run --example ask -- [--backend anthropic|openai|scripted] [--base-url URL]
//!     [--model NAME] [--max-tokens N] [--stream] "the prompt"
//! ```
//!
//! Keys come from `ANTHROPIC_API_KEY` / `OPENAI_API_KEY` (optional for local servers); base URLs
//! default to `ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL` or the providers' own. Errors go to
//! stderr with a non-zero exit status.

use std::process::ExitCode;

use forkhive::core::{CacheSafeParams, Message, Usage};
use forkhive::transport::http::{HttpBackend, HttpConfig};
use forkhive::transport::{Backend, BackendExt, Request, Response, ScriptedBackend};

/// Sends one prompt to a model and prints the answer as one JSON line.
///
/// The key comes from ANTHROPIC_API_KEY or OPENAI_API_KEY (not needed for a local server at
/// --base-url); ANTHROPIC_BASE_URL and OPENAI_BASE_URL set the default URLs.
#[derive(clap::Parser)]
#[command(name = "ask")]
struct Args {
    /// Which backend.
    #[arg(long, default_value = "anthropic", value_parser = ["anthropic", "openai", "scripted"])]
    backend: String,
    /// The server's base URL (default: the provider's).
    #[arg(long)]
    base_url: Option<String>,
    /// The model name.
    #[arg(long)]
    model: Option<String>,
    /// The most output tokens.
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Stream the answer (it is still printed once, whole).
    #[arg(long)]
    stream: bool,
    /// The prompt (quote it).
    prompt: String,
}

fn backend(a: &Args) -> Result<(Box<dyn Backend>, String), String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match a.backend.as_str() {
        "scripted" => {
            let b = ScriptedBackend::from_fn(|r: &Request| {
                let prompt = r
                    .all_messages()
                    .last()
                    .map(Message::text)
                    .unwrap_or_default();
                Ok(Response::text(
                    format!("You said: {prompt}"),
                    Usage {
                        input_tokens: 8,
                        output_tokens: 4,
                        ..Usage::default()
                    },
                ))
            });
            Ok((
                Box::new(b),
                a.model.clone().unwrap_or_else(|| "scripted".into()),
            ))
        }
        "anthropic" | "openai" => {
            let openai = a.backend == "openai";
            let (url_var, key_var, default_url, default_model) = if openai {
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
                .unwrap_or_else(|| default_url.into());
            let mut config = HttpConfig::new(url.clone());
            match env(key_var) {
                Some(k) => config = config.with_api_key(k),
                // The provider's own endpoint needs a key; a local server may not.
                None if url == default_url => {
                    return Err(format!(
                        "{key_var} is not set: the {} API needs a key",
                        a.backend
                    ));
                }
                None => {}
            }
            let b = if openai {
                HttpBackend::openai(config)
            } else {
                HttpBackend::anthropic(config)
            };
            let b = b.map_err(|e| forkhive::core::error::chain(&e))?;
            Ok((
                Box::new(b),
                a.model.clone().unwrap_or_else(|| default_model.into()),
            ))
        }
        other => Err(format!(
            "--backend must be anthropic, openai or scripted, not {other:?}"
        )),
    }
}

async fn run() -> Result<String, String> {
    let args = <Args as clap::Parser>::parse();
    let (backend, model) = backend(&args)?;
    let request = Request::new(
        CacheSafeParams::builder(model).build(),
        vec![Message::user_text(&args.prompt)],
    )
    .with_max_tokens(args.max_tokens);
    let response = if args.stream {
        backend.stream_to_response(&request).await
    } else {
        backend.send(&request).await
    };
    let response = response.map_err(|e| forkhive::core::error::chain(&e))?;
    let out = serde_json::json!({
        "message": response.message,
        "stop_reason": response.stop_reason.as_ref().map(|s| s.as_str()),
        "model": response.model,
        "usage": response.usage,
    });
    serde_json::to_string(&out).map_err(|e| forkhive::core::error::chain(&e))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ask: {e}");
            ExitCode::FAILURE
        }
    }
}
