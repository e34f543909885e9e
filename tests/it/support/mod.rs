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

/// One heavy test at a time across the whole binary: fleets of replicas, Redis clusters and
/// Sentinels, key floods and capacity measurements each want both of the machine's cores (and
/// the capacity tests measure the app beside them), while the light tests running alongside
/// mostly wait on sockets. A heavy test holds the guard for its whole run.
pub async fn heavy_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}
