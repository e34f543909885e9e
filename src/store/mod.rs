//! The stores limits live in, and everything about owning them: the memory store (swept in
//! the background), the shared Redis store connected in the background with backoff (tollgate
//! starts while Redis is not there yet; requests wait for its first attempt, then `on_error`
//! applies until it connects), its health probe, the circuit breaker in front of it
//! (`breaker.rs`), whether it is up, readiness, and `on_error` for a decision the shared store
//! could not make.
//!
//! Health, readiness and `on_error` follow one state, the shared `up` flag:
//!
//! - **Up**: requests ask Redis. A failed call (or an open breaker) applies `on_error` to
//!   that request; the first failure marks the store **down** and wakes the health probe.
//! - **Down**: requests apply `on_error` at once, without asking Redis (one relaxed atomic
//!   load decides, so nothing waits for the store timeout), and `/readyz` says 503. The
//!   probe keeps checking.
//! - Back **up** only through the probe: every connection requests use (on one server, each
//!   serving thread's too) answered a `PING`, a broken one replaced first; the breaker is
//!   closed at the same moment. So readiness says ready only once the connections requests
//!   will use are good, and a Redis restarted while the proxy was idle costs no request.
//!
//! Every failure is reported with its cause named ([`Cause`]: refused, reset, timeout,
//! authentication failed, script error, other): the last one seen while the store is down is
//! kept ([`Stores::cause`]) for the metrics of the requests it fails, `/readyz` and the
//! console. A timeout is looked into before it is reported (`RedisStore::diagnose`), since a
//! refused connection or a wrong password shows up as calls timing out while the connection
//! retries. At connect and each return the server's persistence is checked against what the
//! configuration keeps there (`persistence.rs`).
//!
//! The probe runs every [`HEALTH_PROBE_EVERY`] whether or not traffic flows, so it also
//! finds a store lost while idle (down) and connections broken by a quick restart it never
//! saw as down (replaced).
//!
//! **Before that, the first connection attempt** (connecting and loading the scripts, see
//! `connect_redis`): a request that arrives while it is being made waits for it, at most as
//! long as the attempt may take (twice the store timeout from when it began, or from the
//! request's arrival if later; a second more for an attempt running late on a busy node),
//! and is then decided by Redis, or by `on_error` once the attempt failed (or the wait ran
//! out: cause [`Cause::NotConnected`]). So a fresh replica limits from its first request
//! instead of failing open until it connects; the wait costs nothing once the store is
//! connected (it is taken only while the connected store's slot is still empty). Readiness
//! says not ready until the attempt has ended ([`Stores::connecting`]), whatever `on_error`
//! says; after a failed attempt the store is down, as above, and retried with backoff.
//!
//! One [`Stores`] serves one configuration; a reload that keeps the store settings carries it
//! over (the same memory state, connection, breaker and up flag), so limits that did not change
//! keep counting where they were. The limit stage asks it for the memory store, the connected
//! shared store, and shared decisions with `on_error` applied ([`Stores::decide_shared`]).
//!
//! Which store holds a limit is decided here alone ([`Holder`]): the limit stage, the
//! operators' reads and resets, a caller's usage and `explain --live` all ask it.

mod breaker;
mod holder;
pub mod persistence;
pub mod replicas;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::config::{Limit, OnError, RedisConfig, StoreConfig};
use crate::limit::memory::MemoryStore;
use crate::limit::redis_store::RedisStore;
use crate::limit::{Cause, Check, Decision, Store, StoreError};
pub use holder::Holder;

/// How often idle in-memory keys are swept away.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often the store is checked (for its loss while up, for its return while down).
const HEALTH_PROBE_EVERY: Duration = Duration::from_millis(500);
/// The first connection attempt takes at most this many store timeouts from when it began:
/// one to connect, one to load the scripts (or, when connecting timed out, to find out why).
/// A request waits for it as long (see [`FirstAttempt::wait`]), and [`FIRST_ATTEMPT_GRACE`].
const FIRST_ATTEMPT_BOUND: u32 = 2;
/// How much longer than the first attempt's bound a request waits for its outcome: the
/// attempt's timers run on the main thread, which on a busy node runs late (seen: 200 ms
/// late beside two CPU-bound processes), and a request that gave up on an attempt that then
/// connected would fail open for nothing. Only waited through when the attempt runs late.
const FIRST_ATTEMPT_GRACE: Duration = Duration::from_secs(1);
/// Backoff bounds while the first Redis connection cannot be made.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Whether the first connection attempt of a Redis store has begun and ended (connected or
/// failed), and a wake-up for the requests waiting for it (see the module docs).
struct FirstAttempt {
    ended: AtomicBool,
    /// When the attempt began: its task's first run, which on a busy node may come after the
    /// listeners took their first requests.
    began: OnceLock<Instant>,
    /// Wakes the waiting requests when the attempt begins and when it ends.
    done: tokio::sync::Notify,
    /// Set once a request waited for the attempt (logged once).
    waited: AtomicBool,
    /// Set once a request's wait ran out while the attempt went on (logged once).
    ran_out: AtomicBool,
}

impl FirstAttempt {
    fn new(ended: bool) -> FirstAttempt {
        FirstAttempt {
            ended: AtomicBool::new(ended),
            began: OnceLock::new(),
            done: tokio::sync::Notify::new(),
            waited: AtomicBool::new(false),
            ran_out: AtomicBool::new(false),
        }
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The attempt begins now (its deadlines count from here).
    fn begin(&self) {
        if self.began.set(Instant::now()).is_ok() {
            self.done.notify_waiters();
        }
    }

    /// The attempt has ended (its outcome is in place first): wakes every waiting request.
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.done.notify_waiters();
    }

    /// Waits until the attempt has ended: false when it did not end within `bound` (as long as
    /// it may take) from when it began, or from this request's arrival if that was later. An
    /// attempt not begun yet is waited for at most `bound` to begin.
    async fn wait(&self, bound: Duration) -> bool {
        let arrived = Instant::now();
        loop {
            let woken = self.done.notified();
            tokio::pin!(woken);
            // Registered before the state is read, so a change between the two is not missed.
            woken.as_mut().enable();
            if self.ended() {
                return true;
            }
            let deadline = match self.began.get() {
                Some(&began) => began.max(arrived) + bound,
                None => arrived + bound,
            };
            if tokio::time::timeout_at(deadline.into(), woken)
                .await
                .is_err()
            {
                // Out of time, unless the attempt began just now (its own deadline is later).
                let later = self
                    .began
                    .get()
                    .is_some_and(|&began| began.max(arrived) + bound > Instant::now());
                if !later {
                    return self.ended();
                }
            }
        }
    }
}

/// The slot of the shared (Redis) store: empty until the background connection is made.
/// Clones share the slot; the health probe runs while any clone is held.
#[derive(Clone)]
pub struct Shared(Arc<OnceCell<Store>>);

/// A [`Shared`] that does not keep the store's health probe running.
#[derive(Clone)]
pub struct WeakShared(Weak<OnceCell<Store>>);

impl Shared {
    /// A slot holding a store connected elsewhere (`tollgate limits` against Redis); no probe
    /// runs for it.
    pub fn connected(store: Store) -> Shared {
        Shared(Arc::new(OnceCell::new_with(Some(store))))
    }

    /// The store, once connected.
    pub fn get(&self) -> Option<&Store> {
        self.0.get()
    }

    pub fn downgrade(&self) -> WeakShared {
        WeakShared(Arc::downgrade(&self.0))
    }
}

impl WeakShared {
    /// The slot, while a holder of a [`Shared`] still uses it.
    pub fn upgrade(&self) -> Option<Shared> {
        self.0.upgrade().map(Shared)
    }
}

/// How a decision over global limits was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The shared store answered (whether it admitted or not).
    Answered,
    /// The store failed and `on_error: allow` let the request through undecided.
    FailedOpen,
    /// The store failed and the memory store decided (`on_error: local`).
    LocalFallback,
}

/// What [`Stores::health`] reports.
#[derive(Debug, Clone, Copy)]
pub struct Health {
    /// A Redis store is configured.
    pub shared: bool,
    /// It has connected (at least once).
    pub connected: bool,
    /// Its last call and health check answered.
    pub up: bool,
    /// The circuit breaker refuses calls (after repeated failures, until a probe answers).
    pub breaker_open: bool,
    pub on_error: OnError,
    /// Why it is down (None while up; `NotConnected` before the first connection when no
    /// failure was seen yet).
    pub cause: Option<Cause>,
    /// Its first connection attempt is being made (neither connected nor failed yet).
    pub connecting: bool,
}

/// The cause of the store's current failure, shared by everyone who sees one: 0 while none is
/// known, else 1 + the cause's index.
#[derive(Clone, Default)]
struct CauseCell(Arc<AtomicU8>);

impl CauseCell {
    fn set(&self, cause: Cause) {
        self.0.store(cause.index() as u8 + 1, Ordering::Relaxed);
    }

    fn clear(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    fn get(&self) -> Option<Cause> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            n => Cause::ALL.get(usize::from(n) - 1).copied(),
        }
    }
}

/// The stores of one configuration and their upkeep (see the module docs).
pub struct Stores {
    config: StoreConfig,
    on_error: OnError,
    memory: Store,
    shared: Option<Shared>,
    /// False from a failure seen (by a request or the probe) until the probe finds every
    /// connection answering again (see the module docs).
    up: Arc<AtomicBool>,
    /// Stops waiting on a failing Redis: `on_error` applies at once until a probe answers.
    breaker: Arc<breaker::Breaker>,
    /// Wakes the health probe at once when a request finds the store failing, so a store
    /// that still answers is back without waiting for the probe's next tick.
    probe_now: Arc<tokio::sync::Notify>,
    /// The cause of the current failure (see the module docs).
    cause: CauseCell,
    /// The server's persistence against what the configuration keeps in Redis.
    persistence: persistence::Check,
    /// The first connection attempt (see the module docs); ended from the start without Redis.
    first: Arc<FirstAttempt>,
    /// How long a request waits for the first connection attempt at most: as long as the
    /// attempt may take, and a grace (see [`FIRST_ATTEMPT_BOUND`]).
    first_wait: Duration,
}

impl Stores {
    /// The stores for `config`. Redis is connected in the background. `previous` (the running
    /// configuration's, on a reload) hands over its stores when the store settings did not
    /// change.
    pub fn new(config: &StoreConfig, on_error: OnError, previous: Option<&Stores>) -> Stores {
        if let Some(previous) = previous.filter(|p| &p.config == config) {
            return Stores {
                config: config.clone(),
                on_error,
                memory: previous.memory.clone(),
                shared: previous.shared.clone(),
                up: previous.up.clone(),
                breaker: previous.breaker.clone(),
                probe_now: previous.probe_now.clone(),
                cause: previous.cause.clone(),
                persistence: previous.persistence.clone(),
                first: previous.first.clone(),
                first_wait: previous.first_wait,
            };
        }
        let memory = MemoryStore::new();
        if tokio::runtime::Handle::try_current().is_ok() {
            memory.spawn_sweeper(SWEEP_EVERY);
        }
        let up = Arc::new(AtomicBool::new(true));
        let cause = CauseCell::default();
        let persistence = persistence::Check::default();
        let probe_now = Arc::new(tokio::sync::Notify::new());
        let probe_timeout = match config {
            StoreConfig::Redis(redis) => redis.timeout,
            StoreConfig::Memory => Duration::ZERO,
        };
        let breaker = Arc::new(breaker::Breaker::new(
            breaker::DEFAULT_THRESHOLD,
            breaker::DEFAULT_COOL_DOWN,
            probe_timeout,
        ));
        let first = Arc::new(FirstAttempt::new(matches!(config, StoreConfig::Memory)));
        let shared = match config {
            StoreConfig::Memory => {
                tracing::info!("no store configured: limits live in this process's memory and are not shared between instances");
                None
            }
            StoreConfig::Redis(redis) => {
                let cell = Arc::new(OnceCell::new());
                tokio::spawn(connect_redis(
                    redis.clone(),
                    cell.clone(),
                    Probe {
                        up: up.clone(),
                        breaker: breaker.clone(),
                        probe_now: probe_now.clone(),
                        cause: cause.clone(),
                        persistence: persistence.clone(),
                        first: first.clone(),
                    },
                ));
                Some(Shared(cell))
            }
        };
        Stores {
            config: config.clone(),
            on_error,
            memory: Store::Memory(memory),
            shared,
            up,
            breaker,
            probe_now,
            cause,
            persistence,
            first,
            first_wait: probe_timeout * FIRST_ATTEMPT_BOUND + FIRST_ATTEMPT_GRACE,
        }
    }

    /// Whether these are `previous`'s stores carried over a reload (the same state).
    pub fn carried_from(&self, previous: &Stores) -> bool {
        Arc::ptr_eq(&self.up, &previous.up)
    }

    /// The memory store: local limits, and the `on_error: local` fallback.
    pub fn memory(&self) -> &Store {
        &self.memory
    }

    /// Whether a shared store is configured (connected or not).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The store that holds `limit` in this configuration ([`Holder::of`]).
    #[inline]
    pub fn holder(&self, limit: &Limit) -> Holder {
        Holder::of(limit, self.is_shared())
    }

    /// The shared store once connected, borrowed (a decision needs no clone of it).
    pub fn shared(&self) -> Option<&Store> {
        self.shared.as_ref().and_then(Shared::get)
    }

    /// The shared store's slot, for background work that waits for the connection.
    pub fn shared_slot(&self) -> Option<&Shared> {
        self.shared.as_ref()
    }

    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// The store's state as the admin console shows it.
    pub fn health(&self) -> Health {
        Health {
            shared: self.shared.is_some(),
            connected: self.shared().is_some(),
            up: self.up.load(Ordering::Relaxed),
            breaker_open: self.breaker.is_open(),
            on_error: self.on_error,
            cause: self.cause(),
            connecting: self.connecting(),
        }
    }

    /// True while the first connection attempt of the Redis store is being made: neither
    /// connected nor failed yet (see the module docs). Never with the memory store.
    pub fn connecting(&self) -> bool {
        !self.first.ended()
    }

    /// Why the shared store is down: None while it answers (or with no shared store). What
    /// the requests it fails are counted under (`other` when nothing more is known). Not
    /// connected and no failure seen: [`Cause::NotConnected`].
    pub fn cause(&self) -> Option<Cause> {
        let connected = self.shared().is_some();
        let up = connected && self.up.load(Ordering::Relaxed);
        if self.shared.is_none() || up && !self.breaker.is_open() {
            return None;
        }
        match self.cause.get() {
            None if !connected => Some(Cause::NotConnected),
            cause => cause,
        }
    }

    /// The persistence check of the shared store: the configuration using these stores says
    /// what it keeps there (`configure`); the console reads it (`json`).
    pub fn persistence(&self) -> &persistence::Check {
        &self.persistence
    }

    /// True while the store answers (always true for the memory store).
    pub fn ready(&self) -> bool {
        match &self.shared {
            None => true,
            Some(shared) => {
                shared.0.initialized() && self.up.load(Ordering::Relaxed) && !self.breaker.is_open()
            }
        }
    }

    /// One atomic decision of `checks` by the shared store, with `on_error` applied when it
    /// fails (or is known down, not connected, or the breaker is open): how it was decided, or
    /// None when `on_error: deny` refuses. While the first connection is being made, waits
    /// for it first (see the module docs).
    pub async fn decide_shared(&self, checks: &[Check<'_>]) -> Option<(Decision, How)> {
        if !self.up.load(Ordering::Relaxed) {
            // Known down: the probe brings it back; asking Redis now would only wait.
            return self.apply_on_error(checks).await;
        }
        let store = match self.shared() {
            Some(store) => store,
            // Boxed: the rare case (before the first connection), whose future would
            // otherwise size every request's.
            None => match Box::pin(self.first_connection()).await {
                Some(store) => store,
                None => return self.apply_on_error(checks).await,
            },
        };
        let result = match self.breaker.permit() {
            breaker::Permit::Refuse => Err(StoreError::CircuitOpen),
            breaker::Permit::Call => {
                // Boxed: a Redis call's future is large (the client's command and reply
                // state), and in place it would size every request's future, including the
                // ones that never ask Redis (unrouted, local-first), which are moved as they
                // are built. One allocation beside a network round trip is noise.
                // Timed for the request's trace (the Redis span covers this call alone).
                let started = crate::traces::round_trip::started();
                let result = Box::pin(store.decide(checks)).await;
                crate::traces::round_trip::ended(started);
                match &result {
                    Ok(_) => self.breaker.success(),
                    Err(_) => {
                        if self.breaker.failure() {
                            tracing::debug!(cool_down = ?breaker::DEFAULT_COOL_DOWN, "store circuit open: not calling Redis for the cool-down");
                        }
                    }
                }
                result
            }
        };
        match result {
            // Only the probe marks the store up again: it checks every connection first.
            Ok(decision) => Some((decision, How::Answered)),
            Err(error) => {
                if !matches!(error, StoreError::CircuitOpen) {
                    self.cause.set(error.cause());
                }
                if self.up.swap(false, Ordering::Relaxed) {
                    self.report_failure(error);
                    self.probe_now.notify_one();
                }
                self.apply_on_error(checks).await
            }
        }
    }

    /// The connected store, once the first connection attempt (being made now) has ended, or
    /// None when it failed (the attempt marked the store down and named its cause) or the wait
    /// ran out (see [`FirstAttempt::wait`]). The first wait and the first wait that ran out are
    /// logged, with the cause `not_connected`.
    async fn first_connection(&self) -> Option<&Store> {
        if !self.first.ended() && !self.first.waited.swap(true, Ordering::Relaxed) {
            tracing::info!(store_cause = Cause::NotConnected.as_str(), at_most = ?self.first_wait, "a request waits for the rate limit store's first connection (not connected yet)");
        }
        if !self.first.wait(self.first_wait).await {
            if !self.first.ran_out.swap(true, Ordering::Relaxed) {
                let error = StoreError::NotConnected;
                tracing::error!(store_cause = error.cause().as_str(), cause = %crate::error::chain(&error), waited = ?self.first_wait, on_error = %self.on_error, "the rate limit store's first connection is still being made; applying on_error to requests that waited for it as long as it may take");
            }
            return None;
        }
        self.shared()
    }

    /// Logs the failure that marked the store down, with its cause looked into first (in a
    /// task of its own: the request that met it does not wait for that).
    fn report_failure(&self, error: StoreError) {
        let on_error = self.on_error;
        let cause = self.cause.clone();
        let redis = match self.shared() {
            Some(Store::Redis(redis)) => Some(redis.clone()),
            _ => None,
        };
        tokio::spawn(async move {
            let error = match redis {
                Some(redis) => redis.diagnose(error).await,
                None => error,
            };
            if !matches!(error, StoreError::CircuitOpen) {
                cause.set(error.cause());
            }
            tracing::error!(store_cause = error.cause().as_str(), cause = %crate::error::chain(&error), on_error = %on_error, "rate limit store failed; applying on_error until it answers again");
        });
    }

    /// What `on_error` says for a decision the shared store did not make.
    async fn apply_on_error(&self, checks: &[Check<'_>]) -> Option<(Decision, How)> {
        match self.on_error {
            OnError::Allow => Some((
                Decision {
                    allowed: true,
                    verdicts: vec![],
                    leases: vec![],
                    at: 0,
                },
                How::FailedOpen,
            )),
            OnError::Deny => None,
            OnError::Local => Some((
                self.memory
                    .decide(checks)
                    .await
                    .expect("memory store cannot fail"),
                How::LocalFallback,
            )),
        }
    }
}

/// What the background connection and health probe of one Redis store share with its
/// [`Stores`].
struct Probe {
    up: Arc<AtomicBool>,
    breaker: Arc<breaker::Breaker>,
    probe_now: Arc<tokio::sync::Notify>,
    cause: CauseCell,
    persistence: persistence::Check,
    first: Arc<FirstAttempt>,
}

async fn connect_redis(config: RedisConfig, cell: Arc<OnceCell<Store>>, probe: Probe) {
    probe.first.begin();
    let mut backoff = CONNECT_BACKOFF.0;
    let mut logged = None;
    let redis = loop {
        match RedisStore::open(&config).await {
            Ok(redis) => {
                let store = Store::Redis(redis.clone());
                tracing::info!(store = %store.describe(), "rate limit store connected");
                probe.cause.clear();
                probe.up.store(true, Ordering::Relaxed);
                let _ = cell.set(store);
                probe.first.end();
                probe.persistence.check(&redis).await;
                break redis;
            }
            Err(e) => {
                // Logged once per cause: a cause that changes (Redis started, but with a
                // password) is news.
                let cause = e.cause();
                probe.cause.set(cause);
                if logged != Some(cause) {
                    tracing::error!(store_cause = cause.as_str(), cause = %crate::error::chain(&e), "cannot connect to the rate limit store yet; applying on_error and retrying");
                    logged = Some(cause);
                }
                probe.up.store(false, Ordering::Relaxed);
                // The first attempt failed: `on_error` applies from now on, and readiness
                // says so (the requests waiting for the attempt are decided by it).
                probe.first.end();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(CONNECT_BACKOFF.1);
            }
        }
    };
    // Check the store in the background whether or not traffic flows: while it is down, for
    // its return (an unready pod gets no traffic to find out), and while it is up, for its
    // loss and for connections broken while idle (a quiet pod would otherwise report ready
    // while its first requests fail). One PING per connection per tick, bounded by the store
    // timeout, and at once when a request marks the store down. Each transition is logged
    // once, by whoever sees it first; while down, a change of cause is logged too.
    let alive = Arc::downgrade(&cell);
    drop(cell);
    let mut tick = tokio::time::interval(HEALTH_PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = probe.probe_now.notified() => {}
        }
        if alive.strong_count() == 0 {
            return; // Every holder of this store is gone (a reload replaced it).
        }
        match redis.check_connections().await {
            Ok(replaced) => {
                let down = !probe.up.load(Ordering::Relaxed) || probe.breaker.is_open();
                if down {
                    // Close the breaker too: readiness waits on both, and nothing else would
                    // close it without a request.
                    probe.breaker.success();
                    probe.cause.clear();
                    if !probe.up.swap(true, Ordering::Relaxed) {
                        tracing::info!("rate limit store is back");
                        // It may be a new server (restarted, failed over): look again.
                        probe.persistence.check(&redis).await;
                    }
                } else if replaced {
                    // A restart quicker than a check, seen only as a broken connection: the
                    // server may have come back with other settings.
                    probe.persistence.check(&redis).await;
                }
            }
            Err(error) => probe_failed(&redis, &probe, error).await,
        }
    }
}

/// The health probe found the store failing: its cause, looked into, is kept and logged when
/// the store was up until now or the cause changed.
async fn probe_failed(redis: &RedisStore, probe: &Probe, error: StoreError) {
    let error = redis.diagnose(error).await;
    let cause = error.cause();
    let before = probe.cause.get();
    probe.cause.set(cause);
    if probe.up.swap(false, Ordering::Relaxed) {
        tracing::error!(store_cause = cause.as_str(), cause = %crate::error::chain(&error), "rate limit store stopped answering its health check; applying on_error until it answers again");
    } else if before.is_some_and(|b| b != cause) {
        tracing::warn!(store_cause = cause.as_str(), cause = %crate::error::chain(&error), "rate limit store still down, now for another cause");
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Throttle;
    use crate::limit::algorithm::{Algorithm, Params};

    fn throttle(store: &str) -> Throttle {
        let text = format!("listen: 127.0.0.1:0\nupstream: {{ url: \"http://a:1\" }}\n{store}");
        crate::config::parse(Path::new("t.yaml"), &text, |_| None)
            .unwrap()
            .throttle
    }

    /// A Redis store on a local port nothing listens on: never connected.
    fn unreachable(on_error: &str) -> Throttle {
        throttle(&format!(
            "store:\n  redis: {{ url: \"redis://127.0.0.1:1\", timeout: 50ms }}\n  on_error: {on_error}\n"
        ))
    }

    fn stores(config: &Throttle, previous: Option<&Stores>) -> Stores {
        Stores::new(&config.store, config.on_error, previous)
    }

    fn one_per_minute(key: &str) -> Check<'_> {
        Check {
            key,
            params: Params {
                algorithm: Algorithm::FixedWindow,
                limit: 1,
                period_us: 60_000_000,
                burst: 1,
                cost: 1,
                calendar: None,
            },
            shadow: false,
            block_us: 0,
        }
    }

    #[tokio::test]
    async fn the_memory_store_alone_is_always_ready_and_not_shared() {
        let stores = stores(&throttle(""), None);
        assert!(stores.ready());
        assert!(!stores.is_shared());
        assert!(stores.shared().is_none() && stores.shared_slot().is_none());
        assert!(matches!(stores.memory(), Store::Memory(_)));
    }

    /// A decision Redis could not make (not connected) is what `on_error` says: let through
    /// undecided, refused, or decided by the memory store; and the store is not ready.
    #[tokio::test]
    async fn on_error_decides_what_the_shared_store_could_not() {
        let check = [one_per_minute("k")];

        let allow = stores(&unreachable("allow"), None);
        assert!(allow.is_shared() && allow.shared().is_none());
        assert!(!allow.ready());
        let (decision, how) = allow.decide_shared(&check).await.unwrap();
        assert_eq!(how, How::FailedOpen);
        assert!(decision.allowed && decision.verdicts.is_empty());

        let deny = stores(&unreachable("deny"), None);
        assert!(deny.decide_shared(&check).await.is_none());

        let local = stores(&unreachable("local"), None);
        let (first, how) = local.decide_shared(&check).await.unwrap();
        assert_eq!(how, How::LocalFallback);
        assert!(first.allowed);
        assert_eq!(first.verdicts[0].remaining, 0);
        let (second, how) = local.decide_shared(&check).await.unwrap();
        assert_eq!(how, How::LocalFallback);
        assert!(!second.allowed, "the fallback counts in memory");
    }

    /// A first connection that hangs (a port that accepts and never answers): the store is
    /// `connecting`, a decision waits for it at most twice the store timeout and then gets
    /// `on_error` under the cause `NotConnected`; a store that refuses ends its first attempt
    /// at once, and its decisions do not wait.
    #[tokio::test]
    async fn a_decision_waits_for_the_first_connection_as_long_as_it_may_take() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let config = throttle(&format!(
            "store:\n  redis: {{ url: \"redis://127.0.0.1:{port}\", timeout: 200ms }}\n  on_error: allow\n"
        ));
        let hanging = stores(&config, None);
        assert!(hanging.connecting() && !hanging.ready());
        assert_eq!(hanging.cause(), Some(Cause::NotConnected));
        let started = std::time::Instant::now();
        let (_, how) = hanging.decide_shared(&[one_per_minute("k")]).await.unwrap();
        assert_eq!(how, How::FailedOpen);
        assert!(started.elapsed() >= Duration::from_millis(400));
        // The attempt timed out (connecting, then finding out why) while the request waited:
        // a store down for a timeout; or the wait ran out first: not connected yet.
        let cause = hanging.cause();
        assert!(
            matches!(cause, Some(Cause::Timeout | Cause::NotConnected)),
            "{cause:?}"
        );

        let refused = stores(&unreachable("allow"), None);
        tokio::time::timeout(Duration::from_secs(10), async {
            while refused.connecting() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a refused first attempt ends");
        assert_eq!(refused.cause(), Some(Cause::Refused));
        drop(silent);
    }

    /// A reload keeps the stores (and their counts) when the store settings are the same,
    /// whatever else changed, `on_error` included, which applies from then on.
    #[tokio::test]
    async fn a_reload_carries_the_stores_over_only_when_their_settings_are_unchanged() {
        let check = [one_per_minute("k")];
        let first = stores(&unreachable("local"), None);
        assert!(first.decide_shared(&check).await.unwrap().0.allowed);

        let same = stores(&unreachable("local"), Some(&first));
        assert!(same.carried_from(&first));
        let (decision, _) = same.decide_shared(&check).await.unwrap();
        assert!(!decision.allowed, "the count carried over");

        let stricter = stores(&unreachable("deny"), Some(&same));
        assert!(stricter.carried_from(&same));
        assert_eq!(stricter.on_error(), OnError::Deny);
        assert!(stricter.decide_shared(&check).await.is_none());

        let memory = stores(&throttle(""), Some(&stricter));
        assert!(!memory.carried_from(&stricter));
        assert!(!memory.is_shared());
        let elsewhere = stores(
            &throttle("store:\n  redis: { url: \"redis://127.0.0.1:2\", timeout: 50ms }\n  on_error: local\n"),
            Some(&first),
        );
        assert!(!elsewhere.carried_from(&first));
        let (decision, _) = elsewhere.decide_shared(&check).await.unwrap();
        assert!(decision.allowed, "a new store counts afresh");
    }
}
