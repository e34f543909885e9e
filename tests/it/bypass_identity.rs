//! Issue 38, the ways past a spent limit that come from reading a request differently than the
//! app does, black-box: the built binary between raw clients (the bytes matter: two header
//! lines, odd Host values) and a raw upstream that records every request it gets, on the memory
//! store and on one Redis. Every case spends a limit first; the attempt past it must be refused
//! (400, or 429 when it is counted), never forwarded.
//!
//! - A bearer token beside another credential (`Basic eDp5, Bearer <token>`, two
//!   `Authorization` lines): 400, whatever `on_invalid` says.
//! - A second value for an identity: two `X-User` lines or a comma list, a cookie or a query
//!   parameter given twice: 400.
//! - A Host that is no `host[:port]` (`api.example.com:abc`, `:80:80`, `:x:y`): 400; an empty
//!   port is the host itself (counted); over HTTP/2 the same for `:authority` and `host`.
//!
//! Round three, values apps decode or trim (issue 53):
//! - a bearer token behind Unicode whitespace (`Bearer\xa0<token>`): 400; `\xa0` or `\x85`
//!   around a header identity: 400;
//! - cookie spellings apps decode (`vic%74im`, `j:"victim"`) share the value's bucket; spellings
//!   Express and Python decode differently (`"victi\155"`): 400;
//! - `user[]=`, `user[0]=` are the query parameter `user`;
//! - `form: user` reads a form body's field (bounded, forwarded as sent);
//! - tokens PyJWT accepts (a numeric-string `exp`, a duplicate `sub`) are read as it reads them.

use std::net::SocketAddr;

use crate::support::*;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn redis_store(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("500ms")
        .key_prefix("bypass-identity:")
        .on_error("deny")
}

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/identity");

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A valid RS256 token (the identity fixtures' key) naming `sub`.
fn token(sub: &str) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let private = std::fs::read(format!("{FIXTURES}/rsa_private.pem")).unwrap();
    encode(
        &Header::new(Algorithm::RS256),
        &serde_json::json!({"sub": sub, "exp": now() + 600}),
        &EncodingKey::from_rsa_pem(&private).unwrap(),
    )
    .unwrap()
}

/// The issue's setup and its relatives, each route a few requests a day:
/// - `/api/`: `user` = `[jwt, header x-user]` with `on_invalid: reject`, 3 a day;
/// - `/open/`: the same sources with the default `on_invalid: client_ip`, 3 a day;
/// - `/hdr/`, `/ck/`, `/q/`: keyed by the header `x-user`, the cookie `sid`, the query
///   parameter `key`, 2 a day;
/// - `/h` on host `api.example.com` and `/h6` on host `[::1]`: per client IP, 2 a day.
fn limited(upstream: &str, store: Store) -> Config {
    let jwt = || {
        source::jwt(
            Jwt::public_key("sub", &format!("{FIXTURES}/rsa_public.pem")).algorithm("RS256"),
        )
    };
    config()
        .upstream(upstream)
        .store(store)
        .identity("user", [jwt(), source::header("x-user")])
        .on_invalid("user", "reject")
        .identity("user_or_ip", [jwt(), source::header("x-user")])
        .identity("member", [source::header("x-user")])
        .identity("session", [source::cookie("sid")])
        .identity("keyed", [source::query("key")])
        .route(
            route("api")
                .prefix("/api/")
                .key("user")
                .limit(limit::fixed_window(3, "24h")),
        )
        .route(
            route("open")
                .prefix("/open/")
                .key("user_or_ip")
                .limit(limit::fixed_window(3, "24h")),
        )
        .route(
            route("hdr")
                .prefix("/hdr/")
                .key("member")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("ck")
                .prefix("/ck/")
                .key("session")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("q")
                .prefix("/q/")
                .key("keyed")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("hosted")
                .host("api.example.com")
                .prefix("/h")
                .key("client_ip")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("v6")
                .host("[::1]")
                .prefix("/v6")
                .key("client_ip")
                .limit(limit::fixed_window(2, "24h")),
        )
}

/// `GET target` with `lines` as its header lines (each `Name: value`), as bytes.
fn get(target: &str, lines: &[&str]) -> Vec<u8> {
    let mut request = format!("GET {target} HTTP/1.1\r\n");
    if !lines
        .iter()
        .any(|l| l.to_ascii_lowercase().starts_with("host:"))
    {
        request.push_str("Host: app.example\r\n");
    }
    for line in lines {
        request.push_str(line);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.into_bytes()
}

/// Sends `request` and asserts the status; a refusal is tollgate's problem+json.
async fn expect(served: &Served, request: &[u8], status: u16) -> RawResponse {
    let what = String::from_utf8_lossy(request).into_owned();
    let response = raw_exchange(served.addr, request).await;
    assert_eq!(response.status, status, "{what}: {}", response.body_text());
    if status == 400 || status == 429 {
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
    }
    response
}

// ---------------------------------------------------------------------------------------------
// A bearer token beside another credential

/// The token's owner spends its 3 requests on `prefix`; then every way of hiding the same token
/// beside another credential (with a fresh `X-User` the header source would key on) is 400 and
/// never reaches the app. One credential still works: a valid token of its own, the header
/// without a token, and a credential whose auth-params hold commas.
async fn a_bearer_token_beside_another_credential_is_refused(store: Store, prefix: &str) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let path = format!("{prefix}x");
    let owner = token("owner");
    let bearer = format!("Authorization: Bearer {owner}");
    for _ in 0..3 {
        expect(&served, &get(&path, &[&bearer, "X-User: anything"]), 200).await;
    }
    expect(&served, &get(&path, &[&bearer, "X-User: anything"]), 429).await;

    let hidden: Vec<Vec<String>> = vec![
        vec![format!("Authorization: Basic eDp5, Bearer {owner}")],
        vec![format!("Authorization: Basic eDp5,Bearer {owner}")],
        vec![format!("Authorization: Bearer {owner}, Basic eDp5")],
        vec![format!("Authorization: Bearer {owner}, Bearer {owner}")],
        vec![format!(
            "Authorization: Digest username=\"a, Bearer {owner}, b\""
        )],
        vec![format!("Authorization: Bearer {owner}, realm=x")],
        vec![
            "Authorization: Basic eDp5".to_owned(),
            format!("Authorization: Bearer {owner}"),
        ],
        vec![
            format!("Authorization: Bearer {owner}"),
            "Authorization: Basic eDp5".to_owned(),
        ],
        vec![
            format!("Authorization: Bearer {owner}"),
            format!("Authorization: Bearer {owner}"),
        ],
    ];
    for (i, lines) in hidden.iter().enumerate() {
        let user = format!("X-User: fresh-{i}");
        let mut lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        lines.push(&user);
        let response = expect(&served, &get(&path, &lines), 400).await;
        assert!(
            response
                .body_text()
                .contains("more than one credential in Authorization"),
            "{}",
            response.body_text()
        );
    }
    assert_eq!(
        upstream.request_lines().len(),
        3,
        "only the owner's 3 reached the app"
    );

    // One credential each: a valid token of another user, no token (the header keys), and a
    // Digest credential whose auth-params are separated by commas (not a token: the header).
    let other = format!("Authorization: Bearer {}", token("other"));
    expect(&served, &get(&path, &[&other, "X-User: anything"]), 200).await;
    expect(&served, &get(&path, &["X-User: alice"]), 200).await;
    let digest = "Authorization: Digest username=\"Mufasa\", realm=\"r@x\", nonce=\"n\", qop=auth";
    expect(&served, &get(&path, &[digest, "X-User: bob"]), 200).await;
    assert_eq!(upstream.request_lines().len(), 6);
}

#[tokio::test]
async fn a_bearer_token_beside_another_credential_is_refused_in_memory() {
    a_bearer_token_beside_another_credential_is_refused(store::memory(), "/api/").await;
}

#[tokio::test]
async fn a_bearer_token_beside_another_credential_is_refused_in_redis() {
    let redis = RedisServer::start();
    a_bearer_token_beside_another_credential_is_refused(redis_store(&redis), "/api/").await;
}

/// With `on_invalid: client_ip` too: the request is not keyed by its client IP (the app would
/// still serve the token's owner), it is refused.
#[tokio::test]
async fn a_bearer_token_beside_another_credential_is_refused_under_on_invalid_client_ip() {
    a_bearer_token_beside_another_credential_is_refused(store::memory(), "/open/").await;
}

// ---------------------------------------------------------------------------------------------
// A second value for an identity

/// `alice` spends the header route, the cookie route and the query route; then her name beside
/// a fresh one (two lines either way round, a comma list, a cookie or a parameter given twice)
/// is 400, never a fresh bucket. One value still works.
async fn a_second_identity_value_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for _ in 0..2 {
        expect(&served, &get("/hdr/x", &["X-User: alice"]), 200).await;
        expect(&served, &get("/ck/x", &["Cookie: sid=alice"]), 200).await;
        expect(&served, &get("/q/x?key=alice", &[]), 200).await;
    }
    expect(&served, &get("/hdr/x", &["X-User: alice"]), 429).await;
    expect(&served, &get("/ck/x", &["Cookie: sid=alice"]), 429).await;
    expect(&served, &get("/q/x?key=alice", &[]), 429).await;
    let forwarded = upstream.request_lines().len();
    assert_eq!(forwarded, 6);

    let twice: [(&str, &[&str], &str); 12] = [
        ("/hdr/x", &["X-User: fresh", "X-User: alice"], "header"),
        ("/hdr/x", &["X-User: alice", "X-User: fresh"], "header"),
        ("/hdr/x", &["X-User: fresh,alice"], "header"),
        ("/hdr/x", &["X-User: alice, fresh"], "header"),
        ("/hdr/x", &["X-User: alice", "X-User:"], "header"),
        ("/ck/x", &["Cookie: sid=fresh; sid=alice"], "cookie"),
        ("/ck/x", &["Cookie: sid=alice; sid=fresh"], "cookie"),
        (
            "/ck/x",
            &["Cookie: sid=fresh", "Cookie: sid=alice"],
            "cookie",
        ),
        ("/ck/x", &["Cookie: a=1; sid=; sid=alice"], "cookie"),
        ("/q/x?key=fresh&key=alice", &[], "query parameter"),
        ("/q/x?key=alice&k%65y=fresh", &[], "query parameter"),
        ("/q/x?key=&key=alice", &[], "query parameter"),
    ];
    for (target, lines, what) in twice {
        let response = expect(&served, &get(target, lines), 400).await;
        assert!(
            response.body_text().contains(what),
            "{target} {lines:?}: {}",
            response.body_text()
        );
    }
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "none reached the app"
    );

    expect(&served, &get("/hdr/x", &["X-User: bob"]), 200).await;
    expect(&served, &get("/ck/x", &["Cookie: a=1; sid=bob; b=2"]), 200).await;
    expect(
        &served,
        &get("/ck/x", &["Cookie: a=1", "Cookie: sid=carol"]),
        200,
    )
    .await;
    expect(&served, &get("/q/x?key=bob&other=1&other=2", &[]), 200).await;
    assert_eq!(upstream.request_lines().len(), forwarded + 4);
}

#[tokio::test]
async fn a_second_identity_value_is_refused_in_memory() {
    a_second_identity_value_is_refused(store::memory()).await;
}

#[tokio::test]
async fn a_second_identity_value_is_refused_in_redis() {
    let redis = RedisServer::start();
    a_second_identity_value_is_refused(redis_store(&redis)).await;
}

// ---------------------------------------------------------------------------------------------
// Host with a name for a port

/// The hosted route spent with `host:port` spellings an app serves as `api.example.com`; then
/// every Host that is no `host[:port]` is 400 (Express would serve it as `api.example.com`,
/// tollgate's old reading matched no route and forwarded it unlimited). IPv6 literals with a
/// port are read as apps read them.
async fn a_host_with_a_name_for_a_port_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    // Admitted, and forwarded with the Host as sent.
    expect(&served, &get("/h", &["Host: api.example.com:8080"]), 200).await;
    assert!(
        upstream
            .heads()
            .last()
            .unwrap()
            .iter()
            .any(|l| l.eq_ignore_ascii_case("host: api.example.com:8080")),
        "{:?}",
        upstream.heads()
    );
    expect(&served, &get("/h", &["Host: api.example.com"]), 200).await;
    for counted in [
        "api.example.com",
        "api.example.com:8080",
        "api.example.com:",
        "API.example.com.:80",
    ] {
        expect(&served, &get("/h", &[&format!("Host: {counted}")]), 429).await;
    }
    for odd in [
        "api.example.com:abc",
        "api.example.com:80:80",
        "api.example.com:x:y",
        "api.example.com:80abc",
        "api.example.com/h",
        ":80",
    ] {
        let response = expect(&served, &get("/h", &[&format!("Host: {odd}")]), 400).await;
        assert!(response.body_text().contains("Host"), "{odd}");
    }
    // An absolute-form target names the host too.
    expect(
        &served,
        b"GET http://api.example.com:abc/h HTTP/1.1\r\nHost: api.example.com:abc\r\n\r\n",
        400,
    )
    .await;

    // IPv6 literals: `[::1]:8080` is `[::1]`; a name for its port is refused.
    expect(&served, &get("/v6", &["Host: [::1]:8080"]), 200).await;
    expect(&served, &get("/v6", &["Host: [::1]"]), 200).await;
    expect(&served, &get("/v6", &["Host: [::1]:8080"]), 429).await;
    for odd in ["[::1]:abc", "[::1]:80:80", "::1", "[::1"] {
        expect(&served, &get("/v6", &[&format!("Host: {odd}")]), 400).await;
    }
    // Another host is no business of the route.
    expect(&served, &get("/h", &["Host: other.example:8080"]), 200).await;
    assert_eq!(upstream.request_lines().len(), 5);
}

#[tokio::test]
async fn a_host_with_a_name_for_a_port_is_refused_in_memory() {
    a_host_with_a_name_for_a_port_is_refused(store::memory()).await;
}

#[tokio::test]
async fn a_host_with_a_name_for_a_port_is_refused_in_redis() {
    let redis = RedisServer::start();
    a_host_with_a_name_for_a_port_is_refused(redis_store(&redis)).await;
}

/// One HTTP/2 (prior knowledge) request for `uri`, with `headers`: its status.
async fn h2_status(addr: SocketAddr, uri: &str, headers: &[(&str, &str)]) -> u16 {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{uri} {headers:?}: {e}"));
    response.status().as_u16()
}

/// The same over HTTP/2: `:authority` (and a `host` field, which HTTP/2 clients may send too)
/// read as `host[:port]`; a name for a port is 400.
async fn an_authority_with_a_name_for_a_port_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let addr = served.addr;
    assert_eq!(
        h2_status(addr, "http://api.example.com:8080/h", &[]).await,
        200
    );
    assert_eq!(h2_status(addr, "http://api.example.com/h", &[]).await, 200);
    for counted in ["http://api.example.com:8080/h", "http://api.example.com:/h"] {
        assert_eq!(h2_status(addr, counted, &[]).await, 429, "{counted}");
    }
    assert_eq!(
        h2_status(addr, "http://api.example.com:abc/h", &[]).await,
        400
    );
    for host in [
        "api.example.com:80:80",
        "api.example.com:x:y",
        "api.example.com:abc",
    ] {
        assert_eq!(
            h2_status(addr, "http://api.example.com/h", &[("host", host)]).await,
            400,
            "host: {host}"
        );
    }
    assert_eq!(h2_status(addr, "http://[::1]:8080/v6", &[]).await, 200);
    assert_eq!(h2_status(addr, "http://[::1]:abc/v6", &[]).await, 400);
    assert_eq!(upstream.request_lines().len(), 3);
}

#[tokio::test]
async fn an_authority_with_a_name_for_a_port_is_refused_in_memory() {
    an_authority_with_a_name_for_a_port_is_refused(store::memory()).await;
}

#[tokio::test]
async fn an_authority_with_a_name_for_a_port_is_refused_in_redis() {
    let redis = RedisServer::start();
    an_authority_with_a_name_for_a_port_is_refused(redis_store(&redis)).await;
}

// ---------------------------------------------------------------------------------------------
// Round three: values apps decode or trim that a plain reading does not

/// `GET target` with `lines` as raw header lines: the bytes matter (a Latin-1 `\xa0`, UTF-8).
fn get_raw(target: &str, lines: &[&[u8]]) -> Vec<u8> {
    let mut request = format!("GET {target} HTTP/1.1\r\nHost: app.example\r\n").into_bytes();
    for line in lines {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    request
}

/// The token's owner spends `/open/` (`on_invalid: client_ip`, the default); then the same
/// token behind Unicode whitespace (a Latin-1 `\xa0` or `\x85` byte, UTF-8 U+00A0 or U+2003),
/// which Python's `split()`/`strip()` and JS's `trim()` read as whitespace, beside a fresh
/// `X-User` the header source would key on, is 400 and never reaches the app. ASCII spellings
/// of the one credential are read as before.
async fn a_bearer_token_hidden_by_unicode_whitespace_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let owner = token("owner");
    let bearer = format!("Authorization: Bearer {owner}");
    for _ in 0..3 {
        expect(
            &served,
            &get("/open/x", &[&bearer, "X-User: anything"]),
            200,
        )
        .await;
    }
    expect(
        &served,
        &get("/open/x", &[&bearer, "X-User: anything"]),
        429,
    )
    .await;

    let hidden: Vec<Vec<u8>> = [
        (&b"Bearer\xa0"[..], &b""[..]),
        (b"\xa0Bearer ", b""),
        (b"Bearer\x85", b""),
        (b"Bearer\xc2\xa0", b""),
        (b"\xc2\xa0Bearer ", b""),
        (b"Bearer\xe2\x80\x83", b""),
        (b"Bearer \xa0", b""),
        (b"Bearer ", b"\xa0"),
        (b"Bearer ", b"\x85"),
    ]
    .iter()
    .map(|(before, after)| [&b"Authorization: "[..], before, owner.as_bytes(), after].concat())
    .collect();
    for (i, line) in hidden.iter().enumerate() {
        let user = format!("X-User: fresh-{i}");
        let response = expect(&served, &get_raw("/open/x", &[line, user.as_bytes()]), 400).await;
        assert!(
            response.body_text().contains("outside ASCII"),
            "{}",
            response.body_text()
        );
    }
    assert_eq!(upstream.request_lines().len(), 3, "only the owner's 3");

    // ASCII whitespace around the one credential: the owner's token, counted.
    for spelling in ["bearer  {t}", "Bearer\t{t}", "BEARER {t} "] {
        let line = format!("Authorization: {}", spelling.replace("{t}", &owner));
        expect(&served, &get("/open/x", &[&line, "X-User: fresh"]), 429).await;
    }
    // Another caller without a token is keyed by its header as before.
    expect(&served, &get("/open/x", &["X-User: alice"]), 200).await;
    assert_eq!(upstream.request_lines().len(), 4);
}

#[tokio::test]
async fn a_bearer_token_hidden_by_unicode_whitespace_is_refused_in_memory() {
    a_bearer_token_hidden_by_unicode_whitespace_is_refused(store::memory()).await;
}

#[tokio::test]
async fn a_bearer_token_hidden_by_unicode_whitespace_is_refused_in_redis() {
    let redis = RedisServer::start();
    a_bearer_token_hidden_by_unicode_whitespace_is_refused(redis_store(&redis)).await;
}

/// `victim` spends `/ck/` (cookie `sid`, 2 a day). Every spelling an app decodes to `victim`
/// (percent escapes and Express's `j:` JSON cookies, as cookie-parser reads them; quotes) is
/// counted against her bucket: 429. Spellings apps decode differently from each other (a
/// backslash escape in quotes, which Python decodes and Express does not; an unbalanced quote;
/// a `j:` value that is no JSON string; Unicode whitespace JS and Python trim) are 400. None
/// reaches the app; a plain other caller still works, and shares its bucket with its spellings.
async fn a_cookie_value_apps_decode_is_keyed_decoded(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for _ in 0..2 {
        expect(&served, &get("/ck/x", &["Cookie: sid=victim"]), 200).await;
    }
    for spelling in [
        "sid=victim",
        "sid=vic%74im",
        "sid=%76%69%63%74%69%6D",
        "sid=\"vic%74im\"",
        "sid=\"victim\"",
        "sid=j:\"victim\"",
        "sid=j:\"victi\\u006d\"",
        "sid=j%3A%22victim%22",
        "sid=j: \"victim\" ",
        "a=1; sid=victim ; b=2",
    ] {
        expect(
            &served,
            &get("/ck/x", &[&format!("Cookie: {spelling}")]),
            429,
        )
        .await;
    }
    let forwarded = upstream.request_lines().len();
    assert_eq!(forwarded, 2);

    let refused: [&[u8]; 11] = [
        b"Cookie: sid=\"victi\\155\"",
        b"Cookie: sid=\"victim",
        b"Cookie: sid=\"victim\\\"\"",
        b"Cookie: sid=j:{\"u\":\"victim\"}",
        b"Cookie: sid=j:[\"victim\"]",
        b"Cookie: sid=j:victim",
        b"Cookie: sid=j%3A7",
        b"Cookie: sid=victim\xa0",
        b"Cookie: sid=\x85victim",
        b"Cookie: \xa0sid=victim",
        b"Cookie: sid\xa0=victim",
    ];
    for line in refused {
        let response = expect(&served, &get_raw("/ck/x", &[line]), 400).await;
        assert!(
            response.body_text().contains("decode it differently"),
            "{}: {}",
            String::from_utf8_lossy(line),
            response.body_text()
        );
    }
    // Unicode whitespace cannot hide a second value either.
    let response = expect(
        &served,
        &get_raw("/ck/x", &[b"Cookie: sid=fresh; \xa0sid=victim"]),
        400,
    )
    .await;
    assert!(response.body_text().contains("more than once"));
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "none reached the app"
    );

    // Another caller: its spellings share one bucket of 2.
    expect(&served, &get("/ck/x", &["Cookie: sid=bob"]), 200).await;
    expect(
        &served,
        &get("/ck/x", &["Cookie: sid=j%3A%22b%6Fb%22"]),
        200,
    )
    .await;
    expect(&served, &get("/ck/x", &["Cookie: sid=\"bob\""]), 429).await;
    // An escape that does not decode (`decodeURIComponent` fails, Express keeps the value):
    // the value as sent.
    expect(&served, &get("/ck/x", &["Cookie: sid=vic%ff"]), 200).await;
    assert_eq!(upstream.request_lines().len(), forwarded + 3);
}

#[tokio::test]
async fn a_cookie_value_apps_decode_is_keyed_decoded_in_memory() {
    a_cookie_value_apps_decode_is_keyed_decoded(store::memory()).await;
}

#[tokio::test]
async fn a_cookie_value_apps_decode_is_keyed_decoded_in_redis() {
    let redis = RedisServer::start();
    a_cookie_value_apps_decode_is_keyed_decoded(redis_store(&redis)).await;
}

/// `victim` spends `/q/` (query parameter `key`, 2 a day). The bracket and indexed forms
/// Express's query parser (and PHP) read as that parameter (`key[]=victim`, `key[0]=victim`,
/// `key%5B%5D=victim`) are counted against her bucket: 429. Two values in any mix of forms,
/// and a bracket form that is a structure (`key[a]=`), are 400, never forwarded.
async fn a_query_parameter_in_bracket_form_is_that_parameter(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for _ in 0..2 {
        expect(&served, &get("/q/x?key=victim", &[]), 200).await;
    }
    for target in [
        "/q/x?key=victim",
        "/q/x?key[]=victim",
        "/q/x?key[0]=victim",
        "/q/x?key[7]=victim",
        "/q/x?key%5B%5D=victim",
        "/q/x?k%65y%5b0%5d=victim",
        "/q/x?other=1&key[]=victim&keys[]=x",
    ] {
        expect(&served, &get(target, &[]), 429).await;
    }
    let forwarded = upstream.request_lines().len();
    assert_eq!(forwarded, 2);
    for target in [
        "/q/x?key[]=victim&key=fresh",
        "/q/x?key=fresh&key%5B%5D=victim",
        "/q/x?key[]=fresh&key[]=victim",
        "/q/x?key[0]=fresh&key[1]=victim",
        "/q/x?key[a]=victim",
        "/q/x?key[][x]=victim",
        "/q/x?key%5Bu%5D=victim",
    ] {
        let response = expect(&served, &get(target, &[]), 400).await;
        assert!(
            response.body_text().contains("query parameter"),
            "{target}: {}",
            response.body_text()
        );
    }
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "none reached the app"
    );
    // Another caller in bracket form, then plain: one bucket.
    expect(&served, &get("/q/x?key[]=bob", &[]), 200).await;
    expect(&served, &get("/q/x?key=bob", &[]), 200).await;
    expect(&served, &get("/q/x?key%5B0%5D=bob", &[]), 429).await;
    assert_eq!(upstream.request_lines().len(), forwarded + 2);
}

#[tokio::test]
async fn a_query_parameter_in_bracket_form_is_that_parameter_in_memory() {
    a_query_parameter_in_bracket_form_is_that_parameter(store::memory()).await;
}

#[tokio::test]
async fn a_query_parameter_in_bracket_form_is_that_parameter_in_redis() {
    let redis = RedisServer::start();
    a_query_parameter_in_bracket_form_is_that_parameter(redis_store(&redis)).await;
}

/// `/post/`: keyed by the form field `user` (`form: user`), 2 a day; `/other/`: keyed by the
/// query parameter `user` (no form field: its bodies are never read), 2 a day.
fn forms(upstream: &str, store: Store) -> Config {
    config()
        .upstream(upstream)
        .store(store)
        .identity("poster", [source::form("user")])
        .identity("asker", [source::query("user")])
        .route(
            route("post")
                .prefix("/post/")
                .key("poster")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("other")
                .prefix("/other/")
                .key("asker")
                .limit(limit::fixed_window(2, "24h")),
        )
}

/// `POST target` with a body of `content_type`, framed by Content-Length.
fn post(target: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: app.example\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body].concat()
}

/// The same, chunked: one chunk.
fn post_chunked(target: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: app.example\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    );
    [head.as_bytes(), body, b"\r\n0\r\n\r\n"].concat()
}

const FORM: &str = "application/x-www-form-urlencoded";

/// Whether `needle` occurs in `haystack` (what the upstream received, over its connections).
fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Tomcat's `getParameter("user")` reads `user=victim` from a form body. `victim` spends
/// `/post/` through the body; every spelling of her field (bracket forms, percent escapes,
/// chunked framing, a charset parameter) is counted against her bucket: 429. Two values are
/// 400, a body past 64 KiB 413, none forwarded; the bodies forwarded are the bytes sent. A
/// route that reads no form field never reads the body: a large one streams through.
async fn a_form_body_field_is_an_identity(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&forms(&upstream.url(), store)).await;
    for body in [
        &b"user=victim&note=a+b"[..],
        b"note=%F0%9F%99%82&user=victim",
    ] {
        expect(&served, &post("/post/x", FORM, body), 200).await;
        let received = upstream.received();
        assert!(
            holds(&received, &[b"\r\n\r\n", body].concat()),
            "forwarded as sent: {:?}",
            String::from_utf8_lossy(&received)
        );
    }
    for request in [
        post("/post/x", FORM, b"user=victim"),
        post("/post/x", FORM, b"user[]=victim"),
        post("/post/x", FORM, b"x=1&us%65r%5B0%5D=vic%74im"),
        post(
            "/post/x",
            "Application/X-WWW-Form-Urlencoded; charset=UTF-8",
            b"user=victim",
        ),
        post_chunked("/post/x", FORM, b"user=victim&z=1"),
    ] {
        expect(&served, &request, 429).await;
    }
    let forwarded = upstream.request_lines().len();
    assert_eq!(forwarded, 2);
    for body in [
        &b"user=fresh&user=victim"[..],
        b"user[]=victim&user=fresh",
        b"user[a]=victim",
    ] {
        let response = expect(&served, &post("/post/x", FORM, body), 400).await;
        assert!(
            response.body_text().contains("form field"),
            "{}",
            response.body_text()
        );
    }
    let big = [&b"user=fresh&pad="[..], &vec![b'a'; 70_000]].concat();
    for request in [
        post("/post/x", FORM, &big),
        post_chunked("/post/x", FORM, &big),
    ] {
        let response = raw_exchange(served.addr, &request).await;
        assert_eq!(response.status, 413, "{}", response.body_text());
        assert!(
            response.body_text().contains("65536"),
            "{}",
            response.body_text()
        );
    }
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "none reached the app"
    );

    // Another caller, chunked: read, and forwarded with the same bytes.
    expect(&served, &post_chunked("/post/x", FORM, b"user=bob"), 200).await;
    assert!(holds(&upstream.received(), b"\r\n\r\nuser=bob"));
    // A body that is no form is not read: the caller has no field (its client IP keys it).
    expect(
        &served,
        &post("/post/x", "application/json", b"{\"user\":\"victim\"}"),
        200,
    )
    .await;
    // A route that names no form field streams any body through unread.
    expect(&served, &post("/other/x?user=carol", FORM, &big), 200).await;
    assert!(holds(
        &upstream.received(),
        &[&b"\r\n\r\n"[..], &big].concat()
    ));
    assert_eq!(upstream.request_lines().len(), forwarded + 3);
}

#[tokio::test]
async fn a_form_body_field_is_an_identity_in_memory() {
    a_form_body_field_is_an_identity(store::memory()).await;
}

#[tokio::test]
async fn a_form_body_field_is_an_identity_in_redis() {
    let redis = RedisServer::start();
    a_form_body_field_is_an_identity(redis_store(&redis)).await;
}

/// `alice` spends `/hdr/` (header `X-User`, 2 a day); then her name with a Latin-1 `\xa0` or
/// `\x85` around it, which Python's `strip()` and JS's `trim()` drop, is 400, never a fresh
/// bucket, never forwarded.
async fn a_header_value_in_unicode_whitespace_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    for _ in 0..2 {
        expect(&served, &get("/hdr/x", &["X-User: alice"]), 200).await;
    }
    expect(&served, &get("/hdr/x", &["X-User: alice"]), 429).await;
    for line in [
        &b"X-User: alice\xa0"[..],
        b"X-User: \xa0alice",
        b"X-User: alice\x85",
        b"X-User: \x85 alice \xa0",
    ] {
        let response = expect(&served, &get_raw("/hdr/x", &[line]), 400).await;
        assert!(
            response.body_text().contains("Unicode whitespace"),
            "{}",
            response.body_text()
        );
    }
    assert_eq!(upstream.request_lines().len(), 2, "none reached the app");
}

#[tokio::test]
async fn a_header_value_in_unicode_whitespace_is_refused_in_memory() {
    a_header_value_in_unicode_whitespace_is_refused(store::memory()).await;
}

#[tokio::test]
async fn a_header_value_in_unicode_whitespace_is_refused_in_redis() {
    let redis = RedisServer::start();
    a_header_value_in_unicode_whitespace_is_refused(redis_store(&redis)).await;
}

/// A token of `payload` (raw JSON text: a member twice, a string where a number belongs)
/// signed RS256 with the identity fixtures' key.
fn raw_token(payload: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use jsonwebtoken::{Algorithm, EncodingKey};
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let private = std::fs::read(format!("{FIXTURES}/rsa_private.pem")).unwrap();
    let signature = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &EncodingKey::from_rsa_pem(&private).unwrap(),
        Algorithm::RS256,
    )
    .unwrap();
    format!("{message}.{signature}")
}

/// The owner spends `/open/` (`on_invalid: client_ip`); then tokens PyJWT (flask-jwt-extended)
/// accepts for the owner and jsonwebtoken's strict reading refused (a numeric-string `exp`, a
/// duplicate `sub` whose last is the owner's, a padded signature), beside a fresh `X-User`,
/// are the owner's: 429, never a bucket per address. An expired one is still refused: 401
/// under `on_invalid: reject`.
async fn a_token_the_app_accepts_is_read_as_it_reads_it(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&limited(&upstream.url(), store)).await;
    let bearer = format!("Authorization: Bearer {}", token("owner"));
    for _ in 0..3 {
        expect(
            &served,
            &get("/open/x", &[&bearer, "X-User: anything"]),
            200,
        )
        .await;
    }
    expect(
        &served,
        &get("/open/x", &[&bearer, "X-User: anything"]),
        429,
    )
    .await;
    let exp = now() + 600;
    let padded = format!("{}=", token("owner"));
    let tokens = [
        raw_token(&format!(r#"{{"sub":"owner","exp":"{exp}"}}"#)),
        raw_token(&format!(r#"{{"sub":"fresh","exp":{exp},"sub":"owner"}}"#)),
        raw_token(&format!(
            r#"{{"sub":"owner","exp":"{exp}","nbf":"{}"}}"#,
            now() - 5
        )),
        padded,
    ];
    for (i, t) in tokens.iter().enumerate() {
        let line = format!("Authorization: Bearer {t}");
        let user = format!("X-User: fresh-{i}");
        expect(&served, &get("/open/x", &[&line, &user]), 429).await;
    }
    assert_eq!(upstream.request_lines().len(), 3, "only the owner's 3");
    let expired = raw_token(&format!(r#"{{"sub":"owner","exp":"{}"}}"#, now() - 60));
    let line = format!("Authorization: Bearer {expired}");
    expect(&served, &get("/api/x", &[&line, "X-User: fresh"]), 401).await;
}

#[tokio::test]
async fn a_token_the_app_accepts_is_read_as_it_reads_it_in_memory() {
    a_token_the_app_accepts_is_read_as_it_reads_it(store::memory()).await;
}

#[tokio::test]
async fn a_token_the_app_accepts_is_read_as_it_reads_it_in_redis() {
    let redis = RedisServer::start();
    a_token_the_app_accepts_is_read_as_it_reads_it(redis_store(&redis)).await;
}

/// A form body read to identify its caller is read within `header_read_timeout`, like a head:
/// a client that sends part of it and stops is answered 400 once the timeout has passed (not
/// before), and nothing reaches the app.
#[tokio::test]
async fn a_form_body_that_stops_arriving_is_refused_after_the_header_read_timeout() {
    let redis = RedisServer::start();
    let upstream = raw_upstream().await;
    let served =
        serve(&forms(&upstream.url(), redis_store(&redis)).header_read_timeout("1s")).await;
    let partial = format!(
        "POST /post/x HTTP/1.1\r\nHost: app.example\r\nContent-Type: {FORM}\r\nContent-Length: 11\r\n\r\nuser=vic"
    );
    let started = std::time::Instant::now();
    let response = raw_exchange(served.addr, partial.as_bytes()).await;
    assert_eq!(response.status, 400, "{}", response.body_text());
    assert!(
        response.body_text().contains("header_read_timeout"),
        "{}",
        response.body_text()
    );
    // timeout under test: header_read_timeout 1s (a lower bound)
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert!(upstream.request_lines().is_empty());
}
