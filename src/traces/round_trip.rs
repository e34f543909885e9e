//! The time of a traced request's Redis decision: the store's call alone, not the limit
//! stage around it (identifying the caller, the delay queue).
//!
//! The proxy runs a traced request's limit stage inside [`timed`], which puts a
//! [`RoundTrip`] in a Tokio task-local; the store brackets its decision call with
//! [`started`] and [`ended`], which write to it. Outside that scope (tracing off, an
//! unsampled request is still inside it) both are one failed task-local lookup beside a
//! network round trip, and nothing is written.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

tokio::task_local! {
    static ROUND_TRIP: RoundTrip;
}

/// Where the store writes the start and end of its last decision call of the request.
pub type RoundTrip = Arc<Mutex<Option<(SystemTime, SystemTime)>>>;

/// Runs `stage` (the limit stage) with `clock` as its round trip's record.
pub fn timed<F: Future>(clock: RoundTrip, stage: F) -> impl Future<Output = F::Output> {
    ROUND_TRIP.scope(clock, stage)
}

/// The store's decision call starts now: its start time, when the request is timed.
pub fn started() -> Option<SystemTime> {
    ROUND_TRIP.try_with(|_| SystemTime::now()).ok()
}

/// The store's decision call that [`started`] at `start` ended now (the answer or the error
/// arrived).
pub fn ended(start: Option<SystemTime>) {
    if let Some(start) = start {
        let _ = ROUND_TRIP.try_with(|clock| {
            if let Ok(mut clock) = clock.lock() {
                *clock = Some((start, SystemTime::now()));
            }
        });
    }
}
