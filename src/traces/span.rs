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
//! A request the sampler leaves out builds no attributes and no client span: its upstream
//! request keeps the caller's `traceparent` (if any) untouched, as without tracing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, Method, Version};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, Span};

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
    /// When the decision started (the route was found).
    deciding: Option<SystemTime>,
    client: Option<Span>,
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
    ) -> Box<RequestSpan> {
        let parent = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
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
            deciding: None,
            client: None,
        })
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
    pub fn ids(&self) -> Option<(String, String)> {
        let context = self.server.span_context();
        context.is_sampled().then(|| {
            (
                context.trace_id().to_string(),
                context.span_id().to_string(),
            )
        })
    }

    /// The route found (None: no route matched); the decision starts now.
    pub fn routed(&mut self, route: Option<&str>) {
        self.deciding = Some(SystemTime::now());
        if let (true, Some(route)) = (self.recording, route) {
            self.server
                .set_attribute(KeyValue::new("http.route", route.to_owned()));
            self.server
                .update_name(format!("{} {route}", self.method.as_str()));
        }
    }

    /// The limit stage's decision: a Redis span or an event, and the server span's attributes.
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
                let mut span = self
                    .tracer
                    .span_builder("EVALSHA decide")
                    .with_kind(SpanKind::Client)
                    .with_start_time(self.deciding.unwrap_or_else(SystemTime::now))
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
                span.end();
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
        self.client = Some(span);
    }

    /// The upstream answered with `status`, or did not (None).
    pub fn forwarded(&mut self, status: Option<u16>) {
        let Some(mut span) = self.client.take() else {
            return;
        };
        if self.recording {
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
                None => span.set_status(Status::error("no response from the upstream")),
            }
        }
        span.end();
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

    /// The answer's status (None: the client left first, 499); the server span ends.
    pub fn finish(mut self: Box<Self>, status: Option<u16>) {
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
        self.server.end();
    }
}
