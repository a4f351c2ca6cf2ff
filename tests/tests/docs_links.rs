//! The documentation's links lead somewhere: every relative link in `README.md` and `docs/`
//! names a file of the repository, and every `#anchor` a heading of that file (as GitHub
//! derives anchors from headings). The README is short and the rest lives in `docs/`, so a
//! section moved or renamed must not leave a link pointing at nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The markdown files checked: the README and everything under `docs/`.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("a docs folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push(line);
        }
    }
    out
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter_map(|l| {
            let hashes = l.chars().take_while(|c| *c == '#').count();
            (1..=6)
                .contains(&hashes)
                .then(|| l[hashes..].strip_prefix(' '))
                .flatten()
                .map(slug)
        })
        .collect()
}

/// Targets of the inline links `[text](target)` in `text`, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("readable markdown");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().expect("a folder").join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", doc.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let there = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&there).contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: what is not the two commands, the curl block and the \
         map of the docs goes to docs/"
    );
}

#[test]
fn the_checker_sees_headings_links_and_code() {
    let text = "# A `b` c: d\n```sh\n# not a heading [x](#nope)\n```\n[y](other.md#a-b-c-d)\n";
    assert_eq!(anchors(text), BTreeSet::from(["a-b-c-d".to_string()]));
    assert_eq!(links(text), vec!["other.md#a-b-c-d".to_string()]);
}
