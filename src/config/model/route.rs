//! What a request is matched against: `Route` (path prefix, methods, host, header values), its default
//! limits, its allow-list (`Allow`) and its tiers (`Override`).

use std::sync::Arc;

use http::Method;

use super::limit::LimitSet;
use crate::identity::Identity;

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<Method>>,
    /// Lower-case host without port; `*.example.com` matches subdomains.
    pub host: Option<String>,
    /// Request headers that must be present with exactly these values (`match.headers`).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The default limits: what every caller gets unless a tier names it.
    pub limits: LimitSet,
    /// Callers never limited on this route.
    pub allow: Allow,
    /// Tiers, tried in order before the default limits.
    pub overrides: Vec<Override>,
}

/// Callers that are never limited.
#[derive(Debug, Clone, Default)]
pub struct Allow {
    pub client_ips: Vec<ipnet::IpNet>,
    /// Identity values, compared after that identity identified the caller.
    pub identities: Vec<(Arc<Identity>, Vec<String>)>,
}

impl Allow {
    pub fn is_empty(&self) -> bool {
        self.client_ips.is_empty() && self.identities.is_empty()
    }
}

/// A tier: callers whose `identity` value is one of `values` get `limits` (on the same route)
/// instead of the route's default limits.
#[derive(Debug, Clone)]
pub struct Override {
    pub name: String,
    pub identity: Arc<Identity>,
    pub values: Vec<String>,
    pub limits: LimitSet,
}
