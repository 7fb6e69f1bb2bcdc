//! Deterministic, realistic conversations shared by the benches and the examples.
#![allow(dead_code, unreachable_pub, missing_docs)]

use forkhive::core::{
    CacheSafeParams, CacheSafeParamsBuilder, ContentBlock, Message, RawJson, ToolDefinition,
};

pub const MODEL: &str = "claude-sonnet-4-5";

/// A system prompt of about 2 KiB.
pub fn system_prompt() -> String {
    let mut s = String::from(
        "You are an expert software engineer working in the user's repository. \
         Read before you edit, keep changes small, run the tests, and report what you did.\n",
    );
    for i in 0..24 {
        s.push_str(&format!(
            "- Rule {i}: prefer clear names, handle every error path, and never guess a file's contents.\n"
        ));
    }
    s
}

fn tool(name: &str, description: &str, schema: &str) -> ToolDefinition {
    match ToolDefinition::new(name, description, schema) {
        Ok(t) => t,
        Err(e) => panic!("fixture schema for {name} is invalid: {e}"),
    }
}

/// A tool list like a coding agent's.
pub fn tools() -> Vec<ToolDefinition> {
    vec![
        tool(
            "Read",
            "Read a file from the local filesystem.",
            r#"{"type":"object","properties":{"file_path":{"type":"string"},"offset":{"type":"integer"},"limit":{"type":"integer"}},"required":["file_path"]}"#,
        ),
        tool(
            "Grep",
            "Search file contents with a regular expression.",
            r#"{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"},"glob":{"type":"string"}},"required":["pattern"]}"#,
        ),
        tool(
            "Glob",
            "Find files by name pattern.",
            r#"{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]}"#,
        ),
        tool(
            "Bash",
            "Run a shell command.",
            r#"{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}},"required":["command"]}"#,
        ),
        tool(
            "Edit",
            "Replace a string in a file.",
            r#"{"type":"object","properties":{"file_path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"}},"required":["file_path","old_string","new_string"]}"#,
        ),
        tool(
            "Agent",
            "Delegate a task to a sub-agent.",
            r#"{"type":"object","properties":{"description":{"type":"string"},"prompt":{"type":"string"},"subagent_type":{"type":"string"}},"required":["description","prompt"]}"#,
        ),
    ]
}

fn raw(text: &str) -> RawJson {
    RawJson::parse(text).unwrap_or_else(|_| RawJson::empty_object())
}

/// One exploration turn: the model reads a file and the file comes back (~2 KiB).
fn turn(i: usize) -> [Message; 3] {
    let path = format!("src/module_{i}/mod.rs");
    let mut file = String::new();
    for line in 0..40 {
        file.push_str(&format!("{line:>4}\tpub fn handler_{i}_{line}(input: &str) -> Result<usize, Error> {{ Ok(input.len()) }}\n"));
    }
    [
        Message::assistant(vec![
            ContentBlock::text(format!("Let me look at {path} next.")),
            ContentBlock::tool_use(
                format!("toolu_{i:06}"),
                "Read",
                raw(&format!(r#"{{"file_path": "{path}"}}"#)),
            ),
        ]),
        Message::user(vec![ContentBlock::tool_result_text(
            format!("toolu_{i:06}"),
            file,
        )]),
        Message::user_text(format!("Noted module {i}. Continue.")),
    ]
}

/// A history whose JSON encoding is at least `target_bytes` long.
pub fn history(target_bytes: usize) -> Vec<Message> {
    let mut out = vec![Message::user_text(
        "Audit this repository for error-handling bugs and fix them.",
    )];
    let mut size = 0;
    let mut i = 0;
    while size < target_bytes {
        for m in turn(i) {
            size += m.to_json().len() + 1;
            out.push(m);
        }
        i += 1;
    }
    out
}

/// The parent's cache-safe prefix over a history of about `target_bytes`.
pub fn params(target_bytes: usize) -> CacheSafeParams {
    CacheSafeParams::builder(MODEL)
        .system_block(system_prompt())
        .system_context("gitStatus", "branch: main\nclean")
        .user_context("cwd", "/home/dev/project")
        .tools(tools())
        .messages(history(target_bytes))
        .build()
}

/// The parent turn that fans out into `n` forks.
pub fn fan_out_turn(n: usize) -> Message {
    let mut content = vec![ContentBlock::text(
        "I'll split this audit across parallel workers.",
    )];
    for i in 0..n {
        content.push(ContentBlock::tool_use(
            format!("toolu_fork_{i:02}"),
            "Agent",
            raw(&format!(
                r#"{{"description":"audit part {i}","prompt":"Audit part {i} of the repository."}}"#
            )),
        ));
    }
    Message::assistant(content)
}

/// The directive of the `i`-th child.
pub fn directive(i: usize) -> String {
    format!("Audit src/module_{i} and its callers for swallowed errors; fix what you find.")
}

/// The head every request of the benches' agent shares: system prompt, context and tools.
pub fn agent_builder() -> CacheSafeParamsBuilder {
    CacheSafeParams::builder(MODEL)
        .system_block(system_prompt())
        .system_context("gitStatus", "branch: main\nclean")
        .user_context("cwd", "/home/dev/project")
        .tools(tools())
}

/// The prompt an agent's conversation starts with.
pub fn agent_prompt() -> Message {
    Message::user_text("Audit this repository for swallowed errors and fix them; run the tests.")
}

/// Turn `i` of an agent: the model's message (a sentence and one tool call with a realistic
/// JSON input: a Read, a Bash command or an Edit) and the tool's result (~1.7 KiB of file or
/// command output). About 2 KiB of JSON per turn, 1 MiB after 500 turns. `salt` goes into the tool call's id, so
/// that turns made with different salts are different messages.
pub fn agent_turn(i: usize, salt: u64) -> [Message; 2] {
    let id = format!("toolu_{salt:04}_{i:06}");
    let module = i % 37;
    let path = format!("/home/dev/project/src/module_{module}/handler.rs");
    let (intro, name, input) = match i % 3 {
        0 => (
            format!("Let me read {path} to see how the handler reports errors before I change it."),
            "Read",
            format!(
                r#"{{"file_path": "{path}", "offset": {}, "limit": 60}}"#,
                (i * 7) % 400
            ),
        ),
        1 => (
            format!("I'll run the tests for module_{module} to check the current behaviour first."),
            "Bash",
            format!(
                r#"{{"command": "cargo test -p project-core --lib module_{module} -- --nocapture 2>&1 | tail -n 60", "timeout": 120000, "description": "Run module_{module}'s unit tests"}}"#
            ),
        ),
        _ => (
            format!("The parse error in {path} is swallowed; I'll propagate it with context."),
            "Edit",
            format!(
                r#"{{"file_path": "{path}", "old_string": "    let value = parse(input).unwrap_or_default();\n    Ok(value.len())", "new_string": "    let value = parse(input).map_err(|e| Error::Parse {{ input: input.to_owned(), source: e }})?;\n    Ok(value.len())"}}"#
            ),
        ),
    };
    let mut output = String::with_capacity(2048);
    for line in 0..20 {
        output.push_str(&format!(
            "{:>5}\t    let result_{i}_{line} = handler_{module}(&request, &context).map_err(Error::from)?;\n",
            line + 1 + (i * 7) % 400
        ));
    }
    [
        Message::assistant(vec![
            ContentBlock::text(intro),
            ContentBlock::tool_use(id.clone(), name, raw(&input)),
        ]),
        Message::user(vec![ContentBlock::tool_result_text(id, output)]),
    ]
}
