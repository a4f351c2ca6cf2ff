//! Which top-level modules a Rust source file imports, read with `syn`, for the architecture
//! tests (`module_cycles`, `layers`).
//!
//! A file is parsed as rustc parses it, so comments, doc comments and string literals are
//! never mistaken for code. [`crate_paths`] gives the first name after `crate::` of every path
//! in the file: `use` trees (`use crate::{a::X, b}` gives `a` and `b`), paths in types,
//! expressions, patterns and attributes' `pub(in crate::x)`, and `crate::`/`$crate::` inside
//! macro calls and `macro_rules!` bodies, whose tokens `syn` does not parse. Items under
//! `#[cfg(test)]` (and the whole file under `#![cfg(test)]`) are left out;
//! [`crate_paths_with_tests`] keeps them.
//!
//! [`read_target`] follows the `mod` declarations of a crate root to give each top-level
//! module the names it reaches, and [`Target::edges`] turns those into the module graph (a
//! name the root re-exports counts as the module it comes from); [`cycles`] finds the
//! circles in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Item, Meta, UseTree};

/// The workspace root (the parent of the `tests` crate).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// Reads and parses one source file; a file that does not parse fails the test with its path.
pub fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether the attributes hold `#[cfg(test)]` (or `#![cfg(test)]`).
pub fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        matches!(&a.meta, Meta::List(l) if l.path.is_ident("cfg") && l.tokens.to_string() == "test")
    })
}

/// The first names of every `crate::` path in the file, leaving out `#[cfg(test)]` items:
/// `crate::a::X` and `use crate::{a, b::c}` give `a` (and `b`).
pub fn crate_paths(file: &syn::File) -> BTreeSet<String> {
    paths_in(&file.attrs, &file.items, false)
}

/// [`crate_paths`], `#[cfg(test)]` items included.
pub fn crate_paths_with_tests(file: &syn::File) -> BTreeSet<String> {
    paths_in(&file.attrs, &file.items, true)
}

fn paths_in(attrs: &[Attribute], items: &[Item], tests: bool) -> BTreeSet<String> {
    read(attrs, items, tests).found
}

fn read(attrs: &[Attribute], items: &[Item], tests: bool) -> Reader {
    let mut reader = Reader {
        tests,
        found: BTreeSet::new(),
        full: BTreeSet::new(),
    };
    if tests || !is_test_only(attrs) {
        for item in items {
            reader.visit_item(item);
        }
    }
    reader
}

/// Every path of the file that starts with `crate`, `super` or `self`, whole (`use
/// super::{a::B, c}` gives `[super, a, B]` and `[super, c]`), leaving out `#[cfg(test)]`
/// items. In macro tokens, `crate::name` only.
pub fn module_paths(file: &syn::File) -> BTreeSet<Vec<String>> {
    read(&file.attrs, &file.items, false).full
}

/// A visitor collecting the first segment after `crate` of every path it meets.
struct Reader {
    /// Whether to read `#[cfg(test)]` items too.
    tests: bool,
    found: BTreeSet<String>,
    /// Whole paths from `crate`, `super` or `self` (see [`module_paths`]).
    full: BTreeSet<Vec<String>>,
}

impl Reader {
    fn skips(&self, attrs: &[Attribute]) -> bool {
        !self.tests && is_test_only(attrs)
    }

    /// `crate :: name` (and `$crate :: name`, `crate :: { a, b::c }`) in raw tokens.
    fn scan(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Group(group) => self.scan(group.stream()),
                TokenTree::Ident(ident) if ident == "crate" => {
                    let [TokenTree::Punct(a), TokenTree::Punct(b), next, ..] = &tokens[i + 1..]
                    else {
                        continue;
                    };
                    if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':' {
                        continue;
                    }
                    match next {
                        TokenTree::Ident(name) => {
                            self.add(name);
                            self.full
                                .insert(vec!["crate".to_string(), name.unraw().to_string()]);
                        }
                        TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => {
                            let parser = Punctuated::<UseTree, syn::Token![,]>::parse_terminated;
                            if let Ok(trees) = syn::parse::Parser::parse2(parser, group.stream()) {
                                for tree in &trees {
                                    self.use_tree(tree);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }

    fn add(&mut self, ident: &proc_macro2::Ident) {
        let name = ident.unraw().to_string();
        if name != "self" {
            self.found.insert(name);
        }
    }

    /// One branch of `use crate::{...}` (or the tree after `use crate::`).
    fn use_tree(&mut self, tree: &UseTree) {
        match tree {
            UseTree::Path(p) => self.add(&p.ident),
            UseTree::Name(n) => self.add(&n.ident),
            UseTree::Rename(r) => self.add(&r.ident),
            UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(t)),
            UseTree::Glob(_) => {}
        }
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_item(&mut self, item: &'ast Item) {
        if !self.skips(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !self.skips(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs: &[Attribute] = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !self.skips(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_foreign_item(&mut self, item: &'ast syn::ForeignItem) {
        let attrs: &[Attribute] = match item {
            syn::ForeignItem::Fn(i) => &i.attrs,
            syn::ForeignItem::Static(i) => &i.attrs,
            syn::ForeignItem::Type(i) => &i.attrs,
            syn::ForeignItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !self.skips(attrs) {
            visit::visit_foreign_item(self, item);
        }
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        if !self.skips(&local.attrs) {
            visit::visit_local(self, local);
        }
    }

    fn visit_stmt_macro(&mut self, stmt: &'ast syn::StmtMacro) {
        if !self.skips(&stmt.attrs) {
            visit::visit_stmt_macro(self, stmt);
        }
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        if !self.skips(&field.attrs) {
            visit::visit_field(self, field);
        }
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        if !self.skips(&variant.attrs) {
            visit::visit_variant(self, variant);
        }
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        if !self.skips(&arm.attrs) {
            visit::visit_arm(self, arm);
        }
    }

    fn visit_field_value(&mut self, field: &'ast syn::FieldValue) {
        if !self.skips(&field.attrs) {
            visit::visit_field_value(self, field);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let whole: Vec<String> = path
            .segments
            .iter()
            .map(|s| s.ident.unraw().to_string())
            .collect();
        if path.leading_colon.is_none()
            && whole.len() > 1
            && matches!(whole[0].as_str(), "crate" | "super" | "self")
        {
            self.full.insert(whole);
        }
        let mut segments = path.segments.iter();
        if let (None, Some(first), Some(second)) =
            (path.leading_colon, segments.next(), segments.next())
        {
            if first.ident == "crate" {
                self.add(&second.ident);
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        fn from_crate(reader: &mut Reader, tree: &UseTree) {
            match tree {
                UseTree::Path(p) if p.ident == "crate" => reader.use_tree(&p.tree),
                UseTree::Group(g) => g.items.iter().for_each(|t| from_crate(reader, t)),
                _ => {}
            }
        }
        from_crate(self, &item.tree);
        let mut leaves = Vec::new();
        use_leaves(&item.tree, &mut Vec::new(), &mut leaves);
        for (path, _) in leaves {
            if path.len() > 1 && matches!(path[0].as_str(), "crate" | "super" | "self") {
                self.full.insert(path);
            }
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        self.scan(mac.tokens.clone());
    }
}

/// An item's attributes, outer and (for inline modules, functions) inner.
fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// A `mod name;` declaration (a module in a file of its own).
#[derive(Debug, PartialEq, Eq)]
pub struct ModDecl {
    /// The inline modules it sits in (`mod a { mod b; }` gives `["a"]` for `b`).
    pub within: Vec<String>,
    pub name: String,
    /// Its `#[path = "..."]`, if any.
    pub path: Option<String>,
    /// Whether it (or an inline module around it, or the file) is `#[cfg(test)]`.
    pub test: bool,
}

/// The out-of-line modules a file declares, at its top level and inside its inline modules.
pub fn mod_decls(file: &syn::File) -> Vec<ModDecl> {
    fn walk(items: &[Item], within: &mut Vec<String>, test: bool, out: &mut Vec<ModDecl>) {
        for item in items {
            let Item::Mod(m) = item else { continue };
            let test = test || is_test_only(&m.attrs);
            let name = m.ident.unraw().to_string();
            match &m.content {
                Some((_, items)) => {
                    within.push(name);
                    walk(items, within, test, out);
                    within.pop();
                }
                None => {
                    let path = m.attrs.iter().find_map(|a| match &a.meta {
                        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                            syn::Expr::Lit(syn::ExprLit {
                                lit: syn::Lit::Str(s),
                                ..
                            }) => Some(s.value()),
                            _ => None,
                        },
                        _ => None,
                    });
                    out.push(ModDecl {
                        within: within.clone(),
                        name,
                        path,
                        test,
                    });
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &file.items,
        &mut Vec::new(),
        is_test_only(&file.attrs),
        &mut out,
    );
    out
}

/// The paths a `use` tree brings in, each with the name it is known by:
/// `a::{b::C, d as E, self}` gives `[a, b, C] C`, `[a, d] E`, `[a] a`; globs give nothing.
fn use_leaves(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.unraw().to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) if n.ident == "self" => {
            if let Some(last) = prefix.last() {
                out.push((prefix.clone(), last.clone()));
            }
        }
        UseTree::Name(n) => {
            let name = n.ident.unraw().to_string();
            let mut path = prefix.clone();
            path.push(name.clone());
            out.push((path, name));
        }
        UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.unraw().to_string());
            }
            out.push((path, r.rename.unraw().to_string()));
        }
        UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, prefix, out)),
        UseTree::Glob(_) => {}
    }
}

/// Names the crate root brings in with `use` from one of its own modules: `pub use
/// client::Client` makes `crate::Client` mean module `client`.
pub fn root_names(root: &syn::File, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if is_test_only(&root.attrs) {
        return out;
    }
    for item in &root.items {
        let Item::Use(u) = item else { continue };
        if is_test_only(&u.attrs) {
            continue;
        }
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for (path, known_as) in leaves {
            if path.first().is_some_and(|s| s == "super") {
                continue;
            }
            let first = path.iter().find(|s| *s != "crate" && *s != "self");
            if let Some(module) = first.filter(|m| modules.contains(*m)) {
                out.insert(known_as, module.clone());
            }
        }
    }
    out
}

/// One target's module graph.
#[derive(Debug, Default)]
pub struct Target {
    /// Top-level module -> the names it reaches through `crate::`.
    pub named: BTreeMap<String, BTreeSet<String>>,
    /// The names the root re-exports, and their modules.
    pub reexports: BTreeMap<String, String>,
}

impl Target {
    /// Top-level module -> the other top-level modules it imports.
    pub fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
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

/// The files of the out-of-line modules `ast` (the file at `path`) declares, found as rustc
/// finds them, each with whether its own children sit in its directory (a `mod.rs`, a
/// `#[path]`). `mod_rs`: whether `path`'s children sit in its directory (a root, a `mod.rs`).
fn declared_files(path: &Path, mod_rs: bool, ast: &syn::File) -> Vec<(ModDecl, PathBuf, bool)> {
    let dir = path.parent().expect("a file has a directory");
    let children = if mod_rs {
        dir.to_path_buf()
    } else {
        dir.join(path.file_stem().expect("a file has a name"))
    };
    mod_decls(ast)
        .into_iter()
        .map(|decl| {
            let base = decl.within.iter().fold(children.clone(), |d, m| d.join(m));
            let (file, mod_rs) = match &decl.path {
                Some(p) if decl.within.is_empty() => (dir.join(p), true),
                Some(p) => (base.join(p), true),
                None if base.join(format!("{}.rs", decl.name)).exists() => {
                    (base.join(format!("{}.rs", decl.name)), false)
                }
                None => (base.join(&decl.name).join("mod.rs"), true),
            };
            (decl, file, mod_rs)
        })
        .collect()
}

/// Reads a target from its root file (`lib.rs`, `main.rs`, a `bin/` file), following `mod`
/// declarations as rustc does and recording every file it reaches in `seen`. Test-only
/// modules are followed (so their files count as reached) but add nothing to the graph.
pub fn read_target(root: &Path, seen: &mut BTreeSet<PathBuf>) -> Target {
    struct File {
        path: PathBuf,
        /// Its top-level module; None for the root.
        top: Option<String>,
        /// Whether its children sit in its own directory (a root, a `mod.rs`, a `#[path]`).
        mod_rs: bool,
        test: bool,
    }
    let mut queue = vec![File {
        path: root.to_path_buf(),
        top: None,
        mod_rs: true,
        test: false,
    }];
    let mut target = Target::default();
    let mut root_file = None;
    while let Some(file) = queue.pop() {
        let ast = parse(&file.path);
        seen.insert(file.path.clone());
        let test = file.test || is_test_only(&ast.attrs);
        for (decl, path, mod_rs) in declared_files(&file.path, file.mod_rs, &ast) {
            let top = file
                .top
                .clone()
                .unwrap_or_else(|| decl.within.first().unwrap_or(&decl.name).clone());
            let test = test || decl.test;
            if file.top.is_none() && !test {
                target.named.entry(top.clone()).or_default();
            }
            queue.push(File {
                path,
                top: Some(top),
                mod_rs,
                test,
            });
        }
        match (&file.top, test) {
            (None, false) => {
                // The root's inline modules are top-level modules too.
                for item in &ast.items {
                    let Item::Mod(m) = item else { continue };
                    let Some((_, items)) = &m.content else {
                        continue;
                    };
                    if !is_test_only(&m.attrs) {
                        target
                            .named
                            .entry(m.ident.unraw().to_string())
                            .or_default()
                            .extend(paths_in(&m.attrs, items, false));
                    }
                }
                root_file = Some(ast);
            }
            (Some(top), false) => target
                .named
                .entry(top.clone())
                .or_default()
                .extend(crate_paths(&ast)),
            (_, true) => {}
        }
    }
    let modules: BTreeSet<String> = target.named.keys().cloned().collect();
    if let Some(root) = root_file {
        target.reexports = root_names(&root, &modules);
    }
    target
}

/// The strongly connected groups of more than one module, each as its internal edges
/// (`"from -> to"`), sorted.
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
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

/// The crate roots under a crate's `src/`: `lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`.
pub fn roots(src: &Path) -> Vec<PathBuf> {
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

/// The module graph of one target between its files: each file's module (`http::service`)
/// -> the file modules its paths lead to (a path counts as the longest
/// file module it starts with, `super` and `self` taken from the file's place). `#[cfg(test)]`
/// files and items add nothing.
pub fn file_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    // (file, its module path, whether its children sit in its own directory, test-only)
    let mut queue = vec![(root.to_path_buf(), Vec::<String>::new(), true, false)];
    let mut files: Vec<(Vec<String>, syn::File)> = Vec::new();
    while let Some((path, module, mod_rs, test)) = queue.pop() {
        let ast = parse(&path);
        let test = test || is_test_only(&ast.attrs);
        for (decl, child, child_mod_rs) in declared_files(&path, mod_rs, &ast) {
            let mut child_module = module.clone();
            child_module.extend(decl.within.iter().cloned());
            child_module.push(decl.name.clone());
            queue.push((child, child_module, child_mod_rs, test || decl.test));
        }
        if !test {
            files.push((module, ast));
        }
    }
    let name = |m: &[String]| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    let known: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, ast) in &files {
        let from = name(module);
        let targets = graph.entry(from.clone()).or_default();
        for path in module_paths(ast) {
            let mut at: Vec<String> = Vec::new();
            let mut rest = path.as_slice();
            match rest.first().map(String::as_str) {
                Some("crate") => rest = &rest[1..],
                Some("self") => {
                    at = module.clone();
                    rest = &rest[1..];
                }
                Some("super") => {
                    at = module.clone();
                    while rest.first().is_some_and(|s| s == "super") {
                        at.pop();
                        rest = &rest[1..];
                    }
                }
                _ => continue,
            }
            let mut full = at;
            full.extend(rest.iter().cloned());
            let to = (0..=full.len())
                .rev()
                .map(|n| &full[..n])
                .find(|p| known.contains(*p))
                .map(name);
            // The root's names are its re-exports (aliases the top-level check resolves).
            if let Some(to) = to.filter(|to| *to != from && to != "crate") {
                targets.insert(to);
            }
        }
    }
    graph.remove("crate");
    graph
}
