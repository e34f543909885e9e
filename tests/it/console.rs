//! `GET /console` on the admin listener, as a person uses it: a real headless Chromium loads the
//! page from a tollgate with Redis and two replicas, and the tests read what the rendered DOM
//! shows (top offenders over the fleet, a caller's blocked state, a refused and an accepted
//! reset), with a screenshot per step under target/console-screenshots/. Plain HTTP tests hold
//! the rest: no console request changes state without the token, the headers every console
//! answer carries, and the JSON endpoints scripts may use.

use std::time::{Duration, Instant};

use crate::support::browser::{self, Browser};
use crate::support::*;
use http::{Request, StatusCode};
use serde_json::Value;

const TOKEN_ENV: &str = "TOLLGATE_CONSOLE_TEST_TOKEN";
const TOKEN: &str = "console-test-token";
/// alice's (or bob's) row for the limit `per-user` in the caller's panel, route `api`.
const API_PER_USER: &str =
    ".caller-route[data-route=\"api\"] .limit-state[data-limit=\"per-user\"]";

/// Route `api` on every path, by the `x-user` header: two requests an hour, and a caller
/// refused once is blocked for ten minutes. `login` reads an API key from `x-api-key`.
fn console_config(up: &Upstream, redis: &RedisServer) -> Config {
    // SAFETY (edition 2021: safe): every test of this file sets the same value.
    std::env::set_var(TOKEN_ENV, TOKEN);
    config()
        .upstream(&up.url())
        .admin_with_token("127.0.0.1:0", TOKEN_ENV)
        // Generous: a Redis call slowed by the browsers beside it must not become a store
        // error (which admits the request) and change the counts the tests read.
        .store(store::redis(&redis.url()).timeout("2s"))
        .identity("user", [source::header("x-user")])
        .identity("apikey", [source::header("x-api-key")])
        .route(
            route("login")
                .prefix("/login")
                .key("apikey")
                .limit(limit::fixed_window(1, "1h").name("per-key"))
                .set("priority", "high"),
        )
        .route(
            route("api").prefix("/").key("user").limit(
                limit::fixed_window(2, "1h")
                    .name("per-user")
                    .block_for("10m"),
            ),
        )
}

async fn start(config: &Config) -> ProxyHandle {
    let proxy = proxy(config.yaml()).start().await;
    // Redis connects in the background, and `/readyz` is 200 before (`on_error: allow`):
    // wait for the store to be up, or a first request would be admitted unlimited.
    proxy.wait_store().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy
}

async fn call(proxy: &ProxyHandle, header: &str, value: &str, path: &str) -> StatusCode {
    let request = Request::get(proxy.url(path))
        .header(header, value)
        .body(body(""))
        .unwrap();
    http1_client().request(request).await.unwrap().status()
}

async fn user(proxy: &ProxyHandle, name: &str) -> StatusCode {
    call(proxy, "x-user", name, "/api/x").await
}

/// `count` requests of `name` on `proxy`: the first two admitted, every later one refused.
async fn flood(proxy: &ProxyHandle, name: &str, count: usize) {
    for i in 0..count {
        let expected = if i < 2 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(user(proxy, name).await, expected, "{name} request {i}");
    }
}

async fn admin_request(
    proxy: &ProxyHandle,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, String) {
    let url = format!("http://{}{path}", proxy.admin.expect("admin listener"));
    exchange(method, &url, headers).await
}

async fn admin_get(proxy: &ProxyHandle, path: &str) -> (StatusCode, String) {
    let (status, _, text) = admin_request(proxy, "GET", path, &[]).await;
    (status, text)
}

async fn admin_json(proxy: &ProxyHandle, path: &str) -> (StatusCode, Value) {
    let (status, text) = admin_get(proxy, path).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

fn console_url(proxy: &ProxyHandle) -> String {
    format!("http://{}/console", proxy.admin.expect("admin listener"))
}

/// Two replicas on one Redis, alice flooded on the first and bob on the second.
struct Fleet {
    _redis: RedisServer,
    _up: Upstream,
    a: ProxyHandle,
    b: ProxyHandle,
}

async fn flooded_fleet() -> Fleet {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = console_config(&up, &redis);
    let a = start(&config).await;
    let b = start(&config).await;
    flood(&a, "alice", 12).await;
    flood(&b, "bob", 8).await;
    Fleet {
        _redis: redis,
        _up: up,
        a,
        b,
    }
}

/// No error in the browser's log: no script error, no Content-Security-Policy violation, no
/// request that failed.
async fn assert_no_browser_errors(browser: &Browser) {
    let errors = browser.errors().await;
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
}

/// The console of replica A lists both callers in its top offenders — bob was denied on B
/// only — and the caller search shows alice's penalty block with its end, and what explain
/// says for a request of hers.
#[tokio::test]
async fn console_shows_the_fleet_top_offenders_and_a_blocked_caller() {
    let fleet = flooded_fleet().await;
    let browser = browser::launch("top-offenders-and-search").await;
    browser.goto(&console_url(&fleet.a)).await;

    let alice = browser
        .until_text("#top tr.offender", "alice among the top offenders", |t| {
            t.contains("alice")
        })
        .await;
    assert!(alice.starts_with("api alice header 10 1"), "{alice}");
    let bob = browser
        .until_text(
            "#top tr.offender",
            "bob (denied on the other replica)",
            |t| t.contains("bob"),
        )
        .await;
    assert!(bob.starts_with("api bob header 6 1"), "{bob}");
    browser
        .until_text("#top-scope", "the fleet's view of 2 replicas", |t| {
            t.contains("fleet: 2 replicas")
        })
        .await;
    // The routes table: match, policy, priority and mode.
    let api = browser
        .until_text("#routes tbody tr", "route api", |t| t.starts_with("api"))
        .await;
    for shown in [
        "any method /*",
        "\"per-user\";q=2;w=3600",
        "normal",
        "exact",
    ] {
        assert!(api.contains(shown), "{shown:?} missing from {api:?}");
    }
    browser.screenshot("top-offenders").await;
    // Suggested limits: alice sent 12 requests this minute, bob 8 (refused ones count: they
    // are what the callers send), so refusing nobody takes 12 a minute, in the route's
    // algorithm, keyed as the route is.
    let suggested = browser
        .until_text("#suggest tr.suggestion", "a suggestion for api", |t| {
            t.starts_with("api")
        })
        .await;
    for shown in [
        "key user",
        "a fixed_window limit of 12/min would have refused at most 0 of",
        "- { algorithm: fixed_window, limit: 12, period: 1m, key: user }",
    ] {
        assert!(
            suggested.contains(shown),
            "{shown:?} missing from {suggested:?}"
        );
    }

    // Recent denials: one line per caller and limit, with when it began and ended.
    let denied = browser
        .until_text("#denials tr.denial", "alice's denials", |t| {
            t.starts_with("alice")
        })
        .await;
    assert!(
        denied.starts_with("alice header api per-user penalty box (block_for) 10 "),
        "{denied}"
    );

    // A click on an offender shows their panel, and names them in the address.
    browser
        .click("#top tr.offender[data-identity=\"alice\"] a.identity")
        .await;
    let blocked = browser
        .until_text(API_PER_USER, "alice blocked", |t| t.contains("BLOCKED"))
        .await;
    assert!(
        blocked.starts_with("per-user BLOCKED 0 of 2 in "),
        "{blocked}"
    );
    assert!(blocked.contains(" UTC ("), "{blocked}");
    let address = browser.client.current_url().await.unwrap();
    assert_eq!(address.fragment(), Some("caller=alice"));
    assert!(
        blocked.contains("left, started by per-user) —"),
        "{blocked}"
    );
    browser
        .click(".caller-route[data-route=\"api\"] details summary")
        .await;
    let explained = browser
        .until_text(
            ".caller-route[data-route=\"api\"] .explain pre",
            "explain",
            |t| t.contains("would be LIMITED"),
        )
        .await;
    assert!(
        explained.contains("identity  user = alice (from header x-user)"),
        "{explained}"
    );
    browser.screenshot("caller-blocked").await;
    // Another caller in the address (a link followed, back or forward): looked up at once.
    browser
        .client
        .execute("location.hash = '#caller=bob';", vec![])
        .await
        .expect("run a script");
    browser
        .until_text("#caller h3", "bob's panel", |t| t.starts_with("caller "))
        .await;
    let bob = browser
        .until_text(API_PER_USER, "bob blocked", |t| t.contains("BLOCKED"))
        .await;
    assert!(bob.starts_with("per-user BLOCKED 0 of 2 in "), "{bob}");
    assert_eq!(
        browser
            .client
            .find(fantoccini::Locator::Css("#identity"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap(),
        Some("bob".to_owned())
    );
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// A person reads a route's chart: allowed requests above, refused ones below on a scale of
/// their own (alice's 10 refusals are not flattened by the allowed ones, nor the reverse), the
/// last minute's averages as its caption, and a sample's values where the pointer rests.
#[tokio::test]
async fn console_charts_show_allowed_and_refused_on_their_own_scales_with_hover_values() {
    let fleet = flooded_fleet().await;
    // The sample that counted alice's flood, as the JSON behind the page has it.
    let started = Instant::now();
    let (times, counts) = loop {
        let (_, overview) = admin_json(&fleet.a, "/console/api/overview").await;
        let history = &overview["history"];
        let times: Vec<u64> = serde_json::from_value(history["times"].clone()).unwrap();
        let counts: Vec<[f64; 3]> =
            serde_json::from_value(history["routes"]["api"].clone()).unwrap();
        if counts.last().is_some_and(|c| c[1] == 10.0) && counts[0][1] == 0.0 {
            break (times, counts);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the flood was never sampled: {history}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let rates: Vec<[f64; 3]> = (1..counts.len())
        .map(|i| {
            let dt = ((times[i] - times[i - 1]) as f64 / 1000.0).max(0.001);
            [0, 1, 2].map(|k| ((counts[i][k] - counts[i - 1][k]) / dt).max(0.0))
        })
        .collect();
    let flood = (1..counts.len())
        .find(|&i| counts[i][1] > counts[i - 1][1])
        .unwrap();
    let top = |k: usize| rates.iter().map(|r| r[k]).fold(1.0, f64::max).ceil();
    let top_refused = top(1).max(top(2));

    let browser = browser::launch("charts").await;
    browser.goto(&console_url(&fleet.a)).await;
    let chart = "#routes svg.chart[data-route=\"api\"]";
    browser
        .until_text(
            &format!("{chart} text.chart-caption"),
            "the last minute",
            |t| t.starts_with("last minute: ") && t.ends_with(" shed/s"),
        )
        .await;
    let notes = browser.texts(&format!("{chart} text.chart-note")).await;
    for note in [
        format!("allowed (top {top}/s)", top = top(0)),
        format!("refused: limited, shed (top {top_refused}/s)"),
        "last minute".to_owned(),
    ] {
        assert!(notes.contains(&note), "{note:?} not in {notes:?}");
    }
    browser
        .hover(&format!("{chart} rect.hover[data-at=\"{}\"]", times[flood]))
        .await;
    let clock = &humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(times[flood]),
    )
    .to_string()[11..19];
    let shown = |v: f64| {
        let v = if v >= 10.0 {
            v.round()
        } else {
            (v * 10.0).round() / 10.0
        };
        format!("{v}")
    };
    let r = rates[flood - 1];
    let expected = format!(
        "{clock} UTC: {} allowed/s · {} limited/s · {} shed/s",
        shown(r[0]),
        shown(r[1]),
        shown(r[2])
    );
    browser
        .until_text(&format!("{chart} text.chart-caption"), &expected, |t| {
            t == expected
        })
        .await;
    browser.screenshot("chart-hover").await;
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// Reset from the console: without the token the page shows the refusal and nothing
/// changes; with it, alice is free again on both replicas, as the proxy answers.
#[tokio::test]
async fn console_reset_is_refused_without_the_token_and_frees_the_caller_with_it() {
    let fleet = flooded_fleet().await;
    let browser = browser::launch("reset").await;
    browser.goto(&console_url(&fleet.a)).await;
    browser.type_into("#identity", "alice").await;
    browser.click("#search").await;
    browser
        .until_text(API_PER_USER, "alice blocked", |t| t.contains("BLOCKED"))
        .await;

    // The console asks which limit: every one (the default of the API) is a choice to make.
    browser.click(".reset[data-route=\"api\"]").await;
    browser
        .until_text("#message.refused", "the question", |t| {
            t == "reset of api: choose which limit to reset"
        })
        .await;
    browser
        .select(".caller-route[data-route=\"api\"] select.reset-limit", "*")
        .await;
    browser.click(".reset[data-route=\"api\"]").await;
    let refused = browser
        .until_text("#message.refused", "the refusal", |t| t.contains("refused"))
        .await;
    assert_eq!(
        refused,
        "reset of api refused (403): missing `Authorization: Bearer <token>` (the token from admin.token_env)"
    );
    browser.screenshot("refused").await;
    // The refused request is the one error the browser logs (it logs every 4xx answer).
    let errors = browser.errors().await;
    assert!(
        errors.len() == 1
            && errors[0].contains("/limits/reset?route=api&identity=alice")
            && errors[0].contains("403 (Forbidden)"),
        "{errors:#?}"
    );
    assert_eq!(user(&fleet.a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(user(&fleet.b, "alice").await, StatusCode::TOO_MANY_REQUESTS);

    browser.type_into("#token", TOKEN).await;
    browser.click(".reset[data-route=\"api\"]").await;
    browser
        .until_text("#message.done", "the reset done", |t| {
            t == "reset of api: done"
        })
        .await;
    browser
        .until_text(API_PER_USER, "alice free", |t| {
            t.starts_with("per-user a request would pass 1 of 2 after a request in ")
        })
        .await;
    browser.screenshot("reset-done").await;
    // The audit trail shows the reset at once, and its filter keeps the lines that match.
    let entry = browser
        .until_text(
            "#audit tr.audit-entry",
            "the reset in the audit trail",
            |t| t.contains(" reset api alice "),
        )
        .await;
    assert!(entry.contains(" token "), "{entry}");
    browser.type_into("#audit-filter", "bob").await;
    browser
        .until_text("#audit-count", "no line about bob", |t| {
            t == "(0 of the last 1 match)"
        })
        .await;
    assert!(browser.texts("#audit tr.audit-entry").await.is_empty());
    browser.type_into("#audit-filter", "ALICE").await;
    browser
        .until_text("#audit-count", "alice's line", |t| {
            t == "(1 of the last 1 match)"
        })
        .await;
    // Free on both replicas: B forgets its remembered denial within its reset watch.
    let started = Instant::now();
    loop {
        let status = user(&fleet.b, "alice").await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "alice still refused on replica B: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(user(&fleet.a, "alice").await, StatusCode::OK);
    // The reset was audited, as done with the token.
    let (_, audit) = admin_json(&fleet.b, "/limits/audit").await;
    let entry = &audit["entries"][0];
    assert_eq!(
        (
            entry["action"].as_str(),
            entry["route"].as_str(),
            entry["who"].as_str()
        ),
        (Some("reset"), Some("api"), Some("token")),
        "{audit}"
    );
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// The page runs under its Content-Security-Policy with nothing logged, and the browser does
/// enforce it: a script the page did not ship is refused.
#[tokio::test]
async fn console_loads_under_its_content_security_policy_without_browser_errors() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let proxy = start(&console_config(&up, &redis)).await;
    let (status, headers, _) = admin_request(&proxy, "GET", "/console", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let csp = headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} missing from {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");

    let browser = browser::launch("csp").await;
    browser.goto(&console_url(&proxy)).await;
    // The shipped script ran: it drew the routes and the store.
    browser
        .until_text("#routes tbody tr", "the routes", |t| t.starts_with("login"))
        .await;
    browser
        .until_text("#store", "the store's health", |t| {
            t.contains("Redis\nup") && t.contains("circuit breaker\nclosed")
        })
        .await;
    // A few refreshes, so that every periodic request ran at least once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(browser.texts("#protect-section").await, vec![String::new()]);
    browser.screenshot("loaded").await;
    assert_no_browser_errors(&browser).await;

    // A script the page did not ship: Trusted Types refuse the assignment.
    let ran = browser
        .client
        .execute(
            "const s = document.createElement('script'); \
             try { s.src = 'data:text/javascript,window.injected=1'; } catch (e) {} \
             document.body.append(s); \
             return new Promise(done => setTimeout(() => done(window.injected === 1), 500));",
            vec![],
        )
        .await
        .expect("run a script");
    assert_eq!(ran, Value::Bool(false), "a foreign script ran");
    // A request to another origin: connect-src refuses it before anything is sent.
    let fetched = browser
        .client
        .execute(
            "return fetch('http://127.0.0.2:9/x').then(() => 'sent', e => 'refused: ' + e.name);",
            vec![],
        )
        .await
        .expect("run a script");
    assert_eq!(fetched, Value::String("refused: TypeError".into()));
    let errors = browser.errors().await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains("requires 'TrustedScriptURL' assignment")),
        "the refused script was not reported: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains(
            "violates the following Content Security Policy directive: \"connect-src 'self'\""
        )),
        "the refused request was not reported: {errors:?}"
    );
    browser.close().await;
}

/// The overload protection's panel names what it shows for a person ("in flight", "baseline
/// latency"), never by the JSON's field names, with the values `GET /protect` answers.
#[tokio::test]
async fn console_protect_panel_names_its_fields_for_a_person() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = console_config(&up, &redis).set(
        "protect",
        serde_json::json!({ "mode": "shadow", "latency": "2x", "max_wait": "50ms", "min_limit": 4, "max_limit": 100 }),
    );
    let proxy = start(&config).await;
    let (status, state) = admin_json(&proxy, "/protect").await;
    assert_eq!(status, StatusCode::OK, "{state}");
    let browser = browser::launch("protect").await;
    browser.goto(&console_url(&proxy)).await;
    let expected = [
        "mode",
        "limit",
        "in flight",
        "waiting",
        "latency now",
        "baseline latency",
        "target",
        "errors",
        "state",
        "last cut",
        "settings",
        "critical priority",
        "high priority",
        "normal priority",
        "low priority",
    ];
    // The panel is redrawn on every refresh, and each label is read with a WebDriver call of
    // its own: a read that straddles a redraw sees part of it, so read until one is whole.
    let (labels, values) = eventually("the protect panel's labels", PATIENCE, async || {
        let labels = browser.texts("#protect dt").await;
        let values = browser.texts("#protect dd").await;
        match labels == expected && values.len() == labels.len() {
            true => Ok((labels, values)),
            false => Err((labels, values)),
        }
    })
    .await;
    let shown = |label: &str| &values[labels.iter().position(|l| l == label).unwrap()];
    assert_eq!(shown("mode"), "shadow");
    assert_eq!(
        shown("limit"),
        &format!("{} requests at once", state["limit"])
    );
    assert_eq!(shown("in flight"), "0");
    assert_eq!(shown("waiting"), "0");
    assert_eq!(shown("baseline latency"), "—");
    assert_eq!(shown("last cut"), "none");
    assert_eq!(
        shown("settings"),
        "latency 2x, max wait 50 ms, limit 4 to 100"
    );
    assert_eq!(shown("high priority"), "0 admitted, 0 would have been shed");
    browser.screenshot("protect").await;
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// Every request that changes state, tried without the token, is refused and changes
/// nothing; the console's own endpoints only read (any other method: 405).
#[tokio::test]
async fn console_actions_without_the_token_are_refused() {
    let fleet = flooded_fleet().await;
    let a = &fleet.a;
    for (method, path) in [
        ("POST", "/limits/reset?route=api&identity=alice"),
        (
            "POST",
            "/limits/override?route=api&identity=alice&multiply=10&for=1h",
        ),
        ("DELETE", "/limits/override?route=api&identity=alice"),
    ] {
        for headers in [&[][..], &[("authorization", "Bearer wrong")][..]] {
            let (status, _, text) = admin_request(a, method, path, headers).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {text}");
        }
    }
    for path in [
        "/console",
        "/console/app.js",
        "/console/api/overview",
        "/console/api/caller?identity=alice",
        "/console/api/protect",
        "/limits/explain?url=/api/x",
    ] {
        for method in ["POST", "PUT", "DELETE"] {
            let (status, _, text) = admin_request(a, method, path, &[]).await;
            let expected = if path == "/console/api/protect" {
                StatusCode::OK
            } else {
                StatusCode::METHOD_NOT_ALLOWED
            };
            assert_eq!(status, expected, "{method} {path}: {text}");
        }
    }
    // The token is not enough from a page of another origin: a browser could be made to
    // send it no more than a cookie, but the listener may be loopback without a token.
    let bearer = format!("Bearer {TOKEN}");
    for origin in ["http://evil.example", "null"] {
        let (status, _, text) = admin_request(
            a,
            "POST",
            "/limits/reset?route=api&identity=alice",
            &[("authorization", &bearer), ("origin", origin)],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}: {text}");
        assert!(text.contains("another origin"), "{text}");
    }
    // Nothing changed: alice still refused on both replicas, no override, no audit entry.
    assert_eq!(user(a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(user(&fleet.b, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    let (_, state) = admin_json(a, "/limits/state?route=api&identity=alice").await;
    assert_eq!(state["override"], Value::Null, "{state}");
    assert!(state["limits"][0]["blocked"].is_object(), "{state}");
    let (_, audit) = admin_json(a, "/limits/audit").await;
    assert_eq!(audit["entries"], Value::Array(vec![]), "{audit}");
    // From the console's own origin, with the token: done.
    let own = format!("http://{}", a.admin.unwrap());
    let (status, _, text) = admin_request(
        a,
        "POST",
        "/limits/reset?route=api&identity=alice",
        &[("authorization", &bearer), ("origin", &own)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

/// The JSON behind the page, for scripts: the overview, a caller on every route (a value
/// read from a credential-named header shown as its digest only), `/limits/explain`, and
/// the headers every console answer carries.
#[tokio::test]
async fn console_json_endpoints() {
    let fleet = flooded_fleet().await;
    let a = &fleet.a;
    assert_eq!(
        call(a, "x-api-key", "k_live_42", "/login").await,
        StatusCode::OK
    );
    assert_eq!(
        call(a, "x-api-key", "k_live_42", "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let (status, headers, text) = admin_request(a, "GET", "/console/api/overview", &[]).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(headers.contains_key("content-security-policy"));
    let overview: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(overview["actions"], "token");
    let api = &overview["routes"][1];
    assert_eq!(api["name"], "api");
    assert_eq!(api["policy"], "\"per-user\";q=2;w=3600");
    assert_eq!(
        (api["priority"].as_str(), api["mode"].as_str()),
        (Some("normal"), Some("exact"))
    );
    assert_eq!(api["match"]["path_prefix"], "/");
    assert_eq!(overview["routes"][0]["priority"], "high");
    // The sampler's first sample is taken when the listener starts: each route has a series
    // of [allowed, limited, shed] per sample.
    let times = overview["history"]["times"].as_array().unwrap().len();
    assert!(times >= 1, "{}", overview["history"]);
    assert_eq!(
        overview["history"]["routes"]["api"]
            .as_array()
            .unwrap()
            .len(),
        times
    );
    assert_eq!(
        overview["history"]["routes"]["api"][0]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(overview["store"]["kind"], "redis");
    assert_eq!(overview["store"]["up"], true);
    assert_eq!(overview["store"]["breaker"], "closed");
    assert!(
        overview["store"]["rtt_ms"].as_f64().is_some(),
        "{}",
        overview["store"]
    );
    // The newest denial first: the API key's, shown as its digest.
    let newest = &overview["denials"][0];
    assert_eq!(
        (
            newest["route"].as_str(),
            newest["limit"].as_str(),
            newest["reason"].as_str()
        ),
        (Some("login"), Some("per-key"), Some("over limit"))
    );
    let digest = newest["identity"].as_str().unwrap().to_owned();
    assert!(digest.starts_with("sha256:"), "{newest}");
    assert!(!text.contains("k_live_42"), "the API key is shown: {text}");
    // Two callers refused in turn: one entry each, not one per refusal.
    for name in ["erin", "frank"] {
        for _ in 0..2 {
            assert_eq!(user(a, name).await, StatusCode::OK);
        }
    }
    for _ in 0..5 {
        for name in ["erin", "frank"] {
            assert_eq!(user(a, name).await, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    let (_, overview) = admin_json(a, "/console/api/overview").await;
    let denials = overview["denials"].as_array().unwrap();
    let lines: Vec<(&str, u64)> = denials
        .iter()
        .take(2)
        .map(|d| {
            (
                d["identity"].as_str().unwrap(),
                d["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(lines, [("frank", 5), ("erin", 5)], "{overview}");
    assert!(denials[1]["first"].as_str() < denials[1]["last"].as_str());
    // alice's ten refusals in a row are one entry.
    let alice = overview["denials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["identity"] == "alice")
        .expect("alice's denials");
    assert_eq!(
        (alice["count"].as_u64(), alice["reason"].as_str()),
        (Some(10), Some("penalty box (block_for)"))
    );

    // Searched by the operator: a digest in the heading and on the route that reads it from
    // the API-key header (the `api` route would read it as a user id, and shows it so).
    let (status, caller) = admin_json(a, "/console/api/caller?identity=k_live_42").await;
    assert_eq!(status, StatusCode::OK, "{caller}");
    assert_eq!(caller["identity"], digest.as_str());
    let login = &caller["routes"][0];
    assert_eq!(login["route"], "login");
    assert!(
        !login.to_string().contains("k_live_42"),
        "the API key is shown: {login}"
    );
    assert!(
        login["explain"]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("apikey = {digest} (from header x-api-key)")),
        "{login}"
    );
    assert_eq!(login["state"]["limits"][0]["allowed"], false, "{login}");
    assert_eq!(
        login["explain"]["limits"][0]["live"]["allowed"], false,
        "{login}"
    );

    // bob, on the replica that denied him: `login` reads an API key, and shows the value as
    // its digest; `api` reads a user id and shows it, and lists bob so: the heading too.
    let (status, text) = admin_get(&fleet.b, "/console/api/caller?identity=bob").await;
    assert_eq!(status, StatusCode::OK);
    let caller: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(caller["identity"], "bob", "{caller}");
    assert_eq!(
        caller["routes"][0]["state"]["identity"].as_str().unwrap(),
        support_digest("bob")
    );
    assert_eq!(caller["routes"][1]["state"]["identity"], "bob");
    assert_eq!(
        caller["routes"][1]["state"]["limits"][0]["blocked"]["by"],
        "per-user"
    );
    // A caller no list names: the heading by the strictest rule of the routes.
    let (_, zoe) = admin_json(a, "/console/api/caller?identity=zoe").await;
    assert_eq!(
        zoe["identity"].as_str(),
        Some(support_digest("zoe").as_str())
    );
    assert_eq!(zoe["routes"][1]["state"]["identity"], "zoe");

    let (status, explained) = admin_json(
        a,
        "/limits/explain?url=%2Fapi%2Fx&header=x-user%3A%20carol&live=true",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{explained}");
    assert_eq!(explained["route"], "api");
    assert_eq!(explained["limits"][0]["identities"][0]["value"], "carol");
    assert_eq!(explained["limits"][0]["live"]["remaining"], 1);
    let (status, text) = admin_get(
        a,
        "/limits/explain?url=/login&header=x-api-key:k_live_42&format=text",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains(&format!("apikey = {digest} (from header x-api-key)")),
        "{text}"
    );
    assert!(!text.contains("k_live_42"), "{text}");
    for (query, error) in [
        ("", "missing query parameter `url`"),
        ("?url=/a&format=xml", "format must be `json` or `text`"),
        ("?url=/a&live=yes", "live must be `true` or `false`"),
        ("?url=/a&client_ip=x", "client_ip must be an IP address"),
        ("?url=/a&uri=/b", "unknown query parameter `uri`"),
    ] {
        let (status, text) = admin_get(a, &format!("/limits/explain{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(error), "{query}: {text}");
    }
    let (status, text) = admin_get(a, "/console/api/overview?k=3").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("takes none"), "{text}");
    let (status, protect) = admin_json(a, "/console/api/protect").await;
    assert_eq!(
        (status, &protect["available"]),
        (StatusCode::OK, &Value::Bool(false))
    );
}

/// `sha256:<first 12 hex digits>`, as the logs and explain show a hashed value.
fn support_digest(value: &str) -> String {
    format!("sha256:{}", &sha256_hex(value.as_bytes())[..12])
}

/// Route `partner` reads a partner key from `x-partner-key`, a credential-named header its
/// identity shows clear (`display: clear`), once an hour; `api` reads an API key from
/// `x-api-key` (shown by its short form), 3 a minute and 1000 in 30 days.
fn quota_config(up: &Upstream, redis: &RedisServer) -> Config {
    // SAFETY (edition 2021: safe): every test of this file sets the same value.
    std::env::set_var(TOKEN_ENV, TOKEN);
    config()
        .upstream(&up.url())
        .admin_with_token("127.0.0.1:0", TOKEN_ENV)
        .store(store::redis(&redis.url()).timeout("2s"))
        .identity("partner", [source::header("x-partner-key")])
        .display("partner", "clear")
        .identity("customer", [source::header("x-api-key")])
        .route(
            route("partner")
                .prefix("/partner")
                .key("partner")
                .limit(limit::sliding_log(1, "1h").name("per-hour")),
        )
        .route(
            route("api")
                .prefix("/")
                .key("customer")
                .limit(limit::sliding_log(3, "1m").name("per-minute"))
                .limit(limit::fixed_window(1000, "30d").name("monthly")),
        )
}

const API_KEY: &str = "k_live_42";

/// Two replicas on one Redis: partner `p_1` refused once and the API key refused twice, on A.
async fn quota_fleet() -> Fleet {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let config = quota_config(&up, &redis);
    let a = start(&config).await;
    let b = start(&config).await;
    for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        assert_eq!(
            call(&a, "x-partner-key", "p_1", "/partner/x").await,
            expected
        );
    }
    for i in 0..5 {
        let expected = if i < 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(
            call(&a, "x-api-key", API_KEY, "/api/x").await,
            expected,
            "{i}"
        );
    }
    Fleet {
        _redis: redis,
        _up: up,
        a,
        b,
    }
}

/// The heading of the caller's panel, once it names `who`.
async fn heading(browser: &Browser, who: &str) {
    let wanted = format!("caller {who}");
    browser
        .until_text("#caller h3", &wanted, |t| t == wanted)
        .await;
}

/// One form per caller everywhere: a partner key its identity shows clear is named so; an API
/// key is its short form in the top offenders, the recent denials, `/limits/top` and the
/// panel's heading, whether it is found by its value or by that short form.
#[tokio::test]
async fn console_names_callers_by_their_display_rule_and_finds_them_by_value_and_short_form() {
    let fleet = quota_fleet().await;
    let digest = support_digest(API_KEY);
    // B lists A's denials once A has published them (every second).
    for path in ["/limits/top", "/limits/top?format=text"] {
        let started = Instant::now();
        let text = loop {
            let (status, text) = admin_get(&fleet.b, path).await;
            assert_eq!(status, StatusCode::OK, "{text}");
            let both = text.contains("p_1") && text.contains(&digest);
            if both || started.elapsed() > Duration::from_secs(10) {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(text.contains(&digest) && text.contains("p_1"), "{text}");
        assert!(!text.contains(API_KEY), "{path} shows the API key: {text}");
    }
    // `GET /limits/explain` quotes a request's values by the same rule.
    for (url, header, shown) in [
        (
            "/partner/x",
            "x-partner-key:p_1",
            "partner = p_1 (from header x-partner-key)".to_owned(),
        ),
        (
            "/api/x",
            "x-api-key:k_live_42",
            format!("customer = {digest} (from header x-api-key)"),
        ),
    ] {
        let (status, text) = admin_get(
            &fleet.a,
            &format!("/limits/explain?url={url}&header={header}&format=text"),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(text.contains(&shown), "{shown:?} not in {text}");
        assert!(!text.contains(API_KEY), "{text}");
    }
    let browser = browser::launch("display").await;
    browser.goto(&console_url(&fleet.a)).await;
    browser
        .until_text("#top tr.offender", "the partner, clear", |t| {
            t == "partner p_1 header 1 1"
        })
        .await;
    let api = format!("api {digest} header 2 1");
    browser
        .until_text("#top tr.offender", "the API key's short form", |t| t == api)
        .await;
    let denied = format!("{digest} header api per-minute over limit 2 ");
    browser
        .until_text("#denials tr.denial", "the API key's denials", |t| {
            t.starts_with(&denied)
        })
        .await;

    // The partner, clicked: named as the list names them.
    browser
        .click("#top tr.offender[data-identity=\"p_1\"] a.identity")
        .await;
    heading(&browser, "p_1").await;
    browser
        .until_text(
            ".caller-route[data-route=\"partner\"] .limit-state[data-limit=\"per-hour\"]",
            "the partner limited",
            |t| t.starts_with("per-hour LIMITED"),
        )
        .await;

    // The API key, by its value: the heading shows its short form, as the lists do.
    browser.type_into("#identity", API_KEY).await;
    browser.click("#search").await;
    heading(&browser, &digest).await;
    let row = ".caller-route[data-route=\"api\"] .limit-state[data-limit=\"per-minute\"]";
    browser
        .until_text(row, "the API key limited", |t| {
            t.starts_with("per-minute LIMITED, retry in ")
        })
        .await;
    // Where the API key is read, and in the heading, it is its short form (the partner
    // route would read it as a partner key, which that route shows clear).
    for shown in ["#caller h3", ".caller-route[data-route=\"api\"]"] {
        let text = browser.texts(shown).await.join("\n");
        assert!(!text.contains(API_KEY), "{text}");
    }

    // ... and by the short form, clicked in the list.
    browser
        .click(&format!(
            "#top tr.offender[data-identity=\"{digest}\"] a.identity"
        ))
        .await;
    browser
        .until_text(
            &format!("#caller[data-for=\"{digest}\"] h3"),
            "the lookup by short form",
            |t| t == format!("caller {digest}"),
        )
        .await;
    let address = browser.client.current_url().await.unwrap();
    assert_eq!(
        address.fragment(),
        Some(format!("caller={}", digest.replace(':', "%3A")).as_str())
    );
    browser
        .until_text(row, "the API key limited", |t| {
            t.starts_with("per-minute LIMITED, retry in ")
        })
        .await;
    let panel = browser.texts("#caller").await.join("\n");
    assert!(!panel.contains(API_KEY), "{panel}");
    browser.screenshot("short-form").await;
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// An override of one limit, as an operator makes it: the console shows what each limit will
/// become (a dry run, which changes nothing), then applies it; the monthly quota keeps its
/// limit and its usage, and both replicas list the override with who set it.
#[tokio::test]
async fn console_per_limit_override_leaves_the_monthly_quota_alone_and_both_replicas_list_it() {
    let fleet = quota_fleet().await;
    let digest = support_digest(API_KEY);
    let state_path = format!("/limits/state?route=api&identity={digest}");
    let monthly = |state: &Value| {
        state["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit_name"] == "monthly")
            .cloned()
            .unwrap()
    };
    let (_, before) = admin_json(&fleet.a, &state_path).await;
    let month_before = monthly(&before);

    let browser = browser::launch("per-limit-override").await;
    browser.goto(&console_url(&fleet.a)).await;
    browser.type_into("#token", TOKEN).await;
    browser
        .click(&format!(
            "#top tr.offender[data-identity=\"{digest}\"] a.identity"
        ))
        .await;
    heading(&browser, &digest).await;
    let route = ".caller-route[data-route=\"api\"]";
    browser
        .select(&format!("{route} select.override-limit"), "per-minute")
        .await;
    browser
        .select(&format!("{route} select.override-how"), "limit")
        .await;
    browser
        .type_into(&format!("{route} .override-amount"), "100")
        .await;
    browser
        .type_into(&format!("{route} .override-for"), "1h")
        .await;
    browser.click(&format!("{route} button.preview")).await;
    let preview = format!("{route} .preview-box tr.override-limit");
    let minute = browser
        .until_text(&preview, "the per-minute limit's preview", |t| {
            t.starts_with("per-minute ")
        })
        .await;
    assert!(minute.ends_with(" 3 100 as given"), "{minute}");
    let month = browser
        .until_text(&preview, "the monthly limit's preview", |t| {
            t.starts_with("monthly ")
        })
        .await;
    assert!(month.ends_with(" 1000 1000 unchanged"), "{month}");
    browser.screenshot("preview").await;
    // A preview changes nothing.
    let (_, listed) = admin_json(&fleet.a, "/limits/overrides").await;
    assert_eq!(listed["overrides"], Value::Array(vec![]), "{listed}");
    assert_eq!(
        call(&fleet.a, "x-api-key", API_KEY, "/api/x").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    browser.click(&format!("{route} button.override")).await;
    browser
        .until_text("#message.done", "the override applied", |t| {
            t.starts_with("override of api: done, until 20")
        })
        .await;
    let overridden = browser
        .until_text(
            &format!("{route} .limit-state[data-limit=\"per-minute\"] .override"),
            "the per-minute limit overridden",
            |t| t.starts_with("limit 100 on per-minute until "),
        )
        .await;
    assert!(overridden.ends_with(" UTC"), "{overridden}");
    // Read until one read is whole: the panel is redrawn on every refresh.
    let monthly_override = format!("{route} .limit-state[data-limit=\"monthly\"] .override");
    eventually(
        "the monthly limit shown without an override",
        PATIENCE,
        async || {
            let shown = browser.texts(&monthly_override).await;
            until(shown == ["—"], shown)
        },
    )
    .await;
    // The month: the same limit, its usage kept.
    let (_, after) = admin_json(&fleet.a, &state_path).await;
    let month_after = monthly(&after);
    assert_eq!(
        (
            &month_after["limit"],
            &month_after["remaining"],
            &month_after["overridden"]
        ),
        (
            &month_before["limit"],
            &month_before["remaining"],
            &Value::Bool(false)
        ),
        "{after}"
    );
    assert_eq!(month_after["limit"], 1000);
    // The caller passes again on the per-minute limit (its usage still counted, under the
    // override's larger limit).
    assert_eq!(
        call(&fleet.a, "x-api-key", API_KEY, "/api/x").await,
        StatusCode::OK
    );

    // The overrides in force, on either replica's console.
    let listed = format!("api {digest} per-minute limit 100 ");
    for (replica, proxy) in [("a", &fleet.a), ("b", &fleet.b)] {
        browser.goto(&console_url(proxy)).await;
        let entry = browser
            .until_text("#overrides tr.override-entry", "the override", |t| {
                t.starts_with(&listed)
            })
            .await;
        assert!(
            entry.contains(" UTC (in 60 min) ") || entry.contains(" UTC (in 59 min) "),
            "{entry}"
        );
        assert!(entry.contains(" token "), "{entry}");
        browser.screenshot(&format!("overrides-{replica}")).await;
    }
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

/// docs/console.png: two replicas on one Redis, two API keys flooding them in turn for 45 s
/// and a partner refused, one key overridden on its per-minute limit, the other looked up.
/// Run by hand (`cargo test --test console -- --ignored docs_screenshot`), then copy
/// target/console-screenshots/docs-console.png to docs/console.png.
#[tokio::test]
#[ignore = "makes docs/console.png: 45 s of traffic"]
async fn docs_screenshot() {
    let fleet = quota_fleet().await;
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, text) = admin_request(
        &fleet.a,
        "POST",
        "/limits/override?route=api&identity=k_test_7&limit_name=per-minute&limit=30&for=2h",
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let started = Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_secs(45) {
        for (proxy, key) in [
            (&fleet.a, API_KEY),
            (&fleet.b, "k_test_7"),
            (&fleet.b, API_KEY),
        ] {
            if call(proxy, "x-api-key", key, "/api/x").await == StatusCode::TOO_MANY_REQUESTS {
                refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(refused > 0);
    let browser = browser::launch("docs").await;
    browser.client.set_window_size(1400, 2000).await.unwrap();
    browser
        .goto(&format!(
            "{}#caller={}",
            console_url(&fleet.a),
            support_digest(API_KEY)
        ))
        .await;
    browser
        .until_text("#overrides tr.override-entry", "the override", |t| {
            t.starts_with("api ")
        })
        .await;
    browser
        .until_text(API_KEY_ROW, "the looked-up key", |t| {
            t.starts_with("per-minute")
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    browser.screenshot("console").await;
    assert_no_browser_errors(&browser).await;
    browser.close().await;
}

const API_KEY_ROW: &str =
    ".caller-route[data-route=\"api\"] .limit-state[data-limit=\"per-minute\"]";
