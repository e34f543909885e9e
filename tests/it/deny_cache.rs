//! The denied fast path end to end: a caller the store (a real Redis) has denied is answered
//! by tollgate alone until the retry time the store gave, with the same 429, Retry-After and
//! RateLimit fields, while Redis sees no command and the upstream no request; afterwards the
//! store decides again. Concurrency limits, which can free a slot early, are never cached.

use std::time::Duration;

use crate::support::*;
use http::{Request, StatusCode};

async fn start(up: &Upstream, redis: &RedisServer, limit: Limit) -> ProxyHandle {
    let yaml = config()
        .upstream(&up.url())
        .store(
            store::redis(&redis.url())
                .key_prefix("dc:")
                .timeout("500ms")
                .on_error("deny"),
        )
        .identity("user", [source::header("x-user")])
        .route(route("api").prefix("/").key("user").limit(limit));
    let proxy = proxy(yaml).start().await;
    proxy.wait_store().await;
    proxy
}

struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    ratelimit: Option<String>,
    policy: Option<String>,
    content_type: Option<String>,
    body: String,
}

async fn ask(proxy: &ProxyHandle, path: &str, user: &str) -> Answer {
    let request = Request::get(proxy.url(path))
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
    Answer {
        status: response.status(),
        retry_after: header("retry-after").map(|v| v.parse().unwrap()),
        ratelimit: header("ratelimit"),
        policy: header("ratelimit-policy"),
        content_type: header("content-type"),
        body: String::new(),
    }
    .with_body(response)
    .await
}

impl Answer {
    async fn with_body(mut self, response: http::Response<hyper::body::Incoming>) -> Answer {
        self.body = text(response).await;
        self
    }
}

/// Calls of the script commands tollgate sends (EVALSHA, and EVAL/SCRIPT when a script is not
/// loaded yet) since the last CONFIG RESETSTAT.
async fn script_calls(redis: &RedisServer) -> u64 {
    let mut conn = redis.client().await;
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            l.starts_with("cmdstat_evalsha:")
                || l.starts_with("cmdstat_eval:")
                || l.starts_with("cmdstat_script")
        })
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

async fn reset_stats(redis: &RedisServer) {
    let mut conn = redis.client().await;
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cached_denial_answers_like_the_store_without_redis_or_upstream() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(&up, &redis, limit::gcra(2, "1m").burst(2).name("per-user")).await;

    for _ in 0..2 {
        assert_eq!(ask(&proxy, "/api/x", "alice").await.status, StatusCode::OK);
    }
    // The store's own denial. The cache remembers denials once this replica's reset watch has
    // read the reset generation, just after Redis connects; until then each denial is the
    // store's, so `first` is the last one the store gave.
    let mut first = ask(&proxy, "/api/x", "alice").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
        reset_stats(&redis).await;
        let next = ask(&proxy, "/api/x", "alice").await;
        if script_calls(&redis).await == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no denial was ever remembered"
        );
        first = next;
    }
    let first_retry = first.retry_after.expect("Retry-After on the store's 429");
    assert!((29..=30).contains(&first_retry), "{first_retry}");
    assert_eq!(up.request_count(), 2);

    reset_stats(&redis).await;
    for _ in 0..20 {
        let cached = ask(&proxy, "/api/x", "alice").await;
        assert_eq!(cached.status, StatusCode::TOO_MANY_REQUESTS);
        let retry = cached.retry_after.expect("Retry-After on a cached 429");
        assert!(
            retry <= first_retry && retry + 1 >= first_retry,
            "{retry} vs {first_retry}"
        );
        assert_eq!(cached.content_type, first.content_type);
        assert_eq!(cached.policy, first.policy);
        assert_eq!(
            cached.ratelimit.as_deref(),
            Some(format!("\"per-user\";r=0;t={retry}").as_str())
        );
        assert_eq!(
            cached.body,
            first
                .body
                .replace(&format!("{first_retry} second"), &format!("{retry} second"))
        );
    }
    assert_eq!(script_calls(&redis).await, 0, "cached denials asked Redis");
    assert_eq!(up.request_count(), 2, "cached denials reached the upstream");

    // Another caller is not affected: the store decides (one script call) and admits.
    assert_eq!(ask(&proxy, "/api/x", "bob").await.status, StatusCode::OK);
    assert_eq!(script_calls(&redis).await, 1);
    assert_eq!(up.request_count(), 3);
}

#[tokio::test]
async fn after_the_retry_time_the_store_decides_again() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(&up, &redis, limit::gcra(1, "2s").burst(1)).await;

    assert_eq!(ask(&proxy, "/api/x", "carol").await.status, StatusCode::OK);
    let denied = ask(&proxy, "/api/x", "carol").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.retry_after, Some(2));

    // Past the store's retry time the entry is gone: the store is asked and admits.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    reset_stats(&redis).await;
    assert_eq!(ask(&proxy, "/api/x", "carol").await.status, StatusCode::OK);
    assert_eq!(script_calls(&redis).await, 1);
    assert_eq!(up.request_count(), 2);
}

#[tokio::test]
async fn concurrency_denials_are_not_cached_so_a_freed_slot_admits_at_once() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(&up, &redis, limit::concurrency(1)).await;

    // Hold the only slot with a streaming response.
    let request = Request::get(proxy.url("/hold"))
        .header("x-user", "dave")
        .body(body(""))
        .unwrap();
    let held = http1_client().request(request).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    up.first_chunk_sent.notified().await;

    assert_eq!(
        ask(&proxy, "/api/x", "dave").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Finish the held response: the slot is released, and the next request must be admitted
    // by the store rather than refused from a cached denial.
    up.release.notify_one();
    let _ = text(held).await;
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..50 {
        status = ask(&proxy, "/api/x", "dave").await.status;
        if status == StatusCode::OK {
            break;
        }
        // The release is sent to Redis in the background once the body ends.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, StatusCode::OK);
}
