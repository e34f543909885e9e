//! Temporary overrides ("a customer asks for more") and the audit trail of operator actions,
//! end to end on real proxies and a real Redis: an override set on one replica is applied by
//! the other within a bounded wait, ends on time or when removed, survives a restart of
//! tollgate, is shown by `/limits/state` and `tollgate limits get`, is bounded in number, and
//! applies to local-first limits and to a memory store; every reset, override and removal,
//! through the admin API or from the CLI straight to Redis, is in `/limits/audit` on every
//! replica, and a refused mutation is not.

use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::Value;

/// No store timeout is under test here: 2 s is slack for a busy machine (the bound test
/// writes and reads 10 000 overrides).
fn redis_store(redis: &RedisServer, prefix: &str) -> Store {
    store::redis(&redis.url())
        .key_prefix(prefix)
        .timeout("2s")
        .on_error("deny")
}

fn api_config(up: &Upstream, store: Option<Store>, limit: Limit) -> Config {
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(route("api").prefix("/").key("user").limits([limit]));
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

async fn stop(mut proxy: ProxyHandle) {
    proxy.shutdown();
    if let Some(task) = proxy.task.take() {
        let _ = task.await;
    }
}

async fn call(proxy: &ProxyHandle, user: &str) -> StatusCode {
    let request = Request::get(proxy.url("/api/x"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

/// Calls until `want` is answered (at most `PATIENCE`); how long that took.
async fn until_status(proxy: &ProxyHandle, user: &str, want: StatusCode) -> Duration {
    let started = Instant::now();
    eventually(&format!("{user} answered {want}"), PATIENCE, async || {
        let got = call(proxy, user).await;
        until(got == want, got)
    })
    .await;
    started.elapsed()
}

async fn admin(
    proxy: &ProxyHandle,
    method: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let port = proxy.admin.expect("admin listener").port();
    let url = format!("http://127.0.0.1:{port}{path_and_query}");
    let (status, _, text) = exchange(method, &url, headers).await;
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

/// (who, action, route, identity) of every entry of the audit trail, oldest first.
async fn audit(proxy: &ProxyHandle) -> Vec<(String, String, String, String)> {
    let (status, trail) = admin_json(proxy, "GET", "/limits/audit").await;
    assert_eq!(status, StatusCode::OK, "{trail}");
    trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let at = e["at"].as_str().unwrap();
            assert!(
                humantime::parse_rfc3339(at).is_ok(),
                "`at` is RFC 3339: {at}"
            );
            (
                e["who"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
                e["route"].as_str().unwrap().to_owned(),
                e["identity"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn entry(who: &str, action: &str) -> (String, String, String, String) {
    (who.into(), action.into(), "api".into(), "alice".into())
}

#[tokio::test]
async fn an_override_on_one_replica_is_applied_by_the_other_survives_a_restart_and_is_audited() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = api_config(
        &up,
        Some(redis_store(&redis, "ov:")),
        limit::fixed_window(2, "1h").name("per-user"),
    );
    let a = start(&yaml).await;
    let mut b = start(&yaml).await;
    for _ in 0..2 {
        assert_eq!(call(&b, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(&b, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    // Ten times the quota, set on A: A applies it at once, B within the watch's interval.
    let (status, done) = admin_json(
        &a,
        "POST",
        "/limits/override?route=api&identity=alice&multiply=10&for=1h",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["override"]["multiply"], 10.0);
    assert_eq!(call(&a, "alice").await, StatusCode::OK);
    until_status(&b, "alice", StatusCode::OK).await;
    // Another caller keeps the route's limit.
    assert_eq!(call(&b, "bob").await, StatusCode::OK);
    assert_eq!(call(&b, "bob").await, StatusCode::OK);
    assert_eq!(call(&b, "bob").await, StatusCode::TOO_MANY_REQUESTS);

    // The state shows the override, its expiry and the raised limit.
    let (status, state) = admin_json(&b, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK, "{state}");
    let until = state["override"]["until"].as_str().expect("override shown");
    let left = humantime::parse_rfc3339(until)
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        left > Duration::from_secs(3500) && left <= Duration::from_secs(3600),
        "{left:?}"
    );
    assert_eq!(state["limits"][0]["limit"], 20);
    assert_eq!(state["limits"][0]["overridden"], true);

    // From the command line, straight to Redis: the state with the override, then a reset.
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(&dir, &yaml.clone().without_admin().yaml());
    let file = file.to_str().unwrap();
    let (code, out, err) = run_tollgate(&[
        "limits",
        "get",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "alice",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("override  limit x10 on every limit until "),
        "{out}"
    );
    assert!(out.contains("of 20 left"), "{out}");
    let (code, _, err) = run_tollgate(&[
        "limits",
        "reset",
        "-c",
        file,
        "--route",
        "api",
        "--identity",
        "alice",
    ])
    .await;
    assert_eq!(code, 0, "{err}");

    // B restarted: the override is still in force (it lives in Redis), once B has read it
    // (within the watch's interval of reaching Redis).
    stop(b).await;
    b = start(&yaml).await;
    eventually(
        "the restarted replica reads the override",
        PATIENCE,
        async || {
            b.running
                .applies_overrides()
                .then_some(())
                .ok_or("not read yet")
        },
    )
    .await;
    for _ in 0..5 {
        assert_eq!(call(&b, "alice").await, StatusCode::OK);
    }

    // Ended early on B: A follows, and alice is back on her two an hour, where the five she
    // made under the override (after the reset above) still count: refused at once.
    let (status, done) =
        admin_json(&b, "DELETE", "/limits/override?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(call(&b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    until_status(&a, "alice", StatusCode::TOO_MANY_REQUESTS).await;
    let (status, state) = admin_json(&a, "GET", "/limits/state?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::OK);
    assert!(state["override"].is_null(), "{state}");
    let (status, _) = admin_json(&b, "DELETE", "/limits/override?route=api&identity=alice").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing left to remove");

    // Both replicas show the same trail, in order, whoever wrote it.
    let expected = vec![
        entry("loopback", "override"),
        entry("cli", "reset"),
        entry("loopback", "override_removed"),
    ];
    assert_eq!(audit(&a).await, expected);
    assert_eq!(audit(&b).await, expected);
    let (_, trail) = admin_json(&a, "GET", "/limits/audit?limit=1").await;
    assert_eq!(trail["entries"].as_array().unwrap().len(), 1);
    assert_eq!(trail["entries"][0]["action"], "override_removed");
    let (_, trail) = admin_json(&a, "GET", "/limits/audit").await;
    assert_eq!(trail["entries"][0]["parameters"]["multiply"], 10.0);
    assert_eq!(trail["entries"][0]["parameters"]["for"], "1h");
    let (status, text) = admin(&a, "GET", "/limits/audit?format=text", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("cli       reset"), "{text}");
}

#[tokio::test]
async fn an_override_ends_on_time_and_the_cli_sets_and_removes_one() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = api_config(
        &up,
        Some(redis_store(&redis, "ovt:")),
        limit::gcra(1, "1h").name("per-user"),
    );
    let proxy = start(&yaml).await;
    assert_eq!(call(&proxy, "alice").await, StatusCode::OK);
    assert_eq!(call(&proxy, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    let dir = tempfile::tempdir().unwrap();
    let file = write_config(&dir, &yaml.clone().without_admin().yaml());
    let file = file.to_str().unwrap();
    let set = |extra: &'static [&'static str]| {
        let mut args = vec![
            "limits",
            "override",
            "-c",
            file,
            "--route",
            "api",
            "--identity",
            "alice",
        ];
        args.extend_from_slice(extra);
        args
    };
    // Five seconds: long enough to be seen in force on a busy machine (alice is admitted only
    // while it is: her own limit is spent for the hour).
    let (code, out, err) = run_tollgate(&set(&["--limit", "50", "--for", "5s"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("override  route api identity alice: limit 50 until "),
        "{out}"
    );
    let set_at = Instant::now();
    until_status(&proxy, "alice", StatusCode::OK).await;
    // Five seconds later it is over, without anyone removing it (it was set before `set_at`).
    // The wait is the scenario: the override running out.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(set_at.elapsed())).await;
    assert_eq!(call(&proxy, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=alice").await;
    assert!(state["override"].is_null(), "{state}");

    // Set and removed from the command line.
    let (code, _, err) = run_tollgate(&set(&["--multiply", "5", "--for", "1h"])).await;
    assert_eq!(code, 0, "{err}");
    until_status(&proxy, "alice", StatusCode::OK).await;
    let (code, out, err) = run_tollgate(&set(&["--delete"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed"), "{out}");
    until_status(&proxy, "alice", StatusCode::TOO_MANY_REQUESTS).await;

    // Refused arguments exit 2 naming what is allowed.
    let (code, _, err) = run_tollgate(&set(&["--limit", "0", "--for", "1h"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("whole number from 1"), "{err}");
    let (code, _, err) = run_tollgate(&set(&["--multiply", "2", "--for", "forever"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("from 1s to 30d"), "{err}");
    // A factor that would leave less than 1 unit of the limit (1 an hour) is refused, not
    // rounded up to 1.
    let (code, _, err) = run_tollgate(&set(&["--multiply", "0.1", "--for", "1h"])).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("multiply=0.1 would make limit"), "{err}");
    let (code, _, _) = run_tollgate(&set(&["--limit", "5"])).await;
    assert_eq!(code, 2, "--for is needed");

    let (_, trail) = admin_json(&proxy, "GET", "/limits/audit").await;
    let whats: Vec<(&str, &str)> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["who"].as_str().unwrap(), e["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        whats,
        [
            ("cli", "override"),
            ("cli", "override"),
            ("cli", "override_removed")
        ]
    );
}

#[tokio::test]
async fn mutations_without_the_token_are_refused_and_not_audited() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    // SAFETY (edition 2021: safe): only this test reads this variable.
    std::env::set_var("TOLLGATE_TEST_OVERRIDE_TOKEN", "let-me-in");
    let proxy = start(
        api_config(
            &up,
            Some(redis_store(&redis, "ova:")),
            limit::fixed_window(1, "1h"),
        )
        .admin_with_token("127.0.0.1:0", "TOLLGATE_TEST_OVERRIDE_TOKEN"),
    )
    .await;
    let set = "/limits/override?route=api&identity=alice&limit=5&for=1h";
    let (status, text) = admin(&proxy, "POST", set, &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    let (status, _) = admin(&proxy, "POST", set, &[("authorization", "Bearer nope")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = admin(
        &proxy,
        "DELETE",
        "/limits/override?route=api&identity=alice",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(audit(&proxy).await, vec![]);
    let (status, text) = admin(
        &proxy,
        "POST",
        set,
        &[("authorization", "Bearer let-me-in")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(audit(&proxy).await, vec![entry("token", "override")]);
}

#[tokio::test]
async fn override_parameters_outside_what_is_allowed_get_400_naming_what_is() {
    let up = upstream().start().await;
    let proxy = start(api_config(&up, None, limit::fixed_window(1, "1h"))).await;
    for (query, says) in [
        (
            "route=api&identity=alice&limit=5",
            "missing query parameter `for`",
        ),
        ("route=api&identity=alice&for=1h", "`limit` or `multiply`"),
        (
            "route=api&identity=alice&limit=5&multiply=2&for=1h",
            "not both",
        ),
        (
            "route=api&identity=alice&limit=0&for=1h",
            "whole number from 1",
        ),
        ("route=api&identity=alice&multiply=0&for=1h", "above 0"),
        (
            "route=api&identity=alice&multiply=5&for=400d",
            "from 1s to 30d",
        ),
        ("route=api&identity=alice&multiply=5&for=31d", "from 1s to 30d"),
        ("route=api&identity=alice&multiply=5&for=1y", "from 1s to 30d"),
        // 1 per hour times 0.5 is half a unit: refused, not rounded up to 1.
        (
            "route=api&identity=alice&multiply=0.5&for=1h",
            "multiply=0.5 would make limit `api` (1 per period) 0.5 units, less than 1: the smallest factor for route `api` is 1",
        ),
        (
            "route=api&identity=alice&multiply=5&for=1h&x=1",
            "takes route, identity, limit, multiply, for, limit_name, dry_run, format",
        ),
        (
            "identity=alice&multiply=5&for=1h",
            "missing query parameter `route`",
        ),
    ] {
        let (status, text) = admin(&proxy, "POST", &format!("/limits/override?{query}"), &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(says), "{query}: {text}");
    }
    let (status, text) = admin(
        &proxy,
        "POST",
        "/limits/override?route=nope&identity=alice&limit=5&for=1h",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    for (query, says) in [
        ("limit=0", "from 1 to 1000"),
        ("limit=1001", "from 1 to 1000"),
        ("format=xml", "`json` or `text`"),
        ("k=3", "takes limit, format"),
    ] {
        let (status, text) = admin(&proxy, "GET", &format!("/limits/audit?{query}"), &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(says), "{query}: {text}");
    }
}

#[tokio::test]
async fn overrides_are_bounded_in_number() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(api_config(
        &up,
        Some(redis_store(&redis, "ovb:")),
        limit::fixed_window(1, "1h"),
    ))
    .await;
    // As many overrides in force as there may be, written as tollgate writes them.
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 3_600_000;
    let mut hset = ::redis::cmd("HSET");
    hset.arg("ovb:overrides");
    for i in 0..10_000 {
        hset.arg(format!("api\0u{i}")).arg(format!(
            r#"{{"route":"api","identity":"u{i}","limit":5,"until_ms":{until}}}"#
        ));
    }
    let mut connection = redis.client().await;
    let _: u64 = hset.query_async(&mut connection).await.unwrap();
    let (status, text) = admin(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=alice&limit=5&for=1h",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(
        text.contains("10000 overrides are in force already"),
        "{text}"
    );
    // One already there may still be changed.
    let (status, text) = admin(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=u7&limit=9&for=1h",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[tokio::test]
async fn an_override_applies_to_local_first_limits() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(api_config(
        &up,
        Some(redis_store(&redis, "ovl:")),
        limit::fixed_window(2, "1h").sync("100ms"),
    ))
    .await;
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(call(&proxy, "alice").await == StatusCode::OK);
    }
    assert!(admitted <= 2, "{admitted}");
    let (status, text) = admin(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=alice&limit=8&for=1h",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(call(&proxy, "alice").await, StatusCode::OK);
}

/// A memory store's overrides are the process's, shared by every proxy the test binary
/// runs: this caller's name is its own.
#[tokio::test]
async fn a_memory_store_applies_an_override_through_the_admin_api() {
    let _own = memory_operator_state().await;
    let up = upstream().start().await;
    let proxy = start(api_config(&up, None, limit::sliding_window(1, "1h"))).await;
    assert_eq!(call(&proxy, "carol-overridden").await, StatusCode::OK);
    assert_eq!(
        call(&proxy, "carol-overridden").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (status, text) = admin(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=carol-overridden&limit=3&for=1h&format=text",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("limit 3 until"), "{text}");
    // The hour's count goes on under the override: two more of the 3.
    assert_eq!(call(&proxy, "carol-overridden").await, StatusCode::OK);
    assert_eq!(call(&proxy, "carol-overridden").await, StatusCode::OK);
    assert_eq!(
        call(&proxy, "carol-overridden").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, state) = admin_json(
        &proxy,
        "GET",
        "/limits/state?route=api&identity=carol-overridden",
    )
    .await;
    assert_eq!(state["override"]["limit"], 3);
    let (_, trail) = admin_json(&proxy, "GET", "/limits/audit").await;
    assert!(
        trail["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["identity"] == "carol-overridden"
                && e["action"] == "override"
                && e["who"] == "loopback"),
        "{trail}"
    );
}

/// A change made on one replica is announced on Redis and applied by the others at once, not
/// on the watch's fallback tick (`REFRESH_EVERY`, 500 ms). Each change is waited for (at most
/// `PATIENCE`), and the time each took is summed: a replica that only looked on its ticks
/// would take 250 ms on average, and the sum of five such waits stays under a quarter of the
/// interval each about one time in forty; an announced change takes milliseconds, and the sum
/// leaves a busy machine ample slack.
fn assert_applied_at_once(waits: &[Duration]) {
    let interval = tollgate::control::overrides::REFRESH_EVERY;
    let total: Duration = waits.iter().sum();
    // timeout under test: the watch's fallback interval (REFRESH_EVERY), a quarter of it per
    // change on average.
    assert!(
        total < interval / 4 * waits.len() as u32,
        "changes applied on the other replica after {waits:?}: on the watch's {interval:?} \
         tick, not when announced"
    );
}

/// Until both replicas are ready and subscribed to the changes channel (`subscribers` is
/// how many subscriptions the channel must count, None where Redis cannot count them for
/// the whole deployment: then a pause).
async fn wait_listening(proxies: [&ProxyHandle; 2], redis: Option<(&RedisServer, &str)>) {
    for proxy in proxies {
        eventually("ready", PATIENCE, async || {
            let status = admin(proxy, "GET", "/readyz", &[]).await.0;
            until(status == StatusCode::OK, status)
        })
        .await;
    }
    let Some((redis, prefix)) = redis else {
        tokio::time::sleep(Duration::from_secs(1)).await;
        return;
    };
    let mut connection = redis.client().await;
    let channel = format!("{prefix}changes");
    eventually("both replicas subscribed", PATIENCE, async || {
        let (_, count): (String, u64) = ::redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut connection)
            .await
            .unwrap();
        // Each replica's override watch and reset watch.
        until(count >= 4, count)
    })
    .await;
}

/// On `a` and `b`, two replicas on one Redis: overrides set, replaced and removed on `a`, and
/// a reset on `a`, each applied on `b` at once (see [`assert_applied_at_once`]).
async fn changes_apply_on_the_other_replica_at_once(a: &ProxyHandle, b: &ProxyHandle) {
    for _ in 0..2 {
        assert_eq!(call(b, "alice").await, StatusCode::OK);
    }
    assert_eq!(call(b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let change = |method: &'static str, query: &'static str| async move {
        let (status, done) = admin_json(a, method, query).await;
        assert_eq!(status, StatusCode::OK, "{method} {query}: {done}");
    };
    let mut waits = Vec::new();
    // Ten times the quota (the 2 she used still count, of 20): B admits alice again.
    change(
        "POST",
        "/limits/override?route=api&identity=alice&multiply=10&for=1h",
    )
    .await;
    waits.push(until_status(b, "alice", StatusCode::OK).await);
    // Removed: back on her usual count, spent. (Until B applies it, B admits her on the
    // override's count: 20, far from spent.)
    change("DELETE", "/limits/override?route=api&identity=alice").await;
    waits.push(until_status(b, "alice", StatusCode::TOO_MANY_REQUESTS).await);
    // Set again (its own count goes on: 2 or more spent), then replaced by a limit of 2:
    // refused, where the multiply would have admitted.
    change(
        "POST",
        "/limits/override?route=api&identity=alice&multiply=10&for=1h",
    )
    .await;
    waits.push(until_status(b, "alice", StatusCode::OK).await);
    change(
        "POST",
        "/limits/override?route=api&identity=alice&limit=2&for=1h",
    )
    .await;
    waits.push(until_status(b, "alice", StatusCode::TOO_MANY_REQUESTS).await);
    // Removed again (refused either way: the replaced override's 2 are spent too), then a
    // reset on A (of the usual count and the override's): B, which remembers her denial,
    // admits her again, exactly her two an hour.
    change("DELETE", "/limits/override?route=api&identity=alice").await;
    eventually("B drops the removed override", PATIENCE, async || {
        let applies = b.running.applies_overrides();
        until(!applies, applies)
    })
    .await;
    assert_eq!(call(b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    change("POST", "/limits/reset?route=api&identity=alice").await;
    waits.push(until_status(b, "alice", StatusCode::OK).await);
    assert_eq!(call(b, "alice").await, StatusCode::OK);
    assert_eq!(call(b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_applied_at_once(&waits);
}

fn two_an_hour(up: &Upstream, store: Store) -> Config {
    api_config(
        up,
        Some(store),
        limit::fixed_window(2, "1h").name("per-user"),
    )
}

#[tokio::test]
async fn overrides_and_resets_reach_another_replica_at_once() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = two_an_hour(&up, redis_store(&redis, "now:"));
    let a = start(&yaml).await;
    let b = start(&yaml).await;
    wait_listening([&a, &b], Some((&redis, "now:"))).await;
    changes_apply_on_the_other_replica_at_once(&a, &b).await;

    // A replica whose subscription was cut (Redis kills it, as a failover or a network fault
    // would) subscribes again, and follows the next change at once.
    let mut connection = redis.client().await;
    let _: ::redis::Value = ::redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut connection)
        .await
        .unwrap();
    wait_listening([&a, &b], Some((&redis, "now:"))).await;
    let (status, done) = admin_json(
        &a,
        "POST",
        "/limits/override?route=api&identity=bob&limit=5&for=1h",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    eventually("B reads the new override", PATIENCE, async || {
        let applies = b.running.applies_overrides();
        until(applies, applies)
    })
    .await;
    for _ in 0..5 {
        assert_eq!(call(&b, "bob").await, StatusCode::OK);
    }
    assert_eq!(call(&b, "bob").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_resets_reach_another_replica_at_once_through_sentinel() {
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let up = upstream().start().await;
    let store = store::sentinel(&setup.name, setup.sentinel_urls())
        .key_prefix("nows:")
        .timeout("500ms")
        .on_error("deny");
    let yaml = two_an_hour(&up, store);
    let a = start(&yaml).await;
    let b = start(&yaml).await;
    wait_listening([&a, &b], None).await;
    changes_apply_on_the_other_replica_at_once(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_resets_reach_another_replica_at_once_on_a_cluster() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let store = store::cluster(cluster.urls())
        .key_prefix("nowc:")
        .timeout("2s")
        .on_error("deny");
    let yaml = two_an_hour(&up, store);
    let a = start(&yaml).await;
    let b = start(&yaml).await;
    wait_listening([&a, &b], None).await;
    changes_apply_on_the_other_replica_at_once(&a, &b).await;
}

/// `explain --live` on the command line, `/limits/explain` on the admin listener, the
/// caller's `/limits/state` and the next response's RateLimit fields all read a caller under
/// an override the same way: the override's limit, and what the next request leaves.
#[tokio::test]
async fn explain_reads_a_caller_under_an_override_as_the_state_and_the_next_response_do() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = api_config(
        &up,
        Some(redis_store(&redis, "ovx:")),
        limit::sliding_log(20, "1h").name("per-minute"),
    );
    let proxy = start(&yaml).await;
    for _ in 0..3 {
        assert_eq!(call(&proxy, "carol").await, StatusCode::OK);
    }
    let (status, done) = admin_json(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=carol&limit=100&limit_name=per-minute&for=1h",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");

    // The state: 100, of which the 3 used in the window are still counted (its `remaining`,
    // like explain's, is what the next request would leave).
    let (status, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=carol").await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!(state["limits"][0]["overridden"], true, "{state}");
    assert_eq!(state["limits"][0]["limit"], 100, "{state}");
    let left = state["limits"][0]["remaining"].as_u64().unwrap();
    assert_eq!(left, 96, "{state}");

    // The admin listener's explain: the same, of 100.
    let (status, explained) = admin_json(
        &proxy,
        "GET",
        "/limits/explain?url=/api/x&header=x-user:carol&live=true",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{explained}");
    let live = &explained["limits"][0]["live"];
    assert_eq!(live["limit"], 100, "{explained}");
    assert_eq!(live["remaining"], left, "{explained}");
    assert_eq!(live["allowed"], true, "{explained}");

    // The command line, straight to Redis: the same figures.
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(&dir, &yaml.clone().without_admin().yaml());
    let output = tokio::process::Command::new(TOLLGATE_BIN)
        .args(["explain", "--config", file.to_str().unwrap()])
        .args(["--live", "-H", "x-user: carol", "/api/x"])
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        out.contains(&format!("would pass: {left} of 100 left")),
        "{out}"
    );

    // The next response says the same.
    let request = Request::get(proxy.url("/api/x"))
        .header("x-user", "carol")
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let field = response.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        field.starts_with(&format!("\"per-minute\";r={left};")),
        "{field}"
    );
    let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(policy.contains(";q=100;"), "{policy}");
}

/// An override of every limit (`--multiply 3`, no limit name) on a caller with a monthly
/// quota (a calendar month in Europe/Berlin) mostly used keeps counting the month: 980 of 1000 used leaves 2020 of 3000, and the
/// requests under the override still count once it ends. (`/limits/state`'s `remaining` is
/// what the next request would leave: one less.)
#[tokio::test]
async fn a_multiplied_override_keeps_the_months_usage() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .store(redis_store(&redis, "ovm:"))
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/")
                .key("user")
                .limit(limit::sliding_window(100, "1m").name("per-minute"))
                .limit(limit::fixed_window(1000, "30d").name("monthly")),
        )
        .yaml();
    // A calendar month in Berlin, as sold: `window: month` in place of the period.
    let period = yaml
        .lines()
        .find(|l| l.trim() == "period: 30d")
        .unwrap_or_else(|| panic!("{yaml}"));
    let indent = &period[..period.len() - period.trim_start().len()];
    let yaml = yaml.replace(
        period,
        &format!("{indent}window: month\n{indent}timezone: Europe/Berlin"),
    );
    let proxy = start(&yaml).await;
    // 980 of the month used: a few requests through the proxy, the rest written as the
    // monthly counter holds them (one key per window; its name read from the state).
    for _ in 0..2 {
        assert_eq!(call(&proxy, "dave").await, StatusCode::OK);
    }
    let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=dave").await;
    let monthly = state["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_name"] == "monthly")
        .unwrap_or_else(|| panic!("{state}"))
        .clone();
    assert_eq!(monthly["remaining"], 997, "{state}");
    let mut conn = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("ovm:*monthly*")
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let stored: String = ::redis::cmd("GET").arg(&keys[0]).query(&mut conn).unwrap();
    // "1 <window> <count>": the count becomes 980.
    let (window, count) = stored.rsplit_once(' ').unwrap();
    assert_eq!(count, "2", "{stored}");
    let used_980 = format!("{window} 980");
    let ttl: i64 = ::redis::cmd("PTTL").arg(&keys[0]).query(&mut conn).unwrap();
    let () = ::redis::cmd("SET")
        .arg(&keys[0])
        .arg(&used_980)
        .arg("PX")
        .arg(ttl)
        .query(&mut conn)
        .unwrap();

    let monthly_left = async || {
        let (_, state) = admin_json(&proxy, "GET", "/limits/state?route=api&identity=dave").await;
        let l = state["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit_name"] == "monthly")
            .unwrap_or_else(|| panic!("{state}"))
            .clone();
        (
            l["remaining"].as_u64().unwrap(),
            l["limit"].as_u64().unwrap(),
        )
    };
    assert_eq!(monthly_left().await, (19, 1000));
    let (status, done) = admin_json(
        &proxy,
        "POST",
        "/limits/override?route=api&identity=dave&multiply=3&for=30m",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(monthly_left().await, (2019, 3000));
    assert_eq!(call(&proxy, "dave").await, StatusCode::OK);
    assert_eq!(monthly_left().await, (2018, 3000));

    // Removed: the month counts the request made under the override too.
    let (status, gone) =
        admin_json(&proxy, "DELETE", "/limits/override?route=api&identity=dave").await;
    assert_eq!(status, StatusCode::OK, "{gone}");
    assert_eq!(monthly_left().await, (18, 1000));
}
