//! Rebuilding an agent from its transcript.

use super::*;
use builder::BuilderParts;

/// What [`Agent::resume`] found in the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeReport {
    /// The transcript.
    pub path: PathBuf,
    /// How many messages were restored.
    pub messages: usize,
    /// How many model turns the transcript recorded.
    pub turns: usize,
    /// A last line cut by a crash, left out (and cut from the file before appending).
    pub dropped: Option<transcript::DroppedTail>,
    /// Tool calls the transcript left without results (a crash mid-round); each was answered
    /// with an error result before the agent goes on.
    pub interrupted_calls: usize,
}

impl Agent {
    /// Rebuilds an agent from its transcript, byte for byte, and goes on appending to it.
    ///
    /// `builder` supplies the backend, tools, policy and limits; the identity, model, system
    /// prompt, contexts, tool array and conversation come from the transcript, so the resumed
    /// agent's next request extends the cache it left: a model, system prompt or tool
    /// description the builder sets that differs is not used, and is a warning (`tracing`,
    /// and [`EventKind::Warning`] at the first run); a tool of the transcript's array that
    /// the builder's tools lack is [`Error::Config`]. A last line cut by a crash is left out
    /// (and cut from the file) and reported — unless the crash cut the messages the agent
    /// started with, which its header's fingerprint covers: that transcript is refused —
    /// and any other damage is [`Error::Transcript`].
    ///
    /// The file is read under its lock, which an agent's transcript writer holds for as long
    /// as the agent lives, and a dropped agent's until its last write is finished: that write
    /// is waited for (up to [`transcript::WRITER_WAIT`]), and the transcript of an agent that
    /// is still alive is refused with [`Error::TranscriptBusy`] — drop it first.
    pub async fn resume(builder: AgentBuilder, path: &Path) -> Result<(Agent, ResumeReport)> {
        // Read under the file's lock, which the writer keeps: a dropped agent's last write is
        // waited for, and a live one's transcript is refused (two writers would repeat
        // indexes). The header is checked before a cut-off last line is cut from the file.
        // Its children write beside its transcript, as they did before: a fork child's refers
        // to this one by its id in the same directory. (Absolute: the working directory may
        // change while it runs.)
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        if let Some(asked) = &builder.0.transcript_dir
            && !same_dir(asked, &dir).await
        {
            return Err(Error::Config(format!(
                "a resumed agent goes on in its transcript's directory {}, and its children \
                 write theirs beside it; the builder's transcript_dir {} is another (leave it \
                 unset)",
                dir.display(),
                asked.display()
            )));
        }
        let (t, writer, (cx, definition)) =
            TranscriptWriter::resume_checked(path, |t| identity(t, path)).await?;
        // A transcript renamed or copied away from `<agent id>.jsonl`: a fork child's reference
        // would name a file that is not this one, so its children write no transcripts.
        let named_by_id = path
            .file_stem()
            .is_some_and(|stem| *stem == *cx.id().to_string());
        if !named_by_id {
            tracing::warn!(
                path = %path.display(),
                agent = %cx.id(),
                "a resumed transcript not named `<agent id>.jsonl`: its children write no transcripts"
            );
        }
        let mut params = t.params();
        let ignored = builder_differences(&builder.0, &params, path)?;
        let mut agent = AgentBuilder(Box::new(BuilderParts {
            params: Some(params.clone()),
            context: Some(cx),
            transcript_dir: None,
            children_transcript_dir: named_by_id.then_some(dir),
            definition: definition.map(Arc::new),
            ..*builder.0
        }))
        .build()
        .await?;
        let mut recorder = super::Recorder::new(writer);
        recorder.unreported = crate::base::launched::unreported(params.messages());
        agent.transcript = Some(recorder);
        for text in ignored {
            tracing::warn!(path = %path.display(), "{text}");
            agent.warnings.push(text);
        }
        // A crash in the middle of a tool round leaves calls without results, which no provider
        // accepts: answer each with an error and record it.
        let interrupted = super::turn::interrupted_results(
            params.messages().last(),
            "the agent stopped before it finished, and was resumed from its transcript",
        );
        let interrupted_calls = interrupted.len();
        if interrupted_calls > 0 {
            let m = Message::user(interrupted);
            if let Some(r) = &mut agent.transcript {
                r.writer.message(&m).await?;
            }
            params = params.append(vec![m]);
            agent.params = params;
        }
        agent.turn = t.turns.iter().map(|u| u.turn).max().unwrap_or(0);
        // How its last answer ended: whether `continue_run` waits after it or sends it again.
        agent.last_stop = t
            .turns
            .iter()
            .max_by_key(|u| u.turn)
            .and_then(|u| u.stop_reason.as_deref())
            .map(forkhive_transport::ModelStop::from_anthropic);
        agent.last_prefix = Some(LastPrefix::Sent(agent.params.clone()));
        let report = ResumeReport {
            path: path.to_path_buf(),
            messages: t.messages.len(),
            turns: t.turns.len(),
            dropped: t.dropped.clone(),
            interrupted_calls,
        };
        Ok((agent, report))
    }
}

/// What `builder` sets that the transcript overrides — a model, a system prompt, a tool's
/// definition other than the transcript's — as warnings: the resumed agent keeps what it
/// sent, or its next request would not read the cache it left, and a host that changed
/// them there hears that they are not used. A tool of the transcript's array that the
/// builder's tools lack is an error: the model was offered it and may call it.
fn builder_differences(
    builder: &BuilderParts,
    params: &CacheSafeParams,
    path: &Path,
) -> Result<Vec<String>> {
    let mut said = Vec::new();
    let kept = "a resumed agent keeps what its transcript sent, so its next request reads the \
                cache it left";
    if let Some(model) = &builder.model
        && model != params.model()
        && forkhive_core::usage::anthropic_model_id(model)
            != forkhive_core::usage::anthropic_model_id(params.model())
    {
        said.push(format!(
            "resuming {}: the builder's model `{model}` is not used; the transcript's `{}` is ({kept})",
            path.display(),
            params.model()
        ));
    }
    if !builder.system.is_empty() && builder.system.as_slice() != params.system_prompt() {
        said.push(format!(
            "resuming {}: the builder's system prompt is not used; the transcript's is ({kept})",
            path.display()
        ));
    }
    let mut redefined = Vec::new();
    for offered in params.tools() {
        match builder.tools.get(&offered.name) {
            Some(tool) if tool.definition() != offered => {
                redefined.push(format!("`{}`", offered.name));
            }
            Some(_) => {}
            // An MCP tool whose server is gone is answered as unavailable when it is built.
            None if crate::tool::filter::is_mcp_tool(&offered.name) => {}
            None => {
                return Err(Error::Config(format!(
                    "resuming {}: its transcript offered the model tool `{}`, which the \
                     builder's tools lack; give the builder the tools the agent had (the model \
                     may call any of them)",
                    path.display(),
                    offered.name
                )));
            }
        }
    }
    if !redefined.is_empty() {
        said.push(format!(
            "resuming {}: tools {} are described to the model as the transcript has them, not \
             as the builder's tools describe themselves now ({kept}); their new code runs",
            path.display(),
            redefined.join(", ")
        ));
    }
    Ok(said)
}

/// Whether `asked` names the transcript's directory `dir` (as written, or once resolved). A
/// `dir` that cannot be resolved is not called another: reading the transcript will say what
/// is missing.
async fn same_dir(asked: &Path, dir: &Path) -> bool {
    if asked == dir {
        return true;
    }
    match (
        tokio::fs::canonicalize(asked).await,
        tokio::fs::canonicalize(dir).await,
    ) {
        (Ok(a), Ok(d)) => a == d,
        (_, Err(_)) => true,
        (Err(_), Ok(_)) => false,
    }
}

/// The identity and the definition's restrictions a transcript's header names.
fn identity(
    t: &transcript::Transcript,
    path: &Path,
) -> Result<(AgentContext, Option<AgentDefinition>)> {
    let id: TaskId = t.header.agent_id.parse().map_err(|e| Error::Transcript {
        path: path.to_path_buf(),
        line: 1,
        message: format!("bad agent_id: {e}"),
    })?;
    let parent: Option<TaskId> = match &t.header.parent_id {
        Some(p) => Some(p.parse().map_err(|e| Error::Transcript {
            path: path.to_path_buf(),
            line: 1,
            message: format!("bad parent_id: {e}"),
        })?),
        None => None,
    };
    let source = QuerySource::from_label(t.header.query_source.clone());
    let mut cx = AgentContext::new(id, t.header.kind, source).with_lineage(parent, t.header.depth);
    if let Some(d) = &t.header.definition {
        cx = cx.with_agent_type(d.clone());
    }
    // The definition's restrictions survive a resume: its tools are the header's tool array
    // (the pool is narrowed to it), its permission mode and turn limit are re-applied.
    let definition = match (&t.header.permission_mode, t.header.max_turns) {
        (None, None) => None,
        (mode, max_turns) => {
            let name = t.header.definition.clone().unwrap_or_default();
            let mut d =
                AgentDefinition::new(name, "", crate::definition::DefinitionSource::BuiltIn);
            d.max_turns = max_turns;
            d.permission_mode = match mode {
                Some(m) => Some(m.parse().map_err(|e| Error::Transcript {
                    path: path.to_path_buf(),
                    line: 1,
                    message: format!("bad permission_mode: {e}"),
                })?),
                None => None,
            };
            Some(d)
        }
    };
    Ok((cx, definition))
}
