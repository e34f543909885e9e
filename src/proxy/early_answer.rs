//! An upstream's answer that comes before it has read the whole request body reaches the
//! client, even when the upstream then closes the connection.
//!
//! Applications refuse uploads early: a 413 for a body too large, a 401 before an upload that
//! needs a login. Many answer as soon as they have the head and close the connection; their
//! kernel, holding bytes of the body nobody will read, resets it. The answer is already in
//! tollgate's receive queue, but writing the rest of the body now fails (`ECONNRESET`, then
//! `EPIPE`), and hyper's client ends the exchange on a failed write without reading what is
//! there: the client got a 502 instead of the upstream's answer. (nginx does the same.)
//!
//! [`EarlyAnswerIo`] wraps a plain upstream connection. When a write fails because the peer
//! reset or closed the connection and an answer is waiting to be read, the write side goes
//! quiet instead (pending, without reading any more of the client's body), so hyper reads the
//! answer and the client gets it. Once everything the upstream sent has been read, the write
//! fails with its original error and the connection ends as before; it is never reused. A
//! failed write with nothing to read fails at once, as it always did.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A plain TCP connection to the upstream whose write side gives way to an answer waiting to be
/// read (see the module docs).
pub struct EarlyAnswerIo {
    stream: TcpStream,
    /// The error of the write that found the connection reset, kept until the answer has been
    /// read.
    write_failed: Option<io::ErrorKind>,
}

impl EarlyAnswerIo {
    pub fn new(stream: TcpStream) -> Self {
        EarlyAnswerIo {
            stream,
            write_failed: None,
        }
    }

    /// What a write returns once the peer has reset the connection: pending while the answer
    /// (or any of it) is still to be read, then the write's error. Waits for the read side
    /// (whose wake-up hyper's own reading also waits for), never spins.
    fn after_reset(&mut self, cx: &mut Context<'_>, kind: io::ErrorKind) -> Poll<io::Error> {
        self.write_failed = Some(kind);
        let mut one = [0u8; 1];
        let mut peeked = ReadBuf::new(&mut one);
        match ready!(self.stream.poll_peek(cx, &mut peeked)) {
            Ok(n) if n > 0 => Poll::Pending,
            // Nothing (more) to read: the write fails as it did.
            _ => Poll::Ready(io::Error::from(kind)),
        }
    }

    /// A write's result, with a reset turned into [`EarlyAnswerIo::after_reset`].
    fn written(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match result {
            Poll::Ready(Err(e)) if is_reset(e.kind()) => self.after_reset(cx, e.kind()).map(Err),
            other => other,
        }
    }
}

/// Errors that mean the peer reset or closed the connection (as opposed to a local failure).
fn is_reset(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl AsyncRead for EarlyAnswerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for EarlyAnswerIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(kind) = this.write_failed {
            return this.after_reset(cx, kind).map(Err);
        }
        let result = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.written(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(kind) = this.write_failed {
            return this.after_reset(cx, kind).map(Err);
        }
        let result = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.written(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::time::timeout;

    use super::*;

    /// A connection whose peer has written `answer` (if any) and closed without reading what
    /// it was sent, so that its kernel resets the connection.
    async fn reset_by_peer(answer: &[u8]) -> EarlyAnswerIo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut io = EarlyAnswerIo::new(client);
        io.write_all(b"a request the peer never reads")
            .await
            .unwrap();
        // Until the bytes are in the peer's receive queue, its close would not reset.
        let mut seen = [0u8; 1];
        while server.peek(&mut seen).await.unwrap() == 0 {}
        server.write_all(answer).await.unwrap();
        drop(server);
        io
    }

    /// Writes until a write does not complete within `wait`: None when it is still pending
    /// then, or the error it failed with.
    async fn write_until_stuck(io: &mut EarlyAnswerIo, wait: Duration) -> Option<io::ErrorKind> {
        for _ in 0..1000 {
            match timeout(wait, io.write(b"more of the body")).await {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => return Some(e.kind()),
                Err(_) => return None,
            }
        }
        panic!("a thousand writes went through a reset connection");
    }

    #[tokio::test]
    async fn a_reset_with_an_answer_waiting_holds_writes_until_the_answer_is_read() {
        const ANSWER: &[u8] = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n";
        let mut io = reset_by_peer(ANSWER).await;
        // The write that meets the reset waits (a bare socket would fail here)...
        assert_eq!(
            write_until_stuck(&mut io, Duration::from_millis(200)).await,
            None
        );
        // ...while the answer is read whole...
        let mut answer = vec![0u8; ANSWER.len()];
        io.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, ANSWER);
        // ...and then fails with the error it met, so the connection ends.
        let failed = timeout(Duration::from_secs(2), io.write(b"more"))
            .await
            .expect("a write after the answer fails at once")
            .unwrap_err();
        assert!(is_reset(failed.kind()), "{failed:?}");
    }

    #[tokio::test]
    async fn a_reset_with_nothing_to_read_fails_the_write_at_once() {
        let mut io = reset_by_peer(b"").await;
        let failed = write_until_stuck(&mut io, Duration::from_secs(2)).await;
        assert!(failed.is_some_and(is_reset), "{failed:?}");
    }
}
