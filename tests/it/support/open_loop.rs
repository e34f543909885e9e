//! An open-loop HTTP/1.1 load client for the overload tests and the overload benchmark: it sends
//! requests at a fixed rate, each at its scheduled time whatever the earlier ones are doing (as
//! wrk2 or `oha -q` do), so a slow server faces the load real independent clients would give it
//! instead of slowing the client down.
//!
//! Every request has a client timeout (default 1 s) counted from its scheduled time, and
//! latency is measured from the scheduled time too, so a client that falls behind its schedule
//! does not hide the delay (no coordinated omission). The rate may change in steps (a schedule of
//! phases). Requests are spread over classes by share (say 20 % with `X-Priority: high`),
//! deterministically: the class that is furthest behind its share goes next.
//!
//! The [`Report`] keeps one record per request, so a test can ask for any class and time window:
//! sent, 2xx (goodput: a 2xx is always within the timeout, a later answer is a timeout), shed
//! (`503`, which the capacity app never sends, so the front shed it), other statuses, timeouts,
//! transport failures, and latency percentiles of the successes; and a series of buckets
//! (250 ms by default) by scheduled time, to assert things like "goodput back within 2 s".
//!
//! The client runs on a thread and runtime of its own, so a busy test runtime does not distort
//! its schedule. `examples/open_loop.rs` wraps this same file (`#[path]`) for `bench/overload.sh`.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// A load to run: `OpenLoop::new(url).rate(1200.0, 5s).then(200.0, 5s).class(...).run().await`.
#[derive(Clone, Debug)]
pub struct OpenLoop {
    base: String,
    path: String,
    phases: Vec<Phase>,
    timeout: Duration,
    classes: Vec<RequestClass>,
    bucket: Duration,
}

/// One step of the schedule: requests per second for a duration.
#[derive(Clone, Debug)]
pub struct Phase {
    pub rate: f64,
    pub duration: Duration,
}

/// A class of requests: its share of the traffic and the headers it sends.
#[derive(Clone, Debug)]
pub struct RequestClass {
    pub name: String,
    pub share: f64,
    pub headers: Vec<(String, String)>,
}

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx, body read in full, within the timeout.
    Success,
    /// `503`.
    Shed,
    /// Any other status.
    Other(u16),
    /// No full answer within the timeout.
    Timeout,
    /// Connect or protocol failure before the timeout.
    Failed,
}

/// One request: its class, scheduled time (from the start), how late the client actually sent
/// it, what came back and when (from the scheduled time).
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub class: usize,
    pub scheduled: Duration,
    pub send_lag: Duration,
    pub outcome: Outcome,
    pub latency: Duration,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Report {
    pub classes: Vec<String>,
    pub phases: Vec<Phase>,
    pub bucket: Duration,
    pub timeout: Duration,
    /// Sorted by scheduled time.
    pub records: Vec<Record>,
}

/// Counts and latencies of a set of requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub sent: usize,
    pub ok: usize,
    pub shed: usize,
    pub other: usize,
    pub timeouts: usize,
    pub failed: usize,
    /// Latency percentiles of the successes (zero without any).
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// 99th percentile of how long a shed answer took.
    pub shed_p99: Duration,
    /// How many of `other` had each status.
    pub other_statuses: std::collections::BTreeMap<u16, usize>,
    /// Successes per second of the window.
    pub goodput: f64,
    /// The window's length.
    pub span: Duration,
}

impl OpenLoop {
    /// A load against `base` (`http://host:port`), path `/`, no phases yet, timeout 1 s, one
    /// class `all` with no extra headers, buckets of 250 ms.
    pub fn new(base: impl Into<String>) -> OpenLoop {
        OpenLoop {
            base: base.into().trim_end_matches('/').to_string(),
            path: "/".into(),
            phases: Vec::new(),
            timeout: Duration::from_secs(1),
            classes: Vec::new(),
            bucket: Duration::from_millis(250),
        }
    }

    /// Appends a phase: `rate` requests per second for `duration`.
    pub fn rate(mut self, rate: f64, duration: Duration) -> Self {
        assert!(rate > 0.0, "the rate must be positive");
        self.phases.push(Phase { rate, duration });
        self
    }

    /// The same as [`OpenLoop::rate`], reads better after the first phase.
    pub fn then(self, rate: f64, duration: Duration) -> Self {
        self.rate(rate, duration)
    }

    #[allow(dead_code, reason = "examples/open_loop.rs uses it; no test does")]
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    #[allow(dead_code, reason = "examples/open_loop.rs uses it; no test does")]
    pub fn bucket(mut self, bucket: Duration) -> Self {
        self.bucket = bucket;
        self
    }

    /// Adds a class with its share (shares are relative: 1 and 4 make 20 % and 80 %) and the
    /// headers its requests carry.
    pub fn class(mut self, name: &str, share: f64, headers: &[(&str, &str)]) -> Self {
        assert!(share > 0.0, "a class's share must be positive");
        self.classes.push(RequestClass {
            name: name.into(),
            share,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        });
        self
    }

    /// The whole schedule's length.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Runs the load on a thread of its own and returns when every request has ended.
    pub async fn run(self) -> Report {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("open-loop".into())
            .spawn(move || {
                let _ = tx.send(self.run_blocking());
            })
            .unwrap();
        rx.await.expect("the open-loop client panicked")
    }

    /// Runs the load on the calling thread (outside any Tokio runtime).
    pub fn run_blocking(mut self) -> Report {
        assert!(!self.phases.is_empty(), "an open loop needs a rate");
        if self.classes.is_empty() {
            self = self.class("all", 1.0, &[]);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(self.drive())
    }

    /// The scheduled times (from the start) of every request, with its class.
    fn schedule(&self) -> Vec<(Duration, usize)> {
        let total_share: f64 = self.classes.iter().map(|c| c.share).sum();
        let mut given = vec![0u64; self.classes.len()];
        let mut schedule = Vec::new();
        let mut phase_start = Duration::ZERO;
        for phase in &self.phases {
            let interval = 1.0 / phase.rate;
            let mut k = 0u64;
            loop {
                let offset = Duration::from_secs_f64(k as f64 * interval);
                if offset >= phase.duration {
                    break;
                }
                let n = schedule.len() as f64 + 1.0;
                // The class furthest behind its share of the requests so far goes next.
                let class = (0..self.classes.len())
                    .max_by(|&a, &b| {
                        let behind =
                            |c: usize| n * self.classes[c].share / total_share - given[c] as f64;
                        behind(a).total_cmp(&behind(b)).then(b.cmp(&a))
                    })
                    .unwrap();
                given[class] += 1;
                schedule.push((phase_start + offset, class));
                k += 1;
            }
            phase_start += phase.duration;
        }
        schedule
    }

    async fn drive(self) -> Report {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let uri: http::Uri = format!("{}{}", self.base, self.path)
            .parse()
            .expect("a valid URL");
        let schedule = self.schedule();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Record>();
        // A little headroom so the first request is not already late.
        let start = Instant::now() + Duration::from_millis(20);
        for (offset, class) in schedule {
            let scheduled = start + offset;
            tokio::time::sleep_until(scheduled).await;
            let send_lag = Instant::now().saturating_duration_since(scheduled);
            let mut request = Request::get(uri.clone());
            for (name, value) in &self.classes[class].headers {
                request = request.header(name, value);
            }
            let request = request.body(Empty::new()).unwrap();
            let client = client.clone();
            let done = done_tx.clone();
            let deadline = scheduled + self.timeout;
            tokio::spawn(async move {
                let exchange = async {
                    let response = client.request(request).await?;
                    let status = response.status();
                    response.into_body().collect().await?;
                    Ok::<StatusCode, Box<dyn std::error::Error + Send + Sync>>(status)
                };
                let outcome = match tokio::time::timeout_at(deadline, exchange).await {
                    Err(_) => Outcome::Timeout,
                    Ok(Err(_)) => Outcome::Failed,
                    Ok(Ok(status)) if status.is_success() => Outcome::Success,
                    Ok(Ok(StatusCode::SERVICE_UNAVAILABLE)) => Outcome::Shed,
                    Ok(Ok(status)) => Outcome::Other(status.as_u16()),
                };
                let _ = done.send(Record {
                    class,
                    scheduled: offset,
                    send_lag,
                    outcome,
                    latency: Instant::now().saturating_duration_since(scheduled),
                });
            });
        }
        drop(done_tx);
        let mut records = Vec::new();
        while let Some(record) = done_rx.recv().await {
            records.push(record);
        }
        records.sort_by_key(|r| r.scheduled);
        Report {
            classes: self.classes.iter().map(|c| c.name.clone()).collect(),
            phases: self.phases,
            bucket: self.bucket,
            timeout: self.timeout,
            records,
        }
    }
}

impl Report {
    fn class_index(&self, class: &str) -> usize {
        self.classes
            .iter()
            .position(|c| c == class)
            .unwrap_or_else(|| panic!("no class {class:?} in {:?}", self.classes))
    }

    /// Every class, the whole run.
    pub fn total(&self) -> Summary {
        self.window(None, Duration::ZERO, self.duration())
    }

    /// One class (`None`: all), requests scheduled in `[from, to)`.
    pub fn window(&self, class: Option<&str>, from: Duration, to: Duration) -> Summary {
        let class = class.map(|c| self.class_index(c));
        summarize(
            self.records
                .iter()
                .filter(|r| class.is_none_or(|c| r.class == c))
                .filter(|r| r.scheduled >= from && r.scheduled < to),
            to.saturating_sub(from),
        )
    }

    /// One class (`None`: all), the whole run.
    pub fn class(&self, class: Option<&str>) -> Summary {
        self.window(class, Duration::ZERO, self.duration())
    }

    /// One class (`None`: all) during phase `index` of the schedule, leaving out its first
    /// `settle` (the front's time to adapt to the new load).
    pub fn phase(&self, class: Option<&str>, index: usize, settle: Duration) -> Summary {
        let from: Duration = self.phases[..index].iter().map(|p| p.duration).sum();
        let to = from + self.phases[index].duration;
        self.window(class, (from + settle).min(to), to)
    }

    /// One class (`None`: all) per bucket of scheduled time, from the start.
    pub fn series(&self, class: Option<&str>) -> Vec<Summary> {
        let buckets = self.duration().as_nanos().div_ceil(self.bucket.as_nanos()) as u32;
        (0..buckets)
            .map(|i| self.window(class, self.bucket * i, self.bucket * (i + 1)))
            .collect()
    }

    /// The first time from `after` on where every bucket meets `good` for `hold` in a row: when
    /// goodput came back. `None` if it never did.
    pub fn recovered_at(
        &self,
        class: Option<&str>,
        after: Duration,
        hold: Duration,
        good: impl Fn(&Summary) -> bool,
    ) -> Option<Duration> {
        let needed = (hold.as_nanos().div_ceil(self.bucket.as_nanos()) as usize).max(1);
        let series = self.series(class);
        let first = (after.as_nanos() / self.bucket.as_nanos()) as usize;
        let mut run = 0;
        for (i, bucket) in series.iter().enumerate().skip(first) {
            run = if good(bucket) { run + 1 } else { 0 };
            if run == needed {
                return Some(self.bucket * (i + 1 - needed) as u32);
            }
        }
        None
    }

    /// The schedule's length.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// The most any request was sent after its scheduled time, and the 99th percentile.
    pub fn send_lag(&self) -> (Duration, Duration) {
        let mut lags: Vec<Duration> = self.records.iter().map(|r| r.send_lag).collect();
        lags.sort();
        (
            lags.last().copied().unwrap_or_default(),
            percentile(&lags, 0.99),
        )
    }

    /// The report as JSON: per phase and class (`all` for every class) a summary of the whole
    /// phase (`classes`) and of the phase without its first `settle` (`settled`), and the
    /// series of buckets, of every class together and per class.
    #[allow(dead_code, reason = "examples/open_loop.rs uses it; no test does")]
    pub fn to_json(&self, settle: Duration) -> serde_json::Value {
        let per_class = |index: usize, settle: Duration| {
            let mut classes = serde_json::Map::new();
            classes.insert("all".into(), self.phase(None, index, settle).to_json());
            if self.classes.len() > 1 {
                for class in &self.classes {
                    classes.insert(
                        class.clone(),
                        self.phase(Some(class), index, settle).to_json(),
                    );
                }
            }
            classes
        };
        let mut phases = Vec::new();
        for (index, phase) in self.phases.iter().enumerate() {
            phases.push(serde_json::json!({
                "rate": phase.rate,
                "seconds": phase.duration.as_secs_f64(),
                "settle_seconds": settle.as_secs_f64(),
                "classes": per_class(index, Duration::ZERO),
                "settled": per_class(index, settle),
            }));
        }
        let mut class_series = serde_json::Map::new();
        if self.classes.len() > 1 {
            for class in &self.classes {
                let series = self.series(Some(class));
                class_series.insert(class.clone(), series.iter().map(Summary::to_json).collect());
            }
        }
        let (lag_max, lag_p99) = self.send_lag();
        serde_json::json!({
            "timeout_ms": ms(self.timeout),
            "bucket_ms": ms(self.bucket),
            "send_lag_ms": { "max": ms(lag_max), "p99": ms(lag_p99) },
            "total": self.total().to_json(),
            "phases": phases,
            "series": self.series(None).iter().map(Summary::to_json).collect::<Vec<_>>(),
            "class_series": class_series,
        })
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn summarize<'a>(records: impl Iterator<Item = &'a Record>, span: Duration) -> Summary {
    let mut summary = Summary {
        span,
        ..Summary::default()
    };
    let mut latencies = Vec::new();
    let mut shed_latencies = Vec::new();
    for record in records {
        summary.sent += 1;
        match record.outcome {
            Outcome::Success => {
                summary.ok += 1;
                latencies.push(record.latency);
            }
            Outcome::Shed => {
                summary.shed += 1;
                shed_latencies.push(record.latency);
            }
            Outcome::Other(status) => {
                summary.other += 1;
                *summary.other_statuses.entry(status).or_default() += 1;
            }
            Outcome::Timeout => summary.timeouts += 1,
            Outcome::Failed => summary.failed += 1,
        }
    }
    latencies.sort();
    shed_latencies.sort();
    summary.p50 = percentile(&latencies, 0.50);
    summary.p90 = percentile(&latencies, 0.90);
    summary.p99 = percentile(&latencies, 0.99);
    summary.max = latencies.last().copied().unwrap_or_default();
    summary.shed_p99 = percentile(&shed_latencies, 0.99);
    if !span.is_zero() {
        summary.goodput = summary.ok as f64 / span.as_secs_f64();
    }
    summary
}

impl Summary {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sent": self.sent, "ok": self.ok, "shed": self.shed, "other": self.other,
            "timeouts": self.timeouts, "failed": self.failed,
            "other_statuses": self.other_statuses.iter()
                .map(|(status, n)| (status.to_string(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "goodput_per_s": (self.goodput * 10.0).round() / 10.0,
            "p50_ms": ms(self.p50), "p90_ms": ms(self.p90), "p99_ms": ms(self.p99),
            "max_ms": ms(self.max), "shed_p99_ms": ms(self.shed_p99),
        })
    }
}
