//! A failing store is reported with its cause named, the same in the log (`store_cause`), the
//! metrics (`tollgate_store_errors_total{cause}`) and `/readyz`: a stopped Redis is
//! "connection refused", a frozen one (SIGSTOP) "timed out", a wrong password "authentication
//! failed". And the persistence check: a Redis that persists nothing under a configuration
//! with a calendar window is warned of in the log and on the console; one with AOF is not.
//!
//! tollgate runs as its own process here (JSON logs read from its stderr).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::StatusCode;
use serde_json::Value;

/// tollgate serving one configuration, its JSON log written to a file; killed when dropped.
struct Tollgate {
    child: Child,
    log: PathBuf,
    addr: SocketAddr,
    admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `config` served on free ports; returns once the admin listener answers (the store may be
/// down: that is what these tests look at).
async fn start(config: Config, rewrite: impl Fn(String) -> String) -> Tollgate {
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::TempDir::new().unwrap();
    let yaml = rewrite(
        config
            .listen(&format!("127.0.0.1:{port}"))
            .admin(&format!("127.0.0.1:{admin}"))
            .yaml(),
    );
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
    let tollgate = Tollgate {
        child,
        log,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        admin: format!("127.0.0.1:{admin}").parse().unwrap(),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while tollgate.admin_get("/healthz").await.0 != StatusCode::OK {
        assert!(Instant::now() < deadline, "tollgate never started:\n{yaml}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tollgate
}

impl Tollgate {
    async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let url = format!("http://{}{path}", self.admin);
        match http1_client().request(get(&url)).await {
            Ok(response) => (response.status(), text(response).await),
            Err(_) => (StatusCode::BAD_GATEWAY, String::new()),
        }
    }

    /// One request through the proxy: its status.
    async fn request(&self) -> StatusCode {
        let url = format!("http://{}/x", self.addr);
        http1_client().request(get(&url)).await.unwrap().status()
    }

    /// The log lines so far, as JSON.
    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// `tollgate_store_errors_total{cause="<cause>"}`.
    async fn store_errors(&self, cause: &str) -> f64 {
        let (_, text) = self.admin_get("/metrics").await;
        let series = format!("tollgate_store_errors_total{{cause=\"{cause}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }

    /// Waits (at most 15 s, sending a request now and then so requests meet the failure) until
    /// the store's failure is named `cause` / `words` everywhere: `/readyz` (503, `on_error:
    /// deny`), the requests it failed counted under that cause, and a log line with that
    /// `store_cause` whose text says it. Returns what it saw, for the caller's own asserts.
    async fn wait_for_cause(&self, cause: &str, words: &str) -> (String, Value) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            assert_eq!(self.request().await, StatusCode::SERVICE_UNAVAILABLE);
            let (status, readyz) = self.admin_get("/readyz").await;
            let counted = self.store_errors(cause).await;
            let line = self.log().into_iter().find(|l| l["store_cause"] == cause);
            if status == StatusCode::SERVICE_UNAVAILABLE && readyz.contains(words) && counted > 0.0
            {
                if let Some(line) = line {
                    return (readyz, line);
                }
            }
            assert!(
                Instant::now() < deadline,
                "cause {cause} not named everywhere: /readyz {status} {readyz:?}, \
                 {counted} counted, log:\n{:#?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn limited(redis: &RedisServer, up: &Upstream) -> Config {
    config()
        .upstream(&up.url())
        .route(
            route("api")
                .prefix("/")
                .limit(limit::fixed_window(1000, "1h")),
        )
        .store(store::redis(&redis.url()).timeout("100ms").on_error("deny"))
}

async fn ready(tollgate: &Tollgate) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tollgate.admin_get("/readyz").await.0 != StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "never ready: {:#?}",
            tollgate.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tollgate.request().await, StatusCode::OK);
}

fn no_change(yaml: String) -> String {
    yaml
}

#[tokio::test]
async fn a_stopped_redis_is_named_connection_refused() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let tollgate = start(limited(&redis, &up), no_change).await;
    ready(&tollgate).await;
    redis.stop();
    let (readyz, line) = tollgate
        .wait_for_cause("refused", "connection refused")
        .await;
    assert_eq!(
        readyz,
        "rate limit store unreachable (on_error: deny): connection refused\n"
    );
    let cause = line["cause"].as_str().unwrap();
    assert!(cause.starts_with("store connection refused: "), "{line}");
    // No line blames a timeout: a call that waited on the reconnecting connection is looked
    // into before it is reported.
    let log = tollgate.log();
    assert!(
        !log.iter().any(|l| l["store_cause"] == "timeout"),
        "{log:#?}"
    );
}

/// The field report: Redis refusing connections from the start, with the default 50 ms
/// timeout, was logged as `store timed out after 50ms` (the connection retries in the
/// background and the first connection's wait times out).
#[tokio::test]
async fn a_redis_refusing_from_the_start_is_named_connection_refused() {
    let up = upstream().start().await;
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    let config = config()
        .upstream(&up.url())
        .route(
            route("api")
                .prefix("/")
                .limit(limit::fixed_window(1000, "1h")),
        )
        .store(store::redis(&nobody).timeout("50ms").on_error("deny"));
    let tollgate = start(config, no_change).await;
    let (readyz, line) = tollgate
        .wait_for_cause("refused", "connection refused")
        .await;
    assert_eq!(
        readyz,
        "rate limit store unreachable (on_error: deny): connection refused\n"
    );
    assert_eq!(
        line["message"],
        "cannot connect to the rate limit store yet; applying on_error and retrying"
    );
    assert!(
        line["cause"]
            .as_str()
            .unwrap()
            .starts_with("store connection refused: "),
        "{line}"
    );
    assert!(
        !tollgate
            .log()
            .iter()
            .any(|l| l.to_string().contains("timed out")),
        "{:#?}",
        tollgate.log()
    );
    assert_eq!(tollgate.store_errors("timeout").await, 0.0);
}

#[tokio::test]
async fn a_frozen_redis_is_named_timed_out() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let tollgate = start(limited(&redis, &up), no_change).await;
    ready(&tollgate).await;
    redis.pause();
    let (readyz, line) = tollgate.wait_for_cause("timeout", "timed out").await;
    assert_eq!(
        readyz,
        "rate limit store unreachable (on_error: deny): timed out\n"
    );
    assert!(
        line["cause"]
            .as_str()
            .unwrap()
            .starts_with("store timed out after 100ms"),
        "{line}"
    );
    assert_eq!(tollgate.store_errors("refused").await, 0.0);
    redis.resume();
}

#[tokio::test]
async fn a_wrong_password_is_named_authentication_failed() {
    let redis = RedisServer::start_with(&["--requirepass", "the-right-one"]);
    let up = upstream().start().await;
    let config = limited(&redis, &up).store(
        store::redis(&redis.url())
            .timeout("100ms")
            .on_error("deny")
            .password("a-wrong-one"),
    );
    let tollgate = start(config, no_change).await;
    let (readyz, line) = tollgate
        .wait_for_cause("auth_failed", "authentication failed")
        .await;
    assert_eq!(
        readyz,
        "rate limit store unreachable (on_error: deny): authentication failed\n"
    );
    assert!(
        line["cause"]
            .as_str()
            .unwrap()
            .starts_with("store authentication failed: "),
        "{line}"
    );
    assert!(!line.to_string().contains("a-wrong-one"), "{line}");
    assert_eq!(tollgate.store_errors("timeout").await, 0.0);
}

/// A route with a monthly quota (a calendar window) on `redis`.
fn monthly(redis: &RedisServer, up: &Upstream) -> (Config, impl Fn(String) -> String) {
    let config = config()
        .upstream(&up.url())
        .store(store::redis(&redis.url()).timeout("500ms").on_error("deny"))
        .route(
            route("api")
                .prefix("/")
                .limit(limit::fixed_window(1000, "31d").name("monthly")),
        );
    let rewrite = |yaml: String| {
        assert!(yaml.contains("period: 31d"), "{yaml}");
        yaml.replace("period: 31d", "window: month")
    };
    (config, rewrite)
}

/// The console's store panel, once the persistence has been read.
async fn persistence_panel(tollgate: &Tollgate) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = tollgate.admin_get("/console/api/overview").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let overview: Value = serde_json::from_str(&body).unwrap();
        let panel = overview["store"]["persistence"].clone();
        if !panel["persistence"].is_null() {
            return panel;
        }
        assert!(Instant::now() < deadline, "never read: {overview:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_calendar_window_on_a_redis_that_persists_nothing_is_warned_of() {
    let mut redis = RedisServer::start_with(&["--save", "", "--appendonly", "no"]);
    let up = upstream().start().await;
    let (config, rewrite) = monthly(&redis, &up);
    let tollgate = start(config, rewrite).await;
    ready(&tollgate).await;
    let panel = persistence_panel(&tollgate).await;
    assert_eq!(panel["persistence"], "none", "{panel}");
    let warning = panel["warning"]
        .as_str()
        .unwrap_or_else(|| panic!("{panel}"));
    assert!(warning.contains("persists nothing"), "{warning}");
    assert!(warning.contains("calendar windows"), "{warning}");
    let logged = tollgate
        .log()
        .into_iter()
        .find(|l| l["level"] == "WARN" && l.to_string().contains("persists nothing"))
        .unwrap_or_else(|| panic!("no warning logged: {:#?}", tollgate.log()));
    assert_eq!(logged["persistence"], "none", "{logged}");
    assert!(
        logged["message"]
            .as_str()
            .unwrap()
            .contains("calendar windows"),
        "{logged}"
    );
    // Redis restarted (with everything lost): checked and warned of again when it is back.
    redis.restart();
    let warnings = || {
        tollgate
            .log()
            .iter()
            .filter(|l| l["level"] == "WARN" && l.to_string().contains("persists nothing"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while warnings() < 2 {
        assert!(
            Instant::now() < deadline,
            "not warned again after the restart: {:#?}",
            tollgate.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_redis_with_aof_is_not_warned_of() {
    let redis = RedisServer::start_with(&["--appendonly", "yes"]);
    let up = upstream().start().await;
    let (config, rewrite) = monthly(&redis, &up);
    let tollgate = start(config, rewrite).await;
    ready(&tollgate).await;
    let panel = persistence_panel(&tollgate).await;
    assert_eq!(panel["persistence"], "aof", "{panel}");
    assert!(panel["warning"].is_null(), "{panel}");
    let log = tollgate.log();
    assert!(
        log.iter()
            .any(|l| l["message"] == "rate limit store persistence" && l["persistence"] == "aof"),
        "{log:#?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.to_string().contains("persists nothing")),
        "{log:#?}"
    );
}

/// With `on_error: local` a down store keeps the instance ready, and `/readyz` still names the
/// cause on a second line.
#[tokio::test]
async fn readyz_names_the_cause_while_on_error_keeps_the_instance_ready() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let config = limited(&redis, &up).store(
        store::redis(&redis.url())
            .timeout("100ms")
            .on_error("local"),
    );
    let tollgate = start(config, no_change).await;
    ready(&tollgate).await;
    redis.stop();
    let expected = "ready\nrate limit store down (connection refused); on_error: local applies\n";
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        assert_eq!(tollgate.request().await, StatusCode::OK);
        let (status, readyz) = tollgate.admin_get("/readyz").await;
        assert_eq!(status, StatusCode::OK, "{readyz}");
        if readyz == expected {
            break;
        }
        assert!(Instant::now() < deadline, "{readyz:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The requests' own errors are counted under the cause each one met: the connection's
    // loss (reset), a wait that ran out, or the refusal, depending on when it came.
    let mut counted = 0.0;
    for cause in ["refused", "reset", "timeout", "other"] {
        counted += tollgate.store_errors(cause).await;
    }
    assert!(counted > 0.0, "no store error counted");
}

/// While the first connection is being made, `/readyz` says so, and is not ready whatever
/// `on_error` says: requests arriving then wait for the connection (see first_request.rs).
/// Redis frozen from the start keeps the first attempt waiting for the store's timeout.
#[tokio::test]
async fn readyz_says_the_store_is_not_connected_yet_until_it_is() {
    let redis = RedisServer::start();
    redis.pause();
    let up = upstream().start().await;
    let config =
        limited(&redis, &up).store(store::redis(&redis.url()).timeout("5s").on_error("allow"));
    let tollgate = start(config, no_change).await;
    let (status, readyz) = tollgate.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{readyz}");
    assert_eq!(
        readyz,
        "rate limit store not connected yet: its first connection is being made\n"
    );
    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(15);
    while tollgate.admin_get("/readyz").await.1 != "ready\n" {
        assert!(Instant::now() < deadline, "{:#?}", tollgate.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tollgate.request().await, StatusCode::OK);
    assert_eq!(tollgate.store_errors("other").await, 0.0);
    assert_eq!(tollgate.store_errors("not_connected").await, 0.0);
}
