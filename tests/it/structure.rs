//! The crate's module structure: dependencies run one way, between the top-level modules and
//! between the files of each module folder.
//!
//! A module that imports one that imports it back cannot be read, tested or replaced on its
//! own, and each new feature built on such a pair tightens the knot. These tests read the
//! sources (not the compiled crate, so they see `use` lines and paths alike) and fail with
//! the cycle they find:
//!
//! - between top-level modules (`config`, `limit`, `throttle`, `proxy`, ...), named through
//!   `crate::`;
//! - inside each module folder (`src/limit/`, ...), between its files: a file names a sibling
//!   through `super::x`, `crate::limit::x` or `self::x`, and the folder's root (`mod.rs`)
//!   names a child as `x::` too. A child that names an item of the root (`super::Check`,
//!   `use super::*`) depends on the root; the root's `mod x;` declares a child and is no
//!   dependency. A subfolder counts as one node of its parent folder.
//!
//! Unit tests (`#[cfg(test)] mod ...`, at the end of a file) and comments are left out: a
//! test may reach anywhere, and a doc link is not a dependency.
//!
//! And no function outside tests is over [`MAX_FUNCTION_LINES`] lines, counted from its `fn`
//! line to its closing brace (comments, strings and `#[cfg(test)]` items left out): each
//! offender is named with its file, line and length.

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

/// The code of a file without comments and without its unit-test modules (which come last).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
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

/// A module path: `src/limit/memory.rs` is `["limit", "memory"]`, `src/limit/mod.rs` (or
/// `src/limit.rs`) is `["limit"]`.
type ModPath = Vec<String>;

/// The module path of a file given relative to `src/` (with `/` between folders), or `None`
/// for the crate roots.
fn module_path(relative: &str) -> Option<ModPath> {
    let stem = relative.strip_suffix(".rs")?;
    let mut path: ModPath = stem.split('/').map(str::to_string).collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    (!(path.len() == 1 && matches!(path[0].as_str(), "lib" | "main"))).then_some(path)
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path written in `code`, its `use` groups expanded (`super::{a, b::{c, self}}` gives
/// `super::a`, `super::b::c` and `super::b`; a glob stops at its prefix). A path starts at an
/// identifier that does not continue another path (`::http::X` and `a::b` yield no path at
/// `http` or `b`); `pub(super)` and `pub(in crate::x)` are visibilities, not paths.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = is_ident_char(chars[i])
            && !chars[i].is_ascii_digit()
            && (i == 0 || !is_ident_char(chars[i - 1]))
            && !(i >= 2 && chars[i - 2..i] == [':', ':']);
        if !starts {
            i += 1;
            continue;
        }
        let before = out.len();
        let start = i;
        i = read_path(&chars, i, Vec::new(), &mut out);
        if is_visibility(&chars[..start]) {
            out.truncate(before);
        }
    }
    out
}

/// Whether a path that follows `before` is a visibility (`pub(super)`, `pub(in crate::x)`),
/// which restricts who may use an item and depends on nothing.
fn is_visibility(before: &[char]) -> bool {
    // The text just before the path, nearest first, without spaces.
    let near: Vec<char> = before
        .iter()
        .rev()
        .filter(|c| !c.is_whitespace())
        .take(8)
        .copied()
        .collect();
    let keyword = |rest: &[char]| {
        rest.starts_with(&['b', 'u', 'p']) && rest.get(3).is_none_or(|c| !is_ident_char(*c))
    };
    match near.as_slice() {
        ['(', rest @ ..] if keyword(rest) => true,
        ['n', 'i', '(', rest @ ..] => keyword(rest),
        _ => false,
    }
}

/// Reads the path that starts at `chars[at]` after `prefix`, pushing each path it spells
/// (one, or one per item of a group) onto `out`; returns where it ends.
fn read_path(
    chars: &[char],
    mut at: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let skip_space = |mut at: usize| {
        while at < chars.len() && chars[at].is_whitespace() {
            at += 1;
        }
        at
    };
    loop {
        at = skip_space(at);
        if at < chars.len() && chars[at] == '{' {
            // A group: each item is a path after the prefix.
            at += 1;
            loop {
                at = skip_space(at);
                match chars.get(at) {
                    None => return at,
                    Some('}') => return at + 1,
                    Some(',') => at += 1,
                    Some(_) => {
                        let next = read_path(chars, at, prefix.clone(), out);
                        // Something that is not a path (a stray character): move on.
                        at = if next == at { at + 1 } else { next };
                    }
                }
            }
        }
        if at < chars.len() && chars[at] == '*' {
            out.push(prefix);
            return at + 1;
        }
        let start = at;
        while at < chars.len() && is_ident_char(chars[at]) {
            at += 1;
        }
        if at == start {
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return at;
        }
        let segment: String = chars[start..at].iter().collect();
        if segment != "self" || prefix.is_empty() {
            prefix.push(segment);
        }
        let after = skip_space(at);
        if chars.get(after) == Some(&':') && chars.get(after + 1) == Some(&':') {
            at = after + 2;
        } else {
            out.push(prefix);
            return at;
        }
    }
}

/// The module a path written in the file of module `from` lands in: the longest known
/// module it names, or `None` for a path outside the crate's files (std, another crate, a
/// local item, a single identifier).
fn target(from: &ModPath, path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let (mut at, rest) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.clone(), &path[1..]),
        "super" => {
            let mut at = from.clone();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                at.pop()?;
                rest = &rest[1..];
            }
            (at, rest)
        }
        // A bare name is a child module (`x::` in a folder's root) or nothing of ours.
        first => {
            let mut child = from.clone();
            child.push(first.to_string());
            if path.len() < 2 || !modules.contains(&child) {
                return None;
            }
            (from.clone(), path)
        }
    };
    let mut found = modules.contains(&at).then(|| at.clone());
    for segment in rest {
        at.push(segment.clone());
        if !modules.contains(&at) {
            break;
        }
        found = Some(at.clone());
    }
    found
}

/// Which module names which (file modules only, each edge between two different ones), from
/// files given as (path relative to `src/`, code without comments and tests).
fn file_graph(files: &[(String, String)]) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let parsed: Vec<(ModPath, &str)> = files
        .iter()
        .filter_map(|(relative, code)| Some((module_path(relative)?, code.as_str())))
        .collect();
    let modules: BTreeSet<ModPath> = parsed.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, code) in &parsed {
        let named = graph.entry(from.clone()).or_default();
        for path in paths(code) {
            if let Some(to) = target(from, &path, &modules) {
                if &to != from {
                    named.insert(to);
                }
            }
        }
    }
    graph
}

/// For each module folder (a module with children, below the crate root) with an import
/// cycle between its nodes (its root and its direct children, a child's own subtree counted
/// as the child): one cycle, as the list of modules along it, and the knots it lies in.
fn folder_cycles(files: &[(String, String)]) -> Vec<(Vec<ModPath>, BTreeSet<BTreeSet<String>>)> {
    let graph = file_graph(files);
    let folders: BTreeSet<ModPath> = graph
        .keys()
        .filter(|m| m.len() >= 2)
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    let mut cycles = Vec::new();
    for folder in folders {
        let node = |m: &ModPath| -> Option<ModPath> {
            m.starts_with(&folder)
                .then(|| m[..m.len().min(folder.len() + 1)].to_vec())
        };
        let mut local: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let name = |m: ModPath| m.join("::");
        for (from, named) in &graph {
            let Some(a) = node(from) else { continue };
            local.entry(name(a.clone())).or_default();
            for to in named {
                if let Some(b) = node(to).filter(|b| *b != a) {
                    local.entry(name(a.clone())).or_default().insert(name(b));
                }
            }
        }
        if let Some(cycle) = find_cycle(&local) {
            let cycle = cycle
                .iter()
                .map(|m| m.split("::").map(str::to_string).collect())
                .collect();
            cycles.push((cycle, knots(&local)));
        }
    }
    cycles
}

/// The knots of `graph`: each set of nodes that all reach each other (its strongly connected
/// components of more than one node). A cycle shows one way around a knot; the knot is all
/// that must be untied.
fn knots(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reach(n))).collect();
    reached
        .iter()
        .map(|(node, seen)| {
            seen.iter()
                .filter(|other| reached.get(other).is_some_and(|r| r.contains(*node)))
                .cloned()
                .collect::<BTreeSet<String>>()
        })
        .filter(|knot| knot.len() > 1)
        .collect()
}

/// Every file under src/, relative to it, with its code.
fn source_files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files
        .iter()
        .map(|file| {
            let relative = file.strip_prefix(&src).expect("under src/");
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(file).expect("source is readable");
            (relative, code(&text))
        })
        .collect()
}

#[test]
fn files_of_a_module_folder_depend_on_each_other_one_way() {
    let files = source_files();
    let graph = file_graph(&files);
    let inside: usize = graph
        .iter()
        .filter(|(from, _)| from.len() >= 2)
        .map(|(from, named)| named.iter().filter(|to| to.starts_with(&from[..1])).count())
        .sum();
    assert!(
        inside >= 20,
        "the source walk found too few imports inside module folders to mean anything: {graph:?}"
    );
    let cycles = folder_cycles(&files);
    let shown: Vec<String> = cycles
        .iter()
        .map(|(cycle, knots)| {
            let cycle: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            format!("{} (tangled: {knots:?})", cycle.join(" → "))
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles inside module folders (each names the next through `super::`, \
         `crate::…` or, from a folder's root, a child's name; a child naming an item of the \
         root depends on the root): move the shared piece into a file both can import\n  {}",
        shown.join("\n  ")
    );
}

mod folder_detector {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(path, text)| (path.to_string(), code(text)))
            .collect()
    }

    fn module(path: &str) -> ModPath {
        path.split("::").map(str::to_string).collect()
    }

    fn cycles(list: &[(&str, &str)]) -> Vec<String> {
        folder_cycles(&files(list))
            .iter()
            .map(|(c, _)| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" "))
            .collect()
    }

    #[test]
    fn paths_are_read_with_their_groups() {
        let read =
            |code: &str| -> Vec<String> { paths(code).iter().map(|p| p.join("::")).collect() };
        assert_eq!(
            read("use super::{a, b::{c, self}, d::*};"),
            ["use", "super::a", "super::b::c", "super::b", "super::d"]
        );
        assert_eq!(
            read("let x = ::http::Y; a::b::c()"),
            ["let", "x", "a::b::c"]
        );
        assert_eq!(read("pub(in crate::limit) fn f"), ["pub", "fn", "f"]);
        assert_eq!(
            read("pub(super) fn g(x: super::T)"),
            ["pub", "fn", "g", "x", "super::T"]
        );
        assert_eq!(
            read("pub ( crate ) use self::a;"),
            ["pub", "use", "self::a"]
        );
        assert_eq!(read("crate :: limit :: x ()"), ["crate::limit::x"]);
    }

    #[test]
    fn paths_land_in_the_longest_module_they_name() {
        let modules: BTreeSet<ModPath> = ["limit", "limit::a", "limit::b", "http"]
            .iter()
            .map(|m| module(m))
            .collect();
        let land = |from: &str, path: &str| {
            target(&module(from), &module(path), &modules).map(|m| m.join("::"))
        };
        assert_eq!(land("limit::a", "super::b::X").as_deref(), Some("limit::b"));
        assert_eq!(land("limit::a", "super::Check").as_deref(), Some("limit"));
        assert_eq!(
            land("limit::a", "crate::limit::b").as_deref(),
            Some("limit::b")
        );
        assert_eq!(
            land("limit::a", "super::super::http").as_deref(),
            Some("http")
        );
        assert_eq!(land("limit", "b::f").as_deref(), Some("limit::b"));
        assert_eq!(land("limit", "self::a::X").as_deref(), Some("limit::a"));
        // A bare name in a child is another crate (or a local item), never a sibling.
        assert_eq!(land("limit::a", "b::f"), None);
        assert_eq!(land("limit::a", "std::f"), None);
    }

    #[test]
    fn a_loop_between_siblings_is_found_directly_or_around_several() {
        assert_eq!(
            cycles(&[
                ("limit/mod.rs", "mod a;\nmod b;\n"),
                ("limit/a.rs", "use super::b::Runner;\n"),
                ("limit/b.rs", "fn f() -> crate::limit::a::Arg { todo!() }\n"),
            ]),
            ["limit::a limit::b limit::a"]
        );
        assert_eq!(
            cycles(&[
                ("limit/a.rs", "use super::{b, x::Y};\n"),
                ("limit/b.rs", "use super::c::Z;\n"),
                (
                    "limit/c.rs",
                    "use self::inner::Q;\nfn g() { super::a::h() }\n"
                ),
            ]),
            ["limit::a limit::b limit::c limit::a"]
        );
    }

    #[test]
    fn a_root_and_a_child_loop_only_when_the_root_names_the_child() {
        let child = ("limit/a.rs", "use super::{Shared, *};\n");
        assert!(cycles(&[
            ("limit/mod.rs", "mod a;\npub mod b;\npub struct Shared;\n"),
            child,
        ])
        .is_empty());
        assert_eq!(
            cycles(&[
                (
                    "limit/mod.rs",
                    "mod a;\npub struct Shared;\nfn f() { a::g() }\n"
                ),
                child,
            ]),
            ["limit limit::a limit"]
        );
        assert_eq!(
            cycles(&[
                ("limit/mod.rs", "pub use a::Thing;\npub struct Shared;\n"),
                ("limit/a.rs", "use crate::limit::Shared;\n"),
            ]),
            ["limit limit::a limit"]
        );
    }

    #[test]
    fn a_subfolder_is_one_node_and_has_its_own_loops() {
        let loops = cycles(&[
            (
                "config/mod.rs",
                "mod validate;\npub struct Route;\nfn f() { validate::all() }\n",
            ),
            ("config/validate/mod.rs", "mod routes;\n"),
            ("config/validate/routes.rs", "use super::super::Route;\n"),
        ]);
        assert_eq!(loops, ["config config::validate config"]);
        let loops = cycles(&[
            ("config/mod.rs", "mod validate;\n"),
            (
                "config/validate/mod.rs",
                "mod routes;\nfn f() { routes::g() }\n",
            ),
            ("config/validate/routes.rs", "use super::Ctx;\n"),
        ]);
        assert_eq!(
            loops,
            ["config::validate config::validate::routes config::validate"]
        );
    }

    #[test]
    fn comments_tests_and_other_crates_are_no_imports() {
        assert!(cycles(&[
            ("limit/mod.rs", "mod http;\nmod b;\n"),
            ("limit/http.rs", "use super::b::X;\n"),
            (
                "limit/b.rs",
                "use http::HeaderMap; // super::http\n/// crate::limit::http\nfn f() {}\n\
                 #[cfg(test)]\nmod tests {\n    use super::super::http;\n}\n",
            ),
        ])
        .is_empty());
        // The top-level roots are not a folder of their own here.
        assert!(cycles(&[("lib.rs", "pub mod a;"), ("a.rs", "use crate::b;")]).is_empty());
    }
}

/// The longest a function may be, from its `fn` line to its closing brace: a longer one does
/// several things, and each change to one of them has to be read against the others.
const MAX_FUNCTION_LINES: usize = 100;

/// `text` with every comment, string and character literal blanked to spaces (line breaks
/// kept), so that the braces left are the code's own and lines keep their numbers.
fn blank_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out: Vec<char> = chars.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(chars.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut i = 0;
    while i < chars.len() {
        let next = chars.get(i + 1).copied();
        let starts_ident = i == 0 || !is_ident_char(chars[i - 1]);
        let end = match chars[i] {
            '/' if next == Some('/') => (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len()),
            '/' if next == Some('*') => {
                // Block comments nest.
                let (mut depth, mut j) = (0usize, i);
                loop {
                    if j + 1 >= chars.len() {
                        break chars.len();
                    }
                    match (chars[j], chars[j + 1]) {
                        ('/', '*') => (depth, j) = (depth + 1, j + 2),
                        ('*', '/') if depth == 1 => break j + 2,
                        ('*', '/') => (depth, j) = (depth - 1, j + 2),
                        _ => j += 1,
                    }
                }
            }
            '"' => {
                let mut j = i + 1;
                while j < chars.len() && chars[j] != '"' {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                j + 1
            }
            'r' | 'b' if starts_ident && raw_string_at(&chars, i).is_some() => {
                let (hashes, open) = raw_string_at(&chars, i).expect("checked above");
                let mut j = open + 1;
                while j < chars.len()
                    && !(chars[j] == '"'
                        && chars[j + 1..].iter().take_while(|c| **c == '#').count() >= hashes)
                {
                    j += 1;
                }
                j + 1 + hashes
            }
            // A character literal ('x', '\n', '\u{7d}'); a lifetime ('a, 'static) is code.
            '\'' if next == Some('\\') => {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                j + 1
            }
            '\'' if chars.get(i + 2) == Some(&'\'') => i + 3,
            _ => {
                i += 1;
                continue;
            }
        };
        blank(&mut out, i, end);
        i = end;
    }
    out.into_iter().collect()
}

/// For a raw string starting at `at` (`r"`, `r#"`, `br##"`, ...): its number of `#` and the
/// index of its opening quote.
fn raw_string_at(chars: &[char], at: usize) -> Option<(usize, usize)> {
    let mut j = at;
    if chars[j] == 'b' {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|c| **c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some((hashes, j + hashes))
}

/// The index of the brace that closes the one at `open` in blanked `code`.
fn closing_brace(code: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, c) in code.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => return j,
            '}' => depth -= 1,
            _ => {}
        }
    }
    code.len()
}

/// Every function with a body in `text` outside `#[cfg(test)]` items, as (line of its `fn`,
/// name, lines from its `fn` line to its closing brace).
fn function_lengths(text: &str) -> Vec<(usize, String, usize)> {
    let code: Vec<char> = blank_literals(text).chars().collect();
    let line_at = |at: usize| 1 + code[..at].iter().filter(|c| **c == '\n').count();
    let word_at = |at: usize, word: &str| {
        let end = at + word.chars().count();
        code.len() >= end
            && code[at..end].iter().copied().eq(word.chars())
            && (at == 0 || !is_ident_char(code[at - 1]))
            && code.get(end).is_none_or(|c| !is_ident_char(*c))
    };
    // The first `{` or `;` from `at`: an item's body, or its end when it has none.
    let body_from = |at: usize| {
        (at..code.len())
            .find(|&j| code[j] == '{' || code[j] == ';')
            .filter(|&j| code[j] == '{')
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if code[i..].starts_with(&['#', '[']) {
            let attribute: String = code[i..].iter().take_while(|c| **c != ']').collect();
            if attribute.replace(' ', "") == "#[cfg(test)" {
                // Skip the item the attribute is on (a test module, a test helper).
                let end = body_from(i).map_or(i + 1, |open| closing_brace(&code, open));
                i = end + 1;
                continue;
            }
        }
        if word_at(i, "fn") {
            let name: String = code[i + 2..]
                .iter()
                .skip_while(|c| c.is_whitespace())
                .take_while(|c| is_ident_char(**c))
                .collect();
            // `fn(u8) -> u8` is a type, not a function.
            if !name.is_empty() {
                if let Some(open) = body_from(i) {
                    let close = closing_brace(&code, open);
                    let length = line_at(close.min(code.len() - 1)) - line_at(i) + 1;
                    found.push((line_at(i), name, length));
                }
            }
        }
        i += 1;
    }
    found
}

#[test]
fn no_function_is_over_100_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    // Files that are unit tests as a whole (`#[cfg(test)] mod x;`).
    let test_files: Vec<PathBuf> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("source is readable");
            let folder = file.parent().expect("a file is in a folder").to_path_buf();
            let declared: Vec<String> = text
                .split("#[cfg(test)]")
                .skip(1)
                .filter_map(|rest| {
                    let rest = rest.trim_start().strip_prefix("mod ")?;
                    let name: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
                    rest[name.len()..]
                        .trim_start()
                        .starts_with(';')
                        .then_some(name)
                })
                .collect();
            declared
                .into_iter()
                .map(move |name| folder.join(format!("{name}.rs")))
        })
        .collect();
    let mut long = Vec::new();
    for file in files.iter().filter(|f| !test_files.contains(f)) {
        let text = std::fs::read_to_string(file).expect("source is readable");
        let relative = file.strip_prefix(&src).expect("under src/").display();
        for (line, name, length) in function_lengths(&text) {
            if length > MAX_FUNCTION_LINES {
                long.push(format!("src/{relative}:{line} {name} {length}"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split each into steps named for what \
         they do):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_counter_counts_to_the_closing_brace_past_strings_and_comments() {
    // A function of `lines` lines from its `fn` line to its closing brace, each body line
    // holding a brace the counter must not take for code.
    let function = |name: &str, lines: usize| {
        let tricks = [
            "    let a = \"{\";",
            "    let b = '}';",
            "    // }",
            "    /* { /* } */ { */",
            "    let c = r#\"}\"\"#;",
            "    let d: &'static str = \"\\\"}\";",
            "    let e = b'{';",
            "    let f = '\\u{7d}';",
        ];
        let body: Vec<&str> = (0..lines - 2).map(|i| tricks[i % tricks.len()]).collect();
        format!("fn {name}<'a>(x: &'a str) {{\n{}\n}}\n", body.join("\n"))
    };
    let text = format!(
        "use x::y;\n{}\npub(crate) async fn {}\nfn declared(f: fn(u8) -> u8);\n{}",
        function("long", 101),
        &function("just_fits", 100)[3..],
        "#[cfg(test)]\nmod tests {\n    fn helper() {\n    }\n}\n"
    );
    let found = function_lengths(&text);
    assert_eq!(
        found,
        vec![
            (2, "long".to_string(), 101),
            (104, "just_fits".to_string(), 100)
        ]
    );
    let over: Vec<_> = found.iter().filter(|f| f.2 > MAX_FUNCTION_LINES).collect();
    assert_eq!(
        over.len(),
        1,
        "a 101-line function is found, a 100-line one is not"
    );
}
