//! The upstream exchange of a request that holds something for the limits: a client that hangs
//! up does not end the app's work, so it must not end what the limits know of it.
//!
//! hyper drops a request's future when its client leaves; dropped with it, the upstream
//! exchange would give back a `concurrency` slot while the app is still working, and leave a
//! `count_statuses` / `cost_from_response` request unsettled (an attacker who hangs up would
//! get unlimited side effects). So a request that holds anything ([`Holdings`]: concurrency leases,
//! a settlement, a guard to keep until the app answers) is sent through [`exchange`]:
//!
//! - The exchange is polled in the request's own future, as any other (no task, no channel,
//!   one allocation for the boxed exchange); only when that future is dropped before the
//!   answer does the exchange move into a task of its own (tracked in `orphans`, which graceful
//!   shutdown waits for, bounded by `shutdown_timeout`). The task waits for the app's answer
//!   (at most `upstream.timeout`, as always), settles on it, and lets go of what it held.
//! - The exchange ends with the app's answer, never with the upstream connection: an upstream
//!   that closes or resets without answering, or that times out, gives an outcome that can
//!   never be known, settled as failing ([`Delivery::Unknown`]).
//! - The body: once the head has arrived, a response that holds concurrency slots or waits for
//!   a `cost_from_response` report keeps them until its body ends. If the client leaves
//!   mid-body, the rest of the body is read from the upstream and discarded, for at most
//!   `upstream.timeout` from then ([`HeldBody`]); the slots are released, and the cost settled,
//!   when it ends or that time is up. A response that holds nothing is dropped with its client,
//!   as before (its upstream connection is closed, not read to its end).
//!
//! A request that holds nothing is sent as before, in its own future, at no extra cost.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{Either, FutureExt};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio_util::task::TaskTracker;

use super::upstream::UpstreamBody;
use crate::body::{self, BoxError, ProxyBody};
use crate::error::ProxyError;
use crate::throttle::settle::{Delivery, Obligation};
use crate::throttle::{Admitted, LeaseGuard};

/// What the upstream answered: its response head, or why there is none.
pub type Answered = Result<Response<UpstreamBody>, ProxyError>;

/// What a request holds until the app has answered it.
#[derive(Default)]
pub struct Holdings {
    /// Concurrency slots: held until the response body ends.
    pub leases: Option<Box<LeaseGuard>>,
    /// Units to settle on the answer (`count_statuses`, `cost_from_response`).
    pub settlement: Option<Box<Obligation>>,
    /// Anything else to keep until the response head arrives (or the exchange fails), such as
    /// an overload slot: told the answer then, whether or not the client is still there.
    pub until_head: Option<Box<dyn UntilHead>>,
}

/// Something a request holds until the app's response head arrives (or the exchange fails),
/// and that wants to know what the app answered (an overload slot learns its latency from it).
pub trait UntilHead: Send {
    fn answered(self: Box<Self>, answered: &Answered);
}

impl Holdings {
    /// Takes what `admitted` holds until the app answers (its leases and settlement).
    pub fn take_from(admitted: &mut Admitted<'_>) -> Holdings {
        Holdings {
            leases: admitted.leases.take(),
            settlement: admitted.settlement.take(),
            until_head: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_none() && self.settlement.is_none() && self.until_head.is_none()
    }

    /// Holds what `other` holds for its limits too (a request counted on more than one
    /// route: see `routing::routes_of`).
    pub fn join(&mut self, other: Holdings) {
        let Holdings {
            leases,
            settlement,
            until_head,
        } = other;
        self.leases = LeaseGuard::joined(self.leases.take(), leases);
        self.settlement = Obligation::joined(self.settlement.take(), settlement);
        if self.until_head.is_none() {
            self.until_head = until_head;
        }
    }
}

/// How an exchange that ended as `answered` settles: answered, never sent (no connection to
/// the upstream could be made, or tollgate refused the request before sending it), or unknown
/// (the request, or part of it, may have reached the app: a timeout, an exchange broken after
/// sending, a request body cut off by its client).
pub fn outcome_of(answered: &Answered) -> Delivery {
    match answered {
        Ok(_) => Delivery::Answered,
        Err(ProxyError::UpstreamConnect(_) | ProxyError::BadRequest(_)) => Delivery::NotSent,
        Err(_) => Delivery::Unknown,
    }
}

/// Sends `sending` holding `held`: the answer and what is still held (all of it but
/// `until_head`, which is let go once the head arrives). When the returned future is dropped
/// before the answer (the client left), the exchange goes on in a task tracked by `orphans`
/// (see the module docs); a response body it gets is read for at most `drain_for`.
pub fn exchange<'t, F>(
    sending: F,
    held: Holdings,
    orphans: &'t TaskTracker,
    drain_for: Duration,
) -> impl Future<Output = (Answered, Holdings)> + 't
where
    F: Future<Output = Answered> + Send + 'static,
{
    if held.is_empty() {
        return Either::Left(sending.map(|answered| (answered, Holdings::default())));
    }
    Either::Right(Holding {
        sending: Some(Box::pin(sending)),
        held: Some(held),
        orphans,
        drain_for,
    })
}

/// An exchange holding something; see [`exchange`].
struct Holding<'t, F: Future<Output = Answered> + Send + 'static> {
    /// Boxed, so that it can move into a task of its own while it runs.
    sending: Option<Pin<Box<F>>>,
    held: Option<Holdings>,
    orphans: &'t TaskTracker,
    drain_for: Duration,
}

impl<F: Future<Output = Answered> + Send + 'static> Future for Holding<'_, F> {
    type Output = (Answered, Holdings);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let sending = this
            .sending
            .as_mut()
            .expect("an exchange is not polled after its answer");
        let answered = ready!(sending.as_mut().poll(cx));
        this.sending = None;
        let mut held = this.held.take().unwrap_or_default();
        if let Some(guard) = held.until_head.take() {
            guard.answered(&answered);
        }
        Poll::Ready((answered, held))
    }
}

impl<F: Future<Output = Answered> + Send + 'static> Drop for Holding<'_, F> {
    fn drop(&mut self) {
        let (Some(sending), Some(held)) = (self.sending.take(), self.held.take()) else {
            return;
        };
        // Outside a runtime (the process is ending) there is nothing left to wait with.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.orphans
                .spawn_on(orphaned(sending, held, self.drain_for), &runtime);
        }
    }
}

/// The rest of an exchange whose client left before the answer: waits for it, settles on it,
/// and holds the leases (and a `cost_from_response` settlement) until its body has been read.
async fn orphaned<F>(sending: Pin<Box<F>>, held: Holdings, drain_for: Duration)
where
    F: Future<Output = Answered> + Send + 'static,
{
    let answered = sending.await;
    let Holdings {
        leases,
        settlement,
        until_head,
    } = held;
    if let Some(guard) = until_head {
        guard.answered(&answered);
    }
    match answered {
        Ok(response) => {
            tracing::debug!(
                status = response.status().as_u16(),
                "the client left before the answer: its limits were settled on it"
            );
            let settles_at_end = settlement.as_ref().is_some_and(|s| s.settles_at_end());
            let mut response = response.map(body::boxed);
            if let Some(settlement) = settlement {
                response = settlement
                    .on_response(response, Delivery::Answered, &mut [])
                    .await;
            }
            if leases.is_some() || settles_at_end {
                // Read in this task: it is tracked already.
                drain(response.into_body(), leases, drain_for).await;
            }
        }
        Err(error) => {
            let outcome = outcome_of(&Err(error));
            tracing::debug!(?outcome, "the client left and the upstream gave no answer");
            if let (Some(settlement), Delivery::Unknown) = (settlement, outcome) {
                settlement.settle_unknown();
            }
        }
    }
}

/// Reads `body` to its end (or its first error) for at most `within`, discarding it, then
/// lets go of `guard`.
async fn drain<G>(mut body: ProxyBody, guard: G, within: Duration) {
    let read = async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
    };
    if tokio::time::timeout(within, read).await.is_err() {
        tracing::debug!(
            after = ?within,
            "gave up reading a response body its client left"
        );
    }
    drop(body);
    drop(guard);
}

/// A response body that holds `guard` until it ends and, if its client leaves before that,
/// is read to its end in a task tracked by `orphans` (for at most `drain_for`) before the guard
/// is let go (see the module docs).
pub struct HeldBody<G: Send + 'static> {
    inner: Option<ProxyBody>,
    guard: Option<G>,
    orphans: TaskTracker,
    drain_for: Duration,
}

impl<G: Send + 'static> HeldBody<G> {
    pub fn new(inner: ProxyBody, guard: G, orphans: &TaskTracker, drain_for: Duration) -> Self {
        HeldBody {
            inner: Some(inner),
            guard: Some(guard),
            orphans: orphans.clone(),
            drain_for,
        }
    }
}

// The guard is never pinned: it is only held and dropped.
impl<G: Send + 'static> Unpin for HeldBody<G> {}

impl<G: Send + 'static> Body for HeldBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = ready!(Pin::new(inner).poll_frame(cx));
        if !matches!(polled, Some(Ok(_))) {
            // Ended or failed: nothing more will come, the guard goes now.
            this.inner = None;
            this.guard = None;
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<G: Send + 'static> Drop for HeldBody<G> {
    fn drop(&mut self) {
        let (Some(inner), Some(guard)) = (self.inner.take(), self.guard.take()) else {
            return;
        };
        if inner.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.orphans
                .spawn_on(drain(inner, guard, self.drain_for), &runtime);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A guard whose life the test watches.
    /// A guard whose life the test watches (by the count of its `Arc`).
    struct Watched(#[allow(dead_code)] Arc<()>);

    impl UntilHead for Watched {
        fn answered(self: Box<Self>, _: &Answered) {}
    }

    fn watched() -> (Arc<()>, Box<dyn UntilHead>) {
        let guard = Arc::new(());
        (guard.clone(), Box::new(Watched(guard)))
    }

    fn held_until_head(guard: Box<dyn UntilHead>) -> Holdings {
        Holdings {
            until_head: Some(guard),
            ..Holdings::default()
        }
    }

    #[test]
    fn only_a_request_that_never_reached_the_app_is_not_sent() {
        let answered = |error| -> Answered { Err(error) };
        assert_eq!(
            outcome_of(&answered(ProxyError::UpstreamConnect("refused".into()))),
            Delivery::NotSent
        );
        assert_eq!(
            outcome_of(&answered(ProxyError::BadRequest("x"))),
            Delivery::NotSent
        );
        assert_eq!(
            outcome_of(&answered(ProxyError::UpstreamTimeout(Duration::from_secs(
                1
            )))),
            Delivery::Unknown
        );
        assert_eq!(
            outcome_of(&answered(ProxyError::Upstream("reset".into()))),
            Delivery::Unknown
        );
        assert_eq!(
            outcome_of(&answered(ProxyError::BodyTooLarge { limit: 1 })),
            Delivery::Unknown
        );
    }

    /// A dropped exchange goes on in a tracked task, holding until the answer; one that holds
    /// nothing is simply dropped.
    #[tokio::test]
    async fn a_dropped_exchange_holds_until_its_answer() {
        let orphans = TaskTracker::new();
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let sending = async move {
            let _ = answered.await;
            Err::<Response<UpstreamBody>, _>(ProxyError::Upstream("reset".into()))
        };
        let (watch, guard) = watched();
        let exchanging = exchange(sending, held_until_head(guard), &orphans, Duration::ZERO);
        let waited = tokio::time::timeout(Duration::from_millis(20), exchanging).await;
        assert!(waited.is_err(), "no answer yet");
        // Dropped with its client: the guard is still held, by the orphaned exchange.
        assert_eq!(Arc::strong_count(&watch), 2);
        assert_eq!(orphans.len(), 1);
        answer.send(()).unwrap();
        orphans.close();
        tokio::time::timeout(Duration::from_secs(5), orphans.wait())
            .await
            .expect("the orphan ends with its answer");
        assert_eq!(Arc::strong_count(&watch), 1, "let go at the answer");
    }

    #[tokio::test]
    async fn an_answered_exchange_lets_go_of_the_head_guard_and_keeps_the_rest() {
        let orphans = TaskTracker::new();
        let (watch, guard) = watched();
        let sending = async { Err::<Response<UpstreamBody>, _>(ProxyError::Upstream("x".into())) };
        let (answered, held) =
            exchange(sending, held_until_head(guard), &orphans, Duration::ZERO).await;
        assert!(answered.is_err());
        assert!(held.is_empty());
        assert_eq!(Arc::strong_count(&watch), 1);
        assert_eq!(orphans.len(), 0);
    }

    /// A body its client left is read to its end before the guard goes; one read to its end
    /// lets the guard go at once.
    #[tokio::test]
    async fn a_body_left_mid_way_is_drained_before_the_guard_goes() {
        let orphans = TaskTracker::new();
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
        let inner = body::boxed(http_body_util::StreamBody::new(tokio_stream_from(receiver)));
        let guard = Arc::new(());
        let mut held = HeldBody::new(inner, guard.clone(), &orphans, Duration::from_secs(5));
        sender
            .send(Ok(Frame::data(Bytes::from_static(b"a"))))
            .await
            .unwrap();
        assert!(held.frame().await.is_some());
        drop(held);
        assert_eq!(Arc::strong_count(&guard), 2, "held while the rest is read");
        sender
            .send(Ok(Frame::data(Bytes::from_static(b"b"))))
            .await
            .unwrap();
        drop(sender);
        orphans.close();
        tokio::time::timeout(Duration::from_secs(5), orphans.wait())
            .await
            .expect("drained");
        assert_eq!(Arc::strong_count(&guard), 1);

        let guard = Arc::new(());
        let mut held = HeldBody::new(
            body::full("x"),
            guard.clone(),
            &TaskTracker::new(),
            Duration::ZERO,
        );
        while held.frame().await.is_some() {}
        assert_eq!(Arc::strong_count(&guard), 1, "let go at the end");
    }

    fn tokio_stream_from(
        mut receiver: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    ) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }
}
