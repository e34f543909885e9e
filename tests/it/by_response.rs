//! Limits that see the response, through real proxies, a real upstream and a real Redis:
//! `count_statuses` (only failed logins use a login limit, exactly, even in a burst and across
//! two proxies) and `cost_from_response` (a token budget charged what the upstream reports in
//! a header or a trailer, with the refusals and Retry-After the arithmetic predicts).

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

/// `config` with its limits in memory, or in a Redis server.
fn with_store(config: Config, redis: Option<&RedisServer>) -> Config {
    match redis {
        None => config,
        Some(redis) => config.store(store::redis(&redis.url()).timeout("500ms").on_error("deny")),
    }
}

/// An admin listener, users by `x-user`, and `route` on `/respond` keyed by them.
fn per_user(up_url: &str, route: Route) -> Config {
    config()
        .upstream(up_url)
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(route.prefix("/respond").key("user"))
}

/// Failed logins: 5 an hour per user.
fn login(up_url: &str) -> Config {
    per_user(
        up_url,
        route("login").limit(limit::fixed_window(5, "1h").count_statuses([401])),
    )
}

/// Sends one request and reads the whole body; returns the status and the headers.
async fn send(addr: SocketAddr, path: &str, user: &str) -> (StatusCode, http::HeaderMap) {
    let request = Request::get(format!("http://{addr}{path}"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    (status, headers)
}

/// 100 concurrent failed logins spread over `proxies`: the statuses the clients saw.
async fn burst(proxies: &[SocketAddr], user: &str) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let addr = proxies[i % proxies.len()];
            let user = user.to_string();
            tokio::spawn(async move { send(addr, "/respond?status=401&ms=300", &user).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

fn count(statuses: &[StatusCode], status: u16) -> usize {
    statuses.iter().filter(|s| s.as_u16() == status).count()
}

/// A burst of failed logins admits exactly the limit (reservations block the rest); then
/// successful logins never use the limit, and failures are counted again.
async fn failed_logins(redis: Option<&RedisServer>, proxies: usize) {
    let up = upstream().start().await;
    let yaml = with_store(login(&up.url()), redis);
    let mut handles = Vec::new();
    for _ in 0..proxies {
        let handle = proxy(&yaml).start().await;
        handle.wait_ready().await;
        handles.push(handle);
    }
    let addrs: Vec<SocketAddr> = handles.iter().map(|h| h.addr).collect();
    let statuses = burst(&addrs, "mallory").await;
    assert_eq!(count(&statuses, 401), 5, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 95, "{statuses:?}");
    assert_eq!(
        up.request_count(),
        5,
        "exactly the limit reaches the upstream"
    );

    // Successful logins never use the limit: twenty pass, and then five failures still do.
    for i in 0..20 {
        let (status, _) = send(addrs[i % addrs.len()], "/respond?status=200", "alice").await;
        assert_eq!(status, StatusCode::OK, "success {i}");
    }
    for i in 0..5 {
        let (status, _) = send(addrs[i % addrs.len()], "/respond?status=401", "alice").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "failure {i}");
    }
    let (status, headers) = send(addrs[0], "/respond?status=401", "alice").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(up.request_count(), 5 + 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_memory() {
    failed_logins(None, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_redis() {
    let redis = RedisServer::start();
    failed_logins(Some(&redis), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_two_proxies_on_one_redis() {
    let redis = RedisServer::start();
    failed_logins(Some(&redis), 2).await;
}

/// A request the upstream cannot serve (tollgate answers 502) gets its reservation back, and
/// a status class counts every status in it.
#[tokio::test]
async fn upstream_failures_refund_and_classes_count() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let api = route("api")
        .prefix("/")
        .limit(limit::token_bucket(2, "1h").count_statuses(["5xx"]));
    let yaml = config().upstream(&dead).route(api.clone());
    let proxy = proxy(yaml).start().await;
    for i in 0..10 {
        let (status, _) = send(proxy.addr, "/x", "u").await;
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "request {i}: tollgate's own 502 is refunded"
        );
    }

    let up = upstream().start().await;
    let yaml = config().upstream(&up.url()).route(api);
    let proxy = crate::support::proxy(yaml).start().await;
    for _ in 0..5 {
        assert_eq!(send(proxy.addr, "/respond?status=404", "u").await.0, 404);
    }
    assert_eq!(send(proxy.addr, "/respond?status=503", "u").await.0, 503);
    assert_eq!(send(proxy.addr, "/respond?status=500", "u").await.0, 500);
    assert_eq!(send(proxy.addr, "/respond?status=200", "u").await.0, 429);
}

/// A token budget per user, over HTTP/2 to the upstream (so trailers come through).
fn budget(up_url: &str) -> Config {
    budget_over_http1(up_url).http2()
}

/// The same token budget in front of an HTTP/1.1 upstream.
fn budget_over_http1(up_url: &str) -> Config {
    per_user(
        up_url,
        route("llm").limit(
            limit::token_bucket(10, "10s")
                .burst(10)
                .cost_from_response("X-Tokens-Used"),
        ),
    )
}

/// Sends one request over h2c (so the upstream's trailers come through) and reads the body.
async fn send_h2(addr: SocketAddr, path: &str, user: &str) -> (StatusCode, http::HeaderMap) {
    let request = Request::get(format!("http://{addr}{path}"))
        .version(http::Version::HTTP_2)
        .header("x-user", user)
        .header("te", "trailers")
        .body(body(""))
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await.unwrap();
    (status, headers)
}

/// A token budget of 10 tokens, refilled at one per second: what the upstream reports is
/// charged, the balance goes below zero, and the refusals say exactly when it is repaid.
async fn token_budget(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let yaml = with_store(budget(&up.url()), redis);
    let proxy = proxy(yaml).start().await;
    proxy.wait_ready().await;

    // Header report 35: 1 paid up front, 34 charged: balance -25, back to 1 token in 26 s.
    let (status, _) = send_h2(proxy.addr, "/respond?cost=35", "a").await;
    assert_eq!(status, StatusCode::OK);
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "a").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "26");
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"llm\";r=0;t="),
        "{headers:?}"
    );

    // The trailer wins over the header: 20 charged, not 5: balance -10, 11 s to repay.
    let (status, _) = send_h2(proxy.addr, "/respond?cost=5&trailer=20", "b").await;
    assert_eq!(status, StatusCode::OK);
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "b").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "11");

    // A malformed report charges the configured cost (1) and is counted: 9 left, then 8.
    let (status, _) = send_h2(proxy.addr, "/respond?cost=lots", "c").await;
    assert_eq!(status, StatusCode::OK);
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "c").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"llm\";r=8;"),
        "{headers:?}"
    );
    let metrics = metrics(proxy.admin.unwrap()).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tollgate_cost_report_invalid_total{route=\"llm\"} 1"),
        "{metrics}"
    );

    // A report below the cost paid up front gives the difference back: zero-cost calls
    // never run the budget down.
    for i in 0..15 {
        let (status, _) = send_h2(proxy.addr, "/respond?cost=0", "d").await;
        assert_eq!(status, StatusCode::OK, "free call {i}");
    }
    assert_eq!(
        up.request_count(),
        1 + 1 + 2 + 15,
        "refusals never reach the upstream"
    );
}

async fn metrics(admin: SocketAddr) -> String {
    let response = http1_client()
        .request(get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    text(response).await
}

#[tokio::test]
async fn token_budget_memory() {
    token_budget(None).await;
}

#[tokio::test]
async fn token_budget_redis() {
    let redis = RedisServer::start();
    token_budget(Some(&redis)).await;
}

/// A client that leaves before the response head changes nothing: the request is settled on
/// the app's answer, which nobody receives (a failure stays counted, a success is given back).
#[tokio::test]
async fn a_client_that_leaves_before_the_head_is_settled_on_the_answer() {
    let up = upstream().start().await;
    let yaml = config().upstream(&up.url()).admin("127.0.0.1:0").route(
        route("login")
            .prefix("/")
            .limit(limit::sliding_log(1, "1h").count_statuses([401])),
    );
    let proxy = proxy(yaml).start().await;
    let state = format!(
        "http://{}/limits/state?route=login&identity=127.0.0.1",
        proxy.admin.unwrap()
    );
    let leave = |path: &'static str| {
        tokio::time::timeout(Duration::from_millis(200), send(proxy.addr, path, "u"))
    };
    assert!(
        leave("/respond?status=200&ms=600").await.is_err(),
        "the client gave up first"
    );
    // The app answers 200 at 600 ms: the unit comes back.
    eventually("the unit given back", PATIENCE, async || {
        let (_, _, text) = exchange("GET", &state, &[]).await;
        let state: serde_json::Value = serde_json::from_str(&text).unwrap();
        until(state["limits"][0]["allowed"] == true, text)
    })
    .await;
    assert!(leave("/respond?status=401&ms=600").await.is_err());
    // The app answers 401 at 600 ms: the unit stays taken. The wait is the scenario (a
    // correct settlement changes nothing visible; the check below holds before it too).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(send(proxy.addr, "/respond?status=401", "u").await.0, 429);
    assert_eq!(up.request_count(), 2);
}

/// What cannot work is refused with the position of the value and the reason.
#[test]
fn check_refuses_what_cannot_work() {
    let cases = [
        (
            "{ algorithm: fixed_window, limit: 5, period: 1m, count_statuses: [401, 99, \"6xx\"] }",
            vec![
                "test.yaml:8:80: routes[0].limits[0].count_statuses[1]",
                "limits[0].count_statuses[1]: 99 is not an HTTP status",
                "limits[0].count_statuses[2]: `6xx` is not a status or class",
                "100–599",
            ],
        ),
        (
            "{ algorithm: concurrency, limit: 5, count_statuses: [401] }",
            vec!["already return their slot"],
        ),
        (
            "{ algorithm: sliding_log, limit: 5, period: 1m, cost_from_response: x-tokens }",
            vec!["limits[0].cost_from_response: sliding_log stores one entry per unit"],
        ),
        (
            "{ algorithm: concurrency, limit: 5, cost_from_response: x-tokens }",
            vec!["not units used"],
        ),
        (
            "{ algorithm: gcra, limit: 5, period: 1m, cost_from_response: \"bad header\" }",
            vec!["not a valid header or trailer name"],
        ),
        (
            "{ algorithm: gcra, limit: 5, period: 1m, cost_from_response: x, count_statuses: [401] }",
            vec!["not both"],
        ),
    ];
    for (limit, expected) in cases {
        let yaml = format!("listen: 127.0.0.1:0\nupstream:\n  url: http://127.0.0.1:1\nroutes:\n  - name: api\n    match: {{ path_prefix: / }}\n    limits:\n      - {limit}\n");
        let error = tollgate::config::parse(std::path::Path::new("test.yaml"), &yaml, |_| None)
            .err()
            .unwrap_or_else(|| panic!("accepted: {limit}"))
            .to_string();
        for text in expected {
            assert!(error.contains(text), "`{text}` not in:\n{error}");
        }
    }
    // The summary `check` prints shows them.
    let yaml = "listen: 127.0.0.1:0\nupstream:\n  url: http://127.0.0.1:1\nroutes:\n  - name: api\n    match: { path_prefix: / }\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m, count_statuses: [401, \"5XX\"] }\n      - { algorithm: token_bucket, limit: 5, period: 1m, cost_from_response: X-Tokens-Used }\n";
    let config =
        tollgate::config::parse(std::path::Path::new("test.yaml"), yaml, |_| None).unwrap();
    let summary = tollgate::summary::check(&config);
    assert!(
        summary.contains("fixed_window 5 per 1m, local, counts only 401, 5xx"),
        "{summary}"
    );
    assert!(
        summary.contains("cost from response `x-tokens-used`"),
        "{summary}"
    );
}

/// A streamed answer: the trailer at its end is charged once it arrives; a client that leaves
/// mid-body leaves the rest to tollgate, which reads it and charges its trailer.
#[tokio::test]
async fn streamed_budget_settles_at_the_end_or_when_the_client_leaves() {
    let up = upstream().start().await;
    let yaml = budget(&up.url());
    let proxy = proxy(yaml).start().await;

    // Streamed to the end: nothing is charged until the trailer (15) arrives.
    let request = Request::get(proxy.url("/respond?hold=1&trailer=15"))
        .version(http::Version::HTTP_2)
        .header("x-user", "f")
        .header("te", "trailers")
        .body(body(""))
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    let mut answer = response.into_body();
    assert!(answer.frame().await.unwrap().unwrap().is_data());
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "f").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "only the up-front cost is taken so far"
    );
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"llm\";r=8;"),
        "{headers:?}"
    );
    up.release.notify_one();
    let rest = answer.collect().await.unwrap();
    assert_eq!(rest.trailers().unwrap()["x-tokens-used"], "15");
    // 10 - 1 - 1 - 14 = -6: 7 s until one token.
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "f").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "7");

    // Left mid-body: the header said 30, the trailer that comes after the client left says
    // 40: balance 10 - 40 = -30, 31 s to repay.
    let request = Request::get(proxy.url("/respond?cost=30&hold=1&trailer=40"))
        .version(http::Version::HTTP_2)
        .header("x-user", "e")
        .body(body(""))
        .unwrap();
    let response = h2c_client().request(request).await.unwrap();
    let mut answer = response.into_body();
    let first = answer.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(answer);
    // Let the proxy see the client go first (the scenario: a trailer that comes after it
    // left; were it seen later, the trailer would be charged all the same).
    tokio::time::sleep(Duration::from_millis(100)).await;
    up.release.notify_one();
    // The rest of the body, and the settlement at its end, are left to a task: wait for it
    // in /limits/state, which takes nothing (until then only the up-front unit is taken, and a
    // request would be admitted and charged). A client that reads its response to the end
    // needs no wait: the settlement is in the store before the end arrives.
    let state = format!(
        "http://{}/limits/state?route=llm&identity=e",
        proxy.admin.unwrap()
    );
    eventually(
        "the trailer charged after the client left",
        PATIENCE,
        async || {
            let (_, _, text) = exchange("GET", &state, &[]).await;
            let state: serde_json::Value = serde_json::from_str(&text).unwrap();
            until(state["limits"][0]["allowed"] == false, text)
        },
    )
    .await;
    let (status, headers) = send_h2(proxy.addr, "/respond?cost=1", "e").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "31");
}

/// A settlement the store cannot take is logged and counted, and holds up the client no longer
/// than the store's timeout: the response arrives while Redis is frozen, and by then the
/// failure is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_settlement_is_counted_and_holds_up_the_client_no_longer_than_the_timeout() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .store(
            // Long enough that a busy machine's Redis decides every request below (a decision
            // that timed out would fail open and leave nothing to settle); the settlement
            // then waits this long on the frozen Redis before it counts as failed.
            store::redis(&redis.url()).timeout("1s").on_error("allow"),
        )
        .route(
            route("login")
                .prefix("/")
                .limit(limit::fixed_window(5, "1h").count_statuses([401])),
        );
    let proxy = proxy(yaml).start().await;
    proxy.wait_ready().await;
    // Warm up: both scripts loaded into Redis, so the decision below is quick.
    assert_eq!(send(proxy.addr, "/respond?status=401", "w").await.0, 401);
    assert_eq!(send(proxy.addr, "/respond?status=200", "w").await.0, 200);
    let answer = tokio::spawn(send(proxy.addr, "/respond?status=200&release=1", "u"));
    // Decided once the app has it; the app answers once Redis is frozen, so the refund of
    // the 200 finds it frozen.
    eventually("the app has the request", PATIENCE, async || {
        until(up.request_count() >= 3, up.request_count())
    })
    .await;
    redis.pause();
    let frozen = redis.state();
    let app_had = up.request_count();
    up.release.notify_one();
    let released = std::time::Instant::now();
    // Held for the settlement's timeout (1 s), then answered: never hung (the bound here is
    // only that, far above the timeout).
    let answered = tokio::time::timeout(Duration::from_secs(20), answer).await;
    let held = released.elapsed();
    redis.resume();
    let (status, _) = answered
        .expect("the client was held past the store's timeout")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics(proxy.admin.unwrap()).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tollgate_settlement_errors_total{route=\"login\"} 1"),
        "answered {held:?} after the release; Redis was {frozen:?} and the app had {app_had} \
         requests then, {} now; {metrics}",
        up.request_count()
    );
}

/// An HTTP/1.1 upstream (no `http2`) that ends its chunked answers with a trailer: the trailer
/// settles the cost as an HTTP/2 one does, whether or not the client asked for trailers. An
/// HTTP/1.1 client sees the trailer only when it sent `TE: trailers`.
#[tokio::test]
async fn http1_chunked_trailers_settle_whether_or_not_the_client_asked_for_them() {
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_url = format!("http://{}", app.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = app.accept().await {
            tokio::spawn(answer_with_a_trailer(stream, "x-tokens-used: 20"));
        }
    });
    let proxy = proxy(budget_over_http1(&app_url)).start().await;
    for (user, te) in [("asked", Some("trailers")), ("did-not-ask", None)] {
        let mut request = Request::get(proxy.url("/respond")).header("x-user", user);
        if let Some(te) = te {
            request = request.header("te", te);
        }
        let response = http1_client()
            .request(request.body(body("")).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{user}");
        assert_eq!(response.version(), http::Version::HTTP_11);
        assert_eq!(response.headers()["transfer-encoding"], "chunked", "{user}");
        let rest = response.into_body().collect().await.unwrap();
        match te {
            Some(_) => assert_eq!(rest.trailers().unwrap()["x-tokens-used"], "20"),
            None => assert!(rest.trailers().is_none(), "{:?}", rest.trailers()),
        }
        assert_eq!(rest.to_bytes(), "hello", "{user}");
        // 20 charged: balance 10 - 20 = -10, 11 s until one token.
        let (status, headers) = send(proxy.addr, "/respond", user).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{user}");
        assert_eq!(headers["retry-after"], "11", "{user}");
    }
}

/// Answers every request on the connection (requests without a body) with a chunked "hello"
/// and `trailer`, declared in the head, whatever the request's `TE`.
async fn answer_with_a_trailer(mut stream: tokio::net::TcpStream, trailer: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        while let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            received.drain(..end + 4);
            let answer = format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-tokens-used\r\n\r\n5\r\nhello\r\n0\r\n{trailer}\r\n\r\n"
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// The RateLimit field of a response shows the quota after its settlement: a success that
/// does not count has its unit back, a counted failure has it spent.
async fn fields_after_settlement(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let yaml = with_store(
        per_user(
            &up.url(),
            route("login").limit(
                limit::token_bucket(3, "3h")
                    .burst(3)
                    .count_statuses([401])
                    .name("failed-logins"),
            ),
        ),
        redis,
    );
    let proxy = proxy(yaml).start().await;
    proxy.wait_ready().await;
    // A token comes back every hour: t is when the bucket is full again.
    let expected = [
        (200, "\"failed-logins\";r=3;t=0"),
        (401, "\"failed-logins\";r=2;t=3600"),
        (401, "\"failed-logins\";r=1;t=7200"),
        (200, "\"failed-logins\";r=1;t=7200"),
        (401, "\"failed-logins\";r=0;t=10800"),
    ];
    for (i, (status, field)) in expected.into_iter().enumerate() {
        let (seen, headers) = send(proxy.addr, &format!("/respond?status={status}"), "alice").await;
        assert_eq!(seen.as_u16(), status, "request {i}");
        assert_eq!(headers["ratelimit"], field, "request {i}: {headers:?}");
    }
    let (seen, _) = send(proxy.addr, "/respond?status=200", "alice").await;
    assert_eq!(seen, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn fields_after_settlement_memory() {
    fields_after_settlement(None).await;
}

#[tokio::test]
async fn fields_after_settlement_redis() {
    let redis = RedisServer::start();
    fields_after_settlement(Some(&redis)).await;
}
