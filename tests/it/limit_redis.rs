//! The Redis store on a real server, on Redis's own clock: atomicity under concurrency,
//! nothing consumed by denied requests, key hygiene (names as given, TTLs always set),
//! NOSCRIPT recovery, timeouts on a frozen server, and concurrency leases.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use redis::AsyncCommands;
use tollgate::limit::redis_store::RedisStore;
use tollgate::limit::{Algorithm, Check, Params, Store, StoreError};

const SEC: i64 = 1_000_000;

fn params(algorithm: Algorithm, limit: u64, period_us: i64, burst: u64) -> Params {
    Params {
        algorithm,
        limit,
        period_us,
        burst,
        cost: 1,
        calendar: None,
    }
}

fn check(key: &str, params: Params) -> Check<'_> {
    Check {
        key,
        params,
        shadow: false,
        block_us: 0,
    }
}

async fn store(server: &RedisServer, timeout: Duration) -> Store {
    Store::Redis(RedisStore::connect(&server.url(), timeout).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    // Periods long enough that nothing refills or expires while the test runs.
    let cases = [
        params(Algorithm::FixedWindow, 50, 3600 * SEC, 50),
        params(Algorithm::SlidingLog, 50, 3600 * SEC, 50),
        params(Algorithm::TokenBucket, 1, 3600 * SEC, 50),
        params(Algorithm::Gcra, 1, 3600 * SEC, 50),
        params(Algorithm::Concurrency, 50, 3600 * SEC, 50),
    ];
    for p in cases {
        let key = format!("race:{}", p.algorithm.name());
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move { store.decide(&[check(&key, p)]).await.unwrap() })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            if t.await.unwrap().allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 50, "{}", p.algorithm.name());
    }
}

#[tokio::test]
async fn denied_multi_limit_request_consumes_nothing() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    let wide = params(Algorithm::SlidingLog, 10, 3600 * SEC, 10);
    let narrow = params(Algorithm::FixedWindow, 1, 3600 * SEC, 1);
    let both = [check("multi:wide", wide), check("multi:narrow", narrow)];
    assert!(store.decide(&both).await.unwrap().allowed);
    let mut redis = server.client().await;
    let before: i64 = redis.zcard("multi:wide").await.unwrap();
    for _ in 0..5 {
        let d = store.decide(&both).await.unwrap();
        assert!(!d.allowed);
        assert!(d.verdicts[0].allowed && !d.verdicts[1].allowed);
    }
    let after: i64 = redis.zcard("multi:wide").await.unwrap();
    assert_eq!(before, after);
    let d = store.decide(&[check("multi:wide", wide)]).await.unwrap();
    assert_eq!(d.verdicts[0].remaining, 8);

    // A denying shadow limit neither denies nor is consumed; an allowing one is consumed.
    let shadow = Check {
        shadow: true,
        ..check("multi:narrow", narrow)
    };
    let d = store
        .decide(&[check("multi:wide", wide), shadow])
        .await
        .unwrap();
    assert!(d.allowed && !d.verdicts[1].allowed);
    assert_eq!(d.verdicts[0].remaining, 7);
}

#[tokio::test]
async fn keys_are_used_as_given_and_always_expire() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    let mut names = BTreeSet::new();
    for a in Algorithm::ALL {
        let key = format!("{{tenant-1}}:route/{}", a.name());
        let d = store
            .decide(&[check(&key, params(a, 3, 2 * SEC, 3))])
            .await
            .unwrap();
        assert!(d.allowed);
        names.insert(key);
    }
    let mut redis = server.client().await;
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert_eq!(keys.into_iter().collect::<BTreeSet<_>>(), names);
    for key in &names {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 4000, "{key}: PTTL {pttl}");
    }
}

#[tokio::test]
async fn recovers_from_script_flush() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    let c = check("flush", params(Algorithm::FixedWindow, 5, 3600 * SEC, 5));
    assert_eq!(store.decide(&[c]).await.unwrap().verdicts[0].remaining, 4);
    let mut redis = server.client().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(store.decide(&[c]).await.unwrap().verdicts[0].remaining, 3);
}

#[tokio::test]
async fn frozen_server_times_out_and_recovery_follows() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = store(&server, timeout).await;
    let c = check("frozen", params(Algorithm::TokenBucket, 100, SEC, 100));
    assert!(store.decide(&[c]).await.unwrap().allowed);
    server.pause();
    let started = Instant::now();
    let result = store.decide(&[c]).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(result, Err(StoreError::Timeout(t)) if t == timeout),
        "{result:?}"
    );
    // timeout under test: the store's 300 ms timeout (a second's slack above; below, a lower
    // bound a busy machine cannot break).
    assert!(took < timeout + Duration::from_secs(1), "took {took:?}");
    assert!(took >= timeout - Duration::from_millis(50), "took {took:?}");
    eventually_allowed(&store, c).await;
    // And after a restart (new process, same port) the connection manager reconnects.
    server.restart();
    eventually_allowed(&store, c).await;
}

async fn eventually_allowed(store: &Store, c: Check<'_>) {
    for _ in 0..50 {
        if let Ok(d) = store.decide(&[c]).await {
            assert!(d.allowed);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store never recovered");
}

#[tokio::test]
async fn released_leases_free_their_slot() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    let c = check("lease", params(Algorithm::Concurrency, 2, 3600 * SEC, 2));
    let first = store.decide(&[c]).await.unwrap();
    let second = store.decide(&[c]).await.unwrap();
    assert_eq!((first.leases.len(), second.leases.len()), (1, 1));
    assert_ne!(first.leases[0].id, second.leases[0].id);
    let denied = store.decide(&[c]).await.unwrap();
    assert!(!denied.allowed && denied.leases.is_empty());
    store.release(&first.leases).await.unwrap();
    let third = store.decide(&[c]).await.unwrap();
    assert!(third.allowed);
    assert!(!store.decide(&[c]).await.unwrap().allowed);
    store.release(&second.leases).await.unwrap();
    store.release(&third.leases).await.unwrap();
    // Releasing twice is harmless; with no lease left the key is gone.
    store.release(&third.leases).await.unwrap();
    let mut redis = server.client().await;
    let exists: bool = redis.exists("lease").await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn unreleased_leases_expire_and_refresh_extends_them() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    // A 3 s lease TTL, and waits of half of it: every step has 1.5 s of slack for a busy
    // machine (the waits are the scenario: the TTL running, or not yet).
    let c = check("ttl-lease", params(Algorithm::Concurrency, 1, 3_000_000, 1));
    let d = store.decide(&[c]).await.unwrap();
    assert!(d.allowed);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(store.refresh(&d.leases).await.unwrap(), vec![true]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // 3 s after taking it, the refreshed lease (expiring 3 s after its refresh) still holds
    // the slot.
    assert!(!store.decide(&[c]).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(store.refresh(&d.leases).await.unwrap(), vec![false]);
    assert!(store.decide(&[c]).await.unwrap().allowed);
}

#[tokio::test]
async fn describe_hides_credentials() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(5)).await;
    assert_eq!(store.describe(), format!("redis {}", server.url()));
    let url = format!("redis://default:hunter2@127.0.0.1:{}/0", server.port());
    let with_password = RedisStore::connect(&url, Duration::from_secs(5)).await;
    // The test server has no password: AUTH fails, but the description must never leak it.
    if let Ok(s) = with_password {
        assert!(!Store::Redis(s).describe().contains("hunter2"));
    }
    let memory = Store::Memory(tollgate::limit::memory::MemoryStore::new());
    assert_eq!(memory.describe(), "memory (this process only)");
}
