//! One caller, named by an operator: read its state and reset it ("I'm being blocked").
//!
//! An operator knows a caller by the value it presents (an API key, a user id, an address),
//! not by store keys, so the keys are rebuilt from the route and that value exactly as the
//! request path builds them ([`keys::for_value`]): the route's own limits and every tier whose
//! values include it. State is read without consuming (the `peek` of either store, as
//! `explain --live` reads it); a running penalty box (`block_for`) is shown as a block: the
//! limit that started it, its end on the store's clock and its marker's key
//! ([`crate::limit::block_key`]). A reset deletes the keys of every limit, whatever the
//! algorithm, and their block markers, in memory and in Redis.
//!
//! Every replica also remembers recent denials in its deny cache ([`crate::throttle::deny_cache`]),
//! which would keep refusing the caller until the retry time. A reset therefore bumps a reset
//! generation in Redis (`<key_prefix>resets`) and announces it on the changes channel
//! ([`super::notify`]). Every replica watches the generation: at once when the announcement
//! arrives, and, as the fallback for a lost message, every [`WATCH_EVERY`] while its deny cache
//! holds anything and once a second otherwise (one `GET` on the store's own connection,
//! whatever the deployment); it clears the cache when the generation moved, and the cache
//! remembers nothing until the watch has read the generation once. The replica that
//! serves the reset clears its own cache at once. The watch is started with the deny cache of
//! each configuration ([`new_deny_cache`]), which the limit stage is then given.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::notify::{self, Topic};
use super::offenders::Offenders;
use super::results::{
    Block, CallerState, LimitRead, LimitState, LimitUnread, OverrideShown, ResetDone,
};
use crate::config::{Limit, LimitSet, StoreConfig, Throttle};
use crate::identity::client_ip::key_value;
use crate::limit::algorithm::Verdict;
use crate::limit::{Check, Store, StoreError};
use crate::store::{Holder, Shared, Stores};
use crate::throttle::deny_cache::{self, DenyCache};
use crate::throttle::overrides::{override_key, Overrides};
use crate::throttle::{keys, LimitStage};

/// How often a replica with remembered denials looks at the reset generation (the fallback
/// for a missed announcement).
pub const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Ticks of [`WATCH_EVERY`] between looks while nothing is remembered (once a second).
const IDLE_WATCH_TICKS: u32 = 20;

/// The key holding the reset generation: outside every limit's key space (those all have a
/// `{` right after the prefix).
pub fn generation_key(prefix: &str) -> String {
    format!("{prefix}resets")
}

/// Why a caller's state could not be read or reset.
#[derive(Debug, thiserror::Error)]
pub enum CallerError {
    #[error("no route named `{route}` (routes: {known})")]
    UnknownRoute { route: String, known: String },
    #[error("the identity value is empty")]
    EmptyIdentity,
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    #[error("the store is not connected yet")]
    NotConnected,
    #[error("{0}")]
    BadOverride(String),
    #[error("{max} overrides are in force already, the most there may be: remove one (DELETE /limits/override) or wait for one to expire")]
    TooManyOverrides { max: usize },
    #[error("the caller has no override in force on route `{route}`")]
    NoOverride { route: String },
    #[error("route `{route}` has no limit named `{name}` for this caller: write limit_name as one of {known}")]
    UnknownLimit {
        route: String,
        name: String,
        known: String,
    },
    #[error("`{form}` names a caller on route `{route}` whose value the store keeps only hashed (a bearer token, or a value longer than 64 bytes or with characters keys do not keep readable): name it by its value")]
    HashedShortForm { route: String, form: String },
    #[error("no caller on route `{route}` has the short form `{form}` (looked among the tiers' values, the overrides, the top offenders and the route's store keys): name it by its value")]
    UnknownShortForm { route: String, form: String },
    #[error("looking for the caller whose short form is `{form}` on route `{route}` took longer than {within:?}: name it by its value")]
    LookupTimedOut {
        route: String,
        form: String,
        within: std::time::Duration,
    },
}

/// What the operators' endpoints work on: the stores, the deny cache and the top-offenders
/// sketch of the running configuration (or, for `tollgate limits` against Redis, the store
/// alone).
#[derive(Clone)]
pub struct Control {
    pub throttle: Throttle,
    memory: Store,
    pub(super) redis: Option<Shared>,
    denials: Option<Arc<DenyCache>>,
    offenders: Option<Arc<Offenders>>,
    /// The limit stage's temporary overrides, applied here at once when changed here.
    pub(super) overrides: Option<Arc<Overrides>>,
}

/// The limits a caller is subject to on a route: the route's own, or a tier's.
pub(super) struct Target<'a> {
    tier: Option<String>,
    set: &'a LimitSet,
    /// Per limit, the candidate keys (usually one).
    keys: Vec<Vec<String>>,
}

/// What every limit of a caller's state is read with: the route, and the overrides in force
/// (as shown, and as the limit stage's table by store key).
struct Reading<'a> {
    route: &'a str,
    overrides: &'a [OverrideShown],
    table: &'a HashMap<String, crate::throttle::overrides::Active>,
}

/// A limit stage's deny cache, watched for resets when the store is Redis.
pub fn new_deny_cache(stores: &Stores, prefix: &str) -> Arc<DenyCache> {
    let denials = Arc::new(DenyCache::new(deny_cache::DEFAULT_CAPACITY));
    if let Some(redis) = stores.shared_slot() {
        watch_resets(redis, &denials, prefix);
    }
    denials
}

/// Starts the watch on the reset generation for `denials` (see the module docs). It ends when
/// the limit stage owning `denials` is gone. `denials` remembers nothing until the watch has
/// read the generation once.
fn watch_resets(redis: &Shared, denials: &Arc<DenyCache>, prefix: &str) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    denials.hold();
    let mut announced = notify::listen(redis, prefix, Topic::Resets);
    let redis = redis.downgrade();
    let denials: Weak<DenyCache> = Arc::downgrade(denials);
    let key = generation_key(prefix);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut listening = true;
        // The generation last seen. It is followed once a second while nothing is remembered
        // too, so that a denial remembered later is judged against a recent value (a reset
        // before that denial was remembered must not clear it, nor be missed after it).
        let mut last: Option<Option<u64>> = None;
        let mut idle_ticks = 0u32;
        let mut clear_again = false;
        loop {
            // An announced reset is read at once.
            let announcement = tokio::select! {
                _ = tick.tick() => false,
                heard = announced.recv(), if listening => {
                    listening = heard.is_some();
                    listening
                }
            };
            let Some(denials) = denials.upgrade() else {
                return;
            };
            // Until a first value was read (Redis may still be connecting) every tick reads:
            // the cache remembers nothing until then (a denial would have no value to be
            // judged against, and a reset in between would go unnoticed).
            if denials.is_empty() && !clear_again && last.is_some() && !announcement {
                idle_ticks += 1;
                if idle_ticks < IDLE_WATCH_TICKS {
                    continue;
                }
            }
            idle_ticks = 0;
            let Some(Store::Redis(store)) = redis.upgrade().and_then(|c| c.get().cloned()) else {
                continue;
            };
            let Ok(generation) = store
                .command::<Option<u64>>(redis::cmd("GET").arg(&key))
                .await
            else {
                continue;
            };
            if clear_again {
                // A decision asked just before the reset may have been remembered after the
                // first clearing: clear once more, a tick later.
                denials.clear();
                clear_again = false;
            }
            if last.is_some_and(|seen| seen != generation) {
                denials.clear();
                clear_again = true;
            }
            if last.is_none() {
                denials.judge_from_now();
            }
            last = Some(generation);
        }
    });
}

impl Control {
    /// The handle the admin endpoints use: the running configuration's stores and deny cache
    /// (from its limit stage), and the top-offenders sketch.
    pub fn new(stage: &LimitStage, offenders: Arc<Offenders>) -> Control {
        Control {
            throttle: stage.config().clone(),
            memory: stage.stores().memory().clone(),
            redis: stage.stores().shared_slot().cloned(),
            denials: Some(stage.denials().clone()),
            offenders: Some(offenders),
            overrides: Some(stage.overrides().clone()),
        }
    }

    /// For `tollgate limits` against Redis: no deny cache or sketch of its own.
    pub fn direct(throttle: Throttle, redis: Store) -> Control {
        Control {
            throttle,
            memory: Store::Memory(crate::limit::memory::MemoryStore::new()),
            redis: Some(Shared::connected(redis)),
            denials: None,
            offenders: None,
            overrides: None,
        }
    }

    pub fn offenders(&self) -> Option<&Offenders> {
        self.offenders.as_deref()
    }

    /// Whether limits live in this process only (then only a running instance knows them).
    pub fn memory_only(&self) -> bool {
        self.throttle.store == StoreConfig::Memory
    }

    pub(super) fn targets(&self, route: &str, raw: &[u8]) -> Result<Vec<Target<'_>>, CallerError> {
        if raw.is_empty() {
            return Err(CallerError::EmptyIdentity);
        }
        let Some(found) = self.throttle.routes.iter().find(|r| r.name == route) else {
            return Err(CallerError::UnknownRoute {
                route: route.to_owned(),
                known: self
                    .throttle
                    .routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let prefix = &self.throttle.key_prefix;
        // An IPv6 address as its keys hold it (grouped by `client_ip.ipv6_prefix`).
        let keyed = key_value(raw, self.throttle.trusted_proxies.ipv6_prefix());
        let mut targets = vec![Target {
            tier: None,
            set: &found.limits,
            keys: keys::for_value(prefix, &found.limits, &keyed),
        }];
        for tier in &found.tiers {
            if tier.values.iter().any(|v| v.as_bytes() == raw) {
                targets.push(Target {
                    tier: Some(tier.name.clone()),
                    set: &tier.limits,
                    keys: keys::for_value(prefix, &tier.limits, &keyed),
                });
            }
        }
        Ok(targets)
    }

    /// One `PING` through the shared store, timed: None without Redis (or not connected yet).
    pub async fn ping(&self) -> Option<Result<Duration, StoreError>> {
        let Some(Store::Redis(redis)) = self.redis.as_ref().and_then(Shared::get) else {
            return None;
        };
        let started = std::time::Instant::now();
        let answer = redis.command::<String>(&redis::cmd("PING")).await;
        Some(answer.map(|_| started.elapsed()))
    }

    /// What `limit` would say now to a request stored at `key`, consuming nothing (as
    /// `explain --live` reads it), from the store it lives in, as the limit stage decides it:
    /// under a temporary override in force on `key`, on the override's key with its limit. A
    /// running instance reads the stage's own table of overrides; the command line compiles
    /// the records in force in Redis the same way.
    pub async fn peek(&self, limit: &Limit, key: &str) -> Result<Verdict, CallerError> {
        let compiled;
        let table: &Overrides = match &self.overrides {
            Some(table) => table,
            None => {
                compiled = Overrides::default();
                compiled.replace(self.table_in_force().await?);
                &compiled
            }
        };
        let mut keys = [key.to_owned()];
        let overridden = table.rekey(&mut keys);
        let mut checks = [limit.check(&keys[0])];
        if overridden {
            table.apply(&mut checks);
        }
        let [check] = checks;
        let decision = match self.store_for(limit)? {
            Store::Memory(m) => m.peek(&[check]),
            Store::Redis(r) => r.peek(&[check]).await?,
        };
        Ok(decision.verdicts[0])
    }

    /// The store a limit lives in: memory for local limits and without Redis.
    fn store_for(&self, limit: &Limit) -> Result<Store, CallerError> {
        match &self.redis {
            Some(cell) if Holder::of(limit, true).is_shared() => {
                cell.get().cloned().ok_or(CallerError::NotConnected)
            }
            _ => Ok(self.memory.clone()),
        }
    }

    /// Per limit (and tier), what is left, read without consuming, and the overrides in
    /// force, as the admin endpoint and `tollgate limits get` show them; the caller's value
    /// and its keys as the route shows them.
    pub async fn state(&self, route: &str, raw: &[u8]) -> Result<CallerState, CallerError> {
        let targets = self.targets(route, raw)?;
        let shown = self.shown(route);
        // Temporary overrides in force change the caller's own limits (not shared ones), per
        // store key as the limit stage applies them.
        let (overrides, table) = self.override_table(route, raw).await?;
        let reading = Reading {
            route,
            overrides: &overrides,
            table: &table,
        };
        let mut limits = Vec::new();
        for target in &targets {
            for (limit, candidates) in target.set.iter().zip(&target.keys) {
                let store = self.store_for(limit)?;
                for store_key in candidates {
                    limits.push(
                        self.limit_state(&reading, target, limit, &store, store_key)
                            .await?,
                    );
                }
            }
        }
        Ok(CallerState {
            route: route.to_owned(),
            identity: shown.value(raw),
            display: shown.rules(),
            limits,
            first_override: overrides.first().cloned(),
            overrides,
        })
    }

    /// One limit's state at one of the caller's store keys, read without consuming (under
    /// the override in force on that key, if any).
    async fn limit_state(
        &self,
        reading: &Reading<'_>,
        target: &Target<'_>,
        limit: &Limit,
        store: &Store,
        store_key: &str,
    ) -> Result<LimitState, CallerError> {
        let shown = self.shown(reading.route);
        if self.offenders.is_none() && Holder::of(limit, true) == Holder::Memory {
            // Read straight from Redis (the CLI): a local limit lives in each proxy's memory,
            // out of reach from here.
            return Ok(LimitState::Unread(LimitUnread {
                tier: target.tier.clone(),
                limit_name: limit.name.clone(),
                algorithm: limit.params.algorithm.name().to_owned(),
                scope: "local".to_owned(),
                key: shown.key(target.set, store_key),
                unknown: "a local limit lives in each proxy's memory: ask an instance's admin listener (--admin URL)".to_owned(),
            }));
        }
        let active = reading
            .table
            .get(store_key)
            .filter(|a| a.key.is_some())
            .filter(|_| !everyones(identity_part(target.set, store_key)));
        let overridden = active.map(|a| a.adjust);
        // While overridden the caller counts on keys of its own.
        let instead = active.and_then(|a| a.key.clone());
        let store_key = instead.as_deref().unwrap_or(store_key);
        let check = Check {
            params: overridden.map_or(limit.params, |a| a.apply(limit.params)),
            ..limit.check(store_key)
        };
        let decision = match store {
            Store::Memory(m) => m.peek(&[check]),
            Store::Redis(r) => r.peek(&[check]).await?,
        };
        let v = decision.verdicts[0];
        let blocked = match limit.block_us() {
            0 => None,
            _ => running_block(store, store_key).await?,
        };
        let part = identity_part(target.set, store_key);
        let (source, identity) = shown.item(part);
        // The override that set this limit: one naming it, else one of them all.
        let by = overridden.and_then(|_| {
            let overrides = reading.overrides;
            overrides
                .iter()
                .rev()
                .find(|o| o.limit_name.as_deref() == Some(limit.name.as_str()))
                .or_else(|| overrides.iter().find(|o| o.limit_name.is_none()))
                .cloned()
        });
        let key = shown.key(target.set, store_key);
        Ok(LimitState::Read(Box::new(LimitRead {
            tier: target.tier.clone(),
            limit_name: limit.name.clone(),
            algorithm: limit.params.algorithm.name().to_owned(),
            scope: limit.scope.as_str().to_owned(),
            source,
            identity,
            shared_by_everyone: everyones(part),
            overridden: overridden.is_some(),
            by,
            configured_limit: limit.params.limit,
            allowed: v.allowed,
            limit: v.limit,
            remaining: v.remaining,
            reset_after_seconds: v.reset_after_us.max(0) as f64 / 1e6,
            retry_after_seconds: (!v.allowed).then(|| v.retry_after_us as f64 / 1e6),
            // The block this limit started (`block_for`): its marker is this limit's, so
            // the limit is the one that started it.
            blocked: blocked.map(|(until, now)| Block {
                by: limit.name.clone(),
                until: rfc3339(until),
                remaining_s: (until - now).max(0) as f64 / 1e6,
                key: crate::limit::block_key(&key),
            }),
            key,
        })))
    }

    /// Deletes the caller's state for every limit and tier (or, with `limit_name`, for the
    /// limits of that name only), in memory and in Redis, and lifts remembered denials (here
    /// at once, on the other replicas through the reset generation). Returns what was done.
    pub async fn reset(
        &self,
        route: &str,
        raw: &[u8],
        limit_name: Option<&str>,
    ) -> Result<ResetDone, CallerError> {
        let mut targets = self.targets(route, raw)?;
        if let Some(name) = limit_name {
            only_limit(&mut targets, route, name)?;
        }
        // A counter every caller shares (a limit keyed `global`) is not this caller's state:
        // resetting it would reset everyone. It is left alone, and listed as kept.
        let (mut kept, mut own): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
        for target in &targets {
            for k in target.keys.iter().flatten() {
                match everyones(identity_part(target.set, k)) {
                    true => kept.push(k),
                    false => own.push(k),
                }
            }
        }
        let doomed = self.doomed(&targets, &own);
        let gone = self.delete(&doomed).await?;
        if let Some(denials) = &self.denials {
            denials.clear();
        }
        let shown_keys = self.shown_keys(&targets, route);
        // In the order they were named: the limits' keys, their block markers, then the
        // override's keys; only those that were there (a count of everything deleted beside a
        // list of some keys said 3 and listed 2).
        let deleted: Vec<String> = doomed
            .iter()
            .filter(|k| gone.contains(k.as_str()))
            .map(|k| shown_keys.get(k).cloned().unwrap_or_else(|| k.clone()))
            .collect();
        Ok(ResetDone {
            route: route.to_owned(),
            identity: self.shown(route).value(raw),
            limit_name: limit_name.map(str::to_owned),
            reset: true,
            deleted: deleted.len(),
            keys: deleted,
            kept_shared_by_everyone: kept.into_iter().map(str::to_owned).collect(),
        })
    }

    /// Every key a reset deletes, in order: the caller's own keys (`own`), their block
    /// markers, then the keys counted on while an override is in force and their markers.
    fn doomed(&self, targets: &[Target<'_>], own: &[&str]) -> Vec<String> {
        // A running penalty box (`block_for`) is the caller's state too: its marker goes with
        // the limit's own key (same hash tag, so the same DEL). Every key's marker is
        // deleted, whatever the limit says now: a reload may have removed a `block_for` whose
        // block still runs.
        let markers = own.iter().map(|k| crate::limit::block_key(k));
        // So are the keys it counts on while a temporary override is in force (same hash tag
        // shape: the route's key name with a suffix).
        let prefix = &self.throttle.key_prefix;
        let overridden: Vec<String> = targets
            .iter()
            .flat_map(|t| {
                t.keys
                    .iter()
                    .flatten()
                    .filter(|k| !everyones(identity_part(t.set, k)))
                    .map(|k| override_key(prefix, &t.set.key_name, k))
            })
            .collect();
        let overridden_markers: Vec<String> = overridden
            .iter()
            .map(|k| crate::limit::block_key(k))
            .collect();
        own.iter()
            .map(|k| k.to_string())
            .chain(markers)
            .chain(overridden)
            .chain(overridden_markers)
            .collect()
    }

    /// Deletes `doomed` in memory and in Redis (and bumps the reset generation, announced to
    /// every replica): the keys that were there and are gone.
    async fn delete(&self, doomed: &[String]) -> Result<HashSet<String>, CallerError> {
        let mut gone: HashSet<String> = HashSet::new();
        if let Store::Memory(m) = &self.memory {
            gone.extend(
                doomed
                    .iter()
                    .filter(|k| m.remove(&[k.as_str()]) == 1)
                    .cloned(),
            );
        }
        let Some(cell) = &self.redis else {
            return Ok(gone);
        };
        let Some(Store::Redis(redis)) = cell.get() else {
            return Err(CallerError::NotConnected);
        };
        // One DEL per hash tag: the keys of one decision share it (one Cluster slot).
        let mut by_tag: Vec<(&str, Vec<&str>)> = Vec::new();
        for k in doomed {
            let tag = k
                .find('{')
                .and_then(|open| k[open..].find('}').map(|close| &k[open..open + close]))
                .unwrap_or(k);
            match by_tag.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, keys)) => keys.push(k),
                None => by_tag.push((tag, vec![k])),
            }
        }
        for (_, keys) in by_tag {
            let deleted: Vec<String> = redis
                .command(
                    redis::cmd("EVAL")
                        .arg(DELETE_LISTING)
                        .arg(keys.len())
                        .arg(keys),
                )
                .await?;
            gone.extend(deleted);
        }
        let prefix = &self.throttle.key_prefix;
        redis
            .command::<u64>(redis::cmd("INCR").arg(generation_key(prefix)))
            .await?;
        notify::publish(redis, prefix, Topic::Resets).await;
        Ok(gone)
    }

    /// Each of the caller's keys as the route shows it: the caller's part by the route's
    /// display rule, for the limits' keys, their block markers and the override's keys alike.
    fn shown_keys(&self, targets: &[Target<'_>], route: &str) -> HashMap<String, String> {
        let shown = self.shown(route);
        let prefix = &self.throttle.key_prefix;
        let mut shown_keys = HashMap::new();
        for target in targets {
            for k in target.keys.iter().flatten() {
                if everyones(identity_part(target.set, k)) {
                    continue;
                }
                let own = shown.key(target.set, k);
                let over = override_key(prefix, &target.set.key_name, k);
                let over_shown = override_key(prefix, &target.set.key_name, &own);
                shown_keys.insert(crate::limit::block_key(k), crate::limit::block_key(&own));
                shown_keys.insert(
                    crate::limit::block_key(&over),
                    crate::limit::block_key(&over_shown),
                );
                shown_keys.insert(over, over_shown);
                shown_keys.insert(k.to_string(), own);
            }
        }
        shown_keys
    }
}

/// Leaves only the limits named `name` in `targets` (the others' keys are emptied: an empty
/// candidate list deletes nothing), or says which names there are.
fn only_limit(targets: &mut [Target<'_>], route: &str, name: &str) -> Result<(), CallerError> {
    let known: Vec<&str> = targets
        .iter()
        .flat_map(|t| t.set.iter().map(|l| l.name.as_str()))
        .collect();
    if !known.contains(&name) {
        return Err(CallerError::UnknownLimit {
            route: route.to_owned(),
            name: name.to_owned(),
            known: known.join(", "),
        });
    }
    for target in targets {
        for (limit, keys) in target.set.iter().zip(target.keys.iter_mut()) {
            if limit.name != name {
                keys.clear();
            }
        }
    }
    Ok(())
}

/// Deletes KEYS (one hash tag: one Cluster slot) and replies those that existed, so that a
/// reset lists exactly what it deleted.
const DELETE_LISTING: &str = "local gone = {}\n\
    for _, key in ipairs(KEYS) do\n\
      if redis.call('DEL', key) == 1 then gone[#gone + 1] = key end\n\
    end\n\
    return gone";

/// The end of the block (`block_for`) running on the limit stored at `key`, and the store's
/// clock now (both store-clock microseconds, Unix time), read without consuming anything.
async fn running_block(store: &Store, key: &str) -> Result<Option<(i64, i64)>, CallerError> {
    match store {
        Store::Memory(m) => Ok(m.running_block(key)),
        Store::Redis(r) => {
            let until: Option<i64> = r
                .command(redis::cmd("GET").arg(crate::limit::block_key(key)))
                .await?;
            let Some(until) = until else {
                return Ok(None);
            };
            // The store's clock, which the marker's end is written in.
            let (seconds, micros): (i64, i64) = r.command(&redis::cmd("TIME")).await?;
            let now = seconds * 1_000_000 + micros;
            Ok((until > now).then_some((until, now)))
        }
    }
}

/// Store-clock microseconds (Unix time) as RFC 3339, to the second (`2026-11-26T12:40:00Z`).
fn rfc3339(micros: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// The identity part of one of `set`'s keys, whichever limit's (`header=alice`, `*`,
/// several joined by `|`): identity parts hold no `:`, `{` or `}` (see [`keys`]).
pub(super) fn identity_part<'k>(set: &LimitSet, key: &'k str) -> &'k str {
    if set.shared_key {
        // <prefix>{<key_name>|<identity>}:<limit>
        let inner = &key[key.find('{').map_or(0, |i| i + 1)..];
        let end = inner.find("}:").unwrap_or(inner.len());
        let start = inner[..end].find('|').map_or(end, |i| i + 1);
        &inner[start..end]
    } else {
        // <prefix>{<key_name>}:<limit>:<identity>
        key.rsplit(':').next().unwrap_or_default()
    }
}

/// Whether a key's identity part is the one every caller shares (`global`).
pub(super) fn everyones(identity: &str) -> bool {
    identity.split('|').all(|part| part == "*")
}
