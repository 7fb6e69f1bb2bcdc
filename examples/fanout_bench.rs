//! Orchestration cost of a wide fan-out, with a scripted model (no model time at all).
//!
//! ```text
//! cargo run --release --example fanout_bench -- --children N --turns T [--threads K] [--transcripts DIR] [--streamed]
//! ```
//!
//! A parent emits N `Agent` calls in one response (background subagents of one definition).
//! Each child makes T−1 turns that each call a `read_file` tool returning 1 KiB, then answers
//! with ~200 characters; every child's answer must reach the parent through its
//! `<task-notification>`, and then the parent answers. The model has each answer whole and
//! says so (`Backend::answers_whole`); `--streamed` makes it answer as stream events instead. Prints one JSON line:
//! `{"framework":"forkhive","n":..,"t":..,"wall_s":..,"per_child_us":..,"peak_rss_mb":..,"page_faults_per_child":..,"total_model_calls":..}`.
//! With `--transcripts DIR`, `transcript_bytes_per_child` is what this run's files hold,
//! divided by N (files already in `DIR` are not counted). `page_faults_per_child` is the
//! process's minor page faults while the clock runs, divided by N (`null` where
//! `/proc/self/stat` cannot be read), mostly pages of heap touched for the first time, which
//! the kernel supplies zeroed. A long-lived host pays that once per page its heap ever grows
//! to, not once per fan-out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use forkhive::spawn::runtime::StopReason;

mod fanout;

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The process's minor page faults so far (field 10 of `/proc/self/stat`), where Linux says.
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    after_name.split_whitespace().nth(7)?.parse().ok()
}

/// Orchestration cost of a wide background fan-out on a scripted model, as one JSON line.
#[derive(clap::Parser)]
#[command(name = "fanout_bench")]
struct Args {
    /// Children (background subagents) the parent starts in one response.
    #[arg(long = "children", default_value_t = 100, value_parser = at_least_one())]
    n: usize,
    /// Turns each child makes (T−1 tool rounds, then its answer).
    #[arg(long = "turns", default_value_t = 3, value_parser = at_least_one())]
    t: usize,
    /// Worker threads: 1 is a current-thread runtime (one core, as the peers were measured).
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    threads: usize,
    /// The model answers as stream events, which the agents fold back, instead of whole.
    #[arg(long)]
    streamed: bool,
    /// Where every agent keeps its transcript (none by default).
    #[arg(long, value_name = "DIR")]
    transcripts: Option<std::path::PathBuf>,
}

fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// The files in `dir` by name, with their sizes (none when `dir` does not exist yet).
fn transcript_files(
    dir: &std::path::Path,
) -> Result<std::collections::HashMap<std::ffi::OsString, u64>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    Ok(entries
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.file_name(), e.metadata().ok()?.len()))
        })
        .collect())
}

async fn run(args: &Args) -> Result<String, String> {
    let (n, t) = (args.n, args.t);
    let model = Arc::new(fanout::Model::new(n, t, args.streamed));
    // A directory used before keeps its files: only what this run writes is counted.
    let earlier = match &args.transcripts {
        Some(dir) => transcript_files(dir)?,
        None => Default::default(),
    };
    let mut parent = fanout::parent(Arc::clone(&model), n, args.transcripts.as_deref()).await?;

    let faults_before = minor_faults();
    let start = Instant::now();
    let run = parent.run(fanout::PROMPT).await;
    let wall = start.elapsed();
    let faults = faults_before
        .zip(minor_faults())
        .map(|(a, b)| b.saturating_sub(a));
    if run.stop != StopReason::Completed {
        return Err(format!("the parent stopped: {} {:?}", run.stop, run.error));
    }
    let reached = fanout::reached(&parent)?;
    if reached != n {
        return Err(format!(
            "{reached} of {n} children's answers reached the parent"
        ));
    }
    let wall_s = wall.as_secs_f64();
    let transcript_bytes = match &args.transcripts {
        Some(dir) => transcript_files(dir)?
            .into_iter()
            .filter(|(name, _)| !earlier.contains_key(name))
            .map(|(_, len)| len)
            .sum::<u64>(),
        None => 0,
    };
    Ok(serde_json::json!({
        "framework": "forkhive",
        "n": n,
        "t": t,
        "threads": args.threads,
        "transcripts": args.transcripts.is_some(),
        "streamed": args.streamed,
        "transcript_bytes_per_child": transcript_bytes / n as u64,
        "wall_s": (wall_s * 1e4).round() / 1e4,
        "per_child_us": (wall_s * 1e6 / n as f64 * 100.0).round() / 100.0,
        "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
        "page_faults_per_child": faults.map(|f| (f as f64 / n as f64 * 100.0).round() / 100.0),
        "total_model_calls": model.calls(),
    })
    .to_string())
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let rt = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
