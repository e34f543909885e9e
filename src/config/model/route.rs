//! What a request is matched against: `Route` (path prefix, methods, host, case, header
//! values), the protocol upgrades it lets through, its default limits, its allow-list (`Allow`)
//! and its tiers (`Tier`).

use std::sync::Arc;

use http::Method;

use super::limit::LimitSet;
use crate::identity::Identity;

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    /// Lower-cased when `case` is insensitive.
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<Method>>,
    /// Lower-case host without port or trailing dot; `*.example.com` matches subdomains.
    pub host: Option<String>,
    /// How the path prefix compares (`match.case`).
    pub case: MatchCase,
    /// The protocols an `Upgrade` request on this route may switch to (`upgrades`),
    /// lower-case protocol names.
    pub upgrades: Vec<String>,
    /// Request headers that must be present with exactly these values (`match.headers`).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The default limits: what every caller gets unless a tier names it.
    pub limits: LimitSet,
    /// Callers never limited on this route.
    pub allow: Allow,
    /// Tiers, tried in order before the default limits.
    pub tiers: Vec<Tier>,
    /// Which method-override spellings reach `methods` (`method_override`).
    pub method_override: MethodOverride,
}

/// `method_override`: a request whose override header (or query field) names one of a
/// route's `methods` matches the route as well as the route its own method matches (apps
/// behind Express's method-override, Symfony, Laravel or Rails serve it as the named method).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodOverride {
    /// `X-HTTP-Method-Override`, `X-HTTP-Method` and `X-Method-Override` are read.
    pub headers: bool,
    /// This query field is read too (`_method`).
    pub query: Option<String>,
}

/// The headers frameworks take an overriding method from.
pub const METHOD_OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

impl Default for MethodOverride {
    /// On for the headers: the proxy cannot know whether the app honours them, and counting a
    /// request that names another method against that method's route too only counts more.
    fn default() -> Self {
        MethodOverride {
            headers: true,
            query: None,
        }
    }
}

impl MethodOverride {
    pub fn is_on(&self) -> bool {
        self.headers || self.query.is_some()
    }
}

/// `match.case`: whether `/LOGIN` is the route `/login`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatchCase {
    /// Byte for byte (the default).
    #[default]
    Sensitive,
    /// ASCII letters compared without case, for apps that route that way (Express by
    /// default, ASP.NET, Spring with a case-insensitive matcher).
    Insensitive,
}

/// What a request without a route, or a route without `upgrades`, may switch to.
pub const DEFAULT_UPGRADES: &[&str] = &["websocket"];

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
pub struct Tier {
    pub name: String,
    pub identity: Arc<Identity>,
    pub values: Vec<String>,
    pub limits: LimitSet,
}
