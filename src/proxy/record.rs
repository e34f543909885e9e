//! One record per request: what each stage of the request path found out (the route, the kind
//! of source that identified the caller, the decision, the upstream's status and time, an
//! error and its side, the status sent), filled in as the stages run and written once to the
//! metrics, the access log and `tracing` when the request's future ends. With traces on, it
//! also holds the request's spans (`crate::traces`), fed as the stages report and ended with
//! the record; their ids go on the log lines. It is written from
//! `Drop`, so a request whose client goes away mid-way (its future dropped) is recorded too:
//! counted as decided, with status 499 in the access log (the client closed the request).
//!
//! The access-log line (method, path without the query, which can carry tokens, route,
//! identity source kind but never its value, decision, status, upstream time, total time) goes
//! through `tracing` with target `tollgate::access`, so `--log-format json` makes it JSON and
//! `TOLLGATE_LOG` can silence it (`tollgate::access=off`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Method, StatusCode, Uri};
use opentelemetry::trace::{SpanId, TraceId};
use tokio::time::Instant;

use crate::config::Route;
use crate::error::{ProxyError, Side};
use crate::limit::Cause;
use crate::metrics::{Metrics, RouteMetrics};
use crate::store::Holder;
use crate::throttle::{AdmitReason, Denial, LimitOutcome, Limited};
use crate::traces::{DecisionSpan, RequestSpan, StoreKind};

/// The access log's status for a request whose client went away before it was answered.
const CLIENT_CLOSED: u16 = 499;

/// The decision a request is counted under, worked out once from the limit stage's outcome:
/// the access log's `decision` and the counters that go up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedDecision {
    /// Forwarded within its limits, or no route matched.
    Allowed,
    /// Forwarded unlimited: on an allow-list.
    Exempt,
    /// Forwarded, though a shadow limit would have denied it.
    ShadowLimited,
    /// The store failed: forwarded (`on_error: allow` or `local`) or refused with 503.
    StoreError,
    /// Refused: over a limit.
    Limited,
    /// Refused: over a limit the in-memory fallback decided because the store failed.
    LimitedByFallback,
    /// Refused before any limit: the caller's credential was refused (`on_invalid: reject`,
    /// 401), or the request has a shape no app should see (400) or is a CONNECT (405).
    Rejected,
    /// Refused by `protect`: the app is overloaded and this request was the one to shed.
    Shed,
    /// Forwarded, though `protect` in enforce mode would have shed it (shadow mode).
    ShadowShed,
}

impl RecordedDecision {
    /// The decision of a routed request.
    pub fn of(outcome: &LimitOutcome<'_>) -> RecordedDecision {
        match outcome {
            LimitOutcome::Admitted(admitted) => match admitted.reason {
                AdmitReason::Decided => RecordedDecision::Allowed,
                AdmitReason::Exempt => RecordedDecision::Exempt,
                AdmitReason::ShadowLimited => RecordedDecision::ShadowLimited,
                AdmitReason::StoreError | AdmitReason::LocalFallback => {
                    RecordedDecision::StoreError
                }
            },
            LimitOutcome::Limited(Limited {
                by_fallback: true, ..
            }) => RecordedDecision::LimitedByFallback,
            LimitOutcome::Limited(_) => RecordedDecision::Limited,
            LimitOutcome::StoreUnavailable { .. } => RecordedDecision::StoreError,
        }
    }

    /// The access log's `decision` field.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedDecision::Allowed => "allowed",
            RecordedDecision::Exempt => "exempt",
            RecordedDecision::ShadowLimited => "shadow_limited",
            RecordedDecision::StoreError => "store_error",
            RecordedDecision::Limited | RecordedDecision::LimitedByFallback => "limited",
            RecordedDecision::Rejected => "rejected",
            RecordedDecision::Shed => "shed",
            RecordedDecision::ShadowShed => "shadow_shed",
        }
    }

    /// Store errors count twice: once in total (by `cause`) and once on the route they hit.
    fn count(self, global: &Metrics, route: &RouteMetrics, cause: Cause) {
        match self {
            RecordedDecision::Allowed | RecordedDecision::Exempt => route.allowed.increment(1),
            RecordedDecision::ShadowLimited => route.shadow_limited.increment(1),
            RecordedDecision::StoreError => {
                global.store_errors.increment(cause, 1);
                route.store_error.increment(1);
            }
            RecordedDecision::Limited => route.limited.increment(1),
            RecordedDecision::Shed => route.shed.increment(1),
            RecordedDecision::ShadowShed => route.shadow_shed.increment(1),
            RecordedDecision::LimitedByFallback => {
                global.store_errors.increment(cause, 1);
                route.limited.increment(1);
            }
            RecordedDecision::Rejected => route.rejected.increment(1),
        }
    }
}

/// The limit stage's outcome as the trace shows it: the decision, the limit that refused (or
/// would have, in shadow) and its retry-after, and where it was decided (a Redis round trip
/// when `redis` holds the store's node and the set has a global limit that is not
/// local-first).
fn trace_decision<'o>(outcome: &'o LimitOutcome<'_>, redis: Option<&Arc<str>>) -> DecisionSpan<'o> {
    let detail = RecordedDecision::of(outcome).as_str();
    let key_source = outcome.identity();
    let on_redis = |set: &crate::config::LimitSet| {
        let holders = || set.limits.iter().map(|l| Holder::of(l, redis.is_some()));
        match redis {
            Some(node) if holders().any(|h| h == Holder::Shared) => {
                StoreKind::Redis { node: node.clone() }
            }
            Some(_) if holders().any(|h| h == Holder::LocalFirst) => StoreKind::LocalFirst,
            _ => StoreKind::Memory,
        }
    };
    // The first denying limit (shadow ones too: an admitted request names the shadow limit
    // that would have refused it) and the seconds until a retry can pass.
    let denying = |set: &'o crate::config::LimitSet,
                   verdicts: &mut dyn Iterator<Item = crate::limit::Verdict>| {
        set.limits
            .iter()
            .zip(verdicts)
            .find(|(_, v)| !v.allowed)
            .map(|(limit, v)| {
                let retry = (v.retry_after_us >= 0)
                    .then(|| crate::throttle::headers::retry_after_secs(v.retry_after_us));
                (limit.name.as_str(), retry)
            })
    };
    let mut span = DecisionSpan {
        decision: "admitted",
        detail,
        limit: None,
        key_source,
        retry_after: None,
        store: StoreKind::None,
        store_failed: false,
    };
    match outcome {
        LimitOutcome::Admitted(admitted) => {
            span.store = match admitted.reason {
                AdmitReason::Exempt => StoreKind::None,
                _ => on_redis(admitted.set),
            };
            span.store_failed = matches!(
                admitted.reason,
                AdmitReason::StoreError | AdmitReason::LocalFallback
            );
            if let Some((limit, _)) = denying(admitted.set, &mut admitted.verdicts.iter().cloned())
            {
                span.limit = Some(limit);
            }
        }
        LimitOutcome::Limited(limited) => {
            span.decision = "limited";
            let found = match &limited.denial {
                Denial::Decided(verdicts) => {
                    span.store = on_redis(limited.set);
                    denying(limited.set, &mut verdicts.iter().cloned())
                }
                Denial::Remembered { denial, at } => {
                    span.store = StoreKind::DenyCache;
                    denying(limited.set, &mut denial.aged(*at))
                }
            };
            span.store_failed = limited.by_fallback;
            if let Some((limit, retry)) = found {
                span.limit = Some(limit);
                span.retry_after = retry;
            }
        }
        LimitOutcome::StoreUnavailable { .. } => {
            span.decision = "store_unavailable";
            span.store = redis.map_or(StoreKind::None, |node| StoreKind::Redis {
                node: node.clone(),
            });
            span.store_failed = true;
        }
    }
    span
}

/// What the forward stage saw: how long the upstream took (or tollgate, when it refused on the
/// way), and the status the upstream answered with.
#[derive(Debug, Clone, Copy)]
struct Upstream {
    elapsed: Duration,
    /// None when no response came back (see the record's `error`).
    status: Option<u16>,
}

/// The record of one request (see the module docs). Counts the request in flight while it
/// lives.
pub struct RequestRecord<'a> {
    metrics: &'a Metrics,
    access_log: bool,
    started: Instant,
    method: Method,
    /// A clone shares the request's buffer: no copy of the path per request.
    uri: Uri,
    peer: SocketAddr,
    /// The route stage's answer; None when no route matched.
    route: Option<&'a Arc<Route>>,
    /// The metrics of `route`, or of unrouted requests.
    route_metrics: Option<&'a RouteMetrics>,
    /// The kind of source that identified the caller ("-" when nothing did).
    identity: &'static str,
    /// None until decided (a request whose client left while it was being limited).
    decision: Option<RecordedDecision>,
    /// Why the store failed, for a request it failed (counted under `other` unless told).
    store_cause: Cause,
    /// How long routing, identifying and limiting took, for a routed request.
    limit_time: Option<Duration>,
    upstream: Option<Upstream>,
    /// What went wrong on the way to or from the upstream; its side says whose fault it was.
    error: Option<ProxyError>,
    /// The status tollgate sent (before a gRPC translation); None while unanswered.
    status: Option<u16>,
    /// The request's spans, with traces on (see `crate::traces`); None costs nothing. Taken by
    /// the response body when they end with it.
    trace: Option<Box<RequestSpan>>,
    /// The trace and server span ids of a sampled request, for the log lines.
    ids: Option<(TraceId, SpanId)>,
    /// The Redis node a decision is sent to, for the trace.
    redis: Option<Arc<str>>,
}

impl<'a> RequestRecord<'a> {
    /// The record of the request `parts` from `peer`, started now.
    pub fn new(
        metrics: &'a Metrics,
        parts: &Parts,
        peer: SocketAddr,
        access_log: bool,
    ) -> RequestRecord<'a> {
        metrics.in_flight.increment(1.0);
        RequestRecord {
            metrics,
            access_log,
            started: Instant::now(),
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            peer,
            route: None,
            route_metrics: None,
            identity: "-",
            decision: None,
            store_cause: Cause::Other,
            limit_time: None,
            upstream: None,
            error: None,
            status: None,
            trace: None,
            ids: None,
            redis: None,
        }
    }

    /// Traces this request with `trace`, its spans (see `crate::traces`); `redis` is the node a
    /// Redis decision goes to.
    pub fn traced(&mut self, trace: Box<RequestSpan>, redis: Option<&Arc<str>>) {
        self.ids = trace.ids();
        self.trace = Some(trace);
        self.redis = redis.cloned();
    }

    /// The spans of a sampled request whose `response` has a body still to send: they end
    /// with that body (see `crate::traces::EndSpans`), with the status already on them. None
    /// keeps them here, to end with the record.
    pub fn spans_for_body<B: http_body::Body>(
        &mut self,
        response: &http::Response<B>,
    ) -> Option<Box<RequestSpan>> {
        if response.body().is_end_stream() || !self.trace.as_ref()?.recording() {
            return None;
        }
        let mut spans = self.trace.take()?;
        spans.responded(self.status);
        Some(spans)
    }

    /// Where the store writes its Redis call's time, when this request's trace records it:
    /// run the limit stage inside `crate::traces::round_trip::timed` with it.
    pub fn round_trip(&self) -> Option<crate::traces::round_trip::RoundTrip> {
        self.trace.as_ref()?.round_trip()
    }

    /// The upstream request leaves now: with traces on, its headers carry the upstream span's
    /// context (`traceparent`).
    pub fn sending(&mut self, headers: &mut http::HeaderMap) {
        if let Some(trace) = &mut self.trace {
            trace.sending(headers);
        }
    }

    /// When the request started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The route stage's answer and the metrics it is counted in. An unrouted request is
    /// decided here: it is forwarded unlimited.
    pub fn routed(&mut self, route: Option<&'a Arc<Route>>, metrics: &'a RouteMetrics) {
        self.route = route;
        self.route_metrics = Some(metrics);
        if let Some(trace) = &mut self.trace {
            trace.routed(route.map(|r| r.name.as_str()));
        }
        if route.is_none() {
            self.decision = Some(RecordedDecision::Allowed);
        }
    }

    /// The limit stage's outcome.
    pub fn decided(&mut self, outcome: &LimitOutcome<'_>) {
        self.limit_time = Some(self.started.elapsed());
        self.identity = outcome.identity();
        self.decision = Some(RecordedDecision::of(outcome));
        if let Some(trace) = &mut self.trace {
            trace.decided(trace_decision(outcome, self.redis.as_ref()));
        }
    }

    /// The store's cause of failure, asked only when the store failed this request (see
    /// `store::Stores::cause`).
    pub fn store_cause(&mut self, cause: impl FnOnce() -> Option<Cause>) {
        if matches!(
            self.decision,
            Some(RecordedDecision::StoreError | RecordedDecision::LimitedByFallback)
        ) {
            self.store_cause = cause().unwrap_or(Cause::Other);
        }
    }

    /// Refused before routing: a request shape no app should see, or CONNECT (see `shape`).
    pub fn rejected(&mut self) {
        self.rejected_by("-");
    }

    /// Refused by an identity before any limit (see `stages::identify`): counted where the
    /// limit stage's outcome is, with the kind of source that refused.
    pub fn identify_refused(&mut self, refusal: crate::identity::Refusal) {
        self.limit_time = Some(self.started.elapsed());
        self.identity = refusal.source_kind();
        self.rejected_by(self.identity);
    }

    fn rejected_by(&mut self, key_source: &'static str) {
        self.decision = Some(RecordedDecision::Rejected);
        if let Some(trace) = &mut self.trace {
            trace.decided(DecisionSpan {
                decision: "rejected",
                detail: "rejected",
                limit: None,
                key_source,
                retry_after: None,
                store: StoreKind::None,
                store_failed: false,
            });
        }
    }

    /// `protect` shed the request (`shadow`: would have, in enforce mode).
    pub fn shed(&mut self, shadow: bool) {
        if let Some(trace) = &mut self.trace {
            trace.shed(shadow);
        }
        self.decision = Some(if shadow {
            RecordedDecision::ShadowShed
        } else {
            RecordedDecision::Shed
        });
    }

    /// The forward stage's time, and the upstream's status when it answered.
    pub fn forwarded(&mut self, elapsed: Duration, status: Option<StatusCode>) {
        self.upstream = Some(Upstream {
            elapsed,
            status: status.map(|s| s.as_u16()),
        });
        if let Some(trace) = &mut self.trace {
            trace.forwarded(status.map(|s| s.as_u16()));
        }
    }

    /// The request failed on the way: `error` is kept for the log, its answer (in `form`, see
    /// `answers`) returned.
    pub fn failed(
        &mut self,
        error: ProxyError,
        form: crate::answers::Form,
    ) -> http::Response<crate::body::ProxyBody> {
        let (_, response) = crate::answers::Answer::Failed(&error).render(form);
        if let Some(trace) = &mut self.trace {
            trace.failed(
                error.side().as_str(),
                crate::error::chain(&error).to_string(),
            );
        }
        self.error = Some(error);
        response
    }

    /// The status tollgate answers with.
    pub fn answered(&mut self, status: StatusCode) {
        self.status = Some(status.as_u16());
    }

    /// Writes the record to the metrics, `tracing` and the access log.
    fn write(&mut self) {
        // The log lines below carry the request's trace and span ids when it is sampled.
        let trace_id = self.ids.map(|(trace, _)| tracing::field::display(trace));
        let span_id = self.ids.map(|(_, span)| tracing::field::display(span));
        if let Some(trace) = self.trace.take() {
            trace.finish(self.status);
        }
        if let (Some(decision), Some(route)) = (self.decision, self.route_metrics) {
            decision.count(self.metrics, route, self.store_cause);
        }
        if let Some(limit_time) = self.limit_time {
            self.metrics
                .limit_check_duration
                .record(limit_time.as_secs_f64());
        }
        if let (Some(upstream), Some(route)) = (self.upstream, self.route_metrics) {
            match (&self.error, upstream.status) {
                (None, Some(status)) => {
                    self.metrics
                        .upstream_duration
                        .record(upstream.elapsed.as_secs_f64());
                    route.upstream_response(status);
                }
                (Some(error), _) if error.side() == Side::Upstream => {
                    route.upstream_response(error.status().as_u16());
                }
                _ => {}
            }
        }
        let status = self.status.unwrap_or(CLIENT_CLOSED);
        if let Some(error) = &self.error {
            let (method, path, peer, side) = (
                &self.method,
                self.uri.path(),
                self.peer,
                error.side().as_str(),
            );
            match error.side() {
                Side::Client => {
                    tracing::info!(method = %method, path = %path, peer = %peer, status, side, cause = %crate::error::chain(error), trace_id, span_id, "request refused")
                }
                _ => {
                    tracing::warn!(method = %method, path = %path, peer = %peer, status, side, cause = %crate::error::chain(error), trace_id, span_id, "request failed")
                }
            }
        }
        if self.access_log {
            let route = self.route.map_or("-", |r| r.name.as_str());
            // Milliseconds to the microsecond: enough precision, short lines.
            let ms = |d: Duration| (d.as_micros() as f64) / 1000.0;
            let upstream_ms = self.upstream.map_or(-1.0, |u| ms(u.elapsed));
            let total_ms = ms(self.started.elapsed());
            tracing::info!(
                target: "tollgate::access",
                method = %self.method,
                path = %self.uri.path(),
                route,
                identity = self.identity,
                decision = self.decision.map_or("-", RecordedDecision::as_str),
                status,
                upstream_ms,
                total_ms,
                trace_id,
                span_id,
                "request"
            );
        }
    }
}

impl Drop for RequestRecord<'_> {
    fn drop(&mut self) {
        self.write();
        self.metrics.in_flight.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LimitSet;
    use crate::throttle::Denial;

    fn admitted(set: &LimitSet, reason: AdmitReason) -> LimitOutcome<'_> {
        crate::throttle::admitted_undecided(set, "header", reason)
    }

    fn limited(set: &LimitSet, by_fallback: bool) -> LimitOutcome<'_> {
        LimitOutcome::Limited(Limited {
            set,
            identity: "header",
            denial: Denial::Decided(Vec::new()),
            by_fallback,
            key: String::new(),
            policy: None,
        })
    }

    /// Each outcome maps to one access-log decision and one set of counters: store errors also
    /// count in total, a fallback's denial is limited and an error.
    #[test]
    fn each_outcome_is_counted_once() {
        let set = LimitSet::new("api", None, Vec::new(), true);
        let cases = [
            (
                admitted(&set, AdmitReason::Decided),
                "allowed",
                "allowed",
                0,
            ),
            (admitted(&set, AdmitReason::Exempt), "exempt", "allowed", 0),
            (
                admitted(&set, AdmitReason::ShadowLimited),
                "shadow_limited",
                "shadow_limited",
                0,
            ),
            (
                admitted(&set, AdmitReason::StoreError),
                "store_error",
                "store_error",
                1,
            ),
            (
                admitted(&set, AdmitReason::LocalFallback),
                "store_error",
                "store_error",
                1,
            ),
            (limited(&set, false), "limited", "limited", 0),
            (limited(&set, true), "limited", "limited", 1),
            (
                LimitOutcome::StoreUnavailable { identity: "header" },
                "store_error",
                "store_error",
                1,
            ),
        ];
        let parts = http::Request::get("/x").body(()).unwrap().into_parts().0;
        let peer: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        for (outcome, decision, counter, store_errors) in cases {
            let counted = RecordedDecision::of(&outcome);
            assert_eq!(counted.as_str(), decision, "{counted:?}");
            let metrics = Metrics::new();
            let route = metrics.route("api");
            let mut record = RequestRecord::new(&metrics, &parts, peer, false);
            record.decided(&outcome);
            record.store_cause(|| Some(Cause::Refused));
            record.route_metrics = Some(&route);
            drop(record);
            let text = metrics.render();
            let line = format!("tollgate_requests_total{{route=\"api\",decision=\"{counter}\"}} 1");
            assert!(
                text.contains(&line),
                "{counted:?}: missing {line:?} in\n{text}"
            );
            let counted_requests = text
                .lines()
                .filter(|l| l.starts_with("tollgate_requests_total") && !l.ends_with(" 0"))
                .count();
            assert_eq!(counted_requests, 1, "{counted:?}: counted once in\n{text}");
            let errors = format!("tollgate_store_errors_total{{cause=\"refused\"}} {store_errors}");
            assert!(
                text.contains(&errors),
                "{counted:?}: missing {errors:?} in\n{text}"
            );
            assert!(text.contains("tollgate_in_flight_requests 0"), "{text}");
        }
    }

    /// A request `protect` shed is logged and counted as `shed`; one it would have shed in
    /// shadow mode as `shadow_shed`.
    #[test]
    fn shed_requests_are_their_own_decision() {
        let metrics = Metrics::new();
        let route = metrics.route("api");
        let request = http::Request::get("/x").body(()).unwrap();
        let (parts, _) = request.into_parts();
        for shadow in [false, true, false] {
            let mut record =
                RequestRecord::new(&metrics, &parts, "192.0.2.1:1".parse().unwrap(), false);
            record.routed(None, &route);
            record.shed(shadow);
            let expected = if shadow { "shadow_shed" } else { "shed" };
            assert_eq!(
                record.decision.map(RecordedDecision::as_str),
                Some(expected)
            );
        }
        let text = metrics.render();
        for line in [
            "tollgate_requests_total{route=\"api\",decision=\"shed\"} 2",
            "tollgate_requests_total{route=\"api\",decision=\"shadow_shed\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// A request refused for its shape (or a CONNECT) counts as `rejected`, not `allowed`.
    #[test]
    fn refused_shapes_are_rejected() {
        let metrics = Metrics::new();
        let unrouted = metrics.route(crate::metrics::UNROUTED);
        let request = http::Request::get("/x").body(()).unwrap();
        let (parts, _) = request.into_parts();
        let mut record =
            RequestRecord::new(&metrics, &parts, "192.0.2.1:1".parse().unwrap(), false);
        record.routed(None, &unrouted);
        record.rejected();
        assert_eq!(
            record.decision.map(RecordedDecision::as_str),
            Some("rejected")
        );
        drop(record);
        let text = metrics.render();
        assert!(
            text.contains("decision=\"rejected\"} 1") && !text.contains("decision=\"allowed\"} 1"),
            "{text}"
        );
    }

    /// A request whose client leaves mid-way (its future dropped) is still counted, once.
    #[test]
    fn a_request_dropped_mid_way_is_recorded_once() {
        let metrics = Metrics::new();
        let route = metrics.route("api");
        let set = LimitSet::new("api", None, Vec::new(), true);
        let parts = http::Request::get("/x").body(()).unwrap().into_parts().0;
        let mut record =
            RequestRecord::new(&metrics, &parts, "192.0.2.1:5000".parse().unwrap(), true);
        record.route_metrics = Some(&route);
        record.decided(&admitted(&set, AdmitReason::Decided));
        assert!(metrics.render().contains("tollgate_in_flight_requests 1"));
        drop(record);
        let text = metrics.render();
        assert!(
            text.contains("tollgate_requests_total{route=\"api\",decision=\"allowed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tollgate_limit_check_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("tollgate_in_flight_requests 0"), "{text}");
    }
}
