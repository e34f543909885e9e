//! Validation of the throttling half of the file: store, client IP trust, identities, routes,
//! limits and the shape of limited responses. Everything that cannot work is refused here, with
//! the position of the offending value, so the request path never meets a surprise.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};

use super::raw::{self, RawKey, RawLimit, RawRoute, RawSource};
use super::Validator;
use crate::identity::{self, Identity, JwtVerifier, Source, TrustedProxies};
use crate::limit::algorithm::{self, Algorithm, Params};

pub const DEFAULT_KEY_PREFIX: &str = "tollgate:";
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);

/// Everything the limiter needs, validated.
#[derive(Debug, Clone)]
pub struct Throttle {
    pub store: StoreConfig,
    pub key_prefix: String,
    pub on_error: OnError,
    pub trusted_proxies: TrustedProxies,
    pub routes: Vec<Arc<Route>>,
    pub response: ResponseConfig,
    /// Callers never limited on any route.
    pub allow: Allow,
}

/// Callers that are never limited.
#[derive(Debug, Clone, Default)]
pub struct Allow {
    pub client_ips: Vec<ipnet::IpNet>,
    /// Identity values, compared after that identity identified the caller.
    pub identities: Vec<(Arc<Identity>, Vec<String>)>,
}

impl Allow {
    pub fn is_empty(&self) -> bool {
        self.client_ips.is_empty() && self.identities.is_empty()
    }
}

/// A tier: callers whose `identity` value is one of `values` get `limits` (on the same route)
/// instead of the route's default limits.
#[derive(Debug, Clone)]
pub struct Override {
    pub name: String,
    pub identity: Arc<Identity>,
    pub values: Vec<String>,
    pub limits: LimitSet,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Limits live in this process only.
    Memory,
    /// Shared through Redis: one server, a Cluster or a Sentinel-managed master.
    Redis(super::RedisConfig),
}

/// What a store error (timeout, connection loss) means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Forward the request (fail open) and count the error.
    Allow,
    /// Refuse with 503 and Retry-After (fail closed).
    Deny,
    /// Decide with the in-memory limiter and the same limits (per-instance until Redis is back).
    Local,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<Method>>,
    /// Lower-case host without port; `*.example.com` matches subdomains.
    pub host: Option<String>,
    /// The default limits: what every caller gets unless a tier names it.
    pub limits: LimitSet,
    /// Callers never limited on this route.
    pub allow: Allow,
    /// Tiers, tried in order before the default limits.
    pub overrides: Vec<Override>,
}

/// The limits one caller gets on a route (the route's own, or a tier's), with everything the
/// limit stage needs to key, decide and describe them. Derefs to its limits.
#[derive(Debug, Clone)]
pub struct LimitSet {
    /// The route's name as clients are told it (the limited response's body), a tier's too.
    pub route: String,
    /// The action in store keys: the route's name, or `route~tier` for a tier (`~` cannot
    /// appear in a route name, so a tier's keys never meet another route's).
    pub key_name: String,
    pub limits: Vec<Limit>,
    /// True when every limit uses the same key, so the store key's hash tag can include the
    /// identity (spreading a route over a cluster) instead of the route name alone.
    pub shared_key: bool,
    /// The `RateLimit-Policy` field value for `limits`, rendered once here rather than on
    /// every response.
    pub policy: http::HeaderValue,
}

impl LimitSet {
    /// A route's own limits (`tier` None) or a tier's.
    pub fn new(route: &str, tier: Option<&str>, limits: Vec<Limit>, shared_key: bool) -> Self {
        LimitSet {
            route: route.to_owned(),
            key_name: match tier {
                None => route.to_owned(),
                Some(tier) => format!("{route}~{tier}"),
            },
            policy: policy_value(&limits),
            limits,
            shared_key,
        }
    }
}

impl std::ops::Deref for LimitSet {
    type Target = [Limit];

    fn deref(&self) -> &[Limit] {
        &self.limits
    }
}

impl<'a> IntoIterator for &'a LimitSet {
    type Item = &'a Limit;
    type IntoIter = std::slice::Iter<'a, Limit>;

    fn into_iter(self) -> Self::IntoIter {
        self.limits.iter()
    }
}

/// `RateLimit-Policy` for all of `limits`, e.g. `"login";q=5;w=60`: the quota and the window
/// in whole seconds, rounded up like every seconds field tollgate sends.
pub fn policy_value(limits: &[Limit]) -> http::HeaderValue {
    let items: Vec<String> = limits
        .iter()
        .map(|l| match l.params.algorithm {
            Algorithm::Concurrency => {
                format!(
                    "\"{}\";q={};qu=\"concurrent-requests\"",
                    l.name, l.params.limit
                )
            }
            _ => format!(
                "\"{}\";q={};w={}",
                l.name,
                l.params.limit,
                (l.params.period_us.max(0) as u64).div_ceil(1_000_000)
            ),
        })
        .collect();
    http::HeaderValue::from_str(&items.join(", ")).expect("policy names are plain ASCII")
}

#[derive(Debug, Clone)]
pub struct Limit {
    /// Policy name in headers, logs and metrics.
    pub name: String,
    pub params: Params,
    pub key: Vec<Arc<Identity>>,
    pub scope: Scope,
    pub on_limit: OnLimit,
    pub shadow: bool,
    /// `count_statuses` or `cost_from_response`: settled after the response.
    pub by_response: Option<super::ByResponse>,
    /// `block_for`: once this limit denies a caller, every request of theirs on the route is
    /// refused for this long (the penalty box, see `limit::algorithm::penalty_box`).
    pub block_for: Option<Duration>,
    /// `sync: <duration>`: decided locally and shared through Redis every interval
    /// (`limit::local_first`); None is `sync: exact`, one atomic script call per request.
    pub sync: Option<Duration>,
}

impl Limit {
    /// `block_for` in microseconds, as the stores take it (0: none).
    pub fn block_us(&self) -> crate::limit::Micros {
        self.block_for
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }

    /// A one-line description for `check` and `explain`, e.g. `30 per 1m, burst 15, shadow`.
    pub fn describe(&self) -> String {
        let p = &self.params;
        let period = humantime::format_duration(Duration::from_micros(p.period_us.max(0) as u64));
        let mut text = match p.algorithm {
            Algorithm::Concurrency => format!("{} in flight (lease ttl {period})", p.limit),
            Algorithm::TokenBucket | Algorithm::Gcra => {
                format!("{} per {period}, burst {}", p.limit, p.burst)
            }
            _ => format!("{} per {period}", p.limit),
        };
        if p.cost != 1 {
            text.push_str(&format!(", cost {}", p.cost));
        }
        if self.shadow {
            text.push_str(", shadow");
        }
        if let OnLimit::Delay { max_delay } = self.on_limit {
            text.push_str(&format!(
                ", delay up to {}",
                humantime::format_duration(max_delay)
            ));
        }
        if self.scope == Scope::Local {
            text.push_str(", local");
        }
        if let Some(by_response) = &self.by_response {
            text.push_str(&format!(", {}", by_response.describe()));
        }
        if let Some(block_for) = self.block_for {
            text.push_str(&format!(
                ", block {} once denied",
                humantime::format_duration(block_for)
            ));
        }
        if let Some(sync) = self.sync {
            text.push_str(&format!(", {}", self.sync_bound(sync)));
        }
        text
    }

    /// For `check`: the bound of a local-first limit, as a function of R, the replicas alive
    /// (see docs/algorithms.md, "Local-first limits").
    pub fn sync_bound(&self, sync: Duration) -> String {
        let p = &self.params;
        let interval = humantime::format_duration(sync);
        let quota = match p.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => format!("burst {} + refill", p.burst),
            _ => format!("{} per window", p.limit),
        };
        format!(
            "sync {interval}: admits at most {quota} + (R - 1) with R replicas; \
             a replica holding all the traffic gets at least 1/R of what is left per {interval}; \
             limit / R on each replica while Redis is down"
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Shared by every tollgate instance through the store.
    Global,
    /// This instance only (in memory).
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    Reject,
    /// Wait up to `max_delay` for the request to fit, then forward it.
    Delay {
        max_delay: Duration,
    },
}

#[derive(Debug, Clone)]
pub struct ResponseConfig {
    pub status: StatusCode,
    /// IETF RateLimit / RateLimit-Policy on allowed responses (always on limited ones).
    pub ietf: bool,
    /// X-RateLimit-Limit / -Remaining / -Reset.
    pub legacy: bool,
}

const ALGORITHMS: &str =
    "fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency";

fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "fixed_window" => Algorithm::FixedWindow,
        "sliding_log" => Algorithm::SlidingLog,
        "sliding_window" => Algorithm::SlidingWindow,
        "token_bucket" => Algorithm::TokenBucket,
        "gcra" => Algorithm::Gcra,
        "concurrency" => Algorithm::Concurrency,
        _ => return None,
    })
}

/// Names that end up in store keys and headers: kept to characters that need no escaping.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl Validator<'_> {
    pub(crate) fn throttle(&mut self, raw: &mut raw::RawConfig) -> Throttle {
        let (store, key_prefix, on_error) = self.store(raw.store.as_ref());
        let trusted_proxies = self.trusted_proxies(raw.client_ip.as_ref());
        let identities = self.identities(std::mem::take(&mut raw.identities));
        let default_scope = match store {
            StoreConfig::Memory => Scope::Local,
            StoreConfig::Redis(_) => Scope::Global,
        };
        let mut names = HashSet::new();
        let mut routes = Vec::new();
        for (i, route) in raw.routes.iter().enumerate() {
            let path = format!("routes[{i}]");
            if !names.insert(route.name.clone()) {
                self.error(&format!("{path}.name"), format!("route name `{}` is used twice: names must be unique (they are the action in store keys)", route.name));
            }
            if let Some(route) = self.route(&path, route, &identities, default_scope) {
                routes.push(Arc::new(route));
            }
        }
        let allow = self.allow("allow", raw.allow.as_ref(), &identities);
        Throttle {
            store,
            key_prefix,
            on_error,
            trusted_proxies,
            routes,
            response: self.response(raw.response.as_ref()),
            allow,
        }
    }

    fn store(&mut self, raw: Option<&raw::RawStore>) -> (StoreConfig, String, OnError) {
        let Some(raw) = raw else {
            return (
                StoreConfig::Memory,
                DEFAULT_KEY_PREFIX.into(),
                OnError::Allow,
            );
        };
        let on_error = match raw.on_error.as_deref() {
            None | Some("allow") => OnError::Allow,
            Some("deny") => OnError::Deny,
            Some("local") => OnError::Local,
            Some(other) => {
                self.error("store.on_error", format!("`{other}` is not allowed: use allow (forward), deny (503) or local (decide in memory)"));
                OnError::Allow
            }
        };
        let Some(redis) = &raw.redis else {
            return (StoreConfig::Memory, DEFAULT_KEY_PREFIX.into(), on_error);
        };
        let key_prefix = redis
            .key_prefix
            .clone()
            .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
        if key_prefix.contains(['{', '}']) || key_prefix.chars().any(char::is_whitespace) {
            self.error("store.redis.key_prefix", "must not contain `{`, `}` or whitespace (they would change Redis Cluster hash slots)");
        }
        let redis = self.redis(redis, DEFAULT_STORE_TIMEOUT);
        (StoreConfig::Redis(redis), key_prefix, on_error)
    }

    fn trusted_proxies(&mut self, raw: Option<&raw::RawClientIp>) -> TrustedProxies {
        let Some(raw) = raw else {
            return TrustedProxies::none();
        };
        let mut nets = Vec::new();
        for (i, text) in raw.trusted_proxies.iter().enumerate() {
            let text = text.trim();
            match parse_net(text) {
                Some(net) => nets.push(net),
                None => self.error(
                    &format!("client_ip.trusted_proxies[{i}]"),
                    format!("`{text}` is not a CIDR or IP address: write e.g. 10.0.0.0/8, 192.168.1.10 or fd00::/8"),
                ),
            }
        }
        TrustedProxies::new(nets)
    }

    fn identities(
        &mut self,
        raw: raw::indexmap_free::OrderedMap<Vec<RawSource>>,
    ) -> Vec<Arc<Identity>> {
        let mut out: Vec<Arc<Identity>> = ["client_ip", "global"]
            .iter()
            .filter_map(|n| identity::builtin(n).map(Arc::new))
            .collect();
        for (name, sources) in raw.0 {
            let path = format!("identities.{name}");
            if !is_plain_name(&name) {
                self.error(
                    &path,
                    format!(
                        "identity name `{name}` may use only letters, digits, `_`, `-` and `.`"
                    ),
                );
            }
            if identity::builtin(&name).is_some() {
                self.error(
                    &path,
                    format!("`{name}` is built in and cannot be redefined; pick another name"),
                );
                continue;
            }
            if sources.is_empty() {
                self.error(&path, "needs at least one source (header, query, cookie, bearer, jwt, path_segment, client_ip)");
            }
            let sources = sources
                .into_iter()
                .enumerate()
                .filter_map(|(i, s)| self.source(&format!("{path}[{i}]"), s))
                .collect();
            out.push(Arc::new(Identity { name, sources }));
        }
        out
    }

    fn source(&mut self, path: &str, raw: RawSource) -> Option<Source> {
        Some(match raw {
            RawSource::Header(name) => match http::HeaderName::from_bytes(name.trim().as_bytes()) {
                Ok(name) => Source::Header(name),
                Err(_) => {
                    self.error(
                        &format!("{path}.header"),
                        format!("`{name}` is not a valid header name"),
                    );
                    return None;
                }
            },
            RawSource::Query(name) if !name.is_empty() => Source::Query(name),
            RawSource::Cookie(name) if !name.is_empty() => Source::Cookie(name),
            RawSource::Query(_) | RawSource::Cookie(_) => {
                self.error(path, "needs a parameter or cookie name");
                return None;
            }
            RawSource::Bearer => Source::Bearer,
            RawSource::PathSegment(0) => {
                self.error(
                    &format!("{path}.path_segment"),
                    "segments count from 1: for /t/<id>/..., <id> is 2",
                );
                return None;
            }
            RawSource::PathSegment(n) => Source::PathSegment(n),
            RawSource::ClientIp => Source::ClientIp,
            RawSource::Jwt(jwt) => return self.jwt(&format!("{path}.jwt"), jwt).map(Source::Jwt),
        })
    }

    fn jwt(&mut self, path: &str, raw: raw::RawJwt) -> Option<JwtVerifier> {
        let claim = raw.claim.unwrap_or_else(|| "sub".into());
        let leeway = self.duration_or_zero(
            &format!("{path}.leeway"),
            raw.leeway.as_deref(),
            Duration::ZERO,
        );
        if leeway.subsec_nanos() != 0 {
            self.error(
                &format!("{path}.leeway"),
                "JWT times are whole seconds: write the leeway in seconds, e.g. 30s",
            );
        }
        let verifier = match (&raw.secret_env, &raw.public_key_file) {
            (Some(var), None) => {
                let algorithm =
                    self.jwt_algorithm(path, raw.algorithm.as_deref(), "HS256", true)?;
                let Some(secret) = (self.env)(var) else {
                    self.error(
                        &format!("{path}.secret_env"),
                        format!("environment variable `{var}` (the HMAC secret) is not set"),
                    );
                    return None;
                };
                JwtVerifier::hmac(secret.as_bytes(), algorithm, &claim)
            }
            (None, Some(file)) => {
                let algorithm =
                    self.jwt_algorithm(path, raw.algorithm.as_deref(), "RS256", false)?;
                let file = self.relative(file);
                let pem = match std::fs::read(&file) {
                    Ok(pem) => pem,
                    Err(e) => {
                        self.error(
                            &format!("{path}.public_key_file"),
                            format!("cannot read {}: {e}", file.display()),
                        );
                        return None;
                    }
                };
                JwtVerifier::public_key_pem(&pem, algorithm, &claim)
            }
            _ => {
                self.error(path, "give exactly one of `secret_env` (HS256/384/512: the env var holding the secret) or `public_key_file` (RS*/PS*/ES*/EdDSA: a PEM public key)");
                return None;
            }
        };
        match verifier {
            Ok(v) => Some(
                v.with_issuer(raw.issuer)
                    .with_audience(raw.audience)
                    .with_leeway(leeway.as_secs()),
            ),
            Err(e) => {
                self.error(path, e.to_string());
                None
            }
        }
    }

    fn jwt_algorithm(
        &mut self,
        path: &str,
        name: Option<&str>,
        default: &str,
        hmac: bool,
    ) -> Option<jsonwebtoken::Algorithm> {
        let name = name.unwrap_or(default);
        let allowed: &[&str] = if hmac {
            &["HS256", "HS384", "HS512"]
        } else {
            &[
                "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
            ]
        };
        if !allowed.contains(&name) {
            self.error(
                &format!("{path}.algorithm"),
                format!(
                    "`{name}` is not allowed with {}: use one of {}",
                    if hmac {
                        "secret_env"
                    } else {
                        "public_key_file"
                    },
                    allowed.join(", ")
                ),
            );
            return None;
        }
        name.parse().ok()
    }

    fn key(
        &mut self,
        path: &str,
        raw: &RawKey,
        identities: &[Arc<Identity>],
    ) -> Option<Vec<Arc<Identity>>> {
        let names = raw.names();
        if names.is_empty() {
            self.error(path, "needs at least one identity name");
            return None;
        }
        let mut out = Vec::new();
        for name in names {
            match identities.iter().find(|i| i.name == name) {
                Some(identity) => out.push(identity.clone()),
                None => {
                    let known: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
                    self.error(
                        path,
                        format!(
                            "unknown identity `{name}`: defined are {}",
                            known.join(", ")
                        ),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    fn route(
        &mut self,
        path: &str,
        raw: &RawRoute,
        identities: &[Arc<Identity>],
        default_scope: Scope,
    ) -> Option<Route> {
        if !is_plain_name(&raw.name) {
            self.error(
                &format!("{path}.name"),
                format!(
                    "`{}` may use only letters, digits, `_`, `-` and `.` (at most 64)",
                    raw.name
                ),
            );
        }
        let m = &raw.matcher;
        if let Some(prefix) = &m.path_prefix {
            if !prefix.starts_with('/') {
                self.error(
                    &format!("{path}.match.path_prefix"),
                    format!("`{prefix}` must start with `/`"),
                );
            }
        }
        let methods = m.methods.as_ref().map(|list| {
            list.iter()
                .enumerate()
                .filter_map(|(i, name)| {
                    match Method::from_bytes(name.trim().to_ascii_uppercase().as_bytes()) {
                        Ok(method) => Some(method),
                        Err(_) => {
                            self.error(
                                &format!("{path}.match.methods[{i}]"),
                                format!("`{name}` is not an HTTP method"),
                            );
                            None
                        }
                    }
                })
                .collect::<Vec<_>>()
        });
        let host = m.host.as_ref().map(|h| h.trim().to_ascii_lowercase());
        let client_ip = identities.iter().find(|i| i.name == "client_ip").cloned()?;
        // An unknown key is reported; validation goes on with the client IP so the limits'
        // own mistakes are reported in the same run.
        let route_key = match &raw.key {
            Some(key) => self
                .key(&format!("{path}.key"), key, identities)
                .unwrap_or_else(|| vec![client_ip.clone()]),
            None => vec![client_ip],
        };
        if raw.limits.is_empty() {
            self.error(&format!("{path}.limits"), "a route needs at least one limit (routes with no limits are simply not listed: unmatched requests are forwarded unlimited)");
        }
        let limits = self.limits(
            path,
            &raw.name,
            &raw.limits,
            &route_key,
            identities,
            default_scope,
        );
        let shared_key = limits.iter().all(|l| same_key(&l.key, &route_key));
        let allow = self.allow(&format!("{path}.allow"), raw.allow.as_ref(), identities);
        let mut route = Route {
            name: raw.name.clone(),
            path_prefix: m.path_prefix.clone(),
            methods,
            host,
            limits: LimitSet::new(&raw.name, None, limits, shared_key),
            allow,
            overrides: Vec::new(),
        };
        let mut tier_names = HashSet::new();
        for (i, raw_override) in raw.overrides.iter().enumerate() {
            let opath = format!("{path}.overrides[{i}]");
            let tier = raw_override
                .name
                .clone()
                .unwrap_or_else(|| format!("{}-tier{}", raw.name, i + 1));
            if !is_plain_name(&tier) {
                self.error(
                    &format!("{opath}.name"),
                    format!("`{tier}` may use only letters, digits, `_`, `-` and `.` (at most 64)"),
                );
            }
            if !tier_names.insert(tier.clone()) {
                self.error(
                    &format!("{opath}.name"),
                    format!("tier name `{tier}` is used twice in this route"),
                );
            }
            let identity = match &raw_override.identity {
                Some(name) => match identities.iter().find(|id| id.name == *name) {
                    Some(identity) => identity.clone(),
                    None => {
                        let known: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
                        self.error(
                            &format!("{opath}.identity"),
                            format!(
                                "unknown identity `{name}`: defined are {}",
                                known.join(", ")
                            ),
                        );
                        continue;
                    }
                },
                None if route_key.len() == 1 => route_key[0].clone(),
                None => {
                    self.error(&opath, "the route's key is compound: say which identity the values belong to with `identity: NAME`");
                    continue;
                }
            };
            if raw_override.values.is_empty() {
                self.error(
                    &format!("{opath}.values"),
                    "list the identity values this tier applies to",
                );
            }
            if raw_override.limits.is_empty() {
                self.error(
                    &format!("{opath}.limits"),
                    "a tier needs its own limits (to exempt callers entirely, use `allow`)",
                );
            }
            let limits = self.limits(
                &opath,
                &tier,
                &raw_override.limits,
                &route_key,
                identities,
                default_scope,
            );
            let shared_key = limits.iter().all(|l| same_key(&l.key, &route_key));
            route.overrides.push(Override {
                name: tier.clone(),
                identity,
                values: raw_override.values.clone(),
                limits: LimitSet::new(&raw.name, Some(&tier), limits, shared_key),
            });
        }
        Some(route)
    }

    /// Validates a list of limits (a route's, or a tier's) with unique policy names.
    fn limits(
        &mut self,
        path: &str,
        route_name: &str,
        raw: &[RawLimit],
        route_key: &[Arc<Identity>],
        identities: &[Arc<Identity>],
        default_scope: Scope,
    ) -> Vec<Limit> {
        let mut limits = Vec::new();
        let mut policy_names = HashSet::new();
        for (i, limit) in raw.iter().enumerate() {
            let limit_path = format!("{path}.limits[{i}]");
            let Some(limit) = self.limit(
                &limit_path,
                limit,
                route_name,
                raw,
                i,
                route_key,
                identities,
                default_scope,
            ) else {
                continue;
            };
            if !policy_names.insert(limit.name.clone()) {
                self.error(
                    &format!("{limit_path}.name"),
                    format!(
                        "policy name `{}` is used twice: give each limit its own `name`",
                        limit.name
                    ),
                );
            }
            limits.push(limit);
        }
        self.by_response_scopes(path, &limits);
        if limits.windows(2).any(|w| w[0].sync != w[1].sync) {
            // One decision covers every limit of a request, atomically: either in memory
            // (local-first) or in one Redis script (exact), not both.
            self.error(
                &format!("{path}.limits"),
                "every limit of a route (or tier) needs the same `sync`: exact, or one duration",
            );
        }
        limits
    }

    fn allow(
        &mut self,
        path: &str,
        raw: Option<&raw::RawAllow>,
        identities: &[Arc<Identity>],
    ) -> Allow {
        let Some(raw) = raw else {
            return Allow::default();
        };
        let mut allow = Allow::default();
        for (i, text) in raw.client_ips.iter().enumerate() {
            match parse_net(text) {
                Some(net) => allow.client_ips.push(net),
                None => self.error(&format!("{path}.client_ips[{i}]"), format!("`{text}` is not a CIDR or IP address: write e.g. 10.0.0.0/8 or 192.168.1.10")),
            }
        }
        for (name, values) in &raw.identities.0 {
            match identities.iter().find(|id| id.name == *name) {
                Some(identity) => allow.identities.push((identity.clone(), values.clone())),
                None => {
                    let known: Vec<&str> = identities.iter().map(|i| i.name.as_str()).collect();
                    self.error(
                        &format!("{path}.identities.{name}"),
                        format!(
                            "unknown identity `{name}`: defined are {}",
                            known.join(", ")
                        ),
                    );
                }
            }
        }
        allow
    }

    #[allow(clippy::too_many_arguments)]
    fn limit(
        &mut self,
        path: &str,
        raw: &RawLimit,
        route_name: &str,
        siblings: &[RawLimit],
        index: usize,
        route_key: &[Arc<Identity>],
        identities: &[Arc<Identity>],
        default_scope: Scope,
    ) -> Option<Limit> {
        let Some(algorithm) = parse_algorithm(raw.algorithm.trim()) else {
            self.error(
                &format!("{path}.algorithm"),
                format!(
                    "`{}` is not an algorithm: use one of {ALGORITHMS}",
                    raw.algorithm
                ),
            );
            return None;
        };
        if raw.limit == 0 {
            self.error(
                &format!("{path}.limit"),
                "must be at least 1 (to block a route entirely, use your app or a firewall)",
            );
        }
        let period = if algorithm == Algorithm::Concurrency {
            if raw.period.is_some() {
                self.error(&format!("{path}.period"), "concurrency limits have no period: they count requests in flight (use `lease_ttl` for how long a crashed proxy's slots stay taken)");
            }
            self.duration(
                &format!("{path}.lease_ttl"),
                raw.lease_ttl.as_deref(),
                DEFAULT_LEASE_TTL,
            )
        } else {
            if raw.lease_ttl.is_some() {
                self.error(
                    &format!("{path}.lease_ttl"),
                    "only concurrency limits have a lease_ttl",
                );
            }
            match raw.period.as_deref() {
                Some(p) => {
                    self.duration(&format!("{path}.period"), Some(p), Duration::from_secs(1))
                }
                None => {
                    self.error(
                        path,
                        "missing `period` (the window or refill period, e.g. 1s, 60s, 1h)",
                    );
                    Duration::from_secs(1)
                }
            }
        };
        let period_us = i64::try_from(period.as_micros()).unwrap_or(i64::MAX);
        if period_us < 1_000 && algorithm != Algorithm::Concurrency {
            self.error(&format!("{path}.period"), "must be at least 1ms");
        }
        let bursty = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
        if raw.burst.is_some() && !bursty {
            self.error(
                &format!("{path}.burst"),
                format!(
                    "`burst` applies to token_bucket and gcra only, not {}",
                    raw.algorithm
                ),
            );
        }
        let burst = if bursty {
            raw.burst.unwrap_or(raw.limit)
        } else {
            raw.limit
        };
        let cost = raw.cost.unwrap_or(1);
        if cost == 0 {
            self.error(&format!("{path}.cost"), "must be at least 1");
        } else if cost > burst && burst > 0 {
            let what = if bursty { "burst" } else { "limit" };
            self.error(
                &format!("{path}.cost"),
                format!("cost {cost} is above the {what} {burst}: no request could ever pass"),
            );
        }
        if bursty && raw.burst == Some(0) {
            self.error(&format!("{path}.burst"), "must be at least 1");
        }
        let params = Params {
            algorithm,
            limit: raw.limit,
            period_us,
            burst,
            cost,
        };
        if raw.limit > 0 && !algorithm::params_fit(&params) {
            self.error(path, "limit × period is too large to count exactly (keep limit × period in microseconds at most 2^49 for token_bucket and sliding_window: shorten the period or lower the limit)");
        }
        if algorithm == Algorithm::Gcra && raw.limit > 0 && period_us / raw.limit as i64 == 0 {
            self.error(&format!("{path}.limit"), "more than one request per microsecond cannot be metered: lower the limit or lengthen the period");
        }
        let key = match &raw.key {
            Some(key) => self.key(&format!("{path}.key"), key, identities)?,
            None => route_key.to_vec(),
        };
        let name = match &raw.name {
            Some(name) => {
                if !is_plain_name(name) {
                    self.error(
                        &format!("{path}.name"),
                        format!(
                            "`{name}` may use only letters, digits, `_`, `-` and `.` (at most 64)"
                        ),
                    );
                }
                name.clone()
            }
            None if siblings.len() == 1 => route_name.to_owned(),
            None => {
                let same_algorithm = siblings
                    .iter()
                    .filter(|l| l.algorithm.trim() == raw.algorithm.trim())
                    .count();
                if same_algorithm > 1 {
                    format!("{route_name}-{}-{}", raw.algorithm.trim(), index + 1)
                } else {
                    format!("{route_name}-{}", raw.algorithm.trim())
                }
            }
        };
        let scope = match raw.scope.as_deref() {
            None => default_scope,
            Some("global") => {
                if default_scope == Scope::Local {
                    self.error(&format!("{path}.scope"), "`global` needs a `store.redis` section: without one, limits live in this process only");
                }
                Scope::Global
            }
            Some("local") => Scope::Local,
            Some(other) => {
                self.error(&format!("{path}.scope"), format!("`{other}` is not allowed: use global (shared through Redis) or local (this instance)"));
                default_scope
            }
        };
        let on_limit = match raw.on_limit.as_deref() {
            None | Some("reject") => {
                if raw.max_delay.is_some() {
                    self.error(
                        &format!("{path}.max_delay"),
                        "only used with `on_limit: delay`",
                    );
                }
                OnLimit::Reject
            }
            Some("delay") => {
                if algorithm == Algorithm::Concurrency {
                    self.error(&format!("{path}.on_limit"), "concurrency limits cannot delay (when a slot frees up is unknown): use reject");
                }
                match raw.max_delay.as_deref() {
                    Some(d) => OnLimit::Delay {
                        max_delay: self.duration(
                            &format!("{path}.max_delay"),
                            Some(d),
                            Duration::from_secs(1),
                        ),
                    },
                    None => {
                        self.error(path, "`on_limit: delay` needs `max_delay` (the longest a request may wait, e.g. 500ms)");
                        OnLimit::Reject
                    }
                }
            }
            Some(other) => {
                self.error(&format!("{path}.on_limit"), format!("`{other}` is not allowed: use reject (429) or delay (wait up to max_delay)"));
                OnLimit::Reject
            }
        };
        let shadow = raw.shadow.unwrap_or(false);
        let block_for = self.block_for(path, raw, algorithm, shadow, on_limit);
        let by_response = self.by_response(path, raw, algorithm);
        let sync = self.sync(path, raw, algorithm, scope, block_for.is_some());
        Some(Limit {
            name,
            params,
            key,
            scope,
            on_limit,
            shadow,
            by_response,
            block_for,
            sync,
        })
    }

    /// `sync`: `exact` (None) or a duration, refused with the reason where local-first
    /// counting could not keep its bound.
    fn sync(
        &mut self,
        path: &str,
        raw: &RawLimit,
        algorithm: Algorithm,
        scope: Scope,
        blocks: bool,
    ) -> Option<Duration> {
        let text = raw.sync.as_deref()?.trim();
        if text == "exact" {
            return None;
        }
        let at = format!("{path}.sync");
        let sync = self.duration(&at, Some(text), Duration::from_millis(100));
        let refused = match algorithm {
            Algorithm::SlidingLog => Some("sliding_log keeps one entry per request, which a batch of usage cannot merge: use `sync: exact`, or sliding_window for local-first counting"),
            Algorithm::Concurrency => Some("a concurrency slot must be taken and given back atomically across replicas: use `sync: exact`"),
            // Without store.redis every limit is local and `sync` has nothing to share with:
            // accepted (it applies once the store is Redis), unless the limit says `local`.
            _ if scope == Scope::Local && raw.scope.is_some() => Some("a local limit is already decided in memory and shared with no one: remove `sync`"),
            _ if blocks => Some("a block (`block_for`) must be seen by every replica at once: use `sync: exact` with block_for"),
            _ if sync < Duration::from_millis(10) => Some("must be at least 10ms (use `sync: exact` for a decision per request)"),
            _ if sync > Duration::from_secs(60) => Some("must be at most 1m: the bound grows with the interval"),
            _ => None,
        };
        if let Some(reason) = refused {
            self.error(&at, reason);
            return None;
        }
        Some(sync)
    }

    /// `block_for`, refused with the reason where a block could not mean what it says.
    fn block_for(
        &mut self,
        path: &str,
        raw: &RawLimit,
        algorithm: Algorithm,
        shadow: bool,
        on_limit: OnLimit,
    ) -> Option<Duration> {
        let text = raw.block_for.as_deref()?;
        let at = format!("{path}.block_for");
        let block_for = self.duration(&at, Some(text), Duration::from_secs(1));
        let refused = if shadow {
            Some("a shadow limit never denies, so it cannot block anyone: remove `shadow: true` to enforce the limit, or remove `block_for`")
        } else if algorithm == Algorithm::Concurrency {
            Some("a concurrency limit denies only while its slots are taken, which says nothing about the caller's behaviour: use block_for on a rate limit")
        } else if matches!(on_limit, OnLimit::Delay { .. }) {
            Some("`on_limit: delay` makes a request over the limit wait instead of refusing it, and a block would start on the first one that has to wait: use `on_limit: reject` with block_for")
        } else if block_for < Duration::from_secs(1) {
            Some("must be at least 1s (Retry-After counts whole seconds)")
        } else if block_for.as_micros() > algorithm::MAX_PRODUCT as u128 {
            Some("is too long to count exactly in microseconds (keep it under 10 years)")
        } else {
            None
        };
        if let Some(reason) = refused {
            self.error(&at, reason);
            return None;
        }
        Some(block_for)
    }

    fn response(&mut self, raw: Option<&raw::RawResponse>) -> ResponseConfig {
        let mut config = ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            ietf: true,
            legacy: false,
        };
        let Some(raw) = raw else { return config };
        if let Some(status) = raw.status {
            match StatusCode::from_u16(status) {
                Ok(s) if s.is_client_error() || s.is_server_error() => config.status = s,
                _ => self.error("response.status", format!("{status} is not an error status: use a 4xx or 5xx code (429 is the standard one)")),
            }
        }
        if let Some(headers) = &raw.headers {
            config.ietf = false;
            for (i, h) in headers.iter().enumerate() {
                match h.as_str() {
                    "ietf" => config.ietf = true,
                    "legacy" => config.legacy = true,
                    other => self.error(&format!("response.headers[{i}]"), format!("`{other}` is not allowed: use ietf (RateLimit, RateLimit-Policy) and/or legacy (X-RateLimit-*)")),
                }
            }
        }
        config
    }
}

/// A CIDR, or a single address as a host network.
fn parse_net(text: &str) -> Option<ipnet::IpNet> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>().ok().or_else(|| {
        text.parse::<std::net::IpAddr>()
            .ok()
            .map(ipnet::IpNet::from)
    })
}

fn same_key(a: &[Arc<Identity>], b: &[Arc<Identity>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{parse, Config};

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn ok(extra: &str) -> Config {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |name| {
            (name == "SECRET").then(|| "s".to_string())
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn errors(extra: &str) -> String {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |_| None)
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn a_full_throttle_section_validates_into_runtime_types() {
        let c = ok("store:\n  redis: { url: \"redis://u:p@127.0.0.1:6379/2\", key_prefix: \"app:\", timeout: 20ms }\n  on_error: local\n\
client_ip: { trusted_proxies: [10.0.0.0/8, 192.168.1.1] }\n\
identities:\n  user:\n    - header: X-User-Id\n    - jwt: { claim: sub, secret_env: SECRET }\n    - bearer: {}\n    - cookie: s\n    - query: t\n    - path_segment: 2\n    - client_ip\n\
routes:\n  - name: reply\n    match: { path_prefix: /api/, methods: [post, PUT], host: api.example.com }\n    key: user\n    limits:\n      - { algorithm: sliding_log, limit: 5, period: 60s }\n      - { algorithm: gcra, limit: 30, period: 60s, burst: 15, name: reply-rate, shadow: true }\n      - { algorithm: fixed_window, limit: 1000, period: 1d, key: global, scope: local }\n      - { algorithm: token_bucket, limit: 10, period: 1s, on_limit: delay, max_delay: 500ms, cost: 2 }\n      - { algorithm: concurrency, limit: 4, lease_ttl: 30s }\n\
response: { status: 503, headers: [legacy] }\n");
        let t = &c.throttle;
        assert_eq!(
            t.store,
            StoreConfig::Redis(crate::config::RedisConfig::standalone(
                "redis://u:p@127.0.0.1:6379/2",
                Duration::from_millis(20)
            ))
        );
        assert_eq!(t.key_prefix, "app:");
        assert_eq!(t.on_error, OnError::Local);
        assert!(t.trusted_proxies.contains("10.2.3.4".parse().unwrap()));
        assert!(t.trusted_proxies.contains("192.168.1.1".parse().unwrap()));
        let route = &t.routes[0];
        assert_eq!(
            route.methods.as_deref(),
            Some(&[Method::POST, Method::PUT][..])
        );
        assert_eq!(route.host.as_deref(), Some("api.example.com"));
        assert!(!route.limits.shared_key, "one limit is keyed by `global`");
        let names: Vec<&str> = route.limits.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "reply-sliding_log",
                "reply-rate",
                "reply-fixed_window",
                "reply-token_bucket",
                "reply-concurrency"
            ]
        );
        assert_eq!(route.limits[1].params.burst, 15);
        assert!(route.limits[1].shadow);
        assert_eq!(route.limits[2].scope, Scope::Local);
        assert_eq!(route.limits[0].scope, Scope::Global);
        assert_eq!(
            route.limits[3].on_limit,
            OnLimit::Delay {
                max_delay: Duration::from_millis(500)
            }
        );
        assert_eq!(route.limits[3].params.burst, 10, "burst defaults to limit");
        assert_eq!(
            route.limits[4].params.period_us, 30_000_000,
            "lease_ttl is the concurrency period"
        );
        assert_eq!(t.response.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!t.response.ietf && t.response.legacy);
        let user = &route.limits[0].key[0];
        assert_eq!(user.sources.len(), 7);
    }

    #[test]
    fn without_a_store_limits_are_local_and_the_single_limit_takes_the_route_name() {
        let c = ok("routes:\n  - name: login\n    match: { path_prefix: /login }\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m }\n");
        let t = &c.throttle;
        assert_eq!(t.store, StoreConfig::Memory);
        assert_eq!(t.routes[0].limits[0].name, "login");
        assert_eq!(t.routes[0].limits[0].scope, Scope::Local);
        assert_eq!(
            t.routes[0].limits[0].key[0].name, "client_ip",
            "routes are keyed by client IP by default"
        );
        assert!(t.response.ietf);
    }

    #[test]
    fn what_cannot_work_is_refused_at_its_position() {
        let all = errors(
            "identities:\n  user:\n    - header: X-User\n\
routes:\n  - name: a\n    key: usr\n    limits:\n      - { algorithm: gcra, limit: 0, period: 1s }\n  - name: a\n    limits:\n      - { algorithm: token_bucket, limit: 5, period: 1s, burst: 2, cost: 3 }\n      - { algorithm: leaky, limit: 5, period: 1s }\n      - { algorithm: fixed_window, limit: 5 }\n      - { algorithm: concurrency, limit: 2, on_limit: delay, max_delay: 1s }\n      - { algorithm: fixed_window, limit: 5, period: 1s, scope: global }\n",
        );
        for expected in [
            "t.yaml:8:10: routes[0].key: unknown identity `usr`: defined are client_ip, global, user",
            "t.yaml:10:35: routes[0].limits[0].limit: must be at least 1",
            "t.yaml:11:11: routes[1].name: route name `a` is used twice",
            "t.yaml:13:74: routes[1].limits[0].cost: cost 3 is above the burst 2",
            "t.yaml:14:22: routes[1].limits[1].algorithm: `leaky` is not an algorithm: use one of fixed_window",
            "t.yaml:15:9: routes[1].limits[2]: missing `period`",
            "t.yaml:16:55: routes[1].limits[3].on_limit: concurrency limits cannot delay",
            "t.yaml:17:65: routes[1].limits[4].scope: `global` needs a `store.redis` section",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(
            all.lines().count(),
            8,
            "one error per mistake, no knock-on noise:\n{all}"
        );
    }

    #[test]
    fn block_for_is_read_shown_and_refused_where_it_makes_no_sense() {
        let c = ok("routes:\n  - name: login\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m, block_for: 10m }\n");
        let limit = &c.throttle.routes[0].limits[0];
        assert_eq!(limit.block_for, Some(Duration::from_secs(600)));
        assert_eq!(limit.block_us(), 600_000_000);
        assert_eq!(limit.describe(), "5 per 1m, local, block 10m once denied");

        let all = errors("routes:\n  - name: a\n    limits:\n      - { algorithm: gcra, limit: 5, period: 1s, shadow: true, block_for: 1m }\n      - { algorithm: concurrency, limit: 2, block_for: 1m }\n      - { algorithm: token_bucket, limit: 5, period: 1s, on_limit: delay, max_delay: 1s, block_for: 1m }\n      - { algorithm: fixed_window, limit: 5, period: 1s, block_for: 500ms }\n      - { algorithm: fixed_window, limit: 5, period: 1s, block_for: soon }\n");
        for expected in [
            "t.yaml:6:75: routes[0].limits[0].block_for: a shadow limit never denies",
            "t.yaml:7:56: routes[0].limits[1].block_for: a concurrency limit denies only while",
            "t.yaml:8:101: routes[0].limits[2].block_for: `on_limit: delay` makes a request",
            "t.yaml:9:69: routes[0].limits[3].block_for: must be at least 1s",
            "t.yaml:10:69: routes[0].limits[4].block_for: `soon` is not a duration",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(all.lines().count(), 5, "one error per mistake:\n{all}");
    }

    #[test]
    fn sync_is_read_shown_with_its_bound_and_refused_where_it_cannot_hold() {
        let store = "store:\n  redis: { url: \"redis://127.0.0.1:1\" }\n";
        let c = ok(&format!("{store}routes:\n  - name: api\n    limits:\n      - {{ algorithm: gcra, limit: 10, period: 1s, burst: 20, sync: 100ms }}\n  - name: exact\n    limits:\n      - {{ algorithm: fixed_window, limit: 5, period: 1m, sync: exact }}\n"));
        let limit = &c.throttle.routes[0].limits[0];
        assert_eq!(limit.sync, Some(Duration::from_millis(100)));
        assert_eq!(
            limit.describe(),
            "10 per 1s, burst 20, sync 100ms: admits at most burst 20 + refill + (R - 1) with R replicas; \
             a replica holding all the traffic gets at least 1/R of what is left per 100ms; \
             limit / R on each replica while Redis is down"
        );
        assert_eq!(c.throttle.routes[1].limits[0].sync, None);

        let all = errors(&format!("{store}routes:\n  - name: a\n    limits:\n      - {{ algorithm: sliding_log, limit: 5, period: 1s, sync: 100ms }}\n      - {{ algorithm: concurrency, limit: 2, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, scope: local, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, block_for: 1m, sync: 100ms }}\n      - {{ algorithm: token_bucket, limit: 5, period: 1s, sync: 1ms }}\n  - name: b\n    limits:\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 50, period: 1m }}\n"));
        for expected in [
            "routes[0].limits[0].sync: sliding_log keeps one entry per request",
            "routes[0].limits[1].sync: a concurrency slot must be taken",
            "routes[0].limits[2].sync: a local limit is already decided in memory",
            "routes[0].limits[3].sync: a block (`block_for`) must be seen",
            "routes[0].limits[4].sync: must be at least 10ms",
            "routes[1].limits: every limit of a route (or tier) needs the same `sync`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn store_identity_and_response_mistakes_are_explained() {
        let all = errors(
            "store:\n  redis: { url: \"http://x\", key_prefix: \"a{b}\" }\n  on_error: ignore\nclient_ip: { trusted_proxies: [10.0.0.0/33] }\n",
        );
        for expected in [
            "store.redis.url: `http://x` must start with redis:// or rediss://",
            "store.redis.key_prefix: must not contain `{`",
            "store.on_error: `ignore` is not allowed",
            "client_ip.trusted_proxies[0]: `10.0.0.0/33` is not a CIDR",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        let all = errors("identities:\n  tok:\n    - magic: x\n");
        assert!(
            all.starts_with(
                "t.yaml:5:7: identities.tok[0]: unknown variant `magic`, expected one of `header`"
            ),
            "{all}"
        );

        let all = errors(
            "client_ip: { trusted_proxies: [10.0.0.0/33] }\nidentities:\n  global:\n    - header: x\n  tok:\n    - jwt: { claim: sub }\n    - path_segment: 0\nresponse: { status: 200, headers: [fancy] }\n",
        );
        for expected in [
            "t.yaml:3:32: client_ip.trusted_proxies[0]: `10.0.0.0/33` is not a CIDR",
            "t.yaml:6:5: identities.global",
            "identities.global: `global` is built in",
            "identities.tok[0].jwt: give exactly one of `secret_env`",
            "identities.tok[1].path_segment: segments count from 1",
            "response.status: 200 is not an error status",
            "response.headers[0]: `fancy` is not allowed",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn policy_lists_every_limit_in_structured_field_syntax() {
        let c = ok("routes:\n  - name: r\n    limits:\n      - { algorithm: gcra, limit: 100, period: 60s, name: burst }\n      - { algorithm: fixed_window, limit: 1000, period: 1d, name: daily }\n      - { algorithm: concurrency, limit: 2, name: uploads }\n");
        assert_eq!(
            c.throttle.routes[0].limits.policy,
            "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400, \"uploads\";q=2;qu=\"concurrent-requests\""
        );
    }

    #[test]
    fn a_tier_keys_as_route_tilde_tier_and_shows_the_route() {
        let c = ok("identities:\n  user:\n    - header: x-user\nroutes:\n  - name: api\n    key: user\n    overrides:\n      - { name: partner, values: [p], limits: [ { algorithm: fixed_window, limit: 5, period: 1m } ] }\n    limits:\n      - { algorithm: fixed_window, limit: 2, period: 1m }\n");
        let route = &c.throttle.routes[0];
        assert_eq!(
            (route.limits.route.as_str(), route.limits.key_name.as_str()),
            ("api", "api")
        );
        let tier = &route.overrides[0].limits;
        assert_eq!(
            (tier.route.as_str(), tier.key_name.as_str()),
            ("api", "api~partner")
        );
        assert_eq!(tier.policy, "\"partner\";q=5;w=60");
        assert!(tier.shared_key);
    }

    #[test]
    fn jwt_secret_env_must_be_set() {
        let all = errors("identities:\n  u:\n    - jwt: { secret_env: NOT_SET_ANYWHERE_42 }\n");
        assert!(
            all.contains("environment variable `NOT_SET_ANYWHERE_42` (the HMAC secret) is not set"),
            "{all}"
        );
    }
}
