//! A serving thread's own keep-alive connections to a plain-`http://` HTTP/1.1 upstream.
//!
//! Why not hyper-util's pool here: it serves any number of origins, so every checkout and
//! every return hashes the origin key (SipHash), locks a map shared by every thread, and each
//! response spawns a task that waits to hand the connection back. tollgate has one upstream and
//! one pool per serving thread, so a pool is a stack of idle connections: a checkout pops, the
//! end of the response body pushes, and nothing is hashed or spawned per request. HTTP/2 and
//! TLS upstreams keep hyper-util's client.
//!
//! What the pool keeps from hyper-util's: a connection is reused only once its previous
//! exchange has ended; it is not reused after `pool_idle_timeout` idle, and a reaper closes it
//! then even without traffic; a request that met a pooled connection the upstream had already
//! closed (hyper hands back a request it never wrote) is sent again on another connection,
//! which is safe for every method; protocol upgrades keep their connection. An answer the
//! upstream sends before reading the whole upload reaches the client even when the upstream
//! then resets the connection (`early_answer`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::uri::Authority;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::early_answer::early_answer_io;
use crate::body::{End, EndHook, OnEnd, ProxyBody};
use crate::error::ProxyError;

type Sender = SendRequest<ProxyBody>;

pub struct Http1Pool {
    authority: Authority,
    /// Sent as Host when the request has none (the upstream's authority, without the port
    /// when it is 80).
    host: HeaderValue,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: Mutex<Idle>,
}

#[derive(Default)]
struct Idle {
    /// Most recently returned last: a checkout takes the warmest connection, and the oldest
    /// expire at the bottom.
    stack: Vec<(Sender, Instant)>,
    /// Whether a reaper task is watching this pool (one at most, only while it holds any).
    reaping: bool,
}

impl Http1Pool {
    pub fn new(authority: Authority, connect_timeout: Duration, idle_timeout: Duration) -> Self {
        let host = match authority.port_u16() {
            Some(80) => authority.host(),
            _ => authority.as_str(),
        };
        Http1Pool {
            host: HeaderValue::from_str(host).expect("an authority is a valid header value"),
            authority,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Idle::default()),
        }
    }

    /// Sends `request` (origin-form URI: path and query) and returns the response head; its
    /// body hands the connection back to the pool when it ends.
    pub async fn send(
        self: Arc<Self>,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, ProxyError> {
        // Host says which site.
        if !request.headers().contains_key(header::HOST) {
            request
                .headers_mut()
                .insert(header::HOST, self.host.clone());
        }
        let mut retried = false;
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                // Boxed: connecting is the rare case, and its future in place would make
                // every request's future (moved as it is built) that much larger.
                None => (Box::pin(self.connect()).await?, false),
            };
            // A reused connection may have been closed by the upstream while the request was
            // on its way (its FIN not yet seen here). Then the request has been written and
            // hyper cannot hand it back; a copy lets an idempotent request without a body be
            // sent once more on another connection.
            let replay = (reused && !retried).then(|| replayable(&request)).flatten();
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // An upgraded connection belongs to its tunnel from now on.
                    let upgraded = response.status() == http::StatusCode::SWITCHING_PROTOCOLS;
                    let (parts, body) = response.into_parts();
                    let body = OnEnd::with_hook(
                        body,
                        GiveBack {
                            ended: false,
                            to: (!upgraded).then(|| (sender, self.clone())),
                        },
                    );
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut failed) => match (failed.take_message(), replay) {
                    // Never written: the pooled connection had closed under us. A fresh
                    // connection that fails so is not tried again (it would loop).
                    (Some(unsent), _) if reused => request = unsent,
                    (_, Some(copy)) => {
                        tracing::debug!(cause = %crate::error::chain(failed.error()), "a reused upstream connection failed; sending the request again");
                        retried = true;
                        request = copy;
                    }
                    _ => return Err(ProxyError::from_send(Box::new(failed.into_error()))),
                },
            }
        }
    }

    /// The most recently returned connection that is ready for a request; closed and expired
    /// ones met on the way are dropped.
    fn checkout(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let mut busy = Vec::new();
        let mut found = None;
        while let Some((sender, since)) = idle.stack.pop() {
            if sender.is_closed() || since.elapsed() >= self.idle_timeout {
                continue;
            }
            if sender.is_ready() {
                found = Some(sender);
                break;
            }
            // Its last response ended but hyper has not yet made it ready (an upload still
            // being written, say): kept for later.
            busy.push((sender, since));
        }
        idle.stack.extend(busy.into_iter().rev());
        found
    }

    fn give_back(self: &Arc<Self>, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.stack.push((sender, Instant::now()));
        if !idle.reaping {
            idle.reaping = true;
            drop(idle);
            self.spawn_reaper();
        }
    }

    /// Closes connections idle past the timeout even when no request comes to notice them;
    /// ends when the pool is empty (the next give-back starts another).
    fn spawn_reaper(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        let period = self.idle_timeout;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(pool) = pool.upgrade() else { return };
                let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.stack
                    .retain(|(sender, since)| !sender.is_closed() && since.elapsed() < period);
                if idle.stack.is_empty() {
                    idle.reaping = false;
                    return;
                }
            }
        });
    }

    async fn connect(&self) -> Result<Sender, ProxyError> {
        let connecting = tokio::net::TcpStream::connect(self.authority.as_str());
        let stream = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(ProxyError::UpstreamConnect(Box::new(e))),
            Err(_) => {
                return Err(ProxyError::UpstreamConnect(
                    format!("connect timed out after {:?}", self.connect_timeout).into(),
                ))
            }
        };
        // Requests and responses are small writes that must not wait for an ACK.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(early_answer_io(stream)))
            .await
            .map_err(|e| ProxyError::UpstreamConnect(Box::new(e)))?;
        // Runs on this serving thread's runtime, beside the requests it carries.
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(cause = %crate::error::chain(&e), "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// A copy of `request` to send again if the connection it goes on turns out closed: only for
/// an idempotent method (RFC 9110, 9.2.2) and an empty body, which can be sent twice safely.
fn replayable(request: &Request<ProxyBody>) -> Option<Request<ProxyBody>> {
    if !request.method().is_idempotent() || !request.body().is_end_stream() {
        return None;
    }
    let mut copy = Request::new(crate::body::empty());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

/// A response body from a pooled connection; see [`GiveBack`].
pub type PooledBody = OnEnd<Incoming, GiveBack>;

/// Gives a pooled connection back once its response body has ended and is let go. A body
/// dropped before its end (the client left) or failed keeps its connection out of the pool:
/// hyper closes it rather than read what is left.
pub struct GiveBack {
    ended: bool,
    to: Option<(Sender, Arc<Http1Pool>)>,
}

impl EndHook<Incoming> for GiveBack {
    type Error = hyper::Error;

    #[inline]
    fn end(&mut self, how: End) {
        match how {
            End::Stream => self.ended = true,
            End::Error => self.to = None,
        }
    }

    #[inline]
    fn dropped(&mut self, inner: &Incoming) {
        // A body never read to its `None` (an empty one, or one the reader stopped polling
        // at its last frame) has still ended when hyper says so.
        if !(self.ended || inner.is_end_stream()) {
            return;
        }
        if let Some((sender, pool)) = self.to.take() {
            pool.give_back(sender);
        }
    }
}
