//! The storage node's layers import one way only.
//!
//! Each top-level module of `src/` belongs to one layer (see the crate docs); a file may name
//! `crate::X` only when X's layer is below its own (or X is its own module). Modules of one
//! layer do not import each other either. The test reads every `crate::` path in the source,
//! in `use` lines and inline, so a new upward or sideways import fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Lowest first. Modules in one group are independent of each other.
const LAYERS: &[&[&str]] = &[
    &["model"],
    &["metrics"],
    &["net"],
    &["config"],
    &["engine"],
    &["tier"],
    &["node"],
    &["auth", "events", "kv"],
    &["http"],
    &["serve"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|group| group.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source text names through `crate::`, including grouped
/// imports such as `use crate::{a, b::c}`.
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn imports_run_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut seen = BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        if first == "lib" || first == "main" {
            continue;
        }
        let Some(own) = layer_of(&first) else {
            violations.push(format!(
                "{}: module `{first}` is in no layer (add it to LAYERS and the crate docs)",
                rel.display()
            ));
            continue;
        };
        seen.insert(first.clone());
        let text = std::fs::read_to_string(file).expect("read source");
        for named in named_modules(&text) {
            if named == first {
                continue;
            }
            match layer_of(&named) {
                Some(l) if l < own => {}
                Some(_) => violations.push(format!(
                    "{}: `{first}` imports `crate::{named}`, which is not below it",
                    rel.display()
                )),
                None => violations.push(format!(
                    "{}: `crate::{named}` is in no layer",
                    rel.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // Every layer listed still exists, so the list cannot rot into permitting anything.
    for module in LAYERS.iter().flat_map(|g| g.iter()) {
        assert!(
            seen.contains(*module),
            "layer module `{module}` has no source"
        );
    }
}

#[test]
fn the_checker_sees_grouped_and_inline_paths() {
    let found = named_modules(
        "use crate::{model::X, tier};\nfn f() { crate::http::go(); }\n// crate::serve in a comment\n",
    );
    let want: BTreeSet<String> = ["model", "tier", "http"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
}
