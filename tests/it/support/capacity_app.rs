//! A capacity-limited app for the overload tests and the overload benchmark: a real HTTP/1.1
//! server on 127.0.0.1 that models an app with a fixed number of slots (a thread pool) and a
//! service time.
//!
//! Every ordinary request takes a slot, waiting for one in arrival order for as long as it
//! takes (as requests wait in a thread pool's queue), holds it for the service time, then
//! answers `200 ok`. The service time is kept in the app's own time, not the timer's: a waiter
//! granted a slot starts when the slot's previous request was due to end (or when it arrived,
//! if later), so a timer that fires late on a busy machine delays one answer but not the
//! ones queued behind it, and a saturated app serves exactly slots / service time a second
//! (a benchmark's goodput is measured against that capacity).
//! The work is detached from the connection: a request whose client has gone
//! away is still served when its turn comes, which is what makes an unprotected app's queue eat
//! every request under overload. A fraction of the requests can answer `500` instead (after
//! their service time, like a failing dependency). The app never answers `503`, so a client can
//! count every `503` as shed by the front.
//!
//! Two routes hold no slot (a sidecar's long-lived exchanges do not use the app's workers):
//! `/stream` sends its head and a first chunk at once and ends only when
//! [`AppControl::release_streams`] is called; `/ws` is a WebSocket echo.
//!
//! [`AppControl`] changes slots, service time and the error fraction while the app runs
//! (degrade, recover) and reads its counters. The server runs on a thread and runtime of its
//! own, so a busy test runtime does not distort its timing; it stops when [`CapacityApp`] is
//! dropped.
//!
//! `examples/overload_app.rs` wraps this same file (`#[path]`) for `bench/overload.sh`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{oneshot, watch};

type Body = BoxBody<Bytes, Infallible>;

/// A running app. Dropping it stops the server (its thread ends with its runtime).
pub struct CapacityApp {
    pub addr: SocketAddr,
    control: AppControl,
    _stop: oneshot::Sender<()>,
}

/// Changes the app while it runs and reads its counters; cheap to clone.
#[derive(Clone)]
pub struct AppControl {
    shared: Arc<Shared>,
}

/// A snapshot of the app's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppStats {
    /// Slot requests that arrived.
    pub arrived: usize,
    /// Answered `200` after holding a slot (whether or not their client was still there).
    pub served: usize,
    /// Answered `500` after holding a slot.
    pub errors: usize,
    /// Answered `500` without a slot: dropped from the queue by [`AppControl::drop_waiting`].
    pub dropped: usize,
    /// Holding a slot now.
    pub in_service: usize,
    /// Waiting for a slot now, and the most that ever waited at once.
    pub waiting: usize,
    pub max_waiting: usize,
    /// The most requests that ever held a slot at once.
    pub max_in_service: usize,
    pub slots: usize,
    pub service_time: Duration,
    /// `/stream` responses and `/ws` tunnels open now.
    pub open_streams: usize,
    pub open_websockets: usize,
}

struct Shared {
    gate: Mutex<Gate>,
    service_us: AtomicU64,
    /// Error fraction in parts per million.
    error_ppm: AtomicU32,
    /// Numbers the requests for the deterministic error pattern.
    error_seq: AtomicU64,
    arrived: AtomicUsize,
    served: AtomicUsize,
    errors: AtomicUsize,
    dropped: AtomicUsize,
    open_streams: AtomicUsize,
    open_websockets: AtomicUsize,
    release_streams: watch::Sender<u64>,
}

/// The app's slots: a FIFO of waiters, granted as slots free up. `busy` may exceed `slots` for a
/// while after the slots were reduced; no new slot is granted until it is back below.
struct Gate {
    slots: usize,
    busy: usize,
    max_busy: usize,
    queue: VecDeque<Waiting>,
    max_queue: usize,
}

/// A request waiting for a slot: when it arrived, and where its start time goes.
struct Waiting {
    arrived: Instant,
    start: oneshot::Sender<Instant>,
}

impl Gate {
    /// Grants free slots to waiters; `freed` is when the slot became free in the app's time.
    fn grant_waiters(&mut self, freed: Instant) {
        while self.busy < self.slots {
            let Some(waiter) = self.queue.pop_front() else {
                break;
            };
            if waiter.start.send(freed.max(waiter.arrived)).is_ok() {
                self.busy += 1;
            }
        }
        self.max_busy = self.max_busy.max(self.busy);
    }
}

impl Shared {
    /// Waits for a slot: when its service starts in the app's time, or `None` if the wait
    /// was ended by [`AppControl::drop_waiting`].
    async fn acquire(&self) -> Option<Instant> {
        let granted = {
            let mut gate = self.gate.lock().unwrap();
            let now = Instant::now();
            if gate.busy < gate.slots && gate.queue.is_empty() {
                gate.busy += 1;
                gate.max_busy = gate.max_busy.max(gate.busy);
                return Some(now);
            }
            let (start, rx) = oneshot::channel();
            gate.queue.push_back(Waiting {
                arrived: now,
                start,
            });
            gate.max_queue = gate.max_queue.max(gate.queue.len());
            rx
        };
        // The granting side counted this request as busy already.
        granted.await.ok()
    }

    /// Gives a slot back that was due to be free at `due`.
    fn release(&self, due: Instant) {
        let mut gate = self.gate.lock().unwrap();
        gate.busy -= 1;
        gate.grant_waiters(due);
    }

    /// Whether the next request fails: exactly `fraction` of them, spread evenly.
    fn next_fails(&self) -> bool {
        let ppm = u64::from(self.error_ppm.load(Ordering::Relaxed));
        let n = self.error_seq.fetch_add(1, Ordering::Relaxed);
        (n + 1) * ppm / 1_000_000 > n * ppm / 1_000_000
    }

    /// One request's work, run to its end even if the client leaves.
    async fn work(self: Arc<Self>) -> StatusCode {
        self.arrived.fetch_add(1, Ordering::Relaxed);
        let Some(start) = self.acquire().await else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return StatusCode::INTERNAL_SERVER_ERROR;
        };
        let service = Duration::from_micros(self.service_us.load(Ordering::Relaxed));
        let due = start + service;
        tokio::time::sleep_until(due.into()).await;
        let fails = self.next_fails();
        self.release(due);
        if fails {
            self.errors.fetch_add(1, Ordering::Relaxed);
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            self.served.fetch_add(1, Ordering::Relaxed);
            StatusCode::OK
        }
    }
}

impl CapacityApp {
    /// Starts an app with `slots` slots, each request holding one for `service_time`.
    pub fn start(slots: usize, service_time: Duration) -> CapacityApp {
        Self::start_on("127.0.0.1:0".parse().unwrap(), slots, service_time)
    }

    /// The same on a given address (port 0 for any).
    pub fn start_on(addr: SocketAddr, slots: usize, service_time: Duration) -> CapacityApp {
        let listener = std::net::TcpListener::bind(addr).expect("bind the capacity app");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            gate: Mutex::new(Gate {
                slots,
                busy: 0,
                max_busy: 0,
                queue: VecDeque::new(),
                max_queue: 0,
            }),
            service_us: AtomicU64::new(service_time.as_micros() as u64),
            error_ppm: AtomicU32::new(0),
            error_seq: AtomicU64::new(0),
            arrived: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            errors: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            open_streams: AtomicUsize::new(0),
            open_websockets: AtomicUsize::new(0),
            release_streams: watch::channel(0).0,
        });
        let (stop, stopped) = oneshot::channel();
        let serving = shared.clone();
        std::thread::Builder::new()
            .name("capacity-app".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, serving) => {}
                    }
                });
            })
            .unwrap();
        CapacityApp {
            addr,
            control: AppControl { shared },
            _stop: stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn control(&self) -> AppControl {
        self.control.clone()
    }

    pub fn stats(&self) -> AppStats {
        self.control.stats()
    }
}

impl std::ops::Deref for CapacityApp {
    type Target = AppControl;
    fn deref(&self) -> &AppControl {
        &self.control
    }
}

impl AppControl {
    /// Sets the number of slots; requests already holding one keep it.
    pub fn set_slots(&self, slots: usize) {
        let mut gate = self.shared.gate.lock().unwrap();
        gate.slots = slots;
        gate.grant_waiters(Instant::now());
    }

    /// Sets the service time of requests that take their slot from now on.
    pub fn set_service_time(&self, service_time: Duration) {
        self.shared
            .service_us
            .store(service_time.as_micros() as u64, Ordering::Relaxed);
    }

    /// Slots and service time at once: `degrade(4, 40ms)`, `degrade(8, 20ms)` to recover.
    pub fn set_capacity(&self, slots: usize, service_time: Duration) {
        self.set_service_time(service_time);
        self.set_slots(slots);
    }

    /// From now on this fraction (0.0–1.0) of the requests answers `500`, evenly spread.
    pub fn set_error_fraction(&self, fraction: f64) {
        let ppm = (fraction.clamp(0.0, 1.0) * 1_000_000.0).round() as u32;
        self.shared.error_ppm.store(ppm, Ordering::Relaxed);
    }

    /// Ends every `/stream` response open now.
    pub fn release_streams(&self) {
        self.shared.release_streams.send_modify(|n| *n += 1);
    }

    /// Empties the queue: every waiting request answers `500` at once, without a slot (a
    /// benchmark's reset between two runs). Returns how many there were.
    pub fn drop_waiting(&self) -> usize {
        let mut gate = self.shared.gate.lock().unwrap();
        let waiting = gate.queue.len();
        gate.queue.clear();
        waiting
    }

    /// Forgets the high-water marks (`max_waiting`, `max_in_service`), e.g. between phases.
    pub fn reset_maxima(&self) {
        let mut gate = self.shared.gate.lock().unwrap();
        gate.max_queue = gate.queue.len();
        gate.max_busy = gate.busy;
    }

    /// Requests per second the app can serve now: slots / service time.
    pub fn capacity_per_second(&self) -> f64 {
        let stats = self.stats();
        stats.slots as f64 / stats.service_time.as_secs_f64()
    }

    pub fn stats(&self) -> AppStats {
        let shared = &self.shared;
        let gate = shared.gate.lock().unwrap();
        AppStats {
            arrived: shared.arrived.load(Ordering::Relaxed),
            served: shared.served.load(Ordering::Relaxed),
            errors: shared.errors.load(Ordering::Relaxed),
            dropped: shared.dropped.load(Ordering::Relaxed),
            in_service: gate.busy,
            waiting: gate.queue.len(),
            max_waiting: gate.max_queue,
            max_in_service: gate.max_busy,
            slots: gate.slots,
            service_time: Duration::from_micros(shared.service_us.load(Ordering::Relaxed)),
            open_streams: shared.open_streams.load(Ordering::Relaxed),
            open_websockets: shared.open_websockets.load(Ordering::Relaxed),
        }
    }
}

impl AppStats {
    /// The counters as JSON (for the benchmark's control port).
    #[allow(
        dead_code,
        reason = "examples/overload_app.rs serves it; no test reads it"
    )]
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "arrived": self.arrived, "served": self.served, "errors": self.errors,
            "dropped": self.dropped,
            "in_service": self.in_service, "waiting": self.waiting,
            "max_waiting": self.max_waiting, "max_in_service": self.max_in_service,
            "slots": self.slots, "service_ms": self.service_time.as_secs_f64() * 1000.0,
            "open_streams": self.open_streams, "open_websockets": self.open_websockets,
        })
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or similar: try again shortly rather than end the app.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(req, shared).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

fn full(bytes: &'static [u8]) -> Body {
    Full::new(Bytes::from_static(bytes)).boxed()
}

async fn handle(mut req: Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    match req.uri().path() {
        "/stream" => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(2);
            let mut release = shared.release_streams.subscribe();
            release.mark_unchanged();
            shared.open_streams.fetch_add(1, Ordering::Relaxed);
            let counting = shared.clone();
            tokio::spawn(async move {
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"open\n"))))
                    .await
                    .is_ok()
                {
                    tokio::select! {
                        _ = release.changed() => {
                            let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"closed\n")))).await;
                        }
                        _ = tx.closed() => {}
                    }
                }
                counting.open_streams.fetch_sub(1, Ordering::Relaxed);
            });
            let mut rx = rx;
            let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            Response::new(BodyExt::boxed(StreamBody::new(frames)))
        }
        "/ws" => websocket(&mut req, shared),
        _ => {
            // Detached, so the slot is used even when the client gives up meanwhile.
            let status = tokio::spawn(shared.work()).await.unwrap_or(StatusCode::OK);
            let body: &'static [u8] = if status.is_success() {
                b"ok\n"
            } else {
                b"app error\n"
            };
            Response::builder().status(status).body(full(body)).unwrap()
        }
    }
}

/// `/ws`: a WebSocket echo that holds no slot, counted while open.
fn websocket(req: &mut Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(full(b"websocket key missing\n"))
            .unwrap();
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        shared.open_websockets.fetch_add(1, Ordering::Relaxed);
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(message)) = ws.next().await {
            if message.is_text() || message.is_binary() {
                if ws.send(message).await.is_err() {
                    break;
                }
            } else if message.is_close() {
                break;
            }
        }
        shared.open_websockets.fetch_sub(1, Ordering::Relaxed);
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .body(full(b""))
        .unwrap()
}
