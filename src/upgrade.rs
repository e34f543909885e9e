//! Protocol upgrades (WebSocket and the like): which ones go through, and from the 101 to the
//! tunnel.
//!
//! Once the upstream answers 101, tollgate sees nothing of what the tunnel carries: an upgrade
//! to `h2c` would carry any number of HTTP/2 requests past every limit under one `GET`. So a
//! request may switch only to the protocols its route lists in `upgrades` (`websocket` when it
//! lists none, and for requests no route matches): [`restrict`] removes every other `Upgrade`
//! token (and `HTTP2-Settings` with `h2c`) before the request is forwarded, and [`answers`]
//! tells a 101 for a protocol that was not forwarded, which the proxy turns into a 502.
//!
//! The proxy forwards an upgrade request like any other; when the upstream answers 101, the
//! client's connection and the upstream's become one byte tunnel ([`spawn_tunnel`]), tracked
//! by the proxy so that shutdown waits for it.
//!
//! The client's side comes from one of two places ([`ClientSide`]):
//!
//! - TLS and HTTP/2 connections are upgraded by hyper (`hyper::upgrade::on`).
//! - Plain HTTP/1 connections are served by `conn` one cycle at a time and taken apart between
//!   cycles, which hyper's own upgrade machinery does not allow. There the connection hands the
//!   socket over by hand: the service marks an upgrade request with a [`Handoff`] slot and
//!   puts a [`ClientUpgrade`] on the request; once hyper has written the 101, the connection
//!   takes its socket back from hyper and sends it, with any bytes read past the request
//!   ([`Rewind`]), through the slot to the tunnel.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::hooked_io::{HookedIo, IoHook};

/// Sent with `Upgrade: h2c` only (RFC 7540 §3.2), and meaningless without it.
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// Keeps in `headers`' `Upgrade` only the protocols `allowed` lists (lower-case names); the
/// header goes when none is left, and `HTTP2-Settings` unless `h2c` stays. Returns the
/// `Upgrade` value that stays (None: the request is forwarded as no upgrade).
pub fn restrict<S: AsRef<str>>(headers: &mut HeaderMap, allowed: &[S]) -> Option<HeaderValue> {
    let kept: Vec<&str> = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|token| {
            let name = protocol_name(token);
            allowed
                .iter()
                .any(|a| a.as_ref().eq_ignore_ascii_case(name))
        })
        .collect();
    let value = (!kept.is_empty())
        .then(|| HeaderValue::from_str(&kept.join(", ")).ok())
        .flatten();
    let h2c = kept
        .iter()
        .any(|t| protocol_name(t).eq_ignore_ascii_case("h2c"));
    match &value {
        Some(value) => {
            headers.insert(header::UPGRADE, value.clone());
        }
        None => {
            headers.remove(header::UPGRADE);
        }
    }
    if !h2c {
        headers.remove(&HTTP2_SETTINGS);
    }
    value
}

/// Whether a 101's `Upgrade` names a protocol of `forwarded` (the request's `Upgrade` as
/// [`restrict`] left it). A 101 without `Upgrade` switches to nothing known: no.
pub fn answers(response: &HeaderMap, forwarded: &HeaderValue) -> bool {
    let Some(chosen) = response.get(header::UPGRADE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let offered = forwarded.to_str().unwrap_or("");
    chosen.split(',').map(str::trim).all(|token| {
        offered
            .split(',')
            .any(|o| protocol_name(o.trim()).eq_ignore_ascii_case(protocol_name(token)))
    })
}

/// `websocket` of `websocket/13`: protocols are named with an optional version.
fn protocol_name(token: &str) -> &str {
    token.split_once('/').map_or(token, |(name, _)| name).trim()
}

/// A plain client socket after an upgrade, with the bytes read from it past the request.
pub type Upgraded = Rewind<TcpStream>;

/// Where a plain HTTP/1 connection's socket goes if the request in progress upgrades it. One
/// per connection, shared by the service (which fills it) and the connection loop (which
/// takes it once hyper has let go of the socket).
#[derive(Clone, Default)]
pub struct Handoff(Arc<Mutex<Option<oneshot::Sender<Upgraded>>>>);

impl Handoff {
    /// If hyper marked `request` as asking for an upgrade, gets ready to hand the socket over
    /// and puts the receiving end on the request as a [`ClientUpgrade`] for the proxy.
    pub fn prepare<B>(&self, request: &mut Request<B>) {
        if request
            .extensions()
            .get::<hyper::upgrade::OnUpgrade>()
            .is_none()
        {
            return;
        }
        let (handoff, client) = oneshot::channel();
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(handoff);
        request.extensions_mut().insert(ClientUpgrade::new(client));
    }

    /// The socket's destination, if a request got ready to upgrade; empty afterwards.
    pub fn take(&self) -> Option<oneshot::Sender<Upgraded>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The client side of an upgrade on a connection the server upgrades by hand (plain
/// HTTP/1): the socket arrives here once the 101 has been written. Requests without it are
/// upgraded by hyper.
#[derive(Clone)]
pub struct ClientUpgrade(Arc<Mutex<Option<HandedOver>>>);

type HandedOver = oneshot::Receiver<Upgraded>;

impl ClientUpgrade {
    fn new(handed_over: HandedOver) -> Self {
        ClientUpgrade(Arc::new(Mutex::new(Some(handed_over))))
    }

    fn take(&self) -> Option<HandedOver> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Where the client's side of a tunnel comes from.
pub enum ClientSide {
    /// hyper upgrades the connection (TLS and HTTP/2 listeners' connections).
    Hyper(hyper::upgrade::OnUpgrade),
    /// The server hands the socket over itself (plain HTTP/1, see `conn`).
    HandedOver(HandedOver),
}

/// Takes the client's side of an upgrade off the request before it is forwarded: None unless
/// `upgrade` (the request asks for one the proxy forwards).
pub fn client_side(parts: &mut http::request::Parts, upgrade: bool) -> Option<ClientSide> {
    let handed_over = parts
        .extensions
        .remove::<ClientUpgrade>()
        .and_then(|u| u.take());
    upgrade.then(|| match handed_over {
        Some(handed_over) => ClientSide::HandedOver(handed_over),
        // hyper's handle on the client's connection rides in the extensions, where
        // `upgrade::on` looks for it.
        None => ClientSide::Hyper(
            parts
                .extensions
                .remove::<hyper::upgrade::OnUpgrade>()
                .unwrap_or_else(|| hyper::upgrade::on(Request::new(()))),
        ),
    })
}

/// On the upstream's 101: joins the client and the upstream in a tunnel that runs until either
/// side closes, tracked by `tunnels`.
pub fn spawn_tunnel<B>(tunnels: &TaskTracker, client: ClientSide, response: &mut Response<B>) {
    let upstream = hyper::upgrade::on(response);
    tunnels.spawn(async move {
        tunnel(client, upstream).await;
    });
}

/// Copies bytes both ways between an upgraded client and upstream until either side closes.
async fn tunnel(client: ClientSide, upstream: hyper::upgrade::OnUpgrade) {
    match client {
        ClientSide::Hyper(client) => match tokio::try_join!(client, upstream) {
            Ok((client, upstream)) => copy_both_ways(TokioIo::new(client), upstream).await,
            Err(e) => tracing::debug!(cause = %crate::error::chain(&e), "upgrade did not complete"),
        },
        ClientSide::HandedOver(client) => {
            let client = async { client.await.map_err(|_| "the client connection ended") };
            let upstream = async { upstream.await.map_err(|_| "the upstream did not upgrade") };
            match tokio::try_join!(client, upstream) {
                Ok((client, upstream)) => copy_both_ways(client, upstream).await,
                Err(cause) => tracing::debug!(cause, "upgrade did not complete"),
            }
        }
    }
}

async fn copy_both_ways<C>(mut client: C, upstream: hyper::upgrade::Upgraded)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut upstream = TokioIo::new(upstream);
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => tracing::debug!(bytes_up = up, bytes_down = down, "tunnel closed"),
        Err(e) => tracing::debug!(cause = %crate::error::chain(&e), "tunnel ended with an error"),
    }
}

/// A socket that first yields bytes already taken off it.
pub type Rewind<T> = HookedIo<T, Prefix>;

/// `prefix`, then what `inner` reads.
pub fn rewind<T>(prefix: Bytes, inner: T) -> Rewind<T> {
    HookedIo::with_hook(inner, Prefix(prefix))
}

/// The hook of a [`Rewind`]: the bytes not yet read.
#[derive(Debug)]
pub struct Prefix(Bytes);

impl Prefix {
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl IoHook for Prefix {
    #[inline]
    fn poll_read<T: AsyncRead>(
        &mut self,
        inner: Pin<&mut T>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let prefix = &mut self.0;
        if !prefix.is_empty() {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix[..n]);
            prefix.advance(n);
            if prefix.is_empty() {
                // Drop the allocation now rather than with the connection.
                *prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        inner.poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn rewind_yields_the_prefix_then_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(b" world").await.unwrap();
        let mut io = rewind(Bytes::from_static(b"hello"), server);
        let mut got = vec![0u8; 11];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"hello world");
        let (_, rest) = io.into_parts();
        assert!(rest.into_bytes().is_empty());
    }

    fn upgrade_headers(upgrade: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, HTTP2-Settings"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_str(upgrade).unwrap());
        h.insert(
            &HTTP2_SETTINGS,
            HeaderValue::from_static("AAMAAABkAAQAAP__"),
        );
        h
    }

    #[test]
    fn only_allowed_protocols_are_forwarded() {
        let websocket_only = crate::config::DEFAULT_UPGRADES;
        let mut h = upgrade_headers("h2c");
        assert_eq!(restrict(&mut h, websocket_only), None);
        assert!(h.get("upgrade").is_none());
        assert!(h.get("http2-settings").is_none());

        let mut h = upgrade_headers("WebSocket");
        assert_eq!(restrict(&mut h, websocket_only).unwrap(), "WebSocket");
        assert!(h.get("http2-settings").is_none());

        let mut h = upgrade_headers("h2c, websocket/13, foo");
        assert_eq!(restrict(&mut h, websocket_only).unwrap(), "websocket/13");
        assert_eq!(h.get("upgrade").unwrap(), "websocket/13");

        let mut h = upgrade_headers("h2c");
        assert_eq!(restrict(&mut h, &["websocket", "h2c"]).unwrap(), "h2c");
        assert!(h.get("http2-settings").is_some());
    }

    #[test]
    fn a_101_must_switch_to_a_protocol_that_was_forwarded() {
        let forwarded = HeaderValue::from_static("websocket");
        let answer = |upgrade: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(u) = upgrade {
                h.insert(header::UPGRADE, HeaderValue::from_str(u).unwrap());
            }
            answers(&h, &forwarded)
        };
        assert!(answer(Some("websocket")));
        assert!(answer(Some("WebSocket")));
        assert!(!answer(Some("h2c")));
        assert!(!answer(Some("websocket, h2c")));
        assert!(!answer(None));
    }
}
