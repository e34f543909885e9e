//! From merged hours to advice: per route (and tier) the distribution of callers' peak rates,
//! what its limits refused, and per target share the limit that would have refused at most
//! that share of callers, in words and as a `limits:` block `tollgate check` accepts.
//!
//! Suggestions are per-minute limits of each rate algorithm the set uses (`sliding_window`
//! when it uses none): the record's minute peak is `sliding_window`'s own count, so for it the
//! refused callers are exact (up to the histogram's bucket, and the limit is a bucket bound);
//! `fixed_window` counts less than that in any window, so it refuses at most as many; for
//! `sliding_log`, `token_bucket` and `gcra` (burst = limit: one minute's worth at once) it is
//! an estimate. Refused requests are an estimate throughout (each caller over the limit taken
//! to send at its peak rate all the time).

use serde_json::{json, Value};

use super::hist::{Histogram, MAX_RELATIVE_ERROR};
use super::record::Hour;
use super::{Merged, View};
use crate::config::{LimitSet, Throttle};
use crate::limit::algorithm::Algorithm;

/// The shares of callers a suggestion may refuse.
pub const TARGETS: [f64; 2] = [0.001, 0.01];

/// How far back a report looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The current clock hour and the previous one.
    Hour,
    /// The current clock hour and the 24 before it.
    Day,
}

impl Window {
    pub fn parse(text: &str) -> Option<Window> {
        match text {
            "1h" => Some(Window::Hour),
            "24h" => Some(Window::Day),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
        }
    }

    fn hours(self) -> u32 {
        match self {
            Window::Hour => 2,
            Window::Day => 25,
        }
    }

    fn words(self) -> &'static str {
        match self {
            Window::Hour => "in the last hour",
            Window::Day => "in the last 24 h",
        }
    }
}

/// The limit sets by the name the record keeps them under (`route`, `route~tier`).
fn sets(throttle: &Throttle) -> impl Iterator<Item = &LimitSet> {
    throttle
        .routes
        .iter()
        .flat_map(|r| std::iter::once(&r.limits).chain(r.tiers.iter().map(|t| &t.limits)))
}

/// The report `/limits/suggest` answers, from `merged` over `window`, as of `now_ms`.
pub fn report(throttle: &Throttle, merged: &Merged, window: Window, now_ms: u64) -> Value {
    let hour_now = (now_ms / 3_600_000) as u32;
    let first = hour_now.saturating_sub(window.hours() - 1);
    let mut routes = Vec::new();
    // In configuration order; a set no longer configured is left out.
    for set in sets(throttle) {
        let Some(hours) = merged.routes.get(&set.key_name) else {
            continue;
        };
        let mut total = Hour::default();
        for (_, hour) in hours.range(first..) {
            total.merge(hour);
        }
        if total.minute.is_empty() {
            continue;
        }
        routes.push(route_report(set, &total, window));
    }
    let mut body = json!({
        "scope": match merged.view { View::Fleet => "fleet", View::Local => "local" },
        "replicas": merged.replicas,
        "window": window.as_str(),
        "since_unix": first as u64 * 3_600,
        "percentile_error": MAX_RELATIVE_ERROR,
        "targets": TARGETS,
        "routes": routes,
    });
    if let Some(reason) = merged.reason {
        body["reason"] = json!(reason);
    }
    body
}

fn percentiles(h: &Histogram) -> Value {
    json!({
        "p50": h.quantile(0.5),
        "p90": h.quantile(0.9),
        "p99": h.quantile(0.99),
        "p99.9": h.quantile(0.999),
        "max": h.max(),
    })
}

fn route_report(set: &LimitSet, total: &Hour, window: Window) -> Value {
    let (route, tier) = match set.key_name.split_once('~') {
        Some((route, tier)) => (route, Some(tier)),
        None => (set.key_name.as_str(), None),
    };
    let callers = total.minute.callers();
    let requests = total.minute.requests();
    let mut algorithms: Vec<Algorithm> = Vec::new();
    for limit in set.iter() {
        let a = limit.params.algorithm;
        if a != Algorithm::Concurrency && !algorithms.contains(&a) {
            algorithms.push(a);
        }
    }
    if algorithms.is_empty() {
        algorithms.push(Algorithm::SlidingWindow);
    }
    let key = key_yaml(set);
    let mut suggestions = Vec::new();
    for target in TARGETS {
        let limit = total.minute.limit_for(target, 1);
        let refused = total.minute.refused_at(limit);
        for algorithm in &algorithms {
            suggestions.push(suggestion(
                *algorithm, limit, target, refused, callers, requests, &key, window,
            ));
        }
    }
    json!({
        "route": route,
        "tier": tier,
        "key": key,
        "callers": callers,
        "requests": requests,
        "evicted": total.evicted,
        "per_minute": percentiles(&total.minute),
        "per_second": percentiles(&total.second),
        "limits": set.iter().map(crate::summary::limit).collect::<Vec<_>>(),
        "refused": {
            "requests": total.refused_requests,
            "callers": total.refused_callers,
            "shadow_requests": total.shadow_requests,
            "shadow_callers": total.shadow_callers,
        },
        "suggestions": suggestions,
    })
}

/// The set's first limit's key as YAML (`user`, `[user, client_ip]`).
fn key_yaml(set: &LimitSet) -> String {
    let names: Vec<&str> = set
        .first()
        .map(|l| l.key.iter().map(|i| i.name.as_str()).collect())
        .unwrap_or_default();
    match names.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

fn share(part: f64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part / whole as f64
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn suggestion(
    algorithm: Algorithm,
    limit: u32,
    target: f64,
    refused: super::hist::Refused,
    callers: u64,
    requests: u64,
    key: &str,
    window: Window,
) -> Value {
    let (burst, how) = match algorithm {
        Algorithm::SlidingWindow => (None, "exact"),
        Algorithm::FixedWindow => (None, "at_most"),
        Algorithm::TokenBucket | Algorithm::Gcra => (Some(limit), "estimate"),
        _ => (None, "estimate"),
    };
    let name = algorithm.name();
    let line = match burst {
        Some(b) => {
            format!("{{ algorithm: {name}, limit: {limit}, period: 1m, burst: {b}, key: {key} }}")
        }
        None => format!("{{ algorithm: {name}, limit: {limit}, period: 1m, key: {key} }}"),
    };
    let callers_share = share(refused.callers as f64, callers);
    let requests_share = share(refused.requests, requests);
    let what = match burst {
        Some(b) => format!("a {name} limit of {limit}/min with burst {b}"),
        None => format!("a {name} limit of {limit}/min"),
    };
    let would = match how {
        "exact" => "would have refused",
        "at_most" => "would have refused at most",
        _ => "would have refused about",
    };
    let sentence = format!(
        "{what} {would} {} of {} callers ({:.2} %), about {:.1} % of requests, {}",
        thousands(refused.callers),
        thousands(callers),
        callers_share * 100.0,
        requests_share * 100.0,
        window.words()
    );
    json!({
        "target": target,
        "algorithm": name,
        "limit": limit,
        "period": "1m",
        "burst": burst,
        "refused_callers": refused.callers,
        "refused_callers_share": callers_share,
        "refused_requests_share": requests_share,
        "callers_count": how,
        "sentence": sentence,
        "yaml": format!("limits:\n  - {line}\n"),
    })
}

/// `?format=text`: what an operator reads at a glance.
pub fn text(body: &Value) -> String {
    let over = match (body["scope"].as_str(), body["replicas"].as_u64()) {
        (Some("fleet"), Some(n)) => format!("the fleet ({n} replicas reporting)"),
        _ => match body["reason"].as_str() {
            Some(reason) => format!("this replica only ({reason})"),
            None => "this replica only".to_owned(),
        },
    };
    let mut out = format!(
        "callers' peak rates over window {} on {over}; percentiles are at most {:.2} % above the truth\n",
        body["window"].as_str().unwrap_or("?"),
        body["percentile_error"].as_f64().unwrap_or(0.0) * 100.0
    );
    let routes = body["routes"].as_array().cloned().unwrap_or_default();
    if routes.is_empty() {
        out.push_str("no requests on routes with limits yet\n");
    }
    let pct = |v: &Value| {
        format!(
            "p50 {} p90 {} p99 {} p99.9 {} max {}",
            v["p50"], v["p90"], v["p99"], v["p99.9"], v["max"]
        )
    };
    for route in routes {
        let name = match route["tier"].as_str() {
            Some(tier) => format!("{} (tier {tier})", route["route"].as_str().unwrap_or("?")),
            None => route["route"].as_str().unwrap_or("?").to_owned(),
        };
        out.push_str(&format!(
            "route {name}: {} callers (key {}), {} requests\n",
            thousands(route["callers"].as_u64().unwrap_or(0)),
            route["key"].as_str().unwrap_or("?"),
            thousands(route["requests"].as_u64().unwrap_or(0)),
        ));
        out.push_str(&format!("  per minute: {}\n", pct(&route["per_minute"])));
        out.push_str(&format!("  per second: {}\n", pct(&route["per_second"])));
        let refused = &route["refused"];
        out.push_str(&format!(
            "  its limits refused {} requests of {} callers; shadow limits would have refused {} of {}\n",
            refused["requests"], refused["callers"], refused["shadow_requests"], refused["shadow_callers"]
        ));
        if route["evicted"].as_u64().unwrap_or(0) > 0 {
            out.push_str(&format!(
                "  {} counters evicted under a flood of keys: those callers may count twice\n",
                route["evicted"]
            ));
        }
        for s in route["suggestions"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  refuse ≤ {} % of callers: {}\n",
                s["target"].as_f64().unwrap_or(0.0) * 100.0,
                s["sentence"].as_str().unwrap_or("")
            ));
            for line in s["yaml"].as_str().unwrap_or("").lines() {
                out.push_str(&format!("      {line}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(4_120), "4,120");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
