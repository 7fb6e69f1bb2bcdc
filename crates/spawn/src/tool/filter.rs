//! The three layers of tool filtering, as one pure function.
//!
//! "Chapter 9: Sub-Agents and the Fork Pattern — 9.5 Agent Tool Isolation":
//!
//! 1. a **global disallow list** every sub-agent obeys (tools that only make sense on the main
//!    thread, or would let a sub-agent recurse or block on the user);
//! 2. an **allow list for background agents** (they run unattended, so only the core tools);
//! 3. the **final filter**: MCP tools (`mcp__*`) always pass the first two layers, and the
//!    agent definition's own `tools` / `disallowedTools` apply last (`*` means all).
//!
//! # List entries
//!
//! Every list holds entries as agent definitions in the wild spell them:
//!
//! - `Name`: that tool;
//! - `*`: every tool (except that `*` in `disallowedTools` spares MCP tools);
//! - `prefix*` (e.g. `mcp__github__*`): every tool whose name starts with `prefix`;
//! - `mcp__<server>`: every tool of that MCP server (as `mcp__<server>__*`);
//! - `Name(rule)` (e.g. `Bash(npm test:*)`): tool `Name` **as a whole**. The rule is a
//!   permission detail that a filter over tool names cannot enforce, so it is dropped: in
//!   `tools`, `Bash(git:*)` makes all of `Bash` available; in `disallowedTools`, `Bash(rm:*)`
//!   takes all of `Bash` away (the safer direction). [`ToolFilter::unenforceable`] lists the
//!   entries whose rule is dropped, so the runtime can warn about them.
//!
//! Fork children never go through this: they keep the parent's exact tool array so that their
//! requests share the parent's cache, and are refused at call time instead.

use serde::{Deserialize, Serialize};

/// Who the tools are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolAudience {
    /// The main agent: no layer applies but the definition's own lists.
    Main,
    /// A sub-agent the parent waits for.
    Foreground,
    /// A sub-agent running in the background.
    Background,
    /// A long-lived in-process teammate: background rules plus the team tools.
    Teammate,
}

/// The lists of the first two layers. [`ToolFilter::default`] holds Claude Code's lists as
/// "Chapter 9 — 9.5" and the shipped CLI spell them; hosts may change them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    /// Layer 1: never available to any sub-agent.
    pub global_disallow: Vec<String>,
    /// Layer 2: the only tools a background agent may use (MCP tools aside).
    pub background_allow: Vec<String>,
    /// Tools a teammate gets on top of `background_allow`.
    pub teammate_extra: Vec<String>,
}

/// Layer 1's default list (`Task` is the legacy name of `Agent`).
pub const GLOBAL_DISALLOW: [&str; 7] = [
    "TaskOutput",
    "ExitPlanMode",
    "EnterPlanMode",
    "AskUserQuestion",
    "TaskStop",
    "Agent",
    "Task",
];

/// Layer 2's default list.
pub const BACKGROUND_ALLOW: [&str; 15] = [
    "Read",
    "Write",
    "Edit",
    "MultiEdit",
    "NotebookEdit",
    "Bash",
    "Grep",
    "Glob",
    "LS",
    "WebSearch",
    "WebFetch",
    "TodoWrite",
    "Skill",
    "TaskStop",
    "SendMessage",
];

/// Tools a teammate gets besides the background list.
pub const TEAMMATE_EXTRA: [&str; 5] = [
    "TaskCreate",
    "TaskGet",
    "TaskList",
    "TaskUpdate",
    "SendMessage",
];

impl Default for ToolFilter {
    fn default() -> Self {
        let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        Self {
            global_disallow: own(&GLOBAL_DISALLOW),
            background_allow: own(&BACKGROUND_ALLOW),
            teammate_extra: own(&TEAMMATE_EXTRA),
        }
    }
}

/// Whether `name` is an MCP tool (`mcp__<server>__<tool>`).
pub fn is_mcp_tool(name: &str) -> bool {
    name.starts_with("mcp__")
}

/// An entry split into its name pattern and its `(rule)`, if any (both trimmed).
fn parse(entry: &str) -> (&str, Option<&str>) {
    let entry = entry.trim();
    if let Some(body) = entry.strip_suffix(')')
        && let Some((pattern, rule)) = body.split_once('(')
    {
        return (pattern.trim(), Some(rule.trim()));
    }
    (entry, None)
}

/// Whether the name pattern of an entry (see the module docs) matches tool `name`.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    if pattern == "*" || pattern == name {
        return true;
    }
    if let Some(prefix) = pattern.strip_suffix('*') {
        return !prefix.is_empty() && name.starts_with(prefix);
    }
    // `mcp__<server>`, which names no tool itself: every tool of that server.
    let server_only = pattern
        .strip_prefix("mcp__")
        .is_some_and(|server| !server.is_empty() && !server.contains("__"));
    server_only
        && name
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with("__"))
}

fn listed(list: &[String], name: &str) -> bool {
    list.iter().any(|e| pattern_matches(parse(e).0, name))
}

/// Whether `disallowed` denies `name`: like [`listed`], except that `*` spares MCP tools.
fn denied(disallowed: &[String], name: &str) -> bool {
    disallowed.iter().any(|e| match parse(e).0 {
        "*" => !is_mcp_tool(name),
        pattern => pattern_matches(pattern, name),
    })
}

impl ToolFilter {
    /// A filter with no layer-1 or layer-2 restrictions (only the definition's lists apply).
    pub fn none() -> Self {
        Self {
            global_disallow: Vec::new(),
            background_allow: vec!["*".to_owned()],
            teammate_extra: Vec::new(),
        }
    }

    /// The entries of a `tools` or `disallowedTools` list whose `(rule)` part the filter drops
    /// (see the module docs), in their order, as written: `Bash(npm test:*)` is listed;
    /// `Bash`, `mcp__github__*`, `Bash(*)` and `Bash()` are not, since they lose nothing.
    pub fn unenforceable(entries: &[String]) -> Vec<String> {
        entries
            .iter()
            .filter(|e| {
                parse(e)
                    .1
                    .is_some_and(|rule| !rule.is_empty() && rule != "*")
            })
            .cloned()
            .collect()
    }

    /// Whether `name` survives the three layers for `audience`, given a definition's `tools`
    /// (`None`: no restriction) and `disallowed_tools`. List entries may be patterns (see the
    /// module docs).
    pub fn allows(
        &self,
        name: &str,
        audience: ToolAudience,
        tools: Option<&[String]>,
        disallowed_tools: Option<&[String]>,
    ) -> bool {
        let mcp = is_mcp_tool(name);
        // Layers 1 and 2, which MCP tools always pass.
        if !mcp {
            let sub = audience != ToolAudience::Main;
            if sub && listed(&self.global_disallow, name) {
                return false;
            }
            let unattended = matches!(audience, ToolAudience::Background | ToolAudience::Teammate);
            if unattended
                && !listed(&self.background_allow, name)
                && !(audience == ToolAudience::Teammate && listed(&self.teammate_extra, name))
            {
                return false;
            }
        }
        // Layer 3: the definition's own lists; an explicit deny wins over everything.
        if disallowed_tools.is_some_and(|d| denied(d, name)) {
            return false;
        }
        match tools {
            None => true,
            Some(allow) => mcp || listed(allow, name),
        }
    }

    /// The names of `available` that survive the three layers, in their order.
    pub fn apply<'a>(
        &self,
        available: &[&'a str],
        audience: ToolAudience,
        tools: Option<&[String]>,
        disallowed_tools: Option<&[String]>,
    ) -> Vec<&'a str> {
        available
            .iter()
            .copied()
            .filter(|n| self.allows(n, audience, tools, disallowed_tools))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolAudience::*;

    fn v(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Every row: tool, audience, the definition's tools, its disallowedTools, expected.
    #[test]
    fn the_three_layers_table() {
        let f = ToolFilter::default();
        let star = v(&["*"]);
        let read_only = v(&["Read", "Grep"]);
        let no_bash = v(&["Bash"]);
        let no_mcp = v(&["mcp__db__drop"]);
        let bash_rules = v(&["Bash(npm test:*)", "Bash(git:*)", "Read"]);
        let no_rm = v(&["Bash(rm:*)"]);
        let no_db = v(&["mcp__db__*"]);
        let no_db_server = v(&["mcp__db"]);
        let web_glob = v(&["Web*"]);
        let github_only = v(&["mcp__github__*"]);
        let spaced = v(&[" Grep ( pattern ) "]);
        type Row<'a> = (
            &'a str,
            ToolAudience,
            Option<&'a Vec<String>>,
            Option<&'a Vec<String>>,
            bool,
        );
        #[rustfmt::skip]
        let rows: &[Row<'_>] = &[
            // Main agent: only the definition's lists.
            ("Agent",             Main,       None,             None,           true),
            ("AskUserQuestion",   Main,       None,             None,           true),
            ("Bash",              Main,       None,             Some(&no_bash), false),
            ("Grep",              Main,       Some(&read_only), None,           true),
            ("Bash",              Main,       Some(&read_only), None,           false),
            // Layer 1: every sub-agent.
            ("Agent",             Foreground, None,             None,           false),
            ("Agent",             Foreground, Some(&star),      None,           false),
            ("TaskOutput",        Foreground, None,             None,           false),
            ("ExitPlanMode",      Background, None,             None,           false),
            ("AskUserQuestion",   Foreground, None,             None,           false),
            ("TaskStop",          Background, None,             None,           false),
            ("Bash",              Foreground, None,             None,           true),
            ("CustomTool",        Foreground, None,             None,           true),
            // Layer 2: background agents only get the allow list.
            ("Bash",              Background, None,             None,           true),
            ("Read",              Background, Some(&star),      None,           true),
            ("CustomTool",        Background, None,             None,           false),
            ("CustomTool",        Background, Some(&star),      None,           false),
            ("TaskCreate",        Background, None,             None,           false),
            // Teammates: background rules plus the team tools.
            ("TaskCreate",        Teammate,   None,             None,           true),
            ("SendMessage",       Teammate,   None,             None,           true),
            ("CustomTool",        Teammate,   None,             None,           false),
            ("Agent",             Teammate,   None,             None,           false),
            // Layer 3: MCP tools always pass layers 1-2 and the allow list...
            ("mcp__db__query",    Background, None,             None,           true),
            ("mcp__db__query",    Foreground, Some(&read_only), None,           true),
            ("mcp__db__query",    Teammate,   Some(&read_only), Some(&star),    true),
            // ...but an explicit deny of that very tool wins.
            ("mcp__db__drop",     Background, None,             Some(&no_mcp),  false),
            // The definition's lists on top of layers 1-2.
            ("Grep",              Foreground, Some(&read_only), None,           true),
            ("Bash",              Foreground, Some(&read_only), None,           false),
            ("Bash",              Background, Some(&star),      Some(&no_bash), false),
            ("Read",              Foreground, None,             Some(&star),    false),
            // Patterns: `Name(rule)` is tool `Name` as a whole...
            ("Bash",              Main,       Some(&bash_rules),None,           true),
            ("Bash",              Background, Some(&bash_rules),None,           true),
            ("Read",              Foreground, Some(&bash_rules),None,           true),
            ("Grep",              Foreground, Some(&bash_rules),None,           false),
            ("Grep",              Foreground, Some(&spaced),    None,           true),
            // ...and in disallowedTools it denies the whole tool, even if allowed by a rule.
            ("Bash",              Foreground, None,             Some(&no_rm),   false),
            ("Bash",              Main,       Some(&bash_rules),Some(&no_rm),   false),
            ("Read",              Foreground, None,             Some(&no_rm),   true),
            // A prefix glob, for any tool.
            ("WebFetch",          Foreground, Some(&web_glob),  None,           true),
            ("WebSearch",         Background, Some(&web_glob),  None,           true),
            ("Read",              Foreground, Some(&web_glob),  None,           false),
            ("Read",              Foreground, None,             Some(&web_glob),true),
            ("WebFetch",          Main,       None,             Some(&web_glob),false),
            // MCP globs: allowing one server leaves other tools out but MCP tools pass anyway...
            ("mcp__github__x",    Foreground, Some(&github_only),None,          true),
            ("mcp__db__query",    Foreground, Some(&github_only),None,          true),
            ("Read",              Foreground, Some(&github_only),None,          false),
            // ...while a denied glob or server takes all of its tools away.
            ("mcp__db__drop",     Background, None,             Some(&no_db),   false),
            ("mcp__db__query",    Main,       Some(&star),      Some(&no_db),   false),
            ("mcp__dbx__query",   Foreground, None,             Some(&no_db),   true),
            ("mcp__db__query",    Foreground, None,             Some(&no_db_server), false),
            ("mcp__dbx__query",   Foreground, None,             Some(&no_db_server), true),
            ("mcp__db__query",    Foreground, None,             Some(&no_mcp),  true),
            // `Task`, the legacy name of `Agent`, is kept from sub-agents too.
            ("Task",              Foreground, None,             None,           false),
            ("Task",              Background, Some(&star),      None,           false),
            ("Task",              Main,       None,             None,           true),
        ];
        for (i, (name, who, tools, denied, want)) in rows.iter().enumerate() {
            let got = f.allows(
                name,
                *who,
                tools.map(|t| t.as_slice()),
                denied.map(|d| d.as_slice()),
            );
            assert_eq!(got, *want, "row {i}: {name} for {who:?}");
        }
    }

    #[test]
    fn unenforceable_lists_the_entries_whose_rule_is_dropped() {
        let entries = v(&[
            "Read",
            "Bash(npm test:*)",
            "mcp__github__*",
            "Bash(*)",
            "Edit()",
            " WebFetch(domain:example.com) ",
            "*",
        ]);
        assert_eq!(
            ToolFilter::unenforceable(&entries),
            ["Bash(npm test:*)", " WebFetch(domain:example.com) "]
        );
        assert!(ToolFilter::unenforceable(&[]).is_empty());
    }

    #[test]
    fn apply_keeps_order_and_none_lifts_layers_one_and_two() {
        let avail = ["Read", "Agent", "mcp__x__y", "Custom", "Bash"];
        let f = ToolFilter::default();
        assert_eq!(
            f.apply(&avail, Background, None, None),
            ["Read", "mcp__x__y", "Bash"]
        );
        assert_eq!(
            ToolFilter::none().apply(&avail, Background, None, None),
            avail
        );
    }
}
