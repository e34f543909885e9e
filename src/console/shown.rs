//! What the console may show of a caller's identity in an explanation.
//!
//! Callers in the lists, the states and the headings are shown by the routes' display rules
//! ([`crate::control::shown`], one rule for every place that names a caller). An explanation
//! of a described request (`GET /limits/explain`) quotes the values the request carries: a
//! value from a source whose display rule hides it (by default, one whose name says it holds
//! a credential: [`crate::identity::display::is_credential_name`]) is replaced there by what
//! the rule shows ([`masked`]), the form the lists show it by.

use crate::identity::key;

/// `text` (a store key, an explanation's value) with every readable form of `raw` replaced by
/// `form` (its digest, or what its display rule shows), when `raw` must not be shown.
pub fn masked(text: &str, raw: &[u8], form: &str) -> String {
    if !key::is_readable(raw) {
        return text.to_owned();
    }
    let readable = String::from_utf8_lossy(raw);
    text.replace(readable.as_ref(), form)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names whose values an explanation masks by default.
    #[test]
    fn credential_names() {
        use crate::identity::display::is_credential_name;
        for name in [
            "X-Api-Key",
            "api_key",
            "Authorization",
            "session",
            "x-token",
            "PHPSESSID",
        ] {
            assert!(is_credential_name(name), "{name}");
        }
        for name in ["X-User-Id", "tenant", "x-user", "page"] {
            assert!(!is_credential_name(name), "{name}");
        }
    }

    #[test]
    fn masked_replaces_the_readable_value() {
        assert_eq!(
            masked(
                "tollgate:{api|header=k_live_42}:per-key",
                b"k_live_42",
                &key::display_hash(b"k_live_42")
            ),
            format!(
                "tollgate:{{api|header={}}}:per-key",
                key::display_hash(b"k_live_42")
            )
        );
        // A value keys hold hashed is in no text as is.
        let long = [b'x'; 100];
        assert_eq!(masked("abc", &long, "sha256:0"), "abc");
    }
}
