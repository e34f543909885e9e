//! The priority gate in front of the app: a request takes a slot before it is forwarded and
//! gives it back when the app's response head arrives (or the exchange fails), so upgrades,
//! gRPC streams, server-sent events and bodies still streaming neither hold the limit nor
//! lengthen its latency samples past their time to head.
//!
//! With the limit reached, a request waits, at most `max_wait`, then is shed. Waiting requests
//! are served highest priority first; within a priority the oldest first, unless its queue is
//! backed up (as many waiting as the limit admits at once): then the newest first (adaptive
//! LIFO), because in a backed-up queue the oldest are the ones that will be late anyway, and
//! serving them first would make every admitted request carry nearly the whole `max_wait`.
//! When a slot frees for a backed-up queue whose newest waiter has already waited a tenth of
//! `max_wait` ([`STANDING_SHARE`]), the newest takes the slot and everyone older is shed: a
//! queue that stays backed up that long is standing, not absorbing a burst, and what it lets
//! in late only adds its wait to the latency of what was admitted (the idea of CoDel's target
//! delay). The newest is kept because it is the least late of them and the slot would
//! otherwise idle; and a request that arrives as a burst ends is not shed for the burst's
//! backlog in front of it.
//! Only the lowest priority waiting is shed this way; a higher one's waiters go only by their
//! own `max_wait`, as the lowest is shed first everywhere else.
//! When a request must wait in a backed-up queue and a lower priority waits too, the oldest of
//! the lowest priority is shed at once to make room. `critical` is only ever shed by its own
//! `max_wait`: nothing outranks it.
//!
//! In shadow mode nobody waits and nobody is shed; a request that finds the limit reached is
//! counted as shed when more are over the limit than it frees within `max_wait` (the limit
//! times `max_wait` over the current latency): an estimate of what enforce would have done.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge};
use tokio::sync::oneshot;

use super::controller::{Controller, Reading, Sample, Settings};
use crate::config::{Priority, Protect, ProtectMode};

/// A backed-up queue whose newest waiter has waited `max_wait / STANDING_SHARE` when a slot
/// frees is standing, and shed (see the module docs).
const STANDING_SHARE: u32 = 10;

/// The metric handles the gate keeps current (registered by `crate::metrics`).
#[derive(Clone)]
pub struct ProtectMetrics {
    pub limit: Gauge,
    pub in_flight: Gauge,
    pub waiting: Gauge,
    pub baseline_seconds: Gauge,
    pub latency_seconds: Gauge,
    /// By [`Priority::index`].
    pub admitted: [Counter; 4],
    pub shed: [Counter; 4],
    /// What enforce would have shed, in shadow mode.
    pub shadow_shed: [Counter; 4],
}

impl ProtectMetrics {
    /// Handles that go nowhere (tests, or a proxy without metrics).
    pub fn detached() -> ProtectMetrics {
        ProtectMetrics {
            limit: Gauge::noop(),
            in_flight: Gauge::noop(),
            waiting: Gauge::noop(),
            baseline_seconds: Gauge::noop(),
            latency_seconds: Gauge::noop(),
            admitted: std::array::from_fn(|_| Counter::noop()),
            shed: std::array::from_fn(|_| Counter::noop()),
            shadow_shed: std::array::from_fn(|_| Counter::noop()),
        }
    }
}

/// The protection of one app: the controller and the gate. Shared by every request (and kept
/// over reloads), so slots taken before a reload come back to it.
pub struct Protector {
    state: Mutex<State>,
    metrics: ProtectMetrics,
}

struct State {
    mode: ProtectMode,
    max_wait: Duration,
    controller: Controller,
    in_flight: usize,
    /// Waiters by priority index, oldest at the front.
    queues: [VecDeque<Waiter>; 4],
    waiting: usize,
    next_id: u64,
    admitted: [u64; 4],
    shed: [u64; 4],
}

struct Waiter {
    id: u64,
    /// When it started waiting.
    since: Instant,
    answer: oneshot::Sender<Turn>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Granted,
    Shed,
}

/// What the gate decided for one request.
pub enum Admission {
    /// Forward it, holding the slot until the response head.
    Admitted(Slot),
    /// Enforce: answer 503 without forwarding.
    Shed,
}

/// The state `/protect` shows.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub mode: ProtectMode,
    pub max_wait: Duration,
    pub reading: Reading,
    pub settings: Settings,
    pub limit: usize,
    pub in_flight: usize,
    pub waiting: usize,
    /// By [`Priority::index`]; in shadow mode `shed` counts what enforce would have shed.
    pub admitted: [u64; 4],
    pub shed: [u64; 4],
}

impl Protector {
    pub fn new(protect: &Protect, metrics: ProtectMetrics) -> Arc<Protector> {
        let protector = Protector {
            state: Mutex::new(State {
                mode: protect.mode,
                max_wait: protect.max_wait,
                controller: Controller::new(Settings::of(protect)),
                in_flight: 0,
                queues: Default::default(),
                waiting: 0,
                next_id: 0,
                admitted: [0; 4],
                shed: [0; 4],
            }),
            metrics,
        };
        protector.publish(&protector.lock());
        Arc::new(protector)
    }

    /// New settings from a reload: the learned limit and baseline stay.
    pub fn reconfigure(&self, protect: &Protect) {
        let mut state = self.lock();
        state.mode = protect.mode;
        state.max_wait = protect.max_wait;
        state.controller.reconfigure(Settings::of(protect));
        // A higher limit, or shadow mode, lets waiters in now.
        self.grant(&mut state);
        self.publish(&state);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements: a panic elsewhere does not matter.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a request of `priority`: at once, after waiting, or not at all.
    pub async fn admit(self: &Arc<Self>, priority: Priority) -> Admission {
        match self.try_admit(priority) {
            Ok(admission) => admission,
            Err(ticket) => ticket.wait().await,
        }
    }

    /// [`Protector::admit`] without waiting: the answer now, or a place in the queue to wait
    /// in (the proxy boxes that wait, so that the common case adds nothing to its future).
    pub fn try_admit(self: &Arc<Self>, priority: Priority) -> Result<Admission, Ticket> {
        {
            let mut state = self.lock();
            let now = Instant::now();
            let limit = state.controller.limit();
            if state.in_flight < limit || state.mode == ProtectMode::Shadow {
                let mut would_shed = false;
                if state.in_flight >= limit {
                    state.controller.saturated(now);
                    if self.shadow_sheds(&state) {
                        would_shed = true;
                        state.shed[priority.index()] += 1;
                        self.metrics.shadow_shed[priority.index()].increment(1);
                    }
                }
                let mut slot = self.take(&mut state, priority, now);
                slot.would_shed = would_shed;
                return Ok(Admission::Admitted(slot));
            }
            state.controller.saturated(now);
            if state.max_wait.is_zero() {
                return Ok(self.shed_now(&mut state, priority));
            }
            if state.waiting >= limit {
                // Backed up: make room by shedding the oldest of a lower priority.
                let lower = (0..priority.index()).find(|&i| !state.queues[i].is_empty());
                if let Some(lowest) = lower {
                    let waiter = state.queues[lowest].pop_front().expect("not empty");
                    state.waiting -= 1;
                    // Its own future counts it as shed when it reads the answer.
                    let _ = waiter.answer.send(Turn::Shed);
                }
            }
            let (answer, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.queues[priority.index()].push_back(Waiter {
                id,
                since: now,
                answer,
            });
            state.waiting += 1;
            self.metrics.waiting.set(state.waiting as f64);
            Err(Ticket {
                protector: self.clone(),
                priority,
                id,
                max_wait: state.max_wait,
                answer: Some(rx),
            })
        }
    }

    /// In shadow mode, with the limit reached: would enforce have shed this request? Yes when
    /// more are over the limit than free up within `max_wait`.
    fn shadow_sheds(&self, state: &State) -> bool {
        let limit = state.controller.limit();
        let over = state.in_flight + 1 - limit;
        let latency = state.controller.reading().latency;
        let freed = match latency {
            Some(latency) if !latency.is_zero() => {
                limit as f64 * state.max_wait.as_secs_f64() / latency.as_secs_f64()
            }
            _ => 0.0,
        };
        over as f64 > freed
    }

    fn shed_now(&self, state: &mut State, priority: Priority) -> Admission {
        state.shed[priority.index()] += 1;
        self.metrics.shed[priority.index()].increment(1);
        Admission::Shed
    }

    /// Takes a slot (the caller checked there is one).
    fn take(self: &Arc<Self>, state: &mut State, priority: Priority, now: Instant) -> Slot {
        state.in_flight += 1;
        state.controller.started(now, state.in_flight);
        state.admitted[priority.index()] += 1;
        self.metrics.admitted[priority.index()].increment(1);
        self.metrics.in_flight.set(state.in_flight as f64);
        Slot {
            protector: Some(self.clone()),
            started: now,
            concurrency: state.in_flight,
            would_shed: false,
        }
    }

    /// Gives a slot back, with what the exchange showed, and lets waiters in.
    fn release(&self, started: Instant, concurrency: usize, outcome: Option<Sample>) {
        let mut state = self.lock();
        state.in_flight -= 1;
        let now = Instant::now();
        if let Some(outcome) = outcome {
            let latency = now.saturating_duration_since(started);
            if state.controller.sample(now, latency, concurrency, outcome) {
                self.publish(&state);
            }
        }
        self.grant(&mut state);
    }

    /// Hands free slots to waiters: highest priority first; within it the oldest, or the
    /// newest while the queue is backed up.
    fn grant(&self, state: &mut State) {
        let now = Instant::now();
        let shadow = state.mode == ProtectMode::Shadow;
        while state.waiting > 0 && (shadow || state.in_flight < state.controller.limit()) {
            let limit = state.controller.limit();
            let standing = state.max_wait / STANDING_SHARE;
            // The standing rule is for the lowest priority waiting only: a higher one's
            // waiters are shed by their own max_wait alone (what must be shed goes lowest
            // first).
            let Some(at) = (0..state.queues.len())
                .rev()
                .find(|&at| !state.queues[at].is_empty())
            else {
                break;
            };
            let lowest = state.queues[..at].iter().all(VecDeque::is_empty);
            let queue = &mut state.queues[at];
            let backed_up = queue.len() >= limit;
            if backed_up
                && lowest
                && queue
                    .back()
                    .is_some_and(|newest| now.saturating_duration_since(newest.since) >= standing)
            {
                // Even the newest has waited this long: the queue is standing (every one in
                // it is older). The newest takes the slot (below): it is the least late, and
                // a slot left idle would only be lost goodput. Everyone older goes, shed by
                // their own futures reading the answer.
                let stale: Vec<Waiter> = queue.drain(..queue.len() - 1).collect();
                state.waiting -= stale.len();
                for waiter in stale {
                    let _ = waiter.answer.send(Turn::Shed);
                }
            }
            let waiter = if backed_up {
                queue.pop_back()
            } else {
                queue.pop_front()
            }
            .expect("not empty");
            state.waiting -= 1;
            if waiter.answer.send(Turn::Granted).is_ok() {
                // The slot passes to the waiter, counted from now.
                state.in_flight += 1;
                state.controller.started(now, state.in_flight);
            }
        }
        self.metrics.waiting.set(state.waiting as f64);
        self.metrics.in_flight.set(state.in_flight as f64);
    }

    /// Takes a waiter out of its queue; false when it was already answered.
    fn withdraw(&self, priority: Priority, id: u64) -> bool {
        let mut state = self.lock();
        let queue = &mut state.queues[priority.index()];
        match queue.iter().position(|w| w.id == id) {
            Some(at) => {
                queue.remove(at);
                state.waiting -= 1;
                self.metrics.waiting.set(state.waiting as f64);
                true
            }
            None => false,
        }
    }

    fn count_shed(&self, priority: Priority) {
        let mut state = self.lock();
        self.shed_now(&mut state, priority);
    }

    /// Counts a waiter's admission; returns the number in flight.
    fn count_admitted(&self, priority: Priority) -> usize {
        let mut state = self.lock();
        state.admitted[priority.index()] += 1;
        self.metrics.admitted[priority.index()].increment(1);
        state.in_flight
    }

    fn publish(&self, state: &State) {
        let reading = state.controller.reading();
        self.metrics.limit.set(state.controller.limit() as f64);
        if let Some(baseline) = reading.baseline {
            self.metrics.baseline_seconds.set(baseline.as_secs_f64());
        }
        if let Some(latency) = reading.latency {
            self.metrics.latency_seconds.set(latency.as_secs_f64());
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            mode: state.mode,
            max_wait: state.max_wait,
            reading: state.controller.reading(),
            settings: state.controller.settings(),
            limit: state.controller.limit(),
            in_flight: state.in_flight,
            waiting: state.waiting,
            admitted: state.admitted,
            shed: state.shed,
        }
    }
}

/// A place in the queue. Dropped before its answer is read (the client left), it leaves the
/// queue, or gives back the slot it was granted.
pub struct Ticket {
    protector: Arc<Protector>,
    priority: Priority,
    id: u64,
    max_wait: Duration,
    answer: Option<oneshot::Receiver<Turn>>,
}

impl Ticket {
    /// Waits for a slot, at most `max_wait`.
    pub async fn wait(mut self) -> Admission {
        let answer = self.answer.as_mut().expect("a fresh ticket");
        let turn = match tokio::time::timeout(self.max_wait, answer).await {
            Ok(turn) => turn.unwrap_or(Turn::Shed),
            // Out of time: leave the queue, unless the turn came just now.
            Err(_) if self.protector.withdraw(self.priority, self.id) => Turn::Shed,
            Err(_) => self
                .answer
                .as_mut()
                .and_then(|answer| answer.try_recv().ok())
                .unwrap_or(Turn::Shed),
        };
        // Answered: nothing to give back when the ticket goes.
        self.answer = None;
        match turn {
            Turn::Granted => {
                let concurrency = self.protector.count_admitted(self.priority);
                Admission::Admitted(Slot {
                    protector: Some(self.protector.clone()),
                    started: Instant::now(),
                    concurrency,
                    would_shed: false,
                })
            }
            Turn::Shed => {
                self.protector.count_shed(self.priority);
                Admission::Shed
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        if !self.protector.withdraw(self.priority, self.id)
            && answer.try_recv() == Ok(Turn::Granted)
        {
            self.protector.release(Instant::now(), 0, None);
        }
    }
}

/// A slot in front of the app, held from admission to the response head. Moves with the
/// exchange: whoever sees the head (or the failure) calls [`Slot::finish`]; dropped
/// unfinished (the exchange was abandoned) it is given back without a sample.
pub struct Slot {
    protector: Option<Arc<Protector>>,
    started: Instant,
    /// In flight when it was taken, itself included.
    concurrency: usize,
    /// Shadow mode: enforce would have shed this request.
    would_shed: bool,
}

impl Slot {
    /// Shadow mode: enforce would have shed this request (it is forwarded all the same).
    pub fn would_shed(&self) -> bool {
        self.would_shed
    }

    /// The exchange got its head (`status`) or failed (`None`: timeout, connection failure):
    /// the slot is free again and its time to head is a sample (a 5xx or a failure counts as
    /// an error).
    ///
    /// A switch of protocols (101) is no sample: the app only agreed to open a tunnel, and
    /// its quick answer says nothing of how long its work takes.
    pub fn finish(mut self, status: Option<http::StatusCode>) {
        let outcome = match status {
            Some(status) if status.is_informational() => None,
            Some(status) if !status.is_server_error() => Some(Sample::Answered),
            _ => Some(Sample::Failed),
        };
        if let Some(protector) = self.protector.take() {
            protector.release(self.started, self.concurrency, outcome);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(protector) = self.protector.take() {
            protector.release(self.started, self.concurrency, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LatencyTarget;

    fn protect(mode: ProtectMode, max_wait_ms: u64, min: u32, max: u32) -> Protect {
        Protect {
            mode,
            latency: LatencyTarget::Multiple(2.0),
            max_wait: Duration::from_millis(max_wait_ms),
            min_limit: min,
            max_limit: max,
        }
    }

    /// A protector whose limit is fixed at `limit` (min = max).
    fn fixed(limit: u32, max_wait_ms: u64) -> Arc<Protector> {
        Protector::new(
            &protect(ProtectMode::Enforce, max_wait_ms, limit, limit),
            ProtectMetrics::detached(),
        )
    }

    fn admitted(admission: Admission) -> Slot {
        match admission {
            Admission::Admitted(slot) => slot,
            Admission::Shed => panic!("shed"),
        }
    }

    /// Polls `future` once: its answer if it is ready.
    fn now_or_never<F: std::future::Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_is_held_until_the_head_and_waiters_are_served_by_priority() {
        let gate = fixed(2, 50);
        let first = admitted(gate.admit(Priority::Normal).await);
        let _second = admitted(gate.admit(Priority::Normal).await);
        assert_eq!(gate.snapshot().in_flight, 2);
        let low = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(Priority::Low).await }
        });
        tokio::task::yield_now().await;
        let high = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(Priority::High).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.snapshot().waiting, 2);
        first.finish(Some(http::StatusCode::OK));
        let high = admitted(high.await.unwrap());
        assert_eq!(gate.snapshot().waiting, 1, "low still waits");
        // Low waits its max_wait and is shed.
        assert!(matches!(low.await.unwrap(), Admission::Shed));
        assert_eq!(gate.snapshot().shed[Priority::Low.index()], 1);
        drop(high);
        assert_eq!(gate.snapshot().in_flight, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backed_up_queue_serves_the_newest_first_and_sheds_the_lowest_for_a_higher() {
        let gate = fixed(2, 1000);
        let waiter = |priority: Priority| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.admit(priority).await })
        };
        let a = admitted(gate.admit(Priority::Normal).await);
        let b = admitted(gate.admit(Priority::Normal).await);
        let low = waiter(Priority::Low);
        tokio::task::yield_now().await;
        let first_normal = waiter(Priority::Normal);
        tokio::task::yield_now().await;
        assert_eq!(gate.snapshot().waiting, 2);
        // Two waiting for a limit of two: backed up. A high arrival sheds the low one at once.
        let high = waiter(Priority::High);
        tokio::task::yield_now().await;
        assert!(matches!(low.await.unwrap(), Admission::Shed));
        assert_eq!(gate.snapshot().waiting, 2);
        // A slot frees: high goes first.
        a.finish(Some(http::StatusCode::OK));
        let high = admitted(high.await.unwrap());
        // Two normal waiting for a limit of two: backed up, so the newest goes first.
        let second_normal = waiter(Priority::Normal);
        tokio::task::yield_now().await;
        b.finish(Some(http::StatusCode::OK));
        let second = admitted(second_normal.await.unwrap());
        assert!(!first_normal.is_finished(), "the oldest still waits");
        drop(high);
        admitted(first_normal.await.unwrap());
        drop(second);
    }

    /// A backed-up queue is standing: when a slot frees and even its newest waiter has waited
    /// a tenth of `max_wait`, the newest is let in and everyone older is shed, not let in late;
    /// a waiter that has not waited that long is let in. (Real time: the gate reads the std
    /// clock.)
    #[tokio::test]
    async fn a_standing_queue_sheds_what_waited_too_long_when_its_turn_comes() {
        let gate = fixed(1, 1000);
        let spawn = || {
            let gate = gate.clone();
            tokio::spawn(async move { gate.admit(Priority::Normal).await })
        };
        let held = admitted(gate.admit(Priority::Normal).await);
        let oldest = spawn();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let newest = spawn();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(gate.snapshot().waiting, 2);
        drop(held);
        assert!(matches!(oldest.await.unwrap(), Admission::Shed));
        let newest = admitted(newest.await.unwrap());
        let snapshot = gate.snapshot();
        assert_eq!(snapshot.shed[Priority::Normal.index()], 1);
        assert_eq!((snapshot.waiting, snapshot.in_flight), (0, 1));
        // One waiting for a limit of one, but only just: let in when the slot frees.
        let fresh = spawn();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(newest);
        admitted(fresh.await.unwrap());
    }

    /// The standing rule sheds the lowest priority waiting, never a higher one while a lower
    /// one waits: a backed-up queue of high waiters is let in however long it waited.
    #[tokio::test]
    async fn a_standing_queue_of_a_higher_priority_is_let_in_while_a_lower_one_waits() {
        let gate = fixed(2, 1000);
        let first = admitted(gate.admit(Priority::Normal).await);
        let second = admitted(gate.admit(Priority::Normal).await);
        let spawn = |priority: Priority| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.admit(priority).await })
        };
        let high = [spawn(Priority::High), spawn(Priority::High)];
        tokio::time::sleep(Duration::from_millis(10)).await;
        let low = spawn(Priority::Low);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(gate.snapshot().waiting, 3);
        drop(first);
        drop(second);
        for high in high {
            drop(admitted(high.await.unwrap()));
        }
        admitted(low.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn critical_is_never_shed_to_make_room() {
        let gate = fixed(1, 1000);
        let _held = admitted(gate.admit(Priority::Normal).await);
        let critical = tokio::spawn({
            let gate = gate.clone();
            async move { matches!(gate.admit(Priority::Critical).await, Admission::Admitted(_)) }
        });
        tokio::task::yield_now().await;
        // Backed up (one waits for a limit of one); a second critical does not displace it.
        let second = tokio::spawn({
            let gate = gate.clone();
            async move { matches!(gate.admit(Priority::Critical).await, Admission::Admitted(_)) }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.snapshot().waiting, 2);
        assert_eq!(gate.snapshot().shed, [0; 4]);
        drop(_held);
        assert!(critical.await.unwrap() || second.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_client_left_gives_its_place_or_its_slot_back() {
        let gate = fixed(1, 1000);
        let held = admitted(gate.admit(Priority::Normal).await);
        // Polled once (queued), then dropped: it leaves the queue.
        assert!(now_or_never(gate.admit(Priority::Normal)).is_none());
        assert_eq!(gate.snapshot().waiting, 0);
        // Granted but never read: the slot comes back.
        let mut waiting = Box::pin(gate.admit(Priority::Normal));
        assert!(now_or_never(waiting.as_mut()).is_none());
        drop(held);
        assert_eq!(gate.snapshot().in_flight, 1, "passed to the waiter");
        drop(waiting);
        assert_eq!(gate.snapshot().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shadow_mode_never_waits_nor_sheds_and_counts_what_enforce_would_have() {
        let gate = Protector::new(
            &protect(ProtectMode::Shadow, 0, 2, 2),
            ProtectMetrics::detached(),
        );
        let slots: Vec<Slot> = (0..5)
            .map(|_| admitted(now_or_never(gate.admit(Priority::Low)).expect("no wait")))
            .collect();
        let snapshot = gate.snapshot();
        assert_eq!(snapshot.in_flight, 5);
        assert_eq!(
            snapshot.shed[Priority::Low.index()],
            3,
            "three over a limit of two"
        );
        drop(slots);
        assert_eq!(gate.snapshot().in_flight, 0);
    }
}
