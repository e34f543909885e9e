//! The per-route record of callers' peak rates, pure (the caller passes the time, so tests
//! drive it): a bounded table of live per-caller counters, and per clock hour the histograms
//! ([`super::hist`]) the counters are folded into.
//!
//! A caller is known by a 64-bit keyed hash of its key's identity part (keyed from the key
//! prefix, the same in every replica, see `super::Suggest::new`): no identity value,
//! credential or not, is kept.
//!
//! Per caller and clock hour (UTC): its peak per-minute rate, as `sliding_window` counts it
//! (the current minute's requests plus the previous minute's weighted by the part of it still
//! in the last 60 s, rounded up: a `sliding_window` limit of L per minute refuses the caller
//! exactly when this peak is above L), its peak per-second rate (requests in one clock
//! second), its requests, and how many of them the route's limits refused or would have
//! refused (shadow). When the caller's hour ends (its next request is in a later hour, or the
//! record is read after it) the caller goes into that hour's histograms. A caller active in
//! several hours counts once in each: the windows' "callers" are caller-hours.
//!
//! Bounded: at most [`CAPACITY`] live counters per route and shard (each ~64 bytes with its
//! index entry); a new caller arriving at a full table evicts the least recently seen of
//! [`SAMPLE`] sampled counters (its peak so far goes into its hour, and a later return counts
//! as another caller: evictions are counted and reported). Histograms: [`KEEP_HOURS`] hours
//! of at most [`super::hist::BUCKETS`] buckets each, two kinds.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::hist::Histogram;

/// Locks the record is split over (by caller hash), so serving threads rarely meet.
pub const SHARDS: usize = 8;
/// Live counters per route and shard.
pub const CAPACITY: usize = 1024;
/// Counters looked at to pick one to evict.
pub const SAMPLE: usize = 8;
/// Clock hours kept: the current one and the 24 before it.
pub const KEEP_HOURS: u32 = 25;

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;

/// What the limit stage did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Admitted,
    /// Admitted, but a shadow limit would have refused it.
    Shadow,
    Refused,
}

/// One clock hour of one route, mergeable (replicas add up).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hour {
    /// Callers by peak per-minute rate; requests by the same.
    pub minute: Histogram,
    /// Callers by peak per-second rate.
    pub second: Histogram,
    /// Requests the route's limits refused, and callers refused at least once.
    pub refused_requests: u64,
    pub refused_callers: u64,
    /// Requests a shadow limit would have refused, and such callers.
    pub shadow_requests: u64,
    pub shadow_callers: u64,
    /// Counters evicted to make room (each may count its caller twice).
    pub evicted: u64,
}

impl Hour {
    pub fn merge(&mut self, other: &Hour) {
        self.minute.merge(&other.minute);
        self.second.merge(&other.second);
        self.refused_requests += other.refused_requests;
        self.refused_callers += other.refused_callers;
        self.shadow_requests += other.shadow_requests;
        self.shadow_callers += other.shadow_callers;
        self.evicted += other.evicted;
    }
}

/// One caller's counters in its current hour.
#[derive(Debug, Clone)]
struct Live {
    hash: u64,
    hour: u32,
    minute: u64,
    current: u32,
    previous: u32,
    peak_minute: u32,
    second: u64,
    in_second: u32,
    peak_second: u32,
    requests: u32,
    refused: u32,
    shadow: u32,
    last_ms: u64,
    /// What of this counter the fleet's per-caller record already holds.
    sent: Counts,
}

/// One caller's figures in one hour: requests, peaks, refused and shadow-refused requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u32,
    pub minute: u32,
    pub second: u32,
    pub refused: u32,
    pub shadow: u32,
}

/// What one caller's counter gained since it was last sent to the fleet's record
/// (`super::fleet`): the fleet adds these up over replicas, caller by caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    pub hour: u32,
    pub hash: u64,
    pub gained: Counts,
}

impl Live {
    fn new(hash: u64, now_ms: u64) -> Live {
        Live {
            hash,
            hour: (now_ms / HOUR_MS) as u32,
            minute: now_ms / MINUTE_MS,
            current: 0,
            previous: 0,
            peak_minute: 0,
            second: now_ms / 1000,
            in_second: 0,
            peak_second: 0,
            requests: 0,
            refused: 0,
            shadow: 0,
            last_ms: now_ms,
            sent: Counts::default(),
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            requests: self.requests,
            minute: self.peak_minute,
            second: self.peak_second,
            refused: self.refused,
            shadow: self.shadow,
        }
    }

    /// What was gained since the last call (every figure only grows within an hour), and
    /// marks it sent.
    fn take_delta(&mut self) -> Option<Delta> {
        let now = self.counts();
        let was = std::mem::replace(&mut self.sent, now);
        (now.requests > was.requests).then(|| Delta {
            hour: self.hour,
            hash: self.hash,
            gained: Counts {
                requests: now.requests - was.requests,
                minute: now.minute - was.minute,
                second: now.second - was.second,
                refused: now.refused - was.refused,
                shadow: now.shadow - was.shadow,
            },
        })
    }

    fn count(&mut self, seen: Seen, now_ms: u64) {
        let minute = now_ms / MINUTE_MS;
        if minute != self.minute {
            self.previous = if minute == self.minute + 1 {
                self.current
            } else {
                0
            };
            self.current = 0;
            self.minute = minute;
        }
        self.current = self.current.saturating_add(1);
        // sliding_window's count: previous × (60 s − elapsed) / 60 s + current, rounded up.
        let elapsed = now_ms % MINUTE_MS;
        let weighted = self.current as u64 * MINUTE_MS
            + self.previous as u64 * (MINUTE_MS - elapsed)
            + (MINUTE_MS - 1);
        let sliding = (weighted / MINUTE_MS).min(u32::MAX as u64) as u32;
        self.peak_minute = self.peak_minute.max(sliding);
        let second = now_ms / 1000;
        if second != self.second {
            self.second = second;
            self.in_second = 0;
        }
        self.in_second = self.in_second.saturating_add(1);
        self.peak_second = self.peak_second.max(self.in_second);
        self.requests = self.requests.saturating_add(1);
        match seen {
            Seen::Admitted => {}
            Seen::Shadow => self.shadow = self.shadow.saturating_add(1),
            Seen::Refused => self.refused = self.refused.saturating_add(1),
        }
        self.last_ms = now_ms;
    }

    fn fold_into(&self, hour: &mut Hour) {
        if self.requests == 0 {
            return;
        }
        hour.minute.add(self.peak_minute, self.requests as u64);
        hour.second.add(self.peak_second, self.requests as u64);
        hour.refused_requests += self.refused as u64;
        hour.refused_callers += (self.refused > 0) as u64;
        hour.shadow_requests += self.shadow as u64;
        hour.shadow_callers += (self.shadow > 0) as u64;
    }
}

/// One route's record (in one shard).
#[derive(Debug)]
pub struct RouteRecord {
    capacity: usize,
    live: Vec<Live>,
    /// Caller hash → its counter in `live`. The keys are already hashes, but of callers'
    /// values with a seed every replica shares, so the table hashes them again with a seed
    /// of its own process (a caller cannot aim at its buckets); foldhash, not SipHash: this
    /// runs on every request of a limited route.
    index: HashMap<u64, usize, foldhash::fast::RandomState>,
    /// Clock hour number (since the Unix epoch) → its folded callers.
    hours: BTreeMap<u32, Hour>,
    /// xorshift state for eviction samples.
    rng: u64,
    /// Ended counters' last gains, not yet sent to the fleet's record: at most `capacity`.
    pending: Vec<Delta>,
}

impl RouteRecord {
    pub fn new(capacity: usize) -> Self {
        RouteRecord {
            capacity: capacity.max(1),
            live: Vec::new(),
            index: HashMap::default(),
            hours: BTreeMap::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            pending: Vec::new(),
        }
    }

    /// Live counters: never more than the capacity.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Counts one request of the caller `hash` at `now_ms` (Unix time, ms).
    pub fn observe(&mut self, hash: u64, seen: Seen, now_ms: u64) {
        let hour = (now_ms / HOUR_MS) as u32;
        let at = match self.index.get(&hash) {
            Some(&at) => {
                if self.live[at].hour != hour {
                    let ended = std::mem::replace(&mut self.live[at], Live::new(hash, now_ms));
                    self.fold(ended);
                }
                at
            }
            None if self.live.len() < self.capacity => {
                self.live.push(Live::new(hash, now_ms));
                self.index.insert(hash, self.live.len() - 1);
                self.live.len() - 1
            }
            None => {
                let at = self.coldest();
                let evicted = std::mem::replace(&mut self.live[at], Live::new(hash, now_ms));
                self.index.remove(&evicted.hash);
                self.index.insert(hash, at);
                self.fold(evicted);
                self.hours.entry(hour).or_default().evicted += 1;
                at
            }
        };
        self.live[at].count(seen, now_ms);
    }

    /// The least recently seen of a few sampled counters.
    fn coldest(&mut self) -> usize {
        let mut best = 0;
        let mut best_ms = u64::MAX;
        for _ in 0..SAMPLE {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let at = (self.rng % self.live.len() as u64) as usize;
            if self.live[at].last_ms < best_ms {
                best = at;
                best_ms = self.live[at].last_ms;
            }
        }
        best
    }

    /// An ended counter goes into its hour, and its unsent gain waits for the next send;
    /// dropped when `capacity` gains already wait (a key flood evicting faster than the
    /// sends drain: its evictions are counted; with a memory store nothing drains them).
    fn fold(&mut self, mut live: Live) {
        live.fold_into(self.hours.entry(live.hour).or_default());
        if let Some(delta) = live.take_delta() {
            if self.pending.len() < self.capacity {
                self.pending.push(delta);
            }
        }
    }

    /// Gives back a gain whose send failed, to go with the next: onto its counter when it
    /// is still live in that hour, else to wait with the ended ones (dropped when full).
    pub fn unsend(&mut self, delta: Delta) {
        let live = self.index.get(&delta.hash).map(|&at| &mut self.live[at]);
        match live {
            Some(live) if live.hour == delta.hour => {
                let (s, g) = (&mut live.sent, delta.gained);
                s.requests = s.requests.saturating_sub(g.requests);
                s.minute = s.minute.saturating_sub(g.minute);
                s.second = s.second.saturating_sub(g.second);
                s.refused = s.refused.saturating_sub(g.refused);
                s.shadow = s.shadow.saturating_sub(g.shadow);
            }
            _ if self.pending.len() < self.capacity => self.pending.push(delta),
            _ => {}
        }
    }

    /// Every caller's gain since the last call, for the fleet's record (see [`Delta`]).
    pub fn take_deltas(&mut self) -> Vec<Delta> {
        let mut out = std::mem::take(&mut self.pending);
        out.extend(self.live.iter_mut().filter_map(Live::take_delta));
        out
    }

    /// Folds the counters of ended hours and forgets hours past [`KEEP_HOURS`] (the
    /// publisher calls it, so a quiet route's memory goes back down).
    pub fn tidy(&mut self, now_ms: u64) {
        let hour = (now_ms / HOUR_MS) as u32;
        let mut i = 0;
        while i < self.live.len() {
            if self.live[i].hour < hour {
                let ended = self.live.swap_remove(i);
                self.index.remove(&ended.hash);
                if let Some(moved) = self.live.get(i) {
                    self.index.insert(moved.hash, i);
                }
                self.fold(ended);
            } else {
                i += 1;
            }
        }
        let oldest = hour.saturating_sub(KEEP_HOURS - 1);
        self.hours = self.hours.split_off(&oldest);
    }

    /// Every kept hour with the live counters folded in (as if their hours ended now).
    pub fn hours(&self, now_ms: u64) -> BTreeMap<u32, Hour> {
        let oldest = ((now_ms / HOUR_MS) as u32).saturating_sub(KEEP_HOURS - 1);
        let mut hours: BTreeMap<u32, Hour> = self
            .hours
            .range(oldest..)
            .map(|(h, v)| (*h, v.clone()))
            .collect();
        for live in &self.live {
            if live.hour >= oldest {
                live.fold_into(hours.entry(live.hour).or_default());
            }
        }
        hours
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000 * HOUR_MS; // an hour's start

    #[test]
    fn the_minute_peak_is_sliding_windows_count_and_the_second_peak_a_clock_seconds() {
        let mut r = RouteRecord::new(16);
        // 30 requests in the last second of a minute, 20 in the first second of the next.
        for i in 0..30 {
            r.observe(7, Seen::Admitted, T0 + 59_000 + i * 10);
        }
        for i in 0..20 {
            r.observe(7, Seen::Refused, T0 + 60_000 + i * 10);
        }
        let hours = r.hours(T0 + 61_000);
        let hour = &hours[&((T0 / HOUR_MS) as u32)];
        // At the last request: 20 + 30 × (60,000 − 190) / 60,000 = 49.9 → 50.
        assert_eq!(hour.minute.max(), bounds_hi(50));
        assert_eq!(hour.minute.requests(), 50);
        assert_eq!(hour.second.max(), bounds_hi(30));
        assert_eq!((hour.refused_requests, hour.refused_callers), (20, 1));
    }

    fn bounds_hi(v: u32) -> u32 {
        super::super::hist::bounds(super::super::hist::bucket(v)).1
    }

    #[test]
    fn a_caller_counts_once_per_hour_and_old_hours_are_forgotten() {
        let mut r = RouteRecord::new(16);
        r.observe(1, Seen::Admitted, T0);
        r.observe(1, Seen::Shadow, T0 + HOUR_MS);
        r.tidy(T0 + HOUR_MS);
        let hours = r.hours(T0 + HOUR_MS);
        assert_eq!(hours.len(), 2);
        assert!(hours.values().all(|h| h.minute.callers() == 1));
        assert_eq!(hours.values().map(|h| h.shadow_callers).sum::<u64>(), 1);
        r.tidy(T0 + 30 * HOUR_MS);
        assert!(r.hours(T0 + 30 * HOUR_MS).is_empty());
        assert_eq!(r.live(), 0);
    }

    /// Gains are what was sent since the last take, of live and ended counters alike; a gain
    /// given back goes with the next take.
    #[test]
    fn gains_are_sent_once_and_a_failed_send_is_given_back() {
        let mut r = RouteRecord::new(16);
        for i in 0..3 {
            r.observe(1, Seen::Admitted, T0 + i);
        }
        let first = r.take_deltas();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].gained.requests, first[0].gained.minute), (3, 3));
        assert!(r.take_deltas().is_empty());
        r.observe(1, Seen::Refused, T0 + 10);
        let second = r.take_deltas();
        assert_eq!(
            second[0].gained,
            Counts {
                requests: 1,
                minute: 1,
                second: 1,
                refused: 1,
                shadow: 0
            }
        );
        r.unsend(second[0]);
        r.observe(1, Seen::Admitted, T0 + 20);
        assert_eq!(r.take_deltas()[0].gained.requests, 2);
        // The caller's hour ends: its last gain waits for the next take.
        r.observe(1, Seen::Admitted, T0 + 30);
        r.observe(1, Seen::Admitted, T0 + HOUR_MS);
        let mut third = r.take_deltas();
        third.sort_by_key(|d| d.hour);
        assert_eq!(third.len(), 2);
        assert_eq!((third[0].gained.requests, third[1].gained.requests), (1, 1));
        assert_eq!(third[1].hour, third[0].hour + 1);
    }

    /// A flood of new keys never holds more than the capacity; every caller is still counted
    /// (evicted ones in their hour), and the evictions are reported.
    #[test]
    fn a_key_flood_is_bounded_and_counted() {
        let mut r = RouteRecord::new(64);
        for k in 0..10_000u64 {
            r.observe(k, Seen::Admitted, T0 + k);
        }
        assert_eq!(r.live(), 64);
        assert_eq!(r.index.len(), 64);
        let hours = r.hours(T0 + 10_000);
        let hour = hours.values().next().unwrap();
        assert_eq!(hour.minute.callers(), 10_000);
        assert_eq!(hour.evicted, 10_000 - 64);
    }
}
