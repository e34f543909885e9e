//! A replica decides in Redis from its first request: a request that arrives while the store's
//! first connection is being made waits for it (as long as the attempt may take: twice
//! `store.redis.timeout`, with a second's grace for a busy node) instead of failing open,
//! `/readyz` is not ready until that attempt has ended, and "not connected yet" is a cause of
//! its own (`not_connected`) in the log and `/readyz`.
//!
//! tollgate runs as its own process here (a fresh replica's start, JSON log read from a file).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::Value;

/// What `/readyz` answers while the first connection is being made.
const CONNECTING: &str = "rate limit store not connected yet: its first connection is being made\n";

/// A tollgate process serving one configuration on free ports, its JSON log written to a
/// file; killed when dropped.
struct Replica {
    child: Child,
    log: PathBuf,
    addr: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    /// Starts `config` and returns at once (the process may not listen yet).
    fn spawn(config: &Config) -> Replica {
        let (port, admin) = (free_port(), free_port());
        let dir = tempfile::TempDir::new().unwrap();
        let yaml = config
            .clone()
            .listen(&format!("127.0.0.1:{port}"))
            .admin(&format!("127.0.0.1:{admin}"))
            .yaml();
        let file = write_config(&dir, &yaml);
        let log = dir.path().join("tollgate.log");
        let child = Command::new(TOLLGATE_BIN)
            .arg("--config")
            .arg(&file)
            .args(["--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start tollgate");
        Replica {
            child,
            log,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            admin: format!("127.0.0.1:{admin}").parse().unwrap(),
            _dir: dir,
        }
    }

    /// Starts `config` and returns once its admin listener answers `/healthz`.
    async fn start(config: &Config) -> Replica {
        let replica = Replica::spawn(config);
        let deadline = Instant::now() + Duration::from_secs(20);
        while replica.admin_get("/healthz").await.0 != StatusCode::OK {
            assert!(Instant::now() < deadline, "tollgate never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        replica
    }

    /// Waits until the proxy port accepts connections (polled every 2 ms, at most 20 s): false
    /// when the process exited first (a port picked free was taken before it bound it).
    async fn accepting(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(self.addr).await.is_err() {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            assert!(Instant::now() < deadline, "tollgate never listened");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let url = format!("http://{}{path}", self.admin);
        match http1_client().request(get(&url)).await {
            Ok(response) => (response.status(), text(response).await),
            Err(_) => (StatusCode::BAD_GATEWAY, String::new()),
        }
    }

    /// One request for `user` on a connection of its own: its status.
    async fn request(&self, user: &str) -> StatusCode {
        request(self.addr, user).await
    }

    /// `/readyz` until it answers `want` (status and body), at most 20 s.
    async fn wait_readyz(&self, want: (StatusCode, &str)) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = self.admin_get("/readyz").await;
            if (status, body.as_str()) == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz answered {status} {body:?}, wanted {want:?}; log:\n{:#?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The log lines so far, as JSON.
    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The value of the series `series` (name and labels) in `/metrics`.
    async fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }

    /// `tollgate_store_errors_total`, every cause.
    async fn store_errors(&self) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        text.lines()
            .filter_map(|l| l.strip_prefix("tollgate_store_errors_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    }
}

async fn request(addr: SocketAddr, user: &str) -> StatusCode {
    let request = Request::get(format!("http://{addr}/x"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    let status = response.status();
    let _ = text(response).await;
    status
}

/// A CPU-bound process (`sh` spinning), killed when dropped: the busy node of the field report.
struct Spinner(Child);

impl Spinner {
    fn start() -> Spinner {
        Spinner(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .expect("start a CPU-bound sh"),
        )
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Callers by the `x-user` header; one route limited by `limit`, on `store`.
fn limited(up: &Upstream, limit: Limit, store: Store) -> Config {
    config()
        .upstream(&up.url())
        .identity("user", [source::header("x-user")])
        .route(route("api").prefix("/").key("user").limit(limit))
        .store(store)
}

/// The field report: two fresh replicas on one Redis (`timeout: 100ms`, `on_error: allow`), a
/// gcra limit of 10 a minute, 40 requests for one caller raced across both as soon as their
/// ports accept, two CPU-bound processes beside them: before the fix 13 to 34 of 40 were
/// admitted (every request that came before a replica's connection failed open). Now every
/// request is decided in Redis: exactly 10, in each of five rounds with fresh replicas and keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fresh_replicas_admit_exactly_the_limit_from_their_first_request() {
    let _turn = heavy_turn().await;
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let spinners = [Spinner::start(), Spinner::start()];
    let mut admitted_per_round = Vec::new();
    for round in 0..5 {
        let config = limited(
            &up,
            limit::gcra(10, "1m"),
            store::redis(&redis.url())
                .timeout("100ms")
                .on_error("allow")
                .key_prefix(&format!("first{round}:")),
        );
        let mut replicas = [Replica::spawn(&config), Replica::spawn(&config)];
        let mut requests = Vec::new();
        for replica in &mut replicas {
            for _ in 0..3 {
                if replica.accepting().await {
                    break;
                }
                *replica = Replica::spawn(&config);
            }
        }
        for i in 0..40 {
            let addr = replicas[i % 2].addr;
            requests.push(tokio::spawn(async move { request(addr, "racer").await }));
        }
        let mut admitted = 0;
        for r in requests {
            match r.await.unwrap() {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("round {round}: unexpected {other}"),
            }
        }
        let mut errors = Vec::new();
        for replica in &replicas {
            let counted = replica.store_errors().await;
            if counted > 0.0 {
                let said: Vec<Value> = replica
                    .log()
                    .into_iter()
                    .filter(|l| l.get("store_cause").is_some())
                    .collect();
                eprintln!("round {round}: a replica failed {counted} requests open: {said:#?}");
            }
            errors.push(counted);
        }
        eprintln!("round {round}: {admitted} of 40 admitted; store errors per replica {errors:?}");
        admitted_per_round.push((admitted, errors));
    }
    drop(spinners);
    assert!(
        admitted_per_round
            .iter()
            .all(|(admitted, _)| *admitted == 10),
        "admitted per round (limit 10), with each replica's store errors: {admitted_per_round:?}"
    );
}

/// `/readyz` is not 200 while the first connection is pending (Redis frozen from the start,
/// so the attempt waits for its timeout), names the cause, and is a bare `ready` once Redis
/// answers; the next request is decided by Redis.
#[tokio::test]
async fn readyz_is_not_ready_while_the_first_connection_is_pending() {
    let redis = RedisServer::start();
    redis.pause();
    let up = upstream().start().await;
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::redis(&redis.url()).timeout("10s").on_error("allow"),
    );
    let replica = Replica::start(&config).await;
    for _ in 0..5 {
        assert_eq!(
            replica.admin_get("/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, CONNECTING.to_string())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    redis.resume();
    replica.wait_readyz((StatusCode::OK, "ready\n")).await;
    assert_eq!(replica.request("u").await, StatusCode::OK);
    assert_eq!(replica.request("u").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(replica.store_errors().await, 0.0);
}

/// A request that arrives while the first connection is pending waits for it, and is then
/// decided by Redis, not by `on_error`: with a limit of 1 it takes the unit (the next request
/// is refused), and no store error is counted.
#[tokio::test]
async fn a_request_during_the_first_connection_waits_and_is_decided_by_redis() {
    let redis = RedisServer::start();
    redis.pause();
    let up = upstream().start().await;
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::redis(&redis.url()).timeout("10s").on_error("allow"),
    );
    let replica = Replica::start(&config).await;
    let addr = replica.addr;
    let waiting = tokio::spawn(async move { request(addr, "early").await });
    // Long enough for the request to reach the limit stage; it must still be waiting there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the request did not wait");
    assert_eq!(
        replica.admin_get("/readyz").await,
        (StatusCode::SERVICE_UNAVAILABLE, CONNECTING.to_string())
    );
    redis.resume();
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    assert_eq!(
        replica.request("early").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(replica.store_errors().await, 0.0);
    assert_eq!(
        replica
            .metric("tollgate_requests_total{route=\"api\",decision=\"allowed\"}")
            .await,
        1.0
    );
    let mut client = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*early*")
        .query_async(&mut client)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "the decision left no key in Redis");
}

/// A first attempt that fails at once (nothing listens): `on_error` applies to the first
/// request without its waiting for the timeout, the cause is named, and readiness says so.
#[tokio::test]
async fn a_failed_first_connection_applies_on_error_at_once() {
    let up = upstream().start().await;
    // Port 1: nothing listens there (a free port picked now could be taken by another test's
    // server before tollgate connects).
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::redis("redis://127.0.0.1:1")
            .timeout("5s")
            .on_error("allow"),
    );
    let replica = Replica::start(&config).await;
    let started = Instant::now();
    assert_eq!(replica.request("u").await, StatusCode::OK);
    assert_eq!(replica.request("u").await, StatusCode::OK, "failed open");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "two requests took {took:?}");
    assert_eq!(
        replica
            .metric("tollgate_store_errors_total{cause=\"refused\"}")
            .await,
        2.0,
        "{}",
        replica.admin_get("/metrics").await.1
    );
    replica
        .wait_readyz((
            StatusCode::OK,
            "ready\nrate limit store down (connection refused); on_error: allow applies\n",
        ))
        .await;
}

/// A first connection that hangs (Redis frozen from the start): a request waits for it no
/// longer than the attempt may take (twice `store.redis.timeout`, 2 s here: connecting, then
/// finding out why that timed out), the log saying it waits for a store not connected yet;
/// then `on_error` applies (counted as a store error, under the attempt's cause); readiness
/// names the cause and `on_error` keeps the instance ready; once Redis answers, it decides.
#[tokio::test]
async fn a_request_waits_for_a_hanging_first_connection_no_longer_than_the_attempt() {
    let redis = RedisServer::start();
    redis.pause();
    let up = upstream().start().await;
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::redis(&redis.url()).timeout("1s").on_error("allow"),
    );
    let replica = Replica::start(&config).await;
    let started = Instant::now();
    assert_eq!(replica.request("u").await, StatusCode::OK);
    let took = started.elapsed();
    // The attempt's bound (2 s), and the grace of a second for an attempt that runs late.
    assert!(
        took < Duration::from_secs(4),
        "held {took:?} (bound 2 s + 1 s)"
    );
    assert_eq!(replica.store_errors().await, 1.0, "{:#?}", replica.log());
    assert_eq!(
        replica
            .metric("tollgate_requests_total{route=\"api\",decision=\"store_error\"}")
            .await,
        1.0
    );
    let log = replica.log();
    let waited = log
        .iter()
        .find(|l| l["store_cause"] == "not_connected")
        .unwrap_or_else(|| panic!("no not_connected line: {log:#?}"));
    assert_eq!(
        waited["message"],
        "a request waits for the rate limit store's first connection (not connected yet)"
    );
    // The attempt times out (connecting, then finding out why) and `on_error` keeps the
    // instance ready, saying why.
    replica
        .wait_readyz((
            StatusCode::OK,
            "ready\nrate limit store down (timed out); on_error: allow applies\n",
        ))
        .await;
    redis.resume();
    replica.wait_readyz((StatusCode::OK, "ready\n")).await;
    assert_eq!(replica.request("v").await, StatusCode::OK);
    assert_eq!(replica.request("v").await, StatusCode::TOO_MANY_REQUESTS);
}

/// Through the Sentinels: the Sentinels frozen from the start keep the discovery (the first
/// connection) pending, `/readyz` is not ready and a request waits; once they answer, the
/// request is decided by Redis. redis-rs gives up on a Sentinel that does not answer within
/// its own second (whatever `store.redis.timeout` says), so they are frozen briefly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_discovery_pending_keeps_readyz_unready_and_requests_waiting() {
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let sentinels: Vec<u32> = setup.sentinels.iter().map(|s| process_id(s.port)).collect();
    let up = upstream().start().await;
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::sentinel(&setup.name, setup.sentinel_urls())
            .timeout("10s")
            .on_error("allow"),
    );
    for &pid in &sentinels {
        signal("-STOP", pid);
    }
    let replica = Replica::start(&config).await;
    let addr = replica.addr;
    let waiting = tokio::spawn(async move { request(addr, "early").await });
    let readyz = replica.admin_get("/readyz").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waited = !waiting.is_finished();
    for &pid in &sentinels {
        signal("-CONT", pid);
    }
    assert_eq!(
        readyz,
        (StatusCode::SERVICE_UNAVAILABLE, CONNECTING.to_string())
    );
    assert!(waited, "the request did not wait: {:#?}", replica.log());
    replica.wait_readyz((StatusCode::OK, "ready\n")).await;
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    assert_eq!(
        replica.request("early").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(replica.store_errors().await, 0.0, "{:#?}", replica.log());
}

/// A Redis Cluster whose only seed given is frozen from the start (a replica, so that the
/// cluster fails nothing over): the first connection (the slot map) is pending, `/readyz` is
/// not ready and a request waits; once the seed answers, the request is decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_first_connection_pending_keeps_readyz_unready_and_requests_waiting() {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let seed = cluster
        .nodes
        .iter()
        .find(|n| n.cli(&["ROLE"]).starts_with("slave"))
        .expect("a replica");
    let pid = process_id(seed.port);
    signal("-STOP", pid);
    let up = upstream().start().await;
    let config = limited(
        &up,
        limit::fixed_window(1, "1h"),
        store::cluster([seed.url()])
            .timeout("10s")
            .on_error("allow"),
    );
    let replica = Replica::start(&config).await;
    let addr = replica.addr;
    let waiting = tokio::spawn(async move { request(addr, "early").await });
    for _ in 0..3 {
        assert_eq!(
            replica.admin_get("/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, CONNECTING.to_string())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!waiting.is_finished(), "the request did not wait");
    signal("-CONT", pid);
    replica.wait_readyz((StatusCode::OK, "ready\n")).await;
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    assert_eq!(
        replica.request("early").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(replica.store_errors().await, 0.0);
}

/// The process id of the redis-server on `port` (its `INFO server`).
fn process_id(port: u16) -> u32 {
    let info = cli(port, &["INFO", "server"]).expect("INFO server");
    info.lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no process_id in {info}"))
}

/// `kill <sig> <pid>` for a redis-server this test started.
fn signal(sig: &str, pid: u32) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}
