//! Hostile input end to end: spoofed and oversized X-Forwarded-For, every kind of bad JWT (and
//! that a refused one never falls through to a weaker source), identity values built to collide
//! or break keys and scripts, slow and idle clients, oversized bodies, and an upstream that
//! misbehaves at the TCP level. Each case asserts which bucket was
//! used (through exact admitted counts) and that the proxy still serves afterwards.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::*;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How late past a configured timeout a busy machine may see it fire.
const MARGIN: Duration = Duration::from_secs(1);

fn redis_store(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("500ms")
        .key_prefix("hostile:")
        .on_error("deny")
}

/// The route `all` on `/l/`: 2 requests a day per client IP.
fn per_client_ip() -> Route {
    route("all")
        .prefix("/l/")
        .key("client_ip")
        .limit(limit::fixed_window(2, "24h"))
}

/// Waits until Redis decides (on_error: deny answers 503 before the first connection).
async fn wait_store(proxy: &ProxyHandle) {
    eventually("the store decides", PATIENCE, async || {
        let status = send_raw_header(proxy, "/warmup/x", None).await.0;
        until(status == StatusCode::OK, status)
    })
    .await;
}

async fn send_raw_header(
    proxy: &ProxyHandle,
    path: &str,
    header: Option<(&str, &[u8])>,
) -> (StatusCode, Vec<u8>) {
    let mut request = Request::get(proxy.url(path));
    if let Some((name, value)) = header {
        request = request.header(name, HeaderValue::from_bytes(value).unwrap());
    }
    let response = http1_client()
        .request(request.body(body("")).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

async fn admitted(
    proxy: &ProxyHandle,
    path: &str,
    header: Option<(&str, &[u8])>,
    n: usize,
) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let (status, _) = send_raw_header(proxy, path, header).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{path}: unexpected {status} (a broken script answers 503)"
        );
        ok += usize::from(status == StatusCode::OK);
    }
    ok
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For

#[tokio::test]
async fn untrusted_forwarded_for_is_ignored_for_the_bucket_but_forwarded_with_the_peer() {
    let up = upstream().start().await;
    let routes = config().upstream(&up.url()).route(per_client_ip());
    let proxy = proxy(routes).start().await;
    let long = "203.0.113.1, ".repeat(3000); // ~40 KB, 3000 entries
    let garbage = "not-an-ip, ::::, [1.2.3.4], 300.1.1.1, \"\", ,,,, 1.2.3.4:99999";
    let values: Vec<String> = vec![
        "198.51.100.1".into(),
        "198.51.100.2, 198.51.100.3".into(),
        garbage.into(),
        long.clone(),
        "unknown".into(),
    ];
    // Five different spoofed values, one bucket: the peer's.
    let mut ok = 0;
    for v in &values {
        let (status, _) =
            send_raw_header(&proxy, "/l/x", Some(("x-forwarded-for", v.as_bytes()))).await;
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(ok, 2, "spoofed X-Forwarded-For chose a bucket");

    // Forwarded as sent, with the peer appended.
    for v in [&values[0], &values[2], &long] {
        let (status, echo) =
            send_raw_header(&proxy, "/echo", Some(("x-forwarded-for", v.as_bytes()))).await;
        assert_eq!(status, StatusCode::OK);
        let echo: serde_json::Value = serde_json::from_slice(&echo).unwrap();
        let forwarded = echo["headers"]["x-forwarded-for"][0].as_str().unwrap();
        assert_eq!(forwarded, format!("{}, 127.0.0.1", v.trim()));
    }
}

#[tokio::test]
async fn trusted_forwarded_for_picks_the_bucket_and_garbage_falls_back_to_the_peer() {
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .trusted_proxies(["127.0.0.0/8"])
        .route(per_client_ip());
    let proxy = proxy(routes).start().await;
    let xff = |v: &'static str| Some(("x-forwarded-for", v.as_bytes()));
    assert_eq!(admitted(&proxy, "/l/x", xff("198.51.100.1"), 3).await, 2);
    assert_eq!(admitted(&proxy, "/l/x", xff("198.51.100.2"), 3).await, 2);
    // Unparseable: the walk stops at the trusted peer, whatever the client wrote to the left.
    assert_eq!(
        admitted(&proxy, "/l/x", xff("198.51.100.3, garbage"), 1).await,
        1
    );
    assert_eq!(
        admitted(&proxy, "/l/x", xff("198.51.100.4, {}:*"), 1).await,
        1
    );
    assert_eq!(
        admitted(&proxy, "/l/x", None, 1).await,
        0,
        "peer bucket used twice"
    );
}

// ---------------------------------------------------------------------------------------------
// JWT

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn every_bad_jwt_is_refused_and_keyed_by_client_ip() {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/identity");
    let private = std::fs::read(format!("{fixtures}/rsa_private.pem")).unwrap();
    let public = std::fs::read(format!("{fixtures}/rsa_public.pem")).unwrap();
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .identity(
            "user",
            [source::jwt(
                Jwt::public_key("sub", &format!("{fixtures}/rsa_public.pem")).algorithm("RS256"),
            )],
        )
        .route(
            route("api")
                .prefix("/api/")
                .key("user")
                .limit(limit::fixed_window(2, "24h")),
        );
    let proxy = proxy(routes).start().await;
    let rs = |claims: serde_json::Value| {
        encode(
            &Header::new(Algorithm::RS256),
            &claims,
            &EncodingKey::from_rsa_pem(&private).unwrap(),
        )
        .unwrap()
    };
    let valid = |sub: &str| rs(serde_json::json!({"sub": sub, "exp": now() + 300}));

    let good = valid("victim");
    let (head, rest) = good.split_once('.').unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let mut forged_sig = signature.as_bytes().to_vec();
    forged_sig[5] = if forged_sig[5] == b'A' { b'B' } else { b'A' };
    let other_payload = b64(br#"{"sub":"attacker","exp":99999999999}"#);
    let bad_tokens = vec![
        // Forged: the victim's header and signature on another payload, and a flipped byte.
        format!("{head}.{other_payload}.{signature}"),
        format!(
            "{head}.{payload}.{}",
            String::from_utf8(forged_sig).unwrap()
        ),
        // Expired and not yet valid (no leeway configured).
        rs(serde_json::json!({"sub": "a1", "exp": now() - 120})),
        rs(serde_json::json!({"sub": "a2", "exp": now() + 300, "nbf": now() + 120})),
        // alg: none.
        format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(format!(r#"{{"sub":"a3","exp":{}}}"#, now() + 300).as_bytes())
        ),
        // Algorithm confusion: HS256 keyed with the RSA public key the verifier trusts.
        encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "a4", "exp": now() + 300}),
            &EncodingKey::from_secret(&public),
        )
        .unwrap(),
        // Malformed base64 and structure.
        "eyJ!!!.@@@.###".to_string(),
        "a.b".to_string(),
        format!("{head}.{payload}"),
    ];
    // All refused: keyed by the client IP, one bucket, two admissions in total.
    let mut ok = 0;
    for token in &bad_tokens {
        let auth = format!("Bearer {token}");
        let (status, _) =
            send_raw_header(&proxy, "/api/x", Some(("authorization", auth.as_bytes()))).await;
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(ok, 2, "a bad token picked its own bucket");
    // A valid token still has a bucket of its own.
    let auth = format!("Bearer {}", valid("alice"));
    assert_eq!(
        admitted(
            &proxy,
            "/api/x",
            Some(("authorization", auth.as_bytes())),
            3
        )
        .await,
        2
    );
}

/// The refused tokens of the README's `[jwt, header]` identity: expired, `nbf` ahead, no `exp`,
/// oversized, a bad signature, an empty `sub`; signed with the RSA fixture.
fn refused_tokens() -> Vec<(&'static str, String)> {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/identity");
    let private = std::fs::read(format!("{fixtures}/rsa_private.pem")).unwrap();
    let rs = |claims: serde_json::Value| {
        encode(
            &Header::new(Algorithm::RS256),
            &claims,
            &EncodingKey::from_rsa_pem(&private).unwrap(),
        )
        .unwrap()
    };
    let good = rs(serde_json::json!({"sub": "victim", "exp": now() + 300}));
    let (head, rest) = good.split_once('.').unwrap();
    let signature = rest.split_once('.').unwrap().1;
    let other_payload = b64(format!(r#"{{"sub":"attacker","exp":{}}}"#, now() + 300).as_bytes());
    vec![
        (
            "expired",
            rs(serde_json::json!({"sub": "a", "exp": now() - 120})),
        ),
        (
            "not_yet_valid",
            rs(serde_json::json!({"sub": "a", "exp": now() + 300, "nbf": now() + 120})),
        ),
        (
            "missing_required_claim",
            rs(serde_json::json!({"sub": "a"})),
        ),
        (
            "oversized",
            rs(serde_json::json!({"sub": "a", "exp": now() + 300, "pad": "x".repeat(9000)})),
        ),
        (
            "bad_signature",
            format!("{head}.{other_payload}.{signature}"),
        ),
        (
            "no_identity_claim",
            rs(serde_json::json!({"sub": "", "exp": now() + 300})),
        ),
    ]
}

/// The README's `user: [jwt, header]` on `/api/`, 2 a day per user; `on_invalid` as given.
async fn jwt_then_header(
    on_invalid: Option<&str>,
    redis: Option<&RedisServer>,
) -> (Upstream, ProxyHandle) {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/identity");
    let up = upstream().start().await;
    let mut routes = config()
        .upstream(&up.url())
        .identity(
            "user",
            [
                source::jwt(
                    Jwt::public_key("sub", &format!("{fixtures}/rsa_public.pem"))
                        .algorithm("RS256"),
                ),
                source::header("x-user"),
            ],
        )
        .route(
            route("api")
                .prefix("/api/")
                .key("user")
                .limit(limit::fixed_window(2, "24h")),
        );
    if let Some(on_invalid) = on_invalid {
        routes = routes.on_invalid("user", on_invalid);
    }
    let Some(redis) = redis else {
        return (up.clone(), proxy(routes).start().await);
    };
    // The store connects in the background and `on_error: deny` answers 503 until then: the
    // test is about keys, so it starts once the store is up.
    let proxy = proxy(routes.store(redis_store(redis)).admin("127.0.0.1:0"))
        .start()
        .await;
    proxy.wait_ready().await;
    (up.clone(), proxy)
}

/// Sends `token` with an `X-User` of the attacker's choosing: the status and the
/// `WWW-Authenticate` it got.
async fn with_token(proxy: &ProxyHandle, token: &str, user: &str) -> (StatusCode, Option<String>) {
    let request = Request::get(proxy.url("/api/x"))
        .header("authorization", format!("Bearer {token}"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let _ = response.into_body().collect().await;
    (status, challenge)
}

/// With `[jwt, header]`, a refused token never lets the caller choose its bucket with
/// `X-User`: each refused token below comes with a fresh `X-User`, and all of them share the
/// client IP's two admissions. Without a token, `X-User` still keys the caller.
async fn a_refused_token_never_falls_through_to_the_header(redis: Option<&RedisServer>) {
    let (up, proxy) = jwt_then_header(None, redis).await;
    let mut statuses = Vec::new();
    for (i, (why, token)) in refused_tokens().iter().enumerate() {
        let (status, _) = with_token(&proxy, token, &format!("fresh-{i}")).await;
        statuses.push((*why, status.as_u16()));
    }
    let admitted = statuses.iter().filter(|(_, s)| *s == 200).count();
    assert_eq!(admitted, 2, "keyed by client IP, not X-User: {statuses:?}");
    assert_eq!(up.request_count(), 2);
    let (status, _) = send_raw_header(&proxy, "/api/x", Some(("x-user", b"no-token-alice"))).await;
    assert_eq!(status, StatusCode::OK, "no token at all: the header keys");
}

#[tokio::test]
async fn a_refused_token_never_falls_through_to_the_header_memory() {
    a_refused_token_never_falls_through_to_the_header(None).await;
}

#[tokio::test]
async fn a_refused_token_never_falls_through_to_the_header_redis() {
    let redis = RedisServer::start();
    a_refused_token_never_falls_through_to_the_header(Some(&redis)).await;
}

/// `on_invalid: reject`: every refused token is answered 401 with a Bearer challenge naming
/// the reason, and never reaches the upstream; a valid token is admitted.
#[tokio::test]
async fn on_invalid_reject_answers_401() {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let (up, proxy) = jwt_then_header(Some("reject"), None).await;
    for (why, token) in refused_tokens() {
        let (status, challenge) = with_token(&proxy, &token, "fresh").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}");
        assert_eq!(
            challenge.as_deref(),
            Some(format!("Bearer error=\"invalid_token\", error_description=\"{why}\"").as_str()),
            "{why}"
        );
    }
    assert_eq!(
        up.request_count(),
        0,
        "no refused token reached the upstream"
    );
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/identity");
    let private = std::fs::read(format!("{fixtures}/rsa_private.pem")).unwrap();
    let valid = encode(
        &Header::new(Algorithm::RS256),
        &serde_json::json!({"sub": "alice", "exp": now() + 300}),
        &EncodingKey::from_rsa_pem(&private).unwrap(),
    )
    .unwrap();
    let (status, _) = with_token(&proxy, &valid, "whoever").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.request_count(), 1);
}

// ---------------------------------------------------------------------------------------------
// Identity values

/// Values built to collide with each other or to break key syntax. Every value must get its
/// own bucket of exactly `limit` admissions, on Redis (where a broken key or script would show
/// as 503, on_error: deny) and in memory; Redis keys stay in one hash tag.
#[tokio::test]
async fn hostile_identity_values_never_share_a_bucket_or_break_a_script() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .identity("h", [source::header("x-k")])
        .identity("q", [source::query("k")])
        .identity("c", [source::cookie("k")])
        .identity("p", [source::path_segment(2)])
        .route(
            route("warmup")
                .prefix("/warmup/")
                .limit(limit::fixed_window(1000, "24h")),
        )
        .route(
            route("h")
                .prefix("/h/")
                .key("h")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("q")
                .prefix("/q/")
                .key("q")
                .limit(limit::sliding_log(2, "1h")),
        )
        .route(
            route("c")
                .prefix("/c/")
                .key("c")
                .limit(limit::token_bucket(2, "1h")),
        )
        .route(
            route("p")
                .prefix("/p/")
                .key("p")
                .limit(limit::gcra(2, "1h")),
        );
    let big_x = "x".repeat(10 * 1024);
    let big_y = format!("{}y", "x".repeat(10 * 1024 - 1));
    // Header values: anything HTTP allows in a field (no CR/LF), including bytes that are not
    // UTF-8.
    let header_values: Vec<Vec<u8>> = vec![
        b"alice".to_vec(),
        b"=alice".to_vec(),
        b"header=alice".to_vec(),
        b"{alice}".to_vec(),
        b"alice}".to_vec(),
        b"{".to_vec(),
        b"}".to_vec(),
        b":".to_vec(),
        b"alice:2".to_vec(),
        b"*".to_vec(),
        b"alice*".to_vec(),
        b"a|b".to_vec(),
        b"a\tb".to_vec(),
        b"\xff\xfe".to_vec(),
        b"\xff\xff".to_vec(),
        big_x.clone().into_bytes(),
        big_y.clone().into_bytes(),
    ];
    // Query, cookie and path values, percent-encoded: newlines and NUL are possible here.
    let encoded: Vec<&str> = vec![
        "bob",
        "bob%0A",
        "bob%0D%0A",
        "%0Abob",
        "bob%00",
        "%7Bbob%7D",
        "bob%3A1",
        "%2A",
        "%FF",
        "%FE",
    ];

    for store in ["redis", "memory"] {
        let yaml = if store == "redis" {
            routes.clone().store(redis_store(&redis))
        } else {
            routes.clone()
        };
        let proxy = proxy(yaml).start().await;
        if store == "redis" {
            wait_store(&proxy).await;
        }
        for value in &header_values {
            assert_eq!(
                admitted(&proxy, "/h/x", Some(("x-k", value)), 3).await,
                2,
                "{store}: header value {:?}",
                String::from_utf8_lossy(&value[..value.len().min(20)])
            );
        }
        for value in &encoded {
            assert_eq!(
                admitted(&proxy, &format!("/q/x?k={value}"), None, 3).await,
                2,
                "{store}: query {value}"
            );
            let cookie = format!("k={value}");
            assert_eq!(
                admitted(&proxy, "/c/x", Some(("cookie", cookie.as_bytes())), 3).await,
                2,
                "{store}: cookie {value}"
            );
            assert_eq!(
                admitted(&proxy, &format!("/p/{value}/x"), None, 3).await,
                2,
                "{store}: path {value}"
            );
        }
        // The 10 KB query value: its own bucket too.
        assert_eq!(
            admitted(&proxy, &format!("/q/x?k={big_x}"), None, 3).await,
            2,
            "{store}: 10 KB query value"
        );
        // And the proxy still serves.
        assert_eq!(
            send_raw_header(&proxy, "/echo", None).await.0,
            StatusCode::OK
        );
    }

    // Keys: bounded, one hash tag each, holding only the route and a key-safe fragment.
    let mut conn = redis.client().await;
    let keys: Vec<Vec<u8>> = ::redis::cmd("KEYS")
        .arg("hostile:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.len() > 40, "only {} keys", keys.len());
    for key in keys {
        let text = String::from_utf8(key.clone()).expect("keys are text");
        assert!(text.len() < 200, "{text}");
        assert_eq!(text.matches('{').count(), 1, "{text}");
        assert_eq!(text.matches('}').count(), 1, "{text}");
        assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Slow and idle clients

async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "connection still open after {within:?} (read so far: {:?})",
                String::from_utf8_lossy(&all)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// Nobody else is slowed: every ordinary request is answered while the attackers are still
/// connected (none cut yet by the 2 s timeouts), not once they are cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_silent_clients_are_cut_and_slow_nobody_else() {
    let up = upstream().start().await;
    let timeout = Duration::from_secs(2);
    let proxy = proxy(
        config()
            .upstream(&up.url())
            .header_read_timeout("2s")
            .idle_timeout("2s")
            .max_connections(100),
    )
    .start()
    .await;
    let addr = proxy.addr;
    let started = Instant::now();
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // 20 connections that never say anything, 20 that trickle a head one byte at a time.
    let mut attackers = Vec::new();
    for i in 0..40 {
        let cut = cut.clone();
        attackers.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            if i % 2 == 1 {
                let head = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ";
                s.write_all(head).await.unwrap();
                let trickle = async {
                    loop {
                        if s.write_all(b"a").await.is_err() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(5), trickle).await;
            }
            let _ = read_until_closed(&mut s, Duration::from_secs(8)).await;
            cut.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            started.elapsed()
        }));
    }
    // Meanwhile ordinary clients are served, before any attacker is cut.
    for i in 0..10 {
        let response = http1_client()
            .request(get(&proxy.url("/echo")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let _ = text(response).await;
        let cut = cut.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            cut,
            0,
            "ordinary request {i} was answered only once {cut} attackers were cut ({:?} in)",
            started.elapsed()
        );
    }
    for a in attackers {
        let closed_after = a.await.unwrap();
        // timeout under test: header_read_timeout and idle_timeout 2s.
        assert!(
            closed_after <= timeout + MARGIN + Duration::from_millis(500),
            "an attacking connection lived {closed_after:?}"
        );
    }
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_and_max_connections_holds() {
    let up = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .idle_timeout("1s")
            .header_read_timeout("10s")
            .max_connections(2),
    )
    .start()
    .await;
    // A completed request, then silence: closed after idle_timeout, not header_read_timeout.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let all = read_until_closed(&mut s, Duration::from_secs(4)).await;
    assert!(all.starts_with(b"HTTP/1.1 200"));
    // timeout under test: idle_timeout 1s (and not header_read_timeout 10s).
    assert!(
        t.elapsed() >= Duration::from_millis(900) && t.elapsed() <= Duration::from_secs(1) + MARGIN,
        "closed after {:?}",
        t.elapsed()
    );

    // Two silent connections take both slots; a third client is served once they are cut.
    let admin = proxy.admin.unwrap();
    eventually("the first connection is gone", PATIENCE, async || {
        let open = metric(admin, "tollgate_client_connections").await;
        until(open == Some(0.0), open)
    })
    .await;
    let t = Instant::now();
    let _a = TcpStream::connect(proxy.addr).await.unwrap();
    let _b = TcpStream::connect(proxy.addr).await.unwrap();
    eventually(
        "both silent connections hold a slot",
        PATIENCE,
        async || {
            let open = metric(admin, "tollgate_client_connections").await;
            until(open == Some(2.0), open)
        },
    )
    .await;
    let response = http1_client()
        .request(get(&proxy.url("/echo")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // timeout under test: idle_timeout 1s cuts the silent connections; not served before it.
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "max_connections: 2 let a third connection in after {:?}",
        t.elapsed()
    );
    assert!(t.elapsed() <= Duration::from_secs(1) + MARGIN);
}

#[tokio::test]
async fn http2_streams_per_connection_are_capped() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).http2_max_concurrent_streams(2))
        .start()
        .await;
    let client = h2c_client();
    let mut holds = Vec::new();
    for _ in 0..2 {
        let mut r = client.request(get(&proxy.url("/hold"))).await.unwrap();
        let _ = r.body_mut().frame().await;
        holds.push(r);
    }
    let third = tokio::spawn({
        let client = client.clone();
        let url = proxy.url("/echo");
        async move { client.request(get(&url)).await.unwrap().status() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        up.request_count(),
        2,
        "a third stream opened on the connection"
    );
    drop(holds.pop());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), third)
            .await
            .unwrap()
            .unwrap(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn oversized_bodies_get_413_without_being_sent_whole() {
    let up = upstream().start().await;
    let proxy = proxy(config().upstream(&up.url()).max_request_body("1KiB"))
        .start()
        .await;
    // Declared too large: answered at once although no body byte was sent.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        .await
        .unwrap();
    let all = read_until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(
        all.starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&all)
    );
    // Chunked, cut once past the limit while more keeps coming.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = format!("400\r\n{}\r\n", "z".repeat(1024));
    for _ in 0..3 {
        if s.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let all = read_until_closed(&mut s, Duration::from_secs(3)).await;
    assert!(
        all.starts_with(b"HTTP/1.1 413"),
        "{:?}",
        String::from_utf8_lossy(&all)
    );
    assert_eq!(
        send_raw_header(&proxy, "/echo", None).await.0,
        StatusCode::OK
    );
}

// ---------------------------------------------------------------------------------------------
// A misbehaving upstream, at the TCP level

/// Answers by request path: `/garbage` (not HTTP), `/silent` (nothing at all), `/reset` (a head and part of the body, then
/// RST), `/stall` (a head and part of the body, then nothing, ever), anything else a proper
/// response. Counts connections the proxy closed on it.
struct RawUpstream {
    addr: SocketAddr,
    closed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn raw_upstream() -> RawUpstream {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = Arc::new(AtomicUsize::new(0));
    let counter = closed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                match path.as_str() {
                    "/garbage" => {
                        let _ = s
                            .write_all(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02garbage")
                            .await;
                    }
                    "/reset" => {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial")
                            .await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        // SO_LINGER 0: the close is a TCP reset, not an orderly end.
                        #[allow(deprecated)]
                        let _ = s.set_linger(Some(Duration::ZERO));
                        drop(s);
                    }
                    "/silent" => {
                        // Never answers at all.
                        let _ = s.read(&mut buf).await;
                    }
                    "/stall" => {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial")
                            .await;
                        // Hold until the proxy gives up on us.
                        let _ = s.read(&mut buf).await;
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                            .await;
                    }
                }
            });
        }
    });
    RawUpstream { addr, closed }
}

#[tokio::test]
async fn upstream_faults_give_502_504_or_a_cut_stream_and_the_proxy_serves_on() {
    let raw = raw_upstream().await;
    let yaml = config()
        .upstream(&format!("http://{}", raw.addr))
        .upstream_timeout("1s");
    let proxy = crate::support::proxy(yaml).start().await;

    // Garbage instead of HTTP: 502.
    let (status, _) = send_raw_header(&proxy, "/garbage", None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);

    // No response head within upstream.timeout: 504, bounded.
    let t = Instant::now();
    let (status, _) = send_raw_header(&proxy, "/silent", None).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    // timeout under test: upstream_timeout 1s.
    assert!(t.elapsed() <= Duration::from_secs(1) + MARGIN);

    // Reset mid-response: the head was already sent, so the client sees the stream cut.
    let response = http1_client()
        .request(get(&proxy.url("/reset")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect())
        .await
        .expect("a cut body must end, not hang");
    assert!(body.is_err(), "a truncated body must not look complete");

    // A response that never ends: bounded by the client. Once it goes away the proxy drops
    // the upstream connection too (nothing leaks).
    let mut response = http1_client()
        .request(get(&proxy.url("/stall")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let first = response.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "partial");
    drop(response);
    eventually(
        "the stalled upstream connection is closed",
        PATIENCE,
        async || {
            let closed = raw.closed.load(std::sync::atomic::Ordering::SeqCst);
            until(closed >= 1, closed)
        },
    )
    .await;

    // And it serves on.
    let (status, body) = send_raw_header(&proxy, "/fine", None).await;
    assert_eq!(
        (status, body.as_slice()),
        (StatusCode::OK, b"ok".as_slice())
    );

    // Connection refused: 502.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let refused = crate::support::proxy(config().upstream(&format!("http://{closed_port}")))
        .start()
        .await;
    assert_eq!(
        send_raw_header(&refused, "/x", None).await.0,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(
        send_raw_header(&refused, "/x", None).await.0,
        StatusCode::BAD_GATEWAY
    );
}
