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
