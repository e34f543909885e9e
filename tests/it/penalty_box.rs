//! `block_for`, the penalty box: once a limit denies a caller, every request of theirs on the
//! route is refused until the block ends, on every replica sharing the store; other callers
//! are not affected, and Retry-After (and the RateLimit field) count down to the block's end.

use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};

/// A caller sending the `x-user` header on `/login`: token_bucket of 2, refilled 1 per second
/// (a denial alone would lift within a second) with a 3 s block.
fn login_route(up: &Upstream, store: Option<&Store>) -> Config {
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(
            route("login")
                .prefix("/login")
                .key("user")
                .limit(limit::token_bucket(1, "1s").burst(2).block_for("3s")),
        );
    match store {
        Some(store) => config.store(store.clone()),
        None => config,
    }
}

/// What a caller sees: the status, Retry-After and the RateLimit field.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    retry_after: Option<u64>,
    ratelimit: Option<String>,
}

async fn login(proxy: &ProxyHandle, user: &str) -> Seen {
    let request = Request::get(proxy.url("/login"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let seen = Seen {
        status: response.status(),
        retry_after: header("retry-after").map(|v| v.parse().unwrap()),
        ratelimit: header("ratelimit"),
    };
    let _ = text(response).await;
    seen
}

/// A blocked answer: 429, Retry-After `seconds`, and the RateLimit field agreeing with it.
fn assert_blocked(seen: &Seen, seconds: std::ops::RangeInclusive<u64>, what: &str) {
    assert_eq!(
        seen.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{what}: {seen:?}"
    );
    let retry = seen.retry_after.expect("Retry-After on a 429");
    assert!(
        seconds.contains(&retry),
        "{what}: {seen:?}, wanted {seconds:?}"
    );
    assert_eq!(
        seen.ratelimit.as_deref(),
        Some(format!("\"login\";r=0;t={retry}").as_str()),
        "{what}"
    );
}

/// Drives `a` and `b` (the same proxy for the memory store, two replicas on one Redis):
/// `alice` exhausts her quota on `a` and is then blocked on both for the block's 3 s, while
/// `bob` is not affected; the block's end lets her back in.
async fn blocked_for_the_duration(a: &ProxyHandle, b: &ProxyHandle) {
    // Her burst passes (a slow machine may refill a token meanwhile), then she is denied.
    let mut passed = 0;
    let first_denial = loop {
        let seen = login(a, "alice").await;
        if seen.status != StatusCode::OK {
            break seen;
        }
        passed += 1;
        assert!(passed <= 5, "never denied");
    };
    let denied_at = Instant::now();
    assert!(passed >= 2, "the burst of 2 did not pass");
    assert_blocked(&first_denial, 3..=3, "the denial that starts the block");
    assert_blocked(&login(b, "alice").await, 3..=3, "the other replica");

    // Past the point where the bucket alone would have let her in again (the wait is the
    // scenario; the block has 1.9 s left after it, slack for a busy machine).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_blocked(&login(a, "alice").await, 1..=2, "a while later");
    assert_blocked(
        &login(b, "alice").await,
        1..=2,
        "a while later, other replica",
    );
    for proxy in [a, b] {
        assert_eq!(login(proxy, "bob").await.status, StatusCode::OK, "bob");
    }

    // The block ends 3 s after the denial, not earlier, and not much later.
    // timeout under test: block_for 3s (ended by 6 s; not before 2.9 s, a lower bound).
    let deadline = denied_at + Duration::from_secs(6);
    loop {
        let seen = login(b, "alice").await;
        if seen.status == StatusCode::OK {
            break;
        }
        assert_blocked(&seen, 1..=3, "until the block ends");
        assert!(Instant::now() < deadline, "still blocked after 6 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        denied_at.elapsed() >= Duration::from_millis(2_900),
        "the block ended after {:?}",
        denied_at.elapsed()
    );
    // Replica `a` remembered the denial until the block's end, no longer.
    assert_eq!(login(a, "alice").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_blocked_caller_is_refused_on_both_replicas_until_the_block_ends() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url()).timeout("500ms");
    let a = proxy(login_route(&up, Some(&store))).start().await;
    let b = proxy(login_route(&up, Some(&store))).start().await;
    // Both replicas have their Redis connection before the first request.
    for p in [&a, &b] {
        // Its store connected (`/readyz` is 200 before that, naming the store not
        // connected yet), so the first request is decided by Redis, not `on_error`.
        p.wait_store().await;
    }
    blocked_for_the_duration(&a, &b).await;

    // `explain --live` shows the block_for and a running block (without consuming anything).
    let mut tries = 0;
    while login(&a, "carol").await.status == StatusCode::OK {
        tries += 1;
        assert!(tries <= 5, "carol was never denied");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, login_route(&up, Some(&store)).yaml()).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "explain",
                "--live",
                "--json",
                "-H",
                "x-user: carol",
                "--config",
            ])
            .arg(&path)
            .arg("/login")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let v: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let limit = &v["limits"][0];
    assert_eq!(limit["block_for_seconds"], 3.0);
    assert_eq!(limit["live"]["allowed"], false, "{v}");
    assert_eq!(limit["live"]["remaining"], 0, "{v}");
    let retry = limit["live"]["retry_after_seconds"].as_f64().unwrap();
    assert!(retry > 1.0 && retry <= 3.0, "{v}");
    // The markers live in Redis at limit::block_key of the limit's key: carol's is there,
    // alice's expired with her block.
    let mut client = server.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*:block")
        .query_async(&mut client)
        .await
        .unwrap();
    assert_eq!(
        keys,
        [tollgate::limit::block_key(
            "tollgate:{login|header=carol}:login"
        )]
    );
}

#[tokio::test]
async fn the_memory_store_blocks_the_same_way() {
    let up = upstream().start().await;
    let a = proxy(login_route(&up, None)).start().await;
    blocked_for_the_duration(&a, &a).await;
}

/// `login_route` with a token a minute (a slow run cannot refill one), a block of two minutes
/// and the limit named `per-user`.
fn long_block(up: &Upstream, store: Option<&Store>) -> Config {
    let config = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(
            route("login").prefix("/login").key("user").limit(
                limit::token_bucket(1, "1m")
                    .burst(2)
                    .block_for("2m")
                    .name("per-user"),
            ),
        );
    match store {
        Some(store) => config.store(store.clone()),
        None => config,
    }
}

async fn admin(proxy: &ProxyHandle, method: &str, path_and_query: &str) -> String {
    let url = format!("http://{}{path_and_query}", proxy.admin.unwrap());
    let request = Request::builder()
        .method(method)
        .uri(url)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{method} {path_and_query}"
    );
    text(response).await
}

async fn admin_json(proxy: &ProxyHandle, method: &str, path_and_query: &str) -> serde_json::Value {
    let text = admin(proxy, method, path_and_query).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

const MARKER: &str = "tollgate:{login|header=alice}:per-user:block";

/// Blocks `alice` on `proxy`; returns when the block ends as the clock says.
async fn block_alice(proxy: &ProxyHandle) -> std::time::SystemTime {
    let mut passed = 0;
    while login(proxy, "alice").await.status == StatusCode::OK {
        passed += 1;
        assert!(passed <= 5, "never denied");
    }
    std::time::SystemTime::now() + Duration::from_secs(120)
}

/// The block as `/limits/state` shows it (JSON and text), checked against `ends`.
async fn assert_state_shows_the_block(proxy: &ProxyHandle, ends: std::time::SystemTime) {
    let state = admin_json(proxy, "GET", "/limits/state?route=login&identity=alice").await;
    let limit = &state["limits"][0];
    assert_eq!(
        limit["key"], "tollgate:{login|header=alice}:per-user",
        "{state}"
    );
    let blocked = &limit["blocked"];
    assert_eq!(blocked["by"], "per-user", "{state}");
    assert_eq!(blocked["key"], MARKER, "{state}");
    let until = humantime::parse_rfc3339(blocked["until"].as_str().unwrap()).unwrap();
    let off = until.duration_since(ends).unwrap_or_else(|e| e.duration());
    // The text is to the second: within a second of the end, and some slack for a slow run.
    assert!(off <= Duration::from_millis(1_500), "{state}: {off:?} off");
    let remaining = blocked["remaining_s"].as_f64().unwrap();
    assert!(remaining > 110.0 && remaining <= 120.0, "{state}");

    let text = admin(
        proxy,
        "GET",
        "/limits/state?route=login&identity=alice&format=text",
    )
    .await;
    let until = blocked["until"].as_str().unwrap();
    assert!(
        text.contains(&format!("  now       BLOCKED until {until} (")),
        "{text}"
    );
    assert!(text.contains(") by per-user\n"), "{text}");
    assert!(text.contains(&format!("  block key {MARKER}\n")), "{text}");
    assert!(!text.contains("LIMITED"), "{text}");
}

/// After a reset the block is gone: listed among the deleted keys, and no longer shown.
async fn assert_reset_lifts_the_block(proxy: &ProxyHandle) {
    let done = admin_json(proxy, "POST", "/limits/reset?route=login&identity=alice").await;
    assert_eq!(
        done["keys"],
        serde_json::json!(["tollgate:{login|header=alice}:per-user", MARKER]),
        "{done}"
    );
    assert_eq!(done["deleted"], 2, "{done}");
    let state = admin_json(proxy, "GET", "/limits/state?route=login&identity=alice").await;
    let limit = &state["limits"][0];
    assert!(limit.get("blocked").is_none(), "{state}");
    assert_eq!(limit["allowed"], true, "{state}");
    let text = admin(
        proxy,
        "GET",
        "/limits/state?route=login&identity=alice&format=text",
    )
    .await;
    assert!(!text.contains("BLOCKED"), "{text}");
    assert_eq!(login(proxy, "alice").await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_state_shows_a_block_in_memory() {
    let up = upstream().start().await;
    let proxy = proxy(long_block(&up, None)).start().await;
    let ends = block_alice(&proxy).await;
    assert_state_shows_the_block(&proxy, ends).await;
    assert_reset_lifts_the_block(&proxy).await;
}

#[tokio::test]
async fn the_state_and_the_limits_command_show_a_block_in_redis() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let store = store::redis(&server.url()).timeout("500ms");
    let config = long_block(&up, Some(&store));
    let proxy = proxy(config.clone()).start().await;
    proxy.wait_store().await;
    let ends = block_alice(&proxy).await;
    assert_state_shows_the_block(&proxy, ends).await;

    // `tollgate limits get` straight from Redis shows it the same way.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, config.without_admin().yaml()).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "limits",
                "get",
                "--route",
                "login",
                "--identity",
                "alice",
                "--config",
            ])
            .arg(&path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let out = String::from_utf8(output.stdout).unwrap();
    assert!(out.contains("  now       BLOCKED until "), "{out}");
    assert!(out.contains(") by per-user\n"), "{out}");
    assert!(out.contains(&format!("  block key {MARKER}\n")), "{out}");

    assert_reset_lifts_the_block(&proxy).await;
}
