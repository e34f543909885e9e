//! The limit engine: decides whether a request passes all the rate limits of its route.
//!
//! [`algorithm`] holds the pure arithmetic of the six algorithms; [`memory`] runs it on
//! in-process state (one proxy instance) and [`redis_store`] runs a Lua mirror of it inside
//! Redis (many proxy instances sharing quotas). Both decide all limits of a request in one
//! atomic step so that a request denied by one limit consumes nothing from the others, which is
//! what keeps a multi-limit route from leaking quota while a single limit is exhausted.
//!
//! What a store is asked and answers ([`Check`], [`Decision`], ...) lives in its own file,
//! which every store imports; this root only picks the store ([`Store`]), so no store
//! depends on it.

pub mod algorithm;
pub mod calendar;
mod cause;
pub mod clock;
mod coalesce;
mod decision;
pub mod local_first;
mod lua;
pub mod memory;
pub mod redis_settings;
pub mod redis_store;
mod script_runner;
mod sentinel;

pub use algorithm::{params_fit, Algorithm, Params, Settle, Verdict, MAX_SAFE};
pub use cause::Cause;
pub use clock::{Clock, Micros};
pub use decision::{
    block_key, new_lease_id, Check, Decision, Lease, Settlement, StoreError, BLOCK_SUFFIX,
};

/// Where limit states live.
#[derive(Clone)]
pub enum Store {
    Memory(memory::MemoryStore),
    Redis(redis_store::RedisStore),
}

impl Store {
    /// Checks all `checks` atomically; consumes from them only if no enforcing limit denies.
    pub async fn decide(&self, checks: &[Check<'_>]) -> Result<Decision, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.decide(checks)),
            Store::Redis(r) => r.decide(checks).await,
        }
    }

    /// Frees the slots of concurrency leases (unknown or expired ones are ignored).
    pub async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.release(leases);
                Ok(())
            }
            Store::Redis(r) => r.release(leases).await,
        }
    }

    /// Applies settlements (refunds and charges after the response), atomically, in one
    /// round trip for Redis.
    pub async fn settle(&self, settlements: &[Settlement]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.settle(settlements);
                Ok(())
            }
            Store::Redis(r) => r.settle(settlements).await,
        }
    }

    /// Extends live concurrency leases to a full lease TTL from now (for long requests).
    /// Returns, per lease, whether it was still live (an expired lease cannot be revived).
    pub async fn refresh(&self, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.refresh(leases)),
            Store::Redis(r) => r.refresh(leases).await,
        }
    }

    /// The bound on one call (zero for memory, which never waits).
    pub fn timeout(&self) -> std::time::Duration {
        match self {
            Store::Memory(_) => std::time::Duration::ZERO,
            Store::Redis(r) => r.timeout(),
        }
    }

    /// For logs and the admin page; never shows credentials.
    pub fn describe(&self) -> String {
        match self {
            Store::Memory(_) => "memory (this process only)".to_string(),
            Store::Redis(r) => r.describe(),
        }
    }
}
