//! What the log says when something fails: the cause as one readable sentence (the error
//! chain joined with ": "), never Rust's debug spelling of it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use http::StatusCode;

#[tokio::test]
async fn an_unreachable_upstream_is_logged_as_a_readable_cause() {
    // An upstream that refuses connections: a port nothing listens on.
    let refused = free_port();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    let yaml = config()
        .listen(&format!("127.0.0.1:{port}"))
        .upstream(&format!("http://127.0.0.1:{refused}"))
        .yaml();
    std::fs::write(&path, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/api/x");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Ok(response) = http1_client().request(get(&url)).await {
            break response.status();
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "tollgate did not start: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let stderr = stop_for_stderr(child).await;
    let failed: serde_json::Value = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l.to_string().contains("request failed"))
        .unwrap_or_else(|| panic!("no `request failed` line:\n{stderr}"));
    let line = failed.to_string();
    let cause = failed["cause"]
        .as_str()
        .or_else(|| failed["fields"]["cause"].as_str())
        .unwrap_or_else(|| panic!("no cause: {line}"));
    assert!(
        cause.starts_with("upstream unreachable: "),
        "{cause}\n{line}"
    );
    assert!(cause.contains(": Connection refused"), "{cause}\n{line}");
    for debug in ["Some(", "Error(Connect", "Os {", "kind:"] {
        assert!(!line.contains(debug), "debug text `{debug}` in {line}");
    }
    assert!(failed.get("source").is_none(), "{line}");
}
