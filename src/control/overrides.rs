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

use super::caller::{everyones, identity_part, CallerError, Control};
use super::notify::{self, Topic};
use super::results::{OverrideDone, OverrideRemoved, OverrideShown, OverridesList, PlannedLimit};
use super::shown::Shown;
use crate::config::{LimitSet, Throttle};
use crate::identity::client_ip::key_value;
use crate::limit::redis_store::RedisStore;
use crate::limit::{params_fit, Params, Store, StoreError};
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
    /// The one limit it changes; None: every limit of the caller's on the route (see
    /// [`plan`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_name: Option<String>,
    /// Who set it (`token`, `loopback`, `cli`: [`super::audit::Who`]); None in records
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    /// When it was set, in milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_at_ms: Option<u64>,
    /// The replica (host and pid) that set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_on: Option<String>,
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
        field(&self.route, &self.identity, self.limit_name.as_deref())
    }

    /// As the endpoints show it: the identity as the route shows it ([`Shown`]), the end as
    /// RFC 3339 and as seconds from now, who set it and when.
    pub fn shown(&self, shown: &Shown) -> OverrideShown {
        let left_ms = self.until_ms.saturating_sub(now_ms());
        OverrideShown {
            route: self.route.clone(),
            identity: shown.value(self.identity.as_bytes()),
            limit_name: self.limit_name.clone(),
            limit: self.limit,
            multiply: self.multiply,
            until: rfc3339(self.until_ms),
            expires_in_seconds: left_ms as f64 / 1000.0,
            set_by: self.set_by.clone(),
            set_at: self.set_at_ms.map(rfc3339),
            set_on: self.set_on.clone(),
        }
    }
}

/// A record's field in the hash: `route` NUL `identity`, then NUL `limit_name` for an
/// override of one limit (so a caller may have one per limit beside one for all).
fn field(route: &str, identity: &str, limit_name: Option<&str>) -> String {
    match limit_name {
        Some(name) => format!("{route}\0{identity}\0{name}"),
        None => format!("{route}\0{identity}"),
    }
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

/// What an override does to one of the caller's own limits (not those every caller shares).
#[derive(Debug, Clone)]
pub struct Planned {
    /// The tier whose limit it is; None for the route's own.
    pub tier: Option<String>,
    pub limit_name: String,
    /// The limit as configured.
    pub before: Params,
    /// How it is changed; None: left alone.
    pub adjust: Option<Adjust>,
    /// Whether its new value was worked out in proportion (`multiply`, or `limit` without a
    /// limit name for every limit but the one it names) rather than given.
    pub scaled: bool,
    /// (usual key, key counted on while overridden), one per way the caller may be keyed.
    pub keys: Vec<(String, String)>,
}

impl Planned {
    /// As the override's answer lists it.
    pub fn shown(&self) -> PlannedLimit {
        let after = self.adjust.map_or(self.before, |a| a.apply(self.before));
        PlannedLimit {
            tier: self.tier.clone(),
            name: self.limit_name.clone(),
            period: humantime::format_duration(Duration::from_micros(
                self.before.period_us.max(0) as u64
            ))
            .to_string(),
            before: self.before.limit,
            after: after.limit,
            changed: self.adjust.is_some(),
            scaled: self.scaled,
        }
    }
}

/// The sets a caller presenting `raw` is subject to on `route`, with their tier's name: the
/// route's own and every tier whose values include it.
fn sets<'t>(
    throttle: &'t Throttle,
    route: &str,
    raw: &[u8],
) -> Vec<(Option<&'t str>, &'t LimitSet)> {
    let Some(found) = throttle.routes.iter().find(|r| r.name == route) else {
        return Vec::new();
    };
    std::iter::once((None, &found.limits))
        .chain(
            found
                .tiers
                .iter()
                .filter(|t| t.values.iter().any(|v| v.as_bytes() == raw))
                .map(|t| (Some(t.name.as_str()), &t.limits)),
        )
        .collect()
}

/// What `record` does to each of its caller's own limits, or why it cannot be applied (the
/// endpoints answer 400 with it).
///
/// With a limit name, `limit` or `multiply` applies to the limits of that name (the route's
/// and a tier's), the others are left alone. Without one, `multiply` scales every limit;
/// `limit: N` is for the limit with the shortest period (the one a caller meets first; the
/// first of them on a tie) and every other limit of its set is scaled in the same proportion
/// (N / that limit's), so "100 a minute" on a route that also has a monthly quota raises the
/// month as much, never turns it into 100 a month. A change that would leave a limit below 1
/// is refused.
pub fn plan(throttle: &Throttle, record: &Record) -> Result<Vec<Planned>, String> {
    let Some(adjust) = record.adjust() else {
        return Err("an override needs `limit` or `multiply`".to_owned());
    };
    let raw = record.identity.as_bytes();
    // An IPv6 address as its keys hold it (grouped by `client_ip.ipv6_prefix`).
    let keyed = key_value(raw, throttle.trusted_proxies.ipv6_prefix());
    let mut planned = Vec::new();
    for (tier, set) in sets(throttle, &record.route, raw) {
        let mut own = own_limits(throttle, tier, set, &keyed);
        adjust_own(&mut own, record.limit_name.as_deref(), adjust);
        planned.extend(own);
    }
    if planned.is_empty() {
        return Err(format!(
            "route `{}` has no limit of the caller's own to override (only limits every caller shares)",
            record.route
        ));
    }
    if let Some(name) = &record.limit_name {
        if !planned.iter().any(|p| &p.limit_name == name) {
            let mut names: Vec<&str> = planned.iter().map(|p| p.limit_name.as_str()).collect();
            names.dedup();
            return Err(format!(
                "route `{}` has no limit named `{name}` of the caller's own: write limit_name as one of {}",
                record.route,
                names.join(", ")
            ));
        }
    }
    check_plan(record, &planned)?;
    Ok(planned)
}

/// The limits of `set` keyed by the caller's own value `keyed` (not those every caller
/// shares), each left alone for now.
fn own_limits(
    throttle: &Throttle,
    tier: Option<&str>,
    set: &LimitSet,
    keyed: &[u8],
) -> Vec<Planned> {
    let mut own = Vec::new();
    for (limit, candidates) in set
        .iter()
        .zip(keys::for_value(&throttle.key_prefix, set, keyed))
    {
        let keys: Vec<(String, String)> = candidates
            .into_iter()
            .filter(|k| !everyones(identity_part(set, k)))
            .map(|k| {
                let instead = if counts_requests(limit.params.algorithm) {
                    k.clone()
                } else {
                    override_key(&throttle.key_prefix, &set.key_name, &k)
                };
                (k, instead)
            })
            .collect();
        if keys.is_empty() {
            continue;
        }
        own.push(Planned {
            tier: tier.map(str::to_owned),
            limit_name: limit.name.clone(),
            before: limit.params,
            adjust: None,
            scaled: false,
            keys,
        });
    }
    own
}

/// Whether `algorithm`'s stored state counts requests in the limit's own windows (or leases
/// in flight), whatever the limit: then an overridden caller keeps counting on its usual key
/// under the adjusted limit, so what it used in the window before the override still counts
/// (a month stays the month), and what it uses under the override counts after it. A token
/// bucket's tokens and a GCRA's arrival time are in units of the limit itself: those count on
/// a key of the override's own.
fn counts_requests(algorithm: crate::limit::Algorithm) -> bool {
    use crate::limit::Algorithm;
    matches!(
        algorithm,
        Algorithm::FixedWindow
            | Algorithm::SlidingWindow
            | Algorithm::SlidingLog
            | Algorithm::Concurrency
    )
}

/// Sets how each of one set's limits changes (see [`plan`]).
fn adjust_own(own: &mut [Planned], limit_name: Option<&str>, adjust: Adjust) {
    match (limit_name, adjust) {
        (Some(name), _) => {
            for p in own.iter_mut().filter(|p| p.limit_name == name) {
                p.adjust = Some(adjust);
            }
        }
        (None, Adjust::Multiply(_)) => {
            for p in own {
                p.adjust = Some(adjust);
                p.scaled = true;
            }
        }
        (None, Adjust::Limit(n)) => {
            let reference = own
                .iter()
                .enumerate()
                .min_by_key(|(i, p)| (p.before.period_us, *i))
                .map(|(i, p)| (i, p.before.limit.max(1)));
            if let Some((at, reference)) = reference {
                let factor = n as f64 / reference as f64;
                for (i, p) in own.iter_mut().enumerate() {
                    if i == at {
                        p.adjust = Some(adjust);
                    } else {
                        p.adjust = Some(Adjust::Multiply(factor));
                        p.scaled = true;
                    }
                }
            }
        }
    }
}

/// Refuses a plan that would leave a limit below 1 unit per period ([`factor_fits`]) or past
/// what the store counts exactly.
fn check_plan(record: &Record, planned: &[Planned]) -> Result<(), String> {
    // The smallest factor that leaves every limit scaled by one at 1 or more.
    let smallest = planned
        .iter()
        .filter(|p| matches!(p.adjust, Some(Adjust::Multiply(_))))
        .map(|p| 1.0 / p.before.limit.max(1) as f64)
        .fold(0.0, f64::max);
    for p in planned {
        let Some(adjust) = p.adjust else { continue };
        if let Adjust::Multiply(f) = adjust {
            factor_fits(&p.limit_name, p.before.limit, f, &record.route, smallest).map_err(
                |why| match record.limit {
                    // The factor was worked out, not given: say from what.
                    Some(n) => {
                        format!("limit={n} scales the caller's other limits in proportion: {why}")
                    }
                    None => why,
                },
            )?;
        }
        if !params_fit(&adjust.apply(p.before)) {
            return Err(format!(
                "the override would take limit `{}` past what the store counts exactly: ask for less",
                p.limit_name
            ));
        }
    }
    Ok(())
}

/// The table the limit stage reads, from the records in force. Overrides of every limit are
/// laid down first, those of one limit over them: the one named wins on its limit.
pub fn compile(throttle: &Throttle, records: &[Record]) -> HashMap<String, Active> {
    let now = now_ms();
    let mut table = HashMap::new();
    let mut in_force: Vec<&Record> = records.iter().filter(|r| r.until_ms > now).collect();
    in_force.sort_by_key(|r| r.limit_name.is_some());
    for record in in_force {
        // A record the configuration no longer fits (a limit renamed) changes nothing.
        let Ok(planned) = plan(throttle, record) else {
            continue;
        };
        for p in planned {
            let Some(adjust) = p.adjust else { continue };
            for (k, instead) in p.keys {
                let until_ms = record.until_ms;
                if k == instead {
                    // Counted on the usual key: one entry, which both finds and adjusts it.
                    table.insert(
                        k,
                        Active {
                            adjust,
                            until_ms,
                            key: Some(instead),
                        },
                    );
                    continue;
                }
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
    }
    table
}

/// What an operator asks of `POST /limits/override`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub adjust: Adjust,
    pub duration: Duration,
    /// The one limit to change; None: every limit (see [`plan`]).
    pub limit_name: Option<String>,
    /// Answer what would be done, change nothing.
    pub dry_run: bool,
    /// Who asks (kept with the override).
    pub who: super::audit::Who,
}

impl Control {
    /// Gives the caller `asked.adjust` on `route` for `asked.duration` (on one limit when
    /// `asked.limit_name` names it), replacing any override it had there for the same limit
    /// name. Returns the override as the endpoints show it, with what each of the caller's
    /// limits becomes; with `dry_run`, the same and nothing changed.
    pub async fn set_override(
        &self,
        route: &str,
        raw: &[u8],
        asked: &Request,
    ) -> Result<OverrideDone, CallerError> {
        self.targets(route, raw)?;
        let identity = std::str::from_utf8(raw).map_err(|_| {
            CallerError::BadOverride("the identity value must be UTF-8 text".into())
        })?;
        let now = now_ms();
        let record = Record {
            route: route.to_owned(),
            identity: identity.to_owned(),
            limit: match asked.adjust {
                Adjust::Limit(n) => Some(n),
                Adjust::Multiply(_) => None,
            },
            multiply: match asked.adjust {
                Adjust::Multiply(f) => Some(f),
                Adjust::Limit(_) => None,
            },
            until_ms: now.saturating_add(asked.duration.as_millis() as u64),
            limit_name: asked.limit_name.clone(),
            set_by: Some(asked.who.as_str().to_owned()),
            set_at_ms: Some(now),
            set_on: Some(super::audit::replica()),
        };
        let planned = plan(&self.throttle, &record).map_err(CallerError::BadOverride)?;
        let shown = self.shown(route);
        let answer = OverrideDone {
            set: record.shown(&shown),
            dry_run: asked.dry_run,
            applied: !asked.dry_run,
            limits: planned.iter().map(Planned::shown).collect(),
        };
        if asked.dry_run {
            return Ok(answer);
        }
        let records = match self.redis_store()? {
            Some(redis) => {
                let prefix = &self.throttle.key_prefix;
                let mut records = load(&redis, prefix).await?;
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
                records.push(record);
                records
            }
            None => {
                let mut records = memory();
                records.retain(|r| r.until_ms > now && r.field() != record.field());
                if records.len() >= MAX_OVERRIDES {
                    return Err(CallerError::TooManyOverrides { max: MAX_OVERRIDES });
                }
                records.push(record);
                records.clone()
            }
        };
        self.apply_here(&records);
        Ok(answer)
    }

    /// Ends the caller's overrides on `route` now: the one of `limit_name`, or, without a
    /// name, every one (of all limits and of single limits).
    pub async fn remove_override(
        &self,
        route: &str,
        raw: &[u8],
        limit_name: Option<&str>,
    ) -> Result<OverrideRemoved, CallerError> {
        self.targets(route, raw)?;
        let identity = String::from_utf8_lossy(raw);
        let doomed = |r: &Record| {
            r.route == route
                && r.identity == identity
                && (limit_name.is_none() || r.limit_name.as_deref() == limit_name)
        };
        let (removed, records) = match self.redis_store()? {
            Some(redis) => {
                let prefix = &self.throttle.key_prefix;
                let fields: Vec<String> = load(&redis, prefix)
                    .await?
                    .iter()
                    .filter(|r| doomed(r))
                    .map(Record::field)
                    .collect();
                let removed = match fields.is_empty() {
                    true => 0,
                    false => {
                        redis
                            .command::<u64>(redis::cmd("HDEL").arg(hash_key(prefix)).arg(&fields))
                            .await?
                    }
                };
                redis
                    .command::<u64>(redis::cmd("INCR").arg(generation_key(prefix)))
                    .await?;
                notify::publish(&redis, prefix, Topic::Overrides).await;
                (removed as usize, load(&redis, prefix).await?)
            }
            None => {
                let mut records = memory();
                let before = records.len();
                records.retain(|r| !doomed(r));
                (before - records.len(), records.clone())
            }
        };
        if removed == 0 {
            return Err(CallerError::NoOverride {
                route: route.to_owned(),
            });
        }
        self.apply_here(&records);
        Ok(OverrideRemoved {
            route: route.to_owned(),
            identity: self.shown(route).value(raw),
            limit_name: limit_name.map(str::to_owned),
            removed,
        })
    }

    /// The caller's overrides on `route` in force now (of every limit, then of single ones).
    pub async fn overrides_of(&self, route: &str, raw: &[u8]) -> Result<Vec<Record>, CallerError> {
        let identity = String::from_utf8_lossy(raw);
        let mut records: Vec<Record> = self
            .overrides_in_force()
            .await?
            .into_iter()
            .filter(|r| r.route == route && r.identity == identity)
            .collect();
        records.sort_by_key(|r| r.limit_name.is_some());
        Ok(records)
    }

    /// The caller's overrides on `route` in force now, as the endpoints show them, and the
    /// table the limit stage builds of them (by store key).
    pub(super) async fn override_table(
        &self,
        route: &str,
        raw: &[u8],
    ) -> Result<(Vec<OverrideShown>, HashMap<String, Active>), CallerError> {
        let records = self.overrides_of(route, raw).await?;
        let table = compile(&self.throttle, &records);
        let shown = self.shown(route);
        Ok((records.iter().map(|r| r.shown(&shown)).collect(), table))
    }

    /// Every override in force now, fleet-wide (from Redis; this process's with a memory
    /// store), soonest to end first.
    pub async fn overrides_in_force(&self) -> Result<Vec<Record>, CallerError> {
        let now = now_ms();
        let mut records = match self.redis_store()? {
            Some(redis) => load(&redis, &self.throttle.key_prefix).await?,
            None => memory().clone(),
        };
        records.retain(|r| r.until_ms > now);
        records.sort_by(|a, b| {
            (a.until_ms, &a.route, &a.identity).cmp(&(b.until_ms, &b.route, &b.identity))
        });
        Ok(records)
    }

    /// The table the limit stage would compile from every override in force now.
    pub(super) async fn table_in_force(&self) -> Result<HashMap<String, Active>, CallerError> {
        let records = self.overrides_in_force().await?;
        Ok(compile(&self.throttle, &records))
    }

    /// `GET /limits/overrides`: every override in force, each as [`Record::shown`] shows it.
    pub async fn overrides_list(&self) -> Result<OverridesList, CallerError> {
        let records = self.overrides_in_force().await?;
        Ok(OverridesList {
            overrides: records
                .iter()
                .map(|r| r.shown(&self.shown(&r.route)))
                .collect(),
        })
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
/// less than one unit per period ([`factor_fits`]), before the caller is looked up. A limit
/// every caller shares is left alone by overrides, and so by this check. An unknown route is
/// the control side's to answer (404); so is an unknown `limit_name`. With `limit_name` only
/// that limit changes, and only it is checked. The admin endpoint and `tollgate limits
/// override` straight to Redis both check here.
pub fn check_multiply(
    throttle: &Throttle,
    route: &str,
    adjust: Adjust,
    limit_name: Option<&str>,
) -> Result<(), String> {
    let Adjust::Multiply(factor) = adjust else {
        return Ok(());
    };
    let Some(route) = throttle.routes.iter().find(|r| r.name == route) else {
        return Ok(());
    };
    let sets = std::iter::once(&route.limits).chain(route.tiers.iter().map(|t| &t.limits));
    let changed = |l: &&crate::config::Limit| {
        !shared_by_everyone(l) && limit_name.is_none_or(|name| l.name == name)
    };
    let smallest = smallest_factor(route, limit_name);
    for limit in sets.flat_map(|set| set.iter()).filter(changed) {
        factor_fits(
            &limit.name,
            limit.params.limit,
            factor,
            &route.name,
            smallest,
        )?;
    }
    Ok(())
}

/// The one rule for a factor applied to a limit (a `multiply` given, or the proportion in
/// which a `limit` without a limit name scales the caller's other limits): it must leave the
/// limit (`configured` units per period) at 1 unit or more. The store would round less up to
/// 1, which is not what anyone asked for (`multiply=0.0000001` on a monthly quota of 100 made
/// it 1 per month). `smallest` is the smallest factor that would do for the limits it applies
/// to on `route`.
fn factor_fits(
    limit: &str,
    configured: u64,
    factor: f64,
    route: &str,
    smallest: f64,
) -> Result<(), String> {
    let units = configured as f64 * factor;
    if units >= 1.0 {
        return Ok(());
    }
    Err(format!(
        "multiply={factor} would make limit `{limit}` ({configured} per period) {units} units, \
         less than 1: the smallest factor for route `{route}` is {smallest}"
    ))
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

/// The smallest `multiply` that leaves every caller-keyed limit of `route` (the one named
/// `limit_name`, if given) at 1 or more.
fn smallest_factor(route: &crate::config::Route, limit_name: Option<&str>) -> f64 {
    std::iter::once(&route.limits)
        .chain(route.tiers.iter().map(|t| &t.limits))
        .flat_map(|set| set.iter())
        .filter(|l| !shared_by_everyone(l) && limit_name.is_none_or(|name| l.name == name))
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
            limit_name: None,
            set_by: None,
            set_at_ms: None,
            set_on: None,
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(
            text,
            r#"{"route":"api","identity":"alice","multiply":10.0,"until_ms":0}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), record);
        assert_eq!(
            record.shown(&Shown::default()).until,
            "1970-01-01T00:00:00.000Z"
        );
    }
}
