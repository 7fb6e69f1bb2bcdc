//! The merged view of every definition: one per name, chosen by priority.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Serialize, Serializer};

use super::builtin::builtin_definitions;
use super::diagnostic::{Diagnostic, FileReport, FileStatus, LoadReport};
use super::{AgentDefinition, DefinitionSource};

/// Where a definition came from: its source and, unless it is built in, its file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct DefinitionOrigin {
    /// The source.
    pub source: DefinitionSource,
    /// The file; `None` for built-ins and definitions made in code.
    #[serde(serialize_with = "path_lossy")]
    pub path: Option<PathBuf>,
}

impl fmt::Display for DefinitionOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{} {}", self.source, path.display()),
            None => write!(f, "{}", self.source),
        }
    }
}

fn path_lossy<S: Serializer>(path: &Option<PathBuf>, serializer: S) -> Result<S::Ok, S::Error> {
    match path {
        Some(p) => serializer.serialize_some(&p.to_string_lossy()),
        None => serializer.serialize_none(),
    }
}

/// A definition that lost to another with the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shadowed {
    /// The agent name both definitions share.
    pub name: String,
    /// The definition in the registry.
    pub winner: DefinitionOrigin,
    /// The definition it overrode, which is not used.
    pub overridden: DefinitionOrigin,
}

impl fmt::Display for Shadowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} overrides {}",
            self.name, self.winner, self.overridden
        )
    }
}

/// Every agent a host can start, one definition per name, plus what loading them reported.
///
/// # Which definition wins
///
/// Definitions with the same name (compared exactly, case-sensitively) are ordered by
/// 1. source: built-in < host < plugin < user < project < flag < policy;
/// 2. within one source, the depth of the file's path (its number of components): the deeper
///    directory wins, as a project's nested `.claude/agents` overrides an outer one;
/// 3. at equal depth, the path itself: the lexicographically last path wins;
/// 4. definitions without a path (made in code) keep their input order: the later one wins.
///
/// The greatest wins; every other one is listed in [`shadowed`](Self::shadowed). The order
/// the files or directories were given in never matters, so the result is the same on every
/// run.
///
/// `AgentRegistry::default()` is empty: it has no built-in agents (`general-purpose`,
/// `Explore`, `Plan`…). Start from [`builtin`](Self::builtin) to keep them, as
/// `AgentToolConfig::default()` does.
#[derive(Debug, Clone, Default)]
pub struct AgentRegistry {
    agents: BTreeMap<String, Arc<AgentDefinition>>,
    shadowed: Vec<Shadowed>,
    warnings: Vec<Diagnostic>,
    errors: Vec<Diagnostic>,
    files: Vec<FileReport>,
}

impl AgentRegistry {
    /// The built-in agents only.
    pub fn builtin() -> Self {
        AgentRegistry::from_definitions(builtin_definitions())
    }

    /// Merges `definitions` by priority (see the type's documentation); no built-ins are
    /// added.
    pub fn from_definitions(definitions: impl IntoIterator<Item = AgentDefinition>) -> Self {
        AgentRegistry::from_parts(definitions.into_iter().collect(), LoadReport::new())
    }

    /// The built-ins merged with a report's definitions; the report's warnings, errors and
    /// file list are kept.
    pub fn from_report(report: LoadReport) -> Self {
        AgentRegistry::from_parts(builtin_definitions(), report)
    }

    pub(crate) fn from_parts(mut all: Vec<AgentDefinition>, report: LoadReport) -> Self {
        all.extend(report.definitions);
        // A stable sort: equal keys keep their input order, so the later one wins.
        all.sort_by(|a, b| a.priority_key().cmp(&b.priority_key()));
        let mut by_name: BTreeMap<String, Vec<AgentDefinition>> = BTreeMap::new();
        for def in all {
            by_name.entry(def.name.clone()).or_default().push(def);
        }
        let mut agents = BTreeMap::new();
        let mut shadowed = Vec::new();
        for (name, mut defs) in by_name {
            let Some(winner) = defs.pop() else { continue };
            for loser in &defs {
                shadowed.push(Shadowed {
                    name: name.clone(),
                    winner: winner.origin(),
                    overridden: loser.origin(),
                });
            }
            agents.insert(name, Arc::new(winner));
        }
        AgentRegistry {
            agents,
            shadowed,
            warnings: report.warnings,
            errors: report.errors,
            files: report.files,
        }
    }

    /// Adds one definition — most often an agent the host defines in code, with
    /// [`DefinitionSource::Host`] — by the same priority rule as the rest: it replaces a
    /// definition of that name it outranks (or ties, being later), and is itself listed in
    /// [`shadowed`](Self::shadowed) when one already there outranks it. Returns the record of
    /// whichever lost, if there was a contest.
    ///
    /// ```
    /// use forkhive_spawn::definition::{AgentDefinition, AgentRegistry, DefinitionSource};
    /// let mut registry = AgentRegistry::builtin();
    /// let mut reviewer = AgentDefinition::new("reviewer", "Reviews a diff", DefinitionSource::Host);
    /// reviewer.system_prompt = "You review diffs for bugs.".into();
    /// assert!(registry.insert(reviewer).is_none());
    /// assert_eq!(registry.get("reviewer").unwrap().source, DefinitionSource::Host);
    /// ```
    pub fn insert(&mut self, definition: AgentDefinition) -> Option<Shadowed> {
        let name = definition.name.clone();
        let contest = match self.agents.get(&name) {
            None => None,
            Some(old) if definition.priority_key() >= old.priority_key() => Some(Shadowed {
                name: name.clone(),
                winner: definition.origin(),
                overridden: old.origin(),
            }),
            Some(old) => {
                let lost = Shadowed {
                    name,
                    winner: old.origin(),
                    overridden: definition.origin(),
                };
                tracing::warn!("the inserted agent definition is overridden: {lost}");
                self.shadowed.push(lost.clone());
                return Some(lost);
            }
        };
        if let Some(s) = &contest {
            self.shadowed.push(s.clone());
        }
        self.agents.insert(name, Arc::new(definition));
        contest
    }

    /// The definition named `name` (exact, case-sensitive match).
    pub fn get(&self, name: &str) -> Option<&AgentDefinition> {
        self.agents.get(name).map(|d| &**d)
    }

    /// The definition named `name`, shared: cloning it copies a pointer, which is what a
    /// spawn hands each child (see [`AgentBuilder::definition`](crate::runtime::AgentBuilder::definition)).
    pub fn get_shared(&self, name: &str) -> Option<&Arc<AgentDefinition>> {
        self.agents.get(name)
    }

    /// Every definition, sorted by name (byte order: `Explore` before `code-reviewer`).
    pub fn list(&self) -> Vec<&AgentDefinition> {
        self.agents.values().map(|d| &**d).collect()
    }

    /// Every name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// How many agents there are.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether there are no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Which definitions were overridden and by which, sorted by name, then from the
    /// lowest-priority loser up.
    pub fn shadowed(&self) -> &[Shadowed] {
        &self.shadowed
    }

    /// Warnings from loading, in file order.
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
    }

    /// Errors from loading: one per rejected file, in file order.
    pub fn errors(&self) -> &[Diagnostic] {
        &self.errors
    }

    /// Every file that was looked at and what became of it.
    pub fn files(&self) -> &[FileReport] {
        &self.files
    }

    /// How many files ended with `status`.
    pub fn count(&self, status: FileStatus) -> usize {
        self.files.iter().filter(|f| f.status == status).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn def(name: &str, source: DefinitionSource, path: Option<&str>) -> AgentDefinition {
        let mut d = AgentDefinition::new(name, format!("{source}"), source);
        d.path = path.map(PathBuf::from);
        d
    }

    /// A host's agent in code outranks a built-in of its name and yields to a project file
    /// of its name, whichever is inserted first; each contest is listed.
    #[test]
    fn insert_follows_the_priority_order() {
        let mut r = AgentRegistry::builtin();
        let host = def("general-purpose", DefinitionSource::Host, None);
        let lost = r.insert(host).unwrap();
        assert_eq!(lost.to_string(), "general-purpose: host overrides built-in");
        assert_eq!(
            r.get("general-purpose").unwrap().source,
            DefinitionSource::Host
        );

        let mut r =
            AgentRegistry::from_definitions([def("x", DefinitionSource::Project, Some("/r/x.md"))]);
        let lost = r.insert(def("x", DefinitionSource::Host, None)).unwrap();
        assert_eq!(lost.to_string(), "x: project /r/x.md overrides host");
        assert_eq!(r.get("x").unwrap().source, DefinitionSource::Project);
        assert!(r.insert(def("y", DefinitionSource::Host, None)).is_none());
        assert_eq!(r.shadowed().len(), 1);
        // Merged at once, the same order holds.
        let merged = AgentRegistry::from_definitions([
            def("x", DefinitionSource::Host, None),
            def("x", DefinitionSource::BuiltIn, None),
        ]);
        assert_eq!(merged.get("x").unwrap().source, DefinitionSource::Host);
    }

    #[test]
    fn priority_decides_not_input_order() {
        let defs = vec![
            def("x", DefinitionSource::Policy, Some("/p/x.md")),
            def("x", DefinitionSource::User, Some("/u/x.md")),
            def("x", DefinitionSource::Project, Some("/r/x.md")),
        ];
        for order in [defs.clone(), defs.into_iter().rev().collect()] {
            let r = AgentRegistry::from_definitions(order);
            assert_eq!(r.get("x").unwrap().source, DefinitionSource::Policy);
            let shadowed: Vec<String> = r.shadowed().iter().map(ToString::to_string).collect();
            assert_eq!(
                shadowed,
                [
                    "x: policy /p/x.md overrides user /u/x.md",
                    "x: policy /p/x.md overrides project /r/x.md"
                ]
            );
        }
    }

    #[test]
    fn within_a_source_deeper_then_last_path_wins() {
        let r = AgentRegistry::from_definitions(vec![
            def("x", DefinitionSource::Project, Some("/r/a/b/x.md")),
            def("x", DefinitionSource::Project, Some("/r/z.md")),
            def("y", DefinitionSource::Project, Some("/r/b.md")),
            def("y", DefinitionSource::Project, Some("/r/a.md")),
        ]);
        assert_eq!(
            r.get("x").unwrap().path.as_deref(),
            Some(Path::new("/r/a/b/x.md"))
        );
        assert_eq!(
            r.get("y").unwrap().path.as_deref(),
            Some(Path::new("/r/b.md"))
        );
    }

    #[test]
    fn list_is_sorted_and_builtins_are_there() {
        let r = AgentRegistry::builtin();
        let names: Vec<&str> = r.names().collect();
        assert_eq!(
            names,
            ["Explore", "Plan", "general-purpose", "verification"]
        );
        assert_eq!(r.list().len(), 4);
        assert!(r.get("fork").is_none());
        assert!(r.shadowed().is_empty());
    }

    #[test]
    fn shadowed_serialises_paths_as_strings() {
        let r = AgentRegistry::from_report(LoadReport {
            definitions: vec![def("Plan", DefinitionSource::Flag, Some("f/Plan.md"))],
            ..LoadReport::new()
        });
        assert_eq!(
            serde_json::to_value(r.shadowed()).unwrap(),
            serde_json::json!([{
                "name": "Plan",
                "winner": {"source": "flag", "path": "f/Plan.md"},
                "overridden": {"source": "built-in", "path": null}
            }])
        );
    }
}
