//! Limits from evidence: per route (and tier), a bounded record of how fast each caller really
//! sends, and the limits that would refuse only a chosen share of callers (`GET
//! /limits/suggest`, `tollgate limits suggest`, the console's "Suggested limits" panel).
//!
//! On the request path: [`Suggest::observe`], one call after the limit stage decided, which
//! hashes the caller's key and counts in memory under one of [`SHARDS`] locks (see [`record`]
//! for what is counted and the memory bound: at most `SHARDS × record::CAPACITY` live
//! counters per route and tier, ~80 bytes each, plus 25 hours of histograms). Only requests
//! decided on a route with limits are counted (the caller is keyed as the route's first limit
//! keys it; an exempt caller is not counted): to learn a route without limits, give it a
//! `shadow: true` limit keyed the way it should be.
//!
//! Fleet-wide, through Redis: a background task publishes every [`PUBLISH_EVERY`] (a) this
//! replica's hours as histograms (one JSON string per replica, `<key_prefix>{suggest}.<replica
//! id>`, expiring [`SILENT_AFTER`] after its last publish, and a registry sorted set
//! `<key_prefix>{suggest}`; at most routes × 25 hours × 2 × [`hist::BUCKETS`] buckets), and
//! (b) what each caller's counters gained into the fleet's per-caller hashes ([`fleet`]). A
//! fleet query sums the replicas' histograms for the counts that add up (requests, refused
//! requests, evictions) and takes the callers' peaks, and who was refused, from the per-caller
//! hashes, so a caller spread over k replicas counts once at its fleet-wide rate. An hour
//! without a per-caller hash (published by an older version) is shown as the replicas'
//! histograms merged, per replica.
//!
//! The caller hash is keyed from the key prefix ([`Suggest::new`]), so every replica of a
//! fleet computes the same one; a record is carried over a reload only with the same prefix.

pub mod advice;
pub mod fleet;
pub mod hist;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::limit::redis_store::RedisStore;
use crate::limit::{new_lease_id, Store, StoreError};
pub use crate::store::replicas::unix_ms;
use crate::store::replicas::ReplicaRecords;
use crate::store::Shared;
use crate::throttle::{keys, AdmitReason, LimitOutcome};
use record::{Hour, RouteRecord, Seen};

pub use record::SHARDS;
/// How often a replica publishes its hours.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(5);
/// A replica not heard from for this long drops out of the fleet's view.
pub const SILENT_AFTER: Duration = Duration::from_secs(30);
/// The registry forgets ids older than this, and expires this long after the last publish.
const KEY_TTL: Duration = Duration::from_secs(120);
/// Replicas read at most.
const MAX_REPLICAS: usize = 256;

/// One replica's hours, by route (or `route~tier`) and clock hour: what it publishes.
pub type Snapshot = BTreeMap<String, BTreeMap<u32, Hour>>;

/// Route names come from the configuration, not from callers, so a fast hash with a
/// per-process seed is enough: this table is looked up on every limited request.
type Shard = HashMap<Box<str>, RouteRecord, foldhash::fast::RandomState>;

/// The record, shared by every configuration that keeps the same stores (as the offenders).
pub struct Suggest {
    shards: Vec<Mutex<Shard>>,
    /// Keys the caller hashes: the same in every replica with the same key prefix.
    hasher: foldhash::quality::FixedState,
    /// The key prefix the hasher is seeded from.
    prefix: String,
    link: Mutex<Option<(Shared, String)>>,
    publishing: AtomicBool,
    id: String,
}

impl Default for Suggest {
    fn default() -> Self {
        Suggest::new("")
    }
}

impl Suggest {
    /// A record whose caller hashes are keyed from `key_prefix` (a SHA-256 of it seeds the
    /// hash), as every replica under that prefix keys them.
    pub fn new(key_prefix: &str) -> Self {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("tollgate suggest {key_prefix}").as_bytes());
        let seed = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
        Suggest {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: foldhash::quality::FixedState::with_seed(seed),
            prefix: key_prefix.to_owned(),
            link: Mutex::new(None),
            publishing: AtomicBool::new(false),
            id: format!("{:016x}", new_lease_id()),
        }
    }
}

impl std::fmt::Debug for Suggest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suggest").field("id", &self.id).finish()
    }
}

/// Why a fleet view was asked for and this replica's record is shown.
pub const MEMORY_STORE: &str = "memory store: each replica records its own callers";

/// Which replicas' records a view covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Fleet,
    Local,
}

/// Every route's hours, merged over the replicas a view covers.
#[derive(Debug, Clone)]
pub struct Merged {
    pub view: View,
    /// Why a fleet view was asked for and this replica's is shown.
    pub reason: Option<&'static str>,
    pub replicas: usize,
    pub routes: Snapshot,
}

impl Suggest {
    /// Counts the request `outcome` decided, in `key_prefix` (see the module docs).
    pub fn observe(&self, key_prefix: &str, outcome: &LimitOutcome<'_>) {
        let (set, key, seen) = match outcome {
            LimitOutcome::Admitted(a) if a.reason != AdmitReason::Exempt => {
                let seen = match a.reason {
                    AdmitReason::ShadowLimited => Seen::Shadow,
                    _ => Seen::Admitted,
                };
                (a.set, &a.key, seen)
            }
            LimitOutcome::Limited(l) => (l.set, &l.key, Seen::Refused),
            _ => return,
        };
        let Some(item) = keys::identity_of(key_prefix, set, key) else {
            return;
        };
        self.count(&set.key_name, item, seen, unix_ms());
    }

    /// Counts one request of the caller `item` on `route` at `now_ms`.
    pub fn count(&self, route: &str, item: &str, seen: Seen, now_ms: u64) {
        let hash = self.hasher.hash_one(item);
        let shard = &self.shards[(hash % SHARDS as u64) as usize];
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        match shard.get_mut(route) {
            Some(record) => record.observe(hash, seen, now_ms),
            None => {
                let mut record = RouteRecord::new(record::CAPACITY);
                record.observe(hash, seen, now_ms);
                shard.insert(route.into(), record);
            }
        }
    }

    /// Live counters over every shard for `route` (tests check the bound).
    pub fn live(&self, route: &str) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.get(route).map_or(0, RouteRecord::live)
            })
            .sum()
    }

    /// This replica's hours, live counters folded in; ended hours are tidied on the way.
    pub fn snapshot(&self, now_ms: u64) -> Snapshot {
        let mut out = Snapshot::new();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.retain(|route, record| {
                record.tidy(now_ms);
                let hours = record.hours(now_ms);
                let keep = !hours.is_empty();
                merge_route(out.entry(route.to_string()).or_default(), &hours);
                keep
            });
        }
        out.retain(|_, hours| !hours.is_empty());
        out
    }

    /// Links the record to the configuration's store, as the offenders sketch is.
    pub fn link(self: &Arc<Self>, slot: Option<&Shared>, key_prefix: &str) {
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) =
            slot.map(|s| (s.clone(), key_prefix.to_owned()));
        if slot.is_some()
            && tokio::runtime::Handle::try_current().is_ok()
            && !self.publishing.swap(true, Ordering::Relaxed)
        {
            tokio::spawn(publish_loop(Arc::downgrade(self)));
        }
    }

    /// The key prefix the caller hashes are keyed from.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Every caller's gain since the last call, by route and hour (see [`fleet`]).
    fn deltas(&self) -> BTreeMap<(String, u32), Vec<record::Delta>> {
        let mut out: BTreeMap<(String, u32), Vec<record::Delta>> = BTreeMap::new();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (route, record) in shard.iter_mut() {
                for delta in record.take_deltas() {
                    out.entry((route.to_string(), delta.hour))
                        .or_default()
                        .push(delta);
                }
            }
        }
        out
    }

    /// Sends every caller's gain to the fleet's per-caller hashes (see [`fleet::send`]); a
    /// gain whose send failed is given back to go with the next (a send that timed out may
    /// have been applied: then it counts twice, which only raises that caller's peak).
    async fn send_deltas(&self, redis: &RedisStore, prefix: &str) -> Result<(), StoreError> {
        let deltas = self.deltas();
        let runs = deltas.iter().map(|((route, hour), d)| async move {
            (route, fleet::send(redis, prefix, route, *hour, d).await)
        });
        let mut result = Ok(());
        for (route, sent) in futures_util::future::join_all(runs).await {
            let Err((cause, unsent)) = sent else { continue };
            for delta in unsent {
                let shard = &self.shards[(delta.hash % SHARDS as u64) as usize];
                let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(record) = shard.get_mut(route.as_str()) {
                    record.unsend(delta);
                }
            }
            result = Err(cause);
        }
        result
    }

    fn linked(&self) -> Option<(Shared, String)> {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every route's hours in `view`: the fleet's merges every replica's latest publish (this
    /// one's as it is now) when the store is Redis and answers; otherwise this replica's.
    pub async fn merged(&self, view: View) -> Merged {
        let now = unix_ms();
        let local = |reason| Merged {
            view: View::Local,
            reason,
            replicas: 1,
            routes: self.snapshot(now),
        };
        if view == View::Local {
            return local(None);
        }
        let Some((slot, prefix)) = self.linked() else {
            return local(Some(MEMORY_STORE));
        };
        let Some(Store::Redis(redis)) = slot.get().cloned() else {
            return local(Some(crate::control::offenders::STORE_UNAVAILABLE));
        };
        // This replica's latest gains first, so the view has them as the histograms do.
        let sent = self.send_deltas(&redis, &prefix).await;
        let others = match sent.and(RECORDS.read::<Snapshot>(&redis, &prefix).await) {
            Ok(others) => others,
            Err(cause) => {
                tracing::warn!(%cause, "/limits/suggest: the fleet's records could not be read; answering with this replica's");
                return local(Some(crate::control::offenders::STORE_UNAVAILABLE));
            }
        };
        let mut routes = self.snapshot(now);
        let mut replicas = 1;
        for (id, snapshot) in others {
            if id == self.id {
                continue;
            }
            replicas += 1;
            for (route, hours) in snapshot {
                merge_route(routes.entry(route).or_default(), &hours);
            }
        }
        if let Err(cause) = per_caller(&redis, &prefix, &mut routes).await {
            tracing::warn!(%cause, "/limits/suggest: the fleet's per-caller records could not be read; answering with this replica's");
            return local(Some(crate::control::offenders::STORE_UNAVAILABLE));
        }
        Merged {
            view: View::Fleet,
            reason: None,
            replicas,
            routes,
        }
    }
}

/// Takes every route's hours' callers (their peaks, and who was refused) from the fleet's
/// per-caller hashes where there is one: each caller once, at its fleet-wide rate.
async fn per_caller(
    redis: &RedisStore,
    prefix: &str,
    routes: &mut Snapshot,
) -> Result<(), StoreError> {
    let wanted: Vec<(String, u32)> = routes
        .iter()
        .flat_map(|(route, hours)| hours.keys().map(move |h| (route.clone(), *h)))
        .collect();
    let reads = wanted
        .iter()
        .map(|(route, hour)| fleet::read(redis, prefix, route, *hour));
    let found = futures_util::future::join_all(reads).await;
    for ((route, hour), callers) in wanted.into_iter().zip(found) {
        let Some(callers) = callers? else { continue };
        let Some(merged) = routes.get_mut(&route).and_then(|h| h.get_mut(&hour)) else {
            continue;
        };
        merged.minute = callers.minute;
        merged.second = callers.second;
        merged.refused_callers = callers.refused_callers;
        merged.shadow_callers = callers.shadow_callers;
        merged.evicted += callers.overflow;
    }
    Ok(())
}

fn merge_route(into: &mut BTreeMap<u32, Hour>, hours: &BTreeMap<u32, Hour>) {
    for (hour, record) in hours {
        into.entry(*hour).or_default().merge(record);
    }
}

/// Where the replicas' records live in Redis.
const RECORDS: ReplicaRecords = ReplicaRecords {
    tag: "suggest",
    silent_after: SILENT_AFTER,
    key_ttl: KEY_TTL,
    max_replicas: MAX_REPLICAS,
};

/// Publishes every [`PUBLISH_EVERY`] while linked to a connected Redis store (nothing while
/// the record is empty); ends when the record is dropped.
async fn publish_loop(suggest: Weak<Suggest>) {
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let Some(record) = suggest.upgrade() else {
            return;
        };
        let Some((slot, prefix)) = record.linked() else {
            continue;
        };
        let snapshot = record.snapshot(unix_ms());
        let id = record.id.clone();
        if snapshot.is_empty() {
            continue;
        }
        let Some(Store::Redis(redis)) = slot.get().cloned() else {
            continue;
        };
        let sent = record.send_deltas(&redis, &prefix).await;
        drop(record);
        match RECORDS
            .publish(&redis, &prefix, &id, &snapshot)
            .await
            .and(sent)
        {
            Ok(()) => failing = false,
            Err(cause) if !failing => {
                failing = true;
                tracing::warn!(%cause, "suggested limits: this replica's record could not be published; the fleet view misses it until Redis answers");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_kept_apart_and_shards_add_up() {
        let suggest = Suggest::default();
        let now = 1_800_000 * 3_600_000 + 5;
        for i in 0..200 {
            let item = format!("header=user-{i}");
            suggest.count("api", &item, Seen::Admitted, now);
            suggest.count("api", &item, Seen::Admitted, now + 1);
        }
        suggest.count("login", "header=x", Seen::Refused, now);
        let snapshot = suggest.snapshot(now + 2);
        let api: &Hour = snapshot["api"].values().next().unwrap();
        assert_eq!(api.minute.callers(), 200);
        assert_eq!(api.minute.requests(), 400);
        assert_eq!(api.minute.max(), 2);
        assert_eq!(
            snapshot["login"].values().next().unwrap().refused_callers,
            1
        );
        assert_eq!(suggest.live("api"), 200);
        // The published form reads back.
        let text = serde_json::to_string(&snapshot).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&text).unwrap(), snapshot);
    }
}
