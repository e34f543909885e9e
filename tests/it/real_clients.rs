//! tollgate with the clients and applications people actually run, not only the project's own
//! Rust client: Python's `http.client` and `requests`, Node's `fetch`, curl as clients
//! (scripts in tests/clients/), Flask on gunicorn and Express as upstreams.
//!
//! What they check, as each client sees it: keep-alive connections back to back; a 429 whose
//! `Retry-After` the client reads; an upload over `max_request_body` answered 413 to clients
//! that write their whole body before reading (the lingering close, `src/linger.rs`), over
//! plain TCP, TLS and HTTP/2; an application's early answer (401, 413) to an upload; an upload
//! an application reads whole. And the lingering close's bounds, with a raw client that never
//! stops sending.
//!
//! The tools come from Debian packages (`tests/run.sh` installs them): python3-requests,
//! python3-flask, gunicorn, curl, nodejs, npm (and `npm ci` in tests/clients for Express). A
//! test whose tool is missing fails, naming the package; none is skipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const MIB: usize = 1024 * 1024;

/// How long one client script may run: a bound so that a hang fails, not a speed.
const SCRIPT_BOUND: Duration = Duration::from_secs(240);

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// The Python the Debian packages install into (`/usr/bin/python3`), unless
/// `TOLLGATE_TEST_PYTHON` names another.
fn python() -> String {
    if let Ok(python) = std::env::var("TOLLGATE_TEST_PYTHON") {
        return python;
    }
    match Path::new("/usr/bin/python3").exists() {
        true => "/usr/bin/python3".into(),
        false => "python3".into(),
    }
}

/// Fails, naming the Debian package, unless `program --version` runs.
fn require_tool(program: &str, package: &str) {
    let ran = std::process::Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !ran.is_ok_and(|status| status.success()) {
        panic!(
            "`{program}` is missing: install the Debian package `{package}` (tests/run.sh does)"
        );
    }
}

/// Fails, naming the Debian package, unless [`python`] can import `module`.
fn require_python(module: &str, package: &str) {
    let python = python();
    let ran = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !ran.is_ok_and(|status| status.success()) {
        panic!(
            "{python} cannot import `{module}`: install the Debian package `{package}` (tests/run.sh does)"
        );
    }
}

fn require_express() {
    require_tool("node", "nodejs");
    if !clients_dir().join("node_modules/express").is_dir() {
        panic!(
            "Express is missing: run `npm ci` in tests/clients (Debian package `npm`; tests/run.sh does)"
        );
    }
}

/// Runs a client script to its end and returns the JSON it printed.
async fn run_json(command: &mut Command) -> Value {
    command.kill_on_drop(true).stdin(Stdio::null());
    let output = tokio::time::timeout(SCRIPT_BOUND, command.output())
        .await
        .unwrap_or_else(|_| panic!("{command:?} did not finish within {SCRIPT_BOUND:?}"))
        .unwrap_or_else(|e| panic!("{command:?} could not run: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{stderr}",
        output.status
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{command:?} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

async fn python_client(args: &[&str]) -> Value {
    let mut command = Command::new(python());
    command.arg(clients_dir().join("real_client.py")).args(args);
    run_json(&mut command).await
}

async fn node_client(args: &[&str]) -> Value {
    require_tool("node", "nodejs");
    let mut command = Command::new("node");
    command
        .arg(clients_dir().join("real_client.mjs"))
        .args(args);
    run_json(&mut command).await
}

/// Each try's outcome as one word: its status, or the error a client saw instead.
fn outcomes(out: &Value) -> Vec<String> {
    out["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {out}"))
        .iter()
        .map(|r| match r["status"].as_u64() {
            Some(status) => status.to_string(),
            None => r["error"].as_str().unwrap_or("?").to_string(),
        })
        .collect()
}

fn times(status: &str, n: usize) -> Vec<String> {
    vec![status.to_string(); n]
}

/// A file of `size` bytes for curl's uploads.
fn upload_file(dir: &tempfile::TempDir, size: usize) -> PathBuf {
    let path = dir.path().join(format!("upload-{size}"));
    std::fs::write(&path, vec![b'x'; size]).unwrap();
    path
}

/// curl with `args`; returns what `--write-out` printed. Each transfer writes one line.
async fn curl(args: &[&str]) -> String {
    require_tool("curl", "curl");
    let mut command = Command::new("curl");
    command
        .args(["--silent", "--show-error", "--max-time", "120"])
        .args(args)
        .kill_on_drop(true);
    let output = tokio::time::timeout(SCRIPT_BOUND, command.output())
        .await
        .expect("curl finished")
        .expect("curl runs");
    if !output.status.success() {
        eprintln!("curl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An upstream application in a process of its own, killed when dropped.
struct App {
    child: Child,
    addr: SocketAddr,
}

impl App {
    /// Flask's app on gunicorn (sync workers: one connection per request, closed after it).
    async fn flask() -> App {
        require_python("flask", "python3-flask");
        require_python("gunicorn", "gunicorn");
        let port = free_port();
        let mut command = Command::new(python());
        command
            .args([
                "-m",
                "gunicorn",
                "--workers",
                "2",
                "--log-level",
                "warning",
                "--bind",
            ])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--chdir")
            .arg(clients_dir())
            .arg("flask_app:app");
        App::start(command, port).await
    }

    /// The Express app on Node.
    async fn express() -> App {
        require_express();
        let port = free_port();
        let mut command = Command::new("node");
        command
            .arg(clients_dir().join("express_app.js"))
            .arg(port.to_string());
        App::start(command, port).await
    }

    async fn start(mut command: Command, port: u16) -> App {
        command
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?} could not start: {e}"));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        for _ in 0..300 {
            if TcpStream::connect(addr).await.is_ok() {
                return App { child, addr };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{command:?} exited ({status}) before it listened");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{command:?} did not listen on {addr} within 15 s");
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// `tollgate_lingering_closes_total` by outcome, from the admin listener.
async fn lingering_closes(proxy: &ProxyHandle) -> Vec<(String, u64)> {
    let admin = proxy.admin.expect("an admin listener");
    let response = http1_client()
        .request(get(&format!("http://{admin}/metrics")))
        .await
        .unwrap();
    let text = text(response).await;
    ["eof", "timeout", "time", "bytes", "error"]
        .into_iter()
        .map(|outcome| {
            let line = format!("tollgate_lingering_closes_total{{outcome=\"{outcome}\"}} ");
            let n = text
                .lines()
                .find_map(|l| l.strip_prefix(&line))
                .map_or(0, |n| n.trim().parse().unwrap());
            (outcome.to_string(), n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Waits (at most 10 s) until the lingering closes counted reach `expected`; returns the last
/// count. A connection counts its lingering close only once it has closed, a moment after
/// the client saw its answer.
async fn lingering_closes_settle(
    proxy: &ProxyHandle,
    expected: &[(&str, u64)],
) -> Vec<(String, u64)> {
    let expected: Vec<(String, u64)> = expected.iter().map(|(o, n)| (o.to_string(), *n)).collect();
    let mut last = Vec::new();
    for _ in 0..200 {
        last = lingering_closes(proxy).await;
        if last == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}

/// A proxy that answers 413 to bodies over 1 MiB, in front of `upstream`.
async fn limited_proxy(upstream: &str) -> ProxyHandle {
    let yaml = config()
        .upstream(upstream)
        .admin("127.0.0.1:0")
        .max_request_body("1MiB");
    proxy(yaml).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_client_uploads_over_the_limit_get_their_413_every_time() {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let proxy = limited_proxy(&up.url()).await;
    let url = proxy.url("/upload");
    for size in [2 * MIB, 3 * MIB, 8 * MIB] {
        let out = python_client(&["http-client-upload", &url, &size.to_string(), "5"]).await;
        assert_eq!(outcomes(&out), times("413", 5), "{size} bytes: {out}");
        let body = out["results"][0]["body"].as_str().unwrap();
        assert_eq!(
            body,
            r#"{"detail":"the request body is limited to 1048576 bytes","status":413,"title":"Payload Too Large","type":"about:blank"}"#
        );
    }
    assert_eq!(
        up.request_count(),
        0,
        "nothing over the limit reached the app"
    );
    // Each of the 15 connections lingered until its client, having read its answer, closed.
    assert_eq!(
        lingering_closes_settle(&proxy, &[("eof", 15)]).await,
        [("eof".to_string(), 15)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_library_gets_the_413_of_an_upload_over_the_limit() {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let proxy = limited_proxy(&up.url()).await;
    let url = proxy.url("/upload");
    let size = (3 * MIB).to_string();

    require_python("requests", "python3-requests");
    let out = python_client(&["requests-upload", &url, &size, "3"]).await;
    assert_eq!(outcomes(&out), times("413", 3), "requests: {out}");

    let out = node_client(&["fetch-upload", &url, &size, "5"]).await;
    assert_eq!(outcomes(&out), times("413", 5), "fetch: {out}");

    let dir = tempfile::tempdir().unwrap();
    let file = upload_file(&dir, 3 * MIB);
    for _ in 0..3 {
        let file_arg = format!("@{}", file.display());
        let status = curl(&[
            "--write-out",
            "%{http_code}",
            "--output",
            "/dev/null",
            "--data-binary",
            &file_arg,
            &url,
        ])
        .await;
        assert_eq!(status, "413", "curl");
    }
    assert_eq!(up.request_count(), 0);
}

/// Over TLS the lingering close runs below rustls; over HTTP/2 the stream is reset after the
/// answer and nothing lingers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_413_reaches_clients_over_tls_and_http2() {
    let _turn = heavy_turn().await;
    let dir = tempfile::tempdir().unwrap();
    write_private_ca(
        dir.path(),
        &[("proxy", &["127.0.0.1", "localhost"], "proxy")],
    );
    let cert = dir.path().join("proxy.pem");
    let key = dir.path().join("proxy.key");
    let ca = dir.path().join("ca.pem");
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .max_request_body("1MiB")
        .listen_tls("127.0.0.1:0", cert.to_str().unwrap(), key.to_str().unwrap());
    let proxy = proxy(yaml).start().await;
    let https = format!("https://127.0.0.1:{}/upload", proxy.addr.port());

    let out = python_client(&[
        "http-client-upload",
        &https,
        &(3 * MIB).to_string(),
        "5",
        ca.to_str().unwrap(),
    ])
    .await;
    assert_eq!(
        outcomes(&out),
        times("413", 5),
        "http.client over TLS: {out}"
    );
    // Each of the 5 lingered until its client closed: with a FIN (`eof`), or with a reset
    // (`error`) when the client closes leaving the server's TLS close_notify unread, which
    // Python does: either way after it read its answer.
    let mut closed = 0;
    for _ in 0..200 {
        let counted = lingering_closes(&proxy).await;
        closed = counted.iter().map(|(_, n)| n).sum::<u64>();
        assert!(
            counted.iter().all(|(o, _)| o == "eof" || o == "error"),
            "{counted:?}"
        );
        if closed == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(closed, 5);

    // HTTP/2 over TLS (ALPN) and with prior knowledge on a plain listener.
    let file = upload_file(&dir, 3 * MIB);
    let file_arg = format!("@{}", file.display());
    let ca_arg = ca.to_str().unwrap();
    let out = curl(&[
        "--http2",
        "--cacert",
        ca_arg,
        "--write-out",
        "%{http_version} %{http_code}",
        "--output",
        "/dev/null",
        "--data-binary",
        &file_arg,
        &https,
    ])
    .await;
    assert_eq!(out, "2 413", "curl over TLS with HTTP/2");
    let plain = limited_proxy(&up.url()).await;
    let out = curl(&[
        "--http2-prior-knowledge",
        "--write-out",
        "%{http_version} %{http_code}",
        "--output",
        "/dev/null",
        "--data-binary",
        &file_arg,
        &plain.url("/upload"),
    ])
    .await;
    assert_eq!(out, "2 413", "curl with HTTP/2 prior knowledge");
    assert_eq!(lingering_closes(&plain).await, [], "HTTP/2 does not linger");
    assert_eq!(up.request_count(), 0);
}

/// The application's own early answers, before it reads the upload: gunicorn then closes the
/// connection with the upload unread (tollgate reads the answer despite the reset), Node
/// reads and discards it; either way the client, still sending, gets the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_early_401_or_413_to_an_upload_reaches_the_client() {
    let _turn = heavy_turn().await;
    let flask = App::flask().await;
    let express = App::express().await;
    let size = (3 * MIB).to_string();
    for (app, path, status, body) in [
        (&flask, "/early401", "401", "log in first\n"),
        (&express, "/early401", "401", "log in first\n"),
        (&express, "/early413", "413", "too large for express\n"),
    ] {
        let yaml = config().upstream(&app.url()).admin("127.0.0.1:0");
        let proxy = proxy(yaml).start().await;
        let url = proxy.url(path);
        let out = python_client(&["http-client-upload", &url, &size, "5"]).await;
        assert_eq!(
            outcomes(&out),
            times(status, 5),
            "{} {path}: {out}",
            app.url()
        );
        assert_eq!(out["results"][4]["body"], body);
        let out = node_client(&["fetch-upload", &url, &size, "3"]).await;
        assert_eq!(outcomes(&out), times(status, 3), "fetch {path}: {out}");
    }
}

/// Uploads under the limit reach the applications whole, from every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_under_the_limit_reach_flask_and_express_whole() {
    let _turn = heavy_turn().await;
    require_python("requests", "python3-requests");
    let flask = App::flask().await;
    let express = App::express().await;
    let dir = tempfile::tempdir().unwrap();
    let size = 3 * MIB;
    let file = upload_file(&dir, size);
    let expected = format!("{{\"length\":{size}}}");
    for app in [&flask, &express] {
        let yaml = config().upstream(&app.url()).max_request_body("8MiB");
        let proxy = proxy(yaml).start().await;
        let url = proxy.url("/upload");
        let n = size.to_string();
        for out in [
            python_client(&["http-client-upload", &url, &n, "2"]).await,
            python_client(&["requests-upload", &url, &n, "2"]).await,
            node_client(&["fetch-upload", &url, &n, "2"]).await,
        ] {
            assert_eq!(outcomes(&out), times("200", 2), "{}: {out}", app.url());
            for result in out["results"].as_array().unwrap() {
                let body: Value = serde_json::from_str(result["body"].as_str().unwrap()).unwrap();
                assert_eq!(body["length"], size, "{}: {out}", app.url());
            }
        }
        let file_arg = format!("@{}", file.display());
        let out = curl(&["--data-binary", &file_arg, &url]).await;
        let body: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
        assert_eq!(
            body.to_string().replace(' ', ""),
            expected,
            "curl {}",
            app.url()
        );
    }
}

/// Keep-alive, back to back, from every client, through to gunicorn (which closes each of its
/// connections) and Express: every answer arrives, on one client connection where the client
/// reports it; past the limit each client reads a 429 and its `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_clients_back_to_back_and_the_retry_after_of_a_429() {
    let _turn = heavy_turn().await;
    require_python("requests", "python3-requests");
    let flask = App::flask().await;
    let express = App::express().await;
    for app in [&flask, &express] {
        // One route per client, each allowing 10 in 10 minutes (a sliding log: no window
        // boundary can fall between the requests).
        let clients = ["http-client", "requests", "fetch", "curl"];
        let mut yaml = config().upstream(&app.url()).admin("127.0.0.1:0");
        for client in clients {
            yaml = yaml.route(
                route(client)
                    .prefix(&format!("/{client}/"))
                    .limit(limit::sliding_log(10, "10m")),
            );
        }
        let proxy = proxy(yaml).start().await;
        let url = |client: &str| proxy.url(&format!("/{client}/hello"));
        let mut expected = times("200", 10);
        expected.extend(times("429", 4));

        let out = python_client(&["http-client-keepalive", &url("http-client"), "14"]).await;
        assert_eq!(
            outcomes(&out),
            expected,
            "http.client to {}: {out}",
            app.url()
        );
        assert_eq!(
            out["connections"], 1,
            "http.client kept one connection: {out}"
        );
        assert_retry_after(&out, "http.client");

        let out = python_client(&["requests-keepalive", &url("requests"), "14"]).await;
        assert_eq!(outcomes(&out), expected, "requests to {}: {out}", app.url());
        assert_eq!(out["connections"], 1, "requests kept one connection: {out}");
        assert_retry_after(&out, "requests");

        let out = node_client(&["fetch-keepalive", &url("fetch"), "14"]).await;
        assert_eq!(outcomes(&out), expected, "fetch to {}: {out}", app.url());
        assert_retry_after(&out, "fetch");

        // curl reuses its connection across the URLs of one command.
        let curl_url = url("curl");
        let mut args = vec![
            "--write-out",
            "%{http_code} %{num_connects} %header{retry-after}\\n",
        ];
        for _ in 0..14 {
            args.extend(["--output", "/dev/null", &curl_url]);
        }
        let out = curl(&args).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 14, "{out}");
        assert_eq!(lines[0].split(' ').nth(1), Some("1"), "{out}");
        for (i, line) in lines.iter().enumerate() {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields[0], expected[i], "curl request {i}: {out}");
            if i > 0 {
                assert_eq!(
                    fields[1], "0",
                    "curl request {i} reused the connection: {out}"
                );
            }
            if i >= 10 {
                let retry: u64 = fields[2].parse().unwrap_or_else(|_| panic!("{out}"));
                assert!((1..=600).contains(&retry), "curl Retry-After: {out}");
            }
        }
        assert_eq!(lingering_closes(&proxy).await, [], "nothing to linger for");
    }
}

/// The 429s of `out` (after the first 10) carry a Retry-After within the limit's period.
fn assert_retry_after(out: &Value, client: &str) {
    for (i, result) in out["results"].as_array().unwrap().iter().enumerate() {
        let retry = result["retry_after"].as_str();
        if i < 10 {
            assert_eq!(retry, None, "{client}: no Retry-After on an answer: {out}");
            continue;
        }
        let retry: u64 = retry
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{client}: a 429 without a Retry-After in seconds: {out}"));
        assert!((1..=600).contains(&retry), "{client}: {out}");
    }
}

/// A limit's 429 to an upload is an answer before the body is read too: the first upload is
/// admitted and read whole by the app, the rest are refused and still reach `http.client`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limits_429_to_an_upload_reaches_http_client() {
    let _turn = heavy_turn().await;
    let flask = App::flask().await;
    let yaml = config()
        .upstream(&flask.url())
        .admin("127.0.0.1:0")
        .route(route("uploads").limit(limit::sliding_log(1, "10m")));
    let proxy = proxy(yaml).start().await;
    let out = python_client(&[
        "http-client-upload",
        &proxy.url("/upload"),
        &(2 * MIB).to_string(),
        "4",
    ])
    .await;
    let mut expected = times("200", 1);
    expected.extend(times("429", 3));
    assert_eq!(outcomes(&out), expected, "{out}");
    assert_eq!(
        lingering_closes_settle(&proxy, &[("eof", 3)]).await,
        [("eof".to_string(), 3)]
    );
}

/// Sends a request head declaring a huge body, then body bytes as `send` says until the
/// proxy cuts the connection; reads the answer meanwhile. Returns the answer's text, whether
/// the sending was cut (a write failed) rather than stopped by the client, and the client's
/// side of the connection, still open unless cut.
async fn upload_without_end(
    proxy: &ProxyHandle,
    send: impl Fn(usize) -> Option<Duration> + Send + 'static,
) -> (String, bool, tokio::net::tcp::OwnedWriteHalf) {
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(b"POST /upload HTTP/1.1\r\nhost: t\r\ncontent-length: 100000000000\r\n\r\n")
        .await
        .unwrap();
    let sending = tokio::spawn(async move {
        let chunk = vec![b'x'; 16 * 1024];
        let mut i = 0;
        // `None`: the client stops sending, and keeps the connection open until it is closed.
        while let Some(pause) = send(i) {
            if writer.write_all(&chunk).await.is_err() {
                return (true, writer);
            }
            i += 1;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        (false, writer)
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(SCRIPT_BOUND, reader.read_to_end(&mut answer)).await;
    read.expect("the proxy closed the connection").ok();
    let (cut, writer) = sending.await.unwrap();
    (String::from_utf8_lossy(&answer).into_owned(), cut, writer)
}

/// A client that never stops sending is cut at the bound it meets first (here the total
/// time, or the bytes), one that stops is cut after the quiet timeout; each has its 413, and
/// the proxy serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_stops_sending_is_cut_at_the_bound() {
    let _turn = heavy_turn().await;
    let up = upstream().start().await;
    let start = |bounds: &str| {
        let yaml = config()
            .upstream(&up.url())
            .admin("127.0.0.1:0")
            .max_request_body("1KiB")
            .raw(&format!("lingering_close: {bounds}\n"));
        proxy(yaml).start()
    };

    // Steady sending: cut at 2 s in all (the quiet timeout, longer, cannot come first).
    let proxy = start("{ time: 2s, timeout: 10s, max_bytes: 1GiB }").await;
    let (answer, cut, _writer) =
        upload_without_end(&proxy, |_| Some(Duration::from_millis(10))).await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(cut, "the sending client was cut");
    assert_eq!(
        lingering_closes_settle(&proxy, &[("time", 1)]).await,
        [("time".to_string(), 1)]
    );
    let served = http1_client().request(get(&proxy.url("/"))).await.unwrap();
    assert_eq!(served.status(), 200, "the proxy serves on");

    // As fast as it can: cut after 1 MiB.
    let proxy = start("{ time: 60s, timeout: 10s, max_bytes: 1MiB }").await;
    let (answer, cut, _writer) = upload_without_end(&proxy, |_| Some(Duration::ZERO)).await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(cut, "the sending client was cut");
    assert_eq!(
        lingering_closes_settle(&proxy, &[("bytes", 1)]).await,
        [("bytes".to_string(), 1)]
    );

    // Ten chunks, then silence with the connection open: closed after the quiet timeout.
    let proxy = start("{ time: 60s, timeout: 1s, max_bytes: 1GiB }").await;
    // The client keeps its side open (`_open`) until it has been counted.
    let (answer, cut, _open) =
        upload_without_end(&proxy, |i| (i < 10).then_some(Duration::from_millis(10))).await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(!cut, "the client had stopped sending");
    assert_eq!(
        lingering_closes_settle(&proxy, &[("timeout", 1)]).await,
        [("timeout".to_string(), 1)]
    );
}
