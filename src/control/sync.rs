//! The background rounds of local-first limits (`sync: <duration>`): one task per
//! configuration (carried over a reload that keeps the store and the interval) that, at every tick (a multiple of the interval on the store's clock, the same for
//! every replica), writes each key's usage in one `sync.lua` call (on a Cluster one per hash
//! tag, all at once) with the replica's heartbeat, and 3/4 of an interval later reads every
//! key's shared state, which then holds every replica's write of the tick; the replies go to
//! the engine ([`crate::limit::local_first`]). Requests never wait on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};

use crate::config::Throttle;
use crate::limit::local_first::LocalFirst;
use crate::limit::memory::SystemClock;
use crate::limit::{new_lease_id, Store};
use crate::store::{Shared, Stores};

/// How long a heartbeat counts, in intervals (a replica that stops is forgotten after it).
const HEARTBEAT_INTERVALS: u32 = 3;
/// Added to the heartbeat's life, so a slow round does not drop a live replica.
const HEARTBEAT_SLACK: Duration = Duration::from_millis(500);

/// The handles of the rounds' metrics (registered by `crate::metrics`).
#[derive(Clone)]
pub struct SyncMetrics {
    /// `tollgate_sync_rounds_total{result="ok"}` and `{result="error"}`.
    pub rounds_ok: Counter,
    pub rounds_error: Counter,
    /// `tollgate_sync_keys`: keys per round (write and read).
    pub keys: Histogram,
    /// `tollgate_sync_round_seconds`: the duration of each round's Redis calls.
    pub round_seconds: Histogram,
    /// `tollgate_sync_replicas`: R, as the last heartbeat counted it.
    pub replicas: Gauge,
    /// `tollgate_sync_drift_total{route}`: units admitted beyond the limit, per route (by the
    /// routes' key names, tiers included).
    pub drift: HashMap<String, Counter>,
}

/// The local-first engine (the limit stage decides on a clone of it) and the task that runs
/// its rounds; the task stops when this is dropped (a reload that replaced it).
pub struct Sync {
    pub engine: LocalFirst,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sync {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The interval of the rounds: the smallest `sync` of any limit (None: no local-first limit).
pub fn interval(config: &Throttle) -> Option<Duration> {
    config
        .routes
        .iter()
        .flat_map(|route| {
            std::iter::once(&route.limits).chain(route.overrides.iter().map(|o| &o.limits))
        })
        .flat_map(|set| set.iter())
        .filter_map(|limit| limit.sync)
        .min()
}

/// The rounds for `config` on `stores`: `running` (the rounds of the configuration a reload
/// replaces, given only when `stores` were carried over from it) when the interval is the
/// same, with the usage not sent yet; else new ones when a limit is local-first and the store
/// is Redis.
pub fn carry_or_start(
    config: &Throttle,
    stores: &Stores,
    running: Option<&Arc<Sync>>,
    metrics: SyncMetrics,
) -> Option<Arc<Sync>> {
    let interval = interval(config)?;
    if let Some(kept) = running {
        if kept.engine.interval_us() == interval.as_micros() as i64 {
            return Some(kept.clone());
        }
    }
    let cell = stores.shared_slot()?.clone();
    Some(Arc::new(start(interval, &config.key_prefix, cell, metrics)))
}

/// Starts the rounds on the Redis store `cell` will hold, every `interval`.
fn start(interval: Duration, key_prefix: &str, cell: Shared, metrics: SyncMetrics) -> Sync {
    let engine = LocalFirst::new(Arc::new(SystemClock), interval.as_micros() as i64);
    let replicas_key = format!("{key_prefix}{{replicas}}");
    let task = tokio::spawn(rounds(
        engine.clone(),
        interval,
        replicas_key,
        cell,
        metrics,
    ));
    Sync { engine, task }
}

async fn rounds(
    engine: LocalFirst,
    interval: Duration,
    replicas_key: String,
    cell: Shared,
    metrics: SyncMetrics,
) {
    let id = format!("{:016x}", new_lease_id());
    let heartbeat_us = (interval * HEARTBEAT_INTERVALS + HEARTBEAT_SLACK).as_micros() as i64;
    let interval_us = engine.interval_us();
    let mut failing = false;
    loop {
        // The tick: the next multiple of the interval on the store's clock.
        let now = engine.store_now();
        let wait = interval_us - now.rem_euclid(interval_us);
        tokio::time::sleep(Duration::from_micros(wait as u64)).await;
        let (round, batch) = engine.tick();
        let Some(Store::Redis(redis)) = cell.get().cloned() else {
            continue; // Not connected yet: the views go stale and the limits are divided.
        };
        let started = Instant::now();
        let (heartbeat, write) = tokio::join!(
            redis.heartbeat(&replicas_key, &id, heartbeat_us),
            redis.sync_round(&id, round, &batch, None)
        );
        metrics
            .round_seconds
            .record(started.elapsed().as_secs_f64());
        metrics.keys.record(batch.len() as f64);
        if let Ok(replicas) = heartbeat {
            engine.set_replicas(replicas);
            metrics.replicas.set(replicas as f64);
        }
        let mut error = write.err().map(|e| crate::error::chain(&e).to_string());
        if error.is_none() {
            engine.written(round);
            // The read, three quarters of an interval after the tick: every replica's write is
            // in by then (the bound assumes it), and the view is fresh for the next tick.
            let now = engine.store_now();
            let read_at = now - now.rem_euclid(interval_us) + interval_us * 3 / 4;
            if read_at > now {
                tokio::time::sleep(Duration::from_micros((read_at - now) as u64)).await;
            }
            let reads = engine.read_batch();
            let started = Instant::now();
            match redis.sync_round(&id, 0, &reads, None).await {
                Ok((store_now, states)) => {
                    let latency = started.elapsed();
                    metrics.round_seconds.record(latency.as_secs_f64());
                    metrics.keys.record(reads.len() as f64);
                    engine.read_done(&reads, states, store_now, latency.as_micros() as i64);
                    for (route, units) in engine.take_drift() {
                        if let Some(counter) = metrics.drift.get(&route) {
                            counter.increment(units);
                        }
                    }
                }
                Err(e) => error = Some(crate::error::chain(&e).to_string()),
            }
        }
        if error.is_none() {
            metrics.rounds_ok.increment(1);
        } else {
            metrics.rounds_error.increment(1);
        }
        match error {
            None if failing => {
                failing = false;
                tracing::info!("local-first limits: Redis answers again; shared counting resumed with the usage kept meanwhile");
            }
            Some(cause) if !failing => {
                failing = true;
                tracing::error!(%cause, replicas = engine.replicas(), "local-first limits: sync failed; deciding alone with limit / R once the views are stale, usage kept for the next write");
            }
            _ => {}
        }
    }
}
