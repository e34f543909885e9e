//! What the operator API answers: the typed results of [`super::Control`]'s methods (a
//! caller's state, a reset, an override set or removed, the overrides in force, the audit
//! trail), which the admin endpoints serve as JSON and as text, `tollgate limits` prints, and
//! the console shows.
//!
//! Field names are the JSON keys the endpoints answer with, and every field is serialized
//! (a missing value is `null`) unless its doc says otherwise; the endpoints print an answer
//! through `serde_json::Value` (keys in name order), so the bytes do not depend on the order
//! fields are declared in here. Each type also reads its JSON back (`Deserialize`): `tollgate
//! limits` asks an admin listener and renders its answer as the listener would. The text forms
//! are here beside the types, so that the two never disagree on a field.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An answer as the endpoints print it: through `Value`, keys in name order.
pub fn to_json<T: Serialize>(answer: &T) -> Value {
    serde_json::to_value(answer).expect("answers serialize to JSON")
}

/// How a route shows its callers' values ([`super::shown::Shown`]): the rule for a value named
/// by an operator, and the rule per source kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisplayRules {
    pub rule: String,
    pub by_source: BTreeMap<String, String>,
}

/// `GET /limits/state`: one caller's limits on a route, read without consuming.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallerState {
    pub route: String,
    /// The caller's value as the route shows it.
    pub identity: String,
    pub display: DisplayRules,
    pub limits: Vec<LimitState>,
    /// The first override in force (of every limit when there is one), as before overrides
    /// of single limits; `overrides` lists them all.
    #[serde(rename = "override")]
    pub first_override: Option<OverrideShown>,
    pub overrides: Vec<OverrideShown>,
}

/// One limit (of the route's or a tier's) for one of the caller's store keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LimitState {
    Read(Box<LimitRead>),
    /// A local limit asked of Redis by the command line: it lives in each proxy's memory.
    Unread(LimitUnread),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitRead {
    /// The tier whose limit it is; None for the route's own.
    pub tier: Option<String>,
    pub limit_name: String,
    pub algorithm: String,
    /// `local` or `global`.
    pub scope: String,
    /// The source kinds of the key's identity part (`header`, `header+client_ip`).
    pub source: String,
    pub identity: String,
    /// The store key as the route shows it.
    pub key: String,
    pub shared_by_everyone: bool,
    pub overridden: bool,
    /// The override that set this limit, when one does.
    #[serde(rename = "override")]
    pub by: Option<OverrideShown>,
    pub configured_limit: u64,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_seconds: f64,
    /// None while a request would pass; negative when none can at this cost.
    pub retry_after_seconds: Option<f64>,
    /// A running penalty box (`block_for`); absent from the JSON when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Block>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitUnread {
    pub tier: Option<String>,
    pub limit_name: String,
    pub algorithm: String,
    pub scope: String,
    pub key: String,
    /// Why the state is not known here.
    pub unknown: String,
}

/// A block started by a limit's `block_for`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// The limit that started it.
    pub by: String,
    /// Its end, RFC 3339 to the second.
    pub until: String,
    pub remaining_s: f64,
    /// Its marker's key, as the route shows it.
    pub key: String,
}

/// `POST /limits/reset`: what was deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResetDone {
    pub route: String,
    pub identity: String,
    pub limit_name: Option<String>,
    /// Always true (the field scripts test).
    pub reset: bool,
    /// The keys deleted (as the route shows them), in the order they were named.
    pub keys: Vec<String>,
    pub deleted: usize,
    /// Keys every caller shares (a `global` limit): left alone.
    pub kept_shared_by_everyone: Vec<String>,
}

/// One override as the endpoints show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverrideShown {
    pub route: String,
    pub identity: String,
    pub limit_name: Option<String>,
    pub limit: Option<u64>,
    pub multiply: Option<f64>,
    /// Its end, RFC 3339 to the millisecond.
    pub until: String,
    pub expires_in_seconds: f64,
    pub set_by: Option<String>,
    pub set_at: Option<String>,
    pub set_on: Option<String>,
}

impl OverrideShown {
    /// `limit N` or `limit xF`.
    pub fn how(&self) -> String {
        match (self.limit, self.multiply) {
            (Some(n), _) => format!("limit {n}"),
            (_, Some(f)) => format!("limit x{f}"),
            _ => "?".to_owned(),
        }
    }
}

/// What an override does to one of the caller's limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedLimit {
    pub tier: Option<String>,
    pub name: String,
    /// The limit's period as a person reads it (`1m`).
    pub period: String,
    pub before: u64,
    pub after: u64,
    pub changed: bool,
    /// Worked out in proportion rather than given.
    pub scaled: bool,
}

/// `POST /limits/override`: the override, and what each of the caller's limits becomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverrideDone {
    #[serde(rename = "override")]
    pub set: OverrideShown,
    pub dry_run: bool,
    pub applied: bool,
    pub limits: Vec<PlannedLimit>,
}

/// `DELETE /limits/override`: how many overrides ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverrideRemoved {
    pub route: String,
    pub identity: String,
    pub limit_name: Option<String>,
    pub removed: usize,
}

/// `GET /limits/overrides`: every override in force, soonest to end first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverridesList {
    pub overrides: Vec<OverrideShown>,
}

/// `GET /limits/audit`: the last entries of the trail, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditTrail {
    pub entries: Vec<AuditEntry>,
}

/// One operator action in the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When, RFC 3339 to the millisecond.
    pub at: String,
    /// `token`, `loopback` or `cli` ([`super::audit::Who`]).
    pub who: String,
    /// `reset`, `override` or `override_removed`.
    pub action: String,
    pub route: String,
    pub identity: String,
    pub parameters: AuditParameters,
    /// The replica (host and pid) that acted.
    pub replica: String,
    /// The stream entry's id (Redis only; absent from the JSON otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// An action's parameters, by action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AuditParameters {
    Override {
        limit_name: Option<String>,
        limit: Option<u64>,
        multiply: Option<f64>,
        #[serde(rename = "for")]
        lasting: String,
        until: String,
    },
    Reset {
        limit_name: Option<String>,
        deleted: usize,
    },
    Removed {
        limit_name: Option<String>,
        removed: usize,
    },
    /// Written by another version of tollgate: shown as it is.
    Other(Value),
}

/// Seconds as a person reads them, to the millisecond (`29s 200ms`).
fn duration(seconds: f64) -> String {
    let millis = (seconds.max(0.0) * 1000.0).round() as u64;
    humantime::format_duration(Duration::from_millis(millis)).to_string()
}

/// ` limit NAME`, or nothing for every limit.
fn limit_suffix(limit_name: &Option<String>) -> String {
    limit_name
        .as_deref()
        .map(|n| format!(" limit {n}"))
        .unwrap_or_default()
}

/// ` (tier NAME)`, or nothing for the route's own limits.
fn tier_suffix(tier: &Option<String>) -> String {
    tier.as_deref()
        .map(|t| format!(" (tier {t})"))
        .unwrap_or_default()
}

impl CallerState {
    /// One line per override, then a few per limit (the CLI's and the endpoint's text form).
    pub fn text(&self) -> String {
        let mut out = format!("route     {}\nidentity  {}\n", self.route, self.identity);
        for o in &self.overrides {
            out.push_str(&format!(
                "override  {} on {} until {} (in {})\n",
                o.how(),
                match &o.limit_name {
                    Some(name) => format!("limit {name}"),
                    None => "every limit".to_owned(),
                },
                o.until,
                duration(o.expires_in_seconds)
            ));
        }
        for limit in &self.limits {
            out.push_str(&limit.text());
        }
        out
    }
}

impl LimitState {
    fn text(&self) -> String {
        let l = match self {
            LimitState::Unread(l) => {
                return format!(
                    "limit     {}{} ({} local)\n  key       {}\n  now       unknown: {}\n",
                    l.limit_name,
                    tier_suffix(&l.tier),
                    l.algorithm,
                    l.key,
                    l.unknown
                )
            }
            LimitState::Read(l) => l,
        };
        let mut tier = tier_suffix(&l.tier);
        if l.overridden {
            tier = format!("{tier}, overridden (configured {})", l.configured_limit);
        }
        let head = format!(
            "limit     {}{tier} ({} {}, by {})\n  key       {}\n",
            l.limit_name, l.algorithm, l.scope, l.source, l.key
        );
        if let Some(block) = &l.blocked {
            return format!(
                "{head}  block key {}\n  now       BLOCKED until {} ({}) by {}\n",
                block.key,
                block.until,
                duration(block.remaining_s.ceil()),
                block.by,
            );
        }
        format!(
            "{head}  now       {} {} of {} left, full again in {}{}\n",
            if l.allowed { "would pass:" } else { "LIMITED:" },
            l.remaining,
            l.limit,
            duration(l.reset_after_seconds),
            match l.retry_after_seconds {
                Some(s) if s < 0.0 => ", and can never pass at this cost".to_owned(),
                Some(s) => format!(", retry after {}", duration(s)),
                None => String::new(),
            }
        )
    }
}

impl ResetDone {
    pub fn text(&self) -> String {
        format!(
            "reset     route {} identity {}{}: {} key(s) deleted\n",
            self.route,
            self.identity,
            limit_suffix(&self.limit_name),
            self.deleted
        )
    }
}

impl OverrideDone {
    /// What the audit trail keeps of an override set for `lasting`.
    pub fn audit_parameters(&self, lasting: Duration) -> AuditParameters {
        AuditParameters::Override {
            limit_name: self.set.limit_name.clone(),
            limit: self.set.limit,
            multiply: self.set.multiply,
            lasting: humantime::format_duration(lasting).to_string(),
            until: self.set.until.clone(),
        }
    }

    /// The override, then what each limit becomes.
    pub fn text(&self) -> String {
        let o = &self.set;
        let mut out = format!(
            "override  route {} identity {}{}: {} until {}{}\n",
            o.route,
            o.identity,
            limit_suffix(&o.limit_name),
            o.how(),
            o.until,
            if self.dry_run {
                " (dry run: nothing changed)"
            } else {
                ""
            }
        );
        for l in &self.limits {
            out.push_str(&format!(
                "  limit   {}{} per {}: {} -> {}{}\n",
                l.name,
                tier_suffix(&l.tier),
                l.period,
                l.before,
                l.after,
                match (l.changed, l.scaled) {
                    (false, _) => " (unchanged)",
                    (_, true) => " (scaled)",
                    _ => "",
                }
            ));
        }
        out
    }
}

impl OverrideRemoved {
    pub fn text(&self) -> String {
        format!(
            "override  route {} identity {}{}: removed ({})\n",
            self.route,
            self.identity,
            limit_suffix(&self.limit_name),
            self.removed
        )
    }
}

impl OverridesList {
    /// One line per override.
    pub fn text(&self) -> String {
        if self.overrides.is_empty() {
            return "no overrides in force\n".to_owned();
        }
        let mut out = String::new();
        for o in &self.overrides {
            out.push_str(&format!(
                "route {} identity {} limit {}: {} until {} (in {}), set by {} at {} on {}\n",
                o.route,
                o.identity,
                o.limit_name.as_deref().unwrap_or("(all)"),
                o.how(),
                o.until,
                humantime::format_duration(Duration::from_secs(o.expires_in_seconds.ceil() as u64)),
                o.set_by.as_deref().unwrap_or("?"),
                o.set_at.as_deref().unwrap_or("?"),
                o.set_on.as_deref().unwrap_or("?"),
            ));
        }
        out
    }
}

impl AuditTrail {
    /// One line per entry, its parameters as `name=value` (those given).
    pub fn text(&self) -> String {
        if self.entries.is_empty() {
            return "no operator actions recorded\n".to_owned();
        }
        let mut out = String::new();
        for e in &self.entries {
            let parameters = to_json(&e.parameters)
                .as_object()
                .map(|p| {
                    p.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| {
                            format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_owned))
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "{}  {:<8}  {:<16}  route {} identity {}{}{}\n",
                e.at,
                e.who,
                e.action,
                e.route,
                e.identity,
                if parameters.is_empty() { "" } else { "  " },
                parameters
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown_override() -> OverrideShown {
        OverrideShown {
            route: "api".into(),
            identity: "alice".into(),
            limit_name: None,
            limit: None,
            multiply: Some(10.0),
            until: "2026-11-26T12:40:00.000Z".into(),
            expires_in_seconds: 3600.0,
            set_by: Some("token".into()),
            set_at: None,
            set_on: None,
        }
    }

    #[test]
    fn answers_read_their_json_back() {
        let done = OverrideDone {
            set: shown_override(),
            dry_run: true,
            applied: false,
            limits: vec![PlannedLimit {
                tier: None,
                name: "minute".into(),
                period: "1m".into(),
                before: 10,
                after: 100,
                changed: true,
                scaled: true,
            }],
        };
        let json = to_json(&done);
        assert_eq!(json["override"]["multiply"], 10.0);
        assert_eq!(json["override"]["limit"], Value::Null);
        assert_eq!(serde_json::from_value::<OverrideDone>(json).unwrap(), done);
        for parameters in [
            AuditParameters::Reset {
                limit_name: None,
                deleted: 2,
            },
            AuditParameters::Removed {
                limit_name: Some("minute".into()),
                removed: 1,
            },
            AuditParameters::Override {
                limit_name: None,
                limit: Some(5),
                multiply: None,
                lasting: "1h".into(),
                until: "2026-11-26T12:40:00.000Z".into(),
            },
        ] {
            let json = to_json(&parameters);
            assert_eq!(
                serde_json::from_value::<AuditParameters>(json).unwrap(),
                parameters
            );
        }
    }

    #[test]
    fn an_unread_limit_reads_back_as_unread() {
        let unread = LimitState::Unread(LimitUnread {
            tier: None,
            limit_name: "minute".into(),
            algorithm: "gcra".into(),
            scope: "local".into(),
            key: "tg:{api}:minute:header=a".into(),
            unknown: "a local limit".into(),
        });
        let back: LimitState = serde_json::from_value(to_json(&unread)).unwrap();
        assert_eq!(back, unread);
        assert!(back.text().contains("now       unknown: a local limit"));
    }
}
