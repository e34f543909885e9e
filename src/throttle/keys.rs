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
pub fn build(
    prefix: &str,
    route: &Route,
    request: &Parts,
    client_ip: IpAddr,
) -> (Vec<String>, &'static str) {
    // Identify each distinct identity once per request (JWT verification is not free).
    let mut seen: Vec<(*const Identity, String)> = Vec::new();
    let mut first_kind: Option<&'static str> = None;
    let mut identify = |identities: &[Arc<Identity>]| -> String {
        let mut parts = Vec::with_capacity(identities.len());
        for identity in identities {
            let ptr = Arc::as_ptr(identity);
            let part = match seen.iter().find(|(p, _)| *p == ptr) {
                Some((_, part)) => part.clone(),
                None => {
                    let identified = identity.identify(request, client_ip);
                    first_kind.get_or_insert(identified.source_kind);
                    seen.push((ptr, identified.key_part.clone()));
                    identified.key_part
                }
            };
            parts.push(part);
        }
        parts.join("|")
    };
    let keys = if route.shared_key {
        let identity = route
            .limits
            .first()
            .map(|l| identify(&l.key))
            .unwrap_or_default();
        route
            .limits
            .iter()
            .map(|l| format!("{prefix}{{{}|{identity}}}:{}", route.name, l.name))
            .collect()
    } else {
        route
            .limits
            .iter()
            .map(|l| format!("{prefix}{{{}}}:{}:{}", route.name, l.name, identify(&l.key)))
            .collect()
    };
    (keys, first_kind.unwrap_or("none"))
}
