//! In-process limit store: the algorithms of [`super::algorithm`] on sharded, locked maps.
//!
//! For a single proxy instance (or tests) there is no need for Redis. Keys are spread over
//! 16 mutex-protected shards so unrelated requests rarely contend; a decision locks the shards
//! of all its keys, always in ascending shard order so two decisions can never deadlock, which
//! makes the multi-limit step atomic exactly as the Lua script is inside Redis. Idle keys are
//! evicted (an entry past its TTL counts as absent, and [`MemoryStore::sweep`] drops them).
//!
//! Memory is bounded whatever the callers send: each route (a limit set's key name, the text
//! of a key's hash tag before `|`) holds at most [`MemoryStore::set_keys_per_route`] keys
//! (default [`DEFAULT_KEYS_PER_ROUTE`]), split evenly over the shards. A new key on a full
//! route evicts one of the route's keys, never refuses its caller: a second-chance ring per
//! route and shard (CLOCK) finds it in amortised O(1) under the shard lock the decision holds
//! anyway. Among the oldest few keys it evicts, in this order, one past its TTL (its state is
//! back at rest: dropping it changes nothing), a key not used since it was stored (one request
//! and gone: what a key flood is made of) that returns to rest the soonest, and only then a key
//! used again, which gets one more turn first. So a caller still limited loses its state only
//! when the route's budget is filled with keys all newer or busier than its own.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::algorithm::{self, Algorithm, State};
use super::clock::{Clock, Micros, SystemClock};
use super::decision::{block_key, new_lease_id, Check, Decision, Lease, Settlement};

const SHARDS: usize = 16;

/// Keys per route by default: about 430 bytes of RSS each with the map and the ring (measured
/// with `bench/key_flood.sh`), so a route flooded with distinct keys holds about 45 MB at most.
pub const DEFAULT_KEYS_PER_ROUTE: usize = 100_000;
/// How many of the oldest keys an eviction looks at for one it may drop for free.
const EVICTION_PROBES: usize = 8;

/// The system clock shifted by the test clock offset (debug builds only, see
/// `calendar::TEST_CLOCK_OFFSET_ENV`).
struct OffsetClock(Micros);

impl Clock for OffsetClock {
    fn now_us(&self) -> Micros {
        SystemClock.now_us() + self.0
    }
}

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Micros,
    /// The route's index in its shard's `groups`.
    group: u32,
    /// Used again since it was stored or last given a second chance (CLOCK's bit).
    used: bool,
    /// The last decision on it left nothing (refused, or took the last unit): its caller is
    /// being limited, and dropping the state would free it early. Evicted last.
    limiting: bool,
}

/// One route's keys in one shard, oldest first (for eviction). A key removed from the map
/// stays in the ring until it comes up or the ring is compacted.
#[derive(Debug, Default)]
struct Group {
    ring: VecDeque<Arc<str>>,
    live: usize,
}

/// One shard: the states, and per route its keys in order of arrival.
#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Arc<str>, Entry>,
    groups: Vec<Group>,
    group_of: HashMap<Box<str>, u32>,
}

/// The route part of a store key: `<prefix>{<route>|...}...` or `<prefix>{<route>}...` (the
/// prefix never holds `{`); the whole key's head when it has no hash tag.
fn route_of(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return "";
    };
    let rest = &key[open + 1..];
    let end = rest.find(['|', '}']).unwrap_or(rest.len());
    &rest[..end]
}

impl Shard {
    fn get(&self, key: &str) -> Option<&Entry> {
        self.map.get(key)
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.map.get_mut(key)
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.map.remove(key)?;
        self.groups[entry.group as usize].live -= 1;
        Some(entry)
    }

    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) -> usize {
        let groups = &mut self.groups;
        let before = self.map.len();
        self.map.retain(|_, e| {
            let kept = keep(e);
            if !kept {
                groups[e.group as usize].live -= 1;
            }
            kept
        });
        before - self.map.len()
    }

    /// Stores `state` at `key`; a new key on a route holding `budget` keys in this shard first
    /// evicts one of them. Returns how many keys were evicted (0 or 1).
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        key: &str,
        state: State,
        expires_at: Micros,
        limiting: bool,
        now: Micros,
        budget: usize,
    ) -> u64 {
        if let Some(entry) = self.map.get_mut(key) {
            entry.state = state;
            entry.expires_at = expires_at;
            entry.used = true;
            entry.limiting = limiting;
            return 0;
        }
        let route = route_of(key);
        let group = match self.group_of.get(route) {
            Some(&g) => g,
            None => {
                self.groups.push(Group::default());
                let g = (self.groups.len() - 1) as u32;
                self.group_of.insert(route.into(), g);
                g
            }
        };
        let evicted = if self.groups[group as usize].live >= budget.max(1) {
            u64::from(self.evict(group, now))
        } else {
            0
        };
        let key: Arc<str> = Arc::from(key);
        let g = &mut self.groups[group as usize];
        g.ring.push_back(key.clone());
        g.live += 1;
        // Removed keys leave stale ring slots: compact once they are half the ring
        // (amortised O(1) per insert).
        if g.ring.len() > 2 * g.live + 16 {
            let map = &self.map;
            g.ring.retain(|k| is_current(map, k));
            // The new key is not in the map yet.
            g.ring.push_back(key.clone());
        }
        self.map.insert(
            key,
            Entry {
                state,
                expires_at,
                group,
                used: false,
                limiting,
            },
        );
        evicted
    }

    /// Evicts one key of `group` (see the module's doc for the order). False when the group
    /// has no key here.
    fn evict(&mut self, group: u32, now: Micros) -> bool {
        let mut probed: Vec<Arc<str>> = Vec::with_capacity(EVICTION_PROBES);
        // A key used again gets a second chance: its bit is cleared and it goes to the back.
        // Every chance given spends one use, so the loop is amortised O(1); the cap keeps one
        // eviction bounded when every key is busy.
        let mut chances = 4 * EVICTION_PROBES;
        let victim = loop {
            let Some(key) = self.groups[group as usize].ring.pop_front() else {
                break None;
            };
            if !is_current(&self.map, &key) {
                continue; // A stale slot.
            }
            let entry = self
                .map
                .get_mut(&*key)
                .expect("a current slot's key is held");
            if entry.expires_at <= now {
                break Some(key);
            }
            if (entry.used || entry.limiting) && chances > 0 {
                // A caller still limited keeps its turn (until every key is one).
                chances -= 1;
                entry.used = false;
                self.groups[group as usize].ring.push_back(key);
                continue;
            }
            probed.push(key);
            if probed.len() == EVICTION_PROBES {
                break None;
            }
        };
        let victim = victim.or_else(|| {
            // The one back at rest the soonest.
            let best = (0..probed.len()).min_by_key(|&i| self.map[&*probed[i]].expires_at)?;
            Some(probed.remove(best))
        });
        // The others keep their places at the front, in order.
        let ring = &mut self.groups[group as usize].ring;
        for key in probed.into_iter().rev() {
            ring.push_front(key);
        }
        match victim {
            Some(key) => {
                self.remove(&key);
                true
            }
            None => false,
        }
    }
}

/// True when `key` (a ring slot) is the key the map holds, not a removed one's leftover.
fn is_current(map: &HashMap<Arc<str>, Entry>, key: &Arc<str>) -> bool {
    map.get_key_value(&**key)
        .is_some_and(|(held, _)| Arc::ptr_eq(held, key))
}

struct Inner {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    /// Keys per route and shard (the route's budget split over the shards, rounded up).
    per_shard: AtomicUsize,
    /// Keys evicted to make room, since the start.
    evicted: AtomicU64,
}

/// Limit states of this process only. Clone is cheap (shared).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

fn per_shard(keys_per_route: usize) -> usize {
    keys_per_route.div_ceil(SHARDS).max(1)
}

/// A poisoned shard only means another thread panicked mid-decision; the maps themselves are
/// always consistent (every write is a single insert or remove), so keep serving.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        match super::calendar::test_clock_offset_us() {
            0 => MemoryStore::with_clock(Arc::new(SystemClock)),
            offset => MemoryStore::with_clock(Arc::new(OffsetClock(offset))),
        }
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
                hasher: RandomState::new(),
                clock,
                per_shard: AtomicUsize::new(per_shard(DEFAULT_KEYS_PER_ROUTE)),
                evicted: AtomicU64::new(0),
            }),
        }
    }

    /// The most keys one route holds (its budget); a new key past it evicts one of the route's
    /// keys. Split evenly over the shards, so the bound is this rounded up to a multiple of 16.
    pub fn set_keys_per_route(&self, keys: usize) {
        self.inner
            .per_shard
            .store(per_shard(keys), Ordering::Relaxed);
    }

    /// The bound [`MemoryStore::set_keys_per_route`] set, as enforced (a multiple of 16).
    pub fn keys_per_route(&self) -> usize {
        self.inner.per_shard.load(Ordering::Relaxed) * SHARDS
    }

    /// Keys evicted to make room for new ones since the store was made.
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    /// Stores `state` at `key` in its shard (locked by `locked`), counting an eviction.
    fn put(
        &self,
        locked: &mut Locked<'_>,
        key: &str,
        state: State,
        expires_at: Micros,
        limiting: bool,
        now: Micros,
    ) {
        let budget = self.inner.per_shard.load(Ordering::Relaxed);
        let evicted = locked
            .shard(key)
            .put(key, state, expires_at, limiting, now, budget);
        if evicted > 0 {
            self.inner.evicted.fetch_add(evicted, Ordering::Relaxed);
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.inner.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    /// Locks the shards of `keys` in ascending order (the deadlock-free order).
    fn lock_keys<'k>(&self, keys: impl Iterator<Item = &'k str>) -> Locked<'_> {
        let mut idx: Vec<usize> = keys.map(|k| self.shard_of(k)).collect();
        idx.sort_unstable();
        idx.dedup();
        let guards = idx.iter().map(|&i| lock(&self.inner.shards[i])).collect();
        Locked {
            store: self,
            idx,
            guards,
        }
    }

    /// Locks the shards of `checks`' keys and of their block markers (`block_for`, entries of
    /// their own, see [`block_markers`]); returns the markers with the lock.
    fn lock_checks(&self, checks: &[Check<'_>]) -> (Vec<Option<String>>, Locked<'_>) {
        let markers = block_markers(checks);
        let locked = self.lock_keys(
            checks
                .iter()
                .map(|c| c.key)
                .chain(markers.iter().flatten().map(String::as_str)),
        );
        (markers, locked)
    }

    /// See [`super::Store::decide`].
    pub fn decide(&self, checks: &[Check<'_>]) -> Decision {
        let (markers, mut locked) = self.lock_checks(checks);
        let now = self.inner.clock.now_us();
        let mut steps: Vec<_> = checks
            .iter()
            .map(|c| {
                let lease = if c.params.algorithm == Algorithm::Concurrency {
                    new_lease_id()
                } else {
                    0
                };
                let state = locked.live(c.key, now);
                (algorithm::step_for(&c.params, state, now, lease), lease)
            })
            .collect();
        for ((step, _), (c, marker)) in steps.iter_mut().zip(checks.iter().zip(&markers)) {
            let Some(marker) = marker else { continue };
            let blocked_until = locked.blocked_until(marker, now);
            let (verdict, start) =
                algorithm::penalty_box(step.verdict, blocked_until, c.block_us, now);
            step.verdict = verdict;
            if let Some(until) = start {
                self.put(
                    &mut locked,
                    marker,
                    State::Blocked { until },
                    until,
                    true,
                    now,
                );
            }
        }
        let allowed = steps
            .iter()
            .zip(checks)
            .all(|((s, _), c)| c.shadow || s.verdict.allowed);
        if !allowed {
            // A refused caller is being limited: its states are the last to go.
            for ((step, _), c) in steps.iter().zip(checks) {
                if !step.verdict.allowed {
                    if let Some(entry) = locked.shard(c.key).get_mut(c.key) {
                        entry.limiting = true;
                        entry.used = true;
                    }
                }
            }
        }
        let mut leases = Vec::new();
        if allowed {
            for ((step, lease), c) in steps.iter().zip(checks) {
                if !step.verdict.allowed {
                    continue; // a denying shadow limit is not consumed
                }
                if step.ttl > 0 {
                    let limiting = step.verdict.remaining == 0;
                    self.put(
                        &mut locked,
                        c.key,
                        step.state.clone(),
                        now + step.ttl,
                        limiting,
                        now,
                    );
                } else {
                    locked.shard(c.key).remove(c.key);
                }
                if c.params.algorithm == Algorithm::Concurrency {
                    leases.push(Lease {
                        key: c.key.to_string(),
                        id: *lease,
                        params: c.params,
                    });
                }
            }
        }
        Decision {
            allowed,
            verdicts: steps.iter().map(|(s, _)| s.verdict).collect(),
            leases,
            at: now,
        }
    }

    /// What [`MemoryStore::decide`] would answer now, writing nothing: the in-memory twin of
    /// [`super::redis_store::RedisStore::peek`] (`tollgate limits get`, `/limits/state`).
    pub fn peek(&self, checks: &[Check<'_>]) -> Decision {
        let (markers, mut locked) = self.lock_checks(checks);
        let now = self.inner.clock.now_us();
        let verdicts: Vec<_> = checks
            .iter()
            .zip(&markers)
            .map(|(c, marker)| {
                let verdict =
                    algorithm::step_for(&c.params, locked.live(c.key, now), now, 0).verdict;
                // A running block shows as it would answer; a block this peek would start is
                // not started (nothing is written).
                let blocked_until = marker.as_deref().and_then(|m| locked.blocked_until(m, now));
                match blocked_until {
                    Some(_) => algorithm::penalty_box(verdict, blocked_until, c.block_us, now).0,
                    None => verdict,
                }
            })
            .collect();
        Decision {
            allowed: verdicts
                .iter()
                .zip(checks)
                .all(|(v, c)| c.shadow || v.allowed),
            verdicts,
            leases: Vec::new(),
            at: now,
        }
    }

    /// Forgets the state of `keys` (an operator's reset); returns how many existed.
    pub fn remove(&self, keys: &[&str]) -> usize {
        let mut locked = self.lock_keys(keys.iter().copied());
        keys.iter()
            .filter(|k| locked.shard(k).remove(k).is_some())
            .count()
    }

    /// See [`super::Store::release`].
    pub fn release(&self, leases: &[Lease]) {
        let mut locked = self.lock_keys(leases.iter().map(|l| l.key.as_str()));
        for lease in leases {
            let map = locked.shard(&lease.key);
            if let Some(entry) = map.get_mut(&lease.key) {
                algorithm::release(&mut entry.state, lease.id);
                if matches!(&entry.state, State::Concurrency { leases } if leases.is_empty()) {
                    map.remove(&lease.key);
                }
            }
        }
    }

    /// See [`super::Store::settle`].
    pub fn settle(&self, settlements: &[Settlement]) {
        let mut locked = self.lock_keys(settlements.iter().map(|s| s.key.as_str()));
        let now = self.inner.clock.now_us();
        for s in settlements {
            let state = locked.live(&s.key, now);
            let Some((state, ttl)) = algorithm::settle(&s.params, state, now, s.op) else {
                continue;
            };
            if ttl > 0 {
                let limiting = locked.shard(&s.key).get(&s.key).is_some_and(|e| e.limiting);
                self.put(&mut locked, &s.key, state, now + ttl, limiting, now);
            } else {
                locked.shard(&s.key).remove(&s.key);
            }
        }
    }

    /// See [`super::Store::refresh`].
    pub fn refresh(&self, leases: &[Lease]) -> Vec<bool> {
        let mut locked = self.lock_keys(leases.iter().map(|l| l.key.as_str()));
        let now = self.inner.clock.now_us();
        leases
            .iter()
            .map(|lease| {
                let map = locked.shard(&lease.key);
                let Some(entry) = map.get_mut(&lease.key).filter(|e| e.expires_at > now) else {
                    return false;
                };
                match algorithm::refresh(&mut entry.state, lease.id, &lease.params, now) {
                    Some(ttl) => {
                        entry.expires_at = entry.expires_at.max(now + ttl);
                        true
                    }
                    None => false,
                }
            })
            .collect()
    }

    /// Removes every entry past its TTL.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_us();
        for shard in &self.inner.shards {
            lock(shard).retain(|e| e.expires_at > now);
        }
    }

    /// Sweeps every `every` in a background task until the store is dropped (the task holds
    /// only a weak reference, so it never keeps the store alive).
    pub fn spawn_sweeper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                MemoryStore { inner }.sweep();
            }
        })
    }

    /// Number of stored entries, expired or not (tests watch eviction with it).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The end of the block (`block_for`) running on the limit stored at `key`, with the
    /// store's clock now; `None` when none runs. Writes nothing (an expired marker is dropped, as every read
    /// does): the operators' views.
    pub fn running_block(&self, key: &str) -> Option<(Micros, Micros)> {
        let marker = block_key(key);
        let mut locked = self.lock_keys(std::iter::once(marker.as_str()));
        let now = self.inner.clock.now_us();
        locked.blocked_until(&marker, now).map(|until| (until, now))
    }
}

/// The shards of one decision, locked.
struct Locked<'a> {
    store: &'a MemoryStore,
    idx: Vec<usize>,
    guards: Vec<MutexGuard<'a, Shard>>,
}

/// The block marker (`block_for`) of each check that has one: an entry of its own, locked
/// with the decision.
fn block_markers(checks: &[Check<'_>]) -> Vec<Option<String>> {
    checks
        .iter()
        .map(|c| (c.block_us > 0).then(|| block_key(c.key)))
        .collect()
}

impl Locked<'_> {
    /// When the block at `marker` ends, if one is running.
    fn blocked_until(&mut self, marker: &str, now: Micros) -> Option<Micros> {
        match self.live(marker, now) {
            Some(State::Blocked { until }) => Some(*until),
            _ => None,
        }
    }

    fn shard(&mut self, key: &str) -> &mut Shard {
        let i = self.store.shard_of(key);
        let pos = self
            .idx
            .binary_search(&i)
            .expect("shard of a key of this decision");
        &mut self.guards[pos]
    }

    /// The key's state unless missing or expired (an expired entry is dropped on the way).
    fn live(&mut self, key: &str, now: Micros) -> Option<&State> {
        let map = self.shard(key);
        if map.get(key).is_some_and(|e| e.expires_at <= now) {
            map.remove(key);
        }
        map.get(key).map(|e| &e.state)
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::ManualClock;
    use super::super::{Algorithm, Params};
    use super::*;

    const SEC: Micros = 1_000_000;

    fn p(algorithm: Algorithm, limit: u64, period_us: Micros) -> Params {
        Params {
            algorithm,
            limit,
            period_us,
            burst: limit,
            cost: 1,
            calendar: None,
        }
    }

    fn store() -> (MemoryStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000 * SEC));
        (MemoryStore::with_clock(clock.clone()), clock)
    }

    #[test]
    fn denied_multi_limit_consumes_nothing() {
        let (s, _) = store();
        let wide = Check {
            key: "wide",
            params: p(Algorithm::FixedWindow, 10, 10 * SEC),
            shadow: false,
            block_us: 0,
        };
        let narrow = Check {
            key: "narrow",
            params: p(Algorithm::TokenBucket, 1, 10 * SEC),
            shadow: false,
            block_us: 0,
        };
        assert!(s.decide(&[wide, narrow]).allowed);
        let d = s.decide(&[wide, narrow]);
        assert!(!d.allowed);
        assert!(d.verdicts[0].allowed && !d.verdicts[1].allowed);
        assert_eq!(s.decide(&[wide]).verdicts[0].remaining, 8);
    }

    #[test]
    fn shadow_limits_report_but_never_deny() {
        let (s, _) = store();
        let enforce = Check {
            key: "e",
            params: p(Algorithm::FixedWindow, 10, 10 * SEC),
            shadow: false,
            block_us: 0,
        };
        let shadow = Check {
            key: "s",
            params: p(Algorithm::FixedWindow, 1, 10 * SEC),
            shadow: true,
            block_us: 0,
        };
        let d = s.decide(&[enforce, shadow]);
        assert!(d.allowed && d.verdicts[1].allowed && d.verdicts[1].remaining == 0);
        let d = s.decide(&[enforce, shadow]);
        assert!(d.allowed && !d.verdicts[1].allowed);
        assert_eq!(d.verdicts[0].remaining, 8);
    }

    #[test]
    fn concurrency_leases_round_trip() {
        let (s, clock) = store();
        let c = Check {
            key: "c",
            params: p(Algorithm::Concurrency, 1, 30 * SEC),
            shadow: false,
            block_us: 0,
        };
        let d = s.decide(&[c]);
        assert!(d.allowed);
        assert_eq!(d.leases.len(), 1);
        assert!(!s.decide(&[c]).allowed);
        assert_eq!(s.refresh(&d.leases), vec![true]);
        s.release(&d.leases);
        assert_eq!(s.len(), 0);
        let d = s.decide(&[c]);
        assert!(d.allowed);
        clock.advance(30 * SEC);
        assert_eq!(s.refresh(&d.leases), vec![false]);
        assert!(s.decide(&[c]).allowed);
    }

    #[test]
    fn peek_consumes_nothing_and_remove_gives_the_quota_back() {
        let (s, _) = store();
        let c = Check {
            key: "k",
            params: p(Algorithm::FixedWindow, 3, 10 * SEC),
            shadow: false,
            block_us: 0,
        };
        assert_eq!(s.peek(&[c]).verdicts[0].remaining, 2);
        assert!(s.is_empty());
        s.decide(&[c]);
        s.decide(&[c]);
        assert_eq!(s.peek(&[c]).verdicts[0].remaining, 0);
        assert_eq!(s.peek(&[c]).verdicts[0].remaining, 0);
        assert_eq!(s.remove(&["k", "other"]), 1);
        assert_eq!(s.peek(&[c]).verdicts[0].remaining, 2);
    }

    #[test]
    fn idle_keys_are_evicted() {
        let (s, clock) = store();
        for (i, a) in Algorithm::ALL.into_iter().enumerate() {
            let key = format!("k{i}");
            let params = Params {
                burst: 5,
                ..p(a, 5, 10 * SEC)
            };
            let check = Check {
                key: &key,
                params,
                shadow: false,
                block_us: 0,
            };
            assert!(s.decide(&[check]).allowed);
        }
        assert_eq!(s.len(), 6);
        clock.advance(5 * SEC);
        s.sweep();
        assert!(!s.is_empty());
        // The longest TTL is sliding_window's: up to two periods.
        clock.advance(15 * SEC);
        s.sweep();
        assert_eq!(s.len(), 0);
    }

    #[tokio::test]
    async fn sweeper_task_evicts_and_stops_with_the_store() {
        let (s, clock) = store();
        let check = Check {
            key: "k",
            params: p(Algorithm::Gcra, 10, 10 * SEC),
            shadow: false,
            block_us: 0,
        };
        s.decide(&[check]);
        let task = s.spawn_sweeper(Duration::from_millis(10));
        clock.advance(60 * SEC);
        for _ in 0..100 {
            if s.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(s.len(), 0);
        drop(s);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the sweeper stops once the store is gone")
            .unwrap();
    }

    fn flood_check(key: &str, params: Params) -> Check<'_> {
        Check {
            key,
            params,
            shadow: false,
            block_us: 0,
        }
    }

    #[test]
    fn a_key_flood_200_times_the_budget_stays_within_it_and_new_keys_are_admitted() {
        let (s, clock) = store();
        s.set_keys_per_route(1_000);
        assert_eq!(s.keys_per_route(), 1_008);
        let limit = p(Algorithm::FixedWindow, 3, 60 * SEC);
        let busy = p(Algorithm::FixedWindow, 5_000, 60 * SEC);
        // A busy caller on the flooded route, and one on another route.
        let hot = "t:{login|alice}:l";
        let other = "t:{search|bob}:l";
        assert!(s.decide(&[flood_check(other, limit)]).allowed);
        let mut hot_uses = 0;
        let mut key = String::new();
        for i in 0..200_000u32 {
            key.clear();
            use std::fmt::Write;
            write!(key, "t:{{login|flood{i}}}:l").unwrap();
            assert!(
                s.decide(&[flood_check(&key, limit)]).allowed,
                "key {i} refused"
            );
            if i % 500 == 0 {
                clock.advance(1_000);
                assert!(s.decide(&[flood_check(hot, busy)]).allowed);
                hot_uses += 1;
            }
            if i % 20_000 == 0 {
                assert!(s.len() <= 1_008 + 1, "{} keys after {i}", s.len());
            }
        }
        assert!(s.len() <= 1_008 + 1, "{} keys", s.len());
        assert_eq!(s.evicted(), 200_000 + 2 - s.len() as u64);
        // The other route's key was never touched by the flood (peek counts the next request).
        assert_eq!(
            s.peek(&[flood_check(other, limit)]).verdicts[0].remaining,
            1
        );
        // The hot key survived with its count.
        let d = s.peek(&[flood_check(hot, busy)]);
        assert_eq!(d.verdicts[0].remaining, 5_000 - hot_uses - 1);
        // A new caller on the flooded route is admitted with its full quota.
        let d = s.decide(&[flood_check("t:{login|carol}:l", limit)]);
        assert!(d.allowed);
        assert_eq!(d.verdicts[0].remaining, 2);
    }

    #[test]
    fn eviction_takes_keys_at_rest_and_one_request_keys_before_a_limited_caller() {
        let (s, clock) = store();
        s.set_keys_per_route(16 * 4);
        let strict = p(Algorithm::FixedWindow, 1, 3_600 * SEC);
        let short = p(Algorithm::FixedWindow, 5, SEC);
        // A limited caller: its one unit spent, refused for an hour, and retrying.
        let limited = "t:{r|mallory}:l";
        assert!(s.decide(&[flood_check(limited, strict)]).allowed);
        assert!(!s.decide(&[flood_check(limited, strict)]).allowed);
        // Refused decisions store nothing, so it is as cold as the flood's keys; but the flood's
        // keys return to rest within a second, and eviction takes those first.
        for i in 0..10_000 {
            let key = format!("t:{{r|f{i}}}:l");
            assert!(s.decide(&[flood_check(&key, short)]).allowed);
            if i % 100 == 0 {
                clock.advance(1_000);
            }
        }
        assert!(
            !s.decide(&[flood_check(limited, strict)]).allowed,
            "freed early"
        );
        assert!(s.len() <= 64);
    }

    #[test]
    fn removed_keys_do_not_grow_the_ring() {
        let (s, _) = store();
        let c = p(Algorithm::Concurrency, 1, 30 * SEC);
        for _ in 0..10_000 {
            let d = s.decide(&[flood_check("t:{r|k}:c", c)]);
            s.release(&d.leases);
        }
        let shard = lock(&s.inner.shards[s.shard_of("t:{r|k}:c")]);
        let ring: usize = shard.groups.iter().map(|g| g.ring.len()).sum();
        assert!(ring <= 20, "{ring} ring slots for no key");
    }

    #[test]
    fn route_of_reads_the_hash_tag() {
        assert_eq!(route_of("t:{login|1.2.3.4}:burst"), "login");
        assert_eq!(route_of("t:{login}:burst:1.2.3.4"), "login");
        assert_eq!(route_of("t:{api~gold|u}:l"), "api~gold");
        assert_eq!(route_of("plain"), "");
    }
}
