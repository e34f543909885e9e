//! What a store is asked and what it answers: the checks of one decision, its outcome, the
//! leases and settlements that follow it, and why a store could not decide. Every store
//! speaks these types; they live apart from the stores (and from [`super::Store`], which
//! picks one) so that each store depends on them and nothing here depends on a store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::algorithm::{Params, Settle, Verdict};
use super::cause::Cause;
use super::clock::Micros;

/// One limit to check for one request.
#[derive(Clone, Copy, Debug)]
pub struct Check<'a> {
    /// The store key, already prefixed, escaped and hash-tagged by the caller: used as given.
    pub key: &'a str,
    pub params: Params,
    /// Checked and reported, never denies; consumed only if it would have allowed.
    pub shadow: bool,
    /// `block_for` in microseconds (0: none): a denial by this limit blocks the key for that
    /// long (see [`super::algorithm::penalty_box`]; the marker lives at [`block_key`]).
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
    /// Concurrency leases taken (only when allowed); hand them back to [`super::Store::release`].
    pub leases: Vec<Lease>,
    /// The store's clock when it decided: what a later [`super::Store::settle`] refund names as the
    /// time its units were taken (0 when no store decided).
    pub at: Micros,
}

/// One settlement for one limit after the response is known (see [`super::algorithm::settle`]).
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

/// Why a store could not decide. Each message starts with its [`Cause`] in words, so a log
/// line names it ("store connection refused: ...", not a bare "store error").
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    #[error("store {cause}: {0}", cause = Cause::of_redis(.0).describe())]
    Redis(#[from] redis::RedisError),
    #[error("store reply malformed: {0}")]
    Protocol(String),
    /// Not called: recent calls failed and the circuit breaker is cooling down.
    #[error("store circuit open after repeated errors")]
    CircuitOpen,
    /// Not called: the first connection to the store was still being made when the request
    /// had waited as long as it may for it.
    #[error("store not connected yet")]
    NotConnected,
}

impl StoreError {
    /// The cause, named (see [`Cause`]). A refusal by the circuit breaker and a malformed
    /// reply are `other`: the breaker's cause is the failure that opened it, known to whoever
    /// saw that failure.
    pub fn cause(&self) -> Cause {
        match self {
            StoreError::Timeout(_) => Cause::Timeout,
            StoreError::Redis(e) => Cause::of_redis(e),
            StoreError::Protocol(_) | StoreError::CircuitOpen => Cause::Other,
            StoreError::NotConnected => Cause::NotConnected,
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

    /// The message names the cause before redis-rs's own words.
    #[test]
    fn a_store_error_names_its_cause() {
        let refused = StoreError::Redis(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(refused.cause(), Cause::Refused);
        assert!(
            refused
                .to_string()
                .starts_with("store connection refused: "),
            "{refused}"
        );
        let timeout = StoreError::Timeout(Duration::from_millis(50));
        assert_eq!(timeout.cause(), Cause::Timeout);
        assert_eq!(timeout.to_string(), "store timed out after 50ms");
        assert_eq!(StoreError::CircuitOpen.cause(), Cause::Other);
        assert_eq!(StoreError::NotConnected.cause(), Cause::NotConnected);
        assert_eq!(
            StoreError::NotConnected.to_string(),
            "store not connected yet"
        );
    }

    #[test]
    fn lease_ids_do_not_repeat() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| new_lease_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
