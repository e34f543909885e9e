//! The configuration file exactly as written: serde structs with `deny_unknown_fields`, so a
//! misspelt key is an error naming the allowed ones. Nothing here is checked beyond its YAML
//! shape; `validate` turns these into runtime types.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub listen: RawListen,
    pub admin: Option<RawAdmin>,
    pub upstream: RawUpstream,
    pub max_request_body: Option<RawSize>,
    pub header_read_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub lingering_close: Option<RawLingeringClose>,
    pub shutdown_timeout: Option<String>,
    pub max_connections: Option<u64>,
    pub workers: Option<u64>,
    pub http2_max_concurrent_streams: Option<u32>,
    pub access_log: Option<bool>,
    pub store: Option<RawStore>,
    pub client_ip: Option<RawClientIp>,
    #[serde(default)]
    pub identities: indexmap_free::OrderedMap<RawIdentity>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    pub response: Option<RawResponse>,
    pub allow: Option<RawAllow>,
    pub usage: Option<RawUsage>,
    pub protect: Option<RawProtect>,
    pub tracing: Option<RawTracing>,
}

/// `tracing: { enabled, endpoint, protocol, headers, service_name, resource, sample_ratio,
/// timeout, queue_size, batch_size, interval, propagators, caller_context,
/// max_spans_per_second }`: OTLP trace export.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    #[serde(default)]
    pub headers: indexmap_free::OrderedMap<String>,
    pub service_name: Option<String>,
    #[serde(default)]
    pub resource: indexmap_free::OrderedMap<String>,
    pub sample_ratio: Option<f64>,
    pub timeout: Option<String>,
    pub queue_size: Option<u64>,
    pub batch_size: Option<u64>,
    pub interval: Option<String>,
    pub propagators: Option<Vec<String>>,
    pub caller_context: Option<String>,
    pub max_spans_per_second: Option<u64>,
}

/// `protect: { mode, latency, max_wait, min_limit, max_limit }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProtect {
    pub mode: Option<String>,
    pub latency: Option<String>,
    pub max_wait: Option<String>,
    pub min_limit: Option<u64>,
    pub max_limit: Option<u64>,
}

/// `usage: { path: /_quota }`: the path where a caller reads its own usage.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUsage {
    pub path: String,
}

/// `admin: "addr"` or `admin: {address, token_env, hosts}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawAdmin {
    Address(String),
    Full(RawAdminFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdminFull {
    pub address: String,
    pub token_env: Option<String>,
    /// Host names the admin listener answers besides addresses and `localhost`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The admin listener's own connection bounds, named as the proxy listener's.
    pub header_read_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_connections: Option<u64>,
}

/// `listen: "addr"`, `listen: ["addr", ...]` or a list of `{address, tls}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawListen {
    One(String),
    Many(Vec<RawListener>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawListener {
    Address(String),
    Full(RawListenerFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerFull {
    pub address: String,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub url: String,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub host: Option<String>,
    pub http2: Option<bool>,
    pub pool_idle_timeout: Option<String>,
    pub ca_file: Option<String>,
}

/// `lingering_close: { time, timeout, max_bytes }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLingeringClose {
    pub time: Option<String>,
    pub timeout: Option<String>,
    pub max_bytes: Option<RawSize>,
}

/// A size: `10MiB`, `512KB`, or a plain number of bytes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub redis: Option<RawRedis>,
    pub on_error: Option<String>,
    pub max_keys_per_route: Option<u64>,
}

/// Exactly one of `url` (one server), `cluster` (seed nodes) or `sentinel` is required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub url: Option<String>,
    pub cluster: Option<Vec<String>>,
    pub sentinel: Option<RawSentinel>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub tls: Option<RawRedisTls>,
    pub key_prefix: Option<String>,
    pub timeout: Option<String>,
    pub coalesce: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSentinel {
    pub master: String,
    pub nodes: Vec<String>,
}

/// TLS towards Redis (turned on by `rediss://` URLs or by this section).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedisTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientIp {
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub ipv6_prefix: Option<u8>,
}

/// One way of telling who is calling. Written as `- header: X-User-Id`, `- client_ip`, ...
/// (a one-key mapping or a bare name; serde_yaml's own enum form would need YAML tags).
/// An identity: its list of sources, or `{ sources: [...], on_invalid: reject | client_ip,
/// display: clear | digest | last4 }`.
#[derive(Debug)]
pub struct RawIdentity {
    pub sources: Vec<RawSource>,
    pub on_invalid: Option<String>,
    pub display: Option<String>,
    /// Whether it was written as a mapping (its sources' paths then go through `sources`).
    pub mapping: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentityFields {
    sources: Vec<RawSource>,
    on_invalid: Option<String>,
    display: Option<String>,
}

impl<'de> Deserialize<'de> for RawIdentity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{MapAccess, SeqAccess, Visitor};
        struct IdentityVisitor;
        impl<'de> Visitor<'de> for IdentityVisitor {
            type Value = RawIdentity;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a list of identity sources, or `{ sources: [...], on_invalid: reject, display: digest }`",
                )
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawIdentity, A::Error> {
                let mut sources = Vec::new();
                while let Some(source) = seq.next_element()? {
                    sources.push(source);
                }
                Ok(RawIdentity {
                    sources,
                    on_invalid: None,
                    display: None,
                    mapping: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawIdentity, A::Error> {
                let fields = RawIdentityFields::deserialize(
                    serde::de::value::MapAccessDeserializer::new(map),
                )?;
                Ok(RawIdentity {
                    sources: fields.sources,
                    on_invalid: fields.on_invalid,
                    display: fields.display,
                    mapping: true,
                })
            }
        }
        deserializer.deserialize_any(IdentityVisitor)
    }
}

#[derive(Debug)]
pub enum RawSource {
    Header(String),
    Query(String),
    /// A field of an `application/x-www-form-urlencoded` request body.
    Form(String),
    Cookie(String),
    Bearer,
    Jwt(RawJwt),
    PathSegment(usize),
    ClientIp,
}

const SOURCE_KINDS: &[&str] = &[
    "header",
    "query",
    "form",
    "cookie",
    "bearer",
    "jwt",
    "path_segment",
    "client_ip",
];

impl<'de> Deserialize<'de> for RawSource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error, MapAccess, Visitor};
        struct SourceVisitor;
        impl<'de> Visitor<'de> for SourceVisitor {
            type Value = RawSource;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an identity source: `header: NAME`, `query: NAME`, `form: NAME`, `cookie: NAME`, `bearer: {}`, `jwt: {...}`, `path_segment: N` or `client_ip`")
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<RawSource, E> {
                match v {
                    "client_ip" => Ok(RawSource::ClientIp),
                    "bearer" => Ok(RawSource::Bearer),
                    other => Err(E::unknown_variant(other, SOURCE_KINDS)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawSource, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(A::Error::custom(
                        "an identity source needs a kind, e.g. `header: X-User-Id`",
                    ));
                };
                let source = match kind.as_str() {
                    "header" => RawSource::Header(map.next_value()?),
                    "query" => RawSource::Query(map.next_value()?),
                    "form" => RawSource::Form(map.next_value()?),
                    "cookie" => RawSource::Cookie(map.next_value()?),
                    "bearer" => {
                        map.next_value::<Option<Empty>>()?;
                        RawSource::Bearer
                    }
                    "jwt" => RawSource::Jwt(map.next_value()?),
                    "path_segment" => RawSource::PathSegment(map.next_value()?),
                    "client_ip" => {
                        map.next_value::<Option<Empty>>()?;
                        RawSource::ClientIp
                    }
                    other => return Err(A::Error::unknown_variant(other, SOURCE_KINDS)),
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(A::Error::custom(
                        "one source per list item: start each with `- `",
                    ));
                }
                Ok(source)
            }
        }
        deserializer.deserialize_any(SourceVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    pub claim: Option<String>,
    pub algorithm: Option<String>,
    pub secret_env: Option<String>,
    pub public_key_file: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub key: Option<RawKey>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    pub allow: Option<RawAllow>,
    #[serde(default)]
    #[serde(rename = "overrides")]
    pub tiers: Vec<RawTier>,
    /// The protocols an `Upgrade` request may switch to (default: websocket).
    pub upgrades: Option<Vec<String>>,
    pub priority: Option<String>,
    /// Whether a method named in an override header (or query field) matches `methods`.
    pub method_override: Option<RawMethodOverride>,
}

/// `method_override: true | false | { headers: BOOL, query: NAME }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawMethodOverride {
    On(bool),
    Fields(RawMethodOverrideFields),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMethodOverrideFields {
    pub headers: Option<bool>,
    pub query: Option<String>,
}

/// Callers that are never limited: by client address, or by identity value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAllow {
    #[serde(default)]
    pub client_ips: Vec<String>,
    #[serde(default)]
    pub identities: indexmap_free::OrderedMap<Vec<String>>,
}

/// Named identity values that get their own limits on a route (a tier).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTier {
    pub name: Option<String>,
    pub identity: Option<String>,
    pub values: Vec<String>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    pub priority: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<String>>,
    pub host: Option<String>,
    /// `sensitive` (default) or `insensitive`.
    pub case: Option<String>,
    /// Header name → exact value.
    #[serde(default)]
    pub headers: indexmap_free::OrderedMap<String>,
}

/// An identity name, or a list of names for a compound key.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawKey {
    One(String),
    Many(Vec<String>),
}

impl RawKey {
    pub fn names(&self) -> Vec<String> {
        match self {
            RawKey::One(name) => vec![name.clone()],
            RawKey::Many(names) => names.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub algorithm: String,
    pub limit: u64,
    pub period: Option<String>,
    /// fixed_window only, instead of `period`: `day`, `week`, `month` or `year`.
    pub window: Option<String>,
    /// The IANA time zone a `window` turns in (UTC by default).
    pub timezone: Option<String>,
    pub burst: Option<u64>,
    pub cost: Option<u64>,
    pub key: Option<RawKey>,
    pub name: Option<String>,
    pub scope: Option<String>,
    pub on_limit: Option<String>,
    pub max_delay: Option<String>,
    pub shadow: Option<bool>,
    pub lease_ttl: Option<String>,
    pub count_statuses: Option<Vec<RawStatus>>,
    pub cost_from_response: Option<String>,
    pub block_for: Option<String>,
    /// `exact` (the default) or a duration: local-first, shared in batches every interval.
    pub sync: Option<String>,
}

/// One entry of `count_statuses`: a status code or a class such as `"5xx"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawStatus {
    Code(i64),
    Class(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponse {
    pub status: Option<u16>,
    pub headers: Option<Vec<String>>,
}

/// A mapping that keeps the file's order (identity sources are listed by name, and errors and
/// summaries read better in file order) without pulling in another map crate.
pub mod indexmap_free {
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    use std::fmt;
    use std::marker::PhantomData;

    #[derive(Debug)]
    pub struct OrderedMap<V>(pub Vec<(String, V)>);

    impl<V> Default for OrderedMap<V> {
        fn default() -> Self {
            OrderedMap(Vec::new())
        }
    }

    impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<V> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct OrderedVisitor<V>(PhantomData<V>);
            impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
                type Value = OrderedMap<V>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a mapping of names")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    let mut entries = Vec::new();
                    while let Some((key, value)) = map.next_entry::<String, V>()? {
                        entries.push((key, value));
                    }
                    Ok(OrderedMap(entries))
                }
            }
            deserializer.deserialize_map(OrderedVisitor(PhantomData))
        }
    }
}
