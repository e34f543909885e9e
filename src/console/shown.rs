//! What the console may show of a caller's identity.
//!
//! Store keys keep a short, safe value readable (`header=alice`) so that operators can see who
//! is limited; bearer tokens and anything long or unusual are digests already. A header,
//! query parameter or cookie can still carry a credential that happens to be short and safe
//! (`X-Api-Key: k_live_42`), and the console is a page a browser keeps, screenshots capture
//! and colleagues look over: there, a value from a source whose name says it holds a
//! credential ([`is_credential_name`]) is shown as its digest (`sha256:<12 hex>`, the digest
//! `tollgate explain` and the logs print for it), on every route whose limits read such a
//! source for that kind. Bearer tokens and JWTs are never shown: the token is hashed in keys,
//! a JWT's claim is shown, never the token.

use crate::config::{LimitSet, Route};
use crate::identity::{key, Source};

pub use crate::identity::display::is_credential_name;

/// Whether `source` reads a value that must not be shown as is.
pub fn is_secret_source(source: &Source) -> bool {
    match source {
        Source::Header(name) => is_credential_name(name.as_str()),
        Source::Query(name) | Source::Cookie(name) => is_credential_name(name),
        Source::Bearer => true,
        Source::Jwt(_) | Source::PathSegment(_) | Source::ClientIp | Source::Global => false,
    }
}

/// The source kinds (`header`, `query`...) that hold a credential somewhere in `route`'s limits
/// (its own and its tiers').
pub fn secret_kinds(route: &Route) -> Vec<&'static str> {
    let sets = std::iter::once(&route.limits).chain(route.overrides.iter().map(|t| &t.limits));
    let mut kinds: Vec<&'static str> = vec!["bearer"];
    for set in sets {
        for source in sources(set) {
            if is_secret_source(source) && !kinds.contains(&source.kind()) {
                kinds.push(source.kind());
            }
        }
    }
    kinds
}

fn sources(set: &LimitSet) -> impl Iterator<Item = &Source> {
    set.iter()
        .flat_map(|limit| limit.key.iter())
        .flat_map(|identity| identity.sources.iter())
}

/// An identity part of a store key (`header=alice`, several joined by `|`) as the console
/// shows it: (source kinds, values), a value of a `secret` kind as its digest.
pub fn item(item: &str, secret: &[&str]) -> (String, String) {
    let (kinds, values): (Vec<String>, Vec<String>) = item
        .split('|')
        .map(|part| {
            let (kind, value) = crate::identity::shown_from_key_part(part);
            let value = if secret.contains(&kind) && !value.starts_with("sha256:") {
                key::display_hash(value.as_bytes())
            } else {
                value
            };
            (kind.to_owned(), value)
        })
        .unzip();
    (kinds.join("+"), values.join("|"))
}

/// `text` (a store key, an explanation's value) with every readable form of `raw` replaced by
/// its digest, when `raw` must not be shown.
pub fn masked(text: &str, raw: &[u8]) -> String {
    if !key::is_readable(raw) {
        return text.to_owned();
    }
    let readable = String::from_utf8_lossy(raw);
    text.replace(readable.as_ref(), &key::display_hash(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names() {
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
    fn secret_kinds_are_digests_others_as_stored() {
        assert_eq!(
            item("header=k_live_42", &["header"]),
            ("header".into(), key::display_hash(b"k_live_42"))
        );
        assert_eq!(
            item("header=alice", &["query"]),
            ("header".into(), "alice".into())
        );
        assert_eq!(
            item("header=a|client_ip=10.0.0.1", &["header"]),
            (
                "header+client_ip".into(),
                format!("{}|10.0.0.1", key::display_hash(b"a"))
            )
        );
        let hashed = format!("bearer{}", key::hashed_part(b"tok"));
        assert_eq!(item(&hashed, &["bearer"]).1, key::display_hash(b"tok"));
        assert_eq!(
            masked("tollgate:{api|header=k_live_42}:per-key", b"k_live_42"),
            format!(
                "tollgate:{{api|header={}}}:per-key",
                key::display_hash(b"k_live_42")
            )
        );
    }
}
