//! The limit stage of the request path: for a request that matched a route, work out each
//! limit's store key from the caller's identity, ask the store(s) in one atomic step, and
//! return either an admission (with the verdicts for response headers and any concurrency
//! leases to hold) or the limited response.
//!
//! Store faults are decided by `on_error`, at once while the circuit breaker ([`breaker`]) is
//! open; `on_limit: delay` waits here, in per-key order, for a request that would fit within
//! `max_delay`. A denial the shared store gave is remembered ([`deny_cache`]) until its retry
//! time, so a caller hammering a limit it is over costs neither a Redis round trip nor an
//! upstream request.

mod breaker;
pub mod deny_cache;
pub mod headers;
pub mod keys;
mod lease;
mod queue;
pub(crate) mod tiers;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::Response;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::config::{OnError, OnLimit, RedisConfig, Route, Scope, StoreConfig, Throttle};
use crate::limit::algorithm::Verdict;
use crate::limit::memory::MemoryStore;
use crate::limit::redis_store::RedisStore;
use crate::limit::{Check, Decision, Store, StoreError};
use crate::proxy::body::ProxyBody;
pub use lease::LeaseGuard;

/// How often idle in-memory keys are swept away.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often a store marked down is probed for its return.
const HEALTH_PROBE_EVERY: Duration = Duration::from_millis(500);
/// Backoff bounds while the first Redis connection cannot be made.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// How a request that passed was decided, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    Allowed,
    /// A shadow limit would have denied it.
    ShadowLimited,
    /// The store failed and `on_error: allow` let it through.
    StoreError,
    /// The store failed and the in-memory limiter decided (`on_error: local`).
    LocalFallback,
    /// On an allow-list: no limit applied.
    Exempt,
}

/// A request that may go on to the upstream.
pub struct Admission {
    pub route: Arc<Route>,
    /// The kind of source that identified the caller ("header", "jwt", ...).
    pub identity: &'static str,
    pub verdicts: Vec<Verdict>,
    pub decided: Decided,
    /// Concurrency slots held until the response body ends.
    pub leases: Option<LeaseGuard>,
}

pub enum Checked {
    Admit(Admission),
    /// Limited (429) or refused because the store is down (`on_error: deny`, 503).
    Reject {
        response: Response<ProxyBody>,
        /// True when the store's failure (not a limit) refused the request.
        store_unavailable: bool,
        /// True when the store had failed and the in-memory fallback limited the request.
        store_error: bool,
        /// The kind of source that identified the caller.
        identity: &'static str,
    },
}

/// Owns the stores and decides for every request.
pub struct Throttler {
    config: Throttle,
    memory: Store,
    redis: Option<Arc<OnceCell<Store>>>,
    store_up: Arc<AtomicBool>,
    /// Stops waiting on a failing Redis: `on_error` applies at once until a probe answers.
    /// Shared with the throttlers of later reloads, like the connection it guards.
    breaker: Arc<breaker::Breaker>,
    queues: queue::KeyedQueues,
    /// Requests the store denied a moment ago, answered here until their retry time.
    denials: deny_cache::DenyCache,
}

impl Throttler {
    /// Builds the stores. Redis is connected in the background, so tollgate starts (and
    /// applies `on_error`) even while Redis is not there yet.
    ///
    /// On a reload, `previous` hands over its stores when the store settings did not change:
    /// the same memory state and the same Redis connection, so limits that did not change
    /// keep counting where they were.
    pub fn new(config: Throttle, previous: Option<&Throttler>) -> Self {
        if let Some(previous) = previous.filter(|p| p.config.store == config.store) {
            return Throttler {
                config,
                memory: previous.memory.clone(),
                redis: previous.redis.clone(),
                store_up: previous.store_up.clone(),
                breaker: previous.breaker.clone(),
                queues: queue::KeyedQueues::default(),
                // Limits may have changed: remembered denials do not carry over.
                denials: deny_cache::DenyCache::new(deny_cache::DEFAULT_CAPACITY),
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
        Throttler {
            config,
            memory: Store::Memory(memory),
            redis,
            store_up,
            breaker,
            queues: queue::KeyedQueues::default(),
            denials: deny_cache::DenyCache::new(deny_cache::DEFAULT_CAPACITY),
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

    /// Decides `request` against `route`.
    pub async fn check(&self, route: &Arc<Route>, request: &Parts, client_ip: IpAddr) -> Checked {
        let route = match tiers::select(&self.config.allow, route, request, client_ip) {
            tiers::Selected::Exempt => {
                return Checked::Admit(Admission {
                    route: route.clone(),
                    identity: "allow_list",
                    verdicts: Vec::new(),
                    decided: Decided::Exempt,
                    leases: None,
                })
            }
            tiers::Selected::Limits(route) => route,
        };
        let (keys, identity) = keys::build(&self.config.key_prefix, route, request, client_ip);

        // A caller known to be over a limit the shared store decides is answered from memory
        // until the retry time the store gave (see deny_cache for why that never admits more).
        let cache_denials = self.redis.is_some()
            && route.limits.iter().all(|l| l.scope == Scope::Global)
            && deny_cache::cacheable(route);
        if cache_denials && !self.denials.is_empty() {
            let key = deny_cache::key(route, &keys);
            let hit = self.denials.respond(&key, Instant::now(), |verdicts| {
                headers::render_limited(
                    &self.config.response,
                    &route.name,
                    &route.limits,
                    &route.policy,
                    verdicts,
                )
            });
            if let Some(rendered) = hit {
                return Checked::Reject {
                    response: rendered.into_response(),
                    store_unavailable: false,
                    store_error: false,
                    identity,
                };
            }
        }
        let checks: Vec<Check<'_>> = route
            .limits
            .iter()
            .zip(&keys)
            .map(|(limit, key)| Check {
                key,
                params: limit.params,
                shadow: limit.shadow,
            })
            .collect();

        // Delay mode keeps arrival order per key: every request of such a route takes its turn
        // in a per-key queue before deciding, bounded by the route's smallest max_delay.
        let deadline = route
            .limits
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
            let (decision, decided) = match self.decide(route, &checks).await {
                Ok(pair) => pair,
                Err(response) => {
                    return Checked::Reject {
                        response,
                        store_unavailable: true,
                        store_error: true,
                        identity,
                    }
                }
            };
            if decision.allowed {
                drop(turn);
                return Checked::Admit(self.admission(route, identity, decision, decided));
            }
            let wait = match (deadline, &turn, delay_for(route, &decision.verdicts)) {
                (Some(deadline), Some(_), Some(wait)) if Instant::now() + wait <= deadline => wait,
                _ => {
                    if cache_denials && decided == Decided::Allowed {
                        self.denials.remember(
                            route,
                            deny_cache::key(route, &keys),
                            asked_at,
                            &decision.verdicts,
                        );
                    }
                    return Checked::Reject {
                        response: headers::limited_response(
                            &self.config.response,
                            &route.name,
                            &route.limits,
                            &route.policy,
                            &decision.verdicts,
                        ),
                        store_unavailable: false,
                        store_error: decided == Decided::LocalFallback,
                        identity,
                    };
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    fn admission(
        &self,
        route: &Arc<Route>,
        identity: &'static str,
        decision: Decision,
        decided: Decided,
    ) -> Admission {
        let decided = if decided == Decided::Allowed && decision.verdicts.iter().any(|v| !v.allowed)
        {
            tracing::info!(route = %route.name, "shadow limit exceeded (request forwarded)");
            Decided::ShadowLimited
        } else {
            decided
        };
        let leases = (!decision.leases.is_empty()).then(|| {
            // Leases live where they were taken: memory for local limits and the on_error:
            // local fallback, Redis for global limits that Redis decided.
            let mut stores = Vec::new();
            if decided == Decided::LocalFallback
                || route.limits.iter().any(|l| l.scope == Scope::Local)
            {
                stores.push(self.memory.clone());
            }
            if decided != Decided::LocalFallback
                && route.limits.iter().any(|l| l.scope == Scope::Global)
            {
                stores.extend(self.global_store());
            }
            LeaseGuard::new(stores, decision.leases)
        });
        Admission {
            route: route.clone(),
            identity,
            verdicts: decision.verdicts,
            decided,
            leases,
        }
    }

    fn global_store(&self) -> Option<Store> {
        self.redis.as_ref().and_then(|cell| cell.get().cloned())
    }

    /// One atomic decision over all limits of the route, with `on_error` applied.
    async fn decide(
        &self,
        route: &Route,
        checks: &[Check<'_>],
    ) -> Result<(Decision, Decided), Response<ProxyBody>> {
        let all_local = route.limits.iter().all(|l| l.scope == Scope::Local);
        if all_local || self.redis.is_none() {
            return Ok((
                self.memory
                    .decide(checks)
                    .await
                    .expect("memory store cannot fail"),
                Decided::Allowed,
            ));
        }
        let all_global = route.limits.iter().all(|l| l.scope == Scope::Global);
        if all_global {
            return self.decide_global(checks).await;
        }
        // Mixed scopes: local limits first (a local denial never touches Redis), then the global
        // ones. A global denial after a local admission leaves the local units spent; the docs
        // say so.
        let (local_idx, global_idx): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| route.limits[i].scope == Scope::Local);
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
            return Ok((
                Decision {
                    allowed: false,
                    verdicts: verdicts.into_iter().map(Option::unwrap).collect(),
                    leases: vec![],
                },
                Decided::Allowed,
            ));
        }
        let (global, decided) = match self.decide_global(&pick(&global_idx)).await {
            Ok(pair) => pair,
            Err(response) => {
                // Refused (on_error: deny): hand back the local slots taken a moment ago.
                let _ = self.memory.release(&local.leases).await;
                return Err(response);
            }
        };
        if !global.allowed {
            let _ = self.memory.release(&local.leases).await;
        }
        for (&i, v) in global_idx.iter().zip(&global.verdicts) {
            verdicts[i] = Some(*v);
        }
        let mut leases = local.leases;
        leases.extend(global.leases);
        Ok((
            Decision {
                allowed: global.allowed,
                verdicts: verdicts.into_iter().map(Option::unwrap).collect(),
                leases,
            },
            decided,
        ))
    }

    async fn decide_global(
        &self,
        checks: &[Check<'_>],
    ) -> Result<(Decision, Decided), Response<ProxyBody>> {
        let result = match (self.global_store(), self.breaker.permit()) {
            (None, _) => Err(StoreError::Protocol("not connected yet".into())),
            (Some(_), breaker::Permit::Refuse) => Err(StoreError::CircuitOpen),
            (Some(store), breaker::Permit::Call) => {
                let result = store.decide(checks).await;
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
                if !self.store_up.swap(true, Ordering::Relaxed) {
                    tracing::info!("rate limit store is back");
                }
                Ok((decision, Decided::Allowed))
            }
            Err(error) => {
                if self.store_up.swap(false, Ordering::Relaxed) {
                    tracing::error!(cause = %error, on_error = ?self.config.on_error, "rate limit store failed; applying on_error until it answers again");
                }
                match self.config.on_error {
                    OnError::Allow => Ok((
                        Decision {
                            allowed: true,
                            verdicts: vec![],
                            leases: vec![],
                        },
                        Decided::StoreError,
                    )),
                    OnError::Deny => {
                        Err(crate::error::ProxyError::StoreUnavailable.into_response())
                    }
                    OnError::Local => Ok((
                        self.memory
                            .decide(checks)
                            .await
                            .expect("memory store cannot fail"),
                        Decided::LocalFallback,
                    )),
                }
            }
        }
    }
}

/// How long to wait before deciding again, if every violated limit is in delay mode.
fn delay_for(route: &Route, verdicts: &[Verdict]) -> Option<Duration> {
    let mut retry = 0i64;
    for (limit, verdict) in route.limits.iter().zip(verdicts) {
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
    // Requests mark the store down when it fails them; while it is down, look for its return
    // here, so /readyz recovers even when no traffic arrives (an unready pod gets none).
    let alive = Arc::downgrade(&cell);
    drop(cell);
    let mut tick = tokio::time::interval(HEALTH_PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if alive.strong_count() == 0 {
            return; // Every throttler using this store is gone (a reload replaced it).
        }
        let down = !up.load(Ordering::Relaxed) || breaker.is_open();
        if down && redis.ping().await.is_ok() {
            // Close the breaker too: readiness waits on both, and nothing else would close it
            // without a request.
            breaker.success();
            if !up.swap(true, Ordering::Relaxed) {
                tracing::info!("rate limit store is back");
            }
        }
    }
}
