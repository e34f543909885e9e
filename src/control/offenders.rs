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
//!
//! Beside its callers, each route ranks its refused callers' client networks (an IPv4 /24, an
//! IPv6 /48: [`network_of`]) and, on a route with several limits, the callers each limit
//! refused, in sketches of the same kind. A flood of one-off callers (each refused once) fills
//! a route's caller list with counters near the sketch's floor, and an abuser refused less
//! than `total / capacity` times may drop out of it; the same flood from one network is one
//! item in the network list, counted exactly while fewer than [`CAPACITY`] networks are
//! refused in a sub-window, so the flooding network and the abuser's own both show there.
//! A flood on one limit does not crowd out a caller another limit refuses, either. The bound
//! per list is the sketch's: anything refused more than `total / capacity` times in that
//! list is listed.
//!
//! With a Redis store the sketch is also linked to it ([`Offenders::link`]): a background task
//! publishes this replica's lists once a second and [`Offenders::top_of`] merges every
//! replica's ([`super::fleet`]); recording a denial stays a local increment either way.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::denials::RecentDenials;
use super::fleet::{self, RouteList, Snapshot};
use crate::config::LimitSet;
use crate::limit::{new_lease_id, Store};
use crate::store::Shared;
use crate::throttle::keys;

/// Counters per route and sub-window.
pub const CAPACITY: usize = 128;

/// Marks a list kept beside a route's callers, in the route's name (`<route>\u{1}networks`,
/// `<route>\u{1}limit\u{1}<limit>`): not a character a route name may have, so such a list
/// never meets a route's own, and the fleet's lists carry them like any route's.
const BESIDE: char = '\u{1}';
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
    /// Replicas that saw it denied (1 in this replica's own view).
    pub replicas: u32,
}

impl Offender {
    /// Its entry in a top list (the admin API's and the console's), with its item as the
    /// caller decided to show it: `(sources, identity)`.
    pub fn to_json(&self, (source, identity): (String, String)) -> serde_json::Value {
        serde_json::json!({
            "identity": identity,
            "source": source,
            "count": self.count,
            "error": self.error,
            "replicas": self.replicas,
        })
    }
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

    /// What a caller with no counter in any live sub-window may have had at most: the floors
    /// of the full ones.
    pub fn unlisted(&self, now_ms: u64) -> u64 {
        self.live(now_ms).map(SpaceSaving::floor).sum()
    }

    fn live(&self, now_ms: u64) -> impl Iterator<Item = &SpaceSaving> {
        let number = now_ms / WINDOW_MS;
        self.windows
            .iter()
            .filter(move |(at, _)| {
                *at != u64::MAX && *at <= number && number - *at < WINDOWS as u64
            })
            .map(|(_, s)| s)
    }

    /// The `k` callers denied most over the live sub-windows, most first. Counts sum the
    /// sub-windows; where a caller has no counter in a full sub-window it is counted at that
    /// sub-window's floor (what it may have had), which goes into the error too.
    pub fn top(&self, k: usize, now_ms: u64) -> Vec<Offender> {
        let live: Vec<&SpaceSaving> = self.live(now_ms).collect();
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
                    replicas: 1,
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
pub struct Offenders {
    capacity: usize,
    routes: Mutex<HashMap<String, Minute>>,
    started: std::time::Instant,
    /// The Redis store the fleet's lists go through, and the key prefix (None: memory).
    link: Mutex<Option<(Shared, String)>>,
    /// Whether the publishing task was started (once per sketch).
    publishing: AtomicBool,
    /// This replica among the fleet's: random per sketch, so kept over the reloads that keep
    /// the store (and the sketch), and distinct for proxies sharing a process.
    id: String,
    /// The last denials, in order (the console's "recent denials"): kept with the sketch.
    recent: RecentDenials,
}

/// Which view `/limits/top` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// Every replica's denials, merged through Redis.
    #[default]
    Fleet,
    /// This replica's own.
    Local,
}

/// Why a fleet view was asked for and this replica's own is shown.
pub const MEMORY_STORE: &str = "memory store: each replica counts its own denials";
pub const STORE_UNAVAILABLE: &str = "store unavailable";

/// A top list as `/limits/top` shows it.
#[derive(Debug, Clone, Default)]
pub struct Top {
    /// What it covers.
    pub view: View,
    /// When a fleet view was asked for and this is the local one, why.
    pub reason: Option<&'static str>,
    /// Replicas whose lists were merged: those with denials in the window, and this one.
    pub replicas: usize,
    /// Per route with denials, its top `k`, routes by name.
    pub routes: Vec<(String, Vec<Offender>)>,
    /// Per route with denials, its top `k` client networks (`203.0.113.0/24`), routes by name.
    pub networks: Vec<(String, Vec<Offender>)>,
    /// Per route and limit (on routes with several limits), the top `k` callers that limit
    /// refused, by route then limit name.
    pub by_limit: Vec<(String, String, Vec<Offender>)>,
}

impl Top {
    /// The lists in `all` (each route's, and those kept beside them) sorted into their kinds.
    fn sorted(mut self, all: Vec<(String, Vec<Offender>)>) -> Top {
        for (name, top) in all {
            match name.split_once(BESIDE) {
                None => self.routes.push((name, top)),
                Some((route, "networks")) => self.networks.push((route.to_owned(), top)),
                Some((route, rest)) => {
                    if let Some(limit) = rest.strip_prefix("limit\u{1}") {
                        self.by_limit
                            .push((route.to_owned(), limit.to_owned(), top));
                    }
                }
            }
        }
        self
    }
}

impl std::fmt::Debug for Offenders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offenders")
            .field("capacity", &self.capacity)
            .field("routes", &self.routes)
            .field("publishing", &self.publishing)
            .finish_non_exhaustive()
    }
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
            link: Mutex::new(None),
            publishing: AtomicBool::new(false),
            id: format!("{:016x}", new_lease_id()),
            recent: RecentDenials::default(),
        }
    }

    /// Links the sketch to the configuration's store: with Redis (`slot`), this replica's
    /// lists are published under `key_prefix` from now on (the task starts with the first
    /// link and ends when the sketch is dropped); without, the fleet view is this replica's.
    /// Called with every configuration the sketch serves, so a reload's prefix is followed.
    pub fn link(self: &Arc<Self>, slot: Option<&Shared>, key_prefix: &str) {
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) =
            slot.map(|s| (s.clone(), key_prefix.to_owned()));
        if slot.is_some()
            && tokio::runtime::Handle::try_current().is_ok()
            && !self.publishing.swap(true, Ordering::Relaxed)
        {
            tokio::spawn(publish(Arc::downgrade(self)));
        }
    }

    fn linked(&self) -> Option<(Shared, String)> {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// This replica's lists as it publishes them: per route up to the sketch's capacity,
    /// with the floor an unlisted caller may have had.
    fn snapshot(&self) -> Snapshot {
        let now = self.now_ms();
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let routes = routes
            .iter()
            .filter_map(|(route, minute)| {
                let mut top = minute.top(self.capacity + 1, now);
                if top.is_empty() {
                    return None;
                }
                let mut floor = minute.unlisted(now);
                if top.len() > self.capacity {
                    top.truncate(self.capacity);
                    floor = floor.max(top.last().map_or(0, |o| o.count));
                }
                let top = top
                    .into_iter()
                    .map(|o| (o.item, o.count, o.error))
                    .collect();
                Some((route.clone(), RouteList { floor, top }))
            })
            .collect();
        Snapshot { routes }
    }

    /// The top `k` per route in `view`: the fleet's merges every replica's latest list (this
    /// one's as it is now) when the store is Redis and answers; otherwise this replica's,
    /// saying why.
    pub async fn top_of(&self, k: usize, view: View) -> Top {
        let local = |reason| {
            Top {
                view: View::Local,
                reason,
                replicas: 1,
                ..Top::default()
            }
            .sorted(self.top(k))
        };
        if view == View::Local {
            return local(None);
        }
        let Some((slot, prefix)) = self.linked() else {
            return local(Some(MEMORY_STORE));
        };
        let Some(Store::Redis(redis)) = slot.get().cloned() else {
            return local(Some(STORE_UNAVAILABLE));
        };
        let others = match fleet::read(&redis, &prefix).await {
            Ok(others) => others,
            Err(cause) => {
                tracing::warn!(%cause, "/limits/top: the fleet's lists could not be read; answering with this replica's");
                return local(Some(STORE_UNAVAILABLE));
            }
        };
        let mut snapshots: Vec<Snapshot> = others
            .into_iter()
            .filter(|(id, _)| *id != self.id)
            .map(|(_, snapshot)| snapshot)
            .collect();
        snapshots.push(self.snapshot());
        let routes = fleet::merge(&snapshots, k)
            .into_iter()
            .map(|(route, merged)| {
                let top = merged
                    .into_iter()
                    .map(|m| Offender {
                        item: m.item,
                        count: m.count,
                        error: m.error,
                        replicas: m.replicas,
                    })
                    .collect();
                (route, top)
            })
            .collect();
        Top {
            view: View::Fleet,
            reason: None,
            replicas: snapshots.len(),
            ..Top::default()
        }
        .sorted(routes)
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
    /// under the route's name (a tier's denials count for its route); under the client's
    /// network (`client`: the client address, as `client_ip` reads it); and, when `limit`
    /// names the limit that refused on a route with several, under that limit.
    pub fn record_denial(
        &self,
        key_prefix: &str,
        set: &LimitSet,
        key: &str,
        limit: Option<&str>,
        client: IpAddr,
    ) {
        let route = set.route.split('~').next().unwrap_or(&set.route);
        if let Some(item) = keys::identity_of(key_prefix, set, key) {
            self.record(route, item);
            if let Some(limit) = limit.filter(|_| set.len() > 1) {
                self.record(&format!("{route}{BESIDE}limit{BESIDE}{limit}"), item);
            }
        }
        self.record(
            &format!("{route}{BESIDE}networks"),
            &network_of(client).to_string(),
        );
    }

    /// The last denials this replica answered.
    pub fn recent(&self) -> &RecentDenials {
        &self.recent
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

/// The network a client counts in for the network lists: an IPv4 /24, an IPv6 /48 (one
/// site's allocation), IPv4-mapped IPv6 as IPv4.
pub fn network_of(ip: IpAddr) -> IpNet {
    let (ip, bits) = match ip.to_canonical() {
        ip @ IpAddr::V4(_) => (ip, 24),
        ip @ IpAddr::V6(_) => (ip, 48),
    };
    IpNet::new(ip, bits).map_or(IpNet::from(ip), |net| net.trunc())
}

/// Publishes the sketch's lists every [`fleet::PUBLISH_EVERY`] while it is linked to a
/// connected Redis store; an idle replica publishes once to remove its entry, then nothing.
async fn publish(offenders: Weak<Offenders>) {
    let mut tick = tokio::time::interval(fleet::PUBLISH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether Redis holds nothing of this replica's (true at the start: nothing was sent).
    let mut published_empty = true;
    let mut failing = false;
    loop {
        tick.tick().await;
        let Some(sketch) = offenders.upgrade() else {
            return;
        };
        let Some((slot, prefix)) = sketch.linked() else {
            continue;
        };
        let snapshot = sketch.snapshot();
        let id = sketch.id.clone();
        drop(sketch);
        if snapshot.is_empty() && published_empty {
            continue;
        }
        let Some(Store::Redis(redis)) = slot.get().cloned() else {
            continue;
        };
        match fleet::publish(&redis, &prefix, &id, &snapshot).await {
            Ok(()) => {
                published_empty = snapshot.is_empty();
                failing = false;
            }
            Err(cause) if !failing => {
                failing = true;
                tracing::warn!(%cause, "top offenders: this replica's list could not be published; the fleet view misses it until Redis answers");
            }
            Err(_) => {}
        }
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
    fn the_published_list_is_cut_at_capacity_with_the_floor_of_what_was_left_out() {
        let offenders = Offenders::new(2);
        for (item, n) in [("a", 5), ("b", 3)] {
            for _ in 0..n {
                offenders.record("api", item);
            }
        }
        // A full sketch: a caller without a counter may have had up to its smallest count.
        let listed = offenders.snapshot();
        assert_eq!(listed.routes["api"].floor, 3);
        assert_eq!(
            listed.routes["api"].top,
            [("a".to_owned(), 5, 0), ("b".to_owned(), 3, 0)]
        );
        // A third caller takes b's counter (count 4, error 3): b may have had up to 4.
        offenders.record("api", "c");
        let listed = offenders.snapshot();
        assert_eq!(listed.routes["api"].floor, 4);
        assert_eq!(
            listed.routes["api"].top,
            [("a".to_owned(), 5, 0), ("c".to_owned(), 4, 3)]
        );
        assert!(Offenders::new(2).snapshot().is_empty());
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

    #[test]
    fn a_network_is_a_24_or_a_48() {
        let net = |ip: &str| network_of(ip.parse().unwrap()).to_string();
        assert_eq!(net("203.0.113.77"), "203.0.113.0/24");
        assert_eq!(net("2001:db8:1:2::5"), "2001:db8:1::/48");
        assert_eq!(net("::ffff:10.1.2.3"), "10.1.2.0/24");
    }

    #[test]
    fn the_lists_beside_a_route_are_sorted_into_their_kinds() {
        let offenders = Offenders::default();
        for _ in 0..3 {
            offenders.record("api", "header=a");
        }
        offenders.record(&format!("api{BESIDE}networks"), "10.0.0.0/24");
        offenders.record(&format!("api{BESIDE}limit{BESIDE}burst"), "header=a");
        let top = Top::default().sorted(offenders.top(10));
        let names = |list: &[(String, Vec<Offender>)]| -> Vec<(String, String, u64)> {
            list.iter()
                .flat_map(|(r, o)| o.iter().map(|o| (r.clone(), o.item.clone(), o.count)))
                .collect()
        };
        assert_eq!(names(&top.routes), [("api".into(), "header=a".into(), 3)]);
        assert_eq!(
            names(&top.networks),
            [("api".into(), "10.0.0.0/24".into(), 1)]
        );
        assert_eq!(top.by_limit.len(), 1);
        assert_eq!((&*top.by_limit[0].0, &*top.by_limit[0].1), ("api", "burst"));
        assert_eq!(top.by_limit[0].2[0].item, "header=a");
    }
}
