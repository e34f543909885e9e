//! The pooled client to the upstream: HTTP/1.1 or HTTP/2 (h2c, or ALPN h2 over TLS), with
//! the connect and response-head timeouts from the config.
//!
//! One pool per serving thread (`crate::workers`): a connection is opened, used and reaped by
//! the thread whose requests it carries, so a request and its upstream exchange stay on one
//! thread and no pool is shared (nor locked) between threads. A plain-`http://` HTTP/1.1
//! upstream, the common sidecar, gets tollgate's own pool (`http1_pool`); TLS and HTTP/2
//! upstreams get hyper-util's client.
//!
//! The pool's idle timeout is kept short (default 4 s) because an upstream that closes idle
//! keep-alive connections (Node.js after 5 s) races a request sent on one just then, which fails
//! with IncompleteMessage. Both pools retry only a request that was never written to the
//! connection, which is safe for every method.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{Either, FutureExt, TryFutureExt};
use http::uri::{Authority, Scheme, Uri};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::http1_pool::{Http1Pool, PooledBody};
use crate::body::ProxyBody;
use crate::config::Upstream;
use crate::error::ProxyError;

type LegacyClient = Client<HttpsConnector<HttpConnector>, ProxyBody>;

#[derive(Clone)]
enum Pool {
    Http1(Arc<Http1Pool>),
    Legacy(Box<LegacyClient>),
}

#[derive(Clone)]
pub struct UpstreamClient {
    /// One per serving thread, indexed by `workers::current()`.
    pools: Arc<[Pool]>,
    timeout: Duration,
    /// hyper-util's client picks its connection by the absolute URI.
    scheme: Scheme,
    authority: Authority,
}

/// True when `upstream` is served by tollgate's own HTTP/1 pool, whose connections keep an
/// early answer to an upload (`early_answer`); TLS and HTTP/2 go through hyper-util's client.
pub fn is_plain_http1(upstream: &Upstream) -> bool {
    upstream.scheme == Scheme::HTTP && !upstream.http2
}

impl UpstreamClient {
    pub fn new(upstream: &Upstream, threads: usize) -> Self {
        UpstreamClient {
            pools: (0..threads.max(1)).map(|_| Self::pool(upstream)).collect(),
            timeout: upstream.timeout,
            scheme: upstream.scheme.clone(),
            authority: upstream.authority.clone(),
        }
    }

    fn pool(upstream: &Upstream) -> Pool {
        if is_plain_http1(upstream) {
            return Pool::Http1(Arc::new(Http1Pool::new(
                upstream.authority.clone(),
                upstream.connect_timeout,
                upstream.pool_idle_timeout,
            )));
        }
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(upstream.connect_timeout));
        let trusting = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match &upstream.ca_certs {
            Some(certs) => trusting.with_tls_config(crate::tls::client_config_trusting(certs)),
            None => trusting.with_webpki_roots(),
        }
        .https_or_http();
        let connector = if upstream.http2 {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.enable_http1().wrap_connector(http)
        };
        Pool::Legacy(Box::new(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(upstream.pool_idle_timeout)
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .http2_only(upstream.http2)
                .build(connector),
        ))
    }

    /// Sends `request` (origin-form URI: path and query) and waits for the response head, at
    /// most the configured timeout.
    ///
    /// A plain function returning the pool's own future (under the timeout) rather than an
    /// async one: an async function would keep a second copy of the request beside the
    /// pool's, in the future every request moves as it is built. The future borrows nothing,
    /// so an exchange can outlive the request that started it (`exchange`: a client that
    /// hangs up does not end the app's work).
    pub fn send(
        &self,
        mut request: Request<ProxyBody>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, ProxyError>> + Send + 'static {
        let pool = &self.pools[crate::workers::current() % self.pools.len()];
        let sent = match pool {
            Pool::Http1(pool) => Either::Left(
                Arc::clone(pool)
                    .send(request)
                    .map_ok(|r| r.map(UpstreamBody::Pooled)),
            ),
            Pool::Legacy(client) => {
                let requested = self.absolute(request.uri()).map(|uri| {
                    *request.uri_mut() = uri;
                    client.request(request)
                });
                Either::Right(async move {
                    match requested?.await {
                        Ok(response) => Ok(response.map(UpstreamBody::Legacy)),
                        Err(e) if e.is_connect() => Err(ProxyError::UpstreamConnect(Box::new(e))),
                        Err(e) => Err(ProxyError::from_send(Box::new(e))),
                    }
                })
            }
        };
        let timeout = self.timeout;
        tokio::time::timeout(timeout, sent).map(move |result| match result {
            Err(_) => Err(ProxyError::UpstreamTimeout(timeout)),
            Ok(result) => result,
        })
    }

    /// How long the upstream may take to answer (`upstream.timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl UpstreamClient {
    /// The upstream's scheme and authority with the request's path and query.
    fn absolute(&self, origin_form: &Uri) -> Result<Uri, ProxyError> {
        let mut parts = origin_form.clone().into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        Uri::from_parts(parts)
            .map_err(|_| ProxyError::BadRequest("the request target cannot be forwarded"))
    }
}

/// A response body from either pool.
pub enum UpstreamBody {
    Pooled(PooledBody),
    Legacy(Incoming),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            UpstreamBody::Pooled(body) => Pin::new(body).poll_frame(cx),
            UpstreamBody::Legacy(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Pooled(body) => body.is_end_stream(),
            UpstreamBody::Legacy(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Pooled(body) => body.size_hint(),
            UpstreamBody::Legacy(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(yaml: &str) -> Upstream {
        let text = format!("listen: 127.0.0.1:8080\nupstream: {yaml}\n");
        crate::config::parse(std::path::Path::new("t.yaml"), &text, |_| None)
            .unwrap_or_else(|e| panic!("{e}"))
            .upstream
    }

    /// The choice behind both the pool and the serving threads' readiness interval: only a
    /// plain HTTP/1 upstream goes through the pool whose sockets keep an early answer.
    #[test]
    fn only_plain_http1_upstreams_are_served_by_the_own_pool() {
        assert!(is_plain_http1(&upstream("{ url: http://127.0.0.1:3000 }")));
        assert!(!is_plain_http1(&upstream(
            "{ url: https://app.internal:8443 }"
        )));
        assert!(!is_plain_http1(&upstream(
            "{ url: http://127.0.0.1:3000, http2: true }"
        )));
        assert!(!is_plain_http1(&upstream(
            "{ url: https://app.internal:8443, http2: true }"
        )));
    }
}
