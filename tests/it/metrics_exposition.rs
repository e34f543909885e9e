//! `/metrics` as Prometheus expects it and as docs/operations.md describes it, scraped from a
//! fresh proxy before any request: every family has `# HELP` and `# TYPE`, names are valid,
//! counters end in `_total`, no family or series twice (`tollgate::metrics::exposition_families`
//! checks what `promtool check metrics` would); every metric the docs' table lists is served
//! and every served one is in the table, with the type the table gives; labels whose values the
//! table lists (`store` (`memory`, `local_first`)) have a series for each value from the start.

use std::collections::BTreeMap;

use crate::support::*;

const OPERATIONS: &str = include_str!("../../docs/operations.md");

/// A row of the docs' metrics table.
#[derive(Debug)]
struct Documented {
    kind: String,
    /// The label values the row lists, as `(label, value)`.
    values: Vec<(String, String)>,
    /// Served only with a section of the configuration (the meaning starts "With …").
    conditional: bool,
}

/// The rows of the table in "## Metrics", by metric name.
fn documented() -> BTreeMap<String, Documented> {
    let section = OPERATIONS
        .split("\n## Metrics\n")
        .nth(1)
        .expect("a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        // `| name | type | labels | meaning |`; the meaning may hold `|` itself.
        let cells: Vec<&str> = line.splitn(5, '|').skip(1).map(str::trim).collect();
        let name = cells[0].trim_matches('`');
        // `store` (`memory`, `local_first`): the label, then its values in parentheses.
        let mut values = Vec::new();
        for part in cells[2].split("), ") {
            if let Some((label, list)) = part.split_once(" (") {
                for value in list.trim_end_matches(')').split(", ") {
                    values.push((
                        label.trim_matches('`').to_owned(),
                        value.trim_matches('`').to_owned(),
                    ));
                }
            }
        }
        rows.insert(
            name.to_owned(),
            Documented {
                kind: cells[1].to_owned(),
                values,
                conditional: cells[3].starts_with("With "),
            },
        );
    }
    assert!(rows.len() >= 30, "only {} rows: {rows:#?}", rows.len());
    rows
}

fn assert_line(exposition: &str, line: &str) {
    assert!(
        exposition.lines().any(|l| l == line),
        "missing `{line}` in\n{exposition}"
    );
}

async fn scrape(proxy: &ProxyHandle) -> String {
    let url = format!("http://{}/metrics", proxy.admin.unwrap());
    let response = http1_client().request(get(&url)).await.unwrap();
    assert_eq!(response.status(), 200);
    text(response).await
}

/// The families of a scrape, after checking it keeps Prometheus' conventions.
fn families(exposition: &str) -> BTreeMap<String, String> {
    tollgate::metrics::exposition_families(exposition)
        .unwrap_or_else(|problems| panic!("{}\n\nin\n{exposition}", problems.join("\n")))
}

/// Checks a fresh proxy's scrape against the docs: what it serves is documented with that
/// type; what the docs list is served (all of it with `everything`, else all but the rows
/// that need a section).
fn check_against_the_docs(exposition: &str, everything: bool) {
    let served = families(exposition);
    let docs = documented();
    for (name, kind) in &served {
        let row = docs
            .get(name)
            .unwrap_or_else(|| panic!("`{name}` is served but not in docs/operations.md"));
        assert_eq!(&row.kind, kind, "`{name}`: the docs say {}", row.kind);
    }
    for (name, row) in &docs {
        if !everything && row.conditional {
            continue;
        }
        assert!(
            served.contains_key(name),
            "`{name}` is in docs/operations.md but a fresh proxy does not serve it:\n{exposition}"
        );
        for (label, value) in &row.values {
            let series = format!("{name}{{{label}=\"{value}\"}} ");
            assert!(
                exposition.lines().any(|l| l.starts_with(&series)),
                "no `{series}` from the start, as the docs say, in\n{exposition}"
            );
        }
    }
}

#[tokio::test]
async fn a_fresh_proxy_serves_every_documented_metric_by_the_conventions() {
    let up = upstream().start().await;
    let proxy = proxy(
        config().upstream(&up.url()).admin("127.0.0.1:0").route(
            route("api")
                .prefix("/api/")
                .limit(limit::fixed_window(5, "1h")),
        ),
    )
    .start()
    .await;
    let exposition = scrape(&proxy).await;
    check_against_the_docs(&exposition, false);
    for line in [
        "tollgate_in_flight_requests 0",
        "tollgate_inflight_requests 0",
        "tollgate_store_keys{store=\"memory\"} 0",
        "tollgate_store_keys{store=\"local_first\"} 0",
        "tollgate_requests_total{route=\"api\",decision=\"allowed\"} 0",
        "# HELP tollgate_inflight_requests Deprecated: the same as tollgate_in_flight_requests, under its old name; removed in the next release.",
        "# TYPE process_cpu_seconds_total counter",
    ] {
        assert_line(&exposition, line);
    }
    // The build: this crate's version and a commit (12 hex digits, or `unknown`).
    let info = exposition
        .lines()
        .find(|l| l.starts_with("tollgate_build_info{"))
        .expect("tollgate_build_info");
    let prefix = format!(
        "tollgate_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    let commit = info
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("\"} 1"))
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{info}"
    );
    // The process family reads this process: it is running, so it started before now and
    // holds open at least the listeners.
    let value = |name: &str| -> f64 {
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{exposition}"))
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value("process_start_time_seconds");
    assert!(
        started <= now && started > now - 3600.0,
        "started {started}, now {now}"
    );
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    // One request moves both names of the in-flight gauge and back.
    let response = http1_client()
        .request(get(&proxy.url("/api/x")))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = text(response).await;
    let after = scrape(&proxy).await;
    for line in [
        "tollgate_requests_total{route=\"api\",decision=\"allowed\"} 1",
        "tollgate_in_flight_requests 0",
        "tollgate_inflight_requests 0",
        "tollgate_store_keys{store=\"memory\"} 1",
    ] {
        assert_line(&after, line);
    }
}

/// With every section that adds families (Redis with local-first limits, `protect`,
/// tracing), the scrape is still by the conventions and serves every documented row.
#[tokio::test]
async fn with_every_section_every_documented_metric_is_served() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = proxy(
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .store(store::redis(&redis.url()))
            .raw("protect: {}\ntracing: { endpoint: http://127.0.0.1:9, protocol: grpc }\n")
            .route(
                route("api")
                    .prefix("/api/")
                    .limit(limit::fixed_window(5, "1h").sync("100ms")),
            ),
    )
    .start()
    .await;
    // The sync histograms are served once a round has run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let exposition = loop {
        let exposition = scrape(&proxy).await;
        if exposition.contains("tollgate_sync_round_seconds_count") {
            break exposition;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sync round in 10 s:\n{exposition}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    check_against_the_docs(&exposition, true);
}
