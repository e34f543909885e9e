//! The store's connections after Redis went away with no traffic, and requests while the store
//! is known to be down.
//!
//! Restart: Redis is killed while the proxy is idle and started again on the same port; once
//! `/readyz` says 200, every request on every serving thread is decided by Redis (`on_error:
//! deny` would turn any broken connection into a 503). For an exact limit, a coalescing store
//! and a local-first limit on one server; for an exact limit on a Cluster and with Sentinel.
//!
//! Down: with Redis frozen (SIGSTOP) and readiness saying 503, requests get `on_error` at once,
//! not after the store timeout; after SIGCONT Redis decides again.

use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;

/// Requests in flight at once, each on a connection of its own, so both serving threads
/// accept several.
const CONCURRENT: usize = 16;
const ROUNDS: usize = 4;
const WORKERS: u64 = 2;

/// Users by `x-user`, `limit` requests a day each on `/api/`, with `workers: 2` and an admin
/// listener (readiness).
fn routes(up: &Upstream, limit: Limit) -> Config {
    config()
        .upstream(&up.url())
        .workers(WORKERS)
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(route("api").prefix("/api/").key("user").limit(limit))
}

/// One request as `user` on a connection of its own (`connection: close`, a fresh client), so
/// whichever serving thread accepts first serves it.
async fn status_as(proxy: &ProxyHandle, user: &str) -> StatusCode {
    let request = Request::get(proxy.url("/api/x"))
        .header("x-user", user)
        .header("connection", "close")
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// `ROUNDS` rounds of `CONCURRENT` concurrent requests, each of its own user: their statuses.
async fn spread(proxy: &ProxyHandle, tag: &str) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for round in 0..ROUNDS {
        let calls = (0..CONCURRENT).map(|i| {
            let user = format!("{tag}-{round}-{i}");
            async move { status_as(proxy, &user).await }
        });
        statuses.extend(futures_util::future::join_all(calls).await);
    }
    statuses
}

async fn readyz(proxy: &ProxyHandle) -> StatusCode {
    let url = format!("http://{}/readyz", proxy.admin.expect("admin listener"));
    http1_client().request(get(&url)).await.unwrap().status()
}

/// Waits until `/readyz` says the store is up: "ready" and no more. With `on_error: allow`
/// readiness stays 200 while the store is down, its second line naming the outage, so the
/// status alone does not tell that Redis decides again.
async fn until_store_up(proxy: &ProxyHandle, within: Duration) {
    let url = format!("http://{}/readyz", proxy.admin.expect("admin listener"));
    let start = Instant::now();
    loop {
        let response = http1_client().request(get(&url)).await.unwrap();
        let status = response.status();
        let body = text(response).await;
        if status == StatusCode::OK && body == "ready\n" {
            return;
        }
        assert!(
            start.elapsed() < within,
            "/readyz did not say the store is up within {within:?}: {status} {body:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until_readyz(proxy: &ProxyHandle, want: StatusCode, within: Duration) {
    let start = Instant::now();
    while readyz(proxy).await != want {
        assert!(
            start.elapsed() < within,
            "/readyz did not say {want} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends traffic until every serving thread has opened its own connection (on its first
/// call), then requires a round in which every request is admitted.
async fn warm(proxy: &ProxyHandle, what: &str) {
    until_readyz(proxy, StatusCode::OK, Duration::from_secs(10)).await;
    // Failures in the first rounds are not the point: the connections are still being opened.
    let mut round = 0;
    eventually(
        &format!("{what}: a round all admitted before the outage"),
        PATIENCE,
        async || {
            round += 1;
            let warm = spread(proxy, &format!("warm{round}")).await;
            until(warm.iter().all(|s| *s == StatusCode::OK), warm)
        },
    )
    .await;
}

/// Waits for readiness, then requires every request on every thread to be admitted.
async fn every_request_succeeds_once_ready(proxy: &ProxyHandle, what: &str) {
    until_readyz(proxy, StatusCode::OK, Duration::from_secs(10)).await;
    let after = spread(proxy, "after").await;
    let failed = after.iter().filter(|s| **s != StatusCode::OK).count();
    assert_eq!(
        failed,
        0,
        "{what}: {failed} of {} requests failed after /readyz said 200: {after:?}",
        after.len()
    );
}

/// Warms the proxy, runs `outage` (which takes Redis away and brings it back with no
/// traffic), and requires every request to be admitted once ready.
async fn every_request_succeeds_after(
    what: &str,
    yaml: Config,
    outage: impl std::future::Future<Output = ()>,
) {
    let proxy = proxy(yaml).start().await;
    warm(&proxy, what).await;
    outage.await;
    every_request_succeeds_once_ready(&proxy, what).await;
}

fn standalone(redis: &RedisServer) -> Store {
    store::redis(&redis.url())
        .timeout("500ms")
        .key_prefix("reconnect:")
        .on_error("deny")
}

/// Kills `redis`, waits until readiness has seen it gone, starts it again on the same port.
async fn restart_standalone(proxy: &ProxyHandle, redis: &mut RedisServer) {
    redis.stop();
    until_readyz(
        proxy,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(5),
    )
    .await;
    tokio::task::block_in_place(|| redis.restart());
}

/// One server: the outage waits for readiness to see Redis gone before restarting it.
async fn standalone_case(what: &str, limit: Limit, coalesce: bool) {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let mut target = standalone(&redis);
    if coalesce {
        target = target.coalesce();
    }
    let yaml = routes(&up, limit).store(target);
    let proxy = proxy(yaml).start().await;
    warm(&proxy, what).await;
    restart_standalone(&proxy, &mut redis).await;
    every_request_succeeds_once_ready(&proxy, what).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_limit_works_on_every_thread_once_ready_after_a_restart() {
    standalone_case("exact", limit::fixed_window(1000, "24h"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_store_works_on_every_thread_once_ready_after_a_restart() {
    standalone_case("coalesced", limit::gcra(1000, "24h"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_first_limit_works_on_every_thread_once_ready_after_a_restart() {
    standalone_case(
        "local-first",
        limit::fixed_window(1000, "24h").sync("100ms"),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_exact_limit_works_once_ready_after_its_primaries_restart() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let target = store::cluster(cluster.urls())
        .timeout("500ms")
        .key_prefix("reconnect:")
        .on_error("deny");
    let yaml = routes(&up, limit::fixed_window(1000, "24h")).store(target);
    let primaries: Vec<u16> = cluster
        .nodes
        .iter()
        .filter(|n| cli(n.port, &["ROLE"]).is_ok_and(|r| r.starts_with("master")))
        .map(|n| n.port)
        .collect();
    assert_eq!(primaries.len(), 3);
    let nodes = &mut cluster;
    let outage = async move {
        // Back well within the node timeout: the same primaries, empty, no failover.
        tokio::task::block_in_place(|| {
            for port in &primaries {
                nodes.node(*port).kill();
            }
            std::thread::sleep(Duration::from_millis(200));
            for port in &primaries {
                nodes.node(*port).restart();
            }
            nodes.wait_healthy();
        });
        // Long enough for a health check (every 500 ms) to run against the restarted nodes,
        // three times over for a busy machine: the wait is the scenario (the check's interval;
        // nothing shows that it ran).
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    };
    every_request_succeeds_after("cluster", yaml, outage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_exact_limit_works_once_ready_after_its_master_restarts() {
    let mut setup = tokio::task::block_in_place(SentinelSetup::start);
    let up = upstream().start().await;
    let target = store::sentinel(&setup.name, setup.sentinel_urls())
        .timeout("500ms")
        .key_prefix("reconnect:")
        .on_error("deny");
    let yaml = routes(&up, limit::fixed_window(1000, "24h")).store(target);
    let master = &mut setup.master;
    let outage = async move {
        // Back well within the Sentinels' down-after time: the same master, no failover.
        tokio::task::block_in_place(|| {
            master.kill();
            std::thread::sleep(Duration::from_millis(200));
            master.restart();
        });
        // As above: three health-check intervals.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    };
    every_request_succeeds_after("sentinel", yaml, outage).await;
}

/// With Redis frozen and known down (readiness at 503 with `deny`; after one request waited
/// in vain with `allow`, whose readiness stays 200), requests get `on_error` at once (far below the
/// 2 s store timeout), for `deny` and `allow`; after SIGCONT Redis decides again (a limit of 2
/// refuses the third request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_known_down_applies_on_error_at_once() {
    // timeout under test: half the 2 s store timeout (a request that waited for the store
    // would take all of it).
    const BOUND: Duration = Duration::from_secs(1);
    let redis = RedisServer::start();
    let up = upstream().start().await;
    for on_error in ["deny", "allow"] {
        let target = store::redis(&redis.url())
            .timeout("2s")
            .key_prefix(&format!("down-{on_error}:"))
            .on_error(on_error);
        let yaml = routes(&up, limit::fixed_window(2, "24h")).store(target);
        let proxy = proxy(yaml).start().await;
        until_readyz(&proxy, StatusCode::OK, Duration::from_secs(10)).await;
        assert_eq!(status_as(&proxy, "warm").await, StatusCode::OK);

        redis.pause();
        if on_error == "deny" {
            until_readyz(
                &proxy,
                StatusCode::SERVICE_UNAVAILABLE,
                Duration::from_secs(10),
            )
            .await;
        } else {
            // Readiness stays 200 with `allow` (traffic still passes): the store is known down
            // once a request has waited for it in vain (or the probe has).
            assert_eq!(status_as(&proxy, "first").await, StatusCode::OK);
        }
        let want = match on_error {
            "deny" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        for n in 0..10 {
            let start = Instant::now();
            let status = status_as(&proxy, &format!("frozen-{n}")).await;
            let took = start.elapsed();
            assert_eq!(status, want, "on_error: {on_error}");
            assert!(
                took < BOUND,
                "on_error: {on_error}: a request took {took:?} while the store was known down"
            );
        }

        redis.resume();
        until_store_up(&proxy, Duration::from_secs(10)).await;
        assert_eq!(status_as(&proxy, "after").await, StatusCode::OK);
        assert_eq!(status_as(&proxy, "after").await, StatusCode::OK);
        assert_eq!(
            status_as(&proxy, "after").await,
            StatusCode::TOO_MANY_REQUESTS,
            "on_error: {on_error}: Redis decides again after SIGCONT"
        );
    }
}
