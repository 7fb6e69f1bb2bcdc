//! [`FnTool`]: a tool made of a definition and an async function, for hosts whose tool is a
//! few lines of code.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use forkhive_core::ToolDefinition;
use futures::future::BoxFuture;

use super::{InBackground, Tool, ToolContext, ToolOutput};

type Call = dyn Fn(serde_json::Value, ToolContext) -> BoxFuture<'static, ToolOutput> + Send + Sync;

/// A [`Tool`] from a definition and an async function of the (already validated) input and
/// the call's context.
///
/// By default it is treated as the cautious kind: it may change things (so it runs alone, in
/// call order) and background agents may use it. [`read_only`](Self::read_only) declares it
/// read-only and concurrency-safe.
///
/// ```
/// use forkhive_core::ToolDefinition;
/// use forkhive_spawn::tool::{FnTool, Tool, ToolOutput};
///
/// let schema = r#"{"type":"object","properties":{"text":{"type":"string"}}}"#;
/// let words = FnTool::new(
///     ToolDefinition::new("WordCount", "Counts the words of a text", schema)?,
///     |input, _cx| async move {
///         let n = input["text"].as_str().unwrap_or_default().split_whitespace().count();
///         ToolOutput::text(format!("{n} words"))
///     },
/// )
/// .read_only();
/// assert!(words.is_read_only() && words.is_concurrency_safe(&serde_json::json!({})));
/// # Ok::<(), forkhive_core::Error>(())
/// ```
pub struct FnTool {
    definition: ToolDefinition,
    read_only: bool,
    in_background: InBackground,
    call: Box<Call>,
}

impl FnTool {
    /// A tool named and described by `definition` whose calls run `f`.
    pub fn new<F, Fut>(definition: ToolDefinition, f: F) -> Self
    where
        F: Fn(serde_json::Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ToolOutput> + Send + 'static,
    {
        Self {
            definition,
            read_only: false,
            in_background: InBackground::Allowed,
            call: Box::new(move |input, cx| Box::pin(f(input, cx))),
        }
    }

    /// Declares the tool read-only, and so safe to run beside other concurrency-safe calls.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Whether background agents may use it (default: [`InBackground::Allowed`]).
    #[must_use]
    pub fn in_background(mut self, in_background: InBackground) -> Self {
        self.in_background = in_background;
        self
    }

    /// The tool behind an `Arc`, as a [`ToolPool`](super::ToolPool) takes it.
    pub fn arc(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

impl fmt::Debug for FnTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.definition.name)
            .field("read_only", &self.read_only)
            .finish()
    }
}

#[async_trait]
impl Tool for FnTool {
    fn definition(&self) -> &ToolDefinition {
        &self.definition
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        self.read_only
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    fn in_background(&self) -> InBackground {
        self.in_background
    }
    async fn call(&self, input: serde_json::Value, cx: &ToolContext) -> ToolOutput {
        (self.call)(input, cx.clone()).await
    }
}
