//! `protect`: keeps the app alive under overload. Rate limits keep each caller fair; they do
//! not keep the app from drowning when it slows down or when many fair callers arrive at once.
//! Here an adaptive concurrency limit (`controller`) decides how many requests the app gets at
//! once, from its own latency and errors, and a priority gate (`gate`) holds the rest briefly,
//! serves the most important first and sheds the least important when it must.
//!
//! The proxy calls it after the limit stage (a caller over its quota never takes a slot) and
//! before forwarding; with no `protect` section none of this exists on the request path.
//! See docs/algorithms.md for the controller's rules and why.

mod controller;
mod gate;

pub use controller::{Outcome, Reading, Settings};
pub use gate::{Admission, ProtectMetrics, Protector, Slot, Snapshot, Ticket};
