//! A real HTTP upstream for tests (HTTP/1.1 and h2c on one port), with endpoints that make the
//! proxy's behaviour observable: echo what arrived, hash an upload, stream a download, hold a
//! stream open, delay the head, answer before reading the whole upload, answer with hop-by-hop junk,
//! echo a WebSocket, send trailers, report a request's trailers, answer a given status with a given cost report (`/respond`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::Notify;

type Body = BoxBody<Bytes, Infallible>;

/// Builder for the test upstream.
pub fn upstream() -> UpstreamBuilder {
    UpstreamBuilder {}
}

pub struct UpstreamBuilder {}

#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    /// Connections accepted so far, and of them still open.
    pub accepted: Arc<AtomicUsize>,
    pub open: Arc<AtomicUsize>,
    /// Lets `/hold` finish its stream.
    pub release: Arc<Notify>,
    /// Told when `/hold` has sent its first chunk.
    pub first_chunk_sent: Arc<Notify>,
}

impl Upstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn request_count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
    pub fn accepted_count(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl UpstreamBuilder {
    pub async fn start(self) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Upstream {
            addr: listener.local_addr().unwrap(),
            requests: Arc::new(AtomicUsize::new(0)),
            accepted: Arc::new(AtomicUsize::new(0)),
            open: Arc::new(AtomicUsize::new(0)),
            release: Arc::new(Notify::new()),
            first_chunk_sent: Arc::new(Notify::new()),
        };
        let state = upstream.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = state.clone();
                state.accepted.fetch_add(1, Ordering::SeqCst);
                state.open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let open = state.open.clone();
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(req, state).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        upstream
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Deterministic bytes for downloads, so a test can hash what it expects.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn headers_json(headers: &HeaderMap) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for name in headers.keys() {
        let values: Vec<serde_json::Value> = headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned().into())
            .collect();
        map.insert(name.to_string(), values.into());
    }
    map.into()
}

async fn handle(mut req: Request<Incoming>, state: Upstream) -> Response<Body> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let q = query(&req);
    match req.uri().path() {
        "/download" => {
            let size: usize = q.get("size").and_then(|s| s.parse().ok()).unwrap_or(1024);
            Response::new(full(pattern(size)))
        }
        "/upload" => {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            Response::new(full(format!("{} {}", body.len(), sha256_hex(&body))))
        }
        "/hold" => {
            // First chunk now, the last one only when the test says so.
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(2);
            let release = state.release.clone();
            let first = state.first_chunk_sent.clone();
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from_static(b"first,"))))
                    .await;
                first.notify_one();
                release.notified().await;
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"last")))).await;
            });
            let stream = tokio_stream_from(rx);
            Response::new(BodyExt::boxed(StreamBody::new(stream)))
        }
        "/early" => {
            // Answers at once, goes on reading the request body slowly (a frame every 50 ms)
            // for `ms`, then drops the rest.
            let ms: u64 = q.get("ms").and_then(|s| s.parse().ok()).unwrap_or(150);
            let mut body = req.into_body();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_millis(ms), async {
                    while let Some(Ok(_)) = body.frame().await {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
                .await;
            });
            Response::new(full("early"))
        }
        "/sleep" => {
            // `?release=1`: until the test notifies `release` instead of `ms`.
            if q.contains_key("release") {
                state.release.notified().await;
            } else {
                let ms: u64 = q.get("ms").and_then(|s| s.parse().ok()).unwrap_or(1000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Response::new(full("slept"))
        }
        "/respond" => {
            // `?status=401&ms=100&cost=35&trailer=20&hold=1`: after `ms` (or, with
            // `release=1`, once the test notifies `release`), answer `status` with
            // `x-tokens-used: <cost>` in the head and/or `x-tokens-used: <trailer>` as a
            // trailer (values sent as given, so a test can send malformed ones).
            if q.contains_key("release") {
                state.release.notified().await;
            }
            let ms: u64 = q.get("ms").and_then(|s| s.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let status: u16 = q.get("status").and_then(|s| s.parse().ok()).unwrap_or(200);
            // With `hold=1` the body stops after its first chunk until `release` is notified.
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(2);
            let hold = q.contains_key("hold").then(|| state.release.clone());
            let trailer = q.get("trailer").cloned();
            tokio::spawn(async move {
                let first = Frame::data(Bytes::from(format!("status {status}")));
                let _ = tx.send(Ok(first)).await;
                if let Some(release) = hold {
                    release.notified().await;
                }
                if let Some(value) = trailer {
                    let mut trailers = HeaderMap::new();
                    trailers.insert("x-tokens-used", value.parse().unwrap());
                    let _ = tx.send(Ok(Frame::trailers(trailers))).await;
                }
            });
            let mut response = Response::builder().status(status);
            if let Some(value) = q.get("cost") {
                response = response.header("x-tokens-used", value.as_str());
            }
            response
                .body(BodyExt::boxed(StreamBody::new(tokio_stream_from(rx))))
                .unwrap()
        }
        "/hop" => Response::builder()
            .header("connection", "x-internal, keep-alive")
            .header("x-internal", "secret")
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("set-cookie", "a=1; Path=/")
            .header("set-cookie", "b=2; Path=/")
            .header("x-app", "yes")
            .body(full("hop"))
            .unwrap(),
        "/request-trailers" => {
            // The request's trailers, as JSON (`null` when it had none).
            let collected = req.into_body().collect().await.unwrap();
            let trailers = collected.trailers().map(headers_json);
            Response::new(full(serde_json::to_vec(&trailers).unwrap()))
        }
        "/trailers" => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from_static(b"payload"))),
                Ok(Frame::trailers(trailers)),
            ];
            Response::new(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
        }
        "/ws" => {
            let key = req
                .headers()
                .get("sec-websocket-key")
                .cloned()
                .expect("websocket key");
            let accept =
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let upgraded = on_upgrade.await.expect("upgrade");
                let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    tokio_tungstenite::tungstenite::protocol::Role::Server,
                    None,
                )
                .await;
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_text() || msg.is_binary() {
                        if ws.send(msg).await.is_err() {
                            break;
                        }
                    } else if msg.is_close() {
                        break;
                    }
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-accept", accept)
                .body(full(""))
                .unwrap()
        }
        _ => {
            // Echo: what the upstream received, as JSON.
            let method = req.method().to_string();
            let uri = req.uri().to_string();
            let version = format!("{:?}", req.version());
            let headers = headers_json(req.headers());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let echo = serde_json::json!({
                "method": method, "uri": uri, "version": version, "headers": headers,
                "body_len": body.len(),
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(full(echo.to_string()))
                .unwrap()
        }
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
