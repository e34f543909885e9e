//! Validation of `protect` (the app's adaptive concurrency limit) and of the priorities routes
//! and tiers give their requests.

use std::time::Duration;

use super::validator::Validator;
use crate::config::model::{
    LatencyTarget, Priority, Protect, ProtectMode, DEFAULT_LATENCY_MULTIPLE, DEFAULT_MAX_LIMIT,
    DEFAULT_MAX_WAIT, DEFAULT_MIN_LIMIT,
};
use crate::config::raw::RawProtect;

/// The `protect` section; None when absent (the protection is off).
pub(super) fn protect(v: &mut Validator, raw: Option<&RawProtect>) -> Option<Protect> {
    let raw = raw?;
    let mode = match raw.mode.as_deref().map(str::trim) {
        None | Some("enforce") => ProtectMode::Enforce,
        Some("shadow") => ProtectMode::Shadow,
        Some(other) => {
            v.error(
                "protect.mode",
                format!("`{other}` is not a mode: use enforce (shed under overload) or shadow (measure and report, never shed)"),
            );
            ProtectMode::Enforce
        }
    };
    let latency = match raw.latency.as_deref() {
        None => LatencyTarget::Multiple(DEFAULT_LATENCY_MULTIPLE),
        Some(text) => latency(v, text),
    };
    let max_wait = v.duration_or_zero(
        "protect.max_wait",
        raw.max_wait.as_deref(),
        DEFAULT_MAX_WAIT,
    );
    let bound = |v: &mut Validator, field: &str, value: Option<u64>, default: u32| match value {
        None => default,
        Some(0) => {
            v.error(&format!("protect.{field}"), "must be at least 1");
            default
        }
        Some(n) if n > 1_000_000 => {
            v.error(
                &format!("protect.{field}"),
                "must be at most 1000000 requests in flight",
            );
            default
        }
        Some(n) => n as u32,
    };
    let min_limit = bound(v, "min_limit", raw.min_limit, DEFAULT_MIN_LIMIT);
    let max_limit = bound(v, "max_limit", raw.max_limit, DEFAULT_MAX_LIMIT);
    if min_limit > max_limit {
        v.error(
            "protect.min_limit",
            format!("{min_limit} is above max_limit {max_limit}: the limit moves between the two"),
        );
    }
    Some(Protect {
        mode,
        latency,
        max_wait,
        min_limit,
        max_limit,
    })
}

/// `2x` (a multiple of the learned unloaded latency, above 1) or a duration (`250ms`).
fn latency(v: &mut Validator, text: &str) -> LatencyTarget {
    let text = text.trim();
    if let Some(number) = text.strip_suffix('x') {
        return match number.trim().parse::<f64>() {
            Ok(m) if m.is_finite() && m > 1.0 && m <= 100.0 => LatencyTarget::Multiple(m),
            Ok(_) => {
                v.error("protect.latency", format!("`{text}`: the multiple must be above 1x (the unloaded latency itself) and at most 100x"));
                LatencyTarget::Multiple(DEFAULT_LATENCY_MULTIPLE)
            }
            Err(_) => {
                v.error(
                    "protect.latency",
                    format!("`{text}` is not a multiple: write e.g. 2x or 1.5x"),
                );
                LatencyTarget::Multiple(DEFAULT_LATENCY_MULTIPLE)
            }
        };
    }
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => LatencyTarget::Absolute(d),
        _ => {
            v.error("protect.latency", format!("`{text}` is neither a multiple of the app's unloaded latency (2x) nor a duration (250ms)"));
            LatencyTarget::Absolute(Duration::from_millis(250))
        }
    }
}

/// A route's or a tier's `priority` at `path`: `inherited` when absent.
pub(super) fn priority(
    v: &mut Validator,
    path: &str,
    raw: Option<&str>,
    inherited: Priority,
) -> Priority {
    let Some(text) = raw else { return inherited };
    Priority::parse(text.trim()).unwrap_or_else(|| {
        v.error(
            path,
            format!("`{text}` is not a priority: use critical, high, normal or low"),
        );
        inherited
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::{parse, Config, LatencyTarget, Priority, ProtectMode};

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn parsed(extra: &str) -> Result<Config, String> {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |_| None).map_err(|e| e.to_string())
    }

    #[test]
    fn protect_is_off_unless_configured_and_has_defaults() {
        assert_eq!(parsed("").unwrap().protect, None);
        let on = parsed("protect: {}\n").unwrap().protect.unwrap();
        assert_eq!(on.mode, ProtectMode::Enforce);
        assert_eq!(on.latency, LatencyTarget::Multiple(2.0));
        assert_eq!(on.max_wait, Duration::from_millis(50));
        assert_eq!((on.min_limit, on.max_limit), (1, 1000));
        let full = parsed("protect: { mode: shadow, latency: 250ms, max_wait: 20ms, min_limit: 4, max_limit: 64 }\n")
            .unwrap()
            .protect
            .unwrap();
        assert_eq!(full.mode, ProtectMode::Shadow);
        assert_eq!(
            full.latency,
            LatencyTarget::Absolute(Duration::from_millis(250))
        );
        assert_eq!(full.max_wait, Duration::from_millis(20));
        assert_eq!((full.min_limit, full.max_limit), (4, 64));
        let multiple = parsed("protect: { latency: 1.5x }\n")
            .unwrap()
            .protect
            .unwrap();
        assert_eq!(multiple.latency, LatencyTarget::Multiple(1.5));
    }

    #[test]
    fn what_cannot_work_in_protect_is_refused_at_its_position() {
        let all = parsed("protect:\n  mode: loud\n  latency: 0.5x\n  max_wait: soon\n  min_limit: 10\n  max_limit: 5\n  burst: 3\n")
            .expect_err("refused");
        assert!(all.contains("unknown field `burst`"), "{all}");
        let all = parsed(
            "protect:\n  mode: loud\n  latency: 0.5x\n  max_wait: soon\n  min_limit: 10\n  max_limit: 5\n",
        )
        .expect_err("refused");
        for expected in [
            "t.yaml:4:9: protect.mode: `loud` is not a mode",
            "t.yaml:5:12: protect.latency: `0.5x`: the multiple must be above 1x",
            "t.yaml:6:13: protect.max_wait: `soon` is not a duration",
            "t.yaml:7:14: protect.min_limit: 10 is above max_limit 5",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        let all = parsed("protect: { latency: fast, min_limit: 0 }\n").expect_err("refused");
        assert!(
            all.contains("protect.latency: `fast` is neither a multiple"),
            "{all}"
        );
        assert!(
            all.contains("protect.min_limit: must be at least 1"),
            "{all}"
        );
    }

    #[test]
    fn routes_and_tiers_carry_priorities_and_routes_may_match_headers_and_have_no_limits() {
        let c = parsed(
            &[
                "identities:",
                "  key:",
                "    - header: X-Key",
                "routes:",
                "  - name: urgent",
                "    match: { path_prefix: /, headers: { X-Priority: high } }",
                "    priority: high",
                "  - name: api",
                "    match: { path_prefix: /api/ }",
                "    key: key",
                "    priority: low",
                "    limits:",
                "      - { algorithm: fixed_window, limit: 5, period: 1m }",
                "    overrides:",
                "      - { values: [gold], priority: critical, limits: [{ algorithm: fixed_window, limit: 50, period: 1m }] }",
                "      - { values: [silver], limits: [{ algorithm: fixed_window, limit: 20, period: 1m }] }",
                "  - name: rest",
                "    match: { path_prefix: / }",
                "",
            ]
            .join("\n"),
        )
        .unwrap();
        let routes = &c.throttle.routes;
        assert!(routes[0].limits.is_empty());
        assert_eq!(routes[0].limits.priority, Priority::High);
        assert_eq!(routes[0].headers.len(), 1);
        assert_eq!(routes[0].headers[0].0.as_str(), "x-priority");
        assert_eq!(routes[0].headers[0].1, "high");
        assert_eq!(routes[1].limits.priority, Priority::Low);
        assert_eq!(routes[1].tiers[0].limits.priority, Priority::Critical);
        assert_eq!(
            routes[1].tiers[1].limits.priority,
            Priority::Low,
            "a tier without a priority has its route's"
        );
        assert_eq!(routes[2].limits.priority, Priority::Normal);

        let check = crate::summary::check(&c);
        assert!(!check.contains(", priority"), "{check}");
        let protected = parsed(&format!(
            "protect: {{ mode: shadow, latency: 250ms }}\n{}",
            "routes:\n  - name: urgent\n    match: { headers: { X-Priority: high } }\n    priority: high\n"
        ))
        .unwrap();
        let check = crate::summary::check(&protected);
        for line in [
            "\nprotect   shadow: measures, never sheds; adaptive limit 1..1000 in flight, latency 250ms, max_wait 50ms; unrouted requests are normal\n",
            "\nroute     urgent (/ header x-priority: high) unlimited, priority high\n",
        ] {
            assert!(check.contains(line), "missing {line:?} in\n{check}");
        }

        let all = parsed("routes:\n  - name: a\n    priority: urgent\n    match: { headers: { \"bad name\": x, X-Ok: \"a\\nb\" } }\n")
            .expect_err("refused");
        for expected in [
            "t.yaml:5:15: routes[0].priority: `urgent` is not a priority: use critical, high, normal or low",
            "routes[0].match.headers: `bad name` is not a header name",
            "routes[0].match.headers.X-Ok: is not a valid header value",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }
}
