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
    if is_readable(raw) {
        let mut out = String::with_capacity(raw.len() + 1);
        out.push('=');
        // Safe bytes are all ASCII, so this conversion is lossless.
        out.extend(raw.iter().map(|&b| b as char));
        out
    } else {
        hashed_part(raw)
    }
}

/// Always the hashed form `#<base64url-nopad sha256(raw)>` (44 bytes): for secrets such as
/// bearer tokens, which must never be stored in a key readably.
pub fn hashed_part(raw: &[u8]) -> String {
    hashed_forms(raw).0
}

/// A log-friendly stand-in for a value that must not be shown: `sha256:<first 12 hex digits>`.
pub fn display_hash(raw: &[u8]) -> String {
    hashed_forms(raw).1
}

/// [`hashed_part`] and [`display_hash`] of `raw` from one digest (a bearer token needs both on
/// every request).
pub fn hashed_forms(raw: &[u8]) -> (String, String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(raw);
    let mut part = String::with_capacity(44);
    part.push('#');
    URL_SAFE_NO_PAD.encode_string(digest, &mut part);
    let mut display = String::with_capacity(19);
    display.push_str("sha256:");
    for b in &digest[..6] {
        display.push(HEX[usize::from(b >> 4)] as char);
        display.push(HEX[usize::from(b & 0xf)] as char);
    }
    (part, display)
}

/// How a value is shown in logs and explanations: as is when short and safe, else hashed.
pub fn display_value(raw: &[u8]) -> String {
    if is_readable(raw) {
        raw.iter().map(|&b| b as char).collect()
    } else {
        display_hash(raw)
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
