//! Load agent definitions from directories, merge them with the built-ins, and print the
//! registry: a table, or one JSON object with `--json`.
//!
//! Run: `cargo run --example agents -- [--json] [--user DIR] [--project DIR] [--policy DIR]
//! [--plugin DIR] [--flag DIR]`
//!
//! Each DIR is scanned recursively for `*.md` files; each flag may repeat. Bad files are
//! reported (as warnings or errors) and the program still exits 0; it exits 2 only when it
//! cannot run: an unknown flag, a missing DIR, or a DIR that cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use forkhive::spawn::definition::{
    AgentDefinition, AgentLoader, AgentRegistry, DefinitionSource, FileStatus,
};
use serde_json::{Value, json};

/// Loads every *.md file under each DIR (recursively) as agent definitions of that source,
/// merges them with the built-in agents (built-in < host < plugin < user < project < flag <
/// policy), and prints the registry as a table, or as one JSON object with --json.
#[derive(clap::Parser)]
#[command(name = "agents")]
struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// The user's agents directory (may repeat).
    #[arg(long, value_name = "DIR")]
    user: Vec<PathBuf>,
    /// The project's agents directory (may repeat).
    #[arg(long, value_name = "DIR")]
    project: Vec<PathBuf>,
    /// An enterprise policy's agents directory (may repeat).
    #[arg(long, value_name = "DIR")]
    policy: Vec<PathBuf>,
    /// A plugin's agents directory (may repeat).
    #[arg(long, value_name = "DIR")]
    plugin: Vec<PathBuf>,
    /// Agents given on the command line at start-up (may repeat).
    #[arg(long, value_name = "DIR")]
    flag: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let mut loader = AgentLoader::new();
    for (source, dirs) in [
        (DefinitionSource::User, &args.user),
        (DefinitionSource::Project, &args.project),
        (DefinitionSource::Policy, &args.policy),
        (DefinitionSource::Plugin, &args.plugin),
        (DefinitionSource::Flag, &args.flag),
    ] {
        for dir in dirs {
            if !dir.is_dir() {
                eprintln!("agents: --{source} {}: not a directory", dir.display());
                return ExitCode::from(2);
            }
            loader = loader.dir(source, dir);
        }
    }
    let registry = match loader.load() {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("agents: {}", forkhive::core::error::chain(&e));
            return ExitCode::from(2);
        }
    };
    if args.json {
        println!("{}", to_json(&registry));
    } else {
        print_table(&registry);
    }
    ExitCode::SUCCESS
}

fn agent_json(def: &AgentDefinition) -> Value {
    json!({
        "name": def.name,
        "description": def.description,
        "tools": def.tools,
        "disallowed_tools": def.disallowed_tools,
        "model": def.model,
        "source": def.source.as_str(),
        "path": def.path.as_ref().map(|p| p.to_string_lossy()),
        "system_prompt": def.system_prompt,
    })
}

fn to_json(registry: &AgentRegistry) -> String {
    let value = json!({
        "agents": registry.list().into_iter().map(agent_json).collect::<Vec<_>>(),
        "shadowed": registry.shadowed(),
        "errors": registry.errors(),
        "warnings": registry.warnings(),
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// At most `max` characters of the first line of `s`.
fn cell(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() <= max && !s.trim_end().contains('\n') {
        line.to_owned()
    } else {
        let mut out: String = line.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn tools_cell(def: &AgentDefinition) -> String {
    let allowed = match &def.tools {
        None => "all".to_owned(),
        Some(tools) if tools.is_empty() => "none".to_owned(),
        Some(tools) => tools.join(", "),
    };
    match &def.disallowed_tools {
        Some(denied) if !denied.is_empty() => format!("{allowed} except {}", denied.join(", ")),
        _ => allowed,
    }
}

fn print_table(registry: &AgentRegistry) {
    let rows: Vec<[String; 5]> = registry
        .list()
        .into_iter()
        .map(|def| {
            [
                cell(&def.name, 40),
                def.source.to_string(),
                def.model.clone().unwrap_or_else(|| "-".to_owned()),
                cell(&tools_cell(def), 50),
                def.path
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |p| p.display().to_string()),
            ]
        })
        .collect();
    let header = ["NAME", "SOURCE", "MODEL", "TOOLS", "PATH"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", line.trim_end());
    }
    println!(
        "\n{} agents; files: {} loaded, {} recovered with warnings, {} rejected; {} shadowed",
        registry.len(),
        registry.count(FileStatus::Loaded),
        registry.count(FileStatus::Recovered),
        registry.count(FileStatus::Rejected),
        registry.shadowed().len()
    );
    if !registry.shadowed().is_empty() {
        println!("\nshadowed:");
        for s in registry.shadowed() {
            println!("  {s}");
        }
    }
    if !registry.warnings().is_empty() {
        println!("\nwarnings:");
        for w in registry.warnings() {
            println!("  {w}");
        }
    }
    if !registry.errors().is_empty() {
        println!("\nerrors:");
        for e in registry.errors() {
            println!("  {e}");
        }
    }
}
