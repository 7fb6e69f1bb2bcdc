//! # forkhive-spawn
//!
//! The agent runtime and the spawn strategies of forkhive. This crate will hold:
//!
//! - the **runtime** (the agent loop): model turn, tool calls (consecutive concurrency-safe
//!   calls in parallel, the rest serially), tool results, next turn — until the model stops,
//!   `max_turns`, or cancellation; a task-local agent context, a cancellation token linked to
//!   the parent's, and a transcript persisted as it goes;
//! - **tools** and tool pools with the three filtering layers;
//! - **agent definitions**: built-ins and custom agents from Markdown frontmatter;
//! - the **spawn strategies** — subagent, fork, coordinator, teammate — behind one trait, and
//!   the Agent tool that routes to them;
//! - **tasks**: background agents, output files, notifications delivered exactly once;
//! - **teams**: SendMessage, mailboxes, control messages, the scratchpad;
//! - **isolation**: same-directory and git worktrees.
//!
//! It builds on [`forkhive_core`] (data and algorithms) and [`forkhive_transport`] (backends).
//! Nothing is exported yet: the runtime lands with the agent-runtime work.

#![forbid(unsafe_code)]
