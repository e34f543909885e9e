//! The limits one caller gets on a route, as the limit stage reads them: `LimitSet` (a route's
//! or a tier's limits, with the names its store keys and responses use), `Limit` (one
//! configured limit) and what a limit learns from the response (`ByResponse`).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderName;

use crate::identity::Identity;
use crate::limit::algorithm::Params;

pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);

/// The limits one caller gets on a route (the route's own, or a tier's), with everything the
/// limit stage needs to key, decide and describe them. Derefs to its limits.
#[derive(Debug, Clone)]
pub struct LimitSet {
    /// The route's name as clients are told it (the limited response's body), a tier's too.
    pub route: String,
    /// The action in store keys: the route's name, or `route~tier` for a tier (`~` cannot
    /// appear in a route name, so a tier's keys never meet another route's).
    pub key_name: String,
    pub limits: Vec<Limit>,
    /// True when every limit uses the same key, so the store key's hash tag can include the
    /// identity (spreading a route over a cluster) instead of the route name alone.
    pub shared_key: bool,
    /// The `RateLimit-Policy` field value for `limits`: empty after validation and filled by
    /// `throttle::headers::policy` on first use, so it is rendered once per set rather than
    /// on every response, and the configuration renders nothing of the responses itself.
    pub policy: OnceLock<http::HeaderValue>,
    /// True when a limit has a calendar window: its length changes from one window to the
    /// next, so the policy is rendered on every response instead of once.
    pub calendar: bool,
    /// The priority of requests decided by this set under `protect` (the route's, or the
    /// tier's own); `normal` unless configured.
    pub priority: super::protect::Priority,
}

impl LimitSet {
    /// A route's own limits (`tier` None) or a tier's.
    pub fn new(route: &str, tier: Option<&str>, limits: Vec<Limit>, shared_key: bool) -> Self {
        LimitSet {
            route: route.to_owned(),
            key_name: match tier {
                None => route.to_owned(),
                Some(tier) => format!("{route}~{tier}"),
            },
            shared_key,
            policy: OnceLock::new(),
            calendar: limits.iter().any(|l| l.params.calendar.is_some()),
            priority: super::protect::Priority::Normal,
            limits,
        }
    }
}

impl std::ops::Deref for LimitSet {
    type Target = [Limit];

    fn deref(&self) -> &[Limit] {
        &self.limits
    }
}

impl<'a> IntoIterator for &'a LimitSet {
    type Item = &'a Limit;
    type IntoIter = std::slice::Iter<'a, Limit>;

    fn into_iter(self) -> Self::IntoIter {
        self.limits.iter()
    }
}

#[derive(Debug, Clone)]
pub struct Limit {
    /// Policy name in headers, logs and metrics.
    pub name: String,
    pub params: Params,
    pub key: Vec<Arc<Identity>>,
    pub scope: Scope,
    pub on_limit: OnLimit,
    pub shadow: bool,
    /// `count_statuses` or `cost_from_response`: settled after the response.
    pub by_response: Option<ByResponse>,
    /// `block_for`: once this limit denies a caller, every request of theirs on the route is
    /// refused for this long (the penalty box, see `limit::algorithm::penalty_box`).
    pub block_for: Option<Duration>,
    /// `sync: <duration>`: decided locally and shared through Redis every interval
    /// (`limit::local_first`); None is `sync: exact`, one atomic script call per request.
    pub sync: Option<Duration>,
}

impl Limit {
    /// What a store is asked of this limit for a request stored at `key`: the one place a
    /// [`Check`](crate::limit::Check) is made from a limit.
    #[inline]
    pub fn check<'k>(&self, key: &'k str) -> crate::limit::Check<'k> {
        crate::limit::Check {
            key,
            params: self.params,
            shadow: self.shadow,
            block_us: self.block_us(),
        }
    }

    /// `block_for` in microseconds, as the stores take it (0: none).
    pub fn block_us(&self) -> crate::limit::Micros {
        self.block_for
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Shared by every tollgate instance through the store.
    Global,
    /// This instance only (in memory).
    Local,
}

impl Scope {
    /// As the file spells it (`scope:`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Local => "local",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    Reject,
    /// Wait up to `max_delay` for the request to fit, then forward it.
    Delay {
        max_delay: Duration,
    },
}

impl OnLimit {
    /// As the file spells it (`on_limit:`; the delay's bound is `max_delay`, a field of its own).
    pub fn as_str(self) -> &'static str {
        match self {
            OnLimit::Reject => "reject",
            OnLimit::Delay { .. } => "delay",
        }
    }
}

impl fmt::Display for OnLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a limit learns from the response: `count_statuses` (only responses with these statuses
/// use the limit) or `cost_from_response` (the response reports what the request cost). Both
/// are settled after the response (see `throttle::settle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByResponse {
    /// Only responses with these statuses use the limit: each request reserves its cost up
    /// front (so a burst cannot overshoot) and gets it back when the status does not count.
    CountStatuses(StatusSet),
    /// Post-paid: the configured cost is paid up front and, when the response ends, the
    /// difference to the cost reported in this header or trailer is charged or given back.
    CostFromResponse(HeaderName),
}

/// A set of HTTP statuses (100–599), written as codes and classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet {
    bits: [u64; 10],
    /// As configured, for descriptions.
    text: String,
}

impl StatusSet {
    /// No status yet; validation inserts the configured ones.
    pub(in crate::config) fn empty() -> Self {
        StatusSet {
            bits: [0; 10],
            text: String::new(),
        }
    }

    pub fn contains(&self, status: u16) -> bool {
        let s = status as usize;
        s < 640 && self.bits[s / 64] & (1 << (s % 64)) != 0
    }

    /// `status` must be below 640.
    pub(in crate::config) fn insert(&mut self, status: u16) {
        let s = status as usize;
        self.bits[s / 64] |= 1 << (s % 64);
    }

    /// The set as the file wrote it, normalised (e.g. `401, 5xx`).
    pub fn text(&self) -> &str {
        &self.text
    }

    pub(in crate::config) fn set_text(&mut self, text: String) {
        self.text = text;
    }
}
