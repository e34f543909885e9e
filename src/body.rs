//! Body types that flow through the proxy: one boxed body type for every response (streamed
//! from the upstream or made here), and a request body wrapper that enforces
//! `max_request_body` while streaming, so an oversized chunked upload is cut off without
//! being read whole.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response the proxy sends has this body type.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pin_project_lite::pin_project! {
    /// A body that keeps `guard` alive until the body ends or is dropped (the client went
    /// away): how concurrency slots stay taken for exactly the life of a response.
    pub struct Guarded<B, G> {
        #[pin]
        inner: B,
        guard: Option<G>,
    }
}

impl<B, G> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        Guarded {
            inner,
            guard: Some(guard),
        }
    }
}

pub fn with_guard<G: Send + 'static>(body: ProxyBody, guard: G) -> ProxyBody {
    Guarded::new(body, guard).boxed_unsync()
}

impl<B: Body, G> Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.guard.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request body was larger than allowed.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {limit} bytes")]
pub struct BodyTooLarge {
    pub limit: u64,
}

pin_project_lite::pin_project! {
    /// Passes a body through, failing it once more than `limit` bytes have gone by. The flag
    /// tells the proxy afterwards that the upstream request failed *because* of the limit
    /// (hyper reports only that the body errored), so the client gets 413, not 502.
    pub struct LimitedBody<B> {
        #[pin]
        inner: B,
        remaining: u64,
        limit: u64,
        exceeded: Arc<AtomicBool>,
    }
}

impl<B> LimitedBody<B> {
    pub fn new(inner: B, limit: u64) -> (Self, Arc<AtomicBool>) {
        let exceeded = Arc::new(AtomicBool::new(false));
        let body = LimitedBody {
            inner,
            remaining: limit,
            limit,
            exceeded: exceeded.clone(),
        };
        (body, exceeded)
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > *this.remaining {
                        this.exceeded.store(true, Ordering::Release);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge {
                            limit: *this.limit,
                        }))));
                    }
                    *this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;

    fn chunks(sizes: &[usize]) -> impl Body<Data = Bytes, Error = std::convert::Infallible> {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = sizes
            .iter()
            .map(|n| Ok(Frame::data(Bytes::from(vec![b'x'; *n]))))
            .collect();
        StreamBody::new(stream::iter(frames))
    }

    #[tokio::test]
    async fn passes_bodies_up_to_the_limit() {
        let (body, exceeded) = LimitedBody::new(chunks(&[4, 4, 2]), 10);
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected.len(), 10);
        assert!(!exceeded.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn fails_once_the_limit_is_passed_and_says_so() {
        let (body, exceeded) = LimitedBody::new(chunks(&[4, 4, 3]), 10);
        let err = body.collect().await.unwrap_err();
        assert!(err.to_string().contains("10 bytes"), "{err}");
        assert!(exceeded.load(Ordering::Acquire));
    }
}
