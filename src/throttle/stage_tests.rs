//! The limit stage on the memory store (no Redis): what it admits, what it refuses and with
//! which verdicts, allow-lists, tiers, shadow limits, delay mode, and the identify stage's memo
//! shared by tiers and keys.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::deny_cache::DenyCache;
use super::tiers::{self, Applied};
use super::{AdmitReason, Admitted, Denial, LimitOutcome, LimitStage, Limited};
use crate::config::{Config, Route};
use crate::identity::caller::Caller;
use crate::store::Stores;

const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

fn config(yaml: &str) -> Config {
    let text = format!("listen: 127.0.0.1:0\nupstream: {{ url: \"http://127.0.0.1:1\" }}\n{yaml}");
    crate::config::parse(Path::new("t.yaml"), &text, |_| None).expect("a valid configuration")
}

fn stage(config: &Config) -> LimitStage {
    let throttle = &config.throttle;
    let stores = Stores::new(&throttle.store, throttle.on_error, None);
    let denials = Arc::new(DenyCache::new(super::deny_cache::DEFAULT_CAPACITY));
    LimitStage::new(throttle.clone(), stores, denials, None)
}

fn request(user: Option<&str>) -> Parts {
    let mut builder = http::Request::get("/api/x");
    if let Some(user) = user {
        builder = builder.header("x-user", user);
    }
    builder.body(()).unwrap().into_parts().0
}

fn route(config: &Config) -> &Arc<Route> {
    &config.throttle.routes[0]
}

/// The outcome for one request of `user` on the first route.
async fn limit<'a>(
    stage: &'a LimitStage,
    route: &'a Route,
    user: Option<&str>,
) -> LimitOutcome<'a> {
    let parts = request(user);
    let limiting = stage.limit(route, Caller::new(&parts, IP));
    limiting.expect("no identity refuses the caller").await
}

fn admitted(outcome: LimitOutcome<'_>) -> Admitted<'_> {
    match outcome {
        LimitOutcome::Admitted(admitted) => admitted,
        _ => panic!("not admitted"),
    }
}

fn limited(outcome: LimitOutcome<'_>) -> Limited<'_> {
    match outcome {
        LimitOutcome::Limited(limited) => limited,
        _ => panic!("not limited"),
    }
}

const USER: &str = "identities:\n  user: [ { header: x-user } ]\n";

#[tokio::test]
async fn admits_up_to_the_limit_per_caller_then_refuses_with_the_verdicts() {
    let config = config(&format!(
        "{USER}routes:\n  - name: api\n    key: user\n    limits:\n      - {{ algorithm: fixed_window, limit: 2, period: 1m }}\n"
    ));
    let stage = stage(&config);
    let route = route(&config);
    for remaining in [1, 0] {
        let outcome = admitted(limit(&stage, route, Some("alice")).await);
        assert_eq!(outcome.reason, AdmitReason::Decided);
        assert_eq!(outcome.identity, "header");
        assert!(std::ptr::eq(outcome.set, &route.limits));
        assert_eq!(outcome.verdicts.len(), 1);
        assert!(outcome.verdicts[0].allowed);
        assert_eq!(outcome.verdicts[0].limit, 2);
        assert_eq!(outcome.verdicts[0].remaining, remaining);
        assert!(outcome.leases.is_none() && outcome.settlement.is_none());
    }
    let refused = limited(limit(&stage, route, Some("alice")).await);
    assert_eq!(refused.identity, "header");
    assert!(!refused.by_fallback);
    let Denial::Decided(verdicts) = &refused.denial else {
        panic!("the memory store is not remembered in the deny cache");
    };
    assert_eq!(verdicts.len(), 1);
    let verdict = verdicts[0];
    assert!(!verdict.allowed);
    assert_eq!((verdict.limit, verdict.remaining), (2, 0));
    assert!(verdict.retry_after_us > 0 && verdict.retry_after_us <= 60_000_000);
    // Another caller has a count of its own; a caller without the header is keyed by address.
    assert_eq!(
        admitted(limit(&stage, route, Some("bob")).await).verdicts[0].remaining,
        1
    );
    assert_eq!(
        admitted(limit(&stage, route, None).await).identity,
        "client_ip"
    );
}

#[tokio::test]
async fn an_allow_listed_caller_is_admitted_without_a_decision() {
    let config = config(&format!(
        "{USER}routes:\n  - name: api\n    key: user\n    allow:\n      identities:\n        user: [vip]\n    limits:\n      - {{ algorithm: fixed_window, limit: 1, period: 1m }}\n"
    ));
    let stage = stage(&config);
    let route = route(&config);
    for _ in 0..3 {
        let outcome = admitted(limit(&stage, route, Some("vip")).await);
        assert_eq!(outcome.reason, AdmitReason::Exempt);
        assert_eq!(outcome.identity, "allow_list");
        assert!(outcome.verdicts.is_empty());
    }
    admitted(limit(&stage, route, Some("alice")).await);
    limited(limit(&stage, route, Some("alice")).await);
}

const TIERED: &str = "routes:\n  - name: api\n    key: user\n    overrides:\n      - { name: partner, values: [p], limits: [ { algorithm: fixed_window, limit: 3, period: 1m } ] }\n    limits:\n      - { algorithm: fixed_window, limit: 1, period: 1m }\n";

#[tokio::test]
async fn a_tier_gets_its_own_limits() {
    let config = config(&format!("{USER}{TIERED}"));
    let stage = stage(&config);
    let route = route(&config);
    let tier = &route.tiers[0].limits;
    for remaining in [2, 1, 0] {
        let outcome = admitted(limit(&stage, route, Some("p")).await);
        assert!(std::ptr::eq(outcome.set, tier));
        assert_eq!(outcome.verdicts[0].remaining, remaining);
    }
    let refused = limited(limit(&stage, route, Some("p")).await);
    assert!(std::ptr::eq(refused.set, tier));
    // The route's own limits are counted apart.
    let outcome = admitted(limit(&stage, route, Some("q")).await);
    assert!(std::ptr::eq(outcome.set, &route.limits));
}

/// An identity that picks the tier, keys the limits and is on an allow-list is evaluated once.
#[test]
fn an_identity_asked_for_by_allow_list_tier_and_keys_is_evaluated_once() {
    let config = config(&format!(
        "{USER}allow:\n  identities:\n    user: [vip]\n{TIERED}"
    ));
    let route = route(&config);
    for user in ["p", "q"] {
        let parts = request(Some(user));
        let mut caller = Caller::new(&parts, IP);
        let Applied::Keyed { tier, keys, .. } =
            tiers::applied(&config.throttle, route, &mut caller)
        else {
            panic!("not allow-listed");
        };
        assert_eq!(tier.is_some(), user == "p");
        assert_eq!(keys.len(), 1);
        assert!(keys[0].contains(&format!("header={user}")), "{keys:?}");
        assert_eq!(caller.evaluations(), 1, "{user}");
    }
}

#[tokio::test]
async fn a_shadow_limit_admits_and_says_so() {
    let config = config(&format!(
        "{USER}routes:\n  - name: api\n    key: user\n    limits:\n      - {{ algorithm: fixed_window, limit: 1, period: 1m, shadow: true }}\n"
    ));
    let stage = stage(&config);
    let route = route(&config);
    assert_eq!(
        admitted(limit(&stage, route, Some("a")).await).reason,
        AdmitReason::Decided
    );
    let over = admitted(limit(&stage, route, Some("a")).await);
    assert_eq!(over.reason, AdmitReason::ShadowLimited);
    assert!(!over.verdicts[0].allowed);
}

#[tokio::test]
async fn delay_mode_waits_for_room_within_max_delay_then_refuses() {
    let config = config(&format!(
        "{USER}routes:\n  - name: api\n    key: user\n    limits:\n      - {{ algorithm: gcra, limit: 10, period: 1s, burst: 1, on_limit: delay, max_delay: 500ms }}\n"
    ));
    let stage = stage(&config);
    let route = route(&config);
    admitted(limit(&stage, route, Some("a")).await);
    // The next one fits 100 ms later: it waits for its turn and goes.
    let started = std::time::Instant::now();
    admitted(limit(&stage, route, Some("a")).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(50), "waited {waited:?}");
    // Ten more in a row need a second: past max_delay, some are refused.
    let mut refused = 0;
    let outcomes = futures_util::future::join_all((0..10).map(|_| limit(&stage, route, Some("a"))));
    for outcome in outcomes.await {
        if matches!(outcome, LimitOutcome::Limited(_)) {
            refused += 1;
        }
    }
    assert!(refused > 0, "all ten fitted within 500 ms");
}

/// A route that decides nothing (no limits, tiers or allow list, here or global) is admitted
/// by the proxy without asking the stage (`LimitStage::decides_nothing`): what the stage would
/// answer must be what the proxy assumes, undecided with identity "none"; a tier or an allow
/// list on such a route needs the stage.
#[tokio::test]
async fn a_route_that_decides_nothing_is_admitted_undecided_as_the_proxy_assumes() {
    let bare = "routes:\n  - name: api\n";
    let plain = config(&format!("{USER}{bare}"));
    let plain_stage = stage(&plain);
    let plain_route = route(&plain);
    assert!(plain_stage.decides_nothing(plain_route));
    for user in [Some("alice"), None] {
        let outcome = admitted(limit(&plain_stage, plain_route, user).await);
        assert_eq!(outcome.reason, AdmitReason::Decided);
        assert_eq!(outcome.identity, "none");
        assert!(std::ptr::eq(outcome.set, &plain_route.limits));
        assert!(outcome.verdicts.is_empty() && outcome.key.is_empty());
        assert!(outcome.leases.is_none() && outcome.settlement.is_none());
        assert!(outcome.policy.is_none());
    }
    for needs_the_stage in [
        format!("{USER}allow:\n  client_ips: [198.51.100.0/24]\n{bare}"),
        format!("{USER}{bare}    allow:\n      identities:\n        user: [vip]\n"),
        format!("{USER}{bare}    key: user\n    overrides:\n      - {{ name: partner, values: [p], limits: [ {{ algorithm: fixed_window, limit: 3, period: 1m }} ] }}\n"),
        format!("{USER}routes:\n  - name: api\n    limits:\n      - {{ algorithm: fixed_window, limit: 1, period: 1m }}\n"),
    ] {
        let other = config(&needs_the_stage);
        assert!(!stage(&other).decides_nothing(route(&other)), "{needs_the_stage}");
    }
}
