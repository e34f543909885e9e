//! The denials this replica answered lately, for the admin console's "recent denials": one
//! entry per caller, limit and reason (when, route, tier, limit, caller, reason, how often; a
//! denial from the deny cache counts with the store's `over limit`),
//! the most recently denied first, kept for [`WINDOW`] and at most [`CAPACITY`] entries.
//!
//! A flood is one caller denied thousands of times a second, and two floods interleave: a ring
//! of single denials would keep the last seconds only and allocate on every denied request.
//! A denial therefore counts on its caller's entry (its `count` and `last` move, and it becomes
//! the newest): the newest entry is compared first, which is what a flood hits, at the cost of
//! one comparison and no allocation; another caller's entry is found by a scan of at most
//! [`CAPACITY`] entries and moved to the front, still without allocating. Only a caller not
//! yet listed allocates its entry, and pushes out the one denied longest ago when full.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::config::{Limit, LimitSet};
use crate::throttle::{headers, keys, Denial, Limited};

/// Entries kept: callers (by limit and reason) denied within [`WINDOW`].
pub const CAPACITY: usize = 200;

/// How long an entry is listed after its last denial.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// The denials of one caller by one limit (for one reason), from the first to the last.
#[derive(Debug, Clone)]
pub struct Denied {
    /// The first and the last denial.
    pub first: SystemTime,
    pub last: SystemTime,
    pub route: String,
    /// The tier whose limits denied, if not the route's own.
    pub tier: Option<String>,
    /// The limit the client was told about (`RateLimit`): the one it waits longest for.
    pub limit: String,
    /// The caller's identity part of the key (`header=alice`, `bearer#…`), as stored.
    pub item: String,
    pub reason: Reason,
    pub count: u64,
}

/// Why the request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The limit's quota is used up.
    OverLimit,
    /// The limit has `block_for`: its denial puts the caller in the penalty box.
    PenaltyBox,
    /// Answered from the deny cache (the store denied the caller a moment ago).
    DenyCache,
    /// The store failed and the in-memory fallback (`on_error: local`) refused.
    Fallback,
}

impl Reason {
    /// The reasons listed as one: a denial answered from the deny cache repeats the store's
    /// `over limit`.
    fn group(self) -> Reason {
        match self {
            Reason::DenyCache => Reason::OverLimit,
            other => other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::OverLimit => "over limit",
            Reason::PenaltyBox => "penalty box (block_for)",
            Reason::DenyCache => "over limit (deny cache)",
            Reason::Fallback => "store failed: in-memory fallback",
        }
    }
}

#[derive(Debug, Default)]
pub struct RecentDenials {
    ring: Mutex<VecDeque<Denied>>,
}

/// The limit whose refusal a denial reports (the one its headers name).
pub fn refusing_limit<'s>(limited: &Limited<'s>) -> Option<&'s Limit> {
    let set: &LimitSet = limited.set;
    let index = match &limited.denial {
        Denial::Decided(verdicts) => headers::reported(set, verdicts),
        Denial::Remembered { denial, at } => {
            let verdicts: Vec<_> = denial.aged(*at).collect();
            headers::reported(set, &verdicts)
        }
    };
    index.and_then(|i| set.get(i))
}

impl RecentDenials {
    /// Remembers one denial (see the module docs).
    pub fn record(&self, key_prefix: &str, limited: &Limited<'_>) {
        let set: &LimitSet = limited.set;
        let Some(item) = keys::identity_of(key_prefix, set, &limited.key) else {
            return;
        };
        let reason = match &limited.denial {
            Denial::Decided(_) => None,
            Denial::Remembered { .. } => Some(Reason::DenyCache),
        };
        let Some(limit) = refusing_limit(limited) else {
            return;
        };
        let reason = if limited.by_fallback {
            Reason::Fallback
        } else if limit.block_for.is_some() {
            Reason::PenaltyBox
        } else {
            reason.unwrap_or(Reason::OverLimit)
        };
        let tier = set.key_name.split_once('~').map(|(_, tier)| tier);
        let now = SystemTime::now();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let same = |entry: &Denied| {
            entry.item == item
                && entry.limit == limit.name
                && entry.route == set.route
                && entry.tier.as_deref() == tier
                && entry.reason.group() == reason.group()
        };
        if let Some(at) = ring.iter().position(same) {
            // The newest already (a flood): counted in place; else moved to the front.
            let mut entry = if at == 0 {
                ring.pop_front()
            } else {
                ring.remove(at)
            }
            .expect("a listed entry");
            entry.count += 1;
            entry.last = now;
            // Once the store decided, the entry says so (the deny cache only repeats it).
            if reason == Reason::OverLimit {
                entry.reason = reason;
            }
            ring.push_front(entry);
            return;
        }
        if ring.len() == CAPACITY {
            ring.pop_back();
        }
        ring.push_front(Denied {
            first: now,
            last: now,
            route: set.route.clone(),
            tier: tier.map(str::to_owned),
            limit: limit.name.clone(),
            item: item.to_owned(),
            reason,
            count: 1,
        });
    }

    /// The entries denied within [`WINDOW`], the most recently denied first.
    pub fn list(&self) -> Vec<Denied> {
        let since = SystemTime::now()
            .checked_sub(WINDOW)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter()
            .take_while(|d| d.last >= since)
            .cloned()
            .collect()
    }
}
