//! Local-first limits (`sync: <duration>`): decided in this process's memory, on a local copy
//! of each key's shared state, and shared through Redis in batches (see `control::sync`), so
//! no request waits on Redis.
//!
//! Every interval has two phases on the store's clock, the same for every replica: at each
//! tick `t_k` (a multiple of the interval) a *write* sends each key's usage since the last
//! write (`sync.lua` charges it with the arithmetic of [`algorithm::charge`]); 3/4 of an interval
//! later a *read* fetches the shared states, which then hold every replica's usage up to
//! `t_k` (the view `V_k`). The local copy is the view plus this replica's usage since.
//! A write whose reply is lost is sent again as it was (same round number: Redis applies a
//! round once), and usage admitted meanwhile waits for the next: nothing is lost or counted
//! twice.
//!
//! The bound: each replica's admissions in the interval `[t_k, t_k+1)` are capped to its
//! share `a_k = ceil(A_k / R)`: `A_k` is what the local copy (the latest view plus this
//! replica's own usage since) admits at `t_k`, less `(R − 1) × a'` for every interval since the
//! view was complete, where `a'` is the most any replica's share of that interval can have
//! been: a part (÷ R) of what the latest view showed, nothing set aside (another replica may
//! have read a complete view where this one's read was partial, and raised its share from it);
//! plus what the limit surely refills over the interval ([`share`]). So every replica's
//! admissions since the tick of a complete view `G` stay within `ceil(G / R)` until it reads a
//! newer one, all replicas together admit at most `G + R − 1`, and the `R − 1` is taken off the
//! next share. A view is complete when every live replica's write of the tick was in before
//! the read (the heartbeat says so); when one's round is late the read is partial
//! ([`LocalFirst::read_partial`]): applied, but what the others may have spent unseen since the
//! last complete view still counts.
//!
//! When this replica's own rounds are late (the last completed round older than
//! [`STALE_AFTER_INTERVALS`] on the engine's clock: a busy node, Redis slow or down), it
//! decides alone with limit ÷ R ([`divided`]), on a copy kept across late spells and bounded at
//! each spell's start: by limit ÷ R of what the last complete view left, less what this replica
//! admitted since ([`spell_budget`]), when the last tick it recorded as written
//! ([`LocalFirst::wrote`]) is that view's (no replica can hold a newer complete view); else by
//! what is left of its current share (the others may hold a complete view of the tick it
//! recorded, and count it for a part of what that view left). The rounds write what was taken
//! alone before they record a tick ([`LocalFirst::spent_alone`]). So however often and however
//! long the rounds are late, the replicas together stay within the limit plus R − 1 (the
//! unit tests' fleet model, `fleet::run`, holds it over delayed wake-ups and frozen stores).
//! docs/algorithms.md ("Local-first limits") states the bounds.
//!
//! Bounded state: each route (a limit set's key name) keeps at most `keys_per_route` local
//! copies. A new key on a full route takes the place of the coldest copy it may drop, one with
//! nothing to send (no usage lost) that no decision touched since the last read, at rest
//! first (found among the oldest few, second chance to the rest: amortised O(1)); the new copy
//! has no view yet, so it is decided exactly (the throttle asks Redis, as without `sync`) until
//! a read brings it, and a caller whose copy was dropped is never freed early. When no copy may
//! be dropped (every one busy this interval), the new key is decided exactly without a copy.
//! While the views are stale, both decide with limit ÷ R instead. A round writes and reads
//! bounded batches ([`ROUND_KEYS`], [`BATCH_KEYS`]); usage not written waits for the next
//! round, oldest first, and a copy not read in a round is decided exactly until a read brings
//! its view again.
//!
//! Cold copies go quiet: a copy no decision used for [`COLD_AFTER_INTERVALS`] with nothing to
//! send is dropped (it is no longer read each round). A dropped copy whose shared state was not
//! at rest is remembered by a hash of its key until that state surely is; a returning caller
//! hashing there is decided exactly (on the fleet's count in Redis) until a read brings its
//! view, so a drop never frees a caller early.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::algorithm::{self, Algorithm, Params, Settle, State, Verdict};
use super::clock::{Clock, Micros};
use super::decision::{Check, Decision, Settlement};

/// Local copies per route by default (about 1.2 KB of RSS each, with the rounds' batches,
/// measured with `bench/key_flood.sh`).
pub const DEFAULT_KEYS_PER_ROUTE: usize = 100_000;
/// Keys per `sync.lua` call: a call of this many keys takes Redis a few milliseconds, well
/// within the store's timeout (10 ms at least).
pub const BATCH_KEYS: usize = 1_000;
/// Keys written per round, and keys in use read per round, at most (in batches).
pub const ROUND_KEYS: usize = 10_000;
/// Keys not in use (not decided since their last read, nothing to send) read per round, at
/// most, the longest unread first: what an idle instance costs Redis.
pub const IDLE_READS: usize = 1_000;
/// How many of a route's oldest copies an eviction looks at.
const EVICTION_PROBES: usize = 16;
/// The rounds are late once the last completed round (the last read) is older than this many
/// intervals (a round completes once an interval, 3/4 into it): decide on limit ÷ R, within
/// what the last complete view leaves ([`spell_budget`]).
pub const STALE_AFTER_INTERVALS: i64 = 2;
/// A copy no decision used for this many intervals, with nothing to send, is cold: dropped
/// (it stops syncing), its key remembered in [`Inner::dropped`] when its shared state is not at
/// rest.
pub const COLD_AFTER_INTERVALS: i64 = 50;
/// Slots of the table of recently dropped keys (8 bytes each, made on the first drop).
const DROPPED_SLOTS: usize = 1 << 18;

/// One key's local copy.
#[derive(Debug, Clone)]
struct Entry {
    /// The route (its key name) whose drift this key's counts.
    route: Arc<str>,
    params: Params,
    /// The latest view (None: idle, or never read).
    view: Option<State>,
    /// What decisions run on: the view plus this replica's usage since it was complete.
    local: Option<State>,
    /// The copy used while the views are stale (limit ÷ R): this replica's usage while alone,
    /// kept across stale spells so that R replicas stay within the limit however often the
    /// views go stale.
    divided: Option<State>,
    /// Units admitted here not sent yet.
    pending: u64,
    /// Units sent in the write not acknowledged yet.
    in_flight: u64,
    /// Units admitted here in the current interval, against `share`.
    admitted: u64,
    /// This replica's share of the current interval.
    share: u64,
    /// When `share` was worked out (store clock): units taken before then and still held
    /// were not in it.
    share_at: Micros,
    /// The largest share any replica can have in the current interval: the share of one with
    /// no usage of its own since the view (what `unseen` grows by, per other replica).
    others_share: u64,
    /// The most the other replicas may have spent since the view was complete ((R − 1) × the
    /// shares of those intervals).
    unseen: u64,
    /// What the last tick added to `unseen` (the others' shares of the interval that ended).
    unseen_last: u64,
    /// Decided since the last read (so the next read keeps the key).
    touched: bool,
    /// What the last view held beyond the limit (drift is counted once, as it grows).
    over_seen: u64,
    /// Which read brought the view (`Inner::reads` then); a copy that missed the last read is
    /// decided exactly until one brings it.
    view_read: u64,
    /// No view and not to be decided as a new key (it took an evicted copy's place): decided
    /// exactly until a read brings its view.
    needs_view: bool,
    /// In the queue of usage to write.
    queued: bool,
    /// Units refunded here whose refund in the shared state has not been answered yet (and
    /// when the last of them were taken): a view read meanwhile may still hold them, so they
    /// stay out of the local copy built from it.
    refunding: (u64, Micros),
    /// Local time of the last decision on this copy (cold copies are dropped).
    used_at: Micros,
    /// The late spell `divided` was last bounded for (`Inner::spells` then).
    spell: u64,
}

impl Entry {
    fn new(
        route: Arc<str>,
        params: Params,
        now: Micros,
        interval_us: Micros,
        replicas: u64,
    ) -> Entry {
        Entry {
            route,
            params,
            view: None,
            local: None,
            divided: None,
            pending: 0,
            in_flight: 0,
            admitted: 0,
            share: share(&params, None, 0, now, interval_us, replicas),
            share_at: now,
            others_share: share(&params, None, 0, now, interval_us, replicas),
            unseen: 0,
            unseen_last: 0,
            touched: true,
            over_seen: 0,
            view_read: 0,
            needs_view: false,
            queued: false,
            refunding: (0, 0),
            used_at: Micros::MIN,
            spell: u64::MAX,
        }
    }

    /// Nothing to send: dropping the copy loses no usage.
    fn clean(&self) -> bool {
        self.pending == 0 && self.in_flight == 0
    }
}

/// One route's copies, oldest first (for eviction). A dropped key stays in the ring until it
/// comes up or the ring is compacted.
#[derive(Default)]
struct RouteKeys {
    ring: VecDeque<Arc<str>>,
    live: usize,
}

/// True when `key` (a ring or queue slot) is the key the map holds, not a dropped one's
/// leftover.
fn is_current(keys: &hashbrown::HashMap<Arc<str>, Entry>, key: &Arc<str>) -> bool {
    keys.get_key_value(&**key)
        .is_some_and(|(held, _)| Arc::ptr_eq(held, key))
}

/// One key's usage to send in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncItem {
    pub key: String,
    pub params: Params,
    /// Units admitted here since the last write (0: only read the state).
    pub amount: u64,
}

/// The local-first engine of one limit stage. Clone is cheap: clones share the keys.
#[derive(Clone)]
pub struct LocalFirst {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
    interval_us: Micros,
    /// The number of the last write acknowledged: a refund of units in a write waits for it.
    acked: Arc<tokio::sync::watch::Sender<u64>>,
}

struct Inner {
    /// hashbrown's map with its default hasher (foldhash, seeded per map): every local-first
    /// decision looks its keys up twice, so the hash is a large part of a decision, and
    /// foldhash is much cheaper than SipHash while its per-map random seed still stands
    /// against crafted keys.
    keys: hashbrown::HashMap<Arc<str>, Entry>,
    /// Per route, its copies in order of arrival.
    routes: HashMap<Arc<str>, RouteKeys>,
    /// Copies per route, at most.
    keys_per_route: usize,
    /// Copies dropped to make room, since the start.
    evicted: u64,
    /// Keys with usage to write, oldest usage first.
    dirty: VecDeque<Arc<str>>,
    /// Reads started; a copy made after a read started is not expected in it.
    reads_started: u64,
    /// The number of the last read done (reads run one at a time).
    reads: u64,
    /// The store's clock minus the local clock, as measured at the last read.
    offset: Micros,
    /// Local time of the last successful read (of the engine's start before the first).
    synced_at: Micros,
    /// The replicas alive (at least 1), from the heartbeat.
    replicas: u64,
    /// Units admitted beyond the limit, as the reads found them in the shared states, per
    /// route, not yet taken by [`LocalFirst::take_drift`].
    drift: HashMap<Arc<str>, u64>,
    /// The number of the last write started.
    round: u64,
    /// The write sent and not acknowledged: sent again, as it was, until it is (so Redis can
    /// tell a repeat from new usage).
    unacked: Option<(u64, Vec<SyncItem>)>,
    /// The number of the write last returned again by [`LocalFirst::next_write`].
    resent: Option<u64>,
    /// Keys dropped (cold or evicted) while their shared state was not at rest, by a hash of
    /// the key: the store time until which a key hashing there is decided exactly until a read
    /// brings its view (a returning caller is never freed early). Empty until the first drop;
    /// a collision only costs a key an exact decision.
    dropped: Vec<Micros>,
    /// Copies dropped cold since the start.
    cold: u64,
    /// The last tick this replica recorded in the heartbeat as written ([`LocalFirst::wrote`]):
    /// the newest tick of which another replica may hold a complete view.
    written_tick: Micros,
    /// The tick of the last complete view read (`written_tick` then).
    view_tick: Micros,
    /// Bumped by every read and every tick recorded: a late spell's budget is worked out
    /// again, from what this replica then knows, on each key's first decision after it.
    spells: u64,
    /// A decision was taken alone (the rounds late) since the last tick: its usage is more
    /// than the share the others count this replica for, so it must be written before the
    /// tick is recorded ([`LocalFirst::spent_alone`]).
    alone: bool,
}

impl LocalFirst {
    pub fn new(clock: Arc<dyn Clock>, interval_us: Micros) -> LocalFirst {
        LocalFirst {
            inner: Arc::new(Mutex::new(Inner {
                keys: hashbrown::HashMap::default(),
                routes: HashMap::new(),
                keys_per_route: DEFAULT_KEYS_PER_ROUTE,
                evicted: 0,
                dirty: VecDeque::new(),
                reads_started: 0,
                reads: 0,
                offset: 0,
                // The copies start as good as Redis's idle state; reads must follow.
                synced_at: clock.now_us(),
                replicas: 1,
                drift: HashMap::new(),
                round: 0,
                unacked: None,
                resent: None,
                dropped: Vec::new(),
                cold: 0,
                written_tick: Micros::MIN,
                view_tick: Micros::MIN,
                spells: 0,
                alone: false,
            })),
            clock,
            interval_us: interval_us.max(1),
            acked: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn interval_us(&self) -> Micros {
        self.interval_us
    }

    /// The store's clock, estimated as the local clock plus the offset of the last read.
    pub fn store_now(&self) -> Micros {
        self.clock.now_us() + self.lock().offset
    }

    /// Sets R, the number of replicas alive (at least 1).
    pub fn set_replicas(&self, replicas: u64) {
        self.lock().replicas = replicas.max(1);
    }

    pub fn replicas(&self) -> u64 {
        self.lock().replicas
    }

    /// Units admitted beyond the limit found by the reads since the last call, per route
    /// (for the metric).
    pub fn take_drift(&self) -> Vec<(String, u64)> {
        self.lock()
            .drift
            .drain()
            .map(|(route, units)| (route.to_string(), units))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().keys.len()
    }

    /// The most local copies one route keeps (at least 1).
    pub fn set_keys_per_route(&self, keys: usize) {
        self.lock().keys_per_route = keys.max(1);
    }

    /// Copies dropped to make room for new keys since the start.
    pub fn evicted(&self) -> u64 {
        self.lock().evicted
    }

    /// Copies dropped because no decision used them for [`COLD_AFTER_INTERVALS`], since the
    /// start.
    pub fn cold_dropped(&self) -> u64 {
        self.lock().cold
    }

    /// Copies held by `route` (tests).
    pub fn route_len(&self, route: &str) -> usize {
        self.lock().routes.get(route).map_or(0, |r| r.live)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True while the rounds are on time (a round completed within [`STALE_AFTER_INTERVALS`]).
    pub fn fresh(&self) -> bool {
        let inner = self.lock();
        self.is_fresh(&inner, self.clock.now_us())
    }

    fn is_fresh(&self, inner: &Inner, local_now: Micros) -> bool {
        local_now - inner.synced_at <= STALE_AFTER_INTERVALS * self.interval_us
    }

    /// Decides all `checks` of `route` (its key name) atomically on the local copies:
    /// consumes from them only if no enforcing limit denies. Never waits on Redis. None: a
    /// key of the decision has no current view (a new key on a full route, or a copy a read
    /// skipped) and the views are fresh: decide exactly, on the shared state.
    pub fn decide(&self, route: &str, checks: &[Check<'_>]) -> Option<Decision> {
        let local_now = self.clock.now_us();
        let mut inner = self.lock();
        let now = local_now + inner.offset;
        let fresh = self.is_fresh(&inner, local_now);
        let replicas = inner.replicas;
        let interval = self.interval_us;
        let exact = inner.copies(route, checks, now, local_now, interval);
        if !fresh {
            inner.alone = true;
            inner.bound_spell(checks, now);
        }
        if exact && fresh {
            for check in checks {
                if let Some(entry) = inner.keys.get_mut(check.key) {
                    entry.touched = true;
                }
            }
            return None;
        }
        let mut steps = Vec::with_capacity(checks.len());
        let mut allowed = true;
        for check in checks {
            let entry = inner.keys.get(check.key);
            let (verdict, state) = match entry {
                Some(entry) if fresh => {
                    let step = algorithm::step_for(&check.params, entry.local.as_ref(), now, 0);
                    let over_share = entry.admitted + check.params.cost > entry.share;
                    let verdict = within_share(step.verdict, over_share, now, interval);
                    (verdict, Some(step.state))
                }
                Some(entry) => {
                    let params = divided(&check.params, replicas);
                    let step = algorithm::step_for(&params, entry.divided.as_ref(), now, 0);
                    (step.verdict, Some(step.state))
                }
                None => {
                    // No room and the views are stale: limit ÷ R on a copy of its own that is
                    // not kept (as a new key would start).
                    let params = divided(&check.params, replicas);
                    let step = algorithm::step_for(&params, None, now, 0);
                    (step.verdict, None)
                }
            };
            if !verdict.allowed && !check.shadow {
                allowed = false;
            }
            steps.push((verdict, state));
        }
        let inner = &mut *inner;
        for (check, (verdict, state)) in checks.iter().zip(&steps) {
            let Some((key, entry)) = inner.keys.get_key_value_mut(check.key) else {
                continue;
            };
            entry.touched = true;
            // A shadow limit that would have denied consumes nothing.
            if !allowed || !verdict.allowed {
                continue;
            }
            entry.pending += check.params.cost;
            entry.admitted += check.params.cost;
            if !entry.queued {
                entry.queued = true;
                inner.dirty.push_back(key.clone());
            }
            if fresh {
                entry.local = state.clone();
            } else {
                entry.divided = state.clone();
                // Keep the copy in step too, for when the views are fresh again.
                entry.local =
                    algorithm::charge(&check.params, entry.local.as_ref(), now, check.params.cost)
                        .map(|(s, _)| s);
            }
        }
        Some(Decision {
            allowed,
            verdicts: steps.into_iter().map(|(v, _)| v).collect(),
            leases: Vec::new(),
            at: now,
        })
    }

    /// Settles what decisions on the local copies took (`count_statuses`, `cost_from_response`)
    /// in those copies, at once: the next decision sees it. A charge is more usage, written
    /// with the rest at the next tick. A refund comes out of the usage not written yet, where
    /// the units still are (nothing to send: the shared state never held them); only units
    /// already written are returned, to be refunded in the shared state (`settle.lua`). A
    /// settlement of a key without a copy (decided exactly) is returned whole. Refunding the
    /// shared state alone would lose the refund: it would meet a state that does not hold the
    /// units yet (a fixed window's count of 0 stays 0), and the usage written later would take
    /// them for good.
    ///
    /// Also returned: the number of the write that carries units of a returned refund and is
    /// not acknowledged yet. The refund must reach the shared state after that write (wait
    /// with [`LocalFirst::written_through`]), or it would meet a state without the units.
    pub fn settle(&self, settlements: &[Settlement]) -> (Vec<Settlement>, Option<u64>) {
        let local_now = self.clock.now_us();
        let mut inner = self.lock();
        let now = local_now + inner.offset;
        let inner = &mut *inner;
        let mut rest = Vec::new();
        let mut after = None;
        for s in settlements {
            let Some((key, entry)) = inner.keys.get_key_value_mut(s.key.as_str()) else {
                rest.push(s.clone());
                continue;
            };
            if entry.params != s.params {
                rest.push(s.clone());
                continue;
            }
            let p = &s.params;
            match s.op {
                Settle::Charge { amount } => {
                    let charged = |state: &Option<State>| {
                        algorithm::charge(p, state.as_ref(), now, amount).map(|(s, _)| s)
                    };
                    entry.local = charged(&entry.local);
                    if entry.divided.is_some() {
                        entry.divided = charged(&entry.divided);
                    }
                    entry.pending = entry.pending.saturating_add(amount);
                    entry.admitted = entry.admitted.saturating_add(amount);
                    if !entry.queued {
                        entry.queued = true;
                        inner.dirty.push_back(key.clone());
                    }
                }
                Settle::Refund { amount, taken_at } => {
                    let refunded = |state: &Option<State>| {
                        algorithm::refund(p, state.as_ref(), now, taken_at, amount).map(|(s, _)| s)
                    };
                    if let Some(state) = refunded(&entry.local) {
                        entry.local = Some(state);
                    }
                    if let Some(state) = refunded(&entry.divided) {
                        entry.divided = Some(state);
                    }
                    if taken_at < entry.share_at {
                        // Held when the share was worked out, so left out of it: back in it.
                        entry.share = entry.share.saturating_add(amount);
                    } else {
                        entry.admitted = entry.admitted.saturating_sub(amount);
                    }
                    let unsent = amount.min(entry.pending);
                    entry.pending -= unsent;
                    if amount > unsent {
                        entry.refunding.0 += amount - unsent;
                        entry.refunding.1 = taken_at;
                        if let Some((round, batch)) = &inner.unacked {
                            if batch.iter().any(|item| item.key == s.key) {
                                after = Some(*round);
                            }
                        }
                        rest.push(Settlement {
                            key: s.key.clone(),
                            params: s.params,
                            op: Settle::Refund {
                                amount: amount - unsent,
                                taken_at,
                            },
                        });
                    }
                }
            }
        }
        (rest, after)
    }

    /// The refunds [`LocalFirst::settle`] returned were answered by the shared state (applied,
    /// or failed): views read from now on show them as they are.
    pub fn refunds_answered(&self, refunds: &[Settlement]) {
        let mut inner = self.lock();
        for s in refunds {
            if let (Some(entry), Settle::Refund { amount, .. }) =
                (inner.keys.get_mut(s.key.as_str()), s.op)
            {
                entry.refunding.0 = entry.refunding.0.saturating_sub(amount);
            }
        }
    }

    /// Waits until the write numbered `round` has been acknowledged (the caller bounds the
    /// wait).
    pub async fn written_through(&self, round: u64) {
        let mut acked = self.acked.subscribe();
        let _ = acked.wait_for(|done| *done >= round).await;
    }

    /// The tick `t_k`: starts the interval's shares and returns the write, its number and each
    /// key's usage not sent yet (moved to in flight). A write not acknowledged yet is returned
    /// again, unchanged, until it is; usage admitted meanwhile waits for the next.
    pub fn tick(&self) -> (u64, Vec<SyncItem>) {
        let mut inner = self.lock();
        let now = self.clock.now_us() + inner.offset;
        let replicas = inner.replicas;
        inner.alone = false;
        for entry in inner.keys.values_mut() {
            // Every other replica may have spent its whole share of the interval that ended,
            // unseen; this one's own usage is in the local copy. The most that share can have
            // been is a part of what the latest view showed, nothing set aside: another
            // replica may have read a newer, complete view where this one's read was partial
            // or late, and raised its share from it (its share is then at most a part of what
            // that view showed, which is no more than this one's).
            let most = share(
                &entry.params,
                entry.view.as_ref(),
                0,
                now,
                self.interval_us,
                replicas,
            )
            .max(entry.others_share);
            entry.unseen_last = most.saturating_mul(replicas - 1);
            entry.unseen = entry.unseen.saturating_add(entry.unseen_last);
            entry.share = share(
                &entry.params,
                entry.local.as_ref(),
                entry.unseen,
                now,
                self.interval_us,
                replicas,
            );
            entry.others_share = share(
                &entry.params,
                entry.view.as_ref(),
                entry.unseen,
                now,
                self.interval_us,
                replicas,
            )
            .max(entry.share);
            entry.admitted = 0;
            entry.share_at = now;
        }
        drop(inner);
        self.next_write()
            .unwrap_or_else(|| (self.lock().round, Vec::new()))
    }

    /// The next write of the round: the one not acknowledged yet, again, or the usage of up to
    /// [`BATCH_KEYS`] keys, the oldest usage first, under a new number. None: nothing to send.
    pub fn next_write(&self) -> Option<(u64, Vec<SyncItem>)> {
        let mut inner = self.lock();
        if let Some((round, batch)) = &inner.unacked {
            let again = (*round, batch.clone());
            inner.resent = Some(again.0);
            return Some(again);
        }
        let inner = &mut *inner;
        let mut batch = Vec::new();
        while batch.len() < BATCH_KEYS {
            let Some(key) = inner.dirty.pop_front() else {
                break;
            };
            if !is_current(&inner.keys, &key) {
                continue;
            }
            let entry = inner.keys.get_mut(&*key).expect("a current key is held");
            entry.queued = false;
            if entry.pending == 0 {
                continue;
            }
            entry.in_flight += entry.pending;
            batch.push(SyncItem {
                key: key.to_string(),
                params: entry.params,
                amount: entry.pending,
            });
            entry.pending = 0;
        }
        if batch.is_empty() {
            return None;
        }
        inner.round += 1;
        let round = inner.round;
        inner.unacked = Some((round, batch.clone()));
        Some((round, batch))
    }

    /// True when the write numbered `round` is one sent before, being sent again as it was: it
    /// holds none of the usage taken since it was first sent.
    pub fn sent_before(&self, round: u64) -> bool {
        self.lock().resent == Some(round)
    }

    /// The rounds recorded `tick` in the heartbeat as this replica's written tick: the others
    /// may now take a read of it for a complete view (one this replica may never read, if its
    /// own read of the tick fails or is late: then a late spell gives it no more than its
    /// share, see [`Inner::bound_spell`]).
    pub fn wrote(&self, tick: Micros) {
        let mut inner = self.lock();
        if tick > inner.written_tick {
            inner.written_tick = tick;
            inner.spells += 1;
        }
    }

    /// True when a decision was taken alone (the rounds late) since the last tick: the usage
    /// it took is beyond what the others count this replica for in the interval, so the
    /// rounds write it before they record the tick (a view the others take as complete for the
    /// tick would miss it), whatever the round's phase.
    pub fn spent_alone(&self) -> bool {
        self.lock().alone
    }

    /// True when some usage waits for a write.
    pub fn unsent(&self) -> bool {
        let inner = self.lock();
        inner.unacked.is_some()
            || inner
                .dirty
                .iter()
                .any(|key| is_current(&inner.keys, key) && inner.keys[&**key].pending > 0)
    }

    /// A write was acknowledged: its usage is in the shared states.
    pub fn written(&self, round: u64) {
        let mut inner = self.lock();
        let Some((sent, batch)) = inner.unacked.take() else {
            return;
        };
        if sent != round {
            inner.unacked = Some((sent, batch));
            return;
        }
        for item in &batch {
            if let Some(entry) = inner.keys.get_mut(item.key.as_str()) {
                entry.in_flight -= item.amount.min(entry.in_flight);
            }
        }
        self.acked.send_replace(round);
    }

    /// The read, 3/4 of an interval after the tick: the keys in use (decided since the last
    /// read, or with usage not in the view), up to [`ROUND_KEYS`], then up to [`IDLE_READS`]
    /// of the others, the longest unread first.
    pub fn read_batch(&self) -> Vec<SyncItem> {
        let mut inner = self.lock();
        inner.reads_started += 1;
        let inner = &*inner;
        let mut in_use = Vec::new();
        let mut idle = Vec::new();
        for (key, entry) in inner.keys.iter() {
            if entry.touched || !entry.clean() || entry.needs_view {
                in_use.push((entry.view_read, key, entry));
            } else {
                idle.push((entry.view_read, key, entry));
            }
        }
        for (list, cap) in [(&mut in_use, ROUND_KEYS), (&mut idle, IDLE_READS)] {
            if list.len() > cap {
                list.select_nth_unstable_by_key(cap, |(read, _, _)| *read);
                list.truncate(cap);
            }
        }
        in_use
            .into_iter()
            .chain(idle)
            .map(|(_, key, entry)| SyncItem {
                key: key.to_string(),
                params: entry.params,
                amount: 0,
            })
            .collect()
    }

    /// A read succeeded: `states[i]` is the shared state of `batch[i]`, complete up to the
    /// last tick (every replica's write of it was applied), `store_now` the store's clock when
    /// read, `latency_us` the read's duration. Replaces each view, applies again on top this
    /// replica's usage since the tick, and drops keys that went idle or cold.
    pub fn read_done(
        &self,
        batch: &[SyncItem],
        states: Vec<Option<State>>,
        store_now: Micros,
        latency_us: Micros,
    ) {
        self.read(batch, states, store_now, latency_us, 0);
    }

    /// A read succeeded but the fleet state says a live replica's write of the last tick is not
    /// in yet (its round is late): the states hold every replica's usage only up to the tick
    /// `ticks_behind` ticks earlier. One tick behind, they are a view of that tick, and what
    /// the others may have spent in the interval since (the last tick's addition to `unseen`)
    /// stays set aside; further behind, they are applied to the local copies but are no view:
    /// everything the others may have spent since the last complete view stays set aside.
    pub fn read_partial(
        &self,
        batch: &[SyncItem],
        states: Vec<Option<State>>,
        store_now: Micros,
        latency_us: Micros,
        ticks_behind: u64,
    ) {
        self.read(batch, states, store_now, latency_us, ticks_behind.max(1));
    }

    fn read(
        &self,
        batch: &[SyncItem],
        states: Vec<Option<State>>,
        store_now: Micros,
        latency_us: Micros,
        behind: u64,
    ) {
        let local_now = self.clock.now_us();
        let mut inner = self.lock();
        // The reply was made about half a round trip ago.
        inner.offset = store_now + latency_us / 2 - local_now;
        inner.synced_at = local_now;
        inner.reads = inner.reads_started;
        if behind == 0 {
            // A read follows the write of its tick: this is the view of the tick recorded.
            inner.view_tick = inner.written_tick;
        }
        inner.spells += 1;
        let reads = inner.reads;
        let now = local_now + inner.offset;
        let replicas = inner.replicas;
        let unacked = inner.unacked.is_some();
        // Borrow the fields apart (keys and drift at once).
        let inner = &mut *inner;
        let mut read = HashSet::with_capacity(batch.len());
        for (item, view) in batch.iter().zip(states) {
            read.insert(item.key.as_str());
            let Some(entry) = inner.keys.get_mut(item.key.as_str()) else {
                continue;
            };
            if entry.params != item.params {
                continue; // Reconfigured while the read was in flight.
            }
            let over = over_limit(&item.params, view.as_ref(), store_now);
            if over > entry.over_seen {
                *inner.drift.entry(entry.route.clone()).or_default() += over - entry.over_seen;
            }
            entry.over_seen = over;
            // Usage not in the view: admitted since the tick, and the write if unacknowledged.
            let unseen_own = entry.pending + if unacked { entry.in_flight } else { 0 };
            entry.local = if unseen_own > 0 {
                algorithm::charge(&entry.params, view.as_ref(), now, unseen_own).map(|(s, _)| s)
            } else {
                view.clone()
            };
            if let (units @ 1.., taken_at) = entry.refunding {
                // Refunded here, maybe not yet in the view.
                if let Some((state, _)) =
                    algorithm::refund(&entry.params, entry.local.as_ref(), now, taken_at, units)
                {
                    entry.local = Some(state);
                }
            }
            // The view holds every write up to the last tick; unseen are only the current
            // interval's shares, at most R × this one. What the view admits beyond them is
            // shared out now rather than at the next tick (a key first seen late in the last
            // interval would otherwise wait a whole interval). A partial view may miss what
            // the others spent since the last complete one: that stays set aside too.
            let unseen = match behind {
                0 => 0,
                1 => entry.unseen.min(entry.unseen_last),
                _ => entry.unseen,
            };
            let set_aside = entry
                .others_share
                .saturating_mul(replicas)
                .saturating_add(unseen);
            let mine = available(&entry.params, entry.local.as_ref(), now);
            entry.share += mine.saturating_sub(set_aside).div_ceil(replicas);
            let anyone = available(&entry.params, view.as_ref(), now);
            entry.others_share += anyone.saturating_sub(set_aside).div_ceil(replicas);
            entry.others_share = entry.others_share.max(entry.share);
            if behind <= 1 {
                entry.view = view;
            }
            entry.unseen = unseen;
            entry.view_read = reads;
            entry.needs_view = false;
            // The divided copy is kept: it is what this replica admitted alone, and a view that
            // goes stale again (a loaded machine whose rounds run late, Redis flapping) goes on
            // from it rather than from a whole limit ÷ R again.
        }
        inner.drop_idle(&read, now, local_now, self.interval_us);
    }
}

/// The slot of `key` in [`Inner::dropped`], by the keys' own hasher (seeded per map).
fn dropped_slot(hasher: &impl std::hash::BuildHasher, key: &str) -> usize {
    (hasher.hash_one(key) as usize) & (DROPPED_SLOTS - 1)
}

/// Marks `slot` of `dropped` until the shared state of `entry`, dropped at `now`, is surely at
/// rest; nothing when the last view showed it at rest (or none: the state is idle or unknown,
/// and a copy without a view was never decided on the fleet's count either).
fn remember(dropped: &mut Vec<Micros>, slot: usize, entry: &Entry, now: Micros) {
    let view = entry.local.as_ref().or(entry.view.as_ref());
    if view.is_none() || available(&entry.params, view, now) >= capacity(&entry.params) {
        return;
    }
    if dropped.is_empty() {
        *dropped = vec![Micros::MIN; DROPPED_SLOTS];
    }
    dropped[slot] = dropped[slot].max(at_rest_by(&entry.params, now));
}

/// What a new key found on its route.
enum Room {
    /// The route had room.
    Free,
    /// A copy was dropped to make room.
    Evicted,
    /// Every copy is busy: the key gets none.
    None,
}

impl Inner {
    /// After a read: drops the copies with nothing to send that no decision touched since the
    /// last read and whose state (in `read`) is full again, for a new copy starts from the same
    /// idle state; and the cold ones, untouched for [`COLD_AFTER_INTERVALS`], whatever their
    /// state (remembered in [`Inner::dropped`], so a returning caller is decided on the
    /// fleet's count until a read brings it).
    fn drop_idle(
        &mut self,
        read: &HashSet<&str>,
        now: Micros,
        local_now: Micros,
        interval: Micros,
    ) {
        let cold_before = local_now.saturating_sub(COLD_AFTER_INTERVALS * interval);
        let Inner {
            keys,
            routes,
            dropped,
            cold,
            ..
        } = self;
        let hasher = keys.hasher().clone();
        keys.retain(|key, entry| {
            let touched = std::mem::take(&mut entry.touched);
            if touched || !entry.clean() {
                return true;
            }
            let at_rest = read.contains(&**key)
                // The local copy, not the view: a partial read updates only the copy (the
                // view may be an older one, at rest though the shared state is not).
                && available(&entry.params, entry.local.as_ref(), now + interval)
                    >= capacity(&entry.params);
            let is_cold = !at_rest && entry.used_at < cold_before;
            if !at_rest && !is_cold {
                return true;
            }
            if let Some(r) = routes.get_mut(&*entry.route) {
                r.live -= 1;
            }
            if is_cold {
                *cold += 1;
                remember(dropped, dropped_slot(&hasher, key), entry, now);
            }
            false
        });
    }

    /// Gives every key of `checks` a copy (or none when its route has no room); true when a
    /// key must be decided exactly: no current view, a new key on a full route, or a key
    /// dropped recently whose shared state is not at rest.
    fn copies(
        &mut self,
        route: &str,
        checks: &[Check<'_>],
        now: Micros,
        local_now: Micros,
        interval: Micros,
    ) -> bool {
        let replicas = self.replicas;
        let mut exact = false;
        for check in checks {
            let reads = self.reads;
            let started = self.reads_started;
            if let Some(entry) = self.keys.get_mut(check.key) {
                if entry.params != check.params {
                    // A reload changed the limit: start over from the next view.
                    let route = entry.route.clone();
                    *entry = Entry::new(route, check.params, now, interval, replicas);
                    entry.view_read = started;
                }
                entry.used_at = local_now;
                exact |= entry.needs_view || entry.view_read < reads;
                continue;
            }
            let evicted = match self.make_room(route, now) {
                Room::Free => false,
                Room::Evicted => true,
                Room::None => {
                    exact = true;
                    continue;
                }
            };
            // A caller whose copy was dropped starts from the fleet's count, not from idle.
            let returning = self.was_dropped(check.key, now);
            exact |= evicted || returning;
            let route = self.route_name(route);
            let mut entry = Entry::new(route, check.params, now, interval, replicas);
            entry.view_read = started;
            entry.needs_view = evicted || returning;
            entry.used_at = local_now;
            self.insert(Arc::from(check.key), entry);
        }
        exact
    }

    /// Late rounds: bounds each key's divided copy, once per late spell, by what the last
    /// complete view leaves this replica ([`spell_budget`]), so that a spell never gives more
    /// than limit ÷ R of what the fleet had left, whatever this replica spent before it.
    ///
    /// That holds only if no other replica can hold a newer complete view: a view of a later
    /// tick shows the fleet's usage of the interval since, and the others' shares from it
    /// count this replica for a part of what is left at that tick, not of the older view; if
    /// the others spent more than this replica in between, its part of the older view is more
    /// than that (`a_late_spell_after_a_partial_view_keeps_the_bound`: 227 of 200). When this
    /// replica recorded a tick newer than its last complete view (its read of it failed, was
    /// partial or has not come), a spell gives it what is left of its current share and no
    /// more: the share was worked out with what the others may have spent unseen set aside,
    /// and that is what their views count it for.
    fn bound_spell(&mut self, checks: &[Check<'_>], now: Micros) {
        let replicas = self.replicas;
        let spell = self.spells;
        let newer_view_possible = self.written_tick > self.view_tick;
        for check in checks {
            let Some(entry) = self.keys.get_mut(check.key) else {
                continue;
            };
            if entry.spell == spell {
                continue;
            }
            entry.spell = spell;
            let params = divided(&entry.params, replicas);
            let budget = if newer_view_possible {
                entry.share.saturating_sub(entry.admitted)
            } else {
                spell_budget(
                    &entry.params,
                    entry.view.as_ref(),
                    entry.local.as_ref(),
                    now,
                    replicas,
                )
            };
            let kept = available(&params, entry.divided.as_ref(), now);
            if kept > budget {
                entry.divided =
                    algorithm::charge(&params, entry.divided.as_ref(), now, kept - budget)
                        .map(|(s, _)| s);
            }
        }
    }

    /// Remembers `key`, dropped with `entry`, when its shared state is not at rest at `now`.
    fn remember_dropped(&mut self, key: &str, entry: &Entry, now: Micros) {
        let slot = dropped_slot(self.keys.hasher(), key);
        remember(&mut self.dropped, slot, entry, now);
    }

    /// True when `key` may have been dropped with its shared state not at rest.
    fn was_dropped(&self, key: &str, now: Micros) -> bool {
        !self.dropped.is_empty() && self.dropped[dropped_slot(self.keys.hasher(), key)] > now
    }

    /// The shared name of `route` (made on its first key).
    fn route_name(&mut self, route: &str) -> Arc<str> {
        match self.routes.get_key_value(route) {
            Some((name, _)) => name.clone(),
            None => {
                let name: Arc<str> = Arc::from(route);
                self.routes.insert(name.clone(), RouteKeys::default());
                name
            }
        }
    }

    /// Adds a copy at `key` on its route (which [`Inner::route_name`] made).
    fn insert(&mut self, key: Arc<str>, entry: Entry) {
        let keys = &self.keys;
        let r = self
            .routes
            .get_mut(&*entry.route)
            .expect("the route is made first");
        r.live += 1;
        // Dropped keys leave stale slots: compact once they are half the ring (amortised O(1)
        // per insert).
        if r.ring.len() > 2 * r.live + 16 {
            r.ring.retain(|k| is_current(keys, k));
        }
        r.ring.push_back(key.clone());
        self.keys.insert(key, entry);
    }

    /// Makes room for a new key on `route` if it holds its budget: drops a clean copy (nothing
    /// to send) untouched since the last read, at rest first.
    fn make_room(&mut self, route: &str, now: Micros) -> Room {
        let Inner {
            keys,
            routes,
            keys_per_route,
            ..
        } = self;
        let Some(r) = routes.get_mut(route) else {
            return Room::Free;
        };
        if r.live < *keys_per_route {
            return Room::Free;
        }
        let mut first_clean: Option<Arc<str>> = None;
        let mut busy = Vec::new();
        let mut victim = None;
        let mut probes = EVICTION_PROBES;
        while probes > 0 {
            let Some(key) = r.ring.pop_front() else {
                break;
            };
            if !is_current(keys, &key) {
                continue; // A stale slot.
            }
            probes -= 1;
            let entry = &keys[&*key];
            if entry.touched || !entry.clean() {
                busy.push(key);
            } else if available(&entry.params, entry.local.as_ref(), now) >= capacity(&entry.params)
            {
                victim = Some(key);
                break;
            } else if first_clean.is_none() {
                first_clean = Some(key);
            } else {
                busy.push(key);
            }
        }
        // Busy copies get another turn at the back; a clean one not taken keeps its place.
        r.ring.extend(busy);
        let victim = match (victim, first_clean) {
            (Some(v), Some(other)) => {
                r.ring.push_front(other);
                Some(v)
            }
            (v, other) => v.or(other),
        };
        let Some(victim) = victim else {
            return Room::None;
        };
        let entry = keys.remove(&*victim).expect("a current key is held");
        r.live -= 1;
        self.evicted += 1;
        self.remember_dropped(&victim, &entry, now);
        Room::Evicted
    }
}

/// The most units `params` admit from idle (burst for token_bucket and gcra, limit otherwise).
pub fn capacity(params: &Params) -> u64 {
    match params.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => params.burst,
        _ => params.limit,
    }
}

/// The units `state` admits at `now` (one unit at a time).
pub fn available(params: &Params, state: Option<&State>, now: Micros) -> u64 {
    let unit = Params { cost: 1, ..*params };
    let verdict = algorithm::step_for(&unit, state, now, 0).verdict;
    if verdict.allowed {
        verdict.remaining + 1
    } else {
        0
    }
}

/// The units the limit surely refills (or frees, for windows) over `span` µs after `now`.
pub fn refill(params: &Params, now: Micros, span: Micros) -> u64 {
    let period = params.period_us.max(1);
    match params.algorithm {
        // A new window frees the whole limit at once.
        Algorithm::FixedWindow => {
            let windows = (now + span) / period - now / period;
            params.limit.saturating_mul(windows.max(0) as u64)
        }
        // The others refill (or forget the previous window) limit per period, evenly; rounded
        // down, so a share never counts a unit that is not there yet.
        _ => {
            let units = params.limit as i128 * span.max(0) as i128;
            (units / period as i128) as u64
        }
    }
}

/// What a replica whose rounds are late may still admit alone at `now`: limit ÷ R of what the
/// last complete view `view` leaves, less what this replica admitted since (its `local` copy
/// holds it). Every replica that goes late takes at most this, so together they stay within
/// what the view left plus R − 1.
pub fn spell_budget(
    params: &Params,
    view: Option<&State>,
    local: Option<&State>,
    now: Micros,
    replicas: u64,
) -> u64 {
    let seen = available(params, view, now);
    let own = seen.saturating_sub(available(params, local, now));
    seen.div_ceil(replicas.max(1)).saturating_sub(own)
}

/// A time by which a state of `params` charged at `now` is surely at rest again (full): a
/// whole period per `limit` units of capacity, plus one period (the sliding window's previous
/// window, a window already begun).
fn at_rest_by(params: &Params, now: Micros) -> Micros {
    let periods = capacity(params)
        .div_ceil(params.limit.max(1))
        .saturating_add(1);
    now.saturating_add(
        params
            .period_us
            .max(1)
            .saturating_mul(periods.min(1 << 20) as i64),
    )
}

/// One replica's share of the interval starting at `now` (a tick): `ceil(A / R)` where `A`
/// is what the local copy `state` (the view plus this replica's own usage since) admits at
/// `now`, less `unseen` (what the other replicas may have spent since the view was complete),
/// plus what the limit surely refills over the interval.
pub fn share(
    params: &Params,
    state: Option<&State>,
    unseen: u64,
    now: Micros,
    interval_us: Micros,
    replicas: u64,
) -> u64 {
    let total = available(params, state, now)
        .saturating_sub(unseen)
        .saturating_add(refill(params, now, interval_us));
    total.div_ceil(replicas.max(1))
}

/// The limit divided among `replicas` (limit ÷ R, burst ÷ R, each at least 1): what each
/// replica enforces alone while the shared state is stale.
pub fn divided(params: &Params, replicas: u64) -> Params {
    let r = replicas.max(1);
    let mut p = Params {
        limit: (params.limit / r).max(1),
        burst: (params.burst / r).max(1),
        ..*params
    };
    if p.algorithm == Algorithm::Gcra && p.period_us < p.limit as i64 {
        p.limit = p.period_us.max(1) as u64;
    }
    if !algorithm::params_fit(&p) {
        return *params;
    }
    p
}

/// Units the shared state holds beyond what the limit admits (drift found at a round).
pub fn over_limit(params: &Params, state: Option<&State>, now: Micros) -> u64 {
    match (params.algorithm, state) {
        (Algorithm::FixedWindow, Some(State::FixedWindow { window, count }))
            if *window == now / params.period_us =>
        {
            count.saturating_sub(params.limit)
        }
        (Algorithm::TokenBucket, Some(State::TokenBucket { scaled, .. })) if *scaled < 0 => {
            ((-*scaled) as u64).div_ceil(params.period_us as u64)
        }
        (Algorithm::Gcra, Some(State::Gcra { tat })) => {
            let interval = (params.period_us / params.limit as i64).max(1);
            let dvt = interval * params.burst as i64;
            let over = *tat - now - dvt;
            if over > 0 {
                (over as u64).div_ceil(interval as u64)
            } else {
                0
            }
        }
        (
            Algorithm::SlidingWindow,
            Some(State::SlidingWindow {
                window, current, ..
            }),
        ) if *window == now / params.period_us => current.saturating_sub(params.limit),
        _ => 0,
    }
}

/// The over-admission bound of one local-first limit, in units, on top of what the shared
/// state admits over the same time: the rounding of the R shares of each view (R − 1), as
/// long as every replica's write reaches Redis within 3/4 of an interval and R is right.
pub fn over_bound(replicas: u64) -> u64 {
    replicas.max(1) - 1
}

/// The under-admission bound per interval: a replica holding all the traffic gets only its
/// share, so up to (R − 1) / R of what the interval admits is left unused until the next read
/// shows the others idle.
pub fn under_bound(params: &Params, replicas: u64, interval_us: Micros) -> u64 {
    let r = replicas.max(1);
    let per_interval = capacity(params).saturating_add(refill_rate_bound(params, interval_us));
    per_interval * (r - 1) / r
}

fn refill_rate_bound(params: &Params, span: Micros) -> u64 {
    let units = params.limit as i128 * span.max(0) as i128;
    let period = params.period_us.max(1) as i128;
    ((units + period - 1) / period) as u64
}

/// A fresh copy's verdict as this replica may give it at `now` (`interval`: the rounds'):
/// refused once the replica spent its share of the interval (`over_share`), and a refusal's
/// retry time moved to the tick from which the share counts the units that come back.
#[inline]
fn within_share(verdict: Verdict, over_share: bool, now: Micros, interval: Micros) -> Verdict {
    if verdict.allowed && over_share {
        // This replica spent its share of the interval: the next may give more.
        let until_tick = interval - now.rem_euclid(interval);
        Verdict {
            allowed: false,
            remaining: 0,
            retry_after_us: until_tick.max(1),
            ..verdict
        }
    } else if !verdict.allowed && verdict.retry_after_us > 0 {
        // The units come back then, but this replica's share counts them only from the tick
        // after: a lone client retrying at Retry-After must pass. One interval more, because
        // the tick is applied by a task that a busy machine may wake late (seen: a retry
        // right at Retry-After refused).
        let back = now + verdict.retry_after_us;
        let tick_after = back - back.rem_euclid(interval) + 2 * interval;
        Verdict {
            retry_after_us: tick_after - now,
            ..verdict
        }
    } else {
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::clock::ManualClock;

    const SECOND: Micros = 1_000_000;

    fn params(algorithm: Algorithm, limit: u64, period_us: Micros) -> Params {
        Params {
            algorithm,
            limit,
            period_us,
            burst: limit,
            cost: 1,

            calendar: None,
        }
    }

    fn check(key: &str, p: Params) -> Check<'_> {
        Check {
            key,
            params: p,
            shadow: false,
            block_us: 0,
        }
    }

    fn admitted(engine: &LocalFirst, key: &str, p: Params, tries: usize) -> usize {
        (0..tries)
            .filter(|_| {
                engine
                    .decide("r", &[check(key, p)])
                    .expect("a view")
                    .allowed
            })
            .count()
    }

    #[test]
    fn a_share_is_the_part_of_what_is_left_plus_the_refill() {
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        // Idle, no window boundary within the interval: ceil(100 / 4).
        assert_eq!(share(&p, None, 0, SECOND, 100_000, 4), 25);
        assert_eq!(share(&p, None, 0, SECOND, 100_000, 3), 34);
        // What all may have spent unseen is taken off.
        assert_eq!(share(&p, None, 40, SECOND, 100_000, 4), 15);
        assert_eq!(share(&p, None, 400, SECOND, 100_000, 4), 0);
        // A boundary within the interval frees a whole limit more.
        assert_eq!(share(&p, None, 0, 60 * SECOND - 50_000, 100_000, 4), 50);
        let tb = params(Algorithm::TokenBucket, 10, SECOND);
        let empty = State::TokenBucket {
            scaled: 0,
            updated_at: 0,
        };
        // Empty bucket: 10/s over 200 ms refills 2, shared by 2.
        assert_eq!(share(&tb, Some(&empty), 0, 0, 200_000, 2), 1);
    }

    #[test]
    fn divided_limits_are_at_least_one() {
        let p = params(Algorithm::TokenBucket, 10, SECOND);
        assert_eq!(divided(&p, 4).limit, 2);
        assert_eq!(divided(&p, 4).burst, 2);
        assert_eq!(divided(&p, 40).limit, 1);
        assert_eq!(divided(&p, 0).limit, 10);
    }

    #[test]
    fn bounds_grow_with_replicas() {
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        assert_eq!(over_bound(1), 0);
        assert_eq!(over_bound(4), 3);
        assert_eq!(under_bound(&p, 1, 100_000), 0);
        assert_eq!(under_bound(&p, 4, 100_000), 75);
    }

    #[test]
    fn replicas_admit_their_share_of_one_view_per_interval() {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engine = LocalFirst::new(clock.clone(), 100_000);
        engine.set_replicas(4);
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        assert_eq!(admitted(&engine, "k", p, 200), 25);
        let denied = engine.decide("r", &[check("k", p)]).unwrap();
        assert!(!denied.allowed);
        assert!(denied.verdicts[0].retry_after_us > 0);
        // The tick: the next share is taken from the idle view less what all 4 may have spent
        // (4 × 25 = 100): nothing, until a read shows what is left.
        let (round, batch) = engine.tick();
        assert_eq!(batch[0].amount, 25);
        engine.written(round);
        assert_eq!(admitted(&engine, "k", p, 200), 0);
        // The read: all 4 wrote 20 (80), so 20 are left: the next interval's share is 5.
        let view = State::FixedWindow {
            window: 0,
            count: 80,
        };
        engine.read_done(&engine.read_batch(), vec![Some(view)], 10 * SECOND, 0);
        // The others may still take their largest share of this interval (7 each, from the
        // idle view less 3 × 25): nothing is left to raise this one's.
        assert_eq!(admitted(&engine, "k", p, 200), 0);
        let (round, _) = engine.tick();
        engine.written(round);
        // The next tick: 20 left less what the 3 others may have taken unseen (3 × 7): none.
        assert_eq!(admitted(&engine, "k", p, 200), 0);
        engine.read_done(
            &engine.read_batch(),
            vec![Some(State::FixedWindow {
                window: 0,
                count: 80,
            })],
            10 * SECOND,
            0,
        );
        assert_eq!(admitted(&engine, "k", p, 200), 5);
        // The next tick takes off what all 4 may have spent since the view (4 × 5): nothing
        // is left until the next read.
        let (round, batch) = engine.tick();
        assert_eq!(batch[0].amount, 5);
        engine.written(round);
        assert_eq!(admitted(&engine, "k", p, 200), 0);
    }

    #[test]
    fn a_lost_write_is_sent_again_as_it_was_and_the_view_counts_it_once() {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engine = LocalFirst::new(clock.clone(), 100_000);
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        let view = |count| vec![Some(State::FixedWindow { window: 0, count })];
        assert_eq!(admitted(&engine, "k", p, 10), 10);
        let (round, batch) = engine.tick();
        assert_eq!(batch[0].amount, 10);
        // The write's reply is lost, though Redis applied it: the read shows the 10.
        engine.read_done(&engine.read_batch(), view(10), 10 * SECOND, 0);
        // Admitted meanwhile: waits for the next write.
        assert_eq!(admitted(&engine, "k", p, 5), 5);
        let (again, batch) = engine.tick();
        assert_eq!(
            again, round,
            "an unacknowledged write is sent again as it was"
        );
        assert_eq!(batch[0].amount, 10);
        engine.written(round);
        // Redis skipped the repeat: still 10.
        engine.read_done(&engine.read_batch(), view(10), 10 * SECOND, 0);
        let (next, batch) = engine.tick();
        assert_eq!(next, round + 1);
        assert_eq!(batch[0].amount, 5);
        engine.written(next);
        // Alone (R = 1), reads showing what was written: the limit is reached, not passed.
        let mut written = 15;
        let mut total = 15;
        for _ in 0..8 {
            clock.advance(50_000);
            engine.read_done(&engine.read_batch(), view(written), clock.now_us(), 0);
            total += admitted(&engine, "k", p, 200);
            clock.advance(50_000);
            let (round, batch) = engine.tick();
            written += batch.iter().map(|i| i.amount).sum::<u64>();
            engine.written(round);
        }
        assert_eq!(total, 100);
        assert_eq!(written, 100);
    }

    #[test]
    fn a_stale_view_divides_the_limit() {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engine = LocalFirst::new(clock.clone(), 100_000);
        engine.set_replicas(4);
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        clock.advance(STALE_AFTER_INTERVALS * 100_000 + 1);
        assert!(!engine.fresh());
        assert_eq!(admitted(&engine, "k", p, 200), 25);
        // The usage is kept for when Redis answers again.
        assert_eq!(engine.tick().1[0].amount, 25);
    }

    #[test]
    fn stale_spells_go_on_from_what_was_admitted_alone() {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engine = LocalFirst::new(clock.clone(), 100_000);
        engine.set_replicas(4);
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        clock.advance(STALE_AFTER_INTERVALS * 100_000 + 1);
        assert_eq!(admitted(&engine, "k", p, 200), 25);
        let (round, _) = engine.tick();
        engine.written(round);
        // A read: fresh again, the view holds the 25, and the share is what is left of it.
        engine.read_done(
            &engine.read_batch(),
            vec![Some(State::FixedWindow {
                window: 0,
                count: 25,
            })],
            clock.now_us(),
            0,
        );
        assert!(engine.fresh());
        // Stale again: this replica's limit ÷ R is spent, not given again.
        clock.advance(STALE_AFTER_INTERVALS * 100_000 + 1);
        assert!(!engine.fresh());
        assert_eq!(admitted(&engine, "k", p, 200), 0);
    }

    /// R replicas sharing one store, on one clock: at every step each replica tries `rate`
    /// requests on one key (replica `i` from `starts[i]` on), and the rounds run on time (the
    /// writes at the ticks, the reads 3/4 into the interval). Returns the admissions per
    /// interval, counted from the first request.
    fn continuous(p: Params, starts: [Micros; 4], rate: usize, intervals: usize) -> Vec<u64> {
        continuous_with(p, starts, rate, intervals, Late::None)
    }

    /// How [`continuous_with`]'s replica 0 is late.
    #[derive(Clone, Copy, PartialEq)]
    enum Late {
        /// Every round on time.
        None,
        /// Replica 0's write lands after the reads (4/5 into the interval), every round of the
        /// first three quarters of the run, and the reads know it (the heartbeat's fleet
        /// state): partial, one tick behind.
        Heeded,
        /// The same, the reads taken as complete (what the rounds did before the fleet state).
        Ignored,
    }

    fn continuous_with(
        p: Params,
        starts: [Micros; 4],
        rate: usize,
        intervals: usize,
        late: Late,
    ) -> Vec<u64> {
        const INTERVAL: Micros = 100_000;
        const STEP: Micros = 5_000;
        let first = *starts.iter().min().unwrap();
        let clock = Arc::new(ManualClock::new(first));
        let engines: Vec<LocalFirst> = starts
            .iter()
            .map(|_| {
                let engine = LocalFirst::new(clock.clone(), INTERVAL);
                engine.set_replicas(starts.len() as u64);
                engine
            })
            .collect();
        let mut shared: Option<State> = None;
        let mut delayed = None;
        let mut per_interval = vec![0; intervals];
        for step in 0..intervals as Micros * INTERVAL / STEP {
            let now = first + step * STEP;
            // The late writes stop for the last quarter of the run: complete views again.
            let late = if step * STEP / INTERVAL >= intervals as Micros * 3 / 4 {
                Late::None
            } else {
                late
            };
            if now % INTERVAL == 0 {
                for (i, engine) in engines.iter().enumerate() {
                    let (round, batch) = engine.tick();
                    if i == 0 && late != Late::None {
                        delayed = Some((round, batch));
                        continue;
                    }
                    for item in batch {
                        shared = algorithm::charge(&p, shared.as_ref(), now, item.amount)
                            .map(|(s, _)| s);
                    }
                    engine.written(round);
                }
            }
            if now % INTERVAL == INTERVAL * 4 / 5 {
                if let Some((round, batch)) = delayed.take() {
                    for item in batch {
                        shared = algorithm::charge(&p, shared.as_ref(), now, item.amount)
                            .map(|(s, _)| s);
                    }
                    engines[0].written(round);
                }
            }
            if now % INTERVAL == INTERVAL * 3 / 4 {
                for engine in &engines {
                    let batch = engine.read_batch();
                    let states = batch.iter().map(|_| shared.clone()).collect();
                    if late == Late::Heeded {
                        engine.read_partial(&batch, states, now, 0, 1);
                    } else {
                        engine.read_done(&batch, states, now, 0);
                    }
                }
            }
            clock.set(now);
            for (engine, start) in engines.iter().zip(starts) {
                if now >= start {
                    per_interval[((now - first) / INTERVAL) as usize] +=
                        admitted(engine, "k", p, rate) as u64;
                }
            }
        }
        per_interval
    }

    #[test]
    fn continuous_traffic_over_all_replicas_spends_the_limit_within_5_intervals() {
        let day = 86_400 * SECOND;
        let limit = 200;
        let every = [
            params(Algorithm::FixedWindow, limit, day),
            params(Algorithm::SlidingWindow, limit, day),
            params(Algorithm::TokenBucket, limit, day),
            Params {
                limit: 1,
                ..params(Algorithm::Gcra, limit, day)
            },
        ];
        // The replicas meet the key before the first read (the bound's precondition): at once,
        // or spread over the interval.
        let starts = [
            [10 * SECOND; 4],
            [
                10 * SECOND,
                10 * SECOND + 20_000,
                10 * SECOND + 45_000,
                10 * SECOND + 70_000,
            ],
        ];
        for p in every {
            for starts in starts {
                // Traffic of at least a first share (limit / R) per interval on each replica
                // spends the limit within 5 intervals; slower traffic takes longer, but gets
                // there too.
                for (rate, within) in [(1, 30), (2, 30), (3, 5), (5, 5), (50, 5)] {
                    let per_interval = continuous(p, starts, rate, 30);
                    let what = format!(
                        "{:?} from {starts:?}, {rate} a step: {per_interval:?}",
                        p.algorithm
                    );
                    let total: u64 = per_interval.iter().sum();
                    assert!((limit..=limit + 3).contains(&total), "{what}");
                    assert!(
                        per_interval[..within].iter().sum::<u64>() >= limit,
                        "{what}"
                    );
                }
            }
        }
    }

    #[test]
    fn late_rounds_give_no_more_than_the_last_view_left() {
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engines: Vec<LocalFirst> = (0..4)
            .map(|_| {
                let engine = LocalFirst::new(clock.clone(), 100_000);
                engine.set_replicas(4);
                engine
            })
            .collect();
        // Each replica spends its share of the first interval...
        let mut total: usize = engines.iter().map(|e| admitted(e, "k", p, 200)).sum();
        assert_eq!(total, 100);
        // ... then its rounds never complete (a busy node: the round task is not woken): late,
        // each decides alone, and what it spent counts against its limit ÷ R.
        clock.advance(STALE_AFTER_INTERVALS * 100_000 + 1);
        for engine in &engines {
            assert!(!engine.fresh());
            total += admitted(engine, "k", p, 200);
        }
        assert!((100..=103).contains(&total), "{total} admitted");
        // A new key meets late rounds: limit ÷ R each, as when Redis is down from the start.
        let alone: usize = engines.iter().map(|e| admitted(e, "new", p, 200)).sum();
        assert_eq!(alone, 100);
    }

    #[test]
    fn a_late_spell_shares_what_the_last_complete_view_left() {
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engines: Vec<LocalFirst> = (0..4)
            .map(|_| {
                let engine = LocalFirst::new(clock.clone(), 100_000);
                engine.set_replicas(4);
                engine
            })
            .collect();
        let mut total = 0;
        for engine in &engines {
            total += admitted(engine, "k", p, 10);
            let (round, _) = engine.tick();
            engine.written(round);
        }
        // A complete view: 40 spent, 60 left.
        for engine in &engines {
            let view = State::FixedWindow {
                window: 0,
                count: 40,
            };
            engine.read_done(&engine.read_batch(), vec![Some(view)], 10 * SECOND, 0);
        }
        // One replica spends 5 more, then every round is late: 60 ÷ 4 each, less its own 5.
        total += admitted(&engines[0], "k", p, 5);
        clock.advance(STALE_AFTER_INTERVALS * 100_000 + 1);
        let alone: Vec<usize> = engines.iter().map(|e| admitted(e, "k", p, 200)).collect();
        total += alone.iter().sum::<usize>();
        assert_eq!(alone, vec![10, 15, 15, 15]);
        assert_eq!(total, 100);
    }

    #[test]
    fn a_replica_whose_writes_land_after_the_reads_keeps_the_bound_when_the_reads_know_it() {
        let day = 86_400 * SECOND;
        let limit = 200;
        let starts = [10 * SECOND; 4];
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let p = params(algorithm, limit, day);
            for rate in [1, 3, 50] {
                // While every view is partial the last units wait (another replica may have
                // read a complete view and raised its share: the others count it for a part
                // of what that view left), and are spent once the views are complete again.
                let heeded = continuous_with(p, starts, rate, 40, Late::Heeded);
                let total: u64 = heeded.iter().sum();
                assert!(
                    (limit..=limit + 3).contains(&total),
                    "{algorithm:?}, {rate} a step, late writes heeded: {total} ({heeded:?})"
                );
            }
        }
        // Taken as complete, the reads miss the late write and the shares pass the bound.
        let p = params(Algorithm::FixedWindow, limit, day);
        let ignored: u64 = continuous_with(p, starts, 3, 40, Late::Ignored)
            .iter()
            .sum();
        assert!(ignored > limit + 3, "{ignored}");
    }

    #[test]
    fn cold_copies_are_dropped_and_a_returning_caller_is_decided_on_the_fleets_count() {
        let mut replica = Replica::new(100_000);
        let p = params(Algorithm::FixedWindow, 5, 3_600 * SECOND);
        for i in 0..3_000 {
            assert!(replica.request("r", &format!("t:{{r|u{i}}}:l"), p));
        }
        assert!(replica.request("r", "t:{r|hot}:l", p));
        replica.round();
        assert_eq!(replica.engine.len(), 3_001);
        // No decision on the flood's keys for COLD_AFTER_INTERVALS; one caller stays in use.
        for _ in 0..COLD_AFTER_INTERVALS + 1 {
            replica.clock.advance(100_000);
            replica.request(
                "r",
                "t:{r|hot}:l",
                params(Algorithm::FixedWindow, 1_000, 3_600 * SECOND),
            );
            replica.round();
        }
        assert_eq!(
            replica.engine.len(),
            1,
            "only the caller in use keeps its copy"
        );
        assert_eq!(replica.engine.route_len("r"), 1);
        assert_eq!(replica.engine.cold_dropped(), 3_000);
        // The reads are the idle level again: the key in use only.
        assert_eq!(replica.engine.read_batch().len(), 1);
        // A returning caller with 1 of 5 spent: decided exactly, on the shared count, not as
        // a new key with a fresh share; 4 more, then refused.
        let exact = replica.exact;
        let back: usize = (0..10)
            .filter(|_| replica.request("r", "t:{r|u7}:l", p))
            .count();
        assert_eq!(back, 4);
        assert!(replica.exact > exact);
        assert_eq!(replica.shared_units(), replica.admitted);
    }

    #[test]
    fn drift_counts_what_the_shared_state_holds_over_the_limit() {
        let p = params(Algorithm::FixedWindow, 100, 60 * SECOND);
        let s = State::FixedWindow {
            window: 0,
            count: 103,
        };
        assert_eq!(over_limit(&p, Some(&s), SECOND), 3);
        let g = params(Algorithm::Gcra, 10, SECOND);
        assert_eq!(over_limit(&g, Some(&State::Gcra { tat: SECOND }), 0), 0);
        assert_eq!(over_limit(&g, Some(&State::Gcra { tat: 1_200_000 }), 0), 2);
    }

    /// One replica and the shared state it syncs with, the rounds run by hand: what
    /// `control::sync` and Redis do, on one clock.
    struct Replica {
        engine: LocalFirst,
        clock: Arc<ManualClock>,
        shared: HashMap<String, State>,
        /// Units admitted (locally or exactly).
        admitted: u64,
        /// Decisions sent to the shared state (no view).
        exact: u64,
    }

    impl Replica {
        fn new(keys_per_route: usize) -> Replica {
            let clock = Arc::new(ManualClock::new(10 * SECOND));
            let engine = LocalFirst::new(clock.clone(), 100_000);
            engine.set_keys_per_route(keys_per_route);
            Replica {
                engine,
                clock,
                shared: HashMap::new(),
                admitted: 0,
                exact: 0,
            }
        }

        /// One request; true when admitted.
        fn request(&mut self, route: &str, key: &str, p: Params) -> bool {
            let allowed = match self.engine.decide(route, &[check(key, p)]) {
                Some(d) => d.allowed,
                None => {
                    self.exact += 1;
                    let now = self.clock.now_us();
                    let step = algorithm::step_for(&p, self.shared.get(key), now, 0);
                    if step.verdict.allowed {
                        self.shared.insert(key.to_string(), step.state);
                    }
                    step.verdict.allowed
                }
            };
            self.admitted += u64::from(allowed);
            allowed
        }

        /// A whole round: every write batch the round allows, then the read.
        fn round(&mut self) {
            let now = self.clock.now_us();
            let charge = |shared: &mut HashMap<String, State>, batch: Vec<SyncItem>| {
                assert!(batch.len() <= BATCH_KEYS);
                for item in batch {
                    let state = shared.get(&item.key);
                    let (state, _) =
                        algorithm::charge(&item.params, state, now, item.amount).expect("charged");
                    shared.insert(item.key, state);
                }
            };
            let (round, batch) = self.engine.tick();
            let mut sent = batch.len();
            charge(&mut self.shared, batch);
            self.engine.written(round);
            while sent < ROUND_KEYS {
                let Some((round, batch)) = self.engine.next_write() else {
                    break;
                };
                sent += batch.len();
                charge(&mut self.shared, batch);
                self.engine.written(round);
            }
            let reads = self.engine.read_batch();
            assert!(reads.len() <= ROUND_KEYS + IDLE_READS);
            let states = reads
                .iter()
                .map(|i| self.shared.get(&i.key).cloned())
                .collect();
            self.engine.read_done(&reads, states, now, 0);
        }

        /// Every unit in the shared state.
        fn shared_units(&self) -> u64 {
            self.shared
                .values()
                .map(|s| match s {
                    State::FixedWindow { count, .. } => *count,
                    _ => unreachable!(),
                })
                .sum()
        }
    }

    #[test]
    fn a_key_flood_200_times_the_budget_keeps_each_route_within_it_and_loses_no_count() {
        // 200,000 new keys against a route budget of 1,000, a round every 10,000 keys.
        let mut replica = Replica::new(1_000);
        let p = params(Algorithm::FixedWindow, 5, 3_600 * SECOND);
        let busy = params(Algorithm::FixedWindow, 100_000, 3_600 * SECOND);
        let mut hot_uses = 0;
        for i in 0..200_000u32 {
            let key = format!("t:{{login|f{i}}}:l");
            assert!(replica.request("login", &key, p), "new key {i} refused");
            if i % 100 == 0 {
                // Alice, busy on the same route, and a caller on another route.
                assert!(replica.request("login", "t:{login|alice}:l", busy));
                assert!(replica.request(
                    "search",
                    &format!("t:{{search|s{}}}:l", i / 100 % 300),
                    busy
                ));
                hot_uses += 1;
                replica.clock.advance(1_000);
            }
            if i % 10_000 == 9_999 {
                replica.round();
                assert!(replica.engine.route_len("login") <= 1_000);
                assert!(replica.engine.len() <= 1_300);
            }
        }
        replica.round();
        replica.round();
        // Bounded: the flood's copies were dropped to make room (a route's budget each round,
        // once they are clean), and the keys that found no room were decided exactly.
        assert!(replica.engine.route_len("login") <= 1_000);
        assert!(
            replica.engine.evicted() >= 18_000,
            "{}",
            replica.engine.evicted()
        );
        assert!(replica.exact >= 180_000, "{}", replica.exact);
        // Every unit admitted is in the shared state: none lost with a dropped copy.
        assert_eq!(replica.shared_units(), replica.admitted);
        // Alice kept her copy (decided locally throughout but for her first request).
        assert_eq!(
            replica.shared.get("t:{login|alice}:l"),
            Some(&State::FixedWindow {
                window: 0,
                count: hot_uses
            })
        );
        // The other route's 300 callers kept theirs.
        assert_eq!(replica.engine.route_len("search"), 300);
        // A new caller is admitted.
        assert!(replica.request("login", "t:{login|carol}:l", p));
    }

    #[test]
    fn a_copy_with_usage_not_written_is_never_dropped_and_a_full_route_decides_exactly() {
        let mut replica = Replica::new(10);
        let p = params(Algorithm::FixedWindow, 2, 3_600 * SECOND);
        // Ten callers spend their limit: their copies hold usage not written yet.
        for i in 0..10 {
            let key = format!("t:{{r|u{i}}}:l");
            assert!(replica.request("r", &key, p));
            assert!(replica.request("r", &key, p));
            assert!(!replica.request("r", &key, p));
        }
        // A new caller: no copy may be dropped, so it is decided exactly, and admitted.
        assert!(replica.request("r", "t:{r|new}:l", p));
        assert_eq!(replica.exact, 1);
        assert_eq!(replica.engine.route_len("r"), 10);
        // After a round the copies are clean and untouched: the next new key takes one's
        // place, and the caller whose copy was dropped is not freed early: decided exactly
        // on the shared state until a read brings its view again.
        replica.round();
        for i in 10..20 {
            assert!(replica.request("r", &format!("t:{{r|u{i}}}:l"), p));
        }
        assert_eq!(replica.engine.route_len("r"), 10);
        for i in 0..10 {
            assert!(
                !replica.request("r", &format!("t:{{r|u{i}}}:l"), p),
                "u{i} freed"
            );
        }
        replica.round();
        assert_eq!(replica.shared_units(), replica.admitted);
    }

    #[test]
    fn usage_beyond_a_batch_waits_for_the_next_write_oldest_first() {
        let clock = Arc::new(ManualClock::new(10 * SECOND));
        let engine = LocalFirst::new(clock.clone(), 100_000);
        let p = params(Algorithm::FixedWindow, 5, 3_600 * SECOND);
        for i in 0..2_500 {
            let key = format!("t:{{r|u{i}}}:l");
            assert!(engine.decide("r", &[check(&key, p)]).unwrap().allowed);
        }
        let (round, batch) = engine.tick();
        assert_eq!(batch.len(), BATCH_KEYS);
        assert_eq!(batch[0].key, "t:{r|u0}:l");
        engine.written(round);
        let (round, batch) = engine.next_write().unwrap();
        assert_eq!(batch[0].key, "t:{r|u1000}:l");
        // Not acknowledged: sent again as it was.
        assert_eq!(engine.next_write().unwrap(), (round, batch));
        engine.written(round);
        let (_, batch) = engine.next_write().unwrap();
        assert_eq!(batch.len(), 500);
    }

    /// A fleet of R replicas running the rounds of `control::sync` on one clock against a
    /// model of Redis: each replica's task wakes late by its own delays (a busy node), Redis
    /// can be frozen (every call waits, then times out after [`Fleet::TIMEOUT`] or is
    /// answered when it resumes, applied either way), and every replica floods one key.
    mod fleet {
        use super::*;

        pub const INTERVAL: Micros = 100_000;
        const TIMEOUT: Micros = 300_000;

        /// A small deterministic generator (xorshift64*).
        pub struct Rng(pub u64);
        impl Rng {
            pub fn next(&mut self) -> u64 {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
            }
            pub fn below(&mut self, n: u64) -> u64 {
                if n == 0 {
                    0
                } else {
                    self.next() % n
                }
            }
        }

        #[derive(Clone, Debug)]
        enum Op {
            Write { round: u64, items: Vec<SyncItem> },
            Heartbeat { written: i64 },
            Read { items: Vec<SyncItem> },
        }

        #[derive(Clone, Debug)]
        enum Answer {
            Written,
            Heartbeat {
                oldest: i64,
            },
            Read {
                now: Micros,
                states: Vec<Option<State>>,
            },
        }

        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Call {
            Write { round: u64 },
            Heartbeat,
            ReadHeartbeat,
            Read { sent: Micros },
        }

        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Wake {
            Tick,
            Read,
        }

        #[derive(Debug)]
        enum Event {
            /// Redis takes a call (at the end of a freeze, in the order they came).
            Apply { replica: usize, call: u64, op: Op },
            /// The answer reaches the replica.
            Answer {
                replica: usize,
                call: u64,
                answer: Answer,
            },
            /// The call's timeout.
            Timeout { replica: usize, call: u64 },
            /// A sleep ends.
            Wake { replica: usize, what: Wake },
        }

        struct Task {
            engine: LocalFirst,
            /// The call awaited and what it is.
            waiting: Option<(u64, Call)>,
            tick: Micros,
            write_started: Micros,
            resent: bool,
            flush: usize,
            written: i64,
            failed: bool,
            behind: u64,
            reads: Vec<SyncItem>,
        }

        /// What shapes a run.
        #[derive(Clone, Debug)]
        pub struct Plan {
            pub replicas: usize,
            pub params: Params,
            /// Requests per replica per millisecond.
            pub rate: usize,
            pub intervals: i64,
            /// Redis frozen over these spans (µs from the start).
            pub freezes: Vec<(Micros, Micros)>,
            /// Per replica, the delays (µs) of its task's wake-ups, drawn in turn (empty: none).
            pub wake_delays: Vec<Vec<Micros>>,
            /// Latency of each call each way (µs).
            pub latency: Micros,
            pub trace: bool,
        }

        pub struct Run {
            pub admitted: u64,
            pub per_replica: Vec<u64>,
            pub log: Vec<String>,
        }

        pub fn run(plan: &Plan) -> Run {
            let start = 10 * SECOND;
            let clock = Arc::new(ManualClock::new(start));
            let mut tasks: Vec<Task> = (0..plan.replicas)
                .map(|_| {
                    let engine = LocalFirst::new(clock.clone(), INTERVAL);
                    engine.set_replicas(plan.replicas as u64);
                    Task {
                        engine,
                        waiting: None,
                        tick: 0,
                        write_started: 0,
                        resent: false,
                        flush: 0,
                        written: -1,
                        failed: false,
                        behind: 0,
                        reads: Vec::new(),
                    }
                })
                .collect();
            let mut shared: Option<State> = None;
            let mut markers = vec![0u64; plan.replicas];
            let mut heartbeat: Vec<Option<i64>> = vec![None; plan.replicas];
            let mut events: Vec<(Micros, u64, Event)> = Vec::new();
            let mut seq = 0u64;
            let mut calls = 0u64;
            let mut delays: Vec<usize> = vec![0; plan.replicas];
            let mut log = Vec::new();
            let frozen_until = |t: Micros| -> Option<Micros> {
                plan.freezes
                    .iter()
                    .find(|(a, b)| t >= start + a && t < start + b)
                    .map(|(_, b)| start + b)
            };
            let mut delay = |r: usize| -> Micros {
                let d = &plan.wake_delays.get(r).map(|v| v.as_slice()).unwrap_or(&[]);
                if d.is_empty() {
                    return 0;
                }
                let x = d[delays[r] % d.len()];
                delays[r] += 1;
                x
            };
            // Each task's first sleep: to the first tick.
            for r in 0..plan.replicas {
                let at = start - start.rem_euclid(INTERVAL) + INTERVAL + delay(r);
                events.push((
                    at,
                    seq,
                    Event::Wake {
                        replica: r,
                        what: Wake::Tick,
                    },
                ));
                seq += 1;
            }
            let p = plan.params;
            let mut per_replica = vec![0u64; plan.replicas];
            let end = start + plan.intervals * INTERVAL;
            let flood_from = start + 2 * INTERVAL;
            // Each replica meets the key first.
            for (r, task) in tasks.iter().enumerate() {
                if let Some(d) = task.engine.decide("r", &[check("k", p)]) {
                    per_replica[r] += u64::from(d.allowed);
                }
            }
            let mut now = start;
            while now < end {
                // Events due, in order.
                while let Some(i) = (0..events.len())
                    .filter(|&i| events[i].0 <= now)
                    .min_by_key(|&i| (events[i].0, events[i].1))
                {
                    let (at, _, event) = events.swap_remove(i);
                    clock.set(at);
                    if plan.trace {
                        log.push(
                            format!("{} {event:?}", at - start)
                                .chars()
                                .take(200)
                                .collect(),
                        );
                    }
                    let send = |events: &mut Vec<(Micros, u64, Event)>,
                                seq: &mut u64,
                                calls: &mut u64,
                                task: &mut Task,
                                r: usize,
                                call: Call,
                                op: Op| {
                        *calls += 1;
                        let arrives = at + plan.latency;
                        let applied = frozen_until(arrives).unwrap_or(arrives);
                        events.push((
                            applied,
                            *seq,
                            Event::Apply {
                                replica: r,
                                call: *calls,
                                op,
                            },
                        ));
                        *seq += 1;
                        events.push((
                            at + TIMEOUT,
                            *seq,
                            Event::Timeout {
                                replica: r,
                                call: *calls,
                            },
                        ));
                        *seq += 1;
                        task.waiting = Some((*calls, call));
                    };
                    match event {
                        Event::Apply { replica, call, op } => {
                            let answer = match op {
                                Op::Write { round, items } => {
                                    if round > markers[replica] {
                                        markers[replica] = round;
                                        for item in items {
                                            shared = algorithm::charge(
                                                &p,
                                                shared.as_ref(),
                                                at,
                                                item.amount,
                                            )
                                            .map(|(s, _)| s);
                                        }
                                    }
                                    Answer::Written
                                }
                                Op::Heartbeat { written } => {
                                    if written >= 0 {
                                        heartbeat[replica] = Some(written);
                                    }
                                    let oldest =
                                        heartbeat.iter().map(|w| w.unwrap_or(0)).min().unwrap();
                                    Answer::Heartbeat { oldest }
                                }
                                Op::Read { items } => Answer::Read {
                                    now: at,
                                    states: items.iter().map(|_| shared.clone()).collect(),
                                },
                            };
                            events.push((
                                at + plan.latency,
                                seq,
                                Event::Answer {
                                    replica,
                                    call,
                                    answer,
                                },
                            ));
                            seq += 1;
                        }
                        Event::Wake { replica, what } => {
                            let task = &mut tasks[replica];
                            match what {
                                Wake::Tick => {
                                    let woke = task.engine.store_now();
                                    task.tick = woke - woke.rem_euclid(INTERVAL);
                                    let (round, batch) = task.engine.tick();
                                    task.failed = false;
                                    task.write_started = at;
                                    task.resent = task.engine.sent_before(round);
                                    task.flush = 10;
                                    send(
                                        &mut events,
                                        &mut seq,
                                        &mut calls,
                                        task,
                                        replica,
                                        Call::Write { round },
                                        Op::Write {
                                            round,
                                            items: batch,
                                        },
                                    );
                                }
                                Wake::Read => {
                                    let written = task.written;
                                    send(
                                        &mut events,
                                        &mut seq,
                                        &mut calls,
                                        task,
                                        replica,
                                        Call::ReadHeartbeat,
                                        Op::Heartbeat { written },
                                    );
                                }
                            }
                        }
                        ev @ (Event::Answer { .. } | Event::Timeout { .. }) => {
                            let (replica, call, answer) = match ev {
                                Event::Answer {
                                    replica,
                                    call,
                                    answer,
                                } => (replica, call, Some(answer)),
                                Event::Timeout { replica, call } => (replica, call, None),
                                _ => unreachable!(),
                            };
                            let task = &mut tasks[replica];
                            let Some((waited, what)) = task.waiting else {
                                continue;
                            };
                            if waited != call {
                                continue;
                            }
                            task.waiting = None;
                            let mut sleep_to_tick = false;
                            match (what, answer) {
                                (Call::Write { round }, Some(_)) => {
                                    // control::sync::write, one call at a time.
                                    task.engine.written(round);
                                    let alone = task.engine.spent_alone();
                                    let more = if task.resent || (alone && task.flush > 0) {
                                        if alone {
                                            task.engine.wrote(task.tick);
                                            task.flush -= 1;
                                        }
                                        true
                                    } else {
                                        at - task.write_started < INTERVAL / 4
                                    };
                                    task.resent = false;
                                    let next = if more { task.engine.next_write() } else { None };
                                    let record = more || !alone || !task.engine.unsent();
                                    if let Some((round, items)) = next {
                                        send(
                                            &mut events,
                                            &mut seq,
                                            &mut calls,
                                            task,
                                            replica,
                                            Call::Write { round },
                                            Op::Write { round, items },
                                        );
                                    } else {
                                        if record {
                                            task.written = task.tick;
                                            task.engine.wrote(task.tick);
                                        }
                                        let written = task.written;
                                        send(
                                            &mut events,
                                            &mut seq,
                                            &mut calls,
                                            task,
                                            replica,
                                            Call::Heartbeat,
                                            Op::Heartbeat { written },
                                        );
                                    }
                                }
                                (Call::Write { .. }, None) => {
                                    task.failed = true;
                                    let written = task.written;
                                    send(
                                        &mut events,
                                        &mut seq,
                                        &mut calls,
                                        task,
                                        replica,
                                        Call::Heartbeat,
                                        Op::Heartbeat { written },
                                    );
                                }
                                (Call::Heartbeat, _) => {
                                    if task.failed {
                                        sleep_to_tick = true;
                                    } else {
                                        let read_at = task.tick + INTERVAL * 3 / 4;
                                        let n = task.engine.store_now();
                                        if read_at > n {
                                            let at = at + (read_at - n) + delay(replica);
                                            events.push((
                                                at,
                                                seq,
                                                Event::Wake {
                                                    replica,
                                                    what: Wake::Read,
                                                },
                                            ));
                                            seq += 1;
                                        } else {
                                            let written = task.written;
                                            send(
                                                &mut events,
                                                &mut seq,
                                                &mut calls,
                                                task,
                                                replica,
                                                Call::ReadHeartbeat,
                                                Op::Heartbeat { written },
                                            );
                                        }
                                    }
                                }
                                (Call::ReadHeartbeat, Some(Answer::Heartbeat { oldest })) => {
                                    task.behind = if oldest >= task.tick {
                                        0
                                    } else {
                                        ((task.tick - oldest) as u64).div_ceil(INTERVAL as u64)
                                    };
                                    task.reads = task.engine.read_batch();
                                    let items = task.reads.clone();
                                    send(
                                        &mut events,
                                        &mut seq,
                                        &mut calls,
                                        task,
                                        replica,
                                        Call::Read { sent: at },
                                        Op::Read { items },
                                    );
                                }
                                (
                                    Call::Read { sent },
                                    Some(Answer::Read {
                                        now: store_now,
                                        states,
                                    }),
                                ) => {
                                    let reads = std::mem::take(&mut task.reads);
                                    if task.behind == 0 {
                                        task.engine.read_done(&reads, states, store_now, at - sent);
                                    } else {
                                        task.engine.read_partial(
                                            &reads,
                                            states,
                                            store_now,
                                            at - sent,
                                            task.behind,
                                        );
                                    }
                                    log.push(format!(
                                        "{} r{replica} read behind {} at {}",
                                        at - start,
                                        task.behind,
                                        store_now - start
                                    ));
                                    sleep_to_tick = true;
                                }
                                _ => sleep_to_tick = true,
                            }
                            if sleep_to_tick {
                                let n = task.engine.store_now();
                                let wait = INTERVAL - n.rem_euclid(INTERVAL);
                                events.push((
                                    at + wait + delay(replica),
                                    seq,
                                    Event::Wake {
                                        replica,
                                        what: Wake::Tick,
                                    },
                                ));
                                seq += 1;
                            }
                        }
                    }
                }
                clock.set(now);
                if now >= flood_from {
                    for r in 0..plan.replicas {
                        let before = per_replica[r];
                        let fresh = tasks[r].engine.fresh();
                        for _ in 0..plan.rate {
                            match tasks[r].engine.decide("r", &[check("k", p)]) {
                                Some(d) => per_replica[r] += u64::from(d.allowed),
                                None => {
                                    // Decided exactly (Redis): refused while frozen.
                                    if frozen_until(now).is_none() {
                                        let step = algorithm::step_for(&p, shared.as_ref(), now, 0);
                                        if step.verdict.allowed {
                                            shared = Some(step.state);
                                            per_replica[r] += 1;
                                        }
                                    }
                                }
                            }
                        }
                        if per_replica[r] > before {
                            let e = tasks[r].engine.lock();
                            let k = &e.keys["k"];
                            log.push(format!(
                                "{} r{r} +{} fresh {fresh} share {} admitted {} others {} unseen {} local {} view {}",
                                now - start,
                                per_replica[r] - before,
                                k.share,
                                k.admitted,
                                k.others_share,
                                k.unseen,
                                available(&p, k.local.as_ref(), now),
                                available(&p, k.view.as_ref(), now),
                            ));
                        }
                    }
                }
                now += 1_000;
            }
            Run {
                admitted: per_replica.iter().sum(),
                per_replica,
                log,
            }
        }
    }

    /// A run of [`fleet::run`] drawn from `seed`: Redis frozen four times or never, each
    /// task's wake-ups late by up to 0–120 ms (up to 250 ms when `wide`), calls 0–3 ms each
    /// way; R = 4 on a fixed window of 200 a day, or (`wide`) R of 2–5 and any of three
    /// algorithms.
    fn plan(seed: u64, wide: bool) -> fleet::Plan {
        let day = 86_400 * SECOND;
        let limit = 200;
        let mut rng = fleet::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let replicas = if wide { 2 + rng.below(4) as usize } else { 4 };
        let freezes = if rng.below(2) == 0 {
            Vec::new()
        } else {
            let len = 100_000 + rng.below(300_000) as Micros;
            let first = 300_000 + rng.below(100_000) as Micros;
            let gap = if wide {
                400_000 + rng.below(800_000) as Micros
            } else {
                800_000
            };
            (0..4)
                .map(|i| (first + i * gap, first + i * gap + len))
                .collect()
        };
        let max_delay =
            [0, 5_000, 30_000, 120_000, 250_000][rng.below(if wide { 5 } else { 4 }) as usize];
        let wake_delays = (0..replicas)
            .map(|_| {
                (0..64)
                    .map(|_| {
                        if rng.below(4) == 0 {
                            rng.below(max_delay + 1) as Micros
                        } else {
                            rng.below(2_000) as Micros
                        }
                    })
                    .collect()
            })
            .collect();
        fleet::Plan {
            replicas,
            params: if wide {
                [
                    params(Algorithm::FixedWindow, limit, day),
                    params(Algorithm::SlidingWindow, limit, day),
                    params(Algorithm::TokenBucket, limit, day),
                ][rng.below(3) as usize]
            } else {
                params(Algorithm::FixedWindow, limit, day)
            },
            rate: 1 + rng.below(3) as usize,
            intervals: 40,
            freezes,
            wake_delays,
            latency: rng.below(3_000) as Micros,
            trace: false,
        }
    }

    /// The replay that found the late spells' hole (issue 36): R = 4, limit 200, Redis frozen
    /// for 242 ms four times, wake-ups up to 30 ms late. Replica 2's read came after the
    /// next tick, so it skipped a tick and its interval spanned two: 46 admitted in it. The
    /// others' reads of that tick were partial (its write missing) and they then went late
    /// in the freeze, each bounded by a quarter of the partial view (157 left, which held
    /// their own usage of the interval but not replica 2's), less its own since: 39 each.
    /// 227 admitted before the fix (spells took a quarter of a view older than the tick they
    /// had recorded); now a replica whose recorded tick is newer than its last complete view
    /// keeps to what is left of its share.
    #[test]
    fn a_late_spell_after_a_partial_view_keeps_the_bound() {
        let run = fleet::run(&plan(319, false));
        assert!(
            (200..=203).contains(&run.admitted),
            "{} admitted ({:?})",
            run.admitted,
            run.per_replica
        );
    }

    /// The fleet model over many draws of delays and freezes: every run within the bound,
    /// limit + R − 1 (before the fixes of issue 36: 256 of 3,000 draws of `plan(_, false)`
    /// over it, up to 257 of 200; 15 of those without a freeze, a busy node alone).
    #[test]
    fn late_rounds_in_a_fleet_keep_the_bound() {
        for (seeds, wide) in [(1..=60, false), (1..=60, true)] {
            for seed in seeds {
                let plan = plan(seed, wide);
                let run = fleet::run(&plan);
                let bound = plan.params.limit + plan.replicas as u64 - 1;
                assert!(
                    run.admitted <= bound,
                    "seed {seed} (wide: {wide}): {} admitted of {} + {} ({:?})",
                    run.admitted,
                    plan.params.limit,
                    plan.replicas - 1,
                    run.per_replica
                );
            }
        }
    }

    /// Explores the fleet model (not a regression test: prints the runs outside the bounds;
    /// SEEDS=n, WIDE=1, TRACE=seed for a run's events and decisions).
    #[test]
    #[ignore]
    fn explore_the_fleet_for_runs_over_the_bound() {
        let seeds: u64 = std::env::var("SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        let wide = std::env::var("WIDE").is_ok();
        let mut worst = 0;
        for seed in 1..=seeds {
            let plan = plan(seed, wide);
            let run = fleet::run(&plan);
            if std::env::var("TRACE").ok() == Some(seed.to_string()) {
                let plan = fleet::Plan {
                    trace: true,
                    ..plan.clone()
                };
                for line in fleet::run(&plan).log {
                    println!("{line}");
                }
            }
            let limit = plan.params.limit;
            if run.admitted > limit + plan.replicas as u64 - 1 || run.admitted < limit {
                println!(
                    "seed {seed}: {} {:?} freezes {:?} rate {} latency {}",
                    run.admitted, run.per_replica, plan.freezes, plan.rate, plan.latency
                );
            }
            worst = worst.max(run.admitted);
        }
        println!("worst {worst}");
    }
}
