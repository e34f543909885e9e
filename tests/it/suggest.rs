//! Suggested limits from observed traffic (`GET /limits/suggest`, `tollgate limits suggest`):
//! synthetic traffic of known shape through two replicas on one Redis (each caller on one
//! replica, or spread over both) is reported fleet-wide within the histogram's stated error, and the limit suggested at "refuse at most 1 % of
//! callers", pasted into a configuration (which `tollgate check` accepts) and replayed with the
//! same traffic, refuses the abusers and nobody else.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use serde_json::Value;

/// Normal callers, and the requests caller `i` sends: 1 to 10, a hundred callers each.
const CALLERS: usize = 1_000;
fn requests_of(i: usize) -> usize {
    1 + i % 10
}
/// Abusers, each at 50 times the normal callers' mean of 5.
const ABUSERS: usize = 5;
const ABUSE: usize = 250;

/// The stated bound: a reported percentile is at most 1/16 above the truth, never below.
const ERROR: f64 = 1.0 / 16.0;

/// Every caller: (API key, requests), abusers last.
fn traffic() -> Vec<(String, usize)> {
    let mut callers: Vec<(String, usize)> = (0..CALLERS)
        .map(|i| (format!("k_live_{i:04}"), requests_of(i)))
        .collect();
    callers.extend((0..ABUSERS).map(|j| (format!("k_live_abuser_{j}"), ABUSE)));
    callers
}

/// How a load balancer puts a caller's requests on the two replicas.
#[derive(Clone, Copy)]
enum Balance {
    /// Caller `i` on replica `i % 2`.
    Sticky,
    /// Every caller's requests alternate between the replicas (round robin).
    Spread,
}

/// Sends every caller's requests in one burst, 32 callers at a time, on the replicas as
/// `balance` puts them; returns per caller how many were refused (429).
async fn replay(replicas: [&ProxyHandle; 2], balance: Balance) -> HashMap<String, usize> {
    let callers = traffic();
    let client = http1_client();
    let mut refused = HashMap::new();
    for chunk in callers.chunks(32).enumerate().collect::<Vec<_>>() {
        let (c, chunk) = chunk;
        let mut tasks = Vec::new();
        for (k, (key, n)) in chunk.iter().enumerate() {
            let first = c * 32 + k;
            let addrs = [replicas[0].addr, replicas[1].addr];
            let (client, key, n) = (client.clone(), key.clone(), *n);
            tasks.push(tokio::spawn(async move {
                let mut limited = 0;
                for r in 0..n {
                    let replica = match balance {
                        Balance::Sticky => addrs[first % 2],
                        Balance::Spread => addrs[(first + r) % 2],
                    };
                    let request = Request::get(format!("http://{replica}/api/items"))
                        .header("x-api-key", &key)
                        .body(body(""))
                        .unwrap();
                    let status = client.request(request).await.unwrap().status();
                    match status {
                        StatusCode::OK => {}
                        StatusCode::TOO_MANY_REQUESTS => limited += 1,
                        other => panic!("{key}: {other}"),
                    }
                }
                (key, limited)
            }));
        }
        for task in tasks {
            let (key, limited) = task.await.unwrap();
            refused.insert(key, limited);
        }
    }
    refused
}

/// The true `q` quantile of the callers' peaks (each caller's burst is its peak minute).
fn truth(q: f64) -> f64 {
    let mut peaks: Vec<usize> = traffic().into_iter().map(|(_, n)| n).collect();
    peaks.sort_unstable();
    let rank = ((q * peaks.len() as f64).ceil() as usize).clamp(1, peaks.len());
    peaks[rank - 1] as f64
}

async fn admin_get(proxy: &ProxyHandle, path_and_query: &str) -> (StatusCode, String) {
    let admin = proxy.admin.expect("admin listener");
    let response = http1_client()
        .request(get(&format!("http://{admin}{path_and_query}")))
        .await
        .unwrap();
    let status = response.status();
    (status, text(response).await)
}

/// A configuration on `redis` under `prefix` with the route `api` and `limits` (YAML, the
/// route's `limits:` block as `/limits/suggest` gives it).
fn config_yaml(up: &Upstream, redis: &RedisServer, prefix: &str, limits: &str) -> String {
    let base = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .access_log(false)
        .store(store::redis(&redis.url()).key_prefix(prefix))
        .identity("apikey", [source::header("x-api-key")])
        .yaml();
    let indented: String = limits.lines().map(|l| format!("    {l}\n")).collect();
    format!("{base}routes:\n  - name: api\n    match: {{ path_prefix: /api }}\n{indented}")
}

/// The fleet's report as both replicas merge it, once they agree (returned as `a` merges it).
/// Each replica publishes its record and its callers' counts on its own tick, so right after
/// the traffic one may read a view the other has not finished publishing; once both have,
/// after the last request, the two views must be the same.
async fn merged_alike(a: &ProxyHandle, b: &ProxyHandle, total: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (of_a, of_b) = (merged(a, total).await, merged(b, total).await);
        if of_a["routes"] == of_b["routes"] {
            return of_a;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas' views differ:\n{of_a:#}\n{of_b:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The fleet's report over the last hour as `replica` merges it, once it has `total` requests.
async fn merged(replica: &ProxyHandle, total: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = admin_get(replica, "/limits/suggest?window=1h").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let report: Value = serde_json::from_str(&body).unwrap();
        if report["replicas"] == 2 && report["routes"][0]["requests"] == total {
            return report;
        }
        assert!(Instant::now() < deadline, "never merged: {report:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits out the last minute of a clock hour: the report counts a caller once per clock hour,
/// and this test's truth is one hour's.
async fn away_from_the_hour() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = 3_600 - now % 3_600;
    if left < 90 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_report_callers_rates_and_the_suggestion_refuses_only_the_abusers() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let (a, b) = learn(&up, &redis, Balance::Sticky).await;

    // Both replicas published (every 5 s) after the last request: each one's fleet view has
    // every caller and every request.
    let total: usize = traffic().iter().map(|(_, n)| n).sum();
    let report = merged_alike(&a, &b, total).await;
    assert_eq!(report["scope"], "fleet");
    let api = &report["routes"][0];
    assert_eq!(api["route"], "api");
    assert_eq!(api["key"], "apikey");
    assert_eq!(api["callers"], CALLERS + ABUSERS);
    assert_eq!(api["evicted"], 0);
    assert_eq!(api["refused"]["callers"], 0);
    assert_eq!(api["refused"]["shadow_callers"], 0);
    per_minute_percentiles_are_within_the_error(api);
    // A caller's second can hold no more than its minute.
    assert!(api["per_second"]["max"].as_f64() <= api["per_minute"]["max"].as_f64());
    assert!(api["per_second"]["p50"].as_f64().unwrap() >= 1.0);

    // Nothing of the API keys is kept, here or in Redis.
    let (_, text_report) = admin_get(&a, "/limits/suggest?window=1h&format=text").await;
    assert!(!text_report.contains("k_live"), "{text_report}");
    assert!(!report.to_string().contains("k_live"));
    let mut conn = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("learn:{suggest}*")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The registry, two replicas' records and the route's per-caller hash for this hour.
    assert_eq!(keys.len(), 4, "{keys:?}");
    let callers_key = keys.iter().find(|k| k.contains(".callers.")).unwrap();
    let fields: HashMap<String, String> = ::redis::cmd("HGETALL")
        .arg(callers_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fields["callers"], (CALLERS + ABUSERS).to_string());
    assert!(!format!("{fields:?}").contains("k_live"));
    for key in keys
        .iter()
        .filter(|k| k.contains('.') && !k.contains(".callers."))
    {
        let published: String = ::redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!published.contains("k_live"), "{key}: {published}");
    }

    // The suggestion at 1 %: 10 callers may be refused, so the 5 abusers are and no one else.
    let at_one = api["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["target"] == 0.01 && s["algorithm"] == "sliding_window")
        .expect("a sliding_window suggestion at 1 %");
    assert_eq!(at_one["limit"], 10, "{at_one:#}");
    assert_eq!(at_one["refused_callers"], ABUSERS);
    assert_eq!(
        at_one["sentence"],
        "a sliding_window limit of 10/min would have refused 5 of 1,005 callers (0.50 %), \
         about 17.8 % of requests, in the last hour"
    );
    let yaml = at_one["yaml"].as_str().unwrap();
    assert_eq!(
        yaml,
        "limits:\n  - { algorithm: sliding_window, limit: 10, period: 1m, key: apikey }\n"
    );
    assert!(
        text_report.contains(at_one["sentence"].as_str().unwrap()),
        "{text_report}"
    );
    // At 0.1 % (one caller at most) the abusers fit under the limit.
    let at_tenth = api["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["target"] == 0.001)
        .unwrap();
    assert_eq!(at_tenth["refused_callers"], 0);

    // The command line says the same, from replica b.
    let dir = tempfile::tempdir().unwrap();
    let applied = config_yaml(&up, &redis, "replay:", yaml);
    let file = dir.path().join("applied.yaml");
    std::fs::write(&file, &applied).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["limits", "suggest", "--window", "1h", "--admin"])
        .arg(format!("http://{}", b.admin.unwrap()))
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(
        stdout.contains(at_one["sentence"].as_str().unwrap()),
        "{stdout}"
    );
    assert!(stdout.contains("2 replicas reporting"), "{stdout}");

    // The snippet, pasted as the route's limits, passes `tollgate check` as it is...
    let check = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}\n{applied}",
        String::from_utf8_lossy(&check.stderr)
    );

    // ...and the same traffic through two replicas running it refuses the abusers only.
    refuses_the_abusers_only(applied, Balance::Sticky).await;
}

/// Every caller's requests alternate between the two replicas (a round-robin balancer): the
/// fleet view still counts each caller once at its whole rate (each replica alone sees half),
/// and the suggestion at 1 %, replayed the same way, refuses the abusers and nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_spread_over_two_replicas_count_once_at_their_fleet_wide_rate() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let (a, b) = learn(&up, &redis, Balance::Spread).await;

    let total: usize = traffic().iter().map(|(_, n)| n).sum();
    let report = merged_alike(&a, &b, total).await;
    let api = &report["routes"][0];
    assert_eq!(api["callers"], CALLERS + ABUSERS);
    assert_eq!(api["evicted"], 0);
    per_minute_percentiles_are_within_the_error(api);
    assert!(api["per_second"]["max"].as_f64() <= api["per_minute"]["max"].as_f64());

    // Each replica alone saw every caller at about half its rate.
    let (_, body) = admin_get(&a, "/limits/suggest?window=1h&scope=local").await;
    let local: Value = serde_json::from_str(&body).unwrap();
    let local_api = &local["routes"][0];
    assert_eq!(local["scope"], "local");
    assert_eq!(local_api["callers"], CALLERS + ABUSERS);
    assert!(
        local_api["per_minute"]["max"].as_f64().unwrap() <= (ABUSE / 2 + 1) as f64 * (1.0 + ERROR),
        "{local_api:#}"
    );

    let at_one = api["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["target"] == 0.01 && s["algorithm"] == "sliding_window")
        .expect("a sliding_window suggestion at 1 %");
    assert_eq!(at_one["limit"], 10, "{at_one:#}");
    assert_eq!(at_one["refused_callers"], ABUSERS);

    // Applied and replayed the same way: the abusers are refused, the others are not.
    let applied = config_yaml(&up, &redis, "replay:", at_one["yaml"].as_str().unwrap());
    refuses_the_abusers_only(applied, Balance::Spread).await;
}

/// The route's reported per-minute percentiles lie between the truth and the truth plus the
/// histogram's relative error.
fn per_minute_percentiles_are_within_the_error(api: &Value) {
    for (name, q) in [
        ("p50", 0.5),
        ("p90", 0.9),
        ("p99", 0.99),
        ("p99.9", 0.999),
        ("max", 1.0),
    ] {
        let reported = api["per_minute"][name].as_f64().unwrap();
        let truth = truth(q);
        assert!(
            truth <= reported && reported <= truth * (1.0 + ERROR),
            "{name}: reported {reported}, truth {truth}"
        );
    }
}

/// Learning: two replicas with a shadow limit keyed by API key, which refuses nothing, and
/// the traffic replayed through them balanced as `balance` (away from the hour's turn, so that
/// one hour holds it all).
async fn learn(up: &Upstream, redis: &RedisServer, balance: Balance) -> (ProxyHandle, ProxyHandle) {
    away_from_the_hour().await;
    let learning = config_yaml(
        up,
        redis,
        "learn:",
        "limits:\n  - { algorithm: sliding_window, limit: 100000, period: 1m, key: apikey, shadow: true }\n",
    );
    let (a, b) = (
        proxy(learning.clone()).start().await,
        proxy(learning).start().await,
    );
    a.wait_ready().await;
    b.wait_ready().await;
    let refused = replay([&a, &b], balance).await;
    assert!(
        refused.values().all(|n| *n == 0),
        "the shadow limit refused"
    );
    (a, b)
}

/// Two replicas running `applied`, the traffic replayed through them balanced as `balance`:
/// each abuser is refused all but its first 10, no normal caller is refused.
async fn refuses_the_abusers_only(applied: String, balance: Balance) {
    let (c, d) = (
        proxy(applied.clone()).start().await,
        proxy(applied).start().await,
    );
    c.wait_ready().await;
    d.wait_ready().await;
    let refused = replay([&c, &d], balance).await;
    for j in 0..ABUSERS {
        assert_eq!(
            refused[&format!("k_live_abuser_{j}")],
            ABUSE - 10,
            "abuser {j}"
        );
    }
    let normal_refused: Vec<&String> = refused
        .iter()
        .filter(|(key, n)| !key.contains("abuser") && **n > 0)
        .map(|(key, _)| key)
        .collect();
    assert!(
        normal_refused.is_empty(),
        "normal callers refused: {normal_refused:?}"
    );
}

/// A memory store: each replica has only its own record, and the report says so.
// Two threads: the command line below blocks one while the admin listener answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_reports_this_replica_and_bad_parameters_are_refused() {
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .route(
            route("api")
                .prefix("/")
                .key("user")
                .limit(limit::gcra(600, "1m").burst(50)),
        )
        .yaml();
    let proxy = proxy(yaml.clone()).start().await;
    for user in ["a", "b", "b"] {
        let request = Request::get(proxy.url("/x"))
            .header("x-user", user)
            .body(body(""))
            .unwrap();
        assert_eq!(http1_client().request(request).await.unwrap().status(), 200);
    }
    let (status, body) = admin_get(&proxy, "/limits/suggest").await;
    assert_eq!(status, StatusCode::OK);
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["scope"], "local");
    assert_eq!(
        report["reason"],
        "memory store: each replica records its own callers"
    );
    assert_eq!(report["window"], "24h");
    let api = &report["routes"][0];
    assert_eq!(
        (api["callers"].as_u64(), api["requests"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(api["per_minute"]["max"], 2);
    // The route's algorithm, with a burst of a minute's worth.
    let gcra: Vec<&Value> = api["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["algorithm"] == "gcra")
        .collect();
    assert_eq!(gcra.len(), 2);
    assert_eq!(
        gcra[1]["yaml"],
        "limits:\n  - { algorithm: gcra, limit: 2, period: 1m, burst: 2, key: user }\n"
    );
    for bad in ["window=2h", "format=xml", "scope=all", "k=3"] {
        let (status, body) = admin_get(&proxy, &format!("/limits/suggest?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    // The command line: a bad window is a usage error (exit 2) with the endpoint's reason.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["limits", "suggest", "--window", "2h", "--admin"])
        .arg(format!("http://{}", proxy.admin.unwrap()))
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("window must be `1h` or `24h`"), "{stderr}");
}
