//! A local memory of requests the store has just denied, so that a client hammering a limit it
//! is already over is answered here — no store round trip, no upstream — until the moment the
//! store said it may retry.
//!
//! Why this can never admit more than the store would: only denials are remembered, and an
//! entry only ever produces a denial; every admission still comes from the store. A denial is
//! remembered for the shortest `retry_after` among the limits that denied it, counted from
//! *before* the store was asked, so the entry is gone by the time the store could first change
//! its answer (rate limits only recover with time; other instances only consume more). It is
//! not used where a slot can free up early or a denial is not final: routes with a concurrency
//! limit (a release frees a slot at any moment) or an `on_limit: delay` limit (a denial there
//! means "wait", not 429). Shadow limits never deny, so they never make an entry.
//!
//! An entry is what the denial was (the store's verdicts and when it gave them), not a
//! response: the proxy renders the limited response from it (see
//! [`crate::throttle::headers::render_remembered`]).
//!
//! The cache is bounded: past its capacity new denials are simply not remembered (the store
//! keeps deciding them). Entries are keyed by the limit set (the very `LimitSet` the limits came
//! from, so a tier with other limits never shares an entry) and all its store keys, and the clock is
//! passed in by the caller so tests drive it.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hashbrown::hash_table::{Entry as Slot, HashTable};
use tokio::time::Instant;

use crate::config::{LimitSet, OnLimit};
use crate::limit::algorithm::{Algorithm, Verdict};
use crate::throttle::headers::RenderedCopy;

/// Independent locks, so workers deciding for different callers rarely wait on each other.
const SHARDS: usize = 16;

/// Default bound on remembered denials (a few hundred bytes each).
pub const DEFAULT_CAPACITY: usize = 32 * 1024;

/// A denial the store gave: what the limited response is rendered from, at any moment until
/// the store may change its answer. Shared (an `Arc`) between the cache and the requests it
/// answers, so a hit copies nothing under the shard's lock.
pub struct Remembered {
    /// When the store was asked: the verdicts' times count from here.
    asked_at: Instant,
    /// Denied at least until then.
    until: Instant,
    verdicts: Box<[Verdict]>,
    /// The renderer's copy of the response last rendered for this denial (see
    /// [`crate::throttle::headers::render_remembered`]); only the renderer reads or writes it.
    pub rendered: RenderedCopy,
}

impl Remembered {
    /// The verdicts as the store would give them at `now` (at most `until`).
    pub fn aged(&self, now: Instant) -> impl Iterator<Item = Verdict> + Clone + '_ {
        let elapsed_us = now.saturating_duration_since(self.asked_at).as_micros() as i64;
        self.verdicts.iter().map(move |v| Verdict {
            reset_after_us: (v.reset_after_us - elapsed_us).max(0),
            retry_after_us: if v.allowed {
                v.retry_after_us
            } else {
                // Still in the future: `until` is the earliest of these.
                (v.retry_after_us - elapsed_us).max(1)
            },
            ..*v
        })
    }
}

/// One independently locked part of the cache: a table the caller hashes for, so the key is
/// hashed once per lookup (for the shard and the table alike).
type Shard = Mutex<HashTable<(Box<str>, Arc<Remembered>)>>;

pub struct DenyCache {
    shards: Box<[Shard]>,
    hasher: RandomState,
    /// Entries in all shards: lets the common case (nobody over a limit) skip every lock.
    len: AtomicUsize,
    per_shard: usize,
    /// False while a reset watch has not read its first generation (see [`DenyCache::hold`]).
    remembering: AtomicBool,
}

/// Whether denials under `set` may be remembered at all (see the module docs).
pub fn cacheable(set: &LimitSet) -> bool {
    set.iter().all(|l| {
        l.params.algorithm != Algorithm::Concurrency && matches!(l.on_limit, OnLimit::Reject)
            // A settlement can give units back before the retry time the denial named.
            && l.by_response.is_none()
    })
}

/// The cache key of one decision: the limit set's identity and every store key, in order.
pub fn key(set: &LimitSet, keys: &[String]) -> String {
    let mut out = String::with_capacity(keys.iter().map(|k| k.len() + 1).sum::<usize>() + 20);
    out.push_str(itoa::Buffer::new().format(set as *const LimitSet as usize));
    for k in keys {
        out.push('\n');
        out.push_str(k);
    }
    out
}

impl DenyCache {
    pub fn new(capacity: usize) -> Self {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: RandomState::new(),
            len: AtomicUsize::new(0),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            remembering: AtomicBool::new(true),
        }
    }

    /// Remembers nothing until [`DenyCache::judge_from_now`]: a cache watched for resets in
    /// Redis holds off until its watch has read the reset generation once, because a denial
    /// remembered before that read could not be judged against a reset made in between (the
    /// read that finds the new generation would be the first, with nothing to compare).
    pub fn hold(&self) {
        self.remembering.store(false, Ordering::Release);
    }

    /// The watch has a generation to judge denials against: remember them from now on.
    pub fn judge_from_now(&self) {
        self.remembering.store(true, Ordering::Release);
    }

    /// Whether denials are remembered now (not while [`DenyCache::hold`] holds).
    pub fn remembers(&self) -> bool {
        self.remembering.load(Ordering::Acquire)
    }

    /// True when nothing is remembered (then a lookup cannot hit).
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The key's hash and its shard. The shard comes from bits the table does not use for
    /// its buckets (the low ones) or its tags (the top seven), so the keys of one shard still
    /// spread over that shard's table.
    fn shard(&self, key: &str) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 32) as usize % SHARDS])
    }

    /// The store's verdicts for a remembered denial, aged to `now`, or None when `key` is not
    /// known to be over its limit (an expired entry is dropped here).
    pub fn get(&self, key: &str, now: Instant) -> Option<Vec<Verdict>> {
        self.recall(key, now)
            .map(|denial| denial.aged(now).collect())
    }

    /// The remembered denial for `key` while it holds at `now`, or None when `key` is not
    /// known to be over its limit (an expired entry is dropped here).
    pub fn recall(&self, key: &str, now: Instant) -> Option<Arc<Remembered>> {
        if self.is_empty() {
            return None;
        }
        let (hash, shard) = self.shard(key);
        let mut shard = shard.lock().expect("deny cache poisoned");
        let Ok(found) = shard.find_entry(hash, |(k, _)| **k == *key) else {
            return None;
        };
        if now >= found.get().1.until {
            found.remove();
            self.len.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(found.get().1.clone())
    }

    /// Forgets every remembered denial: after an operator's reset the store decides again
    /// (entries only ever save a round trip, so dropping them all is always safe).
    pub fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().expect("deny cache poisoned");
            self.len.fetch_sub(shard.len(), Ordering::Relaxed);
            shard.clear();
        }
    }

    pub fn remember(&self, set: &LimitSet, key: String, asked_at: Instant, verdicts: &[Verdict]) {
        if !self.remembers() {
            return;
        }
        let mut wait: Option<i64> = None;
        for (limit, verdict) in set.iter().zip(verdicts) {
            if verdict.allowed || limit.shadow {
                continue;
            }
            if verdict.retry_after_us <= 0 {
                // "Never" (cost above capacity) or a malformed answer: leave it to the store.
                return;
            }
            wait = Some(wait.map_or(verdict.retry_after_us, |w| w.min(verdict.retry_after_us)));
        }
        let Some(wait) = wait else { return };
        if verdicts.len() != set.len() {
            return;
        }
        let until = asked_at + std::time::Duration::from_micros(wait as u64);
        let (hash, shard) = self.shard(&key);
        let mut shard = shard.lock().expect("deny cache poisoned");
        let same = |(k, _): &(Box<str>, Arc<Remembered>)| **k == *key;
        if shard.len() >= self.per_shard && shard.find(hash, same).is_none() {
            let before = shard.len();
            shard.retain(|(_, e)| e.until > asked_at);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let entry = Arc::new(Remembered {
            asked_at,
            until,
            verdicts: verdicts.into(),
            rendered: RenderedCopy::default(),
        });
        match shard.entry(hash, same, |(k, _)| self.hasher.hash_one(k)) {
            Slot::Occupied(mut occupied) => occupied.get_mut().1 = entry,
            Slot::Vacant(vacant) => {
                vacant.insert((key.into_boxed_str(), entry));
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{Limit, Scope};
    use crate::limit::algorithm::Params;

    fn limit(name: &str, algorithm: Algorithm, shadow: bool, on_limit: OnLimit) -> Limit {
        Limit {
            name: name.into(),
            params: Params {
                algorithm,
                limit: 5,
                period_us: 60_000_000,
                burst: 5,
                cost: 1,
                calendar: None,
            },
            key: vec![],
            scope: Scope::Global,
            on_limit,
            shadow,
            by_response: None,
            block_for: None,
            sync: None,
        }
    }

    /// Boxed: the cache tells limit sets apart by address.
    fn route(limits: Vec<Limit>) -> Box<LimitSet> {
        Box::new(LimitSet::new("r", None, limits, true))
    }

    fn denied(retry_s: i64) -> Verdict {
        Verdict {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_after_us: retry_s * 2_000_000,
            retry_after_us: retry_s * 1_000_000,
        }
    }

    fn allowed() -> Verdict {
        Verdict {
            allowed: true,
            limit: 5,
            remaining: 3,
            reset_after_us: 4_000_000,
            retry_after_us: 0,
        }
    }

    fn keys(r: &LimitSet, user: &str) -> String {
        key(r, &[format!("p{{r|{user}}}:a")])
    }

    #[test]
    fn a_denial_is_served_until_the_retry_time_then_the_store_decides_again() {
        let cache = DenyCache::new(16);
        let r = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let t0 = Instant::now();
        cache.remember(&r, keys(&r, "u"), t0, &[denied(10)]);
        assert_eq!(cache.len(), 1);

        let hit = cache
            .get(&keys(&r, "u"), t0 + Duration::from_secs(4))
            .unwrap();
        assert!(!hit[0].allowed);
        assert_eq!(hit[0].retry_after_us, 6_000_000, "aged by the time elapsed");
        assert_eq!(hit[0].reset_after_us, 16_000_000);
        assert_eq!(hit[0].remaining, 0);

        assert!(cache.get(&keys(&r, "v"), t0).is_none(), "another caller");
        let last = t0 + Duration::from_micros(9_999_999);
        assert_eq!(
            cache.get(&keys(&r, "u"), last).unwrap()[0].retry_after_us,
            1
        );
        // At the retry time the store must be asked again: the entry is gone.
        assert!(cache
            .get(&keys(&r, "u"), t0 + Duration::from_secs(10))
            .is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn a_held_cache_remembers_nothing_until_its_watch_has_judged() {
        let cache = DenyCache::new(16);
        let r = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let t0 = Instant::now();
        cache.hold();
        cache.remember(&r, keys(&r, "u"), t0, &[denied(10)]);
        assert!(cache.is_empty());
        cache.judge_from_now();
        cache.remember(&r, keys(&r, "u"), t0, &[denied(10)]);
        assert!(cache.get(&keys(&r, "u"), t0).is_some());
    }

    #[test]
    fn lasts_only_as_long_as_the_shortest_violated_limit() {
        let cache = DenyCache::new(16);
        let r = route(vec![
            limit("a", Algorithm::Gcra, false, OnLimit::Reject),
            limit("b", Algorithm::FixedWindow, false, OnLimit::Reject),
            limit("c", Algorithm::SlidingWindow, false, OnLimit::Reject),
        ]);
        let t0 = Instant::now();
        cache.remember(&r, keys(&r, "u"), t0, &[denied(30), denied(5), allowed()]);
        assert!(cache
            .get(&keys(&r, "u"), t0 + Duration::from_secs(4))
            .is_some());
        assert!(cache
            .get(&keys(&r, "u"), t0 + Duration::from_secs(5))
            .is_none());
    }

    #[test]
    fn admissions_shadow_denials_and_never_answers_are_not_remembered() {
        let cache = DenyCache::new(16);
        let r = route(vec![
            limit("a", Algorithm::Gcra, false, OnLimit::Reject),
            limit("s", Algorithm::Gcra, true, OnLimit::Reject),
        ]);
        let t0 = Instant::now();
        cache.remember(&r, keys(&r, "u"), t0, &[allowed(), allowed()]);
        cache.remember(&r, keys(&r, "v"), t0, &[allowed(), denied(10)]);
        let mut never = denied(1);
        never.retry_after_us = -1;
        cache.remember(&r, keys(&r, "w"), t0, &[never, allowed()]);
        assert!(cache.is_empty());
        // A shadow denial next to an enforcing one does not stretch the entry.
        cache.remember(&r, keys(&r, "x"), t0, &[denied(2), denied(60)]);
        assert!(cache
            .get(&keys(&r, "x"), t0 + Duration::from_secs(2))
            .is_none());
    }

    #[test]
    fn concurrency_and_delay_routes_are_not_cacheable() {
        let plain = route(vec![
            limit("a", Algorithm::Gcra, false, OnLimit::Reject),
            limit("s", Algorithm::FixedWindow, true, OnLimit::Reject),
        ]);
        assert!(cacheable(&plain));
        let concurrency = route(vec![limit(
            "c",
            Algorithm::Concurrency,
            false,
            OnLimit::Reject,
        )]);
        assert!(!cacheable(&concurrency));
        let delay = route(vec![limit(
            "d",
            Algorithm::TokenBucket,
            false,
            OnLimit::Delay {
                max_delay: Duration::from_millis(100),
            },
        )]);
        assert!(!cacheable(&delay));
    }

    #[test]
    fn routes_with_the_same_keys_do_not_share_entries() {
        let cache = DenyCache::new(16);
        let a = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let tier = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let store_keys = vec!["p{r|u}:a".to_string()];
        let t0 = Instant::now();
        cache.remember(&a, key(&a, &store_keys), t0, &[denied(10)]);
        assert!(cache.get(&key(&a, &store_keys), t0).is_some());
        assert!(cache.get(&key(&tier, &store_keys), t0).is_none());
    }

    /// Two requests of one caller that were both denied by the store (they asked at the same
    /// time) leave one entry, the later answer; the count that lets lookups skip every lock
    /// goes back to zero when it expires.
    #[test]
    fn a_second_denial_of_the_same_caller_replaces_the_first() {
        let cache = DenyCache::new(16);
        let r = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let t0 = Instant::now();
        cache.remember(&r, keys(&r, "u"), t0, &[denied(10)]);
        cache.remember(&r, keys(&r, "u"), t0, &[denied(3)]);
        assert_eq!(cache.len(), 1);
        let hit = cache.get(&keys(&r, "u"), t0).unwrap();
        assert_eq!(hit[0].retry_after_us, 3_000_000);
        assert!(cache
            .get(&keys(&r, "u"), t0 + Duration::from_secs(3))
            .is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn bounded_in_size_with_expired_entries_making_room() {
        let cache = DenyCache::new(SHARDS * 2);
        let r = route(vec![limit("a", Algorithm::Gcra, false, OnLimit::Reject)]);
        let t0 = Instant::now();
        for i in 0..1000 {
            cache.remember(&r, keys(&r, &format!("u{i}")), t0, &[denied(1)]);
        }
        assert!(cache.len() <= SHARDS * 2, "{} entries", cache.len());
        assert!(cache.len() >= SHARDS, "{} entries", cache.len());
        // Once those expired, new denials take their places.
        let t1 = t0 + Duration::from_secs(2);
        for i in 0..1000 {
            cache.remember(&r, keys(&r, &format!("n{i}")), t1, &[denied(1)]);
        }
        assert!(cache.len() <= SHARDS * 2);
        let remembered = (0..1000)
            .filter(|i| cache.get(&keys(&r, &format!("n{i}")), t1).is_some())
            .count();
        assert_eq!(remembered, cache.len());
        assert!(remembered >= SHARDS);
    }

    /// A reused response is byte for byte the one a fresh render would give at that moment,
    /// and rendering happens again exactly when a shown second changes.
    #[test]
    fn a_rendered_denial_is_reused_only_while_its_seconds_stay_the_same() {
        use crate::config::ResponseConfig;
        use crate::throttle::headers;
        use std::cell::Cell;

        let cache = DenyCache::new(16);
        let r = route(vec![
            limit("a", Algorithm::Gcra, false, OnLimit::Reject),
            limit("b", Algorithm::FixedWindow, false, OnLimit::Reject),
        ]);
        let config = ResponseConfig {
            status: http::StatusCode::TOO_MANY_REQUESTS,
            ietf: true,
            legacy: true,
        };
        let render = |verdicts: &[Verdict]| headers::render_limited(&config, &r, verdicts);
        let t0 = Instant::now();
        // Retry after 10.5 s on one limit, 3.25 s on the other (reset twice as far).
        let mut first = denied(10);
        first.retry_after_us = 10_500_000;
        let mut second = denied(3);
        second.retry_after_us = 3_250_000;
        cache.remember(&r, keys(&r, "u"), t0, &[first, second]);

        let renders = Cell::new(0);
        let mut last_body = None;
        for ms in (0..3_250).step_by(125) {
            let now = t0 + Duration::from_millis(ms);
            let denial = cache.recall(&keys(&r, "u"), now).expect("still denied");
            let served = headers::render_reusing(&denial.rendered, denial.aged(now), |v| {
                renders.set(renders.get() + 1);
                render(v)
            });
            let fresh = render(&cache.get(&keys(&r, "u"), now).unwrap());
            assert_eq!(served.status, fresh.status, "at {ms} ms");
            assert_eq!(served.headers, fresh.headers, "at {ms} ms");
            assert_eq!(served.body, fresh.body, "at {ms} ms");
            last_body = Some(served.body);
        }
        // 26 requests; the shown seconds change at 0.25, 0.5, 1, 1.25, 1.5, 2, 2.25, 2.5 and 3 s
        // (retries 10.5 s and 3.25 s, resets 20 s and 6 s): the first render plus nine.
        assert_eq!(renders.get(), 10);
        let body = String::from_utf8(last_body.unwrap().to_vec()).unwrap();
        assert!(body.contains("retry after 8 second(s)"), "{body}");
        assert!(
            cache
                .recall(&keys(&r, "u"), t0 + Duration::from_millis(3_250))
                .is_none(),
            "gone once the shortest wait has passed"
        );
    }
}
