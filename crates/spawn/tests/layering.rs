//! The crate's layers, checked on its sources: a module may use only modules below it, so no
//! import cycle can come back. (`docs/architecture.md`, "Who may call whom".)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

/// Bottom to top; a module may use the modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["base", "definition", "worktree"],
    &["hook"],
    &["tool", "transcript"],
    &["mcp"],
    &["runtime", "timeline", "mailbox"],
    &["task"],
    &["strategy", "team"],
    &["pool"],
    &["agent_tool", "control"],
    &["coordinator"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `crate::<module>` a source file names in code (not in comments or doc links).
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn visit(dir: &Path, top: Option<&str>, found: &mut Vec<(String, String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            visit(&path, Some(top.unwrap_or(&name)), found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let module = top.map_or(name.clone(), str::to_owned);
            if module == "lib" {
                continue;
            }
            for used in uses(&std::fs::read_to_string(&path).unwrap()) {
                found.push((module.clone(), used, path.display().to_string()));
            }
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    visit(&src, None, &mut found);
    assert!(found.len() > 20, "the sources were read");
    let mut wrong = Vec::new();
    for (module, used, file) in &found {
        if module == used || matches!(used.as_str(), "Error" | "Result") {
            continue;
        }
        let (Some(from), Some(to)) = (layer(module), layer(used)) else {
            wrong.push(format!("{file}: `{module}` or `{used}` is in no layer"));
            continue;
        };
        if to >= from {
            wrong.push(format!(
                "{file}: `{module}` uses `{used}`, which is not below it"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
