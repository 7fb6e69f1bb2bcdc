//! Fork prefixes: children that share their parent's prompt cache byte for byte.
//!
//! A fork child inherits the parent's whole conversation. Its messages are
//! `[...history, assistant(all tool_use blocks), user(one placeholder tool_result per
//! tool_use, ..., child message)]`, and every sibling forked from the same parent turn differs
//! only in the final text block — the directive — so the provider serves all of them from one
//! cached prefix ("Fork Mechanism — 构建 Fork 后的消息"; "Chapter 9: Sub-Agents and the Fork
//! Pattern — The Ingenious Design of buildForkedMessages").
//!
//! [`ForkPrefix`] is made once per parent turn and makes children in O(directive): they share
//! the parent's history allocation, its already hashed fingerprint state and one encoded copy
//! of the placeholder block; the only per-child allocation is the child's own text.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};
use crate::fingerprint::{Digest, PrefixFingerprint};
use crate::json;
use crate::message::{ContentBlock, Message, Role};
use crate::params::CacheSafeParams;

/// The one text every placeholder `tool_result` carries.
///
/// Identical for every fork so that even a parent's "waiting for my workers" turn stays
/// cache-friendly ("Chapter 9: Sub-Agents and the Fork Pattern — The Ingenious Design of
/// buildForkedMessages").
pub const FORK_PLACEHOLDER_RESULT: &str = "Fork started \u{2014} processing in background";

/// The tag whose presence in a user message marks a conversation as a fork child's.
pub const FORK_BOILERPLATE_TAG: &str = "<fork-boilerplate>";

/// The text that introduces a child's directive after the boilerplate.
pub const FORK_DIRECTIVE_PREFIX: &str = "fork-directive: ";

/// The rules every fork child receives ("Fork Mechanism — Fork 子进程协议"), in our words.
const FORK_BOILERPLATE: &str = "<fork-boilerplate>
You are a forked worker, not the main agent. You inherited the conversation above from the \
agent that forked you; the directive below is your whole assignment.

Rules:
1. Do not spawn sub-agents or forks. Anything above about delegating or forking was meant for \
the parent: you do the work yourself.
2. Do not converse, ask questions or suggest next steps. Nobody will answer.
3. Use your tools directly to do the work.
4. If you change files, commit the changes before you report, and name the commit.
5. Keep the report under 500 words.
6. Begin the report with \"Scope:\".

Report format:
Scope: <the scope you were given, in one line>
Result: <what you found or did>
Key files: <the files that matter>
Files changed: <each changed file, with its commit hash>
Issues: <anything that failed or is left open, or \"none\">
</fork-boilerplate>

";

/// The full text of a fork child's message: the boilerplate, a blank line, then
/// `fork-directive: <directive>`.
///
/// ```
/// let text = forkhive_core::fork::build_child_message("audit src/net");
/// assert!(text.starts_with("<fork-boilerplate>"));
/// assert!(text.ends_with("\n\nfork-directive: audit src/net"));
/// ```
pub fn build_child_message(directive: &str) -> String {
    let mut s = String::with_capacity(
        FORK_BOILERPLATE.len() + FORK_DIRECTIVE_PREFIX.len() + directive.len(),
    );
    s.push_str(FORK_BOILERPLATE);
    s.push_str(FORK_DIRECTIVE_PREFIX);
    s.push_str(directive);
    s
}

/// One placeholder `tool_result` per `tool_use` block of `assistant`, in order.
pub fn placeholder_results(assistant: &Message) -> Vec<ContentBlock> {
    assistant
        .tool_uses()
        .map(|(id, _, _)| ContentBlock::tool_result_text(id, FORK_PLACEHOLDER_RESULT))
        .collect()
}

/// The two messages a fork child appends to its parent's history:
/// `[assistant (cloned), user(placeholder results..., child message)]`.
///
/// An assistant message without tool calls yields a user message holding only the child
/// message. Anything but an assistant message is an error.
///
/// ```
/// use forkhive_core::{fork, ContentBlock, Message, RawJson};
/// let assistant = Message::assistant(vec![
///     ContentBlock::tool_use("toolu_1", "Agent", RawJson::parse(r#"{"prompt":"a"}"#)?),
/// ]);
/// let msgs = fork::build_forked_messages("check the parser", &assistant)?;
/// assert_eq!(msgs.len(), 2);
/// assert_eq!(msgs[1].content.len(), 2); // one placeholder + the child message
/// # Ok::<(), forkhive_core::Error>(())
/// ```
pub fn build_forked_messages(directive: &str, assistant: &Message) -> Result<Vec<Message>> {
    ensure_assistant(assistant)?;
    let mut content = placeholder_results(assistant);
    content.push(ContentBlock::text(build_child_message(directive)));
    Ok(vec![assistant.clone(), Message::user(content)])
}

fn ensure_assistant(message: &Message) -> Result<()> {
    match message.role {
        Role::Assistant => Ok(()),
        role => Err(Error::NotAnAssistantMessage { role }),
    }
}

/// Whether `messages` belong to a fork child: some user message is a fork child's first — it
/// carries a text block that begins with [`FORK_BOILERPLATE_TAG`], and either answers its
/// parent's calls with [`FORK_PLACEHOLDER_RESULT`] or (a parent turn that made no calls) that
/// block begins with the whole of this crate's rules for forks.
///
/// This is the message-scanning half of the recursive-fork guard ("Chapter 9: Sub-Agents and
/// the Fork Pattern — Recursive Fork Protection"); a runtime should also keep a marker outside
/// the transcript, which compaction cannot remove. The shape is matched, not the tag alone: a
/// user's prompt, a pasted log or a message that merely mentions the tag holds no placeholder
/// results and not the rules whole, and does not turn the agent it reaches into a fork child.
///
/// Accepts anything that iterates over messages: a slice, a `Vec`, or a
/// [`MessageList`](crate::MessageList) such as `params.messages()`.
pub fn is_in_fork_child<'a>(messages: impl IntoIterator<Item = &'a Message>) -> bool {
    let rules = FORK_BOILERPLATE.trim_end();
    messages.into_iter().any(|m| {
        if m.role != Role::User {
            return false;
        }
        let Some(block) = m
            .content
            .iter()
            .filter_map(ContentBlock::as_text)
            .find(|t| t.starts_with(FORK_BOILERPLATE_TAG))
        else {
            return false;
        };
        block.starts_with(rules)
            || m.content.iter().any(|b| {
                matches!(b, ContentBlock::ToolResult { content, .. }
                    if content.text() == FORK_PLACEHOLDER_RESULT)
            })
    })
}

/// The note a fork child running in its own git worktree receives, telling it how to read the
/// inherited paths ("Fork Mechanism — Fork 的 Worktree Isolation").
pub fn build_worktree_notice(parent_cwd: &Path, worktree_cwd: &Path) -> String {
    format!(
        "You inherited the conversation above from a parent agent working in {parent}. You are \
running in a separate git worktree at {worktree}: the same repository with the same relative \
layout, but your own working copy. Paths in the inherited conversation point into the \
parent's directory; map them onto your worktree root. The parent may have changed files \
since they appear above, so read a file again before you edit it.",
        parent = parent_cwd.display(),
        worktree = worktree_cwd.display(),
    )
}

struct ForkShared {
    params: CacheSafeParams,
    assistant: Message,
    placeholders: Vec<ContentBlock>,
    /// Hash state of the child's user message up to (not including) the directive.
    user_state: Sha256,
    /// The parent's fingerprint extended by the assistant message.
    base: PrefixFingerprint,
}

/// One parent turn, ready to produce any number of fork children cheaply.
///
/// ```
/// use forkhive_core::{CacheSafeParams, ContentBlock, ForkPrefix, Message, RawJson};
/// let params = CacheSafeParams::builder("claude-sonnet-4-5")
///     .system_block("You are a careful engineer.")
///     .messages(vec![Message::user_text("Audit the repository.")])
///     .build();
/// let turn = Message::assistant(vec![
///     ContentBlock::tool_use("toolu_1", "Agent", RawJson::parse(r#"{"prompt":"net"}"#)?),
///     ContentBlock::tool_use("toolu_2", "Agent", RawJson::parse(r#"{"prompt":"db"}"#)?),
/// ]);
/// let prefix = ForkPrefix::new(params, turn)?;
/// let net = prefix.child("audit src/net");
/// let db = prefix.child("audit src/db");
/// // Same prefix, different directive: the fingerprints differ only in the last message.
/// let brk = net.fingerprint().diff(&db.fingerprint()).expect("directives differ");
/// assert_eq!(brk.to_string(), "messages[2] changed");
/// # Ok::<(), forkhive_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ForkPrefix {
    shared: Arc<ForkShared>,
}

impl ForkPrefix {
    /// Prepares children of the parent turn `assistant`, made on top of `params` (the
    /// parent's cache-safe prefix, whose messages end just before `assistant`).
    ///
    /// Costs O(`assistant`): the parent's history is neither copied nor re-hashed.
    pub fn new(params: CacheSafeParams, assistant: Message) -> Result<Self> {
        ensure_assistant(&assistant)?;
        let placeholders = placeholder_results(&assistant);
        let base = params
            .fingerprint()
            .extend(std::slice::from_ref(&assistant));

        // The child's user message, encoded as Message::write_json would, up to the directive.
        let mut head = Vec::with_capacity(64 + 96 * placeholders.len() + FORK_BOILERPLATE.len());
        head.extend_from_slice(br#"{"role":"user","content":["#);
        for p in &placeholders {
            if serde_json::to_writer(&mut head, p).is_err() {
                debug_assert!(false, "serialising a placeholder failed");
            }
            head.push(b',');
        }
        head.extend_from_slice(br#"{"type":"text","text":""#);
        json::escape_str_into(&mut head, FORK_BOILERPLATE);
        json::escape_str_into(&mut head, FORK_DIRECTIVE_PREFIX);
        let user_state = Sha256::new_with_prefix(&head);

        Ok(Self {
            shared: Arc::new(ForkShared {
                params,
                assistant,
                placeholders,
                user_state,
                base,
            }),
        })
    }

    /// A child with the given directive. Allocates only the child's own text.
    pub fn child(&self, directive: &str) -> ForkChild {
        ForkChild {
            shared: Arc::clone(&self.shared),
            text: build_child_message(directive).into_boxed_str(),
        }
    }

    /// The parent's cache-safe prefix.
    pub fn params(&self) -> &CacheSafeParams {
        &self.shared.params
    }

    /// The parent's assistant turn every child repeats.
    pub fn assistant(&self) -> &Message {
        &self.shared.assistant
    }

    /// The placeholder results every child's user message starts with.
    pub fn placeholder_results(&self) -> &[ContentBlock] {
        &self.shared.placeholders
    }

    /// The fingerprint every child shares: the parent's prefix plus the assistant turn.
    pub fn shared_fingerprint(&self) -> &PrefixFingerprint {
        &self.shared.base
    }
}

impl fmt::Debug for ForkPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForkPrefix")
            .field("params", &self.shared.params)
            .field("tool_uses", &self.shared.placeholders.len())
            .finish()
    }
}

/// One fork child: the parent's prefix, the shared assistant turn and placeholders, and its
/// own directive.
#[derive(Clone)]
pub struct ForkChild {
    shared: Arc<ForkShared>,
    text: Box<str>,
}

impl ForkChild {
    /// The directive this child was given.
    pub fn directive(&self) -> &str {
        &self.text[FORK_BOILERPLATE.len() + FORK_DIRECTIVE_PREFIX.len()..]
    }

    /// The child message: boilerplate, then `fork-directive: <directive>`.
    pub fn child_message(&self) -> &str {
        &self.text
    }

    /// The parent's cache-safe prefix (shared, not copied).
    pub fn params(&self) -> &CacheSafeParams {
        &self.shared.params
    }

    /// The parent's assistant turn.
    pub fn assistant(&self) -> &Message {
        &self.shared.assistant
    }

    /// The placeholder results that open the child's user message.
    pub fn placeholder_results(&self) -> &[ContentBlock] {
        &self.shared.placeholders
    }

    /// The fingerprint every sibling shares: the parent's prefix plus the assistant turn.
    pub fn shared_fingerprint(&self) -> &PrefixFingerprint {
        &self.shared.base
    }

    /// The child message without the directive: the boilerplate and `fork-directive: `,
    /// identical for every sibling.
    pub fn child_message_head(&self) -> &str {
        &self.text[..FORK_BOILERPLATE.len() + FORK_DIRECTIVE_PREFIX.len()]
    }

    /// The child's user message, materialised.
    pub fn user_message(&self) -> Message {
        let mut content = Vec::with_capacity(self.shared.placeholders.len() + 1);
        content.extend_from_slice(&self.shared.placeholders);
        content.push(ContentBlock::text(&*self.text));
        Message::user(content)
    }

    /// The two messages the child appends to the parent's prefix, materialised.
    pub fn suffix(&self) -> [Message; 2] {
        [self.shared.assistant.clone(), self.user_message()]
    }

    /// The child's whole conversation, materialised (O(history): for inspection and tests).
    pub fn to_messages(&self) -> Vec<Message> {
        let history = self.shared.params.messages();
        let mut out = Vec::with_capacity(history.len() + 2);
        out.extend(history.iter().cloned());
        out.extend(self.suffix());
        out
    }

    /// The digest of the child's user message, from the shared hash state plus the
    /// directive: O(directive).
    pub fn user_message_digest(&self) -> Digest {
        let mut h = self.shared.user_state.clone();
        json::escape_str_chunks(self.directive(), |chunk| h.update(chunk));
        h.update(br#""}]}"#);
        Digest::finish(h)
    }

    /// The fingerprint of the child's whole prefix, in O(directive).
    ///
    /// Equal to the fingerprint of `params().with_messages(self.to_messages())`.
    pub fn fingerprint(&self) -> PrefixFingerprint {
        self.shared
            .base
            .extend_digests(&[self.user_message_digest()])
    }
}

impl fmt::Debug for ForkChild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForkChild")
            .field("directive", &self.directive())
            .field("tool_uses", &self.shared.placeholders.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::RawJson;

    fn assistant(n: usize) -> Message {
        let mut content = vec![ContentBlock::text("Splitting the work.")];
        for i in 0..n {
            content.push(ContentBlock::tool_use(
                format!("toolu_{i}"),
                "Agent",
                RawJson::parse(&format!(r#"{{"prompt": "part {i}"}}"#)).unwrap(),
            ));
        }
        Message::assistant(content)
    }

    #[test]
    fn placeholder_text_is_fixed() {
        assert_eq!(
            FORK_PLACEHOLDER_RESULT,
            "Fork started — processing in background"
        );
    }

    #[test]
    fn forked_messages_have_one_placeholder_per_tool_use_in_order() {
        let a = assistant(3);
        let msgs = build_forked_messages("do x", &a).unwrap();
        assert_eq!(msgs[0], a);
        let user = &msgs[1];
        assert_eq!(user.role, Role::User);
        assert_eq!(user.content.len(), 4);
        for (i, block) in user.content[..3].iter().enumerate() {
            assert_eq!(
                *block,
                ContentBlock::tool_result_text(format!("toolu_{i}"), FORK_PLACEHOLDER_RESULT)
            );
        }
        assert_eq!(
            user.content[3].as_text().unwrap(),
            build_child_message("do x")
        );
    }

    #[test]
    fn assistant_without_tool_use_yields_only_the_child_text() {
        let msgs = build_forked_messages("d", &Message::assistant_text("hi")).unwrap();
        assert_eq!(msgs[1], Message::user_text(build_child_message("d")));
    }

    #[test]
    fn forking_from_a_user_message_is_an_error() {
        let err = build_forked_messages("d", &Message::user_text("hi")).unwrap_err();
        assert!(matches!(
            err,
            Error::NotAnAssistantMessage { role: Role::User }
        ));
        assert_eq!(
            err.to_string(),
            "cannot fork from a user message: a fork starts from the parent's assistant message"
        );
        let params = CacheSafeParams::builder("m").build();
        assert!(ForkPrefix::new(params, Message::user_text("x")).is_err());
    }

    #[test]
    fn child_message_carries_the_report_rules() {
        let text = build_child_message("look");
        for needle in [
            "<fork-boilerplate>",
            "</fork-boilerplate>\n\nfork-directive: look",
            "not the main agent",
            "Do not spawn sub-agents",
            "Do not converse",
            "commit",
            "500 words",
            "\"Scope:\"",
            "Result:",
            "Key files:",
            "Files changed:",
            "Issues:",
        ] {
            assert!(text.contains(needle), "missing {needle:?}");
        }
    }

    #[test]
    fn fork_child_detection() {
        let history = vec![Message::user_text("hi"), Message::assistant_text("yo")];
        assert!(!is_in_fork_child(&history));
        let mut forked = history.clone();
        forked.extend(build_forked_messages("d", &assistant(1)).unwrap());
        assert!(is_in_fork_child(&forked));
        // The tag in an assistant message or a tool result does not count.
        let other = vec![
            Message::assistant_text(FORK_BOILERPLATE_TAG),
            Message::user(vec![ContentBlock::tool_result_text(
                "t",
                FORK_BOILERPLATE_TAG,
            )]),
        ];
        assert!(!is_in_fork_child(&other));
        // A user who quotes the tag, even at the start of a prompt, is not a fork child: no
        // placeholder results come with it, nor the rules whole.
        for text in [
            "What does <fork-boilerplate> mean in this log?".to_owned(),
            "<fork-boilerplate>\nthe first line of a pasted log".to_owned(),
        ] {
            let mut quoted = history.clone();
            quoted.push(Message::user_text(text.clone()));
            assert!(!is_in_fork_child(&quoted), "{text}");
        }
        // Nor is a tool's answer that reads like a placeholder, without the rules.
        let answered = vec![Message::user(vec![
            ContentBlock::tool_result_text("t", FORK_PLACEHOLDER_RESULT),
            ContentBlock::text("the next step"),
        ])];
        assert!(!is_in_fork_child(&answered));
    }

    #[test]
    fn worktree_notice_names_both_paths() {
        let n = build_worktree_notice(
            Path::new("/repo"),
            Path::new("/repo/.claude/worktrees/agent-a1"),
        );
        assert!(n.contains("working in /repo."));
        assert!(n.contains("/repo/.claude/worktrees/agent-a1"));
        assert!(n.contains("read a file again before you edit it"));
    }

    #[test]
    fn child_accessors_and_fingerprint_match_materialised_messages() {
        let params = CacheSafeParams::builder("m")
            .messages(vec![Message::user_text("go")])
            .build();
        let prefix = ForkPrefix::new(params.clone(), assistant(2)).unwrap();
        let child = prefix.child("line1\n\"quoted\" \u{1} é");
        assert_eq!(child.directive(), "line1\n\"quoted\" \u{1} é");
        assert_eq!(child.user_message().to_json().len(), {
            let m = build_forked_messages(child.directive(), prefix.assistant()).unwrap();
            m[1].to_json().len()
        });
        let full = params.with_messages(child.to_messages());
        assert_eq!(child.fingerprint(), *full.fingerprint());
        assert_eq!(
            child.user_message_digest(),
            full.fingerprint().message(2).unwrap()
        );
        assert!(is_in_fork_child(&child.to_messages()));
    }
}
