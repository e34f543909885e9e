//! Store keys: `<prefix>{<hash tag>}:<policy>[:<identity>]`.
//!
//! Every identity value has already been made key-safe by `identity::key` (no `{`, `}`, `:`,
//! `|` or whitespace; long values hashed), so a client cannot collide with another client's
//! key or move a key to another Redis Cluster slot. The hash tag holds the route and, when all
//! the route's limits share one key, the identity too: then all keys of a decision share a slot
//! and different callers spread over the cluster. Otherwise (a limit with its own key, e.g.
//! `global`) the tag is the route alone, so the one-script decision still sees one slot.

use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;

use crate::config::Route;
use crate::identity::Identity;

/// One key per limit of `route`, in order, and the kind of source that identified the caller
/// for the first limit (for the access log: never the value itself).
///
/// This runs for every limited request, so each key is written once into a string of the
/// right size (no intermediate parts, joins or format machinery).
pub fn build(
    prefix: &str,
    route: &Route,
    request: &Parts,
    client_ip: IpAddr,
) -> (Vec<String>, &'static str) {
    let mut identities = Identities {
        // Identify each distinct identity once per request (JWT verification is not free);
        // only worth remembering when more than one list of identities is written.
        memo: !route.shared_key && route.limits.len() > 1,
        seen: Vec::new(),
        first_kind: None,
        request,
        client_ip,
    };
    let mut keys = Vec::with_capacity(route.limits.len());
    if route.shared_key {
        let mut identity = String::new();
        if let Some(first) = route.limits.first() {
            identities.write(&first.key, &mut identity);
        }
        for l in &route.limits {
            let mut key = String::with_capacity(
                prefix.len() + route.name.len() + identity.len() + l.name.len() + 4,
            );
            key.push_str(prefix);
            key.push('{');
            key.push_str(&route.name);
            key.push('|');
            key.push_str(&identity);
            key.push_str("}:");
            key.push_str(&l.name);
            keys.push(key);
        }
    } else {
        for l in &route.limits {
            let mut key =
                String::with_capacity(prefix.len() + route.name.len() + l.name.len() + 72);
            key.push_str(prefix);
            key.push('{');
            key.push_str(&route.name);
            key.push_str("}:");
            key.push_str(&l.name);
            key.push(':');
            identities.write(&l.key, &mut key);
            keys.push(key);
        }
    }
    (keys, identities.first_kind.unwrap_or("none"))
}

struct Identities<'a> {
    memo: bool,
    seen: Vec<(*const Identity, String)>,
    first_kind: Option<&'static str>,
    request: &'a Parts,
    client_ip: IpAddr,
}

impl Identities<'_> {
    /// Appends the key parts of `identities`, joined by `|`.
    fn write(&mut self, identities: &[Arc<Identity>], out: &mut String) {
        for (i, identity) in identities.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            let ptr = Arc::as_ptr(identity);
            if let Some((_, part)) = self.seen.iter().find(|(p, _)| *p == ptr) {
                out.push_str(part);
                continue;
            }
            let identified = identity.identify(self.request, self.client_ip);
            self.first_kind.get_or_insert(identified.source_kind);
            out.push_str(&identified.key_part);
            if self.memo || identities.len() > 1 {
                self.seen.push((ptr, identified.key_part));
            }
        }
    }
}
