//! Limits that see the response: `count_statuses` (only responses with these statuses use
//! the limit) and `cost_from_response` (the response reports what the request cost). Both are
//! settled after the response (see `throttle::settle`); this module holds their validated form
//! and refuses them where the arithmetic cannot honour them, saying why.

use http::HeaderName;

use super::raw::{RawLimit, RawStatus};
use super::{Limit, Scope, Validator};
use crate::limit::Algorithm;

/// What a limit learns from the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByResponse {
    /// Only responses with these statuses use the limit: each request reserves its cost up
    /// front (so a burst cannot overshoot) and gets it back when the status does not count.
    CountStatuses(StatusSet),
    /// Post-paid: the configured cost is paid up front and, when the response ends, the
    /// difference to the cost reported in this header or trailer is charged or given back.
    CostFromResponse(HeaderName),
}

impl ByResponse {
    /// For `check` and `explain`: e.g. `counts only 401, 5xx`.
    pub fn describe(&self) -> String {
        match self {
            ByResponse::CountStatuses(set) => format!("counts only {}", set.text),
            ByResponse::CostFromResponse(name) => format!("cost from response `{name}`"),
        }
    }
}

/// A set of HTTP statuses (100–599), written as codes and classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet {
    bits: [u64; 10],
    /// As configured, for descriptions.
    text: String,
}

impl StatusSet {
    pub fn contains(&self, status: u16) -> bool {
        let s = status as usize;
        s < 640 && self.bits[s / 64] & (1 << (s % 64)) != 0
    }

    fn insert(&mut self, status: u16) {
        let s = status as usize;
        self.bits[s / 64] |= 1 << (s % 64);
    }
}

const ALLOWED_STATUSES: &str =
    "status codes 100–599 (e.g. 401) and classes \"1xx\" … \"5xx\" (quoted)";

impl Validator<'_> {
    /// The `count_statuses` / `cost_from_response` of one limit, if any.
    pub(crate) fn by_response(
        &mut self,
        path: &str,
        raw: &RawLimit,
        algorithm: Algorithm,
    ) -> Option<ByResponse> {
        match (&raw.count_statuses, &raw.cost_from_response) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                self.error(path, "give `count_statuses` or `cost_from_response`, not both: a limit either counts some responses or charges what responses report");
                None
            }
            (Some(list), None) => {
                let path = format!("{path}.count_statuses");
                if algorithm == Algorithm::Concurrency {
                    self.error(&path, "concurrency limits already return their slot when the response ends, whatever its status: count_statuses would change nothing");
                    return None;
                }
                if list.is_empty() {
                    self.error(
                        &path,
                        format!("list at least one status: {ALLOWED_STATUSES}"),
                    );
                    return None;
                }
                let mut set = StatusSet {
                    bits: [0; 10],
                    text: String::new(),
                };
                let mut names = Vec::new();
                for (i, status) in list.iter().enumerate() {
                    match status {
                        RawStatus::Code(code) if (100..=599).contains(code) => {
                            set.insert(*code as u16);
                            names.push(code.to_string());
                        }
                        RawStatus::Class(class) if is_class(class) => {
                            let first = (class.as_bytes()[0] - b'0') as u16 * 100;
                            for status in first..first + 100 {
                                set.insert(status);
                            }
                            names.push(class.to_ascii_lowercase());
                        }
                        RawStatus::Code(code) => self.error(
                            &format!("{path}[{i}]"),
                            format!("{code} is not an HTTP status: use {ALLOWED_STATUSES}"),
                        ),
                        RawStatus::Class(text) => self.error(
                            &format!("{path}[{i}]"),
                            format!("`{text}` is not a status or class: use {ALLOWED_STATUSES}"),
                        ),
                    }
                }
                set.text = names.join(", ");
                Some(ByResponse::CountStatuses(set))
            }
            (None, Some(name)) => {
                let path = format!("{path}.cost_from_response");
                let why = match algorithm {
                    Algorithm::SlidingLog => Some("sliding_log stores one entry per unit at the time it was taken: a reported cost of thousands of units would be thousands of entries, and a debt has no time to be entered at; use token_bucket, gcra, fixed_window or sliding_window"),
                    Algorithm::Concurrency => Some("concurrency limits count requests in flight, not units used: there is nothing to charge after the response; use token_bucket, gcra, fixed_window or sliding_window"),
                    _ => None,
                };
                if let Some(why) = why {
                    self.error(&path, why);
                    return None;
                }
                match HeaderName::from_bytes(name.trim().as_bytes()) {
                    Ok(name) => Some(ByResponse::CostFromResponse(name)),
                    Err(_) => {
                        self.error(
                            &path,
                            format!("`{name}` is not a valid header or trailer name"),
                        );
                        None
                    }
                }
            }
        }
    }

    /// Settled limits on a route must all be decided by one store: a route mixing local and
    /// global limits decides them in two steps on two clocks, and a refund must name the
    /// time on the clock that took the units.
    pub(crate) fn by_response_scopes(&mut self, path: &str, limits: &[Limit]) {
        let mixed = limits.iter().any(|l| l.scope == Scope::Local)
            && limits.iter().any(|l| l.scope == Scope::Global);
        if mixed && limits.iter().any(|l| l.by_response.is_some()) {
            self.error(&format!("{path}.limits"), "count_statuses and cost_from_response need all limits of the route (or tier) in one scope: local and global limits are decided on two clocks, and a settlement must find the units where they were taken; make the scopes agree or split the route");
        }
    }
}

fn is_class(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 3 && (b'1'..=b'5').contains(&b[0]) && b[1..].eq_ignore_ascii_case(b"xx")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_codes() {
        assert!(is_class("5xx") && is_class("1XX") && is_class("4xX"));
        assert!(!is_class("6xx") && !is_class("0xx") && !is_class("5x") && !is_class("50x"));
        let mut set = StatusSet {
            bits: [0; 10],
            text: String::new(),
        };
        set.insert(401);
        assert!(set.contains(401));
        assert!(!set.contains(400) && !set.contains(402) && !set.contains(1000));
    }
}
