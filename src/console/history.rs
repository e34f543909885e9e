//! The console's charts: every [`SAMPLE_EVERY`] a sampler reads the per-route request counts
//! (what `tollgate_requests_total` exports, read from [`crate::metrics::Metrics::requests`]
//! without rendering) and the store's round-trip time, and keeps the last [`KEPT`] samples, so
//! that a page opened in an incident has the last minutes at once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::metrics::RequestCounts;
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
    /// Refused to protect the app (`shed`).
    pub shed: f64,
    /// What the protection in shadow mode would have shed (forwarded all the same).
    pub shadow_shed: f64,
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
    let routes = proxy
        .metrics()
        .requests()
        .into_iter()
        .map(|(route, counts)| (route, Counts::from(counts)))
        .collect();
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

impl From<RequestCounts> for Counts {
    fn from(c: RequestCounts) -> Counts {
        Counts {
            allowed: (c.allowed + c.shadow_limited) as f64,
            limited: c.limited as f64,
            shed: c.shed as f64,
            shadow_shed: c.shadow_shed as f64,
            store_error: c.store_error as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_route_as_counted() {
        let metrics = crate::metrics::Metrics::new();
        let api = metrics.route("api");
        api.allowed.increment(3);
        api.shadow_limited.increment(2);
        api.limited.increment(7);
        api.shed.increment(1);
        api.shadow_shed.increment(4);
        metrics.route("a\"b").limited.increment(4);
        let counts: BTreeMap<String, Counts> = metrics
            .requests()
            .into_iter()
            .map(|(route, c)| (route, Counts::from(c)))
            .collect();
        assert_eq!(
            counts["api"],
            Counts {
                allowed: 5.0,
                limited: 7.0,
                shed: 1.0,
                shadow_shed: 4.0,
                store_error: 0.0
            }
        );
        assert_eq!(counts["a\"b"].limited, 4.0);
        assert_eq!(counts.len(), 2);
        // What is read is what the exposition shows.
        assert!(metrics
            .render()
            .contains("tollgate_requests_total{route=\"api\",decision=\"shadow_shed\"} 4"));
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
