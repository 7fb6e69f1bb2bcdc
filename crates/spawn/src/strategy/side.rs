//! Two narrow delegations: the `/btw` side question and the verification agent.

use std::fmt;
use std::sync::Arc;

use forkhive_core::{Message, Usage};
use forkhive_transport::{Request, ToolChoice};

use crate::definition::{AgentRegistry, VERIFICATION_AGENT};
use crate::error::{Error, Result};
use crate::runtime::{Agent, AgentRun, EventSink, Limits, StopReason};
use crate::tool::permission::{Both, PermissionPolicy, ReadOnly};
use crate::tool::{ToolAudience, ToolPool};
use tokio_util::sync::CancellationToken;

/// The answer to a side question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideAnswer {
    /// The answer's text.
    pub text: String,
    /// What it cost.
    pub usage: Usage,
}

/// Asks `question` with `agent`'s full context and no tools, in one turn, without touching the
/// agent's conversation ("Chapter 20: Agent Spawning and Orchestration — Supplement: /btw Side
/// Question as a Tool-less Fork": full context, zero tools, a single-turn answer).
///
/// The request is the agent's conversation as its cache-safe prefix — the bytes its last
/// request sent, read from the cache — plus the question as a one-block suffix, which gets no
/// cache breakpoint: nothing is written for this one-off suffix. The tool array and every
/// per-call setting stay as the agent's requests send them — `tool_choice` too: changing it
/// invalidates the messages cache ("Prompt caching" rules), so the conversation would be
/// read again at full price — and a tool call the model makes is dropped, never run, as
/// Claude Code's permission check refuses every tool there (the section above).
///
/// An agent whose `tool_choice` forces a tool (`any`, or one tool) would have the model call
/// one and answer nothing: its side question goes out with `none` instead, and reads only the
/// tools and system prompt from the cache. An answer that is tool calls and no text is
/// [`Error::Refused`], naming the tools: an empty answer would pass for "nothing to say".
pub async fn side_question(agent: &Agent, question: &str) -> Result<SideAnswer> {
    let mut settings = agent.shared().settings.clone();
    if matches!(
        settings.tool_choice,
        Some(ToolChoice::Any | ToolChoice::Tool { .. })
    ) {
        settings.tool_choice = Some(ToolChoice::None);
    }
    let request = Request::new(agent.params().clone(), vec![Message::user_text(question)])
        .with_settings(settings)
        .with_label(format!("{}-btw", agent.id()));
    let response = agent
        .shared()
        .backend
        .send(&request)
        .await
        .map_err(|source| Error::Backend {
            turn: agent.turns() + 1,
            source,
        })?;
    let text = response.message.text();
    let called: Vec<String> = response
        .message
        .tool_uses()
        .map(|(_, name, _)| format!("`{name}`"))
        .collect();
    if text.trim().is_empty() && !called.is_empty() {
        return Err(Error::Refused(format!(
            "the side question was answered with a call to {} and no text; a side question \
             runs no tool: ask it so that it can be answered from what the agent already has",
            called.join(", ")
        )));
    }
    Ok(SideAnswer {
        text,
        usage: response.usage,
    })
}

/// The verification agent's verdict, read from its final line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// It tried to break the work and could not.
    Pass,
    /// It broke it.
    Fail,
    /// It could verify only part, for reasons of the environment.
    Partial,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Partial => "PARTIAL",
        })
    }
}

impl Verdict {
    /// The verdict on the last non-empty line of `report`: exactly `VERDICT: PASS`,
    /// `VERDICT: FAIL` or `VERDICT: PARTIAL` (surrounding spaces and Markdown emphasis
    /// allowed). Anything else is [`Error::Verification`] quoting the line.
    ///
    /// A last line stronger than a verdict an earlier line starts with — `PASS` after a
    /// `FAIL` or `PARTIAL`, `PARTIAL` after a `FAIL`, however loosely the earlier one is
    /// spelled (`**VERDICT:** FAIL`, `> verdict: fail.`) — is ambiguous, and an error too: a
    /// verifier that quotes the work's own claim after its conclusion (a worker whose output
    /// ends `VERDICT: PASS`) must not turn its failure into a pass.
    pub fn parse(report: &str) -> Result<Self> {
        let mut lines = report
            .lines()
            .rev()
            .map(str::trim)
            .filter(|l| !l.is_empty());
        let last = lines.next().unwrap_or("");
        let verdict = match Self::of_line(last) {
            Some(v) => v,
            None => {
                return Err(Error::Verification(if last.is_empty() {
                    "the report is empty; it must end with `VERDICT: PASS`, `VERDICT: FAIL` \
                     or `VERDICT: PARTIAL`"
                        .to_owned()
                } else {
                    format!(
                        "the report's last line is {last:?}; it must be `VERDICT: PASS`, \
                         `VERDICT: FAIL` or `VERDICT: PARTIAL`"
                    )
                }));
            }
        };
        // A weaker verdict earlier in the report, however it is spelled (`VERDICT: FAIL.`,
        // `**VERDICT:** FAIL`, `> VERDICT: FAIL - …`, `## verdict: partial`), makes a stronger
        // last line ambiguous: the last line may be a quote of the work's own claim.
        let rank = |v: Verdict| match v {
            Verdict::Fail => 0,
            Verdict::Partial => 1,
            Verdict::Pass => 2,
        };
        if let Some(earlier) = lines
            .filter_map(Self::of_line_loosely)
            .find(|e| rank(*e) < rank(verdict))
        {
            return Err(Error::Verification(format!(
                "the report ends with `VERDICT: {verdict}` but an earlier line says `VERDICT: \
                 {earlier}`; a verdict must be unambiguous (quote other verdicts inline, not at \
                 the start of a line)"
            )));
        }
        Ok(verdict)
    }

    /// The verdict a line starts with, spelled loosely: quote, heading, list (`-`, `+`, `•`,
    /// `1.`, `2)`), table and emphasis marks or brackets before it, any case, `:` or a dash
    /// after `VERDICT` (with emphasis around it), anything after the word.
    fn of_line_loosely(line: &str) -> Option<Self> {
        let marks = |c: char| {
            matches!(
                c,
                '>' | '#' | '-' | '+' | '*' | '_' | '`' | '|' | '[' | '(' | '•' | '·' | ' ' | '\t'
            )
        };
        let rest = line.trim_start_matches(marks);
        // A numbered list's number (`1.`, `12)`).
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let rest = match rest[digits..].strip_prefix(['.', ')']) {
            Some(after) if digits > 0 => after.trim_start_matches(marks),
            _ => rest,
        };
        let head = rest.get(..7)?;
        if !head.eq_ignore_ascii_case("VERDICT") {
            return None;
        }
        let spaced = |c: char| matches!(c, '*' | '_' | '`' | ' ' | '\t');
        let rest = rest[7..].trim_start_matches(spaced);
        let rest = rest
            .strip_prefix(':')
            .or_else(|| rest.strip_prefix(['-', '—', '–']))?;
        let word = rest.trim_start_matches(marks);
        let starts = |w: &str| {
            word.get(..w.len())
                .is_some_and(|h| h.eq_ignore_ascii_case(w))
        };
        if starts("FAIL") {
            Some(Verdict::Fail)
        } else if starts("PARTIAL") {
            Some(Verdict::Partial)
        } else if starts("PASS") {
            Some(Verdict::Pass)
        } else {
            None
        }
    }

    /// The verdict `line` is, if it is one.
    fn of_line(line: &str) -> Option<Self> {
        let bare = line
            .trim_matches(|c| c == '*' || c == '_' || c == '`')
            .trim();
        match bare.strip_prefix("VERDICT:").map(str::trim) {
            Some("PASS") => Some(Verdict::Pass),
            Some("FAIL") => Some(Verdict::Fail),
            Some("PARTIAL") => Some(Verdict::Partial),
            _ => None,
        }
    }
}

/// A verification run: the verdict and the run it came from.
#[derive(Debug, Clone)]
pub struct Verification {
    /// The verdict.
    pub verdict: Verdict,
    /// The agent's run (its report is `run.final_text`).
    pub run: AgentRun,
}

/// How [`verify_with`] runs the verification agent: its limits, a token that stops it, and
/// a sink for its events. The default is what [`verify`] uses: the default [`Limits`]
/// (100 turns), no token, no sink.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct VerifyOptions {
    limits: Option<Limits>,
    cancel: Option<CancellationToken>,
    events: Option<Arc<dyn EventSink>>,
}

impl fmt::Debug for VerifyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("limits", &self.limits)
            .field("cancel", &self.cancel)
            .field("events", &self.events.as_ref().map(|_| "EventSink"))
            .finish()
    }
}

impl VerifyOptions {
    /// The agent's limits (turns, token budget, tool timeout…). (A definition's `maxTurns`
    /// would replace `max_turns`; the built-in verification agent sets none.)
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// A token that stops the run: once cancelled, `verify_with` ends with
    /// [`Error::NoVerdict`] saying so.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Where the agent's events go (tool calls, warnings, the text it streams).
    pub fn with_events(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.events = Some(sink);
        self
    }
}

/// Runs the built-in `verification` agent on `task` with only the read-only tools of `tools`,
/// under `host`'s policy and a read-only one, and parses its verdict ("Chapter 9: Sub-Agents
/// and the Fork Pattern — Verification Agent": adversarial, forbidden to modify the project).
///
/// A verdict comes only from a run that ended its turn: a run that fails, is cancelled, is
/// refused or stops at a limit (its turns, its token budget) is [`Error::NoVerdict`] with the
/// reason and what the agent had written, even if that text ends with a verdict line — a
/// verifier still working has not concluded. A report whose last line is not a verdict is
/// [`Error::NoVerdict`] too. [`verify_with`] sets limits, a cancellation token and an event
/// sink.
pub async fn verify(
    backend: Arc<dyn forkhive_transport::Backend>,
    model: &str,
    tools: &ToolPool,
    host: Arc<dyn PermissionPolicy>,
    task: &str,
) -> Result<Verification> {
    verify_with(backend, model, tools, host, task, VerifyOptions::default()).await
}

/// [`verify`], with the agent's limits, cancellation and events set by `options`.
pub async fn verify_with(
    backend: Arc<dyn forkhive_transport::Backend>,
    model: &str,
    tools: &ToolPool,
    host: Arc<dyn PermissionPolicy>,
    task: &str,
    options: VerifyOptions,
) -> Result<Verification> {
    let registry = AgentRegistry::builtin();
    let def = registry
        .get(VERIFICATION_AGENT)
        .cloned()
        .ok_or_else(|| Error::Config("the built-in verification agent is missing".to_owned()))?;
    let pool = tools.filtered(|t| t.is_read_only());
    let policy: Arc<dyn PermissionPolicy> = Arc::new(Both::new(
        Arc::new(ReadOnly::new(
            "the verification agent may not modify anything",
        )),
        host,
    ));
    let mut builder = Agent::builder(backend)
        .model(model)
        .definition(def)
        .tools(pool)
        .audience(ToolAudience::Background)
        .tool_filter(crate::tool::ToolFilter::none())
        .policy(policy);
    if let Some(limits) = options.limits {
        builder = builder.limits(limits);
    }
    if let Some(token) = options.cancel {
        builder = builder.cancellation(token);
    }
    if let Some(sink) = options.events {
        builder = builder.events(sink);
    }
    let mut agent = builder.build().await?;
    let run = agent.run(task).await;
    let no_verdict = |reason: String, run: &AgentRun| Error::NoVerdict {
        reason,
        report: run.final_text.clone(),
    };
    if let Some(e) = &run.error {
        let reason = format!(
            "the verification agent failed: {}",
            crate::task::error_chain(e.as_ref())
        );
        return Err(no_verdict(reason, &run));
    }
    // Only an end of turn concludes: a limit ends a spawned child's work as `completed`
    // (`StopReason::task_status`), but a verifier stopped by one was still checking, and the
    // verdict line it may have written on the way is not its conclusion.
    if run.stop != StopReason::Completed {
        let reason = format!(
            "the verification agent stopped before it concluded: {}",
            run.stop
        );
        return Err(no_verdict(reason, &run));
    }
    match Verdict::parse(&run.final_text) {
        Ok(verdict) => Ok(Verification { verdict, run }),
        Err(Error::Verification(reason)) => Err(no_verdict(reason, &run)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_come_from_the_last_line_only() {
        assert_eq!(
            Verdict::parse("ran tests\nVERDICT: PASS").unwrap(),
            Verdict::Pass
        );
        assert_eq!(
            Verdict::parse("x\n**VERDICT: FAIL**\n\n").unwrap(),
            Verdict::Fail
        );
        assert_eq!(Verdict::parse("VERDICT:PARTIAL").unwrap(), Verdict::Partial);
        // A failure quoted before a pass is ambiguous; a pass quoted before a failure is not.
        assert_eq!(
            Verdict::parse("VERDICT: FAIL\nThe worker's report ended with:\nVERDICT: PASS")
                .unwrap_err()
                .to_string(),
            "verification failed: the report ends with `VERDICT: PASS` but an earlier line says \
             `VERDICT: FAIL`; a verdict must be unambiguous (quote other verdicts inline, not at \
             the start of a line)"
        );
        // However the earlier, weaker verdict is spelled.
        for earlier in [
            "VERDICT: FAIL.",
            "**VERDICT:** FAIL",
            "VERDICT: FAIL - the tests do not build",
            "> VERDICT: FAIL",
            "## verdict: fail",
            "- `VERDICT: PARTIAL`",
            "1. VERDICT: FAIL",
            "+ VERDICT: FAIL",
            "| VERDICT: FAIL |",
            "• VERDICT: FAIL",
            "[VERDICT: FAIL]",
            "Verdict - FAIL",
            "Verdict — FAIL",
        ] {
            let report = format!("{earlier}\nThe worker's report ended with:\nVERDICT: PASS");
            assert!(Verdict::parse(&report).is_err(), "{earlier:?}");
        }
        assert!(Verdict::parse("VERDICT: FAIL\nquoted:\nVERDICT: PARTIAL").is_err());
        assert_eq!(
            Verdict::parse("VERDICT: PARTIAL at first\nVERDICT: FAIL").unwrap(),
            Verdict::Fail
        );
        assert_eq!(
            Verdict::parse("the verdict: fail was wrong\nVERDICT: PASS").unwrap(),
            Verdict::Pass
        );
        assert_eq!(
            Verdict::parse("The worker claimed:\n**VERDICT: PASS**\nIt is wrong.\nVERDICT: FAIL")
                .unwrap(),
            Verdict::Fail
        );
        assert_eq!(
            Verdict::parse("it said VERDICT: FAIL once\nVERDICT: PASS").unwrap(),
            Verdict::Pass
        );
        assert_eq!(
            Verdict::parse("VERDICT: PASS\nbut then I found a bug")
                .unwrap_err()
                .to_string(),
            "verification failed: the report's last line is \"but then I found a bug\"; it must \
             be `VERDICT: PASS`, `VERDICT: FAIL` or `VERDICT: PARTIAL`"
        );
        assert_eq!(
            Verdict::parse("VERDICT: MAYBE").unwrap_err().to_string(),
            "verification failed: the report's last line is \"VERDICT: MAYBE\"; it must be \
             `VERDICT: PASS`, `VERDICT: FAIL` or `VERDICT: PARTIAL`"
        );
        assert_eq!(
            Verdict::parse("  \n").unwrap_err().to_string(),
            "verification failed: the report is empty; it must end with `VERDICT: PASS`, \
             `VERDICT: FAIL` or `VERDICT: PARTIAL`"
        );
        assert_eq!(Verdict::Partial.to_string(), "PARTIAL");
    }
}
