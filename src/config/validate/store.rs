//! Validation of `store`: memory or Redis, the key prefix, and what a store failure means for
//! a request (`on_error`).

use super::redis::redis;
use super::validator::Validator;
use crate::config::model::{
    OnError, StoreConfig, DEFAULT_KEY_PREFIX, DEFAULT_MAX_KEYS_PER_ROUTE, DEFAULT_STORE_TIMEOUT,
};
use crate::config::raw::RawStore;

pub(super) fn store(v: &mut Validator, raw: Option<&RawStore>) -> (StoreConfig, String, OnError) {
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
            v.error("store.on_error", format!("`{other}` is not allowed: use allow (forward), deny (503) or local (decide in memory)"));
            OnError::Allow
        }
    };
    let Some(redis_raw) = &raw.redis else {
        return (StoreConfig::Memory, DEFAULT_KEY_PREFIX.into(), on_error);
    };
    let key_prefix = redis_raw
        .key_prefix
        .clone()
        .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
    if key_prefix.contains(['{', '}']) || key_prefix.chars().any(char::is_whitespace) {
        v.error(
            "store.redis.key_prefix",
            "must not contain `{`, `}` or whitespace (they would change Redis Cluster hash slots)",
        );
    }
    let redis = redis(v, redis_raw, DEFAULT_STORE_TIMEOUT);
    (StoreConfig::Redis(redis), key_prefix, on_error)
}

/// The most keys a route keeps in process memory: at least 16 (the memory store's shards), at
/// most 100,000,000.
const KEYS_PER_ROUTE: std::ops::RangeInclusive<u64> = 16..=100_000_000;

/// `store.max_keys_per_route`.
pub(super) fn max_keys_per_route(v: &mut Validator, raw: Option<&RawStore>) -> usize {
    match raw.and_then(|r| r.max_keys_per_route) {
        None => DEFAULT_MAX_KEYS_PER_ROUTE,
        Some(n) if KEYS_PER_ROUTE.contains(&n) => n as usize,
        Some(n) => {
            v.error(
                "store.max_keys_per_route",
                format!("`{n}` is out of range: write a number of keys from 16 to 100000000 (default {DEFAULT_MAX_KEYS_PER_ROUTE}: about 45 MB per flooded route, 120 MB with local-first limits)"),
            );
            DEFAULT_MAX_KEYS_PER_ROUTE
        }
    }
}
