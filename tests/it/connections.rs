//! Client connections as the wire sees them: keep-alive, pipelining, requests split across
//! writes, idle and slow connections, graceful shutdown and upgrades. An idle plain HTTP/1
//! connection is parked between requests (its hyper connection dropped, the unparsed bytes
//! kept): these tests speak raw HTTP/1.1 on one socket so that any byte lost, any response
//! out of order or any `Connection: close` added at a park shows.

use std::time::{Duration, Instant};

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous bound for one response on a quiet machine.
const WITHIN: Duration = Duration::from_secs(5);
/// How late past a configured timeout a busy machine may see it fire.
const MARGIN: Duration = Duration::from_secs(1);

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for RawResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"))
    }
}

/// A raw HTTP/1.1 client on one socket; `pending` holds bytes read past the last response.
struct Raw {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Raw {
    async fn connect(addr: std::net::SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    /// With a small receive buffer, so that a client that stops reading soon stops the
    /// proxy's writes too.
    async fn connect_small_window(addr: std::net::SocketAddr) -> Raw {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(16 * 1024).unwrap();
        Raw {
            stream: socket.connect(addr).await.unwrap(),
            pending: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    async fn fill(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        let n = tokio::time::timeout(WITHIN, self.stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no byte within {WITHIN:?}; have {:?}",
                    String::from_utf8_lossy(&self.pending)
                )
            })
            .unwrap();
        assert!(
            n > 0,
            "connection closed mid-response; have {:?}",
            String::from_utf8_lossy(&self.pending)
        );
        self.pending.extend_from_slice(&buf[..n]);
    }

    async fn take(&mut self, n: usize) -> Vec<u8> {
        while self.pending.len() < n {
            self.fill().await;
        }
        self.pending.drain(..n).collect()
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(at) = self.pending.windows(2).position(|w| w == b"\r\n") {
                let line = self.take(at + 2).await;
                return String::from_utf8(line[..at].to_vec()).unwrap();
            }
            self.fill().await;
        }
    }

    /// Reads one response (Content-Length, chunked or no body).
    async fn response(&mut self) -> RawResponse {
        let status_line = self.line().await;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = self.line().await;
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').expect("header line");
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
        let mut response = RawResponse {
            status,
            headers,
            body: Vec::new(),
        };
        if status == 101 || status == 204 || status == 304 {
            return response;
        }
        if let Some(length) = response.header("content-length") {
            let length: usize = length.parse().unwrap();
            response.body = self.take(length).await;
        } else if response
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            loop {
                let size = usize::from_str_radix(self.line().await.trim(), 16).unwrap();
                if size == 0 {
                    while !self.line().await.is_empty() {}
                    break;
                }
                let chunk = self.take(size + 2).await;
                response.body.extend_from_slice(&chunk[..size]);
            }
        }
        response
    }

    /// Waits for the proxy to close the connection; how long that took.
    async fn closed_within(&mut self, within: Duration) -> Duration {
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(within, self.stream.read(&mut buf)).await {
            Err(_) => panic!("connection still open after {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => started.elapsed(),
            Ok(Ok(n)) => panic!(
                "unexpected bytes on an idle connection: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
        }
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

fn assert_download(response: &RawResponse, size: usize) {
    assert_eq!(response.status, 200, "{response:?}");
    assert!(!response.says_close(), "keep-alive broken: {response:?}");
    assert_eq!(response.body.len(), size);
    assert!(
        response.body == pattern(size),
        "body differs for size {size}"
    );
}

#[tokio::test]
async fn many_sequential_requests_share_one_connection() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect(proxy.addr).await;
    for i in 0..60 {
        // Sizes from empty to several socket writes' worth.
        let size = (i * 7919) % 100_000;
        raw.send(&get(&format!("/download?size={size}"))).await;
        let response = raw.response().await;
        assert_download(&response, size);
        if i % 10 == 9 {
            // Long enough for the connection to be parked between requests.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(up.request_count(), 60);
    assert!(raw.pending.is_empty(), "bytes past the last response");
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_byte_for_byte() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect(proxy.addr).await;
    let upload = pattern(30_000);
    let mut all = get("/download?size=10");
    all.extend(post("/upload", &upload));
    all.extend(get("/download?size=70000"));
    raw.send(&all).await;
    assert_download(&raw.response().await, 10);
    let uploaded = raw.response().await;
    assert_eq!(uploaded.status, 200);
    assert!(!uploaded.says_close());
    assert_eq!(
        String::from_utf8(uploaded.body).unwrap(),
        format!("30000 {}", sha256_hex(&upload))
    );
    assert_download(&raw.response().await, 70_000);

    // And the connection still serves after the pipeline drained.
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.send(&get("/download?size=3")).await;
    assert_download(&raw.response().await, 3);
}

#[tokio::test]
async fn a_pipelined_request_split_across_writes_is_served_whole() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect(proxy.addr).await;
    // The first request and the start of the second in one write: the proxy reads the start of
    // the second while answering the first, then the connection goes idle with it unparsed.
    let second = get("/download?size=1234");
    let (head, tail) = second.split_at(17);
    let mut first = get("/download?size=5");
    first.extend_from_slice(head);
    raw.send(&first).await;
    assert_download(&raw.response().await, 5);
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.send(tail).await;
    assert_download(&raw.response().await, 1234);

    // The same with a pause inside a POST body.
    let body = pattern(5000);
    let request = post("/upload", &body);
    let (start, rest) = request.split_at(request.len() - 1000);
    raw.send(start).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.send(rest).await;
    let uploaded = raw.response().await;
    assert!(!uploaded.says_close());
    assert_eq!(
        String::from_utf8(uploaded.body).unwrap(),
        format!("5000 {}", sha256_hex(&body))
    );
    raw.send(&get("/download?size=9")).await;
    assert_download(&raw.response().await, 9);

    // A head split with a pause, alone: first on a parked connection, then on a new one.
    let request = get("/download?size=321");
    let (start, rest) = request.split_at(20);
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.send(start).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw.send(rest).await;
    assert_download(&raw.response().await, 321);
    let mut fresh = Raw::connect(proxy.addr).await;
    fresh.send(start).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    fresh.send(rest).await;
    assert_download(&fresh.response().await, 321);
}

#[tokio::test]
async fn a_client_that_reads_slowly_gets_every_byte_and_keeps_its_connection() {
    // The response outgrows the socket buffers while the client does not read: the proxy
    // must keep what it could not send yet, whatever it does with the idle connection.
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect_small_window(proxy.addr).await;
    for size in [4_000_000, 3_000_001] {
        raw.send(&get(&format!("/download?size={size}"))).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_download(&raw.response().await, size);
    }
    // The same when the client asked to close: the end of the response must still get out
    // before the connection is closed.
    raw.send(b"GET /download?size=4000000 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let last = raw.response().await;
    assert_eq!(last.status, 200);
    assert!(last.body == pattern(4_000_000), "truncated or altered body");
    raw.closed_within(WITHIN).await;
}

#[tokio::test]
async fn a_post_body_then_a_get_on_a_kept_alive_connection() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect(proxy.addr).await;
    for round in 0..3 {
        let body = pattern(200_000 + round);
        raw.send(&post("/upload", &body)).await;
        let uploaded = raw.response().await;
        assert_eq!(uploaded.status, 200);
        assert!(!uploaded.says_close(), "{uploaded:?}");
        assert_eq!(
            String::from_utf8(uploaded.body).unwrap(),
            format!("{} {}", body.len(), sha256_hex(&body))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        raw.send(&get("/download?size=4096")).await;
        assert_download(&raw.response().await, 4096);
    }
    // A chunked upload on the same connection.
    raw.send(b"POST /upload HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        .await;
    let uploaded = raw.response().await;
    assert_eq!(
        String::from_utf8(uploaded.body).unwrap(),
        format!("11 {}", sha256_hex(b"hello world"))
    );
    raw.send(&get("/download?size=1")).await;
    assert_download(&raw.response().await, 1);
}

#[tokio::test]
async fn a_request_refused_before_its_body_is_read_leaves_the_stream_in_step() {
    // 413 for a declared oversized body: the body is never forwarded. Whatever the proxy does
    // with the connection afterwards, the body's bytes must never be read as a request.
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).max_request_body(100u64))
        .start()
        .await;
    let mut raw = Raw::connect(proxy.addr).await;
    let smuggled = get("/download?size=77");
    let mut body = smuggled.clone();
    body.resize(200, b' ');
    let request = post("/upload", &body);
    // The head alone first, so the answer comes before the body has arrived.
    let head_len = request.len() - body.len();
    raw.send(&request[..head_len]).await;
    let refused = raw.response().await;
    assert_eq!(refused.status, 413);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = raw.stream.write_all(&request[head_len..]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = raw.stream.write_all(&get("/download?size=3")).await;
    // Either the next request is answered, or the connection was closed: never the body's.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WITHIN, async {
        let mut buf = [0u8; 4096];
        loop {
            match raw.stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    rest.extend_from_slice(&buf[..n]);
                    if rest.windows(4).any(|w| w == b"\r\n\r\n") && rest.ends_with(&pattern(3)) {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert_eq!(
        up.request_count(),
        0,
        "the refused body reached the upstream"
    );
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 200"),
        "unexpected: {rest}"
    );
}

/// Sends `request` up to `sent` bytes, reads the answer, pauses, sends the rest and then a
/// real request; returns the answer and everything that came after it.
async fn upload_interrupted_by_the_answer(
    proxy: &ProxyHandle,
    request: &[u8],
    sent: usize,
) -> (RawResponse, String) {
    let mut raw = Raw::connect(proxy.addr).await;
    raw.send(&request[..sent]).await;
    let answer = raw.response().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = raw.stream.write_all(&request[sent..]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = raw.stream.write_all(&get("/download?size=3")).await;
    let mut rest = std::mem::take(&mut raw.pending);
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        let mut buf = [0u8; 4096];
        loop {
            match raw.stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (answer, String::from_utf8_lossy(&rest).to_ascii_lowercase())
}

#[tokio::test]
async fn an_answer_before_the_upload_ends_leaves_the_stream_in_step() {
    // The client sends part of a large upload, gets the answer, pauses, then sends the rest
    // (which spells requests): the rest must never be served as requests. Either the next
    // real request is answered, or the connection is closed.
    let up = upstream().start().await;
    let http1_upstream = proxy(config().upstream(&up.url())).start().await;
    // An HTTP/2 upstream takes no more of an upload than its flow-control window: the proxy
    // then holds the rest of what it read while the answer goes back.
    let http2_upstream = proxy(config().upstream(&up.url()).http2()).start().await;
    let smuggled = get("/download?size=77");
    let body: Vec<u8> = smuggled
        .iter()
        .copied()
        .cycle()
        .take(smuggled.len() * 2000)
        .collect();
    // /download answers without reading the body; /early reads it slowly for 150 ms after
    // answering (while the client pauses), then drops it.
    for (proxy, upstream_version) in [(&http1_upstream, "HTTP/1.1"), (&http2_upstream, "HTTP/2")] {
        for (path, answer_body) in [
            ("/download?size=5", pattern(5)),
            ("/early?ms=150", b"early".to_vec()),
        ] {
            let request = post(path, &body);
            let head_len = request.len() - body.len();
            for sent in [head_len + 1000, request.len() - 1000] {
                let (answer, rest) = upload_interrupted_by_the_answer(proxy, &request, sent).await;
                let case = format!("{path}, {sent} bytes first, {upstream_version} upstream");
                assert_eq!(answer.status, 200, "{case}");
                assert_eq!(answer.body, answer_body, "{case}");
                assert!(
                    !rest.contains("content-length: 77"),
                    "{case}: the body was served as a request: {rest}"
                );
                assert!(
                    !rest.contains(" 400 "),
                    "{case}: the body was parsed as a request: {rest}"
                );
                assert!(
                    rest.is_empty()
                        || (rest.starts_with("http/1.1 200")
                            && rest.matches("http/1.1").count() == 1),
                    "{case}: unexpected: {rest}"
                );
            }
        }
    }
}

#[tokio::test]
async fn parked_connections_close_after_the_idle_timeout_or_a_stalled_head_after_the_head_timeout()
{
    let up = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&up.url())
            .idle_timeout("1s")
            .header_read_timeout("3s"),
    )
    .start()
    .await;
    // Idle after a request: closed after idle_timeout.
    let mut raw = Raw::connect(proxy.addr).await;
    raw.send(&get("/download?size=2")).await;
    assert_download(&raw.response().await, 2);
    let closed = raw.closed_within(Duration::from_secs(3)).await;
    // timeout under test: idle_timeout 1s (not before it; after it, well before the 3 s head
    // timeout).
    assert!(
        closed >= Duration::from_millis(900) && closed <= Duration::from_secs(1) + MARGIN,
        "closed after {closed:?}"
    );

    // Traffic keeps a connection: three requests 600 ms apart outlive the 1 s timeout.
    let mut raw = Raw::connect(proxy.addr).await;
    for _ in 0..3 {
        raw.send(&get("/download?size=2")).await;
        assert_download(&raw.response().await, 2);
        tokio::time::sleep(Duration::from_millis(600)).await;
    }

    // Idle with part of the next head already read: closed after header_read_timeout.
    let mut raw = Raw::connect(proxy.addr).await;
    let mut bytes = get("/download?size=2");
    bytes.extend_from_slice(b"GET /download?size=3 HTTP/1.1\r\nHo");
    raw.send(&bytes).await;
    assert_download(&raw.response().await, 2);
    let closed = raw.closed_within(Duration::from_secs(6)).await;
    // timeout under test: header_read_timeout 3s.
    assert!(
        closed >= Duration::from_millis(2800) && closed <= Duration::from_secs(3) + MARGIN,
        "closed after {closed:?}"
    );
}

#[tokio::test]
async fn graceful_shutdown_closes_parked_connections_and_finishes_busy_ones() {
    let up = upstream().start().await;
    let mut proxy = proxy(config().upstream(&up.url()).shutdown_timeout("10s"))
        .start()
        .await;
    let mut parked = Raw::connect(proxy.addr).await;
    parked.send(&get("/download?size=8")).await;
    assert_download(&parked.response().await, 8);
    let mut busy = Raw::connect(proxy.addr).await;
    busy.send(&get("/download?size=8")).await;
    assert_download(&busy.response().await, 8);
    // The upstream holds the busy request 3 s: the parked connection must be closed while it
    // is still in flight, not when the drain ends.
    busy.send(&get("/sleep?ms=3000")).await;
    eventually(
        "the busy request reaches the upstream",
        PATIENCE,
        async || {
            let count = up.request_count();
            until(count == 3, count)
        },
    )
    .await;

    proxy.shutdown();
    let response = {
        let mut answer = std::pin::pin!(busy.response());
        tokio::select! {
            _ = parked.closed_within(WITHIN) => {}
            response = &mut answer => {
                panic!("the parked connection was open when the busy one was answered: {response:?}")
            }
        }
        answer.await
    };
    assert_eq!(response.status, 200);
    assert_eq!(response.body, b"slept");
    assert!(
        response.says_close(),
        "a draining server closes after the request: {response:?}"
    );
    busy.closed_within(WITHIN).await;
    // timeout under test: shutdown_timeout 10s (the server exits once drained, before it).
    tokio::time::timeout(Duration::from_secs(9), proxy.task.take().unwrap())
        .await
        .expect("server exits after draining")
        .unwrap();
}

/// A masked client text frame (RFC 6455), payload under 126 bytes.
fn ws_client_frame(text: &str) -> Vec<u8> {
    let mask = [0x11u8, 0x22, 0x33, 0x44];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

#[tokio::test]
async fn a_websocket_frame_sent_with_the_upgrade_request_is_not_lost() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;
    let mut raw = Raw::connect(proxy.addr).await;
    // A keep-alive request first, so the upgrade happens on a connection that was parked.
    raw.send(&get("/download?size=4")).await;
    assert_download(&raw.response().await, 4);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut bytes = b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".to_vec();
    bytes.extend(ws_client_frame("early"));
    raw.send(&bytes).await;
    let switched = raw.response().await;
    assert_eq!(switched.status, 101, "{switched:?}");
    assert_eq!(
        switched.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    let echoed = raw.take(2 + 5).await;
    assert_eq!(echoed, b"\x81\x05early");
    raw.send(&ws_client_frame("later")).await;
    let echoed = raw.take(2 + 5).await;
    assert_eq!(echoed, b"\x81\x05later");
}

#[tokio::test]
async fn h2c_and_http1_are_told_apart_when_the_first_bytes_trickle_in() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url())).start().await;

    // The HTTP/2 preface in two writes, then an empty SETTINGS frame: the proxy answers with
    // its own SETTINGS frame, so it speaks HTTP/2.
    let mut raw = Raw::connect(proxy.addr).await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    raw.send(&preface[..10]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    raw.send(&preface[10..]).await;
    raw.send(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
    let frame_head = raw.take(9).await;
    assert_eq!(frame_head[3], 4, "not a SETTINGS frame: {frame_head:?}");

    // An HTTP/1 request whose first byte matches the preface's ("P"), then a pause.
    let mut raw = Raw::connect(proxy.addr).await;
    let request = post("/upload", b"abc");
    raw.send(&request[..1]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    raw.send(&request[1..]).await;
    let uploaded = raw.response().await;
    assert_eq!(
        String::from_utf8(uploaded.body).unwrap(),
        format!("3 {}", sha256_hex(b"abc"))
    );
}

/// A client that pauses briefly between requests is parked a few times, then kept (each park
/// it cut short doubled the next wait, here 20 → 40 → 80 → 160 → 320 ms against 250 ms
/// pauses); after a long quiet spell the next park comes early again: sooner than the grown
/// one, measured in the same run (so a busy machine, late for both, does not fail it).
#[tokio::test]
async fn a_client_that_pauses_briefly_is_kept_unparked_and_a_quiet_one_is_parked_early_again() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).admin("127.0.0.1:0"))
        .start()
        .await;
    let admin = proxy.admin.expect("admin listener");
    let mut raw = Raw::connect(proxy.addr).await;
    for _ in 0..6 {
        raw.send(&get("/download?size=3")).await;
        assert_download(&raw.response().await, 3);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    raw.send(&get("/download?size=4")).await;
    assert_download(&raw.response().await, 4);
    let answered = Instant::now();
    // Still parked once quiet for its (longer) wait.
    wait_for_gauges(admin, (1, 1)).await;
    let grown = answered.elapsed();
    // timeout under test: the park wait grown to 320 ms (a lower bound: a busy machine only
    // makes it later).
    assert!(
        grown >= Duration::from_millis(250),
        "parked {grown:?} after a response, though its pauses were 250 ms"
    );
    // Quiet for more than a second: the next park comes after 20 ms again, well before the
    // 320 ms the connection had grown to.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    raw.send(&get("/download?size=5")).await;
    assert_download(&raw.response().await, 5);
    let answered = Instant::now();
    wait_for_gauges(admin, (1, 1)).await;
    let parked_after = answered.elapsed();
    // Against the same run's baseline: the grown wait measured above.
    assert!(
        parked_after < grown,
        "parked {parked_after:?} after the response, not sooner than the grown wait ({grown:?})"
    );
}

/// `tollgate_client_connections` and `tollgate_client_connections_parked` from /metrics.
async fn connection_gauges(admin: std::net::SocketAddr) -> (u64, u64) {
    let response = http1_client()
        .request(crate::support::get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    let text = text(response).await;
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}")) as u64
    };
    (
        gauge("tollgate_client_connections"),
        gauge("tollgate_client_connections_parked"),
    )
}

/// Polls the gauges until they read `want` (parking waits for a short quiet spell first).
async fn wait_for_gauges(admin: std::net::SocketAddr, want: (u64, u64)) {
    eventually(&format!("gauges {want:?}"), PATIENCE, async || {
        let got = connection_gauges(admin).await;
        until(got == want, got)
    })
    .await;
}

/// Parking is visible in the metrics: an open connection with nothing to do holds no HTTP
/// state (parked), a request in progress unparks it, it is parked again once quiet, and both
/// gauges drop when it closes. A connection that kept its hyper connection between requests
/// would never count as parked after its first request.
#[tokio::test]
async fn metrics_show_idle_connections_parked_and_busy_ones_not() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).admin("127.0.0.1:0"))
        .start()
        .await;
    let admin = proxy.admin.expect("admin listener");
    assert_eq!(connection_gauges(admin).await, (0, 0));

    let mut raw = Raw::connect(proxy.addr).await;
    wait_for_gauges(admin, (1, 1)).await;

    // In progress: the upstream takes 500 ms to answer.
    raw.send(&get("/sleep?ms=500")).await;
    wait_for_gauges(admin, (1, 0)).await;
    let response = raw.response().await;
    assert_eq!(response.body, b"slept");
    wait_for_gauges(admin, (1, 1)).await;

    // And again on the same connection, after it was parked.
    raw.send(&get("/download?size=10")).await;
    assert_download(&raw.response().await, 10);
    wait_for_gauges(admin, (1, 1)).await;

    drop(raw);
    wait_for_gauges(admin, (0, 0)).await;
}
