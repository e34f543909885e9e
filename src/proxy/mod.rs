//! The request path, top to bottom in the order it happens: accept (in `server`) → route →
//! identify → limit → forward → respond. This module owns the order; each stage lives in its
//! own module.

pub mod body;
pub mod headers;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_util::task::TaskTracker;

use crate::config::{Config, HostMode};
use crate::error::ProxyError;
use crate::identity;
use crate::routing;
use crate::throttle::{self, Checked, Throttler};
use body::{LimitedBody, ProxyBody};
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
    config: Arc<Config>,
    upstream: UpstreamClient,
    throttler: Throttler,
    /// Upgraded (WebSocket) connections: hyper's graceful shutdown no longer sees them, so
    /// shutdown waits on this instead.
    tunnels: TaskTracker,
}

impl Proxy {
    pub fn new(config: Arc<Config>) -> Self {
        let upstream = UpstreamClient::new(&config.upstream);
        let throttler = Throttler::new(config.throttle.clone());
        Proxy {
            inner: Arc::new(Inner {
                config,
                upstream,
                throttler,
                tunnels: TaskTracker::new(),
            }),
        }
    }

    pub fn tunnels(&self) -> &TaskTracker {
        &self.inner.tunnels
    }

    /// Whether this instance should receive traffic as far as the store is concerned: a store
    /// that cannot be reached matters only when `on_error: deny` would refuse everything.
    pub fn store_ready(&self) -> bool {
        let throttler = &self.inner.throttler;
        throttler.store_ready() || throttler.on_error() != crate::config::OnError::Deny
    }

    /// Handles one request, in order: route → identify → limit → forward → respond. Never
    /// fails: every error becomes a response.
    pub async fn handle(&self, request: Request<Incoming>, conn: ConnInfo) -> Response<ProxyBody> {
        let config = &self.inner.config;
        let (parts, body) = request.into_parts();
        let peer_is_trusted = config.throttle.trusted_proxies.contains(conn.peer.ip());

        let admission = match routing::find(&config.throttle.routes, &parts) {
            None => None,
            Some(route) => {
                let client_ip = identity::client_ip(
                    conn.peer.ip(),
                    &parts.headers,
                    &config.throttle.trusted_proxies,
                );
                match self.inner.throttler.check(route, &parts, client_ip).await {
                    Checked::Admit(admission) => Some(admission),
                    Checked::Reject(response) => {
                        tracing::debug!(route = %route.name, status = response.status().as_u16(), "request limited");
                        return response;
                    }
                }
            }
        };

        let request = Request::from_parts(parts, body);
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let mut response = match self.forward(request, conn, peer_is_trusted).await {
            Ok(response) => response,
            Err(error) => {
                let status = error.status().as_u16();
                match &error {
                    ProxyError::BadRequest(_) | ProxyError::BodyTooLarge { .. } => {
                        tracing::info!(%method, %path, peer = %conn.peer, status, side = error.source_side(), cause = %error, "request refused")
                    }
                    _ => {
                        tracing::warn!(%method, %path, peer = %conn.peer, status, side = error.source_side(), cause = %error, source = ?std::error::Error::source(&error), "request failed")
                    }
                }
                error.into_response()
            }
        };
        if let Some(admission) = admission {
            if !admission.verdicts.is_empty() {
                throttle::headers::add_fields(
                    response.headers_mut(),
                    &config.throttle.response,
                    &admission.route.limits,
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
        response
    }

    /// Forwards the request to the upstream and streams the answer back.
    async fn forward(
        &self,
        mut request: Request<Incoming>,
        conn: ConnInfo,
        peer_is_trusted: bool,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let config = &self.inner.config;
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
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));

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
        let result = self
            .inner
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

/// Copies bytes both ways between an upgraded client and upstream until either side closes.
async fn tunnel(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(cause = %e, "upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
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
