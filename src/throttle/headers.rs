//! What a client is told about its limits: the IETF RateLimit fields
//! (draft-ietf-httpapi-ratelimit-headers, structured-field syntax), the legacy X-RateLimit-*
//! trio, `Retry-After`, and the RFC 9457 problem body of a limited response. Every rendering
//! of the limit stage's outcomes is here: the limit stage decides, the proxy answers with
//! what this module renders (a remembered denial's response is reused while it shows the
//! same seconds).
//!
//! Seconds are whole and rounded *up*, so a client that waits `Retry-After` seconds is never
//! early; `Retry-After` is never 0 (that invites an immediate retry).

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use crate::config::{Limit, LimitSet, ResponseConfig};
use crate::limit::algorithm::Verdict;

pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub fn ceil_secs(micros: i64) -> u64 {
    if micros <= 0 {
        0
    } else {
        (micros as u64).div_ceil(1_000_000)
    }
}

/// `Retry-After` seconds: rounded up and at least 1.
pub fn retry_after_secs(micros: i64) -> u64 {
    ceil_secs(micros).max(1)
}

/// Which limit the `RateLimit` field reports: on a denial the enforcing limit the client must
/// wait longest for (so `t` and `Retry-After` agree); otherwise the one closest to exhaustion
/// (lowest remaining share of its quota).
pub fn reported(limits: &[Limit], verdicts: &[Verdict]) -> Option<usize> {
    let denied = limits
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter(|(_, (l, v))| !v.allowed && !l.shadow)
        .max_by_key(|(_, (_, v))| v.retry_after_us)
        .map(|(i, _)| i);
    denied.or_else(|| {
        (0..verdicts.len()).min_by(|&a, &b| {
            let (va, vb) = (&verdicts[a], &verdicts[b]);
            // remaining_a / limit_a < remaining_b / limit_b, without division.
            (u128::from(va.remaining) * u128::from(vb.limit.max(1)))
                .cmp(&(u128::from(vb.remaining) * u128::from(va.limit.max(1))))
        })
    })
}

fn seconds_until_more(verdict: &Verdict) -> i64 {
    if verdict.allowed {
        verdict.reset_after_us
    } else {
        verdict.retry_after_us.max(verdict.reset_after_us.min(0))
    }
}

/// Adds the configured rate-limit fields for `set` to `headers` (`force_ietf` on limited
/// responses).
pub fn add_fields(
    headers: &mut HeaderMap,
    config: &ResponseConfig,
    set: &LimitSet,
    verdicts: &[Verdict],
    force_ietf: bool,
) {
    add_fields_with(headers, config, set, None, verdicts, force_ietf);
}

/// [`add_fields`] with the `RateLimit-Policy` given when it is not the set's own (a caller
/// whose limits a temporary override changed: see [`policy_for`]).
pub fn add_fields_with(
    headers: &mut HeaderMap,
    config: &ResponseConfig,
    set: &LimitSet,
    policy_given: Option<&HeaderValue>,
    verdicts: &[Verdict],
    force_ietf: bool,
) {
    let Some(i) = reported(set, verdicts) else {
        return;
    };
    let (limit, verdict) = (&set[i], &verdicts[i]);
    let t = if verdict.allowed {
        ceil_secs(seconds_until_more(verdict))
    } else if verdict.retry_after_us < 0 {
        0
    } else {
        retry_after_secs(verdict.retry_after_us)
    };
    if config.ietf || force_ietf {
        let policy = match policy_given {
            Some(given) => given.clone(),
            None => policy(set).into_owned(),
        };
        headers.insert(&RATELIMIT_POLICY, policy);
        // `"name";r=<remaining>;t=<seconds>`, written without the formatting machinery: this
        // runs for every response on a limited route.
        let (mut remaining, mut seconds) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (remaining, seconds) = (remaining.format(verdict.remaining), seconds.format(t));
        let mut value = Vec::with_capacity(limit.name.len() + remaining.len() + seconds.len() + 8);
        value.push(b'"');
        value.extend_from_slice(limit.name.as_bytes());
        value.extend_from_slice(b"\";r=");
        value.extend_from_slice(remaining.as_bytes());
        value.extend_from_slice(b";t=");
        value.extend_from_slice(seconds.as_bytes());
        headers.insert(
            &RATELIMIT,
            HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).expect("plain ASCII"),
        );
    }
    if config.legacy {
        headers.insert(&X_RATELIMIT_LIMIT, HeaderValue::from(verdict.limit));
        headers.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(verdict.remaining));
        headers.insert(&X_RATELIMIT_RESET, HeaderValue::from(t));
    }
}

/// The RFC 9457 body of a limited response. Serialized straight from borrowed fields (a
/// denial flood builds many); fields in alphabetical order, which clients may compare
/// byte for byte.
#[derive(serde::Serialize)]
struct Problem<'a> {
    detail: &'a str,
    status: u16,
    title: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "violated-policies")]
    violated: Vec<&'a str>,
}

/// A limited response before it becomes a `Response` (the proxy makes it one).
#[derive(Clone)]
pub struct Rendered {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The answer to a limited request: the configured status, `Retry-After`, the rate-limit
/// fields and an `application/problem+json` body naming the violated policies. Besides the
/// limits' names and counts (fixed for one caller's denial) it depends only on the whole
/// seconds of each verdict's retry and reset times, which is what [`seconds`] lists.
pub fn render_limited(config: &ResponseConfig, set: &LimitSet, verdicts: &[Verdict]) -> Rendered {
    render_limited_with(config, set, None, verdicts)
}

/// [`render_limited`] with the `RateLimit-Policy` given when it is not the set's own (see
/// [`add_fields_with`]).
pub fn render_limited_with(
    config: &ResponseConfig,
    set: &LimitSet,
    policy: Option<&HeaderValue>,
    verdicts: &[Verdict],
) -> Rendered {
    let limits: &[Limit] = set;
    let violated: Vec<&str> = limits
        .iter()
        .zip(verdicts)
        .filter(|(l, v)| !v.allowed && !l.shadow)
        .map(|(l, _)| l.name.as_str())
        .collect();
    // The client must wait for every violated limit; after the longest wait all of them
    // admit it (limits only recover with time, and a denied request consumed nothing).
    let wait = limits
        .iter()
        .zip(verdicts)
        .filter(|(l, v)| !v.allowed && !l.shadow)
        .map(|(_, v)| v.retry_after_us)
        .max()
        .unwrap_or(0);
    let never = limits
        .iter()
        .zip(verdicts)
        .any(|(l, v)| !v.allowed && !l.shadow && v.retry_after_us < 0);
    // A tier's limits carry the route's name: the client knows the route, not the tier.
    let route = &set.route;
    let detail = if never {
        format!("The request exceeds what route `{route}` can ever admit at once.")
    } else {
        format!(
            "Too many requests for route `{route}`; retry after {} second(s).",
            retry_after_secs(wait)
        )
    };
    let problem = Problem {
        detail: &detail,
        status: config.status.as_u16(),
        title: "Too Many Requests",
        kind: "https://iana.org/assignments/http-problem-types#quota-exceeded",
        violated,
    };
    let body = serde_json::to_vec(&problem).expect("plain strings serialize");
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if !never {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(retry_after_secs(wait)),
        );
    }
    add_fields_with(&mut headers, config, set, policy, verdicts, true);
    Rendered {
        status: config.status,
        headers,
        body: body.into(),
    }
}

/// The whole seconds a rendered denial shows for one verdict (retry, then reset, both rounded
/// up as everywhere here): two denials of the same caller whose verdicts give the same seconds
/// render to the same bytes.
pub fn seconds(verdict: &Verdict) -> [u64; 2] {
    [
        ceil_secs(verdict.retry_after_us),
        ceil_secs(verdict.reset_after_us),
    ]
}

/// The whole seconds a rendered response shows, per verdict (see [`seconds`]).
type Shown = Box<[[u64; 2]]>;

/// The last response rendered for one remembered denial (see the deny cache) and the whole
/// seconds it shows: a flood of denials for one caller renders once per second rather than
/// once per request, since the response changes only when a shown second does.
#[derive(Default)]
pub struct RenderedCopy(ArcSwapOption<(Shown, Rendered)>);

/// The answer to a request the deny cache refused: [`render_limited`] of the remembered
/// verdicts `aged` to now, reusing `copy` while the seconds it shows stay the same.
pub fn render_remembered(
    config: &ResponseConfig,
    set: &LimitSet,
    aged: impl Iterator<Item = Verdict> + Clone,
    copy: &RenderedCopy,
) -> Rendered {
    render_reusing(copy, aged, |verdicts| render_limited(config, set, verdicts))
}

/// [`render_remembered`] with the rendering given (tests count it).
pub(crate) fn render_reusing(
    copy: &RenderedCopy,
    aged: impl Iterator<Item = Verdict> + Clone,
    render: impl FnOnce(&[Verdict]) -> Rendered,
) -> Rendered {
    if let Some(last) = copy.0.load().as_deref() {
        if aged.clone().map(|v| seconds(&v)).eq(last.0.iter().copied()) {
            return last.1.clone();
        }
    }
    let verdicts: Vec<Verdict> = aged.collect();
    let rendered = render(&verdicts);
    let shown = verdicts.iter().map(seconds).collect();
    copy.0.store(Some(Arc::new((shown, rendered.clone()))));
    rendered
}

/// Status 429 as configured; used by tests and the docs.
pub const DEFAULT_STATUS: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// The `RateLimit-Policy` field value of `set`: rendered on first use and kept in the set's
/// cell, so each set is rendered once, not on every response.
pub fn policy(set: &LimitSet) -> std::borrow::Cow<'_, HeaderValue> {
    // A calendar window's length changes from one window to the next: rendered every time.
    if set.calendar {
        return std::borrow::Cow::Owned(policy_value(set));
    }
    std::borrow::Cow::Borrowed(set.policy.get_or_init(|| policy_value(set)))
}

/// `RateLimit-Policy` for all of `limits`, e.g. `"login";q=5;w=60`: the quota and the window
/// in whole seconds, rounded up like every seconds field tollgate sends.
pub fn policy_value(limits: &[Limit]) -> HeaderValue {
    policy_of(limits.iter().map(|l| (l.name.as_str(), &l.params)))
}

/// `RateLimit-Policy` for `set`'s limits as `checks` (one per limit, in order) decide them:
/// the quotas a temporary override gave the caller rather than the set's own.
pub fn policy_for(set: &LimitSet, checks: &[crate::limit::Check<'_>]) -> HeaderValue {
    policy_of(
        set.iter()
            .zip(checks)
            .map(|(l, c)| (l.name.as_str(), &c.params)),
    )
}

/// `RateLimit-Policy` for named limits with these parameters.
pub fn policy_of<'a>(
    limits: impl Iterator<Item = (&'a str, &'a crate::limit::Params)>,
) -> HeaderValue {
    let items: Vec<String> = limits
        .map(|(name, params)| match params.algorithm {
            crate::limit::Algorithm::Concurrency => {
                format!("\"{}\";q={};qu=\"concurrent-requests\"", name, params.limit)
            }
            _ => format!(
                "\"{}\";q={};w={}",
                name,
                params.limit,
                (window_us(params).max(0) as u64).div_ceil(1_000_000)
            ),
        })
        .collect();
    HeaderValue::from_str(&items.join(", ")).expect("policy names are plain ASCII")
}

/// The window a policy's `w` names: the period, or the current calendar window's length.
fn window_us(p: &crate::limit::Params) -> crate::limit::Micros {
    match &p.calendar {
        Some(c) => {
            let (start, end) =
                crate::limit::calendar::window(c, crate::limit::calendar::proxy_now_us());
            end - start
        }
        None => p.period_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnLimit, Scope};
    use crate::limit::algorithm::{Algorithm, Params};

    fn limit(name: &str, algorithm: Algorithm, limit: u64, period_s: i64) -> Limit {
        Limit {
            name: name.into(),
            params: Params {
                algorithm,
                limit,
                period_us: period_s * 1_000_000,
                burst: limit,
                cost: 1,
                calendar: None,
            },
            key: vec![],
            scope: Scope::Local,
            on_limit: OnLimit::Reject,
            shadow: false,
            by_response: None,
            block_for: None,
            sync: None,
        }
    }

    fn set(limits: Vec<Limit>) -> LimitSet {
        LimitSet::new("r", None, limits, true)
    }

    fn verdict(allowed: bool, limit: u64, remaining: u64, reset: i64, retry: i64) -> Verdict {
        Verdict {
            allowed,
            limit,
            remaining,
            reset_after_us: reset,
            retry_after_us: retry,
        }
    }

    fn config(ietf: bool, legacy: bool) -> ResponseConfig {
        ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            ietf,
            legacy,
        }
    }

    #[test]
    fn seconds_round_up_and_retry_after_is_never_zero() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1_000_000), 1);
        assert_eq!(ceil_secs(1_000_001), 2);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(2_500_000), 3);
    }

    #[test]
    fn allowed_reports_the_limit_nearest_exhaustion() {
        let limits = set(vec![
            limit("a", Algorithm::FixedWindow, 100, 60),
            limit("b", Algorithm::FixedWindow, 10, 60),
        ]);
        let verdicts = [
            verdict(true, 100, 50, 30_000_000, 0),
            verdict(true, 10, 2, 4_200_000, 0),
        ];
        let mut h = HeaderMap::new();
        add_fields(&mut h, &config(true, true), &limits, &verdicts, false);
        assert_eq!(h["ratelimit"], "\"b\";r=2;t=5");
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(h["x-ratelimit-remaining"], "2");
        assert_eq!(h["x-ratelimit-reset"], "5");
        let mut h = HeaderMap::new();
        add_fields(&mut h, &config(false, false), &limits, &verdicts, false);
        assert!(
            h.is_empty(),
            "headers: [] sends nothing on allowed responses"
        );
    }

    #[test]
    fn limited_response_is_a_problem_with_truthful_retry_after() {
        let limits = set(vec![
            limit("short", Algorithm::SlidingLog, 5, 60),
            limit("long", Algorithm::FixedWindow, 100, 3600),
        ]);
        let verdicts = [
            verdict(false, 5, 0, 59_000_000, 2_100_000),
            verdict(false, 100, 0, 3_000_000_000, 9_000_000),
        ];
        let rendered = render_limited(&config(false, false), &limits, &verdicts);
        assert_eq!(rendered.status, 429);
        let h = &rendered.headers;
        assert_eq!(h["retry-after"], "9");
        assert_eq!(h["ratelimit"], "\"long\";r=0;t=9");
        assert_eq!(h["content-type"], "application/problem+json");
        assert_eq!(h["cache-control"], "no-store");
        assert!(h.get("x-ratelimit-limit").is_none());
    }

    #[test]
    fn an_overridden_callers_policy_shows_the_overrides_quotas() {
        let limits = set(vec![
            limit("calls", Algorithm::SlidingLog, 5, 60),
            limit("hourly", Algorithm::TokenBucket, 10, 3600),
        ]);
        let checks: Vec<crate::limit::Check<'_>> = limits
            .iter()
            .map(|l| crate::limit::Check {
                params: Params {
                    limit: l.params.limit * 10,
                    ..l.params
                },
                ..l.check("k")
            })
            .collect();
        let overridden = policy_for(&limits, &checks);
        assert_eq!(overridden, "\"calls\";q=50;w=60, \"hourly\";q=100;w=3600");
        let verdicts = [
            verdict(true, 50, 43, 60_000_000, 0),
            verdict(true, 100, 93, 600_000_000, 0),
        ];
        let mut h = HeaderMap::new();
        add_fields_with(
            &mut h,
            &config(true, false),
            &limits,
            Some(&overridden),
            &verdicts,
            false,
        );
        assert_eq!(h["ratelimit-policy"], overridden);
        assert_eq!(h["ratelimit"], "\"calls\";r=43;t=60");
        // The set's own policy is untouched.
        assert_eq!(
            *policy(&limits),
            "\"calls\";q=5;w=60, \"hourly\";q=10;w=3600"
        );
    }

    #[test]
    fn shadow_limits_are_not_violations() {
        let mut shadow = limit("shadow", Algorithm::FixedWindow, 1, 60);
        shadow.shadow = true;
        let limits = set(vec![shadow, limit("real", Algorithm::FixedWindow, 5, 60)]);
        let verdicts = [
            verdict(false, 1, 0, 1, 60_000_000),
            verdict(false, 5, 0, 1, 1_000_000),
        ];
        assert_eq!(reported(&limits, &verdicts), Some(1));
        let rendered = render_limited(&config(true, false), &limits, &verdicts);
        assert_eq!(rendered.headers["retry-after"], "1");
    }
}
