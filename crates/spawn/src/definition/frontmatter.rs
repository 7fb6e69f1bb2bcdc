//! Splitting an agent file into its YAML frontmatter and its Markdown body.
//!
//! The file must start with a line `---` (trailing spaces allowed); the frontmatter runs to
//! the next line `---`, and everything after that line is the body. A closing line of more
//! than three dashes (`-----…`) is accepted with a warning.

/// The frontmatter keys this crate reads, in the spelling files use.
pub(super) const KNOWN_KEYS: [&str; 18] = [
    "name",
    "description",
    "tools",
    "disallowedTools",
    "skills",
    "mcpServers",
    "hooks",
    "color",
    "model",
    "effort",
    "permissionMode",
    "maxTurns",
    "background",
    "isolation",
    "memory",
    "initialPrompt",
    "omitClaudeMd",
    "deadline",
];

/// A problem at a 1-based line and column of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub(super) line: usize,
    pub(super) column: usize,
    pub(super) message: String,
}

impl Problem {
    pub(super) fn new(line: usize, column: usize, message: impl Into<String>) -> Self {
        Problem {
            line,
            column,
            message: message.into(),
        }
    }
}

/// The two parts of an agent file.
#[derive(Debug)]
pub(super) struct Split<'a> {
    /// The frontmatter's lines, without the fences; `lines[0]` is line 2 of the file.
    pub(super) lines: Vec<&'a str>,
    /// The Markdown body, trimmed.
    pub(super) body: &'a str,
    /// Warnings about the fences.
    pub(super) warnings: Vec<Problem>,
}

/// The file line of frontmatter line `index` (0-based).
pub(super) fn file_line(index: usize) -> usize {
    index + 2
}

/// Splits `text` (line endings already `\n`) into frontmatter and body.
pub(super) fn split(text: &str) -> Result<Split<'_>, Problem> {
    if text.trim().is_empty() {
        return Err(Problem::new(
            1,
            1,
            "the file is empty; an agent file starts with a `---` line, then `name:` and \
             `description:`, then a `---` line, then the system prompt",
        ));
    }
    let lines: Vec<&str> = text.split('\n').collect();
    if !is_fence(lines[0]) {
        return Err(no_frontmatter(&lines));
    }
    let mut warnings = Vec::new();
    let close = lines
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, line)| dashes_only(line))
        .map(|(i, _)| i);
    let Some(close) = close else {
        return Err(Problem::new(
            1,
            1,
            "the frontmatter opened by `---` on line 1 is never closed; add a line `---` \
             after the last frontmatter key",
        ));
    };
    let closing = lines[close].trim_end();
    if closing.len() > 3 {
        warnings.push(Problem::new(
            close + 1,
            1,
            format!(
                "the frontmatter is closed by a line of {} dashes; it was read as `---`; \
                 close the frontmatter with exactly `---`",
                closing.len()
            ),
        ));
    }
    // The body starts after the closing line's newline.
    let body_start: usize = lines[..=close].iter().map(|l| l.len() + 1).sum();
    let body = text.get(body_start..).unwrap_or("").trim();
    Ok(Split {
        lines: lines[1..close].to_vec(),
        body,
        warnings,
    })
}

/// `---`, with trailing spaces or tabs allowed.
fn is_fence(line: &str) -> bool {
    line.trim_end_matches([' ', '\t']) == "---"
}

/// Three or more dashes and nothing else (trailing spaces allowed).
fn dashes_only(line: &str) -> bool {
    let t = line.trim_end_matches([' ', '\t']);
    t.len() >= 3 && t.bytes().all(|b| b == b'-')
}

fn no_frontmatter(lines: &[&str]) -> Problem {
    // An opening fence that is there but not on line 1, column 1 gets its own message.
    if let Some((i, line)) = lines
        .iter()
        .enumerate()
        .find(|(_, line)| !line.trim().is_empty())
        && line.trim() == "---"
    {
        let column = line.chars().take_while(|c| c.is_whitespace()).count() + 1;
        return Problem::new(
            i + 1,
            column,
            "the frontmatter's opening `---` must be the first line of the file, at column 1; \
             remove the blank lines and indentation before it (and indent nothing inside it)",
        );
    }
    Problem::new(
        1,
        1,
        "no frontmatter: an agent file starts with a `---` line, then `name:` and \
         `description:`, then a `---` line; if this file is not an agent definition, move it \
         out of the agents directory",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_frontmatter_and_trimmed_body() {
        let s = split("---\nname: a\ndescription: b\n---\n\nBody text.\n\n").unwrap();
        assert_eq!(s.lines, ["name: a", "description: b"]);
        assert_eq!(s.body, "Body text.");
        assert!(s.warnings.is_empty());
        assert_eq!(file_line(0), 2);
    }

    #[test]
    fn empty_body_and_trailing_spaces_on_fences() {
        let s = split("---  \nname: a\n--- \t").unwrap();
        assert_eq!(s.lines, ["name: a"]);
        assert_eq!(s.body, "");
    }

    #[test]
    fn long_dash_line_closes_with_a_warning() {
        let s = split("---\nname: a\n-------\nbody").unwrap();
        assert_eq!(s.lines, ["name: a"]);
        assert_eq!(s.body, "body");
        assert_eq!(
            s.warnings,
            [Problem::new(
                3,
                1,
                "the frontmatter is closed by a line of 7 dashes; it was read as `---`; close \
                 the frontmatter with exactly `---`"
            )]
        );
    }

    #[test]
    fn empty_file() {
        let p = split("").unwrap_err();
        assert_eq!((p.line, p.column), (1, 1));
        assert!(p.message.starts_with("the file is empty"));
        assert_eq!(split(" \n\n").unwrap_err().message, p.message);
    }

    #[test]
    fn no_frontmatter_names_line_one() {
        let p = split("# Title\n\nSome text\n").unwrap_err();
        assert_eq!((p.line, p.column), (1, 1));
        assert!(p.message.starts_with("no frontmatter:"), "{}", p.message);
    }

    #[test]
    fn indented_fence_after_blank_line() {
        let p = split("\n    ---\n    name: a\n    ---\n").unwrap_err();
        assert_eq!((p.line, p.column), (2, 5));
        assert!(p.message.contains("must be the first line"));
    }

    #[test]
    fn unclosed() {
        let p = split("---\nname: a\ndescription: b\n").unwrap_err();
        assert_eq!((p.line, p.column), (1, 1));
        assert!(p.message.contains("never closed"));
    }
}
