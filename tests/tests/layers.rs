//! The storage node's layers import one way only, and so do the request layer's folders.
//!
//! Each top-level module of `server/src/` belongs to one layer (see the crate docs); a file
//! may name `crate::X` only when X's layer is below its own (or X is its own module). Modules
//! of one layer do not import each other either. The test parses every file under
//! `server/src/` with `syn` (the reader is `yutu_tests::imports`, shared with
//! `module_cycles`) and reads every `crate::` path in it, in `use` trees, inline and in macro
//! tokens, test modules included, so a new upward or sideways import fails here.

use std::collections::BTreeSet;

use yutu_tests::imports::{crate_paths_with_tests, parse, rust_files, workspace};

/// Lowest first. Modules in one group are independent of each other.
const LAYERS: &[&[&str]] = &[
    &["model"],
    &["metrics"],
    &["net"],
    &["config"],
    &["store"],
    &["tier"],
    &["node"],
    &["auth", "events", "kv", "cluster"],
    &["http"],
    &["serve"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|group| group.contains(&module))
}

/// What breaks the rule in one file of top-level module `own`, which names `named`.
fn violations(own: &str, named: &BTreeSet<String>) -> Vec<String> {
    let Some(layer) = layer_of(own) else {
        return vec![format!(
            "module `{own}` is in no layer (add it to LAYERS and the crate docs)"
        )];
    };
    let mut out = Vec::new();
    for name in named.iter().filter(|n| *n != own) {
        match layer_of(name) {
            Some(l) if l < layer => {}
            Some(_) => out.push(format!(
                "`{own}` imports `crate::{name}`, which is not below it"
            )),
            None => out.push(format!("`crate::{name}` is in no layer")),
        }
    }
    out
}

#[test]
fn imports_run_one_way() {
    let src = workspace().join("server").join("src");
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for file in rust_files(&src) {
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
        seen.insert(first.clone());
        let named = crate_paths_with_tests(&parse(&file));
        for problem in violations(&first, &named) {
            problems.push(format!("server/src/{}: {problem}", rel.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
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
    let file = syn::parse_file(
        "use crate::{model::X, tier};\nfn f() { crate::http::go(); }\n// crate::serve in a comment\n\
         fn g() { assert!(crate::net::up(), \"crate::config in a string\"); }\n\
         #[cfg(test)]\nmod tests { use crate::auth::T; }\n",
    )
    .expect("the sample parses");
    let found = crate_paths_with_tests(&file);
    let want: BTreeSet<String> = ["model", "tier", "http", "net", "auth"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
    // From `store`: `model` and `net` are below it, `tier`, `http` and `auth` are not.
    assert_eq!(
        violations("store", &found),
        [
            "`store` imports `crate::auth`, which is not below it",
            "`store` imports `crate::http`, which is not below it",
            "`store` imports `crate::tier`, which is not below it",
        ]
    );
    // Sideways within one layer, and a name in no layer.
    let named: BTreeSet<String> = ["events", "store", "nowhere"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        violations("kv", &named),
        [
            "`kv` imports `crate::events`, which is not below it",
            "`crate::nowhere` is in no layer",
        ]
    );
    assert_eq!(violations("http", &BTreeSet::new()), Vec::<String>::new());
    assert_eq!(violations("new", &BTreeSet::new()).len(), 1);
}

/// The files outside `store/` and `tier/` that may name the shard's store type: the one
/// that builds it (and hands it to the tier at once).
const BUILDS_THE_STORE: &[&str] = &["node/runtime.rs"];

/// The tier is the only door to a shard's store: above it, code asks the tier
/// (`tier/buckets.rs`, `tier/blocks.rs`, `tier/uploads.rs`, ...), never the store itself.
/// The store's field is private to the tier, so the compiler refuses `tier.store`; this
/// keeps the type itself from being named (and so borrowed or passed around) elsewhere.
#[test]
fn only_the_tier_reaches_a_shards_store() {
    let src = workspace().join("server").join("src");
    let mut found = BTreeSet::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).expect("under src");
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel.starts_with("store/") || rel.starts_with("tier/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable");
        if text.contains("ShardStore") || text.contains("store::shard") {
            found.insert(rel);
        }
    }
    let allowed: BTreeSet<String> = BUILDS_THE_STORE.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        found, allowed,
        "only the tier (and the code that builds the store) names the shard's store"
    );
}

/// The request layer's folders, lowest first: a handler file may use the files of a folder
/// below its own (and of its own), never one above or beside it. The files directly under
/// `http/` are shared by all of them and use none, except the one dispatch (`service`),
/// which uses them all.
const HTTP_FOLDERS: &[&[&str]] = &[&["peer"], &["s3"], &["kv", "admin"]];

#[test]
fn the_request_layers_folders_import_one_way() {
    let src = workspace().join("server").join("src");
    let graph = yutu_tests::imports::file_graph(&src.join("lib.rs"));
    let folder_layer = |module: &str| -> Option<Option<usize>> {
        // None: not under http. Some(None): a shared file. Some(Some(l)): folder of layer l.
        let rest = module.strip_prefix("http::")?;
        let first = rest.split("::").next().unwrap_or_default();
        Some(HTTP_FOLDERS.iter().position(|g| g.contains(&first)))
    };
    let mut problems = Vec::new();
    let mut folders_seen = BTreeSet::new();
    for (from, tos) in &graph {
        let Some(own) = folder_layer(from) else {
            continue;
        };
        if own.is_some() {
            folders_seen.insert(from.split("::").nth(1).unwrap_or_default().to_string());
        }
        for to in tos {
            let Some(Some(theirs)) = folder_layer(to) else {
                continue;
            };
            let same = from.split("::").nth(1) == to.split("::").nth(1);
            let allowed = match own {
                _ if same => true,
                None => from == "http::service",
                Some(mine) => theirs < mine,
            };
            if !allowed {
                problems.push(format!("{from} uses {to}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for folder in HTTP_FOLDERS.iter().flat_map(|g| g.iter()) {
        assert!(
            folders_seen.contains(*folder),
            "http folder `{folder}` has no source"
        );
    }
}
