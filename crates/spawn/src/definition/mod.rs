//! Agent definitions: built-ins, Markdown files with YAML frontmatter, and the registry.
//!
//! An agent definition says what a sub-agent is for and what it may do: its name (the
//! `subagent_type` the model asks for), when to use it, its tools, its model, its limits and
//! its system prompt. "Chapter 9: Sub-Agents and the Fork Pattern — 9.1 AgentTool
//! Architecture" lists the fields; "9.2 Built-in Agents" the agents every host starts with;
//! "9.4 Custom Agents" the Markdown format people write their own agents in.
//!
//! | item | what it is |
//! | --- | --- |
//! | [`AgentDefinition`] | one agent: frontmatter fields, the Markdown body as system prompt, where it came from |
//! | [`DefinitionSource`] | built-in < host < plugin < user < project < flag < policy: who overrides whom |
//! | [`builtin_definitions`], [`fork_definition`] | `general-purpose`, `Explore`, `Plan`, `verification`; the synthetic fork agent |
//! | [`parse_agent_markdown`] | one file's text to a definition plus warnings, or an [`Error::Definition`] |
//! | [`load_dir`], [`AgentLoader`] | every `*.md` under a directory, recursively, into a [`LoadReport`] |
//! | [`AgentRegistry`] | the merged view: [`get`](AgentRegistry::get), [`list`](AgentRegistry::list), [`shadowed`](AgentRegistry::shadowed), diagnostics |
//!
//! The loader is never silent. Every file ends in exactly one of three states
//! ([`FileStatus`]): loaded; recovered, with a [`Diagnostic`] warning that names the line and
//! says how to fix it (the common case: a one-line `description` with an unquoted `: ` in it);
//! or rejected, with an error naming line and column. One bad file never stops the others.
//!
//! ```
//! use forkhive_spawn::definition::{AgentRegistry, DefinitionSource, parse_agent_markdown};
//! use std::path::Path;
//!
//! let text = "---\nname: reviewer\ndescription: Reviews diffs\ntools: Read, Grep\n---\nBe picky.\n";
//! let parsed = parse_agent_markdown(Path::new("reviewer.md"), text, DefinitionSource::Project)?;
//! assert_eq!(parsed.definition.tools, Some(vec!["Read".to_owned(), "Grep".to_owned()]));
//! assert_eq!(parsed.definition.system_prompt, "Be picky.");
//!
//! let registry = AgentRegistry::from_definitions(
//!     forkhive_spawn::definition::builtin_definitions().into_iter().chain([parsed.definition]),
//! );
//! assert!(registry.get("reviewer").is_some());
//! assert!(registry.get("Explore").is_some());
//! # Ok::<(), forkhive_spawn::Error>(())
//! ```

mod builtin;
mod diagnostic;
pub(crate) mod entry;
mod frontmatter;
mod loader;
mod parse;
mod registry;
pub mod skills;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

#[cfg(doc)]
use crate::Error;

pub use builtin::{
    EXPLORE_AGENT, FORK_AGENT, FORK_MAX_TURNS, GENERAL_PURPOSE_AGENT, PLAN_AGENT,
    VERIFICATION_AGENT, builtin_definitions, fork_definition,
};
pub use diagnostic::{Diagnostic, FileReport, FileStatus, LoadReport};
pub use loader::{AgentLoader, MAX_DEFINITION_FILE, load_dir, load_file};
pub use parse::{ParsedDefinition, parse_agent_markdown};
pub use registry::{AgentRegistry, DefinitionOrigin, Shadowed};

/// The `model` value that means "use the parent's model".
pub const MODEL_INHERIT: &str = "inherit";

/// The tool-list entry that means "every tool".
pub const ALL_TOOLS: &str = "*";

/// One agent: what it is for, what it may use, how it runs, and its system prompt.
///
/// Field names follow the frontmatter keys of "Chapter 9: Sub-Agents and the Fork Pattern —
/// 9.4 Custom Agents" in Rust casing (`disallowedTools` is [`disallowed_tools`](Self::disallowed_tools)).
/// Frontmatter keys the loader does not know are kept in [`extra`](Self::extra).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AgentDefinition {
    /// The agent type: the `name` key, and the `subagent_type` the Agent tool is called with.
    /// Kept exactly as the YAML gives it.
    pub name: String,
    /// When to use this agent (`whenToUse`): the `description` key, exactly as the YAML gives it.
    pub description: String,
    /// The allow list. `None`: the file does not restrict the tools. An entry [`ALL_TOOLS`]
    /// (`*`) also means every tool. `Some(vec![])` (`tools: []`) means no tools.
    pub tools: Option<Vec<String>>,
    /// Tools taken away even if [`tools`](Self::tools) allows them; `None` when not set.
    pub disallowed_tools: Option<Vec<String>>,
    /// Skills preloaded into the agent's context.
    pub skills: Vec<String>,
    /// MCP servers for this agent: a string names a configured server, an object
    /// (`{"name": {...}}`) defines one inline.
    pub mcp_servers: Vec<serde_json::Value>,
    /// Lifecycle hooks, as written (the Hooks chapter's format), not interpreted here.
    pub hooks: Option<serde_json::Value>,
    /// UI color.
    pub color: Option<String>,
    /// `None` (the host's default for sub-agents), [`MODEL_INHERIT`] (`inherit`: the parent's
    /// model), or a model name or alias (`haiku`, `claude-sonnet-4-5`), as written.
    pub model: Option<String>,
    /// Reasoning effort (`low`, `medium`, `high`, ...), as written.
    pub effort: Option<String>,
    /// Permission mode; `None` when not set or not understood (a warning says which).
    pub permission_mode: Option<PermissionMode>,
    /// Maximum number of turns.
    pub max_turns: Option<u32>,
    /// How long a child of this type may run before it is stopped and reported `killed`
    /// (frontmatter `deadline: 90s`, `30m`, `2h` or a number of seconds; a forkhive key).
    /// `None`: the task service's deadline. A host's
    /// `AgentToolConfig::deadlines` entry for the type overrides it.
    pub deadline: Option<std::time::Duration>,
    /// Whether the agent always runs in the background.
    pub background: bool,
    /// Isolation mode (`worktree` or `remote`), as written.
    pub isolation: Option<String>,
    /// Persistent memory scope (`user`, `project` or `local`), as written.
    pub memory: Option<String>,
    /// A first user turn sent before the delegated prompt.
    pub initial_prompt: Option<String>,
    /// Whether the agent is started without the project's CLAUDE.md context.
    pub omit_claude_md: bool,
    /// The system prompt: the Markdown body after the frontmatter, with surrounding
    /// whitespace trimmed and line endings normalised to `\n`.
    pub system_prompt: String,
    /// Where the definition came from; decides who overrides whom.
    pub source: DefinitionSource,
    /// The file it was read from; `None` for built-ins and definitions made in code.
    pub path: Option<PathBuf>,
    /// Frontmatter keys this crate does not know (`version`, `author`, `tags`, ...), as JSON,
    /// sorted by key.
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl AgentDefinition {
    /// A definition with only a name, a description and a source; everything else unset.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        source: DefinitionSource,
    ) -> Self {
        AgentDefinition {
            name: name.into(),
            description: description.into(),
            tools: None,
            disallowed_tools: None,
            skills: Vec::new(),
            mcp_servers: Vec::new(),
            hooks: None,
            color: None,
            model: None,
            effort: None,
            permission_mode: None,
            max_turns: None,
            deadline: None,
            background: false,
            isolation: None,
            memory: None,
            initial_prompt: None,
            omit_claude_md: false,
            system_prompt: String::new(),
            source,
            path: None,
            extra: BTreeMap::new(),
        }
    }

    /// Whether the allow list admits every tool: no list at all, or a list containing `*`.
    pub fn allows_all_tools(&self) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|tools| tools.iter().any(|t| t == ALL_TOOLS))
    }

    /// Whether `model` is [`MODEL_INHERIT`].
    pub fn inherits_model(&self) -> bool {
        self.model.as_deref() == Some(MODEL_INHERIT)
    }

    /// Where this definition came from.
    pub fn origin(&self) -> DefinitionOrigin {
        DefinitionOrigin {
            source: self.source,
            path: self.path.clone(),
        }
    }

    /// The key definitions of one name are ordered by; the greatest wins. Source first, then
    /// the depth of the file's path (deeper directory wins), then the path itself.
    pub(crate) fn priority_key(&self) -> (DefinitionSource, usize, Option<&Path>) {
        let depth = self.path.as_ref().map_or(0, |p| p.components().count());
        (self.source, depth, self.path.as_deref())
    }
}

/// Where a definition came from, lowest priority first: a later source overrides an earlier
/// one with the same name ("Chapter 9: Sub-Agents and the Fork Pattern — 9.1 AgentTool
/// Architecture — Three Agent Sources").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefinitionSource {
    /// Compiled into the library.
    BuiltIn,
    /// Defined in code by the host application — its own agents, which a plugin's, the
    /// user's or the project's files of the same name customise, as they do the built-ins.
    Host,
    /// Shipped by a plugin.
    Plugin,
    /// The user's own agents (`~/.claude/agents`).
    User,
    /// The project's agents (`.claude/agents`).
    Project,
    /// Given on the command line at start-up.
    Flag,
    /// Enterprise policy: overrides everything.
    Policy,
}

impl DefinitionSource {
    /// Every source, lowest priority first.
    pub const ALL: [DefinitionSource; 7] = [
        DefinitionSource::BuiltIn,
        DefinitionSource::Host,
        DefinitionSource::Plugin,
        DefinitionSource::User,
        DefinitionSource::Project,
        DefinitionSource::Flag,
        DefinitionSource::Policy,
    ];

    /// Whether what a definition from here asks for applies without the host's say-so: its
    /// hooks' commands, its own MCP servers and a loosening `permissionMode` — for the
    /// built-ins, the host's own (`Host`, built in its code), the user's (`~/.claude/agents`)
    /// and an enterprise policy's; not for a project's (which any cloned repository may
    /// carry), a plugin's or the command line's. One rule for all three: a source whose hook
    /// commands run unasked may as well switch permissions off, and one whose hooks need the
    /// host's word needs it for that too.
    pub fn is_trusted(self) -> bool {
        matches!(
            self,
            DefinitionSource::BuiltIn
                | DefinitionSource::Host
                | DefinitionSource::User
                | DefinitionSource::Policy
        )
    }

    /// The spelling used in reports: `built-in`, `host`, `plugin`, `user`, `project`, `flag`,
    /// `policy`.
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionSource::BuiltIn => "built-in",
            DefinitionSource::Host => "host",
            DefinitionSource::Plugin => "plugin",
            DefinitionSource::User => "user",
            DefinitionSource::Project => "project",
            DefinitionSource::Flag => "flag",
            DefinitionSource::Policy => "policy",
        }
    }
}

impl fmt::Display for DefinitionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an agent's tool calls are approved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PermissionMode {
    /// Ask as usual (`default`).
    Default,
    /// File edits are approved without asking (`acceptEdits`).
    AcceptEdits,
    /// Nothing is asked (`bypassPermissions`).
    BypassPermissions,
    /// Read-only planning (`plan`).
    Plan,
    /// Whatever would be asked is denied instead (`dontAsk`).
    DontAsk,
    /// Questions are passed up to the parent agent's user (`bubble`); the fork agent's mode.
    Bubble,
}

impl PermissionMode {
    /// Every mode, in declaration order.
    pub const ALL: [PermissionMode; 6] = [
        PermissionMode::Default,
        PermissionMode::AcceptEdits,
        PermissionMode::BypassPermissions,
        PermissionMode::Plan,
        PermissionMode::DontAsk,
        PermissionMode::Bubble,
    ];

    /// The frontmatter spelling (`acceptEdits`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::BypassPermissions => "bypassPermissions",
            PermissionMode::Plan => "plan",
            PermissionMode::DontAsk => "dontAsk",
            PermissionMode::Bubble => "bubble",
        }
    }
}

impl fmt::Display for PermissionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of [`PermissionMode`]'s `FromStr`: the value is not one of the six spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown permission mode {0:?}; expected one of default, acceptEdits, bypassPermissions, plan, dontAsk, bubble"
)]
pub struct UnknownPermissionMode(pub String);

impl FromStr for PermissionMode {
    type Err = UnknownPermissionMode;

    /// Parses the exact frontmatter spelling (case-sensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PermissionMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == s)
            .ok_or_else(|| UnknownPermissionMode(s.to_owned()))
    }
}

impl AgentDefinition {
    /// Whether its `mcpServers` defines servers of its own (inline `{name: config}` entries),
    /// which each of its agents connects for itself, rather than only naming the host's.
    pub fn defines_mcp_servers(&self) -> bool {
        fn inline(v: &serde_json::Value) -> bool {
            match v {
                serde_json::Value::Object(_) => true,
                serde_json::Value::Array(a) => a.iter().any(inline),
                _ => false,
            }
        }
        self.mcp_servers.iter().any(inline)
    }
}

/// Whether what a definition runs (its hooks' commands, its own MCP servers) runs without the
/// host's say-so: the built-ins', the host's own, the user's and an enterprise policy's — not
/// a project's, a plugin's or the command line's.
pub(crate) fn trusted_source(source: DefinitionSource) -> bool {
    source.is_trusted()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_ordered_by_priority() {
        let mut shuffled = [
            DefinitionSource::Policy,
            DefinitionSource::User,
            DefinitionSource::BuiltIn,
            DefinitionSource::Flag,
            DefinitionSource::Project,
            DefinitionSource::Host,
            DefinitionSource::Plugin,
        ];
        shuffled.sort();
        assert_eq!(shuffled, DefinitionSource::ALL);
        assert_eq!(
            serde_json::to_string(&DefinitionSource::BuiltIn).unwrap(),
            "\"built-in\""
        );
    }

    #[test]
    fn permission_modes_round_trip_their_spelling() {
        for mode in PermissionMode::ALL {
            assert_eq!(mode.as_str().parse::<PermissionMode>(), Ok(mode));
            assert_eq!(
                serde_json::to_string(&mode).unwrap(),
                format!("\"{}\"", mode.as_str())
            );
        }
        assert_eq!(
            "AcceptEdits"
                .parse::<PermissionMode>()
                .unwrap_err()
                .to_string(),
            "unknown permission mode \"AcceptEdits\"; expected one of default, acceptEdits, \
             bypassPermissions, plan, dontAsk, bubble"
        );
    }

    #[test]
    fn tool_helpers() {
        let mut def = AgentDefinition::new("a", "b", DefinitionSource::User);
        assert!(def.allows_all_tools());
        def.tools = Some(vec!["Read".into()]);
        assert!(!def.allows_all_tools());
        def.tools = Some(vec!["Read".into(), "*".into()]);
        assert!(def.allows_all_tools());
        assert!(!def.inherits_model());
        def.model = Some("inherit".into());
        assert!(def.inherits_model());
    }
}
