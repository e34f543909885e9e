//! Time as tollgate's limits and its store's breaker read it: integer microseconds
//! ([`Micros`]) from an injected [`Clock`], so that the stores and the breaker are tested on a
//! clock that moves only when told to ([`ManualClock`]).
//!
//! Its own file, importing nothing, so that the calendar, the algorithms, the stores and the
//! breaker share one definition without importing each other.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds: an instant on some clock, or a duration.
pub type Micros = i64;

/// A time source in microseconds. Its origin is its own: the Unix epoch for the stores'
/// [`SystemClock`] (limit states hold absolute times), any instant for a monotonic clock that
/// only measures spans (the breaker's).
pub trait Clock: Send + Sync {
    fn now_us(&self) -> Micros;
}

/// Wall-clock microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now: Micros) -> ManualClock {
        ManualClock(AtomicI64::new(now))
    }

    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}
