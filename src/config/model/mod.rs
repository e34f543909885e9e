//! The runtime configuration: what the request path, the store and the command line read.
//! Every value here has been validated, so its readers never meet raw text or a value that
//! cannot work. The model renders nothing: responses are rendered by `throttle::headers`, and
//! human text by the command line (`summary`).
//!
//! The files build on one another in one direction: `proxy` (the whole `Config`) over
//! `throttle` (store, routes, responses) over `route` over `limit`;
//! `protect` (the app's protection and the priorities) and `tracing` (span export) stand beside
//! them.

mod limit;
mod protect;
mod proxy;
mod route;
mod throttle;
mod tracing;
mod usage;

pub use limit::{ByResponse, Limit, LimitSet, OnLimit, Scope, StatusSet, DEFAULT_LEASE_TTL};
pub use protect::{
    LatencyTarget, Priority, Protect, ProtectMode, DEFAULT_LATENCY_MULTIPLE, DEFAULT_MAX_LIMIT,
    DEFAULT_MAX_WAIT, DEFAULT_MIN_LIMIT,
};
pub use proxy::{
    AdminConnections, AdminHost, Config, HostMode, Listener, TlsFiles, Upstream,
    DEFAULT_ADMIN_MAX_CONNECTIONS, DEFAULT_CONNECT_TIMEOUT, DEFAULT_H2_STREAMS,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_UPSTREAM_TIMEOUT, MAX_WORKERS,
};
pub use route::{Allow, MethodOverride, Route, Tier, METHOD_OVERRIDE_HEADERS};
pub use route::{MatchCase, DEFAULT_UPGRADES};
pub use throttle::{
    OnError, RedisConfig, RedisMode, RedisTls, ResponseConfig, Secret, StoreConfig, Throttle,
    DEFAULT_KEY_PREFIX, DEFAULT_MAX_KEYS_PER_ROUTE, DEFAULT_STORE_TIMEOUT,
};
pub use tracing::{
    CallerContext, OtlpProtocol, Propagators, Sampling, Traces, DEFAULT_MAX_SPANS_PER_SECOND,
    DEFAULT_SERVICE_NAME, DEFAULT_TRACES_BATCH, DEFAULT_TRACES_INTERVAL, DEFAULT_TRACES_QUEUE,
    DEFAULT_TRACES_TIMEOUT,
};
pub use usage::Usage;
