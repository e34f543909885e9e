//! Everything the limiter needs, validated (`Throttle`): the store and what its failure means
//! (`StoreConfig`, `OnError`), client IP trust, the routes, the global allow-list and the shape
//! of limited responses (`ResponseConfig`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::route::{Allow, Route};
use crate::identity::TrustedProxies;
// What validation builds is the store's own connection settings type (the configuration
// depends on the limit engine, never the other way round); config shows it under this name.
pub use crate::limit::redis_settings::{RedisMode, RedisSettings as RedisConfig, RedisTls, Secret};

pub const DEFAULT_KEY_PREFIX: &str = "tollgate:";
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);
/// `store.max_keys_per_route` unless set: the memory store's and local-first's default.
pub const DEFAULT_MAX_KEYS_PER_ROUTE: usize = crate::limit::memory::DEFAULT_KEYS_PER_ROUTE;

/// Everything the limiter needs, validated.
#[derive(Debug, Clone)]
pub struct Throttle {
    pub store: StoreConfig,
    /// `store.max_keys_per_route`: the most keys a route (or tier) keeps in this process's
    /// memory (the memory store, local-first copies); a new key past it evicts a cold one.
    pub max_keys_per_route: usize,
    pub key_prefix: String,
    pub on_error: OnError,
    pub trusted_proxies: TrustedProxies,
    pub routes: Vec<Arc<Route>>,
    pub response: ResponseConfig,
    /// Callers never limited on any route.
    pub allow: Allow,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Limits live in this process only.
    Memory,
    /// Shared through Redis: one server, a Cluster or a Sentinel-managed master.
    Redis(RedisConfig),
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

impl OnError {
    /// As the file spells it (`store.on_error:`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        }
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct ResponseConfig {
    pub status: StatusCode,
    /// IETF RateLimit / RateLimit-Policy on allowed responses (always on limited ones).
    pub ietf: bool,
    /// X-RateLimit-Limit / -Remaining / -Reset.
    pub legacy: bool,
}
