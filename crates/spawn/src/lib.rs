//! # forkhive-spawn
//!
//! The agent runtime of forkhive: the loop every agent runs on, its tools, permissions and
//! transcripts, and agent definitions.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`runtime`] | [`Agent`](runtime::Agent) and its builder: model turn → tool round → next turn; identity ([`AgentContext`](runtime::AgentContext), task-local), pending messages, events, stop reasons, limits |
//! | [`tool`] | the [`Tool`](tool::Tool) trait, [`ToolPool`](tool::ToolPool), tool rounds, permission policies, the three filtering layers, `Read`/`LS` |
//! | [`transcript`] | per-agent JSONL transcripts, read back byte for byte |
//! | [`definition`] | [`AgentDefinition`](definition::AgentDefinition), built-ins, the Markdown loader and the registry |
//! | [`strategy`] | [`SpawnStrategy`](strategy::SpawnStrategy): how a child is built — a fresh [`Subagent`](strategy::Subagent) or a cache-sharing [`Fork`](strategy::Fork); `/btw` and the verification agent |
//! | [`task`] | [`TaskService`](task::TaskService), the one owner of every child's life; the [`TaskRegistry`](task::TaskRegistry); output files |
//! | [`agent_tool`] | the [`AgentTool`](agent_tool::AgentTool) a model spawns children with |
//! | [`error`] | [`Error`], the crate's one error type |
//!
//! It builds on [`forkhive_core`] (data and algorithms) and [`forkhive_transport`] (backends).
//!
//! ## Example: an agent that calls a tool
//!
//! ```
//! use std::sync::Arc;
//! use forkhive_core::{ContentBlock, Message, RawJson, Usage};
//! use forkhive_spawn::runtime::{Agent, StopReason};
//! use forkhive_spawn::tool::{ListDir, ToolPool};
//! use forkhive_transport::{Response, ScriptedBackend, ModelStop};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("README.md"), "hello")?;
//! // A scripted model: list the directory, then answer.
//! let backend = Arc::new(ScriptedBackend::from_replies([
//!     Ok(Response {
//!         message: Message::assistant(vec![ContentBlock::tool_use(
//!             "toolu_1", "LS", RawJson::parse(r#"{"path":"."}"#)?,
//!         )]),
//!         stop_reason: Some(ModelStop::ToolUse),
//!         usage: Usage::default(),
//!         id: None,
//!         model: None,
//!     }),
//!     Ok(Response::text("There is a README.", Usage::default())),
//! ]));
//! let mut agent = Agent::builder(backend.clone())
//!     .model("claude-sonnet-4-5")
//!     .tools(ToolPool::new([Arc::new(ListDir::new(dir.path()).await?) as _])?)
//!     .build()
//!     .await?;
//! let run = agent.run("What is in this directory?").await;
//! assert_eq!(run.stop, StopReason::Completed);
//! assert_eq!(run.final_text, "There is a README.");
//! assert_eq!(run.tool_calls(), 1);
//! // The tool's result went back to the model in the second request.
//! let second = backend.requests()[1].all_messages();
//! assert!(matches!(&second[2].content[0], ContentBlock::ToolResult { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

#![forbid(unsafe_code)]

/// Consuming setters for a configuration struct, one per public field:
/// `with_<field>(value)` sets the field and returns the struct, so a host writes
/// `Limits::default().with_max_turns(Some(5))` (the structs are `#[non_exhaustive]`: fields
/// added later break no host).
macro_rules! setters {
    ($ty:ty { $($setter:ident => $field:ident : $fty:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $setter(mut self, value: $fty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

pub mod agent_tool;
mod base;
pub mod control;
pub mod coordinator;
pub mod definition;
pub mod error;
pub mod hook;
pub mod mailbox;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "redis")]
pub mod pool;
pub mod runtime;
pub mod strategy;
pub mod task;
pub mod team;
pub mod timeline;
pub mod tool;
pub mod transcript;
pub mod worktree;

pub use error::{Error, Result};
