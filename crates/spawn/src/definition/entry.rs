//! A `tools` / `disallowedTools` entry: a name pattern, and perhaps a `(rule)` this crate does
//! not enforce (see `tool::filter`). Here, below both the parser and the filter, so each
//! reads entries the same way.

/// An entry split into its name pattern and its `(rule)`, if any (both trimmed).
pub(crate) fn split(entry: &str) -> (&str, Option<&str>) {
    let entry = entry.trim();
    if let Some(body) = entry.strip_suffix(')')
        && let Some((pattern, rule)) = body.split_once('(')
    {
        return (pattern.trim(), Some(rule.trim()));
    }
    (entry, None)
}

/// The entries of `entries` whose `(rule)` is dropped, in their order, as written:
/// `Bash(npm test:*)` is one; `Bash`, `mcp__github__*`, `Bash(*)` and `Bash()` are not, since
/// they lose nothing.
pub(crate) fn unenforceable(entries: &[String]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| {
            split(e)
                .1
                .is_some_and(|rule| !rule.is_empty() && rule != "*")
        })
        .cloned()
        .collect()
}

/// What dropping the `(rule)` of `entry` (one of [`unenforceable`]) does, for a warning: in
/// `tools` (`key`) the agent gets the whole tool, in `disallowedTools` loses it.
pub(crate) fn dropped_rule(key: &str, entry: &str) -> String {
    let tool = split(entry).0;
    if key == "disallowedTools" {
        format!(
            "`{entry}` in `disallowedTools`: a rule is not enforced here, so all of `{tool}` is \
             taken away; list `{tool}` to say so, or leave it to your permission policy"
        )
    } else {
        format!(
            "`{entry}` in `{key}`: a rule is not enforced here, so the agent gets all of \
             `{tool}`; hold what the rule forbids back with your permission policy, or list \
             `{tool}` to say so"
        )
    }
}
