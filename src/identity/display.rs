//! How a caller's value is shown to people: in the admin API (`/limits/top`, `/limits/state`,
//! `/limits/overrides`), `tollgate limits`, the audit trail, the admin log lines and the
//! console. One rule per identity (`display: clear | digest | last4` in its map form), one
//! short form per value, the same in every place, so an operator can copy it from one view and
//! find the caller with it in another.
//!
//! The forms, for a raw value `v` (`sha256:<12 hex>` is the first 6 bytes of SHA-256 of `v`,
//! the digest store keys hold for values they hash, so a form read back from a key is the
//! form of the value):
//! - `clear`: `v` itself when it is short and safe ([`key::is_readable`]), its digest
//!   otherwise (store keys hash such values too, so the key could not show more).
//! - `digest`: `sha256:<12 hex>`, always.
//! - `last4`: `…<last 4 characters> (sha256:<12 hex>)` for a readable value of at least
//!   [`LAST4_MIN_LEN`] characters: the last four let a person recognise the value, the digest
//!   tells apart two values that end alike. A shorter or unreadable value shows as its digest
//!   (four characters of an eight-character value would give away half of it).
//!
//! Defaults, by source (`Source::default_display`): credentials (bearer tokens, and headers, query parameters and cookies
//! whose name says they hold one, [`is_credential_name`]) `digest`; everything else (client
//! IPs, path segments, JWT claims, other headers and parameters) `clear`.

use super::key;

/// Shortest readable value `last4` shows the end of; shorter ones show as their digest.
pub const LAST4_MIN_LEN: usize = 8;

/// How an identity's values are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Display {
    /// As they are (when short and safe).
    Clear,
    /// The last four characters and the digest.
    Last4,
    /// The digest only.
    Digest,
}

impl Display {
    /// What the configuration may say, for error messages.
    pub const ALLOWED: &'static str = "`clear`, `digest` or `last4`";

    pub fn parse(text: &str) -> Option<Display> {
        match text {
            "clear" => Some(Display::Clear),
            "digest" => Some(Display::Digest),
            "last4" => Some(Display::Last4),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Display::Clear => "clear",
            Display::Digest => "digest",
            Display::Last4 => "last4",
        }
    }

    /// The stricter of two rules (`digest` over `last4` over `clear`): what a value is shown
    /// as where either may apply.
    pub fn stricter(self, other: Display) -> Display {
        self.max(other)
    }

    /// `raw` as this rule shows it.
    pub fn show(self, raw: &[u8]) -> String {
        match self {
            Display::Clear => key::display_value(raw),
            Display::Digest => key::display_hash(raw),
            Display::Last4 => match last4(raw) {
                Some(end) => format!("…{end} ({})", key::display_hash(raw)),
                None => key::display_hash(raw),
            },
        }
    }

    /// A value already shown by a store key (`shown_from_key_part`: the value when the key
    /// kept it readable, its digest otherwise) as this rule shows it.
    pub fn show_keyed(self, keyed: &str) -> String {
        if is_digest(keyed) {
            return keyed.to_owned();
        }
        self.show(keyed.as_bytes())
    }
}

/// The last four characters of `raw` when `last4` may show them.
fn last4(raw: &[u8]) -> Option<&str> {
    if !key::is_readable(raw) || raw.len() < LAST4_MIN_LEN {
        return None;
    }
    // Readable values are ASCII.
    std::str::from_utf8(&raw[raw.len() - 4..]).ok()
}

/// Whether `text` is a digest form, `sha256:<12 lowercase hex>`.
pub fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 12 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The digest a short form names: `sha256:<12 hex>` itself, or the one inside a `last4` form
/// (`…f00d (sha256:<12 hex>)`); None when `text` is no short form (then it is a value).
pub fn digest_of_short_form(text: &str) -> Option<&str> {
    let text = text.trim();
    if is_digest(text) {
        return Some(text);
    }
    let rest = text.strip_prefix('…')?;
    let (end, digest) = rest.split_once(" (")?;
    let digest = digest.strip_suffix(')')?;
    (end.chars().count() == 4 && is_digest(digest)).then_some(digest)
}

/// Whether `raw`'s digest is `digest` (`sha256:<12 hex>`).
pub fn digest_matches(raw: &[u8], digest: &str) -> bool {
    key::display_hash(raw) == digest
}

/// Whether a header, query parameter or cookie name says its value is a credential.
pub fn is_credential_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "key", "token", "secret", "auth", "session", "pass", "cred", "sign", "sid", "jwt",
    ]
    .iter()
    .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(Display::Clear.show(b"initech"), "initech");
        // sha256("initech") starts 4cdc1a4207f4.
        assert_eq!(Display::Digest.show(b"initech"), "sha256:4cdc1a4207f4");
        assert_eq!(Display::Last4.show(b"initech"), "sha256:4cdc1a4207f4");
        let long = b"k_live_0123456789f00d";
        let digest = key::display_hash(long);
        assert_eq!(Display::Last4.show(long), format!("…f00d ({digest})"));
        assert_eq!(Display::Clear.show(b"a b"), key::display_hash(b"a b"));
        assert_eq!(
            Display::Last4.show(b"a b c d e f"),
            key::display_hash(b"a b c d e f")
        );
        // A form read back from a store key is the value's form.
        assert_eq!(Display::Digest.show_keyed("initech"), "sha256:4cdc1a4207f4");
        assert_eq!(
            Display::Clear.show_keyed("sha256:4cdc1a4207f4"),
            "sha256:4cdc1a4207f4"
        );
    }

    #[test]
    fn short_forms_name_their_digest() {
        let long = b"k_live_0123456789f00d";
        for display in [Display::Digest, Display::Last4] {
            let shown = display.show(long);
            let digest = digest_of_short_form(&shown).unwrap();
            assert!(digest_matches(long, digest), "{shown}");
            assert!(!digest_matches(b"other", digest));
        }
        for value in [
            "initech",
            "sha256:4cdc1a4207f",
            "sha256:4CDC1A4207F4",
            "…f00d",
        ] {
            assert_eq!(digest_of_short_form(value), None, "{value}");
        }
    }

    #[test]
    fn parse_and_order() {
        for display in [Display::Clear, Display::Digest, Display::Last4] {
            assert_eq!(Display::parse(display.as_str()), Some(display));
        }
        assert_eq!(Display::parse("hash"), None);
        assert_eq!(Display::Clear.stricter(Display::Digest), Display::Digest);
        assert_eq!(Display::Last4.stricter(Display::Clear), Display::Last4);
    }
}
