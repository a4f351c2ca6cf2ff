//! No crate's top-level modules import each other in a circle.
//!
//! For every crate target of the workspace (a `lib.rs`, a `main.rs`, a `src/bin/` binary) the
//! test follows the `mod` declarations from the root to find each file's top-level module,
//! parses each file with `syn` and reads every `crate::` path in it (in `use` trees, grouped
//! ones such as `crate::{a, b::c}` included, inline paths, and macro tokens; a name the root
//! re-exports counts as the module it comes from), and draws an edge from the file's
//! top-level module to each module it names. `#[cfg(test)]` items (test modules) are left
//! out. The reader is `yutu_tests::imports`, shared with the `layers` test. A cycle in
//! that graph fails the test, except the ones in [`ALLOWED`], which must match exactly what
//! is found: a new cycle, a new import inside an allowed one, or an allowed one that is gone
//! all fail, so the list only shrinks.
//!
//! Every `.rs` file under each crate's `src/` must be reached from a root, so a file the
//! checker cannot place fails too instead of being skipped.

use std::collections::{BTreeMap, BTreeSet};

use yutu_tests::imports::{
    crate_paths, crate_paths_with_tests, cycles, file_graph, mod_decls, read_target, root_names,
    roots, rust_files, workspace, ModDecl,
};

/// The crates whose `src/` is checked.
const CRATES: &[&str] = &[
    "api",
    "client",
    "conductor",
    "etcd",
    "transfer",
    "blockstore",
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
const ALLOWED: &[Allowed] = &[Allowed {
    root: "conductor/src/lib.rs",
    edges: &[
        "conductor -> metrics",
        "conductor -> routing",
        "metrics -> conductor",
        "routing -> conductor",
    ],
    why: "not broken yet: metrics and routing read the Conductor's state and its scratch \
              space; the state wants a module of its own below all three",
}];

/// Cycles among the files of one target allowed for now, as [`ALLOWED`] (module paths of
/// files, `http::service`).
const ALLOWED_FILES: &[Allowed] = &[
    Allowed {
        root: "conductor/src/lib.rs",
        edges: &[
            "conductor -> metrics",
            "conductor -> routing",
            "metrics -> conductor",
            "routing -> conductor",
        ],
        why: "the top-level cycle of ALLOWED, seen from its files",
    },
    Allowed {
        root: "server/src/lib.rs",
        edges: &[
            "store::kv -> store::shard",
            "store::multipart -> store::shard",
            "store::pinning -> store::shard",
            "store::shard -> store::kv",
            "store::shard -> store::multipart",
            "store::shard -> store::pinning",
        ],
        why: "one `impl ShardStore` split over files by concern (KV blocks, multipart parts, \
              pins): each part needs the store's private fields and the store calls each \
              part's hooks (eviction, removal); they are one type, not layers",
    },
];

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Compares the cycles `found` in target `name` with the ones `allowed` lists for it,
/// adding a problem for every new cycle and every allowed one that is gone (`what`: "top-level
/// modules" or "files"; `list`: the name of the list to update).
fn compare(
    name: &str,
    allowed: &[Allowed],
    graph: &BTreeMap<String, BTreeSet<String>>,
    what: &str,
    list: &str,
    problems: &mut Vec<String>,
) {
    let allowed: BTreeSet<Vec<String>> = allowed
        .iter()
        .filter(|a| a.root == name)
        .map(|a| sorted(a.edges.iter().map(|e| e.to_string()).collect()))
        .collect();
    let found: BTreeSet<Vec<String>> = cycles(graph).into_iter().map(sorted).collect();
    for cycle in found.difference(&allowed) {
        problems.push(format!(
            "{name}: these imports form a cycle among {what}:\n    {}",
            cycle.join("\n    ")
        ));
    }
    for gone in allowed.difference(&found) {
        problems.push(format!(
            "{name}: the allowed cycle [{}] is no longer there as listed: update or remove its \
             {list} entry",
            gone.join(", ")
        ));
    }
}

/// Writes `text` at `path` under `dir`, making folders as needed.
fn write_file(dir: &std::path::Path, path: &str, text: &str) {
    let path = dir.join(path);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
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
            let graph = target.edges();
            compare(
                &name,
                ALLOWED,
                &graph,
                "top-level modules",
                "ALLOWED",
                &mut problems,
            );
            found_roots.insert(name);
        }
        for file in rust_files(&src).iter().filter(|f| !seen.contains(*f)) {
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

/// The same rule one level down: no two files of a crate import each other in a circle, so
/// that each file can be read knowing only the files below it.
#[test]
fn files_import_each_other_in_no_circle() {
    let ws = workspace();
    let mut problems = Vec::new();
    for krate in CRATES {
        for root in roots(&ws.join(krate).join("src")) {
            let name = root
                .strip_prefix(&ws)
                .expect("under the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            let graph = file_graph(&root);
            compare(
                &name,
                ALLOWED_FILES,
                &graph,
                "files",
                "ALLOWED_FILES",
                &mut problems,
            );
        }
    }
    for a in ALLOWED_FILES {
        assert!(
            !a.why.is_empty(),
            "{}: an allowed cycle needs a reason",
            a.root
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_checker_reads_paths_as_rustc_does() {
    let text = r##"
//! Docs naming crate::docs.
use crate::{a::X, b::{self, c::Y}, Reexported};
use crate::d;
use {crate::grouped as _, std::fmt};
/* crate::block /* nested crate::nested */ still crate::comment */
fn f<'a>(s: &'a str) -> char {
    let _ = "crate::string {";
    let _ = r#"crate::raw"#;
    let _ = '{';
    let _ = '\'';
    crate::e::call();
    assert!(crate::in_macro::ok(), "{}", "crate::in_macro_string");
    my_crate::h::call();
    'x'
}
macro_rules! m {
    () => { $crate::f::g!() };
}
struct S(crate::in_type::T);
impl S {
    #[cfg(test)]
    fn test_method() { crate::test_method::x() }
    fn method(&self) -> Option<crate::ret::R> { None }
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
    let file = syn::parse_file(text).expect("the sample parses");
    let code = [
        "a",
        "b",
        "Reexported",
        "d",
        "grouped",
        "e",
        "in_macro",
        "f",
        "in_type",
        "ret",
        "after",
    ];
    assert_eq!(crate_paths(&file), names(&code));
    let tests = ["test_method", "test_helper", "tests_only", "deep"];
    assert_eq!(
        crate_paths_with_tests(&file),
        names(&[&code[..], &tests[..]].concat())
    );
    let test_file = syn::parse_file("#![cfg(test)]\nuse crate::a;\n").expect("parses");
    assert!(crate_paths(&test_file).is_empty());

    let root = "pub mod x;\nmod y;\n#[cfg(test)]\n#[path = \"t.rs\"]\nmod t;\n\
                pub use x::{Thing, inner::Other as Renamed};\npub use y::Y;\n\
                pub use std::fmt::Debug;\n#[cfg(test)]\npub use y::TestOnly;\n\
                pub mod inline { pub use crate::y::Inner; mod nested; }\n";
    let file = syn::parse_file(root).expect("the sample root parses");
    let decl = |within: &[&str], name: &str, path: Option<&str>, test: bool| ModDecl {
        within: within.iter().map(|s| s.to_string()).collect(),
        name: name.to_string(),
        path: path.map(str::to_string),
        test,
    };
    assert_eq!(
        mod_decls(&file),
        vec![
            decl(&[], "x", None, false),
            decl(&[], "y", None, false),
            decl(&[], "t", Some("t.rs"), true),
            decl(&["inline"], "nested", None, false),
        ]
    );
    let names = root_names(&file, &names(&["x", "y"]));
    let want: BTreeMap<String, String> = [("Thing", "x"), ("Renamed", "x"), ("Y", "y")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(names, want);
}

#[test]
fn the_checker_follows_mod_declarations_and_reexports() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |path: &str, text: &str| write_file(dir.path(), path, text);
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c { mod d; }\n#[cfg(test)]\nmod e;\npub use a::Thing;\n",
    );
    write("a.rs", "mod inner;\n");
    write("a/inner.rs", "use crate::b::X;\n");
    write("b/mod.rs", "#[path = \"other.rs\"]\nmod renamed;\n");
    write("b/other.rs", "fn f() -> crate::Thing { todo!() }\n");
    write("c/d.rs", "use crate::a;\n");
    write("e.rs", "use crate::a;\nuse crate::b;\n");
    let mut seen = BTreeSet::new();
    let target = read_target(&dir.path().join("lib.rs"), &mut seen);
    let edges: Vec<String> = target
        .edges()
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| format!("{from} -> {to}")))
        .collect();
    assert_eq!(edges, ["a -> b", "b -> a", "c -> a"]);
    let files: BTreeSet<String> = seen
        .iter()
        .map(|p| {
            p.strip_prefix(dir.path())
                .expect("under the directory")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    assert_eq!(
        files,
        names(&[
            "a.rs",
            "a/inner.rs",
            "b/mod.rs",
            "b/other.rs",
            "c/d.rs",
            "e.rs",
            "lib.rs"
        ])
    );
}

#[test]
fn the_file_graph_follows_super_self_and_crate_paths() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |path: &str, text: &str| write_file(dir.path(), path, text);
    write(
        "lib.rs",
        "mod h;\npub use h::a::Thing;\n#[cfg(test)]\nmod t;\n",
    );
    write("h/mod.rs", "mod a;\nmod b;\nmod c;\npub fn helper() {}\n");
    write("h/a.rs", "use super::b::{X, self as bb};\n");
    write("h/b.rs", "fn f() { super::a::g(); super::helper(); }\n#[cfg(test)]\nmod tests { use crate::h::c; }\n");
    write(
        "h/c.rs",
        "use crate::h::a::Y;\nfn g() -> crate::Thing { self::inner() }\n",
    );
    write("t.rs", "use crate::h::c;\n");
    let graph = file_graph(&dir.path().join("lib.rs"));
    let edges: Vec<String> = graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| format!("{from} -> {to}")))
        .collect();
    assert_eq!(
        edges,
        ["h::a -> h::b", "h::b -> h", "h::b -> h::a", "h::c -> h::a"]
    );
    assert_eq!(
        cycles(&graph),
        vec![vec!["h::a -> h::b".to_string(), "h::b -> h::a".into()]]
    );
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
