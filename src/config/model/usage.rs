//! `usage`: the path on the proxy listener where a caller reads its own usage of the limits
//! that apply to it (answered by tollgate, never forwarded; see `crate::usage`).

/// Where a caller reads its own usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Matched exactly against the request's path (the query is not part of it).
    pub path: String,
}
