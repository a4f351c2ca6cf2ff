//! The request layer stays readable: no function in `server/src/http` is longer than
//! [`MOST_LINES`]. A request is parsed into an endpoint (`http/endpoint.rs`), authenticated,
//! wrapped by the cluster (`http/coordinate.rs`) and dispatched to one handler per operation;
//! a function that grows past the limit is doing more than one of these.

use std::path::{Path, PathBuf};

/// The most lines a function of the request layer may span, signature to closing brace.
const MOST_LINES: usize = 120;

/// Functions of `text` as (name, first line, lines), found by their `fn` line and the closing
/// brace at the same indentation (rustfmt's layout; declarations without a body skipped).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        let leading = &words[..at];
        let is_item = leading.iter().all(|w| {
            matches!(*w, "pub" | "async" | "const" | "unsafe" | "extern") || w.starts_with("pub(")
        });
        if !is_item || line.trim_end().ends_with(';') {
            continue;
        }
        let name = words
            .get(at + 1)
            .and_then(|w| w.split(['(', '<']).next())
            .unwrap_or("?")
            .to_string();
        if line.contains('{') && line.trim_end().ends_with('}') {
            out.push((name, i + 1, 1));
            continue;
        }
        let close = " ".repeat(indent) + "}";
        let end = lines[i + 1..]
            .iter()
            .position(|l| l.trim_end() == close)
            .map_or(lines.len(), |p| i + 1 + p);
        out.push((name, i + 1, end - i + 1));
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_function_of_the_request_layer_is_longer_than_the_limit() {
    let http = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src/http");
    let mut files = Vec::new();
    rust_files(&http, &mut files);
    assert!(
        files.len() > 10,
        "found {} files under {}",
        files.len(),
        http.display()
    );
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable source");
        for (name, line, n) in functions(&text) {
            if n > MOST_LINES {
                long.push(format!("{}:{line} {name}: {n} lines", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions longer than {MOST_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checker_measures_functions_from_signature_to_brace() {
    let text = "pub async fn a(\n    x: u8,\n) -> u8 {\n    x\n}\n\nimpl T {\n    fn b() {}\n    pub(crate) fn c() {\n        let f = |y| y;\n    }\n    fn d();\n}\n// fn not_code\n";
    let found = functions(text);
    let names: Vec<(&str, usize)> = found.iter().map(|(n, _, l)| (n.as_str(), *l)).collect();
    assert_eq!(names, vec![("a", 5), ("b", 1), ("c", 3)]);
}
