//! Validation of a list of limits (a route's or a tier's): each limit's algorithm and
//! parameters, key, policy name, scope, delay mode, penalty box (`block_for`) and local-first
//! interval (`sync`), and what must hold across the list (unique names, one `sync`, one scope
//! for settled limits).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::by_response::{by_response, by_response_scopes};
use super::identities::key;
use super::validator::{is_plain_name, Validator};
use crate::config::model::{Limit, OnLimit, Scope, DEFAULT_LEASE_TTL};
use crate::config::raw::RawLimit;
use crate::identity::Identity;
use crate::limit::algorithm::{self, Algorithm, Params};
use crate::limit::calendar::{Calendar, Unit, Zone};

/// What the limits of one list share: whose they are and what they fall back to.
pub(super) struct Owner<'a> {
    /// The route's name, or the tier's: unnamed limits are named after it.
    pub name: &'a str,
    /// The route's key, for limits without a `key` of their own.
    pub route_key: &'a [Arc<Identity>],
    /// Every identity defined, for the limits' `key`.
    pub identities: &'a [Arc<Identity>],
    /// `global` with a Redis store, `local` without.
    pub default_scope: Scope,
}

const ALGORITHMS: &str =
    "fixed_window, sliding_log, sliding_window, token_bucket, gcra, concurrency";

fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "fixed_window" => Algorithm::FixedWindow,
        "sliding_log" => Algorithm::SlidingLog,
        "sliding_window" => Algorithm::SlidingWindow,
        "token_bucket" => Algorithm::TokenBucket,
        "gcra" => Algorithm::Gcra,
        "concurrency" => Algorithm::Concurrency,
        _ => return None,
    })
}

/// Validates a list of limits (a route's, or a tier's) with unique policy names.
pub(super) fn limits(v: &mut Validator, path: &str, owner: &Owner, raw: &[RawLimit]) -> Vec<Limit> {
    let mut limits = Vec::new();
    let mut policy_names = HashSet::new();
    for i in 0..raw.len() {
        let limit_path = format!("{path}.limits[{i}]");
        let Some(limit) = limit(v, &limit_path, owner, raw, i) else {
            continue;
        };
        if !policy_names.insert(limit.name.clone()) {
            v.error(
                &format!("{limit_path}.name"),
                format!(
                    "policy name `{}` is used twice: give each limit its own `name`",
                    limit.name
                ),
            );
        }
        limits.push(limit);
    }
    by_response_scopes(v, path, &limits);
    if limits.windows(2).any(|w| w[0].sync != w[1].sync) {
        // One decision covers every limit of a request, atomically: either in memory
        // (local-first) or in one Redis script (exact), not both.
        v.error(
            &format!("{path}.limits"),
            "every limit of a route (or tier) needs the same `sync`: exact, or one duration",
        );
    }
    limits
}

/// The limit `siblings[index]`; `None` when its algorithm or key is unusable (reported).
fn limit(
    v: &mut Validator,
    path: &str,
    owner: &Owner,
    siblings: &[RawLimit],
    index: usize,
) -> Option<Limit> {
    let raw = &siblings[index];
    let Some(algorithm) = parse_algorithm(raw.algorithm.trim()) else {
        v.error(
            &format!("{path}.algorithm"),
            format!(
                "`{}` is not an algorithm: use one of {ALGORITHMS}",
                raw.algorithm
            ),
        );
        return None;
    };
    let params = params(v, path, raw, algorithm);
    let key = match &raw.key {
        Some(raw_key) => key(v, &format!("{path}.key"), raw_key, owner.identities)?,
        None => owner.route_key.to_vec(),
    };
    let name = policy_name(v, path, owner.name, siblings, index);
    let scope = scope(v, path, raw, owner.default_scope);
    let on_limit = on_limit(v, path, raw, algorithm);
    let shadow = raw.shadow.unwrap_or(false);
    let block_for = block_for(v, path, raw, algorithm, shadow, on_limit);
    let by_response = by_response(v, path, raw, algorithm);
    let sync = sync(v, path, raw, algorithm, scope, block_for.is_some());
    Some(Limit {
        name,
        params,
        key,
        scope,
        on_limit,
        shadow,
        by_response,
        block_for,
        sync,
    })
}

/// The algorithm's parameters: quota, period (or lease TTL), burst and cost, refused where no
/// request could pass or the arithmetic could not count exactly.
fn params(v: &mut Validator, path: &str, raw: &RawLimit, algorithm: Algorithm) -> Params {
    if raw.limit == 0 {
        v.error(
            &format!("{path}.limit"),
            "must be at least 1 (to block a route entirely, use your app or a firewall)",
        );
    }
    let period_us = period_us(v, path, raw, algorithm);
    let bursty = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    if raw.burst.is_some() && !bursty {
        v.error(
            &format!("{path}.burst"),
            format!(
                "`burst` applies to token_bucket and gcra only, not {}",
                raw.algorithm
            ),
        );
    }
    let burst = if bursty {
        raw.burst.unwrap_or(raw.limit)
    } else {
        raw.limit
    };
    let cost = raw.cost.unwrap_or(1);
    if cost == 0 {
        v.error(&format!("{path}.cost"), "must be at least 1");
    } else if cost > burst && burst > 0 {
        let what = if bursty { "burst" } else { "limit" };
        v.error(
            &format!("{path}.cost"),
            format!("cost {cost} is above the {what} {burst}: no request could ever pass"),
        );
    }
    if bursty && raw.burst == Some(0) {
        v.error(&format!("{path}.burst"), "must be at least 1");
    }
    let calendar = calendar(v, path, raw, algorithm);
    let params = Params {
        algorithm,
        limit: raw.limit,
        // A calendar window's longest length stands for its period wherever one is needed.
        period_us: calendar.map_or(period_us, |c| c.unit.longest_us()),
        burst,
        cost,
        calendar,
    };
    if raw.limit > 0 && !algorithm::params_fit(&params) {
        v.error(path, "limit × period is too large to count exactly (keep limit × period in microseconds at most 2^49 for token_bucket and sliding_window: shorten the period or lower the limit)");
    }
    if algorithm == Algorithm::Gcra && raw.limit > 0 && period_us / raw.limit as i64 == 0 {
        v.error(&format!("{path}.limit"), "more than one request per microsecond cannot be metered: lower the limit or lengthen the period");
    }
    params
}

/// `window` and `timezone`: a fixed_window that turns on the calendar rather than every
/// `period`; exactly one of `window` and `period`.
fn calendar(
    v: &mut Validator,
    path: &str,
    raw: &RawLimit,
    algorithm: Algorithm,
) -> Option<Calendar> {
    let Some(window) = raw.window.as_deref() else {
        if raw.timezone.is_some() {
            v.error(
                &format!("{path}.timezone"),
                "`timezone` applies to a calendar `window` (day, week, month, year) only: add `window:` or remove `timezone`",
            );
        }
        return None;
    };
    let at = format!("{path}.window");
    if algorithm != Algorithm::FixedWindow {
        v.error(
            &at,
            format!(
                "calendar windows apply to fixed_window only, not {}: use `period`",
                raw.algorithm
            ),
        );
        return None;
    }
    if raw.period.is_some() {
        v.error(
            &at,
            "`window` and `period` are mutually exclusive: keep `window` for a window that turns on the calendar, or `period` for one of fixed length",
        );
        return None;
    }
    let Some(unit) = Unit::from_name(window.trim()) else {
        v.error(
            &at,
            format!("`{window}` is not a calendar window: use day, week, month or year (or `period` for a fixed length)"),
        );
        return None;
    };
    let name = raw.timezone.as_deref().map_or("UTC", str::trim);
    let zone = match Zone::get(name) {
        Ok(zone) => zone,
        Err(_) => {
            v.error(
                &format!("{path}.timezone"),
                format!("`{name}` is not a known IANA time zone: use a name such as UTC, Europe/Berlin or America/New_York"),
            );
            return None;
        }
    };
    let refused = if raw.count_statuses.is_some() || raw.cost_from_response.is_some() {
        Some("a calendar window cannot be settled after the response yet: remove `count_statuses`/`cost_from_response`, or use `period`")
    } else if raw.sync.as_deref().is_some_and(|s| s.trim() != "exact") {
        Some("a calendar window is decided exactly, on the store's clock: remove `sync` (or use `sync: exact`)")
    } else {
        None
    };
    if let Some(reason) = refused {
        v.error(&at, reason);
        return None;
    }
    Some(Calendar { unit, zone })
}

/// `period` in microseconds, or a concurrency limit's `lease_ttl`.
fn period_us(v: &mut Validator, path: &str, raw: &RawLimit, algorithm: Algorithm) -> i64 {
    let period = if algorithm == Algorithm::Concurrency {
        if raw.period.is_some() {
            v.error(&format!("{path}.period"), "concurrency limits have no period: they count requests in flight (use `lease_ttl` for how long a crashed proxy's slots stay taken)");
        }
        v.duration(
            &format!("{path}.lease_ttl"),
            raw.lease_ttl.as_deref(),
            DEFAULT_LEASE_TTL,
        )
    } else {
        if raw.lease_ttl.is_some() {
            v.error(
                &format!("{path}.lease_ttl"),
                "only concurrency limits have a lease_ttl",
            );
        }
        match raw.period.as_deref() {
            Some(p) => v.duration(&format!("{path}.period"), Some(p), Duration::from_secs(1)),
            // A calendar window (see `calendar`) instead.
            None if raw.window.is_some() => Duration::from_secs(1),
            None => {
                v.error(
                    path,
                    if algorithm == Algorithm::FixedWindow {
                        "missing `period` (the window or refill period, e.g. 1s, 60s, 1h), or a calendar `window` (day, week, month, year)"
                    } else {
                        "missing `period` (the window or refill period, e.g. 1s, 60s, 1h)"
                    },
                );
                Duration::from_secs(1)
            }
        }
    };
    let period_us = i64::try_from(period.as_micros()).unwrap_or(i64::MAX);
    if period_us < 1_000 && algorithm != Algorithm::Concurrency {
        v.error(&format!("{path}.period"), "must be at least 1ms");
    }
    period_us
}

/// The policy name in headers, logs and metrics: `name`, else the owner's name when the limit
/// is alone, else the owner's name with the algorithm (and the position, if it repeats).
fn policy_name(
    v: &mut Validator,
    path: &str,
    owner: &str,
    siblings: &[RawLimit],
    index: usize,
) -> String {
    let raw = &siblings[index];
    match &raw.name {
        Some(name) => {
            if !is_plain_name(name) {
                v.error(
                    &format!("{path}.name"),
                    format!("`{name}` may use only letters, digits, `_`, `-` and `.` (at most 64)"),
                );
            }
            name.clone()
        }
        None if siblings.len() == 1 => owner.to_owned(),
        None => {
            let same_algorithm = siblings
                .iter()
                .filter(|l| l.algorithm.trim() == raw.algorithm.trim())
                .count();
            if same_algorithm > 1 {
                format!("{owner}-{}-{}", raw.algorithm.trim(), index + 1)
            } else {
                format!("{owner}-{}", raw.algorithm.trim())
            }
        }
    }
}

fn scope(v: &mut Validator, path: &str, raw: &RawLimit, default_scope: Scope) -> Scope {
    match raw.scope.as_deref() {
        None => default_scope,
        Some("global") => {
            if default_scope == Scope::Local {
                v.error(&format!("{path}.scope"), "`global` needs a `store.redis` section: without one, limits live in this process only");
            }
            Scope::Global
        }
        Some("local") => Scope::Local,
        Some(other) => {
            v.error(&format!("{path}.scope"), format!("`{other}` is not allowed: use global (shared through Redis) or local (this instance)"));
            default_scope
        }
    }
}

fn on_limit(v: &mut Validator, path: &str, raw: &RawLimit, algorithm: Algorithm) -> OnLimit {
    match raw.on_limit.as_deref() {
        None | Some("reject") => {
            if raw.max_delay.is_some() {
                v.error(
                    &format!("{path}.max_delay"),
                    "only used with `on_limit: delay`",
                );
            }
            OnLimit::Reject
        }
        Some("delay") => {
            if algorithm == Algorithm::Concurrency {
                v.error(
                    &format!("{path}.on_limit"),
                    "concurrency limits cannot delay (when a slot frees up is unknown): use reject",
                );
            }
            match raw.max_delay.as_deref() {
                Some(d) => OnLimit::Delay {
                    max_delay: v.duration(
                        &format!("{path}.max_delay"),
                        Some(d),
                        Duration::from_secs(1),
                    ),
                },
                None => {
                    v.error(path, "`on_limit: delay` needs `max_delay` (the longest a request may wait, e.g. 500ms)");
                    OnLimit::Reject
                }
            }
        }
        Some(other) => {
            v.error(
                &format!("{path}.on_limit"),
                format!(
                    "`{other}` is not allowed: use reject (429) or delay (wait up to max_delay)"
                ),
            );
            OnLimit::Reject
        }
    }
}

/// `sync`: `exact` (None) or a duration, refused with the reason where local-first
/// counting could not keep its bound.
fn sync(
    v: &mut Validator,
    path: &str,
    raw: &RawLimit,
    algorithm: Algorithm,
    scope: Scope,
    blocks: bool,
) -> Option<Duration> {
    let text = raw.sync.as_deref()?.trim();
    if text == "exact" {
        return None;
    }
    let at = format!("{path}.sync");
    let sync = v.duration(&at, Some(text), Duration::from_millis(100));
    let refused = match algorithm {
        Algorithm::SlidingLog => Some("sliding_log keeps one entry per request, which a batch of usage cannot merge: use `sync: exact`, or sliding_window for local-first counting"),
        Algorithm::Concurrency => Some("a concurrency slot must be taken and given back atomically across replicas: use `sync: exact`"),
        // Without store.redis every limit is local and `sync` has nothing to share with:
        // accepted (it applies once the store is Redis), unless the limit says `local`.
        _ if scope == Scope::Local && raw.scope.is_some() => Some("a local limit is already decided in memory and shared with no one: remove `sync`"),
        _ if blocks => Some("a block (`block_for`) must be seen by every replica at once: use `sync: exact` with block_for"),
        _ if sync < Duration::from_millis(10) => Some("must be at least 10ms (use `sync: exact` for a decision per request)"),
        _ if sync > Duration::from_secs(60) => Some("must be at most 1m: the bound grows with the interval"),
        _ => None,
    };
    if let Some(reason) = refused {
        v.error(&at, reason);
        return None;
    }
    Some(sync)
}

/// `block_for`, refused with the reason where a block could not mean what it says.
fn block_for(
    v: &mut Validator,
    path: &str,
    raw: &RawLimit,
    algorithm: Algorithm,
    shadow: bool,
    on_limit: OnLimit,
) -> Option<Duration> {
    let text = raw.block_for.as_deref()?;
    let at = format!("{path}.block_for");
    let block_for = v.duration(&at, Some(text), Duration::from_secs(1));
    let refused = if shadow {
        Some("a shadow limit never denies, so it cannot block anyone: remove `shadow: true` to enforce the limit, or remove `block_for`")
    } else if algorithm == Algorithm::Concurrency {
        Some("a concurrency limit denies only while its slots are taken, which says nothing about the caller's behaviour: use block_for on a rate limit")
    } else if matches!(on_limit, OnLimit::Delay { .. }) {
        Some("`on_limit: delay` makes a request over the limit wait instead of refusing it, and a block would start on the first one that has to wait: use `on_limit: reject` with block_for")
    } else if block_for < Duration::from_secs(1) {
        Some("must be at least 1s (Retry-After counts whole seconds)")
    } else if block_for.as_micros() > algorithm::MAX_PRODUCT as u128 {
        Some("is too long to count exactly in microseconds (keep it under 10 years)")
    } else {
        None
    };
    if let Some(reason) = refused {
        v.error(&at, reason);
        return None;
    }
    Some(block_for)
}
