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
//! reset or closed the connection, the write side goes quiet instead (pending, so no more of
//! the client's body is read) until the read side has met the end of what the upstream sent;
//! hyper's client goes on reading, passes on the answer if there is one, and then ends the
//! exchange itself. Only then do writes fail, with the error they met. Failing at once would
//! end the connection while hyper may still hold an answer, or its body, in its buffer. Such a
//! connection is never reused (its request was never fully written), and a tunnel over it ends
//! as before once its upstream side has read to the end.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::hooked_io::{HookedIo, IoHook};

/// A plain TCP connection to the upstream whose write side gives way to an answer waiting to be
/// read (see the module docs).
pub type EarlyAnswerIo = HookedIo<TcpStream, Writes>;

/// `stream`, whose writes give way to an early answer.
pub fn early_answer_io(stream: TcpStream) -> EarlyAnswerIo {
    HookedIo::with_hook(stream, Writes::Open)
}

/// The hook of an [`EarlyAnswerIo`]: the state of its write side.
pub enum Writes {
    Open,
    /// A write met a reset (its error's kind): writes wait until the read side has met the end
    /// of input, which then wakes the waiting writer.
    GivenWay(io::ErrorKind, Option<Waker>),
    /// The read side has met the end too: writes fail with the error the first one met.
    Failed(io::ErrorKind),
}

/// Errors that mean the peer reset or closed the connection (as opposed to a local failure).
fn is_reset(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl IoHook for Writes {
    fn poll_read<T: AsyncRead>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = inner.poll_read(cx, buf);
        if let Writes::GivenWay(kind, waiting) = self {
            let ended = match &read {
                Poll::Ready(Ok(())) => buf.filled().len() == before && buf.remaining() > 0,
                Poll::Ready(Err(_)) => true,
                Poll::Pending => false,
            };
            if ended {
                if let Some(writer) = waiting.take() {
                    writer.wake();
                }
                *self = Writes::Failed(*kind);
            }
        }
        read
    }

    /// A write on this connection: on the socket while it is open; after a reset, pending
    /// until the read side has met the end, then the reset's error.
    fn poll_write<T: AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match self {
            Writes::Open => match write(inner, cx) {
                Poll::Ready(Err(e)) if is_reset(e.kind()) => {
                    *self = Writes::GivenWay(e.kind(), Some(cx.waker().clone()));
                    Poll::Pending
                }
                other => other,
            },
            Writes::GivenWay(_, waiting) => {
                *waiting = Some(cx.waker().clone());
                Poll::Pending
            }
            Writes::Failed(kind) => Poll::Ready(Err(io::Error::from(*kind))),
        }
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
        let mut io = early_answer_io(client);
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
    async fn after_a_reset_writes_wait_while_the_answer_is_read_and_fail_at_its_end() {
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
        // ...and still after it, until the read side meets the end of input...
        assert_eq!(
            write_until_stuck(&mut io, Duration::from_millis(200)).await,
            None
        );
        let mut rest = [0u8; 16];
        let ended = timeout(Duration::from_secs(2), io.read(&mut rest))
            .await
            .expect("the read after the answer ends at once");
        assert!(
            matches!(&ended, Ok(0)) || ended.as_ref().is_err_and(|e| is_reset(e.kind())),
            "{ended:?}"
        );
        // ...and then fails with the error it met.
        let failed = timeout(Duration::from_secs(2), io.write(b"more"))
            .await
            .expect("a write after the end fails at once")
            .unwrap_err();
        assert!(is_reset(failed.kind()), "{failed:?}");
    }

    #[tokio::test]
    async fn a_waiting_write_is_woken_when_the_read_side_ends() {
        let io = reset_by_peer(b"").await;
        let (mut reader, mut writer) = tokio::io::split(io);
        let writing = tokio::spawn(async move {
            for _ in 0..1000 {
                if let Err(e) = writer.write(b"more of the body").await {
                    return e.kind();
                }
            }
            panic!("a thousand writes went through a reset connection");
        });
        // The writer waits (a reset, and nothing read yet)...
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writing.is_finished());
        // ...until the reader meets the end, which wakes it with the reset's error.
        let mut rest = [0u8; 16];
        let _ = reader.read(&mut rest).await;
        let failed = timeout(Duration::from_secs(2), writing)
            .await
            .expect("the waiting write is woken")
            .unwrap();
        assert!(is_reset(failed), "{failed:?}");
    }
}
