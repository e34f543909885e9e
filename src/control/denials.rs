//! The last denials this replica answered, for the admin console's "recent denials": a bounded
//! ring of (when, route, tier, limit, caller, reason), newest first.
//!
//! A flood is one caller denied thousands of times a second: pushed one by one it would push
//! every other denial out of the ring at once and allocate on every denied request. A denial
//! of the same caller by the same limit as the newest entry therefore only counts on that
//! entry (its `count` and `last` move), which costs a comparison and no allocation; the ring
//! shows who was denied, in order, and how often in a row.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::LimitSet;
use crate::throttle::{headers, keys, Denial, Limited};

/// Entries the ring keeps.
pub const CAPACITY: usize = 100;

/// One run of denials of one caller by one limit.
#[derive(Debug, Clone)]
pub struct Denied {
    /// The first and the last denial of the run.
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

impl RecentDenials {
    /// Remembers one denial (see the module docs).
    pub fn record(&self, key_prefix: &str, limited: &Limited<'_>) {
        let set: &LimitSet = limited.set;
        let Some(item) = keys::identity_of(key_prefix, set, &limited.key) else {
            return;
        };
        let (index, reason) = match &limited.denial {
            Denial::Decided(verdicts) => (headers::reported(set, verdicts), None),
            Denial::Remembered { denial, at } => {
                let verdicts: Vec<_> = denial.aged(*at).collect();
                (headers::reported(set, &verdicts), Some(Reason::DenyCache))
            }
        };
        let Some(limit) = index.and_then(|i| set.get(i)) else {
            return;
        };
        let reason = if limited.by_fallback {
            Reason::Fallback
        } else if limit.block_for.is_some() {
            Reason::PenaltyBox
        } else {
            reason.unwrap_or(Reason::OverLimit)
        };
        let tier = set
            .key_name
            .split_once('~')
            .map(|(_, tier)| tier.to_owned());
        let now = SystemTime::now();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(newest) = ring.front_mut() {
            if newest.item == item
                && newest.limit == limit.name
                && newest.route == set.route
                && newest.tier.as_deref() == tier.as_deref()
                && newest.reason == reason
            {
                newest.count += 1;
                newest.last = now;
                return;
            }
        }
        if ring.len() == CAPACITY {
            ring.pop_back();
        }
        ring.push_front(Denied {
            first: now,
            last: now,
            route: set.route.clone(),
            tier,
            limit: limit.name.clone(),
            item: item.to_owned(),
            reason,
            count: 1,
        });
    }

    /// The entries, newest first.
    pub fn list(&self) -> Vec<Denied> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().cloned().collect()
    }
}
