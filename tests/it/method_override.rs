//! Issue 38, black-box: a request that names another method in a method-override header (or a
//! route's `_method` query field) is counted as that method too, because apps behind Express's
//! method-override, Symfony, Laravel or Rails serve it as that method. The binary between a
//! raw client and a raw upstream, on the memory store and on one Redis.
//!
//! - `POST /report` + `X-HTTP-Method-Override: GET` once `GET /report` is spent: 429, in each
//!   of the three header spellings and in any case, never reaching the upstream.
//! - A request counts against every route either method matches, and against each once.
//! - `method_override: false` turns it off on a route; `{ query: _method }` reads the field.

use crate::support::*;

/// Routes on `/report`: `report` (GET, 3 a minute), `writes` (POST, 3 a minute); `both` (GET
/// and POST on `/both`, 3); `plain` (GET on `/plain`, 2, `method_override: false`); `form`
/// (DELETE on `/items`, 2, reading `_method` from the query and no header). Each keyed by
/// `X-User`.
fn routes(upstream: &str, store: Store) -> Config {
    config()
        .upstream(upstream)
        .store(store)
        .identity("user", [source::header("x-user")])
        .route(
            route("report")
                .prefix("/report")
                .methods(["GET"])
                .key("user")
                .limit(limit::fixed_window(3, "1h")),
        )
        .route(
            route("writes")
                .prefix("/report")
                .methods(["POST"])
                .key("user")
                .limit(limit::fixed_window(3, "1h")),
        )
        .route(
            route("both")
                .prefix("/both")
                .methods(["GET", "POST"])
                .key("user")
                .limit(limit::fixed_window(3, "1h")),
        )
        .route(
            route("plain")
                .prefix("/plain")
                .methods(["GET"])
                .key("user")
                .set("method_override", false)
                .limit(limit::fixed_window(2, "1h")),
        )
        .route(
            route("form")
                .prefix("/items")
                .methods(["DELETE"])
                .key("user")
                .set(
                    "method_override",
                    serde_json::json!({ "headers": false, "query": "_method" }),
                )
                .limit(limit::fixed_window(2, "1h")),
        )
}

fn redis_store(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("500ms")
        .key_prefix("override:")
        .on_error("deny")
}

/// `method target` as `user`, with `extra` header lines.
async fn send(served: &Served, method: &str, target: &str, user: &str, extra: &str) -> RawResponse {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: app.example\r\nX-User: {user}\r\n{extra}Content-Length: 0\r\n\r\n"
    );
    raw_exchange(served.addr, request.as_bytes()).await
}

/// The issue: `GET /report` spent, then `POST /report` naming GET in an override is refused,
/// whatever the header and the case of the method; nothing more reaches the app.
async fn an_override_to_a_spent_method_is_refused(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&routes(&upstream.url(), store)).await;
    for i in 0..3 {
        let r = send(&served, "GET", "/report", "alice", "").await;
        assert_eq!(r.status, 200, "GET #{i}");
    }
    assert_eq!(
        send(&served, "GET", "/report", "alice", "").await.status,
        429
    );
    let forwarded = upstream.request_lines().len();
    for header in [
        "X-HTTP-Method-Override: GET",
        "X-HTTP-Method: GET",
        "X-Method-Override: GET",
        "x-http-method-override: get",
        "X-HTTP-Method-Override: GET, POST",
        "X-HTTP-Method-Override: PUT\r\nX-HTTP-Method-Override: GET",
    ] {
        let r = send(
            &served,
            "POST",
            "/report",
            "alice",
            &format!("{header}\r\n"),
        )
        .await;
        assert_eq!(
            r.status,
            429,
            "POST /report with {header:?}: {}",
            r.body_text()
        );
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.header("retry-after").is_some(), "{header:?}");
    }
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "no override of a spent GET reached the app"
    );
    // A plain POST is the writes route's: still answered.
    assert_eq!(
        send(&served, "POST", "/report", "alice", "").await.status,
        200
    );
}

#[tokio::test]
async fn an_override_to_a_spent_method_is_refused_in_memory() {
    an_override_to_a_spent_method_is_refused(store::memory()).await;
}

#[tokio::test]
async fn an_override_to_a_spent_method_is_refused_in_redis() {
    let redis = RedisServer::start();
    an_override_to_a_spent_method_is_refused(redis_store(&redis)).await;
}

/// An override request counts against the route of its own method and the route of the one
/// it names, once each; when both methods match one route, once.
async fn an_override_counts_against_each_route_once(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&routes(&upstream.url(), store)).await;
    let get = "X-HTTP-Method-Override: GET\r\n";
    // One POST naming GET: one of `report`'s 3 and one of `writes`' 3.
    assert_eq!(
        send(&served, "POST", "/report", "bob", get).await.status,
        200
    );
    for i in 0..2 {
        assert_eq!(
            send(&served, "GET", "/report", "bob", "").await.status,
            200,
            "GET #{i}"
        );
    }
    assert_eq!(
        send(&served, "GET", "/report", "bob", "").await.status,
        429,
        "report spent"
    );
    for i in 0..2 {
        assert_eq!(
            send(&served, "POST", "/report", "bob", "").await.status,
            200,
            "POST #{i}"
        );
    }
    assert_eq!(
        send(&served, "POST", "/report", "bob", "").await.status,
        429,
        "writes spent"
    );

    // Both methods on one route: counted once (3 pass, the 4th is refused).
    for i in 0..3 {
        let r = send(&served, "POST", "/both", "carol", get).await;
        assert_eq!(r.status, 200, "POST /both naming GET #{i}");
    }
    assert_eq!(
        send(&served, "POST", "/both", "carol", get).await.status,
        429
    );

    // Only the named method has a route: it is the request's route.
    for i in 0..3 {
        let r = send(&served, "PUT", "/report", "dave", get).await;
        assert_eq!(r.status, 200, "PUT naming GET #{i}");
    }
    assert_eq!(
        send(&served, "PUT", "/report", "dave", get).await.status,
        429
    );
    assert_eq!(
        send(&served, "GET", "/report", "dave", "").await.status,
        429
    );
}

#[tokio::test]
async fn an_override_counts_against_each_route_once_in_memory() {
    an_override_counts_against_each_route_once(store::memory()).await;
}

#[tokio::test]
async fn an_override_counts_against_each_route_once_in_redis() {
    let redis = RedisServer::start();
    an_override_counts_against_each_route_once(redis_store(&redis)).await;
}

/// `method_override: false` leaves a route to its own method; `{ headers: false, query:
/// _method }` reads the query field and no header.
async fn method_override_is_configured_per_route(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&routes(&upstream.url(), store)).await;
    for _ in 0..2 {
        assert_eq!(send(&served, "GET", "/plain", "erin", "").await.status, 200);
    }
    assert_eq!(send(&served, "GET", "/plain", "erin", "").await.status, 429);
    let r = send(
        &served,
        "POST",
        "/plain",
        "erin",
        "X-HTTP-Method-Override: GET\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "off: the override is not the route's");

    for _ in 0..2 {
        assert_eq!(
            send(&served, "DELETE", "/items/1", "erin", "").await.status,
            200
        );
    }
    assert_eq!(
        send(&served, "DELETE", "/items/1", "erin", "").await.status,
        429
    );
    for target in ["/items/1?_method=DELETE", "/items/1?x=1&_method=delete"] {
        let r = send(&served, "POST", target, "erin", "").await;
        assert_eq!(r.status, 429, "POST {target}: {}", r.body_text());
    }
    let r = send(
        &served,
        "POST",
        "/items/1",
        "erin",
        "X-HTTP-Method-Override: DELETE\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "this route reads no header");
}

#[tokio::test]
async fn method_override_is_configured_per_route_in_memory() {
    method_override_is_configured_per_route(store::memory()).await;
}

#[tokio::test]
async fn method_override_is_configured_per_route_in_redis() {
    let redis = RedisServer::start();
    method_override_is_configured_per_route(redis_store(&redis)).await;
}

/// A route reached only through an override holds and settles what the request owes it like
/// its own route: a concurrency slot until the answer, and `count_statuses` decided by the
/// answer (a 200 gives the unit back, a 500 keeps it).
async fn a_route_reached_by_an_override_holds_and_settles(store: Store) {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .store(store)
        .identity("user", [source::header("x-user")])
        .route(
            route("reads")
                .prefix("/respond")
                .methods(["GET"])
                .key("user")
                .limit(limit::concurrency(1).name("slots"))
                .limit(
                    limit::fixed_window(1, "1h")
                        .name("failures")
                        .count_statuses([500]),
                ),
        )
        .route(
            route("writes")
                .prefix("/respond")
                .methods(["POST"])
                .key("user")
                .limit(limit::fixed_window(100, "1h")),
        );
    let served = serve(&config).await;
    let base = served.url("");
    // Read to the end of the body (the slot is given back before its last frame).
    let call = |method: &'static str, target: &'static str, named: Option<&'static str>| {
        let url = format!("{base}{target}");
        async move {
            let mut request = http::Request::builder()
                .method(method)
                .uri(url)
                .header("x-user", "u");
            if let Some(named) = named {
                request = request.header("x-http-method-override", named);
            }
            let response = http1_client()
                .request(request.body(body("")).unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, text(response).await)
        }
    };
    // A slow POST naming GET holds the GET route's slot until it is answered.
    let slow = tokio::spawn(call("POST", "/respond?ms=800", Some("GET")));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, text) = call("GET", "/respond", None).await;
    assert_eq!(status, 429, "the slot is held: {text}");
    assert_eq!(slow.await.unwrap().0, 200);
    // Answered 200: the slot is back and the failure unit given back.
    for i in 0..3 {
        let (status, text) = call("POST", "/respond", Some("GET")).await;
        assert_eq!(status, 200, "POST naming GET #{i}: {text}");
    }
    assert_eq!(call("GET", "/respond", None).await.0, 200);
    // Answered 500: the failure counts on the GET route.
    assert_eq!(
        call("POST", "/respond?status=500", Some("GET")).await.0,
        500
    );
    let (status, text) = call("GET", "/respond", None).await;
    assert_eq!(status, 429, "the failure was counted: {text}");
}

#[tokio::test]
async fn a_route_reached_by_an_override_holds_and_settles_in_memory() {
    a_route_reached_by_an_override_holds_and_settles(store::memory()).await;
}

#[tokio::test]
async fn a_route_reached_by_an_override_holds_and_settles_in_redis() {
    let redis = RedisServer::start();
    a_route_reached_by_an_override_holds_and_settles(redis_store(&redis)).await;
}

/// `method target` as `user`, with `extra` raw header lines (each ending `\r\n`).
async fn send_raw(
    served: &Served,
    method: &str,
    target: &str,
    user: &str,
    extra: &[u8],
) -> RawResponse {
    let head = format!("{method} {target} HTTP/1.1\r\nHost: app.example\r\nX-User: {user}\r\n");
    let request = [head.as_bytes(), extra, b"Content-Length: 0\r\n\r\n"].concat();
    raw_exchange(served.addr, &request).await
}

/// `GET /report` spent; then an override naming GET behind Unicode whitespace, which
/// method-override's `trim()` drops (a Latin-1 `\xa0` byte in the header, UTF-8 U+00A0 or
/// U+2003 in a decoded `_method` field), still names GET: 429, never forwarded.
async fn an_override_behind_unicode_whitespace_names_its_method(store: Store) {
    let upstream = raw_upstream().await;
    let served = serve(&routes(&upstream.url(), store)).await;
    for i in 0..3 {
        let r = send(&served, "GET", "/report", "erin", "").await;
        assert_eq!(r.status, 200, "GET #{i}");
    }
    for i in 0..2 {
        let r = send(&served, "DELETE", "/items", "erin", "").await;
        assert_eq!(r.status, 200, "DELETE #{i}");
    }
    let forwarded = upstream.request_lines().len();
    for header in [
        &b"X-HTTP-Method-Override: GET\xa0\r\n"[..],
        b"X-HTTP-Method-Override: \xa0GET\r\n",
        b"X-HTTP-Method: GET\x85\r\n",
        b"X-Method-Override: \xa0get\xa0, PUT\r\n",
    ] {
        let r = send_raw(&served, "POST", "/report", "erin", header).await;
        assert_eq!(
            r.status,
            429,
            "POST /report with {:?}: {}",
            String::from_utf8_lossy(header),
            r.body_text()
        );
    }
    for target in [
        "/items?_method=DELETE%C2%A0",
        "/items?_method=%E2%80%83delete",
        "/items?_method=%EF%BB%BFDELETE",
    ] {
        let r = send(&served, "POST", target, "erin", "").await;
        assert_eq!(r.status, 429, "POST {target}: {}", r.body_text());
    }
    assert_eq!(
        upstream.request_lines().len(),
        forwarded,
        "no override of a spent method reached the app"
    );
}

#[tokio::test]
async fn an_override_behind_unicode_whitespace_names_its_method_in_memory() {
    an_override_behind_unicode_whitespace_names_its_method(store::memory()).await;
}

#[tokio::test]
async fn an_override_behind_unicode_whitespace_names_its_method_in_redis() {
    let redis = RedisServer::start();
    an_override_behind_unicode_whitespace_names_its_method(redis_store(&redis)).await;
}
