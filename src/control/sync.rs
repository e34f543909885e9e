//! The background rounds of local-first limits (`sync: <duration>`): one task per
//! configuration (carried over a reload that keeps the store and the interval) that, at every
//! tick (a multiple of the interval on the store's clock, the same for every replica), writes
//! each key's usage in one `sync.lua` call (on a Cluster one per hash tag, all at once), then
//! renews the replica's heartbeat with the tick its write reached; 3/4 of an interval later it
//! asks the heartbeat whether every live replica's write of the tick is in, and reads every
//! key's shared state: a complete view when they all are, a partial one when a replica's round
//! is late (the engine then keeps counting what the others may have spent unseen). The replies
//! go to the engine ([`crate::limit::local_first`]). Requests never wait on it. Late rounds are
//! counted (`tollgate_local_first_late_rounds_total`).
//!
//! A round is bounded whatever the number of keys: writes and reads go in calls of
//! [`BATCH_KEYS`] keys each (each call within the store's timeout), at most [`ROUND_KEYS`] keys
//! written and read, and no more calls once a quarter of the interval is spent; the rest waits
//! for the next round (the engine keeps it, oldest first).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};

use crate::config::Throttle;
use crate::limit::clock::SystemClock;
use crate::limit::local_first::{
    LocalFirst, SyncItem, BATCH_KEYS, ROUND_KEYS, STALE_AFTER_INTERVALS,
};
use crate::limit::{new_lease_id, Store};
use crate::store::{Shared, Stores};

/// How long a heartbeat counts, in intervals (a replica that stops is forgotten after it).
/// A replica stalled on a busy node must not be forgotten while it still spends: the others
/// would divide by fewer than R and take its late writes for complete views. Forgetting a
/// replica that left late only costs shares (the others divide by one more for a while).
const HEARTBEAT_INTERVALS: u32 = 10;
/// Added to the heartbeat's life, so a slow round does not drop a live replica.
const HEARTBEAT_SLACK: Duration = Duration::from_secs(2);

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
    /// `tollgate_local_first_late_rounds_total`: rounds of this replica that were late (write
    /// acknowledged after the others read, or completed more than [`STALE_AFTER_INTERVALS`]
    /// after the previous one, so the engine decided alone meanwhile).
    pub late_rounds: Counter,
    /// `tollgate_local_first_partial_views_total`: reads made while a live replica's write of
    /// the tick was not in yet (its round late), applied without trusting them as complete.
    pub partial_views: Counter,
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
            std::iter::once(&route.limits).chain(route.tiers.iter().map(|o| &o.limits))
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
    // The tick of this replica's last write acknowledged in full (none yet).
    let mut written: i64 = -1;
    // When the last round completed (store clock).
    let mut last_done = engine.store_now();
    let mut seen = Seen::default();
    loop {
        // The tick: the next multiple of the interval on the store's clock.
        let now = engine.store_now();
        let wait = interval_us - now.rem_euclid(interval_us);
        tokio::time::sleep(Duration::from_micros(wait as u64)).await;
        let woke = engine.store_now();
        let tick = woke - woke.rem_euclid(interval_us);
        let mut late = false;
        let (round, batch) = engine.tick();
        let Some(Store::Redis(redis)) = cell.get().cloned() else {
            continue; // Not connected yet: the views go stale and the limits are divided.
        };
        let mut error = match write(
            &engine,
            &redis,
            &id,
            round,
            batch,
            tick,
            interval / 4,
            &metrics,
        )
        .await
        {
            // Usage past the round's bounds waits for the next (oldest first); the tick is
            // recorded anyway, or a key flood would make every view partial, but not past
            // usage taken alone (see `write`).
            Ok(record) => {
                if record {
                    written = tick;
                    engine.wrote(tick);
                }
                None
            }
            Err(cause) => Some(cause),
        };
        // After the write: the tick recorded is in the shared states.
        if let Ok((replicas, _)) = redis
            .heartbeat(&replicas_key, &id, heartbeat_us, written)
            .await
        {
            seen.update(&engine, replicas, heartbeat_us, &metrics);
        }
        if error.is_none() {
            let read_at = tick + interval_us * 3 / 4;
            let now = engine.store_now();
            // Acknowledged after the others read: their views miss this write.
            late |= now > read_at;
            if read_at > now {
                tokio::time::sleep(Duration::from_micros((read_at - now) as u64)).await;
            }
            error = read_round(
                &mut seen,
                &engine,
                &redis,
                &id,
                &replicas_key,
                heartbeat_us,
                written,
                tick,
                &metrics,
            )
            .await;
        }
        // The engine went late before this round completed: decisions were taken alone.
        late |= engine.store_now() - last_done > STALE_AFTER_INTERVALS * interval_us;
        if error.is_none() {
            last_done = engine.store_now();
        }
        failing = round_done(&engine, &metrics, error, late, failing);
    }
}

/// Counts a round that ended with `error` (None: in full), and says when the rounds start or
/// stop failing (`failing`: whether the last one failed). Returns whether this one failed.
fn round_done(
    engine: &LocalFirst,
    metrics: &SyncMetrics,
    error: Option<String>,
    late: bool,
    failing: bool,
) -> bool {
    if late {
        metrics.late_rounds.increment(1);
    }
    let failed = error.is_some();
    if failed {
        metrics.rounds_error.increment(1);
    } else {
        metrics.rounds_ok.increment(1);
    }
    match error {
        None if failing => {
            tracing::info!("local-first limits: Redis answers again; shared counting resumed with the usage kept meanwhile");
        }
        Some(cause) if !failing => {
            tracing::error!(%cause, replicas = engine.replicas(), "local-first limits: sync failed; deciding alone with limit / R of what the last view left once the rounds are late, usage kept for the next write");
        }
        _ => {}
    }
    failed
}

/// R as the engine uses it: the most replicas a heartbeat counted, kept until the counts have
/// been lower for a heartbeat's life. A heartbeat that a busy node renewed late must not make
/// the others divide by fewer than R for a moment (their shares would grow by the missing
/// replica's); a replica that left is let go a heartbeat's life later, which only makes the
/// shares smaller meanwhile.
#[derive(Default)]
struct Seen {
    replicas: u64,
    /// Store time since when the counts were lower than `replicas`, if they are.
    lower_since: Option<i64>,
}

impl Seen {
    fn update(&mut self, engine: &LocalFirst, counted: u64, life_us: i64, metrics: &SyncMetrics) {
        let now = engine.store_now();
        if counted >= self.replicas {
            self.replicas = counted;
            self.lower_since = None;
        } else {
            let since = *self.lower_since.get_or_insert(now);
            if now - since > life_us {
                self.replicas = counted;
                self.lower_since = None;
            }
        }
        engine.set_replicas(self.replicas);
        metrics.replicas.set(self.replicas as f64);
    }
}

/// The write of a round: `batch` (number `round`), then the rest of the usage a batch at a
/// time, within the round's bounds ([`ROUND_KEYS`], `phase`). Ok(true) when `tick` may be
/// recorded as written; the error that stopped it.
///
/// Two kinds of usage go out whatever the phase, for the others take a view of the tick
/// recorded for complete and count this replica for no more than its share beyond it: the
/// usage taken since a write sent again was first sent (the write holds none of it), and
/// the usage taken alone while the rounds were late ([`LocalFirst::spent_alone`]), which may
/// be more than a share. For the latter the engine is told first that the tick is to be
/// recorded ([`LocalFirst::wrote`]), so it takes no more alone than its share from then on,
/// and the tick is not recorded if that usage could not all be written.
#[allow(clippy::too_many_arguments)]
async fn write(
    engine: &LocalFirst,
    redis: &crate::limit::redis_store::RedisStore,
    id: &str,
    round: u64,
    batch: Vec<crate::limit::local_first::SyncItem>,
    tick: i64,
    phase: Duration,
    metrics: &SyncMetrics,
) -> Result<bool, String> {
    let started = Instant::now();
    let mut resent = engine.sent_before(round);
    let mut round = round;
    let mut batch = batch;
    let mut sent = 0;
    // Calls made past the phase for usage taken alone: at most a round's keys in batches.
    let mut flush = ROUND_KEYS.div_ceil(BATCH_KEYS);
    loop {
        let call = Instant::now();
        let result = redis.sync_round(id, round, &batch, None).await;
        metrics.round_seconds.record(call.elapsed().as_secs_f64());
        metrics.keys.record(batch.len() as f64);
        if let Err(e) = result {
            return Err(crate::error::chain(&e).to_string());
        }
        engine.written(round);
        sent += batch.len();
        let alone = engine.spent_alone();
        let more = if resent || (alone && flush > 0) {
            if alone {
                engine.wrote(tick);
                flush -= 1;
            }
            true
        } else {
            sent < ROUND_KEYS && started.elapsed() < phase
        };
        resent = false;
        if !more {
            return Ok(!alone || !engine.unsent());
        }
        match engine.next_write() {
            Some((next, items)) => (round, batch) = (next, items),
            None => return Ok(true),
        }
    }
}

/// The read of a round, 3/4 of an interval after `tick`: first the fleet's state (the
/// heartbeat, which says whether every live replica's write of `tick` is in), then the keys;
/// a complete view when it is, a partial one when a replica's round is late. The error that
/// stopped it.
#[allow(clippy::too_many_arguments)]
async fn read_round(
    seen: &mut Seen,
    engine: &LocalFirst,
    redis: &crate::limit::redis_store::RedisStore,
    id: &str,
    replicas_key: &str,
    heartbeat_us: i64,
    written: i64,
    tick: i64,
    metrics: &SyncMetrics,
) -> Option<String> {
    let interval = engine.interval_us();
    // How many ticks the view lags: 0 when every live replica's write of `tick` is in.
    let behind = match redis
        .heartbeat(replicas_key, id, heartbeat_us, written)
        .await
    {
        Ok((replicas, oldest)) => {
            seen.update(engine, replicas, heartbeat_us, metrics);
            if oldest >= tick {
                0
            } else {
                ((tick - oldest) as u64).div_ceil(interval as u64)
            }
        }
        Err(e) => return Some(crate::error::chain(&e).to_string()),
    };
    let phase = Duration::from_micros(interval as u64 / 4);
    let reads = engine.read_batch();
    let (done, states, clock, failed) = read(redis, id, &reads, phase, metrics).await;
    if let Some((store_now, latency)) = clock {
        if behind == 0 {
            engine.read_done(&reads[..done], states, store_now, latency);
        } else {
            metrics.partial_views.increment(1);
            engine.read_partial(&reads[..done], states, store_now, latency, behind);
        }
        for (route, units) in engine.take_drift() {
            if let Some(counter) = metrics.drift.get(&route) {
                counter.increment(units);
            }
        }
    }
    failed
}

/// The read of `items` in calls of [`BATCH_KEYS`], no more calls once `phase` is spent:
/// how many items were read, their states, the last call's store clock and duration (µs), and
/// the error that stopped it.
async fn read(
    redis: &crate::limit::redis_store::RedisStore,
    id: &str,
    items: &[SyncItem],
    phase: Duration,
    metrics: &SyncMetrics,
) -> (
    usize,
    Vec<Option<crate::limit::algorithm::State>>,
    Option<(i64, i64)>,
    Option<String>,
) {
    let started = Instant::now();
    let mut states = Vec::with_capacity(items.len());
    let mut clock = None;
    // At least one call, even with no key: it measures the store's clock.
    let mut chunks: Vec<&[SyncItem]> = items.chunks(BATCH_KEYS).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for chunk in chunks {
        if clock.is_some() && started.elapsed() >= phase {
            break;
        }
        let call = Instant::now();
        match redis.sync_round(id, 0, chunk, None).await {
            Ok((store_now, replied)) => {
                let latency = call.elapsed();
                metrics.round_seconds.record(latency.as_secs_f64());
                metrics.keys.record(chunk.len() as f64);
                states.extend(replied);
                clock = Some((store_now, latency.as_micros() as i64));
            }
            Err(e) => {
                let done = states.len();
                return (
                    done,
                    states,
                    clock,
                    Some(crate::error::chain(&e).to_string()),
                );
            }
        }
    }
    (states.len(), states, clock, None)
}
