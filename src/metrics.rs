//! Prometheus metrics for the admin listener's `/metrics`.
//!
//! Each proxy owns its recorder (not the process-global one), so several proxies in one
//! process — tests do that — keep separate numbers. Handles are registered once per route when
//! a configuration is loaded and then only incremented on the request path: no label strings
//! are built per request, and label values are bounded (route names, decisions, status
//! classes; never callers).
//!
//! The exposition follows Prometheus' conventions, which the tests hold it to: every family
//! has `# HELP` (from [`FAMILIES`], described to the recorder at start) and `# TYPE`, counters
//! end in `_total`, and every series a family can have exists from the start (at 0). Beside
//! tollgate's own families it serves `tollgate_build_info{version,commit}` and the standard
//! `process_*` family (CPU, memory, file descriptors, start time: read from the OS at each
//! scrape by `metrics-process`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString,
};
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

/// What kind of series a family is (its `# TYPE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every family tollgate's recorder serves, with its `# HELP` text. A family registered
/// without an entry here would have no HELP line: the tests fail on that. The table in
/// docs/operations.md ("Metrics") says more about each; the tests hold the two to the same
/// names.
pub const FAMILIES: &[(&str, Kind, &str)] = &[
    ("tollgate_build_info", Kind::Gauge, "The version and commit this tollgate was built from (always 1)."),
    ("tollgate_requests_total", Kind::Counter, "Requests, by the route they matched and how the limit stage decided."),
    ("tollgate_limit_check_duration_seconds", Kind::Histogram, "Time from a routed request's arrival until its limit decision: the latency tollgate adds before forwarding."),
    ("tollgate_store_errors_total", Kind::Counter, "Requests whose limit decision met a store error, by the store's cause of failure."),
    ("tollgate_upstream_responses_total", Kind::Counter, "Responses from the upstream by route and status class, tollgate's own 502 and 504 included."),
    ("tollgate_cost_report_invalid_total", Kind::Counter, "cost_from_response limits whose response carried no valid cost report (the configured cost was charged)."),
    ("tollgate_settlement_errors_total", Kind::Counter, "Settlements after the response that the store failed."),
    ("tollgate_credentials_refused_total", Kind::Counter, "Bearer tokens the route's identities refused, by what on_invalid made of them."),
    ("tollgate_upstream_duration_seconds", Kind::Histogram, "Time from sending a request upstream until its response head arrived."),
    ("tollgate_in_flight_requests", Kind::Gauge, "Requests being handled now: between their arrival and the end of their response body (or their client leaving)."),
    (DEPRECATED_INFLIGHT, Kind::Gauge, "Deprecated: the same as tollgate_in_flight_requests, under its old name; removed in the next release."),
    ("tollgate_client_connections", Kind::Gauge, "Client connections open now (plain and TLS)."),
    ("tollgate_client_connections_parked", Kind::Gauge, "Of the client connections, idle plain HTTP/1 ones parked without HTTP buffers."),
    ("tollgate_lingering_closes_total", Kind::Counter, "HTTP/1.1 connections closed with a request body unread, after reading what the client still sent, by how that ended."),
    ("tollgate_store_keys", Kind::Gauge, "Keys held in this process's memory: the memory store's states and the local-first copies."),
    ("tollgate_store_evicted_keys_total", Kind::Counter, "Keys dropped to make room for new ones on a full route."),
    ("tollgate_sync_rounds_total", Kind::Counter, "Local-first sync rounds of this instance, by result."),
    ("tollgate_sync_keys", Kind::Histogram, "Keys per local-first sync round."),
    ("tollgate_sync_round_seconds", Kind::Histogram, "Time of each local-first sync round's Redis calls (per write and read)."),
    ("tollgate_sync_replicas", Kind::Gauge, "Instances alive in the last local-first sync round (R)."),
    ("tollgate_sync_drift_total", Kind::Counter, "Units the local-first reads found in the shared state beyond the limit, by route."),
    ("tollgate_local_first_late_rounds_total", Kind::Counter, "Local-first sync rounds of this instance that were late."),
    ("tollgate_local_first_partial_views_total", Kind::Counter, "Local-first reads made while another live instance's write of the tick was not in Redis yet."),
    ("tollgate_config_reloads_total", Kind::Counter, "Configuration reloads, by result: ok (swapped in) or error (refused)."),
    ("tollgate_protect_limit", Kind::Gauge, "protect: the adaptive concurrency limit now."),
    ("tollgate_protect_in_flight", Kind::Gauge, "protect: requests holding a slot."),
    ("tollgate_protect_waiting", Kind::Gauge, "protect: requests waiting for a slot."),
    ("tollgate_protect_baseline_seconds", Kind::Gauge, "protect: the app's unloaded latency as learned."),
    ("tollgate_protect_latency_seconds", Kind::Gauge, "protect: the last window's median time to response head."),
    ("tollgate_protect_admitted_total", Kind::Counter, "protect: requests given a slot, by priority."),
    ("tollgate_protect_shed_total", Kind::Counter, "protect: requests shed (mode enforce) or that enforce would have shed (mode shadow), by priority."),
    ("tollgate_trace_spans_exported_total", Kind::Counter, "Trace spans the collector accepted."),
    ("tollgate_trace_spans_dropped_total", Kind::Counter, "Trace spans lost, by reason."),
];

/// `tollgate_inflight_requests`, the old name of `tollgate_in_flight_requests` (renamed for
/// one spelling of "in flight" across families, as `tollgate_protect_in_flight` has it): still
/// served, with the same value, for one release so that dashboards and alerts can move.
pub const DEPRECATED_INFLIGHT: &str = "tollgate_inflight_requests";

/// The standard process families (names and HELP as the Prometheus client libraries have
/// them), rendered after the recorder's: a counter in `metrics` holds whole numbers, and CPU
/// seconds need fractions.
pub const PROCESS_FAMILIES: &[(&str, Kind, &str)] = &[
    (
        "process_cpu_seconds_total",
        Kind::Counter,
        "Total user and system CPU time spent in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory size in bytes.",
    ),
    (
        "process_virtual_memory_bytes",
        Kind::Gauge,
        "Virtual memory size in bytes.",
    ),
    (
        "process_open_fds",
        Kind::Gauge,
        "Number of open file descriptors.",
    ),
    (
        "process_max_fds",
        Kind::Gauge,
        "Maximum number of open file descriptors.",
    ),
    (
        "process_start_time_seconds",
        Kind::Gauge,
        "Start time of the process since unix epoch in seconds.",
    ),
    (
        "process_threads",
        Kind::Gauge,
        "Number of OS threads in the process.",
    ),
];

/// The version and commit (`build.rs`) this binary was built from.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = match option_env!("TOLLGATE_COMMIT") {
    Some(commit) => commit,
    // Built without build.rs (a build that copies only the sources).
    None => "unknown",
};

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pub limit_check_duration: Histogram,
    /// Requests the store failed, by cause (`tollgate_store_errors_total{cause}`).
    pub store_errors: StoreErrors,
    pub upstream_duration: Histogram,
    /// `tollgate_in_flight_requests` (and its deprecated old name).
    pub in_flight: InFlight,
    /// Open client connections (plain and TLS).
    pub client_connections: Gauge,
    /// Of those, plain HTTP/1 connections parked: idle, holding no HTTP buffers.
    pub parked_connections: Gauge,
    /// Lingering closes by how they ended, in `linger::LingerEnd::ALL`'s order.
    lingering_closes: [Counter; 5],
    reload_ok: Counter,
    reload_failed: Counter,
    /// The series this process reads back ([`Metrics::requests`], [`Metrics::store_counts`]).
    readable: Readable,
}

/// Series whose values the process reads back (the console's charts and store panel), typed,
/// without rendering: each is counted in an atomic of its own, which its handle increments
/// exactly as it would the recorder's (one atomic add behind the same dynamic call), and is
/// copied into the recorder's series, registered with it, at each rendering.
#[derive(Default)]
struct Readable(Mutex<Vec<(Key, Arc<AtomicU64>, Exported)>>);

/// The recorder's series a readable one is copied into.
enum Exported {
    Counter(Counter),
    /// The readable atomic holds the gauge's `f64` bits.
    Gauge(Gauge),
}

impl Readable {
    /// The atomic of series `key` (the same one again for a key registered before: a reload
    /// that keeps a route keeps its counts), registering the recorder's with `export`.
    fn value(&self, key: Key, export: impl FnOnce(&Key) -> Exported) -> Arc<AtomicU64> {
        let mut series = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, value, _)) = series.iter().find(|(k, ..)| *k == key) {
            return value.clone();
        }
        let exported = export(&key);
        let value = Arc::new(AtomicU64::new(0));
        series.push((key, value.clone(), exported));
        value
    }

    fn counter(&self, recorder: &PrometheusRecorder, key: Key) -> Counter {
        Counter::from_arc(self.value(key, |key| {
            Exported::Counter(recorder.register_counter(key, &METADATA))
        }))
    }

    fn gauge(&self, recorder: &PrometheusRecorder, key: Key) -> Gauge {
        Gauge::from_arc(self.value(key, |key| {
            Exported::Gauge(recorder.register_gauge(key, &METADATA))
        }))
    }

    /// Copies every value into the recorder's series (before a rendering).
    fn export(&self) {
        let series = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (_, value, exported) in series.iter() {
            let value = value.load(Ordering::Acquire);
            match exported {
                Exported::Counter(counter) => counter.absolute(value),
                Exported::Gauge(gauge) => gauge.set(f64::from_bits(value)),
            }
        }
    }

    /// `(labels, value)` of every series of family `name` (a gauge's value as its bits).
    fn family(&self, name: &str) -> Vec<(Vec<Label>, u64)> {
        let series = self.0.lock().unwrap_or_else(|e| e.into_inner());
        series
            .iter()
            .filter(|(key, ..)| key.name() == name)
            .map(|(key, value, _)| {
                (
                    key.labels().cloned().collect(),
                    value.load(Ordering::Acquire),
                )
            })
            .collect()
    }

    /// The value of gauge `name` (a family of one series), 0 before it is registered.
    fn gauge_value(&self, name: &str) -> f64 {
        self.family(name)
            .first()
            .map_or(0.0, |(_, bits)| f64::from_bits(*bits))
    }

    /// The sum of family `name`'s series (those with label `wanted`, if given).
    fn sum(&self, name: &str, wanted: Option<(&str, &str)>) -> u64 {
        self.family(name)
            .into_iter()
            .filter(|(labels, _)| wanted.is_none_or(|w| label_is(labels, w)))
            .map(|(_, value)| value)
            .sum()
    }
}

/// Whether `labels` has label `name` with `value`.
fn label_is(labels: &[Label], (name, value): (&str, &str)) -> bool {
    labels.iter().any(|l| l.key() == name && l.value() == value)
}

/// One route's requests by decision, as counted (`tollgate_requests_total{route}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub allowed: u64,
    pub limited: u64,
    pub shadow_limited: u64,
    pub shed: u64,
    /// What `protect` in shadow mode would have shed (forwarded all the same).
    pub shadow_shed: u64,
    pub store_error: u64,
    pub rejected: u64,
}

/// The store's errors and the local-first rounds, as counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreCounts {
    /// `tollgate_store_errors_total`, every cause.
    pub store_errors: u64,
    pub sync_rounds_ok: u64,
    pub sync_rounds_failed: u64,
    /// `tollgate_sync_drift_total`, every route.
    pub sync_drift: u64,
    /// `tollgate_sync_replicas`.
    pub sync_replicas: f64,
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

/// The in-flight gauge under both its names: they always move together.
pub struct InFlight([Gauge; 2]);

impl InFlight {
    pub fn increment(&self, n: f64) {
        self.0.iter().for_each(|g| g.increment(n));
    }

    pub fn decrement(&self, n: f64) {
        self.0.iter().for_each(|g| g.decrement(n));
    }
}

/// Adds one to a gauge for as long as it is held.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    pub fn new(gauge: &Gauge) -> GaugeGuard {
        gauge.increment(1.0);
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
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
        for &(name, kind, help) in FAMILIES {
            let (name, help) = (KeyName::from_const_str(name), SharedString::const_str(help));
            match kind {
                Kind::Counter => recorder.describe_counter(name, None, help),
                Kind::Gauge => recorder.describe_gauge(name, None, help),
                Kind::Histogram => recorder.describe_histogram(name, None, help),
            }
        }
        recorder
            .register_gauge(
                &Key::from_parts(
                    "tollgate_build_info",
                    vec![Label::new("version", VERSION), Label::new("commit", COMMIT)],
                ),
                &METADATA,
            )
            .set(1.0);
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
        let readable = Readable::default();
        let store_errors = StoreErrors(Cause::ALL.map(|cause| {
            readable.counter(
                &recorder,
                Key::from_parts(
                    "tollgate_store_errors_total",
                    vec![Label::new("cause", cause.as_str())],
                ),
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
        let gauge = |name: &'static str| {
            let gauge = recorder.register_gauge(&Key::from_static_name(name), &METADATA);
            gauge.set(0.0);
            gauge
        };
        let in_flight = InFlight([
            gauge("tollgate_in_flight_requests"),
            gauge(DEPRECATED_INFLIGHT),
        ]);
        let client_connections = gauge("tollgate_client_connections");
        let parked_connections = gauge("tollgate_client_connections_parked");
        let lingering_closes = crate::linger::LingerEnd::ALL.map(|outcome| {
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
            in_flight,
            client_connections,
            parked_connections,
            lingering_closes,
            reload_ok,
            reload_failed,
            readable,
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(upkeep(Arc::downgrade(&metrics)));
        }
        metrics
    }

    /// Counts a lingering close that ended as `outcome`.
    pub fn lingered(&self, outcome: crate::linger::LingerEnd) {
        let at = crate::linger::LingerEnd::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.lingering_closes[at].increment(1);
    }

    /// The handles of one route (registering them is idempotent: a reload that keeps a route
    /// keeps its counts).
    pub fn route(&self, route: &str) -> RouteMetrics {
        let requests = |decision: &'static str| {
            self.readable.counter(
                &self.recorder,
                Key::from_parts(
                    "tollgate_requests_total",
                    vec![
                        Label::new("route", route.to_owned()),
                        Label::new("decision", decision),
                    ],
                ),
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
            self.readable.counter(
                &self.recorder,
                Key::from_parts(
                    "tollgate_sync_rounds_total",
                    vec![Label::new("result", result)],
                ),
            )
        };
        let mut drift = std::collections::HashMap::new();
        for route in &throttle.routes {
            let counter = self.readable.counter(
                &self.recorder,
                Key::from_parts(
                    "tollgate_sync_drift_total",
                    vec![Label::new("route", route.name.clone())],
                ),
            );
            drift.insert(route.limits.key_name.clone(), counter.clone());
            for tier in &route.tiers {
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
            replicas: self.readable.gauge(
                &self.recorder,
                Key::from_static_name("tollgate_sync_replicas"),
            ),
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
            dropped_rate_limited: counter(
                "tollgate_trace_spans_dropped_total",
                vec![Label::new("reason", "rate_limited")],
            ),
        }
    }

    /// `tollgate_store_keys{store}` (keys held in process memory) and
    /// `tollgate_store_evicted_keys_total{store}` (keys dropped to make room for new ones), for
    /// the memory store and the local-first copies: each `(held, evicted)`. A table the running
    /// configuration does not have shows 0 held (both series exist from the start, as the docs
    /// say); its evictions keep the count they had (a counter never goes down).
    pub fn key_tables(&self, memory: Option<(usize, u64)>, local_first: Option<(usize, u64)>) {
        for (store, table) in [("memory", memory), ("local_first", local_first)] {
            let (held, evicted) = table.unwrap_or((0, 0));
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

    /// Per route, its requests by decision as counted now (the console's charts): read, not
    /// rendered.
    pub fn requests(&self) -> BTreeMap<String, RequestCounts> {
        let mut routes: BTreeMap<String, RequestCounts> = BTreeMap::new();
        for (labels, value) in self.readable.family("tollgate_requests_total") {
            let of = |name: &str| labels.iter().find(|l| l.key() == name).map(Label::value);
            let (Some(route), Some(decision)) = (of("route"), of("decision")) else {
                continue;
            };
            let counts = routes.entry(route.to_owned()).or_default();
            let counted = match decision {
                "allowed" => &mut counts.allowed,
                "limited" => &mut counts.limited,
                "shadow_limited" => &mut counts.shadow_limited,
                "shed" => &mut counts.shed,
                "shadow_shed" => &mut counts.shadow_shed,
                "store_error" => &mut counts.store_error,
                "rejected" => &mut counts.rejected,
                _ => continue,
            };
            *counted += value;
        }
        routes
    }

    /// The store's errors and the local-first rounds as counted now (the console's store
    /// panel): read, not rendered.
    pub fn store_counts(&self) -> StoreCounts {
        let readable = &self.readable;
        StoreCounts {
            store_errors: readable.sum("tollgate_store_errors_total", None),
            sync_rounds_ok: readable.sum("tollgate_sync_rounds_total", Some(("result", "ok"))),
            sync_rounds_failed: readable
                .sum("tollgate_sync_rounds_total", Some(("result", "error"))),
            sync_drift: readable.sum("tollgate_sync_drift_total", None),
            sync_replicas: readable.gauge_value("tollgate_sync_replicas"),
        }
    }

    /// The Prometheus text exposition: the recorder's families, then the process's.
    pub fn render(&self) -> String {
        self.readable.export();
        self.handle.run_upkeep();
        let mut text = self.handle.render();
        render_process(&mut text, &metrics_process::collector::collect());
        text
    }
}

/// Appends the `process_*` families (those the OS answered for) to an exposition.
fn render_process(out: &mut String, process: &metrics_process::collector::Metrics) {
    use std::fmt::Write;
    let values = [
        process.cpu_seconds_total,
        process.resident_memory_bytes.map(|v| v as f64),
        process.virtual_memory_bytes.map(|v| v as f64),
        process.open_fds.map(|v| v as f64),
        process.max_fds.map(|v| v as f64),
        process.start_time_seconds.map(|v| v as f64),
        process.threads.map(|v| v as f64),
    ];
    for (&(name, kind, help), value) in PROCESS_FAMILIES.iter().zip(values) {
        let Some(value) = value else { continue };
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
        );
    }
}

/// The families of a text exposition by name with their `# TYPE`, or every way it breaks
/// Prometheus' conventions: a family without `# HELP` or `# TYPE` (or with either twice, or
/// after its samples), a family whose samples are not together (given twice), a name or
/// label name outside `[a-zA-Z_:][a-zA-Z0-9_:]*` (labels: no `:`, no leading `__`), a counter
/// not ending in `_total`, a sample that belongs to no family's name (histograms: `_bucket`
/// with `le`, `_sum`, `_count`), a value that is not a number, or one series twice. What
/// `promtool check metrics` checks, for a suite that cannot count on promtool.
pub fn exposition_families(
    text: &str,
) -> Result<std::collections::BTreeMap<String, String>, Vec<String>> {
    let mut check = ExpositionCheck::default();
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l)) {
        if line.trim().is_empty() {
            continue;
        }
        match line.strip_prefix("# ") {
            Some(comment) => check.comment(n, comment),
            None => check.sample(n, line),
        }
    }
    let ExpositionCheck {
        mut problems,
        types,
        helped,
        ..
    } = check;
    for name in helped.iter().filter(|h| !types.contains_key(*h)) {
        problems.push(format!("`{name}` has # HELP but no # TYPE"));
    }
    match problems.is_empty() {
        true => Ok(types),
        false => Err(problems),
    }
}

/// What [`exposition_families`] has read so far of an exposition, line by line.
#[derive(Default)]
struct ExpositionCheck {
    problems: Vec<String>,
    /// Family name → its `# TYPE`.
    types: std::collections::BTreeMap<String, String>,
    helped: std::collections::BTreeSet<String>,
    /// Families whose samples are over: met again, they are given twice.
    finished: std::collections::BTreeSet<String>,
    series: std::collections::BTreeSet<String>,
    current: Option<String>,
}

/// Whether `name` is a metric name (`colon`) or a label name (no `:`) in Prometheus' syntax.
fn valid_exposition_name(name: &str, colon: bool) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

impl ExpositionCheck {
    /// Moves on to `family`, refusing it when its samples were already closed.
    fn enter(&mut self, family: &str) {
        if self.current.as_deref() != Some(family) {
            if let Some(done) = self.current.take() {
                self.finished.insert(done);
            }
            if self.finished.contains(family) {
                self.problems.push(format!("family `{family}` given twice"));
            }
            self.current = Some(family.to_owned());
        }
    }

    /// A `# HELP` or `# TYPE` line (other comments are no concern) at line `n`.
    fn comment(&mut self, n: usize, comment: &str) {
        let mut words = comment.splitn(3, ' ');
        let (what, name, rest) = (words.next(), words.next(), words.next());
        let (Some(what @ ("HELP" | "TYPE")), Some(name)) = (what, name) else {
            return;
        };
        let problems = &mut self.problems;
        if !valid_exposition_name(name, true) {
            problems.push(format!("line {n}: `{name}` is not a metric name"));
        }
        self.enter(name);
        let problems = &mut self.problems;
        if what == "HELP" {
            if !self.helped.insert(name.to_owned()) {
                problems.push(format!("`{name}` has # HELP twice"));
            }
            if self.types.contains_key(name) {
                problems.push(format!("`{name}`: # HELP after # TYPE"));
            }
            return;
        }
        let kind = rest.unwrap_or("").trim();
        if !matches!(
            kind,
            "counter" | "gauge" | "histogram" | "summary" | "untyped"
        ) {
            problems.push(format!("line {n}: `{name}` has no known # TYPE (`{kind}`)"));
        }
        if self
            .types
            .insert(name.to_owned(), kind.to_owned())
            .is_some()
        {
            problems.push(format!("`{name}` has # TYPE twice"));
        }
        if kind == "counter" && !name.ends_with("_total") {
            problems.push(format!("counter `{name}` does not end in _total"));
        }
    }

    /// A sample line at line `n`.
    fn sample(&mut self, n: usize, line: &str) {
        let problems = &mut self.problems;
        let (name, labels, value) = match line.split_once('{') {
            Some((name, rest)) => match rest.rsplit_once('}') {
                Some((labels, value)) => (name, labels, value),
                None => {
                    problems.push(format!("line {n}: unclosed labels: {line}"));
                    return;
                }
            },
            None => match line.split_once(' ') {
                Some((name, value)) => (name, "", value),
                None => {
                    problems.push(format!("line {n}: no value: {line}"));
                    return;
                }
            },
        };
        if !valid_exposition_name(name, true) {
            problems.push(format!("line {n}: `{name}` is not a metric name"));
        }
        let value = value.trim();
        if !matches!(value, "+Inf" | "-Inf" | "NaN") && value.parse::<f64>().is_err() {
            problems.push(format!("line {n}: `{value}` is not a number"));
        }
        let label_names = label_names(n, labels, problems);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|f| {
                self.types
                    .get(*f)
                    .is_some_and(|k| k == "histogram" || k == "summary")
            })
            .unwrap_or(name);
        self.enter(family);
        let problems = &mut self.problems;
        match self.types.get(family) {
            None => problems.push(format!("line {n}: `{name}` has no # TYPE before it")),
            Some(kind) if kind == "histogram" && name.ends_with("_bucket") => {
                if !label_names.contains(&"le") {
                    problems.push(format!("line {n}: histogram bucket without `le`"));
                }
            }
            Some(_) => {}
        }
        if !self.helped.contains(family) {
            problems.push(format!("line {n}: `{family}` has no # HELP"));
        }
        if !self.series.insert(format!("{name}{{{labels}}}")) {
            problems.push(format!("line {n}: series given twice: {line}"));
        }
    }
}

/// The label names of a sample's `labels` (the text between its braces) at line `n`, each
/// checked, with what breaks the syntax added to `problems`.
fn label_names<'l>(n: usize, labels: &'l str, problems: &mut Vec<String>) -> Vec<&'l str> {
    let mut label_names = Vec::new();
    let mut rest = labels;
    while !rest.is_empty() {
        let Some((label, after)) = rest.split_once("=\"") else {
            problems.push(format!("line {n}: bad labels `{labels}`"));
            break;
        };
        // The value runs to the first quote not escaped by a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            problems.push(format!("line {n}: unclosed label value in `{labels}`"));
            break;
        };
        if !valid_exposition_name(label, false) || label.starts_with("__") {
            problems.push(format!("line {n}: `{label}` is not a label name"));
        }
        label_names.push(label);
        rest = after[end + 1..].trim_start_matches(',');
    }
    label_names
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
            "tollgate_in_flight_requests 0",
            "tollgate_inflight_requests 0",
            "tollgate_limit_check_duration_seconds_bucket{le=\"0.0005\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// Every family the recorder can serve (protect, traces and local-first included) is in
    /// [`FAMILIES`] with the type it is served as, and the exposition keeps the conventions.
    #[test]
    fn every_family_has_help_and_type_and_keeps_the_conventions() {
        let config = crate::config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n",
            |_| None,
        )
        .unwrap();
        let metrics = Metrics::new();
        metrics.route("api");
        let _ = metrics.protect();
        let _ = metrics.traces();
        let sync = metrics.sync(&config.throttle);
        sync.keys.record(3.0);
        sync.round_seconds.record(0.002);
        metrics.key_tables(None, None);
        let text = metrics.render();
        let families = exposition_families(&text).unwrap_or_else(|problems| {
            panic!("{}\n\nin\n{text}", problems.join("\n"));
        });
        let kind_name = |kind: Kind| match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let mut declared: std::collections::BTreeMap<String, String> = FAMILIES
            .iter()
            .chain(PROCESS_FAMILIES)
            .map(|(name, kind, _)| (name.to_string(), kind_name(*kind).to_owned()))
            .collect();
        // Drift is counted per route: a configuration without routes has none.
        declared.remove("tollgate_sync_drift_total");
        assert_eq!(families, declared, "served vs declared, in\n{text}");
        for line in [
            format!("tollgate_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1"),
            "tollgate_store_keys{store=\"local_first\"} 0".into(),
            "tollgate_store_keys{store=\"memory\"} 0".into(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let fds: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .expect("process_open_fds")
            .parse()
            .unwrap();
        assert!(fds >= 3.0, "{fds} open fds");
    }

    /// The checker finds each way an exposition can break the conventions.
    #[test]
    fn the_exposition_checker_refuses_what_breaks_the_conventions() {
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n\n\
                    # HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n";
        assert_eq!(
            exposition_families(good)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            vec![
                ("a_total".to_owned(), "counter".to_owned()),
                ("h".to_owned(), "histogram".to_owned())
            ]
        );
        for (bad, why) in [
            ("# TYPE a_total counter\na_total 1\n", "`a_total` has no # HELP"),
            ("# HELP a A.\na 1\n", "`a` has no # TYPE before it"),
            ("# HELP a A.\n# TYPE a counter\na 1\n", "counter `a` does not end in _total"),
            ("# HELP 1a A.\n# TYPE 1a gauge\n1a 1\n", "`1a` is not a metric name"),
            ("# HELP a A.\n# TYPE a gauge\na{x-y=\"1\"} 1\n", "`x-y` is not a label name"),
            ("# HELP a A.\n# TYPE a gauge\na 1\na 2\n", "series given twice"),
            ("# HELP a A.\n# TYPE a gauge\na one\n", "`one` is not a number"),
            (
                "# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\na{x=\"1\"} 1\n",
                "family `a` given twice",
            ),
            ("# HELP h H.\n# TYPE h histogram\nh_bucket 1\n", "histogram bucket without `le`"),
        ] {
            let problems = exposition_families(bad).expect_err(bad);
            assert!(
                problems.iter().any(|p| p.contains(why)),
                "{bad:?}: {problems:?}, wanted {why:?}"
            );
        }
    }

    #[test]
    fn counts_read_back_are_those_exported_and_kept_over_a_reload() {
        let metrics = Metrics::new();
        metrics.route("api").limited.increment(2);
        // A reload registers the route again: same counts.
        metrics.route("api").limited.increment(1);
        metrics.store_errors.increment(Cause::ALL[0], 4);
        let throttle = crate::config::parse(
            std::path::Path::new("t.yaml"),
            "listen: 127.0.0.1:0\nupstream: { url: \"http://a:1\" }\n",
            |_| None,
        )
        .unwrap()
        .throttle;
        let sync = metrics.sync(&throttle);
        sync.rounds_ok.increment(5);
        sync.replicas.set(3.0);
        assert_eq!(metrics.requests()["api"].limited, 3);
        let counts = metrics.store_counts();
        assert_eq!(
            (
                counts.store_errors,
                counts.sync_rounds_ok,
                counts.sync_replicas
            ),
            (4, 5, 3.0)
        );
        let text = metrics.render();
        for line in [
            "tollgate_requests_total{route=\"api\",decision=\"limited\"} 3",
            "tollgate_sync_rounds_total{result=\"ok\"} 5",
            "tollgate_sync_replicas 3",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
