//! Typed builders for the configuration a test starts tollgate with, rendered to the YAML the
//! binary reads (serde structs with the configuration file's own field names, see
//! docs/configuration.md), so a test says what it configures instead of assembling YAML text:
//!
//! ```ignore
//! let yaml = config()
//!     .upstream(&up.url())
//!     .store(store::redis(&redis.url()).timeout("500ms").on_error("deny"))
//!     .identity("user", [source::header("x-user")])
//!     .route(route("login").prefix("/login").methods(["POST"]).key("user")
//!         .limit(limit::sliding_log(5, "1m").block_for("15m")));
//! let proxy = proxy(yaml).start().await;
//! ```
//!
//! Only what is set is written, so an unset field keeps the binary's default. For a field
//! without a builder method, `set` adds one key to a section and `Config::raw` appends a YAML
//! fragment to the document; tests of parsing and validation errors keep writing YAML text,
//! because the text (and its line and column) is what they test.

use serde::{Serialize, Serializer};
use serde_yaml::{Mapping, Value};

/// A configuration listening on `127.0.0.1:0`; give it an upstream with `upstream(url)`.
pub fn config() -> Config {
    Config {
        listen: Listen::One("127.0.0.1:0".into()),
        ..Config::default()
    }
}

/// A route named `name` with no match (every request) and no limits yet.
pub fn route(name: &str) -> Route {
    Route {
        name: name.into(),
        ..Route::default()
    }
}

/// An allow list (top-level or a route's).
pub fn allow() -> Allow {
    Allow::default()
}

/// A route's tier: identity values with limits of their own.
pub fn tier(name: &str) -> Tier {
    Tier {
        name: Some(name.into()),
        ..Tier::default()
    }
}

#[derive(Serialize, Clone, Default)]
pub struct Config {
    listen: Listen,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<Admin>,
    upstream: Upstream,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_request_body: Option<Size>,
    #[serde(skip_serializing_if = "Option::is_none")]
    header_read_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shutdown_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http2_max_concurrent_streams: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_log: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<Store>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ip: Option<ClientIp>,
    #[serde(skip_serializing_if = "Identities::is_empty")]
    identities: Identities,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<Response>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow: Option<Allow>,
    #[serde(flatten)]
    extra: Mapping,
    /// YAML text appended to the rendered document.
    #[serde(skip)]
    raw: String,
}

impl Config {
    /// The YAML text the binary reads.
    pub fn yaml(&self) -> String {
        let mut text = serde_yaml::to_string(self).expect("a test configuration renders");
        text.push_str(&self.raw);
        text
    }

    /// One listening address (replaces the default `127.0.0.1:0`).
    pub fn listen(mut self, address: &str) -> Self {
        self.listen = Listen::One(address.into());
        self
    }

    /// One TLS listener on `address` with this certificate chain and key (PEM files).
    pub fn listen_tls(mut self, address: &str, cert: &str, key: &str) -> Self {
        self.listen = Listen::Many(vec![Listener {
            address: address.into(),
            tls: Tls {
                cert: cert.into(),
                key: key.into(),
            },
        }]);
        self
    }

    pub fn admin(mut self, address: &str) -> Self {
        self.admin = Some(Admin::Address(address.into()));
        self
    }

    /// No admin listener.
    pub fn without_admin(mut self) -> Self {
        self.admin = None;
        self
    }

    /// An admin listener whose mutations need the bearer token in the variable `token_env`.
    pub fn admin_with_token(mut self, address: &str, token_env: &str) -> Self {
        self.admin = Some(Admin::Full {
            address: address.into(),
            token_env: token_env.into(),
        });
        self
    }

    pub fn upstream(mut self, url: &str) -> Self {
        self.upstream.url = url.into();
        self
    }

    pub fn connect_timeout(mut self, duration: &str) -> Self {
        self.upstream.connect_timeout = Some(duration.into());
        self
    }

    /// `upstream.timeout`: the wait for the response head.
    pub fn upstream_timeout(mut self, duration: &str) -> Self {
        self.upstream.timeout = Some(duration.into());
        self
    }

    /// `upstream.host`: `preserve` or `upstream`.
    pub fn upstream_host(mut self, host: &str) -> Self {
        self.upstream.host = Some(host.into());
        self
    }

    /// `upstream.http2: true`.
    pub fn http2(self) -> Self {
        self.upstream_http2(true)
    }

    pub fn upstream_http2(mut self, on: bool) -> Self {
        self.upstream.http2 = Some(on);
        self
    }

    pub fn pool_idle_timeout(mut self, duration: &str) -> Self {
        self.upstream.pool_idle_timeout = Some(duration.into());
        self
    }

    pub fn ca_file(mut self, path: &str) -> Self {
        self.upstream.ca_file = Some(path.into());
        self
    }

    /// A size: a number of bytes, or text such as `1KiB`.
    pub fn max_request_body(mut self, size: impl Into<Size>) -> Self {
        self.max_request_body = Some(size.into());
        self
    }

    pub fn header_read_timeout(mut self, duration: &str) -> Self {
        self.header_read_timeout = Some(duration.into());
        self
    }

    pub fn idle_timeout(mut self, duration: &str) -> Self {
        self.idle_timeout = Some(duration.into());
        self
    }

    pub fn shutdown_timeout(mut self, duration: &str) -> Self {
        self.shutdown_timeout = Some(duration.into());
        self
    }

    pub fn max_connections(mut self, n: u64) -> Self {
        self.max_connections = Some(n);
        self
    }

    pub fn workers(mut self, n: u64) -> Self {
        self.workers = Some(n);
        self
    }

    pub fn http2_max_concurrent_streams(mut self, n: u32) -> Self {
        self.http2_max_concurrent_streams = Some(n);
        self
    }

    pub fn access_log(mut self, on: bool) -> Self {
        self.access_log = Some(on);
        self
    }

    pub fn store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// `client_ip.trusted_proxies`.
    pub fn trusted_proxies<S: Into<String>>(mut self, cidrs: impl IntoIterator<Item = S>) -> Self {
        let ipv6_prefix = self.client_ip.take().and_then(|c| c.ipv6_prefix);
        self.client_ip = Some(ClientIp {
            trusted_proxies: cidrs.into_iter().map(Into::into).collect(),
            ipv6_prefix,
        });
        self
    }

    /// `client_ip.ipv6_prefix`.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.client_ip
            .get_or_insert_with(|| ClientIp {
                trusted_proxies: Vec::new(),
                ipv6_prefix: None,
            })
            .ipv6_prefix = Some(bits);
        self
    }

    /// A named identity: its sources, tried in order.
    pub fn identity(mut self, name: &str, sources: impl IntoIterator<Item = Source>) -> Self {
        self.identities
            .0
            .push((name.into(), sources.into_iter().collect()));
        self
    }

    /// An identity's `on_invalid` (`reject` or `client_ip`); the identity is added with
    /// [`Config::identity`].
    pub fn on_invalid(mut self, identity: &str, on_invalid: &str) -> Self {
        self.identities.1.push((identity.into(), on_invalid.into()));
        self
    }

    /// An identity's `display` (`clear`, `digest` or `last4`); the identity is added with
    /// [`Config::identity`].
    pub fn display(mut self, identity: &str, display: &str) -> Self {
        self.identities.2.push((identity.into(), display.into()));
        self
    }

    /// A route, after those already added (the first match wins).
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    pub fn routes(mut self, routes: impl IntoIterator<Item = Route>) -> Self {
        self.routes.extend(routes);
        self
    }

    /// `response.status`.
    pub fn response_status(mut self, status: u16) -> Self {
        self.response.get_or_insert_with(Response::default).status = Some(status);
        self
    }

    /// `response.headers`: `ietf` and/or `legacy`; none for `[]`.
    pub fn response_headers<S: Into<String>>(mut self, kinds: impl IntoIterator<Item = S>) -> Self {
        self.response.get_or_insert_with(Response::default).headers =
            Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    /// The top-level allow list (every route).
    pub fn allow(mut self, allow: Allow) -> Self {
        self.allow = Some(allow);
        self
    }

    /// Escape hatch: one top-level key without a builder method.
    pub fn set(mut self, key: &str, value: impl Serialize) -> Self {
        self.extra.insert(key.into(), to_value(value));
        self
    }

    /// Escape hatch: YAML text (whole top-level keys, ending in a newline) appended to the
    /// rendered document.
    pub fn raw(mut self, yaml: &str) -> Self {
        self.raw.push_str(yaml);
        self
    }
}

impl From<Config> for String {
    fn from(config: Config) -> String {
        config.yaml()
    }
}

impl From<&Config> for String {
    fn from(config: &Config) -> String {
        config.yaml()
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.yaml())
    }
}

fn to_value(value: impl Serialize) -> Value {
    serde_yaml::to_value(value).expect("a test configuration value renders")
}

#[derive(Serialize, Clone)]
#[serde(untagged)]
enum Listen {
    One(String),
    Many(Vec<Listener>),
}

impl Default for Listen {
    fn default() -> Self {
        Listen::One("127.0.0.1:0".into())
    }
}

/// A listener with TLS (plain ones are written as their address alone).
#[derive(Serialize, Clone)]
struct Listener {
    address: String,
    tls: Tls,
}

#[derive(Serialize, Clone)]
struct Tls {
    cert: String,
    key: String,
}

#[derive(Serialize, Clone)]
#[serde(untagged)]
enum Admin {
    Address(String),
    Full { address: String, token_env: String },
}

#[derive(Serialize, Clone, Default)]
struct Upstream {
    url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http2: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool_idle_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
}

/// `max_request_body`: a plain number of bytes or a size with a unit.
#[derive(Serialize, Clone)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl From<u64> for Size {
    fn from(n: u64) -> Size {
        Size::Bytes(n)
    }
}

impl From<&str> for Size {
    fn from(text: &str) -> Size {
        Size::Text(text.into())
    }
}

#[derive(Serialize, Clone)]
struct ClientIp {
    trusted_proxies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ipv6_prefix: Option<u8>,
}

#[derive(Serialize, Clone, Default)]
struct Response {
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Vec<String>>,
}

/// Named identities in the order they were added.
#[derive(Clone, Default)]
struct Identities(
    Vec<(String, Vec<Source>)>,
    Vec<(String, String)>,
    Vec<(String, String)>,
);

impl Identities {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Identities {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // An identity with an `on_invalid` or a `display` is written in its map form.
        serializer.collect_map(self.0.iter().map(|(name, sources)| {
            let setting = |list: &[(String, String)]| {
                list.iter().find(|(n, _)| n == name).map(|(_, o)| o.clone())
            };
            let (on_invalid, display) = (setting(&self.1), setting(&self.2));
            let value = match (on_invalid, display) {
                (None, None) => to_value(sources),
                (on_invalid, display) => {
                    let mut full = Mapping::new();
                    full.insert("sources".into(), to_value(sources));
                    if let Some(on_invalid) = on_invalid {
                        full.insert("on_invalid".into(), to_value(on_invalid));
                    }
                    if let Some(display) = display {
                        full.insert("display".into(), to_value(display));
                    }
                    Value::Mapping(full)
                }
            };
            (name, value)
        }))
    }
}

/// The `store` section: built by `store::memory`, `store::redis`, `store::cluster` or
/// `store::sentinel`.
#[derive(Serialize, Clone, Default)]
pub struct Store {
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<Redis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_keys_per_route: Option<u64>,
}

#[derive(Serialize, Clone, Default)]
struct Redis {
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sentinel: Option<Sentinel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<RedisTls>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    coalesce: Option<bool>,
}

#[derive(Serialize, Clone)]
struct Sentinel {
    master: String,
    nodes: Vec<String>,
}

#[derive(Serialize, Clone, Default)]
struct RedisTls {
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<String>,
}

pub mod store {
    //! Where limits live: `store::redis(url).timeout("500ms").on_error("deny")`.
    use super::{Redis, Sentinel, Store};

    /// A `store` section without Redis: limits in this process's memory.
    pub fn memory() -> Store {
        Store::default()
    }

    /// One Redis server.
    pub fn redis(url: &str) -> Store {
        with(Redis {
            url: Some(url.into()),
            ..Redis::default()
        })
    }

    /// The seed nodes of a Redis Cluster.
    pub fn cluster<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Store {
        with(Redis {
            cluster: Some(urls.into_iter().map(Into::into).collect()),
            ..Redis::default()
        })
    }

    /// A master watched by these Sentinels.
    pub fn sentinel<S: Into<String>>(master: &str, nodes: impl IntoIterator<Item = S>) -> Store {
        with(Redis {
            sentinel: Some(Sentinel {
                master: master.into(),
                nodes: nodes.into_iter().map(Into::into).collect(),
            }),
            ..Redis::default()
        })
    }

    fn with(redis: Redis) -> Store {
        Store {
            redis: Some(redis),
            ..Store::default()
        }
    }
}

impl Store {
    fn redis_mut(&mut self) -> &mut Redis {
        self.redis
            .as_mut()
            .expect("a Redis field on a store without Redis")
    }

    /// `max_keys_per_route`: the most keys a route keeps in process memory.
    pub fn max_keys_per_route(mut self, keys: u64) -> Self {
        self.max_keys_per_route = Some(keys);
        self
    }

    /// `on_error`: `allow`, `deny` or `local`.
    pub fn on_error(mut self, on_error: &str) -> Self {
        self.on_error = Some(on_error.into());
        self
    }

    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.redis_mut().key_prefix = Some(prefix.into());
        self
    }

    pub fn timeout(mut self, duration: &str) -> Self {
        self.redis_mut().timeout = Some(duration.into());
        self
    }

    /// `coalesce: true`.
    pub fn coalesce(mut self) -> Self {
        self.redis_mut().coalesce = Some(true);
        self
    }

    pub fn username(mut self, username: &str) -> Self {
        self.redis_mut().username = Some(username.into());
        self
    }

    pub fn password(mut self, password: &str) -> Self {
        self.redis_mut().password = Some(password.into());
        self
    }

    /// `tls.ca_file`.
    pub fn tls_ca_file(mut self, path: &str) -> Self {
        self.redis_mut()
            .tls
            .get_or_insert_with(RedisTls::default)
            .ca_file = Some(path.into());
        self
    }

    /// `tls.cert_file` and `tls.key_file`: a client certificate for mutual TLS.
    pub fn tls_client(mut self, cert_file: &str, key_file: &str) -> Self {
        let tls = self.redis_mut().tls.get_or_insert_with(RedisTls::default);
        tls.cert_file = Some(cert_file.into());
        tls.key_file = Some(key_file.into());
        self
    }
}

/// One source of an identity, as a list item of `identities.NAME`.
#[derive(Serialize, Clone)]
#[serde(transparent)]
pub struct Source(Value);

pub mod source {
    //! Identity sources: `source::header("x-user")`, `source::jwt(Jwt::hmac("sub", "ENV"))`.
    use super::{to_value, Jwt, Source};
    use serde_yaml::{Mapping, Value};

    fn one(kind: &str, value: Value) -> Source {
        let mut map = Mapping::new();
        map.insert(kind.into(), value);
        Source(Value::Mapping(map))
    }

    pub fn header(name: &str) -> Source {
        one("header", name.into())
    }

    pub fn query(name: &str) -> Source {
        one("query", name.into())
    }

    pub fn cookie(name: &str) -> Source {
        one("cookie", name.into())
    }

    /// A field of an `application/x-www-form-urlencoded` body.
    pub fn form(name: &str) -> Source {
        one("form", name.into())
    }

    /// `bearer: {}`.
    pub fn bearer() -> Source {
        one("bearer", Value::Mapping(Mapping::new()))
    }

    pub fn jwt(jwt: Jwt) -> Source {
        one("jwt", to_value(jwt))
    }

    /// The path's segment `n`, counting from 1.
    pub fn path_segment(n: usize) -> Source {
        one("path_segment", to_value(n))
    }

    /// The bare `client_ip`.
    pub fn client_ip() -> Source {
        Source("client_ip".into())
    }
}

/// A `jwt` source's fields.
#[derive(Serialize, Clone, Default)]
pub struct Jwt {
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    public_key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    audience: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leeway: Option<String>,
}

impl Jwt {
    /// `claim` verified with the HMAC secret held in the variable `secret_env`.
    pub fn hmac(claim: &str, secret_env: &str) -> Jwt {
        Jwt {
            claim: Some(claim.into()),
            secret_env: Some(secret_env.into()),
            ..Jwt::default()
        }
    }

    /// `claim` verified with the public key in `public_key_file`.
    pub fn public_key(claim: &str, public_key_file: &str) -> Jwt {
        Jwt {
            claim: Some(claim.into()),
            public_key_file: Some(public_key_file.into()),
            ..Jwt::default()
        }
    }

    pub fn algorithm(mut self, algorithm: &str) -> Self {
        self.algorithm = Some(algorithm.into());
        self
    }

    pub fn issuer(mut self, issuer: &str) -> Self {
        self.issuer = Some(issuer.into());
        self
    }

    pub fn audience(mut self, audience: &str) -> Self {
        self.audience = Some(audience.into());
        self
    }

    pub fn leeway(mut self, duration: &str) -> Self {
        self.leeway = Some(duration.into());
        self
    }
}

/// An identity name, or several for a compound key.
#[derive(Serialize, Clone)]
#[serde(untagged)]
pub enum Key {
    One(String),
    Many(Vec<String>),
}

impl From<&str> for Key {
    fn from(name: &str) -> Key {
        Key::One(name.into())
    }
}

impl<const N: usize> From<[&str; N]> for Key {
    fn from(names: [&str; N]) -> Key {
        Key::Many(names.iter().map(|n| n.to_string()).collect())
    }
}

#[derive(Serialize, Clone, Default)]
pub struct Route {
    name: String,
    #[serde(rename = "match", skip_serializing_if = "Match::is_empty")]
    matcher: Match,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Key>,
    limits: Vec<Limit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow: Option<Allow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    overrides: Vec<Tier>,
    #[serde(flatten)]
    extra: Mapping,
}

#[derive(Serialize, Clone, Default)]
struct Match {
    #[serde(skip_serializing_if = "Option::is_none")]
    path_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    case: Option<String>,
}

impl Match {
    fn is_empty(&self) -> bool {
        self.path_prefix.is_none()
            && self.methods.is_none()
            && self.host.is_none()
            && self.case.is_none()
    }
}

impl Route {
    /// `match.path_prefix`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.matcher.path_prefix = Some(prefix.into());
        self
    }

    /// `match.methods`.
    pub fn methods<S: Into<String>>(mut self, methods: impl IntoIterator<Item = S>) -> Self {
        self.matcher.methods = Some(methods.into_iter().map(Into::into).collect());
        self
    }

    /// `match.host`.
    pub fn host(mut self, host: &str) -> Self {
        self.matcher.host = Some(host.into());
        self
    }

    /// `match.case`: `sensitive` or `insensitive`.
    pub fn case(mut self, case: &str) -> Self {
        self.matcher.case = Some(case.into());
        self
    }

    /// The identity (or identities, for a compound key) the route's limits are keyed by.
    pub fn key(mut self, key: impl Into<Key>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// One more limit, after those already added.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    pub fn limits(mut self, limits: impl IntoIterator<Item = Limit>) -> Self {
        self.limits.extend(limits);
        self
    }

    /// The route's own allow list.
    pub fn allow(mut self, allow: Allow) -> Self {
        self.allow = Some(allow);
        self
    }

    /// One more entry of `overrides`.
    pub fn tier(mut self, tier: Tier) -> Self {
        self.overrides.push(tier);
        self
    }

    /// Escape hatch: one route key without a builder method.
    pub fn set(mut self, key: &str, value: impl Serialize) -> Self {
        self.extra.insert(key.into(), to_value(value));
        self
    }
}

/// An entry of a route's `overrides`.
#[derive(Serialize, Clone, Default)]
pub struct Tier {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<String>,
    values: Vec<String>,
    limits: Vec<Limit>,
}

impl Tier {
    /// The identity whose values `values` lists (default: the route's key).
    pub fn identity(mut self, identity: &str) -> Self {
        self.identity = Some(identity.into());
        self
    }

    pub fn values<S: Into<String>>(mut self, values: impl IntoIterator<Item = S>) -> Self {
        self.values.extend(values.into_iter().map(Into::into));
        self
    }

    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }
}

/// Callers never limited: by client address, or by an identity's value.
#[derive(Serialize, Clone, Default)]
pub struct Allow {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    client_ips: Vec<String>,
    #[serde(skip_serializing_if = "AllowIdentities::is_empty")]
    identities: AllowIdentities,
}

#[derive(Clone, Default)]
struct AllowIdentities(Vec<(String, Vec<String>)>);

impl AllowIdentities {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for AllowIdentities {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, values)| (name, values)))
    }
}

impl Allow {
    pub fn client_ips<S: Into<String>>(mut self, cidrs: impl IntoIterator<Item = S>) -> Self {
        self.client_ips.extend(cidrs.into_iter().map(Into::into));
        self
    }

    /// Values of the identity `name` that are never limited.
    pub fn identity<S: Into<String>>(
        mut self,
        name: &str,
        values: impl IntoIterator<Item = S>,
    ) -> Self {
        self.identities
            .0
            .push((name.into(), values.into_iter().map(Into::into).collect()));
        self
    }
}

/// An entry of `count_statuses`: a code, or a class such as `"5xx"`.
#[derive(Serialize, Clone)]
#[serde(untagged)]
pub enum Status {
    Code(u16),
    Class(String),
}

impl From<u16> for Status {
    fn from(code: u16) -> Status {
        Status::Code(code)
    }
}

impl From<&str> for Status {
    fn from(class: &str) -> Status {
        Status::Class(class.into())
    }
}

/// One entry of a route's (or tier's) `limits`: built by `limit::fixed_window(5, "1h")` and
/// its siblings.
#[derive(Serialize, Clone, Default)]
pub struct Limit {
    algorithm: String,
    limit: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<Key>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_delay: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count_statuses: Option<Vec<Status>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_from_response: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_for: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sync: Option<String>,
    #[serde(flatten)]
    extra: Mapping,
}

pub mod limit {
    //! Limits by algorithm: `limit::gcra(30, "1m").burst(10)`.
    use super::Limit;

    /// Any algorithm by its configuration name, with a period.
    pub fn new(algorithm: &str, limit: u64, period: &str) -> Limit {
        Limit {
            algorithm: algorithm.into(),
            limit,
            period: Some(period.into()),
            ..Limit::default()
        }
    }

    pub fn fixed_window(limit: u64, period: &str) -> Limit {
        new("fixed_window", limit, period)
    }

    pub fn sliding_log(limit: u64, period: &str) -> Limit {
        new("sliding_log", limit, period)
    }

    pub fn sliding_window(limit: u64, period: &str) -> Limit {
        new("sliding_window", limit, period)
    }

    pub fn token_bucket(limit: u64, period: &str) -> Limit {
        new("token_bucket", limit, period)
    }

    pub fn gcra(limit: u64, period: &str) -> Limit {
        new("gcra", limit, period)
    }

    /// `limit` requests in flight at once (no period).
    pub fn concurrency(limit: u64) -> Limit {
        Limit {
            algorithm: "concurrency".into(),
            limit,
            ..Limit::default()
        }
    }
}

impl Limit {
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// This limit's own key (default: the route's).
    pub fn key(mut self, key: impl Into<Key>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// `global` or `local`.
    pub fn scope(mut self, scope: &str) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// `on_limit: delay` with this `max_delay`.
    pub fn delay(mut self, max_delay: &str) -> Self {
        self.on_limit = Some("delay".into());
        self.max_delay = Some(max_delay.into());
        self
    }

    /// `on_limit` as written (`reject` or `delay`).
    pub fn on_limit(mut self, on_limit: &str) -> Self {
        self.on_limit = Some(on_limit.into());
        self
    }

    pub fn max_delay(mut self, duration: &str) -> Self {
        self.max_delay = Some(duration.into());
        self
    }

    /// `shadow: true`.
    pub fn shadow(mut self) -> Self {
        self.shadow = Some(true);
        self
    }

    pub fn lease_ttl(mut self, duration: &str) -> Self {
        self.lease_ttl = Some(duration.into());
        self
    }

    /// `count_statuses`: codes (`401`) and/or classes (`"5xx"`), one call per kind.
    pub fn count_statuses<S: Into<Status>>(
        mut self,
        statuses: impl IntoIterator<Item = S>,
    ) -> Self {
        self.count_statuses
            .get_or_insert_with(Vec::new)
            .extend(statuses.into_iter().map(Into::into));
        self
    }

    pub fn cost_from_response(mut self, header: &str) -> Self {
        self.cost_from_response = Some(header.into());
        self
    }

    pub fn block_for(mut self, duration: &str) -> Self {
        self.block_for = Some(duration.into());
        self
    }

    /// `exact` or an interval such as `100ms` (local-first).
    pub fn sync(mut self, sync: &str) -> Self {
        self.sync = Some(sync.into());
        self
    }

    /// Escape hatch: one limit key without a builder method.
    pub fn set(mut self, key: &str, value: impl Serialize) -> Self {
        self.extra.insert(key.into(), to_value(value));
        self
    }
}

/// One line, for assertion messages: the limit's fields as JSON.
impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let json = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&json)
    }
}
