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
//! An upgrade (WebSocket) is done by hand at step 3: the request carries a
//! [`crate::proxy::ClientUpgrade`], and once the 101 is written the socket (with any bytes read
//! past the request) goes to the proxy's tunnel through it.
//!
//! Graceful shutdown is a [`CancellationToken`]: parked connections close, a serving HTTP/1
//! connection finishes the request in progress and closes, HTTP/2 connections send GOAWAY.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use crate::idle::{Activity, IdleIo, RequestBody};
use crate::metrics::Held;
use crate::proxy::body::{with_guard, ProxyBody};
use crate::proxy::{ClientUpgrade, ConnInfo, Proxy};

/// hyper answers 431 when the request head does not fit this buffer.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long an HTTP/1 connection stays idle with its hyper connection before it is parked.
/// Parking at once would rebuild hyper's connection for nearly every request of a busy
/// keep-alive client (its next request comes within a millisecond or so); a short wait keeps
/// those and still parks every connection that is really idle.
const PARK_AFTER: Duration = Duration::from_millis(20);

/// What the client sends first on an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client's socket after an upgrade, with the bytes read from it past the request.
pub type Upgraded = Rewind<TcpStream>;

/// The proxy as one connection sees it: each request (and its body) is marked in flight until
/// its response body ends, which is what the idle timeout and parking wait for, and an upgrade
/// hands the connection over to the tunnel for good.
///
/// A hyper `Service`, not a tower one: hyper-util's adapter for tower services calls the
/// service only when hyper first polls the response future, and between hyper reading a
/// request head and that poll the connection would look idle (and be parked, closing the
/// response with `Connection: close`).
#[derive(Clone)]
pub struct ConnectionService {
    proxy: Proxy,
    info: ConnInfo,
    activity: Arc<Activity>,
    /// Upgrades are handed over by the connection loop (plain HTTP/1), not by hyper.
    manual_upgrades: bool,
}

impl ConnectionService {
    pub fn new(proxy: Proxy, info: ConnInfo, activity: Arc<Activity>) -> Self {
        ConnectionService {
            proxy,
            info,
            activity,
            manual_upgrades: false,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        // In flight from the moment hyper hands the request over, before the future first
        // runs: the connection must not be parked between the two.
        let in_flight = self.activity.start();
        let mut request = request.map(|body| RequestBody::new(body, &self.activity));
        if self.manual_upgrades
            && request
                .extensions()
                .get::<hyper::upgrade::OnUpgrade>()
                .is_some()
        {
            let (handoff, client) = tokio::sync::oneshot::channel();
            self.activity.set_handoff(handoff);
            request.extensions_mut().insert(ClientUpgrade::new(client));
        }
        let proxy = self.proxy.clone();
        let activity = self.activity.clone();
        let info = self.info;
        Box::pin(async move {
            let response = proxy.handle(request, info).await;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                activity.upgraded();
            }
            let (parts, body) = response.into_parts();
            Ok(Response::from_parts(parts, with_guard(body, in_flight)))
        })
    }
}

/// What every connection of the server shares.
pub struct Shared {
    pub proxy: Proxy,
    pub http1: http1::Builder,
    pub http2: http2::Builder<TokioExecutor>,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    /// Cancelled when the server starts draining.
    pub stop: CancellationToken,
}

impl Shared {
    pub fn new(
        proxy: Proxy,
        config: &crate::config::Config,
        stop: CancellationToken,
    ) -> Arc<Shared> {
        let mut h1 = http1::Builder::new();
        // max_buf_size alone is checked only between reads, so a head that arrives whole in one
        // read can pass it; max_header_size checks the parsed head.
        h1.timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .max_header_size(MAX_HEAD_BYTES);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(config.http2_max_concurrent_streams)
            .max_header_list_size(MAX_HEAD_BYTES as u32);
        Arc::new(Shared {
            proxy,
            http1: h1,
            http2: h2,
            idle_timeout: config.idle_timeout,
            header_read_timeout: config.header_read_timeout,
            stop,
        })
    }
}

/// Serves one plain-TCP connection until it closes; see the module docs.
pub async fn serve_plain(mut stream: TcpStream, info: ConnInfo, shared: Arc<Shared>) {
    let activity = Arc::new(Activity::default());
    let mut service = ConnectionService::new(shared.proxy.clone(), info, activity);
    service.manual_upgrades = true;
    let mut carried = Bytes::new();
    let mut first = true;
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
        let parked = Held::new(&shared.proxy.metrics().parked_connections);
        let waited = wait_for_bytes(&stream, want, bound, &shared.stop).await;
        drop(parked);
        let n = match waited {
            Some(n) if n > 0 => n,
            _ => return,
        };
        if first {
            first = false;
            match sniff(&mut stream, &peeked[..n], shared.header_read_timeout).await {
                Ok(Sniffed::Http1(read)) => carried = read,
                Ok(Sniffed::Http2(read)) => {
                    let service = ConnectionService {
                        manual_upgrades: false,
                        ..service
                    };
                    let serving = Box::pin(serve_h2(Rewind::new(read, stream), service, &shared));
                    return serving.await;
                }
                Ok(Sniffed::Closed) | Err(_) => return,
            }
        }
        // Boxed: the serving state (hyper's connection, timers) exists only while serving; the
        // parked task should not carry its space.
        match Box::pin(serve_http1(stream, carried, &service, &shared)).await {
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
    let decided = tokio::time::timeout(bound, async {
        loop {
            let n = stream.read(&mut buf[got..]).await?;
            if n == 0 {
                return Ok(None);
            }
            got += n;
            if buf[..got] != H2_PREFACE[..got] {
                return Ok(Some(false));
            }
            if got == H2_PREFACE.len() {
                return Ok(Some(true));
            }
        }
    })
    .await;
    let read = Bytes::copy_from_slice(&buf[..got]);
    match decided {
        Ok(Ok(Some(true))) => Ok(Sniffed::Http2(read)),
        Ok(Ok(Some(false))) => Ok(Sniffed::Http1(read)),
        Ok(Ok(None)) | Err(_) => Ok(Sniffed::Closed),
        Ok(Err(e)) => Err(e),
    }
}

/// Serves HTTP/2 on the connection for the rest of its life.
async fn serve_h2(io: Rewind<TcpStream>, service: ConnectionService, shared: &Shared) {
    let peer = service.info.peer;
    let activity = service.activity.clone();
    let io = IdleIo::new(io, shared.idle_timeout, activity);
    let conn = shared.http2.serve_connection(TokioIo::new(io), service);
    let conn = pin!(conn);
    if let Err(e) = until_drained(conn, &shared.stop, |c| c.graceful_shutdown()).await {
        tracing::debug!(%peer, cause = %e, "connection ended with an error");
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

type Http1Conn = http1::Connection<TokioIo<IdleIo<Rewind<TcpStream>>>, ConnectionService>;

/// One HTTP/1 cycle: serves requests until the connection can be parked (returns the socket
/// and the bytes read but not parsed) or ends (None).
async fn serve_http1(
    stream: TcpStream,
    carried: Bytes,
    service: &ConnectionService,
    shared: &Shared,
) -> Option<(TcpStream, Bytes)> {
    let activity = &service.activity;
    let peer = service.info.peer;
    let io = IdleIo::parking(
        Rewind::new(carried, stream),
        shared.idle_timeout,
        activity.clone(),
    );
    // Boxed so that taking it apart moves a pointer, not the whole connection.
    let mut conn: Box<Http1Conn> = Box::new(
        shared
            .http1
            .serve_connection(TokioIo::new(io), service.clone()),
    );
    let mut parking = false;
    let mut draining = false;
    let mut stopped = pin!(shared.stop.cancelled());
    // One timer for the whole cycle, armed when the connection first goes idle and re-armed
    // only when it fires: a busy connection pays one timer event per PARK_AFTER, not a timer
    // per request. `armed_at` is how many requests had started when it was armed.
    let mut settle: Option<Pin<Box<Sleep>>> = None;
    let mut armed_at = 0;
    let served = poll_fn(|cx| {
        if !draining && stopped.as_mut().poll(cx).is_ready() {
            draining = true;
            Pin::new(&mut *conn).graceful_shutdown();
        }
        loop {
            if let Poll::Ready(done) = conn.poll_without_shutdown(cx) {
                return Poll::Ready(done);
            }
            if parking || draining || !activity.park_signalled() {
                return Poll::Pending;
            }
            // Idle between requests with nothing buffered. A client with more to send soon
            // keeps its hyper connection; one quiet for PARK_AFTER is parked.
            let timer = settle.get_or_insert_with(|| {
                armed_at = activity.started();
                Box::pin(tokio::time::sleep(PARK_AFTER))
            });
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if activity.started() != armed_at {
                // Requests came and went since it was armed: quiet only from now on.
                armed_at = activity.started();
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + PARK_AFTER);
                continue;
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
        tracing::debug!(%peer, cause = %e, "connection ended with an error");
    }
    // hyper reports the end once its state is closed, even with bytes it could not write yet
    // (a 101, an error response, the end of a last response): let it finish writing them, as
    // its own shutdown would.
    if activity.write_pending() {
        let flushed = tokio::time::timeout(
            shared.idle_timeout,
            poll_fn(|cx| match conn.poll_without_shutdown(cx) {
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
    let (rest, mut stream) = parts.io.into_inner().into_inner().into_parts();
    let unparsed = join(parts.read_buf, rest);
    let handoff = activity.take_handoff();
    if let Some(handoff) = handoff.filter(|_| activity.is_upgraded()) {
        let _ = handoff.send(Rewind::new(unparsed, stream));
        return None;
    }
    if served.is_ok() && parking && !draining {
        return Some((stream, unparsed));
    }
    let _ = stream.shutdown().await;
    None
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

pin_project_lite::pin_project! {
    /// A socket that first yields bytes already taken off it.
    #[derive(Debug)]
    pub struct Rewind<T> {
        prefix: Bytes,
        #[pin]
        inner: T,
    }
}

impl<T> Rewind<T> {
    pub fn new(prefix: Bytes, inner: T) -> Self {
        Rewind { prefix, inner }
    }

    /// The bytes not yet read, and the socket.
    pub fn into_parts(self) -> (Bytes, T) {
        (self.prefix, self.inner)
    }
}

impl<T: AsyncRead> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            if this.prefix.is_empty() {
                // Drop the allocation now rather than with the connection.
                *this.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<T: AsyncWrite> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
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

    #[tokio::test]
    async fn rewind_yields_the_prefix_then_the_socket() {
        let (mut client, server) = pair().await;
        client.write_all(b" world").await.unwrap();
        let mut io = Rewind::new(Bytes::from_static(b"hello"), server);
        let mut got = vec![0u8; 11];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"hello world");
        let (rest, _) = io.into_parts();
        assert!(rest.is_empty());
    }
}
