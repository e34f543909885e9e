//! Bounded state under key floods, through the built binary: one client sends thousands of
//! distinct identities (a small `store.max_keys_per_route` stands in for the default, so the
//! flood takes seconds), and afterwards new callers on every route are still admitted, a
//! caller who was limited before the flood still is, and `/metrics` shows the table within
//! its budget. On the memory store and on Redis with local-first limits. Also: `client_ip`
//! keys group IPv6 clients by `client_ip.ipv6_prefix` (/64 by default) while allow-lists
//! compare the whole address.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use futures_util::StreamExt;
use http::{Request, StatusCode};

/// Keys per route in these tests (the default is 100,000).
const BUDGET: u64 = 256;
/// Distinct identities the flood sends.
const FLOOD: usize = 6_000;
/// Requests in flight during the flood.
const CONCURRENCY: usize = 32;

/// The tollgate binary, killed when the test ends however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Instance {
    _process: Running,
    _dir: tempfile::TempDir,
    url: String,
    admin: String,
}

/// Starts the binary on `config` (its listener and admin set here) and waits until `/probe`
/// answers 200.
async fn start(config: Config) -> Instance {
    let port = free_port();
    let admin_port = free_port();
    let config = config
        .listen(&format!("127.0.0.1:{port}"))
        .admin(&format!("127.0.0.1:{admin_port}"));
    let dir = tempfile::TempDir::new().unwrap();
    let file = write_config(&dir, &config.yaml());
    let process = Running(
        Command::new(TOLLGATE_BIN)
            .arg("--config")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the tollgate binary"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(response) = http1_client().request(get(&format!("{url}/probe"))).await {
            if response.status() == StatusCode::OK {
                break;
            }
        }
        assert!(Instant::now() < deadline, "tollgate never admitted /probe");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Instance {
        _process: process,
        _dir: dir,
        url,
        admin: format!("http://127.0.0.1:{admin_port}"),
    }
}

async fn status(url: &str, user: &str) -> StatusCode {
    let request = Request::get(url)
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let _ = text(response).await;
    status
}

/// `FLOOD` distinct users on `path`, `CONCURRENCY` at a time: how many were admitted.
async fn flood(instance: &Instance, path: &str) -> usize {
    let url = format!("{}{path}", instance.url);
    futures_util::stream::iter(0..FLOOD)
        .map(|i| {
            let url = url.clone();
            async move { status(&url, &format!("flood-{i}")).await }
        })
        .buffer_unordered(CONCURRENCY)
        .filter(|s| std::future::ready(*s == StatusCode::OK))
        .count()
        .await
}

/// One sample of `/metrics`, by its whole series name (`name{labels}`).
async fn metric(instance: &Instance, series: &str) -> f64 {
    let response = http1_client()
        .request(get(&format!("{}/metrics", instance.admin)))
        .await
        .unwrap();
    let metrics = text(response).await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// Users by `x-user`; `/login` (3 a minute) and `/search` (3 a minute), `sync` when given.
fn routes(config: Config, sync: Option<&str>) -> Config {
    let limit = |name: &str| {
        let limit = limit::fixed_window(3, "1h").name(name);
        match sync {
            Some(sync) => limit.sync(sync),
            None => limit,
        }
    };
    config
        .identity("user", [source::header("x-user")])
        .route(
            route("probe")
                .prefix("/probe")
                .key("user")
                .limit(limit::fixed_window(1_000_000, "1m")),
        )
        .route(
            route("login")
                .prefix("/login")
                .key("user")
                .limit(limit("login")),
        )
        .route(
            route("search")
                .prefix("/search")
                .key("user")
                .limit(limit("search")),
        )
}

/// The flood, then what every caller sees: a limited caller who keeps retrying through the
/// flood is still limited, new callers on both routes are admitted, and the flood itself was
/// admitted (each flood identity is new: 3 a minute each).
async fn flood_and_check(instance: &Instance, store: &str) {
    let login = format!("{}/login", instance.url);
    let search = format!("{}/search", instance.url);
    for _ in 0..3 {
        assert_eq!(status(&login, "mallory").await, StatusCode::OK);
    }
    assert_eq!(
        status(&login, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let retrying = {
        let login = login.clone();
        tokio::spawn(async move {
            let mut refused = 0;
            for _ in 0..40 {
                assert_eq!(
                    status(&login, "mallory").await,
                    StatusCode::TOO_MANY_REQUESTS,
                    "a limited caller freed by the flood"
                );
                refused += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            refused
        })
    };
    let admitted = flood(instance, "/login").await;
    assert_eq!(admitted, FLOOD, "flood identities refused for lack of room");
    assert_eq!(retrying.await.unwrap(), 40);
    assert_eq!(
        status(&login, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for user in ["alice", "bob", "carol"] {
        assert_eq!(
            status(&login, user).await,
            StatusCode::OK,
            "{user} on /login"
        );
        assert_eq!(
            status(&search, user).await,
            StatusCode::OK,
            "{user} on /search"
        );
    }
    // The table held: /login's budget, plus the few keys of /search and /probe.
    let held = metric(
        instance,
        &format!("tollgate_store_keys{{store=\"{store}\"}}"),
    )
    .await;
    assert!(held <= (BUDGET + 16) as f64, "{held} keys held");
    let evicted = metric(
        instance,
        &format!("tollgate_store_evicted_keys_total{{store=\"{store}\"}}"),
    )
    .await;
    assert!(evicted > 0.0, "nothing evicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_on_the_memory_store_leaves_new_callers_admitted_and_the_table_bounded() {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let config = routes(
        config()
            .upstream(&up.url())
            .store(store::memory().max_keys_per_route(BUDGET)),
        None,
    );
    let instance = start(config).await;
    flood_and_check(&instance, "memory").await;
    let evicted = metric(
        &instance,
        "tollgate_store_evicted_keys_total{store=\"memory\"}",
    )
    .await;
    assert!(
        evicted >= (FLOOD as u64 - BUDGET) as f64,
        "{evicted} evicted"
    );
}

/// `INFO stats` `total_commands_processed`.
async fn commands(redis: &RedisServer) -> u64 {
    let mut client = redis.client().await;
    let info: String = ::redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut client)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_on_local_first_limits_leaves_new_callers_admitted_and_redis_calm() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = routes(
        config().upstream(&up.url()).store(
            store::redis(&redis.url())
                .timeout("300ms")
                .on_error("deny")
                .max_keys_per_route(BUDGET),
        ),
        Some("100ms"),
    )
    // An exact route beside them, answering from Redis throughout.
    .route(
        route("exact")
            .prefix("/exact")
            .key("user")
            .limit(limit::fixed_window(3, "1m")),
    );
    let instance = start(config).await;
    flood_and_check(&instance, "local_first").await;
    let exact = format!("{}/exact", instance.url);
    assert_eq!(status(&exact, "dave").await, StatusCode::OK);
    // Every flood identity was counted in Redis (decided exactly or written by a round):
    // none was lost with a dropped copy. The login limit's keys hold one unit per flood user.
    // Wait for the rounds to have written every sampled key, then check the count is exact.
    let mut client = redis.client().await;
    let sampled = FLOOD.div_ceil(97) as u64;
    let total = eventually("every sampled flood key in Redis", PATIENCE, async || {
        let mut total = 0u64;
        let mut missing = Vec::new();
        for i in (0..FLOOD).step_by(97) {
            let key = format!("tollgate:{{login|header=flood-{i}}}:login");
            let value: Option<String> = ::redis::cmd("GET")
                .arg(&key)
                .query_async(&mut client)
                .await
                .unwrap();
            match value {
                // `1 <window> <count>` (decide.lua's layout of a fixed window).
                Some(value) => total += value.split(' ').nth(2).unwrap().parse::<u64>().unwrap(),
                None => missing.push(key),
            }
        }
        if missing.is_empty() && total >= sampled {
            Ok(total)
        } else {
            Err(format!("total {total}, not in Redis: {missing:?}"))
        }
    })
    .await;
    assert_eq!(total, sampled);
    // Idle after the flood, the rounds read a bounded number of keys: Redis stays calm.
    let before = commands(&redis).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_second = (commands(&redis).await - before) as f64 / started.elapsed().as_secs_f64();
    assert!(
        per_second < 20_000.0,
        "{per_second:.0} Redis commands a second from an idle instance"
    );
}

/// One command's calls so far, from `INFO commandstats` (commands a script runs included).
async fn calls(redis: &RedisServer, command: &str) -> u64 {
    let mut client = redis.client().await;
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut client)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Keys Redis reads for tollgate per round over at least `rounds` rounds: `GET`s per
/// heartbeat (each round renews it twice, with one `ZADD` each), counted, not timed.
async fn gets_per_heartbeat(redis: &RedisServer, rounds: u64) -> f64 {
    let (gets, beats) = (calls(redis, "get").await, calls(redis, "zadd").await);
    while calls(redis, "zadd").await < beats + 2 * rounds {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (gets_after, beats_after) = (calls(redis, "get").await, calls(redis, "zadd").await);
    (gets_after - gets) as f64 / (beats_after - beats) as f64
}

/// Cold keys go quiet (issue 37): after a flood of distinct callers on a local-first route,
/// the copies nobody uses any more are dropped within `COLD_AFTER_INTERVALS` (50 intervals,
/// 5 s at 100 ms) and the rounds read no more keys than before the flood; a caller limited
/// before the flood, whose copy was dropped, is still limited (decided on the fleet's count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_key_flood_cold_local_first_copies_are_dropped_and_redis_goes_quiet() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = routes(
        config()
            .upstream(&up.url())
            .store(store::redis(&redis.url()).timeout("300ms").on_error("deny")),
        Some("100ms"),
    );
    let instance = start(config).await;
    let login = format!("{}/login", instance.url);
    for _ in 0..3 {
        assert_eq!(status(&login, "mallory").await, StatusCode::OK);
    }
    assert_eq!(
        status(&login, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let idle = gets_per_heartbeat(&redis, 10).await;
    // (A loaded machine may fail a request of the flood; the copies are what matters here.)
    let started = Instant::now();
    let admitted = flood(&instance, "/login").await;
    let took = started.elapsed();
    assert!(admitted >= FLOOD * 9 / 10, "{admitted} of {FLOOD} admitted");
    let held = "tollgate_store_keys{store=\"local_first\"}";
    let held_now = metric(&instance, held).await;
    // Every caller of the flood has its copy while it is in use; a copy unused for 50
    // intervals (5 s) is dropped, so a flood that took longer (a loaded machine) has rightly
    // lost its first callers' copies by now: then only some are held.
    if took < Duration::from_millis(4_500) {
        assert!(
            held_now >= admitted as f64,
            "{held_now} copies held of {admitted} admitted in {took:?}"
        );
    } else {
        assert!(held_now > 0.0, "no copy held after a flood of {took:?}");
        eprintln!("the flood took {took:?}: {held_now} copies held of {admitted} admitted");
    }
    // Held copies are read every round (up to 1,000 idle ones a round).
    let flooded = gets_per_heartbeat(&redis, 5).await;
    assert!(
        flooded >= 100.0,
        "{flooded} GETs a heartbeat after the flood"
    );
    // Nobody uses them: dropped after 50 intervals (waited for up to 60 s, a busy machine).
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&instance, held).await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "{} cold copies still held",
            metric(&instance, held).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let quiet = gets_per_heartbeat(&redis, 10).await;
    assert!(
        quiet <= idle + 0.5,
        "{quiet} GETs a heartbeat after the copies went (idle before the flood: {idle})"
    );
    // A dropped caller is not freed early; a new one is admitted.
    assert_eq!(
        status(&login, "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&login, "erin").await, StatusCode::OK);
}

/// `/ip` limited to 2 a minute per client IP; the client address comes from X-Forwarded-For
/// written by the loopback proxy.
async fn per_ip(prefix: Option<u8>) -> (Upstream, ProxyHandle) {
    let up = upstream().start().await;
    let mut config = config()
        .upstream(&up.url())
        .trusted_proxies(["127.0.0.1/32", "::1/128"])
        .route(
            route("ip")
                .prefix("/ip")
                .key("client_ip")
                .limit(limit::fixed_window(2, "1m"))
                .allow(allow().client_ips(["2001:db8:1:2::a/128"])),
        );
    if let Some(bits) = prefix {
        config = config.ipv6_prefix(bits);
    }
    let proxy = proxy(config).start().await;
    (up, proxy)
}

async fn from(proxy: &ProxyHandle, client: &str) -> StatusCode {
    let request = Request::get(proxy.url("/ip"))
        .header("x-forwarded-for", client)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

#[tokio::test]
async fn ipv6_clients_are_keyed_by_their_64_and_ipv4_by_address() {
    let (_up, proxy) = per_ip(None).await;
    // Two addresses of one /64 share a limit of 2.
    assert_eq!(from(&proxy, "2001:db8:1:2::1").await, StatusCode::OK);
    assert_eq!(from(&proxy, "2001:db8:1:2:ffff::9").await, StatusCode::OK);
    assert_eq!(
        from(&proxy, "2001:db8:1:2::77").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another /64 has its own.
    assert_eq!(from(&proxy, "2001:db8:1:3::1").await, StatusCode::OK);
    // The allow-list compares the whole address: ::a of the spent /64 passes, ::b does not.
    for _ in 0..3 {
        assert_eq!(from(&proxy, "2001:db8:1:2::a").await, StatusCode::OK);
    }
    assert_eq!(
        from(&proxy, "2001:db8:1:2::b").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // IPv4, and IPv4-mapped IPv6 as the same IPv4 address.
    assert_eq!(from(&proxy, "192.0.2.1").await, StatusCode::OK);
    assert_eq!(from(&proxy, "::ffff:192.0.2.1").await, StatusCode::OK);
    assert_eq!(
        from(&proxy, "192.0.2.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(from(&proxy, "192.0.2.2").await, StatusCode::OK);
}

#[tokio::test]
async fn ipv6_prefix_128_keys_each_address() {
    let (_up, proxy) = per_ip(Some(128)).await;
    for client in ["2001:db8:1:2::1", "2001:db8:1:2::2"] {
        assert_eq!(from(&proxy, client).await, StatusCode::OK);
        assert_eq!(from(&proxy, client).await, StatusCode::OK);
        assert_eq!(from(&proxy, client).await, StatusCode::TOO_MANY_REQUESTS);
    }
}

#[tokio::test]
async fn a_client_on_ipv6_loopback_is_limited_by_its_address() {
    // The machine's IPv6 loopback, when it has one: the peer address itself, no header.
    let Ok(socket) = std::net::TcpListener::bind("[::1]:0") else {
        panic!("this machine has no IPv6 loopback (::1): the test needs one");
    };
    let port = socket.local_addr().unwrap().port();
    drop(socket);
    let up = upstream().start().await;
    let config = config()
        .listen(&format!("[::1]:{port}"))
        .upstream(&up.url())
        .route(
            route("ip")
                .prefix("/ip")
                .key("client_ip")
                .limit(limit::fixed_window(2, "1m")),
        );
    let _proxy = proxy(config).start().await;
    let url = format!("http://[::1]:{port}/ip");
    let statuses: Vec<StatusCode> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(http1_client().request(get(&url)).await.unwrap().status());
        }
        out
    };
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}
