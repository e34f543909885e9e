//! In-process limit store: the algorithms of [`super::algorithm`] on sharded, locked maps.
//!
//! For a single proxy instance (or tests) there is no need for Redis. Keys are spread over
//! 16 mutex-protected shards so unrelated requests rarely contend; a decision locks the shards
//! of all its keys, always in ascending shard order so two decisions can never deadlock, which
//! makes the multi-limit step atomic exactly as the Lua script is inside Redis. Idle keys are
//! evicted (an entry past its TTL counts as absent, and [`MemoryStore::sweep`] drops them) so
//! memory stays bounded by the keys active within their TTLs.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::algorithm::{self, Algorithm, Micros, State};
use super::decision::{block_key, new_lease_id, Check, Decision, Lease, Settlement};

const SHARDS: usize = 16;

/// The store's time source.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> Micros;
}

/// Wall-clock microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// The system clock shifted by the test clock offset (debug builds only, see
/// `calendar::TEST_CLOCK_OFFSET_ENV`).
struct OffsetClock(Micros);

impl Clock for OffsetClock {
    fn now_us(&self) -> Micros {
        SystemClock.now_us() + self.0
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now: Micros) -> ManualClock {
        ManualClock(AtomicI64::new(now))
    }

    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Micros,
}

type Shard = HashMap<String, Entry>;

struct Inner {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
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
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                hasher: RandomState::new(),
                clock,
            }),
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
                locked.shard(marker).insert(
                    marker.clone(),
                    Entry {
                        state: State::Blocked { until },
                        expires_at: until,
                    },
                );
            }
        }
        let allowed = steps
            .iter()
            .zip(checks)
            .all(|((s, _), c)| c.shadow || s.verdict.allowed);
        let mut leases = Vec::new();
        if allowed {
            for ((step, lease), c) in steps.iter().zip(checks) {
                if !step.verdict.allowed {
                    continue; // a denying shadow limit is not consumed
                }
                let map = locked.shard(c.key);
                if step.ttl > 0 {
                    map.insert(
                        c.key.to_string(),
                        Entry {
                            state: step.state.clone(),
                            expires_at: now + step.ttl,
                        },
                    );
                } else {
                    map.remove(c.key);
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
            .filter(|k| locked.shard(k).remove(**k).is_some())
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
            let map = locked.shard(&s.key);
            if ttl > 0 {
                let entry = Entry {
                    state,
                    expires_at: now + ttl,
                };
                map.insert(s.key.clone(), entry);
            } else {
                map.remove(&s.key);
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
            lock(shard).retain(|_, e| e.expires_at > now);
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
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
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
}
