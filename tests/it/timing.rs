//! The suite's timing rule (docs/testing.md): no test asserts a wall-clock bound under a
//! second except a timeout under test, so that a busy machine makes the suite slower and never
//! red. A test waits for the event it needs instead (`support::wait::eventually`).
//!
//! Read from the sources, as `structure` does: a comparison with a sub-second
//! `Duration::from_millis`/`from_micros` literal (` < `, ` <= `, ` > `, ` >= ` followed by the
//! literal, nothing in parentheses between), and a sub-second `const ...: Duration`, must have
//! a `timeout under test:` comment (or, for a constant that bounds nothing, `not a bound:`)
//! on one of the four lines above it. The same check as a one-liner is in docs/testing.md.

use std::path::{Path, PathBuf};

/// How many lines above a bound its marker may stand (a multi-line `assert!`).
const MARKER_REACH: usize = 4;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("tests/it is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `text` starts with `from_millis(` or `from_micros(` and 1 to 3 digits (or `_`) and
/// `)`: a literal under a second.
fn sub_second_literal(text: &str) -> bool {
    ["from_millis(", "from_micros("].iter().any(|call| {
        text.strip_prefix(call).is_some_and(|rest| {
            let digits = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '_')
                .count();
            (1..=3).contains(&digits) && rest[digits..].starts_with(')')
        })
    })
}

/// A comparison whose right side reaches a sub-second literal without a parenthesis between.
fn compares_with_sub_second(line: &str) -> bool {
    [" < ", " <= ", " > ", " >= "].iter().any(|op| {
        line.match_indices(op).any(|(at, _)| {
            let rest = &line[at + op.len()..];
            let reach = rest.find(['(', ')', ';']).unwrap_or(rest.len());
            rest[..reach]
                .rfind("Duration::")
                .is_some_and(|d| sub_second_literal(&rest[d + "Duration::".len()..]))
        })
    })
}

/// `const NAME: Duration = Duration::from_millis(N);` with N under a second.
fn sub_second_constant(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("const ")
        && line
            .split_once(": Duration = Duration::")
            .is_some_and(|(_, value)| sub_second_literal(value))
}

/// Every line of `text` that breaks the rule: (line number, line).
fn offenders(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        if !(compares_with_sub_second(line) || sub_second_constant(line)) {
            continue;
        }
        let marked = lines[i.saturating_sub(MARKER_REACH)..=i]
            .iter()
            .any(|l| l.contains("timeout under test:") || l.contains("not a bound:"));
        if !marked {
            found.push((i + 1, line.trim().to_owned()));
        }
    }
    found
}

#[test]
fn the_rule_sees_a_bound_and_its_marker() {
    assert!(compares_with_sub_second(
        "        started.elapsed() < Duration::from_millis(300),"
    ));
    assert!(compares_with_sub_second(
        "    assert!(took >= timeout - Duration::from_millis(50));"
    ));
    assert!(!compares_with_sub_second(
        "    assert!(took < timeout + Duration::from_secs(1));"
    ));
    assert!(!compares_with_sub_second(
        "    f(|i| (i < 10).then_some(Duration::from_millis(10)));"
    ));
    assert!(!compares_with_sub_second(
        "    assert!(took < Duration::from_millis(1500));"
    ));
    assert!(sub_second_constant(
        "const MARGIN: Duration = Duration::from_millis(800);"
    ));
    assert!(!sub_second_constant(
        "const MARGIN: Duration = Duration::from_secs(1);"
    ));
    let marked =
        "// timeout under test: idle_timeout 1s\nassert!(\n    t >= Duration::from_millis(900)\n);";
    assert!(offenders(marked).is_empty());
    let bare = "assert!(\n    t >= Duration::from_millis(900)\n);";
    assert_eq!(offenders(bare).len(), 1);
}

#[test]
fn no_test_asserts_a_wall_clock_bound_under_a_second_unless_it_is_a_timeout_under_test() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    let mut report = Vec::new();
    for file in &files {
        // This file names the patterns it looks for.
        if file.ends_with("timing.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (line, code) in offenders(&text) {
            let shown = file.strip_prefix(&root).unwrap().display();
            report.push(format!("tests/it/{shown}:{line}: {code}"));
        }
    }
    assert!(
        report.is_empty(),
        "sub-second wall-clock bounds without a `timeout under test:` comment (wait for the \
         event instead: docs/testing.md):\n{}",
        report.join("\n")
    );
}
