//! `${VAR}` and `${VAR:-default}` substitution, done on the file's text before YAML parsing so
//! that secrets and per-environment addresses never have to be written into the file itself.
//!
//! `$$` is a literal `$`. YAML comments are left alone, so a comment may mention `${NAME}`
//! without that variable having to exist. Substitution keeps line numbers intact (unless a
//! value itself holds a newline), so parse errors still point at the right line.

/// A `${VAR}` that is unset and has no default, or a `${` that is never closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstitutionError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Replaces every `${NAME}` / `${NAME:-default}` outside comments using `lookup`.
pub fn substitute(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, SubstitutionError> {
    let mut out = String::with_capacity(text.len());
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let (content, comment) = line.split_at(comment_start(line));
        let replaced = substitute_line(content, &lookup).map_err(|mut e| {
            e.line += index;
            e
        })?;
        out.push_str(&replaced);
        out.push_str(comment);
    }
    Ok(out)
}

/// Where a YAML comment starts on `line`: a `#` at the start or after whitespace, outside
/// quotes (a `#` inside a value such as `a#b` or `"x # y"` is not a comment).
fn comment_start(line: &str) -> usize {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single && previous != '\\' => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return i,
            _ => {}
        }
        previous = c;
    }
    line.len()
}

fn substitute_line(
    text: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, SubstitutionError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let (mut line, mut col) = (1usize, 1usize);
    while let Some(pos) = rest.find('$') {
        let (before, from_dollar) = rest.split_at(pos);
        out.push_str(before);
        advance(&mut line, &mut col, before);
        if let Some(after) = from_dollar.strip_prefix("$$") {
            out.push('$');
            col += 2;
            rest = after;
            continue;
        }
        let Some(body_and_rest) = from_dollar.strip_prefix("${") else {
            out.push('$');
            col += 1;
            rest = &from_dollar[1..];
            continue;
        };
        let Some(end) = body_and_rest.find('}') else {
            return Err(SubstitutionError {
                line,
                col,
                message: "`${` is never closed: write `${NAME}` or `${NAME:-default}` (use `$$` for a literal `$`)".into(),
            });
        };
        let body = &body_and_rest[..end];
        let (name, default) = match body.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (body, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(SubstitutionError {
                line,
                col,
                message: format!(
                    "`${{{body}}}` is not a variable reference: names are letters, digits and `_`"
                ),
            });
        }
        match (lookup(name), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(SubstitutionError {
                    line,
                    col,
                    message: format!(
                        "environment variable `{name}` is not set: set it, or give a default with `${{{name}:-value}}`"
                    ),
                })
            }
        }
        col += body.chars().count() + 3;
        rest = &body_and_rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn advance(line: &mut usize, col: &mut usize, text: &str) {
    for c in text.chars() {
        if c == '\n' {
            *line += 1;
            *col = 1;
        } else {
            *col += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("redis.internal".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn replaces_set_variables_and_defaults() {
        let text = "url: redis://${HOST}:${PORT:-6379}\nx: '${EMPTY:-fallback}'";
        assert_eq!(
            substitute(text, env).unwrap(),
            "url: redis://redis.internal:6379\nx: ''"
        );
    }

    #[test]
    fn dollar_dollar_is_a_literal_dollar_and_lone_dollars_stay() {
        assert_eq!(substitute("a: $${HOST} $5", env).unwrap(), "a: ${HOST} $5");
        assert_eq!(
            substitute("a: $$${HOST}", env).unwrap(),
            "a: $redis.internal"
        );
    }

    #[test]
    fn unset_variable_without_default_names_it_with_its_position() {
        let err = substitute("a: 1\nb: x${NOPE}", env).unwrap_err();
        assert_eq!((err.line, err.col), (2, 5));
        assert!(err.message.contains("`NOPE` is not set"), "{}", err.message);
    }

    #[test]
    fn comments_are_not_substituted_but_hashes_in_values_are_not_comments() {
        let text = "# uses ${UNSET} in prose\na: ${HOST} # and ${UNSET:-x} here\nb: \"x # ${HOST}\"\nc: a#${HOST}\n";
        assert_eq!(
            substitute(text, env).unwrap(),
            "# uses ${UNSET} in prose\na: redis.internal # and ${UNSET:-x} here\nb: \"x # redis.internal\"\nc: a#redis.internal\n"
        );
    }

    #[test]
    fn unclosed_and_malformed_references_are_errors() {
        assert!(substitute("a: ${HOST", env)
            .unwrap_err()
            .message
            .contains("never closed"));
        assert!(substitute("a: ${A B}", env)
            .unwrap_err()
            .message
            .contains("not a variable"));
    }
}
