//! Hostile agent definition files, as an untrusted repository may carry them: the loader's
//! time and memory stay bounded, and a restriction a reader sees is never dropped without a
//! word.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use forkhive_spawn::definition::{DefinitionSource, ParsedDefinition, parse_agent_markdown};

const CHILD: &str = "HOSTILE_DEFINITIONS_CHILD";

/// Runs the test `name` of this binary again in a child process limited to `kib` KiB of
/// address space, with `CHILD` set to `arg`; its exit status and output.
#[cfg(target_os = "linux")]
fn in_child(name: &str, kib: u64, arg: &str) -> (std::process::ExitStatus, String, String) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {kib} && exec \"$0\" --exact {name} --nocapture --test-threads 1"
        ))
        .arg(&exe)
        .env(CHILD, arg)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The process's peak resident memory, in KiB.
#[cfg(target_os = "linux")]
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

/// The `PEAK_GROWTH_KIB=` a child process printed.
#[cfg(target_os = "linux")]
fn peak_growth_kib(out: &str) -> u64 {
    out.split("PEAK_GROWTH_KIB=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

fn parse(text: &str) -> forkhive_spawn::Result<ParsedDefinition> {
    parse_agent_markdown(Path::new("x.md"), text, DefinitionSource::Project)
}

/// A file with `n` keys whose plain values contain `: ` (each repaired, with a warning).
fn colon_file(n: usize) -> String {
    let mut text = String::from("---\nname: a\ndescription: b\n");
    for i in 0..n {
        text.push_str(&format!("k{i}: a: b\n"));
    }
    text.push_str("---\nbody\n");
    text
}

/// Each repair parses the whole frontmatter again, so repairs are capped: a file that needs
/// more than `MAX_REPAIRS` (64) is rejected at once, saying why, instead of taking time that
/// grows with the square of its size (3,000 such lines took 42 s before the cap).
#[test]
fn repairs_are_capped_so_a_file_of_them_is_refused_at_once() {
    let started = Instant::now();
    let err = parse(&colon_file(3_000)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        err.to_string(),
        "x.md:68:7: invalid YAML: mapping values are not allowed in this context; 64 lines were \
         repaired before this one, and no more are: quote the values that hold `: `"
    );
    // 64 are repaired, each with its warning.
    let p = parse(&colon_file(64)).unwrap();
    assert_eq!(p.warnings.len(), 64);
}

/// Anchors on nested flow lists: the YAML loader would clone each anchored node when it is
/// complete, so every level would hold a copy of everything below it (depth x width nodes),
/// with no alias used, out of reach of saphyr's alias budget. Anchors are refused before any
/// document is built; the memory is measured in a child process of its own (peak resident
/// memory is the process's).
#[cfg(target_os = "linux")]
#[test]
fn nested_anchors_do_not_multiply_memory() {
    let (depth, width) = (250, 20_000);
    let mut value = String::new();
    for i in 0..depth {
        value.push_str(&format!("&a{i} ["));
    }
    value.push_str(&"x,".repeat(width));
    value.push('x');
    value.push_str(&"]".repeat(depth));
    let text = format!("---\nname: a\ndescription: b\nextra: {value}\n---\nbody\n");
    if std::env::var(CHILD).is_ok() {
        let before = peak_rss_kib();
        let started = Instant::now();
        let parsed = parse(&text);
        println!(
            "PEAK_GROWTH_KIB={} elapsed={:?} ok={}",
            peak_rss_kib() - before,
            started.elapsed(),
            parsed.is_ok()
        );
        return;
    }
    // Refused, before any document is built.
    assert_eq!(
        parse("---\nname: a\ndescription: b\nextra: &a [x, *a]\n---\nbody\n")
            .unwrap_err()
            .to_string(),
        "x.md:4:8: an anchor (`&name`) in the frontmatter; an agent definition uses neither \
         anchors nor aliases: write the value out"
    );
    let (status, stdout, stderr) =
        in_child("nested_anchors_do_not_multiply_memory", 8_000_000, "1");
    assert!(status.success(), "{status:?}: {stderr}");
    let growth = peak_growth_kib(&stdout);
    eprintln!("{}", stdout.lines().find(|l| l.contains("PEAK")).unwrap());
    assert!(
        growth < 64 * 1024,
        "a {}-byte definition file took {} MiB to parse",
        text.len(),
        growth / 1024
    );
}

/// A `.md` link in the agents directory to a file that never ends but is a regular file to
/// `stat` (`/proc/self/pagemap`: 8 bytes per page of the address space, 256 GiB): the loader
/// reads at most `MAX_DEFINITION_FILE` of it, and lists it as rejected. Run in a child process
/// limited to 3 GB of address space, so that a loader that read it whole could not take the
/// machine down.
#[cfg(target_os = "linux")]
#[test]
fn a_link_to_an_endless_file_is_not_read_whole() {
    if let Ok(dir) = std::env::var(CHILD) {
        let before = peak_rss_kib();
        let report =
            forkhive_spawn::definition::load_dir(Path::new(&dir), DefinitionSource::Project)
                .unwrap();
        println!(
            "PEAK_GROWTH_KIB={} files={} errors={:?}",
            peak_rss_kib() - before,
            report.files.len(),
            report
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/proc/self/pagemap", dir.path().join("evil.md")).unwrap();
    std::fs::write(
        dir.path().join("good.md"),
        "---\nname: good\ndescription: fine\n---\nbody\n",
    )
    .unwrap();
    let (status, stdout, stderr) = in_child(
        "a_link_to_an_endless_file_is_not_read_whole",
        3_000_000,
        dir.path().to_str().unwrap(),
    );
    assert!(status.success(), "{status:?}: {stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("PEAK_GROWTH_KIB="))
        .unwrap();
    eprintln!("{line}");
    assert!(
        line.contains("files=2") && line.contains("evil.md:1:1: reading agent file failed"),
        "{line}"
    );
    let growth = peak_growth_kib(line);
    assert!(
        growth < 256 * 1024,
        "loading a directory with one linked `.md` file took {} MiB",
        growth / 1024
    );
}

/// A restricting key with an invisible character (a zero-width space, a word joiner, a
/// no-break space) or a non-ASCII look-alike letter reads as `tools`/`disallowedTools`/
/// `permissionMode` on screen; kept as an unknown key, the agent would get every tool, or leave
/// plan mode. It is rejected like `disallowed_tools` and `Tools`.
#[test]
fn an_invisible_variant_of_a_restricting_key_is_not_silently_ignored() {
    let cases = [
        ("tools\u{200b}", "Read"),
        ("disallowed\u{200b}Tools", "Bash"),
        ("disallowedTools\u{a0}", "Bash"),
        ("permission\u{2060}Mode", "plan"),
        ("permissi\u{43e}nMode", "plan"), // Cyrillic о
    ];
    for ((key, value), meant) in cases.into_iter().zip([
        "tools",
        "disallowedTools",
        "disallowedTools",
        "permissionMode",
        "permissionMode",
    ]) {
        let text = format!("---\nname: a\ndescription: b\n{key}: {value}\n---\nbody\n");
        let err = parse(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "x.md:4:1: `{key}` is not a frontmatter key; did you mean `{meant}`? The \
                 definition is rejected: ignoring a restriction could widen what the agent may \
                 do; write `{meant}`"
            )
        );
    }
}

/// A key with a tag YAML does not know (`!x disallowedTools`) is another key to the YAML
/// loader, so a second one would not be caught as set twice, yet it reads as the plain key
/// (the last one would win, taking `Bash` out of `disallowedTools` without a word). A tagged
/// key is refused.
#[test]
fn a_tagged_key_is_refused() {
    let err = parse(
        "---\nname: a\ndescription: b\ndisallowedTools: Bash\n!x disallowedTools: Read\n---\nbody\n",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.md:5:1: the key `disallowedTools` carries a tag; frontmatter keys are plain: remove the \
         tag"
    );
}

/// A lone `\r` (not followed by `\n`) is a line break to YAML, and to most editors, which
/// show the two keys below on two lines: so it is to the loader too, and `disallowedTools:
/// Bash` stays a restriction of its own, not text folded into the repaired description.
#[test]
fn a_lone_carriage_return_does_not_fold_a_restriction_into_a_repaired_value() {
    let text = "---\nname: a\ndescription: Use when: x\rdisallowedTools: Bash\n---\nbody\n";
    {
        let p = parse(text).unwrap();
        assert_eq!(
            p.definition.disallowed_tools,
            Some(vec!["Bash".to_owned()]),
            "description {:?}; warnings {:?}",
            p.definition.description,
            p.warnings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        );
    }
}

/// A lone `\r` is a line break, as YAML and editors count lines: the problem on the fifth
/// line as shown is reported there, and repaired as it would be without the `\r`.
#[test]
fn a_lone_carriage_return_counts_as_a_line_break() {
    let text = "---\nname: a\rdescription: b\nmodel: x\nk: u: v\n---\nbody\n";
    let p = parse(text).unwrap();
    assert_eq!(
        p.warnings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "x.md:5:4: the value of `k` contains `: `; it was read as a literal string; quote it or \
          use a block scalar `|`"
        ]
    );
}

/// A definition file larger than `MAX_DEFINITION_FILE` (1 MiB) is refused after that much is
/// read, saying so; its neighbours load.
#[test]
fn a_file_larger_than_the_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let big = format!(
        "---\nname: big\ndescription: b\n---\n{}",
        "x".repeat(2 * 1024 * 1024)
    );
    std::fs::write(dir.path().join("big.md"), big).unwrap();
    std::fs::write(
        dir.path().join("good.md"),
        "---\nname: good\ndescription: fine\n---\nbody\n",
    )
    .unwrap();
    let report =
        forkhive_spawn::definition::load_dir(dir.path(), DefinitionSource::Project).unwrap();
    let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [format!(
            "{}:1:1: reading agent file failed: it is larger than 1024 KiB, the most a definition \
             may be",
            dir.path().join("big.md").display()
        )]
    );
    assert_eq!(forkhive_spawn::definition::MAX_DEFINITION_FILE, 1024 * 1024);
}
