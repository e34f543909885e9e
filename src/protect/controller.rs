//! The adaptive concurrency limit as a pure state machine: fed with samples (each exchange's
//! time to its response head, or an error) and the time they came at, it moves one number,
//! the limit. It never reads a clock and never sleeps, so its tests replay whole scenarios in
//! microseconds.
//!
//! Windows: samples are gathered until a window has lasted [`WINDOW`] *and* holds
//! [`MIN_SAMPLES`]; only then does the controller act. Too few samples never move the limit
//! (a quiet app keeps its limit however odd its few latencies are); a window that gathers too
//! few within [`STALE`] is dropped.
//!
//! At each window's end, in order:
//! 1. Errors (5xx from the app, upstream timeouts, connect failures): when more than
//!    [`ERROR_SHARE`] of the window failed, the limit shrinks by half the share that failed
//!    (at most by half). A failing app is an overloaded app until shown otherwise.
//! 2. The baseline, the app's unloaded latency (what `latency: 2x` multiplies): the window's
//!    10th percentile lowers it at once; it rises slowly (a fraction per window) from windows
//!    where the limit was not reached, and half-way to the window's median when in-flight was
//!    cut by a quarter or more and the latency did not fall with it (see 4): a queue's latency
//!    falls in proportion to the requests in it (Little's law), the app's own does not. That
//!    is how a degraded app's new latency is learned under overload, where the limit is always
//!    reached.
//!    No probe: the baseline is never measured by cutting the limit on purpose, so healthy
//!    traffic is never shed to learn it.
//! 3. The latency of the window is its median time to head, compared with the target
//!    (`latency:` as a multiple of the baseline, or absolute). A multiple is never less than
//!    the baseline plus [`MIN_SLACK`]: below a few milliseconds the spread of time to head is
//!    the scheduling of a busy CPU (the proxy's, the app's), not a queue in the app, and twice
//!    a sub-millisecond baseline would read a busy machine as an overloaded app and shed a
//!    healthy one.
//! 4. Above the target, the limit is multiplied by target/latency (at most halved per
//!    window): the gradient that brings the app's queue back to what the target allows. It
//!    is never cut below the app's parallelism as the window shows it (answers per second ×
//!    the baseline, Little's law): at that concurrency the app has no queue left to shrink,
//!    and a lower limit would only idle its workers (latency noise, such as a busy CPU, would
//!    otherwise cost goodput).
//!    It acts only when the limit was reached in the window (saturated): below the limit,
//!    tollgate's concurrency is not what makes the app slow, and cutting it would shed
//!    healthy traffic.
//! 5. At or below the target and saturated, the limit grows by a tenth (at least 1). A limit
//!    that in-flight never reaches does not grow: it would mean nothing when load comes.

use std::time::{Duration, Instant};

use crate::config::{LatencyTarget, Protect};

/// The shortest window the controller acts on.
pub const WINDOW: Duration = Duration::from_millis(100);
/// The fewest samples a window needs before the controller acts on it.
pub const MIN_SAMPLES: usize = 10;
/// A window still short of samples after this long is dropped.
pub const STALE: Duration = Duration::from_secs(5);
/// The share of failed exchanges above which errors shrink the limit.
pub const ERROR_SHARE: f64 = 0.1;
/// The limit a fresh controller starts with (within the configured bounds): enough for a
/// healthy app's ordinary concurrency, small enough to be found wrong within a few windows.
pub const INITIAL_LIMIT: f64 = 20.0;
/// A cut of in-flight this large (a quarter) tells the app's own latency from a queue's; the
/// small steps of a limit that has settled do not (their latencies differ by noise).
const BIG_CUT: f64 = 0.25;
/// The least a `latency: <multiple>` target allows above the baseline (see the module docs, 3).
pub const MIN_SLACK: Duration = Duration::from_millis(5);
/// How much of the gap to a higher 10th percentile the baseline closes per window below the
/// limit.
const BASELINE_RISE: f64 = 0.05;

/// How an exchange ended, as the controller counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head that is not a 5xx: its time to head is a latency sample.
    Answered,
    /// A 5xx from the app, an upstream timeout, a failed connection.
    Failed,
}

/// The controller's settings, from `protect`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub latency: LatencyTarget,
    pub min_limit: f64,
    pub max_limit: f64,
}

impl Settings {
    pub fn of(protect: &Protect) -> Settings {
        Settings {
            latency: protect.latency,
            min_limit: f64::from(protect.min_limit),
            max_limit: f64::from(protect.max_limit),
        }
    }
}

/// What the last window showed, for `/protect` and the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub limit: f64,
    /// The learned unloaded latency; None until a window taught it.
    pub baseline: Option<Duration>,
    /// The last window's median time to head.
    pub latency: Option<Duration>,
    /// What the latency is held to; None while a multiple has no baseline yet.
    pub target: Option<Duration>,
    /// The last window's share of failed exchanges.
    pub error_share: f64,
    pub windows: u64,
}

#[derive(Debug, Clone)]
pub struct Controller {
    settings: Settings,
    limit: f64,
    baseline: Option<f64>,
    latency: Option<f64>,
    error_share: f64,
    windows: u64,
    window: Window,
    /// The mean concurrency and median latency of the last window, when it was saturated: to
    /// tell the app's own latency from a queue's when the concurrency was cut.
    reference: Option<(f64, f64)>,
}

#[derive(Debug, Clone, Default)]
struct Window {
    started: Option<Instant>,
    /// Seconds to head of the exchanges answered.
    latencies: Vec<f64>,
    /// The sum over those of how many were in flight when each started (itself included).
    concurrency: f64,
    failed: usize,
    /// The most in flight at once.
    peak: usize,
    /// The limit was reached: someone waited, or in-flight met it.
    saturated: bool,
}

impl Controller {
    pub fn new(settings: Settings) -> Controller {
        Controller {
            limit: INITIAL_LIMIT.clamp(settings.min_limit, settings.max_limit),
            settings,
            baseline: None,
            latency: None,
            error_share: 0.0,
            windows: 0,
            window: Window::default(),
            reference: None,
        }
    }

    /// New settings (a reload): what was learned stays, the limit is brought within the new
    /// bounds.
    pub fn reconfigure(&mut self, settings: Settings) {
        self.settings = settings;
        self.limit = self.limit.clamp(settings.min_limit, settings.max_limit);
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// The number of exchanges that may be in flight at once.
    pub fn limit(&self) -> usize {
        self.limit.floor().max(1.0) as usize
    }

    /// An exchange started with `in_flight` (itself included) in flight.
    pub fn started(&mut self, now: Instant, in_flight: usize) {
        self.window.started.get_or_insert(now);
        self.window.peak = self.window.peak.max(in_flight);
        if in_flight >= self.limit() {
            self.window.saturated = true;
        }
    }

    /// A request found the limit reached (it waits, or shadow mode counts it).
    pub fn saturated(&mut self, now: Instant) {
        self.window.started.get_or_insert(now);
        self.window.saturated = true;
    }

    /// An exchange that started with `in_flight` in flight (itself included) ended `latency`
    /// after it started. True when this closed a window (the limit may have moved).
    pub fn sample(
        &mut self,
        now: Instant,
        latency: Duration,
        in_flight: usize,
        outcome: Outcome,
    ) -> bool {
        if self
            .window
            .started
            .is_some_and(|started| now.saturating_duration_since(started) >= STALE)
        {
            // Too few to act on in all this time: start over rather than act on old news.
            self.window = Window::default();
        }
        let started = *self.window.started.get_or_insert(now);
        match outcome {
            Outcome::Answered => {
                self.window.latencies.push(latency.as_secs_f64());
                self.window.concurrency += in_flight as f64;
            }
            Outcome::Failed => self.window.failed += 1,
        }
        let count = self.window.latencies.len() + self.window.failed;
        let age = now.saturating_duration_since(started);
        if age >= WINDOW && count >= MIN_SAMPLES {
            let window = std::mem::take(&mut self.window);
            self.close(window, age);
            return true;
        }
        false
    }

    fn close(&mut self, mut w: Window, age: Duration) {
        self.windows += 1;
        let (min, max) = (self.settings.min_limit, self.settings.max_limit);
        let count = w.latencies.len() + w.failed;
        self.error_share = w.failed as f64 / count as f64;
        if self.error_share > ERROR_SHARE {
            self.limit = (self.limit * (1.0 - self.error_share / 2.0)).clamp(min, max);
            self.reference = None;
            return;
        }
        if w.latencies.len() < MIN_SAMPLES / 2 {
            return;
        }
        w.latencies.sort_by(f64::total_cmp);
        let concurrency = w.concurrency / w.latencies.len() as f64;
        let low = w.latencies[w.latencies.len() / 10];
        let median = w.latencies[w.latencies.len() / 2];
        self.latency = Some(median);

        // The baseline.
        let baseline = match self.baseline {
            None => low,
            Some(b) if low < b => low,
            Some(b) if !w.saturated => b + (low - b) * BASELINE_RISE,
            Some(b) => match self.reference {
                // In-flight was cut and the median fell by less than half of what a queue's
                // would have: the app answers this slowly on its own.
                Some((before, latency)) if concurrency < before => {
                    let cut = 1.0 - concurrency / before;
                    if cut >= BIG_CUT && median >= latency * (1.0 - cut / 2.0) && median > b {
                        // Half the way: one noisy window cannot double the target.
                        b + (median - b) / 2.0
                    } else {
                        b
                    }
                }
                _ => b,
            },
        };
        self.baseline = Some(baseline);
        let target = self.target_secs().expect("a baseline is known");

        if !w.saturated {
            self.reference = None;
            return;
        }
        self.reference = Some((concurrency, median));
        if median > target {
            // Never below the app's parallelism (answers per second × its unloaded latency,
            // Little's law): at that concurrency it has no queue to shrink, and less only
            // leaves its workers idle.
            let parallelism = w.latencies.len() as f64 / age.as_secs_f64() * baseline;
            let cut = self.limit * (target / median).max(0.5);
            self.limit = cut.max(parallelism.min(self.limit)).clamp(min, max);
        } else {
            self.limit = (self.limit + (self.limit * 0.1).max(1.0)).clamp(min, max);
        }
    }

    fn target_secs(&self) -> Option<f64> {
        match self.settings.latency {
            LatencyTarget::Absolute(d) => Some(d.as_secs_f64()),
            LatencyTarget::Multiple(m) => self
                .baseline
                .map(|b| (b * m).max(b + MIN_SLACK.as_secs_f64())),
        }
    }

    pub fn reading(&self) -> Reading {
        let secs = Duration::from_secs_f64;
        Reading {
            limit: self.limit,
            baseline: self.baseline.map(secs),
            latency: self.latency.map(secs),
            target: self.target_secs().map(secs),
            error_share: self.error_share,
            windows: self.windows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn settings(latency: LatencyTarget) -> Settings {
        Settings {
            latency,
            min_limit: 1.0,
            max_limit: 1000.0,
        }
    }

    /// An app of `slots` slots, each `service` long, behind the controller, under `offered`
    /// concurrent demand (the open-loop queue in front, at least `offered` wanting in): each
    /// step of 10 ms completes what the app completes and records the latency Little's law
    /// gives for the in-flight the limit allows. Deterministic: the clock is the loop's.
    struct Scene {
        now: Instant,
        controller: Controller,
        /// Latency noise by sample index, to keep windows from being flat.
        jitter: [f64; 5],
        sent: u64,
    }

    impl Scene {
        fn new(latency: LatencyTarget) -> Scene {
            Scene {
                now: Instant::now(),
                controller: Controller::new(settings(latency)),
                jitter: [0.0, 0.3, 0.6, 0.1, 0.9],
                sent: 0,
            }
        }

        /// Runs `seconds` of an app with `slots` × `service`, at `demand` in flight wanted;
        /// returns the limits seen at each step.
        fn run(&mut self, seconds: f64, slots: f64, service: Duration, demand: f64) -> Vec<f64> {
            let steps = (seconds * 100.0) as usize;
            let mut limits = Vec::new();
            for _ in 0..steps {
                let limit = self.controller.limit() as f64;
                let in_flight = demand.min(limit);
                let saturated = demand >= limit;
                // Completions in 10 ms: in_flight / latency × 10 ms.
                let queueing = (in_flight / slots).max(1.0);
                let latency = service.as_secs_f64() * queueing;
                let completions = (in_flight / latency * 0.010).round().max(1.0) as usize;
                for _ in 0..completions {
                    self.sent += 1;
                    let noise = self.jitter[(self.sent % 5) as usize] * 1e-3;
                    if saturated {
                        self.controller.saturated(self.now);
                    }
                    self.controller.started(self.now, in_flight as usize);
                    self.controller.sample(
                        self.now,
                        Duration::from_secs_f64(latency + noise),
                        in_flight as usize,
                        Outcome::Answered,
                    );
                }
                self.now += 10 * MS;
                limits.push(self.controller.limit);
            }
            limits
        }
    }

    #[test]
    fn too_few_samples_never_move_the_limit() {
        let mut c = Controller::new(settings(LatencyTarget::Absolute(10 * MS)));
        let start = Instant::now();
        // Nine very slow answers over ten seconds: far above the target, and too few.
        for i in 0..9u32 {
            let now = start + Duration::from_secs(u64::from(i));
            c.saturated(now);
            assert!(!c.sample(now, Duration::from_secs(2), 30, Outcome::Answered));
        }
        assert_eq!(c.reading().limit, INITIAL_LIMIT);
        assert_eq!(c.reading().windows, 0);
        // Ten within a window are enough (two fast ones show the app's own latency: the rest
        // waited in a queue).
        let now = start + Duration::from_secs(20);
        for i in 0..10u64 {
            c.saturated(now);
            c.sample(
                now + MS * (i as u32 * 20),
                if i < 2 {
                    10 * MS
                } else {
                    Duration::from_secs(2)
                },
                30,
                Outcome::Answered,
            );
        }
        assert_eq!(c.reading().windows, 1);
        assert_eq!(
            c.reading().limit,
            INITIAL_LIMIT / 2.0,
            "at most halved per window"
        );
    }

    #[test]
    fn at_half_of_capacity_the_limit_is_never_cut() {
        // 4 slots × 25 ms, demand 2 in flight: the limit is never reached.
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        let limits = s.run(30.0, 4.0, 25 * MS, 2.0);
        assert!(limits.iter().all(|&l| l == INITIAL_LIMIT), "{limits:?}");
        let baseline = s.controller.reading().baseline.unwrap();
        assert!(baseline >= 25 * MS && baseline < 27 * MS, "{baseline:?}");
    }

    /// A fast app (0.2 ms, no queue) on a busy CPU: its time to head jitters by milliseconds,
    /// many times its baseline, with the limit reached by a closed-loop load. That is not
    /// overload: the limit is never cut, and it grows until the load no longer reaches it.
    #[test]
    fn a_fast_app_on_a_busy_cpu_is_never_cut() {
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        s.jitter = [0.0, 1.5, 3.0, 0.5, 2.5];
        let limits = s.run(5.0, 1000.0, Duration::from_micros(200), 50.0);
        let lowest = limits.iter().copied().fold(f64::MAX, f64::min);
        assert!(lowest >= INITIAL_LIMIT, "cut to {lowest}");
        assert!(*limits.last().unwrap() >= 50.0, "{:?}", limits.last());
    }

    #[test]
    fn a_limit_that_in_flight_never_reaches_does_not_grow() {
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        // Demand 12 for a limit of 20: fast answers, and still no growth.
        let limits = s.run(10.0, 40.0, 10 * MS, 12.0);
        assert_eq!(*limits.last().unwrap(), INITIAL_LIMIT);
    }

    #[test]
    fn under_steady_overload_the_limit_settles_near_the_target_without_collapsing() {
        // 4 slots × 25 ms with 3× demand: a limit of 8 keeps 2× the unloaded latency.
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        // Learn the baseline first at light load.
        s.run(2.0, 4.0, 25 * MS, 2.0);
        let limits = s.run(20.0, 4.0, 25 * MS, 60.0);
        let settled = &limits[500..];
        let (lo, hi) = settled
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        // Never below the app's slots (goodput kept), never far above the target's 8.
        assert!(lo >= 4.0, "fell to {lo}");
        assert!(hi <= 10.0, "rose to {hi}");
        let baseline = s.controller.reading().baseline.unwrap();
        assert!(baseline < 30 * MS, "the baseline crept up to {baseline:?}");
    }

    #[test]
    fn a_degraded_app_is_followed_within_two_seconds_and_a_recovered_one_within_five() {
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        s.run(2.0, 4.0, 25 * MS, 2.0);
        s.run(10.0, 4.0, 25 * MS, 60.0);
        // Half the slots, twice as slow: 2 slots × 50 ms. Goodput needs a limit of at least
        // 2; latency wants no more than about 4 (2 × 50 ms queue on the new baseline).
        let degraded = s.run(6.0, 2.0, 50 * MS, 60.0);
        let after_two_seconds = &degraded[200..];
        assert!(
            after_two_seconds.iter().all(|&l| (2.0..=6.0).contains(&l)),
            "{after_two_seconds:?}"
        );
        // Recovered: back to 4 × 25 ms, the limit grows back above the slots within 5 s.
        let recovered = s.run(6.0, 4.0, 25 * MS, 60.0);
        let after_five_seconds = &recovered[500..];
        assert!(
            after_five_seconds.iter().all(|&l| l >= 6.0),
            "{after_five_seconds:?}"
        );
    }

    #[test]
    fn errors_shrink_the_limit() {
        let mut c = Controller::new(settings(LatencyTarget::Multiple(2.0)));
        let start = Instant::now();
        for i in 0..40u64 {
            let now = start + MS * (i as u32 * 10);
            c.started(now, 1);
            c.sample(now, MS, 1, Outcome::Failed);
        }
        assert!(c.reading().limit < INITIAL_LIMIT / 2.0, "{:?}", c.reading());
        assert_eq!(c.reading().error_share, 1.0);
    }

    #[test]
    fn a_reload_keeps_what_was_learned_within_the_new_bounds() {
        let mut s = Scene::new(LatencyTarget::Multiple(2.0));
        s.run(2.0, 4.0, 25 * MS, 2.0);
        let baseline = s.controller.reading().baseline;
        s.controller.reconfigure(Settings {
            latency: LatencyTarget::Multiple(3.0),
            min_limit: 1.0,
            max_limit: 8.0,
        });
        assert_eq!(s.controller.reading().baseline, baseline);
        assert_eq!(s.controller.reading().limit, 8.0);
    }
}
