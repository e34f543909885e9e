//! [`HookedIo`]: the one `AsyncRead`/`AsyncWrite` forwarder behind the socket wrappers that
//! watch or steer a connection's bytes (the idle timeout and parking in `idle`, the bytes
//! read past an upgrade request in `upgrade`, the upstream's early answer in
//! `proxy::early_answer`). The wrapper forwards every call to the socket; a hook sees the
//! calls it cares about and leaves the rest to the defaults, which forward as they are.
//! Generic over the hook, so each wrapper is its own type, with nothing boxed or dispatched
//! at run time on a path every byte takes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a [`HookedIo`] does around the calls on its socket. Each method gets the socket and
/// does the call itself (or not: a hook may answer without it); the defaults just forward.
pub trait IoHook {
    #[inline]
    fn poll_read<T: AsyncRead>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        inner.poll_read(cx, buf)
    }

    /// A write of data, `poll_write` or `poll_write_vectored`: `write` makes it on the socket.
    #[inline]
    fn poll_write<T: AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        write(inner, cx)
    }

    #[inline]
    fn poll_flush<T: AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        inner.poll_flush(cx)
    }

    /// Also readable: a hook may read what the peer still sends before it lets go.
    #[inline]
    fn poll_shutdown<T: AsyncRead + AsyncWrite>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        inner.poll_shutdown(cx)
    }
}

pin_project_lite::pin_project! {
    /// A socket `inner` whose calls go through `hook`.
    #[derive(Debug)]
    pub struct HookedIo<T, H> {
        #[pin]
        inner: T,
        hook: H,
    }
}

impl<T, H: IoHook> HookedIo<T, H> {
    pub fn with_hook(inner: T, hook: H) -> Self {
        HookedIo { inner, hook }
    }

    pub fn into_inner(self) -> T {
        self.inner
    }

    pub fn into_parts(self) -> (T, H) {
        (self.inner, self.hook)
    }
}

impl<T: AsyncRead, H: IoHook> AsyncRead for HookedIo<T, H> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        this.hook.poll_read(this.inner, cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite, H: IoHook> AsyncWrite for HookedIo<T, H> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.hook
            .poll_write(this.inner, cx, |inner, cx| inner.poll_write(cx, buf))
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.hook.poll_write(this.inner, cx, |inner, cx| {
            inner.poll_write_vectored(cx, bufs)
        })
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        this.hook.poll_flush(this.inner, cx)
    }

    #[inline]
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        this.hook.poll_shutdown(this.inner, cx)
    }
}
