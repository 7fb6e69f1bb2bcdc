//! Two narrow delegations: the `/btw` side question and the verification agent.

use std::fmt;
use std::sync::Arc;

use forkhive_core::{Message, Usage};
use forkhive_transport::{Request, ToolChoice};

use crate::definition::{AgentRegistry, VERIFICATION_AGENT};
use crate::error::{Error, Result};
use crate::runtime::{Agent, AgentRun};
use crate::tool::permission::{Both, PermissionPolicy, ReadOnly};
use crate::tool::{ToolAudience, ToolPool};

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
    pub fn parse(report: &str) -> Result<Self> {
        let last = report
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("");
        let bare = last
            .trim_matches(|c| c == '*' || c == '_' || c == '`')
            .trim();
        match bare.strip_prefix("VERDICT:").map(str::trim) {
            Some("PASS") => Ok(Verdict::Pass),
            Some("FAIL") => Ok(Verdict::Fail),
            Some("PARTIAL") => Ok(Verdict::Partial),
            _ => Err(Error::Verification(if last.is_empty() {
                "the report is empty; it must end with `VERDICT: PASS`, `VERDICT: FAIL` or \
                 `VERDICT: PARTIAL`"
                    .to_owned()
            } else {
                format!(
                    "the report's last line is {last:?}; it must be `VERDICT: PASS`, \
                     `VERDICT: FAIL` or `VERDICT: PARTIAL`"
                )
            })),
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

/// Runs the built-in `verification` agent on `task` with only the read-only tools of `tools`,
/// under `host`'s policy and a read-only one, and parses its verdict ("Chapter 9: Sub-Agents
/// and the Fork Pattern — Verification Agent": adversarial, forbidden to modify the project).
pub async fn verify(
    backend: Arc<dyn forkhive_transport::Backend>,
    model: &str,
    tools: &ToolPool,
    host: Arc<dyn PermissionPolicy>,
    task: &str,
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
    let mut agent = Agent::builder(backend)
        .model(model)
        .definition(def)
        .tools(pool)
        .audience(ToolAudience::Background)
        .tool_filter(crate::tool::ToolFilter::none())
        .policy(policy)
        .build()
        .await?;
    let run = agent.run(task).await;
    if let Some(e) = &run.error {
        return Err(Error::Verification(format!(
            "the verification agent failed: {}",
            crate::task::error_chain(e.as_ref())
        )));
    }
    // The same mapping a spawned child's end goes through (`StopReason::task_status`).
    if run.stop.task_status() != forkhive_core::TaskStatus::Completed {
        return Err(Error::Verification(format!(
            "the verification agent stopped early: {}",
            run.stop
        )));
    }
    let verdict = Verdict::parse(&run.final_text)?;
    Ok(Verification { verdict, run })
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
