//! What the examples share: git on the command line, and two writing tools that work in a
//! root directory and re-root into a worker's worktree.

#![allow(dead_code)]

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use forkhive::core::ToolDefinition;
use forkhive::spawn::tool::{Tool, ToolContext, ToolOutput};

/// Runs `git -C dir args…` with a fixed identity; its trimmed stdout, or what it said.
/// `text` in an agent definition's `color` (Claude Code's names: red, blue, green, yellow,
/// purple, orange, pink, cyan) when standard output is a terminal; as it is otherwise, or for a
/// colour it does not know.
#[allow(dead_code)]
pub(crate) fn paint(text: &str, color: Option<&str>) -> String {
    use std::io::IsTerminal as _;
    let code = match color {
        Some("red") => "31",
        Some("green") => "32",
        Some("yellow") => "33",
        Some("blue") => "34",
        Some("purple") => "35",
        Some("cyan") => "36",
        Some("orange") => "38;5;208",
        Some("pink") => "38;5;205",
        _ => return text.to_owned(),
    };
    if std::io::stdout().is_terminal() {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

/// The process's user + system CPU time (Linux `/proc/self/stat`, in 10 ms ticks).
#[allow(dead_code)]
pub(crate) fn cpu_time() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ticks * 10))
}

/// The mailboxes the measuring examples compare: in memory, Claude Code's inbox files under
/// `dir`, and — built with the `redis` feature and given `FORKHIVE_REDIS_URL`
/// (`scripts/redis-server.sh start`) — Redis streams, under a key prefix of this run's own.
#[allow(dead_code)]
pub(crate) fn mailboxes(
    dir: &Path,
) -> Vec<(
    &'static str,
    std::sync::Arc<dyn forkhive::spawn::mailbox::Mailbox>,
)> {
    use forkhive::spawn::mailbox::{FileMailbox, MemoryMailbox};
    #[allow(unused_mut)]
    let mut all: Vec<(
        &'static str,
        std::sync::Arc<dyn forkhive::spawn::mailbox::Mailbox>,
    )> = vec![
        ("memory", std::sync::Arc::new(MemoryMailbox::new())),
        ("file", std::sync::Arc::new(FileMailbox::new(dir))),
    ];
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("FORKHIVE_REDIS_URL") {
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        match forkhive::spawn::mailbox::RedisMailbox::with_prefix(&url, &format!("ex{run}")) {
            Ok(m) => all.push(("redis", std::sync::Arc::new(m))),
            Err(e) => eprintln!("FORKHIVE_REDIS_URL: {e}"),
        }
    }
    all
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=calc", "-c", "user.email=calc@example.com"])
        .args(args)
        .output()
        .map_err(|e| format!("could not run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

// The workers' writing tools: both work in a root directory, and re-root into a worktree.

/// A relative path under `root` with no `..` and no symbolic link on the way.
fn inside(root: &Path, path: &str) -> Result<PathBuf, String> {
    let rel = Path::new(path);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("`{path}` must be a relative path without `..`"));
    }
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!("`{path}` goes through a symbolic link"));
        }
    }
    Ok(at)
}

/// `Edit`: writes a whole file.
#[derive(Debug)]
pub(crate) struct Edit {
    root: PathBuf,
    def: ToolDefinition,
}

impl Edit {
    pub(crate) fn new(root: &Path) -> Self {
        let def = ToolDefinition::new(
            "Edit",
            "Write a file's whole new content. `path` is relative to the working directory.",
            r#"{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"],"additionalProperties":false}"#,
        )
        .expect("a valid schema");
        Self {
            root: root.to_path_buf(),
            def,
        }
    }
}

#[async_trait]
impl Tool for Edit {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        false
    }
    async fn rooted(&self, root: &Path) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Edit::new(root)))
    }
    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        let (Some(path), Some(content)) = (input["path"].as_str(), input["content"].as_str())
        else {
            return ToolOutput::error("`path` and `content` must be strings");
        };
        let file = match inside(&self.root, path) {
            Ok(f) => f,
            Err(e) => return ToolOutput::error(e),
        };
        if let Some(dir) = file.parent()
            && let Err(e) = tokio::fs::create_dir_all(dir).await
        {
            return ToolOutput::error(format!("creating {}: {e}", dir.display()));
        }
        match tokio::fs::write(&file, content).await {
            Ok(()) => ToolOutput::text(format!("wrote {path} ({} bytes)", content.len())),
            Err(e) => ToolOutput::error(format!("writing {path}: {e}")),
        }
    }
}

/// `Commit`: commits everything in its working directory.
#[derive(Debug)]
pub(crate) struct Commit {
    root: PathBuf,
    def: ToolDefinition,
}

impl Commit {
    pub(crate) fn new(root: &Path) -> Self {
        let def = ToolDefinition::new(
            "Commit",
            "Commit every change in the working directory on its current branch.",
            r#"{"type":"object","properties":{"message":{"type":"string"}},"required":["message"],"additionalProperties":false}"#,
        )
        .expect("a valid schema");
        Self {
            root: root.to_path_buf(),
            def,
        }
    }
}

#[async_trait]
impl Tool for Commit {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn is_concurrency_safe(&self, _input: &serde_json::Value) -> bool {
        false
    }
    fn is_read_only(&self) -> bool {
        false
    }
    async fn rooted(&self, root: &Path) -> Option<Arc<dyn Tool>> {
        Some(Arc::new(Commit::new(root)))
    }
    async fn call(&self, input: serde_json::Value, _cx: &ToolContext) -> ToolOutput {
        let Some(message) = input["message"].as_str().map(str::to_owned) else {
            return ToolOutput::error("`message` must be a string");
        };
        let root = self.root.clone();
        let done = tokio::task::spawn_blocking(move || {
            git(&root, &["add", "-A"])?;
            git(&root, &["commit", "-q", "-m", &message])?;
            Ok::<_, String>(format!(
                "committed {} on {}",
                git(&root, &["rev-parse", "--short", "HEAD"])?,
                git(&root, &["branch", "--show-current"])?
            ))
        })
        .await;
        match done {
            Ok(Ok(text)) => ToolOutput::text(text),
            Ok(Err(e)) => ToolOutput::error(e),
            Err(e) => ToolOutput::error(format!("commit task failed: {e}")),
        }
    }
}
