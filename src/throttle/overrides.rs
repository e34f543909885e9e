//! Temporary overrides as the limit stage reads them: one caller's limits on one route raised
//! or lowered until a time (`POST /limits/override`, `tollgate limits override`).
//!
//! The table maps a store key to how that limit is adjusted and until when: the keys are the
//! very keys the stage builds for the caller (route limits and any tier whose values name it),
//! so a request finds its override by the keys it already has, whatever identity kind named
//! it. A limit whose state counts requests in windows of its own period keeps counting on the
//! usual key under the adjusted limit (the entry's `key` is the key itself), so an override
//! never forgets what the caller used in the window. A token bucket or GCRA stores a state in
//! units of its own limit (tokens, a theoretical arrival time), which would mean something
//! else under a changed limit: while overridden, that limit counts on a key of its own
//! ([`override_key`]: the limit's name with `~!override` appended, a name no limit can have,
//! in the usual key's hash tag), and when the override ends the caller is back on its usual
//! key with the usage it had there. A key every caller shares (`global`) is never in the
//! table: one caller's override must not move everyone's limit.
//!
//! The table is filled off the request path (`crate::control::overrides`: from Redis by a
//! watch on a generation counter, or from process memory) and swapped whole; a request with no
//! override active anywhere pays one atomic load. An entry's expiry is checked when it is
//! used, so an override ends on time even before the table is next rebuilt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use crate::limit::{Check, Params, MAX_SAFE};

/// How an override changes a limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Adjust {
    /// The limit becomes this many units per period (a token bucket's or GCRA's burst
    /// scaled in proportion).
    Limit(u64),
    /// The limit (and burst) times this factor, rounded, at least 1.
    Multiply(f64),
}

impl Adjust {
    /// `params` with the limit adjusted.
    pub fn apply(self, params: Params) -> Params {
        let factor = match self {
            Adjust::Limit(n) => n as f64 / params.limit.max(1) as f64,
            Adjust::Multiply(f) => f,
        };
        let scale = |units: u64| {
            ((units as f64) * factor)
                .round()
                .clamp(1.0, MAX_SAFE as f64) as u64
        };
        let limit = match self {
            Adjust::Limit(n) => n.max(1),
            Adjust::Multiply(_) => scale(params.limit),
        };
        let burst = if params.burst == params.limit {
            limit
        } else {
            scale(params.burst)
        };
        Params {
            limit,
            burst,
            ..params
        }
    }
}

/// One active override of one store key.
#[derive(Debug, Clone, PartialEq)]
pub struct Active {
    pub adjust: Adjust,
    /// When it ends, in milliseconds since the Unix epoch.
    pub until_ms: u64,
    /// For a usual key, the key the caller counts on instead while overridden; None for that
    /// key itself.
    pub key: Option<String>,
}

/// The overrides the limit stage applies, by store key.
#[derive(Default)]
pub struct Overrides {
    /// Whether the table holds anything: the one load a request pays when it does not.
    any: AtomicBool,
    table: ArcSwap<HashMap<String, Active>>,
}

impl Overrides {
    /// Replaces the whole table.
    pub fn replace(&self, table: HashMap<String, Active>) {
        let any = !table.is_empty();
        self.table.store(Arc::new(table));
        self.any.store(any, Ordering::Release);
    }

    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Replaces each of `keys` that has an override in force now by the key the caller counts
    /// on while overridden; whether any was.
    pub fn rekey(&self, keys: &mut [String]) -> bool {
        if self.is_empty() {
            return false;
        }
        let table = self.table.load();
        let now = now_ms();
        let mut any = false;
        for k in keys {
            if let Some(Active {
                key: Some(instead),
                until_ms,
                ..
            }) = table.get(k.as_str())
            {
                if *until_ms > now {
                    k.clone_from(instead);
                    any = true;
                }
            }
        }
        any
    }

    /// The override in force now on any of `keys` (a caller's usual keys, before
    /// [`Overrides::rekey`]): how it adjusts them and when it ends (ms since the epoch).
    pub fn in_force(&self, keys: &[String]) -> Option<(Adjust, u64)> {
        if self.is_empty() {
            return None;
        }
        let table = self.table.load();
        let now = now_ms();
        keys.iter().find_map(|k| match table.get(k.as_str()) {
            Some(active) if active.key.is_some() && active.until_ms > now => {
                Some((active.adjust, active.until_ms))
            }
            _ => None,
        })
    }

    /// Adjusts the params of every check whose key has an override in force now.
    pub fn apply(&self, checks: &mut [Check<'_>]) {
        if self.is_empty() {
            return;
        }
        let table = self.table.load();
        let now = now_ms();
        for check in checks {
            if let Some(active) = table.get(check.key).filter(|a| a.until_ms > now) {
                check.params = active.adjust.apply(check.params);
            }
        }
    }
}

/// What an overridden caller's keys add to the limit's name (no limit name can contain `!`).
pub const OVERRIDE_SUFFIX: &str = "~!override";

/// The key a caller counts on while overridden, for `key`, one of `key_name`'s keys: the
/// limit's name followed by [`OVERRIDE_SUFFIX`] (`<prefix>{<key_name>|<id>}:<limit>~!override`,
/// `<prefix>{<key_name>}:<limit>~!override:<id>`). The hash tag is the usual key's, so one
/// limit overridden beside others that are not (an override of one limit, a limit every
/// caller shares) keeps a decision's keys in one Cluster slot.
pub fn override_key(prefix: &str, key_name: &str, key: &str) -> String {
    // The tag closes at the first `}:` after the key name: identities hold no `}`.
    let from = (prefix.len() + 1 + key_name.len()).min(key.len());
    let limit_at = key[from..].find("}:").map_or(key.len(), |at| from + at + 2);
    let end = key[limit_at..]
        .find(':')
        .map_or(key.len(), |at| limit_at + at);
    let mut out = String::with_capacity(key.len() + OVERRIDE_SUFFIX.len());
    out.push_str(&key[..end]);
    out.push_str(OVERRIDE_SUFFIX);
    out.push_str(&key[end..]);
    out
}

/// Milliseconds since the Unix epoch on this host's clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn params(algorithm: Algorithm, limit: u64, burst: u64) -> Params {
        Params {
            algorithm,
            limit,
            period_us: 60_000_000,
            burst,
            cost: 1,
            calendar: None,
        }
    }

    #[test]
    fn adjustments_scale_limit_and_burst() {
        let p = params(Algorithm::FixedWindow, 10, 10);
        assert_eq!(Adjust::Limit(50).apply(p).limit, 50);
        assert_eq!(Adjust::Limit(50).apply(p).burst, 50);
        assert_eq!(Adjust::Multiply(10.0).apply(p).limit, 100);
        assert_eq!(Adjust::Multiply(0.01).apply(p).limit, 1, "never below one");
        let tb = params(Algorithm::TokenBucket, 10, 20);
        assert_eq!(Adjust::Multiply(2.0).apply(tb).burst, 40);
        assert_eq!(Adjust::Limit(5).apply(tb).burst, 10);
    }

    #[test]
    fn only_keys_in_force_are_adjusted() {
        let overrides = Overrides::default();
        let p = params(Algorithm::FixedWindow, 10, 10);
        let mut checks = [Check {
            key: "k",
            params: p,
            shadow: false,
            block_us: 0,
        }];
        overrides.apply(&mut checks);
        assert_eq!(checks[0].params, p);
        let active = |until_ms, key: Option<&str>| Active {
            adjust: Adjust::Multiply(3.0),
            until_ms,
            key: key.map(str::to_owned),
        };
        let later = now_ms() + 60_000;
        overrides.replace(HashMap::from([
            ("k".to_owned(), active(later, Some("k2"))),
            ("k2".to_owned(), active(later, None)),
            ("old".to_owned(), active(now_ms() - 1, Some("old2"))),
        ]));
        let mut keys = ["k".to_owned(), "old".to_owned(), "x".to_owned()];
        // What `/_quota` shows: the override in force on a caller's usual keys.
        assert_eq!(
            overrides.in_force(&keys),
            Some((Adjust::Multiply(3.0), later))
        );
        assert_eq!(overrides.in_force(&keys[1..]), None, "expired, or none");
        assert_eq!(
            overrides.in_force(&["k2".to_owned()]),
            None,
            "not a usual key"
        );
        assert!(overrides.rekey(&mut keys));
        assert_eq!(
            keys,
            ["k2", "old", "x"],
            "an expired override is not in force"
        );
        let mut checks = [Check {
            key: &keys[0],
            params: p,
            shadow: false,
            block_us: 0,
        }];
        overrides.apply(&mut checks);
        assert_eq!(checks[0].params.limit, 30);
        assert_eq!(
            override_key("tg:", "api", "tg:{api}:lim:header=a"),
            "tg:{api}:lim~!override:header=a"
        );
        assert_eq!(
            override_key(
                "tg:",
                "api~gold",
                "tg:{api~gold|header=a|client_ip=1.2.3.4}:lim"
            ),
            "tg:{api~gold|header=a|client_ip=1.2.3.4}:lim~!override"
        );
    }
}
