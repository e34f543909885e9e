//! The stages of the request path, one module each, in the order `Proxy::serve` runs them:
//! `shape` (in `proxy::shape`) → [`usage`] → [`route`] → [`form`] → [`identify`] and [`limit`] →
//! [`protect`] → [`forward`] → [`respond`]. Each returns a typed result: what the next stage
//! needs, or what tollgate answers instead (an [`crate::answers::Answer`], rendered by
//! [`respond::refuse`]). A stage that waits in the rare case boxes that wait: awaited inline,
//! its future would size every request's.

pub mod form;
pub mod forward;
pub mod identify;
pub mod limit;
pub mod protect;
pub mod respond;
pub mod route;
pub mod usage;
