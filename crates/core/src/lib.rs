//! # forkhive-core
//!
//! The stable contract of forkhive: pure data and algorithms, no async runtime, no I/O.
//!
//! A prompt cache matches **bytes**, not meaning. A fork child is cheap only if its request is
//! byte-identical to its parent's up to the child's own directive. Everything here serves that
//! one idea.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`message`] | [`Message`], [`Role`], [`ContentBlock`]: provider-neutral, byte-stable, Anthropic-shaped JSON |
//! | [`params`] | [`CacheSafeParams`]: the five cache-key dimensions, built once, cloned in O(1), appended to in O(new messages) |
//! | [`list`] | [`MessageList`]: the conversation prefix, a persistent list shared by every turn built on it |
//! | [`fingerprint`] | [`PrefixFingerprint`]: SHA-256 per dimension and item, and a diff that names a cache break |
//! | [`fork`] | the placeholder result, the child message, [`ForkPrefix`] / [`ForkChild`], the recursion guard |
//! | [`notification`] | the `<task-notification>` envelope: escaped on the way out, strictly parsed on the way in |
//! | [`task_id`] | [`TaskId`]: kind prefix + 8 base-36 characters, validated because ids become file names |
//! | [`usage`] | [`Usage`]: input, output, cache-write and cache-read tokens, tool uses, duration |
//! | [`json`] | byte-exact JSON string escaping shared with the wire codecs |
//!
//! ## Example: fork three children and see that they share a cache prefix
//!
//! ```
//! use forkhive_core::{CacheSafeParams, ContentBlock, ForkPrefix, Message, RawJson, ToolDefinition};
//!
//! let params = CacheSafeParams::builder("claude-sonnet-4-5")
//!     .system_block("You are a careful engineer.")
//!     .tool(ToolDefinition::new("Read", "Read a file", r#"{"type":"object"}"#)?)
//!     .messages(vec![Message::user_text("Audit the networking code.")])
//!     .build();
//! let turn = Message::assistant(vec![
//!     ContentBlock::tool_use("toolu_1", "Agent", RawJson::parse(r#"{"prompt":"tcp"}"#)?),
//!     ContentBlock::tool_use("toolu_2", "Agent", RawJson::parse(r#"{"prompt":"tls"}"#)?),
//!     ContentBlock::tool_use("toolu_3", "Agent", RawJson::parse(r#"{"prompt":"dns"}"#)?),
//! ]);
//! let prefix = ForkPrefix::new(params, turn)?;
//! let children: Vec<_> = ["tcp", "tls", "dns"].iter().map(|d| prefix.child(d)).collect();
//!
//! // Every child repeats the parent's history and assistant turn...
//! for c in &children {
//!     assert_eq!(c.fingerprint().message(1), prefix.shared_fingerprint().message(1));
//! }
//! // ...and differs from its siblings only in its last message, the one with the directive.
//! let brk = children[0].fingerprint().diff(&children[1].fingerprint()).expect("differ");
//! assert_eq!(brk.to_string(), "messages[2] changed");
//! # Ok::<(), forkhive_core::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod error;
pub mod fingerprint;
pub mod fork;
pub mod json;
pub mod list;
pub mod message;
pub mod notification;
pub mod params;
pub mod task_id;
pub mod usage;

pub use error::{Error, Result};
pub use fingerprint::{CacheBreak, Change, Digest, Dimension, MessageDigests, PrefixFingerprint};
pub use fork::{ForkChild, ForkPrefix};
pub use list::{MessageIter, MessageList};
pub use message::{ContentBlock, ImageSource, Message, RawJson, Role, ToolResultContent};
pub use notification::{NotificationUsage, TaskNotification, TaskStatus};
pub use params::{CacheSafeParams, CacheSafeParamsBuilder, ThinkingConfig, ToolDefinition};
pub use task_id::{TaskId, TaskKind};
pub use usage::{PriceTable, Prices, Usage};
