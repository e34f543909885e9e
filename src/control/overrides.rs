//! Temporary overrides ("a customer asks for more"): one caller's limits on one route set to
//! `limit` units or multiplied by `multiply` until a time, on every replica.
//!
//! Where they are kept: with a Redis store, in the hash `<key_prefix>overrides` (field
//! `route` NUL `identity`, value the JSON [`Record`]), so every replica applies them and they
//! survive a restart of tollgate; with a memory store, in this process's memory (gone with the
//! process, like the limits' own state), applied by the limit stage at once. At most
//! [`MAX_OVERRIDES`] are in force at once: past that a new one is refused (expired ones are
//! dropped first).
//!
//! How replicas learn of them: the replica that serves the change applies it at once; every
//! change bumps `<key_prefix>overrides:gen` and is then announced on the changes channel
//! ([`super::notify`]), on which each limit stage with a Redis store listens: the others
//! reload the hash as soon as the announcement arrives (a round trip or two). Pub/sub may
//! lose a message (a replica reconnecting), so the watch also reads the generation every
//! [`REFRESH_EVERY`] and reloads the hash when it moved (one `GET` per tick otherwise, on the
//! store's own connection whatever the deployment), and reloads it whenever its subscription
//! is made again. The table the request path reads is keyed by store key
//! ([`crate::throttle::overrides`]), so it is rebuilt for each configuration, with that
//! configuration's keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::caller::{everyones, identity_part, CallerError, Control};
use super::notify::{self, Topic};
use crate::config::{LimitSet, Throttle};
use crate::identity::client_ip::key_value;
use crate::identity::key;
use crate::limit::redis_store::RedisStore;
use crate::limit::{params_fit, Store, StoreError};
use crate::store::{Shared, Stores};
use crate::throttle::keys;
use crate::throttle::overrides::{now_ms, override_key, Active, Adjust, Overrides};

/// The most overrides in force at once.
pub const MAX_OVERRIDES: usize = 10_000;
/// How often a replica looks at the overrides' generation (the fallback for a missed
/// announcement).
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// The longest an override may last: 30 days. An override is a temporary answer (an incident,
/// a trial); a caller that needs more for longer belongs in a tier of the configuration, which
/// is reviewed and versioned.
pub const MAX_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// The largest `multiply`.
pub const MAX_MULTIPLY: f64 = 1_000_000.0;

/// The hash holding the overrides: outside every limit's key space (those all have a `{`
/// right after the prefix).
pub fn hash_key(prefix: &str) -> String {
    format!("{prefix}overrides")
}

/// The generation bumped on every change of the overrides.
pub fn generation_key(prefix: &str) -> String {
    format!("{prefix}overrides:gen")
}

/// One override as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub route: String,
    /// The value the caller presents, as the operator gave it.
    pub identity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiply: Option<f64>,
    /// When it ends, in milliseconds since the Unix epoch.
    pub until_ms: u64,
}

impl Record {
    pub fn adjust(&self) -> Option<Adjust> {
        match (self.limit, self.multiply) {
            (Some(n), None) => Some(Adjust::Limit(n)),
            (None, Some(f)) => Some(Adjust::Multiply(f)),
            _ => None,
        }
    }

    fn field(&self) -> String {
        field(&self.route, &self.identity)
    }

    /// As the endpoints show it: the identity as logs show it, the end as RFC 3339 and as
    /// seconds from now.
    pub fn json(&self) -> Value {
        let left_ms = self.until_ms.saturating_sub(now_ms());
        json!({
            "route": self.route,
            "identity": key::display_value(self.identity.as_bytes()),
            "limit": self.limit,
            "multiply": self.multiply,
            "until": rfc3339(self.until_ms),
            "expires_in_seconds": left_ms as f64 / 1000.0,
        })
    }
}

fn field(route: &str, identity: &str) -> String {
    format!("{route}\0{identity}")
}

/// Milliseconds since the epoch as RFC 3339 (UTC, to the millisecond).
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The overrides of a memory store: this process's.
static MEMORY: Mutex<Vec<Record>> = Mutex::new(Vec::new());

fn memory() -> std::sync::MutexGuard<'static, Vec<Record>> {
    MEMORY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The overrides a limit stage for `throttle` applies: watched in Redis for a shared store,
/// this process's otherwise.
pub fn new_overrides(stores: &Stores, throttle: &Throttle) -> Arc<Overrides> {
    let overrides = Arc::new(Overrides::default());
    match stores.shared_slot() {
        Some(redis) => watch(redis, &overrides, throttle.clone()),
        None => overrides.replace(compile(throttle, &memory())),
    }
    overrides
}

/// Starts the watch on the overrides (see the module docs). It ends when the limit stage
/// owning `overrides` is gone.
fn watch(redis: &Shared, overrides: &Arc<Overrides>, throttle: Throttle) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let mut announced = notify::listen(redis, &throttle.key_prefix, Topic::Overrides);
    let redis = redis.downgrade();
    let overrides: Weak<Overrides> = Arc::downgrade(overrides);
    let generation = generation_key(&throttle.key_prefix);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(REFRESH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen: Option<Option<u64>> = None;
        // The table is rebuilt once its first entry has expired too, so that a table of
        // expired entries does not keep every request looking.
        let mut next_expiry = u64::MAX;
        let mut listening = true;
        loop {
            // An announcement is read at once, whatever the generation says; a tick reads the
            // hash only when the generation moved (a missed announcement).
            let announcement = tokio::select! {
                _ = tick.tick() => false,
                heard = announced.recv(), if listening => {
                    listening = heard.is_some();
                    listening
                }
            };
            let Some(overrides) = overrides.upgrade() else {
                return;
            };
            let Some(Store::Redis(store)) = redis.upgrade().and_then(|c| c.get().cloned()) else {
                continue;
            };
            let Ok(current) = store
                .command::<Option<u64>>(redis::cmd("GET").arg(&generation))
                .await
            else {
                continue;
            };
            if !announcement && seen == Some(current) && now_ms() < next_expiry {
                continue;
            }
            let Ok(records) = load(&store, &throttle.key_prefix).await else {
                continue;
            };
            let table = compile(&throttle, &records);
            next_expiry = table.values().map(|a| a.until_ms).min().unwrap_or(u64::MAX);
            overrides.replace(table);
            seen = Some(current);
        }
    });
}

/// Every override in the hash that parses (one that does not is ignored: written by a newer
/// version, or by hand).
async fn load(store: &RedisStore, prefix: &str) -> Result<Vec<Record>, StoreError> {
    let pairs: Vec<(String, String)> = store
        .command(redis::cmd("HGETALL").arg(hash_key(prefix)))
        .await?;
    Ok(pairs
        .into_iter()
        .filter_map(|(_, value)| serde_json::from_str::<Record>(&value).ok())
        .collect())
}

/// The sets a caller presenting `raw` is subject to on `route`: the route's own and every
/// tier whose values include it.
fn sets<'t>(throttle: &'t Throttle, route: &str, raw: &[u8]) -> Vec<&'t LimitSet> {
    let Some(found) = throttle.routes.iter().find(|r| r.name == route) else {
        return Vec::new();
    };
    std::iter::once(&found.limits)
        .chain(
            found
                .overrides
                .iter()
                .filter(|t| t.values.iter().any(|v| v.as_bytes() == raw))
                .map(|t| &t.limits),
        )
        .collect()
}

/// The store keys of `raw`'s own limits on `route` (not those every caller shares), with
/// each limit's params, name, and the key counted on while overridden.
fn caller_keys(
    throttle: &Throttle,
    route: &str,
    raw: &[u8],
) -> Vec<(String, crate::limit::Params, String, String)> {
    let mut out = Vec::new();
    // An IPv6 address as its keys hold it (grouped by `client_ip.ipv6_prefix`).
    let keyed = key_value(raw, throttle.trusted_proxies.ipv6_prefix());
    for set in sets(throttle, route, raw) {
        for (limit, candidates) in
            set.iter()
                .zip(keys::for_value(&throttle.key_prefix, set, &keyed))
        {
            for k in candidates {
                if !everyones(identity_part(set, &k)) {
                    let instead = override_key(&throttle.key_prefix, &set.key_name, &k);
                    out.push((k, limit.params, limit.name.clone(), instead));
                }
            }
        }
    }
    out
}

/// The table the limit stage reads, from the records in force.
pub fn compile(throttle: &Throttle, records: &[Record]) -> HashMap<String, Active> {
    let now = now_ms();
    let mut table = HashMap::new();
    for record in records.iter().filter(|r| r.until_ms > now) {
        let Some(adjust) = record.adjust() else {
            continue;
        };
        for (k, _, _, instead) in caller_keys(throttle, &record.route, record.identity.as_bytes()) {
            let until_ms = record.until_ms;
            table.insert(
                k,
                Active {
                    adjust,
                    until_ms,
                    key: Some(instead.clone()),
                },
            );
            table.insert(
                instead,
                Active {
                    adjust,
                    until_ms,
                    key: None,
                },
            );
        }
    }
    table
}

impl Control {
    /// Gives the caller `adjust` on `route` for `duration`, replacing any override it had
    /// there. Returns the override as the endpoints show it.
    pub async fn set_override(
        &self,
        route: &str,
        raw: &[u8],
        adjust: Adjust,
        duration: Duration,
    ) -> Result<Value, CallerError> {
        self.targets(route, raw)?;
        let identity = std::str::from_utf8(raw).map_err(|_| {
            CallerError::BadOverride("the identity value must be UTF-8 text".into())
        })?;
        let owned = caller_keys(&self.throttle, route, raw);
        if owned.is_empty() {
            return Err(CallerError::BadOverride(format!(
                "route `{route}` has no limit of the caller's own to override (only limits every caller shares)"
            )));
        }
        for (_, params, name, _) in &owned {
            if !params_fit(&adjust.apply(*params)) {
                return Err(CallerError::BadOverride(format!(
                    "the override would take limit `{name}` past what the store counts exactly: ask for less"
                )));
            }
        }
        let record = Record {
            route: route.to_owned(),
            identity: identity.to_owned(),
            limit: match adjust {
                Adjust::Limit(n) => Some(n),
                Adjust::Multiply(_) => None,
            },
            multiply: match adjust {
                Adjust::Multiply(f) => Some(f),
                Adjust::Limit(_) => None,
            },
            until_ms: now_ms().saturating_add(duration.as_millis() as u64),
        };
        let records = match self.redis_store()? {
            Some(redis) => {
                let prefix = &self.throttle.key_prefix;
                let mut records = load(&redis, prefix).await?;
                let now = now_ms();
                let expired: Vec<String> = records
                    .iter()
                    .filter(|r| r.until_ms <= now)
                    .map(Record::field)
                    .collect();
                if !expired.is_empty() {
                    redis
                        .command::<u64>(redis::cmd("HDEL").arg(hash_key(prefix)).arg(&expired))
                        .await?;
                }
                records.retain(|r| r.until_ms > now && r.field() != record.field());
                if records.len() >= MAX_OVERRIDES {
                    return Err(CallerError::TooManyOverrides { max: MAX_OVERRIDES });
                }
                redis
                    .command::<u64>(
                        redis::cmd("HSET")
                            .arg(hash_key(prefix))
                            .arg(record.field())
                            .arg(serde_json::to_string(&record).expect("JSON")),
                    )
                    .await?;
                redis
                    .command::<u64>(redis::cmd("INCR").arg(generation_key(prefix)))
                    .await?;
                notify::publish(&redis, prefix, Topic::Overrides).await;
                records.push(record.clone());
                records
            }
            None => {
                let mut records = memory();
                let now = now_ms();
                records.retain(|r| r.until_ms > now && r.field() != record.field());
                if records.len() >= MAX_OVERRIDES {
                    return Err(CallerError::TooManyOverrides { max: MAX_OVERRIDES });
                }
                records.push(record.clone());
                records.clone()
            }
        };
        self.apply_here(&records);
        Ok(json!({ "override": record.json() }))
    }

    /// Ends the caller's override on `route` now.
    pub async fn remove_override(&self, route: &str, raw: &[u8]) -> Result<Value, CallerError> {
        self.targets(route, raw)?;
        let wanted = field(route, &String::from_utf8_lossy(raw));
        let (removed, records) = match self.redis_store()? {
            Some(redis) => {
                let prefix = &self.throttle.key_prefix;
                let removed = redis
                    .command::<u64>(redis::cmd("HDEL").arg(hash_key(prefix)).arg(&wanted))
                    .await?
                    > 0;
                redis
                    .command::<u64>(redis::cmd("INCR").arg(generation_key(prefix)))
                    .await?;
                notify::publish(&redis, prefix, Topic::Overrides).await;
                (removed, load(&redis, prefix).await?)
            }
            None => {
                let mut records = memory();
                let before = records.len();
                records.retain(|r| r.field() != wanted);
                (records.len() < before, records.clone())
            }
        };
        if !removed {
            return Err(CallerError::NoOverride {
                route: route.to_owned(),
            });
        }
        self.apply_here(&records);
        Ok(json!({
            "route": route,
            "identity": key::display_value(raw),
            "removed": true,
        }))
    }

    /// The caller's override on `route` in force now, if any.
    pub async fn override_of(
        &self,
        route: &str,
        raw: &[u8],
    ) -> Result<Option<Record>, CallerError> {
        let wanted = field(route, &String::from_utf8_lossy(raw));
        let now = now_ms();
        let record = match self.redis_store()? {
            Some(redis) => redis
                .command::<Option<String>>(
                    redis::cmd("HGET")
                        .arg(hash_key(&self.throttle.key_prefix))
                        .arg(&wanted),
                )
                .await?
                .and_then(|value| serde_json::from_str::<Record>(&value).ok()),
            None => memory().iter().find(|r| r.field() == wanted).cloned(),
        };
        Ok(record.filter(|r| r.until_ms > now))
    }

    /// The connected Redis store, None for a memory store.
    fn redis_store(&self) -> Result<Option<RedisStore>, CallerError> {
        match &self.redis {
            None => Ok(None),
            Some(cell) => match cell.get() {
                Some(Store::Redis(redis)) => Ok(Some(redis.clone())),
                _ => Err(CallerError::NotConnected),
            },
        }
    }

    /// This replica applies `records` at once (the others on their next look).
    fn apply_here(&self, records: &[Record]) {
        if let Some(overrides) = &self.overrides {
            overrides.replace(compile(&self.throttle, records));
        }
    }
}

/// An override's or its removal's JSON as text.
pub fn override_text(done: &Value) -> String {
    if done["removed"].as_bool() == Some(true) {
        return format!(
            "override  route {} identity {}: removed\n",
            done["route"].as_str().unwrap_or("?"),
            done["identity"].as_str().unwrap_or("?")
        );
    }
    let o = &done["override"];
    let how = match (o["limit"].as_u64(), o["multiply"].as_f64()) {
        (Some(n), _) => format!("limit {n}"),
        (_, Some(f)) => format!("limit x{f}"),
        _ => "?".to_owned(),
    };
    format!(
        "override  route {} identity {}: {how} until {}\n",
        o["route"].as_str().unwrap_or("?"),
        o["identity"].as_str().unwrap_or("?"),
        o["until"].as_str().unwrap_or("?")
    )
}

/// `for` as given: a duration from one second to [`MAX_FOR`].
pub fn parse_for(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|d| *d >= Duration::from_secs(1) && *d <= MAX_FOR)
        .ok_or_else(|| {
            "`for` must be a duration from 1s to 30d (the longest an override lasts; for longer, a tier in the configuration), such as 30m, 24h or 7d".to_owned()
        })
}

/// `limit` as given: a whole number of units from 1.
pub fn parse_limit(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=crate::limit::MAX_SAFE as u64).contains(n))
        .ok_or_else(|| "`limit` must be a whole number from 1 (units per period)".to_owned())
}

/// `multiply` as given: a factor above 0, at most [`MAX_MULTIPLY`].
pub fn parse_multiply(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f > 0.0 && *f <= MAX_MULTIPLY)
        .ok_or_else(|| {
            "`multiply` must be a number above 0 and at most 1000000, such as 10 or 0.5".to_owned()
        })
}

/// Refuses a `multiply` that would turn a limit of `route` (or of one of its tiers) into
/// less than one unit per period: the store would round it up to 1, which is not what anyone
/// asked for (`multiply=0.0000001` on a monthly quota of 100 made it 1 per month). A limit
/// every caller shares is left alone by overrides, and so by this check. An unknown route is
/// the control side's to answer (404). The admin endpoint and `tollgate limits override`
/// straight to Redis both check here.
pub fn check_multiply(throttle: &Throttle, route: &str, adjust: Adjust) -> Result<(), String> {
    let Adjust::Multiply(factor) = adjust else {
        return Ok(());
    };
    let Some(route) = throttle.routes.iter().find(|r| r.name == route) else {
        return Ok(());
    };
    let sets = std::iter::once(&route.limits).chain(route.overrides.iter().map(|t| &t.limits));
    for limit in sets
        .flat_map(|set| set.iter())
        .filter(|l| !shared_by_everyone(l))
    {
        let units = limit.params.limit as f64 * factor;
        if units < 1.0 {
            return Err(format!(
                "multiply={factor} would make limit `{}` ({} per period) {units} units, less \
                 than 1: the smallest factor for route `{}` is {}",
                limit.name,
                limit.params.limit,
                route.name,
                smallest_factor(route)
            ));
        }
    }
    Ok(())
}

/// A limit every caller shares (`key: global`): overrides leave it alone.
fn shared_by_everyone(limit: &crate::config::Limit) -> bool {
    limit.key.iter().all(|identity| {
        identity
            .sources
            .iter()
            .all(|s| matches!(s, crate::identity::Source::Global))
    })
}

/// The smallest `multiply` that leaves every caller-keyed limit of `route` at 1 or more.
fn smallest_factor(route: &crate::config::Route) -> f64 {
    std::iter::once(&route.limits)
        .chain(route.overrides.iter().map(|t| &t.limits))
        .flat_map(|set| set.iter())
        .filter(|l| !shared_by_everyone(l))
        .map(|l| 1.0 / l.params.limit.max(1) as f64)
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_refused_outside_what_is_allowed() {
        assert_eq!(parse_for("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_for("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_for("30d"), Ok(MAX_FOR));
        for bad in [
            "", "0s", "500ms", "400d", "31d", "1y", "30d 1s", "soon", "-1h",
        ] {
            assert!(parse_for(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_limit("50"), Ok(50));
        for bad in ["0", "-1", "2.5", "", "x"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_multiply("10"), Ok(10.0));
        assert_eq!(parse_multiply("0.5"), Ok(0.5));
        for bad in ["0", "-2", "NaN", "inf", "2000000", ""] {
            assert!(parse_multiply(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_round_trip_and_show_their_end() {
        let record = Record {
            route: "api".into(),
            identity: "alice".into(),
            limit: None,
            multiply: Some(10.0),
            until_ms: 0,
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(
            text,
            r#"{"route":"api","identity":"alice","multiply":10.0,"until_ms":0}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), record);
        assert_eq!(record.json()["until"], "1970-01-01T00:00:00.000Z");
    }
}
