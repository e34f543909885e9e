//! The operators' admin endpoints end to end, on real proxies and a real Redis: who is denied
//! most (`/limits/top`), one caller's state (`/limits/state`) and its reset
//! (`POST /limits/reset`, on every replica at once, deny caches included), the bearer token
//! that guards mutations, and `tollgate limits get|reset` against Redis and against a running
//! instance.

use std::time::Duration;

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::Value;

fn redis_store(redis: &RedisServer, prefix: &str) -> Option<Store> {
    Some(
        store::redis(&redis.url())
            .key_prefix(prefix)
            .timeout("500ms")
            .on_error("deny"),
    )
}

/// The route `api` on every path, keyed by the `x-user` header, with `limits`.
fn api<const N: usize>(limits: [Limit; N]) -> Route {
    route("api").prefix("/").key("user").limits(limits)
}

/// The route `api` behind `store` (memory without one), with the admin listener on
/// 127.0.0.1:0.
fn api_config(up: &Upstream, store: Option<Store>, api: Route) -> Config {
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(api);
    match store {
        Some(store) => config.store(store),
        None => config,
    }
}

async fn start(yaml: impl Into<String>) -> ProxyHandle {
    let proxy = proxy(yaml).start().await;
    proxy.wait_store().await;
    proxy
}

async fn call(proxy: &ProxyHandle, user: &str) -> StatusCode {
    let request = Request::get(proxy.url("/api/x"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

/// The admin listener's address to connect to (one bound to 0.0.0.0 answers on loopback).
fn admin_url(proxy: &ProxyHandle, path_and_query: &str) -> String {
    let port = proxy.admin.expect("admin listener").port();
    format!("http://127.0.0.1:{port}{path_and_query}")
}

async fn admin(
    proxy: &ProxyHandle,
    method: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let (status, _, text) = exchange(method, &admin_url(proxy, path_and_query), headers).await;
    (status, text)
}

async fn admin_json(
    proxy: &ProxyHandle,
    method: &str,
    path_and_query: &str,
) -> (StatusCode, Value) {
    let (status, text) = admin(proxy, method, path_and_query, &[]).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

/// (identity, count, error) per caller listed for route `api`.
fn listed(top: &Value) -> Vec<(String, u64, u64)> {
    let routes = top["routes"].as_array().unwrap();
    let api = routes
        .iter()
        .find(|r| r["route"] == "api")
        .expect("route api listed");
    api["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["identity"].as_str().unwrap().to_owned(),
                c["count"].as_u64().unwrap(),
                c["error"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn top_lists_the_callers_denied_most_in_order_in_bounded_memory() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    // The first limit is per user (what the list names); the second, shared by everyone,
    // denies every request after the first, so each distinct caller costs one request.
    let limits = api([
        limit::fixed_window(1000, "1h").name("per-user"),
        limit::fixed_window(1, "1h").key("global").name("everyone"),
    ]);
    let proxy = start(api_config(&up, redis_store(&redis, "top:"), limits)).await;
    assert_eq!(call(&proxy, "warmup").await, StatusCode::OK);
    // Three callers at different rates, interleaved; most of these denials come from the
    // deny cache, and count all the same.
    for i in 0..30 {
        for (user, every) in [("alice", 1), ("bob", 3), ("carol", 2)] {
            if i % every == 0 {
                assert_eq!(call(&proxy, user).await, StatusCode::TOO_MANY_REQUESTS);
            }
        }
    }
    let (status, top) = admin_json(&proxy, "GET", "/limits/top").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        listed(&top),
        vec![
            ("alice".to_owned(), 30, 0),
            ("carol".to_owned(), 15, 0),
            ("bob".to_owned(), 10, 0)
        ]
    );
    assert_eq!(top["window_seconds"], 60);

    // The text form, by parameter and by Accept.
    let (status, text) = admin(&proxy, "GET", "/limits/top?format=text", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let alice = text.find("alice (header)").expect(&text);
    let carol = text.find("carol (header)").expect(&text);
    assert!(alice < carol && text.contains("route api"), "{text}");
    let (_, by_accept) = admin(&proxy, "GET", "/limits/top", &[("accept", "text/plain")]).await;
    assert_eq!(by_accept, text);

    // Many distinct callers: the sketch keeps its fixed size (see the unit tests); the heavy
    // three stay on top and the answer holds at most k.
    for i in 0..400 {
        let _ = call(&proxy, &format!("one-off-{i}")).await;
    }
    let (_, top) = admin_json(&proxy, "GET", "/limits/top?k=3").await;
    let names: Vec<String> = listed(&top).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["alice", "carol", "bob"]);
    let (_, top) = admin_json(&proxy, "GET", "/limits/top").await;
    assert_eq!(listed(&top).len(), 10);
    let (status, _) = admin_json(&proxy, "GET", "/limits/top?k=nope").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // No identity ever becomes a metric label.
    let (_, metrics) = admin(&proxy, "GET", "/metrics", &[]).await;
    assert!(
        !metrics.contains("alice") && !metrics.contains("one-off"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_reset_lifts_a_denial_on_both_replicas_at_once() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let limits = api([limit::fixed_window(2, "1h").name("per-user")]);
    let yaml = api_config(&up, redis_store(&redis, "rs:"), limits);
    let a = start(&yaml).await;
    let b = start(yaml).await;
    assert_eq!(call(&a, "alice").await, StatusCode::OK);
    assert_eq!(call(&b, "alice").await, StatusCode::OK);
    assert_eq!(call(&b, "bob").await, StatusCode::OK);
    // Denied on both, and remembered in both deny caches.
    for _ in 0..3 {
        assert_eq!(call(&a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(call(&b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (status, state) = admin_json(&a, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["limits"][0]["allowed"], false);
    assert_eq!(state["limits"][0]["remaining"], 0);

    let (status, done) = admin_json(&a, "POST", "/limits/reset?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["deleted"], 1);
    assert_eq!(done["keys"][0], "rs:{api|header=alice}:per-user");
    // The full quota is back, read on the other replica.
    let (_, state) = admin_json(&b, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(state["limits"][0]["allowed"], true);
    assert_eq!(state["limits"][0]["remaining"], 1);

    // The replica that served the reset admits at once; the other within its watch interval.
    assert_eq!(call(&a, "alice").await, StatusCode::OK);
    eventually(
        "replica b admits alice after the reset",
        PATIENCE,
        async || match call(&b, "alice").await {
            StatusCode::OK => Ok(()),
            StatusCode::TOO_MANY_REQUESTS => Err(StatusCode::TOO_MANY_REQUESTS),
            status => panic!("replica b answered {status} after the reset"),
        },
    )
    .await;
    // Exactly the quota: two requests, then denied again on both.
    assert_eq!(call(&a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(&b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    // Others are untouched: bob had one of two left.
    assert_eq!(call(&a, "bob").await, StatusCode::OK);
    assert_eq!(call(&a, "bob").await, StatusCode::TOO_MANY_REQUESTS);

    // Unknown routes and missing parameters are explained.
    let (status, error) = admin_json(&a, "POST", "/limits/reset?route=nope&identity=alice").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("no route named `nope`"),
        "{error}"
    );
    let (status, error) = admin_json(&a, "GET", "/limits/state?route=api").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error["error"].as_str().unwrap().contains("`identity`"),
        "{error}"
    );
    let (status, _) = admin_json(&a, "GET", "/limits/reset?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // The old endpoints answer as before.
    assert_eq!(
        admin(&a, "GET", "/healthz", &[]).await,
        (StatusCode::OK, "ok\n".into())
    );
    assert_eq!(
        admin(&a, "GET", "/readyz", &[]).await,
        (StatusCode::OK, "ready\n".into())
    );
}

/// Every algorithm on one route, and a tier: two requests taken, then the state as
/// `explain --live` reads it (what would be left after one more request).
fn every_algorithm() -> Route {
    api([
        limit::fixed_window(5, "1h").name("fw"),
        limit::sliding_log(5, "1h").name("sl"),
        limit::sliding_window(5, "1h").name("sw"),
        limit::token_bucket(5, "1h").burst(5).name("tb"),
        limit::gcra(5, "1h").burst(5).name("gc"),
        limit::concurrency(5).name("cc"),
    ])
    .tier(
        tier("gold")
            .values(["vip"])
            .limit(limit::fixed_window(50, "1h").name("gold-fw")),
    )
}

async fn state_and_reset_for_every_algorithm(store: Option<Store>) {
    let up = upstream().start().await;
    let proxy = start(api_config(&up, store, every_algorithm())).await;
    for _ in 0..2 {
        assert_eq!(call(&proxy, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(&proxy, "vip").await, StatusCode::OK);
    let remaining = |state: &Value| -> Vec<(String, u64)> {
        state["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["limit_name"].as_str().unwrap().to_owned(),
                    l["remaining"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (status, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK);
    let after_two: Vec<(String, u64)> = ["fw", "sl", "sw", "tb", "gc"]
        .iter()
        .map(|n| (n.to_string(), 2))
        .chain([("cc".to_string(), 4)])
        .collect();
    assert_eq!(remaining(&state), after_two, "{state}");
    // A value named by a tier also shows the tier's limits.
    let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=vip").await;
    let vip = remaining(&state);
    assert_eq!(vip.len(), 7, "{state}");
    assert_eq!(vip[6], ("gold-fw".to_string(), 48));
    assert_eq!(state["limits"][6]["tier"], "gold");
    // Text form.
    let (_, text) = admin(
        &proxy,
        "GET",
        "/limits/state?route=api&identity=alice&format=text",
        &[],
    )
    .await;
    assert!(text.contains("limit     fw (fixed_window "), "{text}");
    assert!(text.contains(", by header)\n  key       "), "{text}");
    assert!(text.contains("would pass: 2 of 5 left"), "{text}");

    for who in ["alice", "vip"] {
        let (status, _) = admin_json(
            &proxy,
            "POST",
            &format!("/limits/reset?route=api&identity={who}"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=alice").await;
    let full: Vec<(String, u64)> = ["fw", "sl", "sw", "tb", "gc", "cc"]
        .iter()
        .map(|n| (n.to_string(), 4))
        .collect();
    assert_eq!(remaining(&state), full, "{state}");
    let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=vip").await;
    assert_eq!(remaining(&state)[6], ("gold-fw".to_string(), 49));
}

#[tokio::test]
async fn state_and_reset_cover_every_algorithm_and_tiers_in_redis() {
    let redis = RedisServer::start();
    state_and_reset_for_every_algorithm(redis_store(&redis, "alg:")).await;
}

#[tokio::test]
async fn state_and_reset_cover_every_algorithm_and_tiers_in_memory() {
    state_and_reset_for_every_algorithm(None).await;
}

#[tokio::test]
async fn mutations_need_the_token_on_a_listener_that_is_not_loopback() {
    let up = upstream().start().await;
    let limits = api([limit::fixed_window(1, "1h")]);
    // SAFETY (edition 2021: safe): only this test reads this variable.
    std::env::set_var("TOLLGATE_TEST_ADMIN_TOKEN", "let-me-in");
    let guarded = start(
        api_config(&up, None, limits.clone())
            .admin_with_token("0.0.0.0:0", "TOLLGATE_TEST_ADMIN_TOKEN"),
    )
    .await;
    assert_eq!(call(&guarded, "alice").await, StatusCode::OK);
    assert_eq!(call(&guarded, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let reset = "/limits/reset?route=api&identity=alice";
    let (status, text) = admin(&guarded, "POST", reset, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("missing `Authorization: Bearer"), "{text}");
    let (status, text) = admin(
        &guarded,
        "POST",
        reset,
        &[("authorization", "Bearer let-me-out")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(text.contains("wrong admin token"), "{text}");
    // Reads need no token; the refused resets changed nothing.
    assert_eq!(call(&guarded, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let (status, _) = admin(
        &guarded,
        "GET",
        "/limits/state?route=api&identity=alice",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = admin(
        &guarded,
        "POST",
        reset,
        &[("authorization", "Bearer let-me-in")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(call(&guarded, "alice").await, StatusCode::OK);

    // Not loopback and no token configured: mutations are off.
    let open = start(api_config(&up, None, limits).admin("0.0.0.0:0")).await;
    let (status, text) = admin(
        &open,
        "POST",
        reset,
        &[("authorization", "Bearer let-me-in")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(text.contains("not on a loopback address"), "{text}");
}

#[tokio::test]
async fn the_limits_command_reads_and_resets_through_redis() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let limits = api([limit::gcra(2, "1m").burst(2).name("per-user")]);
    let yaml = api_config(&up, redis_store(&redis, "cli:"), limits);
    let running = start(&yaml).await;
    for _ in 0..2 {
        assert_eq!(call(&running, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(&running, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let dir = tempfile::tempdir().unwrap();
    // No admin listener in the file: the command talks to Redis alone.
    let file = write_config(&dir, &yaml.without_admin().yaml());
    let file = file.to_str().unwrap();
    let (code, out, err) = run_tollgate(&[
        "limits",
        "get",
        "--config",
        file,
        "--route",
        "api",
        "--identity",
        "alice",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("identity  alice"), "{out}");
    assert!(
        out.contains("limit     per-user (gcra global, by header)"),
        "{out}"
    );
    assert!(out.contains("LIMITED: 0 of 2 left"), "{out}");
    let (code, out, err) = run_tollgate(&[
        "limits",
        "reset",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "alice",
        "--json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let done: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["deleted"], 1);
    // The running instance, whose deny cache held the denial, admits again.
    eventually(
        "the running instance admits alice after the reset",
        PATIENCE,
        async || {
            let status = call(&running, "alice").await;
            until(status == StatusCode::OK, status)
        },
    )
    .await;
    let (code, _, err) = run_tollgate(&[
        "limits",
        "get",
        "-c",
        file,
        "--route",
        "nope",
        "--identity",
        "alice",
    ])
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("no route named `nope`"), "{err}");
}

#[tokio::test]
async fn the_limits_command_goes_through_a_running_instance_for_a_memory_store() {
    let _own = memory_operator_state().await;
    let up = upstream().start().await;
    let limits = api([limit::sliding_window(1, "1h").name("per-user")]);
    let running = start(api_config(&up, None, limits.clone())).await;
    assert_eq!(call(&running, "a b").await, StatusCode::OK);
    assert_eq!(call(&running, "a b").await, StatusCode::TOO_MANY_REQUESTS);

    // The file names the instance's admin address, as a deployment's file would.
    let dir = tempfile::tempdir().unwrap();
    let admin_addr = running.admin.unwrap().to_string();
    let file = write_config(
        &dir,
        &api_config(&up, None, limits).admin(&admin_addr).yaml(),
    );
    let file = file.to_str().unwrap();
    let (code, out, err) = run_tollgate(&[
        "limits",
        "get",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "a b",
        "--json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let state: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(state["limits"][0]["allowed"], false);
    // A value that is not key-safe is shown hashed, as in the logs.
    assert!(
        state["identity"].as_str().unwrap().starts_with("sha256:"),
        "{state}"
    );
    let (code, out, err) = run_tollgate(&[
        "limits",
        "reset",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "a b",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 key(s) deleted"), "{out}");
    assert_eq!(call(&running, "a b").await, StatusCode::OK);

    // --admin overrides the file; a listener that is not there is a failure (exit 1).
    let (code, _, err) = run_tollgate(&[
        "limits",
        "get",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "x",
        "--admin",
        "http://127.0.0.1:1",
    ])
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach the admin listener"), "{err}");
    let (code, _, err) = run_tollgate(&[
        "limits",
        "reset",
        "-c",
        file,
        "--route",
        "nope",
        "--identity",
        "x",
    ])
    .await;
    assert_eq!(code, 2, "{err}");
}

/// On a Redis Cluster a reset deletes keys slot by slot (the keys of one decision share a hash
/// tag) and the reset generation reaches the other replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_works_on_a_cluster_across_slots_and_replicas() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let store = store::cluster(cluster.urls())
        .key_prefix("cl:")
        .timeout("2s")
        .on_error("deny");
    let limits = api([
        limit::token_bucket(2, "1h").burst(2).name("per-user"),
        limit::fixed_window(1000, "1h")
            .key("global")
            .name("everyone"),
    ]);
    let yaml = api_config(&up, Some(store), limits);
    let a = start(&yaml).await;
    let b = start(yaml).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for user in ["alice", "x}{evil"] {
        assert_eq!(call(&a, user).await, StatusCode::OK);
        assert_eq!(call(&b, user).await, StatusCode::OK);
        assert_eq!(call(&a, user).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(call(&b, user).await, StatusCode::TOO_MANY_REQUESTS);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for user in ["alice", "x%7D%7Bevil"] {
        let (status, done) = admin_json(
            &a,
            "POST",
            &format!("/limits/reset?route=api&identity={user}"),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        // The per-user bucket (the global counter is everyone's and not the caller's: it is
        // not a key of this value).
        assert_eq!(done["deleted"], 1, "{done}");
        assert_eq!(
            done["kept_shared_by_everyone"][0], "cl:{api}:everyone:*",
            "{done}"
        );
    }
    for user in ["alice", "x}{evil"] {
        eventually(
            &format!("b admits {user} after the reset"),
            PATIENCE,
            async || {
                let status = call(&b, user).await;
                until(status == StatusCode::OK, status)
            },
        )
        .await;
        assert_eq!(call(&a, user).await, StatusCode::OK);
        assert_eq!(call(&a, user).await, StatusCode::TOO_MANY_REQUESTS);
    }
}

/// A caller in the penalty box (`block_for`) on `a` and `b` (two replicas on one Redis, or
/// the same memory-store proxy twice): state shows the block, a reset lifts it on both at
/// once, and the caller then gets exactly its quota again.
async fn a_reset_lifts_a_penalty_box(a: &ProxyHandle, b: &ProxyHandle) {
    assert_eq!(call(a, "alice").await, StatusCode::OK);
    // The denial starts a 10-minute block, far past the fixed window's own reset.
    assert_eq!(call(a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let (status, state) = admin_json(b, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!(state["limits"][0]["allowed"], false, "{state}");
    let retry = state["limits"][0]["retry_after_seconds"].as_f64().unwrap();
    assert!(retry > 590.0 && retry <= 600.0, "the block's end: {state}");

    let (status, done) = admin_json(a, "POST", "/limits/reset?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    // The window's count and the block marker.
    assert_eq!(done["deleted"], 2, "{done}");
    let (_, state) = admin_json(b, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(state["limits"][0]["allowed"], true, "{state}");
    assert_eq!(state["limits"][0]["remaining"], 0, "{state}");

    // The replica that served the reset admits at once; the other within its watch interval.
    let mut admitted = 0;
    for proxy in [b, a] {
        eventually("alice admitted after the reset", PATIENCE, async || {
            match call(proxy, "alice").await {
                StatusCode::OK => {
                    admitted += 1;
                    Ok(())
                }
                // Once one replica admitted her, the quota of 1 is spent: the other must
                // refuse, and that is the block starting again.
                StatusCode::TOO_MANY_REQUESTS if admitted == 1 => Ok(()),
                StatusCode::TOO_MANY_REQUESTS => Err(StatusCode::TOO_MANY_REQUESTS),
                status => panic!("alice got {status} after the reset"),
            }
        })
        .await;
    }
    assert_eq!(admitted, 1, "exactly the quota of 1 after the reset");
    assert_eq!(call(a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    // Bob was never blocked.
    assert_eq!(call(b, "bob").await, StatusCode::OK);
}

fn blocking_limit() -> Route {
    api([limit::fixed_window(1, "5m")
        .block_for("10m")
        .name("per-user")])
}

#[tokio::test]
async fn a_reset_lifts_a_penalty_box_on_both_replicas_at_once() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = api_config(&up, redis_store(&redis, "pb:"), blocking_limit());
    let a = start(&yaml).await;
    let b = start(yaml).await;
    a_reset_lifts_a_penalty_box(&a, &b).await;
}

#[tokio::test]
async fn a_reset_lifts_a_penalty_box_in_memory() {
    let up = upstream().start().await;
    let a = start(api_config(&up, None, blocking_limit())).await;
    a_reset_lifts_a_penalty_box(&a, &a).await;
}

/// Every operator endpoint refuses what it does not take with 400 and says what it does take:
/// `k` out of range, a `format` other than json or text, an unknown or repeated parameter.
/// A refused reset changes nothing; the allowed values still work.
#[tokio::test]
async fn admin_parameters_outside_what_is_allowed_get_400_naming_what_is() {
    let up = upstream().start().await;
    let proxy = start(api_config(
        &up,
        None,
        api([limit::fixed_window(1, "1h").name("one")]),
    ))
    .await;
    assert_eq!(call(&proxy, "alice").await, StatusCode::OK);
    assert_eq!(call(&proxy, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    let refused = [
        (
            "GET",
            "/limits/top?k=0",
            "k must be a whole number from 1 to 128 (the callers each route keeps)",
        ),
        (
            "GET",
            "/limits/top?k=1000000",
            "k must be a whole number from 1 to 128 (the callers each route keeps)",
        ),
        (
            "GET",
            "/limits/top?format=xml",
            "format must be `json` or `text`",
        ),
        (
            "GET",
            "/limits/top?kk=3",
            "unknown query parameter `kk`: /limits/top takes k, format, scope",
        ),
        (
            "GET",
            "/limits/top?k=3&k=4",
            "query parameter `k` given more than once",
        ),
        (
            "GET",
            "/limits/state?route=api&identity=alice&format=xml",
            "format must be `json` or `text`",
        ),
        (
            "GET",
            "/limits/state?route=api&identity=alice&user=bob",
            "unknown query parameter `user`: /limits/state takes route, identity, format",
        ),
        (
            "POST",
            "/limits/reset?route=api&identity=alice&all=1",
            "unknown query parameter `all`: /limits/reset takes route, identity, limit_name, format",
        ),
        (
            "POST",
            "/limits/reset?route=api&identity=alice&format=yaml",
            "format must be `json` or `text`",
        ),
    ];
    for (method, path, why) in refused {
        let (status, answer) = admin_json(&proxy, method, path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {answer}");
        assert_eq!(
            answer,
            serde_json::json!({ "error": why }),
            "{method} {path}"
        );
    }
    // The refused resets reset nothing.
    assert_eq!(call(&proxy, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    // The allowed values, at the edges.
    for path in [
        "/limits/top?k=1",
        "/limits/top?k=128",
        "/limits/top?k=128&format=json",
        "/limits/state?route=api&identity=alice&format=json",
    ] {
        let (status, answer) = admin_json(&proxy, "GET", path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
    }
    let (_, top) = admin_json(&proxy, "GET", "/limits/top?k=128").await;
    assert_eq!(top["k"], 128);
    assert_eq!(listed(&top), vec![("alice".to_owned(), 2, 0)]);
    let (status, text) = admin(&proxy, "GET", "/limits/top?format=text&k=1", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("route api\n") && text.contains("alice (header)"),
        "{text}"
    );
    let (status, answer) = admin_json(
        &proxy,
        "POST",
        "/limits/reset?route=api&identity=alice&format=json",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(call(&proxy, "alice").await, StatusCode::OK);
}

/// Sends `payload` with `content_type` to the admin listener: (status, `Allow`, body).
async fn send(
    proxy: &ProxyHandle,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    payload: &'static str,
) -> (StatusCode, Option<String>, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(admin_url(proxy, path));
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = http1_client()
        .request(request.body(body(payload)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let allow = response
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, allow, text(response).await)
}

/// Sends a JSON body and expects 200: the answer.
async fn send_ok(proxy: &ProxyHandle, method: &str, path: &str, payload: &'static str) -> String {
    let (status, _, answer) = send(proxy, method, path, Some("application/json"), payload).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{method} {path} {payload}: {answer}"
    );
    answer
}

/// Issue 40: the admin API takes its parameters from a JSON body as from the query (the same
/// checks, a name in both refused as given twice), refuses any other body with 400 saying
/// why instead of ignoring it, and a 405 lists in `Allow` every method the endpoint takes.
#[tokio::test]
async fn a_json_body_is_read_like_the_query_and_any_other_body_is_refused() {
    let _own = memory_operator_state().await;
    let up = upstream().start().await;
    let proxy = start(api_config(&up, None, api([limit::fixed_window(2, "1h")]))).await;
    let json = Some("application/json");
    for _ in 0..2 {
        assert_eq!(call(&proxy, "acme").await, StatusCode::OK);
    }
    assert_eq!(call(&proxy, "acme").await, StatusCode::TOO_MANY_REQUESTS);
    // An override from a JSON body, numbers as numbers: acme gets 2 x 3 = 6 an hour, of which
    // the 2 used count: 4 more.
    send_ok(
        &proxy,
        "POST",
        "/limits/override",
        r#"{"route": "api", "identity": "acme", "multiply": 3, "for": "1h"}"#,
    )
    .await;
    for _ in 0..4 {
        assert_eq!(call(&proxy, "acme").await, StatusCode::OK);
    }
    assert_eq!(call(&proxy, "acme").await, StatusCode::TOO_MANY_REQUESTS);
    // Query and body together, each name once.
    let answer = send_ok(
        &proxy,
        "GET",
        "/limits/state?route=api",
        r#"{"identity": "acme"}"#,
    )
    .await;
    let state: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(state["identity"], "acme", "{answer}");
    // Refused, each with why; nothing is carried out.
    for (content_type, payload, says) in [
        (
            Some("application/x-www-form-urlencoded"),
            "route=api&identity=acme",
            "a body of type `application/x-www-form-urlencoded` is not read: give the parameters in the query, or as a JSON object with `Content-Type: application/json`",
        ),
        (None, r#"{"route": "api", "identity": "acme"}"#, "a body of type `(none)` is not read"),
        (json, r#"{"route": "api", "identity": "#, "the body is not valid JSON"),
        (json, r#"["api", "acme"]"#, "the JSON body must be an object of the parameters"),
        (json, r#"{"route": "api", "identity": {"v": 1}}"#, "`identity` in the JSON body must be a string, a number or a boolean"),
        (json, r#"{"route": "api", "identity": "acme", "bogus": 1}"#, "unknown query parameter `bogus`: /limits/reset takes route, identity, limit_name, format"),
    ] {
        let (status, _, answer) = send(&proxy, "POST", "/limits/reset", content_type, payload).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{payload}: {answer}");
        let error: Value = serde_json::from_str(&answer).unwrap();
        assert!(error["error"].as_str().unwrap().starts_with(says), "{payload}: {answer}");
    }
    let (status, _, answer) = send(
        &proxy,
        "POST",
        "/limits/reset?identity=acme",
        json,
        r#"{"route": "api", "identity": "acme"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer.contains("`identity` given more than once"),
        "{answer}"
    );
    assert_eq!(
        call(&proxy, "acme").await,
        StatusCode::TOO_MANY_REQUESTS,
        "no reset ran"
    );
    // A reset lists exactly the keys it deleted, and counts those: acme's usual count and
    // the count it keeps under its override (once deleted but not listed: 2 deleted, 1 shown).
    let answer = send_ok(
        &proxy,
        "POST",
        "/limits/reset",
        r#"{"route": "api", "identity": "acme"}"#,
    )
    .await;
    let done: Value = serde_json::from_str(&answer).unwrap();
    let keys: Vec<&str> = done["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    // The override of a fixed window counted on the caller's usual key: the one key there is.
    assert_eq!(done["deleted"], keys.len(), "{answer}");
    assert_eq!(keys.len(), 1, "{answer}");
    assert!(!keys[0].contains("~!override"), "{answer}");
    // Every method the endpoint takes, in Allow.
    for (method, path, allow) in [
        ("GET", "/limits/override", "POST, DELETE"),
        ("PUT", "/limits/override", "POST, DELETE"),
        ("GET", "/limits/reset", "POST"),
        ("POST", "/limits/state", "GET, HEAD"),
        ("DELETE", "/limits/top", "GET, HEAD"),
    ] {
        let (status, given, answer) = send(&proxy, method, path, None, "").await;
        assert_eq!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {answer}"
        );
        assert_eq!(given.as_deref(), Some(allow), "{method} {path}");
    }
    // The DELETE the 405 names works, from a JSON body too.
    send_ok(
        &proxy,
        "DELETE",
        "/limits/override",
        r#"{"route": "api", "identity": "acme"}"#,
    )
    .await;
}
