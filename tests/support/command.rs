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
