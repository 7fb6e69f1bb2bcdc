//! The agent loop: model turn → tool round → next turn, until the model stops.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`agent`] | [`Agent`] and [`AgentBuilder`]: the loop, resume, spawning a child's seed |
//! | [`context`] | [`AgentContext`]: identity, reachable through a tokio task-local |
//! | [`state`] | [`AgentState`] (cloned for a child) and [`TreeState`] (shared by the tree) |
//! | [`pending`] | [`PendingQueue`]: messages delivered at the next tool round |
//! | [`events`] | [`AgentEvent`]s for hosts |
//! | [`outcome`] | [`StopReason`], [`Limits`], [`AgentRun`] |

pub mod agent;
pub use crate::base::{children, context, events, outcome, pending, state};

pub(crate) use agent::AgentShared;
pub use agent::{Agent, AgentBuilder, ChildSeed, ResumeReport};
pub use children::{ChildLedger, ChildReport};
pub use context::{AgentContext, AgentKind, QuerySource};
pub use events::{AgentEvent, EventKind, EventSink, FnSink};
pub use outcome::{AgentRun, Limits, StopReason, TurnRecord};
pub use pending::{Expectation, Halt, PendingMessage, PendingQueue, PromiseHandle, Receipt, Wake};
pub use state::{AgentState, Extensions, FileStamp, TreeState, TurnSnapshot};
/// The token that stops an agent and everything it started ([`AgentBuilder::cancellation`],
/// [`Agent::cancellation`]): tokio-util's, re-exported so a host needs no dependency of its
/// own to make one.
pub use tokio_util::sync::CancellationToken;
