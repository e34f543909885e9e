//! `usage: { path: /_quota }`: a caller reads its own usage from tollgate, never from the
//! application. Each caller sees only its own numbers, and they are the numbers the limits then
//! enforce; the endpoint consumes nothing, has a small rate of its own, answers from a tier's
//! limits for a tier's member, and without `usage` the path is proxied like any other.

use std::time::{Duration, SystemTime};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::{json, Value};

/// Callers named by the `x-user` header; `/api` allows 5 in any minute and 10 an hour (a
/// bucket that refills one every 6 minutes), a `gold` tier (`vip`) 50 a minute, and `/_quota`
/// tells each caller where it stands. Trailing windows, so no window turns during a test.
fn quota_config(up: &Upstream, store: Option<&Store>) -> Config {
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/api")
                .key("user")
                .limit(limit::sliding_log(5, "1m").name("calls"))
                .limit(limit::token_bucket(10, "1h").name("hourly"))
                .tier(
                    tier("gold")
                        .identity("user")
                        .values(["vip"])
                        .limit(limit::sliding_log(50, "1m").name("gold-calls")),
                ),
        )
        .set("usage", json!({ "path": "/_quota" }));
    match store {
        Some(store) => config.store(store.clone()),
        None => config,
    }
}

async fn send(
    proxy: &ProxyHandle,
    method: &str,
    path: &str,
    user: Option<&str>,
) -> (StatusCode, http::HeaderMap, String) {
    let user: Vec<(&str, &str)> = user.map(|user| ("x-user", user)).into_iter().collect();
    crate::support::exchange(method, &proxy.url(path), &user).await
}

/// `/_quota` as `user`: its JSON.
async fn quota(proxy: &ProxyHandle, user: &str) -> Value {
    let (status, headers, body) = send(proxy, "GET", "/_quota", Some(user)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["cache-control"], "no-store");
    assert!(
        !body.contains(user),
        "the identity value is never echoed: {body}"
    );
    serde_json::from_str(&body).unwrap()
}

/// Waits until `proxy` applies alice's override with `field` at `value` (`/_quota` reads the
/// limit stage's own table of overrides, and consumes nothing).
async fn override_applied(proxy: &ProxyHandle, field: &str, value: f64) {
    eventually(
        &format!("the override's {field} {value} applied"),
        PATIENCE,
        async || {
            let answer = quota(proxy, "alice").await;
            let shown = answer["routes"][0]["override"][field].clone();
            until(shown.as_f64() == Some(value), shown)
        },
    )
    .await;
}

/// The first limit of the first route in a `/_quota` answer.
fn first_limit(quota: &Value) -> &Value {
    &quota["routes"][0]["limits"][0]
}

/// Alice spends 2 of her 5 and reads 3 left; Bob reads his 5; the limit then admits exactly
/// the 3 Alice was told of; the application never sees `/_quota`.
async fn each_caller_sees_their_own(proxy: &ProxyHandle, up: &Upstream) {
    for _ in 0..2 {
        assert_eq!(
            send(proxy, "GET", "/api/x", Some("alice")).await.0,
            StatusCode::OK
        );
    }
    let forwarded = up.request_count();
    assert_eq!(forwarded, 2);

    let alice = quota(proxy, "alice").await;
    let route = &alice["routes"][0];
    assert_eq!(route["route"], "api");
    assert_eq!(route["tier"], Value::Null);
    assert_eq!(route["identity"], "header");
    let calls = first_limit(&alice);
    assert_eq!(calls["name"], "calls", "{alice}");
    assert_eq!(calls["algorithm"], "sliding_log");
    assert_eq!(calls["limit"], 5);
    assert_eq!(calls["remaining"], 3, "{alice}");
    assert_eq!(calls["would_pass"], true);
    assert_eq!(calls["policy"], "\"calls\";q=5;w=60");
    // Full again a minute after the first of the two: resets_at and the RateLimit field agree.
    let t = calls["reset_after_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&t), "{calls}");
    let hourly = &route["limits"][1];
    assert_eq!(hourly["name"], "hourly");
    assert_eq!(hourly["limit"], 10);
    assert_eq!(hourly["remaining"], 8, "{alice}");
    assert_eq!(hourly["policy"], "\"hourly\";q=10;w=3600");
    assert_eq!(calls["ratelimit"], format!("\"calls\";r=3;t={t}"));
    assert_eq!(
        route["headers"]["ratelimit"],
        format!("\"calls\";r=3;t={t}")
    );
    // The route's own fields report the limit closest to exhaustion, as its responses do.
    assert_eq!(
        route["headers"]["ratelimit-policy"],
        "\"calls\";q=5;w=60, \"hourly\";q=10;w=3600"
    );
    let resets_at =
        humantime::parse_rfc3339(calls["resets_at"].as_str().unwrap()).expect("RFC 3339");
    let until = resets_at
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .as_secs();
    assert!(
        until <= 61,
        "resets_at {} is {until}s away",
        calls["resets_at"]
    );

    let bob = quota(proxy, "bob").await;
    assert_eq!(first_limit(&bob)["remaining"], 5, "{bob}");
    assert_eq!(first_limit(&bob)["limit"], 5);

    // Reading consumed nothing: asking again gives the same, and nothing reached the app.
    assert_eq!(first_limit(&quota(proxy, "alice").await)["remaining"], 3);
    assert_eq!(up.request_count(), forwarded);

    // The limit admits exactly the 3 Alice was told of.
    for i in 0..3 {
        assert_eq!(
            send(proxy, "GET", "/api/x", Some("alice")).await.0,
            StatusCode::OK,
            "request {i} of the 3 left"
        );
    }
    assert_eq!(
        send(proxy, "GET", "/api/x", Some("alice")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let alice = quota(proxy, "alice").await;
    assert_eq!(first_limit(&alice)["remaining"], 0);
    assert_eq!(first_limit(&alice)["would_pass"], false);
    // The next request is refused: the usage says when a retry passes, as its 429 will.
    let retry = first_limit(&alice)["retry_after_seconds"].as_u64();
    assert!(retry.is_some_and(|t| (1..=60).contains(&t)), "{alice}");
    assert_eq!(alice["routes"][0]["limits"][1]["remaining"], 5, "{alice}");
    let bob = quota(proxy, "bob").await;
    assert_eq!(first_limit(&bob)["remaining"], 5);
    assert_eq!(bob["routes"][0]["limits"][1]["remaining"], 10);
    assert_eq!(up.request_count(), forwarded + 3);
}

#[tokio::test]
async fn each_caller_sees_only_their_own_usage_in_memory() {
    let up = upstream().start().await;
    let proxy = proxy(quota_config(&up, None)).start().await;
    each_caller_sees_their_own(&proxy, &up).await;
    // A memory store keeps its limits in this process.
    assert_eq!(first_limit(&quota(&proxy, "carol").await)["scope"], "local");
}

#[tokio::test]
async fn each_caller_sees_only_their_own_usage_in_redis() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url())
        .timeout("300ms")
        .on_error("deny");
    let proxy = proxy(quota_config(&up, Some(&store))).start().await;
    proxy.wait_store().await;
    each_caller_sees_their_own(&proxy, &up).await;
    assert_eq!(
        first_limit(&quota(&proxy, "carol").await)["scope"],
        "global"
    );
}

#[tokio::test]
async fn a_tier_member_sees_the_tier_and_an_allow_listed_caller_is_exempt() {
    let up = upstream().start().await;
    let config = quota_config(&up, None).allow(allow().identity("user", ["ops"]));
    let proxy = proxy(config).start().await;
    for _ in 0..4 {
        assert_eq!(
            send(&proxy, "GET", "/api/x", Some("vip")).await.0,
            StatusCode::OK
        );
    }
    let vip = quota(&proxy, "vip").await;
    assert_eq!(vip["routes"][0]["tier"], "gold", "{vip}");
    let gold = first_limit(&vip);
    assert_eq!(gold["name"], "gold-calls");
    assert_eq!(gold["limit"], 50);
    assert_eq!(gold["remaining"], 46);
    let ops = quota(&proxy, "ops").await;
    assert_eq!(ops["routes"], json!([{ "route": "api", "exempt": true }]));
}

#[tokio::test]
async fn the_usage_endpoint_refuses_politely_past_its_own_rate() {
    let up = upstream().start().await;
    let proxy = proxy(quota_config(&up, None)).start().await;
    // Its rate is per client address, whichever identity each request carries.
    for i in 0..10 {
        let (status, _, body) = send(&proxy, "GET", "/_quota", Some(&format!("u{i}"))).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
    }
    let (status, headers, body) = send(&proxy, "GET", "/_quota", Some("someone-else")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(
        problem["detail"],
        format!("the usage endpoint answers at most 10 requests per 10s from one client: retry after {retry}s")
    );
    // The routes themselves are not affected, and nothing of this reached the application.
    assert_eq!(up.request_count(), 0);
    assert_eq!(
        send(&proxy, "GET", "/api/x", Some("alice")).await.0,
        StatusCode::OK
    );
    assert_eq!(up.request_count(), 1);
}

#[tokio::test]
async fn only_get_and_head_are_answered() {
    let up = upstream().start().await;
    let proxy = proxy(quota_config(&up, None)).start().await;
    let (status, headers, body) = send(&proxy, "POST", "/_quota", Some("alice")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert_eq!(headers["allow"], "GET, HEAD");
    assert_eq!(headers["content-type"], "application/problem+json");
    let (status, headers, body) = send(&proxy, "HEAD", "/_quota", Some("alice")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, "");
    // The query is no part of the path: still answered here.
    let (status, _, body) = send(&proxy, "GET", "/_quota?pretty=1", Some("alice")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(up.request_count(), 0);
}

#[tokio::test]
async fn without_usage_the_path_is_proxied_like_any_other() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/api")
                .key("user")
                .limit(limit::fixed_window(5, "1m")),
        );
    let proxy = proxy(config).start().await;
    let (status, _, body) = send(&proxy, "GET", "/_quota", Some("alice")).await;
    assert_eq!(status, StatusCode::OK);
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["uri"], "/_quota", "the application's answer: {body}");
    assert_eq!(up.request_count(), 1);
}

#[tokio::test]
async fn a_route_keyed_by_a_path_segment_is_listed_as_unknown() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("tenant", [source::path_segment(2)])
        .route(
            route("tenants")
                .prefix("/t/")
                .key("tenant")
                .limit(limit::fixed_window(5, "1m").name("per-tenant")),
        )
        .set("usage", json!({ "path": "/_quota" }));
    let proxy = proxy(config).start().await;
    let (status, _, body) = send(&proxy, "GET", "/_quota", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let route = &answer["routes"][0];
    assert_eq!(route["route"], "tenants");
    assert_eq!(route["identity"], "path_segment");
    assert!(route["unknown"].is_string(), "{answer}");
    assert!(route.get("limits").is_none(), "{answer}");
}

#[tokio::test]
async fn with_redis_down_the_usage_endpoint_answers_503_without_hanging() {
    let mut server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url())
        .timeout("200ms")
        .on_error("deny");
    let proxy = proxy(quota_config(&up, Some(&store))).start().await;
    proxy.wait_store().await;
    assert_eq!(first_limit(&quota(&proxy, "alice").await)["remaining"], 5);
    server.stop();
    // Bounded by the store's timeout: the guard here only keeps a hang from stalling the suite.
    let (status, headers, body) = tokio::time::timeout(
        Duration::from_secs(10),
        send(&proxy, "GET", "/_quota", Some("alice")),
    )
    .await
    .expect("the usage endpoint hung with Redis down");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 503);
    assert_eq!(up.request_count(), 0);
}

#[tokio::test]
async fn a_caller_in_the_penalty_box_is_told_when_it_ends() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("user", [source::header("x-user")])
        .route(
            route("login")
                .prefix("/login")
                .key("user")
                .limit(
                    limit::token_bucket(1, "10s")
                        .burst(2)
                        .block_for("30s")
                        .name("tries"),
                )
                .limit(limit::sliding_log(1000, "1h").key("global").name("all")),
        )
        .set("usage", json!({ "path": "/_quota" }));
    let proxy = proxy(config).start().await;
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(
            send(&proxy, "GET", "/login", Some("mallory")).await.0,
            expected
        );
    }
    let answer = quota(&proxy, "mallory").await;
    let tries = first_limit(&answer);
    assert_eq!(tries["would_pass"], false, "{answer}");
    // The block (30 s) outlasts the bucket's own wait (a token every 10 s), and the next
    // refusal's Retry-After says the same.
    let retry = tries["retry_after_seconds"].as_u64().unwrap();
    assert!((29..=30).contains(&retry), "{answer}");
    assert_eq!(tries["ratelimit"], format!("\"tries\";r=0;t={retry}"));
    let (status, headers, _) = send(&proxy, "GET", "/login", Some("mallory")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let refused: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        refused <= retry && refused + 2 >= retry,
        "{refused} vs {answer}"
    );
    // A limit keyed `global` is everyone's counter, and says so.
    let all = &answer["routes"][0]["limits"][1];
    assert_eq!(all["shared_by_everyone"], true, "{answer}");
    assert_eq!(all["remaining"], 998);
    assert_eq!(tries["shared_by_everyone"], false);
}

#[tokio::test]
async fn a_bearer_token_is_never_echoed() {
    let up = upstream().start().await;
    let config = config()
        .upstream(&up.url())
        .identity("token", [source::bearer()])
        .route(
            route("api")
                .key("token")
                .limit(limit::sliding_log(5, "1m").name("calls")),
        )
        .set("usage", json!({ "path": "/_quota" }));
    let proxy = proxy(config).start().await;
    let token = "s3cr3t-token-value";
    let ask = |path: &'static str| {
        Request::get(proxy.url(path))
            .header("authorization", format!("Bearer {token}"))
            .body(body(""))
            .unwrap()
    };
    let response = http1_client().request(ask("/anything")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let _ = text(response).await;
    let response = http1_client().request(ask("/_quota")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = text(response).await;
    assert!(!body.contains(token), "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["routes"][0]["identity"], "bearer");
    assert_eq!(first_limit(&answer)["remaining"], 4, "{answer}");
    // The route matches every path, the usage path included: still answered by tollgate.
    assert_eq!(up.request_count(), 1);
}

/// `POST` (or `DELETE`) of `/limits/override` on `proxy`'s admin listener for `user` on `/api`.
async fn override_on(proxy: &ProxyHandle, method: &str, user: &str, how: &str) {
    let port = proxy.admin.expect("admin listener").port();
    let request = Request::builder()
        .method(method)
        .uri(format!(
            "http://127.0.0.1:{port}/limits/override?route=api&identity={user}{how}"
        ))
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let answer = text(response).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// The RateLimit fields of a response (or of `/_quota`'s `headers`): the policy as is, the
/// `RateLimit` field as (name, remaining, seconds).
fn fields_of(ratelimit: &str) -> (String, u64, u64) {
    let mut parts = ratelimit.split(';');
    let name = parts.next().unwrap().to_owned();
    let mut number = |key: &str| {
        let part = parts.next().unwrap();
        part.strip_prefix(key)
            .unwrap_or_else(|| panic!("{ratelimit}"))
            .parse::<u64>()
            .unwrap()
    };
    let r = number("r=");
    let t = number("t=");
    (name, r, t)
}

/// One request of alice's to `/api` on `proxy`, admitted: its RateLimit-Policy and RateLimit.
async fn admitted_fields(proxy: &ProxyHandle) -> (String, (String, u64, u64)) {
    let (status, headers, body) = send(proxy, "GET", "/api/x", Some("alice")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let policy = headers["ratelimit-policy"].to_str().unwrap().to_owned();
    (policy, fields_of(headers["ratelimit"].to_str().unwrap()))
}

/// `/_quota` on `proxy` agrees with the responses around it: its `headers` are the fields
/// the last response carried (nothing was spent since) and the next response carries them
/// less the one unit it spends. Returns the `/_quota` answer.
async fn quota_agrees_with_responses(
    proxy: &ProxyHandle,
    last: &(String, (String, u64, u64)),
) -> Value {
    let answer = quota(proxy, "alice").await;
    let route = &answer["routes"][0];
    let policy = route["headers"]["ratelimit-policy"].as_str().unwrap();
    let (name, r, t) = fields_of(route["headers"]["ratelimit"].as_str().unwrap());
    assert_eq!(policy, last.0, "{answer}");
    assert_eq!((&name, r), (&last.1 .0, last.1 .1), "{answer}");
    // Seconds move on while the test runs.
    assert!(
        t <= last.1 .2 && t + 2 >= last.1 .2,
        "{answer} after {last:?}"
    );
    let next = admitted_fields(proxy).await;
    assert_eq!(next.0, policy, "the next response's policy");
    assert_eq!(
        (&next.1 .0, next.1 .1),
        (&name, r - 1),
        "{answer}: {next:?}"
    );
    answer
}

/// With a temporary override in force for alice (set on `admin`'s admin listener, read and
/// spent on `proxy`: the same instance, or another replica on the same Redis), `/_quota`
/// reports the override's limits, its remaining counts and its end, and its `headers` are the
/// fields alice's responses carry: for `multiply`, then for `limit`.
async fn usage_follows_the_override(admin: &ProxyHandle, proxy: &ProxyHandle) {
    for _ in 0..2 {
        admitted_fields(proxy).await;
    }
    override_on(admin, "POST", "alice", "&multiply=10&for=1h").await;
    // Another replica follows (announced on Redis): wait until it applies it.
    override_applied(proxy, "multiply", 10.0).await;
    let mut last = None;
    for _ in 0..7 {
        last = Some(admitted_fields(proxy).await);
    }
    let last = last.unwrap();
    // The minute's count goes on under the override (2 before it, 7 under it: 41 of 50 left);
    // the hour's token bucket counts afresh on a key of the override's own (7 of 100).
    assert_eq!(last.1, ("\"calls\"".to_owned(), 41, last.1 .2), "{last:?}");
    assert_eq!(last.0, "\"calls\";q=50;w=60, \"hourly\";q=100;w=3600");
    let answer = quota_agrees_with_responses(proxy, &last).await;
    let route = &answer["routes"][0];
    assert_eq!(route["override"]["multiply"], 10.0, "{answer}");
    let expires_at = humantime::parse_rfc3339(route["override"]["expires_at"].as_str().unwrap())
        .expect("RFC 3339");
    let left = expires_at.duration_since(SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(3500), "{answer}");
    let calls = first_limit(&answer);
    assert_eq!(
        (&calls["limit"], &calls["remaining"]),
        (&json!(50), &json!(41))
    );
    assert_eq!(calls["policy"], "\"calls\";q=50;w=60");
    let hourly = &route["limits"][1];
    assert_eq!(
        (&hourly["limit"], &hourly["remaining"]),
        (&json!(100), &json!(93))
    );

    // A limit instead: 20 a minute (the shortest period) and the hour scaled as much (10 ->
    // 40, never 20 an hour), on the same count (11 spent in the minute).
    override_on(admin, "POST", "alice", "&limit=20&for=30m").await;
    override_applied(proxy, "limit", 20.0).await;
    let last = admitted_fields(proxy).await;
    assert_eq!(last.0, "\"calls\";q=20;w=60, \"hourly\";q=40;w=3600");
    let answer = quota_agrees_with_responses(proxy, &last).await;
    let route = &answer["routes"][0];
    assert_eq!(route["override"]["limit"], 20, "{answer}");
    assert!(route["override"].get("multiply").is_none(), "{answer}");
    assert_eq!(first_limit(&answer)["limit"], 20);
    assert_eq!(first_limit(&answer)["remaining"], 9, "{answer}");

    // Bob has no override: the route's own limits, and says so.
    let bob = quota(proxy, "bob").await;
    assert_eq!(bob["routes"][0]["override"], Value::Null, "{bob}");
    assert_eq!(first_limit(&bob)["limit"], 5);
}

#[tokio::test]
async fn usage_under_an_override_in_memory() {
    let _own = memory_operator_state().await;
    let up = upstream().start().await;
    let proxy = proxy(quota_config(&up, None)).start().await;
    usage_follows_the_override(&proxy, &proxy).await;
}

#[tokio::test]
async fn usage_under_an_override_in_redis() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url())
        .timeout("300ms")
        .on_error("deny");
    let proxy = proxy(quota_config(&up, Some(&store))).start().await;
    proxy.wait_store().await;
    usage_follows_the_override(&proxy, &proxy).await;
}

#[tokio::test]
async fn usage_under_an_override_set_on_another_replica() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url())
        .timeout("300ms")
        .on_error("deny");
    let one = proxy(quota_config(&up, Some(&store))).start().await;
    let two = proxy(quota_config(&up, Some(&store))).start().await;
    one.wait_store().await;
    two.wait_store().await;
    usage_follows_the_override(&one, &two).await;
}

/// On a spent limit of each algorithm, `/_quota` tells what the next request is answered:
/// `retry_after_seconds` and the RateLimit `t` are the next 429's `Retry-After` (read just
/// before and just after it, so a second turning in between shows as at most the seconds that
/// passed), and `reset_after_seconds` (full again) is never sooner than that.
#[tokio::test]
async fn the_usage_of_a_spent_limit_is_the_next_refusals_retry_after_on_every_algorithm() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url()).timeout("2s");
    let algorithms = [
        ("sliding_window", limit::sliding_window(3, "1h")),
        // A day: no window turns during the test.
        ("fixed_window", limit::fixed_window(3, "1d")),
        ("gcra", limit::gcra(3, "1h").burst(3)),
        ("token_bucket", limit::token_bucket(3, "1h").burst(3)),
    ];
    let mut config = config()
        .upstream(&up.url())
        .store(store)
        .identity("user", [source::header("x-user")])
        .set("usage", json!({ "path": "/_quota" }));
    for (name, limit) in algorithms.iter().cloned() {
        config = config.route(
            route(name)
                .prefix(&format!("/{name}"))
                .key("user")
                .limit(limit.name(name)),
        );
    }
    let proxy = proxy(config).start().await;
    proxy.wait_store().await;
    for (i, (name, _)) in algorithms.iter().enumerate() {
        let path = format!("/{name}/x");
        for n in 0..3 {
            let (status, _, body) = send(&proxy, "GET", &path, Some("dora")).await;
            assert_eq!(status, StatusCode::OK, "{name}: request {n} of 3: {body}");
        }
        let read = async || {
            let answer = quota(&proxy, "dora").await;
            let route = &answer["routes"][i];
            assert_eq!(route["route"], *name, "{answer}");
            let limit = route["limits"][0].clone();
            assert_eq!(limit["remaining"], 0, "{name}: {answer}");
            assert_eq!(limit["would_pass"], false, "{name}: {answer}");
            let retry = limit["retry_after_seconds"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: no retry_after_seconds: {answer}"));
            assert_eq!(
                limit["ratelimit"],
                format!("\"{name}\";r=0;t={retry}"),
                "{answer}"
            );
            assert_eq!(
                route["headers"]["ratelimit"],
                format!("\"{name}\";r=0;t={retry}"),
                "{answer}"
            );
            let reset = limit["reset_after_seconds"].as_u64().unwrap();
            assert!(
                reset >= retry,
                "{name}: full again before a retry passes: {answer}"
            );
            retry
        };
        let started = std::time::Instant::now();
        let before = read().await;
        let (status, headers, body) = send(&proxy, "GET", &path, Some("dora")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}: {body}");
        let refused: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert_eq!(
            headers["ratelimit"].to_str().unwrap(),
            format!("\"{name}\";r=0;t={refused}")
        );
        let after = read().await;
        let passed = started.elapsed().as_secs() + 1;
        assert!(
            before >= refused && refused >= after && before - after <= passed,
            "{name}: /_quota said {before} before and {after} after a refusal with Retry-After {refused}"
        );
    }
    assert_eq!(up.request_count(), 12);
}
