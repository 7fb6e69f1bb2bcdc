//! Shared fixtures for the runtime tests: scripted model turns and small tools.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{ContentBlock, Message, RawJson, ToolDefinition, ToolResultContent, Usage};
use forkhive_spawn::runtime::{AgentEvent, EventSink};
use forkhive_spawn::tool::{Tool, ToolContext, ToolOutput};
use forkhive_transport::request::events_for;
use forkhive_transport::{Backend, EventStream, ModelStop, Request, Response};

pub(crate) const OBJECT: &str = r#"{"type":"object"}"#;

pub(crate) fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

/// An assistant answer calling tools: `(id, name, input JSON)`.
pub(crate) fn calls(list: &[(&str, &str, &str)]) -> Response {
    Response {
        message: Message::assistant(
            list.iter()
                .map(|(id, name, input)| {
                    ContentBlock::tool_use(*id, *name, RawJson::parse(input).unwrap())
                })
                .collect(),
        ),
        stop_reason: Some(ModelStop::ToolUse),
        usage: usage(10, 5),
        id: None,
        model: None,
    }
}

/// A final text answer.
pub(crate) fn say(text: &str) -> Response {
    Response::text(text, usage(10, 5))
}

/// The tool results of the last user message of `request`: `(id, text, is_error)`.
pub(crate) fn results(request: &Request) -> Vec<(String, String, bool)> {
    let msgs = request.all_messages();
    message_results(msgs.last().expect("a message"))
}

/// The `(tool_use_id, text, is_error)` of each tool result in `message`.
pub(crate) fn message_results(message: &Message) -> Vec<(String, String, bool)> {
    message
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Some((tool_use_id.clone(), content.text(), *is_error)),
            _ => None,
        })
        .collect()
}

/// The `(text, is_error)` of each block of `message`, which must all be tool results.
pub(crate) fn result_texts(message: &Message) -> Vec<(String, bool)> {
    assert!(
        message
            .content
            .iter()
            .all(|b| matches!(b, ContentBlock::ToolResult { .. })),
        "not only tool results: {message:?}"
    );
    message_results(message)
        .into_iter()
        .map(|(_, text, is_error)| (text, is_error))
        .collect()
}

/// The text blocks of the last user message of `request`.
pub(crate) fn last_texts(request: &Request) -> Vec<String> {
    let msgs = request.all_messages();
    msgs.last()
        .map(|m| {
            m.content
                .iter()
                .filter_map(|b| b.as_text().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn result_text(block: &ContentBlock) -> String {
    match block {
        ContentBlock::ToolResult { content, .. } => match content {
            ToolResultContent::Text(t) => t.clone(),
            other => other.text(),
        },
        _ => String::new(),
    }
}

/// Collects events.
#[derive(Debug, Default)]
pub(crate) struct Events(pub Mutex<Vec<AgentEvent>>);

impl EventSink for Events {
    fn emit(&self, event: AgentEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Events {
    pub(crate) fn take(&self) -> Vec<AgentEvent> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// The warnings among the events so far (taking them all).
    #[allow(dead_code)]
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.take()
            .into_iter()
            .filter_map(|e| match e.kind {
                forkhive_spawn::runtime::EventKind::Warning { message } => Some(message),
                _ => None,
            })
            .collect()
    }
}

type Behaviour = dyn Fn(serde_json::Value, ToolContext) -> futures::future::BoxFuture<'static, ToolOutput>
    + Send
    + Sync;

/// A tool whose behaviour is a closure; it tracks how many calls run at once.
pub(crate) struct TestTool {
    def: ToolDefinition,
    safe: bool,
    read_only: bool,
    in_background: forkhive_spawn::tool::InBackground,
    behaviour: Box<Behaviour>,
    pub running: Arc<AtomicUsize>,
    pub peak: Arc<AtomicUsize>,
    pub calls: Arc<AtomicUsize>,
}

impl std::fmt::Debug for TestTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.def.name)
    }
}

impl TestTool {
    pub(crate) fn new<F, Fut>(name: &str, schema: &str, safe: bool, f: F) -> Self
    where
        F: Fn(serde_json::Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ToolOutput> + Send + 'static,
    {
        Self {
            def: ToolDefinition::new(name, format!("the {name} tool"), schema).unwrap(),
            safe,
            read_only: safe,
            in_background: forkhive_spawn::tool::InBackground::default(),
            behaviour: Box::new(move |i, c| Box::pin(f(i, c))),
            running: Arc::default(),
            peak: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// Shares the concurrency counters with other tools.
    pub(crate) fn counting(mut self, running: &Arc<AtomicUsize>, peak: &Arc<AtomicUsize>) -> Self {
        self.running = Arc::clone(running);
        self.peak = Arc::clone(peak);
        self
    }

    pub(crate) fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    pub(crate) fn in_background(mut self, v: forkhive_spawn::tool::InBackground) -> Self {
        self.in_background = v;
        self
    }

    /// A tool that sleeps `ms` then answers its name and input.
    pub(crate) fn sleeper(name: &str, safe: bool, ms: u64) -> Self {
        let n = name.to_owned();
        Self::new(name, OBJECT, safe, move |input, _| {
            let n = n.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ToolOutput::text(format!("{n} {input}"))
            }
        })
    }

    pub(crate) fn arc(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

#[async_trait]
impl Tool for TestTool {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        self.safe
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    fn in_background(&self) -> forkhive_spawn::tool::InBackground {
        self.in_background
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let out = (self.behaviour)(input, cx.clone()).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// What the model does with one request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Plan {
    Reply(Response),
    Panic(&'static str),
    Hang,
    /// The provider answers 503.
    Fail(&'static str),
}

/// A backend whose answers are a function of the request; async, so it can hang or panic.
pub(crate) struct Brain(Box<dyn Fn(&Request) -> Plan + Send + Sync>);

impl std::fmt::Debug for Brain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Brain")
    }
}

#[async_trait]
impl Backend for Brain {
    async fn send(&self, r: &Request) -> forkhive_transport::Result<Response> {
        match (self.0)(r) {
            Plan::Reply(resp) => Ok(resp),
            Plan::Panic(m) => panic!("{m}"),
            Plan::Hang => futures::future::pending().await,
            Plan::Fail(m) => Err(forkhive_transport::Error::Unavailable {
                status: 503,
                message: m.to_owned(),
                retry_after: None,
            }),
        }
    }
    async fn stream(&self, r: &Request) -> forkhive_transport::Result<EventStream> {
        let resp = self.send(r).await?;
        Ok(Box::pin(futures::stream::iter(
            events_for(&resp, 64).into_iter().map(Ok),
        )))
    }
}

pub(crate) fn brain(f: impl Fn(&Request) -> Plan + Send + Sync + 'static) -> Arc<Brain> {
    Arc::new(Brain(Box::new(f)))
}

/// The tool results of a parent's round of `Agent` calls: `(id, text, is_error)` each.
pub(crate) type AgentResults = Arc<Mutex<Vec<(String, String, bool)>>>;

/// A model whose main agent makes one round of `Agent` calls — `(id, input JSON)` each — and
/// then says "parent done", and whose every child says "child done"; with the results of that
/// round, filled once the parent reads them.
#[allow(dead_code)]
pub(crate) fn parent_calling_agents(agent_calls: &[(&str, &str)]) -> (Arc<Brain>, AgentResults) {
    let results: AgentResults = Arc::default();
    let round: Vec<(String, String)> = agent_calls
        .iter()
        .map(|(id, input)| ((*id).to_owned(), (*input).to_owned()))
        .collect();
    let seen = Arc::clone(&results);
    let model = brain(move |r| {
        let depth = forkhive_spawn::runtime::AgentContext::current().map_or(0, |c| c.depth());
        if depth > 0 {
            return Plan::Reply(say("child done"));
        }
        if has_tool_result(r) {
            seen.lock().unwrap().extend(self::results(r));
            return Plan::Reply(say("parent done"));
        }
        let refs: Vec<(&str, &str, &str)> = round
            .iter()
            .map(|(id, input)| (id.as_str(), "Agent", input.as_str()))
            .collect();
        Plan::Reply(calls(&refs))
    });
    (model, results)
}

/// The text of the request's last user message.
pub(crate) fn last_user_text(r: &Request) -> String {
    r.all_messages()
        .iter()
        .rev()
        .find(|m| m.role == forkhive_core::Role::User)
        .map(|m| {
            m.content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text { text } => Some(text.clone()),
                    ContentBlock::ToolResult { content, .. } => Some(content.text()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Whether any message of `r` holds a tool result.
pub(crate) fn has_tool_result(r: &Request) -> bool {
    r.all_messages().iter().any(|m| {
        m.content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolResult { .. }))
    })
}

/// Keeps panics whose message is `expected` (a test's planned failures) out of the output;
/// any other panic is printed as usual.
pub(crate) fn expect_panics(expected: &'static str) {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied());
        if msg != Some(expected) {
            default_hook(info);
        }
    }));
}

/// How a test starts a child straight through a task service (see [`start_child`]).
pub(crate) struct Start {
    pub(crate) parent: forkhive_core::TaskId,
    pub(crate) description: String,
    pub(crate) gate: Option<forkhive_spawn::task::Gate>,
    pub(crate) progress: Arc<forkhive_spawn::task::Progress>,
    pub(crate) output: Option<Arc<forkhive_spawn::task::OutputFile>>,
    /// Where its `ChildStarted` and `Notified` go.
    pub(crate) events: Option<Arc<dyn EventSink>>,
}

impl Start {
    /// A child of `parent`, no gate, no output file.
    pub(crate) fn under(parent: forkhive_core::TaskId) -> Self {
        Self {
            parent,
            description: "child".to_owned(),
            gate: None,
            progress: Arc::default(),
            output: None,
            events: None,
        }
    }

    /// A child of a fresh, unregistered root.
    pub(crate) fn bare() -> Self {
        Self::under(forkhive_core::TaskId::generate(
            forkhive_core::TaskKind::Agent,
        ))
    }
}

/// Starts `agent` in the background under `service`, reporting to `queue`.
pub(crate) async fn start_child(
    service: &Arc<forkhive_spawn::task::TaskService>,
    agent: forkhive_spawn::runtime::Agent,
    queue: &forkhive_spawn::runtime::PendingQueue,
    start: Start,
) -> forkhive_core::TaskId {
    service
        .launch(forkhive_spawn::task::Launch {
            agent,
            first: forkhive_spawn::task::FirstInput::Prompt("work".into()),
            description: start.description,
            tool_use_id: None,
            parent_queue: queue.clone(),
            progress: start.progress,
            output: start.output,
            slot: service.acquire(start.parent).unwrap(),
            gate: start.gate,
            events: start.events,
            ledger: None,
            parent_turn: 0,
            deadline: None,
            name: None,
            worktree: None,
        })
        .await
        .unwrap()
}

/// The task notifications in `agent`'s conversation, in order.
#[allow(dead_code)]
pub(crate) fn notifications(
    agent: &forkhive_spawn::runtime::Agent,
) -> Vec<forkhive_core::TaskNotification> {
    agent
        .params()
        .messages()
        .iter()
        .flat_map(|m| forkhive_core::notification::find_notifications(m).unwrap())
        .collect()
}

/// Whether `r` is the parent's request: the tests' parents all say "You are the parent.".
pub(crate) fn is_parent(r: &Request) -> bool {
    r.prefix
        .system_prompt()
        .first()
        .is_some_and(|s| s == "You are the parent.")
}

/// The Redis server the Redis tests run against (`scripts/redis-server.sh start`, which
/// `scripts/test.sh` runs): `None`, said, without `FORKHIVE_REDIS_URL`; under `CI=true` its
/// absence is a failure.
pub(crate) fn redis_url() -> Option<String> {
    match std::env::var("FORKHIVE_REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but FORKHIVE_REDIS_URL is not set: scripts/redis-server.sh start")
        }
        Err(_) => {
            eprintln!("skipped: no FORKHIVE_REDIS_URL (run scripts/redis-server.sh start)");
            None
        }
    }
}

/// A key prefix of this run's own, so runs and tests never share keys.
pub(crate) fn key_prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t{}-{test}", nanos % 1_000_000_000_000)
}

/// A model that answers `done: <prompt>` (the first message's text) after `delay`: a pool
/// worker's agents in the Redis tests.
pub(crate) fn answers_done(delay: Duration) -> Arc<dyn Backend> {
    Arc::new(forkhive_transport::ScriptedBackend::from_async_fn(
        move |r: Request| async move {
            tokio::time::sleep(delay).await;
            let prompt = r
                .all_messages()
                .first()
                .map(|m| m.text())
                .unwrap_or_default();
            Ok(Response::say(format!("done: {prompt}")))
        },
    ))
}

/// The conversation of `r` as one debug string (what a scripted model looks for).
#[allow(dead_code)]
pub(crate) fn text_of(r: &Request) -> String {
    r.all_messages()
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many teammates' idle notices `text` (a request's [`text_of`]) holds. Counted by a field
/// only a notice has: a teammate's start result mentions `idle_notification` too.
pub(crate) fn idle_notices(text: &str) -> usize {
    text.matches("idleReason").count()
}

/// How many of the assistant's tool calls so far have `needle` in their input (what the agent
/// has asked, as opposed to what it was told).
#[allow(dead_code)]
pub(crate) fn called(r: &Request, needle: &str) -> usize {
    r.all_messages()
        .iter()
        .flat_map(|m| {
            m.tool_uses()
                .map(|(_, _, input)| input.as_str().contains(needle))
        })
        .filter(|hit| *hit)
        .count()
}

/// Sleeps `d`, if it is not zero (an operation without a delay answers at once, as in memory).
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// A registry in memory that answers late, as a networked store under load does: a delay
/// before an operation lands (`end`, `roll_up`: the record is as it was until then), or after
/// it has landed, before its answer (`create`, `running`, `roll_up_answer`).
#[derive(Debug, Default)]
pub(crate) struct SlowRegistry {
    pub(crate) inner: forkhive_spawn::task::MemoryTaskRegistry,
    /// After `create`.
    pub(crate) create: Duration,
    /// After the move to `running`.
    pub(crate) running: Duration,
    /// Before a move to a terminal state.
    pub(crate) end: Duration,
    /// Before the usage roll-up.
    pub(crate) roll_up: Duration,
    /// After the usage roll-up has landed.
    pub(crate) roll_up_answer: Duration,
    /// Refuses every move to `running` (an error; the record stays `created`).
    pub(crate) refuse_running: bool,
}

#[async_trait]
impl forkhive_spawn::task::TaskRegistry for SlowRegistry {
    async fn create(&self, r: forkhive_spawn::task::TaskRecord) -> forkhive_spawn::Result<()> {
        let out = self.inner.create(r).await;
        pause(self.create).await;
        out
    }
    async fn transition(
        &self,
        id: &forkhive_core::TaskId,
        to: forkhive_spawn::task::TaskState,
    ) -> forkhive_spawn::Result<forkhive_spawn::task::TaskState> {
        if to.is_terminal() {
            pause(self.end).await;
        }
        if to == forkhive_spawn::task::TaskState::Running && self.refuse_running {
            return Err(forkhive_spawn::Error::Task {
                id: *id,
                message: "the store is read-only".to_owned(),
            });
        }
        let out = self.inner.transition(id, to).await;
        if to == forkhive_spawn::task::TaskState::Running {
            pause(self.running).await;
        }
        out
    }
    async fn reopen(
        &self,
        id: &forkhive_core::TaskId,
    ) -> forkhive_spawn::Result<forkhive_spawn::task::TaskState> {
        self.inner.reopen(id).await
    }
    async fn roll_up(&self, id: &forkhive_core::TaskId, u: Usage) -> forkhive_spawn::Result<()> {
        pause(self.roll_up).await;
        let out = self.inner.roll_up(id, u).await;
        pause(self.roll_up_answer).await;
        out
    }
    async fn mark_stalled(&self, id: &forkhive_core::TaskId) -> forkhive_spawn::Result<()> {
        self.inner.mark_stalled(id).await
    }
    async fn get(&self, id: &forkhive_core::TaskId) -> Option<forkhive_spawn::task::TaskRecord> {
        self.inner.get(id).await
    }
    async fn children(&self, p: &forkhive_core::TaskId) -> Vec<forkhive_spawn::task::TaskRecord> {
        self.inner.children(p).await
    }
    async fn descendants_usage(&self, id: &forkhive_core::TaskId) -> Usage {
        self.inner.descendants_usage(id).await
    }
}

/// A lead ("You are the parent.") with `tools` in `team`, its turns limited to 40.
pub(crate) async fn lead_in(
    team: &Arc<forkhive_spawn::team::Team>,
    b: Arc<Brain>,
    tools: forkhive_spawn::tool::ToolPool,
) -> forkhive_spawn::runtime::Agent {
    forkhive_spawn::runtime::Agent::builder(b)
        .model("m")
        .system_prompt("You are the parent.")
        .tools(tools)
        .extension(Arc::clone(team))
        .limits(forkhive_spawn::runtime::Limits::default().with_max_turns(Some(40)))
        .build()
        .await
        .unwrap()
}

/// The Agent call that starts teammate `name` of team `review` (a `worker`).
pub(crate) fn teammate(name: &str) -> String {
    format!(
        r#"{{"description":"{name}","prompt":"task for {name}","subagent_type":"worker","name":"{name}","team_name":"review"}}"#
    )
}

/// A model whose lead starts teammate `alice`, then says "ok"; teammates answer `answer`.
pub(crate) fn lead_of_alice(answer: &'static str) -> Arc<Brain> {
    brain(move |r| {
        if !is_parent(r) {
            return Plan::Reply(say(answer));
        }
        if r.all_messages().len() == 1 {
            return Plan::Reply(calls(&[("a1", "Agent", &teammate("alice"))]));
        }
        Plan::Reply(say("ok"))
    })
}

/// A TCP proxy to Redis that can be cut: while it is cut nothing passes either way (a network
/// partition: connections stay open, in silence), and what was sent meanwhile passes once it
/// heals.
pub(crate) struct Partition {
    /// The proxy's URL: the Redis URL with the proxy's address.
    pub(crate) url: String,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Partition {
    /// A proxy to the Redis at `url`, open.
    pub(crate) async fn to(url: &str) -> Self {
        let rest = url.strip_prefix("redis://").unwrap();
        let authority = rest.split('/').next().unwrap();
        let target = authority.rsplit('@').next().unwrap().to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, open) = tokio::sync::watch::channel(false);
        let to = target.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&to).await else {
                    continue;
                };
                let ((cr, cw), (sr, sw)) = (client.into_split(), server.into_split());
                tokio::spawn(pipe(cr, sw, open.clone()));
                tokio::spawn(pipe(sr, cw, open.clone()));
            }
        });
        Self {
            url: url.replacen(&target, &format!("127.0.0.1:{port}"), 1),
            cut,
        }
    }

    /// Cuts it (`true`) or heals it (`false`).
    pub(crate) fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Copies `from` to `to` while the partition is open; holds what it read while it is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !*c).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// How many letters `inbox` of `mail` holds once it is empty, or after 2 s (acknowledgements
/// land on tasks of their own, a moment after what they follow).
pub(crate) async fn stored_once_drained(
    mail: &dyn forkhive_spawn::mailbox::Mailbox,
    inbox: &forkhive_spawn::mailbox::Inbox,
) -> usize {
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = mail.stored(inbox).await.unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    left
}
