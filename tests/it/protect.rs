//! `protect` end to end: a real capacity-limited app (tests/support/capacity_app.rs: a fixed
//! number of slots, a service time the test changes while it runs) behind the real proxy, and
//! an open-loop client at a fixed rate with a client timeout (tests/support/open_loop.rs).
//!
//! Scaled for a loaded 2-core machine: the app has 4 slots × 25 ms, 160 requests a second.
//! The thresholds are issue 27's, compared with what this machine gives in the same run, so
//! that they hold on a busy machine (issue 36): at 3× capacity goodput ≥ 80 % of the app's
//! capacity as measured just before (`measured_capacity`: its answers per second with a queue
//! always waiting, straight from the client, which a busy CPU lowers through the app's late
//! timers) and p99 of the admitted ≤ 2.5× the unloaded p99 of the same run; ≥ 99 % of the
//! `high` fifth of the traffic served while `low` is shed (≤ 1 % of it shed; served of what the
//! app's measured capacity allows); nothing shed at half of capacity;
//! ≥ 80 % of a degraded app's measured capacity within 2 s, and the limit grown back within
//! 5 s of its recovery; long-lived exchanges do not pin the limit; shadow mode never sheds.
//! A protect that sheds a healthy app (a limit of 3 for its 4 slots serves at most 75 %) or
//! lets it collapse (its queue past the client's timeout) still fails them. The scenarios run
//! one at a time (a lock): they measure.

use std::time::Duration;

use crate::support::{heavy_alone, proxy, CapacityApp, OpenLoop, ProxyHandle};
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::Value;

// not a bound: a unit, and the app's configured service time.
const MS: Duration = Duration::from_millis(1);
const SLOTS: usize = 4;
const SERVICE: Duration = Duration::from_millis(25);
/// 4 slots × 25 ms.
const CAPACITY: f64 = 160.0;
/// The goodput asked of protect under overload, as a share of the app's measured capacity.
/// At exactly the app's slots, each slot idles while an answer travels back through the proxy
/// and the next request in: 92–93 % on a quiet machine, 85 % of the measured capacity at load
/// 13–14 (2026-11-27, two CPU-bound loops beside other builds). A limit of 3 for the 4 slots
/// serves at most 75 %.
const GOODPUT_SHARE: f64 = 0.8;

/// The proxy with an admin listener in front of `app`, with `extra` YAML (routes, protect).
async fn front(app: &CapacityApp, extra: &str) -> ProxyHandle {
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\naccess_log: false\nupstream:\n  url: {}\n  timeout: 5s\n{extra}",
        app.url()
    );
    proxy(yaml).start().await
}

const PROTECT: &str = "protect:\n  latency: 2x\n  max_wait: 50ms\n";

/// `GET /protect` as JSON.
async fn state(front: &ProxyHandle) -> Value {
    let url = format!("http://{}/protect", front.admin.expect("an admin listener"));
    let response = crate::support::http1_client()
        .request(crate::support::get(&url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    serde_json::from_str(&crate::support::text(response).await).unwrap()
}

async fn metrics(front: &ProxyHandle) -> String {
    let url = format!("http://{}/metrics", front.admin.expect("an admin listener"));
    let response = crate::support::http1_client()
        .request(crate::support::get(&url))
        .await
        .unwrap();
    crate::support::text(response).await
}

/// A warm-up at a quarter of capacity: the proxy learns the app's unloaded latency, and the
/// unloaded p99 the overload is compared with. A machine so busy that even this load waits
/// for the CPU (a request late, or p99 above 4× the service time) measures nothing: the
/// warm-up is tried again for a while, then the test fails saying so.
async fn unloaded_p99(front: &ProxyHandle) -> Duration {
    let mut seen = Vec::new();
    for _ in 0..5 {
        let report = OpenLoop::new(format!("http://{}", front.addr))
            .rate(CAPACITY / 4.0, Duration::from_secs(2))
            .run()
            .await;
        let total = report.total();
        if total.ok == total.sent && total.p99 <= SERVICE * 4 {
            return total.p99;
        }
        seen.push(total.p99);
    }
    panic!("the machine is too busy to measure overload: unloaded p99s {seen:?} for a service time of {SERVICE:?}");
}

/// The app's capacity on this machine now, in answers per second: what it serves while a
/// queue always waits in it (the open-loop client at twice the nominal capacity, straight to
/// the app, no proxy), counted over 1.5 s once the queue has formed. A busy machine fires the
/// app's timers late: the goodput criteria compare with this rather than the nominal 160/s.
async fn measured_capacity(app: &CapacityApp) -> f64 {
    let load = tokio::spawn(
        OpenLoop::new(app.url())
            .rate(2.0 * CAPACITY, Duration::from_secs(2))
            .run(),
    );
    tokio::time::sleep(500 * MS).await;
    let answered = |s: crate::support::capacity_app::AppStats| s.served + s.errors;
    let (before, from) = (answered(app.stats()), std::time::Instant::now());
    tokio::time::sleep(1500 * MS).await;
    let (after, to) = (answered(app.stats()), std::time::Instant::now());
    load.await.unwrap();
    app.control().drop_waiting();
    let capacity = (after - before) as f64 / (to - from).as_secs_f64();
    eprintln!("measured capacity {capacity:.1}/s (nominal {CAPACITY})");
    capacity.min(CAPACITY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_three_times_capacity_goodput_and_latency_hold() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, PROTECT).await;
    let capacity = measured_capacity(&app).await;
    let unloaded = unloaded_p99(&front).await;
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(3.0 * CAPACITY, Duration::from_secs(6))
        .run()
        .await;
    // The first second is the controller's to find the limit.
    let steady = report.phase(None, 0, Duration::from_secs(1));
    let state = state(&front).await;
    eprintln!("unloaded p99 {unloaded:?}; steady {steady:?}; state {state}");
    assert!(
        steady.goodput >= GOODPUT_SHARE * capacity,
        "goodput {} of a measured {capacity}: {steady:?}",
        steady.goodput
    );
    assert!(
        steady.p99 <= unloaded.mul_f64(2.5),
        "p99 {:?} against unloaded {unloaded:?}",
        steady.p99
    );
    assert!(steady.shed > 0, "{steady:?}");
    assert_eq!(steady.other + steady.failed, 0, "{steady:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_high_fifth_is_served_while_low_is_shed() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let routes = "routes:\n  - name: urgent\n    match: { headers: { X-Priority: high } }\n    priority: high\n  - name: rest\n    match: { path_prefix: / }\n    priority: low\n";
    let front = front(&app, &format!("{PROTECT}{routes}")).await;
    let capacity = measured_capacity(&app).await;
    unloaded_p99(&front).await;
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(3.0 * CAPACITY, Duration::from_secs(6))
        .class("high", 1.0, &[("X-Priority", "high")])
        .class("low", 4.0, &[])
        .run()
        .await;
    let high = report.phase(Some("high"), 0, Duration::from_secs(1));
    let low = report.phase(Some("low"), 0, Duration::from_secs(1));
    eprintln!("high {high:?}\nlow {low:?}\n{}", state(&front).await);
    // Shedding `high` while `low` waits is protect's own failure, on any machine.
    assert!(
        high.shed as f64 <= 0.01 * high.sent as f64,
        "high: {high:?}"
    );
    // The high fifth (96/s) fits in the app's 160/s; a machine whose load slows the app
    // below that (its measured capacity, over the phase's 5 s) cannot serve all of it.
    let servable = (high.sent as f64).min(capacity * 5.0);
    assert!(
        high.ok as f64 >= 0.99 * servable,
        "high: {high:?}, measured capacity {capacity:.1}/s"
    );
    assert!(low.shed as f64 > 0.5 * low.sent as f64, "low: {low:?}");
    let text = metrics(&front).await;
    assert!(
        text.contains("tollgate_requests_total{route=\"rest\",decision=\"shed\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_half_of_capacity_nothing_is_shed() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, PROTECT).await;
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(CAPACITY / 2.0, Duration::from_secs(6))
        .run()
        .await;
    let total = report.total();
    assert_eq!((total.shed, total.ok), (0, total.sent), "{total:?}");
    let state = state(&front).await;
    assert_eq!(state["shed"]["normal"], 0, "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_app_is_followed_within_two_seconds_and_its_recovery_within_five() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, PROTECT).await;
    let capacity = measured_capacity(&app).await;
    unloaded_p99(&front).await;
    let control = app.control();
    let load = OpenLoop::new(format!("http://{}", front.addr))
        .rate(3.0 * CAPACITY, Duration::from_secs(4))
        .then(3.0 * CAPACITY, Duration::from_secs(5))
        .then(3.0 * CAPACITY, Duration::from_secs(6));
    // Degrade at 4 s (half the slots, each twice as slow: a quarter of the capacity), recover
    // at 9 s.
    let changes = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        control.set_capacity(SLOTS / 2, SERVICE * 2);
        tokio::time::sleep(Duration::from_secs(5)).await;
        control.set_capacity(SLOTS, SERVICE);
    });
    let report = load.run().await;
    changes.await.unwrap();
    let degraded = report.phase(None, 1, Duration::from_secs(2));
    let recovered = report.phase(None, 2, Duration::from_secs(5));
    eprintln!(
        "degraded {degraded:?}\nrecovered {recovered:?}\n{}",
        state(&front).await
    );
    // A quarter of the measured capacity: the timers' lateness weighs less on 50 ms.
    let degraded_capacity = capacity / 4.0;
    assert!(
        degraded.goodput >= GOODPUT_SHARE * degraded_capacity,
        "degraded goodput {} of {degraded_capacity}: {degraded:?}",
        degraded.goodput
    );
    // Grown back: the full capacity again needs a limit of at least the app's 4 slots.
    assert!(
        recovered.goodput >= GOODPUT_SHARE * capacity,
        "recovered goodput {} of a measured {capacity}: {recovered:?}",
        recovered.goodput
    );
    let state = state(&front).await;
    assert!(state["limit"].as_u64().unwrap() >= SLOTS as u64, "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_tunnel_and_a_streaming_response_do_not_pin_the_limit() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    // A limit of at most 10: ten long-lived exchanges would hold all of it if they counted.
    let front = front(&app, "protect:\n  max_wait: 50ms\n  max_limit: 10\n").await;
    let capacity = measured_capacity(&app).await;
    unloaded_p99(&front).await;
    let client = crate::support::http1_client();
    let mut streams = Vec::new();
    for _ in 0..5 {
        let response = client
            .request(crate::support::get(&front.url("/stream")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"open\n");
        streams.push(body);
    }
    let mut sockets = Vec::new();
    for _ in 0..5 {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", front.addr))
            .await
            .unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::text("ping"))
            .await
            .unwrap();
        assert_eq!(
            ws.next()
                .await
                .unwrap()
                .unwrap()
                .into_text()
                .unwrap()
                .as_str(),
            "ping"
        );
        sockets.push(ws);
    }
    assert_eq!(state(&front).await["in_flight"], 0);
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(3.0 * CAPACITY, Duration::from_secs(5))
        .run()
        .await;
    let steady = report.phase(None, 0, Duration::from_secs(1));
    let series: Vec<f64> = report.series(None).iter().map(|b| b.goodput).collect();
    assert!(
        steady.goodput >= GOODPUT_SHARE * capacity,
        "goodput {} of a measured {capacity}: {steady:?}\nby 250 ms: {series:?}\n{}\n{:?}",
        steady.goodput,
        state(&front).await,
        app.stats()
    );
    // Still open, and still answering.
    for ws in &mut sockets {
        ws.send(tokio_tungstenite::tungstenite::Message::text("still"))
            .await
            .unwrap();
        assert_eq!(
            ws.next()
                .await
                .unwrap()
                .unwrap()
                .into_text()
                .unwrap()
                .as_str(),
            "still"
        );
    }
    assert_eq!(app.stats().open_streams, 5);
    app.control().release_streams();
    for body in streams {
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"closed\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_sheds_and_reports_what_it_would_have() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, "protect:\n  mode: shadow\n").await;
    unloaded_p99(&front).await;
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(3.0 * CAPACITY, Duration::from_secs(3))
        .run()
        .await;
    let total = report.total();
    assert_eq!(total.shed, 0, "{total:?}");
    let state = state(&front).await;
    assert_eq!(state["mode"], "shadow");
    let would = state["shed"]["normal"].as_u64().unwrap();
    assert!(would > 0, "{state}");
    let text = metrics(&front).await;
    assert!(
        text.lines().any(|l| l
            .starts_with("tollgate_protect_shed_total{priority=\"normal\",mode=\"shadow\"} ")
            && !l.ends_with(" 0")),
        "{text}"
    );
    assert!(
        text.contains("tollgate_requests_total{route=\"(none)\",decision=\"shadow_shed\"}"),
        "{text}"
    );
    // Let the app's queue go before the next scenario.
    app.control().drop_waiting();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_from_the_app_bring_the_limit_down() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, PROTECT).await;
    let before = state(&front).await["limit"].as_u64().unwrap();
    app.control().set_error_fraction(1.0);
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(CAPACITY / 2.0, Duration::from_secs(2))
        .run()
        .await;
    assert!(report.total().other > 0);
    let state = state(&front).await;
    let after = state["limit"].as_u64().unwrap();
    assert!(after < before / 2, "{before} → {after}: {state}");
    assert!(state["error_share"].as_f64().unwrap() > 0.5, "{state}");
}

/// `/protect` says why the limit is where it is: what the last window did, the level the app
/// was served at, a paced level, and the last cut with its cause, when, from what to what.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protect_shows_why_the_limit_is_where_it_is() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, PROTECT).await;
    let fresh = state(&front).await;
    assert_eq!(fresh["state"], "holding", "{fresh}");
    assert_eq!(fresh["last_cut"], Value::Null, "{fresh}");
    assert_eq!(fresh["paced"], Value::Null, "{fresh}");
    assert_eq!(fresh["good_limit"], Value::Null, "{fresh}");
    app.control().set_error_fraction(1.0);
    OpenLoop::new(format!("http://{}", front.addr))
        .rate(CAPACITY / 2.0, Duration::from_secs(1))
        .run()
        .await;
    let state = state(&front).await;
    let cut = &state["last_cut"];
    assert_eq!(cut["cause"], "errors", "{state}");
    let (from, to) = (cut["from"].as_u64().unwrap(), cut["to"].as_u64().unwrap());
    assert!(
        from > to && to == state["limit"].as_u64().unwrap(),
        "{state}"
    );
    assert!(cut["window"].as_u64().unwrap() <= state["windows"].as_u64().unwrap());
    assert!(cut["window"].as_u64().unwrap() >= 1, "{state}");
    let ago = cut["ago_ms"].as_f64().unwrap();
    assert!((0.0..2000.0).contains(&ago), "{state}");
    // The last window cut (every exchange failed), or a later one held.
    assert!(
        ["cut", "holding"].contains(&state["state"].as_str().unwrap()),
        "{state}"
    );
    let url = format!(
        "http://{}/protect?format=text",
        front.admin.expect("an admin listener")
    );
    let response = crate::support::http1_client()
        .request(crate::support::get(&url))
        .await
        .unwrap();
    let text = crate::support::text(response).await;
    assert!(
        text.contains(&format!("last cut  {from} → {to} by errors at window ")),
        "{text}"
    );
    assert!(text.contains("\nstate     "), "{text}");
    assert!(text.contains("\nlimit     "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_protect_nothing_is_shed_and_nothing_of_it_shows() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(&app, "").await;
    let report = OpenLoop::new(format!("http://{}", front.addr))
        .rate(2.0 * CAPACITY, Duration::from_secs(1))
        .run()
        .await;
    assert_eq!(report.total().shed, 0);
    let text = metrics(&front).await;
    assert!(!text.contains("tollgate_protect"), "{text}");
    let url = format!("http://{}/protect", front.admin.unwrap());
    let response = crate::support::http1_client()
        .request(crate::support::get(&url))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    app.control().drop_waiting();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_request_is_told_the_app_is_overloaded() {
    let _alone = heavy_alone().await;
    // One slot of a long time, a limit of one, no wait: the second request is shed.
    let app = CapacityApp::start(1, Duration::from_millis(800));
    let front = front(
        &app,
        "protect:\n  max_wait: 0ms\n  min_limit: 1\n  max_limit: 1\n",
    )
    .await;
    let client = crate::support::http1_client();
    let first = tokio::spawn(client.request(crate::support::get(&front.url("/a"))));
    tokio::time::sleep(200 * MS).await;
    let response = client
        .request(crate::support::get(&front.url("/b")))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = serde_json::from_str(&crate::support::text(response).await).unwrap();
    assert_eq!(problem["type"], "urn:tollgate:problem:overloaded");
    assert_eq!(problem["title"], "Service Overloaded");
    assert!(
        problem["detail"].as_str().unwrap().contains("overloaded"),
        "{problem}"
    );
    // A gRPC call is answered in gRPC: UNAVAILABLE with a pushback.
    let request = http::Request::post(front.url("/pkg.Svc/Call"))
        .header("content-type", "application/grpc")
        .body(crate::support::body(bytes::Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1000");
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    let state = state(&front).await;
    assert_eq!(state["shed"]["normal"], 2, "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_quota_never_takes_a_slot() {
    let _alone = heavy_alone().await;
    let app = CapacityApp::start(SLOTS, SERVICE);
    let front = front(
        &app,
        "protect:\n  max_wait: 0ms\n  min_limit: 1\n  max_limit: 1\nroutes:\n  - name: api\n    priority: high\n    limits:\n      - { algorithm: fixed_window, limit: 1, period: 1h }\n",
    )
    .await;
    let client = crate::support::http1_client();
    let statuses = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let response = client
                .request(crate::support::get(&front.url("/x")))
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
        }
        statuses
    };
    // Limited (429), not shed (503): the limit stage decided first.
    assert_eq!(statuses, [200, 429, 429]);
    let state = state(&front).await;
    assert_eq!(state["admitted"]["high"], 1, "{state}");
    assert_eq!(state["shed"]["high"], 0, "{state}");
}
