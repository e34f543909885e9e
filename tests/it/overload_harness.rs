//! The overload harness itself (tests/support/capacity_app.rs and open_loop.rs): the app serves
//! exactly its capacity, changes while it runs and serves long-lived exchanges without a slot;
//! the client keeps its schedule and counts what came back. Cheap: a few seconds in all.

use std::time::Duration;

use crate::support::open_loop::Outcome;
use crate::support::{heavy_turn, CapacityApp, OpenLoop};
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;

// not a bound: a unit.
const MS: Duration = Duration::from_millis(1);

/// 2 slots × 50 ms is 40 requests a second: 80 sent in one second are all served, the last one
/// only about a second after it was sent (the app needs two seconds for them), and the queue
/// holds the excess meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_of_two_slots_of_50ms_serves_40_per_second() {
    let _turn = heavy_turn().await;
    let app = CapacityApp::start(2, 50 * MS);
    assert_eq!(app.capacity_per_second(), 40.0);
    let report = OpenLoop::new(app.url())
        .rate(80.0, Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .run()
        .await;
    let total = report.total();
    assert_eq!((total.sent, total.ok), (80, 80), "{total:?}");
    // The last request (sent at 0.9875 s) can finish no earlier than 40 turns of 50 ms.
    assert!(
        total.max >= 1000 * MS,
        "served faster than capacity: {total:?}"
    );
    assert!(total.max < 3000 * MS, "{total:?}");
    // The first ones found free slots.
    assert!(
        report.records[0].latency < 500 * MS,
        "{:?}",
        report.records[0]
    );
    let stats = app.stats();
    assert_eq!((stats.arrived, stats.served, stats.errors), (80, 80, 0));
    assert_eq!(stats.max_in_service, 2);
    assert!(stats.max_waiting >= 30, "{stats:?}");
    assert_eq!((stats.in_service, stats.waiting), (0, 0));
}

/// Requests go out on schedule whatever the server does, phase by phase and class by class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_its_rate_and_shares() {
    let _turn = heavy_turn().await;
    let app = CapacityApp::start(1000, Duration::ZERO);
    let load = OpenLoop::new(app.url())
        .rate(200.0, 1000 * MS)
        .then(400.0, 500 * MS)
        .class("high", 1.0, &[("X-Priority", "high")])
        .class("low", 4.0, &[]);
    assert_eq!(load.duration(), 1500 * MS);
    let started = std::time::Instant::now();
    let report = load.run().await;
    let elapsed = started.elapsed();
    assert!(elapsed >= 1500 * MS, "{elapsed:?}");
    assert!(elapsed < 10_000 * MS, "{elapsed:?}");

    let total = report.total();
    assert_eq!((total.sent, total.ok), (400, 400), "{total:?}");
    assert_eq!(app.stats().arrived, 400);
    assert_eq!(report.class(Some("high")).sent, 80);
    assert_eq!(report.class(Some("low")).sent, 320);
    // One in every five requests is high, evenly spread.
    assert!(report
        .records
        .chunks(5)
        .all(|five| five.iter().filter(|r| r.class == 0).count() == 1));
    assert_eq!(report.phase(None, 0, Duration::ZERO).sent, 200);
    assert_eq!(report.phase(None, 1, Duration::ZERO).sent, 200);
    assert_eq!(report.phase(None, 1, 250 * MS).sent, 100);

    let sent: Vec<usize> = report.series(None).iter().map(|b| b.sent).collect();
    assert_eq!(sent, [50, 50, 50, 50, 100, 100]);
    let goodput = report.series(None)[0].goodput;
    assert_eq!(goodput, 200.0);
    // Sent within the client timeout of their schedule, or the run would measure nothing (how
    // close to it depends on the machine; other builds share it).
    let (_, lag_p99) = report.send_lag();
    assert!(
        lag_p99 < report.timeout,
        "the client fell behind: p99 {lag_p99:?}"
    );
    assert_eq!(
        report.recovered_at(None, Duration::ZERO, 500 * MS, |b| b.ok == b.sent),
        Some(Duration::ZERO)
    );
}

/// Errors, degrading and recovering, and timeouts: the app answers an exact fraction with 500,
/// serves requests whose client gave up, and the client counts each kind apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_changes_while_it_runs_and_the_client_counts_each_outcome() {
    let _turn = heavy_turn().await;
    let app = CapacityApp::start(4, 10 * MS);
    app.set_error_fraction(0.25);
    let report = OpenLoop::new(app.url()).rate(100.0, 400 * MS).run().await;
    let total = report.total();
    assert_eq!(
        (total.sent, total.ok, total.other),
        (40, 30, 10),
        "{total:?}"
    );
    assert!(report
        .records
        .iter()
        .all(|r| matches!(r.outcome, Outcome::Success | Outcome::Other(500))));
    assert_eq!((app.stats().served, app.stats().errors), (30, 10));

    app.set_error_fraction(0.0);
    app.set_capacity(1, 300 * MS);
    assert_eq!(app.stats().slots, 1);
    assert!((app.capacity_per_second() - 10.0 / 3.0).abs() < 1e-9);
    let report = OpenLoop::new(app.url())
        .rate(50.0, 100 * MS)
        .timeout(100 * MS)
        .run()
        .await;
    let total = report.total();
    assert_eq!(
        (total.sent, total.timeouts, total.ok),
        (5, 5, 0),
        "{total:?}"
    );
    // The app still works through what its clients gave up on, one at a time, unless its
    // queue is dropped.
    assert!(app.stats().max_waiting >= 3, "{:?}", app.stats());
    let dropped = app.drop_waiting();
    assert!(dropped >= 2, "{:?}", app.stats());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.stats().in_service > 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", app.stats());
        tokio::time::sleep(20 * MS).await;
    }
    let stats = app.stats();
    assert_eq!((stats.served + stats.dropped, stats.dropped), (35, dropped));
    assert!(app.stats().max_in_service <= 4);

    // Recovered: answers at its service time again.
    app.reset_maxima();
    app.set_capacity(4, 10 * MS);
    let report = OpenLoop::new(app.url()).rate(50.0, 200 * MS).run().await;
    let total = report.total();
    assert_eq!((total.sent, total.ok), (10, 10), "{total:?}");
    assert!(total.p50 >= 10 * MS && total.p50 < 500 * MS, "{total:?}");
    assert!(app.stats().max_in_service <= 4);
}

/// `/stream` and `/ws` stay open without holding a slot; `release_streams` ends the streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lived_exchanges_hold_no_slot() {
    let _turn = heavy_turn().await;
    let app = CapacityApp::start(1, 50 * MS);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let response = client
        .get(format!("{}/stream", app.url()).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"open\n");
    assert_eq!(app.stats().open_streams, 1);

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", app.addr))
        .await
        .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::text("ping"))
        .await
        .unwrap();
    let echo = ws.next().await.unwrap().unwrap();
    assert_eq!(echo.into_text().unwrap().as_str(), "ping");
    assert_eq!(app.stats().open_websockets, 1);

    // The one slot is still free for ordinary requests.
    let stats = app.stats();
    assert_eq!((stats.in_service, stats.arrived), (0, 0));
    let report = OpenLoop::new(app.url()).rate(10.0, 200 * MS).run().await;
    assert_eq!(report.total().ok, 2);

    app.release_streams();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"closed\n");
    ws.close(None).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while app.stats().open_streams + app.stats().open_websockets > 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", app.stats());
        tokio::time::sleep(10 * MS).await;
    }
}
