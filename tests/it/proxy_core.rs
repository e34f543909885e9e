//! The core proxy end to end: real upstream, real tollgate (in-process), real clients.

use std::time::{Duration, Instant};

use crate::support::*;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::BodyExt;

async fn echo_json(response: http::Response<hyper::body::Incoming>) -> serde_json::Value {
    serde_json::from_str(&text(response).await).unwrap()
}

#[tokio::test]
async fn multi_megabyte_upload_and_download_arrive_byte_for_byte() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let client = http1_client();

    let payload = pattern(5 * 1024 * 1024 + 17);
    let request = Request::post(proxy.url("/upload"))
        .body(body(payload.clone()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        text(response).await,
        format!("{} {}", payload.len(), sha256_hex(&payload))
    );

    let size = 8 * 1024 * 1024 + 3;
    let response = client
        .request(get(&proxy.url(&format!("/download?size={size}"))))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes.len(), size);
    assert_eq!(sha256_hex(&bytes), sha256_hex(&pattern(size)));
}

#[tokio::test]
async fn chunked_upload_is_forwarded_intact() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let chunks: Vec<
        Result<hyper::body::Frame<bytes::Bytes>, Box<dyn std::error::Error + Send + Sync>>,
    > = (0..64)
        .map(|i| {
            Ok(hyper::body::Frame::data(bytes::Bytes::from(vec![
                i as u8;
                10_000
            ])))
        })
        .collect();
    let streamed = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let request = Request::post(proxy.url("/upload"))
        .body(BodyExt::boxed(streamed))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let expected: Vec<u8> = (0..64).flat_map(|i| vec![i as u8; 10_000]).collect();
    assert_eq!(
        text(response).await,
        format!("{} {}", expected.len(), sha256_hex(&expected))
    );
}

#[tokio::test]
async fn request_headers_are_rewritten_and_hop_by_hop_removed() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let request = Request::get(proxy.url("/echo?q=1"))
        .header("host", "public.example")
        .header("connection", "keep-alive, x-drop-me")
        .header("x-drop-me", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("te", "gzip")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-keep", "a")
        .header("x-keep", "b")
        .body(body(""))
        .unwrap();
    let echo = echo_json(http1_client().request(request).await.unwrap()).await;
    let headers = &echo["headers"];
    assert_eq!(echo["uri"], "/echo?q=1");
    assert_eq!(headers["host"][0], "public.example");
    assert_eq!(headers["x-forwarded-for"][0], "203.0.113.7, 127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"][0], "http");
    assert_eq!(headers["x-forwarded-host"][0], "public.example");
    assert_eq!(headers["x-keep"], serde_json::json!(["a", "b"]));
    for gone in ["x-drop-me", "keep-alive", "proxy-authorization", "te"] {
        assert!(
            headers.get(gone).is_none(),
            "{gone} reached the upstream: {headers}"
        );
    }
}

#[tokio::test]
async fn host_upstream_mode_sends_the_upstream_authority() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).upstream_host("upstream"))
        .start()
        .await;
    let request = Request::get(proxy.url("/echo"))
        .header("host", "public.example")
        .body(body(""))
        .unwrap();
    let echo = echo_json(http1_client().request(request).await.unwrap()).await;
    assert_eq!(echo["headers"]["host"][0], up.addr.to_string());
    assert_eq!(echo["headers"]["x-forwarded-host"][0], "public.example");
}

#[tokio::test]
async fn response_hop_by_hop_removed_and_set_cookie_kept() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let response = http1_client()
        .request(get(&proxy.url("/hop")))
        .await
        .unwrap();
    let h = response.headers();
    let cookies: Vec<_> = h
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies, ["a=1; Path=/", "b=2; Path=/"]);
    assert_eq!(h["x-app"], "yes");
    assert!(h.get("x-internal").is_none());
    assert!(h.get("proxy-authenticate").is_none());
    assert!(h.get("keep-alive").is_none());
    assert_eq!(text(response).await, "hop");
}

#[tokio::test]
async fn streamed_response_first_chunk_arrives_before_last_is_produced() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let response = http1_client()
        .request(get(&proxy.url("/hold")))
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first chunk must arrive while the upstream holds the rest")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first,");
    up.release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
}

#[tokio::test]
async fn websocket_echo_through_the_proxy() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let (mut ws, response) = tokio_tungstenite::connect_async(format!("ws://{}/ws", proxy.addr))
        .await
        .expect("websocket handshake through the proxy");
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    for message in ["hello", "world"] {
        ws.send(tokio_tungstenite::tungstenite::Message::text(message))
            .await
            .unwrap();
        let echoed = ws.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), message);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn h2c_client_is_served_and_forwarded_as_http11() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let request = Request::get(proxy.url("/echo"))
        .version(http::Version::HTTP_2)
        .body(body(""))
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let echo = echo_json(response).await;
    assert_eq!(echo["version"], "HTTP/1.1");
    assert_eq!(echo["headers"]["host"][0], proxy.addr.to_string());
}

#[tokio::test]
async fn http2_upstream_carries_trailers_end_to_end() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).http2()).start().await;
    let request = Request::post(proxy.url("/trailers"))
        .version(http::Version::HTTP_2)
        .header("te", "trailers")
        .body(body("x"))
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers forwarded");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(collected.to_bytes(), "payload");

    let echo = echo_json(
        h2c_client()
            .request(
                Request::get(proxy.url("/echo"))
                    .version(http::Version::HTTP_2)
                    .body(body(""))
                    .unwrap(),
            )
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(echo["version"], "HTTP/2.0");
}

#[tokio::test]
async fn unreachable_upstream_is_502_with_a_short_body() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = proxy(config().upstream(&format!("http://127.0.0.1:{port}")))
        .start()
        .await;
    let response = http1_client().request(get(&proxy.url("/"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        text(response).await,
        r#"{"detail":"the upstream is unreachable","status":502,"title":"Bad Gateway","type":"about:blank"}"#
    );
    // A client that asks for text, and for no JSON, reads the same answer as one line.
    let mut request = get(&proxy.url("/"));
    request
        .headers_mut()
        .insert("accept", "text/plain".parse().unwrap());
    let response = http1_client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; charset=utf-8"
    );
    assert_eq!(
        text(response).await,
        "502 Bad Gateway: the upstream is unreachable\n"
    );
}

#[tokio::test]
async fn slow_upstream_is_504_after_the_timeout() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).upstream_timeout("300ms"))
        .start()
        .await;
    let started = Instant::now();
    let response = http1_client()
        .request(get(&proxy.url("/sleep?ms=5000")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        text(response).await,
        r#"{"detail":"the upstream did not answer in time","status":504,"title":"Gateway Timeout","type":"about:blank"}"#
    );
    // The proxy serves on.
    let response = http1_client()
        .request(get(&proxy.url("/echo")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn oversized_bodies_get_413_declared_or_chunked() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).max_request_body("1KiB"))
        .start()
        .await;
    let client = http1_client();
    let response = client
        .request(
            Request::post(proxy.url("/upload"))
                .body(body(vec![0u8; 2048]))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        up.request_count(),
        0,
        "a declared oversized body never reaches the upstream"
    );

    let chunks: Vec<
        Result<hyper::body::Frame<bytes::Bytes>, Box<dyn std::error::Error + Send + Sync>>,
    > = (0..8)
        .map(|_| Ok(hyper::body::Frame::data(bytes::Bytes::from(vec![1u8; 512]))))
        .collect();
    let streamed = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let response = client
        .request(
            Request::post(proxy.url("/upload"))
                .body(BodyExt::boxed(streamed))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let response = client
        .request(
            Request::post(proxy.url("/upload"))
                .body(body(vec![0u8; 1024]))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "exactly the limit passes"
    );
}

#[tokio::test]
async fn oversized_request_head_is_431_and_the_proxy_serves_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let big = "a".repeat(100 * 1024);
    let head = format!("GET / HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nbroken header\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 400"));

    let response = http1_client()
        .request(get(&proxy.url("/echo")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn graceful_shutdown_lets_the_in_flight_request_finish() {
    let up = upstream().start().await;
    let mut proxy = proxy(
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .shutdown_timeout("10s"),
    )
    .start()
    .await;
    let admin = proxy.admin.unwrap();
    let ready = http1_client()
        .request(get(&format!("http://{admin}/readyz")))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    // The app answers once released: the request is in flight for as long as the test needs.
    let url = proxy.url("/sleep?release=1");
    let in_flight = tokio::spawn(async move { http1_client().request(get(&url)).await });
    eventually("the request reaches the app", PATIENCE, async || {
        let seen = up.request_count();
        until(seen == 1, seen)
    })
    .await;
    proxy.shutdown();

    // Draining: not ready, and the listener closed, while the request is still in flight.
    eventually("/readyz says draining", PATIENCE, async || {
        let ready = http1_client()
            .request(get(&format!("http://{admin}/readyz")))
            .await
            .unwrap();
        until(
            ready.status() == StatusCode::SERVICE_UNAVAILABLE,
            ready.status(),
        )
    })
    .await;
    eventually("the listener closed", PATIENCE, async || {
        let connected = tokio::net::TcpStream::connect(proxy.addr).await.is_ok();
        until(!connected, connected)
    })
    .await;
    assert!(!in_flight.is_finished(), "the request is still in flight");
    up.release.notify_one();
    let response = in_flight
        .await
        .unwrap()
        .expect("in-flight request completes");
    assert_eq!(response.status(), 200);
    assert_eq!(text(response).await, "slept");
    tokio::time::timeout(Duration::from_secs(5), proxy.task.take().unwrap())
        .await
        .expect("server exits after draining")
        .unwrap();
}

#[tokio::test]
async fn every_serving_thread_serves_limits_stay_exact_and_shutdown_closes_the_listener() {
    // Four serving threads, each accepting on the one listener: 200 requests on 200 fresh
    // connections are spread over them. Every one is answered byte for byte, a limit of 50
    // (memory store, shared by the threads) admits exactly 50 of them, and after shutdown the
    // port refuses connections (no thread kept a copy of the listener).
    let up = upstream().start().await;
    let mut proxy = proxy(
        config().upstream(&up.url()).workers(4).route(
            route("downloads")
                .prefix("/download")
                .key("global")
                .limit(limit::fixed_window(50, "1h")),
        ),
    )
    .start()
    .await;
    let calls = (0..200).map(|i| {
        let url = proxy.url(&format!("/download?size={}", 10 + i % 7));
        async move {
            // A client of its own: a connection of its own.
            let response = http1_client().request(get(&url)).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (i, status, bytes)
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut admitted = 0;
    for (i, status, bytes) in answers {
        match status {
            StatusCode::OK => {
                admitted += 1;
                assert_eq!(bytes.to_vec(), pattern(10 + i % 7), "request {i}");
            }
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("request {i}: unexpected {other}"),
        }
    }
    assert_eq!(admitted, 50);

    let addr = proxy.addr;
    proxy.shutdown();
    proxy.task.take().unwrap().await.unwrap();
    // Closed: the port can be bound again. Another test's `127.0.0.1:0` listener may have been
    // handed the freed port meanwhile; then a request there must not reach this proxy's app.
    if std::net::TcpListener::bind(addr).is_err() {
        let before = up.request_count();
        let _ = tokio::time::timeout(
            PATIENCE,
            http1_client().request(get(&format!("http://{addr}/download?size=1"))),
        )
        .await;
        assert_eq!(
            up.request_count(),
            before,
            "the listener is closed after shutdown"
        );
    }
}
