//! The real `tollgate` binary: `check`, the three ways of starting it, start-up failures,
//! signals and JSON logs. Upstreams run in the test's runtime; tollgate runs as a child process.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// Generous bounds: the machine is shared and a debug binary starts slowly under load.
const START_WITHIN: Duration = Duration::from_secs(20);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The binary with no configuration leaking in from the test's own environment.
fn tollgate() -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_LOG")
        .env_remove("RUST_LOG");
    command
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run_check(path: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = tollgate();
    command.arg("check").arg("--config").arg(path);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("running tollgate check")
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `check` must refuse `text` with exit 2 and a first error line starting `FILE:LINE:COL: `.
/// Returns that whole line.
fn refused_at(dir: &TempDir, name: &str, text: &str, line: usize, col: usize) -> String {
    let path = write(dir, name, text);
    let output = run_check(&path, &[]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        output.stdout.is_empty(),
        "nothing on stdout: {}",
        stdout_of(&output)
    );
    let first = stderr.lines().next().unwrap_or_default().to_string();
    let prefix = format!("{}:{line}:{col}: ", path.display());
    assert!(
        first.starts_with(&prefix),
        "expected `{prefix}...`, got: {stderr}"
    );
    first
}

/// A plain proxy on `port` in front of `upstream_url` (the `check` tests write their YAML
/// themselves: its text, lines and columns are what they test).
fn run_config(port: u16, upstream_url: &str) -> String {
    config()
        .listen(&format!("127.0.0.1:{port}"))
        .upstream(upstream_url)
        .shutdown_timeout(&format!("{}s", SHUTDOWN_TIMEOUT.as_secs()))
        .yaml()
}

/// A running tollgate process; killed if a test fails before it exits.
struct Running {
    child: Child,
    addr: SocketAddr,
    stderr_file: PathBuf,
    _dir: TempDir,
}

impl Running {
    /// Starts `command` with stderr going to a file (read with [`Running::stderr`]).
    fn spawn(mut command: Command, port: u16) -> Running {
        let dir = TempDir::new().unwrap();
        let stderr_file = dir.path().join("stderr.log");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_file).unwrap())
            .spawn()
            .expect("starting tollgate");
        Running {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            stderr_file,
            _dir: dir,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    /// Sends `-TERM`, `-INT`, ... with kill(1).
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits, bounded, until the listen port accepts TCP connections.
    async fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "tollgate exited early with {status}; stderr:\n{}",
                    self.stderr()
                );
            }
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer within {START_WITHIN:?}; stderr:\n{}",
                self.addr,
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits, bounded, for the process to exit.
    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tollgate still running after {within:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A request through the proxy reaches the upstream and comes back.
async fn assert_serves(running: &Running) {
    let response = http1_client()
        .request(get(&running.url("/echo")))
        .await
        .expect("request through the tollgate process");
    assert_eq!(response.status(), 200);
    let echo: serde_json::Value = serde_json::from_str(&text(response).await).unwrap();
    assert_eq!(echo["uri"], "/echo");
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "http");
}

// ---------------------------------------------------------------------------------------------
// tollgate check

#[test]
fn check_accepts_a_good_file_and_prints_the_summary() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "good.yaml",
        "listen: 127.0.0.1:8080\nadmin: 127.0.0.1:9901\nupstream:\n  url: http://127.0.0.1:3000\n  timeout: 5s\nworkers: 3\n",
    );
    let output = run_check(&path, &[]);
    let stdout = stdout_of(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        stderr_of(&output)
    );
    assert!(
        stdout.starts_with(&format!("{}: ok\n", path.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("listen    http://127.0.0.1:8080\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("admin     http://127.0.0.1:9901"),
        "{stdout}"
    );
    assert!(
        stdout.contains("upstream  http://127.0.0.1:3000 (HTTP/1.1, timeout 5s)"),
        "{stdout}"
    );
    assert!(stdout.contains("workers   3 serving threads\n"), "{stdout}");
}

/// A route keyed by an identity with a `jwt` source under `on_invalid: client_ip` (the
/// default) gets a warning: tokens the app accepts and tollgate refuses (a numeric-string
/// `exp`, a duplicate claim) would get a quota per client address. `reject` silences it, and
/// so does an identity without a `jwt` source. The file is still accepted.
#[test]
fn check_warns_when_a_refused_token_is_keyed_by_client_ip() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "jwt.yaml",
        "listen: 127.0.0.1:8080\nupstream:\n  url: http://127.0.0.1:3000\nidentities:\n  user:\n    - jwt: { claim: sub, secret_env: TG_CLI_TEST_JWT }\n    - header: x-user\n  strict:\n    sources:\n      - jwt: { claim: sub, secret_env: TG_CLI_TEST_JWT }\n    on_invalid: reject\n  member:\n    - header: x-user\nroutes:\n  - name: open\n    match: { path_prefix: /open }\n    key: user\n    limits:\n      - { algorithm: fixed_window, limit: 3, period: 10m }\n  - name: strict\n    match: { path_prefix: /strict }\n    key: strict\n    limits:\n      - { algorithm: fixed_window, limit: 3, period: 10m }\n  - name: plain\n    match: { path_prefix: /plain }\n    key: member\n    limits:\n      - { algorithm: fixed_window, limit: 3, period: 10m }\n",
    );
    let output = run_check(&path, &[("TG_CLI_TEST_JWT", "a-test-secret")]);
    let stdout = stdout_of(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        stderr_of(&output)
    );
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|line| line.trim_start().starts_with("warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stdout}");
    assert!(
        warnings[0].contains("identity user keys a token it refuses by client IP")
            && warnings[0].contains("set on_invalid: reject"),
        "{stdout}"
    );
    // Under the route it concerns.
    let open = stdout.find("route     open").unwrap();
    let strict = stdout.find("route     strict").unwrap();
    let warning = stdout.find(warnings[0]).unwrap();
    assert!(open < warning && warning < strict, "{stdout}");
}

#[test]
fn check_reports_an_unknown_key_with_position_and_the_allowed_keys() {
    let dir = TempDir::new().unwrap();
    let line = refused_at(
        &dir,
        "unknown.yaml",
        "listen: 127.0.0.1:8080\nupstream:\n  url: http://127.0.0.1:3000\n  timout: 3s\n",
        4,
        3,
    );
    assert!(line.contains("unknown field `timout`"), "{line}");
    for allowed in [
        "`url`",
        "`connect_timeout`",
        "`timeout`",
        "`host`",
        "`http2`",
    ] {
        assert!(
            line.contains(allowed),
            "allowed key {allowed} not listed: {line}"
        );
    }
}

#[test]
fn check_reports_a_bad_duration_at_its_value() {
    let dir = TempDir::new().unwrap();
    let line = refused_at(
        &dir,
        "duration.yaml",
        "listen: 127.0.0.1:8080\nupstream:\n  url: http://127.0.0.1:3000\n  timeout: soon\n",
        4,
        12,
    );
    assert!(line.contains("upstream.timeout"), "{line}");
    assert!(line.contains("`soon` is not a duration"), "{line}");
}

#[test]
fn check_reports_a_yaml_syntax_error_where_it_is() {
    let dir = TempDir::new().unwrap();
    // The second `:` on line 4 (column 14) makes a mapping where a scalar was started.
    let line = refused_at(
        &dir,
        "syntax.yaml",
        "listen: 127.0.0.1:8080\nupstream:\n  url: http://127.0.0.1:3000\n  timeout: 5s: x\n",
        4,
        14,
    );
    assert!(line.contains("mapping values are not allowed"), "{line}");
    assert!(
        !line.contains(" at line "),
        "position only in front: {line}"
    );
}

#[test]
fn check_reports_an_unset_variable_by_name() {
    let dir = TempDir::new().unwrap();
    let line = refused_at(
        &dir,
        "unset.yaml",
        "listen: 127.0.0.1:8080\nupstream:\n  url: http://${TG_CLI_TEST_UNSET_VAR}\n",
        3,
        15,
    );
    assert!(
        line.contains("`TG_CLI_TEST_UNSET_VAR` is not set"),
        "{line}"
    );
}

#[test]
fn check_substitutes_variables_and_defaults_from_the_environment() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "env.yaml",
        "listen: ${TG_CLI_TEST_LISTEN:-127.0.0.1:18080}\nupstream:\n  url: http://${TG_CLI_TEST_UPSTREAM}\n",
    );

    // Set: substituted; the listen variable is unset, so its default applies.
    let mut command = tollgate();
    command
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("TG_CLI_TEST_LISTEN")
        .env("TG_CLI_TEST_UPSTREAM", "10.9.8.7:3000");
    let output = command.output().unwrap();
    let stdout = stdout_of(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        stderr_of(&output)
    );
    assert!(
        stdout.contains("listen    http://127.0.0.1:18080\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("upstream  http://10.9.8.7:3000 "),
        "{stdout}"
    );

    // A set variable wins over the default.
    let output = run_check(
        &path,
        &[
            ("TG_CLI_TEST_LISTEN", "127.0.0.1:18081"),
            ("TG_CLI_TEST_UPSTREAM", "10.9.8.7:3000"),
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        stderr_of(&output)
    );
    assert!(stdout_of(&output).contains("listen    http://127.0.0.1:18081\n"));

    // Unset, no default: refused, naming the variable.
    let output = tollgate()
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("TG_CLI_TEST_UPSTREAM")
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!("{}:3:15: ", path.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("`TG_CLI_TEST_UPSTREAM` is not set"),
        "{stderr}"
    );
}

#[test]
fn check_accepts_the_shipped_example_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.yaml");
    let output = tollgate()
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("UPSTREAM_URL")
        .output()
        .unwrap();
    let stdout = stdout_of(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        stderr_of(&output)
    );
    assert!(
        stdout.contains("listen    http://0.0.0.0:8080\n"),
        "{stdout}"
    );
    assert!(stdout.contains("admin     http://0.0.0.0:9901"), "{stdout}");
    // A local-first limit shows its bound as a function of R.
    assert!(
        stdout.contains("sync 100ms: admits at most 50 per window + (R - 1) with R replicas"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// Starting: three spellings, two failures

async fn assert_starts_serves_and_stops(configure: impl FnOnce(&mut Command, &Path)) {
    let up = upstream().start().await;
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let config = write(&dir, "run.yaml", &run_config(port, &up.url()));
    let mut command = tollgate();
    configure(&mut command, &config);
    let mut running = Running::spawn(command, port);
    running.wait_until_listening().await;
    assert_serves(&running).await;
    running.signal("TERM");
    let status = running.wait_exit(SHUTDOWN_TIMEOUT * 2).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", running.stderr());
}

#[tokio::test]
async fn starts_with_the_config_flag_and_no_command() {
    assert_starts_serves_and_stops(|command, config| {
        command.arg("--config").arg(config);
    })
    .await;
}

#[tokio::test]
async fn starts_with_the_run_command() {
    assert_starts_serves_and_stops(|command, config| {
        command.arg("run").arg("--config").arg(config);
    })
    .await;
}

#[tokio::test]
async fn starts_with_tollgate_config_in_the_environment() {
    assert_starts_serves_and_stops(|command, config| {
        command.env("TOLLGATE_CONFIG", config);
    })
    .await;
}

#[tokio::test]
async fn a_port_in_use_exits_1_with_a_one_line_reason() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = TempDir::new().unwrap();
    let config = write(&dir, "busy.yaml", &run_config(port, "http://127.0.0.1:9"));
    let mut command = tollgate();
    command.arg("--config").arg(&config);
    let mut running = Running::spawn(command, port);
    let status = running.wait_exit(START_WITHIN).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line expected:\n{stderr}");
    assert!(
        lines[0].contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    drop(taken);
}

#[tokio::test]
async fn a_missing_tls_certificate_exits_1() {
    let port = free_port();
    let dir = TempDir::new().unwrap();
    let config = write(
        &dir,
        "tls.yaml",
        &config()
            .listen_tls(
                &format!("127.0.0.1:{port}"),
                "missing-cert.pem",
                "missing-key.pem",
            )
            .upstream("http://127.0.0.1:9")
            .yaml(),
    );
    let mut command = tollgate();
    command.arg("--config").arg(&config);
    let mut running = Running::spawn(command, port);
    let status = running.wait_exit(START_WITHIN).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("missing-cert.pem"),
        "names the file: {stderr}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing may be listening"
    );
}

// ---------------------------------------------------------------------------------------------
// Signals and logs

#[tokio::test]
async fn sigterm_drains_the_in_flight_request_refuses_new_ones_and_exits_0() {
    let up = upstream().start().await;
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let config = write(&dir, "term.yaml", &run_config(port, &up.url()));
    let mut command = tollgate();
    command.arg("--config").arg(&config);
    let mut running = Running::spawn(command, port);
    running.wait_until_listening().await;

    // The upstream answers when the test releases it: the request is in flight for as long
    // as the test needs.
    let url = running.url("/sleep?release=1");
    let in_flight = tokio::spawn(async move {
        let response = http1_client().request(get(&url)).await?;
        let status = response.status();
        Ok::<_, hyper_util::client::legacy::Error>((status, text(response).await))
    });
    // Signal only once the request is at the upstream, i.e. truly in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.request_count() == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.signal("TERM");
    let signalled = Instant::now();

    // The listener closes: new connections are refused while the request still runs.
    // (A connect racing the close may instead be accepted into the backlog or reset; retry.)
    eventually("connections refused after SIGTERM", PATIENCE, async || {
        match tokio::net::TcpStream::connect(running.addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            other => Err(format!("{other:?}; stderr:\n{}", running.stderr())),
        }
    })
    .await;
    assert!(
        !in_flight.is_finished(),
        "the in-flight request should still be running when new connections are refused"
    );
    up.release.notify_one();

    let (status, body) = in_flight
        .await
        .unwrap()
        .expect("the in-flight request completes");
    assert_eq!(status, 200);
    assert_eq!(body, "slept");

    let exit = running.wait_exit(SHUTDOWN_TIMEOUT).await;
    assert_eq!(exit.code(), Some(0), "stderr:\n{}", running.stderr());
    // timeout under test: the shutdown timeout (it exits once drained, before it).
    assert!(signalled.elapsed() < SHUTDOWN_TIMEOUT);
    assert!(
        running.stderr().contains("SIGTERM received"),
        "{}",
        running.stderr()
    );
}

#[tokio::test]
async fn sigint_exits_0() {
    let up = upstream().start().await;
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let config = write(&dir, "int.yaml", &run_config(port, &up.url()));
    let mut command = tollgate();
    command.arg("--config").arg(&config);
    let mut running = Running::spawn(command, port);
    running.wait_until_listening().await;
    // A served request means the accept loop, and so the signal handlers, are running.
    assert_serves(&running).await;
    running.signal("INT");
    let status = running.wait_exit(SHUTDOWN_TIMEOUT).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", running.stderr());
    assert!(
        running.stderr().contains("SIGINT received"),
        "{}",
        running.stderr()
    );
}

#[tokio::test]
async fn log_format_json_writes_one_json_object_per_stderr_line() {
    let up = upstream().start().await;
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let config = write(&dir, "json.yaml", &run_config(port, &up.url()));
    let mut command = tollgate();
    command
        .arg("--config")
        .arg(&config)
        .args(["--log-format", "json"]);
    let mut running = Running::spawn(command, port);
    running.wait_until_listening().await;
    assert_serves(&running).await;
    running.signal("TERM");
    let status = running.wait_exit(SHUTDOWN_TIMEOUT).await;
    let stderr = running.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");

    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.len() >= 3,
        "expected start and shutdown logs:\n{stderr}"
    );
    for line in &lines {
        assert!(line.is_object(), "{line}");
        assert!(line.get("level").is_some(), "{line}");
    }
    let listening = lines
        .iter()
        .find(|l| l["message"] == "listening")
        .unwrap_or_else(|| panic!("no `listening` line:\n{stderr}"));
    assert_eq!(listening["address"], format!("127.0.0.1:{port}"));
    assert!(
        lines.iter().any(|l| l["message"] == "SIGTERM received"),
        "{stderr}"
    );
    // Lines are written by a thread of their own: the request's access-log line and the very
    // last line before exit must still be there, in order.
    let access = lines
        .iter()
        .position(|l| l["target"] == "tollgate::access" && l["path"] == "/echo")
        .unwrap_or_else(|| panic!("no access-log line for /echo:\n{stderr}"));
    assert_eq!(lines[access]["status"], 200, "{stderr}");
    assert_eq!(
        lines.last().map(|l| l["message"].clone()),
        Some(serde_json::json!("drained; exiting")),
        "{stderr}"
    );
    assert!(
        access < lines.len() - 1,
        "the access line comes before the exit line:\n{stderr}"
    );
}

/// A signal that arrives as soon as the port answers must still be a graceful shutdown, not
/// the default action (death by SIGTERM). The window between binding and installing the
/// handlers is small, so this tries many times, with a shell already waiting to run its
/// built-in `kill` (spawning kill(1) afterwards would take longer than the window).
#[test]
fn sigterm_as_soon_as_the_port_answers_still_exits_0() {
    use std::io::Write;
    let dir = TempDir::new().unwrap();
    for attempt in 0..100 {
        let port = free_port();
        let config = write(&dir, "early.yaml", &run_config(port, "http://127.0.0.1:9"));
        let mut command = tollgate();
        command.arg("--config").arg(&config);
        let mut running = Running::spawn(command, port);
        let mut killer = Command::new("sh")
            .arg("-c")
            .arg(format!("read go && kill -TERM {}", running.child.id()))
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + START_WITHIN;
        while std::net::TcpStream::connect(running.addr).is_err() {
            if let Some(status) = running.child.try_wait().unwrap() {
                panic!("exited early with {status}: {}", running.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "never listened: {}",
                running.stderr()
            );
        }
        killer.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert!(killer.wait().unwrap().success());
        let status = running.child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "attempt {attempt}: {status}; stderr:\n{}",
            running.stderr()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// tollgate health

/// `tollgate health ARGS...`: (exit code, stdout, stderr).
fn run_health(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = tollgate();
    command.arg("health").args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("running tollgate health");
    (output.status.code(), stdout_of(&output), stderr_of(&output))
}

#[tokio::test]
async fn health_asks_readyz_on_the_admin_listener_and_exits_0_or_1_with_the_reason() {
    let dir = TempDir::new().unwrap();
    let port = free_port();
    let admin = free_port();
    let config = write(
        &dir,
        "health.yaml",
        &(run_config(port, "http://127.0.0.1:9") + &format!("admin: 127.0.0.1:{admin}\n")),
    );
    let mut command = tollgate();
    command.arg("--config").arg(&config);
    let mut running = Running::spawn(command, admin);
    running.wait_until_listening().await;

    let readyz = format!("http://127.0.0.1:{admin}/readyz");
    let (code, stdout, stderr) = run_health(&["--url", &readyz], &[]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(stdout, format!("{readyz}: 200 OK: ready\n"));
    // The admin address from the configuration, by flag and through TOLLGATE_CONFIG.
    let config_text = config.to_str().unwrap();
    let (code, stdout, stderr) = run_health(&["--config", config_text], &[]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert_eq!(stdout, format!("{readyz}: 200 OK: ready\n"));
    let (code, stdout, _) = run_health(&[], &[("TOLLGATE_CONFIG", config_text)]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, format!("{readyz}: 200 OK: ready\n"));

    // A non-2xx answer: exit 1, one line with the status and the answer's first line.
    let nope = format!("http://127.0.0.1:{admin}/nope");
    let (code, stdout, stderr) = run_health(&["--url", &nope], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "tollgate health: {nope} answered 404 Not Found: not found: try /healthz or /readyz\n"
        )
    );

    // Nothing listening: exit 1, one line naming the URL and the cause.
    let closed = format!("http://127.0.0.1:{}/readyz", free_port());
    let (code, stdout, stderr) = run_health(&["--url", &closed], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("tollgate health: cannot reach {closed}: "))
            && stderr.contains("Connection refused"),
        "{stderr}"
    );

    // A configuration without an admin listener cannot say where to ask.
    let no_admin = write(
        &dir,
        "no-admin.yaml",
        &run_config(port, "http://127.0.0.1:9"),
    );
    let (code, _, stderr) = run_health(&["--config", no_admin.to_str().unwrap()], &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "tollgate health: {} has no `admin` listener: pass --url\n",
            no_admin.display()
        )
    );
    drop(running);
}

/// Issue 40: `check` lists every admin endpoint with its methods (which are open, which need
/// the token), a route's allow-list, and each tier's own limits, not only its name.
#[test]
fn check_lists_every_admin_endpoint_and_each_tiers_limits() {
    let dir = TempDir::new().unwrap();
    let path = write(
        &dir,
        "tiers.yaml",
        "listen: 127.0.0.1:8080\nadmin: 127.0.0.1:9901\nupstream: { url: http://127.0.0.1:3000 }\nprotect: {}\n\
         identities:\n  customer:\n    - header: X-Customer\n\
         routes:\n  - name: api\n    match: { path_prefix: /api/ }\n    key: customer\n    limits:\n      - { algorithm: fixed_window, limit: 100, period: 1m, name: per-minute }\n\
         \x20   allow: { client_ips: [192.0.2.0/24], identities: { customer: [ops] } }\n\
         \x20   overrides:\n      - name: gold\n        identity: customer\n        values: [acme, initech]\n        limits:\n          - { algorithm: fixed_window, limit: 1000, period: 1m, name: gold-minute }\n          - { algorithm: token_bucket, limit: 50, period: 1s, burst: 100, name: gold-rate }\n",
    );
    let output = run_check(&path, &[]);
    let stdout = stdout_of(&output);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    for line in [
        "admin     http://127.0.0.1:9901\n",
        "          GET /healthz, GET /readyz, GET /metrics (the platform's), GET /console (the operators' page)\n",
        "          GET /limits/top, GET /limits/suggest, GET /limits/state, GET /limits/audit, GET /limits/overrides, GET /protect: open to whoever reaches the listener\n",
        "          POST /limits/reset, POST /limits/override, DELETE /limits/override: open (loopback listener, no token)\n",
        "  allow   1 client ip range, 1 value of customer: forwarded without limits\n",
        "  tier    gold for 2 values of customer, priority normal\n",
        "    limit gold-minute fixed_window 1000 per 1m, local\n",
        "    limit gold-rate token_bucket 50 per 1s, burst 100, local\n",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
}
