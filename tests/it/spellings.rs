//! Issue 31's request shapes, black-box: the built binary between a raw client and a raw
//! upstream that records every byte it receives, on the memory store and on one Redis.
//!
//! - Every spelling an app routes to a limited handler is counted by that route (429 once the
//!   limit is spent), while an admitted one reaches the upstream exactly as sent.
//! - Shapes no app should see are refused with 400 and never reach the upstream; CONNECT is 405
//!   with `Allow`.
//! - Upgrades: only the route's protocols go through (websocket by default), so an h2c upgrade
//!   reaches the upstream as a plain request; a 101 to anything else is a 502; an upgrade is
//!   counted by its route.
//! - `Connection` cannot remove Host; transfer codings besides chunked reach the upstream.

use crate::support::*;

/// The routes every spelling is tried against, each 2 per minute per `X-User`.
fn limited(upstream: &str, store: Store) -> Config {
    let two = || limit::fixed_window(2, "1m");
    config()
        .upstream(upstream)
        .store(store)
        .identity("user", [source::header("x-user")])
        .route(
            route("login")
                .prefix("/login")
                .methods(["POST"])
                .key("user")
                .limit(two()),
        )
        .route(
            route("signin")
                .prefix("/signin")
                .case("insensitive")
                .key("user")
                .limit(two()),
        )
        .route(
            route("report")
                .prefix("/report")
                .methods(["GET"])
                .key("user")
                .limit(two()),
        )
        .route(
            route("hosted")
                .host("api.example.com")
                .prefix("/h")
                .key("user")
                .limit(two()),
        )
        .route(route("ws").prefix("/ws").key("user").limit(two()))
        .route(
            route("foo")
                .prefix("/up/")
                .key("user")
                .set("upgrades", ["websocket", "foo"])
                .limit(limit::fixed_window(100, "1m")),
        )
}

fn redis_store(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("500ms")
        .key_prefix("spellings:")
        .on_error("deny")
}

fn request(method: &str, target: &str, host: &str, user: &str) -> Vec<u8> {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nX-User: {user}\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// A spelling, and the request the app routes it as.
struct Spelling {
    method: &'static str,
    target: &'static str,
    host: &'static str,
    canonical: (&'static str, &'static str, &'static str),
}

const fn login(target: &'static str) -> Spelling {
    Spelling {
        method: "POST",
        target,
        host: "app.example",
        canonical: ("POST", "/login", "app.example"),
    }
}

const SPELLINGS: [Spelling; 14] = [
    login("/%2flogin"),
    login("/\\login"),
    login("/%2Flogin"),
    login("/%5Clogin"),
    login("/;x=1/login"),
    login("/.;/login"),
    login("/a/..;/login"),
    login("//login"),
    login("/x/../login"),
    login("/%6Cogin"),
    Spelling {
        method: "GET",
        target: "/SIGNIN",
        host: "app.example",
        canonical: ("GET", "/signin", "app.example"),
    },
    Spelling {
        method: "GET",
        target: "/Signin/",
        host: "app.example",
        canonical: ("GET", "/signin", "app.example"),
    },
    Spelling {
        method: "HEAD",
        target: "/report",
        host: "app.example",
        canonical: ("GET", "/report", "app.example"),
    },
    Spelling {
        method: "GET",
        target: "/h",
        host: "api.example.com.",
        canonical: ("GET", "/h", "api.example.com"),
    },
];

/// Each spelling: admitted once (reaching the upstream as sent), the canonical request spends
/// the rest of the limit, then the spelling again is 429.
async fn every_spelling_is_counted(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for (i, s) in SPELLINGS.iter().enumerate() {
        let user = format!("u{i}");
        let what = format!("{} {} (Host {})", s.method, s.target, s.host);
        let first = raw_exchange(served.addr, &request(s.method, s.target, s.host, &user)).await;
        assert_eq!(first.status, 200, "{what}: first");
        let sent = format!("{} {} HTTP/1.1", s.method, s.target);
        assert!(
            upstream.request_lines().contains(&sent),
            "{what}: the upstream got {:?}",
            upstream.request_lines()
        );
        let (method, target, host) = s.canonical;
        let second = raw_exchange(served.addr, &request(method, target, host, &user)).await;
        assert_eq!(second.status, 200, "{what}: the canonical request");
        let third = raw_exchange(served.addr, &request(s.method, s.target, s.host, &user)).await;
        assert_eq!(
            third.status,
            429,
            "{what}: not counted by its route ({})",
            third.body_text()
        );
        assert_eq!(
            third.header("content-type"),
            Some("application/problem+json")
        );
    }
    // 3 requests per spelling, 2 forwarded.
    assert_eq!(upstream.request_lines().len(), 2 * SPELLINGS.len());
}

#[tokio::test]
async fn every_spelling_is_counted_in_memory() {
    every_spelling_is_counted(store::memory()).await;
}

#[tokio::test]
async fn every_spelling_is_counted_in_redis() {
    let redis = RedisServer::start();
    every_spelling_is_counted(redis_store(&redis)).await;
}

/// Shapes no framework should see: refused with a 400 problem, the upstream never asked.
async fn hostile_shapes_are_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let refused: [&[u8]; 6] = [
        b"post /login HTTP/1.1\r\nHost: app.example\r\nX-User: r\r\nContent-Length: 0\r\n\r\n",
        b"Post /login HTTP/1.1\r\nHost: app.example\r\nX-User: r\r\nContent-Length: 0\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: x@api.example.com\r\nX-User: r\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: api.example.com, other.example\r\nX-User: r\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: api.ex\xe9mple.com\r\nX-User: r\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: other.example\r\nHost: api.example.com\r\nX-User: r\r\n\r\n",
    ];
    for request in refused {
        let what = String::from_utf8_lossy(request).into_owned();
        let response = raw_exchange(served.addr, request).await;
        assert_eq!(response.status, 400, "{what}");
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        assert!(response.body_text().contains("\"status\":400"), "{what}");
    }
    // An absolute-form target with userinfo, as a proxy client would send it.
    let response = raw_exchange(
        served.addr,
        b"GET http://x@api.example.com/h HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    )
    .await;
    assert_eq!(response.status, 400);
    assert_eq!(upstream.connection_count(), 0);
}

#[tokio::test]
async fn hostile_shapes_are_refused_in_memory() {
    hostile_shapes_are_refused(store::memory()).await;
}

#[tokio::test]
async fn hostile_shapes_are_refused_in_redis() {
    let redis = RedisServer::start();
    hostile_shapes_are_refused(redis_store(&redis)).await;
}

#[tokio::test]
async fn connect_is_answered_405_with_allow() {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let response = raw_exchange(
        served.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    assert_eq!(response.status, 405);
    let allow = response.header("allow").expect("an Allow header");
    for method in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        assert!(allow.contains(method), "{allow}");
    }
    assert!(!allow.contains("CONNECT"));
    assert_eq!(upstream.connection_count(), 0);
}

const H2C_UPGRADE: &str =
    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n";

/// The h2c tunnel of issue 31: the request goes on as a plain GET (no Upgrade, no
/// HTTP2-Settings, no `Connection: upgrade`) and is counted by its route.
async fn h2c_never_reaches_the_upstream(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for (path, counted) in [("/ws", true), ("/unrouted", false)] {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: app.example\r\nX-User: tunnel\r\n{H2C_UPGRADE}\r\n"
        );
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(raw_exchange(served.addr, request.as_bytes()).await.status);
        }
        let expected = if counted {
            [200, 200, 429]
        } else {
            [200, 200, 200]
        };
        assert_eq!(statuses, expected, "{path}");
    }
    let received = upstream.received_text().to_ascii_lowercase();
    assert_eq!(upstream.request_lines().len(), 5);
    for absent in ["h2c", "upgrade", "http2-settings"] {
        assert!(!received.contains(absent), "{absent} in {received}");
    }
}

#[tokio::test]
async fn h2c_never_reaches_the_upstream_in_memory() {
    h2c_never_reaches_the_upstream(store::memory()).await;
}

#[tokio::test]
async fn h2c_never_reaches_the_upstream_in_redis() {
    let redis = RedisServer::start();
    h2c_never_reaches_the_upstream(redis_store(&redis)).await;
}

const WEBSOCKET_UPGRADE: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A WebSocket upgrade goes through and is counted by its route's limits like any request.
async fn websocket_upgrades_are_counted(store: Store) {
    let upstream = RawUpstream::answering(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
    )
    .await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let request =
        format!("GET /ws HTTP/1.1\r\nHost: app.example\r\nX-User: ws\r\n{WEBSOCKET_UPGRADE}\r\n");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(raw_exchange(served.addr, request.as_bytes()).await.status);
    }
    assert_eq!(statuses, [101, 101, 429]);
    let heads = upstream.heads();
    assert_eq!(heads.len(), 2);
    for head in heads {
        assert!(head.iter().any(|l| l == "upgrade: websocket"), "{head:?}");
    }
}

#[tokio::test]
async fn websocket_upgrades_are_counted_in_memory() {
    websocket_upgrades_are_counted(store::memory()).await;
}

#[tokio::test]
async fn websocket_upgrades_are_counted_in_redis() {
    let redis = RedisServer::start();
    websocket_upgrades_are_counted(redis_store(&redis)).await;
}

/// An upstream that switches to a protocol the request was not allowed (or to anything when
/// the request asked for no upgrade) gets its client a 502, not a tunnel.
#[tokio::test]
async fn a_101_for_a_protocol_not_allowed_is_a_502() {
    let upstream = RawUpstream::answering(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
    )
    .await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let websocket =
        format!("GET /up/x HTTP/1.1\r\nHost: app.example\r\nX-User: a\r\n{WEBSOCKET_UPGRADE}\r\n");
    let plain = "GET /up/x HTTP/1.1\r\nHost: app.example\r\nX-User: a\r\n\r\n";
    let h2c = format!("GET /up/x HTTP/1.1\r\nHost: app.example\r\nX-User: a\r\n{H2C_UPGRADE}\r\n");
    for request in [websocket, plain.to_owned(), h2c] {
        let response = raw_exchange(served.addr, request.as_bytes()).await;
        assert_eq!(response.status, 502, "{request}");
    }
    assert_eq!(upstream.request_lines().len(), 3);
}

/// `upgrades:` on a route lets its protocols through, and only on that route.
#[tokio::test]
async fn a_route_lets_through_the_upgrades_it_lists() {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let foo = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: app.example\r\nX-User: f\r\nConnection: upgrade\r\nUpgrade: foo, h2c\r\n\r\n")
    };
    assert_eq!(
        raw_exchange(served.addr, foo("/up/x").as_bytes())
            .await
            .status,
        200
    );
    assert_eq!(
        raw_exchange(served.addr, foo("/ws").as_bytes())
            .await
            .status,
        200
    );
    let heads = upstream.heads();
    assert!(
        heads[0].iter().any(|l| l == "upgrade: foo"),
        "{:?}",
        heads[0]
    );
    assert!(
        heads[0].iter().any(|l| l == "connection: upgrade"),
        "{:?}",
        heads[0]
    );
    assert!(
        !heads[1]
            .iter()
            .any(|l| l.starts_with("upgrade") || l.starts_with("connection")),
        "{:?}",
        heads[1]
    );
}

/// `Connection: host` does not take the client's Host away (the route matched on it); other
/// headers it names are still removed.
#[tokio::test]
async fn connection_cannot_remove_host_or_forwarding_headers() {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let request = b"GET /plain HTTP/1.1\r\nHost: api.example.com\r\nConnection: host, x-forwarded-for, content-length, x-drop\r\nX-Drop: 1\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(raw_exchange(served.addr, request).await.status, 200);
    let head = &upstream.heads()[0];
    assert!(
        head.iter().any(|l| l == "host: api.example.com"),
        "{head:?}"
    );
    assert!(
        head.iter().any(|l| l == "x-forwarded-for: 127.0.0.1"),
        "{head:?}"
    );
    assert!(!head.iter().any(|l| l.starts_with("x-drop")), "{head:?}");
}

/// `Transfer-Encoding: gzip, chunked`: hyper takes the chunked framing apart and puts it back;
/// the gzip coding (the body's bytes are still gzip) reaches the upstream.
#[tokio::test]
async fn transfer_codings_besides_chunked_reach_the_upstream() {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let request = b"POST /plain HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    assert_eq!(raw_exchange(served.addr, request).await.status, 200);
    let head = &upstream.heads()[0];
    assert!(
        head.iter().any(|l| l == "transfer-encoding: gzip, chunked"),
        "{head:?}"
    );
    assert!(upstream.received_text().ends_with("3\r\nabc\r\n0\r\n\r\n"));
}

/// An HTTP/2 request's body with trailers, as a client streams it.
fn body_with_trailers(declared: bool) -> http::Request<ClientBody> {
    use http_body_util::{BodyExt, StreamBody};
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    let frames: Vec<Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>> = vec![
        Ok(hyper::body::Frame::data(bytes::Bytes::from_static(b"data"))),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames))
        .map_err(|e| match e {})
        .boxed();
    let mut request = http::Request::post("/request-trailers");
    if declared {
        request = request.header("trailer", "x-checksum");
    }
    request.body(body).unwrap()
}

async fn trailers_reaching(upstream_http2: bool, declared: bool) -> String {
    let upstream = upstream().start().await;
    let served = serve(
        &config()
            .upstream(&upstream.url())
            .upstream_http2(upstream_http2),
    )
    .await;
    let mut request = body_with_trailers(declared);
    *request.uri_mut() = served.url("/request-trailers").parse().unwrap();
    let response = h2c_client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    text(response).await
}

/// HTTP/2 request trailers reach an HTTP/2 upstream, and an HTTP/1.1 one (as chunked trailers)
/// when the request declares them in `Trailer`, which HTTP/1.1 needs before the body.
#[tokio::test]
async fn http2_request_trailers_reach_the_upstream() {
    let expected = r#"{"x-checksum":["abc"]}"#;
    assert_eq!(trailers_reaching(true, false).await, expected);
    assert_eq!(trailers_reaching(false, true).await, expected);
    // Undeclared, HTTP/1.1 has no way to announce them: hyper's client sends none.
    assert_eq!(trailers_reaching(false, false).await, "null");
    // HTTP/1.1 to HTTP/1.1, chunked with declared trailers.
    let upstream = upstream().start().await;
    let served = serve(&config().upstream(&upstream.url())).await;
    let response = raw_exchange(
        served.addr,
        b"POST /request-trailers HTTP/1.1\r\nHost: a\r\nTrailer: x-checksum\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n0\r\nx-checksum: abc\r\n\r\n",
    )
    .await;
    assert_eq!(response.body_text(), expected);
}

/// The same on the way back: an upstream's `gzip, chunked` response reaches an HTTP/1.1
/// client with its gzip coding named.
#[tokio::test]
async fn response_transfer_codings_besides_chunked_reach_the_client() {
    let upstream = RawUpstream::answering(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    let served = serve(&limited(&upstream.url(), store::memory())).await;
    let response = raw_exchange(served.addr, b"GET /plain HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("transfer-encoding"), Some("gzip, chunked"));
}
