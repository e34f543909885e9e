//! A circuit breaker in front of the Redis store.
//!
//! Every store call is already bounded by `store.redis.timeout`, but while Redis is down or
//! frozen each request would still wait that long before `on_error` applies, and every waiting
//! request holds a command in the connection's buffer. After `threshold` consecutive failures
//! the breaker opens: for `cool_down` no call is made and callers apply `on_error` at once.
//! Then exactly one caller is let through as a probe; its success closes the breaker, its
//! failure opens it again for another cool-down. Time comes from an injected clock so the
//! state machine is tested without sleeping.

use std::sync::Mutex;
use std::time::Duration;

use crate::limit::{Clock, Micros};

/// Consecutive store errors that open the breaker.
pub const DEFAULT_THRESHOLD: u32 = 3;
/// How long an open breaker refuses calls before letting one probe through. Short, because
/// limiting must be back within about a second of Redis returning.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_millis(250);

/// The process's monotonic clock (tokio's, so paused-time tests see it too), from the
/// breaker's creation: the breaker only measures spans, so any origin does.
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_us(&self) -> Micros {
        self.origin.elapsed().as_micros() as Micros
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; `failures` consecutive errors so far.
    Closed { failures: u32 },
    /// No calls until `until` (on the breaker's clock).
    Open { until: Micros },
    /// One probe is out; everyone else is refused until it reports, or until `until` if it
    /// never does (its request was dropped mid-call): then another probe goes.
    Probing { until: Micros },
}

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call the store and report the outcome with [`Breaker::success`] / [`Breaker::failure`].
    Call,
    /// Do not call: apply `on_error` immediately.
    Refuse,
}

pub struct Breaker<C: Clock = TokioClock> {
    clock: C,
    threshold: u32,
    cool_down: Micros,
    probe_timeout: Micros,
    state: Mutex<State>,
}

impl Breaker<TokioClock> {
    /// `probe_timeout`: how long a probe may stay out (the store call's own timeout).
    pub fn new(threshold: u32, cool_down: Duration, probe_timeout: Duration) -> Self {
        Breaker::with_clock(TokioClock::default(), threshold, cool_down, probe_timeout)
    }
}

impl<C: Clock> Breaker<C> {
    pub fn with_clock(
        clock: C,
        threshold: u32,
        cool_down: Duration,
        probe_timeout: Duration,
    ) -> Self {
        Breaker {
            clock,
            threshold: threshold.max(1),
            cool_down: cool_down.as_micros() as Micros,
            probe_timeout: probe_timeout.as_micros() as Micros,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain value, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a call may be made now. An expired cool-down hands out exactly one probe.
    pub fn permit(&self) -> Permit {
        let mut state = self.state();
        // The clock is read only while the breaker is not closed: a closed breaker (every
        // call while Redis answers) costs the lock alone.
        let until = match *state {
            State::Closed { .. } => return Permit::Call,
            State::Open { until } | State::Probing { until } => until,
        };
        let now = self.clock.now_us();
        if now >= until {
            *state = State::Probing {
                until: now + self.probe_timeout,
            };
            Permit::Call
        } else {
            Permit::Refuse
        }
    }

    /// The call answered: close the breaker.
    pub fn success(&self) {
        *self.state() = State::Closed { failures: 0 };
    }

    /// The call failed. Returns true if this failure opened the breaker.
    pub fn failure(&self) -> bool {
        let mut state = self.state();
        let open = State::Open {
            until: self.clock.now_us() + self.cool_down,
        };
        match *state {
            State::Closed { failures } if failures + 1 >= self.threshold => {
                *state = open;
                true
            }
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            // A failed probe, or a call that started before the breaker opened.
            State::Probing { .. } | State::Open { .. } => {
                let reopened = matches!(*state, State::Probing { .. });
                *state = open;
                reopened
            }
        }
    }

    /// True while calls are refused (open, or a probe is out).
    pub fn is_open(&self) -> bool {
        !matches!(*self.state(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::clock::ManualClock;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct FakeClock(Arc<ManualClock>);

    impl FakeClock {
        fn advance(&self, d: Duration) {
            self.0.advance(d.as_micros() as Micros);
        }
    }

    impl Clock for FakeClock {
        fn now_us(&self) -> Micros {
            self.0.now_us()
        }
    }

    fn breaker() -> (FakeClock, Breaker<FakeClock>) {
        let clock = FakeClock::default();
        (
            clock.clone(),
            Breaker::with_clock(
                clock,
                3,
                Duration::from_millis(250),
                Duration::from_millis(500),
            ),
        )
    }

    #[test]
    fn stays_closed_below_the_threshold_and_successes_reset_the_count() {
        let (_, b) = breaker();
        assert!(!b.failure());
        assert!(!b.failure());
        b.success();
        assert!(!b.failure());
        assert!(!b.failure());
        assert_eq!(b.permit(), Permit::Call);
        assert!(!b.is_open());
    }

    #[test]
    fn opens_after_threshold_consecutive_failures_and_refuses_during_cool_down() {
        let (clock, b) = breaker();
        b.failure();
        b.failure();
        assert!(b.failure(), "the third failure opens it");
        assert!(b.is_open());
        assert_eq!(b.permit(), Permit::Refuse);
        clock.advance(Duration::from_millis(249));
        assert_eq!(b.permit(), Permit::Refuse);
    }

    #[test]
    fn after_the_cool_down_exactly_one_probe_goes_through() {
        let (clock, b) = breaker();
        for _ in 0..3 {
            b.failure();
        }
        clock.advance(Duration::from_millis(250));
        assert_eq!(b.permit(), Permit::Call);
        // Everyone else waits for the probe's outcome...
        assert_eq!(b.permit(), Permit::Refuse);
        clock.advance(Duration::from_millis(499));
        assert_eq!(b.permit(), Permit::Refuse);
        // ...unless it never reports (its request was dropped): then one more probe goes.
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.permit(), Permit::Call);
        assert_eq!(b.permit(), Permit::Refuse);
    }

    #[test]
    fn a_successful_probe_closes_it() {
        let (clock, b) = breaker();
        for _ in 0..3 {
            b.failure();
        }
        clock.advance(Duration::from_millis(300));
        assert_eq!(b.permit(), Permit::Call);
        b.success();
        assert!(!b.is_open());
        assert_eq!(b.permit(), Permit::Call);
        assert_eq!(b.permit(), Permit::Call);
        // And the count starts again from zero.
        assert!(!b.failure());
    }

    #[test]
    fn a_failed_probe_reopens_it_for_a_new_cool_down() {
        let (clock, b) = breaker();
        for _ in 0..3 {
            b.failure();
        }
        clock.advance(Duration::from_millis(250));
        assert_eq!(b.permit(), Permit::Call);
        assert!(b.failure());
        assert_eq!(b.permit(), Permit::Refuse);
        clock.advance(Duration::from_millis(200));
        assert_eq!(b.permit(), Permit::Refuse);
        clock.advance(Duration::from_millis(50));
        assert_eq!(b.permit(), Permit::Call);
    }

    #[test]
    fn late_failures_of_calls_started_before_opening_extend_the_cool_down() {
        let (clock, b) = breaker();
        for _ in 0..3 {
            b.failure();
        }
        clock.advance(Duration::from_millis(100));
        assert!(!b.failure(), "already open: not a new opening");
        clock.advance(Duration::from_millis(200));
        assert_eq!(b.permit(), Permit::Refuse);
        clock.advance(Duration::from_millis(50));
        assert_eq!(b.permit(), Permit::Call);
    }

    #[test]
    fn threshold_zero_means_one() {
        let clock = FakeClock::default();
        let b = Breaker::with_clock(clock, 0, Duration::from_millis(10), Duration::ZERO);
        assert!(b.failure());
        assert!(b.is_open());
    }
}
