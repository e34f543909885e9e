//! The crate's module structure: dependencies between the top-level modules run one way.
//!
//! A module that imports one that imports it back cannot be read, tested or replaced on its
//! own, and each new feature built on such a pair tightens the knot. This test reads the
//! sources (not the compiled crate, so it sees `use` lines and paths alike), builds the graph
//! of which top-level module (`config`, `limit`, `throttle`, `proxy`, ...) names which other,
//! and fails with the cycle it finds. Unit tests (`#[cfg(test)] mod tests`) and comments are
//! left out: a test may reach anywhere, and a doc link is not a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/throttle/keys.rs` → `throttle`), or `None`
/// for the crate roots.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The code of a file without comments and without its unit-test module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::…` paths, including inside
/// `use crate::{a, b::c}` groups.
fn named_modules(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            // Items of the group start the text or follow a comma (nested groups are rare
            // enough at the top of `crate::` not to matter).
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if modules.contains(&name) {
                    named.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if modules.contains(&name) {
                named.insert(name);
            }
        }
    }
    named
}

/// A cycle in `graph`, as the list of modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut done, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = top_module(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("source is readable");
        let mut named = named_modules(&code(&text), &modules);
        named.remove(&module);
        graph.entry(module).or_default().extend(named);
    }
    graph
}

#[test]
fn top_level_modules_depend_on_each_other_one_way() {
    let graph = module_graph();
    assert!(
        graph.len() >= 10,
        "the source walk found too few modules to mean anything: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "module import cycle: {} (each module names the next through `crate::`); \
             move the shared piece into a module both can import",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_the_parser_sees_groups() {
    let modules: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let named = named_modules(
        "use crate::{a::X, b};\n fn f() { crate::c::g() } // crate::z",
        &modules,
    );
    assert_eq!(named, modules);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(code("x\n#[cfg(test)]\nmod tests { crate::y }"), "x");
}
