//! The upstream connection pool as the upstream sees it: a keep-alive connection carries one
//! request after another; an idle one is closed after `upstream.pool_idle_timeout` even with
//! no traffic; an upstream that closes its idle connections costs no client an error.

use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get_ok(url: &str) -> Bytes {
    let response = http1_client().request(get(url)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{url}");
    bytes(response).await
}

async fn bytes(response: http::Response<hyper::body::Incoming>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection() {
    let up = upstream().start().await;
    let p = proxy(config().upstream(&up.url()).workers(1)).start().await;
    let client = http1_client();
    for i in 0..20 {
        let response = client
            .request(get(&p.url(&format!("/download?size={}", 100 + i))))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(bytes(response).await, pattern(100 + i));
    }
    assert_eq!(up.request_count(), 20);
    assert_eq!(
        up.accepted_count(),
        1,
        "every request after the first reused it"
    );
}

#[tokio::test]
async fn concurrent_requests_each_get_a_connection_and_all_are_reused_after() {
    let up = upstream().start().await;
    let p = proxy(config().upstream(&up.url()).workers(1)).start().await;
    for _ in 0..3 {
        let mut calls = Vec::new();
        for _ in 0..10 {
            let url = p.url("/download?size=5000");
            calls.push(tokio::spawn(async move { get_ok(&url).await }));
        }
        for call in calls {
            assert_eq!(call.await.unwrap(), pattern(5000));
        }
    }
    assert_eq!(up.request_count(), 30);
    assert!(
        up.accepted_count() <= 10,
        "at most one connection per concurrent request: {}",
        up.accepted_count()
    );
}

#[tokio::test]
async fn idle_upstream_connections_close_after_the_pool_idle_timeout() {
    let up = upstream().start().await;
    let p = proxy(
        config()
            .upstream(&up.url())
            .pool_idle_timeout("300ms")
            .workers(1),
    )
    .start()
    .await;
    get_ok(&p.url("/download?size=10")).await;
    get_ok(&p.url("/download?size=10")).await;
    assert_eq!(up.accepted_count(), 1);
    // No traffic: the pool itself closes it (the upstream here never would).
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.open_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle upstream connection is still open after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The next request opens a new one.
    get_ok(&p.url("/download?size=10")).await;
    assert_eq!(up.accepted_count(), 2);
}

/// An HTTP/1.1 upstream that answers one request per connection, keep-alive implied, then
/// closes the connection after `linger` without saying so (as an upstream's own idle timeout
/// does).
async fn closing_upstream(linger: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(linger).await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_upstream_that_closes_idle_connections_costs_no_request_an_error() {
    for linger in [Duration::ZERO, Duration::from_millis(20)] {
        let up = closing_upstream(linger).await;
        let p = proxy(config().upstream(&up).workers(1)).start().await;
        let client = http1_client();
        for i in 0..40 {
            let response = client.request(get(&p.url("/"))).await.unwrap();
            let status = response.status();
            let body = text(response).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, "ok"),
                "request {i} (upstream closes {linger:?} after answering)"
            );
            // Half the time the next request comes while the close is under way.
            if i % 2 == 0 {
                tokio::time::sleep(linger * 2).await;
            }
        }
    }
}

/// An upstream that answers each request as soon as its head is in, without reading the body,
/// and closes at once: the unread upload makes its kernel reset the connection.
async fn refusing_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large")
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// Sends a POST with a `len`-byte body and then a GET on one connection of its own (the
/// writing in a task that ignores errors, as a client whose answer came early does, and never
/// half-closes: a client that shuts its side down is taken to have left), and returns all it
/// reads until the connection closes or both requests are answered.
async fn early_answer_to_upload(addr: std::net::SocketAddr, len: usize) -> String {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let writing = tokio::spawn(async move {
        let head = format!("POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
        let chunk = vec![b'a'; 64 * 1024];
        let mut left = len;
        let mut written = writer.write_all(head.as_bytes()).await;
        while left > 0 && written.is_ok() {
            let n = left.min(chunk.len());
            written = writer.write_all(&chunk[..n]).await;
            left -= n;
        }
        if written.is_ok() {
            let _ = writer
                .write_all(b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")
                .await;
        }
        // Dropping the write half would shut it down.
        std::future::pending::<()>().await;
        drop(writer);
    });
    let mut answers = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answers.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&answers)
                .matches("too large")
                .count()
                == 2
            {
                break;
            }
        }
    })
    .await;
    writing.abort();
    assert!(
        read.is_ok(),
        "neither answered nor closed within 10 s: {}",
        String::from_utf8_lossy(&answers)
    );
    String::from_utf8_lossy(&answers).into_owned()
}

#[tokio::test]
async fn an_upstream_that_refuses_an_upload_early_is_answered_not_a_502() {
    let up = refusing_upstream().await;
    let p = proxy(config().upstream(&up).workers(1)).start().await;
    const ANSWER: &str = "HTTP/1.1 413 Payload Too Large\r\n";
    for i in 0..60 {
        let answers = early_answer_to_upload(p.addr, 4 << 20).await;
        // The upstream's answer, whole; then the connection either closed (the rest of the
        // upload was not read) or went on in step and answered the GET after the upload.
        assert!(
            answers.starts_with(ANSWER) && answers.contains("\r\n\r\ntoo large"),
            "upload {i}: {answers}"
        );
        let rest = &answers[answers.find("too large").unwrap() + "too large".len()..];
        assert!(
            rest.is_empty() || (rest.starts_with(ANSWER) && rest.ends_with("\r\n\r\ntoo large")),
            "upload {i}: after the answer: {rest}"
        );
    }
}
