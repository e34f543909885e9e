//! The idle timeout of client connections.
//!
//! hyper bounds reading a request head (`header_read_timeout`) but has no idle timeout of its
//! own, and hyper-util's HTTP/1-or-2 detection reads the first bytes with no timer at all: a
//! peer that connects and never speaks, or parks a keep-alive connection forever, would keep a
//! `max_connections` slot until it hung up. [`IdleIo`] wraps the accepted socket and ends the
//! connection (as a clean end of input) once no request is in flight and no byte has moved
//! either way for `idle_timeout`. Requests in flight (a slow upstream, a long download) and
//! upgraded connections (WebSocket tunnels, idle by nature) are never cut by it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What the service tells the connection about its requests.
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    upgraded: AtomicBool,
}

impl Activity {
    /// Counts a request as in flight until the returned guard is dropped (when the response
    /// body has ended or was abandoned).
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// The connection was upgraded: the idle timeout no longer applies.
    pub fn upgraded(&self) {
        self.upgraded.store(true, Ordering::Release);
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0 || self.upgraded.load(Ordering::Acquire)
    }
}

/// One request in flight; see [`Activity::start`].
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// A socket that reports end of input after `timeout` of idleness; see the module docs.
    pub struct IdleIo<T> {
        #[pin]
        inner: T,
        timer: Pin<Box<Sleep>>,
        timeout: Duration,
        last_activity: Instant,
        activity: Arc<Activity>,
    }
}

impl<T> IdleIo<T> {
    pub fn new(inner: T, timeout: Duration, activity: Arc<Activity>) -> Self {
        let now = Instant::now();
        IdleIo {
            inner,
            timer: Box::pin(tokio::time::sleep_until(now + timeout)),
            timeout,
            last_activity: now,
            activity,
        }
    }
}

impl<T: AsyncRead> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        match this.inner.poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    *this.last_activity = Instant::now();
                }
                return Poll::Ready(result);
            }
            Poll::Pending => {}
        }
        // Nothing to read: the timer decides whether to keep waiting. Moving the deadline only
        // when it fires keeps the per-byte cost to one clock read.
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let deadline = *this.last_activity + *this.timeout;
            let now = Instant::now();
            if deadline > now {
                this.timer.as_mut().reset(deadline);
            } else if this.activity.busy() {
                this.timer.as_mut().reset(now + *this.timeout);
            } else {
                // End of input: hyper closes an idle connection cleanly on it.
                tracing::debug!(timeout = ?this.timeout, "closing idle client connection");
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<T: AsyncWrite> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            *this.last_activity = Instant::now();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            *this.last_activity = Instant::now();
        }
        polled
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_ends_after_the_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(server, TIMEOUT, Arc::default());
        let start = Instant::now();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert_eq!(start.elapsed(), TIMEOUT);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_pushes_the_deadline_back() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = IdleIo::new(server, TIMEOUT, Arc::default());
        let start = Instant::now();
        let mut buf = [0u8; 8];
        tokio::time::sleep(Duration::from_secs(4)).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        io.write_all(b"y").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert_eq!(start.elapsed(), Duration::from_secs(4) + TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_or_an_upgrade_keeps_it_open() {
        let (_client, server) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut io = IdleIo::new(server, TIMEOUT, activity.clone());
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
        let mut io = IdleIo::new(server, TIMEOUT, activity.clone());
        activity.upgraded();
        let read = tokio::time::timeout(TIMEOUT * 10, io.read(&mut buf)).await;
        assert!(read.is_err(), "upgraded connections are never cut");
    }
}
