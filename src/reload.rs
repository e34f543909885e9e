//! Hot reload: on SIGHUP, and when the configuration file changes, the file is read and
//! validated again and, if valid, swapped in; an invalid file is refused (logged with
//! `FILE:LINE:COL`, counted) and the old configuration keeps serving.
//!
//! Changes are found by polling once a second rather than with inotify: Kubernetes ConfigMaps
//! update by swapping a symlink (`..data`) to a new directory, which file watchers on the old
//! inode miss, while a poll of the resolved path, size, modification time and content sees it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config;
use crate::proxy::Proxy;

const POLL_EVERY: Duration = Duration::from_secs(1);

/// What identifies a version of the file: where the path resolves to, and its content.
#[derive(Debug, PartialEq, Eq)]
struct Version {
    resolved: PathBuf,
    modified: Option<SystemTime>,
    digest: [u8; 32],
}

fn version(path: &Path) -> Option<Version> {
    let resolved = std::fs::canonicalize(path).ok()?;
    let modified = std::fs::metadata(&resolved).and_then(|m| m.modified()).ok();
    let content = std::fs::read(&resolved).ok()?;
    Some(Version {
        resolved,
        modified,
        digest: Sha256::digest(&content).into(),
    })
}

/// Watches `path` until `stop` is cancelled. Started by the server when the configuration came
/// from a file that exists.
pub async fn watch(proxy: Proxy, path: PathBuf, stop: CancellationToken) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            tracing::warn!(cause = %crate::error::chain(&e), "cannot listen for SIGHUP; reloading on file changes only");
            None
        }
    };
    let mut last = version(&path);
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = stop.cancelled() => return,
            _ = async { match hangup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending().await } } => true,
            _ = tick.tick() => false,
        };
        let current = version(&path);
        if !forced && (current == last || current.is_none()) {
            // Unchanged, or mid-swap (the path briefly resolves to nothing): look again later.
            continue;
        }
        let why = if forced { "SIGHUP" } else { "file changed" };
        last = current;
        reload(&proxy, &path, why);
    }
}

/// Loads and swaps in the file at `path`; returns whether it was accepted.
pub fn reload(proxy: &Proxy, path: &Path, why: &str) -> bool {
    match config::load(path) {
        Ok(config) => {
            tracing::info!(reason = why, file = %path.display(), "reloading configuration");
            proxy.reload(config);
            true
        }
        Err(errors) => {
            proxy.metrics().reloaded(false);
            for error in &errors.0 {
                tracing::error!(
                    reason = why,
                    "configuration refused, the previous one keeps serving: {error}"
                );
            }
            false
        }
    }
}
