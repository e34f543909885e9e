//! Validation of `routes`: unique names, what each route matches (path prefix, methods,
//! host, header values), its priority, its key, its limits and allow-list, and its tiers (`overrides`).

use std::collections::HashSet;
use std::sync::Arc;

use http::Method;

use super::allow::allow;
use super::identities::{key, lookup};
use super::limits::{limits, Owner};
use super::matching;
use super::protect::priority;
use super::validator::{is_plain_name, Validator};
use crate::config::model::{LimitSet, Priority, Route, Scope, Tier};
use crate::config::raw::{RawMatch, RawRoute, RawTier};
use crate::identity::Identity;

/// Every usable route, in file order; names are unique (they are the action in store keys).
pub(super) fn routes(
    v: &mut Validator,
    raw: &[RawRoute],
    identities: &[Arc<Identity>],
    default_scope: Scope,
) -> Vec<Arc<Route>> {
    let mut names = HashSet::new();
    let mut routes = Vec::new();
    for (i, route) in raw.iter().enumerate() {
        let path = format!("routes[{i}]");
        if !names.insert(route.name.clone()) {
            v.error(&format!("{path}.name"), format!("route name `{}` is used twice: names must be unique (they are the action in store keys)", route.name));
        }
        if let Some(route) = self::route(v, &path, route, identities, default_scope) {
            routes.push(Arc::new(route));
        }
    }
    routes
}

fn route(
    v: &mut Validator,
    path: &str,
    raw: &RawRoute,
    identities: &[Arc<Identity>],
    default_scope: Scope,
) -> Option<Route> {
    if !is_plain_name(&raw.name) {
        v.error(
            &format!("{path}.name"),
            format!(
                "`{}` may use only letters, digits, `_`, `-` and `.` (at most 64)",
                raw.name
            ),
        );
    }
    let m = &raw.matcher;
    let methods = matcher(v, path, m);
    let case = matching::case(v, path, m.case.as_deref());
    let host = matching::host(m.host.as_ref());
    let upgrades = matching::upgrades(v, path, raw.upgrades.as_deref());
    let method_override = matching::method_override(v, path, raw.method_override.as_ref());
    let client_ip = identities.iter().find(|i| i.name == "client_ip").cloned()?;
    // An unknown key is reported; validation goes on with the client IP so the limits'
    // own mistakes are reported in the same run.
    let route_key = match &raw.key {
        Some(raw_key) => key(v, &format!("{path}.key"), raw_key, identities)
            .unwrap_or_else(|| vec![client_ip.clone()]),
        None => vec![client_ip],
    };
    // A route without limits forwards its requests unlimited: it still gives them a
    // priority (`protect`) and its tiers still apply.
    let priority = priority(
        v,
        &format!("{path}.priority"),
        raw.priority.as_deref(),
        Priority::Normal,
    );
    let headers = match_headers(v, path, m);
    let owner = Owner {
        name: &raw.name,
        route_key: &route_key,
        identities,
        default_scope,
    };
    let limits = limits(v, path, &owner, &raw.limits);
    let shared_key = limits.iter().all(|l| same_key(&l.key, &route_key));
    let allow = allow(v, &format!("{path}.allow"), raw.allow.as_ref(), identities);
    let mut tier_names = HashSet::new();
    let tiers = raw
        .tiers
        .iter()
        .enumerate()
        .filter_map(|(i, tier)| self::tier(v, path, &owner, tier, i, &mut tier_names, priority))
        .collect();
    let mut limits = LimitSet::new(&raw.name, None, limits, shared_key);
    limits.priority = priority;
    Some(Route {
        name: raw.name.clone(),
        path_prefix: matching::path_prefix(m.path_prefix.as_ref(), case),
        methods,
        host,
        case,
        upgrades,
        headers,
        limits,
        allow,
        tiers,
        method_override,
    })
}

/// Checks the path prefix and returns the methods, if the route names any.
fn matcher(v: &mut Validator, path: &str, m: &RawMatch) -> Option<Vec<Method>> {
    if let Some(prefix) = &m.path_prefix {
        if !prefix.starts_with('/') {
            v.error(
                &format!("{path}.match.path_prefix"),
                format!("`{prefix}` must start with `/`"),
            );
        }
    }
    m.methods.as_ref().map(|list| {
        list.iter()
            .enumerate()
            .filter_map(|(i, name)| {
                match Method::from_bytes(name.trim().to_ascii_uppercase().as_bytes()) {
                    Ok(method) => Some(method),
                    Err(_) => {
                        v.error(
                            &format!("{path}.match.methods[{i}]"),
                            format!("`{name}` is not an HTTP method"),
                        );
                        None
                    }
                }
            })
            .collect::<Vec<_>>()
    })
}

/// `match.headers`: names (case-insensitive) and the exact values they must have.
fn match_headers(
    v: &mut Validator,
    path: &str,
    m: &RawMatch,
) -> Vec<(http::HeaderName, http::HeaderValue)> {
    let mut headers = Vec::new();
    for (name, value) in &m.headers.0 {
        let Ok(header) = http::HeaderName::from_bytes(name.trim().as_bytes()) else {
            v.error(
                &format!("{path}.match.headers"),
                format!("`{name}` is not a header name"),
            );
            continue;
        };
        match http::HeaderValue::from_str(value) {
            Ok(value) => headers.push((header, value)),
            Err(_) => v.error(
                &format!("{path}.match.headers.{name}"),
                "is not a valid header value (visible ASCII and spaces)",
            ),
        }
    }
    headers
}

/// The route's tier `overrides[index]`; `None` when whose values it lists is unknown
/// (reported). `route` is the route's own limits' owner; `names` the tier names so far.
fn tier(
    v: &mut Validator,
    path: &str,
    route: &Owner,
    raw: &RawTier,
    index: usize,
    names: &mut HashSet<String>,
    route_priority: Priority,
) -> Option<Tier> {
    let tier_path = format!("{path}.overrides[{index}]");
    let tier = raw
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-tier{}", route.name, index + 1));
    if !is_plain_name(&tier) {
        v.error(
            &format!("{tier_path}.name"),
            format!("`{tier}` may use only letters, digits, `_`, `-` and `.` (at most 64)"),
        );
    }
    if !names.insert(tier.clone()) {
        v.error(
            &format!("{tier_path}.name"),
            format!("tier name `{tier}` is used twice in this route"),
        );
    }
    let identity = match &raw.identity {
        Some(name) => lookup(v, &format!("{tier_path}.identity"), name, route.identities)?,
        None if route.route_key.len() == 1 => route.route_key[0].clone(),
        None => {
            v.error(&tier_path, "the route's key is compound: say which identity the values belong to with `identity: NAME`");
            return None;
        }
    };
    if raw.values.is_empty() {
        v.error(
            &format!("{tier_path}.values"),
            "list the identity values this tier applies to",
        );
    }
    if raw.limits.is_empty() && raw.priority.is_none() {
        v.error(
            &format!("{tier_path}.limits"),
            "a tier needs its own limits or a priority (to exempt callers entirely, use `allow`)",
        );
    }
    let priority = priority(
        v,
        &format!("{tier_path}.priority"),
        raw.priority.as_deref(),
        route_priority,
    );
    let owner = Owner {
        name: &tier,
        ..*route
    };
    let limits = limits(v, &tier_path, &owner, &raw.limits);
    let shared_key = limits.iter().all(|l| same_key(&l.key, route.route_key));
    let mut limits = LimitSet::new(route.name, Some(&tier), limits, shared_key);
    limits.priority = priority;
    Some(Tier {
        name: tier.clone(),
        identity,
        values: raw.values.clone(),
        limits,
    })
}

fn same_key(a: &[Arc<Identity>], b: &[Arc<Identity>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}
