//! The limit stage of the request path: for a request that matched a route, work out each
//! limit's store key from the caller's identity, ask the store(s) in one atomic step, and
//! return the outcome ([`LimitOutcome`]): admitted (with the verdicts for response headers and
//! any concurrency leases to hold) or limited (with what the limited response is rendered
//! from). Responses are built by the proxy, from the outcome; this stage builds none.
//!
//! Store faults are decided by `on_error`, at once while the circuit breaker ([`breaker`]) is
//! open; `on_limit: delay` waits here, in per-key order, for a request that would fit within
//! `max_delay`. A denial the shared store gave is remembered ([`deny_cache`]) until its retry
//! time, so a caller hammering a limit it is over costs neither a Redis round trip nor an
//! upstream request.

mod breaker;
pub mod caller;
pub mod deny_cache;
pub mod headers;
pub mod keys;
mod lease;
pub mod offenders;
mod queue;
pub mod settle;
#[cfg(test)]
mod stage_tests;
pub mod sync;
pub(crate) mod tiers;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::config::{LimitSet, OnError, OnLimit, RedisConfig, Route, Scope, StoreConfig, Throttle};
use crate::identity::caller::Caller;
use crate::limit::algorithm::Verdict;
use crate::limit::memory::MemoryStore;
use crate::limit::redis_store::RedisStore;
use crate::limit::{Check, Decision, Store, StoreError};
pub use lease::LeaseGuard;

/// How often idle in-memory keys are swept away.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often the store is checked (for its loss while up, for its return while down).
const HEALTH_PROBE_EVERY: Duration = Duration::from_millis(500);
/// Backoff bounds while the first Redis connection cannot be made.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// How a decision was reached, and for an admitted request why it was let through (for logs
/// and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitReason {
    /// The store answered: admitted within every limit, or denied.
    Decided,
    /// A shadow limit would have denied it.
    ShadowLimited,
    /// The store failed and `on_error: allow` let it through.
    StoreError,
    /// The store failed and the in-memory limiter decided (`on_error: local`).
    LocalFallback,
    /// On an allow-list: no limit applied.
    Exempt,
}

/// What the limit stage decided for one request. It renders nothing: the proxy answers a
/// refused request from what is here (see [`headers`]).
pub enum LimitOutcome<'a> {
    /// The request may go on to the upstream.
    Admitted(Admitted<'a>),
    /// Over a limit: refused with the limited response.
    Limited(Limited<'a>),
    /// The store failed and `on_error: deny` refuses the request (503).
    StoreUnavailable { identity: &'static str },
}

/// An admitted request: what the response owes its limits.
pub struct Admitted<'a> {
    /// The limits that applied (the route's own for an exempt caller).
    pub set: &'a LimitSet,
    /// The kind of source that identified the caller ("header", "jwt", ..., "allow_list").
    pub identity: &'static str,
    /// For the response's rate-limit fields; empty when no store answered.
    pub verdicts: Vec<Verdict>,
    pub reason: AdmitReason,
    /// Concurrency slots held until the response body ends.
    pub leases: Option<LeaseGuard>,
    /// Units to settle once the response is known (`count_statuses`, `cost_from_response`):
    /// the proxy hands it the response head.
    pub settlement: Option<settle::Obligation>,
}

/// A refused request: what the limited response is rendered from.
pub struct Limited<'a> {
    pub set: &'a LimitSet,
    /// The kind of source that identified the caller.
    pub identity: &'static str,
    pub denial: Denial,
    /// True when the store had failed and the in-memory fallback (`on_error: local`) limited
    /// the request: still a store error.
    pub by_fallback: bool,
}

/// The verdicts a denial is rendered from.
pub enum Denial {
    /// Given by the store (or the fallback) for this request.
    Decided(Vec<Verdict>),
    /// Given by the shared store a moment ago and answered from the deny cache: the verdicts
    /// as of `at`.
    Remembered {
        denial: Arc<deny_cache::Remembered>,
        at: Instant,
    },
}

impl LimitOutcome<'_> {
    /// The kind of source that identified the caller.
    pub fn identity(&self) -> &'static str {
        match self {
            LimitOutcome::Admitted(Admitted { identity, .. })
            | LimitOutcome::Limited(Limited { identity, .. })
            | LimitOutcome::StoreUnavailable { identity } => identity,
        }
    }
}

/// The limit stage: owns the stores and decides for every request.
pub struct LimitStage {
    config: Throttle,
    memory: Store,
    redis: Option<Arc<OnceCell<Store>>>,
    store_up: Arc<AtomicBool>,
    /// Stops waiting on a failing Redis: `on_error` applies at once until a probe answers.
    /// Shared with the limit stages of later reloads, like the connection it guards.
    breaker: Arc<breaker::Breaker>,
    queues: queue::KeyedQueues,
    /// Requests the store denied a moment ago, answered here until their retry time.
    denials: Arc<deny_cache::DenyCache>,
    /// Who is denied most (the admin's `/limits/top`); carried over reloads.
    offenders: Arc<offenders::Offenders>,
    /// Local-first limits (`sync: <duration>`): their engine and rounds, when any limit has
    /// one and the store is Redis. Carried over reloads that keep the store and the interval,
    /// with the usage not sent yet.
    local_first: Option<Arc<sync::Sync>>,
}

impl LimitStage {
    /// Builds the stores. Redis is connected in the background, so tollgate starts (and
    /// applies `on_error`) even while Redis is not there yet.
    ///
    /// On a reload, `previous` hands over its stores when the store settings did not change:
    /// the same memory state and the same Redis connection, so limits that did not change
    /// keep counting where they were.
    pub fn new(
        config: Throttle,
        previous: Option<&LimitStage>,
        sync_metrics: impl FnOnce() -> sync::SyncMetrics,
    ) -> Self {
        if let Some(previous) = previous.filter(|p| p.config.store == config.store) {
            // Limits may have changed: remembered denials do not carry over.
            let denials = caller::new_deny_cache(&previous.redis, &config.key_prefix);
            let interval = sync::interval(&config);
            let local_first = match (&previous.local_first, &previous.redis, interval) {
                (Some(kept), _, Some(interval))
                    if kept.engine.interval_us() == interval.as_micros() as i64 =>
                {
                    Some(kept.clone())
                }
                (_, Some(cell), Some(interval)) => Some(Arc::new(sync::start(
                    interval,
                    &config.key_prefix,
                    cell.clone(),
                    sync_metrics(),
                ))),
                _ => None,
            };
            return LimitStage {
                config,
                memory: previous.memory.clone(),
                redis: previous.redis.clone(),
                store_up: previous.store_up.clone(),
                breaker: previous.breaker.clone(),
                queues: queue::KeyedQueues::default(),
                denials,
                offenders: previous.offenders.clone(),
                local_first,
            };
        }
        let memory = MemoryStore::new();
        if tokio::runtime::Handle::try_current().is_ok() {
            memory.spawn_sweeper(SWEEP_EVERY);
        }
        let store_up = Arc::new(AtomicBool::new(true));
        let probe_timeout = match &config.store {
            StoreConfig::Redis(redis) => redis.timeout,
            StoreConfig::Memory => Duration::ZERO,
        };
        let breaker = Arc::new(breaker::Breaker::new(
            breaker::DEFAULT_THRESHOLD,
            breaker::DEFAULT_COOL_DOWN,
            probe_timeout,
        ));
        let redis = match &config.store {
            StoreConfig::Memory => {
                tracing::info!("no store configured: limits live in this process's memory and are not shared between instances");
                None
            }
            StoreConfig::Redis(redis) => {
                let cell = Arc::new(OnceCell::new());
                tokio::spawn(connect_redis(
                    redis.clone(),
                    cell.clone(),
                    store_up.clone(),
                    breaker.clone(),
                ));
                Some(cell)
            }
        };
        let denials = caller::new_deny_cache(&redis, &config.key_prefix);
        let local_first = match (&redis, sync::interval(&config)) {
            (Some(cell), Some(interval)) => Some(Arc::new(sync::start(
                interval,
                &config.key_prefix,
                cell.clone(),
                sync_metrics(),
            ))),
            _ => None,
        };
        LimitStage {
            config,
            memory: Store::Memory(memory),
            redis,
            store_up,
            breaker,
            queues: queue::KeyedQueues::default(),
            denials,
            offenders: Arc::new(offenders::Offenders::default()),
            local_first,
        }
    }

    /// True while the store answers (always true for the memory store).
    pub fn store_ready(&self) -> bool {
        match &self.redis {
            None => true,
            Some(cell) => {
                cell.initialized()
                    && self.store_up.load(Ordering::Relaxed)
                    && !self.breaker.is_open()
            }
        }
    }

    pub fn on_error(&self) -> OnError {
        self.config.on_error
    }

    /// The limit stage: decides for `caller` on `route`. An allow-listed caller is admitted
    /// without a decision; a caller the deny cache knows to be over a limit is refused without
    /// asking the store.
    ///
    /// The caller is consumed before the returned future is built: its memo of identities is
    /// not needed past the keys, and the future (part of every routed request's) does not
    /// carry it.
    pub fn limit<'a>(
        &'a self,
        route: &'a Route,
        mut caller: Caller<'_>,
    ) -> impl std::future::Future<Output = LimitOutcome<'a>> + 'a {
        let applied = tiers::applied(&self.config, route, &mut caller);
        self.limit_applied(route, applied)
    }

    /// [`LimitStage::limit`] once the limits that apply are known and keyed.
    async fn limit_applied<'a>(
        &self,
        route: &'a Route,
        applied: tiers::Applied<'a>,
    ) -> LimitOutcome<'a> {
        let (set, keys, identity) = match applied {
            tiers::Applied::Exempt => {
                return LimitOutcome::Admitted(Admitted {
                    set: &route.limits,
                    identity: "allow_list",
                    verdicts: Vec::new(),
                    reason: AdmitReason::Exempt,
                    leases: None,
                    settlement: None,
                })
            }
            tiers::Applied::Keyed {
                set,
                keys,
                identity,
                ..
            } => (set, keys, identity),
        };

        // A caller known to be over a limit the shared store decides is answered from memory
        // until the retry time the store gave (see deny_cache for why that never admits more).
        let cache_denials = self.redis.is_some()
            && set
                .iter()
                .all(|l| l.scope == Scope::Global && l.sync.is_none())
            && deny_cache::cacheable(set);
        if cache_denials && !self.denials.is_empty() {
            let at = Instant::now();
            if let Some(denial) = self.denials.recall(&deny_cache::key(set, &keys), at) {
                self.record_denial(set, &keys);
                return LimitOutcome::Limited(Limited {
                    set,
                    identity,
                    denial: Denial::Remembered { denial, at },
                    by_fallback: false,
                });
            }
        }
        fn as_check<'k>((limit, key): (&crate::config::Limit, &'k String)) -> Check<'k> {
            Check {
                key,
                params: limit.params,
                shadow: limit.shadow,
                block_us: limit.block_us(),
            }
        }
        // One limit (the usual route) needs no vector of checks.
        let (one, many): ([Check<'_>; 1], Vec<Check<'_>>);
        let checks: &[Check<'_>] = if let ([limit], [key]) = (&set[..], &keys[..]) {
            one = [as_check((limit, key))];
            &one
        } else {
            many = set.iter().zip(&keys).map(as_check).collect();
            &many
        };

        // Delay mode keeps arrival order per key: every request of such a route takes its turn
        // in a per-key queue before deciding, bounded by the route's smallest max_delay.
        let deadline = set
            .iter()
            .filter_map(|l| match l.on_limit {
                OnLimit::Delay { max_delay } => Some(max_delay),
                OnLimit::Reject => None,
            })
            .min()
            .map(|max_delay| Instant::now() + max_delay);
        let turn = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.queues.lock(keys.join("\n")))
                .await
                .ok(),
            None => None,
        };
        loop {
            let asked_at = Instant::now();
            let Some((decision, reason)) = self.decide(set, checks).await else {
                return LimitOutcome::StoreUnavailable { identity };
            };
            if decision.allowed {
                drop(turn);
                // Only a limit that sees the response owes anything: the store (a clone) is
                // looked up for those alone.
                let settlement = if set.iter().any(|l| l.by_response.is_some()) {
                    let store = self.deciding_store(set, reason);
                    settle::Obligation::new(set, &keys, &decision, store)
                } else {
                    None
                };
                return LimitOutcome::Admitted(
                    self.admitted(set, identity, decision, reason, settlement),
                );
            }
            let wait = match (deadline, &turn, delay_for(set, &decision.verdicts)) {
                (Some(deadline), Some(_), Some(wait)) if Instant::now() + wait <= deadline => wait,
                _ => {
                    if cache_denials && reason == AdmitReason::Decided {
                        self.denials.remember(
                            set,
                            deny_cache::key(set, &keys),
                            asked_at,
                            &decision.verdicts,
                        );
                    }
                    self.record_denial(set, &keys);
                    return LimitOutcome::Limited(Limited {
                        set,
                        identity,
                        denial: Denial::Decided(decision.verdicts),
                        by_fallback: reason == AdmitReason::LocalFallback,
                    });
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    fn admitted<'a>(
        &self,
        set: &'a LimitSet,
        identity: &'static str,
        decision: Decision,
        reason: AdmitReason,
        settlement: Option<settle::Obligation>,
    ) -> Admitted<'a> {
        let reason =
            if reason == AdmitReason::Decided && decision.verdicts.iter().any(|v| !v.allowed) {
                tracing::info!(route = %set.key_name, "shadow limit exceeded (request forwarded)");
                AdmitReason::ShadowLimited
            } else {
                reason
            };
        let leases = (!decision.leases.is_empty()).then(|| {
            // Leases live where they were taken: memory for local limits and the on_error:
            // local fallback, Redis for global limits that Redis decided.
            let mut stores = Vec::new();
            if reason == AdmitReason::LocalFallback || set.iter().any(|l| l.scope == Scope::Local) {
                stores.push(self.memory.clone());
            }
            if reason != AdmitReason::LocalFallback && set.iter().any(|l| l.scope == Scope::Global)
            {
                stores.extend(self.global_store());
            }
            LeaseGuard::new(stores, decision.leases)
        });
        Admitted {
            set,
            identity,
            verdicts: decision.verdicts,
            reason,
            leases,
            settlement,
        }
    }

    /// The store that decided a set's limits (where settlements go); none when no store did
    /// (`on_error: allow` let the request through).
    fn deciding_store(&self, set: &LimitSet, reason: AdmitReason) -> Option<Store> {
        match reason {
            AdmitReason::StoreError | AdmitReason::Exempt => None,
            AdmitReason::LocalFallback => Some(self.memory.clone()),
            _ if self.redis.is_none() || set.iter().all(|l| l.scope == Scope::Local) => {
                Some(self.memory.clone())
            }
            _ => self.global_store(),
        }
    }

    fn global_store(&self) -> Option<Store> {
        self.global_store_ref().cloned()
    }

    /// The Redis store once connected, borrowed (a decision needs no clone of it).
    fn global_store_ref(&self) -> Option<&Store> {
        self.redis.as_ref().and_then(|cell| cell.get())
    }

    /// One atomic decision over all limits of the set, with `on_error` applied: how it was
    /// decided (`Decided` when the store answered, whether it admitted or not), or None when
    /// the store failed and `on_error: deny` refuses.
    async fn decide(
        &self,
        set: &LimitSet,
        checks: &[Check<'_>],
    ) -> Option<(Decision, AdmitReason)> {
        let all_local = set.iter().all(|l| l.scope == Scope::Local);
        if all_local || self.redis.is_none() {
            return Some((
                self.memory
                    .decide(checks)
                    .await
                    .expect("memory store cannot fail"),
                AdmitReason::Decided,
            ));
        }
        // Local-first limits (every limit of the set has the same `sync`, see config) are
        // decided on the local copies: never waiting on Redis.
        if let Some(local_first) = &self.local_first {
            if set.iter().all(|l| l.sync.is_some()) {
                let decision = local_first.engine.decide(&set.key_name, checks);
                return Some((decision, AdmitReason::Decided));
            }
        }
        let all_global = set.iter().all(|l| l.scope == Scope::Global);
        if all_global {
            return self.decide_global(checks).await;
        }
        // Mixed scopes: local limits first (a local denial never touches Redis), then the global
        // ones. A global denial after a local admission leaves the local units spent; the docs
        // say so.
        let (local_idx, global_idx): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| set[i].scope == Scope::Local);
        let pick = |idx: &[usize]| idx.iter().map(|&i| checks[i]).collect::<Vec<_>>();
        let local = self
            .memory
            .decide(&pick(&local_idx))
            .await
            .expect("memory store cannot fail");
        let mut verdicts = vec![None; checks.len()];
        for (&i, v) in local_idx.iter().zip(&local.verdicts) {
            verdicts[i] = Some(*v);
        }
        if !local.allowed {
            // Report the global limits as not evaluated: allowed with their full quota unknown;
            // only the violated local ones matter for the 429.
            for &i in &global_idx {
                verdicts[i] = Some(Verdict {
                    allowed: true,
                    limit: checks[i].params.limit,
                    remaining: checks[i].params.limit,
                    reset_after_us: 0,
                    retry_after_us: 0,
                });
            }
            return Some((
                Decision {
                    allowed: false,
                    verdicts: verdicts.into_iter().map(Option::unwrap).collect(),
                    leases: vec![],
                    at: local.at,
                },
                AdmitReason::Decided,
            ));
        }
        let Some((global, reason)) = self.decide_global(&pick(&global_idx)).await else {
            // Refused (on_error: deny): hand back the local slots taken a moment ago.
            let _ = self.memory.release(&local.leases).await;
            return None;
        };
        if !global.allowed {
            let _ = self.memory.release(&local.leases).await;
        }
        for (&i, v) in global_idx.iter().zip(&global.verdicts) {
            verdicts[i] = Some(*v);
        }
        let mut leases = local.leases;
        leases.extend(global.leases);
        Some((
            Decision {
                allowed: global.allowed,
                verdicts: verdicts.into_iter().map(Option::unwrap).collect(),
                leases,
                at: global.at,
            },
            reason,
        ))
    }

    async fn decide_global(&self, checks: &[Check<'_>]) -> Option<(Decision, AdmitReason)> {
        let result = match (self.global_store_ref(), self.breaker.permit()) {
            (None, _) => Err(StoreError::Protocol("not connected yet".into())),
            (Some(_), breaker::Permit::Refuse) => Err(StoreError::CircuitOpen),
            (Some(store), breaker::Permit::Call) => {
                // Boxed: a Redis call's future is large (the client's command and reply
                // state), and in place it would size every request's future, including the
                // ones that never ask Redis (unrouted, local-first), which are moved as they
                // are built. One allocation beside a network round trip is noise.
                let result = Box::pin(store.decide(checks)).await;
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
            Ok(decision) => {
                // Read first: while the store is up (every call) nothing is written.
                if !self.store_up.load(Ordering::Relaxed)
                    && !self.store_up.swap(true, Ordering::Relaxed)
                {
                    tracing::info!("rate limit store is back");
                }
                Some((decision, AdmitReason::Decided))
            }
            Err(error) => {
                if self.store_up.swap(false, Ordering::Relaxed) {
                    tracing::error!(cause = %error, on_error = ?self.config.on_error, "rate limit store failed; applying on_error until it answers again");
                }
                match self.config.on_error {
                    OnError::Allow => Some((
                        Decision {
                            allowed: true,
                            verdicts: vec![],
                            leases: vec![],
                            at: 0,
                        },
                        AdmitReason::StoreError,
                    )),
                    OnError::Deny => None,
                    OnError::Local => Some((
                        self.memory
                            .decide(checks)
                            .await
                            .expect("memory store cannot fail"),
                        AdmitReason::LocalFallback,
                    )),
                }
            }
        }
    }
}

/// How long to wait before deciding again, if every violated limit is in delay mode.
fn delay_for(set: &LimitSet, verdicts: &[Verdict]) -> Option<Duration> {
    let mut retry = 0i64;
    for (limit, verdict) in set.iter().zip(verdicts) {
        if verdict.allowed || limit.shadow {
            continue;
        }
        if !matches!(limit.on_limit, OnLimit::Delay { .. }) || verdict.retry_after_us < 0 {
            return None;
        }
        retry = retry.max(verdict.retry_after_us);
    }
    Some(Duration::from_micros(retry as u64))
}

async fn connect_redis(
    config: RedisConfig,
    cell: Arc<OnceCell<Store>>,
    up: Arc<AtomicBool>,
    breaker: Arc<breaker::Breaker>,
) {
    let mut backoff = CONNECT_BACKOFF.0;
    let mut logged = false;
    let redis = loop {
        match RedisStore::open(&config).await {
            Ok(redis) => {
                let store = Store::Redis(redis.clone());
                tracing::info!(store = %store.describe(), "rate limit store connected");
                up.store(true, Ordering::Relaxed);
                let _ = cell.set(store);
                break redis;
            }
            Err(e) => {
                if !logged {
                    tracing::error!(cause = %e, "cannot connect to the rate limit store yet; applying on_error and retrying");
                    logged = true;
                }
                up.store(false, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(CONNECT_BACKOFF.1);
            }
        }
    };
    // Check the store in the background whether or not traffic flows: while it is down, for
    // its return (an unready pod gets no traffic to find out), and while it is up, for its
    // loss (a quiet pod would otherwise report ready while it would refuse every request with
    // `on_error: deny`). One PING per tick, bounded by the store timeout; requests still mark
    // it down the moment one fails. Each transition is logged once, by whoever sees it first.
    let alive = Arc::downgrade(&cell);
    drop(cell);
    let mut tick = tokio::time::interval(HEALTH_PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if alive.strong_count() == 0 {
            return; // Every limit stage using this store is gone (a reload replaced it).
        }
        match redis.ping().await {
            Ok(()) => {
                let down = !up.load(Ordering::Relaxed) || breaker.is_open();
                if down {
                    // Close the breaker too: readiness waits on both, and nothing else would
                    // close it without a request.
                    breaker.success();
                    if !up.swap(true, Ordering::Relaxed) {
                        tracing::info!("rate limit store is back");
                    }
                }
            }
            Err(error) => {
                if up.swap(false, Ordering::Relaxed) {
                    tracing::error!(cause = %error, "rate limit store stopped answering its health check; applying on_error until it answers again");
                }
            }
        }
    }
}
