//! The pure arithmetic of the six rate-limit algorithms: no I/O, no clock.
//!
//! Both stores run exactly this arithmetic: the memory store calls it directly and
//! `decide.lua` mirrors it line by line, so a route limited through Redis behaves exactly
//! like one limited in memory (the equivalence tests hold them equal step by step).
//! Everything is an integer number of microseconds or units, and every operation is chosen so
//! that Lua, which computes in doubles, gets bit-identical results: all intermediates stay
//! integers below [`MAX_SAFE`] (see [`params_fit`]), and every division is a floor division
//! of non-negative values.
//!
//! A state that is past its TTL (or missing) always behaves exactly like an idle key with a
//! full quota, so a store may keep a stale state a little longer (Redis rounds TTLs up to
//! milliseconds) or drop it early without any observable difference.

use std::collections::VecDeque;

use super::calendar::{self, Calendar};
use super::clock::Micros;

/// Lua numbers are doubles: integers are exact only below 2^53.
pub const MAX_SAFE: i64 = 1 << 53;

/// Bound on `max(limit, burst, cost) * period_us`.
///
/// The largest intermediate of any algorithm is a sum of two such products (the sliding-window
/// test `previous * (period - elapsed) + (current + cost) * period`), and absolute timestamps
/// (about 2^51 µs today) get at most two periods added, so 2^49 keeps everything below
/// [`MAX_SAFE`] with room to spare until roughly the year 2200.
pub const MAX_PRODUCT: i64 = 1 << 49;

/// The rate-limit algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    Gcra,
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in code order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::Concurrency,
    ];

    /// The name used in configuration and logs.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// The number `decide.lua` expects in its ARGV (keep in sync with the script's `ALGO_*`).
    pub fn code(self) -> u8 {
        match self {
            Algorithm::FixedWindow => 1,
            Algorithm::SlidingLog => 2,
            Algorithm::SlidingWindow => 3,
            Algorithm::TokenBucket => 4,
            Algorithm::Gcra => 5,
            Algorithm::Concurrency => 6,
        }
    }

    /// Inverse of [`Algorithm::name`].
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Inverse of [`Algorithm::code`].
    pub fn from_code(code: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.code() == code)
    }
}

/// One limit's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    pub algorithm: Algorithm,
    /// Units per period (concurrency: max units in flight).
    pub limit: u64,
    /// Window / refill period (concurrency: lease TTL).
    pub period_us: Micros,
    /// token_bucket capacity / gcra burst; equals `limit` for the others (and is ignored there).
    pub burst: u64,
    /// Units one request takes.
    pub cost: u64,
    /// fixed_window only: windows that turn on the calendar (`window:` with `timezone:`)
    /// instead of at multiples of the period; `period_us` is then the longest such window.
    pub calendar: Option<Calendar>,
}

/// What one limit says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// Quota to report (burst for token_bucket/gcra, limit otherwise).
    pub limit: u64,
    /// Units left after this request (if allowed) / now (if denied).
    pub remaining: u64,
    /// Until the state is back to a full quota (0 when already full).
    pub reset_after_us: Micros,
    /// Denied: until a lone retry of the same cost is admitted; -1 if it never can
    /// (cost > capacity). Allowed: 0.
    pub retry_after_us: Micros,
}

/// One concurrency lease held in a [`State::Concurrency`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSlot {
    pub id: u64,
    pub units: u64,
    pub expires_at: Micros,
}

/// The stored state of one key; the variant is the algorithm that wrote it.
///
/// A state of another algorithm than the one checking (a reconfigured route) counts as idle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// `window = now / period`; `count` units taken in it.
    FixedWindow { window: i64, count: u64 },
    /// One entry per admitted unit (its admission time), oldest first.
    SlidingLog { entries: VecDeque<Micros> },
    /// Units taken in window `window` (`current`) and in the one before (`previous`).
    SlidingWindow {
        window: i64,
        current: u64,
        previous: u64,
    },
    /// Tokens scaled by `period_us`, as of `updated_at`.
    TokenBucket { scaled: i64, updated_at: Micros },
    /// Theoretical arrival time.
    Gcra { tat: Micros },
    /// Leases in flight (expired ones are dropped on every check).
    Concurrency { leases: Vec<LeaseSlot> },
    /// A block marker (`block_for`): the caller is refused until `until` (see [`penalty_box`]).
    Blocked { until: Micros },
}

/// The outcome of one check: what to report, and what to store (for how long) if committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub verdict: Verdict,
    /// The state to store if the decision commits. Meaningless when denied (not stored).
    pub state: State,
    /// How long the store must keep `state`; `<= 0` means the state is idle and may be deleted.
    pub ttl: Micros,
}

/// True when `params` are usable: positive limit, burst and period, a gcra emission interval of
/// at least 1 µs, and every product an algorithm forms at most `MAX_PRODUCT`, so that the Lua
/// mirror stays exact (Lua numbers are doubles, exact below [`MAX_SAFE`]). Only token_bucket
/// and sliding_window multiply units by the period; a daily fixed_window of millions is fine.
pub fn params_fit(p: &Params) -> bool {
    let units = p.limit.max(p.burst).max(p.cost) as i128;
    let period = p.period_us as i128;
    let bounded = match p.algorithm {
        // These scale units by the period (tokens in period-units; the weighted previous window).
        Algorithm::TokenBucket | Algorithm::SlidingWindow => units * period <= MAX_PRODUCT as i128,
        // DVT = T * burst and increment = T * cost, with T = period / limit.
        Algorithm::Gcra => {
            p.period_us as u64 >= p.limit
                && (period / p.limit.max(1) as i128) * units <= MAX_PRODUCT as i128
        }
        // Counts and timestamps only.
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::Concurrency => {
            units <= MAX_PRODUCT as i128 && period <= MAX_PRODUCT as i128
        }
    };
    p.limit >= 1 && p.burst >= 1 && p.period_us >= 1 && bounded
}

/// Checks one request against one limit. `lease` is the unique lease id the request gets if a
/// concurrency limit admits it (ignored by the other algorithms).
pub fn step_for(params: &Params, state: Option<&State>, now: Micros, lease: u64) -> Step {
    debug_assert!(params_fit(params), "params out of range: {params:?}");
    let (verdict, state, ttl) = match params.algorithm {
        Algorithm::FixedWindow => fixed_window(params, state, now),
        Algorithm::SlidingLog => sliding_log(params, state, now),
        Algorithm::SlidingWindow => sliding_window(params, state, now),
        Algorithm::TokenBucket => token_bucket(params, state, now),
        Algorithm::Gcra => gcra(params, state, now),
        Algorithm::Concurrency => concurrency(params, state, now, lease),
    };
    Step {
        verdict,
        state,
        ttl,
    }
}

/// Removes a concurrency lease (a no-op for other states or unknown ids).
pub fn release(state: &mut State, lease: u64) {
    if let State::Concurrency { leases } = state {
        leases.retain(|l| l.id != lease);
    }
}

/// Extends a live concurrency lease to `now + params.period_us` (for long requests).
///
/// Returns the state's new TTL, or `None` when the lease is unknown or already expired
/// (it cannot be revived: its slot may have been given away).
pub fn refresh(state: &mut State, lease: u64, params: &Params, now: Micros) -> Option<Micros> {
    let State::Concurrency { leases } = state else {
        return None;
    };
    let slot = leases
        .iter_mut()
        .find(|l| l.id == lease && l.expires_at > now)?;
    slot.expires_at = now + params.period_us;
    leases.iter().map(|l| l.expires_at - now).max()
}

/// `block_for` (the penalty box) applied to one limit's verdict; `decide.lua` mirrors it in its
/// `@block` section.
///
/// `blocked_until` is the end of a block stored for this limit's key, if any. While it is in
/// the future the limit denies whatever the algorithm said (the algorithm's state is not
/// consumed: the decision is denied). Otherwise a denial by the algorithm itself starts a block
/// of `block_us`: the returned end is to be stored (even though the decision is denied). A
/// blocked verdict reports nothing left, and a retry (and reset) no earlier than the block's
/// end, or later if the algorithm itself needs longer; a retry of -1 (never, at this cost)
/// stays. `block_us <= 0` (no `block_for`) leaves the verdict alone.
pub fn penalty_box(
    verdict: Verdict,
    blocked_until: Option<Micros>,
    block_us: Micros,
    now: Micros,
) -> (Verdict, Option<Micros>) {
    if block_us <= 0 {
        return (verdict, None);
    }
    let (left, start) = match blocked_until {
        Some(until) if until > now => (until - now, None),
        _ if !verdict.allowed => (block_us, Some(now + block_us)),
        _ => return (verdict, None),
    };
    let retry = if !verdict.allowed && verdict.retry_after_us < 0 {
        -1
    } else {
        verdict.retry_after_us.max(left)
    };
    let blocked = Verdict {
        allowed: false,
        limit: verdict.limit,
        remaining: 0,
        reset_after_us: verdict.reset_after_us.max(left),
        retry_after_us: retry,
    };
    (blocked, start)
}

/// Ceiling division for `a >= 0`, `b > 0` (same expression in Lua).
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn verdict(
    allowed: bool,
    limit: u64,
    remaining: i64,
    reset_after_us: Micros,
    retry_after_us: Micros,
) -> Verdict {
    Verdict {
        allowed,
        limit,
        remaining: remaining.max(0) as u64,
        reset_after_us,
        retry_after_us: if allowed { 0 } else { retry_after_us },
    }
}

/// At most `limit` units per window; windows aligned to multiples of the period, or turning
/// on the calendar (see [`calendar`]).
pub fn fixed_window(p: &Params, state: Option<&State>, now: Micros) -> (Verdict, State, Micros) {
    let (window, end) = match &p.calendar {
        Some(c) => calendar::window(c, now),
        None => {
            let window = now / p.period_us;
            (window, (window + 1) * p.period_us)
        }
    };
    fixed_window_in(p, state, now, window, end)
}

/// [`fixed_window`] in a given window: `window` identifies it in the state (its index for a
/// period, its start instant for a calendar window, so a new window is a new count) and it
/// ends at `end` (> `now`). `decide.lua` mirrors this with the window it picks itself.
pub fn fixed_window_in(
    p: &Params,
    state: Option<&State>,
    now: Micros,
    window: i64,
    end: Micros,
) -> (Verdict, State, Micros) {
    let (limit, cost) = (p.limit as i64, p.cost as i64);
    let count = match state {
        Some(State::FixedWindow { window: w, count }) if *w == window => *count as i64,
        _ => 0,
    };
    let allowed = count + cost <= limit;
    let after = if allowed { count + cost } else { count };
    let reset = if after > 0 { end - now } else { 0 };
    let retry = if cost > limit { -1 } else { end - now };
    (
        verdict(allowed, p.limit, limit - after, reset, retry),
        State::FixedWindow {
            window,
            count: after as u64,
        },
        end - now,
    )
}

/// At most `limit` units in any trailing period, exactly; one log entry per unit.
pub fn sliding_log(p: &Params, state: Option<&State>, now: Micros) -> (Verdict, State, Micros) {
    let (limit, period, cost) = (p.limit as i64, p.period_us, p.cost as i64);
    let mut entries = match state {
        Some(State::SlidingLog { entries }) => entries.clone(),
        _ => VecDeque::new(),
    };
    // An entry at t counts while now < t + period.
    while entries.front().is_some_and(|&t| t <= now - period) {
        entries.pop_front();
    }
    let count = entries.len() as i64;
    let allowed = count + cost <= limit;
    let mut retry = -1;
    if allowed {
        // Keep the log sorted even if the clock stepped back.
        let at = entries.partition_point(|&t| t <= now);
        for _ in 0..cost {
            entries.insert(at, now);
        }
    } else if cost <= limit {
        // The oldest `count + cost - limit` entries must leave first.
        let j = (count + cost - limit) as usize;
        retry = entries[j - 1] + period - now;
    }
    let after = entries.len() as i64;
    let reset = match entries.back() {
        Some(&newest) if after > 0 => newest + period - now,
        _ => 0,
    };
    (
        verdict(allowed, p.limit, limit - after, reset, retry),
        State::SlidingLog { entries },
        reset,
    )
}

/// Cloudflare's estimate `previous * (period - elapsed) / period + current`, decided exactly in
/// integers by multiplying through by the period.
pub fn sliding_window(p: &Params, state: Option<&State>, now: Micros) -> (Verdict, State, Micros) {
    let (limit, period, cost) = (p.limit as i64, p.period_us, p.cost as i64);
    let window = now / period;
    let elapsed = now - window * period;
    let (previous, current) = sliding_counts(state, window).unwrap_or((0, 0));
    // The first test keeps the products bounded (and alone decides most denials).
    let allowed = current + cost <= limit
        && previous * (period - elapsed) + (current + cost) * period <= limit * period;
    let after = if allowed { current + cost } else { current };
    let left = limit * period - previous * (period - elapsed) - after * period;
    let remaining = if left > 0 { left / period } else { 0 };
    let reset = if after > 0 {
        2 * period - elapsed
    } else if previous > 0 {
        period - elapsed
    } else {
        0
    };
    let mut retry = -1;
    if !allowed && cost <= limit {
        // Still in this window, once previous' weight has shrunk enough:
        // previous * (period - e) <= (limit - current - cost) * period.
        if current + cost <= limit && previous > 0 {
            let allowance = (limit - current - cost) * period / previous;
            let e = (period - allowance).max(elapsed);
            if e < period {
                retry = e - elapsed;
            }
        }
        // Otherwise in the next window, where current becomes previous:
        // current * (period - e) <= (limit - cost) * period (e == period: the window after).
        if retry < 0 {
            let e = if current > 0 {
                (period - (limit - cost) * period / current).max(0)
            } else {
                0
            };
            retry = period - elapsed + e;
        }
    }
    (
        verdict(allowed, p.limit, remaining, reset, retry),
        State::SlidingWindow {
            window,
            current: after as u64,
            previous: previous as u64,
        },
        2 * period - elapsed,
    )
}

/// `burst` tokens refilled continuously at `limit` per period; tokens are kept scaled by the
/// period so the refill is exact in integers.
pub fn token_bucket(p: &Params, state: Option<&State>, now: Micros) -> (Verdict, State, Micros) {
    let (limit, period, cost, burst) = (p.limit as i64, p.period_us, p.cost as i64, p.burst as i64);
    let cap = burst * period;
    let (mut scaled, mut updated_at) = (cap, now);
    if let Some(State::TokenBucket {
        scaled: s,
        updated_at: u,
    }) = state
    {
        // A clock that stepped back refills nothing (and must not refill twice later).
        let elapsed = (now - *u).max(0);
        updated_at = now.max(*u);
        let missing = cap - *s;
        // Comparing against the time to full first keeps `elapsed * limit` bounded.
        if missing <= 0 || elapsed >= ceil_div(missing, limit) {
            scaled = cap;
        } else {
            scaled = *s + elapsed * limit;
        }
    }
    let mut retry = -1;
    let allowed = cost <= burst && scaled >= cost * period;
    if allowed {
        scaled -= cost * period;
    } else if cost <= burst {
        retry = ceil_div(cost * period - scaled, limit);
    }
    let reset = ceil_div(cap - scaled, limit);
    (
        verdict(allowed, p.burst, scaled / period, reset, retry),
        State::TokenBucket { scaled, updated_at },
        reset,
    )
}

/// redis-cell's CL.THROTTLE arithmetic (max_burst = burst - 1).
pub fn gcra(p: &Params, state: Option<&State>, now: Micros) -> (Verdict, State, Micros) {
    let (limit, period, cost, burst) = (p.limit as i64, p.period_us, p.cost as i64, p.burst as i64);
    let interval = period / limit;
    let dvt = interval * burst;
    let increment = interval * cost;
    // A stale tat (before now) is an idle key.
    let tat = match state {
        Some(State::Gcra { tat }) => (*tat).max(now),
        _ => now,
    };
    let new_tat = tat + increment;
    let allow_at = new_tat - dvt;
    let diff = now - allow_at;
    let (allowed, ttl, retry, stored) = if diff < 0 {
        let retry = if increment <= dvt { -diff } else { -1 };
        (false, tat - now, retry, tat)
    } else {
        (true, new_tat - now, 0, new_tat)
    };
    let next = dvt - ttl;
    let remaining = if next > 0 { next / interval } else { 0 };
    (
        verdict(allowed, p.burst, remaining, ttl, retry),
        State::Gcra { tat: stored },
        ttl,
    )
}

/// At most `limit` units in flight, each request holding a lease that expires after the period
/// unless released (or refreshed) first.
pub fn concurrency(
    p: &Params,
    state: Option<&State>,
    now: Micros,
    lease: u64,
) -> (Verdict, State, Micros) {
    let (limit, period, cost) = (p.limit as i64, p.period_us, p.cost as i64);
    let mut leases: Vec<LeaseSlot> = match state {
        Some(State::Concurrency { leases }) => leases
            .iter()
            .filter(|l| l.expires_at > now)
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let count: i64 = leases.iter().map(|l| l.units as i64).sum();
    let allowed = count + cost <= limit;
    let mut retry = -1;
    if allowed {
        leases.push(LeaseSlot {
            id: lease,
            units: p.cost,
            expires_at: now + period,
        });
    } else if cost <= limit {
        // A lower bound when several leases must go, an upper one if a release comes first.
        retry = leases.iter().map(|l| l.expires_at).min().unwrap_or(now) - now;
    }
    let after = if allowed { count + cost } else { count };
    let ttl = leases.iter().map(|l| l.expires_at).max().unwrap_or(now) - now;
    (
        verdict(allowed, p.limit, limit - after, 0, retry),
        State::Concurrency { leases },
        ttl,
    )
}

/// What a settlement does to one limit once the response is known (see [`settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Give back `amount` units that the decision at `taken_at` (the store's clock) took: the
    /// response did not count (`count_statuses`), or it cost less than was paid up front.
    Refund { amount: u64, taken_at: Micros },
    /// Take `amount` more units now, even past the limit: the response reported a cost above
    /// what was paid up front (`cost_from_response`). The caller is then in debt and refused
    /// until time has repaid it.
    Charge { amount: u64 },
}

/// Units per period below which a sliding_window count must stay: with `current * period` at
/// most 2^51, the check's sum of two products stays below [`MAX_SAFE`] (see [`params_fit`]).
fn sliding_window_cap(period: Micros) -> i64 {
    (MAX_SAFE / 4) / period
}

/// The token_bucket refill of [`token_bucket`], as a function for the settlements (the check
/// keeps its own inline copy: same arithmetic).
fn refill(p: &Params, state: Option<&State>, now: Micros) -> (i64, Micros) {
    let (limit, period, burst) = (p.limit as i64, p.period_us, p.burst as i64);
    let cap = burst * period;
    match state {
        Some(State::TokenBucket { scaled, updated_at }) => {
            let elapsed = (now - *updated_at).max(0);
            let missing = cap - *scaled;
            let scaled = if missing <= 0 || elapsed >= ceil_div(missing, limit) {
                cap
            } else {
                *scaled + elapsed * limit
            };
            (scaled, now.max(*updated_at))
        }
        _ => (cap, now),
    }
}

/// Applies a settlement to one limit's state at `now`: the state to store and for how long
/// (`<= 0`: delete it), or `None` when there is nothing to write (nothing left to give back,
/// a state of another algorithm, or an algorithm the settlement does not apply to).
///
/// The same contract as [`step_for`] holds: a state past its TTL settles exactly like no state,
/// so the stores may drop it early or keep it late. Every amount is capped so that the Lua
/// mirror stays exact, and so is every debt (token_bucket: `MAX_PRODUCT` scaled tokens; gcra:
/// a TAT `MAX_PRODUCT` µs ahead; fixed_window: `MAX_PRODUCT` units; sliding_window: 2^51 /
/// period units), far beyond any real overdraft.
pub fn settle(
    p: &Params,
    state: Option<&State>,
    now: Micros,
    op: Settle,
) -> Option<(State, Micros)> {
    // Validation refuses settlements on calendar windows (settle.lua has no turns to pick
    // from); nothing is written rather than a wrong window.
    if p.calendar.is_some() {
        return None;
    }
    match op {
        Settle::Refund { amount, taken_at } => refund(p, state, now, taken_at, amount),
        Settle::Charge { amount } => charge(p, state, now, amount),
    }
}

/// Gives back `amount` units taken at `taken_at`, where the algorithm can tell them apart:
/// fixed_window into the window they were taken from while it is current; sliding_window
/// into the current or the previous window, whichever they were taken in; sliding_log by
/// removing entries at `taken_at`; token_bucket as tokens (capped at the burst); gcra by
/// moving the TAT back (never before now). Concurrency returns its slot by itself (release).
pub fn refund(
    p: &Params,
    state: Option<&State>,
    now: Micros,
    taken_at: Micros,
    amount: u64,
) -> Option<(State, Micros)> {
    let period = p.period_us;
    let amount = amount.min(MAX_PRODUCT as u64) as i64;
    match p.algorithm {
        Algorithm::FixedWindow => {
            let window = now / period;
            let Some(State::FixedWindow { window: w, count }) = state else {
                return None;
            };
            if *w != window || taken_at / period != window {
                return None;
            }
            let count = (*count as i64 - amount).max(0);
            Some((
                State::FixedWindow {
                    window,
                    count: count as u64,
                },
                (window + 1) * period - now,
            ))
        }
        Algorithm::SlidingWindow => refund_sliding_window(period, state, now, taken_at, amount),
        Algorithm::SlidingLog => refund_sliding_log(period, state, now, taken_at, amount),
        Algorithm::TokenBucket => {
            let Some(State::TokenBucket { .. }) = state else {
                return None;
            };
            let (limit, burst) = (p.limit as i64, p.burst as i64);
            let cap = burst * period;
            let (scaled, updated_at) = refill(p, state, now);
            let back = amount.min(MAX_PRODUCT / period) * period;
            let scaled = (scaled + back).min(cap);
            Some((
                State::TokenBucket { scaled, updated_at },
                ceil_div(cap - scaled, limit),
            ))
        }
        Algorithm::Gcra => {
            let Some(State::Gcra { tat }) = state else {
                return None;
            };
            let interval = period / p.limit as i64;
            let tat = (*tat).max(now);
            let tat = (tat - amount.min(MAX_PRODUCT / interval) * interval).max(now);
            Some((State::Gcra { tat }, tat - now))
        }
        Algorithm::Concurrency => None,
    }
}

/// A sliding window's (previous, current) counts as seen in `window`: the stored window's, or
/// its current count as the previous one when a window has passed since; None when older.
fn sliding_counts(state: Option<&State>, window: Micros) -> Option<(i64, i64)> {
    match state {
        Some(State::SlidingWindow {
            window: w,
            current,
            previous,
        }) if *w == window => Some((*previous as i64, *current as i64)),
        Some(State::SlidingWindow {
            window: w, current, ..
        }) if *w == window - 1 => Some((*current as i64, 0)),
        _ => None,
    }
}

/// A sliding window's state as stored after a change in `window`, with its expiry: the
/// current count is still needed as the previous one until the next window ends.
fn sliding_stored(
    window: Micros,
    previous: i64,
    current: i64,
    period: Micros,
    elapsed: Micros,
) -> (State, Micros) {
    (
        State::SlidingWindow {
            window,
            current: current as u64,
            previous: previous as u64,
        },
        2 * period - elapsed,
    )
}

/// [`refund`] on a sliding_window: into the current or the previous window, whichever the
/// units were taken in (`amount` already capped).
fn refund_sliding_window(
    period: Micros,
    state: Option<&State>,
    now: Micros,
    taken_at: Micros,
    amount: i64,
) -> Option<(State, Micros)> {
    let window = now / period;
    let elapsed = now - window * period;
    let (mut previous, mut current) = sliding_counts(state, window)?;
    let taken = taken_at / period;
    if taken == window {
        current = (current - amount).max(0);
    } else if taken == window - 1 {
        previous = (previous - amount).max(0);
    } else {
        return None;
    }
    Some(sliding_stored(window, previous, current, period, elapsed))
}

/// [`refund`] on a sliding_log: removes up to `amount` entries taken at `taken_at`.
fn refund_sliding_log(
    period: Micros,
    state: Option<&State>,
    now: Micros,
    taken_at: Micros,
    amount: i64,
) -> Option<(State, Micros)> {
    let Some(State::SlidingLog { entries }) = state else {
        return None;
    };
    if taken_at <= now - period {
        return None;
    }
    let mut entries = entries.clone();
    let mut left = amount;
    while left > 0 {
        match entries.iter().rposition(|&t| t == taken_at) {
            Some(i) => {
                entries.remove(i);
                left -= 1;
            }
            None => break,
        }
    }
    let ttl = entries.back().map_or(0, |&newest| newest + period - now);
    Some((State::SlidingLog { entries }, ttl))
}

/// Takes `amount` more units now, past the limit if need be (a debt, capped as [`settle`]
/// says): fixed_window and sliding_window count them in the current window, token_bucket
/// takes the tokens (the balance may go below zero), gcra moves the TAT forward. The next
/// check then refuses until the debt is repaid by time, and its retry time is exactly when.
pub fn charge(
    p: &Params,
    state: Option<&State>,
    now: Micros,
    amount: u64,
) -> Option<(State, Micros)> {
    let period = p.period_us;
    let amount = amount.min(MAX_PRODUCT as u64) as i64;
    match p.algorithm {
        Algorithm::FixedWindow => {
            let window = now / period;
            let count = match state {
                Some(State::FixedWindow { window: w, count }) if *w == window => *count as i64,
                _ => 0,
            };
            let count = (count + amount).min(MAX_PRODUCT);
            Some((
                State::FixedWindow {
                    window,
                    count: count as u64,
                },
                (window + 1) * period - now,
            ))
        }
        Algorithm::SlidingWindow => {
            let window = now / period;
            let elapsed = now - window * period;
            let (previous, current) = sliding_counts(state, window).unwrap_or((0, 0));
            let cap = sliding_window_cap(period);
            let current = (current + amount.min(cap)).min(cap);
            Some(sliding_stored(window, previous, current, period, elapsed))
        }
        Algorithm::TokenBucket => {
            let (limit, burst) = (p.limit as i64, p.burst as i64);
            let cap = burst * period;
            let (scaled, updated_at) = refill(p, state, now);
            let take = amount.min(MAX_PRODUCT / period) * period;
            let scaled = (scaled - take).max(-MAX_PRODUCT);
            Some((
                State::TokenBucket { scaled, updated_at },
                ceil_div(cap - scaled, limit),
            ))
        }
        Algorithm::Gcra => {
            let interval = period / p.limit as i64;
            let tat = match state {
                Some(State::Gcra { tat }) => (*tat).max(now),
                _ => now,
            };
            let tat = (tat + amount.min(MAX_PRODUCT / interval) * interval).min(now + MAX_PRODUCT);
            Some((State::Gcra { tat }, tat - now))
        }
        Algorithm::SlidingLog | Algorithm::Concurrency => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Micros = 1_000_000;
    /// Far from 0 so window alignment is exercised on realistic clock values.
    const T0: Micros = 1_700_000_000 * SEC;

    fn params(
        algorithm: Algorithm,
        limit: u64,
        period_us: Micros,
        burst: u64,
        cost: u64,
    ) -> Params {
        Params {
            algorithm,
            limit,
            period_us,
            burst,
            cost,
            calendar: None,
        }
    }

    fn verdict(allowed: bool, remaining: u64, reset: Micros, retry: Micros) -> Verdict {
        Verdict {
            allowed,
            limit: 5,
            remaining,
            reset_after_us: reset,
            retry_after_us: retry,
        }
    }

    #[test]
    fn a_denial_starts_a_block_that_denies_until_its_end() {
        let block = 600 * SEC;
        // No block_for: nothing changes.
        let denied = verdict(false, 0, 30 * SEC, 10 * SEC);
        assert_eq!(penalty_box(denied, None, 0, T0), (denied, None));
        // Allowed and not blocked: nothing changes.
        let allowed = verdict(true, 4, 60 * SEC, 0);
        assert_eq!(penalty_box(allowed, None, block, T0), (allowed, None));
        // A denial starts a block: retry and reset say when it ends.
        assert_eq!(
            penalty_box(denied, None, block, T0),
            (verdict(false, 0, block, block), Some(T0 + block))
        );
        // While blocked, whatever the algorithm says, the limit denies until the end; the
        // block is not extended.
        let until = T0 + block;
        assert_eq!(
            penalty_box(allowed, Some(until), block, T0 + 100 * SEC),
            (verdict(false, 0, 500 * SEC, 500 * SEC), None)
        );
        // An algorithm that needs longer than the block says so.
        let long = verdict(false, 1, 900 * SEC, 700 * SEC);
        assert_eq!(
            penalty_box(long, Some(until), block, T0 + 100 * SEC),
            (verdict(false, 0, 900 * SEC, 700 * SEC), None)
        );
        // Never (cost above capacity) stays never.
        let never = verdict(false, 5, 0, -1);
        assert_eq!(
            penalty_box(never, None, block, T0),
            (verdict(false, 0, block, -1), Some(T0 + block))
        );
        // A block that has ended is gone; only a new denial starts another.
        assert_eq!(
            penalty_box(allowed, Some(until), block, until),
            (allowed, None)
        );
        assert_eq!(
            penalty_box(denied, Some(until), block, until),
            (verdict(false, 0, block, block), Some(until + block))
        );
    }

    /// A one-key store: commits allowed steps, forgets states past their TTL.
    struct Key {
        p: Params,
        state: Option<(State, Micros)>,
        lease: u64,
    }

    impl Key {
        fn new(p: Params) -> Key {
            Key {
                p,
                state: None,
                lease: 0,
            }
        }

        fn live(&self, now: Micros) -> Option<&State> {
            match &self.state {
                Some((s, exp)) if *exp > now => Some(s),
                _ => None,
            }
        }

        fn peek(&self, cost: u64, now: Micros) -> Step {
            let p = Params { cost, ..self.p };
            step_for(&p, self.live(now), now, self.lease + 1)
        }

        fn hit(&mut self, cost: u64, now: Micros) -> Verdict {
            let step = self.peek(cost, now);
            // Whatever the store evicts must be indistinguishable from what it keeps.
            if let Some((stale, _)) = &self.state {
                if self.live(now).is_none() {
                    let p = Params { cost, ..self.p };
                    assert_eq!(step_for(&p, Some(stale), now, self.lease + 1), step);
                }
            }
            if step.verdict.allowed {
                self.lease += 1;
                self.state = (step.ttl > 0).then(|| (step.state.clone(), now + step.ttl));
                if step.ttl <= 0 {
                    let p = Params { cost, ..self.p };
                    let idle = step_for(&p, None, now, 7);
                    let kept = step_for(&p, Some(&step.state), now, 7);
                    assert_eq!(idle, kept, "a state with ttl <= 0 must be idle");
                }
            }
            step.verdict
        }

        /// The retry-after contract: a lone retry passes exactly then, not a microsecond sooner.
        fn assert_retry_exact(&self, cost: u64, now: Micros) {
            let v = self.peek(cost, now).verdict;
            assert!(!v.allowed);
            if v.retry_after_us < 0 {
                assert!(
                    !self
                        .peek(cost, now + 1000 * self.p.period_us)
                        .verdict
                        .allowed
                );
                return;
            }
            assert!(v.retry_after_us > 0);
            assert!(
                self.peek(cost, now + v.retry_after_us).verdict.allowed,
                "not admitted after retry_after {v:?}"
            );
            assert!(!self.peek(cost, now + v.retry_after_us - 1).verdict.allowed);
        }
    }

    // ---- algorithm names and codes ----

    #[test]
    fn names_and_codes_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
        }
        assert_eq!(Algorithm::FixedWindow.name(), "fixed_window");
        assert_eq!(Algorithm::from_name("nope"), None);
    }

    #[test]
    fn params_fit_bounds() {
        let ok = params(Algorithm::TokenBucket, 100, 60 * SEC, 200, 1);
        assert!(params_fit(&ok));
        assert!(!params_fit(&Params { limit: 0, ..ok }));
        assert!(!params_fit(&Params { burst: 0, ..ok }));
        assert!(!params_fit(&Params { period_us: 0, ..ok }));
        assert!(!params_fit(&Params {
            burst: 1 << 40,
            ..ok
        }));
        assert!(!params_fit(&Params {
            cost: 1 << 40,
            ..ok
        }));
        assert!(params_fit(&Params {
            period_us: 1,
            limit: 1,
            burst: MAX_PRODUCT as u64,
            cost: 1,
            ..ok
        }));
        // Counting algorithms never multiply by the period: a large daily quota fits.
        let daily = params(
            Algorithm::FixedWindow,
            10_000_000,
            86_400 * SEC,
            10_000_000,
            1,
        );
        assert!(params_fit(&daily));
        assert!(params_fit(&Params {
            algorithm: Algorithm::SlidingLog,
            ..daily
        }));
        assert!(!params_fit(&Params {
            algorithm: Algorithm::SlidingWindow,
            ..daily
        }));
        // gcra needs an emission interval of at least 1 µs.
        let g = params(Algorithm::Gcra, 10, 9, 1, 1);
        assert!(!params_fit(&g));
        assert!(params_fit(&Params { period_us: 10, ..g }));
    }

    // ---- fixed_window ----

    #[test]
    fn fixed_window_counts_per_aligned_window() {
        let mut k = Key::new(params(Algorithm::FixedWindow, 3, 10 * SEC, 3, 1));
        let start = T0 + 4 * SEC; // T0 is aligned: window ends at T0 + 10 s
        for i in 0..3 {
            let v = k.hit(1, start + i);
            assert!(v.allowed);
            assert_eq!(v.remaining, 2 - i as u64);
            assert_eq!(v.reset_after_us, 6 * SEC - i);
            assert_eq!(v.limit, 3);
        }
        let v = k.hit(1, start + 5);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after_us, 6 * SEC - 5);
        assert_eq!(v.reset_after_us, 6 * SEC - 5);
        k.assert_retry_exact(1, start + 5);
        // Window edge: the last microsecond of the window is still full, the next one is new.
        assert!(!k.hit(1, T0 + 10 * SEC - 1).allowed);
        assert!(k.hit(1, T0 + 10 * SEC).allowed);
    }

    #[test]
    fn fixed_window_ttl_and_cost() {
        let p = params(Algorithm::FixedWindow, 5, 10 * SEC, 5, 2);
        let step = step_for(&p, None, T0 + 3 * SEC, 0);
        assert_eq!(step.ttl, 7 * SEC);
        assert_eq!(
            step.state,
            State::FixedWindow {
                window: (T0 + 3 * SEC) / (10 * SEC),
                count: 2
            }
        );
        let mut k = Key::new(p);
        assert!(k.hit(2, T0).allowed);
        assert!(k.hit(2, T0).allowed);
        let v = k.hit(2, T0);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 1);
        assert!(k.hit(1, T0).allowed);
    }

    #[test]
    fn fixed_window_cost_above_limit_never_passes() {
        let k = Key::new(params(Algorithm::FixedWindow, 3, SEC, 3, 4));
        let v = k.peek(4, T0);
        assert!(!v.verdict.allowed);
        assert_eq!(v.verdict.retry_after_us, -1);
        assert_eq!(v.verdict.remaining, 3);
        assert_eq!(v.verdict.reset_after_us, 0);
        k.assert_retry_exact(4, T0);
    }

    // ---- sliding_log ----

    #[test]
    fn sliding_log_is_exact_over_trailing_period() {
        let mut k = Key::new(params(Algorithm::SlidingLog, 3, 10 * SEC, 3, 1));
        assert!(k.hit(1, T0).allowed);
        assert!(k.hit(1, T0 + 2 * SEC).allowed);
        let v = k.hit(1, T0 + 4 * SEC);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.reset_after_us, 10 * SEC); // newest + period - now
        let v = k.hit(1, T0 + 5 * SEC);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 5 * SEC); // the entry at T0 leaves at T0 + 10 s
        k.assert_retry_exact(1, T0 + 5 * SEC);
        // An entry at t counts while now < t + period.
        assert!(!k.hit(1, T0 + 10 * SEC - 1).allowed);
        assert!(k.hit(1, T0 + 10 * SEC).allowed);
        assert!(!k.hit(1, T0 + 10 * SEC).allowed);
    }

    #[test]
    fn sliding_log_same_microsecond_counts_twice() {
        let mut k = Key::new(params(Algorithm::SlidingLog, 2, SEC, 2, 1));
        assert!(k.hit(1, T0).allowed);
        assert!(k.hit(1, T0).allowed);
        assert!(!k.hit(1, T0).allowed);
        match &k.state {
            Some((State::SlidingLog { entries }, _)) => assert_eq!(entries.len(), 2),
            other => panic!("unexpected state {other:?}"),
        }
    }

    #[test]
    fn sliding_log_retry_waits_for_enough_entries() {
        let mut k = Key::new(params(Algorithm::SlidingLog, 4, 10 * SEC, 4, 1));
        assert!(k.hit(1, T0).allowed);
        assert!(k.hit(1, T0 + SEC).allowed);
        assert!(k.hit(2, T0 + 2 * SEC).allowed);
        // cost 3 needs 3 entries gone: the third oldest is at T0 + 2 s.
        let v = k.hit(3, T0 + 3 * SEC);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 9 * SEC);
        assert_eq!(v.reset_after_us, 9 * SEC);
        k.assert_retry_exact(3, T0 + 3 * SEC);
        k.assert_retry_exact(1, T0 + 3 * SEC);
        let v = k.peek(5, T0 + 3 * SEC).verdict;
        assert_eq!(v.retry_after_us, -1);
        let step = k.peek(1, T0 + 20 * SEC);
        assert_eq!(step.ttl, 10 * SEC);
    }

    // ---- sliding_window ----

    #[test]
    fn sliding_window_weighs_previous_window() {
        let p = params(Algorithm::SlidingWindow, 10, 10 * SEC, 10, 1);
        let mut k = Key::new(p);
        for _ in 0..10 {
            assert!(k.hit(1, T0 + SEC).allowed);
        }
        assert!(!k.hit(1, T0 + 2 * SEC).allowed);
        // Half-way through the next window, previous weighs 5: 5 more pass.
        let mid = T0 + 15 * SEC;
        for i in 0..5 {
            let v = k.hit(1, mid);
            assert!(v.allowed, "request {i}");
            assert_eq!(v.remaining, 4 - i);
        }
        let v = k.hit(1, mid);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        // 10 * (10 - e) <= (10 - 5 - 1) * 10  <=>  e >= 6 s into the window.
        assert_eq!(v.retry_after_us, SEC);
        k.assert_retry_exact(1, mid);
        // Current window holds 5: needed as "previous" until the end of the next window.
        let step = k.peek(1, mid);
        assert_eq!(step.ttl, 15 * SEC);
        assert_eq!(v.reset_after_us, 15 * SEC);
    }

    #[test]
    fn sliding_window_remaining_is_floored() {
        let p = params(Algorithm::SlidingWindow, 10, 10 * SEC, 10, 1);
        let mut k = Key::new(p);
        for _ in 0..3 {
            assert!(k.hit(1, T0).allowed);
        }
        // At 2.5 s into the next window: estimate 3 * 0.75 + 1 = 3.25 → 6.75 left → 6.
        let v = k.hit(1, T0 + 12_500_000);
        assert!(v.allowed);
        assert_eq!(v.remaining, 6);
        // reset: only "previous" left, gone at the window end.
        let mut k = Key::new(p);
        assert!(k.hit(1, T0).allowed);
        let v = k.peek(0, T0 + 12 * SEC).verdict;
        assert_eq!(v.reset_after_us, 8 * SEC);
        assert_eq!(k.peek(0, T0 + 20 * SEC).verdict.reset_after_us, 0);
    }

    #[test]
    fn sliding_window_retry_in_next_window() {
        let p = params(Algorithm::SlidingWindow, 10, 10 * SEC, 10, 4);
        let mut k = Key::new(p);
        assert!(k.hit(8, T0 + 9 * SEC).allowed);
        // Next window: 8 * (10 - e) <= (10 - 4) * 10  <=>  e >= 2.5 s.
        let v = k.hit(4, T0 + 9 * SEC);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, SEC + 2_500_000);
        k.assert_retry_exact(4, T0 + 9 * SEC);
        // cost == limit with anything in the current window: only the window after next.
        let v = k.peek(10, T0 + 9 * SEC).verdict;
        assert_eq!(v.retry_after_us, 11 * SEC);
        k.assert_retry_exact(10, T0 + 9 * SEC);
        assert_eq!(k.peek(11, T0 + 9 * SEC).verdict.retry_after_us, -1);
        k.assert_retry_exact(11, T0 + 9 * SEC);
    }

    // ---- token_bucket ----

    #[test]
    fn token_bucket_bursts_then_refills() {
        // 1 token per second, capacity 5.
        let p = params(Algorithm::TokenBucket, 1, SEC, 5, 1);
        let mut k = Key::new(p);
        for i in 0..5 {
            let v = k.hit(1, T0);
            assert!(v.allowed);
            assert_eq!(v.limit, 5);
            assert_eq!(v.remaining, 4 - i);
            assert_eq!(v.reset_after_us, (i as i64 + 1) * SEC);
        }
        let v = k.hit(1, T0);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, SEC);
        k.assert_retry_exact(1, T0);
        k.assert_retry_exact(3, T0);
        assert!(!k.hit(1, T0 + SEC - 1).allowed);
        assert!(k.hit(1, T0 + SEC).allowed);
        // Refill is continuous: half a second buys half a token.
        let v = k.hit(1, T0 + SEC + 500_000);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 500_000);
        // Refill is capped at the burst.
        let v = k.hit(1, T0 + 1000 * SEC);
        assert!(v.allowed);
        assert_eq!(v.remaining, 4);
    }

    #[test]
    fn token_bucket_exact_fractional_rate() {
        // 3 tokens per 10 s: 1 token every 3.333.. s, kept exact by scaling.
        let p = params(Algorithm::TokenBucket, 3, 10 * SEC, 1, 1);
        let mut k = Key::new(p);
        assert!(k.hit(1, T0).allowed);
        let v = k.hit(1, T0);
        assert_eq!(v.retry_after_us, 3_333_334); // ceil(10e6 / 3)
        k.assert_retry_exact(1, T0);
        let step = k.peek(1, T0);
        assert_eq!(step.ttl, 3_333_334);
    }

    #[test]
    fn token_bucket_cost_above_burst_never_passes() {
        let k = Key::new(params(Algorithm::TokenBucket, 10, SEC, 5, 6));
        let v = k.peek(6, T0).verdict;
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, -1);
        assert_eq!(v.remaining, 5);
        assert_eq!(v.reset_after_us, 0);
        k.assert_retry_exact(6, T0);
    }

    // ---- gcra ----

    #[test]
    fn gcra_matches_redis_cell_example() {
        // CL.THROTTLE user123 15 30 60 → 0, 16, 15, -1, 2
        let p = params(Algorithm::Gcra, 30, 60 * SEC, 16, 1);
        let step = step_for(&p, None, T0, 0);
        assert_eq!(
            step.verdict,
            Verdict {
                allowed: true,
                limit: 16,
                remaining: 15,
                reset_after_us: 2 * SEC,
                retry_after_us: 0,
            }
        );
        assert_eq!(step.ttl, 2 * SEC);
        assert_eq!(step.state, State::Gcra { tat: T0 + 2 * SEC });
    }

    #[test]
    fn gcra_burst_then_rate() {
        let p = params(Algorithm::Gcra, 30, 60 * SEC, 16, 1);
        let mut k = Key::new(p);
        for i in 0..16 {
            let v = k.hit(1, T0);
            assert!(v.allowed, "request {i}");
            assert_eq!(v.remaining, 15 - i);
        }
        let v = k.hit(1, T0);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after_us, 2 * SEC);
        assert_eq!(v.reset_after_us, 32 * SEC);
        k.assert_retry_exact(1, T0);
        k.assert_retry_exact(4, T0);
        assert!(k.hit(1, T0 + 2 * SEC).allowed);
        assert!(!k.hit(1, T0 + 2 * SEC).allowed);
        // After the whole tolerance has passed, the full burst is back.
        assert_eq!(k.peek(1, T0 + 100 * SEC).verdict.remaining, 15);
    }

    #[test]
    fn gcra_cost_above_burst_never_passes() {
        let k = Key::new(params(Algorithm::Gcra, 10, SEC, 5, 6));
        let v = k.peek(6, T0).verdict;
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, -1);
        assert_eq!(v.reset_after_us, 0);
        assert_eq!(v.remaining, 5);
        k.assert_retry_exact(6, T0);
    }

    // ---- concurrency ----

    #[test]
    fn concurrency_leases_release_and_expire() {
        let p = params(Algorithm::Concurrency, 2, 30 * SEC, 2, 1);
        let mut k = Key::new(p);
        let v = k.hit(1, T0);
        assert!(v.allowed);
        assert_eq!((v.remaining, v.reset_after_us), (1, 0));
        assert!(k.hit(1, T0 + SEC).allowed);
        let v = k.hit(1, T0 + 2 * SEC);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 28 * SEC); // the first lease expires at T0 + 30 s
        k.assert_retry_exact(1, T0 + 2 * SEC);
        assert_eq!(k.peek(1, T0 + 2 * SEC).ttl, 29 * SEC);
        // Releasing lease 1 frees its slot at once.
        let (state, _) = k.state.as_mut().unwrap();
        release(state, 1);
        assert!(k.hit(1, T0 + 3 * SEC).allowed);
        assert!(!k.hit(1, T0 + 3 * SEC).allowed);
        // Unreleased leases expire after the lease TTL.
        assert!(!k.hit(1, T0 + 31 * SEC - 1).allowed);
        assert!(k.hit(1, T0 + 31 * SEC).allowed);
    }

    #[test]
    fn concurrency_refresh_extends_live_leases_only() {
        let p = params(Algorithm::Concurrency, 1, 10 * SEC, 1, 1);
        let step = step_for(&p, None, T0, 42);
        let mut state = step.state;
        assert_eq!(refresh(&mut state, 42, &p, T0 + 5 * SEC), Some(10 * SEC));
        assert!(
            !step_for(&p, Some(&state), T0 + 12 * SEC, 43)
                .verdict
                .allowed
        );
        assert!(
            step_for(&p, Some(&state), T0 + 15 * SEC, 43)
                .verdict
                .allowed
        );
        assert_eq!(refresh(&mut state, 7, &p, T0 + 6 * SEC), None);
        assert_eq!(refresh(&mut state, 42, &p, T0 + 15 * SEC), None);
    }

    #[test]
    fn concurrency_cost_units() {
        let p = params(Algorithm::Concurrency, 5, 10 * SEC, 5, 3);
        let mut k = Key::new(p);
        assert!(k.hit(3, T0).allowed);
        let v = k.hit(3, T0);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 2);
        assert!(k.hit(2, T0).allowed);
        assert_eq!(k.peek(6, T0).verdict.retry_after_us, -1);
    }

    // ---- calendar windows ----

    fn calendar_params(unit: calendar::Unit, zone: &str, limit: u64) -> Params {
        Params {
            period_us: unit.longest_us(),
            calendar: Some(Calendar {
                unit,
                zone: calendar::Zone::get(zone).unwrap(),
            }),
            ..params(Algorithm::FixedWindow, limit, 1, limit, 1)
        }
    }

    fn instant(text: &str) -> Micros {
        text.parse::<jiff::Timestamp>().unwrap().as_microsecond()
    }

    #[test]
    fn a_month_in_new_york_resets_at_local_midnight_of_the_first() {
        let mut k = Key::new(calendar_params(
            calendar::Unit::Month,
            "America/New_York",
            3,
        ));
        // 22:00 on October 31st in New York (EDT, -4): two hours before the month turns.
        let t = instant("2026-11-01T02:00:00Z");
        for i in 0..3 {
            assert!(k.hit(1, t + i).allowed);
        }
        let v = k.hit(1, t + 10);
        assert!(!v.allowed);
        // Retry-After is exactly the time to local midnight (04:00Z), to the microsecond.
        assert_eq!(v.retry_after_us, 2 * 3_600 * SEC - 10);
        assert_eq!(v.reset_after_us, 2 * 3_600 * SEC - 10);
        k.assert_retry_exact(1, t + 10);
        // November (DST ends on the 1st at 02:00 local) is a new count...
        let turn = instant("2026-11-01T04:00:00Z");
        assert!(!k.hit(1, turn - 1).allowed);
        let v = k.hit(1, turn);
        assert!(v.allowed);
        assert_eq!(v.remaining, 2);
        // ... that lasts 30 days and an hour, to EST midnight of December 1st.
        assert_eq!(v.reset_after_us, 30 * 86_400 * SEC + 3_600 * SEC);
        // March: the month in which DST starts lasts 31 days less an hour.
        let mut k = Key::new(calendar_params(
            calendar::Unit::Month,
            "America/New_York",
            1,
        ));
        let v = k.hit(1, instant("2027-03-01T05:00:00Z"));
        assert_eq!(v.reset_after_us, 31 * 86_400 * SEC - 3_600 * SEC);
        assert!(!k.hit(1, instant("2027-04-01T03:59:59Z")).allowed);
        assert!(k.hit(1, instant("2027-04-01T04:00:00Z")).allowed);
    }

    #[test]
    fn calendar_days_of_23_and_25_hours() {
        let mut k = Key::new(calendar_params(calendar::Unit::Day, "Europe/Berlin", 1));
        // The day Berlin springs forward starts at 23:00Z the day before and lasts 23 hours.
        let start = instant("2026-03-28T23:00:00Z");
        let v = k.hit(1, start);
        assert_eq!(v.reset_after_us, 23 * 3_600 * SEC);
        let v = k.hit(1, start + 3_600 * SEC);
        assert_eq!(v.retry_after_us, 22 * 3_600 * SEC);
        k.assert_retry_exact(1, start + 3_600 * SEC);
        // The day it falls back lasts 25.
        let start = instant("2026-10-24T22:00:00Z");
        let v = k.hit(1, start);
        assert!(v.allowed);
        assert_eq!(v.reset_after_us, 25 * 3_600 * SEC);
        assert!(!k.hit(1, start + 24 * 3_600 * SEC).allowed);
        assert!(k.hit(1, start + 25 * 3_600 * SEC).allowed);
    }

    #[test]
    fn calendar_weeks_years_and_a_leap_february() {
        // Thursday 2026-11-26: the week (Berlin) turns on Monday 2026-11-30, 00:00 CET.
        let mut k = Key::new(calendar_params(calendar::Unit::Week, "Europe/Berlin", 1));
        let now = instant("2026-11-26T12:00:00Z");
        assert!(k.hit(1, now).allowed);
        let v = k.hit(1, now);
        assert_eq!(now + v.retry_after_us, instant("2026-11-29T23:00:00Z"));
        // A year in UTC.
        let mut k = Key::new(calendar_params(calendar::Unit::Year, "UTC", 1));
        assert!(k.hit(1, instant("2028-12-31T23:59:59Z")).allowed);
        assert!(k.hit(1, instant("2029-01-01T00:00:00Z")).allowed);
        // February 2028 has 29 days.
        let mut k = Key::new(calendar_params(calendar::Unit::Month, "UTC", 1));
        let v = k.hit(1, instant("2028-02-01T00:00:00Z"));
        assert_eq!(v.reset_after_us, 29 * 86_400 * SEC);
        assert!(!k.hit(1, instant("2028-02-29T23:59:59Z")).allowed);
        assert!(k.hit(1, instant("2028-03-01T00:00:00Z")).allowed);
    }

    #[test]
    fn calendar_windows_are_never_settled() {
        let p = calendar_params(calendar::Unit::Day, "UTC", 5);
        let step = step_for(&p, None, T0, 0);
        assert_eq!(
            settle(&p, Some(&step.state), T0, Settle::Charge { amount: 1 }),
            None
        );
    }

    // ---- settlements (refund / charge) ----

    impl Key {
        fn settle(&mut self, op: Settle, now: Micros) {
            let live = self.live(now).cloned();
            if let Some((state, ttl)) = settle(&self.p, live.as_ref(), now, op) {
                self.state = (ttl > 0).then_some((state, now + ttl));
            }
        }
    }

    #[test]
    fn fixed_window_refund_only_into_the_window_it_was_taken_from() {
        let mut k = Key::new(params(Algorithm::FixedWindow, 2, 10 * SEC, 2, 1));
        assert!(k.hit(1, T0 + SEC).allowed);
        assert!(k.hit(1, T0 + SEC).allowed);
        assert!(!k.hit(1, T0 + 2 * SEC).allowed);
        k.settle(
            Settle::Refund {
                amount: 1,
                taken_at: T0 + SEC,
            },
            T0 + 3 * SEC,
        );
        assert_eq!(k.peek(1, T0 + 3 * SEC).verdict.remaining, 0);
        assert!(k.hit(1, T0 + 3 * SEC).allowed);
        // Taken in the window before: nothing to give back in this one.
        assert!(k.hit(2, T0 + 10 * SEC).allowed);
        k.settle(
            Settle::Refund {
                amount: 2,
                taken_at: T0 + 3 * SEC,
            },
            T0 + 11 * SEC,
        );
        assert!(!k.hit(1, T0 + 11 * SEC).allowed);
    }

    #[test]
    fn fixed_window_charge_is_a_debt_until_the_window_ends() {
        let mut k = Key::new(params(Algorithm::FixedWindow, 10, 10 * SEC, 10, 1));
        assert!(k.hit(1, T0).allowed);
        k.settle(Settle::Charge { amount: 25 }, T0 + SEC);
        let v = k.hit(1, T0 + 2 * SEC);
        assert!(!v.allowed);
        assert_eq!((v.remaining, v.retry_after_us), (0, 8 * SEC));
        k.assert_retry_exact(1, T0 + 2 * SEC);
    }

    #[test]
    fn sliding_window_refund_reaches_the_previous_window() {
        let mut k = Key::new(params(Algorithm::SlidingWindow, 4, 10 * SEC, 4, 1));
        for _ in 0..4 {
            assert!(k.hit(1, T0 + 9 * SEC).allowed);
        }
        // At 1 s into the next window previous weighs 3.6: nothing passes.
        assert!(!k.hit(1, T0 + 11 * SEC).allowed);
        k.settle(
            Settle::Refund {
                amount: 2,
                taken_at: T0 + 9 * SEC,
            },
            T0 + 11 * SEC,
        );
        // 2 * 0.9 = 1.8: two more pass.
        assert!(k.hit(1, T0 + 11 * SEC).allowed);
        assert!(k.hit(1, T0 + 11 * SEC).allowed);
        assert!(!k.hit(1, T0 + 11 * SEC).allowed);
    }

    #[test]
    fn sliding_log_refund_removes_the_reserved_entries() {
        let mut k = Key::new(params(Algorithm::SlidingLog, 3, 10 * SEC, 3, 1));
        assert!(k.hit(2, T0).allowed);
        assert!(k.hit(1, T0 + SEC).allowed);
        k.settle(
            Settle::Refund {
                amount: 2,
                taken_at: T0,
            },
            T0 + 2 * SEC,
        );
        match &k.state {
            Some((State::SlidingLog { entries }, _)) => {
                assert_eq!(entries.iter().copied().collect::<Vec<_>>(), vec![T0 + SEC])
            }
            other => panic!("unexpected state {other:?}"),
        }
        assert!(k.hit(2, T0 + 2 * SEC).allowed);
        assert!(!k.hit(1, T0 + 2 * SEC).allowed);
        // Past its period the entry is gone anyway: nothing to give back.
        assert_eq!(
            refund(&k.p, k.live(T0 + 13 * SEC), T0 + 13 * SEC, T0 + 2 * SEC, 1),
            None
        );
    }

    #[test]
    fn token_bucket_debt_and_truthful_retry() {
        // 10 tokens per second, burst 10.
        let mut k = Key::new(params(Algorithm::TokenBucket, 10, SEC, 10, 1));
        assert!(k.hit(1, T0).allowed);
        // The response reports 35 tokens: 1 was paid up front, 34 charged: balance -25.
        k.settle(Settle::Charge { amount: 34 }, T0);
        let v = k.hit(1, T0);
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        // Back to 1 token (26 tokens at 10/s) after 2.6 s.
        assert_eq!(v.retry_after_us, 2_600_000);
        k.assert_retry_exact(1, T0);
        // Refunds are capped at the burst.
        k.settle(
            Settle::Refund {
                amount: 1000,
                taken_at: T0,
            },
            T0 + SEC,
        );
        assert_eq!(k.peek(1, T0 + SEC).verdict.remaining, 9);
    }

    #[test]
    fn gcra_charge_pushes_the_tat_and_refund_pulls_it_back() {
        // One per 100 ms, burst 5.
        let mut k = Key::new(params(Algorithm::Gcra, 10, SEC, 5, 1));
        assert!(k.hit(1, T0).allowed);
        k.settle(Settle::Charge { amount: 9 }, T0);
        // TAT = T0 + 1 s; a request needs TAT - 0.4 s <= now.
        let v = k.hit(1, T0);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_us, 600_000);
        k.assert_retry_exact(1, T0);
        k.settle(
            Settle::Refund {
                amount: 4,
                taken_at: T0,
            },
            T0,
        );
        assert!(k.hit(1, T0 + 200_000).allowed);
        // Never before now.
        k.settle(
            Settle::Refund {
                amount: 100,
                taken_at: T0,
            },
            T0 + 200_000,
        );
        assert_eq!(k.peek(1, T0 + 200_000).verdict.remaining, 4);
    }

    #[test]
    fn settlements_skip_concurrency_foreign_and_idle_states() {
        let p = params(Algorithm::Concurrency, 2, SEC, 2, 1);
        let step = step_for(&p, None, T0, 1);
        assert_eq!(
            settle(&p, Some(&step.state), T0, Settle::Charge { amount: 1 }),
            None
        );
        let tb = params(Algorithm::TokenBucket, 2, SEC, 2, 1);
        let refund_idle = Settle::Refund {
            amount: 1,
            taken_at: T0,
        };
        assert_eq!(settle(&tb, None, T0, refund_idle), None);
        assert_eq!(
            settle(&tb, Some(&State::Gcra { tat: T0 }), T0, refund_idle),
            None
        );
        let log = params(Algorithm::SlidingLog, 2, SEC, 2, 1);
        assert_eq!(settle(&log, None, T0, Settle::Charge { amount: 1 }), None);
    }

    #[test]
    fn debts_stay_within_exact_integers() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ] {
            let p = params(algorithm, 1000, 3_600 * SEC, 1000, 1);
            let mut state = None;
            for _ in 0..4 {
                let (s, ttl) = charge(&p, state.as_ref(), T0, u64::MAX).unwrap();
                assert!(ttl > 0 && T0 + ttl < MAX_SAFE, "{algorithm:?} ttl {ttl}");
                state = Some(s);
            }
            let v = step_for(&p, state.as_ref(), T0, 0).verdict;
            assert!(!v.allowed, "{algorithm:?}");
            assert!(v.retry_after_us > 0 && T0 + v.retry_after_us < MAX_SAFE);
        }
    }

    // ---- properties ----

    fn algo_params() -> impl Strategy<Value = Params> {
        (0usize..6, 1u64..8, 1i64..2000, 1u64..8).prop_map(|(a, limit, period, burst)| {
            let algorithm = Algorithm::ALL[a];
            let burst = match algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => burst,
                _ => limit,
            };
            let period_us = if algorithm == Algorithm::Gcra {
                period.max(limit as i64)
            } else {
                period
            };
            params(algorithm, limit, period_us, burst, 1)
        })
    }

    /// (time increment, cost, release the oldest lease first)
    fn traffic() -> impl Strategy<Value = Vec<(i64, u64, bool)>> {
        prop::collection::vec((0i64..400, 0u64..5, any::<bool>()), 1..120)
    }

    fn assert_promise(p: &Params, admitted: &[(Micros, u64)]) {
        let (limit, period, burst) = (p.limit as i64, p.period_us, p.burst as i64);
        let units =
            |i: usize, j: usize| -> i64 { admitted[i..=j].iter().map(|a| a.1 as i64).sum() };
        match p.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let mut per_window = std::collections::HashMap::new();
                for &(t, c) in admitted {
                    *per_window.entry(t / period).or_insert(0i64) += c as i64;
                }
                assert!(per_window.values().all(|&n| n <= limit), "{per_window:?}");
            }
            Algorithm::SlidingLog => {
                for &(t, _) in admitted {
                    let n: i64 = admitted
                        .iter()
                        .filter(|a| a.0 <= t && a.0 > t - period)
                        .map(|a| a.1 as i64)
                        .sum();
                    assert!(n <= limit, "{n} units in the period ending at {t}");
                }
            }
            Algorithm::TokenBucket => {
                for i in 0..admitted.len() {
                    for j in i..admitted.len() {
                        let dt = admitted[j].0 - admitted[i].0;
                        assert!(units(i, j) * period <= burst * period + limit * dt);
                    }
                }
            }
            Algorithm::Gcra => {
                let interval = period / limit;
                for i in 0..admitted.len() {
                    for j in i..admitted.len() {
                        let dt = admitted[j].0 - admitted[i].0;
                        assert!(units(i, j) * interval <= burst * interval + dt);
                    }
                }
            }
            Algorithm::Concurrency => {} // checked live, with releases
        }
    }

    proptest! {
        #[test]
        fn admitted_units_never_exceed_the_promise(p in algo_params(), steps in traffic()) {
            let mut k = Key::new(p);
            let mut now = T0 + 123;
            let mut admitted = Vec::new();
            // (id, units, expires_at) of leases not released yet
            let mut held: Vec<(u64, u64, Micros)> = Vec::new();
            for (dt, cost, rel) in steps {
                now += dt;
                if rel && p.algorithm == Algorithm::Concurrency && !held.is_empty() {
                    let (id, _, _) = held.remove(0);
                    if let Some((s, _)) = k.state.as_mut() {
                        release(s, id);
                    }
                }
                let v = k.hit(cost, now);
                if v.allowed {
                    admitted.push((now, cost));
                    held.push((k.lease, cost, now + p.period_us));
                    let in_flight: u64 = held.iter().filter(|h| h.2 > now).map(|h| h.1).sum();
                    if p.algorithm == Algorithm::Concurrency {
                        prop_assert!(in_flight <= p.limit);
                    }
                } else {
                    prop_assert!(v.retry_after_us == -1 || v.retry_after_us > 0);
                }
            }
            assert_promise(&p, &admitted);
        }

        #[test]
        fn retry_after_is_truthful(p in algo_params(), steps in traffic()) {
            let mut k = Key::new(p);
            let mut now = T0 + 7;
            for (dt, cost, _) in steps {
                now += dt;
                if k.peek(cost, now).verdict.allowed {
                    k.hit(cost, now);
                } else if p.algorithm == Algorithm::Concurrency {
                    // A bound only: nothing expires before it.
                    let v = k.peek(cost, now).verdict;
                    if v.retry_after_us > 0 {
                        prop_assert!(!k.peek(cost, now + v.retry_after_us - 1).verdict.allowed);
                    } else {
                        prop_assert_eq!(v.retry_after_us, -1);
                    }
                } else {
                    k.assert_retry_exact(cost, now);
                }
            }
        }
    }
}
