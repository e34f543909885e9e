//! The request path, top to bottom in the order it happens: accept (in `server`) → route →
//! identify → limit → forward → respond. This module owns the order; each stage lives in its
//! own module.

mod access_log;
pub mod body;
pub mod headers;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::config::{Config, HostMode};
use crate::error::ProxyError;
use crate::identity;
use crate::metrics::{Metrics, RouteMetrics};
use crate::routing;
use crate::throttle::{self, Checked, Decided, Throttler};
use access_log::AccessLog;
use body::{LimitedBody, ProxyBody};
use upstream::UpstreamClient;

/// The client side of an upgrade on a connection the server upgrades by hand (plain
/// HTTP/1, see `conn`): the socket arrives here once the 101 has been written. Requests
/// without it are upgraded by hyper (`hyper::upgrade::on`).
#[derive(Clone)]
pub struct ClientUpgrade(Arc<std::sync::Mutex<Option<HandedOver>>>);

type HandedOver = tokio::sync::oneshot::Receiver<crate::conn::Upgraded>;

impl ClientUpgrade {
    pub fn new(handed_over: HandedOver) -> Self {
        ClientUpgrade(Arc::new(std::sync::Mutex::new(Some(handed_over))))
    }

    fn take(&self) -> Option<HandedOver> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

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
    throttler: Throttler,
    /// One per route, in route order.
    route_metrics: Vec<RouteMetrics>,
    unrouted_metrics: RouteMetrics,
}

impl Runtime {
    fn new(config: Arc<Config>, metrics: &Metrics, previous: Option<&Runtime>) -> Runtime {
        let upstream = match previous {
            Some(p) if p.config.upstream == config.upstream => p.upstream.clone(),
            _ => UpstreamClient::new(&config.upstream),
        };
        let throttler = Throttler::new(config.throttle.clone(), previous.map(|p| &p.throttler));
        let route_metrics = config
            .throttle
            .routes
            .iter()
            .map(|r| metrics.route(&r.name))
            .collect();
        Runtime {
            upstream,
            throttler,
            route_metrics,
            unrouted_metrics: metrics.route(crate::metrics::UNROUTED),
            config,
        }
    }
}

/// Decrements the in-flight gauge however the request ends (including the client leaving).
struct InFlight(Arc<Metrics>);

impl InFlight {
    fn start(metrics: &Arc<Metrics>) -> InFlight {
        metrics.inflight.increment(1.0);
        InFlight(metrics.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.decrement(1.0);
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

    /// Whether this instance should receive traffic as far as the store is concerned: a store
    /// that cannot be reached matters only when `on_error: deny` would refuse everything.
    pub fn store_ready(&self) -> bool {
        let runtime = self.inner.runtime.load();
        let throttler = &runtime.throttler;
        throttler.store_ready() || throttler.on_error() != crate::config::OnError::Deny
    }

    /// Handles one request, in order: route → identify → limit → forward → respond. Never
    /// fails: every error becomes a response.
    pub async fn handle<B>(&self, request: Request<B>, conn: ConnInfo) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let started = Instant::now();
        let _inflight = InFlight::start(&self.inner.metrics);
        let runtime = self.inner.runtime.load_full();
        let config = &runtime.config;
        let (parts, body) = request.into_parts();
        let mut log = AccessLog::new(&parts, started, config.access_log);

        // Route.
        let route_index = routing::position(&config.throttle.routes, &parts);
        let metrics = match route_index {
            Some(i) => &runtime.route_metrics[i],
            None => &runtime.unrouted_metrics,
        };

        // Identify and limit.
        let admission = match route_index.map(|i| &config.throttle.routes[i]) {
            None => None,
            Some(route) => {
                log.route = Some(route.clone());
                let client_ip = identity::client_ip(
                    conn.peer.ip(),
                    &parts.headers,
                    &config.throttle.trusted_proxies,
                );
                let checked = runtime.throttler.check(route, &parts, client_ip).await;
                self.inner
                    .metrics
                    .limit_check_duration
                    .record(started.elapsed().as_secs_f64());
                match checked {
                    Checked::Admit(admission) => {
                        log.identity = admission.identity;
                        Some(admission)
                    }
                    Checked::Reject {
                        response,
                        store_unavailable,
                        store_error,
                        identity,
                    } => {
                        log.identity = identity;
                        if store_error && !store_unavailable {
                            // Limited by the on_error: local fallback: still a store error.
                            self.inner.metrics.store_errors.increment(1);
                        }
                        log.decision = if store_unavailable {
                            self.inner.metrics.store_errors.increment(1);
                            metrics.store_error.increment(1);
                            "store_error"
                        } else {
                            metrics.limited.increment(1);
                            "limited"
                        };
                        log.finish(response.status().as_u16(), None);
                        return response;
                    }
                }
            }
        };
        match admission.as_ref().map(|a| a.decided) {
            None | Some(Decided::Allowed) => metrics.allowed.increment(1),
            Some(Decided::Exempt) => {
                log.decision = "exempt";
                metrics.allowed.increment(1);
            }
            Some(Decided::ShadowLimited) => {
                log.decision = "shadow_limited";
                metrics.shadow_limited.increment(1);
            }
            Some(Decided::StoreError | Decided::LocalFallback) => {
                log.decision = "store_error";
                self.inner.metrics.store_errors.increment(1);
                metrics.store_error.increment(1);
            }
        }

        // Forward.
        let peer_is_trusted = config.throttle.trusted_proxies.contains(conn.peer.ip());
        let request = Request::from_parts(parts, body);
        let upstream_started = Instant::now();
        let mut response = match self.forward(&runtime, request, conn, peer_is_trusted).await {
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
                error.into_response()
            }
        };

        // Respond.
        if let Some(admission) = admission {
            if !admission.verdicts.is_empty() {
                throttle::headers::add_fields(
                    response.headers_mut(),
                    &config.throttle.response,
                    &admission.route.limits,
                    &admission.route.policy,
                    &admission.verdicts,
                    false,
                );
            }
            if let Some(leases) = admission.leases {
                // The slots are held until the response body is done (or the client leaves).
                let (parts, body) = response.into_parts();
                response = Response::from_parts(parts, body::with_guard(body, leases));
            }
        }
        log.finish(response.status().as_u16(), log.upstream);
        response
    }

    /// Forwards the request to the upstream and streams the answer back.
    async fn forward<B>(
        &self,
        runtime: &Runtime,
        mut request: Request<B>,
        conn: ConnInfo,
        peer_is_trusted: bool,
    ) -> Result<Response<ProxyBody>, ProxyError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let config = &runtime.config;
        let upstream = &config.upstream;

        // Refuse a declared oversized body before anything reaches the upstream.
        let limit = config.max_request_body;
        if let (Some(limit), Some(length)) = (limit, content_length(&request)) {
            if length > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
        }

        let upgrade =
            request.version() == Version::HTTP_11 && headers::is_upgrade_request(request.headers());
        if upgrade && upstream.http2 {
            return Err(ProxyError::BadRequest(
                "protocol upgrades need an HTTP/1.1 upstream",
            ));
        }
        let handed_over = request
            .extensions_mut()
            .remove::<ClientUpgrade>()
            .and_then(|u| u.take());
        let client_upgrade = upgrade.then(|| match handed_over {
            Some(handed_over) => ClientSide::HandedOver(handed_over),
            None => ClientSide::Hyper(hyper::upgrade::on(&mut request)),
        });

        let (mut parts, incoming) = request.into_parts();
        let client_host = parts.headers.get(header::HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });

        parts.uri = upstream_uri(&parts.uri, upstream)?;
        parts.version = if upstream.http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        headers::remove_hop_by_hop(&mut parts.headers, upgrade);
        headers::add_forwarded(
            &mut parts.headers,
            conn.peer.ip(),
            if conn.tls { "https" } else { "http" },
            client_host.as_ref(),
            peer_is_trusted,
        );
        match (upstream.host, &client_host) {
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
                (body::boxed(body), Some(flag))
            }
            None => (body::boxed(incoming), None),
        };
        let result = runtime
            .upstream
            .send(Request::from_parts(parts, body))
            .await;
        let mut response = match result {
            Ok(response) => response,
            Err(_) if exceeded.is_some_and(|f| f.load(Ordering::Acquire)) => {
                return Err(ProxyError::BodyTooLarge {
                    limit: limit.unwrap_or_default(),
                })
            }
            Err(e) => return Err(e),
        };

        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_upgrade) = client_upgrade {
                let upstream_upgrade = hyper::upgrade::on(&mut response);
                self.inner.tunnels.spawn(async move {
                    tunnel(client_upgrade, upstream_upgrade).await;
                });
            }
            let (parts, _) = response.into_parts();
            return Ok(Response::from_parts(parts, body::empty()));
        }

        let (mut parts, incoming) = response.into_parts();
        headers::remove_hop_by_hop(&mut parts.headers, false);
        Ok(Response::from_parts(parts, body::boxed(incoming)))
    }
}

/// Where the client's side of a tunnel comes from.
enum ClientSide {
    /// hyper upgrades the connection (TLS and HTTP/2 listeners' connections).
    Hyper(hyper::upgrade::OnUpgrade),
    /// The server hands the socket over itself (plain HTTP/1, see `conn`).
    HandedOver(HandedOver),
}

/// Copies bytes both ways between an upgraded client and upstream until either side closes.
async fn tunnel(client: ClientSide, upstream: hyper::upgrade::OnUpgrade) {
    match client {
        ClientSide::Hyper(client) => match tokio::try_join!(client, upstream) {
            Ok((client, upstream)) => copy_both_ways(TokioIo::new(client), upstream).await,
            Err(e) => tracing::debug!(cause = %e, "upgrade did not complete"),
        },
        ClientSide::HandedOver(client) => {
            let client = async { client.await.map_err(|_| "the client connection ended") };
            let upstream = async { upstream.await.map_err(|_| "the upstream did not upgrade") };
            match tokio::try_join!(client, upstream) {
                Ok((client, upstream)) => copy_both_ways(client, upstream).await,
                Err(cause) => tracing::debug!(cause, "upgrade did not complete"),
            }
        }
    }
}

async fn copy_both_ways<C>(mut client: C, upstream: hyper::upgrade::Upgraded)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut upstream = TokioIo::new(upstream);
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => tracing::debug!(bytes_up = up, bytes_down = down, "tunnel closed"),
        Err(e) => tracing::debug!(cause = %e, "tunnel ended with an error"),
    }
}

fn content_length<B>(request: &Request<B>) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The upstream's scheme and authority with the request's own path and query.
fn upstream_uri(uri: &Uri, upstream: &crate::config::Upstream) -> Result<Uri, ProxyError> {
    let path_and_query = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !path_and_query.as_str().starts_with('/') {
        // `OPTIONS *` and absolute-form oddities: nothing sensible to forward.
        return Err(ProxyError::BadRequest("the request target must be a path"));
    }
    Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(path_and_query)
        .build()
        .map_err(|_| ProxyError::BadRequest("the request target cannot be forwarded"))
}
