//! Scale-out: many tollgate replicas sharing limits through standalone Redis, a real Redis
//! Cluster (3 primaries + 3 replicas) and a real Sentinel setup, started here. Checks that
//! limits stay exact across replicas, that all keys of one decision live in one hash slot, that
//! a failover is survived (on_error while it lasts, nothing hangs, limiting resumes on the
//! promoted replica), and TLS + ACL credentials.
//!
//! Clusters are heavy for the shared 2-core machine: the tests take turns (one setup alive at
//! a time) and every process is killed when its harness is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};

const PREFIX: &str = "tg-scale:";
const REPLICAS: usize = 4;
const CLIENTS_PER_REPLICA: usize = 100;
const LIMIT: usize = 50;

/// `target` (where Redis is) with this test's key prefix, `timeout`, and `on_error: deny`.
fn store_of(target: Store, timeout: &str) -> Store {
    target.key_prefix(PREFIX).timeout(timeout).on_error("deny")
}

fn standalone(url: &str) -> Store {
    store::redis(url)
}

fn cluster_target(cluster: &RedisCluster) -> Store {
    store::cluster(cluster.urls())
}

fn sentinel_target(setup: &SentinelSetup) -> Store {
    store::sentinel(&setup.name, setup.sentinel_urls())
}

/// A route `name` on `prefix` keyed by the `x-user` header.
fn user_route(name: &str, prefix: &str) -> Route {
    route(name).prefix(prefix).key("user")
}

/// Users by the `x-user` header, and a `warm` route used to tell when a replica's store
/// connection is up.
fn users() -> Config {
    config()
        .identity("user", [source::header("x-user")])
        .route(user_route("warm", "/warm").limit(limit::fixed_window(1000000, "24h")))
}

/// One route per algorithm, each on its own path, all keyed by the `x-user` header; plus
/// `warm`.
fn exact_routes() -> Config {
    users()
        .route(user_route("fw", "/fw").limit(limit::fixed_window(50, "24h")))
        .route(user_route("sl", "/slog").limit(limit::sliding_log(50, "1h")))
        .route(user_route("sw", "/sw").limit(limit::sliding_window(50, "24h")))
        .route(user_route("tb", "/tb").limit(limit::token_bucket(50, "24h")))
        .route(user_route("gcra", "/gcra").limit(limit::gcra(1, "24h").burst(50)))
        .route(user_route("conc", "/sleep").limit(limit::concurrency(50)))
}

async fn status_of(addr: SocketAddr, path: &str, user: &str) -> StatusCode {
    let request = Request::get(format!("http://{addr}{path}"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let _ = text(response).await;
    status
}

/// Starts `n` tollgate replicas and waits until each decides through the store (with
/// `on_error: deny`, a 503 means "not connected yet").
async fn replicas(up: &Upstream, yaml: &Config, n: usize) -> Vec<ProxyHandle> {
    let mut proxies = Vec::new();
    for _ in 0..n {
        proxies.push(proxy(yaml.clone().upstream(&up.url())).start().await);
    }
    for p in &proxies {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if status_of(p.addr, "/warm", "warm-up").await == StatusCode::OK {
                break;
            }
            assert!(Instant::now() < deadline, "replica never reached its store");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    proxies
}

/// `per_replica` concurrent clients on every replica, all on one key; returns the number
/// admitted (every other answer must be a 429).
async fn hammer(proxies: &[ProxyHandle], path: &str, user: &str, per_replica: usize) -> usize {
    let mut tasks = Vec::new();
    for p in proxies {
        for _ in 0..per_replica {
            let (addr, path, user) = (p.addr, path.to_string(), user.to_string());
            tasks.push(tokio::spawn(
                async move { status_of(addr, &path, &user).await },
            ));
        }
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other} on {path}"),
        }
    }
    ok
}

/// 4 replicas × 100 concurrent clients on one key, for every algorithm.
async fn exact_across_replicas(target: Store, what: &str) {
    let up = upstream().start().await;
    let yaml = exact_routes().store(store_of(target, "2s"));
    let proxies = replicas(&up, &yaml, REPLICAS).await;
    for path in ["/fw", "/slog", "/tb", "/gcra"] {
        let ok = hammer(&proxies, path, "alice", CLIENTS_PER_REPLICA).await;
        assert_eq!(ok, LIMIT, "{path} on {what}: admitted == limit");
    }
    // sliding_window's estimate is exact inside one window (a fresh key has no previous
    // window to weigh); across a window boundary its documented bound is 2 × limit.
    let ok = hammer(&proxies, "/sw", "alice", CLIENTS_PER_REPLICA).await;
    assert!(
        (LIMIT..=2 * LIMIT).contains(&ok),
        "/sw on {what}: {ok} admitted"
    );
    // Concurrency: every admitted request holds its slot for 5 s, far longer than deciding
    // all 400 takes, so exactly `limit` are in flight together.
    let ok = hammer(&proxies, "/sleep?ms=5000", "alice", CLIENTS_PER_REPLICA).await;
    assert_eq!(ok, LIMIT, "concurrency on {what}: admitted == limit");
    // The slots came back when the bodies ended.
    assert_eq!(
        status_of(proxies[0].addr, "/sleep?ms=1", "alice").await,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_on_standalone_redis_admit_exactly_the_limit() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    exact_across_replicas(standalone(&redis.url()), "standalone redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_limits_exact_and_each_decision_in_one_slot() {
    let _turn = heavy_turn().await;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    exact_across_replicas(cluster_target(&cluster), "redis cluster").await;

    // Multi-limit decisions: `shared` has one key for all limits (tag: route and identity),
    // `mixed` has a limit on another key (tag: the route alone). A decision whose keys spanned
    // slots would fail with CROSSSLOT and, with on_error: deny, answer 503.
    let up = upstream().start().await;
    let routes = users()
        .route(
            user_route("shared", "/shared")
                .limit(limit::fixed_window(100, "24h").name("daily"))
                .limit(limit::sliding_log(10, "1m").name("minute"))
                .limit(limit::gcra(5, "1h").burst(5).name("rate"))
                .limit(limit::concurrency(3).name("inflight")),
        )
        .route(
            user_route("mixed", "/mixed")
                .limit(limit::token_bucket(10, "1m").name("per-user"))
                .limit(
                    limit::sliding_window(1000, "1h")
                        .key("global")
                        .name("all-users"),
                ),
        );
    let yaml = routes.store(store_of(cluster_target(&cluster), "2s"));
    let proxies = replicas(&up, &yaml, 1).await;
    // Users chosen to land in different slots, one of them trying to smuggle a hash tag.
    let users = ["bob", "carol", "dave", "x}{evil", "{route}"];
    for user in users {
        for path in ["/shared", "/mixed"] {
            assert_eq!(
                status_of(proxies[0].addr, path, user).await,
                StatusCode::OK,
                "{path} for {user:?}"
            );
        }
    }
    let keys = cluster.keys(PREFIX);
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for key in keys.iter().filter(|k| !k.contains("{warm")) {
        // Group by the hash tag: the text between the first `{` and the next `}`.
        let open = key.find('{').expect("every key has a hash tag");
        let close = open + key[open..].find('}').expect("closed tag");
        groups
            .entry(key[open..=close].to_string())
            .or_default()
            .push(key.clone());
    }
    let shared_groups: Vec<_> = groups
        .iter()
        .filter(|(t, _)| t.starts_with("{shared|"))
        .collect();
    assert_eq!(
        shared_groups.len(),
        users.len(),
        "one tag per user: {groups:#?}"
    );
    for (_, keys) in &shared_groups {
        // daily, minute and rate keep state (the concurrency lease ended with the response);
        // rate is 5 an hour so its state outlives a slow run (at 5 a second it expired 200 ms
        // after the request, and a loaded machine listed the keys later than that).
        assert!(keys.len() >= 3, "{keys:?}");
    }
    let mixed = groups
        .get("{mixed}")
        .expect("mixed keys share the route tag");
    // all-users is a sliding window: its state lives at least an hour. (A fixed window's
    // ends with its clock-aligned window: a run at the top of the hour listed no key for it.)
    assert_eq!(mixed.len(), users.len() + 1, "{mixed:?}");
    let mut slots_in_use = std::collections::BTreeSet::new();
    for keys in groups.values() {
        let slots: std::collections::BTreeSet<u16> =
            keys.iter().map(|k| cluster.keyslot(k)).collect();
        assert_eq!(slots.len(), 1, "keys of one decision span slots: {keys:?}");
        slots_in_use.extend(slots);
    }
    assert!(
        slots_in_use.len() > 2,
        "different callers spread over slots: {slots_in_use:?}"
    );

    // NOSCRIPT: with every node's script cache flushed, the next decision still gets through
    // (EVALSHA answers NOSCRIPT, EVAL with the source runs it and caches it again).
    for node in &cluster.nodes {
        node.cli(&["SCRIPT", "FLUSH"]);
    }
    assert_eq!(
        status_of(proxies[0].addr, "/shared", "after-flush").await,
        StatusCode::OK
    );
    assert_eq!(
        status_of(proxies[0].addr, "/shared", "after-flush").await,
        StatusCode::OK
    );
}

/// Runs load (rotating users) against `proxies` until `stop`; returns each request's status
/// and duration.
fn start_load(
    proxies: &[ProxyHandle],
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<(StatusCode, Duration)>>> {
    let mut tasks = Vec::new();
    for (i, p) in proxies.iter().enumerate() {
        for j in 0..4 {
            let (addr, stop) = (p.addr, stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let status = status_of(addr, "/api", &format!("load-{i}-{j}-{}", n % 7)).await;
                    seen.push((status, started.elapsed()));
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                seen
            }));
        }
    }
    tasks
}

// timeout under test: the store's own timeout (`store.redis.timeout`).
const STORE_TIMEOUT: Duration = Duration::from_millis(300);
/// Scheduling slack on a busy shared machine on top of the store timeout.
const MARGIN: Duration = Duration::from_millis(1500);

/// All keys of the `api` route share the `{api}` tag (one limit is keyed by `global`), so one
/// node owns the whole route: killing it interrupts every decision of the route.
fn failover_routes() -> Config {
    users().route(
        user_route("api", "/api")
            .limit(limit::fixed_window(5, "24h").name("per-user"))
            .limit(
                limit::fixed_window(1000000, "24h")
                    .key("global")
                    .name("everyone"),
            ),
    )
}

/// Checks what the clients saw through a failover: decisions (200/429) before, on_error
/// (503, `deny`) while no primary served the slot, and nothing slower than the timeout.
async fn check_failover_load(
    load: Vec<tokio::task::JoinHandle<Vec<(StatusCode, Duration)>>>,
    what: &str,
) {
    let mut all = Vec::new();
    for t in load {
        all.extend(t.await.unwrap());
    }
    let count = |s: StatusCode| all.iter().filter(|(st, _)| *st == s).count();
    let slowest = all.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!(
        "{what}: {} requests: {} ok, {} limited, {} on_error (503); slowest {slowest:?}",
        all.len(),
        count(StatusCode::OK),
        count(StatusCode::TOO_MANY_REQUESTS),
        count(StatusCode::SERVICE_UNAVAILABLE)
    );
    for (status, _) in &all {
        assert!(
            matches!(
                *status,
                StatusCode::OK | StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ),
            "{what}: unexpected {status}"
        );
    }
    assert!(
        count(StatusCode::SERVICE_UNAVAILABLE) > 0,
        "{what}: the failover window must follow on_error: deny"
    );
    assert!(
        count(StatusCode::TOO_MANY_REQUESTS) > 0,
        "{what}: Redis decided before the failover"
    );
    assert!(
        slowest <= STORE_TIMEOUT + MARGIN,
        "{what}: a request took {slowest:?}, past the {STORE_TIMEOUT:?} store timeout"
    );
}

/// After the failover: a fresh user gets exactly its 5, decided by Redis again (on_error:
/// deny would answer 503). Retries until the replicas have found the new primary.
async fn limiting_resumed(proxies: &[ProxyHandle], user: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if status_of(proxies[0].addr, "/api", &format!("{user}-probe")).await
            != StatusCode::SERVICE_UNAVAILABLE
            && status_of(proxies[1].addr, "/api", &format!("{user}-probe")).await
                != StatusCode::SERVICE_UNAVAILABLE
        {
            break;
        }
        assert!(Instant::now() < deadline, "{what}: limiting never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = Vec::new();
    for i in 0..8 {
        statuses.push(status_of(proxies[i % proxies.len()].addr, "/api", user).await);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 5, "{what}: after the failover: {statuses:?}");
    assert!(
        statuses[5..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{what}: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_failover_follows_on_error_then_limits_on_the_promoted_replica() {
    let _turn = heavy_turn().await;
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    let up = upstream().start().await;
    let yaml = failover_routes().store(store_of(cluster_target(&cluster), "300ms"));
    let proxies = replicas(&up, &yaml, 2).await;
    assert_eq!(
        status_of(proxies[0].addr, "/api", "first").await,
        StatusCode::OK
    );
    let key = cluster
        .keys(PREFIX)
        .into_iter()
        .find(|k| k.contains("{api}"))
        .expect("the api route's keys");
    let slot = cluster.keyslot(&key);
    let primary = cluster.primary_of_slot(slot);

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&proxies, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.node(primary).kill();
    let killed_at = Instant::now();
    // Wait for the replica's promotion (node timeout + election), under load.
    let promoted = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match cluster.try_primary_of_slot(slot) {
                Some(now) if now != primary => return now,
                _ => {}
            }
            assert!(Instant::now() < deadline, "no replica was promoted");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    eprintln!(
        "cluster: slot {slot} moved from :{primary} to :{promoted} after {:?}",
        killed_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    check_failover_load(load, "cluster").await;
    limiting_resumed(&proxies, "after-cluster-failover", "cluster").await;
    // The state now lives on the promoted replica.
    let on_promoted = cluster.node(promoted).cli(&[
        "--scan",
        "--pattern",
        &format!("{PREFIX}{{api}}*after-cluster-failover*"),
    ]);
    assert!(
        !on_promoted.is_empty(),
        "the new key is on the promoted replica"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_on_sentinel_admit_exactly_the_limit() {
    let _turn = heavy_turn().await;
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    exact_across_replicas(sentinel_target(&setup), "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_failover_follows_on_error_then_limits_on_the_promoted_replica() {
    let _turn = heavy_turn().await;
    let mut setup = tokio::task::block_in_place(SentinelSetup::start);
    let up = upstream().start().await;
    let yaml = failover_routes().store(store_of(sentinel_target(&setup), "300ms"));
    let proxies = replicas(&up, &yaml, 2).await;
    assert_eq!(
        status_of(proxies[0].addr, "/api", "first").await,
        StatusCode::OK
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&proxies, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    setup.master.kill();
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| setup.wait_replica_promoted(Duration::from_secs(30)));
    eprintln!("sentinel: replica promoted after {:?}", killed_at.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    check_failover_load(load, "sentinel").await;
    limiting_resumed(&proxies, "after-sentinel-failover", "sentinel").await;
    let on_promoted = setup.replica.cli(&[
        "--scan",
        "--pattern",
        &format!("{PREFIX}*after-sentinel-failover*"),
    ]);
    assert!(
        !on_promoted.is_empty(),
        "the new key is on the promoted replica"
    );
}

/// Writes a CA, a server certificate for 127.0.0.1 and a client certificate, all PEM.
fn write_certificates(dir: &std::path::Path) {
    write_private_ca(
        dir,
        &[
            ("server", &["127.0.0.1"], "redis"),
            ("client", &["tollgate"], "tollgate"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_custom_ca_client_certificate_and_acl_user() {
    let certs = tempfile::tempdir().unwrap();
    write_certificates(certs.path());
    let file = |name: &str| certs.path().join(name).display().to_string();
    let redis = CustomRedis::start(&[
        "--port",
        "0",
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        &file("server.pem"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.pem"),
        "--tls-auth-clients",
        "yes",
        "--user",
        "default",
        "off",
        "--user",
        "tollgate",
        "on",
        ">s3cret-pw",
        "~*",
        "+@all",
    ]);
    std::env::set_var("TOLLGATE_TEST_REDIS_PASSWORD", "s3cret-pw");
    let up = upstream().start().await;
    let target = |password: &str| {
        store::redis(&format!("rediss://127.0.0.1:{}", redis.node.port))
            .username("tollgate")
            .password(password)
            .tls_ca_file(&file("ca.pem"))
            .tls_client(&file("client.pem"), &file("client.key"))
    };
    let routes = users().route(user_route("api", "/api").limit(limit::fixed_window(3, "24h")));
    let yaml = routes
        .clone()
        .store(store_of(target("${TOLLGATE_TEST_REDIS_PASSWORD}"), "2s"));
    let proxies = replicas(&up, &yaml, 1).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(status_of(proxies[0].addr, "/api", "tls-user").await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    // A wrong password never connects: on_error (deny) answers.
    let yaml = routes
        .upstream(&up.url())
        .store(store_of(target("wrong"), "300ms"));
    let wrong = proxy(yaml).start().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        status_of(wrong.addr, "/api", "tls-user-2").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// Redis memory per key for each algorithm (`MEMORY USAGE key SAMPLES 0`), for
/// docs/scaling.md: printed, and bounded so a change that bloats the state shows up here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_usage_per_key_for_each_algorithm() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = exact_routes().store(store_of(standalone(&redis.url()), "2s"));
    let proxies = replicas(&up, &yaml, 1).await;
    let addr = proxies[0].addr;
    let conn = redis.client().await;
    let usage = |pattern: String| {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(keys.len(), 1, "{pattern}: {keys:?}");
            let bytes: i64 = ::redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&keys[0])
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
            (keys[0].clone(), bytes)
        }
    };
    let mut report = Vec::new();
    for (name, route, path, requests) in [
        ("fixed_window", "fw", "/fw", 1),
        ("sliding_window", "sw", "/sw", 1),
        ("token_bucket", "tb", "/tb", 1),
        ("gcra", "gcra", "/gcra", 1),
        ("sliding_log (1 entry)", "sl", "/slog", 1),
        ("sliding_log (50 entries)", "sl", "/slog", 50),
    ] {
        let user = format!("mem-{requests}");
        for _ in 0..requests {
            assert_eq!(status_of(addr, path, &user).await, StatusCode::OK);
        }
        let (key, bytes) = usage(format!("{PREFIX}{{{route}|*{user}*")).await;
        report.push((name, key, bytes));
    }
    // Concurrency: measured while 1 and then 10 requests hold a slot.
    for held in [1usize, 10] {
        let user = format!("mem-conc-{held}");
        let holders: Vec<_> = (0..held)
            .map(|_| {
                let user = user.clone();
                tokio::spawn(async move { status_of(addr, "/sleep?ms=1500", &user).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (key, bytes) = usage(format!("{PREFIX}{{conc|*{user}*")).await;
        report.push((
            if held == 1 {
                "concurrency (1 in flight)"
            } else {
                "concurrency (10 in flight)"
            },
            key,
            bytes,
        ));
        for h in holders {
            assert_eq!(h.await.unwrap(), StatusCode::OK);
        }
    }
    for (name, key, bytes) in &report {
        eprintln!("MEMORY USAGE {key} SAMPLES 0 -> {bytes} bytes ({name})");
        let bound = if name.contains("50 entries") {
            4096
        } else {
            1024
        };
        assert!(*bytes > 0 && *bytes < bound, "{name}: {bytes} bytes");
    }
}
