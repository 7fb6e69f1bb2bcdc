//! Skills, as Claude Code lays them out: `<dir>/skills/<name>/SKILL.md`, a Markdown file with
//! frontmatter `name` and `description` and the skill's instructions as its body. A
//! definition's `skills` preloads them: each named skill's text goes into the agent's first
//! message ("Chapter 9: Sub-Agents and the Fork Pattern — 9.6": skill preloading at the
//! agent's start). A host loads them once ([`Skills::load`]) and puts them in the agent tree
//! (`AgentBuilder::extension`); a name no loaded skill has is a warning when the agent is
//! built, never a silent skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{DefinitionSource, Diagnostic, parse_agent_markdown};

/// One skill.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skill {
    /// Its name (the frontmatter's `name`).
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Its instructions (the Markdown body).
    pub body: String,
    /// The file it came from.
    pub path: PathBuf,
}

impl Skill {
    /// The text an agent that preloads it starts with.
    pub fn context(&self) -> String {
        format!(
            "<skill name=\"{}\">\n{}\n</skill>",
            self.name.replace(['"', '<', '>', '&'], "_"),
            self.body.replace("</skill", "<\\/skill")
        )
    }
}

/// The skills a host loaded, by name.
#[derive(Debug, Clone, Default)]
pub struct Skills {
    by_name: BTreeMap<String, Skill>,
}

impl Skills {
    /// The skills under each of `roots` (`<root>/skills/<name>/SKILL.md`; a root without a
    /// `skills` directory has none), and what could not be read. A later root's skill of the
    /// same name wins (list the user's directory before the project's). A skill file that is
    /// not a valid definition-style Markdown file is a diagnostic naming its line.
    pub fn load(roots: &[PathBuf]) -> (Skills, Vec<Diagnostic>) {
        let mut skills = Skills::default();
        let mut problems = Vec::new();
        for root in roots {
            let dir = root.join("skills");
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path().join("SKILL.md")))
                .collect();
            paths.sort();
            for path in paths {
                // Followed if it is a link (a skill shared by linking it is common); a
                // directory with no SKILL.md is not a skill; anything else that is not a
                // regular file is never opened (a FIFO would block the read for ever) and is
                // said, not passed over — the agent that preloads it is warned of a missing
                // skill, and this says why.
                match std::fs::metadata(&path) {
                    Ok(meta) if meta.is_file() => {}
                    Ok(_) => {
                        problems.push(Diagnostic::new(
                            &path,
                            1,
                            1,
                            "not a regular file (a FIFO, a device, a socket or a directory), so \
                             it was not read; a skill is a Markdown file",
                        ));
                        continue;
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => {
                        problems.push(Diagnostic::new(
                            &path,
                            0,
                            0,
                            format!("cannot read the skill: {e}"),
                        ));
                        continue;
                    }
                }
                match Self::read(&path) {
                    Ok(skill) => {
                        skills.by_name.insert(skill.name.clone(), skill);
                    }
                    Err(d) => problems.push(d),
                }
            }
        }
        (skills, problems)
    }

    fn read(path: &Path) -> Result<Skill, Diagnostic> {
        let bytes = super::loader::read_capped(path)
            .map_err(|e| Diagnostic::new(path, 0, 0, format!("cannot read the skill: {e}")))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Diagnostic::new(path, 0, 0, "cannot read the skill: it is not UTF-8"))?;
        let parsed = parse_agent_markdown(path, &text, DefinitionSource::Project)
            .map_err(|e| Diagnostic::new(path, 0, 0, format!("not a skill file: {e}")))?;
        let d = parsed.definition;
        Ok(Skill {
            name: d.name,
            description: d.description,
            body: d.system_prompt,
            path: path.to_owned(),
        })
    }

    /// Skills made in code.
    pub fn of(skills: impl IntoIterator<Item = Skill>) -> Self {
        Self {
            by_name: skills.into_iter().map(|s| (s.name.clone(), s)).collect(),
        }
    }

    /// The skill named `name`.
    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.by_name.get(name)
    }

    /// Every skill, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Skill> {
        self.by_name.values()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

impl Skill {
    /// A skill made in code.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            body: body.into(),
            path: PathBuf::new(),
        }
    }
}
