//! The configuration in words, for people: what `tollgate check` prints (listeners, the admin
//! endpoints with their methods, upstream, store, routes with their limits, allow-lists and
//! tiers with their limits) and the one-line description of a limit that
//! `check` and `explain` show. The configuration itself renders nothing; this is its only
//! human-readable form, so the two commands always agree.

use std::fmt::Write;
use std::time::Duration;

use crate::config::{ByResponse, Config, Limit, OnLimit, Route, Scope, StoreConfig};
use crate::limit::calendar::{self, Calendar};
use crate::limit::{Algorithm, Micros};

/// What `tollgate check` prints: the listeners, the upstream and the routes.
pub fn check(config: &Config) -> String {
    let mut out = format!("{}: ok\n", config.file.display());
    for l in &config.listeners {
        let scheme = if l.tls.is_some() { "https" } else { "http" };
        let _ = writeln!(out, "listen    {scheme}://{}", l.address);
    }
    if let Some(admin) = config.admin {
        write_admin(&mut out, config, admin);
    }
    let _ = writeln!(
        out,
        "upstream  {}://{} (HTTP/{}, timeout {})",
        config.upstream.scheme,
        config.upstream.authority,
        if config.upstream.http2 { "2" } else { "1.1" },
        humantime::format_duration(config.upstream.timeout)
    );
    let store = match &config.throttle.store {
        StoreConfig::Memory => "memory (this process only)".to_string(),
        StoreConfig::Redis { .. } => format!("redis, on_error {}", config.throttle.on_error),
    };
    let _ = writeln!(out, "store     {store}");
    let _ = writeln!(
        out,
        "workers   {} serving thread{}",
        config.workers,
        if config.workers == 1 { "" } else { "s" }
    );
    if let Some(usage) = &config.usage {
        let _ = writeln!(
            out,
            "usage     GET {} answers a caller its own usage (never forwarded; at most {} per {}s per client address)",
            usage.path,
            crate::usage::OWN_LIMIT,
            crate::usage::OWN_WINDOW.as_secs()
        );
    }
    if let Some(protect) = &config.protect {
        let mode = match protect.mode {
            crate::config::ProtectMode::Enforce => "enforce: sheds under overload",
            crate::config::ProtectMode::Shadow => "shadow: measures, never sheds",
        };
        let _ = writeln!(
            out,
            "protect   {mode}; adaptive limit {}..{} in flight, latency {}, max_wait {}; unrouted requests are normal",
            protect.min_limit,
            protect.max_limit,
            protect.latency,
            humantime::format_duration(protect.max_wait)
        );
    }
    if let Some(traces) = &config.traces {
        let sampling = match (traces.sampling.parent_based, traces.caller_context) {
            (true, crate::config::CallerContext::TrustedProxies) => {
                "trusted proxies' sampled traces and"
            }
            (true, crate::config::CallerContext::Any) => "callers' sampled traces and",
            (false, _) => "ignoring callers' flags,",
        };
        let _ = writeln!(
            out,
            "traces    {} over {} as service {}; {sampling} {}% of new traces; at most {} spans/s",
            traces.endpoint,
            traces.protocol.as_str(),
            traces.service_name,
            traces.sampling.ratio * 100.0,
            traces.max_spans_per_second
        );
    }
    if config.throttle.routes.is_empty() {
        let _ = writeln!(out, "routes    none: every request is forwarded unlimited");
    }
    for route in &config.throttle.routes {
        write_route(&mut out, route, config.protect.is_some());
    }
    out
}

/// The admin listener's lines: its address, its endpoints with who may call them, and the
/// hosts it answers.
fn write_admin(out: &mut String, config: &Config, admin: std::net::SocketAddr) {
    let _ = writeln!(out, "admin     http://{admin}");
    let _ = writeln!(
        out,
        "          GET /healthz, GET /readyz, GET /metrics (the platform's), GET /console (the operators' page)"
    );
    // The operator endpoints as the listener routes them (`/protect` only with its section).
    let endpoints = crate::admin_endpoints::ENDPOINTS
        .iter()
        .filter(|(path, _)| *path != "/protect" || config.protect.is_some());
    let (reads, changes): (Vec<_>, Vec<_>) = endpoints
        .flat_map(|(path, methods)| methods.iter().map(move |m| format!("{m} {path}")))
        .partition(|endpoint| endpoint.starts_with("GET "));
    let _ = writeln!(
        out,
        "          {}: open to whoever reaches the listener",
        reads.join(", ")
    );
    let mutations = if config.admin_token.is_some() {
        "need the bearer token from admin.token_env"
    } else if admin.ip().is_loopback() {
        "open (loopback listener, no token)"
    } else {
        "refused (no admin.token_env, and the listener is not loopback)"
    };
    let _ = writeln!(out, "          {}: {mutations}", changes.join(", "));
    let names: Vec<String> = config.admin_hosts.iter().map(|h| h.to_string()).collect();
    let names = match names.is_empty() {
        true => String::new(),
        false => format!(", {}", names.join(", ")),
    };
    let _ = writeln!(
        out,
        "          answers Host: IP addresses, localhost{names} (any other: 421)"
    );
    let bounds = &config.admin_connections;
    let _ = writeln!(
        out,
        "          at most {} connections; a head within {}, idle ones closed after {}",
        bounds.max_connections,
        humantime::format_duration(bounds.header_read_timeout),
        humantime::format_duration(bounds.idle_timeout)
    );
}

/// A warning for each identity of the route's limits that keys a refused bearer token by client
/// IP (`on_invalid: client_ip`, the default). tollgate refuses tokens an app may accept (PyJWT
/// reads `"exp": "<digits>"`, JSON parsers take the last of two `sub`), and each address then
/// gets a quota of its own while the app serves the token's owner; `reject` answers them 401.
fn write_refused_token_warnings(out: &mut String, route: &Route) {
    let mut warned: Vec<&str> = Vec::new();
    for identity in route.limits.iter().flat_map(|limit| &limit.key) {
        let reads_tokens = identity
            .sources
            .iter()
            .any(|source| matches!(source, crate::identity::Source::Jwt(_)));
        if !reads_tokens
            || identity.on_invalid != crate::identity::OnInvalid::ClientIp
            || warned.contains(&identity.name.as_str())
        {
            continue;
        }
        warned.push(&identity.name);
        let _ = writeln!(
            out,
            "  warning identity {} keys a token it refuses by client IP (on_invalid: client_ip): a token the app accepts and tollgate does not (a numeric-string exp, a duplicate claim) gets a quota per address for its owner; set on_invalid: reject to answer such tokens 401",
            identity.name
        );
    }
}

/// A route's line, then one line per limit and per tier; with `protect`, each says its
/// priority.
fn write_route(out: &mut String, route: &Route, priorities: bool) {
    let mut matcher = route.path_prefix.clone().unwrap_or_else(|| "/".into());
    if let Some(methods) = &route.methods {
        let methods: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
        matcher = format!("{} {matcher}", methods.join(","));
    }
    if let Some(host) = &route.host {
        matcher = format!("{matcher} host {host}");
    }
    if route.case == crate::config::MatchCase::Insensitive {
        matcher.push_str(" any case");
    }
    let default_upgrades = crate::config::DEFAULT_UPGRADES.iter().copied();
    if !route
        .upgrades
        .iter()
        .map(String::as_str)
        .eq(default_upgrades)
    {
        matcher = format!("{matcher} upgrades [{}]", route.upgrades.join(","));
    }
    for (name, value) in &route.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        matcher = format!("{matcher} header {name}: {value}");
    }
    let priority = |p: crate::config::Priority| {
        if priorities {
            format!(", priority {p}")
        } else {
            String::new()
        }
    };
    let key: Vec<&str> = route
        .limits
        .first()
        .map(|l| l.key.iter().map(|i| i.name.as_str()).collect())
        .unwrap_or_default();
    let by = if route.limits.is_empty() {
        "unlimited".to_owned()
    } else {
        format!("by {}", key.join("+"))
    };
    let _ = writeln!(
        out,
        "route     {} ({matcher}) {by}{}",
        route.name,
        priority(route.limits.priority)
    );
    write_limits(out, &route.limits, "  limit   ");
    write_refused_token_warnings(out, route);
    if !route.allow.is_empty() {
        let mut who: Vec<String> = Vec::new();
        if !route.allow.client_ips.is_empty() {
            who.push(plural(route.allow.client_ips.len(), "client ip range"));
        }
        for (identity, values) in &route.allow.identities {
            who.push(format!(
                "{} of {}",
                plural(values.len(), "value"),
                identity.name
            ));
        }
        let _ = writeln!(
            out,
            "  allow   {}: forwarded without limits",
            who.join(", ")
        );
    }
    for tier in &route.tiers {
        let _ = writeln!(
            out,
            "  tier    {} for {} of {}{}",
            tier.name,
            plural(tier.values.len(), "value"),
            tier.identity.name,
            priority(tier.limits.priority)
        );
        write_limits(out, &tier.limits, "    limit ");
    }
}

/// One line per limit of `set`, each after `lead`: name, algorithm, numbers.
fn write_limits(out: &mut String, set: &crate::config::LimitSet, lead: &str) {
    for l in set {
        let _ = writeln!(
            out,
            "{lead}{} {} {}",
            l.name,
            l.params.algorithm.name(),
            limit(l)
        );
    }
}

/// `1 value`, `2 values`.
fn plural(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        _ => format!("{n} {what}s"),
    }
}

/// A one-line description of a limit for `check` and `explain`, e.g.
/// `30 per 1m, burst 15, shadow`; a calendar window says when the current one turns.
pub fn limit(limit: &Limit) -> String {
    let p = &limit.params;
    let period = humantime::format_duration(Duration::from_micros(p.period_us.max(0) as u64));
    let mut text = match p.algorithm {
        Algorithm::Concurrency => format!("{} in flight (lease ttl {period})", p.limit),
        Algorithm::TokenBucket | Algorithm::Gcra => {
            format!("{} per {period}, burst {}", p.limit, p.burst)
        }
        _ => match &p.calendar {
            Some(c) => calendar_window(p.limit, c, calendar::proxy_now_us()),
            None => format!("{} per {period}", p.limit),
        },
    };
    if p.cost != 1 {
        let _ = write!(text, ", cost {}", p.cost);
    }
    if limit.shadow {
        text.push_str(", shadow");
    }
    if let OnLimit::Delay { max_delay } = limit.on_limit {
        let _ = write!(
            text,
            ", delay up to {}",
            humantime::format_duration(max_delay)
        );
    }
    if limit.scope == Scope::Local {
        text.push_str(", local");
    }
    if let Some(by_response) = &limit.by_response {
        let _ = write!(text, ", {}", self::by_response(by_response));
    }
    if let Some(block_for) = limit.block_for {
        let _ = write!(
            text,
            ", block {} once denied",
            humantime::format_duration(block_for)
        );
    }
    if let Some(sync) = limit.sync {
        let _ = write!(text, ", {}", sync_bound(limit, sync));
    }
    text
}

/// A calendar window and when the current one turns, as seen at `now`, e.g.
/// `10000 per month (America/New_York), this one turns at 2026-12-01T00:00:00-05:00[America/New_York], in 4days 11h 2m`.
fn calendar_window(limit: u64, c: &Calendar, now: Micros) -> String {
    let (_, end) = calendar::window(c, now);
    // Whole seconds, rounded up like every seconds field tollgate sends.
    let left = Duration::from_secs(((end - now).max(0) as u64).div_ceil(1_000_000));
    format!(
        "{limit} per {} ({}), this one turns at {}, in {}",
        c.unit.name(),
        c.zone.name(),
        calendar::local_time(c, end),
        humantime::format_duration(left)
    )
}

/// The bound of a local-first limit synced every `sync`, as a function of R, the replicas
/// alive (see docs/algorithms.md, "Local-first limits").
pub fn sync_bound(limit: &Limit, sync: Duration) -> String {
    let p = &limit.params;
    let interval = humantime::format_duration(sync);
    let quota = match p.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => format!("burst {} + refill", p.burst),
        _ => format!("{} per window", p.limit),
    };
    format!(
        "sync {interval}: admits at most {quota} + (R - 1) with R replicas; \
         a replica holding all the traffic gets at least 1/R of what is left per {interval}; \
         when a replica's rounds are late (a busy node, Redis slow or down) \
         it decides alone on limit / R of what the last view left"
    )
}

/// What a limit learns from the response, e.g. `counts only 401, 5xx`.
pub fn by_response(by_response: &ByResponse) -> String {
    match by_response {
        ByResponse::CountStatuses(set) => format!("counts only {}", set.text()),
        ByResponse::CostFromResponse(name) => format!("cost from response `{name}`"),
    }
}

#[cfg(test)]
mod tests {
    /// `check` says where spans go, how, and which requests are traced.
    #[test]
    fn check_names_the_trace_export() {
        let text = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\ntracing: { endpoint: http://c:4317, protocol: grpc, sample_ratio: 0.01 }\n";
        let config = crate::config::parse(std::path::Path::new("t.yaml"), text, |_| None).unwrap();
        let summary = super::check(&config);
        assert!(
            summary.contains("traces    http://c:4317 over grpc as service tollgate; trusted proxies' sampled traces and 1% of new traces; at most 1000 spans/s"),
            "{summary}"
        );
        let without = crate::config::parse(
            std::path::Path::new("t.yaml"),
            &text[..text.find("tracing").unwrap()],
            |_| None,
        )
        .unwrap();
        assert!(!super::check(&without).contains("traces"));
    }
}
