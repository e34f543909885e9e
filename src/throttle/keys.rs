//! Store keys: `<prefix>{<hash tag>}:<policy>[:<identity>]`.
//!
//! Every identity value has already been made key-safe by `identity::key` (no `{`, `}`, `:`,
//! `|` or whitespace; long values hashed), so a client cannot collide with another client's
//! key or move a key to another Redis Cluster slot. The hash tag holds the route and, when all
//! the route's limits share one key, the identity too: then all keys of a decision share a slot
//! and different callers spread over the cluster. Otherwise (a limit with its own key, e.g.
//! `global`) the tag is the route alone, so the one-script decision still sees one slot.

use std::sync::Arc;

use crate::config::LimitSet;
use crate::identity::caller::Caller;
use crate::identity::Identity;

/// One key per limit of `set`, in order, and the kind of source that identified the caller
/// for the first limit (for the access log: never the value itself). Identities come from the
/// caller's memo, so one already evaluated (for an allow-list or a tier) is not evaluated again.
///
/// This runs for every limited request, so each key is written once into a string of the
/// right size (no intermediate parts, joins or format machinery).
pub fn build(prefix: &str, set: &LimitSet, caller: &mut Caller<'_>) -> (Vec<String>, &'static str) {
    let mut first_kind = None;
    let mut keys = Vec::with_capacity(set.len());
    if set.shared_key {
        // The first key's identity is written in place; the others copy it from there (no
        // string of the identity alone).
        if let Some(first) = set.first() {
            let (key, identity) = shared_key_with(prefix, &set.key_name, &first.name, |key| {
                write_identities(caller, &first.key, key, &mut first_kind)
            });
            keys.push(key);
            for l in set.iter().skip(1) {
                let key = shared_key(prefix, &set.key_name, &keys[0][identity.clone()], &l.name);
                keys.push(key);
            }
        }
    } else {
        for l in set.iter() {
            let mut key = own_key_head(prefix, &set.key_name, &l.name);
            write_identities(caller, &l.key, &mut key, &mut first_kind);
            keys.push(key);
        }
    }
    (keys, first_kind.unwrap_or("none"))
}

/// Appends the key parts of `identities`, joined by `|`; `first_kind` keeps the source kind of
/// the first one written.
fn write_identities(
    caller: &mut Caller<'_>,
    identities: &[Arc<Identity>],
    out: &mut String,
    first_kind: &mut Option<&'static str>,
) {
    for (i, identity) in identities.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        let identified = caller.identified(identity);
        first_kind.get_or_insert(identified.source_kind);
        out.push_str(&identified.key_part);
    }
}

/// The key of limit `limit` when all of a set's limits share the caller's identity:
/// `<prefix>{<key_name>|<identity>}:<limit>`.
fn shared_key(prefix: &str, key_name: &str, identity: &str, limit: &str) -> String {
    shared_key_with(prefix, key_name, limit, |key| key.push_str(identity)).0
}

/// [`shared_key`] with the identity written by `identity`; also where it stands in the key.
fn shared_key_with(
    prefix: &str,
    key_name: &str,
    limit: &str,
    identity: impl FnOnce(&mut String),
) -> (String, std::ops::Range<usize>) {
    let mut key = String::with_capacity(prefix.len() + key_name.len() + limit.len() + 80);
    key.push_str(prefix);
    key.push('{');
    key.push_str(key_name);
    key.push('|');
    let start = key.len();
    identity(&mut key);
    let end = key.len();
    key.push_str("}:");
    key.push_str(limit);
    (key, start..end)
}

/// `<prefix>{<key_name>}:<limit>:`, the identity to be appended (room reserved for it).
fn own_key_head(prefix: &str, key_name: &str, limit: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + key_name.len() + limit.len() + 72);
    key.push_str(prefix);
    key.push('{');
    key.push_str(key_name);
    key.push_str("}:");
    key.push_str(limit);
    key.push(':');
    key
}

/// The store keys a caller presenting the raw identity value `raw` has under `set` (a route's
/// own limits or a tier's), per limit in order: one candidate per way the caller may have been
/// identified (see [`Identity::key_parts_for_value`]; usually one). Byte for byte the keys
/// [`build`] writes for a request that carries that value, built from the value instead of a
/// request (for the admin endpoints and `tollgate limits`). A key made of several identities
/// takes the value for each of them.
pub fn for_value(prefix: &str, set: &LimitSet, raw: &[u8]) -> Vec<Vec<String>> {
    let parts_of = |identities: &[Arc<Identity>]| -> Vec<String> {
        let mut joined = vec![String::new()];
        for (i, identity) in identities.iter().enumerate() {
            let parts = identity.key_parts_for_value(raw);
            joined = joined
                .iter()
                .flat_map(|head| {
                    parts.iter().map(move |part| {
                        let mut out = head.clone();
                        if i > 0 {
                            out.push('|');
                        }
                        out.push_str(part);
                        out
                    })
                })
                .collect();
        }
        joined
    };
    if set.shared_key {
        let identities = set.first().map(|l| parts_of(&l.key)).unwrap_or_default();
        set.iter()
            .map(|l| {
                identities
                    .iter()
                    .map(|identity| shared_key(prefix, &set.key_name, identity, &l.name))
                    .collect()
            })
            .collect()
    } else {
        set.iter()
            .map(|l| {
                parts_of(&l.key)
                    .iter()
                    .map(|identity| {
                        let mut key = own_key_head(prefix, &set.key_name, &l.name);
                        key.push_str(identity);
                        key
                    })
                    .collect()
            })
            .collect()
    }
}

/// The identity part of `key`, the first key [`build`] wrote for `set` (`header=alice`,
/// `bearer#<digest>`, `*`, or several joined by `|`): what the top-offenders sketch counts.
pub fn identity_of<'k>(prefix: &str, set: &LimitSet, key: &'k str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let rest = rest.strip_prefix(set.key_name.as_str())?;
    // A caller under a temporary override counts on keys of its own (see `overrides`).
    let rest = rest
        .strip_prefix(super::overrides::OVERRIDE_SUFFIX)
        .unwrap_or(rest);
    if set.shared_key {
        let rest = rest.strip_prefix('|')?;
        // A byte scan: `str::find` with a two-byte pattern builds a searcher per call, a
        // visible cost on every admitted request (`crate::suggest` calls this for each).
        let end = rest.as_bytes().windows(2).position(|pair| pair == b"}:")?;
        Some(&rest[..end])
    } else {
        let first = set.first()?;
        let rest = rest.strip_prefix("}:")?.strip_prefix(first.name.as_str())?;
        rest.strip_prefix(super::overrides::OVERRIDE_SUFFIX)
            .unwrap_or(rest)
            .strip_prefix(':')
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::path::Path;

    use http::request::Parts;

    use super::*;

    fn build(
        prefix: &str,
        set: &LimitSet,
        request: &Parts,
        ip: IpAddr,
    ) -> (Vec<String>, &'static str) {
        super::build(prefix, set, &mut Caller::new(request, ip))
    }

    /// Store keys are what shared state is found by: their text must never change between
    /// versions (a changed key silently resets every caller's count). A tier keys under
    /// `route~tier`, apart from the route's default limits and from every other route.
    #[test]
    fn route_and_tier_keys_keep_their_exact_text() {
        let config = crate::config::parse(
            Path::new("t.yaml"),
            "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n\
identities:\n  user:\n    - header: x-user\n\
routes:\n  - name: api\n    key: user\n    overrides:\n      - { name: partner, values: [p], limits: [ { algorithm: fixed_window, limit: 5, period: 1m } ] }\n    limits:\n      - { algorithm: fixed_window, limit: 2, period: 1m }\n      - { algorithm: fixed_window, limit: 9, period: 1h, key: global, name: all }\n",
            |_| None,
        )
        .unwrap();
        let route = &config.throttle.routes[0];
        let request = http::Request::get("/api/x")
            .header("x-user", "alice")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let ip = IpAddr::from([192, 0, 2, 1]);
        let (keys, kind) = build("tollgate:", &route.limits, &request, ip);
        assert_eq!(
            keys,
            [
                "tollgate:{api}:api-fixed_window-1:header=alice",
                "tollgate:{api}:all:*"
            ]
        );
        assert_eq!(kind, "header");
        let (keys, _) = build("tollgate:", &route.tiers[0].limits, &request, ip);
        assert_eq!(keys, ["tollgate:{api~partner|header=alice}:partner"]);
    }

    fn routes(yaml: &str) -> Vec<Arc<crate::config::Route>> {
        let text = format!("listen: 127.0.0.1:0\nupstream: {{ url: \"http://a:1\" }}\n{yaml}");
        crate::config::parse(Path::new("t.yaml"), &text, |_| None)
            .unwrap()
            .throttle
            .routes
    }

    fn request(headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::get("/api/x");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    /// The keys built from a value are the very bytes a request with that value gets.
    #[test]
    fn keys_from_a_value_are_the_keys_of_a_request() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let yaml = concat!(
            "identities:\n  user: [ { header: X-User } ]\n  tok: [ { bearer: {} } ]\n",
            "routes:\n  - name: shared\n    key: user\n    limits:\n",
            "      - { algorithm: fixed_window, limit: 5, period: 1m }\n",
            "      - { algorithm: gcra, limit: 9, period: 1m, name: g }\n",
            "  - name: own\n    key: tok\n    limits:\n",
            "      - { algorithm: token_bucket, limit: 5, period: 1m }\n",
            "      - { algorithm: fixed_window, limit: 100, period: 1m, key: global }\n",
        );
        let routes = routes(yaml);
        let shared = &routes[0].limits;
        assert!(shared.shared_key);
        let (keys, _) = build("tg:", shared, &request(&[("x-user", "alice b")]), ip);
        let from_value = for_value("tg:", shared, b"alice b");
        assert_eq!(
            from_value,
            keys.iter().map(|k| vec![k.clone()]).collect::<Vec<_>>()
        );
        assert_eq!(
            identity_of("tg:", shared, &keys[0]),
            Some(crate::identity::key::key_part(b"alice b").as_str())
                .map(|p| format!("header{p}"))
                .as_deref()
        );
        let own = &routes[1].limits;
        assert!(!own.shared_key);
        let (keys, _) = build(
            "tg:",
            own,
            &request(&[("authorization", "Bearer s3cret")]),
            ip,
        );
        let from_value = for_value("tg:", own, b"s3cret");
        assert_eq!(from_value[0], vec![keys[0].clone()]);
        assert_eq!(from_value[1], vec![keys[1].clone()]);
        assert!(identity_of("tg:", own, &keys[0])
            .unwrap()
            .starts_with("bearer#"));
        // A caller under a temporary override is named the same on its own keys.
        for (set, key) in [(shared, &keys_shared_alice(shared, ip)), (own, &keys[0])] {
            let overridden = super::super::overrides::override_key("tg:", &set.key_name, key);
            assert_ne!(&overridden, key);
            assert_eq!(
                identity_of("tg:", set, &overridden),
                identity_of("tg:", set, key)
            );
        }
        fn keys_shared_alice(shared: &LimitSet, ip: IpAddr) -> String {
            build("tg:", shared, &request(&[("x-user", "alice b")]), ip)
                .0
                .remove(0)
        }
        // An address names the client-IP fallback's key too.
        let (keys, _) = build("tg:", shared, &request(&[]), ip);
        assert!(for_value("tg:", shared, b"10.1.2.3")[0].contains(&keys[0]));
    }
}
