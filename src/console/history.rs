//! The console's charts: every [`SAMPLE_EVERY`] a sampler reads the per-route request counters
//! (the same series `/metrics` serves) and the store's round-trip time, and keeps the last
//! [`KEPT`] samples, so that a page opened in an incident has the last minutes at once.
//!
//! The counters are read back from the Prometheus rendering rather than from the handles the
//! request path increments: the handles only count up, and the rendering is what every other
//! reader of the metrics sees. A decision the metrics gain later (`shed`, from the overload
//! protection) appears here by its `decision` label without a change.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::proxy::Proxy;

/// How often the sampler reads the counters.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept: ten minutes.
pub const KEPT: usize = 120;

/// Cumulative counts of one route at one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    /// Forwarded: `allowed` and `shadow_limited` (a shadow limit refuses nothing).
    pub allowed: f64,
    /// Refused by a limit.
    pub limited: f64,
    /// Refused to protect the app (`shed`), when the metrics have that decision.
    pub shed: f64,
    /// Decided with the store failing.
    pub store_error: f64,
}

/// One sample of every route.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Unix time, milliseconds.
    pub at_ms: u64,
    pub routes: BTreeMap<String, Counts>,
    /// The store's `PING` time, when there is a Redis store and it answered.
    pub rtt_ms: Option<f64>,
}

#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<std::collections::VecDeque<Sample>>,
}

impl History {
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().cloned().collect()
    }
}

/// Reads the counters and the store's round trip now.
pub async fn sample(proxy: &Proxy) -> Sample {
    let routes = route_counts(&proxy.metrics().render());
    let rtt_ms = match proxy.throttle_control().ping().await {
        Some(Ok(took)) => Some(took.as_secs_f64() * 1000.0),
        _ => None,
    };
    Sample {
        at_ms: unix_ms(SystemTime::now()),
        routes,
        rtt_ms,
    }
}

pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Samples until `stop`, from now on.
pub async fn run(
    proxy: Proxy,
    history: std::sync::Arc<History>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let sample = sample(&proxy).await;
        history.push(sample);
    }
}

/// Per route, the counts of `tollgate_requests_total` in a Prometheus text rendering.
pub fn route_counts(text: &str) -> BTreeMap<String, Counts> {
    let mut routes: BTreeMap<String, Counts> = BTreeMap::new();
    for (labels, value) in series(text, "tollgate_requests_total") {
        let (Some(route), Some(decision)) = (label(labels, "route"), label(labels, "decision"))
        else {
            continue;
        };
        let counts = routes.entry(route).or_default();
        match decision.as_str() {
            "allowed" | "shadow_limited" => counts.allowed += value,
            "limited" => counts.limited += value,
            "shed" => counts.shed += value,
            "store_error" => counts.store_error += value,
            _ => {}
        }
    }
    routes
}

/// `(labels, value)` of every sample line of metric `name` (`name{labels} value`).
pub fn series<'t>(text: &'t str, name: &'t str) -> impl Iterator<Item = (&'t str, f64)> + 't {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => {
                let end = rest.rfind('}')?;
                (&rest[..end], rest[end + 1..].trim())
            }
            None if rest.starts_with(' ') => ("", rest.trim()),
            None => return None,
        };
        let value = value.split_whitespace().next()?.parse().ok()?;
        Some((labels, value))
    })
}

/// The value of label `name` in `a="x",b="y"` (with the exposition format's escapes).
pub fn label(labels: &str, name: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end?;
        if key.trim_start_matches(',').trim() == name {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_route_from_the_rendering() {
        let text = "\
# TYPE tollgate_requests_total counter
tollgate_requests_total{route=\"api\",decision=\"allowed\"} 3
tollgate_requests_total{route=\"api\",decision=\"shadow_limited\"} 2
tollgate_requests_total{route=\"api\",decision=\"limited\"} 7
tollgate_requests_total{route=\"api\",decision=\"shed\"} 1
tollgate_requests_total{route=\"a\\\"b\",decision=\"limited\"} 4
tollgate_requests_total_other{route=\"api\",decision=\"limited\"} 100
tollgate_store_errors_total 3
";
        let counts = route_counts(text);
        assert_eq!(
            counts["api"],
            Counts {
                allowed: 5.0,
                limited: 7.0,
                shed: 1.0,
                store_error: 0.0
            }
        );
        assert_eq!(counts["a\"b"].limited, 4.0);
        assert_eq!(counts.len(), 2);
        assert_eq!(
            series(text, "tollgate_store_errors_total").collect::<Vec<_>>(),
            vec![("", 3.0)]
        );
    }

    #[test]
    fn history_keeps_the_last_ten_minutes() {
        let history = History::default();
        for at_ms in 0..(KEPT as u64 + 5) {
            history.push(Sample {
                at_ms,
                routes: BTreeMap::new(),
                rtt_ms: None,
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), KEPT);
        assert_eq!(samples[0].at_ms, 5);
    }
}
