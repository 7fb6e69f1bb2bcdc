//! Load agent definitions from directories, merge them with the built-ins, and print the
//! registry: a table, or one JSON object with `--json` that also says, per agent, which MCP
//! servers, hooks, skills, memory and effort it needs and whether this host can give them
//! (and, in `summary`, how many agents need each and how many can run as written).
//!
//! Run: `cargo run --example agents -- [--json] [--user DIR] [--project DIR] [--policy DIR]
//! [--plugin DIR] [--flag DIR] [--skills DIR] [--mcp-config FILE] [--trust-definition-servers]`
//!
//! Each DIR is scanned recursively for `*.md` files; each flag may repeat. Bad files are
//! reported (as warnings or errors) and the program still exits 0; it exits 2 only when it
//! cannot run: an unknown flag, a missing DIR, or a DIR that cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use forkhive::spawn::definition::skills::Skills;
use forkhive::spawn::definition::{
    AgentDefinition, AgentLoader, AgentRegistry, DefinitionSource, FileStatus,
};
use forkhive::spawn::hook::Hooks;
use forkhive::spawn::mcp::{McpHub, normalize};
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
    /// A directory with `skills/<name>/SKILL.md` (may repeat): the skills this host loads.
    #[arg(long, value_name = "DIR")]
    skills: Vec<PathBuf>,
    /// A Claude Code `.mcp.json` (may repeat): the MCP servers this host configures (read,
    /// not connected).
    #[arg(long = "mcp-config", value_name = "FILE")]
    mcp_config: Vec<PathBuf>,
    /// Let project, plugin and command-line definitions start MCP servers of their own.
    #[arg(long)]
    trust_definition_servers: bool,
}

/// What this host can give an agent: its skills and its MCP servers.
struct Host {
    skills: Skills,
    /// The configured servers' names, normalized as tool names use them.
    servers: Vec<String>,
    trust_definition_servers: bool,
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
    let (skills, _) = Skills::load(&args.skills);
    let mut mcp = McpHub::builder();
    for file in &args.mcp_config {
        let read = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                mcp.servers_json(&text, &file.display().to_string())
                    .map_err(|e| e.to_string())
            });
        match read {
            Ok(b) => mcp = b,
            Err(e) => {
                eprintln!("agents: --mcp-config {}: {e}", file.display());
                return ExitCode::from(2);
            }
        }
    }
    let servers = match mcp.build() {
        Ok(hub) => hub.names().iter().map(|n| normalize(n)).collect(),
        Err(e) => {
            eprintln!("agents: --mcp-config: {e}");
            return ExitCode::from(2);
        }
    };
    let host = Host {
        skills,
        servers,
        trust_definition_servers: args.trust_definition_servers,
    };
    if args.json {
        println!("{}", to_json(&registry, &host));
    } else {
        print_table(&registry);
    }
    ExitCode::SUCCESS
}

/// The MCP servers `def` needs from the host — those its `mcpServers` and
/// `requiredMcpServers` name, and those its tool list names (`mcp__<server>__<tool>`) — and
/// those it defines itself (inline `mcpServers` entries).
fn mcp_servers(def: &AgentDefinition) -> (Vec<String>, Vec<String>) {
    fn walk(v: &Value, named: &mut Vec<String>, own: &mut Vec<String>) {
        match v {
            Value::String(s) => named.push(s.clone()),
            Value::Object(o) => own.extend(o.keys().cloned()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, named, own)),
            _ => {}
        }
    }
    let (mut named, mut own) = (Vec::new(), Vec::new());
    def.mcp_servers
        .iter()
        .for_each(|v| walk(v, &mut named, &mut own));
    if let Some(required) = def.extra.get("requiredMcpServers") {
        walk(required, &mut named, &mut Vec::new());
    }
    for t in def.tools.iter().flatten() {
        if let Some(server) = t.strip_prefix("mcp__").and_then(|r| r.split("__").next())
            && !server.is_empty()
            && server != "*"
        {
            named.push(server.to_owned());
        }
    }
    named.retain(|n| !own.contains(n));
    for list in [&mut named, &mut own] {
        list.sort();
        list.dedup();
    }
    (named, own)
}

/// Every `command` string in a hooks object.
fn collect_commands(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("command", Value::String(c)) => out.push(c.clone()),
                    _ => collect_commands(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_commands(x, out)),
        _ => {}
    }
}

/// What `def` needs beyond tools, and whether this host (hooks, memory and effort supported;
/// the MCP servers of `--mcp-config`; the skills loaded with `--skills`) can give it.
fn needs(def: &AgentDefinition, host: &Host) -> Value {
    let skills = &host.skills;
    let (servers, own) = mcp_servers(def);
    let missing_servers: Vec<&String> = servers
        .iter()
        .filter(|s| !host.servers.contains(&normalize(s)))
        .collect();
    let trusted = host.trust_definition_servers
        || matches!(
            def.source,
            DefinitionSource::BuiltIn
                | DefinitionSource::Host
                | DefinitionSource::User
                | DefinitionSource::Policy
        );
    let own_ok = own.is_empty() || trusted;
    let hooks = def.hooks.as_ref().map(|h| {
        match Hooks::from_settings(h, &format!("agent `{}`", def.name)) {
            Ok((hooks, mut warnings)) => {
                // Claude Code's own trap, found in real files: a hook that means to block but
                // exits 1 (only exit 2 blocks).
                let mut commands = Vec::new();
                collect_commands(h, &mut commands);
                for c in commands.iter().filter(|c| c.contains("exit 1")) {
                    warnings.push(format!(
                        "hook `{c}` exits 1, which does not block (only exit 2 does)"
                    ));
                }
                json!({"hooks": hooks.len(), "warnings": warnings, "usable": warnings.is_empty()})
            }
            Err(e) => json!({"hooks": 0, "warnings": [e.to_string()], "usable": false}),
        }
    });
    let missing_skills: Vec<&String> = def
        .skills
        .iter()
        .filter(|s| skills.get(s).is_none())
        .collect();
    let effort_ok = def
        .effort
        .as_deref()
        .is_none_or(|e| forkhive::transport::Effort::from_name(e).is_some());
    let memory_ok = def
        .memory
        .as_deref()
        .is_none_or(|m| matches!(m, "user" | "project" | "local"));
    let runs_as_written = missing_servers.is_empty()
        && own_ok
        && hooks.as_ref().is_none_or(|h| h["usable"] == true)
        && missing_skills.is_empty()
        && effort_ok
        && memory_ok;
    json!({
        "mcp_servers": servers,
        "missing_mcp_servers": missing_servers,
        "own_mcp_servers": own,
        "own_mcp_servers_started": own_ok,
        "hooks": hooks,
        "skills": def.skills,
        "missing_skills": missing_skills,
        "memory": def.memory,
        "effort": def.effort,
        "effort_ok": effort_ok,
        "runs_as_written": runs_as_written,
    })
}

fn agent_json(def: &AgentDefinition, host: &Host) -> Value {
    json!({
        "name": def.name,
        "description": def.description,
        "tools": def.tools,
        "disallowed_tools": def.disallowed_tools,
        "model": def.model,
        "source": def.source.as_str(),
        "path": def.path.as_ref().map(|p| p.to_string_lossy()),
        "system_prompt": def.system_prompt,
        "needs": needs(def, host),
    })
}

/// How many agents need each thing, and how many run as written here.
fn summary(agents: &[Value]) -> Value {
    let count = |f: &dyn Fn(&Value) -> bool| agents.iter().filter(|a| f(&a["needs"])).count();
    json!({
        "agents": agents.len(),
        "runs_as_written": count(&|n| n["runs_as_written"] == true),
        "need_mcp_servers": count(&|n| n["mcp_servers"].as_array().is_some_and(|a| !a.is_empty())),
        "missing_mcp_servers": count(&|n| n["missing_mcp_servers"].as_array().is_some_and(|a| !a.is_empty())),
        "define_own_mcp_servers": count(&|n| n["own_mcp_servers"].as_array().is_some_and(|a| !a.is_empty())),
        "have_hooks": count(&|n| !n["hooks"].is_null()),
        "hooks_usable": count(&|n| n["hooks"]["usable"] == true),
        "preload_skills": count(&|n| n["skills"].as_array().is_some_and(|a| !a.is_empty())),
        "missing_skills": count(&|n| n["missing_skills"].as_array().is_some_and(|a| !a.is_empty())),
        "use_memory": count(&|n| !n["memory"].is_null()),
        "set_effort": count(&|n| !n["effort"].is_null()),
        "effort_unknown": count(&|n| n["effort_ok"] == false),
    })
}

fn to_json(registry: &AgentRegistry, host: &Host) -> String {
    let agents: Vec<Value> = registry
        .list()
        .into_iter()
        .map(|d| agent_json(d, host))
        .collect();
    let value = json!({
        "summary": summary(&agents),
        "agents": agents,
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
