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
/// on sockets. A heavy test holds the permit for its whole run.
pub async fn heavy_turn() -> tokio::sync::SemaphorePermit<'static> {
    HEAVY.acquire().await.expect("never closed")
}

/// No other heavy test beside this one, for the whole run: for tests that measure the app's
/// capacity and what protect makes of it, which another heavy test would take a share of.
pub async fn heavy_alone() -> tokio::sync::SemaphorePermit<'static> {
    HEAVY
        .acquire_many(HEAVY_AT_ONCE)
        .await
        .expect("never closed")
}

const HEAVY_AT_ONCE: u32 = 2;
static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(HEAVY_AT_ONCE as usize);
