//! How to reach Redis: the deployment (one server, a Redis Cluster or a Sentinel-managed
//! master), the ACL credentials, the TLS material, the timeout and whether to coalesce.
//!
//! Defined here, next to the store that connects with it, rather than in the configuration:
//! the configuration validates `store.redis` and builds these settings (it shows them as
//! `config::RedisConfig`), so the limit engine never depends on the configuration.

use std::fmt;
use std::time::Duration;

/// Everything needed to connect to Redis (a validated `store.redis` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub mode: RedisMode,
    /// ACL user for the data nodes (overrides one written in the URLs).
    pub username: Option<String>,
    /// Password for the data nodes (overrides one written in the URLs).
    pub password: Option<Secret>,
    /// Certificates for `rediss://` connections; `None` means the Mozilla root certificates built into the binary (webpki-roots) and no
    /// client certificate.
    pub tls: Option<RedisTls>,
    /// Bounds connecting and every call.
    pub timeout: Duration,
    /// Send the decisions of concurrent requests together, in one script call (one server or
    /// Sentinel only): see `limit::coalesce`.
    pub coalesce: bool,
}

impl RedisSettings {
    /// One server at `url`, no extra credentials or certificates (tests, simple setups).
    pub fn standalone(url: impl Into<String>, timeout: Duration) -> RedisSettings {
        RedisSettings {
            mode: RedisMode::Standalone(url.into()),
            username: None,
            password: None,
            tls: None,
            timeout,
            coalesce: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisMode {
    /// `url`: one server (or a proxy in front of several).
    Standalone(String),
    /// `cluster`: seed nodes of a Redis Cluster; the client discovers the rest.
    Cluster(Vec<String>),
    /// `sentinel`: ask these Sentinels where the master called `master` is.
    Sentinel { master: String, nodes: Vec<String> },
}

/// PEM bytes read from the files named in `store.redis.tls`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and private key (mutual TLS).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// A password: compared in tests, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(hidden)")
    }
}
