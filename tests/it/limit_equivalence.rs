//! The Lua script and the memory store must agree exactly: same traffic, same decisions.
//!
//! Both stores are driven on one fake clock (ManualClock for memory, ScriptClock::Argv for
//! Redis) with the same seeded pseudo-random sequence of times, costs, releases and refreshes,
//! and every Decision is compared step by step. Lease ids are random per store, so leases are
//! compared by key and params and mapped index by index. Settlements (refunds of earlier
//! admissions, taken at the time the decision reported, and charges past the limit) are
//! interleaved with the decisions, so settle.lua is held equal to algorithm::settle too.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{RedisServer, Rng};
use tollgate::limit::calendar::{self, Calendar, Unit, Zone};
use tollgate::limit::clock::ManualClock;
use tollgate::limit::memory::MemoryStore;
use tollgate::limit::redis_store::{decide_script_source, RedisStore, ScriptClock};
use tollgate::limit::{Algorithm, Check, Decision, Lease, Micros, Params, Settle, Settlement};

/// A realistic clock magnitude, so double precision in Lua is exercised.
const T0: Micros = 1_763_000_000_123_457;

struct Limit {
    key: String,
    params: Params,
    shadow: bool,
    /// `block_for` (0: none).
    block_us: Micros,
}

fn params(algorithm: Algorithm, limit: u64, period_us: Micros, burst: u64) -> Params {
    Params {
        algorithm,
        limit,
        period_us,
        burst,
        cost: 1,
        calendar: None,
    }
}

fn strip(d: &Decision) -> (bool, Vec<tollgate::limit::Verdict>, Vec<(String, Params)>) {
    (
        d.allowed,
        d.verdicts.clone(),
        d.leases.iter().map(|l| (l.key.clone(), l.params)).collect(),
    )
}

async fn drive(redis: &RedisStore, name: &str, limits: &[Limit], seed: u64, steps: usize) {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::with_clock(clock.clone());
    let mut rng = Rng(seed);
    let mut now = T0;
    let period = limits.iter().map(|l| l.params.period_us).max().unwrap();
    let max_cap = limits
        .iter()
        .map(|l| l.params.limit.max(l.params.burst))
        .max()
        .unwrap();
    // (memory lease, redis lease) pairs still held
    let mut held: Vec<(Lease, Lease)> = Vec::new();
    // (decision time, cost) of admissions not refunded yet
    let mut taken: Vec<(Micros, u64)> = Vec::new();
    let mut admitted = 0;
    for step in 0..steps {
        now += match rng.below(10) {
            0..=3 => 0,
            4..=7 => rng.below(period as u64 / 8) as i64,
            8 => rng.below(period as u64) as i64,
            _ => rng.below(3 * period as u64) as i64,
        };
        clock.set(now);
        match rng.below(8) {
            0 if !held.is_empty() => {
                let (m, r) = held.remove(rng.below(held.len() as u64) as usize);
                memory.release(std::slice::from_ref(&m));
                redis.release(std::slice::from_ref(&r)).await.unwrap();
            }
            1 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                let (m, r) = held[i].clone();
                let a = memory.refresh(std::slice::from_ref(&m));
                let b = redis
                    .refresh_at(std::slice::from_ref(&r), now)
                    .await
                    .unwrap();
                assert_eq!(a, b, "{name}: refresh differs at step {step}");
            }
            2 | 3 => {
                let op = if rng.below(2) == 0 && !taken.is_empty() {
                    let (at, cost) = taken.remove(rng.below(taken.len() as u64) as usize);
                    Settle::Refund {
                        amount: match rng.below(3) {
                            0 => cost + rng.below(3),
                            _ => cost,
                        },
                        taken_at: at,
                    }
                } else {
                    Settle::Charge {
                        amount: match rng.below(4) {
                            0 => max_cap * (2 + rng.below(5)),
                            _ => rng.below(max_cap + 1),
                        },
                    }
                };
                let settlements: Vec<Settlement> = limits
                    .iter()
                    .filter(|l| l.params.algorithm != Algorithm::Concurrency)
                    .map(|l| Settlement {
                        key: l.key.clone(),
                        params: l.params,
                        op,
                    })
                    .collect();
                memory.settle(&settlements);
                redis.settle_at(&settlements, now).await.unwrap();
            }
            _ => {}
        }
        let cost = match rng.below(10) {
            0 => 0,
            1 => max_cap + 1 + rng.below(2),
            2..=3 => 2 + rng.below(2),
            _ => 1,
        };
        let checks: Vec<Check> = limits
            .iter()
            .map(|l| Check {
                key: &l.key,
                params: Params { cost, ..l.params },
                shadow: l.shadow,
                block_us: l.block_us,
            })
            .collect();
        let m = memory.decide(&checks);
        let r = redis.decide_at(&checks, now).await.unwrap();
        assert_eq!(
            strip(&m),
            strip(&r),
            "{name}: step {step} at t0+{} cost {cost}",
            now - T0
        );
        assert_eq!(m.at, r.at, "{name}: decision time at step {step}");
        if m.allowed {
            admitted += 1;
            taken.push((m.at, cost));
        }
        held.extend(m.leases.into_iter().zip(r.leases));
    }
    assert!(admitted > 0, "{name}: nothing was ever admitted");
    assert!(admitted < steps, "{name}: nothing was ever denied");
}

#[tokio::test]
async fn lua_script_and_memory_store_agree() {
    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    let configs = [
        (5, 1_000_000, 8),
        (7, 999_983, 3), // awkward numbers for the integer divisions
        (3, 60_000_000, 16),
    ];
    for (i, (limit, period, burst)) in configs.into_iter().enumerate() {
        for algorithm in Algorithm::ALL {
            let burst = match algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => burst,
                _ => limit,
            };
            let name = format!("{}#{i}", algorithm.name());
            let limits = [Limit {
                key: format!("eq:{name}"),
                params: params(algorithm, limit, period, burst),
                shadow: false,
                block_us: 0,
            }];
            drive(&redis, &name, &limits, 42 + i as u64, 400).await;
            // The same with a penalty box (block_for) shorter and longer than the period.
            if algorithm == Algorithm::Concurrency {
                continue; // block_for is refused there
            }
            for block_us in [period / 3 + 7, 2 * period + 13] {
                let name = format!("{name}+block{block_us}");
                let limits = [Limit {
                    key: format!("eq:{name}"),
                    params: params(algorithm, limit, period, burst),
                    shadow: false,
                    block_us,
                }];
                drive(&redis, &name, &limits, 77 + i as u64, 300).await;
            }
        }
    }
    let mixed = [
        Limit {
            key: "mix:fixed".into(),
            params: params(Algorithm::FixedWindow, 20, 10_000_000, 20),
            shadow: false,
            block_us: 0,
        },
        Limit {
            key: "mix:bucket".into(),
            params: params(Algorithm::TokenBucket, 4, 1_000_000, 6),
            shadow: false,
            block_us: 0,
        },
        Limit {
            key: "mix:log-shadow".into(),
            params: params(Algorithm::SlidingLog, 3, 1_000_000, 3),
            shadow: true,
            block_us: 0,
        },
        Limit {
            key: "mix:conc".into(),
            params: params(Algorithm::Concurrency, 4, 2_000_000, 4),
            shadow: false,
            block_us: 0,
        },
        Limit {
            key: "mix:gcra-shadow".into(),
            params: params(Algorithm::Gcra, 5, 1_000_000, 2),
            shadow: true,
            block_us: 0,
        },
        Limit {
            key: "mix:window".into(),
            params: params(Algorithm::SlidingWindow, 8, 3_000_000, 8),
            shadow: false,
            block_us: 0,
        },
    ];
    drive(&redis, "mixed", &mixed, 7, 600).await;
    // Blocks on two of the enforcing limits, one blocked while the other still counts.
    let mut blocked = mixed;
    blocked[0].key = "blk:fixed".into();
    blocked[1].key = "blk:bucket".into();
    blocked[1].block_us = 1_500_007;
    blocked[2].key = "blk:log-shadow".into();
    blocked[3].key = "blk:conc".into();
    blocked[4].key = "blk:gcra-shadow".into();
    blocked[5].key = "blk:window".into();
    blocked[5].block_us = 4_000_003;
    drive(&redis, "mixed+blocks", &blocked, 11, 600).await;
    // Thirteen checks in one decision: a reply of 67 integers, more than prelude.lua's
    // packed() formats in one call, so its value-by-value path is held equal too.
    let wide: Vec<Limit> = (0..13)
        .map(|i| {
            let algorithm = Algorithm::ALL[i % Algorithm::ALL.len()];
            let limit = 5 + i as u64;
            let burst = match algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => limit + 3,
                _ => limit,
            };
            Limit {
                key: format!("wide:{i}"),
                params: params(algorithm, limit, 1_000_000 + 7 * i as Micros, burst),
                shadow: i % 5 == 4,
                block_us: 0,
            }
        })
        .collect();
    drive(&redis, "wide", &wide, 13, 300).await;
}

/// A key rewritten by another algorithm (a reconfigured route) is idle in both stores.
#[tokio::test]
async fn foreign_states_are_idle_in_both_stores() {
    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    let memory = MemoryStore::with_clock(Arc::new(ManualClock::new(T0)));
    for first in Algorithm::ALL {
        for second in Algorithm::ALL {
            let key = format!("swap:{}:{}", first.name(), second.name());
            for (i, algorithm) in [first, second, second].into_iter().enumerate() {
                let check = Check {
                    key: &key,
                    params: params(algorithm, 2, 1_000_000, 2),
                    shadow: false,
                    block_us: 0,
                };
                let m = memory.decide(&[check]);
                let r = redis.decide_at(&[check], T0).await.unwrap();
                assert_eq!(strip(&m), strip(&r), "{key} step {i}");
            }
        }
    }
}

/// The states in Redis keep their exact layout (a state written by an older or newer version
/// of the script must read the same): the string states and zset members are checked against
/// algorithm.rs's states, at times that take every path of the script's number formatting
/// (below and above 1e9, around multiples of 1e9, past 2^52), and every key expires after
/// its TTL in milliseconds, rounded up (plus the injected clock's hour of slack).
#[tokio::test]
async fn states_keep_their_exact_layout() {
    use redis::AsyncCommands;
    use tollgate::limit::algorithm::{self, State};

    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    let mut client = server.client().await;
    let times: [Micros; 9] = [
        3,
        999_999_999,
        1_000_000_000,
        1_999_999_999_999,
        7_000_000_000_000_000 - 1,
        T0,
        T0 + 999_999_999 - T0 % 1_000_000_000,
        (1 << 52) + 12_345,
        (1 << 53) - 3 * 7_777_777,
    ];
    for (i, now) in times.into_iter().enumerate() {
        for algorithm in Algorithm::ALL {
            let p = Params {
                algorithm,
                limit: 3,
                period_us: 7_777_777,
                burst: 5,
                cost: 2,
                calendar: None,
            };
            let key = format!("layout:{i}:{}", algorithm.name());
            let check = Check {
                key: &key,
                params: p,
                shadow: false,
                block_us: 0,
            };
            let d = redis.decide_at(&[check], now).await.unwrap();
            assert!(d.allowed, "{key}");
            let lease = d.leases.first().map_or(0, |l| l.id);
            let step = algorithm::step_for(&p, None, now, lease);
            assert_eq!(d.verdicts[0], step.verdict, "{key}");
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut client)
                .await
                .unwrap();
            match step.state {
                State::FixedWindow { window, count } => {
                    let v: String = client.get(&key).await.unwrap();
                    assert_eq!(v, format!("1 {window} {count}"), "{key}");
                }
                State::SlidingWindow {
                    window,
                    current,
                    previous,
                } => {
                    let v: String = client.get(&key).await.unwrap();
                    assert_eq!(v, format!("3 {window} {current} {previous}"), "{key}");
                }
                State::TokenBucket { scaled, updated_at } => {
                    let v: String = client.get(&key).await.unwrap();
                    assert_eq!(v, format!("4 {scaled} {updated_at}"), "{key}");
                }
                State::Gcra { tat } => {
                    let v: String = client.get(&key).await.unwrap();
                    assert_eq!(v, format!("5 {tat}"), "{key}");
                }
                State::SlidingLog { entries } => {
                    assert_eq!(kind, "zset", "{key}");
                    let members = zset_with_scores(&mut client, &key).await;
                    let expected: Vec<(String, String)> = entries
                        .iter()
                        .enumerate()
                        .map(|(seq, t)| (format!("L{t}:{}", seq + 1), t.to_string()))
                        .collect();
                    assert_eq!(members, expected, "{key}");
                }
                State::Concurrency { leases } => {
                    assert_eq!(kind, "zset", "{key}");
                    let members = zset_with_scores(&mut client, &key).await;
                    let expected: Vec<(String, String)> = leases
                        .iter()
                        .map(|l| (format!("C{}:{}", l.id, l.units), l.expires_at.to_string()))
                        .collect();
                    assert_eq!(members, expected, "{key}");
                }
                State::Blocked { .. } => unreachable!("a limit's own key never holds a block"),
            }
            let pttl: i64 = client.pttl(&key).await.unwrap();
            let px = (step.ttl + 999) / 1000 + 3_600_000;
            assert!(
                pttl <= px && pttl > px - 5_000,
                "{key}: PTTL {pttl}, PX {px}"
            );
        }
    }
}

/// A block marker (`block_for`) lives at `limit::block_key` of the limit's key, holds the
/// block's end in decimal microseconds and expires after `block_for` in milliseconds, rounded
/// up (plus the injected clock's hour of slack); a reset deletes it and so lifts the block.
#[tokio::test]
async fn block_markers_keep_their_exact_layout() {
    use redis::AsyncCommands;

    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    let mut client = server.client().await;
    let key = "layout:{r}:login:alice";
    let block_us = 3_000_001;
    let check = Check {
        key,
        params: params(Algorithm::FixedWindow, 1, 60_000_000, 1),
        shadow: false,
        block_us,
    };
    assert!(redis.decide_at(&[check], T0).await.unwrap().allowed);
    let denied = redis.decide_at(&[check], T0 + 10).await.unwrap();
    assert!(!denied.allowed);
    let marker = tollgate::limit::block_key(key);
    let v: String = client.get(&marker).await.unwrap();
    assert_eq!(v, (T0 + 10 + block_us).to_string());
    let pttl: i64 = client.pttl(&marker).await.unwrap();
    let px = (block_us + 999) / 1000 + 3_600_000;
    assert!(pttl <= px && pttl > px - 5_000, "PTTL {pttl}, PX {px}");
    // A denial while blocked does not extend the block.
    redis.decide_at(&[check], T0 + 1_000_000).await.unwrap();
    let v: String = client.get(&marker).await.unwrap();
    assert_eq!(v, (T0 + 10 + block_us).to_string());
    // Deleting the marker lifts the block (the window still counts its one request).
    let _: i64 = client.del(&marker).await.unwrap();
    let after = redis.decide_at(&[check], T0 + 2_000_000).await.unwrap();
    let window_end = (T0 / 60_000_000 + 1) * 60_000_000;
    assert_eq!(
        after.verdicts[0].retry_after_us,
        window_end - (T0 + 2_000_000)
    );
}

/// Every member of the zset at `key` with its score, lowest score first.
async fn zset_with_scores(
    client: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Vec<(String, String)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(client)
        .await
        .unwrap()
}

/// A local-first round (sync.lua) applies batched usage with the arithmetic of
/// `algorithm::charge`: for the same usage sequences, the shared state it returns equals the
/// state charged in memory, key by key and round by round (several keys per round).
#[tokio::test]
async fn sync_rounds_and_memory_charges_agree() {
    use tollgate::limit::algorithm::{charge, State};
    use tollgate::limit::local_first::SyncItem;

    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    let configs = [(5, 1_000_000, 8), (7, 999_983, 3), (100, 60_000_000, 100)];
    let mut rng = Rng(2024);
    for (i, (limit, period, burst)) in configs.into_iter().enumerate() {
        let algorithms = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ];
        let limits: Vec<(String, Params)> = algorithms
            .iter()
            .map(|&algorithm| {
                let burst = match algorithm {
                    Algorithm::TokenBucket | Algorithm::Gcra => burst,
                    _ => limit,
                };
                (
                    format!("sync:{}#{i}", algorithm.name()),
                    params(algorithm, limit, period, burst),
                )
            })
            .collect();
        let mut memory: Vec<Option<State>> = vec![None; limits.len()];
        let mut now = T0;
        for round in 1..300u64 {
            now += (rng.next() % (period as u64 / 3 + 1)) as Micros;
            let items: Vec<SyncItem> = limits
                .iter()
                .map(|(key, params)| SyncItem {
                    key: key.clone(),
                    params: *params,
                    // Mostly small batches, some far over the limit, some empty (a refresh).
                    amount: rng.next() % (2 * burst.max(limit) + 3),
                })
                .collect();
            charge_in_memory(&mut memory, &items, now);
            let (at, shared) = redis
                .sync_round("replica-a", round, &items, Some(now))
                .await
                .unwrap();
            assert_eq!(at, now);
            assert_eq!(shared, memory, "config {i}, round {round}, at {now}");
            // The same round again (its reply was lost): applied once only.
            let (_, again) = redis
                .sync_round("replica-a", round, &items, Some(now))
                .await
                .unwrap();
            assert_eq!(again, memory, "config {i}, round {round} repeated");
        }
    }

    // A foreign value at a key (not a state of ours), even one with line breaks in it, reads
    // as no state, and the keys around it keep theirs, in order.
    let mut client = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("sync:foreign")
        .arg("not\na state\n")
        .query_async(&mut client)
        .await
        .unwrap();
    let gcra = params(Algorithm::Gcra, 5, 1_000_000, 5);
    let item = |key: &str, amount| SyncItem {
        key: key.into(),
        params: gcra,
        amount,
    };
    let items = [
        item("sync:before", 1),
        item("sync:foreign", 0),
        item("sync:after", 2),
    ];
    let now = T0 + 1_000_000_000;
    let (_, shared) = redis
        .sync_round("replica-a", 1, &items, Some(now))
        .await
        .unwrap();
    let charged = |amount| charge(&gcra, None, now, amount).map(|(s, _)| s);
    assert_eq!(shared, vec![charged(1), None, charged(2)]);
}

/// Two replicas charge the same keys round after round, keys as throttle::keys writes them
/// (several hash tags, one shared by two limits, a route-wide one with two callers; keys of
/// equal params, which a call sends once for all of them): each replica's round is also sent
/// again after the other replica's round (its reply was lost), and an older round arrives
/// once more after a newer one (a late copy still queued); a tag with no usage in a round is
/// only read. Every reply equals the memory charges of each round applied once.
async fn two_replicas_resending_count_each_round_once(redis: &RedisStore) {
    use tollgate::limit::algorithm::State;
    use tollgate::limit::local_first::SyncItem;

    let limits = [
        ("eq:{r|ann}:gcra", params(Algorithm::Gcra, 5, 1_000_000, 8)),
        (
            "eq:{r|ann}:fw",
            params(Algorithm::FixedWindow, 7, 999_983, 7),
        ),
        (
            "eq:{r|bob}:tb",
            params(Algorithm::TokenBucket, 100, 60_000_000, 100),
        ),
        (
            "eq:{r}:sw:cat",
            params(Algorithm::SlidingWindow, 9, 2_000_000, 9),
        ),
        (
            "eq:{r}:sw:dog",
            params(Algorithm::SlidingWindow, 9, 2_000_000, 9),
        ),
        ("eq:{r|dan}:gcra", params(Algorithm::Gcra, 5, 1_000_000, 8)),
    ];
    let mut rng = Rng(77);
    let mut memory: Vec<Option<State>> = vec![None; limits.len()];
    let mut now = T0;
    let mut sent: [Vec<Vec<SyncItem>>; 2] = [Vec::new(), Vec::new()];
    for round in 1..80u64 {
        for (r, replica) in ["replica-a", "replica-b"].into_iter().enumerate() {
            now += (rng.next() % 300_000) as Micros;
            let items: Vec<SyncItem> = limits
                .iter()
                .map(|(key, params)| SyncItem {
                    key: key.to_string(),
                    params: *params,
                    // Often nothing, so whole tags are only read now and then.
                    amount: (rng.next() % 12).saturating_sub(4),
                })
                .collect();
            charge_in_memory(&mut memory, &items, now);
            let (at, shared) = redis
                .sync_round(replica, round, &items, Some(now))
                .await
                .unwrap();
            assert_eq!(at, now);
            assert_eq!(shared, memory, "{replica}, round {round}");
            sent[r].push(items);
        }
        // Replica a's reply was lost: its resend comes after b's write of the same round.
        let (_, again) = redis
            .sync_round("replica-a", round, &sent[0][round as usize - 1], Some(now))
            .await
            .unwrap();
        assert_eq!(again, memory, "replica-a, round {round} sent again");
        // A copy of b's previous round, late behind this one.
        if round > 1 {
            let (_, late) = redis
                .sync_round(
                    "replica-b",
                    round - 1,
                    &sent[1][round as usize - 2],
                    Some(now),
                )
                .await
                .unwrap();
            assert_eq!(late, memory, "replica-b, round {} late", round - 1);
        }
    }
}

/// On one server a round is one call: one marker per replica in all, none per key.
#[tokio::test]
async fn sync_rounds_resent_by_two_replicas_count_once_with_a_marker_per_replica() {
    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    two_replicas_resending_count_each_round_once(&redis).await;
    let mut client = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut markers: Vec<String> = redis::cmd("KEYS")
        .arg("*sync:*")
        .query_async(&mut client)
        .await
        .unwrap();
    markers.sort();
    assert_eq!(markers, ["eq:|sync:replica-a", "eq:|sync:replica-b"]);
}

/// On a Cluster a round is one call per hash tag, each with its marker in the tag's slot, and
/// the replies come back in the round's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_rounds_resent_on_a_cluster_count_once_with_a_marker_per_tag() {
    use tollgate::limit::redis_settings::{RedisMode, RedisSettings};

    let cluster = tokio::task::block_in_place(crate::support::RedisCluster::start);
    let settings = RedisSettings {
        mode: RedisMode::Cluster(cluster.urls()),
        ..RedisSettings::standalone("", Duration::from_secs(5))
    };
    let redis = RedisStore::open_with_clock(&settings, ScriptClock::Argv)
        .await
        .unwrap();
    two_replicas_resending_count_each_round_once(&redis).await;
    let mut markers: Vec<String> = cluster
        .keys("eq:")
        .into_iter()
        .filter(|k| k.contains("|sync:"))
        .collect();
    markers.sort();
    let mut expected: Vec<String> = ["{r}", "{r|ann}", "{r|bob}", "{r|dan}"]
        .iter()
        .flat_map(|tag| ["replica-a", "replica-b"].map(|r| format!("eq:{tag}|sync:{r}")))
        .collect();
    expected.sort();
    assert_eq!(markers, expected);
}

/// What a round's usage does to the in-memory states: the arithmetic sync.lua must mirror.
fn charge_in_memory(
    memory: &mut [Option<tollgate::limit::algorithm::State>],
    items: &[tollgate::limit::local_first::SyncItem],
    now: Micros,
) {
    use tollgate::limit::algorithm::charge;
    for (state, item) in memory.iter_mut().zip(items) {
        if item.amount > 0 {
            *state = charge(&item.params, state.as_ref(), now, item.amount)
                .filter(|(_, ttl)| *ttl > 0)
                .map(|(s, _)| s);
        }
    }
}

/// A calendar window (`window:` with `timezone:`) as the configuration builds it.
fn calendar_params(unit: Unit, zone: &str, limit: u64) -> Params {
    Params {
        period_us: unit.longest_us(),
        calendar: Some(Calendar {
            unit,
            zone: Zone::get(zone).unwrap(),
        }),
        ..params(Algorithm::FixedWindow, limit, 1, limit)
    }
}

/// Store-clock times that cross several turns of `calendar` from `start`: most steps stay
/// inside a window, some land on the microsecond before, at and after a turn.
fn times_across_turns(
    calendar: &Calendar,
    start: Micros,
    rng: &mut Rng,
    steps: usize,
) -> Vec<Micros> {
    let mut now = start;
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let [_, _, next, _] = calendar::turns(calendar, now);
        now = match rng.below(8) {
            0 => next - 1,
            1 => next,
            2 => next + 1 + rng.below(3) as i64,
            3 => now + rng.below(((next - now) / 2).max(1) as u64) as i64,
            _ => now + rng.below(1_000_000) as i64,
        };
        times.push(now);
    }
    times
}

/// Calendar windows decide alike in Redis and in memory, month ends, daylight-saving changes
/// and leap Februaries included, alone and next to a period limit with a penalty box.
#[tokio::test]
async fn calendar_windows_agree_across_turns() {
    let server = RedisServer::start();
    let redis =
        RedisStore::connect_with_clock(&server.url(), Duration::from_secs(5), ScriptClock::Argv)
            .await
            .unwrap();
    // (unit, zone, first instant): each run crosses turns next to a DST change or a month end.
    let runs = [
        (Unit::Month, "America/New_York", 1_793_400_000_000_000), // October 30th 2026
        (Unit::Month, "America/New_York", 1_803_700_000_000_000), // late February 2027
        (Unit::Day, "Europe/Berlin", 1_774_650_000_000_000),      // March 28th 2026
        (Unit::Day, "Europe/Berlin", 1_792_800_000_000_000),      // October 24th 2026
        (Unit::Week, "Europe/Berlin", 1_796_000_000_000_000),     // November 2026
        (Unit::Month, "UTC", 1_832_500_000_000_000),              // February 2028
        (Unit::Year, "Pacific/Auckland", 1_830_200_000_000_000),  // December 2027
    ];
    for (i, (unit, zone, start)) in runs.into_iter().enumerate() {
        let cal = calendar_params(unit, zone, 3);
        let calendar = cal.calendar.unwrap();
        let name = format!("{}-{zone}#{i}", unit.name());
        let mut rng = Rng(100 + i as u64);
        let times = times_across_turns(&calendar, start, &mut rng, 400);
        let limits = [
            Limit {
                key: format!("cal:{name}"),
                params: cal,
                shadow: false,
                block_us: 0,
            },
            Limit {
                key: format!("cal:{name}:per-second"),
                params: params(Algorithm::FixedWindow, 2, 1_000_000, 2),
                shadow: false,
                block_us: 1_500_000,
            },
        ];
        let clock = Arc::new(ManualClock::new(start));
        let memory = MemoryStore::with_clock(clock.clone());
        let (mut admitted, mut windows) = (0, std::collections::HashSet::new());
        for (step, now) in times.into_iter().enumerate() {
            clock.set(now);
            let cost = if rng.below(6) == 0 { 2 } else { 1 };
            for checks in [&limits[..1], &limits[..]] {
                let checks: Vec<Check> = checks
                    .iter()
                    .map(|l| Check {
                        key: &l.key,
                        params: Params { cost, ..l.params },
                        shadow: l.shadow,
                        block_us: l.block_us,
                    })
                    .collect();
                let m = memory.decide(&checks);
                let r = redis.decide_at(&checks, now).await.unwrap();
                assert_eq!(strip(&m), strip(&r), "{name}: step {step} at {now}");
                if m.allowed {
                    admitted += 1;
                    windows.insert(calendar::window(&calendar, now).0);
                }
            }
        }
        assert!(admitted > 0, "{name}: nothing was admitted");
        assert!(windows.len() >= 3, "{name}: only {} windows", windows.len());
    }
}

/// The script decides on its own clock among the turns the proxy computed on another: with
/// the proxy's clock ahead or behind by less than a window, every decision is the one the
/// memory store makes on the store's clock.
#[tokio::test]
async fn calendar_windows_follow_the_stores_clock_not_the_proxys() {
    let server = RedisServer::start();
    let mut client = server.client().await;
    let script = ::redis::Script::new(&decide_script_source(ScriptClock::Argv));
    let runs = [
        (Unit::Day, "Europe/Berlin", 1_774_650_000_000_000),
        (Unit::Month, "America/New_York", 1_793_400_000_000_000),
    ];
    for (i, (unit, zone, start)) in runs.into_iter().enumerate() {
        let p = calendar_params(unit, zone, 4);
        let calendar = p.calendar.unwrap();
        let shortest = 23 * 3_600 * 1_000_000;
        for skew in [-shortest + 1, -3_600_000_000, -1, 1, 999_999, shortest - 1] {
            let name = format!("{}-{zone}#{i} skew {skew}", unit.name());
            let key = format!("skew:{name}");
            let clock = Arc::new(ManualClock::new(start));
            let memory = MemoryStore::with_clock(clock.clone());
            let mut rng = Rng(7 + i as u64);
            for (step, now) in times_across_turns(&calendar, start, &mut rng, 150)
                .into_iter()
                .enumerate()
            {
                clock.set(now);
                let check = Check {
                    key: &key,
                    params: p,
                    shadow: false,
                    block_us: 0,
                };
                let m = memory.decide(&[check]);
                // The proxy's turns, from its own clock; the script's time, the store's.
                let t = calendar::turns(&calendar, now + skew);
                let arg = format!(
                    "1 {} {} {} 1 0 0 0 {} {} {} {}",
                    p.limit, p.period_us, p.burst, t[0], t[1], t[2], t[3]
                );
                let reply: String = script
                    .key(&key)
                    .arg(now)
                    .arg(arg)
                    .invoke_async(&mut client)
                    .await
                    .unwrap();
                let r: Vec<i64> = reply
                    .split_whitespace()
                    .map(|n| n.parse().unwrap())
                    .collect();
                let v = m.verdicts[0];
                assert_eq!(
                    r,
                    vec![
                        m.allowed as i64,
                        v.allowed as i64,
                        v.limit as i64,
                        v.remaining as i64,
                        v.reset_after_us,
                        v.retry_after_us,
                        now
                    ],
                    "{name}: step {step} at {now}"
                );
            }
        }
    }
}
