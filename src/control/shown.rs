//! A caller's value as operators see it on a route, and the caller found again from that form.
//!
//! Each identity says how its values are shown ([`Display`], `display:` in its map form, or
//! the default of each of its sources). A route's rule for a source kind (`header`, `query`,
//! ...) is the strictest of the rules of the identities its limits (its own and its tiers')
//! read that kind through; its rule for a value named by an operator (a heading, the audit
//! trail, the admin log lines) is the strictest of all of them: the value may be any of them.
//! A value keyed by its route's `global` limit shows as `*`.
//!
//! An operator may name a caller by its value or by its short form (`sha256:<12 hex>`, or a
//! `last4` form, which holds that digest). The server cannot turn a digest back into a value,
//! so it looks among the values it knows for the route: the tiers' values, the overrides, the
//! top offenders (the fleet's) and, with Redis, the identities in the route's store keys
//! (`SCAN`, at most [`SCAN_MOST`] keys, duplicates dropped by hash so the work is linear in
//! the keys read, and for at most [`LOOKUP_TIME`]). A value that store keys hold only hashed (a bearer
//! token, a value longer than 64 bytes or with unsafe characters) cannot be found back: its
//! short form is refused with that reason, and the caller is named by its value.

use super::caller::{identity_part, CallerError, Control};
use super::results::DisplayRules;
use crate::config::{LimitSet, Route, Throttle};
use crate::identity::display::{digest_matches, digest_of_short_form, is_digest, Display};
use crate::identity::{self, Source};
use crate::limit::Store;

/// The most store keys a lookup by short form scans.
pub const SCAN_MOST: usize = 100_000;

/// The longest a lookup by short form scans the store: past it the lookup is refused (name
/// the caller by its value). The scan is linear in the keys it reads, so this only bites
/// when the store itself is slow.
pub const LOOKUP_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// How a route shows its callers' values.
#[derive(Debug, Clone, Default)]
pub struct Shown {
    /// Per source kind, the strictest rule of the identities that read it.
    kinds: Vec<(&'static str, Display)>,
}

impl Shown {
    /// `route`'s rules. A route the configuration does not have (an override set before a
    /// reload removed it) shows every value as its digest: nothing says it is not a secret.
    pub fn for_route(throttle: &Throttle, route: &str) -> Shown {
        let mut shown = Shown::default();
        let Some(found) = find_route(throttle, route) else {
            shown.add("unknown route", Display::Digest);
            return shown;
        };
        for set in sets(found) {
            for identity in set.iter().flat_map(|limit| limit.key.iter()) {
                for source in &identity.sources {
                    if matches!(source, Source::Global) {
                        continue;
                    }
                    let rule = identity.display.unwrap_or_else(|| source.default_display());
                    shown.add(source.kind(), rule);
                }
            }
        }
        shown
    }

    fn add(&mut self, kind: &'static str, rule: Display) {
        match self.kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, seen)) => *seen = seen.stricter(rule),
            None => self.kinds.push((kind, rule)),
        }
    }

    /// The rule for a value named by an operator: the strictest of the route's.
    pub fn rule(&self) -> Display {
        self.kinds
            .iter()
            .map(|(_, rule)| *rule)
            .max()
            .unwrap_or(Display::Clear)
    }

    /// The rule for values of source kind `kind` (clear for a kind no identity reads: the
    /// client-IP fallback).
    pub fn kind_rule(&self, kind: &str) -> Display {
        self.kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(Display::Clear, |(_, rule)| *rule)
    }

    /// A value named by an operator, as the route shows it.
    pub fn value(&self, raw: &[u8]) -> String {
        self.rule().show(raw)
    }

    /// The rules as the endpoints' answers show them: the rule for a value named by an
    /// operator, and the rule per source kind.
    pub fn rules(&self) -> DisplayRules {
        DisplayRules {
            rule: self.rule().as_str().to_owned(),
            by_source: self
                .kinds
                .iter()
                .map(|(kind, rule)| (kind.to_string(), rule.as_str().to_owned()))
                .collect(),
        }
    }

    /// What an operator gave (a value or a short form) as the route shows it: a short form
    /// as given, a value by [`Shown::value`]. For log lines about a request refused before
    /// its caller was looked up.
    pub fn given(&self, given: &[u8]) -> String {
        match std::str::from_utf8(given)
            .ok()
            .and_then(digest_of_short_form)
        {
            Some(digest) => digest.to_owned(),
            None => self.value(given),
        }
    }

    /// One identity part of a store key (`header=alice`, `bearer#<digest>`, `*`) as the
    /// route shows it: (source kind, value).
    pub fn part<'p>(&self, part: &'p str) -> (&'p str, String) {
        let (kind, keyed) = identity::shown_from_key_part(part);
        if kind == "global" {
            return (kind, keyed);
        }
        (kind, self.kind_rule(kind).show_keyed(&keyed))
    }

    /// The identity part of a store key (several parts joined by `|`) as the route shows it:
    /// (source kinds joined by `+`, values joined by `|`).
    pub fn item(&self, item: &str) -> (String, String) {
        let (kinds, values): (Vec<&str>, Vec<String>) =
            item.split('|').map(|part| self.part(part)).unzip();
        (kinds.join("+"), values.join("|"))
    }

    /// A store key of `set` with each value in its identity part as the route shows it
    /// (`tollgate:{api}:per-key:header=sha256:4cdc1a4207f4`): what the endpoints print, never
    /// a value the rules hide.
    pub fn key(&self, set: &LimitSet, key: &str) -> String {
        let part = identity_part(set, key);
        // `identity_part` returns a slice of `key`.
        let start = part.as_ptr() as usize - key.as_ptr() as usize;
        let shown: Vec<String> = part
            .split('|')
            .map(|p| {
                let (kind, value) = self.part(p);
                if kind == "global" || p.contains('#') || p.get(kind.len() + 1..) == Some(&value) {
                    p.to_owned()
                } else {
                    format!("{kind}={value}")
                }
            })
            .collect();
        format!(
            "{}{}{}",
            &key[..start],
            shown.join("|"),
            &key[start + part.len()..]
        )
    }
}

fn find_route<'t>(throttle: &'t Throttle, route: &str) -> Option<&'t Route> {
    throttle
        .routes
        .iter()
        .find(|r| r.name == route)
        .map(|r| &**r)
}

/// A route's own limits and its tiers'.
fn sets(route: &Route) -> impl Iterator<Item = &LimitSet> {
    std::iter::once(&route.limits).chain(route.tiers.iter().map(|t| &t.limits))
}

/// The values the readable identity parts of `item` hold (`header=alice|client_ip=10.0.0.1`
/// gives `alice` and `10.0.0.1`); hashed parts give the digest form they show.
fn values_of(item: &str) -> impl Iterator<Item = String> + '_ {
    item.split('|')
        .map(|part| identity::shown_from_key_part(part).1)
}

impl Control {
    /// How `route` shows its callers' values.
    pub fn shown(&self, route: &str) -> Shown {
        Shown::for_route(&self.throttle, route)
    }

    /// The caller an operator names on `route`: `given` itself when it is a value, the value
    /// whose short form it is otherwise (see the module docs).
    pub async fn resolve(&self, route: &str, given: &[u8]) -> Result<Vec<u8>, CallerError> {
        let Some(digest) = std::str::from_utf8(given)
            .ok()
            .and_then(digest_of_short_form)
        else {
            return Ok(given.to_vec());
        };
        let Some(found) = find_route(&self.throttle, route) else {
            // The usual answer for an unknown route.
            self.targets(route, given)?;
            return Ok(given.to_vec());
        };
        let mut known: Vec<String> = Vec::new();
        for tier in &found.tiers {
            known.extend(tier.values.iter().cloned());
        }
        for record in self.overrides_in_force().await? {
            if record.route == route {
                known.push(record.identity);
            }
        }
        if let Some(sketch) = self.offenders() {
            let top = sketch
                .top_of(super::offenders::CAPACITY, super::offenders::View::Fleet)
                .await;
            for (_, offenders) in top.routes.iter().filter(|(r, _)| r == route) {
                for o in offenders {
                    known.extend(values_of(&o.item));
                }
            }
        }
        if let Some(matched) = known
            .iter()
            .find(|v| !is_digest(v) && digest_matches(v.as_bytes(), digest))
        {
            return Ok(matched.as_bytes().to_vec());
        }
        let mut hashed_only = known.iter().any(|v| v == digest);
        let scanning = async {
            for set in sets(found) {
                for item in self.scan_identities(set).await? {
                    for value in values_of(&item) {
                        if is_digest(&value) {
                            hashed_only |= value == digest;
                        } else if digest_matches(value.as_bytes(), digest) {
                            return Ok(Some(value.into_bytes()));
                        }
                    }
                }
            }
            Ok::<_, CallerError>(None)
        };
        let scanned = tokio::time::timeout(LOOKUP_TIME, scanning).await;
        let (route, form) = (
            route.to_owned(),
            String::from_utf8_lossy(given).into_owned(),
        );
        match scanned {
            Ok(Ok(Some(found))) => return Ok(found),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(CallerError::LookupTimedOut {
                    route,
                    form,
                    within: LOOKUP_TIME,
                })
            }
        }
        Err(match hashed_only {
            true => CallerError::HashedShortForm { route, form },
            false => CallerError::UnknownShortForm { route, form },
        })
    }

    /// The identity parts of `set`'s store keys in Redis (none with a memory store), from at
    /// most [`SCAN_MOST`] keys.
    async fn scan_identities(&self, set: &LimitSet) -> Result<Vec<String>, CallerError> {
        let Some(cell) = &self.redis else {
            return Ok(Vec::new());
        };
        let Some(Store::Redis(redis)) = cell.get() else {
            return Err(CallerError::NotConnected);
        };
        let head = format!("{}{{{}", self.throttle.key_prefix, set.key_name);
        let pattern = format!("{}*", glob_escape(&head));
        let (mut cursor, mut scanned) = (0u64, 0usize);
        let mut items = Vec::new();
        // A caller has one key per limit and window: duplicates are many, so they are found
        // by hash, keeping the pass linear in the keys scanned.
        let mut seen = std::collections::HashSet::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis
                .command(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            scanned += 1000;
            for key in keys {
                // Another route whose name starts with this one's, or this route's keys
                // under an override or a tier: the brace must close right after the name
                // (or its `|`, `~` suffix).
                let rest = &key[head.len()..];
                if !(rest.starts_with('}') || rest.starts_with('|') || rest.starts_with('~')) {
                    continue;
                }
                if key.ends_with(crate::limit::BLOCK_SUFFIX) {
                    continue;
                }
                let item = generic_identity_part(&key);
                if !item.is_empty() && !seen.contains(item) {
                    seen.insert(item.to_owned());
                    items.push(item.to_owned());
                }
            }
            cursor = next;
            if cursor == 0 || scanned >= SCAN_MOST {
                return Ok(items);
            }
        }
    }
}

/// The identity part of a store key whichever set wrote it: inside the braces after `|` (a
/// set whose limits share the caller's key), else after the last `:`.
fn generic_identity_part(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return "";
    };
    let Some(close) = key[open..].find('}').map(|c| open + c) else {
        return "";
    };
    match key[open..close].find('|') {
        Some(bar) => &key[open + bar + 1..close],
        None => key.rsplit(':').next().unwrap_or_default(),
    }
}

/// `text` with Redis glob characters escaped, for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::identity::key;

    #[test]
    fn items_keep_hashes_hashed_and_follow_each_kind_s_rule() {
        let clear = Shown::default();
        assert_eq!(
            clear.item("header=alice"),
            ("header".into(), "alice".into())
        );
        let bearer = format!("bearer{}", key::hashed_part(b"tok"));
        assert_eq!(
            clear.item(&bearer),
            ("bearer".into(), key::display_hash(b"tok"))
        );
        assert_eq!(
            clear.item("header=a|client_ip=10.0.0.1"),
            ("header+client_ip".into(), "a|10.0.0.1".into())
        );
        assert_eq!(clear.item("*"), ("global".into(), "*".into()));
        let mut shown = Shown::default();
        shown.add("header", Display::Clear);
        shown.add("header", Display::Digest);
        shown.add("client_ip", Display::Clear);
        assert_eq!(shown.rule(), Display::Digest);
        // The same short form from the key as from the value.
        assert_eq!(
            shown.item("header=initech|client_ip=10.0.0.1"),
            (
                "header+client_ip".into(),
                "sha256:4cdc1a4207f4|10.0.0.1".into()
            )
        );
        assert_eq!(shown.value(b"initech"), "sha256:4cdc1a4207f4");
        assert_eq!(shown.given(b"sha256:4cdc1a4207f4"), "sha256:4cdc1a4207f4");
    }

    #[test]
    fn identity_parts_of_either_key_shape() {
        assert_eq!(
            generic_identity_part("tg:{api|header=a|client_ip=1.2.3.4}:minute"),
            "header=a|client_ip=1.2.3.4"
        );
        assert_eq!(
            generic_identity_part("tg:{api}:minute:header=a"),
            "header=a"
        );
        assert_eq!(
            generic_identity_part("tg:{api}:minute~!override:header=a"),
            "header=a"
        );
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
