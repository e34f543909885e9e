//! The request record covers the whole exchange (issue 39): the access-log line is written when
//! the response body ends, fails or is left by its client, with how it ended, the bytes sent,
//! the time to the body's end and how the request's settlement went; the request counts in
//! `tollgate_in_flight_requests` until then.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// tollgate serving `config` with JSON logs on stderr (piped), on free ports; returns once it
/// answers.
async fn start(config: Config) -> (Child, SocketAddr, SocketAddr, tempfile::TempDir) {
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let yaml = config
        .listen(&format!("127.0.0.1:{port}"))
        .admin(&format!("127.0.0.1:{admin}"))
        .yaml();
    let path = write_config(&dir, &yaml);
    let child = Command::new(TOLLGATE_BIN)
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (addr, admin): (SocketAddr, SocketAddr) = (
        format!("127.0.0.1:{port}").parse().unwrap(),
        format!("127.0.0.1:{admin}").parse().unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = format!("http://{admin}/readyz");
    while !matches!(http1_client().request(get(&ready)).await, Ok(r) if r.status() == StatusCode::OK)
    {
        assert!(Instant::now() < deadline, "tollgate did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, addr, admin, dir)
}

/// `tollgate_in_flight_requests` now.
async fn in_flight(admin: SocketAddr) -> f64 {
    let response = http1_client()
        .request(get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    let text = text(response).await;
    text.lines()
        .find_map(|l| l.strip_prefix("tollgate_in_flight_requests "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no in-flight gauge in\n{text}"))
}

/// Waits until no request is in flight: every record is written.
async fn all_written(admin: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while in_flight(admin).await != 0.0 {
        assert!(Instant::now() < deadline, "a request stayed in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The access-log lines in `stderr`, in the order they were written.
fn access_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["target"] == "tollgate::access")
        .map(|l| match l.get("fields") {
            Some(fields) => fields.clone(),
            None => l,
        })
        .collect()
}

/// The next data frame of `body`.
async fn next_data(body: &mut hyper::body::Incoming) -> bytes::Bytes {
    body.frame().await.unwrap().unwrap().into_data().unwrap()
}

/// A request as `user`, its whole body read: the status and the body's length.
async fn send(addr: SocketAddr, method: &str, path: &str) -> (StatusCode, usize) {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("x-user", "u1")
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.len())
}

#[tokio::test]
async fn the_access_log_line_covers_the_body_its_end_and_the_settlement() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("user", [source::header("x-user")])
        .routes([
            route("login")
                .prefix("/respond")
                .methods(["GET"])
                .key("user")
                .limit(limit::fixed_window(50, "1h").count_statuses([401])),
            route("llm")
                .prefix("/respond")
                .methods(["POST"])
                .key("user")
                .limit(
                    limit::token_bucket(100, "1h")
                        .burst(100)
                        .cost_from_response("X-Tokens-Used"),
                ),
            route("files").prefix("/"),
        ]);
    let (child, addr, admin, _dir) = start(config).await;

    // A whole body: its bytes; a limit that does not see the response owes no settlement.
    assert_eq!(
        send(addr, "GET", "/download?size=5000").await,
        (StatusCode::OK, 5000)
    );
    // count_statuses: a 200 gives the unit back, a 401 keeps it.
    assert_eq!(
        send(addr, "GET", "/respond?status=200").await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(addr, "GET", "/respond?status=401").await.0,
        StatusCode::UNAUTHORIZED
    );
    // cost_from_response: settled at the body's end; no report leaves the configured cost.
    assert_eq!(
        send(addr, "POST", "/respond?cost=3").await.0,
        StatusCode::OK
    );
    assert_eq!(send(addr, "POST", "/respond").await.0, StatusCode::OK);

    // A body that streams for a while: in flight until it ends, and its time counted.
    let response = http1_client()
        .request(get(&format!("http://{addr}/hold")))
        .await
        .unwrap();
    let mut streaming = response.into_body();
    let first = next_data(&mut streaming).await;
    assert_eq!(&first[..], b"first,");
    assert_eq!(
        in_flight(admin).await,
        1.0,
        "counted in flight while its body streams"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    up.release.notify_one();
    let rest = streaming.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"last");
    all_written(admin).await;

    // A client that leaves mid-body.
    let response = http1_client()
        .request(get(&format!("http://{addr}/hold")))
        .await
        .unwrap();
    let mut leaving = response.into_body();
    let first = next_data(&mut leaving).await;
    assert_eq!(&first[..], b"first,");
    drop(leaving);
    all_written(admin).await;
    up.release.notify_one();
    // A client that leaves before a cost report's body ends: settled once the body has been
    // read in the background, after the line.
    let request = Request::post(format!("http://{addr}/respond?cost=3&hold=1"))
        .header("x-user", "u1")
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let mut leaving = response.into_body();
    let first = next_data(&mut leaving).await;
    assert_eq!(&first[..], b"status 200");
    drop(leaving);
    all_written(admin).await;
    up.release.notify_one();

    let stderr = stop_for_stderr(child).await;
    let lines = access_lines(&stderr);
    let seen: Vec<(String, String, u64, String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["route"].as_str().unwrap_or("?").to_owned(),
                l["body"].as_str().unwrap_or("?").to_owned(),
                l["bytes"].as_u64().unwrap_or(u64::MAX),
                l["settlement"].as_str().unwrap_or("?").to_owned(),
                l["status"].to_string(),
            )
        })
        .collect();
    let row = |route: &str, body: &str, bytes: u64, settlement: &str, status: u16| {
        (
            route.to_owned(),
            body.to_owned(),
            bytes,
            settlement.to_owned(),
            status.to_string(),
        )
    };
    assert_eq!(
        seen,
        vec![
            row("files", "complete", 5000, "-", 200),
            row("login", "complete", 10, "refunded", 200),
            row("login", "complete", 10, "kept", 401),
            row("llm", "complete", 10, "cost", 200),
            row("llm", "complete", 10, "invalid_report", 200),
            row("files", "complete", 10, "-", 200),
            row("files", "client_left", 6, "-", 200),
            row("llm", "client_left", 10, "pending", 200),
        ],
        "{stderr}"
    );
    // The streamed body's line counts its whole time, the upstream's only its head.
    let streamed = &lines[5];
    let total = streamed["total_ms"].as_f64().unwrap();
    let upstream = streamed["upstream_ms"].as_f64().unwrap();
    assert!(total >= 300.0, "total {total} ms: {streamed}");
    assert!(
        upstream < total - 250.0,
        "upstream {upstream} ms: {streamed}"
    );
}

/// An upstream whose body breaks off mid-way: the client gets part of it, and the record says
/// so (a warning with the bytes that went, `body: failed` in the access log).
#[tokio::test]
async fn a_body_that_breaks_off_is_recorded_as_failed() {
    // Promises 100 bytes, sends 5 and closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
                    .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            });
        }
    });
    let config = config()
        .upstream(&format!("http://{upstream_addr}"))
        .routes([route("all").prefix("/")]);
    let (child, addr, admin, _dir) = start(config).await;
    let response = http1_client()
        .request(get(&format!("http://{addr}/x")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.into_body().collect().await.is_err(),
        "the client sees the body fail"
    );
    all_written(admin).await;
    let stderr = stop_for_stderr(child).await;
    let lines = access_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert_eq!(lines[0]["body"], "failed", "{stderr}");
    assert_eq!(lines[0]["bytes"], 5, "{stderr}");
    assert_eq!(lines[0]["status"], 200, "{stderr}");
    assert!(
        stderr.contains("response body failed mid-way"),
        "a warning says so:\n{stderr}"
    );
}

/// A response that ends with a trailer (an HTTP/1.1 upstream's chunked answer), read to its
/// end by an HTTP/1.1 client and by an HTTP/2 one (which gets the trailer too): each line
/// says `body: complete` with every byte, never `client_left`.
#[tokio::test]
async fn a_response_with_a_trailer_read_to_its_end_is_logged_complete() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("user", [source::header("x-user")])
        .route(
            route("files")
                .prefix("/")
                .key("user")
                .limit(limit::sliding_window(100, "1m").name("per-minute"))
                .limit(limit::fixed_window(1000, "30d").name("monthly"))
                .limit(
                    limit::token_bucket(100, "1h")
                        .burst(100)
                        .name("tokens")
                        .cost_from_response("X-Tokens-Used"),
                ),
        );
    let (child, addr, admin, _dir) = start(config).await;
    let mut sent = Vec::new();
    // An HTTP/1.1 client that does not ask for trailers (curl's default) and one that does,
    // and an HTTP/2 one; GET and POST (which tollgate may send upstream on another client than
    // its pool of idle HTTP/1.1 connections).
    for (method, version, te) in [
        ("GET", http::Version::HTTP_11, None),
        ("GET", http::Version::HTTP_11, Some("trailers")),
        ("GET", http::Version::HTTP_2, Some("trailers")),
        ("POST", http::Version::HTTP_11, None),
        ("POST", http::Version::HTTP_11, Some("trailers")),
        ("POST", http::Version::HTTP_2, Some("trailers")),
    ] {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}/respond?cost=3&trailer=7"))
            .version(version)
            .header("x-user", "u1");
        if let Some(te) = te {
            request = request.header("te", te);
        }
        let request = request.body(body("")).unwrap();
        let response = match version {
            http::Version::HTTP_2 => h2c_client().request(request).await.unwrap(),
            _ => http1_client().request(request).await.unwrap(),
        };
        assert_eq!(response.status(), StatusCode::OK);
        let whole = response.into_body().collect().await.unwrap();
        let bytes = whole.to_bytes().len() as u64;
        assert!(bytes > 0);
        sent.push(bytes);
    }
    all_written(admin).await;
    let stderr = stop_for_stderr(child).await;
    let lines: Vec<(String, u64)> = access_lines(&stderr)
        .iter()
        .map(|l| {
            (
                l["body"].as_str().unwrap_or("?").to_owned(),
                l["bytes"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    assert_eq!(
        lines,
        sent.iter()
            .map(|&bytes| ("complete".to_owned(), bytes))
            .collect::<Vec<_>>(),
        "{stderr}"
    );
}
