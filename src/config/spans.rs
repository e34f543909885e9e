//! Where each value sits in the YAML file, so that errors found *after* parsing (a zero limit,
//! an unknown identity name) can still be reported as `FILE:LINE:COL`.
//!
//! serde_yaml reports positions for syntax and type errors, but the structs it produces carry
//! none; this index is built from the same text with an event parser and maps a path such as
//! `routes[0].limits[1].period` to the line and column where that value starts.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Default)]
pub struct SpanIndex {
    positions: HashMap<String, Position>,
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
}

impl SpanIndex {
    /// Indexes `text`. A file the event parser rejects gives an empty index (serde_yaml reports
    /// that error with its own position).
    pub fn build(text: &str) -> Self {
        let mut index = SpanIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(text) {
            let Ok((event, span)) = event else { break };
            let at = Position {
                line: span.start.line(),
                col: span.start.col() + 1,
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map {
                        key: key @ None, ..
                    }) = stack.last_mut()
                    {
                        *key = Some(value.into_owned());
                    } else if let Some(path) = next_value_path(&mut stack) {
                        index.positions.entry(path).or_insert(at);
                    }
                }
                Event::Alias(_) => {
                    next_value_path(&mut stack);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let path = next_value_path(&mut stack).unwrap_or_default();
                    index.positions.entry(path.clone()).or_insert(at);
                    stack.push(if matches!(event, Event::MappingStart(..)) {
                        Frame::Map { path, key: None }
                    } else {
                        Frame::Seq { path, next: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        index
    }

    /// The position of `path`, or of its nearest indexed parent (a missing field is reported
    /// where its mapping starts).
    pub fn find(&self, path: &str) -> Position {
        let mut path = path;
        loop {
            if let Some(pos) = self.positions.get(path) {
                return *pos;
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path = &path[..cut],
                None => {
                    return self
                        .positions
                        .get("")
                        .copied()
                        .unwrap_or(Position { line: 1, col: 1 })
                }
            }
        }
    }
}

/// Consumes the slot the next value fills in the innermost container and returns its path.
fn next_value_path(stack: &mut [Frame]) -> Option<String> {
    match stack.last_mut() {
        None => Some(String::new()),
        Some(Frame::Map { path, key }) => {
            let key = key.take()?;
            Some(if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            })
        }
        Some(Frame::Seq { path, next }) => {
            let here = format!("{path}[{next}]");
            *next += 1;
            Some(here)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
listen: \"0.0.0.0:8080\"
routes:
  - name: login
    limits:
      - { algorithm: gcra, limit: 0, period: 60s }
  - name: api
    match:
      path_prefix: /api/
";

    #[test]
    fn finds_nested_values_in_block_and_flow_style() {
        let index = SpanIndex::build(TEXT);
        assert_eq!(index.find("listen"), Position { line: 1, col: 9 });
        assert_eq!(index.find("routes[0].name"), Position { line: 3, col: 11 });
        assert_eq!(
            index.find("routes[0].limits[0].limit"),
            Position { line: 5, col: 35 }
        );
        assert_eq!(
            index.find("routes[1].match.path_prefix"),
            Position { line: 8, col: 20 }
        );
    }

    #[test]
    fn a_missing_path_falls_back_to_its_parent() {
        let index = SpanIndex::build(TEXT);
        assert_eq!(
            index.find("routes[1].match.methods"),
            index.find("routes[1].match")
        );
        assert_eq!(index.find("routes[1].match").line, 8);
        assert_eq!(index.find("nothing.here"), Position { line: 1, col: 1 });
    }
}
