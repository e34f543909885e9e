//! The JSON the console page draws, built from the running configuration, the sampler's
//! history, the store's health, the fleet's top offenders, the recent denials, one caller's
//! state on every route and `explain`'s answer for a request of theirs. Scripts may read it
//! too (docs/operations.md, "The console").

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use super::history::{self, History};
use super::shown;
use crate::config::{Limit, LimitSet, OnError, Route};
use crate::control::offenders::{View, CAPACITY};
use crate::control::Control;
use crate::explain::{self, Explanation};
use crate::identity::display::Display;
use crate::identity::{key, Source};
use crate::proxy::Proxy;

/// Callers per route the console lists as top offenders.
pub const TOP: usize = 10;

/// How a limit decides: `exact` (one atomic store call per request), `local-first` (decided
/// here, shared every `sync` interval), or `shadow` (measured, never refusing).
pub fn mode(limit: &Limit) -> &'static str {
    if limit.shadow {
        "shadow"
    } else if limit.sync.is_some() {
        "local-first"
    } else {
        "exact"
    }
}

/// A route's priority under the overload protection (`routes[].priority`, `normal` unless
/// set).
pub fn priority(route: &Route) -> &'static str {
    route.limits.priority.as_str()
}

fn limits_json(set: &LimitSet) -> Value {
    json!({
        "policy": crate::throttle::headers::policy(set).to_str().unwrap_or_default(),
        "limits": set.iter().map(|l| json!({
            "name": l.name,
            "algorithm": l.params.algorithm.name(),
            "summary": crate::summary::limit(l),
            "mode": mode(l),
            "scope": l.scope.as_str(),
            "block_for_seconds": l.block_for.map(|d| d.as_secs_f64()),
        })).collect::<Vec<_>>(),
    })
}

fn route_json(route: &Route) -> Value {
    let mut modes: Vec<&str> = route.limits.iter().map(mode).collect();
    modes.sort_unstable();
    modes.dedup();
    let mut limits = limits_json(&route.limits);
    limits["name"] = json!(route.name);
    limits["match"] = json!({
        "path_prefix": route.path_prefix,
        "methods": route.methods.as_ref().map(|m| m.iter().map(|m| m.as_str()).collect::<Vec<_>>()),
        "host": route.host,
        "case": if route.case == crate::config::MatchCase::Insensitive { "insensitive" } else { "sensitive" },
        "headers": route.headers.iter().map(|(name, value)| {
            (name.as_str().to_owned(), json!(String::from_utf8_lossy(value.as_bytes())))
        }).collect::<serde_json::Map<_, _>>(),
    });
    limits["priority"] = json!(priority(route));
    limits["mode"] = json!(modes.join(" + "));
    limits["tiers"] = route
        .tiers
        .iter()
        .map(|tier| {
            let mut t = limits_json(&tier.limits);
            t["name"] = json!(tier.name);
            t["identity"] = json!(tier.identity.name);
            t["priority"] = json!(tier.limits.priority.as_str());
            t
        })
        .collect();
    limits
}

/// Everything the page refreshes every few seconds.
pub async fn overview(proxy: &Proxy, history: &History, loopback: bool) -> Value {
    let config = proxy.config();
    let throttle = &config.throttle;
    let control = proxy.throttle_control();
    let routes: Vec<Value> = throttle.routes.iter().map(|r| route_json(r)).collect();

    let top = match control.offenders() {
        Some(sketch) => {
            let top = sketch.top_of(TOP.min(CAPACITY), View::Fleet).await;
            let routes: Vec<Value> = top
                .routes
                .iter()
                .map(|(route, callers)| {
                    let shown = control.shown(route);
                    json!({
                        "route": route,
                        "top": callers
                            .iter()
                            .map(|o| o.to_json(shown.item(&o.item)))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "scope": if top.view == View::Fleet { "fleet" } else { "local" },
                "reason": top.reason,
                "replicas": top.replicas,
                "routes": routes,
            })
        }
        None => json!({ "scope": "local", "reason": null, "replicas": 1, "routes": [] }),
    };

    let denials: Vec<Value> = control
        .offenders()
        .map(|sketch| sketch.recent().list())
        .unwrap_or_default()
        .into_iter()
        .map(|d| {
            let (source, identity) = control.shown(&d.route).item(&d.item);
            json!({
                "first": rfc3339_ms(d.first),
                "last": rfc3339_ms(d.last),
                "route": d.route,
                "tier": d.tier,
                "limit": d.limit,
                "identity": identity,
                "source": source,
                "reason": d.reason.as_str(),
                "count": d.count,
            })
        })
        .collect();

    json!({
        "now": rfc3339_ms(SystemTime::now()),
        "sample_seconds": history::SAMPLE_EVERY.as_secs(),
        "actions": actions(proxy, loopback),
        "routes": routes,
        "history": history_json(throttle, &history.samples()),
        "store": store(proxy, &control).await,
        "top": top,
        "denials": denials,
    })
}

/// The samples behind the charts: their times and the store's round trips, and per route the
/// cumulative counts of each sample.
fn history_json(throttle: &crate::config::Throttle, samples: &[history::Sample]) -> Value {
    let mut series = serde_json::Map::new();
    // What the protection in shadow mode would have shed, per route: beside the refusals,
    // since nothing was refused.
    let mut would_shed = serde_json::Map::new();
    for route in &throttle.routes {
        let counts = samples
            .iter()
            .map(|s| s.routes.get(&route.name).copied().unwrap_or_default());
        series.insert(
            route.name.clone(),
            counts
                .clone()
                .map(|c| json!([c.allowed, c.limited, c.shed]))
                .collect(),
        );
        would_shed.insert(
            route.name.clone(),
            counts.map(|c| json!(c.shadow_shed)).collect(),
        );
    }
    json!({
        "times": samples.iter().map(|s| s.at_ms).collect::<Vec<_>>(),
        "rtt_ms": samples.iter().map(|s| s.rtt_ms).collect::<Vec<_>>(),
        "routes": series,
        "would_shed": would_shed,
    })
}

/// Who may act: `token` (a bearer token is needed), `loopback` (this listener is loopback and
/// no token is configured: whoever reaches it may), or `off` (neither: no mutation is allowed).
fn actions(proxy: &Proxy, loopback: bool) -> &'static str {
    match (proxy.config().admin_token.is_some(), loopback) {
        (true, _) => "token",
        (false, true) => "loopback",
        (false, false) => "off",
    }
}

async fn store(proxy: &Proxy, control: &Control) -> Value {
    let health = proxy.store_health();
    let counts = proxy.metrics().store_counts();
    let throttle = &proxy.config().throttle;
    let local_first = throttle
        .routes
        .iter()
        .flat_map(|r| {
            std::iter::once(&r.limits)
                .chain(r.tiers.iter().map(|t| &t.limits))
                .flat_map(|set| set.iter())
        })
        .any(|l| l.sync.is_some());
    // What the server persists and the warning when durable state is at risk (Redis only).
    let persistence = if health.shared {
        proxy.store_persistence()
    } else {
        Value::Null
    };
    let rtt_ms = match control.ping().await {
        Some(Ok(took)) => Some(took.as_secs_f64() * 1000.0),
        _ => None,
    };
    json!({
        "kind": if health.shared { "redis" } else { "memory" },
        "connected": health.connected || !health.shared,
        "up": health.up && (health.connected || !health.shared),
        "breaker": if health.breaker_open { "open" } else { "closed" },
        "rtt_ms": rtt_ms,
        "on_error": match health.on_error {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        },
        "ready": proxy.store_ready(),
        "cause": health.cause.map(|c| c.describe()),
        "store_errors": counts.store_errors as f64,
        "persistence": persistence,
        "local_first": local_first.then(|| json!({
            "rounds_ok": counts.sync_rounds_ok as f64,
            "rounds_failed": counts.sync_rounds_failed as f64,
            "drift": counts.sync_drift as f64,
            "replicas": counts.sync_replicas,
        })),
    })
}

/// One caller (by the value it presents, or its short form) on every route: their state, and
/// what `explain` says for a request of theirs on that route, each as the route shows callers
/// ([`crate::control::shown`]). A short form is looked up on each route; a route where it names
/// no caller it knows says so.
///
/// The heading names the caller as the lists (top offenders, recent denials) do: as the
/// routes they are listed on show them (the strictest, if those routes differ), or, when no
/// list names them, by the strictest rule of every route.
pub async fn caller(proxy: &Proxy, resolved: &Resolved, given: &[u8]) -> Value {
    let config = proxy.config();
    let control = proxy.throttle_control();
    let given_text = String::from_utf8_lossy(given);
    let listed = listed_on(&control).await;
    let mut routes = Vec::new();
    // Per route that found the caller: its rule, the caller as it shows them, whether a list
    // names them there.
    let mut forms: Vec<(Display, String, bool)> = Vec::new();
    for route in &config.throttle.routes {
        let shown = control.shown(&route.name);
        let found = match resolved.get(&route.name, given) {
            Some(found) => found,
            None => {
                let found = control
                    .resolve(&route.name, given)
                    .await
                    .map_err(|e| e.to_string());
                resolved.put(&route.name, given, found.clone());
                found
            }
        };
        let raw = match found {
            Ok(raw) => raw,
            Err(e) => {
                routes.push(json!({
                    "route": route.name,
                    "state": { "error": e },
                    "explain": null,
                }));
                continue;
            }
        };
        let state = match control.state(&route.name, &raw).await {
            Ok(state) => crate::control::results::to_json(&state),
            Err(e) => json!({ "error": e.to_string() }),
        };
        let (parts, peer, note) = request_of(route, &raw);
        let mut explanation = explain::explain(&config, &parts, peer);
        live(&control, &mut explanation).await;
        let mut explained = explanation.json();
        explained["text"] = json!(explanation.text());
        if let Some(note) = note {
            explained["note"] = json!(note);
        }
        // The value as this route shows a value named by an operator: never clearer in the
        // explanation than in the state beside it.
        let form = shown.value(&raw);
        if shown.rule() != Display::Clear {
            explained = mask_value(explained, &raw, &form);
        }
        let on_a_list = listed
            .iter()
            .any(|(r, item)| *r == route.name && item_names(item, &raw));
        forms.push((shown.rule(), form, on_a_list));
        routes.push(json!({
            "route": route.name,
            "state": state,
            "explain": explained,
        }));
    }
    let anywhere = forms.iter().any(|(_, _, on_a_list)| *on_a_list);
    let heading = forms
        .into_iter()
        .filter(|(_, _, on_a_list)| *on_a_list || !anywhere)
        .max_by_key(|(rule, _, _)| *rule)
        .map_or_else(|| given_text.into_owned(), |(_, form, _)| form);
    json!({
        "identity": heading,
        "routes": routes,
    })
}

/// What a short form named on each route, remembered for [`Resolved::KEPT_FOR`]: the page
/// asks again for its caller every refresh, and finding a short form may scan the route's
/// store keys (`control::shown`), which a page left open must not repeat every 2 seconds.
/// Values (not short forms) are not kept: they need no finding.
#[derive(Debug, Default)]
pub struct Resolved {
    found: std::sync::Mutex<HashMap<(String, Vec<u8>), Finding>>,
}

/// The value a short form names on a route, or why none.
type Found = Result<Vec<u8>, String>;
/// A finding and when it was made.
type Finding = (Instant, Found);

impl Resolved {
    /// How long a finding is used again (an override or a new key may change it).
    pub const KEPT_FOR: Duration = Duration::from_secs(30);
    /// Findings kept at most (all forgotten when more would be).
    pub const MOST: usize = 256;

    fn is_short_form(given: &[u8]) -> bool {
        std::str::from_utf8(given)
            .ok()
            .and_then(crate::identity::display::digest_of_short_form)
            .is_some()
    }

    /// What `given` named on `route` lately, if it is a short form and was looked up.
    pub fn get(&self, route: &str, given: &[u8]) -> Option<Found> {
        if !Self::is_short_form(given) {
            return None;
        }
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        found
            .get(&(route.to_owned(), given.to_vec()))
            .filter(|(at, _)| at.elapsed() < Self::KEPT_FOR)
            .map(|(_, found)| found.clone())
    }

    pub fn put(&self, route: &str, given: &[u8], result: Found) {
        if !Self::is_short_form(given) {
            return;
        }
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        if found.len() >= Self::MOST {
            found.clear();
        }
        found.insert((route.to_owned(), given.to_vec()), (Instant::now(), result));
    }
}

/// (route, identity part of a store key) of every caller the page lists: the fleet's top
/// offenders and this replica's recent denials.
async fn listed_on(control: &Control) -> Vec<(String, String)> {
    let Some(sketch) = control.offenders() else {
        return Vec::new();
    };
    let top = sketch.top_of(TOP.min(CAPACITY), View::Fleet).await;
    let mut listed: Vec<(String, String)> = top
        .routes
        .into_iter()
        .flat_map(|(route, callers)| callers.into_iter().map(move |o| (route.clone(), o.item)))
        .collect();
    listed.extend(
        sketch
            .recent()
            .list()
            .into_iter()
            .map(|d| (d.route, d.item)),
    );
    listed
}

/// Whether the identity part `item` (`header=alice`, several joined by `|`) holds `raw`, as
/// is or hashed.
fn item_names(item: &str, raw: &[u8]) -> bool {
    let readable = String::from_utf8_lossy(raw);
    let digest = key::display_hash(raw);
    item.split('|').any(|part| {
        let (_, value) = crate::identity::shown_from_key_part(part);
        value == readable || value == digest
    })
}

/// Every string in `value` with `raw` replaced by `form` (how it may be shown), but for the
/// names the configuration gives (routes, limits, tiers...), which a value may happen to equal.
fn mask_value(value: Value, raw: &[u8], form: &str) -> Value {
    const NAMES: &[&str] = &[
        "route",
        "limit_name",
        "name",
        "tier",
        "algorithm",
        "scope",
        "source",
    ];
    match value {
        Value::String(s) => Value::String(shown::masked(&s, raw, form)),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| mask_value(v, raw, form))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = if NAMES.contains(&k.as_str()) {
                        v
                    } else {
                        mask_value(v, raw, form)
                    };
                    (k, v)
                })
                .collect(),
        ),
        other => other,
    }
}

/// Fills each limit's current state from this instance's stores, consuming nothing (local
/// limits included: they live here).
pub async fn live(control: &Control, explanation: &mut Explanation) {
    explanation.live_requested = true;
    for limit in &mut explanation.limits {
        limit.live = control.peek(&limit.limit, &limit.key).await.ok();
    }
}

/// A request on `route` that carries `raw` where the route's first limit reads its caller:
/// the route's method, path prefix and host, and the value in the first source of each
/// identity of that limit's key. A note says what could not be put in a request.
fn request_of(route: &Route, raw: &[u8]) -> (http::request::Parts, IpAddr, Option<String>) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let method = route
        .methods
        .as_ref()
        .and_then(|m| m.first().cloned())
        .unwrap_or(http::Method::GET);
    let mut segments: Vec<String> = route
        .path_prefix
        .as_deref()
        .unwrap_or("/")
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let mut query = Vec::new();
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut cookies = Vec::new();
    let mut peer: IpAddr = [127, 0, 0, 1].into();
    let mut note = None;
    let identities = route
        .limits
        .first()
        .map(|l| l.key.as_slice())
        .unwrap_or_default();
    for identity in identities {
        match identity.sources.first() {
            Some(Source::Header(name)) => headers.push((name.as_str().to_owned(), text.clone())),
            Some(Source::Query(name)) => {
                query.push(format!("{}={}", encode(name.as_bytes()), encode(raw)))
            }
            Some(Source::Cookie(name)) => cookies.push(format!("{name}={text}")),
            Some(Source::Bearer) => {
                headers.push(("authorization".into(), format!("Bearer {text}")))
            }
            Some(Source::PathSegment(n)) => {
                while segments.len() < *n {
                    segments.push("x".into());
                }
                segments[n - 1] = encode(raw);
            }
            Some(Source::ClientIp) => match text.parse() {
                Ok(ip) => peer = ip,
                Err(_) => note = Some(format!("`{}` reads the client address", identity.name)),
            },
            Some(Source::Jwt(_)) => {
                note = Some(format!(
                    "`{}` reads a signed token's claim: the request carries none",
                    identity.name
                ))
            }
            Some(Source::Form(name)) => {
                note = Some(format!(
                "`{}` reads the form field `{name}` of a request body: the request carries none",
                identity.name
            ))
            }
            Some(Source::Global) | None => {}
        }
    }
    if !cookies.is_empty() {
        headers.push(("cookie".into(), cookies.join("; ")));
    }
    if let Some(host) = &route.host {
        headers.push(("host".into(), host.replace("*.", "www.")));
    }
    let mut url = format!("/{}", segments.join("/"));
    if route
        .path_prefix
        .as_deref()
        .is_some_and(|p| p.ends_with('/'))
        && !url.ends_with('/')
    {
        url.push('/');
    }
    if !query.is_empty() {
        url = format!("{url}?{}", query.join("&"));
    }
    let described = explain::Described {
        method: method.to_string(),
        url,
        headers: headers.iter().map(|(n, v)| format!("{n}: {v}")).collect(),
        peer,
    };
    match explain::request_parts(&described) {
        Ok(parts) => (parts, peer, note),
        Err(why) => (
            plain_request(peer),
            peer,
            Some(format!("the value cannot be put in a request: {why}")),
        ),
    }
}

/// `GET /` from `peer`: what is explained when the value cannot be put in a request.
fn plain_request(peer: IpAddr) -> http::request::Parts {
    explain::request_parts(&explain::Described {
        method: "GET".into(),
        url: "/".into(),
        headers: Vec::new(),
        peer,
    })
    .expect("a plain request")
}

/// Percent-encodes everything but unreserved characters.
fn encode(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 3339 to the millisecond.
pub fn rfc3339_ms(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// `explain`'s JSON for a described request, with live state from this instance's stores when
/// asked, every value of a source whose display rule hides it shown as the rule shows it.
pub async fn explain_request(
    proxy: &Proxy,
    described: &explain::Described,
    with_live: bool,
) -> Result<(Value, String), String> {
    let config = proxy.config();
    let parts = explain::request_parts(described)?;
    let mut explanation = explain::explain(&config, &parts, described.peer);
    if with_live {
        live(&proxy.throttle_control(), &mut explanation).await;
    }
    let mut json = explanation.json();
    let mut text = explanation.text();
    // Values read from a header, parameter or cookie whose display rule hides them (a
    // credential's, by default): shown as the rule shows them, never as sent.
    for (value, form) in secret_values(&parts, &config.throttle) {
        json = mask_value(json, &value, &form);
        text = shown::masked(&text, &value, &form);
    }
    Ok((json, text))
}

/// The values `parts` carries in sources whose identity's display rule does not show them
/// clear (by default, those whose names say they hold a credential), each with what the rule
/// shows instead.
fn secret_values(
    parts: &http::request::Parts,
    throttle: &crate::config::Throttle,
) -> Vec<(Vec<u8>, String)> {
    let mut out = Vec::new();
    let identities = throttle
        .routes
        .iter()
        .flat_map(|r| std::iter::once(&r.limits).chain(r.tiers.iter().map(|t| &t.limits)))
        .flat_map(|set| set.iter())
        .flat_map(|limit| limit.key.iter());
    for identity in identities {
        for source in &identity.sources {
            let rule = identity.display.unwrap_or_else(|| source.default_display());
            if rule == Display::Clear {
                continue;
            }
            let value: Option<Vec<u8>> = match source {
                Source::Header(name) => parts.headers.get(name).map(|v| v.as_bytes().to_vec()),
                Source::Query(name) => parts
                    .uri
                    .query()
                    .and_then(|q| crate::identity::query_param(q, name)),
                Source::Cookie(name) => parts
                    .headers
                    .get_all(http::header::COOKIE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(';'))
                    .filter_map(|pair| pair.trim().split_once('='))
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.trim_matches('"').as_bytes().to_vec()),
                _ => None,
            };
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                let form = rule.show(&value);
                out.push((value, form));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_forms_found_are_kept_a_while_values_never() {
        let resolved = Resolved::default();
        let short = b"sha256:c1924e26c931";
        assert_eq!(resolved.get("api", short), None);
        resolved.put("api", short, Ok(b"k_live_42".to_vec()));
        resolved.put("partner", short, Err("no caller".into()));
        assert_eq!(resolved.get("api", short), Some(Ok(b"k_live_42".to_vec())));
        assert_eq!(
            resolved.get("partner", short),
            Some(Err("no caller".into()))
        );
        assert_eq!(resolved.get("other", short), None);
        // A value needs no finding: never kept.
        resolved.put("api", b"alice", Ok(b"alice".to_vec()));
        assert_eq!(resolved.get("api", b"alice"), None);
        // Bounded: full, it starts afresh.
        for i in 0..Resolved::MOST {
            resolved.put(&format!("r{i}"), short, Ok(Vec::new()));
        }
        assert!(resolved.found.lock().unwrap().len() <= Resolved::MOST);
        assert_eq!(resolved.get("api", short), None);
    }
}
