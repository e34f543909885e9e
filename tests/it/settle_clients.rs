//! Settled before it can matter, with real clients: a response's settlement (the refund of a
//! status `count_statuses` does not count, the charge or refund of a `cost_from_response`
//! report) is in the store before the client can send a request decided on it.
//!
//! A client that sends its next request as soon as it has read a response (Python's
//! `http.client` on one keep-alive connection, hyper over HTTP/2) must never be refused by a
//! failures-only limit of 1 while every answer succeeds, on every algorithm, in memory, on
//! Redis exact, coalesced and local-first; and each response's `RateLimit` field shows the
//! quota after its own settlement (the unit back). A concurrency limit of 1 never refuses such
//! a client either: its slot is free again before the response's end reaches it. The Python script is
//! `tests/clients/settle_keepalive.py`; python3 missing is a failure, not a skip.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::support::*;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// Requests per path from the keep-alive Python client (count_statuses routes).
const PYTHON_REQUESTS: usize = 1_000;
/// Requests per path for the cost_from_response routes and over HTTP/2.
const MORE_REQUESTS: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Memory,
    Exact,
    Coalesced,
    LocalFirst,
}

/// The app: 200 to everything, reporting a cost of 0 (`x-tokens-used: 0`) in the head, with a
/// body of known length or, for a path containing `stream`, a streamed body (chunked over
/// HTTP/1.1) that ends with the same report as a trailer. Limits that count only 401 ignore
/// the report.
async fn app() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|request: Request<Incoming>| async move {
                    let streamed = request.uri().path().contains("stream");
                    Ok::<_, Infallible>(answer(streamed))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

type AppBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn answer(streamed: bool) -> Response<AppBody> {
    if !streamed {
        return Response::builder()
            .header("x-tokens-used", "0")
            .body(http_body_util::Full::new(Bytes::from_static(b"ok")).boxed())
            .unwrap();
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("x-tokens-used", "0".parse().unwrap());
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"ok"))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::builder()
        .header("x-tokens-used", "0")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap()
}

/// The routes of one mode: `/<algorithm>` with a failures-only limit of 1 a minute, and
/// `/cost-<algorithm>` (`/cost-stream-<algorithm>`) with a budget of 1 a minute charged
/// what the app reports (0: the unit paid up front comes back).
fn routes(mode: Mode) -> Vec<(String, Route)> {
    let sync = |limit: Limit| match mode {
        Mode::LocalFirst => limit.sync("100ms"),
        _ => limit,
    };
    let mut algorithms = vec!["fixed_window", "sliding_window", "token_bucket", "gcra"];
    // sliding_log keeps one entry per request: it cannot be local-first (`check` says so).
    if mode != Mode::LocalFirst {
        algorithms.insert(1, "sliding_log");
    }
    let mut routes = Vec::new();
    for algorithm in &algorithms {
        let failures = limit::new(algorithm, 1, "60s")
            .count_statuses([401])
            .name(algorithm);
        routes.push((
            format!("/{algorithm}"),
            route(algorithm).limit(sync(failures)),
        ));
    }
    // A concurrency slot is released before the response's end reaches the client.
    let concurrency = limit::concurrency(1).name("concurrency");
    routes.push((
        "/concurrency".to_string(),
        route("concurrency").limit(match mode {
            // Never local-first (`check` says so): decided exactly on the same Redis.
            Mode::LocalFirst => concurrency.sync("exact"),
            _ => concurrency,
        }),
    ));
    for algorithm in algorithms.iter().filter(|a| **a != "sliding_log") {
        for how in ["cost", "cost-stream"] {
            let budget = limit::new(algorithm, 1, "60s")
                .cost_from_response("x-tokens-used")
                .name(algorithm);
            let name = format!("{how}-{algorithm}");
            routes.push((format!("/{name}"), route(&name).limit(sync(budget))));
        }
    }
    routes
        .into_iter()
        .map(|(path, route)| (path.clone(), route.prefix(&path).key("user")))
        .collect()
}

/// tollgate in `mode` in front of `app`, with `routes(mode)`.
async fn tollgate(mode: Mode, app: &str, redis: Option<&RedisServer>) -> ProxyHandle {
    let mut config = config()
        .upstream(app)
        .admin("127.0.0.1:0")
        .identity("user", [source::header("x-user")])
        .routes(routes(mode).into_iter().map(|(_, route)| route));
    if let Some(redis) = redis {
        let store = store::redis(&redis.url()).timeout("1s").on_error("deny");
        config = config.store(match mode {
            Mode::Coalesced => store.coalesce(),
            _ => store,
        });
    }
    let proxy = proxy(config).start().await;
    proxy.wait_ready().await;
    proxy
}

/// What the Python client saw on one path.
#[derive(Debug)]
struct Seen {
    path: String,
    statuses: BTreeMap<String, u64>,
    first_refused: Option<u64>,
    ratelimit: BTreeMap<String, u64>,
    connections: u64,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/settle_keepalive.py")
}

/// Runs the Python client against `addr`: `count` requests on each of `paths`, one keep-alive
/// connection per path.
async fn python(addr: SocketAddr, count: usize, paths: Vec<String>) -> Vec<Seen> {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script())
            .arg(addr.port().to_string())
            .arg(count.to_string())
            .args(&paths)
            .output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| {
        panic!("python3 is needed for this test (Python's http.client is the client under test) and could not be run: {e}")
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the Python client failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let counts = |field: &str| -> BTreeMap<String, u64> {
                v[field]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
                    .collect()
            };
            Seen {
                path: v["path"].as_str().unwrap().to_string(),
                statuses: counts("statuses"),
                first_refused: v["first_refused"].as_u64(),
                ratelimit: counts("ratelimit"),
                connections: v["connections"].as_u64().unwrap(),
            }
        })
        .collect()
}

/// Whether `path` is one of the failures-only routes.
fn counts_statuses(path: &str) -> bool {
    !path.starts_with("/cost") && path != "/concurrency"
}

/// The RateLimit field of a success on a failures-only limit of 1 once its unit is back: the
/// whole quota remains and nothing is to reset.
fn full_quota(path: &str) -> String {
    format!("\"{}\";r=1;t=0", path.trim_start_matches('/'))
}

/// Every request of `seen` succeeded on one connection; a count_statuses route's fields all
/// show the unit back.
fn assert_never_refused(mode: Mode, seen: &[Seen], paths: &[String], count: u64) {
    assert_eq!(seen.len(), paths.len(), "{mode:?}: {seen:?}");
    for s in seen {
        let ok = BTreeMap::from([("200".to_string(), count)]);
        assert_eq!(
            s.statuses, ok,
            "{mode:?} {}: refused from request {:?} on ({s:?})",
            s.path, s.first_refused
        );
        assert_eq!(s.connections, 1, "{mode:?} {}: kept alive", s.path);
        if counts_statuses(&s.path) {
            let fields = BTreeMap::from([(full_quota(&s.path), count)]);
            assert_eq!(s.ratelimit, fields, "{mode:?} {}", s.path);
        }
    }
}

/// `count` requests back to back over one HTTP/2 connection (hyper), each sent once the
/// previous response's body has ended: every one succeeds, and the count_statuses fields show
/// the unit back.
async fn over_http2(mode: Mode, addr: SocketAddr, path: &str, count: usize) {
    let client = h2c_client();
    for i in 0..count {
        let request = Request::get(format!("http://{addr}{path}"))
            .header("x-user", "h2-client")
            .header("te", "trailers")
            .body(body(""))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let status = response.status();
        let field = response
            .headers()
            .get("ratelimit")
            .map(|v| v.to_str().unwrap().to_string());
        response.into_body().collect().await.unwrap();
        assert_eq!(status, 200, "{mode:?} {path} over HTTP/2: request {i}");
        if counts_statuses(path) {
            assert_eq!(
                field,
                Some(full_quota(path)),
                "{mode:?} {path}: request {i}"
            );
        }
    }
}

async fn never_refused(mode: Mode) {
    let app = app().await;
    let redis = (mode != Mode::Memory).then(RedisServer::start);
    let proxy = tollgate(mode, &app, redis.as_ref()).await;
    let paths: Vec<String> = routes(mode).into_iter().map(|(path, _)| path).collect();
    let (failures, costs): (Vec<String>, Vec<String>) =
        paths.into_iter().partition(|p| !p.starts_with("/cost"));

    let seen = python(proxy.addr, PYTHON_REQUESTS, failures.clone()).await;
    assert_never_refused(mode, &seen, &failures, PYTHON_REQUESTS as u64);
    let seen = python(proxy.addr, MORE_REQUESTS, costs.clone()).await;
    assert_never_refused(mode, &seen, &costs, MORE_REQUESTS as u64);
    for path in failures.iter().chain(&costs) {
        over_http2(mode, proxy.addr, path, MORE_REQUESTS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_keep_alive_is_never_refused_by_failures_only_limits_memory() {
    never_refused(Mode::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_keep_alive_is_never_refused_by_failures_only_limits_redis_exact() {
    never_refused(Mode::Exact).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_keep_alive_is_never_refused_by_failures_only_limits_coalesced() {
    never_refused(Mode::Coalesced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_keep_alive_is_never_refused_by_failures_only_limits_local_first() {
    never_refused(Mode::LocalFirst).await;
}

/// The count of the fixed_window state the route's limit keeps in `redis` (its only key).
async fn window_count(redis: &RedisServer) -> u64 {
    let mut client = redis.client().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut client)
        .await
        .unwrap();
    let mut counts = Vec::new();
    let mut seen = Vec::new();
    for key in keys {
        let value: Option<String> = ::redis::cmd("GET")
            .arg(&key)
            .query_async(&mut client)
            .await
            .unwrap_or(None);
        seen.push((key.clone(), value.clone()));
        if let Some(count) = value.as_deref().and_then(|v| v.strip_prefix("1 ")) {
            counts.push(count.split(' ').nth(1).unwrap().parse::<u64>().unwrap());
        }
    }
    assert_eq!(counts.len(), 1, "one fixed_window state: {seen:?}");
    counts[0]
}

/// Holds Redis's writes (scripts included) for a second: a settlement sent now lands then.
async fn hold_writes(redis: &RedisServer) {
    let mut client = redis.client().await;
    let _: () = ::redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .arg("WRITE")
        .query_async(&mut client)
        .await
        .unwrap();
}

/// The store holds a response's settlement by the time the client has the part of the
/// response it follows (the head for count_statuses, the end for cost_from_response), even
/// when Redis is slow to apply it: Redis's writes are held while the app answers, and the
/// state in Redis, read as soon as the client has that part, already shows the unit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_has_the_settlement_when_the_client_has_the_response() {
    let redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = |route: Route| {
        config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .identity("user", [source::header("x-user")])
            // `deny`: ready only once Redis is, so every decision below is Redis's.
            .store(store::redis(&redis.url()).timeout("5s").on_error("deny"))
            .route(route.prefix("/respond").key("user"))
    };
    let send = |addr: SocketAddr, path: &str| {
        let request = Request::get(format!("http://{addr}{path}"))
            .header("x-user", "u")
            .body(body(""))
            .unwrap();
        http1_client().request(request)
    };

    // count_statuses: settled before the head.
    let failures = route("login").limit(
        limit::fixed_window(1, "1h")
            .count_statuses([401])
            .name("logins"),
    );
    let mut first = proxy(yaml(failures)).start().await;
    first.wait_ready().await;
    let answer = tokio::spawn(send(first.addr, "/respond?status=200&ms=300"));
    // Decided (the app has the request): the refund will meet held writes.
    while up.request_count() < 1 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    hold_writes(&redis).await;
    let response = answer.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        window_count(&redis).await,
        0,
        "the head came before the refund"
    );
    assert_eq!(response.headers()["ratelimit"], "\"logins\";r=1;t=0");
    response.into_body().collect().await.unwrap();
    first.shutdown();
    let _ = first.task.take().unwrap().await;
    let _: () = ::redis::cmd("FLUSHALL")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();

    // cost_from_response: settled before the body's end.
    let budget =
        route("llm").limit(limit::fixed_window(1, "1h").cost_from_response("x-tokens-used"));
    let proxy = proxy(yaml(budget)).start().await;
    proxy.wait_ready().await;
    let response = send(proxy.addr, "/respond?cost=0&hold=1").await.unwrap();
    let mut answer = response.into_body();
    assert!(answer.frame().await.unwrap().unwrap().is_data());
    assert_eq!(window_count(&redis).await, 1, "the unit paid up front");
    hold_writes(&redis).await;
    up.release.notify_one();
    answer.collect().await.unwrap();
    assert_eq!(
        window_count(&redis).await,
        0,
        "the end came before the refund"
    );
}

/// A decision that timed out (the request went on by `on_error: allow`) still runs in Redis
/// once Redis gets to it, and takes its unit: that unit is given back, or a failures-only
/// limit of 1 would refuse a caller whose requests all succeeded until the window ends.
/// Redis's writes are held for a second while a request is decided with a 100 ms timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_timed_out_gives_back_what_it_took() {
    for coalesce in [false, true] {
        let redis = RedisServer::start();
        let up = upstream().start().await;
        let mut store = store::redis(&redis.url())
            .timeout("100ms")
            .on_error("allow");
        if coalesce {
            store = store.coalesce();
        }
        let yaml = config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .identity("user", [source::header("x-user")])
            .store(store)
            .route(
                route("login").prefix("/respond").key("user").limit(
                    limit::fixed_window(1, "1h")
                        .count_statuses([401])
                        .name("logins"),
                ),
            );
        let proxy = proxy(yaml).start().await;
        proxy.wait_ready().await;
        let client = http1_client();
        let send = || {
            let request = Request::get(format!("http://{}/respond?status=200", proxy.addr))
                .header("x-user", "u")
                .body(body(""))
                .unwrap();
            client.request(request)
        };
        // Decided by Redis (a fail-open admission carries no RateLimit field).
        let decided_by_redis = || async {
            for _ in 0..200 {
                let response = send().await.unwrap();
                assert_eq!(response.status(), 200, "coalesce {coalesce}");
                if let Some(field) = response.headers().get("ratelimit") {
                    return field.to_str().unwrap().to_owned();
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            panic!("coalesce {coalesce}: Redis never decided a request");
        };
        assert_eq!(decided_by_redis().await, "\"logins\";r=1;t=0");

        let held_at = std::time::Instant::now();
        hold_writes(&redis).await;
        let response = send().await.unwrap();
        assert_eq!(
            response.status(),
            200,
            "coalesce {coalesce}: on_error allow"
        );
        // The held decision runs when the writes resume (after a second); its unit comes
        // back right after.
        tokio::time::sleep_until((held_at + std::time::Duration::from_millis(1_100)).into()).await;
        let mut count = 1;
        for _ in 0..100 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            count = window_count(&redis).await;
            if count == 0 {
                break;
            }
        }
        assert_eq!(
            count, 0,
            "coalesce {coalesce}: the timed-out decision's unit stays taken"
        );
        assert_eq!(decided_by_redis().await, "\"logins\";r=1;t=0");
        for i in 0..20 {
            let response = send().await.unwrap();
            assert_eq!(response.status(), 200, "coalesce {coalesce}: request {i}");
        }
    }
}
