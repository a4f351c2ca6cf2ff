//! No crate's top-level modules import each other in a circle.
//!
//! For every crate target of the workspace (a `lib.rs`, a `main.rs`, a `src/bin/` binary) the
//! test follows the `mod` declarations from the root to find each file's top-level module,
//! reads every `crate::` path in the code (in `use` lines and inline, grouped ones such as
//! `crate::{a, b::c}` included; a name the root re-exports counts as the module it comes
//! from), and draws an edge from the file's top-level module to each module it names.
//! Comments, string literals and `#[cfg(test)]` items (test modules) are left out. A cycle in
//! that graph fails the test, except the ones in [`ALLOWED`], which must match exactly what
//! is found: a new cycle, a new import inside an allowed one, or an allowed one that is gone
//! all fail, so the list only shrinks.
//!
//! Every `.rs` file under each crate's `src/` must be reached from a root, so a file the
//! checker cannot place fails too instead of being skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The crates whose `src/` is checked.
const CRATES: &[&str] = &[
    "api",
    "client",
    "conductor",
    "transfer",
    "spdk",
    "server",
    "benches",
];

/// A cycle allowed for now: every import (`from -> to`) between the modules of one strongly
/// connected group of a target's module graph.
struct Allowed {
    /// The target's root file, relative to the workspace.
    root: &'static str,
    edges: &'static [&'static str],
    why: &'static str,
}

/// The cycles that exist today. Remove an entry when its cycle is broken (the test says so).
const ALLOWED: &[Allowed] = &[
    Allowed {
        root: "conductor/src/lib.rs",
        edges: &[
            "conductor -> metrics",
            "conductor -> routing",
            "metrics -> conductor",
            "routing -> conductor",
        ],
        why: "not broken yet: metrics and routing read the Conductor's state and its scratch \
              space; the state wants a module of its own below all three",
    },
    Allowed {
        root: "transfer/src/lib.rs",
        edges: &[
            "error -> transport",
            "request -> segment",
            "segment -> error",
            "stats -> transport",
            "transport -> error",
            "transport -> request",
            "transport -> segment",
            "transport -> stats",
        ],
        why: "not broken yet: TransportKind lives in transport but names paths in errors and \
              stats; it wants a module of its own (the peer-session work of issue #11 will \
              reshape transport)",
    },
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// The source with comments and the contents of string and character literals blanked to
/// spaces (newlines kept), so byte offsets still match the original text.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, range: Range<usize>| {
        for x in &mut out[range] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
    };
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let after_ident = i > 0 && is_ident(b[i - 1]);
        if c == b'/' && at(i + 1) == b'/' {
            let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
            blank(&mut out, i..end);
            i = end;
        } else if c == b'/' && at(i + 1) == b'*' {
            let (mut j, mut depth) = (i + 2, 1);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && at(j + 1) == b'*' {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && at(j + 1) == b'/' {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i..j);
            i = j;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let j = j.min(b.len());
            blank(&mut out, i + 1..j);
            i = j + 1;
        } else if c == b'r'
            && (!after_ident || (b[i - 1] == b'b' && (i < 2 || !is_ident(b[i - 2]))))
            && matches!(at(i + 1), b'"' | b'#')
        {
            let hashes = b[i + 1..].iter().take_while(|&&x| x == b'#').count();
            let open = i + 1 + hashes;
            if at(open) != b'"' {
                i += 1; // a raw identifier such as `r#type`
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = b[open + 1..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| open + 1 + p);
            blank(&mut out, open + 1..end);
            i = (end + close.len()).min(b.len());
        } else if c == b'\'' {
            if at(i + 1) == b'\\' {
                // An escaped character: skip the escaped byte, then up to the closing quote.
                let from = (i + 3).min(b.len());
                let end = b[from..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map_or(b.len(), |p| from + p);
                blank(&mut out, i + 1..end);
                i = end + 1;
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                if at(i + 1 + len) == b'\'' {
                    blank(&mut out, i + 1..i + 1 + len);
                    i += len + 2;
                } else {
                    i += 1; // a lifetime or a label
                }
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The end (exclusive) of the bracketed group opening at `open`.
fn matching(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn skip_ws(code: &[u8], mut i: usize) -> usize {
    while i < code.len() && code[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The byte ranges of items under `#[cfg(test)]` (test modules, test helpers), the whole file
/// for `#![cfg(test)]`.
fn test_only(code: &str) -> Vec<Range<usize>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(n) = code[i..].find('#') {
        let start = i + n;
        let mut j = skip_ws(b, start + 1);
        let inner = b.get(j) == Some(&b'!');
        if inner {
            j = skip_ws(b, j + 1);
        }
        if b.get(j) != Some(&b'[') {
            i = start + 1;
            continue;
        }
        let close = matching(b, j);
        let attr: String = code[j..close]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if attr != "[cfg(test)]" {
            i = close;
            continue;
        }
        if inner {
            let whole_file = 0..b.len();
            return vec![whole_file];
        }
        // Further attributes, then the item: up to its `;` or through its `{ ... }`.
        let mut k = skip_ws(b, close);
        while b.get(k) == Some(&b'#') {
            let open = skip_ws(b, k + 1);
            k = skip_ws(b, matching(b, open));
        }
        let mut end = b.len();
        while k < b.len() {
            match b[k] {
                b';' => {
                    end = k + 1;
                    break;
                }
                b'{' => {
                    end = matching(b, k);
                    break;
                }
                b'(' | b'[' => k = matching(b, k),
                _ => k += 1,
            }
        }
        out.push(start..end);
        i = end;
    }
    out
}

fn blanked(code: &str, ranges: &[Range<usize>]) -> String {
    let mut out = code.as_bytes().to_vec();
    for r in ranges {
        for x in &mut out[r.clone()] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

fn ident_at(code: &str, i: usize) -> &str {
    let len = code.as_bytes()[i..]
        .iter()
        .take_while(|&&c| is_ident(c))
        .count();
    &code[i..i + len]
}

/// Positions of the keyword `word` outside any braces of `code`.
fn top_level_keyword(code: &str, word: &str) -> Vec<usize> {
    let b = code.as_bytes();
    let mut depth = 0i32;
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            c if is_ident(c) => {
                let name = ident_at(code, i);
                if depth == 0 && name == word && (i == 0 || !is_ident(b[i - 1])) {
                    out.push(i);
                }
                i += name.len();
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A `mod name;` declaration: its name, its `#[path]` if any, and whether it is test-only.
struct ModDecl {
    name: String,
    path: Option<String>,
    test: bool,
}

/// The out-of-line modules a file declares at its top level.
fn mod_decls(text: &str, code: &str, tests: &[Range<usize>]) -> Vec<ModDecl> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for at in top_level_keyword(code, "mod") {
        let name_at = skip_ws(b, at + 3);
        let name = ident_at(code, name_at);
        if name.is_empty() || b.get(skip_ws(b, name_at + name.len())) != Some(&b';') {
            continue; // an inline module
        }
        // Its attributes sit between the previous item's end and the keyword.
        let from = code[..at].rfind([';', '}', '{']).map_or(0, |p| p + 1);
        let path = code[from..at].find("#[path").and_then(|p| {
            let open = from + p + code[from + p..].find('"')? + 1;
            let close = open + code[open..].find('"')?;
            Some(text[open..close].to_string())
        });
        out.push(ModDecl {
            name: name.to_string(),
            path,
            test: tests.iter().any(|r| r.contains(&at)),
        });
    }
    out
}

/// The first names of every `crate::` path in `code`: `crate::a::X` and `crate::{a, b::c}`
/// give `a` (and `b`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("crate::") {
        let at = from + n;
        from = at + "crate::".len();
        if at > 0 && is_ident(b[at - 1]) {
            continue; // `my_crate::`
        }
        let i = skip_ws(b, from);
        if b.get(i) == Some(&b'{') {
            let end = matching(b, i) - 1;
            let mut depth = 0;
            let mut item = i + 1;
            for k in i + 1..=end {
                match b[k] {
                    b'{' => depth += 1,
                    b'}' if k < end => depth -= 1,
                    b',' | b'}' if depth == 0 => {
                        let s = skip_ws(b, item);
                        if s < k {
                            out.insert(ident_at(code, s).to_string());
                        }
                        item = k + 1;
                    }
                    _ => {}
                }
            }
        } else if b.get(i).is_some_and(|&c| is_ident(c)) {
            out.insert(ident_at(code, i).to_string());
        }
    }
    out.remove("");
    out
}

/// The paths a `use` tree brings in, each with the name it is known by:
/// `a::{b::C, d as E, self}` gives `[a, b, C] C`, `[a, d] E`, `[a] a`.
fn use_leaves(tree: &str) -> Vec<(Vec<String>, String)> {
    let mut tokens = Vec::new();
    let b = tree.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if is_ident(c) => {
                let name = ident_at(tree, i);
                tokens.push(name.to_string());
                i += name.len();
            }
            b':' => {
                tokens.push("::".into());
                i += 2;
            }
            c if c.is_ascii_whitespace() => i += 1,
            c => {
                tokens.push((c as char).to_string());
                i += 1;
            }
        }
    }
    fn tree_at(
        tokens: &[String],
        mut i: usize,
        mut prefix: Vec<String>,
        out: &mut Vec<(Vec<String>, String)>,
    ) -> usize {
        loop {
            match tokens.get(i).map(String::as_str) {
                Some("::") => i += 1,
                Some("{") => {
                    i += 1;
                    while !matches!(tokens.get(i).map(String::as_str), Some("}") | None) {
                        i = tree_at(tokens, i, prefix.clone(), out);
                        if tokens.get(i).map(String::as_str) == Some(",") {
                            i += 1;
                        }
                    }
                    return i + 1;
                }
                Some("*") => return i + 1,
                Some(name) if name.bytes().all(is_ident) => {
                    prefix.push(name.to_string());
                    i += 1;
                    if tokens.get(i).map(String::as_str) == Some("::") {
                        continue;
                    }
                    let mut known_as = name.to_string();
                    if tokens.get(i).map(String::as_str) == Some("as") {
                        known_as = tokens.get(i + 1).cloned().unwrap_or_default();
                        i += 2;
                    }
                    if known_as == "self" {
                        prefix.pop();
                        known_as = prefix.last().cloned().unwrap_or_default();
                    }
                    out.push((prefix, known_as));
                    return i;
                }
                _ => return i + 1,
            }
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        i = tree_at(&tokens, i, Vec::new(), &mut out);
    }
    out
}

/// Names the crate root brings in with `use` from one of its own modules: `pub use
/// client::Client` makes `crate::Client` mean module `client`.
fn root_names(code: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for at in top_level_keyword(code, "use") {
        let start = at + "use".len();
        let end = code[start..].find(';').map_or(code.len(), |n| start + n);
        for (path, known_as) in use_leaves(&code[start..end]) {
            let first = path
                .iter()
                .find(|s| *s != "crate" && *s != "self")
                .filter(|_| path.first().map(String::as_str) != Some("super"));
            if let Some(module) = first.filter(|m| modules.contains(*m)) {
                out.insert(known_as, module.clone());
            }
        }
    }
    out
}

/// One target's module graph.
#[derive(Default)]
struct Target {
    /// Top-level module -> the names it reaches through `crate::`.
    named: BTreeMap<String, BTreeSet<String>>,
    /// The names the root re-exports, and their modules.
    reexports: BTreeMap<String, String>,
}

impl Target {
    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, names) in &self.named {
            let targets = out.entry(from.clone()).or_default();
            for name in names {
                let to = if self.named.contains_key(name) {
                    Some(name)
                } else {
                    self.reexports.get(name)
                };
                if let Some(to) = to.filter(|to| *to != from) {
                    targets.insert(to.clone());
                }
            }
        }
        out
    }
}

/// Reads a target from its root file, recording every file it reaches in `seen`.
fn read_target(root: &Path, seen: &mut BTreeSet<PathBuf>) -> Target {
    // (file, its top-level module (None for the root), whether it is a mod.rs-like file,
    // whether it is test-only)
    let mut queue = vec![(root.to_path_buf(), None::<String>, true, false)];
    let mut target = Target::default();
    let mut root_code = String::new();
    while let Some((file, top, mod_rs, test)) = queue.pop() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        seen.insert(file.clone());
        let code = code_only(&text);
        let tests = test_only(&code);
        let dir = file.parent().expect("a file has a directory");
        let children = if mod_rs {
            dir.to_path_buf()
        } else {
            dir.join(file.file_stem().expect("a file has a name"))
        };
        for decl in mod_decls(&text, &code, &tests) {
            let (path, mod_rs) = match &decl.path {
                Some(p) => (dir.join(p), true),
                None if children.join(format!("{}.rs", decl.name)).exists() => {
                    (children.join(format!("{}.rs", decl.name)), false)
                }
                None => (children.join(&decl.name).join("mod.rs"), true),
            };
            let child_top = top.clone().unwrap_or_else(|| decl.name.clone());
            let child_test = test || decl.test;
            if top.is_none() && !child_test {
                target.named.entry(decl.name.clone()).or_default();
            }
            queue.push((path, Some(child_top), mod_rs, child_test));
        }
        let code = blanked(&code, &tests);
        match (&top, test) {
            (None, _) => root_code = code,
            (Some(top), false) => target
                .named
                .entry(top.clone())
                .or_default()
                .extend(crate_paths(&code)),
            (Some(_), true) => {}
        }
    }
    let modules: BTreeSet<String> = target.named.keys().cloned().collect();
    target.reexports = root_names(&root_code, &modules);
    target
}

/// The strongly connected groups of more than one module, each as its internal edges.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut groups = BTreeSet::new();
    for (m, r) in &reaches {
        let group: BTreeSet<&String> = std::iter::once(*m)
            .chain(
                r.iter()
                    .filter(|o| reaches.get(o).is_some_and(|back| back.contains(*m))),
            )
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups
        .into_iter()
        .map(|group| {
            let mut internal = Vec::new();
            for from in &group {
                for to in edges.get(*from).into_iter().flatten() {
                    if group.contains(to) {
                        internal.push(format!("{from} -> {to}"));
                    }
                }
            }
            internal
        })
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
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

/// The crate roots under a crate's `src/`: `lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`.
fn roots(src: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|p| p.exists())
        .collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        for entry in bins {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                out.push(path.join("main.rs"));
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn top_level_modules_import_each_other_in_no_circle() {
    let ws = workspace();
    let mut problems = Vec::new();
    let mut found_roots = BTreeSet::new();
    for krate in CRATES {
        let src = ws.join(krate).join("src");
        let mut seen = BTreeSet::new();
        for root in roots(&src) {
            let name = root
                .strip_prefix(&ws)
                .expect("under the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            let target = read_target(&root, &mut seen);
            let allowed: BTreeSet<Vec<String>> = ALLOWED
                .iter()
                .filter(|a| a.root == name)
                .map(|a| sorted(a.edges.iter().map(|e| e.to_string()).collect()))
                .collect();
            let found: BTreeSet<Vec<String>> =
                cycles(&target.edges()).into_iter().map(sorted).collect();
            for cycle in found.difference(&allowed) {
                problems.push(format!(
                    "{name}: these imports form a cycle among top-level modules:\n    {}",
                    cycle.join("\n    ")
                ));
            }
            for gone in allowed.difference(&found) {
                problems.push(format!(
                    "{name}: the allowed cycle [{}] is no longer there as listed: update or \
                     remove its ALLOWED entry",
                    gone.join(", ")
                ));
            }
            found_roots.insert(name);
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files.iter().filter(|f| !seen.contains(*f)) {
            problems.push(format!(
                "{}: not reached from any crate root by `mod` declarations; the checker \
                 cannot place it",
                file.display()
            ));
        }
    }
    for a in ALLOWED {
        assert!(
            !a.why.is_empty(),
            "{}: an allowed cycle needs a reason",
            a.root
        );
        if !found_roots.contains(a.root) {
            problems.push(format!("ALLOWED names {}, which is no crate root", a.root));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_reads_paths_as_rustc_does() {
    let text = r##"
//! Docs naming crate::docs.
use crate::{a::X, b::{self, c::Y}, Reexported};
use crate::d;
/* crate::block /* nested crate::nested */ still crate::comment */
fn f<'a>(s: &'a str) -> char {
    let _ = "crate::string {";
    let _ = r#"crate::raw"#;
    let _ = '{';
    let _ = '\'';
    crate::e::call();
    $crate::f::g!();
    my_crate::h::call();
    'x'
}
#[cfg(test)]
#[allow(dead_code)]
fn helper() -> [u8; 2] { crate::test_helper::go() }
#[cfg(test)]
mod tests {
    use crate::tests_only;
    fn g() { if true { crate::deep::x() } }
}
fn after() { crate::after::x(); }
"##;
    let code = code_only(text);
    let code = blanked(&code, &test_only(&code));
    let found = crate_paths(&code);
    let want: BTreeSet<String> = ["a", "b", "Reexported", "d", "e", "f", "after"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);

    let root = "pub mod x;\nmod y;\n#[cfg(test)]\n#[path = \"t.rs\"]\nmod t;\n\
                pub use x::{Thing, inner::Other as Renamed};\npub use y::Y;\n\
                pub use std::fmt::Debug;\npub mod inline { pub use crate::y::Inner; }\n";
    let code = code_only(root);
    let tests = test_only(&code);
    let decls = mod_decls(root, &code, &tests);
    let summary: Vec<(&str, Option<&str>, bool)> = decls
        .iter()
        .map(|d| (d.name.as_str(), d.path.as_deref(), d.test))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("x", None, false),
            ("y", None, false),
            ("t", Some("t.rs"), true)
        ]
    );
    let modules: BTreeSet<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    let names = root_names(&blanked(&code, &tests), &modules);
    let want: BTreeMap<String, String> = [("Thing", "x"), ("Renamed", "x"), ("Y", "y")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(names, want);
}

#[test]
fn the_checker_finds_cycles_and_only_cycles() {
    let graph = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert!(cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    assert_eq!(
        cycles(&graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("x", "y"),
            ("y", "x")
        ])),
        vec![
            vec!["a -> b".to_string(), "b -> c".into(), "c -> a".into()],
            vec!["x -> y".to_string(), "y -> x".into()],
        ]
    );
}
