//! Accepting connections: binds the listeners (plain or TLS), serves HTTP/1.1 and HTTP/2 on each
//! connection through the proxy, runs the admin endpoints, and shuts down gracefully: stop
//! accepting at once, report not-ready, let in-flight requests and tunnels finish for up to
//! `shutdown_timeout`, then return.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::conn;
use crate::idle;
use crate::metrics::Held;
use crate::proxy::body::{full, ProxyBody};
use crate::proxy::{ConnInfo, Proxy};
use crate::tls;

/// Why the server could not start (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS for {address}: {message}")]
    Tls {
        address: SocketAddr,
        message: String,
    },
}

/// What readiness depends on: not draining, and a store that answers unless `on_error`
/// makes its absence harmless.
pub struct Health {
    draining: AtomicBool,
    proxy: Proxy,
}

impl Health {
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Acquire) {
            Err("draining\n")
        } else if !self.proxy.store_ready() {
            Err("rate limit store unreachable (on_error: deny)\n")
        } else {
            Ok(())
        }
    }
}

struct BoundListener {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

/// A server whose sockets are bound: addresses are known (port 0 resolved) before it runs.
pub struct Server {
    config: Arc<Config>,
    proxy: Proxy,
    listeners: Vec<BoundListener>,
    admin: Option<TcpListener>,
    health: Arc<Health>,
}

impl Server {
    pub async fn bind(config: Arc<Config>) -> Result<Server, StartError> {
        tls::install_crypto_provider();
        let mut listeners = Vec::new();
        for spec in &config.listeners {
            let tls = match &spec.tls {
                Some(files) => Some(tls::acceptor(files).map_err(|message| StartError::Tls {
                    address: spec.address,
                    message,
                })?),
                None => None,
            };
            let listener =
                TcpListener::bind(spec.address)
                    .await
                    .map_err(|source| StartError::Bind {
                        address: spec.address,
                        source,
                    })?;
            listeners.push(BoundListener { listener, tls });
        }
        let admin = match config.admin {
            Some(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|source| StartError::Bind { address, source })?,
            ),
            None => None,
        };
        let proxy = Proxy::new(config.clone());
        Ok(Server {
            health: Arc::new(Health {
                draining: AtomicBool::new(false),
                proxy: proxy.clone(),
            }),
            proxy,
            config,
            listeners,
            admin,
        })
    }

    /// The proxy listeners' addresses, in config order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.listener.local_addr().ok())
            .collect()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then drains and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            config,
            proxy,
            listeners,
            admin,
            health,
        } = self;
        for l in &listeners {
            if let Ok(addr) = l.listener.local_addr() {
                let scheme = if l.tls.is_some() { "https" } else { "http" };
                tracing::info!(address = %addr, scheme, "listening");
            }
        }
        let admin_stop = CancellationToken::new();
        // Hot reload, when the configuration came from a file that exists (not in tests that
        // build the configuration from text).
        let reloader = config.file.is_file().then(|| {
            tokio::spawn(crate::reload::watch(
                proxy.clone(),
                config.file.clone(),
                admin_stop.clone(),
            ))
        });
        let admin_task = admin.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(address = %addr, "admin listening");
            }
            tokio::spawn(serve_admin(listener, health.clone(), admin_stop.clone()))
        });

        let stop = CancellationToken::new();
        let shared = conn::Shared::new(proxy.clone(), &config, stop.clone());
        // TLS connections keep hyper-util's HTTP/1-or-2 connection, with the same settings.
        let mut tls_builder = auto::Builder::new(TokioExecutor::new());
        tls_builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout)
            .max_buf_size(conn::MAX_HEAD_BYTES);
        tls_builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.http2_max_concurrent_streams)
            .max_header_list_size(conn::MAX_HEAD_BYTES as u32);
        let connections = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(config.max_connections));
        let accepting = futures_util::future::join_all(
            listeners
                .into_iter()
                .map(|l| accept_loop(l, &shared, &tls_builder, &connections, &permits)),
        );
        tokio::select! {
            _ = accepting => {}
            _ = shutdown => {}
        }
        // The listeners were owned by the accept loops, dropped above: no new connections.
        health.draining.store(true, Ordering::Release);
        tracing::info!(timeout = ?config.shutdown_timeout, "shutting down: draining in-flight requests");
        stop.cancel();
        connections.close();
        let tunnels = proxy.tunnels().clone();
        tunnels.close();
        let drained = tokio::time::timeout(config.shutdown_timeout, async {
            connections.wait().await;
            tunnels.wait().await;
        })
        .await;
        match drained {
            Ok(()) => tracing::info!("drained; exiting"),
            Err(_) => {
                tracing::warn!("shutdown timeout passed with requests still in flight; exiting")
            }
        }
        admin_stop.cancel();
        if let Some(task) = admin_task {
            let _ = task.await;
        }
        if let Some(task) = reloader {
            let _ = task.await;
        }
    }
}

async fn accept_loop(
    bound: BoundListener,
    shared: &Arc<conn::Shared>,
    tls_builder: &auto::Builder<TokioExecutor>,
    connections: &TaskTracker,
    permits: &Arc<Semaphore>,
) {
    loop {
        // Past max_connections, new connections wait in the kernel's backlog.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match bound.listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(cause = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let open = Held::new(&shared.proxy.metrics().client_connections);
        let info = ConnInfo {
            peer,
            tls: bound.tls.is_some(),
        };
        match &bound.tls {
            None => {
                let shared = shared.clone();
                connections.spawn(async move {
                    conn::serve_plain(stream, info, shared).await;
                    drop((open, permit));
                });
            }
            Some(acceptor) => {
                // TLS connections are not parked: rustls may hold decrypted bytes that the
                // socket's readiness would not show. They are served by hyper-util's HTTP/1-or-2
                // connection for their whole life.
                let activity = Arc::new(idle::Activity::default());
                let stream = idle::IdleIo::new(stream, shared.idle_timeout, activity.clone());
                let service = conn::ConnectionService::new(shared.proxy.clone(), info, activity);
                // The handshake runs in the connection's task so a slow client cannot hold up
                // accepting; it is bounded like a request head.
                let acceptor = acceptor.clone();
                let builder = tls_builder.clone();
                let shared = shared.clone();
                connections.spawn(async move {
                    let tls_stream = match tokio::time::timeout(
                        shared.header_read_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, cause = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
                    let conn = std::pin::pin!(conn);
                    if let Err(e) =
                        conn::until_drained(conn, &shared.stop, |c| c.graceful_shutdown()).await
                    {
                        tracing::debug!(%peer, cause = %e, "connection ended with an error");
                    }
                    drop((open, permit));
                });
            }
        }
    }
}

/// `/healthz`: the process is alive. `/readyz`: it should receive traffic (not draining, the
/// store answers or does not matter). `/metrics`: Prometheus text format.
async fn serve_admin(listener: TcpListener, health: Arc<Health>, stop: CancellationToken) {
    loop {
        let accepted: std::io::Result<(TcpStream, SocketAddr)> = tokio::select! {
            r = listener.accept() => r,
            _ = stop.cancelled() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let health = health.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let health = health.clone();
            async move { Ok::<_, Infallible>(admin_response(&request, &health)) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn admin_response(request: &Request<Incoming>, health: &Health) -> Response<ProxyBody> {
    if request.uri().path() == "/metrics" {
        let mut response = Response::new(full(health.proxy.metrics().render()));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return response;
    }
    let (status, text) = match request.uri().path() {
        "/healthz" => (StatusCode::OK, "ok\n"),
        "/readyz" => match health.readiness() {
            Ok(()) => (StatusCode::OK, "ready\n"),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /healthz or /readyz\n",
        ),
    };
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
}
