//! Permission requests across hosts (`permissionMode: bubble`): a pool worker's agent asks,
//! the coordinator's process — where the user is — decides, and the answer comes back.
//!
//! "Chapter 20: Agent Spawning and Orchestration — 20.9 Bridge": permission requests are
//! proxied back to where the user is. On the worker, [`RemoteAsk`] is the agent's policy: it
//! adds the request to the parent's `asks:<parent>` stream and blocks on the one-shot list
//! `answer:<id>`. On the coordinator, the parent's [`Delivery`](super::Delivery) reads the
//! stream, asks the parent agent's own policy, and answers — only while the request is still
//! there, so a request the worker gave up on (timed out, cancelled) is never answered late.
//! Every failure denies: a worker never runs a call nobody allowed.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use forkhive_core::{TaskId, ToolDefinition};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Pool;
use crate::base::context::{AgentContext, AgentKind, QuerySource};
use crate::tool::{
    PermissionDecision, PermissionPolicy, PermissionRequest, Tool, ToolContext, ToolOutput,
};

/// How long a worker's agent waits for the coordinator's answer before the call is denied.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(300);

/// How long an answer waits for its asker.
const ANSWER_TTL: Duration = Duration::from_secs(60);

/// The answer, as it travels.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
enum Answer {
    Allow,
    Deny { reason: String },
    Input { input: serde_json::Value },
}

/// KEYS: asks, answer, kids. ARGV: entry, answer JSON, ttl ms, task. Answers only a request
/// still asked, by one of the parent's own tasks (any other is dropped unanswered).
const ANSWER: &str = r"
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('SISMEMBER', KEYS[3], ARGV[4]) == 0 then return -1 end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
";

/// A pool worker's agent's policy when its job asks to bubble: every decision is made by the
/// job's parent, in the coordinator's process.
pub struct RemoteAsk {
    pool: Pool,
    task: TaskId,
    parent: TaskId,
    cancel: CancellationToken,
    timeout: Duration,
}

impl fmt::Debug for RemoteAsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteAsk")
            .field("task", &self.task)
            .field("parent", &self.parent)
            .finish_non_exhaustive()
    }
}

impl RemoteAsk {
    /// Asks `parent`'s process about `task`'s calls, giving up (denying) after `timeout` or
    /// when `cancel` is cancelled.
    pub(crate) fn new(
        pool: Pool,
        task: TaskId,
        parent: TaskId,
        cancel: CancellationToken,
        timeout: Duration,
    ) -> Self {
        Self {
            pool,
            task,
            parent,
            cancel,
            timeout,
        }
    }

    async fn ask(&self, request: &PermissionRequest<'_>) -> Result<PermissionDecision, String> {
        let asks = self.pool.task_key("asks", &self.parent);
        let input = serde_json::to_string(request.input).map_err(|e| e.to_string())?;
        let mut conn = self.pool.conn().await.map_err(|e| e.to_string())?;
        let entry: String = redis::cmd("XADD")
            .arg(&asks)
            .arg("*")
            .arg("task")
            .arg(self.task.to_string())
            .arg("tool")
            .arg(request.tool_name())
            .arg("read_only")
            .arg(if request.tool.is_read_only() {
                "1"
            } else {
                "0"
            })
            .arg("input")
            .arg(&input)
            .arg("tool_use_id")
            .arg(request.tool_use_id)
            // Who asks, so the parent's policy sees the asker as a local child's policy would.
            .arg("kind")
            .arg(request.agent.kind().as_str())
            .arg("agent_type")
            .arg(request.agent.agent_type().unwrap_or(""))
            .arg("query_source")
            .arg(request.agent.query_source().as_str())
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        // The answer's key is the request's entry, which only the stream gives out.
        let answer_key = answer_key(&self.pool, &self.parent, &entry);
        // A blocking pop on a connection of its own (no response timeout: redis-rs#1236),
        // bounded on this side too (a connection that died in silence).
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let waited = async {
            let mut blocking = self
                .pool
                .h
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("BLPOP")
                .arg(&answer_key)
                .arg(self.timeout.as_secs_f64())
                .query_async::<Option<(String, String)>>(&mut blocking)
                .await
        };
        let got = tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err("the task was cancelled while it waited".to_owned()),
            r = tokio::time::timeout(self.timeout + Duration::from_secs(2), waited) => match r {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Ok(None),
            },
        };
        let answer = match got {
            Ok(Some((_, json))) => json,
            other => {
                // Withdrawn: an answer after this is never given.
                let _: redis::RedisResult<i64> = redis::cmd("XDEL")
                    .arg(&asks)
                    .arg(&entry)
                    .query_async(&mut conn)
                    .await;
                return Err(match other {
                    Ok(_) => format!(
                        "no answer from the coordinator's process within {} s",
                        self.timeout.as_secs()
                    ),
                    Err(e) => e,
                });
            }
        };
        match serde_json::from_str::<Answer>(&answer) {
            Ok(Answer::Allow) => Ok(PermissionDecision::Allow),
            Ok(Answer::Deny { reason }) => Ok(PermissionDecision::deny(reason)),
            Ok(Answer::Input { input }) => Ok(PermissionDecision::AllowWithInput(input)),
            Err(e) => Err(format!("an answer that is not one ({e})")),
        }
    }
}

#[async_trait]
impl PermissionPolicy for RemoteAsk {
    async fn check(&self, request: PermissionRequest<'_>) -> PermissionDecision {
        match self.ask(&request).await {
            Ok(d) => d,
            Err(why) => PermissionDecision::deny(format!(
                "permission for {} was asked of the coordinator and not given: {why}",
                request.tool_name()
            )),
        }
    }
}

/// A worker's tool as the coordinator's policy sees it: its name and whether it only reads.
#[derive(Debug)]
struct Remote {
    definition: ToolDefinition,
    read_only: bool,
}

#[async_trait]
impl Tool for Remote {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    async fn call(&self, _input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        ToolOutput::error("this tool runs on a pool worker")
    }
}

/// Answers the parent's asks with `policy` until cancelled (the parent's delivery runs it).
pub(super) async fn serve(
    pool: Pool,
    parent: TaskId,
    policy: Arc<dyn crate::tool::PermissionPolicy>,
) {
    let asks = pool.task_key("asks", &parent);
    let mut answering: JoinSet<String> = JoinSet::new();
    let mut open: HashSet<String> = HashSet::new();
    loop {
        while let Some(done) = answering.try_join_next() {
            if let Ok(entry) = done {
                open.remove(&entry);
            }
        }
        let look = async {
            let mut conn = pool.conn().await?;
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(&asks)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .map_err(|e| pool.fail("XRANGE", e))?;
            Ok::<_, crate::Error>(reply)
        };
        let reply = match look.await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(parent = %parent, "reading permission requests: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let last = reply
            .ids
            .last()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        for e in &reply.ids {
            if !open.insert(e.id.clone()) {
                continue;
            }
            let (pool, policy, parent) = (pool.clone(), Arc::clone(&policy), parent);
            let e = e.clone();
            answering.spawn(async move {
                answer(&pool, &parent, &*policy, &e).await;
                e.id
            });
        }
        // Until a new request arrives (or half a minute passes).
        let waited = crate::mailbox::redis_wait_on_stream(
            &pool.h.client,
            &asks,
            Duration::from_secs(30),
            || {
                let (pool, asks, last) = (pool.clone(), asks.clone(), last.clone());
                async move {
                    let mut conn = pool.conn().await?;
                    let newest: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
                        .arg(&asks)
                        .arg("+")
                        .arg("-")
                        .arg("COUNT")
                        .arg(1)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| pool.fail("XREVRANGE", e))?;
                    let now = newest
                        .ids
                        .first()
                        .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
                    let moved = now != last;
                    Ok((now, moved))
                }
            },
            |what, e| pool.fail(what, e),
        )
        .await;
        if let Err(e) = waited {
            tracing::warn!(parent = %parent, "waiting for permission requests: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Where the answer to the request at `entry` of `parent`'s stream goes.
fn answer_key(pool: &Pool, parent: &TaskId, entry: &str) -> String {
    pool.key(&format!("answer:{parent}:{entry}"))
}

/// One request: the parent's policy decides; the answer is given if it is still asked.
async fn answer(
    pool: &Pool,
    parent: &TaskId,
    policy: &dyn PermissionPolicy,
    e: &redis::streams::StreamId,
) {
    let field = |k: &str| e.get::<String>(k).unwrap_or_default();
    let tool = field("tool");
    // Asked longer ago than a worker waits: it has given up (denied); nobody to answer.
    let at: u64 =
        e.id.split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
    let timeout_ms = u64::try_from(ASK_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
    if super::now_ms().saturating_sub(at) > timeout_ms {
        let _ = drop_entry(pool, parent, &e.id).await;
        return;
    }
    let task = field("task").parse::<TaskId>();
    let decision = match (
        ToolDefinition::new(
            tool.clone(),
            "a tool on a pool worker",
            r#"{"type":"object"}"#,
        ),
        serde_json::from_str::<serde_json::Value>(&field("input")),
        &task,
    ) {
        (Ok(definition), Ok(input), Ok(task)) => {
            // `read_only` is the worker's word (Redis and its workers are trusted).
            let remote = Remote {
                definition,
                read_only: field("read_only") == "1",
            };
            let cx = asker(&field, *task, *parent);
            let tool_use_id = field("tool_use_id");
            // A policy that panics denies the call, as in a local tool round, instead of
            // taking this answerer down (the worker would wait out its timeout).
            let d = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
                policy
                    .check(PermissionRequest {
                        tool: &remote,
                        input: &input,
                        agent: &cx,
                        tool_use_id: &tool_use_id,
                    })
                    .await
            }))
            .await;
            match d {
                Ok(PermissionDecision::Allow) => Answer::Allow,
                Ok(PermissionDecision::Deny { reason }) => Answer::Deny { reason },
                Ok(PermissionDecision::AllowWithInput(input)) => Answer::Input { input },
                Err(panic) => Answer::Deny {
                    reason: format!(
                        "the permission policy panicked while checking `{tool}`: {}; the call \
                         did not run",
                        crate::tool::orchestrate::panic_message(panic.as_ref())
                    ),
                },
            }
        }
        _ => Answer::Deny {
            reason: "a malformed permission request".to_owned(),
        },
    };
    let Ok(json) = serde_json::to_string(&decision) else {
        return;
    };
    let task = task.map(|t| t.to_string()).unwrap_or_default();
    let r = async {
        let mut conn = pool.conn().await?;
        redis::Script::new(ANSWER)
            .key(pool.task_key("asks", parent))
            .key(answer_key(pool, parent, &e.id))
            .key(pool.task_key("kids", parent))
            .arg(&e.id)
            .arg(&json)
            .arg(ANSWER_TTL.as_millis().to_string())
            .arg(&task)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(|err| pool.fail("answering a permission request", err))
    }
    .await;
    match r {
        Ok(-1) => {
            tracing::warn!(parent = %parent, "a permission request from `{task}`, not one of its tasks, was dropped")
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(parent = %parent, "answering a permission request: {err}"),
    }
}

/// The context of the agent that asked, from the request's fields: its kind (a teammate or
/// a subagent: a pool runs nothing else), its type and its query source, as the worker
/// wrote them. A request from an older worker, without them, is a default subagent's.
fn asker(field: &impl Fn(&str) -> String, task: TaskId, parent: TaskId) -> AgentContext {
    let kind = match field("kind").as_str() {
        "teammate" => AgentKind::Teammate,
        _ => AgentKind::Subagent,
    };
    // Never the main conversation's: a pool task is always someone's child.
    let source = match field("query_source") {
        s if s.is_empty() || s == QuerySource::main().as_str() => QuerySource::default_agent(),
        s => QuerySource::from_label(s),
    };
    let cx = AgentContext::new(task, kind, source).with_lineage(Some(parent), 1);
    match field("agent_type") {
        t if t.is_empty() => cx,
        t => cx.with_agent_type(t),
    }
}

async fn drop_entry(pool: &Pool, parent: &TaskId, entry: &str) -> crate::Result<()> {
    let mut conn = pool.conn().await?;
    redis::cmd("XDEL")
        .arg(pool.task_key("asks", parent))
        .arg(entry)
        .query_async::<i64>(&mut conn)
        .await
        .map(|_| ())
        .map_err(|e| pool.fail("XDEL", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolConfig;
    use forkhive_core::TaskKind;

    /// A tool that is not read-only, to ask about.
    #[derive(Debug)]
    struct Writes(ToolDefinition);

    #[async_trait]
    impl Tool for Writes {
        fn definition(&self) -> &ToolDefinition {
            &self.0
        }
        fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
            false
        }
        fn is_read_only(&self) -> bool {
            false
        }
        async fn call(&self, _input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
            ToolOutput::text("written")
        }
    }

    /// The requests waiting in `parent`'s stream.
    async fn asked(pool: &Pool, parent: &TaskId) -> Vec<redis::streams::StreamId> {
        let mut conn = pool.conn().await.unwrap();
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(pool.task_key("asks", parent))
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        reply.ids
    }

    /// A worker's request that nobody answers is denied once its time is up, saying so, and
    /// withdrawn from the parent's stream; one whose task is cancelled while it waits is
    /// denied at once, saying so, and withdrawn too; and the coordinator, deciding a withdrawn
    /// request late, gives no answer (none is ever left for a later asker). Needs a Redis
    /// (`FORKHIVE_REDIS_URL`); says it was skipped without one.
    #[tokio::test]
    async fn a_request_given_up_is_denied_withdrawn_and_never_answered() {
        let Some(url) = crate::task::redis::test_redis_url() else {
            return;
        };
        let prefix = format!("ask{}", std::process::id());
        let pool = Pool::new(&url, &prefix, "p", PoolConfig::default()).unwrap();
        let (task, parent) = (
            TaskId::generate(TaskKind::Agent),
            TaskId::generate(TaskKind::Agent),
        );
        let tool = Writes(ToolDefinition::new("Write", "writes", r#"{"type":"object"}"#).unwrap());
        let input = serde_json::json!({"path": "a.txt"});
        let cx = AgentContext::new(task, AgentKind::Subagent, QuerySource::default_agent())
            .with_lineage(Some(parent), 1);
        let request = || PermissionRequest {
            tool: &tool,
            input: &input,
            agent: &cx,
            tool_use_id: "toolu_1",
        };

        // Nobody answers within its second.
        let ask = RemoteAsk::new(
            pool.clone(),
            task,
            parent,
            CancellationToken::new(),
            Duration::from_secs(1),
        );
        assert_eq!(
            ask.check(request()).await,
            PermissionDecision::deny(
                "permission for Write was asked of the coordinator and not given: no answer \
                 from the coordinator's process within 1 s"
            )
        );
        assert!(asked(&pool, &parent).await.is_empty(), "withdrawn");

        // Its task is cancelled while it waits (with the whole default time to wait).
        let cancel = CancellationToken::new();
        let ask = RemoteAsk::new(pool.clone(), task, parent, cancel.clone(), ASK_TIMEOUT);
        let cancelling = async {
            loop {
                if let Some(entry) = asked(&pool, &parent).await.pop() {
                    cancel.cancel();
                    return entry;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let (decision, entry) = tokio::join!(ask.check(request()), cancelling);
        assert_eq!(
            decision,
            PermissionDecision::deny(
                "permission for Write was asked of the coordinator and not given: the task was \
                 cancelled while it waited"
            )
        );
        assert!(asked(&pool, &parent).await.is_empty(), "withdrawn");

        // The coordinator decides it anyway (it read the request before it was withdrawn):
        // the task is one of its parent's, and still no answer is given.
        let mut conn = pool.conn().await.unwrap();
        let kids = pool.task_key("kids", &parent);
        let _: i64 = redis::cmd("SADD")
            .arg(&kids)
            .arg(task.to_string())
            .query_async(&mut conn)
            .await
            .unwrap();
        answer(&pool, &parent, &crate::tool::AllowAll, &entry).await;
        let answered: i64 = redis::cmd("EXISTS")
            .arg(answer_key(&pool, &parent, &entry.id))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(answered, 0, "no answer for a withdrawn request");
        let _: i64 = redis::cmd("DEL")
            .arg(&kids)
            .arg(pool.task_key("asks", &parent))
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    fn fields(pairs: &[(&str, &str)]) -> impl Fn(&str) -> String {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned().unwrap_or_default()
    }

    /// A teammate's request reaches the parent's policy as a teammate's, with its type and
    /// source; one without those fields (an older worker) as a default subagent's; a worker
    /// claiming to be the main agent, by kind or by source, is taken for a subagent.
    #[test]
    fn the_asker_is_rebuilt_as_the_worker_wrote_it() {
        let (task, parent) = (
            TaskId::generate(TaskKind::Agent),
            TaskId::generate(TaskKind::Agent),
        );
        let mate = asker(
            &fields(&[
                ("kind", "teammate"),
                ("agent_type", "reviewer"),
                ("query_source", "agent:custom:reviewer"),
            ]),
            task,
            parent,
        );
        assert_eq!(
            (
                mate.kind(),
                mate.agent_type(),
                mate.query_source().as_str(),
                mate.parent(),
                mate.depth(),
                mate.id()
            ),
            (
                AgentKind::Teammate,
                Some("reviewer"),
                "agent:custom:reviewer",
                Some(&parent),
                1,
                &task
            )
        );
        let old = asker(&fields(&[]), task, parent);
        assert_eq!(
            (old.kind(), old.agent_type(), old.query_source()),
            (AgentKind::Subagent, None, &QuerySource::default_agent())
        );
        let main = asker(
            &fields(&[("kind", "main"), ("query_source", "main")]),
            task,
            parent,
        );
        assert_eq!(
            (main.kind(), main.query_source()),
            (AgentKind::Subagent, &QuerySource::default_agent())
        );
    }
}
