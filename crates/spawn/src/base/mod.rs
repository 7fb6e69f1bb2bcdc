//! What every layer of the crate shares, below `tool` and `transcript`: an agent's identity
//! ([`context`]), its own and its tree's state ([`state`]), its events ([`events`]), how a
//! run ends ([`outcome`]), its pending messages ([`pending`]) and the children it started
//! ([`children`]).
//!
//! These are leaves: they import nothing else of the crate but its error type, so `tool`,
//! `transcript`, `runtime` and everything above can build on them without a cycle. Their
//! public path is [`crate::runtime`], which re-exports them.

pub mod children;
pub(crate) mod conformance;
pub mod context;
pub mod events;
pub(crate) mod files;
pub(crate) mod ids;
pub(crate) mod launched;
pub mod outcome;
pub mod pending;
pub mod state;
