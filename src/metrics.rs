//! Prometheus metrics for the admin listener's `/metrics`.
//!
//! Each proxy owns its recorder (not the process-global one), so several proxies in one
//! process — tests do that — keep separate numbers. Handles are registered once per route when
//! a configuration is loaded and then only incremented on the request path: no label strings
//! are built per request, and label values are bounded (route names, decisions, status
//! classes; never callers).

use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::limit::Cause;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Seconds; from well under a millisecond (a local decision) to the upstream timeout range.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Keys per local-first round: from one key to the local copies' cap.
const KEY_BUCKETS: &[f64] = &[1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0];

/// The route label of requests that matched no route.
pub const UNROUTED: &str = "(none)";

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pub limit_check_duration: Histogram,
    /// Requests the store failed, by cause (`tollgate_store_errors_total{cause}`).
    pub store_errors: StoreErrors,
    pub upstream_duration: Histogram,
    pub inflight: Gauge,
    /// Open client connections (plain and TLS).
    pub client_connections: Gauge,
    /// Of those, plain HTTP/1 connections parked: idle, holding no HTTP buffers.
    pub parked_connections: Gauge,
    /// Lingering closes by how they ended, in `linger::Outcome::ALL`'s order.
    lingering_closes: [Counter; 5],
    reload_ok: Counter,
    reload_failed: Counter,
}

/// `tollgate_store_errors_total{cause}`: one series per [`Cause`], all registered at start (so
/// each shows 0 until it happens).
pub struct StoreErrors([Counter; Cause::ALL.len()]);

impl StoreErrors {
    /// One more request the store failed for `cause`.
    pub fn increment(&self, cause: Cause, n: u64) {
        self.0[cause.index()].increment(n);
    }
}

/// Adds one to a gauge for as long as it is held.
pub struct Held(Gauge);

impl Held {
    pub fn new(gauge: &Gauge) -> Held {
        gauge.increment(1.0);
        Held(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Per-route handles.
#[derive(Clone)]
pub struct RouteMetrics {
    pub allowed: Counter,
    pub limited: Counter,
    pub shadow_limited: Counter,
    /// Shed by `protect` (the app was overloaded), and what shadow mode would have shed.
    pub shed: Counter,
    pub shadow_shed: Counter,
    pub store_error: Counter,
    /// Refused with 401: a credential refused under `on_invalid: reject`.
    pub rejected: Counter,
    /// Credentials the route's identities refused, by what `on_invalid` made of them.
    pub refusals: crate::identity::caller::RefusalCounters,
    /// `cost_from_response` reports that were missing or malformed (the default cost was
    /// charged instead), and settlements the store failed (see `throttle::settle`).
    pub settlement: crate::throttle::settle::SettleMetrics,
    /// Upstream responses by status class: index 0 = 1xx ... 4 = 5xx.
    status_classes: [Counter; 5],
}

impl RouteMetrics {
    pub fn upstream_response(&self, status: u16) {
        if let Some(counter) = (status / 100)
            .checked_sub(1)
            .and_then(|i| self.status_classes.get(i as usize))
        {
            counter.increment(1);
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let recorder = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full("tollgate_sync_keys".into()), KEY_BUCKETS)
            })
            .expect("static buckets are valid")
            .build_recorder();
        let handle = recorder.handle();
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        let reload_ok = counter(
            "tollgate_config_reloads_total",
            vec![Label::new("result", "ok")],
        );
        let reload_failed = counter(
            "tollgate_config_reloads_total",
            vec![Label::new("result", "error")],
        );
        let store_errors = StoreErrors(Cause::ALL.map(|cause| {
            counter(
                "tollgate_store_errors_total",
                vec![Label::new("cause", cause.as_str())],
            )
        }));
        let limit_check_duration = recorder.register_histogram(
            &Key::from_static_name("tollgate_limit_check_duration_seconds"),
            &METADATA,
        );
        let upstream_duration = recorder.register_histogram(
            &Key::from_static_name("tollgate_upstream_duration_seconds"),
            &METADATA,
        );
        let inflight = recorder.register_gauge(
            &Key::from_static_name("tollgate_inflight_requests"),
            &METADATA,
        );
        inflight.set(0.0);
        let gauge = |name: &'static str| {
            let gauge = recorder.register_gauge(&Key::from_static_name(name), &METADATA);
            gauge.set(0.0);
            gauge
        };
        let client_connections = gauge("tollgate_client_connections");
        let parked_connections = gauge("tollgate_client_connections_parked");
        let lingering_closes = crate::linger::Outcome::ALL.map(|outcome| {
            counter(
                "tollgate_lingering_closes_total",
                vec![Label::new("outcome", outcome.label())],
            )
        });
        let metrics = Arc::new(Metrics {
            recorder,
            handle,
            limit_check_duration,
            store_errors,
            upstream_duration,
            inflight,
            client_connections,
            parked_connections,
            lingering_closes,
            reload_ok,
            reload_failed,
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(upkeep(Arc::downgrade(&metrics)));
        }
        metrics
    }

    /// Counts a lingering close that ended as `outcome`.
    pub fn lingered(&self, outcome: crate::linger::Outcome) {
        let at = crate::linger::Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.lingering_closes[at].increment(1);
    }

    /// The handles of one route (registering them is idempotent: a reload that keeps a route
    /// keeps its counts).
    pub fn route(&self, route: &str) -> RouteMetrics {
        let requests = |decision: &'static str| {
            self.recorder.register_counter(
                &Key::from_parts(
                    "tollgate_requests_total",
                    vec![
                        Label::new("route", route.to_owned()),
                        Label::new("decision", decision),
                    ],
                ),
                &METADATA,
            )
        };
        let refused = |on_invalid: &'static str| {
            self.recorder.register_counter(
                &Key::from_parts(
                    "tollgate_credentials_refused_total",
                    vec![
                        Label::new("route", route.to_owned()),
                        Label::new("on_invalid", on_invalid),
                    ],
                ),
                &METADATA,
            )
        };
        let class = |class: &'static str| {
            self.recorder.register_counter(
                &Key::from_parts(
                    "tollgate_upstream_responses_total",
                    vec![
                        Label::new("route", route.to_owned()),
                        Label::new("status_class", class),
                    ],
                ),
                &METADATA,
            )
        };
        RouteMetrics {
            allowed: requests("allowed"),
            limited: requests("limited"),
            shadow_limited: requests("shadow_limited"),
            shed: requests("shed"),
            shadow_shed: requests("shadow_shed"),
            store_error: requests("store_error"),
            rejected: requests("rejected"),
            refusals: crate::identity::caller::RefusalCounters {
                client_ip: refused("client_ip"),
                reject: refused("reject"),
            },
            settlement: crate::throttle::settle::SettleMetrics {
                cost_report_invalid: self
                    .route_counter("tollgate_cost_report_invalid_total", route),
                failed: self.route_counter("tollgate_settlement_errors_total", route),
            },
            status_classes: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
        }
    }

    /// The handles of local-first rounds (`sync: <duration>`) for the limits of `throttle`:
    /// drift is counted per route (and tier), by the key name the limit stage knows it by,
    /// and shown under the route's name.
    pub fn sync(&self, throttle: &crate::config::Throttle) -> crate::control::sync::SyncMetrics {
        let rounds = |result: &'static str| {
            self.recorder.register_counter(
                &Key::from_parts(
                    "tollgate_sync_rounds_total",
                    vec![Label::new("result", result)],
                ),
                &METADATA,
            )
        };
        let mut drift = std::collections::HashMap::new();
        for route in &throttle.routes {
            let counter = self.route_counter("tollgate_sync_drift_total", &route.name);
            drift.insert(route.limits.key_name.clone(), counter.clone());
            for tier in &route.overrides {
                drift.insert(tier.limits.key_name.clone(), counter.clone());
            }
        }
        crate::control::sync::SyncMetrics {
            rounds_ok: rounds("ok"),
            rounds_error: rounds("error"),
            keys: self
                .recorder
                .register_histogram(&Key::from_static_name("tollgate_sync_keys"), &METADATA),
            round_seconds: self.recorder.register_histogram(
                &Key::from_static_name("tollgate_sync_round_seconds"),
                &METADATA,
            ),
            replicas: self
                .recorder
                .register_gauge(&Key::from_static_name("tollgate_sync_replicas"), &METADATA),
            late_rounds: self.recorder.register_counter(
                &Key::from_static_name("tollgate_local_first_late_rounds_total"),
                &METADATA,
            ),
            partial_views: self.recorder.register_counter(
                &Key::from_static_name("tollgate_local_first_partial_views_total"),
                &METADATA,
            ),
            drift,
        }
    }

    /// The handles `protect` keeps current: its limit, in-flight, waiting, learned baseline
    /// and current latency, and admitted and shed by priority. Registered only with a
    /// `protect` section (and kept from then on).
    pub fn protect(&self) -> crate::protect::ProtectMetrics {
        let gauge = |name: &'static str| {
            self.recorder
                .register_gauge(&Key::from_static_name(name), &METADATA)
        };
        let by_priority = |name: &'static str, mode: Option<&'static str>| {
            crate::config::Priority::ALL.map(|priority| {
                let mut labels = vec![Label::new("priority", priority.as_str())];
                if let Some(mode) = mode {
                    labels.push(Label::new("mode", mode));
                }
                self.recorder
                    .register_counter(&Key::from_parts(name, labels), &METADATA)
            })
        };
        crate::protect::ProtectMetrics {
            limit: gauge("tollgate_protect_limit"),
            in_flight: gauge("tollgate_protect_in_flight"),
            waiting: gauge("tollgate_protect_waiting"),
            baseline_seconds: gauge("tollgate_protect_baseline_seconds"),
            latency_seconds: gauge("tollgate_protect_latency_seconds"),
            admitted: by_priority("tollgate_protect_admitted_total", None),
            shed: by_priority("tollgate_protect_shed_total", Some("enforce")),
            shadow_shed: by_priority("tollgate_protect_shed_total", Some("shadow")),
        }
    }

    /// The handles trace export keeps current (`tollgate_trace_spans_exported_total`,
    /// `tollgate_trace_spans_dropped_total{reason}`). Registered only with traces on.
    pub fn traces(&self) -> crate::traces::TraceMetrics {
        let counter = |name: &'static str, labels: Vec<Label>| {
            self.recorder
                .register_counter(&Key::from_parts(name, labels), &METADATA)
        };
        crate::traces::TraceMetrics {
            exported: counter("tollgate_trace_spans_exported_total", Vec::new()),
            dropped_queue_full: counter(
                "tollgate_trace_spans_dropped_total",
                vec![Label::new("reason", "queue_full")],
            ),
            dropped_export_failed: counter(
                "tollgate_trace_spans_dropped_total",
                vec![Label::new("reason", "export_failed")],
            ),
        }
    }

    /// `tollgate_store_keys{store}` (keys held in process memory) and
    /// `tollgate_store_evicted_keys_total{store}` (keys dropped to make room for new ones), for
    /// the memory store and the local-first copies: each `(held, evicted)`.
    pub fn key_tables(&self, memory: Option<(usize, u64)>, local_first: Option<(usize, u64)>) {
        for (store, table) in [("memory", memory), ("local_first", local_first)] {
            let Some((held, evicted)) = table else {
                continue;
            };
            let labels = || vec![Label::new("store", store)];
            self.recorder
                .register_gauge(&Key::from_parts("tollgate_store_keys", labels()), &METADATA)
                .set(held as f64);
            self.recorder
                .register_counter(
                    &Key::from_parts("tollgate_store_evicted_keys_total", labels()),
                    &METADATA,
                )
                .absolute(evicted);
        }
    }

    /// A counter labelled with the route only.
    fn route_counter(&self, name: &'static str, route: &str) -> Counter {
        self.recorder.register_counter(
            &Key::from_parts(name, vec![Label::new("route", route.to_owned())]),
            &METADATA,
        )
    }

    pub fn reloaded(&self, ok: bool) {
        if ok {
            self.reload_ok.increment(1);
        } else {
            self.reload_failed.increment(1);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        self.handle.render()
    }
}

/// Histogram samples queue up in the recorder until an upkeep folds them into the buckets; the
/// exporter's own installer runs one every few seconds, `render` runs one per scrape. Without
/// this, a proxy nobody scrapes would keep every latency sample of every request in memory
/// (two per request: hundreds of MB an hour under load). Ends with the metrics.
async fn upkeep(metrics: std::sync::Weak<Metrics>) {
    let mut tick = tokio::time::interval(UPKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match metrics.upgrade() {
            Some(metrics) => metrics.handle.run_upkeep(),
            None => return,
        }
    }
}

/// How often queued histogram samples are folded into buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_metrics_with_bounded_labels() {
        let metrics = Metrics::new();
        let api = metrics.route("api");
        api.allowed.increment(2);
        api.limited.increment(1);
        api.upstream_response(204);
        api.upstream_response(503);
        api.upstream_response(999);
        metrics.store_errors.increment(Cause::Refused, 3);
        metrics.limit_check_duration.record(0.0004);
        metrics.reloaded(false);
        // Registering again returns the same series.
        metrics.route("api").allowed.increment(1);
        let text = metrics.render();
        for line in [
            "tollgate_requests_total{route=\"api\",decision=\"allowed\"} 3",
            "tollgate_requests_total{route=\"api\",decision=\"limited\"} 1",
            "tollgate_upstream_responses_total{route=\"api\",status_class=\"2xx\"} 1",
            "tollgate_upstream_responses_total{route=\"api\",status_class=\"5xx\"} 1",
            "tollgate_store_errors_total{cause=\"refused\"} 3",
            "tollgate_store_errors_total{cause=\"auth_failed\"} 0",
            "tollgate_config_reloads_total{result=\"error\"} 1",
            "tollgate_inflight_requests 0",
            "tollgate_limit_check_duration_seconds_bucket{le=\"0.0005\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
