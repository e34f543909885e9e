//! Test support: real processes and servers, started by the tests themselves.
#![allow(dead_code)]

pub mod proxy;
pub mod upstream;

pub use proxy::*;
pub use upstream::*;
