//! Operating tollgate: metrics, readiness, hot reload (file change, ConfigMap-style symlink
//! swap, SIGHUP, invalid files), access logs, allow-lists and tiers.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};

async fn get_status(url: &str, headers: &[(&str, &str)]) -> StatusCode {
    let mut builder = Request::get(url);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let response = http1_client()
        .request(builder.body(body("")).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let _ = text(response).await;
    status
}

async fn metrics(admin: std::net::SocketAddr) -> String {
    let response = http1_client()
        .request(get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    text(response).await
}

/// The sum of `tollgate_store_errors_total` over its causes.
fn store_errors(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("tollgate_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn assert_has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing `{line}` in:\n{text}"
    );
}

#[tokio::test]
async fn metrics_count_decisions_and_upstream_responses_per_route() {
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .route(
            route("api")
                .prefix("/api/")
                .limit(limit::fixed_window(2, "24h")),
        )
        .route(
            route("trial")
                .prefix("/trial")
                .limit(limit::fixed_window(1, "24h").shadow()),
        );
    let proxy = proxy(routes).start().await;
    for _ in 0..3 {
        get_status(&proxy.url("/api/x"), &[]).await;
    }
    for _ in 0..2 {
        get_status(&proxy.url("/trial"), &[]).await;
    }
    get_status(&proxy.url("/echo"), &[]).await;
    let text = metrics(proxy.admin.unwrap()).await;
    assert_has(
        &text,
        "tollgate_requests_total{route=\"api\",decision=\"allowed\"} 2",
    );
    assert_has(
        &text,
        "tollgate_requests_total{route=\"api\",decision=\"limited\"} 1",
    );
    assert_has(
        &text,
        "tollgate_requests_total{route=\"trial\",decision=\"allowed\"} 1",
    );
    assert_has(
        &text,
        "tollgate_requests_total{route=\"trial\",decision=\"shadow_limited\"} 1",
    );
    assert_has(
        &text,
        "tollgate_requests_total{route=\"(none)\",decision=\"allowed\"} 1",
    );
    assert_has(
        &text,
        "tollgate_upstream_responses_total{route=\"api\",status_class=\"2xx\"} 2",
    );
    assert_has(
        &text,
        "tollgate_upstream_responses_total{route=\"(none)\",status_class=\"2xx\"} 1",
    );
    assert_has(&text, "tollgate_in_flight_requests 0");
    assert_eq!(store_errors(&text), 0.0, "{text}");
    for cause in [
        "refused",
        "reset",
        "timeout",
        "auth_failed",
        "script_error",
        "not_connected",
        "other",
    ] {
        assert_has(
            &text,
            &format!("tollgate_store_errors_total{{cause=\"{cause}\"}} 0"),
        );
    }
    assert_has(&text, "tollgate_limit_check_duration_seconds_count 5");
    assert_has(&text, "tollgate_upstream_duration_seconds_count 5");
    assert!(
        text.contains("# TYPE tollgate_upstream_duration_seconds histogram"),
        "{text}"
    );
}

#[tokio::test]
async fn readiness_follows_the_store_when_on_error_is_deny() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = |on_error: &str| {
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .store(
                store::redis(&redis.url())
                    .timeout("100ms")
                    .on_error(on_error),
            )
            .route(
                route("api")
                    .prefix("/")
                    .limit(limit::fixed_window(100, "24h")),
            )
    };
    let deny = proxy(yaml("deny")).start().await;
    let allow = proxy(yaml("allow")).start().await;
    let readyz = |p: &ProxyHandle| format!("http://{}/readyz", p.admin.unwrap());
    let wait_for = |url: String, want: StatusCode| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = get_status(&url, &[]).await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{url} stayed {got}, wanted {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_for(readyz(&deny), StatusCode::OK).await;
    redis.stop();
    // The store's state is learnt from traffic; enough failures to open the circuit breaker.
    for _ in 0..5 {
        assert_eq!(
            get_status(&deny.url("/"), &[]).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    wait_for(readyz(&deny), StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(get_status(&allow.url("/"), &[]).await, StatusCode::OK);
    wait_for(readyz(&allow), StatusCode::OK).await;
    redis.restart();
    // Readiness comes back by itself: an unready instance receives no traffic to learn from.
    wait_for(readyz(&deny), StatusCode::OK).await;
    assert_eq!(get_status(&deny.url("/"), &[]).await, StatusCode::OK);
}

/// Users by `x-user`, `limit` requests a day each on `/api/`.
fn route_with_limit(limit: u64) -> Config {
    config().identity("user", [source::header("x-user")]).route(
        route("api")
            .prefix("/api/")
            .key("user")
            .limit(limit::fixed_window(limit, "24h")),
    )
}

/// `route_with_limit` in front of `up`, with an admin listener.
fn with_limit(up: &Upstream, limit: u64) -> String {
    route_with_limit(limit)
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .yaml()
}

/// Sends requests as `user` until one is limited; returns how many passed (bounded).
async fn admitted_until_limited(proxy: &ProxyHandle, user: &str) -> usize {
    for n in 0..50 {
        if get_status(&proxy.url("/api/x"), &[("x-user", user)]).await
            == StatusCode::TOO_MANY_REQUESTS
        {
            return n;
        }
    }
    panic!("never limited");
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn reload_on_file_change_swaps_limits_keeps_state_and_refuses_invalid_files() {
    let up = upstream().start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, with_limit(&up, 3)).unwrap();
    let proxy = proxy_from_file(&path).await;
    assert_eq!(admitted_until_limited(&proxy, "a").await, 3);

    // Traffic keeps flowing through the reloads with no failed request.
    let url = proxy.url("/other");
    let background = tokio::spawn(async move {
        let mut failures = 0;
        for _ in 0..200 {
            if get_status(&url, &[]).await != StatusCode::OK {
                failures += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        failures
    });

    std::fs::write(&path, with_limit(&up, 5)).unwrap();
    wait_until("the new limit", async || {
        get_status(&proxy.url("/api/x"), &[("x-user", "probe")]).await == StatusCode::OK
            && admitted_until_limited(&proxy, &format!("u{}", rand_suffix())).await == 5
    })
    .await;
    // The unchanged limit kept its state: user `a` used 3 of the new 5.
    assert_eq!(admitted_until_limited(&proxy, "a").await, 2);

    // An invalid file is refused and counted; the previous configuration keeps serving.
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nupstream: { url: http://x }\nroutes: [ { nme: x } ]\n",
    )
    .unwrap();
    let admin = proxy.admin.unwrap();
    wait_until("the refused reload to be counted", async || {
        metrics(admin)
            .await
            .contains("tollgate_config_reloads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(
        admitted_until_limited(&proxy, &format!("v{}", rand_suffix())).await,
        5
    );
    assert_has(
        &metrics(admin).await,
        "tollgate_config_reloads_total{result=\"ok\"} 1",
    );
    assert_eq!(
        background.await.unwrap(),
        0,
        "no request failed during reloads"
    );
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test]
async fn reload_follows_a_configmap_style_symlink_swap() {
    let up = upstream().start().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Kubernetes layout: config.yaml -> ..data/config.yaml, ..data -> ..v1
    std::fs::create_dir(root.join("..v1")).unwrap();
    std::fs::write(root.join("..v1/config.yaml"), with_limit(&up, 1)).unwrap();
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
    let proxy = proxy_from_file(&root.join("config.yaml")).await;
    assert_eq!(admitted_until_limited(&proxy, "x").await, 1);

    std::fs::create_dir(root.join("..v2")).unwrap();
    std::fs::write(root.join("..v2/config.yaml"), with_limit(&up, 4)).unwrap();
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..v1")).unwrap();
    wait_until("the swapped config", async || {
        admitted_until_limited(&proxy, &format!("s{}", rand_suffix())).await == 4
    })
    .await;
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn sighup_reloads_and_access_log_lines_are_json() {
    let up = upstream().start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let yaml = |limit: u64| {
        route_with_limit(limit)
            .listen(&format!("127.0.0.1:{port}"))
            .upstream(&up.url())
            .yaml()
    };
    let path = write_config(dir.path(), &yaml(1));
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/api/x?token=SECRET");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "tollgate did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get_status(&url, &[("x-user", "a")]).await, StatusCode::OK);
    assert_eq!(
        get_status(&url, &[("x-user", "a")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Rewrite with the same mtime granularity risk avoided: SIGHUP forces the reload.
    std::fs::write(&path, yaml(3)).unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_status(&url, &[("x-user", "a")]).await != StatusCode::OK {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, stderr) = stop_with_status(child).await;
    assert!(status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "tollgate::access")
        .collect();
    assert!(access.len() >= 3, "{stderr}");
    let limited = access
        .iter()
        .find(|l| l["status"] == 429)
        .expect("a limited request was logged");
    assert_eq!(limited["method"], "GET");
    assert_eq!(limited["path"], "/api/x");
    assert_eq!(limited["route"], "api");
    assert_eq!(limited["identity"], "header");
    assert_eq!(limited["decision"], "limited");
    assert!(limited["total_ms"].as_f64().unwrap() >= 0.0);
    assert!(limited.get("timestamp").is_some());
    let allowed = access.iter().find(|l| l["status"] == 200).unwrap();
    assert_eq!(allowed["decision"], "allowed");
    assert!(allowed["upstream_ms"].as_f64().unwrap() >= 0.0);
    assert!(
        !stderr.contains("SECRET"),
        "query strings never reach the log"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "configuration reloaded"
                || l["message"] == "configuration reloaded"),
        "{stderr}"
    );
}

#[tokio::test]
async fn allow_lists_exempt_callers_and_tiers_give_their_own_limits() {
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .trusted_proxies(["127.0.0.1"])
        .allow(allow().client_ips(["192.0.2.0/24"]))
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/api/")
                .key("user")
                .allow(allow().identity("user", ["ops-bot", "127.0.0.1"]))
                .tier(
                    tier("partner")
                        .values(["partner-1", "partner-2"])
                        .limit(limit::fixed_window(5, "24h")),
                )
                .limit(limit::fixed_window(2, "24h")),
        );
    let proxy = proxy(routes).start().await;
    assert_eq!(admitted_until_limited(&proxy, "regular").await, 2);
    assert_eq!(admitted_until_limited(&proxy, "partner-1").await, 5);
    assert_eq!(
        admitted_until_limited(&proxy, "partner-2").await,
        5,
        "each partner value has its own bucket"
    );
    for _ in 0..10 {
        assert_eq!(
            get_status(&proxy.url("/api/x"), &[("x-user", "ops-bot")]).await,
            StatusCode::OK
        );
        assert_eq!(
            get_status(
                &proxy.url("/api/x"),
                &[("x-user", "regular"), ("x-forwarded-for", "192.0.2.77")]
            )
            .await,
            StatusCode::OK
        );
    }
    let response = http1_client()
        .request(
            Request::get(proxy.url("/api/x"))
                .header("x-user", "partner-1")
                .body(body(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"partner\";q=5;w=86400"
    );
    let problem: serde_json::Value = serde_json::from_str(&text(response).await).unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("route `api`"),
        "{problem}"
    );
    // A caller with no user source present falls back to its IP, which is never compared with
    // the user values (127.0.0.1 is listed as a user value above).
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get_status(&proxy.url("/api/x"), &[]).await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn store_errors_are_counted_whatever_the_local_fallback_decides() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .store(
            store::redis(&redis.url())
                .timeout("100ms")
                .on_error("local"),
        )
        .route(
            route("api")
                .prefix("/")
                .limit(limit::fixed_window(1, "24h")),
        );
    let proxy = proxy(yaml).start().await;
    proxy.wait_store().await;
    redis.stop();
    assert_eq!(get_status(&proxy.url("/echo"), &[]).await, StatusCode::OK);
    assert_eq!(
        get_status(&proxy.url("/echo"), &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let text = metrics(proxy.admin.unwrap()).await;
    assert_eq!(store_errors(&text), 2.0, "{text}");
    assert_has(
        &text,
        "tollgate_requests_total{route=\"api\",decision=\"store_error\"} 1",
    );
    assert_has(
        &text,
        "tollgate_requests_total{route=\"api\",decision=\"limited\"} 1",
    );
}
