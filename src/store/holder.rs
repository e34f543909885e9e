//! Which store holds a limit's state: the one rule that the limit stage, the operators' reads
//! and resets, a caller's usage, `explain --live` and the persistence check all follow, so
//! that a limit is never decided in one store and read or reset in another.

use crate::config::{Limit, Scope};

/// Which store holds a limit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// This process's memory: a `scope: local` limit, or any limit without a shared store.
    Memory,
    /// The shared store, decided there exactly (`sync: exact`).
    Shared,
    /// The shared store, decided on this process's local-first copies (`sync: <duration>`)
    /// and read from the shared store.
    LocalFirst,
}

impl Holder {
    /// The store that holds `limit` when a shared store is configured (`shared`) or not.
    #[inline]
    pub fn of(limit: &Limit, shared: bool) -> Holder {
        match (shared, limit.scope, limit.sync) {
            (false, _, _) | (_, Scope::Local, _) => Holder::Memory,
            (true, Scope::Global, None) => Holder::Shared,
            (true, Scope::Global, Some(_)) => Holder::LocalFirst,
        }
    }

    /// Whether the state lives in the shared store (decided exactly or on local copies).
    #[inline]
    pub fn is_shared(self) -> bool {
        self != Holder::Memory
    }
}
