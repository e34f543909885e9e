//! Lingering close (RFC 9112 §9.6): when tollgate answers a request before reading its whole
//! body (a 413 for an upload over `max_request_body`, a limit's 429, a shed 503, an upstream's
//! early 401 or 413) and then closes the connection, the client may still be sending. Closing
//! a socket with unread bytes, or receiving bytes after the close, makes the kernel send a TCP
//! reset, and a reset can destroy the answer in the client's receive buffer before the client
//! reads it: clients that write their whole body before reading (Python's `http.client`,
//! `urllib`) see `BrokenPipeError` or `ECONNRESET` instead of the 413.
//!
//! So the connection first half-closes its write side (the answer, then FIN, reach the
//! client), then reads and discards what the client still sends until the client closes
//! (`eof`), a bound is reached, or the read fails, and only then drops the socket. The bounds
//! ([`Bounds`], `lingering_close` in the configuration): `time` in all (30 s by default, as
//! nginx's `lingering_time`), `timeout` without a byte (5 s, nginx's `lingering_timeout`),
//! and `max_bytes` discarded (64 MiB): a client that keeps sending forever is cut at the
//! first bound it meets.
//!
//! Only a connection that let a request body go before its end and then closes lingers
//! (`idle::Activity` knows); keep-alive traffic and connections that end with nothing unread
//! never reach this module.
//!
//! HTTP/2 needs no lingering close, but its equivalent for one stream: a request body let go
//! before its end resets the stream (`RST_STREAM`, NO_ERROR after a complete answer, as RFC
//! 9113 §8.1 allows), and some clients (curl 7.x) then fail the whole exchange, answer
//! included, while they are still sending. [`DrainOnDrop`] reads such a body to its end in a
//! task of its own instead, within the same bounds, so that the stream ends normally.
//!
//! Imports nothing from the crate.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

pub const DEFAULT_TIME: Duration = Duration::from_secs(30);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// How much a lingering close may take (`lingering_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// At most this long in all; zero turns lingering off (close at once).
    pub time: Duration,
    /// Ends once the client sent nothing for this long.
    pub timeout: Duration,
    /// Ends once this many bytes were discarded.
    pub max_bytes: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            time: DEFAULT_TIME,
            timeout: DEFAULT_TIMEOUT,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl Bounds {
    pub fn is_off(&self) -> bool {
        self.time.is_zero()
    }
}

/// How a lingering close ended: the `outcome` label of `tollgate_lingering_closes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LingerEnd {
    /// The client closed its side: everything it sent was read, the answer was delivered.
    Eof = 1,
    /// The client sent nothing for `timeout`.
    Timeout = 2,
    /// The client was still sending after `time`.
    Time = 3,
    /// The client sent more than `max_bytes`.
    Bytes = 4,
    /// The read failed (the client reset the connection).
    Error = 5,
}

impl LingerEnd {
    pub const ALL: [LingerEnd; 5] = [
        LingerEnd::Eof,
        LingerEnd::Timeout,
        LingerEnd::Time,
        LingerEnd::Bytes,
        LingerEnd::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            LingerEnd::Eof => "eof",
            LingerEnd::Timeout => "timeout",
            LingerEnd::Time => "time",
            LingerEnd::Bytes => "bytes",
            LingerEnd::Error => "error",
        }
    }

    /// The outcome stored as [`LingerEnd::code`], if any.
    pub fn from_code(code: u8) -> Option<LingerEnd> {
        LingerEnd::ALL.into_iter().find(|o| o.code() == code)
    }

    /// A non-zero byte, for an atomic.
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Bytes read and dropped at a time: what the client sends goes nowhere, so one small buffer,
/// made only when a connection lingers.
const SCRATCH: usize = 16 * 1024;

/// The read side of a lingering close in progress: polled until it reports its [`LingerEnd`].
/// The caller has already half-closed the write side.
pub struct Linger {
    scratch: Box<[u8]>,
    /// The end of `time`.
    until: Instant,
    timeout: Duration,
    /// Bytes that may still be discarded.
    left: u64,
    /// When a byte last arrived, as far as the timer needs to know: stamped when a read finds
    /// nothing after bytes moved (`moved`), not on every read.
    last_byte: Instant,
    moved: bool,
    timer: Pin<Box<Sleep>>,
}

impl Linger {
    /// Starts lingering now, `discarded` bytes already read past the answer (by the HTTP
    /// parser, say) counting against `max_bytes`.
    pub fn new(bounds: &Bounds, discarded: u64) -> Linger {
        let now = Instant::now();
        let until = now + bounds.time;
        Linger {
            scratch: vec![0; SCRATCH].into_boxed_slice(),
            until,
            timeout: bounds.timeout,
            left: bounds.max_bytes.saturating_sub(discarded),
            last_byte: now,
            moved: false,
            timer: Box::pin(tokio::time::sleep_until(until.min(now + bounds.timeout))),
        }
    }

    /// Reads and discards from `io` until the client closes or a bound is reached.
    pub fn poll_drain<T: AsyncRead + ?Sized>(
        &mut self,
        mut io: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<LingerEnd> {
        loop {
            if self.left == 0 {
                return Poll::Ready(LingerEnd::Bytes);
            }
            let mut buf = ReadBuf::new(&mut self.scratch);
            match io.as_mut().poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                    return Poll::Ready(LingerEnd::Eof)
                }
                Poll::Ready(Ok(())) => {
                    self.left = self.left.saturating_sub(buf.filled().len() as u64);
                    self.moved = true;
                    continue;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(LingerEnd::Error),
                Poll::Pending => {}
            }
            let now = Instant::now();
            if std::mem::take(&mut self.moved) {
                self.last_byte = now;
            }
            let due = self.until.min(self.last_byte + self.timeout);
            if due > now {
                if self.timer.deadline() != due {
                    self.timer.as_mut().reset(due);
                }
                if self.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            // `due` has passed with nothing to read.
            return Poll::Ready(if due >= self.until {
                LingerEnd::Time
            } else {
                LingerEnd::Timeout
            });
        }
    }
}

/// Lingers on `io` (its write side already shut down) and reports how it ended.
pub async fn drain<T: AsyncRead + Unpin + ?Sized>(
    io: &mut T,
    bounds: &Bounds,
    discarded: u64,
) -> LingerEnd {
    let mut linger = Linger::new(bounds, discarded);
    std::future::poll_fn(|cx| linger.poll_drain(Pin::new(&mut *io), cx)).await
}

/// A request body that, let go before its end, is read to its end by a task of its own (within
/// `bounds`, None: dropped as it is); see the module docs.
pub struct DrainOnDrop<B: Body + Unpin + Send + 'static> {
    body: Option<B>,
    bounds: Option<Bounds>,
}

impl<B: Body + Unpin + Send + 'static> DrainOnDrop<B> {
    pub fn new(body: B, bounds: Option<Bounds>) -> Self {
        DrainOnDrop {
            body: Some(body),
            bounds: bounds.filter(|b| !b.is_off()),
        }
    }
}

impl<B: Body + Unpin + Send + 'static> Body for DrainOnDrop<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.get_mut().body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B: Body + Unpin + Send + 'static> Drop for DrainOnDrop<B> {
    fn drop(&mut self) {
        let (Some(bounds), Some(body)) = (self.bounds, self.body.take()) else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let outcome = drain_body(body, &bounds).await;
                tracing::debug!(
                    outcome = outcome.label(),
                    "read the rest of a request body answered early"
                );
            });
        }
    }
}

/// Reads `body` to its end or the first bound, discarding it.
pub async fn drain_body<B: Body + Unpin>(mut body: B, bounds: &Bounds) -> LingerEnd {
    let until = Instant::now() + bounds.time;
    let mut left = bounds.max_bytes;
    loop {
        let due = until.min(Instant::now() + bounds.timeout);
        match tokio::time::timeout_at(due, body.frame()).await {
            Err(_) if due >= until => return LingerEnd::Time,
            Err(_) => return LingerEnd::Timeout,
            Ok(None) => return LingerEnd::Eof,
            Ok(Some(Err(_))) => return LingerEnd::Error,
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |data| data.remaining());
                left = left.saturating_sub(n as u64);
                if left == 0 {
                    return LingerEnd::Bytes;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn bounds(max_bytes: u64) -> Bounds {
        Bounds {
            time: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_bytes,
        }
    }

    /// A body of `chunks` chunks of 100 bytes, one a second (`None`: without end).
    fn trickled(
        chunks: Option<usize>,
    ) -> impl Body<Data = bytes::Bytes, Error = std::io::Error> + Unpin {
        let stream = futures_util::stream::unfold(0usize, move |sent| async move {
            if chunks.is_some_and(|n| sent == n) {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let frame = Frame::data(bytes::Bytes::from_static(&[1; 100]));
            Some((Ok(frame), sent + 1))
        });
        http_body_util::StreamBody::new(Box::pin(stream))
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_body_is_read_to_its_end_or_a_bound() {
        let start = Instant::now();
        assert_eq!(
            drain_body(trickled(Some(10)), &bounds(1 << 20)).await,
            LingerEnd::Eof
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(
            drain_body(trickled(None), &bounds(1 << 20)).await,
            LingerEnd::Time
        );
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert_eq!(
            drain_body(trickled(None), &bounds(1000)).await,
            LingerEnd::Bytes
        );
        let quiet = Bounds {
            timeout: Duration::from_millis(500),
            ..bounds(1 << 20)
        };
        assert_eq!(drain_body(trickled(None), &quiet).await, LingerEnd::Timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn it_reads_until_the_client_closes() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            for _ in 0..10 {
                client.write_all(&[7; 1000]).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let start = Instant::now();
        assert_eq!(
            drain(&mut server, &bounds(1 << 20), 0).await,
            LingerEnd::Eof
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        writer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_client_is_cut_after_the_timeout() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"part of a body").await.unwrap();
        let start = Instant::now();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            client.write_all(b"more").await.unwrap();
            // Then silence, with the connection open.
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(client);
        });
        assert_eq!(
            drain(&mut server, &bounds(1 << 20), 0).await,
            LingerEnd::Timeout
        );
        // 5 s after the last byte, which came at 3 s.
        assert_eq!(start.elapsed(), Duration::from_secs(8));
        writer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_stops_is_cut_at_the_time_or_the_bytes() {
        let trickle = |mut client: tokio::io::DuplexStream| async move {
            while client.write_all(&[1; 100]).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        let (client, mut server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(trickle(client));
        let start = Instant::now();
        assert_eq!(
            drain(&mut server, &bounds(1 << 20), 0).await,
            LingerEnd::Time
        );
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        writer.abort();

        let (client, mut server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(trickle(client));
        let start = Instant::now();
        // 1,000 bytes allowed, 200 already read: cut at the 8th write of 100.
        assert_eq!(
            drain(&mut server, &bounds(1000), 200).await,
            LingerEnd::Bytes
        );
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        writer.abort();
    }
}
