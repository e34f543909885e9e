//! One client connection, from accept to close.
//!
//! A plain-TCP connection is served in cycles so that an idle keep-alive connection costs only
//! its socket and a few hundred bytes: hyper keeps an 8 KiB read buffer and an 8 KiB header
//! write buffer per HTTP/1 connection for as long as the connection lives, which at 10,000
//! idle clients is most of the process's memory. Each cycle:
//!
//! 1. *Parked*: wait until the socket is readable, holding no hyper object and no buffer. An
//!    idle connection closes after `idle_timeout` (after `header_read_timeout` if it holds part
//!    of a request head), and at once when the server drains.
//! 2. On the first cycle only, look at the first bytes: the HTTP/2 preface (h2c with prior
//!    knowledge) hands the connection to hyper's HTTP/2 server for the rest of its life.
//! 3. *Serving*: a fresh hyper HTTP/1 connection reads the bytes carried over from the previous
//!    cycle, then the socket, and serves requests until [`IdleIo`] reports the moment it is
//!    idle with nothing buffered (see `idle`); then it is shut down gracefully, which at that
//!    moment just stops it, and taken apart: the socket and any unparsed bytes go back to 1.
//!
//! An upgrade (WebSocket) is done by hand at step 3: the service readies the connection's
//! [`Handoff`] for an upgrade request, and once the 101 is written the socket (with any bytes
//! read past the request) goes through it to the tunnel (see `upgrade`).
//!
//! A TLS connection ([`serve_tls`]) is not parked: rustls may hold decrypted bytes that the
//! socket's readiness would not show. After the handshake (bounded by `header_read_timeout`)
//! its first bytes tell HTTP/1 from HTTP/2 as on a plain connection, and one hyper connection
//! serves it for its whole life, upgrades done by hyper.
//!
//! Both kinds are served by the same hyper settings, made once by [`hyper_builders`]: the
//! same head size limit (431), header read timeout and HTTP/2 limits over TLS as over TCP.
//! One difference in who keeps the header read timeout: over TLS hyper does, over plain TCP
//! the connection's [`IdleIo`] does, because hyper's timer is an allocation and a timer
//! registration for every request and `IdleIo` already has a timer of its own.
//!
//! Graceful shutdown is a [`CancellationToken`]: parked connections close, a serving HTTP/1
//! connection finishes the request in progress and closes, HTTP/2 connections send GOAWAY.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::body::Guarded;
use crate::idle::{Activity, IdleIo, Idleness, RequestInFlight};
use crate::metrics::GaugeGuard;
use crate::proxy::{ConnInfo, Proxy, RecordedBody};
use crate::upgrade::{rewind, Handoff, Rewind};

/// hyper answers 431 when the request head does not fit this buffer.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long an HTTP/1 connection stays idle with its hyper connection before it is parked, at
/// first. Parking at once would rebuild hyper's connection for nearly every request of a busy
/// keep-alive client (its next request comes within a millisecond or so); a short wait keeps
/// those and still parks every connection that is really idle.
const PARK_AFTER: Duration = Duration::from_millis(20);

/// The longest a connection waits before it is parked. A parked connection that is woken
/// sooner than this was parked in vain (rebuilding hyper's connection costs a good part of a
/// request), so its next wait doubles, up to this; one woken later
/// starts again from [`PARK_AFTER`]. A client that pauses 50 ms between requests is parked
/// twice and then kept; one that sends a request and goes quiet is parked after 20 ms.
const PARK_AFTER_MAX: Duration = Duration::from_secs(1);

/// The wait before the next park, given the last one and how long the connection then stayed
/// parked.
fn next_park_after(last: Duration, parked_for: Duration) -> Duration {
    if parked_for < PARK_AFTER_MAX {
        doubled(last)
    } else {
        PARK_AFTER
    }
}

/// A wait twice as long, up to [`PARK_AFTER_MAX`].
fn doubled(wait: Duration) -> Duration {
    (wait * 2).min(PARK_AFTER_MAX)
}

/// What the client sends first on an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The proxy as one connection sees it: each request (and its body) is marked in flight until
/// its response body ends, which is what the idle timeout and parking wait for, and an upgrade
/// hands the connection over to the tunnel for good.
///
/// Served to hyper as a hyper `Service` ([`ConnectionService::hyper`]), not a tower one:
/// hyper-util's adapter for tower services calls the service only when hyper first polls the
/// response future, and between hyper reading a request head and that poll the connection
/// would look idle (and be parked, closing the response with `Connection: close`).
#[derive(Clone)]
pub struct ConnectionService {
    proxy: Proxy,
    info: ConnInfo,
    activity: Arc<Activity>,
    /// Set when upgrades are handed over by the connection loop (plain HTTP/1), not by hyper.
    handoff: Option<Handoff>,
    /// How an HTTP/2 request body answered early is read to its end (`lingering_close`).
    linger: crate::linger::Bounds,
}

impl ConnectionService {
    pub fn new(proxy: Proxy, info: ConnInfo, activity: Arc<Activity>) -> Self {
        ConnectionService {
            proxy,
            info,
            activity,
            handoff: None,
            linger: crate::linger::Bounds::default(),
        }
    }

    /// With these bounds for HTTP/2 request bodies answered early (see `linger`).
    pub fn lingering(self, bounds: crate::linger::Bounds) -> Self {
        ConnectionService {
            linger: bounds,
            ..self
        }
    }

    /// This connection's service as hyper calls it. Its response future is the proxy's own
    /// (with what the connection adds mapped onto its answer), a type hyper keeps in place,
    /// rather than a boxed future: boxing cost an allocation and a copy of the whole request
    /// future (several KiB) for every request.
    pub fn hyper(
        self,
    ) -> impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<ResponseBody>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<ResponseBody>, Infallible>> + Send + 'static,
    > + Clone {
        hyper::service::service_fn(move |request| self.call(request))
    }

    fn call(
        &self,
        request: Request<Incoming>,
    ) -> impl Future<Output = Result<Response<ResponseBody>, Infallible>> + Send + 'static {
        // In flight from the moment hyper hands the request over, before the future first
        // runs: the connection must not be parked between the two.
        let in_flight = self.activity.start();
        // HTTP/2 reads a body answered early to its end; HTTP/1 lingers as it closes.
        let drain = (request.version() == http::Version::HTTP_2).then_some(self.linger);
        let mut request = request.map(|body| self.activity.request_body(body, drain));
        if let Some(handoff) = &self.handoff {
            handoff.prepare(&mut request);
        }
        let activity = self.activity.clone();
        let handled = self.proxy.clone().handle(request, self.info);
        futures_util::FutureExt::map(handled, move |response| {
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                activity.upgraded();
            }
            let (parts, body) = response.into_parts();
            Ok(Response::from_parts(parts, Guarded::new(body, in_flight)))
        })
    }
}

/// What a connection sends back: the proxy's response body, holding the request in flight
/// until it ends. A type of its own rather than boxed once more: that would be a second
/// allocation and indirection for every response.
pub type ResponseBody = Guarded<RecordedBody, RequestInFlight>;

/// What every connection of the server shares.
pub struct Shared {
    pub proxy: Proxy,
    /// For plain-TCP connections, whose [`IdleIo`] bounds the time a head takes.
    pub http1: http1::Builder,
    /// For TLS connections: hyper bounds the time a head takes (see [`hyper_builders`]).
    pub http1_tls: http1::Builder,
    pub http2: http2::Builder<TokioExecutor>,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    /// How an HTTP/1 connection closed with a request body unread lingers (see `linger`).
    pub linger: crate::linger::Bounds,
    /// Cancelled when the server starts draining.
    pub stop: CancellationToken,
}

impl Shared {
    pub fn new(
        proxy: Proxy,
        config: &crate::config::Config,
        stop: CancellationToken,
    ) -> Arc<Shared> {
        let (http1_tls, http2) = hyper_builders(config);
        let mut http1 = http1_tls.clone();
        // hyper's header read timer costs an allocation and a timer registration per request;
        // a plain connection's IdleIo keeps the same bound without either.
        http1.header_read_timeout(None);
        Arc::new(Shared {
            proxy,
            http1,
            http1_tls,
            http2,
            idle_timeout: config.idle_timeout,
            header_read_timeout: config.header_read_timeout,
            linger: config.lingering_close,
            stop,
        })
    }
}

/// hyper's HTTP/1 and HTTP/2 settings for every client connection, plain or TLS: the one place
/// the limits hyper enforces are set.
pub fn hyper_builders(
    config: &crate::config::Config,
) -> (http1::Builder, http2::Builder<TokioExecutor>) {
    let h1 = http1_builder(config.header_read_timeout);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(config.http2_max_concurrent_streams)
        .max_header_list_size(MAX_HEAD_BYTES as u32);
    (h1, h2)
}

/// hyper's HTTP/1 settings for a listener whose request heads must be whole within
/// `header_read_timeout`: the proxy listener's and the admin listener's.
pub fn http1_builder(header_read_timeout: Duration) -> http1::Builder {
    let mut h1 = http1::Builder::new();
    // max_buf_size alone is checked only between reads, so a head that arrives whole in one
    // read can pass it; max_header_size checks the parsed head.
    h1.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES);
    h1
}

/// How long an accept loop waits after a failed accept (EMFILE and friends: out of
/// descriptors until some connection closes) instead of spinning on the error.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves one plain-TCP connection until it closes; see the module docs.
pub async fn serve_plain(mut stream: TcpStream, info: ConnInfo, shared: Arc<Shared>) {
    let activity = Arc::new(Activity::default());
    let mut service =
        ConnectionService::new(shared.proxy.clone(), info, activity).lingering(shared.linger);
    service.handoff = Some(Handoff::default());
    let mut carried = Bytes::new();
    let mut first = true;
    let mut park_after = PARK_AFTER;
    loop {
        let bound = if carried.is_empty() {
            shared.idle_timeout
        } else {
            shared.header_read_timeout
        };
        // The first time, enough to tell HTTP/2's preface; after that, any byte will do.
        let mut peeked = [0u8; H2_PREFACE.len()];
        let want = if first {
            &mut peeked[..]
        } else {
            &mut peeked[..1]
        };
        let parked = GaugeGuard::new(&shared.proxy.metrics().parked_connections);
        let parked_at = tokio::time::Instant::now();
        let waited = wait_for_bytes(&stream, want, bound, &shared.stop).await;
        drop(parked);
        let n = match waited {
            Some(n) if n > 0 => n,
            _ => return,
        };
        if !first {
            park_after = next_park_after(park_after, parked_at.elapsed());
        } else {
            first = false;
            match sniff(&mut stream, &peeked[..n], shared.header_read_timeout).await {
                Ok(Sniffed::Http1(read)) => carried = read,
                Ok(Sniffed::Http2(read)) => {
                    let service = ConnectionService {
                        handoff: None,
                        ..service
                    };
                    let serving = Box::pin(serve_h2(rewind(read, stream), service, &shared));
                    return serving.await;
                }
                Ok(Sniffed::Closed) | Err(_) => return,
            }
        }
        // Boxed: the serving state (hyper's connection, timers) exists only while serving; the
        // parked task should not carry its space.
        match Box::pin(serve_http1(stream, carried, &service, &shared, park_after)).await {
            Some((s, c)) => (stream, carried) = (s, c),
            None => return,
        }
    }
}

/// Waits (holding no buffer but `buf`) until the socket has bytes to read, and peeks them into
/// `buf`: Some(0) when the peer closed, None when `bound` passed, the socket failed or the
/// server is draining. Peeking rather than waiting for readiness alone: readiness can be
/// reported before any byte is there.
async fn wait_for_bytes(
    stream: &TcpStream,
    buf: &mut [u8],
    bound: Duration,
    stop: &CancellationToken,
) -> Option<usize> {
    // By hand rather than with `select!` over `peek()`: this is what every parked connection
    // holds while it waits, so it should be small.
    let mut stopped = pin!(stop.cancelled());
    let mut timer = pin!(tokio::time::sleep(bound));
    let mut buf = ReadBuf::new(buf);
    poll_fn(|cx| {
        if stopped.as_mut().poll(cx).is_ready() || timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        stream.poll_peek(cx, &mut buf).map(Result::ok)
    })
    .await
}

enum Sniffed {
    /// With the bytes taken off the socket to decide (usually none).
    Http1(Bytes),
    Http2(Bytes),
    Closed,
}

/// HTTP/1 or HTTP/2 with prior knowledge, from the first bytes (`peeked`, not taken off the
/// socket). Usually they decide; a client that sends part of the preface and pauses is read
/// (bounded by `header_read_timeout`) until the bytes differ or the preface is whole.
async fn sniff(stream: &mut TcpStream, peeked: &[u8], bound: Duration) -> io::Result<Sniffed> {
    let n = peeked.len();
    if peeked != &H2_PREFACE[..n] {
        return Ok(Sniffed::Http1(Bytes::new()));
    }
    if n == H2_PREFACE.len() {
        return Ok(Sniffed::Http2(Bytes::new()));
    }
    let mut buf = [0u8; H2_PREFACE.len()];
    // A strict prefix so far: the socket stays readable while those bytes sit there, so take
    // them off and read until it is decided.
    let mut got = 0;
    let decided = tokio::time::timeout(bound, read_preface(stream, &mut buf, &mut got)).await;
    let read = Bytes::copy_from_slice(&buf[..got]);
    match decided {
        Ok(Ok(Some(true))) => Ok(Sniffed::Http2(read)),
        Ok(Ok(Some(false))) => Ok(Sniffed::Http1(read)),
        Ok(Ok(None)) | Err(_) => Ok(Sniffed::Closed),
        Ok(Err(e)) => Err(e),
    }
}

/// Reads (into `buf`, counting in `got`) until the bytes differ from HTTP/2's preface
/// (Some(false)), the preface is whole (Some(true)) or the input ends (None).
async fn read_preface<T: AsyncRead + Unpin>(
    io: &mut T,
    buf: &mut [u8; H2_PREFACE.len()],
    got: &mut usize,
) -> io::Result<Option<bool>> {
    loop {
        let n = io.read(&mut buf[*got..]).await?;
        if n == 0 {
            return Ok(None);
        }
        *got += n;
        if buf[..*got] != H2_PREFACE[..*got] {
            return Ok(Some(false));
        }
        if *got == H2_PREFACE.len() {
            return Ok(Some(true));
        }
    }
}

/// Serves one TLS connection until it closes; see the module docs.
pub async fn serve_tls(
    stream: TcpStream,
    acceptor: TlsAcceptor,
    info: ConnInfo,
    shared: Arc<Shared>,
) {
    let peer = info.peer;
    let activity = Arc::new(Activity::default());
    // Over TLS the socket wrapper lingers, in hyper's shutdown, below the TLS layer.
    let idleness = Idleness::new(shared.idle_timeout, activity.clone()).lingering(shared.linger);
    let stream = IdleIo::with_hook(stream, idleness);
    let service = ConnectionService::new(shared.proxy.clone(), info, activity.clone())
        .lingering(shared.linger);
    // The handshake runs in the connection's task so a slow client cannot hold up accepting;
    // it is bounded like a request head.
    let mut tls_stream =
        match tokio::time::timeout(shared.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%peer, cause = %crate::error::chain(&e), "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
    // HTTP/2 if the first bytes are its preface (as ALPN's h2 promises), whatever ALPN said.
    // Bounded only by the idle timeout, like a connection waiting for its first request; a
    // draining server stops waiting.
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut got = 0;
    let decided = tokio::select! {
        decided = read_preface(&mut tls_stream, &mut buf, &mut got) => decided,
        _ = shared.stop.cancelled() => return,
    };
    let is_h2 = match decided {
        Ok(decided) => decided == Some(true),
        Err(e) => {
            tracing::debug!(%peer, cause = %crate::error::chain(&e), "connection ended with an error");
            return;
        }
    };
    // At the end of input, hyper's HTTP/1 connection sees it and closes cleanly.
    let io = TokioIo::new(rewind(Bytes::copy_from_slice(&buf[..got]), tls_stream));
    let served = if is_h2 {
        let conn = pin!(shared.http2.serve_connection(io, service.hyper()));
        until_drained(conn, &shared.stop, |c| c.graceful_shutdown()).await
    } else {
        let conn = pin!(shared
            .http1_tls
            .serve_connection(io, service.hyper())
            .with_upgrades());
        until_drained(conn, &shared.stop, |c| c.graceful_shutdown()).await
    };
    if let Err(e) = served {
        tracing::debug!(%peer, cause = %crate::error::chain(&e), "connection ended with an error");
    }
    if let Some(outcome) = activity.take_lingered() {
        shared.proxy.metrics().lingered(outcome);
    }
}

/// Serves HTTP/2 on the connection for the rest of its life.
async fn serve_h2(io: Rewind<TcpStream>, service: ConnectionService, shared: &Shared) {
    let peer = service.info.peer;
    let activity = service.activity.clone();
    let io = IdleIo::with_hook(io, Idleness::new(shared.idle_timeout, activity));
    let conn = shared
        .http2
        .serve_connection(TokioIo::new(io), service.hyper());
    let conn = pin!(conn);
    if let Err(e) = until_drained(conn, &shared.stop, |c| c.graceful_shutdown()).await {
        tracing::debug!(%peer, cause = %crate::error::chain(&e), "connection ended with an error");
    }
}

/// Drives a connection to its end; when the server starts draining, `shutdown` asks it to
/// finish what is in progress and close.
pub async fn until_drained<F: Future>(
    mut conn: Pin<&mut F>,
    stop: &CancellationToken,
    shutdown: impl FnOnce(Pin<&mut F>),
) -> F::Output {
    tokio::select! {
        biased;
        out = conn.as_mut() => return out,
        _ = stop.cancelled() => {}
    }
    shutdown(conn.as_mut());
    conn.await
}

/// One HTTP/1 cycle: serves requests until the connection can be parked, once idle for
/// `park_after` (returns the socket and the bytes read but not parsed), or ends (None).
async fn serve_http1(
    stream: TcpStream,
    carried: Bytes,
    service: &ConnectionService,
    shared: &Shared,
    park_after: Duration,
) -> Option<(TcpStream, Bytes)> {
    let activity = &service.activity;
    let peer = service.info.peer;
    let io = IdleIo::with_hook(
        rewind(carried, stream),
        Idleness::parking(
            shared.idle_timeout,
            shared.header_read_timeout,
            activity.clone(),
        ),
    );
    // Boxed so that taking it apart moves a pointer, not the whole connection.
    let mut conn = Box::new(
        shared
            .http1
            .serve_connection(TokioIo::new(io), service.clone().hyper()),
    );
    let mut parking = false;
    let mut draining = false;
    let mut stop = StopWatch::new(&shared.stop);
    let mut park_timer = ParkTimer::new(park_after);
    let served = poll_fn(|cx| {
        if !draining && stop.poll_stopped(cx) {
            draining = true;
            Pin::new(&mut *conn).graceful_shutdown();
        }
        loop {
            if let Poll::Ready(done) = Pin::new(&mut *conn).poll(cx) {
                return Poll::Ready(done);
            }
            if parking || draining || !activity.park_signalled() {
                return Poll::Pending;
            }
            // Idle between requests with nothing buffered. A client with more to send soon
            // keeps its hyper connection; one quiet for the timer's wait is parked.
            match park_timer.poll_quiet(cx, activity) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(false) => continue,
                Poll::Ready(true) => {}
            }
            if activity.take_park() && activity.parkable() {
                // Stopping hyper here closes nothing the client can see.
                parking = true;
                Pin::new(&mut *conn).graceful_shutdown();
            }
        }
    })
    .await;
    if let Err(e) = &served {
        tracing::debug!(%peer, cause = %crate::error::chain(&e), "connection ended with an error");
    }
    // hyper reports the end once its state is closed, even with bytes it could not write yet
    // (a 101, an error response, the end of a last response): let it finish writing them, as
    // its own shutdown would.
    if activity.write_pending() {
        let flushed = tokio::time::timeout(
            shared.idle_timeout,
            poll_fn(|cx| match Pin::new(&mut *conn).poll(cx) {
                Poll::Ready(Ok(())) if activity.write_pending() => Poll::Pending,
                Poll::Ready(_) => Poll::Ready(()),
                Poll::Pending => Poll::Pending,
            }),
        )
        .await;
        if flushed.is_err() {
            return None;
        }
    }
    let parts = conn.into_parts();
    let (stream, rest) = parts.io.into_inner().into_inner().into_parts();
    let rest = rest.into_bytes();
    let unparsed = join(parts.read_buf, rest);
    let handoff = service.handoff.as_ref().and_then(Handoff::take);
    if let Some(handoff) = handoff.filter(|_| activity.is_upgraded()) {
        let _ = handoff.send(rewind(unparsed, stream));
        return None;
    }
    if served.is_ok() && parking && !draining {
        return Some((stream, unparsed));
    }
    close(stream, unparsed.len(), activity, shared).await;
    None
}

/// The one timer of an HTTP/1 cycle that finds a connection quiet enough to park: armed
/// when the connection first goes idle and re-armed only when it fires, so a busy connection
/// pays one timer event per `wait`, not a timer per request. Each time it fires on a
/// connection that was busy meanwhile the wait doubles (up to PARK_AFTER_MAX), so a
/// connection that stays busy is woken about once a second; once quiet, it is parked within
/// twice its last wait. The timer is polled once after each arming (which registers the
/// task's waker with it) and afterwards only asked whether it has fired: polling a
/// registered timer on every idle moment would register the same waker again each time.
struct ParkTimer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether the task's waker is registered with `sleep`.
    registered: bool,
    /// How many requests had started when it was armed.
    armed_at: u64,
    wait: Duration,
}

impl ParkTimer {
    fn new(wait: Duration) -> ParkTimer {
        ParkTimer {
            sleep: None,
            registered: false,
            armed_at: 0,
            wait,
        }
    }

    /// On an idle connection: Ready(true) once it has been quiet for the wait, Ready(false)
    /// when the timer fired on a connection busy meanwhile (re-armed: look again), Pending
    /// until then.
    #[inline]
    fn poll_quiet(&mut self, cx: &mut Context<'_>, activity: &Activity) -> Poll<bool> {
        let timer = self.sleep.get_or_insert_with(|| {
            self.armed_at = activity.started();
            Box::pin(tokio::time::sleep(self.wait))
        });
        if self.registered && !timer.is_elapsed() {
            return Poll::Pending;
        }
        // A poll refused for want of budget registers nothing: then poll again next time.
        let budget = tokio::task::coop::has_budget_remaining();
        if timer.as_mut().poll(cx).is_pending() {
            self.registered = budget;
            return Poll::Pending;
        }
        self.registered = false;
        if activity.started() != self.armed_at {
            // Requests came and went since it was armed: quiet only from now on.
            self.armed_at = activity.started();
            self.wait = doubled(self.wait);
            timer
                .as_mut()
                .reset(tokio::time::Instant::now() + self.wait);
            return Poll::Ready(false);
        }
        Poll::Ready(true)
    }
}

/// Closes a plain HTTP/1 connection: FIN after everything written, then, if a request body was
/// let go unread, a lingering close (see `linger`): what the client still sends is read and
/// discarded, `discarded` bytes of it already read, so that the answer reaches it.
async fn close(mut stream: TcpStream, discarded: usize, activity: &Activity, shared: &Shared) {
    let shut = stream.shutdown().await;
    if shut.is_err() || !activity.take_unread() || shared.linger.is_off() {
        return;
    }
    let outcome = crate::linger::drain(&mut stream, &shared.linger, discarded as u64).await;
    shared.proxy.metrics().lingered(outcome);
}

/// Tells a serving HTTP/1 connection that the server has begun to drain, polled on every
/// wake-up of the connection (two or three per request).
///
/// Why not poll the token's `cancelled()` future each time: that takes the token's mutex,
/// one lock shared by every connection of every serving thread, on each poll. Here the
/// future is polled once to register, with a waker of its own that raises a flag of this
/// connection's before waking the task; later polls read that flag and poll the future again
/// only when it was raised.
struct StopWatch<'a> {
    cancelled: Pin<Box<tokio_util::sync::WaitForCancellationFuture<'a>>>,
    woken: Arc<StopWoken>,
}

struct StopWoken {
    /// Raised at the start too, so that the first poll registers.
    raised: AtomicBool,
    task: std::sync::Mutex<Option<Waker>>,
}

impl std::task::Wake for StopWoken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.raised.store(true, Ordering::Release);
        if let Some(task) = &*self.task.lock().unwrap_or_else(|e| e.into_inner()) {
            task.wake_by_ref();
        }
    }
}

impl<'a> StopWatch<'a> {
    fn new(stop: &'a CancellationToken) -> Self {
        StopWatch {
            cancelled: Box::pin(stop.cancelled()),
            woken: Arc::new(StopWoken {
                raised: AtomicBool::new(true),
                task: std::sync::Mutex::new(None),
            }),
        }
    }

    /// True once the token is cancelled.
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.woken.raised.swap(false, Ordering::Acquire) {
            return false;
        }
        {
            let mut task = self.woken.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let waker = Waker::from(self.woken.clone());
        self.cancelled
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
    }
}

/// The bytes hyper read but did not parse, then those it was never given. A partial head is
/// copied out so the parked connection does not keep hyper's whole read buffer alive.
fn join(read_buf: Bytes, rest: Bytes) -> Bytes {
    match (read_buf.is_empty(), rest.is_empty()) {
        (true, true) => Bytes::new(),
        (true, false) => rest,
        _ => {
            let mut all = BytesMut::with_capacity(read_buf.len() + rest.len());
            all.extend_from_slice(&read_buf);
            all.extend_from_slice(&rest);
            all.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    #[test]
    fn a_park_in_vain_doubles_the_next_wait_and_a_long_one_starts_over() {
        let ms = Duration::from_millis;
        // Woken 50 ms after each park: parked twice, then kept (the wait outgrows the pause).
        let mut wait = PARK_AFTER;
        let mut parks = 0;
        for _ in 0..10 {
            if wait < ms(50) {
                parks += 1;
                wait = next_park_after(wait, ms(50) - wait);
            }
        }
        assert_eq!((parks, wait), (2, ms(80)));
        // Never past the maximum, however often it is woken early.
        assert_eq!(next_park_after(ms(640), ms(900)), PARK_AFTER_MAX);
        assert_eq!(next_park_after(PARK_AFTER_MAX, ms(10)), PARK_AFTER_MAX);
        // Parked for the maximum or longer: really idle, so the next park comes early again.
        assert_eq!(next_park_after(ms(640), PARK_AFTER_MAX), PARK_AFTER);
        assert_eq!(next_park_after(ms(80), Duration::from_secs(30)), PARK_AFTER);
    }

    #[tokio::test]
    async fn a_connection_task_carries_no_buffers() {
        let config = crate::config::parse(
            Path::new("t.yaml"),
            "listen: 127.0.0.1:0\nupstream: { url: http://127.0.0.1:9 }\n",
            |_| None,
        )
        .unwrap();
        let proxy = Proxy::new(Arc::new(config.clone()));
        let shared = Shared::new(proxy, &config, CancellationToken::new());
        let (_client, server) = pair().await;
        let info = ConnInfo {
            peer: server.peer_addr().unwrap(),
            tls: false,
        };
        let task = serve_plain(server, info, shared);
        // What a parked connection costs besides its socket: the task's future. hyper's
        // connection (and the HTTP/2 one) are boxed and exist only while serving.
        let size = std::mem::size_of_val(&task);
        assert!(size <= 768, "the connection future grew to {size} bytes");
    }
}
