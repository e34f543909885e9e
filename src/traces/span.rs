//! One request's spans: the server span (HTTP semantic conventions: `http.request.method`,
//! `url.path`, `http.route` (the route's name), `http.response.status_code`,
//! `client.address`, `network.protocol.version`) in the caller's trace (W3C `traceparent` and
//! `tracestate`); the limit decision, as a client span when Redis decided it (`db.system`
//! `redis`, the script, the node) and as an event on the server span when no round trip was
//! made (memory, local-first, the deny cache); the upstream exchange as a client span whose
//! context the upstream request carries. The decision's attributes (`tollgate.decision`,
//! `tollgate.limit`, `tollgate.key_source`: the kind of source, never its value,
//! `tollgate.retry_after`) are on the server span too, where a trace's list shows them.
//!
//! The caller's context is read from `traceparent` (W3C) or, without one, from B3 (`b3`, or
//! `X-B3-TraceId`/`SpanId`/`Sampled`), as `tracing.propagators` allows; the upstream request
//! carries `traceparent`, and B3 too in the form the caller sent it. A B3 caller that left the
//! decision to us (no sampled flag) is sampled by the root ratio, drawn by tollgate (never
//! from the caller's trace id, which the caller chooses).
//!
//! Only a caller tollgate trusts has its context read (`tracing.caller_context`: by default a
//! peer in `client_ip.trusted_proxies`): anyone else's request is a root of its own, with a
//! trace id tollgate draws, sampled by the ratio. So no caller decides what is exported
//! (`traceparent …-01`, `X-B3-Sampled: 1`, `X-B3-Flags: 1`, a trace id chosen to pass the
//! ratio). Its B3 form is still noted, so that a sampled request's B3 headers upstream are
//! tollgate's, not the caller's.
//!
//! The server span and the upstream's client span end when the response body has gone out
//! whole (or the client left mid-body, `tollgate.client_closed`), not when its head did: a
//! slowly streamed body's time is in both.
//!
//! A request the sampler leaves out builds no attributes and no client span: its upstream
//! request keeps the caller's `traceparent` or B3 headers (if any) untouched, as without
//! tracing.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, Method, Version};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SdkTracer, ShouldSample, Span,
};

use super::b3::{self, B3};

use crate::config::Propagators;
use crate::identity::TrustedProxies;

/// How the caller's context is read, whose is read, and the root ratio a deferred B3 caller
/// is sampled by.
#[derive(Debug, Clone)]
pub(super) struct Extraction {
    pub propagators: Propagators,
    pub ratio: f64,
    /// The peers whose context is followed; None: any caller's.
    pub trusted: Option<TrustedProxies>,
}

impl Extraction {
    /// Whether a request from `peer` has its trace context read.
    fn follows(&self, peer: IpAddr) -> bool {
        self.trusted.as_ref().is_none_or(|t| t.contains(peer))
    }
}

/// Where a decision was made, as the trace tells it.
#[derive(Debug, Clone)]
pub enum StoreKind {
    /// No store was asked (an exempt caller, a refused credential).
    None,
    /// Process memory (the memory store, `scope: local` limits).
    Memory,
    /// The local copies of local-first limits (`sync`): no round trip.
    LocalFirst,
    /// The deny cache answered a caller Redis denied a moment ago.
    DenyCache,
    /// A Redis round trip to `node` (`host:port`, or the Cluster's or Sentinels' first).
    Redis { node: Arc<str> },
}

/// What the limit stage decided, for the trace.
#[derive(Debug)]
pub struct DecisionSpan<'a> {
    /// `admitted`, `limited`, `store_unavailable` or `rejected`.
    pub decision: &'static str,
    /// The access log's finer decision (`allowed`, `exempt`, `shadow_limited`, ...).
    pub detail: &'static str,
    /// The limit that refused (or would have, in shadow).
    pub limit: Option<&'a str>,
    /// The kind of source that identified the caller (`header`, `jwt`, ...).
    pub key_source: &'static str,
    /// Seconds until a retry can pass, for a refusal.
    pub retry_after: Option<u64>,
    pub store: StoreKind,
    /// The store failed this decision.
    pub store_failed: bool,
}

/// The spans of one request (see the module docs); the server span ends with
/// [`RequestSpan::finish`] or, when the request's future is dropped, on drop.
pub struct RequestSpan {
    tracer: SdkTracer,
    server: Span,
    /// A context whose span is the server span: the children's parent.
    cx: Context,
    recording: bool,
    method: Method,
    /// The Redis decision call's start and end, written by the store (recording only).
    round_trip: Option<super::round_trip::RoundTrip>,
    client: Option<Span>,
    /// The B3 form the caller sent its context in, injected upstream as well.
    b3: Option<b3::Form>,
}

/// How a response's body ended, for the spans that end with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Sent whole.
    Complete,
    /// The client went away before the body's end.
    ClientLeft,
    /// The upstream's body failed mid-way.
    Failed,
}

impl BodyEnd {
    /// The access log's `body` field.
    pub fn as_str(self) -> &'static str {
        match self {
            BodyEnd::Complete => "complete",
            BodyEnd::ClientLeft => "client_left",
            BodyEnd::Failed => "failed",
        }
    }
}

impl RequestSpan {
    /// The server span of a request with these `headers`, started with `tracer` in the trace
    /// their `traceparent` names (a new one without it).
    pub(super) fn start(
        tracer: &SdkTracer,
        method: &Method,
        path: &str,
        version: Version,
        headers: &HeaderMap,
        peer: SocketAddr,
        extraction: &Extraction,
    ) -> Box<RequestSpan> {
        let (parent, b3) = match extraction.follows(peer.ip()) {
            true => extract(headers, extraction),
            false => (Context::new(), b3_form(headers, &extraction.propagators)),
        };
        let mut server = tracer
            .span_builder(method.as_str().to_owned())
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent);
        let recording = server.is_recording();
        if recording {
            server.set_attributes([
                KeyValue::new("http.request.method", method.as_str().to_owned()),
                KeyValue::new("url.path", path.to_owned()),
                KeyValue::new("client.address", peer.ip().to_string()),
                KeyValue::new("client.port", i64::from(peer.port())),
                KeyValue::new("network.protocol.version", protocol_version(version)),
            ]);
        }
        let cx = parent.with_remote_span_context(server.span_context().clone());
        Box::new(RequestSpan {
            tracer: tracer.clone(),
            server,
            cx,
            recording,
            method: method.clone(),
            round_trip: recording.then(Default::default),
            client: None,
            b3,
        })
    }
}

/// The caller's context: `traceparent` first, then B3 (the single header over the multiple
/// ones), each if `extraction` reads it; with the B3 form the caller sent, if any, to send B3
/// on in (whichever context won: an upstream that reads B3 must not see the caller's).
fn extract(headers: &HeaderMap, extraction: &Extraction) -> (Context, Option<b3::Form>) {
    let wanted = &extraction.propagators;
    let form = b3_form(headers, wanted);
    if wanted.tracecontext && headers.contains_key("traceparent") {
        let cx = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
        if cx.span().span_context().is_valid() {
            return (cx, form);
        }
    }
    if form.is_none() {
        return (Context::new(), None);
    }
    let cx = B3(b3::Form::Both).extract_with_context(&Context::new(), &HeaderExtractor(headers));
    let found = cx.span().span_context().clone();
    if !found.is_valid() {
        // `b3: 0` (or `X-B3-Sampled: 0`) without ids: the caller asks for no trace. A
        // parent that is not sampled gives that (with ids of its own that go nowhere: an
        // unsampled request sends its caller's headers on untouched).
        let denied = headers.get("b3").is_some_and(|v| v.as_bytes() == b"0")
            || headers
                .get("x-b3-sampled")
                .is_some_and(|v| v.as_bytes() == b"0");
        if !denied {
            return (Context::new(), form);
        }
        let ids = RandomIdGenerator::default();
        let context = SpanContext::new(
            ids.new_trace_id(),
            ids.new_span_id(),
            TraceFlags::default(),
            true,
            TraceState::default(),
        );
        return (Context::new().with_remote_span_context(context), form);
    }
    // Only W3C's sampled bit goes on: a caller that deferred the decision is sampled as a
    // root request would be, by the ratio over a trace id tollgate draws (the caller's own
    // id is the caller's choice: one ending in 0001 would pass any ratio).
    let sampled = match found.trace_flags() & b3::DEFERRED == b3::DEFERRED {
        false => found.is_sampled(),
        true => matches!(
            Sampler::TraceIdRatioBased(extraction.ratio)
                .should_sample(
                    None,
                    RandomIdGenerator::default().new_trace_id(),
                    "",
                    &SpanKind::Server,
                    &[],
                    &[]
                )
                .decision,
            SamplingDecision::RecordAndSample
        ),
    };
    let context = SpanContext::new(
        found.trace_id(),
        found.span_id(),
        TraceFlags::default().with_sampled(sampled),
        true,
        TraceState::default(),
    );
    (Context::new().with_remote_span_context(context), form)
}

/// The B3 form the caller sent its context in, if `wanted` reads B3.
fn b3_form(headers: &HeaderMap, wanted: &Propagators) -> Option<b3::Form> {
    match (
        wanted.b3 && headers.contains_key("b3"),
        wanted.b3 && headers.contains_key("x-b3-traceid"),
    ) {
        (true, true) => Some(b3::Form::Both),
        (true, false) => Some(b3::Form::Single),
        (false, true) => Some(b3::Form::Multiple),
        (false, false) => None,
    }
}

fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

impl RequestSpan {
    /// The trace and span ids for log lines, when the request is sampled.
    pub fn ids(&self) -> Option<(opentelemetry::trace::TraceId, opentelemetry::trace::SpanId)> {
        let context = self.server.span_context();
        context
            .is_sampled()
            .then(|| (context.trace_id(), context.span_id()))
    }

    /// Whether the spans are recorded (sampled): only then do they wait for the body's end.
    pub fn recording(&self) -> bool {
        self.recording
    }

    /// A `tracing` span carrying the ids, for every line logged while the request is handled
    /// (`Span::none()` for an unsampled request). At level ERROR, so that any filter that
    /// lets a line through lets its ids through too.
    pub fn log_span(&self) -> tracing::Span {
        match self.ids() {
            Some((trace_id, span_id)) => tracing::error_span!(
                target: "tollgate::request",
                "request",
                trace_id = %trace_id,
                span_id = %span_id
            ),
            None => tracing::Span::none(),
        }
    }

    /// The route found (None: no route matched).
    pub fn routed(&mut self, route: Option<&str>) {
        if let (true, Some(route)) = (self.recording, route) {
            self.server
                .set_attribute(KeyValue::new("http.route", route.to_owned()));
            self.server
                .update_name(format!("{} {route}", self.method.as_str()));
        }
    }

    /// Where the store writes its decision call's time, for a recording span: the limit
    /// stage runs inside [`super::round_trip::timed`] with it.
    pub fn round_trip(&self) -> Option<super::round_trip::RoundTrip> {
        self.round_trip.clone()
    }

    /// The limit stage's decision: a Redis span (over the store's call, when it made one) or
    /// an event, and the server span's attributes.
    pub fn decided(&mut self, decided: DecisionSpan<'_>) {
        if !self.recording {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("tollgate.decision", decided.decision),
            KeyValue::new("tollgate.decision.detail", decided.detail),
            KeyValue::new("tollgate.key_source", decided.key_source),
        ];
        if let Some(limit) = decided.limit {
            attributes.push(KeyValue::new("tollgate.limit", limit.to_owned()));
        }
        if let Some(seconds) = decided.retry_after {
            attributes.push(KeyValue::new("tollgate.retry_after", seconds as i64));
        }
        let store = match &decided.store {
            StoreKind::None => None,
            StoreKind::Memory => Some("memory"),
            StoreKind::LocalFirst => Some("local_first"),
            StoreKind::DenyCache => Some("deny_cache"),
            StoreKind::Redis { .. } => Some("redis"),
        };
        if let Some(store) = store {
            attributes.push(KeyValue::new("tollgate.store", store));
        }
        match &decided.store {
            StoreKind::Redis { node } => {
                // The store's call alone; without one (the store known down, the breaker
                // open) the span is the moment the stage gave up.
                let timed = self
                    .round_trip
                    .as_ref()
                    .and_then(|clock| clock.lock().ok()?.take());
                let (start, end) = timed.unwrap_or_else(|| {
                    let now = SystemTime::now();
                    (now, now)
                });
                let mut span = self
                    .tracer
                    .span_builder("EVALSHA decide")
                    .with_kind(SpanKind::Client)
                    .with_start_time(start)
                    .start_with_context(&self.tracer, &self.cx);
                let (address, port) = match node.rsplit_once(':') {
                    Some((host, port)) => (host, port.parse::<i64>().ok()),
                    None => (&node[..], None),
                };
                span.set_attributes([
                    KeyValue::new("db.system", "redis"),
                    KeyValue::new("db.system.name", "redis"),
                    KeyValue::new("db.operation.name", "EVALSHA"),
                    KeyValue::new("tollgate.script", "decide.lua"),
                    KeyValue::new("server.address", address.to_owned()),
                ]);
                if let Some(port) = port {
                    span.set_attribute(KeyValue::new("server.port", port));
                }
                span.set_attributes(attributes.iter().cloned());
                if decided.store_failed {
                    span.set_status(Status::error("the store did not decide"));
                }
                span.end_with_timestamp(end);
            }
            StoreKind::None => {}
            _ => self
                .server
                .add_event("rate limit decision", attributes.clone()),
        }
        self.server.set_attributes(attributes);
    }

    /// `protect` shed the request (`shadow`: would have).
    pub fn shed(&mut self, shadow: bool) {
        if self.recording {
            self.server.set_attribute(KeyValue::new(
                "tollgate.decision",
                if shadow { "admitted" } else { "shed" },
            ));
            if shadow {
                self.server
                    .set_attribute(KeyValue::new("tollgate.decision.detail", "shadow_shed"));
            }
        }
    }

    /// The request goes to the upstream now: for a sampled request a client span starts, and
    /// `headers` carry its context (`traceparent`, and the caller's `tracestate`) in place of
    /// the caller's.
    pub fn sending(&mut self, headers: &mut HeaderMap) {
        // Not sampled: no client span, and the caller's `traceparent` (if any) goes on
        // untouched, as without tracing; the trace stays whole and no id is made.
        if !self.recording {
            return;
        }
        let mut span = self
            .tracer
            .span_builder(self.method.as_str().to_owned())
            .with_kind(SpanKind::Client)
            .start_with_context(&self.tracer, &self.cx);
        span.set_attribute(KeyValue::new(
            "http.request.method",
            self.method.as_str().to_owned(),
        ));
        let cx = self
            .cx
            .with_remote_span_context(span.span_context().clone());
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
        // The propagator writes `tracestate` even when the state is empty: an empty field says
        // nothing (W3C Trace Context), so none is sent unless there is state to carry.
        if headers
            .get("tracestate")
            .is_some_and(|value| value.as_bytes().iter().all(|b| *b == b' ' || *b == b'\t'))
        {
            headers.remove("tracestate");
        }
        if let Some(form) = self.b3 {
            // The caller's own parent and flags would be stale beside the new ids.
            headers.remove("x-b3-parentspanid");
            headers.remove("x-b3-flags");
            B3(form).inject_context(&cx, &mut HeaderInjector(headers));
        }
        self.client = Some(span);
    }

    /// The upstream answered with `status` (its client span goes on until the body's end),
    /// or did not (None: the span ends now).
    pub fn forwarded(&mut self, status: Option<u16>) {
        let Some(span) = self.client.as_mut() else {
            return;
        };
        match status {
            Some(status) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 400 {
                    span.set_status(Status::error(status.to_string()));
                }
            }
            None => {
                span.set_status(Status::error("no response from the upstream"));
                span.end();
                self.client = None;
            }
        }
    }

    /// The request failed on the way (`side`: client, upstream or store).
    pub fn failed(&mut self, side: &'static str, cause: String) {
        if self.recording {
            self.server.add_event(
                "exception",
                vec![
                    KeyValue::new("exception.type", side),
                    KeyValue::new("exception.message", cause),
                ],
            );
        }
    }

    /// The answer's status (None: the client left before the head, 499).
    pub fn responded(&mut self, status: Option<u16>) {
        if self.recording {
            match status {
                Some(status) => {
                    self.server.set_attribute(KeyValue::new(
                        "http.response.status_code",
                        i64::from(status),
                    ));
                    // A server span is an error for its own failures only (5xx), not for
                    // its callers' (4xx, 429 among them).
                    if status >= 500 {
                        self.server.set_status(Status::error(status.to_string()));
                    }
                }
                None => self
                    .server
                    .set_attribute(KeyValue::new("tollgate.client_closed", true)),
            }
        }
    }

    /// The response's body ended `how`: the upstream's client span and the server span end.
    pub fn end(mut self: Box<Self>, how: BodyEnd) {
        if let Some(mut client) = self.client.take() {
            if how == BodyEnd::Failed {
                client.set_status(Status::error("the upstream's body failed"));
            }
            client.end();
        }
        match how {
            BodyEnd::Complete => {}
            BodyEnd::ClientLeft => self
                .server
                .set_attribute(KeyValue::new("tollgate.client_closed", true)),
            BodyEnd::Failed => self.server.add_event(
                "exception",
                vec![
                    KeyValue::new("exception.type", "upstream"),
                    KeyValue::new("exception.message", "the response body failed mid-way"),
                ],
            ),
        }
        self.server.end();
    }
}
