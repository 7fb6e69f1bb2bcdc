//! One agent file's text to an [`AgentDefinition`].

use std::path::Path;

use saphyr::{MarkedYamlOwned, ScalarOwned, YamlDataOwned};

use super::frontmatter::{self, KNOWN_KEYS, Problem};
use super::yaml::{self, is_null, kind, position, scalar_text, to_json};
use super::{AgentDefinition, DefinitionSource, Diagnostic, PermissionMode};
use crate::error::{Error, Result};

/// A definition read from a file, with the warnings about it (empty when the file was
/// clean).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ParsedDefinition {
    /// The definition.
    pub definition: AgentDefinition,
    /// What was repaired or ignored, each with where and how to fix it.
    pub warnings: Vec<Diagnostic>,
}

/// Parses the text of one agent file: YAML frontmatter between `---` lines, then the Markdown
/// body, which becomes the system prompt.
///
/// `path` is only used to name the file in diagnostics and in
/// [`AgentDefinition::path`]. A leading byte-order mark is skipped and `\r\n` line endings are
/// read as `\n`.
///
/// # Errors
///
/// [`Error::Definition`] naming line and column when the file cannot be used: it is empty,
/// has no frontmatter or an unclosed one, its YAML is invalid in a way that is not repaired,
/// `name` or `description` is missing or empty, `tools`/`disallowedTools` has a shape that
/// cannot be a tool list (a mapping), or a key is a case or separator variant of `tools`,
/// `disallowedTools` or `permissionMode` (`disallowed_tools`, `allowed-tools`). Everything else
/// that is wrong is a warning in [`ParsedDefinition::warnings`].
pub fn parse_agent_markdown(
    path: &Path,
    text: &str,
    source: DefinitionSource,
) -> Result<ParsedDefinition> {
    let at = |p: Problem| Diagnostic::new(path, p.line, p.column, p.message);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let normalized;
    // A lone `\r` is a line break to YAML and to editors: one here too, so every line the
    // parser reports, and every repair, counts lines as they are shown.
    let text = if text.contains('\r') {
        normalized = text.replace("\r\n", "\n").replace('\r', "\n");
        normalized.as_str()
    } else {
        text
    };
    let split = frontmatter::split(text).map_err(|p| Error::from(at(p)))?;
    let doc = yaml::parse(&split.lines).map_err(|p| Error::from(at(p)))?;

    let mut warnings: Vec<Problem> = split.warnings;
    warnings.extend(doc.warnings);
    let mut reader = Reader {
        text: &doc.text,
        warnings,
    };
    let definition = reader
        .definition(doc.root.as_ref(), split.body, source)
        .map_err(|p| Error::from(at(p)))?;
    let mut warnings = reader.warnings;
    warnings.sort_by_key(|w| (w.line, w.column));
    Ok(ParsedDefinition {
        definition: AgentDefinition {
            path: Some(path.to_path_buf()),
            ..definition
        },
        warnings: warnings.into_iter().map(at).collect(),
    })
}

/// Reads fields out of the frontmatter, collecting warnings.
struct Reader<'t> {
    text: &'t str,
    warnings: Vec<Problem>,
}

impl Reader<'_> {
    fn warn(&mut self, node: &MarkedYamlOwned, message: String) {
        let (line, column) = position(node);
        self.warnings.push(Problem::new(line, column, message));
    }

    fn definition(
        &mut self,
        root: Option<&MarkedYamlOwned>,
        body: &str,
        source: DefinitionSource,
    ) -> Result<AgentDefinition, Problem> {
        let Some(root) = root else {
            return Err(Problem::new(
                1,
                1,
                "the frontmatter is empty; add `name: <agent-name>` and `description: <when to \
                 use this agent>`",
            ));
        };
        let YamlDataOwned::Mapping(map) = &root.data else {
            let (line, column) = position(root);
            return Err(Problem::new(
                line,
                column,
                format!(
                    "the frontmatter is {}, not a mapping; write one `key: value` per line",
                    kind(root)
                ),
            ));
        };
        // A tagged key (`!x disallowedTools`) is another key to the YAML loader, so a second
        // one would not be caught as set twice, yet it reads as the plain key.
        if let Some(tagged) = map
            .keys()
            .find(|k| matches!(k.data, YamlDataOwned::Tagged(..)))
        {
            let (line, column) = position(tagged);
            return Err(Problem::new(
                line,
                column,
                format!(
                    "the key `{}` carries a tag; frontmatter keys are plain: remove the tag",
                    yaml::key_text(tagged, self.text)
                ),
            ));
        }
        let entries: Vec<(String, &MarkedYamlOwned, &MarkedYamlOwned)> = map
            .iter()
            .map(|(k, v)| (yaml::key_text(k, self.text), k, v))
            .collect();
        let get = |key: &str| {
            entries
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, _, v)| *v)
        };

        let name = get("name");
        let description = get("description");
        if name.is_none() || description.is_none() {
            let missing = match (name, description) {
                (None, None) => {
                    "no `name` and no `description`; add `name: <agent-name>` and \
                                 `description: <when to use this agent>`"
                }
                (None, Some(_)) => "no `name`; add `name: <agent-name>`",
                _ => "no `description`; add `description: <when to use this agent>`",
            };
            return Err(Problem::new(1, 1, format!("the frontmatter has {missing}")));
        }
        let name = self.required_string("name", name)?;
        let description = self.required_string("description", description)?;

        let mut def = AgentDefinition::new(name, description, source);
        def.system_prompt = body.to_owned();
        for (key, key_node, value) in &entries {
            match key.as_str() {
                "name" | "description" => {}
                "tools" => def.tools = self.tool_list(key, value)?,
                "disallowedTools" => def.disallowed_tools = self.tool_list(key, value)?,
                "skills" => def.skills = self.list(key, value, false)?.unwrap_or_default(),
                "mcpServers" => def.mcp_servers = self.mcp_servers(value),
                "hooks" => def.hooks = self.hooks(value),
                "color" => def.color = self.string(key, value),
                "model" => def.model = self.model(value),
                "effort" => def.effort = self.effort(value),
                "permissionMode" => def.permission_mode = self.permission_mode(value)?,
                "maxTurns" => def.max_turns = self.max_turns(value),
                "deadline" => def.deadline = self.deadline(value),
                "background" => def.background = self.flag(key, value).unwrap_or(false),
                "isolation" => {
                    def.isolation = self.one_of(key, value, &["worktree", "remote"]);
                }
                "memory" => def.memory = self.one_of(key, value, &["user", "project", "local"]),
                "initialPrompt" => def.initial_prompt = self.string(key, value),
                "omitClaudeMd" => def.omit_claude_md = self.flag(key, value).unwrap_or(false),
                _ => {
                    if let Some(known) =
                        similar_known_key(key).filter(|known| RESTRICTING_KEYS.contains(known))
                    {
                        // Kept as an unknown key, the restriction it was meant to be would be
                        // lost, and the agent would run with every tool or outside plan mode.
                        let (line, column) = position(key_node);
                        return Err(Problem::new(
                            line,
                            column,
                            format!(
                                "`{key}` is not a frontmatter key; did you mean `{known}`? The \
                                 definition is rejected: ignoring a restriction could widen what \
                                 the agent may do; write `{known}`"
                            ),
                        ));
                    }
                    if let Some(known) = similar_known_key(key) {
                        self.warn(
                            key_node,
                            format!(
                                "`{key}` is not a frontmatter key; did you mean `{known}`? It was \
                                 kept as an unknown key"
                            ),
                        );
                    }
                    def.extra.insert(key.clone(), to_json(value, self.text));
                }
            }
        }
        Ok(def)
    }

    /// `name` or `description`: a non-empty scalar, kept exactly as the YAML gives it.
    fn required_string(
        &mut self,
        key: &str,
        node: Option<&MarkedYamlOwned>,
    ) -> Result<String, Problem> {
        let Some(node) = node else {
            return Err(Problem::new(
                1,
                1,
                format!("the frontmatter has no `{key}`"),
            ));
        };
        let (line, column) = position(node);
        match scalar_text(node, self.text) {
            Some(s) if !s.trim().is_empty() => Ok(s),
            Some(_) => Err(Problem::new(line, column, format!("`{key}` is empty"))),
            None if is_null(node) => Err(Problem::new(line, column, format!("`{key}` is empty"))),
            None => Err(Problem::new(
                line,
                column,
                format!("`{key}` must be a string, not {}", kind(node)),
            )),
        }
    }

    /// A scalar as text; anything else is ignored with a warning.
    fn string(&mut self, key: &str, node: &MarkedYamlOwned) -> Option<String> {
        match scalar_text(node, self.text) {
            Some(s) if !s.trim().is_empty() => Some(s),
            _ => {
                self.warn(
                    node,
                    format!(
                        "`{key}` should be a string, not {}; it was ignored",
                        describe(node)
                    ),
                );
                None
            }
        }
    }

    /// A string from a known set; another value is kept, with a warning.
    fn one_of(&mut self, key: &str, node: &MarkedYamlOwned, allowed: &[&str]) -> Option<String> {
        let value = self.string(key, node)?;
        if !allowed.contains(&value.as_str()) {
            self.warn(
                node,
                format!(
                    "unknown `{key}` value `{}`; expected {}; it was kept as written",
                    yaml::clip(&value, 60),
                    allowed
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            );
        }
        Some(value)
    }

    /// `effort`: kept as written; one no backend can say is warned about now, not first when
    /// the agent runs.
    fn effort(&mut self, node: &MarkedYamlOwned) -> Option<String> {
        let effort = self.string("effort", node)?;
        if forkhive_transport::Effort::from_name(&effort).is_none() {
            self.warn(
                node,
                format!(
                    "unknown `effort` value `{}`; expected `low`, `medium`, `high` or `max`; it \
                     was kept as written, and the backend's default effort is used",
                    yaml::clip(&effort, 60)
                ),
            );
        }
        Some(effort)
    }

    fn model(&mut self, node: &MarkedYamlOwned) -> Option<String> {
        let model = self.string("model", node)?;
        if model.chars().any(char::is_whitespace) {
            self.warn(
                node,
                format!(
                    "`model` `{}` contains spaces, so it is not a model id or alias; it was kept \
                     as written; use an alias (`sonnet`, `opus`, `haiku`), a model id, or \
                     `inherit`",
                    yaml::clip(&model, 60)
                ),
            );
        }
        Some(model)
    }

    /// The mode, or `None` (warned) for a value that names none. A mode that restricts the
    /// agent (`plan`, `dontAsk`, `bubble`) written in another case (`Plan`) is an error:
    /// ignored, the restriction would be lost. (Ignoring a loosening one leaves the host's
    /// policy, so `AcceptEdits` is only a warning.)
    fn permission_mode(
        &mut self,
        node: &MarkedYamlOwned,
    ) -> Result<Option<PermissionMode>, Problem> {
        let text = scalar_text(node, self.text);
        let meant = text.as_deref().and_then(|t| {
            PermissionMode::ALL
                .into_iter()
                .find(|m| m.as_str().eq_ignore_ascii_case(t.trim()) && m.as_str() != t)
        });
        if let (Some(t), Some(meant)) = (text.as_deref(), meant)
            && matches!(
                meant,
                PermissionMode::Plan | PermissionMode::DontAsk | PermissionMode::Bubble
            )
        {
            let meant = meant.as_str();
            let (line, column) = position(node);
            return Err(Problem::new(
                line,
                column,
                format!(
                    "`permissionMode` `{}` is not a mode; did you mean `{meant}`? The definition \
                     is rejected: ignoring a mode could widen what the agent may do; write \
                     `{meant}`",
                    yaml::clip(t, 60)
                ),
            ));
        }
        Ok(match text.as_deref().map(str::parse::<PermissionMode>) {
            Some(Ok(mode)) => Some(mode),
            _ => {
                let shown =
                    text.map_or_else(|| describe(node), |t| format!("`{}`", yaml::clip(&t, 60)));
                let hint = meant.map_or_else(String::new, |m| {
                    format!(" (did you mean `{}`?)", m.as_str())
                });
                self.warn(
                    node,
                    format!(
                        "unknown `permissionMode` {shown}{hint}; expected `default`, \
                         `acceptEdits`, `bypassPermissions`, `plan`, `dontAsk` or `bubble`; it \
                         was ignored"
                    ),
                );
                None
            }
        })
    }

    fn max_turns(&mut self, node: &MarkedYamlOwned) -> Option<u32> {
        match &node.data {
            YamlDataOwned::Value(ScalarOwned::Integer(n)) => {
                if let Ok(n @ 1..) = u32::try_from(*n) {
                    return Some(n);
                }
            }
            YamlDataOwned::Value(ScalarOwned::String(s)) => {
                if let Ok(n @ 1..) = s.trim().parse::<u32>() {
                    self.warn(
                        node,
                        format!(
                            "`maxTurns` is a string; it was read as {n}; write it as a number: \
                             `maxTurns: {n}`"
                        ),
                    );
                    return Some(n);
                }
            }
            _ => {}
        }
        let shown = scalar_text(node, self.text)
            .map_or_else(|| describe(node), |t| format!("`{}`", yaml::clip(&t, 60)));
        self.warn(
            node,
            format!("`maxTurns` must be a whole number of at least 1; {shown} was ignored"),
        );
        None
    }

    /// `deadline`: `90s`, `30m`, `2h`, or a whole number of seconds, at least 1 second.
    fn deadline(&mut self, node: &MarkedYamlOwned) -> Option<std::time::Duration> {
        let secs = match &node.data {
            YamlDataOwned::Value(ScalarOwned::Integer(n)) => u64::try_from(*n).ok(),
            YamlDataOwned::Value(ScalarOwned::String(s)) => {
                let s = s.trim();
                let (number, unit) = match s.char_indices().last() {
                    Some((i, 's')) => (&s[..i], 1),
                    Some((i, 'm')) => (&s[..i], 60),
                    Some((i, 'h')) => (&s[..i], 3600),
                    _ => (s, 1),
                };
                number
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(unit))
            }
            _ => None,
        };
        if let Some(secs @ 1..) = secs {
            return Some(std::time::Duration::from_secs(secs));
        }
        let shown = scalar_text(node, self.text)
            .map_or_else(|| describe(node), |t| format!("`{}`", yaml::clip(&t, 60)));
        self.warn(
            node,
            format!(
                "`deadline` must be a duration of at least one second such as `90s`, `30m` or \
                 `2h`; {shown} was ignored"
            ),
        );
        None
    }

    fn flag(&mut self, key: &str, node: &MarkedYamlOwned) -> Option<bool> {
        match &node.data {
            YamlDataOwned::Value(ScalarOwned::Boolean(b)) => return Some(*b),
            YamlDataOwned::Value(ScalarOwned::String(s)) => {
                let b = match s.trim() {
                    "true" | "True" | "TRUE" | "yes" | "Yes" | "on" => Some(true),
                    "false" | "False" | "FALSE" | "no" | "No" | "off" => Some(false),
                    _ => None,
                };
                if let Some(b) = b {
                    self.warn(
                        node,
                        format!(
                            "`{key}` is the string `{}`; it was read as {b}; write `{key}: {b}`",
                            s.trim()
                        ),
                    );
                    return Some(b);
                }
            }
            _ => {}
        }
        self.warn(
            node,
            format!(
                "`{key}` must be `true` or `false`, not {}; it was ignored",
                describe(node)
            ),
        );
        None
    }

    /// A tool or skill list: a comma-separated string (`Read, Grep`), a single name, `*`, or a
    /// YAML list. `None` when the key has no value. With `strict`, a mapping is an error
    /// (ignoring a restriction would widen what the agent may do); otherwise a warning.
    /// A `tools` or `disallowedTools` list: [`list`](Self::list), and a warning for each
    /// entry whose `(rule)` is not enforced.
    fn tool_list(
        &mut self,
        key: &str,
        node: &MarkedYamlOwned,
    ) -> Result<Option<Vec<String>>, Problem> {
        let names = self.list(key, node, true)?;
        for entry in super::entry::unenforceable(names.as_deref().unwrap_or(&[])) {
            self.warn(node, super::entry::dropped_rule(key, &entry));
        }
        Ok(names)
    }

    fn list(
        &mut self,
        key: &str,
        node: &MarkedYamlOwned,
        strict: bool,
    ) -> Result<Option<Vec<String>>, Problem> {
        let unset = |this: &mut Self| {
            this.warn(
                node,
                format!(
                    "`{key}` has no value; it was treated as not set; list names, write \
                     `{key}: []` for none, or remove the key"
                ),
            );
            Ok(None)
        };
        match &node.data {
            YamlDataOwned::Sequence(items) => {
                let mut names = Vec::with_capacity(items.len());
                for item in items {
                    match scalar_text(item, self.text) {
                        Some(s) if !s.trim().is_empty() => names.push(s.trim().to_owned()),
                        _ => self.warn(
                            item,
                            format!(
                                "an entry of `{key}` is {}, not a name; it was skipped",
                                describe(item)
                            ),
                        ),
                    }
                }
                Ok(Some(names))
            }
            YamlDataOwned::Tagged(_, inner) => self.list(key, inner, strict),
            _ if is_null(node) => unset(self),
            _ => match scalar_text(node, self.text) {
                Some(s) => {
                    let names = split_names(&s);
                    if names.is_empty() {
                        return unset(self);
                    }
                    if let Some(spaced) = names.iter().find(|n| has_space_outside_parens(n)) {
                        self.warn(
                            node,
                            format!(
                                "`{key}` entry `{}` contains a space; separate names with \
                                 commas",
                                yaml::clip(spaced, 60)
                            ),
                        );
                    }
                    Ok(Some(names))
                }
                None => {
                    let (line, column) = position(node);
                    let message = format!(
                        "`{key}` must be a comma-separated string or a list of names, not {}",
                        kind(node)
                    );
                    if strict {
                        Err(Problem::new(line, column, message))
                    } else {
                        self.warnings.push(Problem::new(
                            line,
                            column,
                            format!("{message}; it was ignored"),
                        ));
                        Ok(None)
                    }
                }
            },
        }
    }

    /// `mcpServers`: a list of names and `{name: config}` objects, a mapping of name to
    /// config, or a comma-separated string of names.
    fn mcp_servers(&mut self, node: &MarkedYamlOwned) -> Vec<serde_json::Value> {
        match &node.data {
            YamlDataOwned::Sequence(items) => items.iter().map(|i| to_json(i, self.text)).collect(),
            YamlDataOwned::Mapping(map) => map
                .iter()
                .map(|(k, v)| {
                    let mut one = serde_json::Map::new();
                    one.insert(yaml::key_text(k, self.text), to_json(v, self.text));
                    serde_json::Value::Object(one)
                })
                .collect(),
            YamlDataOwned::Tagged(_, inner) => self.mcp_servers(inner),
            _ => match scalar_text(node, self.text) {
                Some(s) => split_names(&s)
                    .into_iter()
                    .map(serde_json::Value::String)
                    .collect(),
                None => {
                    self.warn(
                        node,
                        format!(
                            "`mcpServers` should be a list of server names or configurations, not \
                             {}; it was ignored",
                            describe(node)
                        ),
                    );
                    Vec::new()
                }
            },
        }
    }

    fn hooks(&mut self, node: &MarkedYamlOwned) -> Option<serde_json::Value> {
        if is_null(node) {
            return None;
        }
        let value = to_json(node, self.text);
        if !value.is_object() {
            self.warn(
                node,
                format!(
                    "`hooks` should be a mapping of hook events to hook lists, not {}; it was \
                     kept as written",
                    kind(node)
                ),
            );
        }
        Some(value)
    }
}

/// `a mapping`, `a list`, or a scalar shown as written (`` `abc` ``), for messages.
fn describe(node: &MarkedYamlOwned) -> String {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::String(s)) => format!("`{}`", yaml::clip(s, 60)),
        _ => kind(node).to_owned(),
    }
}

/// Splits at commas that are not inside parentheses or brackets (`Bash(git add:*, git
/// commit:*)` stays one name), trims, and drops empty names.
fn split_names(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                names.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    names.push(current);
    names
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

fn has_space_outside_parens(name: &str) -> bool {
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            c if c.is_whitespace() && depth == 0 => return true,
            _ => {}
        }
    }
    false
}

/// The keys that restrict what an agent may do: a misspelling of one is rejected, not kept as
/// an unknown key, since ignoring it could widen the agent's rights.
const RESTRICTING_KEYS: [&str; 4] = ["tools", "disallowedTools", "permissionMode", "hooks"];

/// The known key `key` is probably a misspelling of (`max_turns`, `Tools`,
/// `allowed-tools`), if any. A key that holds anything but ASCII (a zero-width space, a
/// no-break space, a Cyrillic `о`) and reads as a known key on screen — its ASCII letters a
/// letter or less away from it — counts too: no real key holds such characters.
fn similar_known_key(key: &str) -> Option<&'static str> {
    fn squash(s: &str) -> String {
        s.chars()
            .filter(|c| !matches!(c, '_' | '-' | ' '))
            .flat_map(char::to_lowercase)
            .collect()
    }
    let squashed = squash(key);
    if squashed == "allowedtools" || squashed == "allowedtool" {
        return Some("tools");
    }
    if let Some(known) = KNOWN_KEYS
        .into_iter()
        .find(|known| squash(known) == squashed)
    {
        return Some(known);
    }
    // A plural key written singular (`hook`, `tool`, `skill`, `mcpServer`).
    if let Some(known) = KNOWN_KEYS
        .into_iter()
        .find(|known| squash(known) == format!("{squashed}s"))
    {
        return Some(known);
    }
    if key.is_ascii() {
        return None;
    }
    let letters: String = squashed
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    KNOWN_KEYS
        .into_iter()
        .chain(["allowedTools"])
        .find(|known| at_most_one_edit(&squash(known), &letters))
        .map(|known| {
            if known == "allowedTools" {
                "tools"
            } else {
                known
            }
        })
}

/// Whether `a` becomes `b` by at most one insertion, deletion or substitution.
fn at_most_one_edit(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if long.len() - short.len() > 1 {
        return false;
    }
    let same = short.iter().zip(long).take_while(|(x, y)| x == y).count();
    let rest = if short.len() == long.len() {
        same + 1
    } else {
        same
    };
    short.get(rest..).unwrap_or_default() == long.get(same + 1..).unwrap_or_default()
        || short.len() == same
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `(rule)` in `tools` or `disallowedTools` is not enforced: each such entry is a
    /// warning saying what the agent gets instead; `Bash(*)` and `Bash()` lose nothing.
    #[test]
    fn rules_that_are_not_enforced_are_warned() {
        let p = parse(
            "---\nname: a\ndescription: d\ntools: Bash(git:*), Read, Grep(*)\n\
             disallowedTools:\n  - Bash(rm:*)\n  - Write()\n---\nbody",
        )
        .unwrap();
        assert_eq!(
            messages(&p),
            [
                "a.md:4:8: `Bash(git:*)` in `tools`: a rule is not enforced here, so the agent gets \
                 all of `Bash`; hold what the rule forbids back with your permission policy, or \
                 list `Bash` to say so",
                "a.md:6:3: `Bash(rm:*)` in `disallowedTools`: a rule is not enforced here, so all of \
                 `Bash` is taken away; list `Bash` to say so, or leave it to your permission \
                 policy",
            ]
        );
        assert_eq!(
            p.definition.tools.as_deref(),
            Some(
                &[
                    "Bash(git:*)".to_owned(),
                    "Read".to_owned(),
                    "Grep(*)".to_owned()
                ][..]
            )
        );
    }

    fn parse(text: &str) -> Result<ParsedDefinition> {
        parse_agent_markdown(Path::new("a.md"), text, DefinitionSource::Project)
    }

    fn messages(p: &ParsedDefinition) -> Vec<String> {
        p.warnings.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_field() {
        let p = parse(
            "---\nname: security-auditor\ndescription: Audits code\ntools:\n  - Bash\n  - Read\n\
             disallowedTools: Write\nmodel: haiku\neffort: high\npermissionMode: default\n\
             maxTurns: 30\ndeadline: 10m\ncolor: orange\nbackground: true\nmemory: project\n\
             isolation: worktree\ninitialPrompt: Start here\nomitClaudeMd: true\nskills:\n  - /commit\n\
             mcpServers:\n  - slack\n  - local: {command: x}\nhooks:\n  PreToolUse:\n    - \
             matcher: Bash\n      command: \"audit-log.sh\"\nversion: 1.0.0\n---\nYou audit.\n",
        )
        .unwrap();
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        let d = p.definition;
        assert_eq!(d.name, "security-auditor");
        assert_eq!(d.tools, Some(vec!["Bash".into(), "Read".into()]));
        assert_eq!(d.disallowed_tools, Some(vec!["Write".into()]));
        assert_eq!(d.model.as_deref(), Some("haiku"));
        assert_eq!(d.effort.as_deref(), Some("high"));
        assert_eq!(d.permission_mode, Some(PermissionMode::Default));
        assert_eq!(d.max_turns, Some(30));
        assert_eq!(d.deadline, Some(std::time::Duration::from_secs(600)));
        assert_eq!(d.color.as_deref(), Some("orange"));
        assert!(d.background && d.omit_claude_md);
        assert_eq!(d.memory.as_deref(), Some("project"));
        assert_eq!(d.isolation.as_deref(), Some("worktree"));
        assert_eq!(d.initial_prompt.as_deref(), Some("Start here"));
        assert_eq!(d.skills, ["/commit"]);
        assert_eq!(
            d.mcp_servers,
            [
                serde_json::json!("slack"),
                serde_json::json!({"local": {"command": "x"}})
            ]
        );
        assert_eq!(
            d.hooks,
            Some(
                serde_json::json!({"PreToolUse": [{"matcher": "Bash", "command": "audit-log.sh"}]})
            )
        );
        assert_eq!(d.extra["version"], serde_json::json!("1.0.0"));
        assert_eq!(d.system_prompt, "You audit.");
        assert_eq!(d.path.as_deref(), Some(Path::new("a.md")));
        assert_eq!(d.source, DefinitionSource::Project);
    }

    #[test]
    fn tool_list_shapes() {
        let tools = |v: &str| {
            parse(&format!("---\nname: a\ndescription: b\ntools: {v}\n---\n"))
                .unwrap()
                .definition
                .tools
        };
        assert_eq!(
            tools("Read, Grep,Glob"),
            Some(vec!["Read".into(), "Grep".into(), "Glob".into()])
        );
        assert_eq!(tools("Read"), Some(vec!["Read".into()]));
        assert_eq!(tools("'*'"), Some(vec!["*".into()]));
        assert_eq!(tools("[]"), Some(vec![]));
        assert_eq!(
            tools("[Read, Edit]"),
            Some(vec!["Read".into(), "Edit".into()])
        );
        assert_eq!(
            tools("Read, Bash(git add:*, git commit:*), mcp__x__*"),
            Some(vec![
                "Read".into(),
                "Bash(git add:*, git commit:*)".into(),
                "mcp__x__*".into()
            ])
        );
    }

    #[test]
    fn empty_tools_is_unset_with_a_warning() {
        let p = parse("---\nname: a\ndescription: b\ntools:\n---\n").unwrap();
        assert_eq!(p.definition.tools, None);
        assert_eq!(
            messages(&p),
            [
                "a.md:4:6: `tools` has no value; it was treated as not set; list names, write \
              `tools: []` for none, or remove the key"
            ]
        );
    }

    #[test]
    fn tools_as_a_mapping_is_rejected() {
        let e = parse("---\nname: a\ndescription: b\ntools:\n  Read: true\n---\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.md:5:3: `tools` must be a comma-separated string or a list of names, not a mapping"
        );
    }

    /// A misspelled restriction is rejected: kept as an unknown key (as other misspellings
    /// are), it would leave the agent every tool, or outside plan mode.
    #[test]
    fn a_misspelled_restriction_is_rejected_not_ignored() {
        let err = |key: &str, value: &str| {
            parse(&format!(
                "---\nname: a\ndescription: b\n{key}: {value}\n---\n"
            ))
            .unwrap_err()
            .to_string()
        };
        let rejected = |key: &str, known: &str| {
            format!(
                "a.md:4:1: `{key}` is not a frontmatter key; did you mean `{known}`? The \
                 definition is rejected: ignoring a restriction could widen what the agent may \
                 do; write `{known}`"
            )
        };
        assert_eq!(
            err("disallowed_tools", "Bash, Write"),
            rejected("disallowed_tools", "disallowedTools")
        );
        assert_eq!(
            err("permission_mode", "plan"),
            rejected("permission_mode", "permissionMode")
        );
        assert_eq!(
            err("allowed-tools", "Read"),
            rejected("allowed-tools", "tools")
        );
        assert_eq!(err("Tools", "Read"), rejected("Tools", "tools"));
        // A plural written singular: `hook` would drop the hooks that block tools.
        assert_eq!(err("hook", "\n  PreToolUse: []"), rejected("hook", "hooks"));
        assert_eq!(err("tool", "Read"), rejected("tool", "tools"));
        assert_eq!(
            err("allowed_tool", "Read"),
            rejected("allowed_tool", "tools")
        );
        // A loosening mode in another case, ignored, leaves the host's policy: a warning.
        let p = parse("---\nname: a\ndescription: b\npermissionMode: AcceptEdits\n---\n").unwrap();
        assert_eq!(p.definition.permission_mode, None);
        assert_eq!(
            messages(&p),
            [
                "a.md:4:17: unknown `permissionMode` `AcceptEdits` (did you mean `acceptEdits`?); \
              expected `default`, `acceptEdits`, `bypassPermissions`, `plan`, `dontAsk` or \
              `bubble`; it was ignored"
            ]
        );
        // A mode in another case is no mode: `Plan` ignored would lose plan mode.
        assert_eq!(
            err("permissionMode", "Plan"),
            "a.md:4:17: `permissionMode` `Plan` is not a mode; did you mean `plan`? The \
             definition is rejected: ignoring a mode could widen what the agent may do; write \
             `plan`"
        );
        // Other misspellings stay warnings.
        assert!(parse("---\nname: a\ndescription: b\ninitial_prompt: hi\n---\n").is_ok());
        let p = parse("---\nname: a\ndescription: b\nskill: x\n---\n").unwrap();
        assert_eq!(
            messages(&p),
            [
                "a.md:4:1: `skill` is not a frontmatter key; did you mean `skills`? It was kept as \
              an unknown key"
            ]
        );
    }

    /// An effort no backend can say is warned about when the file is read (in any case, as
    /// the backends read it: `High` is high).
    #[test]
    fn an_unknown_effort_is_a_warning_when_read() {
        let p = parse("---\nname: a\ndescription: b\neffort: extreme\n---\n").unwrap();
        assert_eq!(p.definition.effort.as_deref(), Some("extreme"));
        assert_eq!(
            messages(&p),
            [
                "a.md:4:9: unknown `effort` value `extreme`; expected `low`, `medium`, `high` or \
                 `max`; it was kept as written, and the backend's default effort is used"
            ]
        );
        let p = parse("---\nname: a\ndescription: b\neffort: High\n---\n").unwrap();
        assert!(p.warnings.is_empty());
    }

    #[test]
    fn unknown_permission_mode_is_a_warning() {
        let p = parse("---\nname: a\ndescription: b\npermissionMode: yolo\n---\n").unwrap();
        assert_eq!(p.definition.permission_mode, None);
        assert_eq!(
            messages(&p),
            [
                "a.md:4:17: unknown `permissionMode` `yolo`; expected `default`, `acceptEdits`, \
              `bypassPermissions`, `plan`, `dontAsk` or `bubble`; it was ignored"
            ]
        );
    }

    #[test]
    fn odd_values_are_warnings() {
        let p = parse(
            "---\nname: a\ndescription: b\nmodel: Claude Sonnet 4.5 (copilot)\nmaxTurns: 0\n\
             background: \"yes\"\nmax_turns: 3\nisolation: docker\n---\n",
        )
        .unwrap();
        let d = &p.definition;
        assert_eq!(d.model.as_deref(), Some("Claude Sonnet 4.5 (copilot)"));
        assert_eq!(d.max_turns, None);
        assert!(d.background);
        assert_eq!(d.extra["max_turns"], serde_json::json!(3));
        assert_eq!(
            messages(&p),
            [
                "a.md:4:8: `model` `Claude Sonnet 4.5 (copilot)` contains spaces, so it is not a \
                 model id or alias; it was kept as written; use an alias (`sonnet`, `opus`, \
                 `haiku`), a model id, or `inherit`",
                "a.md:5:11: `maxTurns` must be a whole number of at least 1; `0` was ignored",
                "a.md:6:13: `background` is the string `yes`; it was read as true; write \
                 `background: true`",
                "a.md:7:1: `max_turns` is not a frontmatter key; did you mean `maxTurns`? It was \
                 kept as an unknown key",
                "a.md:8:12: unknown `isolation` value `docker`; expected `worktree` or `remote`; \
                 it was kept as written",
            ]
        );
    }

    #[test]
    fn name_and_description_are_kept_exactly() {
        let p = parse("---\nname: 007\ndescription: >\n  Folded\n  text\n---\n").unwrap();
        assert_eq!(p.definition.name, "007");
        assert_eq!(p.definition.description, "Folded text\n");
    }

    #[test]
    fn missing_and_empty_required_keys() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert_eq!(
            err("---\ndescription: b\n---\n"),
            "a.md:1:1: the frontmatter has no `name`; add `name: <agent-name>`"
        );
        assert_eq!(
            err("---\nname: a\n---\n"),
            "a.md:1:1: the frontmatter has no `description`; add `description: <when to use \
             this agent>`"
        );
        assert_eq!(
            err("---\nname: ''\ndescription: b\n---\n"),
            "a.md:2:7: `name` is empty"
        );
        assert_eq!(
            err("---\nname: [a]\ndescription: b\n---\n"),
            "a.md:2:7: `name` must be a string, not a list"
        );
        assert_eq!(
            err("---\n---\nbody"),
            "a.md:1:1: the frontmatter is empty; add `name: <agent-name>` and `description: \
             <when to use this agent>`"
        );
        assert_eq!(
            err("---\n- a\n---\n"),
            "a.md:2:1: the frontmatter is a list, not a mapping; write one `key: value` per line"
        );
    }

    #[test]
    fn crlf_and_bom() {
        let p = parse(
            "\u{feff}---\r\nname: a\r\ndescription: |\r\n  x\r\n  y\r\n---\r\nBody\r\nmore\r\n",
        )
        .unwrap();
        assert_eq!(p.definition.description, "x\ny\n");
        assert_eq!(p.definition.system_prompt, "Body\nmore");
    }

    #[test]
    fn splitting_names() {
        assert_eq!(split_names(" a , ,b "), ["a", "b"]);
        assert!(split_names(" , ").is_empty());
        assert!(has_space_outside_parens("Read Grep"));
        assert!(!has_space_outside_parens("Bash(npm test:*)"));
        assert_eq!(similar_known_key("allowed-tools"), Some("tools"));
        assert_eq!(
            similar_known_key("Disallowed_Tools"),
            Some("disallowedTools")
        );
        assert_eq!(similar_known_key("author"), None);
    }

    #[test]
    fn deadlines_in_each_spelling_and_the_bad_ones_warned() {
        let d = |v: &str| {
            let p = parse(&format!(
                "---\nname: a\ndescription: b\ndeadline: {v}\n---\n"
            ))
            .unwrap();
            (
                p.definition.deadline.map(|d| d.as_secs()),
                p.warnings
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(d("90"), (Some(90), vec![]));
        assert_eq!(d("90s"), (Some(90), vec![]));
        assert_eq!(d("30m"), (Some(1800), vec![]));
        assert_eq!(d("2h"), (Some(7200), vec![]));
        assert_eq!(
            d("0"),
            (
                None,
                vec![
                    "a.md:4:11: `deadline` must be a duration of at least one second such as \
                     `90s`, `30m` or `2h`; `0` was ignored"
                        .to_owned()
                ]
            )
        );
        assert_eq!(d("soon").0, None);
        assert_eq!(d("-5m").0, None);
    }
}
