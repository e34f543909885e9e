//! Top offenders: per route, which callers were denied most in the last minute, in bounded
//! memory whatever the number of distinct callers.
//!
//! Exact counts per caller would grow with every identity an attacker invents (and a label per
//! identity would blow up the metrics), so each route keeps a Space-Saving sketch (Metwally,
//! Agrawal, El Abbadi 2005) of fixed capacity: at most [`CAPACITY`] counters; a new caller
//! arriving when all are taken replaces the smallest one and inherits its count as its error.
//! A reported count is therefore an upper bound, overestimating by at most its `error`, and
//! any caller denied more than `total / capacity` times is guaranteed to be listed.
//!
//! "The last minute" is [`WINDOWS`] sub-windows of [`WINDOW_MS`] each, rotated as time moves;
//! a query merges the live ones. The sketch is pure (the caller passes the time) so the
//! tests drive it. The proxy records each limited request here, by the store key the limit
//! stage denied ([`Offenders::record_denial`]).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::config::LimitSet;
use crate::throttle::keys;

/// Counters per route and sub-window.
pub const CAPACITY: usize = 128;
/// Sub-windows making up the minute.
pub const WINDOWS: usize = 6;
/// Length of one sub-window (milliseconds).
pub const WINDOW_MS: u64 = 10_000;

#[derive(Debug, Clone)]
struct Counter {
    item: Box<str>,
    count: u64,
    /// How much of `count` may belong to the items this counter replaced.
    error: u64,
}

/// The Space-Saving summary: at most `capacity` counters, whatever is recorded.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    index: HashMap<Box<str>, usize>,
}

impl SpaceSaving {
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            counters: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Counters in use: never more than the capacity.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn record(&mut self, item: &str) {
        if let Some(&i) = self.index.get(item) {
            self.counters[i].count += 1;
            return;
        }
        if self.counters.len() < self.capacity {
            self.index.insert(item.into(), self.counters.len());
            self.counters.push(Counter {
                item: item.into(),
                count: 1,
                error: 0,
            });
            return;
        }
        // Replace the smallest counter: the newcomer may have been counted there all along.
        let (min_at, _) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .expect("capacity is at least one");
        let evicted = &mut self.counters[min_at];
        self.index.remove(&evicted.item);
        evicted.error = evicted.count;
        evicted.count += 1;
        evicted.item = item.into();
        self.index.insert(item.into(), min_at);
    }

    /// (count, error) of `item` if it holds a counter.
    fn get(&self, item: &str) -> Option<(u64, u64)> {
        self.index.get(item).map(|&i| {
            let c = &self.counters[i];
            (c.count, c.error)
        })
    }

    /// What an item without a counter may have had at most: the smallest count once full.
    fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.counters.iter().map(|c| c.count).min().unwrap_or(0)
        }
    }

    fn clear(&mut self) {
        self.counters.clear();
        self.index.clear();
    }
}

/// One caller in a top list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offender {
    /// What was recorded (the identity part of the store key).
    pub item: String,
    /// Denials in the window, an upper bound.
    pub count: u64,
    /// `count` overestimates the true number by at most this much.
    pub error: u64,
}

/// A minute of one route's denials: [`WINDOWS`] rotating sketches.
#[derive(Debug, Clone)]
pub struct Minute {
    /// (sub-window number since the clock's start, its sketch).
    windows: Vec<(u64, SpaceSaving)>,
}

impl Minute {
    pub fn new(capacity: usize) -> Self {
        Minute {
            windows: (0..WINDOWS)
                .map(|_| (u64::MAX, SpaceSaving::new(capacity)))
                .collect(),
        }
    }

    pub fn record(&mut self, item: &str, now_ms: u64) {
        let number = now_ms / WINDOW_MS;
        let (at, sketch) = &mut self.windows[(number % WINDOWS as u64) as usize];
        if *at != number {
            *at = number;
            sketch.clear();
        }
        sketch.record(item);
    }

    /// Counters in use over all sub-windows: at most `WINDOWS * capacity`.
    pub fn counters(&self) -> usize {
        self.windows.iter().map(|(_, s)| s.len()).sum()
    }

    /// The `k` callers denied most over the live sub-windows, most first. Counts sum the
    /// sub-windows; where a caller has no counter in a full sub-window it is counted at that
    /// sub-window's floor (what it may have had), which goes into the error too.
    pub fn top(&self, k: usize, now_ms: u64) -> Vec<Offender> {
        let number = now_ms / WINDOW_MS;
        let live: Vec<&SpaceSaving> = self
            .windows
            .iter()
            .filter(|(at, _)| *at != u64::MAX && *at <= number && number - *at < WINDOWS as u64)
            .map(|(_, s)| s)
            .collect();
        let mut seen: HashMap<&str, ()> = HashMap::new();
        let mut out = Vec::new();
        for sketch in &live {
            for counter in &sketch.counters {
                if seen.insert(&counter.item, ()).is_some() {
                    continue;
                }
                let (mut count, mut error) = (0, 0);
                for other in &live {
                    match other.get(&counter.item) {
                        Some((c, e)) => {
                            count += c;
                            error += e;
                        }
                        None => {
                            let floor = other.floor();
                            count += floor;
                            error += floor;
                        }
                    }
                }
                out.push(Offender {
                    item: counter.item.to_string(),
                    count,
                    error,
                });
            }
        }
        // Most denied first; on a tie the one known more exactly, then by name (stable output).
        out.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.error.cmp(&b.error))
                .then(a.item.cmp(&b.item))
        });
        out.truncate(k);
        out
    }
}

/// Every route's minute, behind one lock (only denials record, and a denial is cheap here:
/// a hash lookup and an increment).
#[derive(Debug)]
pub struct Offenders {
    capacity: usize,
    routes: Mutex<HashMap<String, Minute>>,
    started: std::time::Instant,
}

impl Default for Offenders {
    fn default() -> Self {
        Offenders::new(CAPACITY)
    }
}

impl Offenders {
    pub fn new(capacity: usize) -> Self {
        Offenders {
            capacity,
            routes: Mutex::new(HashMap::new()),
            started: std::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Counts one denial of `item` on `route` (a tier's denials count for its route).
    pub fn record(&self, route: &str, item: &str) {
        let route = route.split('~').next().unwrap_or(route);
        let now = self.now_ms();
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        match routes.get_mut(route) {
            Some(minute) => minute.record(item, now),
            None => {
                let mut minute = Minute::new(self.capacity);
                minute.record(item, now);
                routes.insert(route.to_owned(), minute);
            }
        }
    }

    /// Counts a denial under `set` (`key`: the store key of its first limit, in `key_prefix`),
    /// under the route's name (a tier's denials count for its route).
    pub fn record_denial(&self, key_prefix: &str, set: &LimitSet, key: &str) {
        if let Some(item) = keys::identity_of(key_prefix, set, key) {
            self.record(&set.route, item);
        }
    }

    /// Per route with denials in the last minute, its top `k`, routes by name.
    pub fn top(&self, k: usize) -> Vec<(String, Vec<Offender>)> {
        let now = self.now_ms();
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, Vec<Offender>)> = routes
            .iter()
            .map(|(route, minute)| (route.clone(), minute.top(k, now)))
            .filter(|(_, top)| !top.is_empty())
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Counters in use for `route` (tests check the bound).
    pub fn counters(&self, route: &str) -> usize {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.get(route).map_or(0, Minute::counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_most_denied_first_with_exact_counts_below_capacity() {
        let mut minute = Minute::new(8);
        for (item, n) in [("b", 20), ("a", 30), ("c", 10)] {
            for _ in 0..n {
                minute.record(item, 1_000);
            }
        }
        let top = minute.top(10, 2_000);
        let got: Vec<(&str, u64, u64)> = top
            .iter()
            .map(|o| (o.item.as_str(), o.count, o.error))
            .collect();
        assert_eq!(got, vec![("a", 30, 0), ("b", 20, 0), ("c", 10, 0)]);
        assert_eq!(minute.top(2, 2_000).len(), 2);
    }

    #[test]
    fn counts_are_upper_bounds_within_their_error() {
        // 3 heavy hitters among a stream of 10,000 one-off callers, interleaved.
        let mut sketch = SpaceSaving::new(16);
        let mut truth: HashMap<String, u64> = HashMap::new();
        for i in 0..10_000u64 {
            let item = match i % 10 {
                0..=2 => "heavy-1".to_owned(),
                3 | 4 => "heavy-2".to_owned(),
                5 => "heavy-3".to_owned(),
                _ => format!("once-{i}"),
            };
            sketch.record(&item);
            *truth.entry(item).or_default() += 1;
        }
        assert_eq!(sketch.len(), 16);
        let total: u64 = truth.values().sum();
        for counter in &sketch.counters {
            let true_count = truth[&*counter.item];
            assert!(
                counter.count >= true_count,
                "{counter:?} below {true_count}"
            );
            assert!(counter.count - counter.error <= true_count, "{counter:?}");
            // The classic bound: no count is off by more than total / capacity.
            assert!(counter.error <= total / 16, "{counter:?}");
        }
        let mut minute = Minute::new(16);
        for i in 0..10_000u64 {
            let item = match i % 10 {
                0..=2 => "heavy-1".to_owned(),
                3 | 4 => "heavy-2".to_owned(),
                5 => "heavy-3".to_owned(),
                _ => format!("once-{i}"),
            };
            minute.record(&item, 0);
        }
        let top: Vec<String> = minute.top(3, 0).into_iter().map(|o| o.item).collect();
        assert_eq!(top, ["heavy-1", "heavy-2", "heavy-3"]);
    }

    #[test]
    fn memory_stays_fixed_under_100_000_distinct_callers() {
        let mut minute = Minute::new(CAPACITY);
        for i in 0..100_000u64 {
            // Spread over the whole minute so every sub-window fills.
            minute.record(&format!("caller-{i}"), i * 60_000 / 100_000);
            if i % 10 == 0 {
                minute.record("loud", i * 60_000 / 100_000);
            }
        }
        assert!(minute.counters() <= WINDOWS * CAPACITY);
        for (_, sketch) in &minute.windows {
            assert_eq!(sketch.len(), CAPACITY);
            assert_eq!(sketch.index.len(), CAPACITY);
        }
        let top = minute.top(10, 59_999);
        assert_eq!(top.len(), 10);
        assert_eq!(top[0].item, "loud");
        assert!(top[0].count >= 10_000);
    }

    #[test]
    fn the_minute_rotates() {
        let mut minute = Minute::new(8);
        minute.record("old", 0);
        minute.record("new", 55_000);
        let items = |t| -> Vec<String> { minute.top(10, t).into_iter().map(|o| o.item).collect() };
        assert_eq!(items(59_000), ["new", "old"]);
        // Past a minute, the first sub-window is no longer counted, and is reused.
        assert_eq!(items(61_000), ["new"]);
        minute.record("newest", 61_000);
        assert_eq!(minute.top(10, 61_000).len(), 2);
    }

    #[test]
    fn tiers_count_for_their_route() {
        let offenders = Offenders::new(4);
        offenders.record("api~gold", "header=a");
        offenders.record("api", "header=a");
        let top = offenders.top(10);
        assert_eq!(top.len(), 1);
        assert_eq!((top[0].0.as_str(), top[0].1[0].count), ("api", 2));
    }
}
