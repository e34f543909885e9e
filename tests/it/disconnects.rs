//! Clients that hang up, through a real proxy, a real upstream and a real Redis (and the memory
//! store): a client that leaves does not end the app's work, so it does not end what the limits
//! know of it. A `concurrency` slot stays taken until the app has answered (and its body has
//! been read); `count_statuses` is settled on the app's answer although nobody receives it, and
//! an exchange whose outcome can never be known (the upstream timed out, the client cut its
//! request body off) counts as failing; graceful shutdown waits for such exchanges.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `config` with its limits in memory, or in a Redis server.
fn with_store(config: Config, redis: Option<&RedisServer>) -> Config {
    match redis {
        None => config,
        Some(redis) => config.store(store::redis(&redis.url()).timeout("500ms").on_error("deny")),
    }
}

/// Users by `x-user`, and `route` keyed by them.
fn per_user(up: &Upstream, route: Route, redis: Option<&RedisServer>) -> Config {
    with_store(
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .identity("user", [source::header("x-user")])
            .route(route.key("user")),
        redis,
    )
}

/// Sends `GET path` as `user` on a connection of its own and hangs up `after` later, without
/// reading a byte of the answer.
async fn hang_up(addr: SocketAddr, path: &str, user: &str, after: Duration) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: app\r\nX-User: {user}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(stream);
}

/// Sends one request as `user` and reads the whole body: the status.
async fn send(addr: SocketAddr, path: &str, user: &str) -> StatusCode {
    let request = Request::get(format!("http://{addr}{path}"))
        .header("x-user", user)
        .body(body(""))
        .unwrap();
    let answered = async {
        let response = http1_client().request(request).await.unwrap();
        let status = response.status();
        let _ = response.into_body().collect().await;
        status
    };
    tokio::time::timeout(Duration::from_secs(15), answered)
        .await
        .unwrap_or_else(|_| panic!("{path} was not answered within 15 s"))
}

/// Waits (at most `PATIENCE`) until the upstream has seen `n` requests.
async fn upstream_saw(up: &Upstream, n: usize) {
    eventually(
        &format!("the upstream sees {n} requests"),
        PATIENCE,
        async || {
            let seen = up.request_count();
            until(seen >= n, seen)
        },
    )
    .await;
}

/// Waits until the proxy has seen every client connection go (its connection gauge at 0).
async fn clients_gone(proxy: &ProxyHandle) {
    let admin = proxy.admin.unwrap();
    eventually("the proxy sees the client go", PATIENCE, async || {
        let open = metric(admin, "tollgate_client_connections").await;
        until(open == Some(0.0), open)
    })
    .await;
}

/// Waits until `user`'s state on the route `login` shows `n` remaining (a settlement gave
/// its unit back).
async fn remaining_to(proxy: &ProxyHandle, user: &str, n: u64) {
    let url = format!(
        "http://{}/limits/state?route=login&identity={user}",
        proxy.admin.unwrap()
    );
    eventually(&format!("{user} has {n} left"), PATIENCE, async || {
        let (_, _, text) = exchange("GET", &url, &[]).await;
        let state: serde_json::Value = serde_json::from_str(&text).unwrap();
        let left = state["limits"][0]["remaining"].as_u64();
        until(left == Some(n), text)
    })
    .await;
}

/// A concurrency limit of 1 and an app that answers when the test lets it: a client that
/// hangs up right after sending keeps its slot until the app answers. Meanwhile every other
/// request is refused and never reaches the app; the slot frees when the app answers, not
/// before.
async fn a_slot_outlives_a_client_that_hangs_up(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let slow = route("slow").prefix("/sleep").limit(limit::concurrency(1));
    let proxy = proxy(per_user(&up, slow, redis)).start().await;
    proxy.wait_ready().await;

    hang_up(
        proxy.addr,
        "/sleep?release=1",
        "mallory",
        Duration::from_millis(100),
    )
    .await;
    upstream_saw(&up, 1).await;
    // The proxy has seen the client go (it drops the request's future).
    clients_gone(&proxy).await;

    // Hang-ups and patient clients alike: refused while the app works on the first.
    for i in 0..3 {
        hang_up(
            proxy.addr,
            "/sleep?release=1",
            "mallory",
            Duration::from_millis(100),
        )
        .await;
        let status = send(proxy.addr, "/sleep?ms=0", "mallory").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "request {i}");
    }
    assert_eq!(
        up.request_count(),
        1,
        "the app saw exactly the first request"
    );

    // The slot frees when the app answers, not before.
    up.release.notify_one();
    eventually(
        "the slot frees once the app answered",
        PATIENCE,
        async || {
            let status = send(proxy.addr, "/sleep?ms=0", "mallory").await;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            until(status == StatusCode::OK, status)
        },
    )
    .await;
    assert_eq!(up.request_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_outlives_a_client_that_hangs_up_memory() {
    a_slot_outlives_a_client_that_hangs_up(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_outlives_a_client_that_hangs_up_redis() {
    let redis = RedisServer::start();
    a_slot_outlives_a_client_that_hangs_up(Some(&redis)).await;
}

/// A client that reads the head and the first chunk, then hangs up: the slot stays taken
/// while the rest of the body comes from the app, and frees when it ends.
async fn a_slot_outlives_a_client_that_leaves_mid_body(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let streaming = route("stream").prefix("/hold").limit(limit::concurrency(1));
    let proxy = proxy(per_user(&up, streaming, redis)).start().await;
    proxy.wait_ready().await;

    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET /hold HTTP/1.1\r\nHost: app\r\nX-User: mallory\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("first,") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .expect("the first chunk comes")
            .unwrap();
        assert!(
            n > 0,
            "the proxy closed: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..n]);
    }
    drop(stream);
    clients_gone(&proxy).await;
    assert_eq!(
        send(proxy.addr, "/hold", "mallory").await,
        StatusCode::TOO_MANY_REQUESTS,
        "the body is still coming"
    );
    assert_eq!(up.request_count(), 1);

    // The app ends the body: the slot frees.
    up.release.notify_one();
    eventually("the slot frees once the body ended", PATIENCE, async || {
        // A path the route covers, which the app answers at once.
        let status = send(proxy.addr, "/holdfast", "mallory").await;
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}"
        );
        until(status == StatusCode::OK, status)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_outlives_a_client_that_leaves_mid_body_memory() {
    a_slot_outlives_a_client_that_leaves_mid_body(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_outlives_a_client_that_leaves_mid_body_redis() {
    let redis = RedisServer::start();
    a_slot_outlives_a_client_that_leaves_mid_body(Some(&redis)).await;
}

/// Failed logins, 2 an hour per user: clients that hang up before the app's failing answer
/// are charged all the same (the next request is refused and never reaches the app); clients
/// that hang up before a successful answer get their units back, as if they had stayed.
async fn hang_ups_are_settled_on_the_answer(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let login = route("login")
        .prefix("/respond")
        .limit(limit::fixed_window(2, "1h").count_statuses([401]));
    let proxy = proxy(per_user(&up, login, redis)).start().await;
    proxy.wait_ready().await;

    for _ in 0..2 {
        hang_up(
            proxy.addr,
            "/respond?status=401&ms=500",
            "mallory",
            Duration::from_millis(100),
        )
        .await;
    }
    upstream_saw(&up, 2).await;
    // The app answers 500 ms after each request; then the settlements are made. The wait is
    // the scenario (a correct settlement changes nothing visible: the reservations stay);
    // a slow machine only makes the check below come early, where it holds all the same.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        send(proxy.addr, "/respond?status=401", "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        up.request_count(),
        2,
        "the refused request never reached the app"
    );

    // Successes are never counted, hang-up or not.
    for i in 0..4 {
        hang_up(
            proxy.addr,
            "/respond?status=200&ms=300",
            "alice",
            Duration::from_millis(50),
        )
        .await;
        // Each reaches the app: the one before gave its unit back.
        upstream_saw(&up, 3 + i).await;
        // Its unit is back once the app answered (`remaining` counts the next request: 1).
        remaining_to(&proxy, "alice", 1).await;
    }
    assert_eq!(up.request_count(), 6);
    assert_eq!(
        send(proxy.addr, "/respond?status=401", "alice").await,
        StatusCode::UNAUTHORIZED,
        "alice's successes gave their units back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_are_settled_on_the_answer_memory() {
    hang_ups_are_settled_on_the_answer(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_are_settled_on_the_answer_redis() {
    let redis = RedisServer::start();
    hang_ups_are_settled_on_the_answer(Some(&redis)).await;
}

/// An upstream that never answers within `upstream.timeout` counts as failing (504, and the
/// units stay taken), whether the client waits for the 504 or hangs up; an upstream that
/// cannot be reached at all never saw the request, which then counts nothing.
async fn an_unknown_outcome_counts_as_failing(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let login = route("login")
        .prefix("/")
        .limit(limit::fixed_window(2, "1h").count_statuses([401]));
    let proxy = proxy(per_user(&up, login.clone(), redis).upstream_timeout("300ms"))
        .start()
        .await;
    proxy.wait_ready().await;
    assert_eq!(
        send(proxy.addr, "/sleep?ms=3000", "mallory").await,
        StatusCode::GATEWAY_TIMEOUT
    );
    hang_up(
        proxy.addr,
        "/sleep?ms=3000",
        "mallory",
        Duration::from_millis(50),
    )
    .await;
    // The hung-up exchange times out 300 ms after it was sent. The wait is the scenario
    // (upstream_timeout running out; nothing shows it), as in the test above.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        send(proxy.addr, "/respond?status=401", "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(up.request_count(), 2);

    // Nothing listens: 502 every time, never a charge.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = with_store(
        config()
            .upstream(&nowhere)
            .admin("127.0.0.1:0")
            .identity("user", [source::header("x-user")])
            .route(login.key("user")),
        redis,
    );
    let proxy = crate::support::proxy(unreachable).start().await;
    proxy.wait_ready().await;
    for i in 0..4 {
        assert_eq!(
            send(proxy.addr, "/respond?status=401", "bob").await,
            StatusCode::BAD_GATEWAY,
            "request {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_counts_as_failing_memory() {
    an_unknown_outcome_counts_as_failing(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_counts_as_failing_redis() {
    let redis = RedisServer::start();
    an_unknown_outcome_counts_as_failing(Some(&redis)).await;
}

/// A client that cuts its request body off after the app has seen the request: the outcome can
/// never be known, so it counts as failing.
async fn a_request_body_cut_off_counts_as_failing(redis: Option<&RedisServer>) {
    let up = upstream().start().await;
    let login = route("login")
        .prefix("/")
        .limit(limit::fixed_window(1, "1h").count_statuses([401]));
    let proxy = proxy(per_user(&up, login, redis)).start().await;
    proxy.wait_ready().await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: app\r\nX-User: mallory\r\nContent-Length: 1000\r\n\r\n0123456789",
        )
        .await
        .unwrap();
    upstream_saw(&up, 1).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        send(proxy.addr, "/respond?status=401", "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(up.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_cut_off_counts_as_failing_memory() {
    a_request_body_cut_off_counts_as_failing(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_cut_off_counts_as_failing_redis() {
    let redis = RedisServer::start();
    a_request_body_cut_off_counts_as_failing(Some(&redis)).await;
}

/// Graceful shutdown waits for an exchange whose client left (within `shutdown_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_an_exchange_whose_client_left() {
    let up = upstream().start().await;
    let slow = route("slow").prefix("/sleep").limit(limit::concurrency(1));
    let mut proxy = proxy(per_user(&up, slow, None).shutdown_timeout("10s"))
        .start()
        .await;
    proxy.wait_ready().await;
    let sent = Instant::now();
    hang_up(
        proxy.addr,
        "/sleep?ms=1500",
        "mallory",
        Duration::from_millis(100),
    )
    .await;
    upstream_saw(&up, 1).await;
    clients_gone(&proxy).await;
    proxy.shutdown();
    let task = proxy.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("shut down within the timeout")
        .unwrap();
    // timeout under test: the app's 1.5 s answer (a lower bound: a busy machine only makes
    // it later).
    assert!(
        sent.elapsed() >= Duration::from_millis(1400),
        "shutdown did not wait for the app's answer: {:?}",
        sent.elapsed()
    );
}
