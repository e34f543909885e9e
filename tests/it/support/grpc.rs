//! A real gRPC upstream and real gRPC clients for tests, both tonic's own gRPC machinery
//! (framing, status, trailers) over hyper HTTP/2: no protoc, messages are raw bytes through
//! [`RawCodec`].
//!
//! The upstream (h2c on a loopback port) serves `test.Echo`:
//! - `Unary`: answers `echo:<message>`, with `x-upstream: yes` and the `te` it received as
//!   `x-upstream-te` in its response metadata;
//! - `Bidi`: answers each message as it arrives with `echo:<message>` (so a test can prove
//!   that messages flow one by one, not buffered until the end);
//! - `Join`: client streaming, answers all the messages it was sent, joined by `,`;
//! - `Count`: server streaming, answers `0`, `1`, … up to the number it is sent;
//! - `Fail`: the upstream's own error, NOT_FOUND "no such thing" (trailers-only);
//! - `Slow`: answers like `Unary`, but only after 2 seconds;
//!
//! and one plain HTTP/2 path, `/trailers`, which answers with the request's trailers as
//! response trailers (gRPC clients send none, but a proxy must carry them both ways).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{
    ClientStreamingService, ServerStreamingService, StreamingService, UnaryService,
};
use tonic::{Request, Response, Status, Streaming};

/// Messages as raw bytes: tonic does the gRPC framing, no protobuf needed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

fn echo(message: &[u8]) -> Bytes {
    let mut out = b"echo:".to_vec();
    out.extend_from_slice(message);
    out.into()
}

struct Unary;

impl UnaryService<Bytes> for Unary {
    type Response = Bytes;
    type Future = std::future::Ready<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let mut response = Response::new(echo(request.get_ref()));
        response
            .metadata_mut()
            .insert("x-upstream", "yes".parse().unwrap());
        // What arrived as `te` (gRPC requires `te: trailers` on every request).
        if let Some(te) = request.metadata().get("te") {
            response.metadata_mut().insert("x-upstream-te", te.clone());
        }
        std::future::ready(Ok(response))
    }
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

struct Bidi;

impl StreamingService<Bytes> for Bidi {
    type Response = Bytes;
    type ResponseStream = MessageStream;
    type Future = std::future::Ready<Result<Response<MessageStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        let replies = request
            .into_inner()
            .map(|message| message.map(|m| echo(&m)));
        std::future::ready(Ok(Response::new(Box::pin(replies) as MessageStream)))
    }
}

struct Join;

impl ClientStreamingService<Bytes> for Join {
    type Response = Bytes;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        Box::pin(async move {
            let mut messages = request.into_inner();
            let mut joined = Vec::new();
            while let Some(message) = messages.message().await? {
                if !joined.is_empty() {
                    joined.push(b',');
                }
                joined.extend_from_slice(&message);
            }
            Ok(Response::new(joined.into()))
        })
    }
}

struct Count;

impl ServerStreamingService<Bytes> for Count {
    type Response = Bytes;
    type ResponseStream = MessageStream;
    type Future = std::future::Ready<Result<Response<MessageStream>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let n: usize = std::str::from_utf8(request.get_ref())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let numbers = futures_util::stream::iter((0..n).map(|i| Ok(Bytes::from(i.to_string()))));
        std::future::ready(Ok(Response::new(Box::pin(numbers) as MessageStream)))
    }
}

struct Fail;

impl UnaryService<Bytes> for Fail {
    type Response = Bytes;
    type Future = std::future::Ready<Result<Response<Bytes>, Status>>;

    fn call(&mut self, _request: Request<Bytes>) -> Self::Future {
        std::future::ready(Err(Status::not_found("no such thing")))
    }
}

struct Slow;

impl UnaryService<Bytes> for Slow {
    type Response = Bytes;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            Ok(Response::new(echo(request.get_ref())))
        })
    }
}

/// The request's trailers, sent back as the response's.
async fn trailers_back(
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<tonic::body::Body> {
    use http_body_util::BodyExt;
    let collected = request.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let frames = [
        Ok::<_, Infallible>(hyper::body::Frame::data(collected.to_bytes())),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    http::Response::new(tonic::body::Body::new(http_body_util::StreamBody::new(
        futures_util::stream::iter(frames),
    )))
}

/// The running gRPC upstream.
#[derive(Clone)]
pub struct GrpcUpstream {
    pub addr: SocketAddr,
    calls: Arc<AtomicUsize>,
}

impl GrpcUpstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Calls that reached the upstream.
    pub fn call_count(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub async fn start() -> GrpcUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = GrpcUpstream {
            addr: listener.local_addr().unwrap(),
            calls: Arc::new(AtomicUsize::new(0)),
        };
        let calls = upstream.calls.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let calls = calls.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            calls.fetch_add(1, Ordering::SeqCst);
                            async move {
                                let mut grpc = tonic::server::Grpc::new(RawCodec);
                                let response = match request.uri().path() {
                                    "/test.Echo/Unary" => grpc.unary(Unary, request).await,
                                    "/test.Echo/Bidi" => grpc.streaming(Bidi, request).await,
                                    "/test.Echo/Join" => grpc.client_streaming(Join, request).await,
                                    "/test.Echo/Count" => {
                                        grpc.server_streaming(Count, request).await
                                    }
                                    "/test.Echo/Fail" => grpc.unary(Fail, request).await,
                                    "/test.Echo/Slow" => grpc.unary(Slow, request).await,
                                    "/trailers" => return Ok(trailers_back(request).await),
                                    _ => Status::unimplemented("no such method").into_http(),
                                };
                                Ok::<_, Infallible>(response)
                            }
                        });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .http2_only()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        upstream
    }
}

/// A gRPC client over a hyper HTTP/2 connection pool (h2c, or TLS with ALPN h2 when the
/// connector says so).
pub type GrpcClient<C> = tonic::client::Grpc<Client<C, tonic::body::Body>>;

/// A gRPC client to `origin` (`http://…` or `https://…`) through `connector`.
pub fn grpc_client<C>(connector: C, origin: &str) -> GrpcClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    tonic::client::Grpc::with_origin(client, origin.parse().unwrap())
}

/// A plain-text (h2c) gRPC client to `addr`.
pub fn h2c_grpc_client(addr: SocketAddr) -> GrpcClient<HttpConnector> {
    grpc_client(HttpConnector::new(), &format!("http://{addr}"))
}

pub fn method(name: &str) -> PathAndQuery {
    PathAndQuery::try_from(format!("/test.Echo/{name}")).unwrap()
}

/// One unary call with `metadata` (e.g. the caller's identity).
pub async fn unary<C>(
    client: &mut GrpcClient<C>,
    name: &str,
    message: &'static [u8],
    metadata: &[(&'static str, &'static str)],
) -> Result<Response<Bytes>, Status>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = Request::new(Bytes::from_static(message));
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse().unwrap());
    }
    client.unary(request, method(name), RawCodec).await
}
