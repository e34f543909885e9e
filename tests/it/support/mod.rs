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
/// on sockets. A heavy test holds the permit for its whole run; a family whose members would
/// measure each other (protect's capacity scenarios) also holds a lock of its own.
pub async fn heavy_turn() -> tokio::sync::SemaphorePermit<'static> {
    static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    HEAVY.acquire().await.expect("never closed")
}
