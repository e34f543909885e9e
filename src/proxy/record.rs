//! One record per request: what each stage of the request path found out (the route, the kind
//! of source that identified the caller, the decision, the upstream's status and time, an
//! error and its side, the status sent), filled in as the stages run, and what the response
//! body did (how it ended, the bytes sent, the settlement's result), written once to the
//! metrics, the access log and `tracing` when the exchange is over. With traces on, it also
//! holds the request's spans (`crate::traces`), fed as the stages report and ended with the
//! record; their ids go on the log lines.
//!
//! The record covers the whole exchange: when the stages hand the response over, it moves into
//! the response body ([`BodyRecord`]) and is written when the body ends, fails, or is dropped
//! (the client left mid-body: `body=client_left`). It is written from `Drop` too, so a request
//! whose client goes away before the head (its future dropped) is recorded as well: counted as
//! decided, with status 499 in the access log (the client closed the request). The request
//! counts in `tollgate_in_flight_requests` until then.
//!
//! The access-log line (method, path without the query, which can carry tokens, route,
//! identity source kind but never its value, decision, status, upstream time, total time to
//! the body's end, how the body ended, its bytes, the settlement's result) goes through
//! `tracing` with target `tollgate::access`, so `--log-format json` makes it JSON and
//! `TOLLGATE_LOG` can silence it (`tollgate::access=off`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Response, StatusCode, Uri};
use http_body::{Body, Frame};
use opentelemetry::trace::{SpanId, TraceId};
use tokio::time::Instant;

use super::answer_body::AnswerBody;
use super::runtime::{Inner, Runtime};
use crate::body::{End, EndHook, OnEnd};
use crate::config::Route;
use crate::error::{ProxyError, Side};
use crate::limit::Cause;
use crate::metrics::{Metrics, RouteMetrics};
use crate::routing::Routed;
use crate::store::Holder;
use crate::throttle::settle::{SettleReport, Settled};
use crate::throttle::{AdmitReason, Denial, LimitOutcome, Limited};
use crate::traces::{BodyEnd, DecisionSpan, RequestSpan, StoreKind};

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

/// Where a request is counted: by its route's place in the running configuration, so that
/// the record owns nothing of the configuration and can outlive the request's future in its
/// response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not routed yet (the client left before the route stage): counted nowhere per route.
    Unknown,
    /// No route matched, or refused before routing.
    Unrouted,
    /// The route at this index.
    Route(usize),
}

/// What a record is counted in: the process's metrics and the running configuration's routes
/// and their metrics.
#[derive(Clone, Copy)]
struct Counting<'a> {
    metrics: &'a Metrics,
    routes: &'a [Arc<Route>],
    route_metrics: &'a [RouteMetrics],
    unrouted: &'a RouteMetrics,
}

impl<'a> Counting<'a> {
    fn of(metrics: &'a Metrics, runtime: &'a Runtime) -> Counting<'a> {
        Counting {
            metrics,
            routes: &runtime.config.throttle.routes,
            route_metrics: &runtime.route_metrics,
            unrouted: &runtime.unrouted_metrics,
        }
    }

    fn route_metrics(&self, place: Place) -> Option<&'a RouteMetrics> {
        match place {
            Place::Unknown => None,
            Place::Unrouted => Some(self.unrouted),
            Place::Route(index) => self.route_metrics.get(index),
        }
    }

    fn route_name(&self, place: Place) -> &'a str {
        match place {
            Place::Route(index) => self.routes.get(index).map_or("-", |r| r.name.as_str()),
            Place::Unknown | Place::Unrouted => "-",
        }
    }
}

/// What one request's record holds (see [`RequestRecord`]): owned, boxed so that moving it
/// into the response body moves a pointer.
struct Facts {
    access_log: bool,
    started: Instant,
    method: Method,
    /// A clone shares the request's buffer: no copy of the path per request.
    uri: Uri,
    peer: SocketAddr,
    /// The route stage's answer.
    place: Place,
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
    /// How the response body ended; None when the record is written before a response (the
    /// client left first).
    body: Option<BodyEnd>,
    /// The response body's bytes that went to the client.
    body_bytes: u64,
    /// How the request's settlement went, for a request that owes one (see
    /// `throttle::settle`).
    settlement: Option<Arc<SettleReport>>,
    /// The request's spans, with traces on (see `crate::traces`); None costs nothing.
    trace: Option<Box<RequestSpan>>,
    /// The trace and server span ids of a sampled request, for the log lines.
    ids: Option<(TraceId, SpanId)>,
    /// The Redis node a decision is sent to, for the trace.
    redis: Option<Arc<str>>,
    /// Set when the record moves into the response body ([`BodyRecord::around`]).
    owner: Option<Owner>,
}

/// The record of one request while the stages run (see the module docs). Counts the request
/// in flight while it (or the [`BodyRecord`] it becomes) lives. Dropped with the request's
/// future (the client left before the head), it is written then.
pub struct RequestRecord<'a> {
    counting: Counting<'a>,
    /// Taken when the record moves into the response body ([`RequestRecord::detach`]).
    facts: Option<Box<Facts>>,
}

impl<'a> RequestRecord<'a> {
    /// The record of the request `parts` from `peer`, started now.
    fn new(
        counting: Counting<'a>,
        parts: &Parts,
        peer: SocketAddr,
        access_log: bool,
    ) -> RequestRecord<'a> {
        counting.metrics.in_flight.increment(1.0);
        let facts = Facts {
            access_log,
            started: Instant::now(),
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            peer,
            place: Place::Unknown,
            identity: "-",
            decision: None,
            store_cause: Cause::Other,
            limit_time: None,
            upstream: None,
            error: None,
            status: None,
            body: None,
            body_bytes: 0,
            settlement: None,
            trace: None,
            ids: None,
            redis: None,
            owner: None,
        };
        RequestRecord {
            counting,
            facts: Some(Box::new(facts)),
        }
    }

    /// The record of the request `parts` from `peer`, started now, counted in `metrics` and
    /// the routes of `runtime`; `trace` holds its spans, with traces on.
    pub fn start(
        metrics: &'a Metrics,
        runtime: &'a Runtime,
        parts: &Parts,
        peer: SocketAddr,
        trace: Option<Box<RequestSpan>>,
    ) -> RequestRecord<'a> {
        let counting = Counting::of(metrics, runtime);
        let mut record = RequestRecord::new(counting, parts, peer, runtime.config.access_log);
        if let Some(trace) = trace {
            record.traced(trace, runtime.trace_redis.as_ref());
        }
        record
    }

    fn facts(&mut self) -> &mut Facts {
        self.facts
            .as_mut()
            .expect("a record is detached only when it is done with")
    }

    /// Traces this request with `trace`, its spans (see `crate::traces`); `redis` is the node a
    /// Redis decision goes to.
    fn traced(&mut self, trace: Box<RequestSpan>, redis: Option<&Arc<str>>) {
        let facts = self.facts();
        facts.ids = trace.ids();
        facts.trace = Some(trace);
        facts.redis = redis.cloned();
    }

    /// Where the store writes its Redis call's time, when this request's trace records it:
    /// run the limit stage inside `crate::traces::round_trip::timed` with it.
    pub fn round_trip(&mut self) -> Option<crate::traces::round_trip::RoundTrip> {
        self.facts().trace.as_ref()?.round_trip()
    }

    /// The upstream request leaves now: with traces on, its headers carry the upstream span's
    /// context (`traceparent`).
    pub fn sending(&mut self, headers: &mut http::HeaderMap) {
        if let Some(trace) = &mut self.facts().trace {
            trace.sending(headers);
        }
    }

    /// When the request started.
    pub fn started(&mut self) -> Instant {
        self.facts().started
    }

    /// The route stage's answer: the request is counted in its route's metrics. An unrouted
    /// request is decided here: it is forwarded unlimited.
    pub fn routed(&mut self, routed: Option<Routed<'_>>) {
        let facts = self.facts();
        facts.place = routed.map_or(Place::Unrouted, |r| Place::Route(r.index));
        if let Some(trace) = &mut facts.trace {
            trace.routed(routed.map(|r| r.route.name.as_str()));
        }
        if routed.is_none() {
            facts.decision = Some(RecordedDecision::Allowed);
        }
    }

    /// The limit stage's outcome.
    pub fn decided(&mut self, outcome: &LimitOutcome<'_>) {
        let facts = self.facts();
        facts.limit_time = Some(facts.started.elapsed());
        facts.identity = outcome.identity();
        facts.decision = Some(RecordedDecision::of(outcome));
        if let Some(trace) = &mut facts.trace {
            trace.decided(trace_decision(outcome, facts.redis.as_ref()));
        }
    }

    /// The store's cause of failure, asked only when the store failed this request (see
    /// `store::Stores::cause`).
    pub fn store_cause(&mut self, cause: impl FnOnce() -> Option<Cause>) {
        let facts = self.facts();
        if matches!(
            facts.decision,
            Some(RecordedDecision::StoreError | RecordedDecision::LimitedByFallback)
        ) {
            facts.store_cause = cause().unwrap_or(Cause::Other);
        }
    }

    /// Refused before routing: a request shape no app should see, or CONNECT (see `shape`).
    pub fn rejected(&mut self) {
        self.rejected_by("-");
    }

    /// Refused by an identity before any limit (see `stages::identify`): counted where the
    /// limit stage's outcome is, with the kind of source that refused.
    pub fn identify_refused(&mut self, refusal: crate::identity::Refusal) {
        let kind = refusal.source_kind();
        let facts = self.facts();
        facts.limit_time = Some(facts.started.elapsed());
        facts.identity = kind;
        self.rejected_by(kind);
    }

    fn rejected_by(&mut self, key_source: &'static str) {
        let facts = self.facts();
        facts.decision = Some(RecordedDecision::Rejected);
        if let Some(trace) = &mut facts.trace {
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
        let facts = self.facts();
        if let Some(trace) = &mut facts.trace {
            trace.shed(shadow);
        }
        facts.decision = Some(if shadow {
            RecordedDecision::ShadowShed
        } else {
            RecordedDecision::Shed
        });
    }

    /// Where the request's settlement reports how it went (see `throttle::settle`): made
    /// for a request that owes one.
    pub fn settlement(&mut self) -> &Arc<SettleReport> {
        self.facts().settlement.get_or_insert_with(Default::default)
    }

    /// The forward stage's time, and the upstream's status when it answered.
    pub fn forwarded(&mut self, elapsed: Duration, status: Option<StatusCode>) {
        let facts = self.facts();
        facts.upstream = Some(Upstream {
            elapsed,
            status: status.map(|s| s.as_u16()),
        });
        if let Some(trace) = &mut facts.trace {
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
        let facts = self.facts();
        if let Some(trace) = &mut facts.trace {
            trace.failed(
                error.side().as_str(),
                crate::error::chain(&error).to_string(),
            );
        }
        facts.error = Some(error);
        response
    }

    /// The status tollgate answers with.
    pub fn answered(&mut self, status: StatusCode) {
        self.facts().status = Some(status.as_u16());
    }

    /// What the record knows, to go on in the response body ([`BodyRecord::around`]): this
    /// record writes nothing more.
    pub fn detach(mut self) -> Detached {
        Detached(self.facts.take())
    }
}

impl Drop for RequestRecord<'_> {
    fn drop(&mut self) {
        if let Some(mut facts) = self.facts.take() {
            facts.write(&self.counting);
        }
    }
}

/// A record on its way into the response body (see [`RequestRecord::detach`]).
pub struct Detached(Option<Box<Facts>>);

/// What a record in the response body needs to be written: the process's handle and the
/// configuration snapshot the request was served with (moved from the request's future: no
/// reference counts change), and a sampled request's log span.
struct Owner {
    inner: Arc<Inner>,
    runtime: Arc<Runtime>,
    /// A sampled request's log span: lines logged while the body streams carry its ids.
    log: Option<tracing::Span>,
}

/// The record of a request whose response has been handed to the client: it goes on in the
/// response body and is written when the body ends (or fails), or when it is dropped (the
/// client left mid-body, or hyper is done with a body it knows has ended), with how it ended,
/// the bytes sent and the settlement's result. One pointer: every move of the response (hyper
/// moves it a few times) copies as little as before.
pub struct BodyRecord(Option<Box<Facts>>);

/// A response body that writes its request's record when it ends (see [`BodyRecord`]).
pub type RecordedBody = OnEnd<AnswerBody, BodyRecord>;

impl BodyRecord {
    /// `response` with its body carrying the record.
    pub fn around(
        response: Response<AnswerBody>,
        detached: Detached,
        inner: Arc<Inner>,
        runtime: Arc<Runtime>,
    ) -> Response<RecordedBody> {
        let record = detached.0.map(|mut facts| {
            let log = facts
                .trace
                .as_ref()
                .filter(|trace| trace.recording())
                .map(|trace| trace.log_span());
            facts.owner = Some(Owner {
                inner,
                runtime,
                log,
            });
            facts
        });
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, OnEnd::with_hook(body, BodyRecord(record)))
    }

    fn write(&mut self, body: BodyEnd) {
        if let Some(mut facts) = self.0.take() {
            facts.body = Some(body);
            if let Some(owner) = facts.owner.take() {
                facts.write(&Counting::of(&owner.inner.metrics, &owner.runtime));
            }
        }
    }
}

impl EndHook<AnswerBody> for BodyRecord {
    type Error = crate::body::BoxError;

    #[inline]
    fn frame(&mut self, frame: &Frame<Bytes>, _inner: &AnswerBody) -> Result<(), Self::Error> {
        if let (Some(facts), Some(data)) = (&mut self.0, frame.data_ref()) {
            facts.body_bytes += data.len() as u64;
        }
        // Trailers are a body's last frame: the body is whole once they are handed on, even if
        // the server sends them and drops the body without polling it for its end.
        if frame.is_trailers() {
            self.write(BodyEnd::Complete);
        }
        Ok(())
    }

    fn end(&mut self, how: End) {
        self.write(match how {
            End::Stream => BodyEnd::Complete,
            End::Error => BodyEnd::Failed,
        });
    }

    fn dropped(&mut self, inner: &AnswerBody) {
        self.write(match inner.is_end_stream() {
            true => BodyEnd::Complete,
            false => BodyEnd::ClientLeft,
        });
    }

    #[inline]
    fn scope(&self) -> Option<&tracing::Span> {
        self.0.as_ref()?.owner.as_ref()?.log.as_ref()
    }
}

impl Facts {
    /// Writes the record to the metrics, `tracing` and the access log, and counts the request
    /// out of flight.
    fn write(&mut self, counting: &Counting<'_>) {
        let metrics = counting.metrics;
        let route_metrics = counting.route_metrics(self.place);
        // The log lines below carry the request's trace and span ids when it is sampled.
        let trace_id = self.ids.map(|(trace, _)| tracing::field::display(trace));
        let span_id = self.ids.map(|(_, span)| tracing::field::display(span));
        if let Some(mut trace) = self.trace.take() {
            trace.responded(self.status);
            trace.end(self.body.unwrap_or(BodyEnd::Complete));
        }
        if let (Some(decision), Some(route)) = (self.decision, route_metrics) {
            decision.count(metrics, route, self.store_cause);
        }
        if let Some(limit_time) = self.limit_time {
            metrics
                .limit_check_duration
                .record(limit_time.as_secs_f64());
        }
        if let (Some(upstream), Some(route)) = (self.upstream, route_metrics) {
            match (&self.error, upstream.status) {
                (None, Some(status)) => {
                    metrics
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
        let (method, path, peer) = (&self.method, self.uri.path(), self.peer);
        if let Some(error) = &self.error {
            let side = error.side().as_str();
            match error.side() {
                Side::Client => {
                    tracing::info!(method = %method, path = %path, peer = %peer, status, side, cause = %crate::error::chain(error), trace_id, span_id, "request refused")
                }
                _ => {
                    tracing::warn!(method = %method, path = %path, peer = %peer, status, side, cause = %crate::error::chain(error), trace_id, span_id, "request failed")
                }
            }
        }
        if self.body == Some(BodyEnd::Failed) {
            tracing::warn!(method = %method, path = %path, peer = %peer, status, side = "upstream", bytes = self.body_bytes, trace_id, span_id, "response body failed mid-way: the client got part of it");
        }
        if self.access_log {
            // Milliseconds to the microsecond: enough precision, short lines.
            let ms = |d: Duration| (d.as_micros() as f64) / 1000.0;
            let upstream_ms = self.upstream.map_or(-1.0, |u| ms(u.elapsed));
            let total_ms = ms(self.started.elapsed());
            tracing::info!(
                target: "tollgate::access",
                method = %method,
                path = %path,
                route = counting.route_name(self.place),
                identity = self.identity,
                decision = self.decision.map_or("-", RecordedDecision::as_str),
                status,
                upstream_ms,
                total_ms,
                body = self.body.map_or("-", BodyEnd::as_str),
                bytes = self.body_bytes,
                settlement = self.settlement.as_deref().map_or("-", |report| {
                    report.get().map_or("pending", Settled::as_str)
                }),
                trace_id,
                span_id,
                "request"
            );
        }
        metrics.in_flight.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LimitSet;
    use crate::throttle::Denial;

    /// Counted in `metrics`, with `route` as the route at index 0 and the unrouted one.
    fn counting<'a>(metrics: &'a Metrics, route: &'a RouteMetrics) -> Counting<'a> {
        Counting {
            metrics,
            routes: &[],
            route_metrics: std::slice::from_ref(route),
            unrouted: route,
        }
    }

    /// A record of `parts` from a documentation address, counted in `metrics` and `route`.
    fn record_in<'a>(
        metrics: &'a Metrics,
        route: &'a RouteMetrics,
        parts: &Parts,
        access_log: bool,
    ) -> RequestRecord<'a> {
        let peer = "192.0.2.1:5000".parse().unwrap();
        RequestRecord::new(counting(metrics, route), parts, peer, access_log)
    }

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
            let mut record = RequestRecord::new(counting(&metrics, &route), &parts, peer, false);
            record.decided(&outcome);
            record.store_cause(|| Some(Cause::Refused));
            record.facts().place = Place::Route(0);
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
            let mut record = record_in(&metrics, &route, &parts, false);
            record.routed(None);
            record.shed(shadow);
            let expected = if shadow { "shadow_shed" } else { "shed" };
            assert_eq!(
                record.facts().decision.map(RecordedDecision::as_str),
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
        let mut record = record_in(&metrics, &unrouted, &parts, false);
        record.routed(None);
        record.rejected();
        assert_eq!(
            record.facts().decision.map(RecordedDecision::as_str),
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
        let mut record = record_in(&metrics, &route, &parts, true);
        record.facts().place = Place::Route(0);
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
