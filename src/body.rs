//! Body types that flow through the proxy: one boxed body type for every response (streamed
//! from the upstream or made here), and [`OnEnd`], the one body wrapper that passes a body
//! through and tells a hook about its frames and its end. Every wrapper that must act when a
//! body ends (hand a connection back, keep a request in flight) or watch its frames
//! (enforce `max_request_body` while streaming, so an oversized chunked upload is cut off
//! without being read whole) is a hook on it, kept in the module it belongs to. Work that the
//! client must find done once it has the whole response (settle a cost, release a concurrency
//! slot) is a [`Finish`] that [`BeforeEnd`] holds the last frame for.

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

/// How a body came to its end, as [`OnEnd`] tells its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The last frame was read: `poll_frame` returned `None`.
    Stream,
    /// The body failed: the inner body's error, or a frame the hook refused.
    Error,
}

/// What an [`OnEnd`] body does as its frames pass and when it ends. The methods are called
/// from the body's own `poll_frame` and drop, one at a time, so a hook needs no locking;
/// each is a no-op unless the hook says otherwise.
pub trait EndHook<B: Body> {
    /// The error the wrapped body yields: the inner body's, or a wider one for a hook that
    /// refuses frames (the inner body's errors are converted into it).
    type Error;

    /// A frame went by. `inner` is the body after yielding it, so `inner.is_end_stream()`
    /// tells whether it was the last. An error refuses the frame: the body yields the error
    /// instead (and the hook's [`EndHook::end`] sees [`End::Error`]).
    #[inline]
    fn frame(&mut self, _frame: &Frame<B::Data>, _inner: &B) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The body ended. A body polled again past its end calls it again, so it must be
    /// idempotent.
    #[inline]
    fn end(&mut self, _how: End) {}

    /// The body is being dropped, whether it ended or not (a client that went away drops it
    /// mid-stream). Runs before the inner body and the hook themselves are dropped.
    #[inline]
    fn dropped(&mut self, _inner: &B) {}

    /// The `tracing` span the body's polls and its drop run in (a sampled request's, so that
    /// lines logged while its body streams — a settlement that fails at the end — carry its
    /// ids). None: whatever span the connection's task is in.
    #[inline]
    fn scope(&self) -> Option<&tracing::Span> {
        None
    }
}

pin_project_lite::pin_project! {
    /// Passes `inner` through unchanged (its frames, `is_end_stream` and `size_hint`) and
    /// calls `hook` as frames pass, when the body ends and when it is dropped. Generic over
    /// the hook, so each use is its own type with nothing boxed or dispatched at run time.
    pub struct OnEnd<B, H>
    where
        B: Body,
        H: EndHook<B>,
    {
        #[pin]
        inner: B,
        hook: H,
    }

    impl<B, H> PinnedDrop for OnEnd<B, H>
    where
        B: Body,
        H: EndHook<B>,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let scope = this.hook.scope().cloned();
            let _entered = scope.as_ref().map(tracing::Span::enter);
            this.hook.dropped(&this.inner);
        }
    }
}

impl<B: Body, H: EndHook<B>> OnEnd<B, H> {
    pub fn with_hook(inner: B, hook: H) -> Self {
        OnEnd { inner, hook }
    }
}

impl<B, H> Body for OnEnd<B, H>
where
    B: Body,
    H: EndHook<B>,
    B::Error: Into<H::Error>,
{
    type Data = B::Data;
    type Error = H::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, H::Error>>> {
        let mut this = self.project();
        let scope = this.hook.scope().cloned();
        let _entered = scope.as_ref().map(tracing::Span::enter);
        let polled = match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(polled) => polled,
        };
        let ended = match polled {
            Some(Ok(frame)) => match this.hook.frame(&frame, &this.inner) {
                Ok(()) => return Poll::Ready(Some(Ok(frame))),
                Err(refused) => Some(Err(refused)),
            },
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        };
        this.hook.end(match ended {
            None => End::Stream,
            Some(_) => End::Error,
        });
        Poll::Ready(ended)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Keeps a guard alive until the body ends, fails or is dropped (the client went away): how
/// concurrency slots and a connection's request in flight stay taken for exactly the life of
/// a response.
pub struct Guard<G>(Option<G>);

impl<B: Body, G> EndHook<B> for Guard<G> {
    type Error = B::Error;

    #[inline]
    fn end(&mut self, _how: End) {
        self.0 = None;
    }
}

/// A body holding a [`Guard`].
pub type Guarded<B, G> = OnEnd<B, Guard<G>>;

impl<B: Body, G> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        OnEnd::with_hook(inner, Guard(Some(guard)))
    }
}

pub fn with_guard<G: Send + 'static>(body: ProxyBody, guard: G) -> ProxyBody {
    Guarded::new(body, guard).boxed_unsync()
}

/// The request body was larger than allowed.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {limit} bytes")]
pub struct BodyTooLarge {
    pub limit: u64,
}

/// Fails a body once more than `limit` bytes have gone by. The flag tells the proxy
/// afterwards that the upstream request failed *because* of the limit (hyper reports only
/// that the body errored), so the client gets 413, not 502.
pub struct SizeLimit {
    remaining: u64,
    limit: u64,
    exceeded: Arc<AtomicBool>,
}

impl<B> EndHook<B> for SizeLimit
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Error = BoxError;

    #[inline]
    fn frame(&mut self, frame: &Frame<Bytes>, _inner: &B) -> Result<(), BoxError> {
        if let Some(data) = frame.data_ref() {
            let len = data.len() as u64;
            if len > self.remaining {
                self.exceeded.store(true, Ordering::Release);
                return Err(Box::new(BodyTooLarge { limit: self.limit }));
            }
            self.remaining -= len;
        }
        Ok(())
    }
}

/// A request body under `max_request_body`.
pub type LimitedBody<B> = OnEnd<B, SizeLimit>;

impl<B> LimitedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    pub fn new(inner: B, limit: u64) -> (Self, Arc<AtomicBool>) {
        let exceeded = Arc::new(AtomicBool::new(false));
        let hook = SizeLimit {
            remaining: limit,
            limit,
            exceeded: exceeded.clone(),
        };
        (OnEnd::with_hook(inner, hook), exceeded)
    }
}

/// Work that must be done before a body's last frame goes on (see [`BeforeEnd`]): a
/// settlement, the release of a slot. Dropped without [`Finish::finish`] (the body failed, or
/// was dropped before its end), it does what it can without being waited for.
pub trait Finish: Send + 'static {
    /// Sees each frame as it passes (a trailer, say), the last one included.
    fn frame(&mut self, _frame: &Frame<Bytes>) {}

    /// The work, which the last frame waits for; it bounds its own time.
    fn finish(self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

/// The work under way and the frame it holds back (None: the body's end).
type Finishing = (
    Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    Option<Frame<Bytes>>,
);

/// A body whose last frame (its last data, its trailers, or the end of a body of unknown
/// length) is held until a [`Finish`] is done: a client that sends its next request once it
/// has the whole response finds that work done. Every frame before it passes at once, so a
/// stream streams as before. The last data frame is the one after which the inner body says
/// it has ended, or that completes the length it announced: a server that knows the length
/// ends the response with that frame, whether or not it polls the body again.
pub struct BeforeEnd<F: Finish> {
    inner: ProxyBody,
    /// Until the work starts.
    finish: Option<F>,
    finishing: Option<Finishing>,
    /// Data bytes still to come, when the length is known.
    remaining: Option<u64>,
}

impl<F: Finish> BeforeEnd<F> {
    pub fn new(inner: ProxyBody, finish: F) -> Self {
        let remaining = inner.size_hint().exact();
        BeforeEnd {
            inner,
            finish: Some(finish),
            finishing: None,
            remaining,
        }
    }

    /// Starts the work, holding `frame` back until it is done.
    fn hold(&mut self, frame: Option<Frame<Bytes>>) {
        if let Some(finish) = self.finish.take() {
            self.finishing = Some((finish.finish(), frame));
        }
    }
}

// Nothing in it is pinned: the inner body and the work are boxed.
impl<F: Finish> Unpin for BeforeEnd<F> {}

impl<F: Finish> Body for BeforeEnd<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some((work, _)) = this.finishing.as_mut() {
                std::task::ready!(work.as_mut().poll(cx));
                let held = this.finishing.take().and_then(|(_, frame)| frame);
                return Poll::Ready(held.map(Ok));
            }
            let Some(finish) = this.finish.as_mut() else {
                // Done: anything after (nothing, normally) passes through.
                return Pin::new(&mut this.inner).poll_frame(cx);
            };
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    finish.frame(&frame);
                    let last = match frame.data_ref() {
                        None => frame.is_trailers(),
                        Some(data) => {
                            if let Some(remaining) = this.remaining.as_mut() {
                                *remaining = remaining.saturating_sub(data.len() as u64);
                            }
                            this.remaining == Some(0) || this.inner.is_end_stream()
                        }
                    };
                    if !last {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.hold(Some(frame));
                }
                Some(Err(error)) => {
                    // Failed: the work is dropped, to do what it can in the background.
                    this.finish = None;
                    return Poll::Ready(Some(Err(error)));
                }
                None => this.hold(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Never before the work is done: an end announced early would skip it.
        self.finish.is_none() && self.finishing.is_none() && self.inner.is_end_stream()
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

    /// Records what an [`OnEnd`] tells its hook.
    struct Record(Arc<std::sync::Mutex<Vec<String>>>);

    impl<B: Body> EndHook<B> for Record {
        type Error = B::Error;

        fn frame(&mut self, frame: &Frame<B::Data>, _inner: &B) -> Result<(), B::Error> {
            let kind = if frame.is_data() { "data" } else { "trailers" };
            self.0.lock().unwrap().push(kind.into());
            Ok(())
        }

        fn end(&mut self, how: End) {
            self.0.lock().unwrap().push(format!("{how:?}"));
        }

        fn dropped(&mut self, _inner: &B) {
            self.0.lock().unwrap().push("dropped".into());
        }
    }

    fn recorded<B: Body>(body: B) -> (OnEnd<B, Record>, Arc<std::sync::Mutex<Vec<String>>>) {
        let log = Arc::default();
        (OnEnd::with_hook(body, Record(Arc::clone(&log))), log)
    }

    #[tokio::test]
    async fn the_hook_sees_each_frame_then_the_end_then_the_drop() {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ];
        let (body, log) = recorded(StreamBody::new(stream::iter(frames)));
        body.collect().await.unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["data", "trailers", "Stream", "dropped"]
        );

        let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Err("broken".into()),
        ];
        let (body, log) = recorded(StreamBody::new(stream::iter(frames)));
        assert!(body.collect().await.is_err());
        assert_eq!(*log.lock().unwrap(), ["data", "Error", "dropped"]);

        let (body, log) = recorded(chunks(&[1, 1]));
        drop(body);
        assert_eq!(*log.lock().unwrap(), ["dropped"]);
    }

    #[tokio::test]
    async fn a_guard_is_let_go_at_the_end() {
        let guard = Arc::new(());
        let mut body = Guarded::new(chunks(&[1]), Arc::clone(&guard));
        assert!(body.frame().await.is_some());
        assert_eq!(Arc::strong_count(&guard), 2, "held while the body streams");
        assert!(body.frame().await.is_none());
        assert_eq!(
            Arc::strong_count(&guard),
            1,
            "let go at the end, body still alive"
        );
        drop(body);
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
