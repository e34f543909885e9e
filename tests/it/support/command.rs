//! The tollgate binary run as a command: configuration files and one-shot runs of
//! its subcommands (`limits`, `check`, ...), for the tests that drive the command line.

use std::path::PathBuf;

/// The tollgate binary cargo built for these tests.
pub const TOLLGATE_BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// `yaml` written to `tollgate.yaml` in `dir`.
pub fn write_config(dir: &tempfile::TempDir, yaml: &str) -> PathBuf {
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Runs `tollgate ARGS...` to its end: exit code (-1 for a signal), stdout, stderr.
pub async fn run_tollgate(args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(TOLLGATE_BIN)
        .args(args)
        .output()
        .await
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// Stops `child` (a tollgate started with its stderr piped) with SIGTERM, as an orchestrator
/// does, and returns what it wrote to stderr (its log).
pub async fn stop_for_stderr(child: std::process::Child) -> String {
    stop_with_status(child).await.1
}

/// [`stop_for_stderr`], with how the process ended.
pub async fn stop_with_status(child: std::process::Child) -> (std::process::ExitStatus, String) {
    let term = format!("kill -TERM {}", child.id());
    let sent = std::process::Command::new("sh")
        .args(["-c", &term])
        .status();
    assert!(sent.is_ok_and(|s| s.success()), "{term}");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (output.status, String::from_utf8(output.stderr).unwrap())
}

/// The tollgate binary serving a configuration in a process of its own, on free ports; killed
/// when dropped.
pub struct Served {
    /// The proxy listener.
    pub addr: std::net::SocketAddr,
    pub admin: std::net::SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Served {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The descriptors the process has open now (from `/proc`).
    pub fn open_descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |dir| dir.count())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tollgate --config` with `config` (its listen and admin addresses replaced by free
/// ports) and returns once `/readyz` answers a bare `ready` (with Redis: once it is connected
/// and answering). Fails after 10 s.
pub async fn serve(config: &super::config::Config) -> Served {
    serve_with_descriptors(config, None).await
}

/// [`serve`], with the process allowed at most `nofile` open descriptors (`ulimit -n`) when
/// given.
pub async fn serve_with_descriptors(config: &super::config::Config, nofile: Option<u32>) -> Served {
    use std::time::{Duration, Instant};
    let (port, admin) = (super::free_port(), super::free_port());
    let dir = tempfile::TempDir::new().unwrap();
    let yaml = config
        .clone()
        .listen(&format!("127.0.0.1:{port}"))
        .admin(&format!("127.0.0.1:{admin}"))
        .yaml();
    let file = write_config(&dir, &yaml);
    let mut command = match nofile {
        None => std::process::Command::new(TOLLGATE_BIN),
        Some(n) => {
            // The shell sets the limit and becomes tollgate (same process id).
            let mut sh = std::process::Command::new("sh");
            sh.args([
                "-c",
                &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                TOLLGATE_BIN,
            ]);
            sh
        }
    };
    let child = command
        .arg("--config")
        .arg(&file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start tollgate");
    let served = Served {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        admin: format!("127.0.0.1:{admin}").parse().unwrap(),
        child,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = format!("http://{}/readyz", served.admin);
    loop {
        // A bare `ready`: with `on_error: allow` or `local` an instance whose store failed
        // is ready too, and a second line says so.
        if let Ok(response) = super::http1_client().request(super::get(&ready)).await {
            if response.status() == http::StatusCode::OK && super::text(response).await == "ready\n"
            {
                return served;
            }
        }
        assert!(
            Instant::now() < deadline,
            "tollgate never became ready:\n{yaml}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
