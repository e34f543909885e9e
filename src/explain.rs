//! `tollgate explain`: answers "why was this request limited?" without sending it. It runs the
//! same stage functions as the proxy — shape check, usage path, route, identify, tier and keys —
//! on a request described on the command line, and prints what each decided: a shape tollgate
//! refuses before routing (400, or 405 for CONNECT) and the caller's usage path (answered by
//! tollgate, never forwarded) end there; the route, which identity source answered (the
//! value shown hashed when it is a secret or long), and each limit with its store key. With
//! `--live` it also asks the store how much is left, without consuming anything.

use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use serde_json::json;

use crate::config::{Config, Limit, Route};
use crate::identity::{self, Identity};
use crate::limit::algorithm::Verdict;
use crate::routing;
use crate::store::Holder;
use crate::throttle::tiers;

/// The request to explain, as given on the command line.
pub struct Described {
    pub method: String,
    pub url: String,
    pub headers: Vec<String>,
    /// The TCP peer; X-Forwarded-For from `headers` applies behind trusted proxies.
    pub peer: IpAddr,
}

/// What the proxy would do with the request.
pub struct Explanation {
    pub method: Method,
    pub uri: Uri,
    pub peer: IpAddr,
    pub client_ip: IpAddr,
    pub route: Option<Arc<Route>>,
    /// `Some("allow-list")` when exempt, `Some(tier)` when a tier applies.
    pub tier: Option<String>,
    pub exempt: bool,
    pub limits: Vec<LimitExplained>,
    /// Whether `--live` asked the store (for the text of limits it could not answer for).
    pub live_requested: bool,
    /// The priority `protect` gives the request; None without a `protect` section.
    pub priority: Option<crate::config::Priority>,
    /// Refused before routing for its shape ([`crate::proxy::shape`]): nothing else runs.
    pub refused: Option<crate::proxy::shape::ShapeRefusal>,
    /// The `usage` path: answered by tollgate, never routed or forwarded.
    pub usage: bool,
}

pub struct LimitExplained {
    pub limit: Limit,
    pub key: String,
    /// Per identity of the limit's key: (identity name, source description, shown value).
    pub identities: Vec<(String, String, String)>,
    /// Filled by `--live`.
    pub live: Option<Verdict>,
    /// The route it belongs to when that is not the request's own: one reached by a method
    /// the request names in a method override, which the request counts against too.
    pub by_method_override: Option<String>,
}

pub fn request_parts(described: &Described) -> Result<Parts, String> {
    // As given: tollgate refuses a standard method in another case (`post`), and says so.
    let method = Method::from_bytes(described.method.as_bytes())
        .map_err(|_| format!("`{}` is not an HTTP method", described.method))?;
    let uri: Uri = described
        .url
        .parse()
        .map_err(|e| format!("`{}` is not a URL or path: {e}", described.url))?;
    let mut builder = Request::builder().method(method);
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    builder = builder.uri(path_and_query);
    // The URL's host is the request's Host, unless a Host header is given (a client sends one).
    let host_given = described.headers.iter().any(|h| {
        h.split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
    });
    if let (Some(authority), false) = (uri.authority(), host_given) {
        builder = builder.header(http::header::HOST, authority.as_str());
    }
    for header in &described.headers {
        let Some((name, value)) = header.split_once(':') else {
            return Err(format!(
                "`{header}` is not a header: write -H 'Name: value'"
            ));
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("`{}` is not a header name", name.trim()))?;
        let value = HeaderValue::from_str(value.trim())
            .map_err(|_| format!("the value of {name} is not a valid header value"))?;
        builder = builder.header(name, value);
    }
    let request = builder.body(()).map_err(|e| e.to_string())?;
    Ok(request.into_parts().0)
}

/// Runs the request path's route, identify and tier/key stages for `parts` (the same
/// functions the proxy runs), without deciding anything.
pub fn explain(config: &Config, parts: &Parts, peer: IpAddr) -> Explanation {
    let throttle = &config.throttle;
    // The routes the proxy counts the request against: its own, and those reached by a method
    // it names in a method override.
    let (routed, also) = routing::routes_of(&throttle.routes, parts);
    let mut caller = identity::caller::identify(parts, peer, &throttle.trusted_proxies);
    let mut explanation = Explanation {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        peer,
        client_ip: caller.ip,
        route: None,
        tier: None,
        exempt: false,
        limits: Vec::new(),
        live_requested: false,
        // Unrouted requests are normal; a routed one has its route's or its tier's.
        priority: config
            .protect
            .as_ref()
            .map(|_| crate::config::Priority::Normal),
        refused: None,
        usage: false,
    };
    // The proxy's order: shape, then the usage path, then routes.
    let found = crate::proxy::headers::scan(&parts.headers);
    if let Some(refusal) = crate::proxy::shape::check(parts, &found) {
        explanation.refused = Some(refusal);
        explanation.priority = None;
        return explanation;
    }
    if config
        .usage
        .as_ref()
        .is_some_and(|usage| parts.uri.path() == usage.path)
    {
        explanation.usage = true;
        explanation.priority = None;
        return explanation;
    }
    let Some(routed) = routed else {
        return explanation;
    };
    explanation.route = Some(routed.route.clone());
    if config.protect.is_some() {
        explanation.priority = Some(routed.route.limits.priority);
    }
    let (applied, tier, store_keys) = match tiers::applied(throttle, routed.route, &mut caller) {
        tiers::Applied::Exempt => {
            explanation.exempt = true;
            explanation.tier = Some("allow-list".into());
            return explanation;
        }
        tiers::Applied::Keyed {
            set, tier, keys, ..
        } => (set, tier, keys),
    };
    explanation.tier = tier.map(|t| t.name.clone());
    if config.protect.is_some() {
        explanation.priority = Some(applied.priority);
    }
    let explained = |limit: &Limit, key, ip: IpAddr, by_method_override| LimitExplained {
        limit: limit.clone(),
        key,
        identities: limit
            .key
            .iter()
            .map(|identity| describe_identity(identity, parts, ip))
            .collect(),
        live: None,
        by_method_override,
    };
    for (limit, key) in applied.limits.iter().zip(store_keys) {
        explanation
            .limits
            .push(explained(limit, key, caller.key_ip(), None));
    }
    for other in also {
        let tiers::Applied::Keyed { set, keys, .. } =
            tiers::applied(throttle, other.route, &mut caller)
        else {
            continue;
        };
        for (limit, key) in set.limits.iter().zip(keys) {
            let by = Some(other.route.name.clone());
            explanation
                .limits
                .push(explained(limit, key, caller.key_ip(), by));
        }
    }
    explanation
}

fn describe_identity(
    identity: &Identity,
    parts: &Parts,
    client_ip: IpAddr,
) -> (String, String, String) {
    let (identified, shown) = identity.identify_shown(parts, client_ip);
    let source = match (identity.sources.get(identified.source), identified.refused) {
        (Some(source), _) => source.describe(),
        (None, Some(crate::identity::Refusal::Ambiguous(what))) => {
            format!("none: {} ({}), answered 400", what.detail(), what.as_str())
        }
        (None, Some(why)) => match identity.on_invalid {
            crate::identity::OnInvalid::ClientIp => format!(
                "client ip (the bearer token was refused: {}; on_invalid: client_ip)",
                why.as_str()
            ),
            crate::identity::OnInvalid::Reject => format!(
                "none: the bearer token was refused ({}), on_invalid: reject answers 401",
                why.as_str()
            ),
        },
        (None, None) => "client ip (no source was present: fallback)".to_owned(),
    };
    (identity.name.clone(), source, shown)
}

fn secs(us: i64) -> String {
    humantime::format_duration(std::time::Duration::from_micros(us.max(0) as u64)).to_string()
}

impl Explanation {
    pub fn text(&self) -> String {
        let mut out = format!("request   {} {}\n", self.method, self.uri);
        if self.client_ip == self.peer {
            out.push_str(&format!("client ip {}\n", self.client_ip));
        } else {
            out.push_str(&format!(
                "client ip {} (from X-Forwarded-For; peer {} is a trusted proxy)\n",
                self.client_ip, self.peer
            ));
        }
        if let Some(priority) = self.priority {
            out.push_str(&format!(
                "priority  {priority} (under overload, waits and is shed in this order: critical, high, normal, low)\n"
            ));
        }
        if let Some(refusal) = self.refused {
            out.push_str(&format!(
                "refused   {} before routing: {} (no app sees it; counted as decision=\"rejected\")\n",
                refusal.status(),
                refusal.detail()
            ));
            return out;
        }
        if self.usage {
            out.push_str(&format!(
                "usage     answered by tollgate, never forwarded: the caller's own usage of every route, as JSON; consumes nothing (its own rate: at most {} per {}s per client address)\n",
                crate::usage::OWN_LIMIT,
                crate::usage::OWN_WINDOW.as_secs()
            ));
            return out;
        }
        let Some(route) = &self.route else {
            out.push_str("route     none: forwarded without limits\n");
            return out;
        };
        out.push_str(&format!("route     {}\n", route.name));
        if self.exempt {
            out.push_str("tier      allow-list: forwarded without limits\n");
            return out;
        }
        if let Some(tier) = &self.tier {
            out.push_str(&format!("tier      {tier}\n"));
        }
        for l in &self.limits {
            out.push_str(&self.limit_text(l));
        }
        out
    }

    /// One limit's lines: its identities and key, and its state when read live.
    fn limit_text(&self, l: &LimitExplained) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "limit     {} ({} {}){}\n",
            l.limit.name,
            l.limit.params.algorithm.name(),
            crate::summary::limit(&l.limit),
            match &l.by_method_override {
                Some(route) => format!(", of route {route}: counted too by the method override"),
                None => String::new(),
            }
        ));
        for (name, source, value) in &l.identities {
            out.push_str(&format!("  identity  {name} = {value} (from {source})\n"));
        }
        out.push_str(&format!("  key       {}\n", l.key));
        if l.live.is_none() && self.live_requested && Holder::of(&l.limit, true) == Holder::Memory {
            out.push_str("  now       unknown: a local limit lives in each proxy's memory\n");
        }
        if let Some(v) = &l.live {
            out.push_str(&format!(
                "  now       {} {} of {} left, full again in {}{}\n",
                if v.allowed {
                    "would pass:"
                } else {
                    "would be LIMITED:"
                },
                v.remaining,
                v.limit,
                secs(v.reset_after_us),
                if v.allowed {
                    String::new()
                } else if v.retry_after_us < 0 {
                    ", and can never pass at this cost".to_owned()
                } else {
                    format!(", retry after {}", secs(v.retry_after_us))
                }
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let mut value = self.json_without_priority();
        if let (Some(priority), Some(object)) = (self.priority, value.as_object_mut()) {
            object.insert("priority".into(), json!(priority.as_str()));
        }
        value
    }

    fn json_without_priority(&self) -> serde_json::Value {
        json!({
            "method": self.method.as_str(),
            "uri": self.uri.to_string(),
            "peer": self.peer.to_string(),
            "client_ip": self.client_ip.to_string(),
            "refused": self.refused.map(|r| json!({
                "status": r.status().as_u16(),
                "detail": r.detail(),
            })),
            "usage": self.usage,
            "route": self.route.as_ref().map(|r| r.name.clone()),
            "exempt": self.exempt,
            "tier": self.tier,
            "limits": self.limits.iter().map(|l| json!({
                "name": l.limit.name,
                "by_method_override": l.by_method_override,
                "algorithm": l.limit.params.algorithm.name(),
                "limit": l.limit.params.limit,
                "period_seconds": l.limit.params.period_us as f64 / 1e6,
                "burst": l.limit.params.burst,
                "cost": l.limit.params.cost,
                "shadow": l.limit.shadow,
                "block_for_seconds": l.limit.block_for.map(|d| d.as_secs_f64()),
                "scope": l.limit.scope.as_str(),
                "key": l.key,
                "identities": l.identities.iter().map(|(name, source, value)| json!({
                    "identity": name, "source": source, "value": value,
                })).collect::<Vec<_>>(),
                "live": l.live.map(|v| json!({
                    "allowed": v.allowed,
                    "limit": v.limit,
                    "remaining": v.remaining,
                    "reset_after_seconds": v.reset_after_us as f64 / 1e6,
                    "retry_after_seconds": if v.allowed { None } else { Some(v.retry_after_us as f64 / 1e6) },
                })),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Fills in each limit's current state from the store, consuming nothing.
pub async fn live(config: &Config, explanation: &mut Explanation) -> Result<(), String> {
    explanation.live_requested = true;
    if explanation.limits.is_empty() {
        return Ok(());
    }
    let redis = match &config.throttle.store {
        crate::config::StoreConfig::Memory => {
            return Err("limits live in each proxy's memory (no store.redis section): there is no shared state to read".into())
        }
        crate::config::StoreConfig::Redis(redis) => redis,
    };
    // Limits with `scope: local` live in each proxy's memory: the store knows nothing of them.
    let global: Vec<usize> = (0..explanation.limits.len())
        .filter(|&i| Holder::of(&explanation.limits[i].limit, true).is_shared())
        .collect();
    if global.is_empty() {
        return Ok(());
    }
    let mut redis = redis.clone();
    // A one-off command-line read: give a slow link more than the proxy's budget.
    redis.timeout = redis.timeout.max(std::time::Duration::from_secs(2));
    let store = crate::limit::redis_store::RedisStore::open(&redis)
        .await
        .map_err(|e| format!("cannot reach the store: {e}"))?;
    // Read as the limit stage decides: under the overrides in force in the store.
    let control = crate::control::caller::Control::direct(
        config.throttle.clone(),
        crate::limit::Store::Redis(store),
    );
    for &i in &global {
        let l = &explanation.limits[i];
        let verdict = control
            .peek(&l.limit, &l.key)
            .await
            .map_err(|e| format!("the store failed: {e}"))?;
        explanation.limits[i].live = Some(verdict);
    }
    Ok(())
}
