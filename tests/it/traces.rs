//! Traces (issue 41) against a real OTLP receiver (tests/clients/otlp_receiver.py: grpcio for
//! gRPC, http.server decoding `ExportTraceServiceRequest` for HTTP/protobuf), started by the
//! test: the server span continues the caller's trace, the Redis decision and the upstream
//! exchange are its children, the upstream's `traceparent` names tollgate's client span, a
//! limited request carries its decision and limit, unsampled callers export nothing, a dead
//! or silent collector changes no answer, a full queue counts its drops, JSON logs carry the
//! ids and shutdown flushes what is queued.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SERVER: i64 = 2;
const CLIENT: i64 = 3;

/// The receiver process and the spans it printed so far.
struct Receiver {
    child: Child,
    grpc: u16,
    http: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        Receiver::answering_after(0.0)
    }

    /// A receiver that answers each export `delay` seconds after it arrived.
    fn answering_after(delay: f64) -> Receiver {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let python = root.join("tests/clients/.venv-otlp/bin/python");
        assert!(
            python.exists(),
            "{} is missing: tests/run.sh creates it (python3 -m venv, then pip install grpcio protobuf opentelemetry-proto)",
            python.display()
        );
        let mut child = Command::new(&python)
            .arg(root.join("tests/clients/otlp_receiver.py"))
            .args(["--delay", &delay.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the OTLP receiver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().expect("the receiver printed nothing").unwrap();
        let ports: Vec<u16> = ready
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("not a ready line: {ready}"))
            .split(' ')
            .map(|p| p.parse().unwrap())
            .collect();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let span: Value = serde_json::from_str(&line).expect("a JSON span");
                sink.lock().unwrap().push(span);
            }
        });
        Receiver {
            child,
            grpc: ports[0],
            http: ports[1],
            spans,
        }
    }

    fn endpoint(&self, protocol: &str) -> String {
        match protocol {
            "grpc" => format!("http://127.0.0.1:{}", self.grpc),
            _ => format!("http://127.0.0.1:{}", self.http),
        }
    }

    /// The spans of `trace`, once `count` of them arrived (at most `PATIENCE`).
    async fn trace(&self, trace: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let found: Vec<Value> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s["trace_id"] == trace)
                .cloned()
                .collect();
            if found.len() >= count || Instant::now() > deadline {
                assert_eq!(found.len(), count, "spans of {trace}: {found:#?}");
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn all(&self) -> Vec<Value> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `tracing` section, and the test client's address as a trusted proxy: only a trusted
/// peer's trace context is followed (`caller_context: trusted_proxies`, the default).
fn tracing_section(endpoint: &str, protocol: &str, extra: &str) -> String {
    format!(
        "tracing:\n  endpoint: {endpoint}\n  protocol: {protocol}\n  service_name: edge-test\n  resource: {{ deployment.environment: test }}\n  interval: 50ms\n{extra}{TRUSTED_CLIENT}"
    )
}

const TRUSTED_CLIENT: &str = "client_ip: { trusted_proxies: [127.0.0.1/32] }\n";

/// The `tracing` section alone: the test client is an untrusted peer.
fn untrusted_tracing_section(endpoint: &str, extra: &str) -> String {
    tracing_section(endpoint, "grpc", extra).replace(TRUSTED_CLIENT, "")
}

fn traceparent(trace: &str, span: &str, flags: &str) -> String {
    format!("00-{trace}-{span}-{flags}")
}

fn by_kind<'a>(spans: &'a [Value], kind: i64, name: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["kind"] == kind && s["name"].as_str().unwrap().starts_with(name))
        .collect()
}

async fn send(proxy: &ProxyHandle, path: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let (status, _, text) = exchange("GET", &proxy.url(path), headers).await;
    (status, text)
}

async fn metrics(proxy: &ProxyHandle) -> String {
    let admin = proxy.admin.expect("an admin listener");
    let response = http1_client()
        .request(get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    text(response).await
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}")) as u64
}

/// The spans `proxy` counted so far: (exported, dropped from a full queue, lost in a failed
/// export).
async fn span_counts(proxy: &ProxyHandle) -> (u64, u64, u64) {
    let text = metrics(proxy).await;
    let dropped = |reason: &str| {
        metric(
            &text,
            &format!("tollgate_trace_spans_dropped_total{{reason=\"{reason}\"}}"),
        )
    };
    (
        metric(&text, "tollgate_trace_spans_exported_total"),
        dropped("queue_full"),
        dropped("export_failed"),
    )
}

/// Over gRPC and HTTP/protobuf: an admitted then a limited request of the caller's trace,
/// each a server span whose parent is the caller's span, with a Redis span and (admitted) an
/// upstream client span beneath it; the upstream's `traceparent` names that client span.
#[tokio::test]
async fn spans_continue_the_callers_trace_with_the_decision_on_them() {
    let receiver = Receiver::start();
    let redis = RedisServer::start();
    let app = upstream().start().await;
    for protocol in ["grpc", "http/protobuf"] {
        let yaml = config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            // on_error deny: ready only once Redis is connected.
            .store(
                store::redis(&redis.url())
                    .key_prefix(&format!("t{}:", protocol.len()))
                    .on_error("deny"),
            )
            .identity("client", [source::header("x-api-key")])
            .route(
                route("api")
                    .prefix("/api/")
                    .key("client")
                    .limit(limit::fixed_window(1, "1m").name("per-minute")),
            )
            .raw(&tracing_section(&receiver.endpoint(protocol), protocol, ""))
            .yaml();
        let proxy = proxy(yaml).start().await;
        proxy.wait_ready().await;
        let trace = if protocol == "grpc" {
            CALLER_TRACE.to_owned()
        } else {
            CALLER_TRACE.replace("4bf9", "5bf9")
        };
        let parent = traceparent(&trace, CALLER_SPAN, "01");
        let headers = [
            ("traceparent", parent.as_str()),
            ("tracestate", "vendor=opaque"),
            ("x-api-key", "secret-key-value"),
        ];
        let (status, echo) = send(&proxy, "/api/items", &headers).await;
        assert_eq!(status, StatusCode::OK, "{protocol}");
        let (status, _) = send(&proxy, "/api/items", &headers).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{protocol}");

        // Two server spans, two Redis spans, one upstream span.
        let spans = receiver.trace(&trace, 5).await;
        let via = if protocol == "grpc" { "grpc" } else { "http" };
        assert!(spans.iter().all(|s| s["via"] == via), "{spans:#?}");
        let servers = by_kind(&spans, SERVER, "GET api");
        assert_eq!(servers.len(), 2, "{spans:#?}");
        let status_of = |s: &Value| s["attributes"]["http.response.status_code"].as_i64();
        let admitted = *servers.iter().find(|s| status_of(s) == Some(200)).unwrap();
        let limited = *servers.iter().find(|s| status_of(s) == Some(429)).unwrap();
        for server in [admitted, limited] {
            assert_eq!(server["parent_span_id"], CALLER_SPAN, "{server:#}");
            let a = &server["attributes"];
            assert_eq!(a["http.request.method"], "GET");
            assert_eq!(a["http.route"], "api");
            assert_eq!(a["url.path"], "/api/items");
            assert_eq!(a["client.address"], "127.0.0.1");
            assert_eq!(a["network.protocol.version"], "1.1");
            assert_eq!(a["tollgate.key_source"], "header");
            assert_eq!(a["tollgate.store"], "redis");
            // A 429 is the caller's doing: no error on tollgate's span.
            assert_eq!(server["status"], 0, "{server:#}");
            assert_eq!(server["resource"]["service.name"], "edge-test");
            assert_eq!(server["resource"]["deployment.environment"], "test");
        }
        assert_eq!(admitted["attributes"]["tollgate.decision"], "admitted");
        assert_eq!(admitted["attributes"]["tollgate.limit"], Value::Null);
        let a = &limited["attributes"];
        assert_eq!(a["tollgate.decision"], "limited");
        assert_eq!(a["tollgate.limit"], "per-minute");
        let retry = a["tollgate.retry_after"].as_i64().unwrap();
        assert!((1..=60).contains(&retry), "retry_after {retry}");
        // The credential's value is nowhere in what was exported.
        assert!(!serde_json::to_string(&spans)
            .unwrap()
            .contains("secret-key-value"));

        let redis_spans = by_kind(&spans, CLIENT, "EVALSHA");
        assert_eq!(redis_spans.len(), 2, "{spans:#?}");
        for span in &redis_spans {
            let a = &span["attributes"];
            assert_eq!(a["db.system"], "redis");
            assert_eq!(a["server.address"], "127.0.0.1");
            assert_eq!(a["server.port"], i64::from(redis.port()));
            assert_eq!(a["tollgate.script"], "decide.lua");
        }
        let redis_parents: Vec<&Value> = redis_spans.iter().map(|s| &s["parent_span_id"]).collect();
        assert!(
            redis_parents.contains(&&admitted["span_id"])
                && redis_parents.contains(&&limited["span_id"])
        );

        let upstream_spans = by_kind(&spans, CLIENT, "GET");
        let upstream_spans: Vec<&&Value> = upstream_spans
            .iter()
            .filter(|s| s["name"] == "GET")
            .collect();
        assert_eq!(upstream_spans.len(), 1, "{spans:#?}");
        let client = upstream_spans[0];
        assert_eq!(client["parent_span_id"], admitted["span_id"]);
        assert_eq!(client["attributes"]["http.response.status_code"], 200);

        // The upstream saw tollgate's client span as its parent, sampled, with the caller's
        // tracestate.
        let echo: Value = serde_json::from_str(&echo).unwrap();
        let forwarded = echo["headers"]["traceparent"][0].as_str().unwrap();
        let client_span = client["span_id"].as_str().unwrap();
        assert_eq!(forwarded, traceparent(&trace, client_span, "01"));
        assert_eq!(echo["headers"]["tracestate"][0], "vendor=opaque");

        // Counted once the receiver's answer is back (it prints before it answers).
        eventually("5 spans exported", PATIENCE, async || {
            let (exported, full, _) = span_counts(&proxy).await;
            assert_eq!(full, 0);
            assert!(exported <= 5, "exported {exported}");
            until(exported == 5, exported)
        })
        .await;
    }
}

/// A caller whose `traceparent` says "not sampled" (flags 00) exports nothing, and its
/// `traceparent` reaches the upstream untouched. Without a `traceparent`, at ratio 1 a root
/// trace starts.
#[tokio::test]
async fn unsampled_callers_export_no_spans() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .admin("127.0.0.1:0")
        .raw(&tracing_section(
            &receiver.endpoint("grpc"),
            "grpc",
            "  sample_ratio: 1\n",
        ))
        .yaml();
    let proxy = proxy(yaml).start().await;
    let unsampled = CALLER_TRACE.replace("4bf9", "0000");
    let (status, echo) = send(
        &proxy,
        "/x",
        &[("traceparent", &traceparent(&unsampled, CALLER_SPAN, "00"))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let echo: Value = serde_json::from_str(&echo).unwrap();
    assert_eq!(
        echo["headers"]["traceparent"][0],
        traceparent(&unsampled, CALLER_SPAN, "00"),
        "passed on untouched"
    );
    // A root request afterwards: once its spans are in, the unsampled one's would be too.
    let (_, echo) = send(&proxy, "/x", &[]).await;
    let echo: Value = serde_json::from_str(&echo).unwrap();
    let root = echo["headers"]["traceparent"][0].as_str().unwrap();
    let root_trace = root.split('-').nth(1).unwrap().to_owned();
    assert!(root.ends_with("-01"), "{root}");
    let spans = receiver.trace(&root_trace, 2).await;
    let server = by_kind(&spans, SERVER, "GET")[0];
    assert_eq!(server["parent_span_id"], "", "a root span: {server:#}");
    assert!(
        receiver
            .all()
            .iter()
            .all(|s| s["trace_id"] != unsampled.as_str()),
        "{:#?}",
        receiver.all()
    );
}

/// A collector that refuses connections, and one that accepts and never answers, change no
/// answer: every request is served as without traces; the lost spans are counted (export
/// failed, or dropped from a full queue while the one export in flight waits).
#[tokio::test]
async fn a_dead_or_silent_collector_changes_no_answer_and_drops_are_counted() {
    let app = upstream().start().await;
    // Refused: a port nothing listens on.
    let refused = format!("http://127.0.0.1:{}", free_port());
    // Silent: accepts, reads nothing, answers nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = silent.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    for (endpoint, protocol, extra) in [
        (refused.as_str(), "grpc", "  timeout: 500ms\n"),
        (
            silent_url.as_str(),
            "http/protobuf",
            "  timeout: 30s\n  queue_size: 4\n  batch_size: 4\n",
        ),
    ] {
        let yaml = config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            .raw(&tracing_section(endpoint, protocol, extra))
            .yaml();
        let proxy = proxy(yaml).start().await;
        for i in 0..30 {
            let (status, echo) = send(&proxy, &format!("/item/{i}"), &[]).await;
            assert_eq!(status, StatusCode::OK, "{protocol}");
            let echo: Value = serde_json::from_str(&echo).unwrap();
            assert_eq!(echo["uri"], format!("/item/{i}"));
        }
        // 30 requests, each a server and an upstream span: 60 spans, none exported.
        eventually(
            &format!("{protocol}: spans counted"),
            PATIENCE,
            async || {
                let (exported, full, failed) = span_counts(&proxy).await;
                assert_eq!(exported, 0);
                let settled = match protocol {
                    // Every batch fails at once: all 60 are counted as failed.
                    "grpc" => full + failed == 60 && failed > 0,
                    // One batch of 4 waits on the silent collector, 4 more wait in the queue:
                    // the other 52 found it full.
                    _ => full == 52 && failed == 0,
                };
                until(
                    settled,
                    format!("queue_full {full}, export_failed {failed}"),
                )
            },
        )
        .await;
    }
}

/// tollgate's binary on a free port with `yaml` (its `listen` set here), JSON logs and `env`;
/// returns once it answers, with the first answer's status to a GET of `path` with `headers`.
async fn binary(
    yaml: crate::support::Config,
    env: &[(&str, &str)],
    path: &str,
    headers: &[(&str, &str)],
) -> (Child, u16, tempfile::TempDir, StatusCode) {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, yaml.listen(&format!("127.0.0.1:{port}")).yaml()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--config", file.to_str().unwrap(), "--log-format", "json"])
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let mut request = Request::get(format!("http://127.0.0.1:{port}{path}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Ok(response) = http1_client()
            .request(request.body(body("")).unwrap())
            .await
        {
            break response.status();
        }
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "tollgate did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (child, port, dir, status)
}

/// A sampled GET of `url` in `trace` answered 200 whose first body chunk is `first`; the rest
/// of the body, still to come.
async fn first_chunk_of_sampled(url: &str, trace: &str, first: &[u8]) -> hyper::body::Incoming {
    let request = Request::get(url)
        .header("traceparent", traceparent(trace, CALLER_SPAN, "01"))
        .body(body(""))
        .unwrap();
    let response = http1_client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut incoming = response.into_body();
    let chunk = incoming
        .frame()
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(&chunk[..], first);
    incoming
}

/// The log lines whose message starts with `start`.
fn lines_starting<'a>(lines: &'a [Value], start: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with(start)))
        .collect()
}

/// SIGTERM to `child`; its JSON log lines once it exited (successfully).
async fn stop(child: Child) -> Vec<Value> {
    let (status, stderr) = stop_with_status(child).await;
    assert!(status.success(), "{stderr}");
    stderr
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect()
}

/// The binary with no `tracing` section, export turned on by the environment alone: JSON
/// access-log lines carry the request's trace and span ids, and SIGTERM flushes the spans
/// still queued (the batch interval, 5 s by default, has not passed).
#[tokio::test]
async fn the_environment_alone_exports_logs_carry_ids_and_shutdown_flushes() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let trace = CALLER_TRACE.replace("4bf9", "6bf9");
    let parent = traceparent(&trace, CALLER_SPAN, "01");
    let endpoint = receiver.endpoint("http");
    let (child, _, _dir, status) = binary(
        config()
            .upstream(&app.url())
            .shutdown_timeout("5s")
            .trusted_proxies(["127.0.0.1/32"]),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "from-env"),
            ("OTEL_RESOURCE_ATTRIBUTES", "team=edge"),
        ],
        "/logged",
        &[("traceparent", &parent)],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(receiver.all().is_empty(), "exported before the interval");
    let lines = stop(child).await;
    // Exported at shutdown, before the process exited.
    let spans = receiver.trace(&trace, 2).await;
    let server = by_kind(&spans, SERVER, "GET")[0];
    assert_eq!(server["parent_span_id"], CALLER_SPAN);
    assert_eq!(server["resource"]["service.name"], "from-env");
    assert_eq!(server["resource"]["team"], "edge");
    let access = lines
        .iter()
        .find(|l| l["target"] == "tollgate::access")
        .unwrap_or_else(|| panic!("no access line in {lines:#?}"));
    assert_eq!(access["trace_id"], trace.as_str(), "{access}");
    assert_eq!(access["span_id"], server["span_id"], "{access}");
}

/// Every line logged while a sampled request is handled carries its trace and span ids (in
/// `span`), not only the access line: here the line a shadow limit logs for the request it
/// would have refused. An unsampled request's lines carry none.
#[tokio::test]
async fn lines_logged_in_a_request_carry_its_ids() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .route(
            route("api")
                .prefix("/api/")
                .limit(limit::fixed_window(1, "1h").name("shadowed").shadow()),
        )
        .raw(&tracing_section(&receiver.endpoint("grpc"), "grpc", ""));
    let trace = CALLER_TRACE.replace("4bf9", "9bf9");
    let unsampled = CALLER_TRACE.replace("4bf9", "9bf8");
    // The first request is within the limit, the second over it (forwarded: shadow), the
    // third, unsampled, over it too.
    let (child, port, _dir, status) = binary(yaml, &[], "/api/first", &[]).await;
    assert_eq!(status, StatusCode::OK);
    for (path, parent) in [
        ("/api/second", traceparent(&trace, CALLER_SPAN, "01")),
        ("/api/third", traceparent(&unsampled, CALLER_SPAN, "00")),
    ] {
        let request = Request::get(format!("http://127.0.0.1:{port}{path}"))
            .header("traceparent", parent)
            .body(body(""))
            .unwrap();
        let response = http1_client().request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let lines = stop(child).await;
    let spans = receiver.trace(&trace, 2).await;
    let server = by_kind(&spans, SERVER, "GET")[0];
    let shadow = lines_starting(&lines, "shadow limit exceeded");
    assert_eq!(shadow.len(), 2, "{lines:#?}");
    assert_eq!(
        shadow[0]["span"]["trace_id"],
        trace.as_str(),
        "{:#}",
        shadow[0]
    );
    assert_eq!(
        shadow[0]["span"]["span_id"], server["span_id"],
        "{:#}",
        shadow[0]
    );
    assert_eq!(shadow[1].get("span"), None, "unsampled: {:#}", shadow[1]);
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "tollgate::access")
        .collect();
    assert_eq!(access.len(), 3, "{lines:#?}");
    assert_eq!(access[1]["trace_id"], trace.as_str());
    assert_eq!(access[1]["span"]["trace_id"], trace.as_str());
    assert_eq!(access[2].get("trace_id"), None, "{:#}", access[2]);
}

/// A line logged while the body streams, after the head went out, carries the request's ids
/// too: here the settlement of a response cost at the body's end, which fails because Redis
/// froze while the body was held.
#[tokio::test]
async fn lines_logged_while_the_body_streams_carry_its_ids() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let redis = RedisServer::start();
    let yaml = config()
        .upstream(&app.url())
        .store(store::redis(&redis.url()).timeout("200ms"))
        .route(
            route("llm").prefix("/respond").limit(
                limit::token_bucket(100, "1m")
                    .burst(100)
                    .cost_from_response("X-Tokens-Used"),
            ),
        )
        .raw(&tracing_section(&receiver.endpoint("grpc"), "grpc", ""));
    let admin = free_port();
    let yaml = yaml.admin(&format!("127.0.0.1:{admin}"));
    let (child, port, _dir, _) = binary(yaml, &[], "/healthz-none", &[]).await;
    // Redis connects in the background: until then the request would be decided by
    // `on_error`, with nothing to settle. `/readyz` says a bare `ready` once it is connected.
    let ready = format!("http://127.0.0.1:{admin}/readyz");
    eventually("the store connected", PATIENCE, async || {
        let (status, _, text) = exchange("GET", &ready, &[]).await;
        until(
            status == StatusCode::OK && text == "ready\n",
            (status, text),
        )
    })
    .await;
    let trace = CALLER_TRACE.replace("4bf9", "7bf9");
    let url = format!("http://127.0.0.1:{port}/respond?cost=20&hold=1");
    let incoming = first_chunk_of_sampled(&url, &trace, b"status 200").await;
    // The head and first chunk are out; the settlement runs at the body's end, against a
    // frozen Redis.
    redis.pause();
    app.release.notify_one();
    incoming.collect().await.unwrap();
    redis.resume();
    let lines = stop(child).await;
    let failed = lines_starting(&lines, "could not settle a limit");
    assert_eq!(failed.len(), 1, "{lines:#?}");
    assert_eq!(
        failed[0]["span"]["trace_id"],
        trace.as_str(),
        "{:#}",
        failed[0]
    );
}

/// The server span and the upstream's client span end when the response body has gone out
/// whole, not when its head did: an upstream that holds its body between two chunks has that
/// time inside both spans.
#[tokio::test]
async fn the_spans_end_with_the_body_not_the_head() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .raw(&tracing_section(&receiver.endpoint("grpc"), "grpc", ""))
        .yaml();
    let proxy = proxy(yaml).start().await;
    let trace = CALLER_TRACE.replace("4bf9", "8bf9");
    let incoming = first_chunk_of_sampled(&proxy.url("/hold"), &trace, b"first,").await;
    // The first chunk is here: the rest comes once released, 300 ms on (the hold is the
    // scenario; the spans must contain it, however long it really was).
    let held = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held_for = held.elapsed();
    app.release.notify_one();
    let rest = incoming.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"last");

    let spans = receiver.trace(&trace, 2).await;
    let nanos = |s: &Value, field: &str| s[field].as_u64().unwrap();
    let duration = |s: &Value| Duration::from_nanos(nanos(s, "end") - nanos(s, "start"));
    let server = by_kind(&spans, SERVER, "GET")[0];
    let client = by_kind(&spans, CLIENT, "GET")[0];
    assert!(
        duration(server) >= held_for && duration(client) >= held_for,
        "server span {:?}, client span {:?}, body held {held_for:?}",
        duration(server),
        duration(client)
    );
    assert!(nanos(client, "end") <= nanos(server, "end"));
    assert_eq!(server["attributes"]["http.response.status_code"], 200);
    assert_eq!(server["attributes"].get("tollgate.client_closed"), None);
    assert_eq!(client["attributes"]["http.response.status_code"], 200);
}

/// The Redis span times the store's call alone: a request that waits in the delay queue
/// (`on_limit: delay`) before its second decision has a server span of the wait, and its last
/// Redis span inside it, far shorter than the wait.
#[tokio::test]
async fn the_redis_span_times_the_store_call_not_the_delay_queue() {
    let receiver = Receiver::start();
    let redis = RedisServer::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .admin("127.0.0.1:0")
        .store(store::redis(&redis.url()).on_error("deny"))
        .identity("client", [source::header("x-api-key")])
        .route(
            route("api")
                .prefix("/api/")
                .key("client")
                // One request every 500 ms: the second right after the first waits ~500 ms.
                .limit(limit::gcra(2, "1s").burst(1).delay("2s").name("paced")),
        )
        .raw(&tracing_section(&receiver.endpoint("grpc"), "grpc", ""))
        .yaml();
    let proxy = proxy(yaml).start().await;
    proxy.wait_ready().await;
    let trace = CALLER_TRACE.replace("4bf9", "7bf9");
    let parent = traceparent(&trace, CALLER_SPAN, "01");
    let headers = [("traceparent", parent.as_str()), ("x-api-key", "k")];
    let (status, _) = send(&proxy, "/api/a", &headers).await;
    assert_eq!(status, StatusCode::OK);
    let waited = Instant::now();
    let (status, _) = send(&proxy, "/api/b", &headers).await;
    assert_eq!(status, StatusCode::OK);
    // timeout under test: the limit's 500 ms pacing (a lower bound: a busy machine only makes
    // it later).
    assert!(
        waited.elapsed() >= Duration::from_millis(300),
        "the second request was not delayed: {:?}",
        waited.elapsed()
    );

    // Two server spans, two Redis spans (the delayed request's is its last call, after the
    // wait) and two upstream spans.
    let spans = receiver.trace(&trace, 6).await;
    let nanos = |s: &Value, field: &str| s[field].as_u64().unwrap();
    let servers = by_kind(&spans, SERVER, "GET api");
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let delayed = *servers
        .iter()
        .max_by_key(|s| nanos(s, "end") - nanos(s, "start"))
        .unwrap();
    let delayed_for = nanos(delayed, "end") - nanos(delayed, "start");
    assert!(delayed_for >= 300_000_000, "server span {delayed_for} ns");
    let redis_spans: Vec<&Value> = by_kind(&spans, CLIENT, "EVALSHA")
        .into_iter()
        .filter(|s| s["parent_span_id"] == delayed["span_id"])
        .collect();
    assert_eq!(redis_spans.len(), 1, "{spans:#?}");
    for span in redis_spans {
        let (start, end) = (nanos(span, "start"), nanos(span, "end"));
        assert!(
            nanos(delayed, "start") <= start && start <= end && end <= nanos(delayed, "end"),
            "{span:#} not within {delayed:#}"
        );
        // A round trip to a local Redis, not the ~500 ms wait around it.
        assert!(
            end - start < delayed_for / 4,
            "Redis span {} ns",
            end - start
        );
        assert_eq!(span["attributes"]["server.port"], i64::from(redis.port()));
    }
}

/// A caller without `traceparent` that sends B3, single (`b3`) or multiple (`X-B3-*`)
/// headers, gets its trace continued, and the upstream gets `traceparent` and B3 in the
/// caller's form, naming tollgate's client span (the caller's parent id dropped). With
/// `propagators: [tracecontext]` B3 is not read: a new trace starts and B3 goes on untouched.
/// `b3: 0` (no trace, says the caller) exports nothing and goes on as it came.
#[tokio::test]
async fn b3_callers_are_continued_and_answered_in_their_form() {
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let section = |extra: &str| tracing_section(&receiver.endpoint("grpc"), "grpc", extra);
    let both = proxy(config().upstream(&app.url()).raw(&section("")).yaml())
        .start()
        .await;
    let single_trace = CALLER_TRACE.replace("4bf9", "b3b3");
    let multi_trace = CALLER_TRACE.replace("4bf9", "b3b4");
    let single = format!("{single_trace}-{CALLER_SPAN}-1");
    let multi = [
        ("x-b3-traceid", multi_trace.as_str()),
        ("x-b3-spanid", CALLER_SPAN),
        ("x-b3-sampled", "1"),
        ("x-b3-parentspanid", "1111111111111111"),
    ];
    let (status, single_echo) = send(&both, "/single", &[("b3", &single)]).await;
    assert_eq!(status, StatusCode::OK);
    let (status, multi_echo) = send(&both, "/multi", &multi).await;
    assert_eq!(status, StatusCode::OK);
    // `b3: 0`: the caller asks for no trace; its header goes on as it came.
    let (status, denied_echo) = send(&both, "/denied", &[("b3", "0")]).await;
    assert_eq!(status, StatusCode::OK);
    let denied = &serde_json::from_str::<Value>(&denied_echo).unwrap()["headers"];
    assert_eq!(denied["b3"][0], "0");
    assert_eq!(denied.get("traceparent"), None, "{denied:#}");

    for (trace, echo, form) in [
        (&single_trace, single_echo, "single"),
        (&multi_trace, multi_echo, "multiple"),
    ] {
        let spans = receiver.trace(trace, 2).await;
        let server = by_kind(&spans, SERVER, "GET")[0];
        assert_eq!(server["parent_span_id"], CALLER_SPAN, "{form}: {server:#}");
        let client = by_kind(&spans, CLIENT, "GET")[0];
        let client_span = client["span_id"].as_str().unwrap();
        let headers = &serde_json::from_str::<Value>(&echo).unwrap()["headers"];
        assert_eq!(
            headers["traceparent"][0],
            traceparent(trace, client_span, "01"),
            "{form}"
        );
        if form == "single" {
            assert_eq!(headers["b3"][0], format!("{trace}-{client_span}-1"));
            assert_eq!(headers.get("x-b3-traceid"), None, "{headers:#}");
        } else {
            assert_eq!(headers["x-b3-traceid"][0], trace.as_str());
            assert_eq!(headers["x-b3-spanid"][0], client_span);
            assert_eq!(headers["x-b3-sampled"][0], "1");
            assert_eq!(headers.get("x-b3-parentspanid"), None, "{headers:#}");
            assert_eq!(headers.get("b3"), None, "{headers:#}");
        }
    }

    let only_w3c = proxy(
        config()
            .upstream(&app.url())
            .raw(&section("  propagators: [tracecontext]\n"))
            .yaml(),
    )
    .start()
    .await;
    let ignored = CALLER_TRACE.replace("4bf9", "b3b5");
    let sent = format!("{ignored}-{CALLER_SPAN}-1");
    let (status, echo) = send(&only_w3c, "/w3c-only", &[("b3", &sent)]).await;
    assert_eq!(status, StatusCode::OK);
    let headers = &serde_json::from_str::<Value>(&echo).unwrap()["headers"];
    assert_eq!(headers["b3"][0], sent.as_str(), "untouched");
    let root = headers["traceparent"][0].as_str().unwrap();
    let root_trace = root.split('-').nth(1).unwrap();
    assert_ne!(root_trace, ignored);
    let spans = receiver.trace(root_trace, 2).await;
    assert_eq!(by_kind(&spans, SERVER, "GET")[0]["parent_span_id"], "");
    assert!(receiver
        .all()
        .iter()
        .all(|s| s["trace_id"] != ignored.as_str()));
    // Nothing of the denied request either (its spans would be in by now).
    assert!(receiver
        .all()
        .iter()
        .all(|s| s["attributes"]["url.path"] != "/denied"));
}

/// Export never slows a request: with a collector that takes 2 s to answer each export, and
/// with one that refuses connections, every request is answered as without traces and no
/// slower than the slowest request of the same run to a tollgate without traces, give or take
/// half the collector's delay (an export a request waited for would add all of it). The slow
/// collector's small queue fills: the spans it could not hold are counted as dropped, the
/// others are exported, none lost uncounted.
#[tokio::test]
async fn a_slow_or_dead_collector_adds_no_latency_and_drops_are_counted() {
    const DELAY: Duration = Duration::from_secs(2);
    const ROUNDS: usize = 30;
    let receiver = Receiver::answering_after(DELAY.as_secs_f64());
    let app = upstream().start().await;
    let refused = format!("http://127.0.0.1:{}", free_port());
    let start = |section: String| {
        let yaml = config()
            .upstream(&app.url())
            .admin("127.0.0.1:0")
            .raw(&section)
            .yaml();
        proxy(yaml).start()
    };
    let off = start(String::new()).await;
    let slow = start(tracing_section(
        &receiver.endpoint("grpc"),
        "grpc",
        "  queue_size: 8\n  batch_size: 4\n",
    ))
    .await;
    let dead = start(tracing_section(
        &refused,
        "http/protobuf",
        "  timeout: 500ms\n",
    ))
    .await;
    // Round robin, so that whatever else the machine does falls on all three alike.
    let mut latencies: [Vec<Duration>; 3] = Default::default();
    for i in 0..ROUNDS {
        for (at, proxy) in [&off, &slow, &dead].into_iter().enumerate() {
            let path = format!("/item/{i}");
            let sent = Instant::now();
            let (status, echo) = send(proxy, &path, &[]).await;
            latencies[at].push(sent.elapsed());
            assert_eq!(status, StatusCode::OK);
            assert_eq!(serde_json::from_str::<Value>(&echo).unwrap()["uri"], path);
        }
    }
    let off_max = *latencies[0].iter().max().unwrap();
    for (name, measured) in [("slow", &latencies[1]), ("dead", &latencies[2])] {
        let worst = *measured.iter().max().unwrap();
        assert!(
            worst < off_max + DELAY / 2,
            "{name} collector: slowest request {worst:?}, without traces {off_max:?}"
        );
    }

    // Every span (a server and an upstream span per request) is exported or counted.
    let total = (2 * ROUNDS) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (exported, full, failed) = span_counts(&slow).await;
        if exported + full + failed == total {
            assert!(full > 0, "the queue of 8 never filled: {exported} exported");
            assert_eq!(failed, 0);
            assert_eq!(receiver.all().len() as u64, exported);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "exported {exported}, queue_full {full}, export_failed {failed} of {total}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The caller's sampling headers of request `i`, each asking to be sampled: W3C's sampled
/// flag, B3's `X-B3-Sampled: 1` and `X-B3-Flags: 1` (debug), and B3 ids with no decision
/// whose trace id ends in ...0001, which passes any ratio taken over the trace id. Every
/// trace id ends in [`CHOSEN`].
fn asking_to_be_sampled(i: usize) -> Vec<(&'static str, String)> {
    let trace = format!("{:016x}{CHOSEN}", i + 1);
    let span = format!("{:016x}", i + 1);
    match i % 4 {
        0 => vec![("traceparent", traceparent(&trace, &span, "01"))],
        1 => vec![
            ("x-b3-traceid", trace),
            ("x-b3-spanid", span),
            ("x-b3-sampled", "1".into()),
        ],
        2 => vec![
            ("x-b3-traceid", trace),
            ("x-b3-spanid", span),
            ("x-b3-flags", "1".into()),
        ],
        _ => vec![("b3", format!("{trace}-{span}"))],
    }
}

const CHOSEN: &str = "0000000000000001";

/// With `sample_ratio: 0.01`, 2,000 requests from an untrusted peer each asking to be
/// sampled (four ways, see [`asking_to_be_sampled`]) are sampled as any request is, by
/// tollgate: about 1 % of them are exported (20 expected; fewer than 100 asserted), none in a
/// caller's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_caller_does_not_choose_to_be_sampled() {
    let _turn = heavy_turn().await;
    const REQUESTS: usize = 2_000;
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .admin("127.0.0.1:0")
        .access_log(false)
        .raw(&untrusted_tracing_section(
            &receiver.endpoint("grpc"),
            "  sample_ratio: 0.01\n",
        ))
        .yaml();
    let mut proxy = proxy(yaml).start().await;
    let addr = proxy.addr;
    let loops: Vec<_> = (0..8)
        .map(|lane| {
            tokio::spawn(async move {
                let client = http1_client();
                for i in (lane..REQUESTS).step_by(8) {
                    let mut request = Request::get(format!("http://{addr}/item/{i}"));
                    for (name, value) in asking_to_be_sampled(i) {
                        request = request.header(name, value);
                    }
                    let response = client
                        .request(request.body(body("")).unwrap())
                        .await
                        .unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    response.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    for lane in loops {
        lane.await.unwrap();
    }
    // Shutdown sends whatever is still queued.
    proxy.shutdown();
    proxy.task.take().unwrap().await.unwrap();
    let spans = receiver.all();
    let servers = by_kind(&spans, SERVER, "GET");
    assert!(
        servers.len() < 100,
        "{} of {REQUESTS} requests exported",
        servers.len()
    );
    let followed: Vec<&Value> = spans
        .iter()
        .filter(|s| s["trace_id"].as_str().unwrap().ends_with(CHOSEN))
        .collect();
    assert!(
        followed.is_empty(),
        "spans in a caller's trace: {followed:#?}"
    );
}

/// `max_spans_per_second` bounds what is exported: every request sampled (`sample_ratio: 1`,
/// two spans each), a rate of 20 spans a second lets at most a second's worth plus 20 a
/// second of the run through; the rest are counted as dropped for the rate, none lost
/// uncounted.
#[tokio::test]
async fn exported_spans_are_bounded_per_second() {
    const REQUESTS: u64 = 150;
    let receiver = Receiver::start();
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .admin("127.0.0.1:0")
        .access_log(false)
        .raw(&untrusted_tracing_section(
            &receiver.endpoint("grpc"),
            "  sample_ratio: 1\n  max_spans_per_second: 20\n",
        ))
        .yaml();
    let proxy = proxy(yaml).start().await;
    let started = Instant::now();
    for i in 0..REQUESTS {
        let (status, _) = send(&proxy, &format!("/item/{i}"), &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
    let took = started.elapsed();
    let allowed = 20 + (20.0 * took.as_secs_f64()).ceil() as u64;
    eventually("every span exported or counted", PATIENCE, async || {
        let text = metrics(&proxy).await;
        let exported = metric(&text, "tollgate_trace_spans_exported_total");
        let limited = metric(
            &text,
            "tollgate_trace_spans_dropped_total{reason=\"rate_limited\"}",
        );
        until(
            exported + limited == 2 * REQUESTS,
            format!("exported {exported}, rate_limited {limited}"),
        )
    })
    .await;
    let text = metrics(&proxy).await;
    let exported = metric(&text, "tollgate_trace_spans_exported_total");
    assert!(
        exported <= allowed,
        "{exported} spans exported in {took:?}, at most {allowed} allowed"
    );
    assert!(
        exported >= 20,
        "a second's worth goes out at once: {exported}"
    );
    assert_eq!(receiver.all().len() as u64, exported);
}

/// A sampled request whose caller sent no `tracestate` reaches the upstream with tollgate's
/// `traceparent` and no `tracestate` field at all (an empty one says nothing); a caller's own
/// `tracestate` goes on as it was sent.
#[tokio::test]
async fn no_empty_tracestate_is_sent_upstream() {
    // What reaches the upstream is under test, not what is exported: a collector that
    // refuses connections does (the spans are dropped and counted).
    let refused = format!("http://127.0.0.1:{}", free_port());
    let app = upstream().start().await;
    let yaml = config()
        .upstream(&app.url())
        .raw(&tracing_section(&refused, "grpc", "  sample_ratio: 1\n"))
        .yaml();
    let proxy = proxy(yaml).start().await;
    for caller in [
        vec![],
        vec![("traceparent", traceparent(CALLER_TRACE, CALLER_SPAN, "01"))],
    ] {
        let headers: Vec<(&str, &str)> = caller.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (status, echo) = send(&proxy, "/x", &headers).await;
        assert_eq!(status, StatusCode::OK);
        let echo: Value = serde_json::from_str(&echo).unwrap();
        let sent = echo["headers"]["traceparent"][0].as_str().unwrap();
        assert!(sent.ends_with("-01"), "sampled: {sent}");
        assert_eq!(
            echo["headers"].get("tracestate"),
            None,
            "the caller sent {headers:?}: {echo:#}"
        );
    }
    let parent = traceparent(CALLER_TRACE, CALLER_SPAN, "01");
    let (_, echo) = send(
        &proxy,
        "/x",
        &[("traceparent", &parent), ("tracestate", "vendor=abc")],
    )
    .await;
    let echo: Value = serde_json::from_str(&echo).unwrap();
    assert_eq!(echo["headers"]["tracestate"][0], "vendor=abc", "{echo:#}");
}
