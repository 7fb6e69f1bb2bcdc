//! [`ToolPool`]: the tools of one agent, in a fixed order, with their input validators.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use forkhive_core::ToolDefinition;

use crate::error::{Error, Result};
use crate::tool::Tool;

/// One tool and the compiled validator of its input schema.
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<jsonschema::Validator>,
}

/// The tools an agent may call, in a fixed order.
///
/// The order is part of the prompt-cache key ("Chapter 9: Sub-Agents and the Fork Pattern —
/// CacheSafeParams: Five Dimensions"), so [`definitions`](Self::definitions) always returns the
/// tools in the order they were added. Each tool's input schema is compiled once, when the pool
/// is built; a schema that is not a valid JSON Schema is an error then, not at call time.
/// Cloning is O(1).
#[derive(Clone, Default)]
pub struct ToolPool {
    entries: Arc<[Arc<Entry>]>,
    index: NameIndex,
}

/// Names and aliases to entries, sorted by name: a lookup is a binary search of string
/// comparisons, with no hashing (a tool round looks each call's tool up several times).
#[derive(Clone, Default)]
struct NameIndex(Arc<[(Box<str>, usize)]>);

impl NameIndex {
    fn new(mut names: Vec<(Box<str>, usize)>) -> Self {
        names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self(names.into())
    }

    fn get(&self, name: &str) -> Option<usize> {
        self.0
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| self.0[i].1)
    }
}

/// A [`ToolPool`] held weakly ([`ToolPool::downgrade`]): the pool again while something else
/// keeps it, nothing once it is gone.
#[derive(Clone)]
pub(crate) struct WeakPool {
    entries: std::sync::Weak<[Arc<Entry>]>,
    index: NameIndex,
}

impl WeakPool {
    /// The pool, if it is still alive.
    pub(crate) fn upgrade(&self) -> Option<ToolPool> {
        Some(ToolPool {
            entries: self.entries.upgrade()?,
            index: self.index.clone(),
        })
    }
}

impl std::fmt::Debug for WeakPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakPool")
    }
}

/// Keeps a pool's identity from being reused (a weak reference holds the allocation) while
/// letting its tools go: a cache keyed by identity holds no cycle through the pool's tools.
#[derive(Debug, Clone)]
pub(crate) struct PoolIdentity(#[allow(dead_code)] std::sync::Weak<[Arc<Entry>]>);

impl ToolPool {
    /// A pool of `tools`, in this order.
    ///
    /// Fails with [`Error::Tool`] on a duplicate name or a schema that does not compile.
    pub fn new(tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Result<Self> {
        let mut entries = Vec::new();
        let mut index = Vec::new();
        let mut seen = HashSet::new();
        for tool in tools {
            let def = tool.definition();
            index.push((Box::from(def.name.as_str()), entries.len()));
            if !seen.insert(def.name.clone()) {
                return Err(Error::Tool {
                    name: def.name.clone(),
                    message: "a tool of this name is already in the pool".to_owned(),
                });
            }
            let schema: serde_json::Value =
                def.input_schema.to_value().map_err(|e| Error::Tool {
                    name: def.name.clone(),
                    message: format!("input schema is not JSON: {e}"),
                })?;
            let validator = jsonschema::validator_for(&schema).map_err(|e| Error::Tool {
                name: def.name.clone(),
                message: format!("input schema is not a valid JSON Schema: {e}"),
            })?;
            for alias in tool.aliases() {
                index.push((Box::from(*alias), entries.len()));
                if !seen.insert((*alias).to_owned()) {
                    return Err(Error::Tool {
                        name: (*alias).to_owned(),
                        message: "a tool of this name is already in the pool".to_owned(),
                    });
                }
            }
            entries.push(Arc::new(Entry {
                tool,
                validator: Arc::new(validator),
            }));
        }
        Ok(Self {
            entries: entries.into(),
            index: NameIndex::new(index),
        })
    }

    /// An empty pool.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The tool called `name` (or aliased so).
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.index.get(name).map(|i| &self.entries[i].tool)
    }

    /// Where the tool `name` (or an alias) is in the pool: looked up once per call, then used
    /// with [`tool_at`](Self::tool_at) and [`validate_at`](Self::validate_at).
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name)
    }

    /// The tool at `at`, a [`position`](Self::position) in this pool.
    pub(crate) fn tool_at(&self, at: usize) -> &Arc<dyn Tool> {
        &self.entries[at].tool
    }

    /// The tool definitions, in pool order, as sent to the provider.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.entries
            .iter()
            .map(|e| e.tool.definition().clone())
            .collect()
    }

    /// Which pool this is: equal for a pool and its clones, different for pools built or
    /// filtered separately (valid while a clone or a [`PoolIdentity`] of it is alive).
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.entries).cast::<()>() as usize
    }

    /// Reserves this pool's [`identity`](Self::identity) without keeping its tools alive.
    pub(crate) fn identity_guard(&self) -> PoolIdentity {
        PoolIdentity(Arc::downgrade(&self.entries))
    }

    /// This pool, held without keeping its tools alive.
    pub(crate) fn downgrade(&self) -> WeakPool {
        WeakPool {
            entries: Arc::downgrade(&self.entries),
            index: self.index.clone(),
        }
    }

    /// The tools, in pool order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.entries.iter().map(|e| &e.tool)
    }

    /// The tool names, in pool order.
    pub fn names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .map(|e| e.tool.definition().name.as_str())
            .collect()
    }

    /// How many tools there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new pool of these tools and then `more` (this pool is unchanged); a name already here
    /// is an error, as in [`new`](Self::new).
    pub fn with(&self, more: impl IntoIterator<Item = Arc<dyn Tool>>) -> Result<Self> {
        Self::new(self.entries.iter().map(|e| Arc::clone(&e.tool)).chain(more))
    }

    /// A new pool of the tools `keep` accepts, in the same relative order (this pool is
    /// unchanged).
    #[must_use]
    pub fn filtered(&self, mut keep: impl FnMut(&dyn Tool) -> bool) -> Self {
        // Reuses the compiled validators: filtering a pool per child costs no schema work.
        let kept: Vec<Arc<Entry>> = self
            .entries
            .iter()
            .filter(|e| keep(e.tool.as_ref()))
            .cloned()
            .collect();
        let mut index = Vec::with_capacity(kept.len());
        for (i, e) in kept.iter().enumerate() {
            index.push((Box::from(e.tool.definition().name.as_str()), i));
            for alias in e.tool.aliases() {
                index.push((Box::from(*alias), i));
            }
        }
        Self {
            entries: kept.into(),
            index: NameIndex::new(index),
        }
    }

    /// The same tools, each working in `root` where it can ([`Tool::rooted`]); read-only
    /// tools that cannot move stay as they are. For a worker in its own git worktree.
    ///
    /// A tool that changes things but cannot move is an [`Error::Tool`]: it would write in
    /// the shared checkout while the worker seemed isolated.
    pub async fn rooted(&self, root: &std::path::Path) -> Result<Self> {
        let mut tools = Vec::with_capacity(self.entries.len());
        for e in self.entries.iter() {
            tools.push(match e.tool.rooted(root).await {
                Some(t) => t,
                None if e.tool.is_read_only() => Arc::clone(&e.tool),
                None => {
                    return Err(Error::Tool {
                        name: e.tool.definition().name.clone(),
                        message: "it changes things but cannot work in a worktree (it does \
                                  not implement `Tool::rooted`)"
                            .to_owned(),
                    });
                }
            });
        }
        Self::new(tools)
    }

    /// Checks `input` against the schema of the tool at `name`.
    ///
    /// `Ok(())` when it conforms (or there is no such tool); otherwise
    /// [`Error::InvalidInput`] with every violation, as `at <JSON pointer>: <what is wrong>`
    /// (the root is `at /`).
    pub fn validate(&self, name: &str, input: &serde_json::Value) -> Result<()> {
        match self.index.get(name) {
            Some(at) => self.validate_at(at, name, input),
            None => Ok(()),
        }
    }

    /// [`validate`](Self::validate) for the tool at `at`, a [`position`](Self::position) in
    /// this pool (`name` is what the call named it, for the error).
    pub(crate) fn validate_at(
        &self,
        at: usize,
        name: &str,
        input: &serde_json::Value,
    ) -> Result<()> {
        let validator = &self.entries[at].validator;
        // The common case, a valid input, allocates nothing.
        if validator.is_valid(input) {
            return Ok(());
        }
        let problems: Vec<String> = validator
            .iter_errors(input)
            .map(|e| {
                let at = e.instance_path().as_str();
                let at = if at.is_empty() { "/" } else { at };
                format!("at {at}: {e}")
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInput {
                tool: name.to_owned(),
                problems,
            })
        }
    }
}

impl fmt::Debug for ToolPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::test_tools::Fixed;

    #[test]
    fn keeps_order_and_rejects_duplicates_and_bad_schemas() {
        let pool = ToolPool::new([Fixed::arc("B", "b"), Fixed::arc("A", "a")]).unwrap();
        assert_eq!(pool.names(), ["B", "A"]);
        let iterated: Vec<&str> = pool.iter().map(|t| t.definition().name.as_str()).collect();
        assert_eq!(iterated, ["B", "A"]);
        assert_eq!(pool.definitions()[1].name, "A");

        let dup = ToolPool::new([Fixed::arc("A", "a"), Fixed::arc("A", "b")]).unwrap_err();
        assert_eq!(
            dup.to_string(),
            "tool \"A\": a tool of this name is already in the pool"
        );

        let bad = ToolPool::new([Fixed::with_schema("Bad", r#"{"type":"no-such-type"}"#)])
            .unwrap_err()
            .to_string();
        assert!(
            bad.starts_with("tool \"Bad\": input schema is not a valid JSON Schema: "),
            "{bad}"
        );
    }

    #[test]
    fn validation_names_the_path_and_the_problem() {
        let pool = ToolPool::new([Fixed::with_schema(
            "T",
            r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["path"]}"#,
        )])
        .unwrap();
        let Err(Error::InvalidInput { tool, problems }) =
            pool.validate("T", &serde_json::json!({"n": "x"}))
        else {
            panic!("invalid input accepted")
        };
        assert_eq!(tool, "T");
        assert_eq!(
            problems,
            [
                "at /: \"path\" is a required property",
                "at /n: \"x\" is not of type \"integer\""
            ]
        );
        assert!(pool.validate("T", &serde_json::json!({"path": 1})).is_ok());
    }

    #[test]
    fn retain_keeps_relative_order() {
        let pool = ToolPool::new([
            Fixed::arc("A", "a"),
            Fixed::arc("B", "b"),
            Fixed::arc("C", "c"),
        ])
        .unwrap();
        assert_eq!(
            pool.filtered(|t| t.definition().name != "B").names(),
            ["A", "C"]
        );
    }
}
