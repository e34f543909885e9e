//! The limit engine: decides whether a request passes all the rate limits of its route.
//!
//! [`algorithm`] holds the pure arithmetic of the six algorithms; [`memory`] runs it on
//! in-process state (one proxy instance) and [`redis_store`] runs a Lua mirror of it inside
//! Redis (many proxy instances sharing quotas). Both decide all limits of a request in one
//! atomic step so that a request denied by one limit consumes nothing from the others, which is
//! what keeps a multi-limit route from leaking quota while a single limit is exhausted.

pub mod algorithm;
mod coalesce;
pub mod local_first;
mod lua;
pub mod memory;
pub mod redis_settings;
pub mod redis_store;
mod script_runner;
mod sentinel;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

pub use algorithm::{params_fit, Algorithm, Micros, Params, Settle, Verdict, MAX_SAFE};

/// One limit to check for one request.
#[derive(Clone, Copy, Debug)]
pub struct Check<'a> {
    /// The store key, already prefixed, escaped and hash-tagged by the caller: used as given.
    pub key: &'a str,
    pub params: Params,
    /// Checked and reported, never denies; consumed only if it would have allowed.
    pub shadow: bool,
    /// `block_for` in microseconds (0: none): a denial by this limit blocks the key for that
    /// long (see [`algorithm::penalty_box`]; the marker lives at [`block_key`]).
    pub block_us: Micros,
}

/// What [`block_key`] appends to a limit's store key (`decide.lua` appends the same string;
/// a unit test holds the two equal).
pub const BLOCK_SUFFIX: &str = ":block";

/// The key of the block marker (`block_for`, the penalty box) of the limit stored at `key`.
///
/// Contract: this is the ONLY derivation of a block marker's key, in every store (the memory
/// store calls it, `decide.lua` appends the same [`BLOCK_SUFFIX`]); deleting
/// `block_key(key)` lifts a block, which is how a reset of a caller's limit must do it. The
/// marker holds the block's end (store-clock microseconds, decimal) and expires with it. The
/// suffix is appended, so the key keeps the limit key's Redis Cluster hash tag (the first
/// `{...}`) and lives in the same slot, which the one-script decision needs; and no limit key
/// ends with it (policy names and identity parts never contain `:`, see throttle::keys), so a
/// marker never collides with a limit's state.
pub fn block_key(key: &str) -> String {
    let mut marker = String::with_capacity(key.len() + BLOCK_SUFFIX.len());
    marker.push_str(key);
    marker.push_str(BLOCK_SUFFIX);
    marker
}

/// The outcome of one atomic decision over several limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// False if any non-shadow limit denied (and then nothing was consumed).
    pub allowed: bool,
    /// Same order as the checks.
    pub verdicts: Vec<Verdict>,
    /// Concurrency leases taken (only when allowed); hand them back to [`Store::release`].
    pub leases: Vec<Lease>,
    /// The store's clock when it decided: what a later [`Store::settle`] refund names as the
    /// time its units were taken (0 when no store decided).
    pub at: Micros,
}

/// One settlement for one limit after the response is known (see [`algorithm::settle`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The key the decision used, as given to [`Check::key`].
    pub key: String,
    pub params: Params,
    pub op: Settle,
}

/// A concurrency slot held by a request in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: String,
    pub id: u64,
    pub params: Params,
}

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    #[error("store error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("store reply malformed: {0}")]
    Protocol(String),
    /// Not called: recent calls failed and the circuit breaker is cooling down.
    #[error("store circuit open after repeated errors")]
    CircuitOpen,
}

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

    /// For logs and the admin page; never shows credentials.
    pub fn describe(&self) -> String {
        match self {
            Store::Memory(_) => "memory (this process only)".to_string(),
            Store::Redis(r) => r.describe(),
        }
    }
}

/// A lease id unique within this process and, with overwhelming probability, across processes.
///
/// Sequential ids would collide between proxy instances sharing a Redis key, so a per-process
/// seed (pid and start time) and a counter are hashed together; SHA-256 avoids pulling in a
/// random number crate.
pub fn new_lease_id() -> u64 {
    static SEED: OnceLock<[u8; 16]> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = SEED.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut s = [0u8; 16];
        s[..8].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
        s[8..].copy_from_slice(&nanos.to_le_bytes());
        s
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let digest = Sha256::new()
        .chain_update(seed)
        .chain_update(n.to_le_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_do_not_repeat() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| new_lease_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
