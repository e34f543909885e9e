//! Settling limits that see the response (`count_statuses`, `cost_from_response`).
//!
//! The decision before forwarding takes each limit's configured cost as usual, so concurrent
//! requests cannot overshoot: a burst of wrong passwords against `limit: 5` admits five,
//! because the reservations of the five in flight block the rest. The admission then carries
//! an [`Obligation`], like the concurrency `LeaseGuard`, that settles those units once the
//! response is known:
//!
//! - `count_statuses`: on the response head, a status that does not count gets its units
//!   back; so does a request that never reached the app ([`Delivery::NotSent`]: no connection
//!   to the upstream, or tollgate refused it on the way). A request whose outcome can never be
//!   known ([`Delivery::Unknown`]: the upstream timed out, broke the exchange after the request
//!   was sent, or the client cut its request body off) counts as failing: its units stay
//!   taken, since the app may well have acted on it. A client that leaves does not settle
//!   anything: the proxy keeps the exchange going and settles on the app's answer
//!   (`crate::proxy::exchange`). The head's RateLimit fields are written after this
//!   settlement and show it: a unit given back is back in `remaining` ([`refunded`]).
//! - `cost_from_response`: when the response body ends (or is given up on), the reported
//!   cost is settled against the configured cost paid up front: the difference is charged
//!   (the balance may go below zero) or given back. The trailer of that name wins over the
//!   header; a missing or malformed report charges the configured cost (nothing to settle)
//!   and is counted in `tollgate_cost_report_invalid_total`, as does an exchange whose
//!   outcome is unknown. The head is written before that, so its fields show the configured
//!   cost as taken.
//!
//! Settled before it can matter: a client that sends its next request as soon as it has a
//! response (keep-alive, back to back) must be decided on a store that holds that response's
//! settlement, or a failures-only limit would refuse a caller that never fails. So the
//! settlement is applied, and waited for, before the part of the response it depends on goes
//! out: `count_statuses` before the head ([`Obligation::on_response`] is awaited by the
//! proxy), `cost_from_response` before the body's last frame ([`BeforeEnd`] holds it; an
//! empty body is settled before the head), a request that never reached the app before its
//! answer. The memory store settles in place; local-first copies too
//! ([`LocalFirst::settle`]: a refund comes out of the usage not written yet, and only units
//! already written are refunded in Redis, after the write that carried them); Redis (exact or
//! coalesced) in one `settle.lua` call, bounded by the store timeout. A failed settlement is
//! logged and counted (`tollgate_settlement_errors_total`) and the response goes on: a client
//! is held no longer than the store's timeout. An obligation dropped unsettled (nobody waits
//! for the answer) settles in the background.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use metrics::Counter;

use crate::body::{BeforeEnd, Finish, ProxyBody};
use crate::config::{ByResponse, LimitSet};
use crate::limit::local_first::LocalFirst;
use crate::limit::{
    Algorithm, Check, Decision, Micros, Params, Settle, Settlement, Store, Verdict,
};

/// Per-route counters of settlements.
#[derive(Clone)]
pub struct SettleMetrics {
    /// `cost_from_response` reports missing or malformed (the configured cost stood).
    pub cost_report_invalid: Counter,
    /// Settlements the store failed.
    pub failed: Counter,
}

/// How an admitted request's exchange with the upstream ended, as a settlement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The app answered with a response head.
    Answered,
    /// The request never reached the app: everything is given back.
    NotSent,
    /// The request (or part of it) reached the app but no answer will ever tell how it went:
    /// counted as failing, every unit stays taken.
    Unknown,
}

/// How a request's settlement went, as its record shows it (the access log's `settlement`).
/// When its limits settle differently, the record shows the most telling: a later variant
/// wins over an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Settled {
    /// The status counts: the units stay taken.
    Kept = 1,
    /// The units were given back: the status does not count, or the request never reached
    /// the app.
    Refunded = 2,
    /// The reported cost was settled against the cost paid up front.
    Cost = 3,
    /// No answer will tell how the request went: counted as failing, the units stay taken.
    Unknown = 4,
    /// The cost report was missing or malformed: the configured cost stands.
    InvalidReport = 5,
    /// The store failed the settlement: the units stay as the decision left them.
    Failed = 6,
}

impl Settled {
    const ALL: [Settled; 6] = [
        Settled::Kept,
        Settled::Refunded,
        Settled::Cost,
        Settled::Unknown,
        Settled::InvalidReport,
        Settled::Failed,
    ];

    /// The access log's `settlement` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Kept => "kept",
            Settled::Refunded => "refunded",
            Settled::Cost => "cost",
            Settled::Unknown => "unknown",
            Settled::InvalidReport => "invalid_report",
            Settled::Failed => "failed",
        }
    }
}

/// Where an obligation tells its request's record how it settled: shared, because a
/// `cost_from_response` limit settles inside the response body, after the proxy has let go
/// of the response. Made only for a request that owes a settlement.
#[derive(Debug, Default)]
pub struct SettleReport(AtomicU8);

impl SettleReport {
    fn note(&self, settled: Settled) {
        self.0.fetch_max(settled as u8, Ordering::Relaxed);
    }

    /// The most telling result so far; None: nothing settled yet (a body that settles at its
    /// end has not ended).
    pub fn get(&self) -> Option<Settled> {
        let value = self.0.load(Ordering::Relaxed);
        Settled::ALL.into_iter().find(|s| *s as u8 == value)
    }
}

/// Where the units of an admitted request are: what its settlement goes to.
#[derive(Clone)]
pub enum Settler {
    /// The store that decided (memory or Redis, exact or coalesced).
    Store(Store),
    /// The local copies of local-first limits decided: settled in them (see
    /// [`LocalFirst::settle`]), and in `shared` for the units already written there.
    LocalFirst { engine: LocalFirst, shared: Store },
}

/// What an admitted request owes the limits that see its response. Dropped unsettled (the
/// request never reached the app), it gives every reservation back. It owns what it needs of the limit set (the response body outlives the
/// request's borrow of the configuration).
pub struct Obligation {
    /// The set's store-key name (`route~tier` for a tier), for logs.
    route: Box<str>,
    /// Where the units were taken.
    settler: Settler,
    /// The store's clock at the decision.
    at: Micros,
    /// The limits that see the response and took units.
    limits: Vec<Owed>,
    metrics: Option<SettleMetrics>,
    /// Where the request's record reads how it settled.
    report: Option<Arc<SettleReport>>,
    /// Another route's obligation for the same request (a request counted on more than one
    /// route), settled on the same response.
    next: Option<Box<Obligation>>,
}

/// The place in the response's verdicts of a limit whose verdict the response does not show
/// (another route's, for a request counted on more than one route).
const NOT_SHOWN: usize = usize::MAX;

/// One limit's part of an [`Obligation`].
struct Owed {
    /// Its position in the set (and in the decision's verdicts).
    index: usize,
    params: Params,
    by_response: ByResponse,
    /// Its store key, as the decision used it.
    key: String,
}

impl Obligation {
    /// The obligation of an admitted decision, if any of the route's limits sees the
    /// response and took units (a shadow limit that would have denied took none).
    pub fn new(
        set: &LimitSet,
        checks: &[Check<'_>],
        decision: &Decision,
        settler: Option<Settler>,
    ) -> Option<Obligation> {
        let settler = settler?;
        // The checks, not the set, give key and parameters: a caller under a temporary
        // override was decided on its own keys with adjusted limits, and settles on them.
        let limits: Vec<Owed> = set
            .iter()
            .zip(checks)
            .zip(&decision.verdicts)
            .enumerate()
            .filter(|(_, ((_, _), verdict))| verdict.allowed)
            .filter_map(|(index, ((limit, check), _))| {
                Some(Owed {
                    index,
                    params: check.params,
                    by_response: limit.by_response.clone()?,
                    key: check.key.to_owned(),
                })
            })
            .collect();
        (!limits.is_empty()).then(|| Obligation {
            route: set.key_name.as_str().into(),
            settler,
            at: decision.at,
            limits,
            metrics: None,
            report: None,
            next: None,
        })
    }

    /// One obligation settling both (a request counted on more than one route): `b` is
    /// another route's, whose verdicts the response's fields do not show.
    pub fn joined(
        a: Option<Box<Obligation>>,
        b: Option<Box<Obligation>>,
    ) -> Option<Box<Obligation>> {
        let b = b.map(|mut b| {
            b.limits.iter_mut().for_each(|owed| owed.index = NOT_SHOWN);
            b
        });
        match (a, b) {
            (Some(mut a), Some(mut b)) => {
                b.next = a.next.take();
                a.next = Some(b);
                Some(a)
            }
            (a, b) => a.or(b),
        }
    }

    /// Counts this obligation's failures (and invalid reports) in the route's metrics.
    pub fn count_in(&mut self, metrics: &SettleMetrics) {
        self.metrics = Some(metrics.clone());
    }

    /// Tells `report` how this obligation (and another route's joined to it) settles.
    pub fn report_to(&mut self, report: &Arc<SettleReport>) {
        self.report = Some(report.clone());
        if let Some(next) = &mut self.next {
            next.report_to(report);
        }
    }

    fn note(&self, settled: Settled) {
        if let Some(report) = &self.report {
            report.note(settled);
        }
    }

    fn refund(&self, owed: &Owed) -> Settlement {
        Settlement {
            key: owed.key.clone(),
            params: owed.params,
            op: Settle::Refund {
                amount: owed.params.cost,
                taken_at: self.at,
            },
        }
    }

    /// Whether a limit waits for the end of the response body (`cost_from_response`): then
    /// the body is worth reading to its end even when the client has left.
    pub fn settles_at_end(&self) -> bool {
        self.limits
            .iter()
            .any(|owed| matches!(owed.by_response, ByResponse::CostFromResponse(_)))
            || self.next.as_ref().is_some_and(|next| next.settles_at_end())
    }

    /// Settles what the response head decides, in the store, before the head goes out: the
    /// client cannot send a request decided on it before then. Returns the response, its body
    /// wrapped when a `cost_from_response` limit waits for the end of it. `outcome` says
    /// whether `response` is the app's answer, or tollgate's own after the exchange failed
    /// (see [`Delivery`]). `verdicts` (the decision's, which the head's RateLimit fields are
    /// rendered from) are brought up to date with what the head settled: a refund gives its
    /// units back.
    pub async fn on_response(
        mut self,
        response: Response<ProxyBody>,
        outcome: Delivery,
        verdicts: &mut [Verdict],
    ) -> Response<ProxyBody> {
        // Another route's part first.
        let response = match self.next.take() {
            Some(next) => Box::pin(next.on_response(response, outcome, verdicts)).await,
            None => response,
        };
        match outcome {
            Delivery::Answered => {}
            Delivery::NotSent => {
                // Everything is given back.
                for owed in &self.limits {
                    if let Some(verdict) = verdicts.get_mut(owed.index) {
                        *verdict = refunded(*verdict, &owed.params);
                    }
                }
                self.give_back().await;
                return response;
            }
            Delivery::Unknown => {
                self.settle_unknown();
                return response;
            }
        }
        let status = response.status().as_u16();
        let limits = std::mem::take(&mut self.limits);
        let mut refunds = Vec::new();
        let mut costs = Vec::new();
        for owed in limits {
            match &owed.by_response {
                ByResponse::CountStatuses(set) if !set.contains(status) => {
                    if let Some(verdict) = verdicts.get_mut(owed.index) {
                        *verdict = refunded(*verdict, &owed.params);
                    }
                    refunds.push(self.refund(&owed));
                    self.note(Settled::Refunded);
                }
                ByResponse::CostFromResponse(header) => {
                    let reported = reported_cost(response.headers(), header);
                    costs.push(CostReport {
                        params: owed.params,
                        key: owed.key,
                        header: header.clone(),
                        reported,
                    });
                }
                ByResponse::CountStatuses(_) => self.note(Settled::Kept),
            }
        }
        if !apply(&self.settler, refunds, &self.route, self.metrics.as_ref()).await {
            self.note(Settled::Failed);
        }
        if costs.is_empty() {
            return response;
        }
        let mut settler = CostSettler {
            obligation: self,
            costs,
        };
        if response.body().is_end_stream() {
            // Nothing follows the head (an empty body, an answer to HEAD): the head is the
            // response's end, and the head's report is all there is.
            settler.settle().await;
            return response;
        }
        let (parts, body) = response.into_parts();
        let body = BeforeEnd::new(body, settler);
        Response::from_parts(parts, body.boxed_unsync())
    }

    /// Gives every unit back (the request never reached the app), before the answer goes out.
    pub async fn give_back(mut self) {
        if let Some(next) = self.next.take() {
            Box::pin(next.give_back()).await;
        }
        let limits = std::mem::take(&mut self.limits);
        let refunds = limits.iter().map(|owed| self.refund(owed)).collect();
        let settled = apply(&self.settler, refunds, &self.route, self.metrics.as_ref()).await;
        self.note(if settled {
            Settled::Refunded
        } else {
            Settled::Failed
        });
    }
}

impl Obligation {
    /// Settles an exchange whose outcome can never be known: as failing, every unit stays
    /// taken (a `cost_from_response` limit keeps the configured cost, an invalid report).
    pub fn settle_unknown(mut self) {
        if let Some(next) = self.next.take() {
            next.settle_unknown();
        }
        self.note(Settled::Unknown);
        for owed in std::mem::take(&mut self.limits) {
            if let (ByResponse::CostFromResponse(_), Some(m)) = (&owed.by_response, &self.metrics) {
                m.cost_report_invalid.increment(1);
            }
        }
        tracing::debug!(route = %self.route, "no answer will tell how the request went: counted as failing");
    }
}

impl Drop for Obligation {
    /// Dropped unsettled (the request's future was dropped before its exchange, or on the
    /// way out): nobody waits for an answer, so the refund is applied in the background.
    fn drop(&mut self) {
        let refunds: Vec<Settlement> = self.limits.iter().map(|owed| self.refund(owed)).collect();
        apply_later(&self.settler, refunds, &self.route, self.metrics.as_ref());
    }
}

/// An allowed verdict as it stands once its request's cost is given back: the units are back
/// in `remaining`; a full quota has nothing to reset, and a bucket (token_bucket, gcra) is
/// full again one refill of those units sooner. A window's reset is its end, unchanged.
fn refunded(verdict: Verdict, params: &Params) -> Verdict {
    let remaining = verdict
        .remaining
        .saturating_add(params.cost)
        .min(verdict.limit);
    let reset_after_us = if remaining >= verdict.limit {
        0
    } else {
        match params.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra if params.limit > 0 => {
                let refill = params.period_us / params.limit as Micros;
                (verdict.reset_after_us - refill.saturating_mul(params.cost as Micros)).max(0)
            }
            _ => verdict.reset_after_us,
        }
    };
    Verdict {
        remaining,
        reset_after_us,
        ..verdict
    }
}

/// A reported cost: a plain non-negative integer, nothing else.
fn reported_cost(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// One `cost_from_response` limit waiting for the end of the body.
struct CostReport {
    params: Params,
    key: String,
    header: HeaderName,
    /// From the head; replaced by the trailer of the same name if one comes.
    reported: Option<u64>,
}

struct CostSettler {
    /// Its limits are settled (taken); kept for the store, the time and the metrics.
    obligation: Obligation,
    /// The reports still to settle (emptied by [`CostSettler::settle`]).
    costs: Vec<CostReport>,
}

impl CostSettler {
    fn trailers(&mut self, trailers: &HeaderMap) {
        for cost in &mut self.costs {
            if trailers.contains_key(&cost.header) {
                cost.reported = reported_cost(trailers, &cost.header);
            }
        }
    }

    /// The settlements of the reports (the difference from the cost paid up front), taken
    /// once; an invalid report is counted and charges nothing more.
    fn take_settlements(&mut self) -> Vec<Settlement> {
        let o = &self.obligation;
        let mut settlements = Vec::new();
        for cost in std::mem::take(&mut self.costs) {
            let params = cost.params;
            let Some(reported) = cost.reported else {
                o.note(Settled::InvalidReport);
                tracing::debug!(route = %o.route, header = %cost.header, "no valid cost report: the configured cost stands");
                if let Some(m) = &o.metrics {
                    m.cost_report_invalid.increment(1);
                }
                continue;
            };
            o.note(Settled::Cost);
            let op = if reported > params.cost {
                Settle::Charge {
                    amount: reported - params.cost,
                }
            } else if reported < params.cost {
                Settle::Refund {
                    amount: params.cost - reported,
                    taken_at: o.at,
                }
            } else {
                continue;
            };
            settlements.push(Settlement {
                key: cost.key,
                params,
                op,
            });
        }
        settlements
    }

    /// Settles the reports in the store; bounded by the store's timeout.
    async fn settle(&mut self) {
        let settlements = self.take_settlements();
        let o = &self.obligation;
        if !apply(&o.settler, settlements, &o.route, o.metrics.as_ref()).await {
            o.note(Settled::Failed);
        }
    }
}

impl Drop for CostSettler {
    /// Not settled by the body's end (the body failed, or was dropped: the client left and
    /// nobody drains it): the header's report, or the configured cost, in the background.
    fn drop(&mut self) {
        let settlements = self.take_settlements();
        let o = &self.obligation;
        apply_later(&o.settler, settlements, &o.route, o.metrics.as_ref());
    }
}

/// A response with `cost_from_response` limits: notes the cost trailer as it passes, and
/// settles before the body's last frame (its last data, its trailers or its end) goes on to
/// the client (see [`BeforeEnd`]).
impl Finish for CostSettler {
    fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(trailers) = frame.trailers_ref() {
            self.trailers(trailers);
        }
    }

    fn finish(mut self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move { self.settle().await })
    }
}

/// Applies settlements where the units are, and waits for it: in place for memory and
/// local-first copies, one call bounded by the store's timeout for Redis. A failure is logged
/// and counted; the caller goes on. False: the store failed.
async fn apply(
    settler: &Settler,
    settlements: Vec<Settlement>,
    route: &str,
    metrics: Option<&SettleMetrics>,
) -> bool {
    let Some((store, settlements, after)) = in_place(settler, settlements) else {
        return true;
    };
    if let (Some(round), Settler::LocalFirst { engine, .. }) = (after, settler) {
        // The units are in a write on its way: the refund follows it (bounded as a call).
        let _ = tokio::time::timeout(store.timeout(), engine.written_through(round)).await;
    }
    let settled = store.settle(&settlements).await;
    if let Err(e) = &settled {
        failed(route, e, metrics);
    }
    if let Settler::LocalFirst { engine, .. } = settler {
        engine.refunds_answered(&settlements);
    }
    settled.is_ok()
}

/// [`apply`] when nobody waits (a dropped obligation): what is in place now, Redis in a task.
fn apply_later(
    settler: &Settler,
    settlements: Vec<Settlement>,
    route: &str,
    metrics: Option<&SettleMetrics>,
) {
    let Some((store, settlements, after)) = in_place(settler, settlements) else {
        return;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let store = store.clone();
    let engine = match settler {
        Settler::LocalFirst { engine, .. } => Some((engine.clone(), after)),
        Settler::Store(_) => None,
    };
    let route = route.to_string();
    let metrics = metrics.cloned();
    handle.spawn(async move {
        if let Some((engine, Some(round))) = &engine {
            let _ = tokio::time::timeout(store.timeout(), engine.written_through(*round)).await;
        }
        if let Err(e) = store.settle(&settlements).await {
            failed(&route, &e, metrics.as_ref());
        }
        if let Some((engine, _)) = engine {
            engine.refunds_answered(&settlements);
        }
    });
}

/// Settles what can be settled in this process (the memory store, local-first copies) and
/// returns what is left for Redis, if anything, with the local-first write it must follow.
fn in_place(
    settler: &Settler,
    settlements: Vec<Settlement>,
) -> Option<(&Store, Vec<Settlement>, Option<u64>)> {
    if settlements.is_empty() {
        return None;
    }
    let (store, (settlements, after)) = match settler {
        Settler::Store(store) => (store, (settlements, None)),
        Settler::LocalFirst { engine, shared } => (shared, engine.settle(&settlements)),
    };
    match store {
        _ if settlements.is_empty() => None,
        Store::Memory(memory) => {
            memory.settle(&settlements);
            None
        }
        Store::Redis(_) => Some((store, settlements, after)),
    }
}

fn failed(route: &str, e: &crate::limit::StoreError, metrics: Option<&SettleMetrics>) {
    tracing::warn!(route, cause = %crate::error::chain(e), "could not settle a limit after the response: the units stay as the decision left them");
    if let Some(m) = metrics {
        m.failed.increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's record shows the most telling of its limits' settlements, whatever the
    /// order they settled in; nothing settled yet reads as None ("pending" in the log).
    #[test]
    fn a_report_keeps_the_most_telling_settlement() {
        let report = SettleReport::default();
        assert_eq!(report.get(), None);
        report.note(Settled::Refunded);
        report.note(Settled::Kept);
        assert_eq!(report.get(), Some(Settled::Refunded));
        report.note(Settled::Failed);
        report.note(Settled::Cost);
        assert_eq!(report.get(), Some(Settled::Failed));
        for settled in Settled::ALL {
            let report = SettleReport::default();
            report.note(settled);
            assert_eq!(report.get(), Some(settled), "{}", settled.as_str());
        }
    }

    #[test]
    fn a_refund_gives_the_units_back_in_the_fields() {
        let verdict = |remaining, reset_after_us| Verdict {
            allowed: true,
            limit: 3,
            remaining,
            reset_after_us,
            retry_after_us: 0,
        };
        let params = |algorithm| Params {
            algorithm,
            limit: 3,
            period_us: 3_000_000,
            burst: 3,
            cost: 1,
            calendar: None,
        };
        // A window: one unit back, the window's end unchanged; back to full, nothing to reset.
        let window = params(Algorithm::FixedWindow);
        assert_eq!(refunded(verdict(1, 500), &window), verdict(2, 500));
        assert_eq!(refunded(verdict(2, 500), &window), verdict(3, 0));
        // A bucket: full one refill (1 s here) sooner.
        let bucket = params(Algorithm::Gcra);
        assert_eq!(
            refunded(verdict(0, 3_000_000), &bucket),
            verdict(1, 2_000_000)
        );
        assert_eq!(refunded(verdict(2, 1_000_000), &bucket), verdict(3, 0));
    }

    #[test]
    fn a_report_is_a_plain_non_negative_integer() {
        let name = HeaderName::from_static("x-tokens-used");
        let report = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(&name, value.parse().unwrap());
            reported_cost(&headers, &name)
        };
        assert_eq!(report("35"), Some(35));
        assert_eq!(report(" 7 "), Some(7));
        assert_eq!(report("0"), Some(0));
        assert_eq!(report("-3"), None);
        assert_eq!(report("1.5"), None);
        assert_eq!(report("lots"), None);
        assert_eq!(report("99999999999999999999999"), None);
        assert_eq!(reported_cost(&HeaderMap::new(), &name), None);
    }
}
