//! Calendar windows through the real binary: `check` refuses an unknown time zone where it is
//! written and says when the current window turns, and a running tollgate (Redis store, and
//! memory store) resets a monthly quota in `America/New_York` at local midnight of the 1st,
//! with `Retry-After` and the RateLimit fields exact to the second.
//!
//! The proxies run with `TOLLGATE_TEST_CLOCK_OFFSET_MS` (debug builds only), which shifts their
//! clocks and Redis's `TIME` as the scripts read it, so the test stands a few seconds before
//! the month turns instead of waiting for it.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::*;
use http::StatusCode;
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

fn tollgate() -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_LOG")
        .env_remove("RUST_LOG")
        .env_remove("TOLLGATE_TEST_CLOCK_OFFSET_MS");
    command
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn check(path: &Path) -> std::process::Output {
    tollgate()
        .arg("check")
        .arg("--config")
        .arg(path)
        .output()
        .expect("running tollgate check")
}

#[test]
fn check_refuses_an_unknown_zone_where_it_is_written() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "zone.yaml",
        "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\nroutes:\n  - name: api\n    limits:\n      - algorithm: fixed_window\n        limit: 10000\n        window: month\n        timezone: Europe/Atlantis\n",
    );
    let output = check(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    let expected = format!(
        "{}:9:19: routes[0].limits[0].timezone: `Europe/Atlantis` is not a known IANA time zone",
        path.display()
    );
    assert!(first.starts_with(&expected), "{stderr}");
}

#[test]
fn check_refuses_window_and_period_together() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "both.yaml",
        "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\nroutes:\n  - name: api\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 30d, window: month }\n",
    );
    let output = check(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr
            .lines()
            .next()
            .unwrap_or_default()
            .starts_with(&format!(
                "{}:6:67: routes[0].limits[0].window: `window` and `period` are mutually exclusive",
                path.display()
            )),
        "{stderr}"
    );
}

#[test]
fn check_says_when_the_window_turns() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "ok.yaml",
        "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\nroutes:\n  - name: api\n    limits:\n      - { algorithm: fixed_window, limit: 10000, window: month, timezone: Europe/Berlin }\n",
    );
    let output = check(&path);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "  limit   api fixed_window 10000 per month (Europe/Berlin), this one turns at "
        ) && stdout.contains("-01T00:00:00+0")
            && stdout.contains("[Europe/Berlin], in "),
        "{stdout}"
    );
}

/// A running tollgate process; killed when dropped.
struct Running {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(yaml: impl Fn(u16) -> String, offset_ms: i64) -> Running {
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let config = write(&dir, "run.yaml", &yaml(port));
    let log = File::create(dir.path().join("stderr")).unwrap();
    let child = tollgate()
        .arg("--config")
        .arg(&config)
        .env("TOLLGATE_TEST_CLOCK_OFFSET_MS", offset_ms.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawning tollgate");
    let running = Running {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(running.addr).await.is_err() {
        assert!(Instant::now() < deadline, "tollgate did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running
}

fn real_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// One request: status, Retry-After, the RateLimit and RateLimit-Policy fields.
async fn hit(addr: SocketAddr) -> (StatusCode, Option<String>, String, String) {
    let response = http1_client()
        .request(get(&format!("http://{addr}/api/x")))
        .await
        .unwrap();
    let field = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    (
        response.status(),
        field("retry-after"),
        field("ratelimit").unwrap_or_default(),
        field("ratelimit-policy").unwrap_or_default(),
    )
}

/// Sleeps until the shifted clock is half-way through a second, so a request sent now is
/// decided within the same whole second on any of the clocks involved.
async fn to_mid_second(offset_us: i64) {
    let fraction = (real_now_us() + offset_us).rem_euclid(1_000_000);
    let wait = (1_500_000 - fraction) % 1_000_000;
    tokio::time::sleep(Duration::from_micros(wait as u64)).await;
}

/// Midnight of November 1st 2026 in New York (EDT, 04:00Z): October ends, and DST ends two
/// hours later, so November lasts 30 days and an hour.
const TURN_US: i64 = 1_793_505_600_000_000;
const OCTOBER_S: u64 = 31 * 86_400;
const NOVEMBER_S: u64 = 30 * 86_400 + 3_600;
/// How far before the turn the proxies' clocks are started.
const LEAD_S: i64 = 12;

async fn month_turns_at_local_midnight(running: &Running, offset_us: i64, what: &str) {
    let addr = running.addr;
    // The quota: two per month.
    to_mid_second(offset_us).await;
    let (status, _, rate, policy) = hit(addr).await;
    assert_eq!(status, StatusCode::OK, "{what}");
    assert_eq!(policy, format!("\"api\";q=2;w={OCTOBER_S}"), "{what}");
    let left = ((TURN_US - real_now_us() - offset_us) / 1_000_000) as u64 + 1;
    assert!(
        left > 2,
        "{what}: the proxy started too late to stand before the turn"
    );
    assert_eq!(rate, format!("\"api\";r=1;t={left}"), "{what}");
    assert_eq!(hit(addr).await.0, StatusCode::OK, "{what}");
    to_mid_second(offset_us).await;
    let (status, retry, rate, _) = hit(addr).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{what}");
    // Exact to the second: the seconds left to local midnight, rounded up.
    let left = ((TURN_US - real_now_us() - offset_us) / 1_000_000) as u64 + 1;
    assert_eq!(retry, Some(left.to_string()), "{what}: {rate}");
    assert_eq!(rate, format!("\"api\";r=0;t={left}"), "{what}");
    // Still October a moment before the turn.
    let before = TURN_US - 300_000 - offset_us - real_now_us();
    tokio::time::sleep(Duration::from_micros(before.max(0) as u64)).await;
    assert_eq!(hit(addr).await.0, StatusCode::TOO_MANY_REQUESTS, "{what}");
    // November: a new count, in a window that lasts 30 days and an hour.
    let after = TURN_US + 200_000 - offset_us - real_now_us();
    tokio::time::sleep(Duration::from_micros(after.max(0) as u64)).await;
    let (status, _, rate, policy) = hit(addr).await;
    assert_eq!(status, StatusCode::OK, "{what}: {rate}");
    assert_eq!(policy, format!("\"api\";q=2;w={NOVEMBER_S}"), "{what}");
    assert!(rate.starts_with("\"api\";r=1;t="), "{what}: {rate}");
    let t: u64 = rate.rsplit('=').next().unwrap().parse().unwrap();
    assert!((NOVEMBER_S - 2..=NOVEMBER_S).contains(&t), "{what}: {rate}");
}

#[tokio::test]
async fn a_month_in_new_york_turns_at_local_midnight_in_redis_and_in_memory() {
    let server = RedisServer::start();
    let up = upstream().start().await;
    let redis_url = server.url();
    let up_url = up.url();
    let offset_ms = (TURN_US - LEAD_S * 1_000_000 - real_now_us()) / 1_000;
    let offset_us = offset_ms * 1_000;
    let route = "routes:\n  - name: api\n    match: { path_prefix: /api/ }\n    key: global\n    limits:\n      - { algorithm: fixed_window, limit: 2, window: month, timezone: America/New_York }\n";
    let shared = start(
        |port| {
            format!(
                "listen: 127.0.0.1:{port}\nupstream: {{ url: {up_url} }}\nstore:\n  redis: {{ url: \"{redis_url}\", key_prefix: \"cal:\" }}\n{route}"
            )
        },
        offset_ms,
    )
    .await;
    let memory = start(
        |port| format!("listen: 127.0.0.1:{port}\nupstream: {{ url: {up_url} }}\n{route}"),
        offset_ms,
    )
    .await;
    tokio::join!(
        month_turns_at_local_midnight(&shared, offset_us, "redis"),
        month_turns_at_local_midnight(&memory, offset_us, "memory"),
    );
    // The Redis store keyed the window by its start: October's count and November's.
    let mut client = server.client().await;
    // The limit's keys only (the fleet's top-offenders lists live under `{offenders}`).
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("cal:{api*")
        .query_async(&mut client)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let state: String = ::redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut client)
        .await
        .unwrap();
    assert_eq!(state, format!("1 {TURN_US} 1"));
}
