#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The definition loader against small fixtures that reproduce what real agent files look
//! like (CRLF, block scalars, unquoted `: `, bare `*`, unknown keys, no frontmatter, ...), the
//! merge by source priority, and — when it is present next to the repository — the corpus of
//! real agent files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use forkhive_spawn::definition::{
    AgentLoader, AgentRegistry, DefinitionSource, Diagnostic, FileStatus, LoadReport,
    PermissionMode, load_dir, load_file,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents")
}

/// `messy/x.md:3:14: message`: a diagnostic with its path relative to the fixtures.
fn rel(d: &Diagnostic) -> String {
    let path = d.path.strip_prefix(fixtures()).unwrap_or(&d.path);
    format!("{}:{}:{}: {}", path.display(), d.line, d.column, d.message)
}

fn messy() -> LoadReport {
    load_dir(&fixtures().join("messy"), DefinitionSource::Project).unwrap()
}

fn warnings_of(report: &LoadReport, file: &str) -> Vec<String> {
    report
        .warnings
        .iter()
        .filter(|w| w.path.ends_with(file))
        .map(rel)
        .collect()
}

fn error_of(report: &LoadReport, file: &str) -> String {
    let errors: Vec<String> = report
        .errors
        .iter()
        .filter(|e| e.path.ends_with(file))
        .map(rel)
        .collect();
    assert_eq!(errors.len(), 1, "{file}: {errors:?}");
    errors[0].clone()
}

fn status_of(report: &LoadReport, file: &str) -> FileStatus {
    report
        .files
        .iter()
        .find(|f| f.path.ends_with(file))
        .map(|f| f.status)
        .unwrap()
}

fn registry_of(report: LoadReport) -> AgentRegistry {
    AgentRegistry::from_report(report)
}

#[test]
fn every_messy_file_is_accounted_for_once() {
    let report = messy();
    let files: Vec<String> = report
        .files
        .iter()
        .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // Sorted, only `*.md` (notes.txt is not looked at), each once.
    assert_eq!(
        files,
        [
            "block-description.md",
            "colon-description.md",
            "colon-multiline.md",
            "crlf.md",
            "dashes-closing.md",
            "empty.md",
            "folded-description.md",
            "indented-fence.md",
            "malformed.md",
            "missing-name.md",
            "no-frontmatter.md",
            "odd-values.md",
            "tools-list.md",
            "tools-single.md",
            "tools-star-bare.md",
            "tools-star-quoted.md",
            "tools-string.md",
            "unclosed.md",
            "unindented-example.md",
            "unknown-keys.md",
        ]
    );
    assert_eq!(report.count(FileStatus::Loaded), 7);
    // `tools-string.md`'s `Bash(npm test:*)` is a warning: the rule is not enforced.
    assert_eq!(status_of(&report, "tools-string.md"), FileStatus::Recovered);
    assert_eq!(report.count(FileStatus::Recovered), 6);
    assert_eq!(report.count(FileStatus::Rejected), 7);
    assert_eq!(report.errors.len(), 7);
    assert_eq!(report.definitions.len(), 13);
    // The same report on every run.
    assert_eq!(messy(), report);
}

#[test]
fn crlf_file() {
    let report = messy();
    assert_eq!(status_of(&report, "crlf.md"), FileStatus::Loaded);
    let r = registry_of(report);
    let d = r.get("crlf-agent").unwrap();
    assert_eq!(d.description, "Written on Windows");
    assert_eq!(d.tools, Some(vec!["Read".to_owned(), "Grep".to_owned()]));
    assert_eq!(d.model.as_deref(), Some("sonnet"));
    assert_eq!(
        d.system_prompt,
        "You were written with CRLF line endings.\nKeep going."
    );
}

#[test]
fn block_scalar_descriptions_are_kept_as_yaml_gives_them() {
    let r = registry_of(messy());
    assert_eq!(
        r.get("block-description").unwrap().description,
        "Use this agent for reviews.\n\n<example>\nuser: \"Review my diff\"\nassistant: \
         \"Launching the reviewer\"\n</example>\n"
    );
    let folded = r.get("folded-description").unwrap();
    assert_eq!(
        folded.description,
        "Senior embedded engineer for ARM Cortex-M firmware: drivers, interrupts and DMA."
    );
    assert_eq!(folded.tools, Some(vec![]));
    assert!(!folded.allows_all_tools());
}

#[test]
fn tool_lists_as_string_list_single_and_star() {
    let r = registry_of(messy());
    let tools = |name: &str| r.get(name).unwrap().tools.clone();
    assert_eq!(
        tools("tools-string"),
        Some(
            [
                "Read",
                "Grep",
                "Glob",
                "Bash(npm test:*)",
                "mcp__github__create_issue"
            ]
            .map(String::from)
            .to_vec()
        )
    );
    assert_eq!(
        tools("tools-list"),
        Some(vec!["Read".into(), "Grep".into()])
    );
    assert_eq!(
        r.get("tools-list").unwrap().disallowed_tools,
        Some(vec!["Write".into(), "Edit".into()])
    );
    assert_eq!(tools("tools-single"), Some(vec!["Read".into()]));
    assert_eq!(tools("tools-star-quoted"), Some(vec!["*".into()]));
    assert_eq!(tools("tools-star-bare"), Some(vec!["*".into()]));
    assert!(r.get("tools-star-bare").unwrap().allows_all_tools());
    assert_eq!(tools("unknown-keys"), None);
}

#[test]
fn bare_star_is_recovered_with_an_exact_warning() {
    let report = messy();
    assert_eq!(
        status_of(&report, "tools-star-bare.md"),
        FileStatus::Recovered
    );
    assert_eq!(
        warnings_of(&report, "tools-star-bare.md"),
        [
            "messy/tools-star-bare.md:4:8: the value of `tools` is a bare `*`, which YAML reads as \
          an alias; it was read as the string `*`; quote it: `tools: \"*\"`"
        ]
    );
}

#[test]
fn unknown_keys_are_kept_sorted() {
    let report = messy();
    assert_eq!(status_of(&report, "unknown-keys.md"), FileStatus::Loaded);
    let r = registry_of(report);
    let d = r.get("unknown-keys").unwrap();
    let keys: Vec<&str> = d.extra.keys().map(String::as_str).collect();
    assert_eq!(keys, ["author", "expertise_level", "tags", "version"]);
    assert_eq!(d.extra["tags"], serde_json::json!(["review", "quality"]));
    assert_eq!(d.extra["version"], serde_json::json!("1.0.0"));
    assert_eq!(d.color.as_deref(), Some("purple"));
}

#[test]
fn unquoted_colon_in_a_one_line_description_is_recovered() {
    let report = messy();
    assert_eq!(
        status_of(&report, "colon-description.md"),
        FileStatus::Recovered
    );
    assert_eq!(
        warnings_of(&report, "colon-description.md"),
        [
            "messy/colon-description.md:3:14: the value of `description` contains `: `; it was \
          read as a literal string; quote it or use a block scalar `|`"
        ]
    );
    let r = registry_of(report);
    let d = r.get("colon-description").unwrap();
    assert_eq!(
        d.description,
        "Use this agent when you need: a review of a diff. Examples: <example>Context: a \
         PR</example>"
    );
    assert_eq!(d.model.as_deref(), Some("sonnet"));
}

#[test]
fn unquoted_colon_in_a_multi_line_description_is_recovered() {
    let report = messy();
    assert_eq!(
        warnings_of(&report, "colon-multiline.md"),
        [
            "messy/colon-multiline.md:3:14: the value of `description` (lines 3-8) contains `: `; \
          it was read as a literal string; make it a block scalar: `description: |` with the \
          text indented under it"
        ]
    );
    let r = registry_of(report);
    let d = r.get("colon-multiline").unwrap();
    assert_eq!(
        d.description,
        "Improves prompts.\n\n<example>\nuser: summarize emails\nassistant: here is a better \
         prompt\n</example>"
    );
    assert!(d.inherits_model());
}

#[test]
fn closing_line_of_many_dashes_is_recovered() {
    let report = messy();
    assert_eq!(
        warnings_of(&report, "dashes-closing.md"),
        [
            "messy/dashes-closing.md:5:1: the frontmatter is closed by a line of 56 dashes; it was \
          read as `---`; close the frontmatter with exactly `---`"
        ]
    );
    let r = registry_of(report);
    assert_eq!(r.get("dashes-closing").unwrap().system_prompt, "# Body");
}

#[test]
fn odd_values_are_warnings_not_failures() {
    let report = messy();
    assert_eq!(status_of(&report, "odd-values.md"), FileStatus::Recovered);
    assert_eq!(
        warnings_of(&report, "odd-values.md"),
        [
            "messy/odd-values.md:4:8: `model` `Claude Sonnet 4.5 (copilot)` contains spaces, so \
             it is not a model id or alias; it was kept as written; use an alias (`sonnet`, \
             `opus`, `haiku`), a model id, or `inherit`",
            "messy/odd-values.md:5:17: unknown `permissionMode` `yolo`; expected `default`, \
             `acceptEdits`, `bypassPermissions`, `plan`, `dontAsk` or `bubble`; it was ignored",
            "messy/odd-values.md:7:8: `tools` entry `Microsoft Docs` contains a space; separate \
             names with commas",
        ]
    );
    let r = registry_of(report);
    let d = r.get("odd-values").unwrap();
    assert_eq!(d.model.as_deref(), Some("Claude Sonnet 4.5 (copilot)"));
    assert_eq!(d.permission_mode, None::<PermissionMode>);
    assert_eq!(d.max_turns, Some(50));
}

#[test]
fn malformed_yaml_is_rejected_with_line_and_column() {
    assert_eq!(
        error_of(&messy(), "malformed.md"),
        "messy/malformed.md:4:8: invalid YAML: the `[` that starts the value of `tools` is never \
         closed; close it with `]` (the parser stopped at line 5, column 6: illegal placement of \
         ':' indicator)"
    );
}

#[test]
fn unindented_example_block_is_rejected_with_a_fix() {
    assert_eq!(
        error_of(&messy(), "unindented-example.md"),
        "messy/unindented-example.md:5:1: invalid YAML: `<example>` is not indented and is not a \
         `key: value` line, so it cannot continue the value of `description` (line 3); make \
         `description` a block scalar: `description: |` with the text indented under it"
    );
}

#[test]
fn missing_name_is_rejected() {
    assert_eq!(
        error_of(&messy(), "missing-name.md"),
        "messy/missing-name.md:1:1: the frontmatter has no `name`; add `name: <agent-name>`"
    );
}

#[test]
fn no_frontmatter_is_rejected_at_line_one() {
    assert_eq!(
        error_of(&messy(), "no-frontmatter.md"),
        "messy/no-frontmatter.md:1:1: no frontmatter: an agent file starts with a `---` line, \
         then `name:` and `description:`, then a `---` line; if this file is not an agent \
         definition, move it out of the agents directory"
    );
}

#[test]
fn empty_file_is_rejected() {
    assert_eq!(
        error_of(&messy(), "empty.md"),
        "messy/empty.md:1:1: the file is empty; an agent file starts with a `---` line, then \
         `name:` and `description:`, then a `---` line, then the system prompt"
    );
}

#[test]
fn unclosed_frontmatter_is_rejected() {
    assert_eq!(
        error_of(&messy(), "unclosed.md"),
        "messy/unclosed.md:1:1: the frontmatter opened by `---` on line 1 is never closed; add a \
         line `---` after the last frontmatter key"
    );
}

#[test]
fn indented_opening_fence_is_rejected_where_it_is() {
    assert_eq!(
        error_of(&messy(), "indented-fence.md"),
        "messy/indented-fence.md:2:5: the frontmatter's opening `---` must be the first line of \
         the file, at column 1; remove the blank lines and indentation before it (and indent \
         nothing inside it)"
    );
}

#[test]
fn a_rejected_file_is_an_error_definition() {
    let err = load_file(
        &fixtures().join("messy/missing-name.md"),
        DefinitionSource::User,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        forkhive_spawn::Error::Definition {
            line: 1,
            column: 1,
            ..
        }
    ));
    assert!(
        err.to_string().ends_with(
            "missing-name.md:1:1: the frontmatter has no `name`; add `name: <agent-name>`"
        )
    );
}

#[test]
fn duplicate_names_in_one_source_deeper_then_last_path_wins() {
    let dir = fixtures().join("duplicates");
    let registry = AgentLoader::new()
        .without_builtins()
        .dir(DefinitionSource::Project, &dir)
        .load()
        .unwrap();
    assert_eq!(
        registry.get("code-reviewer").unwrap().description,
        "Inner reviewer"
    );
    assert_eq!(registry.get("reviewer").unwrap().description, "Reviewer B");
    let shadowed: Vec<(String, String, String)> = registry
        .shadowed()
        .iter()
        .map(|s| {
            let rel = |p: &Option<PathBuf>| {
                p.as_ref()
                    .unwrap()
                    .strip_prefix(&dir)
                    .unwrap()
                    .display()
                    .to_string()
            };
            (s.name.clone(), rel(&s.winner.path), rel(&s.overridden.path))
        })
        .collect();
    assert_eq!(
        shadowed,
        [
            (
                "code-reviewer".to_owned(),
                "team/code-reviewer.md".to_owned(),
                "code-reviewer.md".to_owned()
            ),
            (
                "reviewer".to_owned(),
                "review-b.md".to_owned(),
                "review-a.md".to_owned()
            ),
        ]
    );
}

#[test]
fn priority_policy_over_flag_over_project_over_user_over_plugin_over_builtin() {
    let p = fixtures().join("priority");
    // Added in an order that is not the priority order: only the source decides.
    let registry = AgentLoader::new()
        .dir(DefinitionSource::Policy, p.join("policy"))
        .dir(DefinitionSource::User, p.join("user"))
        .dir(DefinitionSource::Project, p.join("project"))
        .dir(DefinitionSource::Plugin, p.join("plugin"))
        .dir(DefinitionSource::Flag, p.join("flag"))
        .load()
        .unwrap();
    assert!(registry.errors().is_empty() && registry.warnings().is_empty());
    let shared = registry.get("shared").unwrap();
    assert_eq!(shared.source, DefinitionSource::Policy);
    assert_eq!(shared.system_prompt, "Defined by policy.");
    assert_eq!(
        registry.get("team-lead").unwrap().source,
        DefinitionSource::Project
    );
    assert_eq!(
        registry.get("Explore").unwrap().description,
        "Explore from user"
    );
    assert_eq!(
        registry.get("general-purpose").unwrap().source,
        DefinitionSource::Plugin
    );
    assert_eq!(
        registry.get("Plan").unwrap().source,
        DefinitionSource::BuiltIn
    );

    let shadowed: Vec<String> = registry
        .shadowed()
        .iter()
        .map(|s| format!("{}: {} > {}", s.name, s.winner.source, s.overridden.source))
        .collect();
    assert_eq!(
        shadowed,
        [
            "Explore: user > built-in",
            "general-purpose: plugin > built-in",
            "shared: policy > plugin",
            "shared: policy > user",
            "shared: policy > project",
            "shared: policy > flag",
            "team-lead: project > user",
        ]
    );
    let names: Vec<&str> = registry.names().collect();
    assert_eq!(
        names,
        [
            "Explore",
            "Plan",
            "general-purpose",
            "shared",
            "team-lead",
            "verification"
        ]
    );
}

#[test]
fn a_missing_directory_stops_the_loader() {
    let err = AgentLoader::new()
        .dir(DefinitionSource::User, fixtures().join("does-not-exist"))
        .load()
        .unwrap_err();
    assert!(matches!(err, forkhive_spawn::Error::Io { .. }));
}

/// Every `*.md` file under `dir`, found independently of the loader.
fn markdown_files(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.insert(path);
        }
    }
}

#[test]
fn real_corpus() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/agents");
    if !corpus.is_dir() {
        eprintln!("SKIPPED: corpus not found");
        return;
    }
    let report = load_dir(&corpus, DefinitionSource::Project).unwrap();

    // Every file accounted for exactly once. No file is excluded: a README.md or SOURCES.md
    // has no frontmatter and is rejected with an error that says so.
    let mut expected = BTreeSet::new();
    markdown_files(&corpus, &mut expected);
    let seen: BTreeSet<PathBuf> = report.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(seen.len(), report.files.len(), "a file was reported twice");
    assert_eq!(seen, expected);
    let (loaded, recovered, rejected) = (
        report.count(FileStatus::Loaded),
        report.count(FileStatus::Recovered),
        report.count(FileStatus::Rejected),
    );
    assert_eq!(loaded + recovered + rejected, expected.len());
    assert_eq!(report.errors.len(), rejected);
    assert_eq!(report.definitions.len(), loaded + recovered);
    eprintln!(
        "corpus: {} files: {loaded} loaded, {recovered} recovered, {rejected} rejected",
        expected.len()
    );

    // The counts are stable: 354 agent files from nine repositories plus SOURCES.md.
    assert_eq!(expected.len(), 355);
    // (One file lists `Bash(npm test:*)`: recovered, with a warning that the rule is not
    // enforced.)
    assert_eq!((loaded, recovered, rejected), (287, 46, 22));

    // Every warning and error names a real place, and each rejected file has one error.
    for d in report.warnings.iter().chain(&report.errors) {
        assert!(d.line >= 1 && d.column >= 1, "{d}");
        assert!(!d.message.is_empty());
    }
    let repaired = report
        .warnings
        .iter()
        .filter(|w| {
            w.message
                .starts_with("the value of `description` contains `: `")
        })
        .count();
    assert_eq!(repaired, 35);

    // And the same result on a second run.
    assert_eq!(
        load_dir(&corpus, DefinitionSource::Project).unwrap(),
        report
    );
    let registry = AgentRegistry::from_report(report);
    assert_eq!(registry.len(), 304);
}

/// A `.md` link whose target is gone is a file the author meant to load: it is rejected with
/// the OS's reason, not skipped.
#[cfg(unix)]
#[test]
fn a_dangling_markdown_symlink_is_rejected_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ok.md"),
        "---\nname: ok\ndescription: fine\n---\nHi.\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone.md"), dir.path().join("link.md")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone.txt"), dir.path().join("notes.txt")).unwrap();
    let report = load_dir(dir.path(), DefinitionSource::Project).unwrap();
    let statuses: Vec<(String, FileStatus)> = report
        .files
        .iter()
        .map(|f| {
            (
                f.path.file_name().unwrap().to_string_lossy().into_owned(),
                f.status,
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            ("link.md".to_owned(), FileStatus::Rejected),
            ("ok.md".to_owned(), FileStatus::Loaded)
        ]
    );
    assert_eq!(report.errors.len(), 1);
    let d = &report.errors[0];
    assert_eq!((d.line, d.column), (1, 1));
    assert_eq!(
        d.message,
        "reading agent file failed: No such file or directory (os error 2)"
    );
}
