//! Allow-lists and tiers: before a route's limits apply, callers on an allow-list (global or
//! the route's; by client CIDR or identity value) pass unlimited, and callers named by an
//! override get that tier's limits instead of the default ones (for example a partner key with
//! ten times the quota), without a route of their own.

use std::net::IpAddr;

use http::request::Parts;

use crate::config::{Allow, LimitSet, Route};

/// Which limits apply to a caller on a route.
pub enum Selection<'a> {
    /// On an allow-list: forwarded without any limit.
    Exempt,
    /// The limits to apply: the route's own, or a tier's.
    Limits(&'a LimitSet),
}

pub fn select<'a>(
    global: &Allow,
    route: &'a Route,
    request: &Parts,
    client_ip: IpAddr,
) -> Selection<'a> {
    if allowed(global, request, client_ip) || allowed(&route.allow, request, client_ip) {
        return Selection::Exempt;
    }
    for tier in &route.overrides {
        let identified = tier.identity.identify(request, client_ip);
        if tier
            .values
            .iter()
            .any(|v| identified.is_value(v.as_bytes()))
        {
            return Selection::Limits(&tier.limits);
        }
    }
    Selection::Limits(&route.limits)
}

fn allowed(allow: &Allow, request: &Parts, client_ip: IpAddr) -> bool {
    if allow.is_empty() {
        return false;
    }
    let ip = client_ip.to_canonical();
    if allow.client_ips.iter().any(|net| net.contains(&ip)) {
        return true;
    }
    allow.identities.iter().any(|(identity, values)| {
        let identified = identity.identify(request, client_ip);
        named(&identified) && values.iter().any(|v| identified.is_value(v.as_bytes()))
    })
}

/// Values name callers by one of the identity's own sources: a caller that fell back to its
/// client IP (none of the sources was present) is never matched against them.
fn named(identified: &crate::identity::Identified) -> bool {
    identified.source != usize::MAX
}
