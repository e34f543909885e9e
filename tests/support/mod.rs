//! Test support: real processes and servers, started by the tests themselves.
#![allow(dead_code, unused_imports)]

pub mod browser;
pub mod cluster;
pub mod command;
pub mod config;
pub mod grpc;
pub mod pki;
pub mod proxy;
pub mod redis;
pub mod rng;
pub mod upstream;

pub use cluster::*;
pub use command::*;
pub use config::*;
pub use pki::*;
pub use proxy::*;
pub use redis::*;
pub use rng::Rng;
pub use upstream::*;
