//! The request path, top to bottom in the order it happens: accept (in `server`) → route
//! ([`routing::Routed`]) → identify ([`identity::caller::Caller`]) → limit ([`LimitOutcome`]) →
//! protect (a [`protect::Slot`], with a `protect` section) → forward
//! (`Result<Forwarded, ProxyError>`) → respond. This module owns the order; each stage
//! lives in its own module. One `RequestRecord` per request (see `record`) collects what the
//! stages found and writes it once to the metrics, the access log and `tracing`. A request to
//! the configured `usage` path is answered before routing, by [`crate::usage`], and never
//! forwarded.

mod early_answer;
mod exchange;
pub mod headers;
mod http1_pool;
mod record;
pub mod shape;
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
use crate::config::{Config, HostMode, ResponseConfig};
use crate::control::offenders::Offenders;
use crate::control::{caller, sync, Control};
use crate::error::ProxyError;
use crate::identity;
use crate::metrics::{Metrics, RouteMetrics};
use crate::protect::{self, Admission, Protector};
use crate::routing::{self, Routed};
use crate::store::Stores;
use crate::throttle::headers as limit_headers;
use crate::throttle::settle::Delivery;
use crate::throttle::{Admitted, Denial, LimitOutcome, LimitStage, Limited};
use exchange::Held;
use record::RequestRecord;
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
    /// Upstream exchanges (and response bodies) whose client left while they held
    /// something for the limits (see `exchange`): shutdown waits for them too.
    orphans: TaskTracker,
    /// The usage endpoint's own rate, kept over reloads.
    usage_rate: crate::usage::OwnRate,
    /// Trace export (`tracing`); None: off, and no request builds a span.
    tracing: Option<Arc<crate::traces::Tracing>>,
}

/// Everything built from one configuration.
struct Runtime {
    config: Arc<Config>,
    upstream: UpstreamClient,
    limits: LimitStage,
    /// Who is denied most (the admin's `/limits/top`); carried over reloads with the stores.
    offenders: Arc<Offenders>,
    /// Callers' peak rates per route (`/limits/suggest`); carried over reloads as the sketch.
    suggest: Arc<crate::suggest::Suggest>,
    /// The rounds of local-first limits, when any (the limit stage holds their engine).
    local_first: Option<Arc<sync::Sync>>,
    /// One per route, in route order.
    route_metrics: Vec<RouteMetrics>,
    unrouted_metrics: RouteMetrics,
    /// The app's protection (`protect`): carried over reloads with what it learned.
    protect: Option<Arc<Protector>>,
    /// The Redis node decisions go to, as traces name it.
    trace_redis: Option<Arc<str>>,
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
        if stores.is_shared() {
            let overrides = crate::control::overrides::hash_key(&throttle.key_prefix);
            stores.persistence().configure(throttle, overrides);
        }
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
        // With Redis, the sketch publishes for the fleet's `/limits/top` under this prefix.
        offenders.link(stores.shared_slot(), &throttle.key_prefix);
        // Carried only under the same key prefix: its caller hashes are keyed from it.
        let suggest = carried
            .filter(|p| p.suggest.prefix() == throttle.key_prefix)
            .map_or_else(
                || Arc::new(crate::suggest::Suggest::new(&throttle.key_prefix)),
                |p| p.suggest.clone(),
            );
        suggest.link(stores.shared_slot(), &throttle.key_prefix);
        let denials = caller::new_deny_cache(&stores, &throttle.key_prefix);
        let overrides = crate::control::overrides::new_overrides(&stores, throttle);
        let limits = LimitStage::new(
            throttle.clone(),
            stores,
            denials,
            local_first.as_ref().map(|rounds| rounds.engine.clone()),
        )
        .with_overrides(overrides);
        let route_metrics = config
            .throttle
            .routes
            .iter()
            .map(|r| metrics.route(&r.name))
            .collect();
        let protect = config.protect.as_ref().map(|settings| {
            match previous.and_then(|p| p.protect.as_ref()) {
                Some(carried) => {
                    carried.reconfigure(settings);
                    carried.clone()
                }
                None => Protector::new(settings, metrics.protect()),
            }
        });
        Runtime {
            trace_redis: crate::traces::redis_node(&throttle.store),
            upstream,
            limits,
            protect,
            offenders,
            suggest,
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
        let tracing = config.traces.as_ref().and_then(|traces| {
            match crate::traces::Tracing::start(traces, metrics.traces()) {
                Ok(tracing) => {
                    tracing::info!(endpoint = %traces.endpoint, protocol = traces.protocol.as_str(), "traces: exporting spans");
                    Some(Arc::new(tracing))
                }
                Err(why) => {
                    tracing::error!("traces: not exported: {why}");
                    None
                }
            }
        });
        let runtime = Runtime::new(config, &metrics, None);
        Proxy {
            inner: Arc::new(Inner {
                runtime: ArcSwap::from_pointee(runtime),
                metrics,
                tunnels: TaskTracker::new(),
                orphans: TaskTracker::new(),
                usage_rate: crate::usage::OwnRate::default(),
                tracing,
            }),
        }
    }

    pub fn tunnels(&self) -> &TaskTracker {
        &self.inner.tunnels
    }

    /// Exchanges that outlived their client (see `exchange`).
    pub fn orphans(&self) -> &TaskTracker {
        &self.inner.orphans
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// `/metrics`: the metrics, with the keys the running configuration holds in process
    /// memory read now.
    pub fn render_metrics(&self) -> String {
        let runtime = self.inner.runtime.load();
        let memory = match runtime.limits.stores().memory() {
            crate::limit::Store::Memory(m) => Some((m.len(), m.evicted())),
            crate::limit::Store::Redis(_) => None,
        };
        let local_first = runtime
            .limits
            .local_first()
            .map(|engine| (engine.len(), engine.evicted()));
        self.inner.metrics.key_tables(memory, local_first);
        self.inner.metrics.render()
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
            || old.traces != config.traces
        {
            tracing::warn!("listen, admin, connection and tracing settings changed: they take effect after a restart; the rest is reloaded");
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

    /// The record of callers' peak rates and the running configuration's limits, for
    /// `/limits/suggest`.
    pub fn suggest(&self) -> (Arc<crate::suggest::Suggest>, Arc<Config>) {
        let runtime = self.inner.runtime.load();
        (runtime.suggest.clone(), runtime.config.clone())
    }

    /// The running configuration's store state (the admin console's store health).
    pub fn store_health(&self) -> crate::store::Health {
        self.inner.runtime.load().limits.stores().health()
    }

    /// The running configuration's store persistence check (the console's store panel).
    pub fn store_persistence(&self) -> serde_json::Value {
        self.inner
            .runtime
            .load()
            .limits
            .stores()
            .persistence()
            .json()
    }

    /// Whether this instance should receive traffic as far as the store is concerned: a store
    /// that cannot be reached matters only when `on_error: deny` would refuse everything.
    pub fn store_ready(&self) -> bool {
        let runtime = self.inner.runtime.load();
        let stores = runtime.limits.stores();
        stores.ready() || stores.on_error() != crate::config::OnError::Deny
    }

    /// Sends the spans still queued, within `timeout` (shutdown).
    pub async fn flush_traces(&self, timeout: std::time::Duration) {
        if let Some(tracing) = self.inner.tracing.clone() {
            // The provider's shutdown blocks until the export thread answers.
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown(timeout)).await;
        }
    }

    /// The app's protection of the running configuration, for the admin's `/protect`.
    pub fn protector(&self) -> Option<Arc<Protector>> {
        self.inner.runtime.load().protect.clone()
    }

    /// Handles one request, in order: route → identify → limit → protect → forward → respond.
    /// Never fails: every error becomes a response.
    ///
    /// Takes the proxy by value so that the future owns everything it uses and can be
    /// served without being boxed (see `conn`). The stages are plain functions awaited in this
    /// one future: a nested async function would keep its own copy of the request in a
    /// future of its own, moved as it is built.
    ///
    /// With traces on, the request's spans start here, and a sampled request's future runs in
    /// a `tracing` span carrying their ids, so that every line logged while it is handled
    /// carries them (`Span::none()` otherwise: a check per poll).
    pub fn handle<B>(
        self,
        request: Request<B>,
        conn: ConnInfo,
    ) -> tracing::instrument::Instrumented<impl std::future::Future<Output = Response<AnswerBody>>>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let trace = self.inner.tracing.as_ref().map(|tracing| {
            tracing.request(
                request.method(),
                request.uri().path(),
                request.version(),
                request.headers(),
                conn.peer,
            )
        });
        let log_span = trace
            .as_ref()
            .map_or_else(tracing::Span::none, |trace| trace.log_span());
        tracing::Instrument::instrument(self.serve(request, conn, trace), log_span)
    }

    /// [`Proxy::handle`]'s future: `trace` holds the request's spans, with traces on.
    async fn serve<B>(
        self,
        request: Request<B>,
        conn: ConnInfo,
        trace: Option<Box<crate::traces::RequestSpan>>,
    ) -> Response<AnswerBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let runtime = self.inner.runtime.load_full();
        let config = &runtime.config;
        let (parts, body) = request.into_parts();
        // Written once when this future ends, however it ends (the client may leave).
        let mut record =
            RequestRecord::new(&self.inner.metrics, &parts, conn.peer, config.access_log);
        if let Some(trace) = trace {
            record.traced(trace, runtime.trace_redis.as_ref());
        }
        // One pass over the request's headers answers what the path asks of them.
        let found = headers::scan(&parts.headers);
        // tollgate's own answers to a gRPC call are sent as gRPC (see `grpc`).
        let grpc = found.content_type && crate::grpc::is_grpc(&parts.headers);

        // Shapes no app should see, and CONNECT, are refused before anything else (see `shape`).
        if let Some(refusal) = shape::check(&parts, &found) {
            record.routed(None, &runtime.unrouted_metrics);
            record.rejected();
            return refuse(refusal.response(), &mut record, grpc, false);
        }

        // A caller asking for its own usage is answered here, before any route (see `usage`).
        if let Some(usage) = &config.usage {
            if parts.uri.path() == usage.path {
                record.routed(None, &runtime.unrouted_metrics);
                // Boxed: the store read's future would otherwise size every request's.
                let answer = crate::usage::answer(
                    &runtime.limits,
                    &parts,
                    conn.peer.ip(),
                    &self.inner.usage_rate,
                );
                let response = Box::pin(answer).await;
                record.answered(response.status());
                return response.map(AnswerBody::Right);
            }
        }

        // Route: the route of the request's own method, and any other a method it names in
        // an override reaches (counted too: the app may serve it as that method).
        let (routed, also) = routing::routes_of(&config.throttle.routes, &parts);
        record.routed(routed.map(|r| r.route), runtime.route_metrics(routed));

        // Identify and limit.
        let mut admitted = match routed {
            None => None,
            Some(routed) => {
                let throttle = &config.throttle;
                // The routes reached only by an override are decided first: a caller over one
                // of them is refused before its own route takes anything.
                let mut also_held = Held::default();
                for other in also {
                    let caller = identity::caller::identify(
                        &parts,
                        conn.peer.ip(),
                        &throttle.trusted_proxies,
                    )
                    .counting_refusals_in(&runtime.route_metrics[other.index].refusals);
                    // Boxed: the rare case, whose future would otherwise size every request's.
                    let limiting = runtime.limits.limit(other.route, caller);
                    let outcome = match record.round_trip() {
                        Some(clock) => {
                            Box::pin(crate::traces::round_trip::timed(clock, limiting)).await
                        }
                        None => Box::pin(limiting).await,
                    };
                    record.decided(&outcome);
                    record.store_cause(|| runtime.limits.stores().cause());
                    match runtime.admitted_or_refused(outcome, other) {
                        Ok(mut admitted) => also_held.join(Held::take_from(&mut admitted)),
                        Err((response, limited)) => {
                            record.routed(Some(other.route), runtime.route_metrics(Some(other)));
                            return refuse(*response, &mut record, grpc, limited);
                        }
                    }
                }
                let caller =
                    identity::caller::identify(&parts, conn.peer.ip(), &throttle.trusted_proxies)
                        .counting_refusals_in(&runtime.route_metrics[routed.index].refusals);
                let limiting = runtime.limits.limit(routed.route, caller);
                // A recorded trace times the store's call (its Redis span); boxed, as the
                // rarer case whose future would otherwise size every request's.
                let outcome = match record.round_trip() {
                    Some(clock) => {
                        Box::pin(crate::traces::round_trip::timed(clock, limiting)).await
                    }
                    None => limiting.await,
                };
                record.decided(&outcome);
                record.store_cause(|| runtime.limits.stores().cause());
                match runtime.admitted_or_refused(outcome, routed) {
                    Ok(mut admitted) => {
                        if !also_held.is_empty() {
                            let mut held = Held::take_from(&mut admitted);
                            held.join(also_held);
                            admitted.leases = held.leases;
                            admitted.settlement = held.settlement;
                        }
                        Some(admitted)
                    }
                    Err((response, limited)) => {
                        return refuse(*response, &mut record, grpc, limited);
                    }
                }
            }
        };

        // Protect: after the limits, so a caller over its quota never takes a slot.
        let slot = match &runtime.protect {
            None => None,
            Some(protector) => {
                let priority = admitted
                    .as_ref()
                    .map_or(crate::config::Priority::Normal, |a| a.set.priority);
                let admission = match protector.try_admit(priority) {
                    Ok(admission) => admission,
                    // Boxed: waiting is the rare case, and its timer would size every future.
                    Err(ticket) => Box::pin(ticket.wait()).await,
                };
                match admission {
                    Admission::Admitted(slot) => {
                        if slot.would_shed() {
                            record.shed(true);
                        }
                        Some(slot)
                    }
                    Admission::Shed => {
                        record.shed(false);
                        // Never reached the app: the units are back before the answer goes.
                        if let Some(owed) = admitted.as_mut().and_then(|a| a.settlement.take()) {
                            Box::pin(owed.give_back()).await;
                        }
                        return refuse(overloaded_response(), &mut record, grpc, false);
                    }
                }
            }
        };

        // Forward. What the request holds for its limits (and its overload slot) stays held
        // until the app answered, even if the client leaves first (see `exchange`).
        // Without a route nothing happened since the start worth a clock read of its own.
        let upstream_started = match routed {
            Some(_) => Instant::now(),
            None => record.started(),
        };
        let mut held = admitted
            .as_mut()
            .map_or_else(Held::default, Held::take_from);
        // The slot is the app's until its head arrives, not until the body ends.
        held.until_head = slot.map(|slot| Box::new(slot) as Box<dyn exchange::UntilHead>);
        let peer_is_trusted = config.throttle.trusted_proxies.contains(conn.peer.ip());
        let upgrades = routed.map(|r| &r.route.upgrades[..]);
        let (forwarded, outcome) =
            match outbound(config, parts, body, found, conn, peer_is_trusted, upgrades) {
                Ok((mut upstream_request, returning)) => {
                    record.sending(upstream_request.headers_mut());
                    let sending = runtime.upstream.send(upstream_request);
                    let drain_for = runtime.upstream.timeout();
                    let answered;
                    (answered, held) =
                        exchange::exchange(sending, held, &self.inner.orphans, drain_for).await;
                    let outcome = exchange::outcome_of(&answered);
                    (self.inbound(returning, answered), outcome)
                }
                Err(error) => (Err(error), Delivery::NotSent),
            };
        let status = forwarded.as_ref().ok().map(Response::status);
        record.forwarded(upstream_started.elapsed(), status);

        // Respond. Only a request that settles or holds slots waits here, in a boxed future:
        // inline, its future would size every request's (moved, so copied, each time).
        let from_upstream = forwarded.is_ok();
        let response = match forwarded {
            Ok(response) => response,
            Err(error) => record.failed(error).map(AnswerBody::Right),
        };
        let response = match admitted {
            None => response,
            Some(admitted) if held.settlement.is_none() && held.leases.is_none() => {
                with_limit_fields(&runtime, &admitted, response)
            }
            Some(admitted) => {
                let settling = self.settle_and_hold(&runtime, admitted, held, outcome, response);
                Box::pin(settling).await
            }
        };
        answered(response, &mut record, grpc && !from_upstream)
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
            // Only to a protocol the request was let through with: anything else would be a
            // tunnel nobody allowed.
            let allowed = returning
                .upgrade
                .as_ref()
                .is_some_and(|offered| crate::upgrade::answers(response.headers(), offered));
            if !allowed {
                return Err(ProxyError::Upstream(
                    "the upstream switched to a protocol the request was not allowed".into(),
                ));
            }
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
        // As on the way out: the body is still in any coding besides chunked.
        let codings = match returning.client_http11 {
            true => headers::codings_besides_chunked(&parts.headers, &found),
            false => None,
        };
        headers::remove_hop_by_hop(&mut parts.headers, false, &mut found);
        if let Some(codings) = codings {
            parts.headers.insert(header::TRANSFER_ENCODING, codings);
        }
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
    /// The `Upgrade` protocols forwarded, if the request was forwarded as an upgrade.
    upgrade: Option<HeaderValue>,
    /// The client speaks HTTP/1.1, the one version with transfer codings.
    client_http11: bool,
    /// With `max_request_body`: raised when the request body passed it on its way out.
    exceeded: Option<(Arc<std::sync::atomic::AtomicBool>, u64)>,
}

/// The request as the upstream receives it: a declared oversized body refused before anything
/// is sent, the origin-form target, an upgrade only to the protocols `upgrades` allows (the
/// route's; websocket without a route), hop-by-hop headers removed (transfer codings other than
/// chunked kept), X-Forwarded-* added, Host as configured, the body bounded by
/// `max_request_body` while it streams.
fn outbound<B>(
    config: &Config,
    mut parts: http::request::Parts,
    incoming: B,
    mut found: headers::Found,
    conn: ConnInfo,
    peer_is_trusted: bool,
    upgrades: Option<&[String]>,
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

    let client_http11 = parts.version == Version::HTTP_11;
    let asks_upgrade = client_http11 && headers::is_upgrade_request(&parts.headers, &found);
    // A request left with no allowed protocol goes on as a plain request.
    let upgrade_to = match upgrades {
        _ if !asks_upgrade => None,
        Some(allowed) => crate::upgrade::restrict(&mut parts.headers, allowed),
        None => crate::upgrade::restrict(&mut parts.headers, crate::config::DEFAULT_UPGRADES),
    };
    let upgrade = upgrade_to.is_some();
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
    // hyper decoded the chunked coding only; the others belong to the body it forwards.
    let codings = match upstream.http2 {
        false => headers::codings_besides_chunked(&parts.headers, &found),
        true => None,
    };
    headers::remove_hop_by_hop(&mut parts.headers, upgrade, &mut found);
    if let Some(codings) = codings {
        // hyper's client frames the body as chunked again and keeps this value.
        parts.headers.insert(header::TRANSFER_ENCODING, codings);
    }
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
        upgrade: upgrade_to,
        client_http11,
        exceeded,
    };
    Ok((Request::from_parts(parts, body), returning))
}

/// The forward stage's answer: the upstream's response as the client receives it.
pub type Forwarded = Response<AnswerBody>;

impl Runtime {
    /// The metrics a request is counted in: its route's, or the unrouted ones.
    fn route_metrics(&self, routed: Option<Routed<'_>>) -> &RouteMetrics {
        match routed {
            Some(routed) => &self.route_metrics[routed.index],
            None => &self.unrouted_metrics,
        }
    }

    /// An admitted request (its obligations counted in its route's metrics), or the answer
    /// to one that was not, with whether it was limited (a 429, for gRPC's translation); a
    /// limited caller is recorded for the operators' `/limits/top` and recent denials.
    fn admitted_or_refused<'a>(
        &self,
        outcome: LimitOutcome<'a>,
        routed: Routed<'_>,
    ) -> Result<Admitted<'a>, (Box<Response<ProxyBody>>, bool)> {
        let throttle = &self.config.throttle;
        self.suggest.observe(&throttle.key_prefix, &outcome);
        match outcome {
            LimitOutcome::Admitted(admitted) => Ok(self.owed(admitted, routed)),
            LimitOutcome::Limited(limited) => {
                self.offenders
                    .record_denial(&throttle.key_prefix, limited.set, &limited.key);
                self.offenders
                    .recent()
                    .record(&throttle.key_prefix, &limited);
                Err((
                    Box::new(limited_response(&throttle.response, &limited)),
                    true,
                ))
            }
            LimitOutcome::StoreUnavailable { .. } => Err((
                Box::new(ProxyError::StoreUnavailable.into_response()),
                false,
            )),
            LimitOutcome::Rejected { refusal } => Err((Box::new(unauthorized(refusal)), false)),
        }
    }

    /// An admitted request's obligations, counted in its route's metrics from now on (a
    /// settlement dropped because the client left is counted too).
    fn owed<'a>(&self, mut admitted: Admitted<'a>, routed: Routed<'_>) -> Admitted<'a> {
        if let Some(settlement) = admitted.settlement.as_mut() {
            settlement.count_in(&self.route_metrics[routed.index].settlement);
        }
        admitted
    }
}

impl Proxy {
    /// The respond stage for an admitted response that owes a settlement or holds concurrency
    /// slots: settled (count_statuses in the store before the head goes out, so its fields
    /// show it), with its rate-limit fields, its slots released or held until its body ends
    /// (read to its end if the client leaves first, see `exchange`).
    async fn settle_and_hold(
        &self,
        runtime: &Runtime,
        mut admitted: Admitted<'_>,
        held: Held,
        outcome: Delivery,
        mut response: Response<AnswerBody>,
    ) -> Response<AnswerBody> {
        let mut settles_at_end = false;
        if let Some(settlement) = held.settlement {
            settles_at_end = outcome == Delivery::Answered && settlement.settles_at_end();
            // count_statuses settles on this head, in the store before the head goes out
            // (and the fields below show it), cost_from_response before the body's end.
            let settled =
                settlement.on_response(response.map(boxed_answer), outcome, &mut admitted.verdicts);
            response = settled.await.map(AnswerBody::Right);
        }
        response = with_limit_fields(runtime, &admitted, response);
        if let Some(leases) = held.leases {
            if http_body::Body::is_end_stream(response.body()) {
                // The head is the whole response: the slots are back before it goes.
                leases.release().await;
            } else {
                // Back before the body's last frame goes on (see `body::BeforeEnd`).
                let (parts, body) = response.into_parts();
                let body = body::BeforeEnd::new(boxed_answer(body), *leases);
                response = Response::from_parts(parts, AnswerBody::Right(body::boxed(body)));
                settles_at_end = true;
            }
        }
        if settles_at_end {
            // Read to its end even if the client leaves first (see `exchange`).
            let (parts, body) = response.into_parts();
            let body = exchange::HeldBody::new(
                boxed_answer(body),
                (),
                &self.inner.orphans,
                runtime.upstream.timeout(),
            );
            response = Response::from_parts(parts, AnswerBody::Right(body::boxed(body)));
        }
        response
    }
}

/// An admitted response with the rate-limit fields of its verdicts (none for a request
/// admitted without a decision).
fn with_limit_fields(
    runtime: &Runtime,
    admitted: &Admitted<'_>,
    mut response: Response<AnswerBody>,
) -> Response<AnswerBody> {
    if !admitted.verdicts.is_empty() {
        limit_headers::add_fields_with(
            response.headers_mut(),
            &runtime.config.throttle.response,
            admitted.set,
            admitted.policy.as_deref(),
            &admitted.verdicts,
            false,
        );
    }
    response
}

/// The response as the client receives it, its status recorded as tollgate chose it;
/// tollgate's own answer (an error on the way) translated for a gRPC client.
fn answered(
    response: Response<AnswerBody>,
    record: &mut RequestRecord<'_>,
    translate_for_grpc: bool,
) -> Response<AnswerBody> {
    record.answered(response.status());
    let response = if translate_for_grpc {
        crate::grpc::translate(response.map(boxed_answer), false).map(AnswerBody::Right)
    } else {
        response
    };
    // A sampled request's spans end with its body, not its head.
    match record.spans_for_body(&response) {
        None => response,
        Some(spans) => response.map(|body| {
            let ending = body::OnEnd::with_hook(body, crate::traces::EndSpans::new(spans));
            AnswerBody::Right(body::boxed(ending))
        }),
    }
}

/// Answers a request the limit stage refused, without forwarding it. The record keeps the
/// HTTP status tollgate chose; a gRPC call then gets the answer as a trailers-only gRPC
/// response (see `grpc`), RESOURCE_EXHAUSTED when `limited`.
fn refuse(
    response: Response<ProxyBody>,
    record: &mut RequestRecord<'_>,
    grpc: bool,
    limited: bool,
) -> Response<AnswerBody> {
    record.answered(response.status());
    let response = if grpc {
        crate::grpc::translate(response, limited)
    } else {
        response
    };
    response.map(AnswerBody::Right)
}

/// Gives back a protect slot with what the exchange showed: the head's status, or a failure
/// of the upstream's (a refusal of the client's own, such as an oversized body, is no sample).
impl exchange::UntilHead for protect::Slot {
    /// The app's answer is the controller's sample: its latency and whether it failed.
    fn answered(self: Box<Self>, answered: &exchange::Answered) {
        match answered {
            Ok(response) => self.finish(Some(response.status())),
            Err(error) if error.side() == crate::error::Side::Upstream => self.finish(None),
            Err(_) => drop(self),
        }
    }
}

/// The answer to a request `protect` shed: 503 with `Retry-After` and a problem+json body
/// saying the app is overloaded (not that the caller is over a quota: the problem type
/// differs from a limited response's).
fn overloaded_response() -> Response<ProxyBody> {
    const BODY: &str = concat!(
        r#"{"detail":"The application is overloaded and this request was shed to keep it "#,
        r#"answering; retry after 1 second(s).","status":503,"title":"Service Overloaded","#,
        r#""type":"urn:tollgate:problem:overloaded"}"#
    );
    let mut response = Response::new(body::full(Bytes::from_static(BODY.as_bytes())));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A limited response as the client receives it, rendered from what the limit stage found.
fn limited_response(config: &ResponseConfig, limited: &Limited<'_>) -> Response<ProxyBody> {
    let rendered = match &limited.denial {
        Denial::Decided(verdicts) => limit_headers::render_limited_with(
            config,
            limited.set,
            limited.policy.as_deref(),
            verdicts,
        ),
        Denial::Remembered { denial, at } => limit_headers::render_remembered(
            config,
            limited.set,
            denial.aged(*at),
            &denial.rendered,
        ),
    };
    let mut response = Response::new(body::full(rendered.body));
    *response.status_mut() = rendered.status;
    *response.headers_mut() = rendered.headers;
    response
}

/// The answer to a caller whose bearer token an identity with `on_invalid: reject` refused:
/// 401 with an RFC 6750 challenge and a problem body naming the reason; to a request an
/// identity cannot read one way, 400.
fn unauthorized(refusal: identity::Refusal) -> Response<ProxyBody> {
    // Not a refused token: a request the identity cannot read one way, malformed (400) like
    // the shapes refused before routing.
    if let identity::Refusal::Ambiguous(what) = refusal {
        return shape::Refusal::Malformed(what.detail()).response();
    }
    let reason = refusal.as_str();
    let problem = serde_json::json!({
        "type": "about:blank",
        "title": "Unauthorized",
        "status": 401,
        "detail": format!("The bearer token was refused: {reason}."),
    });
    let mut response = Response::new(body::full(problem.to_string()));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let challenge = format!("Bearer error=\"invalid_token\", error_description=\"{reason}\"");
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        headers.insert(header::WWW_AUTHENTICATE, value);
    }
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

    /// A request whose client goes away while the upstream has not answered (its future
    /// dropped) is recorded once all the same: counted as decided, no longer in flight, with
    /// status 499 and no upstream time, whether it held nothing or (holding a concurrency slot)
    /// its exchange goes on without it.
    #[tokio::test]
    async fn a_request_dropped_while_forwarded_is_recorded_once() {
        for (limits, orphans) in [
            ("{ algorithm: fixed_window, limit: 5, period: 1m }", 0),
            ("{ algorithm: concurrency, limit: 5 }", 1),
        ] {
            dropped_while_forwarded(limits, orphans).await;
        }
    }

    async fn dropped_while_forwarded(limits: &str, orphans: usize) {
        // An upstream that accepts and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let yaml = format!(
            "listen: 127.0.0.1:0\nupstream: {{ url: \"http://{}\" }}\nroutes:\n  - name: api\n    match: {{ path_prefix: / }}\n    limits:\n      - {limits}\n",
            silent.local_addr().unwrap()
        );
        let config = crate::config::parse(std::path::Path::new("t.yaml"), &yaml, |_| None).unwrap();
        let proxy = Proxy::new(Arc::new(config));
        let request = Request::get("/x")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let conn = ConnInfo {
            peer: "192.0.2.1:5000".parse().unwrap(),
            tls: false,
        };
        // The access log, as this thread's subscriber writes it.
        let lines = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let writer = {
            let lines = lines.clone();
            move || Captured(lines.clone())
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);
        let handled = proxy.clone().handle(request, conn);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(200), handled).await;
        assert!(waited.is_err(), "the silent upstream answered");
        assert_eq!(proxy.orphans().len(), orphans, "{limits}");
        let log = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        let access: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("tollgate::access"))
            .collect();
        assert_eq!(access.len(), 1, "{log}");
        for field in [
            "route=\"api\"",
            "decision=\"allowed\"",
            "status=499",
            "upstream_ms=-1",
        ] {
            assert!(access[0].contains(field), "{field} in {}", access[0]);
        }
        let text = proxy.metrics().render();
        for line in [
            "tollgate_requests_total{route=\"api\",decision=\"allowed\"} 1",
            "tollgate_limit_check_duration_seconds_count 1",
            "tollgate_upstream_duration_seconds_count 0",
            "tollgate_in_flight_requests 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    /// A writer into a shared buffer.
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
