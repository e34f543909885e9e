//! One access-log line per request, written when the response head is ready: method, path
//! (without the query, which can carry tokens), route, the kind of source that identified the
//! caller (never its value), the decision, status, upstream time and total time. It goes
//! through `tracing` with target `tollgate::access`, so `--log-format json` makes it JSON and
//! `TOLLGATE_LOG` can silence it (`tollgate::access=off`).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Method, Uri};
use tokio::time::Instant;

use crate::config::Route;

pub struct AccessLog {
    enabled: bool,
    started: Instant,
    pub method: Method,
    /// A clone shares the request's buffer: no copy of the path per request.
    uri: Uri,
    pub route: Option<Arc<Route>>,
    pub identity: &'static str,
    pub decision: &'static str,
    pub upstream: Option<Duration>,
}

impl AccessLog {
    pub fn new(parts: &Parts, started: Instant, enabled: bool) -> AccessLog {
        AccessLog {
            enabled,
            started,
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            route: None,
            identity: "-",
            decision: "allowed",
            upstream: None,
        }
    }

    /// The request path, without the query.
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    pub fn finish(&self, status: u16, upstream: Option<Duration>) {
        if !self.enabled {
            return;
        }
        let route = self.route.as_ref().map_or("-", |r| r.name.as_str());
        // Milliseconds to the microsecond: enough precision, short lines.
        let ms = |d: Duration| (d.as_micros() as f64) / 1000.0;
        let upstream_ms = upstream.map_or(-1.0, ms);
        let total_ms = ms(self.started.elapsed());
        tracing::info!(
            target: "tollgate::access",
            method = %self.method,
            path = %self.uri.path(),
            route,
            identity = self.identity,
            decision = self.decision,
            status,
            upstream_ms,
            total_ms,
            "request"
        );
    }
}
