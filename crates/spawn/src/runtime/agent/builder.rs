//! Building an agent: rendering its parameters and tools, opening its transcript.

use std::fmt;

use super::*;
use crate::base::state::Extensions;

/// Builds an [`Agent`]; see [`Agent::builder`].
///
/// Its parts sit behind one box, so each builder call moves a pointer, not the whole builder.
#[derive(Debug)]
pub struct AgentBuilder(pub(super) Box<BuilderParts>);

/// What an [`AgentBuilder`] has been given.
#[derive(Debug)]
pub(super) struct BuilderParts {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) params: Option<CacheSafeParams>,
    pub(super) model: Option<String>,
    pub(super) system: Vec<String>,
    pub(super) system_context: Vec<(String, String)>,
    pub(super) user_context: Vec<(String, String)>,
    pub(super) definition: Option<Arc<AgentDefinition>>,
    pub(super) tools: ToolPool,
    pub(super) filter: Option<Arc<ToolFilter>>,
    pub(super) audience: Option<ToolAudience>,
    pub(super) trust_modes: bool,
    pub(super) policy: Arc<dyn PermissionPolicy>,
    pub(super) parent_policy: Option<Arc<dyn PermissionPolicy>>,
    /// A restriction of this agent's own (a teammate's `mode` from its lead): asked first,
    /// whatever policy its definition's mode makes.
    pub(super) restrict: Option<Arc<dyn PermissionPolicy>>,
    pub(super) limits: Limits,
    pub(super) settings: RequestSettings,
    pub(super) context: Option<AgentContext>,
    /// Made at `build` when no seed gave one (a child's comes from its parent).
    pub(super) state: Option<AgentState>,
    pub(super) tree: Option<Arc<TreeState>>,
    pub(super) cancel: Option<CancellationToken>,
    pub(super) events: Option<Arc<dyn EventSink>>,
    pub(super) transcript_dir: Option<PathBuf>,
    /// Where the agent's children write their transcripts when it writes none of its own
    /// here (a resumed agent, which appends to the file it was read from).
    pub(super) children_transcript_dir: Option<PathBuf>,
    pub(super) pending: PendingQueue,
    pub(super) expected_prefix: Option<PrefixFingerprint>,
    pub(super) unsent: Vec<Message>,
    pub(super) detach: bool,
    pub(super) keep_children: bool,
    pub(super) inherit_transcript: Option<usize>,
    pub(super) extensions: Vec<Extension>,
    /// The host's hooks (a child's come from its parent, through its seed).
    pub(super) hooks: crate::hook::Hooks,
    /// Whether hooks of project, plugin and flag definitions run (a child's from its seed).
    pub(super) trust_hooks: bool,
    /// Own hooks given back to an agent built again without its definition (a resume).
    pub(super) resumed_hooks: crate::hook::Hooks,
    /// The host's MCP servers, for the tree.
    #[cfg(feature = "mcp")]
    pub(super) mcp: Option<crate::mcp::McpHub>,
}

/// A value for the tree's [`Extensions`], put there at build.
pub(super) struct Extension {
    type_name: &'static str,
    /// Inserts the value; `false` when the tree already holds one of its type.
    put: Box<dyn FnOnce(&Extensions) -> bool + Send>,
}

impl fmt::Debug for Extension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name)
    }
}

/// The default policy, one for the process: a builder made per child allocates none.
fn allow_all() -> Arc<dyn PermissionPolicy> {
    static ALLOW_ALL: std::sync::OnceLock<Arc<dyn PermissionPolicy>> = std::sync::OnceLock::new();
    Arc::clone(ALLOW_ALL.get_or_init(|| Arc::new(AllowAll)))
}

impl AgentBuilder {
    pub(super) fn new(backend: Arc<dyn Backend>) -> Self {
        Self(Box::new(BuilderParts {
            backend,
            params: None,
            model: None,
            system: Vec::new(),
            system_context: Vec::new(),
            user_context: Vec::new(),
            definition: None,
            tools: ToolPool::empty(),
            filter: None,
            audience: None,
            trust_modes: false,
            policy: allow_all(),
            parent_policy: None,
            restrict: None,
            limits: Limits::default(),
            settings: RequestSettings::default(),
            context: None,
            state: None,
            tree: None,
            cancel: None,
            events: None,
            transcript_dir: None,
            children_transcript_dir: None,
            pending: PendingQueue::new(),
            expected_prefix: None,
            unsent: Vec::new(),
            detach: false,
            keep_children: false,
            inherit_transcript: None,
            extensions: Vec::new(),
            hooks: crate::hook::Hooks::new(),
            trust_hooks: false,
            resumed_hooks: crate::hook::Hooks::new(),
            #[cfg(feature = "mcp")]
            mcp: None,
        }))
    }

    /// Starts from already rendered cache-safe parameters (system, contexts, tools, model and
    /// any messages). Their tool array is kept byte for byte; every tool in it must be in the
    /// pool. Overrides [`model`](Self::model), [`system_prompt`](Self::system_prompt) and the
    /// definition's rendering.
    pub fn params(mut self, params: CacheSafeParams) -> Self {
        self.0.params = Some(params);
        self
    }

    /// The model (required unless [`params`](Self::params) or a definition names one).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.0.model = Some(model.into());
        self
    }

    /// Appends a system prompt block (used when no [`params`](Self::params) are given).
    pub fn system_prompt(mut self, text: impl Into<String>) -> Self {
        self.0.system.push(text.into());
        self
    }

    /// Appends a system context entry (rendered after the system prompt; order is kept).
    pub fn system_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.system_context.push((key.into(), value.into()));
        self
    }

    /// Appends a user context entry (sent ahead of the conversation; order is kept).
    /// Definitions with `omitClaudeMd` drop entries keyed `claudeMd`.
    pub fn user_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.user_context.push((key.into(), value.into()));
        self
    }

    /// Renders the agent from a definition: its system prompt (unless system blocks were
    /// given), its model (`inherit` or none: the builder's), its tools through the three
    /// filtering layers, its `maxTurns`, its `permissionMode`, its `effort`, its `hooks` (see
    /// [`trust_definition_hooks`](Self::trust_definition_hooks)), and what its first message
    /// starts with — its `memory` (with the memory tools), its preloaded `skills` and its
    /// `initialPrompt` (`docs/definitions.md`). Takes an `AgentDefinition` or an `Arc` of one
    /// (shared by every child of a definition, not copied per child).
    pub fn definition(mut self, definition: impl Into<Arc<AgentDefinition>>) -> Self {
        self.0.definition = Some(definition.into());
        self
    }

    /// For a teammate: the same builder with `SendMessage` kept on its definition's allow
    /// list; `None` when its tools have no `SendMessage` (a teammate without it could not
    /// answer its lead) ("Claude Code Multi-Agent Internals — 6.4 Teammates get
    /// team-aware prompts and tool injection").
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn keep_team_tool(mut self) -> Option<Self> {
        use crate::base::pending::SEND_MESSAGE;
        self.0.tools.get(SEND_MESSAGE)?;
        if let Some(def) = &self.0.definition
            && let Some(allowed) = &def.tools
            && !allowed
                .iter()
                .any(|t| t == SEND_MESSAGE || t == crate::definition::ALL_TOOLS)
        {
            let mut own = (**def).clone();
            if let Some(tools) = own.tools.as_mut() {
                tools.push(SEND_MESSAGE.to_owned());
            }
            self.0.definition = Some(Arc::new(own));
        }
        Some(self)
    }

    /// The tools available before filtering.
    pub fn tools(mut self, tools: ToolPool) -> Self {
        self.0.tools = tools;
        self
    }

    /// The lists of filtering layers 1 and 2 (default: Claude Code's). Takes a
    /// [`ToolFilter`] or an `Arc` of one, which children built from one config share.
    pub fn tool_filter(mut self, filter: impl Into<Arc<ToolFilter>>) -> Self {
        self.0.filter = Some(filter.into());
        self
    }

    /// Who the tools are for. Default: from the agent's kind — [`ToolAudience::Main`] for a
    /// main agent, `Foreground` for a subagent or fork, `Teammate` for a teammate.
    pub fn audience(mut self, audience: ToolAudience) -> Self {
        self.0.audience = Some(audience);
        self
    }

    /// Whether the loosening `permissionMode` (`acceptEdits`, `bypassPermissions`) of a
    /// definition from a source that is not trusted — a project's, a plugin's, the command
    /// line's — is honoured (default: no — the host's policy decides, and a warning says so;
    /// tightening modes always apply). One switch for all of them. A trusted source's
    /// ([`DefinitionSource::is_trusted`](crate::definition::DefinitionSource::is_trusted): the
    /// built-ins, the host's own, the user's, a policy's) is honoured without it. Children of
    /// this agent inherit the choice: set it on the main agent, and the agent types its
    /// `Agent` tool starts honour their definitions' modes.
    pub fn trust_permission_modes(mut self, trust: bool) -> Self {
        self.0.trust_modes = trust;
        self
    }

    /// The host's hooks ([`crate::hook`]): they run for this agent and every agent it starts,
    /// before a definition's own (which run for that agent only).
    pub fn hooks(mut self, hooks: crate::hook::Hooks) -> Self {
        self.0.hooks = hooks;
        self
    }

    /// The host's MCP servers ([`crate::mcp`]): the hub goes into the agent tree (every agent
    /// of it shares its connections, and definitions name its servers), and `build` connects
    /// its servers, waiting until each is connected or has failed, and adds their tools to
    /// this agent's pool. A server that failed is left out with a warning (an
    /// [`EventKind::Warning`](crate::runtime::EventKind::Warning) when the run starts, and the
    /// hub's [`status`](crate::mcp::McpHub::status)). Give it to the main agent; a tree holds
    /// one hub.
    #[cfg(feature = "mcp")]
    pub fn mcp(mut self, hub: crate::mcp::McpHub) -> Self {
        self.0.mcp = Some(hub);
        self
    }

    /// The MCP hub given to [`mcp`](Self::mcp), if any.
    #[cfg(feature = "mcp")]
    pub(crate) fn mcp_hub(&self) -> Option<&crate::mcp::McpHub> {
        self.0.mcp.as_ref()
    }

    /// Whether the `hooks` of definitions from the project, a plugin or the command line run
    /// (default: no — they run shell commands, and a repository's files are not the host's;
    /// such hooks are left out with a warning). Hooks of built-in, host, user and policy
    /// definitions always run. Children of this agent inherit the choice.
    pub fn trust_definition_hooks(mut self, trust: bool) -> Self {
        self.0.trust_hooks = trust;
        self
    }

    /// A resumed child's own hooks (its definition's), which run after the host's as they did
    /// before it ended.
    pub(crate) fn resumed_hooks(mut self, hooks: crate::hook::Hooks) -> Self {
        self.0.resumed_hooks = hooks;
        self
    }

    /// The policy set so far (for code that adds a check to the host's own).
    #[cfg(feature = "redis")]
    pub(crate) fn current_policy(&self) -> Arc<dyn PermissionPolicy> {
        Arc::clone(&self.0.policy)
    }

    /// The permission policy (default: [`AllowAll`]).
    pub fn policy(mut self, policy: Arc<dyn PermissionPolicy>) -> Self {
        self.0.policy = policy;
        self
    }

    /// A restriction of the agent's own, asked before the policy its definition's
    /// `permissionMode` makes (so `bubble` cannot drop it): a teammate's plan mode.
    pub(crate) fn restrict(mut self, restriction: Option<Arc<dyn PermissionPolicy>>) -> Self {
        self.0.restrict = restriction;
        self
    }

    /// The limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.0.limits = limits;
        self
    }

    /// Per-request settings (`max_tokens` is taken from the limits).
    pub fn settings(mut self, settings: RequestSettings) -> Self {
        self.0.settings = settings;
        self
    }

    /// The agent's identity (default: a main agent with a fresh id).
    pub fn context(mut self, context: AgentContext) -> Self {
        self.0.context = Some(context);
        self
    }

    /// Builds a child from a parent's [`ChildSeed`]: identity, copied state, tree state,
    /// linked cancellation, the parent's policy (for `bubble`), and the parent's trust in
    /// definitions' hooks and permission modes (a setter called after this one overrides it).
    pub fn child_of(mut self, seed: ChildSeed) -> Self {
        self.0.context = Some(seed.context);
        self.0.state = Some(seed.state);
        self.0.tree = Some(seed.tree);
        self.0.cancel = Some(seed.cancel);
        self.0.parent_policy = Some(seed.parent_policy);
        self.0.hooks = seed.hooks;
        self.0.trust_hooks = seed.trust_hooks;
        self.0.trust_modes = seed.trust_modes;
        self
    }

    /// Links the agent to `token` (default: a new root token): cancelling `token` stops the
    /// agent and everything it started. The agent runs on a child of `token`, so dropping the
    /// agent (which stops its children, see [`Agent`]) never cancels `token` itself: a host
    /// may share one token among many agents.
    pub fn cancellation(mut self, token: CancellationToken) -> Self {
        self.0.cancel = Some(token.child_token());
        self
    }

    /// Writes only the messages after the first `messages` to the transcript: those are the
    /// parent's, already in the parent's transcript beside this one (`<parent id>.jsonl` in the
    /// same directory), and [`transcript::read`] reads them from there. A fork child's
    /// transcript costs O(directive) this way instead of O(history). Ignored without a
    /// parent or when the parameters hold fewer messages.
    pub fn inherit_transcript(mut self, messages: usize) -> Self {
        self.0.inherit_transcript = Some(messages);
        self
    }

    /// Whether dropping the agent stops the children it started that are still running
    /// (default: yes). Turn it off only when something else owns them — for instance a host
    /// that keeps the tree's [`TaskService`](crate::task::TaskService) and cancels through it.
    /// (An agent run as a child by the task service is stopped with its descendants when it
    /// ends, whatever this says: its owner cancels its token.)
    pub fn cancel_children_on_drop(mut self, cancel: bool) -> Self {
        self.0.keep_children = !cancel;
        self
    }

    /// Puts a service into the agent tree's [`Extensions`], where tools find it: most often
    /// the tree's [`TaskService`](crate::task::TaskService), whose `TaskConfig` (deadlines,
    /// capacity, output files) then governs every child of the tree —
    /// `.extension(TaskService::new(registry, config))`. Without one, the first spawn creates
    /// a service with the defaults.
    ///
    /// A tree holds one value of each type: building fails with [`Error::Config`] when the
    /// tree (of a [`child_of`](Self::child_of) seed) already holds one, rather than leave one
    /// of the two configurations silently unread — and when `value` is an `Arc` of an `Arc`,
    /// stored under a type nothing looks up. A resumed agent is a new tree: give its builder
    /// the same extensions.
    pub fn extension<T: std::any::Any + Send + Sync>(mut self, value: Arc<T>) -> Self {
        self.0.extensions.push(Extension {
            type_name: std::any::type_name::<T>(),
            put: Box::new(move |ext: &Extensions| {
                if ext.get::<T>().is_some() {
                    return false;
                }
                ext.insert(value);
                true
            }),
        });
        self
    }

    /// Where events go.
    pub fn events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.0.events = Some(sink);
        self
    }

    /// Writes the transcript to `<dir>/<agent id>.jsonl` (the directory is created if
    /// missing); the agent's children write theirs beside it.
    pub fn transcript_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.0.transcript_dir = Some(dir.into());
        self
    }

    /// Uses `queue` as the agent's pending-message queue (to hand it out before building).
    pub fn pending(mut self, queue: PendingQueue) -> Self {
        self.0.pending = queue;
        self
    }

    /// The fingerprint the first request is expected to extend (a fork child's parent's last
    /// request): anything but an append is reported as a cache break before it is sent.
    pub fn expect_prefix(mut self, fingerprint: PrefixFingerprint) -> Self {
        self.0.expected_prefix = Some(fingerprint);
        self
    }

    /// Messages that end the conversation but go in the first request's *suffix*, so the
    /// codec can place a cache breakpoint inside them (a fork child's message: its boilerplate
    /// block is shared by every sibling). They are part of the conversation from the start;
    /// run the agent with [`Agent::continue_run`], which sends them, alone: a message queued
    /// before that first turn is taken when it ends, as a running agent takes one (a fork
    /// child's first request keeps the prefix and cache breakpoint its siblings share). What
    /// [`Agent::run`] adds goes after them (they may answer the conversation's last tool
    /// calls, and nothing may come between). ([`Agent::run_pending`]
    /// sends them only with a queued message: with nothing queued or promised it ends at
    /// once.)
    pub fn first_request_suffix(mut self, messages: Vec<Message>) -> Self {
        self.0.unsent = messages;
        self
    }

    /// When the model ends its turn while background children are still running, stop
    /// instead of waiting for their notifications (the host polls the queue itself).
    pub fn detach_background(mut self, detach: bool) -> Self {
        self.0.detach = detach;
        self
    }

    /// Renders the parameters and tools, opens the transcript, and returns the agent.
    // `mut`: the MCP hub's tools join `self.0.tools` (feature `mcp`).
    #[cfg_attr(not(feature = "mcp"), allow(unused_mut))]
    pub async fn build(mut self) -> Result<Agent> {
        let def = self.0.definition.as_deref();
        let audience =
            self.0
                .audience
                .unwrap_or(match self.0.context.as_ref().map(AgentContext::kind) {
                    None | Some(AgentKind::Main) => ToolAudience::Main,
                    Some(AgentKind::Teammate) => ToolAudience::Teammate,
                    Some(_) => ToolAudience::Foreground,
                });
        let mut warnings = Vec::new();
        let tree = self.0.tree.unwrap_or_default();
        for Extension { type_name, put } in self.0.extensions {
            // Stored by type: an `Arc` of an `Arc` (say `Arc::new(TaskService::new(..))`, whose
            // `new` already returns one) would sit under a type nothing looks up.
            if let Some(inner) = type_name
                .strip_prefix("alloc::sync::Arc<")
                .or_else(|| type_name.strip_prefix("std::sync::Arc<"))
            {
                let inner = inner.strip_suffix('>').unwrap_or(inner);
                return Err(Error::Config(format!(
                    "`.extension` was given an `Arc<Arc<{inner}>>`, which nothing looks up: \
                     pass the `Arc<{inner}>` itself"
                )));
            }
            if !put(tree.extensions()) {
                return Err(Error::Config(format!(
                    "the agent tree already holds a `{type_name}`; a tree has one of each \
                     service, so configure that one instead of passing another to the builder"
                )));
            }
        }
        // What the main agent's tools need from its tree (a lead's `Team`), now that the
        // tree holds the extensions: a child's tree is its main agent's, already checked.
        if audience == ToolAudience::Main {
            let build = crate::tool::BuildFacts::new(
                self.0.transcript_dir.is_some() || self.0.children_transcript_dir.is_some(),
            )
            .with_trusted_definition_hooks(self.0.trust_hooks);
            for tool in self.0.tools.iter() {
                if let Err(why) = tool.check_tree(&tree) {
                    return Err(Error::Config(format!(
                        "tool `{}`: {why}",
                        tool.definition().name
                    )));
                }
                warnings.extend(
                    tool.warnings(&build, &tree)
                        .into_iter()
                        .map(|w| format!("tool `{}`: {w}", tool.definition().name)),
                );
            }
        }
        #[cfg(feature = "mcp")]
        if let Some(hub) = self.0.mcp.take() {
            // One hub per tree (a second would split the tree's connections).
            let held = tree.extensions().get_or_insert_with(|| hub.clone());
            if !held.same(&hub) {
                return Err(Error::Config(
                    "the agent tree already holds an McpHub; a tree has one, given to its main \
                     agent's builder"
                        .to_owned(),
                ));
            }
            // Boxed: only a main agent given a hub waits here, and a child's build future
            // (held by every spawn) stays small.
            let tools = Box::pin(hub.tools()).await;
            for (name, status) in hub.status() {
                if let crate::mcp::McpStatus::Failed(why) = status {
                    warnings.push(format!(
                        "MCP server `{name}` cannot be used ({why}); the agent runs without its \
                         tools"
                    ));
                }
            }
            for (name, why) in hub.left_out() {
                warnings.push(format!(
                    "MCP server `{name}` offers a tool that was left out: {why}"
                ));
            }
            self.0.tools = self.0.tools.with(tools)?;
        }
        let pool = match def {
            Some(d) if self.0.params.is_none() => {
                static DEFAULT_FILTER: std::sync::LazyLock<ToolFilter> =
                    std::sync::LazyLock::new(ToolFilter::default);
                let filter = self.0.filter.as_deref().unwrap_or(&DEFAULT_FILTER);
                let (tools, disallowed) = (d.tools.as_deref(), d.disallowed_tools.as_deref());
                // A definition that names a tool expects it: say which it will not get, and
                // why, rather than leave the model to meet "unknown tool".
                for (name, why) in
                    filter.unavailable(&self.0.tools, audience, tools.unwrap_or(&[]), disallowed)
                {
                    // `read` for `Read`: tool names are matched exactly.
                    let hint = match why {
                        crate::tool::Unavailable::NotProvided => self
                            .0
                            .tools
                            .names()
                            .into_iter()
                            .find(|n| n.eq_ignore_ascii_case(&name))
                            .map(|n| format!("; did you mean `{n}`? Tool names are case-sensitive"))
                            .unwrap_or_default(),
                        _ => String::new(),
                    };
                    let text = format!(
                        "agent `{}` names tool `{name}` in `tools`, but this {} agent will not \
                         have it: {why}{hint}",
                        d.name,
                        audience_word(audience)
                    );
                    tracing::warn!(agent = %d.name, tool = %name, "{text}");
                    warnings.push(text);
                }
                filter.pool(&self.0.tools, audience, tools, disallowed)
            }
            _ => self.0.tools.clone(),
        };
        // What a definition's `memory` and `skills` bring: tools (a fresh head only; a cached
        // head already has them) and text for the first message.
        let mut first_context = Vec::new();
        let mut pool = pool;
        if let Some(d) = def {
            // Boxed, and only for a definition that brings something: the common child's
            // build future stays small.
            let (mut tools, context) = if brings_extras(d) {
                Box::pin(definition_extras(
                    d,
                    &tree,
                    self.0.params.is_none(),
                    &mut warnings,
                ))
                .await?
            } else {
                (Vec::new(), Vec::new())
            };
            // A server the definition names that the pool already has (the parent's, shared)
            // is not added twice.
            tools.retain(|t| pool.get(&t.definition().name).is_none());
            if !tools.is_empty() {
                pool = pool.with(tools)?;
            }
            first_context = context;
            // `tools: [Bash(git:*)]` gives all of Bash: a rule is not enforced, and the
            // definition's author should hear so.
            if self.0.params.is_none() {
                let lists = [
                    ("tools", d.tools.as_deref()),
                    ("disallowedTools", d.disallowed_tools.as_deref()),
                ];
                for (key, list) in lists {
                    for entry in ToolFilter::unenforceable(list.unwrap_or(&[])) {
                        let text = format!(
                            "agent `{}` names {}",
                            d.name,
                            crate::definition::entry::dropped_rule(key, &entry)
                        );
                        tracing::warn!(agent = %d.name, tool = %entry, "{text}");
                        warnings.push(text);
                    }
                }
            }
            // `disallowedTools: [bash]` takes nothing away (names are case-sensitive): say so,
            // rather than leave the author believing the tool is gone.
            if self.0.params.is_none()
                && let Some(disallowed) = d.disallowed_tools.as_deref()
            {
                // Every tool it could have had: the host's, before any list, and its own.
                let mut names = self.0.tools.names();
                names.extend(pool.names());
                for (entry, near) in crate::tool::filter::case_slips(disallowed, &names) {
                    let text = format!(
                        "agent `{}` names `{entry}` in `disallowedTools`, which takes nothing \
                         away: did you mean `{near}`? Tool names are case-sensitive",
                        d.name
                    );
                    tracing::warn!(agent = %d.name, tool = %entry, "{text}");
                    warnings.push(text);
                }
            }
        }
        // Built afresh (not from given params: a resume, a cached head).
        let fresh = self.0.params.is_none();
        let (params, pool) = match self.0.params {
            Some(p) => {
                // A resumed agent's MCP tools whose server is not connected now keep their
                // place in the request (its bytes, its cache) and answer with an error.
                #[cfg(feature = "mcp")]
                {
                    let gone: Vec<Arc<dyn crate::tool::Tool>> = p
                        .tools()
                        .iter()
                        .filter(|t| {
                            crate::tool::filter::is_mcp_tool(&t.name) && pool.get(&t.name).is_none()
                        })
                        .map(|t| {
                            Arc::new(crate::mcp::Unavailable(t.clone()))
                                as Arc<dyn crate::tool::Tool>
                        })
                        .collect();
                    if !gone.is_empty() {
                        pool = pool.with(gone)?;
                    }
                }
                for t in p.tools() {
                    if pool.get(&t.name).is_none() {
                        return Err(Error::Config(format!(
                            "the parameters name tool `{}`, which is not in the tool pool",
                            t.name
                        )));
                    }
                }
                // Only what the model was offered may run. A pool that already is exactly the
                // offered array (a cached head's) is kept as it is.
                let exact = pool.len() == p.tools().len()
                    && pool
                        .iter()
                        .zip(p.tools())
                        .all(|(tool, t)| tool.definition().name == t.name);
                let offered = if exact {
                    pool
                } else {
                    pool.filtered(|tool| {
                        let name = &tool.definition().name;
                        p.tools().iter().any(|t| t.name == *name)
                    })
                };
                (p, offered)
            }
            None => {
                let def_model = def
                    .and_then(|d| d.model.as_deref())
                    .filter(|m| *m != "inherit");
                let model = def_model
                    .map(str::to_owned)
                    .or(self.0.model)
                    .ok_or_else(|| {
                        Error::Config(
                            "no model: set one on the builder, or give parameters or a \
                             definition that names one"
                                .to_owned(),
                        )
                    })?;
                let mut b = CacheSafeParams::builder(model).tools(pool.definitions());
                let system = if self.0.system.is_empty() {
                    def.map(|d| vec![d.system_prompt.clone()])
                        .unwrap_or_default()
                } else {
                    self.0.system
                };
                for s in system.into_iter().filter(|s| !s.is_empty()) {
                    b = b.system_block(s);
                }
                for (k, v) in self.0.system_context {
                    b = b.system_context(k, v);
                }
                let omit_claude_md = def.is_some_and(|d| d.omit_claude_md);
                for (k, v) in self.0.user_context {
                    if !(omit_claude_md && k == "claudeMd") {
                        b = b.user_context(k, v);
                    }
                }
                (b.build(), pool)
            }
        };
        // The host's hooks, then the definition's own (for this agent only; a subagent's
        // `Stop` hooks run when it stops, as `SubagentStop`).
        let is_child = self.0.context.as_ref().is_some_and(|c| c.depth() > 0);
        let own_hooks = match def.and_then(|d| d.hooks.as_ref().map(|h| (d, h))) {
            Some((d, _)) if !self.0.trust_hooks && !crate::definition::trusted_source(d.source) => {
                warnings.push(format!(
                    "agent `{}` has hooks, which run shell commands; this host does not run the \
                     hooks of {} definitions (AgentBuilder::trust_definition_hooks), so they \
                     were left out",
                    d.name, d.source
                ));
                crate::hook::Hooks::new()
            }
            Some((d, h)) => {
                let source = format!("agent `{}`", d.name);
                let (own, notes) = if is_child {
                    crate::hook::Hooks::from_subagent_definition(h, &source)?
                } else {
                    crate::hook::Hooks::from_settings(h, &source)?
                };
                warnings.extend(notes);
                own
            }
            None => crate::hook::Hooks::new(),
        };
        let own_hooks = own_hooks.then(&self.0.resumed_hooks);
        let host_hooks = self.0.hooks;
        let hooks = host_hooks.then(&own_hooks);
        let mut limits = self.0.limits;
        if let Some(n) = def.and_then(|d| d.max_turns) {
            limits.max_turns = Some(n);
        }
        // A loosening mode is honoured when the host trusts definitions' modes, or the
        // definition is the host's own; otherwise it is dropped, and the author hears so.
        let trusted = self.0.trust_modes || def.is_some_and(|d| d.source.is_trusted());
        if let Some(d) = def
            && !trusted
            && fresh
            && let Some(
                mode @ (crate::definition::PermissionMode::AcceptEdits
                | crate::definition::PermissionMode::BypassPermissions),
            ) = d.permission_mode
        {
            let text = format!(
                "agent `{}` asks for `permissionMode: {mode}`, which is not honoured: it is a {} \
                 definition, and this host does not trust the permission modes of {} \
                 definitions (`AgentBuilder::trust_permission_modes`); the host's policy decides",
                d.name, d.source, d.source
            );
            tracing::warn!(agent = %d.name, "{text}");
            warnings.push(text);
        }
        let policy = policy_for_mode(
            def.and_then(|d| d.permission_mode.as_ref()),
            self.0.policy,
            self.0.parent_policy,
            trusted,
        );
        let policy: Arc<dyn PermissionPolicy> = match self.0.restrict {
            Some(own) => Arc::new(crate::tool::permission::Both::new(own, policy)),
            None => policy,
        };
        let context = match self.0.context {
            Some(c) => c,
            None => {
                let source = def.map_or_else(QuerySource::main, |d| {
                    if d.source == crate::definition::DefinitionSource::BuiltIn {
                        QuerySource::builtin(&d.name)
                    } else {
                        QuerySource::custom(&d.name)
                    }
                });
                let kind = if def.is_some() {
                    AgentKind::Subagent
                } else {
                    AgentKind::Main
                };
                let cx = AgentContext::new(
                    TaskId::generate(forkhive_core::TaskKind::Agent),
                    kind,
                    source,
                );
                match def {
                    Some(d) => cx.with_agent_type(d.name.clone()),
                    None => cx,
                }
            }
        };
        let cx = Arc::new(context);
        let inherit = self
            .0
            .inherit_transcript
            .filter(|n| *n > 0 && *n <= params.messages().len() && cx.parent().is_some());
        let transcript = match &self.0.transcript_dir {
            Some(dir) => {
                let header = TranscriptHeader {
                    version: TRANSCRIPT_VERSION,
                    agent_id: cx.id().to_string(),
                    parent_id: cx.parent().map(ToString::to_string),
                    depth: cx.depth(),
                    kind: cx.kind(),
                    query_source: cx.query_source().to_string(),
                    definition: def
                        .map(|d| d.name.clone())
                        .or_else(|| cx.agent_type().map(str::to_owned)),
                    model: params.model().to_owned(),
                    prefix_fingerprint: params.fingerprint().total().to_string(),
                    prefix: PrefixRecord::of(&params),
                    permission_mode: def
                        .and_then(|d| d.permission_mode)
                        .map(|m| m.as_str().to_owned()),
                    max_turns: def.and_then(|d| d.max_turns),
                    inherited_messages: inherit,
                    // An agent that starts with more than it inherits: what the reader can
                    // check the inherited messages against.
                    inherited_fingerprint: inherit.filter(|n| *n < params.messages().len()).map(
                        |n| {
                            PrefixRecord::of(&params)
                                .params(params.messages().iter().take(n).cloned().collect())
                                .fingerprint()
                                .total()
                                .to_string()
                        },
                    ),
                    at: Some(crate::transcript::now_ms()),
                };
                let mut w = TranscriptWriter::create(dir, &header).await?;
                // Messages inherited from the parent's transcript are referenced, not copied.
                let skip = inherit.unwrap_or(0);
                for m in params.messages().iter().skip(skip).chain(&self.0.unsent) {
                    w.message(m).await?;
                }
                Some(super::Recorder::new(w))
            }
            None => None,
        };
        let emit = Emitter::new(*cx.id(), self.0.events.clone());
        let mut settings = self.0.settings;
        // A definition's `effort`, as each backend can say it (RequestSettings::effort); an
        // agent with a definition has its own effort, never its parent's — except a fork
        // child, whose requests are its parent's bytes: the effort sets the thinking budget
        // its parent's cache was written with ("Coordinator Mode" — CacheSafeParams: a fork
        // that changes it invalidates the messages cache, and the child would not think).
        if def.is_some() && cx.kind() != AgentKind::Fork {
            settings.effort = None;
        }
        if let Some(d) = def
            && let Some(written) = &d.effort
        {
            match forkhive_transport::Effort::from_name(written) {
                Some(e) => settings.effort = Some(e),
                None => warnings.push(format!(
                    "agent `{}`: effort `{written}` is not one of low, medium, high, max; the \
                     backend's default is used",
                    d.name
                )),
            }
        }
        // A fork child sends its parent's `max_tokens` too: the thinking budget an effort sets
        // is bounded by it, and the budget is part of the cache key its parent wrote.
        if cx.kind() != AgentKind::Fork {
            settings.max_tokens = limits.max_output_tokens;
        }
        // Its holds on the definitions' own MCP servers among its tools: the last agent
        // holding one stops it (Agent definitions, §9.6).
        #[cfg(feature = "mcp")]
        let mcp_holds = crate::mcp::holders(pool.iter());
        Ok(Agent {
            shared: Arc::new(AgentShared {
                backend: self.0.backend,
                pool,
                policy,
                limits,
                settings,
                cx,
                state: self.0.state.unwrap_or_default(),
                tree,
                cancel: self.0.cancel.unwrap_or_default(),
                pending: self.0.pending,
                halt: crate::base::pending::Halt::new(),
                host_hooks,
                hooks,
                own_hooks,
                trust_hooks: self.0.trust_hooks,
                trust_modes: self.0.trust_modes,
                events: self.0.events,
                transcript_dir: self.0.transcript_dir.or(self.0.children_transcript_dir),
                wait_for_promises: !self.0.detach,
                children: ChildLedger::default(),
                #[cfg(feature = "mcp")]
                _mcp_holds: mcp_holds,
            }),
            params,
            emit,
            transcript,
            last_prefix: self
                .0
                .expected_prefix
                .map(|fp| LastPrefix::Expected(Box::new(fp))),
            turn: 0,
            last_stop: None,
            unsent: self.0.unsent,
            keep_children: self.0.keep_children,
            stopped_cancelled: false,
            receipts: Vec::new(),
            warnings,
            first_context,
        })
    }
}

/// How a warning names an audience.
fn audience_word(audience: ToolAudience) -> &'static str {
    match audience {
        ToolAudience::Main => "main",
        ToolAudience::Foreground => "foreground",
        ToolAudience::Background => "background",
        ToolAudience::Teammate => "teammate",
    }
}

/// Whether [`definition_extras`] has anything to do for `d`: MCP servers (its own, or required
/// of the host), memory, skills or an initial prompt. Keep it in step with that function.
fn brings_extras(d: &AgentDefinition) -> bool {
    !d.mcp_servers.is_empty()
        || d.extra.contains_key("requiredMcpServers")
        || d.memory.is_some()
        || !d.skills.is_empty()
        || d.initial_prompt
            .as_ref()
            .is_some_and(|p| !p.trim().is_empty())
}

/// A definition's memory ([`crate::tool::memory`]) and preloaded skills
/// ([`crate::definition::skills`]): the memory tools (when `with_tools`: a fresh head) and the
/// text its first message starts with — its initial prompt, its memory, its skills. What the
/// host cannot give is a warning, and the agent runs without it.
async fn definition_extras(
    d: &AgentDefinition,
    tree: &TreeState,
    with_tools: bool,
    warnings: &mut Vec<String>,
) -> Result<(Vec<Arc<dyn crate::tool::Tool>>, Vec<String>)> {
    let mut tools: Vec<Arc<dyn crate::tool::Tool>> = Vec::new();
    let mut context = Vec::new();
    // MCP servers: the host's hub (in the tree) and the definition's own.
    #[cfg(feature = "mcp")]
    {
        let hub = tree.extensions().get::<crate::mcp::McpHub>();
        let mcp = crate::mcp::for_definition(d, hub.as_deref(), warnings).await?;
        if with_tools {
            tools.extend(mcp);
        }
    }
    #[cfg(not(feature = "mcp"))]
    {
        let names = |v: &serde_json::Value| -> Vec<String> {
            match v {
                serde_json::Value::String(s) => vec![s.clone()],
                serde_json::Value::Object(o) => o.keys().cloned().collect(),
                serde_json::Value::Array(a) => a
                    .iter()
                    .flat_map(|v| match v {
                        serde_json::Value::String(s) => vec![s.clone()],
                        serde_json::Value::Object(o) => o.keys().cloned().collect(),
                        _ => Vec::new(),
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        let list = |v: &[String]| {
            v.iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(required) = d.extra.get("requiredMcpServers") {
            let missing = names(required);
            if !missing.is_empty() {
                return Err(Error::Config(format!(
                    "agent `{}` requires MCP servers that are not available: {}; it was not \
                     started",
                    d.name,
                    missing
                        .iter()
                        .map(|m| format!("`{m}` (this build has no MCP: feature `mcp`)"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let servers: Vec<String> = d.mcp_servers.iter().flat_map(names).collect();
        if !servers.is_empty() {
            warnings.push(format!(
                "agent `{}` names MCP servers {}, but this build has no MCP (feature `mcp`); it \
                 runs without their tools",
                d.name,
                list(&servers)
            ));
        }
    }
    if let Some(scope) = &d.memory {
        let dir = match tree.extensions().get::<crate::tool::memory::MemoryRoots>() {
            Some(roots) => roots.locate(scope, &d.name),
            // A scope no host could give is the file's mistake, not the host's.
            None => crate::tool::memory::check_scope(scope).and_then(|()| {
                Err(format!(
                    "`memory: {scope}` needs the host's MemoryRoots in the agent tree, which it \
                     did not give"
                ))
            }),
        };
        match dir {
            Ok((base, dir)) => match crate::tool::memory::Memory::open(&base, &dir).await {
                Ok(memory) => {
                    if with_tools {
                        // Its tools, unless the definition's `disallowedTools` takes them
                        // away, read as every other tool's are: by name, `*`, `Memory*`,
                        // `MemoryWrite(rule)` as the whole tool.
                        let denied = |t: &Arc<dyn crate::tool::Tool>| {
                            d.disallowed_tools.as_deref().is_some_and(|l| {
                                crate::tool::filter::denied(l, &t.definition().name)
                            })
                        };
                        tools.extend(memory.tools()?.into_iter().filter(|t| !denied(t)));
                    }
                    context.push(memory.context().await);
                }
                Err(e) => warnings.push(format!(
                    "agent `{}`: its memory at {} cannot be used ({}); it runs without memory",
                    d.name,
                    dir.display(),
                    forkhive_core::error::chain(&e)
                )),
            },
            Err(why) => warnings.push(format!("agent `{}`: {why}; it runs without memory", d.name)),
        }
    }
    if !d.skills.is_empty() {
        let loaded = tree.extensions().get::<crate::definition::skills::Skills>();
        for name in &d.skills {
            match loaded.as_ref().and_then(|s| s.get(name)) {
                Some(skill) => context.push(skill.context()),
                None => warnings.push(format!(
                    "agent `{}` preloads skill `{name}`, which this host has not loaded \
                     (definition::skills::Skills in the agent tree); it runs without it",
                    d.name
                )),
            }
        }
    }
    if let Some(first) = d.initial_prompt.as_ref().filter(|p| !p.trim().is_empty()) {
        context.push(first.clone());
    }
    Ok((tools, context))
}
