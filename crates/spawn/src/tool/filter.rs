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

use super::InBackground;
use super::pool::ToolPool;
use crate::definition::entry::split as parse;

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

pub(crate) fn listed(list: &[String], name: &str) -> bool {
    list.iter().any(|e| pattern_matches(parse(e).0, name))
}

/// Whether `disallowed` denies `name`: like [`listed`], except that `*` spares MCP tools.
pub(crate) fn denied(disallowed: &[String], name: &str) -> bool {
    disallowed.iter().any(|e| match parse(e).0 {
        "*" => !is_mcp_tool(name),
        pattern => pattern_matches(pattern, name),
    })
}

/// The entries of `entries` that name no tool of `names` but one of them in another case
/// (`bash` for `Bash`), each with that tool's name: tool names are matched exactly, so such an
/// entry takes nothing away, and a definition's author should hear so.
pub(crate) fn case_slips(entries: &[String], names: &[&str]) -> Vec<(String, String)> {
    entries
        .iter()
        .filter_map(|e| {
            let pattern = parse(e).0;
            if pattern == "*" || names.iter().any(|n| pattern_matches(pattern, n)) {
                return None;
            }
            // A server (`mcp__Shared`) or a prefix (`mcp__Shared__*`) in another case takes
            // nothing away either: matched as the tools' names are, ASCII case aside.
            let lower = pattern.to_ascii_lowercase();
            let name = names
                .iter()
                .find(|n| pattern_matches(&lower, &n.to_ascii_lowercase()))?;
            // What the entry meant, in the tools' case: the name, or as much of it as the
            // entry spells (ASCII case changes no byte's length), with its `*`.
            let spelled = pattern.trim_end_matches('*');
            let near = match name.get(..spelled.len()) {
                Some(prefix) if spelled.len() < name.len() || pattern.ends_with('*') => {
                    format!("{prefix}{}", if pattern.ends_with('*') { "*" } else { "" })
                }
                _ => (*name).to_owned(),
            };
            Some((e.trim().to_owned(), near))
        })
        .collect()
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
        crate::definition::entry::unenforceable(entries)
    }

    /// Whether `name` survives the three layers for `audience`, given a definition's `tools`
    /// (`None`: no restriction) and `disallowed_tools`. List entries may be patterns (see the
    /// module docs). It judges by the name alone: layer 2 as for the crate's built-in tools,
    /// and no alias is known (an entry `Task` does not name `Agent` here). Use
    /// [`pool`](Self::pool) to filter real tools, which declare their own
    /// [`in_background`](super::Tool::in_background) and aliases.
    pub fn allows(
        &self,
        name: &str,
        audience: ToolAudience,
        tools: Option<&[String]>,
        disallowed_tools: Option<&[String]>,
    ) -> bool {
        self.verdict(
            name,
            &[],
            InBackground::ByFilter,
            audience,
            tools,
            disallowed_tools,
        )
        .is_none()
    }

    /// Why `name` (declaring `in_background`) does not survive the three layers, or `None`
    /// when it does.
    ///
    /// An entry of the definition's lists naming the tool's name or one of its `aliases` names
    /// the tool (`Task`, the legacy name Claude Code's definitions use, names `Agent`).
    fn verdict(
        &self,
        name: &str,
        aliases: &[&str],
        in_background: InBackground,
        audience: ToolAudience,
        tools: Option<&[String]>,
        disallowed_tools: Option<&[String]>,
    ) -> Option<Unavailable> {
        // Aliases count in layer 3 only: a definition's lists are written in Claude Code's
        // words (`Task`); the filter's own lists name tools by their names.
        // An alias counts only where an entry names it exactly: `Task*` means the tools whose
        // names start with `Task` (`TaskStop`), not the `Agent` tool that answers to `Task`.
        let names_alias = |list: &[String]| {
            list.iter()
                .any(|e| aliases.iter().any(|a| parse(e).0 == *a))
        };
        let listed_by_definition = |list: &[String]| listed(list, name) || names_alias(list);
        let mcp = is_mcp_tool(name);
        // Layers 1 and 2, which MCP tools always pass.
        if !mcp {
            let sub = audience != ToolAudience::Main;
            if sub && listed(&self.global_disallow, name) {
                return Some(Unavailable::SubagentsNever);
            }
            let unattended = matches!(audience, ToolAudience::Background | ToolAudience::Teammate);
            let team_tool =
                audience == ToolAudience::Teammate && listed(&self.teammate_extra, name);
            // Layer 2's allow list is about built-in tools; a host's own tool declares itself
            // (like an MCP tool, it is the host's choice).
            let passes = match in_background {
                InBackground::Allowed => true,
                InBackground::Denied => false,
                InBackground::ByFilter => listed(&self.background_allow, name) || team_tool,
            };
            if unattended && !passes {
                return Some(Unavailable::NotInBackground);
            }
        }
        // Layer 3: the definition's own lists; an explicit deny wins over everything.
        if disallowed_tools.is_some_and(|d| denied(d, name) || names_alias(d)) {
            return Some(Unavailable::DisallowedByDefinition);
        }
        match tools {
            Some(allow) if !mcp && !listed_by_definition(allow) => Some(Unavailable::NotListed),
            _ => None,
        }
    }

    /// The names of `available` that survive the three layers, in their order (by name alone,
    /// as [`allows`](Self::allows)).
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

    /// The tools of `pool` that survive the three layers for `audience`, in pool order. Each
    /// tool's [`in_background`](super::Tool::in_background) decides layer 2 for it.
    #[must_use]
    pub fn pool(
        &self,
        pool: &ToolPool,
        audience: ToolAudience,
        tools: Option<&[String]>,
        disallowed_tools: Option<&[String]>,
    ) -> ToolPool {
        pool.filtered(|tool| {
            self.verdict(
                &tool.definition().name,
                tool.aliases(),
                tool.in_background(),
                audience,
                tools,
                disallowed_tools,
            )
            .is_none()
        })
    }

    /// The tools a definition names by name in its `tools` list that `audience` will not get
    /// from `pool`, each with why, in list order. Patterns (`*`, `prefix*`, `mcp__server`)
    /// name no tool in particular and are skipped. Spawning reports these as warnings, since
    /// a definition that names a tool expects it.
    pub fn unavailable(
        &self,
        pool: &ToolPool,
        audience: ToolAudience,
        tools: &[String],
        disallowed_tools: Option<&[String]>,
    ) -> Vec<(String, Unavailable)> {
        let mut out: Vec<(String, Unavailable)> = Vec::new();
        for entry in tools {
            let (name, _) = parse(entry);
            if name.is_empty()
                || name.ends_with('*')
                || (name.starts_with("mcp__") && !name["mcp__".len()..].contains("__"))
                || out.iter().any(|(n, _)| n == name)
            {
                continue;
            }
            let why = match pool.get(name) {
                None => Some(Unavailable::NotProvided),
                Some(tool) => self.verdict(
                    &tool.definition().name,
                    tool.aliases(),
                    tool.in_background(),
                    audience,
                    Some(tools),
                    disallowed_tools,
                ),
            };
            if let Some(why) = why {
                out.push((name.to_owned(), why));
            }
        }
        out
    }
}

/// Why a tool is not in an agent's pool (see [`ToolFilter::unavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unavailable {
    /// The host's tool pool has no tool of that name.
    NotProvided,
    /// Layer 1: no sub-agent may use it.
    SubagentsNever,
    /// Layer 2: it is not for agents that run unattended (the tool said so, or it is a
    /// built-in tool missing from [`ToolFilter::background_allow`]).
    NotInBackground,
    /// The definition's own `disallowedTools` takes it away.
    DisallowedByDefinition,
    /// The definition's `tools` list does not name it.
    NotListed,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unavailable::NotProvided => "the host provides no tool of that name",
            Unavailable::SubagentsNever => "no sub-agent may use it (filtering layer 1)",
            Unavailable::NotInBackground => {
                "agents running in the background may not use it (filtering layer 2)"
            }
            Unavailable::DisallowedByDefinition => "the definition's disallowedTools removes it",
            Unavailable::NotListed => "the definition's tools list does not name it",
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use ToolAudience::*;

    /// The names of `p`, in order.
    fn names(p: ToolPool) -> Vec<String> {
        p.names().iter().map(|n| (*n).to_owned()).collect()
    }

    /// A tool that says how it runs unattended and what else it answers to.
    #[derive(Debug)]
    struct Shaped(
        Arc<dyn crate::tool::Tool>,
        InBackground,
        &'static [&'static str],
    );

    #[async_trait::async_trait]
    impl crate::tool::Tool for Shaped {
        fn definition(&self) -> &forkhive_core::ToolDefinition {
            self.0.definition()
        }
        fn aliases(&self) -> &[&str] {
            self.2
        }
        fn is_concurrency_safe(&self, _: &serde_json::Value) -> bool {
            true
        }
        fn is_read_only(&self) -> bool {
            true
        }
        fn in_background(&self) -> InBackground {
            self.1
        }
        async fn call(
            &self,
            _: serde_json::Value,
            _: &crate::tool::ToolContext,
        ) -> crate::tool::ToolOutput {
            crate::tool::ToolOutput::text("")
        }
    }

    fn v(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Exact names, servers and prefixes alike: an entry that takes nothing away but would
    /// in another case is named, with what it meant in the tools' case.
    #[test]
    fn case_slips_name_only_entries_that_match_nothing_but_a_tool_in_another_case() {
        let names = ["Bash", "Read", "mcp__gh__issue"];
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        assert_eq!(
            case_slips(
                &v(&[
                    "bash",
                    " READ(x) ",
                    "Bash",
                    "read*",
                    "Write",
                    "MCP__gh__issue",
                    "mcp__GH",
                    "mcp__Gh__*",
                    "MCP__*",
                ]),
                &names
            ),
            owned(&[
                ("bash", "Bash"),
                ("READ(x)", "Read"),
                ("read*", "Read*"),
                ("MCP__gh__issue", "mcp__gh__issue"),
                ("mcp__GH", "mcp__gh"),
                ("mcp__Gh__*", "mcp__gh__*"),
                ("MCP__*", "mcp__*"),
            ])
        );
        assert!(case_slips(&v(&["Bash", "*", "mcp__gh", "mcp__*", "Re*"]), &names).is_empty());
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

    /// A list entry naming a tool's alias names the tool: `Task` (the legacy name Claude
    /// Code's definitions use) keeps or takes away `Agent`, which answers to it.
    #[test]
    fn entries_naming_an_alias_name_the_tool() {
        use crate::tool::test_tools::Fixed;
        let pool = ToolPool::new([
            Fixed::arc("Read", ""),
            Arc::new(Shaped(
                Fixed::arc("Agent", ""),
                InBackground::Allowed,
                &["Task"],
            )) as Arc<dyn crate::tool::Tool>,
        ])
        .unwrap();
        let f = ToolFilter::none();
        assert_eq!(
            names(f.pool(&pool, Foreground, None, Some(&v(&["Task"])))),
            ["Read"]
        );
        assert_eq!(
            names(f.pool(&pool, Foreground, Some(&v(&["Read", "Task"])), None)),
            ["Read", "Agent"]
        );
        assert_eq!(
            names(f.pool(&pool, Foreground, Some(&v(&["Read"])), None)),
            ["Read"]
        );
        assert!(
            f.unavailable(&pool, Foreground, &v(&["Task"]), Some(&v(&["Task"])))
                == [("Task".to_owned(), Unavailable::DisallowedByDefinition)]
        );
        // A pattern does not reach an alias: `Task*` is the tools named `Task…`.
        assert_eq!(
            names(f.pool(&pool, Foreground, None, Some(&v(&["Task*"])))),
            ["Read", "Agent"]
        );
        assert_eq!(
            names(f.pool(&pool, Foreground, Some(&v(&["Read", "Task*"])), None)),
            ["Read"]
        );
        // The filter's own lists go by name: `Task` there keeps nothing from `Agent`.
        let mut nesting = ToolFilter::none();
        nesting.global_disallow = v(&["Task"]);
        assert_eq!(
            names(nesting.pool(&pool, Foreground, None, None)),
            ["Read", "Agent"]
        );
    }

    /// Real tools: a host's own (the default `Allowed`) passes layer 2 as MCP tools do, a
    /// built-in one (`ByFilter`) goes by the list, a `Denied` one never runs unattended;
    /// layers 1 and 3 apply to all of them.
    #[test]
    fn pool_lets_each_tool_decide_layer_two() {
        use crate::tool::test_tools::Fixed;
        let declared = |name: &str, how| -> Arc<dyn crate::tool::Tool> {
            Arc::new(Shaped(Fixed::arc(name, ""), how, &[]))
        };
        let pool = ToolPool::new([
            Fixed::arc("Custom", ""),
            declared("Pager", InBackground::Denied),
            declared("Read", InBackground::ByFilter),
            declared("KillShell", InBackground::ByFilter),
            Fixed::arc("Agent", ""),
        ])
        .unwrap();
        let f = ToolFilter::default();
        assert_eq!(
            names(f.pool(&pool, Background, None, None)),
            ["Custom", "Read"]
        );
        assert_eq!(
            names(f.pool(&pool, Foreground, None, None)),
            ["Custom", "Pager", "Read", "KillShell"]
        );
        assert_eq!(
            names(f.pool(&pool, Background, None, Some(&v(&["Custom"])))),
            ["Read"]
        );
        assert_eq!(names(f.pool(&pool, Main, None, None)).len(), 5);
        // What a definition names and will not get, and why; patterns name nothing.
        let named = v(&[
            "Custom",
            "Pager",
            "KillShell",
            "Agent",
            "Nope",
            "Web*",
            "mcp__x",
            "Nope",
        ]);
        assert_eq!(
            f.unavailable(&pool, Background, &named, Some(&v(&["Custom"]))),
            [
                ("Custom".to_owned(), Unavailable::DisallowedByDefinition),
                ("Pager".to_owned(), Unavailable::NotInBackground),
                ("KillShell".to_owned(), Unavailable::NotInBackground),
                ("Agent".to_owned(), Unavailable::SubagentsNever),
                ("Nope".to_owned(), Unavailable::NotProvided),
            ]
        );
        assert!(
            f.unavailable(&pool, Main, &v(&["Custom", "Agent"]), None)
                .is_empty()
        );
    }
}
