//! The state every section's validation shares (`Validator`): the problems found so far, each
//! placed at its value's line and column, the file's directory for relative paths, the
//! environment for secrets named in the file, and the value parsers more than one section uses.
//!
//! Problems are collected rather than returned at the first, so one `check` shows them all.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::error::ConfigError;
use crate::config::spans::SpanIndex;

/// Collects every problem instead of stopping at the first, so one `check` shows them all.
pub(super) struct Validator<'e> {
    file: PathBuf,
    spans: SpanIndex,
    errors: Vec<ConfigError>,
    /// The environment, for secrets named in the file (`secret_env`).
    env: &'e dyn Fn(&str) -> Option<String>,
}

impl<'e> Validator<'e> {
    /// For the file at `file` (only named in errors and used for relative paths), whose text
    /// after substitution is `text`.
    pub(super) fn new(file: &Path, text: &str, env: &'e dyn Fn(&str) -> Option<String>) -> Self {
        Validator {
            file: file.to_path_buf(),
            spans: SpanIndex::build(text),
            errors: Vec::new(),
            env,
        }
    }

    pub(super) fn file(&self) -> &Path {
        &self.file
    }

    /// The problems found, in file order (problems at one position in the order found).
    pub(super) fn into_errors(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|e| (e.line, e.col));
        self.errors
    }

    /// An environment variable the file names (a secret), as the caller of `parse` sees it.
    pub(super) fn env(&self, name: &str) -> Option<String> {
        (self.env)(name)
    }

    pub(super) fn error(&mut self, path: &str, message: impl Into<String>) {
        let pos = self.spans.find(path);
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: pos.line,
            col: pos.col,
            message: format!("{path}: {}", message.into()),
        });
    }

    pub(super) fn duration(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Duration {
        self.duration_from(path, value, default, false)
    }

    /// Like [`Self::duration`], with zero allowed (a leeway, a slack).
    pub(super) fn duration_or_zero(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Duration {
        self.duration_from(path, value, default, true)
    }

    fn duration_from(
        &mut self,
        path: &str,
        value: Option<&str>,
        default: Duration,
        zero_ok: bool,
    ) -> Duration {
        let Some(text) = value else { return default };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if zero_ok || !d.is_zero() => d,
            Ok(_) => {
                self.error(path, "must be greater than zero");
                default
            }
            Err(e) => {
                self.error(
                    path,
                    format!("`{text}` is not a duration ({e}): write a number with a unit, like 50ms, 2s, 1m, 1h"),
                );
                default
            }
        }
    }

    /// Paths in the file are relative to the file, so a config works wherever it is run from.
    pub(super) fn relative(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match self.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }
}

/// Names that end up in store keys and headers: kept to characters that need no escaping.
pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}
