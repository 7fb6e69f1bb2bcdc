//! The loop: model turn, tool round, the next turn; waking on pending messages; the end of a
//! run.

use super::*;

/// How one model turn ended, for the loop.
pub(super) enum TurnEnd {
    /// Go on with another model turn.
    Continue,
    /// The model ended its turn (no tool calls).
    EndTurn,
    /// Stop now.
    Stop(StopReason),
}

/// Accumulates one run's results.
#[derive(Default)]
pub(super) struct RunState {
    turns: Vec<TurnRecord>,
    usage: Usage,
    /// How many messages the conversation held when the run began: the run's own messages
    /// are the ones after them.
    start: usize,
    final_text: String,
    continuations: u32,
    pauses: u32,
    /// Text of assistant messages cut at `max_tokens` and continued, not yet complete.
    continued: String,
    error: Option<Arc<Error>>,
}

impl Agent {
    /// After a message arrived while more are promised, waits up to
    /// `Limits::notification_window` (or until nothing more is promised), so children
    /// finishing together reach the model in one turn, not one each. What arrived stays queued
    /// meanwhile: a run dropped here loses nothing.
    pub(super) async fn coalesce(&self) {
        let window = self.shared.limits.notification_window;
        if window.is_zero() || self.shared.pending.outstanding() == 0 {
            return;
        }
        tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => {}
            () = self.shared.pending.settled() => {}
            () = tokio::time::sleep(window) => {}
        }
    }

    /// `<agent id>-<turn>`, in one allocation.
    fn request_label(&self) -> String {
        let mut label = String::with_capacity(24);
        self.shared.cx.id().push_to(&mut label);
        label.push('-');
        forkhive_core::json::push_decimal(&mut label, u64::from(self.turn));
        label
    }

    /// The state of a run that begins now.
    pub(super) fn run_state(&self) -> RunState {
        RunState {
            start: self.params.messages().len(),
            ..RunState::default()
        }
    }

    /// The text blocks of the next user message for `ms` (the one place pending messages
    /// enter the conversation), and the event that tells hosts.
    ///
    /// Their receipts are answered when the message carrying them is recorded ([`Self::push`]).
    pub(super) fn inject(&mut self, ms: Vec<PendingMessage>) -> Vec<ContentBlock> {
        // A record whose future was dropped mid-write answers its own receipts (what it wrote
        // is recorded). Every injection is followed by the `push` that records it; receipts
        // still here are a dropped run's (its future dropped between taking and recording):
        // not recorded.
        self.settle_dropped_push();
        for r in self.receipts.drain(..) {
            r.answer(false);
        }
        if !ms.is_empty() {
            self.emit
                .emit(EventKind::MessagesInjected { count: ms.len() });
        }
        ms.into_iter()
            .map(|m| {
                if let Some(r) = m.receipt {
                    self.receipts.push(r);
                }
                ContentBlock::text(m.text)
            })
            .collect()
    }

    /// Whatever is queued now, as blocks for the next user message.
    pub(super) fn drain_pending(&mut self) -> Vec<ContentBlock> {
        self.inject(self.shared.pending.drain())
    }

    /// What the agent wakes on at the end of a turn: the queued messages, with those that
    /// arrive within the notification window ([`Self::coalesce`]), or nothing more promised,
    /// waiting for either when `wait` (`None`: cancelled first). Without `wait`, only what is
    /// queued now. Messages leave the queue only when this returns them.
    pub(super) async fn next_wake(&self, wait: bool) -> Option<Wake> {
        if !wait {
            let ms = self.shared.pending.drain();
            return Some(if ms.is_empty() {
                Wake::Idle
            } else {
                Wake::Messages(ms)
            });
        }
        // Quiet from here, but not stuck: its supervisor's stall check leaves it alone while its
        // children work.
        let _waiting = self.shared.halt.waiting();
        loop {
            let arrived = tokio::select! {
                biased;
                () = self.shared.cancel.cancelled() => return None,
                // A halt while waiting ends the run as if nothing more were promised; the loop
                // takes the request.
                () = self.shared.halt.requested() => return Some(Wake::Idle),
                a = self.shared.pending.arrived() => a,
            };
            if !arrived {
                return Some(Wake::Idle);
            }
            self.coalesce().await;
            let ms = self.shared.pending.drain();
            // (Empty only if someone else drained the queue meanwhile: wait again.)
            if !ms.is_empty() {
                return Some(Wake::Messages(ms));
            }
        }
    }

    /// Runs the loop from `first` — or, `waiting`, from the wait at the end of a turn whose
    /// answer the conversation already ends with.
    pub(super) async fn run_with(
        &mut self,
        first: Option<Vec<ContentBlock>>,
        waiting: bool,
    ) -> AgentRun {
        let span = tracing::info_span!(
            "agent",
            agent_id = %self.shared.cx.id(),
            parent = ?self.shared.cx.parent().map(ToString::to_string),
            kind = %self.shared.cx.kind(),
            model = %self.params.model(),
        );
        let cx = Arc::clone(&self.shared.cx);
        // Boxed: the loop's state is allocated when the run starts, so a task holding an
        // agent that has not started yet (a background child behind its gate, or one of
        // thousands just spawned) stays small.
        Box::pin(cx.scope(self.run_loop(first, waiting).instrument(span))).await
    }

    /// A resumed agent whose transcript says it started background children that have not
    /// reported, with nothing here waiting for them (no promise on its queue, nothing queued):
    /// they ran in a process that is gone, or on a worker pool this agent was not attached to
    /// (`Delivery::attach`) — their notifications would never come, and the model still
    /// expects them. Said once, as the first run starts: before anything queued is taken
    /// (a notification already queued is something here, not nothing).
    pub(super) fn warn_of_unreported(&mut self) {
        let Some(unreported) = self
            .transcript
            .as_deref_mut()
            .map(|r| std::mem::take(&mut r.unreported))
        else {
            return;
        };
        let pending = &self.shared.pending;
        if unreported.is_empty() || pending.outstanding() > 0 || !pending.is_empty() {
            return;
        }
        let shown: Vec<String> = unreported.iter().take(5).map(ToString::to_string).collect();
        let more = match unreported.len() {
            n if n > 5 => format!(" and {} more", n - 5),
            _ => String::new(),
        };
        let message = format!(
            "this resumed agent started {} background task(s) that have not reported ({}{more}), \
             and nothing here waits for them: tasks of a process that is gone will never report; \
             tasks on a worker pool report only once the agent is attached \
             (`Delivery::attach(&pool, &agent)` before its first run)",
            unreported.len(),
            shown.join(", ")
        );
        tracing::warn!(agent = %self.shared.cx.id(), "{message}");
        self.emit.emit(EventKind::Warning { message });
    }

    async fn run_loop(&mut self, first: Option<Vec<ContentBlock>>, waiting: bool) -> AgentRun {
        let _live = self.shared.tree.enter();
        for message in std::mem::take(&mut self.warnings) {
            self.emit.emit(EventKind::Warning { message });
        }
        let mut run = self.run_state();
        // How many times in a row stop hooks sent the agent on.
        let mut stop_blocks = 0u32;
        let first = self.answer_interrupted(first);
        if let Some(first) = first {
            let pushed = if self.unsent.is_empty() {
                self.push(vec![Message::user(first)]).await
            } else {
                self.push_unsent(Message::user(first)).await
            };
            if let Err(e) = pushed {
                run.error = Some(Arc::new(e));
                return self.finish(run, StopReason::Failed).await;
            }
        }
        // Resumed at the end of a turn: the first step is that turn's wait.
        let mut at_turn_end = waiting;
        loop {
            if std::mem::take(&mut at_turn_end) {
                match self.end_of_turn(&mut run, &mut stop_blocks).await {
                    Some(stop) => return self.finish(run, stop).await,
                    None => continue,
                }
            }
            if self.shared.cancel.is_cancelled() {
                return self.finish(run, StopReason::Cancelled).await;
            }
            if let Some(limit) = self.shared.limits.max_turns
                && run.turns.len() >= limit as usize
            {
                return self.finish(run, StopReason::MaxTurns { limit }).await;
            }
            if let Some(limit) = self.shared.limits.token_budget {
                let used = run.usage.total_tokens();
                if used >= limit {
                    return self
                        .finish(run, StopReason::TokenBudget { limit, used })
                        .await;
                }
            }
            self.turn += 1;
            self.emit.set_turn(self.turn);
            let span = tracing::info_span!("turn", turn = self.turn);
            // Inline in the run's future, which is itself boxed when the run starts (children
            // not started yet hold none of it). A box per turn cost an allocation and a copy
            // of the turn's state each turn, while a run in a turn holds both anyway.
            let end = self.turn_once(&mut run).instrument(span).await;
            // A halt ends the run here, between turns: after a tool round its results are in
            // the conversation, and a finished turn does not wait for what is promised.
            if !matches!(end, TurnEnd::Stop(_)) && self.shared.halt.take() {
                return self.finish(run, StopReason::Halted).await;
            }
            match end {
                TurnEnd::Continue => {}
                TurnEnd::Stop(reason) => return self.finish(run, reason).await,
                TurnEnd::EndTurn => {
                    if let Some(stop) = self.end_of_turn(&mut run, &mut stop_blocks).await {
                        return self.finish(run, stop).await;
                    }
                }
            }
        }
    }

    /// The end of a turn whose answer called no tools: waits for what is promised (when the
    /// agent waits for its children), then goes on with what came (`None`), or says why the
    /// run ends — stop hooks may send the agent on instead.
    async fn end_of_turn(
        &mut self,
        run: &mut RunState,
        stop_blocks: &mut u32,
    ) -> Option<StopReason> {
        match self.next_wake(self.shared.wait_for_promises).await {
            None => Some(StopReason::Cancelled),
            Some(Wake::Idle) if self.shared.halt.take() => Some(StopReason::Halted),
            Some(Wake::Idle) => {
                if let Some(reason) = self.stop_hooks(run, stop_blocks).await {
                    // Sent on: the reason is its next message.
                    let next = vec![Message::user(vec![ContentBlock::text(reason)])];
                    if let Err(e) = self.push(next).await {
                        run.error = Some(Arc::new(e));
                        return Some(StopReason::Failed);
                    }
                    return None;
                }
                if self.shared.cancel.is_cancelled() {
                    return Some(StopReason::Cancelled);
                }
                Some(StopReason::Completed)
            }
            Some(Wake::Messages(ms)) => {
                let blocks = self.inject(ms);
                if let Err(e) = self.push(vec![Message::user(blocks)]).await {
                    run.error = Some(Arc::new(e));
                    return Some(StopReason::Failed);
                }
                None
            }
        }
    }

    /// `first` led by an error result for each call the conversation's last answer made
    /// without a result — a run dropped in the middle of its tool round leaves them, in the
    /// conversation and the transcript alike — so the next request is one a provider accepts
    /// and the model hears the calls did not finish, as after a resume. Unchanged when there
    /// are none, or when the messages to send first ([`AgentBuilder::first_request_suffix`])
    /// follow the answer.
    ///
    /// [`AgentBuilder::first_request_suffix`]: super::AgentBuilder::first_request_suffix
    fn answer_interrupted(&self, first: Option<Vec<ContentBlock>>) -> Option<Vec<ContentBlock>> {
        if !self.unsent.is_empty() {
            return first;
        }
        let mut blocks = interrupted_results(
            self.params.messages().last(),
            "the agent's previous run stopped before it finished",
        );
        if blocks.is_empty() {
            return first;
        }
        blocks.extend(first.into_iter().flatten());
        Some(blocks)
    }

    /// `Stop` hooks (`SubagentStop` for a subagent) as the agent is about to end its run: the
    /// reason of one that blocks, which sends the agent on — at most [`MAX_STOP_BLOCKS`](crate::hook::MAX_STOP_BLOCKS)
    /// times in a row, after which the run ends with a warning.
    async fn stop_hooks(&self, run: &RunState, blocks: &mut u32) -> Option<String> {
        use crate::hook::HookEvent;
        let (event, subject) = if self.shared.cx.depth() > 0 {
            (HookEvent::SubagentStop, self.shared.cx.agent_type())
        } else {
            (HookEvent::Stop, None)
        };
        if !self.shared.hooks.wants(event, subject) {
            return None;
        }
        if *blocks >= crate::hook::MAX_STOP_BLOCKS {
            self.emit.emit(EventKind::Warning {
                message: format!(
                    "{event} hooks sent the agent on {blocks} times in a row; its run ends"
                ),
            });
            return None;
        }
        let mut input = self.hook_input(event);
        input.stop_hook_active = *blocks > 0;
        input.last_assistant_message = Some(run.final_text.clone());
        // A cancelled agent does not wait for its stop hooks.
        let d = tokio::select! {
            biased;
            () = self.shared.cancel.cancelled() => return None,
            d = self.shared.hooks.run(input) => d,
        };
        for message in d.warnings {
            self.emit.emit(EventKind::Warning { message });
        }
        let reason = d.blocked?;
        *blocks += 1;
        Some(reason)
    }

    /// One model turn and, if the model called tools, one tool round.
    async fn turn_once(&mut self, run: &mut RunState) -> TurnEnd {
        self.emit.emit(EventKind::TurnStarted);
        let suffix = std::mem::take(&mut self.unsent);
        let request = Request::new(self.params.clone(), suffix.clone())
            .with_settings(self.shared.settings.clone())
            .with_label(self.request_label());
        let prefix = self.params.clone();
        // The suffix is already part of the conversation (and the transcript).
        let suffix_len = suffix.len();
        if suffix_len > 0 {
            self.params = self.params.append(suffix);
        }
        let sent = self.params.clone();
        if let Some(at) = self
            .last_prefix
            .as_ref()
            .and_then(|last| last.break_before(&prefix))
        {
            tracing::warn!(agent = %self.shared.cx.id(), "prompt cache break: {at}");
            self.emit.emit(EventKind::CacheBreak { at });
        }
        self.emit.emit(EventKind::RequestSent {
            prefix: prefix.clone(),
            messages: self.params.messages().len(),
            invoking_request_id: self.shared.cx.take_invoking_request_id(),
        });
        self.last_prefix = Some(LastPrefix::Sent(prefix.clone()));
        let sent_at_ms = crate::transcript::now_ms();

        // The token checked, the model asked once, and only an answer that has to wait races
        // the token (polled first, as always): an answer that is ready at once registers no
        // waiter on the token.
        if self.shared.cancel.is_cancelled() {
            return TurnEnd::Stop(StopReason::Cancelled);
        }
        let answer = {
            let mut asked = std::pin::pin!(self.stream(&request));
            match futures::poll!(asked.as_mut()) {
                std::task::Poll::Ready(a) => a,
                std::task::Poll::Pending => tokio::select! {
                    biased;
                    () = self.shared.cancel.cancelled() => return TurnEnd::Stop(StopReason::Cancelled),
                    a = &mut asked => a,
                },
            }
        };
        let (response, cut_off) = match answer {
            Ok(r) => r,
            Err(source) => {
                tracing::error!(agent = %self.shared.cx.id(), "backend failed: {source}");
                run.error = Some(Arc::new(Error::Backend {
                    turn: self.turn,
                    source,
                }));
                return TurnEnd::Stop(StopReason::Failed);
            }
        };
        let Response {
            message,
            stop_reason,
            usage,
            ..
        } = response;
        self.emit.emit(EventKind::ResponseReceived {
            usage,
            stop_reason: stop_reason.clone(),
        });
        run.usage += usage;
        self.last_stop.clone_from(&stop_reason);
        let calls = ToolCall::from_message(&message);
        let record = TurnRecord {
            turn: self.turn,
            prefix: prefix.clone(),
            usage,
            stop_reason: stop_reason.clone(),
            tool_calls: calls.len(),
            sent_at_ms,
        };
        let has_content = !message.content.is_empty();
        // An answer with content is written to the transcript with its turn's usage record, in
        // one write (`push_answer`, below): the agent waits for the file once for the two.
        if !has_content
            && let Some(r) = &mut self.transcript
            && let Err(e) = Box::pin(r.writer.usage(&record)).await
        {
            run.error = Some(Arc::new(e));
            run.turns.push(record);
            return TurnEnd::Stop(StopReason::Failed);
        }
        run.turns.push(record);

        // One allocation, shared by the conversation and the turn's snapshot.
        let message = Arc::new(message);
        let snapshot = (!calls.is_empty())
            .then(|| Arc::new(TurnSnapshot::new(sent, Arc::clone(&message), self.turn)));
        // The limits on continuations and resends count in a row: any other answer resets them.
        let cut_in_text = stop_reason == Some(ModelStop::MaxTokens) && calls.is_empty();
        if !cut_in_text {
            run.continuations = 0;
        }
        if stop_reason != Some(ModelStop::PauseTurn) {
            run.pauses = 0;
        }
        if has_content {
            // An answer continued after `max_tokens` is the concatenation of its parts.
            let text = message.text();
            if cut_in_text || stop_reason == Some(ModelStop::PauseTurn) {
                run.continued.push_str(&text);
                run.final_text.clone_from(&run.continued);
            } else if run.continued.is_empty() {
                run.final_text = text;
            } else {
                run.final_text = std::mem::take(&mut run.continued) + &text;
            }
            // Shared with the turn's snapshot, not copied. In the conversation and the
            // transcript before any tool runs: the two agree on every path, and a run dropped
            // mid-round leaves calls without results that the next run answers
            // (`answer_interrupted`), as a resume does.
            if let Err(e) = self.push_answer(message, run.turns.last()).await {
                run.error = Some(Arc::new(e));
                return TurnEnd::Stop(StopReason::Failed);
            }
        }

        if !calls.is_empty() {
            // `Usage::tool_uses` counts the calls the run made (what hosts, the registry and
            // the roll-up read), not only what the model was billed.
            run.usage.tool_uses = run.usage.tool_uses.saturating_add(calls.len() as u64);
            let results = self.tool_round(&calls, &cut_off, snapshot).await;
            let mut blocks = results;
            blocks.extend(self.drain_pending());
            if let Err(e) = self.push_shared([Arc::new(Message::user(blocks))]).await {
                run.error = Some(Arc::new(e));
                return TurnEnd::Stop(StopReason::Failed);
            }
            if self.shared.cancel.is_cancelled() {
                return TurnEnd::Stop(StopReason::Cancelled);
            }
            return TurnEnd::Continue;
        }

        match stop_reason {
            Some(ModelStop::MaxTokens) => {
                if run.continuations >= self.shared.limits.max_continuations {
                    return TurnEnd::Stop(StopReason::OutputLimit {
                        continuations: run.continuations,
                    });
                }
                run.continuations += 1;
                let mut blocks = vec![ContentBlock::text(CONTINUE_PROMPT)];
                blocks.extend(self.drain_pending());
                match self.push(vec![Message::user(blocks)]).await {
                    Ok(()) => TurnEnd::Continue,
                    Err(e) => {
                        run.error = Some(Arc::new(e));
                        TurnEnd::Stop(StopReason::Failed)
                    }
                }
            }
            Some(ModelStop::PauseTurn) if has_content => {
                if run.pauses >= self.shared.limits.max_pause_resends {
                    return TurnEnd::Stop(StopReason::PauseLimit {
                        resends: run.pauses,
                    });
                }
                run.pauses += 1;
                // Resend as is: the provider continues the paused assistant turn.
                TurnEnd::Continue
            }
            Some(ModelStop::Refusal) => TurnEnd::Stop(StopReason::Refusal),
            _ => TurnEnd::EndTurn,
        }
    }

    /// Streams one answer, surfacing text deltas as events. A backend that [answers
    /// whole](forkhive_transport::Backend::answers_whole) is asked with `send`, and each text
    /// block is one delta: nothing is cut into events to be folded back. (Its tool inputs
    /// arrive complete, so none was cut off.)
    async fn stream(
        &self,
        request: &Request,
    ) -> std::result::Result<(Response, Vec<String>), forkhive_transport::Error> {
        if self.shared.backend.answers_whole() {
            let response = self.shared.backend.send(request).await?;
            for block in &response.message.content {
                if let ContentBlock::Text { text } = block
                    && !text.is_empty()
                {
                    self.emit.emit(EventKind::TextDelta { text: text.clone() });
                }
            }
            return Ok((response, Vec::new()));
        }
        let mut events = self.shared.backend.stream(request).await?;
        let mut builder = ResponseBuilder::new();
        while let Some(event) = events.next().await {
            let event = event?;
            if let StreamEvent::TextDelta { text, .. } = &event {
                self.emit.emit(EventKind::TextDelta { text: text.clone() });
            }
            builder.push(&event)?;
        }
        builder.finish_cut_off()
    }

    /// Runs the calls of one assistant message; calls cut off at `max_tokens` are answered
    /// with an error instead of running.
    async fn tool_round(
        &self,
        calls: &[ToolCall],
        cut_off: &[String],
        turn: Option<Arc<TurnSnapshot>>,
    ) -> Vec<ContentBlock> {
        let cx = ToolContext {
            agent: Arc::clone(&self.shared.cx),
            state: self.shared.state.clone(),
            cancel: self.shared.cancel.clone(),
            tool_use_id: no_call_yet(),
            caller: Some(Arc::clone(&self.shared) as Arc<dyn crate::tool::Caller>),
            turn,
        };
        // What hook inputs start from, only when there are hooks to give them to.
        let hook_base = (!self.shared.hooks.is_empty())
            .then(|| self.hook_input(crate::hook::HookEvent::PreToolUse));
        let round = Round {
            pool: &self.shared.pool,
            policy: &self.shared.policy,
            cx: &cx,
            config: RoundConfig {
                max_concurrency: self.shared.limits.max_concurrent_tools,
                timeout: self.shared.limits.tool_timeout,
            },
            emit: &self.emit,
            hooks: &self.shared.hooks,
            hook_base: hook_base.as_ref(),
        };
        if cut_off.is_empty() {
            return round.run(calls).await;
        }
        let runnable: Vec<ToolCall> = calls
            .iter()
            .filter(|c| !cut_off.iter().any(|id| **id == *c.id))
            .cloned()
            .collect();
        let mut ran = round.run(&runnable).await.into_iter();
        calls
            .iter()
            .map(|c| {
                if cut_off.iter().any(|id| **id == *c.id) {
                    ToolOutput::error(format!(
                        "the call to `{}` was cut off by the output token limit before its \
                         input was complete, so it did not run; make the call again with a \
                         shorter input",
                        c.name
                    ))
                    .into_result_block(&*c.id)
                } else {
                    ran.next().unwrap_or_else(|| {
                        ToolOutput::error("internal: missing tool result").into_result_block(&*c.id)
                    })
                }
            })
            .collect()
    }

    /// Appends messages to the conversation (O(new)) and the transcript.
    async fn push(&mut self, messages: Vec<Message>) -> Result<()> {
        self.push_shared(messages.into_iter().map(Arc::new)).await
    }

    /// Records `message` to go after the messages still to send first
    /// ([`AgentBuilder::first_request_suffix`]), in the same request's suffix. A fork child's
    /// first message answers its parent's calls with placeholder results, so nothing may come
    /// between that call and it (a provider refuses a `tool_use` not answered by the next
    /// message, and the shared prefix the fork exists for would differ): what a first run
    /// adds ([`Agent::run`]'s prompt, what [`Agent::run_pending`] takes) follows it. Its
    /// receipts are answered as [`push`](Self::push) answers them.
    ///
    /// [`AgentBuilder::first_request_suffix`]: super::AgentBuilder::first_request_suffix
    async fn push_unsent(&mut self, message: Message) -> Result<()> {
        self.record(vec![Arc::new(message)], true).await
    }

    /// [`push`](Self::push) for messages already shared. A failed transcript write answers
    /// the receipts of what was injected: not recorded, and a later write must not answer for
    /// them.
    async fn push_shared<I>(&mut self, messages: I) -> Result<()>
    where
        I: IntoIterator<Item = Arc<Message>>,
        I::IntoIter: ExactSizeIterator,
    {
        if self.transcript.is_none() {
            self.params = self.params.append_shared(messages);
            // What was injected is in the conversation now.
            for r in self.receipts.drain(..) {
                r.answer(true);
            }
            return Ok(());
        }
        self.record(messages.into_iter().collect(), false).await
    }

    /// [`push_shared`](Self::push_shared) for a turn's answer, with a transcript written
    /// after the turn's usage record (`usage`) in one write: a failed write leaves both out,
    /// as a failed message write leaves the message out.
    async fn push_answer(
        &mut self,
        answer: Arc<Message>,
        usage: Option<&TurnRecord>,
    ) -> Result<()> {
        if self.transcript.is_none() {
            return self.push_shared([answer]).await;
        }
        self.record_after(vec![answer], false, usage).await
    }

    /// Writes `messages` to the transcript, then takes them into the conversation (or, with
    /// `unsent`, the messages still to send first) and answers the receipts of what was
    /// injected: `true` once every one is recorded.
    ///
    /// The conversation and the transcript hold the same messages on every path. A message
    /// whose write fails is in neither (the writer cuts it off and gives its index back); those
    /// before it are in both, and the run fails. When this future is dropped mid-write (the
    /// agent's run dropped: a timeout, a `select!`), the writer still writes what it was
    /// handed, so what it took is taken into the conversation, and the receipts answered, by
    /// [`settle_dropped_push`](Self::settle_dropped_push) before the agent next records or
    /// runs. Before, the conversation missed what the transcript held: a receipt answered
    /// `false` for a recorded message had its sender send it again (recorded twice), and tool
    /// results recorded but not taken were answered again as interrupted (two results for one
    /// call, which a resumed conversation would send).
    async fn record(&mut self, messages: Vec<Arc<Message>>, unsent: bool) -> Result<()> {
        self.record_after(messages, unsent, None).await
    }

    /// [`record`](Self::record), with `usage` (a turn's usage record) written in the first
    /// message's write, before it.
    async fn record_after(
        &mut self,
        messages: Vec<Arc<Message>>,
        unsent: bool,
        mut usage: Option<&TurnRecord>,
    ) -> Result<()> {
        if self.left_a_record() {
            Box::pin(self.settle_recorded()).await;
        }
        let Some(rec) = self.transcript.as_deref_mut() else {
            // No transcript: nothing to write, so nothing can be dropped mid-write.
            self.take_recorded(messages, unsent, true);
            return Ok(());
        };
        let n = messages.len();
        rec.in_flight = Some(super::InFlight {
            first: rec.writer.next_index(),
            messages,
            unsent,
        });
        let mut failed = None;
        for i in 0..n {
            let Some(m) = rec
                .in_flight
                .as_ref()
                .and_then(|f| f.messages.get(i))
                .cloned()
            else {
                break;
            };
            // Boxed, like every file write here: the agent's future stays small.
            let written = match usage.take() {
                Some(u) => Box::pin(rec.writer.usage_and_message(u, &m)).await,
                None => Box::pin(rec.writer.message(&m)).await,
            };
            if let Err(e) = written {
                failed = Some(e);
                break;
            }
        }
        self.settle_dropped_push();
        failed.map_or(Ok(()), Err)
    }

    /// Whether a dropped run left a record in flight (checked before boxing the rare
    /// [`settle_recorded`](Self::settle_recorded), so a run's future holds none of it).
    pub(super) fn left_a_record(&self) -> bool {
        self.transcript
            .as_deref()
            .is_some_and(|r| r.in_flight.is_some())
    }

    /// Before a run or a record: the outcome of a write that a dropped run left in flight, then
    /// what it wrote taken into the conversation ([`settle_dropped_push`]). A write that
    /// failed once confirmed is in neither (the writer cut it off and gave its index back), and
    /// its receipt is answered `false`; the agent goes on, with a warning.
    ///
    /// [`settle_dropped_push`]: Self::settle_dropped_push
    pub(super) async fn settle_recorded(&mut self) {
        if let Some(rec) = self.transcript.as_deref_mut()
            && rec.in_flight.is_some()
            && let Err(e) = Box::pin(rec.writer.confirm()).await
        {
            tracing::warn!(agent = %self.shared.cx.id(), "a message a dropped run was recording was not written: {e}");
        }
        self.settle_dropped_push();
    }

    /// Takes what the last [`record`](Self::record) wrote into the conversation and answers
    /// its receipts (`true` only if it wrote every message). Nothing to do when no write is in
    /// flight. Called where the record ends, and — for one whose future was dropped — before
    /// the agent next records, injects or runs.
    pub(super) fn settle_dropped_push(&mut self) {
        let Some(rec) = self.transcript.as_deref_mut() else {
            return;
        };
        let Some(f) = rec.in_flight.take() else {
            return;
        };
        // Taken once handed to the file: a write whose future was dropped is still written.
        // Runs and records confirm such a write first (`settle_recorded`), and so does the task
        // a dropped agent hands its writer to (`hand_over_dropped_push`), so one that failed
        // is not counted; only a drop with no runtime to wait on counts it as written.
        let landed = rec
            .writer
            .next_index()
            .saturating_sub(f.first)
            .min(f.messages.len());
        let all = landed == f.messages.len();
        let mut messages = f.messages;
        messages.truncate(landed);
        self.take_recorded(messages, f.unsent, all);
    }

    /// Dropping the agent while a dropped run's write is still running: a task on the runtime
    /// takes the writer over, waits for the write's outcome ([`TranscriptWriter::confirm`]),
    /// and answers the receipts by it — `false` for a message the file refused, which the
    /// sender may send again. The writer (and the file's lock) goes with that task. `false`
    /// when there is nothing to wait for, or no runtime to wait on.
    ///
    /// [`TranscriptWriter::confirm`]: crate::transcript::TranscriptWriter::confirm
    pub(super) fn hand_over_dropped_push(&mut self) -> bool {
        let waiting = self
            .transcript
            .as_deref()
            .is_some_and(|r| r.in_flight.is_some() && r.writer.has_unconfirmed());
        if !waiting {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let Some(mut rec) = self.transcript.take() else {
            return false;
        };
        // If the task never runs (the runtime is shutting down: its tasks are dropped unrun),
        // the receipts are answered as a drop without a runtime answers them: by what the
        // writer took, which the file finishes writing on its own.
        let mut receipts = Answer {
            receipts: std::mem::take(&mut self.receipts),
            unrun: all_taken(&rec),
        };
        let agent = *self.shared.cx.id();
        runtime.spawn(async move {
            if let Err(e) = rec.writer.confirm().await {
                tracing::warn!(%agent, "a message a dropped run was recording was not written: {e}");
            }
            // A failed write gave its index back.
            let all = all_taken(&rec);
            for r in receipts.receipts.drain(..) {
                r.answer(all);
            }
        });
        true
    }

    fn take_recorded(&mut self, messages: Vec<Arc<Message>>, unsent: bool, all: bool) {
        if unsent {
            self.unsent
                .extend(messages.into_iter().map(Arc::unwrap_or_clone));
        } else if !messages.is_empty() {
            self.params = self.params.append_shared(messages);
        }
        for r in self.receipts.drain(..) {
            r.answer(all);
        }
    }

    pub(super) async fn finish(&mut self, run: RunState, stop: StopReason) -> AgentRun {
        let mut run = run;
        if stop == StopReason::Cancelled {
            self.stopped_cancelled = true;
            // Cancelling an agent cancels its children; give their notifications a moment to
            // arrive, so a cancelled run returns with its tree's results in its queue.
            let grace = self.shared.limits.cancel_grace;
            let _ = Box::pin(tokio::time::timeout(grace, self.shared.pending.settled())).await;
        }
        let error = run.error.as_deref().map(|e| forkhive_core::error::chain(e));
        if let Some(r) = &mut self.transcript
            && let Err(e) = Box::pin(r.writer.stop_with_error(&stop, run.usage, error)).await
        {
            tracing::warn!(agent = %self.shared.cx.id(), "could not record the stop: {e}");
            if run.error.is_none() {
                run.error = Some(Arc::new(e));
            }
        }
        self.emit.emit(EventKind::Stopped {
            reason: stop.clone(),
            usage: run.usage,
        });
        // The run's messages share the conversation's: nothing is copied.
        let new_messages = self.params.messages().tail_from(run.start);
        if run.final_text.is_empty()
            && let Some(last) = new_messages
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
        {
            run.final_text = last.text();
        }
        AgentRun {
            stop,
            final_text: run.final_text,
            turns: run.turns,
            usage: run.usage,
            error: run.error,
            new_messages,
            children: self.shared.children.report(),
        }
    }
}

/// Whether the writer took every message of the record in flight (none: nothing to count).
fn all_taken(rec: &super::Recorder) -> bool {
    rec.in_flight
        .as_ref()
        .is_some_and(|f| rec.writer.next_index().saturating_sub(f.first) >= f.messages.len())
}

/// Receipts handed to a task with a dropped agent's writer: answered by the task, or — if it
/// is dropped before it runs — with `unrun`.
struct Answer {
    receipts: Vec<crate::base::pending::Receipt>,
    unrun: bool,
}

impl Drop for Answer {
    fn drop(&mut self) {
        for r in self.receipts.drain(..) {
            r.answer(self.unrun);
        }
    }
}

/// The tool-use id of a round's context before a call is given its own: one shared empty
/// string, not an allocation per round.
fn no_call_yet() -> Arc<str> {
    static EMPTY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    Arc::clone(&EMPTY)
}

/// An error result for each call `last` made, when it is an answer (an assistant message):
/// the calls were interrupted, for the reason `why`. Tool results lead the user message that
/// follows the calls.
pub(super) fn interrupted_results(last: Option<&Message>, why: &str) -> Vec<ContentBlock> {
    match last {
        Some(m) if m.role == Role::Assistant => m
            .tool_uses()
            .map(|(id, name, _)| {
                ToolOutput::error(format!(
                    "the call to `{name}` was interrupted: {why}; check its effects and call \
                     it again if needed"
                ))
                .into_result_block(id)
            })
            .collect(),
        _ => Vec::new(),
    }
}
