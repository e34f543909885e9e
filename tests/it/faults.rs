//! Store faults with real processes: a frozen Redis (SIGSTOP) under load, a Redis killed and
//! restarted on the same port (empty data, empty script cache), a flushed script cache, and a
//! tollgate process killed while holding a concurrency lease.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

// timeout under test: the store's own timeout (`store.redis.timeout`).
const STORE_TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack on a shared, busy machine past a timeout under test; small next to the
/// multi-second hang a missing bound would cause.
const MARGIN: Duration = Duration::from_secs(1);

fn redis_store(redis: &RedisServer, on_error: &str) -> Store {
    store::redis(&redis.url())
        .timeout(&format!("{}ms", STORE_TIMEOUT.as_millis()))
        .key_prefix("faults:")
        .on_error(on_error)
}

/// Users by `x-user`, `limit` requests a day each on `/api/`.
fn user_route(config: Config, limit: u64) -> Config {
    config.identity("user", [source::header("x-user")]).route(
        route("api")
            .prefix("/api/")
            .key("user")
            .limit(limit::fixed_window(limit, "24h")),
    )
}

async fn status_as(proxy: &ProxyHandle, user: &str) -> StatusCode {
    let request = Request::get(proxy.url("/api/x"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// How many of `n` sequential requests as `user` were admitted.
async fn admitted(proxy: &ProxyHandle, user: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if status_as(proxy, user).await == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

/// Waits (at most `PATIENCE`) until a request of a throwaway user is admitted by a store that
/// answers; returns how long it took.
async fn until_limiting_answers(proxy: &ProxyHandle) -> Duration {
    let start = Instant::now();
    let mut n = 0;
    eventually("limiting answers", PATIENCE, async || {
        n += 1;
        let status = status_as(proxy, &format!("probe-{n}")).await;
        until(status == StatusCode::OK, status)
    })
    .await;
    start.elapsed()
}

/// Waits (at most `PATIENCE`) until a throwaway caller's request past `limit` is refused: then
/// limits are being decided again, whatever `on_error` does with store errors.
async fn until_store_limits(proxy: &ProxyHandle, limit: usize) {
    let mut n = 0;
    eventually("limits are decided again", PATIENCE, async || {
        n += 1;
        let user = format!("limit-probe-{n}");
        let admitted = admitted(proxy, &user, limit).await;
        let past = status_as(proxy, &user).await;
        until(
            admitted == limit && past == StatusCode::TOO_MANY_REQUESTS,
            (admitted, past),
        )
    })
    .await;
}

/// `LOAD` requests at once as `user`: each one's status, Retry-After and time.
async fn load(
    proxy: &ProxyHandle,
    user: &'static str,
    n: usize,
) -> Vec<(StatusCode, Option<http::HeaderValue>, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let url = proxy.url("/api/x");
            tokio::spawn(async move {
                let start = Instant::now();
                let request = Request::get(url)
                    .header("x-user", user)
                    .body(body(""))
                    .unwrap();
                let response = http1_client().request(request).await.unwrap();
                let status = response.status();
                let retry_after = response.headers().get("retry-after").cloned();
                let _ = response.into_body().collect().await;
                (status, retry_after, start.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

async fn readyz(proxy: &ProxyHandle) -> StatusCode {
    let url = format!("http://{}/readyz", proxy.admin.expect("admin listener"));
    http1_client().request(get(&url)).await.unwrap().status()
}

/// Redis frozen under concurrent load: every request finishes within the store timeout plus
/// what the same load took with Redis answering (this run's baseline) plus a margin, decided
/// by `on_error` (allow: all pass; deny: all 503 with Retry-After; local: the
/// in-memory limiter with the same limit); after SIGCONT limiting is exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_under_load_is_bounded_and_follows_on_error() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    const LIMIT: usize = 5;
    const LOAD: usize = 40;
    let mut proxies = Vec::new();
    for on_error in ["allow", "deny", "local"] {
        let yaml = user_route(config().upstream(&up.url()), LIMIT as u64)
            .admin("127.0.0.1:0")
            .store(redis_store(&redis, on_error));
        let proxy = proxy(yaml).start().await;
        until_limiting_answers(&proxy).await;
        proxies.push((on_error, proxy));
    }
    // The same load with Redis answering: how long this machine takes for it now.
    let mut baseline = Duration::ZERO;
    for (_, proxy) in &proxies {
        for (_, _, took) in load(proxy, "baseline", LOAD).await {
            baseline = baseline.max(took);
        }
    }

    redis.pause();
    for (on_error, proxy) in &proxies {
        // LOAD requests at once, all for one fresh user.
        let mut counts = std::collections::BTreeMap::new();
        for (status, retry_after, took) in load(proxy, "frozen", LOAD).await {
            // timeout under test: the store's 200 ms timeout, past this run's baseline.
            assert!(
                took <= STORE_TIMEOUT + baseline + MARGIN,
                "on_error {on_error}: a request took {took:?} while Redis was frozen \
                 (baseline {baseline:?})"
            );
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert!(retry_after.is_some(), "503 without Retry-After");
            }
            *counts.entry(status.as_u16()).or_insert(0usize) += 1;
        }
        let expected: Vec<(u16, usize)> = match *on_error {
            "allow" => vec![(200, LOAD)],
            "deny" => vec![(503, LOAD)],
            _ => vec![(200, LIMIT), (429, LOAD - LIMIT)],
        };
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            expected,
            "on_error: {on_error}"
        );
        if *on_error == "deny" {
            assert_eq!(readyz(proxy).await, StatusCode::SERVICE_UNAVAILABLE);
        } else {
            assert_eq!(readyz(proxy).await, StatusCode::OK);
        }
    }

    redis.resume();
    for (on_error, proxy) in &proxies {
        // With on_error allow, an admitted probe proves nothing (a store error admits too):
        // wait until a fresh caller is actually limited.
        until_store_limits(proxy, LIMIT).await;
        assert_eq!(
            admitted(proxy, &format!("after-{on_error}"), LIMIT + 3).await,
            LIMIT,
            "on_error {on_error}: exact limiting after Redis thawed"
        );
        assert_eq!(readyz(proxy).await, StatusCode::OK);
    }
}

/// Redis killed and a new, empty one started on the same port: the proxy reconnects by itself
/// and limits again within about a second (the store's 500 ms health check marks it back),
/// with exact counts (the old state is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_redis_limits_again_within_a_second() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = user_route(config().upstream(&up.url()), 3).store(redis_store(&redis, "deny"));
    let proxy = proxy(yaml).start().await;
    // How long a first connection takes on this machine now: the baseline of the reconnection.
    let first = until_limiting_answers(&proxy).await;
    // ann's denials are remembered (below) once the deny cache has its reset baseline.
    proxy.wait_store().await;
    assert_eq!(admitted(&proxy, "ann", 5).await, 3);

    redis.stop();
    for _ in 0..5 {
        let start = Instant::now();
        assert_eq!(
            status_as(&proxy, "cid").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // timeout under test: the store's 200 ms timeout.
        assert!(start.elapsed() <= STORE_TIMEOUT + MARGIN);
    }
    // ann's denial was remembered until the retry time Redis gave: still a truthful 429.
    assert_eq!(
        status_as(&proxy, "ann").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Stay down a while so the reconnection backoff reaches its cap.
    tokio::time::sleep(Duration::from_secs(2)).await;

    redis.restart();
    let took = until_limiting_answers(&proxy).await;
    // timeout under test: the health check's 500 ms interval and the capped reconnection
    // backoff (about a second in all), past this run's first connection.
    assert!(
        took <= Duration::from_secs(1) + first + MARGIN,
        "limiting came back only after {took:?} (the first connection took {first:?})"
    );
    // A new process: the old windows are gone and new callers count exactly again. (ann stays
    // denied from memory until the retry time Redis announced: see docs/algorithms.md.)
    assert_eq!(admitted(&proxy, "bob", 5).await, 3);
    assert_eq!(admitted(&proxy, "cid", 5).await, 3);
}

/// SCRIPT FLUSH (what a failover to a fresh replica looks like to the scripts): the next
/// decision reloads the script and counts exactly.
#[tokio::test]
async fn flushed_script_cache_is_reloaded() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = user_route(config().upstream(&up.url()), 4).store(redis_store(&redis, "deny"));
    let proxy = proxy(yaml).start().await;
    until_limiting_answers(&proxy).await;
    assert_eq!(admitted(&proxy, "cy", 2).await, 2);
    let mut conn = redis.client().await;
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(admitted(&proxy, "cy", 5).await, 2, "2 + 2 of the limit 4");
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tollgate process holding a concurrency slot (a /hold response in progress) is SIGKILLed:
/// it cannot release, so another proxy on the same Redis is refused until the lease TTL has
/// passed, and then gets the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_killed_proxy_expire_after_their_ttl() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    const TTL: Duration = Duration::from_secs(2);
    let routes = config()
        .upstream(&up.url())
        .store(redis_store(&redis, "deny"))
        .route(
            route("hold")
                .prefix("/hold")
                .key("global")
                .limit(limit::concurrency(1).lease_ttl(&format!("{}s", TTL.as_secs()))),
        );
    let port = free_port();
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(
        &file,
        routes.clone().listen(&format!("127.0.0.1:{port}")).yaml(),
    )
    .unwrap();
    let mut killed = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--config")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate"),
    );
    let url = format!("http://127.0.0.1:{port}/hold");
    // Wait until the process listens and Redis decides (a 503 means not connected yet).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = loop {
        if let Ok(response) = http1_client().request(get(&url)).await {
            if response.status() == StatusCode::OK {
                break response;
            }
        }
        assert!(Instant::now() < deadline, "tollgate never admitted /hold");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The first chunk arrived: the slot is held in Redis.
    let first = held.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first,");

    let other = proxy(routes).start().await;
    let status = |p: &ProxyHandle| {
        let url = p.url("/hold");
        async move { http1_client().request(get(&url)).await.unwrap().status() }
    };
    // Let the other proxy connect: until then it answers 503 (on_error: deny).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match status(&other).await {
            StatusCode::TOO_MANY_REQUESTS => break,
            StatusCode::SERVICE_UNAVAILABLE if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            s => panic!("expected the slot to be taken, got {s}"),
        }
    }

    killed.0.kill().unwrap();
    killed.0.wait().unwrap();
    let killed_at = Instant::now();
    drop(held);
    // Still taken right after the kill: nobody released it.
    assert_eq!(status(&other).await, StatusCode::TOO_MANY_REQUESTS);
    let freed_after = loop {
        let response = http1_client()
            .request(get(&other.url("/hold")))
            .await
            .unwrap();
        if response.status() == StatusCode::OK {
            break killed_at.elapsed();
        }
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        // timeout under test: the lease TTL.
        assert!(
            killed_at.elapsed() < TTL + MARGIN * 2,
            "the slot did not come back after the lease TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The lease was refreshed every TTL/3 while the process lived, so it expires between
    // 2/3 TTL and one TTL after the kill.
    assert!(
        freed_after >= TTL / 2,
        "freed after only {freed_after:?}: was the lease released?"
    );
    up.release.notify_waiters();
}
