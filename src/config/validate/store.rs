//! Validation of `store`: memory or Redis, the key prefix, and what a store failure means for
//! a request (`on_error`).

use super::redis::redis;
use super::validator::Validator;
use crate::config::model::{OnError, StoreConfig, DEFAULT_KEY_PREFIX, DEFAULT_STORE_TIMEOUT};
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
