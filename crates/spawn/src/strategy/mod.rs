//! Spawn strategies: how a child agent is made. [`Subagent`] starts a fresh conversation from
//! an agent definition; [`Fork`] continues the parent's conversation byte for byte so the
//! child reads the parent's prompt cache. Coordinator workers and teammates plug in here too.
//!
//! A strategy only *builds* the child; the Agent tool decides foreground or background, holds
//! the capacity slot and reports the result.

pub mod side;

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::fork::{FORK_DIRECTIVE_PREFIX, build_child_message};
use forkhive_core::{CacheSafeParams, ContentBlock, ForkPrefix, Message, TaskId};

use crate::definition::{
    AgentDefinition, AgentRegistry, FORK_MAX_TURNS, GENERAL_PURPOSE_AGENT, fork_definition,
};
use crate::error::{Error, Result};
use crate::runtime::{Agent, AgentKind, AgentShared, Limits, QuerySource, TurnSnapshot};
use crate::task::{ChildSink, FirstInput, Gate, Progress};
use crate::tool::{ToolAudience, ToolFilter, ToolPool};

pub use side::{
    SideAnswer, Verdict, Verification, VerifyOptions, side_question, verify, verify_with,
};

/// The most heads a [`HeadCache`] keeps; past that it starts again empty.
const HEAD_CACHE_LIMIT: usize = 256;

/// Rendered subagent heads — system prompt, tool array, contexts and their fingerprints,
/// with the filtered tool pool — shared by every child of one definition and model, in the
/// foreground or the background, drawn from one tool pool. A child built from a cached head
/// costs no rendering and no hashing, and its conversation shares the head's memory.
///
/// One cache belongs to one Agent tool, whose registry, filter and subagent context are
/// fixed; a head keeps a weak reference to its source pool, so the pool's identity cannot be
/// reused while its entry exists, and the pool (which may hold the Agent tool itself) is not
/// kept alive by its own cache.
// A list, searched in order: it holds a head per definition and model in use (a few), and a
// lookup compares the child's own strings with no key built and nothing hashed.
#[derive(Debug, Default)]
pub struct HeadCache {
    heads: Mutex<Vec<(HeadKey, Head)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HeadKey {
    definition: String,
    model: String,
    background: bool,
    /// A teammate's tools are filtered for teammates (the team tools too).
    teammate: bool,
    pool: usize,
}

/// A [`HeadKey`] of borrowed strings, to look one up with.
#[derive(Clone, Copy)]
struct HeadKeyRef<'a> {
    definition: &'a str,
    model: &'a str,
    background: bool,
    teammate: bool,
    pool: usize,
}

impl HeadKeyRef<'_> {
    fn matches(&self, k: &HeadKey) -> bool {
        k.pool == self.pool
            && k.background == self.background
            && k.teammate == self.teammate
            && k.definition == self.definition
            && k.model == self.model
    }

    fn owned(self) -> HeadKey {
        HeadKey {
            definition: self.definition.to_owned(),
            model: self.model.to_owned(),
            background: self.background,
            teammate: self.teammate,
            pool: self.pool,
        }
    }
}

#[derive(Debug, Clone)]
struct Head {
    params: CacheSafeParams,
    pool: HeadPool,
    /// Reserves the source pool's identity (weakly: the pool may hold this very Agent tool).
    _source: crate::tool::pool::PoolIdentity,
}

/// A head's filtered tool pool: held weakly when it holds an `Agent` tool (nesting), which
/// may be the very tool whose cache holds the head — a cycle that kept every pool built with
/// it (and what its host tools hold) alive for good. The weak head serves while a child
/// built from it keeps the pool; after that, the next child renders a head again.
#[derive(Debug, Clone)]
enum HeadPool {
    Held(ToolPool),
    Weak(crate::tool::pool::WeakPool),
}

impl HeadPool {
    fn of(pool: &ToolPool) -> Self {
        // The Agent tool's name (the tool itself is a layer above this one).
        if pool.iter().any(|t| t.definition().name == "Agent") {
            Self::Weak(pool.downgrade())
        } else {
            Self::Held(pool.clone())
        }
    }

    fn get(&self) -> Option<ToolPool> {
        match self {
            Self::Held(p) => Some(p.clone()),
            Self::Weak(w) => w.upgrade(),
        }
    }
}

impl HeadCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many heads it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(HeadKey, Head)>> {
        self.heads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The head for `key` and its pool, unless there is none or its pool is gone.
    fn get(&self, key: HeadKeyRef<'_>) -> Option<(Head, ToolPool)> {
        let heads = self.lock();
        heads
            .iter()
            .find(|(k, _)| key.matches(k))
            .and_then(|(_, h)| Some((h.clone(), h.pool.get()?)))
    }

    fn put(&self, key: HeadKey, head: Head) {
        let mut heads = self.lock();
        if let Some((_, h)) = heads.iter_mut().find(|(k, _)| *k == key) {
            *h = head;
            return;
        }
        if heads.len() >= HEAD_CACHE_LIMIT {
            heads.clear();
        }
        heads.push((key, head));
    }
}

/// What the model asked for, parsed from the Agent tool's input.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
pub struct AgentInput {
    /// A short (3–5 word) description of the task.
    pub description: String,
    /// The task.
    pub prompt: String,
    /// The agent type (omitted: fork when fork mode is on, else `general-purpose`).
    #[serde(default)]
    pub subagent_type: Option<String>,
    /// A model override.
    #[serde(default)]
    pub model: Option<String>,
    /// Run in the background.
    #[serde(default)]
    pub run_in_background: Option<bool>,
    /// A teammate's name.
    #[serde(default)]
    pub name: Option<String>,
    /// A team's name.
    #[serde(default)]
    pub team_name: Option<String>,
    /// A permission mode for a teammate.
    #[serde(default)]
    pub mode: Option<String>,
    /// `worktree` isolation.
    #[serde(default)]
    pub isolation: Option<String>,
    /// A directory to run the agent in (see [`AgentToolConfig::cwd_root`](crate::agent_tool::AgentToolConfig::cwd_root)).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// How a fork child's message is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForkLayout {
    /// The boilerplate is its own text block before the directive block, and the child's
    /// first request carries a cache breakpoint on it: every sibling after the first reads
    /// the boilerplate from the cache.
    #[default]
    SplitBlocks,
    /// The write-ups' layout: boilerplate and directive in one text block, so each child pays
    /// for the boilerplate uncached ("Fork Mechanism — buildForkedMessages").
    SingleBlock,
}

/// Everything a strategy may use to build a child.
#[derive(Debug)]
pub struct SpawnContext<'a> {
    /// The calling agent (its backend, tools, policy and settings: see the accessors).
    pub(crate) caller: &'a AgentShared,
    /// The calling turn.
    pub turn: &'a Arc<TurnSnapshot>,
    /// A restriction of the child's own, asked before the caller's policy (a teammate's
    /// `mode`).
    pub(crate) policy: Option<Arc<dyn crate::tool::PermissionPolicy>>,
    /// The definitions subagents come from.
    pub registry: &'a AgentRegistry,
    /// Tools for fresh subagents (default: the caller's).
    pub subagent_tools: Option<&'a ToolPool>,
    /// Filtering layers 1 and 2.
    pub filter: &'a Arc<ToolFilter>,
    /// Subagent heads already rendered by this Agent tool.
    pub heads: &'a HeadCache,
    /// Limits of children.
    pub child_limits: &'a Limits,
    /// User context entries a fresh subagent gets (`claudeMd`, `cwd`, ...).
    pub user_context: &'a [(String, String)],
    /// The fork layout.
    pub fork_layout: ForkLayout,
    /// How long fork siblings wait for the first sibling's answer to start (`None`: they
    /// all start at once).
    pub warm_fanout: Option<Duration>,
    /// The child's progress, fed by its event sink.
    pub progress: Arc<Progress>,
    /// The child's output file.
    pub output: Option<Arc<crate::task::OutputFile>>,
    /// The child's task id (drawn by the caller, which names files after it).
    pub child_id: TaskId,
    /// Whether the child is a teammate (`name` and `team_name`): its kind is
    /// [`AgentKind::Teammate`], which its backend reads through its context.
    pub(crate) teammate: bool,
}

impl SpawnContext<'_> {
    /// The calling agent's identity.
    pub fn caller_context(&self) -> &Arc<crate::runtime::AgentContext> {
        &self.caller.cx
    }

    /// The calling agent's backend (a child talks to the same model service).
    pub fn backend(&self) -> &Arc<dyn forkhive_transport::Backend> {
        &self.caller.backend
    }

    /// The calling agent's tools, after its filtering.
    pub fn tools(&self) -> &ToolPool {
        &self.caller.pool
    }

    /// The calling agent's permission policy (a child's `bubble` mode asks it).
    pub fn policy(&self) -> &Arc<dyn crate::tool::PermissionPolicy> {
        &self.caller.policy
    }

    /// The calling agent's per-request settings.
    pub fn settings(&self) -> &forkhive_transport::RequestSettings {
        &self.caller.settings
    }

    /// Where the calling agent writes its transcript (a child writes its own beside it).
    pub fn transcript_dir(&self) -> Option<&std::path::Path> {
        self.caller.transcript_dir.as_deref()
    }

    /// What the child starts from: its identity (with this context's `child_id`), a copy of
    /// the caller's state, the tree, a linked cancellation token.
    pub fn child_seed(
        &self,
        kind: crate::runtime::AgentKind,
        source: crate::runtime::QuerySource,
    ) -> crate::runtime::ChildSeed {
        self.caller.child_seed(self.child_id, kind, source)
    }
}

/// A built child, ready to run.
#[derive(Debug)]
pub struct PreparedChild {
    /// The child.
    pub agent: Agent,
    /// How to start it.
    pub first: FirstInput,
    /// Whether the strategy insists on the background (forks do).
    pub force_background: bool,
    /// Whether the definition asks for the background.
    pub definition_background: bool,
    /// Work to await before the child starts.
    pub gate: Option<Gate>,
}

/// Builds children. Object-safe.
#[async_trait]
pub trait SpawnStrategy: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs (`subagent`, `fork`).
    fn name(&self) -> &'static str;

    /// Builds the child for `input`, or refuses with a message for the model.
    async fn prepare(
        &self,
        input: &AgentInput,
        cx: SpawnContext<'_>,
        background: bool,
    ) -> Result<PreparedChild>;
}

fn sink(cx: &SpawnContext<'_>) -> Arc<ChildSink> {
    Arc::new(ChildSink {
        child: cx.child_id,
        progress: Arc::clone(&cx.progress),
        output: cx.output.clone(),
        forward: cx.caller.events.clone(),
    })
}

/// A fresh sub-agent from a definition ("Chapter 20 — 20.2 Mode One: Standard Subagent").
#[derive(Debug, Clone, Copy, Default)]
pub struct Subagent;

impl Subagent {
    /// The definition for `input`'s type (default `general-purpose`).
    pub fn definition<'a>(
        registry: &'a AgentRegistry,
        input: &AgentInput,
    ) -> Result<&'a Arc<AgentDefinition>> {
        let ty = input
            .subagent_type
            .as_deref()
            .unwrap_or(GENERAL_PURPOSE_AGENT);
        registry.get_shared(ty).ok_or_else(|| Error::UnknownAgent {
            name: ty.to_owned(),
            available: registry.names().map(str::to_owned).collect(),
        })
    }
}

#[async_trait]
impl SpawnStrategy for Subagent {
    fn name(&self) -> &'static str {
        "subagent"
    }

    async fn prepare(
        &self,
        input: &AgentInput,
        cx: SpawnContext<'_>,
        background: bool,
    ) -> Result<PreparedChild> {
        let mut def = Arc::clone(Self::definition(cx.registry, input)?);
        // The call's model (checked against the host's allow list by the Agent tool) wins over
        // the definition's own, which wins over the caller's.
        let asked = input
            .model
            .as_deref()
            .filter(|m| *m != crate::definition::MODEL_INHERIT);
        if let Some(m) = asked
            && def.model.as_deref() != Some(m)
        {
            let mut own = (*def).clone();
            own.model = Some(m.to_owned());
            def = Arc::new(own);
        }
        // A teammate keeps the team's tool whatever its definition's allow list says: without
        // `SendMessage` it could not answer its lead ("Claude Code Multi-Agent Internals — 6.4
        // Teammates get team-aware prompts and tool injection").
        if input.team_name.is_some()
            && input.name.is_some()
            && let Some(allowed) = &def.tools
            && !allowed.iter().any(|t| {
                t == crate::base::pending::SEND_MESSAGE || t == crate::definition::ALL_TOOLS
            })
        {
            let mut own = (*def).clone();
            if let Some(tools) = own.tools.as_mut() {
                tools.push(crate::base::pending::SEND_MESSAGE.to_owned());
            }
            def = Arc::new(own);
        }
        let source = if def.source == crate::definition::DefinitionSource::BuiltIn {
            QuerySource::builtin(&def.name)
        } else {
            QuerySource::custom(&def.name)
        };
        let mut seed = cx.caller.child_seed(
            cx.child_id,
            if cx.teammate {
                AgentKind::Teammate
            } else {
                AgentKind::Subagent
            },
            source,
        );
        seed.context = seed.context.with_agent_type(def.name.clone());
        let model = def
            .model
            .clone()
            .filter(|m| m != crate::definition::MODEL_INHERIT)
            .unwrap_or_else(|| cx.turn.sent().model().to_owned());
        let definition_background = def.background;
        let source = cx
            .subagent_tools
            .cloned()
            .unwrap_or_else(|| cx.caller.pool.clone());
        let lookup = HeadKeyRef {
            definition: &def.name,
            model: &model,
            background,
            teammate: cx.teammate,
            pool: source.identity(),
        };
        // A definition that starts MCP servers of its own is built afresh each time: each of
        // its agents connects its own servers and closes them when it ends (Agent definitions,
        // §9.6), which a head shared through the cache would keep open for its siblings.
        let cacheable = !def.defines_mcp_servers();
        let cached = if cacheable {
            cx.heads.get(lookup)
        } else {
            None
        };
        // The key of a head built now, owned only then.
        let key = (cacheable && cached.is_none()).then(|| lookup.owned());
        let mut b = Agent::builder(Arc::clone(&cx.caller.backend))
            .model(model)
            .definition(def)
            .tool_filter(Arc::clone(cx.filter))
            .audience(if cx.teammate {
                ToolAudience::Teammate
            } else if background {
                ToolAudience::Background
            } else {
                ToolAudience::Foreground
            })
            .policy(Arc::clone(&cx.caller.policy))
            .restrict(cx.policy.clone())
            .limits(cx.child_limits.clone())
            .settings(cx.caller.settings.clone())
            .child_of(seed)
            .events(sink(&cx));
        match &cached {
            Some((head, pool)) => b = b.params(head.params.clone()).tools(pool.clone()),
            None => {
                b = b.tools(source.clone());
                for (k, v) in cx.user_context {
                    b = b.user_context(k.clone(), v.clone());
                }
            }
        }
        if let Some(dir) = &cx.caller.transcript_dir {
            b = b.transcript_dir(dir.clone());
        }
        let agent = b.build().await.map_err(|e| Error::Start {
            what: "agent",
            source: Box::new(e),
        })?;
        if let Some(key) = key {
            cx.heads.put(
                key,
                Head {
                    params: agent.params().clone(),
                    pool: HeadPool::of(agent.tools()),
                    _source: source.identity_guard(),
                },
            );
        }
        Ok(PreparedChild {
            agent,
            first: FirstInput::Prompt(input.prompt.clone()),
            force_background: false,
            definition_background,
            gate: None,
        })
    }
}

/// What the forks of one assistant turn share: one [`ForkPrefix`], the conversation they all
/// start from, and the cache-warm gate.
struct ForkTurn {
    prefix: Option<ForkPrefix>,
    base: CacheSafeParams,
    leader: OnceLock<Arc<Progress>>,
}

/// A fork child: the parent's conversation byte for byte, plus its directive
/// ("Fork Mechanism"; "Chapter 9 — 9.3 Fork Pattern: Cache-Safe Parallel Execution").
#[derive(Debug, Clone, Copy, Default)]
pub struct Fork;

/// The refusal a fork child gets when it calls the Agent tool ("Chapter 20 — 20.2 Mode Two:
/// Recursive Fork Protection").
pub const FORK_REFUSAL: &str = "Fork is not available inside a forked worker. You are a fork: \
do the work directly with your own tools and report back.";

/// The boilerplate block of the split layout: the child message without
/// `fork-directive: …`.
fn boilerplate_block() -> String {
    let whole = build_child_message("");
    whole
        .strip_suffix(FORK_DIRECTIVE_PREFIX)
        .unwrap_or(&whole)
        .trim_end()
        .to_owned()
}

impl Fork {
    /// The child's user message: a placeholder result per `tool_use` of the parent's turn,
    /// then the boilerplate and the directive (one block or two).
    pub fn child_message(
        placeholders: &[ContentBlock],
        directive: &str,
        layout: ForkLayout,
    ) -> Message {
        let mut content = Vec::with_capacity(placeholders.len() + 2);
        content.extend_from_slice(placeholders);
        match layout {
            ForkLayout::SingleBlock => {
                content.push(ContentBlock::text(build_child_message(directive)))
            }
            _ => {
                static BOILERPLATE: OnceLock<String> = OnceLock::new();
                content.push(ContentBlock::text(
                    BOILERPLATE.get_or_init(boilerplate_block).clone(),
                ));
                content.push(ContentBlock::text(format!(
                    "{FORK_DIRECTIVE_PREFIX}{directive}"
                )));
            }
        }
        Message::user(content)
    }
}

#[async_trait]
impl SpawnStrategy for Fork {
    fn name(&self) -> &'static str {
        "fork"
    }

    async fn prepare(
        &self,
        input: &AgentInput,
        cx: SpawnContext<'_>,
        _background: bool,
    ) -> Result<PreparedChild> {
        let turn = cx.turn.scratch().get_or_insert_with(|| ForkTurn {
            prefix: ForkPrefix::new(cx.turn.sent().clone(), cx.turn.assistant().clone()).ok(),
            base: cx.turn.sent().append(vec![cx.turn.assistant().clone()]),
            leader: OnceLock::new(),
        });
        let prefix = turn.prefix.as_ref().ok_or_else(|| {
            Error::Refused("internal: the forking turn is not an assistant message".to_owned())
        })?;
        let message =
            Self::child_message(prefix.placeholder_results(), &input.prompt, cx.fork_layout);
        let seed = cx
            .caller
            .child_seed(cx.child_id, AgentKind::Fork, QuerySource::fork());
        let limits = Limits {
            max_turns: Some(FORK_MAX_TURNS),
            ..cx.child_limits.clone()
        };
        // The parent's exact tools and already rendered prefix: never re-rendered.
        let mut b = Agent::builder(Arc::clone(&cx.caller.backend))
            .params(turn.base.clone())
            .tools(cx.caller.pool.clone())
            .definition(fork_definition())
            .policy(Arc::clone(&cx.caller.policy))
            .restrict(cx.policy.clone())
            .limits(limits)
            .settings(cx.caller.settings.clone())
            .child_of(seed)
            .expect_prefix(cx.turn.sent().fingerprint().clone())
            .first_request_suffix(vec![message])
            .events(sink(&cx));
        if let Some(dir) = &cx.caller.transcript_dir {
            // The parent's history is in the parent's transcript beside this one: the child's
            // refers to it instead of copying it (O(directive), not O(history)).
            b = b
                .transcript_dir(dir.clone())
                .inherit_transcript(turn.base.messages().len());
        }
        let agent = b.build().await.map_err(|e| Error::Start {
            what: "fork",
            source: Box::new(e),
        })?;
        let gate = match cx.warm_fanout {
            Some(wait) => {
                let mine = Arc::clone(&cx.progress);
                let leader = Arc::clone(turn.leader.get_or_init(|| Arc::clone(&mine)));
                (!Arc::ptr_eq(&leader, &mine)).then(|| {
                    Gate::new(async move {
                        let _ = tokio::time::timeout(wait, leader.responding()).await;
                    })
                })
            }
            None => None,
        };
        Ok(PreparedChild {
            agent,
            first: FirstInput::Continue,
            force_background: true,
            definition_background: true,
            gate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(model: &str, pool: &ToolPool) -> Head {
        Head {
            params: CacheSafeParams::builder(model).build(),
            pool: HeadPool::of(pool),
            _source: pool.identity_guard(),
        }
    }

    fn key<'a>(definition: &'a str, model: &'a str, pool: &ToolPool) -> HeadKeyRef<'a> {
        HeadKeyRef {
            definition,
            model,
            background: true,
            teammate: false,
            pool: pool.identity(),
        }
    }

    #[test]
    fn a_head_is_found_only_under_its_whole_key() {
        let pool = ToolPool::empty();
        let cache = HeadCache::new();
        let k = key("Explore", "m1", &pool);
        assert!(cache.get(k).is_none());
        cache.put(k.owned(), head("m1", &pool));
        assert_eq!(
            cache
                .get(k)
                .map(|h| h.0.params.model().to_owned())
                .as_deref(),
            Some("m1")
        );
        for differs in [
            key("explore", "m1", &pool),
            key("Explore", "m2", &pool),
            HeadKeyRef {
                pool: k.pool + 1,
                ..k
            },
            HeadKeyRef {
                background: false,
                ..k
            },
            HeadKeyRef {
                teammate: true,
                ..k
            },
        ] {
            assert!(cache.get(differs).is_none());
        }
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_key_put_again_replaces_its_head_and_a_full_cache_starts_again() {
        let pool = ToolPool::empty();
        let cache = HeadCache::new();
        let names: Vec<String> = (0..HEAD_CACHE_LIMIT).map(|i| format!("d{i}")).collect();
        for n in &names {
            cache.put(key(n, "m", &pool).owned(), head("m", &pool));
        }
        assert_eq!(cache.len(), HEAD_CACHE_LIMIT);
        // Full, but the key is there: replaced, nothing dropped.
        cache.put(key("d0", "m", &pool).owned(), head("m2", &pool));
        assert_eq!(cache.len(), HEAD_CACHE_LIMIT);
        let got = cache
            .get(key("d0", "m", &pool))
            .map(|h| h.0.params.model().to_owned());
        assert_eq!(got.as_deref(), Some("m2"));
        // A new key past the limit: it starts again with that one.
        cache.put(key("new", "m", &pool).owned(), head("m", &pool));
        assert_eq!(cache.len(), 1);
        assert!(cache.get(key("d1", "m", &pool)).is_none());
        assert!(cache.get(key("new", "m", &pool)).is_some());
    }
}
