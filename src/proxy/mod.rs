//! The request path, top to bottom in the order it happens: accept (in `server`) → route →
//! identify → limit → forward → respond. This module owns the order; each stage lives in its
//! own module.

mod access_log;
mod early_answer;
pub mod headers;
mod http1_pool;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::body::{self, LimitedBody, ProxyBody};
use crate::config::LimitSet;
use crate::config::{Config, HostMode};
use crate::control::offenders::Offenders;
use crate::control::{caller, sync, Control};
use crate::error::ProxyError;
use crate::identity;
use crate::limit::Verdict;
use crate::metrics::{Held, Metrics, RouteMetrics};
use crate::routing;
use crate::store::Stores;
use crate::throttle::headers::{self as limit_headers, Rendered};
use crate::throttle::{AdmitReason, LimitOutcome, LimitStage};
use access_log::AccessLog;
use upstream::UpstreamClient;

/// What the server knows about the connection a request came in on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub tls: bool,
}

/// The proxy: cheap to clone, one per process, shared by every connection.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    /// Swapped whole on a reload; each request keeps the snapshot it started with.
    runtime: ArcSwap<Runtime>,
    metrics: Arc<Metrics>,
    /// Upgraded (WebSocket) connections: hyper's graceful shutdown no longer sees them, so
    /// shutdown waits on this instead.
    tunnels: TaskTracker,
}

/// Everything built from one configuration.
struct Runtime {
    config: Arc<Config>,
    upstream: UpstreamClient,
    limits: LimitStage,
    /// Who is denied most (the admin's `/limits/top`); carried over reloads with the stores.
    offenders: Arc<Offenders>,
    /// The rounds of local-first limits, when any (the limit stage holds their engine).
    local_first: Option<Arc<sync::Sync>>,
    /// One per route, in route order.
    route_metrics: Vec<RouteMetrics>,
    unrouted_metrics: RouteMetrics,
}

impl Runtime {
    fn new(config: Arc<Config>, metrics: &Metrics, previous: Option<&Runtime>) -> Runtime {
        let upstream = match previous {
            Some(p) if p.config.upstream == config.upstream => p.upstream.clone(),
            _ => UpstreamClient::new(&config.upstream, config.workers),
        };
        let throttle = &config.throttle;
        let stores = Stores::new(
            &throttle.store,
            throttle.on_error,
            previous.map(|p| p.limits.stores()),
        );
        // The offenders sketch and the local-first rounds go on only with the stores they
        // counted on.
        let carried = previous.filter(|p| stores.carried_from(p.limits.stores()));
        // Registered whether or not a limit is local-first, so the dashboard's panels always
        // have their series.
        let sync_metrics = metrics.sync(throttle);
        let local_first = sync::carry_or_start(
            throttle,
            &stores,
            carried.and_then(|p| p.local_first.as_ref()),
            sync_metrics,
        );
        let offenders = carried.map_or_else(Arc::default, |p| p.offenders.clone());
        let denials = caller::new_deny_cache(&stores, &throttle.key_prefix);
        let limits = LimitStage::new(
            throttle.clone(),
            stores,
            denials,
            local_first.as_ref().map(|rounds| rounds.engine.clone()),
        );
        let route_metrics = config
            .throttle
            .routes
            .iter()
            .map(|r| metrics.route(&r.name))
            .collect();
        Runtime {
            upstream,
            limits,
            offenders,
            local_first,
            route_metrics,
            unrouted_metrics: metrics.route(crate::metrics::UNROUTED),
            config,
        }
    }
}

impl Proxy {
    pub fn new(config: Arc<Config>) -> Self {
        let metrics = Metrics::new();
        let runtime = Runtime::new(config, &metrics, None);
        Proxy {
            inner: Arc::new(Inner {
                runtime: ArcSwap::from_pointee(runtime),
                metrics,
                tunnels: TaskTracker::new(),
            }),
        }
    }

    pub fn tunnels(&self) -> &TaskTracker {
        &self.inner.tunnels
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The configuration new requests are served with.
    pub fn config(&self) -> Arc<Config> {
        self.inner.runtime.load().config.clone()
    }

    /// Swaps in a new configuration for new requests; requests in flight finish on the one they
    /// started with. Listener and admin addresses and connection settings need a restart: a
    /// change to them is reported and otherwise ignored.
    pub fn reload(&self, config: Config) {
        let previous = self.inner.runtime.load_full();
        let old = &previous.config;
        if old
            .listeners
            .iter()
            .map(|l| (l.address, l.tls.as_ref().map(|t| (&t.cert, &t.key))))
            .ne(config
                .listeners
                .iter()
                .map(|l| (l.address, l.tls.as_ref().map(|t| (&t.cert, &t.key)))))
            || old.admin != config.admin
            || old.header_read_timeout != config.header_read_timeout
            || old.max_connections != config.max_connections
            || old.workers != config.workers
            || old.http2_max_concurrent_streams != config.http2_max_concurrent_streams
            || old.shutdown_timeout != config.shutdown_timeout
            || old.idle_timeout != config.idle_timeout
        {
            tracing::warn!("listen, admin and connection settings changed: they take effect after a restart; the rest is reloaded");
        }
        let runtime = Runtime::new(Arc::new(config), &self.inner.metrics, Some(&previous));
        self.inner.runtime.store(Arc::new(runtime));
        self.inner.metrics.reloaded(true);
        tracing::info!(
            routes = self.config().throttle.routes.len(),
            "configuration reloaded"
        );
    }

    /// The stores, deny cache and top-offenders sketch of the running configuration, for the
    /// admin endpoints.
    pub fn throttle_control(&self) -> Control {
        let runtime = self.inner.runtime.load();
        Control::new(&runtime.limits, runtime.offenders.clone())
    }

    /// Whether this instance should receive traffic as far as the store is concerned: a store
    /// that cannot be reached matters only when `on_error: deny` would refuse everything.
    pub fn store_ready(&self) -> bool {
        let runtime = self.inner.runtime.load();
        let stores = runtime.limits.stores();
        stores.ready() || stores.on_error() != crate::config::OnError::Deny
    }

    /// Handles one request, in order: route → identify → limit → forward → respond. Never
    /// fails: every error becomes a response.
    ///
    /// Takes the proxy by value so that the future owns everything it uses and can be
    /// served without being boxed (see `conn`).
    pub async fn handle<B>(self, request: Request<B>, conn: ConnInfo) -> Response<AnswerBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let started = Instant::now();
        // Counts the request in flight however it ends (including the client leaving).
        let _inflight = Held::new(&self.inner.metrics.inflight);
        let runtime = self.inner.runtime.load_full();
        let config = &runtime.config;
        let (parts, body) = request.into_parts();
        let mut log = AccessLog::new(&parts, started, config.access_log);
        // One pass over the request's headers answers what the path asks of them.
        let found = headers::scan(&parts.headers);
        // tollgate's own answers to a gRPC call are sent as gRPC (see `grpc`).
        let grpc = found.content_type && crate::grpc::is_grpc(&parts.headers);

        // Route.
        let route_index = routing::position(&config.throttle.routes, &parts);
        let metrics = match route_index {
            Some(i) => &runtime.route_metrics[i],
            None => &runtime.unrouted_metrics,
        };

        // Identify and limit.
        let render = |set: &LimitSet, verdicts: &[Verdict]| {
            limit_headers::render_limited(&config.throttle.response, set, verdicts)
        };
        let outcome = match route_index.map(|i| &config.throttle.routes[i]) {
            None => None,
            Some(route) => {
                log.route = Some(route.clone());
                let client_ip = identity::client_ip(
                    conn.peer.ip(),
                    &parts.headers,
                    &config.throttle.trusted_proxies,
                );
                let outcome = runtime.limits.check(route, &parts, client_ip, render).await;
                self.inner
                    .metrics
                    .limit_check_duration
                    .record(started.elapsed().as_secs_f64());
                log.identity = outcome.identity();
                Some(outcome)
            }
        };

        // Count, as soon as it is decided (a client that leaves while the upstream answers
        // was still admitted).
        let counted = Counted::of(outcome.as_ref());
        counted.record(&self.inner.metrics, metrics);
        if let Some((set, key)) = outcome.as_ref().and_then(LimitOutcome::denied) {
            runtime
                .offenders
                .record_denial(&config.throttle.key_prefix, set, key);
        }
        log.decision = counted.decision();
        let admitted = match outcome {
            None => None,
            Some(LimitOutcome::Admitted {
                set,
                verdicts,
                leases,
                mut settlement,
                ..
            }) => {
                if let Some(settlement) = settlement.as_mut() {
                    settlement.count_in(&metrics.settlement);
                }
                Some((set, verdicts, leases, settlement))
            }
            Some(LimitOutcome::Limited { set, verdicts, .. }) => {
                return refuse(limited_response(render(set, &verdicts)), &log, grpc, true);
            }
            Some(LimitOutcome::LimitedFromCache { rendered, .. }) => {
                return refuse(limited_response(rendered), &log, grpc, true);
            }
            Some(LimitOutcome::StoreUnavailable { .. }) => {
                return refuse(
                    ProxyError::StoreUnavailable.into_response(),
                    &log,
                    grpc,
                    false,
                );
            }
        };

        // Forward.
        let peer_is_trusted = config.throttle.trusted_proxies.contains(conn.peer.ip());
        // Without a route nothing happened since `started` worth a clock read of its own.
        let upstream_started = if route_index.is_some() {
            Instant::now()
        } else {
            started
        };
        // Prepared and finished here by plain functions, awaited in this one future: each
        // nested async function keeps its own copy of the request in a future that is moved
        // as it is built (measured in docs/performance.md).
        let forwarded = match outbound(config, parts, body, found, conn, peer_is_trusted) {
            Ok((upstream_request, returning)) => {
                let answered = runtime.upstream.send(upstream_request).await;
                self.inbound(returning, answered)
            }
            Err(error) => Err(error),
        };
        // False when tollgate answered itself (an error on the way): such an answer settles
        // nothing and is translated for gRPC clients.
        let from_upstream = forwarded.is_ok();
        let mut response = match forwarded {
            Ok(response) => {
                let elapsed = upstream_started.elapsed();
                self.inner
                    .metrics
                    .upstream_duration
                    .record(elapsed.as_secs_f64());
                metrics.upstream_response(response.status().as_u16());
                log.upstream = Some(elapsed);
                response
            }
            Err(error) => {
                let status = error.status().as_u16();
                if error.source_side() == "upstream" {
                    metrics.upstream_response(status);
                }
                log.upstream = Some(upstream_started.elapsed());
                match &error {
                    ProxyError::BadRequest(_) | ProxyError::BodyTooLarge { .. } => {
                        tracing::info!(method = %log.method, path = %log.path(), peer = %conn.peer, status, side = error.source_side(), cause = %error, "request refused")
                    }
                    _ => {
                        tracing::warn!(method = %log.method, path = %log.path(), peer = %conn.peer, status, side = error.source_side(), cause = %error, source = ?std::error::Error::source(&error), "request failed")
                    }
                }
                error.into_response().map(AnswerBody::Right)
            }
        };

        // Respond.
        if let Some((set, verdicts, leases, settlement)) = admitted {
            if let Some(settlement) = settlement {
                // count_statuses settles on this head, cost_from_response at the body's end.
                response = settlement
                    .on_response(response.map(boxed_answer), from_upstream)
                    .map(AnswerBody::Right);
            }
            if !verdicts.is_empty() {
                limit_headers::add_fields(
                    response.headers_mut(),
                    &config.throttle.response,
                    set,
                    &verdicts,
                    false,
                );
            }
            if let Some(leases) = leases {
                // The slots are held until the response body is done (or the client leaves).
                let (parts, body) = response.into_parts();
                let body = body::with_guard(boxed_answer(body), leases);
                response = Response::from_parts(parts, AnswerBody::Right(body));
            }
        }
        log.finish(response.status().as_u16(), log.upstream);
        if grpc && !from_upstream {
            // After the log, which keeps the HTTP status tollgate chose.
            response =
                crate::grpc::translate(response.map(boxed_answer), false).map(AnswerBody::Right);
        }
        response
    }

    /// The upstream's answer as the client receives it: a refused oversized upload as 413, a
    /// switch of protocols with its tunnel started, hop-by-hop headers removed.
    fn inbound(
        &self,
        returning: Returning,
        answered: Result<Response<upstream::UpstreamBody>, ProxyError>,
    ) -> Result<Response<AnswerBody>, ProxyError> {
        let mut response = match answered {
            Ok(response) => response,
            Err(error) => {
                return Err(match returning.exceeded {
                    Some((flag, limit)) if flag.load(Ordering::Acquire) => {
                        ProxyError::BodyTooLarge { limit }
                    }
                    _ => error,
                })
            }
        };

        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_upgrade) = returning.client_upgrade {
                crate::upgrade::spawn_tunnel(&self.inner.tunnels, client_upgrade, &mut response);
            }
            let (parts, _) = response.into_parts();
            return Ok(Response::from_parts(
                parts,
                AnswerBody::Right(body::empty()),
            ));
        }

        let (mut parts, incoming) = response.into_parts();
        let mut found = headers::scan(&parts.headers);
        headers::remove_hop_by_hop(&mut parts.headers, false, &mut found);
        Ok(Response::from_parts(parts, AnswerBody::Left(incoming)))
    }
}

/// The body of every response the proxy sends: `Left`, the upstream's own, passed through as
/// it is (no allocation, no dynamic call per frame: the common case), or `Right`, one tollgate
/// made or wrapped (its answers, settlements, concurrency leases).
pub type AnswerBody = http_body_util::Either<upstream::UpstreamBody, ProxyBody>;

/// An answer's body as a [`ProxyBody`], for what wraps any body.
fn boxed_answer(body: AnswerBody) -> ProxyBody {
    match body {
        AnswerBody::Left(upstream) => body::boxed(upstream),
        AnswerBody::Right(own) => own,
    }
}

/// What the way back needs to know about the request that went out.
struct Returning {
    /// The client's side of a protocol upgrade, for the tunnel.
    client_upgrade: Option<crate::upgrade::ClientSide>,
    /// With `max_request_body`: raised when the request body passed it on its way out.
    exceeded: Option<(Arc<std::sync::atomic::AtomicBool>, u64)>,
}

/// The request as the upstream receives it: a declared oversized body refused before anything
/// is sent, the origin-form target, hop-by-hop headers removed, X-Forwarded-* added, Host as
/// configured, the body bounded by `max_request_body` while it streams.
fn outbound<B>(
    config: &Config,
    mut parts: http::request::Parts,
    incoming: B,
    mut found: headers::Found,
    conn: ConnInfo,
    peer_is_trusted: bool,
) -> Result<(Request<ProxyBody>, Returning), ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<body::BoxError>,
{
    let upstream = &config.upstream;

    // Refuse a declared oversized body before anything reaches the upstream.
    let limit = config.max_request_body;
    if let Some(limit) = limit {
        if content_length(&parts.headers).is_some_and(|length| length > limit) {
            return Err(ProxyError::BodyTooLarge { limit });
        }
    }

    let upgrade =
        parts.version == Version::HTTP_11 && headers::is_upgrade_request(&parts.headers, &found);
    if upgrade && upstream.http2 {
        return Err(ProxyError::BadRequest(
            "protocol upgrades need an HTTP/1.1 upstream",
        ));
    }
    let client_upgrade = crate::upgrade::client_side(&mut parts, upgrade);

    // The client's Host, and whether it is the request's one and only Host line (then
    // preserving it needs no rewrite).
    let sole_host_line = found.host_lines == 1;
    let client_host = found.host.take().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });

    parts.uri = origin_form(std::mem::take(&mut parts.uri))?;
    parts.version = if upstream.http2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    headers::remove_hop_by_hop(&mut parts.headers, upgrade, &mut found);
    // Room for the three X-Forwarded headers at once: hyper sizes the map for the
    // headers it parsed, and growing it twice rehashes it twice.
    parts.headers.reserve(3);
    headers::add_forwarded(
        &mut parts.headers,
        &found,
        conn.peer.ip(),
        if conn.tls { "https" } else { "http" },
        client_host.as_ref(),
        peer_is_trusted,
    );
    match (upstream.host, &client_host) {
        // The client's one Host line goes on as it is.
        (HostMode::Preserve, Some(_)) if !upstream.http2 && sole_host_line => {}
        (HostMode::Preserve, Some(host)) if !upstream.http2 => {
            parts.headers.insert(header::HOST, host.clone());
        }
        // hyper sets Host (HTTP/1.1) or :authority (HTTP/2) from the URI.
        _ => {
            parts.headers.remove(header::HOST);
        }
    }

    let (body, exceeded) = match limit {
        Some(limit) => {
            let (body, flag) = LimitedBody::new(incoming, limit);
            (body::boxed(body), Some((flag, limit)))
        }
        None => (body::boxed(incoming), None),
    };
    let returning = Returning {
        client_upgrade,
        exceeded,
    };
    Ok((Request::from_parts(parts, body), returning))
}

/// How a request is counted, worked out once from the limit stage's outcome (None: no route
/// matched): the access log's `decision` and the counters that go up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
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
}

impl Counted {
    fn of(outcome: Option<&LimitOutcome<'_>>) -> Counted {
        match outcome {
            None => Counted::Allowed,
            Some(LimitOutcome::Admitted { reason, .. }) => match reason {
                AdmitReason::Allowed => Counted::Allowed,
                AdmitReason::Exempt => Counted::Exempt,
                AdmitReason::ShadowLimited => Counted::ShadowLimited,
                AdmitReason::StoreError | AdmitReason::LocalFallback => Counted::StoreError,
            },
            Some(LimitOutcome::Limited {
                local_fallback: true,
                ..
            }) => Counted::LimitedByFallback,
            Some(LimitOutcome::Limited { .. } | LimitOutcome::LimitedFromCache { .. }) => {
                Counted::Limited
            }
            Some(LimitOutcome::StoreUnavailable { .. }) => Counted::StoreError,
        }
    }

    /// The access log's `decision` field.
    fn decision(self) -> &'static str {
        match self {
            Counted::Allowed => "allowed",
            Counted::Exempt => "exempt",
            Counted::ShadowLimited => "shadow_limited",
            Counted::StoreError => "store_error",
            Counted::Limited | Counted::LimitedByFallback => "limited",
        }
    }

    /// Store errors count twice: once in total and once on the route they hit.
    fn record(self, global: &Metrics, route: &RouteMetrics) {
        match self {
            Counted::Allowed | Counted::Exempt => route.allowed.increment(1),
            Counted::ShadowLimited => route.shadow_limited.increment(1),
            Counted::StoreError => {
                global.store_errors.increment(1);
                route.store_error.increment(1);
            }
            Counted::Limited => route.limited.increment(1),
            Counted::LimitedByFallback => {
                global.store_errors.increment(1);
                route.limited.increment(1);
            }
        }
    }
}

/// Answers a request the limit stage refused, without forwarding it. The access log keeps
/// the HTTP status tollgate chose; a gRPC call then gets the answer as a trailers-only gRPC
/// response (see `grpc`), RESOURCE_EXHAUSTED when `limited`.
fn refuse(
    response: Response<ProxyBody>,
    log: &AccessLog,
    grpc: bool,
    limited: bool,
) -> Response<AnswerBody> {
    log.finish(response.status().as_u16(), None);
    let response = if grpc {
        crate::grpc::translate(response, limited)
    } else {
        response
    };
    response.map(AnswerBody::Right)
}

/// A limited response as the client receives it.
fn limited_response(rendered: Rendered) -> Response<ProxyBody> {
    let mut response = Response::new(body::full(rendered.body));
    *response.status_mut() = rendered.status;
    *response.headers_mut() = rendered.headers;
    response
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The request's own path and query, as HTTP/1.1 sends it to an origin server; the upstream
/// client adds the upstream's scheme and authority where its protocol needs them.
fn origin_form(uri: Uri) -> Result<Uri, ProxyError> {
    // Already origin-form (what HTTP/1.1 clients send): forwarded as it is, without a copy.
    if uri.scheme().is_none() && uri.authority().is_none() && uri.path().starts_with('/') {
        return Ok(uri);
    }
    let path_and_query = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !path_and_query.as_str().starts_with('/') {
        // `OPTIONS *` and absolute-form oddities: nothing sensible to forward.
        return Err(ProxyError::BadRequest("the request target must be a path"));
    }
    Ok(Uri::from(path_and_query))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_gets_the_path_and_query_whatever_form_the_target_had() {
        let forwarded = |target: &str| origin_form(target.parse().unwrap()).map(|u| u.to_string());
        // Origin-form, what HTTP/1.1 clients send, goes on as it is.
        assert_eq!(forwarded("/a/b?c=d").unwrap(), "/a/b?c=d");
        assert_eq!(forwarded("/").unwrap(), "/");
        // Absolute-form (proxies' requests) loses the scheme and authority.
        assert_eq!(forwarded("http://example.com/a?b=c").unwrap(), "/a?b=c");
        assert_eq!(forwarded("http://example.com").unwrap(), "/");
        // `OPTIONS *` has no path to forward.
        assert!(matches!(forwarded("*"), Err(ProxyError::BadRequest(_))));
    }

    fn admitted(set: &LimitSet, reason: AdmitReason) -> LimitOutcome<'_> {
        LimitOutcome::Admitted {
            set,
            identity: "header",
            verdicts: Vec::new(),
            reason,
            leases: None,
            settlement: None,
        }
    }

    fn limited(set: &LimitSet, local_fallback: bool) -> LimitOutcome<'_> {
        LimitOutcome::Limited {
            set,
            identity: "header",
            verdicts: Vec::new(),
            local_fallback,
            key: String::new(),
        }
    }

    /// Each outcome maps to one access-log decision and one set of counters, as they always
    /// were: store errors also count in total, a fallback's denial is limited and an error.
    #[test]
    fn each_outcome_is_counted_once_as_it_always_was() {
        let set = LimitSet::new("api", None, Vec::new(), true);
        let cached = LimitOutcome::LimitedFromCache {
            set: &set,
            identity: "header",
            rendered: Rendered {
                status: StatusCode::TOO_MANY_REQUESTS,
                headers: Default::default(),
                body: Bytes::new(),
            },
            key: String::new(),
        };
        let cases = [
            (None, "allowed", "allowed", 0),
            (
                Some(admitted(&set, AdmitReason::Allowed)),
                "allowed",
                "allowed",
                0,
            ),
            (
                Some(admitted(&set, AdmitReason::Exempt)),
                "exempt",
                "allowed",
                0,
            ),
            (
                Some(admitted(&set, AdmitReason::ShadowLimited)),
                "shadow_limited",
                "shadow_limited",
                0,
            ),
            (
                Some(admitted(&set, AdmitReason::StoreError)),
                "store_error",
                "store_error",
                1,
            ),
            (
                Some(admitted(&set, AdmitReason::LocalFallback)),
                "store_error",
                "store_error",
                1,
            ),
            (Some(limited(&set, false)), "limited", "limited", 0),
            (Some(limited(&set, true)), "limited", "limited", 1),
            (Some(cached), "limited", "limited", 0),
            (
                Some(LimitOutcome::StoreUnavailable { identity: "header" }),
                "store_error",
                "store_error",
                1,
            ),
        ];
        for (outcome, decision, counter, store_errors) in cases {
            let counted = Counted::of(outcome.as_ref());
            assert_eq!(counted.decision(), decision, "{counted:?}");
            let metrics = Metrics::new();
            counted.record(&metrics, &metrics.route("api"));
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
            let errors = format!("tollgate_store_errors_total {store_errors}");
            assert!(
                text.contains(&errors),
                "{counted:?}: missing {errors:?} in\n{text}"
            );
        }
    }
}
