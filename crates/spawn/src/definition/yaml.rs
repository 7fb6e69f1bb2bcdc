//! Reading the frontmatter's YAML, repairing the one-line mistakes people make, and turning
//! nodes into strings and JSON.
//!
//! Strict YAML first. When that fails inside a top-level entry whose value is a plain
//! (unquoted) scalar — `description: Use this agent when: ...`, `tools: *` — the entry's value
//! is taken as a literal string (the text exactly as written, continuation lines with their
//! common indentation removed; several lines only for `description`, `initialPrompt` and
//! unknown keys), written back as a double-quoted scalar, and the frontmatter is parsed
//! again; a warning says which line was repaired and how to fix it. A key set twice at the top
//! level keeps its last value, with a warning. Anything else is rejected at the parser's line
//! and column.

use std::collections::BTreeSet;

use saphyr::{LoadableYamlNode, MarkedYamlOwned, ScalarOwned, ScanError, YamlDataOwned};

use super::frontmatter::{KNOWN_KEYS, Problem, file_line};

/// The YAML document of a frontmatter, with the text its spans point into.
#[derive(Debug)]
pub(super) struct Document {
    /// The root node; `None` when the frontmatter holds no YAML at all.
    pub(super) root: Option<MarkedYamlOwned>,
    /// The (possibly repaired) frontmatter text; spans index its characters.
    pub(super) text: String,
    /// One warning per repair.
    pub(super) warnings: Vec<Problem>,
}

/// The message saphyr gives for a key set twice in one mapping.
const DUPLICATE_KEY: &str = "duplicated key in mapping";

/// The longest frontmatter read, in bytes: a real one is a few lines (the longest of 354 files
/// people wrote for Claude Code holds under 4 KB). Past it the file is refused before any
/// parse, so a hostile one costs no more than this to read.
pub(super) const MAX_FRONTMATTER: usize = 64 * 1024;

/// The most one-line repairs made to one frontmatter: each means a parse of the whole of it.
pub(super) const MAX_REPAIRS: usize = 64;

/// Parses the frontmatter lines (`lines[0]` is line 2 of the file), repairing what can be
/// repaired.
pub(super) fn parse(lines: &[&str]) -> Result<Document, Problem> {
    if let Some(line) = too_deep(lines) {
        return Err(Problem::new(
            file_line(line),
            1,
            format!(
                "the frontmatter nests deeper than {MAX_DEPTH} levels by this line; an agent \
                 definition needs a few; flatten it"
            ),
        ));
    }
    let size: usize = lines.iter().map(|l| l.len() + 1).sum();
    if size > MAX_FRONTMATTER {
        return Err(Problem::new(
            1,
            1,
            format!(
                "the frontmatter is {size} bytes, more than {} KiB; an agent definition's is a \
                 few lines: move long text into the body",
                MAX_FRONTMATTER / 1024
            ),
        ));
    }
    let mut work: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    let mut repaired = BTreeSet::new();
    let mut warnings = Vec::new();
    loop {
        let text = work.join("\n");
        refuse_anchors(&text)?;
        let error = match MarkedYamlOwned::load_from_str(&text) {
            Ok(docs) => {
                if let Some(second) = docs.get(1) {
                    warnings.push(Problem::new(
                        second.span.start.line() + 1,
                        second.span.start.col() + 1,
                        "a second YAML document starts here (after a `...` or `--- …` line); it \
                         was ignored; keep the whole frontmatter in one document",
                    ));
                }
                return Ok(Document {
                    root: docs.into_iter().next(),
                    text,
                    warnings,
                });
            }
            Err(error) => error,
        };
        // Each repair blanks out or rewrites one entry and never touches it again, so this
        // loop ends after at most one round per line — and after `MAX_REPAIRS` rounds, each a
        // parse of the whole frontmatter.
        if warnings.len() >= MAX_REPAIRS {
            let mut problem = reject(&work, &error);
            problem.message = format!(
                "{}; {MAX_REPAIRS} lines were repaired before this one, and no more are: quote \
                 the values that hold `: `",
                problem.message
            );
            return Err(problem);
        }
        match repair(&mut work, &mut repaired, &error) {
            Some(warning) => warnings.push(warning),
            None => return Err(reject(&work, &error)),
        }
    }
}

/// Refuses anchors (`&name`) and aliases (`*name`): an agent definition needs neither, and the
/// YAML loader keeps a copy of every anchored node once it is complete, so a few kilobytes of
/// anchors nested in flow lists take gigabytes (no alias needed). Read as events, before any
/// document is built; a scan error is left for the loader to report (and maybe repair).
fn refuse_anchors(text: &str) -> Result<(), Problem> {
    use saphyr_parser::Event;
    for item in saphyr_parser::Parser::new_from_str(text) {
        let Ok((event, span)) = item else {
            return Ok(());
        };
        let what = match event {
            Event::Alias(_) => "an alias (`*name`)",
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _)
                if anchor > 0 =>
            {
                "an anchor (`&name`)"
            }
            _ => continue,
        };
        return Err(Problem::new(
            span.start.line() + 1,
            span.start.col() + 1,
            format!(
                "{what} in the frontmatter; an agent definition uses neither anchors nor \
                 aliases: write the value out"
            ),
        ));
    }
    Ok(())
}

/// The deepest nesting the parser is given. The YAML parser caps flow nesting itself, but
/// builds and drops block nesting recursively: a few kilobytes of `- - - - …` would overflow
/// the stack of the thread that loads the file.
const MAX_DEPTH: usize = 256;

/// The first line (0-based) by which the nesting may exceed [`MAX_DEPTH`], from a cheap upper
/// bound: a nested block level needs one more column of indentation (a block list under a
/// key may share the key's column, but then its items are further in), or a `- `/`? `
/// indicator in the run that starts the line (`- - - x`), which can add a mapping level too.
fn too_deep(lines: &[&str]) -> Option<usize> {
    lines.iter().position(|line| {
        let content = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - content.len();
        let mut indicators = 0;
        let mut rest = content;
        while let Some(after) = rest.strip_prefix(['-', '?'])
            && (after.is_empty() || after.starts_with([' ', '\t']))
        {
            indicators += 1;
            rest = after.trim_start_matches([' ', '\t']);
        }
        indent + 2 * indicators + 2 > MAX_DEPTH
    })
}

/// A top-level `key: value` line: the key and the byte offset where the value starts.
pub(super) fn top_level_key(line: &str) -> Option<(&str, usize)> {
    let bytes = line.as_bytes();
    let first = *bytes.first()?;
    if !(first.is_ascii_alphanumeric() || first == b'_') {
        return None;
    }
    let key_end = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
        .unwrap_or(bytes.len());
    let mut i = key_end;
    while bytes.get(i).is_some_and(|b| *b == b' ' || *b == b'\t') {
        i += 1;
    }
    if bytes.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    match bytes.get(i) {
        None | Some(b' ' | b'\t') => {}
        Some(_) => return None,
    }
    while bytes.get(i).is_some_and(|b| *b == b' ' || *b == b'\t') {
        i += 1;
    }
    Some((&line[..key_end], i))
}

/// A top-level entry: its key line, the last line of its value, and the value's first line.
struct Entry<'a> {
    key: &'a str,
    /// 0-based index of the key line.
    line: usize,
    /// 0-based index of the value's last line (blank lines at the end excluded).
    end: usize,
    /// Byte offset of the value in the key line.
    value_at: usize,
}

impl<'a> Entry<'a> {
    /// The entry whose key is on line `line`, if that is a top-level key line.
    fn at(work: &'a [String], line: usize) -> Option<Entry<'a>> {
        let (key, value_at) = top_level_key(work.get(line)?)?;
        let mut end = line;
        for (i, l) in work.iter().enumerate().skip(line + 1) {
            if l.trim().is_empty() {
                continue;
            }
            if l.starts_with([' ', '\t']) {
                end = i;
            } else {
                break;
            }
        }
        Some(Entry {
            key,
            line,
            end,
            value_at,
        })
    }

    /// The entry that contains line `line`: the last top-level key line at or before it.
    fn containing(work: &'a [String], line: usize) -> Option<Entry<'a>> {
        let start = (0..=line.min(work.len().checked_sub(1)?))
            .rev()
            .find(|&i| top_level_key(&work[i]).is_some())?;
        Entry::at(work, start)
    }

    fn first_value<'w>(&self, work: &'w [String]) -> &'w str {
        work[self.line]
            .get(self.value_at..)
            .unwrap_or("")
            .trim_end()
    }

    /// 1-based column (in characters) of the value.
    fn value_column(&self, work: &[String]) -> usize {
        work[self.line]
            .get(..self.value_at)
            .map_or(0, |s| s.chars().count())
            + 1
    }
}

/// Whether a value starting like `value` is a plain scalar (or meant as one, like `*`), so
/// that reading it as a literal string is what its author meant.
fn is_plain_start(value: &str) -> bool {
    let Some(first) = value.chars().next() else {
        return false;
    };
    if matches!(first, '"' | '\'' | '|' | '>' | '[' | '{' | '&' | '!' | '#') {
        return false;
    }
    !(matches!(first, '-' | '?' | ':')
        && value[1..]
            .chars()
            .next()
            .is_none_or(|c| c == ' ' || c == '\t'))
}

/// Whether a parser error is one that reading a plain value as a literal string fixes: a
/// `: ` inside the value, a leading `*` (alias), or a leading reserved character (`@`, `` ` ``,
/// `%`). Tabs, bad indentation and unclosed quotes or brackets are not.
fn is_repairable(info: &str) -> bool {
    info.contains("mapping values are not allowed")
        || info.contains("anchor or alias")
        || info.contains("unknown anchor")
        || info.starts_with("unexpected character")
}

/// Tries to repair the entry the error is in; returns the warning, or `None` when the error
/// is not one this module repairs.
fn repair(
    work: &mut [String],
    repaired: &mut BTreeSet<usize>,
    error: &ScanError,
) -> Option<Problem> {
    let index = error.marker().line().checked_sub(1)?;
    if index >= work.len() {
        return None;
    }
    let entry = Entry::containing(work, index)?;
    if index > entry.end || repaired.contains(&entry.line) {
        return None;
    }
    let (key, line, end) = (entry.key.to_owned(), entry.line, entry.end);
    let column = entry.value_column(work);

    if error.info() == DUPLICATE_KEY {
        if index != line {
            return None;
        }
        // Keep the last value: blank out the earlier entries with this key.
        let earlier: Vec<(usize, usize)> = (0..line)
            .filter_map(|i| Entry::at(work, i))
            .filter(|e| e.key == key)
            .map(|e| (e.line, e.end))
            .collect();
        if earlier.is_empty() {
            return None;
        }
        let lines: Vec<String> = earlier
            .iter()
            .map(|(l, _)| file_line(*l).to_string())
            .collect();
        for (from, to) in earlier {
            for l in &mut work[from..=to] {
                l.clear();
            }
        }
        repaired.insert(line);
        return Some(Problem::new(
            file_line(line),
            1,
            format!(
                "`{key}` is set more than once (also on line {}); the last value was used; \
                 remove the others",
                lines.join(", ")
            ),
        ));
    }

    let first = entry.first_value(work).to_owned();
    if !is_plain_start(&first) || !is_repairable(error.info()) {
        return None;
    }
    // Several lines of text are only free text for a description, an initial prompt or a key
    // this crate does not interpret; `model: x` followed by an indented `key: value` is more
    // likely a mis-indented key than a two-line model name.
    let free_text = matches!(key.as_str(), "description" | "initialPrompt")
        || !KNOWN_KEYS.contains(&key.as_str());
    if end > line && !free_text {
        return None;
    }
    let continuation = &work[line + 1..=end];
    let indent = continuation
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start_matches([' ', '\t']).len())
        .min()
        .unwrap_or(0);
    let mut literal = first.clone();
    for l in continuation {
        literal.push('\n');
        literal.push_str(l.get(indent..).unwrap_or("").trim_end());
    }
    let all_lines = std::iter::once(first.as_str()).chain(continuation.iter().map(String::as_str));
    let has_colon = all_lines
        .clone()
        .any(|l| l.contains(": ") || l.contains(":\t") || l.trim_end().ends_with(':'));
    let lines_note = if end > line {
        format!(" (lines {}-{})", file_line(line), file_line(end))
    } else {
        String::new()
    };
    let fix = if end > line {
        format!("make it a block scalar: `{key}: |` with the text indented under it")
    } else {
        "quote it or use a block scalar `|`".to_owned()
    };
    let message = if first == "*" && end == line {
        format!(
            "the value of `{key}` is a bare `*`, which YAML reads as an alias; it was read as \
             the string `*`; quote it: `{key}: \"*\"`"
        )
    } else if first.starts_with('*') {
        format!(
            "the value of `{key}`{lines_note} starts with `*`, which YAML reads as an alias; it \
             was read as a literal string; {fix}"
        )
    } else if first.starts_with(['@', '`', '%']) {
        format!(
            "the value of `{key}`{lines_note} starts with `{}`, which YAML reserves; it was read \
             as a literal string; {fix}",
            &first[..1]
        )
    } else if has_colon {
        format!(
            "the value of `{key}`{lines_note} contains `: `; it was read as a literal string; {fix}"
        )
    } else {
        format!(
            "the value of `{key}`{lines_note} is not valid YAML ({}); it was read as a literal \
             string; {fix}",
            error.info()
        )
    };

    work[line] = format!("{key}: {}", double_quoted(&literal));
    for l in &mut work[line + 1..=end] {
        l.clear();
    }
    repaired.insert(line);
    Some(Problem::new(file_line(line), column, message))
}

/// The error for YAML this module does not repair, at the parser's position, with a hint for
/// the common case of an unindented line inside a multi-line plain value.
fn reject(work: &[String], error: &ScanError) -> Problem {
    let marker = error.marker();
    let index = marker.line().saturating_sub(1);
    // In a top-level mapping, a line at column 1 that is not blank, a comment, a list item or
    // a `key:` line is always an error; point at the first one, and at the value it breaks.
    let is_stray = |l: &str| {
        !l.trim().is_empty() && !l.starts_with([' ', '\t', '#', '-']) && top_level_key(l).is_none()
    };
    if let Some(stray) = (0..=index.min(work.len().saturating_sub(1))).find(|&i| is_stray(&work[i]))
        && let Some(entry) = (0..stray).rev().find_map(|k| Entry::at(work, k))
    {
        let key = entry.key;
        let value = entry.first_value(work);
        let shown = clip(work[stray].trim_end(), 40);
        let entry_line = file_line(entry.line);
        if is_plain_start(value) {
            return Problem::new(
                file_line(stray),
                1,
                format!(
                    "invalid YAML: `{shown}` is not indented and is not a `key: value` line, so \
                     it cannot continue the value of `{key}` (line {entry_line}); make `{key}` a \
                     block scalar: `{key}: |` with the text indented under it"
                ),
            );
        }
        if value.starts_with(['|', '>']) {
            return Problem::new(
                file_line(stray),
                1,
                format!(
                    "invalid YAML: `{shown}` is not indented, so it ends the block scalar \
                     `{key}` (line {entry_line}) and is not a `key: value` line; indent it like \
                     the lines above it"
                ),
            );
        }
    }
    // A flow list or mapping (`tools: [Read, Grep`) left open on its key line.
    if let Some(entry) = Entry::containing(work, index.saturating_sub(1))
        && entry.line < index
        && let Some(open) = entry.first_value(work).chars().next()
        && (open == '[' || open == '{')
    {
        let close = if open == '[' { ']' } else { '}' };
        let depth = |c: char| {
            work[entry.line..=entry.end]
                .iter()
                .map(|l| l.chars().filter(|v| *v == c).count())
                .sum::<usize>()
        };
        if depth(open) > depth(close) {
            return Problem::new(
                file_line(entry.line),
                entry.value_column(work),
                format!(
                    "invalid YAML: the `{open}` that starts the value of `{}` is never closed; \
                     close it with `{close}` (the parser stopped at line {}, column {}: {})",
                    entry.key,
                    marker.line() + 1,
                    marker.col() + 1,
                    error.info()
                ),
            );
        }
    }
    let mut message = format!("invalid YAML: {}", error.info());
    if error
        .info()
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| w == "tab" || w == "tabs")
    {
        message.push_str("; indent with spaces, not tabs");
    } else if work.get(index).is_some_and(|l| {
        // Only a tab at the parser's stop (or just before it): a tab elsewhere on the line, in
        // a quoted value say, is not what it stopped at.
        let col = marker.col();
        l.chars()
            .skip(col.saturating_sub(2))
            .take(3)
            .any(|c| c == '\t')
    }) {
        // `tools:<TAB>Read`: the parser's words do not say that the whitespace is a tab.
        message.push_str(
            "; the line holds a tab, which YAML does not take as a space there: use spaces",
        );
    }
    Problem::new(marker.line() + 1, marker.col() + 1, message)
}

/// At most `max` characters of `s`, with `…` when cut.
pub(super) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}

/// `s` as a YAML double-quoted scalar.
fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The 1-based file line and column where `node` starts.
pub(super) fn position(node: &MarkedYamlOwned) -> (usize, usize) {
    (node.span.start.line() + 1, node.span.start.col() + 1)
}

/// The characters `start..end` of `text` (a span's indices).
fn slice_chars(text: &str, start: usize, end: usize) -> String {
    text.chars()
        .skip(start)
        .take(end.saturating_sub(start))
        .collect()
}

/// What a scalar node says as text: a string as YAML gives it, any other scalar (`123`,
/// `true`) as written. `None` for null, collections and anything else.
pub(super) fn scalar_text(node: &MarkedYamlOwned, text: &str) -> Option<String> {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::String(s)) => Some(s.clone()),
        YamlDataOwned::Value(ScalarOwned::Null) => None,
        YamlDataOwned::Value(_) => Some(
            slice_chars(text, node.span.start.index(), node.span.end.index())
                .trim()
                .to_owned(),
        ),
        YamlDataOwned::Representation(s, _, _) => Some(s.clone()),
        YamlDataOwned::Tagged(_, inner) => scalar_text(inner, text),
        _ => None,
    }
}

/// Whether `node` is null (`key:`, `key: ~`, `key: null`).
pub(super) fn is_null(node: &MarkedYamlOwned) -> bool {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::Null) => true,
        YamlDataOwned::Tagged(_, inner) => is_null(inner),
        _ => false,
    }
}

/// A word for what kind of node `node` is, for messages.
pub(super) fn kind(node: &MarkedYamlOwned) -> &'static str {
    match &node.data {
        YamlDataOwned::Value(ScalarOwned::Null) => "null",
        YamlDataOwned::Value(ScalarOwned::Boolean(_)) => "a boolean",
        YamlDataOwned::Value(ScalarOwned::Integer(_) | ScalarOwned::FloatingPoint(_)) => "a number",
        YamlDataOwned::Value(ScalarOwned::String(_)) | YamlDataOwned::Representation(..) => {
            "a string"
        }
        YamlDataOwned::Sequence(_) => "a list",
        YamlDataOwned::Mapping(_) => "a mapping",
        YamlDataOwned::Tagged(_, inner) => kind(inner),
        YamlDataOwned::Alias(_) | YamlDataOwned::BadValue => "an invalid value",
    }
}

/// `node` as JSON. Keys become strings; a float JSON cannot hold (`.nan`, `.inf`) becomes its
/// text.
pub(super) fn to_json(node: &MarkedYamlOwned, text: &str) -> serde_json::Value {
    use serde_json::Value;
    match &node.data {
        YamlDataOwned::Value(scalar) => match scalar {
            ScalarOwned::Null => Value::Null,
            ScalarOwned::Boolean(b) => Value::Bool(*b),
            ScalarOwned::Integer(i) => Value::from(*i),
            ScalarOwned::FloatingPoint(f) => serde_json::Number::from_f64(f.into_inner())
                .map_or_else(
                    || Value::String(scalar_text(node, text).unwrap_or_default()),
                    Value::Number,
                ),
            ScalarOwned::String(s) => Value::String(s.clone()),
        },
        YamlDataOwned::Representation(s, _, _) => Value::String(s.clone()),
        YamlDataOwned::Sequence(items) => {
            Value::Array(items.iter().map(|i| to_json(i, text)).collect())
        }
        YamlDataOwned::Mapping(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (key_text(k, text), to_json(v, text)))
                .collect(),
        ),
        YamlDataOwned::Tagged(_, inner) => to_json(inner, text),
        YamlDataOwned::Alias(_) | YamlDataOwned::BadValue => Value::Null,
    }
}

/// A mapping key as a string: a scalar as text (`null` for a null key), anything else as
/// its JSON.
pub(super) fn key_text(key: &MarkedYamlOwned, text: &str) -> String {
    if is_null(key) {
        return "null".to_owned();
    }
    scalar_text(key, text).unwrap_or_else(|| to_json(key, text).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Document, Problem> {
        let lines: Vec<&str> = s.split('\n').collect();
        parse(&lines)
    }

    fn get<'a>(doc: &'a Document, key: &str) -> &'a MarkedYamlOwned {
        let Some(YamlDataOwned::Mapping(map)) = doc.root.as_ref().map(|r| &r.data) else {
            panic!("not a mapping");
        };
        map.iter()
            .find(|(k, _)| key_text(k, &doc.text) == key)
            .map(|(_, v)| v)
            .unwrap()
    }

    #[test]
    fn top_level_keys() {
        assert_eq!(top_level_key("name: x"), Some(("name", 6)));
        assert_eq!(top_level_key("tools:"), Some(("tools", 6)));
        assert_eq!(top_level_key("max_turns :  3"), Some(("max_turns", 13)));
        assert_eq!(top_level_key("  name: x"), None);
        assert_eq!(top_level_key("<example>"), None);
        assert_eq!(top_level_key("http://x"), None);
        assert_eq!(top_level_key("- a: b"), None);
    }

    #[test]
    fn strict_yaml_is_not_touched() {
        let doc = parse_str("name: a\ndescription: \"x: y\"").unwrap();
        assert!(doc.warnings.is_empty());
        assert_eq!(
            scalar_text(get(&doc, "description"), &doc.text).unwrap(),
            "x: y"
        );
    }

    #[test]
    fn one_line_colon_is_repaired() {
        let doc = parse_str("name: a\ndescription: Use it when: things break # really\nmodel: x")
            .unwrap();
        assert_eq!(
            scalar_text(get(&doc, "description"), &doc.text).unwrap(),
            "Use it when: things break # really"
        );
        assert_eq!(
            doc.warnings,
            [Problem::new(
                3,
                14,
                "the value of `description` contains `: `; it was read as a literal string; \
                 quote it or use a block scalar `|`"
            )]
        );
        assert_eq!(scalar_text(get(&doc, "model"), &doc.text).unwrap(), "x");
    }

    #[test]
    fn two_broken_values_are_both_repaired() {
        let doc = parse_str("name: a: b\ndescription: c: d").unwrap();
        assert_eq!(doc.warnings.len(), 2);
        assert_eq!(scalar_text(get(&doc, "name"), &doc.text).unwrap(), "a: b");
        assert_eq!(
            scalar_text(get(&doc, "description"), &doc.text).unwrap(),
            "c: d"
        );
    }

    #[test]
    fn multi_line_plain_value_keeps_its_lines() {
        let doc = parse_str(
            "description: Improves prompts.\n\n  <example>\n  user: hi\n  </example>\nmodel: x",
        )
        .unwrap();
        assert_eq!(
            scalar_text(get(&doc, "description"), &doc.text).unwrap(),
            "Improves prompts.\n\n<example>\nuser: hi\n</example>"
        );
        assert_eq!(
            doc.warnings[0].message,
            "the value of `description` (lines 2-6) contains `: `; it was read as a literal \
             string; make it a block scalar: `description: |` with the text indented under it"
        );
    }

    #[test]
    fn a_structured_key_is_not_repaired_over_several_lines() {
        assert_eq!(
            parse_str("name: a\nmodel: sonnet\n  extra: x").unwrap_err(),
            Problem::new(
                4,
                8,
                "invalid YAML: mapping values are not allowed in this context"
            )
        );
        // On one line it is, and the warning says what happened.
        let doc = parse_str("model: a: b").unwrap();
        assert_eq!(scalar_text(get(&doc, "model"), &doc.text).unwrap(), "a: b");
    }

    #[test]
    fn bare_star() {
        let doc = parse_str("tools: *").unwrap();
        assert_eq!(scalar_text(get(&doc, "tools"), &doc.text).unwrap(), "*");
        assert_eq!(doc.warnings[0].line, 2);
        assert_eq!(doc.warnings[0].column, 8);
        assert!(doc.warnings[0].message.contains("bare `*`"));
    }

    #[test]
    fn duplicate_top_level_key_keeps_the_last() {
        let doc = parse_str("model: a\nname: n\nmodel: b").unwrap();
        assert_eq!(scalar_text(get(&doc, "model"), &doc.text).unwrap(), "b");
        assert_eq!(
            doc.warnings,
            [Problem::new(
                4,
                1,
                "`model` is set more than once (also on line 2); the last value was used; \
                 remove the others"
            )]
        );
    }

    #[test]
    fn unindented_continuation_is_rejected_with_a_hint() {
        let p = parse_str(
            "name: a\ndescription: Does things.\n\n<example>\nContext: x\n</example>\nmodel: m",
        )
        .unwrap_err();
        assert_eq!((p.line, p.column), (5, 1));
        assert_eq!(
            p.message,
            "invalid YAML: `<example>` is not indented and is not a `key: value` line, so it \
             cannot continue the value of `description` (line 3); make `description` a block \
             scalar: `description: |` with the text indented under it"
        );
    }

    #[test]
    fn unclosed_flow_sequence_is_rejected_at_its_bracket() {
        let p = parse_str("name: a\ntools: [Read, Grep\nmodel: x").unwrap_err();
        assert_eq!(
            p,
            Problem::new(
                3,
                8,
                "invalid YAML: the `[` that starts the value of `tools` is never closed; close \
                 it with `]` (the parser stopped at line 4, column 6: illegal placement of ':' \
                 indicator)"
            )
        );
        // A tab after a key's colon: the parser's words, and what they do not say.
        let tabbed = parse_str("name: a\ntools:\tRead").unwrap_err();
        assert_eq!(tabbed.line, 3);
        assert!(
            tabbed.message.ends_with(
                "; the line holds a tab, which YAML does not take as a space there: use spaces"
            ),
            "{}",
            tabbed.message
        );
        // A tab elsewhere on the line is not named.
        let elsewhere = parse_str("name: a\ndescription: \"x\ty\" z").unwrap_err();
        assert!(!elsewhere.message.contains("tab"), "{}", elsewhere.message);
        // A flow list over several lines is fine, and other errors keep the parser's words.
        assert!(parse_str("tools: [Read,\n  Grep]\nmodel: x").is_ok());
        assert_eq!(
            parse_str("name: a\n\tmodel: b").unwrap_err(),
            Problem::new(
                2,
                7,
                "invalid YAML: while scanning a plain scalar, found a tab; indent with spaces, \
                 not tabs"
            )
        );
        assert_eq!(
            parse_str("name: a\ndescription: \"x\" y").unwrap_err(),
            Problem::new(
                3,
                18,
                "invalid YAML: invalid trailing content after double-quoted scalar"
            )
        );
    }

    #[test]
    fn a_frontmatter_past_the_limit_is_refused_before_parsing() {
        let long = format!("description: {}", "a".repeat(MAX_FRONTMATTER));
        assert_eq!(
            parse_str(&long).unwrap_err(),
            Problem::new(
                1,
                1,
                "the frontmatter is 65550 bytes, more than 64 KiB; an agent definition's is a few \
                 lines: move long text into the body"
            )
        );
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let deep = format!("x:\n  {}y", "- ".repeat(100_000));
        assert_eq!(
            parse_str(&deep).unwrap_err(),
            Problem::new(
                3,
                1,
                "the frontmatter nests deeper than 256 levels by this line; an agent definition \
                 needs a few; flatten it"
            )
        );
        // Ordinary nesting is fine.
        let hooks = "hooks:\n  PreToolUse:\n    - matcher: Bash\n      hooks:\n        - type: x";
        assert!(parse_str(hooks).is_ok());
        let fine = format!("x:\n  {}y", "- ".repeat(100));
        assert!(parse_str(&fine).is_ok());
        let dashes = format!("description: {}", "a - ".repeat(1000));
        assert!(parse_str(&dashes).is_ok());
    }

    #[test]
    fn a_second_document_is_ignored_with_a_warning() {
        let doc = parse_str("name: a\n...\nmodel: b").unwrap();
        assert!(scalar_text(get(&doc, "name"), &doc.text).is_some());
        assert_eq!(doc.warnings.len(), 1);
        assert_eq!((doc.warnings[0].line, doc.warnings[0].column), (4, 1));
    }

    #[test]
    fn quoting() {
        assert_eq!(
            double_quoted("a\"b\\c\nd\te\u{1}"),
            "\"a\\\"b\\\\c\\nd\\te\\u0001\""
        );
    }

    #[test]
    fn json_conversion() {
        let doc = parse_str("a: [1, 2.5, true, ~, x]\nb: {c: d}\n3: .nan").unwrap();
        let root = doc.root.as_ref().unwrap();
        assert_eq!(
            to_json(root, &doc.text),
            serde_json::json!({"a": [1, 2.5, true, null, "x"], "b": {"c": "d"}, "3": ".nan"})
        );
    }
}
