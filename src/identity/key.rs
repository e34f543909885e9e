//! Turning client-supplied identity values into fragments that are safe inside a Redis key.
//!
//! Identity values come from headers, cookies, query strings and tokens, so they are
//! attacker-controlled. Put raw into a key they could forge another client's key (by embedding
//! the `|` / `:` separators), break out of a cluster hash tag (`{`, `}`), or bloat memory with
//! huge keys. Short values made only of harmless characters are kept readable so operators can
//! see who is throttled; everything else is replaced by a fixed-size SHA-256 digest. The `=` /
//! `#` prefixes keep the two forms apart, so a readable value can never equal a digest.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Longest value (in bytes) kept readable; longer ones are hashed so keys stay bounded.
pub const MAX_READABLE_LEN: usize = 64;

/// Whether `b` may appear in a readable key fragment. The set excludes every character that
/// has a meaning to the caller's key layout (`{`, `}`, `:`, `|`), to Redis patterns (`*`, `?`,
/// `[`), or to logs (whitespace, control characters).
fn is_safe_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'@' | b'+' | b'-')
}

/// Whether `raw` is kept readable by [`key_part`] (and so may also be shown in logs as is).
pub fn is_readable(raw: &[u8]) -> bool {
    !raw.is_empty() && raw.len() <= MAX_READABLE_LEN && raw.iter().copied().all(is_safe_byte)
}

/// A key fragment for `raw`: `=<value>` when the value is short and safe, otherwise
/// `#<base64url-nopad sha256(raw)>`. At most 65 bytes, never contains `{`, `}`, `:`, `|`
/// or whitespace.
pub fn key_part(raw: &[u8]) -> String {
    let mut out = String::with_capacity(MAX_READABLE_LEN + 1);
    push_key_part(raw, &mut out);
    out
}

/// [`key_part`] appended to `out` (the request path writes it straight into the store key).
pub fn push_key_part(raw: &[u8], out: &mut String) {
    match as_readable(raw) {
        Some(text) => {
            out.push('=');
            out.push_str(text);
        }
        None => push_hashed(&Sha256::digest(raw), out),
    }
}

/// `raw` as text when [`is_readable`] (safe bytes are all ASCII, so it is valid UTF-8).
fn as_readable(raw: &[u8]) -> Option<&str> {
    if is_readable(raw) {
        std::str::from_utf8(raw).ok()
    } else {
        None
    }
}

/// Always the hashed form `#<base64url-nopad sha256(raw)>` (44 bytes): for secrets such as
/// bearer tokens, which must never be stored in a key readably.
pub fn hashed_part(raw: &[u8]) -> String {
    let mut out = String::with_capacity(44);
    push_hashed(&Sha256::digest(raw), &mut out);
    out
}

/// A log-friendly stand-in for a value that must not be shown: `sha256:<first 12 hex digits>`.
pub fn display_hash(raw: &[u8]) -> String {
    shown_digest(&Sha256::digest(raw))
}

/// [`hashed_part`] of `raw` appended to `out`, and, when asked for, [`display_hash`] of it,
/// from one digest.
pub fn push_hashed_forms(raw: &[u8], out: &mut String, shown: Option<&mut String>) {
    let digest = Sha256::digest(raw);
    push_hashed(&digest, out);
    if let Some(shown) = shown {
        *shown = shown_digest(&digest);
    }
}

fn push_hashed(digest: &[u8], out: &mut String) {
    out.push('#');
    URL_SAFE_NO_PAD.encode_string(digest, out);
}

fn shown_digest(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut display = String::with_capacity(19);
    display.push_str("sha256:");
    for b in &digest[..6] {
        display.push(HEX[usize::from(b >> 4)] as char);
        display.push(HEX[usize::from(b & 0xf)] as char);
    }
    display
}

/// How a value is shown in logs and explanations: as is when short and safe, else hashed.
pub fn display_value(raw: &[u8]) -> String {
    match as_readable(raw) {
        Some(text) => text.to_owned(),
        None => display_hash(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn assert_key_safe(part: &str) {
        assert!(part.len() <= 65, "{part} too long");
        assert!(
            part.bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':' | b'|' | b'*')),
            "{part} has an unsafe byte"
        );
    }

    #[test]
    fn safe_values_are_kept_readable() {
        assert_eq!(key_part(b"alice"), "=alice");
        assert_eq!(key_part(b"a.b_c~d@e+f-9"), "=a.b_c~d@e+f-9");
        let max = "x".repeat(64);
        assert_eq!(key_part(max.as_bytes()), format!("={max}"));
    }

    #[test]
    fn unsafe_long_and_empty_values_are_hashed() {
        let too_long = "x".repeat(65);
        for raw in [
            b"{x}".as_slice(),
            b"x}",
            b"{",
            b"a:b",
            b"a*",
            b"a|b",
            b"a b",
            b"a\nb",
            b"\xff\xfe",
            b"",
            too_long.as_bytes(),
        ] {
            let part = key_part(raw);
            assert!(part.starts_with('#'), "{raw:?} gave {part}");
            assert_eq!(part.len(), 44);
            assert_key_safe(&part);
        }
    }

    #[test]
    fn braces_never_survive() {
        for raw in [b"{x}".as_slice(), b"x}", b"{tag}rest", b"}{"] {
            let part = key_part(raw);
            assert!(!part.contains('{') && !part.contains('}'));
        }
    }

    /// Store keys carry these bytes: a change here would start every caller's count afresh
    /// on upgrade.
    #[test]
    fn the_hashed_form_keeps_its_exact_bytes() {
        // base64url(sha256("")), unpadded.
        assert_eq!(
            key_part(b""),
            "#47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        let mut out = String::from("header");
        push_key_part(b"a b", &mut out);
        assert_eq!(out, format!("header{}", hashed_part(b"a b")));
        let mut shown = String::new();
        let mut part = String::new();
        push_hashed_forms(b"", &mut part, Some(&mut shown));
        assert_eq!(
            (part.as_str(), shown.as_str()),
            (key_part(b"").as_str(), "sha256:e3b0c44298fc")
        );
    }

    #[test]
    fn hashed_part_always_hashes() {
        assert_eq!(hashed_part(b"alice").len(), 44);
        assert!(hashed_part(b"alice").starts_with('#'));
        assert_ne!(hashed_part(b"alice"), key_part(b"alice"));
        // Same digest whichever entry point hashed it, so logs and keys agree.
        assert_eq!(hashed_part(b"a b"), key_part(b"a b"));
    }

    #[test]
    fn display_forms() {
        assert_eq!(display_value(b"alice"), "alice");
        let shown = display_value(b"a b");
        assert!(shown.starts_with("sha256:"));
        assert_eq!(shown.len(), "sha256:".len() + 12);
        // sha256("") = e3b0c442 98fc...
        assert_eq!(display_hash(b""), "sha256:e3b0c44298fc");
    }

    proptest! {
        #[test]
        fn distinct_inputs_give_distinct_parts(
            a in proptest::collection::vec(any::<u8>(), 0..100),
            b in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let (pa, pb) = (key_part(&a), key_part(&b));
            assert_key_safe(&pa);
            assert_key_safe(&pb);
            prop_assert_eq!(a == b, pa == pb);
        }

        #[test]
        fn readable_looking_inputs_stay_distinct(
            a in "[A-Za-z0-9._~@+{}:|# -]{0,70}",
            b in "[A-Za-z0-9._~@+{}:|# -]{0,70}",
        ) {
            let (pa, pb) = (key_part(a.as_bytes()), key_part(b.as_bytes()));
            assert_key_safe(&pa);
            assert_key_safe(&pb);
            prop_assert_eq!(a == b, pa == pb);
        }
    }
}
