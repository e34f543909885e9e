//! The request path: [`Proxy::handle`] runs the stages in order and nothing else, each a module
//! with a typed result (see `stages`):
//!
//! 1. shape (`shape`): shapes no app should see, and CONNECT, refused before anything else;
//! 2. usage (`stages::usage`): a request to the configured `usage` path answered by
//!    [`crate::usage`], never forwarded;
//! 3. route (`stages::route`): the request's route ([`routing::Routed`]) and the routes a method
//!    override reaches; where an identity of theirs names a form field, the form body is read
//!    (`stages::form`, bounded) and forwarded as read;
//! 4. identify and limit (`stages::identify`, `stages::limit`): the caller on each route, and
//!    its limits decided ([`crate::throttle::LimitOutcome`]): an [`crate::throttle::Admitted`]
//!    request, or the answer to a refused one;
//! 5. protect (`stages::protect`): a [`crate::protect::Slot`] in the app, or shed (503);
//! 6. forward (`stages::forward`): the request as the upstream receives it, sent through
//!    `exchange`, and its answer as the client receives it;
//! 7. respond (`stages::respond`): the rate-limit fields, the settlement, concurrency slots
//!    held until the body ends.
//!
//! Every answer tollgate makes itself is rendered by [`crate::answers`]. One `RequestRecord`
//! per request (see `record`) collects what the stages found and writes it once to the
//! metrics, the access log and `tracing`. [`runtime`] holds what the stages run on.

mod answer_body;
mod early_answer;
mod exchange;
pub mod headers;
mod http1_pool;
mod record;
mod runtime;
pub mod shape;
mod stages;
pub mod upstream;

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response};
use tokio_util::task::TaskTracker;

use crate::answers::Answer;
use crate::body;
use crate::config::Config;
use crate::control::Control;
use crate::metrics::Metrics;
use crate::protect::Protector;
use record::{BodyRecord, RequestRecord};
use runtime::{Inner, Runtime};
use stages::{form as form_body, forward, limit, protect, respond, route, usage};

pub use answer_body::AnswerBody;
pub use record::RecordedBody;
pub use stages::forward::ConnInfo;

/// The proxy: cheap to clone, one per process, shared by every connection.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

impl Proxy {
    pub fn new(config: Arc<Config>) -> Self {
        let metrics = Metrics::new();
        let tracing = config.traces.as_ref().and_then(|traces| {
            match crate::traces::Tracing::start(
                traces,
                metrics.traces(),
                &config.throttle.trusted_proxies,
            ) {
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

    /// Whether the running configuration's deny cache remembers denials yet: with a Redis
    /// store, not until its reset watch has read the reset generation once (just after the
    /// store connects).
    pub fn remembers_denials(&self) -> bool {
        self.inner.runtime.load().limits.denials().remembers()
    }

    /// Whether the running configuration's limit stage has a temporary override in force (set
    /// here, or read from Redis by its watch): lets a test wait for a replica to have read one.
    pub fn applies_overrides(&self) -> bool {
        !self.inner.runtime.load().limits.overrides().is_empty()
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

    /// Whether this instance should receive traffic as far as the store is concerned: not
    /// while the first connection is being made (requests would wait for it); after that, a
    /// store that cannot be reached matters only when `on_error: deny` would refuse everything.
    pub fn store_ready(&self) -> bool {
        let runtime = self.inner.runtime.load();
        let stores = runtime.limits.stores();
        stores.ready() || !stores.connecting() && stores.on_error() != crate::config::OnError::Deny
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
    /// served without being boxed (see `conn`). The stages are awaited inline in this one
    /// future, so each one's state is part of it: the stages borrow the request and only the
    /// forward stage takes it, and every rare case inside a stage is boxed (the test
    /// `the_request_future_stays_small` holds the size).
    ///
    /// With traces on, the request's spans start here, and a sampled request's future runs in
    /// a `tracing` span carrying their ids, so that every line logged while it is handled
    /// carries them (`Span::none()` otherwise: a check per poll).
    pub fn handle<B>(
        self,
        request: Request<B>,
        conn: ConnInfo,
    ) -> tracing::instrument::Instrumented<impl std::future::Future<Output = Response<RecordedBody>>>
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

    /// [`Proxy::handle`]'s future: `trace` holds the request's spans, with traces on. The
    /// stages in order, each a module of `stages` (or `shape`) with a typed result. The
    /// request's record is made here and, once the stages have answered, goes on in the
    /// response body, to be written when the exchange is over (see `record`).
    async fn serve<B>(
        self,
        request: Request<B>,
        conn: ConnInfo,
        trace: Option<Box<crate::traces::RequestSpan>>,
    ) -> Response<RecordedBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let runtime = self.inner.runtime.load_full();
        let (mut parts, body) = request.into_parts();
        // Written when the response body ends, or here if this future is dropped first (the
        // client left).
        let mut record =
            RequestRecord::start(&self.inner.metrics, &runtime, &parts, conn.peer, trace);
        let inner = &*self.inner;
        // A block, not a function of its own: an async function's future would be moved
        // (copied whole) into this one's.
        let response = 'stages: {
            // One pass over the request's headers answers what the path asks of them.
            let found = headers::scan(&parts.headers);
            // How tollgate's own answers are put to this caller (see `answers`).
            let form = found.answer_form(&parts.headers);
            if let Some(refusal) = shape::check(&parts, &found) {
                break 'stages respond::rejected(refusal.answer(), &mut record, form);
            }
            if usage::asks(&runtime, &parts) {
                // Boxed: the store read's future would otherwise size every request's.
                let answering =
                    usage::answer(inner, &runtime, &parts, conn.peer.ip(), &mut record, form);
                break 'stages Box::pin(answering).await;
            }
            let routes = route::route(&runtime, &parts, &mut record);
            let routed = routes.routed;
            // A form body is read only where an identity of the request's routes names a field.
            let body = match form_body::body(&runtime, &routes, &mut parts, body).await {
                Ok(body) => body,
                Err(error) => {
                    record.rejected();
                    break 'stages respond::refuse(Answer::Failed(&error), &mut record, form);
                }
            };
            let limiting = limit::limit(&runtime, routes, &parts, conn.peer.ip(), &mut record);
            let mut admitted = match limiting.await {
                Ok(admitted) => admitted,
                Err(refused) => break 'stages respond::refuse(*refused, &mut record, form),
            };
            let slot = match protect::admit(&runtime, admitted.as_mut(), &mut record).await {
                Ok(slot) => slot,
                Err(protect::Shed) => {
                    break 'stages respond::refuse(Answer::Overloaded, &mut record, form)
                }
            };
            let incoming = forward::Incoming::new(parts, body, found, conn, routed);
            let forwarding = forward::forward(
                inner,
                &runtime,
                incoming,
                admitted.as_mut(),
                slot,
                &mut record,
            );
            let forwarded = forwarding.await;
            respond::respond(inner, &runtime, admitted, forwarded, &mut record, form).await
        };
        BodyRecord::around(response, record.detach(), self.inner, runtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (request, conn) = get_x();
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

    /// A `GET /x` from a plain-TCP client.
    fn get_x() -> (Request<http_body_util::Empty<Bytes>>, ConnInfo) {
        let request = Request::get("/x")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let conn = ConnInfo {
            peer: "192.0.2.1:5000".parse().unwrap(),
            tls: false,
        };
        (request, conn)
    }

    /// The request's future is what every request moves and polls: the rare cases inside the
    /// stages are boxed so that it stays small (see `serve`); the bound is what the path
    /// needs today with some room, so a stage that inlines a rare case fails here.
    #[test]
    fn the_request_future_stays_small() {
        let yaml = "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:9 }\n";
        let config = crate::config::parse(std::path::Path::new("t.yaml"), yaml, |_| None).unwrap();
        let proxy = Proxy::new(Arc::new(config));
        let (request, conn) = get_x();
        let size = std::mem::size_of_val(&proxy.handle(request, conn));
        assert!(size <= 4240, "the request future grew to {size} bytes");
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
