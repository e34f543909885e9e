//! Validation of the limits that see the response: `count_statuses` (only responses with
//! these statuses use the limit) and `cost_from_response` (the response reports what the
//! request cost), refused where the arithmetic cannot honour them, saying why.

use http::HeaderName;

use super::validator::Validator;
use crate::config::model::{ByResponse, Limit, Scope, StatusSet};
use crate::config::raw::{RawLimit, RawStatus};
use crate::limit::Algorithm;

const ALLOWED_STATUSES: &str =
    "status codes 100–599 (e.g. 401) and classes \"1xx\" … \"5xx\" (quoted)";

/// The `count_statuses` / `cost_from_response` of one limit, if any.
pub(super) fn by_response(
    v: &mut Validator,
    path: &str,
    raw: &RawLimit,
    algorithm: Algorithm,
) -> Option<ByResponse> {
    match (&raw.count_statuses, &raw.cost_from_response) {
        (None, None) => None,
        (Some(_), Some(_)) => {
            v.error(path, "give `count_statuses` or `cost_from_response`, not both: a limit either counts some responses or charges what responses report");
            None
        }
        (Some(list), None) => count_statuses(v, &format!("{path}.count_statuses"), list, algorithm),
        (None, Some(name)) => {
            let path = format!("{path}.cost_from_response");
            let why = match algorithm {
                Algorithm::SlidingLog => Some("sliding_log stores one entry per unit at the time it was taken: a reported cost of thousands of units would be thousands of entries, and a debt has no time to be entered at; use token_bucket, gcra, fixed_window or sliding_window"),
                Algorithm::Concurrency => Some("concurrency limits count requests in flight, not units used: there is nothing to charge after the response; use token_bucket, gcra, fixed_window or sliding_window"),
                _ => None,
            };
            if let Some(why) = why {
                v.error(&path, why);
                return None;
            }
            match HeaderName::from_bytes(name.trim().as_bytes()) {
                Ok(name) => Some(ByResponse::CostFromResponse(name)),
                Err(_) => {
                    v.error(
                        &path,
                        format!("`{name}` is not a valid header or trailer name"),
                    );
                    None
                }
            }
        }
    }
}

fn count_statuses(
    v: &mut Validator,
    path: &str,
    list: &[RawStatus],
    algorithm: Algorithm,
) -> Option<ByResponse> {
    if algorithm == Algorithm::Concurrency {
        v.error(path, "concurrency limits already return their slot when the response ends, whatever its status: count_statuses would change nothing");
        return None;
    }
    if list.is_empty() {
        v.error(
            path,
            format!("list at least one status: {ALLOWED_STATUSES}"),
        );
        return None;
    }
    let mut set = StatusSet::empty();
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
            RawStatus::Code(code) => v.error(
                &format!("{path}[{i}]"),
                format!("{code} is not an HTTP status: use {ALLOWED_STATUSES}"),
            ),
            RawStatus::Class(text) => v.error(
                &format!("{path}[{i}]"),
                format!("`{text}` is not a status or class: use {ALLOWED_STATUSES}"),
            ),
        }
    }
    set.set_text(names.join(", "));
    Some(ByResponse::CountStatuses(set))
}

/// Settled limits on a route must all be decided by one store: a route mixing local and
/// global limits decides them in two steps on two clocks, and a refund must name the
/// time on the clock that took the units.
pub(super) fn by_response_scopes(v: &mut Validator, path: &str, limits: &[Limit]) {
    let mixed = limits.iter().any(|l| l.scope == Scope::Local)
        && limits.iter().any(|l| l.scope == Scope::Global);
    if mixed && limits.iter().any(|l| l.by_response.is_some()) {
        v.error(&format!("{path}.limits"), "count_statuses and cost_from_response need all limits of the route (or tier) in one scope: local and global limits are decided on two clocks, and a settlement must find the units where they were taken; make the scopes agree or split the route");
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
        let mut set = StatusSet::empty();
        set.insert(401);
        assert!(set.contains(401));
        assert!(!set.contains(400) && !set.contains(402) && !set.contains(1000));
    }
}
