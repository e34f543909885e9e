//! Whether the Redis server keeps tollgate's state across its own restart, checked against
//! what the configuration keeps there that matters beyond a window of seconds.
//!
//! A Redis that persists nothing (`appendonly no` and `save ""`) hands every caller a fresh
//! quota when it restarts: harmless for a per-second limit, not for a month of counts (a
//! calendar window), a `block_for` penalty or an operator's override. So at start and every
//! time the store comes back, tollgate reads `CONFIG GET appendonly` and `CONFIG GET save`
//! (and whether overrides are in force) and logs a warning when such state is configured on
//! a server that persists nothing; the console's store panel shows the same. `CONFIG` may be
//! renamed, disabled or denied by an ACL (managed services do that): then the persistence is
//! "unknown", which is not an error and warns of nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::holder::Holder;
use crate::config::Throttle;
use crate::limit::redis_store::RedisStore;

/// What the server says about its persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persistence {
    /// `appendonly yes`: every write is logged (what deploy/ runs).
    Aof,
    /// RDB snapshots only (`save` rules): a restart loses the writes since the last one.
    Snapshots(String),
    /// Neither: a restart loses everything.
    Nothing,
    /// `CONFIG GET` was refused or answered nothing.
    Unknown,
}

impl Persistence {
    pub fn as_str(&self) -> &'static str {
        match self {
            Persistence::Aof => "aof",
            Persistence::Snapshots(_) => "snapshots",
            Persistence::Nothing => "none",
            Persistence::Unknown => "unknown",
        }
    }

    /// From the values of `appendonly` and `save` (None: not readable).
    pub fn from_settings(appendonly: Option<&str>, save: Option<&str>) -> Persistence {
        match (appendonly, save) {
            (Some(a), _) if a.eq_ignore_ascii_case("yes") => Persistence::Aof,
            (_, Some(save)) if !save.trim().is_empty() => Persistence::Snapshots(save.to_owned()),
            (Some(_), Some(_)) => Persistence::Nothing,
            _ => Persistence::Unknown,
        }
    }
}

/// Reads the server's persistence settings; never fails (see the module docs).
pub async fn read(redis: &RedisStore) -> Persistence {
    let appendonly = config_get(redis, "appendonly").await;
    let save = config_get(redis, "save").await;
    Persistence::from_settings(appendonly.as_deref(), save.as_deref())
}

/// `CONFIG GET name`: its value, None when refused or unknown.
async fn config_get(redis: &RedisStore, name: &str) -> Option<String> {
    let mut command = redis::cmd("CONFIG");
    command.arg("GET").arg(name);
    // A map in RESP3, pairs in RESP2: both read as a map.
    let reply = redis.command::<HashMap<String, String>>(&command).await;
    reply.ok().and_then(|mut m| m.remove(name))
}

/// What the configuration keeps in Redis that a restart without persistence would lose
/// beyond a short window: calendar windows and `block_for` penalties on global limits.
pub fn durable_state(throttle: &Throttle) -> Vec<&'static str> {
    let limits = || {
        throttle.routes.iter().flat_map(|r| {
            std::iter::once(&r.limits)
                .chain(r.tiers.iter().map(|t| &t.limits))
                .flat_map(|set| set.iter())
                .filter(|l| Holder::of(l, true).is_shared())
        })
    };
    let mut needs = Vec::new();
    if limits().any(|l| l.params.calendar.is_some()) {
        needs.push("calendar windows");
    }
    if limits().any(|l| l.block_for.is_some()) {
        needs.push("block_for penalties");
    }
    needs
}

#[derive(Default)]
struct State {
    /// From the configuration (see [`durable_state`]).
    needs: Vec<&'static str>,
    /// The overrides hash of the configuration's key prefix.
    overrides_hash: Option<String>,
    /// Overrides were in force at the last check.
    overrides: bool,
    /// None until the first check.
    server: Option<Persistence>,
}

impl State {
    fn warning(&self) -> Option<String> {
        if self.server != Some(Persistence::Nothing) {
            return None;
        }
        let mut what = self.needs.clone();
        if self.overrides {
            what.push("overrides");
        }
        if what.is_empty() {
            return None;
        }
        Some(format!(
            "the Redis store persists nothing (appendonly no, save \"\"): a restart of Redis \
             loses {} (every caller starts afresh); run Redis with appendonly yes",
            what.join(", ")
        ))
    }
}

/// The persistence check of one store, shared by its health probe (which checks) and the
/// configurations using it (which say what they keep there). Clones share it.
#[derive(Clone, Default)]
pub struct Check(Arc<Mutex<State>>);

impl Check {
    /// What a (new or reloaded) configuration keeps in Redis, and the hash its overrides are
    /// kept in (`control::overrides::hash_key`); warns at once when the server is already
    /// known to persist nothing and this adds to what it would lose.
    pub fn configure(&self, throttle: &Throttle, overrides_hash: String) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let before = state.warning();
        state.needs = durable_state(throttle);
        state.overrides_hash = Some(overrides_hash);
        let after = state.warning();
        if after.is_some() && after != before {
            tracing::warn!("{}", after.unwrap_or_default());
        }
    }

    /// Reads the server's settings (at connect and each time the store is back) and logs the
    /// warning if it applies.
    pub async fn check(&self, redis: &RedisStore) {
        let server = read(redis).await;
        let hash = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .overrides_hash
            .clone();
        let overrides = match hash {
            Some(hash) => redis
                .command::<u64>(redis::cmd("HLEN").arg(hash))
                .await
                .is_ok_and(|n| n > 0),
            None => false,
        };
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.server = Some(server.clone());
        state.overrides = overrides;
        match state.warning() {
            Some(warning) => tracing::warn!(persistence = server.as_str(), "{warning}"),
            None => tracing::info!(
                persistence = server.as_str(),
                "rate limit store persistence"
            ),
        }
    }

    /// For the console: the server's persistence (null before the first check) and the
    /// warning, if any.
    pub fn json(&self) -> Value {
        let state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        json!({
            "persistence": state.server.as_ref().map(|p| p.as_str()),
            "save": match &state.server {
                Some(Persistence::Snapshots(save)) => Some(save.as_str()),
                _ => None,
            },
            "warning": state.warning(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_is_read_from_appendonly_and_save() {
        let of = Persistence::from_settings;
        assert_eq!(of(Some("yes"), Some("")), Persistence::Aof);
        assert_eq!(of(Some("yes"), None), Persistence::Aof);
        assert_eq!(
            of(Some("no"), Some("3600 1")),
            Persistence::Snapshots("3600 1".into())
        );
        assert_eq!(of(Some("no"), Some("")), Persistence::Nothing);
        assert_eq!(of(Some("no"), Some("  ")), Persistence::Nothing);
        assert_eq!(of(None, None), Persistence::Unknown);
        assert_eq!(of(Some("no"), None), Persistence::Unknown);
        assert_eq!(of(None, Some("")), Persistence::Unknown);
    }

    #[test]
    fn only_durable_state_on_a_server_that_persists_nothing_warns() {
        let mut state = State {
            needs: vec!["calendar windows"],
            server: Some(Persistence::Nothing),
            ..State::default()
        };
        let warning = state.warning().unwrap();
        assert!(warning.contains("loses calendar windows"), "{warning}");
        state.overrides = true;
        assert!(state
            .warning()
            .unwrap()
            .contains("calendar windows, overrides"));
        for server in [
            Persistence::Aof,
            Persistence::Snapshots("60 1".into()),
            Persistence::Unknown,
        ] {
            state.server = Some(server);
            assert_eq!(state.warning(), None);
        }
        let nothing_durable = State {
            server: Some(Persistence::Nothing),
            ..State::default()
        };
        assert_eq!(nothing_durable.warning(), None);
    }
}
