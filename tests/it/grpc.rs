//! gRPC through the proxy, with a real gRPC client and a real gRPC upstream (tonic over hyper
//! HTTP/2, see support/grpc.rs): unary, server-streaming and bidi calls pass over h2c and over
//! TLS (ALPN h2), with the upstream's metadata, trailers and own errors intact; tollgate's own
//! answers (limited, store down, upstream unreachable or late) arrive as gRPC statuses.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::grpc::*;
use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::Connect;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tempfile::TempDir;
use tonic::Code;

/// In front of an HTTP/2 (h2c) upstream, which gRPC needs.
fn h2c_upstream(url: &str) -> Config {
    config().upstream(url).http2()
}

/// `config` with a route limiting each `x-user` to `limit` calls a day.
fn limited(config: Config, limit: u64) -> Config {
    config.identity("user", [source::header("x-user")]).route(
        route("api")
            .prefix("/test.Echo/")
            .key("user")
            .limit(limit::fixed_window(limit, "24h")),
    )
}

fn metadata<'a>(status: &'a tonic::Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key).map(|v| v.to_str().unwrap())
}

/// Unary, client streaming, server streaming, bidi (one message at a time, each answered before the next is
/// sent) and the upstream's own error, through `client`.
async fn calls_pass_through<C>(client: &mut GrpcClient<C>)
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let response = unary(client, "Unary", b"hello", &[("x-user", "ann")])
        .await
        .expect("unary call");
    assert_eq!(response.get_ref(), &Bytes::from_static(b"echo:hello"));
    assert_eq!(response.metadata().get("x-upstream").unwrap(), "yes");
    assert_eq!(
        response.metadata().get("x-upstream-te").unwrap(),
        "trailers"
    );

    client.ready().await.unwrap();
    let words = futures_util::stream::iter(["a", "b", "c"].map(Bytes::from));
    let joined = client
        .client_streaming(tonic::Request::new(words), method("Join"), RawCodec)
        .await
        .expect("client streaming call");
    assert_eq!(joined.get_ref(), &Bytes::from_static(b"a,b,c"));

    client.ready().await.unwrap();
    let mut numbers = client
        .server_streaming(
            tonic::Request::new(Bytes::from_static(b"5")),
            method("Count"),
            RawCodec,
        )
        .await
        .expect("server streaming call")
        .into_inner();
    let mut got = Vec::new();
    while let Some(number) = numbers.message().await.expect("a message") {
        got.push(String::from_utf8(number.to_vec()).unwrap());
    }
    assert_eq!(got, ["0", "1", "2", "3", "4"]);

    // Bidi: the next message is sent only once the answer to the last has come back, so
    // nothing in between may wait for the end of either stream.
    let (tx, outgoing) = channel_stream();
    client.ready().await.unwrap();
    let mut replies = client
        .streaming(tonic::Request::new(outgoing), method("Bidi"), RawCodec)
        .await
        .expect("bidi call")
        .into_inner();
    for word in ["one", "two", "three"] {
        tx.send(Bytes::from(word)).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .expect("each reply arrives before the next message is sent")
            .expect("a message")
            .expect("not the end");
        assert_eq!(reply, Bytes::from(format!("echo:{word}")));
    }
    drop(tx);
    assert!(replies.message().await.expect("a clean end").is_none());
    // grpc-status 0 arrived in the upstream's trailers.
    assert!(replies.trailers().await.unwrap().is_some());

    let error = unary(client, "Fail", b"x", &[]).await.unwrap_err();
    assert_eq!(error.code(), Code::NotFound, "{error:?}");
    assert_eq!(error.message(), "no such thing");
}

/// A sender and the stream of what it sends.
fn channel_stream() -> (
    tokio::sync::mpsc::Sender<Bytes>,
    impl futures_util::Stream<Item = Bytes> + Send + 'static,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    (
        tx,
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)),
    )
}

#[tokio::test]
async fn unary_and_streaming_calls_pass_over_h2c() {
    let up = GrpcUpstream::start().await;
    let proxy = proxy(limited(h2c_upstream(&up.url()), 100)).start().await;
    calls_pass_through(&mut h2c_grpc_client(proxy.addr)).await;
    // Not limited, and not a route: passes the same way.
    let open = proxy_without_routes(&up).await;
    calls_pass_through(&mut h2c_grpc_client(open.addr)).await;
}

async fn proxy_without_routes(up: &GrpcUpstream) -> ProxyHandle {
    proxy(h2c_upstream(&up.url())).start().await
}

#[tokio::test]
async fn unary_and_streaming_calls_pass_over_tls() {
    let up = GrpcUpstream::start().await;
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = TempDir::new().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    let proxy = proxy(limited(tls_config(&up.url(), &cert, &key), 100))
        .start()
        .await;

    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(trusting(certified.cert.der().clone()))
        .https_only()
        .enable_http2()
        .build();
    let mut client = grpc_client(
        connector,
        &format!("https://localhost:{}", proxy.addr.port()),
    );
    calls_pass_through(&mut client).await;

    // Limited over TLS as over h2c.
    let limited_proxy = proxy_tls_limited(&up, &cert, &key).await;
    let mut client = grpc_client(
        HttpsConnectorBuilder::new()
            .with_tls_config(trusting(certified.cert.der().clone()))
            .https_only()
            .enable_http2()
            .build(),
        &format!("https://localhost:{}", limited_proxy.addr.port()),
    );
    unary(&mut client, "Unary", b"1", &[("x-user", "tls")])
        .await
        .expect("within the limit");
    let error = unary(&mut client, "Unary", b"2", &[("x-user", "tls")])
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
}

async fn proxy_tls_limited(up: &GrpcUpstream, cert: &Path, key: &Path) -> ProxyHandle {
    proxy(limited(tls_config(&up.url(), cert, key), 1))
        .start()
        .await
}

/// A TLS listener in front of an HTTP/2 upstream.
fn tls_config(upstream_url: &str, cert: &Path, key: &Path) -> Config {
    h2c_upstream(upstream_url).listen_tls(
        "127.0.0.1:0",
        &cert.display().to_string(),
        &key.display().to_string(),
    )
}

/// A client config trusting only `cert`; the connector offers ALPN h2.
fn trusting(cert: CertificateDer<'static>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[tokio::test]
async fn a_limited_call_fails_with_resource_exhausted_and_pushback() {
    let up = GrpcUpstream::start().await;
    let proxy = proxy(limited(h2c_upstream(&up.url()), 2)).start().await;
    let mut client = h2c_grpc_client(proxy.addr);
    for _ in 0..2 {
        unary(&mut client, "Unary", b"hi", &[("x-user", "bob")])
            .await
            .expect("within the limit");
    }
    let error = unary(&mut client, "Unary", b"hi", &[("x-user", "bob")])
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
    let retry_after: u64 = metadata(&error, "retry-after").unwrap().parse().unwrap();
    assert!(retry_after > 0 && retry_after <= 86_400, "{retry_after}");
    assert_eq!(
        error.message(),
        format!("Too many requests for route `api`; retry after {retry_after} second(s).")
    );
    assert_eq!(
        metadata(&error, "grpc-retry-pushback-ms"),
        Some(retry_after * 1000).map(|ms| ms.to_string()).as_deref()
    );
    assert_eq!(
        metadata(&error, "ratelimit"),
        Some(format!("\"api\";r=0;t={retry_after}").as_str())
    );
    assert_eq!(
        metadata(&error, "ratelimit-policy"),
        Some("\"api\";q=2;w=86400")
    );

    // A streaming call is refused the same way, before any message.
    client.ready().await.unwrap();
    let (_tx, outgoing) = channel_stream();
    let mut request = tonic::Request::new(outgoing);
    request
        .metadata_mut()
        .insert("x-user", "bob".parse().unwrap());
    let error = client
        .streaming(request, method("Bidi"), RawCodec)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::ResourceExhausted, "{error:?}");
    assert!(metadata(&error, "grpc-retry-pushback-ms").is_some());

    // Neither refused call reached the upstream; another caller still passes.
    assert_eq!(up.call_count(), 2);
    unary(&mut client, "Unary", b"hi", &[("x-user", "eve")])
        .await
        .expect("another caller");
}

/// What goes on the wire: one HEADERS frame ending the stream (HTTP 200, no body), and only
/// for gRPC requests: anything else limited still gets the HTTP 429.
#[tokio::test]
async fn the_refusal_is_trailers_only_and_only_for_grpc() {
    let up = GrpcUpstream::start().await;
    let proxy = proxy(limited(h2c_upstream(&up.url()), 1)).start().await;
    let client = h2c_client();
    let call = |content_type: &'static str| {
        Request::post(proxy.url("/test.Echo/Unary"))
            .header("content-type", content_type)
            .header("te", "trailers")
            .header("x-user", "dan")
            .body(body(Bytes::new()))
            .unwrap()
    };
    // The one call allowed (the upstream's answer to an empty call does not matter).
    client.request(call("application/grpc")).await.unwrap();
    let response = client
        .request(call("application/grpc+proto"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert_eq!(response.headers()["grpc-status"], "8");
    assert!(response.headers().contains_key("grpc-message"));
    let collected = response.into_body().collect().await.unwrap();
    assert!(collected.trailers().is_none());
    assert!(collected.to_bytes().is_empty());

    let response = client.request(call("application/json")).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test]
async fn store_down_with_on_error_deny_is_unavailable() {
    let mut redis = RedisServer::start();
    let up = GrpcUpstream::start().await;
    let store = store::redis(&redis.url()).timeout("100ms").on_error("deny");
    let proxy = proxy(limited(h2c_upstream(&up.url()), 100).store(store))
        .start()
        .await;
    let mut client = h2c_grpc_client(proxy.addr);
    proxy.wait_store().await;
    unary(&mut client, "Unary", b"up", &[("x-user", "cat")])
        .await
        .expect("the store answers");

    redis.stop();
    let error = unary(&mut client, "Unary", b"down", &[("x-user", "cat")])
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(
        error.message(),
        "503 Service Unavailable: rate limiting is unavailable, try again shortly"
    );
    assert_eq!(metadata(&error, "grpc-retry-pushback-ms"), Some("1000"));
    assert_eq!(up.call_count(), 1);
}

#[tokio::test]
async fn an_upstream_that_cannot_serve_gives_the_mapped_status() {
    // Nothing listens on a port just freed: unreachable → UNAVAILABLE.
    let port = free_port();
    let unreachable = proxy(h2c_upstream(&format!("http://127.0.0.1:{port}")))
        .start()
        .await;
    let error = unary(&mut h2c_grpc_client(unreachable.addr), "Unary", b"x", &[])
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(
        error.message(),
        "502 Bad Gateway: the upstream is unreachable"
    );

    // No response head within the timeout → DEADLINE_EXCEEDED.
    let up = GrpcUpstream::start().await;
    let proxy = proxy(h2c_upstream(&up.url()).upstream_timeout("300ms"))
        .start()
        .await;
    let mut client = h2c_grpc_client(proxy.addr);
    let error = unary(&mut client, "Slow", b"x", &[]).await.unwrap_err();
    assert_eq!(error.code(), Code::DeadlineExceeded, "{error:?}");
    assert_eq!(
        error.message(),
        "504 Gateway Timeout: the upstream did not answer in time"
    );
    // The proxy's own answers are the only ones translated: the upstream's pass as sent.
    let error = unary(&mut client, "Fail", b"x", &[]).await.unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
}

/// Trailers travel both ways through the proxy, not only the upstream's `grpc-status`.
#[tokio::test]
async fn request_and_response_trailers_pass_both_ways() {
    let up = GrpcUpstream::start().await;
    let proxy = proxy_without_routes(&up).await;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", "abc123".parse().unwrap());
    let frames = [
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from_static(b"payload"))),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    let request = Request::post(proxy.url("/trailers"))
        .header("te", "trailers")
        .body(
            http_body_util::StreamBody::new(futures_util::stream::iter(frames))
                .map_err(|e| match e {})
                .boxed(),
        )
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-checksum"], "abc123");
    assert_eq!(collected.to_bytes(), Bytes::from_static(b"payload"));
}
