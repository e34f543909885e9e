//! Test support: real processes and servers, started by the tests themselves.

pub mod browser;
pub mod capacity_app;
pub mod cluster;
pub mod command;
pub mod config;
pub mod grpc;
pub mod open_loop;
pub mod pki;
pub mod proxy;
pub mod raw_upstream;
pub mod redis;
pub mod rng;
pub mod upstream;
pub mod wait;

pub use capacity_app::CapacityApp;
pub use cluster::*;
pub use command::*;
pub use config::*;
pub use open_loop::OpenLoop;
pub use pki::*;
pub use proxy::*;
pub use raw_upstream::*;
pub use redis::*;
pub use rng::Rng;
pub use upstream::*;
pub use wait::*;

/// Heavy tests two at a time across the whole binary (as when each area was a binary of its
/// own, on two test threads): fleets of replicas, Redis Clusters and Sentinels, key floods and
/// capacity measurements each want a core, while the light tests running alongside mostly wait
/// on sockets. A heavy test holds the turn for its whole run.
pub async fn heavy_turn() -> Turn {
    Turn::take(1).await
}

/// No other heavy test beside this one, for the whole run: for tests that measure the app's
/// capacity and what protect makes of it, which another heavy test would take a share of.
pub async fn heavy_alone() -> Turn {
    Turn::take(HEAVY_AT_ONCE).await
}

/// When the first test asked for a turn: a turn's log line says when it began from there.
static START: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// A heavy test's turn. With `TOLLGATE_TEST_TURNS=FILE` set, each turn appends a line to FILE
/// when it ends: the test, seconds waited for the turn, seconds held. The turns are the
/// suite's critical path, so that is where to look when it grows.
pub struct Turn {
    _permit: tokio::sync::SemaphorePermit<'static>,
    asked: std::time::Instant,
    granted: std::time::Instant,
}

impl Turn {
    async fn take(permits: u32) -> Turn {
        std::sync::LazyLock::force(&START);
        let asked = std::time::Instant::now();
        let permit = HEAVY.acquire_many(permits).await.expect("never closed");
        Turn {
            _permit: permit,
            asked,
            granted: std::time::Instant::now(),
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(file) = std::env::var_os("TOLLGATE_TEST_TURNS") else {
            return;
        };
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let line = format!(
            "{test} waited {:.1} held {:.1} from {:.1}\n",
            (self.granted - self.asked).as_secs_f64(),
            self.granted.elapsed().as_secs_f64(),
            (self.granted - *START).as_secs_f64()
        );
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The overrides and the audit trail of a memory store are the process's (one proxy a
/// process, as deployed), so in-process proxies on memory stores see each other's: a test that
/// sets or lists them there holds this for its whole run.
pub async fn memory_operator_state() -> tokio::sync::MutexGuard<'static, ()> {
    static OWNER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    OWNER.lock().await
}

const HEAVY_AT_ONCE: u32 = 2;
static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(HEAVY_AT_ONCE as usize);
