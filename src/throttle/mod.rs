//! The limit stage of the request path: for a request that matched a route, work out each
//! limit's store key from the caller's identity, ask the store(s) in one atomic step, and
//! return the outcome ([`LimitOutcome`]): admitted (with the verdicts for response headers and
//! any concurrency leases to hold) or limited (with what the limited response is rendered
//! from). Responses are built by the proxy, from the outcome; this stage builds none.
//!
//! The stores are owned by [`crate::store`], which applies `on_error` to a decision the
//! shared store could not make. `on_limit: delay` waits here, in per-key order, for a request
//! that would fit within `max_delay`. A denial the shared store gave is remembered
//! ([`deny_cache`]) until its retry time, so a caller hammering a limit it is over costs
//! neither a Redis round trip nor an upstream request.

pub mod deny_cache;
pub mod headers;
pub mod keys;
mod lease;
pub mod overrides;
mod queue;
pub mod settle;
#[cfg(test)]
mod stage_tests;
pub(crate) mod tiers;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;

use crate::config::{LimitSet, OnLimit, Route, Throttle};
use crate::identity::caller::Caller;
use crate::identity::Refusal;
use crate::limit::algorithm::Verdict;
use crate::limit::local_first::LocalFirst;
use crate::limit::{Check, Decision, Store};
use crate::store::{Holder, How, Stores};
pub use lease::LeaseGuard;

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
// Admitted is the common outcome and by far the largest: boxing it, as clippy advises, would
// allocate on every admitted request to save bytes on the rare refused one.
#[allow(clippy::large_enum_variant)]
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
    pub leases: Option<Box<LeaseGuard>>,
    /// Units to settle once the response is known (`count_statuses`, `cost_from_response`):
    /// the proxy hands it the response head.
    pub settlement: Option<Box<settle::Obligation>>,
    /// The `RateLimit-Policy` of a caller whose limits a temporary override changed (the
    /// override's quotas); None: the set's own. Boxed, as `leases` and `settlement`: the
    /// few requests that have one pay for it; every request's future moves an `Admitted`.
    pub policy: Option<Box<HeaderValue>>,
    /// The store key of the set's first limit, as [`Limited::key`] (empty when no limit was
    /// decided: an exempt caller, a set without limits): who was admitted, for the record of
    /// callers' rates (`crate::suggest`). Moved out of the keys once they are used: no copy.
    pub key: String,
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
    /// The store key of the set's first limit: who was denied, for the top offenders.
    pub key: String,
    /// As [`Admitted::policy`].
    pub policy: Option<Box<HeaderValue>>,
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

/// The limit stage: decides for every request, on the stores it is given.
pub struct LimitStage {
    config: Throttle,
    stores: Stores,
    queues: queue::KeyedQueues,
    /// Requests the store denied a moment ago, answered here until their retry time.
    denials: Arc<deny_cache::DenyCache>,
    /// Local-first limits (`sync: <duration>`): their engine, when any limit has one and the
    /// store is Redis (its rounds run beside the stage, see `crate::control::sync`).
    local_first: Option<LocalFirst>,
    /// Temporary overrides of single callers' limits (filled by `crate::control::overrides`).
    overrides: Arc<overrides::Overrides>,
}

impl LimitStage {
    /// The stage for `config`, deciding on `stores`, remembering denials in `denials` (a new
    /// one for each configuration: limits may have changed), and deciding local-first limits
    /// on `local_first`.
    pub fn new(
        config: Throttle,
        stores: Stores,
        denials: Arc<deny_cache::DenyCache>,
        local_first: Option<LocalFirst>,
    ) -> Self {
        // The budget of keys per route, as this configuration sets it (the stores and the
        // engine may be carried over from the one before).
        if let Store::Memory(memory) = stores.memory() {
            memory.set_keys_per_route(config.max_keys_per_route);
        }
        if let Some(engine) = &local_first {
            engine.set_keys_per_route(config.max_keys_per_route);
        }
        LimitStage {
            config,
            stores,
            queues: queue::KeyedQueues::default(),
            denials,
            local_first,
            overrides: Arc::default(),
        }
    }

    /// The stage applying the temporary overrides in `overrides`.
    pub fn with_overrides(mut self, overrides: Arc<overrides::Overrides>) -> Self {
        self.overrides = overrides;
        self
    }

    pub fn overrides(&self) -> &Arc<overrides::Overrides> {
        &self.overrides
    }

    pub fn config(&self) -> &Throttle {
        &self.config
    }

    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// The local-first engine, when a limit is local-first and the store is Redis.
    pub fn local_first(&self) -> Option<&LocalFirst> {
        self.local_first.as_ref()
    }

    pub fn denials(&self) -> &Arc<deny_cache::DenyCache> {
        &self.denials
    }

    /// Whether `route` decides nothing for any caller: no limits, no tiers, and no allow list
    /// (the route's or the global one) that would admit a caller as exempt. Such a route's
    /// requests are admitted as [`LimitStage::limit`] would admit them (undecided, identity
    /// "none") without identifying the caller.
    pub fn decides_nothing(&self, route: &Route) -> bool {
        route.limits.is_empty()
            && route.tiers.is_empty()
            && route.allow.is_empty()
            && self.config.allow.is_empty()
    }

    /// The limit stage: decides for `caller` on `route`. An allow-listed caller is admitted
    /// without a decision; a caller the deny cache knows to be over a limit is refused without
    /// asking the store. `Err`: an identity refused the caller (a credential refused by an
    /// identity whose `on_invalid` is `reject`, or a request it cannot read one way), found
    /// while the keys were built: nothing is decided or taken.
    ///
    /// The caller is consumed before the returned future is built: its memo of identities is
    /// not needed past the keys, and the future (part of every routed request's) does not
    /// carry it.
    pub fn limit<'a>(
        &'a self,
        route: &'a Route,
        mut caller: Caller<'_>,
    ) -> Result<impl std::future::Future<Output = LimitOutcome<'a>> + 'a, Refusal> {
        let applied = tiers::applied(&self.config, route, &mut caller);
        match caller.rejected() {
            Some(refusal) => Err(refusal),
            None => Ok(self.limit_applied(route, applied)),
        }
    }

    /// [`LimitStage::limit`] once the limits that apply are known and keyed.
    async fn limit_applied<'a>(
        &self,
        route: &'a Route,
        applied: tiers::Applied<'a>,
    ) -> LimitOutcome<'a> {
        let (set, mut keys, identity) = match applied {
            tiers::Applied::Exempt => {
                return admitted_undecided(&route.limits, "allow_list", AdmitReason::Exempt)
            }
            tiers::Applied::Keyed {
                set,
                keys,
                identity,
                ..
            } => (set, keys, identity),
        };
        // A route (or tier) with no limits, only a priority: nothing to decide.
        if set.is_empty() {
            return admitted_undecided(set, identity, AdmitReason::Decided);
        }
        // A caller with a temporary override counts on keys of its own, with adjusted limits.
        let overridden = self.overrides.rekey(&mut keys);

        // A caller known to be over a limit the shared store decides is answered from memory
        // until the retry time the store gave (see deny_cache for why that never admits more).
        // An overridden caller is not: its limits change when the override is set or ends.
        let cache_denials = set.iter().all(|l| self.stores.holder(l) == Holder::Shared)
            && deny_cache::cacheable(set)
            && !overridden;
        if cache_denials && !self.denials.is_empty() {
            if let Some(limited) = self.recalled(set, identity, &mut keys) {
                return LimitOutcome::Limited(limited);
            }
        }
        // One limit (the usual route) needs no vector of checks.
        let (mut one, mut many): ([Check<'_>; 1], Vec<Check<'_>>);
        let checks: &mut [Check<'_>] = if let ([limit], [key]) = (&set[..], &keys[..]) {
            one = [as_check((limit, key))];
            &mut one
        } else {
            many = set.iter().zip(&keys).map(as_check).collect();
            &mut many
        };
        // The fields of an overridden caller's responses show the override's quotas.
        let policy = if overridden {
            self.overrides.apply(checks);
            Some(Box::new(headers::policy_for(set, checks)))
        } else {
            None
        };
        let checks: &[Check<'_>] = checks;

        // Delay mode keeps arrival order per key: every request of such a route takes its turn
        // in a per-key queue before deciding, bounded by the route's smallest max_delay.
        let deadline = delay_deadline(set);
        let turn = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.queues.lock(keys.join("\n")))
                .await
                .ok(),
            None => None,
        };
        loop {
            let asked_at = Instant::now();
            let Some((decision, reason, on_copies)) = self.decide(set, checks).await else {
                return LimitOutcome::StoreUnavailable { identity };
            };
            if decision.allowed {
                drop(turn);
                let mut admitted =
                    self.admitted(set, identity, checks, decision, reason, on_copies);
                admitted.policy = policy;
                admitted.key = first_key(&mut keys);
                return LimitOutcome::Admitted(admitted);
            }
            let wait = match (deadline, &turn, delay_for(set, &decision.verdicts)) {
                (Some(deadline), Some(_), Some(wait)) if Instant::now() + wait <= deadline => wait,
                _ => {
                    if cache_denials && reason == AdmitReason::Decided {
                        self.remember_denial(set, &keys, asked_at, &decision.verdicts);
                    }
                    return LimitOutcome::Limited(Limited {
                        set,
                        identity,
                        denial: Denial::Decided(decision.verdicts),
                        by_fallback: reason == AdmitReason::LocalFallback,
                        key: first_key(&mut keys),
                        policy,
                    });
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// The denial the deny cache remembers for the caller's `keys` on `set`, if any.
    fn recalled<'a>(
        &self,
        set: &'a LimitSet,
        identity: &'static str,
        keys: &mut [String],
    ) -> Option<Limited<'a>> {
        let at = Instant::now();
        let denial = self.denials.recall(&deny_cache::key(set, keys), at)?;
        Some(Limited {
            set,
            identity,
            denial: Denial::Remembered { denial, at },
            by_fallback: false,
            key: first_key(keys),
            policy: None,
        })
    }

    /// Keeps the store's denial of the caller's `keys` on `set` (`verdicts`, asked at
    /// `asked_at`) in the deny cache, which answers them with it until the store's retry time.
    fn remember_denial(
        &self,
        set: &LimitSet,
        keys: &[String],
        asked_at: Instant,
        verdicts: &[Verdict],
    ) {
        self.denials
            .remember(set, deny_cache::key(set, keys), asked_at, verdicts);
    }

    /// An admitted request, with the settlement it owes if a limit of `set` sees the response
    /// (`on_copies`: decided on local-first copies).
    fn admitted<'a>(
        &self,
        set: &'a LimitSet,
        identity: &'static str,
        checks: &[Check<'_>],
        decision: Decision,
        reason: AdmitReason,
        on_copies: bool,
    ) -> Admitted<'a> {
        // Only a limit that sees the response owes anything: the store (a clone) is looked up
        // for those alone.
        let settlement = if set.iter().any(|l| l.by_response.is_some()) {
            let settler = self.settler(set, reason, on_copies);
            settle::Obligation::new(set, checks, &decision, settler).map(Box::new)
        } else {
            None
        };
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
            let holders = || set.iter().map(|l| self.stores.holder(l));
            if reason == AdmitReason::LocalFallback || holders().any(|h| h == Holder::Memory) {
                stores.push(self.stores.memory().clone());
            }
            if reason != AdmitReason::LocalFallback && holders().any(Holder::is_shared) {
                stores.extend(self.global_store());
            }
            Box::new(LeaseGuard::new(stores, decision.leases))
        });
        Admitted {
            set,
            identity,
            verdicts: decision.verdicts,
            reason,
            leases,
            settlement,
            policy: None,
            key: String::new(),
        }
    }

    /// The store that decided a set's limits (where settlements go); none when no store did
    /// (`on_error: allow` let the request through).
    fn deciding_store(&self, set: &LimitSet, reason: AdmitReason) -> Option<Store> {
        match reason {
            AdmitReason::StoreError | AdmitReason::Exempt => None,
            AdmitReason::LocalFallback => Some(self.stores.memory().clone()),
            _ if set.iter().all(|l| self.stores.holder(l) == Holder::Memory) => {
                Some(self.stores.memory().clone())
            }
            _ => self.global_store(),
        }
    }

    /// Where a decision's settlement goes: the local-first copies that decided it (then the
    /// shared store for what they already wrote), or the store that decided.
    fn settler(
        &self,
        set: &LimitSet,
        reason: AdmitReason,
        on_copies: bool,
    ) -> Option<settle::Settler> {
        match (&self.local_first, on_copies) {
            (Some(engine), true) => Some(settle::Settler::LocalFirst {
                engine: engine.clone(),
                shared: self.global_store()?,
            }),
            _ => self.deciding_store(set, reason).map(settle::Settler::Store),
        }
    }

    fn global_store(&self) -> Option<Store> {
        self.stores.shared().cloned()
    }

    /// One atomic decision over all limits of the set, with `on_error` applied: how it was
    /// decided (`Decided` when the store answered, whether it admitted or not) and whether on
    /// local-first copies (where its settlement goes), or None when the store failed and
    /// `on_error: deny` refuses.
    async fn decide(
        &self,
        set: &LimitSet,
        checks: &[Check<'_>],
    ) -> Option<(Decision, AdmitReason, bool)> {
        // Local-first limits (every limit of the set has the same `sync`, see config; never
        // without a shared store) are decided on the local copies: never waiting on Redis,
        // except for a key the engine has no view of (a new key on a route whose copies are
        // all taken), decided exactly.
        if let Some(local_first) = &self.local_first {
            if set
                .iter()
                .all(|l| self.stores.holder(l) == Holder::LocalFirst)
            {
                if let Some(decision) = local_first.decide(&set.key_name, checks) {
                    return Some((decision, AdmitReason::Decided, true));
                }
            }
        }
        self.decide_exactly(set, checks)
            .await
            .map(|(decision, reason)| (decision, reason, false))
    }

    /// [`LimitStage::decide`] on the stores themselves (not on local-first copies).
    async fn decide_exactly(
        &self,
        set: &LimitSet,
        checks: &[Check<'_>],
    ) -> Option<(Decision, AdmitReason)> {
        let in_memory = |i: usize| self.stores.holder(&set[i]) == Holder::Memory;
        if (0..set.len()).all(in_memory) {
            return Some((
                self.stores
                    .memory()
                    .decide(checks)
                    .await
                    .expect("memory store cannot fail"),
                AdmitReason::Decided,
            ));
        }
        if !(0..set.len()).any(in_memory) {
            return self
                .stores
                .decide_shared(checks)
                .await
                .map(with_admit_reason);
        }
        // Mixed scopes: local limits first (a local denial never touches Redis), then the global
        // ones. A global denial after a local admission leaves the local units spent; the docs
        // say so.
        let (local_idx, global_idx): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| in_memory(i));
        let pick = |idx: &[usize]| idx.iter().map(|&i| checks[i]).collect::<Vec<_>>();
        let local = self
            .stores
            .memory()
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
        let Some((global, reason)) = self
            .stores
            .decide_shared(&pick(&global_idx))
            .await
            .map(with_admit_reason)
        else {
            // Refused (on_error: deny): hand back the local slots taken a moment ago.
            let _ = self.stores.memory().release(&local.leases).await;
            return None;
        };
        if !global.allowed {
            let _ = self.stores.memory().release(&local.leases).await;
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
}

/// A shared decision's `how` as the admit reason it gives.
fn with_admit_reason((decision, how): (Decision, How)) -> (Decision, AdmitReason) {
    let reason = match how {
        How::Answered => AdmitReason::Decided,
        How::FailedOpen => AdmitReason::StoreError,
        How::LocalFallback => AdmitReason::LocalFallback,
    };
    (decision, reason)
}

/// Admitted with nothing decided: an exempt caller, or a set with no limits (only a priority).
pub(crate) fn admitted_undecided<'a>(
    set: &'a LimitSet,
    identity: &'static str,
    reason: AdmitReason,
) -> LimitOutcome<'a> {
    LimitOutcome::Admitted(Admitted {
        set,
        identity,
        verdicts: Vec::new(),
        reason,
        leases: None,
        settlement: None,
        policy: None,
        key: String::new(),
    })
}

/// When a delay-mode request stops waiting for its turn and its quota: now plus the set's
/// smallest `max_delay`; None when no limit of the set delays.
fn delay_deadline(set: &LimitSet) -> Option<Instant> {
    set.iter()
        .filter_map(|l| match l.on_limit {
            OnLimit::Delay { max_delay } => Some(max_delay),
            OnLimit::Reject => None,
        })
        .min()
        .map(|max_delay| Instant::now() + max_delay)
}

fn as_check<'k>((limit, key): (&crate::config::Limit, &'k String)) -> Check<'k> {
    limit.check(key)
}

/// The store key of a limited set's first limit, taken out of the keys the stage built (none
/// for a set without limits). Taken, not moved with the vector: a vector moved on some paths
/// only would need a drop flag in the request's future.
fn first_key(keys: &mut [String]) -> String {
    keys.first_mut().map(std::mem::take).unwrap_or_default()
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
