//! Throttling end to end: real Redis (started here), real upstream, real tollgate. Every
//! behavioural test runs against both stores: Redis and the in-process memory store.

use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};

/// Where limits live for a test.
enum Backend {
    Memory,
    Redis(RedisServer),
}

impl Backend {
    fn redis() -> Backend {
        Backend::Redis(RedisServer::start())
    }

    fn store(&self, config: Config) -> Config {
        match self {
            Backend::Memory => config,
            Backend::Redis(redis) => config.store(
                store::redis(&redis.url())
                    .key_prefix("tg-test:")
                    .timeout("500ms")
                    .on_error("deny"),
            ),
        }
    }
}

fn backends() -> Vec<Backend> {
    vec![Backend::Memory, Backend::redis()]
}

/// Starts tollgate in front of `up` with `config`'s identities and routes, on `backend`.
async fn start(up: &Upstream, backend: &Backend, config: Config) -> ProxyHandle {
    let proxy = proxy(backend.store(config.upstream(&up.url())))
        .start()
        .await;
    // Redis connects in the background: wait until a request is decided by it.
    proxy.wait_store().await;
    proxy
}

async fn send(
    proxy: &ProxyHandle,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    let mut builder = Request::builder().method(method).uri(proxy.url(path));
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    http1_client()
        .request(builder.body(body("")).unwrap())
        .await
        .unwrap()
}

async fn status(proxy: &ProxyHandle, path: &str, headers: &[(&str, &str)]) -> StatusCode {
    let response = send(proxy, "GET", path, headers).await;
    let status = response.status();
    let _ = text(response).await;
    status
}

async fn admitted_sequential(
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        match status(proxy, path, headers).await {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    ok
}

async fn admitted_concurrent(
    addrs: &[std::net::SocketAddr],
    path: &str,
    header: (&str, &str),
    n: usize,
) -> usize {
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = format!("http://{}{}", addrs[i % addrs.len()], path);
        let (k, v) = (header.0.to_string(), header.1.to_string());
        tasks.push(tokio::spawn(async move {
            let request = Request::get(url).header(k, v).body(body("")).unwrap();
            let response = http1_client().request(request).await.unwrap();
            let status = response.status();
            let _ = text(response).await;
            status
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    ok
}

/// Users identified by `x-user`, one route `api` on `/api/` keyed by them with this limit.
fn api_limited(limit: Limit) -> Config {
    config()
        .identity("user", [source::header("x-user")])
        .route(route("api").prefix("/api/").key("user").limit(limit))
}

/// Windows are aligned to multiples of the period on the store's clock; a day-long period keeps
/// a test from straddling a boundary.
fn algorithms() -> [(Limit, usize); 5] {
    [
        (limit::fixed_window(5, "24h"), 5),
        (limit::sliding_log(5, "1h"), 5),
        (limit::sliding_window(5, "24h"), 5),
        (limit::token_bucket(5, "1h"), 5),
        (limit::gcra(1, "1h").burst(5), 5),
    ]
}

#[tokio::test]
async fn every_algorithm_admits_exactly_its_limit_sequentially() {
    for backend in backends() {
        for (line, expected) in algorithms() {
            let up = upstream().start().await;
            let proxy = start(&up, &backend, api_limited(line.clone())).await;
            let ok = admitted_sequential(&proxy, "/api/x", &[("x-user", "alice")], 9).await;
            assert_eq!(ok, expected, "{line} on {}", backend.name());
            assert_eq!(
                up.request_count(),
                expected,
                "the upstream never sees a limited request"
            );
            // Another user has a bucket of their own.
            assert_eq!(
                status(&proxy, "/api/x", &[("x-user", "bob")]).await,
                StatusCode::OK
            );
            // Unrouted paths are not limited.
            assert_eq!(
                status(&proxy, "/other", &[("x-user", "alice")]).await,
                StatusCode::OK
            );
        }
    }
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis(_) => "redis",
        }
    }
}

#[tokio::test]
async fn concurrent_clients_on_two_proxies_sharing_redis_admit_exactly_the_limit() {
    let backend = Backend::redis();
    for (i, (line, expected)) in algorithms().into_iter().enumerate() {
        let up = upstream().start().await;
        let a = start(&up, &backend, api_limited(line.clone())).await;
        let b = start(&up, &backend, api_limited(line.clone())).await;
        let user = format!("user-{i}");
        let ok = admitted_concurrent(&[a.addr, b.addr], "/api/x", ("x-user", &user), 100).await;
        assert_eq!(ok, expected, "{line}");
        assert_eq!(up.request_count(), expected);
    }
}

/// The same through two proxies whose Redis store coalesces decisions: concurrent requests'
/// decisions share script calls, and still exactly the limit passes, and the 429s carry the
/// same headers as without coalescing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_proxies_sharing_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let store = store::redis(&redis.url())
        .key_prefix("tg-co:")
        .timeout("500ms")
        .coalesce()
        .on_error("deny");
    for (i, (line, expected)) in algorithms().into_iter().enumerate() {
        let up = upstream().start().await;
        let yaml = api_limited(line.clone())
            .upstream(&up.url())
            .store(store.clone());
        let a = proxy(&yaml).start().await;
        let b = proxy(yaml).start().await;
        a.wait_store().await;
        b.wait_store().await;
        let user = format!("user-{i}");
        let ok = admitted_concurrent(&[a.addr, b.addr], "/api/x", ("x-user", &user), 100).await;
        assert_eq!(ok, expected, "{line}");
        assert_eq!(up.request_count(), expected);
        let limited = send(&a, "GET", "/api/x", &[("x-user", &user)]).await;
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS, "{line}");
        assert!(limited.headers().contains_key("retry-after"), "{line}");
    }
    let calls = redis_cmd(&redis, &["INFO", "commandstats"]);
    let evalsha: u64 = calls
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .map_or(0, |v| v.parse().unwrap());
    // Without coalescing these 500 requests take about 320 calls (the deny cache answers the
    // rest); with it, about 50.
    assert!(
        evalsha < 200,
        "500 concurrent requests took {evalsha} script calls"
    );
}

#[tokio::test]
async fn memory_store_admits_exactly_the_limit_under_concurrency() {
    for (line, expected) in algorithms() {
        let up = upstream().start().await;
        let proxy = start(&up, &Backend::Memory, api_limited(line.clone())).await;
        let ok = admitted_concurrent(&[proxy.addr], "/api/x", ("x-user", "carol"), 100).await;
        assert_eq!(ok, expected, "{line}");
    }
}

#[tokio::test]
async fn limited_response_is_a_problem_with_headers_and_truthful_retry_after() {
    for backend in backends() {
        let up = upstream().start().await;
        let proxy = start(
            &up,
            &backend,
            api_limited(limit::sliding_log(2, "2s").name("burst")),
        )
        .await;
        for expected_r in [1, 0] {
            let response = send(&proxy, "GET", "/api/x", &[("x-user", "dave")]).await;
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["ratelimit-policy"], "\"burst\";q=2;w=2");
            let rl = response.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .to_string();
            assert!(
                rl.starts_with(&format!("\"burst\";r={expected_r};t=")),
                "{rl}"
            );
        }
        let response = send(&proxy, "GET", "/api/x", &[("x-user", "dave")]).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = response.headers().clone();
        assert_eq!(h["content-type"], "application/problem+json");
        let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=2).contains(&retry), "retry-after {retry}");
        assert_eq!(h["ratelimit"], format!("\"burst\";r=0;t={retry}").as_str());
        let problem: serde_json::Value = serde_json::from_str(&text(response).await).unwrap();
        assert_eq!(problem["status"], 429);
        assert_eq!(problem["title"], "Too Many Requests");
        assert_eq!(problem["violated-policies"], serde_json::json!(["burst"]));
        assert!(problem["detail"].as_str().unwrap().contains("retry after"));

        // Truthful: a lone client retrying after Retry-After seconds is admitted.
        tokio::time::sleep(Duration::from_secs(retry)).await;
        assert_eq!(
            status(&proxy, "/api/x", &[("x-user", "dave")]).await,
            StatusCode::OK,
            "{}",
            backend.name()
        );
    }
}

#[tokio::test]
async fn gcra_retry_after_is_truthful_and_follows_cl_throttle() {
    for backend in backends() {
        let up = upstream().start().await;
        // One request per 2 s, burst 1.
        let proxy = start(
            &up,
            &backend,
            api_limited(limit::gcra(1, "2s").burst(1).name("slow")),
        )
        .await;
        assert_eq!(
            status(&proxy, "/api/x", &[("x-user", "erin")]).await,
            StatusCode::OK
        );
        let response = send(&proxy, "GET", "/api/x", &[("x-user", "erin")]).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(retry, 2);
        tokio::time::sleep(Duration::from_secs(retry)).await;
        assert_eq!(
            status(&proxy, "/api/x", &[("x-user", "erin")]).await,
            StatusCode::OK,
            "{}",
            backend.name()
        );
    }
}

#[tokio::test]
async fn a_denied_request_consumes_no_quota_from_the_other_limits() {
    for backend in backends() {
        let up = upstream().start().await;
        let routes = config().identity("user", [source::header("x-user")]).route(
            route("api")
                .prefix("/api/")
                .key("user")
                .limit(limit::fixed_window(2, "24h").name("small"))
                .limit(limit::sliding_log(3, "1h").name("big")),
        );
        let proxy = start(&up, &backend, routes).await;
        assert_eq!(
            admitted_sequential(&proxy, "/api/x", &[("x-user", "f")], 10).await,
            2
        );
        let response = send(&proxy, "GET", "/api/x", &[("x-user", "f")]).await;
        // `big` was charged only for the 2 admitted requests: 1 left.
        let rl = response.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(rl.starts_with("\"small\";r=0"), "{rl}");
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"small\";q=2;w=86400, \"big\";q=3;w=3600"
        );
        if let Backend::Redis(redis) = &backend {
            let members = redis_cmd(redis, &["ZCARD", "tg-test:{api|header=f}:big"]);
            assert_eq!(members, "2", "{}", backend.name());
        }
    }
}

#[tokio::test]
async fn every_redis_key_has_the_prefix_and_a_ttl() {
    let backend = Backend::redis();
    let Backend::Redis(redis) = &backend else {
        unreachable!()
    };
    let up = upstream().start().await;
    let mut routes = config().identity("user", [source::header("x-user")]);
    for (i, (line, _)) in algorithms().into_iter().enumerate() {
        routes = routes.route(
            route(&format!("r{i}"))
                .prefix(&format!("/r{i}/"))
                .key("user")
                .limit(line),
        );
    }
    routes = routes.route(
        route("conc")
            .prefix("/hold")
            .key("user")
            .limit(limit::concurrency(3)),
    );
    let proxy = start(&up, &backend, routes).await;
    for i in 0..algorithms().len() {
        for user in ["a", "{b}", "c:d*", &"x".repeat(500)] {
            status(&proxy, &format!("/r{i}/x"), &[("x-user", user)]).await;
        }
    }
    let held = tokio::spawn({
        let url = proxy.url("/hold");
        async move {
            http1_client()
                .request(
                    Request::get(url)
                        .header("x-user", "a")
                        .body(body(""))
                        .unwrap(),
                )
                .await
                .unwrap()
        }
    });
    up.first_chunk_sent.notified().await;
    let keys = redis_cmd(redis, &["KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert!(keys.len() > algorithms().len() * 4, "{keys:?}");
    for key in keys {
        assert!(key.starts_with("tg-test:{"), "{key}");
        let ttl: i64 = redis_cmd(redis, &["PTTL", key]).parse().unwrap();
        assert!(ttl > 0, "{key} has PTTL {ttl}");
        assert!(key.len() < 160, "keys stay short: {key}");
    }
    up.release.notify_one();
    let response = held.await.unwrap();
    assert_eq!(text(response).await, "first,last");
}

/// Runs one Redis command with redis-cli-free plumbing: the redis crate, synchronously.
fn redis_cmd(redis: &RedisServer, args: &[&str]) -> String {
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut cmd = ::redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: ::redis::Value = cmd.query(&mut conn).unwrap();
    match value {
        ::redis::Value::Int(n) => n.to_string(),
        ::redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        ::redis::Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                ::redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn routes_match_in_order_and_unmatched_requests_are_unlimited() {
    for backend in backends() {
        let up = upstream().start().await;
        let routes = config()
            .route(
                route("login")
                    .prefix("/login")
                    .methods(["POST"])
                    .limit(limit::fixed_window(1, "24h")),
            )
            .route(
                route("everything")
                    .prefix("/")
                    .limit(limit::fixed_window(3, "24h")),
            );
        let proxy = start(&up, &backend, routes).await;
        let post = |p: &ProxyHandle| {
            let url = p.url("/login");
            async move {
                http1_client()
                    .request(Request::post(url).body(body("")).unwrap())
                    .await
                    .unwrap()
                    .status()
            }
        };
        assert_eq!(post(&proxy).await, StatusCode::OK);
        assert_eq!(post(&proxy).await, StatusCode::TOO_MANY_REQUESTS);
        // GET /login is not the login route: it falls to `everything`.
        assert_eq!(
            admitted_sequential(&proxy, "/login", &[], 5).await,
            3,
            "{}",
            backend.name()
        );
    }
}

#[tokio::test]
async fn client_ip_comes_from_x_forwarded_for_only_behind_trusted_proxies() {
    let up = upstream().start().await;
    let routes = config().route(
        route("all")
            .prefix("/")
            .key("client_ip")
            .limit(limit::fixed_window(2, "24h")),
    );
    // Untrusted peer: X-Forwarded-For cannot pick a fresh bucket per request.
    let untrusted = start(&up, &Backend::Memory, routes.clone()).await;
    let mut ok = 0;
    for i in 0..5 {
        if status(
            &untrusted,
            "/",
            &[("x-forwarded-for", &format!("198.51.100.{i}"))],
        )
        .await
            == 200
        {
            ok += 1;
        }
    }
    assert_eq!(ok, 2, "spoofed X-Forwarded-For must be ignored");

    // Trusted loopback proxy: the rightmost untrusted address is the client.
    let trusted = start(
        &up,
        &Backend::Memory,
        routes.trusted_proxies(["127.0.0.0/8", "10.0.0.0/8"]),
    )
    .await;
    for i in 0..3 {
        let xff = format!("203.0.113.9, 198.51.100.{i}, 10.1.1.1");
        assert_eq!(
            admitted_sequential(&trusted, "/", &[("x-forwarded-for", &xff)], 3).await,
            2
        );
    }
    let echo = text(
        send(
            &trusted,
            "GET",
            "/",
            &[("x-forwarded-for", "198.51.100.200")],
        )
        .await,
    )
    .await;
    let echo: serde_json::Value = serde_json::from_str(&echo).unwrap();
    assert_eq!(
        echo["headers"]["x-forwarded-for"][0],
        "198.51.100.200, 127.0.0.1"
    );
}

fn jwt(secret: &[u8], claims: serde_json::Value, alg: jsonwebtoken::Algorithm) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn each_identity_source_gets_its_own_bucket() {
    std::env::set_var("TOLLGATE_TEST_JWT_SECRET", "s3cret-for-tests");
    let up = upstream().start().await;
    let routes = config()
        .identity("bearer_user", [source::bearer()])
        .identity(
            "caller",
            [
                source::header("x-api-key"),
                source::query("token"),
                source::cookie("session"),
                source::jwt(Jwt::hmac("sub", "TOLLGATE_TEST_JWT_SECRET")),
                source::path_segment(2),
            ],
        )
        .route(
            route("t")
                .prefix("/t/")
                .key("caller")
                .limit(limit::fixed_window(1, "24h")),
        )
        .route(
            route("b")
                .prefix("/b/")
                .key("bearer_user")
                .limit(limit::fixed_window(1, "24h")),
        );
    let proxy = start(&up, &Backend::Memory, routes).await;
    let good = jwt(
        b"s3cret-for-tests",
        serde_json::json!({"sub": "jwt-user", "exp": now_secs() + 600}),
        jsonwebtoken::Algorithm::HS256,
    );
    let good_other = jwt(
        b"s3cret-for-tests",
        serde_json::json!({"sub": "jwt-user", "exp": now_secs() + 900}),
        jsonwebtoken::Algorithm::HS256,
    );
    let bearer_good = format!("Bearer {good}");
    let bearer_other = format!("Bearer {good_other}");

    // Each source, once: first request passes, the second from the same caller is limited.
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("/t/seg-a/x", vec![("x-api-key", "key-1")]),
        ("/t/seg-a/x?token=tok-1", vec![]),
        ("/t/seg-a/x", vec![("cookie", "theme=dark; session=sess-1")]),
        ("/t/seg-a/x", vec![("authorization", &bearer_good)]),
        ("/t/seg-b/x", vec![]),
    ];
    for (path, headers) in &cases {
        assert_eq!(
            status(&proxy, path, headers).await,
            StatusCode::OK,
            "{path} {headers:?}"
        );
        assert_eq!(
            status(&proxy, path, headers).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{path} {headers:?}"
        );
    }
    // The same JWT subject in a different token is the same caller.
    assert_eq!(
        status(&proxy, "/t/seg-c/x", &[("authorization", &bearer_other)]).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Refused tokens (forged, expired, alg none) never fall through to a weaker source (the
    // path): all are keyed by the client IP, one bucket whatever the path.
    let forged = jwt(
        b"wrong-secret",
        serde_json::json!({"sub": "victim", "exp": now_secs() + 600}),
        jsonwebtoken::Algorithm::HS256,
    );
    let expired = jwt(
        b"s3cret-for-tests",
        serde_json::json!({"sub": "victim2", "exp": now_secs() - 600}),
        jsonwebtoken::Algorithm::HS256,
    );
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(format!(
            r#"{{"sub":"jwt-user","exp":{}}}"#,
            now_secs() + 600
        ))
    );
    for (i, token) in [forged, expired, none].iter().enumerate() {
        let path = format!("/t/fallback-{i}/x");
        let auth = format!("Bearer {token}");
        let expected = if i == 0 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(
            status(&proxy, &path, &[("authorization", &auth)]).await,
            expected,
            "token {i}: the client IP's bucket, never the jwt-user's or the path's"
        );
    }

    // Bearer identity: one bucket per token.
    assert_eq!(
        status(&proxy, "/b/", &[("authorization", "Bearer abc")]).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&proxy, "/b/", &[("authorization", "Bearer abc")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&proxy, "/b/", &[("authorization", "Bearer abd")]).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn delay_mode_waits_in_order_instead_of_rejecting() {
    for backend in backends() {
        let up = upstream().start().await;
        // 5 per second, no burst: requests 200 ms apart. Sent 100 ms apart (the order to keep),
        // so the third waits 200 ms, well within max_delay.
        let proxy = start(
            &up,
            &backend,
            api_limited(limit::gcra(5, "1s").burst(1).delay("700ms")),
        )
        .await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..3 {
            let url = proxy.url("/api/x");
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 100)).await;
                let r = http1_client()
                    .request(
                        Request::get(url)
                            .header("x-user", "gina")
                            .body(body(""))
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                (r.status(), Instant::now())
            }));
        }
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap());
        }
        for (status, _) in &done {
            assert_eq!(*status, StatusCode::OK, "{}", backend.name());
        }
        // timeout under test: the limit's 200 ms spacing (a lower bound: a busy machine only
        // makes it later).
        assert!(
            started.elapsed() >= Duration::from_millis(390),
            "three requests at 5/s need at least 400 ms: {:?}",
            started.elapsed()
        );
        assert!(
            done[0].1 <= done[1].1 && done[1].1 <= done[2].1,
            "requests keep their order"
        );
        // A burst needing more than max_delay: those that fit wait, the rest are rejected
        // promptly instead of being held.
        let started = Instant::now();
        let ok = admitted_concurrent(&[proxy.addr], "/api/x", ("x-user", "hank"), 8).await;
        assert!(
            (3..=4).contains(&ok),
            "at 5/s with max_delay 700ms, 3 or 4 of 8 fit: {ok} ({})",
            backend.name()
        );
        // timeout under test: max_delay 700ms, and a second's slack.
        assert!(
            started.elapsed() < Duration::from_millis(700) + Duration::from_secs(1),
            "nobody waits past max_delay: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn shadow_limits_count_and_report_but_never_block() {
    for backend in backends() {
        let up = upstream().start().await;
        let proxy = start(
            &up,
            &backend,
            api_limited(limit::fixed_window(2, "24h").shadow().name("trial")),
        )
        .await;
        let mut last = String::new();
        for _ in 0..5 {
            let response = send(&proxy, "GET", "/api/x", &[("x-user", "ivy")]).await;
            assert_eq!(response.status(), 200, "{}", backend.name());
            last = response.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .to_string();
        }
        assert!(last.starts_with("\"trial\";r=0"), "{last}");
        assert_eq!(up.request_count(), 5);
    }
}

#[tokio::test]
async fn concurrency_limit_holds_a_slot_until_the_response_body_ends() {
    for backend in backends() {
        let up = upstream().start().await;
        let routes = config().route(
            route("upload")
                .prefix("/hold")
                .key("global")
                .limit(limit::concurrency(1)),
        );
        let proxy = start(&up, &backend, routes).await;
        let url = proxy.url("/hold");
        let first = tokio::spawn(async move {
            let r = http1_client().request(get(&url)).await.unwrap();
            text(r).await
        });
        up.first_chunk_sent.notified().await;
        let response = send(&proxy, "GET", "/hold", &[]).await;
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            backend.name()
        );
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"upload\";q=1;qu=\"concurrent-requests\""
        );
        up.release.notify_one();
        assert_eq!(first.await.unwrap(), "first,last");
        // The slot comes back once the body has ended. (A probe that is admitted holds the
        // slot until released: the permit is kept for it if it is not waiting yet.)
        eventually(
            &format!("the slot is released ({})", backend.name()),
            PATIENCE,
            async || {
                let url = proxy.url("/hold");
                let probe = tokio::spawn(async move {
                    http1_client().request(get(&url)).await.unwrap().status()
                });
                up.release.notify_one();
                let status = probe.await.unwrap();
                until(status == StatusCode::OK, status)
            },
        )
        .await;
    }
}

#[tokio::test]
async fn redis_outage_follows_on_error() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let mut configs = Vec::new();
    for on_error in ["allow", "deny", "local"] {
        let yaml = api_limited(limit::fixed_window(2, "24h"))
            .upstream(&up.url())
            .store(
                store::redis(&redis.url())
                    .timeout("100ms")
                    .on_error(on_error),
            );
        let proxy = proxy(yaml).start().await;
        proxy.wait_store().await;
        configs.push((on_error, proxy));
    }
    redis.stop();
    for (on_error, proxy) in &configs {
        let started = Instant::now();
        let statuses: Vec<StatusCode> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(status(proxy, "/api/x", &[("x-user", "jack")]).await);
            }
            v
        };
        // timeout under test: the store's 100 ms timeout, four times, and slack.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{on_error}: store errors must not hang clients"
        );
        let expected = match *on_error {
            "allow" => vec![StatusCode::OK; 4],
            "deny" => vec![StatusCode::SERVICE_UNAVAILABLE; 4],
            _ => vec![
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS,
            ],
        };
        assert_eq!(statuses, expected, "on_error: {on_error}");
    }
}
