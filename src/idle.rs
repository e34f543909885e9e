//! Idleness of client connections: the idle timeout, and the moment an HTTP/1 connection can
//! be parked.
//!
//! hyper bounds reading a request head (`header_read_timeout`) but has no idle timeout of its
//! own: a peer that connects and never speaks, or leaves a keep-alive connection open forever,
//! would keep a `max_connections` slot until it hung up. [`IdleIo`] wraps the accepted socket
//! and ends the connection (as a clean end of input) once no request is in flight and no byte
//! has moved either way for `idle_timeout`. Requests in flight (a slow upstream, a long
//! download or upload) and upgraded connections (WebSocket tunnels, idle by nature) are never
//! cut by it.
//!
//! On a plain HTTP/1 connection it also bounds a request head: once a byte of a new head has
//! been read (with no request in flight), the head must be whole (hyper hands the request
//! over) within `header_read_timeout`, however the client trickles it; then it reports end of
//! input, which hyper takes as an incomplete message and closes without an answer, as its own
//! header timeout does.
//!
//! The same wrapper finds the moment a plain HTTP/1 connection may be *parked* (its hyper
//! connection and buffers dropped, see `conn`): hyper asks the socket for more bytes and there
//! are none, while no request (nor its body) is in flight, no byte has been read since the
//! last one ended and every byte hyper wrote has reached the socket. (hyper often asks for the
//! next head a moment before it lets go of the last response body; that read counts once the
//! body is let go.) Only then is hyper idle
//! between messages with nothing buffered that would be lost, so closing it there
//! (`graceful_shutdown`) neither adds `Connection: close` to a response nor drops a byte. When
//! a request body is dropped before its end (a refused upload), hyper itself drains the rest
//! or closes the connection as soon as it notices, before it waits on the socket again, so
//! the connection is never parked with part of a body still to come.
//!
//! When hyper closes instead (the rest of the body was not there to drain), the client may
//! still be sending: [`Activity`] remembers that a body was let go unread, and the connection
//! lingers before it closes (see `linger`). Over TLS the wrapper does it, in its shutdown,
//! below the TLS layer (the client's bytes are discarded undecrypted).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::body::{End, EndHook, OnEnd};
use crate::hooked_io::{HookedIo, IoHook};
use crate::linger::{self, DrainOnDrop, Linger};

/// What the service and the socket tell the connection about its requests.
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    upgraded: AtomicBool,
    /// A byte was read since `in_flight` last dropped to 0 (or since the connection was
    /// unparked): hyper may be in the middle of a request head.
    read_since_idle: AtomicBool,
    /// The last write to the socket could not complete: hyper holds bytes not yet sent.
    write_pending: AtomicBool,
    /// Set by [`IdleIo`] at the moment parking is safe; taken by the connection.
    park: AtomicBool,
    /// A parking connection's last read found nothing to read: hyper waits on the socket.
    read_waiting: AtomicBool,
    /// Requests (and request bodies) started on this connection so far: lets the connection
    /// tell "quiet since then" from "busy in between" without a timer per request.
    started: AtomicU64,
    /// An HTTP/1 request body was let go before its end, and nothing since shows that the
    /// rest was read (a next request, the client's end of input, the idle timeout): if the
    /// connection closes now, it lingers.
    unread: AtomicBool,
    /// How a lingering close done by [`Idleness`] (over TLS) ended: a `LingerEnd` code, 0 for
    /// none.
    lingered: AtomicU8,
}

impl Activity {
    /// Counts a request as in flight until the returned guard is dropped (when the response
    /// body has ended or was abandoned).
    pub fn start(self: &Arc<Self>) -> RequestInFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_add(1, Ordering::Relaxed);
        // A new request on the connection: hyper read past any body let go before.
        if self.unread.load(Ordering::Relaxed) {
            self.unread.store(false, Ordering::Relaxed);
        }
        RequestInFlight(self.clone())
    }

    /// Whether a request body was let go unread and the connection should linger as it
    /// closes; clears it.
    pub fn take_unread(&self) -> bool {
        self.unread.swap(false, Ordering::AcqRel)
    }

    /// How the lingering close [`Idleness`] did ended, if it did one; clears it.
    pub fn take_lingered(&self) -> Option<linger::LingerEnd> {
        linger::LingerEnd::from_code(self.lingered.swap(0, Ordering::AcqRel))
    }

    /// The connection was upgraded: the idle timeout no longer applies.
    pub fn upgraded(&self) {
        self.upgraded.store(true, Ordering::Release);
    }

    pub fn is_upgraded(&self) -> bool {
        self.upgraded.load(Ordering::Acquire)
    }

    /// Whether hyper still holds bytes the socket did not take.
    pub fn write_pending(&self) -> bool {
        self.write_pending.load(Ordering::Acquire)
    }

    /// How many requests (and request bodies) have started on this connection.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether [`IdleIo`] found the connection parkable, and no byte was read since.
    pub fn park_signalled(&self) -> bool {
        self.park.load(Ordering::Acquire)
    }

    /// Like [`Activity::park_signalled`], and clears the signal.
    pub fn take_park(&self) -> bool {
        self.park.swap(false, Ordering::AcqRel)
    }

    /// A fresh hyper connection starts on the socket: nothing read by it yet.
    pub fn unparked(&self) {
        self.read_since_idle.store(false, Ordering::Release);
        self.read_waiting.store(false, Ordering::Release);
        self.write_pending.store(false, Ordering::Release);
        self.park.store(false, Ordering::Release);
        self.unread.store(false, Ordering::Release);
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.upgraded.load(Ordering::Acquire)
    }

    /// No request or request body in flight, no byte read since the last one ended and
    /// nothing left unwritten: hyper is between messages with nothing buffered.
    pub fn parkable(&self) -> bool {
        !self.busy()
            && !self.read_since_idle.load(Ordering::Acquire)
            && !self.write_pending.load(Ordering::Acquire)
    }
}

/// One request (or request body) in flight on a connection; see [`Activity::start`].
#[derive(Debug)]
pub struct RequestInFlight(Arc<Activity>);

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.read_since_idle.store(false, Ordering::Release);
            // hyper often asks for the next head before it lets go of the last response body:
            // that read found the connection busy, and no later read comes while the client is
            // quiet. Waiting on the socket with nothing in flight is the moment to park, as if
            // the read had come now (the connection checks the rest before it parks).
            if activity.read_waiting.load(Ordering::Acquire) && activity.parkable() {
                activity.park.store(true, Ordering::Release);
            }
        }
    }
}

/// Keeps a request body in flight until its last frame (or until it is dropped): while the
/// proxy still forwards an upload, the connection is not idle even if the response is done.
/// A body that fails stays in flight until it is dropped. An HTTP/1 body (`lingers`) dropped
/// before its end marks its connection's [`Activity`] as having left bytes unread.
pub struct BodyInFlight {
    in_flight: Option<RequestInFlight>,
    lingers: bool,
}

/// A request body from hyper; on HTTP/2 read to its end if let go before it (see `linger`).
pub type HyperBody = DrainOnDrop<Incoming>;

impl EndHook<HyperBody> for BodyInFlight {
    type Error = hyper::Error;

    #[inline]
    fn frame(&mut self, _frame: &Frame<Bytes>, inner: &HyperBody) -> Result<(), hyper::Error> {
        if inner.is_end_stream() {
            self.in_flight = None;
        }
        Ok(())
    }

    #[inline]
    fn end(&mut self, how: End) {
        if how == End::Stream {
            self.in_flight = None;
        }
    }

    #[inline]
    fn dropped(&mut self, inner: &HyperBody) {
        if let Some(in_flight) = &self.in_flight {
            if self.lingers && !inner.is_end_stream() {
                in_flight.0.unread.store(true, Ordering::Release);
            }
        }
    }
}

/// A request body as the connection hands it to the proxy; see [`BodyInFlight`].
pub type RequestBody = OnEnd<HyperBody, BodyInFlight>;

impl Activity {
    /// `inner`, counted as in flight until its end (an empty body never is). With `drain`
    /// (HTTP/2), a body let go before its end is read to it within those bounds; without
    /// (HTTP/1), its connection lingers as it closes.
    pub fn request_body(
        self: &Arc<Self>,
        inner: Incoming,
        drain: Option<linger::Bounds>,
    ) -> RequestBody {
        let in_flight = (!inner.is_end_stream()).then(|| self.start());
        let lingers = drain.is_none();
        OnEnd::with_hook(
            DrainOnDrop::new(inner, drain),
            BodyInFlight { in_flight, lingers },
        )
    }
}

/// A socket that reports end of input after its timeout of idleness, and (when parking)
/// finds the moment its HTTP/1 connection can be parked and bounds the time a request head
/// may take to arrive; see the module docs.
pub type IdleIo<T> = HookedIo<T, Idleness>;

/// The hook of an [`IdleIo`]: watches reads and writes, and ends input when idle.
pub struct Idleness {
    // Made on the first wait that needs it: most waits are for a request in flight, which
    // no timer can cut, or end in parking.
    timer: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    // When a byte last moved either way, as far as the timer needs to know: set when a wait
    // begins after bytes moved (`moved`), not on every read and write, so that a request
    // costs no clock read here. A wait begins right after the last transfer, so the two
    // differ by one poll.
    last_activity: Instant,
    moved: bool,
    activity: Arc<Activity>,
    park: bool,
    // `header_read_timeout` for an HTTP/1 connection that parks (None otherwise): a head
    // that has begun (a byte read while no request is in flight) must be whole by then.
    // Kept here rather than by hyper, whose own timer is an allocation and a timer
    // registration for every request.
    head_timeout: Option<Duration>,
    // The deadline of the head being read, and `Activity::started` when it was set (a new
    // request since means a new head).
    head_deadline: Option<(u64, Instant)>,
    // Set for a connection that lingers in its shutdown (TLS; a plain HTTP/1 connection
    // lingers in `conn`), and the lingering close once begun.
    linger: Option<linger::Bounds>,
    lingering: Option<Box<Linger>>,
}

impl Idleness {
    /// Ends input after `timeout` with nothing in flight and no byte moved.
    pub fn new(timeout: Duration, activity: Arc<Activity>) -> Self {
        Idleness {
            timer: None,
            timeout,
            last_activity: Instant::now(),
            moved: false,
            activity,
            park: false,
            head_timeout: None,
            head_deadline: None,
            linger: None,
            lingering: None,
        }
    }

    /// Lingers within `bounds` when hyper shuts the connection down after a request body was
    /// let go unread (see `linger`).
    pub fn lingering(self, bounds: linger::Bounds) -> Self {
        Idleness {
            linger: (!bounds.is_off()).then_some(bounds),
            ..self
        }
    }

    /// Like [`Idleness::new`], for a plain HTTP/1 connection that is parked when idle and
    /// whose request heads must arrive within `head_timeout` of their first byte.
    pub fn parking(timeout: Duration, head_timeout: Duration, activity: Arc<Activity>) -> Self {
        activity.unparked();
        Idleness {
            park: true,
            head_timeout: Some(head_timeout),
            ..Idleness::new(timeout, activity)
        }
    }

    /// Notes a write's outcome: pending means hyper holds bytes the socket did not take.
    #[inline]
    fn note_write<R>(&mut self, polled: &Poll<io::Result<R>>, moved: impl FnOnce(&R) -> bool) {
        match polled {
            Poll::Pending => self.activity.write_pending.store(true, Ordering::Release),
            Poll::Ready(result) => {
                self.activity.write_pending.store(false, Ordering::Release);
                if result.as_ref().is_ok_and(moved) {
                    self.moved = true;
                }
            }
        }
    }
}

impl IoHook for Idleness {
    fn poll_read<T: AsyncRead>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match inner.poll_read(cx, buf) {
            Poll::Ready(result) => {
                if self.park {
                    self.activity.read_waiting.store(false, Ordering::Release);
                }
                if buf.filled().len() > before {
                    self.moved = true;
                    self.activity.read_since_idle.store(true, Ordering::Release);
                    self.activity.park.store(false, Ordering::Release);
                } else if result.is_ok() {
                    // The client closed its side: nothing more will come to linger for.
                    self.activity.unread.store(false, Ordering::Release);
                }
                return Poll::Ready(result);
            }
            Poll::Pending => {}
        }
        if self.park {
            self.activity.read_waiting.store(true, Ordering::Release);
        }
        if self.park && self.activity.parkable() {
            // The connection closes hyper and waits for the socket itself: no timer needed.
            self.activity.park.store(true, Ordering::Release);
            return Poll::Pending;
        }
        if self.activity.busy() {
            // Only the request's end can make the connection idle, and hyper reads again then.
            return Poll::Pending;
        }
        // Nothing to read: the timer decides whether to keep waiting. Stamping the last
        // transfer here and moving the deadline only when the timer fires keeps reads and
        // writes free of clock reads.
        let now = Instant::now();
        if std::mem::take(&mut self.moved) {
            self.last_activity = now;
        }
        let mut head = None;
        if let Some(head_timeout) = self.head_timeout {
            if self.activity.read_since_idle.load(Ordering::Acquire) {
                // Part of a request head is here: hyper hands the request over (and it is in
                // flight) once the head is whole.
                let started = self.activity.started();
                let (_, deadline) = self
                    .head_deadline
                    .filter(|(at, _)| *at == started)
                    .unwrap_or((started, now + head_timeout));
                self.head_deadline = Some((started, deadline));
                head = Some(deadline);
            }
        }
        let timeout = self.timeout;
        let deadline = |last_activity: Instant| {
            let idle = last_activity + timeout;
            head.map_or(idle, |head: Instant| head.min(idle))
        };
        let wanted = deadline(self.last_activity);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wanted)));
        if wanted < timer.deadline() {
            timer.as_mut().reset(wanted);
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            if std::mem::take(&mut self.moved) {
                self.last_activity = now;
            }
            let deadline = deadline(self.last_activity);
            if deadline > now {
                timer.as_mut().reset(deadline);
            } else if self.activity.busy() {
                timer.as_mut().reset(now + timeout);
            } else {
                // End of input: hyper closes an idle connection cleanly on it, and one in the
                // middle of a head as an incomplete message, without an answer, as hyper's
                // own header timeout does.
                if head.is_some_and(|head| head <= now) {
                    tracing::debug!(timeout = ?self.head_timeout, "closing a client connection whose request head did not arrive in time");
                } else {
                    tracing::debug!(timeout = ?self.timeout, "closing idle client connection");
                }
                // Nothing came for the idle timeout: not a client still sending.
                self.activity.unread.store(false, Ordering::Release);
                return Poll::Ready(Ok(()));
            }
        }
    }

    #[inline]
    fn poll_write<T: AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let polled = write(inner, cx);
        self.note_write(&polled, |n| *n > 0);
        polled
    }

    #[inline]
    fn poll_flush<T: AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = inner.poll_flush(cx);
        self.note_write(&polled, |_| false);
        polled
    }

    fn poll_shutdown<T: AsyncRead + AsyncWrite>(
        &mut self,
        mut inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if self.park {
            // A parking connection's socket outlives its hyper connection (parked, or handed
            // to a tunnel): hyper's shutdown at its end must not close it. The connection
            // shuts the socket down itself when it is really done (`conn::serve_http1`).
            return inner.poll_flush(cx);
        }
        if self.lingering.is_none() {
            // FIN after everything written: the answer reaches the client whatever it sends.
            std::task::ready!(inner.as_mut().poll_shutdown(cx))?;
            match self.linger {
                Some(bounds) if self.activity.take_unread() => {
                    self.lingering = Some(Box::new(Linger::new(&bounds, 0)));
                }
                _ => return Poll::Ready(Ok(())),
            }
        }
        let Some(lingering) = self.lingering.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let outcome = std::task::ready!(lingering.poll_drain(inner, cx));
        self.lingering = None;
        self.activity
            .lingered
            .store(outcome.code(), Ordering::Release);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_ends_after_the_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::with_hook(server, Idleness::new(TIMEOUT, Arc::default()));
        let start = Instant::now();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert_eq!(start.elapsed(), TIMEOUT);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_pushes_the_deadline_back() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::with_hook(server, Idleness::new(TIMEOUT, Arc::default()));
        let start = Instant::now();
        let mut buf = [0u8; 8];
        tokio::time::sleep(Duration::from_secs(4)).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        io.write_all(b"y").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert_eq!(start.elapsed(), Duration::from_secs(4) + TIMEOUT);
    }

    /// A head that has begun must be whole within the head timeout, however the client
    /// trickles it, while a quiet connection keeps the (longer) idle timeout.
    #[tokio::test(start_paused = true)]
    async fn a_begun_head_is_bounded_by_the_head_timeout() {
        let head_timeout = Duration::from_secs(2);
        let (mut client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleIo::with_hook(
            server,
            Idleness::parking(TIMEOUT, head_timeout, activity.clone()),
        );
        let start = Instant::now();
        client.write_all(b"GET / HT").await.unwrap();
        let trickle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(600)).await;
                if client.write_all(b"T").await.is_err() {
                    return;
                }
            }
        });
        let mut buf = [0u8; 64];
        let mut read = 0;
        loop {
            let n = io.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            read += n;
        }
        assert_eq!(start.elapsed(), head_timeout);
        assert_eq!(
            read,
            8 + 3,
            "the head and the bytes trickled until the deadline"
        );
        trickle.abort();

        // A request that started ends the head: the next one gets its own deadline.
        let (mut client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleIo::with_hook(
            server,
            Idleness::parking(TIMEOUT, head_timeout, activity.clone()),
        );
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let _ = io.read(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(activity.start());
        client.write_all(b"GET").await.unwrap();
        let second_head = Instant::now();
        assert_eq!(io.read(&mut buf).await.unwrap(), 3);
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert_eq!(second_head.elapsed(), head_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_or_an_upgrade_keeps_it_open() {
        let (_client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleIo::with_hook(server, Idleness::new(TIMEOUT, activity.clone()));
        let start = Instant::now();
        let request = activity.start();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(TIMEOUT * 3, io.read(&mut buf)).await;
        assert!(read.is_err(), "still open while a request is in flight");
        drop(request);
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(start.elapsed() <= TIMEOUT * 5);

        let (_client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleIo::with_hook(server, Idleness::new(TIMEOUT, activity.clone()));
        activity.upgraded();
        let read = tokio::time::timeout(TIMEOUT * 10, io.read(&mut buf)).await;
        assert!(read.is_err(), "upgraded connections are never cut");
    }
}
