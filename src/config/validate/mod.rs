//! Validation: the raw file (`raw`) → the runtime configuration (`model`). Everything that
//! cannot work is refused here, with the position of the offending value, so the request path
//! never meets a surprise. Each section has its own file; `validator` holds what they share.
//!
//! The files build on one another in one direction: this one runs the sections; `routes` over
//! `limits`, `allow`, `matching` and `protect` (priorities); `limits` over `by_response`; `routes`, `limits` and `allow` over
//! `identities`; `store` over `redis`; every section over `validator`.

mod allow;
mod by_response;
mod identities;
mod limits;
mod matching;
mod protect;
mod proxy;
mod redis;
mod response;
mod routes;
mod store;
mod tracing;
mod usage;
mod validator;

use std::path::Path;

use crate::config::error::ConfigError;
use crate::config::model::{Config, Scope, StoreConfig, Throttle};
use crate::config::raw::RawConfig;
use validator::Validator;

/// The configuration `raw` describes, or every problem found in it (in file order). `text` is
/// the file after substitution (for positions), `file` its path (for messages and relative
/// paths), `env` the environment secrets are read from.
pub(super) fn validate(
    file: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    mut raw: RawConfig,
) -> Result<Config, Vec<ConfigError>> {
    let mut v = Validator::new(file, text, env);
    let throttle = throttle(&mut v, &mut raw);
    let protect = protect::protect(&mut v, raw.protect.as_ref());
    let traces = tracing::traces(&mut v, raw.tracing.as_ref());
    let config = proxy::config(&mut v, &raw, throttle).map(|config| Config {
        protect,
        traces,
        ..config
    });
    let errors = v.into_errors();
    if errors.is_empty() {
        Ok(config.expect("validation without errors yields a config"))
    } else {
        Err(errors)
    }
}

/// The throttling half of the file: store, client IP trust, identities, routes, the global
/// allow-list and the shape of limited responses.
fn throttle(v: &mut Validator, raw: &mut RawConfig) -> Throttle {
    let (store, key_prefix, on_error) = store::store(v, raw.store.as_ref());
    let max_keys_per_route = store::max_keys_per_route(v, raw.store.as_ref());
    let trusted_proxies = identities::trusted_proxies(v, raw.client_ip.as_ref());
    let identities = identities::identities(v, std::mem::take(&mut raw.identities));
    let default_scope = match store {
        StoreConfig::Memory => Scope::Local,
        StoreConfig::Redis(_) => Scope::Global,
    };
    let routes = routes::routes(v, &raw.routes, &identities, default_scope);
    let allow = allow::allow(v, "allow", raw.allow.as_ref(), &identities);
    Throttle {
        store,
        max_keys_per_route,
        key_prefix,
        on_error,
        trusted_proxies,
        routes,
        response: response::response(v, raw.response.as_ref()),
        allow,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use http::{Method, StatusCode};

    use crate::config::{parse, Config, OnError, OnLimit, Scope, StoreConfig};
    use crate::summary;
    use crate::throttle::headers::policy;

    const BASE: &str = "listen: 127.0.0.1:8080\nupstream: { url: http://127.0.0.1:3000 }\n";

    fn ok(extra: &str) -> Config {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |name| {
            (name == "SECRET").then(|| "s".to_string())
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn errors(extra: &str) -> String {
        parse(Path::new("t.yaml"), &format!("{BASE}{extra}"), |_| None)
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn a_full_throttle_section_validates_into_runtime_types() {
        let c = ok("store:\n  redis: { url: \"redis://u:p@127.0.0.1:6379/2\", key_prefix: \"app:\", timeout: 20ms }\n  on_error: local\n\
client_ip: { trusted_proxies: [10.0.0.0/8, 192.168.1.1] }\n\
identities:\n  user:\n    - header: X-User-Id\n    - jwt: { claim: sub, secret_env: SECRET }\n    - bearer: {}\n    - cookie: s\n    - query: t\n    - path_segment: 2\n    - client_ip\n\
routes:\n  - name: reply\n    match: { path_prefix: /api/, methods: [post, PUT], host: api.example.com }\n    key: user\n    limits:\n      - { algorithm: sliding_log, limit: 5, period: 60s }\n      - { algorithm: gcra, limit: 30, period: 60s, burst: 15, name: reply-rate, shadow: true }\n      - { algorithm: fixed_window, limit: 1000, period: 1d, key: global, scope: local }\n      - { algorithm: token_bucket, limit: 10, period: 1s, on_limit: delay, max_delay: 500ms, cost: 2 }\n      - { algorithm: concurrency, limit: 4, lease_ttl: 30s }\n\
response: { status: 503, headers: [legacy] }\n");
        let t = &c.throttle;
        assert_eq!(
            t.store,
            StoreConfig::Redis(crate::config::RedisConfig::standalone(
                "redis://u:p@127.0.0.1:6379/2",
                Duration::from_millis(20)
            ))
        );
        assert_eq!(t.key_prefix, "app:");
        assert_eq!(t.on_error, OnError::Local);
        assert!(t.trusted_proxies.contains("10.2.3.4".parse().unwrap()));
        assert!(t.trusted_proxies.contains("192.168.1.1".parse().unwrap()));
        let route = &t.routes[0];
        assert_eq!(
            route.methods.as_deref(),
            Some(&[Method::POST, Method::PUT][..])
        );
        assert_eq!(route.host.as_deref(), Some("api.example.com"));
        assert!(!route.limits.shared_key, "one limit is keyed by `global`");
        let names: Vec<&str> = route.limits.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "reply-sliding_log",
                "reply-rate",
                "reply-fixed_window",
                "reply-token_bucket",
                "reply-concurrency"
            ]
        );
        assert_eq!(route.limits[1].params.burst, 15);
        assert!(route.limits[1].shadow);
        assert_eq!(route.limits[2].scope, Scope::Local);
        assert_eq!(route.limits[0].scope, Scope::Global);
        assert_eq!(
            route.limits[3].on_limit,
            OnLimit::Delay {
                max_delay: Duration::from_millis(500)
            }
        );
        assert_eq!(route.limits[3].params.burst, 10, "burst defaults to limit");
        assert_eq!(
            route.limits[4].params.period_us, 30_000_000,
            "lease_ttl is the concurrency period"
        );
        assert_eq!(t.response.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!t.response.ietf && t.response.legacy);
        let user = &route.limits[0].key[0];
        assert_eq!(user.sources.len(), 7);
    }

    #[test]
    fn without_a_store_limits_are_local_and_the_single_limit_takes_the_route_name() {
        let c = ok("routes:\n  - name: login\n    match: { path_prefix: /login }\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m }\n");
        let t = &c.throttle;
        assert_eq!(t.store, StoreConfig::Memory);
        assert_eq!(t.routes[0].limits[0].name, "login");
        assert_eq!(t.routes[0].limits[0].scope, Scope::Local);
        assert_eq!(
            t.routes[0].limits[0].key[0].name, "client_ip",
            "routes are keyed by client IP by default"
        );
        assert!(t.response.ietf);
    }

    #[test]
    fn what_cannot_work_is_refused_at_its_position() {
        let all = errors(
            "identities:\n  user:\n    - header: X-User\n\
routes:\n  - name: a\n    key: usr\n    limits:\n      - { algorithm: gcra, limit: 0, period: 1s }\n  - name: a\n    limits:\n      - { algorithm: token_bucket, limit: 5, period: 1s, burst: 2, cost: 3 }\n      - { algorithm: leaky, limit: 5, period: 1s }\n      - { algorithm: fixed_window, limit: 5 }\n      - { algorithm: concurrency, limit: 2, on_limit: delay, max_delay: 1s }\n      - { algorithm: fixed_window, limit: 5, period: 1s, scope: global }\n",
        );
        for expected in [
            "t.yaml:8:10: routes[0].key: unknown identity `usr`: defined are client_ip, global, user",
            "t.yaml:10:35: routes[0].limits[0].limit: must be at least 1",
            "t.yaml:11:11: routes[1].name: route name `a` is used twice",
            "t.yaml:13:74: routes[1].limits[0].cost: cost 3 is above the burst 2",
            "t.yaml:14:22: routes[1].limits[1].algorithm: `leaky` is not an algorithm: use one of fixed_window",
            "t.yaml:15:9: routes[1].limits[2]: missing `period`",
            "t.yaml:16:55: routes[1].limits[3].on_limit: concurrency limits cannot delay",
            "t.yaml:17:65: routes[1].limits[4].scope: `global` needs a `store.redis` section",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(
            all.lines().count(),
            8,
            "one error per mistake, no knock-on noise:\n{all}"
        );
    }

    #[test]
    fn block_for_is_read_shown_and_refused_where_it_makes_no_sense() {
        let c = ok("routes:\n  - name: login\n    limits:\n      - { algorithm: fixed_window, limit: 5, period: 1m, block_for: 10m }\n");
        let limit = &c.throttle.routes[0].limits[0];
        assert_eq!(limit.block_for, Some(Duration::from_secs(600)));
        assert_eq!(limit.block_us(), 600_000_000);
        assert_eq!(
            summary::limit(limit),
            "5 per 1m, local, block 10m once denied"
        );

        let all = errors("routes:\n  - name: a\n    limits:\n      - { algorithm: gcra, limit: 5, period: 1s, shadow: true, block_for: 1m }\n      - { algorithm: concurrency, limit: 2, block_for: 1m }\n      - { algorithm: token_bucket, limit: 5, period: 1s, on_limit: delay, max_delay: 1s, block_for: 1m }\n      - { algorithm: fixed_window, limit: 5, period: 1s, block_for: 500ms }\n      - { algorithm: fixed_window, limit: 5, period: 1s, block_for: soon }\n");
        for expected in [
            "t.yaml:6:75: routes[0].limits[0].block_for: a shadow limit never denies",
            "t.yaml:7:56: routes[0].limits[1].block_for: a concurrency limit denies only while",
            "t.yaml:8:101: routes[0].limits[2].block_for: `on_limit: delay` makes a request",
            "t.yaml:9:69: routes[0].limits[3].block_for: must be at least 1s",
            "t.yaml:10:69: routes[0].limits[4].block_for: `soon` is not a duration",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(all.lines().count(), 5, "one error per mistake:\n{all}");
    }

    #[test]
    fn sync_is_read_shown_with_its_bound_and_refused_where_it_cannot_hold() {
        let store = "store:\n  redis: { url: \"redis://127.0.0.1:1\" }\n";
        let c = ok(&format!("{store}routes:\n  - name: api\n    limits:\n      - {{ algorithm: gcra, limit: 10, period: 1s, burst: 20, sync: 100ms }}\n  - name: exact\n    limits:\n      - {{ algorithm: fixed_window, limit: 5, period: 1m, sync: exact }}\n"));
        let limit = &c.throttle.routes[0].limits[0];
        assert_eq!(limit.sync, Some(Duration::from_millis(100)));
        assert_eq!(
            summary::limit(limit),
            "10 per 1s, burst 20, sync 100ms: admits at most burst 20 + refill + (R - 1) with R replicas; \
             a replica holding all the traffic gets at least 1/R of what is left per 100ms; \
             when a replica's rounds are late (a busy node, Redis slow or down) \
             it decides alone on limit / R of what the last view left"
        );
        assert_eq!(c.throttle.routes[1].limits[0].sync, None);

        let all = errors(&format!("{store}routes:\n  - name: a\n    limits:\n      - {{ algorithm: sliding_log, limit: 5, period: 1s, sync: 100ms }}\n      - {{ algorithm: concurrency, limit: 2, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, scope: local, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, block_for: 1m, sync: 100ms }}\n      - {{ algorithm: token_bucket, limit: 5, period: 1s, sync: 1ms }}\n  - name: b\n    limits:\n      - {{ algorithm: fixed_window, limit: 5, period: 1s, sync: 100ms }}\n      - {{ algorithm: fixed_window, limit: 50, period: 1m }}\n"));
        for expected in [
            "routes[0].limits[0].sync: sliding_log keeps one entry per request",
            "routes[0].limits[1].sync: a concurrency slot must be taken",
            "routes[0].limits[2].sync: a local limit is already decided in memory",
            "routes[0].limits[3].sync: a block (`block_for`) must be seen",
            "routes[0].limits[4].sync: must be at least 10ms",
            "routes[1].limits: every limit of a route (or tier) needs the same `sync`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn store_identity_and_response_mistakes_are_explained() {
        let all = errors(
            "store:\n  redis: { url: \"http://x\", key_prefix: \"a{b}\" }\n  on_error: ignore\nclient_ip: { trusted_proxies: [10.0.0.0/33] }\n",
        );
        for expected in [
            "store.redis.url: `http://x` must start with redis:// or rediss://",
            "store.redis.key_prefix: must not contain `{`",
            "store.on_error: `ignore` is not allowed",
            "client_ip.trusted_proxies[0]: `10.0.0.0/33` is not a CIDR",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        let all = errors("identities:\n  tok:\n    - magic: x\n");
        assert!(
            all.starts_with(
                "t.yaml:5:7: identities.tok[0]: unknown variant `magic`, expected one of `header`"
            ),
            "{all}"
        );

        let all = errors(
            "client_ip: { trusted_proxies: [10.0.0.0/33] }\nidentities:\n  global:\n    - header: x\n  tok:\n    - jwt: { claim: sub }\n    - path_segment: 0\nresponse: { status: 200, headers: [fancy] }\n",
        );
        for expected in [
            "t.yaml:3:32: client_ip.trusted_proxies[0]: `10.0.0.0/33` is not a CIDR",
            "t.yaml:6:5: identities.global",
            "identities.global: `global` is built in",
            "identities.tok[0].jwt: give exactly one of `secret_env`",
            "identities.tok[1].path_segment: segments count from 1",
            "response.status: 200 is not an error status",
            "response.headers[0]: `fancy` is not allowed",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }

    #[test]
    fn policy_lists_every_limit_in_structured_field_syntax() {
        let c = ok("routes:\n  - name: r\n    limits:\n      - { algorithm: gcra, limit: 100, period: 60s, name: burst }\n      - { algorithm: fixed_window, limit: 1000, period: 1d, name: daily }\n      - { algorithm: concurrency, limit: 2, name: uploads }\n");
        assert_eq!(
            *policy(&c.throttle.routes[0].limits),
            "\"burst\";q=100;w=60, \"daily\";q=1000;w=86400, \"uploads\";q=2;qu=\"concurrent-requests\""
        );
    }

    #[test]
    fn a_tier_keys_as_route_tilde_tier_and_shows_the_route() {
        let c = ok("identities:\n  user:\n    - header: x-user\nroutes:\n  - name: api\n    key: user\n    overrides:\n      - { name: partner, values: [p], limits: [ { algorithm: fixed_window, limit: 5, period: 1m } ] }\n    limits:\n      - { algorithm: fixed_window, limit: 2, period: 1m }\n");
        let route = &c.throttle.routes[0];
        assert_eq!(
            (route.limits.route.as_str(), route.limits.key_name.as_str()),
            ("api", "api")
        );
        let tier = &route.tiers[0].limits;
        assert_eq!(
            (tier.route.as_str(), tier.key_name.as_str()),
            ("api", "api~partner")
        );
        assert_eq!(*policy(tier), "\"partner\";q=5;w=60");
        assert!(tier.shared_key);
    }

    #[test]
    fn jwt_secret_env_must_be_set() {
        let all = errors("identities:\n  u:\n    - jwt: { secret_env: NOT_SET_ANYWHERE_42 }\n");
        assert!(
            all.contains("environment variable `NOT_SET_ANYWHERE_42` (the HMAC secret) is not set"),
            "{all}"
        );
    }

    #[test]
    fn calendar_windows_validate_and_describe_when_they_turn() {
        let c = ok("routes:\n  - name: api\n    limits:\n      - { algorithm: fixed_window, limit: 10000, window: month, timezone: America/New_York }\n      - { algorithm: fixed_window, limit: 500, window: day, name: daily }\n");
        let limits = &c.throttle.routes[0].limits;
        let month = limits[0].params.calendar.expect("a calendar window");
        assert_eq!(month.unit, crate::limit::calendar::Unit::Month);
        assert_eq!(month.zone.name(), "America/New_York");
        assert_eq!(limits[1].params.calendar.unwrap().zone.name(), "UTC");
        let text = summary::limit(&limits[0]);
        assert!(
            text.starts_with("10000 per month (America/New_York), this one turns at ")
                && text.contains("T00:00:00-0")
                && text.contains("[America/New_York], in "),
            "{text}"
        );
        // The policy's window is the current one's length in seconds (a UTC day).
        assert!(policy(&c.throttle.routes[0].limits)
            .to_str()
            .unwrap()
            .ends_with("\"daily\";q=500;w=86400"));
    }

    #[test]
    fn calendar_windows_are_refused_with_where_and_how_to_fix() {
        let all = errors("routes:\n  - name: a\n    limits:\n      - { algorithm: fixed_window, limit: 5, window: month, period: 30d }\n      - { algorithm: fixed_window, limit: 5 }\n      - { algorithm: fixed_window, limit: 5, window: month, timezone: Mars/Olympus }\n      - { algorithm: sliding_window, limit: 5, window: day }\n      - { algorithm: fixed_window, limit: 5, window: fortnight }\n      - { algorithm: fixed_window, limit: 5, period: 1d, timezone: UTC }\n      - { algorithm: fixed_window, limit: 5, window: day, sync: 100ms }\n      - { algorithm: fixed_window, limit: 5, window: day, count_statuses: [5xx] }\n");
        for expected in [
            "t.yaml:6:54: routes[0].limits[0].window: `window` and `period` are mutually exclusive",
            "t.yaml:7:9: routes[0].limits[1]: missing `period` (the window or refill period, e.g. 1s, 60s, 1h), or a calendar `window`",
            "t.yaml:8:71: routes[0].limits[2].timezone: `Mars/Olympus` is not a known IANA time zone",
            "routes[0].limits[3].window: calendar windows apply to fixed_window only, not sliding_window",
            "routes[0].limits[4].window: `fortnight` is not a calendar window: use day, week, month or year",
            "routes[0].limits[5].timezone: `timezone` applies to a calendar `window`",
            "routes[0].limits[6].window: a calendar window is decided exactly",
            "routes[0].limits[7].window: a calendar window cannot be settled after the response yet",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
    }
}
