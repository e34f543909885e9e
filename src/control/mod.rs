//! Operator and background work around the limit stage, kept off the request path: one
//! caller's state and reset across stores and replicas, and the deny cache's watch on resets
//! ([`caller`]), temporary overrides of one caller's limits and their watch ([`overrides`]), how a
//! caller's value is shown and found again by that form ([`shown`]),
//! the announcement of those changes to every replica at once ([`notify`]),
//! the audit trail of operator actions ([`audit`]), the top-offenders sketch ([`offenders`])
//! with the last denials ([`denials`]),
//! and its fleet-wide view through Redis ([`fleet`]), and the rounds of local-first limits
//! ([`sync`]). The proxy's wiring starts and carries them over reloads; the limit stage knows
//! none of them.
//!
//! [`Control`] is the operator API: one handle, its methods kept beside the concern they
//! serve (each file has one `impl Control`), and every answer typed in [`results`], where
//! its JSON keys and its text form are:
//!
//! | Method | File | Answer |
//! |---|---|---|
//! | `new`, `direct`, `offenders`, `memory_only`, `ping`, `peek` | `caller.rs` | |
//! | `state` | `caller.rs` | [`results::CallerState`] |
//! | `reset` | `caller.rs` | [`results::ResetDone`] |
//! | `set_override` | `overrides.rs` | [`results::OverrideDone`] |
//! | `remove_override` | `overrides.rs` | [`results::OverrideRemoved`] |
//! | `overrides_list` (and `overrides_of`, `overrides_in_force`: the records) | `overrides.rs` | [`results::OverridesList`] |
//! | `audit` (writes), `audit_trail` | `audit.rs` | [`results::AuditTrail`] |
//! | `shown`, `resolve` (a caller named by its short form) | `shown.rs` | |

pub mod audit;
pub mod caller;
pub mod denials;
pub mod fleet;
pub mod notify;
pub mod offenders;
pub mod overrides;
pub mod results;
pub mod shown;
pub mod sync;

pub use caller::Control;
