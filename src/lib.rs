//! tollgate: an HTTP reverse proxy with built-in, Redis-backed throttling.
//!
//! The request path, in order: [`server`] accepts → [`proxy`] routes, identifies, limits and
//! forwards → the response streams back. [`config`] turns the YAML file into the runtime
//! configuration everything else reads.

pub mod admin;
pub mod admin_endpoints;
pub mod answers;
pub mod body;
pub mod cli;
pub mod config;
pub mod conn;
pub mod console;
pub mod control;
pub mod error;
pub mod explain;
pub mod grpc;
pub mod hooked_io;
pub mod identity;
pub mod idle;
pub mod limit;
pub mod limits_cli;
pub mod linger;
pub mod metrics;
pub mod protect;
pub mod proxy;
pub mod query_params;
pub mod reload;
pub mod routing;
pub mod server;
pub mod store;
pub mod suggest;
pub mod summary;
pub mod throttle;
pub mod tls;
pub mod traces;
pub mod upgrade;
pub mod usage;
pub mod workers;
