//! Accepting connections: binds the listeners (plain or TLS), serves HTTP/1.1 and HTTP/2 on each
//! connection through the proxy, runs the admin endpoints, and shuts down gracefully: stop
//! accepting at once, report not-ready, let in-flight requests and tunnels finish for up to
//! `shutdown_timeout`, then return.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::admin::Health;
use crate::config::Config;
use crate::conn;
use crate::metrics::GaugeGuard;
use crate::proxy::{ConnInfo, Proxy};
use crate::tls;
use crate::workers::{Readiness, Workers};

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
    #[error("cannot start the serving threads: {0}")]
    Workers(std::io::Error),
}

struct BoundListener {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

/// One serving thread's copy of a listener: the same socket (a duplicated descriptor),
/// registered with that thread's reactor when its accept loop starts.
struct ListenerCopy {
    listener: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
}

impl ListenerCopy {
    /// The bound listeners as standard sockets the serving threads can each take a copy of.
    fn take_over(listeners: Vec<BoundListener>) -> Vec<ListenerCopy> {
        let mut copies = Vec::new();
        for bound in listeners {
            let tls = bound.tls;
            match bound.listener.into_std() {
                Ok(listener) => copies.push(ListenerCopy { listener, tls }),
                Err(e) => {
                    tracing::error!(cause = %crate::error::chain(&e), "cannot take over a listener")
                }
            }
        }
        copies
    }

    /// One serving thread's copies of `copies` (a listener that cannot be shared is logged
    /// and left out).
    fn share(copies: &[ListenerCopy]) -> Vec<ListenerCopy> {
        copies
            .iter()
            .filter_map(|c| match c.listener.try_clone() {
                Ok(listener) => Some(ListenerCopy {
                    listener,
                    tls: c.tls.clone(),
                }),
                Err(e) => {
                    tracing::error!(cause = %crate::error::chain(&e), "cannot share a listener with a serving thread");
                    None
                }
            })
            .collect()
    }
}

/// A server whose sockets are bound: addresses are known (port 0 resolved) before it runs.
pub struct Server {
    config: Arc<Config>,
    proxy: Proxy,
    listeners: Vec<BoundListener>,
    admin: Option<TcpListener>,
    health: Arc<Health>,
    workers: Workers,
}

impl Server {
    pub async fn bind(config: Arc<Config>) -> Result<Server, StartError> {
        tls::install_crypto_provider();
        let mut listeners = Vec::new();
        for spec in &config.listeners {
            let tls = match &spec.tls {
                Some(files) => Some(tls::acceptor(&files.cert, &files.key).map_err(|message| {
                    StartError::Tls {
                        address: spec.address,
                        message,
                    }
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
        // Chosen at start: a reload that turns the upstream into a TLS or HTTP/2 one keeps the
        // default until the next restart.
        let readiness = if crate::proxy::upstream::is_plain_http1(&config.upstream) {
            Readiness::Default
        } else {
            Readiness::Fresh
        };
        let workers = Workers::start(config.workers, readiness).map_err(StartError::Workers)?;
        Ok(Server {
            health: Arc::new(Health::new(proxy.clone())),
            proxy,
            config,
            listeners,
            admin,
            workers,
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

    /// The proxy this server runs (a handle: its store's health, its metrics), for whoever
    /// embeds the server.
    pub fn proxy(&self) -> Proxy {
        self.proxy.clone()
    }

    /// Serves until `shutdown` resolves, then drains and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            config,
            proxy,
            listeners,
            admin,
            health,
            workers,
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
            tokio::spawn(crate::admin::serve(
                listener,
                health.clone(),
                proxy.clone(),
                admin_stop.clone(),
            ))
        });

        let stop = CancellationToken::new();
        let shared = conn::Shared::new(proxy.clone(), &config, stop.clone());
        let connections = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(config.max_connections));
        // Every serving thread accepts on every listener (see `workers`).
        let copies = ListenerCopy::take_over(listeners);
        let accepting = CancellationToken::new();
        let accept_loops = workers.spawn_each(|_| {
            let copies = ListenerCopy::share(&copies);
            let (shared, connections, permits) =
                (shared.clone(), connections.clone(), permits.clone());
            let accepting = accepting.clone();
            async move {
                let loops = copies
                    .into_iter()
                    .map(|copy| accept_loop(copy, &shared, &connections, &permits));
                tokio::select! {
                    _ = futures_util::future::join_all(loops) => {}
                    _ = accepting.cancelled() => {}
                }
            }
        });
        // The serving threads hold the only copies from here on.
        drop(copies);
        shutdown.await;
        // Stop accepting: every copy of every listener is closed once its loop has ended.
        accepting.cancel();
        for accept_loop in accept_loops {
            let _ = accept_loop.await;
        }
        // The listeners were owned by the accept loops, dropped above: no new connections.
        health.drain();
        let draining = std::time::Instant::now();
        drain(&config, &proxy, &stop, &connections).await;
        admin_stop.cancel();
        if let Some(task) = admin_task {
            let _ = task.await;
        }
        if let Some(task) = reloader {
            let _ = task.await;
        }
        workers.stop().await;
        // The spans of the last requests go out in what is left of `shutdown_timeout`.
        let left = config.shutdown_timeout.saturating_sub(draining.elapsed());
        proxy.flush_traces(left).await;
    }
}

/// Waits, at most `shutdown_timeout`, for the requests in flight, the tunnels and the
/// exchanges whose client left, after telling the connections to stop.
async fn drain(
    config: &Config,
    proxy: &Proxy,
    stop: &CancellationToken,
    connections: &TaskTracker,
) {
    tracing::info!(timeout = %humantime::format_duration(config.shutdown_timeout), "shutting down: draining in-flight requests");
    stop.cancel();
    connections.close();
    let tunnels = proxy.tunnels().clone();
    tunnels.close();
    // Exchanges whose client left are waited for like the requests still in flight.
    let orphans = proxy.orphans().clone();
    orphans.close();
    let drained = tokio::time::timeout(config.shutdown_timeout, async {
        connections.wait().await;
        tunnels.wait().await;
        orphans.wait().await;
    })
    .await;
    match drained {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => {
            tracing::warn!("shutdown timeout passed with requests still in flight; exiting")
        }
    }
}

async fn accept_loop(
    copy: ListenerCopy,
    shared: &Arc<conn::Shared>,
    connections: &TaskTracker,
    permits: &Arc<Semaphore>,
) {
    let bound = match TcpListener::from_std(copy.listener) {
        Ok(listener) => BoundListener {
            listener,
            tls: copy.tls,
        },
        Err(e) => {
            tracing::error!(cause = %crate::error::chain(&e), "a serving thread cannot accept on a listener");
            return;
        }
    };
    loop {
        // Past max_connections, new connections wait in the kernel's backlog.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match bound.listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(cause = %crate::error::chain(&e), "accept failed");
                tokio::time::sleep(conn::ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let open = GaugeGuard::new(&shared.proxy.metrics().client_connections);
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
                let (acceptor, shared) = (acceptor.clone(), shared.clone());
                connections.spawn(async move {
                    conn::serve_tls(stream, acceptor, info, shared).await;
                    drop((open, permit));
                });
            }
        }
    }
}
