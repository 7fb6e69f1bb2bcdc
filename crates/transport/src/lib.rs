//! # forkhive-transport
//!
//! How a cache-safe prefix becomes bytes on the wire and reaches a model.
