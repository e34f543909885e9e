//! Allow-lists and tiers: before a route's limits apply, callers on an allow-list (global or
//! the route's; by client CIDR or identity value) pass unlimited, and callers named by a
//! tier ([`Tier`], the route's `overrides:` in the file) get its limits instead of the default
//! ones (for example a partner key with ten times the quota), without a route of their own. [`applied`] goes on to the store keys
//! of the limits that apply: what the limit stage decides with, and what `explain` shows.

use crate::config::{Allow, LimitSet, Route, Throttle, Tier};
use crate::identity::caller::Caller;
use crate::identity::Identified;

use super::keys;

/// Which limits apply to a caller on a route.
pub enum Selection<'a> {
    /// On an allow-list: forwarded without any limit.
    Exempt,
    /// The limits to apply: the route's own (`tier` None), or a tier's.
    Limits {
        set: &'a LimitSet,
        tier: Option<&'a Tier>,
    },
}

/// The limits that apply to a caller on a route, keyed: what the limit stage decides with.
pub enum Applied<'a> {
    /// On an allow-list: forwarded without any limit.
    Exempt,
    Keyed {
        set: &'a LimitSet,
        /// The tier whose limits these are; None for the route's own.
        tier: Option<&'a Tier>,
        /// One store key per limit of `set`, in order.
        keys: Vec<String>,
        /// The kind of source that identified the caller for the first limit.
        identity: &'static str,
    },
}

/// Selects the limits that apply to `caller` on `route` and builds their store keys, each
/// identity evaluated once for both.
pub fn applied<'a>(throttle: &Throttle, route: &'a Route, caller: &mut Caller<'_>) -> Applied<'a> {
    match select(&throttle.allow, route, caller) {
        Selection::Exempt => Applied::Exempt,
        Selection::Limits { set, tier } => {
            let (keys, identity) = keys::build(&throttle.key_prefix, set, caller);
            Applied::Keyed {
                set,
                tier,
                keys,
                identity,
            }
        }
    }
}

fn select<'a>(global: &Allow, route: &'a Route, caller: &mut Caller<'_>) -> Selection<'a> {
    if allowed(global, caller) || allowed(&route.allow, caller) {
        return Selection::Exempt;
    }
    for tier in &route.tiers {
        let identified = caller.identified(&tier.identity);
        if tier
            .values
            .iter()
            .any(|v| identified.is_value(v.as_bytes()))
        {
            return Selection::Limits {
                set: &tier.limits,
                tier: Some(tier),
            };
        }
    }
    Selection::Limits {
        set: &route.limits,
        tier: None,
    }
}

fn allowed(allow: &Allow, caller: &mut Caller<'_>) -> bool {
    if allow.is_empty() {
        return false;
    }
    let ip = caller.ip.to_canonical();
    if allow.client_ips.iter().any(|net| net.contains(&ip)) {
        return true;
    }
    allow.identities.iter().any(|(identity, values)| {
        let identified = caller.identified(identity);
        named(identified) && values.iter().any(|v| identified.is_value(v.as_bytes()))
    })
}

/// Values name callers by one of the identity's own sources: a caller that fell back to its
/// client IP (none of the sources was present) is never matched against them.
fn named(identified: &Identified) -> bool {
    identified.source != usize::MAX
}
