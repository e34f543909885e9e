//! The Grafana dashboard (deploy/grafana/tollgate.json) queries only metrics that tollgate
//! serves: every metric name in every panel's PromQL (and in the template variables' queries)
//! must be a series a running proxy's `/metrics` shows after some traffic. A renamed metric,
//! or a typo in a panel, fails here instead of leaving an empty panel in production.

use std::collections::BTreeSet;

use crate::support::*;

const DASHBOARD: &str = include_str!("../../deploy/grafana/tollgate.json");

/// PromQL words that are not metric names: aggregation operators (which may be followed by
/// `by (...)` rather than by their parenthesis), modifiers, operators and constants.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: its identifiers outside label matchers
/// (`{...}`), ranges (`[...]`) and strings, that are neither functions (followed by `(`),
/// keywords, nor numbers; the label lists of `by`/`without`/`on`/`ignoring` are skipped.
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let skip_to = |from: usize, close: char| {
        let mut j = from;
        while j < chars.len() && chars[j] != close {
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '"' => i = skip_to(i + 1, '"'),
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let call = chars.get(next) == Some(&'(');
                if matches!(word.as_str(), "by" | "without" | "on" | "ignoring") && call {
                    i = skip_to(next, ')');
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_metric_name_extractor_reads_promql() {
    assert_eq!(
        metric_names(
            r#"sum by (route, decision) (rate(tollgate_requests_total{route=~"$route", decision="limited"}[$__rate_interval])) / on (route) group_left sum without (le) (x_total offset 5m) > 0.5"#
        ),
        vec!["tollgate_requests_total", "x_total"]
    );
    assert_eq!(
        metric_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))"),
        vec!["a_bucket"]
    );
}

/// Every series name `/metrics` serves (histograms as their `_bucket`, `_sum` and `_count`).
fn served(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_served() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("valid JSON");

    // Importable anywhere: the Prometheus data source is a variable, used by every panel.
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus data source variable"
    );

    // (where, expression) of every query.
    let mut queries: Vec<(String, String)> = Vec::new();
    for v in variables.iter().filter(|v| v["type"] == "query") {
        let query = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        // label_values(metric, label): the metric is the first argument.
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.split(',').next())
            .unwrap_or(query);
        queries.push((format!("variable {}", v["name"]), inner.to_string()));
    }
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = panel["title"].as_str().unwrap();
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?} does not use the data source variable"
        );
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title:?} queries nothing");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            queries.push((format!("panel {title:?}"), expr.to_string()));
        }
    }
    assert!(panels >= 10, "only {panels} panels");

    // A proxy after some traffic: allowed, limited and shadow-limited requests, upstream
    // responses, so every series (histograms included) has been touched; with `protect`, whose
    // series exist only with its section.
    let up = upstream().start().await;
    let routes = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .raw("protect: {}\n")
        .route(
            route("api")
                .prefix("/api/")
                .limit(limit::fixed_window(1, "24h")),
        )
        .route(
            route("trial")
                .prefix("/trial")
                .limit(limit::fixed_window(1, "24h").shadow()),
        );
    let proxy = proxy(routes).start().await;
    for path in ["/api/x", "/api/x", "/trial", "/trial", "/echo"] {
        let response = http1_client().request(get(&proxy.url(path))).await.unwrap();
        let _ = text(response).await;
    }
    let url = format!("http://{}/metrics", proxy.admin.unwrap());
    let exposition = text(http1_client().request(get(&url)).await.unwrap()).await;
    let served = served(&exposition);

    let mut queried = BTreeSet::new();
    for (place, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{place} queries no metric: {expr}");
        for name in names {
            assert!(
                served.contains(&name),
                "{place} queries `{name}`, which /metrics does not serve; served:\n{served:#?}"
            );
            queried.insert(name);
        }
    }
    // And the dashboard leaves out none of tollgate's metrics, but for deprecated ones (their
    // `# HELP` says so): kept for dashboards that have not moved, this one has.
    let deprecated: BTreeSet<&str> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP ")?.split_once(" Deprecated"))
        .map(|(name, _)| name)
        .collect();
    for name in &deprecated {
        assert!(
            !queried.contains(*name),
            "the dashboard queries `{name}`, which is deprecated"
        );
    }
    let families: BTreeSet<&str> = served
        .iter()
        .map(|s| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| s.strip_suffix(suffix))
                .unwrap_or(s)
        })
        .filter(|family| !deprecated.contains(family))
        .collect();
    for family in families {
        assert!(
            queried.iter().any(|q| q.starts_with(family)),
            "no panel shows `{family}`"
        );
    }
}
