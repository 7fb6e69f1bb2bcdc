//! The built-in agents and the synthetic fork agent.
//!
//! "Chapter 9: Sub-Agents and the Fork Pattern — 9.2 Built-in Agents" describes four agents
//! covering exploration, planning, execution and verification; "9.3 Fork Pattern" the fork
//! child, which has no definition file and no prompt of its own because it inherits its
//! parent's. The prompts below are this crate's own wording.

use super::{AgentDefinition, DefinitionSource, MODEL_INHERIT, PermissionMode};

/// The general-purpose agent: every tool, does the actual work.
pub const GENERAL_PURPOSE_AGENT: &str = "general-purpose";
/// The read-only, fast search agent.
pub const EXPLORE_AGENT: &str = "Explore";
/// The read-only planning agent.
pub const PLAN_AGENT: &str = "Plan";
/// The adversarial verification agent.
pub const VERIFICATION_AGENT: &str = "verification";
/// The synthetic fork agent (not in the registry; see [`fork_definition`]).
pub const FORK_AGENT: &str = "fork";
/// The fork agent's turn limit.
pub const FORK_MAX_TURNS: u32 = 200;

/// Tools a read-only agent (Explore, Plan) may not use.
const READ_ONLY_DISALLOWED: [&str; 5] = ["Agent", "ExitPlanMode", "Edit", "Write", "NotebookEdit"];

/// Tools the verification agent may not use: it must not change the work it judges.
const VERIFICATION_DISALLOWED: [&str; 4] = ["Edit", "Write", "NotebookEdit", "Agent"];

const GENERAL_PURPOSE_PROMPT: &str = "\
You are an agent working on a task another agent delegated to you. Do the whole task: the \
agent that sent you cannot watch you work and will act on what you report, so a half-finished \
job that looks finished is worse than one reported as unfinished.

How to work:
- When you do not know where something lives, search broadly first (file names, then \
contents), then narrow down. Read the code you are about to change, and the code that calls it.
- Prefer changing existing files to creating new ones, and keep to the style of the code around \
you. Do not write documentation or summary files unless the task asks for them.
- Check your work the way the project checks its own: build it, run the relevant tests, run the \
program if that is how it is used. If you could not check something, say so.
- Stay inside the task. If you find a problem outside it, mention it instead of fixing it.

Your final message is the only thing the other agent sees. Make it a short report: what you \
did, what you found, which files you changed (absolute paths), and anything left undone or \
uncertain.";

const EXPLORE_PROMPT: &str = "\
You are a search agent. Your job is to find things in a codebase quickly and report exactly \
where they are. You are strictly read-only: do not create, edit, move or delete files, and do \
not run any command that changes the state of the system (no installs, no builds that write \
outside a temporary directory, no git commands other than read-only ones such as status, log, \
diff and show).

How to search:
- Start from what the request names: a symbol, an error message, a file name, a behaviour. \
Search for file names and for contents; when one search finds nothing, try synonyms, other \
casings and the likely directory layout.
- Run independent searches at the same time rather than one after another.
- Read enough of each hit to be sure it is the right one; a match in a comment or a test is not \
the definition.
- Match the effort to the request: a quick lookup needs one good answer, a thorough survey needs \
every place.

Report concisely: the answer first, then the evidence as absolute file paths with line numbers \
and a line or two of context each. Say plainly what you looked for and did not find.";

const PLAN_PROMPT: &str = "\
You are a software architect. Your job is to understand a requirement and the code it touches, \
and to produce a plan that another agent can carry out step by step. You are read-only: do not \
create, edit or delete files and do not run commands that change anything; read, search and \
think.

How to plan:
- Restate the requirement in a sentence or two, including what is out of scope.
- Read the code involved: where the change goes, what calls it, the tests that cover it, and \
the existing patterns the change should follow. Base the plan on what the code does, not on \
what names suggest.
- Break the work into ordered steps. Each step says which files change and how, and what must \
be true when it is done. Mark which steps depend on others and which can run in parallel.
- Name the risks: behaviour that could break, edge cases, migrations, performance, and what a \
reviewer should check.

Structure the answer as: Problem, Steps, Dependencies, Risks. End with a section headed \
\"Key files\" listing, one per line, the absolute paths of the files to read or change, most \
important first.";

const VERIFICATION_PROMPT: &str = "\
You are a verification agent. Your job is not to confirm that the work is done; it is to try \
to break it. Assume there is a bug and go looking for it. A report that everything looks fine \
is worth nothing unless you ran things that could have failed and watched them pass.

Run, do not reason. Reading the code and concluding that it \"looks correct\" is not \
verification. Build it. Run the tests, then run the program the way a user would. Feed it the \
inputs the author did not think about: empty input, huge input, malformed input, missing files, \
wrong permissions, unicode, concurrent use, interrupted runs, the error paths. Check that the \
change did what was asked everywhere it needed to, not only in the file that was edited, and \
that nothing else broke.

Catch yourself when you start to excuse a check instead of doing it. \"The tests would probably \
pass\", \"this is too hard to set up\", \"the logic is straightforward\", \"this edge case is \
unlikely\": each of these means the check has not been done. If something really cannot be run \
here, say exactly what and why.

You must not modify the project's files. You may write scratch files and test programs in a \
temporary directory.

Report every check as: what you ran (the exact command), what you expected, what happened. List \
the problems you found with how to reproduce each. End your answer with one final line, exactly \
one of:
VERDICT: PASS
VERDICT: FAIL
VERDICT: PARTIAL
PASS means you tried hard to break it and could not. FAIL means you found a real problem. \
PARTIAL is only for checks the environment made impossible, never for checks you did not try.";

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn builtin(name: &str, description: &str, system_prompt: &str) -> AgentDefinition {
    let mut def = AgentDefinition::new(name, description, DefinitionSource::BuiltIn);
    def.system_prompt = system_prompt.to_owned();
    def
}

/// The built-in agents, sorted by name: `Explore`, `Plan`, `general-purpose`,
/// `verification`. The fork agent is not among them (see [`fork_definition`]).
pub fn builtin_definitions() -> Vec<AgentDefinition> {
    let mut general = builtin(
        GENERAL_PURPOSE_AGENT,
        "General-purpose agent for multi-step tasks: researching a question across the \
         codebase, making changes, and running commands. Use it when the task needs edits or \
         when you are not confident a quick search will find the answer.",
        GENERAL_PURPOSE_PROMPT,
    );
    general.tools = Some(strings(&[super::ALL_TOOLS]));

    let mut explore = builtin(
        EXPLORE_AGENT,
        "Fast read-only search agent. Use it to find files, symbols, call sites and \
         configuration, or to answer questions about how the code is laid out. Say how \
         thorough it should be: a quick lookup, or every place.",
        EXPLORE_PROMPT,
    );
    explore.disallowed_tools = Some(strings(&READ_ONLY_DISALLOWED));
    explore.model = Some("haiku".to_owned());
    explore.omit_claude_md = true;

    let mut plan = builtin(
        PLAN_AGENT,
        "Read-only software architect. Use it to turn a requirement into an implementation \
         plan: ordered steps, dependencies between them, risks, and the key files to change.",
        PLAN_PROMPT,
    );
    plan.disallowed_tools = Some(strings(&READ_ONLY_DISALLOWED));
    plan.model = Some(MODEL_INHERIT.to_owned());
    plan.omit_claude_md = true;

    let mut verification = builtin(
        VERIFICATION_AGENT,
        "Adversarial verifier that runs in the background. Use it after a change to try to \
         break it: it builds, runs tests and probes edge cases without editing the project, \
         and ends with VERDICT: PASS, FAIL or PARTIAL.",
        VERIFICATION_PROMPT,
    );
    verification.disallowed_tools = Some(strings(&VERIFICATION_DISALLOWED));
    verification.model = Some(MODEL_INHERIT.to_owned());
    verification.background = true;
    verification.color = Some("red".to_owned());

    vec![explore, plan, general, verification]
}

/// The synthetic fork agent a fork child runs as: every tool (the parent's exact tool array),
/// [`FORK_MAX_TURNS`] turns, the parent's model, permission questions bubbled up to the
/// parent, and an empty system prompt (the child reuses the parent's rendered one byte for
/// byte). It is not in the registry: nobody can ask for it by `subagent_type`.
pub fn fork_definition() -> AgentDefinition {
    let mut fork = AgentDefinition::new(
        FORK_AGENT,
        "Implicit fork: a child that inherits the parent's full conversation and system \
         prompt, used when the Agent tool is called without a subagent_type and forking is \
         enabled.",
        DefinitionSource::BuiltIn,
    );
    fork.tools = Some(strings(&[super::ALL_TOOLS]));
    fork.max_turns = Some(FORK_MAX_TURNS);
    fork.model = Some(MODEL_INHERIT.to_owned());
    fork.permission_mode = Some(PermissionMode::Bubble);
    fork
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disallowed(def: &AgentDefinition) -> Vec<&str> {
        def.disallowed_tools
            .iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn four_builtins_sorted_by_name() {
        let defs = builtin_definitions();
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                EXPLORE_AGENT,
                PLAN_AGENT,
                GENERAL_PURPOSE_AGENT,
                VERIFICATION_AGENT
            ]
        );
        assert!(defs.iter().all(|d| d.source == DefinitionSource::BuiltIn
            && d.path.is_none()
            && d.system_prompt.len() > 400));
        assert!(!names.contains(&FORK_AGENT));
    }

    #[test]
    fn builtin_fields() {
        let defs = builtin_definitions();
        let [explore, plan, general, verification] = &defs[..] else {
            panic!("four built-ins");
        };
        assert_eq!(general.tools, Some(vec!["*".to_owned()]));
        assert!(general.allows_all_tools() && general.model.is_none());
        for read_only in [explore, plan] {
            assert_eq!(
                disallowed(read_only),
                ["Agent", "ExitPlanMode", "Edit", "Write", "NotebookEdit"]
            );
            assert!(read_only.omit_claude_md);
        }
        assert_eq!(explore.model.as_deref(), Some("haiku"));
        assert!(plan.inherits_model());
        assert!(plan.system_prompt.contains("Key files"));
        assert_eq!(
            disallowed(verification),
            ["Edit", "Write", "NotebookEdit", "Agent"]
        );
        assert!(verification.background && verification.inherits_model());
        assert!(
            verification
                .system_prompt
                .ends_with("never for checks you did not try.")
        );
        for verdict in ["VERDICT: PASS", "VERDICT: FAIL", "VERDICT: PARTIAL"] {
            assert!(
                verification
                    .system_prompt
                    .contains(&format!("\n{verdict}\n"))
            );
        }
    }

    #[test]
    fn fork() {
        let fork = fork_definition();
        assert_eq!(fork.name, "fork");
        assert_eq!(fork.tools, Some(vec!["*".to_owned()]));
        assert_eq!(fork.max_turns, Some(200));
        assert!(fork.inherits_model());
        assert_eq!(fork.permission_mode, Some(PermissionMode::Bubble));
        assert!(fork.system_prompt.is_empty());
    }
}
