//! # forkhive-spawn
//!
//! The agent runtime of forkhive.

#![forbid(unsafe_code)]

pub mod definition;
pub mod error;

pub use error::{Error, Result};
