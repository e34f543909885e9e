//! The pooled client to the upstream: HTTP/1.1 or HTTP/2 (h2c, or ALPN h2 over TLS), with
//! the connect and response-head timeouts from the config.
//!
//! One pool per serving thread (`crate::workers`): a connection is opened, used and reaped by
//! the thread whose requests it carries, so a request and its upstream exchange stay on one
//! thread and no pool is shared (nor locked) between threads.
//!
//! The pool's idle timeout is kept short (default 4 s) because an upstream that closes idle
//! keep-alive connections (Node.js after 5 s) races a request sent on one just then, which fails
//! with IncompleteMessage. hyper-util only retries a request that was never written to the
//! connection, which is safe for every method.

use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::body::ProxyBody;
use crate::config::Upstream;
use crate::error::ProxyError;

type Pool = Client<HttpsConnector<HttpConnector>, ProxyBody>;

#[derive(Clone)]
pub struct UpstreamClient {
    /// One per serving thread, indexed by `workers::current()`.
    pools: std::sync::Arc<[Pool]>,
    timeout: Duration,
}

impl UpstreamClient {
    pub fn new(upstream: &Upstream, threads: usize) -> Self {
        UpstreamClient {
            pools: (0..threads.max(1)).map(|_| Self::pool(upstream)).collect(),
            timeout: upstream.timeout,
        }
    }

    fn pool(upstream: &Upstream) -> Pool {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(upstream.connect_timeout));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http();
        let connector = if upstream.http2 {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.enable_http1().wrap_connector(http)
        };
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(upstream.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_only(upstream.http2)
            .build(connector)
    }

    /// Sends `request` and waits for the response head, at most the configured timeout.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let pool = &self.pools[crate::workers::current() % self.pools.len()];
        match tokio::time::timeout(self.timeout, pool.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout(self.timeout)),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) if e.is_connect() => Err(ProxyError::UpstreamConnect(Box::new(e))),
            Ok(Err(e)) => Err(ProxyError::Upstream(Box::new(e))),
        }
    }
}
