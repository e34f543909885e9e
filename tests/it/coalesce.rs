//! Coalescing (`store.redis.coalesce: true`) on a real Redis: the batch form of the decision
//! script decides exactly as the same decisions sent one by one; concurrent requests still
//! admit exactly the limit, in fewer script calls; a frozen Redis fails every queued decision
//! within the timeout and limiting resumes after it; the config refuses it with a Cluster.

use std::time::{Duration, Instant};

use crate::support::{RedisServer, Rng};
use tollgate::config::RedisConfig;
use tollgate::limit::redis_store::{RedisStore, ScriptClock};
use tollgate::limit::{Algorithm, Check, Micros, Params, Store, StoreError};

const SEC: i64 = 1_000_000;
/// A realistic clock magnitude, so double precision in Lua is exercised.
const T0: Micros = 1_763_000_000_123_457;

fn params(algorithm: Algorithm, limit: u64, period_us: i64, burst: u64, cost: u64) -> Params {
    Params {
        algorithm,
        limit,
        period_us,
        burst,
        cost,
        calendar: None,
    }
}

fn coalescing(server: &RedisServer, timeout: Duration) -> RedisConfig {
    let mut config = RedisConfig::standalone(server.url(), timeout);
    config.coalesce = true;
    config
}

async fn evalsha_calls(server: &RedisServer) -> u64 {
    let mut c = server.client().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// The same seeded traffic over every algorithm (one to three checks a decision, costs above
/// one, shadow limits), decided one by one on one store and in batches of one to six on the
/// other: every decision's outcome and every verdict must be equal.
#[tokio::test]
async fn the_batch_form_decides_exactly_as_one_by_one() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(5);
    let url = server.url();
    let single = RedisStore::connect_with_clock(&url, timeout, ScriptClock::Argv)
        .await
        .unwrap();
    let batched = RedisStore::connect_with_clock(&url, timeout, ScriptClock::Argv)
        .await
        .unwrap();
    let kinds = [
        params(Algorithm::FixedWindow, 5, 2 * SEC, 5, 1),
        params(Algorithm::SlidingLog, 4, 3 * SEC, 4, 1),
        params(Algorithm::SlidingWindow, 6, 2 * SEC, 6, 1),
        params(Algorithm::TokenBucket, 3, SEC, 6, 1),
        params(Algorithm::Gcra, 4, SEC, 3, 1),
        params(Algorithm::Concurrency, 3, 5 * SEC, 3, 1),
    ];
    let mut rng = Rng(0x7011_6a7e);
    let mut now = T0;
    let mut compared = 0;
    for _step in 0..300 {
        now += (rng.below(400) * 1000) as i64;
        let group = 1 + rng.below(6) as usize;
        // (prefix-free key suffix, params, shadow) per check, per decision.
        let mut plan: Plan = Vec::new();
        for _ in 0..group {
            let checks = 1 + rng.below(3) as usize;
            let mut decision = Vec::new();
            for _ in 0..checks {
                let kind = rng.below(kinds.len() as u64) as usize;
                let mut p = kinds[kind];
                p.cost = 1 + rng.below(2);
                let caller = rng.below(3);
                decision.push((
                    format!("{}:{caller}", p.algorithm.name()),
                    p,
                    rng.below(8) == 0,
                ));
            }
            // A decision names each key once (as routes do).
            decision.sort_by(|a, b| a.0.cmp(&b.0));
            decision.dedup_by(|a, b| a.0 == b.0);
            plan.push(decision);
        }
        let keys_a: Vec<Vec<String>> = plan
            .iter()
            .map(|d| d.iter().map(|(k, _, _)| format!("a:{k}")).collect())
            .collect();
        let keys_b: Vec<Vec<String>> = plan
            .iter()
            .map(|d| d.iter().map(|(k, _, _)| format!("b:{k}")).collect())
            .collect();
        let one_by_one = checks_of(&plan, &keys_a);
        let together = checks_of(&plan, &keys_b);
        let batch = batched.decide_batch_at(&together, now).await.unwrap();
        assert_eq!(batch.len(), one_by_one.len());
        for (i, decision) in one_by_one.iter().enumerate() {
            let alone = single.decide_at(decision, now).await.unwrap();
            assert_eq!(
                (alone.allowed, &alone.verdicts),
                (batch[i].allowed, &batch[i].verdicts),
                "decision {i} of a batch of {group} at {now}"
            );
            assert_eq!(alone.leases.len(), batch[i].leases.len());
            compared += 1;
        }
    }
    assert!(compared >= 600, "only {compared} decisions compared");
}

type Plan = Vec<Vec<(String, Params, bool)>>;

fn checks_of<'a>(plan: &Plan, keys: &'a [Vec<String>]) -> Vec<Vec<Check<'a>>> {
    plan.iter()
        .zip(keys)
        .map(|(d, ks)| {
            d.iter()
                .zip(ks)
                .map(|((_, p, shadow), key)| Check {
                    key,
                    params: *p,
                    shadow: *shadow,
                    block_us: 0,
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_admit_exactly_the_limit_in_fewer_calls() {
    let server = RedisServer::start();
    let store = Store::Redis(
        RedisStore::open(&coalescing(&server, Duration::from_secs(5)))
            .await
            .unwrap(),
    );
    let cases = [
        params(Algorithm::FixedWindow, 50, 3600 * SEC, 50, 1),
        params(Algorithm::SlidingLog, 50, 3600 * SEC, 50, 1),
        params(Algorithm::TokenBucket, 1, 3600 * SEC, 50, 1),
        params(Algorithm::Gcra, 1, 3600 * SEC, 50, 1),
        params(Algorithm::Concurrency, 50, 3600 * SEC, 50, 1),
    ];
    for p in cases {
        let calls_before = evalsha_calls(&server).await;
        let key = format!("race:{}", p.algorithm.name());
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let store = store.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let check = Check {
                        key: &key,
                        params: p,
                        shadow: false,
                        block_us: 0,
                    };
                    store.decide(&[check]).await.unwrap().allowed
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += usize::from(t.await.unwrap());
        }
        assert_eq!(admitted, 50, "{}", p.algorithm.name());
        let calls = evalsha_calls(&server).await - calls_before;
        assert!(
            calls < 200,
            "{}: 200 concurrent decisions took {calls} script calls",
            p.algorithm.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_every_queued_decision_in_time_and_limiting_resumes() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = Store::Redis(
        RedisStore::open(&coalescing(&server, timeout))
            .await
            .unwrap(),
    );
    let p = params(Algorithm::Gcra, 1000, SEC, 1000, 1);
    let decide = |store: Store, i: usize| async move {
        let key = format!("frozen:{}", i % 7);
        let check = Check {
            key: &key,
            params: p,
            shadow: false,
            block_us: 0,
        };
        let started = Instant::now();
        let result = store.decide(&[check]).await;
        (result.map(|d| d.allowed), started.elapsed())
    };
    assert!(decide(store.clone(), 0).await.0.unwrap());

    server.pause();
    let tasks: Vec<_> = (0..100)
        .map(|i| tokio::spawn(decide(store.clone(), i)))
        .collect();
    for t in tasks {
        let (result, took) = t.await.unwrap();
        assert!(
            matches!(result, Err(StoreError::Timeout(t)) if t == timeout),
            "{result:?}"
        );
        // timeout under test: the store's timeout, and a second's slack.
        assert!(took < timeout + Duration::from_secs(1), "took {took:?}");
    }
    server.resume();

    let mut recovered = false;
    for _ in 0..50 {
        if let Ok(true) = decide(store.clone(), 1).await.0 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "limiting did not resume after the server came back"
    );
}
